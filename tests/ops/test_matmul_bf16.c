/* The internal bf16 matmul (oneDNN) against products computed here in
 * double: on the bf16-rounded inputs it must agree to f32 accumulation
 * error, and against the unrounded f32 inputs within bf16 rounding
 * (|error| <= 2 * 2^-8 * sum_k |a_mk b_kn|). Every transpose, alpha/beta,
 * batched, shared b (folded and broadcast), bf16 output, K = 0, errors.
 * Skips when the build has no oneDNN. */
#include <math.h>

#include "harness.h"
#include "ops/cpu/cpu_impl.h"

typedef struct {
    fg_tensor *t;  /* bf16 */
    float *exact;  /* the f32 values before rounding */
    float *rounded;
} bf_operand;

static bf_operand make(int nd, const int64_t *shape, uint64_t seed) {
    bf_operand o;
    o.t = fg_empty(FG_BF16, nd, shape);
    int64_t n = fg_tensor_numel(o.t);
    o.exact = malloc(sizeof(float) * (size_t)(n + 1));
    o.rounded = malloc(sizeof(float) * (size_t)(n + 1));
    fg_rng_fill_normal(seed, 0, o.exact, n, 0.0f, 1.0f);
    fg_convert(fg_tensor_data(o.t), FG_BF16, o.exact, FG_F32, n);
    fg_convert(o.rounded, FG_F32, fg_tensor_data(o.t), FG_BF16, n);
    return o;
}

static void drop(bf_operand *o) {
    free(o->exact);
    free(o->rounded);
}

static bool g_skip;

static void check_bf16(int bd, const int64_t *bdims, int64_t M, int64_t K, int64_t N, bool ta,
                       bool tb, bool shared, double alpha, double beta, fg_dtype cdt,
                       uint64_t seed) {
    int64_t sa[6], sb[6], sc[6];
    for (int d = 0; d < bd; d++) sa[d] = sb[d] = sc[d] = bdims[d];
    sa[bd] = ta ? K : M;
    sa[bd + 1] = ta ? M : K;
    int bnd = shared ? 2 : bd + 2, bo = shared ? 0 : bd;
    sb[bo] = tb ? N : K;
    sb[bo + 1] = tb ? K : N;
    sc[bd] = M;
    sc[bd + 1] = N;
    bf_operand a = make(bd + 2, sa, seed), b = make(bnd, sb, seed + 1);
    fg_tensor *c = fg_empty(cdt, bd + 2, sc);
    int64_t batch = 1, nc = fg_tensor_numel(c);
    for (int d = 0; d < bd; d++) batch *= bdims[d];
    float *c0 = malloc(sizeof(float) * (size_t)(nc + 1));
    fg_rng_fill_normal(seed + 2, 0, c0, nc, 0.0f, 1.0f);
    fg_convert(fg_tensor_data(c), cdt, c0, FG_F32, nc);
    fg_convert(c0, FG_F32, fg_tensor_data(c), cdt, nc); /* what c really holds */
    fg_status st = fg__cpu_matmul_bf16(a.t, ta, b.t, tb, c, alpha, beta);
    if (st == FG_EUNSUPPORTED && strstr(fg_last_error(), "no oneDNN")) {
        g_skip = true;
    } else {
        CHECK_OK(st);
        double worst_r = 0, worst_e = 0;
        for (int64_t i = 0; i < batch; i++)
            for (int64_t m = 0; m < M; m++)
                for (int64_t n = 0; n < N; n++) {
                    double sr = 0, se = 0, mag = 0;
                    for (int64_t k = 0; k < K; k++) {
                        int64_t ai = i * M * K + (ta ? k * M + m : m * K + k);
                        int64_t bi = (shared ? 0 : i * K * N) + (tb ? n * K + k : k * N + n);
                        sr += (double)a.rounded[ai] * b.rounded[bi];
                        se += (double)a.exact[ai] * b.exact[bi];
                        mag += fabs((double)a.exact[ai] * b.exact[bi]);
                    }
                    int64_t ci = (i * M + m) * N + n;
                    double old = beta == 0 ? 0 : beta * c0[ci];
                    double got = fg_tensor_get(c, ci), out_ulp = cdt == FG_BF16 ? 0x1p-8 : 0x1p-23;
                    double want_r = alpha * sr + old, want_e = alpha * se + old;
                    /* rounded inputs: f32 accumulation, plus the output's own rounding */
                    double er = fabs(got - want_r) /
                                (1e-5 * sqrt((double)K) * fabs(alpha) * mag + out_ulp * fabs(want_r) +
                                 1e-30);
                    /* exact inputs: bf16 rounding of both inputs bounds the error */
                    double ee = fabs(got - want_e) /
                                (2 * 0x1p-8 * fabs(alpha) * mag + 2 * out_ulp * fabs(want_e) +
                                 1e-5 * fabs(old) + 1e-30);
                    worst_r = fmax(worst_r, er);
                    worst_e = fmax(worst_e, ee);
                }
        CHECK_MSG(worst_r <= 1 && worst_e <= 1,
                  "batch %lld M %lld K %lld N %lld ta %d tb %d shared %d alpha %g beta %g c %s: "
                  "error / bound %g (rounded inputs), %g (exact inputs)",
                  (long long)batch, (long long)M, (long long)K, (long long)N, ta, tb, shared, alpha,
                  beta, fg_dtype_name(cdt), worst_r, worst_e);
    }
    free(c0);
    drop(&a);
    drop(&b);
}

TEST(matmul_bf16_matches_f32_within_bf16_rounding) {
    g_skip = false;
    static const int64_t sizes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 31, 13}, {64, 96, 48},
                                       {33, 257, 20}};
    uint64_t seed = 1;
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (int t = 0; t < 4; t++)
            check_bf16(0, NULL, sizes[s][0], sizes[s][1], sizes[s][2], t & 1, t & 2, true, 1, 0,
                       FG_F32, seed += 3);
    if (g_skip) SKIP("no oneDNN in this build");
    check_bf16(0, NULL, 9, 16, 11, false, true, true, 0.5, 1, FG_F32, 100); /* accumulate */
    check_bf16(0, NULL, 9, 16, 11, true, false, true, -2, 0.25, FG_F32, 101);
    check_bf16(0, NULL, 9, 16, 11, false, false, true, 1, 0, FG_BF16, 102); /* bf16 out */
    check_bf16(0, NULL, 9, 16, 11, false, true, true, 1, 1, FG_BF16, 103);
    int64_t b1[] = {3}, b2[] = {2, 2};
    for (int t = 0; t < 4; t++) {
        check_bf16(1, b1, 7, 12, 5, t & 1, t & 2, false, 1, 0, FG_F32, 200 + t); /* per entry b */
        check_bf16(2, b2, 6, 9, 10, t & 1, t & 2, true, 1, 1, FG_F32, 210 + t);  /* shared b */
    }
    fg_step_reset();
}

TEST(matmul_bf16_edges_and_errors) {
    int64_t s23[] = {2, 3}, s34[] = {3, 4}, s24[] = {2, 4}, s20[] = {2, 0}, s04[] = {0, 4};
    fg_tensor *c = fg_full(FG_F32, 2, s24, 2.0);
    fg_status st = fg__cpu_matmul_bf16(fg_zeros(FG_BF16, 2, s20), false, fg_zeros(FG_BF16, 2, s04),
                                       false, c, 1, 0.5);
    if (st == FG_EUNSUPPORTED) SKIP("no oneDNN in this build");
    CHECK_OK(st); /* K = 0: c = beta c */
    for (int i = 0; i < 8; i++) CHECK(fg_tensor_get(c, i) == 1.0);
    CHECK_STATUS(fg__cpu_matmul_bf16(fg_zeros(FG_F32, 2, s23), false, fg_zeros(FG_BF16, 2, s34),
                                     false, c, 1, 0),
                 FG_EUNSUPPORTED);
    CHECK_CONTAINS(fg_last_error(), "f32");
    CHECK_STATUS(fg__cpu_matmul_bf16(fg_zeros(FG_BF16, 2, s23), false, fg_zeros(FG_BF16, 2, s34),
                                     true, c, 1, 0),
                 FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "bf16[3, 4]^T");
    fg_step_reset();
}
