/* Timer, as Lightning's: the time spent in each stage (train, validate,
 * test, predict), from its start hook to its end hook, plus what a
 * checkpoint says earlier runs spent; with a duration it stops the fit once
 * the training time reaches it, checked after every batch (interval step)
 * or epoch (interval epoch), rank 0's clock deciding for every rank. */
#include <math.h>
#include <string.h>

#include "trainer_impl.h"

#define NSTAGES 4 /* train, validate, test, predict */

typedef struct timer_cb {
    double duration;
    fg_logging_interval interval;
    double start[NSTAGES], end[NSTAGES], offset[NSTAGES];
} timer_cb;

static const char *const k_names[NSTAGES] = {"train", "validate", "test", "predict"};

static int slot(fg_stage s) {
    switch (s) {
    case FG_STAGE_TRAIN: return 0;
    case FG_STAGE_VALIDATE: return 1;
    case FG_STAGE_TEST: return 2;
    case FG_STAGE_PREDICT: return 3;
    default: return -1;
    }
}

static timer_cb *of(const fg_callback *cb) {
    return cb && cb->kind == FG__CB_TIMER ? cb->ud : NULL;
}

static double elapsed(const timer_cb *c, int i) {
    if (c->start[i] == 0) return c->offset[i];
    double end = c->end[i] != 0 ? c->end[i] : fg_time();
    return c->offset[i] + end - c->start[i];
}

static void begin(timer_cb *c, int i) {
    c->start[i] = fg_time();
    c->end[i] = 0;
}

static void finish(timer_cb *c, int i) {
    if (c->start[i] == 0) return;
    c->offset[i] = elapsed(c, i);
    c->start[i] = c->end[i] = 0;
}

static FG_MUST_USE fg_status check(timer_cb *c, fg_trainer *t) {
    if (c->duration <= 0) return FG_OK;
    uint8_t stop = elapsed(c, 0) >= c->duration;
    FG_TRY(fg_fabric_broadcast_bytes(fg_trainer_fabric(t), &stop, 1, 0));
    if (stop) fg_trainer_set_should_stop(t, true);
    return FG_OK;
}

static FG_MUST_USE fg_status on_train_start(void *ud, fg_trainer *t) {
    (void)t;
    begin(ud, 0);
    return FG_OK;
}
static FG_MUST_USE fg_status on_train_end(void *ud, fg_trainer *t) {
    (void)t;
    finish(ud, 0);
    return FG_OK;
}
#define STAGE_HOOKS(name, i)                                                                       \
    static fg_status on_##name##_start(void *ud, fg_trainer *t) {                                  \
        (void)t;                                                                                   \
        begin(ud, i);                                                                              \
        return FG_OK;                                                                              \
    }                                                                                              \
    static fg_status on_##name##_end(void *ud, fg_trainer *t) {                                    \
        (void)t;                                                                                   \
        finish(ud, i);                                                                             \
        return FG_OK;                                                                              \
    }
STAGE_HOOKS(validation, 1)
STAGE_HOOKS(test, 2)
STAGE_HOOKS(predict, 3)

static FG_MUST_USE fg_status on_train_batch_end(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)b;
    (void)i;
    timer_cb *c = ud;
    return c->interval != FG_LOGGING_EPOCH ? check(c, t) : FG_OK;
}

static FG_MUST_USE fg_status on_train_epoch_end(void *ud, fg_trainer *t) {
    timer_cb *c = ud;
    return c->interval == FG_LOGGING_EPOCH ? check(c, t) : FG_OK;
}

static FG_MUST_USE fg_status state_dict(void *ud, fg_trainer *t, fg_state_dict *sd) {
    (void)t;
    timer_cb *c = ud;
    for (int i = 0; i < NSTAGES; i++) {
        char key[64];
        snprintf(key, sizeof key, "time_elapsed.%s", k_names[i]);
        FG_TRY(fg_state_dict_set_f64(sd, key, elapsed(c, i)));
    }
    return FG_OK;
}

static FG_MUST_USE fg_status load_state_dict(void *ud, fg_trainer *t, const fg_state_dict *sd) {
    (void)t;
    timer_cb *c = ud;
    for (int i = 0; i < NSTAGES; i++) {
        char key[64];
        snprintf(key, sizeof key, "time_elapsed.%s", k_names[i]);
        fg_state_dict_get_f64(sd, key, &c->offset[i]);
    }
    return FG_OK;
}

static void timer_free(void *ud) { fg_free(ud); }

fg_callback *fg_timer_new(const fg_timer_opts *opts) {
    fg_timer_opts o = opts ? *opts : (fg_timer_opts){0};
    if (!(o.duration >= 0) || !isfinite(o.duration) ||
        (o.interval < FG_LOGGING_AUTO || o.interval > FG_LOGGING_EPOCH)) {
        fg_error(FG_EINVAL,
                 "Timer: duration=%g interval=%d: expected seconds >= 0 and "
                 "FG_LOGGING_STEP (0 is step too) or FG_LOGGING_EPOCH",
                 o.duration, (int)o.interval);
        return NULL;
    }
    timer_cb *c = fg_calloc(1, sizeof *c);
    if (!c) return NULL;
    c->duration = o.duration;
    c->interval = o.interval;
    fg_callback_ops ops = {.name = "Timer",
                           .on_train_start = on_train_start,
                           .on_train_end = on_train_end,
                           .on_validation_start = on_validation_start,
                           .on_validation_end = on_validation_end,
                           .on_test_start = on_test_start,
                           .on_test_end = on_test_end,
                           .on_predict_start = on_predict_start,
                           .on_predict_end = on_predict_end,
                           .on_train_batch_end = on_train_batch_end,
                           .on_train_epoch_end = on_train_epoch_end,
                           .state_dict = state_dict,
                           .load_state_dict = load_state_dict,
                           .free = timer_free};
    return fg__callback_make(&ops, c, FG__CB_TIMER, "Timer");
}

double fg_timer_time_elapsed(const fg_callback *cb, fg_stage stage) {
    const timer_cb *c = of(cb);
    int i = slot(stage);
    return c && i >= 0 ? elapsed(c, i) : 0;
}

double fg_timer_time_remaining(const fg_callback *cb) {
    const timer_cb *c = of(cb);
    if (!c || c->duration <= 0) return INFINITY;
    return c->duration - elapsed(c, 0);
}
