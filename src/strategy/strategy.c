/* The strategies behind one object: single (plain backward), ddp (bucketed,
 * overlapped gradient averaging: ddp_reducer.c), dp (thread replicas:
 * dp.c), ZeRO stages 1, 2 and 3 (sharded optimizer state and gradients:
 * zero.c; the parameters too: zero3.c) and Bagua's algorithms (bagua*.c).
 * The model's parameters and gradients live in its flat
 * buffers, so every strategy works on plain slices of them. A kind resolves to a mode once at
 * fg_strategy_new (fsdp by its sharding strategy, from the strategy table's rows), and the mode
 * to its driver (drivers.c); everything after dispatches through the driver. */
#include <math.h>
#include <string.h>
#include <strings.h>

#include "ddp_hooks.h"
#include "nn/nn_impl.h"
#include "optim/optim_impl.h"
#include "strategy_impl.h"

fg_strategy_kind fg_strategy_kind_of(const fg_strategy *s) { return s->kind; }

fg_status fg_strategy_check_sharded(fg_strategy_kind kind, const fg_sharded_opts *o) {
    fg_sharded_opts d = o ? *o : (fg_sharded_opts){0};
    FG_TRY(fg__offload_check(kind, &d));
    bool deepspeed = fg_strategy_takes(kind, d.sharding_strategy) & FG_TAKES_DEEPSPEED ||
                     kind == FG_STRATEGY_SINGLE;
    if ((d.partition_activations || d.cpu_checkpointing) && !deepspeed)
        return fg_error(FG_EINVAL,
                        "strategy \"%s\": %s is an option of DeepSpeed's strategies "
                        "(deepspeed_stage_1, deepspeed_stage_2, deepspeed_stage_3)",
                        fg_strategy_kind_name(kind),
                        d.partition_activations ? "partition_activations" : "cpu_checkpointing");
    if (!fg_strategy_kind_is_sharded(kind)) return FG_OK;
    if (d.min_num_params < 0 || d.hybrid_shard_size < 0)
        return fg_error(FG_EINVAL,
                        "%s: min_num_params = %lld, hybrid_shard_size = %d: expected >= 0 (0: "
                        "the default)",
                        fg_strategy_kind_name(kind), (long long)d.min_num_params,
                        d.hybrid_shard_size);
    if (d.reduce_bucket_size < 0 || d.allgather_bucket_size < 0)
        return fg_error(FG_EINVAL,
                        "%s: reduce_bucket_size = %lld, allgather_bucket_size = %lld: expected "
                        "element counts > 0, or 0 for the default (200000000)",
                        fg_strategy_kind_name(kind), (long long)d.reduce_bucket_size,
                        (long long)d.allgather_bucket_size);
    if (!(fg_strategy_takes(kind, 0) & FG_TAKES_SHARDING_STRATEGY)) return FG_OK;
    switch (d.sharding_strategy) {
    case FG_SHARDING_SHARD_GRAD_OP:
    case FG_SHARDING_NO_SHARD:
    case FG_SHARDING_FULL_SHARD:
    case FG_SHARDING_HYBRID_SHARD: return FG_OK;
    default:
        return fg_error(FG_EINVAL,
                        "fsdp: sharding_strategy %d: expected one of fg_sharding_strategy "
                        "(FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD)",
                        (int)d.sharding_strategy);
    }
}

fg_status fg_strategy_check_job(fg_strategy_kind kind, const fg_ddp_opts *ddp,
                                const fg_sharded_opts *sharded, fg_dtype param_dtype,
                                fg_dtype grad_dtype, int world, int nodes, int local_world) {
    const fg_strategy_info *row = fg_strategy_info_of(kind);
    if (!row)
        return fg_error(FG_EINVAL, "strategy: kind %d: expected one of fg_strategy_kind",
                        (int)kind);
    if (world < 2) return FG_OK; /* one rank runs as single, whatever the kind */
    fg_ddp_opts d = ddp ? *ddp : (fg_ddp_opts){0};
    fg_sharded_opts sh = sharded ? *sharded : (fg_sharded_opts){0};
    const char *name = row->name;
    bool hooked =
        d.comm_hook != FG_DDP_HOOK_NONE || d.comm_wrapper != FG_DDP_WRAPPER_NONE || d.user_hook;
    if (hooked && !(fg_strategy_takes(kind, sh.sharding_strategy) & FG_TAKES_COMM_HOOK))
        return fg_error(FG_EINVAL,
                        "strategy \"%s\": ddp's communication hooks do not apply (they hook ddp's "
                        "gradient buckets: %s, fsdp with NO_SHARD)%s",
                        name, fg_strategy_kinds_taking(FG_TAKES_COMM_HOOK),
                        row->takes & FG_TAKES_HOROVOD ? "; use fg_horovod_opts.compression "
                                                        "(none or fp16)"
                        : row->takes & FG_TAKES_BAGUA ? "; under bagua the algorithm is the "
                                                        "communication"
                                                      : "");
    if (hooked && grad_dtype != FG_F32)
        return fg_error(FG_EUNSUPPORTED,
                        "ddp: communication hooks work on f32 gradients; this precision's are %s: "
                        "use 32-true or a mixed precision, or no hook",
                        fg_dtype_name(grad_dtype));
    if (row->takes & FG_TAKES_HOROVOD && grad_dtype != FG_F32)
        return fg_error(FG_EUNSUPPORTED,
                        "horovod: needs f32 gradients in one flat buffer; this precision's are "
                        "%s: use 32-true or a mixed precision",
                        fg_dtype_name(grad_dtype));
    if (row->takes & FG_TAKES_BAGUA)
        FG_TRY(fg__bagua_check_job(&d.bagua, param_dtype, world, nodes > 0 ? nodes : 1));
    if (row->takes & FG_TAKES_SHARDING_STRATEGY &&
        sh.sharding_strategy == FG_SHARDING_HYBRID_SHARD) {
        int size = sh.hybrid_shard_size > 0 ? sh.hybrid_shard_size : local_world;
        if (size < 1 || world % size)
            return fg_error(FG_EINVAL,
                            "fsdp HYBRID_SHARD: a shard group of %d ranks does not divide the %d "
                            "ranks: set hybrid_shard_size (--hybrid-shard-size) to a divisor of "
                            "the world size",
                            size, world);
    }
    return FG_OK;
}

void fg_strategy_set_sync(fg_strategy *s, bool sync) { s->sync = sync; }

bool fg_strategy_is_sharded(const fg_strategy *s) {
    return s && (s->mode == FG_MODE_ZERO1 || s->mode == FG_MODE_ZERO2 || s->mode == FG_MODE_ZERO3);
}

bool fg_strategy_shards_params(const fg_strategy *s) { return s && s->mode == FG_MODE_ZERO3; }

fg_status fg_strategy_param_range(const fg_strategy *s, int rank, int64_t *begin, int64_t *end) {
    if (!s || !begin || !end) return fg_error(FG_EINVAL, "param_range: NULL argument");
    if (fg_strategy_shards_params(s)) return fg_strategy_shard_range(s, rank, begin, end);
    int world = s->comm ? fg_comm_size(s->comm) : 1;
    if (rank < 0 || rank >= world)
        return fg_error(FG_EINVAL, "param_range: rank %d: expected 0..%d", rank, world - 1);
    *begin = 0;
    *end = fg_module_numel(s->model);
    return FG_OK;
}

fg_status fg_strategy_gather_params(fg_strategy *s) {
    if (!s) return fg_error(FG_EINVAL, "gather_params: NULL strategy");
    return s->drv->gather ? s->drv->gather(s) : FG_OK;
}

fg_status fg_strategy_release_params(fg_strategy *s) {
    if (!s) return fg_error(FG_EINVAL, "release_params: NULL strategy");
    return s->drv->release ? s->drv->release(s) : FG_OK;
}

int64_t fg_strategy_peak_gathered(const fg_strategy *s) {
    return s ? fg__zero3_peak_gathered(s) : 0;
}

int fg_strategy_num_units(const fg_strategy *s) { return s ? fg__zero3_num_units(s) : 0; }

fg_status fg_strategy_shard_range(const fg_strategy *s, int rank, int64_t *begin, int64_t *end) {
    if (!s || !begin || !end) return fg_error(FG_EINVAL, "shard_range: NULL argument");
    int world = s->comm ? fg_comm_size(s->comm) : 1;
    if (rank < 0 || rank >= world)
        return fg_error(FG_EINVAL, "shard_range: rank %d: expected 0..%d", rank, world - 1);
    if (fg_strategy_is_sharded(s)) {
        fg__zero_range(s, rank, begin, end);
    } else {
        *begin = 0;
        *end = fg_module_numel(s->model);
    }
    return FG_OK;
}

void fg_strategy_free(fg_strategy *s) {
    if (!s) return;
    fg_error_kept kept; /* a _free never changes the caller's error (core.h) */
    fg_error_keep(&kept);
    fg__bagua_free(s); /* first: its background thread, its hook on the optimizer */
    fg__ddp_hooks_free(s);
    fg__det_free(s);
    fg__ddp_reducer_free(s->reducer);
    fg__zero3_free(s);
    fg__zero_free(s);
    fg__dp_free(s);
    fg__horovod_free(s);
    fg__hivemind_free(s);
    fg_free(s);
    fg_error_restore(&kept);
}

fg_status fg__strategy_broadcast_params(fg_strategy *s) {
    fg_tensor *flat = fg_module_flat_params(s->model);
    if (!flat || !fg_module_flat_grads(s->model))
        return fg_error(FG_EINVAL, "%s: the model has no flat parameter buffer",
                        fg_strategy_kind_name(s->kind));
    /* Every rank starts from rank 0's weights, as PyTorch's DDP constructor. */
    fg_status st = fg__staged_broadcast(s->comm, fg_tensor_dev(flat), fg_tensor_data(flat),
                                        fg_tensor_numel(flat), fg_tensor_dtype(flat), 0);
    if (st != FG_OK)
        return fg_error_wrap(st, "%s setup: broadcasting the parameters from rank 0",
                             fg_strategy_kind_name(s->kind));
    /* and its buffers (register_buffer's), as DDP's constructor broadcasts
     * the module's buffers too; the built-in models have none */
    for (int64_t i = 0; i < fg_module_num_buffers(s->model); i++) {
        fg_tensor *b = fg_module_buffer(s->model, i);
        st = fg__staged_broadcast(s->comm, fg_tensor_dev(b), fg_tensor_data(b), fg_tensor_numel(b),
                                  fg_tensor_dtype(b), 0);
        if (st != FG_OK)
            return fg_error_wrap(st, "%s setup: broadcasting buffer \"%s\" from rank 0",
                                 fg_strategy_kind_name(s->kind),
                                 fg_module_buffer_name(s->model, i));
    }
    return FG_OK;
}

fg_status fg__strategy_reducer_new(fg_strategy *s, fg_comm *comm, const fg__ddp_reducer_opts *ro) {
    fg_module *m = s->model;
    int n = (int)fg_module_num_params(m);
    fg_tensor **params = fg_calloc((size_t)n + 1, sizeof *params);
    int64_t *offs = fg_calloc((size_t)n + 1, sizeof *offs);
    if (!params || !offs) {
        fg_free(params);
        fg_free(offs);
        return fg_error_wrap(FG_ENOMEM, "%s setup", fg_strategy_kind_name(s->kind));
    }
    /* PyTorch's DDP registers the parameters that require grad when it is
     * made: a frozen teacher or an EMA copy in the tree is not waited for
     * (its gradient stays zero, and the buckets still span it). With none
     * requiring grad, every one is kept, as before. */
    int k = 0;
    for (int i = 0; i < n; i++) {
        fg_tensor *p = fg_module_param(m, i);
        if (!fg_tensor_requires_grad(p)) continue;
        params[k] = p;
        offs[k++] = fg_module_param_offset(m, i);
    }
    if (k == 0)
        for (int i = 0; i < n; i++, k++) {
            params[k] = fg_module_param(m, i);
            offs[k] = fg_module_param_offset(m, i);
        }
    fg_status st =
        fg__ddp_reducer_new(comm, fg_module_flat_grads(m), k, params, offs, ro, &s->reducer);
    fg_free(params);
    fg_free(offs);
    return st;
}

fg_status fg_strategy_comm_bytes(const fg_strategy *s, fg_comm_bytes *out) {
    if (!s || !out) return fg_error(FG_EINVAL, "strategy_comm_bytes: NULL argument");
    *out = (fg_comm_bytes){0};
    if (s->drv->bytes) s->drv->bytes(s, out);
    return FG_OK;
}

/* The mode of a kind with its options (checked already), from the row of
 * the algorithm it runs (fsdp by its sharding strategy): replicas on
 * threads are dp (ddp2 adds the cross-node average, ddp2.c), what it shards
 * its ZeRO stage, Bagua's and Horovod's options their own. */
static fg__strategy_mode mode_of(fg_strategy_kind kind, const fg_sharded_opts *o) {
    fg_sharding_strategy ss = o ? o->sharding_strategy : FG_SHARDING_FULL_SHARD;
    const fg_strategy_info *r = fg_strategy_info_of(fg_strategy_algorithm(kind, ss));
    if (r->takes & FG_TAKES_HIVEMIND) return FG_MODE_HIVEMIND;
    if (r->ranks == FG_RANKS_ONE_PROCESS && !r->replica_threads) return FG_MODE_SINGLE;
    if (r->replica_threads) return FG_MODE_DP;
    if (r->shards & FG_SHARDS_PARAMS) return FG_MODE_ZERO3;
    if (r->shards & FG_SHARDS_GRADS) return FG_MODE_ZERO2;
    if (r->shards & FG_SHARDS_OPTIM_STATE) return FG_MODE_ZERO1;
    if (r->takes & FG_TAKES_BAGUA) return FG_MODE_BAGUA;
    if (r->takes & FG_TAKES_HOROVOD) return FG_MODE_HOROVOD;
    return FG_MODE_DDP;
}

/* fsdp's SHARD_GRAD_OP with the parameters offloaded to the cpu, on a
 * device: PyTorch's SHARD_GRAD_OP shards the parameters outside the
 * forward and backward (it gathers each unit before its forward and frees
 * it after its backward), which is what leaves a shard to offload. Stage
 * 3's units do that with the gather kept from forward to backward
 * (zero3.c); without the offload (and on the host, where an offload moves
 * nothing) SHARD_GRAD_OP runs as stage 2, which keeps the whole parameters
 * resident and computes the same bits. */
static bool grad_op_offloaded(fg_strategy_kind kind, const fg_sharded_opts *o, fg_module *m) {
    return kind == FG_STRATEGY_FSDP && o && o->sharding_strategy == FG_SHARDING_SHARD_GRAD_OP &&
           o->offload_params_device == FG_OFFLOAD_CPU && fg__zero_dev(fg_module_flat_params(m));
}

fg_strategy *fg_strategy_new(fg_strategy_kind kind, fg_comm *comm, fg_module *model,
                             fg_optimizer *opt, const fg_ddp_opts *ddp,
                             const fg_sharded_opts *sharded, int dp_threads) {
    if (!model) {
        fg_error(FG_EINVAL, "strategy: NULL model");
        return NULL;
    }
    if ((int)kind < 0 || kind >= FG_STRATEGY_COUNT) {
        fg_error(FG_EINVAL, "strategy: kind %d: expected one of fg_strategy_kind", (int)kind);
        return NULL;
    }
    if (fg_strategy_kind_is_ddp(kind) && !comm) {
        fg_error(FG_EINVAL, "strategy %s: needs a communicator", fg_strategy_kind_name(kind));
        return NULL;
    }
    if (fg_strategy_check_sharded(kind, sharded) != FG_OK) return NULL;
    if (fg_strategy_check_ddp(ddp) != FG_OK) return NULL;
    fg__strategy_mode mode = mode_of(kind, sharded);
    if (mode == FG_MODE_ZERO2 && grad_op_offloaded(kind, sharded, model)) mode = FG_MODE_ZERO3;
    /* empty init: all of the model, unless stage 3 initialises its shards */
    if (mode != FG_MODE_ZERO3 && fg__module_materialize(model) != FG_OK) return NULL;
    fg_strategy *s = fg_calloc(1, sizeof *s);
    if (!s) return NULL; /* fg_calloc left FG_ENOMEM */
    s->kind = kind;
    s->mode = mode;
    s->drv = fg__strategy_driver_of(mode, ddp && ddp->deterministic);
    s->comm = comm;
    s->model = model;
    s->opt = opt;
    s->sync = true;
    fg_status st = FG_OK;
    fg_strategy_kind algo =
        fg_strategy_algorithm(kind, sharded ? sharded->sharding_strategy : FG_SHARDING_FULL_SHARD);
    if (ddp && ddp->deterministic) {
        if (!(fg_strategy_info_of(algo)->takes & FG_TAKES_DETERMINISTIC) || ddp->user_hook ||
            ddp->comm_hook != FG_DDP_HOOK_NONE || ddp->comm_wrapper != FG_DDP_WRAPPER_NONE) {
            fg_error(FG_EUNSUPPORTED,
                     "deterministic: built for the single and ddp strategies without a "
                     "communication hook (this is %s%s)",
                     fg_strategy_kind_name(kind),
                     ddp->user_hook || ddp->comm_hook || ddp->comm_wrapper ? " with a hook" : "");
            fg_free(s);
            return NULL;
        }
        st = s->drv->setup(s, ddp, sharded, dp_threads);
        if (st != FG_OK) {
            fg_strategy_free(s);
            return NULL;
        }
        return s;
    }
    if (s->drv->setup) st = s->drv->setup(s, ddp, sharded, dp_threads);
    if (st == FG_OK && sharded &&
        (sharded->offload_optimizer_device == FG_OFFLOAD_NVME ||
         sharded->offload_params_device == FG_OFFLOAD_NVME))
        st = fg__offload_setup(s, sharded);
    /* cpu offload on a device: the state to host memory, the step on the
     * CPU (on the host there is nothing to move) */
    if (st == FG_OK && sharded && s->opt && sharded->offload_optimizer_device == FG_OFFLOAD_CPU)
        st = fg__optimizer_offload_cpu(s->opt);
    if (st == FG_OK && sharded && s->opt && sharded->offload_params_device == FG_OFFLOAD_CPU &&
        fg__zero_dev(fg_module_flat_params(model)))
        st = fg__poffload_setup_cpu(s);
    if (st != FG_OK) {
        fg_strategy_free(s); /* leaves this thread's message alone */
        return NULL;
    }
    return s;
}

fg_status fg_strategy_backward(fg_strategy *s, fg_tensor *loss) {
    return s->drv->backward ? s->drv->backward(s, loss) : fg_backward(loss);
}

fg_status fg_strategy_step(fg_strategy *s, fg_batch *b, fg_strategy_step_fn fn, void *ud,
                           double *part_losses, int max_parts, int *nparts, double *loss) {
    if (s->drv->step) return s->drv->step(s, b, fn, ud, part_losses, max_parts, nparts, loss);
    fg_tensor *l = fn(s->model, b, ud);
    if (!l) return fg_error_wrap(FG_EINVAL, "training step returned no loss");
    double v = fg_item(l);
    FG_TRY(fg_strategy_backward(s, l));
    if (part_losses && max_parts > 0) part_losses[0] = v;
    if (nparts) *nparts = 1;
    if (loss) *loss = v;
    return FG_OK;
}

fg_status fg_strategy_clip_grad_norm(fg_strategy *s, double max_norm, double *total_norm) {
    if (s->drv->clip) return s->drv->clip(s, max_norm, total_norm);
    /* Under ddp every rank holds the same averaged gradient after backward,
     * so the local norm is the global one; no communication is needed. */
    fg_tensor *g = fg_module_flat_grads(s->model);
    if (!g) return fg_error(FG_EINVAL, "clip_gradients: the model has no gradient buffer");
    const fg_op_table *ops = fg_ops_get(fg_tensor_device(g));
    double sq = 0;
    FG_TRY(ops->sumsq_all(g, &sq));
    double norm = sqrt(sq);
    if (total_norm) *total_norm = norm;
    if (max_norm > 0 && norm > max_norm) FG_TRY(ops->scale(g, max_norm / (norm + 1e-6), g));
    return FG_OK;
}

fg_status fg_strategy_optimizer_step(fg_strategy *s, fg_optimizer *opt, bool *stepped) {
    if (stepped) *stepped = true;
    if (!s || !opt) return fg_error(FG_EINVAL, "strategy optimizer_step: NULL argument");
    if (!s->drv->optimizer_step) return fg_optimizer_step(opt);
    return s->drv->optimizer_step(s, opt, stepped);
}

fg_status fg_strategy_settle(fg_strategy *s) {
    if (!s) return fg_error(FG_EINVAL, "strategy settle: NULL strategy");
    return fg__hivemind_settle(s);
}
