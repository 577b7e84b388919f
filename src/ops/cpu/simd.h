/* The float vectors of one ISA, for the kernel template vk_t.h: included
 * by vk_avx2.c (VK_W 8: AVX2 + FMA) and vk_avx512.c (VK_W 16: AVX-512)
 * inside their target region, after <immintrin.h>, so that every function
 * here is compiled for that ISA and inlined into the kernels.
 *
 *   vf      W floats            vd    W/2 doubles (sums kept in double)
 *   vu      W uint32            vmask a lane mask (a vector on AVX2, a k
 *                                     register on AVX-512)
 *
 * Arithmetic is IEEE single precision lane by lane; v_fma rounds once.
 * v_max(a, b) and v_min(a, b) are a > b ? a : b and a < b ? a : b, as the
 * instructions are: a NaN in a gives b, a NaN in b gives b. The _n loads
 * and stores touch only the lanes of their mask (masked instructions, which
 * never fault on the others), so a row's tail needs no padding. */
#ifndef FULGUR_CPU_SIMD_H
#define FULGUR_CPU_SIMD_H

#if VK_W == 16

typedef __m512 vf;
typedef __m512d vd;
typedef __m512i vu;
typedef __mmask16 vmask;

static inline vf v_set1(float x) { return _mm512_set1_ps(x); }
static inline vf v_zero(void) { return _mm512_setzero_ps(); }
static inline vf v_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void v_store(float *p, vf x) { _mm512_storeu_ps(p, x); }
/* lanes l < k (k may be <= 0 or >= W) */
static inline vmask v_first(int64_t k) {
    return k >= 16 ? (vmask)0xffff : k <= 0 ? (vmask)0 : (vmask)((1u << k) - 1);
}
static inline vf v_load_n(const float *p, vmask m) { return _mm512_maskz_loadu_ps(m, p); }
static inline vf v_load_n_or(const float *p, vmask m, vf fill) {
    return _mm512_mask_loadu_ps(fill, m, p);
}
static inline void v_store_n(float *p, vmask m, vf x) { _mm512_mask_storeu_ps(p, m, x); }
static inline vf v_keep(vmask m, vf x) { return _mm512_maskz_mov_ps(m, x); }
static inline vf v_select(vmask m, vf a, vf b) { return _mm512_mask_blend_ps(m, b, a); }
static inline vmask v_gt(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }

static inline vf v_add(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf v_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf v_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf v_div(vf a, vf b) { return _mm512_div_ps(a, b); }
static inline vf v_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }   /* a b + c */
static inline vf v_fms(vf a, vf b, vf c) { return _mm512_fmsub_ps(a, b, c); }   /* a b - c */
static inline vf v_fnma(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); } /* c - a b */
static inline vf v_max(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline vf v_min(vf a, vf b) { return _mm512_min_ps(a, b); }
/* -|x| (the sign bit set) */
static inline vf v_negabs(vf x) { return _mm512_or_ps(x, _mm512_set1_ps(-0.0f)); }
/* a where s has its sign bit set (-0, NaN with the bit), else b */
static inline vf v_select_neg(vf s, vf a, vf b) {
    return _mm512_mask_blend_ps(_mm512_movepi32_mask(_mm512_castps_si512(s)), b, a);
}
static inline float v_hsum(vf x) { return _mm512_reduce_add_ps(x); }
static inline float v_hmax(vf x) { return _mm512_reduce_max_ps(x); }
/* lane r = the max (the sum) of p[r]'s lanes, for r < 16: a transpose
 * that reduces as it goes (45 instructions for 16 rows, where 16 v_hmax
 * take 128) */
#define V_ROWS_RED(name, op)                                                                       \
    static inline vf name(const vf *p) {                                                           \
        vf c[8], d[4], e[2];                                                                       \
        for (int i = 0; i < 8; i++)                                                                \
            c[i] = op(_mm512_unpacklo_ps(p[2 * i], p[2 * i + 1]),                                  \
                      _mm512_unpackhi_ps(p[2 * i], p[2 * i + 1]));                                 \
        for (int i = 0; i < 4; i++)                                                                \
            d[i] = op(_mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0x44),                             \
                      _mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0xEE));                            \
        for (int i = 0; i < 2; i++)                                                                \
            e[i] = op(_mm512_shuffle_f32x4(d[2 * i], d[2 * i + 1], 0x44),                          \
                      _mm512_shuffle_f32x4(d[2 * i], d[2 * i + 1], 0xEE));                         \
        return op(_mm512_shuffle_f32x4(e[0], e[1], 0x88), _mm512_shuffle_f32x4(e[0], e[1], 0xDD)); \
    }
V_ROWS_RED(v_max_rows, _mm512_max_ps)
V_ROWS_RED(v_add_rows, _mm512_add_ps)
/* lane r = p[r stride] where m has lane r, else 0 */
static inline vf v_gather_n(const float *p, int64_t stride, vmask m) {
    __m512i ix =
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32((int)stride));
    return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, ix, p, 4);
}

static inline vu v_as_u(vf x) { return _mm512_castps_si512(x); }
static inline vf v_as_f(vu x) { return _mm512_castsi512_ps(x); }
static inline vu v_u_set1(uint32_t x) { return _mm512_set1_epi32((int)x); }
static inline vu v_u_sub(vu a, vu b) { return _mm512_sub_epi32(a, b); }
static inline vu v_u_shl23(vu a) { return _mm512_slli_epi32(a, 23); }
static inline vu v_u_shr23(vu a) { return _mm512_srli_epi32(a, 23); }
static inline vu v_u_and(vu a, vu b) { return _mm512_and_si512(a, b); }
static inline vu v_u_or(vu a, vu b) { return _mm512_or_si512(a, b); }
static inline vf v_u_tof(vu a) { return _mm512_cvtepi32_ps(a); } /* as signed */
static inline vu v_u_load(const uint32_t *p) { return _mm512_loadu_si512((const void *)p); }
static inline void v_u_store(uint32_t *p, vu x) { _mm512_storeu_si512((void *)p, x); }
static inline vu v_u_xor(vu a, vu b) { return _mm512_xor_si512(a, b); }
static inline uint32_t v_u_hxor(vu x) {
    __m256i h = _mm256_xor_si256(_mm512_castsi512_si256(x), _mm512_extracti64x4_epi64(x, 1));
    __m128i q = _mm_xor_si128(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    q = _mm_xor_si128(q, _mm_shuffle_epi32(q, 0x4E));
    q = _mm_xor_si128(q, _mm_shuffle_epi32(q, 0xB1));
    return (uint32_t)_mm_cvtsi128_si32(q);
}
/* x where u >= t (unsigned), else 0 */
static inline vf v_keep_ge(vu u, vu t, vf x) {
    return _mm512_maskz_mov_ps(_mm512_cmpge_epu32_mask(u, t), x);
}

static inline vd vd_zero(void) { return _mm512_setzero_pd(); }
static inline vd vd_load(const double *p) { return _mm512_loadu_pd(p); }
static inline void vd_store(double *p, vd x) { _mm512_storeu_pd(p, x); }
static inline vd vd_lo(vf x) { return _mm512_cvtps_pd(_mm512_castps512_ps256(x)); }
static inline vd vd_hi(vf x) { return _mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1)); }
static inline vd vd_add(vd a, vd b) { return _mm512_add_pd(a, b); }
static inline vd vd_fma(vd a, vd b, vd c) { return _mm512_fmadd_pd(a, b, c); }
static inline double vd_hsum(vd x) { return _mm512_reduce_add_pd(x); }

#elif VK_W == 8

typedef __m256 vf;
typedef __m256d vd;
typedef __m256i vu;
typedef __m256 vmask; /* all ones in a live lane */

static inline vf v_set1(float x) { return _mm256_set1_ps(x); }
static inline vf v_zero(void) { return _mm256_setzero_ps(); }
static inline vf v_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void v_store(float *p, vf x) { _mm256_storeu_ps(p, x); }
static inline vmask v_first(int64_t k) {
    int c = k >= 8 ? 8 : k <= 0 ? 0 : (int)k;
    return _mm256_castsi256_ps(
        _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}
static inline vf v_load_n(const float *p, vmask m) {
    return _mm256_maskload_ps(p, _mm256_castps_si256(m));
}
static inline vf v_load_n_or(const float *p, vmask m, vf fill) {
    return _mm256_blendv_ps(fill, _mm256_maskload_ps(p, _mm256_castps_si256(m)), m);
}
static inline void v_store_n(float *p, vmask m, vf x) {
    _mm256_maskstore_ps(p, _mm256_castps_si256(m), x);
}
static inline vf v_keep(vmask m, vf x) { return _mm256_and_ps(m, x); }
static inline vf v_select(vmask m, vf a, vf b) { return _mm256_blendv_ps(b, a, m); }
static inline vmask v_gt(vf a, vf b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }

static inline vf v_add(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf v_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
static inline vf v_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf v_div(vf a, vf b) { return _mm256_div_ps(a, b); }
static inline vf v_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf v_fms(vf a, vf b, vf c) { return _mm256_fmsub_ps(a, b, c); }
static inline vf v_fnma(vf a, vf b, vf c) { return _mm256_fnmadd_ps(a, b, c); }
static inline vf v_max(vf a, vf b) { return _mm256_max_ps(a, b); }
static inline vf v_min(vf a, vf b) { return _mm256_min_ps(a, b); }
static inline vf v_negabs(vf x) { return _mm256_or_ps(x, _mm256_set1_ps(-0.0f)); }
static inline vf v_select_neg(vf s, vf a, vf b) { return _mm256_blendv_ps(b, a, s); }
static inline float v_hsum(vf x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline float v_hmax(vf x) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* lane r = the max (the sum) of p[r]'s lanes, for r < 8 */
#define V_ROWS_RED(name, op)                                                                       \
    static inline vf name(const vf *p) {                                                           \
        vf c[4], d[2];                                                                             \
        for (int i = 0; i < 4; i++)                                                                \
            c[i] = op(_mm256_unpacklo_ps(p[2 * i], p[2 * i + 1]),                                  \
                      _mm256_unpackhi_ps(p[2 * i], p[2 * i + 1]));                                 \
        for (int i = 0; i < 2; i++)                                                                \
            d[i] = op(_mm256_shuffle_ps(c[2 * i], c[2 * i + 1], 0x44),                             \
                      _mm256_shuffle_ps(c[2 * i], c[2 * i + 1], 0xEE));                            \
        return op(_mm256_permute2f128_ps(d[0], d[1], 0x20),                                        \
                  _mm256_permute2f128_ps(d[0], d[1], 0x31));                                       \
    }
V_ROWS_RED(v_max_rows, _mm256_max_ps)
V_ROWS_RED(v_add_rows, _mm256_add_ps)
static inline vf v_gather_n(const float *p, int64_t stride, vmask m) {
    __m256i ix = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                    _mm256_set1_epi32((int)stride));
    return _mm256_mask_i32gather_ps(_mm256_setzero_ps(), p, ix, m, 4);
}

static inline vu v_as_u(vf x) { return _mm256_castps_si256(x); }
static inline vf v_as_f(vu x) { return _mm256_castsi256_ps(x); }
static inline vu v_u_set1(uint32_t x) { return _mm256_set1_epi32((int)x); }
static inline vu v_u_sub(vu a, vu b) { return _mm256_sub_epi32(a, b); }
static inline vu v_u_shl23(vu a) { return _mm256_slli_epi32(a, 23); }
static inline vu v_u_shr23(vu a) { return _mm256_srli_epi32(a, 23); }
static inline vu v_u_and(vu a, vu b) { return _mm256_and_si256(a, b); }
static inline vu v_u_or(vu a, vu b) { return _mm256_or_si256(a, b); }
static inline vf v_u_tof(vu a) { return _mm256_cvtepi32_ps(a); } /* as signed */
static inline vu v_u_load(const uint32_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline void v_u_store(uint32_t *p, vu x) { _mm256_storeu_si256((__m256i *)p, x); }
static inline vu v_u_xor(vu a, vu b) { return _mm256_xor_si256(a, b); }
static inline uint32_t v_u_hxor(vu x) {
    __m128i q = _mm_xor_si128(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    q = _mm_xor_si128(q, _mm_shuffle_epi32(q, 0x4E));
    q = _mm_xor_si128(q, _mm_shuffle_epi32(q, 0xB1));
    return (uint32_t)_mm_cvtsi128_si32(q);
}
static inline vf v_keep_ge(vu u, vu t, vf x) { /* u >= t iff max(u, t) == u */
    return _mm256_and_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_max_epu32(u, t), u)), x);
}

static inline vd vd_zero(void) { return _mm256_setzero_pd(); }
static inline vd vd_load(const double *p) { return _mm256_loadu_pd(p); }
static inline void vd_store(double *p, vd x) { _mm256_storeu_pd(p, x); }
static inline vd vd_lo(vf x) { return _mm256_cvtps_pd(_mm256_castps256_ps128(x)); }
static inline vd vd_hi(vf x) { return _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)); }
/* W/2 floats at p, widened */
static inline vd vd_from(const float *p) { return _mm256_cvtps_pd(_mm_loadu_ps(p)); }
static inline vd vd_add(vd a, vd b) { return _mm256_add_pd(a, b); }
static inline vd vd_fma(vd a, vd b, vd c) { return _mm256_fmadd_pd(a, b, c); }
static inline double vd_hsum(vd x) {
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(x), _mm256_extractf128_pd(x, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

#else
#error "simd.h: define VK_W as 8 (AVX2) or 16 (AVX-512)"
#endif

#endif
