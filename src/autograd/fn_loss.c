/* Mean cross-entropy of logits (..., V) against i32 targets (...): the
 * leading dims flatten to N rows. The fused table kernels keep no softmax:
 * the node saves the (N, V) logits view, a copy of the (N) targets, the
 * count of rows that counted and each row's max and sum of exps (2, N); the
 * backward recomputes each row's softmax from them, one exp an element. */
#include "autograd_impl.h"

/* saved[0] = logits (N, V), saved[1] = targets (N), saved[2] = the rows'
 * max and sum of exps (2, N) f64 where the table has the stats pair (NULL:
 * the backward recomputes them); i[0] = ignore_index, i[1] = count */
static FG_MUST_USE fg_status cross_entropy_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *gl = fg__grad_of(n->in[0]);
    fg_tensor *gl2 = gl ? fg_tensor_reshape_view(gl, 2, n->saved[0]->shape) : NULL; /* (N, V) */
    if (!gl2) return FG_ENOMEM;
    const fg_op_table *ops = fg__ops(g);
    if (n->saved[2])
        return ops->cross_entropy_bwd_stats(n->saved[0], n->saved[1], n->saved[2], n->i[0],
                                            fg_item(g), n->i[1], gl2);
    return ops->cross_entropy_bwd(n->saved[0], n->saved[1], n->i[0], fg_item(g), n->i[1], gl2);
}

fg_tensor *fg_cross_entropy(fg_tensor *logits, fg_tensor *targets, int64_t ignore_index) {
    if (fg__check_float("cross_entropy", logits)) return NULL;
    if (!(logits = fg__autocast_f32(logits))) return NULL; /* autocast keeps it in f32 */
    if (!targets) {
        fg_error_wrap(FG_EINVAL, "cross_entropy: NULL targets (an earlier call failed)");
        return NULL;
    }
    char sl[96], st[96];
    bool ok = logits->ndim >= 1 && targets->dtype == FG_I32 && targets->ndim == logits->ndim - 1;
    for (int d = 0; ok && d < targets->ndim; d++) ok = targets->shape[d] == logits->shape[d];
    if (!ok) {
        fg_error(FG_EINVAL,
                 "cross_entropy: logits %s and targets %s: expected logits (..., V) "
                 "and i32 targets (...) with the same leading dims",
                 fg_tensor_describe(logits, sl, sizeof sl),
                 fg_tensor_describe(targets, st, sizeof st));
        return NULL;
    }
    const fg_op_table *ops = fg__ops(logits);
    if (!ops || FG_OP(ops, cross_entropy_fwd)) return NULL;
    int64_t V = logits->shape[logits->ndim - 1], N = targets->numel;
    fg_tensor *lc = fg_tensor_contiguous(logits), *tc = fg_tensor_contiguous(targets);
    fg_tensor *l2 = lc ? fg_tensor_reshape_view(lc, 2, (int64_t[]){N, V}) : NULL; /* (N, V) */
    fg_tensor *t1 = tc ? fg_tensor_reshape_view(tc, 1, &N) : NULL;                /* (N) */
    fg_tensor *loss = l2 && t1 ? fg_empty(logits->dtype, 0, NULL) : NULL;
    int64_t count = 0;
    bool ws = ops->cross_entropy_fwd_stats && ops->cross_entropy_bwd_stats;
    fg_tensor *stats = ws && loss ? fg_empty(FG_F64, 2, (int64_t[]){2, N}) : NULL; /* (2, N) */
    if (!loss || (ws && !stats)) return NULL;
    if (ws ? ops->cross_entropy_fwd_stats(l2, t1, ignore_index, loss, &count, stats)
           : ops->cross_entropy_fwd(l2, t1, ignore_index, loss, &count))
        return NULL;
    fg__node *node;
    if (fg__record(&node, "cross_entropy", cross_entropy_bw, loss, 1, &logits)) return NULL;
    if (node) {
        if (FG_OP(ops, cross_entropy_bwd)) return NULL;
        /* targets are copied: the caller may refill its batch before backward */
        fg_tensor *tk = fg_empty(FG_I32, 1, &N);
        if (!tk || fg_tensor_copy(tk, t1)) return NULL;
        node->saved[0] = l2;
        node->saved[1] = tk;
        node->saved[2] = stats;
        node->i[0] = ignore_index;
        node->i[1] = count;
    }
    return loss;
}
