/* Embedding lookup: i32 idx (...) into weight (V, C) gives (..., C). The
 * node keeps a copy of the indices (the caller may refill its batch before
 * backward); the backward scatter-adds the gradient rows into dweight. */
#include "autograd_impl.h"

/* saved[0] = idx (N) */
static FG_MUST_USE fg_status embedding_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *gw = fg__grad_of(n->in[0]);
    int64_t C = gw ? gw->shape[1] : 0;
    fg_tensor *g2 = gw ? fg_tensor_reshape_view(g, 2, (int64_t[]){n->saved[0]->numel, C}) : NULL;
    if (!g2) return FG_ENOMEM;
    return fg__ops(g)->embedding_bwd(n->saved[0], g2, gw);
}

fg_tensor *fg_embedding(fg_tensor *idx, fg_tensor *weight) {
    if (!idx) {
        fg_error_wrap(FG_EINVAL, "embedding: NULL idx (an earlier call failed)");
        return NULL;
    }
    if (fg__check_float("embedding", weight)) return NULL;
    char si[96], sw[96];
    if (idx->dtype != FG_I32 || weight->ndim != 2 || idx->ndim >= FG_MAX_DIMS) {
        fg_error(FG_EINVAL,
                 "embedding: idx %s, weight %s: expected i32 idx (...) with fewer than "
                 "%d dims and weight (V, C)",
                 fg_tensor_describe(idx, si, sizeof si), fg_tensor_describe(weight, sw, sizeof sw),
                 FG_MAX_DIMS);
        return NULL;
    }
    const fg_op_table *ops = fg__ops(weight);
    if (!ops || FG_OP(ops, embedding_fwd)) return NULL;
    int64_t N = idx->numel, C = weight->shape[1], shape[FG_MAX_DIMS];
    for (int d = 0; d < idx->ndim; d++) shape[d] = idx->shape[d];
    shape[idx->ndim] = C;
    fg_tensor *ic = fg_tensor_contiguous(idx), *wc = fg_tensor_contiguous(weight);
    fg_tensor *i1 = ic && wc ? fg_tensor_reshape_view(ic, 1, &N) : NULL;      /* (N) */
    fg_tensor *y = i1 ? fg_empty(weight->dtype, idx->ndim + 1, shape) : NULL; /* (..., C) */
    fg_tensor *y2 = y ? fg_tensor_reshape_view(y, 2, (int64_t[]){N, C}) : NULL;
    if (!y2 || ops->embedding_fwd(i1, wc, y2)) return NULL;
    fg__node *node;
    if (fg__record(&node, "embedding", embedding_bw, y, 1, &weight)) return NULL;
    if (node) {
        if (FG_OP(ops, embedding_bwd)) return NULL;
        fg_tensor *ik = fg_empty(FG_I32, 1, &N);
        if (!ik || fg_tensor_copy(ik, i1)) return NULL;
        node->saved[0] = ik;
    }
    return y;
}
