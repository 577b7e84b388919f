/* fulgur trainer: Lightning's Trainer and LightningModule, on top of the
 * fabric. The user writes a module table (what to build, what one step
 * computes, the hooks it cares about); the Trainer runs the loops: epochs,
 * gradient accumulation, clipping, validation at the right batches,
 * logging, checkpoints, early stopping and resume, on every strategy the
 * fabric has.
 *
 *   static fg_tensor *training_step(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
 *       my_model *m = ud;
 *       fg_tensor *loss = fg_cross_entropy(fg_module_forward(m->net, b->x), b->y, -100);
 *       fg_trainer_log(t, "train_loss", fg_item(loss), &(fg_log_opts){.prog_bar = true});
 *       return loss;
 *   }
 *   ...
 *   fg_lightning_module lm = {.ud = &m, .model = m.net,
 *                             .configure_optimizers = configure_optimizers,
 *                             .training_step = training_step,
 *                             .validation_step = validation_step};
 *   fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 10, .devices = "2"});
 *   fg_status s = t ? fg_trainer_fit(t, &lm, train_loader, val_loader, NULL) : fg_last_status();
 *   fg_trainer_free(t);
 *
 * Where it writes: like Lightning, a fit with the default settings writes a
 * CSV logger's run folder <default_root_dir>/lightning_logs/version_N/
 * (metrics.csv, hparams.yaml) and checkpoints under its checkpoints/, and
 * sends progress lines to the log hook (rank 0 only). These are the only
 * outputs the library makes on its own; each is an option (logger,
 * callbacks, enable_checkpointing, enable_progress_bar) and the progress bar
 * writes to the FILE* it is given (fg_progress_bar_new), else through the
 * log hook. Nothing else prints, and nothing calls exit().
 *
 * Ranks and launching. An entry point (fg_trainer_fit, _validate, _test,
 * _predict) called outside a launch launches the trainer's fabric for that
 * call (fg_fabric_launch): the hooks run on every rank, in one process or
 * many. Under the re-exec launcher (ddp started by hand) a program is
 * launched once: the ranks are this program again, and they end with the
 * call. To run several entry points on the same ranks, launch once with
 * fg_trainer_launch (or hand the trainer a fabric inside your own
 * fg_fabric_launch run) and call them inside. Under ddp_spawn/ddp_fork the
 * ranks are forked children: after fit, the parent's module.model (when the
 * module gave one) holds rank 0's trained weights; the trainer's counters
 * and metrics stay the children's.
 *
 * Every public call here is made on the rank's main thread, except
 * fg_trainer_log, which a training_step may call from dp's replica threads.
 * Calls marked collective are made by every rank in the same order. */
#ifndef FULGUR_TRAINER_H
#define FULGUR_TRAINER_H

#include <stdio.h>

#include "fulgur/fabric.h"
#include "fulgur/metrics.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fg_trainer fg_trainer;
typedef struct fg_callback fg_callback;
typedef struct fg_logger fg_logger;
typedef struct fg_state_dict fg_state_dict;

/* A yes/no option whose default depends on where it is used: zero means
 * Lightning's default there. */
typedef enum fg_flag { FG_FLAG_DEFAULT = 0, FG_ON = 1, FG_OFF = -1 } fg_flag;

/* A number of batches as Lightning's int-or-float arguments take it: a
 * count (an int in Lightning) or a fraction of an epoch's batches (a
 * float). All-zero is the argument's default. Write FG_COUNT(10) or
 * FG_FRACTION(0.25). */
typedef enum fg_batches_kind {
    FG_BATCHES_DEFAULT = 0,
    FG_BATCHES_COUNT,    /* value is a whole number of batches; -1 = all where allowed */
    FG_BATCHES_FRACTION, /* value in [0, 1]: int(value * batches) */
} fg_batches_kind;

typedef struct fg_batches {
    fg_batches_kind kind;
    double value;
} fg_batches;

#define FG_COUNT(n) ((fg_batches){FG_BATCHES_COUNT, (double)(n)})
#define FG_FRACTION(x) ((fg_batches){FG_BATCHES_FRACTION, (double)(x)})

/* What the trainer is doing (Lightning's TrainerFn), and the loop running
 * now (RunningStage). */
typedef enum fg_trainer_fn {
    FG_FN_NONE = 0,
    FG_FIT,
    FG_VALIDATE,
    FG_TEST,
    FG_PREDICT
} fg_trainer_fn;
typedef enum fg_stage {
    FG_STAGE_NONE = 0,
    FG_STAGE_TRAIN,
    FG_STAGE_SANITY_CHECK, /* the validation batches run before training */
    FG_STAGE_VALIDATE,
    FG_STAGE_TEST,
    FG_STAGE_PREDICT,
} fg_stage;

/* ============================================================ the module */

/* When an lr schedule advances (Lightning's lr_scheduler "interval"). */
typedef enum fg_lr_interval {
    FG_INTERVAL_EPOCH = 0, /* Lightning's default */
    FG_INTERVAL_STEP,
} fg_lr_interval;

/* What configure_optimizers fills in: the optimizer and, optionally, a
 * learning-rate schedule. The schedule's index is i = global_step /
 * frequency (interval step) or current_epoch / frequency (interval epoch),
 * and the optimizer's lr is set to the schedule's value for i before each
 * optimizer step, so it is a pure function of the counters and a resumed
 * run continues the same curve. */
typedef struct fg_optimizer_config {
    fg_optimizer *optimizer;        /* required; consumed: the trainer frees it at the next
                                       configure_optimizers or at fg_trainer_free */
    const fg_lr_schedule *schedule; /* optim.h's warm-up + cosine/constant; copied; NULL = none */
    double (*lr_at)(void *ud, int64_t i); /* or a schedule of your own: the lr for index i */
    void *lr_ud;                          /* handed to lr_at */
    fg_lr_interval interval;
    int64_t frequency; /* 0 = 1 */
    /* Or a PyTorch scheduler (optim.h's fg_lr_scheduler), with Lightning's
     * lr_scheduler_config {"scheduler", "interval", "frequency", "monitor"}:
     * consumed (freed with the optimizer); exclusive with schedule/lr_at.
     * It steps every `frequency` optimizer steps (interval step: when
     * (batch_idx + 1) % frequency == 0 after a batch that stepped, batch_idx
     * counting in the epoch, as Lightning) or epochs (interval epoch: after
     * the epoch's last batch, when (current_epoch + 1) % frequency == 0).
     * A non-plateau scheduler steps right after the optimizer step, before
     * on_train_batch_end (as Lightning 2's), so a checkpoint saved in that
     * hook holds the stepped state and
     * resumes bitwise. The scheduler's state is in the trainer's
     * checkpoints ("trainer.lr_scheduler"). */
    fg_lr_scheduler *scheduler;
    /* ReduceLROnPlateau: the callback metric it steps on (required for it,
     * as Lightning's "monitor"); it steps after the batch's validation
     * (interval step) or at the epoch's end, after its validation and
     * before the on_train_epoch_end hooks (interval epoch; Lightning: after
     * them: here a checkpoint saved in them resumes bitwise). A monitor that is not logged is an
     * error naming the available metrics (Lightning's strict=True). Copied. */
    const char *monitor;
    /* Several optimizers and schedulers (Lightning's `return [opt_g, opt_d],
     * [sched_g, sched_d]`), with manual optimization only (as Lightning 2:
     * automatic_optimization FG_OFF): optimizers[0 .. noptimizers) instead
     * of .optimizer, each over the model or a sub-module of it, no two over
     * one parameter (fg_fabric_setup_many's rules); lr_schedulers[0 ..
     * nlr_schedulers), each made on one of them. All consumed as
     * .optimizer and .scheduler. With manual optimization the trainer steps
     * no scheduler (Lightning's rule: fg_trainer_lr_scheduler and
     * fg_lr_scheduler_step in training_step or an epoch hook); their state
     * is in the checkpoints. */
    fg_optimizer *optimizers[FG_FABRIC_MAX_OPTIMIZERS];
    int noptimizers;
    fg_lr_scheduler *lr_schedulers[FG_FABRIC_MAX_OPTIMIZERS];
    int nlr_schedulers;
} fg_optimizer_config;

/* A hook: returns FG_OK, or an error status with a message (fg_error),
 * which stops the loop and comes back from the entry point. */
typedef FG_MUST_USE fg_status (*fg_hook_fn)(void *ud, fg_trainer *t);
/* A hook on one batch; batch_idx counts from 0 in the epoch (or the
 * evaluation run). The batch is the loader's: valid until the next one. */
typedef FG_MUST_USE fg_status (*fg_batch_hook_fn)(void *ud, fg_trainer *t, fg_batch *b,
                                                  int64_t batch_idx);

/* The user's module: Lightning's LightningModule as a table. Every entry
 * but training_step (for fit) is optional; what NULL means is said beside
 * it. `ud` is handed to every function. The table is copied by the entry
 * points; ud, model and hparams are borrowed for the call. */
typedef struct fg_lightning_module {
    void *ud;
    /* The network, built before the call; or NULL and configure_model. */
    fg_module *model;
    /* Builds the network on each rank inside the run (Lightning's
     * configure_model, sharded-friendly construction) and returns it,
     * borrowed: it stays the module's. Called at the start of every entry
     * point: return the same model when it already exists. Where setup
     * shards the parameters (deepspeed_stage_3, fsdp FULL_SHARD or
     * HYBRID_SHARD on more than one rank: fg_fabric_shards_params) it runs
     * under empty init (fg_module_set_empty_init), so that a model built
     * here is initialised shard by shard, never whole on a rank. NULL:
     * model is used; one of the two is required. */
    fg_module *(*configure_model)(void *ud, fg_trainer *t);
    /* Fills *out. Called at the start of fit (only). Required by fit. */
    FG_MUST_USE fg_status (*configure_optimizers)(void *ud, fg_trainer *t,
                                                  fg_optimizer_config *out);
    /* Lightning's automatic_optimization. Default (FG_FLAG_DEFAULT, FG_ON):
     * the trainer calls backward on training_step's loss and steps the
     * optimizer. FG_OFF (Lightning's `self.automatic_optimization = False`):
     * training_step does it itself with fg_trainer_manual_backward,
     * fg_trainer_optimizer (optimizers()), fg_trainer_optimizer_step
     * (opt.step()), fg_optimizer_zero_grad, fg_trainer_toggle_optimizer and
     * its own gradient accumulation; it may return NULL (Lightning's None)
     * or a loss that is only shown. global_step counts every optimizer step
     * (two per batch with two optimizers, as Lightning's); logger rows are
     * written every log_every_n_steps batches. Refused with it, as
     * Lightning does: accumulate_grad_batches > 1, gradient_clip_val
     * (clip in training_step with fg_fabric_clip_gradients), on_nonfinite,
     * schedule/lr_at, and the strategies that split a batch over threads
     * (dp, ddp2). Checkpoints of several optimizers hold each one's state
     * and lr under optimizer.N. (fg_train_state.optimizers); one optimizer
     * over a sub-module saves none (enable_checkpointing FG_OFF; a save is
     * FG_EUNSUPPORTED). Under ddp,
     * toggling leaves parameters without gradients: set the strategy's
     * find_unused_parameters. */
    fg_flag automatic_optimization;
    /* Lightning's hparams (save_hyperparameters): logged to every logger at
     * the start of fit (hparams.yaml). NULL = none. */
    const fg_kv *hparams;
    int64_t nhparams;

    /* The loss of one batch, a step tensor the trainer calls backward on
     * (scaled by 1/accumulate_grad_batches, as Lightning). NULL is an error
     * (with fg_last_error's message); Lightning's "return None to skip" is
     * not supported (ranks would disagree on the number of steps). Under dp
     * it is called on each thread's part of the batch, from several threads
     * at once. Required by fit. */
    fg_tensor *(*training_step)(void *ud, fg_trainer *t, fg_batch *b, int64_t batch_idx);
    /* After training_step has run on every part (dp: one per thread, else
     * one) and backward with it: each part's loss. It cannot change the
     * loss (backward already ran per part). NULL: nothing. */
    FG_MUST_USE fg_status (*training_step_end)(void *ud, fg_trainer *t, const double *part_losses,
                                               int nparts);
    /* Evaluation steps, on the whole batch (no dp split), gradients off,
     * the model in eval mode. They return nothing: log what you measure
     * (fg_trainer_log), keep predictions yourself. NULL: validation_step
     * NULL means fit runs no validation; test_step and predict_step NULL
     * make fg_trainer_test/_predict an error. Under ddp the last batches may
     * hold distributed padding: b->valid says how many leading samples are
     * real. */
    fg_batch_hook_fn validation_step, test_step, predict_step;
    /* Called right after the step of the same name, with its batch. NULL:
     * nothing. */
    fg_batch_hook_fn validation_step_end, test_step_end, predict_step_end;

    /* Loaders made inside the run, on each rank, when the entry point is
     * given NULL (Lightning's *_dataloader hooks; needed where loaders with
     * worker threads must not cross a fork: ddp_spawn/ddp_fork). Borrowed:
     * the module frees them (e.g. in teardown). NULL: no such data. */
    fg_dataloader *(*train_dataloader)(void *ud, fg_trainer *t);
    fg_dataloader *(*val_dataloader)(void *ud, fg_trainer *t);
    fg_dataloader *(*test_dataloader)(void *ud, fg_trainer *t);
    fg_dataloader *(*predict_dataloader)(void *ud, fg_trainer *t);

    /* setup before configure_model, teardown at the end of every entry
     * point (also after a failure), with what is running. NULL: nothing. */
    FG_MUST_USE fg_status (*setup)(void *ud, fg_trainer *t, fg_trainer_fn fn);
    void (*teardown)(void *ud, fg_trainer *t, fg_trainer_fn fn);

    /* Lightning's hooks, called after the callbacks' hooks of the same name
     * (on_train_epoch_end: between the callbacks that monitor a metric and
     * the others, as Lightning). NULL: nothing. */
    fg_hook_fn on_fit_start, on_fit_end, on_train_start, on_train_end;
    fg_hook_fn on_train_epoch_start, on_train_epoch_end;
    fg_hook_fn on_validation_epoch_start, on_validation_epoch_end;
    fg_hook_fn on_test_epoch_start, on_test_epoch_end;
    fg_batch_hook_fn on_train_batch_start, on_train_batch_end;
    /* Once the gradients of an optimizer step are accumulated (and reduced
     * over ranks), before clipping and the step: inspect or change them. */
    fg_hook_fn on_before_optimizer_step;
    /* Adds the module's own key/value strings to a checkpoint being saved
     * (collective: every rank calls it, rank 0's are written), and reads
     * them back from a checkpoint being loaded (the whole metadata: the
     * keys you set, and the trainer's). NULL: nothing. */
    FG_MUST_USE fg_status (*on_save_checkpoint)(void *ud, fg_trainer *t, fg_state_dict *ckpt);
    FG_MUST_USE fg_status (*on_load_checkpoint)(void *ud, fg_trainer *t, const fg_state_dict *ckpt);
} fg_lightning_module;

/* =========================================================== the trainer */

typedef enum fg_clip_algorithm { FG_CLIP_NORM = 0, FG_CLIP_VALUE } fg_clip_algorithm;
typedef enum fg_nonfinite {
    FG_NONFINITE_IGNORE = 0, /* Lightning's: nothing checked */
    FG_NONFINITE_STOP,
    FG_NONFINITE_SKIP,
} fg_nonfinite;

/* The Trainer's arguments, with Lightning's names and meanings. All-zero
 * is Lightning's defaults; where Lightning's value can be zero and zero
 * means the default here, the comment says how to ask for it. */
typedef struct fg_trainer_opts {
    /* Hardware, as fg_fabric_config reads them (launch.h): NULL = "auto". */
    const char *accelerator, *strategy, *devices, *precision;
    int num_nodes;     /* 0 = 1, or the launcher's nodes */
    uint64_t seed;     /* non-zero: seed_everything(seed) when the fabric is made */
    fg_fabric *fabric; /* or a fabric to use, borrowed (the five above must then be
                          unset): launched by the trainer, or already running */

    /* How long. max_epochs 0 = unset (Lightning's None): 1000 when max_steps
     * is unset too, else no limit; -1 = no limit. max_steps 0 = -1 (no
     * limit): optimizer steps. min_epochs and min_steps (0 = none) keep an
     * early stop from taking effect before they are reached. max_time in
     * seconds (0 = none; fg_trainer_parse_duration reads "DD:HH:MM:SS"):
     * checked after every training batch and epoch, as Lightning's Timer. */
    int64_t max_epochs, min_epochs, max_steps, min_steps;
    double max_time;

    /* Optimization. accumulate_grad_batches 0 = 1; the backward of every
     * micro-batch but the last of a window runs without ddp's gradient sync
     * (the fabric's no_backward_sync); the last batch of an epoch always
     * steps. gradient_clip_val 0 = off; by the global 2-norm (default) or
     * by value (each element clamped to [-v, v]). */
    int64_t accumulate_grad_batches;
    double gradient_clip_val;
    fg_clip_algorithm gradient_clip_algorithm;

    /* Validation. val_check_interval: default FG_FRACTION(1.0) (once per
     * epoch, after its last batch); FG_COUNT(n): after every n training
     * batches of the epoch (of the whole run when check_val_every_n_epoch
     * is -1); FG_FRACTION(f): after every max(1, int(f * batches)) batches.
     * check_val_every_n_epoch: 0 = 1; -1 = None (Lightning's: count batches
     * across epochs). num_sanity_val_steps: default 2 validation batches run
     * before training (none when resuming); FG_COUNT(0) turns it off,
     * FG_COUNT(-1) runs them all. */
    fg_batches val_check_interval;
    int64_t check_val_every_n_epoch;
    fg_batches num_sanity_val_steps;

    /* Batches per epoch (per rank), of the loader's: default all;
     * FG_COUNT(n) at most n; FG_FRACTION(f) int(f * batches) (an error when
     * that is 0 for f > 0). FG_COUNT(0) skips that loop (no validation). */
    fg_batches limit_train_batches, limit_val_batches, limit_test_batches, limit_predict_batches;

    /* fast_dev_run = n > 0: n batches of training, validation, test and
     * predict, one epoch, max_steps n, no sanity check, no checkpoints and
     * no loggers (Lightning's; n = 1 is its True). */
    int64_t fast_dev_run;

    int64_t log_every_n_steps;    /* 0 = 50: optimizer steps between logger rows */
    fg_flag enable_progress_bar;  /* default on: progress lines through the log hook, rank 0 */
    fg_flag enable_checkpointing; /* default on: a ModelCheckpoint when none is given */
    const char *default_root_dir; /* NULL = "." (Lightning's os.getcwd()) */
    /* Lightning's deterministic. fulgur's kernels, reductions and data
     * order are deterministic for one world size whatever it says
     * (docs/design.md); on, the fabric's mode (fabric.h) makes the weights
     * bitwise the same on any number of ranks for the same global batch:
     * the loss is then not divided by accumulate_grad_batches (the fabric
     * averages the micro-batches), the training loader is dealt in
     * micro-batches and cut to whole global batches, and one kernel thread
     * runs per rank. With a fabric given, its own setting rules. */
    bool deterministic;
    /* Stop at the first non-finite loss or gradient, naming the step, the
     * batch and the tensor (FG_EINVAL). */
    bool detect_anomaly;
    /* A non-finite loss (on any rank) or gradient, checked once per
     * optimizer step with one allreduce so that every rank decides alike
     * (fulgur's, beside detect_anomaly's check on each rank):
     * FG_NONFINITE_STOP ends fit with FG_EINVAL on every rank, naming the
     * step, the loss or the parameter, and the last good checkpoint;
     * FG_NONFINITE_SKIP zeroes the gradients and skips the optimizer step on
     * every rank (global_step does not advance; counted by
     * fg_trainer_skipped_steps; 1000 in a row is an error). Under 16-mixed
     * the loss scaler owns non-finite gradients: only the loss is checked. */
    fg_nonfinite on_nonfinite;

    /* Callbacks and loggers, borrowed: they must outlive the trainer (free
     * them after fg_trainer_free). logger = FG_OFF is Lightning's
     * logger=False; with no logger given and logger not FG_OFF, the trainer
     * makes a CSV logger in default_root_dir (Lightning's default logger). */
    fg_callback *const *callbacks;
    int ncallbacks;
    fg_logger *const *loggers;
    int nloggers;
    fg_flag logger;
} fg_trainer_opts;

/* A trainer for opts (NULL = defaults). Every option is checked here, and
 * the fabric made (fg_fabric_new) unless one is handed in. Returns NULL
 * with FG_EINVAL naming the bad option and its valid values, the fabric's
 * errors (FG_EUNSUPPORTED for a strategy or precision not built), or
 * FG_ENOMEM. Free with fg_trainer_free. */
FG_API fg_trainer *fg_trainer_new(const fg_trainer_opts *opts);
/* Frees the trainer, its fabric (unless handed in), its optimizer and the
 * callbacks and logger it made itself. NULL is a no-op. */
FG_API void fg_trainer_free(fg_trainer *t);

/* Lightning's trainer.fit: trains m on train (and validates on val when
 * m->validation_step is set), each loader borrowed (NULL: the module's
 * train_dataloader/val_dataloader hook). The trainer puts the distributed
 * sampler into them (fg_fabric_setup_dataloader).
 *   ckpt_path: NULL = from scratch; "last" = the newest last*.safetensors in
 *   the ModelCheckpoint folders (none: from scratch, as Lightning); "best" =
 *   the first ModelCheckpoint's best; else a checkpoint file. Training
 *   resumes exactly where the checkpoint was taken, mid-epoch included:
 *   weights, optimizer, counters, data position, epoch means, callback and
 *   module state; the same bits as an uninterrupted run.
 * Returns FG_OK, or the first error: a hook's, the fabric's, FG_EINVAL
 * naming a bad setting (no training_step, val_check_interval past the
 * epoch, ...), FG_EPEER naming a failed rank. Collective. */
FG_API FG_MUST_USE fg_status fg_trainer_fit(fg_trainer *t, const fg_lightning_module *m,
                                            fg_dataloader *train, fg_dataloader *val,
                                            const char *ckpt_path);
/* One validation (test) run over dl (NULL: the module's hook) with
 * m->validation_step (test_step); the results are the callback metrics
 * afterwards (fg_trainer_metrics). ckpt_path: NULL = the model's current
 * weights; "best", "last" or a file: load those weights first. */
FG_API FG_MUST_USE fg_status fg_trainer_validate(fg_trainer *t, const fg_lightning_module *m,
                                                 fg_dataloader *dl, const char *ckpt_path);
FG_API FG_MUST_USE fg_status fg_trainer_test(fg_trainer *t, const fg_lightning_module *m,
                                             fg_dataloader *dl, const char *ckpt_path);
/* Runs m->predict_step over dl; the predictions are the module's to keep
 * (Lightning returns them; here predict_step stores or writes them). */
FG_API FG_MUST_USE fg_status fg_trainer_predict(fg_trainer *t, const fg_lightning_module *m,
                                                fg_dataloader *dl, const char *ckpt_path);

/* Several validation or test loaders (Lightning's list of val_dataloaders):
 * the evaluation loops run each in turn, the epoch hooks once around all
 * of them; a value logged from a step or batch hook of loader i is named
 * "<name>/dataloader_idx_<i>" when there are several (Lightning's
 * add_dataloader_idx), epoch-hook values keep their name; the limits
 * (limit_val_batches, num_sanity_val_steps) apply to each loader.
 * fg_trainer_dataloader_idx tells a step which loader its batch is from.
 * n is 1 .. FG_MAX_EVAL_LOADERS; each loader borrowed as fg_trainer_fit's. */
#define FG_MAX_EVAL_LOADERS 8
FG_API FG_MUST_USE fg_status fg_trainer_fit_loaders(fg_trainer *t, const fg_lightning_module *m,
                                                    fg_dataloader *train,
                                                    fg_dataloader *const *vals, int nvals,
                                                    const char *ckpt_path);
FG_API FG_MUST_USE fg_status fg_trainer_validate_loaders(fg_trainer *t,
                                                         const fg_lightning_module *m,
                                                         fg_dataloader *const *dls, int n,
                                                         const char *ckpt_path);
FG_API FG_MUST_USE fg_status fg_trainer_test_loaders(fg_trainer *t, const fg_lightning_module *m,
                                                     fg_dataloader *const *dls, int n,
                                                     const char *ckpt_path);
/* The index of the evaluation loader whose batch is being run (0 with one
 * loader, and outside evaluation). */
FG_API int fg_trainer_dataloader_idx(const fg_trainer *t);

/* Lightning's LightningDataModule: the data of a run as a table of hooks,
 * handed to the entry points beside the module (trainer.fit(model,
 * datamodule=dm)). Every entry may be NULL. The table is copied; ud is
 * borrowed for the call. */
typedef struct fg_datamodule {
    void *ud;
    /* Downloads, tokenizes, writes to disk: once per node, on its local rank
     * 0, while the other ranks wait (Lightning's prepare_data with
     * prepare_data_per_node=True); state set here is not seen by the other
     * ranks. Called at the start of every entry point, before setup. */
    FG_MUST_USE fg_status (*prepare_data)(void *ud, fg_trainer *t);
    /* On every rank, before the module's setup: split, build the datasets. */
    FG_MUST_USE fg_status (*setup)(void *ud, fg_trainer *t, fg_trainer_fn fn);
    /* After the module's teardown, on every rank, also after a failure. */
    void (*teardown)(void *ud, fg_trainer *t, fg_trainer_fn fn);
    /* The loaders, made inside the run on each rank; borrowed (the data
     * module frees them, e.g. in teardown). Used instead of the module's
     * hooks of the same name; a loader handed to the entry point wins. */
    fg_dataloader *(*train_dataloader)(void *ud, fg_trainer *t);
    fg_dataloader *(*val_dataloader)(void *ud, fg_trainer *t);
    fg_dataloader *(*test_dataloader)(void *ud, fg_trainer *t);
    fg_dataloader *(*predict_dataloader)(void *ud, fg_trainer *t);
} fg_datamodule;

/* The entry points with a data module: trainer.fit(model, datamodule=dm),
 * trainer.validate(model, datamodule=dm), ... dm may be NULL (the plain
 * entry points then). */
FG_API FG_MUST_USE fg_status fg_trainer_fit_datamodule(fg_trainer *t, const fg_lightning_module *m,
                                                       const fg_datamodule *dm,
                                                       const char *ckpt_path);
FG_API FG_MUST_USE fg_status fg_trainer_validate_datamodule(fg_trainer *t,
                                                            const fg_lightning_module *m,
                                                            const fg_datamodule *dm,
                                                            const char *ckpt_path);
FG_API FG_MUST_USE fg_status fg_trainer_test_datamodule(fg_trainer *t, const fg_lightning_module *m,
                                                        const fg_datamodule *dm,
                                                        const char *ckpt_path);
FG_API FG_MUST_USE fg_status fg_trainer_predict_datamodule(fg_trainer *t,
                                                           const fg_lightning_module *m,
                                                           const fg_datamodule *dm,
                                                           const char *ckpt_path);

/* Launches the trainer's fabric once and runs run(t, arg) on every rank:
 * inside, the entry points run on these ranks without launching again (fit
 * then test on the same ranks, under any launcher). Returns run's return
 * value, or non-zero with fg_last_error as fg_fabric_launch. */
FG_API int fg_trainer_launch(fg_trainer *t, int (*run)(fg_trainer *t, void *arg), void *arg);

/* ------------------------------------------------------------- logging */

typedef enum fg_reduce_fx {
    FG_REDUCE_FX_MEAN = 0, /* the epoch value is the mean weighted by batch_size */
    FG_REDUCE_FX_SUM,
    FG_REDUCE_FX_MAX,
    FG_REDUCE_FX_MIN,
} fg_reduce_fx;

/* Lightning's self.log arguments. All-zero = its defaults, which depend on
 * the hook: in training_step, training_step_end, on_train_batch_* and
 * on_before_optimizer_step on_step and not on_epoch; in validation_step,
 * test_step, their *_end, batch and epoch hooks, and on_train_epoch_*, not
 * on_step and on_epoch (and in the epoch hooks on_step is not allowed). */
typedef struct fg_log_opts {
    fg_flag on_step;  /* the value of each batch */
    fg_flag on_epoch; /* reduced over the epoch with reduce_fx */
    fg_flag logger;   /* default on: sent to the loggers */
    bool prog_bar;    /* shown by the progress bar */
    /* Reduce over ranks with reduce_fx (mean: weighted by batch_size over
     * all ranks). Collective: every rank logs the name, in the same order;
     * on_step values are reduced at once, epoch values at the epoch end. */
    bool sync_dist;
    bool rank_zero_only; /* logged from rank 0 only: never reduced */
    fg_reduce_fx reduce_fx;
    int64_t batch_size; /* 0 = the current batch's size (1 outside a step) */
} fg_log_opts;

/* Lightning's self.log(name, value, ...), from a module's or a callback's
 * hook. When both on_step and on_epoch hold, the name is logged twice, as
 * name_step and name_epoch. The values land in the callback metrics
 * (fg_trainer_callback_metric), the progress bar and the loggers (rank 0,
 * every log_every_n_steps steps; epoch values at the epoch's end). Under dp
 * the parts' values of one batch combine by reduce_fx (mean: by part size).
 * Errors: FG_EINVAL (NULL or empty name; the same name logged from the same
 * hook with other on_step/on_epoch/reduce_fx; on_step in an epoch hook),
 * FG_ESTATE (not inside a hook that may log: predict, setup,
 * configure_*, on_fit_*, checkpoints), a reduction's error. Thread-safe
 * (dp's replica threads). */
FG_API FG_MUST_USE fg_status fg_trainer_log(fg_trainer *t, const char *name, double value,
                                            const fg_log_opts *opts);

/* Lightning's self.log(name, metric) with a TorchMetrics object
 * (`self.train_acc(preds, y); self.log("train_acc", self.train_acc)`): the
 * on_step value is the metric's last forward (fg_tmetric_forward: this
 * batch on this rank); the on_epoch value is fg_tmetric_compute at the
 * epoch's end, reduced over the ranks (the fabric's communicator when the
 * metric has none), after which the metric is reset. on_step, on_epoch,
 * prog_bar, logger and the defaults by hook are fg_trainer_log's;
 * reduce_fx, sync_dist and batch_size do not apply (the metric reduces
 * itself). m is borrowed: it must live until the epoch's end. Collective at
 * the epoch's end: every rank logs the same metrics, in the same order.
 * Errors: fg_trainer_log's; FG_EINVAL for NULL m, or on_step without a
 * forward since the metric was made or reset (log the update through
 * fg_tmetric_forward, or on_epoch only). A metric's state is not in
 * checkpoints (TorchMetrics' states are not persistent by default): an
 * epoch resumed in the middle computes its value from the batches after
 * the resume. */
FG_API FG_MUST_USE fg_status fg_trainer_log_metric(fg_trainer *t, const char *name, fg_tmetric *m,
                                                   const fg_log_opts *opts);

/* A named value (metrics, logger rows). */
typedef struct fg_metric {
    const char *name;
    double value;
} fg_metric;

typedef enum fg_metric_set {
    FG_CALLBACK_METRICS = 0, /* what callbacks monitor: Lightning's trainer.callback_metrics */
    FG_LOGGED_METRICS,       /* what went to the loggers */
    FG_PROGRESS_BAR_METRICS, /* what the progress bar shows */
} fg_metric_set;

/* The value of callback metric `name` in *out: true if present. */
FG_API bool fg_trainer_callback_metric(const fg_trainer *t, const char *name, double *out);
/* One of the metric sets: *out points at its entries (borrowed, valid until
 * the next hook or trainer call); returns their count. Refreshed after
 * every batch and epoch; reset at the start of each entry point. */
FG_API int64_t fg_trainer_metrics(const fg_trainer *t, fg_metric_set which, const fg_metric **out);

/* --------------------------------------------------- manual optimization */

/* Lightning's self.optimizers(): optimizer i of configure_optimizers'
 * answer (0 = out->optimizer or out->optimizers[0]), borrowed; NULL with
 * FG_EINVAL for a bad index. fg_trainer_num_optimizers: how many. */
FG_API fg_optimizer *fg_trainer_optimizer_at(const fg_trainer *t, int i);
FG_API int fg_trainer_num_optimizers(const fg_trainer *t);
/* Lightning's self.lr_schedulers(): scheduler i, borrowed (NULL if none). */
FG_API fg_lr_scheduler *fg_trainer_lr_scheduler(const fg_trainer *t, int i);
FG_API int fg_trainer_num_lr_schedulers(const fg_trainer *t);
/* Lightning's self.manual_backward(loss): backward through the fabric (the
 * precision's loss scale, ddp's gradient averaging), from training_step
 * under manual optimization only (FG_ESTATE elsewhere). Gradients add up
 * over calls until zeroed: accumulation is the caller's. Collective under
 * ddp. */
FG_API FG_MUST_USE fg_status fg_trainer_manual_backward(fg_trainer *t, fg_tensor *loss);
/* Lightning's optimizer.step() in manual optimization: the
 * on_before_optimizer_step hooks, then fg_fabric_optimizer_step; counts one
 * global step. opt is one of fg_trainer_optimizer_at's (FG_EINVAL else);
 * from training_step only (FG_ESTATE). Zeroing is the caller's
 * (fg_optimizer_zero_grad). */
FG_API FG_MUST_USE fg_status fg_trainer_optimizer_step(fg_trainer *t, fg_optimizer *opt);
/* Lightning's toggle_optimizer(opt): every parameter of the model that opt
 * does not update stops requiring gradients (their gradients stay as they
 * are through the next backward calls) until fg_trainer_untoggle_optimizer
 * restores what each required before (opt NULL: whichever is toggled; the
 * trainer also untoggles at the end of each training_step). Toggling again
 * untoggles first.
 * FG_EINVAL for an optimizer of none of fg_trainer_optimizer_at's. */
FG_API FG_MUST_USE fg_status fg_trainer_toggle_optimizer(fg_trainer *t, fg_optimizer *opt);
FG_API void fg_trainer_untoggle_optimizer(fg_trainer *t, fg_optimizer *opt);

/* ----------------------------------------------------------- properties */

FG_API fg_fabric *fg_trainer_fabric(const fg_trainer *t);
/* The model and optimizer of the running (or last) entry point; borrowed. */
FG_API fg_module *fg_trainer_model(const fg_trainer *t);
FG_API fg_optimizer *fg_trainer_optimizer(const fg_trainer *t);
/* Optimizer steps taken (Lightning's global_step). */
FG_API int64_t fg_trainer_global_step(const fg_trainer *t);
/* Epochs completed; during an epoch, its 0-based index. */
FG_API int64_t fg_trainer_current_epoch(const fg_trainer *t);
FG_API bool fg_trainer_is_global_zero(const fg_trainer *t);
FG_API int fg_trainer_global_rank(const fg_trainer *t);
FG_API int fg_trainer_world_size(const fg_trainer *t);
FG_API fg_trainer_fn fg_trainer_state_fn(const fg_trainer *t);
FG_API fg_stage fg_trainer_stage(const fg_trainer *t);
/* Batches an epoch (a validation run) has, limits applied; 0 outside;
 * -1 for a training stream of unknown length without a count limit
 * (Lightning's inf: the epoch ends where the stream does). */
FG_API int64_t fg_trainer_num_training_batches(const fg_trainer *t);
FG_API int64_t fg_trainer_num_val_batches(const fg_trainer *t);
/* Options as resolved (defaults filled in): max_epochs (-1 = none),
 * max_steps, accumulate_grad_batches, log_every_n_steps. */
FG_API int64_t fg_trainer_max_epochs(const fg_trainer *t);
FG_API int64_t fg_trainer_max_steps(const fg_trainer *t);
FG_API int64_t fg_trainer_accumulate_grad_batches(const fg_trainer *t);
FG_API int64_t fg_trainer_log_every_n_steps(const fg_trainer *t);
FG_API int64_t fg_trainer_fast_dev_run(const fg_trainer *t);
FG_API const char *fg_trainer_default_root_dir(const fg_trainer *t);
/* The first logger's run folder (<save_dir>/<name>/version_N), the same on
 * every rank once fit began; default_root_dir without a logger. */
FG_API const char *fg_trainer_log_dir(const fg_trainer *t);
/* Lightning's trainer.should_stop: set it (or a callback does) and fit
 * stops at the end of the batch, once min_epochs and min_steps are met. */
FG_API bool fg_trainer_should_stop(const fg_trainer *t);
FG_API void fg_trainer_set_should_stop(fg_trainer *t, bool stop);
/* The checkpoint the running entry point loaded ("" if none). */
FG_API const char *fg_trainer_ckpt_path(const fg_trainer *t);
/* Lightning's ckpt_path resolution, as the entry points do it, into out:
 * "last": the newest last*.safetensors in the folders of the trainer's
 * ModelCheckpoints (their dirpath, or the default one), its link followed
 * to the file it names; "" (FG_OK) when there is none (fit then starts from
 * scratch, as Lightning's). "best": the ModelCheckpoint's best_model_path,
 * or, when this process has none yet (a new process after the fit), the
 * one its newest "last" recorded; FG_EINVAL when neither names one. A path:
 * a sharded checkpoint's folder is itself, another folder its
 * last.safetensors, a link is followed; FG_EIO when nothing is there. NULL
 * or "": "". Not collective: it reads this process's callbacks and files
 * (the entry points use rank 0's answer); callable before any launch, so
 * that a program can refuse a missing checkpoint before ranks start. */
FG_API FG_MUST_USE fg_status fg_trainer_resolve_ckpt_path(fg_trainer *t, const char *ckpt_path,
                                                          char *out, size_t cap);
/* The file the trainer's latest checkpoint save wrote ("" if none yet). */
FG_API const char *fg_trainer_last_saved_path(const fg_trainer *t);
/* Lightning's trainer.interrupted: fit ended at an optimizer step boundary
 * because a rank asked for a stop (fg_fabric_request_stop, e.g. from a
 * SIGTERM handler). Every rank agrees after each optimizer step (one
 * allreduce of a flag under ddp); each ModelCheckpoint then saves that step
 * (and its "last"), and fit returns FG_OK without its on_train_end and
 * on_fit_end hooks (the loggers finalize "failed", as Lightning's). Run the
 * same fit with ckpt_path "last" to continue, bitwise. */
FG_API bool fg_trainer_interrupted(const fg_trainer *t);
/* Optimizer steps skipped under on_nonfinite FG_NONFINITE_SKIP in this fit;
 * *last_reason (may be NULL) gets the latest one's ("step 12: the loss is
 * not finite"), borrowed, "" if none. */
FG_API int64_t fg_trainer_skipped_steps(const fg_trainer *t, const char **last_reason);
/* The first ModelCheckpoint among the callbacks (Lightning's
 * trainer.checkpoint_callback), or NULL. Borrowed. */
FG_API fg_callback *fg_trainer_checkpoint_callback(const fg_trainer *t);

/* Lightning's trainer.save_checkpoint: weights, optimizer, the loop's
 * position, the callbacks' state_dict and the module's on_save_checkpoint
 * pairs, in one safetensors file written atomically by rank 0 (the fabric's
 * save). Collective; inside an entry point only (FG_ESTATE otherwise). */
FG_API FG_MUST_USE fg_status fg_trainer_save_checkpoint(fg_trainer *t, const char *path);

/* Parses Lightning's max_time string "DD:HH:MM:SS" (also "HH:MM:SS",
 * "MM:SS" or plain seconds) into seconds. FG_EINVAL naming the string. */
FG_API FG_MUST_USE fg_status fg_trainer_parse_duration(const char *s, double *seconds);

/* ------------------------------------------------------------ state dict */

/* Key/value strings a callback's state_dict or a module's
 * on_save_checkpoint adds to a checkpoint, and reads back when it is
 * loaded. Keys are the caller's own (a callback's are stored under
 * "callbacks.<its state key>." in the file, out of the way of others);
 * values are UTF-8. Numbers written with the f64/i64 setters read back
 * exactly. */
/* Sets key = value (both copied; setting a key again replaces it). Errors:
 * FG_EINVAL (NULL or empty key or value, or a key reserved for the trainer
 * and the fabric: "trainer.*", "callbacks.*" and fg_train_state's keys),
 * FG_ESTATE (a state dict being read), FG_ENOMEM. */
FG_API FG_MUST_USE fg_status fg_state_dict_set(fg_state_dict *sd, const char *key,
                                               const char *value);
FG_API FG_MUST_USE fg_status fg_state_dict_set_f64(fg_state_dict *sd, const char *key, double v);
FG_API FG_MUST_USE fg_status fg_state_dict_set_i64(fg_state_dict *sd, const char *key, int64_t v);
/* The value of key, or NULL. */
FG_API const char *fg_state_dict_get(const fg_state_dict *sd, const char *key);
/* The number at key in *out: true if present and a number. */
FG_API bool fg_state_dict_get_f64(const fg_state_dict *sd, const char *key, double *out);
FG_API bool fg_state_dict_get_i64(const fg_state_dict *sd, const char *key, int64_t *out);

/* ============================================================= callbacks */

/* A callback: Lightning's Callback as a table of hooks with user data. Each
 * hook runs on every rank; NULL hooks are skipped. Hooks returning fg_status
 * stop the loop with their error. */
typedef struct fg_callback_ops {
    /* Its state key: names its entries in checkpoints and must be unique
     * among the trainer's callbacks. NULL = "Callback". Copied. */
    const char *name;
    FG_MUST_USE fg_status (*setup)(void *ud, fg_trainer *t, fg_trainer_fn fn);
    void (*teardown)(void *ud, fg_trainer *t, fg_trainer_fn fn);
    fg_hook_fn on_fit_start, on_fit_end;
    fg_hook_fn on_sanity_check_start, on_sanity_check_end;
    fg_hook_fn on_train_start, on_train_end;
    fg_hook_fn on_train_epoch_start, on_train_epoch_end;
    fg_hook_fn on_validation_start, on_validation_end;
    fg_hook_fn on_validation_epoch_start, on_validation_epoch_end;
    fg_hook_fn on_test_start, on_test_end, on_test_epoch_start, on_test_epoch_end;
    fg_hook_fn on_predict_start, on_predict_end;
    fg_batch_hook_fn on_train_batch_start, on_train_batch_end;
    fg_batch_hook_fn on_validation_batch_end, on_test_batch_end, on_predict_batch_end;
    fg_hook_fn on_before_optimizer_step;
    /* Lightning's state_dict/load_state_dict: saved in every checkpoint,
     * restored when fit resumes from one that holds this state key. */
    FG_MUST_USE fg_status (*state_dict)(void *ud, fg_trainer *t, fg_state_dict *out);
    FG_MUST_USE fg_status (*load_state_dict)(void *ud, fg_trainer *t, const fg_state_dict *in);
    /* Releases ud at fg_callback_free (and when fg_callback_new fails). */
    void (*free)(void *ud);
} fg_callback_ops;

/* A callback over the user's table (copied); ud consumed (ops->free runs
 * once, at fg_callback_free or when this fails). NULL with FG_EINVAL (NULL
 * ops) or FG_ENOMEM. */
FG_API fg_callback *fg_callback_new(const fg_callback_ops *ops, void *ud);
/* Frees a callback, built in or the user's. NULL is a no-op. */
FG_API void fg_callback_free(fg_callback *cb);
/* Its state key ("ModelCheckpoint{monitor=val_loss,mode=min,...}" for the
 * built-in ones, as Lightning's). */
FG_API const char *fg_callback_state_key(const fg_callback *cb);

typedef enum fg_monitor_mode { FG_MONITOR_MIN = 0, FG_MONITOR_MAX } fg_monitor_mode;

/* ModelCheckpoint. Saves through fg_trainer_save_checkpoint (the fabric's
 * atomic save, rank 0 writes) into dirpath, names files by the filename
 * template + ".safetensors", and keeps exactly the save_top_k best by
 * `monitor` (deleting the rest, never the checkpoint fit resumed from),
 * plus "last.safetensors" when save_last. When it saves, as Lightning:
 * every every_n_train_steps optimizer steps (at the batch end), and every
 * every_n_epochs epochs at the end of the training epoch (when validation
 * runs once per epoch or not at all) or of validation (otherwise); never
 * twice at one global step, never at step 0, in a sanity check or under
 * fast_dev_run. Its state (best_k_models, best and last paths, scores) is
 * in every checkpoint and restored on resume when dirpath is the same. */
typedef struct fg_checkpoint_opts {
    /* NULL: <log_dir>/checkpoints, where log_dir is the first logger's run
     * folder, or <default_root_dir>/checkpoints without a logger. */
    const char *dirpath;
    /* NULL = "{epoch}-{step}". {name} or {name:fmt} take the monitor
     * candidates (the callback metrics, epoch and step) with Python's
     * format specs for numbers (".3f", "05d", ".4e"); a missing name is 0;
     * with auto_insert_metric_name (default) "{val_loss:.2f}" is written
     * "val_loss=0.42". Copied. */
    const char *filename;
    const char *monitor; /* NULL: no monitor, the newest is kept (save_top_k 1) or all (-1) */
    fg_monitor_mode mode;
    /* 0 = 1 (Lightning's default); -1 = all; k >= 1: the k best. Lightning's
     * save_top_k = 0 (only "last", if save_last) is no_top_k. Without a
     * monitor only -1 and 1 are allowed. */
    int64_t save_top_k;
    bool no_top_k;
    bool save_last;
    int64_t every_n_train_steps; /* 0 = not by steps */
    int64_t every_n_epochs;      /* 0 = 1 when every_n_train_steps is 0, else none (Lightning's) */
    fg_flag save_on_train_epoch_end; /* default: decided as above */
    bool no_auto_insert_metric_name; /* auto_insert_metric_name=False */
    /* Lightning's save_last="link": "last" is a symbolic link to the newest
     * file this callback saved (replaced atomically, fg_st_set_last; never
     * versioned); unlike Lightning's, never a full copy (none before the
     * first file). */
    bool save_last_link;
    /* fulgur's: also save when fit ends (max_steps or max_epochs reached,
     * or stopped) unless this step was saved already, so that the end of
     * every run can be resumed from: the top-k candidate, or (when top-k
     * keeps it not) a file by the same template all the same. A stop
     * request saves so whatever this says (fg_trainer_interrupted). */
    bool save_on_fit_end;
} fg_checkpoint_opts;

/* NULL opts = the defaults. NULL with FG_EINVAL naming the bad option
 * (negative counts, a template with an unclosed brace or unknown format,
 * save_top_k other than -1/1 without a monitor), or FG_ENOMEM. */
FG_API fg_callback *fg_model_checkpoint_new(const fg_checkpoint_opts *opts);
/* Lightning's best_model_path, best_model_score (NAN if none),
 * last_model_path, dirpath (resolved once fit began): borrowed strings, ""
 * if none. NULL or empty results for a callback of another kind. */
FG_API const char *fg_model_checkpoint_best_path(const fg_callback *cb);
FG_API double fg_model_checkpoint_best_score(const fg_callback *cb);
FG_API const char *fg_model_checkpoint_last_path(const fg_callback *cb);
FG_API const char *fg_model_checkpoint_dirpath(const fg_callback *cb);
/* best_k_models: up to cap (path, score) pairs, best first, into paths
 * (borrowed) and scores (either may be NULL); returns how many there are. */
FG_API int64_t fg_model_checkpoint_best_k(const fg_callback *cb, const char **paths, double *scores,
                                          int64_t cap);

/* EarlyStopping: after each validation (or training epoch, when validation
 * runs once per epoch at its end or not at all), stops the fit (should_stop,
 * any rank deciding stops all) when `monitor`: is not finite (check_finite);
 * reaches stopping_threshold; crosses divergence_threshold; or has not
 * improved by more than min_delta for `patience` checks in a row. A
 * monitor missing from the callback metrics is an error naming the ones
 * present (Lightning's strict=True). Skipped in sanity checks and under
 * fast_dev_run. Its state (wait count, best score, stopped epoch) is in
 * checkpoints and restored on resume. */
typedef struct fg_early_stopping_opts {
    const char *monitor; /* required; copied */
    double min_delta;    /* >= 0 */
    int64_t patience;    /* 0 = 3 (Lightning's patience=0 stops as 1 does) */
    fg_monitor_mode mode;
    fg_flag check_finite;               /* default on */
    const double *stopping_threshold;   /* NULL = none; the value is copied */
    const double *divergence_threshold; /* NULL = none */
    fg_flag check_on_train_epoch_end;   /* default: decided as above */
} fg_early_stopping_opts;

FG_API fg_callback *fg_early_stopping_new(const fg_early_stopping_opts *opts);
/* wait_count, stopped_epoch (0 if it never stopped), best_score. */
FG_API int64_t fg_early_stopping_wait_count(const fg_callback *cb);
FG_API int64_t fg_early_stopping_stopped_epoch(const fg_callback *cb);
FG_API double fg_early_stopping_best_score(const fg_callback *cb);

/* LearningRateMonitor: logs the optimizer's learning rate as
 * "lr-<optimizer name>" ("lr-AdamW") to the loggers: at the start of every
 * batch that begins an optimizer step when the logs are due (interval
 * step, or auto with a per-step schedule), else at the start of every
 * epoch. fit fails if the trainer has no logger (as Lightning). */
typedef enum fg_logging_interval {
    FG_LOGGING_AUTO = 0,
    FG_LOGGING_STEP,
    FG_LOGGING_EPOCH,
} fg_logging_interval;
typedef struct fg_lr_monitor_opts {
    fg_logging_interval logging_interval;
} fg_lr_monitor_opts;
FG_API fg_callback *fg_lr_monitor_new(const fg_lr_monitor_opts *opts);

/* Timer: stops the fit once `duration` seconds of training have passed
 * (checked after each batch, or each epoch with interval epoch), rank 0's
 * clock deciding for all; the trainer adds one for max_time. Its elapsed
 * times are in checkpoints, so a resumed run counts on from them. */
typedef struct fg_timer_opts {
    double duration; /* seconds; 0 = no limit (it only measures) */
    fg_logging_interval
        interval; /* 0 (auto) = FG_LOGGING_STEP, Lightning's default; FG_LOGGING_EPOCH */
} fg_timer_opts;
FG_API fg_callback *fg_timer_new(const fg_timer_opts *opts);
/* Seconds spent in the stage so far (train, validate, test, predict). */
FG_API double fg_timer_time_elapsed(const fg_callback *cb, fg_stage stage);
/* duration - time_elapsed(train), or INFINITY without a duration. */
FG_API double fg_timer_time_remaining(const fg_callback *cb);

/* The progress bar (Lightning's TQDMProgressBar), rank 0 only: on a
 * terminal (out given and a tty) one line redrawn in place ("Epoch 2: 40/100 [00:03<00:04,
 * 13.20it/s, v_num=0, train_loss=0.512]"), otherwise plain lines every
 * refresh_rate batches and at the end of each epoch and validation run.
 * Shows the metrics logged with prog_bar and the logger's version. */
typedef struct fg_progress_bar_opts {
    FILE *out;            /* borrowed; NULL = plain lines through the log hook at FG_LOG_INFO (the
                             library picks no stream of its own) */
    int64_t refresh_rate; /* 0 = every batch on a terminal, every log_every_n_steps otherwise */
    fg_flag redraw;       /* default: on when out is a terminal (isatty) */
    /* By optimizer step over the whole fit, as a command-line run reads:
     * "step 40/100  epoch 0  train_loss 0.5123  12.3k tok/s  ETA 0:04" every
     * refresh_rate steps (steps, not batches) and at the last one, or on a
     * terminal "epoch 0 [######..........] 40/100  train_loss 0.5123  12.3k
     * tok/s  0:03<0:04" redrawn; the total from max_steps and max_epochs,
     * counted from the step fit starts at (a resume's); after each
     * validation of the fit, and of a validate run after it, "step 40
     * val_loss 0.4981" (its progress-bar metrics); nothing for test and
     * predict. Values: 4 decimals, 3 significant digits below 0.01. */
    bool by_step;
    /* by_step's rate: NULL = optimizer steps per second ("it/s"); else the
     * unit of the batches' samples on every rank (rows of the input x world
     * size) times unit_per_sample (0 = 1): "tok" with a gpt's context length,
     * "samples". Copied; at most 31 characters. */
    const char *unit;
    int64_t unit_per_sample;
} fg_progress_bar_opts;
FG_API fg_callback *fg_progress_bar_new(const fg_progress_bar_opts *opts);
/* Writes one line (printf's format; a newline is added) to `to`, or to the
 * bar's stream (its log hook without one) when `to` is NULL, without
 * breaking the bar: a bar redrawn on a terminal is cleared first and drawn
 * again below (tqdm.write). cb may be NULL or of another kind: then the line
 * goes to `to` alone. Rank 0's business: it checks no rank. */
FG_API void fg_progress_bar_write(fg_callback *cb, FILE *to, const char *fmt, ...) FG_PRINTF(3, 4);

/* =============================================================== loggers */

/* A logger: a table of hooks the trainer calls on global rank 0 only. NULL
 * hooks are skipped. */
typedef struct fg_logger_ops {
    const char *name; /* for messages; NULL = "logger" */
    /* Lightning's log_hyperparams: the module's hparams, once per fit. */
    FG_MUST_USE fg_status (*log_hyperparams)(void *ud, const fg_kv *hparams, int64_t n);
    /* One row: n metrics (names and values borrowed for the call) at step. */
    FG_MUST_USE fg_status (*log_metrics)(void *ud, const fg_metric *m, int64_t n, int64_t step);
    /* After each log_metrics: write out what is buffered when due. */
    FG_MUST_USE fg_status (*save)(void *ud);
    /* At the end of fit/validate/test: "success" or "failed"; flush all. */
    FG_MUST_USE fg_status (*finalize)(void *ud, const char *status);
    /* The logger's run folder, given the trainer's default_root_dir (its
     * save_dir when it has none): where checkpoints go by default. Called on
     * rank 0; the trainer hands the string to the other ranks. NULL hook or
     * NULL return: none. */
    const char *(*log_dir)(void *ud, const char *default_root_dir);
    /* The version shown by the progress bar (v_num), or NULL. */
    const char *(*version)(void *ud);
    void (*free)(void *ud);
} fg_logger_ops;

/* A logger over the user's table (copied); ud consumed as fg_callback_new's.
 * NULL with FG_EINVAL or FG_ENOMEM. */
FG_API fg_logger *fg_logger_new(const fg_logger_ops *ops, void *ud);
FG_API void fg_logger_free(fg_logger *lg); /* NULL is a no-op */

/* CSVLogger: <save_dir>/<name>/<version>/metrics.csv and hparams.yaml, as
 * Lightning lays them out: one row per log_metrics call, the columns the
 * sorted union of every name logged (the file is rewritten when a new one
 * appears), "step" among them, empty cells for names a row lacks, numbers
 * as Python writes floats, rows ending in "\r\n" as Python's csv module
 * writes them; hparams.yaml holds the hyperparameters, sorted ("{}" when
 * none; values that read as numbers stay plain). Written by global rank 0
 * only; rows are flushed every flush_logs_every_n_steps steps and at the
 * end of each entry point; rows or hparams that cannot be written (a full
 * disk) are an FG_EIO naming the file, from the call that flushed them. The
 * run folder is made when it is chosen (at the first fit, validate or
 * test). */
typedef struct fg_csv_logger_opts {
    const char *save_dir; /* NULL = the trainer's default_root_dir */
    const char *name;     /* NULL = "lightning_logs"; "" = no such folder level */
    /* NULL = "version_N" for the next free N in <save_dir>/<name>; else the
     * folder name itself ("version_3", "run-a"). A metrics.csv already in
     * the folder is replaced, as Lightning's writer does. */
    const char *version;
    const char *prefix;               /* NULL = ""; else "prefix-" before every name */
    int64_t flush_logs_every_n_steps; /* 0 = 100 */
} fg_csv_logger_opts;

FG_API fg_logger *fg_csv_logger_new(const fg_csv_logger_opts *opts);

/* TensorBoardLogger: event files that `tensorboard --logdir <save_dir>`
 * shows, laid out as Lightning's: <save_dir>/<name>/<version>/
 * events.out.tfevents.<time>.<host>.<pid>.<n> and hparams.yaml. An event
 * file is TFRecords (length, masked CRC-32C of the length, data, masked
 * CRC-32C of the data) of TensorFlow Event protos: "brain.Event:2" first,
 * then one Event per logged value, a scalar (simple_value, a float) tagged
 * with its name at the row's step. With hparams, log_hyperparams writes
 * the hparams plugin's session start info (TensorBoard's HPARAMS tab;
 * values that read as numbers or true/false are typed so) and, unless
 * default_hp_metric is FG_OFF, the scalar "hp_metric" = -1 at step 0, as
 * Lightning's. Written by global rank 0 only; events are flushed every
 * max_queue events and at the end of each entry point. The run folder is
 * made when it is chosen (the first fit, validate or test), the event file
 * at the first event.
 *
 * Several loggers at once share one run folder: a CSV and a TensorBoard
 * logger under one save_dir and name, neither given a version, both write
 * the first one's version_N (one run, one folder); give them different
 * names or versions for folders of their own. A version_N folder is made
 * by one run only (two runs started together take two numbers). */
typedef struct fg_tensorboard_logger_opts {
    const char *name;          /* NULL = "lightning_logs"; "" = no such folder level */
    const char *version;       /* NULL = "version_N", the next free N; else the folder name */
    const char *prefix;        /* NULL = ""; else "prefix-" before every tag */
    fg_flag default_hp_metric; /* default on: "hp_metric" = -1 with the hparams */
    int64_t max_queue;         /* 0 = 10: events between flushes of the file */
} fg_tensorboard_logger_opts;

/* save_dir NULL = the trainer's default_root_dir (Lightning's save_dir is
 * required; "." is the usual one). Copied, as the options' strings. NULL
 * with FG_EINVAL naming the bad option (a version that is empty or holds a
 * '/', a negative max_queue) or FG_ENOMEM. */
FG_API fg_logger *fg_tensorboard_logger_new(const char *save_dir,
                                            const fg_tensorboard_logger_opts *opts);
/* The event file's path, once opened (the first event), else NULL (and for
 * a logger of another kind). */
FG_API const char *fg_tensorboard_logger_file(const fg_logger *lg);

/* The run folder of a built-in logger (CSV, TensorBoard), once resolved
 * (the first fit, rank 0), else NULL. */
FG_API const char *fg_logger_log_dir(const fg_logger *lg);

#ifdef __cplusplus
}
#endif
#endif
