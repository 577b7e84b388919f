/* LearningRateMonitor, as Lightning's: the optimizer's learning rate as
 * "lr-<optimizer name>" ("lr-<name>/pg<k>" per group with several), sent straight to the loggers
 * (it is not a callback metric) at the step the trainer's rows use. Per step (at the start of a
 * batch that begins an optimizer step, when the logs are due) for a
 * per-step schedule or interval step, else once at the start of each
 * epoch. */
#include <stdio.h>

#include "trainer_impl.h"

typedef struct lrm_cb {
    fg_logging_interval interval;
} lrm_cb;

static bool per_step(const lrm_cb *c, const fg_trainer *t) {
    if (c->interval != FG_LOGGING_AUTO) return c->interval == FG_LOGGING_STEP;
    return t->oc.interval == FG_INTERVAL_STEP && (t->oc.schedule || t->oc.lr_at || t->oc.scheduler);
}

static FG_MUST_USE fg_status log_lr(fg_trainer *t) {
    char name[96];
    fg__metric_map row = {0};
    fg_status s = FG_OK;
    int ng = fg_optimizer_num_groups(t->opt);
    for (int g = 0; g < ng && s == FG_OK; g++) { /* several groups: "/pg1", "/pg2"... */
        if (ng == 1) snprintf(name, sizeof name, "lr-%s", fg_optimizer_name(t->opt));
        else snprintf(name, sizeof name, "lr-%s/pg%d", fg_optimizer_name(t->opt), g + 1);
        s = fg__map_set(&row, name, fg_optimizer_group_lr(t->opt, g));
    }
    if (s == FG_OK) s = fg__loggers_log(t, &row, t->batches_that_stepped, false);
    fg__map_free(&row);
    return s;
}

static FG_MUST_USE fg_status on_train_start(void *ud, fg_trainer *t) {
    (void)ud;
    if (t->nloggers == 0)
        return fg_error(FG_EINVAL, "LearningRateMonitor needs a logger, and the trainer has none "
                                   "(logger=FG_OFF): give it one, or drop the callback");
    return FG_OK;
}

static FG_MUST_USE fg_status on_train_batch_start(void *ud, fg_trainer *t, fg_batch *b,
                                                  int64_t idx) {
    (void)b;
    lrm_cb *c = ud;
    if (!per_step(c, t) || idx % t->accumulate != 0 || !fg__should_update_logs(t)) return FG_OK;
    return log_lr(t);
}

static FG_MUST_USE fg_status on_train_epoch_start(void *ud, fg_trainer *t) {
    lrm_cb *c = ud;
    return per_step(c, t) ? FG_OK : log_lr(t);
}

static void lrm_free(void *ud) { fg_free(ud); }

fg_callback *fg_lr_monitor_new(const fg_lr_monitor_opts *opts) {
    fg_lr_monitor_opts o = opts ? *opts : (fg_lr_monitor_opts){0};
    if (o.logging_interval < FG_LOGGING_AUTO || o.logging_interval > FG_LOGGING_EPOCH) {
        fg_error(FG_EINVAL,
                 "LearningRateMonitor: logging_interval=%d: expected FG_LOGGING_AUTO (0), "
                 "FG_LOGGING_STEP or FG_LOGGING_EPOCH",
                 (int)o.logging_interval);
        return NULL;
    }
    lrm_cb *c = fg_calloc(1, sizeof *c);
    if (!c) return NULL;
    c->interval = o.logging_interval;
    fg_callback_ops ops = {.name = "LearningRateMonitor",
                           .on_train_start = on_train_start,
                           .on_train_batch_start = on_train_batch_start,
                           .on_train_epoch_start = on_train_epoch_start,
                           .free = lrm_free};
    return fg__callback_make(&ops, c, FG__CB_LR_MONITOR, "LearningRateMonitor");
}
