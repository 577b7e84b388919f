/* Autocast (fg_autocast_set): linear and matmul, forward and backward, in
 * bf16 and f16 against the exact (f64) result of the f32 inputs, within
 * the dtype's error bound: each product of two rounded operands is off by
 * at most (2u + u^2) of its size (u = 2^-8 for bf16, 2^-11 for f16), so an
 * output element is within (2u + u^2) sum |a_i b_i| plus the f32
 * accumulation, and the output, in the low dtype, is rounded once more (u
 * of its size). Backward multiplies the output's gradient, itself rounded
 * to the low dtype, with the rounded operands: (3u + 3u^2) sum |...|. bf16 runs on every path this
 * machine has: the default (oneDNN's bf16 product where it implements it) and the f32 fallback
 * (forced), each printed; the two agree within one rounding of the output.
 * The bias is added in f32 before the output's rounding; its gradient is
 * the f32 sum of the rounded output gradient (u); the gradients of f32
 * inputs are f32. Also: the setting itself, f64 untouched, fg_cast's gradient, f16's
 * range (a value beyond 65504 becomes inf: what 16-mixed's scaler is for). */
#include <math.h>

#include "fulgur/precision.h"
#include "harness.h"
#include "ops/cpu/cpu_impl.h"

static double unit_roundoff(fg_dtype dt) { return dt == FG_BF16 ? 0x1p-8 : 0x1p-11; }

/* A persistent f32 leaf with N(0, 1) values (seeded), requiring grad. */
static fg_tensor *leaf(int nd, const int64_t *shape, uint64_t seed) {
    fg_tensor *t = fg_tensor_new(FG_F32, nd, shape);
    fg_rng_fill_normal(seed, 0, fg_tensor_data(t), fg_tensor_numel(t), 0, 1);
    fg_tensor_set_requires_grad(t, true);
    return t;
}

/* max over i of |got - ref| / (c * absref + atol): <= 1 passes */
static double worst(const float *got, const double *ref, const double *absref, int64_t n, double c,
                    double atol) {
    double w = 0;
    for (int64_t i = 0; i < n; i++) {
        double r = fabs((double)got[i] - ref[i]) / (c * absref[i] + atol);
        if (!(r <= w)) w = r; /* NaN wins */
    }
    return w;
}

typedef struct variant {
    fg_dtype dt;
    const char *mode; /* FULGUR_MATMUL_BF16 for bf16, NULL for f16 */
} variant;

static const variant k_variants[] = {
    {FG_BF16, "auto"},
    {FG_BF16, "fallback"},
    {FG_F16, NULL},
};
#define NVAR (int)(sizeof k_variants / sizeof k_variants[0])

static void set_variant(const variant *v) {
    CHECK_OK(fg__matmul_bf16_set_mode(v->mode ? v->mode : "auto"));
    if (v->dt == FG_BF16) printf("    bf16 (%s): %s\n", v->mode, fg_matmul_bf16_path());
    else printf("    f16: f16 operands widened (%s), f32 products\n", fg_ops_lowp_path());
}

/* ---------------------------------------------------------------- linear */

#define R 10 /* rows: x (2, 5, IN) */
#define IN 37
#define OUT 19

/* y = x w^T + b with loss sum(y * r); every output and gradient is checked
 * against f64 sums over the f32 inputs. out_y (R*OUT) gets y. */
static void linear_case(const variant *v, float *out_y) {
    int64_t sx[3] = {2, 5, IN}, sw[2] = {OUT, IN}, sb[1] = {OUT}, sy[3] = {2, 5, OUT};
    fg_tensor *x = leaf(3, sx, 1), *w = leaf(2, sw, 2), *b = leaf(1, sb, 3);
    fg_tensor *r = fg_empty(FG_F32, 3, sy);
    fg_rng_fill_normal(4, 0, fg_tensor_data(r), R * OUT, 0, 1);
    fg_dtype prev;
    CHECK_OK(fg_autocast_set(v->dt, &prev));
    fg_tensor *y = fg_linear(x, w, b);
    CHECK_OK(fg_autocast_set(prev, NULL));
    CHECK_MSG(y && fg_tensor_dtype(y) == v->dt, "autocast linear gives %s: %s",
              fg_dtype_name(v->dt), fg_last_error());
    fg_tensor *yf = y ? fg_cast(y, FG_F32) : NULL;
    if (!yf) return;
    CHECK_OK(fg_backward(fg_sum(fg_mul(y, r))));
    const float *px = fg_tensor_data(x), *pw = fg_tensor_data(w), *pb = fg_tensor_data(b);
    const float *pr = fg_tensor_data(r);
    static double ref[R * IN + OUT * IN + R * OUT], abs_[R * IN + OUT * IN + R * OUT];
    double u = unit_roundoff(v->dt), c = 3 * u + 3 * u * u + 64 * 0x1p-24;
    /* forward */
    for (int i = 0; i < R; i++)
        for (int o = 0; o < OUT; o++) {
            double s = pb[o], a = fabs(pb[o]);
            for (int k = 0; k < IN; k++) {
                s += (double)px[i * IN + k] * pw[o * IN + k];
                a += fabs((double)px[i * IN + k] * pw[o * IN + k]);
            }
            ref[i * OUT + o] = s;
            abs_[i * OUT + o] = a;
        }
    double e = worst(fg_tensor_data(yf), ref, abs_, R * OUT, c, 1e-6);
    CHECK_MSG(e <= 1, "%s forward: error %.3g of the bound", fg_dtype_name(v->dt), e);
    memcpy(out_y, fg_tensor_data(yf), sizeof(float) * R * OUT);
    /* rounding happened: the result is not the f32 one */
    double d = 0;
    for (int i = 0; i < R * OUT; i++) d = fmax(d, fabs(out_y[i] - ref[i]));
    CHECK_MSG(d > 1e-5, "%s forward equals f32 (max diff %g): no rounding?", fg_dtype_name(v->dt),
              d);
    /* dx = r w: (R, IN) */
    for (int i = 0; i < R; i++)
        for (int k = 0; k < IN; k++) {
            double s = 0, a = 0;
            for (int o = 0; o < OUT; o++) {
                s += (double)pr[i * OUT + o] * pw[o * IN + k];
                a += fabs((double)pr[i * OUT + o] * pw[o * IN + k]);
            }
            ref[i * IN + k] = s;
            abs_[i * IN + k] = a;
        }
    fg_tensor *gx = fg_tensor_grad(x), *gw = fg_tensor_grad(w), *gb = fg_tensor_grad(b);
    CHECK(gx && gw && gb && fg_tensor_dtype(gx) == FG_F32 && fg_tensor_dtype(gw) == FG_F32);
    if (!gx || !gw || !gb) return;
    e = worst(fg_tensor_data(gx), ref, abs_, R * IN, c, 1e-6);
    CHECK_MSG(e <= 1, "%s dx: error %.3g of the bound", fg_dtype_name(v->dt), e);
    /* dw = r^T x: (OUT, IN) */
    for (int o = 0; o < OUT; o++)
        for (int k = 0; k < IN; k++) {
            double s = 0, a = 0;
            for (int i = 0; i < R; i++) {
                s += (double)pr[i * OUT + o] * px[i * IN + k];
                a += fabs((double)pr[i * OUT + o] * px[i * IN + k]);
            }
            ref[o * IN + k] = s;
            abs_[o * IN + k] = a;
        }
    e = worst(fg_tensor_data(gw), ref, abs_, OUT * IN, c, 1e-6);
    CHECK_MSG(e <= 1, "%s dw: error %.3g of the bound", fg_dtype_name(v->dt), e);
    /* db = column sums of r rounded to the low dtype, summed in f32 */
    for (int o = 0; o < OUT; o++) {
        double s = 0, a = 0;
        for (int i = 0; i < R; i++) s += pr[i * OUT + o], a += fabs(pr[i * OUT + o]);
        ref[o] = s;
        abs_[o] = a;
    }
    e = worst(fg_tensor_data(gb), ref, abs_, OUT, u + 1e-6, 1e-6);
    CHECK_MSG(e <= 1, "%s db (f32): error %.3g of the bound", fg_dtype_name(v->dt), e);
    fg_tensor_free(x);
    fg_tensor_free(w);
    fg_tensor_free(b);
    fg_step_reset();
}

TEST(linear_forward_backward) {
    static float y[NVAR][R * OUT];
    for (int i = 0; i < NVAR; i++) {
        set_variant(&k_variants[i]);
        linear_case(&k_variants[i], y[i]);
    }
    /* the two bf16 paths: the same rounded operands, f32 sums in another
     * order, then one rounding to bf16: at most one bf16 ulp apart */
    for (int i = 0; i < R * OUT; i++)
        CHECK_MSG(fabs(y[0][i] - y[1][i]) <= 0x1p-7 * fabs(y[0][i]) + 1e-6,
                  "bf16 paths differ at %d: %g vs %g", i, y[0][i], y[1][i]);
    CHECK_OK(fg__matmul_bf16_set_mode(NULL));
}

/* ---------------------------------------------------------------- matmul */

/* a (BT, M, K) @ b: (BT, K, N), or (K, N) when shared; loss sum(y * r). */
static void matmul_case(const variant *v, bool shared) {
    enum { BT = 3, M = 5, K = 29, N = 7 };
    int64_t sa[3] = {BT, M, K}, sb3[3] = {BT, K, N}, sb2[2] = {K, N}, sy[3] = {BT, M, N};
    fg_tensor *a = leaf(3, sa, 5), *b = shared ? leaf(2, sb2, 6) : leaf(3, sb3, 6);
    fg_tensor *r = fg_empty(FG_F32, 3, sy);
    fg_rng_fill_normal(7, 0, fg_tensor_data(r), BT * M * N, 0, 1);
    CHECK_OK(fg_autocast_set(v->dt, NULL));
    fg_tensor *y = fg_matmul(a, b);
    CHECK_OK(fg_autocast_set(FG_DTYPE_DEFAULT, NULL));
    CHECK_MSG(y && fg_tensor_dtype(y) == v->dt, "autocast matmul gives %s: %s",
              fg_dtype_name(v->dt), fg_last_error());
    fg_tensor *yf = y ? fg_cast(y, FG_F32) : NULL;
    if (!yf) return;
    CHECK_OK(fg_backward(fg_sum(fg_mul(y, r))));
    const float *pa = fg_tensor_data(a), *pb = fg_tensor_data(b), *pr = fg_tensor_data(r);
    double u = unit_roundoff(v->dt), c = 3 * u + 3 * u * u + 64 * 0x1p-24;
    static double ref[BT * K * N + BT * M * K], abs_[BT * K * N + BT * M * K];
#define B_AT(t, k, n) pb[(shared ? 0 : (t)*K * N) + (k)*N + (n)]
    for (int t = 0; t < BT; t++)
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                double s = 0, q = 0;
                for (int k = 0; k < K; k++) {
                    double p = (double)pa[(t * M + m) * K + k] * B_AT(t, k, n);
                    s += p;
                    q += fabs(p);
                }
                ref[(t * M + m) * N + n] = s;
                abs_[(t * M + m) * N + n] = q;
            }
    double e = worst(fg_tensor_data(yf), ref, abs_, BT * M * N, c, 1e-6);
    CHECK_MSG(e <= 1, "%s matmul%s forward: error %.3g of the bound", fg_dtype_name(v->dt),
              shared ? " (shared b)" : "", e);
    /* da = r b^T */
    for (int t = 0; t < BT; t++)
        for (int m = 0; m < M; m++)
            for (int k = 0; k < K; k++) {
                double s = 0, q = 0;
                for (int n = 0; n < N; n++) {
                    double p = (double)pr[(t * M + m) * N + n] * B_AT(t, k, n);
                    s += p;
                    q += fabs(p);
                }
                ref[(t * M + m) * K + k] = s;
                abs_[(t * M + m) * K + k] = q;
            }
    e = worst(fg_tensor_data(fg_tensor_grad(a)), ref, abs_, BT * M * K, c, 1e-6);
    CHECK_MSG(e <= 1, "%s matmul%s da: error %.3g of the bound", fg_dtype_name(v->dt),
              shared ? " (shared b)" : "", e);
    /* db = a^T r, summed over the batch when shared */
    int64_t nb = shared ? K * N : BT * K * N;
    for (int64_t i = 0; i < nb; i++) ref[i] = abs_[i] = 0;
    for (int t = 0; t < BT; t++)
        for (int k = 0; k < K; k++)
            for (int n = 0; n < N; n++)
                for (int m = 0; m < M; m++) {
                    double p = (double)pa[(t * M + m) * K + k] * pr[(t * M + m) * N + n];
                    int64_t o = (shared ? 0 : t * K * N) + k * N + n;
                    ref[o] += p;
                    abs_[o] += fabs(p);
                }
    e = worst(fg_tensor_data(fg_tensor_grad(b)), ref, abs_, nb, c, 1e-6);
    CHECK_MSG(e <= 1, "%s matmul%s db: error %.3g of the bound", fg_dtype_name(v->dt),
              shared ? " (shared b)" : "", e);
#undef B_AT
    fg_tensor_free(a);
    fg_tensor_free(b);
    fg_step_reset();
}

TEST(matmul_forward_backward) {
    for (int i = 0; i < NVAR; i++) {
        set_variant(&k_variants[i]);
        matmul_case(&k_variants[i], false);
        matmul_case(&k_variants[i], true);
    }
    CHECK_OK(fg__matmul_bf16_set_mode(NULL));
}

/* ------------------------------------------------------------ the setting */

TEST(setting) {
    CHECK(fg_autocast_dtype() == FG_DTYPE_DEFAULT); /* off by default */
    fg_dtype prev = FG_U8;
    CHECK_OK(fg_autocast_set(FG_BF16, &prev));
    CHECK(prev == FG_DTYPE_DEFAULT && fg_autocast_dtype() == FG_BF16);
    CHECK_STATUS(fg_autocast_set(FG_F64, &prev), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "autocast: dtype f64; expected bf16, f16");
    CHECK(fg_autocast_dtype() == FG_BF16); /* unchanged */
    CHECK_OK(fg_autocast_set(FG_F16, &prev));
    CHECK(prev == FG_BF16 && fg_autocast_dtype() == FG_F16);
    CHECK_OK(fg_autocast_set(FG_F32, NULL)); /* f32 means off */
    CHECK(fg_autocast_dtype() == FG_DTYPE_DEFAULT);
}

/* Off, products are the f32 ones bit for bit; on, f64 inputs are left
 * alone (as PyTorch's CPU autocast leaves f64), and under no-grad nothing
 * is recorded. */
TEST(off_and_f64_untouched) {
    int64_t sx[2] = {4, 9}, sw[2] = {6, 9};
    fg_tensor *x = fg_empty(FG_F32, 2, sx), *w = fg_empty(FG_F32, 2, sw);
    fg_rng_fill_normal(1, 0, fg_tensor_data(x), 36, 0, 1);
    fg_rng_fill_normal(2, 0, fg_tensor_data(w), 54, 0, 1);
    fg_tensor *y0 = fg_linear(x, w, NULL);
    CHECK_OK(fg_autocast_set(FG_BF16, NULL));
    CHECK_OK(fg_autocast_set(FG_DTYPE_DEFAULT, NULL));
    fg_tensor *y1 = fg_linear(x, w, NULL);
    CHECK(y0 && y1 && !memcmp(fg_tensor_data(y0), fg_tensor_data(y1), 24 * sizeof(float)));
    fg_tensor *x64 = fg_empty(FG_F64, 2, sx), *w64 = fg_empty(FG_F64, 2, sw);
    CHECK_OK(fg_tensor_copy(x64, x));
    CHECK_OK(fg_tensor_copy(w64, w));
    fg_tensor *z0 = fg_linear(x64, w64, NULL);
    CHECK_OK(fg_autocast_set(FG_BF16, NULL));
    fg_tensor *z1 = fg_linear(x64, w64, NULL);
    bool prevg = fg_set_grad_enabled(false);
    int64_t tape = fg_tape_size();
    fg_tensor_set_requires_grad(x, true);
    CHECK(fg_linear(x, w, NULL) != NULL && fg_tape_size() == tape);
    fg_set_grad_enabled(prevg);
    CHECK_OK(fg_autocast_set(FG_DTYPE_DEFAULT, NULL));
    CHECK(z0 && z1 && fg_tensor_dtype(z1) == FG_F64 &&
          !memcmp(fg_tensor_data(z0), fg_tensor_data(z1), 24 * sizeof(double)));
    fg_step_reset();
}

/* fg_cast: values rounded once, the gradient converted back to the input's
 * dtype. */
TEST(cast) {
    int64_t s[1] = {5};
    fg_tensor *x = fg_tensor_new(FG_F32, 1, s);
    float v[5] = {1.0f, 1.00390625f + 0x1p-12f, -3.14159f, 70000.0f, 1e-3f};
    memcpy(fg_tensor_data(x), v, sizeof v);
    fg_tensor_set_requires_grad(x, true);
    fg_tensor *h = fg_cast(x, FG_BF16);
    CHECK(h && fg_tensor_dtype(h) == FG_BF16);
    for (int i = 0; h && i < 5; i++)
        CHECK_CLOSE(fg_tensor_get(h, i), fg_bf16_to_f32(fg_f32_to_bf16(v[i])), 0, 0);
    fg_tensor *f = fg_cast(x, FG_F16);
    CHECK(f && isinf(fg_tensor_get(f, 3))); /* beyond f16's 65504 */
    CHECK(fg_cast(x, FG_F32) == x);
    /* loss = sum(cast(x) to f32 * 3): dx = 3 */
    fg_tensor *back = fg_cast(h, FG_F32);
    CHECK_OK(fg_backward(fg_sum(fg_scale(back, 3.0))));
    fg_tensor *g = fg_tensor_grad(x);
    for (int i = 0; g && i < 5; i++) CHECK_CLOSE(fg_tensor_get(g, i), 3.0, 0, 0);
    CHECK(fg_cast(x, FG_I32) == NULL);
    CHECK_CONTAINS(fg_last_error(), "cast: f32 -> i32");
    fg_tensor_free(x);
    fg_step_reset();
}

/* f16's range: an operand beyond 65504 rounds to inf, and so does the
 * product (16-mixed's scaler skips such a step); bf16 has f32's range. */
TEST(f16_range) {
    int64_t sx[2] = {1, 2}, sw[2] = {1, 2};
    float xv[2] = {70000.0f, 1.0f}, wv[2] = {1.0f, 1.0f};
    fg_tensor *x = fg_from_data(FG_F32, 2, sx, xv), *w = fg_from_data(FG_F32, 2, sw, wv);
    CHECK_OK(fg_autocast_set(FG_F16, NULL));
    fg_tensor *y = fg_linear(x, w, NULL);
    CHECK(y && isinf(fg_tensor_get(y, 0)));
    CHECK_OK(fg_autocast_set(FG_BF16, NULL));
    y = fg_linear(x, w, NULL);
    CHECK(y && isfinite(fg_tensor_get(y, 0)));
    CHECK_OK(fg_autocast_set(FG_DTYPE_DEFAULT, NULL));
    fg_step_reset();
}
