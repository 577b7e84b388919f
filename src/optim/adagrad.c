/* torch.optim.Adagrad over a range of the flat buffers, in the order of
 * PyTorch's single-tensor dense path: the coupled L2 decay, the decayed
 * learning rate lr / (1 + (t - 1) lr_decay), the sum of squares (starting
 * at initial_accumulator_value), then p -= clr g / (sqrt(sum) + eps). */
#include <math.h>

#include "optim_impl.h"

static FG_MUST_USE fg_status adagrad_step_range(fg_optimizer *o, int64_t begin, int64_t end,
                                                void *param, const void *grad, void *const *state,
                                                int64_t t) {
    const fg_adagrad_opts *ao = &o->o.adagrad;
    size_t es = fg_dtype_size(o->dt), ss = fg_dtype_size(o->sdt);
    for (int64_t k = 0; k < o->nseg; k++) {
        int64_t lo = FG_MAX(begin, o->seg_begin[k]), hi = FG_MIN(end, o->seg_begin[k + 1]);
        if (lo >= hi) continue;
        size_t at = es * (size_t)(lo - begin), st = ss * (size_t)(lo - begin);
        double clr = o->seg_lr[k] / (1 + (double)(t - 1) * ao->lr_decay);
        fg_tensor tp = fg__optim_range(o, (char *)param + at, o->dt, hi - lo);
        fg_tensor tg = fg__optim_range(o, (char *)grad + at, o->dt, hi - lo);
        fg_tensor ts = fg__optim_range(o, (char *)state[0] + st, o->sdt, hi - lo);
        FG_TRY(fg__ops_adagrad(&tp, &tg, &ts, clr, o->seg_wd[k], ao->eps));
    }
    return FG_OK;
}

static const fg__optim_vt adagrad_vt = {.name = "Adagrad", .step_range = adagrad_step_range};

fg_optimizer *fg_adagrad_new(fg_module *m, const fg_adagrad_opts *opts) {
    fg_adagrad_opts o = opts ? *opts : (fg_adagrad_opts){0};
    if (o.lr == 0) o.lr = 1e-2;
    if (o.eps == 0) o.eps = 1e-10;
    if (!(o.lr > 0) || !(o.lr_decay >= 0) || !(o.weight_decay >= 0) ||
        !(o.initial_accumulator_value >= 0) || !(o.eps > 0)) {
        fg_error(FG_EINVAL,
                 "adagrad_new: lr = %g, lr_decay = %g, weight_decay = %g, "
                 "initial_accumulator_value = %g, eps = %g: expected lr > 0, eps > 0, the "
                 "others >= 0",
                 o.lr, o.lr_decay, o.weight_decay, o.initial_accumulator_value, o.eps);
        return NULL;
    }
    static const char *const names[] = {"sum"};
    fg_optimizer *opt = fg__optimizer_new(&adagrad_vt, m, o.lr, 1, names, o.weight_decay, false);
    if (opt) {
        opt->o.adagrad = o;
        opt->state_init[0] = o.initial_accumulator_value;
    }
    return opt;
}
