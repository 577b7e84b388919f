// The CNN layers' kernels, NCHW, f32 (cnn.c widens bf16 and f16 through
// f32 copies): im2col and col2im around the convolution's cuBLASLt
// products, pooling, and batch normalisation in training mode. Each output
// element is written by one thread that sums in a fixed order, and the
// per-channel sums are one block a channel in f64 (fg_block_sum's tree): no
// atomics, so two runs give the same bits. The per-element math is
// shared_cnn.h's, which the host tests run against the CPU table.
#include "cu_common.cuh"
#include "shared_cnn.h"

// ---- convolution

__global__ void k_im2col(const float *x, float *col, fg__cu_conv g, int64_t n0, int64_t nb) {
    FG_CU_LOOP(i, g.C * g.KH * g.KW * nb * g.OH * g.OW) col[i] = fg__sh_im2col(x, &g, n0, nb, i);
}

__global__ void k_col2im(const float *col, float *dx, fg__cu_conv g, int64_t n0, int64_t nb,
                         int overwrite) {
    FG_CU_LOOP(i, nb * g.C * g.H * g.W) {
        float s = fg__sh_col2im(col, &g, nb, i);
        int64_t o = n0 * g.C * g.H * g.W + i;
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
        float v = fg__sh_bn_dx(x[i], dy[i], mean[c], invstd[c], w ? (double)w[c] : 1.0, sg[c],
                               sgx[c], cnt);
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

// one thread an output
__global__ void k_pool_fwd(const float *x, float *y, int32_t *idx, fg__cu_pool p) {
    FG_CU_LOOP(o, p.NC * p.OH * p.OW) {
        int32_t bi;
        y[o] = fg__sh_pool_out(x, &p, o, &bi);
        if (idx) idx[o] = bi;
    }
}

// one thread a plane, its outputs in order, as the CPU's loop: windows
// that overlap add into dx in the CPU's order, with no two threads on one
// plane
__global__ void k_pool_bwd(const float *dy, const int32_t *idx, float *dx, fg__cu_pool p) {
    FG_CU_LOOP(nc, p.NC) fg__sh_pool_plane_bwd(dy, idx, dx, &p, nc);
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
