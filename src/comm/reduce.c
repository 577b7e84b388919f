/* Reduction kernels: dst = op(src0, src1, ..., srcN-1) element-wise, always
 * in source order, so that the same inputs give the same bits whoever runs
 * the kernel. Blocks of BLK elements are accumulated in a small stack buffer
 * (f32 for bf16/f16, a wider integer where a sum could overflow before the
 * final wrap) and written once; the loops are plain C that the compiler
 * vectorises (the file is built at O3), compiled once per ISA (reduce_t.h
 * under core/cpu_isa.h's target pragmas) and run at fg_cpu_isa()'s: the
 * same operations per element on every path, so the same bits on any CPU
 * (ranks on different machines included). */
#pragma GCC optimize("O3")
#include <string.h>

#include "comm_impl.h"
#include "core/cpu_isa.h"

#if FG_HAVE_ISA_TARGETS
#include <immintrin.h>
#endif

#define BLK 512

/* bf16 <-> f32, bit-exact with fg_f32_to_bf16 (round to nearest even, NaN
 * kept quiet), written so that the loops vectorise. */
static inline float bf16_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t f32_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t q = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? q : r);
}

#if defined(__FLT16_MAX__)
__extension__ typedef _Float16 half_t;
static inline float f16_f32(uint16_t h) {
    half_t x;
    memcpy(&x, &h, 2);
    return (float)x;
}
static inline uint16_t f32_f16(float f) {
    half_t x = (half_t)f;
    uint16_t h;
    memcpy(&h, &x, 2);
    return h;
}
#else
static inline float f16_f32(uint16_t h) { return fg_f16_to_f32(h); }
static inline uint16_t f32_f16(float f) { return fg_f32_to_f16(f); }
#endif

#define IDENT(x) (x)
#define U8_STORE(x) ((uint8_t)(x))
#define U16_STORE(x) ((uint16_t)(x))

typedef void (*reduce_fn)(fg_reduce_op op, void *dst, void *dst2, const void *const *srcs, int ns,
                          int64_t n, int div);

/* The kernels once per ISA (reduce_t.h): g_reduce_scalar, _avx2, _avx512,
 * each after its f16 block conversions (f16_in_<ISA>: m halves to floats;
 * f16_out_<ISA>: m floats to halves, rounded to nearest even). The AVX
 * ones convert a whole vector at a time, the tail through a zeroed one. */
static void f16_in_scalar(const uint16_t *s, float *d, int m) {
    for (int i = 0; i < m; i++) d[i] = f16_f32(s[i]);
}
static void f16_out_scalar(const float *a, uint16_t *d, int m) {
    for (int i = 0; i < m; i++) d[i] = f32_f16(a[i]);
}
#define SUF scalar
#include "reduce_t.h"
#undef SUF

#if FG_HAVE_ISA_TARGETS
/* F16_BLOCKS(isa, V, H, W, cvt_in, cvt_out): the two conversions with
 * vectors V of W floats and H of W halves */
#define F16_BLOCKS(isa, V, H, W, cvt_in, cvt_out)                                                  \
    static inline V isa##_in1(const uint16_t *s) {                                                 \
        H h;                                                                                       \
        memcpy(&h, s, sizeof h);                                                                   \
        return cvt_in(h);                                                                          \
    }                                                                                              \
    static void f16_in_##isa(const uint16_t *s, float *d, int m) {                                 \
        int i = 0;                                                                                 \
        for (; i + W <= m; i += W) {                                                               \
            V v = isa##_in1(s + i);                                                                \
            memcpy(d + i, &v, sizeof v);                                                           \
        }                                                                                          \
        if (i < m) {                                                                               \
            uint16_t t[W] = {0};                                                                   \
            memcpy(t, s + i, sizeof(uint16_t) * (size_t)(m - i));                                  \
            V v = isa##_in1(t);                                                                    \
            memcpy(d + i, &v, sizeof(float) * (size_t)(m - i));                                    \
        }                                                                                          \
    }                                                                                              \
    static void f16_out_##isa(const float *a, uint16_t *d, int m) {                                \
        int i = 0;                                                                                 \
        for (; i + W <= m; i += W) {                                                               \
            V v;                                                                                   \
            memcpy(&v, a + i, sizeof v);                                                           \
            H h = cvt_out(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);                       \
            memcpy(d + i, &h, sizeof h);                                                           \
        }                                                                                          \
        if (i < m) {                                                                               \
            float t[W] = {0};                                                                      \
            memcpy(t, a + i, sizeof(float) * (size_t)(m - i));                                     \
            V v;                                                                                   \
            memcpy(&v, t, sizeof v);                                                               \
            H h = cvt_out(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);                       \
            memcpy(d + i, &h, sizeof(uint16_t) * (size_t)(m - i));                                 \
        }                                                                                          \
    }

FG_TARGET_AVX2_BEGIN
F16_BLOCKS(avx2, __m256, __m128i, 8, _mm256_cvtph_ps, _mm256_cvtps_ph)
#define SUF avx2
#include "reduce_t.h"
#undef SUF
FG_TARGET_END

FG_TARGET_AVX512_BEGIN
F16_BLOCKS(avx512, __m512, __m256i, 16, _mm512_cvtph_ps, _mm512_cvtps_ph)
#define SUF avx512
#include "reduce_t.h"
#undef SUF
FG_TARGET_END
#endif

static const reduce_fn *const g_reduce[FG_ISA_COUNT] = {
    [FG_ISA_SCALAR] = g_reduce_scalar,
#if FG_HAVE_ISA_TARGETS
    [FG_ISA_AVX2] = g_reduce_avx2,
    [FG_ISA_AVX512] = g_reduce_avx512,
#else
    [FG_ISA_AVX2] = g_reduce_scalar,
    [FG_ISA_AVX512] = g_reduce_scalar,
#endif
};

void fg__reduce(fg_dtype dt, fg_reduce_op op, void *dst, void *dst2, const void *const *srcs,
                int nsrc, int64_t n, int divisor) {
    reduce_fn f = (int)dt >= 0 && dt < FG_DTYPE_COUNT ? g_reduce[fg_cpu_isa()][dt] : NULL;
    if (n > 0 && f) f(op, dst, dst2, srcs, nsrc, n, divisor);
}

/* Copies with non-temporal stores when `nt`: for outputs too large to stay
 * in cache, skipping the destination's read-for-ownership saves a third of
 * the memory traffic of a plain memcpy. Stores of 16 bytes (SSE2, in every
 * x86-64), 32 (AVX2) or 64 (AVX-512) by the ISA in use: the loop is
 * memory-bound on each, the wider stores only take fewer instructions.
 * NT_COPY(name, V, load, stream) defines name(d, s, body): body bytes, a
 * multiple of 4 vectors, d aligned to a vector. */
#define NT_COPY(name, V, load, stream)                                                             \
    static void name(char *d, const char *s, size_t body) {                                        \
        for (size_t i = 0; i < body; i += 4 * sizeof(V)) {                                         \
            V a = load((const V *)(s + i)), b = load((const V *)(s + i + sizeof(V)));              \
            V c = load((const V *)(s + i + 2 * sizeof(V)));                                        \
            V e = load((const V *)(s + i + 3 * sizeof(V)));                                        \
            stream((V *)(d + i), a);                                                               \
            stream((V *)(d + i + sizeof(V)), b);                                                   \
            stream((V *)(d + i + 2 * sizeof(V)), c);                                               \
            stream((V *)(d + i + 3 * sizeof(V)), e);                                               \
        }                                                                                          \
    }

#if FG_HAVE_ISA_TARGETS
NT_COPY(nt_copy_sse2, __m128i, _mm_loadu_si128, _mm_stream_si128)
FG_TARGET_AVX2_BEGIN
NT_COPY(nt_copy_avx2, __m256i, _mm256_loadu_si256, _mm256_stream_si256)
FG_TARGET_END
FG_TARGET_AVX512_BEGIN
static inline __m512i load512(const __m512i *p) { return _mm512_loadu_si512((const void *)p); }
static inline void stream512(__m512i *p, __m512i v) { _mm512_stream_si512((void *)p, v); }
NT_COPY(nt_copy_avx512, __m512i, load512, stream512)
FG_TARGET_END

static void (*const g_nt_copy[FG_ISA_COUNT])(char *, const char *, size_t) = {
    [FG_ISA_SCALAR] = nt_copy_sse2,
    [FG_ISA_AVX2] = nt_copy_avx2,
    [FG_ISA_AVX512] = nt_copy_avx512,
};
#endif

void fg__copy(void *dst, const void *src, size_t n, bool nt) {
#if FG_HAVE_ISA_TARGETS
    if (nt && n >= 4096) {
        size_t head = (64 - ((uintptr_t)dst & 63)) & 63;
        memcpy(dst, src, head);
        char *d = (char *)dst + head;
        const char *s = (const char *)src + head;
        size_t body = (n - head) & ~(size_t)255;
        g_nt_copy[fg_cpu_isa()](d, s, body);
        _mm_sfence();
        memcpy(d + body, s + body, n - head - body);
        return;
    }
#endif
    (void)nt;
    memcpy(dst, src, n);
}
