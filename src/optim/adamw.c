/* torch.optim.AdamW over a range of the flat buffers, in the order of
 * PyTorch's single-tensor path: decay the parameter, update the moments,
 * then p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps). The arithmetic is in
 * the parameters' dtype, as PyTorch's. */
#include <math.h>

#include "optim_impl.h"

static FG_MUST_USE fg_status adamw_step_range(fg_optimizer *o, int64_t begin, int64_t end,
                                              void *param, const void *grad, void *const *state,
                                              int64_t t) {
    const fg_adamw_opts *ao = &o->o.adamw;
    double bc1 = 1 - pow(ao->beta1, (double)t), bc2 = 1 - pow(ao->beta2, (double)t);
    size_t es = fg_dtype_size(o->dt);
    for (int64_t k = 0; k < o->nseg; k++) {
        int64_t lo = FG_MAX(begin, o->seg_begin[k]), hi = FG_MIN(end, o->seg_begin[k + 1]);
        if (lo >= hi) continue;
        size_t at = es * (size_t)(lo - begin), st = fg_dtype_size(o->sdt) * (size_t)(lo - begin);
        fg_tensor tp = fg__optim_range(o, (char *)param + at, o->dt, hi - lo);
        fg_tensor tg = fg__optim_range(o, (char *)grad + at, o->dt, hi - lo);
        fg_tensor t1 = fg__optim_range(o, (char *)state[0] + st, o->sdt, hi - lo);
        fg_tensor t2 = fg__optim_range(o, (char *)state[1] + st, o->sdt, hi - lo);
        FG_TRY(fg__ops_adamw(&tp, &tg, &t1, &t2, 1 - o->seg_lr[k] * o->seg_wd[k], ao->beta1,
                             ao->beta2, o->seg_lr[k] / bc1, sqrt(bc2), ao->eps));
    }
    return FG_OK;
}

static const fg__optim_vt adamw_vt = {.name = "AdamW", .step_range = adamw_step_range};

fg_optimizer *fg_adamw_new(fg_module *m, const fg_adamw_opts *opts) {
    fg_adamw_opts o = opts ? *opts : (fg_adamw_opts){0};
    if (o.lr == 0) o.lr = 1e-3;
    if (o.beta1 == 0) o.beta1 = 0.9;
    if (o.beta2 == 0) o.beta2 = 0.999;
    if (o.eps == 0) o.eps = 1e-8;
    if (o.weight_decay == 0) o.weight_decay = 0.01;
    if (o.no_weight_decay) o.weight_decay = 0;
    if (!(o.lr > 0) || !(o.beta1 > 0 && o.beta1 < 1) || !(o.beta2 > 0 && o.beta2 < 1) ||
        !(o.eps > 0) || !(o.weight_decay >= 0)) {
        fg_error(FG_EINVAL,
                 "adamw_new: lr = %g, betas = (%g, %g), eps = %g, weight_decay = %g: "
                 "expected lr > 0, betas in [0, 1), eps > 0, weight_decay >= 0",
                 o.lr, o.beta1, o.beta2, o.eps, o.weight_decay);
        return NULL;
    }
    static const char *const names[] = {"exp_avg", "exp_avg_sq"};
    fg_optimizer *opt =
        fg__optimizer_new(&adamw_vt, m, o.lr, 2, names, o.weight_decay, !o.decay_all);
    if (opt) opt->o.adamw = o;
    return opt;
}
