/* The non-matmul kernels against naive references computed here in double,
 * in f32 and f64 at odd sizes: sum_dim (every dim, keepdim shapes, blocks
 * past the kernel's column block, empty dims) and its backward, relu, gelu
 * (PyTorch's tanh form, and its derivative), softmax and log_softmax (rows
 * past the exp block, huge logits), cross-entropy (ignore_index, all rows
 * ignored, bad targets), layernorm (with and without weight and bias),
 * embedding (repeated rows, bad indices), dropout (every draw against
 * fg_rng_u32_at, unaligned offsets, the same mask on 1 and 2 threads, the
 * kept fraction and the scale). Backward kernels are checked to ADD into
 * gradients that start non-zero, and the parallel kernels to give bitwise
 * the same result on 1 and 2 threads. */
#include <math.h>

#include "fulgur/ops.h"
#include "harness.h"

static const fg_op_table *ops(void) { return fg_ops_get(FG_CPU); }

static fg_tensor *randn(fg_dtype dt, int nd, const int64_t *shape, uint64_t seed, double scale) {
    fg_tensor *t = fg_empty(dt, nd, shape);
    fg_rng r = {seed, 0};
    int64_t n = fg_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) {
        double v = scale * fg_rng_normal(&r);
        if (dt == FG_F32) ((float *)fg_tensor_data(t))[i] = (float)v;
        else ((double *)fg_tensor_data(t))[i] = v;
    }
    return t;
}

/* Element i of a contiguous float tensor, set to v. */
static void put(fg_tensor *t, int64_t i, double v) {
    if (fg_tensor_dtype(t) == FG_F32) ((float *)fg_tensor_data(t))[i] = (float)v;
    else ((double *)fg_tensor_data(t))[i] = v;
}

/* A copy of t's values in double (logical order); free() it. */
static double *vals(const fg_tensor *t) {
    int64_t n = fg_tensor_numel(t);
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) v[i] = fg_tensor_get(t, i);
    return v;
}

/* Worst |got - want| / (1 + |want|); NaN sticks. */
static double max_err(const fg_tensor *got, const double *want) {
    double e = 0;
    for (int64_t i = 0; i < fg_tensor_numel(got); i++) {
        double d = fabs(fg_tensor_get(got, i) - want[i]) / (1 + fabs(want[i]));
        if (!(d <= e)) e = d;
    }
    return e;
}

static bool same_bits(const fg_tensor *a, const fg_tensor *b) {
    return fg_tensor_nbytes(a) == fg_tensor_nbytes(b) &&
           memcmp(fg_tensor_data(a), fg_tensor_data(b), fg_tensor_nbytes(a)) == 0;
}

static fg_tensor *copy_of(const fg_tensor *t) {
    fg_tensor *c = fg_empty_like(t);
    CHECK_OK(fg_tensor_copy(c, t));
    return c;
}

static const fg_dtype DTS[2] = {FG_F32, FG_F64};
static double tol(fg_dtype dt) { return dt == FG_F32 ? 2e-6 : 1e-13; }

/* ------------------------------------------------------------------ sum_dim */

TEST(sum_dim_every_dim_and_backward_accumulates) {
    struct {
        int nd;
        int64_t s[3];
    } cases[] = {{3, {3, 5, 7}},   {2, {4, 1}},    {1, {37}},
                 {3, {2, 3, 300}}, {3, {2, 0, 3}}, {2, {5, 513}}};
    for (int di = 0; di < 2; di++)
        for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
            for (int dim = -cases[c].nd; dim < cases[c].nd; dim++) {
                fg_dtype dt = DTS[di];
                int nd = cases[c].nd, d = dim < 0 ? dim + nd : dim;
                const int64_t *s = cases[c].s;
                fg_tensor *x = randn(dt, nd, s, 7 + c, 1);
                int64_t outer = 1, n = s[d], inner = 1, ys[3];
                for (int k = 0; k < d; k++) outer *= s[k];
                for (int k = d + 1; k < nd; k++) inner *= s[k];
                for (int k = 0; k < nd; k++) ys[k] = k == d ? 1 : s[k]; /* keepdim */
                fg_tensor *y = fg_empty(dt, nd, ys);
                CHECK_OK(ops()->sum_dim(x, dim, y, 0.5));
                double *xv = vals(x), *want = malloc(sizeof(double) * (size_t)(outer * inner + 1));
                for (int64_t o = 0; o < outer; o++)
                    for (int64_t k = 0; k < inner; k++) {
                        double a = 0;
                        for (int64_t j = 0; j < n; j++) a += xv[(o * n + j) * inner + k];
                        want[o * inner + k] = 0.5 * a;
                    }
                CHECK_MSG(max_err(y, want) <= tol(dt), "sum_dim %s case %zu dim %d: err %g",
                          fg_dtype_name(dt), c, dim, max_err(y, want));
                /* backward: dx = dx0 + alpha * dy broadcast over dim */
                fg_tensor *dy = randn(dt, nd, ys, 99, 1), *dx = randn(dt, nd, s, 98, 1);
                double *dyv = vals(dy), *dxw = vals(dx);
                for (int64_t o = 0; o < outer; o++)
                    for (int64_t j = 0; j < n; j++)
                        for (int64_t k = 0; k < inner; k++)
                            dxw[(o * n + j) * inner + k] += -2.0 * dyv[o * inner + k];
                CHECK_OK(ops()->sum_dim_bwd(dy, dim, dx, -2.0));
                CHECK_MSG(max_err(dx, dxw) <= tol(dt), "sum_dim_bwd %s case %zu dim %d",
                          fg_dtype_name(dt), c, dim);
                free(xv);
                free(want);
                free(dyv);
                free(dxw);
                fg_step_reset();
            }
}

TEST(sum_dim_of_a_scalar_and_errors) {
    fg_tensor *x = fg_scalar(FG_F64, 3.0), *y = fg_empty(FG_F64, 0, NULL);
    CHECK_OK(ops()->sum_dim(x, 0, y, 2.0));
    CHECK(fg_item(y) == 6.0);
    int64_t s[] = {3, 4}, s3[] = {3};
    x = fg_zeros(FG_F32, 2, s);
    CHECK_STATUS(ops()->sum_dim(x, 2, fg_empty(FG_F32, 1, s3), 1.0), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "dim 2");
    CHECK_STATUS(ops()->sum_dim(x, 1, fg_empty(FG_F32, 1, s3 + 0), 1.0), FG_OK);
    CHECK_STATUS(ops()->sum_dim(x, 0, fg_empty(FG_F32, 1, s3), 1.0), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "f32[3]");
    fg_step_reset();
}

/* ------------------------------------------------------------------ activations */

static double gelu_ref(double x) {
    double u = sqrt(2 / M_PI) * (x + 0.044715 * x * x * x);
    return 0.5 * x * (1 + tanh(u));
}

/* PyTorch's GeluBackward for approximate="tanh", written as it is there */
static double gelu_grad_ref(double x) {
    double kb = M_SQRT2 * M_2_SQRTPI * 0.5, kk = 0.044715;
    double inner = kb * (x + kk * x * x * x), t = tanh(inner);
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * kb * (1 + 3 * kk * x * x);
}

TEST(relu_and_gelu_match_references) {
    int64_t shapes[][2] = {{7, 13}, {1, 1}, {3, 67}, {301, 257}};
    for (int di = 0; di < 2; di++)
        for (int c = 0; c < 4; c++) {
            fg_dtype dt = DTS[di];
            fg_tensor *x = randn(dt, 2, shapes[c], 3 + c, 3.0), *y = fg_empty_like(x);
            int64_t n = fg_tensor_numel(x);
            double *xv = vals(x), *want = malloc(sizeof(double) * (size_t)n);
            fg_tensor *dy = randn(dt, 2, shapes[c], 50 + c, 1);
            fg_tensor *dx = randn(dt, 2, shapes[c], 60, 1);
            double *dyv = vals(dy), *dxw = vals(dx);

            CHECK_OK(ops()->relu_fwd(x, y));
            for (int64_t i = 0; i < n; i++) want[i] = xv[i] > 0 ? xv[i] : 0;
            CHECK(max_err(y, want) == 0);
            for (int64_t i = 0; i < n; i++) dxw[i] += xv[i] > 0 ? dyv[i] : 0;
            CHECK_OK(ops()->relu_bwd(x, dy, dx));
            CHECK(max_err(dx, dxw) <= tol(dt));

            CHECK_OK(ops()->gelu_fwd(x, y));
            for (int64_t i = 0; i < n; i++) want[i] = gelu_ref(xv[i]);
            CHECK_MSG(max_err(y, want) <= 2 * tol(dt), "gelu %s %lld: err %g", fg_dtype_name(dt),
                      (long long)n, max_err(y, want));
            for (int64_t i = 0; i < n; i++) dxw[i] += dyv[i] * gelu_grad_ref(xv[i]);
            CHECK_OK(ops()->gelu_bwd(x, dy, dx));
            CHECK_MSG(max_err(dx, dxw) <= 4 * tol(dt), "gelu_bwd %s %lld: err %g",
                      fg_dtype_name(dt), (long long)n, max_err(dx, dxw));
            free(xv);
            free(want);
            free(dyv);
            free(dxw);
            fg_step_reset();
        }
}

TEST(activations_at_extremes) {
    double xs[] = {-1e30, -100, -20, -9, -1e-20, 0, 1e-20, 9, 20, 100, 1e30};
    int64_t n = 11;
    for (int di = 0; di < 2; di++) {
        fg_dtype dt = DTS[di];
        fg_tensor *x = fg_empty(dt, 1, &n), *y = fg_empty(dt, 1, &n), *dy = fg_full(dt, 1, &n, 1);
        fg_tensor *dx = fg_zeros(dt, 1, &n);
        for (int i = 0; i < n; i++) put(x, i, xs[i]);
        CHECK_OK(ops()->gelu_fwd(x, y));
        CHECK_OK(ops()->gelu_bwd(x, dy, dx));
        for (int i = 0; i < n; i++) {
            double xi = fg_tensor_get(x, i), want = xi < -50 ? 0 : xi > 50 ? xi : gelu_ref(xi);
            CHECK_MSG(fabs(fg_tensor_get(y, i) - want) <= 1e-6 * (1 + fabs(want)),
                      "gelu(%g) = %g, want %g", xi, fg_tensor_get(y, i), want);
            double gw = xi < -50 ? 0 : xi > 50 ? 1 : gelu_grad_ref(xi);
            CHECK_MSG(fabs(fg_tensor_get(dx, i) - gw) <= 1e-6, "gelu'(%g) = %g, want %g", xi,
                      fg_tensor_get(dx, i), gw);
        }
        /* relu lets NaN through, as PyTorch does */
        fg_tensor *nan = fg_full(dt, 1, &n, NAN);
        CHECK_OK(ops()->relu_fwd(nan, y));
        CHECK(isnan(fg_tensor_get(y, 3)));
        fg_step_reset();
    }
}

/* ------------------------------------------------------------------ softmax */

TEST(softmax_and_log_softmax_match_references) {
    int64_t shapes[][3] = {{3, 5, 7}, {1, 1, 1}, {2, 3, 65}, {1, 3, 1500}, {1, 129, 300}};
    for (int di = 0; di < 2; di++)
        for (int c = 0; c < 5; c++) {
            fg_dtype dt = DTS[di];
            const int64_t *s = shapes[c];
            int64_t C = s[2], rows = s[0] * s[1], n = rows * C;
            /* an offset of 1000 on some rows: overflow without the max */
            fg_tensor *x = randn(dt, 3, s, 11 + c, 4.0);
            for (int64_t i = 0; i < n; i += 2 * C)
                for (int64_t j = 0; j < C; j++) put(x, i + j, fg_tensor_get(x, i + j) + 1000);
            double *xv = vals(x), *sm = malloc(sizeof(double) * (size_t)n),
                   *ls = malloc(sizeof(double) * (size_t)n);
            for (int64_t r = 0; r < rows; r++) {
                double m = -INFINITY, z = 0;
                for (int64_t j = 0; j < C; j++) m = fmax(m, xv[r * C + j]);
                for (int64_t j = 0; j < C; j++) z += exp(xv[r * C + j] - m);
                for (int64_t j = 0; j < C; j++) {
                    sm[r * C + j] = exp(xv[r * C + j] - m) / z;
                    ls[r * C + j] = xv[r * C + j] - m - log(z);
                }
            }
            fg_tensor *y = fg_empty_like(x), *l = fg_empty_like(x);
            CHECK_OK(ops()->softmax_fwd(x, y));
            CHECK_OK(ops()->log_softmax_fwd(x, l));
            /* log-softmax values near 1000 * eps are what f32 can hold */
            CHECK_MSG(max_err(y, sm) <= 2 * tol(dt), "softmax %s case %d: %g", fg_dtype_name(dt), c,
                      max_err(y, sm));
            CHECK_MSG(max_err(l, ls) <= 4 * tol(dt), "log_softmax %s case %d: %g",
                      fg_dtype_name(dt), c, max_err(l, ls));

            fg_tensor *dy = randn(dt, 3, s, 70 + c, 1), *dx = randn(dt, 3, s, 80, 1);
            fg_tensor *dx2 = copy_of(dx);
            double *dyv = vals(dy), *want = vals(dx), *want2 = vals(dx);
            for (int64_t r = 0; r < rows; r++) {
                double dot = 0, gs = 0;
                for (int64_t j = 0; j < C; j++) {
                    dot += dyv[r * C + j] * sm[r * C + j];
                    gs += dyv[r * C + j];
                }
                for (int64_t j = 0; j < C; j++) {
                    want[r * C + j] += sm[r * C + j] * (dyv[r * C + j] - dot);
                    want2[r * C + j] += dyv[r * C + j] - sm[r * C + j] * gs;
                }
            }
            CHECK_OK(ops()->softmax_bwd(y, dy, dx));
            CHECK_OK(ops()->log_softmax_bwd(l, dy, dx2));
            CHECK_MSG(max_err(dx, want) <= 4 * tol(dt), "softmax_bwd %s case %d: %g",
                      fg_dtype_name(dt), c, max_err(dx, want));
            CHECK_MSG(max_err(dx2, want2) <= 8 * tol(dt) * (C > 1000 ? 10 : 1),
                      "log_softmax_bwd %s case %d: %g", fg_dtype_name(dt), c, max_err(dx2, want2));
            free(xv);
            free(sm);
            free(ls);
            free(dyv);
            free(want);
            free(want2);
            fg_step_reset();
        }
}

/* ------------------------------------------------------------------ cross-entropy */

/* loss and dlogits (added to dl0) by the definition, in double */
static double ce_ref(const double *x, const int32_t *t, int64_t N, int64_t V, int64_t ii,
                     double dloss, double *dl) {
    double sum = 0;
    int64_t count = 0;
    for (int64_t i = 0; i < N; i++) count += t[i] != ii;
    for (int64_t i = 0; i < N; i++) {
        if (t[i] == ii) continue;
        double m = -INFINITY, z = 0;
        for (int64_t j = 0; j < V; j++) m = fmax(m, x[i * V + j]);
        for (int64_t j = 0; j < V; j++) z += exp(x[i * V + j] - m);
        sum += m + log(z) - x[i * V + t[i]];
        for (int64_t j = 0; j < V; j++)
            dl[i * V + j] += dloss / count * (exp(x[i * V + j] - m) / z - (j == t[i]));
    }
    return count ? sum / count : 0;
}

TEST(cross_entropy_matches_reference_with_ignore_index) {
    int64_t sizes[][2] = {{7, 13}, {1, 1}, {33, 65}, {300, 257}, {5, 1100}};
    for (int di = 0; di < 2; di++)
        for (int c = 0; c < 5; c++) {
            fg_dtype dt = DTS[di];
            int64_t N = sizes[c][0], V = sizes[c][1];
            fg_tensor *x = randn(dt, 2, sizes[c], 21 + c, 3.0);
            if (c == 2) /* huge logits: needs the max subtracted */
                for (int64_t i = 0; i < N * V; i++) put(x, i, 1e4 * fg_tensor_get(x, i));
            fg_tensor *t = fg_empty(FG_I32, 1, &N);
            int32_t *tp = fg_tensor_data(t);
            fg_rng r = {5 + (uint64_t)c, 0};
            for (int64_t i = 0; i < N; i++)
                tp[i] = i % 3 == 1 ? -100 : (int32_t)fg_rng_below(&r, (uint64_t)V);
            fg_tensor *loss = fg_empty(dt, 0, NULL), *dl = randn(dt, 2, sizes[c], 30, 1);
            int64_t count = -1;
            CHECK_OK(ops()->cross_entropy_fwd(x, t, -100, loss, &count));
            double *xv = vals(x), *want = vals(dl);
            int64_t cw = 0;
            for (int64_t i = 0; i < N; i++) cw += tp[i] != -100;
            double lw = ce_ref(xv, tp, N, V, -100, 0.7, want);
            CHECK(count == cw);
            CHECK_MSG(fabs(fg_item(loss) - lw) <= tol(dt) * (1 + fabs(lw)) * (c == 2 ? 10 : 1),
                      "cross_entropy %s case %d: %.9g vs %.9g", fg_dtype_name(dt), c, fg_item(loss),
                      lw);
            fg_tensor *dl2 = fg_empty_like(dl), *l2 = fg_empty(dt, 0, NULL);
            CHECK_OK(fg_tensor_copy(dl2, dl));
            CHECK_OK(ops()->cross_entropy_bwd(x, t, -100, 0.7, count, dl));
            CHECK_MSG(max_err(dl, want) <= 2 * tol(dt), "cross_entropy_bwd %s case %d: %g",
                      fg_dtype_name(dt), c, max_err(dl, want));
            /* the pair with the forward's row stats: the same bits, and the
             * stats are each row's max and sum of exps */
            fg_tensor *st = fg_empty(FG_F64, 2, (int64_t[]){2, N});
            int64_t c2 = -1;
            CHECK_OK(ops()->cross_entropy_fwd_stats(x, t, -100, l2, &c2, st));
            CHECK_OK(ops()->cross_entropy_bwd_stats(x, t, st, -100, 0.7, c2, dl2));
            CHECK_MSG(
                c2 == count &&
                    memcmp(fg_tensor_data(l2), fg_tensor_data(loss), fg_tensor_nbytes(loss)) == 0 &&
                    memcmp(fg_tensor_data(dl2), fg_tensor_data(dl), fg_tensor_nbytes(dl)) == 0,
                "cross_entropy stats pair %s case %d differs", fg_dtype_name(dt), c);
            const double *ps = fg_tensor_data(st);
            for (int64_t i = 0; i < N; i++) {
                double m = -INFINITY, se = 0;
                for (int64_t j = 0; j < V; j++) m = fmax(m, xv[i * V + j]);
                for (int64_t j = 0; j < V; j++) se += exp(xv[i * V + j] - m);
                CHECK_MSG(ps[i] == m && fabs(ps[N + i] - se) <= 1e-5 * se,
                          "cross_entropy_fwd_stats %s case %d row %lld: %g %g, want %g %g",
                          fg_dtype_name(dt), c, (long long)i, ps[i], ps[N + i], m, se);
            }
            free(xv);
            free(want);
            fg_step_reset();
        }
}

TEST(cross_entropy_all_ignored_and_bad_targets) {
    int64_t s[] = {3, 5}, N = 3;
    fg_tensor *x = randn(FG_F32, 2, s, 1, 1), *loss = fg_empty(FG_F32, 0, NULL);
    int32_t tv[3] = {7, 7, 7};
    fg_tensor *t = fg_from_data(FG_I32, 1, &N, tv);
    int64_t count = -1;
    CHECK_OK(ops()->cross_entropy_fwd(x, t, 7, loss, &count)); /* ignore_index may be >= V */
    CHECK(count == 0 && fg_item(loss) == 0);
    fg_tensor *dl = fg_full(FG_F32, 2, s, 0.25);
    CHECK_OK(ops()->cross_entropy_bwd(x, t, 7, 1.0, 0, dl));
    for (int i = 0; i < 15; i++) CHECK(fg_tensor_get(dl, i) == 0.25);
    /* ignore_index inside [0, V) is honoured too */
    int32_t tv2[3] = {0, 4, 0};
    fg_tensor *t2 = fg_from_data(FG_I32, 1, &N, tv2);
    CHECK_OK(ops()->cross_entropy_fwd(x, t2, 0, loss, &count));
    CHECK(count == 1);
    int32_t bad[3] = {1, 5, 2};
    fg_tensor *tb = fg_from_data(FG_I32, 1, &N, bad);
    CHECK_OK(fg_tensor_fill(loss, 42));
    CHECK_STATUS(ops()->cross_entropy_fwd(x, tb, -100, loss, &count), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "target 5 at row 1");
    CHECK_CONTAINS(fg_last_error(), "5 classes");
    CHECK(fg_item(loss) == 42);
    bad[1] = -1;
    tb = fg_from_data(FG_I32, 1, &N, bad);
    CHECK_STATUS(ops()->cross_entropy_bwd(x, tb, -100, 1.0, 3, dl), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "target -1");
    fg_tensor *t64 = fg_zeros(FG_I64, 1, &N);
    CHECK_STATUS(ops()->cross_entropy_fwd(x, t64, -100, loss, &count), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "i32 targets (N)");
    /* the stats pair: count 0 leaves dlogits alone; a stats tensor of another
     * shape or dtype is named */
    fg_tensor *st = fg_empty(FG_F64, 2, (int64_t[]){2, N});
    CHECK_OK(ops()->cross_entropy_fwd_stats(x, t, 7, loss, &count, st));
    CHECK(count == 0 && fg_item(loss) == 0);
    CHECK_OK(ops()->cross_entropy_bwd_stats(x, t, st, 7, 1.0, 0, dl));
    for (int i = 0; i < 15; i++) CHECK(fg_tensor_get(dl, i) == 0.25);
    fg_tensor *sb = fg_empty(FG_F32, 2, (int64_t[]){2, N});
    CHECK_STATUS(ops()->cross_entropy_fwd_stats(x, t2, 0, loss, &count, sb), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "f64 (2, 3)");
    sb = fg_empty(FG_F64, 1, (int64_t[]){2 * N});
    CHECK_STATUS(ops()->cross_entropy_bwd_stats(x, t2, sb, 0, 1.0, 1, dl), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "stats");
    CHECK_STATUS(ops()->cross_entropy_bwd_stats(x, tb, st, -100, 1.0, 3, dl), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "target -1");
    fg_step_reset();
}

/* ------------------------------------------------------------------ layernorm */

TEST(layernorm_matches_reference_with_and_without_affine) {
    int64_t sizes[][2] = {{7, 13}, {1, 1}, {5, 256}, {300, 259}};
    for (int di = 0; di < 2; di++)
        for (int c = 0; c < 4; c++)
            for (int aff = 0; aff < 4; aff++) {
                fg_dtype dt = DTS[di];
                int64_t N = sizes[c][0], C = sizes[c][1];
                fg_tensor *x = randn(dt, 2, sizes[c], 40 + c, 2.0);
                /* an offset of 100: the two-pass variance does not cancel */
                for (int64_t i = 0; i < N * C; i += 3) put(x, i, fg_tensor_get(x, i) + 100);
                fg_tensor *w = aff & 1 ? randn(dt, 1, &C, 2, 1) : NULL;
                fg_tensor *b = aff & 2 ? randn(dt, 1, &C, 3, 1) : NULL;
                fg_tensor *y = fg_empty_like(x), *mean = fg_empty(dt, 1, &N),
                          *rstd = fg_empty(dt, 1, &N);
                double eps = 1e-5;
                CHECK_OK(ops()->layernorm_fwd(x, w, b, eps, y, mean, rstd));
                double *xv = vals(x), *wv = w ? vals(w) : NULL, *bv = b ? vals(b) : NULL;
                double *yw = malloc(sizeof(double) * (size_t)(N * C)), *mw = malloc(8 * (size_t)N),
                       *rw = malloc(8 * (size_t)N);
                for (int64_t i = 0; i < N; i++) {
                    double mu = 0, var = 0;
                    for (int64_t j = 0; j < C; j++) mu += xv[i * C + j] / C;
                    for (int64_t j = 0; j < C; j++) var += pow(xv[i * C + j] - mu, 2) / C;
                    mw[i] = mu;
                    rw[i] = 1 / sqrt(var + eps);
                    for (int64_t j = 0; j < C; j++)
                        yw[i * C + j] =
                            (xv[i * C + j] - mu) * rw[i] * (wv ? wv[j] : 1) + (bv ? bv[j] : 0);
                }
                CHECK_MSG(max_err(y, yw) <= 4 * tol(dt), "layernorm %s case %d aff %d: %g",
                          fg_dtype_name(dt), c, aff, max_err(y, yw));
                CHECK(max_err(mean, mw) <= 4 * tol(dt));
                CHECK(max_err(rstd, rw) <= 4 * tol(dt));

                /* backward, from the definition, added to non-zero gradients */
                fg_tensor *dy = randn(dt, 2, sizes[c], 90, 1), *dx = randn(dt, 2, sizes[c], 91, 1);
                fg_tensor *dw = randn(dt, 1, &C, 92, 1), *db = randn(dt, 1, &C, 93, 1);
                double *g = vals(dy), *dxw = vals(dx), *dww = vals(dw), *dbw = vals(db);
                double *dx0 = vals(dx), *dw0 = vals(dw);
                for (int64_t i = 0; i < N; i++) {
                    double s1 = 0, s2 = 0;
                    for (int64_t j = 0; j < C; j++) {
                        double xh = (xv[i * C + j] - mw[i]) * rw[i];
                        double gj = g[i * C + j] * (wv ? wv[j] : 1);
                        s1 += gj;
                        s2 += gj * xh;
                        dww[j] += g[i * C + j] * xh;
                        dbw[j] += g[i * C + j];
                    }
                    for (int64_t j = 0; j < C; j++) {
                        double xh = (xv[i * C + j] - mw[i]) * rw[i];
                        double gj = g[i * C + j] * (wv ? wv[j] : 1);
                        dxw[i * C + j] += rw[i] * (gj - s1 / C - xh * s2 / C);
                    }
                }
                CHECK_OK(ops()->layernorm_bwd(x, w, mean, rstd, dy, dx, dw, db));
                double big = dt == FG_F32 ? 1e-4 : 1e-11; /* row sums of N products */
                CHECK_MSG(max_err(dx, dxw) <= big, "layernorm_bwd dx %s case %d aff %d: %g",
                          fg_dtype_name(dt), c, aff, max_err(dx, dxw));
                CHECK_MSG(max_err(dw, dww) <= big, "dw %g", max_err(dw, dww));
                CHECK_MSG(max_err(db, dbw) <= big, "db %g", max_err(db, dbw));
                /* dx alone, dw alone: the same increments */
                fg_tensor *dx2 = fg_zeros_like(x), *dw2 = fg_zeros(dt, 1, &C);
                CHECK_OK(ops()->layernorm_bwd(x, w, mean, rstd, dy, dx2, NULL, NULL));
                CHECK_OK(ops()->layernorm_bwd(x, w, mean, rstd, dy, NULL, dw2, NULL));
                for (int64_t j = 0; j < C; j++)
                    CHECK_CLOSE(fg_tensor_get(dw2, j), dww[j] - dw0[j], big, big);
                for (int64_t i = 0; i < N * C; i += 7)
                    CHECK_CLOSE(fg_tensor_get(dx2, i), dxw[i] - dx0[i], big, big);
                free(dw0);
                free(dx0);
                free(xv);
                free(wv);
                free(bv);
                free(yw);
                free(mw);
                free(rw);
                free(g);
                free(dxw);
                free(dww);
                free(dbw);
                fg_step_reset();
            }
}

TEST(layernorm_f32_rows_with_a_large_offset_keep_their_digits) {
    /* rows at 1e4 +- 1: a float sum of the raw values would be off by
     * ~1e-2 in the mean; the saved f32 mean can be off by half an ulp of
     * 1e4 (5e-4) at most */
    int64_t N = 16, C = 1024, s[] = {N, C};
    fg_tensor *x = randn(FG_F32, 2, s, 8, 1.0);
    for (int64_t i = 0; i < N * C; i++) put(x, i, fg_tensor_get(x, i) + 1e4);
    fg_tensor *y = fg_empty_like(x), *m = fg_empty(FG_F32, 1, &N), *r = fg_empty(FG_F32, 1, &N);
    CHECK_OK(ops()->layernorm_fwd(x, NULL, NULL, 1e-5, y, m, r));
    for (int64_t i = 0; i < N; i++) {
        double mu = 0, var = 0;
        for (int64_t j = 0; j < C; j++) mu += fg_tensor_get(x, i * C + j) / C;
        for (int64_t j = 0; j < C; j++) var += pow(fg_tensor_get(x, i * C + j) - mu, 2) / C;
        CHECK_CLOSE(fg_tensor_get(m, i), mu, 0, 5e-4);
        CHECK_CLOSE(fg_tensor_get(r, i), 1 / sqrt(var + 1e-5), 1e-5, 0);
    }
    fg_step_reset();
}

TEST(layernorm_errors_name_the_shapes) {
    int64_t s[] = {4, 6}, c5 = 5, n4 = 4;
    fg_tensor *x = fg_zeros(FG_F32, 2, s), *y = fg_empty_like(x);
    fg_tensor *m = fg_empty(FG_F32, 1, &n4), *r = fg_empty(FG_F32, 1, &n4);
    CHECK_STATUS(ops()->layernorm_fwd(x, fg_zeros(FG_F32, 1, &c5), NULL, 1e-5, y, m, r), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "weight is f32[5]");
    CHECK_STATUS(ops()->layernorm_fwd(x, NULL, NULL, 1e-5, y, m, NULL), FG_EINVAL);
    fg_tensor *m64 = fg_empty(FG_F64, 1, &n4);
    CHECK_STATUS(ops()->layernorm_fwd(x, NULL, NULL, 1e-5, y, m64, r), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "mean");
    fg_step_reset();
}

/* ------------------------------------------------------------------ embedding */

TEST(embedding_gathers_and_scatters_with_repeats) {
    for (int di = 0; di < 2; di++) {
        fg_dtype dt = DTS[di];
        int64_t V = 11, C = 131, N = 301, ws[] = {V, C};
        fg_tensor *w = randn(dt, 2, ws, 1, 1), *idx = fg_empty(FG_I32, 1, &N);
        int32_t *ip = fg_tensor_data(idx);
        for (int64_t i = 0; i < N; i++) ip[i] = (int32_t)((i * 7 + i / 5) % V); /* repeats */
        int64_t ys[] = {N, C};
        fg_tensor *y = fg_empty(dt, 2, ys);
        CHECK_OK(ops()->embedding_fwd(idx, w, y));
        bool ok = true;
        for (int64_t i = 0; i < N; i++)
            for (int64_t j = 0; j < C; j++)
                ok &= fg_tensor_get(y, i * C + j) == fg_tensor_get(w, ip[i] * C + j);
        CHECK(ok);
        fg_tensor *dy = randn(dt, 2, ys, 5, 1), *dw = randn(dt, 2, ws, 6, 1);
        double *want = vals(dw), *g = vals(dy);
        for (int64_t i = 0; i < N; i++)
            for (int64_t j = 0; j < C; j++) want[ip[i] * C + j] += g[i * C + j];
        CHECK_OK(ops()->embedding_bwd(idx, dy, dw));
        CHECK(max_err(dw, want) <= 4 * tol(dt));
        free(want);
        free(g);
        fg_step_reset();
    }
}

TEST(embedding_bad_index_names_it_and_the_vocabulary) {
    int64_t ws[] = {10, 4}, N = 3, ys[] = {3, 4};
    fg_tensor *w = fg_zeros(FG_F32, 2, ws), *y = fg_full(FG_F32, 2, ys, 5);
    int32_t bad[3] = {0, 10, 2};
    CHECK_STATUS(ops()->embedding_fwd(fg_from_data(FG_I32, 1, &N, bad), w, y), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "index 10 at position 1");
    CHECK_CONTAINS(fg_last_error(), "vocabulary of 10");
    CHECK(fg_tensor_get(y, 0) == 5); /* nothing written */
    bad[1] = 0;
    bad[2] = -3;
    CHECK_STATUS(ops()->embedding_bwd(fg_from_data(FG_I32, 1, &N, bad), y, w), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "index -3 at position 2");
    CHECK(fg_tensor_get(w, 0) == 0);
    fg_step_reset();
}

/* ------------------------------------------------------------------ dropout */

static bool kept(uint64_t seed, uint64_t k, double p) {
    return fg_rng_u32_at(seed, k) / 4294967296.0 >= p;
}

TEST(dropout_mask_is_the_philox_stream) {
    uint64_t offsets[] = {0, 3, 5, 64, 1000003, (1ull << 34) - 2};
    int64_t sizes[] = {1, 2, 63, 64, 65, 1001};
    double ps[] = {0.1, 0.5, 0.9};
    for (int di = 0; di < 2; di++)
        for (int oi = 0; oi < 6; oi++)
            for (int si = 0; si < 6; si++)
                for (int pi = 0; pi < 3; pi++) {
                    fg_dtype dt = DTS[di];
                    int64_t n = sizes[si];
                    double p = ps[pi];
                    uint64_t seed = 0x1234567890ull + (uint64_t)oi;
                    fg_tensor *x = randn(dt, 1, &n, 9, 1), *y = fg_empty_like(x);
                    CHECK_OK(ops()->dropout_fwd(x, p, seed, offsets[oi], y));
                    int bad = 0;
                    for (int64_t i = 0; i < n; i++) {
                        double sc = dt == FG_F32 ? (float)(1 / (1 - p)) : 1 / (1 - p);
                        double want =
                            kept(seed, offsets[oi] + (uint64_t)i, p) ? fg_tensor_get(x, i) * sc : 0;
                        if (dt == FG_F32) want = (float)want;
                        bad += fg_tensor_get(y, i) != want;
                    }
                    CHECK_MSG(bad == 0, "dropout %s offset %llu n %lld p %g: %d wrong",
                              fg_dtype_name(dt), (unsigned long long)offsets[oi], (long long)n, p,
                              bad);
                    /* backward: the same mask, added in */
                    fg_tensor *dx = fg_full(dt, 1, &n, 1.0);
                    CHECK_OK(ops()->dropout_bwd(x, p, seed, offsets[oi], dx));
                    bad = 0;
                    for (int64_t i = 0; i < n; i++) {
                        double yi = fg_tensor_get(y, i);
                        bad += fabs(fg_tensor_get(dx, i) - (1 + yi)) > 1e-6 * (1 + fabs(yi));
                    }
                    CHECK(bad == 0);
                    fg_step_reset();
                }
}

TEST(dropout_same_mask_on_one_and_two_threads_and_statistics) {
    int prev = fg_get_num_threads();
    int64_t n = 1000003; /* odd, far past the parallel threshold */
    double p = 0.3;
    fg_tensor *x = fg_full(FG_F32, 1, &n, 1.0), *y1 = fg_empty_like(x), *y2 = fg_empty_like(x);
    CHECK_OK(fg_set_num_threads(1));
    CHECK_OK(ops()->dropout_fwd(x, p, 77, 12345, y1));
    CHECK_OK(fg_set_num_threads(2));
    CHECK_OK(ops()->dropout_fwd(x, p, 77, 12345, y2));
    CHECK(same_bits(y1, y2));
    fg_tensor *d1 = fg_zeros_like(x), *d2 = fg_zeros_like(x);
    CHECK_OK(ops()->dropout_bwd(x, p, 77, 12345, d2));
    CHECK_OK(fg_set_num_threads(1));
    CHECK_OK(ops()->dropout_bwd(x, p, 77, 12345, d1));
    CHECK(same_bits(d1, d2) && same_bits(d1, y1));
    CHECK_OK(fg_set_num_threads(prev));
    int64_t k = 0;
    float sc = (float)(1 / (1 - p));
    bool vals_ok = true;
    const float *py = fg_tensor_data(y1);
    for (int64_t i = 0; i < n; i++) {
        k += py[i] != 0;
        vals_ok &= py[i] == 0 || py[i] == sc;
    }
    CHECK(vals_ok);
    /* kept fraction: binomial sd is sqrt(p(1-p)/n) ~ 4.6e-4; 6 sd */
    CHECK_CLOSE((double)k / (double)n, 1 - p, 0, 3e-3);
    /* a different offset gives a different mask */
    CHECK_OK(ops()->dropout_fwd(x, p, 77, 12346, y2));
    CHECK(!same_bits(y1, y2));
    /* p = 0 is a copy; p outside [0, 1) an error naming it */
    CHECK_OK(ops()->dropout_fwd(x, 0.0, 77, 0, y2));
    CHECK(same_bits(x, y2));
    CHECK_STATUS(ops()->dropout_fwd(x, 1.0, 77, 0, y2), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "p = 1");
    CHECK_STATUS(ops()->dropout_fwd(x, NAN, 77, 0, y2), FG_EINVAL);
    fg_step_reset();
}

/* ------------------------------------------------------------------ threads */

TEST(parallel_kernels_are_bitwise_the_same_on_one_and_two_threads) {
    int prev = fg_get_num_threads();
    int64_t N = 1031, C = 257, s[] = {N, C}, V = 97, es[] = {V, C};
    fg_tensor *x = randn(FG_F32, 2, s, 1, 1), *dy = randn(FG_F32, 2, s, 2, 1);
    fg_tensor *w = randn(FG_F32, 1, &C, 3, 1), *b = randn(FG_F32, 1, &C, 4, 1);
    fg_tensor *idx = fg_empty(FG_I32, 1, &N), *t = fg_empty(FG_I32, 1, &N);
    for (int64_t i = 0; i < N; i++) {
        ((int32_t *)fg_tensor_data(idx))[i] = (int32_t)(i * 31 % V);
        ((int32_t *)fg_tensor_data(t))[i] = i % 5 ? (int32_t)(i % C) : -100;
    }
    fg_tensor *out[2][8];
    for (int th = 0; th < 2; th++) {
        CHECK_OK(fg_set_num_threads(th + 1));
        fg_tensor *y = fg_empty_like(x), *m = fg_empty(FG_F32, 1, &N), *r = fg_empty(FG_F32, 1, &N);
        CHECK_OK(ops()->layernorm_fwd(x, w, b, 1e-5, y, m, r));
        fg_tensor *dx = fg_zeros_like(x), *dw = fg_zeros_like(w), *db = fg_zeros_like(b);
        CHECK_OK(ops()->layernorm_bwd(x, w, m, r, dy, dx, dw, db));
        fg_tensor *de = fg_zeros(FG_F32, 2, es);
        CHECK_OK(ops()->embedding_bwd(idx, dy, de));
        fg_tensor *loss = fg_empty(FG_F32, 0, NULL), *dl = fg_zeros_like(x);
        int64_t cnt;
        CHECK_OK(ops()->cross_entropy_fwd(x, t, -100, loss, &cnt));
        CHECK_OK(ops()->cross_entropy_bwd(x, t, -100, 1.0, cnt, dl));
        fg_tensor *sd = fg_empty(FG_F32, 1, &C);
        CHECK_OK(ops()->sum_dim(x, 0, sd, 1.0));
        fg_tensor *res[8] = {y, dx, dw, db, de, loss, dl, sd};
        memcpy(out[th], res, sizeof res);
    }
    for (int k = 0; k < 8; k++) CHECK_MSG(same_bits(out[0][k], out[1][k]), "result %d differs", k);
    CHECK_OK(fg_set_num_threads(prev));
    fg_step_reset();
}
