/* The strategies behind one object: single (plain backward), ddp (bucketed,
 * overlapped gradient averaging: ddp_reducer.c) and dp (thread replicas:
 * dp.c). The model's parameters and gradients live in its flat buffers,
 * so every strategy works on plain slices of them. */
#include <math.h>
#include <string.h>

#include "strategy_impl.h"

fg_strategy_kind fg_strategy_kind_of(const fg_strategy *s) { return s->kind; }

const char *fg_strategy_kind_name(fg_strategy_kind k) {
    static const char *const names[FG_STRATEGY_COUNT] = {[FG_STRATEGY_SINGLE] = "single",
                                                         [FG_STRATEGY_DP] = "dp",
                                                         [FG_STRATEGY_DDP] = "ddp",
                                                         [FG_STRATEGY_DDP_SPAWN] = "ddp_spawn",
                                                         [FG_STRATEGY_DDP_FORK] = "ddp_fork"};
    return (int)k >= 0 && k < FG_STRATEGY_COUNT ? names[k] : "?";
}

bool fg_strategy_kind_is_ddp(fg_strategy_kind k) {
    return k == FG_STRATEGY_DDP || k == FG_STRATEGY_DDP_SPAWN || k == FG_STRATEGY_DDP_FORK;
}
void fg_strategy_set_sync(fg_strategy *s, bool sync) { s->sync = sync; }

void fg_strategy_free(fg_strategy *s) {
    if (!s) return;
    fg_ddp_reducer_free(s->reducer);
    fg__dp_free(s);
    fg_free(s);
}

static fg_status setup_ddp(fg_strategy *s, const fg_ddp_opts *o) {
    fg_module *m = s->model;
    fg_tensor *flat = fg_module_flat_params(m), *grads = fg_module_flat_grads(m);
    if (!flat || !grads) return fg_error(FG_EINVAL, "ddp: the model has no flat parameter buffer");
    /* Every rank starts from rank 0's weights, as PyTorch's DDP constructor. */
    fg_status st = fg_comm_broadcast(s->comm, fg_tensor_data(flat), fg_tensor_data(flat),
                                     fg_tensor_numel(flat), fg_tensor_dtype(flat), 0);
    if (st != FG_OK) return fg_error_wrap(st, "ddp setup: broadcasting the parameters from rank 0");
    int n = fg_module_num_params(m);
    fg_tensor **params = fg_calloc((size_t)n + 1, sizeof *params);
    int64_t *offs = fg_calloc((size_t)n + 1, sizeof *offs);
    if (!params || !offs) {
        fg_free(params);
        fg_free(offs);
        return fg_error_wrap(FG_ENOMEM, "ddp setup");
    }
    for (int i = 0; i < n; i++) {
        params[i] = fg_module_param(m, i);
        offs[i] = fg_module_param_offset(m, i);
    }
    fg_ddp_reducer_opts ro = {.bucket_cap_mb = o ? o->bucket_cap_mb : 0,
                              .find_unused_parameters = o && o->find_unused_parameters,
                              .static_graph = o && o->static_graph};
    st = fg_ddp_reducer_new(s->comm, grads, n, params, offs, &ro, &s->reducer);
    fg_free(params);
    fg_free(offs);
    return st;
}

fg_strategy *fg_strategy_new(fg_strategy_kind kind, fg_comm *comm, fg_module *model,
                             fg_optimizer *opt, const fg_ddp_opts *ddp, int dp_threads) {
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
    fg_strategy *s = fg_calloc(1, sizeof *s);
    if (!s) return NULL; /* fg_calloc left FG_ENOMEM */
    s->kind = kind;
    s->comm = comm;
    s->model = model;
    s->opt = opt;
    s->sync = true;
    fg_status st = FG_OK;
    if (fg_strategy_kind_is_ddp(kind)) st = setup_ddp(s, ddp);
    else if (kind == FG_STRATEGY_DP) st = fg__dp_setup(s, dp_threads > 0 ? dp_threads : 2);
    if (st != FG_OK) {
        fg_strategy_free(s); /* leaves this thread's message alone */
        return NULL;
    }
    return s;
}

fg_status fg_strategy_backward(fg_strategy *s, fg_tensor *loss) {
    if (fg_strategy_kind_is_ddp(s->kind)) return fg_ddp_reducer_backward(s->reducer, loss, s->sync);
    return fg_backward(loss);
}

fg_status fg_strategy_step(fg_strategy *s, fg_batch *b, fg_strategy_step_fn fn, void *ud,
                           double *part_losses, int max_parts, int *nparts, double *loss) {
    if (s->kind == FG_STRATEGY_DP)
        return fg__dp_step(s, b, fn, ud, part_losses, max_parts, nparts, loss);
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
