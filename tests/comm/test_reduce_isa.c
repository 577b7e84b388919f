/* The reduction kernels and the non-temporal copy (comm/reduce.c) on every
 * ISA path this CPU can run, forced through fg_set_cpu_isa (a path the CPU
 * lacks is skipped with the reason): every dtype and op, 1 to 5 sources,
 * sizes across the kernels' block, in place and with a second output, on
 * raw bit patterns (NaN, infinities, signed zeros, subnormals) — the same
 * bits as the scalar path. test_comm checks the scalar references. */
#include "comm/comm_impl.h"
#include "harness.h"

enum { S = 5, NMAX = 5000 };
static const int64_t SIZES[] = {1, 7, 31, 511, 513, 1037, NMAX};

static void on_path(fg_isa isa, void (*fn)(fg_isa)) {
    if (fg_set_cpu_isa(isa) != FG_OK) SKIP("%s path: %s", fg_isa_name(isa), fg_last_error());
    fn(isa);
    CHECK_OK(fg_set_cpu_isa(FG_ISA_AUTO));
}

#define ISA_TEST(name)                                                                             \
    static void name(fg_isa isa);                                                                  \
    TEST(name##_scalar) { on_path(FG_ISA_SCALAR, name); }                                          \
    TEST(name##_avx2) { on_path(FG_ISA_AVX2, name); }                                              \
    TEST(name##_avx512) { on_path(FG_ISA_AVX512, name); }                                          \
    static void name(fg_isa isa)

/* Source q of dtype dt, NMAX elements: random values with specials mixed in
 * (floats), or random bits (halves, integers). */
static void fill(fg_dtype dt, int q, void *out) {
    fg_rng r = {100 + (uint64_t)dt, (uint64_t)q << 20};
    static const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, -3e38f, 1.0f};
    for (int i = 0; i < NMAX; i++) {
        uint32_t u = fg_rng_u32(&r);
        float v = (float)((double)(int32_t)u * 1e-7);
        if (u % 13 == 0) v = special[(u >> 8) % 8];
        switch (dt) {
        case FG_F64: ((double *)out)[i] = (double)v * 1.0000001; break;
        case FG_F32: ((float *)out)[i] = v; break;
        case FG_I64: ((int64_t *)out)[i] = (int64_t)((uint64_t)u << 32 | fg_rng_u32(&r)); break;
        case FG_I32: ((int32_t *)out)[i] = (int32_t)u; break;
        case FG_U8: ((uint8_t *)out)[i] = (uint8_t)u; break;
        default: /* bf16, f16, u16: any bits */ ((uint16_t *)out)[i] = (uint16_t)u; break;
        }
    }
}

ISA_TEST(reduce_gives_the_scalar_paths_bits) {
    static _Alignas(64) unsigned char src[S][NMAX * 8], out[NMAX * 8], want[NMAX * 8],
        out2[NMAX * 8], inpl[NMAX * 8];
    for (int d = 0; d < FG_DTYPE_COUNT; d++) {
        fg_dtype dt = (fg_dtype)d;
        if (!fg_dtype_valid(d)) continue;
        size_t es = fg_dtype_size(dt);
        for (int q = 0; q < S; q++) fill(dt, q, src[q]);
        for (int op = 0; op < FG_REDUCE_OP_COUNT; op++)
            for (int ns = 1; ns <= S; ns++)
                for (size_t si = 0; si < sizeof SIZES / sizeof SIZES[0]; si++) {
                    int64_t n = SIZES[si];
                    const void *p[S];
                    for (int q = 0; q < ns; q++) p[q] = src[q];
                    CHECK_OK(fg_set_cpu_isa(FG_ISA_SCALAR));
                    fg__reduce(dt, (fg_reduce_op)op, want, NULL, p, ns, n, ns);
                    CHECK_OK(fg_set_cpu_isa(isa));
                    fg__reduce(dt, (fg_reduce_op)op, out, out2, p, ns, n, ns);
                    /* in place: the output over the first source */
                    memcpy(inpl, src[0], (size_t)n * es);
                    p[0] = inpl;
                    fg__reduce(dt, (fg_reduce_op)op, inpl, NULL, p, ns, n, ns);
                    size_t nb = (size_t)n * es;
                    CHECK_MSG(memcmp(out, want, nb) == 0 && memcmp(out2, want, nb) == 0 &&
                                  memcmp(inpl, want, nb) == 0,
                              "%s %s %s, %d sources, n %lld: not the scalar path's bits",
                              fg_isa_name(isa), fg_dtype_name(dt),
                              fg_reduce_op_name((fg_reduce_op)op), ns, (long long)n);
                }
    }
}

ISA_TEST(nt_copy_is_memcpy) {
    enum { N = 100013 };
    static unsigned char src[N + 64], dst[N + 64], want[N + 64];
    fg_rng r = {9, 0};
    for (int i = 0; i < N + 64; i++) src[i] = (unsigned char)fg_rng_u32(&r);
    size_t sizes[] = {0, 1, 255, 4095, 4096, 4097, 8191, 65536 + 5, N};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
        for (int so = 0; so < 3; so++)
            for (int dof = 0; dof < 3; dof++) {
                size_t n = sizes[k];
                memset(dst, 0xAB, sizeof dst);
                memset(want, 0xAB, sizeof want);
                memcpy(want + dof * 17, src + so * 5, n);
                fg__copy(dst + dof * 17, src + so * 5, n, true);
                CHECK_MSG(memcmp(dst, want, sizeof dst) == 0,
                          "%s copy of %zu bytes (src +%d, dst +%d) differs from memcpy",
                          fg_isa_name(isa), n, so * 5, dof * 17);
            }
}
