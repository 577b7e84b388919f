/* Calling hooks: every hook is a field of the callback table and (for
 * most) of the module table, found through the offset tables below, so
 * that each call site names the hook once. A hook runs with the logging
 * context of its kind (which fg_trainer_log's defaults and rules read),
 * callbacks first and the module after, as Lightning; an error is passed up
 * prefixed with who failed in which hook. */
#include <stddef.h>
#include <string.h>

#include "trainer_impl.h"

#define NO_FIELD ((size_t)-1)
#define CB(f) offsetof(fg_callback_ops, f)
#define MOD(f) offsetof(fg_lightning_module, f)

static const struct {
    const char *name;
    fg__fx_kind fx;
    size_t cb, mod;
} hooks[FG__H_COUNT] = {
    [FG__H_FIT_START] = {"on_fit_start", FG__FX_NONE, CB(on_fit_start), MOD(on_fit_start)},
    [FG__H_FIT_END] = {"on_fit_end", FG__FX_NONE, CB(on_fit_end), MOD(on_fit_end)},
    [FG__H_SANITY_START] = {"on_sanity_check_start", FG__FX_NONE, CB(on_sanity_check_start),
                            NO_FIELD},
    [FG__H_SANITY_END] = {"on_sanity_check_end", FG__FX_NONE, CB(on_sanity_check_end), NO_FIELD},
    [FG__H_TRAIN_START] = {"on_train_start", FG__FX_TRAIN_EPOCH, CB(on_train_start),
                           MOD(on_train_start)},
    [FG__H_TRAIN_END] = {"on_train_end", FG__FX_NONE, CB(on_train_end), MOD(on_train_end)},
    [FG__H_TRAIN_EPOCH_START] = {"on_train_epoch_start", FG__FX_TRAIN_EPOCH,
                                 CB(on_train_epoch_start), MOD(on_train_epoch_start)},
    [FG__H_TRAIN_EPOCH_END] = {"on_train_epoch_end", FG__FX_TRAIN_EPOCH, CB(on_train_epoch_end),
                               MOD(on_train_epoch_end)},
    [FG__H_VAL_START] = {"on_validation_start", FG__FX_EVAL_EPOCH, CB(on_validation_start),
                         NO_FIELD},
    [FG__H_VAL_END] = {"on_validation_end", FG__FX_NONE, CB(on_validation_end), NO_FIELD},
    [FG__H_VAL_EPOCH_START] = {"on_validation_epoch_start", FG__FX_EVAL_EPOCH,
                               CB(on_validation_epoch_start), MOD(on_validation_epoch_start)},
    [FG__H_VAL_EPOCH_END] = {"on_validation_epoch_end", FG__FX_EVAL_EPOCH,
                             CB(on_validation_epoch_end), MOD(on_validation_epoch_end)},
    [FG__H_TEST_START] = {"on_test_start", FG__FX_EVAL_EPOCH, CB(on_test_start), NO_FIELD},
    [FG__H_TEST_END] = {"on_test_end", FG__FX_NONE, CB(on_test_end), NO_FIELD},
    [FG__H_TEST_EPOCH_START] = {"on_test_epoch_start", FG__FX_EVAL_EPOCH, CB(on_test_epoch_start),
                                MOD(on_test_epoch_start)},
    [FG__H_TEST_EPOCH_END] = {"on_test_epoch_end", FG__FX_EVAL_EPOCH, CB(on_test_epoch_end),
                              MOD(on_test_epoch_end)},
    [FG__H_PREDICT_START] = {"on_predict_start", FG__FX_NONE, CB(on_predict_start), NO_FIELD},
    [FG__H_PREDICT_END] = {"on_predict_end", FG__FX_NONE, CB(on_predict_end), NO_FIELD},
    [FG__H_BEFORE_OPT_STEP] = {"on_before_optimizer_step", FG__FX_TRAIN_STEP,
                               CB(on_before_optimizer_step), MOD(on_before_optimizer_step)},
};

static const struct {
    const char *name;
    fg__fx_kind fx;
    size_t cb, mod;
} batch_hooks[] = {
    [FG__B_TRAIN_START] = {"on_train_batch_start", FG__FX_TRAIN_STEP, CB(on_train_batch_start),
                           MOD(on_train_batch_start)},
    [FG__B_TRAIN_END] = {"on_train_batch_end", FG__FX_TRAIN_STEP, CB(on_train_batch_end),
                         MOD(on_train_batch_end)},
    [FG__B_VAL_END] = {"on_validation_batch_end", FG__FX_EVAL_STEP, CB(on_validation_batch_end),
                       NO_FIELD},
    [FG__B_TEST_END] = {"on_test_batch_end", FG__FX_EVAL_STEP, CB(on_test_batch_end), NO_FIELD},
    [FG__B_PREDICT_END] = {"on_predict_batch_end", FG__FX_NONE, CB(on_predict_batch_end), NO_FIELD},
};

fg__fx_save fg__fx_set(fg_trainer *t, fg__fx_kind fx, const char *hook) {
    fg__fx_save prev = {t->fx, t->hook};
    t->fx = fx;
    t->hook = hook;
    return prev;
}

void fg__fx_restore(fg_trainer *t, fg__fx_save s) {
    t->fx = s.fx;
    t->hook = s.hook;
}

bool fg__is_monitoring(const fg_callback *cb) {
    return cb->kind == FG__CB_CHECKPOINT || cb->kind == FG__CB_EARLY_STOPPING;
}

static FG_MUST_USE fg_status call_cb(fg_trainer *t, fg_callback *cb, fg__hook h) {
    fg_hook_fn fn = *(const fg_hook_fn *)((const char *)&cb->ops + hooks[h].cb);
    if (!fn) return FG_OK;
    fg__fx_save prev = fg__fx_set(t, hooks[h].fx, hooks[h].name);
    fg_status s = fn(cb->ud, t);
    fg__fx_restore(t, prev);
    if (s != FG_OK) return fg_error_wrap(s, "%s: %s", cb->state_key, hooks[h].name);
    return FG_OK;
}

fg_status fg__callbacks_hook(fg_trainer *t, fg__hook h, int monitoring) {
    for (int i = 0; i < t->ncbs; i++) {
        fg_callback *cb = t->cbs[i];
        if ((monitoring == 1 && fg__is_monitoring(cb)) ||
            (monitoring == 2 && !fg__is_monitoring(cb)))
            continue;
        FG_TRY(call_cb(t, cb, h));
    }
    return FG_OK;
}

fg_status fg__module_hook(fg_trainer *t, fg__hook h) {
    if (hooks[h].mod == NO_FIELD) return FG_OK;
    fg_hook_fn fn = *(const fg_hook_fn *)((const char *)&t->m + hooks[h].mod);
    if (!fn) return FG_OK;
    fg__fx_save prev = fg__fx_set(t, hooks[h].fx, hooks[h].name);
    fg_status s = fn(t->m.ud, t);
    fg__fx_restore(t, prev);
    if (s != FG_OK) return fg_error_wrap(s, "module %s", hooks[h].name);
    return FG_OK;
}

fg_status fg__hook_all(fg_trainer *t, fg__hook h) {
    FG_TRY(fg__callbacks_hook(t, h, 0));
    return fg__module_hook(t, h);
}

fg_status fg__batch_hook_all(fg_trainer *t, fg__batch_hook h, fg_batch *b, int64_t idx) {
    fg__fx_save prev = fg__fx_set(t, batch_hooks[h].fx, batch_hooks[h].name);
    fg_status s = FG_OK;
    for (int i = 0; i < t->ncbs && s == FG_OK; i++) {
        fg_callback *cb = t->cbs[i];
        fg_batch_hook_fn fn =
            *(const fg_batch_hook_fn *)((const char *)&cb->ops + batch_hooks[h].cb);
        if (fn && (s = fn(cb->ud, t, b, idx)) != FG_OK)
            s = fg_error_wrap(s, "%s: %s", cb->state_key, batch_hooks[h].name);
    }
    if (s == FG_OK && batch_hooks[h].mod != NO_FIELD) {
        fg_batch_hook_fn fn = *(const fg_batch_hook_fn *)((const char *)&t->m + batch_hooks[h].mod);
        if (fn && (s = fn(t->m.ud, t, b, idx)) != FG_OK)
            s = fg_error_wrap(s, "module %s", batch_hooks[h].name);
    }
    fg__fx_restore(t, prev);
    return s;
}

/* The names results are keyed by, for restoring them from a checkpoint:
 * every hook a value may be logged from. */
const char *fg__intern_hook(const char *name) {
    static const char *const steps[] = {"training_step",   "training_step_end",
                                        "validation_step", "validation_step_end",
                                        "test_step",       "test_step_end"};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++)
        if (!strcmp(steps[i], name)) return steps[i];
    for (int h = 0; h < FG__H_COUNT; h++)
        if (hooks[h].name && !strcmp(hooks[h].name, name)) return hooks[h].name;
    for (size_t h = 0; h < sizeof batch_hooks / sizeof batch_hooks[0]; h++)
        if (!strcmp(batch_hooks[h].name, name)) return batch_hooks[h].name;
    return NULL;
}
