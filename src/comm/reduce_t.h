/* The reduction kernels for one ISA, included by reduce.c once per ISA with
 * SUF set (scalar, avx2, avx512) inside that ISA's target region: plain C
 * loops the compiler vectorises for it. Defines reduce_fn g_reduce_<SUF>
 * [FG_DTYPE_COUNT]. Each element is combined with the same operations in
 * the same source order on every ISA, so every path gives the same bits. */
#define RCAT_(a, b) a##_##b
#define RCAT(a, b) RCAT_(a, b)
#define RN(name) RCAT(name, SUF)

/* One kernel per (element type, accumulator type): acc = LOAD(s0), then
 * acc = op(acc, LOAD(sq)) for q = 1.., then AVG(acc) for FG_AVG, and
 * dst = STORE(acc), per block of BLK elements. */
#define DEFINE_KERNEL(NAME, ET, AT, LOAD, STORE, AVG)                                              \
    static void RN(NAME)(fg_reduce_op op, void *dst_, void *dst2_, const void *const *s_, int ns,  \
                         int64_t n, int div) {                                                     \
        ET *dst = dst_, *dst2 = dst2_;                                                             \
        const ET *const *s = (const ET *const *)s_;                                                \
        AT acc[BLK];                                                                               \
        for (int64_t b = 0; b < n; b += BLK) {                                                     \
            int m = n - b < BLK ? (int)(n - b) : BLK;                                              \
            const ET *s0 = s[0] + b;                                                               \
            for (int i = 0; i < m; i++) acc[i] = (AT)LOAD(s0[i]);                                  \
            for (int q = 1; q < ns; q++) {                                                         \
                const ET *sq = s[q] + b;                                                           \
                if (op == FG_SUM || op == FG_AVG)                                                  \
                    for (int i = 0; i < m; i++) acc[i] = (AT)(acc[i] + (AT)LOAD(sq[i]));           \
                else if (op == FG_PROD)                                                            \
                    for (int i = 0; i < m; i++) acc[i] = (AT)(acc[i] * (AT)LOAD(sq[i]));           \
                else if (op == FG_MIN)                                                             \
                    for (int i = 0; i < m; i++) {                                                  \
                        AT x = (AT)LOAD(sq[i]);                                                    \
                        acc[i] = x < acc[i] ? x : acc[i];                                          \
                    }                                                                              \
                else if (op == FG_MAX)                                                             \
                    for (int i = 0; i < m; i++) {                                                  \
                        AT x = (AT)LOAD(sq[i]);                                                    \
                        acc[i] = x > acc[i] ? x : acc[i];                                          \
                    }                                                                              \
            }                                                                                      \
            if (op == FG_AVG) AVG(acc, m, div);                                                    \
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
static inline void RN(avg_f64)(double *a, int m, int div) {
    for (int i = 0; i < m; i++) a[i] /= (double)div;
}
static inline void RN(avg_f32)(float *a, int m, int div) {
    for (int i = 0; i < m; i++) a[i] /= (float)div;
}
static inline void RN(avg_u8)(uint32_t *a, int m, int div) {
    for (int i = 0; i < m; i++) a[i] = (uint8_t)a[i] / (uint32_t)div;
}
static inline void RN(avg_u16)(uint32_t *a, int m, int div) {
    for (int i = 0; i < m; i++) a[i] = (uint16_t)a[i] / (uint32_t)div;
}
DEFINE_KERNEL(red_f64, double, double, IDENT, IDENT, RN(avg_f64))
DEFINE_KERNEL(red_f32, float, float, IDENT, IDENT, RN(avg_f32))
DEFINE_KERNEL(red_bf16, uint16_t, float, bf16_f32, f32_bf16, RN(avg_f32))
DEFINE_KERNEL(red_u8, uint8_t, uint32_t, IDENT, U8_STORE, RN(avg_u8))
DEFINE_KERNEL(red_u16, uint16_t, uint32_t, IDENT, U16_STORE, RN(avg_u16))

/* f16: each block of a source is widened into f32 by f16_in_<SUF> (F16C
 * on the AVX paths, as GCC does not vectorise _Float16 conversions), the
 * op runs on floats, and f16_out_<SUF> rounds the block back (to nearest
 * even, as the scalar conversion does). */
static void RN(red_f16)(fg_reduce_op op, void *dst_, void *dst2_, const void *const *s_, int ns,
                        int64_t n, int div) {
    uint16_t *dst = dst_, *dst2 = dst2_;
    const uint16_t *const *s = (const uint16_t *const *)s_;
    float acc[BLK], x[BLK];
    for (int64_t b = 0; b < n; b += BLK) {
        int m = n - b < BLK ? (int)(n - b) : BLK;
        RN(f16_in)(s[0] + b, acc, m);
        for (int q = 1; q < ns; q++) {
            RN(f16_in)(s[q] + b, x, m);
            if (op == FG_SUM || op == FG_AVG)
                for (int i = 0; i < m; i++) acc[i] = acc[i] + x[i];
            else if (op == FG_PROD)
                for (int i = 0; i < m; i++) acc[i] = acc[i] * x[i];
            else if (op == FG_MIN)
                for (int i = 0; i < m; i++) acc[i] = x[i] < acc[i] ? x[i] : acc[i];
            else if (op == FG_MAX)
                for (int i = 0; i < m; i++) acc[i] = x[i] > acc[i] ? x[i] : acc[i];
        }
        if (op == FG_AVG) RN(avg_f32)(acc, m, div);
        RN(f16_out)(acc, dst + b, m);
        if (dst2) memcpy(dst2 + b, dst + b, sizeof(uint16_t) * (size_t)m);
    }
}

/* i32 and i64 accumulate in the unsigned type of their width (sums and
 * products wrap); min and max compare as signed. */
static void RN(red_i32)(fg_reduce_op op, void *dst_, void *dst2_, const void *const *s_, int ns,
                        int64_t n, int div) {
    int32_t *dst = dst_, *dst2 = dst2_;
    const int32_t *const *s = (const int32_t *const *)s_;
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

static void RN(red_i64)(fg_reduce_op op, void *dst_, void *dst2_, const void *const *s_, int ns,
                        int64_t n, int div) {
    int64_t *dst = dst_, *dst2 = dst2_;
    const int64_t *const *s = (const int64_t *const *)s_;
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

static const reduce_fn RN(g_reduce)[FG_DTYPE_COUNT] = {
    [FG_F64] = RN(red_f64), [FG_F32] = RN(red_f32), [FG_BF16] = RN(red_bf16),
    [FG_F16] = RN(red_f16), [FG_I32] = RN(red_i32), [FG_I64] = RN(red_i64),
    [FG_U8] = RN(red_u8),   [FG_U16] = RN(red_u16),
};

#undef DEFINE_KERNEL
#undef RN
#undef RCAT
#undef RCAT_
