/* Private header of the learning-rate schedulers (optim.h's schedulers): the
 * scheduler struct, shared by the generic stepping (lr_scheduler.c), the
 * kinds' formulas (lr_kinds.c) and ReduceLROnPlateau (lr_plateau.c).
 *
 * Invariants: base_lrs and last_lr hold ng entries, ng = the optimizer's
 * group count when the scheduler was made; sub[0 .. nsub) are owned
 * (SequentialLR, ChainedScheduler). */
#ifndef FULGUR_LR_SCHED_IMPL_H
#define FULGUR_LR_SCHED_IMPL_H

#include "fulgur/optim.h"
#include "optim_impl.h"

typedef enum fg__sk {
    FG__S_STEP,
    FG__S_MULTISTEP,
    FG__S_EXP,
    FG__S_COSINE,
    FG__S_WARM,
    FG__S_ONECYCLE,
    FG__S_LINEAR,
    FG__S_PLATEAU,
    FG__S_SEQUENTIAL,
    FG__S_CHAINED,
} fg__sk;

struct fg_lr_scheduler {
    fg__sk kind;
    fg_optimizer *opt;
    int ng;
    double *base_lrs, *last_lr;
    int64_t last_epoch, step_count;
    /* the kinds' parameters */
    int64_t step_size;
    double gamma;
    int64_t *ms; /* MultiStepLR's milestones (sorted, repeats kept), SequentialLR's */
    int nms;
    double start_factor, end_factor;
    int64_t total_iters;
    int64_t T_max;
    double eta_min;
    int64_t T_0, T_mult;
    double T_cur, T_i;
    fg_one_cycle_opts oc; /* max_lr, total_steps... resolved */
    double momentum;      /* OneCycleLR's last momentum (cycle_momentum) */
    fg_plateau_opts po;   /* resolved */
    double best;
    int64_t num_bad, cooldown_counter;
    fg_lr_scheduler **sub;
    int nsub;
};

/* A zeroed scheduler of `kind` on opt with base_lrs from the groups'
 * initial lr (set first where unset, PyTorch's setdefault); NULL with
 * FG_ENOMEM or FG_EINVAL (NULL optimizer). */
fg_lr_scheduler *fg__sched_alloc(fg__sk kind, fg_optimizer *opt, const char *what);
/* PyTorch's _initial_step: step_count = 0, then a step. Frees s and
 * returns NULL when that fails. */
fg_lr_scheduler *fg__sched_initial_step(fg_lr_scheduler *s);
/* _LRScheduler.step(epoch): epoch < 0 means None (last_epoch + 1). */
FG_MUST_USE fg_status fg__sched_step(fg_lr_scheduler *s, int64_t epoch);
/* The kinds' get_lr (chainable form) and _get_closed_form_lr (false when
 * the kind has none), into out[ng]. */
FG_MUST_USE fg_status fg__sched_get_lr(fg_lr_scheduler *s, double *out);
bool fg__sched_closed_form(const fg_lr_scheduler *s, double *out);
/* CosineAnnealingWarmRestarts' own step (epoch < 0: None). */
FG_MUST_USE fg_status fg__sched_warm_step(fg_lr_scheduler *s, int64_t epoch);

#endif
