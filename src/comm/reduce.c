/* Reduction kernels: dst = op(src0, src1, ..., srcN-1) element-wise, always
 * in source order, so that the same inputs give the same bits whoever runs
 * the kernel. Blocks of BLK elements are accumulated in a small stack buffer
 * (f32 for bf16/f16, a wider integer where a sum could overflow before the
 * final wrap) and written once; the loops are plain C that the compiler
 * vectorises (the file is built at O3). */
#pragma GCC optimize("O3")
#include <string.h>

#include "comm_impl.h"

#if defined(__x86_64__)
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

/* One kernel per (element type, accumulator type). COMBINE(acc, x) folds one
 * more source; FIN(acc) finishes (avg). */
#define DEFINE_KERNEL(NAME, ET, AT, LOAD, STORE)                                                   \
    static void NAME(fg_reduce_op op, ET *dst, ET *dst2, const ET *const *s, int ns, int64_t n,    \
                     int div) {                                                                    \
        AT acc[BLK];                                                                               \
        for (int64_t b = 0; b < n; b += BLK) {                                                     \
            int m = n - b < BLK ? (int)(n - b) : BLK;                                              \
            const ET *s0 = s[0] + b;                                                               \
            for (int i = 0; i < m; i++) acc[i] = (AT)LOAD(s0[i]);                                  \
            for (int q = 1; q < ns; q++) {                                                         \
                const ET *sq = s[q] + b;                                                           \
                switch (op) {                                                                      \
                case FG_SUM:                                                                       \
                case FG_AVG:                                                                       \
                    for (int i = 0; i < m; i++) acc[i] = (AT)(acc[i] + (AT)LOAD(sq[i]));           \
                    break;                                                                         \
                case FG_PROD:                                                                      \
                    for (int i = 0; i < m; i++) acc[i] = (AT)(acc[i] * (AT)LOAD(sq[i]));           \
                    break;                                                                         \
                case FG_MIN:                                                                       \
                    for (int i = 0; i < m; i++) {                                                  \
                        AT x = (AT)LOAD(sq[i]);                                                    \
                        acc[i] = x < acc[i] ? x : acc[i];                                          \
                    }                                                                              \
                    break;                                                                         \
                case FG_MAX:                                                                       \
                    for (int i = 0; i < m; i++) {                                                  \
                        AT x = (AT)LOAD(sq[i]);                                                    \
                        acc[i] = x > acc[i] ? x : acc[i];                                          \
                    }                                                                              \
                    break;                                                                         \
                default: break;                                                                    \
                }                                                                                  \
            }                                                                                      \
            if (op == FG_AVG) AVG_##NAME(acc, m, div);                                             \
            ET *d = dst + b;                                                                       \
            for (int i = 0; i < m; i++) d[i] = STORE(acc[i]);                                      \
            if (dst2) {                                                                            \
                ET *d2 = dst2 + b;                                                                 \
                for (int i = 0; i < m; i++) d2[i] = STORE(acc[i]);                                 \
            }                                                                                      \
        }                                                                                          \
    }

/* avg: floats divide (correctly rounded); integers divide truncating toward
 * zero after the (wrapped) sum in the element type. */
static inline void AVG_red_f64(double *a, int m, int div) {
    for (int i = 0; i < m; i++) a[i] /= (double)div;
}
static inline void AVG_red_f32(float *a, int m, int div) {
    for (int i = 0; i < m; i++) a[i] /= (float)div;
}
#define AVG_red_bf16 AVG_red_f32
#define AVG_red_f16 AVG_red_f32
static inline void AVG_red_u8(uint32_t *a, int m, int div) {
    for (int i = 0; i < m; i++) a[i] = (uint8_t)a[i] / (uint32_t)div;
}
static inline void AVG_red_u16(uint32_t *a, int m, int div) {
    for (int i = 0; i < m; i++) a[i] = (uint16_t)a[i] / (uint32_t)div;
}

#define I32_STORE(x) ((int32_t)(uint32_t)(uint64_t)(x))
#define I64_LOAD(x) ((uint64_t)(x))
#define I64_STORE(x) ((int64_t)(x))
#define U8_STORE(x) ((uint8_t)(x))

DEFINE_KERNEL(red_f64, double, double, IDENT, IDENT)
DEFINE_KERNEL(red_f32, float, float, IDENT, IDENT)
DEFINE_KERNEL(red_bf16, uint16_t, float, bf16_f32, f32_bf16)
DEFINE_KERNEL(red_f16, uint16_t, float, f16_f32, f32_f16)
DEFINE_KERNEL(red_u8, uint8_t, uint32_t, IDENT, U8_STORE)
#define U16_STORE(x) ((uint16_t)(x))
DEFINE_KERNEL(red_u16, uint16_t, uint32_t, IDENT, U16_STORE)

/* Signed integers: min/max compare signed values, sum/prod wrap. The sum
 * and product are done in unsigned arithmetic (no undefined overflow). */
static void red_i32(fg_reduce_op op, int32_t *dst, int32_t *dst2, const int32_t *const *s, int ns,
                    int64_t n, int div) {
    int32_t acc[BLK];
    for (int64_t b = 0; b < n; b += BLK) {
        int m = n - b < BLK ? (int)(n - b) : BLK;
        for (int i = 0; i < m; i++) acc[i] = s[0][b + i];
        for (int q = 1; q < ns; q++) {
            const int32_t *sq = s[q] + b;
            if (op == FG_SUM || op == FG_AVG)
                for (int i = 0; i < m; i++) acc[i] = (int32_t)((uint32_t)acc[i] + (uint32_t)sq[i]);
            else if (op == FG_PROD)
                for (int i = 0; i < m; i++) acc[i] = (int32_t)((uint32_t)acc[i] * (uint32_t)sq[i]);
            else if (op == FG_MIN)
                for (int i = 0; i < m; i++) acc[i] = sq[i] < acc[i] ? sq[i] : acc[i];
            else
                for (int i = 0; i < m; i++) acc[i] = sq[i] > acc[i] ? sq[i] : acc[i];
        }
        if (op == FG_AVG)
            for (int i = 0; i < m; i++) acc[i] /= div;
        memcpy(dst + b, acc, (size_t)m * 4);
        if (dst2) memcpy(dst2 + b, acc, (size_t)m * 4);
    }
}

static void red_i64(fg_reduce_op op, int64_t *dst, int64_t *dst2, const int64_t *const *s, int ns,
                    int64_t n, int div) {
    int64_t acc[BLK];
    for (int64_t b = 0; b < n; b += BLK) {
        int m = n - b < BLK ? (int)(n - b) : BLK;
        for (int i = 0; i < m; i++) acc[i] = s[0][b + i];
        for (int q = 1; q < ns; q++) {
            const int64_t *sq = s[q] + b;
            if (op == FG_SUM || op == FG_AVG)
                for (int i = 0; i < m; i++) acc[i] = (int64_t)((uint64_t)acc[i] + (uint64_t)sq[i]);
            else if (op == FG_PROD)
                for (int i = 0; i < m; i++) acc[i] = (int64_t)((uint64_t)acc[i] * (uint64_t)sq[i]);
            else if (op == FG_MIN)
                for (int i = 0; i < m; i++) acc[i] = sq[i] < acc[i] ? sq[i] : acc[i];
            else
                for (int i = 0; i < m; i++) acc[i] = sq[i] > acc[i] ? sq[i] : acc[i];
        }
        if (op == FG_AVG)
            for (int i = 0; i < m; i++) acc[i] /= div;
        memcpy(dst + b, acc, (size_t)m * 8);
        if (dst2) memcpy(dst2 + b, acc, (size_t)m * 8);
    }
}

void fg__reduce(fg_dtype dt, fg_reduce_op op, void *dst, void *dst2, const void *const *srcs,
                int nsrc, int64_t n, int divisor) {
    if (n <= 0) return;
    switch (dt) {
    case FG_F64: red_f64(op, dst, dst2, (const double *const *)srcs, nsrc, n, divisor); break;
    case FG_F32: red_f32(op, dst, dst2, (const float *const *)srcs, nsrc, n, divisor); break;
    case FG_BF16: red_bf16(op, dst, dst2, (const uint16_t *const *)srcs, nsrc, n, divisor); break;
    case FG_F16: red_f16(op, dst, dst2, (const uint16_t *const *)srcs, nsrc, n, divisor); break;
    case FG_I32: red_i32(op, dst, dst2, (const int32_t *const *)srcs, nsrc, n, divisor); break;
    case FG_I64: red_i64(op, dst, dst2, (const int64_t *const *)srcs, nsrc, n, divisor); break;
    case FG_U8: red_u8(op, dst, dst2, (const uint8_t *const *)srcs, nsrc, n, divisor); break;
    case FG_U16: red_u16(op, dst, dst2, (const uint16_t *const *)srcs, nsrc, n, divisor); break;
    default: break;
    }
}

/* Copies with non-temporal stores when `nt`: for outputs too large to stay
 * in cache, skipping the destination's read-for-ownership saves a third of
 * the memory traffic of a plain memcpy. */
void fg__copy(void *dst, const void *src, size_t n, bool nt) {
#if defined(__AVX512F__)
    if (nt && n >= 4096) {
        size_t head = (64 - ((uintptr_t)dst & 63)) & 63;
        memcpy(dst, src, head);
        char *d = (char *)dst + head;
        const char *s = (const char *)src + head;
        size_t body = (n - head) & ~(size_t)255;
        for (size_t i = 0; i < body; i += 256) {
            __m512i a = _mm512_loadu_si512((const void *)(s + i));
            __m512i b = _mm512_loadu_si512((const void *)(s + i + 64));
            __m512i c = _mm512_loadu_si512((const void *)(s + i + 128));
            __m512i e = _mm512_loadu_si512((const void *)(s + i + 192));
            _mm512_stream_si512((void *)(d + i), a);
            _mm512_stream_si512((void *)(d + i + 64), b);
            _mm512_stream_si512((void *)(d + i + 128), c);
            _mm512_stream_si512((void *)(d + i + 192), e);
        }
        _mm_sfence();
        memcpy(d + body, s + body, n - head - body);
        return;
    }
#endif
    (void)nt;
    memcpy(dst, src, n);
}
