/* matmul and linear under autocast (fg_autocast_set): one node each, whose
 * inputs are the caller's tensors (f32, or already in the autocast dtype).
 * Forward rounds the f32 operands to the autocast dtype
 * (fg__autocast_operand) and multiplies them with f32 accumulation into an
 * output in the autocast dtype, rounded once (PyTorch's CPU autocast
 * returns bf16 from a linear layer too: the activations that follow, and
 * those saved for backward, take half the memory). Backward multiplies the
 * output's gradient (in the autocast dtype) with the saved rounded
 * operands, writing straight into the inputs' gradients in their own
 * dtypes (beta = 1 for leaves: an f32 parameter's gradient accumulates in
 * f32, never rounded to the low dtype). The bias (f32) is added before the
 * output's rounding, and its gradient summed in f32.
 *
 * fn_matmul.c checks dtypes and shapes first, then hands over here. */
#include "autograd_impl.h"

/* saved[0] = rounded a, saved[1] = rounded b; i[0] = the autocast dtype */
static FG_MUST_USE fg_status mm_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *a = n->in[0], *b = n->in[1], *al = n->saved[0], *bl = n->saved[1];
    fg_dtype dt = (fg_dtype)n->i[0];
    fg_tensor *gl = fg__autocast_operand(g, dt);
    if (!gl) return fg_last_status();
    double beta;
    if (fg__needs_grad(a)) { /* da (..., M, K) += g (..., M, N) @ b^T */
        fg_tensor *ga = fg__grad_for_write(a, &beta);
        if (!ga) return FG_ENOMEM;
        FG_TRY(fg__autocast_matmul(dt, gl, false, bl, true, ga, beta));
    }
    if (fg__needs_grad(b)) {
        fg_tensor *gb = fg__grad_for_write(b, &beta);
        if (!gb) return FG_ENOMEM;
        if (b->ndim == 2 && a->ndim > 2) { /* db (K, N) += a (R, K)^T @ g (R, N) */
            int64_t K = al->shape[al->ndim - 1], N = gl->shape[gl->ndim - 1];
            fg_tensor *a2 = fg_tensor_reshape_view(al, 2, (int64_t[]){-1, K});
            fg_tensor *g2 = fg_tensor_reshape_view(gl, 2, (int64_t[]){-1, N});
            if (!a2 || !g2) return FG_ENOMEM;
            FG_TRY(fg__autocast_matmul(dt, a2, true, g2, false, gb, beta));
        } else { /* db (..., K, N) += a^T @ g, batch entry by entry */
            FG_TRY(fg__autocast_matmul(dt, al, true, gl, false, gb, beta));
        }
    }
    return FG_OK;
}

fg_tensor *fg__autocast_mm(fg_tensor *a, fg_tensor *b) {
    fg_dtype dt = fg_autocast_dtype();
    fg_tensor *al = fg__autocast_operand(a, dt), *bl = al ? fg__autocast_operand(b, dt) : NULL;
    if (!bl) return NULL;
    int64_t shape[FG_MAX_DIMS];
    for (int d = 0; d < a->ndim; d++) shape[d] = a->shape[d];
    shape[a->ndim - 1] = b->shape[b->ndim - 1];
    fg_tensor *y = fg_empty(dt, a->ndim, shape); /* (..., M, N) */
    if (!y || fg__autocast_matmul(dt, al, false, bl, false, y, 0.0)) return NULL;
    fg__node *node;
    fg_tensor *in[2] = {a, b};
    if (fg__record(&node, "matmul", mm_bw, y, 2, in)) return NULL;
    if (node) {
        node->saved[0] = al;
        node->saved[1] = bl;
        node->i[0] = dt;
    }
    return y;
}

/* saved[0] = rounded x as (R, in), saved[1] = rounded w (out, in: in dt, or
 * in f32 with dt's values, weight_operand); i[0] = dtype */
static FG_MUST_USE fg_status linear_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *x = n->in[0], *w = n->in[1], *b = n->nin > 2 ? n->in[2] : NULL;
    fg_tensor *xl = n->saved[0], *wl = n->saved[1];
    fg_dtype dt = (fg_dtype)n->i[0];
    int64_t R = xl->shape[0], in = xl->shape[1], out = wl->shape[0];
    fg_tensor *g2 = fg_tensor_reshape_view(g, 2, (int64_t[]){R, out}); /* (R, out) */
    fg_tensor *gl = g2 ? fg__autocast_operand(g2, dt) : NULL;
    if (!gl) return fg_last_status();
    /* dx (R, in) = g (R, out) @ w (out, in) (+ dx), dw (out, in) += g^T @ x,
     * db (out) += column sums of g (before its rounding), in one call: where
     * the product has no low-precision hardware, g is widened once for all */
    fg_tensor *gx2 = NULL, *gw = NULL, *gb = NULL;
    double beta = 0;
    if (fg__needs_grad(x)) {
        fg_tensor *gx = fg__grad_for_write(x, &beta);
        gx2 = gx ? fg_tensor_reshape_view(gx, 2, (int64_t[]){R, in}) : NULL;
        if (!gx2) return gx ? fg_error_wrap(FG_EINVAL, "linear: gradient of x") : FG_ENOMEM;
    }
    if (fg__needs_grad(w) && !(gw = fg__grad_of(w))) return FG_ENOMEM;
    if (fg__needs_grad(b) && !(gb = fg__grad_of(b))) return FG_ENOMEM;
    return fg__ops_linear_lowp_bwd(xl, wl, gl, g2, gx2, beta, gw, gb);
}

/* A linear layer's weight in dt's values: in dt where the product runs on
 * low-precision hardware; elsewhere (the product widens its operands to
 * f32 anyway) an f32 weight is rounded to dt's values and kept in f32,
 * once per forward, instead of being rounded to dt and widened back by the
 * forward and again by the backward. The values are the same. */
static fg_tensor *weight_operand(const fg_tensor *w, fg_dtype dt) {
    if (w->dtype != FG_F32 || fg__ops_lowp_product_native(w->device, dt))
        return fg__autocast_operand(w, dt);
    fg_tensor *c = fg_tensor_contiguous(w);
    fg_tensor *o = c ? fg_empty(FG_F32, c->ndim, c->shape) : NULL;
    if (!o || fg__ops_round_f32(c, o, dt)) return NULL;
    return o;
}

fg_tensor *fg__autocast_linear(fg_tensor *x, fg_tensor *w, fg_tensor *b) {
    fg_dtype dt = fg_autocast_dtype();
    const fg_op_table *ops = fg__ops(x);
    if (!ops) return NULL;
    int64_t in = x->shape[x->ndim - 1], out = w->shape[0], R = 1;
    for (int d = 0; d < x->ndim - 1; d++) R *= x->shape[d];
    fg_tensor *xl = fg__autocast_operand(x, dt), *wl = xl ? weight_operand(w, dt) : NULL;
    fg_tensor *bc = b ? fg_tensor_contiguous(b) : NULL;
    if (!wl || (b && !bc)) return NULL;
    fg_tensor *x2 = fg_tensor_reshape_view(xl, 2, (int64_t[]){R, in}); /* (R, in) */
    int64_t shape[FG_MAX_DIMS];
    for (int d = 0; d < x->ndim; d++) shape[d] = x->shape[d];
    shape[x->ndim - 1] = out;
    fg_tensor *y = x2 ? fg_empty(dt, x->ndim, shape) : NULL; /* (..., out) */
    fg_tensor *y2 = y ? fg_tensor_reshape_view(y, 2, (int64_t[]){R, out}) : NULL;
    if (!y2 || fg__ops_linear_lowp(x2, wl, bc, y2)) return NULL;
    fg__node *node;
    fg_tensor *inputs[3] = {x, w, b};
    if (fg__record(&node, "linear", linear_bw, y, b ? 3 : 2, inputs)) return NULL;
    if (node) {
        if (b && fg__needs_grad(b) && FG_OP(ops, bias_grad)) return NULL;
        node->saved[0] = x2;
        node->saved[1] = wl;
        node->i[0] = dt;
    }
    return y;
}
