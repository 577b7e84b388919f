/* Private state of the trainer layer, shared by its files:
 *   trainer.c      options, the object, properties, entry points, launching
 *   hooks.c        calling the module's and the callbacks' hooks in order
 *   results.c      fg_trainer_log, epoch reductions, the metric sets, loggers
 *   fit_loop.c     the fit loop: epochs, accumulation, steps, validation checks
 *   eval_loop.c    validation, sanity check, test and predict loops
 *   ckpt_state.c   checkpoints: the state dict, save, load, ckpt_path
 *   callback.c     the callback and logger objects
 *   model_checkpoint.c, early_stopping.c, lr_monitor.c, timer.c,
 *   progress_bar.c, csv_logger.c, tb_logger.c: the built-in callbacks and
 *   loggers (tb_record.c: the TFRecord framing of event files) */
#ifndef FULGUR_TRAINER_IMPL_H
#define FULGUR_TRAINER_IMPL_H

#include <pthread.h>

#include "core/core_impl.h"
#include "fulgur/trainer.h"

/* ------------------------------------------------------- callbacks, loggers */

/* The built-in kinds: the trainer finds its checkpoint callback, orders
 * the monitoring ones last, and the accessors check the kind. */
typedef enum fg__cb_kind {
    FG__CB_USER = 0,
    FG__CB_CHECKPOINT,
    FG__CB_EARLY_STOPPING,
    FG__CB_LR_MONITOR,
    FG__CB_TIMER,
    FG__CB_PROGRESS,
} fg__cb_kind;

struct fg_callback {
    fg_callback_ops ops;
    void *ud;
    fg__cb_kind kind;
    char *state_key;
};

/* A built-in callback: ops filled by its file, ud its own state. */
fg_callback *fg__callback_make(const fg_callback_ops *ops, void *ud, fg__cb_kind kind,
                               const char *state_key);

struct fg_logger {
    fg_logger_ops ops;
    void *ud;
    /* the built-in loggers' resolved run folder (fg_logger_log_dir), else NULL */
    const char *(*dir_of)(const void *ud);
    /* the built-in loggers' run folder, for the trainer to share one version */
    struct fg__run_folder *folder;
};

/* ------------------------------------------------------------- state dicts */

struct fg_state_dict {
    bool readonly;
    const char *prefix; /* keys are stored as prefix + key */
    /* writing: owned copies */
    fg_kv *kv;
    int64_t n, cap;
    /* reading: the loaded metadata (borrowed) */
    const fg_kv *src;
    int64_t nsrc;
};

FG_MUST_USE fg_status fg__sd_put(fg_state_dict *sd, const char *key,
                                 const char *value); /* no checks */
void fg__sd_free(fg_state_dict *sd);

/* ------------------------------------------------------------------ results */

/* Where a value was logged from, for Lightning's defaults and rules. */
typedef enum fg__fx_kind {
    FG__FX_NONE = 0,    /* logging not allowed here */
    FG__FX_TRAIN_STEP,  /* training_step, train batch hooks, on_before_optimizer_step */
    FG__FX_TRAIN_EPOCH, /* on_train_start, on_train_epoch_start/end */
    FG__FX_EVAL_STEP,   /* validation/test steps and batch hooks */
    FG__FX_EVAL_EPOCH,  /* on_validation/test_start, _epoch_start/_end */
} fg__fx_kind;

typedef struct fg__result {
    char *name;
    const char *hook; /* a static string: results are keyed by (hook, name) */
    bool on_step, on_epoch, prog_bar, logger, sync, rank_zero_only;
    fg_reduce_fx reduce;
    /* this batch */
    bool step_set;
    int step_n;
    double step_last, step_acc, step_w, step_value;
    /* this epoch: acc is sum(v * bs) for mean, else the running reduction */
    bool epoch_set, dirty;
    double acc, w, computed;
    /* fg_trainer_log_metric: the metric whose compute is the epoch value
     * (reset after it); borrowed, NULL for a plain value */
    fg_tmetric *metric;
} fg__result;

typedef struct fg__results {
    fg__result *r;
    int64_t n, cap;
} fg__results;

/* A metric set: name -> value, in insertion order. */
typedef struct fg__metric_map {
    fg_metric *m;
    int64_t n, cap;
} fg__metric_map;

/* ------------------------------------------------------------------ trainer */

struct fg_trainer {
    fg_trainer_opts o; /* as given; the arrays point at cbs/loggers below */
    /* resolved options */
    int64_t max_epochs, min_epochs, max_steps, min_steps, accumulate, log_every, check_val_every;
    int64_t fast_dev_run;
    fg_batches val_check_interval, num_sanity, limit_train, limit_val, limit_test, limit_predict;
    double clip_val;
    char *root_dir;
    fg_fabric *f;
    bool own_fabric;
    /* callbacks in call order (the user's, then the trainer's own;
     * checkpoint callbacks last), and the trainer's own to free */
    fg_callback **cbs;
    int ncbs;
    fg_callback *own_cbs[4];
    int nown;
    fg_logger **loggers;
    int nloggers;
    fg_logger *own_logger;
    char *log_dir;

    /* during an entry point */
    fg_lightning_module m;
    fg_module *model;
    fg_optimizer *opt;
    /* evaluation's stand-in for the kinds that need an optimizer at setup
     * (they cut or wrap one): a stateless SGD that never steps */
    fg_optimizer *eval_opt;
    fg_optimizer_config oc;
    /* every optimizer (opts[0] == opt) and, under manual optimization, the
     * schedulers the trainer keeps but does not step */
    fg_optimizer *opts[FG_FABRIC_MAX_OPTIMIZERS];
    int nopts;
    fg_lr_scheduler *scheds[FG_FABRIC_MAX_OPTIMIZERS];
    int nscheds;
    bool manual;         /* automatic_optimization FG_OFF */
    bool in_manual_step; /* inside training_step under manual optimization */
    fg_optimizer *toggled;
    bool *toggle_saved; /* the requires_grad of each model parameter before the toggle */
    fg_lr_schedule sched;
    char sched_monitor[256]; /* oc.monitor points here */
    fg_trainer_fn fn;
    fg_stage stage;
    bool in_run; /* inside the per-rank body of an entry point */
    bool dp;     /* the strategy splits batches over replicas on threads (dp, ddp2): their step
                    values are combined, and synced over ranks, at the batch end */
    fg_dataloader *train, *val;
    /* the evaluation loaders of the running loop (fit's validation: val
     * first; validate/test/predict: theirs), their batch counts, and the
     * one being run (Lightning's dataloader_idx) */
    fg_dataloader *evals[FG_MAX_EVAL_LOADERS];
    int nevals, dl_idx;
    int64_t eval_batches[FG_MAX_EVAL_LOADERS];
    int64_t global_step, current_epoch, batch_idx, total_batch_idx, batches_that_stepped;
    int64_t epochs_processed;
    int64_t num_training_batches, num_val_batches, val_check_batch;
    /* the training loader's length is unknown (a stream without len): the
     * ranks agree before each batch whether all still have one, and the
     * epoch ends (stream_ended) at the first that has none */
    bool train_len_unknown, stream_ended;
    bool enable_validation, should_stop;
    int64_t eval_step_counter; /* eval batches logged so far, for their step rows */
    /* exact resume: the state at the start of the current accumulation
     * window, written instead of the live one while a window is open */
    bool mid_window, in_epoch_end;
    int64_t snap_batch_idx, snap_total_batch_idx, snap_batches_that_stepped;
    int64_t snap_samples; /* the loader's sample position at the window's start */
    fg__results snap_res;
    int64_t val_done_at; /* total_batch_idx whose validation has run, -1 */
    /* a batch whose validation check (Lightning's on_advance_end) has not
     * run yet, and whether it stepped */
    bool pending_advance, pending_stepped;
    int64_t val_runs; /* validation runs of this fit (sanity checks not counted) */
    /* resuming */
    bool resumed, resumed_mid_epoch;
    char ckpt_path[4096];
    /* the file the latest save wrote; a stop request agreed on; on_nonfinite */
    char last_saved[4096];
    char last_finite[4096]; /* the newest checkpoint of this fit whose weights were all finite */
    bool interrupted;
    bool window_nonfinite; /* a batch of the open window had a non-finite loss here */
    int64_t skipped, skipped_in_row;
    char skip_reason[512];

    /* logging */
    pthread_mutex_t log_mu;
    fg__fx_kind fx;
    const char *hook;
    fg__results train_res, eval_res;
    fg__metric_map callback_m, logged_m, pbar_m;

    fg_status run_status; /* the per-rank body's status, for the caller */
};

/* Per-thread: the size of the batch (or dp part) being stepped, for
 * fg_trainer_log's default batch_size. */
extern _Thread_local int64_t fg__cur_batch_size;

/* hooks.c: the static name of a hook a value may be logged from, or NULL */
const char *fg__intern_hook(const char *name);

/* trainer.c */
FG_MUST_USE fg_status fg__trainer_resolve_root(fg_trainer *t);
int64_t fg__limit_batches(fg_batches lim, int64_t len, const char *what, fg_status *st);
/* The batches a loop takes from dl: fg__limit_batches of its length; for a
 * loader over a stream (whose ranks may get one batch more or fewer) the
 * smallest over the ranks (collective then). For a stream of unknown
 * length: a count limit, else FG__LEN_UNKNOWN (the epoch ends where the
 * stream does); a fraction other than 1 is refused. */
FG_MUST_USE fg_status fg__loader_batches(fg_trainer *t, const fg_dataloader *dl, fg_batches lim,
                                         const char *what, int64_t *out);
#define FG__LEN_UNKNOWN INT64_MAX
/* eval_loop.c: fg__loader_batches of evaluation loader d, which must have
 * a known length */
FG_MUST_USE fg_status fg__eval_loader_batches(fg_trainer *t, int d, fg_batches lim,
                                              const char *what, int64_t *out);

/* hooks.c: calls hook `h` of every callback (monitoring: 0 = all, 1 = the
 * non-monitoring ones, 2 = the monitoring ones), then of the module */
typedef enum fg__hook {
    FG__H_FIT_START,
    FG__H_FIT_END,
    FG__H_SANITY_START,
    FG__H_SANITY_END,
    FG__H_TRAIN_START,
    FG__H_TRAIN_END,
    FG__H_TRAIN_EPOCH_START,
    FG__H_TRAIN_EPOCH_END,
    FG__H_VAL_START,
    FG__H_VAL_END,
    FG__H_VAL_EPOCH_START,
    FG__H_VAL_EPOCH_END,
    FG__H_TEST_START,
    FG__H_TEST_END,
    FG__H_TEST_EPOCH_START,
    FG__H_TEST_EPOCH_END,
    FG__H_PREDICT_START,
    FG__H_PREDICT_END,
    FG__H_BEFORE_OPT_STEP,
    FG__H_COUNT
} fg__hook;
typedef enum fg__batch_hook {
    FG__B_TRAIN_START,
    FG__B_TRAIN_END,
    FG__B_VAL_END,
    FG__B_TEST_END,
    FG__B_PREDICT_END,
} fg__batch_hook;
FG_MUST_USE fg_status fg__callbacks_hook(fg_trainer *t, fg__hook h, int monitoring);
FG_MUST_USE fg_status fg__module_hook(fg_trainer *t, fg__hook h);
FG_MUST_USE fg_status fg__hook_all(fg_trainer *t, fg__hook h); /* callbacks then module */
FG_MUST_USE fg_status fg__batch_hook_all(fg_trainer *t, fg__batch_hook h, fg_batch *b, int64_t idx);
/* Sets the logging context; returns the previous one for fg__fx_restore. */
typedef struct fg__fx_save {
    fg__fx_kind fx;
    const char *hook;
} fg__fx_save;
fg__fx_save fg__fx_set(fg_trainer *t, fg__fx_kind fx, const char *hook);
void fg__fx_restore(fg_trainer *t, fg__fx_save s);
bool fg__is_monitoring(const fg_callback *cb);

/* results.c */
void fg__results_free(fg__results *r);
void fg__results_reset(fg__results *r);
FG_MUST_USE fg_status fg__results_copy(fg__results *dst, const fg__results *src);
void fg__results_batch_start(fg__results *r);
/* After a batch: the step values into the metric sets; `row` gets the
 * logger values (rank 0 sends them when due). */
FG_MUST_USE fg_status fg__results_batch_end(fg_trainer *t, fg__results *r, fg__metric_map *row);
/* The epoch values of what was logged since the last call (collective for
 * sync_dist), into the metric sets and `row` (may be NULL). */
FG_MUST_USE fg_status fg__results_epoch_compute(fg_trainer *t, fg__results *r, fg__metric_map *row);
void fg__map_free(fg__metric_map *m);
void fg__map_clear(fg__metric_map *m);
FG_MUST_USE fg_status fg__map_set(fg__metric_map *m, const char *name, double v);
const fg_metric *fg__map_get(const fg__metric_map *m, const char *name);
void fg__metrics_reset(fg_trainer *t);
/* Sends `row` (plus "epoch" when add_epoch) to every logger at step, then
 * save (rank 0 only; nothing without loggers or with fast_dev_run). */
FG_MUST_USE fg_status fg__loggers_log(fg_trainer *t, fg__metric_map *row, int64_t step,
                                      bool add_epoch);
FG_MUST_USE fg_status fg__loggers_hparams(fg_trainer *t);
FG_MUST_USE fg_status fg__loggers_finalize(fg_trainer *t, const char *status);
bool fg__should_update_logs(const fg_trainer *t);
/* Serialise/restore a result set for checkpoints (exact: hex floats). */
char *fg__results_encode(const fg__results *r);
FG_MUST_USE fg_status fg__results_decode(fg__results *r, const char *s);

/* fit_loop.c, eval_loop.c */
FG_MUST_USE fg_status fg__fit_body(fg_trainer *t);
FG_MUST_USE fg_status fg__eval_body(fg_trainer *t, fg_trainer_fn fn); /* over t->evals */
/* One validation run inside fit (or the sanity check when sanity). */
FG_MUST_USE fg_status fg__validation_run(fg_trainer *t, bool sanity);

/* ckpt_state.c */
FG_MUST_USE fg_status fg__save_checkpoint(fg_trainer *t, const char *path);
/* Resolves "last"/"best"/a path into t->ckpt_path ("" when "last" finds
 * none); FG_EINVAL when "best" has no best. */
FG_MUST_USE fg_status fg__resolve_ckpt_path(fg_trainer *t, const char *ckpt_path);
/* Loads t->ckpt_path: weights (and, for fit, the optimizer, counters and
 * the callbacks' and module's state). */
FG_MUST_USE fg_status fg__load_checkpoint(fg_trainer *t, bool full);

/* model_checkpoint.c: the checkpoint folder, resolved at fit start
 * (collective); the file a removal must spare */
FG_MUST_USE fg_status fg__checkpoint_resolve_dir(fg_callback *cb, fg_trainer *t);
FG_MUST_USE fg_status fg__checkpoint_find_last(const fg_callback *cb, char *out, size_t cap,
                                               double *mtime);
/* A save at the end of fit (save_on_fit_end) or at a stop (forced): this
 * step's top-k candidate and "last", unless this step was saved. */
FG_MUST_USE fg_status fg__checkpoint_save_now(fg_callback *cb, fg_trainer *t, bool forced);

/* run_folder.c: a logger's run folder <save_dir>/<name>/<version>, shared
 * by the CSV and TensorBoard loggers. init validates the version (errors
 * prefixed with who) and copies the strings; dir makes the folder on first
 * call (version NULL = the next free version_N; vnum then holds its number)
 * and returns it, or NULL; key is a metric's name with the prefix
 * ("prefix-name"), owned by the caller; the hyperparameters are merged (a
 * key given again replaces its value) and written as hparams.yaml in the
 * folder (nothing when no folder was made). */
typedef struct fg__run_folder {
    const char *who;
    char *save_dir, *name, *version, *prefix; /* as given */
    char *log_dir, *vnum;                     /* once made */
    fg_kv *hp;                                /* owned copies */
    int64_t nhp;
} fg__run_folder;
FG_MUST_USE fg_status fg__run_folder_init(fg__run_folder *f, const char *who, const char *save_dir,
                                          const char *name, const char *version,
                                          const char *prefix);
const char *fg__run_folder_dir(fg__run_folder *f, const char *default_root_dir);
char *fg__run_folder_key(const fg__run_folder *f, const char *metric);
FG_MUST_USE fg_status fg__run_folder_add_hparams(fg__run_folder *f, const fg_kv *hp, int64_t n);
FG_MUST_USE fg_status fg__run_folder_write_hparams(fg__run_folder *f);
void fg__run_folder_free(fg__run_folder *f);

/* tb_record.c: TFRecord framing. The CRC-32C (Castagnoli) of n bytes and
 * its masked form as TFRecord stores it; one record (length, masked CRC of
 * the length, data, masked CRC of the data, little-endian) appended to fp. */
uint32_t fg__crc32c(const void *data, size_t n);
uint32_t fg__crc32c_masked(const void *data, size_t n);
FG_MUST_USE fg_status fg__tfrecord_write(FILE *fp, const void *data, size_t n);

/* lr_monitor.c uses the loggers directly */
const char *fg__logger_version(const fg_trainer *t);

/* small helpers (trainer.c) */
FG_MUST_USE fg_status fg__mkdirs(const char *path);
/* Python's repr of a float: the shortest string that reads back exactly,
 * with ".0" on integral values ("100.0", "0.1", "1e-05", "nan", "inf"). */
void fg__fmt_float(char *buf, size_t cap, double v);
bool fg__is_sorted_monitor(const fg_callback *cb);
/* The callback metrics' names, ", "-separated, cut to fit buf: for the
 * errors that name a monitor nobody logged. */
void fg__callback_metric_names(const fg_trainer *t, char *buf, size_t cap);

/* The lr_scheduler_config's scheduler (lr_sched_step.c): the checks of
 * configure_optimizers' answer; the steps after an optimizer step
 * (non-plateau; last = the epoch's last batch), after the validation of a
 * batch (plateau, interval step) and at the epoch's end (plateau, interval
 * epoch); its state in the trainer's checkpoints. */
FG_MUST_USE fg_status fg__check_scheduler(const fg_optimizer_config *oc);
FG_MUST_USE fg_status fg__sched_after_step(fg_trainer *t, bool last);
FG_MUST_USE fg_status fg__sched_after_val(fg_trainer *t, bool stepped);
/* an epoch-interval scheduler's step at the end of a stream of unknown length */
FG_MUST_USE fg_status fg__sched_after_stream_end(fg_trainer *t);
FG_MUST_USE fg_status fg__sched_epoch_end(fg_trainer *t);
FG_MUST_USE fg_status fg__sched_save(fg_trainer *t, fg_state_dict *sd);
FG_MUST_USE fg_status fg__sched_load(fg_trainer *t, const fg_state_dict *sd);
/* manual.c: frees the optimizers and schedulers of the last fit (t->opts,
 * t->scheds, t->opt, t->oc.scheduler); the checks and the keeping of
 * configure_optimizers' answer (consumed, also on failure); whether a
 * checkpoint can hold the optimizers (FG_EUNSUPPORTED naming why). */
void fg__free_optimizers(fg_trainer *t);
void fg__free_config(fg_optimizer_config *oc);
FG_MUST_USE fg_status fg__take_optimizers(fg_trainer *t, fg_module *model, fg_optimizer_config *oc);
FG_MUST_USE fg_status fg__ckpt_optimizers_ok(const fg_trainer *t);
/* fit_loop.c: every weight of this rank's model is finite (true when a
 * strategy shards the parameters: not known from one rank). Not collective. */
bool fg__weights_finite(fg_trainer *t);

#endif
