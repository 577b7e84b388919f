/* fulgur strategies: how a model's gradients and parameters are shared
 * between ranks. single (one rank), dp (one process, the batch split across
 * threads holding replicas), ddp (one process per rank, gradients averaged
 * in buckets that overlap backward). ddp_spawn and ddp_fork are ddp with
 * another launcher (launch.h). Most programs use these through fabric.h.
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
    FG_STRATEGY_COUNT
} fg_strategy_kind;

/* The canonical name of a kind ("ddp_spawn"); "?" if out of range.
 * Thread-safe. */
FG_API const char *fg_strategy_kind_name(fg_strategy_kind k);

/* True for ddp, ddp_spawn and ddp_fork: one process per device, gradients
 * averaged over ranks. Thread-safe. */
FG_API bool fg_strategy_kind_is_ddp(fg_strategy_kind k);

/* DDP's options (PyTorch's DistributedDataParallel arguments). */
typedef struct fg_ddp_opts {
    double bucket_cap_mb;        /* 0 = 25; the first bucket is 1 MiB, as PyTorch */
    bool find_unused_parameters; /* parameters without a gradient count as zero instead of an error
                                  */
    bool static_graph;           /* the same parameters are used every step (no check) */
} fg_ddp_opts;

typedef struct fg_strategy fg_strategy;

/* A strategy for `model` (and `opt`, may be NULL), both borrowed for its
 * life. The ddp kinds (ddp, ddp_spawn, ddp_fork: the same once the ranks
 * exist) need comm (borrowed); single and dp ignore it. dp_threads is the
 * number of replicas of dp (0 = 2). Setup is collective under ddp: rank 0's
 * parameters are broadcast to every rank. Returns the strategy, owned by
 * the caller (fg_strategy_free), or NULL on failure (fg_last_error,
 * fg_last_status): FG_EINVAL (NULL model, a kind out of range, ddp without
 * comm), the broadcast's, FG_ENOMEM. */
FG_API fg_strategy *fg_strategy_new(fg_strategy_kind kind, fg_comm *comm, fg_module *model,
                                    fg_optimizer *opt, const fg_ddp_opts *ddp, int dp_threads);
FG_API void fg_strategy_free(fg_strategy *s);
FG_API fg_strategy_kind fg_strategy_kind_of(const fg_strategy *s);

/* Backward from loss; under ddp with sync on, returns with the gradients
 * averaged over ranks (collective). */
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

/* Global gradient norm (over all ranks under ddp) and clipping to max_norm. */
FG_API fg_status fg_strategy_clip_grad_norm(fg_strategy *s, double max_norm, double *total_norm);

#ifdef __cplusplus
}
#endif
#endif
