/* fulgur optim: optimizers (SGD, AdamW, Adam, RMSprop, Adagrad, Lion),
 * parameter groups, learning-rate schedules and schedulers, and gradient
 * clipping.
 *
 * An optimizer updates a module's parameters from their gradients, both
 * read as the module's flat buffers (fg_module_flat_params/_grads). Its
 * state (momentum_buffer; exp_avg, exp_avg_sq) is kept in flat buffers of
 * the same layout, one element per parameter element (f32 for bf16/f16
 * parameters, whose updates are computed in f32 and rounded once; the
 * parameters' dtype otherwise), so that a checkpoint
 * or a ZeRO shard of the state is a plain range of elements. The updates are
 * PyTorch's (torch.optim.SGD, torch.optim.AdamW of torch 1.13/2.x with the
 * default foreach=None / non-fused path) element for element.
 *
 * One difference: PyTorch skips parameters whose .grad is None; here every
 * parameter has a gradient (the flat buffer), so a parameter no backward
 * reached is updated with a zero gradient (weight decay and momentum still
 * act on it).
 *
 * Thread safety: an optimizer is used by one thread at a time; its kernels
 * run on fg_get_num_threads() threads (OpenMP over the flat buffer). Nothing
 * here is collective: distributed strategies reduce gradients first. */
#ifndef FULGUR_OPTIM_H
#define FULGUR_OPTIM_H

#include "fulgur/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fg_optimizer fg_optimizer;

/* Every optimizer's options are a struct whose all-zero value is PyTorch's
 * defaults (NULL too); weight decay acts on every parameter unless the
 * optimizer says otherwise (AdamW) or parameter groups change it (below). */

/* torch.optim.SGD. All-zero is lr 0.01 and plain SGD.
 *   p.grad += weight_decay * p                   (coupled L2, as PyTorch)
 *   buf = g at the first step, else momentum * buf + (1 - dampening) * g
 *   g = nesterov ? g + momentum * buf : buf      (when momentum != 0)
 *   p -= lr * g */
typedef struct fg_sgd_opts {
    double lr;           /* > 0; 0 means 0.01 */
    double momentum;     /* >= 0 */
    double dampening;    /* >= 0 */
    bool nesterov;       /* needs momentum > 0 and dampening == 0 (as PyTorch) */
    double weight_decay; /* >= 0 */
} fg_sgd_opts;

/* torch.optim.AdamW (decoupled weight decay). All-zero is PyTorch's
 * defaults, plus nanoGPT's rule that parameters with ndim < 2 (biases,
 * LayerNorm weights) are not decayed:
 *   p *= 1 - lr * wd                              (wd = 0 for ndim < 2)
 *   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
 *   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps) */
typedef struct fg_adamw_opts {
    double lr;            /* > 0; 0 means 1e-3 */
    double beta1, beta2;  /* in [0, 1); 0 means 0.9 and 0.999 */
    double eps;           /* > 0; 0 means 1e-8 */
    double weight_decay;  /* >= 0; 0 means 0.01 (PyTorch's default) */
    bool no_weight_decay; /* no decay at all (weight_decay is then ignored) */
    bool decay_all;       /* decay every parameter, ndim < 2 too (PyTorch's own default) */
} fg_adamw_opts;

/* torch.optim.Adam (coupled L2 weight decay, AMSGrad). All-zero is
 * PyTorch's defaults (weight decay 0, on every parameter):
 *   g += weight_decay * p
 *   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
 *   amsgrad: v_max = max(v_max, v), used for v below
 *   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
 * State "exp_avg", "exp_avg_sq" (and "max_exp_avg_sq" with amsgrad). */
typedef struct fg_adam_opts {
    double lr;           /* > 0; 0 means 1e-3 */
    double beta1, beta2; /* in [0, 1); 0 means 0.9 and 0.999 */
    double eps;          /* > 0; 0 means 1e-8 */
    double weight_decay; /* >= 0 (coupled L2, as PyTorch's Adam) */
    bool amsgrad;
} fg_adam_opts;

/* torch.optim.RMSprop. All-zero is PyTorch's defaults:
 *   g += weight_decay * p
 *   sq = alpha sq + (1 - alpha) g^2
 *   centered: ga = alpha ga + (1 - alpha) g; avg = sqrt(sq - ga^2) + eps
 *   else avg = sqrt(sq) + eps
 *   momentum > 0: buf = momentum buf + g / avg; p -= lr buf
 *   else p -= lr g / avg
 * State "square_avg" (and "momentum_buffer" with momentum > 0, "grad_avg"
 * when centered, in that order). */
typedef struct fg_rmsprop_opts {
    double lr;           /* > 0; 0 means 1e-2 */
    double alpha;        /* in (0, 1]; 0 means 0.99 */
    double eps;          /* > 0; 0 means 1e-8 */
    double weight_decay; /* >= 0 */
    double momentum;     /* >= 0 */
    bool centered;
} fg_rmsprop_opts;

/* torch.optim.Adagrad. All-zero is PyTorch's defaults:
 *   g += weight_decay * p
 *   clr = lr / (1 + (t - 1) lr_decay)
 *   sum += g^2;  p -= clr g / (sqrt(sum) + eps)
 * State "sum", initial_accumulator_value everywhere at first use. */
typedef struct fg_adagrad_opts {
    double lr;                        /* > 0; 0 means 1e-2 */
    double lr_decay;                  /* >= 0 */
    double weight_decay;              /* >= 0 */
    double initial_accumulator_value; /* >= 0 */
    double eps;                       /* > 0; 0 means 1e-10 */
} fg_adagrad_opts;

/* Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms";
 * the update of lucidrains' lion-pytorch and of the paper's code), with
 * decoupled weight decay. All-zero is their defaults:
 *   p *= 1 - lr * weight_decay
 *   p -= lr * sign(beta1 m + (1 - beta1) g)
 *   m = beta2 m + (1 - beta2) g
 * State "exp_avg". */
typedef struct fg_lion_opts {
    double lr;           /* > 0; 0 means 1e-4 */
    double beta1, beta2; /* in [0, 1); 0 means 0.9 and 0.99 */
    double weight_decay; /* >= 0 (decoupled, every parameter) */
} fg_lion_opts;

/* New optimizers over the parameters of `m` (finalized first if needed; a
 * sub-module means its range of the flat buffers). m is borrowed and must
 * outlive the optimizer. NULL opts means the defaults. Returns NULL with
 * fg_last_error on a bad option (FG_EINVAL naming it: negative values, betas
 * outside [0, 1), nesterov without momentum or with dampening) or
 * FG_ENOMEM. State is zero and the step count 0. */
FG_API fg_optimizer *fg_sgd_new(fg_module *m, const fg_sgd_opts *o);
FG_API fg_optimizer *fg_adamw_new(fg_module *m, const fg_adamw_opts *o);
FG_API fg_optimizer *fg_adam_new(fg_module *m, const fg_adam_opts *o);
FG_API fg_optimizer *fg_rmsprop_new(fg_module *m, const fg_rmsprop_opts *o);
FG_API fg_optimizer *fg_adagrad_new(fg_module *m, const fg_adagrad_opts *o);
FG_API fg_optimizer *fg_lion_new(fg_module *m, const fg_lion_opts *o);
/* NULL is a no-op. */
FG_API void fg_optimizer_free(fg_optimizer *opt);
/* Follows the optimizer's module to the device its flat buffers are on now
 * (fg_module_to_device, which an optimizer made before the move needs):
 * the state moves with it, and each step runs on that device (AdamW and
 * SGD; FG_EUNSUPPORTED naming any other, and an offloaded or sharded
 * optimizer). The optimizer holds a reference to the device until freed. */
FG_API FG_MUST_USE fg_status fg_optimizer_to_device(fg_optimizer *opt);

/* One update of every parameter from its current gradient; increments the
 * step count. Under a sharding strategy (deepspeed_stage_1/2, fsdp with
 * SHARD_GRAD_OP: strategy.h) it updates this rank's shard only, then
 * all-gathers the parameters from every rank's shard: the call is then
 * collective, and a failure of the all-gather is its error. Under stage 3
 * (deepspeed_stage_3, fsdp FULL_SHARD, HYBRID_SHARD) it updates the shard
 * and gathers nothing: the parameters stay sharded. Errors:
 * FG_EINVAL for a NULL optimizer. */
FG_API FG_MUST_USE fg_status fg_optimizer_step(fg_optimizer *opt);
/* Zeroes the module's gradients (fg_module_zero_grad). */
FG_API void fg_optimizer_zero_grad(fg_optimizer *opt);

/* The learning rate of group 0 (the optimizer's own). */
FG_API double fg_optimizer_lr(const fg_optimizer *opt);
/* Sets the learning rate of every group, used by the next steps (schedules
 * call it before each step). FG_EINVAL for lr < 0 or not finite. */
FG_API FG_MUST_USE fg_status fg_optimizer_set_lr(fg_optimizer *opt, double lr);

/* ------------------------------------------------------- parameter groups */

/* PyTorch's param_groups: each parameter belongs to one group, with the
 * group's lr and weight_decay. Group 0 holds the parameters no other group
 * took, with the optimizer's options; fg_optimizer_add_param_group makes
 * group 1, 2, ... and moves the parameters it names into it (out of the
 * group that had them). Schedulers (below) set every group's lr
 * from its own initial lr, as PyTorch's do. Groups change what a step does
 * from the next step on; checkpoints hold every group's lr and weight decay
 * (fabric.h's save), and the groups themselves must be made again, the same,
 * before a load (as PyTorch's load_state_dict wants the same groups). */
typedef struct fg_param_group {
    /* The parameters, by fg_module_param_name: one or more fnmatch(3)
     * patterns separated by commas ("*.bias,*ln_*.weight"); every
     * parameter that matches one is moved. Required; matching no parameter
     * is an error (FG_EINVAL naming the pattern). */
    const char *params;
    double lr;           /* > 0; 0 means the optimizer's lr */
    double weight_decay; /* >= 0: this group's, used as is (0: no decay) */
} fg_param_group;

/* Adds a group; returns its index (>= 1), or -1 with fg_last_error. */
FG_API int fg_optimizer_add_param_group(fg_optimizer *opt, const fg_param_group *g);
/* The number of groups (1 + the groups added). */
FG_API int fg_optimizer_num_groups(const fg_optimizer *opt);
/* Group g's learning rate and weight decay (0 for a bad index). */
FG_API double fg_optimizer_group_lr(const fg_optimizer *opt, int g);
FG_API double fg_optimizer_group_weight_decay(const fg_optimizer *opt, int g);
/* PyTorch's group["initial_lr"], where schedulers start from: the group's
 * lr when the first scheduler was made on the optimizer (OneCycleLR sets
 * its own); the current lr before any. */
FG_API double fg_optimizer_group_initial_lr(const fg_optimizer *opt, int g);
/* Set group g's lr (>= 0, finite) or weight decay (>= 0). FG_EINVAL else. */
FG_API FG_MUST_USE fg_status fg_optimizer_set_group_lr(fg_optimizer *opt, int g, double lr);
FG_API FG_MUST_USE fg_status fg_optimizer_set_group_weight_decay(fg_optimizer *opt, int g,
                                                                 double wd);
/* The group of parameter i of the module (fg_module_param), or -1. */
FG_API int fg_optimizer_param_group_of(const fg_optimizer *opt, int64_t i);

/* The usual "no weight decay on biases, norms and embeddings" rule (minGPT's
 * configure_optimizers, Hugging Face's no_decay = ["bias", "LayerNorm.weight"],
 * timm's filter_bias_and_bn) in one line: from now on, no weight decay for
 * every parameter named "bias" and every parameter of a module whose type
 * contains "Norm" (LayerNorm, RMSNorm, BatchNorm*, GroupNorm...) or is
 * "Embedding", whatever its group; the other parameters keep their group's
 * decay. Returns the number of parameters excluded in *count (may be
 * NULL). The exclusion is part of the optimizer, not of the checkpoint:
 * call it again before a load. */
FG_API FG_MUST_USE fg_status fg_optimizer_no_decay_bias_norm_embedding(fg_optimizer *opt,
                                                                       int64_t *count);
/* Whether parameter i is excluded from weight decay (by that rule, or by
 * AdamW's default that leaves parameters with ndim < 2 undecayed). */
FG_API bool fg_optimizer_param_no_decay(const fg_optimizer *opt, int64_t i);
/* Steps taken (AdamW's bias correction uses it; SGD's first step too). */
FG_API int64_t fg_optimizer_step_count(const fg_optimizer *opt);
/* Sets the step count (resuming from a checkpoint). FG_EINVAL if < 0. */
FG_API FG_MUST_USE fg_status fg_optimizer_set_step_count(fg_optimizer *opt, int64_t steps);
/* "SGD", "AdamW", "Adam", "RMSprop", "Adagrad" or "Lion". */
FG_API const char *fg_optimizer_name(const fg_optimizer *opt);
FG_API fg_module *fg_optimizer_module(const fg_optimizer *opt);

/* The state buffers, for checkpoints: SGD has "momentum_buffer" (only
 * when momentum != 0), AdamW "exp_avg" and "exp_avg_sq", the others as
 * their options say. Each is a 1-D
 * persistent tensor (borrowed from the optimizer) of fg_module_numel
 * elements in the layout of fg_module_flat_params: the state of parameter i
 * starts at fg_module_param_offset(m, i). Under a sharding strategy a rank
 * holds only its shard's range: the tensors are then end - begin elements
 * long, element 0 being element `begin` of the layout
 * (fg_optimizer_state_range). Writing them sets the state. Note
 * that a SGD momentum buffer is only used from the second step on, so set
 * the step count too when restoring it. The buffers are made (zero) at
 * first use: the first step, the first fg_optimizer_state, or a sharded
 * strategy's setup, which makes only its shard's; fg_optimizer_state
 * returns NULL with FG_ENOMEM if they cannot be made. */
FG_API int fg_optimizer_num_states(const fg_optimizer *opt);
FG_API const char *fg_optimizer_state_name(const fg_optimizer *opt, int i);
FG_API fg_tensor *fg_optimizer_state(fg_optimizer *opt, int i);
/* The elements [*begin, *end) of the flat layout that the state tensors
 * hold and fg_optimizer_step updates: [0, fg_module_numel) unless a
 * sharding strategy gave the optimizer a shard. Either pointer may be
 * NULL; a NULL optimizer gives [0, 0). */
FG_API void fg_optimizer_state_range(const fg_optimizer *opt, int64_t *begin, int64_t *end);

/* Whether the state lives in files on disk (nvme offload: strategy.h's
 * offload_optimizer_device), and the bytes the steps read from and wrote
 * to those files so far (either pointer may be NULL; 0 in memory). The
 * state tensors then map the files: reading and writing them works as in
 * memory. */
FG_API bool fg_optimizer_state_on_disk(const fg_optimizer *opt, uint64_t *bytes_read,
                                       uint64_t *bytes_written);

/* ---------------------------------------------------------------- schedules */

typedef enum fg_lr_kind {
    FG_LR_CONSTANT = 0, /* lr after the warm-up */
    FG_LR_COSINE,       /* cosine from lr to min_lr between the warm-up and decay_steps */
} fg_lr_kind;

/* nanoGPT's get_lr: for step < warmup_steps, lr * (step + 1) / (warmup_steps + 1);
 * then (FG_LR_COSINE) min_lr + (lr - min_lr) * (1 + cos(pi r)) / 2 with
 * r = (step - warmup_steps) / (decay_steps - warmup_steps); min_lr from
 * decay_steps on. */
typedef struct fg_lr_schedule {
    fg_lr_kind kind;
    double lr, min_lr;
    int64_t warmup_steps;
    int64_t decay_steps; /* the step where the cosine reaches min_lr (> warmup_steps) */
} fg_lr_schedule;

/* The learning rate of optimizer step `step` (0-based): a pure function of
 * the step, so a resumed run continues the same curve. A NULL schedule
 * gives 0. Thread-safe. */
FG_API double fg_lr_at(const fg_lr_schedule *s, int64_t step);

/* ------------------------------------------------------------ schedulers */

/* PyTorch's torch.optim.lr_scheduler, stateful (the pure-function
 * fg_lr_schedule above is nanoGPT's).
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
FG_API FG_MUST_USE fg_status fg_lr_scheduler_step(fg_lr_scheduler *s);
/* ReduceLROnPlateau's step(metrics): the monitored value (a loss, an
 * accuracy...). FG_EINVAL for another scheduler or a NaN value. */
FG_API FG_MUST_USE fg_status fg_lr_scheduler_step_value(fg_lr_scheduler *s, double value);
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
FG_API FG_MUST_USE fg_status fg_lr_scheduler_state_load(fg_lr_scheduler *s, const char *state);

/* ---------------------------------------------------------------- clipping */

/* torch.nn.utils.clip_grad_norm_ over all of m's gradients (2-norm): when
 * the total norm exceeds max_norm, scales every gradient by
 * max_norm / (norm + 1e-6). Writes the norm before clipping to *total_norm
 * (may be NULL). Errors: FG_EINVAL (NULL module, max_norm <= 0 or NaN).
 * Not collective: a strategy with sharded or unreduced gradients uses the
 * two halves below, summing the squares over ranks in between. */
FG_API FG_MUST_USE fg_status fg_clip_grad_norm(fg_module *m, double max_norm, double *total_norm);
/* The sum of squares of m's gradients, in double (thread-count independent). */
FG_API FG_MUST_USE fg_status fg_grad_sumsq(fg_module *m, double *sumsq);
/* The factor clip_grad_norm scales by for a total norm: min(1, max_norm /
 * (norm + 1e-6)); 1 for a NaN norm (nothing is scaled). */
FG_API double fg_clip_coef(double total_norm, double max_norm);
/* Multiplies m's gradients by s. */
FG_API FG_MUST_USE fg_status fg_grad_scale(fg_module *m, double s);

#ifdef __cplusplus
}
#endif
#endif
