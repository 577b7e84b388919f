/* The f32 optimizer kernels (optim/kernels.c: SGD in its four forms, AdamW,
 * the clipping sum of squares and scale) on every ISA path this CPU can
 * run, forced through fg_set_cpu_isa (a path the CPU lacks is skipped with
 * the reason): the same bits as the scalar path, since no path fuses a
 * multiply-add and sqrt and division are correctly rounded everywhere (Adam
 * with AMSGrad, RMSprop in its forms, Adagrad and Lion too), at
 * sizes around every vector width and past the parallel threshold; and
 * AdamW and SGD against double (1e-6 relative). */
#include <math.h>
#include <string.h>

#include "harness.h"
#include "optim/optim_impl.h"

static const int64_t SIZES[] = {1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 100, 1001, 40000, 70001};
#define NSIZES ((int)(sizeof SIZES / sizeof SIZES[0]))

/* n floats of the given scale; |x| when positive is set (second moments) */
static float *randf(int64_t n, uint64_t seed, double scale, bool positive) {
    float *x = malloc(sizeof(float) * (size_t)n);
    fg_rng r = {seed, 0};
    for (int64_t i = 0; i < n; i++) {
        double v = scale * fg_rng_normal(&r);
        x[i] = (float)(positive ? fabs(v) : v);
    }
    return x;
}

static float *copyf(const float *x, int64_t n) {
    float *c = malloc(sizeof(float) * (size_t)n);
    memcpy(c, x, sizeof(float) * (size_t)n);
    return c;
}

static bool same(const float *a, const float *b, int64_t n) {
    return memcmp(a, b, sizeof(float) * (size_t)n) == 0;
}

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

/* Three AdamW steps on `isa` and on the scalar path: the same bits; and the
 * first against double. */
ISA_TEST(adamw) {
    for (int si = 0; si < NSIZES; si++) {
        int64_t n = SIZES[si];
        float *p = randf(n, 1, 1.0, false), *m1 = randf(n, 2, 0.1, false);
        float *m2 = randf(n, 3, 0.01, true);
        float *p0 = copyf(p, n), *a0 = copyf(m1, n), *v0 = copyf(m2, n);
        float *ps = copyf(p, n), *m1s = copyf(m1, n), *m2s = copyf(m2, n);
        for (int step = 1; step <= 3; step++) {
            float *g = randf(n, 10 + (uint64_t)step, 1.0, false);
            double b1 = 0.9, b2 = 0.999, lr = 1e-2, wd = 0.1, eps = 1e-8;
            double bc1 = 1 - pow(b1, step), bc2 = 1 - pow(b2, step);
            fg__k_adamw(FG_F32, p, g, m1, m2, n, 1 - lr * wd, b1, b2, lr / bc1, sqrt(bc2), eps);
            CHECK_OK(fg_set_cpu_isa(FG_ISA_SCALAR));
            fg__k_adamw(FG_F32, ps, g, m1s, m2s, n, 1 - lr * wd, b1, b2, lr / bc1, sqrt(bc2), eps);
            CHECK_OK(fg_set_cpu_isa(isa));
            CHECK_MSG(same(p, ps, n) && same(m1, m1s, n) && same(m2, m2s, n),
                      "adamw %s n %lld step %d: not the scalar path's bits", fg_isa_name(isa),
                      (long long)n, step);
            if (step == 1) {
                long bad = 0;
                for (int64_t i = 0; i < n; i++) {
                    /* float rounding: within 1e-6 of the terms' sizes */
                    double a = b1 * a0[i] + (1 - b1) * g[i];
                    double v = b2 * v0[i] + (1 - b2) * (double)g[i] * g[i];
                    double u = lr / bc1 * a / (sqrt(v) / sqrt(bc2) + eps);
                    double w = p0[i] * (1 - lr * wd) - u;
                    bad += !(fabs(p[i] - w) <= 1e-6 * (fabs(p0[i]) + fabs(u)));
                    bad += !(fabs(m1[i] - a) <= 1e-6 * (fabs(b1 * a0[i]) + fabs((1 - b1) * g[i])));
                    bad += !(fabs(m2[i] - v) <= 1e-6 * (b2 * v0[i] + (1 - b2) * g[i] * g[i]));
                }
                CHECK_MSG(bad == 0, "adamw %s n %lld: %ld values off the double reference",
                          fg_isa_name(isa), (long long)n, bad);
            }
            free(g);
        }
        free(p), free(m1), free(m2), free(p0), free(a0), free(v0), free(ps), free(m1s), free(m2s);
    }
}

/* SGD: plain, and with momentum in its first-step, Nesterov and dampened
 * forms; the same bits as the scalar path. */
ISA_TEST(sgd) {
    for (int si = 0; si < NSIZES; si++) {
        int64_t n = SIZES[si];
        float *g = randf(n, 20, 1.0, false);
        for (int form = 0; form < 5; form++) {
            float *p = randf(n, 21, 1.0, false), *buf = randf(n, 22, 0.5, false);
            float *ps = copyf(p, n), *bufs = copyf(buf, n);
            bool mom = form > 0, first = form == 1 || form == 2, nest = form == 2 || form == 4;
            fg__k_sgd(FG_F32, p, g, mom ? buf : NULL, n, 0.05, 0.01, 0.9, 0.1, first, nest);
            CHECK_OK(fg_set_cpu_isa(FG_ISA_SCALAR));
            fg__k_sgd(FG_F32, ps, g, mom ? bufs : NULL, n, 0.05, 0.01, 0.9, 0.1, first, nest);
            CHECK_OK(fg_set_cpu_isa(isa));
            CHECK_MSG(same(p, ps, n) && same(buf, bufs, n),
                      "sgd %s n %lld form %d: not the scalar path's bits", fg_isa_name(isa),
                      (long long)n, form);
            if (form == 0) { /* p0 - lr (g + wd p0), from a fresh copy */
                float *p0 = randf(n, 21, 1.0, false);
                long bad = 0;
                for (int64_t i = 0; i < n; i++) {
                    double w = p0[i] - 0.05 * (g[i] + 0.01 * p0[i]);
                    bad += !(fabs(p[i] - w) <= 1e-6 * (1 + fabs(w)));
                }
                CHECK_MSG(bad == 0, "sgd %s n %lld: %ld values off double", fg_isa_name(isa),
                          (long long)n, bad);
                free(p0);
            }
            free(p), free(buf), free(ps), free(bufs);
        }
        free(g);
    }
}

/* Adam (plain, AMSGrad), RMSprop (plain, momentum, centred, both), Adagrad
 * and Lion, three steps each: the same bits as the scalar path. */
ISA_TEST(other_optimizers) {
    for (int si = 0; si < NSIZES; si++) {
        int64_t n = SIZES[si];
        for (int form = 0; form < 8; form++) {
            float *p = randf(n, 31, 1.0, false), *s0 = randf(n, 32, 0.1, false);
            float *s1 = randf(n, 33, 0.01, true), *s2 = randf(n, 34, 0.02, true);
            float *ps = copyf(p, n), *s0s = copyf(s0, n), *s1s = copyf(s1, n), *s2s = copyf(s2, n);
            if (form == 5) /* centred RMSprop: sq >= ga^2 */
                for (int64_t i = 0; i < n; i++) s0[i] = s0s[i] = s1[i] + 1.0f;
            for (int step = 1; step <= 3; step++) {
                float *g = randf(n, 40 + (uint64_t)step, 1.0, false);
                for (int pass = 0; pass < 2; pass++) {
                    if (pass) CHECK_OK(fg_set_cpu_isa(FG_ISA_SCALAR));
                    float *P = pass ? ps : p, *A = pass ? s0s : s0, *B = pass ? s1s : s1;
                    float *C = pass ? s2s : s2;
                    switch (form) {
                    case 0:
                        fg__k_adam(FG_F32, P, g, A, B, NULL, n, 0.1, 0.9, 0.99, 0.01, 0.3, 1e-8);
                        break;
                    case 1:
                        fg__k_adam(FG_F32, P, g, A, B, C, n, 0.0, 0.8, 0.9, 0.02, 0.5, 1e-6);
                        break;
                    case 2:
                        fg__k_rmsprop(FG_F32, P, g, B, NULL, NULL, n, 0.01, 0.1, 0.99, 1e-8, 0);
                        break;
                    case 3:
                        fg__k_rmsprop(FG_F32, P, g, B, A, NULL, n, 0.01, 0, 0.9, 1e-8, 0.5);
                        break;
                    case 4:
                        fg__k_rmsprop(FG_F32, P, g, A, NULL, B, n, 0.01, 0, 0.9, 1e-8, 0);
                        break;
                    case 5:
                        fg__k_rmsprop(FG_F32, P, g, A, C, B, n, 0.01, 0.01, 0.9, 1e-6, 0.8);
                        break;
                    case 6: fg__k_adagrad(FG_F32, P, g, B, n, 0.05, 0.2, 1e-10); break;
                    default: fg__k_lion(FG_F32, P, g, A, n, 1e-3, 0.999, 0.9, 0.99); break;
                    }
                    if (pass) CHECK_OK(fg_set_cpu_isa(isa));
                }
                CHECK_MSG(same(p, ps, n) && same(s0, s0s, n) && same(s1, s1s, n) &&
                              same(s2, s2s, n),
                          "form %d %s n %lld step %d: not the scalar path's bits", form,
                          fg_isa_name(isa), (long long)n, step);
                free(g);
            }
            free(p), free(s0), free(s1), free(s2), free(ps), free(s0s), free(s1s), free(s2s);
        }
    }
}

/* The clipping halves: sum of squares (in double, fixed blocks and lanes)
 * and scale, the same bits as the scalar path. */
ISA_TEST(clip_kernels) {
    for (int si = 0; si < NSIZES; si++) {
        int64_t n = SIZES[si];
        float *x = randf(n, 30, 3.0, false), *xs = copyf(x, n);
        double s, ss, want = 0;
        CHECK_OK(fg__sumsq(x, FG_F32, n, &s));
        CHECK_OK(fg_set_cpu_isa(FG_ISA_SCALAR));
        CHECK_OK(fg__sumsq(x, FG_F32, n, &ss));
        CHECK_OK(fg__scale(xs, FG_F32, n, 0.37));
        CHECK_OK(fg_set_cpu_isa(isa));
        CHECK_OK(fg__scale(x, FG_F32, n, 0.37));
        for (int64_t i = 0; i < n; i++) want += (double)xs[i] / 0.37f * ((double)xs[i] / 0.37f);
        CHECK_MSG(memcmp(&s, &ss, sizeof s) == 0, "sumsq %s n %lld: %.17g vs scalar %.17g",
                  fg_isa_name(isa), (long long)n, s, ss);
        CHECK_CLOSE(s, want, 1e-6, 0);
        CHECK_MSG(same(x, xs, n), "scale %s n %lld: not the scalar path's bits", fg_isa_name(isa),
                  (long long)n);
        free(x), free(xs);
    }
}
