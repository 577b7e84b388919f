/* Instantiates kernels_t.h for f32 and f64 and dispatches on the dtype.
 * f32 is instantiated once more for AVX2 + FMA and once for AVX-512
 * (core/cpu_isa.h's target pragmas, whatever -march the build uses), and
 * each call runs the one of fg_cpu_isa(): the same loops, vectorised by the
 * compiler for that ISA.
 *
 * CMakeLists.txt compiles this file with -fno-math-errno: AdamW's sqrt(v)
 * sees v >= 0 only, and with errno GCC keeps a scalar libm call per element
 * instead of vsqrtps (#pragma GCC optimize does not reach the OpenMP
 * outlined loop). And with -ffp-contract=off: no multiply-add is fused, so
 * that every path rounds each operation once, as the scalar loop does, and
 * the updates are the same bits on every ISA (sqrt and division are
 * correctly rounded in every vector unit). No other kernel here calls libm. */
#include <math.h>

#include "core/cpu_isa.h"
#include "cpu_impl.h"
#include "ops/ops_impl.h"

#define T float
#define SQRT sqrtf
#define SUF f32
#include "k_optim_t.h"
#undef SUF

#if FG_HAVE_ISA_TARGETS
FG_TARGET_AVX2_BEGIN
#define SUF f32_avx2
#include "k_optim_t.h"
#undef SUF
FG_TARGET_END

FG_TARGET_AVX512_BEGIN
#define SUF f32_avx512
#include "k_optim_t.h"
#undef SUF
FG_TARGET_END
#endif
#undef T
#undef SQRT

#define T double
#define SQRT sqrt
#define SUF f64
#include "k_optim_t.h"
#undef T
#undef SQRT
#undef SUF

/* The f32 kernels of one ISA. */
typedef struct {
    void (*sgd)(float *restrict p, const float *restrict g, float *restrict buf, int64_t n,
                float lr, float wd, float mu, float damp, bool first, bool nesterov);
    void (*adamw)(float *restrict p, const float *restrict g, float *restrict m1,
                  float *restrict m2, int64_t n, float decay, float b1, float c1, float b2,
                  float c2, float step, float rb, float eps);
    void (*adam)(float *restrict p, const float *restrict g, float *restrict m1, float *restrict m2,
                 float *restrict m3, int64_t n, float wd, float b1, float c1, float b2, float c2,
                 float step, float rb, float eps);
    void (*rmsprop)(float *restrict p, const float *restrict g, float *restrict sq,
                    float *restrict buf, float *restrict ga, int64_t n, float lr, float wd,
                    float alpha, float c, float eps, float mu);
    void (*adagrad)(float *restrict p, const float *restrict g, float *restrict sum, int64_t n,
                    float clr, float wd, float eps);
    void (*lion)(float *restrict p, const float *restrict g, float *restrict m, int64_t n, float lr,
                 float decay, float b1, float c1, float b2, float c2);
    void (*sumsq_blocks)(const float *restrict x, int64_t n, double *restrict part);
    void (*scale)(float *restrict x, int64_t n, float s);
} f32_kernels;

#define F32_KERNELS(suf)                                                                           \
    {                                                                                              \
        .sgd = sgd_##suf, .adamw = adamw_##suf, .adam = adam_##suf, .rmsprop = rmsprop_##suf,      \
        .adagrad = adagrad_##suf, .lion = lion_##suf, .sumsq_blocks = sumsq_blocks_##suf,          \
        .scale = scale_##suf                                                                       \
    }

static const f32_kernels g_f32[FG_ISA_COUNT] = {
    [FG_ISA_SCALAR] = F32_KERNELS(f32),
#if FG_HAVE_ISA_TARGETS
    [FG_ISA_AVX2] = F32_KERNELS(f32_avx2),
    [FG_ISA_AVX512] = F32_KERNELS(f32_avx512),
#else
    [FG_ISA_AVX2] = F32_KERNELS(f32),
    [FG_ISA_AVX512] = F32_KERNELS(f32),
#endif
};

static const f32_kernels *f32k(void) { return &g_f32[fg_cpu_isa()]; }

/* bf16/f16 parameters (bf16-true, 16-true): the f32 kernel on pieces of
 * the parameters and gradients widened to f32, with the f32 state, and the
 * parameters rounded back once per step. */
#define LOWP_PIECE 2048
static bool is_lowp(fg_dtype dt) { return dt == FG_BF16 || dt == FG_F16; }

void fg__k_sgd(fg_dtype dt, void *p, const void *g, void *buf, int64_t n, double lr, double wd,
               double mu, double damp, bool first, bool nesterov) {
    if (is_lowp(dt)) {
        float pf[LOWP_PIECE], gf[LOWP_PIECE];
        for (int64_t i = 0; i < n; i += LOWP_PIECE) {
            int64_t k = FG_MIN(LOWP_PIECE, n - i);
            fg__ops_widen(pf, (const uint16_t *)p + i, k, dt);
            fg__ops_widen(gf, (const uint16_t *)g + i, k, dt);
            fg__k_sgd(FG_F32, pf, gf, buf ? (float *)buf + i : NULL, k, lr, wd, mu, damp, first,
                      nesterov);
            fg__ops_narrow((uint16_t *)p + i, pf, k, dt);
        }
        return;
    }
    if (dt == FG_F32)
        f32k()->sgd(p, g, buf, n, (float)lr, (float)wd, (float)mu, (float)damp, first, nesterov);
    else sgd_f64(p, g, buf, n, lr, wd, mu, damp, first, nesterov);
}

void fg__k_adamw(fg_dtype dt, void *p, const void *g, void *m1, void *m2, int64_t n, double decay,
                 double beta1, double beta2, double step, double bc2_sqrt, double eps) {
    if (is_lowp(dt)) {
        float pf[LOWP_PIECE], gf[LOWP_PIECE];
        for (int64_t i = 0; i < n; i += LOWP_PIECE) {
            int64_t k = FG_MIN(LOWP_PIECE, n - i);
            fg__ops_widen(pf, (const uint16_t *)p + i, k, dt);
            fg__ops_widen(gf, (const uint16_t *)g + i, k, dt);
            fg__k_adamw(FG_F32, pf, gf, (float *)m1 + i, (float *)m2 + i, k, decay, beta1, beta2,
                        step, bc2_sqrt, eps);
            fg__ops_narrow((uint16_t *)p + i, pf, k, dt);
        }
        return;
    }
    if (dt == FG_F32)
        f32k()->adamw(p, g, m1, m2, n, (float)decay, (float)beta1, (float)(1 - beta1), (float)beta2,
                      (float)(1 - beta2), (float)step, (float)bc2_sqrt, (float)eps);
    else adamw_f64(p, g, m1, m2, n, decay, beta1, 1 - beta1, beta2, 1 - beta2, step, bc2_sqrt, eps);
}

/* The bf16/f16 parameters of a kernel call in pieces widened to f32: each
 * kernel below runs its f32 self on pf/gf and narrows pf back. */
#define LOWP_LOOP(CALL)                                                                            \
    do {                                                                                           \
        float pf[LOWP_PIECE], gf[LOWP_PIECE];                                                      \
        for (int64_t i = 0; i < n; i += LOWP_PIECE) {                                              \
            int64_t k = FG_MIN(LOWP_PIECE, n - i);                                                 \
            fg__ops_widen(pf, (const uint16_t *)p + i, k, dt);                                     \
            fg__ops_widen(gf, (const uint16_t *)g + i, k, dt);                                     \
            CALL;                                                                                  \
            fg__ops_narrow((uint16_t *)p + i, pf, k, dt);                                          \
        }                                                                                          \
    } while (0)
#define AT(x) ((x) ? (float *)(x) + i : NULL)

void fg__k_adam(fg_dtype dt, void *p, const void *g, void *m1, void *m2, void *m3, int64_t n,
                double wd, double beta1, double beta2, double step, double bc2_sqrt, double eps) {
    if (is_lowp(dt))
        LOWP_LOOP(fg__k_adam(FG_F32, pf, gf, AT(m1), AT(m2), AT(m3), k, wd, beta1, beta2, step,
                             bc2_sqrt, eps));
    else if (dt == FG_F32)
        f32k()->adam(p, g, m1, m2, m3, n, (float)wd, (float)beta1, (float)(1 - beta1), (float)beta2,
                     (float)(1 - beta2), (float)step, (float)bc2_sqrt, (float)eps);
    else adam_f64(p, g, m1, m2, m3, n, wd, beta1, 1 - beta1, beta2, 1 - beta2, step, bc2_sqrt, eps);
}

void fg__k_rmsprop(fg_dtype dt, void *p, const void *g, void *sq, void *buf, void *ga, int64_t n,
                   double lr, double wd, double alpha, double eps, double mu) {
    if (is_lowp(dt))
        LOWP_LOOP(
            fg__k_rmsprop(FG_F32, pf, gf, AT(sq), AT(buf), AT(ga), k, lr, wd, alpha, eps, mu));
    else if (dt == FG_F32)
        f32k()->rmsprop(p, g, sq, buf, ga, n, (float)lr, (float)wd, (float)alpha,
                        (float)(1 - alpha), (float)eps, (float)mu);
    else rmsprop_f64(p, g, sq, buf, ga, n, lr, wd, alpha, 1 - alpha, eps, mu);
}

void fg__k_adagrad(fg_dtype dt, void *p, const void *g, void *sum, int64_t n, double clr, double wd,
                   double eps) {
    if (is_lowp(dt)) LOWP_LOOP(fg__k_adagrad(FG_F32, pf, gf, AT(sum), k, clr, wd, eps));
    else if (dt == FG_F32) f32k()->adagrad(p, g, sum, n, (float)clr, (float)wd, (float)eps);
    else adagrad_f64(p, g, sum, n, clr, wd, eps);
}

void fg__k_lion(fg_dtype dt, void *p, const void *g, void *m, int64_t n, double lr, double decay,
                double beta1, double beta2) {
    if (is_lowp(dt)) LOWP_LOOP(fg__k_lion(FG_F32, pf, gf, AT(m), k, lr, decay, beta1, beta2));
    else if (dt == FG_F32)
        f32k()->lion(p, g, m, n, (float)lr, (float)decay, (float)beta1, (float)(1 - beta1),
                     (float)beta2, (float)(1 - beta2));
    else lion_f64(p, g, m, n, lr, decay, beta1, 1 - beta1, beta2, 1 - beta2);
}
#undef AT
#undef LOWP_LOOP

/* x (n, bf16/f16) widened into a new f32 buffer (fg_free it), or NULL */
static float *widened(const void *x, fg_dtype dt, int64_t n) {
    float *f = fg_alloc(sizeof(float) * (size_t)(n ? n : 1));
    if (f) fg__ops_widen(f, x, n, dt);
    else
        fg_error(FG_ENOMEM, "optim: %lld floats for an f32 copy of %s gradients", (long long)n,
                 fg_dtype_name(dt));
    return f;
}

fg_status fg__sumsq(const void *x, fg_dtype dt, int64_t n, double *out) {
    if (is_lowp(dt)) {
        float *f = widened(x, dt, n);
        if (!f) return FG_ENOMEM;
        fg_status st = fg__sumsq(f, FG_F32, n, out);
        fg_free(f);
        return st;
    }
    if (dt != FG_F32 && dt != FG_F64)
        return fg_error(FG_EUNSUPPORTED, "sumsq: dtype %s (f32, f64)", fg_dtype_name(dt));
    int64_t nb = (n + FG_OPTIM_BLOCK - 1) / FG_OPTIM_BLOCK;
    double stack[64], *part = nb <= 64 ? stack : fg_alloc(sizeof(double) * (size_t)nb);
    if (!part) return FG_ENOMEM;
    if (dt == FG_F32) f32k()->sumsq_blocks(x, n, part);
    else sumsq_blocks_f64(x, n, part);
    double s = 0;
    for (int64_t b = 0; b < nb; b++) s += part[b];
    if (part != stack) fg_free(part);
    *out = s;
    return FG_OK;
}

fg_status fg__scale(void *x, fg_dtype dt, int64_t n, double s) {
    if (is_lowp(dt)) {
        float *f = widened(x, dt, n);
        if (!f) return FG_ENOMEM;
        f32k()->scale(f, n, (float)s);
        fg__ops_narrow(x, f, n, dt);
        fg_free(f);
        return FG_OK;
    }
    if (dt == FG_F32) f32k()->scale(x, n, (float)s);
    else if (dt == FG_F64) scale_f64(x, n, s);
    else return fg_error(FG_EUNSUPPORTED, "scale: dtype %s (f32, f64)", fg_dtype_name(dt));
    return FG_OK;
}
