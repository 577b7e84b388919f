/* Transposed convolution (ConvTranspose2d), NCHW, with PyTorch's
 * arguments and output size, on the convolution kernels of the op table:
 * its forward is a convolution's input gradient (the transposed
 * convolution is the adjoint of the convolution with the same weight
 * (C_in, C_out / groups, KH, KW) read as (O, C / groups, ...)), its input
 * gradient a convolution's forward, its weight gradient a convolution's
 * weight gradient with the roles of input and output swapped. One node; the
 * bias is added by a recorded broadcast add. */
#include <string.h>

#include "autograd_impl.h"

/* in = {x, w}; saved[0], [1] = contiguous x, w; ctx = the params */
static FG_MUST_USE fg_status convt_bw(fg__node *n, const fg_tensor *g) {
    const fg_op_table *ops = fg__ops(g);
    const fg_conv_params *p = n->ctx;
    fg_tensor *gc = fg_tensor_contiguous(g);
    if (!gc) return FG_ENOMEM;
    if (fg__needs_grad(n->in[0])) {
        fg_tensor *gx = fg__grad_of(n->in[0]);
        fg_tensor *t = gx ? fg_empty_like(n->saved[0]) : NULL;
        if (!t) return FG_ENOMEM;
        FG_TRY(ops->conv2d_fwd(gc, n->saved[1], NULL, p, t));
        FG_TRY(ops->axpby(1.0, t, 1.0, gx));
    }
    if (fg__needs_grad(n->in[1])) {
        fg_tensor *gw = fg__grad_of(n->in[1]);
        if (!gw) return FG_ENOMEM;
        FG_TRY(ops->conv2d_bwd_weight(gc, n->saved[0], p, gw, NULL));
    }
    return FG_OK;
}

fg_tensor *fg_conv_transpose2d(fg_tensor *x, fg_tensor *w, fg_tensor *b,
                               const fg_conv_transpose2d_opts *o) {
    const char *fn = "conv_transpose2d";
    if (fg__autocast_conv(&x, &w, &b) || fg__check_float(fn, x) || fg__check_float(fn, w) ||
        fg__check_same_dtype(fn, x, w))
        return NULL;
    fg_conv_transpose2d_opts d = o ? *o : (fg_conv_transpose2d_opts){0};
    int64_t G = d.groups ? d.groups : 1;
    char sx[96], sw[96];
    if (x->ndim != 4 || w->ndim != 4 || G < 1 || x->shape[1] != w->shape[0] || w->shape[0] % G) {
        fg_error(FG_EINVAL,
                 "%s: input %s and weight %s with groups %lld: expected (N, C_in, H, W) and "
                 "(C_in, C_out / groups, KH, KW) with C_in a multiple of groups",
                 fn, fg_tensor_describe(x, sx, sizeof sx), fg_tensor_describe(w, sw, sizeof sw),
                 (long long)G);
        return NULL;
    }
    fg_conv_params *p = fg_step_alloc(sizeof *p);
    if (!p) return NULL;
    memset(p, 0, sizeof *p); /* every field, those added later too */
    p->groups = G;
    p->overwrite = false;
    int64_t out[2];
    for (int i = 0; i < 2; i++) {
        p->stride[i] = d.stride[i] ? d.stride[i] : 1;
        p->dilation[i] = d.dilation[i] ? d.dilation[i] : 1;
        p->pad[i] = d.padding[i];
        int64_t op = d.output_padding[i];
        if (p->stride[i] < 1 || p->dilation[i] < 1 || p->pad[i] < 0 || op < 0 ||
            (op >= p->stride[i] && op >= p->dilation[i])) {
            fg_error(FG_EINVAL,
                     "%s: stride %lld, padding %lld, output_padding %lld, dilation %lld: "
                     "expected >= 1, >= 0, >= 0 and smaller than stride or dilation, >= 1",
                     fn, (long long)p->stride[i], (long long)p->pad[i], (long long)op,
                     (long long)p->dilation[i]);
            return NULL;
        }
        out[i] = (x->shape[2 + i] - 1) * p->stride[i] - 2 * p->pad[i] +
                 p->dilation[i] * (w->shape[2 + i] - 1) + op + 1;
        if (out[i] <= 0) {
            fg_error(FG_EINVAL, "%s: input %s and weight %s give an empty output", fn,
                     fg_tensor_describe(x, sx, sizeof sx), fg_tensor_describe(w, sw, sizeof sw));
            return NULL;
        }
    }
    int64_t Cout = w->shape[1] * G;
    if (b && (b->ndim != 1 || b->shape[0] != Cout || b->dtype != x->dtype)) {
        fg_error(FG_EINVAL, "%s: the bias needs (%lld) of %s", fn, (long long)Cout,
                 fg_dtype_name(x->dtype));
        return NULL;
    }
    const fg_op_table *ops = fg__ops(x);
    if (!ops || FG_OP(ops, conv2d_bwd_data)) return NULL;
    fg_tensor *xc = fg_tensor_contiguous(x), *wc = xc ? fg_tensor_contiguous(w) : NULL;
    int64_t ys[4] = {x->shape[0], Cout, out[0], out[1]};
    fg_tensor *y = wc ? fg_zeros(x->dtype, 4, ys) : NULL;
    if (!y || ops->conv2d_bwd_data(xc, wc, p, y)) return NULL;
    fg__node *node;
    fg_tensor *ins[2] = {x, w};
    if (fg__record(&node, fn, convt_bw, y, 2, ins)) return NULL;
    if (node) {
        if (FG_OP(ops, conv2d_fwd) || FG_OP(ops, conv2d_bwd_weight)) return NULL;
        node->saved[0] = xc;
        node->saved[1] = wc;
        node->ctx = p;
    }
    if (b) y = fg_add(y, fg_reshape(b, 4, (int64_t[]){1, Cout, 1, 1}));
    return y;
}
