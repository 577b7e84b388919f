/* Instantiates kernels_t.h for f32 and f64 and dispatches on the dtype. */
#include <math.h>

#include "optim_impl.h"

/* CMakeLists.txt compiles this file with -fno-math-errno: AdamW's sqrt(v)
 * sees v >= 0 only, and with errno GCC keeps a scalar libm call per element
 * instead of vsqrtps (#pragma GCC optimize does not reach the OpenMP
 * outlined loop). No other kernel here calls libm. */

#define T float
#define SQRT sqrtf
#define SUF f32
#include "kernels_t.h"
#undef T
#undef SQRT
#undef SUF

#define T double
#define SQRT sqrt
#define SUF f64
#include "kernels_t.h"
#undef T
#undef SQRT
#undef SUF

void fg__k_sgd(fg_dtype dt, void *p, const void *g, void *buf, int64_t n, double lr, double wd,
               double mu, double damp, bool first, bool nesterov) {
    if (dt == FG_F32)
        sgd_f32(p, g, buf, n, (float)lr, (float)wd, (float)mu, (float)damp, first, nesterov);
    else sgd_f64(p, g, buf, n, lr, wd, mu, damp, first, nesterov);
}

void fg__k_adamw(fg_dtype dt, void *p, const void *g, void *m1, void *m2, int64_t n, double decay,
                 double beta1, double beta2, double step, double bc2_sqrt, double eps) {
    if (dt == FG_F32)
        adamw_f32(p, g, m1, m2, n, (float)decay, (float)beta1, (float)(1 - beta1), (float)beta2,
                  (float)(1 - beta2), (float)step, (float)bc2_sqrt, (float)eps);
    else adamw_f64(p, g, m1, m2, n, decay, beta1, 1 - beta1, beta2, 1 - beta2, step, bc2_sqrt, eps);
}

fg_status fg__sumsq(const void *x, fg_dtype dt, int64_t n, double *out) {
    if (dt != FG_F32 && dt != FG_F64)
        return fg_error(FG_EUNSUPPORTED, "sumsq: dtype %s (f32, f64)", fg_dtype_name(dt));
    int64_t nb = (n + FG_OPTIM_BLOCK - 1) / FG_OPTIM_BLOCK;
    double stack[64], *part = nb <= 64 ? stack : fg_alloc(sizeof(double) * (size_t)nb);
    if (!part) return FG_ENOMEM;
    if (dt == FG_F32) sumsq_blocks_f32(x, n, part);
    else sumsq_blocks_f64(x, n, part);
    double s = 0;
    for (int64_t b = 0; b < nb; b++) s += part[b];
    if (part != stack) fg_free(part);
    *out = s;
    return FG_OK;
}

fg_status fg__scale(void *x, fg_dtype dt, int64_t n, double s) {
    if (dt == FG_F32) scale_f32(x, n, (float)s);
    else if (dt == FG_F64) scale_f64(x, n, s);
    else return fg_error(FG_EUNSUPPORTED, "scale: dtype %s (f32, f64)", fg_dtype_name(dt));
    return FG_OK;
}
