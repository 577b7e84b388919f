/* The elementwise f32 entries of the vector kernel tables (src/ops/cpu/
 * vk_ew_t.h: same-shape binary ops, axpby, sum_to, ReLU, bias add and
 * gradient, embedding backward, sum over a dimension and its backward) and
 * batch norm's rows (vk_norm_t.h: statistics, forward, backward), on
 * every path this CPU can run, forced through fg_set_cpu_isa: tests named
 * <op>_scalar, _avx2 and _avx512, the ones the CPU lacks skipped with the
 * reason. Each path is checked against a reference computed here (in
 * double where the op sums) and against the scalar path (the portable
 * loops, the reference the vector paths must match), at sizes around every
 * vector width and the pieces the ops split work into, with NaN, infinities
 * and signed zeros among the inputs, on 1 and 2 threads.
 *
 * Bitwise against the scalar path: everything (batch norm's statistics,
 * output and gradients included) but axpby with a beta other
 * than 0 and 1 (the scalar loop may fuse its multiply-add in a build for
 * an -march with FMA: 1 ulp) and the row sums of sum_dim over its last dim
 * (double lanes of the path's width: a reordered double sum, rounded to
 * float, within 1e-6 relative). */
#include <math.h>

#include "fulgur/ops.h"
#include "harness.h"

static const fg_op_table *ops(void) { return fg_ops_get(FG_CPU); }

static const int64_t SIZES[] = {1,    2,    3,     7,     8,     9,     15,   16,  17,
                                31,   32,   33,    63,    64,    65,    100,  255, 257,
                                1023, 1025, 16383, 16384, 16385, 40000, 70001};
#define NSIZES ((int)(sizeof SIZES / sizeof SIZES[0]))

/* normal values of the given scale, every 37th one special */
static fg_tensor *randn(int nd, const int64_t *shape, uint64_t seed, double scale) {
    static const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e30f, -1e-30f};
    fg_tensor *t = fg_empty(FG_F32, nd, shape);
    fg_rng r = {seed, 0};
    float *p = fg_tensor_data(t);
    for (int64_t i = 0; i < fg_tensor_numel(t); i++)
        p[i] = i % 37 == 5 ? special[(i / 37) % 7] : (float)(scale * fg_rng_normal(&r));
    return t;
}

/* finite values only (for sums, whose reference must be finite) */
static fg_tensor *randn_finite(int nd, const int64_t *shape, uint64_t seed) {
    fg_tensor *t = fg_empty(FG_F32, nd, shape);
    fg_rng r = {seed, 0};
    float *p = fg_tensor_data(t);
    for (int64_t i = 0; i < fg_tensor_numel(t); i++) p[i] = (float)fg_rng_normal(&r);
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

/* elements of got not within rtol of want (NaN and infinities must match) */
static long far(const float *got, const double *want, int64_t n, double rtol) {
    long bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = got[i], w = want[i];
        bool ok = isnan(w) ? isnan(g) : isinf(w) ? g == w : fabs(g - w) <= rtol * fabs(w) + 1e-30;
        if (!ok && bad++ < 3) fprintf(stderr, "    [%lld] = %.9g, want %.9g\n", (long long)i, g, w);
    }
    return bad;
}

static void on_path(fg_isa isa, void (*fn)(fg_isa)) {
    if (fg_set_cpu_isa(isa) != FG_OK) SKIP("%s path: %s", fg_isa_name(isa), fg_last_error());
    CHECK(fg_cpu_isa() == isa);
    printf("  path %s\n", fg_isa_name(isa));
    for (int th = 1; th <= 2; th++) {
        CHECK_OK(fg_set_num_threads(th));
        fn(isa);
        fg_step_reset();
    }
    CHECK_OK(fg_set_num_threads(0));
    CHECK_OK(fg_set_cpu_isa(FG_ISA_AUTO));
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

ISA_TEST(binary_same_shape) {
    static const char *names[] = {"add", "sub", "mul", "div"};
    for (int k = 0; k < NSIZES; k++) {
        int64_t n = SIZES[k];
        fg_tensor *a = randn(1, &n, 1 + k, 3.0), *b = randn(1, &n, 100 + k, 0.5);
        for (int op = FG_BIN_ADD; op <= FG_BIN_DIV; op++) {
            fg_tensor *y = fg_empty_like(a), *ys = fg_empty_like(a);
            CHECK_OK(ops()->binary((fg_binary_op)op, a, b, y));
            ON_SCALAR(isa, ops()->binary((fg_binary_op)op, a, b, ys));
            double *want = malloc(sizeof(double) * (size_t)n);
            for (int64_t i = 0; i < n; i++) {
                float x = F(a)[i], z = F(b)[i];
                want[i] = op == FG_BIN_ADD   ? (float)(x + z)
                          : op == FG_BIN_SUB ? (float)(x - z)
                          : op == FG_BIN_MUL ? (float)(x * z)
                                             : (float)(x / z);
            }
            CHECK_MSG(far(F(y), want, n, 0) == 0, "%s %s n %lld: wrong", fg_isa_name(isa),
                      names[op], (long long)n);
            CHECK_MSG(same_bits(y, ys), "%s %s n %lld: not the scalar path's bits",
                      fg_isa_name(isa), names[op], (long long)n);
            free(want);
        }
    }
}

ISA_TEST(axpby_and_sum_to) {
    static const double ab[][2] = {{1, 1}, {-1, 1}, {0.5, 1}, {2.5, 0}, {1, 0}, {-0.75, 0.25}};
    for (int k = 0; k < NSIZES; k++) {
        int64_t n = SIZES[k];
        fg_tensor *x = randn(1, &n, 7 + k, 2.0), *y0 = randn(1, &n, 70 + k, 1.0);
        for (int c = 0; c < 6; c++) {
            double al = ab[c][0], be = ab[c][1];
            fg_tensor *y = copy_of(y0), *ys = copy_of(y0), *ysum = copy_of(y0);
            CHECK_OK(ops()->axpby(al, x, be, y));
            ON_SCALAR(isa, ops()->axpby(al, x, be, ys));
            double *want = malloc(sizeof(double) * (size_t)n);
            for (int64_t i = 0; i < n; i++) {
                float xi = F(x)[i], yi = F(y0)[i];
                want[i] = be == 0   ? (double)((float)al * xi)
                          : be == 1 ? (double)(yi + (float)al * xi)
                                    : (double)(float)((float)al * xi + (float)be * yi);
            }
            bool exact = be == 0 || be == 1;
            long bad = 0;
            if (exact) {
                bad = far(F(y), want, n, 0);
            } else { /* two roundings or one: 2^-23 of the terms' size */
                for (int64_t i = 0; i < n; i++) {
                    double g = F(y)[i], w = want[i];
                    double size = fabs(al * F(x)[i]) + fabs(be * F(y0)[i]);
                    bool ok = isnan(w)   ? isnan(g)
                              : isinf(w) ? g == w
                                         : fabs(g - w) <= 1.2e-7 * size;
                    bad += !ok;
                }
            }
            CHECK_MSG(bad == 0, "%s axpby(%g, %g) n %lld: %ld wrong", fg_isa_name(isa), al, be,
                      (long long)n, bad);
            if (exact)
                CHECK_MSG(same_bits(y, ys), "%s axpby(%g, %g) n %lld: not the scalar bits",
                          fg_isa_name(isa), al, be, (long long)n);
            if (be == 1 && (al == 1 || al == -1)) { /* sum_to's same-shape path */
                CHECK_OK(ops()->sum_to(x, ysum, al, be));
                CHECK_MSG(same_bits(ysum, y), "%s sum_to(%g) n %lld", fg_isa_name(isa), al,
                          (long long)n);
            }
            free(want);
        }
    }
    /* sum_to over leading dims: (R, C) -> (C), in double, row order */
    const int64_t shapes[][2] = {{1, 1}, {3, 9}, {64, 17}, {129, 33}, {2048, 256}, {7, 1025}};
    for (int k = 0; k < 6; k++) {
        int64_t R = shapes[k][0], C = shapes[k][1];
        fg_tensor *x = randn_finite(2, shapes[k], 50 + k), *y = fg_empty(FG_F32, 1, &C);
        fg_tensor *ys = fg_empty(FG_F32, 1, &C);
        CHECK_OK(ops()->sum_to(x, y, 1, 0));
        ON_SCALAR(isa, ops()->sum_to(x, ys, 1, 0));
        double *want = calloc((size_t)C, sizeof(double));
        for (int64_t r = 0; r < R; r++)
            for (int64_t j = 0; j < C; j++) want[j] += F(x)[r * C + j];
        for (int64_t j = 0; j < C; j++) want[j] = (float)want[j];
        CHECK_MSG(far(F(y), want, C, 0) == 0, "%s sum_to (%lld, %lld)", fg_isa_name(isa),
                  (long long)R, (long long)C);
        CHECK(same_bits(y, ys));
        free(want);
    }
}

ISA_TEST(relu_fwd_bwd) {
    for (int k = 0; k < NSIZES; k++) {
        int64_t n = SIZES[k];
        fg_tensor *x = randn(1, &n, 11 + k, 1.0), *g = randn(1, &n, 110 + k, 1.0);
        fg_tensor *d0 = randn(1, &n, 210 + k, 1.0);
        fg_tensor *y = fg_empty_like(x), *ys = fg_empty_like(x);
        fg_tensor *d = copy_of(d0), *ds = copy_of(d0);
        CHECK_OK(ops()->relu_fwd(x, y));
        CHECK_OK(ops()->relu_bwd(x, g, d));
        ON_SCALAR(isa, ops()->relu_fwd(x, ys));
        ON_SCALAR(isa, ops()->relu_bwd(x, g, ds));
        double *wy = malloc(sizeof(double) * (size_t)n), *wd = malloc(sizeof(double) * (size_t)n);
        for (int64_t i = 0; i < n; i++) {
            float v = F(x)[i];
            wy[i] = v < 0 ? 0.0 : v; /* NaN passes */
            wd[i] = F(d0)[i] + (v > 0 ? F(g)[i] : 0.0f);
        }
        CHECK_MSG(far(F(y), wy, n, 0) == 0 && far(F(d), wd, n, 0) == 0, "%s relu n %lld",
                  fg_isa_name(isa), (long long)n);
        CHECK(same_bits(y, ys));
        CHECK(same_bits(d, ds));
        free(wy);
        free(wd);
    }
}

/* batch norm: mean and variance against sums in double here (the chains
 * reorder them: 1e-12), the output against its definition from those
 * statistics (1e-6), and every result bitwise the scalar path's; the input
 * gradient written (a fresh buffer) and added to a nonzero one */
ISA_TEST(batch_norm_rows) {
    static const int64_t S[] = {1, 7, 8, 9, 17, 63, 65, 257, 1024};
    for (int k = 0; k < (int)(sizeof S / sizeof S[0]); k++) {
        int64_t N = 3, C = 4, sh[] = {N, C, S[k]}, sc[] = {C};
        fg_tensor *x = randn_finite(3, sh, 300 + k), *g = randn_finite(3, sh, 310 + k);
        fg_tensor *w = randn_finite(1, sc, 320 + k), *b = randn_finite(1, sc, 330 + k);
        fg_tensor *d0 = randn_finite(3, sh, 340 + k);
        double mean[2][4], var[2][4], invstd[4];
        fg_tensor *y[2], *dx[2][2], *dw[2], *db[2];
        for (int pa = 0; pa < 2; pa++) { /* 0: isa, 1: scalar */
            if (pa) CHECK_OK(fg_set_cpu_isa(FG_ISA_SCALAR));
            CHECK_OK(ops()->batch_norm_stats(x, mean[pa], var[pa]));
            for (int64_t c = 0; c < C; c++) invstd[c] = 1.0 / sqrt(var[0][c] + 1e-5);
            y[pa] = fg_empty_like(x);
            CHECK_OK(ops()->batch_norm_fwd(x, mean[0], invstd, w, b, y[pa]));
            dx[pa][0] = fg_empty_like(x);
            dx[pa][1] = copy_of(d0);
            dw[pa] = fg_zeros_like(w);
            db[pa] = fg_zeros_like(b);
            CHECK_OK(
                ops()->batch_norm_bwd(x, g, mean[0], invstd, w, dx[pa][0], dw[pa], db[pa], true));
            CHECK_OK(ops()->batch_norm_bwd(x, g, mean[0], invstd, w, dx[pa][1], NULL, NULL, false));
            if (pa) CHECK_OK(fg_set_cpu_isa(isa));
        }
        long bad = 0;
        for (int64_t c = 0; c < C; c++) {
            double m = 0, v = 0;
            for (int64_t i = 0; i < N * S[k]; i++) m += F(x)[(i / S[k] * C + c) * S[k] + i % S[k]];
            m /= (double)(N * S[k]);
            for (int64_t i = 0; i < N * S[k]; i++) {
                double e = F(x)[(i / S[k] * C + c) * S[k] + i % S[k]] - m;
                v += e * e;
            }
            v /= (double)(N * S[k]);
            bad += fabs(mean[0][c] - m) > 1e-12 * (1 + fabs(m)) || fabs(var[0][c] - v) > 1e-12 * v;
            bad += memcmp(&mean[0][c], &mean[1][c], sizeof m) ||
                   memcmp(&var[0][c], &var[1][c], sizeof v);
            for (int64_t i = 0; i < N * S[k]; i++) {
                int64_t at = (i / S[k] * C + c) * S[k] + i % S[k];
                double want = (F(x)[at] - mean[0][c]) * invstd[c] * F(w)[c] + F(b)[c];
                bad += fabs(F(y[0])[at] - want) > 1e-6 * (1 + fabs(want));
                bad += F(dx[0][1])[at] != F(d0)[at] + F(dx[0][0])[at]; /* += the written */
            }
        }
        CHECK_MSG(bad == 0, "%s batch norm S %lld: %ld values off", fg_isa_name(isa),
                  (long long)S[k], bad);
        CHECK(same_bits(y[0], y[1]));
        CHECK(same_bits(dx[0][0], dx[1][0]));
        CHECK(same_bits(dx[0][1], dx[1][1]));
        CHECK(same_bits(dw[0], dw[1]));
        CHECK(same_bits(db[0], db[1]));
    }
}

ISA_TEST(bias_add_grad_and_embedding_bwd) {
    const int64_t shapes[][2] = {{1, 1}, {5, 7}, {33, 16}, {64, 65}, {2048, 256}, {300, 1031}};
    for (int k = 0; k < 6; k++) {
        int64_t R = shapes[k][0], C = shapes[k][1];
        fg_tensor *y0 = randn(2, shapes[k], 300 + k, 1.0), *b = randn(1, &C, 310 + k, 1.0);
        fg_tensor *y = copy_of(y0), *ys = copy_of(y0);
        CHECK_OK(ops()->bias_add(y, b));
        ON_SCALAR(isa, ops()->bias_add(ys, b));
        double *want = malloc(sizeof(double) * (size_t)(R * C));
        for (int64_t i = 0; i < R * C; i++) want[i] = F(y0)[i] + F(b)[i % C];
        CHECK_MSG(far(F(y), want, R * C, 0) == 0, "%s bias_add (%lld, %lld)", fg_isa_name(isa),
                  (long long)R, (long long)C);
        CHECK(same_bits(y, ys));
        free(want);

        fg_tensor *dy = randn_finite(2, shapes[k], 320 + k), *db0 = randn_finite(1, &C, 330 + k);
        fg_tensor *db = copy_of(db0), *dbs = copy_of(db0);
        CHECK_OK(ops()->bias_grad(dy, db));
        ON_SCALAR(isa, ops()->bias_grad(dy, dbs));
        double *wb = calloc((size_t)C, sizeof(double));
        for (int64_t r = 0; r < R; r++)
            for (int64_t j = 0; j < C; j++) wb[j] += F(dy)[r * C + j];
        for (int64_t j = 0; j < C; j++) wb[j] = (float)(F(db0)[j] + wb[j]);
        CHECK_MSG(far(F(db), wb, C, 0) == 0, "%s bias_grad (%lld, %lld)", fg_isa_name(isa),
                  (long long)R, (long long)C);
        CHECK(same_bits(db, dbs));
        free(wb);

        /* embedding backward: rows of dy added into a (V, C) table */
        int64_t V = 13, vs[] = {V, C};
        fg_tensor *idx = fg_empty(FG_I32, 1, &R);
        for (int64_t i = 0; i < R; i++) ((int32_t *)fg_tensor_data(idx))[i] = (int32_t)(i * 5 % V);
        fg_tensor *w0 = randn_finite(2, vs, 340 + k), *dw = copy_of(w0), *dws = copy_of(w0);
        CHECK_OK(ops()->embedding_bwd(idx, dy, dw));
        ON_SCALAR(isa, ops()->embedding_bwd(idx, dy, dws));
        float *we = malloc(sizeof(float) * (size_t)(V * C));
        memcpy(we, F(w0), sizeof(float) * (size_t)(V * C));
        for (int64_t i = 0; i < R; i++)
            for (int64_t j = 0; j < C; j++) we[(i * 5 % V) * C + j] += F(dy)[i * C + j];
        CHECK_MSG(memcmp(we, F(dw), sizeof(float) * (size_t)(V * C)) == 0,
                  "%s embedding_bwd (%lld, %lld)", fg_isa_name(isa), (long long)R, (long long)C);
        CHECK(same_bits(dw, dws));
        free(we);
    }
}

ISA_TEST(sum_dim_and_backward) {
    /* (outer, n, inner) summed over the middle dim, alpha 0.5 */
    const int64_t shapes[][3] = {{1, 1, 1},    {1, 70001, 1}, {4, 1000, 1},   {300, 17, 1},
                                 {1, 64, 257}, {3, 9, 33},    {2, 2048, 256}, {5, 1, 7}};
    for (int k = 0; k < 8; k++) {
        int64_t O = shapes[k][0], N = shapes[k][1], I = shapes[k][2];
        int64_t ys_[] = {O, I};
        fg_tensor *x = randn_finite(3, shapes[k], 400 + k), *y = fg_empty(FG_F32, 2, ys_);
        fg_tensor *ys = fg_empty(FG_F32, 2, ys_);
        CHECK_OK(ops()->sum_dim(x, 1, y, 0.5));
        ON_SCALAR(isa, ops()->sum_dim(x, 1, ys, 0.5));
        double *want = calloc((size_t)(O * I), sizeof(double));
        for (int64_t o = 0; o < O; o++)
            for (int64_t j = 0; j < N; j++)
                for (int64_t i = 0; i < I; i++) want[o * I + i] += F(x)[(o * N + j) * I + i];
        for (int64_t i = 0; i < O * I; i++) want[i] = (float)(0.5 * want[i]);
        /* a row sum (I == 1) adds in lanes: 1e-6 of the float result; columns exact */
        double rtol = I == 1 ? 1e-6 : 0;
        CHECK_MSG(far(F(y), want, O * I, rtol) == 0, "%s sum_dim (%lld, %lld, %lld)",
                  fg_isa_name(isa), (long long)O, (long long)N, (long long)I);
        if (I > 1) CHECK(same_bits(y, ys));
        free(want);

        /* backward: dx (O, N, I) += alpha dy (O, 1, I) */
        fg_tensor *dy = randn(2, ys_, 410 + k, 1.0), *dx0 = randn(3, shapes[k], 420 + k, 1.0);
        fg_tensor *dx = copy_of(dx0), *dxs = copy_of(dx0);
        CHECK_OK(ops()->sum_dim_bwd(dy, 1, dx, 0.5));
        ON_SCALAR(isa, ops()->sum_dim_bwd(dy, 1, dxs, 0.5));
        int64_t nx = O * N * I;
        double *wx = malloc(sizeof(double) * (size_t)nx);
        for (int64_t o = 0; o < O; o++)
            for (int64_t j = 0; j < N; j++)
                for (int64_t i = 0; i < I; i++) {
                    int64_t e = (o * N + j) * I + i;
                    wx[e] = F(dx0)[e] + (float)(0.5f * F(dy)[o * I + i]);
                }
        CHECK_MSG(far(F(dx), wx, nx, 0) == 0, "%s sum_dim_bwd (%lld, %lld, %lld)", fg_isa_name(isa),
                  (long long)O, (long long)N, (long long)I);
        CHECK(same_bits(dx, dxs));
        free(wx);
    }
}
