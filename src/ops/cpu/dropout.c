/* Inverted dropout: y = x * keep / (1 - p), element i kept when the Philox
 * draw fg_rng_u32_at(seed, offset + i) is >= p * 2^32 (the draw as a
 * uniform in [0, 1) is >= p; both sides are exact in double). The mask is a
 * pure function of (seed, offset + i): the same on any thread count, and
 * the backward recomputes it instead of reading a saved one.
 *
 * Draw k is word k % 4 of the Philox4x32-10 block at counter k / 4
 * (core's rng.c). Blocks are made here PHILOX_LANES at a time by a lane
 * loop the compiler vectorises (the same rounds and constants as
 * fg_philox; the tests compare every draw with fg_rng_u32_at), since one
 * scalar fg_philox call per four elements would cost more than the rest of
 * the kernel. f32 goes through the vector kernel of the ISA in use
 * (cpu_impl.h's fg__vk: the same blocks in AVX2 or AVX-512 lanes), in
 * pieces that each start their own stream position, so the mask is the
 * same bits on every path and thread count. fg_ops_cpu_philox_xor (ops.h)
 * makes the draws alone, as the compute bound bench/ops_bench holds the
 * kernel to. */
#include "cpu_impl.h"
#include "vmath.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

#define PHILOX_LANES 16
#define CHUNK (4 * PHILOX_LANES) /* draws per batch of blocks */

#define PHILOX_ROUND                                                                               \
    do {                                                                                           \
        uint64_t p0 = (uint64_t)PHILOX_M0 * a0, p1 = (uint64_t)PHILOX_M1 * a2;                     \
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ a1 ^ k0;                                              \
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ a3 ^ k1;                                              \
        a1 = (uint32_t)p1;                                                                         \
        a3 = (uint32_t)p0;                                                                         \
        a0 = n0;                                                                                   \
        a2 = n2;                                                                                   \
        k0 += PHILOX_W0;                                                                           \
        k1 += PHILOX_W1;                                                                           \
    } while (0)

/* u[k] = draw 4 * ctr0 + k of stream seed, k < CHUNK. */
static void philox_chunk(uint64_t seed, uint64_t ctr0, uint32_t *restrict u) {
    uint32_t o0[PHILOX_LANES], o1[PHILOX_LANES], o2[PHILOX_LANES], o3[PHILOX_LANES];
    FG_SIMD
    for (int l = 0; l < PHILOX_LANES; l++) {
        uint64_t ctr = ctr0 + (uint64_t)l;
        uint32_t a0 = (uint32_t)ctr, a1 = (uint32_t)(ctr >> 32), a2 = 0, a3 = 0;
        uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
        PHILOX_ROUND;
        PHILOX_ROUND;
        PHILOX_ROUND;
        PHILOX_ROUND;
        PHILOX_ROUND;
        PHILOX_ROUND;
        PHILOX_ROUND;
        PHILOX_ROUND;
        PHILOX_ROUND;
        PHILOX_ROUND;
        o0[l] = a0;
        o1[l] = a1;
        o2[l] = a2;
        o3[l] = a3;
    }
    for (int l = 0; l < PHILOX_LANES; l++) {
        u[4 * l] = o0[l];
        u[4 * l + 1] = o1[l];
        u[4 * l + 2] = o2[l];
        u[4 * l + 3] = o3[l];
    }
}

fg_status fg_ops_cpu_philox_xor(uint64_t seed, uint64_t offset, int64_t n, uint32_t *out) {
    if (n < 0)
        return fg_error(FG_EINVAL, "fg_ops_cpu_philox_xor: n = %lld: expected >= 0", (long long)n);
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    *out = 0;
    if (!n) return FG_OK;
    if (vk->philox_xor) {
        *out = vk->philox_xor(seed, offset, n);
        return FG_OK;
    }
    uint32_t u[CHUNK], acc = 0;
    uint64_t end = offset + (uint64_t)n;
    for (uint64_t d0 = offset & ~(uint64_t)3; d0 < end; d0 += CHUNK) {
        philox_chunk(seed, d0 >> 2, u);
        int64_t k0 = d0 < offset ? (int64_t)(offset - d0) : 0;
        int64_t k1 = end - d0 < CHUNK ? (int64_t)(end - d0) : CHUNK;
        for (int64_t k = k0; k < k1; k++) acc ^= u[k];
    }
    *out = acc;
    return FG_OK;
}

/* y = x * keep * scale (fwd) or y += x * keep * scale (bwd): x, y (n). */
static FG_MUST_USE fg_status apply(const char *kernel, const fg_tensor *x, double p, uint64_t seed,
                                   uint64_t offset, fg_tensor *y, bool accumulate) {
    FG_TRY(fg__expect_same_shape(kernel, x, y));
    FG_TRY(fg__expect_contiguous(kernel, x));
    FG_TRY(fg__expect_contiguous(kernel, y));
    if (!(p >= 0 && p < 1))
        return fg_error(FG_EINVAL, "%s: p = %g: expected a probability in [0, 1)", kernel, p);
    int64_t n = x->numel;
    if (n == 0) return FG_OK;
    /* keep iff draw >= thr; thr == 2^32 (p within 2^-32 of 1) keeps nothing */
    uint64_t thr = (uint64_t)ceil(p * 4294967296.0);
    bool none = thr > UINT32_MAX;
    uint32_t thr32 = none ? 0 : (uint32_t)thr;
    /* draws offset .. offset+n-1 live in blocks [first, last]; chunk c
     * covers blocks first + c*LANES .. +LANES-1, i.e. draws from 4 * that */
    uint64_t first = offset >> 2, last = (offset + (uint64_t)n - 1) >> 2;
    int64_t chunks = (int64_t)((last - first) / PHILOX_LANES + 1);
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    if (x->dtype == FG_F32 && vk->dropout && !none) {
        const float *px = x->data;
        float *py = y->data;
        float scale = (float)(1 / (1 - p));
FG_PRAGMA(omp parallel for if (n > FG_PAR_MIN) schedule(static))
for (int64_t i = 0; i < n; i += FG_VK_PIECE)
    vk->dropout(px + i, py + i, FG_MIN(FG_VK_PIECE, n - i), seed, offset + (uint64_t)i, thr32,
                scale, accumulate);
return FG_OK;
    }
    FG_FLOAT_DISPATCH(kernel, x->dtype, {
        const T *px = x->data;
        T *py = y->data;
        const T scale = (T)(1 / (1 - p));
FG_PRAGMA(omp parallel for if (n > FG_PAR_MIN) schedule(static))
for (int64_t c = 0; c < chunks; c++) {
    uint32_t u[CHUNK];
    uint64_t d0 = 4 * (first + (uint64_t)c * PHILOX_LANES); /* draw of u[0] */
    philox_chunk(seed, d0 >> 2, u);
    /* elements i = d0 + k - offset, clipped to [0, n) */
    int64_t k0 = d0 < offset ? (int64_t)(offset - d0) : 0;
    int64_t k1 = FG_MIN((int64_t)CHUNK, (int64_t)(offset + (uint64_t)n - d0));
    int64_t base = (int64_t)(d0 - offset); /* may be negative only with k0 > 0 */
    if (none) {
        if (!accumulate)
            for (int64_t k = k0; k < k1; k++) py[base + k] = 0;
    } else if (accumulate) {
        FG_SIMD
        for (int64_t k = k0; k < k1; k++)
            py[base + k] += u[k] >= thr32 ? px[base + k] * scale : (T)0;
    } else {
        FG_SIMD
        for (int64_t k = k0; k < k1; k++)
            py[base + k] = u[k] >= thr32 ? px[base + k] * scale : (T)0;
    }
}
    });
    return FG_OK;
}

fg_status fg__cpu_dropout_fwd(const fg_tensor *x, double p, uint64_t seed, uint64_t offset,
                              fg_tensor *y) {
    return apply("dropout_fwd", x, p, seed, offset, y, false);
}

fg_status fg__cpu_dropout_bwd(const fg_tensor *dy, double p, uint64_t seed, uint64_t offset,
                              fg_tensor *dx) {
    return apply("dropout_bwd", dy, p, seed, offset, dx, true);
}
