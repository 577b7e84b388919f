/* fulgur fabric: the user-facing object of a training program (Lightning's
 * LightningLite, today's Fabric). The same loop runs on one
 * process or many:
 *
 *   static int run(fg_fabric *f, void *arg) {
 *       fg_module *model = fg_gpt_new(&cfg);
 *       fg_optimizer *opt = fg_adamw_new(model, &(fg_adamw_opts){.lr = 3e-4});
 *       fg_fabric_setup(f, model, opt);            // broadcast, buckets
 *       fg_dataloader *dl = fg_fabric_setup_dataloader(f, loader, true);
 *       for (fg_batch *b; (b = fg_dataloader_next(dl)); ) {
 *           fg_tensor *loss = fg_cross_entropy(fg_module_forward(model, b->x), b->y, -100);
 *           fg_fabric_backward(f, loss);           // DDP buckets overlap here
 *           fg_fabric_optimizer_step(f, opt);      // 16-mixed: the loss scaler
 *           fg_optimizer_zero_grad(opt);
 *           fg_fabric_step_end(f);                 // frees the step's tensors
 *       }
 *       return 0;
 *   }
 *   int main(void) {
 *       fg_fabric *f = fg_fabric_new(&(fg_fabric_config){.devices = "-1", .strategy = "ddp"});
 *       return f ? fg_fabric_launch(f, run, NULL) : 2;
 *   }
 *
 * Collective calls (marked so) must be made by every rank in the same order. */
#ifndef FULGUR_FABRIC_H
#define FULGUR_FABRIC_H

#include <stdio.h>

#include "fulgur/ckpt.h"
#include "fulgur/launch.h"
#include "fulgur/precision.h"
#include "fulgur/strategy.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fg_fabric fg_fabric;

/* A custom cluster environment (Lightning's ClusterEnvironment plugin): fills
 * where this process stands; returns FG_OK or an error with a message. */
typedef FG_MUST_USE fg_status (*fg_cluster_fn)(void *ud, fg_cluster_info *out);

/* The configuration: Lightning's Fabric arguments. Every string is read by
 * the launch layer (launch.h), as `fulgur env` and `fulgur fit` read them,
 * and copied by fg_fabric_new. All-zero means the defaults. */
typedef struct fg_fabric_config {
    const char *accelerator; /* NULL = "auto" (a GPU when one answers, else the CPU), "cpu",
                                "gpu"/"cuda" (with the CUDA backend), "guarded" (the test
                                device: docs/devices.md) */
    const char *devices;     /* NULL = "auto": one device, or under a launcher (fulgur run,
                                torchrun, mpirun, srun) the ranks it started on this node;
                                "3", "-1", "0,2", "[0, 2]" (fg_launch_parse_devices); a
                                device is a rank on CPU */
    const char *strategy;    /* NULL = "auto" (single for one device, else ddp), or a name of
                                the strategy table (kinds.h: fg_strategy_names lists them;
                                fg_launch_parse_strategy) */
    const char *precision;   /* NULL = "32-true", or a setting of the precision table
                                (kinds.h: "64-true", "bf16-mixed", "16-mixed", "bf16-true",
                                "16-true" and the short forms; fg_launch_parse_precision) */
    int num_nodes;           /* 0 = 1, or the launcher's nodes */
    int threads_per_rank;    /* 0 = FULGUR_NUM_THREADS, else cores / local ranks */
    FILE *print_to;          /* where fg_fabric_print writes (e.g. stdout); NULL = the log
                                hook at FG_LOG_INFO */
    uint64_t seed;           /* non-zero: fg_fabric_seed_everything(f, seed) at fg_fabric_new */
    fg_ddp_opts ddp;         /* bucket_cap_mb, find_unused_parameters, static_graph, the
                                communication hooks (checked by fg_strategy_check_ddp) */
    fg_sharded_opts sharded; /* the sharded strategies: reduce_bucket_size,
                                allgather_bucket_size, sharding_strategy (fsdp: FULL_SHARD,
                                the zero value, SHARD_GRAD_OP, NO_SHARD or HYBRID_SHARD),
                                min_num_params, hybrid_shard_size, the offload
                                (offload_optimizer_device, offload_params_device,
                                nvme_path, copied); a name such as deepspeed_stage_2_offload
                                fills an offload device left FG_OFFLOAD_NONE
                                (fg_launch_strategy_offload) */
    const char *deepspeed_config; /* DeepSpeedStrategy(config=): a DeepSpeed JSON file read at
                                fg_fabric_new (fg_deepspeed_config_read) with strategy NULL,
                                "auto", "deepspeed" or "deepspeed_stage_N": its
                                zero_optimization.stage picks the stage, its bucket sizes fill
                                `sharded`; any key fulgur does not honour is an error */
    fg_cluster_fn cluster; /* custom cluster environment, NULL = detect (fg_cluster_detect) */
    void *cluster_ud;
    bool deterministic; /* Lightning's `deterministic`: bitwise the same parameters on
                           any number of ranks for the same global batch (below) */
    /* Recompute each transformer block's activations in backward
     * (fg_module_set_activation_checkpointing of the model's "Block"
     * modules at fg_fabric_setup; FSDPStrategy's
     * activation_checkpointing_policy={Block}), under every strategy; under
     * stage 3 a block is recomputed while its unit is gathered. */
    bool activation_checkpointing;
} fg_fabric_config;

/* Reads a DeepSpeed JSON configuration (the file of Lightning's
 * DeepSpeedStrategy(config=...)) into *stage (zero_optimization.stage: 1, 2
 * or 3; 0 when the file gives none) and *out (allgather_bucket_size,
 * reduce_bucket_size; the rest zero). The keys fulgur honours:
 * zero_allow_untested_optimizer, and in zero_optimization: stage,
 * allgather_bucket_size, reduce_bucket_size (positive element counts, 5e8
 * allowed), overlap_comm (true under stage 2 and 3, false under stage 1:
 * what fulgur does), contiguous_gradients, reduce_scatter,
 * allgather_partitions, ignore_unused_parameters (true: what fulgur does),
 * cpu_offload, offload_optimizer and offload_param with device "none" or
 * "cpu" (on a CPU nothing moves; the strategy's offload devices become cpu);
 * "nvme" is FG_EUNSUPPORTED there, saying to set it through the strategy's
 * options (offload_optimizer_device / offload_params_device and nvme_path).
 * Any other key, at the top or inside, is FG_EINVAL naming it: a DeepSpeed
 * key fulgur does not honour says what to do instead (gradient_clipping:
 * fg_fabric_clip_gradients), an unknown key names the nearest honoured
 * one. FG_EIO if the file cannot be read, FG_EINVAL for invalid JSON
 * (with its line and column) or a value of the wrong kind; stage 0 is
 * FG_EINVAL (ZeRO off is ddp). Thread-safe. */
FG_API FG_MUST_USE fg_status fg_deepspeed_config_read(const char *path, int *stage,
                                                      fg_sharded_opts *out);

/* The optimizer and scheduler sections of a DeepSpeed JSON configuration
 * (honoured, where DeepSpeed's engine would build them itself): optimizer
 * "Adam" (DeepSpeed's FusedAdam: decoupled weight decay unless
 * "adam_w_mode": false) or "AdamW" with params lr, betas, eps,
 * weight_decay (torch_adam accepted; amsgrad and bias_correction false
 * refused by name); scheduler "WarmupLR" (warmup_min_lr, warmup_max_lr,
 * warmup_num_steps, warmup_type "log" or "linear"), "WarmupDecayLR"
 * (+ total_num_steps) or "WarmupCosineLR" (total_num_steps,
 * warmup_min_ratio, warmup_num_steps, cos_min_ratio, warmup_type), with
 * DeepSpeed's defaults. Any other type or key is FG_EINVAL naming it (the
 * nearest type for a scheduler). */
typedef enum fg_ds_sched_kind {
    FG_DS_SCHED_NONE = 0,
    FG_DS_WARMUP_LR,
    FG_DS_WARMUP_DECAY_LR,
    FG_DS_WARMUP_COSINE_LR,
} fg_ds_sched_kind;
typedef struct fg_deepspeed_train {
    bool has_optimizer, decoupled;
    double lr, beta1, beta2, eps, weight_decay;
    fg_ds_sched_kind sched; /* FG_DS_SCHED_NONE: no scheduler section */
    double warmup_min_lr, warmup_max_lr, warmup_min_ratio, cos_min_ratio;
    int64_t warmup_num_steps, total_num_steps;
    bool warmup_linear;
} fg_deepspeed_train;
/* Reads the two sections of the file at path (zeros when it has neither).
 * FG_EIO, FG_EINVAL as fg_deepspeed_config_read. */
FG_API FG_MUST_USE fg_status fg_deepspeed_train_read(const char *path, fg_deepspeed_train *out);
/* The optimizer the section describes over m (every parameter decayed, as
 * DeepSpeed's one group); NULL with FG_EINVAL without one. */
FG_API fg_optimizer *fg_deepspeed_optimizer_new(const fg_deepspeed_train *c, fg_module *m);
/* The lr of optimizer step `step` (0-based) under the scheduler section,
 * as DeepSpeed's schedulers give it (WarmupCosineLR scales the optimizer's
 * lr, c->lr); c->lr without a scheduler. A pure function of the step: a
 * resumed run continues the same curve. */
FG_API double fg_deepspeed_lr_at(const fg_deepspeed_train *c, int64_t step);

/* Makes the launch plan for cfg (NULL = defaults) in this environment
 * (fg_launch_plan_make, or cfg->cluster's environment) without starting
 * anything: every value is checked here, the sharded options too
 * (fg_strategy_check_sharded). NULL with fg_last_error naming the
 * bad value and the valid ones (FG_EINVAL, FG_EUNSUPPORTED, FG_EMISMATCH
 * when a launcher's world size disagrees with devices x num_nodes, FG_ENOMEM);
 * the CLI turns that into exit code 2. Free with fg_fabric_free. */
FG_API fg_fabric *fg_fabric_new(const fg_fabric_config *cfg);
/* Frees f (what a launch left behind too). NULL is a no-op. */
FG_API void fg_fabric_free(fg_fabric *f);

/* Makes the launch plan again (the environment may have changed since
 * fg_fabric_new) and runs `run` on every rank by the plan's launcher:
 *   none (single; ddp of one rank; launched by `fulgur run`, mpirun, srun or
 *     torchrun): joins the job and runs here;
 *   threads (dp): runs here; the strategy splits each batch over threads;
 *   re-exec (ddp, not launched): fg_launch_reexec starts this program again
 *     once per other local rank with the environment contract (fulgur's and
 *     torchrun's names); this process is rank 0 and waits for the others
 *     after run returns, then removes the contract from its environment
 *     (fg_launch_unexport: also MASTER_ADDR/PORT and NODE_RANK set by hand);
 *   fork (ddp_spawn, ddp_fork): fg_launch_fork runs every rank in a forked
 *     child; this process is no rank and waits; afterwards it holds rank 0's
 *     trained state (fg_fabric_spawn_result).
 * After a successful run every rank waits at a barrier, so none leaves while
 * others still talk. A rank that dies stops the others (re-exec: its death
 * aborts rank 0's communicator, so a collective waiting on it returns).
 * Returns run's return value (0 on success), or non-zero after an error
 * with fg_last_error saying which rank failed and why ("rank 2 (pid 4242)
 * was killed by signal 9 (SIGKILL); stopped the other 2 ranks"). Not
 * thread-safe; FG_ESTATE (returns 1) when called from inside a run. */
FG_API int fg_fabric_launch(fg_fabric *f, int (*run)(fg_fabric *f, void *arg), void *arg);

/* After a ddp_spawn/ddp_fork launch, in the parent: copies rank 0's
 * parameters (and optimizer state when opt is not NULL) as of its last
 * fg_fabric_step_end into model/opt, which must have the architecture the
 * ranks trained. Errors: FG_ESTATE if there is no result, FG_EMISMATCH
 * naming both sizes if model differs, FG_EINVAL for NULL. */
FG_API FG_MUST_USE fg_status fg_fabric_spawn_result(fg_fabric *f, fg_module *model,
                                                    fg_optimizer *opt);

/* Prepares model and optimizer for the strategy (collective): ddp broadcasts
 * rank 0's parameters and builds the gradient buckets; dp makes the thread
 * replicas; the sharded strategies broadcast, build their buckets and cut
 * the optimizer's state to this rank's shard, after which
 * fg_optimizer_step is collective (it all-gathers the parameters; strategy.h
 * and docs/sharding.md). After seed_everything, the model's Dropout modules get this
 * rank's own stream (fg_fabric_rank_seed), so masks differ between ranks.
 * Both stay owned by the caller. One model per fabric and launch: setting
 * up the model already set up again only replaces the optimizer (not
 * collective then; a Trainer's fit after its validate in one run; under
 * the sharded strategies, which shard the optimizer at setup, it must be
 * the same optimizer or NULL, else FG_ESTATE), another model is FG_ESTATE;
 * the launch's end forgets the setup. Under bf16-mixed and 16-mixed it
 * also turns on the calling thread's autocast (fg_fabric_autocast_begin),
 * as Lightning's setup wraps the model's forward in autocast; it stays on
 * until fg_fabric_launch's run returns. */
FG_API FG_MUST_USE fg_status fg_fabric_setup(fg_fabric *f, fg_module *model, fg_optimizer *opt);

/* Lightning's fabric.setup(model, opt1, opt2, ...) and several models (a
 * GAN's generator and discriminator, a teacher and a student, an EMA copy):
 * the models are sub-modules of ONE tree (children of a container module
 * you build with fg_module_new and fg_module_add_child, or the root itself),
 * because ddp's buckets and a checkpoint's layout are ranges of one flat
 * buffer; the strategy is set up over that tree's root, once (collective, as
 * fg_fabric_setup). Each optimizer is over one of the models or a
 * sub-module of one (fg_optimizer_module), and no two optimizers share a
 * parameter; opts[0] is the one fg_fabric_setup would take. Every
 * optimizer then steps through fg_fabric_optimizer_step on its own range of
 * the gradients. fg_fabric_model returns the root. With more than one
 * optimizer only single, ddp, ddp_spawn and ddp_fork are supported, not
 * 16-mixed (its loss scaler steps one optimizer): FG_EUNSUPPORTED naming
 * the setting. Errors: FG_EINVAL (NULL arrays or entries, nmodels or nopts
 * out of 1..FG_FABRIC_MAX_OPTIMIZERS / 0..FG_FABRIC_MAX_OPTIMIZERS, models of
 * two trees, an optimizer over a module of no model, two optimizers over
 * one parameter, each naming the index), fg_fabric_setup's. */
#define FG_FABRIC_MAX_OPTIMIZERS 8
FG_API FG_MUST_USE fg_status fg_fabric_setup_many(fg_fabric *f, fg_module *const *models,
                                                  int nmodels, fg_optimizer *const *opts,
                                                  int nopts);

/* Puts the distributed sampler into `dl` (rank r of N takes r, r+N, ... of
 * the epoch's order, shuffled as dl's options say with dl's seed: the
 * fabric's when dl was made with seed 0 after seed_everything) unless
 * use_distributed is false, and logs the effective batch size. The loader's
 * worker seeds then derive from (seed, rank, worker). dl is borrowed: it
 * stays the caller's, also on failure, so keep the pointer and free it
 * (fg_dataloader_free) whatever this returns. Returns dl, or NULL on failure
 * (fg_last_error, fg_last_status): FG_EINVAL for a NULL dl, the sampler's
 * errors. A loader over a stream (fg_dataloader_from_stream) gets no
 * sampler: with use_distributed it is split by this rank and the world
 * (fg_dataloader_split_stream), at (epoch 0, batch 0). */
FG_API fg_dataloader *fg_fabric_setup_dataloader(fg_fabric *f, fg_dataloader *dl,
                                                 bool use_distributed);

/* loss.backward(): under ddp the gradients are averaged over ranks when it
 * returns (unless no_backward_sync is on). Collective under ddp. Under
 * 16-mixed the loss is multiplied by the loss scale first, so the
 * gradients are scaled until fg_fabric_optimizer_step (or
 * fg_fabric_clip_gradients) divides them again; FG_ESTATE if the optimizer
 * stepped since the last backward other than through
 * fg_fabric_optimizer_step. */
FG_API FG_MUST_USE fg_status fg_fabric_backward(fg_fabric *f, fg_tensor *loss);

/* Gradient accumulation: while on, backward does not synchronise (ddp's
 * no_sync); turn it off for the last micro-batch. */
FG_API void fg_fabric_set_no_backward_sync(fg_fabric *f, bool on);

/* One training step that the dp strategy can split: step(f, part, ud) is
 * called on each part of the batch (one part unless dp), returning that
 * part's loss; step_end (may be NULL) sees every part's loss, as Lightning's
 * training_step_end. Runs forward+backward; *loss gets the batch's mean loss.
 * step runs under the precision's autocast (on every dp replica's thread
 * too); under 16-mixed the fabric scales the loss for backward and reports
 * the unscaled losses. */
typedef fg_tensor *(*fg_step_fn)(fg_fabric *f, fg_batch *part, void *ud);
typedef void (*fg_step_end_fn)(fg_fabric *f, const double *part_losses, int nparts, void *ud);
FG_API FG_MUST_USE fg_status fg_fabric_training_step(fg_fabric *f, fg_batch *b, fg_step_fn step,
                                                     fg_step_end_fn step_end, void *ud,
                                                     double *loss);

/* The optimizer step, Lightning's wrapped optimizer.step(): under 16-mixed
 * PyTorch's GradScaler step and update (fg_scaler_step): the gradients are
 * unscaled (unless fg_fabric_clip_gradients did), checked for inf/NaN on
 * every rank (one allreduce: collective under ddp), and the step is taken,
 * or skipped on every rank with the scale halved and a warning logged;
 * after 2000 clean steps the scale doubles. Under the other settings it is
 * fg_optimizer_step. Under 16-mixed a program must step through this call:
 * fg_optimizer_step would apply scaled gradients (the next backward refuses
 * to run, see fg_fabric_backward). Errors: FG_EINVAL (NULL), the
 * optimizer's and the allreduce's. */
FG_API FG_MUST_USE fg_status fg_fabric_optimizer_step(fg_fabric *f, fg_optimizer *opt);

/* Lightning's fabric.autocast(): turns the calling thread's autocast
 * (autograd.h, fg_autocast_set) to the precision setting's: bf16 under
 * bf16-mixed, f16 under 16-mixed, off otherwise. Returns the previous
 * setting for fg_fabric_autocast_end, which restores it:
 *   fg_dtype prev = fg_fabric_autocast_begin(f); ...; fg_fabric_autocast_end(f, prev);
 * fg_fabric_setup turns it on for its thread, and fg_fabric_training_step
 * for each dp replica's thread: this is for other threads and for code
 * outside those. Thread-safe (each thread its own setting). */
FG_API fg_dtype fg_fabric_autocast_begin(fg_fabric *f);
FG_API void fg_fabric_autocast_end(fg_fabric *f, fg_dtype prev);

/* Clips gradients by their global norm over all ranks (collective);
 * *total_norm (may be NULL) gets the norm before clipping. Under 16-mixed
 * the gradients are unscaled first (fg_scaler_unscale), as PyTorch wants
 * before clipping. Under the sharded strategies each rank holds the
 * averaged gradient of its shard only: the norm sums the shards' squares
 * over ranks, and each rank scales its shard (fg_strategy_clip_grad_norm). */
FG_API FG_MUST_USE fg_status fg_fabric_clip_gradients(fg_fabric *f, double max_norm,
                                                      double *total_norm);
/* Lightning's precision plugin unscale_gradients: under 16-mixed divides
 * the gradients by the loss scale and agrees over the ranks whether any is
 * inf or NaN (collective under ddp), once before a step (a second call, and
 * the step's own unscale, then do nothing), so that code between backward
 * and fg_fabric_optimizer_step sees true gradients (clipping by value, a
 * Trainer's on_before_optimizer_step). Nothing under the other settings. */
FG_API FG_MUST_USE fg_status fg_fabric_unscale_gradients(fg_fabric *f);

/* Collectives on tensors (in place) and bytes. Collective. */
FG_API FG_MUST_USE fg_status fg_fabric_all_reduce(fg_fabric *f, fg_tensor *t, fg_reduce_op op);
/* out must have world_size * numel(t) elements of t's dtype. */
FG_API FG_MUST_USE fg_status fg_fabric_all_gather(fg_fabric *f, const fg_tensor *t, fg_tensor *out);
FG_API FG_MUST_USE fg_status fg_fabric_broadcast(fg_fabric *f, fg_tensor *t, int root);
FG_API FG_MUST_USE fg_status fg_fabric_broadcast_bytes(fg_fabric *f, void *buf, size_t n, int root);
FG_API FG_MUST_USE fg_status fg_fabric_barrier(fg_fabric *f);
/* One double reduced over the ranks into *out (v itself on one rank).
 * Collective. A failed all-reduce (a peer gone, the group broken) returns
 * its status with the comm layer's message naming the peer and leaves *out
 * alone: a failure is never a value (no NaN that would read as "don't save"
 * or "don't stop"). */
FG_API FG_MUST_USE fg_status fg_fabric_reduce_scalar(fg_fabric *f, double v, fg_reduce_op op,
                                                     double *out);

/* printf on global rank 0 only, to cfg.print_to (flushed), or through the
 * log hook at FG_LOG_INFO when that is NULL: the fabric picks no stream
 * itself. Other ranks write nothing. */
FG_API void fg_fabric_print(fg_fabric *f, const char *fmt, ...) FG_PRINTF(2, 3);

/* Lightning's seed_everything: `seed` becomes the process's default seed
 * (fg_set_default_seed), which whatever is built afterwards with a seed
 * left at 0 uses: model initialisation (fg_mlp_config.seed,
 * fg_gpt_config.seed, fg_module_set_seed), data loaders (fg_loader_opts.seed:
 * the shuffle order, the same on every rank, so the distributed sampler
 * splits one order; worker seeds derived per rank and worker). Streams that
 * must differ per rank derive from fg_fabric_rank_seed: fg_fabric_setup
 * gives each rank's Dropout modules their own. So the same seed gives the
 * same initial weights and batch order, run after run. Call it before
 * building models and loaders (cfg.seed does it in fg_fabric_new, and so
 * in every rank). Process-wide and lasting, as Lightning's; not
 * thread-safe against building models on other threads. */
FG_API void fg_fabric_seed_everything(fg_fabric *f, uint64_t seed);
/* The seed set by seed_everything (0 if none). */
FG_API uint64_t fg_fabric_seed(const fg_fabric *f);
/* A seed for this rank's own stream (dropout masks that must differ per
 * rank): fg_rng_derive(seed, global rank + 1). */
FG_API uint64_t fg_fabric_rank_seed(const fg_fabric *f);

/* rank_zero_first: rank 0 runs the block first (downloads, preprocessing),
 * the others after it. Collective. */
FG_API FG_MUST_USE fg_status fg_fabric_rank_zero_first_begin(fg_fabric *f);
FG_API FG_MUST_USE fg_status fg_fabric_rank_zero_first_end(fg_fabric *f);

/* Ends a training step: frees this thread's step tensors (fg_step_reset);
 * under ddp_spawn/ddp_fork, rank 0 also keeps a copy of its parameters and
 * optimizer state for the parent (fg_fabric_spawn_result). Call it once per
 * step on every rank. f may be NULL (then only the tensors are freed). Not
 * collective. */
FG_API void fg_fabric_step_end(fg_fabric *f);

/* ------------------------------------------------------- stopping early */

/* Asks for a stop at the next step boundary (a resumable stop: finish the
 * step, save, exit), and returns how many stops were asked so far on this
 * rank, 1 for the first. Async-signal-safe: a program's SIGTERM, SIGINT or
 * SIGUSR1 handler may call it (the library installs no handler of its own),
 * but better a thread that takes those signals with sigwait while every
 * other thread blocks them, as fulgur fit does: a handler runs on the
 * interrupted thread's stack, and oneDNN's jit gemm kernels before 3.11
 * point rsp into the heap while they run (docs/fault-tolerance.md).
 * Only this rank knows until fg_fabric_should_stop. f must not be NULL. */
FG_API int fg_fabric_request_stop(fg_fabric *f);

/* Collective, once per step at the same point on every rank (after the
 * optimizer step): *stop is true on every rank when any rank asked for a
 * stop (one allreduce of a flag), so that all stop after the same step.
 * Under single and dp, whether this process asked. Errors: FG_EINVAL
 * (NULL), the allreduce's (*stop is then false). */
FG_API FG_MUST_USE fg_status fg_fabric_should_stop(fg_fabric *f, bool *stop);

/* ------------------------------------------- deterministic, elastic */

/* The deterministic mode (cfg.deterministic, Lightning's name): ddp on 1,
 * 2, 3, 4 ... ranks gives bitwise the same parameters, and the same step
 * loss, as one process, for the same global batch. The global batch is cut
 * into micro-batches of the loader's batch size, whose samples do not
 * depend on the world size (fg_fabric_setup_global_batch installs the
 * sampler that deals them); each backward computes one micro-batch's
 * gradient alone, and the synchronising backward sums all of them, of
 * every rank, in one fixed pairwise tree and divides by their count
 * (ddp_opts.deterministic, strategy.h). So: do not divide the loss by the
 * accumulation in this mode (the fabric averages), and call
 * fg_fabric_set_no_backward_sync(f, true) for every micro-batch but the
 * last of a step, as for accumulation. What else a micro-batch's gradient
 * could depend on is pinned: one kernel thread per rank unless
 * cfg.threads_per_rank says otherwise (a fixed count either way), and one
 * engine for every f32 matrix product, chosen by the machine's type instead
 * of measured per shape: oneDNN on a CPU with AVX-512 (when built in),
 * OpenBLAS otherwise; FULGUR_GEMM=openblas or onednn fixes another.
 * Built for single and ddp without communication hooks (fg_fabric_setup
 * fails with FG_EUNSUPPORTED otherwise). Dropout draws per rank
 * (fg_fabric_rank_seed): keep it off for bitwise equality across world
 * sizes. The price: about A times ddp's gradient traffic (A = the rank's
 * micro-batches per step) and A + 2 gradient-sized buffers; the step rate
 * on one thread per rank (docs/fault-tolerance.md has the figures). */
FG_API bool fg_fabric_deterministic(const fg_fabric *f);
struct fg_train_state; /* below: save, load */

/* Under deterministic: the mean loss over every micro-batch of every rank
 * of the latest synchronised step, summed in the gradients' tree order (the
 * same bits on any world size), unscaled under 16-mixed. Not collective.
 * FG_ESTATE outside the mode or before the first synchronised backward. */
FG_API FG_MUST_USE fg_status fg_fabric_step_loss(fg_fabric *f, double *loss);

/* The global batch of the training loader dl (after
 * fg_fabric_setup_dataloader): samples per optimizer step over all ranks,
 * batch size x world x *accumulate, kept across a resume on another world
 * size (elastic training).
 *   accumulate: in: the micro-batches per rank and step the program asks
 *               for (>= 1); out: the ones that keep the global batch.
 *   resumed:    NULL for a fresh start (dl goes to epoch 0); else the state
 *               fg_fabric_load filled in. When the checkpoint was saved on
 *               another world size, its global_batch (when it has one) is
 *               kept: *accumulate becomes global_batch / (batch x world)
 *               (on the same world size *accumulate is taken as asked).
 *               dl goes to the sample
 *               position of the checkpoint (samples_in_epoch: every rank
 *               together took that prefix of the epoch's order), so that
 *               the remaining samples of the epoch are dealt to this run's
 *               ranks, none skipped and none twice. A checkpoint without
 *               them (an older one) resumes at its (epoch, batch_in_epoch).
 * Under deterministic it also installs the distributed sampler that deals
 * the epoch in blocks of one batch (each a micro-batch, the same samples on
 * any world size) and cuts it to whole global batches, so an epoch is whole
 * steps. Collective only in that it must be called on every rank alike.
 * When the global batch cannot be kept on this world size (not a multiple
 * of batch x world), or the position falls between two batches of this
 * world size: under deterministic FG_EINVAL (naming the batch sizes that
 * would keep it); otherwise the run goes on with *accumulate as asked, or
 * from the batch boundary before the position (the samples between are
 * taken again), with an FG_LOG_WARN line saying so, and the caller can
 * tell by comparing global batches and fg_dataloader_sample_position.
 * Errors: also FG_EINVAL for a NULL dl or accumulate, the loader's errors. */
FG_API FG_MUST_USE fg_status fg_fabric_setup_global_batch(fg_fabric *f, fg_dataloader *dl,
                                                          int64_t *accumulate,
                                                          const struct fg_train_state *resumed);

/* ------------------------------------------------------------ save, load */

/* The state a checkpoint holds. model is required; the rest optional. The
 * model and optimizer are borrowed for the call. */
typedef struct fg_train_state {
    fg_module *model;
    fg_optimizer *optimizer;
    int64_t step, epoch, batch_in_epoch; /* trainer counters */
    uint64_t seed;
    /* elastic resume: samples of the epoch's order every rank together took
     * (fg_dataloader_sample_position) and the global batch; saved when
     * global_batch > 0; after a load -1 and 0 when the file has none */
    int64_t samples_in_epoch, global_batch;
    /* The program's own metadata (a model config, a vocabulary, ...): nmeta
     * key/value strings stored in the file's __metadata__ beside the
     * fabric's keys, so `fulgur ckpt show` and Python's safetensors read
     * them. Borrowed for fg_fabric_save; after fg_fabric_load, every
     * metadata entry of the file, owned by the fabric. */
    const fg_kv *meta;
    int64_t nmeta;
    /* Several optimizers (fg_fabric_setup_many), with optimizer NULL: the
     * state of optimizers[N] (N from 0) as "optimizer.N.<state>.<param>"
     * under its module's parameter names, and its step count, lr and groups'
     * lr and weight decay as "optimizer.N.optimizer_steps", "optimizer.N.lr",
     * "optimizer.N.lr.<g>", "optimizer.N.weight_decay.<g>" metadata, with
     * "optimizers" = the count: Lightning's optimizer_states list. A load
     * needs the same count. Whole states only (fg_fabric_setup_many's
     * strategies): a sharded save or a state shard is FG_EUNSUPPORTED. */
    fg_optimizer *const *optimizers;
    int noptimizers;
} fg_train_state;

/* The metadata keys the fabric writes itself, which st->meta may not use:
 * format, fulgur_version, step, epoch, batch_in_epoch, seed, world_size,
 * strategy, optimizer_steps, lr, samples_in_epoch, global_batch, deterministic, and under 16-mixed
 * the loss scaler's loss_scale, loss_scale_growth_tracker, loss_scale_skipped (restored by
 * fg_fabric_load, so a resumed run scales as the uninterrupted one), and in a sharded save
 * save_id (the save's id, which every file of the save carries). */

/* Saves weights under PyTorch's dotted names, optimizer state as
 * "optimizer.<state>.<param>", the counters and st->meta as metadata, in one
 * safetensors file written atomically by global rank 0 (collective: the
 * others wait). Under a sharding strategy the file is the same, whole:
 * rank 0 streams it, receiving the parameter and optimizer state shards a
 * window of tensors (1 MiB, or one larger tensor) at a time and writing
 * each before the next, so that it never holds the whole model beyond its
 * training memory; st->optimizer must be given on every rank or on none.
 * With sharded.state_dict_type FG_STATE_DICT_SHARDED, or FG_STATE_DICT_AUTO
 * (the zero value) under the deepspeed strategies (their row's
 * saves_sharded, kinds.h: DeepSpeed's checkpoints are folders of shards)
 * with one optimizer or none, `path` is instead a folder
 * written as a whole: one safetensors file per rank holding the tensors
 * whose first element lies in its range and model.safetensors.index.json
 * (ckpt.h, docs/checkpoints.md); it appears (replacing what was at path)
 * only once every rank's file is on disk, and a rank's failure fails the
 * save on every rank, naming it, with nothing at path changed. Errors: FG_EINVAL (no path or model;
 * a negative step, epoch or batch_in_epoch;
 * an st->meta key that is empty, NULL, repeated or one of the fabric's own, or a value that is NULL
 * or not UTF-8: nothing is written), the ckpt layer's write errors; on the other ranks FG_EIO
 * saying rank 0 could not write. */
FG_API FG_MUST_USE fg_status fg_fabric_save(fg_fabric *f, const char *path,
                                            const fg_train_state *st);
/* Loads a checkpoint into st->model (and st->optimizer, counters) on every
 * rank: a file, or a sharded checkpoint's folder (fg_st_open reads both). A rank whose optimizer
 * holds a shard of the state (a sharding strategy) reads that range of it only, so a checkpoint
 * resumes at any world size and under any strategy, whatever wrote it. A checkpoint that does not
 * fit the model is FG_EMISMATCH naming the tensors that differ. The fabric's metadata keys are
 * checked first (digits only for counts, no negative step, epoch or sample count, a global batch
 * >= 1 and a multiple of world_size, a finite lr >= 0 and loss scale > 0, samples_in_epoch and
 * global_batch together): a bad one is FG_EFORMAT naming the file, the key and the value, with
 * nothing loaded. On success st->meta and st->nmeta
 * are every metadata entry of the file, in file order (the fabric's keys included), owned by the
 * fabric until its next successful load or fg_fabric_free; a failed load leaves st's counters and
 * meta, and the fabric's copy, as they were. */
FG_API FG_MUST_USE fg_status fg_fabric_load(fg_fabric *f, const char *path, fg_train_state *st);
/* The value of metadata `key` in the checkpoint the last successful
 * fg_fabric_load read, or NULL (no such key, or no load yet); owned by the
 * fabric as st->meta is. */
FG_API const char *fg_fabric_loaded_meta(const fg_fabric *f, const char *key);

/* ------------------------------------------------------------ properties */

/* The launch plan: fg_fabric_new's, then the one fg_fabric_launch followed
 * (fg_launch_plan_format writes it as one line). Borrowed, valid as long as
 * f. */
FG_API const fg_launch_plan *fg_fabric_plan(const fg_fabric *f);

/* The parameter dtype the precision setting asks for (f32 for "32" and the
 * mixed settings, f64 for "64"): models built inside run() should use it. */
FG_API fg_dtype fg_fabric_dtype(const fg_fabric *f);
/* The precision setting (precision.h). */
FG_API fg_precision_kind fg_fabric_precision(const fg_fabric *f);
/* The loss scaler of 16-mixed (its scale and skipped steps:
 * fg_scaler_get_state), NULL under the other settings. Borrowed. */
FG_API const fg_scaler *fg_fabric_scaler(const fg_fabric *f);
/* Kernel threads of each rank (the plan's, set on every rank at launch). */
FG_API int fg_fabric_threads(const fg_fabric *f);

FG_API int fg_fabric_world_size(const fg_fabric *f);
FG_API int fg_fabric_global_rank(const fg_fabric *f);
FG_API int fg_fabric_local_rank(const fg_fabric *f);
FG_API int fg_fabric_node_rank(const fg_fabric *f);
FG_API bool fg_fabric_is_global_zero(const fg_fabric *f);
FG_API const char *fg_fabric_strategy_name(const fg_fabric *f);
/* The communicator (NULL for single and dp). Borrowed. */
FG_API fg_comm *fg_fabric_comm(const fg_fabric *f);
/* True inside fg_fabric_launch (in run, on a rank), false before and after:
 * code that may be called either way (a Trainer handed a fabric) launches
 * only when this is false. NULL gives false. */
FG_API bool fg_fabric_running(const fg_fabric *f);
/* The model fg_fabric_setup prepared in this launch, or NULL (none yet, or
 * after the launch ended, or NULL f). Borrowed: the caller's. */
FG_API fg_module *fg_fabric_model(const fg_fabric *f);
/* The device this rank's model runs on: with accelerator "guarded", the
 * guarded device fg_fabric_setup opened (guarded:<local rank>), the model,
 * its optimizer and the setup thread's step tensors on it; NULL for the
 * CPU (host memory). Valid until fg_fabric_free (take a reference with
 * fg_dev_retain to keep it longer). */
FG_API fg_dev *fg_fabric_device(const fg_fabric *f);
/* Host<->device bytes of the training steps on this rank's device
 * (fg_fabric_training_step: the batch in, the loss out, and whatever else
 * the step copied), the host staging of collectives apart (comm_*: the
 * gradient buckets through a backend that reads host memory): the last
 * step's, and the sums over `steps` steps. All zero without a device. */
typedef struct fg_fabric_copies {
    uint64_t last_h2d, last_d2h, total_h2d, total_d2h;
    uint64_t total_comm_h2d, total_comm_d2h;
    int64_t steps;
    /* the same over fg_fabric_optimizer_step calls (opt_steps of them):
     * ZeRO's all-gather of the updated shards, offload's moves */
    uint64_t opt_h2d, opt_d2h, opt_comm_h2d, opt_comm_d2h;
    int64_t opt_steps;
} fg_fabric_copies;
FG_API fg_fabric_copies fg_fabric_device_copies(const fg_fabric *f);

/* Lightning's batch_to_device: *out = *b with x and y copied to this rank's
 * device (on the thread that called fg_fabric_setup); without a device
 * *out = *b. Contiguous host x and y go through two staging slots used in
 * turn, copied in on the device's comm stream with an event the compute
 * stream waits for (docs/devices.md): out's tensors stay valid until the
 * call after the next one (or the launch's end), so a step may still read
 * batch i while batch i + 1 is copied in. Other tensors are copied into
 * step tensors (released by fg_step_reset). The training step does it
 * itself (fg_fabric_training_step); validation, test and predict loops
 * call it. FG_ENOMEM with the device's message. */
FG_API FG_MUST_USE fg_status fg_fabric_batch_to_device(fg_fabric *f, const fg_batch *b,
                                                       fg_batch *out);
/* Whether this fabric's setup shards the parameters themselves
 * (deepspeed_stage_3, fsdp FULL_SHARD or HYBRID_SHARD, on more than one
 * rank), known before setup: where a model made under empty init
 * (fg_module_set_empty_init) is initialised shard by shard, never whole
 * (Lightning's sharded-model context around configure_model). */
FG_API bool fg_fabric_shards_params(const fg_fabric *f);
/* The strategy fg_fabric_setup made (NULL before it): its byte counts
 * (fg_strategy_comm_bytes), its shards. Borrowed until the launch's run
 * returns. */
FG_API const fg_strategy *fg_fabric_strategy(const fg_fabric *f);

#ifdef __cplusplus
}
#endif
#endif
