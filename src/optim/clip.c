/* Gradient clipping by global norm, and its two halves (sum of squares;
 * scale) for strategies that sum the squares over ranks in between.
 *
 * The sum of squares is taken in fixed blocks of BLOCK elements, each with
 * eight partial sums, and the block sums are added in block order: the
 * result does not depend on the thread count (DDP on N ranks must match one
 * process), and the eight lanes keep the loop from waiting on one adder. */
#include <math.h>

#include "optim_impl.h"

#define BLOCK 8192

#define SUMSQ_BLOCKS(T)                                                                            \
    do {                                                                                           \
        const T *p = x;                                                                            \
        _Pragma("omp parallel for schedule(static) if (nb > 8)")                                  \
        for (int64_t b = 0; b < nb; b++) {                                                         \
            int64_t lo = b * BLOCK, hi = FG_MIN(n, lo + BLOCK);                                    \
            double acc[8] = {0};                                                                   \
            int64_t i = lo;                                                                        \
            for (; i + 8 <= hi; i += 8)                                                            \
                for (int k = 0; k < 8; k++) acc[k] += (double)p[i + k] * (double)p[i + k];         \
            for (; i < hi; i++) acc[0] += (double)p[i] * (double)p[i];                             \
            part[b] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) +                                    \
                      ((acc[4] + acc[5]) + (acc[6] + acc[7]));                                     \
        }                                                                                          \
    } while (0)

fg_status fg__sumsq(const void *x, fg_dtype dt, int64_t n, double *out) {
    if (dt != FG_F32 && dt != FG_F64)
        return fg_error(FG_EUNSUPPORTED, "sumsq: dtype %s (f32, f64)", fg_dtype_name(dt));
    int64_t nb = (n + BLOCK - 1) / BLOCK;
    double stack[64], *part = nb <= 64 ? stack : fg_alloc(sizeof(double) * (size_t)nb);
    if (!part) return FG_ENOMEM;
    if (dt == FG_F32) SUMSQ_BLOCKS(float);
    else SUMSQ_BLOCKS(double);
    double s = 0;
    for (int64_t b = 0; b < nb; b++) s += part[b];
    if (part != stack) fg_free(part);
    *out = s;
    return FG_OK;
}

fg_status fg__scale(void *x, fg_dtype dt, int64_t n, double s) {
    if (dt == FG_F32) {
        float *p = x, f = (float)s;
#pragma omp parallel for simd schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; i++) p[i] *= f;
    } else if (dt == FG_F64) {
        double *p = x;
#pragma omp parallel for simd schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; i++) p[i] *= s;
    } else {
        return fg_error(FG_EUNSUPPORTED, "scale: dtype %s (f32, f64)", fg_dtype_name(dt));
    }
    return FG_OK;
}

fg_status fg_grad_sumsq(fg_module *m, double *sumsq) {
    if (!m || !sumsq) return fg_error(FG_EINVAL, "grad_sumsq: NULL module or output");
    FG_TRY(fg__module_ready(m));
    return fg__sumsq(fg_tensor_data(m->flat_g), m->flat->dtype, m->p_numel, sumsq);
}

fg_status fg_grad_scale(fg_module *m, double s) {
    if (!m) return fg_error(FG_EINVAL, "grad_scale: NULL module");
    FG_TRY(fg__module_ready(m));
    return fg__scale(fg_tensor_data(m->flat_g), m->flat->dtype, m->p_numel, s);
}

double fg_clip_coef(double total_norm, double max_norm) {
    double c = max_norm / (total_norm + 1e-6);
    return c < 1 ? c : 1; /* NaN compares false: 1 */
}

fg_status fg_clip_grad_norm(fg_module *m, double max_norm, double *total_norm) {
    if (!m) return fg_error(FG_EINVAL, "clip_grad_norm: NULL module");
    if (!(max_norm > 0))
        return fg_error(FG_EINVAL, "clip_grad_norm: max_norm = %g: expected > 0", max_norm);
    double ss;
    FG_TRY(fg_grad_sumsq(m, &ss));
    double norm = sqrt(ss);
    if (total_norm) *total_norm = norm;
    double c = fg_clip_coef(norm, max_norm);
    return c < 1 ? fg_grad_scale(m, c) : FG_OK;
}
