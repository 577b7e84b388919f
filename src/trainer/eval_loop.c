/* The evaluation loops (Lightning's _EvaluationLoop and _PredictionLoop):
 * validation inside fit and its sanity check, fg_trainer_validate, _test
 * and _predict. Each runs its step over at most its limit of batches with
 * gradients off and the model in eval mode (restored after), on the whole
 * batch (dp does not split evaluation), then reduces the epoch values
 * (over ranks for sync_dist) into the callback metrics before the epoch-end
 * hooks, and sends the loggers their rows (never in a sanity check). */
#include <string.h>

#include "trainer_impl.h"

typedef struct eval_kind {
    fg_stage stage;
    const char *step_name, *step_end_name;
    fg__hook start, end, epoch_start, epoch_end;
    fg__batch_hook batch_end;
} eval_kind;

static const eval_kind k_val = {FG_STAGE_VALIDATE,   "validation_step", "validation_step_end",
                                FG__H_VAL_START,     FG__H_VAL_END,     FG__H_VAL_EPOCH_START,
                                FG__H_VAL_EPOCH_END, FG__B_VAL_END};
static const eval_kind k_test = {FG_STAGE_TEST,        "test_step",    "test_step_end",
                                 FG__H_TEST_START,     FG__H_TEST_END, FG__H_TEST_EPOCH_START,
                                 FG__H_TEST_EPOCH_END, FG__B_TEST_END};
static const eval_kind k_predict = {FG_STAGE_PREDICT,    "predict_step",    "predict_step_end",
                                    FG__H_PREDICT_START, FG__H_PREDICT_END, FG__H_COUNT,
                                    FG__H_COUNT,         FG__B_PREDICT_END};

static FG_MUST_USE fg_status call_step(fg_trainer *t, fg_batch_hook_fn fn, const char *name,
                                       fg__fx_kind fx, fg_batch *b, int64_t i) {
    if (!fn) return FG_OK;
    fg__fx_save prev = fg__fx_set(t, fx, name);
    fg_status s = fn(t->m.ud, t, b, i);
    fg__fx_restore(t, prev);
    if (s != FG_OK) return fg_error_wrap(s, "%s (batch %lld)", name, (long long)i);
    return FG_OK;
}

/* One run over the evaluation loaders, counts[i] batches of loader i (in
 * turn, Lightning's dataloader_idx), the epoch hooks once around them. */
static FG_MUST_USE fg_status run(fg_trainer *t, const eval_kind *k, const int64_t *counts,
                                 bool sanity) {
    bool predict = k->stage == FG_STAGE_PREDICT;
    fg_batch_hook_fn step = k->stage == FG_STAGE_VALIDATE ? t->m.validation_step
                            : k->stage == FG_STAGE_TEST   ? t->m.test_step
                                                          : t->m.predict_step;
    fg_batch_hook_fn step_end = k->stage == FG_STAGE_VALIDATE ? t->m.validation_step_end
                                : k->stage == FG_STAGE_TEST   ? t->m.test_step_end
                                                              : t->m.predict_step_end;
    fg__fx_kind fx = predict ? FG__FX_NONE : FG__FX_EVAL_STEP;
    t->stage = sanity ? FG_STAGE_SANITY_CHECK : k->stage;
    fg__results_reset(&t->eval_res);
    bool was_training = fg_module_is_training(t->model);
    bool grad = fg_set_grad_enabled(false);
    fg_module_train(t->model, false);
    fg_status s = fg__callbacks_hook(t, k->start, 0);
    if (s == FG_OK && k->epoch_start != FG__H_COUNT) s = fg__hook_all(t, k->epoch_start);
    for (int d = 0; d < t->nevals && s == FG_OK; d++) {
        fg_dataloader *dl = t->evals[d];
        int64_t n = counts[d];
        t->dl_idx = d;
        s = fg_dataloader_set_epoch(dl, 0);
        for (int64_t i = 0; i < n && s == FG_OK; i++) {
            fg_batch *b = fg_dataloader_next(dl);
            if (!b) {
                s = fg_dataloader_status(dl);
                break; /* shorter than its length said: nothing left */
            }
            fg__cur_batch_size = b->size;
            fg__results_batch_start(&t->eval_res);
            fg_batch on; /* the batch on the model's device (itself on the CPU) */
            s = fg_fabric_batch_to_device(t->f, b, &on);
            if (s == FG_OK) s = call_step(t, step, k->step_name, fx, &on, i);
            if (s == FG_OK) s = call_step(t, step_end, k->step_end_name, fx, &on, i);
            if (s == FG_OK) s = fg__batch_hook_all(t, k->batch_end, b, i);
            fg__metric_map row = {0};
            if (s == FG_OK && !predict) s = fg__results_batch_end(t, &t->eval_res, &row);
            if (s == FG_OK && !sanity && !predict)
                s = fg__loggers_log(t, &row, t->eval_step_counter, false);
            fg__map_free(&row);
            if (!sanity && !predict) t->eval_step_counter++;
            fg_step_reset();
        }
    }
    t->dl_idx = 0;
    fg__metric_map row = {0};
    if (s == FG_OK && !predict) s = fg__results_epoch_compute(t, &t->eval_res, &row);
    if (s == FG_OK && k->epoch_end != FG__H_COUNT) s = fg__hook_all(t, k->epoch_end);
    if (s == FG_OK && !predict) s = fg__results_epoch_compute(t, &t->eval_res, &row);
    if (s == FG_OK && !sanity && !predict)
        s = fg__loggers_log(t, &row, t->batches_that_stepped, true);
    fg__map_free(&row);
    if (s == FG_OK && !sanity && k->stage == FG_STAGE_VALIDATE) t->val_runs++;
    if (s == FG_OK) s = fg__callbacks_hook(t, k->end, 0);
    fg_module_train(t->model, was_training);
    fg_set_grad_enabled(grad);
    return s;
}

fg_status fg__eval_loader_batches(fg_trainer *t, int d, fg_batches lim, const char *what,
                                  int64_t *out) {
    if (!fg_dataloader_len_known(t->evals[d]))
        return fg_error(FG_EUNSUPPORTED,
                        "%s: evaluation loader %d is over a stream of unknown length (its "
                        "fg_stream_ops.len gives none): only the training loader may be; give "
                        "that stream a len",
                        what, d);
    return fg__loader_batches(t, t->evals[d], lim, what, out);
}

fg_status fg__validation_run(fg_trainer *t, bool sanity) {
    int64_t counts[FG_MAX_EVAL_LOADERS];
    for (int d = 0; d < t->nevals; d++) {
        counts[d] = t->eval_batches[d];
        int64_t want = (int64_t)t->num_sanity.value;
        if (sanity && want >= 0 && want < counts[d]) counts[d] = want;
    }
    fg_stage prev = t->stage;
    fg_status s = run(t, &k_val, counts, sanity);
    t->stage = prev;
    return s;
}

fg_status fg__eval_body(fg_trainer *t, fg_trainer_fn fn) {
    const eval_kind *k = fn == FG_VALIDATE ? &k_val : fn == FG_TEST ? &k_test : &k_predict;
    fg_batches lim = fn == FG_VALIDATE ? t->limit_val
                     : fn == FG_TEST   ? t->limit_test
                                       : t->limit_predict;
    const char *what = fn == FG_VALIDATE ? "limit_val_batches"
                       : fn == FG_TEST   ? "limit_test_batches"
                                         : "limit_predict_batches";
    fg_status s = FG_OK;
    int64_t counts[FG_MAX_EVAL_LOADERS], total = 0;
    for (int d = 0; d < t->nevals; d++) {
        FG_TRY(fg__eval_loader_batches(t, d, lim, what, &counts[d]));
        total += counts[d];
    }
    if (fn == FG_VALIDATE) t->num_val_batches = total;
    fg__results_reset(&t->eval_res);
    s = total > 0 ? run(t, k, counts, false) : FG_OK;
    t->stage = FG_STAGE_NONE;
    if (s == FG_OK && fn != FG_PREDICT) s = fg__loggers_finalize(t, "success");
    return s;
}
