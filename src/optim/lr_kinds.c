/* The schedulers' formulas and constructors: StepLR, MultiStepLR,
 * ExponentialLR, CosineAnnealingLR, CosineAnnealingWarmRestarts, LinearLR
 * and OneCycleLR, each get_lr in PyTorch's recursive form (on the groups'
 * current lr) and its closed form where PyTorch has one, the operations in
 * PyTorch's order so that f64 results agree to the last bits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lr_sched_impl.h"

#define PI 3.14159265358979323846

/* Python's a % b for b > 0 */
static int64_t pymod(int64_t a, int64_t b) { return ((a % b) + b) % b; }

/* OneCycleLR's anneal from start to end as pct goes from 0 to 1 */
static double anneal(const fg_lr_scheduler *s, double start, double end, double pct) {
    if (s->oc.anneal_linear) return (end - start) * pct + start;
    double cos_out = cos(PI * pct) + 1;
    return end + (start - end) / 2.0 * cos_out;
}

/* OneCycleLR's phases: end steps and the lr/momentum endpoints of each (0
 * initial, 1 max, 2 min; momenta 0 base, 1 max) */
static int phases(const fg_lr_scheduler *s, double *end, int (*lr)[2], int (*mom)[2]) {
    double T = (double)s->oc.total_steps, pct = s->oc.pct_start;
    if (s->oc.three_phase) {
        end[0] = pct * T - 1;
        end[1] = 2 * pct * T - 2;
        end[2] = T - 1;
        static const int l3[3][2] = {{0, 1}, {1, 0}, {0, 2}}, m3[3][2] = {{1, 0}, {0, 1}, {1, 1}};
        memcpy(lr, l3, sizeof l3);
        memcpy(mom, m3, sizeof m3);
        return 3;
    }
    end[0] = pct * T - 1;
    end[1] = T - 1;
    static const int l2[2][2] = {{0, 1}, {1, 2}}, m2[2][2] = {{1, 0}, {0, 1}};
    memcpy(lr, l2, sizeof l2);
    memcpy(mom, m2, sizeof m2);
    return 2;
}

static FG_MUST_USE fg_status one_cycle_lr(fg_lr_scheduler *s, double *out) {
    int64_t step_num = s->last_epoch;
    if (step_num > s->oc.total_steps)
        return fg_error(FG_EINVAL,
                        "OneCycleLR: tried to step %lld times; the specified number of total "
                        "steps is %lld",
                        (long long)step_num, (long long)s->oc.total_steps);
    double end[3];
    int lr[3][2], mom[3][2];
    int np = phases(s, end, lr, mom);
    double momentum = s->momentum;
    for (int g = 0; g < s->ng; g++) {
        double initial = s->base_lrs[g], mx = s->oc.max_lr;
        double pts[3] = {initial, mx, initial / s->oc.final_div_factor};
        double moms[2] = {s->oc.base_momentum, s->oc.max_momentum};
        double start_step = 0;
        for (int i = 0; i < np; i++) {
            double end_step = end[i];
            if ((double)step_num <= end_step || i == np - 1) {
                double pct = ((double)step_num - start_step) / (end_step - start_step);
                out[g] = anneal(s, pts[lr[i][0]], pts[lr[i][1]], pct);
                if (!s->oc.no_cycle_momentum)
                    momentum = anneal(s, moms[mom[i][0]], moms[mom[i][1]], pct);
                break;
            }
            start_step = end[i];
        }
    }
    if (!s->oc.no_cycle_momentum) {
        s->momentum = momentum;
        fg__optimizer_set_momentum(s->opt, momentum);
    }
    return FG_OK;
}

fg_status fg__sched_get_lr(fg_lr_scheduler *s, double *out) {
    int64_t le = s->last_epoch;
    const fg__pgroup *grp = s->opt->group;
    for (int g = 0; g < s->ng; g++) {
        double lr = grp[g].lr, base = s->base_lrs[g];
        switch (s->kind) {
        case FG__S_STEP: out[g] = le == 0 || le % s->step_size != 0 ? lr : lr * s->gamma; break;
        case FG__S_MULTISTEP: {
            int count = 0;
            for (int i = 0; i < s->nms; i++) count += s->ms[i] == le;
            out[g] = count ? lr * pow(s->gamma, count) : lr;
            break;
        }
        case FG__S_EXP: out[g] = le == 0 ? lr : lr * s->gamma; break;
        case FG__S_LINEAR: {
            double sf = s->start_factor, ef = s->end_factor;
            if (le == 0) out[g] = lr * sf;
            else if (le > s->total_iters) out[g] = lr;
            else
                out[g] =
                    lr *
                    (1. + (ef - sf) / ((double)s->total_iters * sf + (double)(le - 1) * (ef - sf)));
            break;
        }
        case FG__S_COSINE: {
            double T = (double)s->T_max, eta = s->eta_min;
            if (le == 0) out[g] = lr;
            else if (s->step_count == 1 && le > 0)
                out[g] = eta + (base - eta) * (1 + cos((double)le * PI / T)) / 2;
            else if (pymod(le - 1 - s->T_max, 2 * s->T_max) == 0)
                out[g] = lr + (base - eta) * (1 - cos(PI / T)) / 2;
            else
                out[g] = (1 + cos(PI * (double)le / T)) / (1 + cos(PI * (double)(le - 1) / T)) *
                             (lr - eta) +
                         eta;
            break;
        }
        case FG__S_ONECYCLE: return one_cycle_lr(s, out);
        default: out[g] = lr; break;
        }
    }
    return FG_OK;
}

bool fg__sched_closed_form(const fg_lr_scheduler *s, double *out) {
    int64_t le = s->last_epoch;
    for (int g = 0; g < s->ng; g++) {
        double base = s->base_lrs[g];
        switch (s->kind) {
        case FG__S_STEP: out[g] = base * pow(s->gamma, (double)(le / s->step_size)); break;
        case FG__S_MULTISTEP: {
            int k = 0;
            while (k < s->nms && s->ms[k] <= le) k++; /* bisect_right */
            out[g] = base * pow(s->gamma, k);
            break;
        }
        case FG__S_EXP: out[g] = base * pow(s->gamma, (double)le); break;
        case FG__S_LINEAR: {
            double sf = s->start_factor, ef = s->end_factor;
            int64_t m = le < s->total_iters ? le : s->total_iters;
            out[g] = base * (sf + (ef - sf) * (double)m / (double)s->total_iters);
            break;
        }
        case FG__S_COSINE:
            out[g] = s->eta_min +
                     (base - s->eta_min) * (1 + cos(PI * (double)le / (double)s->T_max)) / 2;
            break;
        default: return false;
        }
    }
    return true;
}

fg_status fg__sched_warm_step(fg_lr_scheduler *s, int64_t epoch) {
    if (epoch < 0 && s->last_epoch < 0) epoch = 0;
    if (epoch < 0) {
        epoch = s->last_epoch + 1;
        s->T_cur = s->T_cur + 1;
        if (s->T_cur >= s->T_i) {
            s->T_cur = s->T_cur - s->T_i;
            s->T_i = s->T_i * (double)s->T_mult;
        }
    } else if (epoch >= s->T_0) {
        if (s->T_mult == 1) {
            s->T_cur = (double)(epoch % s->T_0);
        } else {
            double tm = (double)s->T_mult, t0 = (double)s->T_0;
            int n = (int)(log((double)epoch / t0 * (tm - 1) + 1) / log(tm));
            s->T_cur = (double)epoch - t0 * (pow(tm, n) - 1) / (tm - 1);
            s->T_i = t0 * pow(tm, n);
        }
    } else {
        s->T_i = (double)s->T_0;
        s->T_cur = (double)epoch;
    }
    s->last_epoch = epoch;
    for (int g = 0; g < s->ng; g++)
        s->opt->group[g].lr =
            s->eta_min + (s->base_lrs[g] - s->eta_min) * (1 + cos(PI * s->T_cur / s->T_i)) / 2;
    for (int g = 0; g < s->ng; g++) s->last_lr[g] = s->opt->group[g].lr;
    fg__optimizer_segments(s->opt);
    return FG_OK;
}

/* ------------------------------------------------------------ constructors */

fg_lr_scheduler *fg_step_lr_new(fg_optimizer *opt, int64_t step_size, double gamma) {
    if (gamma == 0) gamma = 0.1;
    if (step_size <= 0 || !(gamma > 0) || !isfinite(gamma)) {
        fg_error(FG_EINVAL,
                 "step_lr_new: step_size = %lld, gamma = %g: expected step_size > 0 "
                 "and gamma > 0",
                 (long long)step_size, gamma);
        return NULL;
    }
    fg_lr_scheduler *s = fg__sched_alloc(FG__S_STEP, opt, "step_lr_new");
    if (!s) return NULL;
    s->step_size = step_size;
    s->gamma = gamma;
    return fg__sched_initial_step(s);
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

fg_lr_scheduler *fg_multistep_lr_new(fg_optimizer *opt, const int64_t *milestones, int n,
                                     double gamma) {
    if (gamma == 0) gamma = 0.1;
    if (n < 0 || (n > 0 && !milestones) || !(gamma > 0) || !isfinite(gamma)) {
        fg_error(FG_EINVAL,
                 "multistep_lr_new: %d milestones (%s), gamma = %g: expected an array "
                 "and gamma > 0",
                 n, milestones ? "given" : "NULL", gamma);
        return NULL;
    }
    fg_lr_scheduler *s = fg__sched_alloc(FG__S_MULTISTEP, opt, "multistep_lr_new");
    if (!s) return NULL;
    if (n && !(s->ms = fg_calloc((size_t)n, sizeof *s->ms))) {
        fg_lr_scheduler_free(s);
        return NULL;
    }
    if (n) memcpy(s->ms, milestones, sizeof *s->ms * (size_t)n);
    qsort(s->ms, (size_t)n, sizeof *s->ms, cmp_i64);
    s->nms = n;
    s->gamma = gamma;
    return fg__sched_initial_step(s);
}

fg_lr_scheduler *fg_exponential_lr_new(fg_optimizer *opt, double gamma) {
    if (!(gamma > 0) || !isfinite(gamma)) {
        fg_error(FG_EINVAL, "exponential_lr_new: gamma = %g: expected > 0", gamma);
        return NULL;
    }
    fg_lr_scheduler *s = fg__sched_alloc(FG__S_EXP, opt, "exponential_lr_new");
    if (!s) return NULL;
    s->gamma = gamma;
    return fg__sched_initial_step(s);
}

fg_lr_scheduler *fg_cosine_annealing_lr_new(fg_optimizer *opt, int64_t T_max, double eta_min) {
    if (T_max <= 0 || !(eta_min >= 0)) {
        fg_error(FG_EINVAL,
                 "cosine_annealing_lr_new: T_max = %lld, eta_min = %g: expected "
                 "T_max > 0 and eta_min >= 0",
                 (long long)T_max, eta_min);
        return NULL;
    }
    fg_lr_scheduler *s = fg__sched_alloc(FG__S_COSINE, opt, "cosine_annealing_lr_new");
    if (!s) return NULL;
    s->T_max = T_max;
    s->eta_min = eta_min;
    return fg__sched_initial_step(s);
}

fg_lr_scheduler *fg_cosine_warm_restarts_new(fg_optimizer *opt, int64_t T_0, int64_t T_mult,
                                             double eta_min) {
    if (T_mult == 0) T_mult = 1;
    if (T_0 <= 0 || T_mult < 1 || !(eta_min >= 0)) {
        fg_error(FG_EINVAL,
                 "cosine_warm_restarts_new: T_0 = %lld, T_mult = %lld, eta_min = %g: "
                 "expected T_0 > 0, T_mult >= 1, eta_min >= 0",
                 (long long)T_0, (long long)T_mult, eta_min);
        return NULL;
    }
    fg_lr_scheduler *s = fg__sched_alloc(FG__S_WARM, opt, "cosine_warm_restarts_new");
    if (!s) return NULL;
    s->T_0 = T_0;
    s->T_i = (double)T_0;
    s->T_mult = T_mult;
    s->eta_min = eta_min;
    s->T_cur = -1; /* last_epoch */
    return fg__sched_initial_step(s);
}

fg_lr_scheduler *fg_linear_lr_new(fg_optimizer *opt, const fg_linear_lr_opts *opts) {
    fg_linear_lr_opts o = opts ? *opts : (fg_linear_lr_opts){0};
    if (o.start_factor == 0) o.start_factor = 1.0 / 3;
    if (o.end_factor == 0 && !o.end_is_zero) o.end_factor = 1.0;
    if (o.total_iters == 0) o.total_iters = 5;
    if (!(o.start_factor > 0 && o.start_factor <= 1) || !(o.end_factor >= 0 && o.end_factor <= 1) ||
        o.total_iters < 1) {
        fg_error(FG_EINVAL,
                 "linear_lr_new: start_factor = %g, end_factor = %g, total_iters = "
                 "%lld: expected factors in (0, 1] and [0, 1], total_iters > 0",
                 o.start_factor, o.end_factor, (long long)o.total_iters);
        return NULL;
    }
    fg_lr_scheduler *s = fg__sched_alloc(FG__S_LINEAR, opt, "linear_lr_new");
    if (!s) return NULL;
    s->start_factor = o.start_factor;
    s->end_factor = o.end_factor;
    s->total_iters = o.total_iters;
    return fg__sched_initial_step(s);
}

fg_lr_scheduler *fg_one_cycle_lr_new(fg_optimizer *opt, const fg_one_cycle_opts *opts) {
    fg_one_cycle_opts o = opts ? *opts : (fg_one_cycle_opts){0};
    if (o.total_steps == 0) o.total_steps = o.epochs * o.steps_per_epoch;
    if (o.pct_start == 0) o.pct_start = 0.3;
    if (o.base_momentum == 0) o.base_momentum = 0.85;
    if (o.max_momentum == 0) o.max_momentum = 0.95;
    if (o.div_factor == 0) o.div_factor = 25.;
    if (o.final_div_factor == 0) o.final_div_factor = 1e4;
    if (!(o.max_lr > 0) || o.total_steps <= 0 || !(o.pct_start > 0 && o.pct_start < 1) ||
        !(o.div_factor > 0) || !(o.final_div_factor > 0)) {
        fg_error(FG_EINVAL,
                 "one_cycle_lr_new: max_lr = %g, total_steps = %lld (epochs %lld x "
                 "steps_per_epoch %lld), pct_start = %g: expected max_lr > 0, total_steps > 0 "
                 "(or epochs and steps_per_epoch), pct_start in (0, 1), positive div factors",
                 o.max_lr, (long long)o.total_steps, (long long)o.epochs,
                 (long long)o.steps_per_epoch, o.pct_start);
        return NULL;
    }
    double m;
    if (opt && !o.no_cycle_momentum && !fg__optimizer_momentum(opt, &m)) {
        fg_error(FG_EINVAL,
                 "one_cycle_lr_new: cycle_momentum needs an optimizer with a momentum or betas; "
                 "%s has none (SGD and RMSprop: make them with momentum > 0), or set "
                 "no_cycle_momentum",
                 fg_optimizer_name(opt));
        return NULL;
    }
    /* group['initial_lr'] = max_lr / div_factor, before the base class reads it */
    for (int g = 0; opt && g < opt->ngroups; g++) {
        opt->group[g].initial_lr = o.max_lr / o.div_factor;
        opt->group[g].has_initial = true;
    }
    fg_lr_scheduler *s = fg__sched_alloc(FG__S_ONECYCLE, opt, "one_cycle_lr_new");
    if (!s) return NULL;
    s->oc = o;
    if (!o.no_cycle_momentum) {
        s->momentum = o.max_momentum;
        fg__optimizer_set_momentum(opt, o.max_momentum);
    }
    return fg__sched_initial_step(s);
}
