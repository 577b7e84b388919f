/* torch.optim.SGD over a range of the flat buffers: coupled weight decay,
 * momentum with dampening, Nesterov; the momentum buffer is the gradient
 * itself at the first step (PyTorch's clone when the buffer is None). */
#include <math.h>

#include "optim_impl.h"

static FG_MUST_USE fg_status sgd_step_range(fg_optimizer *o, int64_t begin, int64_t end,
                                            void *param, const void *grad, void *const *state,
                                            int64_t t) {
    const fg_sgd_opts *so = &o->o.sgd;
    size_t es = fg_dtype_size(o->dt);
    for (int64_t k = 0; k < o->nseg; k++) {
        int64_t lo = FG_MAX(begin, o->seg_begin[k]), hi = FG_MIN(end, o->seg_begin[k + 1]);
        if (lo >= hi) continue;
        size_t at = es * (size_t)(lo - begin);
        void *buf = so->momentum != 0
                        ? (char *)state[0] + fg_dtype_size(o->sdt) * (size_t)(lo - begin)
                        : NULL;
        fg_tensor tp = fg__optim_range(o, (char *)param + at, o->dt, hi - lo);
        fg_tensor tg = fg__optim_range(o, (char *)grad + at, o->dt, hi - lo);
        fg_tensor tb = fg__optim_range(o, buf, o->sdt, hi - lo);
        FG_TRY(fg__ops_sgd(&tp, &tg, buf ? &tb : NULL, o->seg_lr[k], o->seg_wd[k], so->momentum,
                           1 - so->dampening, t == 1, so->nesterov));
    }
    return FG_OK;
}

static const fg__optim_vt sgd_vt = {.name = "SGD", .step_range = sgd_step_range};

fg_optimizer *fg_sgd_new(fg_module *m, const fg_sgd_opts *opts) {
    fg_sgd_opts o = opts ? *opts : (fg_sgd_opts){0};
    if (o.lr == 0) o.lr = 0.01;
    if (!(o.lr > 0) || !(o.momentum >= 0) || !(o.dampening >= 0) || !(o.weight_decay >= 0)) {
        fg_error(FG_EINVAL,
                 "sgd_new: lr = %g, momentum = %g, dampening = %g, weight_decay = %g: "
                 "expected lr > 0 and the others >= 0",
                 o.lr, o.momentum, o.dampening, o.weight_decay);
        return NULL;
    }
    if (o.nesterov && (o.momentum == 0 || o.dampening != 0)) {
        fg_error(FG_EINVAL,
                 "sgd_new: nesterov needs momentum > 0 and dampening = 0 (momentum = "
                 "%g, dampening = %g)",
                 o.momentum, o.dampening);
        return NULL;
    }
    static const char *const names[] = {"momentum_buffer"};
    fg_optimizer *opt =
        fg__optimizer_new(&sgd_vt, m, o.lr, o.momentum != 0 ? 1 : 0, names, o.weight_decay, false);
    if (opt) opt->o.sgd = o;
    return opt;
}
