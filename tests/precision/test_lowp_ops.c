/* bf16 and f16 in the ops autocast sends them to (embedding, add, mul,
 * GELU, dropout, attention, linear/matmul), forward and backward, on every
 * conversion path this CPU has (avx512_bf16, avx512, avx2, and the scalar
 * fallback), each printed as it runs.
 *
 * A low-precision op widens its inputs (exactly), runs the f32 kernel and
 * rounds each output once. So the reference is the f32 op on the same
 * (widened) values, rounded to the dtype: every path must give those bits
 * exactly, which is within the dtype's rounding (u = 2^-8 for bf16, 2^-11
 * for f16, relative) of the f32 result; that bound is checked too, so a
 * kernel that rounded twice, or not at all, fails. The conversions
 * themselves are checked bit for bit between paths on specials, ties and
 * random values. And the activations a GPT step keeps: under bf16-mixed,
 * the step arena's peak is below 32-true's. */
#include <math.h>
#include <string.h>

#include "fulgur/precision.h"
#include "harness.h"
#include "ops/cpu/lowp.h"

static double unit_roundoff(fg_dtype dt) { return dt == FG_BF16 ? 0x1p-8 : 0x1p-11; }

static float round_to(float x, fg_dtype dt) {
    return dt == FG_BF16 ? fg_bf16_to_f32(fg_f32_to_bf16(x)) : fg_f16_to_f32(fg_f32_to_f16(x));
}

/* ----------------------------------------------------------- conversions */

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#define NCVT 4099 /* not a multiple of any vector width: the tails run too */

TEST(conversions_agree_on_every_path) {
    static float src[NCVT], back[NCVT];
    static uint16_t ref[2][NCVT], got[NCVT];
    const float special[] = {0.0f,     -0.0f,       INFINITY,         -INFINITY,
                             NAN,      -NAN,        65504.0f,         65520.0f,
                             1e9f,     3.4e38f,     u2f(0x00000001u), u2f(0x807fffffu),
                             6e-8f,    3e-8f,       1.00390625f,      1.01171875f,
                             0x1p-14f, 0x1.ffcp-15f};
    int ns = (int)(sizeof special / sizeof special[0]);
    for (int i = 0; i < NCVT; i++) {
        if (i < ns) src[i] = special[i];
        else if (i % 3 == 0) /* ties of bf16 and of f16 */
            src[i] =
                u2f((fg_rng_u32_at(5, (uint64_t)i) & 0xffff0000u) | (i % 2 ? 0x8000u : 0x1000u));
        else src[i] = u2f(fg_rng_u32_at(6, (uint64_t)i)); /* any bits: NaNs, subnormals too */
    }
    fg_dtype dts[2] = {FG_BF16, FG_F16};
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < NCVT; i++)
            ref[d][i] = dts[d] == FG_BF16 ? fg_f32_to_bf16(src[i]) : fg_f32_to_f16(src[i]);
    int ran = 0;
    for (int p = 0; p < FG_LOWP_COUNT; p++) {
        if (!fg__lowp_path_available((fg__lowp_path)p)) {
            printf("    path %s: not on this CPU (or capped by FULGUR_CPU_ISA)\n",
                   fg__lowp_path_name((fg__lowp_path)p));
            continue;
        }
        CHECK_OK(fg__lowp_path_force(p));
        printf("    path %s\n", fg__lowp_path_name((fg__lowp_path)p));
        ran++;
        for (int d = 0; d < 2; d++) {
            fg__lowp_narrow(got, src, NCVT, dts[d]);
            int bad = 0;
            for (int i = 0; i < NCVT; i++) {
                uint16_t r = ref[d][i], g = got[i];
                bool nan = isnan(src[i]);
                bool sub = (f2u(src[i]) & 0x7f800000u) == 0;
                bool ok =
                    nan ? (dts[d] == FG_BF16 ? (g & 0x7fffu) > 0x7f80u : (g & 0x7fffu) > 0x7c00u)
                        : g == r;
                /* vcvtneps2bf16 flushes f32 subnormals to a signed zero */
                if (!ok && sub && p == FG_LOWP_AVX512_BF16 && dts[d] == FG_BF16)
                    ok = g == (uint16_t)((f2u(src[i]) >> 16) & 0x8000u);
                if (!ok && bad++ < 3)
                    printf("      %s of %a (0x%08x): 0x%04x, want 0x%04x\n", fg_dtype_name(dts[d]),
                           src[i], f2u(src[i]), g, r);
            }
            CHECK_MSG(bad == 0, "path %s, %s: %d values differ from the scalar rounding",
                      fg__lowp_path_name((fg__lowp_path)p), fg_dtype_name(dts[d]), bad);
            /* rounding in f32 (the weights of a product without low-precision
             * hardware): the widened rounding of this path, bit for bit */
            fg__lowp_round_f32(back, src, NCVT, dts[d]);
            int rbad = 0;
            for (int i = 0; i < NCVT; i++) {
                float w = dts[d] == FG_BF16 ? fg_bf16_to_f32(got[i]) : fg_f16_to_f32(got[i]);
                if (!(f2u(w) == f2u(back[i]) || (isnan(w) && isnan(back[i])))) rbad++;
            }
            CHECK_MSG(rbad == 0, "path %s, %s: %d values rounded in f32 differ",
                      fg__lowp_path_name((fg__lowp_path)p), fg_dtype_name(dts[d]), rbad);
            /* widening: exact, the same bits on every path */
            fg__lowp_widen(back, ref[d], NCVT, dts[d]);
            int wbad = 0;
            for (int i = 0; i < NCVT; i++) {
                float w = dts[d] == FG_BF16 ? fg_bf16_to_f32(ref[d][i]) : fg_f16_to_f32(ref[d][i]);
                if (!(f2u(w) == f2u(back[i]) || (isnan(w) && isnan(back[i])))) wbad++;
            }
            CHECK_MSG(wbad == 0, "path %s, %s: %d widened values differ",
                      fg__lowp_path_name((fg__lowp_path)p), fg_dtype_name(dts[d]), wbad);
        }
    }
    CHECK_OK(fg__lowp_path_force(-1));
    CHECK(ran >= 1);
    printf("    default path: %s\n", fg_ops_lowp_path());
}

/* ------------------------------------------------------------------ ops */

/* A persistent leaf of dt holding N(0, sd) values rounded to dt; *f32 (if
 * not NULL) gets an f32 leaf with the same values. */
static fg_tensor *leaf(fg_dtype dt, int nd, const int64_t *shape, uint64_t seed, double sd,
                       fg_tensor **f32) {
    fg_tensor *f = fg_tensor_new(FG_F32, nd, shape);
    float *pf = fg_tensor_data(f);
    fg_rng_fill_normal(seed, 0, pf, fg_tensor_numel(f), 0, (float)sd);
    for (int64_t i = 0; i < fg_tensor_numel(f); i++) pf[i] = round_to(pf[i], dt);
    fg_tensor *t = fg_tensor_new(dt, nd, shape);
    CHECK_OK(fg_convert(fg_tensor_data(t), dt, pf, FG_F32, fg_tensor_numel(f)));
    fg_tensor_set_requires_grad(t, true);
    fg_tensor_set_requires_grad(f, true);
    if (f32) *f32 = f;
    else fg_tensor_free(f);
    return t;
}

/* got (dt) must be exactly ref (f32) rounded to dt, and so within u |ref| */
static void check_rounded(const char *what, fg_dtype dt, const fg_tensor *got,
                          const fg_tensor *ref) {
    CHECK_MSG(got && ref && fg_tensor_dtype(got) == dt &&
                  fg_tensor_numel(got) == fg_tensor_numel(ref),
              "%s: %s result missing or of the wrong dtype (%s)", what, fg_dtype_name(dt),
              fg_last_error());
    if (!got || !ref || fg_tensor_dtype(got) != dt) return;
    int bad = 0, far = 0;
    double u = unit_roundoff(dt);
    for (int64_t i = 0; i < fg_tensor_numel(ref); i++) {
        float r = (float)fg_tensor_get(ref, i), g = (float)fg_tensor_get(got, i);
        if (f2u(g) != f2u(round_to(r, dt)) && !(g == 0 && fabsf(r) < 0x1p-126f)) {
            if (bad++ < 3)
                printf("      %s [%lld]: %a, want %a (f32 %a)\n", what, (long long)i, g,
                       round_to(r, dt), r);
        }
        /* below the normal range the rounding is absolute: half the least subnormal */
        double tiny = dt == FG_F16 ? 0x1p-25 : 0x1p-134;
        if (!(fabs((double)g - r) <= u * fabs(r) + tiny)) far++;
    }
    CHECK_MSG(bad == 0 && far == 0, "%s (%s): %d elements not the rounded f32 result, %d beyond u",
              what, fg_dtype_name(dt), bad, far);
}

/* For a result made of more than one rounded step (a gradient summed from
 * rounded products, attention's backward reading its rounded output):
 * within c u of the f32 result's largest magnitude. */
static void check_close(const char *what, fg_dtype dt, const fg_tensor *got, const fg_tensor *ref,
                        double c) {
    CHECK_MSG(got && ref && fg_tensor_dtype(got) == dt, "%s: %s result missing (%s)", what,
              fg_dtype_name(dt), fg_last_error());
    if (!got || !ref || fg_tensor_dtype(got) != dt) return;
    double big = 0, err = 0;
    for (int64_t i = 0; i < fg_tensor_numel(ref); i++) {
        big = fmax(big, fabs(fg_tensor_get(ref, i)));
        double e = fabs(fg_tensor_get(got, i) - fg_tensor_get(ref, i));
        if (!(e <= err)) err = e;
    }
    CHECK_MSG(err <= c * unit_roundoff(dt) * big, "%s (%s): error %.3g, bound %g u max|ref| = %.3g",
              what, fg_dtype_name(dt), err, c, c * unit_roundoff(dt) * big);
}

typedef fg_tensor *(*op1)(fg_tensor *);
static fg_tensor *drop(fg_tensor *x) { return fg_dropout(x, 0.3, 99, 1000); }

/* y = f(x), loss = sum(y * r): y and dx of the dt run against the f32 run
 * on the same values */
static void unary_case(const char *name, op1 f, fg_dtype dt) {
    int64_t s[3] = {3, 7, 45};
    fg_tensor *xf, *rf;
    fg_tensor *x = leaf(dt, 3, s, 11, 2.0, &xf), *r = leaf(dt, 3, s, 12, 1.0, &rf);
    fg_tensor *y = f(x), *yf = f(xf);
    char what[64];
    snprintf(what, sizeof what, "%s forward", name);
    check_rounded(what, dt, y, yf);
    CHECK_OK(fg_backward(fg_sum(fg_mul(y, r))));
    CHECK_OK(fg_backward(fg_sum(fg_mul(yf, rf))));
    snprintf(what, sizeof what, "%s backward", name);
    check_rounded(what, dt, fg_tensor_grad(x), fg_tensor_grad(xf));
    fg_tensor_free(x), fg_tensor_free(xf), fg_tensor_free(r), fg_tensor_free(rf);
    fg_step_reset();
}

/* a op b with b broadcast over a's rows: the gradient of b sums */
static void binary_case(bool mul, fg_dtype dt) {
    int64_t sa[2] = {33, 20}, sb[1] = {20};
    fg_tensor *af, *bf, *rf;
    fg_tensor *a = leaf(dt, 2, sa, 21, 1.0, &af), *b = leaf(dt, 1, sb, 22, 1.0, &bf);
    fg_tensor *r = leaf(dt, 2, sa, 23, 1.0, &rf);
    fg_tensor *y = mul ? fg_mul(a, b) : fg_add(a, b), *yf = mul ? fg_mul(af, bf) : fg_add(af, bf);
    check_rounded(mul ? "mul forward" : "add forward", dt, y, yf);
    CHECK_OK(fg_backward(fg_sum(fg_mul(y, r))));
    CHECK_OK(fg_backward(fg_sum(fg_mul(yf, rf))));
    check_rounded(mul ? "mul da" : "add da", dt, fg_tensor_grad(a), fg_tensor_grad(af));
    /* db sums 33 rows of g a, each product rounded once: a few u */
    check_close(mul ? "mul db" : "add db", dt, fg_tensor_grad(b), fg_tensor_grad(bf), 4);
    /* mixed: bf16/f16 + f32 promotes to f32 without a cast node's copy */
    fg_tensor *m = fg_add(af, b);
    CHECK(m && fg_tensor_dtype(m) == FG_F32);
    fg_tensor_free(a), fg_tensor_free(af), fg_tensor_free(b), fg_tensor_free(bf);
    fg_tensor_free(r), fg_tensor_free(rf);
    fg_step_reset();
}

static void embedding_case(fg_dtype dt) {
    int64_t sw[2] = {11, 24}, si[2] = {4, 9}, sy[3] = {4, 9, 24};
    fg_tensor *wf, *rf;
    fg_tensor *w = leaf(dt, 2, sw, 31, 1.0, &wf), *r = leaf(dt, 3, sy, 32, 1.0, &rf);
    fg_tensor *idx = fg_empty(FG_I32, 2, si);
    int32_t *pi = fg_tensor_data(idx);
    for (int i = 0; i < 36; i++) pi[i] = (int32_t)(fg_rng_u32_at(33, (uint64_t)i) % 11);
    fg_tensor *y = fg_embedding(idx, w), *yf = fg_embedding(idx, wf);
    check_rounded("embedding forward", dt, y, yf);
    CHECK_OK(fg_backward(fg_sum(fg_mul(y, r))));
    CHECK_OK(fg_backward(fg_sum(fg_mul(yf, rf))));
    check_rounded("embedding backward", dt, fg_tensor_grad(w), fg_tensor_grad(wf));
    pi[5] = 11;
    CHECK(fg_embedding(idx, w) == NULL);
    CHECK_CONTAINS(fg_last_error(), "index 11");
    fg_tensor_free(w), fg_tensor_free(wf), fg_tensor_free(r), fg_tensor_free(rf);
    fg_step_reset();
}

/* B x T x C with 2 heads; B = 3, T = 128, C = 384 is over 512 KiB of f32 per
 * batch entry: the bf16/f16 kernels run it in several chunks of entries
 * (padded: not causal, the last entry's keys 1, 4, 7, ... padding, so each
 * chunk must read its own rows of the mask) */
static void attention_case(fg_dtype dt, int64_t B, int64_t T, int64_t C, bool padded) {
    int64_t sq[3] = {B, T, 3 * C}, sy[3] = {B, T, C}, sm[2] = {B, T};
    fg_tensor *qf, *rf;
    fg_tensor *q = leaf(dt, 3, sq, 41, 1.0, &qf), *r = leaf(dt, 3, sy, 42, 1.0, &rf);
    fg_tensor *kpm = padded ? fg_zeros(FG_U8, 2, sm) : NULL;
    for (int64_t j = 1; kpm && j < T; j += 3) ((uint8_t *)fg_tensor_data(kpm))[(B - 1) * T + j] = 1;
    fg_tensor *y = fg_attention(q, 2, !padded, kpm), *yf = fg_attention(qf, 2, !padded, kpm);
    check_rounded("attention forward", dt, y, yf);
    CHECK_OK(fg_backward(fg_sum(fg_mul(y, r))));
    CHECK_OK(fg_backward(fg_sum(fg_mul(yf, rf))));
    /* the backward reads y, which is rounded in the dt run */
    check_close("attention backward", dt, fg_tensor_grad(q), fg_tensor_grad(qf), 8);
    fg_tensor_free(q), fg_tensor_free(qf), fg_tensor_free(r), fg_tensor_free(rf);
    fg_tensor_free(kpm);
    fg_step_reset();
}

/* Without autocast, linear on bf16/f16 x, w, b: the product accumulated in
 * f32 and rounded once (bf16-true's layers) */
static void linear_case(fg_dtype dt) {
    int64_t sx[2] = {9, 40}, sw[2] = {13, 40}, sb[1] = {13}, sy[2] = {9, 13};
    fg_tensor *xf, *wf, *bf, *rf;
    fg_tensor *x = leaf(dt, 2, sx, 51, 1.0, &xf), *w = leaf(dt, 2, sw, 52, 1.0, &wf);
    fg_tensor *b = leaf(dt, 1, sb, 53, 1.0, &bf), *r = leaf(dt, 2, sy, 54, 1.0, &rf);
    fg_tensor *y = fg_linear(x, w, b), *yf = fg_linear(xf, wf, bf);
    /* the bias is added after the product's rounding here (two roundings) */
    CHECK(y && fg_tensor_dtype(y) == dt);
    double u = unit_roundoff(dt);
    for (int64_t i = 0; y && i < 9 * 13; i++)
        CHECK_CLOSE(fg_tensor_get(y, i), fg_tensor_get(yf, i), 2.5 * u, u);
    CHECK_OK(fg_backward(fg_sum(fg_mul(y, r))));
    CHECK(fg_tensor_grad(w) && fg_tensor_dtype(fg_tensor_grad(w)) == dt);
    fg_tensor_free(x), fg_tensor_free(xf), fg_tensor_free(w), fg_tensor_free(wf);
    fg_tensor_free(b), fg_tensor_free(bf), fg_tensor_free(r), fg_tensor_free(rf);
    fg_step_reset();
}

TEST(ops_forward_backward_every_path) {
    fg_dtype dts[2] = {FG_BF16, FG_F16};
    for (int p = 0; p < FG_LOWP_COUNT; p++) {
        if (!fg__lowp_path_available((fg__lowp_path)p)) continue;
        CHECK_OK(fg__lowp_path_force(p));
        printf("    path %s\n", fg__lowp_path_name((fg__lowp_path)p));
        for (int d = 0; d < 2; d++) {
            unary_case("gelu", fg_gelu, dts[d]);
            unary_case("dropout", drop, dts[d]);
            unary_case("relu", fg_relu, dts[d]);
            binary_case(false, dts[d]);
            binary_case(true, dts[d]);
            embedding_case(dts[d]);
            for (int pad = 0; pad < 2; pad++) {
                attention_case(dts[d], 2, 37, 16, pad);
                attention_case(dts[d], 3, 128, 384, pad);
            }
            linear_case(dts[d]);
        }
    }
    CHECK_OK(fg__lowp_path_force(-1));
}

/* Under autocast: attention on an f32 qkv rounds it and returns the low
 * dtype, with an f32 gradient; layer norm, softmax, cross-entropy and sums
 * of a low-precision input come out f32. */
TEST(autocast_lists) {
    int64_t sq[3] = {1, 8, 3 * 8};
    fg_tensor *q = fg_tensor_new(FG_F32, 3, sq);
    fg_rng_fill_normal(61, 0, fg_tensor_data(q), 8 * 24, 0, 1);
    fg_tensor_set_requires_grad(q, true);
    CHECK_OK(fg_autocast_set(FG_BF16, NULL));
    fg_tensor *y = fg_causal_attention(q, 2);
    CHECK(y && fg_tensor_dtype(y) == FG_BF16);
    fg_tensor *ln = fg_layer_norm(y, NULL, NULL, 1e-5);
    CHECK(ln && fg_tensor_dtype(ln) == FG_F32);
    CHECK(fg_tensor_dtype(fg_softmax(y)) == FG_F32);
    CHECK(fg_tensor_dtype(fg_log_softmax(y)) == FG_F32);
    fg_tensor *s = fg_sum(y);
    CHECK(s && fg_tensor_dtype(s) == FG_F32);
    CHECK_OK(fg_autocast_set(FG_DTYPE_DEFAULT, NULL));
    CHECK_OK(fg_backward(s));
    CHECK(fg_tensor_grad(q) && fg_tensor_dtype(fg_tensor_grad(q)) == FG_F32);
    fg_tensor_free(q);
    fg_step_reset();
}

/* --------------------------------------------------------------- memory */

#include <pthread.h>

/* The step arena's peak over one forward and backward of a GPT: under
 * bf16-mixed the activations kept for backward (the products' outputs,
 * GELU's input, attention's qkv and output) are bf16. */
static size_t gpt_step_peak(fg_dtype autocast) {
    fg_module *m = fg_gpt_new(
        &(fg_gpt_config){.vocab = 65, .ctx = 64, .layers = 2, .heads = 4, .embd = 128, .seed = 3});
    int64_t sh[2] = {8, 64};
    fg_tensor *x = fg_tensor_new(FG_I32, 2, sh), *t = fg_tensor_new(FG_I32, 2, sh);
    int32_t *px = fg_tensor_data(x), *pt = fg_tensor_data(t);
    for (int i = 0; i < 8 * 64; i++) {
        px[i] = (int32_t)(fg_rng_u32_at(71, (uint64_t)i) % 65);
        pt[i] = (int32_t)(fg_rng_u32_at(72, (uint64_t)i) % 65);
    }
    fg_step_reset();
    size_t base = fg_step_bytes();
    CHECK_OK(fg_autocast_set(autocast, NULL));
    fg_tensor *loss = fg_cross_entropy(fg_module_forward(m, x), t, -100);
    CHECK_OK(fg_autocast_set(FG_DTYPE_DEFAULT, NULL));
    CHECK_OK(fg_backward(loss));
    size_t peak = fg_step_peak_bytes() - base;
    fg_step_reset();
    fg_tensor_free(x);
    fg_tensor_free(t);
    fg_module_free(m);
    return peak;
}

typedef struct {
    fg_dtype dt;
    size_t peak;
} peak_job;

/* each run on a thread of its own: a fresh step arena, a fresh peak */
static void *peak_thread(void *p) {
    peak_job *j = p;
    j->peak = gpt_step_peak(j->dt);
    fg_step_thread_release();
    return NULL;
}

static size_t peak_of(fg_dtype dt) {
    peak_job j = {dt, 0};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, peak_thread, &j) == 0);
    pthread_join(th, NULL);
    return j.peak;
}

TEST(bf16_mixed_keeps_less_activation_memory) {
    size_t f32 = peak_of(FG_DTYPE_DEFAULT), bf16 = peak_of(FG_BF16), f16 = peak_of(FG_F16);
    printf("    GPT (2 layers, 128 wide, batch 8 x 64) step arena peak: 32-true %.2f MiB, "
           "bf16-mixed %.2f MiB (%.2fx), 16-mixed %.2f MiB (%.2fx)\n",
           f32 / 1048576.0, bf16 / 1048576.0, (double)bf16 / f32, f16 / 1048576.0,
           (double)f16 / f32);
    CHECK_MSG(bf16 < f32, "bf16-mixed peak %zu >= 32-true %zu", bf16, f32);
    CHECK_MSG(f16 < f32, "16-mixed peak %zu >= 32-true %zu", f16, f32);
}
