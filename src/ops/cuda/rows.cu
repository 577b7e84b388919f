// Row kernels of the CUDA op table: softmax and log-softmax, the fused
// cross-entropy (statistics of shared.h), layer norm, embedding (a
// deterministic backward), and the pieces of attention around the batched
// products (the split of qkv into heads, the fused softmax with its masks).
// One block of FG_CU_THREADS threads per row; sums in a fixed tree order.
#include <math.h>

#include "cu_common.cuh"
#include "shared.h"

__global__ void k_softmax_fwd(int lg, int dt, const void *x, void *y, int64_t C) {
    __shared__ float sh[FG_CU_THREADS];
    int64_t r = blockIdx.x, o = r * C;
    float m = -INFINITY;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) m = fmaxf(m, fg_ld(x, dt, o + c));
    m = fg_block_max(m, sh);
    float s = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += expf(fg_ld(x, dt, o + c) - m);
    s = fg_block_sum(s, sh);
    float ls = logf(s);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        float v = fg_ld(x, dt, o + c) - m;
        fg_st(y, dt, o + c, lg ? v - ls : expf(v) / s);
    }
}
__global__ void k_softmax_bwd(int lg, int dt, const void *y, const void *dy, void *dx, int64_t C) {
    __shared__ float sh[FG_CU_THREADS];
    int64_t r = blockIdx.x, o = r * C;
    float s = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
        s += lg ? fg_ld(dy, dt, o + c) : fg_ld(dy, dt, o + c) * fg_ld(y, dt, o + c);
    s = fg_block_sum(s, sh);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        float yv = fg_ld(y, dt, o + c), g = fg_ld(dy, dt, o + c);
        float d = lg ? g - expf(yv) * s : yv * (g - s);
        fg_st(dx, dt, o + c, fg_ld(dx, dt, o + c) + d);
    }
}
extern "C" int fg__cu_softmax_fwd(void *st, int lg, int dt, const void *x, void *y, int64_t R,
                                 int64_t C) {
    if (R) k_softmax_fwd<<<(unsigned)R, FG_CU_THREADS, 0, (cudaStream_t)st>>>(lg, dt, x, y, C);
    return fg_cu_err();
}
extern "C" int fg__cu_softmax_bwd(void *st, int lg, int dt, const void *y, const void *dy, void *dx,
                                 int64_t R, int64_t C) {
    if (R) k_softmax_bwd<<<(unsigned)R, FG_CU_THREADS, 0, (cudaStream_t)st>>>(lg, dt, y, dy, dx, C);
    return fg_cu_err();
}

// ---- cross-entropy: one pass over the logits for the statistics and loss
__global__ void k_ce_rows(int dt, const void *logits, const int32_t *tgt, int64_t V, int64_t ignore,
                          double *stats, double *rowloss, int64_t N, int64_t *bad) {
    __shared__ double shm[FG_CU_THREADS], shs[FG_CU_THREADS];
    int64_t r = blockIdx.x, o = r * V;
    fg__sh_lse a = fg__sh_lse_init();
    for (int64_t c = threadIdx.x; c < V; c += blockDim.x)
        a = fg__sh_lse_push(a, fg_ld(logits, dt, o + c));
    shm[threadIdx.x] = a.m;
    shs[threadIdx.x] = a.s;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) {
            fg__sh_lse p = {shm[threadIdx.x], shs[threadIdx.x]};
            fg__sh_lse q = {shm[threadIdx.x + s], shs[threadIdx.x + s]};
            p = fg__sh_lse_merge(p, q);
            shm[threadIdx.x] = p.m;
            shs[threadIdx.x] = p.s;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        fg__sh_lse t = {shm[0], shs[0]};
        stats[r] = t.m;
        stats[N + r] = t.s;
        int64_t k = tgt[r];
        double l = 0;
        if (k != ignore) {
            if (k < 0 || k >= V)
                atomicCAS((unsigned long long *)bad, (unsigned long long)-1, (unsigned long long)r);
            else l = fg__sh_ce_loss(t, fg_ld(logits, dt, o + k));
        }
        rowloss[r] = l;
    }
}
// one block: the losses in a fixed order, the count, the mean
__global__ void k_ce_total(const double *rowloss, const int32_t *tgt, int64_t N, int64_t ignore,
                           int dtl, void *loss, int64_t *count) {
    __shared__ double sh[FG_CU_THREADS];
    double acc = 0, cnt = 0;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
        acc += rowloss[i];
        cnt += tgt[i] != ignore;
    }
    acc = fg_block_sum(acc, sh);
    cnt = fg_block_sum(cnt, sh);
    if (threadIdx.x == 0) {
        *count = (int64_t)cnt;
        fg_st(loss, dtl, 0, cnt > 0 ? (float)(acc / cnt) : 0.f);
    }
}
extern "C" int fg__cu_ce_fwd(void *st, int dt, const void *logits, const int32_t *tgt, int64_t N,
                            int64_t V, int64_t ignore, double *stats, double *rowloss,
                            double *scratch, int dtl, void *loss, int64_t *count, int64_t *bad) {
    (void)scratch;
    cudaStream_t s = (cudaStream_t)st;
    cudaMemsetAsync(bad, 0xff, sizeof *bad, s);
    if (N)
        k_ce_rows<<<(unsigned)N, FG_CU_THREADS, 0, s>>>(dt, logits, tgt, V, ignore, stats, rowloss,
                                                        N, bad);
    k_ce_total<<<1, FG_CU_THREADS, 0, s>>>(rowloss, tgt, N, ignore, dtl, loss, count);
    return fg_cu_err();
}
__global__ void k_ce_bwd(int dt, const void *logits, const int32_t *tgt, const double *stats,
                         int64_t N, int64_t V, int64_t ignore, double scale, void *dl) {
    int64_t r = blockIdx.x, o = r * V;
    if (tgt[r] == ignore) return;
    fg__sh_lse t = {stats[r], stats[N + r]};
    for (int64_t c = threadIdx.x; c < V; c += blockDim.x) {
        double g = fg__sh_ce_grad(t, fg_ld(logits, dt, o + c), c == tgt[r], scale);
        fg_st(dl, dt, o + c, fg_ld(dl, dt, o + c) + (float)g);
    }
}
extern "C" int fg__cu_ce_bwd(void *st, int dt, const void *logits, const int32_t *tgt,
                            const double *stats, int64_t N, int64_t V, int64_t ignore, double scale,
                            void *dlogits) {
    if (N)
        k_ce_bwd<<<(unsigned)N, FG_CU_THREADS, 0, (cudaStream_t)st>>>(dt, logits, tgt, stats, N, V,
                                                                      ignore, scale, dlogits);
    return fg_cu_err();
}

// ---- layer norm (biased variance, two passes over the row)
__global__ void k_ln_fwd(int dt, const void *x, const void *w, const void *b, float eps, void *y,
                         float *mean, float *rstd, int64_t C) {
    __shared__ float sh[FG_CU_THREADS];
    int64_t r = blockIdx.x, o = r * C;
    float s = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += fg_ld(x, dt, o + c);
    float mu = fg_block_sum(s, sh) / (float)C;
    float q = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        float d = fg_ld(x, dt, o + c) - mu;
        q += d * d;
    }
    float rs = rsqrtf(fg_block_sum(q, sh) / (float)C + eps);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        float v = (fg_ld(x, dt, o + c) - mu) * rs;
        if (w) v *= fg_ld(w, dt, c);
        if (b) v += fg_ld(b, dt, c);
        fg_st(y, dt, o + c, v);
    }
    if (threadIdx.x == 0) {
        mean[r] = mu;
        rstd[r] = rs;
    }
}
__global__ void k_ln_bwd_dx(int dt, const void *x, const void *w, const float *mean,
                            const float *rstd, const void *dy, void *dx, int64_t C) {
    __shared__ float sh[FG_CU_THREADS];
    int64_t r = blockIdx.x, o = r * C;
    float mu = mean[r], rs = rstd[r], sg = 0, sgx = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        float xh = (fg_ld(x, dt, o + c) - mu) * rs;
        float g = fg_ld(dy, dt, o + c) * (w ? fg_ld(w, dt, c) : 1.f);
        sg += g;
        sgx += g * xh;
    }
    float mg = fg_block_sum(sg, sh) / (float)C, mgx = fg_block_sum(sgx, sh) / (float)C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        float xh = (fg_ld(x, dt, o + c) - mu) * rs;
        float g = fg_ld(dy, dt, o + c) * (w ? fg_ld(w, dt, c) : 1.f);
        fg_st(dx, dt, o + c, fg_ld(dx, dt, o + c) + rs * (g - mg - xh * mgx));
    }
}
// dw, db: one thread per column, the rows in order
__global__ void k_ln_bwd_dw(int dt, const void *x, const float *mean, const float *rstd,
                            const void *dy, void *dw, void *db, int64_t N, int64_t C) {
    FG_CU_LOOP(c, C) {
        double aw = 0, ab = 0;
        for (int64_t r = 0; r < N; r++) {
            float g = fg_ld(dy, dt, r * C + c);
            aw += g * ((fg_ld(x, dt, r * C + c) - mean[r]) * rstd[r]);
            ab += g;
        }
        if (dw) fg_st(dw, dt, c, fg_ld(dw, dt, c) + (float)aw);
        if (db) fg_st(db, dt, c, fg_ld(db, dt, c) + (float)ab);
    }
}
extern "C" int fg__cu_layernorm_fwd(void *st, int dt, const void *x, const void *w, const void *b,
                                   float eps, void *y, float *mean, float *rstd, int64_t N,
                                   int64_t C) {
    if (N)
        k_ln_fwd<<<(unsigned)N, FG_CU_THREADS, 0, (cudaStream_t)st>>>(dt, x, w, b, eps, y, mean,
                                                                      rstd, C);
    return fg_cu_err();
}
extern "C" int fg__cu_layernorm_bwd(void *st, int dt, const void *x, const void *w,
                                   const float *mean, const float *rstd, const void *dy, void *dx,
                                   void *dw, void *db, int64_t N, int64_t C) {
    cudaStream_t s = (cudaStream_t)st;
    if (N && dx) k_ln_bwd_dx<<<(unsigned)N, FG_CU_THREADS, 0, s>>>(dt, x, w, mean, rstd, dy, dx, C);
    if (C && (dw || db))
        k_ln_bwd_dw<<<fg_grid(C), FG_CU_THREADS, 0, s>>>(dt, x, mean, rstd, dy, dw, db, N, C);
    return fg_cu_err();
}

// ---- embedding
__global__ void k_emb_fwd(int dt, const int32_t *idx, const void *w, void *y, int64_t N, int64_t C,
                          int64_t V, int64_t *bad) {
    FG_CU_LOOP(i, N * C) {
        int64_t r = i / C, c = i % C, k = idx[r];
        if (k < 0 || k >= V) {
            if (c == 0)
                atomicCAS((unsigned long long *)bad, (unsigned long long)-1, (unsigned long long)r);
            fg_st(y, dt, i, 0.f);
        } else {
            fg_st(y, dt, i, fg_ld(w, dt, k * C + c));
        }
    }
}
extern "C" int fg__cu_embedding_fwd(void *st, int dt, const int32_t *idx, const void *w, void *y,
                                   int64_t N, int64_t C, int64_t V, int64_t *bad) {
    cudaStream_t s = (cudaStream_t)st;
    cudaMemsetAsync(bad, 0xff, sizeof *bad, s);
    if (N * C != 0) k_emb_fwd<<<fg_grid(N * C), FG_CU_THREADS, 0, s>>>(dt, idx, w, y, N, C, V, bad);
    return fg_cu_err();
}
// thread (slice of the vocabulary, column): the rows in order, adding
// those whose index falls in its slice; no atomics, the same bits each run
#define EMB_SLICES 64
__global__ void k_emb_bwd(int dt, const int32_t *idx, const void *dy, void *dw, int64_t N,
                          int64_t C, int64_t V) {
    FG_CU_LOOP(t, (int64_t)EMB_SLICES * C) {
        int64_t sl = t / C, c = t % C;
        int64_t lo = V * sl / EMB_SLICES, hi = V * (sl + 1) / EMB_SLICES;
        for (int64_t r = 0; r < N; r++) {
            int64_t k = idx[r];
            if (k < lo || k >= hi) continue;
            fg_st(dw, dt, k * C + c, fg_ld(dw, dt, k * C + c) + fg_ld(dy, dt, r * C + c));
        }
    }
}
extern "C" int fg__cu_embedding_bwd(void *st, int dt, const int32_t *idx, const void *dy, void *dw,
                                   int64_t N, int64_t C, int64_t V) {
    if (C)
        k_emb_bwd<<<fg_grid(EMB_SLICES * C), FG_CU_THREADS, 0, (cudaStream_t)st>>>(dt, idx, dy, dw,
                                                                                   N, C, V);
    return fg_cu_err();
}

// ---- attention: layouts around the batched products
// qkv (B, T, 3C), C = H D; q, k, v (B H, T, D)
__global__ void k_qkv_split(int dt, const void *qkv, void *q, void *k, void *v, int64_t B,
                            int64_t T, int64_t H, int64_t D) {
    int64_t C = H * D;
    FG_CU_LOOP(i, B * T * C) {
        int64_t d = i % D, h = (i / D) % H, t = (i / C) % T, b = i / (C * T);
        int64_t src = (b * T + t) * 3 * C + h * D + d, dst = ((b * H + h) * T + t) * D + d;
        fg_st(q, dt, dst, fg_ld(qkv, dt, src));
        fg_st(k, dt, dst, fg_ld(qkv, dt, src + C));
        fg_st(v, dt, dst, fg_ld(qkv, dt, src + 2 * C));
    }
}
__global__ void k_qkv_merge_add(int dt, const void *dq, const void *dk, const void *dv, void *dqkv,
                                int64_t B, int64_t T, int64_t H, int64_t D) {
    int64_t C = H * D;
    FG_CU_LOOP(i, B * T * C) {
        int64_t d = i % D, h = (i / D) % H, t = (i / C) % T, b = i / (C * T);
        int64_t dst = (b * T + t) * 3 * C + h * D + d, src = ((b * H + h) * T + t) * D + d;
        fg_st(dqkv, dt, dst, fg_ld(dqkv, dt, dst) + fg_ld(dq, dt, src));
        fg_st(dqkv, dt, dst + C, fg_ld(dqkv, dt, dst + C) + fg_ld(dk, dt, src));
        fg_st(dqkv, dt, dst + 2 * C, fg_ld(dqkv, dt, dst + 2 * C) + fg_ld(dv, dt, src));
    }
}
// dir 0: y (B, T, C) = o (B H, T, D); dir 1: o = y
__global__ void k_heads(int dt, const void *src, void *dst, int64_t B, int64_t T, int64_t H,
                        int64_t D, int dir) {
    int64_t C = H * D;
    FG_CU_LOOP(i, B * T * C) {
        int64_t d = i % D, h = (i / D) % H, t = (i / C) % T, b = i / (C * T);
        int64_t flat = (b * T + t) * C + h * D + d, hd = ((b * H + h) * T + t) * D + d;
        if (dir == 0) fg_st(dst, dt, flat, fg_ld(src, dt, hd));
        else fg_st(dst, dt, hd, fg_ld(src, dt, flat));
    }
}
extern "C" int fg__cu_qkv_split(void *st, int dt, const void *qkv, void *q, void *k, void *v,
                               int64_t B, int64_t T, int64_t H, int64_t D) {
    int64_t n = B * T * H * D;
    if (n)
        k_qkv_split<<<fg_grid(n), FG_CU_THREADS, 0, (cudaStream_t)st>>>(dt, qkv, q, k, v, B, T, H,
                                                                        D);
    return fg_cu_err();
}
extern "C" int fg__cu_qkv_merge_add(void *st, int dt, const void *dq, const void *dk, const void *dv,
                                   void *dqkv, int64_t B, int64_t T, int64_t H, int64_t D) {
    int64_t n = B * T * H * D;
    if (n)
        k_qkv_merge_add<<<fg_grid(n), FG_CU_THREADS, 0, (cudaStream_t)st>>>(dt, dq, dk, dv, dqkv, B,
                                                                            T, H, D);
    return fg_cu_err();
}
extern "C" int fg__cu_heads_merge(void *st, int dt, const void *o, void *y, int64_t B, int64_t T,
                                 int64_t H, int64_t D) {
    int64_t n = B * T * H * D;
    if (n) k_heads<<<fg_grid(n), FG_CU_THREADS, 0, (cudaStream_t)st>>>(dt, o, y, B, T, H, D, 0);
    return fg_cu_err();
}
extern "C" int fg__cu_heads_split(void *st, int dt, const void *dy, void *dout, int64_t B, int64_t T,
                                 int64_t H, int64_t D) {
    int64_t n = B * T * H * D;
    if (n) k_heads<<<fg_grid(n), FG_CU_THREADS, 0, (cudaStream_t)st>>>(dt, dy, dout, B, T, H, D, 1);
    return fg_cu_err();
}
// whether key j of row `row` (of (B H T) rows) is left out: past the
// diagonal under the causal mask, or padding in its batch entry's mask
__device__ __forceinline__ bool att_out(int64_t row, int64_t j, int64_t T, int causal,
                                        const void *kpm, int kpm_u8, int64_t H) {
    if (causal && j > row % T) return true;
    if (!kpm) return false;
    int64_t i = row / (H * T) * T + j;
    return kpm_u8 ? ((const uint8_t *)kpm)[i] != 0 : ((const int32_t *)kpm)[i] != 0;
}

// one block per row (bh, i): the keys att_out leaves out are 0 (NaN all
// along a row that keeps none, as PyTorch's), the others the softmax of
// the scaled scores
__global__ void k_attn_softmax(float *s, float *lse, int64_t T, int causal, const void *kpm,
                               int kpm_u8, int64_t H, float scale) {
    __shared__ float sh[FG_CU_THREADS];
    int64_t row = blockIdx.x;
    float *p = s + row * T;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < T; j += blockDim.x)
        if (!att_out(row, j, T, causal, kpm, kpm_u8, H)) m = fmaxf(m, p[j] * scale);
    m = fg_block_max(m, sh);
    float z = 0;
    for (int64_t j = threadIdx.x; j < T; j += blockDim.x)
        if (!att_out(row, j, T, causal, kpm, kpm_u8, H)) z += expf(p[j] * scale - m);
    z = fg_block_sum(z, sh);
    for (int64_t j = threadIdx.x; j < T; j += blockDim.x)
        p[j] = !att_out(row, j, T, causal, kpm, kpm_u8, H) ? expf(p[j] * scale - m) / z
               : z > 0 || (causal && j > row % T)          ? 0.f
                                                           : NAN;
    if (threadIdx.x == 0) lse[row] = z > 0 ? m + logf(z) : NAN;
}
__global__ void k_attn_softmax_bwd(const float *p, float *dp, int64_t T, float scale) {
    __shared__ float sh[FG_CU_THREADS];
    int64_t row = blockIdx.x;
    const float *pr = p + row * T;
    float *d = dp + row * T;
    float s = 0;
    for (int64_t j = threadIdx.x; j < T; j += blockDim.x) s += d[j] * pr[j];
    s = fg_block_sum(s, sh);
    // the keys left out have p = 0, so ds = 0 there
    for (int64_t j = threadIdx.x; j < T; j += blockDim.x) d[j] = pr[j] * (d[j] - s) * scale;
}
extern "C" int fg__cu_attn_softmax(void *st, float *s, float *lse, int64_t BH, int64_t T,
                                   int causal, const void *kpm, int kpm_u8, int64_t H,
                                   float scale) {
    if (BH * T != 0)
        k_attn_softmax<<<(unsigned)(BH * T), FG_CU_THREADS, 0, (cudaStream_t)st>>>(
            s, lse, T, causal, kpm, kpm_u8, H, scale);
    return fg_cu_err();
}
extern "C" int fg__cu_attn_softmax_bwd(void *st, const float *p, float *dp, int64_t BH, int64_t T,
                                       float scale) {
    if (BH * T != 0)
        k_attn_softmax_bwd<<<(unsigned)(BH * T), FG_CU_THREADS, 0, (cudaStream_t)st>>>(p, dp, T,
                                                                                       scale);
    return fg_cu_err();
}
