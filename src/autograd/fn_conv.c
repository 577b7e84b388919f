/* Convolution (conv2d, conv1d as a conv2d of height 1), pooling (max with
 * indices, average, adaptive average) and batch normalisation, NCHW, with
 * PyTorch's arguments and output sizes. conv and pooling are the table's
 * kernels, one node each; batch_norm in training mode is one node of the
 * table's fused kernels (f32, f64) where the device has them, otherwise
 * (and in evaluation mode) built from recorded functions (mean_dims, var,
 * sub, mul, rsqrt, add), its gradients theirs; both update the running
 * statistics outside the tape. */
#include <math.h>
#include <string.h>

#include "autograd_impl.h"

/* ------------------------------------------------------------ convolution */

/* in = {x, w, b}; saved[0], [1] = contiguous x, w (4-d); ctx = the
 * params; i[0..3] = the 4-d output shape */
static FG_MUST_USE fg_status conv_bw(fg__node *n, const fg_tensor *g) {
    const fg_op_table *ops = fg__ops(g);
    const fg_conv_params *p = n->ctx;
    g = fg_tensor_reshape_view(g, 4, n->i); /* conv1d's (N, O, L) as (N, O, 1, L) */
    if (!g) return FG_ENOMEM;
    if (fg__needs_grad(n->in[0])) {
        double beta;
        fg_tensor *gx = fg__grad_for_write(n->in[0], &beta);
        fg_tensor *gx4 = gx ? fg_tensor_reshape_view(gx, 4, n->saved[0]->shape) : NULL;
        if (!gx4) return FG_ENOMEM;
        fg_conv_params pd = *p;
        pd.overwrite = beta == 0.0; /* a fresh buffer: written, not added to */
        FG_TRY(ops->conv2d_bwd_data(g, n->saved[1], &pd, gx4));
    }
    fg_tensor *gw = NULL, *gb = NULL;
    if (fg__needs_grad(n->in[1])) {
        fg_tensor *t = fg__grad_of(n->in[1]);
        if (!t || !(gw = fg_tensor_reshape_view(t, 4, n->saved[1]->shape))) return FG_ENOMEM;
    }
    if (fg__needs_grad(n->in[2]) && !(gb = fg__grad_of(n->in[2]))) return FG_ENOMEM;
    fg_conv_params pw = *p;
    pw.dy_as_before = fg__needs_grad(n->in[0]);
    if (gw || gb) FG_TRY(ops->conv2d_bwd_weight(n->saved[0], g, &pw, gw, gb));
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
    memset(p, 0, sizeof *p); /* every field, those added later too */
    p->groups = d.groups ? d.groups : 1;
    p->overwrite = false;
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
    fg__node *node;
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

static FG_MUST_USE fg_status conv_inputs(const char *fn, const fg_tensor *x, const fg_tensor *w,
                                         int nd) {
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

/* Autocast's list: a convolution of f32 tensors runs in the autocast dtype
 * (inputs, weight and bias cast, recorded, so that the f32 parameters get
 * their gradients; the output in that dtype), as PyTorch's lower_precision
 * list has conv1d/2d and conv_transpose2d. */
fg_status fg__autocast_conv(fg_tensor **x, fg_tensor **w, fg_tensor **b) {
    fg_dtype dt = fg_autocast_dtype();
    if (!*x || !*w || dt == FG_DTYPE_DEFAULT || !fg__autocast_applies(*x, *w) ||
        (*b && (*b)->dtype != FG_F32 && (*b)->dtype != dt))
        return FG_OK;
    bool bias = *b != NULL;
    *x = fg_cast(*x, dt);
    *w = *x ? fg_cast(*w, dt) : NULL;
    if (*w && bias) *b = fg_cast(*b, dt);
    return *x && *w && (!bias || *b) ? FG_OK : fg_last_status();
}

fg_tensor *fg_conv2d(fg_tensor *x, fg_tensor *w, fg_tensor *b, const fg_conv2d_opts *o) {
    if (fg__autocast_conv(&x, &w, &b) || conv_inputs("conv2d", x, w, 4)) return NULL;
    fg_tensor *xc = fg_tensor_contiguous(x), *wc = xc ? fg_tensor_contiguous(w) : NULL;
    if (!wc) return NULL;
    int64_t pre[2] = {x->shape[0], w->shape[0]};
    return conv_core("conv2d", x, xc, w, wc, b, o, 2, 4, pre);
}

fg_tensor *fg_conv1d(fg_tensor *x, fg_tensor *w, fg_tensor *b, const fg_conv2d_opts *o) {
    if (fg__autocast_conv(&x, &w, &b) || conv_inputs("conv1d", x, w, 3)) return NULL;
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
static FG_MUST_USE fg_status pool_bw(fg__node *n, const fg_tensor *g) {
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
    fg__node *node;
    if (fg__record(&node, fn, pool_bw, y, 1, &x)) return NULL;
    if (node) {
        if (FG_OP(ops, pool2d_bwd)) return NULL;
        node->saved[0] = idx;
        node->ctx = p;
    }
    return y;
}

static FG_MUST_USE fg_status pool_geometry(const char *fn, const fg_tensor *x,
                                           const int64_t *kernel, const int64_t *stride,
                                           const int64_t *padding, const int64_t *dilation,
                                           fg_pool_params *p) {
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

/* The fused training-mode node: in = {x, w, b}; saved[0] = contiguous x;
 * ctx = mean[C] then invstd[C] (double) */
static FG_MUST_USE fg_status bn_bw(fg__node *n, const fg_tensor *g) {
    const fg_op_table *ops = fg__ops(g);
    const double *stats = n->ctx;
    int64_t C = n->saved[0]->shape[1];
    fg_tensor *gc = fg_tensor_contiguous(g);
    double beta = 1.0; /* 0: gx is a fresh buffer, written */
    fg_tensor *gx = gc && fg__needs_grad(n->in[0]) ? fg__grad_for_write(n->in[0], &beta) : NULL;
    fg_tensor *gw = gc && fg__needs_grad(n->in[1]) ? fg__grad_of(n->in[1]) : NULL;
    fg_tensor *gb = gc && fg__needs_grad(n->in[2]) ? fg__grad_of(n->in[2]) : NULL;
    if (!gc || (fg__needs_grad(n->in[0]) && !gx) || (fg__needs_grad(n->in[1]) && !gw) ||
        (fg__needs_grad(n->in[2]) && !gb))
        return FG_ENOMEM;
    if (gx && !fg_tensor_is_contiguous(gx))
        return fg_error(FG_EINTERNAL, "batch_norm: gradient layout");
    return ops->batch_norm_bwd(n->saved[0], gc, stats, stats + C, n->in[1], gx, gw, gb,
                               beta == 0.0);
}

/* Whether the fused kernels take this call: f32 or f64, contiguous
 * parameters and statistics, every tensor on x's device, the CPU or the
 * guarded device (whose entries are the CPU's: the same bits; the running
 * statistics are staged through the host there). Other devices take the
 * composed path, device-clean. */
static bool bn_fusable(const fg_tensor *x, const fg_tensor *rm, const fg_tensor *rv,
                       const fg_tensor *w, const fg_tensor *b) {
    const fg_tensor *v[4] = {rm, rv, w, b};
    for (int k = 0; k < 4; k++)
        if (v[k] &&
            (!fg_tensor_is_contiguous(v[k]) || v[k]->device != x->device || v[k]->dev != x->dev))
            return false;
    if (x->device == FG_CUDA) return x->dtype == FG_F32; /* the CUDA kernels take f32 */
    return (x->device == FG_CPU || x->device == FG_GUARDED) &&
           (x->dtype == FG_F32 || x->dtype == FG_F64);
}

/* running = (1 - momentum) running + momentum * batch (the variance
 * unbiased by unb), per channel, in double as PyTorch's no-grad update; on
 * a device the two buffers are copied out and back in (a device kernel
 * would spare the 2 x C elements each way). */
static FG_MUST_USE fg_status bn_update_running(fg_tensor *rm, fg_tensor *rv, const double *mean,
                                               const double *var, double momentum, double unb) {
    int64_t C = rm->numel;
    size_t bytes = (size_t)C * fg_dtype_size(rm->dtype);
    fg_dev *dev = rm->dev && !fg_dev_host_accessible(rm->dev) ? rm->dev : NULL;
    char *h = dev ? fg_alloc(2 * bytes + 1) : NULL;
    if (dev && !h)
        return fg_error(FG_ENOMEM, "batch_norm: %zu bytes of running statistics", 2 * bytes);
    void *hm = dev ? h : rm->data, *hv = dev ? h + bytes : rv->data;
    fg_status s = dev ? fg_dev_copy_d2h(dev, hm, rm->data, bytes) : FG_OK;
    if (s == FG_OK && dev) s = fg_dev_copy_d2h(dev, hv, rv->data, bytes);
    for (int64_t c = 0; s == FG_OK && c < C; c++) {
        if (rm->dtype == FG_F64) {
            double *m = hm, *v = hv;
            m[c] = (1 - momentum) * m[c] + momentum * mean[c];
            v[c] = (1 - momentum) * v[c] + momentum * var[c] * unb;
        } else {
            float *m = hm, *v = hv;
            m[c] = (float)((1 - momentum) * (double)m[c] + momentum * mean[c]);
            v[c] = (float)((1 - momentum) * (double)v[c] + momentum * var[c] * unb);
        }
    }
    if (s == FG_OK && dev) s = fg_dev_copy_h2d(dev, rm->data, hm, bytes);
    if (s == FG_OK && dev) s = fg_dev_copy_h2d(dev, rv->data, hv, bytes);
    fg_free(h);
    return s;
}

/* training mode in one node of the table's fused kernels */
static fg_tensor *bn_fused(fg_tensor *x, fg_tensor *running_mean, fg_tensor *running_var,
                           fg_tensor *w, fg_tensor *b, double momentum, double eps) {
    const fg_op_table *ops = fg__ops(x);
    int64_t C = x->shape[1], n = x->numel / C;
    double *st = fg_step_alloc(sizeof(double) * (size_t)(2 * C + 1));
    fg_tensor *xc = st ? fg_tensor_contiguous(x) : NULL;
    fg_tensor *y = xc ? fg_empty_like(xc) : NULL;
    double *var = y ? fg_step_alloc(sizeof(double) * (size_t)(C + 1)) : NULL;
    if (!var || ops->batch_norm_stats(xc, st, var)) return NULL;
    for (int64_t c = 0; c < C; c++) st[C + c] = 1.0 / sqrt(var[c] + eps);
    if (ops->batch_norm_fwd(xc, st, st + C, w, b, y)) return NULL;
    /* outside the tape, as PyTorch's no-grad update */
    if (running_mean && running_var &&
        bn_update_running(running_mean, running_var, st, var, momentum,
                          (double)n / (double)(n - 1)) != FG_OK)
        return NULL;
    fg__node *node;
    fg_tensor *ins[3] = {x, w, b};
    if (fg__record(&node, "batch_norm", bn_bw, y, 3, ins)) return NULL;
    if (node) {
        node->saved[0] = xc;
        node->ctx = st;
        node->out_unread = true;
    }
    return y;
}

fg_tensor *fg_batch_norm(fg_tensor *x, fg_tensor *running_mean, fg_tensor *running_var,
                         fg_tensor *w, fg_tensor *b, bool training, double momentum, double eps) {
    const char *fn = "batch_norm";
    if (fg__check_float(fn, x) || !(x = fg__autocast_f32(x))) return NULL; /* autocast: f32 */
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
        if (bn_fusable(x, running_mean, running_var, w, b))
            return bn_fused(x, running_mean, running_var, w, b, momentum, eps);
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
