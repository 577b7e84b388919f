/* fabric calls inside a run: setup, backward, training steps, clipping,
 * collectives on tensors and bytes, printing on rank 0, seeds, ranks. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fabric_impl.h"

/* Whether the strategy asked for shards the parameters, so that their cpu
 * offload on a device moves something: deepspeed_stage_3, and fsdp but
 * under NO_SHARD (its SHARD_GRAD_OP runs on stage 3's units when its
 * parameters are offloaded: strategy.c). */
static bool shards_offloaded_params(const fg_fabric *f) {
    fg_strategy_kind k = f->plan.strategy;
    return k == FG_STRATEGY_DEEPSPEED_STAGE_3 ||
           (k == FG_STRATEGY_FSDP && f->cfg.sharded.sharding_strategy != FG_SHARDING_NO_SHARD);
}

/* Accelerator guarded: this rank's guarded device (opened here, after the
 * ranks forked), the model and optimizer on it, and this thread's step
 * tensors. What is device-clean so far runs there; the rest is refused by
 * name rather than run on the host (docs/devices.md). */
fg_status fg__fabric_to_device(fg_fabric *f, fg_strategy_kind kind, fg_module *model,
                               fg_optimizer *opt) {
    bool ddp =
        kind == FG_STRATEGY_DDP || kind == FG_STRATEGY_DDP_SPAWN || kind == FG_STRATEGY_DDP_FORK;
    bool zero = kind == FG_STRATEGY_DEEPSPEED_STAGE_1 || kind == FG_STRATEGY_DEEPSPEED_STAGE_2 ||
                kind == FG_STRATEGY_DEEPSPEED_STAGE_3 || kind == FG_STRATEGY_FSDP;
    bool other = kind == FG_STRATEGY_HOROVOD || kind == FG_STRATEGY_BAGUA ||
                 kind == FG_STRATEGY_DP || kind == FG_STRATEGY_DDP2 || kind == FG_STRATEGY_HIVEMIND;
    if (kind != FG_STRATEGY_SINGLE && !ddp && !zero && !other)
        return fg_error(FG_EUNSUPPORTED,
                        "accelerator guarded: strategy %s is not device-clean yet (its buffers "
                        "are host memory); single, dp, ddp, ddp2, deepspeed stages 1-3, fsdp, "
                        "horovod, bagua and hivemind run on the device (docs/devices.md)",
                        fg_strategy_kind_name(kind));
    const fg_sharded_opts *so = &f->cfg.sharded;
    if (so->offload_params_device == FG_OFFLOAD_CPU && !shards_offloaded_params(f)) {
        /* named as asked (one rank of a kind runs as single) */
        bool fsdp = f->plan.strategy == FG_STRATEGY_FSDP;
        return fg_error(FG_EUNSUPPORTED,
                        "accelerator guarded: %s%s%s with the parameters offloaded to the cpu: "
                        "on a device only sharded parameters move, and this does not shard "
                        "them; use fsdp with FULL_SHARD or SHARD_GRAD_OP, or "
                        "deepspeed_stage_3_offload, or offload the optimizer state only "
                        "(offload_optimizer_device cpu)",
                        fg_strategy_kind_name(f->plan.strategy), fsdp ? " " : "",
                        fsdp ? fg_sharding_strategy_name(so->sharding_strategy) : "");
    }
    if (!f->dev) {
        char name[FG_DEVICE_NAME_MAX];
        snprintf(name, sizeof name, "guarded:%d", f->local_rank > 0 ? f->local_rank : 0);
        f->dev = fg_dev_open(name, NULL);
        if (!f->dev) return fg_error_wrap(fg_last_status(), "accelerator guarded");
    }
    FG_TRY(fg_module_to_device(model, f->dev));
    if (opt) FG_TRY(fg_optimizer_to_device(opt));
    return fg_step_device_set(f->dev);
}

fg_status fg_fabric_setup(fg_fabric *f, fg_module *model, fg_optimizer *opt) {
    if (!model) return fg_error(FG_EINVAL, "fabric setup: NULL model");
    if (f->strategy && model == f->model) {
        /* the same model again (a Trainer's fit after its validate): keep the
         * strategy and its buckets, take the new optimizer; a sharded one cut
         * the optimizer it was given into shards, and only that one */
        if (opt && opt != f->opt && fg_strategy_is_sharded(f->strategy))
            return fg_error(FG_ESTATE,
                            "fabric setup: strategy %s shards the optimizer given at the first "
                            "setup; another optimizer needs another launch",
                            fg_fabric_strategy_name(f));
        if (opt && f->dev) FG_TRY(fg_optimizer_to_device(opt));
        if (opt) f->opt = opt;
        return FG_OK;
    }
    if (f->strategy)
        return fg_error(FG_ESTATE, "fabric setup: already set up with another model (one model "
                                   "per fabric and launch)");
    /* ddp (or a sharded kind) of one rank has no communicator: it is a
     * single-device run, with nothing to shard */
    fg_strategy_kind kind = f->plan.strategy;
    if (fg_strategy_kind_is_ddp(kind) && !f->comm) kind = FG_STRATEGY_SINGLE;
    if (f->cfg.activation_checkpointing)
        FG_TRY(fg_module_set_activation_checkpointing(model, NULL, true, NULL));
    if (f->plan.accelerator == FG_ACCELERATOR_GUARDED)
        FG_TRY(fg__fabric_to_device(f, kind, model, opt));
    fg_ddp_opts ddp = f->cfg.ddp;
    ddp.deterministic = ddp.deterministic || f->cfg.deterministic;
    f->strategy =
        fg_strategy_new(kind, f->comm, model, opt, &ddp, &f->cfg.sharded, f->plan.devices.count);
    if (!f->strategy) return fg_last_status();
    /* dropout masks must differ between ranks: each rank its own stream */
    if (f->seeded) fg_module_seed_dropout(model, fg_fabric_rank_seed(f));
    f->model = model;
    f->opt = opt;
    /* Lightning's setup wraps the model's forward in autocast: here the
     * thread's autocast is the setting's from now on (off for *-true) */
    (void)fg_fabric_autocast_begin(f);
    return FG_OK;
}

bool fg__fabric_one_rank_stage3(const fg_fabric *f) {
    /* cpu: on a device only (on the CPU the parameters are in host memory) */
    fg_offload_device pd = f->cfg.sharded.offload_params_device;
    if (pd == FG_OFFLOAD_NVME) return f->plan.strategy == FG_STRATEGY_DEEPSPEED_STAGE_3;
    return pd == FG_OFFLOAD_CPU && f->plan.accelerator == FG_ACCELERATOR_GUARDED &&
           shards_offloaded_params(f);
}

bool fg_fabric_shards_params(const fg_fabric *f) {
    if (!f) return false;
    if (f->strategy) return fg_strategy_shards_params(f->strategy);
    /* one rank: nothing to shard, but for parameters on nvme */
    if (f->world_size < 2) return fg__fabric_one_rank_stage3(f);
    fg_sharding_strategy ss = f->cfg.sharded.sharding_strategy;
    return f->plan.strategy == FG_STRATEGY_DEEPSPEED_STAGE_3 ||
           (f->plan.strategy == FG_STRATEGY_FSDP &&
            (ss == FG_SHARDING_FULL_SHARD || ss == FG_SHARDING_HYBRID_SHARD));
}

fg_dataloader *fg_fabric_setup_dataloader(fg_fabric *f, fg_dataloader *dl, bool use_distributed) {
    if (!dl) {
        fg_error(FG_EINVAL, "fabric setup_dataloader: NULL loader");
        return NULL;
    }
    const fg_loader_opts *o = fg_dataloader_opts(dl);
    if (fg_dataloader_is_stream(dl)) {
        /* a stream is split, not sampled: rank r's shards (data.h) */
        if (use_distributed && f->world_size > 1 &&
            fg_dataloader_split_stream(dl, f->global_rank, f->world_size) != FG_OK)
            return NULL;
    } else if (use_distributed && f->world_size > 1) {
        fg_distributed_opts d = {.shuffle = o->shuffle, .seed = o->seed, .drop_last = o->drop_last};
        fg_sampler *s = fg_sampler_distributed(fg_dataset_len(fg_dataloader_dataset(dl)),
                                               f->global_rank, f->world_size, &d);
        if (fg_dataloader_set_sampler(dl, s) != FG_OK) return NULL;
    }
    int64_t per = o->batch ? o->batch : 1;
    /* replicas on threads (dp, ddp2): a process's batch is split over them */
    bool dp = fg_strategy_info_of(f->plan.strategy)->replica_threads;
    int64_t eff = dp ? per * f->plan.num_nodes : per * f->world_size;
    fg_log(FG_LOG_INFO, "effective batch size %lld (%lld per %s x %d)", (long long)eff,
           (long long)per, dp ? "node" : "rank", dp ? f->plan.num_nodes : f->world_size);
    return dl;
}

fg_status fg_fabric_backward(fg_fabric *f, fg_tensor *loss) {
    FG_TRY(fg__fabric_scaler_check(f));
    loss = fg__fabric_scale_loss(f, loss);
    if (!f->strategy) return fg_backward(loss);
    fg_strategy_set_sync(f->strategy, !f->no_sync);
    return fg_strategy_backward(f->strategy, loss);
}

void fg_fabric_set_no_backward_sync(fg_fabric *f, bool on) { f->no_sync = on; }

struct step_ctx {
    fg_fabric *f;
    fg_step_fn fn;
    void *ud;
};

/* On each replica's thread under dp: the setting's autocast, and the loss
 * scaled for the backward the strategy runs */
static fg_tensor *call_step(fg_module *replica, fg_batch *part, void *ud) {
    (void)replica;
    struct step_ctx *c = ud;
    fg_dtype prev = fg_fabric_autocast_begin(c->f);
    fg_tensor *loss = c->fn(c->f, part, c->ud);
    fg_fabric_autocast_end(c->f, prev);
    return fg__fabric_scale_loss(c->f, loss);
}

static FG_MUST_USE fg_status not_on_step_device(const fg_fabric *f) {
    return fg_error(FG_ESTATE,
                    "batch to device %s: this thread's step tensors are not on it (make "
                    "batches on the thread that called fg_fabric_setup)",
                    fg_dev_name(f->dev));
}

/* One batch tensor as a step tensor on the device (a synchronous copy in):
 * what the staging below does not take (a strided view, another device's
 * tensor). */
static fg_tensor *to_device(fg_fabric *f, fg_tensor *t) {
    if (!t || fg_tensor_dev(t) == f->dev) return t;
    fg_tensor *d = fg_empty(fg_tensor_dtype(t), fg_tensor_ndim(t), fg_tensor_shape(t));
    if (!d || fg_tensor_dev(d) != f->dev) {
        fg__status_drop(not_on_step_device(f)); /* its error stays: NULL says so */
        return NULL;
    }
    return fg_tensor_copy(d, t) == FG_OK ? d : NULL;
}

#define STAGE_ALIGN ((size_t)512)

static size_t stage_align(size_t n) { return (n + STAGE_ALIGN - 1) / STAGE_ALIGN * STAGE_ALIGN; }

/* a host tensor the staging copies as bytes */
static bool stageable(const fg_tensor *t) {
    return !t || (!fg_tensor_dev(t) && fg_tensor_is_contiguous(t));
}

static void slot_release(fg_dev *d, fg__batch_slot *sl) {
    fg_tensor_free(sl->x);
    fg_tensor_free(sl->y);
    /* the device is synchronized first (fg__fabric_stage_free): the block
     * is ours, so its free cannot fail */
    if (sl->devbuf) fg__status_drop(fg_dev_free(d, sl->devbuf));
    fg_dev_host_free(d, sl->host);
    fg_event_free(sl->copied);
    fg_event_free(sl->used);
    *sl = (fg__batch_slot){0};
}

void fg__fabric_stage_free(fg_fabric *f) {
    if (!f || !f->dev) return;
    bool any = false;
    for (int k = 0; k < 2; k++) any = any || f->stage.slot[k].copied;
    if (!any) return;
    /* nothing may still read or write the buffers; a _free has no caller
     * to tell, and a device that cannot synchronize has failed already */
    fg__status_drop(fg_dev_synchronize(f->dev));
    for (int k = 0; k < 2; k++) slot_release(f->dev, &f->stage.slot[k]);
    f->stage.turn = 0;
}

/* Room for `need` bytes in slot sl: a bigger pair of buffers once the
 * device is done with the old ones. */
static FG_MUST_USE fg_status slot_reserve(fg_dev *d, fg__batch_slot *sl, size_t need) {
    if (!sl->copied) {
        sl->copied = fg_event_new(d);
        sl->used = sl->copied ? fg_event_new(d) : NULL;
        if (!sl->used) return fg_last_status();
    }
    if (need <= sl->cap) return FG_OK;
    FG_TRY(fg_event_synchronize(sl->copied));
    FG_TRY(fg_event_synchronize(sl->used));
    if (sl->devbuf) FG_TRY(fg_dev_free(d, sl->devbuf));
    fg_dev_host_free(d, sl->host);
    sl->devbuf = sl->host = NULL;
    sl->cap = 0;
    sl->host = fg_dev_host_alloc(d, need);
    if (!sl->host) return fg_error(FG_ENOMEM, "%zu bytes of pinned host staging", need);
    sl->devbuf = fg_dev_alloc(d, need, fg_dev_stream(d, FG_STREAM_COMM));
    if (!sl->devbuf) return fg_last_status();
    sl->cap = need;
    return FG_OK;
}

/* Batch b's x and y copied in through the next staging slot, on the comm
 * stream, the compute stream made to wait for them (fabric_impl.h). */
static FG_MUST_USE fg_status stage_batch(fg_fabric *f, const fg_batch *b, fg_batch *out) {
    fg_dev *d = f->dev;
    fg_stream *comm = fg_dev_stream(d, FG_STREAM_COMM),
              *compute = fg_dev_stream(d, FG_STREAM_COMPUTE);
    fg__batch_stage *st = &f->stage;
    int k = st->turn;
    fg__batch_slot *sl = &st->slot[k], *prev = &st->slot[k ^ 1];
    size_t xb = b->x ? fg_tensor_nbytes(b->x) : 0, yb = b->y ? fg_tensor_nbytes(b->y) : 0;
    size_t yoff = stage_align(xb), need = FG_MAX(yoff + yb, 1);
    /* the compute work so far includes the step that reads the previous
     * batch: the slot is free once the compute stream is past it */
    if (prev->live) FG_TRY(fg_event_record(prev->used, compute));
    FG_TRY(slot_reserve(d, sl, need));
    /* the host rewrites the pinned bytes once their last copy is done, and
     * the copy overwrites the device bytes once their step has read them */
    FG_TRY(fg_event_synchronize(sl->copied));
    FG_TRY(fg_stream_wait_event(comm, sl->used));
    fg_tensor_free(sl->x);
    fg_tensor_free(sl->y);
    sl->x = sl->y = NULL;
    sl->live = false;
    if (xb) memcpy(sl->host, fg_tensor_data(b->x), xb);
    if (yb) memcpy((char *)sl->host + yoff, fg_tensor_data(b->y), yb);
    if (xb) FG_TRY(fg_dev_copy_h2d_async(d, sl->devbuf, sl->host, xb, comm));
    if (yb)
        FG_TRY(
            fg_dev_copy_h2d_async(d, (char *)sl->devbuf + yoff, (char *)sl->host + yoff, yb, comm));
    FG_TRY(fg_event_record(sl->copied, comm));
    FG_TRY(fg_stream_wait_event(compute, sl->copied));
    st->comm_h2d += xb + yb;
    if (b->x && !(sl->x = fg_tensor_wrap_on(d, sl->devbuf, fg_tensor_dtype(b->x),
                                            fg_tensor_ndim(b->x), fg_tensor_shape(b->x))))
        return fg_last_status();
    if (b->y && !(sl->y = fg_tensor_wrap_on(d, (char *)sl->devbuf + yoff, fg_tensor_dtype(b->y),
                                            fg_tensor_ndim(b->y), fg_tensor_shape(b->y))))
        return fg_last_status();
    sl->live = true;
    st->turn = k ^ 1;
    st->batches++;
    out->x = sl->x;
    out->y = sl->y;
    return FG_OK;
}

fg_fabric_copies fg_fabric_device_copies(const fg_fabric *f) {
    return f ? f->copies : (fg_fabric_copies){0};
}

fg_status fg_fabric_batch_to_device(fg_fabric *f, const fg_batch *b, fg_batch *out) {
    if (!f || !b || !out) return fg_error(FG_EINVAL, "batch_to_device: NULL argument");
    *out = *b;
    if (!f->dev) return FG_OK;
    bool in_x = b->x && fg_tensor_dev(b->x) == f->dev, in_y = b->y && fg_tensor_dev(b->y) == f->dev;
    if (stageable(b->x) && stageable(b->y) && (b->x || b->y) && !in_x && !in_y) {
        if (fg_step_device() != f->dev) return not_on_step_device(f);
        fg_status s = stage_batch(f, b, out);
        if (s != FG_OK)
            return fg_error_wrap(s, "batch %lld to device %s", (long long)b->index,
                                 fg_dev_name(f->dev));
        return FG_OK;
    }
    out->x = to_device(f, b->x);
    if (b->x && !out->x)
        return fg_error_wrap(fg_last_status(), "batch %lld x", (long long)b->index);
    out->y = to_device(f, b->y);
    if (b->y && !out->y)
        return fg_error_wrap(fg_last_status(), "batch %lld y", (long long)b->index);
    return FG_OK;
}

fg_status fg_fabric_training_step(fg_fabric *f, fg_batch *b, fg_step_fn step,
                                  fg_step_end_fn step_end, void *ud, double *loss) {
    if (!f->strategy) return fg_error(FG_ESTATE, "training_step: call fg_fabric_setup first");
    double parts[64];
    int n = 0;
    struct step_ctx c = {f, step, ud};
    FG_TRY(fg__fabric_scaler_check(f));
    fg_strategy_set_sync(f->strategy, !f->no_sync);
    fg_dev_memory_stats before = {0};
    if (f->dev) before = fg_dev_memory_stats_get(f->dev);
    uint64_t staged = f->stage.comm_h2d;
    fg_batch on; /* Lightning's batch_to_device: the host batch copied in */
    FG_TRY(fg_fabric_batch_to_device(f, b, &on));
    FG_TRY(fg_strategy_step(f->strategy, &on, call_step, &c, parts, 64, &n, loss));
    if (f->dev) {
        fg_dev_memory_stats after = fg_dev_memory_stats_get(f->dev);
        /* the batch's own copies in run on the comm stream too: counted
         * as the step's, not as the communicator's staging */
        uint64_t ch = after.comm_h2d_bytes - before.comm_h2d_bytes - (f->stage.comm_h2d - staged);
        uint64_t cd = after.comm_d2h_bytes - before.comm_d2h_bytes;
        f->copies.last_h2d = after.h2d_bytes - before.h2d_bytes - ch;
        f->copies.last_d2h = after.d2h_bytes - before.d2h_bytes - cd;
        f->copies.total_h2d += f->copies.last_h2d;
        f->copies.total_d2h += f->copies.last_d2h;
        f->copies.total_comm_h2d += ch;
        f->copies.total_comm_d2h += cd;
        f->copies.steps++;
    }
    double scale = fg_scaler_scale(f->scaler); /* 1 without one; a power of 2: exact */
    for (int i = 0; i < n && i < 64; i++) parts[i] /= scale;
    if (loss) *loss /= scale;
    if (step_end) step_end(f, parts, n, ud);
    return FG_OK;
}

fg_status fg_fabric_clip_gradients(fg_fabric *f, double max_norm, double *total_norm) {
    if (!f->strategy) return fg_error(FG_ESTATE, "clip_gradients: call fg_fabric_setup first");
    FG_TRY(fg__fabric_scaler_unscale(f)); /* as PyTorch: unscale before clipping */
    return fg_strategy_clip_grad_norm(f->strategy, max_norm, total_norm);
}

static FG_MUST_USE fg_status need_contiguous(const char *fn, const fg_tensor *t) {
    if (!t) return fg_error(FG_EINVAL, "%s: NULL tensor", fn);
    if (!fg_tensor_is_contiguous(t))
        return fg_error(FG_EINVAL, "%s: the tensor must be contiguous", fn);
    return FG_OK;
}

fg_status fg_fabric_all_reduce(fg_fabric *f, fg_tensor *t, fg_reduce_op op) {
    FG_TRY(need_contiguous("all_reduce", t));
    if (!f->comm) return FG_OK;
    return fg_comm_allreduce(f->comm, fg_tensor_data(t), fg_tensor_data(t), fg_tensor_numel(t),
                             fg_tensor_dtype(t), op);
}

fg_status fg_fabric_all_gather(fg_fabric *f, const fg_tensor *t, fg_tensor *out) {
    FG_TRY(need_contiguous("all_gather", t));
    FG_TRY(need_contiguous("all_gather", out));
    if (fg_tensor_numel(out) != fg_tensor_numel(t) * f->world_size ||
        fg_tensor_dtype(out) != fg_tensor_dtype(t))
        return fg_error(FG_EINVAL, "all_gather: out needs %d x %lld elements of %s", f->world_size,
                        (long long)fg_tensor_numel(t), fg_dtype_name(fg_tensor_dtype(t)));
    if (!f->comm) return fg_tensor_copy(out, t);
    return fg_comm_allgather(f->comm, fg_tensor_data(t), fg_tensor_data(out), fg_tensor_numel(t),
                             fg_tensor_dtype(t));
}

fg_status fg_fabric_broadcast(fg_fabric *f, fg_tensor *t, int root) {
    FG_TRY(need_contiguous("broadcast", t));
    if (!f->comm)
        return root == 0 ? FG_OK : fg_error(FG_EINVAL, "broadcast: root %d of 1 rank", root);
    return fg_comm_broadcast(f->comm, fg_tensor_data(t), fg_tensor_data(t), fg_tensor_numel(t),
                             fg_tensor_dtype(t), root);
}

fg_status fg_fabric_broadcast_bytes(fg_fabric *f, void *buf, size_t n, int root) {
    if (!f->comm)
        return root == 0 ? FG_OK : fg_error(FG_EINVAL, "broadcast: root %d of 1 rank", root);
    return fg_comm_broadcast(f->comm, buf, buf, (int64_t)n, FG_U8, root);
}

fg_status fg_fabric_barrier(fg_fabric *f) { return f->comm ? fg_comm_barrier(f->comm) : FG_OK; }

fg_status fg_fabric_reduce_scalar(fg_fabric *f, double v, fg_reduce_op op, double *out) {
    if (!out) return fg_error(FG_EINVAL, "fg_fabric_reduce_scalar: out is NULL");
    if (f->comm) FG_TRY(fg_comm_allreduce(f->comm, &v, &v, 1, FG_F64, op));
    *out = v;
    return FG_OK;
}

void fg_fabric_print(fg_fabric *f, const char *fmt, ...) {
    if (f->global_rank != 0) return;
    va_list ap;
    va_start(ap, fmt);
    FILE *out = f->cfg.print_to;
    if (out) {
        vfprintf(out, fmt, ap);
        fflush(out);
    } else {
        char line[2048];
        vsnprintf(line, sizeof line, fmt, ap);
        size_t n = strlen(line);
        if (n && line[n - 1] == '\n') line[n - 1] = '\0'; /* a log line has no newline */
        fg_log(FG_LOG_INFO, "%s", line);
    }
    va_end(ap);
}

void fg_fabric_seed_everything(fg_fabric *f, uint64_t seed) {
    f->seed = seed;
    f->seeded = true;
    fg_set_default_seed(seed);
}
uint64_t fg_fabric_seed(const fg_fabric *f) { return f->seed; }
uint64_t fg_fabric_rank_seed(const fg_fabric *f) {
    return fg_rng_derive(f->seed, (uint64_t)f->global_rank + 1);
}

fg_status fg_fabric_rank_zero_first_begin(fg_fabric *f) {
    return f->global_rank == 0 ? FG_OK : fg_fabric_barrier(f);
}
fg_status fg_fabric_rank_zero_first_end(fg_fabric *f) {
    return f->global_rank == 0 ? fg_fabric_barrier(f) : FG_OK;
}

void fg_fabric_step_end(fg_fabric *f) {
    if (f) fg__spawn_snapshot(f);
    fg_step_reset();
}

int fg_fabric_world_size(const fg_fabric *f) { return f->world_size; }
int fg_fabric_global_rank(const fg_fabric *f) { return f->global_rank; }
int fg_fabric_local_rank(const fg_fabric *f) { return f->local_rank; }
int fg_fabric_node_rank(const fg_fabric *f) { return f->node_rank; }
bool fg_fabric_is_global_zero(const fg_fabric *f) { return f->global_rank == 0; }
const char *fg_fabric_strategy_name(const fg_fabric *f) {
    return fg_strategy_kind_name(f->plan.strategy);
}
fg_comm *fg_fabric_comm(const fg_fabric *f) { return f->comm; }
bool fg_fabric_running(const fg_fabric *f) { return f && f->running; }
fg_module *fg_fabric_model(const fg_fabric *f) { return f ? f->model : NULL; }
const fg_strategy *fg_fabric_strategy(const fg_fabric *f) { return f ? f->strategy : NULL; }
