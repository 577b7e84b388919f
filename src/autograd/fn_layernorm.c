/* Layer normalisation over the last dim of x (..., C), weight and bias (C)
 * each optional. The leading dims flatten to N rows for the table's
 * kernels; the node keeps the (N, C) input view and the mean and rstd (N)
 * the forward computed, and one backward kernel call fills whichever of
 * dx, dw, db take part. */
#include "autograd_impl.h"

/* saved[0] = x (N, C), saved[1] = contiguous w or NULL, saved[2] = mean,
 * saved[3] = rstd */
static FG_MUST_USE fg_status layer_norm_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *x = n->in[0], *w = n->in[1], *b = n->in[2], *x2 = n->saved[0];
    fg_tensor *g2 = fg_tensor_reshape_view(g, 2, x2->shape); /* (N, C) */
    if (!g2) return FG_ENOMEM;
    fg_tensor *dx2 = NULL, *dw = NULL, *db = NULL;
    if (fg__needs_grad(x)) {
        fg_tensor *gx = fg__grad_of(x);
        if (!gx || !(dx2 = fg_tensor_reshape_view(gx, 2, x2->shape))) return FG_ENOMEM;
    }
    if (fg__needs_grad(w) && !(dw = fg__grad_of(w))) return FG_ENOMEM;
    if (fg__needs_grad(b) && !(db = fg__grad_of(b))) return FG_ENOMEM;
    return fg__ops(g)->layernorm_bwd(x2, n->saved[1], n->saved[2], n->saved[3], g2, dx2, dw, db);
}

static bool vec_ok(const fg_tensor *v, const fg_tensor *x, int64_t C) {
    return !v ||
           (v->ndim == 1 && v->shape[0] == C && v->dtype == x->dtype && v->device == x->device);
}

fg_tensor *fg_layer_norm(fg_tensor *x, fg_tensor *w, fg_tensor *b, double eps) {
    if (fg__check_float("layer_norm", x)) return NULL;
    if (!(x = fg__autocast_f32(x))) return NULL; /* autocast keeps layer norm in f32 */
    char sx[96], sw[96], sb[96];
    int64_t C = x->ndim ? x->shape[x->ndim - 1] : 0;
    if (x->ndim < 1 || !vec_ok(w, x, C) || !vec_ok(b, x, C) || !(eps >= 0)) {
        fg_error(FG_EINVAL,
                 "layer_norm: x %s, weight %s, bias %s, eps %g: expected x (..., C), "
                 "weight and bias (C) of x's dtype or NULL, eps >= 0",
                 fg_tensor_describe(x, sx, sizeof sx),
                 w ? fg_tensor_describe(w, sw, sizeof sw) : "none",
                 b ? fg_tensor_describe(b, sb, sizeof sb) : "none", eps);
        return NULL;
    }
    const fg_op_table *ops = fg__ops(x);
    if (!ops || FG_OP(ops, layernorm_fwd)) return NULL;
    int64_t N = 1; /* rows: every leading dim */
    for (int d = 0; d < x->ndim - 1; d++) N *= x->shape[d];
    fg_tensor *xc = fg_tensor_contiguous(x);
    fg_tensor *wc = w ? fg_tensor_contiguous(w) : NULL, *bc = b ? fg_tensor_contiguous(b) : NULL;
    if (!xc || (w && !wc) || (b && !bc)) return NULL;
    fg_tensor *x2 = fg_tensor_reshape_view(xc, 2, (int64_t[]){N, C}); /* (N, C) */
    fg_tensor *y = x2 ? fg_empty_like(x) : NULL;                      /* (..., C) */
    fg_tensor *y2 = y ? fg_tensor_reshape_view(y, 2, (int64_t[]){N, C}) : NULL;
    /* the statistics of a bf16/f16 x stay f32 */
    fg_dtype sdt = x->dtype == FG_BF16 || x->dtype == FG_F16 ? FG_F32 : x->dtype;
    fg_tensor *mean = y2 ? fg_empty(sdt, 1, &N) : NULL; /* (N) */
    fg_tensor *rstd = mean ? fg_empty(sdt, 1, &N) : NULL;
    if (!rstd || ops->layernorm_fwd(x2, wc, bc, eps, y2, mean, rstd)) return NULL;
    fg__node *node;
    fg_tensor *in[3] = {x, w, b};
    if (fg__record(&node, "layer_norm", layer_norm_bw, y, 3, in)) return NULL;
    if (node) {
        if (FG_OP(ops, layernorm_bwd)) return NULL;
        node->saved[0] = x2;
        node->saved[1] = wc;
        node->saved[2] = mean;
        node->saved[3] = rstd;
    }
    return y;
}
