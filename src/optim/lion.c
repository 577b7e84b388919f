/* Lion over a range of the flat buffers, in the order of lion-pytorch's
 * update: decoupled decay p *= 1 - lr wd, the step by the sign of the
 * interpolation beta1 m + (1 - beta1) g, then the momentum with beta2. */
#include <math.h>

#include "optim_impl.h"

static FG_MUST_USE fg_status lion_step_range(fg_optimizer *o, int64_t begin, int64_t end,
                                             void *param, const void *grad, void *const *state,
                                             int64_t t) {
    (void)t;
    const fg_lion_opts *lio = &o->o.lion;
    size_t es = fg_dtype_size(o->dt), ss = fg_dtype_size(o->sdt);
    for (int64_t k = 0; k < o->nseg; k++) {
        int64_t lo = FG_MAX(begin, o->seg_begin[k]), hi = FG_MIN(end, o->seg_begin[k + 1]);
        if (lo >= hi) continue;
        size_t at = es * (size_t)(lo - begin), st = ss * (size_t)(lo - begin);
        fg_tensor tp = fg__optim_range(o, (char *)param + at, o->dt, hi - lo);
        fg_tensor tg = fg__optim_range(o, (char *)grad + at, o->dt, hi - lo);
        fg_tensor tm = fg__optim_range(o, (char *)state[0] + st, o->sdt, hi - lo);
        FG_TRY(fg__ops_lion(&tp, &tg, &tm, o->seg_lr[k], 1 - o->seg_lr[k] * o->seg_wd[k],
                            lio->beta1, lio->beta2));
    }
    return FG_OK;
}

static const fg__optim_vt lion_vt = {.name = "Lion", .step_range = lion_step_range};

fg_optimizer *fg_lion_new(fg_module *m, const fg_lion_opts *opts) {
    fg_lion_opts o = opts ? *opts : (fg_lion_opts){0};
    if (o.lr == 0) o.lr = 1e-4;
    if (o.beta1 == 0) o.beta1 = 0.9;
    if (o.beta2 == 0) o.beta2 = 0.99;
    if (!(o.lr > 0) || !(o.beta1 > 0 && o.beta1 < 1) || !(o.beta2 > 0 && o.beta2 < 1) ||
        !(o.weight_decay >= 0)) {
        fg_error(FG_EINVAL,
                 "lion_new: lr = %g, betas = (%g, %g), weight_decay = %g: expected lr > 0, "
                 "betas in [0, 1), weight_decay >= 0",
                 o.lr, o.beta1, o.beta2, o.weight_decay);
        return NULL;
    }
    static const char *const names[] = {"exp_avg"};
    fg_optimizer *opt = fg__optimizer_new(&lion_vt, m, o.lr, 1, names, o.weight_decay, false);
    if (opt) opt->o.lion = o;
    return opt;
}
