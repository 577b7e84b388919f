/* The conversions between f32 and bf16/f16, one variant per path (lowp.h),
 * the path chosen at run time from the CPU (fg_cpu_isa, which
 * FULGUR_CPU_ISA caps, and AVX512-BF16 asked of the CPU once).
 *
 * Widening is exact on every path (a bf16 is the top half of an f32; every
 * f16 is an f32). Narrowing rounds to nearest even: bf16 by adding
 * 0x7fff + lsb to the bits (NaN kept quiet), f16 by the hardware's
 * vcvtps2ph where it has F16C, else fg_f32_to_f16. */
#include <stdatomic.h>
#include <string.h>

#include "core/cpu_isa.h"
#include "lowp.h"

/* Work below this many elements stays on one thread. */
#define CVT_PAR_MIN (1 << 17)
/* Threads take pieces of this many elements (a multiple of 16). */
#define CVT_PIECE 8192

static inline uint16_t bf16_scalar(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static void widen_scalar(float *dst, const uint16_t *src, int64_t n, fg_dtype dt) {
    if (dt == FG_BF16) {
        for (int64_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)src[i] << 16;
            memcpy(dst + i, &u, sizeof u);
        }
    } else {
        for (int64_t i = 0; i < n; i++) dst[i] = fg_f16_to_f32(src[i]);
    }
}

static void narrow_scalar(uint16_t *dst, const float *src, int64_t n, fg_dtype dt) {
    if (dt == FG_BF16)
        for (int64_t i = 0; i < n; i++) dst[i] = bf16_scalar(src[i]);
    else
        for (int64_t i = 0; i < n; i++) dst[i] = fg_f32_to_f16(src[i]);
}

#if FG_HAVE_ISA_TARGETS
#include <immintrin.h>

FG_TARGET_AVX2_BEGIN
/* 8 f32 -> 8 bf16 in the low halves of 8 32-bit lanes: round to nearest
 * even (add 0x7fff + the kept lsb), a NaN kept quiet (its top bits with the
 * quiet bit set, as bf16_scalar) */
static inline __m256i bf16x8_lanes(__m256 x) {
    __m256i u = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    __m256i q = _mm256_or_si256(u, _mm256_set1_epi32(0x400000));
    r = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(q), nan));
    return _mm256_srli_epi32(r, 16);
}

/* 8 f32 -> 8 bf16 */
static inline __m128i bf16x8(__m256 x) {
    __m256i r = bf16x8_lanes(x); /* values < 2^16: the pack does not saturate */
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

/* 16 f32 -> 16 bf16, one pack: packus interleaves the 128-bit halves of
 * its operands, the permute puts them back in order */
static inline __m256i bf16x16(__m256 lo, __m256 hi) {
    __m256i p = _mm256_packus_epi32(bf16x8_lanes(lo), bf16x8_lanes(hi));
    return _mm256_permute4x64_epi64(p, 0xd8);
}

/* n f32 rounded to bf16's values in place of a narrow and a widen */
static void round_bf16_avx2(float *dst, const float *src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_si256((__m256i *)(dst + i),
                            _mm256_slli_epi32(bf16x8_lanes(_mm256_loadu_ps(src + i)), 16));
    for (; i < n; i++) {
        uint32_t u = (uint32_t)bf16_scalar(src[i]) << 16;
        memcpy(dst + i, &u, sizeof u);
    }
}

static void widen_avx2(float *dst, const uint16_t *src, int64_t n, fg_dtype dt) {
    int64_t i = 0;
    if (dt == FG_BF16) {
        /* a bf16 is the top half of an f32: interleave zeros below each */
        const __m256i z = _mm256_setzero_si256();
        for (; i + 16 <= n; i += 16) {
            __m256i h =
                _mm256_permute4x64_epi64(_mm256_loadu_si256((const __m256i *)(src + i)), 0xd8);
            _mm256_storeu_si256((__m256i *)(dst + i), _mm256_unpacklo_epi16(z, h));
            _mm256_storeu_si256((__m256i *)(dst + i + 8), _mm256_unpackhi_epi16(z, h));
        }
        for (; i + 8 <= n; i += 8) {
            __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
            _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
        }
    } else {
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    }
    widen_scalar(dst + i, src + i, n - i, dt);
}

static void narrow_avx2(uint16_t *dst, const float *src, int64_t n, fg_dtype dt) {
    int64_t i = 0;
    if (dt == FG_BF16) {
        for (; i + 16 <= n; i += 16)
            _mm256_storeu_si256((__m256i *)(dst + i),
                                bf16x16(_mm256_loadu_ps(src + i), _mm256_loadu_ps(src + i + 8)));
        for (; i + 8 <= n; i += 8)
            _mm_storeu_si128((__m128i *)(dst + i), bf16x8(_mm256_loadu_ps(src + i)));
    } else {
        for (; i + 8 <= n; i += 8)
            _mm_storeu_si128((__m128i *)(dst + i),
                             _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    }
    narrow_scalar(dst + i, src + i, n - i, dt);
}
FG_TARGET_END

FG_TARGET_AVX512_BEGIN
static void widen_avx512(float *dst, const uint16_t *src, int64_t n, fg_dtype dt) {
    int64_t i = 0;
    for (; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m256i h = _mm256_maskz_loadu_epi16(k, src + i);
        __m512 f = dt == FG_BF16
                       ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
                       : _mm512_cvtph_ps(h);
        _mm512_mask_storeu_ps(dst + i, k, f);
    }
}

static void narrow_avx512(uint16_t *dst, const float *src, int64_t n, fg_dtype dt) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 x = _mm512_maskz_loadu_ps(k, src + i);
        __m256i h;
        if (dt == FG_BF16) {
            __m512i u = _mm512_castps_si512(x);
            __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
            __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
            __mmask16 nan = _mm512_cmpgt_epu32_mask(
                _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
            r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x400000));
            h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
        } else {
            h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
        }
        _mm256_mask_storeu_epi16(dst + i, k, h);
    }
}
FG_TARGET_END

/* AVX512-BF16's conversion instruction. */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))),      \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")
#endif
static void narrow_avx512bf16(uint16_t *dst, const float *src, int64_t n, fg_dtype dt) {
    if (dt != FG_BF16) {
        narrow_avx512(dst, src, n, dt);
        return;
    }
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i));
        _mm512_storeu_si512((void *)(dst + i), (__m512i)h);
    }
    for (; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(k, src + i));
        _mm256_mask_storeu_epi16(dst + i, k, (__m256i)h);
    }
}
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

static bool cpu_has_bf16(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16");
}
#endif

typedef void (*widen_fn)(float *, const uint16_t *, int64_t, fg_dtype);
typedef void (*narrow_fn)(uint16_t *, const float *, int64_t, fg_dtype);

static const struct {
    const char *name;
    widen_fn widen;
    narrow_fn narrow;
} g_paths[FG_LOWP_COUNT] = {
    [FG_LOWP_SCALAR] = {"scalar", widen_scalar, narrow_scalar},
#if FG_HAVE_ISA_TARGETS
    [FG_LOWP_AVX2] = {"avx2", widen_avx2, narrow_avx2},
    [FG_LOWP_AVX512] = {"avx512", widen_avx512, narrow_avx512},
    [FG_LOWP_AVX512_BF16] = {"avx512_bf16", widen_avx512, narrow_avx512bf16},
#else
    [FG_LOWP_AVX2] = {"avx2", widen_scalar, narrow_scalar},
    [FG_LOWP_AVX512] = {"avx512", widen_scalar, narrow_scalar},
    [FG_LOWP_AVX512_BF16] = {"avx512_bf16", widen_scalar, narrow_scalar},
#endif
};

static _Atomic int g_forced = -1;

bool fg__lowp_path_available(fg__lowp_path p) {
#if FG_HAVE_ISA_TARGETS
    fg_isa isa = fg_cpu_isa();
    switch (p) {
    case FG_LOWP_SCALAR: return true;
    case FG_LOWP_AVX2: return isa >= FG_ISA_AVX2;
    case FG_LOWP_AVX512: return isa >= FG_ISA_AVX512;
    case FG_LOWP_AVX512_BF16: return isa >= FG_ISA_AVX512 && cpu_has_bf16();
    default: return false;
    }
#else
    return p == FG_LOWP_SCALAR;
#endif
}

fg__lowp_path fg__lowp_path_get(void) {
    int f = atomic_load_explicit(&g_forced, memory_order_relaxed);
    if (f >= 0) return (fg__lowp_path)f;
    for (int p = FG_LOWP_COUNT - 1; p > 0; p--)
        if (fg__lowp_path_available((fg__lowp_path)p)) return (fg__lowp_path)p;
    return FG_LOWP_SCALAR;
}

fg_status fg__lowp_path_force(int p) {
    if (p >= FG_LOWP_COUNT)
        return fg_error(FG_EINVAL, "lowp path %d: expected 0..%d", p, FG_LOWP_COUNT - 1);
    if (p >= 0 && !fg__lowp_path_available((fg__lowp_path)p))
        return fg_error(FG_EUNSUPPORTED, "lowp path %s: this CPU (or FULGUR_CPU_ISA) lacks it",
                        g_paths[p].name);
    atomic_store(&g_forced, p < 0 ? -1 : p);
    return FG_OK;
}

const char *fg__lowp_path_name(fg__lowp_path p) {
    return (int)p >= 0 && p < FG_LOWP_COUNT ? g_paths[p].name : "?";
}

void fg__lowp_widen(float *dst, const uint16_t *src, int64_t n, fg_dtype dt) {
    widen_fn f = g_paths[fg__lowp_path_get()].widen;
    if (n < CVT_PAR_MIN || fg_get_num_threads() < 2) {
        f(dst, src, n, dt);
        return;
    }
    int64_t pieces = (n + CVT_PIECE - 1) / CVT_PIECE;
    FG_PRAGMA(omp parallel for schedule(static))
    for (int64_t p = 0; p < pieces; p++) {
        int64_t i = p * CVT_PIECE;
        f(dst + i, src + i, FG_MIN(CVT_PIECE, n - i), dt);
    }
}

void fg__lowp_narrow(uint16_t *dst, const float *src, int64_t n, fg_dtype dt) {
    narrow_fn f = g_paths[fg__lowp_path_get()].narrow;
    if (n < CVT_PAR_MIN || fg_get_num_threads() < 2) {
        f(dst, src, n, dt);
        return;
    }
    int64_t pieces = (n + CVT_PIECE - 1) / CVT_PIECE;
    FG_PRAGMA(omp parallel for schedule(static))
    for (int64_t p = 0; p < pieces; p++) {
        int64_t i = p * CVT_PIECE;
        f(dst + i, src + i, FG_MIN(CVT_PIECE, n - i), dt);
    }
}

void fg__lowp_round_f32(float *dst, const float *src, int64_t n, fg_dtype dt) {
#if FG_HAVE_ISA_TARGETS
    fg__lowp_path p = fg__lowp_path_get();
    if (dt == FG_BF16 && (p == FG_LOWP_AVX2 || p == FG_LOWP_AVX512)) {
        round_bf16_avx2(dst, src, n); /* those paths' rounding, in one step */
        return;
    }
#endif
    /* through the stack in first-level-cache pieces, on the path's own
     * conversions: one pass over memory, the same bits as narrow + widen */
    uint16_t tmp[1024];
    for (int64_t i = 0; i < n; i += 1024) {
        int64_t k = FG_MIN(1024, n - i);
        fg__lowp_narrow(tmp, src + i, k, dt);
        fg__lowp_widen(dst + i, tmp, k, dt);
    }
}
