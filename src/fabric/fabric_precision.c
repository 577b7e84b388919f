/* The fabric's precision plugin (Lightning's MixedPrecision): the autocast
 * dtype of the setting (fg_precision_policy_of), the loss scaler of
 * 16-mixed and its place in a checkpoint, and the optimizer step that
 * consults it.
 *
 * Invariant under a scaler: the gradients a backward leaves are multiplied
 * by the scale until fg_fabric_optimizer_step (or the clipping before it)
 * unscales them. A plain fg_optimizer_step would apply them scaled; the
 * fabric notices one (the optimizer's step count moved without it) at the
 * next backward and refuses it, FG_ESTATE saying what to call. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "fabric_impl.h"

fg_status fg__fabric_precision_init(fg_fabric *f) {
    const fg_precision_policy *p = fg_precision_policy_of(f->plan.precision);
    f->dtype = p->param_dtype;
    f->autocast = p->master_weights ? p->compute : FG_DTYPE_DEFAULT;
    f->scaler_expect = -1;
    if (p->loss_scaling && !(f->scaler = fg_scaler_new(NULL))) return fg_last_status();
    return FG_OK;
}

fg_precision_kind fg_fabric_precision(const fg_fabric *f) { return f->plan.precision; }
const fg_scaler *fg_fabric_scaler(const fg_fabric *f) { return f->scaler; }

fg_dtype fg_fabric_autocast_begin(fg_fabric *f) {
    fg_dtype prev = fg_autocast_dtype();
    fg__status_drop(fg_autocast_set(f->autocast, NULL)); /* bf16, f16 or off: always valid */
    return prev;
}

void fg_fabric_autocast_end(fg_fabric *f, fg_dtype prev) {
    (void)f;
    fg__status_drop(fg_autocast_set(prev, NULL)); /* what autocast_begin returned */
}

fg_status fg__fabric_scaler_check(fg_fabric *f) {
    if (!f->scaler || !f->opt) return FG_OK;
    int64_t n = fg_optimizer_step_count(f->opt);
    if (f->scaler_expect >= 0 && n != f->scaler_expect)
        return fg_error(FG_ESTATE,
                        "precision=\"16-mixed\": the optimizer stepped outside "
                        "fg_fabric_optimizer_step (%lld steps, %lld expected), on gradients "
                        "multiplied by the loss scale %g: call fg_fabric_optimizer_step(f, opt) "
                        "instead of fg_optimizer_step",
                        (long long)n, (long long)f->scaler_expect, fg_scaler_scale(f->scaler));
    f->scaler_expect = n;
    return FG_OK;
}

fg_tensor *fg__fabric_scale_loss(fg_fabric *f, fg_tensor *loss) {
    return f->scaler && loss ? fg_scale(loss, fg_scaler_scale(f->scaler)) : loss;
}

static FG_MUST_USE fg_status optimizer_step(fg_fabric *f, fg_optimizer *opt);

/* The step with its device copies counted (fg_fabric_copies.opt_*). */
fg_status fg_fabric_optimizer_step(fg_fabric *f, fg_optimizer *opt) {
    if (!f || !opt)
        return fg_error(FG_EINVAL, "fabric optimizer_step: NULL %s", f ? "optimizer" : "fabric");
    if (!f->dev) return optimizer_step(f, opt);
    fg_dev_memory_stats a = fg_dev_memory_stats_get(f->dev);
    fg_status st = optimizer_step(f, opt);
    fg_dev_memory_stats b = fg_dev_memory_stats_get(f->dev);
    uint64_t ch = b.comm_h2d_bytes - a.comm_h2d_bytes, cd = b.comm_d2h_bytes - a.comm_d2h_bytes;
    f->copies.opt_h2d += b.h2d_bytes - a.h2d_bytes - ch;
    f->copies.opt_d2h += b.d2h_bytes - a.d2h_bytes - cd;
    f->copies.opt_comm_h2d += ch;
    f->copies.opt_comm_d2h += cd;
    f->copies.opt_steps++;
    return st;
}

static FG_MUST_USE fg_status optimizer_step(fg_fabric *f, fg_optimizer *opt) {
    if (!f->scaler)
        return f->strategy ? fg_strategy_optimizer_step(f->strategy, opt, NULL)
                           : fg_optimizer_step(opt);
    bool stepped;
    FG_TRY(fg_scaler_step(f->scaler, opt, f->comm, &stepped));
    if (opt == f->opt) f->scaler_expect = fg_optimizer_step_count(opt);
    return FG_OK;
}

fg_status fg__fabric_scaler_unscale(fg_fabric *f) {
    return f->scaler && f->model ? fg_scaler_unscale(f->scaler, f->model, f->comm) : FG_OK;
}

fg_status fg_fabric_unscale_gradients(fg_fabric *f) {
    if (!f) return fg_error(FG_EINVAL, "fabric unscale_gradients: NULL fabric");
    return fg__fabric_scaler_unscale(f);
}

/* ------------------------------------------------------------ checkpoint */

fg_status fg__fabric_scaler_save(fg_fabric *f, fg_st_writer *w) {
    if (!f->scaler) return FG_OK;
    fg_scaler_state st = fg_scaler_get_state(f->scaler);
    char num[64];
    snprintf(num, sizeof num, "%.17g", st.scale);
    FG_TRY(fg_st_writer_set_meta(w, "loss_scale", num));
    snprintf(num, sizeof num, "%" PRId64, st.growth_tracker);
    FG_TRY(fg_st_writer_set_meta(w, "loss_scale_growth_tracker", num));
    snprintf(num, sizeof num, "%" PRId64, st.skipped);
    return fg_st_writer_set_meta(w, "loss_scale_skipped", num);
}

fg_status fg__fabric_scaler_load(fg_fabric *f, const fg__ckpt_counters *c) {
    f->scaler_expect = -1; /* the optimizer's step count comes from the file */
    if (!f->scaler || !c->has_scaler) return FG_OK;
    fg_scaler_state st = {
        .scale = c->loss_scale, .growth_tracker = c->growth_tracker, .skipped = c->skipped};
    return fg_scaler_set_state(f->scaler, &st);
}
