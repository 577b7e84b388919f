/* torch.optim.RMSprop over a range of the flat buffers, in the order of
 * PyTorch's single-tensor path: the coupled L2 decay, the square average,
 * the centred correction by the gradient average, then momentum or the
 * plain step. The state is the square average, then the momentum buffer
 * and the gradient average when the options have them. */
#include <math.h>

#include "optim_impl.h"

static FG_MUST_USE fg_status rmsprop_step_range(fg_optimizer *o, int64_t begin, int64_t end,
                                                void *param, const void *grad, void *const *state,
                                                int64_t t) {
    (void)t;
    const fg_rmsprop_opts *ro = &o->o.rmsprop;
    size_t es = fg_dtype_size(o->dt), ss = fg_dtype_size(o->sdt);
    int ibuf = ro->momentum > 0 ? 1 : -1, iga = ro->centered ? (ibuf > 0 ? 2 : 1) : -1;
    for (int64_t k = 0; k < o->nseg; k++) {
        int64_t lo = FG_MAX(begin, o->seg_begin[k]), hi = FG_MIN(end, o->seg_begin[k + 1]);
        if (lo >= hi) continue;
        size_t at = es * (size_t)(lo - begin), st = ss * (size_t)(lo - begin);
        fg_tensor tp = fg__optim_range(o, (char *)param + at, o->dt, hi - lo);
        fg_tensor tg = fg__optim_range(o, (char *)grad + at, o->dt, hi - lo);
        fg_tensor ts = fg__optim_range(o, (char *)state[0] + st, o->sdt, hi - lo);
        fg_tensor tb =
            fg__optim_range(o, ibuf > 0 ? (char *)state[ibuf] + st : NULL, o->sdt, hi - lo);
        fg_tensor ta =
            fg__optim_range(o, iga > 0 ? (char *)state[iga] + st : NULL, o->sdt, hi - lo);
        FG_TRY(fg__ops_rmsprop(&tp, &tg, &ts, ibuf > 0 ? &tb : NULL, iga > 0 ? &ta : NULL,
                               o->seg_lr[k], o->seg_wd[k], ro->alpha, ro->eps, ro->momentum));
    }
    return FG_OK;
}

static const fg__optim_vt rmsprop_vt = {.name = "RMSprop", .step_range = rmsprop_step_range};

fg_optimizer *fg_rmsprop_new(fg_module *m, const fg_rmsprop_opts *opts) {
    fg_rmsprop_opts o = opts ? *opts : (fg_rmsprop_opts){0};
    if (o.lr == 0) o.lr = 1e-2;
    if (o.alpha == 0) o.alpha = 0.99;
    if (o.eps == 0) o.eps = 1e-8;
    if (!(o.lr > 0) || !(o.alpha > 0 && o.alpha <= 1) || !(o.eps > 0) || !(o.weight_decay >= 0) ||
        !(o.momentum >= 0)) {
        fg_error(FG_EINVAL,
                 "rmsprop_new: lr = %g, alpha = %g, eps = %g, weight_decay = %g, momentum = %g: "
                 "expected lr > 0, alpha in (0, 1], eps > 0, the others >= 0",
                 o.lr, o.alpha, o.eps, o.weight_decay, o.momentum);
        return NULL;
    }
    const char *names[3] = {"square_avg"};
    int n = 1;
    if (o.momentum > 0) names[n++] = "momentum_buffer";
    if (o.centered) names[n++] = "grad_avg";
    fg_optimizer *opt = fg__optimizer_new(&rmsprop_vt, m, o.lr, n, names, o.weight_decay, false);
    if (opt) opt->o.rmsprop = o;
    return opt;
}
