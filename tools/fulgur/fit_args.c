/* fulgur fit's flags: the table (names after Lightning's Trainer), their
 * defaults, and every check that can be made before a rank starts, so that a
 * typo costs exit code 2 and one line, not a launched job. Accelerator,
 * devices, strategy, precision and num-nodes are checked by fg_fabric_new in
 * cmd_fit.c (the launch layer's plan, as `fulgur env` makes it), and so are
 * the sharded strategies' options; here only that they parse and go with a
 * sharded strategy. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_paths.h"
#include "cli_flags.h"
#include "fit_config.h"
#include "fit_model.h"

static const char *const k_models[] = {"gpt", "mlp", NULL};
static const char *const k_optims[] = {"adamw", "sgd", NULL};
static const char *const k_progress[] = {"auto", "bar", "lines", "none", NULL};
static const char *const k_hooks[] = {"none",     "fp16_compress", "bf16_compress",
                                      "powersgd", "post_localsgd", NULL};
static const char *const k_wrappers[] = {"none", "fp16", "bf16", NULL};
static const char *const k_bagua[] = {"gradient_allreduce",
                                      "bytegrad",
                                      "decentralized",
                                      "low_precision_decentralized",
                                      "qadam",
                                      "async",
                                      NULL};
static const char *const k_hier[] = {"auto", "true", "false", NULL};
static const char *const k_peer[] = {"all", "shift_one", NULL};
static const char *const k_nonfinite[] = {"stop", "skip", NULL};
static const char *const k_state_dict[] = {"full", "sharded", NULL};
static const char *const k_clip[] = {"norm", "value", NULL};
static const char *const k_modes[] = {"min", "max", NULL};

static const char *usage_of(fg_trainer_fn fn) {
    switch (fn) {
    case FG_VALIDATE: return "fulgur validate --data PATH [--ckpt-path last|best|PATH] [FLAGS]";
    case FG_TEST:
        return "fulgur test --data PATH [--test-data PATH] [--ckpt-path last|best|PATH] [FLAGS]";
    case FG_PREDICT:
        return "fulgur predict --data PATH [--predict-data PATH] [--predictions OUT.csv] "
               "[--ckpt-path last|best|PATH] [FLAGS]";
    default: return "fulgur fit --model {gpt,mlp} --data PATH [--val-data PATH] [FLAGS]";
    }
}

/* The flag table over o. Kept in one place so that --help shows every flag.
 * The lists of strategies and precisions are printed from their tables
 * (kinds.h), so that help says what this fulgur runs. */
static int build_flags(fit_opts *o, cli_flag *t) {
    int n = 0;
    static char strategy_help[1280], precision_help[256];
    snprintf(strategy_help, sizeof strategy_help,
             "auto (ddp on several devices, else single), %s (fulgur env: what each launches, "
             "shards and takes)",
             fg_strategy_names());
    snprintf(precision_help, sizeof precision_help, "%s", fg_precision_available());
#define SEC(title) t[n++] = (cli_flag){.name = title, .type = CLI_SECTION}
#define F(...)                                                                                     \
    t[n++] = (cli_flag) { __VA_ARGS__ }
    SEC("model and data");
    F(.name = "model", .type = CLI_STR, .dst = &o->model, .def = "gpt", .choices = k_models,
      .help = "built-in model");
    F(.name = "data", .type = CLI_STR, .dst = &o->data,
      .help = "training data (required): a text file or folder (char level), a uint16 token "
              "file .bin (nanoGPT/llm.c), or for mlp a .npy of inputs (N, D...)");
    F(.name = "labels", .type = CLI_STR, .dst = &o->labels,
      .help = "mlp: a .npy of integer labels (N,) for --data");
    F(.name = "val-data", .type = CLI_STR, .dst = &o->val_data,
      .help = "validation data in the same form (default: the last --val-fraction of --data)");
    F(.name = "val-labels", .type = CLI_STR, .dst = &o->val_labels,
      .help = "mlp: labels .npy for --val-data");
    F(.name = "val-fraction", .type = CLI_DOUBLE, .dst = &o->val_fraction, .def = "0.1",
      .help = "share of --data held out for validation when --val-data is not given");
    SEC("gpt shape");
    F(.name = "layers", .type = CLI_INT, .dst = &o->layers, .def = "4", .min = 1, .max = 1024,
      .help = "transformer blocks");
    F(.name = "heads", .type = CLI_INT, .dst = &o->heads, .def = "4", .min = 1, .max = 1024,
      .help = "attention heads (must divide --embd)");
    F(.name = "embd", .type = CLI_INT, .dst = &o->embd, .def = "128", .min = 1, .max = 65536,
      .help = "embedding width");
    F(.name = "ctx", .type = CLI_INT, .dst = &o->ctx, .def = "128", .min = 1, .max = 65536,
      .help = "context length (tokens per sample)");
    F(.name = "dropout", .type = CLI_DOUBLE, .dst = &o->dropout, .def = "0",
      .help = "dropout probability in [0, 1)");
    SEC("mlp shape");
    F(.name = "hidden", .type = CLI_INT, .dst = &o->hidden, .def = "128", .min = 1, .max = 1 << 20,
      .help = "hidden width");
    SEC("devices (Lightning's Trainer arguments)");
    F(.name = "accelerator", .type = CLI_STR, .dst = &o->accelerator, .def = "auto",
      .help = "auto, cpu (gpu/cuda: not built in)");
    F(.name = "devices", .type = CLI_STR, .dst = &o->devices, .def = "auto",
      .help = "ranks on this node: auto (1, or the launcher's), N, -1 (one per CPU device), or "
              "ids \"0,2\" / \"[0, 2]\"");
    F(.name = "strategy", .type = CLI_STR, .dst = &o->strategy, .def = "auto",
      .help = strategy_help);
    F(.name = "sharding-strategy", .type = CLI_STR, .dst = &o->sharding_strategy,
      .help = "fsdp: FULL_SHARD (the default, = deepspeed_stage_3), SHARD_GRAD_OP (= "
              "deepspeed_stage_2), NO_SHARD (= ddp), HYBRID_SHARD (full shard in a node)");
    F(.name = "auto-wrap-min-params", .type = CLI_INT, .dst = &o->min_num_params, .def = "0",
      .min = 0, .max = INT64_MAX / 2,
      .help = "stage 3: the smallest modules with at least this many parameters are the units "
              "(0: one per transformer block)");
    F(.name = "auto-wrap-policy", .type = CLI_STR, .dst = &o->wrap_policy,
      .help = "stage 3: the module type whose modules are the units (Lightning's "
              "auto_wrap_policy={Block}; gpt: Block, Linear, ...) [default: Block]");
    F(.name = "hybrid-shard-size", .type = CLI_INT, .dst = &o->hybrid_shard_size, .def = "0",
      .min = 0, .max = 1 << 20,
      .help = "HYBRID_SHARD: ranks per shard group (0: the ranks of a node)");
    F(.name = "reduce-bucket-size", .type = CLI_INT, .dst = &o->reduce_bucket_size, .def = "0",
      .min = 0, .max = INT64_MAX / 2,
      .help = "sharded strategies: elements per gradient reduce-scatter bucket (0: 200000000)");
    F(.name = "allgather-bucket-size", .type = CLI_INT, .dst = &o->allgather_bucket_size,
      .def = "0", .min = 0, .max = INT64_MAX / 2,
      .help = "sharded strategies: elements per parameter all-gather after each step "
              "(0: 200000000)");
    F(.name = "state-dict-type", .type = CLI_STR, .dst = &o->state_dict_type, .def = "full",
      .choices = k_state_dict,
      .help = "checkpoints: full (one file) or sharded (a folder: a file per rank and "
              "model.safetensors.index.json)");
    F(.name = "deepspeed-config", .type = CLI_STR, .dst = &o->deepspeed_config,
      .help = "deepspeed strategies: a DeepSpeed JSON config; its zero_optimization keys set "
              "the stage and options (a key fulgur does not honour is an error)");
    F(.name = "offload-optimizer-device", .type = CLI_STR, .dst = &o->offload_optimizer,
      .help = "deepspeed: cpu (nothing to move on a CPU) or nvme (optimizer state in files under "
              "--nvme-path)");
    F(.name = "offload-params-device", .type = CLI_STR, .dst = &o->offload_params,
      .help = "fsdp, deepspeed_stage_3: cpu (nothing to move on a CPU); deepspeed_stage_3: nvme "
              "(the parameter shards in files under --nvme-path)");
    F(.name = "nvme-path", .type = CLI_STR, .dst = &o->nvme_path,
      .help = "directory on a local disk for nvme offload");
    F(.name = "activation-checkpointing", .type = CLI_BOOL, .dst = &o->activation_checkpointing,
      .help = "gpt: recompute each block's activations in backward (less memory, more compute)");
    F(.name = "partition-activations", .type = CLI_BOOL, .dst = &o->partition_activations,
      .help = "deepspeed: split the checkpoints over the model-parallel ranks (none in fulgur: "
              "nothing to partition)");
    F(.name = "cpu-checkpointing", .type = CLI_BOOL, .dst = &o->cpu_checkpointing,
      .help = "deepspeed: keep the checkpoints in host memory (on a CPU they are: nothing to "
              "move)");
    F(.name = "ddp-comm-hook", .type = CLI_STR, .dst = &o->comm_hook, .def = "none",
      .choices = k_hooks, .help = "ddp: gradient communication hook (docs/comm-hooks.md)");
    F(.name = "ddp-comm-wrapper", .type = CLI_STR, .dst = &o->comm_wrapper, .def = "none",
      .choices = k_wrappers, .help = "ddp: send the hook's data as fp16 or bf16");
    F(.name = "powersgd-rank", .type = CLI_INT, .dst = &o->powersgd_rank, .def = "1", .min = 1,
      .max = 1 << 20, .help = "powersgd: matrix_approximation_rank");
    F(.name = "start-powersgd-iter", .type = CLI_INT, .dst = &o->start_powersgd_iter, .def = "1000",
      .min = 0, .max = INT64_MAX / 2,
      .help = "powersgd: steps of plain ddp before compression starts");
    F(.name = "start-localsgd-iter", .type = CLI_INT, .dst = &o->start_localsgd_iter, .def = "0",
      .min = 0, .max = INT64_MAX / 2,
      .help = "post_localsgd: steps of plain ddp before local SGD starts");
    F(.name = "localsgd-period", .type = CLI_INT, .dst = &o->localsgd_period, .def = "4", .min = 1,
      .max = INT64_MAX / 2, .help = "post_localsgd: average the weights over ranks every N steps");
    F(.name = "bagua-algorithm", .type = CLI_STR, .dst = &o->bagua_algorithm,
      .def = "gradient_allreduce", .choices = k_bagua,
      .help = "bagua: the algorithm (docs/bagua.md)");
    F(.name = "hierarchical", .type = CLI_STR, .dst = &o->hierarchical, .def = "auto",
      .choices = k_hier, .help = "bagua: inside each node, then across (auto: the algorithm's)");
    F(.name = "peer-selection-mode", .type = CLI_STR, .dst = &o->peer_selection_mode, .def = "all",
      .choices = k_peer, .help = "bagua decentralized: all or shift_one");
    F(.name = "communication-interval", .type = CLI_INT, .dst = &o->communication_interval,
      .def = "1", .min = 1, .max = INT64_MAX / 2,
      .help = "bagua decentralized ones: steps per weight exchange");
    F(.name = "bagua-warmup-steps", .type = CLI_INT, .dst = &o->bagua_warmup_steps, .def = "-1",
      .min = -1, .max = INT64_MAX / 2,
      .help = "bagua qadam / async: Bagua's warmup_steps (-1: 100 for qadam, 0 for async)");
    F(.name = "sync-interval-ms", .type = CLI_INT, .dst = &o->sync_interval_ms, .def = "500",
      .min = 1, .max = INT64_MAX / 2, .help = "bagua async: milliseconds between averagings");
    F(.name = "precision", .type = CLI_STR, .dst = &o->precision, .def = "32-true",
      .help = precision_help);
    F(.name = "num-nodes", .type = CLI_INT, .dst = &o->num_nodes, .def = "0", .min = 0,
      .max = 65536,
      .help = "machines (launch each with mpirun, srun or fulgur run); 0: 1, or "
              "the launcher's");
    SEC("loop (Lightning's Trainer arguments)");
    F(.name = "max-epochs", .type = CLI_INT, .dst = &o->max_epochs, .def = "-1", .min = -1,
      .max = INT64_MAX / 2, .help = "stop after this many epochs (-1: no limit)");
    F(.name = "min-epochs", .type = CLI_INT, .dst = &o->min_epochs, .def = "0", .min = 0,
      .max = INT64_MAX / 2, .help = "no early stop before this many epochs");
    F(.name = "max-steps", .type = CLI_INT, .dst = &o->max_steps, .def = "1500", .min = -1,
      .max = INT64_MAX / 2, .help = "stop after this many optimizer steps (-1: no limit)");
    F(.name = "min-steps", .type = CLI_INT, .dst = &o->min_steps, .def = "0", .min = 0,
      .max = INT64_MAX / 2, .help = "no early stop before this many optimizer steps");
    F(.name = "max-time", .type = CLI_STR, .dst = &o->max_time_s,
      .help = "stop after this much training time, DD:HH:MM:SS (or HH:MM:SS, MM:SS, seconds); "
              "the checkpoint at the stop resumes");
    F(.name = "fast-dev-run", .type = CLI_INT, .dst = &o->fast_dev_run, .def = "0", .min = 0,
      .max = INT64_MAX / 2, .bare = "1",
      .help = "run N batches of training and validation (one epoch), no checkpoints, no "
              "loggers: a quick check that everything runs (0: off; alone: 1)");
    F(.name = "batch-size", .type = CLI_INT, .dst = &o->batch_size, .def = "16", .min = 1,
      .max = 1 << 24, .help = "samples per device per micro-batch");
    F(.name = "accumulate-grad-batches", .type = CLI_INT, .dst = &o->accumulate, .def = "1",
      .min = 1, .max = 1 << 20, .help = "micro-batches per optimizer step");
    F(.name = "limit-train-batches", .type = CLI_STR, .dst = &o->limit_train_s, .def = "1.0",
      .help = "training batches per epoch per rank: a count (10) or a fraction of the "
              "epoch (0.25)");
    F(.name = "gradient-clip-val", .type = CLI_DOUBLE, .dst = &o->clip, .def = "1.0",
      .help = "clip the gradients to this (0: off)");
    F(.name = "gradient-clip-algorithm", .type = CLI_STR, .dst = &o->clip_algorithm, .def = "norm",
      .choices = k_clip, .help = "by the global 2-norm, or each element by value");
    F(.name = "on-nonfinite", .type = CLI_STR, .dst = &o->on_nonfinite, .def = "stop",
      .choices = k_nonfinite,
      .help = "a non-finite loss or gradient on any rank: stop (naming the step, the tensor and "
              "the last good checkpoint) or skip the optimizer step on every rank (counted)");
    F(.name = "deterministic", .type = CLI_BOOL, .dst = &o->deterministic,
      .help = "bitwise the same weights on any number of devices for the same global batch "
              "(one kernel thread per rank; docs/fault-tolerance.md)");
    F(.name = "detect-anomaly", .type = CLI_BOOL, .dst = &o->detect_anomaly,
      .help = "stop at the first non-finite loss or gradient on a rank, after each backward, "
              "naming the batch and the tensor");
    F(.name = "optimizer", .type = CLI_STR, .dst = &o->optimizer, .def = "adamw",
      .choices = k_optims, .help = "adamw, or sgd with --momentum");
    F(.name = "lr", .type = CLI_DOUBLE, .dst = &o->lr, .def = "2e-3", .help = "peak learning rate");
    F(.name = "warmup-steps", .type = CLI_INT, .dst = &o->warmup_steps, .def = "100", .min = 0,
      .max = INT64_MAX / 2, .help = "linear warm-up steps, then cosine decay");
    F(.name = "lr-decay-steps", .type = CLI_INT, .dst = &o->lr_decay_steps, .def = "0", .min = 0,
      .max = INT64_MAX / 2, .help = "cosine decay ends at this step (0: --max-steps)");
    F(.name = "min-lr-ratio", .type = CLI_DOUBLE, .dst = &o->min_lr_ratio, .def = "0.1",
      .help = "the cosine ends at lr x this");
    F(.name = "weight-decay", .type = CLI_DOUBLE, .dst = &o->weight_decay, .def = "0.1",
      .help = "AdamW's decoupled weight decay (matrices only) / SGD's L2");
    F(.name = "momentum", .type = CLI_DOUBLE, .dst = &o->momentum, .def = "0.9",
      .help = "SGD momentum");
    F(.name = "seed", .type = CLI_INT, .dst = &o->seed, .def = "1337", .min = 0, .max = INT64_MAX,
      .help = "seed of the weights, the data order and dropout");
    F(.name = "num-workers", .type = CLI_INT, .dst = &o->num_workers, .def = "1", .min = 0,
      .max = 64, .help = "data loader threads per rank");
    SEC("validation");
    F(.name = "val-check-interval", .type = CLI_STR, .dst = &o->val_check_interval_s, .def = "250",
      .help = "validate every N training batches, or a fraction of each epoch (0.25), and at "
              "the end (0: at the end only)");
    F(.name = "check-val-every-n-epoch", .type = CLI_INT, .dst = &o->check_val_every_n_epoch,
      .def = "0", .min = -1, .max = INT64_MAX / 2,
      .help = "validate in every N-th epoch; -1: count --val-check-interval batches across "
              "epochs (0: -1 when --val-check-interval is a count, else 1)");
    F(.name = "limit-val-batches", .type = CLI_STR, .dst = &o->limit_val_s, .def = "20",
      .help = "batches per rank per validation: a count or a fraction (1.0: all; 0: none)");
    F(.name = "num-sanity-val-steps", .type = CLI_INT, .dst = &o->num_sanity_val_steps, .def = "2",
      .min = -1, .max = INT64_MAX / 2,
      .help = "validation batches run before training (-1: all; none when resuming)");
    SEC("checkpoints and output");
    F(.name = "default-root-dir", .type = CLI_STR, .dst = &o->root_dir, .def = "runs/MODEL",
      .help = "the run's folder: the loggers' lightning_logs/, and checkpoints/ unless "
              "--ckpt-dir");
    F(.name = "ckpt-dir", .type = CLI_STR, .dst = &o->ckpt_dir,
      .help = "checkpoint folder [default: DEFAULT_ROOT_DIR/checkpoints]");
    F(.name = "every-n-train-steps", .alias = "ckpt-every", .type = CLI_INT, .dst = &o->ckpt_every,
      .def = "500", .min = 0, .max = INT64_MAX / 2,
      .help = "save a checkpoint every N optimizer steps; always at the end (0: only there); "
              "with --monitor and not given: at the end of every validation, as Lightning");
    F(.name = "monitor", .type = CLI_STR, .dst = &o->monitor,
      .help = "the metric that ranks checkpoints for --save-top-k and that "
              "--early-stopping-patience watches (val_loss)");
    F(.name = "mode", .type = CLI_STR, .dst = &o->mode, .def = "min", .choices = k_modes,
      .help = "whether a lower or a higher --monitor is better");
    F(.name = "save-top-k", .type = CLI_INT, .dst = &o->save_top_k, .def = "-1", .min = -1,
      .max = INT64_MAX / 2,
      .help = "keep the best N checkpoints by --monitor, or without one the newest N (-1: "
              "keep all)");
    F(.name = "save-last", .type = CLI_BOOL, .dst = &o->save_last, .def = "true",
      .help = "last.safetensors: a link to the newest checkpoint (Lightning's save_last=\"link\"), "
              "which --ckpt-path last reads");
    F(.name = "early-stopping-patience", .type = CLI_INT, .dst = &o->early_stopping_patience,
      .def = "0", .min = 0, .max = INT64_MAX / 2,
      .help = "stop after N validations without an improvement of --monitor (0: no "
              "EarlyStopping)");
    F(.name = "early-stopping-min-delta", .type = CLI_DOUBLE, .dst = &o->early_stopping_min_delta,
      .def = "0", .help = "the least change of --monitor that counts as an improvement");
    F(.name = "ckpt-path", .alias = "resume", .type = CLI_STR, .dst = &o->resume,
      .help = "fit: continue from a checkpoint file, a folder, or \"last\" (the newest in "
              "--ckpt-dir); validate/test/predict: the weights to use: last, best or a path "
              "[default there: last]");
    F(.name = "logger", .type = CLI_STR, .dst = &o->logger, .def = "csv",
      .help = "Lightning's loggers, comma-separated: csv (metrics.csv, hparams.yaml), "
              "tensorboard (event files), all in one DEFAULT_ROOT_DIR/lightning_logs/version_N "
              "per run; none: no logger");
    F(.name = "log-every-n-steps", .alias = "log-every", .type = CLI_INT, .dst = &o->log_every,
      .def = "10", .min = 1, .max = INT64_MAX / 2,
      .help = "logger row and progress line every N steps");
    F(.name = "progress", .type = CLI_STR, .dst = &o->progress, .def = "auto",
      .choices = k_progress, .help = "auto: a bar on a terminal, lines otherwise");
    F(.name = "enable-progress-bar", .type = CLI_BOOL, .dst = &o->enable_progress_bar,
      .def = "true", .help = "false: no progress display (--progress none)");
    F(.name = "enable-checkpointing", .type = CLI_BOOL, .dst = &o->enable_checkpointing,
      .def = "true", .help = "false: no checkpoint at all (no ModelCheckpoint; nothing to resume)");
    F(.name = "sample-tokens", .type = CLI_INT, .dst = &o->sample_tokens, .def = "200", .min = 0,
      .max = 1 << 20, .help = "gpt: characters generated at the end");
    SEC("validate, test, predict");
    F(.name = "test-data", .type = CLI_STR, .dst = &o->test_data,
      .help = "test: the data to test on (default: the validation data)");
    F(.name = "test-labels", .type = CLI_STR, .dst = &o->test_labels,
      .help = "test, mlp: labels .npy for --test-data");
    F(.name = "predict-data", .type = CLI_STR, .dst = &o->predict_data,
      .help = "predict: the inputs (default: the validation data)");
    F(.name = "predictions", .type = CLI_STR, .dst = &o->predictions,
      .help = "predict: the CSV written (index and class, or next token) [default: "
              "DEFAULT_ROOT_DIR/predictions.csv]");
    F(.name = "limit-test-batches", .type = CLI_STR, .dst = &o->limit_test_s, .def = "1.0",
      .help = "test: batches per rank, a count or a fraction");
    F(.name = "limit-predict-batches", .type = CLI_STR, .dst = &o->limit_predict_s, .def = "1.0",
      .help = "predict: batches per rank, a count or a fraction");
    SEC("config file (LightningCLI's)");
    F(.name = "config", .type = CLI_STR, .dst = &o->config,
      .help = "read settings from a YAML file with sections trainer:, model:, data:, optimizer: "
              "(keys: these flags' names with underscores); flags given here win over it");
    F(.name = "print-config", .type = CLI_BOOL, .dst = &o->print_config,
      .help = "print the merged settings as such a YAML file and exit");
#undef F
#undef SEC
    return n;
}

static bool file_exists(const char *flag, const char *path, bool dir_ok) {
    struct stat st;
    if (stat(path, &st) != 0) {
        cli_error("--%s=\"%s\": %s", flag, path, strerror(errno));
        return false;
    }
    if (S_ISDIR(st.st_mode) && !dir_ok) {
        cli_error("--%s=\"%s\": is a folder, expected a file", flag, path);
        return false;
    }
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) {
        /* /dev/zero or a pipe would be read until memory runs out */
        cli_error("--%s=\"%s\": not a regular file (a device, pipe or socket)", flag, path);
        return false;
    }
    return true;
}

/* mkdir -p */
static int make_dirs(const char *path) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(buf, 0777) != 0 && errno != EEXIST ? -1 : 0;
}

static bool dir_writable(const char *flag, const char *dir) {
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/.fulgur-write-test-XXXXXX", dir);
    int fd = make_dirs(dir) == 0 ? mkstemp(probe) : -1;
    if (fd < 0) {
        cli_error("--%s=\"%s\": cannot write checkpoints there: %s (choose a writable folder "
                  "with --ckpt-dir or --default-root-dir)",
                  flag, dir, strerror(errno));
        return false;
    }
    close(fd);
    unlink(probe);
    return true;
}

int fit_check_ckpt_dir(const fit_opts *o) {
    return dir_writable(o->ckpt_dir == o->ckpt_dir_buf ? "default-root-dir" : "ckpt-dir",
                        o->ckpt_dir)
               ? 0
               : FG_EXIT_USAGE;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* The kind the run will have: --strategy as the launch plan resolves it,
 * "auto" by the devices and nodes (and the launcher's ranks) as the run
 * resolves it. When the plan fails (fg_fabric_new reports why), a name
 * still means its kind; "auto" then is unknown (false). */
bool plan_kind(const fit_opts *o, fg_strategy_kind *kind) {
    fg_launch_plan p;
    fg_launch_opts lo = {.accelerator = o->accelerator,
                         .devices = o->devices,
                         .strategy = o->strategy,
                         .precision = o->precision,
                         .num_nodes = (int)o->num_nodes};
    bool ok = fg_launch_plan_make(&lo, NULL, &p) == FG_OK;
    if (ok) *kind = p.strategy;
    else if (o->strategy && strcasecmp(o->strategy, "auto")) /* a name means its kind */
        ok = fg_launch_parse_strategy(o->strategy, 1, 1, kind) == FG_OK;
    fg_clear_error();
    return ok;
}

/* What decides a run's numbers beyond the plan, for the plan line: the
 * communication backend the ranks will join (as fg_comm_new picks it), the
 * Bagua algorithm, the comm hook and wrapper, the sharding strategy and
 * offload, --deterministic with its micro-batch. Appended to buf. */
void fit_plan_details(const fit_opts *o, const fg_launch_plan *p, char *buf, size_t cap) {
    size_t n = strlen(buf);
#define ADD(...)                                                                                   \
    do {                                                                                           \
        if (n < cap) n += (size_t)snprintf(buf + n, cap - n, __VA_ARGS__);                         \
    } while (0)
    const fg_strategy_info *row = fg_strategy_info_of(p->strategy);
    bool several = p->world_size > 1 && row && row->ranks != FG_RANKS_ONE_PROCESS;
    if (several) {
        const char *be = getenv("FULGUR_BACKEND");
        bool mpirun = p->cluster.source && !strcmp(p->cluster.source, "openmpi");
        if (!be || !*be || !strcmp(be, "auto"))
            be = !mpirun                                                       ? "shm"
                 : p->cluster.num_nodes > 1 && p->cluster.local_world_size > 1 ? "hybrid"
                                                                               : "mpi";
        ADD(", comm %s", be);
    }
    unsigned takes = row ? fg_strategy_takes(p->strategy, o->sharded.sharding_strategy) : 0;
    if (takes & FG_TAKES_BAGUA) {
        ADD(", bagua %s", fg_bagua_algorithm_name(o->ddp.bagua.algorithm));
        if (o->ddp.bagua.algorithm == FG_BAGUA_DECENTRALIZED)
            ADD(" (peers %s)", fg_bagua_peer_selection_name(o->ddp.bagua.peer_selection_mode));
    }
    if (o->ddp.comm_hook != FG_DDP_HOOK_NONE || o->ddp.comm_wrapper != FG_DDP_WRAPPER_NONE)
        ADD(", comm hook %s%s%s%s", fg_ddp_comm_hook_name(o->ddp.comm_hook),
            o->ddp.comm_wrapper ? " (wrapper " : "",
            o->ddp.comm_wrapper ? fg_ddp_comm_wrapper_name(o->ddp.comm_wrapper) : "",
            o->ddp.comm_wrapper ? ")" : "");
    if (takes & FG_TAKES_SHARDING_STRATEGY)
        ADD(", sharding %s", fg_sharding_strategy_name(o->sharded.sharding_strategy));
    fg_offload_device od = o->sharded.offload_optimizer_device,
                      pd = o->sharded.offload_params_device;
    fg_offload_device nod, npd; /* what a name like deepspeed_stage_3_offload turns on */
    fg_launch_strategy_offload(o->strategy, &nod, &npd);
    if (!od) od = nod;
    if (!pd) pd = npd;
    if (od || pd)
        ADD(", offload optimizer %s, parameters %s", fg_offload_device_name(od),
            fg_offload_device_name(pd));
    if (o->deterministic)
        ADD(", deterministic (micro-batch %lld: the same bits on any number of devices for this "
            "--batch-size; another, as half of it on twice the ranks, gives other bits)",
            (long long)o->batch_size);
#undef ADD
}

/* The offload flags into o->sharded (the strategy checks the rest at
 * fg_fabric_new) */
static int offload_args(fit_opts *o) {
    const char *given[2] = {o->offload_optimizer, o->offload_params};
    fg_offload_device *dst[2] = {&o->sharded.offload_optimizer_device,
                                 &o->sharded.offload_params_device};
    const char *flag[2] = {"offload-optimizer-device", "offload-params-device"};
    for (int i = 0; i < 2; i++)
        if (given[i] && (fg_offload_device_parse(given[i], dst[i]) != FG_OK || !*dst[i])) {
            cli_error("--%s=\"%s\": expected cpu or nvme", flag[i], given[i]);
            return FG_EXIT_USAGE;
        }
    if (o->nvme_path && o->sharded.offload_optimizer_device != FG_OFFLOAD_NVME &&
        o->sharded.offload_params_device != FG_OFFLOAD_NVME) {
        fg_offload_device od;
        fg_launch_strategy_offload(o->strategy, &od, NULL);
        if (od != FG_OFFLOAD_NVME) {
            cli_error("--nvme-path is for nvme offload: add --offload-optimizer-device nvme");
            return FG_EXIT_USAGE;
        }
    }
    o->sharded.nvme_path = o->nvme_path;
    return 0;
}

/* The sharded strategies' flags: parsed, and refused with a strategy they
 * do not belong to (one that does not parse is fg_fabric_new's to report). */
static int sharded_args(fit_opts *o, cli_flag *flags, int n) {
    fg_strategy_kind kind;
    bool known = plan_kind(o, &kind);
    if (o->sharding_strategy) {
        if (fg_sharding_strategy_parse(o->sharding_strategy, &o->sharded.sharding_strategy) !=
            FG_OK) {
            cli_error("--sharding-strategy=\"%s\": expected one of FULL_SHARD, SHARD_GRAD_OP, "
                      "NO_SHARD, HYBRID_SHARD (any case)",
                      o->sharding_strategy);
            return FG_EXIT_USAGE;
        }
        if (known && !(fg_strategy_takes(kind, 0) & FG_TAKES_SHARDING_STRATEGY)) {
            cli_error("--sharding-strategy is fsdp's (Lightning's FSDPStrategy); --strategy=%s "
                      "takes none",
                      o->strategy);
            return FG_EXIT_USAGE;
        }
    }
    static const char *const k_buckets[] = {"reduce-bucket-size", "allgather-bucket-size", NULL};
    for (int i = 0; k_buckets[i]; i++)
        if (known && !(fg_strategy_takes(kind, 0) & FG_TAKES_BUCKET_SIZES) &&
            cli_flag_given(cli_flags_find(flags, n, k_buckets[i]))) {
            cli_error("--%s is for the sharded strategies (%s); --strategy=%s has no such buckets",
                      k_buckets[i], fg_strategy_kinds_taking(FG_TAKES_BUCKET_SIZES), o->strategy);
            return FG_EXIT_USAGE;
        }
    bool s3 = known && fg_strategy_takes(kind, o->sharded.sharding_strategy) & FG_TAKES_WRAP_POLICY;
    if (known && !s3 && cli_flag_given(cli_flags_find(flags, n, "auto-wrap-min-params"))) {
        cli_error("--auto-wrap-min-params picks the units of stage 3 (deepspeed_stage_3, fsdp "
                  "FULL_SHARD or HYBRID_SHARD); --strategy=%s%s%s gathers no units",
                  o->strategy, o->sharding_strategy ? " --sharding-strategy=" : "",
                  o->sharding_strategy ? o->sharding_strategy : "");
        return FG_EXIT_USAGE;
    }
    if (o->wrap_policy && known && !s3) {
        cli_error("--auto-wrap-policy picks the units of stage 3 (deepspeed_stage_3, fsdp "
                  "FULL_SHARD or HYBRID_SHARD); --strategy=%s gathers no units",
                  o->strategy);
        return FG_EXIT_USAGE;
    }
    if (o->wrap_policy && o->min_num_params) {
        cli_error("--auto-wrap-policy and --auto-wrap-min-params are two policies: give one");
        return FG_EXIT_USAGE;
    }
    o->sharded.wrap_module_type = o->wrap_policy;
    if (cli_flag_given(cli_flags_find(flags, n, "hybrid-shard-size")) &&
        !(known && fg_strategy_takes(kind, 0) & FG_TAKES_SHARDING_STRATEGY &&
          o->sharded.sharding_strategy == FG_SHARDING_HYBRID_SHARD)) {
        cli_error("--hybrid-shard-size is for --strategy fsdp --sharding-strategy HYBRID_SHARD");
        return FG_EXIT_USAGE;
    }
    o->sharded.reduce_bucket_size = o->reduce_bucket_size;
    o->sharded.allgather_bucket_size = o->allgather_bucket_size;
    if (o->deepspeed_config && !file_exists("deepspeed-config", o->deepspeed_config, false))
        return FG_EXIT_USAGE; /* its keys and the strategy are fg_fabric_new's to check */
    if (fg_state_dict_type_parse(o->state_dict_type, &o->sharded.state_dict_type) != FG_OK) {
        cli_error("--state-dict-type: %s", fg_last_error()); /* the choices caught it already */
        return FG_EXIT_USAGE;
    }
    static const char *const k_act[] = {"partition-activations", "cpu-checkpointing", NULL};
    bool ds = (known && fg_strategy_takes(kind, 0) & FG_TAKES_DEEPSPEED) ||
              (o->deepspeed_config && !strcmp(o->strategy, "auto"));
    for (int i = 0; k_act[i]; i++)
        if (!ds && cli_flag_given(cli_flags_find(flags, n, k_act[i]))) {
            cli_error("--%s is an option of DeepSpeed's strategies (%s); --strategy=%s takes none",
                      k_act[i], fg_strategy_kinds_taking(FG_TAKES_DEEPSPEED), o->strategy);
            return FG_EXIT_USAGE;
        }
    o->sharded.partition_activations = o->partition_activations;
    o->sharded.cpu_checkpointing = o->cpu_checkpointing;
    o->sharded.min_num_params = o->min_num_params;
    o->sharded.hybrid_shard_size = (int)o->hybrid_shard_size;
    return offload_args(o);
}

/* The communication hook flags: parsed into o->ddp, and refused where
 * they mean nothing (another hook's flag, a strategy without ddp's
 * buckets). */
static int hook_args(fit_opts *o, cli_flag *flags, int n) {
    fg_ddp_opts *d = &o->ddp;
    if (fg_ddp_comm_hook_parse(o->comm_hook, &d->comm_hook) != FG_OK ||
        fg_ddp_comm_wrapper_parse(o->comm_wrapper, &d->comm_wrapper) != FG_OK) {
        cli_error("%s", fg_last_error()); /* the table's choices caught these already */
        return FG_EXIT_USAGE;
    }
    static const struct {
        const char *flag;
        fg_ddp_comm_hook hook;
    } k_own[] = {{"powersgd-rank", FG_DDP_HOOK_POWERSGD},
                 {"start-powersgd-iter", FG_DDP_HOOK_POWERSGD},
                 {"start-localsgd-iter", FG_DDP_HOOK_POST_LOCALSGD},
                 {"localsgd-period", FG_DDP_HOOK_POST_LOCALSGD}};
    for (size_t i = 0; i < sizeof k_own / sizeof k_own[0]; i++)
        if (cli_flag_given(cli_flags_find(flags, n, k_own[i].flag)) &&
            d->comm_hook != k_own[i].hook) {
            cli_error("--%s is for --ddp-comm-hook %s; got --ddp-comm-hook %s", k_own[i].flag,
                      fg_ddp_comm_hook_name(k_own[i].hook), o->comm_hook);
            return FG_EXIT_USAGE;
        }
    fg_strategy_kind kind;
    bool known = plan_kind(o, &kind);
    bool hooked = d->comm_hook != FG_DDP_HOOK_NONE || d->comm_wrapper != FG_DDP_WRAPPER_NONE;
    if (hooked && known &&
        !(fg_strategy_takes(kind, o->sharded.sharding_strategy) & FG_TAKES_COMM_HOOK)) {
        cli_error("--ddp-comm-hook and --ddp-comm-wrapper are ddp's (%s, fsdp with NO_SHARD); "
                  "--strategy=%s%s has no gradient buckets to hook",
                  fg_strategy_kinds_taking(FG_TAKES_COMM_HOOK), o->strategy,
                  strcmp(o->strategy, "auto") ? "" : " (single on one device)");
        return FG_EXIT_USAGE;
    }
    d->powersgd.matrix_approximation_rank = (int)o->powersgd_rank;
    d->powersgd.start_powerSGD_iter = o->start_powersgd_iter ? o->start_powersgd_iter : -1;
    d->post_localsgd.start_localSGD_iter = o->start_localsgd_iter;
    d->post_localsgd.period = o->localsgd_period;
    return 0;
}

/* "10" (a count of batches) or "0.25" (a fraction of an epoch in [0, 1]):
 * Lightning's int-or-float arguments. */
static bool parse_batches(const char *flag, const char *s, fg_batches *out) {
    int64_t n;
    double x;
    if (cli_parse_int(s, &n) && n >= 0) {
        *out = FG_COUNT(n);
        return true;
    }
    if (cli_parse_double(s, &x) && x >= 0 && x <= 1) {
        *out = FG_FRACTION(x);
        return true;
    }
    cli_error("--%s=\"%s\": expected a count of batches (10) or a fraction of them in [0, 1] "
              "(0.25)",
              flag, s);
    return false;
}

/* The Trainer's arguments that come as text. */
static int trainer_args(fit_opts *o) {
    if (!parse_batches("limit-train-batches", o->limit_train_s, &o->limit_train) ||
        !parse_batches("limit-val-batches", o->limit_val_s, &o->limit_val) ||
        !parse_batches("limit-test-batches", o->limit_test_s, &o->limit_test) ||
        !parse_batches("limit-predict-batches", o->limit_predict_s, &o->limit_predict) ||
        !parse_batches("val-check-interval", o->val_check_interval_s, &o->val_check_interval))
        return FG_EXIT_USAGE;
    fg_batches *v = &o->val_check_interval;
    if (v->kind == FG_BATCHES_COUNT && v->value == 0) {
        /* fulgur's 0: only at the end; a count no run reaches */
        o->val_end_only = true;
        *v = FG_COUNT(INT64_MAX / 4);
        o->check_val_every_n_epoch = -1;
    } else if (v->kind == FG_BATCHES_FRACTION && v->value == 0) {
        cli_error("--val-check-interval=%s: a fraction must be above 0 (0: at the end only)",
                  o->val_check_interval_s);
        return FG_EXIT_USAGE;
    }
    /* a count of batches counts across epochs (Lightning's
     * check_val_every_n_epoch=None), unless told otherwise */
    if (!o->check_val_every_n_epoch && v->kind == FG_BATCHES_COUNT) o->check_val_every_n_epoch = -1;
    if (o->max_time_s && fg_trainer_parse_duration(o->max_time_s, &o->max_time) != FG_OK) {
        cli_error("--max-time=\"%s\": expected DD:HH:MM:SS (or HH:MM:SS, MM:SS, seconds)",
                  o->max_time_s);
        return FG_EXIT_USAGE;
    }
    if (o->early_stopping_patience > 0 && !o->monitor) {
        cli_error("--early-stopping-patience needs --monitor: the metric to watch (val_loss)");
        return FG_EXIT_USAGE;
    }
    if (o->early_stopping_min_delta < 0) {
        cli_error("--early-stopping-min-delta=%g: expected a number >= 0",
                  o->early_stopping_min_delta);
        return FG_EXIT_USAGE;
    }
    char list[256];
    snprintf(list, sizeof list, "%s", o->logger);
    for (char *save, *w = strtok_r(list, ",", &save); w; w = strtok_r(NULL, ",", &save))
        if (strcmp(w, "none") && strcmp(w, "csv") && strcmp(w, "tensorboard")) {
            cli_error("--logger=\"%s\": \"%s\" is none of csv, tensorboard (a list: "
                      "csv,tensorboard; none: no logger)",
                      o->logger, w);
            return FG_EXIT_USAGE;
        }
    return 0;
}

int fit_args_parse(fit_opts *o, fg_trainer_fn fn, int argc, char **argv) {
    memset(o, 0, sizeof *o);
    o->fn = fn;
    const char *usage = usage_of(fn);
    cli_flag flags[128]; /* build_flags does not bound-check: room for the table to grow */
    int n = build_flags(o, flags);
    int rc = fit_config_expand(flags, n, &argc, &argv);
    if (!rc) rc = cli_flags_parse(flags, n, argc, argv, usage, NULL, 0, NULL);
    if (rc) return rc;
    if (o->print_config) {
        fit_config_print(stdout, flags, n);
        return -1;
    }
    o->ckpt_every_given = cli_flag_given(cli_flags_find(flags, n, "every-n-train-steps"));
    if ((rc = sharded_args(o, flags, n))) return rc;
    if ((rc = hook_args(o, flags, n))) return rc;
    if ((rc = fit_bagua_args(o, flags, n))) return rc;
    if ((rc = trainer_args(o))) return rc;
    if (!o->enable_progress_bar) o->progress = "none";
    o->kind = !strcmp(o->model, "mlp") ? FIT_MLP : FIT_GPT;
    if (o->activation_checkpointing && o->kind != FIT_GPT) {
        cli_error("--activation-checkpointing recomputes a gpt's blocks; --model mlp has none");
        return FG_EXIT_USAGE;
    }
    o->on_nonfinite_skip = !strcmp(o->on_nonfinite, "skip");
    if (!o->data) {
        cli_error("--data is required: a text file or folder, a .bin token file, or (mlp) a .npy");
        return FG_EXIT_USAGE;
    }
    if (!file_exists("data", o->data, o->kind == FIT_GPT)) return FG_EXIT_USAGE;
    if (o->val_data && !file_exists("val-data", o->val_data, o->kind == FIT_GPT))
        return FG_EXIT_USAGE;
    if (o->kind == FIT_MLP) {
        if (!ends_with(o->data, ".npy")) {
            cli_error("--data=\"%s\": mlp reads .npy inputs (with --labels Y.npy)", o->data);
            return FG_EXIT_USAGE;
        }
        if (!o->labels) {
            cli_error("--labels is required with --model mlp: a .npy of integer labels (N,)");
            return FG_EXIT_USAGE;
        }
        if (!file_exists("labels", o->labels, false)) return FG_EXIT_USAGE;
        if (o->val_data && !o->val_labels) {
            cli_error("--val-data needs --val-labels with --model mlp");
            return FG_EXIT_USAGE;
        }
        if (o->val_labels && !file_exists("val-labels", o->val_labels, false)) return FG_EXIT_USAGE;
    } else {
        const char *bad = o->labels ? "labels" : o->val_labels ? "val-labels" : NULL;
        if (bad) {
            cli_error("--%s is for --model mlp; gpt's targets are the next tokens", bad);
            return FG_EXIT_USAGE;
        }
        if (o->embd % o->heads) {
            cli_error("--heads=%lld must divide --embd=%lld", (long long)o->heads,
                      (long long)o->embd);
            return FG_EXIT_USAGE;
        }
    }
    if (!(o->val_fraction >= 0 && o->val_fraction < 1)) {
        cli_error("--val-fraction=%g: expected a number in [0, 1)", o->val_fraction);
        return FG_EXIT_USAGE;
    }
    if (o->deterministic && o->dropout > 0) {
        cli_error("--deterministic with --dropout=%g: dropout draws its masks per rank, so the "
                  "weights would depend on the number of devices; use --dropout 0",
                  o->dropout);
        return FG_EXIT_USAGE;
    }
    if (!(o->dropout >= 0 && o->dropout < 1)) {
        cli_error("--dropout=%g: expected a number in [0, 1)", o->dropout);
        return FG_EXIT_USAGE;
    }
    if (!(o->lr > 0)) {
        cli_error("--lr=%g: expected a positive number", o->lr);
        return FG_EXIT_USAGE;
    }
    if (o->clip < 0 || o->weight_decay < 0 || o->momentum < 0 || o->momentum >= 1 ||
        o->min_lr_ratio < 0 || o->min_lr_ratio > 1) {
        const char *f = o->clip < 0                             ? "gradient-clip-val"
                        : o->weight_decay < 0                   ? "weight-decay"
                        : (o->momentum < 0 || o->momentum >= 1) ? "momentum"
                                                                : "min-lr-ratio";
        cli_error("--%s: out of range (clip and weight decay >= 0, momentum in [0, 1), "
                  "min-lr-ratio in [0, 1])",
                  f);
        return FG_EXIT_USAGE;
    }
    if (o->test_data && !file_exists("test-data", o->test_data, o->kind == FIT_GPT))
        return FG_EXIT_USAGE;
    if (o->test_labels && !file_exists("test-labels", o->test_labels, false)) return FG_EXIT_USAGE;
    if (o->kind == FIT_MLP && o->test_data && !o->test_labels) {
        cli_error("--test-data needs --test-labels with --model mlp");
        return FG_EXIT_USAGE;
    }
    if (o->predict_data && !file_exists("predict-data", o->predict_data, o->kind == FIT_GPT))
        return FG_EXIT_USAGE;
    if (o->kind == FIT_MLP && o->predict_data && !o->labels) {
        cli_error("--predict-data with --model mlp reads its .npy through --labels' "
                  "shape: give --labels too");
        return FG_EXIT_USAGE;
    }
    if (fn == FG_FIT && o->max_steps < 0 && o->max_epochs < 0) {
        cli_error("--max-steps=-1 and --max-epochs=-1: the run would never end; set one");
        return FG_EXIT_USAGE;
    }
    if (fn == FG_FIT && (o->max_steps == 0 || o->max_epochs == 0)) {
        cli_error("--%s=0: nothing to train", o->max_steps == 0 ? "max-steps" : "max-epochs");
        return FG_EXIT_USAGE;
    }
    /* run folder and checkpoint folder */
    static char root_buf[4096];
    if (!strcmp(o->root_dir, "runs/MODEL")) {
        snprintf(root_buf, sizeof root_buf, "runs/%s", o->model);
        o->root_dir = root_buf;
    }
    if (!o->ckpt_dir) {
        snprintf(o->ckpt_dir_buf, sizeof o->ckpt_dir_buf, "%s/checkpoints", o->root_dir);
        o->ckpt_dir = o->ckpt_dir_buf;
    }
    if (!o->predictions) {
        static char pred_buf[4200];
        snprintf(pred_buf, sizeof pred_buf, "%s/predictions.csv", o->root_dir);
        o->predictions = pred_buf;
    }
    /* the checkpoint (last, best or a path) is resolved by the trainer's
     * rules once it exists (fit_run_new), before any rank starts */
    if (fn != FG_FIT) return 0;
    if (o->save_top_k == 0) {
        cli_error("--save-top-k=0: would keep no checkpoint to resume from; give N >= 1, or -1 "
                  "to keep all");
        return FG_EXIT_USAGE;
    }
    /* A restarted job (fulgur run --max-restarts, torchrun, a requeued SLURM
     * job) continues from its newest complete checkpoint by itself, with the
     * command line unchanged; without a checkpoint yet it starts afresh. */
    static const char *const k_restart[] = {"FULGUR_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT",
                                            "SLURM_RESTART_COUNT"};
    for (size_t i = 0; i < sizeof k_restart / sizeof k_restart[0] && !o->restart_count; i++) {
        int64_t count; /* a malformed count is an error, not a fresh start */
        if (!cli_env_int(k_restart[i], 0, &count)) return FG_EXIT_USAGE;
        if (count > 0) o->restart_count = count;
    }
    char last_link[4200];
    struct stat lst;
    snprintf(last_link, sizeof last_link, "%s/%s", o->ckpt_dir, CKPT_LAST_NAME);
    if (!o->resume && o->restart_count > 0 && lstat(last_link, &lst) == 0) o->resume = "last";
    return 0;
}
