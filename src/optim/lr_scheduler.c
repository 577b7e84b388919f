/* What every learning-rate scheduler shares: PyTorch's _LRScheduler
 * (initial lrs, the initial step, step(epoch) with the closed form when an
 * epoch is given), SequentialLR and ChainedScheduler, the accessors and the
 * state as a string. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lr_sched_impl.h"

static const char *const k_names[] = {
    [FG__S_STEP] = "StepLR",
    [FG__S_MULTISTEP] = "MultiStepLR",
    [FG__S_EXP] = "ExponentialLR",
    [FG__S_COSINE] = "CosineAnnealingLR",
    [FG__S_WARM] = "CosineAnnealingWarmRestarts",
    [FG__S_ONECYCLE] = "OneCycleLR",
    [FG__S_LINEAR] = "LinearLR",
    [FG__S_PLATEAU] = "ReduceLROnPlateau",
    [FG__S_SEQUENTIAL] = "SequentialLR",
    [FG__S_CHAINED] = "ChainedScheduler",
};

fg_lr_scheduler *fg__sched_alloc(fg__sk kind, fg_optimizer *opt, const char *what) {
    if (!opt) {
        fg_error(FG_EINVAL, "%s: NULL optimizer (an earlier constructor failed?)", what);
        return NULL;
    }
    fg_lr_scheduler *s = fg_calloc(1, sizeof *s);
    if (!s) return NULL;
    s->kind = kind;
    s->opt = opt;
    s->ng = opt->ngroups;
    s->base_lrs = fg_calloc((size_t)s->ng, sizeof *s->base_lrs);
    s->last_lr = fg_calloc((size_t)s->ng, sizeof *s->last_lr);
    if (!s->base_lrs || !s->last_lr) {
        fg_lr_scheduler_free(s);
        fg_error(FG_ENOMEM, "%s: %d groups", what, opt->ngroups);
        return NULL;
    }
    /* group.setdefault('initial_lr', group['lr']) (not by ReduceLROnPlateau,
     * which is no _LRScheduler in PyTorch and never reads them) */
    for (int g = 0; g < s->ng; g++) {
        fg__pgroup *pg = &opt->group[g];
        if (!pg->has_initial && kind != FG__S_PLATEAU) {
            pg->initial_lr = pg->lr;
            pg->has_initial = true;
        }
        s->base_lrs[g] = pg->has_initial ? pg->initial_lr : pg->lr;
        s->last_lr[g] = pg->lr;
    }
    s->last_epoch = -1;
    return s;
}

void fg_lr_scheduler_free(fg_lr_scheduler *s) {
    if (!s) return;
    for (int i = 0; i < s->nsub; i++) fg_lr_scheduler_free(s->sub[i]);
    fg_free(s->sub);
    fg_free(s->ms);
    fg_free(s->base_lrs);
    fg_free(s->last_lr);
    fg_free(s);
}

/* the groups' lr into last_lr */
static void record(fg_lr_scheduler *s) {
    for (int g = 0; g < s->ng; g++) s->last_lr[g] = s->opt->group[g].lr;
}

static FG_MUST_USE fg_status set_lrs(fg_lr_scheduler *s, const double *v) {
    for (int g = 0; g < s->ng; g++) s->opt->group[g].lr = v[g];
    record(s);
    fg__optimizer_segments(s->opt);
    return FG_OK;
}

fg_status fg__sched_step(fg_lr_scheduler *s, int64_t epoch) {
    if (s->kind == FG__S_WARM) return fg__sched_warm_step(s, epoch);
    if (s->ng != s->opt->ngroups)
        return fg_error(FG_ESTATE,
                        "%s step: the optimizer has %d parameter groups, %d when the scheduler "
                        "was made (add groups before making schedulers)",
                        k_names[s->kind], s->opt->ngroups, s->ng);
    double stack[16], *v = s->ng <= 16 ? stack : fg_alloc(sizeof(double) * (size_t)s->ng);
    if (!v) return FG_ENOMEM;
    int64_t le = s->last_epoch, sc = s->step_count;
    s->step_count++;
    fg_status st = FG_OK;
    if (epoch < 0) {
        s->last_epoch++;
        st = fg__sched_get_lr(s, v);
    } else {
        s->last_epoch = epoch;
        if (!fg__sched_closed_form(s, v)) st = fg__sched_get_lr(s, v);
    }
    if (st == FG_OK) st = set_lrs(s, v);
    else {
        s->last_epoch = le;
        s->step_count = sc;
    }
    if (v != stack) fg_free(v);
    return st;
}

fg_lr_scheduler *fg__sched_initial_step(fg_lr_scheduler *s) {
    if (!s) return NULL;
    s->step_count = 0;
    if (fg__sched_step(s, -1) != FG_OK) {
        fg_lr_scheduler_free(s);
        return NULL;
    }
    return s;
}

/* one step of a part of SequentialLR/ChainedScheduler, or of s itself */
static FG_MUST_USE fg_status step_any(fg_lr_scheduler *s, int64_t epoch) {
    if (s->kind == FG__S_CHAINED) {
        for (int i = 0; i < s->nsub; i++) FG_TRY(step_any(s->sub[i], -1));
        record(s);
        return FG_OK;
    }
    if (s->kind == FG__S_SEQUENTIAL) {
        s->last_epoch++;
        int idx = 0;
        while (idx < s->nms && s->ms[idx] <= s->last_epoch) idx++; /* bisect_right */
        fg_lr_scheduler *sub = s->sub[idx];
        fg_status st = step_any(sub, idx > 0 && s->ms[idx - 1] == s->last_epoch ? 0 : -1);
        if (st != FG_OK) {
            s->last_epoch--;
            return st;
        }
        memcpy(s->last_lr, sub->last_lr, sizeof(double) * (size_t)s->ng);
        return FG_OK;
    }
    return fg__sched_step(s, epoch);
}

fg_status fg_lr_scheduler_step(fg_lr_scheduler *s) {
    if (!s) return fg_error(FG_EINVAL, "lr_scheduler_step: NULL scheduler");
    if (s->kind == FG__S_PLATEAU)
        return fg_error(FG_EINVAL, "lr_scheduler_step: ReduceLROnPlateau steps on the monitored "
                                   "value: call fg_lr_scheduler_step_value");
    return step_any(s, -1);
}

bool fg_lr_scheduler_needs_value(const fg_lr_scheduler *s) { return s && s->kind == FG__S_PLATEAU; }

/* the parts' checks of SequentialLR and ChainedScheduler; frees them on failure */
static bool parts_ok(const char *what, fg_optimizer *opt, fg_lr_scheduler *const *scheds, int n) {
    bool ok = scheds && n > 0;
    for (int i = 0; ok && i < n; i++) ok = scheds[i] != NULL;
    if (!ok) {
        fg_error(FG_EINVAL, "%s: %d schedulers, some NULL (an earlier constructor failed?)", what,
                 n);
    } else {
        for (int i = 0; ok && i < n; i++) {
            if (scheds[i]->opt != (opt ? opt : scheds[0]->opt)) {
                fg_error(FG_EINVAL,
                         "%s: scheduler %d is on another optimizer than the first (all must "
                         "step the same one)",
                         what, i);
                ok = false;
            } else if (scheds[i]->kind == FG__S_PLATEAU) {
                fg_error(FG_EINVAL,
                         "%s: scheduler %d is a ReduceLROnPlateau, which steps on a value and "
                         "cannot be a part (as in PyTorch)",
                         what, i);
                ok = false;
            }
        }
    }
    if (!ok)
        for (int i = 0; scheds && i < n; i++) fg_lr_scheduler_free(scheds[i]);
    return ok;
}

static fg_lr_scheduler *own_parts(fg_lr_scheduler *s, fg_lr_scheduler *const *scheds, int n,
                                  const char *what) {
    s->sub = fg_calloc((size_t)n, sizeof *s->sub);
    if (!s->sub) {
        for (int i = 0; i < n; i++) fg_lr_scheduler_free(scheds[i]);
        fg_lr_scheduler_free(s);
        fg_error(FG_ENOMEM, "%s: %d parts", what, n);
        return NULL;
    }
    memcpy(s->sub, scheds, sizeof *s->sub * (size_t)n);
    s->nsub = n;
    return s;
}

fg_lr_scheduler *fg_sequential_lr_new(fg_optimizer *opt, fg_lr_scheduler *const *scheds, int n,
                                      const int64_t *milestones) {
    const char *what = "sequential_lr_new";
    if (!parts_ok(what, opt, scheds, n)) return NULL;
    bool ok = n == 1 || milestones;
    for (int i = 1; ok && i < n - 1; i++) ok = milestones[i] > milestones[i - 1];
    if (!ok) {
        fg_error(FG_EINVAL, "%s: %d schedulers need %d increasing milestones", what, n, n - 1);
        for (int i = 0; i < n; i++) fg_lr_scheduler_free(scheds[i]);
        return NULL;
    }
    fg_lr_scheduler *s = fg__sched_alloc(FG__S_SEQUENTIAL, opt, what);
    if (s && n > 1 && !(s->ms = fg_calloc((size_t)n - 1, sizeof *s->ms))) {
        fg_lr_scheduler_free(s);
        s = NULL;
    }
    if (!s) {
        for (int i = 0; i < n; i++) fg_lr_scheduler_free(scheds[i]);
        return NULL;
    }
    if (n > 1) memcpy(s->ms, milestones, sizeof *s->ms * (size_t)(n - 1));
    s->nms = n - 1;
    if (!own_parts(s, scheds, n, what)) return NULL;
    s->last_epoch = 0;
    /* reset the lrs to the initial ones, undo the parts' initial steps, and
     * make the first part's again */
    for (int g = 0; g < s->ng; g++) opt->group[g].lr = opt->group[g].initial_lr;
    fg__optimizer_segments(opt);
    for (int i = 0; i < n; i++) s->sub[i]->last_epoch--;
    s->sub[0]->step_count = 0;
    if (step_any(s->sub[0], -1) != FG_OK) {
        fg_lr_scheduler_free(s);
        return NULL;
    }
    memcpy(s->last_lr, s->sub[0]->last_lr, sizeof(double) * (size_t)s->ng);
    return s;
}

fg_lr_scheduler *fg_chained_scheduler_new(fg_lr_scheduler *const *scheds, int n) {
    const char *what = "chained_scheduler_new";
    if (!parts_ok(what, NULL, scheds, n)) return NULL;
    fg_lr_scheduler *s = fg__sched_alloc(FG__S_CHAINED, scheds[0]->opt, what);
    if (!s) {
        for (int i = 0; i < n; i++) fg_lr_scheduler_free(scheds[i]);
        return NULL;
    }
    if (!own_parts(s, scheds, n, what)) return NULL;
    record(s);
    return s;
}

const char *fg_lr_scheduler_name(const fg_lr_scheduler *s) {
    return s ? k_names[s->kind] : "(null)";
}

fg_optimizer *fg_lr_scheduler_optimizer(const fg_lr_scheduler *s) { return s ? s->opt : NULL; }

double fg_lr_scheduler_last_lr(const fg_lr_scheduler *s, int g) {
    return s && g >= 0 && g < s->ng ? s->last_lr[g] : 0;
}

int64_t fg_lr_scheduler_last_epoch(const fg_lr_scheduler *s) { return s ? s->last_epoch : 0; }

/* ------------------------------------------------------------------ state */

/* The state is a list of tokens: per scheduler (parts after their
 * container, depth first) its name, then last_epoch, step_count, ng,
 * base_lrs, last_lr, T_cur, T_i, momentum, best, num_bad, cooldown_counter;
 * numbers as %.17g (they read back exactly). */
typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void put(sbuf *b, const char *fmt, double v, const char *str) {
    char tmp[64];
    int len = str ? snprintf(tmp, sizeof tmp, "%s ", str) : snprintf(tmp, sizeof tmp, fmt, v);
    if (b->oom || len < 0) return;
    if (b->n + (size_t)len + 1 > b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 256;
        while (cap < b->n + (size_t)len + 1) cap *= 2;
        char *q = fg_realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, tmp, (size_t)len + 1);
    b->n += (size_t)len;
}

static void save(const fg_lr_scheduler *s, sbuf *b) {
    put(b, NULL, 0, k_names[s->kind]);
    put(b, "%.17g ", (double)s->last_epoch, NULL);
    put(b, "%.17g ", (double)s->step_count, NULL);
    put(b, "%.17g ", (double)s->ng, NULL);
    for (int g = 0; g < s->ng; g++) put(b, "%.17g ", s->base_lrs[g], NULL);
    for (int g = 0; g < s->ng; g++) put(b, "%.17g ", s->last_lr[g], NULL);
    double rest[] = {
        s->T_cur, s->T_i, s->momentum, s->best, (double)s->num_bad, (double)s->cooldown_counter};
    for (size_t i = 0; i < sizeof rest / sizeof *rest; i++) put(b, "%.17g ", rest[i], NULL);
    for (int i = 0; i < s->nsub; i++) save(s->sub[i], b);
}

char *fg_lr_scheduler_state_save(const fg_lr_scheduler *s) {
    if (!s) {
        fg_error(FG_EINVAL, "lr_scheduler_state_save: NULL scheduler");
        return NULL;
    }
    sbuf b = {0};
    save(s, &b);
    if (b.oom || !b.p) {
        fg_free(b.p);
        fg_error(FG_ENOMEM, "lr_scheduler_state_save");
        return NULL;
    }
    return b.p;
}

/* Parses one scheduler's tokens at *p into s (apply) or only checks them. */
static FG_MUST_USE fg_status load(fg_lr_scheduler *s, const char **p, bool apply) {
    char name[64];
    int used = 0;
    if (sscanf(*p, " %63s%n", name, &used) != 1)
        return fg_error(FG_EMISMATCH, "lr_scheduler_state_load: the state ends before a %s",
                        k_names[s->kind]);
    if (strcmp(name, k_names[s->kind]))
        return fg_error(FG_EMISMATCH,
                        "lr_scheduler_state_load: the state is of a %s where this scheduler has a "
                        "%s (make the same schedulers as the run that saved it)",
                        name, k_names[s->kind]);
    *p += used;
    int nnum = 3 + 2 * s->ng + 6;
    double v[3 + 2 * 64 + 6];
    if (s->ng > 64)
        return fg_error(FG_EUNSUPPORTED, "lr_scheduler_state_load: %d groups (at most 64)", s->ng);
    for (int i = 0; i < nnum; i++) {
        char *end;
        v[i] = strtod(*p, &end);
        if (end == *p)
            return fg_error(FG_EMISMATCH, "lr_scheduler_state_load: %s: number %d is missing", name,
                            i);
        *p = end;
        if (i == 2 && v[2] != s->ng)
            return fg_error(FG_EMISMATCH,
                            "lr_scheduler_state_load: %s saved with %g parameter groups, this "
                            "optimizer has %d",
                            name, v[2], s->ng);
    }
    if (apply) {
        s->last_epoch = (int64_t)v[0];
        s->step_count = (int64_t)v[1];
        memcpy(s->base_lrs, v + 3, sizeof(double) * (size_t)s->ng);
        memcpy(s->last_lr, v + 3 + s->ng, sizeof(double) * (size_t)s->ng);
        const double *r = v + 3 + 2 * s->ng;
        s->T_cur = r[0];
        s->T_i = r[1];
        s->momentum = r[2];
        s->best = r[3];
        s->num_bad = (int64_t)r[4];
        s->cooldown_counter = (int64_t)r[5];
        if (s->kind == FG__S_ONECYCLE && !s->oc.no_cycle_momentum)
            fg__optimizer_set_momentum(s->opt, s->momentum);
    }
    for (int i = 0; i < s->nsub; i++) FG_TRY(load(s->sub[i], p, apply));
    return FG_OK;
}

fg_status fg_lr_scheduler_state_load(fg_lr_scheduler *s, const char *state) {
    if (!s || !state) return fg_error(FG_EINVAL, "lr_scheduler_state_load: NULL argument");
    const char *p = state;
    FG_TRY(load(s, &p, false)); /* all or nothing */
    p = state;
    return load(s, &p, true);
}
