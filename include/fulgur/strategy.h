/* fulgur strategies: how a model's gradients, parameters and optimizer
 * state are shared between ranks. single (one rank), dp (one process, the
 * batch split across threads holding replicas), ddp (one process per rank,
 * gradients averaged in buckets that overlap backward), and the sharded
 * ones, ZeRO as DeepSpeed names its stages (docs/sharding.md):
 * deepspeed_stage_1 (each rank keeps the optimizer state of its shard only;
 * gradients reduce-scattered after backward, each rank updates its shard,
 * parameters all-gathered after the step), deepspeed_stage_2 (the same with
 * the reduce-scatter bucket by bucket while backward runs), and fsdp with a
 * sharding strategy (SHARD_GRAD_OP = stage 2, NO_SHARD = ddp). ddp_spawn
 * and ddp_fork are ddp with another launcher (launch.h). Most programs use
 * these through fabric.h.
 *
 * fg_strategy_kind is fulgur's one list of strategies: the launch layer
 * parses the names into it (fg_launch_parse_strategy) and picks a launcher
 * for each, this layer runs the ranks once they exist. */
#ifndef FULGUR_STRATEGY_H
#define FULGUR_STRATEGY_H

#include "fulgur/comm.h"
#include "fulgur/data.h"
#include "fulgur/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fg_strategy_kind {
    FG_STRATEGY_SINGLE = 0, /* "single": one rank, one device */
    FG_STRATEGY_DP,         /* "dp": one process; the batch split over worker threads */
    FG_STRATEGY_DDP,        /* "ddp": one process per device (re-exec, or already launched) */
    FG_STRATEGY_DDP_SPAWN,  /* "ddp_spawn": ddp with ranks forked from inside the program */
    FG_STRATEGY_DDP_FORK,   /* "ddp_fork": the same as ddp_spawn here (fork is how fulgur spawns) */
    FG_STRATEGY_DEEPSPEED_STAGE_1, /* "deepspeed_stage_1": ZeRO-1, optimizer state sharded */
    FG_STRATEGY_DEEPSPEED_STAGE_2, /* "deepspeed_stage_2": ZeRO-2, gradients reduce-scattered too */
    FG_STRATEGY_FSDP, /* "fsdp": by fg_sharded_opts.sharding_strategy (SHARD_GRAD_OP, NO_SHARD) */
    FG_STRATEGY_COUNT
} fg_strategy_kind;

/* The canonical name of a kind ("ddp_spawn"); "?" if out of range.
 * Thread-safe. */
FG_API const char *fg_strategy_kind_name(fg_strategy_kind k);

/* True for the kinds that run one process per device and average the
 * gradients over ranks: ddp, ddp_spawn, ddp_fork, and the sharded kinds
 * (deepspeed_stage_1, deepspeed_stage_2, fsdp), which Lightning builds on
 * DDP as well and which the launch layer starts the way it starts ddp.
 * Thread-safe. */
FG_API bool fg_strategy_kind_is_ddp(fg_strategy_kind k);

/* True for deepspeed_stage_1, deepspeed_stage_2 and fsdp. Thread-safe. */
FG_API bool fg_strategy_kind_is_sharded(fg_strategy_kind k);

/* DDP's options (PyTorch's DistributedDataParallel arguments). */
typedef struct fg_ddp_opts {
    double bucket_cap_mb;        /* 0 = 25; the first bucket is 1 MiB, as PyTorch */
    bool find_unused_parameters; /* parameters without a gradient count as zero instead of an error
                                  */
    bool static_graph;           /* the same parameters are used every step (no check) */
} fg_ddp_opts;

/* FSDP's sharding strategies (torch.distributed.fsdp.ShardingStrategy).
 * FULL_SHARD is the zero value: PyTorch's and Lightning's default. */
typedef enum fg_sharding_strategy {
    FG_SHARDING_FULL_SHARD = 0, /* parameters sharded too (= ZeRO-3): not built yet */
    FG_SHARDING_SHARD_GRAD_OP,  /* gradients and optimizer state (= deepspeed_stage_2) */
    FG_SHARDING_NO_SHARD,       /* nothing sharded (= ddp) */
    FG_SHARDING_HYBRID_SHARD,   /* full shard in a node, replicas across nodes: not built yet */
    FG_SHARDING_COUNT
} fg_sharding_strategy;

/* "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"; "?" if out of
 * range. Thread-safe. */
FG_API const char *fg_sharding_strategy_name(fg_sharding_strategy s);
/* Parses one of those names, case-insensitively. FG_EINVAL naming the value
 * and the valid names otherwise (NULL too). *out is set only on FG_OK.
 * Thread-safe. */
FG_API fg_status fg_sharding_strategy_parse(const char *name, fg_sharding_strategy *out);

/* Options of the sharded kinds (Lightning's DeepSpeedStrategy and
 * FSDPStrategy arguments). All-zero means the defaults. */
typedef struct fg_sharded_opts {
    /* Elements per gradient bucket: the flat gradient is reduce-scattered
     * in buckets of about this many elements (whole parameters, the last
     * ones first), under stage 2 each as soon as backward has finished its
     * gradients. 0 = 200,000,000 (Lightning's default; DeepSpeed counts
     * elements, not bytes). */
    int64_t reduce_bucket_size;
    /* Elements per piece of the parameter all-gather after each optimizer
     * step (each rank contributes up to allgather_bucket_size / world_size
     * elements per piece). 0 = 200,000,000. */
    int64_t allgather_bucket_size;
    /* fsdp only (ignored by the deepspeed kinds): SHARD_GRAD_OP or NO_SHARD;
     * FULL_SHARD (the zero value) and HYBRID_SHARD are FG_EUNSUPPORTED. */
    fg_sharding_strategy sharding_strategy;
} fg_sharded_opts;

/* Checks the sharded options for `kind` (o may be NULL: the defaults):
 * FG_EINVAL for a negative bucket size or a sharding strategy out of range,
 * FG_EUNSUPPORTED for fsdp with FULL_SHARD or HYBRID_SHARD, naming what is
 * built. FG_OK for every other kind. The fabric checks a configuration with
 * it at fg_fabric_new, before any rank starts. Thread-safe. */
FG_API fg_status fg_strategy_check_sharded(fg_strategy_kind kind, const fg_sharded_opts *o);

typedef struct fg_strategy fg_strategy;

/* A strategy for `model` (and `opt`, may be NULL except under the sharded
 * kinds), both borrowed for the strategy's life. The ddp kinds (ddp,
 * ddp_spawn, ddp_fork: the same once the ranks exist) and the sharded kinds
 * need comm (borrowed); single and dp ignore it. ddp (may be NULL) holds
 * ddp's options, also those of fsdp with NO_SHARD; sharded (may be NULL) the
 * sharded kinds' options. dp_threads is the number of replicas of dp
 * (0 = 2). Setup is collective under ddp and the sharded kinds: rank 0's
 * parameters are broadcast to every rank.
 *
 * The sharded kinds (deepspeed_stage_1, deepspeed_stage_2, fsdp with
 * SHARD_GRAD_OP) split the flat parameter vector into world_size contiguous
 * shards (fg_strategy_shard_range) and change `opt`, which must be an
 * optimizer over `model` itself: it keeps the state of this rank's shard
 * only (what it held for that range, if it has stepped before), and
 * fg_optimizer_step updates the shard and then all-gathers the parameters,
 * which makes it collective (optim.h). After backward with sync on, the
 * flat gradient holds the average over ranks in this rank's shard range
 * only; elsewhere it holds this rank's own gradient. When the strategy is
 * freed first, the optimizer goes on holding and updating its shard alone.
 *
 * Returns the strategy, owned by the caller (fg_strategy_free), or NULL on
 * failure (fg_last_error, fg_last_status): FG_EINVAL (NULL model, a kind
 * out of range, ddp or a sharded kind without comm, a sharded kind without
 * an optimizer over the model, bad sharded options), FG_EUNSUPPORTED (fsdp
 * with FULL_SHARD or HYBRID_SHARD), the broadcast's, FG_ENOMEM. */
FG_API fg_strategy *fg_strategy_new(fg_strategy_kind kind, fg_comm *comm, fg_module *model,
                                    fg_optimizer *opt, const fg_ddp_opts *ddp,
                                    const fg_sharded_opts *sharded, int dp_threads);
FG_API void fg_strategy_free(fg_strategy *s);
FG_API fg_strategy_kind fg_strategy_kind_of(const fg_strategy *s);

/* Whether the strategy shards the optimizer state: deepspeed_stage_1,
 * deepspeed_stage_2 and fsdp with SHARD_GRAD_OP, on more than one rank. */
FG_API bool fg_strategy_is_sharded(const fg_strategy *s);

/* The shard of `rank` under a sharding strategy: elements [*begin, *end) of
 * the flat parameter vector (fg_module_flat_params) whose optimizer state
 * and averaged gradient that rank keeps. Shards are contiguous, in rank
 * order, and split the vector as evenly as whole 64-byte lines allow (no
 * padding: they differ by at most one line). Without sharding the one shard
 * is everything: [0, numel) for every rank. FG_EINVAL for a rank out of
 * range. */
FG_API fg_status fg_strategy_shard_range(const fg_strategy *s, int rank, int64_t *begin,
                                         int64_t *end);

/* Backward from loss; under ddp with sync on, returns with the gradients
 * averaged over ranks, under the sharded kinds with this rank's shard of
 * them averaged (collective). With sync off (gradient accumulation) it is
 * a local backward under every kind. */
FG_API fg_status fg_strategy_backward(fg_strategy *s, fg_tensor *loss);
FG_API void fg_strategy_set_sync(fg_strategy *s, bool sync);

/* dp: splits batch b along its first dim into one part per replica, runs
 * fn(part, ud) -> loss on each replica's thread, backward of each part's
 * loss weighted by its share, and sums the replicas' gradients into the
 * model's. Other strategies call fn once on the whole batch. part_losses
 * (may be NULL) gets up to max_parts losses, *nparts their count. */
typedef fg_tensor *(*fg_strategy_step_fn)(fg_module *replica, fg_batch *part, void *ud);
FG_API fg_status fg_strategy_step(fg_strategy *s, fg_batch *b, fg_strategy_step_fn fn, void *ud,
                                  double *part_losses, int max_parts, int *nparts, double *loss);

/* Global gradient norm and clipping to max_norm (max_norm <= 0: the norm
 * only): when the norm exceeds max_norm, the gradients are scaled by
 * max_norm / (norm + 1e-6). Under ddp every rank holds the whole averaged
 * gradient and nothing is communicated; under the sharded kinds the norm
 * is sqrt of the sum over ranks of each shard's sum of squares (an
 * allreduce: collective) and each rank scales its shard. *total_norm (may
 * be NULL) gets the norm before clipping. */
FG_API fg_status fg_strategy_clip_grad_norm(fg_strategy *s, double max_norm, double *total_norm);

#ifdef __cplusplus
}
#endif
#endif
