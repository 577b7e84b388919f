/* Gradient clipping by global norm, and its two halves (sum of squares;
 * scale) for strategies that sum the squares over ranks in between.
 *
 * The sum of squares (ops/cpu/k_optim_t.h, on the gradients' device) is taken in fixed blocks, each
 * with eight partial sums, and the block sums are added in block order: the result does not depend
 * on the thread count (DDP on N ranks must match one process), and the eight lanes keep the loop
 * from waiting on one adder. */
#include <math.h>

#include "optim_impl.h"

fg_status fg_grad_sumsq(fg_module *m, double *sumsq) {
    if (!m || !sumsq) return fg_error(FG_EINVAL, "grad_sumsq: NULL module or output");
    FG_TRY(fg__module_ready(m));
    return fg__ops_sumsq(m->flat_g, sumsq); /* on the gradients' device: one scalar back */
}

fg_status fg_grad_scale(fg_module *m, double s) {
    if (!m) return fg_error(FG_EINVAL, "grad_scale: NULL module");
    FG_TRY(fg__module_ready(m));
    return fg__ops_scale_flat(m->flat_g, s);
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
