/* The bf16 matmul on every path this machine can run, against products
 * computed here in double: on the bf16-rounded inputs it must agree to f32
 * accumulation error, and against the unrounded f32 inputs within bf16
 * rounding (|error| <= 2 * 2^-8 * sum_k |a_mk b_kn|). Every transpose,
 * alpha/beta, batched, shared b (folded and broadcast), bf16 output, K = 0,
 * errors; once on the path the process chooses (FULGUR_MATMUL_BF16 and the
 * CPU), once on the f32 fallback, once on oneDNN's bf16 matmul where oneDNN
 * has one (else that part skips, saying why), and the two paths against
 * each other. Prints the line "matmul_bf16 path: ..." and checks the path
 * against the build, the CPU's flags and the environment (CTest runs this
 * file again with oneDNN capped to AVX2 and with the fallback forced). */
#include <ctype.h>
#include <math.h>

#include "fulgur/ops.h"
#include "harness.h"
#include "ops/cpu/cpu_impl.h"

typedef struct {
    fg_tensor *t; /* bf16 */
    float *exact; /* the f32 values before rounding */
    float *rounded;
} bf_operand;

static bf_operand make(int nd, const int64_t *shape, uint64_t seed) {
    bf_operand o;
    o.t = fg_empty(FG_BF16, nd, shape);
    int64_t n = fg_tensor_numel(o.t);
    o.exact = malloc(sizeof(float) * (size_t)(n + 1));
    o.rounded = malloc(sizeof(float) * (size_t)(n + 1));
    fg_rng_fill_normal(seed, 0, o.exact, n, 0.0f, 1.0f);
    CHECK_OK(fg_convert(fg_tensor_data(o.t), FG_BF16, o.exact, FG_F32, n));
    CHECK_OK(fg_convert(o.rounded, FG_F32, fg_tensor_data(o.t), FG_BF16, n));
    return o;
}

static void drop(bf_operand *o) {
    free(o->exact);
    free(o->rounded);
}

static const char *g_path_label = "auto"; /* which run, for the messages */

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
    CHECK_OK(fg_convert(fg_tensor_data(c), cdt, c0, FG_F32, nc));
    CHECK_OK(fg_convert(c0, FG_F32, fg_tensor_data(c), cdt, nc)); /* what c really holds */
    fg_status st = fg__cpu_matmul_bf16(a.t, ta, b.t, tb, c, alpha, beta);
    CHECK_MSG(st == FG_OK, "%s path: %s", g_path_label, fg_last_error());
    if (st == FG_OK) {
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
                    double er = fabs(got - want_r) / (1e-5 * sqrt((double)K) * fabs(alpha) * mag +
                                                      out_ulp * fabs(want_r) + 1e-30);
                    /* exact inputs: bf16 rounding of both inputs bounds the error */
                    double ee = fabs(got - want_e) /
                                (2 * 0x1p-8 * fabs(alpha) * mag + 2 * out_ulp * fabs(want_e) +
                                 1e-5 * fabs(old) + 1e-30);
                    worst_r = fmax(worst_r, er);
                    worst_e = fmax(worst_e, ee);
                }
        CHECK_MSG(worst_r <= 1 && worst_e <= 1,
                  "%s path: batch %lld M %lld K %lld N %lld ta %d tb %d shared %d alpha %g beta %g "
                  "c %s: error / bound %g (rounded inputs), %g (exact inputs)",
                  g_path_label, (long long)batch, (long long)M, (long long)K, (long long)N, ta, tb,
                  shared, alpha, beta, fg_dtype_name(cdt), worst_r, worst_e);
    }
    free(c0);
    drop(&a);
    drop(&b);
}

static void check_all_cases(void) {
    static const int64_t sizes[][3] = {
        {1, 1, 1}, {3, 5, 7}, {17, 31, 13}, {64, 96, 48}, {33, 257, 20}};
    uint64_t seed = 1;
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (int t = 0; t < 4; t++)
            check_bf16(0, NULL, sizes[s][0], sizes[s][1], sizes[s][2], t & 1, t & 2, true, 1, 0,
                       FG_F32, seed += 3);
    check_bf16(0, NULL, 9, 16, 11, false, true, true, 0.5, 1, FG_F32, 100); /* accumulate */
    check_bf16(0, NULL, 9, 16, 11, true, false, true, -2, 0.25, FG_F32, 101);
    check_bf16(0, NULL, 9, 16, 11, false, false, true, 1, 0, FG_BF16, 102); /* bf16 out */
    check_bf16(0, NULL, 9, 16, 11, false, true, true, 1, 1, FG_BF16, 103);
    check_bf16(0, NULL, 9, 16, 11, true, true, true, 0.5, -1, FG_BF16, 104);
    int64_t b1[] = {3}, b2[] = {2, 2};
    for (int t = 0; t < 4; t++) {
        check_bf16(1, b1, 7, 12, 5, t & 1, t & 2, false, 1, 0, FG_F32, 200 + t); /* per entry b */
        check_bf16(2, b2, 6, 9, 10, t & 1, t & 2, true, 1, 1, FG_F32, 210 + t);  /* shared b */
        check_bf16(1, b1, 5, 8, 6, t & 1, t & 2, t & 1, 2, 0.5, FG_BF16, 220 + t);
    }
    fg_step_reset();
}

static bool starts_with(const char *s, const char *prefix) {
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* Whether /proc/cpuinfo lists the flag (false where it cannot be read). */
static bool cpu_has(const char *flag) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return false;
    char line[8192], word[64];
    bool found = false;
    snprintf(word, sizeof word, " %s ", flag);
    while (!found && fgets(line, sizeof line, f)) {
        if (!starts_with(line, "flags")) continue;
        line[strcspn(line, "\n")] = ' ';
        found = strstr(line, word) != NULL;
        break;
    }
    fclose(f);
    return found;
}

/* Whether oneDNN is capped below AVX-512 by its own variables. */
static bool dnnl_capped_below_avx512(void) {
    const char *names[] = {"ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"};
    for (int i = 0; i < 2; i++) {
        const char *v = getenv(names[i]);
        if (!v || !*v) continue;
        char low[32] = {0};
        for (int j = 0; v[j] && j < 31; j++) low[j] = (char)tolower((unsigned char)v[j]);
        return !starts_with(low, "avx512") && strcmp(low, "all") != 0;
    }
    return false;
}

TEST(matmul_bf16_path_fits_the_machine) {
    const char *path = fg_matmul_bf16_path();
    printf("matmul_bf16 path: %s\n", path);
    const char *env = getenv("FULGUR_MATMUL_BF16");
    bool dnnl = strstr(fg_ops_blas_info(), "onednn") != NULL;
    if (env && *env && strcmp(env, "auto") && strcmp(env, "onednn") && strcmp(env, "fallback")) {
        /* a value that does not parse: every product fails, naming it */
        int64_t s22[] = {2, 2};
        CHECK_MSG(starts_with(path, "none ("), "path \"%s\"", path);
        CHECK_STATUS(fg__cpu_matmul_bf16(fg_zeros(FG_BF16, 2, s22), false,
                                         fg_zeros(FG_BF16, 2, s22), false, fg_zeros(FG_F32, 2, s22),
                                         1, 0),
                     FG_EINVAL);
        CHECK_CONTAINS(fg_last_error(), "FULGUR_MATMUL_BF16=\"");
        fg_step_reset();
    } else if (env && strcmp(env, "fallback") == 0) {
        CHECK_CONTAINS(path, "f32-fallback (FULGUR_MATMUL_BF16=fallback)");
    } else if (!dnnl) {
        CHECK_CONTAINS(path, "no oneDNN in this build");
    } else if (dnnl_capped_below_avx512() || !cpu_has("avx512f")) {
        /* oneDNN 2.x has no bf16 matmul below avx512_core */
        bool forced = env && strcmp(env, "onednn") == 0;
        CHECK_MSG(starts_with(path, forced ? "none (" : "f32-fallback ("),
                  "no AVX-512 for oneDNN here, yet the path is \"%s\"", path);
    } else if (cpu_has("avx512_bf16") || cpu_has("amx_bf16")) {
        CHECK_MSG(starts_with(path, "onednn-bf16 ("),
                  "oneDNN has bf16 hardware here, yet the path is \"%s\"", path);
    }
}

TEST(matmul_bf16_chosen_path_matches_f32_within_bf16_rounding) {
    static char path[400];
    snprintf(path, sizeof path, "%s", fg_matmul_bf16_path());
    if (starts_with(path, "none (")) SKIP("no bf16 path in this configuration: %s", path);
    g_path_label = path;
    check_all_cases();
}

TEST(matmul_bf16_fallback_matches_f32_within_bf16_rounding) {
    CHECK_OK(fg__matmul_bf16_set_mode("fallback"));
    g_path_label = "f32-fallback";
    CHECK_CONTAINS(fg_matmul_bf16_path(), "f32-fallback");
    check_all_cases();
    CHECK_OK(fg__matmul_bf16_set_mode(NULL));
}

TEST(matmul_bf16_onednn_matches_f32_within_bf16_rounding) {
    CHECK_OK(fg__matmul_bf16_set_mode("onednn"));
    const char *path = fg_matmul_bf16_path();
    if (starts_with(path, "none (")) {
        /* then a product must fail, saying why, rather than compute garbage */
        int64_t s22[] = {2, 2};
        CHECK_STATUS(fg__cpu_matmul_bf16(fg_zeros(FG_BF16, 2, s22), false,
                                         fg_zeros(FG_BF16, 2, s22), false, fg_zeros(FG_F32, 2, s22),
                                         1, 0),
                     FG_EUNSUPPORTED);
        CHECK_CONTAINS(fg_last_error(), "FULGUR_MATMUL_BF16=onednn, but");
        char why[400];
        snprintf(why, sizeof why, "%s", path);
        CHECK_OK(fg__matmul_bf16_set_mode(NULL));
        fg_step_reset();
        SKIP("oneDNN cannot run a bf16 matmul here: %s", why);
    }
    CHECK_MSG(starts_with(path, "onednn-bf16 ("), "path \"%s\"", path);
    g_path_label = "onednn-bf16";
    check_all_cases();
    CHECK_OK(fg__matmul_bf16_set_mode(NULL));
}

/* oneDNN and the fallback on the same operands: both accumulate in f32 and
 * round once, so they differ by the order of the f32 sums only. */
TEST(matmul_bf16_paths_agree) {
    char path[400];
    CHECK_OK(fg__matmul_bf16_set_mode("onednn"));
    snprintf(path, sizeof path, "%s", fg_matmul_bf16_path());
    CHECK_OK(fg__matmul_bf16_set_mode(NULL));
    if (!starts_with(path, "onednn-bf16")) SKIP("only the fallback can run here: %s", path);
    static const struct {
        int64_t batch, M, K, N;
        bool ta, tb, shared;
        double alpha, beta;
        fg_dtype cdt;
    } cases[] = {
        {1, 64, 96, 48, false, false, true, 1, 0, FG_F32},
        {1, 33, 257, 20, true, true, true, 0.5, 1, FG_F32},
        {3, 17, 40, 9, false, true, false, 1, 1, FG_BF16},
        {4, 128, 256, 64, true, false, true, 1, 0, FG_BF16},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int64_t B = cases[i].batch, M = cases[i].M, K = cases[i].K, N = cases[i].N;
        bool ta = cases[i].ta, tb = cases[i].tb, sh = cases[i].shared;
        int64_t sa[] = {B, ta ? K : M, ta ? M : K}, sb[] = {B, tb ? N : K, tb ? K : N};
        int64_t sc[] = {B, M, N};
        bf_operand a = make(3, sa, 300 + i), b = make(sh ? 2 : 3, sh ? sb + 1 : sb, 400 + i);
        fg_tensor *c[2];
        for (int p = 0; p < 2; p++) {
            c[p] = fg_empty(cases[i].cdt, 3, sc);
            float *c0 = malloc(sizeof(float) * (size_t)(B * M * N));
            fg_rng_fill_normal(500 + i, 0, c0, B * M * N, 0.0f, 1.0f);
            CHECK_OK(fg_convert(fg_tensor_data(c[p]), cases[i].cdt, c0, FG_F32, B * M * N));
            free(c0);
            CHECK_OK(fg__matmul_bf16_set_mode(p ? "fallback" : "onednn"));
            CHECK_OK(fg__cpu_matmul_bf16(a.t, ta, b.t, tb, c[p], cases[i].alpha, cases[i].beta));
        }
        CHECK_OK(fg__matmul_bf16_set_mode(NULL));
        double worst = 0;
        for (int64_t e = 0; e < B * M * N; e++) {
            int64_t bi = e / (M * N), m = e / N % M, n = e % N;
            double mag = 0;
            for (int64_t k = 0; k < K; k++) {
                int64_t ai = bi * M * K + (ta ? k * M + m : m * K + k);
                int64_t bj = (sh ? 0 : bi * K * N) + (tb ? n * K + k : k * N + n);
                mag += fabs((double)a.rounded[ai] * b.rounded[bj]);
            }
            double x = fg_tensor_get(c[0], e), y = fg_tensor_get(c[1], e);
            double ulp = cases[i].cdt == FG_BF16 ? 0x1p-8 : 0x1p-23;
            double bound = 2e-5 * sqrt((double)K) * fabs(cases[i].alpha) * mag +
                           ulp * fmax(fabs(x), fabs(y)) + 1e-30;
            worst = fmax(worst, fabs(x - y) / bound);
        }
        CHECK_MSG(worst <= 1, "case %zu: onednn and fallback differ by %g of the bound", i, worst);
        drop(&a);
        drop(&b);
        fg_step_reset();
    }
}

TEST(matmul_bf16_mode_names) {
    CHECK_STATUS(fg__matmul_bf16_set_mode("oneDNN"), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "\"oneDNN\": expected auto, onednn or fallback");
    CHECK_OK(fg__matmul_bf16_set_mode("auto"));
    CHECK_OK(fg__matmul_bf16_set_mode(NULL));
}

TEST(matmul_bf16_edges_and_errors) {
    int64_t s23[] = {2, 3}, s34[] = {3, 4}, s24[] = {2, 4}, s20[] = {2, 0}, s04[] = {0, 4};
    fg_tensor *c = fg_full(FG_F32, 2, s24, 2.0);
    CHECK_OK(fg__cpu_matmul_bf16(fg_zeros(FG_BF16, 2, s20), false, fg_zeros(FG_BF16, 2, s04), false,
                                 c, 1, 0.5)); /* K = 0: c = beta c, on any path */
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
