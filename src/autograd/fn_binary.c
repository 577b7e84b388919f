/* add, sub, mul, div (numpy broadcasting) and scale. The backward of a
 * broadcast input sums the gradient down to the input's shape (sum_to). */
#include "autograd_impl.h"

/* The broadcast shape of a and b into out (ndim, shape). */
static FG_MUST_USE fg_status broadcast_shape(const char *fn, const fg_tensor *a, const fg_tensor *b,
                                             int *nd, int64_t *shape) {
    int n = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (int d = 0; d < n; d++) {
        int da = d - (n - a->ndim), db = d - (n - b->ndim);
        int64_t sa = da >= 0 ? a->shape[da] : 1, sb = db >= 0 ? b->shape[db] : 1;
        if (sa != sb && sa != 1 && sb != 1) {
            char x[96], y[96];
            return fg_error(FG_EINVAL, "%s: shapes %s and %s do not broadcast", fn,
                            fg_tensor_describe(a, x, sizeof x), fg_tensor_describe(b, y, sizeof y));
        }
        shape[d] = sa == 1 ? sb : sa;
    }
    *nd = n;
    return FG_OK;
}

/* g summed to t's shape, times s, added into t's gradient (written, not
 * added, when the gradient is new). */
static FG_MUST_USE fg_status accum_reduced(fg_tensor *t, const fg_tensor *g, double s) {
    if (!fg__needs_grad(t)) return FG_OK;
    double beta;
    fg_tensor *gt = fg__grad_for_write(t, &beta);
    if (!gt) return FG_ENOMEM;
    return fg__ops(t)->sum_to(g, gt, s, beta);
}

static FG_MUST_USE fg_status add_bw(fg__node *n, const fg_tensor *g) {
    FG_TRY(accum_reduced(n->in[0], g, 1.0));
    return accum_reduced(n->in[1], g, n->f[0]); /* f[0] = +1 add, -1 sub */
}

static FG_MUST_USE fg_status mul_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *a = n->in[0], *b = n->in[1];
    const fg_op_table *ops = fg__ops(g);
    fg_tensor *tmp = fg_empty_like(g);
    if (!tmp) return FG_ENOMEM;
    if (fg__needs_grad(a)) {
        FG_TRY(ops->binary(FG_BIN_MUL, g, b, tmp));
        FG_TRY(accum_reduced(a, tmp, 1.0));
    }
    if (fg__needs_grad(b)) {
        FG_TRY(ops->binary(FG_BIN_MUL, g, a, tmp));
        FG_TRY(accum_reduced(b, tmp, 1.0));
    }
    return FG_OK;
}

/* y = a / b: da = g / b, db = -g y / b (y is the node's out) */
static FG_MUST_USE fg_status div_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *a = n->in[0], *b = n->in[1];
    const fg_op_table *ops = fg__ops(g);
    fg_tensor *tmp = fg_empty_like(g);
    if (!tmp) return FG_ENOMEM;
    if (fg__needs_grad(a)) {
        FG_TRY(ops->binary(FG_BIN_DIV, g, b, tmp));
        FG_TRY(accum_reduced(a, tmp, 1.0));
    }
    if (fg__needs_grad(b)) {
        fg_tensor *q = fg_empty_like(g);
        if (!q) return FG_ENOMEM;
        FG_TRY(ops->binary(FG_BIN_MUL, g, n->out, tmp));
        FG_TRY(ops->binary(FG_BIN_DIV, tmp, b, q));
        FG_TRY(accum_reduced(b, q, -1.0));
    }
    return FG_OK;
}

/* The dtype of a op b: the same, or the wider of two float dtypes (f64 >
 * f32 > bf16, f16; bf16 with f16 gives f32), as PyTorch promotes. The
 * kernels read mixed inputs as they are: nothing is cast first. */
static fg_dtype promote(fg_dtype a, fg_dtype b) {
    if (a == b) return a;
    if (a == FG_F64 || b == FG_F64) return FG_F64;
    return FG_F32;
}

static fg_tensor *binary(const char *fn, fg_binary_op op, fg_tensor *a, fg_tensor *b) {
    if (fg__check_float(fn, a) || fg__check_float(fn, b)) return NULL;
    fg_dtype dt = promote(a->dtype, b->dtype);
    if (a->device != b->device) {
        fg_error(FG_EINVAL, "%s: tensors on different devices", fn);
        return NULL;
    }
    if (dt == FG_F64 && a->dtype != b->dtype) { /* f64 with a 16-bit dtype: no kernel mixes them */
        a = fg_cast(a, FG_F64);
        b = a ? fg_cast(b, FG_F64) : NULL;
        if (!b) return NULL;
    }
    int nd = 0;
    int64_t shape[FG_MAX_DIMS];
    if (broadcast_shape(fn, a, b, &nd, shape)) return NULL;
    fg_tensor *y = fg_empty(dt, nd, shape);
    if (!y) return NULL;
    const fg_op_table *ops = fg__ops(a);
    if (FG_OP(ops, binary) || ops->binary(op, a, b, y)) return NULL;
    fg__node *node;
    fg_tensor *in[2] = {a, b};
    fg__backward_fn bw = op == FG_BIN_MUL ? mul_bw : op == FG_BIN_DIV ? div_bw : add_bw;
    if (fg__record(&node, fn, bw, y, 2, in)) return NULL;
    if (node) {
        node->f[0] = op == FG_BIN_SUB ? -1.0 : 1.0;
        node->out_unread = bw == add_bw;
    }
    return y;
}

fg_tensor *fg_add(fg_tensor *a, fg_tensor *b) { return binary("add", FG_BIN_ADD, a, b); }
fg_tensor *fg_sub(fg_tensor *a, fg_tensor *b) { return binary("sub", FG_BIN_SUB, a, b); }
fg_tensor *fg_mul(fg_tensor *a, fg_tensor *b) { return binary("mul", FG_BIN_MUL, a, b); }
fg_tensor *fg_div(fg_tensor *a, fg_tensor *b) { return binary("div", FG_BIN_DIV, a, b); }

static FG_MUST_USE fg_status scale_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *gx = fg__grad_of(n->in[0]);
    if (!gx) return FG_ENOMEM;
    return fg__ops(g)->axpby(n->f[0], g, 1.0, gx);
}

fg_tensor *fg_scale(fg_tensor *a, double s) {
    if (fg__check_float("scale", a)) return NULL;
    fg_tensor *x = fg_tensor_contiguous(a);
    fg_tensor *y = x ? fg_empty_like(x) : NULL;
    if (!y || fg__ops(a)->scale(x, s, y)) return NULL;
    fg__node *node;
    if (fg__record(&node, "scale", scale_bw, y, 1, &a)) return NULL;
    if (node) node->f[0] = s;
    return y;
}
