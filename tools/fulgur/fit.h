/* fulgur fit, validate, test, predict: the pieces of the commands, one file each.
 *   fit_args.c      the flag table (Lightning's Trainer names), defaults, checks made
 *                   before any rank starts
 *   fit_data.c      datasets from --data / --val-data / --labels
 *   fit_model.c     the model and optimizer from the options, the lr schedule,
 *                   the model config stored in checkpoints (read back by `sample`)
 *   fit_module.c    the built-in models and data as a user module of the Trainer
 *                   (fg_lightning_module): steps, loaders, checkpoint metadata
 *   fit_notes.c     rank 0's notes beside the progress display (what is resumed,
 *                   the model and plan, skipped steps), a Trainer callback
 *   fit_trainer.c   the Trainer's options and callbacks from the flags, and what
 *                   each rank runs: fit (then a last validation), validate, test,
 *                   predict (fg_trainer_launch)
 *   fit_config.c    --config run.yaml (LightningCLI's sections) and --print-config
 *   cmd_fit.c       the commands: parse, check, fg_fabric_new, the trainer, launch */
#ifndef FULGUR_FIT_H
#define FULGUR_FIT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "cli.h"

/* passes a failure up (FG_TRY is the library's private twin) */
#define TRY(expr)                                                                                  \
    do {                                                                                           \
        fg_status s_ = (expr);                                                                     \
        if (s_ != FG_OK) return s_;                                                                \
    } while (0)

typedef enum fit_model_kind { FIT_GPT, FIT_MLP } fit_model_kind;
/* The network of a kind: gpt and mlp themselves, or resnet (an image
 * classifier on the mlp's .npy data), vit (likewise) and lstm (a language
 * model on gpt's text data). */
typedef enum fit_arch { FIT_ARCH_BASE = 0, FIT_ARCH_RESNET, FIT_ARCH_LSTM, FIT_ARCH_VIT } fit_arch;

/* Every option of `fulgur fit`, as parsed (see fit_args.c for defaults). */
/* The Hivemind flags as given (fit_hivemind.c). */
typedef struct fit_hivemind {
    int64_t target_batch_size, dht_port, min_peers;
    const char *initial_peers, *run_id, *run_secret, *run_secret_file, *grad_compression, *host;
    double matchmaking_time, averaging_timeout;
    bool offload_optimizer, delay_optimizer_step, delay_grad_averaging, delay_state_averaging;
    bool reuse_grad_buffers;
    char secret_buf[512];
} fit_hivemind;

typedef struct fit_opts {
    /* model and data */
    const char *model; /* "gpt", "mlp", "resnet", "vit" or "lstm" */
    fit_model_kind kind;
    const char *data, *val_data, *labels, *val_labels;
    /* the reader (auto: by the file's name) and a CSV/TSV's columns */
    const char *reader, *label_column, *feature_columns;
    bool no_header; /* csv: the first row is data (columns "0", "1", ...) */
    /* --reader imagefolder: Resize(n) + CenterCrop(n) (0: images of one size as
     * they are) and RandomHorizontalFlip on the training images */
    int64_t image_size;
    bool random_flip;
    double val_fraction;
    /* gpt shape */
    int64_t layers, heads, embd, ctx;
    double dropout;
    /* mlp shape */
    int64_t hidden;
    /* resnet shape (and lstm's: --layers, --embd, --hidden) */
    fit_arch arch;
    int64_t depth, width, in_channels, patch_size;
    const char *resnet_layout; /* "cifar" or "imagenet" */
    bool sync_batchnorm;       /* Lightning's sync_batchnorm=True */
    /* --model sequential: the layers, "Conv2d(in_channels=1, ...); ReLU(); ..." (fit_net.h) */
    const char *net;
    /* devices and strategy (Lightning's names) */
    const char *accelerator, *devices, *strategy, *precision;
    int64_t num_nodes;
    /* the sharded strategies (Lightning's DeepSpeedStrategy / FSDPStrategy) */
    const char *sharding_strategy; /* fsdp: as given; parsed into `sharded` */
    const char *wrap_policy;       /* stage 3: --auto-wrap-policy, the units' module type */
    int64_t reduce_bucket_size, allgather_bucket_size;
    const char *state_dict_type;  /* "full" or "sharded": parsed into `sharded` */
    const char *deepspeed_config; /* a DeepSpeed JSON file (the fabric reads it) */
    fg_deepspeed_train ds;        /* its optimizer and scheduler sections (zeros: none) */
    const char *offload_optimizer, *offload_params, *nvme_path; /* parsed into `sharded` */
    bool activation_checkpointing;
    bool partition_activations, cpu_checkpointing; /* deepspeed: into `sharded` */
    int64_t min_num_params, hybrid_shard_size;     /* stage 3: auto-wrap policy; HYBRID_SHARD */
    fg_sharded_opts sharded;
    /* ddp's communication hooks (Lightning's DDPStrategy ddp_comm_hook) */
    const char *comm_hook, *comm_wrapper; /* as given; parsed into `ddp` */
    int64_t powersgd_rank, start_powersgd_iter, start_localsgd_iter, localsgd_period;
    fg_ddp_opts ddp;
    /* strategy bagua (Lightning's BaguaStrategy): parsed into ddp.bagua by fit_bagua.c */
    const char *bagua_algorithm, *hierarchical, *peer_selection_mode;
    int64_t communication_interval, bagua_warmup_steps, sync_interval_ms;
    /* strategy hivemind: parsed into ddp.hivemind by fit_hivemind.c */
    fit_hivemind hivemind;
    /* loop (Lightning's Trainer arguments) */
    int64_t max_epochs, max_steps, min_epochs, min_steps, batch_size, accumulate, num_workers;
    const char *max_time_s; /* "DD:HH:MM:SS", parsed into max_time (seconds; 0 = none) */
    double max_time;
    int64_t fast_dev_run;
    const char *clip_algorithm; /* "norm" or "value" */
    bool detect_anomaly;
    double clip, lr, min_lr_ratio, weight_decay, momentum;
    int64_t warmup_steps, lr_decay_steps;
    const char *optimizer;           /* adamw, adam, sgd, rmsprop, adagrad, lion */
    double beta1, beta2, eps, alpha; /* 0: the optimizer's default (adamw's beta2: 0.99) */
    bool nesterov, amsgrad, centered, no_decay_norm_bias;
    /* --lr-scheduler: warmup-cosine (the default: warm-up + cosine, a pure
     * function of the step), constant, or a PyTorch scheduler by its class
     * name in lower case (steplr, ...) with Lightning's interval/monitor */
    const char *lr_scheduler, *lr_interval, *lr_monitor, *lr_mode, *milestones_s, *threshold_mode;
    int64_t step_size, t_max, total_iters, patience, t_0, t_mult, lr_frequency, cooldown;
    double gamma, eta_min, start_factor, factor, max_lr, pct_start, threshold, min_lr;
    int64_t milestones[64]; /* --milestones, parsed */
    int nmilestones;
    /* --lr-schedulers: sequentiallr's and chainedscheduler's schedulers, each
     * a copy of these options with its own scheduler arguments */
    const char *lr_schedulers_s;
    struct fit_opts *lr_subs;
    int nlr_subs;
    int64_t seed;
    /* as given ("250" batches, "0.25" of an epoch; "0": only at the end), parsed */
    const char *val_check_interval_s, *limit_train_s, *limit_val_s, *limit_test_s, *limit_predict_s;
    fg_batches val_check_interval, limit_train, limit_val, limit_test, limit_predict;
    bool val_end_only;               /* --val-check-interval 0 */
    int64_t check_val_every_n_epoch; /* 0: -1 (count across epochs) for a count, else 1 */
    int64_t num_sanity_val_steps;
    /* ModelCheckpoint and EarlyStopping */
    const char *monitor, *mode; /* mode "min" or "max" */
    bool save_last, enable_checkpointing, enable_progress_bar;
    int64_t early_stopping_patience; /* 0: no EarlyStopping */
    double early_stopping_min_delta;
    const char *logger; /* "none", or a list of csv, tensorboard */
    /* the loggers' save_dir, name and version (NULL: Lightning's defaults) */
    const char *logger_save_dir, *logger_name, *logger_version;
    const char *log_lr; /* LearningRateMonitor's logging_interval, or "none" */
    /* validate, test, predict */
    const char *test_data, *test_labels, *predict_data, *predictions;
    int64_t ckpt_step; /* the optimizer step the checkpoint was saved at */
    /* outputs */
    const char *root_dir, *ckpt_dir, *resume;
    int64_t ckpt_every, log_every, sample_tokens;
    bool ckpt_every_given;    /* --every-n-train-steps given, other than its default */
    bool model_given;         /* --model given (validate/test/predict: checked against the ckpt) */
    int64_t save_top_k;       /* the best N by --monitor, or without one the newest N; -1: all */
    const char *on_nonfinite; /* "stop" or "skip" */
    bool deterministic;       /* Lightning's `deterministic` (fabric.h) */
    bool no_requeue;          /* SLURMEnvironment(auto_requeue=False): SIGUSR1 saves and stops */
    bool on_nonfinite_skip;
    int64_t restart_count; /* FULGUR_RESTART_COUNT, TORCHELASTIC_RESTART_COUNT or
                              SLURM_RESTART_COUNT: > 0 in a restarted job */
    const char *progress;  /* "auto", "bar", "lines", "none" */
    /* --config files (read by fit_config.c before the flags) and --print-config */
    const char *config;
    bool print_config;
    /* which command: fit, validate, test or predict */
    fg_trainer_fn fn;
    /* derived */
    char ckpt_dir_buf[4096];
    char resume_path[4096]; /* resolved checkpoint to resume from, "" = none */
} fit_opts;

/* Parses argv into o (after the --config files' settings, so that flags
 * win) and checks everything that can be checked before any rank starts
 * (values, files). Returns 0, -1 after --help or --print-config (exit 0),
 * or FG_EXIT_USAGE after printing the error. */
int fit_args_parse(fit_opts *o, fg_trainer_fn fn, int argc, char **argv);

/* The Bagua flags (fit_bagua.c): parsed into o->ddp.bagua, and refused
 * without --strategy bagua or with an algorithm they do not belong to.
 * Returns 0 or FG_EXIT_USAGE after printing why. */
struct cli_flag;
int fit_bagua_args(fit_opts *o, struct cli_flag *flags, int n);
/* The Hivemind flags (fit_hivemind.c; their rows are in fit_args.c's
 * table): their parsing into o->ddp.hivemind, refused without --strategy
 * hivemind. Returns 0 or FG_EXIT_USAGE after printing. */
int fit_hivemind_args(fit_opts *o, struct cli_flag *flags, int n);
/* The strategy kind the run will have ("auto" resolved by the launch plan,
 * as fg_fabric_new resolves it); false when the plan fails. */
bool plan_kind(const fit_opts *o, fg_strategy_kind *kind);
/* Appends to buf what decides the run's numbers beyond the plan: the comm
 * backend, the Bagua algorithm, the comm hook and wrapper, the sharding
 * strategy, the offload, --deterministic with its micro-batch; each item
 * as ", item" (nothing when none applies). */
void fit_plan_details(const fit_opts *o, const fg_launch_plan *p, char *buf, size_t cap);

/* The checkpoint folder exists (made if need be) and takes a file: found
 * before training, not at the first save after the steps are spent. Called
 * once every flag is known good, so that a usage error leaves no folder.
 * Returns 0, or FG_EXIT_USAGE after printing the folder and the reason. */
int fit_check_ckpt_dir(const fit_opts *o);

/* The datasets of a run. train and val are views of base (or val of
 * val_base); text_vocab is borrowed from the text dataset (NULL otherwise). */
typedef struct fit_data {
    fg_dataset *base, *val_base, *train, *val;
    const fg_text_vocab *text_vocab;
    int64_t vocab;   /* gpt: token ids are in [0, vocab) */
    int64_t in_dim;  /* mlp: inputs per sample */
    int64_t classes; /* mlp: max label + 1 over train and val */
} fit_data;

/* Whether the mlp reads `path` as CSV/TSV (--reader csv, or auto and a name
 * ending in .csv, .tsv, .csv.gz or .tsv.gz). */
bool fit_is_csv(const fit_opts *o, const char *path);
/* --reader imagefolder */
bool fit_is_images(const fit_opts *o);
/* The mlp's dataset over `path`: a CSV/TSV with its --label-column and
 * --feature-columns, or a .npy with `labels`; NULL with fg_last_error
 * (a float label column is FG_EINVAL: class ids are integers). */
fg_dataset *fit_mlp_dataset(const fit_opts *o, const char *path, const char *labels);

/* Opens the datasets of o. Returns FG_OK, or a status with fg_last_error
 * naming the file and the problem. */
FG_MUST_USE fg_status fit_data_open(const fit_opts *o, fit_data *d);
void fit_data_free(fit_data *d);

/* Rank 0's notes beside the progress display, as a Trainer callback (every
 * rank runs it; rank 0 prints), written through the progress bar `bar`
 * (borrowed; NULL: none) so that they do not break it. NULL with
 * fg_last_error on failure; free with fg_callback_free. */
typedef struct fit_module fit_module;
fg_callback *fit_notes_new(const fit_opts *o, fit_module *m, fg_callback *bar);

/* The built-in model and data as a Trainer module. fit_module_new opens
 * nothing: fit_module_open (on each rank, inside the launch) opens the data
 * and builds the loaders, the module's configure_model the model (under
 * empty init where the Trainer's setup shards it); fit_module_free frees
 * all. */
fit_module *fit_module_new(const fit_opts *o);
/* *what: the part that failed ("data" or "model"), for the message's label. */
FG_MUST_USE fg_status fit_module_open(fit_module *m, fg_trainer *t, const char **what);
void fit_module_free(fit_module *m);
fg_lightning_module fit_module_table(fit_module *m);
/* What the module knows, for the callbacks and the end of the run. */
const fit_data *fit_module_data(const fit_module *m);
fg_module *fit_module_model(const fit_module *m);
/* configure_model could not build the model (its error is a model error). */
bool fit_module_model_failed(const fit_module *m);
fg_dataloader *fit_module_loader(const fit_module *m, fg_trainer_fn fn);
bool fit_module_is_gpt(const fit_module *m);
int64_t fit_module_ctx(const fit_module *m);
/* The global step at which validation last ran in fit (-1: none) and its
 * loss (NAN without validation data). */
int64_t fit_module_last_val(const fit_module *m, double *loss);
/* The seed the resumed checkpoint was trained with (0: not resumed). */
uint64_t fit_module_ckpt_seed(const fit_module *m);
/* The resumed checkpoint's world size, global batch and sample position in
 * its epoch (-1 each when it has none). */
void fit_module_ckpt_batch(const fit_module *m, int64_t *world, int64_t *global_batch,
                           int64_t *samples);
/* Rank 0, gpt on text: a sample after the run. */
void fit_module_sample(fit_module *m);
/* predict: the predictions of this rank, written by rank 0 in dataset order. */
FG_MUST_USE fg_status fit_module_write_predictions(fit_module *m, fg_trainer *t, const char *path);

/* The trainer for o over fabric f (borrowed), with its callbacks (the
 * progress display, ModelCheckpoint, EarlyStopping) and loggers, which the
 * run keeps; then --ckpt-path resolved by the trainer's rules
 * (fg_trainer_resolve_ckpt_path: last, best or a path) into
 * o->resume_path, and for validate, test and predict the model's shape and
 * step read from that checkpoint into o. NULL after printing the error
 * (FG_EXIT_USAGE in *rc for a bad setting or a missing checkpoint, else
 * FG_EXIT_FAIL). */
typedef struct fit_run fit_run;
fit_run *fit_run_new(fit_opts *o, fg_fabric *f, int *rc);
void fit_run_free(fit_run *r);
/* Launches the ranks and runs the command on each. Returns the exit code
 * for this process, 0 or FG_EXIT_FAIL; after a stop fit_stopped is set (the
 * command turns it into FG_EXIT_RESUMABLE on rank 0). */
int fit_run_launch(fit_run *r);

/* True when this process already printed an error containing msg, so that
 * the command does not print it twice. */
bool fit_reported(const char *msg);
/* Prints "[rank R: ]what: <fg_last_error>" and remembers it; FG_EXIT_FAIL. */
int fit_rank_error(fg_trainer *t, const char *what);

/* Set once a stop's checkpoint is saved (signals are then ignored). */
extern volatile int fit_stopped;
/* In a rank forked by the fork launcher: starts the thread that takes
 * SIGTERM, SIGINT and SIGUSR1 (blocked in every other thread; fork copies
 * only the forking thread). 0, or FG_EXIT_FAIL after saying why. */
int fit_stop_signals_forked(void);

#endif
