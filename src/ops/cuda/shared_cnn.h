/* The per-element math of the CNN and loss kernels (cnn.cu, loss.cu), from
 * one source for the device and the host (shared.h's FG_HD), so that
 * tests/gpu/test_cuda_shared.c runs it on every machine against the CPU
 * table: im2col's entries, col2im's sums, the pooling windows, outputs and
 * plane backward, batch norm's input gradient, the elementwise losses.
 * Plain C99 that is also valid C++. */
#ifndef FULGUR_CUDA_SHARED_CNN_H
#define FULGUR_CUDA_SHARED_CNN_H

#include "launch.h"
#include "shared.h"

/* entry i of im2col's matrix (C KH KW, nb OH OW) of images [n0, n0 + nb)
 * of x (N, C, H, W): row (c, kh, kw), column (n - n0, oh, ow); 0 in the
 * padding */
FG_HD float fg__sh_im2col(const float *x, const fg__cu_conv *g, int64_t n0, int64_t nb, int64_t i) {
    int64_t P = g->OH * g->OW, cols = nb * P;
    int64_t j = i % cols, r = i / cols;
    int64_t kw = r % g->KW, kh = (r / g->KW) % g->KH, c = r / (g->KW * g->KH);
    int64_t n = n0 + j / P, p = j % P, oh = p / g->OW, ow = p % g->OW;
    int64_t h = oh * g->sh - g->ph + kh * g->dh, w = ow * g->sw - g->pw + kw * g->dw;
    return h >= 0 && h < g->H && w >= 0 && w < g->W ? x[((n * g->C + c) * g->H + h) * g->W + w]
                                                    : 0.f;
}

/* element i of the nb images' (C, H, W) block: the sum of the entries of
 * col (C KH KW, nb OH OW) that im2col took from it, in the order (kh, kw) */
FG_HD float fg__sh_col2im(const float *col, const fg__cu_conv *g, int64_t nb, int64_t i) {
    int64_t P = g->OH * g->OW, cols = nb * P, plane = g->H * g->W;
    int64_t w = i % g->W, h = (i / g->W) % g->H, c = (i / plane) % g->C, nl = i / (plane * g->C);
    float s = 0.f;
    for (int64_t kh = 0; kh < g->KH; kh++) {
        int64_t t = h + g->ph - kh * g->dh;
        if (t < 0 || t % g->sh) continue;
        int64_t oh = t / g->sh;
        if (oh >= g->OH) continue;
        for (int64_t kw = 0; kw < g->KW; kw++) {
            int64_t u = w + g->pw - kw * g->dw;
            if (u < 0 || u % g->sw) continue;
            int64_t ow = u / g->sw;
            if (ow >= g->OW) continue;
            s += col[((c * g->KH + kh) * g->KW + kw) * cols + nl * P + oh * g->OW + ow];
        }
    }
    return s;
}

/* the window of output (oh, ow): rows [h0, h1), columns [w0, w1), and the
 * divisor of an average (k_pool.c's window) */
FG_HD void fg__sh_pool_window(const fg__cu_pool *p, int64_t oh, int64_t ow, int64_t *h0,
                              int64_t *h1, int64_t *w0, int64_t *w1, int64_t *div) {
    if (p->kind == FG_CU_POOL_ADAPTIVE_AVG) {
        *h0 = oh * p->H / p->OH;
        *h1 = ((oh + 1) * p->H + p->OH - 1) / p->OH;
        *w0 = ow * p->W / p->OW;
        *w1 = ((ow + 1) * p->W + p->OW - 1) / p->OW;
        *div = (*h1 - *h0) * (*w1 - *w0);
        return;
    }
    int64_t hs = oh * p->sh - p->ph, ws = ow * p->sw - p->pw;
    int64_t he = hs + (p->kh - 1) * p->dh + 1, we = ws + (p->kw - 1) * p->dw + 1;
    int64_t hp = he < p->H + p->ph ? he : p->H + p->ph, wp = we < p->W + p->pw ? we : p->W + p->pw;
    int64_t pool = (hp - hs) * (wp - ws);
    *h0 = hs < 0 ? 0 : hs;
    *w0 = ws < 0 ? 0 : ws;
    *h1 = he < p->H ? he : p->H;
    *w1 = we < p->W ? we : p->W;
    *div = p->count_include_pad ? pool : (*h1 - *h0) * (*w1 - *w0);
}

/* output o of the pooling of x: max (NaN the largest, the first of ties;
 * *idx its index in the plane) or average */
FG_HD float fg__sh_pool_out(const float *x, const fg__cu_pool *p, int64_t o, int32_t *idx) {
    int64_t ow = o % p->OW, oh = o / p->OW % p->OH, nc = o / (p->OW * p->OH);
    const float *xp = x + nc * p->H * p->W;
    if (p->kind == FG_CU_POOL_MAX) {
        float best = -INFINITY;
        int64_t bi = -1, hs = oh * p->sh - p->ph, ws = ow * p->sw - p->pw;
        for (int64_t kh = 0; kh < p->kh; kh++) {
            int64_t ih = hs + kh * p->dh;
            if (ih < 0 || ih >= p->H) continue;
            for (int64_t kw = 0; kw < p->kw; kw++) {
                int64_t iw = ws + kw * p->dw;
                if (iw < 0 || iw >= p->W) continue;
                float v = xp[ih * p->W + iw];
                if (bi < 0 || v > best || (isnan(v) && !isnan(best))) {
                    best = v;
                    bi = ih * p->W + iw;
                }
            }
        }
        *idx = (int32_t)bi;
        return best;
    }
    int64_t h0, h1, w0, w1, div;
    fg__sh_pool_window(p, oh, ow, &h0, &h1, &w0, &w1, &div);
    double s = 0;
    for (int64_t ih = h0; ih < h1; ih++)
        for (int64_t iw = w0; iw < w1; iw++) s += (double)xp[ih * p->W + iw];
    *idx = -1;
    return (float)(s / (double)div);
}

/* dx of plane nc += the gradient from dy, its outputs in order (max
 * through idx), as the CPU's loop */
FG_HD void fg__sh_pool_plane_bwd(const float *dy, const int32_t *idx, float *dx,
                                 const fg__cu_pool *p, int64_t nc) {
    float *d = dx + nc * p->H * p->W;
    for (int64_t oh = 0; oh < p->OH; oh++)
        for (int64_t ow = 0; ow < p->OW; ow++) {
            int64_t o = (nc * p->OH + oh) * p->OW + ow;
            if (p->kind == FG_CU_POOL_MAX) {
                if (idx[o] >= 0 && idx[o] < p->H * p->W) d[idx[o]] += dy[o];
                continue;
            }
            int64_t h0, h1, w0, w1, div;
            fg__sh_pool_window(p, oh, ow, &h0, &h1, &w0, &w1, &div);
            float g = (float)((double)dy[o] / (double)div);
            for (int64_t ih = h0; ih < h1; ih++)
                for (int64_t iw = w0; iw < w1; iw++) d[ih * p->W + iw] += g;
        }
}

/* batch norm's input gradient of one element from its channel's mean,
 * invstd, weight (1 without), sg = sum dy, sgx = sum dy (x - mean) over
 * the cnt elements of the channel (k_norm.c's formula) */
FG_HD float fg__sh_bn_dx(double x, double dy, double mean, double invstd, double w, double sg,
                         double sgx, double cnt) {
    double k0 = invstd * w, k1 = sg / cnt, k4 = sgx * invstd / cnt;
    return (float)(k0 * (dy - k1 - (x - mean) * invstd * k4));
}

/* fg_loss_op's numbers (ops.h; loss.c asserts they agree) */
enum {
    FG__SH_MSE,
    FG__SH_L1,
    FG__SH_SMOOTH_L1,
    FG__SH_HUBER,
    FG__SH_BCE,
    FG__SH_BCE_LOGITS,
    FG__SH_KL_DIV
};

FG_HD double fg__sh_softplus(double v) { return v > 0 ? v + log1p(exp(-v)) : log1p(exp(v)); }

/* the elementwise loss op of x v against target t (parameter p; w the
 * pos_weight of BCE_LOGITS, 1 without), k_loss.c's formulas in f64 */
FG_HD double fg__sh_ploss(int op, double v, double t, double w, double p) {
    double d = v - t, ad = fabs(d);
    switch (op) {
    case FG__SH_MSE: return d * d;
    case FG__SH_L1: return ad;
    case FG__SH_SMOOTH_L1: return ad < p ? 0.5 * d * d / p : ad - 0.5 * p;
    case FG__SH_HUBER: return ad <= p ? 0.5 * d * d : p * (ad - 0.5 * p);
    case FG__SH_BCE: return (t - 1) * fmax(log1p(-v), -100.0) - t * fmax(log(v), -100.0);
    case FG__SH_BCE_LOGITS: {
        double m = v < 0 ? -v : 0.0, sp = log(exp(-m) + exp(-v - m)) + m;
        return (1 - t) * v + (1 + (w - 1) * t) * sp;
    }
    case FG__SH_KL_DIV: return p != 0 ? exp(t) * (t - v) : (t == 0 ? 0.0 : t * log(t)) - t * v;
    }
    return 0;
}

/* its gradients times g: *gx in x, *gt in the target */
FG_HD void fg__sh_ploss_grad(int op, double v, double t, double w, double p, double g, double *gx,
                             double *gt) {
    double d = v - t, sg = d > 0 ? 1.0 : d < 0 ? -1.0 : 0.0;
    *gx = 0;
    *gt = 0;
    switch (op) {
    case FG__SH_MSE: *gx = 2 * d * g, *gt = -*gx; break;
    case FG__SH_L1: *gx = sg * g, *gt = -*gx; break;
    case FG__SH_SMOOTH_L1: *gx = (fabs(d) < p ? d / p : sg) * g, *gt = -*gx; break;
    case FG__SH_HUBER: *gx = (d < -p ? -p : d > p ? p : d) * g, *gt = -*gx; break;
    case FG__SH_BCE:
        *gx = g * (v - t) / fmax((1 - v) * v, 1e-12);
        *gt = g * (fmax(log1p(-v), -100.0) - fmax(log(v), -100.0));
        break;
    case FG__SH_BCE_LOGITS: {
        double s = 1 / (1 + exp(-v));
        *gx = g * ((w * t + 1 - t) * s - w * t);
        *gt = g * (w * fg__sh_softplus(-v) - fg__sh_softplus(v));
        break;
    }
    case FG__SH_KL_DIV:
        if (p != 0) {
            double e = exp(t);
            *gx = -e * g, *gt = g * e * (t - v + 1);
        } else {
            *gx = -t * g, *gt = g * (t > 0 ? log(t) + 1 - v : -v);
        }
        break;
    }
}

#endif
