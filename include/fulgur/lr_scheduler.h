/* fulgur lr_scheduler: PyTorch's torch.optim.lr_scheduler, stateful.
 *
 * A scheduler sets the learning rate of every parameter group of one
 * optimizer (optim.h) each time it steps, exactly as PyTorch 1.13/2.x's
 * (the same recursive ("chainable") formulas, so that ChainedScheduler and
 * SequentialLR compose as there): StepLR, MultiStepLR, ExponentialLR,
 * CosineAnnealingLR, CosineAnnealingWarmRestarts, OneCycleLR, LinearLR,
 * ReduceLROnPlateau, SequentialLR and ChainedScheduler.
 *
 * As in PyTorch, making a scheduler performs its initial step (last_epoch
 * becomes 0) and sets the groups' lr to its value at 0 (LinearLR's start
 * factor, OneCycleLR's max_lr / div_factor...); the first scheduler made on
 * an optimizer records each group's initial lr (group["initial_lr"]), from
 * which every scheduler starts. Call fg_lr_scheduler_step after each
 * fg_optimizer_step (per batch or per epoch, as you choose: the Trainer
 * does it by its lr_scheduler_config, trainer.h).
 *
 * State: fg_lr_scheduler_state_save writes what PyTorch's state_dict holds
 * (last_epoch, base_lrs, last_lr, the plateau's counters, the warm
 * restarts' T_cur/T_i, the momentum OneCycleLR set) as a string; loading it
 * into the same scheduler made on the same optimizer continues bitwise.
 * The optimizer's group lrs themselves are in the optimizer's checkpoint.
 *
 * Thread safety: a scheduler is used by one thread at a time. */
#ifndef FULGUR_LR_SCHEDULER_H
#define FULGUR_LR_SCHEDULER_H

#include "fulgur/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fg_lr_scheduler fg_lr_scheduler;

/* StepLR: lr *= gamma every step_size steps. gamma 0 means 0.1. */
FG_API fg_lr_scheduler *fg_step_lr_new(fg_optimizer *opt, int64_t step_size, double gamma);
/* MultiStepLR: lr *= gamma at each milestone (a milestone given k times
 * multiplies by gamma^k, as PyTorch's Counter). gamma 0 means 0.1. */
FG_API fg_lr_scheduler *fg_multistep_lr_new(fg_optimizer *opt, const int64_t *milestones, int n,
                                            double gamma);
/* ExponentialLR: lr *= gamma every step (gamma > 0, required). */
FG_API fg_lr_scheduler *fg_exponential_lr_new(fg_optimizer *opt, double gamma);
/* CosineAnnealingLR: from the base lr to eta_min over T_max steps, on
 * PyTorch's recursive form (past T_max it rises again, as there). */
FG_API fg_lr_scheduler *fg_cosine_annealing_lr_new(fg_optimizer *opt, int64_t T_max,
                                                   double eta_min);
/* CosineAnnealingWarmRestarts: cosine over T_0 steps, then T_0 * T_mult,
 * ... (T_mult >= 1; 0 means 1). */
FG_API fg_lr_scheduler *fg_cosine_warm_restarts_new(fg_optimizer *opt, int64_t T_0, int64_t T_mult,
                                                    double eta_min);

/* LinearLR: the lr times a factor going linearly from start_factor to
 * end_factor over total_iters steps. All-zero is PyTorch's defaults. */
typedef struct fg_linear_lr_opts {
    double start_factor; /* in (0, 1]; 0 means 1/3 */
    double end_factor;   /* in [0, 1]; 0 means 1.0 (set end_is_zero for 0) */
    bool end_is_zero;
    int64_t total_iters; /* > 0; 0 means 5 */
} fg_linear_lr_opts;
FG_API fg_lr_scheduler *fg_linear_lr_new(fg_optimizer *opt, const fg_linear_lr_opts *o);

/* OneCycleLR (Smith's 1cycle). All-zero but max_lr and the step count is
 * PyTorch's defaults. The lr starts at max_lr / div_factor, rises to max_lr
 * at pct_start of the steps and falls to initial / final_div_factor; with
 * cycle_momentum (the default) the optimizer's momentum (SGD's, RMSprop's)
 * or beta1 (Adam's, AdamW's, Lion's) goes the other way between
 * base_momentum and max_momentum, for every group. Stepping past
 * total_steps is an error, as in PyTorch. */
typedef struct fg_one_cycle_opts {
    double max_lr;       /* > 0, required */
    int64_t total_steps; /* or epochs * steps_per_epoch */
    int64_t epochs, steps_per_epoch;
    double pct_start;        /* in (0, 1); 0 means 0.3 */
    bool anneal_linear;      /* anneal linearly (PyTorch's 'linear'); default 'cos' */
    bool no_cycle_momentum;  /* PyTorch's cycle_momentum=False */
    double base_momentum;    /* 0 means 0.85 */
    double max_momentum;     /* 0 means 0.95 */
    double div_factor;       /* 0 means 25 */
    double final_div_factor; /* 0 means 1e4 */
    bool three_phase;
} fg_one_cycle_opts;
FG_API fg_lr_scheduler *fg_one_cycle_lr_new(fg_optimizer *opt, const fg_one_cycle_opts *o);

/* ReduceLROnPlateau: lr *= factor (not below min_lr) when the monitored
 * value has not improved for more than `patience` steps. All-zero is
 * PyTorch's defaults (mode min, factor 0.1, patience 10, threshold 1e-4
 * relative, cooldown 0, min_lr 0, eps 1e-8). Step it with
 * fg_lr_scheduler_step_value. */
typedef struct fg_plateau_opts {
    bool mode_max;    /* PyTorch's mode='max'; default 'min' */
    double factor;    /* in (0, 1); 0 means 0.1 */
    int64_t patience; /* >= 0; 0 means 10 (set patience_zero for 0) */
    bool patience_zero;
    double threshold; /* >= 0; 0 means 1e-4 (set threshold_zero for 0) */
    bool threshold_zero;
    bool threshold_abs; /* PyTorch's threshold_mode='abs'; default 'rel' */
    int64_t cooldown;   /* >= 0 */
    double min_lr;      /* >= 0, every group */
    double eps;         /* 0 means 1e-8 */
} fg_plateau_opts;
FG_API fg_lr_scheduler *fg_reduce_lr_on_plateau_new(fg_optimizer *opt, const fg_plateau_opts *o);

/* SequentialLR: scheds[0] until milestones[0], then scheds[1]... (n - 1
 * milestones, increasing). ChainedScheduler: every step steps each of
 * scheds in turn. Both take ownership of scheds[] (also on failure), which
 * must be made on the same optimizer, in the order PyTorch's code makes
 * them, and not be ReduceLROnPlateau. */
FG_API fg_lr_scheduler *fg_sequential_lr_new(fg_optimizer *opt, fg_lr_scheduler *const *scheds,
                                             int n, const int64_t *milestones);
FG_API fg_lr_scheduler *fg_chained_scheduler_new(fg_lr_scheduler *const *scheds, int n);

/* NULL is a no-op (frees the schedulers it owns). */
FG_API void fg_lr_scheduler_free(fg_lr_scheduler *s);

/* scheduler.step(): advances one step and sets the groups' lr. FG_EINVAL
 * for ReduceLROnPlateau (it needs a value) and for OneCycleLR past its
 * total_steps. */
FG_API fg_status fg_lr_scheduler_step(fg_lr_scheduler *s);
/* ReduceLROnPlateau's step(metrics): the monitored value (a loss, an
 * accuracy...). FG_EINVAL for another scheduler or a NaN value. */
FG_API fg_status fg_lr_scheduler_step_value(fg_lr_scheduler *s, double value);
/* Whether s is a ReduceLROnPlateau (it steps on a value). */
FG_API bool fg_lr_scheduler_needs_value(const fg_lr_scheduler *s);

/* "StepLR", "MultiStepLR", ... as PyTorch's class names. */
FG_API const char *fg_lr_scheduler_name(const fg_lr_scheduler *s);
FG_API fg_optimizer *fg_lr_scheduler_optimizer(const fg_lr_scheduler *s);
/* get_last_lr()[group]: the lr the last step set (0 for a bad index). */
FG_API double fg_lr_scheduler_last_lr(const fg_lr_scheduler *s, int group);
/* last_epoch: the steps taken since the initial one. */
FG_API int64_t fg_lr_scheduler_last_epoch(const fg_lr_scheduler *s);

/* The state as a string (fg_free it), or NULL with FG_ENOMEM. */
FG_API char *fg_lr_scheduler_state_save(const fg_lr_scheduler *s);
/* Restores it into a scheduler of the same kinds (and parts) on an optimizer
 * with the same number of groups; FG_EMISMATCH naming what differs, and s
 * is then unchanged. Sets OneCycleLR's momentum on the optimizer; the
 * group lrs come from the optimizer's own state. */
FG_API fg_status fg_lr_scheduler_state_load(fg_lr_scheduler *s, const char *state);

#ifdef __cplusplus
}
#endif
#endif
