/* The scalar math the CUDA kernels and the CPU share, from one source:
 * compiled by nvcc for the device (FG_HD is __host__ __device__ there) and
 * by the C compiler for the host, where tests/gpu/test_cuda_shared.c holds
 * it to the CPU kernels (dropout's Philox mask, cross-entropy's row
 * statistics, GELU). Plain C99 that is also valid C++. */
#ifndef FULGUR_CUDA_SHARED_H
#define FULGUR_CUDA_SHARED_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define FG_HD __host__ __device__ __forceinline__
#else
#define FG_HD static inline
#endif

/* Philox4x32-10 block `ctr` of stream `seed`: core's fg_philox (rng.c), so
 * draw i of a stream is word i % 4 of block i / 4, as fg_rng_u32_at. */
FG_HD void fg__sh_philox(uint64_t seed, uint64_t ctr, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)ctr, c1 = (uint32_t)(ctr >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* Dropout's threshold: element i is kept when draw (seed, offset + i) >=
 * *thr; *none when p rounds to keep nothing (p within 2^-32 of 1): the
 * CPU's rule (src/ops/cpu/dropout.c). Host only (double ceil). */
static inline void fg__sh_dropout_threshold(double p, uint32_t *thr, int *none) {
    uint64_t t = (uint64_t)ceil(p * 4294967296.0);
    *none = t > UINT32_MAX;
    *thr = *none ? 0 : (uint32_t)t;
}

/* GELU, tanh approximation, as the CPU's scalar path (activation.c). */
#define FG__SH_GELU_K0 0.7978845608028654f
#define FG__SH_GELU_K1 0.044715f
FG_HD float fg__sh_gelu(float v) {
    float c = v < -30.f ? -30.f : v > 30.f ? 30.f : v;
    float u = FG__SH_GELU_K0 * (c + FG__SH_GELU_K1 * c * c * c);
    return v / (1.f + expf(-2.f * u));
}
FG_HD float fg__sh_gelu_grad(float v) {
    float c = v < -30.f ? -30.f : v > 30.f ? 30.f : v, c2 = c * c;
    float u = FG__SH_GELU_K0 * (c + FG__SH_GELU_K1 * c2 * c), a = -2.f * u;
    float e = expf(a > 80.f ? 80.f : a), s = 1.f / (1.f + e);
    float du = FG__SH_GELU_K0 * (1.f + 3.f * FG__SH_GELU_K1 * c2);
    return s + 2.f * c * (e * s) * s * du;
}

/* Cross-entropy's row statistics, merged in any grouping: the running max
 * m and the sum s of exp(x - m) (the row's logsumexp is m + log s). A
 * block of the fused kernel folds its slice of the row with
 * fg__sh_lse_push, then the slices with fg__sh_lse_merge, in a fixed tree
 * order (deterministic). */
typedef struct fg__sh_lse {
    double m, s;
} fg__sh_lse;
FG_HD fg__sh_lse fg__sh_lse_init(void) {
    fg__sh_lse r;
    r.m = -INFINITY;
    r.s = 0;
    return r;
}
FG_HD fg__sh_lse fg__sh_lse_merge(fg__sh_lse a, fg__sh_lse b) {
    if (b.m == -INFINITY) return a;
    if (a.m == -INFINITY) return b;
    fg__sh_lse r;
    if (a.m >= b.m) {
        r.m = a.m;
        r.s = a.s + b.s * exp(b.m - a.m);
    } else {
        r.m = b.m;
        r.s = b.s + a.s * exp(a.m - b.m);
    }
    return r;
}
FG_HD fg__sh_lse fg__sh_lse_push(fg__sh_lse a, double x) {
    fg__sh_lse b;
    b.m = x;
    b.s = 1;
    return fg__sh_lse_merge(a, b);
}
/* The row's loss, logsumexp - x[target], from its statistics. */
FG_HD double fg__sh_ce_loss(fg__sh_lse st, double x_target) { return st.m + log(st.s) - x_target; }
/* d loss / d x of one logit: (exp(x - m) / s - [target]) * scale. */
FG_HD double fg__sh_ce_grad(fg__sh_lse st, double x, int is_target, double scale) {
    return (exp(x - st.m) / st.s - (is_target ? 1.0 : 0.0)) * scale;
}

#endif
