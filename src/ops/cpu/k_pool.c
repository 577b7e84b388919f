/* 2-d pooling, NCHW: max (with the index of each maximum in its H x W
 * plane, NaN the largest, the first of ties), average (PyTorch's divisor:
 * the window clipped to the padded border, or to the image without
 * count_include_pad) and adaptive average (PyTorch's windows), forward and
 * backward (accumulated). Direct loops over each (n, c) plane, in
 * parallel: a plane's gradient is written by one thread. f32 and f64. */
#include <math.h>

#include "k_ops.h"

static FG_MUST_USE fg_status check(const char *kernel, const fg_tensor *x, const fg_tensor *y,
                                   const fg_pool_params *p) {
    char a[96], b[96];
    bool ok = x->ndim == 4 && y->ndim == 4 && x->dtype == y->dtype && x->shape[0] == y->shape[0] &&
              x->shape[1] == y->shape[1] && fg_tensor_is_contiguous(x) &&
              fg_tensor_is_contiguous(y);
    if (ok && p->kind != FG_POOL_ADAPTIVE_AVG)
        for (int i = 0; i < 2; i++)
            ok = ok && p->kernel[i] > 0 && p->stride[i] > 0 && p->dilation[i] > 0 && p->pad[i] >= 0;
    if (ok && p->kind == FG_POOL_ADAPTIVE_AVG) ok = y->shape[2] > 0 && y->shape[3] > 0;
    if (!ok)
        return fg_error(FG_EINVAL, "%s: input %s and output %s do not make a pooling", kernel,
                        fg_tensor_describe(x, a, sizeof a), fg_tensor_describe(y, b, sizeof b));
    return FG_OK;
}

/* the window of output (oh, ow): rows [*h0, *h1), columns [*w0, *w1) of the
 * image, and the divisor of an average */
static void window(const fg_pool_params *p, int64_t H, int64_t W, int64_t OH, int64_t OW,
                   int64_t oh, int64_t ow, int64_t *h0, int64_t *h1, int64_t *w0, int64_t *w1,
                   int64_t *div) {
    if (p->kind == FG_POOL_ADAPTIVE_AVG) {
        *h0 = oh * H / OH;
        *h1 = ((oh + 1) * H + OH - 1) / OH;
        *w0 = ow * W / OW;
        *w1 = ((ow + 1) * W + OW - 1) / OW;
        *div = (*h1 - *h0) * (*w1 - *w0);
        return;
    }
    int64_t hs = oh * p->stride[0] - p->pad[0], ws = ow * p->stride[1] - p->pad[1];
    int64_t he = hs + (p->kernel[0] - 1) * p->dilation[0] + 1;
    int64_t we = ws + (p->kernel[1] - 1) * p->dilation[1] + 1;
    /* PyTorch's avg_pool2d: the window clipped to the padded image first */
    int64_t hp = FG_MIN(he, H + p->pad[0]), wp = FG_MIN(we, W + p->pad[1]);
    int64_t pool = (hp - hs) * (wp - ws);
    *h0 = hs < 0 ? 0 : hs;
    *w0 = ws < 0 ? 0 : ws;
    *h1 = FG_MIN(he, H);
    *w1 = FG_MIN(we, W);
    *div = p->count_include_pad ? pool : (*h1 - *h0) * (*w1 - *w0);
}

fg_status fg__cpu_pool2d_fwd(const fg_tensor *x, const fg_pool_params *p, fg_tensor *y,
                             fg_tensor *idx) {
    FG_TRY(check("pool2d_fwd", x, y, p));
    bool mx = p->kind == FG_POOL_MAX;
    if (idx && (idx->dtype != FG_I32 || idx->numel != y->numel || !fg_tensor_is_contiguous(idx)))
        return fg_error(FG_EINVAL, "pool2d_fwd: indices need the output's size, i32");
    int64_t NC = x->shape[0] * x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t OH = y->shape[2], OW = y->shape[3];
    int32_t *pi = mx && idx ? idx->data : NULL;
    FG_FLOAT_DISPATCH("pool2d_fwd", x->dtype, {
        const T *px = x->data;
        T *py = y->data;
        FG_PRAGMA(omp parallel for schedule(static) if (x->numel > FG_PAR_MIN))
        for (int64_t nc = 0; nc < NC; nc++) {
            const T *xp = px + nc * H * W;
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    int64_t h0, h1, w0, w1, div, o = (nc * OH + oh) * OW + ow;
                    window(p, H, W, OH, OW, oh, ow, &h0, &h1, &w0, &w1, &div);
                    if (mx) {
                        T best = -INFINITY;
                        int64_t bi = -1;
                        int64_t hs = oh * p->stride[0] - p->pad[0];
                        int64_t ws = ow * p->stride[1] - p->pad[1];
                        for (int64_t kh = 0; kh < p->kernel[0]; kh++) {
                            int64_t ih = hs + kh * p->dilation[0];
                            if (ih < 0 || ih >= H) continue;
                            for (int64_t kw = 0; kw < p->kernel[1]; kw++) {
                                int64_t iw = ws + kw * p->dilation[1];
                                if (iw < 0 || iw >= W) continue;
                                T v = xp[ih * W + iw];
                                if (bi < 0 || v > best || (isnan(v) && !isnan(best))) {
                                    best = v;
                                    bi = ih * W + iw;
                                }
                            }
                        }
                        py[o] = best;
                        if (pi) pi[o] = (int32_t)bi;
                    } else {
                        double s = 0;
                        for (int64_t ih = h0; ih < h1; ih++)
                            for (int64_t iw = w0; iw < w1; iw++) s += (double)xp[ih * W + iw];
                        py[o] = (T)(s / (double)div);
                    }
                }
        }
    });
    return FG_OK;
}

fg_status fg__cpu_pool2d_bwd(const fg_tensor *dy, const fg_tensor *idx, const fg_pool_params *p,
                             fg_tensor *dx) {
    FG_TRY(check("pool2d_bwd", dx, dy, p));
    bool mx = p->kind == FG_POOL_MAX;
    if (mx && (!idx || idx->dtype != FG_I32 || idx->numel != dy->numel))
        return fg_error(FG_EINVAL, "pool2d_bwd: max pooling needs its i32 indices");
    int64_t NC = dx->shape[0] * dx->shape[1], H = dx->shape[2], W = dx->shape[3];
    int64_t OH = dy->shape[2], OW = dy->shape[3];
    const int32_t *pi = mx ? idx->data : NULL;
    FG_FLOAT_DISPATCH("pool2d_bwd", dx->dtype, {
        const T *pg = dy->data;
        T *pd = dx->data;
        FG_PRAGMA(omp parallel for schedule(static) if (dx->numel > FG_PAR_MIN))
        for (int64_t nc = 0; nc < NC; nc++) {
            T *d = pd + nc * H * W;
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    int64_t o = (nc * OH + oh) * OW + ow;
                    if (mx) {
                        if (pi[o] >= 0 && pi[o] < H * W) d[pi[o]] += pg[o];
                        continue;
                    }
                    int64_t h0, h1, w0, w1, div;
                    window(p, H, W, OH, OW, oh, ow, &h0, &h1, &w0, &w1, &div);
                    T g = (T)((double)pg[o] / (double)div);
                    for (int64_t ih = h0; ih < h1; ih++)
                        for (int64_t iw = w0; iw < w1; iw++) d[ih * W + iw] += g;
                }
        }
    });
    return FG_OK;
}
