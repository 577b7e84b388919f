/* The f32 kernels with a vector path per ISA (cpu_impl.h's fg__vk: GELU,
 * softmax and log_softmax, cross-entropy, causal attention, layernorm,
 * dropout) and their primitives (ops.h's fg_ops_cpu_exp and
 * fg_ops_cpu_philox_xor), each run on every path this CPU can run, forced through
 * fg_set_cpu_isa: tests named <kernel>_scalar, _avx2 and _avx512, the ones
 * the CPU lacks skipped with the reason. Each path is checked against a
 * reference in double and against the scalar path (the portable loops, the
 * same code as f64), at sizes around every vector width and block edge, on
 * inputs with NaN, infinities and huge values, and on 1 and 2 threads
 * (bitwise the same). The dropout mask is checked bit for bit against
 * fg_rng_u32_at on every path, across the 2^32 wrap of Philox's counter.
 *
 * Tolerances, |got - want| <= atol + rtol |want| (infinities and NaN must
 * match), against the scalar path:
 *   GELU 1e-6 (1 + |2u|) relative: exp turns u's rounding into a relative
 *     error |2u| times larger where x < 0; its gradient 1e-6;
 *   softmax, log_softmax (4e-6 absolute: (x - m) - log s), cross-entropy,
 *     attention: 2e-6 relative (row sums in another order), attention's
 *     backward 1e-5;
 *   layernorm 4e-6 (1 + sqrt(C) / 8) of the row's O(1) scale (float sums
 *     of C values, in lanes of 4 to 16, or in one chain in a Debug build's
 *     scalar path), dx 1e-5 plus 5e-7 rstd (its terms cancel over a row:
 *     rounding comes out times rstd);
 *   dropout: bitwise.
 * Against double: 2e-6 to 1e-5 (see each test). The scalar path is
 * compiled for the build's -march: with FMA contracted by GCC (native,
 * x86-64-v3) or without (x86-64); the vector paths fuse exactly where they
 * say (vk_t.h's v_fma). */
#include <math.h>

#include "fulgur/ops.h"
#include "harness.h"

static const fg_op_table *ops(void) { return fg_ops_get(FG_CPU); }

static const int64_t SIZES[] = {1,    2,    3,    7,    8,    9,    15,    16,   17,  31,
                                32,   33,   63,   64,   65,   100,  127,   129,  255, 257,
                                1000, 1023, 1024, 1025, 2049, 3001, 16389, 70001};
#define NSIZES ((int)(sizeof SIZES / sizeof SIZES[0]))

/* A float tensor (n) or (r, c) filled with normal values of the given scale. */
static fg_tensor *randn(int nd, const int64_t *shape, uint64_t seed, double scale) {
    fg_tensor *t = fg_empty(FG_F32, nd, shape);
    fg_rng r = {seed, 0};
    float *p = fg_tensor_data(t);
    for (int64_t i = 0; i < fg_tensor_numel(t); i++) p[i] = (float)(scale * fg_rng_normal(&r));
    return t;
}

static fg_tensor *copy_of(const fg_tensor *t) {
    fg_tensor *c = fg_empty_like(t);
    CHECK_OK(fg_tensor_copy(c, t));
    return c;
}

static float *F(const fg_tensor *t) { return fg_tensor_data(t); }

static bool same_bits(const fg_tensor *a, const fg_tensor *b) {
    return fg_tensor_nbytes(a) == fg_tensor_nbytes(b) &&
           memcmp(fg_tensor_data(a), fg_tensor_data(b), fg_tensor_nbytes(a)) == 0;
}

/* Elements of got that are not within atol + rtol |want| of want (NaN and
 * infinities must match); the first few are printed, prefixed by what. */
static long far(const char *what, const float *got, const double *want, int64_t n, double rtol,
                double atol) {
    long bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = got[i], w = want[i];
        bool ok = isnan(w) ? isnan(g) : isinf(w) ? g == w : fabs(g - w) <= atol + rtol * fabs(w);
        if (!ok && bad++ < 3)
            fprintf(stderr, "    %s[%lld] = %.9g, want %.9g\n", what, (long long)i, g, w);
    }
    return bad;
}

/* The same with a float reference (another path's output). */
static long far_f(const char *what, const float *got, const float *want, int64_t n, double rtol,
                  double atol) {
    double *w = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) w[i] = want[i];
    long bad = far(what, got, w, n, rtol, atol);
    free(w);
    return bad;
}

/* Runs fn on path isa, or skips saying why the CPU cannot; back to the
 * default path after. */
static void on_path(fg_isa isa, void (*fn)(fg_isa)) {
    if (fg_set_cpu_isa(isa) != FG_OK) SKIP("%s path: %s", fg_isa_name(isa), fg_last_error());
    CHECK(fg_cpu_isa() == isa);
    fn(isa);
    CHECK_OK(fg_set_cpu_isa(FG_ISA_AUTO));
    fg_step_reset();
}

/* Runs an op on the scalar path, then back on `isa`. */
#define ON_SCALAR(isa, expr)                                                                       \
    do {                                                                                           \
        CHECK_OK(fg_set_cpu_isa(FG_ISA_SCALAR));                                                   \
        CHECK_OK(expr);                                                                            \
        CHECK_OK(fg_set_cpu_isa(isa));                                                             \
    } while (0)

#define ISA_TEST(name)                                                                             \
    static void name(fg_isa isa);                                                                  \
    TEST(name##_scalar) { on_path(FG_ISA_SCALAR, name); }                                          \
    TEST(name##_avx2) { on_path(FG_ISA_AVX2, name); }                                              \
    TEST(name##_avx512) { on_path(FG_ISA_AVX512, name); }                                          \
    static void name(fg_isa isa)

/* ------------------------------------------------------------------ paths */

TEST(paths_this_cpu_runs) {
    char ran[64] = "", lacks[512] = "";
    for (int l = FG_ISA_SCALAR; l < FG_ISA_COUNT; l++) {
        fg_isa isa = (fg_isa)l;
        if (fg_set_cpu_isa(isa) == FG_OK) {
            CHECK(fg_cpu_isa() == isa);
            snprintf(ran + strlen(ran), sizeof ran - strlen(ran), " %s", fg_isa_name(isa));
        } else {
            CHECK_CONTAINS(fg_last_error(), "lacks");
            snprintf(lacks + strlen(lacks), sizeof lacks - strlen(lacks), "; %s", fg_last_error());
        }
    }
    CHECK_OK(fg_set_cpu_isa(FG_ISA_AUTO));
    printf("vector kernel paths run here:%s%s\n", ran, lacks);
    CHECK(fg_cpu_isa() != FG_ISA_AUTO);
    CHECK_STATUS(fg_set_cpu_isa((fg_isa)99), FG_EINVAL);
    CHECK(strcmp(fg_isa_name(FG_ISA_AVX2), "avx2") == 0);
    CHECK(strcmp(fg_isa_name((fg_isa)-1), "?") == 0);
}

TEST(fulgur_cpu_isa_caps_and_names_a_bad_value) {
    fg_isa best;
    const char *outer = getenv("FULGUR_CPU_ISA"); /* put back at the end */
    char saved[64] = "";
    if (outer) snprintf(saved, sizeof saved, "%s", outer);
    unsetenv("FULGUR_CPU_ISA");
    CHECK_OK(fg_set_cpu_isa(FG_ISA_AUTO)); /* reads the variable again */
    best = fg_cpu_isa();
    const char *names[] = {"scalar", "avx2", "avx512", "auto", ""};
    fg_isa want[] = {FG_ISA_SCALAR, FG_ISA_AVX2, FG_ISA_AVX512, best, best};
    for (int i = 0; i < 5; i++) {
        setenv("FULGUR_CPU_ISA", names[i], 1);
        CHECK_OK(fg_set_cpu_isa(FG_ISA_AUTO));
        fg_isa w = want[i] < best ? want[i] : best; /* capped at the CPU's */
        CHECK_MSG(fg_cpu_isa() == w, "FULGUR_CPU_ISA=%s: %s, want %s", names[i],
                  fg_isa_name(fg_cpu_isa()), fg_isa_name(w));
    }
    /* a value that is no name: the kernels fail naming it, at the CPU's best */
    setenv("FULGUR_CPU_ISA", "avx3", 1);
    CHECK_OK(fg_set_cpu_isa(FG_ISA_AUTO));
    CHECK(fg_cpu_isa() == best);
    int64_t n = 5;
    fg_tensor *x = fg_zeros(FG_F32, 1, &n), *y = fg_empty_like(x);
    CHECK_STATUS(ops()->gelu_fwd(x, y), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "FULGUR_CPU_ISA=\"avx3\"");
    CHECK_STATUS(ops()->softmax_fwd(x, y), FG_EINVAL);
    /* a path set by hand overrides it */
    CHECK_OK(fg_set_cpu_isa(FG_ISA_SCALAR));
    CHECK_OK(ops()->gelu_fwd(x, y));
    unsetenv("FULGUR_CPU_ISA");
    CHECK_OK(fg_set_cpu_isa(FG_ISA_AUTO));
    CHECK_OK(ops()->gelu_fwd(x, y));
    CHECK(fg_cpu_isa() == best);
    if (outer) setenv("FULGUR_CPU_ISA", saved, 1);
    CHECK_OK(fg_set_cpu_isa(FG_ISA_AUTO));
    fg_step_reset();
}

/* ------------------------------------------------------------------ gelu */

static double gelu_ref(double x) {
    double u = sqrt(2 / M_PI) * (x + 0.044715 * x * x * x);
    return 0.5 * x * (1 + tanh(u));
}

static double gelu_grad_ref(double x) {
    double kb = M_SQRT2 * M_2_SQRTPI * 0.5, kk = 0.044715;
    double inner = kb * (x + kk * x * x * x), t = tanh(inner);
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * kb * (1 + 3 * kk * x * x);
}

static const float SPECIAL[] = {0.0f,    -0.0f,    1e-30f, -1e-30f, 5.0f,     -5.0f,
                                29.9f,   -29.9f,   30.0f,  -30.0f,  31.0f,    -31.0f,
                                100.f,   -100.f,   1e30f,  -1e30f,  NAN,      -NAN,
                                3.4e38f, -3.4e38f, 9.0f,   -9.0f,   INFINITY, -INFINITY};
#define NSPECIAL ((int)(sizeof SPECIAL / sizeof SPECIAL[0]))

/* GELU against another path: x / (1 + exp(-2u)) moves by |2u| times the
 * rounding of u where x < 0 (exp turns u's absolute error into a relative
 * one), so the tolerance is 1e-6 (1 + |2u|) of the value, plus 1e-37 where
 * the value underflows: the vector paths take x e / (1 + e) with e =
 * exp(2u) flushed to 0 below exp(-88), so from x = -10.03 down they give -0
 * where the portable loop gives x / exp(-2u) down to 1e-38 (PyTorch's float
 * GELU, 0.5 x (1 + tanh(u)), is -0 from x = -5.5 down). */
static long gelu_far(const float *x, const float *got, const float *want, int64_t n) {
    long bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double c = fmin(30, fmax(-30, x[i])), u = 0.7978845608 * (c + 0.044715 * c * c * c);
        double g = got[i], w = want[i];
        bool ok = isnan(w)   ? isnan(g)
                  : isinf(w) ? g == w
                             : fabs(g - w) <= 1e-6 * (1 + 2 * fabs(u)) * fabs(w) + 1e-37;
        if (!ok && bad++ < 3) fprintf(stderr, "    gelu(%.9g) = %.9g, want %.9g\n", x[i], g, w);
    }
    return bad;
}

ISA_TEST(gelu) {
    for (int si = 0; si < NSIZES; si++) {
        int64_t n = SIZES[si];
        fg_tensor *x = randn(1, &n, 10 + (uint64_t)si, 3.0), *dy = randn(1, &n, 20, 1.0);
        fg_tensor *d0 = randn(1, &n, 30, 1.0);
        /* every few elements a special value, at every position in a vector */
        for (int64_t i = 0; i < n; i += 5) F(x)[i] = SPECIAL[(i / 5) % NSPECIAL];
        fg_tensor *y = fg_empty_like(x), *ys = fg_empty_like(x);
        fg_tensor *dx = copy_of(d0), *dxs = copy_of(d0);
        CHECK_OK(ops()->gelu_fwd(x, y));
        CHECK_OK(ops()->gelu_bwd(x, dy, dx));
        ON_SCALAR(isa, ops()->gelu_fwd(x, ys));
        ON_SCALAR(isa, ops()->gelu_bwd(x, dy, dxs));
        CHECK_MSG(gelu_far(F(x), F(y), F(ys), n) == 0, "gelu %s n %lld vs scalar", fg_isa_name(isa),
                  (long long)n);
        CHECK_MSG(far_f("gelu'", F(dx), F(dxs), n, 1e-6, 1e-6) == 0, "gelu_bwd %s n %lld vs scalar",
                  fg_isa_name(isa), (long long)n);
        /* finite inputs against double */
        double *w = malloc(sizeof(double) * (size_t)n), *wd = malloc(sizeof(double) * (size_t)n);
        float *yf = malloc(sizeof(float) * (size_t)n), *df = malloc(sizeof(float) * (size_t)n);
        int64_t m = 0;
        for (int64_t i = 0; i < n; i++) {
            double xi = F(x)[i];
            if (!(fabs(xi) < 1e4)) continue;
            w[m] = gelu_ref(xi);
            wd[m] = F(d0)[i] + (double)F(dy)[i] * gelu_grad_ref(xi);
            yf[m] = F(y)[i];
            df[m++] = F(dx)[i];
        }
        CHECK_MSG(far("gelu", yf, w, m, 2e-6, 2e-6) == 0, "gelu %s n %lld vs double",
                  fg_isa_name(isa), (long long)n);
        CHECK_MSG(far("gelu'", df, wd, m, 8e-6, 8e-6) == 0, "gelu_bwd %s n %lld vs double",
                  fg_isa_name(isa), (long long)n);
        free(w);
        free(wd);
        free(yf);
        free(df);
        fg_step_reset();
    }
}

/* GELU's forward runs pieces of 256 elements in two passes and the rest a
 * vector at a time: an element gives the same bits wherever it sits (x
 * and x shifted by one to seven places, specials included) */
ISA_TEST(gelu_same_bits_at_any_place) {
    int64_t n = 3001;
    fg_tensor *x = randn(1, &n, 15, 4.0);
    for (int64_t i = 0; i < n; i += 7) F(x)[i] = SPECIAL[(i / 7) % NSPECIAL];
    fg_tensor *y = fg_empty_like(x);
    CHECK_OK(ops()->gelu_fwd(x, y));
    for (int64_t sh = 1; sh < 8; sh++) {
        int64_t m = n - sh;
        fg_tensor *xs = fg_empty(FG_F32, 1, &m), *ys = fg_empty(FG_F32, 1, &m);
        memcpy(F(xs), F(x) + sh, sizeof(float) * (size_t)m);
        CHECK_OK(ops()->gelu_fwd(xs, ys));
        CHECK_MSG(memcmp(F(ys), F(y) + sh, sizeof(float) * (size_t)m) == 0,
                  "gelu %s: shifted by %lld, other bits", fg_isa_name(isa), (long long)sh);
    }
    fg_step_reset();
}

/* ------------------------------------------------------------------ softmax */

/* rows of x (r, c): y = softmax or log_softmax in double */
static void softmax_ref(const float *x, int64_t r, int64_t c, bool lg, double *y) {
    for (int64_t i = 0; i < r; i++) {
        const float *xr = x + i * c;
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < c; j++) m = xr[j] > m ? xr[j] : m;
        for (int64_t j = 0; j < c; j++) s += exp(xr[j] - m);
        for (int64_t j = 0; j < c; j++) y[i * c + j] = lg ? xr[j] - m - log(s) : exp(xr[j] - m) / s;
    }
}

ISA_TEST(softmax) {
    for (int si = 0; si < NSIZES - 1; si++) {
        int64_t c = SIZES[si], r = c > 3000 ? 2 : 5, s[] = {r, c}, n = r * c;
        fg_tensor *x = randn(2, s, 40 + (uint64_t)si, 4.0), *dy = randn(2, s, 41, 1.0);
        fg_tensor *d0 = randn(2, s, 42, 1.0);
        /* row 1 sits at 1e4 (the max is subtracted), row 2 has -inf logits */
        for (int64_t j = 0; j < c; j++) F(x)[c + j] += 1e4f;
        for (int64_t j = 0; r > 2 && j + 1 < c; j += 3) F(x)[2 * c + j] = -INFINITY;
        double *w = malloc(sizeof(double) * (size_t)n);
        for (int lg = 0; lg < 2; lg++) {
            fg_tensor *y = fg_empty_like(x), *ys = fg_empty_like(x);
            fg_tensor *dx = copy_of(d0), *dxs = copy_of(d0);
            fg_status (*fwd)(const fg_tensor *, fg_tensor *) =
                lg ? ops()->log_softmax_fwd : ops()->softmax_fwd;
            fg_status (*bwd)(const fg_tensor *, const fg_tensor *, fg_tensor *) =
                lg ? ops()->log_softmax_bwd : ops()->softmax_bwd;
            ON_SCALAR(isa, fwd(x, ys));
            CHECK_OK(fwd(x, y));
            CHECK_OK(bwd(ys, dy, dx)); /* from the same y: the backward alone */
            ON_SCALAR(isa, bwd(ys, dy, dxs));
            /* log_softmax (x - m) - log s: ulp-sized errors of log s, up to 20 */
            const char *what = lg ? "log_softmax" : "softmax";
            double at = lg ? 4e-6 : 1e-7;
            CHECK_MSG(far_f(what, F(y), F(ys), n, 2e-6, at) == 0, "%s %s c %lld vs scalar", what,
                      fg_isa_name(isa), (long long)c);
            CHECK_MSG(far_f(what, F(dx), F(dxs), n, 2e-6, 1e-6) == 0, "%s_bwd %s c %lld vs scalar",
                      what, fg_isa_name(isa), (long long)c);
            softmax_ref(F(x), r, c, lg, w);
            CHECK_MSG(far(what, F(y), w, n, 4e-6, at) == 0, "%s %s c %lld vs double", what,
                      fg_isa_name(isa), (long long)c);
        }
        /* a NaN makes its row NaN on every path */
        F(x)[c / 2] = NAN;
        fg_tensor *y = fg_empty_like(x);
        CHECK_OK(ops()->softmax_fwd(x, y));
        long nan = 0;
        for (int64_t j = 0; j < c; j++) nan += isnan(F(y)[j]);
        CHECK_MSG(nan == c, "softmax %s c %lld: %ld of the NaN row's values NaN", fg_isa_name(isa),
                  (long long)c, nan);
        free(w);
        fg_step_reset();
    }
}

/* log_softmax's blocks of rows (softmax.c, C <= 1024): several blocks and a
 * partial one, each row as the scalar path's, a NaN row NaN, its
 * neighbours untouched by it */
ISA_TEST(log_softmax_row_blocks) {
    static const int64_t CS[] = {1, 17, 65, 256, 1024, 1025};
    for (int ci = 0; ci < 6; ci++) {
        int64_t c = CS[ci], r = 19, s[] = {r, c};
        fg_tensor *x = randn(2, s, 60 + (uint64_t)ci, 4.0);
        F(x)[9 * c + c / 2] = NAN;
        fg_tensor *y = fg_empty_like(x), *ys = fg_empty_like(x);
        CHECK_OK(ops()->log_softmax_fwd(x, y));
        ON_SCALAR(isa, ops()->log_softmax_fwd(x, ys));
        CHECK_MSG(far_f("log_softmax", F(y), F(ys), r * c, 2e-6, 4e-6) == 0,
                  "log_softmax %s c %lld vs scalar", fg_isa_name(isa), (long long)c);
        long nan = 0;
        for (int64_t j = 0; j < r * c; j++) nan += isnan(F(y)[j]);
        CHECK_MSG(nan == c, "log_softmax %s c %lld: %ld NaN, want the %lld of row 9",
                  fg_isa_name(isa), (long long)c, nan, (long long)c);
        fg_step_reset();
    }
}

/* ------------------------------------------------------------------ cross-entropy */

ISA_TEST(cross_entropy) {
    for (int si = 0; si < NSIZES - 1; si++) {
        int64_t V = SIZES[si], N = V > 3000 ? 3 : 37, s[] = {N, V};
        fg_tensor *x = randn(2, s, 50 + (uint64_t)si, 3.0), *t = fg_empty(FG_I32, 1, &N);
        int32_t *pt = fg_tensor_data(t);
        for (int64_t i = 0; i < N; i++) pt[i] = i % 7 == 3 ? -100 : (int32_t)((i * 31) % V);
        for (int64_t j = 0; j < V; j++) F(x)[j] += 1e4f; /* a row far from 0 */
        fg_tensor *loss = fg_empty(FG_F32, 0, NULL), *ls = fg_empty(FG_F32, 0, NULL);
        fg_tensor *d0 = randn(2, s, 51, 1.0), *dx = copy_of(d0), *dxs = copy_of(d0);
        int64_t cnt, cnts;
        CHECK_OK(ops()->cross_entropy_fwd(x, t, -100, loss, &cnt));
        CHECK_OK(ops()->cross_entropy_bwd(x, t, -100, 0.75, cnt, dx));
        ON_SCALAR(isa, ops()->cross_entropy_fwd(x, t, -100, ls, &cnts));
        ON_SCALAR(isa, ops()->cross_entropy_bwd(x, t, -100, 0.75, cnts, dxs));
        CHECK(cnt == cnts);
        CHECK_CLOSE(F(loss)[0], F(ls)[0], 2e-6, 0);
        CHECK_MSG(far_f("dlogits", F(dx), F(dxs), N * V, 2e-6, 1e-7) == 0,
                  "cross_entropy_bwd %s V %lld vs scalar", fg_isa_name(isa), (long long)V);
        /* against double */
        double want = 0;
        double *wd = malloc(sizeof(double) * (size_t)(N * V));
        for (int64_t i = 0; i < N; i++) {
            const float *xr = F(x) + i * V;
            double m = -INFINITY, se = 0;
            for (int64_t j = 0; j < V; j++) m = xr[j] > m ? xr[j] : m;
            for (int64_t j = 0; j < V; j++) se += exp(xr[j] - m);
            for (int64_t j = 0; j < V; j++) {
                double g = pt[i] == -100 ? 0 : 0.75 / (double)cnt * (exp(xr[j] - m) / se);
                if (j == pt[i]) g -= 0.75 / (double)cnt;
                wd[i * V + j] = F(d0)[i * V + j] + g;
            }
            if (pt[i] != -100) want += m + log(se) - xr[pt[i]];
        }
        CHECK_CLOSE(F(loss)[0], want / (double)cnt, 4e-6, 1e-6);
        CHECK_MSG(far("dlogits", F(dx), wd, N * V, 4e-6, 1e-7) == 0,
                  "cross_entropy_bwd %s V %lld vs double", fg_isa_name(isa), (long long)V);
        free(wd);
        fg_step_reset();
    }
}

/* Short rows (V <= 256: loss.c's blocks of rows, their tails a lane a row)
 * at every tail length around the vector widths, with row counts that are
 * not a multiple of a block; NaN in ignored rows stays out of the loss and
 * their dlogits; +inf, -inf and NaN in counted rows (at x[0], in the middle
 * and in the tail) give the scalar path's values and NaN pattern; 1 and 2
 * threads give the same bits. */
ISA_TEST(cross_entropy_short_rows) {
    static const int64_t VS[] = {1,  2,   15,  16,  17,  31,  33,  63,
                                 65, 127, 129, 191, 193, 255, 256, 257};
    /* 150: calls of 64 rows (loss.c) and a partial one, blocks of 8 or 16 in each */
    static const int64_t NS[] = {1, 5, 17, 40, 150};
    for (int vi = 0; vi < (int)(sizeof VS / sizeof VS[0]); vi++)
        for (int ni = 0; ni < 5; ni++) {
            int64_t V = VS[vi], N = NS[ni], s[] = {N, V};
            for (int special = 0; special < 2; special++) {
                fg_tensor *x = randn(2, s, 70 + (uint64_t)(vi * 8 + ni), 3.0);
                fg_tensor *t = fg_empty(FG_I32, 1, &N);
                int32_t *pt = fg_tensor_data(t);
                for (int64_t i = 0; i < N; i++) {
                    pt[i] = i % 5 == 2 ? -100 : (int32_t)((i * 13) % V);
                    if (pt[i] == -100) F(x)[i * V + V - 1] = NAN; /* ignored: no effect */
                }
                if (special) { /* counted rows 0, 1, 3 */
                    F(x)[V - 1] = INFINITY;
                    if (N > 1) F(x)[V] = NAN;
                    if (N > 3 && V > 1) F(x)[3 * V + V / 2] = -INFINITY; /* not all of it */
                }
                fg_tensor *loss = fg_empty(FG_F32, 0, NULL), *ls = fg_empty(FG_F32, 0, NULL);
                fg_tensor *d0 = randn(2, s, 71, 1.0), *dx = copy_of(d0), *dxs = copy_of(d0);
                int64_t cnt, cnts;
                CHECK_OK(ops()->cross_entropy_fwd(x, t, -100, loss, &cnt));
                CHECK_OK(ops()->cross_entropy_bwd(x, t, -100, 0.5, cnt, dx));
                ON_SCALAR(isa, ops()->cross_entropy_fwd(x, t, -100, ls, &cnts));
                ON_SCALAR(isa, ops()->cross_entropy_bwd(x, t, -100, 0.5, cnts, dxs));
                CHECK(cnt == cnts);
                /* the pair with the forward's row stats: the same bits */
                fg_tensor *st = fg_empty(FG_F64, 2, (int64_t[]){2, N});
                fg_tensor *l2 = fg_empty(FG_F32, 0, NULL), *dx2 = copy_of(d0);
                int64_t cnt2;
                CHECK_OK(ops()->cross_entropy_fwd_stats(x, t, -100, l2, &cnt2, st));
                CHECK_OK(ops()->cross_entropy_bwd_stats(x, t, st, -100, 0.5, cnt2, dx2));
                CHECK_MSG(cnt2 == cnt && same_bits(l2, loss) && same_bits(dx2, dx),
                          "cross_entropy %s V %lld N %lld special %d: the stats pair differs",
                          fg_isa_name(isa), (long long)V, (long long)N, special);
                if (special) CHECK(isnan(F(loss)[0]) && isnan(F(ls)[0]));
                else
                    CHECK_MSG(isfinite(F(loss)[0]) &&
                                  fabs(F(loss)[0] - F(ls)[0]) <= 2e-6 * fabs(F(ls)[0]) + 1e-7,
                              "cross_entropy %s V %lld N %lld: loss %.9g, scalar %.9g",
                              fg_isa_name(isa), (long long)V, (long long)N, F(loss)[0], F(ls)[0]);
                CHECK_MSG(far_f("dlogits", F(dx), F(dxs), N * V, 2e-6, 1e-7) == 0,
                          "cross_entropy_bwd %s V %lld N %lld special %d vs scalar",
                          fg_isa_name(isa), (long long)V, (long long)N, special);
                long moved = 0, nan = 0;
                for (int64_t i = 0; i < N; i++)
                    for (int64_t j = 0; j < V; j++) {
                        float a = F(dx)[i * V + j], b = F(d0)[i * V + j];
                        if (pt[i] == -100) moved += memcmp(&a, &b, sizeof a) != 0;
                        else if (!special || i > 1) nan += isnan(a);
                    }
                CHECK_MSG(moved == 0, "%s V %lld: %ld dlogits of ignored rows changed",
                          fg_isa_name(isa), (long long)V, moved);
                CHECK_MSG(nan == 0, "%s V %lld: %ld NaN dlogits in finite rows", fg_isa_name(isa),
                          (long long)V, nan);
                fg_step_reset();
            }
        }
    /* threads: enough work for the parallel loop */
    int prev = fg_get_num_threads();
    int64_t N = 1501, V = 65, s[] = {N, V};
    fg_tensor *x = randn(2, s, 80, 3.0), *t = fg_empty(FG_I32, 1, &N);
    for (int64_t i = 0; i < N; i++)
        ((int32_t *)fg_tensor_data(t))[i] = i % 9 == 4 ? -100 : (int32_t)(i * 7 % V);
    fg_tensor *loss[2], *dl[2], *st[2], *ds[2];
    for (int th = 0; th < 2; th++) {
        CHECK_OK(fg_set_num_threads(th + 1));
        int64_t cnt;
        loss[th] = fg_empty(FG_F32, 0, NULL);
        dl[th] = fg_zeros_like(x);
        ds[th] = fg_zeros_like(x);
        st[th] = fg_empty(FG_F64, 2, (int64_t[]){2, N});
        CHECK_OK(ops()->cross_entropy_fwd(x, t, -100, loss[th], &cnt));
        CHECK_OK(ops()->cross_entropy_bwd(x, t, -100, 1.0, cnt, dl[th]));
        CHECK_OK(ops()->cross_entropy_fwd_stats(x, t, -100, loss[th], &cnt, st[th]));
        CHECK_OK(ops()->cross_entropy_bwd_stats(x, t, st[th], -100, 1.0, cnt, ds[th]));
    }
    CHECK_MSG(same_bits(loss[0], loss[1]) && same_bits(dl[0], dl[1]) && same_bits(st[0], st[1]) &&
                  same_bits(ds[0], ds[1]) && same_bits(ds[0], dl[0]),
              "cross_entropy %s: 1 and 2 threads differ", fg_isa_name(isa));
    CHECK_OK(fg_set_num_threads(prev));
    fg_step_reset();
}

/* ------------------------------------------------------------------ attention */

/* y (B, T, C) and lse (B, H, T) of attention on qkv (B, T, 3C), causal or
 * not, the keys pad (B, T) marks left out (pad may be NULL), in double */
static void attention_ref(const float *qkv, int64_t B, int64_t T, int64_t C, int64_t H, bool causal,
                          const uint8_t *pad, double *y, double *lse) {
    int64_t hs = C / H;
    double *p = malloc(sizeof(double) * (size_t)T);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++) {
                const float *q = qkv + (b * T + t) * 3 * C + h * hs;
                double m = -INFINITY, s = 0;
                for (int64_t j = 0; j < (causal ? t + 1 : T); j++) {
                    const float *k = qkv + (b * T + j) * 3 * C + C + h * hs;
                    double d = 0;
                    for (int64_t e = 0; e < hs; e++) d += (double)q[e] * k[e];
                    p[j] = pad && pad[b * T + j] ? -INFINITY : d / sqrt((double)hs);
                    m = p[j] > m ? p[j] : m;
                }
                for (int64_t j = 0; j < (causal ? t + 1 : T); j++) s += p[j] = exp(p[j] - m);
                lse[(b * H + h) * T + t] = m + log(s);
                for (int64_t e = 0; e < hs; e++) {
                    double a = 0;
                    for (int64_t j = 0; j < (causal ? t + 1 : T); j++)
                        a += p[j] / s * qkv[(b * T + j) * 3 * C + 2 * C + h * hs + e];
                    y[(b * T + t) * C + h * hs + e] = a;
                }
            }
    free(p);
}

ISA_TEST(attention) {
    int64_t shapes[][4] = {
        {1, 1, 8, 1}, {2, 5, 12, 3}, {1, 33, 16, 2}, {2, 70, 32, 4}, {1, 129, 16, 1}};
    for (int k = 0; k < 15; k++) {
        /* the five shapes with the causal mask, without, then padded keys
         * (every third of the last batch entry but key 0) without it */
        bool causal = k < 5, padded = k >= 10;
        int64_t B = shapes[k % 5][0], T = shapes[k % 5][1], C = shapes[k % 5][2],
                H = shapes[k % 5][3];
        int64_t sq[] = {B, T, 3 * C}, sy[] = {B, T, C}, sl[] = {B, H, T};
        fg_tensor *qkv = randn(3, sq, 60 + (uint64_t)(k % 5), 1.5), *dy = randn(3, sy, 61, 1.0);
        fg_tensor *y = fg_empty(FG_F32, 3, sy), *ys = fg_empty(FG_F32, 3, sy);
        fg_tensor *lse = fg_empty(FG_F32, 3, sl), *lses = fg_empty(FG_F32, 3, sl);
        fg_tensor *d0 = randn(3, sq, 62, 1.0), *dq = copy_of(d0), *dqs = copy_of(d0);
        fg_tensor *kpm = padded ? fg_zeros(FG_U8, 2, (int64_t[]){B, T}) : NULL;
        uint8_t *pm = kpm ? fg_tensor_data(kpm) : NULL;
        for (int64_t j = 1; pm && j < T; j += 3) pm[(B - 1) * T + j] = 1;
        CHECK_OK(ops()->attention_fwd(qkv, (int)H, causal, kpm, y, lse));
        CHECK_OK(ops()->attention_bwd(qkv, (int)H, causal, kpm, y, lse, dy, dq));
        ON_SCALAR(isa, ops()->attention_fwd(qkv, (int)H, causal, kpm, ys, lses));
        ON_SCALAR(isa, ops()->attention_bwd(qkv, (int)H, causal, kpm, ys, lses, dy, dqs));
        int64_t ny = B * T * C, nl = B * H * T;
        CHECK_MSG(far_f("y", F(y), F(ys), ny, 2e-6, 2e-6) == 0,
                  "attention %s T %lld causal %d vs scalar", fg_isa_name(isa), (long long)T,
                  causal);
        CHECK_MSG(far_f("lse", F(lse), F(lses), nl, 2e-6, 2e-6) == 0,
                  "attention lse %s T %lld causal %d vs scalar", fg_isa_name(isa), (long long)T,
                  causal);
        CHECK_MSG(far_f("dqkv", F(dq), F(dqs), 3 * ny, 1e-5, 1e-5) == 0,
                  "attention_bwd %s T %lld causal %d vs scalar", fg_isa_name(isa), (long long)T,
                  causal);
        double *wy = malloc(sizeof(double) * (size_t)ny), *wl = malloc(sizeof(double) * (size_t)nl);
        attention_ref(F(qkv), B, T, C, H, causal, pm, wy, wl);
        CHECK_MSG(far("y", F(y), wy, ny, 1e-5, 1e-5) == 0,
                  "attention %s T %lld causal %d vs double", fg_isa_name(isa), (long long)T,
                  causal);
        CHECK_MSG(far("lse", F(lse), wl, nl, 4e-6, 4e-6) == 0,
                  "attention lse %s T %lld causal %d vs double", fg_isa_name(isa), (long long)T,
                  causal);
        free(wy);
        free(wl);
        fg_tensor_free(kpm);
        fg_step_reset();
    }
}

/* ------------------------------------------------------------------ layernorm */

ISA_TEST(layernorm) {
    for (int si = 0; si < NSIZES - 1; si++) {
        int64_t C = SIZES[si], N = C > 3000 ? 3 : 70, s[] = {N, C}, n = N * C;
        fg_tensor *x = randn(2, s, 70 + (uint64_t)si, 2.0), *dy = randn(2, s, 71, 1.0);
        for (int64_t j = 0; j < C; j++) F(x)[C + j] += 1e3f; /* a row far from 0 */
        fg_tensor *w = randn(1, &C, 72, 1.0), *b = randn(1, &C, 73, 1.0);
        for (int aff = 0; aff < 2; aff++) {
            const fg_tensor *pw = aff ? w : NULL, *pb = aff ? b : NULL;
            fg_tensor *y = fg_empty_like(x), *ys = fg_empty_like(x);
            fg_tensor *m = fg_empty(FG_F32, 1, &N), *r = fg_empty(FG_F32, 1, &N);
            fg_tensor *ms = fg_empty(FG_F32, 1, &N), *rs = fg_empty(FG_F32, 1, &N);
            fg_tensor *d0 = randn(2, s, 74, 1.0), *dx = copy_of(d0), *dxs = copy_of(d0);
            fg_tensor *w0 = randn(1, &C, 75, 1.0), *dw = copy_of(w0), *dws = copy_of(w0);
            fg_tensor *db = copy_of(w0), *dbs = copy_of(w0);
            CHECK_OK(ops()->layernorm_fwd(x, pw, pb, 1e-5, y, m, r));
            CHECK_OK(ops()->layernorm_bwd(x, pw, m, r, dy, dx, aff ? dw : NULL, aff ? db : NULL));
            ON_SCALAR(isa, ops()->layernorm_fwd(x, pw, pb, 1e-5, ys, ms, rs));
            ON_SCALAR(isa, ops()->layernorm_bwd(x, pw, ms, rs, dy, dxs, aff ? dws : NULL,
                                                aff ? dbs : NULL));
            /* y, dx and dw are O(1) per element; the mean and variance are
             * float sums of C values, in lanes of 4 to 16 by path, in one
             * chain in an unoptimised build's scalar path: 4e-6 of 1 +
             * |value|, growing as sqrt(C) */
            double t = 4e-6 * (1 + sqrt((double)C) / 8);
            CHECK_MSG(far_f("y", F(y), F(ys), n, t, t) == 0, "layernorm %s C %lld vs scalar",
                      fg_isa_name(isa), (long long)C);
            CHECK_MSG(far_f("mean", F(m), F(ms), N, t, t) == 0, "mean %s C %lld", fg_isa_name(isa),
                      (long long)C);
            CHECK_MSG(far_f("rstd", F(r), F(rs), N, t, 0) == 0, "rstd %s C %lld", fg_isa_name(isa),
                      (long long)C);
            /* dx = rstd (g w - mean(g w) - ...): the terms cancel over a row,
             * so their rounding (fused or not by path) comes out times rstd,
             * which is 316 in a row of C = 1 (variance 0, eps 1e-5) */
            long bad = 0;
            for (int64_t i = 0; i < N; i++)
                bad += far_f("dx", F(dx) + i * C, F(dxs) + i * C, C, 1e-5, 1e-5 + 5e-7 * F(rs)[i]);
            CHECK_MSG(bad == 0, "layernorm_bwd %s C %lld vs scalar", fg_isa_name(isa),
                      (long long)C);
            if (aff) {
                /* sums over N = 70 rows of O(1) */
                CHECK_MSG(far_f("dw", F(dw), F(dws), C, 1e-5, 1e-4) == 0, "dw %s C %lld",
                          fg_isa_name(isa), (long long)C);
                CHECK_MSG(far_f("db", F(db), F(dbs), C, 1e-5, 1e-4) == 0, "db %s C %lld",
                          fg_isa_name(isa), (long long)C);
                /* weight gradients alone (dx NULL) */
                fg_tensor *dw2 = copy_of(w0), *db2 = copy_of(w0);
                CHECK_OK(ops()->layernorm_bwd(x, w, m, r, dy, NULL, dw2, db2));
                CHECK(same_bits(dw2, dw) && same_bits(db2, db));
            }
            /* forward against double */
            double *want = malloc(sizeof(double) * (size_t)n);
            for (int64_t i = 0; i < N; i++) {
                const float *xr = F(x) + i * C;
                double mu = 0, v = 0;
                for (int64_t j = 0; j < C; j++) mu += xr[j];
                mu /= (double)C;
                for (int64_t j = 0; j < C; j++) v += (xr[j] - mu) * (xr[j] - mu);
                double rr = 1 / sqrt(v / (double)C + 1e-5);
                for (int64_t j = 0; j < C; j++)
                    want[i * C + j] = (xr[j] - mu) * rr * (aff ? F(w)[j] : 1) + (aff ? F(b)[j] : 0);
            }
            /* row 1 sits at 1e3: its f32 mean is good to ulp(1e3) ~ 6e-5 */
            CHECK_MSG(far("y", F(y), want, n, 1e-5, 2e-4) == 0, "layernorm %s C %lld vs double",
                      fg_isa_name(isa), (long long)C);
            free(want);
        }
        fg_step_reset();
    }
}

/* ------------------------------------------------------------------ dropout */

/* The row kernels that run over blocks of rows (layernorm's forward in
 * blocks of 8, log_softmax's forward in a pipeline over 64 rows,
 * cross-entropy in calls of 64 rows, 8 or 16 at a time, the next block's
 * maxes in this block's loop) give each row what the row alone gives, bit
 * for bit, wherever it sits (block edges, partial blocks, the last rows of
 * a call): a recomputed row (activation checkpointing) is the same row. And
 * layernorm with only a weight or only a bias, against the scalar path. */
ISA_TEST(rows_do_not_depend_on_their_neighbours) {
    static const int64_t CS[] = {1, 7, 17, 65, 256, 257, 512, 513, 1024, 1025};
    static const int64_t PICK[] = {0, 5, 7, 8, 9, 15, 16, 63, 64, 65, 127, 128, 149};
    const int64_t N = 150, one = 1;
    for (int ci = 0; ci < (int)(sizeof CS / sizeof CS[0]); ci++) {
        int64_t C = CS[ci], s[] = {N, C}, s1[] = {1, C};
        fg_tensor *x = randn(2, s, 90 + (uint64_t)ci, 3.0);
        for (int64_t j = 0; j < C; j++) F(x)[64 * C + j] += 1e3f; /* a row far from 0 */
        fg_tensor *w = randn(1, &C, 91, 1.0), *b = randn(1, &C, 92, 1.0);
        fg_tensor *y = fg_empty_like(x), *m = fg_empty(FG_F32, 1, &N), *r = fg_empty(FG_F32, 1, &N);
        fg_tensor *ls = fg_empty_like(x), *x1 = fg_empty(FG_F32, 2, s1), *y1 = fg_empty_like(x1);
        fg_tensor *m1 = fg_empty(FG_F32, 1, &one), *r1 = fg_empty(FG_F32, 1, &one);
        fg_tensor *ys = fg_empty_like(x), *ms = fg_empty(FG_F32, 1, &N),
                  *rs = fg_empty(FG_F32, 1, &N);
        for (int aff = 0; aff < 4; aff++) { /* none, w and b, w, b */
            const fg_tensor *pw = aff == 1 || aff == 2 ? w : NULL;
            const fg_tensor *pb = aff == 1 || aff == 3 ? b : NULL;
            CHECK_OK(ops()->layernorm_fwd(x, pw, pb, 1e-5, y, m, r));
            ON_SCALAR(isa, ops()->layernorm_fwd(x, pw, pb, 1e-5, ys, ms, rs));
            double t = 4e-6 * (1 + sqrt((double)C) / 8);
            CHECK_MSG(far_f("y", F(y), F(ys), N * C, t, t) == 0, "layernorm %s C %lld aff %d",
                      fg_isa_name(isa), (long long)C, aff);
            for (int k = 0; k < (int)(sizeof PICK / sizeof PICK[0]); k++) {
                int64_t i = PICK[k];
                memcpy(F(x1), F(x) + i * C, sizeof(float) * (size_t)C);
                CHECK_OK(ops()->layernorm_fwd(x1, pw, pb, 1e-5, y1, m1, r1));
                CHECK_MSG(memcmp(F(y1), F(y) + i * C, sizeof(float) * (size_t)C) == 0 &&
                              F(m1)[0] == F(m)[i] && F(r1)[0] == F(r)[i],
                          "layernorm %s C %lld aff %d: row %lld alone differs", fg_isa_name(isa),
                          (long long)C, aff, (long long)i);
            }
        }
        CHECK_OK(ops()->log_softmax_fwd(x, ls));
        for (int k = 0; k < (int)(sizeof PICK / sizeof PICK[0]); k++) {
            int64_t i = PICK[k];
            memcpy(F(x1), F(x) + i * C, sizeof(float) * (size_t)C);
            CHECK_OK(ops()->log_softmax_fwd(x1, y1));
            CHECK_MSG(memcmp(F(y1), F(ls) + i * C, sizeof(float) * (size_t)C) == 0,
                      "log_softmax %s C %lld: row %lld alone differs", fg_isa_name(isa),
                      (long long)C, (long long)i);
        }
        /* cross-entropy: a row's loss (the others ignored) and dlogits */
        fg_tensor *t = fg_empty(FG_I32, 1, &N), *t1 = fg_empty(FG_I32, 1, &one);
        fg_tensor *loss = fg_empty(FG_F32, 0, NULL), *l1 = fg_empty(FG_F32, 0, NULL);
        fg_tensor *dx = fg_zeros(FG_F32, 2, s), *dx1 = fg_zeros(FG_F32, 2, s1);
        int32_t *pt = fg_tensor_data(t);
        for (int64_t i = 0; i < N; i++) pt[i] = (int32_t)((i * 13) % C);
        int64_t cnt;
        CHECK_OK(ops()->cross_entropy_bwd(x, t, -100, 1.0, N, dx));
        fg_tensor *st = fg_empty(FG_F64, 2, (int64_t[]){2, N});
        fg_tensor *st1 = fg_empty(FG_F64, 2, (int64_t[]){2, 1}), *dxs = fg_zeros(FG_F32, 2, s);
        CHECK_OK(ops()->cross_entropy_fwd_stats(x, t, -100, loss, &cnt, st));
        CHECK_OK(ops()->cross_entropy_bwd_stats(x, t, st, -100, 1.0, N, dxs));
        CHECK(same_bits(dxs, dx));
        for (int k = 0; k < (int)(sizeof PICK / sizeof PICK[0]); k++) {
            int64_t i = PICK[k];
            memcpy(F(x1), F(x) + i * C, sizeof(float) * (size_t)C);
            ((int32_t *)fg_tensor_data(t1))[0] = pt[i];
            memset(F(dx1), 0, sizeof(float) * (size_t)C);
            CHECK_OK(ops()->cross_entropy_bwd(x1, t1, -100, 1.0, N, dx1));
            CHECK_MSG(memcmp(F(dx1), F(dx) + i * C, sizeof(float) * (size_t)C) == 0,
                      "cross_entropy_bwd %s V %lld: row %lld alone differs", fg_isa_name(isa),
                      (long long)C, (long long)i);
            /* the backward from the forward's stats, the row alone and in place */
            memset(F(dx1), 0, sizeof(float) * (size_t)C);
            CHECK_OK(ops()->cross_entropy_fwd_stats(x1, t1, -100, l1, &cnt, st1));
            CHECK_OK(ops()->cross_entropy_bwd_stats(x1, t1, st1, -100, 1.0, N, dx1));
            const double *ps = fg_tensor_data(st), *p1 = fg_tensor_data(st1);
            CHECK_MSG(memcmp(F(dx1), F(dxs) + i * C, sizeof(float) * (size_t)C) == 0 &&
                          ps[i] == p1[0] && ps[N + i] == p1[1],
                      "cross_entropy_bwd_stats %s V %lld: row %lld alone differs", fg_isa_name(isa),
                      (long long)C, (long long)i);
            for (int64_t q = 0; q < N; q++) pt[q] = q == i ? (int32_t)((q * 13) % C) : -100;
            CHECK_OK(ops()->cross_entropy_fwd(x, t, -100, loss, &cnt));
            CHECK_OK(ops()->cross_entropy_fwd(x1, t1, -100, l1, &cnt));
            CHECK_MSG(F(loss)[0] == F(l1)[0],
                      "cross_entropy %s V %lld: row %lld's loss %.9g, "
                      "alone %.9g",
                      fg_isa_name(isa), (long long)C, (long long)i, F(loss)[0], F(l1)[0]);
            for (int64_t q = 0; q < N; q++) pt[q] = (int32_t)((q * 13) % C);
        }
        fg_step_reset();
    }
}

ISA_TEST(dropout) {
    /* the last offsets put Philox's counter (offset / 4) across 2^32 */
    uint64_t offsets[] = {0, 1, 3, 5, 64, 1000003, (4ull << 32) - 40, (4ull << 32) - 1};
    double ps[] = {0.0, 0.1, 0.5, 0.97};
    for (int oi = 0; oi < 8; oi++)
        for (int si = 0; si < NSIZES; si += 2)
            for (int pi = 0; pi < 4; pi++) {
                int64_t n = SIZES[si];
                double p = ps[pi];
                uint64_t seed = 0xfeedull + (uint64_t)oi, off = offsets[oi];
                fg_tensor *x = randn(1, &n, 80, 1.0), *y = fg_empty_like(x);
                F(x)[n / 2] = NAN;
                CHECK_OK(ops()->dropout_fwd(x, p, seed, off, y));
                float sc = (float)(1 / (1 - p));
                uint64_t thr = (uint64_t)ceil(p * 4294967296.0);
                long bad = 0;
                for (int64_t i = 0; i < n; i++) {
                    bool keep = fg_rng_u32_at(seed, off + (uint64_t)i) >= thr;
                    float want = keep ? F(x)[i] * sc : 0.0f;
                    bad += memcmp(&F(y)[i], &want, 4) != 0;
                }
                CHECK_MSG(bad == 0, "dropout %s offset %llu n %lld p %g: %ld wrong",
                          fg_isa_name(isa), (unsigned long long)off, (long long)n, p, bad);
                /* backward: the same mask, added in */
                fg_tensor *d0 = randn(1, &n, 81, 1.0), *dx = copy_of(d0);
                CHECK_OK(ops()->dropout_bwd(x, p, seed, off, dx));
                bad = 0;
                for (int64_t i = 0; i < n; i++) {
                    float want = F(d0)[i] + F(y)[i];
                    bad += memcmp(&F(dx)[i], &want, 4) != 0;
                }
                CHECK_MSG(bad == 0, "dropout_bwd %s offset %llu n %lld p %g: %ld wrong",
                          fg_isa_name(isa), (unsigned long long)off, (long long)n, p, bad);
                fg_step_reset();
            }
}

/* ------------------------------------------------------------------ primitives */

/* ops.h's fg_ops_cpu_exp (the exp of the row kernels and GELU, alone):
 * within 2.5e-7 relative (2 ulp) of exp from -87 to 88, 0 (or below
 * FLT_MIN) under -88, exp(88) or more past 88 (2.4e38 saturated on the
 * vector paths, inf on the portable one), NaN kept; in place too. */
ISA_TEST(exp_primitive) {
    for (int si = 0; si < NSIZES; si++) {
        int64_t n = SIZES[si];
        float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < n; i++) /* -87 .. 88, and specials at every lane */
            x[i] = i % 7 == 3 ? SPECIAL[(i / 7) % NSPECIAL]
                              : -87.0f + 175.0f * (float)((i * 7919) % 10007) / 10007.0f;
        CHECK_OK(fg_ops_cpu_exp(x, y, n));
        long bad = 0;
        for (int64_t i = 0; i < n; i++) {
            double xi = x[i], g = y[i];
            bool ok = isnan(xi)    ? isnan(g)
                      : xi < -88   ? g >= 0 && g < 1.2e-38
                      : xi > 88    ? g >= 1.6e38
                      : xi < -87.3 ? fabs(g - exp(xi)) < 1.2e-38
                                   : fabs(g - exp(xi)) <= 2.5e-7 * exp(xi);
            if (!ok && bad++ < 3)
                fprintf(stderr, "    exp(%.9g) = %.9g, want %.9g\n", xi, g, exp(xi));
        }
        CHECK_MSG(bad == 0, "exp %s n %lld: %ld wrong", fg_isa_name(isa), (long long)n, bad);
        CHECK_OK(fg_ops_cpu_exp(x, x, n)); /* in place: the same values */
        CHECK_MSG(memcmp(x, y, sizeof(float) * (size_t)n) == 0, "exp %s n %lld in place",
                  fg_isa_name(isa), (long long)n);
        free(x);
        free(y);
    }
    float z = 0;
    CHECK_STATUS(fg_ops_cpu_exp(&z, &z, -1), FG_EINVAL);
    CHECK_OK(fg_ops_cpu_exp(&z, &z, 0));
    CHECK(z == 0);
}

/* fg_ops_cpu_philox_xor: the xor of fg_rng_u32_at over the draws asked for,
 * bit for bit, from every offset mod 4 and across the 2^32 wrap of
 * Philox's counter */
ISA_TEST(philox_primitive) {
    uint64_t offsets[] = {0, 1, 2, 3, 5, 64, 1000003, (4ull << 32) - 40, (4ull << 32) - 1};
    for (int oi = 0; oi < 9; oi++)
        for (int si = 0; si < NSIZES; si++) {
            int64_t n = SIZES[si];
            uint64_t seed = 0x5eedull * (uint64_t)(oi + 1), off = offsets[oi];
            uint32_t want = 0, got = 1;
            for (int64_t i = 0; i < n; i++) want ^= fg_rng_u32_at(seed, off + (uint64_t)i);
            CHECK_OK(fg_ops_cpu_philox_xor(seed, off, n, &got));
            CHECK_MSG(got == want, "philox %s offset %llu n %lld: %08x, want %08x",
                      fg_isa_name(isa), (unsigned long long)off, (long long)n, got, want);
        }
    uint32_t o = 1;
    CHECK_STATUS(fg_ops_cpu_philox_xor(1, 0, -1, &o), FG_EINVAL);
    CHECK_OK(fg_ops_cpu_philox_xor(1, 0, 0, &o));
    CHECK(o == 0);
}

/* ------------------------------------------------------------------ threads */

/* 1 and 2 threads: at C = 1031 the row kernels, at C = 200 and 500 the
 * block kernels (layernorm, log_softmax, cross-entropy at 200), whose rows
 * a call follow the thread count (64 on 1 thread and 32 on 2 at N = 150) */
ISA_TEST(one_and_two_threads_give_the_same_bits) {
    int prev = fg_get_num_threads();
    static const int64_t NS[] = {301, 150, 150}, CS[] = {1031, 200, 500};
    for (int ci = 0; ci < 3; ci++) {
        int64_t N = NS[ci], C = CS[ci], s[] = {N, C};
        fg_tensor *x = randn(2, s, 90, 2.0), *dy = randn(2, s, 91, 1.0);
        fg_tensor *w = randn(1, &C, 92, 1.0), *b = randn(1, &C, 93, 1.0);
        fg_tensor *t = fg_empty(FG_I32, 1, &N);
        for (int64_t i = 0; i < N; i++) ((int32_t *)fg_tensor_data(t))[i] = (int32_t)(i * 7 % C);
        fg_tensor *out[2][10];
        for (int th = 0; th < 2; th++) {
            CHECK_OK(fg_set_num_threads(th + 1));
            fg_tensor *g = fg_empty_like(x), *sm = fg_empty_like(x), *ln = fg_empty_like(x);
            fg_tensor *m = fg_empty(FG_F32, 1, &N), *r = fg_empty(FG_F32, 1, &N);
            fg_tensor *dx = fg_zeros_like(x), *dw = fg_zeros_like(w), *db = fg_zeros_like(b);
            fg_tensor *dr = fg_empty_like(x), *loss = fg_empty(FG_F32, 0, NULL);
            fg_tensor *dl = fg_zeros_like(x), *ls = fg_empty_like(x);
            int64_t cnt;
            CHECK_OK(ops()->gelu_fwd(x, g));
            CHECK_OK(ops()->softmax_fwd(x, sm));
            CHECK_OK(ops()->layernorm_fwd(x, w, b, 1e-5, ln, m, r));
            CHECK_OK(ops()->layernorm_bwd(x, w, m, r, dy, dx, dw, db));
            CHECK_OK(ops()->dropout_fwd(x, 0.2, 5, 7, dr));
            CHECK_OK(ops()->cross_entropy_fwd(x, t, -100, loss, &cnt));
            CHECK_OK(ops()->cross_entropy_bwd(x, t, -100, 1.0, cnt, dl));
            CHECK_OK(ops()->log_softmax_fwd(x, ls));
            fg_tensor *res[10] = {g, sm, ln, dx, dw, db, dr, loss, dl, ls};
            memcpy(out[th], res, sizeof res);
        }
        for (int k = 0; k < 10; k++)
            CHECK_MSG(same_bits(out[0][k], out[1][k]), "%s C %lld: result %d differs",
                      fg_isa_name(isa), (long long)C, k);
        fg_step_reset();
    }
    CHECK_OK(fg_set_num_threads(prev));
}
