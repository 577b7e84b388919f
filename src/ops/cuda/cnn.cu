// The CNN layers' kernels, NCHW, f32 (cnn.c widens bf16 and f16 through
// f32 copies): im2col and col2im around the convolution's cuBLASLt
// products, pooling, and batch normalisation in training mode. Each output
// element is written by one thread that sums in a fixed order, and the
// per-channel sums are one block a channel in f64 (fg_block_sum's tree): no
// atomics, so two runs give the same bits.
#include "cu_common.cuh"

// ---- convolution

// col (C KH KW, nb OH OW): row (c, kh, kw), column (n - n0, oh, ow)
__global__ void k_im2col(const float *x, float *col, fg__cu_conv g, int64_t n0, int64_t nb) {
    int64_t P = g.OH * g.OW, cols = nb * P;
    FG_CU_LOOP(i, g.C * g.KH * g.KW * cols) {
        int64_t j = i % cols, r = i / cols;
        int64_t kw = r % g.KW, kh = (r / g.KW) % g.KH, c = r / (g.KW * g.KH);
        int64_t n = n0 + j / P, p = j % P, oh = p / g.OW, ow = p % g.OW;
        int64_t h = oh * g.sh - g.ph + kh * g.dh, w = ow * g.sw - g.pw + kw * g.dw;
        col[i] =
            h >= 0 && h < g.H && w >= 0 && w < g.W ? x[((n * g.C + c) * g.H + h) * g.W + w] : 0.f;
    }
}

// dx[n, c, h, w] (+)= the entries of col that im2col took from it, in the
// order (kh, kw)
__global__ void k_col2im(const float *col, float *dx, fg__cu_conv g, int64_t n0, int64_t nb,
                         int overwrite) {
    int64_t P = g.OH * g.OW, cols = nb * P, plane = g.H * g.W;
    FG_CU_LOOP(i, nb * g.C * plane) {
        int64_t w = i % g.W, h = (i / g.W) % g.H, c = (i / plane) % g.C, nl = i / (plane * g.C);
        float s = 0.f;
        for (int64_t kh = 0; kh < g.KH; kh++) {
            int64_t t = h + g.ph - kh * g.dh;
            if (t < 0 || t % g.sh) continue;
            int64_t oh = t / g.sh;
            if (oh >= g.OH) continue;
            for (int64_t kw = 0; kw < g.KW; kw++) {
                int64_t u = w + g.pw - kw * g.dw;
                if (u < 0 || u % g.sw) continue;
                int64_t ow = u / g.sw;
                if (ow >= g.OW) continue;
                s += col[((c * g.KH + kh) * g.KW + kw) * cols + nl * P + oh * g.OW + ow];
            }
        }
        int64_t o = n0 * g.C * plane + i;
        dx[o] = overwrite ? s : dx[o] + s;
    }
}

__global__ void k_conv_out(const float *yt, const float *bias, float *y, int64_t n0, int64_t nb,
                           int64_t O, int64_t P) {
    FG_CU_LOOP(i, nb * O * P) {
        int64_t p = i % P, o = (i / P) % O, nl = i / (P * O);
        y[n0 * O * P + i] = yt[o * nb * P + nl * P + p] + (bias ? bias[o] : 0.f);
    }
}

__global__ void k_conv_dyt(const float *dy, float *dyt, int64_t n0, int64_t nb, int64_t O,
                           int64_t P) {
    FG_CU_LOOP(i, nb * O * P) {
        int64_t p = i % P, o = (i / P) % O, nl = i / (P * O);
        dyt[o * nb * P + nl * P + p] = dy[n0 * O * P + i];
    }
}

extern "C" int fg__cu_im2col(void *st, const float *x, float *col, const fg__cu_conv *g, int64_t n0,
                             int64_t nb) {
    int64_t n = g->C * g->KH * g->KW * nb * g->OH * g->OW;
    if (n) k_im2col<<<fg_grid(n), FG_CU_THREADS, 0, (cudaStream_t)st>>>(x, col, *g, n0, nb);
    return fg_cu_err();
}
extern "C" int fg__cu_col2im(void *st, const float *col, float *dx, const fg__cu_conv *g,
                             int64_t n0, int64_t nb, int overwrite) {
    int64_t n = nb * g->C * g->H * g->W;
    if (n)
        k_col2im<<<fg_grid(n), FG_CU_THREADS, 0, (cudaStream_t)st>>>(col, dx, *g, n0, nb,
                                                                     overwrite);
    return fg_cu_err();
}
extern "C" int fg__cu_conv_out(void *st, const float *yt, const float *bias, float *y, int64_t n0,
                               int64_t nb, int64_t O, int64_t P) {
    int64_t n = nb * O * P;
    if (n)
        k_conv_out<<<fg_grid(n), FG_CU_THREADS, 0, (cudaStream_t)st>>>(yt, bias, y, n0, nb, O, P);
    return fg_cu_err();
}
extern "C" int fg__cu_conv_dyt(void *st, const float *dy, float *dyt, int64_t n0, int64_t nb,
                               int64_t O, int64_t P) {
    int64_t n = nb * O * P;
    if (n) k_conv_dyt<<<fg_grid(n), FG_CU_THREADS, 0, (cudaStream_t)st>>>(dy, dyt, n0, nb, O, P);
    return fg_cu_err();
}

// ---- per-channel sums (the bias gradient, batch norm)

// one block per channel c of x (N, C, S), f64, the block's tree order
__global__ void k_chan_sums(int mode, const float *x, const float *dy, const double *mean,
                            double *s1, double *s2, int64_t N, int64_t C, int64_t S) {
    __shared__ double sh[FG_CU_THREADS];
    int64_t c = blockIdx.x, n = N * S;
    double a = 0, b = 0, m = mode ? mean[c] : 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        int64_t e = (j / S * C + c) * S + j % S;
        if (mode == 0) a += (double)x[e];
        else if (mode == 1) {
            double d = (double)x[e] - m;
            a += d * d;
        } else {
            double g = (double)dy[e];
            a += g;
            b += g * ((double)x[e] - m);
        }
    }
    a = fg_block_sum(a, sh);
    if (mode == 2) b = fg_block_sum(b, sh);
    if (threadIdx.x == 0) {
        s1[c] = a;
        if (mode == 2) s2[c] = b;
    }
}

__global__ void k_add_d(float *y, const double *s, int64_t n) {
    FG_CU_LOOP(i, n) y[i] += (float)s[i];
}

__global__ void k_bn_fwd(const float *x, const double *mean, const double *invstd, const float *w,
                         const float *b, float *y, int64_t C, int64_t S, int64_t n) {
    FG_CU_LOOP(i, n) {
        int64_t c = i / S % C;
        double sc = invstd[c] * (w ? (double)w[c] : 1.0);
        float a = (float)sc, o = (float)((b ? (double)b[c] : 0.0) - mean[c] * sc);
        y[i] = fmaf(x[i], a, o);
    }
}

__global__ void k_bn_bwd(const float *x, const float *dy, const double *mean, const double *invstd,
                         const float *w, const double *sg, const double *sgx, float *dx, int64_t C,
                         int64_t S, int64_t n, double cnt, int overwrite) {
    FG_CU_LOOP(i, n) {
        int64_t c = i / S % C;
        double is = invstd[c], k0 = is * (w ? (double)w[c] : 1.0), k1 = sg[c] / cnt;
        double k4 = sgx[c] * is / cnt;
        float v = (float)(k0 * ((double)dy[i] - k1 - ((double)x[i] - mean[c]) * is * k4));
        dx[i] = overwrite ? v : dx[i] + v;
    }
}

__global__ void k_bn_wb(float *dw, float *db, const double *sg, const double *sgx,
                        const double *invstd, int64_t C) {
    FG_CU_LOOP(c, C) {
        if (dw) dw[c] += (float)(sgx[c] * invstd[c]);
        if (db) db[c] += (float)sg[c];
    }
}

extern "C" int fg__cu_chan_sums(void *st, int mode, const float *x, const float *dy,
                                const double *mean, double *s1, double *s2, int64_t N, int64_t C,
                                int64_t S) {
    if (C)
        k_chan_sums<<<(unsigned)C, FG_CU_THREADS, 0, (cudaStream_t)st>>>(mode, x, dy, mean, s1, s2,
                                                                         N, C, S);
    return fg_cu_err();
}
extern "C" int fg__cu_add_d(void *st, float *y, const double *s, int64_t n) {
    if (n) k_add_d<<<fg_grid(n), FG_CU_THREADS, 0, (cudaStream_t)st>>>(y, s, n);
    return fg_cu_err();
}
extern "C" int fg__cu_bn_fwd(void *st, const float *x, const double *mean, const double *invstd,
                             const float *w, const float *b, float *y, int64_t N, int64_t C,
                             int64_t S) {
    int64_t n = N * C * S;
    if (n)
        k_bn_fwd<<<fg_grid(n), FG_CU_THREADS, 0, (cudaStream_t)st>>>(x, mean, invstd, w, b, y, C, S,
                                                                     n);
    return fg_cu_err();
}
extern "C" int fg__cu_bn_bwd(void *st, const float *x, const float *dy, const double *mean,
                             const double *invstd, const float *w, const double *sg,
                             const double *sgx, float *dx, float *dw, float *db, int64_t N,
                             int64_t C, int64_t S, int overwrite) {
    int64_t n = N * C * S;
    if (dx && n)
        k_bn_bwd<<<fg_grid(n), FG_CU_THREADS, 0, (cudaStream_t)st>>>(
            x, dy, mean, invstd, w, sg, sgx, dx, C, S, n, (double)(N * S), overwrite);
    if ((dw || db) && C)
        k_bn_wb<<<fg_grid(C), FG_CU_THREADS, 0, (cudaStream_t)st>>>(dw, db, sg, sgx, invstd, C);
    return fg_cu_err();
}

// ---- pooling (the CPU's rules, k_pool.c)

// the window of output (oh, ow): rows [h0, h1), columns [w0, w1), and the
// divisor of an average
__device__ void pool_window(const fg__cu_pool &p, int64_t oh, int64_t ow, int64_t *h0, int64_t *h1,
                            int64_t *w0, int64_t *w1, int64_t *div) {
    if (p.kind == FG_CU_POOL_ADAPTIVE_AVG) {
        *h0 = oh * p.H / p.OH;
        *h1 = ((oh + 1) * p.H + p.OH - 1) / p.OH;
        *w0 = ow * p.W / p.OW;
        *w1 = ((ow + 1) * p.W + p.OW - 1) / p.OW;
        *div = (*h1 - *h0) * (*w1 - *w0);
        return;
    }
    int64_t hs = oh * p.sh - p.ph, ws = ow * p.sw - p.pw;
    int64_t he = hs + (p.kh - 1) * p.dh + 1, we = ws + (p.kw - 1) * p.dw + 1;
    int64_t hp = min(he, p.H + p.ph), wp = min(we, p.W + p.pw);
    int64_t pool = (hp - hs) * (wp - ws);
    *h0 = hs < 0 ? 0 : hs;
    *w0 = ws < 0 ? 0 : ws;
    *h1 = min(he, p.H);
    *w1 = min(we, p.W);
    *div = p.count_include_pad ? pool : (*h1 - *h0) * (*w1 - *w0);
}

// one thread an output: max (NaN the largest, the first of ties) or average
__global__ void k_pool_fwd(const float *x, float *y, int32_t *idx, fg__cu_pool p) {
    FG_CU_LOOP(o, p.NC * p.OH * p.OW) {
        int64_t ow = o % p.OW, oh = o / p.OW % p.OH, nc = o / (p.OW * p.OH);
        const float *xp = x + nc * p.H * p.W;
        if (p.kind == FG_CU_POOL_MAX) {
            float best = -INFINITY;
            int64_t bi = -1, hs = oh * p.sh - p.ph, ws = ow * p.sw - p.pw;
            for (int64_t kh = 0; kh < p.kh; kh++) {
                int64_t ih = hs + kh * p.dh;
                if (ih < 0 || ih >= p.H) continue;
                for (int64_t kw = 0; kw < p.kw; kw++) {
                    int64_t iw = ws + kw * p.dw;
                    if (iw < 0 || iw >= p.W) continue;
                    float v = xp[ih * p.W + iw];
                    if (bi < 0 || v > best || (isnan(v) && !isnan(best))) {
                        best = v;
                        bi = ih * p.W + iw;
                    }
                }
            }
            y[o] = best;
            if (idx) idx[o] = (int32_t)bi;
        } else {
            int64_t h0, h1, w0, w1, div;
            pool_window(p, oh, ow, &h0, &h1, &w0, &w1, &div);
            double s = 0;
            for (int64_t ih = h0; ih < h1; ih++)
                for (int64_t iw = w0; iw < w1; iw++) s += (double)xp[ih * p.W + iw];
            y[o] = (float)(s / (double)div);
        }
    }
}

// one thread a plane, its outputs in order, as the CPU's loop: windows
// that overlap add into dx in the CPU's order, with no two threads on one
// plane
__global__ void k_pool_bwd(const float *dy, const int32_t *idx, float *dx, fg__cu_pool p) {
    FG_CU_LOOP(nc, p.NC) {
        float *d = dx + nc * p.H * p.W;
        for (int64_t oh = 0; oh < p.OH; oh++)
            for (int64_t ow = 0; ow < p.OW; ow++) {
                int64_t o = (nc * p.OH + oh) * p.OW + ow;
                if (p.kind == FG_CU_POOL_MAX) {
                    if (idx[o] >= 0 && idx[o] < p.H * p.W) d[idx[o]] += dy[o];
                    continue;
                }
                int64_t h0, h1, w0, w1, div;
                pool_window(p, oh, ow, &h0, &h1, &w0, &w1, &div);
                float g = (float)((double)dy[o] / (double)div);
                for (int64_t ih = h0; ih < h1; ih++)
                    for (int64_t iw = w0; iw < w1; iw++) d[ih * p.W + iw] += g;
            }
    }
}

extern "C" int fg__cu_pool_fwd(void *st, const float *x, float *y, int32_t *idx,
                               const fg__cu_pool *p) {
    int64_t n = p->NC * p->OH * p->OW;
    if (n) k_pool_fwd<<<fg_grid(n), FG_CU_THREADS, 0, (cudaStream_t)st>>>(x, y, idx, *p);
    return fg_cu_err();
}
extern "C" int fg__cu_pool_bwd(void *st, const float *dy, const int32_t *idx, float *dx,
                               const fg__cu_pool *p) {
    if (p->NC) k_pool_bwd<<<fg_grid(p->NC), FG_CU_THREADS, 0, (cudaStream_t)st>>>(dy, idx, dx, *p);
    return fg_cu_err();
}
