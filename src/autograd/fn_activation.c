/* Elementwise and row-wise functions of one tensor: relu, gelu (tanh
 * approximation), softmax and log_softmax over the last dim, dropout.
 *
 * relu and gelu keep the (contiguous) input for the backward (relu_, in
 * place, its output); softmax and
 * log_softmax need only their output (the node's out); dropout keeps
 * nothing but (p, seed, offset), since its mask is a pure function of them
 * and the backward kernel recomputes it. */
#include "autograd_impl.h"

typedef FG_MUST_USE fg_status (*unary_fwd)(const fg_tensor *x, fg_tensor *y);

/* saved[0] = contiguous x */
static FG_MUST_USE fg_status relu_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *ga = fg__grad_of(n->in[0]);
    if (!ga) return FG_ENOMEM;
    return fg__ops(g)->relu_bwd(n->saved[0], g, ga);
}

static FG_MUST_USE fg_status gelu_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *ga = fg__grad_of(n->in[0]);
    if (!ga) return FG_ENOMEM;
    return fg__ops(g)->gelu_bwd(n->saved[0], g, ga);
}

/* the output is what the backward reads */
static FG_MUST_USE fg_status softmax_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *ga = fg__grad_of(n->in[0]);
    if (!ga) return FG_ENOMEM;
    return fg__ops(g)->softmax_bwd(n->out, g, ga);
}

static FG_MUST_USE fg_status log_softmax_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *ga = fg__grad_of(n->in[0]);
    if (!ga) return FG_ENOMEM;
    return fg__ops(g)->log_softmax_bwd(n->out, g, ga);
}

/* The table of a float tensor a, NULL (error set) otherwise. */
static const fg_op_table *ops_of(const char *fn, const fg_tensor *a) {
    return fg__check_float(fn, a) ? NULL : fg__ops(a);
}

/* y = fwd(a) over a contiguous copy of a, recorded with bw; a missing
 * backward entry (has_bw false) is an error only when recording. */
static fg_tensor *unary(const char *fn, const fg_op_table *ops, fg_tensor *a, unary_fwd fwd,
                        bool has_bw, fg__backward_fn bw) {
    fg_tensor *ac = fg_tensor_contiguous(a);
    fg_tensor *y = ac ? fg_empty_like(ac) : NULL;
    if (!y || fwd(ac, y)) return NULL;
    fg__node *node;
    if (fg__record(&node, fn, bw, y, 1, &a)) return NULL;
    if (node) {
        if (!has_bw) {
            fg_error(FG_EUNSUPPORTED, "op %s_bwd is not available on %s", fn, ops->device);
            return NULL;
        }
        node->saved[0] = ac;
    }
    return y;
}

fg_tensor *fg_relu(fg_tensor *a) {
    const fg_op_table *ops = ops_of("relu", a);
    if (!ops || FG_OP(ops, relu_fwd)) return NULL;
    return unary("relu", ops, a, ops->relu_fwd, ops->relu_bwd != NULL, relu_bw);
}

/* In x's memory when x is the output of the newest node on this thread's
 * tape (so no node reads it yet), that node's backward never reads it
 * (out_unread: add, the fused batch norm) and x is its own contiguous
 * tensor; the node's out is a view of x, and it keeps that output for the
 * backward (relu'(x) = [y > 0]). Otherwise fg_relu. */
fg_tensor *fg_relu_(fg_tensor *x) {
    const fg_op_table *ops = ops_of("relu_", x);
    if (!ops || FG_OP(ops, relu_fwd)) return NULL;
    fg__node *p = x->grad_fn, *tail = fg__tape_tail();
    if (!p || p != tail || p->out != x || !p->out_unread || !ops->relu_bwd ||
        x->grad_fn_gen != fg_step_generation() || !fg_tensor_is_contiguous(x) ||
        (x->flags & FG_T_PERSISTENT))
        return fg_relu(x);
    fg_tensor *y = fg_tensor_reshape_view(x, x->ndim, x->shape);
    if (!y || ops->relu_fwd(x, x)) return NULL;
    fg__node *node;
    if (fg__record(&node, "relu_", relu_bw, y, 1, &x)) return NULL;
    if (node) node->saved[0] = y;
    return y;
}

fg_tensor *fg_gelu(fg_tensor *a) {
    const fg_op_table *ops = ops_of("gelu", a);
    if (!ops || FG_OP(ops, gelu_fwd)) return NULL;
    return unary("gelu", ops, a, ops->gelu_fwd, ops->gelu_bwd != NULL, gelu_bw);
}

fg_tensor *fg_softmax(fg_tensor *a) {
    const fg_op_table *ops = ops_of("softmax", a);
    if (ops && !(a = fg__autocast_f32(a))) return NULL; /* autocast keeps softmax in f32 */
    if (!ops || FG_OP(ops, softmax_fwd)) return NULL;
    return unary("softmax", ops, a, ops->softmax_fwd, ops->softmax_bwd != NULL, softmax_bw);
}

fg_tensor *fg_log_softmax(fg_tensor *a) {
    const fg_op_table *ops = ops_of("log_softmax", a);
    if (ops && !(a = fg__autocast_f32(a))) return NULL; /* autocast keeps it in f32 */
    if (!ops || FG_OP(ops, log_softmax_fwd)) return NULL;
    return unary("log_softmax", ops, a, ops->log_softmax_fwd, ops->log_softmax_bwd != NULL,
                 log_softmax_bw);
}

/* f[0] = p; i[0], i[1] = seed, offset */
static FG_MUST_USE fg_status dropout_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *ga = fg__grad_of(n->in[0]);
    if (!ga) return FG_ENOMEM;
    return fg__ops(g)->dropout_bwd(g, n->f[0], (uint64_t)n->i[0], (uint64_t)n->i[1], ga);
}

fg_tensor *fg_dropout(fg_tensor *x, double p, uint64_t seed, uint64_t offset) {
    if (fg__check_float("dropout", x)) return NULL;
    if (!(p >= 0 && p < 1)) {
        fg_error(FG_EINVAL, "dropout: p = %g: expected a probability in [0, 1)", p);
        return NULL;
    }
    if (p == 0) return x; /* the identity: nothing to compute or record */
    const fg_op_table *ops = fg__ops(x);
    if (!ops || FG_OP(ops, dropout_fwd)) return NULL;
    fg_tensor *xc = fg_tensor_contiguous(x);
    fg_tensor *y = xc ? fg_empty_like(xc) : NULL;
    if (!y || ops->dropout_fwd(xc, p, seed, offset, y)) return NULL;
    fg__node *node;
    if (fg__record(&node, "dropout", dropout_bw, y, 1, &x)) return NULL;
    if (node) {
        if (FG_OP(ops, dropout_bwd)) return NULL;
        node->f[0] = p;
        node->i[0] = (int64_t)seed;
        node->i[1] = (int64_t)offset;
    }
    return y;
}
