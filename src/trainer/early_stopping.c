/* EarlyStopping, as Lightning's: after each validation (or training epoch,
 * when validation runs once per epoch at its end or not at all) it reads
 * the monitored callback metric and, in this order: stops on a non-finite
 * value (check_finite), on reaching stopping_threshold, on crossing
 * divergence_threshold; resets its wait count on an improvement by more
 * than min_delta; else counts a check without one and stops at patience.
 * Any rank deciding to stop stops them all. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "trainer_impl.h"

typedef struct es_cb {
    char *monitor;
    double min_delta; /* signed as Lightning: negative for mode min */
    int64_t patience;
    fg_monitor_mode mode;
    bool check_finite;
    bool has_stop, has_div;
    double stopping_threshold, divergence_threshold;
    fg_flag check_on_train_epoch_end;
    int64_t wait_count, stopped_epoch;
    double best_score;
} es_cb;

static es_cb *of(const fg_callback *cb) {
    return cb && cb->kind == FG__CB_EARLY_STOPPING ? cb->ud : NULL;
}

static bool monitor_op(const es_cb *c, double a, double b) {
    return c->mode == FG_MONITOR_MIN ? a < b : a > b;
}

static bool on_epoch_end_check(const es_cb *c, const fg_trainer *t) {
    if (c->check_on_train_epoch_end != FG_FLAG_DEFAULT) return c->check_on_train_epoch_end == FG_ON;
    return t->val_check_interval.value == 1.0 && t->check_val_every == 1;
}

static bool skip(const fg_trainer *t) {
    return t->fn != FG_FIT || t->stage == FG_STAGE_SANITY_CHECK || t->fast_dev_run;
}

static FG_MUST_USE fg_status run_check(es_cb *c, fg_trainer *t) {
    double current;
    if (!fg_trainer_callback_metric(t, c->monitor, &current)) {
        char names[1024];
        fg__callback_metric_names(t, names, sizeof names);
        return fg_error(FG_EINVAL,
                        "EarlyStopping is conditioned on metric \"%s\", which is not available: "
                        "monitor one of [%s], or log it",
                        c->monitor, names);
    }
    bool stop = false;
    if (c->check_finite && !isfinite(current)) stop = true;
    else if (c->has_stop && monitor_op(c, current, c->stopping_threshold)) stop = true;
    else if (c->has_div && monitor_op(c, -current, -c->divergence_threshold)) stop = true;
    else if (monitor_op(c, current - c->min_delta, c->best_score)) {
        c->best_score = current;
        c->wait_count = 0;
    } else if (++c->wait_count >= c->patience) {
        stop = true;
    }
    /* any rank stopping stops every rank */
    double any = 0;
    fg_status s =
        fg_fabric_reduce_scalar(fg_trainer_fabric(t), stop ? 1 : 0, FG_REDUCE_OP_MAX, &any);
    if (s != FG_OK) return fg_error_wrap(s, "EarlyStopping(monitor=%s)", c->monitor);
    stop = any == 1;
    if (stop) {
        fg_trainer_set_should_stop(t, true);
        c->stopped_epoch = t->current_epoch;
    }
    return FG_OK;
}

static FG_MUST_USE fg_status on_train_epoch_end(void *ud, fg_trainer *t) {
    es_cb *c = ud;
    if (!on_epoch_end_check(c, t) || skip(t)) return FG_OK;
    return run_check(c, t);
}

static FG_MUST_USE fg_status on_validation_end(void *ud, fg_trainer *t) {
    es_cb *c = ud;
    if (on_epoch_end_check(c, t) || skip(t)) return FG_OK;
    return run_check(c, t);
}

static FG_MUST_USE fg_status state_dict(void *ud, fg_trainer *t, fg_state_dict *sd) {
    (void)t;
    es_cb *c = ud;
    fg_status s = fg_state_dict_set_i64(sd, "wait_count", c->wait_count);
    if (s == FG_OK) s = fg_state_dict_set_i64(sd, "stopped_epoch", c->stopped_epoch);
    if (s == FG_OK) s = fg_state_dict_set_f64(sd, "best_score", c->best_score);
    if (s == FG_OK) s = fg_state_dict_set_i64(sd, "patience", c->patience);
    return s;
}

static FG_MUST_USE fg_status load_state_dict(void *ud, fg_trainer *t, const fg_state_dict *sd) {
    (void)t;
    es_cb *c = ud;
    fg_state_dict_get_i64(sd, "wait_count", &c->wait_count);
    fg_state_dict_get_i64(sd, "stopped_epoch", &c->stopped_epoch);
    fg_state_dict_get_f64(sd, "best_score", &c->best_score);
    fg_state_dict_get_i64(sd, "patience", &c->patience);
    return FG_OK;
}

static void es_free(void *ud) {
    es_cb *c = ud;
    fg_free(c->monitor);
    fg_free(c);
}

fg_callback *fg_early_stopping_new(const fg_early_stopping_opts *opts) {
    if (!opts || !opts->monitor || !opts->monitor[0]) {
        fg_error(FG_EINVAL, "EarlyStopping: monitor is required (the callback metric to watch, "
                            "e.g. \"val_loss\")");
        return NULL;
    }
    const fg_early_stopping_opts *o = opts;
    if (!(o->min_delta >= 0) || o->patience < 0 ||
        (o->mode != FG_MONITOR_MIN && o->mode != FG_MONITOR_MAX) ||
        (o->stopping_threshold && isnan(*o->stopping_threshold)) ||
        (o->divergence_threshold && isnan(*o->divergence_threshold))) {
        fg_error(
            FG_EINVAL,
            "EarlyStopping(monitor=\"%s\"): min_delta=%g patience=%lld mode=%d: expected "
            "min_delta >= 0, patience >= 0 (0 = 3), FG_MONITOR_MIN or FG_MONITOR_MAX, thresholds "
            "that are numbers",
            o->monitor, o->min_delta, (long long)o->patience, (int)o->mode);
        return NULL;
    }
    es_cb *c = fg_calloc(1, sizeof *c);
    if (!c) return NULL;
    if (!(c->monitor = fg_strdup(o->monitor))) {
        fg_free(c);
        return NULL;
    }
    c->mode = o->mode;
    c->min_delta = c->mode == FG_MONITOR_MAX ? o->min_delta : -o->min_delta;
    c->patience = o->patience ? o->patience : 3;
    c->check_finite = o->check_finite != FG_OFF;
    c->has_stop = o->stopping_threshold != NULL;
    c->has_div = o->divergence_threshold != NULL;
    if (c->has_stop) c->stopping_threshold = *o->stopping_threshold;
    if (c->has_div) c->divergence_threshold = *o->divergence_threshold;
    c->check_on_train_epoch_end = o->check_on_train_epoch_end;
    c->best_score = c->mode == FG_MONITOR_MIN ? INFINITY : -INFINITY;
    char key[512];
    snprintf(key, sizeof key, "EarlyStopping{'monitor': '%s', 'mode': '%s'}", c->monitor,
             c->mode == FG_MONITOR_MIN ? "min" : "max");
    fg_callback_ops ops = {.name = "EarlyStopping",
                           .on_train_epoch_end = on_train_epoch_end,
                           .on_validation_end = on_validation_end,
                           .state_dict = state_dict,
                           .load_state_dict = load_state_dict,
                           .free = es_free};
    return fg__callback_make(&ops, c, FG__CB_EARLY_STOPPING, key);
}

int64_t fg_early_stopping_wait_count(const fg_callback *cb) {
    const es_cb *c = of(cb);
    return c ? c->wait_count : 0;
}
int64_t fg_early_stopping_stopped_epoch(const fg_callback *cb) {
    const es_cb *c = of(cb);
    return c ? c->stopped_epoch : 0;
}
double fg_early_stopping_best_score(const fg_callback *cb) {
    const es_cb *c = of(cb);
    return c ? c->best_score : NAN;
}
