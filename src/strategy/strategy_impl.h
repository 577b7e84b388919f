/* Private state of the strategy layer. */
#ifndef FULGUR_STRATEGY_IMPL_H
#define FULGUR_STRATEGY_IMPL_H

#include "ddp_reducer.h"
#include "fulgur/strategy.h"

typedef struct fg__dp_state fg__dp_state;
typedef struct fg__zero_state fg__zero_state;
typedef struct fg__bagua_state fg__bagua_state;
typedef struct fg__det_state fg__det_state;
typedef struct fg__zero3_state fg__zero3_state;
typedef struct fg__horovod_state fg__horovod_state;
typedef struct fg__hivemind_state fg__hivemind_state;

/* What a strategy does once its kind and options are resolved: fsdp with
 * NO_SHARD runs as ddp, with SHARD_GRAD_OP as ZeRO-2, and the ddp and
 * sharded kinds of one rank (no communicator) as single. */
typedef enum fg__strategy_mode {
    FG_MODE_SINGLE,
    FG_MODE_DP,
    FG_MODE_DDP,
    FG_MODE_ZERO1,
    FG_MODE_ZERO2,
    FG_MODE_BAGUA,
    FG_MODE_ZERO3, /* deepspeed_stage_3, fsdp FULL_SHARD and HYBRID_SHARD */
    FG_MODE_HOROVOD,
    FG_MODE_HIVEMIND
} fg__strategy_mode;

/* What a mode does (drivers.c), one driver per mode, as ggml's backend
 * interface: every entry but name may be NULL, and says what NULL means. */
typedef struct fg__strategy_driver {
    const char *name;
    /* Makes the mode's state (collective where it broadcasts the parameters);
     * NULL: nothing to make (single). On failure the strategy is freed:
     * everything it made is freed by fg_strategy_free. */
    FG_MUST_USE fg_status (*setup)(fg_strategy *s, const fg_ddp_opts *ddp,
                                   const fg_sharded_opts *sharded, int dp_threads);
    /* Backward with s->sync; NULL: fg_backward alone (nothing to average). */
    FG_MUST_USE fg_status (*backward)(fg_strategy *s, fg_tensor *loss);
    /* A training step over batch b (fg_strategy_step); NULL: fn once on the
     * whole batch, then the driver's backward. */
    FG_MUST_USE fg_status (*step)(fg_strategy *s, fg_batch *b, fg_strategy_step_fn fn, void *ud,
                                  double *part_losses, int max_parts, int *nparts, double *loss);
    /* Clipping (fg_strategy_clip_grad_norm); NULL: every rank holds the whole
     * averaged gradient, so the local norm is the global one. */
    FG_MUST_USE fg_status (*clip)(fg_strategy *s, double max_norm, double *total_norm);
    /* Adds the bytes handed to the communicator to *out (zeroed); NULL:
     * none (single, dp, horovod's are its own counters). */
    void (*bytes)(const fg_strategy *s, fg_comm_bytes *out);
    /* FSDP's summon_full_params and its end; NULL: the parameters are whole
     * on every rank, nothing to do. */
    FG_MUST_USE fg_status (*gather)(fg_strategy *s);
    FG_MUST_USE fg_status (*release)(fg_strategy *s);
    /* The optimizer step (fg_strategy_optimizer_step); NULL: fg_optimizer_step. */
    FG_MUST_USE fg_status (*optimizer_step)(fg_strategy *s, fg_optimizer *opt, bool *stepped);
} fg__strategy_driver;

/* The driver of a mode; the deterministic one for deterministic (single
 * and ddp with ddp_opts.deterministic). */
const fg__strategy_driver *fg__strategy_driver_of(fg__strategy_mode mode, bool deterministic);

struct fg_strategy {
    fg_strategy_kind kind;
    fg__strategy_mode mode;
    const fg__strategy_driver *drv; /* the mode's (drivers.c) */
    fg_comm *comm;
    fg_module *model;
    fg_optimizer *opt;
    bool sync;
    fg__ddp_reducer *reducer;           /* ddp, zero */
    fg__dp_state *dp;                   /* dp */
    fg__zero_state *zero;               /* zero */
    fg__bagua_state *bagua;             /* bagua (bagua_impl.h) */
    fg__zero3_state *zero3;             /* zero, stage 3 */
    fg__horovod_state *horovod;         /* horovod */
    fg__hivemind_state *hivemind;       /* hivemind (hivemind.c) */
    const struct fg__ddp_hook_vt *hook; /* ddp with a built-in comm hook */
    void *hook_state;
    fg__det_state *det; /* ddp_opts.deterministic (single, ddp) */
};

/* strategy.c: rank 0's parameters to every rank; the reducer over the
 * model's parameters (s->reducer) */
FG_MUST_USE fg_status fg__strategy_broadcast_params(fg_strategy *s);

/* staging.c: in-place allreduce and broadcast of n elements at p, memory
 * of dev (NULL: the host): straight to the communicator when its backend
 * reads that memory, else through a bounded host buffer a chunk at a time
 * (the copies on dev's comm stream). Collective. */
FG_MUST_USE fg_status fg__staged_allreduce(fg_comm *c, fg_dev *dev, void *p, int64_t n, fg_dtype dt,
                                           fg_reduce_op op);
FG_MUST_USE fg_status fg__staged_broadcast(fg_comm *c, fg_dev *dev, void *p, int64_t n, fg_dtype dt,
                                           int root);
/* zero.c: the device of a flat buffer when the host cannot touch it
 * (guarded, cuda), else NULL (host memory, the CPU device). */
fg_dev *fg__zero_dev(fg_tensor *flat);
/* param_offload.c: offload_params_device=cpu for stage 3 on a device */
FG_MUST_USE fg_status fg__poffload_setup_cpu(fg_strategy *s);
/* In-place reduce to root (p on other ranks is left as it was). */
FG_MUST_USE fg_status fg__staged_reduce(fg_comm *c, fg_dev *dev, void *p, int64_t n, fg_dtype dt,
                                        fg_reduce_op op, int root);
/* In-place all-gather: rank q's counts[q] elements at p + displs[q]. */
FG_MUST_USE fg_status fg__staged_allgatherv(fg_comm *c, fg_dev *dev, void *p, const int64_t *counts,
                                            const int64_t *displs, fg_dtype dt);
/* Point to point in messages of at most 4 MiB on both sides (a sender on a
 * device and a receiver on the host agree): use the pair together. */
FG_MUST_USE fg_status fg__staged_send(fg_comm *c, fg_dev *dev, const void *p, int64_t n,
                                      fg_dtype dt, int peer);
FG_MUST_USE fg_status fg__staged_recv(fg_comm *c, fg_dev *dev, void *p, int64_t n, fg_dtype dt,
                                      int peer);
/* bytes of p (memory of dev; NULL or the CPU: the host) copied out to a
 * host buffer, or in from one, on dev's comm stream (counted as staging):
 * the host side of an algorithm whose communication runs on host memory
 * (Bagua's, a ddp comm hook's) under a backend that reads host memory.
 * A plain memcpy (none if the two are one) on the host. */
FG_MUST_USE fg_status fg__stage_out(fg_dev *dev, void *host, const void *p, size_t bytes);
FG_MUST_USE fg_status fg__stage_in(fg_dev *dev, void *p, const void *host, size_t bytes);
FG_MUST_USE fg_status fg__strategy_reducer_new(fg_strategy *s, fg_comm *comm,
                                               const fg__ddp_reducer_opts *ro);

/* deterministic.c: per micro-batch gradients summed in a fixed tree */
FG_MUST_USE fg_status fg__det_setup(fg_strategy *s);
void fg__det_free(fg_strategy *s);
FG_MUST_USE fg_status fg__det_backward(fg_strategy *s, fg_tensor *loss, bool sync);

/* dp.c */
FG_MUST_USE fg_status fg__dp_setup(fg_strategy *s, int threads);
void fg__dp_free(fg_strategy *s);
FG_MUST_USE fg_status fg__dp_step(fg_strategy *s, fg_batch *b, fg_strategy_step_fn fn, void *ud,
                                  double *part_losses, int max_parts, int *nparts, double *loss);

/* ddp2.c: with kind ddp2 and a communicator of several processes (one per
 * node), rank 0's parameters at setup and the gradient averaged across the
 * processes after each dp step (when s->sync); a no-op otherwise */
FG_MUST_USE fg_status fg__ddp2_setup(fg_strategy *s);
FG_MUST_USE fg_status fg__ddp2_sync(fg_strategy *s);

/* horovod.c: setup (collective: rank 0's parameters and optimizer state),
 * backward (the fusion-buffer averaging on the last of
 * backward_passes_per_step passes), free; counters for the tests */
FG_MUST_USE fg_status fg__horovod_setup(fg_strategy *s, const fg_ddp_opts *o);
FG_MUST_USE fg_status fg__horovod_backward(fg_strategy *s, fg_tensor *loss);
void fg__horovod_free(fg_strategy *s);
int64_t fg__horovod_cycles(const fg_strategy *s);
int64_t fg__horovod_allreduces(const fg_strategy *s);
uint64_t fg__horovod_bytes_sent(const fg_strategy *s);

/* hivemind.c: a peer of a swarm; the optimizer step accumulates, and
 * averages and steps when the swarm reaches target_batch_size */
FG_MUST_USE fg_status fg__hivemind_setup(fg_strategy *s, const fg_ddp_opts *o);
void fg__hivemind_free(fg_strategy *s);
/* Waits for the round in flight (delay_optimizer_step) and collects it
 * (fg_strategy_settle). */
FG_MUST_USE fg_status fg__hivemind_settle(fg_strategy *s);
FG_MUST_USE fg_status fg__hivemind_optimizer_step(fg_strategy *s, fg_optimizer *opt, bool *stepped);
int64_t fg__hivemind_epoch(const fg_strategy *s);       /* this peer's global epoch */
const char *fg__hivemind_address(const fg_strategy *s); /* its DHT address */
fg_hivemind *fg__hivemind_peer(const fg_strategy *s);
/* rounds averaged here, states loaded from peers, the largest group */
void fg__hivemind_counts(const fg_strategy *s, int64_t *rounds, int64_t *loads, int *max_group);

/* zero.c: ZeRO stages 1, 2 and 3 (s->mode FG_MODE_ZERO1, _ZERO2 or _ZERO3 is set) */
FG_MUST_USE fg_status fg__zero_setup(fg_strategy *s, const fg_sharded_opts *o);
void fg__zero_free(fg_strategy *s);
FG_MUST_USE fg_status fg__zero_clip(fg_strategy *s, double max_norm, double *total_norm);
void fg__zero_range(const fg_strategy *s, int rank, int64_t *begin, int64_t *end);
/* The shards of numel elements of es bytes over world ranks (bounds:
 * world + 1 entries): whole 64-byte lines each, as even as that allows. */
void fg__zero_cut(int64_t numel, int world, size_t es, int64_t *bounds);
/* The shard bounds (shard group size + 1 entries). */
const int64_t *fg__zero_bounds(const fg_strategy *s);
/* Stage 2: a backward begins (the released gradient suffix restarts). */
void fg__zero_before_backward(fg_strategy *s);

/* zero3.c: the parameters sharded too. _groups makes s->zero3 and the
 * shard group (*group: s->comm, or HYBRID_SHARD's group) before the shards
 * are cut; _reducer_opts adds what stage 3 needs to the reducer's options;
 * _setup (after the reducer) makes the units and hooks them on the model. */
FG_MUST_USE fg_status fg__zero3_groups(fg_strategy *s, const fg_sharded_opts *o, fg_comm **group);
fg__ddp_reducer_opts fg__zero3_reducer_opts(fg_strategy *s, fg__ddp_reducer_opts ro,
                                            const fg_sharded_opts *o);
FG_MUST_USE fg_status fg__zero3_setup(fg_strategy *s, const fg_sharded_opts *o);
/* The last step of setup, which cannot fail: releases what this rank does
 * not own (a failure before leaves the model whole). */
void fg__zero3_start(fg_strategy *s);
FG_MUST_USE fg_status fg__zero3_backward(fg_strategy *s, fg_tensor *loss);
void fg__zero3_free(fg_strategy *s);
FG_MUST_USE fg_status fg__zero3_gather_all(fg_strategy *s);
FG_MUST_USE fg_status fg__zero3_release_all(fg_strategy *s);
int64_t fg__zero3_peak_gathered(const fg_strategy *s);
int fg__zero3_num_units(const fg_strategy *s);
/* Parameter elements outside the shard gathered now (the units'). */
int64_t fg__zero3_gathered(const fg_strategy *s);

/* param_offload.c: stage 3's parameter shard in a file (the optimizer's
 * nvme store): _setup after the strategy's setup; zero3.c fetches unit k's
 * part of the shard (_fetch: its ranges' parts in [lo, hi), read
 * asynchronously; _land: waited and copied into the flat buffer; _drop:
 * waited and thrown away); _home puts the shard back in the flat buffer for
 * good (the strategy or the optimizer goes); _data is the file's mapping
 * of the shard (checkpoints read and write it there). */
typedef struct fg__poffload fg__poffload;
FG_MUST_USE fg_status fg__poffload_setup(fg_strategy *s, const char *dir, size_t block);
FG_MUST_USE fg_status fg__poffload_new(fg_optimizer *opt, int64_t lo, int64_t hi, size_t es,
                                       int nunits, const int *nranges, fg__poffload **out);
FG_MUST_USE fg_status fg__poffload_fetch(fg__poffload *p, int k, int64_t (*r)[2], int nr);
FG_MUST_USE fg_status fg__poffload_land(fg__poffload *p, int k, char *pbase);
void fg__poffload_drop(fg__poffload *p, int k);
void fg__poffload_home(fg__poffload *p);
void fg__poffload_free(fg__poffload *p);
void *fg__poffload_data(fg__poffload *p);
/* zero3.c's side: makes the units' fetcher and releases the shard's pages
 * (the optimizer's store holds the parameters already); the fetcher or
 * NULL; puts the shard back in memory and stops offloading (zero.c calls
 * it when the optimizer is freed first). */
FG_MUST_USE fg_status fg__zero3_offload_params(fg_strategy *s);
fg__poffload *fg__zero3_param_offload(const fg_strategy *s);
void fg__zero3_params_home(fg_strategy *s);

/* bagua.c: Bagua's options (fg_strategy_check_ddp); setup, backward,
 * bytes and free of strategy bagua */
FG_MUST_USE fg_status fg__bagua_check(const fg_bagua_opts *o);
/* What setup would find on a job of `world` ranks on `nodes` nodes with
 * parameters of dt (fg_strategy_check_job). */
FG_MUST_USE fg_status fg__bagua_check_job(const fg_bagua_opts *o, fg_dtype dt, int world,
                                          int nodes);
FG_MUST_USE fg_status fg__bagua_setup(fg_strategy *s, const fg_ddp_opts *o);
void fg__bagua_free(fg_strategy *s);
FG_MUST_USE fg_status fg__bagua_backward(fg_strategy *s, fg_tensor *loss);
void fg__bagua_bytes(const fg_strategy *s, fg_comm_bytes *out);

/* strategy_offload.c: the offload fields' checks (from fg_strategy_check_sharded),
 * and nvme offload of the optimizer state after the mode's setup */
FG_MUST_USE fg_status fg__offload_check(fg_strategy_kind kind, const fg_sharded_opts *o);
FG_MUST_USE fg_status fg__offload_setup(fg_strategy *s, const fg_sharded_opts *o);

#endif
