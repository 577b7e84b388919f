/* The reduction kernels for one ISA, included by reduce.c once per ISA with
 * SUF set (scalar, avx2, avx512) inside that ISA's target region: plain C
 * loops the compiler vectorises for it. Defines reduce_fn g_reduce_<SUF>
 * [FG_DTYPE_COUNT]. Each element is combined with the same operations in
 * the same source order on every ISA, so every path gives the same bits. */
#define RCAT_(a, b) a##_##b
#define RCAT(a, b) RCAT_(a, b)
#define RN(name) RCAT(name, SUF)

/* Two sources (two ranks, the common case): one fused pass, each output
 * element computed in registers as op(s0, s1) (then AVG1 for FG_REDUCE_OP_AVG) and
 * stored to dst (and dst2): the same operations as the blocked loop below,
 * without its round trips through the block buffer. The outputs may be the
 * sources themselves (same index), never shifted copies of them: each
 * element is read before it is written, so ivdep holds. FUSE2_LOOP(..., EXPR)
 * runs the loop with x = EXPR (a, b the loaded elements). */
#define FUSE2_LOOP(ET, AT, LOAD, STORE, EXPR)                                                      \
    do {                                                                                           \
        if (dst2) {                                                                                \
            _Pragma("GCC ivdep") for (int64_t i = 0; i < n; i++) {                                 \
                AT a = (AT)LOAD(s0[i]), b = (AT)LOAD(s1[i]);                                       \
                AT x = (AT)(EXPR);                                                                 \
                ET y = STORE(x);                                                                   \
                dst[i] = y;                                                                        \
                dst2[i] = y;                                                                       \
            }                                                                                      \
        } else {                                                                                   \
            _Pragma("GCC ivdep") for (int64_t i = 0; i < n; i++) {                                 \
                AT a = (AT)LOAD(s0[i]), b = (AT)LOAD(s1[i]);                                       \
                AT x = (AT)(EXPR);                                                                 \
                dst[i] = STORE(x);                                                                 \
            }                                                                                      \
        }                                                                                          \
    } while (0)

#define FUSE2(ET, AT, LOAD, STORE, AVG1, UT)                                                       \
    if (ns == 2) {                                                                                 \
        const ET *s0 = s[0], *s1 = s[1];                                                           \
        if (op == FG_REDUCE_OP_SUM) FUSE2_LOOP(ET, AT, LOAD, STORE, (UT)a + (UT)b);                \
        else if (op == FG_REDUCE_OP_AVG)                                                           \
            FUSE2_LOOP(ET, AT, LOAD, STORE, AVG1((AT)((UT)a + (UT)b), div));                       \
        else if (op == FG_REDUCE_OP_PROD) FUSE2_LOOP(ET, AT, LOAD, STORE, (UT)a *(UT)b);           \
        else if (op == FG_REDUCE_OP_MIN) FUSE2_LOOP(ET, AT, LOAD, STORE, b < a ? b : a);           \
        else FUSE2_LOOP(ET, AT, LOAD, STORE, b > a ? b : a);                                       \
        return;                                                                                    \
    }

/* One kernel per (element type, accumulator type): acc = LOAD(s0), then
 * acc = op(acc, LOAD(sq)) for q = 1.., then AVG(acc) for FG_REDUCE_OP_AVG, and
 * dst = STORE(acc), per block of BLK elements (two sources: FUSE2). */
#define DEFINE_KERNEL(NAME, ET, AT, LOAD, STORE, AVG, AVG1)                                        \
    static void RN(NAME)(fg_reduce_op op, void *dst_, void *dst2_, const void *const *s_, int ns,  \
                         int64_t n, int div) {                                                     \
        ET *dst = dst_, *dst2 = dst2_;                                                             \
        const ET *const *s = (const ET *const *)s_;                                                \
        FUSE2(ET, AT, LOAD, STORE, AVG1, AT)                                                       \
        AT acc[BLK];                                                                               \
        for (int64_t b = 0; b < n; b += BLK) {                                                     \
            int m = n - b < BLK ? (int)(n - b) : BLK;                                              \
            const ET *s0 = s[0] + b;                                                               \
            for (int i = 0; i < m; i++) acc[i] = (AT)LOAD(s0[i]);                                  \
            for (int q = 1; q < ns; q++) {                                                         \
                const ET *sq = s[q] + b;                                                           \
                if (op == FG_REDUCE_OP_SUM || op == FG_REDUCE_OP_AVG)                              \
                    for (int i = 0; i < m; i++) acc[i] = (AT)(acc[i] + (AT)LOAD(sq[i]));           \
                else if (op == FG_REDUCE_OP_PROD)                                                  \
                    for (int i = 0; i < m; i++) acc[i] = (AT)(acc[i] * (AT)LOAD(sq[i]));           \
                else if (op == FG_REDUCE_OP_MIN)                                                   \
                    for (int i = 0; i < m; i++) {                                                  \
                        AT x = (AT)LOAD(sq[i]);                                                    \
                        acc[i] = x < acc[i] ? x : acc[i];                                          \
                    }                                                                              \
                else if (op == FG_REDUCE_OP_MAX)                                                   \
                    for (int i = 0; i < m; i++) {                                                  \
                        AT x = (AT)LOAD(sq[i]);                                                    \
                        acc[i] = x > acc[i] ? x : acc[i];                                          \
                    }                                                                              \
            }                                                                                      \
            if (op == FG_REDUCE_OP_AVG) AVG(acc, m, div);                                          \
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
/* the same divisions, one element at a time (FUSE2) */
#define AVG1_F64(x, d) ((x) / (double)(d))
#define AVG1_F32(x, d) ((x) / (float)(d))
#define AVG1_U8(x, d) ((uint32_t)(uint8_t)(x) / (uint32_t)(d))
#define AVG1_U16(x, d) ((uint32_t)(uint16_t)(x) / (uint32_t)(d))
#define AVG1_INT(x, d) ((x) / (d))
DEFINE_KERNEL(red_f64, double, double, IDENT, IDENT, RN(avg_f64), AVG1_F64)
DEFINE_KERNEL(red_f32, float, float, IDENT, IDENT, RN(avg_f32), AVG1_F32)
DEFINE_KERNEL(red_bf16, uint16_t, float, bf16_f32, f32_bf16, RN(avg_f32), AVG1_F32)
DEFINE_KERNEL(red_u8, uint8_t, uint32_t, IDENT, U8_STORE, RN(avg_u8), AVG1_U8)
DEFINE_KERNEL(red_u16, uint16_t, uint32_t, IDENT, U16_STORE, RN(avg_u16), AVG1_U16)

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
            if (op == FG_REDUCE_OP_SUM || op == FG_REDUCE_OP_AVG)
                for (int i = 0; i < m; i++) acc[i] = acc[i] + x[i];
            else if (op == FG_REDUCE_OP_PROD)
                for (int i = 0; i < m; i++) acc[i] = acc[i] * x[i];
            else if (op == FG_REDUCE_OP_MIN)
                for (int i = 0; i < m; i++) acc[i] = x[i] < acc[i] ? x[i] : acc[i];
            else if (op == FG_REDUCE_OP_MAX)
                for (int i = 0; i < m; i++) acc[i] = x[i] > acc[i] ? x[i] : acc[i];
        }
        if (op == FG_REDUCE_OP_AVG) RN(avg_f32)(acc, m, div);
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
    FUSE2(int32_t, int32_t, IDENT, IDENT, AVG1_INT, uint32_t)
    int32_t acc[BLK];
    for (int64_t b = 0; b < n; b += BLK) {
        int m = n - b < BLK ? (int)(n - b) : BLK;
        for (int i = 0; i < m; i++) acc[i] = s[0][b + i];
        for (int q = 1; q < ns; q++) {
            const int32_t *sq = s[q] + b;
            if (op == FG_REDUCE_OP_SUM || op == FG_REDUCE_OP_AVG)
                for (int i = 0; i < m; i++) acc[i] = (int32_t)((uint32_t)acc[i] + (uint32_t)sq[i]);
            else if (op == FG_REDUCE_OP_PROD)
                for (int i = 0; i < m; i++) acc[i] = (int32_t)((uint32_t)acc[i] * (uint32_t)sq[i]);
            else if (op == FG_REDUCE_OP_MIN)
                for (int i = 0; i < m; i++) acc[i] = sq[i] < acc[i] ? sq[i] : acc[i];
            else
                for (int i = 0; i < m; i++) acc[i] = sq[i] > acc[i] ? sq[i] : acc[i];
        }
        if (op == FG_REDUCE_OP_AVG)
            for (int i = 0; i < m; i++) acc[i] /= div;
        memcpy(dst + b, acc, (size_t)m * 4);
        if (dst2) memcpy(dst2 + b, acc, (size_t)m * 4);
    }
}

static void RN(red_i64)(fg_reduce_op op, void *dst_, void *dst2_, const void *const *s_, int ns,
                        int64_t n, int div) {
    int64_t *dst = dst_, *dst2 = dst2_;
    const int64_t *const *s = (const int64_t *const *)s_;
    FUSE2(int64_t, int64_t, IDENT, IDENT, AVG1_INT, uint64_t)
    int64_t acc[BLK];
    for (int64_t b = 0; b < n; b += BLK) {
        int m = n - b < BLK ? (int)(n - b) : BLK;
        for (int i = 0; i < m; i++) acc[i] = s[0][b + i];
        for (int q = 1; q < ns; q++) {
            const int64_t *sq = s[q] + b;
            if (op == FG_REDUCE_OP_SUM || op == FG_REDUCE_OP_AVG)
                for (int i = 0; i < m; i++) acc[i] = (int64_t)((uint64_t)acc[i] + (uint64_t)sq[i]);
            else if (op == FG_REDUCE_OP_PROD)
                for (int i = 0; i < m; i++) acc[i] = (int64_t)((uint64_t)acc[i] * (uint64_t)sq[i]);
            else if (op == FG_REDUCE_OP_MIN)
                for (int i = 0; i < m; i++) acc[i] = sq[i] < acc[i] ? sq[i] : acc[i];
            else
                for (int i = 0; i < m; i++) acc[i] = sq[i] > acc[i] ? sq[i] : acc[i];
        }
        if (op == FG_REDUCE_OP_AVG)
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
#undef FUSE2
#undef FUSE2_LOOP
#undef AVG1_F64
#undef AVG1_F32
#undef AVG1_U8
#undef AVG1_U16
#undef AVG1_INT
#undef RN
#undef RCAT
#undef RCAT_
