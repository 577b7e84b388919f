/* fulgur fit's flags: the table (names after Lightning's Trainer), their
 * defaults, and every check that can be made before a rank starts, so that a
 * typo costs exit code 2 and one line, not a launched job. Accelerator,
 * devices, strategy, precision and num-nodes are checked by fg_fabric_new in
 * cmd_fit.c (the launch layer's plan, as `fulgur env` makes it), and so are
 * the sharded strategies' options; here only that they parse and go with a
 * sharded strategy. */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_paths.h"
#include "cli_flags.h"
#include "fit_config.h"
#include "fit_model.h"
#include "fit_net.h"

static const char *const k_models[] = {"gpt", "mlp", "resnet", "vit", "lstm", "sequential", NULL};
static const char *const k_layouts[] = {"cifar", "imagenet", NULL};
static const char *const k_optims[] = {"adamw", "adam", "sgd", "rmsprop", "adagrad", "lion", NULL};
/* PyTorch's scheduler classes in lower case (LightningCLI's class_path
 * torch.optim.lr_scheduler.StepLR reads as steplr), and fulgur's own two */
static const char *const k_scheds[] = {"warmup-cosine",
                                       "constant",
                                       "steplr",
                                       "multisteplr",
                                       "exponentiallr",
                                       "cosineannealinglr",
                                       "cosineannealingwarmrestarts",
                                       "onecyclelr",
                                       "linearlr",
                                       "reducelronplateau",
                                       "sequentiallr",
                                       "chainedscheduler",
                                       NULL};
static const char *const k_intervals[] = {"epoch", "step", NULL};
static const char *const k_threshold_modes[] = {"rel", "abs", NULL};
static const char *const k_readers[] = {"auto",   "npy",         "csv", "text",
                                        "tokens", "imagefolder", NULL};
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
static const char *const k_state_dict[] = {"auto", "full", "sharded", NULL};
static const char *const k_clip[] = {"norm", "value", NULL};
static const char *const k_modes[] = {"min", "max", NULL};
static const char *const k_log_lr[] = {"none", "auto", "step", "epoch", NULL};
static const char *const k_compression[] = {"none", "fp16", "8-bit", NULL};

static const char *usage_of(fg_trainer_fn fn) {
    switch (fn) {
    case FG_VALIDATE: return "fulgur validate --data PATH [--ckpt-path last|best|PATH] [FLAGS]";
    case FG_TEST:
        return "fulgur test --data PATH [--test-data PATH] [--ckpt-path last|best|PATH] [FLAGS]";
    case FG_PREDICT:
        return "fulgur predict --data PATH [--predict-data PATH] [--predictions OUT.csv] "
               "[--ckpt-path last|best|PATH] [FLAGS]";
    default:
        return "fulgur fit --model {gpt,mlp,resnet,vit,lstm} --data PATH [--val-data PATH] [FLAGS]";
    }
}

/* The strategy and precision lists of --help, printed from their tables
 * (kinds.h) so that help says what this fulgur runs: filled by
 * fit_args_parse before the table is used. */
static char k_strategy_help[1280], k_precision_help[256];

#define O(field) offsetof(fit_opts, field)
/* The flag table of fit, validate, test and predict, over a fit_opts. Kept
 * in one place so that --help shows every flag. */
static const cli_flag_def k_flags[] = {
    {.name = "model and data", .type = CLI_SECTION},
    {.name = "model",
     .type = CLI_STR,
     .off = O(model),
     .def = "gpt",
     .choices = k_models,
     .help = "built-in model"},
    {.name = "net",
     .type = CLI_STR,
     .off = O(net),
     .help = "--model sequential: its layers by torch.nn's names, \"Conv2d(in_channels=1, "
             "out_channels=8, kernel_size=3); ReLU(); Flatten(); Linear(in_features=288, "
             "out_features=10)\" (or the YAML model: section's layers list); data as mlp's"},
    {.name = "data",
     .type = CLI_STR,
     .off = O(data),
     .help = "training data (required): a text file or folder (char level), a uint16 token "
             "file .bin (nanoGPT/llm.c), or for mlp a .npy of inputs (N, D...)"},
    {.name = "labels",
     .type = CLI_STR,
     .off = O(labels),
     .help = "mlp: a .npy of integer labels (N,) for --data"},
    {.name = "reader",
     .type = CLI_STR,
     .off = O(reader),
     .def = "auto",
     .choices = k_readers,
     .help = "how --data is read: auto (by its name), npy, csv (CSV/TSV, gzip too: mlp), "
             "imagefolder (root/<class>/<image>.png|jpg: mlp, resnet, vit, sequential), text, "
             "tokens (gpt)"},
    {.name = "image-size",
     .type = CLI_INT,
     .off = O(image_size),
     .def = "0",
     .min = 0,
     .max = 65536,
     .help = "imagefolder: Resize(n) then CenterCrop(n) (0: the images as they are, one size)"},
    {.name = "random-flip",
     .type = CLI_BOOL,
     .off = O(random_flip),
     .help = "imagefolder: RandomHorizontalFlip on the training images, new each epoch"},
    {.name = "label-column",
     .type = CLI_STR,
     .off = O(label_column),
     .help = "csv: the label column (default the last): integers or categories"},
    {.name = "no-header",
     .type = CLI_BOOL,
     .off = O(no_header),
     .help = "csv: the first row is data; the columns are \"0\", \"1\", ... (the label the last)"},
    {.name = "feature-columns",
     .type = CLI_STR,
     .off = O(feature_columns),
     .help = "csv: the input columns, in order, comma-separated (default every other column)"},
    {.name = "val-data",
     .type = CLI_STR,
     .off = O(val_data),
     .help = "validation data in the same form (default: the last --val-fraction of --data)"},
    {.name = "val-labels",
     .type = CLI_STR,
     .off = O(val_labels),
     .help = "mlp: labels .npy for --val-data"},
    {.name = "val-fraction",
     .type = CLI_DOUBLE,
     .off = O(val_fraction),
     .def = "0.1",
     .help = "share of --data held out for validation when --val-data is not given"},
    {.name = "gpt shape", .type = CLI_SECTION},
    {.name = "layers",
     .type = CLI_INT,
     .off = O(layers),
     .def = "4",
     .min = 1,
     .max = 1024,
     .help = "transformer blocks"},
    {.name = "heads",
     .type = CLI_INT,
     .off = O(heads),
     .def = "4",
     .min = 1,
     .max = 1024,
     .help = "attention heads (must divide --embd)"},
    {.name = "embd",
     .type = CLI_INT,
     .off = O(embd),
     .def = "128",
     .min = 1,
     .max = 65536,
     .help = "embedding width"},
    {.name = "ctx",
     .type = CLI_INT,
     .off = O(ctx),
     .def = "128",
     .min = 1,
     .max = 65536,
     .help = "context length (tokens per sample)"},
    {.name = "dropout",
     .type = CLI_DOUBLE,
     .off = O(dropout),
     .def = "0",
     .help = "dropout probability in [0, 1)"},
    {.name = "mlp shape", .type = CLI_SECTION},
    {.name = "hidden",
     .type = CLI_INT,
     .off = O(hidden),
     .def = "128",
     .min = 1,
     .max = 1 << 20,
     .help = "hidden width"},
    {.name = "resnet shape (data as mlp's: .npy images (N, C, H, W) or (N, H*W) with --labels)",
     .type = CLI_SECTION},
    {.name = "depth",
     .type = CLI_INT,
     .off = O(depth),
     .def = "20",
     .min = 8,
     .max = 152,
     .help = "resnet depth: cifar 18 or 6n+2 (20, 32, 44, 56); imagenet 18, 34, 50, 101, 152"},
    {.name = "width",
     .type = CLI_INT,
     .off = O(width),
     .def = "0",
     .min = 0,
     .max = 4096,
     .help = "resnet: the first stage's channels (0: 16 for 6n+2, else 64)"},
    {.name = "resnet-layout",
     .type = CLI_STR,
     .off = O(resnet_layout),
     .def = "cifar",
     .choices = k_layouts,
     .help = "resnet: cifar (3x3 stem) or imagenet (7x7 stem, max pool)"},
    {.name = "in-channels",
     .type = CLI_INT,
     .off = O(in_channels),
     .def = "0",
     .min = 0,
     .max = 4096,
     .help = "resnet: image channels (0: the first dim of 3-d samples, else 1)"},
    {.name = "patch-size",
     .type = CLI_INT,
     .off = O(patch_size),
     .def = "4",
     .min = 1,
     .max = 4096,
     .help = "vit: patch side (divides the image side); vit also takes --layers, "
             "--heads, --embd (hidden_dim), --hidden (mlp_dim), --in-channels"},
    {.name = "sync-batchnorm",
     .type = CLI_BOOL,
     .off = O(sync_batchnorm),
     .help = "batch norm statistics over every rank's batch (Lightning's sync_batchnorm)"},
    {.name = "devices (Lightning's Trainer arguments)", .type = CLI_SECTION},
    {.name = "accelerator",
     .type = CLI_STR,
     .off = O(accelerator),
     .def = "auto",
     .help = "auto, cpu (gpu/cuda: not built in)"},
    {.name = "devices",
     .type = CLI_STR,
     .off = O(devices),
     .def = "auto",
     .help = "ranks on this node: auto (1, or the launcher's), N, -1 (one per CPU device), or "
             "ids \"0,2\" / \"[0, 2]\""},
    {.name = "strategy",
     .type = CLI_STR,
     .off = O(strategy),
     .def = "auto",
     .help = k_strategy_help},
    {.name = "sharding-strategy",
     .type = CLI_STR,
     .off = O(sharding_strategy),
     .help = "fsdp: FULL_SHARD (the default, = deepspeed_stage_3), SHARD_GRAD_OP (= "
             "deepspeed_stage_2), NO_SHARD (= ddp), HYBRID_SHARD (full shard in a node)"},
    {.name = "auto-wrap-min-params",
     .type = CLI_INT,
     .off = O(min_num_params),
     .def = "0",
     .min = 0,
     .max = INT64_MAX / 2,
     .help = "stage 3: the smallest modules with at least this many parameters are the units "
             "(0: one per transformer block)"},
    {.name = "auto-wrap-policy",
     .type = CLI_STR,
     .off = O(wrap_policy),
     .help = "stage 3: the module type whose modules are the units (Lightning's "
             "auto_wrap_policy={Block}; gpt: Block, Linear, ...) [default: Block]"},
    {.name = "hybrid-shard-size",
     .type = CLI_INT,
     .off = O(hybrid_shard_size),
     .def = "0",
     .min = 0,
     .max = 1 << 20,
     .help = "HYBRID_SHARD: ranks per shard group (0: the ranks of a node)"},
    {.name = "reduce-bucket-size",
     .type = CLI_INT,
     .off = O(reduce_bucket_size),
     .def = "0",
     .min = 0,
     .max = INT64_MAX / 2,
     .help = "sharded strategies: elements per gradient reduce-scatter bucket (0: 200000000)"},
    {.name = "allgather-bucket-size",
     .type = CLI_INT,
     .off = O(allgather_bucket_size),
     .def = "0",
     .min = 0,
     .max = INT64_MAX / 2,
     .help = "sharded strategies: elements per parameter all-gather after each step "
             "(0: 200000000)"},
    {.name = "state-dict-type",
     .type = CLI_STR,
     .off = O(state_dict_type),
     .def = "auto",
     .choices = k_state_dict,
     .help = "checkpoints: full (one file, streamed from the shards) or sharded (a folder: a "
             "file per rank and model.safetensors.index.json); auto: sharded under the "
             "deepspeed strategies (DeepSpeed's checkpoints are folders), else full"},
    {.name = "deepspeed-config",
     .type = CLI_STR,
     .off = O(deepspeed_config),
     .help = "deepspeed strategies: a DeepSpeed JSON config; its zero_optimization keys set "
             "the stage and options (a key fulgur does not honour is an error)"},
    {.name = "offload-optimizer-device",
     .type = CLI_STR,
     .off = O(offload_optimizer),
     .help = "deepspeed: cpu (nothing to move on a CPU) or nvme (optimizer state in files under "
             "--nvme-path)"},
    {.name = "offload-params-device",
     .type = CLI_STR,
     .off = O(offload_params),
     .help = "fsdp, deepspeed_stage_3: cpu (nothing to move on a CPU); deepspeed_stage_3: nvme "
             "(the parameter shards in files under --nvme-path)"},
    {.name = "nvme-path",
     .type = CLI_STR,
     .off = O(nvme_path),
     .help = "directory on a local disk for nvme offload"},
    {.name = "activation-checkpointing",
     .type = CLI_BOOL,
     .off = O(activation_checkpointing),
     .help = "gpt: recompute each block's activations in backward (less memory, more compute)"},
    {.name = "partition-activations",
     .type = CLI_BOOL,
     .off = O(partition_activations),
     .help = "deepspeed: split the checkpoints over the model-parallel ranks (none in fulgur: "
             "nothing to partition)"},
    {.name = "cpu-checkpointing",
     .type = CLI_BOOL,
     .off = O(cpu_checkpointing),
     .help = "deepspeed: keep the checkpoints in host memory (on a CPU they are: nothing to "
             "move)"},
    {.name = "ddp-comm-hook",
     .type = CLI_STR,
     .off = O(comm_hook),
     .def = "none",
     .choices = k_hooks,
     .help = "ddp: gradient communication hook (docs/comm-hooks.md)"},
    {.name = "ddp-comm-wrapper",
     .type = CLI_STR,
     .off = O(comm_wrapper),
     .def = "none",
     .choices = k_wrappers,
     .help = "ddp: send the hook's data as fp16 or bf16"},
    {.name = "powersgd-rank",
     .type = CLI_INT,
     .off = O(powersgd_rank),
     .def = "1",
     .min = 1,
     .max = 1 << 20,
     .help = "powersgd: matrix_approximation_rank"},
    {.name = "start-powersgd-iter",
     .type = CLI_INT,
     .off = O(start_powersgd_iter),
     .def = "1000",
     .min = 0,
     .max = INT64_MAX / 2,
     .help = "powersgd: steps of plain ddp before compression starts"},
    {.name = "start-localsgd-iter",
     .type = CLI_INT,
     .off = O(start_localsgd_iter),
     .def = "0",
     .min = 0,
     .max = INT64_MAX / 2,
     .help = "post_localsgd: steps of plain ddp before local SGD starts"},
    {.name = "localsgd-period",
     .type = CLI_INT,
     .off = O(localsgd_period),
     .def = "4",
     .min = 1,
     .max = INT64_MAX / 2,
     .help = "post_localsgd: average the weights over ranks every N steps"},
    {.name = "bagua-algorithm",
     .type = CLI_STR,
     .off = O(bagua_algorithm),
     .def = "gradient_allreduce",
     .choices = k_bagua,
     .help = "bagua: the algorithm (docs/bagua.md)"},
    {.name = "hierarchical",
     .type = CLI_STR,
     .off = O(hierarchical),
     .def = "auto",
     .choices = k_hier,
     .help = "bagua: inside each node, then across (auto: the algorithm's)"},
    {.name = "peer-selection-mode",
     .type = CLI_STR,
     .off = O(peer_selection_mode),
     .def = "all",
     .choices = k_peer,
     .help = "bagua decentralized: all or shift_one"},
    {.name = "communication-interval",
     .type = CLI_INT,
     .off = O(communication_interval),
     .def = "1",
     .min = 1,
     .max = INT64_MAX / 2,
     .help = "bagua decentralized ones: steps per weight exchange"},
    {.name = "bagua-warmup-steps",
     .type = CLI_INT,
     .off = O(bagua_warmup_steps),
     .def = "-1",
     .min = -1,
     .max = INT64_MAX / 2,
     .help = "bagua qadam / async: Bagua's warmup_steps (-1: 100 for qadam, 0 for async)"},
    {.name = "sync-interval-ms",
     .type = CLI_INT,
     .off = O(sync_interval_ms),
     .def = "500",
     .min = 1,
     .max = INT64_MAX / 2,
     .help = "bagua async: milliseconds between averagings"},
    {.name = "precision",
     .type = CLI_STR,
     .off = O(precision),
     .def = "32-true",
     .help = k_precision_help},
    {.name = "num-nodes",
     .type = CLI_INT,
     .off = O(num_nodes),
     .def = "0",
     .min = 0,
     .max = 65536,
     .help = "machines (launch each with mpirun, srun or fulgur run); 0: 1, or "
             "the launcher's"},
    {.name = "strategy hivemind (Lightning's HivemindStrategy)", .type = CLI_SECTION},
    {.name = "target-batch-size",
     .type = CLI_INT,
     .off = O(hivemind.target_batch_size),
     .def = "0",
     .min = 0,
     .max = INT64_MAX / 2,
     .help = "hivemind: samples of the whole swarm per optimizer step"},
    {.name = "initial-peers",
     .type = CLI_STR,
     .off = O(hivemind.initial_peers),
     .help = "hivemind: host:port[,host:port] of live peers (none: start a "
             "swarm and print its address)"},
    {.name = "run-id",
     .type = CLI_STR,
     .off = O(hivemind.run_id),
     .help = "hivemind: the run's name, the same on every peer"},
    {.name = "run-secret",
     .type = CLI_STR,
     .off = O(hivemind.run_secret),
     .help = "hivemind: the secret every peer of the run shares"},
    {.name = "run-secret-file",
     .type = CLI_STR,
     .off = O(hivemind.run_secret_file),
     .help = "hivemind: a file holding the secret (its first line)"},
    {.name = "matchmaking-time",
     .type = CLI_DOUBLE,
     .off = O(hivemind.matchmaking_time),
     .def = "5",
     .help = "hivemind: seconds a ready peer waits for the others"},
    {.name = "averaging-timeout",
     .type = CLI_DOUBLE,
     .off = O(hivemind.averaging_timeout),
     .def = "30",
     .help = "hivemind: seconds before a silent peer is left out of a round"},
    {.name = "grad-compression",
     .type = CLI_STR,
     .off = O(hivemind.grad_compression),
     .def = "none",
     .choices = k_compression,
     .help = "hivemind: gradient parts on the wire"},
    {.name = "hivemind-host",
     .type = CLI_STR,
     .off = O(hivemind.host),
     .help = "hivemind: the address others reach this peer at (default: "
             "found from the route to the initial peers)"},
    {.name = "min-peers",
     .type = CLI_INT,
     .off = O(hivemind.min_peers),
     .def = "1",
     .min = 1,
     .max = 4096,
     .help = "hivemind: wait at the start until this many peers are live "
             "(fulgur's; Hivemind starts at once)"},
    {.name = "dht-port",
     .type = CLI_INT,
     .off = O(hivemind.dht_port),
     .def = "0",
     .min = 0,
     .max = 65535,
     .help = "hivemind: UDP port of this peer's DHT node (0: any)"},
    {.name = "offload-optimizer",
     .type = CLI_BOOL,
     .off = O(hivemind.offload_optimizer),
     .help = "hivemind: step a master copy of the parameters in host memory, copied into the "
             "model after (Hivemind's offload_optimizer; the CPU)"},
    {.name = "delay-optimizer-step",
     .type = CLI_BOOL,
     .off = O(hivemind.delay_optimizer_step),
     .help = "hivemind: step in the background while the next batches train on the parameters "
             "they have (one epoch stale; needs --offload-optimizer)"},
    {.name = "delay-grad-averaging",
     .type = CLI_BOOL,
     .off = O(hivemind.delay_grad_averaging),
     .help = "hivemind: average the gradients in the background too (needs "
             "--delay-optimizer-step)"},
    {.name = "delay-state-averaging",
     .type = CLI_BOOL,
     .off = O(hivemind.delay_state_averaging),
     .help = "hivemind: average the parameters and optimizer state in the background too "
             "(needs --delay-optimizer-step)"},
    {.name = "reuse-grad-buffers",
     .type = CLI_BOOL,
     .off = O(hivemind.reuse_grad_buffers),
     .help = "hivemind: accumulate in the model's gradient buffer (zero_grad leaves it; no "
             "16-mixed, no --delay-grad-averaging)"},
    {.name = "loop (Lightning's Trainer arguments)", .type = CLI_SECTION},
    {.name = "max-epochs",
     .type = CLI_INT,
     .off = O(max_epochs),
     .def = "-1",
     .min = -1,
     .max = INT64_MAX / 2,
     .help = "stop after this many epochs (-1: no limit)"},
    {.name = "min-epochs",
     .type = CLI_INT,
     .off = O(min_epochs),
     .def = "0",
     .min = 0,
     .max = INT64_MAX / 2,
     .help = "no early stop before this many epochs"},
    {.name = "max-steps",
     .type = CLI_INT,
     .off = O(max_steps),
     .def = "1500",
     .min = -1,
     .max = INT64_MAX / 2,
     .help = "stop after this many optimizer steps (-1: no limit)"},
    {.name = "min-steps",
     .type = CLI_INT,
     .off = O(min_steps),
     .def = "0",
     .min = 0,
     .max = INT64_MAX / 2,
     .help = "no early stop before this many optimizer steps"},
    {.name = "max-time",
     .type = CLI_STR,
     .off = O(max_time_s),
     .help = "stop after this much training time, DD:HH:MM:SS (or HH:MM:SS, MM:SS, seconds); "
             "the checkpoint at the stop resumes"},
    {.name = "fast-dev-run",
     .type = CLI_INT,
     .off = O(fast_dev_run),
     .def = "0",
     .min = 0,
     .max = INT64_MAX / 2,
     .bare = "1",
     .help = "run N batches of training and validation (one epoch), no checkpoints, no "
             "loggers: a quick check that everything runs (0: off; alone: 1)"},
    {.name = "batch-size",
     .type = CLI_INT,
     .off = O(batch_size),
     .def = "16",
     .min = 1,
     .max = 1 << 24,
     .help = "samples per device per micro-batch"},
    {.name = "accumulate-grad-batches",
     .type = CLI_INT,
     .off = O(accumulate),
     .def = "1",
     .min = 1,
     .max = 1 << 20,
     .help = "micro-batches per optimizer step"},
    {.name = "limit-train-batches",
     .type = CLI_STR,
     .off = O(limit_train_s),
     .def = "1.0",
     .help = "training batches per epoch per rank: a count (10) or a fraction of the "
             "epoch (0.25)"},
    {.name = "gradient-clip-val",
     .type = CLI_DOUBLE,
     .off = O(clip),
     .def = "1.0",
     .help = "clip the gradients to this (0: off)"},
    {.name = "gradient-clip-algorithm",
     .type = CLI_STR,
     .off = O(clip_algorithm),
     .def = "norm",
     .choices = k_clip,
     .help = "by the global 2-norm, or each element by value"},
    {.name = "on-nonfinite",
     .type = CLI_STR,
     .off = O(on_nonfinite),
     .def = "stop",
     .choices = k_nonfinite,
     .help = "a non-finite loss or gradient on any rank: stop (naming the step, the tensor and "
             "the last good checkpoint) or skip the optimizer step on every rank (counted)"},
    {.name = "deterministic",
     .type = CLI_BOOL,
     .off = O(deterministic),
     .help = "bitwise the same weights on any number of devices for the same global batch "
             "(one kernel thread per rank; docs/fault-tolerance.md)"},
    {.name = "no-requeue",
     .type = CLI_BOOL,
     .off = O(no_requeue),
     .help = "under SLURM, SIGUSR1 (#SBATCH --signal=SIGUSR1@90) only saves and stops; by "
             "default the job is also requeued (scontrol requeue) and resumes by itself, as "
             "Lightning's auto_requeue"},
    {.name = "detect-anomaly",
     .type = CLI_BOOL,
     .off = O(detect_anomaly),
     .help = "stop at the first non-finite loss or gradient on a rank, after each backward, "
             "naming the batch and the tensor"},
    {.name = "optimizer",
     .type = CLI_STR,
     .off = O(optimizer),
     .def = "adamw",
     .choices = k_optims,
     .help = "adamw, adam, sgd (--momentum, --nesterov), rmsprop (--alpha, --momentum, "
             "--centered), adagrad or lion: PyTorch's (docs/trainer.md)"},
    {.name = "beta1",
     .type = CLI_DOUBLE,
     .off = O(beta1),
     .def = "0",
     .help = "adam/adamw/lion beta1 (0: the optimizer's default, 0.9)"},
    {.name = "beta2",
     .type = CLI_DOUBLE,
     .off = O(beta2),
     .def = "0",
     .help = "adam/adamw/lion beta2 (0: adamw 0.99 as nanoGPT, adam 0.999, lion 0.99)"},
    {.name = "eps",
     .type = CLI_DOUBLE,
     .off = O(eps),
     .def = "0",
     .help = "adam/adamw/rmsprop/adagrad eps (0: the optimizer's default)"},
    {.name = "alpha",
     .type = CLI_DOUBLE,
     .off = O(alpha),
     .def = "0",
     .help = "rmsprop's smoothing constant (0: 0.99)"},
    {.name = "nesterov", .type = CLI_BOOL, .off = O(nesterov), .help = "sgd: Nesterov momentum"},
    {.name = "amsgrad", .type = CLI_BOOL, .off = O(amsgrad), .help = "adam: the AMSGrad variant"},
    {.name = "centered", .type = CLI_BOOL, .off = O(centered), .help = "rmsprop: centered"},
    {.name = "no-decay-norm-bias",
     .type = CLI_BOOL,
     .off = O(no_decay_norm_bias),
     .help = "no weight decay on biases, norm layers and embeddings (every other parameter "
             "decays, vectors included)"},
    {.name = "lr-scheduler",
     .type = CLI_STR,
     .off = O(lr_scheduler),
     .def = "warmup-cosine",
     .choices = k_scheds,
     .help = "warmup-cosine (--warmup-steps, --lr-decay-steps, --min-lr-ratio), constant, or "
             "PyTorch's steplr, multisteplr, exponentiallr, cosineannealinglr, "
             "cosineannealingwarmrestarts, onecyclelr, linearlr, reducelronplateau, "
             "sequentiallr and chainedscheduler (of --lr-schedulers)"},
    {.name = "lr-schedulers",
     .type = CLI_STR,
     .off = O(lr_schedulers_s),
     .help = "sequentiallr's and chainedscheduler's schedulers, in PyTorch's order, separated "
             "by \";\", each a name and its arguments: \"linearlr start-factor=0.1 "
             "total-iters=5; steplr step-size=10\" (sequentiallr: --milestones between them)"},
    {.name = "lr-interval",
     .type = CLI_STR,
     .off = O(lr_interval),
     .def = "epoch",
     .choices = k_intervals,
     .help = "a PyTorch scheduler steps every epoch or every step"},
    {.name = "lr-frequency",
     .type = CLI_INT,
     .off = O(lr_frequency),
     .def = "1",
     .min = 1,
     .max = INT64_MAX / 2,
     .help = "a PyTorch scheduler steps every N epochs or steps (Lightning's lr_scheduler_config "
             "frequency)"},
    {.name = "lr-monitor",
     .type = CLI_STR,
     .off = O(lr_monitor),
     .def = "val_loss",
     .help = "reducelronplateau: the metric it watches"},
    {.name = "lr-mode",
     .type = CLI_STR,
     .off = O(lr_mode),
     .def = "min",
     .choices = k_modes,
     .help = "reducelronplateau: min (the watched value should fall: a loss) or max (rise: an "
             "accuracy)"},
    {.name = "step-size",
     .type = CLI_INT,
     .off = O(step_size),
     .def = "1",
     .min = 1,
     .max = INT64_MAX / 2,
     .help = "steplr: epochs (steps) between decays"},
    {.name = "milestones",
     .type = CLI_STR,
     .off = O(milestones_s),
     .help = "multisteplr: the epochs (steps) where the lr is multiplied by --gamma, "
             "comma-separated (\"30,80\"; a YAML list)"},
    {.name = "gamma",
     .type = CLI_DOUBLE,
     .off = O(gamma),
     .def = "0.1",
     .help = "steplr/multisteplr/exponentiallr: the decay factor"},
    {.name = "t-max",
     .type = CLI_INT,
     .off = O(t_max),
     .def = "0",
     .min = 0,
     .max = INT64_MAX / 2,
     .help = "cosineannealinglr: its period (0: --max-steps or --max-epochs)"},
    {.name = "eta-min",
     .type = CLI_DOUBLE,
     .off = O(eta_min),
     .def = "0",
     .help = "cosineannealinglr/cosineannealingwarmrestarts: the lowest lr"},
    {.name = "t-0",
     .type = CLI_INT,
     .off = O(t_0),
     .def = "0",
     .min = 0,
     .max = INT64_MAX / 2,
     .help = "cosineannealingwarmrestarts: the first period (0: --max-steps or --max-epochs)"},
    {.name = "t-mult",
     .type = CLI_INT,
     .off = O(t_mult),
     .def = "1",
     .min = 1,
     .max = 1 << 20,
     .help = "cosineannealingwarmrestarts: each period is the last one times this"},
    {.name = "max-lr",
     .type = CLI_DOUBLE,
     .off = O(max_lr),
     .def = "0",
     .help = "onecyclelr: the peak lr (0: --lr)"},
    {.name = "pct-start",
     .type = CLI_DOUBLE,
     .off = O(pct_start),
     .def = "0.3",
     .help = "onecyclelr: the share of the steps spent rising"},
    {.name = "start-factor",
     .type = CLI_DOUBLE,
     .off = O(start_factor),
     .def = "0.333333333333",
     .help = "linearlr: the first lr factor (to 1)"},
    {.name = "total-iters",
     .type = CLI_INT,
     .off = O(total_iters),
     .def = "5",
     .min = 1,
     .max = INT64_MAX / 2,
     .help = "linearlr: its length"},
    {.name = "factor",
     .type = CLI_DOUBLE,
     .off = O(factor),
     .def = "0.1",
     .help = "reducelronplateau: the lr factor"},
    {.name = "patience",
     .type = CLI_INT,
     .off = O(patience),
     .def = "10",
     .min = 0,
     .max = INT64_MAX / 2,
     .help = "reducelronplateau: checks without improvement"},
    {.name = "threshold",
     .type = CLI_DOUBLE,
     .off = O(threshold),
     .def = "0.0001",
     .help = "reducelronplateau: the least change that counts as an improvement"},
    {.name = "threshold-mode",
     .type = CLI_STR,
     .off = O(threshold_mode),
     .def = "rel",
     .choices = k_threshold_modes,
     .help = "reducelronplateau: rel (a share of the best) or abs (a difference)"},
    {.name = "cooldown",
     .type = CLI_INT,
     .off = O(cooldown),
     .def = "0",
     .min = 0,
     .max = INT64_MAX / 2,
     .help = "reducelronplateau: checks to wait after a cut before counting again"},
    {.name = "min-lr",
     .type = CLI_DOUBLE,
     .off = O(min_lr),
     .def = "0",
     .help = "reducelronplateau: the lr it never cuts below"},
    {.name = "lr", .type = CLI_DOUBLE, .off = O(lr), .def = "2e-3", .help = "peak learning rate"},
    {.name = "warmup-steps",
     .type = CLI_INT,
     .off = O(warmup_steps),
     .def = "100",
     .min = 0,
     .max = INT64_MAX / 2,
     .help = "linear warm-up steps, then cosine decay"},
    {.name = "lr-decay-steps",
     .type = CLI_INT,
     .off = O(lr_decay_steps),
     .def = "0",
     .min = 0,
     .max = INT64_MAX / 2,
     .help = "cosine decay ends at this step (0: --max-steps)"},
    {.name = "min-lr-ratio",
     .type = CLI_DOUBLE,
     .off = O(min_lr_ratio),
     .def = "0.1",
     .help = "the cosine ends at lr x this"},
    {.name = "weight-decay",
     .type = CLI_DOUBLE,
     .off = O(weight_decay),
     .def = "0.1",
     .help = "AdamW's decoupled weight decay (matrices only) / SGD's L2"},
    {.name = "momentum",
     .type = CLI_DOUBLE,
     .off = O(momentum),
     .def = "0.9",
     .help = "SGD momentum"},
    {.name = "seed",
     .type = CLI_INT,
     .off = O(seed),
     .def = "1337",
     .min = 0,
     .max = INT64_MAX,
     .help = "seed of the weights, the data order and dropout"},
    {.name = "num-workers",
     .type = CLI_INT,
     .off = O(num_workers),
     .def = "1",
     .min = 0,
     .max = 64,
     .help = "data loader threads per rank"},
    {.name = "validation", .type = CLI_SECTION},
    {.name = "val-check-interval",
     .type = CLI_STR,
     .off = O(val_check_interval_s),
     .def = "250",
     .help = "validate every N training batches, or a fraction of each epoch (0.25), and at "
             "the end (0: at the end only)"},
    {.name = "check-val-every-n-epoch",
     .type = CLI_INT,
     .off = O(check_val_every_n_epoch),
     .def = "0",
     .min = -1,
     .max = INT64_MAX / 2,
     .help = "validate in every N-th epoch; -1: count --val-check-interval batches across "
             "epochs (0: -1 when --val-check-interval is a count, else 1)"},
    {.name = "limit-val-batches",
     .type = CLI_STR,
     .off = O(limit_val_s),
     .def = "20",
     .help = "batches per rank per validation: a count or a fraction (1.0: all; 0: none)"},
    {.name = "num-sanity-val-steps",
     .type = CLI_INT,
     .off = O(num_sanity_val_steps),
     .def = "2",
     .min = -1,
     .max = INT64_MAX / 2,
     .help = "validation batches run before training (-1: all; none when resuming)"},
    {.name = "checkpoints and output", .type = CLI_SECTION},
    {.name = "default-root-dir",
     .type = CLI_STR,
     .off = O(root_dir),
     .def = "runs/MODEL",
     .help = "the run's folder: the loggers' lightning_logs/, and checkpoints/ unless "
             "--ckpt-dir"},
    {.name = "ckpt-dir",
     .type = CLI_STR,
     .off = O(ckpt_dir),
     .help = "checkpoint folder [default: DEFAULT_ROOT_DIR/checkpoints]"},
    {.name = "every-n-train-steps",
     .alias = "ckpt-every",
     .type = CLI_INT,
     .off = O(ckpt_every),
     .def = "500",
     .min = 0,
     .max = INT64_MAX / 2,
     .help = "save a checkpoint every N optimizer steps; always at the end (0: only there); "
             "with --monitor and not given: at the end of every validation, as Lightning"},
    {.name = "monitor",
     .type = CLI_STR,
     .off = O(monitor),
     .help = "the metric that ranks checkpoints for --save-top-k and that "
             "--early-stopping-patience watches (val_loss)"},
    {.name = "mode",
     .type = CLI_STR,
     .off = O(mode),
     .def = "min",
     .choices = k_modes,
     .help = "whether a lower or a higher --monitor is better"},
    {.name = "save-top-k",
     .type = CLI_INT,
     .off = O(save_top_k),
     .def = "-1",
     .min = -1,
     .max = INT64_MAX / 2,
     .help = "keep the best N checkpoints by --monitor, or without one the newest N (-1: "
             "keep all)"},
    {.name = "save-last",
     .type = CLI_BOOL,
     .off = O(save_last),
     .def = "true",
     .help = "last.safetensors: a link to the newest checkpoint (Lightning's save_last=\"link\"), "
             "which --ckpt-path last reads"},
    {.name = "early-stopping-patience",
     .type = CLI_INT,
     .off = O(early_stopping_patience),
     .def = "0",
     .min = 0,
     .max = INT64_MAX / 2,
     .help = "stop after N validations without an improvement of --monitor (0: no "
             "EarlyStopping)"},
    {.name = "early-stopping-min-delta",
     .type = CLI_DOUBLE,
     .off = O(early_stopping_min_delta),
     .def = "0",
     .help = "the least change of --monitor that counts as an improvement"},
    {.name = "ckpt-path",
     .alias = "resume",
     .type = CLI_STR,
     .off = O(resume),
     .help = "fit: continue from a checkpoint file, a folder, or \"last\" (the newest in "
             "--ckpt-dir); validate/test/predict: the weights to use: last, best or a path "
             "[default there: last]"},
    {.name = "logger",
     .type = CLI_STR,
     .off = O(logger),
     .def = "csv",
     .help = "Lightning's loggers, comma-separated: csv (metrics.csv, hparams.yaml), "
             "tensorboard (event files), all in one DEFAULT_ROOT_DIR/lightning_logs/version_N "
             "per run; none: no logger"},
    {.name = "logger-save-dir",
     .type = CLI_STR,
     .off = O(logger_save_dir),
     .help = "the loggers' save_dir (Lightning's logger init_args) [default: DEFAULT_ROOT_DIR]"},
    {.name = "logger-name",
     .type = CLI_STR,
     .off = O(logger_name),
     .help = "the loggers' name, the folder under the save_dir (\"\": none) [default: "
             "lightning_logs]"},
    {.name = "logger-version",
     .type = CLI_STR,
     .off = O(logger_version),
     .help = "the loggers' run folder [default: version_N, the next free N]"},
    {.name = "log-lr",
     .type = CLI_STR,
     .off = O(log_lr),
     .def = "none",
     .choices = k_log_lr,
     .help = "LearningRateMonitor: log the learning rate as lr-<Optimizer> every step (step), "
             "epoch (epoch) or as the schedule steps (auto); none: no monitor"},
    {.name = "log-every-n-steps",
     .alias = "log-every",
     .type = CLI_INT,
     .off = O(log_every),
     .def = "10",
     .min = 1,
     .max = INT64_MAX / 2,
     .help = "logger row and progress line every N steps"},
    {.name = "progress",
     .type = CLI_STR,
     .off = O(progress),
     .def = "auto",
     .choices = k_progress,
     .help = "auto: a bar on a terminal, lines otherwise"},
    {.name = "enable-progress-bar",
     .type = CLI_BOOL,
     .off = O(enable_progress_bar),
     .def = "true",
     .help = "false: no progress display (--progress none)"},
    {.name = "enable-checkpointing",
     .type = CLI_BOOL,
     .off = O(enable_checkpointing),
     .def = "true",
     .help = "false: no checkpoint at all (no ModelCheckpoint; nothing to resume)"},
    {.name = "sample-tokens",
     .type = CLI_INT,
     .off = O(sample_tokens),
     .def = "200",
     .min = 0,
     .max = 1 << 20,
     .help = "gpt: characters generated at the end"},
    {.name = "validate, test, predict", .type = CLI_SECTION},
    {.name = "test-data",
     .type = CLI_STR,
     .off = O(test_data),
     .help = "test: the data to test on (default: the validation data)"},
    {.name = "test-labels",
     .type = CLI_STR,
     .off = O(test_labels),
     .help = "test, mlp: labels .npy for --test-data"},
    {.name = "predict-data",
     .type = CLI_STR,
     .off = O(predict_data),
     .help = "predict: the inputs (default: the validation data)"},
    {.name = "predictions",
     .type = CLI_STR,
     .off = O(predictions),
     .help = "predict: the CSV written (index and class, or next token) [default: "
             "DEFAULT_ROOT_DIR/predictions.csv]"},
    {.name = "limit-test-batches",
     .type = CLI_STR,
     .off = O(limit_test_s),
     .def = "1.0",
     .help = "test: batches per rank, a count or a fraction"},
    {.name = "limit-predict-batches",
     .type = CLI_STR,
     .off = O(limit_predict_s),
     .def = "1.0",
     .help = "predict: batches per rank, a count or a fraction"},
    {.name = "config file (LightningCLI's)", .type = CLI_SECTION},
    {.name = "config",
     .type = CLI_STR,
     .off = O(config),
     .help = "read settings from a YAML file with sections trainer:, model:, data:, optimizer: "
             "(keys: these flags' names with underscores); flags given here win over it"},
    {.name = "print-config",
     .type = CLI_BOOL,
     .off = O(print_config),
     .help = "print the merged settings as such a YAML file and exit"},
};
#undef O

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
        /* Open MPI forms the world under mpirun, srun with PMIx and fulgur
         * run's rendezvous (FULGUR_MPI_SERVER), as src/comm/comm.c decides */
        const char *srv = getenv("FULGUR_MPI_SERVER"), *pmix = getenv("PMIX_RANK");
        bool slurm = p->cluster.source && !strcmp(p->cluster.source, "slurm");
        bool mpirun = (p->cluster.source && !strcmp(p->cluster.source, "openmpi")) ||
                      (srv && *srv && p->cluster.num_nodes > 1) ||
                      (slurm && pmix && *pmix && p->cluster.num_nodes > 1);
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
    /* its optimizer and scheduler sections build the run's, as DeepSpeed's
     * engine does: the flags may not say otherwise */
    if (o->deepspeed_config) {
        if (fg_deepspeed_train_read(o->deepspeed_config, &o->ds) != FG_OK) {
            cli_error("--deepspeed-config: %s", fg_last_error());
            return FG_EXIT_USAGE;
        }
        static const char *const opt_flags[] = {"optimizer", "beta1",        "beta2",
                                                "eps",       "weight-decay", NULL};
        static const char *const sched_flags[] = {"lr-scheduler", "warmup-steps", "lr-decay-steps",
                                                  "min-lr-ratio", NULL};
        for (int k = 0; k < 2; k++) {
            bool has = k == 0 ? o->ds.has_optimizer : o->ds.sched != FG_DS_SCHED_NONE;
            for (const char *const *fl = k == 0 ? opt_flags : sched_flags; has && *fl; fl++)
                if (cli_flag_given(cli_flags_find(flags, n, *fl))) {
                    cli_error("--%s and the \"%s\" section of --deepspeed-config=%s both set "
                              "the %s: set it in one place",
                              *fl, k == 0 ? "optimizer" : "scheduler", o->deepspeed_config,
                              k == 0 ? "optimizer" : "learning-rate schedule");
                    return FG_EXIT_USAGE;
                }
        }
        if (o->ds.has_optimizer && cli_flag_given(cli_flags_find(flags, n, "lr"))) {
            cli_error("--lr and the \"optimizer\" section of --deepspeed-config=%s both set the "
                      "learning rate: set it in one place (\"optimizer.params.lr\")",
                      o->deepspeed_config);
            return FG_EXIT_USAGE;
        }
        if (!o->ds.has_optimizer) o->ds.lr = o->lr; /* WarmupCosineLR scales the optimizer's */
    }
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
/* --milestones "30,80" into o->milestones; multisteplr needs it and no
 * other scheduler takes it (PyTorch's MultiStepLR(milestones) has no
 * default). */
static int sched_args(fit_opts *o) {
    bool multi =
        !strcmp(o->lr_scheduler, "multisteplr") || !strcmp(o->lr_scheduler, "sequentiallr");
    if (!o->milestones_s || !*o->milestones_s) {
        if (!multi) return 0;
        cli_error("--lr-scheduler multisteplr needs --milestones: the epochs (steps) where the lr "
                  "is multiplied by --gamma, as \"30,80\"");
        return FG_EXIT_USAGE;
    }
    if (!multi) {
        cli_error("--milestones is for --lr-scheduler multisteplr or sequentiallr (it is %s)",
                  o->lr_scheduler);
        return FG_EXIT_USAGE;
    }
    o->nmilestones = 0;
    for (const char *p = o->milestones_s; *p;) {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 0 || (*end && *end != ',')) {
            cli_error("--milestones=\"%s\": expected integers >= 0 separated by commas, as "
                      "\"30,80\"",
                      o->milestones_s);
            return FG_EXIT_USAGE;
        }
        if (o->nmilestones == (int)(sizeof o->milestones / sizeof o->milestones[0])) {
            cli_error("--milestones=\"%s\": at most %d milestones", o->milestones_s,
                      (int)(sizeof o->milestones / sizeof o->milestones[0]));
            return FG_EXIT_USAGE;
        }
        o->milestones[o->nmilestones++] = v;
        p = *end ? end + 1 : end;
    }
    return 0;
}

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

/* --lr-schedulers: each item's options are the run's with the item's
 * scheduler arguments parsed over their defaults, as a command line of
 * its own ("--lr-scheduler=steplr --step-size=2"); what an item does not
 * set that is not a scheduler's (the interval, the steps, the lr) is the
 * run's. The items and their text live as long as the process (the
 * options point into them). */
#define MAX_LR_SUBS 8
static fit_opts g_lr_subs[MAX_LR_SUBS];
static char g_lr_subs_text[4096];

static int sub_sched_args(fit_opts *o) {
    bool seq = !strcmp(o->lr_scheduler, "sequentiallr");
    bool composite = seq || !strcmp(o->lr_scheduler, "chainedscheduler");
    bool given = o->lr_schedulers_s && *o->lr_schedulers_s;
    o->nlr_subs = 0;
    o->lr_subs = NULL;
    if (!composite && !given) return 0;
    if (!composite) {
        cli_error("--lr-schedulers is for --lr-scheduler sequentiallr or chainedscheduler (it is "
                  "%s)",
                  o->lr_scheduler);
        return FG_EXIT_USAGE;
    }
    if (!given) {
        cli_error("--lr-scheduler %s needs --lr-schedulers: the schedulers it composes, as "
                  "\"linearlr start-factor=0.1 total-iters=5; steplr step-size=10\"",
                  o->lr_scheduler);
        return FG_EXIT_USAGE;
    }
    if (strlen(o->lr_schedulers_s) >= sizeof g_lr_subs_text) {
        cli_error("--lr-schedulers: longer than %zu characters", sizeof g_lr_subs_text - 1);
        return FG_EXIT_USAGE;
    }
    /* the scheduler arguments an item may set: the flags of lr_scheduler:
     * less the composite's own (interval, frequency, monitor) */
    static const char *const k_item[] = {"step-size", "milestones",   "gamma",       "t-max",
                                         "eta-min",   "t-0",          "t-mult",      "max-lr",
                                         "pct-start", "start-factor", "total-iters", NULL};
    snprintf(g_lr_subs_text, sizeof g_lr_subs_text, "%s", o->lr_schedulers_s);
    enum { n = CLI_COUNT(k_flags) };
    char *save = NULL;
    for (char *item = strtok_r(g_lr_subs_text, ";", &save); item;
         item = strtok_r(NULL, ";", &save)) {
        int k = o->nlr_subs;
        if (k == MAX_LR_SUBS) {
            cli_error("--lr-schedulers: at most %d schedulers", MAX_LR_SUBS);
            return FG_EXIT_USAGE;
        }
        /* "steplr step-size=2 gamma=0.5" as "--lr-scheduler=steplr --step-size=2 ..." */
        char *av[32], args[32][160];
        int ac = 0;
        av[ac++] = "fit";
        char *s2 = NULL;
        for (char *w = strtok_r(item, " \t", &s2); w; w = strtok_r(NULL, " \t", &s2)) {
            if (ac == 32) {
                cli_error("--lr-schedulers: scheduler %d: too many arguments", k);
                return FG_EXIT_USAGE;
            }
            if (ac == 1) snprintf(args[ac], sizeof args[ac], "--lr-scheduler=%s", w);
            else {
                char key[64];
                const char *eq = strchr(w, '=');
                size_t kl = eq ? (size_t)(eq - w) : strlen(w);
                snprintf(key, sizeof key, "%.*s", (int)(kl < 63 ? kl : 63), w);
                for (char *c = key; *c; c++)
                    if (*c == '_') *c = '-';
                bool ok = eq != NULL;
                for (const char *const *a = k_item; ok && *a && strcmp(*a, key); a++)
                    if (!a[1]) ok = false;
                if (!ok) {
                    int bd = 99;
                    const char *best = k_item[0];
                    for (const char *const *a = k_item; *a; a++) {
                        int d = cli_edit_distance(key, *a);
                        if (d < bd) bd = d, best = *a;
                    }
                    cli_error("--lr-schedulers: scheduler %d (%s): \"%s\": expected NAME=VALUE "
                              "with NAME a scheduler argument (step-size, milestones, gamma, "
                              "t-max, eta-min, t-0, t-mult, max-lr, pct-start, start-factor, "
                              "total-iters)%s%s%s",
                              k, av[1] + 15, w, bd <= 3 ? "; did you mean " : "",
                              bd <= 3 ? best : "", bd <= 3 ? "?" : "");
                    return FG_EXIT_USAGE;
                }
                snprintf(args[ac], sizeof args[ac], "--%s=%s", key, eq + 1);
            }
            av[ac] = args[ac];
            ac++;
        }
        if (ac == 1) {
            cli_error("--lr-schedulers: scheduler %d is empty (\"%s\")", k, o->lr_schedulers_s);
            return FG_EXIT_USAGE;
        }
        fit_opts *sub = &g_lr_subs[k];
        memset(sub, 0, sizeof *sub);
        cli_flag flags[n];
        cli_flags_bind(k_flags, n, sub, flags);
        int rc = cli_flags_parse(flags, n, ac, av, "--lr-schedulers", NULL, 0, NULL);
        if (rc) {
            cli_error("(in --lr-schedulers, scheduler %d: %s)", k, av[1] + 15);
            return FG_EXIT_USAGE;
        }
        /* av[] is this frame's: the strings the item keeps are copied out */
        for (const char *const *c = k_scheds; *c; c++)
            if (!strcmp(*c, sub->lr_scheduler)) sub->lr_scheduler = *c; /* a choice: one of them */
        if (!strcmp(sub->lr_scheduler, "warmup-cosine") || !strcmp(sub->lr_scheduler, "constant") ||
            !strcmp(sub->lr_scheduler, "reducelronplateau") ||
            !strcmp(sub->lr_scheduler, "sequentiallr") ||
            !strcmp(sub->lr_scheduler, "chainedscheduler")) {
            cli_error("--lr-schedulers: scheduler %d is %s: %s composes PyTorch's schedulers "
                      "(steplr, multisteplr, exponentiallr, cosineannealinglr, "
                      "cosineannealingwarmrestarts, onecyclelr, linearlr), as PyTorch's does",
                      k, sub->lr_scheduler, o->lr_scheduler);
            return FG_EXIT_USAGE;
        }
        if ((rc = sched_args(sub))) return rc;
        sub->milestones_s = NULL;
        sub->lr_interval = o->lr_interval;
        sub->lr_frequency = o->lr_frequency;
        sub->max_steps = o->max_steps;
        sub->max_epochs = o->max_epochs;
        sub->lr = o->lr;
        o->nlr_subs++;
    }
    if (seq && o->nmilestones != o->nlr_subs - 1) {
        cli_error("--lr-scheduler sequentiallr: %d schedulers take %d milestones (--milestones, "
                  "the steps or epochs where the next one starts), not %d",
                  o->nlr_subs, o->nlr_subs - 1, o->nmilestones);
        return FG_EXIT_USAGE;
    }
    if (!seq && o->nmilestones) {
        cli_error("--milestones is not chainedscheduler's: give a multisteplr its own in "
                  "--lr-schedulers (\"multisteplr milestones=5,12\")");
        return FG_EXIT_USAGE;
    }
    o->lr_subs = g_lr_subs;
    return 0;
}

int fit_args_parse(fit_opts *o, fg_trainer_fn fn, int argc, char **argv) {
    memset(o, 0, sizeof *o);
    o->fn = fn;
    const char *usage = usage_of(fn);
    snprintf(k_strategy_help, sizeof k_strategy_help,
             "auto (ddp on several devices, else single), %s (fulgur env: what each launches, "
             "shards and takes)",
             fg_strategy_names());
    snprintf(k_precision_help, sizeof k_precision_help, "%s", fg_precision_available());
    enum { n = CLI_COUNT(k_flags) };
    cli_flag flags[n];
    cli_flags_bind(k_flags, n, o, flags);
    int rc = fit_config_expand(flags, n, &argc, &argv);
    if (!rc) rc = cli_flags_parse(flags, n, argc, argv, usage, NULL, 0, NULL);
    if (rc) return rc;
    if (o->print_config) {
        fit_config_print(stdout, flags, n);
        return -1;
    }
    o->ckpt_every_given = cli_flag_given(cli_flags_find(flags, n, "every-n-train-steps"));
    o->model_given = cli_flag_given(cli_flags_find(flags, n, "model"));
    if ((rc = sharded_args(o, flags, n))) return rc;
    if ((rc = hook_args(o, flags, n))) return rc;
    if ((rc = fit_bagua_args(o, flags, n))) return rc;
    if ((rc = fit_hivemind_args(o, flags, n))) return rc;
    if ((rc = trainer_args(o))) return rc;
    if ((rc = sched_args(o))) return rc;
    if ((rc = sub_sched_args(o))) return rc;
    if (!o->enable_progress_bar) o->progress = "none";
    o->arch = !strcmp(o->model, "resnet") ? FIT_ARCH_RESNET
              : !strcmp(o->model, "lstm") ? FIT_ARCH_LSTM
              : !strcmp(o->model, "vit")  ? FIT_ARCH_VIT
                                          : FIT_ARCH_BASE;
    o->kind = !strcmp(o->model, "mlp") || !strcmp(o->model, "sequential") ||
                      o->arch == FIT_ARCH_RESNET || o->arch == FIT_ARCH_VIT
                  ? FIT_MLP
                  : FIT_GPT;
    bool seq = !strcmp(o->model, "sequential");
    if (seq != (o->net != NULL)) {
        cli_error(seq ? "--model sequential needs --net: its layers (%s)"
                      : "--net is the network of --model sequential (not %s)",
                  seq ? fit_net_layer_names() : o->model);
        return FG_EXIT_USAGE;
    }
    char net_err[512];
    if (seq && !fit_net_check(o->net, net_err, sizeof net_err)) {
        cli_error("--net: %s", net_err);
        return FG_EXIT_USAGE;
    }
    if (o->arch == FIT_ARCH_VIT && o->embd % o->heads) {
        cli_error("--heads=%lld must divide --embd=%lld", (long long)o->heads, (long long)o->embd);
        return FG_EXIT_USAGE;
    }
    if (o->activation_checkpointing && (o->kind != FIT_GPT || o->arch != FIT_ARCH_BASE)) {
        cli_error("--activation-checkpointing recomputes a gpt's blocks; --model mlp has none");
        return FG_EXIT_USAGE;
    }
    o->on_nonfinite_skip = !strcmp(o->on_nonfinite, "skip");
    if (!o->data) {
        cli_error("--data is required: a text file or folder, a .bin token file, or (mlp) a .npy");
        return FG_EXIT_USAGE;
    }
    bool images = !strcmp(o->reader, "imagefolder");
    if (images && o->kind != FIT_MLP) {
        cli_error("--reader imagefolder is a reader of the image classifiers (--model mlp, "
                  "resnet, vit, sequential), not of --model %s",
                  o->model);
        return FG_EXIT_USAGE;
    }
    if (!file_exists("data", o->data, o->kind == FIT_GPT || images)) return FG_EXIT_USAGE;
    if (o->val_data && !file_exists("val-data", o->val_data, o->kind == FIT_GPT || images))
        return FG_EXIT_USAGE;
    if (!images && (o->image_size || o->random_flip)) {
        cli_error("--%s is for --reader imagefolder", o->image_size ? "image-size" : "random-flip");
        return FG_EXIT_USAGE;
    }
    /* the loader's workers may draw the next epoch's first images before
     * on_train_epoch_start sets the flips' epoch: not reproducible there */
    if (o->random_flip && o->num_workers > 0) {
        cli_error("--random-flip with --num-workers %lld: the workers could draw an epoch's "
                  "first flips before the epoch is set, so runs would differ; use "
                  "--num-workers 0",
                  (long long)o->num_workers);
        return FG_EXIT_USAGE;
    }
    bool csv = o->kind == FIT_MLP && fit_is_csv(o, o->data);
    if (!csv && (o->label_column || o->feature_columns)) {
        cli_error("--%s is for CSV/TSV data (--reader csv, or a .csv/.tsv name); --data=\"%s\" "
                  "is not",
                  o->label_column ? "label-column" : "feature-columns", o->data);
        return FG_EXIT_USAGE;
    }
    bool gpt_reader = !strcmp(o->reader, "text") || !strcmp(o->reader, "tokens");
    if ((o->kind == FIT_MLP && gpt_reader) ||
        (o->kind == FIT_GPT && (!strcmp(o->reader, "npy") || !strcmp(o->reader, "csv")))) {
        cli_error("--reader=%s is not a reader of --model %s (mlp: npy, csv; gpt: text, tokens)",
                  o->reader, o->model);
        return FG_EXIT_USAGE;
    }
    if (csv) {
        const char *bad = o->labels ? "labels" : o->val_labels ? "val-labels" : NULL;
        if (bad) {
            cli_error("--%s with CSV data: the file holds the labels (choose the column with "
                      "--label-column)",
                      bad);
            return FG_EXIT_USAGE;
        }
    } else if (images) {
        const char *bad = o->labels ? "labels" : o->val_labels ? "val-labels" : NULL;
        if (bad) {
            cli_error("--%s with --reader imagefolder: the class folders are the labels", bad);
            return FG_EXIT_USAGE;
        }
    } else if (o->kind == FIT_MLP) {
        if (!ends_with(o->data, ".npy")) {
            cli_error("--data=\"%s\": mlp reads .npy inputs (with --labels Y.npy) or CSV/TSV "
                      "(--reader csv)",
                      o->data);
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
        if (o->arch == FIT_ARCH_BASE && o->embd % o->heads) {
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
    if (o->kind == FIT_MLP && o->test_data && !o->test_labels && !fit_is_csv(o, o->test_data)) {
        cli_error("--test-data needs --test-labels with --model mlp");
        return FG_EXIT_USAGE;
    }
    if (o->predict_data && !file_exists("predict-data", o->predict_data, o->kind == FIT_GPT))
        return FG_EXIT_USAGE;
    if (o->kind == FIT_MLP && o->predict_data && !o->labels && !fit_is_csv(o, o->predict_data)) {
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
