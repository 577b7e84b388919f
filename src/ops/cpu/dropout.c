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
 * the kernel. */
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

#if defined(__AVX512F__)
#include <immintrin.h>

/* hi and lo words of a * m in 16 u32 lanes. vpmuludq multiplies the even
 * lanes; the odd ones are shifted down for a second one. (Left to itself,
 * GCC widens to 64-bit lanes and uses vpmullq with permutes around it, at
 * about twice the cost.) */
static inline void mulhilo16(__m512i a, __m512i m, __m512i *hi, __m512i *lo) {
    __m512i pe = _mm512_mul_epu32(a, m);
    __m512i po = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);
    *hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(pe, 32), po);
    *lo = _mm512_mask_blend_epi32(0xAAAA, pe, _mm512_slli_epi64(po, 32));
}

/* u[k] = draw 4 * ctr0 + k of stream seed, k < CHUNK: blocks ctr0 + l in
 * lane l, then a 4 x 16 transpose into draw order. */
static void philox_chunk(uint64_t seed, uint64_t ctr0, uint32_t *restrict u) {
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i base = _mm512_set1_epi32((int)(uint32_t)ctr0);
    __m512i a0 = _mm512_add_epi32(base, iota);
    __mmask16 carry = _mm512_cmplt_epu32_mask(a0, base); /* the low word wrapped */
    __m512i a1 =
        _mm512_mask_add_epi32(_mm512_set1_epi32((int)(uint32_t)(ctr0 >> 32)), carry,
                              _mm512_set1_epi32((int)(uint32_t)(ctr0 >> 32)), _mm512_set1_epi32(1));
    __m512i a2 = _mm512_setzero_si512(), a3 = _mm512_setzero_si512();
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    const __m512i m0 = _mm512_set1_epi32((int)PHILOX_M0), m1 = _mm512_set1_epi32((int)PHILOX_M1);
    for (int r = 0; r < 10; r++) {
        __m512i hi0, lo0, hi1, lo1;
        mulhilo16(a0, m0, &hi0, &lo0);
        mulhilo16(a2, m1, &hi1, &lo1);
        a0 = _mm512_ternarylogic_epi32(hi1, a1, _mm512_set1_epi32((int)k0), 0x96); /* xor3 */
        a2 = _mm512_ternarylogic_epi32(hi0, a3, _mm512_set1_epi32((int)k1), 0x96);
        a1 = lo1;
        a3 = lo0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    /* lane l of a0..a3 is block l; draws go block by block */
    __m512i t0 = _mm512_unpacklo_epi32(a0, a1), t1 = _mm512_unpackhi_epi32(a0, a1);
    __m512i t2 = _mm512_unpacklo_epi32(a2, a3), t3 = _mm512_unpackhi_epi32(a2, a3);
    __m512i r0 = _mm512_unpacklo_epi64(t0, t2), r1 = _mm512_unpackhi_epi64(t0, t2);
    __m512i r2 = _mm512_unpacklo_epi64(t1, t3), r3 = _mm512_unpackhi_epi64(t1, t3);
    /* r_j holds blocks j, j+4, j+8, j+12 in its 128-bit lanes */
    __m512i s0 = _mm512_shuffle_i32x4(r0, r1, 0x44), s1 = _mm512_shuffle_i32x4(r2, r3, 0x44);
    __m512i s2 = _mm512_shuffle_i32x4(r0, r1, 0xEE), s3 = _mm512_shuffle_i32x4(r2, r3, 0xEE);
    _mm512_storeu_si512(u, _mm512_shuffle_i32x4(s0, s1, 0x88));
    _mm512_storeu_si512(u + 16, _mm512_shuffle_i32x4(s0, s1, 0xDD));
    _mm512_storeu_si512(u + 32, _mm512_shuffle_i32x4(s2, s3, 0x88));
    _mm512_storeu_si512(u + 48, _mm512_shuffle_i32x4(s2, s3, 0xDD));
}
#else
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
#endif

/* y = x * keep * scale (fwd) or y += x * keep * scale (bwd): x, y (n). */
static fg_status apply(const char *kernel, const fg_tensor *x, double p, uint64_t seed,
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
