/* ReduceLROnPlateau: PyTorch's, on a value passed in at each step (the
 * Trainer passes the monitored logged value). Not an _LRScheduler there:
 * no initial step, last_epoch starts at 0, the lr only ever goes down. */
#include <math.h>

#include "lr_sched_impl.h"

fg_lr_scheduler *fg_reduce_lr_on_plateau_new(fg_optimizer *opt, const fg_plateau_opts *opts) {
    fg_plateau_opts o = opts ? *opts : (fg_plateau_opts){0};
    if (o.factor == 0) o.factor = 0.1;
    if (o.patience == 0 && !o.patience_zero) o.patience = 10;
    if (o.threshold == 0 && !o.threshold_zero) o.threshold = 1e-4;
    if (o.eps == 0) o.eps = 1e-8;
    if (!(o.factor > 0 && o.factor < 1) || o.patience < 0 || !(o.threshold >= 0) ||
        o.cooldown < 0 || !(o.min_lr >= 0) || !(o.eps >= 0)) {
        fg_error(FG_EINVAL,
                 "reduce_lr_on_plateau_new: factor = %g, patience = %lld, threshold = %g, "
                 "cooldown = %lld, min_lr = %g: expected factor in (0, 1), the others >= 0",
                 o.factor, (long long)o.patience, o.threshold, (long long)o.cooldown, o.min_lr);
        return NULL;
    }
    fg_lr_scheduler *s = fg__sched_alloc(FG__S_PLATEAU, opt, "reduce_lr_on_plateau_new");
    if (!s) return NULL;
    s->po = o;
    s->last_epoch = 0;
    s->best = o.mode_max ? -INFINITY : INFINITY; /* mode_worse */
    return s;
}

static bool is_better(const fg_lr_scheduler *s, double a, double best) {
    const fg_plateau_opts *o = &s->po;
    if (!o->mode_max && !o->threshold_abs) return a < best * (1. - o->threshold);
    if (!o->mode_max) return a < best - o->threshold;
    if (!o->threshold_abs) return a > best * (o->threshold + 1.);
    return a > best + o->threshold;
}

fg_status fg_lr_scheduler_step_value(fg_lr_scheduler *s, double current) {
    if (!s) return fg_error(FG_EINVAL, "lr_scheduler_step_value: NULL scheduler");
    if (s->kind != FG__S_PLATEAU)
        return fg_error(FG_EINVAL,
                        "lr_scheduler_step_value: %s does not step on a value "
                        "(fg_lr_scheduler_step)",
                        fg_lr_scheduler_name(s));
    if (isnan(current))
        return fg_error(FG_EINVAL, "ReduceLROnPlateau: the monitored value is NaN at step %lld",
                        (long long)s->last_epoch + 1);
    if (s->ng != s->opt->ngroups)
        return fg_error(FG_ESTATE, "ReduceLROnPlateau: the optimizer has %d groups, %d when made",
                        s->opt->ngroups, s->ng);
    s->last_epoch++;
    if (is_better(s, current, s->best)) {
        s->best = current;
        s->num_bad = 0;
    } else {
        s->num_bad++;
    }
    if (s->cooldown_counter > 0) {
        s->cooldown_counter--;
        s->num_bad = 0; /* ignore any bad epochs in cooldown */
    }
    if (s->num_bad > s->po.patience) {
        for (int g = 0; g < s->ng; g++) {
            double old_lr = s->opt->group[g].lr;
            double new_lr = fmax(old_lr * s->po.factor, s->po.min_lr);
            if (old_lr - new_lr > s->po.eps) s->opt->group[g].lr = new_lr;
        }
        s->cooldown_counter = s->po.cooldown;
        s->num_bad = 0;
        fg__optimizer_segments(s->opt);
    }
    for (int g = 0; g < s->ng; g++) s->last_lr[g] = s->opt->group[g].lr;
    return FG_OK;
}
