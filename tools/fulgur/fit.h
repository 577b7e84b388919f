/* fulgur fit: the pieces of the command, one file each.
 *   fit_args.c      the flag table, defaults, checks made before any rank starts
 *   fit_data.c      datasets from --data / --val-data / --labels
 *   fit_model.c     the model and optimizer from the options, the lr schedule,
 *                   the model config stored in checkpoints (read back by `sample`)
 *   fit_progress.c  rank 0's progress bar / periodic lines and the CSV
 *   fit_loop.c      the training loop each rank runs (fabric API)
 *   fit_config.c    --config run.yaml (LightningCLI's sections) and --print-config
 *   cmd_fit.c       the command: parse, check, fg_fabric_new, launch */
#ifndef FULGUR_FIT_H
#define FULGUR_FIT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "cli.h"

typedef enum fit_model_kind { FIT_GPT, FIT_MLP } fit_model_kind;

/* Every option of `fulgur fit`, as parsed (see fit_args.c for defaults). */
typedef struct fit_opts {
    /* model and data */
    const char *model; /* "gpt" or "mlp" */
    fit_model_kind kind;
    const char *data, *val_data, *labels, *val_labels;
    double val_fraction;
    /* gpt shape */
    int64_t layers, heads, embd, ctx;
    double dropout;
    /* mlp shape */
    int64_t hidden;
    /* devices and strategy (Lightning's names) */
    const char *accelerator, *devices, *strategy, *precision;
    int64_t num_nodes;
    /* the sharded strategies (Lightning's DeepSpeedStrategy / FSDPStrategy) */
    const char *sharding_strategy; /* fsdp: as given; parsed into `sharded` */
    int64_t reduce_bucket_size, allgather_bucket_size;
    const char *state_dict_type;  /* "full" or "sharded": parsed into `sharded` */
    const char *deepspeed_config; /* a DeepSpeed JSON file (the fabric reads it) */
    const char *offload_optimizer, *offload_params, *nvme_path; /* parsed into `sharded` */
    bool activation_checkpointing;
    int64_t min_num_params, hybrid_shard_size; /* stage 3: auto-wrap policy; HYBRID_SHARD */
    fg_sharded_opts sharded;
    /* ddp's communication hooks (Lightning's DDPStrategy ddp_comm_hook) */
    const char *comm_hook, *comm_wrapper; /* as given; parsed into `ddp` */
    int64_t powersgd_rank, start_powersgd_iter, start_localsgd_iter, localsgd_period;
    fg_ddp_opts ddp;
    /* strategy bagua (Lightning's BaguaStrategy): parsed into ddp.bagua by fit_bagua.c */
    const char *bagua_algorithm, *hierarchical, *peer_selection_mode;
    int64_t communication_interval, bagua_warmup_steps, sync_interval_ms;
    /* loop */
    int64_t max_epochs, max_steps, batch_size, accumulate, num_workers;
    double clip, lr, min_lr_ratio, weight_decay, momentum;
    int64_t warmup_steps, lr_decay_steps;
    const char *optimizer; /* "adamw" or "sgd" */
    int64_t seed;
    int64_t val_check_interval, limit_val_batches;
    /* outputs */
    const char *root_dir, *ckpt_dir, *resume;
    int64_t ckpt_every, log_every, sample_tokens;
    int64_t save_top_k;       /* keep the newest N step checkpoints; -1: all */
    const char *on_nonfinite; /* "stop" or "skip" */
    bool deterministic;       /* Lightning's `deterministic` (fabric.h) */
    bool on_nonfinite_skip;
    int64_t restart_count; /* FULGUR_RESTART_COUNT, TORCHELASTIC_RESTART_COUNT or
                              SLURM_RESTART_COUNT: > 0 in a restarted job */
    const char *progress;  /* "auto", "bar", "lines", "none" */
    /* --config files (read by fit_config.c before the flags) and --print-config */
    const char *config;
    bool print_config;
    /* derived */
    char ckpt_dir_buf[4096];
    char resume_path[4096]; /* resolved checkpoint to resume from, "" = none */
} fit_opts;

/* Parses argv into o (after the --config files' settings, so that flags
 * win) and checks everything that can be checked before any rank starts
 * (values, files). Returns 0, -1 after --help or --print-config (exit 0),
 * or FG_EXIT_USAGE after printing the error. */
int fit_args_parse(fit_opts *o, int argc, char **argv);

/* The Bagua flags (fit_bagua.c): parsed into o->ddp.bagua, and refused
 * without --strategy bagua or with an algorithm they do not belong to.
 * Returns 0 or FG_EXIT_USAGE after printing why. */
struct cli_flag;
int fit_bagua_args(fit_opts *o, struct cli_flag *flags, int n);

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

/* Opens the datasets of o. Returns FG_OK, or a status with fg_last_error
 * naming the file and the problem. */
fg_status fit_data_open(const fit_opts *o, fit_data *d);
void fit_data_free(fit_data *d);

/* Rank 0's progress display and metrics CSV. Every function accepts NULL
 * (the other ranks hold NULL) and does nothing then. */
typedef struct fit_progress fit_progress;
/* total_steps: the step count the run ends at (for the bar and ETA; 0 if
 * unknown); start_step: where this process starts (a resume); unit: "tok"
 * or "samples"; csv_path: metrics file, appended when resuming. NULL on
 * failure (message in fg_last_error). */
fit_progress *fit_progress_new(const fit_opts *o, int64_t total_steps, int64_t start_step,
                               const char *unit, const char *csv_path, bool append);
/* After optimizer step `step` (1-based count of steps done) with the step's
 * mean loss, the lr used and the items (tokens/samples, all ranks) it took. */
void fit_progress_step(fit_progress *p, int64_t step, int64_t epoch, double loss, double lr,
                       double items);
/* A validation result at `step`. */
void fit_progress_val(fit_progress *p, int64_t step, int64_t epoch, double val_loss);
/* A line of text that does not break the bar. */
void fit_progress_note(fit_progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Ends the bar (newline), closes the CSV, frees. */
void fit_progress_free(fit_progress *p);
/* Seconds since fit_progress_new. */
double fit_progress_elapsed(const fit_progress *p);

/* True when this process already printed an error containing msg
 * (fit_loop.c's rank_error), so that cmd_fit does not print it twice. */
bool fit_reported(const char *msg);

/* Set by fit_run when it stopped early on a signal after saving a
 * checkpoint at a step boundary (it then returns 0 so that the ranks leave
 * together); cmd_fit turns it into exit 75 on rank 0. */
extern volatile int fit_stopped;

/* The training loop of one rank (fg_fabric_launch's run). arg is fit_opts. */
int fit_run(fg_fabric *f, void *arg);

#endif
