/* fulgur kinds: the one table of strategies and the one table of precision
 * settings, low in the stack so that every layer above (launch, strategy,
 * precision, fabric, trainer) and the command ask the same row instead of
 * testing names. Only core below it: the launch layer plans a job from these
 * rows without linking the engine.
 *
 * Strategies (fg_strategy_info, one row per fg_strategy_kind):
 *
 *   kind               launcher  ranks       shards            takes
 *   single             none      one process                   deterministic
 *   dp                 threads   one process                   (replicas on threads)
 *   ddp                re-exec   per device                    hooks, deterministic, buckets
 *   ddp_spawn          fork      per device                    hooks, deterministic, buckets
 *   ddp_fork           fork      per device                    hooks, deterministic, buckets
 *   deepspeed_stage_1  re-exec   per device  optimizer state   sizes, offload, deepspeed
 *   deepspeed_stage_2  re-exec   per device  + gradients       sizes, offload, deepspeed
 *   fsdp               re-exec   per device  by sharding       sizes, cpu offload, sharding,
 *                                            strategy          wrap policy (FULL_SHARD)
 *   bagua              re-exec   per device                    Bagua's algorithms
 *   deepspeed_stage_3  re-exec   per device  + parameters      sizes, offload, wrap policy
 *   ddp2               threads   per node                      (replicas on threads)
 *   horovod            re-exec   per device                    Horovod's options
 *   hivemind           none      one process (a peer of a      Hivemind's options
 *                                swarm, started on its own)
 *
 * "launcher" is the one a job of more than one rank gets when nothing has
 * launched it (launch.h); under mpirun, srun, torchrun or fulgur run the
 * ranks exist already. Names are case-insensitive; each row lists its
 * aliases, some of which turn on an offload as Lightning registers them
 * (deepspeed_stage_2_offload, fsdp_cpu_offload, ...). ddp_sharded and
 * ddp_sharded_spawn, the names of FairScale's sharded DDP in the seeds, are
 * aliases of deepspeed_stage_2: that algorithm is ZeRO stage 2.
 *
 * Precisions (fg_precision_policy, one row per Lightning setting):
 *
 *   setting (alias)     parameters  autocast  gradients    optimizer state
 *   64-true (64)        f64         off       f64          f64
 *   32-true (32)        f32         off       f32          f32
 *   bf16-mixed (bf16)   f32 master  bf16      f32          f32
 *   16-mixed (16)       f32 master  f16       f32, scaled  f32
 *   bf16-true           bf16        bf16      bf16         f32
 *   16-true             f16         f16       f16          f32
 *
 * precision.h holds the rest of the precision layer (autocast, the loss
 * scaler, the kernel path of each setting). Everything here is a constant
 * table: every function is thread-safe. */
#ifndef FULGUR_KINDS_H
#define FULGUR_KINDS_H

#include "fulgur/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ strategies */

typedef enum fg_strategy_kind {
    FG_STRATEGY_SINGLE = 0, /* "single": one rank, one device */
    FG_STRATEGY_DP,         /* "dp": one process; the batch split over worker threads */
    FG_STRATEGY_DDP,        /* "ddp": one process per device (re-exec, or already launched) */
    FG_STRATEGY_DDP_SPAWN,  /* "ddp_spawn": ddp with ranks forked from inside the program */
    FG_STRATEGY_DDP_FORK,   /* "ddp_fork": the same as ddp_spawn here (fork is how fulgur spawns) */
    FG_STRATEGY_DEEPSPEED_STAGE_1, /* "deepspeed_stage_1": ZeRO-1, optimizer state sharded */
    FG_STRATEGY_DEEPSPEED_STAGE_2, /* "deepspeed_stage_2": ZeRO-2, gradients reduce-scattered too */
    FG_STRATEGY_FSDP, /* "fsdp": by fg_sharded_opts.sharding_strategy (FULL_SHARD = stage 3, ...) */
    FG_STRATEGY_BAGUA, /* "bagua": Bagua's algorithms, by fg_ddp_opts.bagua (docs/bagua.md) */
    FG_STRATEGY_DEEPSPEED_STAGE_3, /* "deepspeed_stage_3": ZeRO-3, parameters sharded too */
    FG_STRATEGY_DDP2,     /* "ddp2": one process per node, its cores dp replicas (threads), the
                             gradient averaged across the nodes' processes after each step */
    FG_STRATEGY_HOROVOD,  /* "horovod": one process per device; gradients averaged through
                             Horovod's fusion buffer and cycles (fg_horovod_opts) */
    FG_STRATEGY_HIVEMIND, /* "hivemind": each process a peer of a swarm found through a DHT;
                             gradients averaged when the swarm reaches target_batch_size
                             (fg_hivemind_strategy_opts, docs/hivemind.md) */
    FG_STRATEGY_COUNT
} fg_strategy_kind;

/* FSDP's sharding strategies (torch.distributed.fsdp.ShardingStrategy).
 * FULL_SHARD is the zero value: PyTorch's and Lightning's default. */
typedef enum fg_sharding_strategy {
    FG_SHARDING_FULL_SHARD = 0, /* parameters sharded too (= deepspeed_stage_3) */
    FG_SHARDING_SHARD_GRAD_OP,  /* gradients and optimizer state (= deepspeed_stage_2) */
    FG_SHARDING_NO_SHARD,       /* nothing sharded (= ddp) */
    FG_SHARDING_HYBRID_SHARD, /* full shard in a node (hybrid_shard_size ranks), replicas across */
    FG_SHARDING_COUNT
} fg_sharding_strategy;

/* Where DeepSpeed's offload puts the optimizer state or the parameters
 * (offload_optimizer_device, offload_params_device; FSDP's cpu_offload is
 * cpu for both). docs/sharding.md has the story on a CPU. */
typedef enum fg_offload_device {
    FG_OFFLOAD_NONE = 0, /* not offloaded: where the strategy keeps it */
    FG_OFFLOAD_CPU,      /* host memory: on a CPU that is where everything lives already, so nothing
                            moves (accepted for Lightning's names, and said so) */
    FG_OFFLOAD_NVME,     /* files under nvme_path, streamed in blocks with io_uring at each step */
    FG_OFFLOAD_COUNT
} fg_offload_device;

/* How the ranks of a job are started (launch.h). */
typedef enum fg_launcher {
    FG_LAUNCHER_NONE = 0, /* nothing to start: one rank, or already launched */
    FG_LAUNCHER_REEXEC,   /* ddp: run this program again for local ranks 1..N-1 */
    FG_LAUNCHER_FORK,     /* ddp_spawn/ddp_fork: fg_launch_fork */
    FG_LAUNCHER_THREADS,  /* dp, ddp2: replicas on threads of one process; nothing to start */
} fg_launcher;

/* What a process of a kind is. */
typedef enum fg_strategy_ranks {
    FG_RANKS_ONE_PROCESS = 0, /* the job is one process (single, dp) */
    FG_RANKS_PER_DEVICE,      /* one process per device; the gradients averaged over them */
    FG_RANKS_PER_NODE,        /* one process per node (ddp2), its devices replicas on threads */
} fg_strategy_ranks;

/* What a kind shards over its ranks: bits of fg_strategy_info.shards. */
enum {
    FG_SHARDS_OPTIM_STATE = 1 << 0, /* each rank keeps the optimizer state of its shard */
    FG_SHARDS_GRADS = 1 << 1,       /* the gradients reduce-scattered, each rank its shard */
    FG_SHARDS_PARAMS = 1 << 2,      /* the parameters too, gathered unit by unit (stage 3) */
};

/* What a kind takes: bits of fg_strategy_info.takes. An option a kind does
 * not take is refused before any rank starts (fg_fabric_new, fulgur fit),
 * naming the kinds that take it. */
enum {
    FG_TAKES_COMM_HOOK = 1 << 0,         /* ddp's comm hooks and wrappers (fg_ddp_opts.comm_hook) */
    FG_TAKES_DETERMINISTIC = 1 << 1,     /* Lightning's deterministic: the same bits on any world */
    FG_TAKES_DDP_BUCKETS = 1 << 2,       /* ddp's bucket_cap_mb, find_unused_parameters */
    FG_TAKES_BUCKET_SIZES = 1 << 3,      /* reduce_bucket_size, allgather_bucket_size */
    FG_TAKES_OFFLOAD = 1 << 4,           /* offload of the optimizer state (cpu) */
    FG_TAKES_OFFLOAD_NVME = 1 << 5,      /* ... and to nvme */
    FG_TAKES_OFFLOAD_PARAMS = 1 << 6,    /* offload of the parameters (cpu; nvme with _NVME) */
    FG_TAKES_WRAP_POLICY = 1 << 7,       /* stage 3's units (min_num_params) */
    FG_TAKES_SHARDING_STRATEGY = 1 << 8, /* fsdp's sharding_strategy */
    FG_TAKES_DEEPSPEED = 1 << 9, /* a DeepSpeed config, partition_activations, cpu_checkpointing */
    FG_TAKES_BAGUA = 1 << 10,    /* fg_ddp_opts.bagua */
    FG_TAKES_HOROVOD = 1 << 11,  /* fg_ddp_opts.horovod */
    FG_TAKES_HIVEMIND = 1 << 12, /* fg_ddp_opts.hivemind */
};

/* A name of a kind: the canonical one, or an alias, with the offload the
 * name turns on (Lightning's deepspeed_stage_3_offload: optimizer state and
 * parameters on the cpu). */
typedef struct fg_strategy_alias {
    const char *name;
    fg_offload_device optimizer, params;
} fg_strategy_alias;

#define FG_STRATEGY_ALIASES_MAX 6

/* One row of the table above. */
typedef struct fg_strategy_info {
    const char *name;    /* canonical: "deepspeed_stage_2" */
    const char *summary; /* one line for help and `fulgur env` */
    /* other names, the first `naliases` of the array (plain aliases first) */
    fg_strategy_alias aliases[FG_STRATEGY_ALIASES_MAX];
    int naliases;
    fg_launcher launcher;    /* for a job of more than one rank that nothing launched */
    fg_strategy_ranks ranks; /* what one process is */
    bool replica_threads;    /* replicas of the model on threads of each process (dp, ddp2):
                                training steps run concurrently, one communicator between them */
    unsigned shards;         /* FG_SHARDS_* (fsdp: those of FULL_SHARD; fg_strategy_shards) */
    unsigned takes;          /* FG_TAKES_* (fsdp: see fg_strategy_takes) */
    bool saves_sharded;      /* a checkpoint is by default a folder of a file per rank and an
                                index (state_dict_type auto: DeepSpeed's layout), not one file */
} fg_strategy_info;

/* The row of kind k; NULL for a kind out of range. */
FG_API const fg_strategy_info *fg_strategy_info_of(fg_strategy_kind k);

/* The canonical name of a kind ("ddp_spawn"); "?" if out of range. */
FG_API const char *fg_strategy_kind_name(fg_strategy_kind k);

/* Finds a strategy by name, canonical or alias, any case; "auto" is not a
 * kind (fg_launch_parse_strategy resolves it). *optimizer and *params (each
 * may be NULL) get the offload the name turns on. Errors: FG_EINVAL for NULL
 * or an unknown name, listing every name (fg_strategy_names); *out is set
 * only on FG_OK. */
FG_API FG_MUST_USE fg_status fg_strategy_kind_parse(const char *name, fg_strategy_kind *out,
                                                    fg_offload_device *optimizer,
                                                    fg_offload_device *params);

/* Every name of the table for messages and help: "single, dp, ddp, ...,
 * horovod; also single_device (single), ...". */
FG_API const char *fg_strategy_names(void);

/* True for the kinds that run one process per device and average the
 * gradients over ranks (ranks FG_RANKS_PER_DEVICE): ddp, ddp_spawn,
 * ddp_fork, the sharded kinds, bagua and horovod. */
FG_API bool fg_strategy_kind_is_ddp(fg_strategy_kind k);

/* True for the kinds that shard something (deepspeed_stage_1, _2, _3 and
 * fsdp, whatever its sharding strategy). */
FG_API bool fg_strategy_kind_is_sharded(fg_strategy_kind k);

/* The kind whose algorithm `k` runs with FSDP's sharding strategy ss:
 * fsdp FULL_SHARD and HYBRID_SHARD run deepspeed_stage_3's, SHARD_GRAD_OP
 * deepspeed_stage_2's, NO_SHARD ddp's; every other kind runs its own (ss
 * is ignored). */
FG_API fg_strategy_kind fg_strategy_algorithm(fg_strategy_kind k, fg_sharding_strategy ss);

/* What k shards with sharding strategy ss (FG_SHARDS_*): its algorithm's
 * row; 0 out of range. */
FG_API unsigned fg_strategy_shards(fg_strategy_kind k, fg_sharding_strategy ss);

/* What k takes with sharding strategy ss (FG_TAKES_*): its row, and for
 * fsdp the comm hooks, ddp buckets and wrap policy of the algorithm ss
 * makes it (NO_SHARD: ddp's hooks; FULL_SHARD, HYBRID_SHARD: stage 3's wrap
 * policy); 0 out of range. */
FG_API unsigned fg_strategy_takes(fg_strategy_kind k, fg_sharding_strategy ss);

/* The names of the kinds whose rows take every bit of `takes`, for
 * messages: "ddp, ddp_spawn, ddp_fork". The string is the calling thread's,
 * valid until its next call. */
FG_API const char *fg_strategy_kinds_taking(unsigned takes);

/* "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"; "?" if out of
 * range. */
FG_API const char *fg_sharding_strategy_name(fg_sharding_strategy s);
/* Parses one of those names, case-insensitively. FG_EINVAL naming the value
 * and the valid names otherwise (NULL too). *out is set only on FG_OK. */
FG_API FG_MUST_USE fg_status fg_sharding_strategy_parse(const char *name,
                                                        fg_sharding_strategy *out);

/* "none", "cpu", "nvme"; "?" out of range. */
FG_API const char *fg_offload_device_name(fg_offload_device d);
/* Parses "cpu" or "nvme" (any case; "none" too). FG_EINVAL naming the
 * value otherwise. */
FG_API FG_MUST_USE fg_status fg_offload_device_parse(const char *name, fg_offload_device *out);

/* The name of a launcher: "none", "re-exec", "fork", "threads"; "?" out of
 * range. */
FG_API const char *fg_launcher_name(fg_launcher l);

/* ------------------------------------------------------------ precisions */

/* Lightning's six precision settings. */
typedef enum fg_precision_kind {
    FG_PRECISION_32_TRUE = 0, /* "32-true", "32": f32 parameters and compute (default) */
    FG_PRECISION_64_TRUE,     /* "64-true", "64": f64 */
    FG_PRECISION_16_MIXED,    /* "16-mixed", "16": f16 autocast, f32 weights, loss scaling */
    FG_PRECISION_BF16_MIXED,  /* "bf16-mixed", "bf16": bf16 autocast, f32 weights */
    FG_PRECISION_16_TRUE,   /* "16-true": f16 parameters, compute, gradients; f32 optimizer state */
    FG_PRECISION_BF16_TRUE, /* "bf16-true": bf16 likewise */
    FG_PRECISION_COUNT
} fg_precision_kind;

/* What a setting means: one row of the table above. */
typedef struct fg_precision_policy {
    const char *name;     /* "bf16-mixed" */
    const char *alias;    /* "bf16", or NULL */
    fg_dtype param_dtype; /* the parameters the optimizer updates (the master weights) */
    fg_dtype compute;     /* the autocast dtype of products; FG_DTYPE_DEFAULT: no autocast */
    fg_dtype grad_dtype;  /* the gradients of the parameters */
    fg_dtype optim_dtype; /* the optimizer's state */
    bool master_weights;  /* f32 weights kept beside a lower compute dtype */
    bool loss_scaling;    /* a loss scaler (fg_scaler) guards the step */
    bool built;           /* false: recognised, but this fulgur does not run it yet */
} fg_precision_policy;

/* The row of kind p; NULL for a kind out of range. */
FG_API const fg_precision_policy *fg_precision_policy_of(fg_precision_kind p);

/* Parses a precision setting: the six names of fg_precision_kind and their
 * short forms "64", "32", "16", "bf16"; NULL means "32-true". Case does not
 * matter. Recognises every setting, built or not (the policy's `built`
 * says which; fg_launch_parse_precision refuses those not built). Errors:
 * FG_EINVAL for anything else, listing the valid names. *out is set only on
 * FG_OK. */
FG_API FG_MUST_USE fg_status fg_precision_parse(const char *s, fg_precision_kind *out);

/* The canonical name of a precision ("bf16-mixed"); "?" if out of range. */
FG_API const char *fg_precision_kind_name(fg_precision_kind p);

/* The settings this fulgur runs (the rows built), as a list for messages
 * and help: "32-true (32), 64-true (64), 16-mixed (16), bf16-mixed (bf16),
 * 16-true, bf16-true". */
FG_API const char *fg_precision_available(void);

#ifdef __cplusplus
}
#endif
#endif
