/* The fit loop, as Lightning's _FitLoop and _TrainingEpochLoop count:
 *
 *   fit:    epochs until max_steps optimizer steps, max_epochs epochs, or
 *           should_stop once min_epochs and min_steps are met;
 *   epoch:  batches until the epoch's limit_train_batches, max_steps, or
 *           should_stop (min_* permitting); each batch: training_step,
 *           backward (without ddp's sync while accumulating), and on the
 *           last batch of a window of accumulate_grad_batches (or of the
 *           epoch) the optimizer step: global_step counts these;
 *   after a batch: validation when it is a val_check_batch (every
 *           val_check_interval batches of the epoch, or of the run with
 *           check_val_every_n_epoch None) in an epoch whose number is a
 *           multiple of check_val_every_n_epoch, or when should_stop;
 *   epoch end: epoch values, on_train_epoch_end (callbacks that monitor a
 *           metric last), the loggers' epoch row.
 *
 * Exact resume: everything a batch depends on is a function of what a
 * checkpoint holds. The lr is a pure function of the counters, dropout
 * masks are reseeded per optimizer step from (seed, rank, step), the
 * loader's batches are a function of (seed, epoch, rank, world) and its
 * position. A checkpoint written while an accumulation window is open
 * records the state at the window's start (the weights have not moved
 * since), so the resumed run recomputes the window's gradients; one
 * written between a batch and its validation check records that the check
 * is pending (pending_advance), and one written in a validation records
 * that it ran (val_done_at), so neither is run twice or skipped. */
#include <math.h>
#include <string.h>

#include "trainer_impl.h"

static bool can_stop_early(const fg_trainer *t) {
    bool epochs = t->min_epochs ? t->current_epoch >= t->min_epochs : true;
    bool steps = t->min_steps ? t->global_step >= t->min_steps : true;
    return epochs && steps;
}

static bool fit_done(const fg_trainer *t) {
    if (t->num_training_batches == 0 || t->interrupted) return true;
    if (t->max_steps != -1 && t->global_step >= t->max_steps) return true;
    if (t->max_epochs != -1 && t->current_epoch >= t->max_epochs) return true;
    return t->should_stop && can_stop_early(t);
}

static bool epoch_done(const fg_trainer *t) {
    if (t->batch_idx >= t->num_training_batches || t->stream_ended || t->interrupted) return true;
    if (t->max_steps != -1 && t->global_step >= t->max_steps) return true;
    return t->should_stop && can_stop_early(t);
}

static bool should_check_val(const fg_trainer *t) {
    if (!t->enable_validation || t->interrupted) return false;
    if (t->check_val_every != -1 && (t->current_epoch + 1) % t->check_val_every != 0) return false;
    if (t->should_stop && can_stop_early(t)) return true;
    /* batch_idx and total_batch_idx already count the batch just run */
    int64_t cur = t->check_val_every == -1 ? t->total_batch_idx : t->batch_idx;
    return cur % t->val_check_batch == 0;
}

static FG_MUST_USE fg_status set_lr(fg_trainer *t) {
    const fg_optimizer_config *oc = &t->oc;
    if (!oc->schedule && !oc->lr_at) return FG_OK;
    int64_t base = oc->interval == FG_INTERVAL_STEP ? t->global_step : t->current_epoch;
    int64_t i = base / oc->frequency;
    double lr = oc->schedule ? fg_lr_at(oc->schedule, i) : oc->lr_at(oc->lr_ud, i);
    fg_status s = fg_optimizer_set_lr(t->opt, lr);
    return s == FG_OK ? FG_OK : fg_error_wrap(s, "the lr schedule at %lld", (long long)i);
}

/* ------------------------------------------------------------ one batch */

typedef struct step_ctx {
    fg_trainer *t;
    int64_t batch_idx;
    fg_status err; /* set by the step when it fails: its own status and message */
    char msg[1024];
} step_ctx;

static fg_tensor *step_fail(step_ctx *c, fg_status s) {
    if (c->err == FG_OK) {
        c->err = s;
        snprintf(c->msg, sizeof c->msg, "%s", fg_last_error());
    }
    return NULL;
}

/* fg_fabric_training_step's step: training_step on one part of the batch
 * (dp: on each thread's part), the loss scaled for accumulation. */
static fg_tensor *micro_step(fg_fabric *f, fg_batch *part, void *ud) {
    (void)f;
    step_ctx *c = ud;
    fg_trainer *t = c->t;
    fg__cur_batch_size = part->size;
    fg_tensor *loss = t->m.training_step(t->m.ud, t, part, c->batch_idx);
    if (!loss) {
        fg_status s = fg_last_status() != FG_OK ? fg_last_status() : FG_EINVAL;
        fg_error_wrap(s, "training_step returned no loss at epoch %lld, batch %lld",
                      (long long)t->current_epoch, (long long)c->batch_idx);
        return step_fail(c, s);
    }
    if (t->o.detect_anomaly) {
        double v = fg_item(loss);
        if (!isfinite(v)) {
            fg_error(FG_EINVAL,
                     "detect_anomaly: training_step returned a loss of %g at global step %lld "
                     "(epoch %lld, batch %lld)",
                     v, (long long)t->global_step, (long long)t->current_epoch,
                     (long long)c->batch_idx);
            return step_fail(c, FG_EINVAL);
        }
    }
    /* deterministic: the fabric averages the micro-batches itself */
    bool scale = t->accumulate > 1 && !fg_fabric_deterministic(t->f);
    return scale ? fg_scale(loss, 1.0 / (double)t->accumulate) : loss;
}

static void step_end(fg_fabric *f, const double *part_losses, int nparts, void *ud) {
    (void)f;
    step_ctx *c = ud;
    fg_trainer *t = c->t;
    if (!t->m.training_step_end || c->err != FG_OK) return;
    fg__fx_save prev = fg__fx_set(t, FG__FX_TRAIN_STEP, "training_step_end");
    fg_status s = t->m.training_step_end(t->m.ud, t, part_losses, nparts);
    fg__fx_restore(t, prev);
    if (s != FG_OK) {
        fg_error_wrap(s, "training_step_end");
        step_fail(c, s);
    }
}

/* detect_anomaly: the first parameter whose gradient holds a non-finite
 * value, by name: the search on the gradients' device (one index back),
 * then that one element copied out for the message. */
static FG_MUST_USE fg_status check_grads(fg_trainer *t, int64_t batch_idx, const char *when) {
    fg_module *m = t->model;
    fg_tensor *g = fg_module_flat_grads(m);
    int64_t at = -1;
    FG_TRY(fg_ops_first_nonfinite(g, &at));
    if (at < 0) return FG_OK;
    int64_t i = 0;
    while (i + 1 < fg_module_num_params(m) && fg_module_param_offset(m, i + 1) <= at) i++;
    fg_dtype dt = fg_tensor_dtype(g);
    size_t es = fg_dtype_size(dt);
    _Alignas(8) unsigned char one[8];
    const char *src = (const char *)fg_tensor_data(g) + (size_t)at * es;
    fg_dev *dev = fg_tensor_dev(g);
    if (dev && !fg_dev_host_accessible(dev)) FG_TRY(fg_dev_copy_d2h(dev, one, src, es));
    else memcpy(one, src, es);
    double v = NAN;
    FG_TRY(fg_convert(&v, FG_F64, one, dt, 1));
    return fg_error(FG_EINVAL,
                    "detect_anomaly: the gradient of \"%s\" holds %g (element %lld) %s at global "
                    "step %lld (epoch %lld, batch %lld)",
                    fg_module_param_name(m, i), v, (long long)(at - fg_module_param_offset(m, i)),
                    when, (long long)t->global_step, (long long)t->current_epoch,
                    (long long)batch_idx);
}

/* Each gradient element into [-v, v], on the gradients' device. */
static FG_MUST_USE fg_status clip_by_value(fg_module *m, double v) {
    return fg_ops_clamp_flat(fg_module_flat_grads(m), v);
}

/* The first parameter whose values in the flat buffer g (the gradients or
 * the weights) hold an inf or NaN, or -1. */
static int64_t first_nonfinite_in(fg_module *m, fg_tensor *g) {
    fg_dev *dev = fg_tensor_dev(g);
    if (dev && !fg_dev_host_accessible(dev)) { /* on the device: one index back */
        int64_t k = -1;
        if (fg_ops_first_nonfinite(g, &k) != FG_OK || k < 0) return -1;
        int64_t i = 0;
        while (i + 1 < fg_module_num_params(m) && fg_module_param_offset(m, i + 1) <= k) i++;
        return i;
    }
    fg_dtype dt = fg_tensor_dtype(g);
    const char *data = fg_tensor_data(g);
    for (int64_t i = 0; i < fg_module_num_params(m); i++) {
        int64_t off = fg_module_param_offset(m, i), n = fg_tensor_numel(fg_module_param(m, i));
        if (dt == FG_F64) {
            for (int64_t k = 0; k < n; k++)
                if (!isfinite(((const double *)data)[off + k])) return i;
        } else if (dt == FG_F32) {
            for (int64_t k = 0; k < n; k++)
                if (!isfinite(((const float *)data)[off + k])) return i;
        } else { /* bf16 / f16: the exponent all ones */
            const uint16_t *x = (const uint16_t *)data, e = dt == FG_BF16 ? 0x7f80 : 0x7c00;
            for (int64_t k = 0; k < n; k++)
                if ((x[off + k] & e) == e) return i;
        }
    }
    return -1;
}

static int64_t first_nonfinite_param(fg_module *m) {
    return first_nonfinite_in(m, fg_module_flat_grads(m));
}

bool fg__weights_finite(fg_trainer *t) {
    /* a strategy that shards the parameters holds a part of them: not known here */
    if (fg_strategy_shards_params(fg_fabric_strategy(t->f))) return true;
    return first_nonfinite_in(t->model, fg_module_flat_params(t->model)) < 0;
}

/* on_nonfinite: a non-finite loss on any rank, or gradient, is seen by
 * every rank at once (one allreduce of two flags), so that all stop or all
 * skip the same step. *skip: the step is skipped (gradients zeroed).
 * Collective. */
static FG_MUST_USE fg_status check_nonfinite(fg_trainer *t, bool *skip) {
    *skip = false;
    if (t->o.on_nonfinite == FG_NONFINITE_IGNORE) return FG_OK;
    bool local_loss = t->window_nonfinite;
    t->window_nonfinite = false;
    /* under 16-mixed the loss scaler owns inf/NaN gradients */
    int64_t bad = fg_fabric_scaler(t->f) ? -1 : first_nonfinite_param(t->model);
    /* [0]: a rank's loss is not finite; [1]: minus the first bad parameter
     * (MAX over ranks = the first), -1e18 for none */
    double v[2] = {local_loss ? 1.0 : 0.0, bad >= 0 ? -(double)bad : -1e18};
    int world = fg_fabric_world_size(t->f);
    fg_comm *comm = fg_fabric_comm(t->f);
    if (comm && world > 1) FG_TRY(fg_comm_allreduce(comm, v, v, 2, FG_F64, FG_REDUCE_OP_MAX));
    if (v[0] == 0 && v[1] < -1e17) {
        t->skipped_in_row = 0;
        return FG_OK;
    }
    char what[512];
    long long step = (long long)t->global_step + 1;
    if (v[0] > 0)
        snprintf(what, sizeof what, "step %lld: the loss is not finite%s", step,
                 world > 1 && !local_loss ? " (on another rank)" : "");
    else
        snprintf(what, sizeof what, "step %lld: the gradient of %s is not finite", step,
                 fg_module_param_name(t->model, (int64_t)-v[1]));
    /* before any update the learning rate plays no part yet */
    bool first = t->global_step == 0;
    if (t->o.on_nonfinite == FG_NONFINITE_STOP) {
        /* never "good": the newest save whose weights were all finite */
        char last[8400];
        bool newer_bad = t->last_saved[0] && strcmp(t->last_saved, t->last_finite);
        snprintf(last, sizeof last, "%s%.4095s%s%.4095s%s",
                 t->last_finite[0] ? "last checkpoint with finite weights: "
                                   : "no checkpoint with finite weights yet",
                 t->last_finite, newer_bad ? (t->last_finite[0] ? "; the newer " : "; ") : "",
                 newer_bad ? t->last_saved : "", newer_bad ? " holds non-finite weights" : "");
        if (first)
            return fg_error(FG_EINVAL,
                            "%s, before any update; stopped on every rank (%s): the data or the "
                            "initialisation gives it, not the learning rate: check the inputs "
                            "for NaN or inf and the model's initial weights",
                            what, last);
        return fg_error(FG_EINVAL,
                        "%s; stopped on every rank (%s); lower the learning rate, clip the "
                        "gradients (gradient_clip_val) or skip such steps (on_nonfinite skip)",
                        what, last);
    }
    snprintf(t->skip_reason, sizeof t->skip_reason, "%s", what);
    t->skipped++;
    if (++t->skipped_in_row >= 1000)
        return fg_error(FG_EINVAL,
                        first ? "%s; 1000 optimizer steps in a row skipped, before any update: "
                                "the data or the initialisation gives it, not the learning rate: "
                                "check the inputs for NaN or inf and the model's initial weights"
                              : "%s; 1000 optimizer steps in a row skipped: lower the learning "
                                "rate or clip the gradients (gradient_clip_val)",
                        what);
    fg_optimizer_zero_grad(t->opt);
    *skip = true;
    return FG_OK;
}

/* Under 16-mixed the loss scaler owns non-finite gradients (it skips the
 * step and lowers the scale): detect_anomaly checks the loss only. */
static bool check_grads_on(const fg_trainer *t) {
    return t->o.detect_anomaly && !fg_fabric_scaler(t->f);
}

/* The step through the fabric: the precision's loss scaler and the sharded
 * strategies (whose step is collective) take part. Hooks and clipping by
 * value see unscaled gradients, as Lightning's. */
static FG_MUST_USE fg_status optimizer_step(fg_trainer *t, int64_t batch_idx) {
    bool skip;
    FG_TRY(check_nonfinite(t, &skip));
    if (skip) return FG_OK;
    FG_TRY(fg_fabric_unscale_gradients(t->f));
    FG_TRY(fg__hook_all(t, FG__H_BEFORE_OPT_STEP));
    if (check_grads_on(t)) FG_TRY(check_grads(t, batch_idx, "before the optimizer step"));
    if (t->clip_val > 0) {
        if (t->o.gradient_clip_algorithm == FG_CLIP_VALUE)
            FG_TRY(clip_by_value(t->model, t->clip_val));
        else FG_TRY(fg_fabric_clip_gradients(t->f, t->clip_val, NULL));
    }
    FG_TRY(fg_fabric_optimizer_step(t->f, t->opt));
    t->global_step++;
    return FG_OK;
}

/* The checkpoint callbacks' save at the end of fit (save_on_fit_end), or at
 * a stop (every one of them). */
static FG_MUST_USE fg_status save_at_end(fg_trainer *t, bool forced) {
    for (int i = 0; i < t->ncbs; i++)
        if (t->cbs[i]->kind == FG__CB_CHECKPOINT)
            FG_TRY(fg__checkpoint_save_now(t->cbs[i], t, forced));
    return FG_OK;
}

/* What follows a batch (Lightning's on_advance_end): validation when due
 * (not twice for one batch), then the count of batches that stepped. */
static FG_MUST_USE fg_status advance_end(fg_trainer *t, bool stepped) {
    if (should_check_val(t) && t->val_done_at != t->total_batch_idx - 1) {
        t->val_done_at = t->total_batch_idx - 1;
        FG_TRY(fg__validation_run(t, false));
        t->stage = FG_STAGE_TRAIN;
    }
    if (stepped) t->batches_that_stepped++;
    t->pending_advance = false;
    return FG_OK;
}

/* Manual optimization: training_step does backward and the steps itself
 * (fg_trainer_manual_backward, fg_trainer_optimizer_step); it may return
 * NULL without an error (Lightning's None). A toggle left on is undone. */
static FG_MUST_USE fg_status manual_step(fg_trainer *t, fg_batch *b, int64_t k) {
    fg_batch on; /* Lightning's batch_to_device, as the automatic step's */
    FG_TRY(fg_fabric_batch_to_device(t->f, b, &on));
    fg__fx_save prev = fg__fx_set(t, FG__FX_TRAIN_STEP, "training_step");
    fg__cur_batch_size = b->size;
    t->in_manual_step = true;
    fg_clear_error();
    fg_tensor *loss = t->m.training_step(t->m.ud, t, &on, k);
    fg_status s = loss ? FG_OK : fg_last_status();
    t->in_manual_step = false;
    fg__fx_restore(t, prev);
    fg__cur_batch_size = b->size;
    if (s == FG_OK) {
        /* the step's own tensors outlive nothing: give the requires_grad back */
        fg_trainer_untoggle_optimizer(t, NULL);
    } else {
        fg_error_kept kept;
        fg_error_keep(&kept);
        fg_trainer_untoggle_optimizer(t, NULL);
        fg_error_restore(&kept);
        return fg_error_wrap(s, "training_step at epoch %lld, batch %lld",
                             (long long)t->current_epoch, (long long)k);
    }
    t->mid_window = false;
    return FG_OK;
}

/* A training stream of unknown length: whether every rank still has a
 * batch, agreed by all (one allreduce of a flag: 1 a batch, 0 the stream's
 * end, -1 a failure), so that all end the epoch after the same step, at the
 * first rank whose stream ends (DistributedSampler's drop_last rule: the
 * other ranks' further batches are not used). Collective. */
static FG_MUST_USE fg_status all_have_batch(fg_trainer *t, const fg_batch *b, bool *have) {
    fg_status own = b ? FG_OK : fg_dataloader_status(t->train);
    double v = b ? 1.0 : own != FG_OK ? -1.0 : 0.0;
    fg_comm *comm = fg_fabric_comm(t->f);
    if (comm && fg_fabric_world_size(t->f) > 1)
        FG_TRY(fg_comm_allreduce(comm, &v, &v, 1, FG_F64, FG_REDUCE_OP_MIN));
    if (own != FG_OK) return own;
    if (v < 0)
        return fg_error(FG_EPEER,
                        "the training loader of another rank failed at batch %lld of epoch %lld "
                        "(its rank's error tells why); stopped on every rank",
                        (long long)t->batch_idx, (long long)t->current_epoch);
    *have = v > 0;
    return FG_OK;
}

static FG_MUST_USE fg_status run_batch(fg_trainer *t) {
    int64_t k = t->batch_idx;
    fg_batch *b = fg_dataloader_next(t->train);
    if (t->train_len_unknown) {
        bool have = false;
        FG_TRY(all_have_batch(t, b, &have));
        if (!have) {
            t->stream_ended = true;
            return FG_OK;
        }
    }
    if (!b) {
        fg_status s = fg_dataloader_status(t->train);
        return s != FG_OK ? s
                          : fg_error(FG_EINTERNAL,
                                     "the training loader ended at batch %lld of "
                                     "%lld",
                                     (long long)k, (long long)t->num_training_batches);
    }
    bool window_start = k % t->accumulate == 0;
    if (window_start) {
        /* the state a checkpoint records while this window is open */
        t->snap_batch_idx = k;
        fg_dataloader_sample_position(t->train, NULL, &t->snap_samples);
        /* the batch just taken is the window's first: its start is before it */
        int64_t bs = fg_dataloader_opts(t->train)->batch;
        t->snap_samples -= (bs ? bs : 1) * (int64_t)fg_fabric_world_size(t->f);
        t->snap_total_batch_idx = t->total_batch_idx;
        t->snap_batches_that_stepped = t->batches_that_stepped;
        /* a window of one batch is never open at a checkpoint: nothing to keep */
        if (t->accumulate > 1) FG_TRY(fg__results_copy(&t->snap_res, &t->train_res));
        /* manual optimization: zeroing is the training_step's, as Lightning's */
        if (!t->manual) fg_optimizer_zero_grad(t->opt);
        /* manual optimization: global_step may stand still (or move by several)
         * over a batch, so the batch's index seeds it */
        uint64_t at = (uint64_t)(t->manual ? t->total_batch_idx : t->global_step);
        fg_module_seed_dropout(t->model, fg_rng_derive(fg_fabric_rank_seed(t->f), at));
        FG_TRY(set_lr(t));
    }
    fg__results_batch_start(&t->train_res);
    fg__cur_batch_size = b->size;
    FG_TRY(fg__batch_hook_all(t, FG__B_TRAIN_START, b, k));
    /* of unknown length: accumulate is 1 (setup_counts), so every batch steps */
    bool stepped = (k + 1) % t->accumulate == 0 || k + 1 == t->num_training_batches;
    fg_status s = FG_OK;
    if (t->manual) {
        /* every manual batch counts as one that stepped (Lightning's) */
        stepped = true;
        FG_TRY(manual_step(t, b, k));
    } else {
        fg_fabric_set_no_backward_sync(t->f, !stepped);
        step_ctx c = {.t = t, .batch_idx = k};
        fg__fx_save prev = fg__fx_set(t, FG__FX_TRAIN_STEP, "training_step");
        double batch_loss = 0;
        s = fg_fabric_training_step(t->f, b, micro_step, step_end, &c, &batch_loss);
        if (window_start) t->window_nonfinite = false;
        if (s == FG_OK && !isfinite(batch_loss)) t->window_nonfinite = true;
        fg__fx_restore(t, prev);
        fg__cur_batch_size = b->size;
        if (c.err != FG_OK) return fg_error(c.err, "%s", c.msg);
        if (s != FG_OK) return s;
        if (check_grads_on(t)) FG_TRY(check_grads(t, k, "after backward"));
        t->mid_window = !stepped;
        if (stepped) FG_TRY(optimizer_step(t, k));
        if (stepped) FG_TRY(fg__sched_after_step(t, k + 1 == t->num_training_batches));
    }
    t->batch_idx++;
    t->total_batch_idx++;
    t->pending_advance = true;
    FG_TRY(fg__batch_hook_all(t, FG__B_TRAIN_END, b, k));
    fg__metric_map row = {0};
    s = fg__results_batch_end(t, &t->train_res, &row);
    if (s == FG_OK && stepped && fg__should_update_logs(t))
        s = fg__loggers_log(t, &row, t->batches_that_stepped, true);
    fg__map_free(&row);
    fg_fabric_step_end(t->f);
    FG_TRY(s);
    FG_TRY(advance_end(t, stepped));
    FG_TRY(fg__sched_after_val(t, stepped));
    if (!stepped) return FG_OK;
    /* a stop asked on any rank: all agree here, after the same step, and save it */
    bool stop = false;
    FG_TRY(fg_fabric_should_stop(t->f, &stop));
    if (stop) {
        t->interrupted = true;
        return save_at_end(t, true);
    }
    if (t->max_steps != -1 && t->global_step >= t->max_steps) return save_at_end(t, false);
    return FG_OK;
}

/* ------------------------------------------------------------ one epoch */

static FG_MUST_USE fg_status epoch_end(fg_trainer *t) {
    t->in_epoch_end = true;
    t->stage = FG_STAGE_TRAIN;
    fg__metric_map row = {0};
    fg_status s = fg__results_epoch_compute(t, &t->train_res, &row);
    /* a ReduceLROnPlateau by epoch steps before the epoch-end hooks, so that
     * a checkpoint saved in any of them resumes bitwise */
    if (s == FG_OK) s = fg__sched_epoch_end(t);
    if (s == FG_OK) s = fg__callbacks_hook(t, FG__H_TRAIN_EPOCH_END, 1);
    if (s == FG_OK) s = fg__module_hook(t, FG__H_TRAIN_EPOCH_END);
    if (s == FG_OK) s = fg__results_epoch_compute(t, &t->train_res, &row);
    if (s == FG_OK) s = fg__callbacks_hook(t, FG__H_TRAIN_EPOCH_END, 2);
    if (s == FG_OK) s = fg__results_epoch_compute(t, &t->train_res, &row);
    /* the last epoch of the fit: the save at its end, inside the epoch end
     * (a resume goes on with the next epoch) */
    bool last = (t->max_epochs != -1 && t->current_epoch + 1 >= t->max_epochs) ||
                (t->max_steps != -1 && t->global_step >= t->max_steps) ||
                (t->should_stop && can_stop_early(t));
    if (s == FG_OK && last) s = save_at_end(t, false);
    /* the epoch row is logged at the step of the epoch's last batch */
    if (s == FG_OK) s = fg__loggers_log(t, &row, t->batches_that_stepped - 1, true);
    fg__map_free(&row);
    t->in_epoch_end = false;
    FG_TRY(s);
    t->current_epoch++;
    t->batch_idx = 0;
    return FG_OK;
}

/* A stream of unknown length has ended (all ranks agreed): what
 * Lightning does after a last batch it knows by prefetching: validation
 * when due at the epoch's end, and an epoch-interval scheduler's step. */
static FG_MUST_USE fg_status stream_end(fg_trainer *t) {
    if (!t->interrupted && t->enable_validation &&
        (t->check_val_every == -1 || (t->current_epoch + 1) % t->check_val_every == 0) &&
        t->val_done_at != t->total_batch_idx - 1 && t->batch_idx > 0) {
        t->val_done_at = t->total_batch_idx - 1;
        FG_TRY(fg__validation_run(t, false));
        t->stage = FG_STAGE_TRAIN;
    }
    if (t->batch_idx > 0 && !t->manual) FG_TRY(fg__sched_after_stream_end(t));
    return FG_OK;
}

static FG_MUST_USE fg_status run_epoch(fg_trainer *t) {
    t->stream_ended = false;
    if (!t->resumed_mid_epoch) {
        FG_TRY(fg_dataloader_set_epoch(t->train, t->current_epoch));
        t->batch_idx = 0;
        fg__results_reset(&t->train_res);
    }
    t->resumed_mid_epoch = false;
    t->stage = FG_STAGE_TRAIN;
    t->mid_window = false;
    FG_TRY(set_lr(t));
    FG_TRY(fg__hook_all(t, FG__H_TRAIN_EPOCH_START));
    if (t->pending_advance) FG_TRY(advance_end(t, t->pending_stepped));
    while (!epoch_done(t)) FG_TRY(run_batch(t));
    if (t->stream_ended && !t->interrupted && t->batch_idx < t->num_training_batches)
        FG_TRY(stream_end(t));
    /* a stop leaves the epoch open: its checkpoint resumes inside it */
    return t->interrupted ? FG_OK : epoch_end(t);
}

/* ------------------------------------------------------------------- fit */

static FG_MUST_USE fg_status setup_counts(fg_trainer *t) {
    FG_TRY(fg__loader_batches(t, t->train, t->limit_train, "limit_train_batches",
                              &t->num_training_batches));
    t->train_len_unknown = !fg_dataloader_len_known(t->train);
    if (t->train_len_unknown && t->accumulate > 1)
        return fg_error(FG_EINVAL,
                        "accumulate_grad_batches=%lld with a training stream of unknown length "
                        "(its fg_stream_ops.len gives none): the last window of an epoch is known "
                        "only once the stream has ended, after its backward ran without the "
                        "gradient sync; give the stream a len, or accumulate_grad_batches=1",
                        (long long)t->accumulate);
    t->num_val_batches = 0;
    for (int i = 0; i < t->nevals; i++) {
        FG_TRY(
            fg__eval_loader_batches(t, i, t->limit_val, "limit_val_batches", &t->eval_batches[i]));
        t->num_val_batches += t->eval_batches[i];
    }
    t->enable_validation = t->val && t->m.validation_step && t->num_val_batches > 0;
    if (t->train_len_unknown && t->val_check_interval.kind == FG_BATCHES_FRACTION &&
        t->val_check_interval.value != 1.0)
        return fg_error(FG_EINVAL,
                        "val_check_interval=FG_FRACTION(%g) with a training stream of unknown "
                        "length (its fg_stream_ops.len gives none): a fraction of an epoch is not "
                        "known; use FG_FRACTION(1) (validation at the stream's end) or FG_COUNT(n) "
                        "batches, or give the stream a len (Lightning refuses the same for an "
                        "IterableDataset)",
                        t->val_check_interval.value);
    if (t->val_check_interval.kind == FG_BATCHES_COUNT) {
        t->val_check_batch = (int64_t)t->val_check_interval.value;
        if (t->val_check_batch > t->num_training_batches && t->check_val_every != -1 &&
            t->enable_validation)
            return fg_error(FG_EINVAL,
                            "val_check_interval=FG_COUNT(%lld) must be at most the %lld training "
                            "batches of an epoch: lower it, turn validation off with "
                            "limit_val_batches=FG_COUNT(0), or set check_val_every_n_epoch=-1 to "
                            "count batches across epochs",
                            (long long)t->val_check_batch, (long long)t->num_training_batches);
    } else if (t->num_training_batches == FG__LEN_UNKNOWN) {
        t->val_check_batch = FG__LEN_UNKNOWN; /* at the stream's end (stream_end) */
    } else {
        t->val_check_batch =
            (int64_t)((double)t->num_training_batches * t->val_check_interval.value);
        if (t->val_check_batch < 1) t->val_check_batch = 1;
    }
    return FG_OK;
}

static FG_MUST_USE fg_status sanity_check(fg_trainer *t) {
    int64_t want = (int64_t)t->num_sanity.value;
    if (!t->enable_validation || want == 0 || t->resumed) return FG_OK;
    FG_TRY(fg__callbacks_hook(t, FG__H_SANITY_START, 0));
    FG_TRY(fg__validation_run(t, true));
    FG_TRY(fg__callbacks_hook(t, FG__H_SANITY_END, 0));
    /* what the sanity check logged is forgotten (Lightning's reset_metrics) */
    fg__results_reset(&t->eval_res);
    fg__metrics_reset(t);
    return FG_OK;
}

fg_status fg__fit_body(fg_trainer *t) {
    t->global_step = t->current_epoch = t->batch_idx = t->total_batch_idx = 0;
    t->batches_that_stepped = 0;
    t->val_done_at = -1;
    t->resumed = t->resumed_mid_epoch = t->pending_advance = false;
    t->val_runs = 0;
    t->interrupted = t->window_nonfinite = false;
    t->skipped = t->skipped_in_row = 0;
    t->skip_reason[0] = t->last_saved[0] = t->last_finite[0] = '\0';
    fg__results_reset(&t->train_res);
    FG_TRY(setup_counts(t));
    for (int i = 0; i < t->ncbs; i++)
        if (t->cbs[i]->kind == FG__CB_CHECKPOINT) FG_TRY(fg__checkpoint_resolve_dir(t->cbs[i], t));
    if (t->ckpt_path[0]) {
        FG_TRY(fg__load_checkpoint(t, true));
        if (fg__weights_finite(t))
            snprintf(t->last_finite, sizeof t->last_finite, "%s", t->ckpt_path);
        FG_TRY(setup_counts(t)); /* an elastic resume may change the accumulation */
    }
    FG_TRY(fg__hook_all(t, FG__H_FIT_START));
    FG_TRY(fg__loggers_hparams(t));
    FG_TRY(sanity_check(t));
    if (t->num_training_batches > 0) {
        t->stage = FG_STAGE_TRAIN;
        FG_TRY(fg__hook_all(t, FG__H_TRAIN_START));
        while (!fit_done(t)) FG_TRY(run_epoch(t));
        if (t->interrupted) { /* Lightning's interrupt: no end hooks */
            t->stage = FG_STAGE_NONE;
            return fg__loggers_finalize(t, "failed");
        }
        t->stage = FG_STAGE_TRAIN;
        FG_TRY(fg__hook_all(t, FG__H_TRAIN_END));
    }
    t->stage = FG_STAGE_NONE;
    FG_TRY(fg__loggers_finalize(t, "success"));
    return fg__hook_all(t, FG__H_FIT_END);
}
