/* Several optimizers and manual optimization (Lightning's
 * automatic_optimization = False): configure_optimizers' answer checked and
 * kept, the fabric set up over the model with every optimizer
 * (fg_fabric_setup_many), and the calls a manual training_step makes:
 * optimizers(), lr_schedulers(), manual_backward, optimizer.step(),
 * toggle_optimizer / untoggle_optimizer. */
#include <math.h>
#include <string.h>

#include "trainer_impl.h"

void fg__free_config(fg_optimizer_config *oc) {
    fg_lr_scheduler_free(oc->scheduler);
    for (int i = 0; i < oc->nlr_schedulers && i < FG_FABRIC_MAX_OPTIMIZERS; i++)
        fg_lr_scheduler_free(oc->lr_schedulers[i]);
    fg_optimizer_free(oc->optimizer);
    for (int i = 0; i < oc->noptimizers && i < FG_FABRIC_MAX_OPTIMIZERS; i++)
        fg_optimizer_free(oc->optimizers[i]);
    memset(oc, 0, sizeof *oc);
}

void fg__free_optimizers(fg_trainer *t) {
    fg_trainer_untoggle_optimizer(t, t->toggled);
    fg_lr_scheduler_free(t->oc.scheduler);
    t->oc.scheduler = NULL;
    for (int i = 0; i < t->nscheds; i++) fg_lr_scheduler_free(t->scheds[i]);
    for (int i = 0; i < t->nopts; i++) fg_optimizer_free(t->opts[i]);
    if (!t->nopts) fg_optimizer_free(t->opt);
    t->nopts = t->nscheds = 0;
    t->opt = NULL;
}

static int index_of(const fg_trainer *t, const fg_optimizer *opt) {
    for (int i = 0; i < t->nopts; i++)
        if (t->opts[i] == opt) return i;
    return -1;
}

/* The checks of manual optimization against the trainer's options, as
 * Lightning refuses them. */
static FG_MUST_USE fg_status check_manual(fg_trainer *t, const fg_optimizer_config *oc) {
    if (oc->schedule || oc->lr_at)
        return fg_error(FG_EINVAL, "configure_optimizers: a schedule/lr_at with manual "
                                   "optimization: give a scheduler and step it yourself "
                                   "(fg_trainer_lr_scheduler, fg_lr_scheduler_step)");
    if (t->accumulate > 1)
        return fg_error(FG_EINVAL,
                        "accumulate_grad_batches=%lld with manual optimization "
                        "(automatic_optimization FG_OFF): accumulate in training_step (step "
                        "every n batches, zero the gradients after)",
                        (long long)t->accumulate);
    if (t->clip_val > 0)
        return fg_error(FG_EINVAL, "gradient_clip_val with manual optimization: clip in "
                                   "training_step with fg_fabric_clip_gradients before "
                                   "fg_trainer_optimizer_step");
    if (t->o.on_nonfinite != FG_NONFINITE_IGNORE)
        return fg_error(FG_EINVAL, "on_nonfinite with manual optimization: check the losses in "
                                   "training_step");
    if (fg_strategy_info_of(fg_fabric_plan(t->f)->strategy)->replica_threads)
        return fg_error(FG_EUNSUPPORTED,
                        "manual optimization under strategy %s (it splits each batch over "
                        "threads): use single or ddp",
                        fg_fabric_strategy_name(t->f));
    if (fg_fabric_deterministic(t->f))
        return fg_error(FG_EUNSUPPORTED, "manual optimization with deterministic=true (its "
                                         "micro-batches are the trainer's to average)");
    return FG_OK;
}

fg_status fg__take_optimizers(fg_trainer *t, fg_module *model, fg_optimizer_config *oc) {
    bool manual = t->m.automatic_optimization == FG_OFF;
    fg_status s = FG_OK;
    fg_optimizer *opts[FG_FABRIC_MAX_OPTIMIZERS];
    fg_lr_scheduler *scheds[FG_FABRIC_MAX_OPTIMIZERS];
    int nopts = 0, nscheds = 0;
    if (oc->noptimizers < 0 || oc->noptimizers > FG_FABRIC_MAX_OPTIMIZERS ||
        oc->nlr_schedulers < 0 || oc->nlr_schedulers > FG_FABRIC_MAX_OPTIMIZERS) {
        int no = oc->noptimizers, ns = oc->nlr_schedulers;
        oc->noptimizers = oc->nlr_schedulers = 0; /* nothing to trust in them */
        fg__free_config(oc);
        return fg_error(FG_EINVAL,
                        "configure_optimizers: noptimizers %d / nlr_schedulers %d: each 0 to %d",
                        no, ns, FG_FABRIC_MAX_OPTIMIZERS);
    }
    if (oc->optimizer && oc->noptimizers)
        s = fg_error(FG_EINVAL, "configure_optimizers: both out->optimizer and "
                                "out->optimizers[]: give one of them");
    else if (oc->scheduler && oc->nlr_schedulers)
        s = fg_error(FG_EINVAL, "configure_optimizers: both out->scheduler and "
                                "out->lr_schedulers[]: give one of them");
    if (s != FG_OK) {
        fg__free_config(oc);
        return s;
    }
    if (oc->optimizer) opts[nopts++] = oc->optimizer;
    for (int i = 0; i < oc->noptimizers; i++) opts[nopts++] = oc->optimizers[i];
    if (oc->scheduler) scheds[nscheds++] = oc->scheduler;
    for (int i = 0; i < oc->nlr_schedulers; i++) scheds[nscheds++] = oc->lr_schedulers[i];
    for (int i = 0; s == FG_OK && i < nopts; i++)
        if (!opts[i])
            s = fg_error(FG_EINVAL, "configure_optimizers: out->optimizers[%d] is NULL", i);
    for (int i = 0; s == FG_OK && i < nscheds; i++)
        if (!scheds[i])
            s = fg_error(FG_EINVAL, "configure_optimizers: out->lr_schedulers[%d] is NULL", i);
    if (s == FG_OK && !nopts)
        s = fg_error(FG_EINVAL, "configure_optimizers gave no optimizer (out->optimizer)");
    if (s == FG_OK && !manual && nopts > 1)
        s = fg_error(FG_EINVAL,
                     "configure_optimizers gave %d optimizers: several optimizers need manual "
                     "optimization (the module's automatic_optimization = FG_OFF), as "
                     "Lightning 2",
                     nopts);
    if (s == FG_OK && !manual && nscheds > 1)
        s = fg_error(FG_EINVAL,
                     "configure_optimizers gave %d schedulers for one optimizer: "
                     "chain them (fg_chained_scheduler_new, fg_sequential_lr_new)",
                     nscheds);
    /* automatic: fg__check_scheduler names a scheduler of another optimizer */
    for (int i = 0; s == FG_OK && manual && i < nscheds; i++) {
        fg_optimizer *so = fg_lr_scheduler_optimizer(scheds[i]);
        bool found = false;
        for (int j = 0; j < nopts; j++) found = found || so == opts[j];
        if (!found)
            s = fg_error(FG_EINVAL,
                         "configure_optimizers: lr_schedulers[%d] (%s) is made on an optimizer "
                         "configure_optimizers did not give",
                         i, fg_lr_scheduler_name(scheds[i]));
    }
    if (s == FG_OK && manual) s = check_manual(t, oc);
    /* automatic: the one optimizer and its lr_scheduler_config, as before */
    fg_optimizer_config one = *oc;
    if (!manual) {
        one.optimizer = opts[0];
        one.scheduler = nscheds ? scheds[0] : NULL;
        if (s == FG_OK) s = fg__check_scheduler(&one);
        if (s == FG_OK && (one.frequency < 0 || one.interval < FG_INTERVAL_EPOCH ||
                           one.interval > FG_INTERVAL_STEP))
            s = fg_error(FG_EINVAL,
                         "configure_optimizers: frequency %lld / interval %d: expected "
                         "frequency >= 1 (0 = 1) and FG_INTERVAL_EPOCH or FG_INTERVAL_STEP",
                         (long long)one.frequency, (int)one.interval);
        if (s == FG_OK && fg_optimizer_module(one.optimizer) != model)
            s = fg_error(FG_EINVAL, "configure_optimizers: the optimizer is not over the "
                                    "module's model");
        if (s == FG_OK) s = fg_fabric_setup(t->f, model, one.optimizer);
    } else if (s == FG_OK) {
        s = fg_fabric_setup_many(t->f, &model, 1, opts, nopts);
        if (s != FG_OK) s = fg_error_wrap(s, "configure_optimizers");
    }
    if (s != FG_OK) {
        fg__free_config(oc);
        return s;
    }
    fg__free_optimizers(t);
    t->manual = manual;
    t->nopts = nopts;
    memcpy(t->opts, opts, sizeof opts[0] * (size_t)nopts);
    t->opt = opts[0];
    t->oc = one;
    t->oc.optimizer = opts[0];
    t->oc.noptimizers = t->oc.nlr_schedulers = 0;
    if (manual) {
        t->nscheds = nscheds;
        memcpy(t->scheds, scheds, sizeof scheds[0] * (size_t)nscheds);
        t->oc.scheduler = NULL;
        t->oc.monitor = NULL;
        t->oc.schedule = NULL;
        t->oc.lr_at = NULL;
    }
    snprintf(t->sched_monitor, sizeof t->sched_monitor, "%s", t->oc.monitor ? t->oc.monitor : "");
    t->oc.monitor = t->oc.monitor ? t->sched_monitor : NULL;
    if (t->oc.schedule) t->sched = *t->oc.schedule;
    t->oc.schedule = t->oc.schedule ? &t->sched : NULL;
    if (!t->oc.frequency) t->oc.frequency = 1;
    return FG_OK;
}

fg_status fg__ckpt_optimizers_ok(const fg_trainer *t) {
    if (t->fn != FG_FIT || !t->opt) return FG_OK;
    /* several: each one's state under optimizer.N. (fg_train_state.optimizers) */
    if (t->nopts == 1 && fg_optimizer_module(t->opt) != t->model)
        return fg_error(FG_EUNSUPPORTED, "checkpoint: the optimizer is over a sub-module of the "
                                         "model, and a checkpoint holds an optimizer over the "
                                         "whole model: turn checkpointing off "
                                         "(enable_checkpointing FG_OFF)");
    return FG_OK;
}

/* ------------------------------------------------------------ the calls */

fg_optimizer *fg_trainer_optimizer_at(const fg_trainer *t, int i) {
    if (!t || i < 0 || i >= t->nopts) {
        fg_error(FG_EINVAL, "optimizers: index %d of %d optimizers", i, t ? t->nopts : 0);
        return NULL;
    }
    return t->opts[i];
}

int fg_trainer_num_optimizers(const fg_trainer *t) { return t ? t->nopts : 0; }

fg_lr_scheduler *fg_trainer_lr_scheduler(const fg_trainer *t, int i) {
    if (!t) return NULL;
    if (!t->manual) return i == 0 ? t->oc.scheduler : NULL;
    return i >= 0 && i < t->nscheds ? t->scheds[i] : NULL;
}

int fg_trainer_num_lr_schedulers(const fg_trainer *t) {
    if (!t) return 0;
    return t->manual ? t->nscheds : t->oc.scheduler ? 1 : 0;
}

static FG_MUST_USE fg_status need_manual_step(const fg_trainer *t, const char *what) {
    if (!t) return fg_error(FG_EINVAL, "%s: NULL trainer", what);
    if (!t->manual)
        return fg_error(FG_ESTATE,
                        "%s: the module uses automatic optimization (the trainer calls "
                        "backward and steps): set automatic_optimization = FG_OFF to do it in "
                        "training_step",
                        what);
    if (!t->in_manual_step) return fg_error(FG_ESTATE, "%s: only inside training_step", what);
    return FG_OK;
}

fg_status fg_trainer_manual_backward(fg_trainer *t, fg_tensor *loss) {
    FG_TRY(need_manual_step(t, "manual_backward"));
    if (!loss) {
        fg_status s = fg_last_status();
        return fg_error_wrap(s != FG_OK ? s : FG_EINVAL, "manual_backward: NULL loss");
    }
    if (t->o.detect_anomaly) {
        double v = fg_item(loss);
        if (!isfinite(v))
            return fg_error(FG_EINVAL,
                            "detect_anomaly: manual_backward of a loss of %g at global step "
                            "%lld (epoch %lld, batch %lld)",
                            v, (long long)t->global_step, (long long)t->current_epoch,
                            (long long)t->batch_idx);
    }
    fg_fabric_set_no_backward_sync(t->f, false);
    fg_status s = fg_fabric_backward(t->f, loss);
    return s == FG_OK ? FG_OK : fg_error_wrap(s, "manual_backward");
}

fg_status fg_trainer_optimizer_step(fg_trainer *t, fg_optimizer *opt) {
    FG_TRY(need_manual_step(t, "optimizer step"));
    if (index_of(t, opt) < 0)
        return fg_error(FG_EINVAL,
                        "optimizer step: not one of the %d optimizers of "
                        "configure_optimizers (fg_trainer_optimizer_at)",
                        t->nopts);
    FG_TRY(fg_fabric_unscale_gradients(t->f));
    FG_TRY(fg__hook_all(t, FG__H_BEFORE_OPT_STEP));
    FG_TRY(fg_fabric_optimizer_step(t->f, opt));
    t->global_step++;
    return FG_OK;
}

/* [lo, hi): opt's elements in the model's flat buffer. */
static void opt_range(fg_trainer *t, fg_optimizer *opt, int64_t *lo, int64_t *hi) {
    fg_module *om = fg_optimizer_module(opt);
    fg_tensor *rf = fg_module_flat_params(t->model), *mf = fg_module_flat_params(om);
    int64_t es = (int64_t)fg_dtype_size(fg_tensor_dtype(rf));
    *lo = ((const char *)fg_tensor_data(mf) - (const char *)fg_tensor_data(rf)) / es;
    *hi = *lo + fg_module_numel(om);
}

fg_status fg_trainer_toggle_optimizer(fg_trainer *t, fg_optimizer *opt) {
    if (!t) return fg_error(FG_EINVAL, "toggle_optimizer: NULL trainer");
    if (index_of(t, opt) < 0)
        return fg_error(FG_EINVAL,
                        "toggle_optimizer: not one of the %d optimizers of "
                        "configure_optimizers",
                        t->nopts);
    fg_trainer_untoggle_optimizer(t, t->toggled);
    int64_t n = fg_module_num_params(t->model);
    t->toggle_saved = fg_calloc(n ? (size_t)n : 1, sizeof *t->toggle_saved);
    if (!t->toggle_saved) return fg_error(FG_ENOMEM, "toggle_optimizer");
    int64_t lo, hi;
    opt_range(t, opt, &lo, &hi);
    for (int64_t i = 0; i < n; i++) {
        fg_tensor *p = fg_module_param(t->model, i);
        t->toggle_saved[i] = fg_tensor_requires_grad(p);
        int64_t off = fg_module_param_offset(t->model, i);
        if (off < lo || off >= hi) fg_tensor_set_requires_grad(p, false);
    }
    t->toggled = opt;
    return FG_OK;
}

void fg_trainer_untoggle_optimizer(fg_trainer *t, fg_optimizer *opt) {
    if (!t || !t->toggled || (opt && opt != t->toggled)) return;
    int64_t n = fg_module_num_params(t->model);
    for (int64_t i = 0; i < n; i++)
        fg_tensor_set_requires_grad(fg_module_param(t->model, i), t->toggle_saved[i]);
    fg_free(t->toggle_saved);
    t->toggle_saved = NULL;
    t->toggled = NULL;
}
