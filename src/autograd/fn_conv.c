/* Convolution (conv2d, conv1d as a conv2d of height 1), pooling (max with
 * indices, average, adaptive average) and batch normalisation, NCHW, with
 * PyTorch's arguments and output sizes. conv and pooling are the table's
 * kernels, one node each; batch_norm is built from recorded functions
 * (mean_dims, var, sub, mul, rsqrt, add), so its gradients come from
 * theirs, and updates the running statistics outside the tape. */
#include <math.h>
#include <string.h>

#include "autograd_impl.h"

/* ------------------------------------------------------------ convolution */

/* in = {x, w, b}; saved[0], [1] = contiguous x, w (4-d); ctx = the
 * params; i[0..3] = the 4-d output shape */
static fg_status conv_bw(fg_node *n, const fg_tensor *g) {
    const fg_op_table *ops = fg__ops(g);
    const fg_conv_params *p = n->ctx;
    g = fg_tensor_reshape_view(g, 4, n->i); /* conv1d's (N, O, L) as (N, O, 1, L) */
    if (!g) return FG_ENOMEM;
    if (fg__needs_grad(n->in[0])) {
        fg_tensor *gx = fg__grad_of(n->in[0]);
        fg_tensor *gx4 = gx ? fg_tensor_reshape_view(gx, 4, n->saved[0]->shape) : NULL;
        if (!gx4) return FG_ENOMEM;
        FG_TRY(ops->conv2d_bwd_data(g, n->saved[1], p, gx4));
    }
    fg_tensor *gw = NULL, *gb = NULL;
    if (fg__needs_grad(n->in[1])) {
        fg_tensor *t = fg__grad_of(n->in[1]);
        if (!t || !(gw = fg_tensor_reshape_view(t, 4, n->saved[1]->shape))) return FG_ENOMEM;
    }
    if (fg__needs_grad(n->in[2]) && !(gb = fg__grad_of(n->in[2]))) return FG_ENOMEM;
    if (gw || gb) FG_TRY(ops->conv2d_bwd_weight(n->saved[0], g, p, gw, gb));
    return FG_OK;
}

/* x4 (N, C, H, W), w4 (O, C / groups, KH, KW) as 4-d views; xo, wo, bo the
 * tensors the node records (gradients flow to them) */
static fg_tensor *conv_core(const char *fn, fg_tensor *xo, fg_tensor *x4, fg_tensor *wo,
                            fg_tensor *w4, fg_tensor *bo, const fg_conv2d_opts *o, int dims,
                            int outnd, const int64_t *outshape_prefix) {
    fg_conv2d_opts d = o ? *o : (fg_conv2d_opts){0};
    fg_conv_params *p = fg_step_alloc(sizeof *p);
    if (!p) return NULL;
    p->groups = d.groups ? d.groups : 1;
    int64_t C = x4->shape[1], O = w4->shape[0], in[2] = {x4->shape[2], x4->shape[3]};
    int64_t k[2] = {w4->shape[2], w4->shape[3]}, out[2];
    char sx[96], sw[96];
    if (p->groups < 1 || C % p->groups || O % p->groups || w4->shape[1] != C / p->groups) {
        fg_error(FG_EINVAL,
                 "%s: input %s and weight %s with groups %lld: expected weight (O, "
                 "C / groups, ...) with C and O multiples of groups",
                 fn, fg_tensor_describe(xo, sx, sizeof sx), fg_tensor_describe(wo, sw, sizeof sw),
                 (long long)p->groups);
        return NULL;
    }
    for (int i = 0; i < 2; i++) {
        int j = dims == 1 ? 0 : i; /* conv1d: the one spatial dim is the width */
        bool real = dims == 2 || i == 1;
        p->stride[i] = real && d.stride[j] ? d.stride[j] : 1;
        p->dilation[i] = real && d.dilation[j] ? d.dilation[j] : 1;
        p->pad[i] = real ? d.padding[j] : 0;
        if (p->stride[i] < 1 || p->dilation[i] < 1 || p->pad[i] < 0) {
            fg_error(FG_EINVAL,
                     "%s: stride %lld, padding %lld, dilation %lld: expected >= 1, "
                     ">= 0, >= 1",
                     fn, (long long)p->stride[i], (long long)p->pad[i], (long long)p->dilation[i]);
            return NULL;
        }
        int64_t range = (k[i] - 1) * p->dilation[i] + 1, total = 2 * p->pad[i];
        if (d.same && real) {
            if (p->stride[i] != 1) {
                fg_error(FG_EINVAL, "%s: padding=\"same\" needs stride 1 (PyTorch's rule)", fn);
                return NULL;
            }
            total = range - 1;
            p->pad[i] = total / 2; /* the odd one goes after, as PyTorch pads */
        }
        out[i] = (in[i] + total - range) / p->stride[i] + 1;
        if (in[i] + total < range) {
            fg_error(FG_EINVAL, "%s: input %s is smaller than the (dilated, padded) kernel %s", fn,
                     fg_tensor_describe(xo, sx, sizeof sx), fg_tensor_describe(wo, sw, sizeof sw));
            return NULL;
        }
    }
    if (bo && (bo->ndim != 1 || bo->shape[0] != O || bo->dtype != xo->dtype)) {
        fg_error(FG_EINVAL, "%s: the bias needs (%lld) of %s", fn, (long long)O,
                 fg_dtype_name(xo->dtype));
        return NULL;
    }
    const fg_op_table *ops = fg__ops(xo);
    if (!ops || FG_OP(ops, conv2d_fwd)) return NULL;
    int64_t y4[4] = {x4->shape[0], O, out[0], out[1]};
    fg_tensor *y = fg_empty(xo->dtype, 4, y4);
    fg_tensor *bc = bo ? fg_tensor_contiguous(bo) : NULL;
    if (!y || (bo && !bc) || ops->conv2d_fwd(x4, w4, bc, p, y)) return NULL;
    int64_t oshape[FG_MAX_DIMS];
    memcpy(oshape, outshape_prefix, sizeof(int64_t) * 2);
    oshape[2] = dims == 2 ? out[0] : out[1];
    oshape[3] = out[1];
    fg_tensor *yo = fg_tensor_reshape_view(y, outnd, oshape);
    if (!yo) return NULL;
    fg_node *node;
    fg_tensor *ins[3] = {xo, wo, bo};
    if (fg__record(&node, fn, conv_bw, yo, 3, ins)) return NULL;
    if (node) {
        if (FG_OP(ops, conv2d_bwd_data) || FG_OP(ops, conv2d_bwd_weight)) return NULL;
        node->saved[0] = x4;
        node->saved[1] = w4;
        node->ctx = p;
        memcpy(node->i, y4, sizeof y4);
    }
    return yo;
}

static fg_status conv_inputs(const char *fn, const fg_tensor *x, const fg_tensor *w, int nd) {
    FG_TRY(fg__check_float(fn, x));
    FG_TRY(fg__check_float(fn, w));
    FG_TRY(fg__check_same_dtype(fn, x, w));
    if (x->ndim != nd || w->ndim != nd) {
        char a[96], b[96];
        return fg_error(FG_EINVAL,
                        "%s: input %s and weight %s: expected %d dims each (batched, "
                        "channels first)",
                        fn, fg_tensor_describe(x, a, sizeof a), fg_tensor_describe(w, b, sizeof b),
                        nd);
    }
    return FG_OK;
}

fg_tensor *fg_conv2d(fg_tensor *x, fg_tensor *w, fg_tensor *b, const fg_conv2d_opts *o) {
    if (conv_inputs("conv2d", x, w, 4)) return NULL;
    fg_tensor *xc = fg_tensor_contiguous(x), *wc = xc ? fg_tensor_contiguous(w) : NULL;
    if (!wc) return NULL;
    int64_t pre[2] = {x->shape[0], w->shape[0]};
    return conv_core("conv2d", x, xc, w, wc, b, o, 2, 4, pre);
}

fg_tensor *fg_conv1d(fg_tensor *x, fg_tensor *w, fg_tensor *b, const fg_conv2d_opts *o) {
    if (conv_inputs("conv1d", x, w, 3)) return NULL;
    fg_tensor *xc = fg_tensor_contiguous(x), *wc = xc ? fg_tensor_contiguous(w) : NULL;
    fg_tensor *x4 =
        wc ? fg_tensor_reshape_view(xc, 4, (int64_t[]){x->shape[0], x->shape[1], 1, x->shape[2]})
           : NULL;
    fg_tensor *w4 =
        x4 ? fg_tensor_reshape_view(wc, 4, (int64_t[]){w->shape[0], w->shape[1], 1, w->shape[2]})
           : NULL;
    if (!w4) return NULL;
    int64_t pre[2] = {x->shape[0], w->shape[0]};
    return conv_core("conv1d", x, x4, w, w4, b, o, 1, 3, pre);
}

/* ---------------------------------------------------------------- pooling */

/* saved[0] = indices (max) or NULL; ctx = the params; f[0]: in holds x */
static fg_status pool_bw(fg_node *n, const fg_tensor *g) {
    fg_tensor *gx = fg__grad_of(n->in[0]);
    if (!gx) return FG_ENOMEM;
    return fg__ops(g)->pool2d_bwd(g, n->saved[0], n->ctx, gx);
}

static int64_t pool_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
    int64_t num = in + 2 * p - d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0);
    int64_t out = (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;
    if (ceil_mode && (out - 1) * s >= in + p) out--; /* the last window starts inside */
    return out;
}

static fg_tensor *pool(const char *fn, fg_tensor *x, fg_pool_params *p, int64_t oh, int64_t ow,
                       fg_tensor **indices) {
    if (indices) *indices = NULL;
    const fg_op_table *ops = fg__ops(x);
    if (!ops || FG_OP(ops, pool2d_fwd)) return NULL;
    if (oh <= 0 || ow <= 0) {
        char s[96];
        fg_error(FG_EINVAL, "%s: input %s gives an empty output (%lld, %lld)", fn,
                 fg_tensor_describe(x, s, sizeof s), (long long)oh, (long long)ow);
        return NULL;
    }
    fg_tensor *xc = fg_tensor_contiguous(x);
    int64_t shape[4] = {x->shape[0], x->shape[1], oh, ow};
    fg_tensor *y = xc ? fg_empty(x->dtype, 4, shape) : NULL;
    fg_tensor *idx = y && p->kind == FG_POOL_MAX ? fg_empty(FG_I32, 4, shape) : NULL;
    if (!y || (p->kind == FG_POOL_MAX && !idx) || ops->pool2d_fwd(xc, p, y, idx)) return NULL;
    if (indices) *indices = idx;
    fg_node *node;
    if (fg__record(&node, fn, pool_bw, y, 1, &x)) return NULL;
    if (node) {
        if (FG_OP(ops, pool2d_bwd)) return NULL;
        node->saved[0] = idx;
        node->ctx = p;
    }
    return y;
}

static fg_status pool_geometry(const char *fn, const fg_tensor *x, const int64_t *kernel,
                               const int64_t *stride, const int64_t *padding,
                               const int64_t *dilation, fg_pool_params *p) {
    FG_TRY(fg__check_float(fn, x));
    if (x->ndim != 4) {
        char s[96];
        return fg_error(FG_EINVAL, "%s: input %s: expected (N, C, H, W)", fn,
                        fg_tensor_describe(x, s, sizeof s));
    }
    if (!kernel) return fg_error(FG_EINVAL, "%s: NULL kernel size", fn);
    for (int i = 0; i < 2; i++) {
        p->kernel[i] = kernel[i];
        p->stride[i] = stride && stride[i] ? stride[i] : kernel[i]; /* PyTorch: the kernel */
        p->pad[i] = padding ? padding[i] : 0;
        p->dilation[i] = dilation && dilation[i] ? dilation[i] : 1;
        if (p->kernel[i] < 1 || p->stride[i] < 1 || p->pad[i] < 0 || p->dilation[i] < 1)
            return fg_error(FG_EINVAL,
                            "%s: kernel %lld, stride %lld, padding %lld, dilation "
                            "%lld: expected >= 1, >= 1, >= 0, >= 1",
                            fn, (long long)p->kernel[i], (long long)p->stride[i],
                            (long long)p->pad[i], (long long)p->dilation[i]);
        if (p->pad[i] > p->kernel[i] / 2)
            return fg_error(FG_EINVAL,
                            "%s: padding %lld is more than half the kernel %lld "
                            "(PyTorch's rule)",
                            fn, (long long)p->pad[i], (long long)p->kernel[i]);
    }
    return FG_OK;
}

fg_tensor *fg_max_pool2d(fg_tensor *x, const int64_t kernel[2], const int64_t stride[2],
                         const int64_t padding[2], const int64_t dilation[2], bool ceil_mode,
                         fg_tensor **indices) {
    fg_pool_params *p = fg_step_alloc(sizeof *p);
    if (indices) *indices = NULL;
    if (!p) return NULL;
    memset(p, 0, sizeof *p);
    p->kind = FG_POOL_MAX;
    if (pool_geometry("max_pool2d", x, kernel, stride, padding, dilation, p)) return NULL;
    int64_t oh =
        pool_out(x->shape[2], p->kernel[0], p->stride[0], p->pad[0], p->dilation[0], ceil_mode);
    int64_t ow =
        pool_out(x->shape[3], p->kernel[1], p->stride[1], p->pad[1], p->dilation[1], ceil_mode);
    return pool("max_pool2d", x, p, oh, ow, indices);
}

fg_tensor *fg_avg_pool2d(fg_tensor *x, const int64_t kernel[2], const int64_t stride[2],
                         const int64_t padding[2], bool ceil_mode, bool count_include_pad) {
    fg_pool_params *p = fg_step_alloc(sizeof *p);
    if (!p) return NULL;
    memset(p, 0, sizeof *p);
    p->kind = FG_POOL_AVG;
    p->count_include_pad = count_include_pad;
    if (pool_geometry("avg_pool2d", x, kernel, stride, padding, NULL, p)) return NULL;
    int64_t oh = pool_out(x->shape[2], p->kernel[0], p->stride[0], p->pad[0], 1, ceil_mode);
    int64_t ow = pool_out(x->shape[3], p->kernel[1], p->stride[1], p->pad[1], 1, ceil_mode);
    return pool("avg_pool2d", x, p, oh, ow, NULL);
}

fg_tensor *fg_adaptive_avg_pool2d(fg_tensor *x, int64_t out_h, int64_t out_w) {
    fg_pool_params *p = fg_step_alloc(sizeof *p);
    if (!p || fg__check_float("adaptive_avg_pool2d", x)) return NULL;
    if (x->ndim != 4) {
        char s[96];
        fg_error(FG_EINVAL, "adaptive_avg_pool2d: input %s: expected (N, C, H, W)",
                 fg_tensor_describe(x, s, sizeof s));
        return NULL;
    }
    memset(p, 0, sizeof *p);
    p->kind = FG_POOL_ADAPTIVE_AVG;
    return pool("adaptive_avg_pool2d", x, p, out_h, out_w, NULL);
}

/* ----------------------------------------------------------- batch norm */

fg_tensor *fg_batch_norm(fg_tensor *x, fg_tensor *running_mean, fg_tensor *running_var,
                         fg_tensor *w, fg_tensor *b, bool training, double momentum, double eps) {
    const char *fn = "batch_norm";
    if (fg__check_float(fn, x)) return NULL;
    if (x->ndim < 2) {
        char s[96];
        fg_error(FG_EINVAL, "%s: input %s: expected (N, C, ...)", fn,
                 fg_tensor_describe(x, s, sizeof s));
        return NULL;
    }
    int64_t C = x->shape[1], shape[FG_MAX_DIMS]; /* (1, C, 1, ...) for broadcasting */
    int dims[FG_MAX_DIMS], nd = 0;
    for (int d = 0; d < x->ndim; d++) {
        shape[d] = d == 1 ? C : 1;
        if (d != 1) dims[nd++] = d;
    }
    fg_tensor *stats[4] = {running_mean, running_var, w, b};
    for (int k = 0; k < 4; k++)
        if (stats[k] && (stats[k]->numel != C || stats[k]->dtype != x->dtype)) {
            fg_error(FG_EINVAL, "%s: running stats, weight and bias need (%lld) of %s", fn,
                     (long long)C, fg_dtype_name(x->dtype));
            return NULL;
        }
    if (!training && (!running_mean || !running_var)) {
        fg_error(FG_EINVAL, "%s: evaluation mode needs the running mean and variance", fn);
        return NULL;
    }
    fg_tensor *mean, *var;
    if (training) {
        int64_t n = x->numel / C;
        if (n <= 1) {
            fg_error(FG_EINVAL, "%s: one value per channel in training (PyTorch's rule)", fn);
            return NULL;
        }
        mean = fg_mean_dims(x, nd, dims, true);
        var = fg_var(x, nd, dims, 0, true);
        if (!mean || !var) return NULL;
        if (running_mean && running_var) { /* outside the tape, as PyTorch's no-grad update */
            const fg_op_table *ops = fg__ops(x);
            fg_tensor *m1 = fg_tensor_reshape_view(mean, 1, &C);
            fg_tensor *v1 = fg_tensor_reshape_view(var, 1, &C);
            fg_tensor *vu = v1 ? fg_empty_like(v1) : NULL;
            if (!m1 || !vu || ops->scale(v1, (double)n / (double)(n - 1), vu) ||
                ops->axpby(momentum, m1, 1 - momentum, running_mean) ||
                ops->axpby(momentum, vu, 1 - momentum, running_var))
                return NULL;
        }
    } else {
        mean = fg_reshape(running_mean, x->ndim, shape);
        var = fg_reshape(running_var, x->ndim, shape);
    }
    fg_tensor *e = var ? fg_scalar(x->dtype, eps) : NULL;
    fg_tensor *y = fg_mul(fg_sub(x, mean), fg_rsqrt(fg_add(var, e)));
    if (y && w) y = fg_mul(y, fg_reshape(w, x->ndim, shape));
    if (y && b) y = fg_add(y, fg_reshape(b, x->ndim, shape));
    return y;
}
