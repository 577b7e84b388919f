/* matmul and linear. Every product, forward and backward, is one call of the
 * table's matmul; backward products run with beta = 1 straight into the
 * inputs' gradient buffers, so no temporary is made for them.
 *
 * A gradient made by that backward (no earlier contribution) is written
 * with beta = 0 instead of being zeroed first.
 *
 * Inputs that are not contiguous are copied once in forward and the copy is
 * what backward reads (nodes keep it in saved[]): the gradient still goes to
 * the caller's tensor. When b (or w) is shared by every row, the batch folds
 * into the rows: linear is one gemm over all (..., in) rows, and the weight
 * gradient is one gemm over them too (the sum over the batch is the K of
 * that product). Under autocast (fg_autocast_set) both hand over to
 * fn_autocast.c once their inputs are checked. */
#include "autograd_impl.h"

/* saved[0] = contiguous a, saved[1] = contiguous b */
static FG_MUST_USE fg_status matmul_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *a = n->in[0], *b = n->in[1], *ac = n->saved[0], *bc = n->saved[1];
    const fg_op_table *ops = fg__ops(g);
    double beta;
    if (fg__needs_grad(a)) { /* da (..., M, K) += g (..., M, N) @ b^T */
        fg_tensor *ga = fg__grad_for_write(a, &beta);
        if (!ga) return FG_ENOMEM;
        FG_TRY(ops->matmul(g, false, bc, true, ga, 1.0, beta));
    }
    if (fg__needs_grad(b)) {
        fg_tensor *gb = fg__grad_for_write(b, &beta);
        if (!gb) return FG_ENOMEM;
        if (b->ndim == 2 && a->ndim > 2) {
            /* db (K, N) += sum over the batch of a_i^T g_i = a (R, K)^T @ g (R, N) */
            int64_t K = ac->shape[ac->ndim - 1], N = g->shape[g->ndim - 1];
            fg_tensor *a2 = fg_tensor_reshape_view(ac, 2, (int64_t[]){-1, K});
            fg_tensor *g2 = fg_tensor_reshape_view(g, 2, (int64_t[]){-1, N});
            if (!a2 || !g2) return FG_ENOMEM;
            FG_TRY(ops->matmul(a2, true, g2, false, gb, 1.0, beta));
        } else { /* db (..., K, N) += a^T @ g, batch entry by entry */
            FG_TRY(ops->matmul(ac, true, g, false, gb, 1.0, beta));
        }
    }
    return FG_OK;
}

fg_tensor *fg_matmul(fg_tensor *a, fg_tensor *b) {
    if (fg__check_float("matmul", a) || fg__check_float("matmul", b) ||
        (!fg__autocast_applies(a, b) && fg__check_same_dtype("matmul", a, b)))
        return NULL;
    char sa[96], sb[96];
    bool ok = a->ndim >= 2 && b->ndim >= 2 && a->shape[a->ndim - 1] == b->shape[b->ndim - 2] &&
              (b->ndim == 2 || b->ndim == a->ndim);
    for (int d = 0; ok && b->ndim > 2 && d < a->ndim - 2; d++) ok = a->shape[d] == b->shape[d];
    if (!ok) {
        fg_error(FG_EINVAL,
                 "matmul: %s @ %s: expected (..., M, K) @ (K, N) or (..., M, K) @ (..., K, N) "
                 "with the same batch dims",
                 fg_tensor_describe(a, sa, sizeof sa), fg_tensor_describe(b, sb, sizeof sb));
        return NULL;
    }
    if (fg__autocast_applies(a, b)) return fg__autocast_mm(a, b);
    const fg_op_table *ops = fg__ops(a);
    if (!ops || FG_OP(ops, matmul)) return NULL;
    fg_tensor *ac = fg_tensor_contiguous(a), *bc = fg_tensor_contiguous(b);
    if (!ac || !bc) return NULL;
    int64_t shape[FG_MAX_DIMS];
    for (int d = 0; d < a->ndim; d++) shape[d] = a->shape[d];
    shape[a->ndim - 1] = b->shape[b->ndim - 1];
    fg_tensor *y = fg_empty(a->dtype, a->ndim, shape); /* (..., M, N) */
    if (!y || ops->matmul(ac, false, bc, false, y, 1.0, 0.0)) return NULL;
    fg__node *node;
    fg_tensor *in[2] = {a, b};
    if (fg__record(&node, "matmul", matmul_bw, y, 2, in)) return NULL;
    if (node) {
        node->saved[0] = ac;
        node->saved[1] = bc;
    }
    return y;
}

/* saved[0] = x as (R, in), saved[1] = contiguous w (out, in) */
static FG_MUST_USE fg_status linear_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *x = n->in[0], *w = n->in[1], *b = n->nin > 2 ? n->in[2] : NULL;
    fg_tensor *x2 = n->saved[0], *wc = n->saved[1];
    const fg_op_table *ops = fg__ops(g);
    int64_t R = x2->shape[0], in = x2->shape[1], out = wc->shape[0];
    fg_tensor *g2 = fg_tensor_reshape_view(g, 2, (int64_t[]){R, out}); /* (R, out) */
    if (!g2) return FG_ENOMEM;
    if (fg__needs_grad(x)) { /* dx (R, in) += g (R, out) @ w (out, in) */
        double beta;
        fg_tensor *gx = fg__grad_for_write(x, &beta);
        fg_tensor *gx2 = gx ? fg_tensor_reshape_view(gx, 2, (int64_t[]){R, in}) : NULL;
        if (!gx2) return gx ? fg_error_wrap(FG_EINVAL, "linear: gradient of x") : FG_ENOMEM;
        FG_TRY(ops->matmul(g2, false, wc, false, gx2, 1.0, beta));
    }
    if (fg__needs_grad(w)) { /* dw (out, in) += g^T (out, R) @ x (R, in) */
        fg_tensor *gw = fg__grad_of(w);
        if (!gw) return FG_ENOMEM;
        FG_TRY(ops->matmul(g2, true, x2, false, gw, 1.0, 1.0));
    }
    if (fg__needs_grad(b)) { /* db (out) += column sums of g (R, out) */
        fg_tensor *gb = fg__grad_of(b);
        if (!gb) return FG_ENOMEM;
        FG_TRY(ops->bias_grad(g2, gb));
    }
    return FG_OK;
}

fg_tensor *fg_linear(fg_tensor *x, fg_tensor *w, fg_tensor *b) {
    if (fg__check_float("linear", x) || fg__check_float("linear", w)) return NULL;
    bool ac = fg__autocast_applies(x, w); /* f32 and/or the autocast dtype: cast inside */
    if (!ac && fg__check_same_dtype("linear", x, w)) return NULL;
    if (b && !ac && fg__check_same_dtype("linear", x, b)) return NULL;
    if (b && ac && (fg__check_float("linear", b) || b->device != x->device)) return NULL;
    char sx[96], sw[96], sb[96];
    int64_t in = x->ndim ? x->shape[x->ndim - 1] : -1;
    if (x->ndim < 1 || w->ndim != 2 || w->shape[1] != in ||
        (b && (b->ndim != 1 || b->shape[0] != w->shape[0]))) {
        fg_error(FG_EINVAL,
                 "linear: x %s, weight %s, bias %s: expected x (..., in), weight "
                 "(out, in), bias (out)",
                 fg_tensor_describe(x, sx, sizeof sx), fg_tensor_describe(w, sw, sizeof sw),
                 b ? fg_tensor_describe(b, sb, sizeof sb) : "none");
        return NULL;
    }
    if (ac) return fg__autocast_linear(x, w, b);
    const fg_op_table *ops = fg__ops(x);
    if (!ops || FG_OP(ops, matmul) || (b && FG_OP(ops, bias_add))) return NULL;
    int64_t out = w->shape[0], R = 1; /* rows: every leading dim of x */
    for (int d = 0; d < x->ndim - 1; d++) R *= x->shape[d];
    fg_tensor *xc = fg_tensor_contiguous(x), *wc = fg_tensor_contiguous(w);
    fg_tensor *bc = b ? fg_tensor_contiguous(b) : NULL;
    if (!xc || !wc || (b && !bc)) return NULL;
    fg_tensor *x2 = fg_tensor_reshape_view(xc, 2, (int64_t[]){R, in}); /* (R, in) */
    int64_t shape[FG_MAX_DIMS];
    for (int d = 0; d < x->ndim; d++) shape[d] = x->shape[d];
    shape[x->ndim - 1] = out;
    fg_tensor *y = x2 ? fg_empty(x->dtype, x->ndim, shape) : NULL; /* (..., out) */
    fg_tensor *y2 = y ? fg_tensor_reshape_view(y, 2, (int64_t[]){R, out}) : NULL;
    if (!y2 || ops->matmul(x2, false, wc, true, y2, 1.0, 0.0)) return NULL;
    if (bc && ops->bias_add(y2, bc)) return NULL;
    fg__node *node;
    fg_tensor *inputs[3] = {x, w, b};
    if (fg__record(&node, "linear", linear_bw, y, b ? 3 : 2, inputs)) return NULL;
    if (node) {
        if (b && fg__needs_grad(b) && FG_OP(ops, bias_grad)) return NULL;
        node->saved[0] = x2;
        node->saved[1] = wc;
    }
    return y;
}
