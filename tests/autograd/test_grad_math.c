/* The elementwise functions (div, exp, log, sqrt, rsqrt, pow, abs, clamp,
 * sigmoid, tanh, silu, exact GELU, softplus, leaky_relu, elu), softmax over
 * any dim and the moments over several dims (sum_dims, mean_dims, var and
 * std with a correction): gradients by finite differences in f64
 * (tests/gradcheck.h) at odd sizes, values against a naive loop in libm's
 * double in f64 and f32, the PyTorch edge cases (the derivative at a kink,
 * NaN through clamp, pow 0), and the errors. */
#include "gradcheck.h"

static void req(fg_tensor **t, int n) {
    for (int i = 0; i < n; i++) fg_tensor_set_requires_grad(t[i], true);
}

#define GC(what, f, in, nin, arg) gradcheck(what, f, in, nin, arg, 1e-6, 1e-8)

/* ------------------------------------------------------------ elementwise */

typedef struct {
    const char *name;
    int id;
    double lo; /* inputs are moved to (lo, ...) for functions with a domain */
} un_case;

enum {
    U_EXP,
    U_LOG,
    U_SQRT,
    U_RSQRT,
    U_POW3,
    U_POWH,
    U_POW0,
    U_ABS,
    U_CLAMP,
    U_CLAMP_LO,
    U_SIG,
    U_TANH,
    U_SILU,
    U_GELU,
    U_SOFTPLUS,
    U_SOFTPLUS_B,
    U_LEAKY,
    U_ELU,
    U_N
};

static const un_case cases[U_N] = {
    {"exp", U_EXP, -1e9},           {"log", U_LOG, 0.1},
    {"sqrt", U_SQRT, 0.1},          {"rsqrt", U_RSQRT, 0.2},
    {"pow 3", U_POW3, -1e9},        {"pow 0.5", U_POWH, 0.1},
    {"pow 0", U_POW0, -1e9},        {"abs", U_ABS, -1e9},
    {"clamp", U_CLAMP, -1e9},       {"clamp lo", U_CLAMP_LO, -1e9},
    {"sigmoid", U_SIG, -1e9},       {"tanh", U_TANH, -1e9},
    {"silu", U_SILU, -1e9},         {"gelu none", U_GELU, -1e9},
    {"softplus", U_SOFTPLUS, -1e9}, {"softplus b2", U_SOFTPLUS_B, -1e9},
    {"leaky_relu", U_LEAKY, -1e9},  {"elu", U_ELU, -1e9},
};

static fg_tensor *apply(int id, fg_tensor *x) {
    switch (id) {
    case U_EXP: return fg_exp(x);
    case U_LOG: return fg_log_tensor(x);
    case U_SQRT: return fg_sqrt(x);
    case U_RSQRT: return fg_rsqrt(x);
    case U_POW3: return fg_pow(x, 3);
    case U_POWH: return fg_pow(x, 0.5);
    case U_POW0: return fg_pow(x, 0);
    case U_ABS: return fg_abs(x);
    case U_CLAMP: return fg_clamp(x, -0.7, 0.4);
    case U_CLAMP_LO: return fg_clamp(x, -0.3, NAN);
    case U_SIG: return fg_sigmoid(x);
    case U_TANH: return fg_tanh(x);
    case U_SILU: return fg_silu(x);
    case U_GELU: return fg_gelu_approximate(x, "none");
    case U_SOFTPLUS: return fg_softplus(x, 1, 20);
    case U_SOFTPLUS_B: return fg_softplus(x, 2, 3);
    case U_LEAKY: return fg_leaky_relu(x, 0.01);
    case U_ELU: return fg_elu(x, 1.3);
    }
    return NULL;
}

/* the naive reference in double */
static double ref(int id, double v) {
    switch (id) {
    case U_EXP: return exp(v);
    case U_LOG: return log(v);
    case U_SQRT: return sqrt(v);
    case U_RSQRT: return 1 / sqrt(v);
    case U_POW3: return v * v * v;
    case U_POWH: return sqrt(v);
    case U_POW0: return 1;
    case U_ABS: return fabs(v);
    case U_CLAMP: return v < -0.7 ? -0.7 : v > 0.4 ? 0.4 : v;
    case U_CLAMP_LO: return v < -0.3 ? -0.3 : v;
    case U_SIG: return 1 / (1 + exp(-v));
    case U_TANH: return tanh(v);
    case U_SILU: return v / (1 + exp(-v));
    case U_GELU: return 0.5 * v * (1 + erf(v / sqrt(2)));
    case U_SOFTPLUS: return v > 20 ? v : log(1 + exp(v));
    case U_SOFTPLUS_B: return 2 * v > 3 ? v : log(1 + exp(2 * v)) / 2;
    case U_LEAKY: return v > 0 ? v : 0.01 * v;
    case U_ELU: return v > 0 ? v : 1.3 * (exp(v) - 1);
    }
    return NAN;
}

static fg_tensor *f_unary(fg_tensor **in, void *arg) { return apply(*(int *)arg, in[0]); }

/* x moved into the case's domain, away from kinks by at least 1e-3 */
static void domain(fg_tensor *x, const un_case *c) {
    double *p = fg_tensor_data(x);
    for (int64_t i = 0; i < fg_tensor_numel(x); i++) {
        if (c->lo > -1e8) p[i] = c->lo + fabs(p[i]);
        double kinks[] = {0, -0.7, 0.4, -0.3, 1.5};
        for (int k = 0; k < 5; k++)
            if (fabs(p[i] - kinks[k]) < 1e-3) p[i] += 3e-3;
    }
}

TEST(elementwise_gradients_and_values_f64) {
    int64_t shapes[3][3] = {{5, 7, 0}, {13, 0, 0}, {2, 3, 5}};
    int nds[3] = {2, 1, 3};
    for (int c = 0; c < U_N; c++)
        for (int s = 0; s < 3; s++) {
            fg_tensor *x = gc_randn(nds[s], shapes[s], 100 + c * 3 + s, 1.7);
            domain(x, &cases[c]);
            req(&x, 1);
            int id = cases[c].id;
            CHECK_MSG(GC(cases[c].name, f_unary, &x, 1, &id) == 0, "%s shape %d", cases[c].name, s);
            fg_tensor *y = apply(id, x);
            int bad = 0;
            for (int64_t i = 0; y && i < fg_tensor_numel(x); i++) {
                double want = ref(id, fg_tensor_get(x, i)), got = fg_tensor_get(y, i);
                bad += !(fabs(got - want) <= 1e-14 + 1e-14 * fabs(want));
            }
            CHECK_MSG(y && bad == 0, "%s shape %d: %d values off", cases[c].name, s, bad);
            fg_step_reset();
            fg_tensor_free(x);
        }
}

TEST(elementwise_values_f32_against_double) {
    int64_t n = 1031; /* odd, past any vector width */
    for (int c = 0; c < U_N; c++) {
        fg_tensor *x64 = gc_randn(1, &n, 300 + c, 3);
        domain(x64, &cases[c]);
        fg_tensor *x = fg_empty(FG_F32, 1, &n);
        CHECK_OK(fg_tensor_copy(x, x64));
        fg_tensor *y = apply(cases[c].id, x);
        CHECK(y && fg_tensor_dtype(y) == FG_F32);
        int bad = 0;
        for (int64_t i = 0; y && i < n; i++) {
            double want = ref(cases[c].id, fg_tensor_get(x, i)), got = fg_tensor_get(y, i);
            bad += !(fabs(got - want) <= 1e-6 * fabs(want) + 1e-7);
        }
        CHECK_MSG(bad == 0, "%s f32: %d of %lld off", cases[c].name, bad, (long long)n);
        fg_step_reset();
        fg_tensor_free(x64);
    }
    /* exact GELU's tail keeps its relative accuracy in f32 (0.5 (1 +
     * erff(x)) cancelled: 1.1e-5 off at -3, 0 from -7.9; the cdf from erfc
     * is within 8e-6 to -9), and its gradient too */
    int64_t m = 601;
    fg_tensor *x = fg_empty(FG_F32, 1, &m);
    float *px = fg_tensor_data(x);
    for (int64_t i = 0; i < m; i++) px[i] = (float)(-9.0 + 0.01 * (double)i); /* [-9, -3] */
    fg_tensor_set_requires_grad(x, true);
    fg_tensor *y = fg_gelu_approximate(x, "none");
    CHECK_OK(fg_backward_with(y, fg_full(FG_F32, 1, &m, 1)));
    int bad = 0;
    for (int64_t i = 0; y && i < m; i++) {
        double v = fg_tensor_get(x, i), cdf = 0.5 * erfc(-v / sqrt(2.0));
        double dref = cdf + v * exp(-0.5 * v * v) / sqrt(2 * M_PI);
        bad += !(fabs(fg_tensor_get(y, i) - v * cdf) <= 1e-5 * fabs(v * cdf));
        bad += !(fabs(fg_tensor_get(fg_tensor_grad(x), i) - dref) <= 1e-5 * fabs(dref));
    }
    CHECK_MSG(bad == 0, "gelu f32 on [-9, -3]: %d values or gradients off", bad);
    fg_step_reset();
    fg_tensor_free(x);
}

TEST(elementwise_edge_cases_as_pytorch) {
    double v[] = {0, NAN, -2, 30, -30};
    int64_t n = 5;
    fg_tensor *x = fg_tensor_new(FG_F64, 1, &n);
    memcpy(fg_tensor_data(x), v, sizeof v);
    fg_tensor_set_requires_grad(x, true);
    /* abs'(0) = 0; clamp lets NaN through and passes the gradient at its bounds */
    fg_tensor *y = fg_abs(x);
    CHECK_OK(fg_backward_with(y, fg_full(FG_F64, 1, &n, 1)));
    CHECK(fg_tensor_get(fg_tensor_grad(x), 0) == 0 && fg_tensor_get(fg_tensor_grad(x), 2) == -1);
    fg_tensor_zero_grad(x);
    y = fg_clamp(x, -2, 0);
    CHECK(y && isnan(fg_tensor_get(y, 1)) && fg_tensor_get(y, 3) == 0 && fg_tensor_get(y, 4) == -2);
    CHECK_OK(fg_backward_with(y, fg_full(FG_F64, 1, &n, 1)));
    fg_tensor *g = fg_tensor_grad(x);
    CHECK(fg_tensor_get(g, 0) == 1 && fg_tensor_get(g, 2) == 1 && fg_tensor_get(g, 3) == 0 &&
          fg_tensor_get(g, 1) == 0);
    /* min > max gives max */
    y = fg_clamp(x, 1, -1);
    CHECK(y && fg_tensor_get(y, 0) == -1 && fg_tensor_get(y, 3) == -1);
    /* leaky_relu'(0) is the slope's; elu'(0) is alpha; pow 0 has no gradient */
    fg_tensor_zero_grad(x);
    y = fg_leaky_relu(x, 0.25);
    CHECK_OK(fg_backward_with(y, fg_full(FG_F64, 1, &n, 1)));
    CHECK(fg_tensor_get(fg_tensor_grad(x), 0) == 0.25);
    fg_tensor_zero_grad(x);
    y = fg_elu(x, 2);
    CHECK_OK(fg_backward_with(y, fg_full(FG_F64, 1, &n, 1)));
    CHECK(fg_tensor_get(fg_tensor_grad(x), 0) == 2);
    fg_tensor_zero_grad(x);
    y = fg_pow(x, 0);
    CHECK_OK(fg_backward_with(y, fg_full(FG_F64, 1, &n, 1)));
    CHECK(fg_tensor_get(fg_tensor_grad(x), 2) == 0 && fg_tensor_get(y, 1) == 1);
    /* sigmoid / softplus / tanh saturate without NaN */
    y = fg_sigmoid(x);
    CHECK(fg_tensor_get(y, 3) == 1.0 / (1 + exp(-30.0)) && fg_tensor_get(y, 4) > 0);
    y = fg_softplus(x, 1, 20);
    CHECK(fg_tensor_get(y, 3) == 30 && fg_tensor_get(y, 4) == log1p(exp(-30.0)));
    /* errors */
    CHECK(fg_gelu_approximate(x, "erf") == NULL);
    CHECK_CONTAINS(fg_last_error(), "\"none\" or \"tanh\"");
    CHECK(fg_softplus(x, 0, 20) == NULL);
    CHECK_CONTAINS(fg_last_error(), "beta");
    CHECK(fg_exp(NULL) == NULL);
    fg_tensor *iv = fg_zeros(FG_I32, 1, &n);
    CHECK(fg_sigmoid(iv) == NULL);
    CHECK_CONTAINS(fg_last_error(), "not supported");
    fg_step_reset();
    fg_tensor_free(x);
}

TEST(elementwise_bf16_computed_in_f32) {
    int64_t n = 37;
    fg_tensor *x64 = gc_randn(1, &n, 77, 1);
    fg_tensor *xb = fg_empty(FG_BF16, 1, &n), *xf = fg_empty(FG_F32, 1, &n);
    CHECK_OK(fg_tensor_copy(xb, x64));
    CHECK_OK(fg_tensor_copy(xf, xb));
    fg_tensor *yb = fg_silu(xb), *yf = fg_silu(xf);
    CHECK(yb && fg_tensor_dtype(yb) == FG_BF16);
    fg_tensor *yr = fg_empty(FG_BF16, 1, &n);
    CHECK_OK(fg_tensor_copy(yr, yf)); /* f32 rounded once */
    CHECK(yb && memcmp(fg_tensor_data(yb), fg_tensor_data(yr), (size_t)n * 2) == 0);
    fg_step_reset();
    fg_tensor_free(x64);
}

/* ------------------------------------------------------------------ div */

static fg_tensor *f_div(fg_tensor **in, void *arg) {
    (void)arg;
    return fg_div(in[0], in[1]);
}

TEST(div_gradients_with_broadcasting) {
    int64_t sa[] = {3, 5}, sb[] = {5}, sc[] = {3, 1};
    fg_tensor *a = gc_randn(2, sa, 1, 1), *b = gc_randn(1, sb, 2, 1), *c = gc_randn(2, sc, 3, 1);
    double *pb = fg_tensor_data(b), *pc = fg_tensor_data(c);
    for (int i = 0; i < 5; i++) pb[i] = pb[i] > 0 ? pb[i] + 0.5 : pb[i] - 0.5;
    for (int i = 0; i < 3; i++) pc[i] = pc[i] > 0 ? pc[i] + 0.5 : pc[i] - 0.5;
    fg_tensor *in[2] = {a, b};
    req(in, 2);
    CHECK(GC("div (3,5)/(5)", f_div, in, 2, NULL) == 0);
    fg_tensor *in2[2] = {b, c};
    req(&c, 1);
    CHECK(GC("div (5)/(3,1)", f_div, in2, 2, NULL) == 0);
    fg_tensor *y = fg_div(a, b);
    CHECK(y && fg_tensor_get(y, 7) == fg_tensor_get(a, 7) / fg_tensor_get(b, 2));
    fg_step_reset();
    fg_tensor_free(a);
    fg_tensor_free(b);
    fg_tensor_free(c);
}

/* ------------------------------------------------------------------ softmax dim */

static fg_tensor *f_softmax_dim(fg_tensor **in, void *arg) {
    int d = *(int *)arg;
    return d >= 100 ? fg_log_softmax_dim(in[0], d - 100) : fg_softmax_dim(in[0], d);
}

TEST(softmax_over_any_dim) {
    int64_t s[] = {3, 4, 5};
    fg_tensor *x = gc_randn(3, s, 9, 1);
    req(&x, 1);
    int dims[] = {0, 1, 2, -1, 100, 101, 102};
    for (int k = 0; k < 7; k++)
        CHECK_MSG(GC("softmax_dim", f_softmax_dim, &x, 1, &dims[k]) == 0, "dim %d", dims[k]);
    fg_tensor *y = fg_softmax_dim(x, 1);
    double z = 0; /* column (0, :, 2) sums to 1 */
    for (int j = 0; j < 4; j++) z += fg_tensor_get(y, j * 5 + 2);
    CHECK_CLOSE(z, 1, 1e-14, 1e-14);
    CHECK(fg_softmax_dim(x, 3) == NULL);
    fg_step_reset();
    fg_tensor_free(x);
}

/* ------------------------------------------------------------------ moments */

typedef struct {
    int kind; /* 0 sum, 1 mean, 2 var, 3 std */
    int nd;
    int dims[3];
    double corr;
    bool keep;
} mom_arg;

static fg_tensor *f_mom(fg_tensor **in, void *arg) {
    mom_arg *m = arg;
    switch (m->kind) {
    case 0: return fg_sum_dims(in[0], m->nd, m->dims, m->keep);
    case 1: return fg_mean_dims(in[0], m->nd, m->dims, m->keep);
    case 2: return fg_var(in[0], m->nd, m->dims, m->corr, m->keep);
    default: return fg_std(in[0], m->nd, m->dims, m->corr, m->keep);
    }
}

TEST(moments_over_dims_gradients_and_values) {
    int64_t s[] = {3, 4, 5};
    fg_tensor *x = gc_randn(3, s, 11, 1.3);
    req(&x, 1);
    mom_arg args[] = {{0, 2, {0, 2}, 0, false}, {1, 2, {-1, 0}, 0, true},
                      {2, 1, {1}, 1, false},    {2, 2, {0, 2}, 0, true},
                      {3, 0, {0}, 1, false},    {3, 3, {0, 1, 2}, 2, true},
                      {1, 0, {0}, 0, false},    {2, 1, {-1}, 1, true}};
    for (int k = 0; k < 8; k++) {
        for (int kind = args[k].kind; kind <= args[k].kind; kind++)
            CHECK_MSG(GC("moments", f_mom, &x, 1, &args[k]) == 0, "case %d", k);
    }
    /* values: var over dims 0, 2 unbiased at (., 1, .) */
    mom_arg v = {2, 2, {0, 2}, 1, false};
    fg_tensor *y = f_mom(&x, &v);
    CHECK(y && fg_tensor_ndim(y) == 1 && fg_tensor_dim(y, 0) == 4);
    double m = 0, ss = 0;
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 5; k++) m += fg_tensor_get(x, i * 20 + 1 * 5 + k);
    m /= 15;
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 5; k++) {
            double d = fg_tensor_get(x, i * 20 + 5 + k) - m;
            ss += d * d;
        }
    CHECK_CLOSE(fg_tensor_get(y, 1), ss / 14, 1e-13, 1e-14);
    /* std of everything, keepdim: (1, 1, 1) */
    y = fg_std(x, 0, NULL, 1, true);
    CHECK(y && fg_tensor_ndim(y) == 3 && fg_tensor_numel(y) == 1);
    y = fg_std(x, 0, NULL, 1, false);
    CHECK(y && fg_tensor_ndim(y) == 0);
    /* one element, unbiased: NaN, as PyTorch's */
    int64_t one = 1;
    fg_tensor *o = fg_full(FG_F64, 1, &one, 2);
    CHECK(isnan(fg_item(fg_var(o, 0, NULL, 1, false))));
    CHECK(fg_var(x, 2, (int[]){1, 1}, 1, false) == NULL);
    CHECK_CONTAINS(fg_last_error(), "appears twice");
    CHECK(fg_mean_dims(x, 1, (int[]){3}, false) == NULL);
    CHECK_CONTAINS(fg_last_error(), "out of range");
    fg_step_reset();
    fg_tensor_free(x);
}
