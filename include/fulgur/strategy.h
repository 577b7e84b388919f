/* fulgur strategies: how a model's gradients, parameters and optimizer
 * state are shared between ranks. single (one rank), dp (one process, the
 * batch split across threads holding replicas), ddp (one process per rank,
 * gradients averaged in buckets that overlap backward), and the sharded
 * ones, ZeRO as DeepSpeed names its stages (docs/sharding.md):
 * deepspeed_stage_1 (each rank keeps the optimizer state of its shard only;
 * gradients reduce-scattered after backward, each rank updates its shard,
 * parameters all-gathered after the step), deepspeed_stage_2 (the same with
 * the reduce-scatter bucket by bucket while backward runs),
 * deepspeed_stage_3 (the parameters sharded too: each wrapped unit's
 * gathered just before its forward and its backward and released after),
 * fsdp with a sharding strategy (FULL_SHARD = stage 3, SHARD_GRAD_OP =
 * stage 2, NO_SHARD = ddp, HYBRID_SHARD = stage 3 inside a group of ranks,
 * replicated across groups), and bagua (Bagua's six communication
 * algorithms, by fg_ddp_opts.bagua). ddp_spawn
 * and ddp_fork are ddp with another launcher (launch.h); ddp2 is dp inside
 * each process (one per node) with the gradient averaged across the
 * processes after each step. Most programs use
 * these through fabric.h.
 *
 * fg_strategy_kind is fulgur's one list of strategies, with one row each in
 * kinds.h: the launch layer parses the names into it (fg_launch_parse_strategy)
 * and takes the launcher from the row, this layer runs the ranks once they
 * exist. */
#ifndef FULGUR_STRATEGY_H
#define FULGUR_STRATEGY_H

#include "fulgur/comm.h"
#include "fulgur/data.h"
#include "fulgur/hivemind.h"
#include "fulgur/kinds.h"
#include "fulgur/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* fg_strategy_kind, its row (what each kind launches, shards and takes) and
 * its names are in kinds.h. */

/* ---------------------------------------------------- DDP communication hooks
 *
 * PyTorch's DistributedDataParallel.register_comm_hook (Lightning's
 * DDPStrategy(ddp_comm_hook=, ddp_comm_state=, ddp_comm_wrapper=)): a hook
 * replaces the plain averaging allreduce of each gradient bucket. It is
 * called once per bucket of every backward with sync on, buckets in index
 * order (the same on every rank), as soon as the bucket's gradients are
 * final; it returns once the bucket holds the gradient to apply (the
 * average over ranks, or its approximation). As PyTorch's hooks run
 * asynchronously, a hook runs on a thread of the strategy's own, not the
 * one running backward: backward goes on while it communicates (with
 * blocking calls there), and its end waits for every bucket's hook. So a
 * hook touches only its bucket and its own state (not tensors the training
 * thread uses); it runs without grad mode, and the step tensors it makes
 * are freed after each call. Without a hook the buckets are averaged by
 * asynchronous allreduces, also overlapping backward.
 *
 * The built-in hooks, with PyTorch's semantics (docs/comm-hooks.md):
 *   fp16_compress, bf16_compress: the bucket divided by the world size, cast
 *     to f16 / bf16, summed over ranks in that dtype, cast back to f32;
 *   powersgd: PowerSGD (Vogels et al. 2019) as torch's powerSGD_hook, on
 *     each parameter of the bucket seen as a matrix (fg_powersgd_opts);
 *   post_localsgd: plain averaging for the first start_localSGD_iter
 *     backwards, then none (each rank steps on its own gradient) and the
 *     parameters averaged over ranks after every `period`-th optimizer step
 *     (fg_post_localsgd_opts).
 * A wrapper (ddp_comm_wrapper: fp16_compress_wrapper, bf16_compress_wrapper)
 * rounds the bucket to f16 / bf16 and makes every allreduce of the hook it
 * wraps travel in that dtype (PowerSGD's P and Q in half precision). */
typedef enum fg_ddp_comm_hook {
    FG_DDP_HOOK_NONE = 0,      /* plain averaging allreduce, overlapped with backward */
    FG_DDP_HOOK_FP16_COMPRESS, /* "fp16_compress" */
    FG_DDP_HOOK_BF16_COMPRESS, /* "bf16_compress" */
    FG_DDP_HOOK_POWERSGD,      /* "powersgd" */
    FG_DDP_HOOK_POST_LOCALSGD, /* "post_localsgd" */
    FG_DDP_HOOK_COUNT
} fg_ddp_comm_hook;

typedef enum fg_ddp_comm_wrapper {
    FG_DDP_WRAPPER_NONE = 0,
    FG_DDP_WRAPPER_FP16, /* "fp16": torch's fp16_compress_wrapper */
    FG_DDP_WRAPPER_BF16, /* "bf16": torch's bf16_compress_wrapper */
    FG_DDP_WRAPPER_COUNT
} fg_ddp_comm_wrapper;

/* "none", "fp16_compress", "bf16_compress", "powersgd", "post_localsgd";
 * "?" if out of range. Thread-safe. */
FG_API const char *fg_ddp_comm_hook_name(fg_ddp_comm_hook h);
/* Parses one of those names ("none" too). FG_EINVAL naming the value and
 * the valid names otherwise (NULL too); *out is set only on FG_OK. */
FG_API FG_MUST_USE fg_status fg_ddp_comm_hook_parse(const char *name, fg_ddp_comm_hook *out);
/* "none", "fp16", "bf16"; "?" if out of range. */
FG_API const char *fg_ddp_comm_wrapper_name(fg_ddp_comm_wrapper w);
/* Parses "none", "fp16" or "bf16" (also "fp16_compress_wrapper",
 * "bf16_compress_wrapper"); FG_EINVAL naming the value and the valid ones. */
FG_API FG_MUST_USE fg_status fg_ddp_comm_wrapper_parse(const char *name, fg_ddp_comm_wrapper *out);

/* torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.PowerSGDState.
 * All-zero means PyTorch's defaults.
 *
 * Each parameter of a bucket with 2 or more dims is a matrix M of
 * (shape[0], numel / shape[0]), (n, m); with r = min(rank, n, m) it is
 * compressed when r (n + m) * min_compression_rate < n m, else it goes with
 * the 1-dim parameters (biases, norms) into one plain averaging allreduce,
 * as PyTorch does. For the compressed ones, per backward:
 *   M += e (error feedback: the residual this rank kept last time);
 *   Q: (m, r) random N(0, 1) the first time (or every time without warm
 *      start) from a seed that is the same on every rank, else last time's Q;
 *      with warm start a reused Q is orthogonalised (Gram-Schmidt) first;
 *   P = M Q; P summed over ranks (one allreduce for the bucket's Ps);
 *   P orthogonalised (Gram-Schmidt over its columns);
 *   Q = M^T P; Q summed over ranks (one allreduce), divided by world size;
 *   M' = P Q^T, the gradient applied; e = (M + e) - M' over the whole
 *   bucket (for the uncompressed parameters too, as PyTorch).
 * Bytes handed to the communicator: r (n + m) floats per compressed matrix
 * instead of n m. The first start_powerSGD_iter backwards are plain
 * averaging allreduces (bitwise those of ddp without a hook). */
typedef struct fg_powersgd_opts {
    int matrix_approximation_rank; /* 0 = 1 */
    /* Backwards (with sync) run as plain ddp before compression starts.
     * 0 = 1000 (PyTorch's default); < 0 = compress from the first one. PyTorch
     * asks for > 1 when error feedback or warm start is on (its buckets are
     * rebuilt after the first step); fulgur's buckets are fixed, so any
     * value works. */
    int64_t start_powerSGD_iter;
    double min_compression_rate;      /* 0 = 2 */
    bool no_error_feedback;           /* PyTorch's use_error_feedback=False */
    bool no_warm_start;               /* PyTorch's warm_start=False */
    double orthogonalization_epsilon; /* added to each column's norm before dividing; 0 */
    uint64_t random_seed;             /* seeds Q's draws, the same on every rank (0 = 0) */
} fg_powersgd_opts;

/* post_localSGD_hook with PostLocalSGDState, and the PeriodicModelAverager
 * of PostLocalSGDOptimizer that Lightning adds when model_averaging_period
 * is set: backwards before start_localSGD_iter average the gradients as
 * plain ddp; from then on the gradients stay local (PyTorch's
 * post_local_gradient_allreduce=False; its default allreduces inside each
 * node's subgroup, which on one node would be plain ddp) and the parameters
 * are averaged over ranks right after optimizer step k (0-based) whenever
 * k >= start_localSGD_iter and (k - start_localSGD_iter) % period == 0.
 * Needs the optimizer given to fg_strategy_new. */
typedef struct fg_post_localsgd_opts {
    int64_t start_localSGD_iter; /* 0 = 0: local SGD from the first step */
    int64_t period;              /* model averaging period in optimizer steps; 0 = 4 */
} fg_post_localsgd_opts;

/* One bucket as a hook sees it. Everything is borrowed for the call. */
typedef struct fg_ddp_bucket {
    int index; /* 0 .. num_buckets-1, 0 holds the last parameters */
    int num_buckets;
    float *grad; /* the bucket's slice of the flat gradient (f32), numel elements: the
                    hook reads this rank's gradient here and leaves the result here */
    int64_t numel;
    int64_t offset;           /* element offset of grad[0] in the flat gradient */
    int nparams;              /* the parameters in the bucket, in model order */
    fg_tensor *const *params; /* their gradients start at grad + param_offsets[i] */
    const int64_t *param_offsets;
    int64_t iter;  /* backwards with sync finished before this one (PyTorch's state.iter) */
    fg_comm *comm; /* the strategy's communicator */
    int world_size;
    void *impl; /* fulgur's: the byte counter and the wrapper's dtype */
} fg_ddp_bucket;

/* A user hook: leaves in b->grad what the optimizer should apply (usually
 * the average over ranks). It must make the same collectives on every rank
 * in the same order, and should make them through fg_ddp_bucket_allreduce
 * so that fg_strategy_comm_bytes counts them. Returns FG_OK or a status with
 * fg_error's message; backward then fails with it. */
typedef FG_MUST_USE fg_status (*fg_ddp_hook_fn)(void *state, const fg_ddp_bucket *b);

/* The allreduce for hooks: buf (count f32 elements, may be b->grad or any
 * buffer of the hook) becomes op over ranks of buf; counted in
 * fg_strategy_comm_bytes. Under a wrapper the data travel as f16 / bf16
 * (rounded once there; the sum computed in f32 and rounded once, then widened
 * back in place), else as f32. Collective. */
FG_API FG_MUST_USE fg_status fg_ddp_bucket_allreduce(const fg_ddp_bucket *b, float *buf,
                                                     int64_t count, fg_reduce_op op);

/* ------------------------------------------------------------ Bagua
 *
 * Lightning's BaguaStrategy(algorithm=..., **algorithm options): Bagua's
 * algorithms over fulgur's communicators (docs/bagua.md has each one's
 * update, its bytes and where fulgur departs from Bagua's code):
 *   gradient_allreduce: gradients averaged bucket by bucket, as ddp (bitwise
 *     ddp when flat); hierarchical: averaged inside each node onto its first
 *     rank, averaged over those leaders, broadcast inside the node;
 *   bytegrad: each bucket's average through 8-bit min-max quantised chunks
 *     (a chunk: its min and max as f32, then one byte per element): every
 *     rank quantises its bucket into one chunk per rank, the chunks are
 *     exchanged (alltoall), each rank dequantises, sums and averages its
 *     slice, quantises it again, and the slices are all-gathered and
 *     dequantised;
 *   decentralized: no gradient communication; at every
 *     communication_interval-th step the weights the step's gradient was
 *     computed at are replaced, before the optimizer step, by their average
 *     with the peers' (peer_selection_mode all: every rank; shift_one: one
 *     peer per step, paired as Bagua pairs them);
 *   low_precision_decentralized: after the optimizer step each rank sends
 *     8-bit compressed differences of its weights to its ring neighbours and
 *     moves to (left + self + right) / 3 plus its own progress, tracking the
 *     neighbours' weights from the differences (Tang et al. 2018, DCD-PSGD);
 *   qadam: QAdam over the optimizer (AdamW): warmup_steps steps of plain
 *     Adam on averaged gradients, then the variance frozen and each rank's
 *     momentum (beta1 m + (1 - beta1) g) averaged as bytegrad averages;
 *   async: warmup_steps steps of averaged gradients, then local steps while
 *     a background thread, on a communicator of its own, averages the
 *     weights about every sync_interval_ms (each rank adds the average of
 *     the snapshots minus its own snapshot at its next step end). */
typedef enum fg_bagua_algorithm {
    FG_BAGUA_GRADIENT_ALLREDUCE = 0,      /* "gradient_allreduce" */
    FG_BAGUA_BYTEGRAD,                    /* "bytegrad" */
    FG_BAGUA_DECENTRALIZED,               /* "decentralized" */
    FG_BAGUA_LOW_PRECISION_DECENTRALIZED, /* "low_precision_decentralized" */
    FG_BAGUA_QADAM,                       /* "qadam" */
    FG_BAGUA_ASYNC,                       /* "async" */
    FG_BAGUA_ALGORITHM_COUNT
} fg_bagua_algorithm;

typedef enum fg_bagua_peer_selection {
    FG_BAGUA_PEERS_ALL = 0,   /* "all": every rank's weights averaged */
    FG_BAGUA_PEERS_SHIFT_ONE, /* "shift_one": one peer per communication (even world) */
    FG_BAGUA_PEERS_COUNT
} fg_bagua_peer_selection;

/* Bagua's algorithm options, by their Bagua names. All-zero means
 * gradient_allreduce with Bagua's defaults. */
typedef struct fg_bagua_opts {
    fg_bagua_algorithm algorithm;
    /* 1 on, -1 off, 0 the default: off for gradient_allreduce (Bagua's), and
     * for bytegrad, decentralized, low_precision_decentralized and qadam on
     * when the job spans several nodes with several ranks on a node (Bagua
     * turns it on always; with one node it would average everything inside
     * the node in full precision and leave nothing to compress or to
     * decentralise). async is never hierarchical. */
    int hierarchical;
    fg_bagua_peer_selection peer_selection_mode; /* decentralized */
    int64_t communication_interval; /* the decentralized ones: steps per communication; 0 = 1 */
    /* qadam: 0 = 100; async: 0 = 0; < 0 = none (qadam needs at least 1) */
    int64_t warmup_steps;
    int64_t sync_interval_ms; /* async: 0 = 500 */
} fg_bagua_opts;

/* "gradient_allreduce", "bytegrad", "decentralized",
 * "low_precision_decentralized", "qadam", "async"; "?" if out of range.
 * Thread-safe. */
FG_API const char *fg_bagua_algorithm_name(fg_bagua_algorithm a);
/* Parses one of those names (case-insensitive). FG_EINVAL naming the value
 * and the valid names otherwise (NULL too); *out is set only on FG_OK. */
FG_API FG_MUST_USE fg_status fg_bagua_algorithm_parse(const char *name, fg_bagua_algorithm *out);
/* "all" or "shift_one"; parse: FG_EINVAL naming the value otherwise. */
FG_API const char *fg_bagua_peer_selection_name(fg_bagua_peer_selection p);
FG_API FG_MUST_USE fg_status fg_bagua_peer_selection_parse(const char *name,
                                                           fg_bagua_peer_selection *out);

/* DDP's options (PyTorch's DistributedDataParallel arguments). */
/* Horovod's DistributedOptimizer and tensor fusion (strategy horovod).
 * During backward, a background thread wakes every cycle; the ranks agree
 * (an allreduce of the count) on the gradients ready on all of them, in the
 * fixed order backward produces them (the last parameter first); those are
 * packed into the fusion buffer, at most fusion_threshold bytes at a time,
 * averaged with one allreduce per buffer, and copied back. */
typedef enum fg_horovod_compression {
    FG_HOROVOD_COMPRESSION_NONE = 0, /* hvd.Compression.none */
    FG_HOROVOD_COMPRESSION_FP16,     /* hvd.Compression.fp16: sent as f16, f32 again after */
    FG_HOROVOD_COMPRESSION_COUNT
} fg_horovod_compression;

typedef struct fg_horovod_opts {
    /* bytes of the fusion buffer; 0: HOROVOD_FUSION_THRESHOLD, else 64 MiB;
     * -1 (or HOROVOD_FUSION_THRESHOLD=0): no fusion, one allreduce per gradient */
    int64_t fusion_threshold;
    double cycle_time_ms;         /* 0: HOROVOD_CYCLE_TIME (ms), else 5 */
    int backward_passes_per_step; /* 0 = 1: gradients accumulate locally over this many
                                     backward passes; the last one averages them */
    fg_horovod_compression compression;
} fg_horovod_opts;

/* Lightning's HivemindStrategy (strategy hivemind, docs/hivemind.md): this
 * process is one peer of a swarm. fg_optimizer_step through the fabric
 * (fg_fabric_optimizer_step, the Trainer) accumulates the gradient; when
 * the swarm has processed target_batch_size samples since its last step,
 * the ready peers average and step together (a global epoch). */
typedef struct fg_hivemind_strategy_opts {
    int64_t target_batch_size; /* required: samples of the whole swarm per optimizer step */
    const char *run_id;        /* required: the run's name, shared by its peers */
    const char *run_secret;    /* required: the shared secret (authenticates everything) */
    int64_t batch_size;        /* this peer's samples per fg_optimizer_step call (required) */
    const char *initial_peers; /* "host:port,..."; NULL: this peer starts the swarm */
    const char *host;          /* the address announced (NULL: found, see hivemind.h) */
    int host_maxaddrs;         /* Lightning's; one address is announced */
    double matchmaking_time;   /* s (default 5) */
    double averaging_timeout;  /* s (default 30) */
    double load_state_timeout; /* s a state download may take (default max(60, 2 x the above)) */
    /* Hivemind's (docs/hivemind.md). offload_optimizer: each epoch's step
     * updates a master copy of the parameters in host memory (the optimizer's
     * state there too), copied into the model after it; the CPU only.
     * delay_optimizer_step (needs offload_optimizer): that step runs in a
     * thread of its own while the next epoch's gradients are computed from
     * the parameters the model has (one epoch stale); its result goes into
     * the model at the next step call that finds it done (or
     * fg_strategy_settle). delay_grad_averaging, delay_state_averaging (each
     * needs delay_optimizer_step): that thread also matches and averages the
     * gradients before the step, and the state after it. */
    bool delay_state_averaging, delay_optimizer_step, delay_grad_averaging;
    bool offload_optimizer;
    /* reuse_grad_buffers (Hivemind's): the model's gradient buffer is the
     * accumulator (no buffer of numel floats): while the strategy holds the
     * model, zero_grad leaves the buffer as it is (as Lightning turns the
     * Trainer's off) and each backward adds to it; the strategy empties it
     * when it takes an epoch's gradients. Gradient clipping then clips the
     * sum accumulated so far. Refused with delay_grad_averaging and under a
     * loss scaler (16-mixed: it would unscale the earlier calls again). */
    bool reuse_grad_buffers;
    /* lr of global epoch e (Lightning's scheduler_fn, stepped per epoch);
     * NULL: the optimizer's own */
    double (*scheduler_fn)(int64_t epoch, void *ud);
    void *scheduler_ud;
    fg_hivemind_compression grad_compression; /* none, fp16, 8-bit */
    int average_state_every;                  /* epochs between state averagings (0 = 1) */
    int dht_port;                             /* 0: any */
    double join_wait; /* s to look for live peers at setup (default 3; with min_peers: 600) */
    int min_peers;    /* fulgur's: setup waits until this many live peers (itself included)
                         are known; 0 = 1 (Hivemind starts training at once) */
} fg_hivemind_strategy_opts;

typedef struct fg_ddp_opts {
    double bucket_cap_mb;        /* 0 = 25; the first bucket is 1 MiB, as PyTorch */
    bool find_unused_parameters; /* parameters without a gradient count as zero instead of an error
                                  */
    bool static_graph;           /* the same parameters are used every step (no check) */
    /* Communication hooks (above). At most one of comm_hook and user_hook;
     * a wrapper goes around either (or, alone, around the plain average).
     * Hooks need f32 gradients (FG_EUNSUPPORTED under 64-true). */
    fg_ddp_comm_hook comm_hook;
    fg_ddp_comm_wrapper comm_wrapper;
    fg_powersgd_opts powersgd;           /* comm_hook powersgd */
    fg_post_localsgd_opts post_localsgd; /* comm_hook post_localsgd */
    fg_ddp_hook_fn user_hook;            /* a user hook and its state (borrowed for the */
    void *user_state;                    /* strategy's life) */
    fg_bagua_opts bagua;                 /* strategy bagua only (Lightning's BaguaStrategy is a
                                            DDPStrategy); no hooks under it */
    /* Lightning's `deterministic`: bitwise the same gradients on any number
     * of ranks for the same global batch. Each backward's gradient (one
     * micro-batch) is kept alone; the synchronising backward sums every
     * micro-batch of every rank in one fixed pairwise tree over the
     * micro-batch's global index (rank r's k-th of A is index k * world + r,
     * as fg_sampler_distributed's blocks deal them) and divides by their
     * count. Built for single and ddp without hooks (FG_EUNSUPPORTED
     * otherwise). The caller must not divide the loss by the accumulation:
     * the average over micro-batches is the strategy's. */
    bool deterministic;
    fg_horovod_opts horovod;            /* strategy horovod */
    fg_hivemind_strategy_opts hivemind; /* strategy hivemind */
} fg_ddp_opts;

/* Checks ddp's options (o may be NULL): FG_EINVAL naming a hook or wrapper
 * out of range, both a built-in and a user hook, a negative rank, period,
 * compression rate or bucket size, a Bagua algorithm, peer selection or
 * hierarchical setting out of range, a negative interval. The fabric checks its configuration with
 * it. Thread-safe. */
FG_API FG_MUST_USE fg_status fg_strategy_check_ddp(const fg_ddp_opts *o);

/* fg_sharding_strategy and its names are in kinds.h. */

/* What fg_fabric_save writes (FSDPStrategy's state_dict_type): FULL, one
 * safetensors file (rank 0 streams it from the shards, a window of tensors
 * at a time), or SHARDED, a folder with a file per rank and an index
 * (ckpt.h, docs/checkpoints.md). AUTO (the zero value) is the kind's own:
 * SHARDED for the deepspeed strategies, as DeepSpeed saves (its row's
 * saves_sharded, kinds.h), FULL for the others (fsdp included, Lightning's
 * FSDPStrategy default). */
typedef enum fg_state_dict_type {
    FG_STATE_DICT_AUTO = 0, /* "auto" */
    FG_STATE_DICT_FULL,     /* "full" */
    FG_STATE_DICT_SHARDED,  /* "sharded" */
    FG_STATE_DICT_COUNT
} fg_state_dict_type;

/* "auto", "full", "sharded"; "?" if out of range. Thread-safe. */
FG_API const char *fg_state_dict_type_name(fg_state_dict_type t);
/* Parses "auto", "full" or "sharded" (any case). FG_EINVAL naming the value and the
 * valid ones otherwise (NULL too); *out is set only on FG_OK. */
FG_API FG_MUST_USE fg_status fg_state_dict_type_parse(const char *name, fg_state_dict_type *out);

/* fg_offload_device and its names are in kinds.h. */
/* Whether offload to nvme is built in (liburing found at build time).
 * Thread-safe. */
FG_API bool fg_offload_nvme_available(void);

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
     * elements per piece); under stage 3, elements per broadcast when a
     * unit's parameters are gathered. 0 = 200,000,000. */
    int64_t allgather_bucket_size;
    /* fsdp only (ignored by the deepspeed kinds): FULL_SHARD (the zero
     * value, = stage 3), SHARD_GRAD_OP, NO_SHARD or HYBRID_SHARD. */
    fg_sharding_strategy sharding_strategy;
    /* What a checkpoint save writes, under every strategy (the fabric reads
     * it): AUTO (the zero value: SHARDED under the deepspeed strategies,
     * FULL otherwise), FULL (one file) or SHARDED (a file per rank and an
     * index). */
    fg_state_dict_type state_dict_type;
    /* DeepSpeed's offload_optimizer_device: FG_OFFLOAD_NVME keeps this
     * rank's optimizer state (AdamW's exp_avg and exp_avg_sq, SGD's
     * momentum) in files under nvme_path, read and written in blocks with
     * asynchronous I/O around each update: bitwise the in-memory results,
     * memory freed of the state. FG_OFFLOAD_CPU: nothing to move on a CPU.
     * deepspeed kinds only for nvme (fsdp offloads to the cpu only). */
    fg_offload_device offload_optimizer_device;
    /* DeepSpeed's offload_params_device (ZeRO stage 3 only, as DeepSpeed)
     * and FSDP's cpu_offload: FG_OFFLOAD_CPU has nothing to move on a CPU;
     * on a device the parameter shard lives in host memory, and fsdp
     * SHARD_GRAD_OP then shards the parameters outside the forward and
     * backward as PyTorch's does (stage 3's units, each kept gathered from
     * its forward to its backward). FG_OFFLOAD_NVME (deepspeed_stage_3,
     * 2 or more ranks, f32 or f64 parameters): this rank's parameter shard
     * lives in a file under nvme_path with its optimizer state (which then
     * goes to nvme too), updated there block by block at each step, and
     * each unit's part is read back asynchronously when the unit is
     * prefetched. */
    fg_offload_device offload_params_device;
    /* The directory for nvme offload (DeepSpeed's nvme_path), on a local
     * disk; borrowed for fg_strategy_new (the fabric copies it). The files
     * are unlinked at once: nothing is left there, even after a crash. */
    const char *nvme_path;
    /* Stage 3 (FULL_SHARD, HYBRID_SHARD): the auto-wrap policy. 0: a unit
     * per module of type "Block" (the GPT's transformer blocks); > 0:
     * PyTorch's size_based_auto_wrap_policy(min_num_params) as fulgur cuts
     * it: the smallest modules with at least this many parameters (none of
     * their children has as many) are the units. What no unit holds is the
     * root's unit, gathered for the whole forward and backward. */
    int64_t min_num_params;
    /* Stage 3: Lightning's auto_wrap_policy={MyBlock}: every module of this
     * type (fg_module_type) is a unit (as the default, "Block", is); NULL:
     * "Block". Used when min_num_params is 0 and wrap_policy NULL. Borrowed
     * for fg_strategy_new (the fabric copies it). */
    const char *wrap_module_type;
    /* Stage 3: a callable auto-wrap policy (Lightning's auto_wrap_policy=fn):
     * asked of the modules top down (the root excepted, and no module inside
     * a unit), a module is a unit when it returns true (modules without
     * parameters never are). It comes before min_num_params and
     * wrap_module_type. Called at fg_strategy_new only, on the calling
     * thread; borrowed with its ud. */
    bool (*wrap_policy)(const fg_module *m, void *ud);
    void *wrap_policy_ud;
    /* HYBRID_SHARD: ranks per shard group, consecutive ranks (Lightning's
     * device_mesh=(world / size, size)); 0 = the ranks of one node
     * (fg_comm_local_size). Must divide the world size. */
    int hybrid_shard_size;
    /* DeepSpeed's activation checkpointing options (Lightning's
     * DeepSpeedStrategy(partition_activations=, cpu_checkpointing=); the
     * deepspeed kinds only). They say how the checkpoints that activation
     * checkpointing keeps (each checkpointed block's input) are stored;
     * neither has anything to do in fulgur, and the docs say so:
     * partition_activations splits each checkpoint over the model-parallel
     * ranks, and fulgur has data parallelism only (a model-parallel group
     * of one rank, as DeepSpeed without a model-parallel unit, which is how
     * Lightning configures it): each rank keeps its own checkpoints whole;
     * cpu_checkpointing moves the checkpoints to host memory, where on a
     * CPU they are already. */
    bool partition_activations;
    bool cpu_checkpointing;
} fg_sharded_opts;

/* Checks the sharded options for `kind` (o may be NULL: the defaults):
 * FG_EINVAL for a negative bucket size, min_num_params or hybrid_shard_size,
 * or a sharding strategy out of range. The offload fields: FG_EINVAL for a device out of range,
 * offload under a kind that does not shard (single is accepted: a sharded kind on one rank runs as
 * single), nvme without nvme_path or under fsdp; FG_EUNSUPPORTED for parameter offload under
 * deepspeed (it needs stage 3) and for nvme in a build without liburing; FG_EINVAL for
 * partition_activations or cpu_checkpointing under a kind other than the deepspeed ones and
 * single. FG_OK for every other
 * kind. The fabric checks a configuration with it at fg_fabric_new, before any rank starts.
 * Thread-safe. */
FG_API FG_MUST_USE fg_status fg_strategy_check_sharded(fg_strategy_kind kind,
                                                       const fg_sharded_opts *o);

/* What the ranks' setup would refuse, checked before any rank starts, for
 * a job of `world` ranks (local_world of them on each of `nodes` nodes)
 * under `kind` (its row, kinds.h) with the options ddp and sharded (may be
 * NULL) and a precision whose parameters are param_dtype and gradients
 * grad_dtype: ddp's communication hooks under a kind that does not take them
 * (horovod, bagua, the sharded kinds but fsdp NO_SHARD, dp, ddp2) or on
 * gradients other than f32 (FG_EUNSUPPORTED), horovod on gradients other than
 * f32 (FG_EUNSUPPORTED), bagua's algorithms but gradient_allreduce on
 * parameters other than f32 (FG_EUNSUPPORTED), bagua decentralized with
 * peer_selection_mode shift_one on an odd number of ranks (of nodes, when
 * hierarchical), fsdp HYBRID_SHARD with a shard group size (0: local_world)
 * that does not divide the world (FG_EINVAL). A job of one rank under a kind
 * of a process per device runs as single: FG_OK. The fabric calls it at
 * fg_fabric_new; setup checks the same again. Thread-safe. */
FG_API FG_MUST_USE fg_status fg_strategy_check_job(fg_strategy_kind kind, const fg_ddp_opts *ddp,
                                                   const fg_sharded_opts *sharded,
                                                   fg_dtype param_dtype, fg_dtype grad_dtype,
                                                   int world, int nodes, int local_world);

/* The model-state bytes one rank holds under a strategy, what `fulgur env`
 * prints: the parameters, their gradients and the optimizer's state
 * (nstates buffers of the parameters' layout: AdamW 2, SGD with momentum 1). */
typedef struct fg_strategy_memory {
    int64_t param_bytes, grad_bytes, optim_bytes;
} fg_strategy_memory;

/* The model state rank `rank` of `world` holds under `kind` (o: the sharded
 * options, may be NULL) for a model of numel parameters of `dtype` with an
 * optimizer of nstates state buffers: everything under single, dp and the
 * ddp kinds (and fsdp NO_SHARD); under deepspeed_stage_1/2 and fsdp
 * SHARD_GRAD_OP the parameters and gradients whole and the state of this
 * rank's shard (fg_strategy_shard_range's cut); under deepspeed_stage_3 and
 * fsdp FULL_SHARD the shard of all three between steps (the units gathered
 * during forward and backward come on top); under HYBRID_SHARD the same
 * over groups of o->hybrid_shard_size ranks (0 here: one group). FG_EINVAL
 * for values out of range. Thread-safe. */
FG_API FG_MUST_USE fg_status fg_strategy_memory_of(fg_strategy_kind kind, const fg_sharded_opts *o,
                                                   int world, int rank, int64_t numel,
                                                   fg_dtype dtype, int nstates,
                                                   fg_strategy_memory *out);

typedef struct fg_strategy fg_strategy;

/* A strategy for `model` (and `opt`, may be NULL except under the sharded
 * kinds, post_localsgd and bagua's low_precision_decentralized, qadam
 * (AdamW) and async), both borrowed for the strategy's life. The ddp kinds (ddp,
 * ddp_spawn, ddp_fork: the same once the ranks exist) and the sharded kinds
 * need comm (borrowed); single and dp ignore it. ddp (may be NULL) holds
 * ddp's options, also those of fsdp with NO_SHARD; sharded (may be NULL) the
 * sharded kinds' options. dp_threads is the number of replicas of dp and
 * ddp2 (0 = 2). Setup is collective under ddp and the sharded kinds: rank 0's
 * parameters are broadcast to every rank.
 *
 * ddp2 is dp in each process (one per node) with comm (borrowed; NULL or a
 * group of one: plain dp) joining the processes: rank 0's parameters at
 * setup (collective), and after fg_strategy_step (or fg_strategy_backward)
 * with sync on, the flat gradient averaged over the processes (collective).
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
 * Stage 3 (deepspeed_stage_3, fsdp FULL_SHARD and HYBRID_SHARD) shards the
 * parameters too (docs/sharding.md): setup hooks the model's units
 * (sharded.min_num_params) and releases the parts of the flat parameter
 * and gradient buffers other ranks own; each unit is gathered around its
 * forward and backward through the model's forward (fg_module_forward on
 * the root), so forwards and backwards are collective; the optimizer step
 * gathers nothing; after backward the flat gradient holds the averaged
 * shard and zeros elsewhere. A model made under empty init
 * (fg_module_set_empty_init) is initialised shard by shard from rank 0's
 * seed instead of broadcast. Freeing the strategy leaves the model holding
 * this rank's shard only (fg_strategy_gather_params first to keep it
 * whole); a model freed first is forgotten.
 *
 * Returns the strategy, owned by the caller (fg_strategy_free), or NULL on
 * failure (fg_last_error, fg_last_status): FG_EINVAL (NULL model, a kind
 * out of range, ddp or a sharded kind without comm, a sharded kind without
 * an optimizer over the model, bad sharded options, a HYBRID_SHARD group
 * size that does not divide the world), the broadcast's, FG_ENOMEM. */
FG_API fg_strategy *fg_strategy_new(fg_strategy_kind kind, fg_comm *comm, fg_module *model,
                                    fg_optimizer *opt, const fg_ddp_opts *ddp,
                                    const fg_sharded_opts *sharded, int dp_threads);
FG_API void fg_strategy_free(fg_strategy *s);
FG_API fg_strategy_kind fg_strategy_kind_of(const fg_strategy *s);

/* Whether the strategy shards the optimizer state: deepspeed_stage_1,
 * _2, _3 and fsdp with SHARD_GRAD_OP, FULL_SHARD or HYBRID_SHARD, on more
 * than one rank. */
FG_API bool fg_strategy_is_sharded(const fg_strategy *s);

/* Whether it shards the parameters too (deepspeed_stage_3, fsdp FULL_SHARD
 * and HYBRID_SHARD). Between a forward and the end of its backward the
 * units in use are gathered; otherwise a rank's flat parameter buffer
 * holds valid values only in fg_strategy_param_range (the rest of it is
 * released memory that reads as anything). */
FG_API bool fg_strategy_shards_params(const fg_strategy *s);

/* The elements [*begin, *end) of the flat parameter vector that rank
 * `rank` holds between steps: its shard under a strategy that shards the
 * parameters, everything otherwise. What a consolidated save gathers and
 * what a load reads on each rank. FG_EINVAL for a rank out of range. */
FG_API FG_MUST_USE fg_status fg_strategy_param_range(const fg_strategy *s, int rank, int64_t *begin,
                                                     int64_t *end);

/* Where this rank's range of fg_strategy_param_range lives between steps,
 * at its first element, for reading or writing it whole (checkpoints): the
 * model's flat parameter buffer, or, with offload_params_device nvme, the
 * mapping of the file that holds the shard (what is written there is what
 * the next forward gathers). NULL for a NULL strategy. */
FG_API void *fg_strategy_param_data(fg_strategy *s);

/* FSDP's summon_full_params: every rank gathers the whole model into its
 * flat parameter buffer (collective; a no-op unless the parameters are
 * sharded). It stays whole, forwards (sampling, evaluation) running on it
 * without communicating, until fg_strategy_release_params (collective only
 * in that every rank should call it), the next backward or the next
 * optimizer step. */
FG_API FG_MUST_USE fg_status fg_strategy_gather_params(fg_strategy *s);
FG_API FG_MUST_USE fg_status fg_strategy_release_params(fg_strategy *s);

/* Stage 3: the most parameter elements outside its shard this rank held
 * gathered at once so far (the units in use and the one prefetched), and
 * the number of units (the root's included). 0 otherwise. */
FG_API int64_t fg_strategy_peak_gathered(const fg_strategy *s);
FG_API int fg_strategy_num_units(const fg_strategy *s);

/* The shard of `rank` under a sharding strategy: elements [*begin, *end) of
 * the flat parameter vector (fg_module_flat_params) whose optimizer state
 * and averaged gradient that rank keeps. Shards are contiguous, in rank
 * order, and split the vector as evenly as whole 64-byte lines allow (no
 * padding: they differ by at most one line). Without sharding the one shard
 * is everything: [0, numel) for every rank. FG_EINVAL for a rank out of
 * range. */
FG_API FG_MUST_USE fg_status fg_strategy_shard_range(const fg_strategy *s, int rank, int64_t *begin,
                                                     int64_t *end);

/* Backward from loss; under ddp with sync on, returns with the gradients
 * averaged over ranks, under the sharded kinds with this rank's shard of
 * them averaged (collective). With sync off (gradient accumulation) it is
 * a local backward under every kind. */
FG_API FG_MUST_USE fg_status fg_strategy_backward(fg_strategy *s, fg_tensor *loss);
/* The optimizer step under the strategy: fg_optimizer_step(opt) for every
 * kind but hivemind, whose step accumulates the gradient and steps only
 * when the swarm has reached target_batch_size (*stepped, may be NULL,
 * says whether the optimizer stepped). */
FG_API FG_MUST_USE fg_status fg_strategy_optimizer_step(fg_strategy *s, fg_optimizer *opt,
                                                        bool *stepped);
/* Waits for the work a strategy runs in the background between optimizer
 * step calls (hivemind's delay_optimizer_step: the round of the last
 * epoch, its averaging and step) and puts its result in the model and the
 * optimizer, so that both hold one consistent state: the fabric's save and
 * load call it first, and a caller that reads or writes the parameters or
 * the optimizer's state itself between step calls must too. A failure of
 * that work comes back here (or at the next step call). FG_OK at once for
 * the other kinds and when nothing runs. The training thread's call, as
 * the step's. */
FG_API FG_MUST_USE fg_status fg_strategy_settle(fg_strategy *s);
FG_API void fg_strategy_set_sync(fg_strategy *s, bool sync);

/* dp: splits batch b along its first dim into one part per replica, runs
 * fn(part, ud) -> loss on each replica's thread, backward of each part's
 * loss weighted by its share, and sums the replicas' gradients into the
 * model's. Other strategies call fn once on the whole batch. part_losses
 * (may be NULL) gets up to max_parts losses, *nparts their count. */
typedef fg_tensor *(*fg_strategy_step_fn)(fg_module *replica, fg_batch *part, void *ud);
FG_API FG_MUST_USE fg_status fg_strategy_step(fg_strategy *s, fg_batch *b, fg_strategy_step_fn fn,
                                              void *ud, double *part_losses, int max_parts,
                                              int *nparts, double *loss);

/* Under ddp_opts.deterministic: the mean of the losses of every micro-batch
 * of every rank in the latest synchronising backward, summed in the
 * gradients' fixed tree order (the same bits on any world size).
 * FG_ESTATE when the strategy is not deterministic or nothing was
 * synchronised yet; FG_EINVAL for NULL. */
FG_API FG_MUST_USE fg_status fg_strategy_step_loss(const fg_strategy *s, double *loss);

/* Bytes this rank handed to the communicator to synchronise gradients
 * (and, under post_localsgd and Bagua's decentralized, qadam and async, the
 * weights or momenta): counted at each call, count x the dtype's size of
 * what was reduced or sent, not the traffic of the algorithm underneath (a
 * ring allreduce moves about twice that); docs/bagua.md gives each Bagua
 * algorithm's formula. */
typedef struct fg_comm_bytes {
    int64_t steps;       /* backwards with sync so far */
    uint64_t total;      /* over all of them */
    uint64_t last_step;  /* in the latest, with the parameter averaging after its step */
    uint64_t dense_step; /* plain ddp's per step: every gradient element in its dtype */
} fg_comm_bytes;

/* The byte counts of s (all zero for single and dp). FG_EINVAL for NULL.
 * Call between steps. */
FG_API FG_MUST_USE fg_status fg_strategy_comm_bytes(const fg_strategy *s, fg_comm_bytes *out);

/* Global gradient norm and clipping to max_norm (max_norm <= 0: the norm
 * only): when the norm exceeds max_norm, the gradients are scaled by
 * max_norm / (norm + 1e-6). Under ddp every rank holds the whole averaged
 * gradient and nothing is communicated; under the sharded kinds the norm
 * is sqrt of the sum over ranks of each shard's sum of squares (an
 * allreduce: collective) and each rank scales its shard. *total_norm (may
 * be NULL) gets the norm before clipping. */
FG_API FG_MUST_USE fg_status fg_strategy_clip_grad_norm(fg_strategy *s, double max_norm,
                                                        double *total_norm);

#ifdef __cplusplus
}
#endif
#endif
