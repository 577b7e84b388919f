/* post_localsgd: torch's post_localSGD_hook (PostLocalSGDState) with the
 * PeriodicModelAverager of PostLocalSGDOptimizer, as Lightning sets them up
 * for model_averaging_period. Backwards before start_localSGD_iter average
 * the bucket as plain ddp; later ones leave this rank's gradient as it is.
 * The averaging hangs on the optimizer's post-step hook: after optimizer
 * step k (0-based, counted here), when k >= start and (k - start) % period
 * == 0, the flat parameters are averaged over ranks in one allreduce,
 * counted in the reducer's bytes.
 *
 * Invariant: while l->opt is set, the optimizer's hook points here;
 * whichever of optimizer and strategy goes first unhooks the other. */
#include "ddp_hooks.h"
#include "optim/optim_impl.h"

typedef struct localsgd {
    int64_t start, period;
    int64_t k; /* optimizer steps so far */
    fg_strategy *s;
    fg_optimizer *opt; /* NULL once freed */
} localsgd;

static FG_MUST_USE fg_status state_new(fg_strategy *s, const fg_ddp_opts *o, void **out) {
    if (!s->opt || fg_optimizer_module(s->opt) != s->model)
        return fg_error(FG_EINVAL,
                        "ddp_comm_hook=post_localsgd: needs the optimizer over the whole model "
                        "(it averages the parameters after the optimizer's steps); got %s",
                        s->opt ? "one over another module" : "none");
    localsgd *l = fg_calloc(1, sizeof *l);
    if (!l) return fg_error_wrap(FG_ENOMEM, "post_localsgd setup");
    l->start = FG_MAX(0, o->post_localsgd.start_localSGD_iter);
    l->period = o->post_localsgd.period > 0 ? o->post_localsgd.period : 4;
    l->s = s;
    *out = l;
    return FG_OK;
}

static FG_MUST_USE fg_status average(void *ud, fg_optimizer *opt) {
    (void)opt;
    localsgd *l = ud;
    int64_t k = l->k++;
    if (k < l->start || (k - l->start) % l->period) return FG_OK;
    fg_tensor *flat = fg_module_flat_params(l->s->model);
    int64_t n = fg_tensor_numel(flat);
    fg_dtype dt = fg_tensor_dtype(flat);
    fg_status st = fg__staged_allreduce(l->s->comm, fg__zero_dev(flat), fg_tensor_data(flat), n, dt,
                                        FG_REDUCE_OP_AVG);
    if (st != FG_OK)
        return fg_error_wrap(st, "post_localsgd: averaging the parameters after step %lld",
                             (long long)k);
    fg__ddp_reducer_add_bytes(l->s->reducer, (uint64_t)n * fg_dtype_size(dt));
    return FG_OK;
}

static void detach(void *ud) {
    localsgd *l = ud;
    l->opt = NULL;
}

static FG_MUST_USE fg_status attach(fg_strategy *s, void *state) {
    localsgd *l = state;
    l->opt = s->opt;
    fg__optimizer_set_hook(l->opt,
                           &(fg__optim_hook){.post_step = average, .detach = detach, .ud = l});
    return FG_OK;
}

static void state_free(void *state) {
    localsgd *l = state;
    if (!l) return;
    if (l->opt) fg__optimizer_set_hook(l->opt, NULL);
    fg_free(l);
}

static FG_MUST_USE fg_status run(void *state, const fg_ddp_bucket *b) {
    localsgd *l = state;
    if (b->iter < l->start) return fg_ddp_bucket_allreduce(b, b->grad, b->numel, FG_REDUCE_OP_AVG);
    return FG_OK;
}

const fg__ddp_hook_vt fg__hook_localsgd = {.name = "post_localsgd",
                                           .state_new = state_new,
                                           .attach = attach,
                                           .state_free = state_free,
                                           .run = run};
