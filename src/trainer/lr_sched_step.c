/* The Trainer's side of a PyTorch scheduler (fg_optimizer_config.scheduler,
 * Lightning's lr_scheduler_config): when it steps (interval, frequency),
 * the monitored value a ReduceLROnPlateau steps on, and its state in the
 * trainer's checkpoints. */
#include <stdio.h>
#include <string.h>

#include "trainer_impl.h"

fg_status fg__check_scheduler(const fg_optimizer_config *oc) {
    if (!oc->scheduler) {
        if (oc->monitor)
            return fg_error(FG_EINVAL,
                            "configure_optimizers: monitor \"%s\" without a scheduler "
                            "(out->scheduler: a ReduceLROnPlateau)",
                            oc->monitor);
        return FG_OK;
    }
    if (oc->schedule || oc->lr_at)
        return fg_error(FG_EINVAL, "configure_optimizers: both a scheduler and a schedule/lr_at: "
                                   "give one of them");
    if (fg_lr_scheduler_optimizer(oc->scheduler) != oc->optimizer)
        return fg_error(FG_EINVAL,
                        "configure_optimizers: the %s is made on another optimizer "
                        "than out->optimizer",
                        fg_lr_scheduler_name(oc->scheduler));
    if (fg_lr_scheduler_needs_value(oc->scheduler) && (!oc->monitor || !oc->monitor[0]))
        return fg_error(FG_EINVAL, "configure_optimizers: ReduceLROnPlateau needs out->monitor, "
                                   "the logged metric it steps on (Lightning's "
                                   "lr_scheduler_config \"monitor\"), e.g. \"val_loss\"");
    if (oc->monitor && strlen(oc->monitor) >= 256)
        return fg_error(FG_EINVAL,
                        "configure_optimizers: monitor name of %zu characters (at "
                        "most 255)",
                        strlen(oc->monitor));
    return FG_OK;
}

static bool plateau(const fg_trainer *t) { return fg_lr_scheduler_needs_value(t->oc.scheduler); }

static FG_MUST_USE fg_status step_plateau(fg_trainer *t) {
    double v;
    if (!fg_trainer_callback_metric(t, t->oc.monitor, &v)) {
        char names[1024];
        fg__callback_metric_names(t, names, sizeof names);
        return fg_error(FG_EINVAL,
                        "ReduceLROnPlateau conditioned on metric \"%s\", which is not available. "
                        "Available metrics are: [%s]. Log it, or set monitor to one of them",
                        t->oc.monitor, names);
    }
    return fg_lr_scheduler_step_value(t->oc.scheduler, v);
}

fg_status fg__sched_after_step(fg_trainer *t, bool last) {
    if (!t->oc.scheduler || plateau(t)) return FG_OK;
    int64_t f = t->oc.frequency;
    if (t->oc.interval == FG_INTERVAL_STEP) {
        /* t->batch_idx is the batch's index; Lightning counts it + 1 */
        if ((t->batch_idx + 1) % f == 0) FG_TRY(fg_lr_scheduler_step(t->oc.scheduler));
    } else if (last && (t->current_epoch + 1) % f == 0) {
        FG_TRY(fg_lr_scheduler_step(t->oc.scheduler));
    }
    return FG_OK;
}

fg_status fg__sched_after_stream_end(fg_trainer *t) {
    if (!t->oc.scheduler || plateau(t) || t->oc.interval != FG_INTERVAL_EPOCH) return FG_OK;
    return (t->current_epoch + 1) % t->oc.frequency == 0 ? fg_lr_scheduler_step(t->oc.scheduler)
                                                         : FG_OK;
}

fg_status fg__sched_after_val(fg_trainer *t, bool stepped) {
    if (!t->oc.scheduler || !plateau(t) || t->oc.interval != FG_INTERVAL_STEP || !stepped)
        return FG_OK;
    /* after the batch: batch_idx already counts it */
    return t->batch_idx % t->oc.frequency == 0 ? step_plateau(t) : FG_OK;
}

fg_status fg__sched_epoch_end(fg_trainer *t) {
    if (!t->oc.scheduler || !plateau(t) || t->oc.interval != FG_INTERVAL_EPOCH) return FG_OK;
    /* an epoch cut short */
    if (t->batch_idx < t->num_training_batches && !t->stream_ended) return FG_OK;
    return (t->current_epoch + 1) % t->oc.frequency == 0 ? step_plateau(t) : FG_OK;
}

/* The schedulers a checkpoint holds: the lr_scheduler_config's, or under
 * manual optimization every one configure_optimizers gave ("trainer.
 * lr_scheduler", then "trainer.lr_scheduler.1", ...). */
static int scheds_of(fg_trainer *t, fg_lr_scheduler **out) {
    if (!t->manual) {
        out[0] = t->oc.scheduler;
        return t->oc.scheduler ? 1 : 0;
    }
    for (int i = 0; i < t->nscheds; i++) out[i] = t->scheds[i];
    return t->nscheds;
}

static void sched_key(char *buf, size_t cap, int i) {
    if (i == 0) snprintf(buf, cap, "trainer.lr_scheduler");
    else snprintf(buf, cap, "trainer.lr_scheduler.%d", i);
}

fg_status fg__sched_save(fg_trainer *t, fg_state_dict *sd) {
    if (t->fn != FG_FIT) return FG_OK;
    fg_lr_scheduler *sc[FG_FABRIC_MAX_OPTIMIZERS];
    int n = scheds_of(t, sc);
    for (int i = 0; i < n; i++) {
        char key[64];
        sched_key(key, sizeof key, i);
        char *st = fg_lr_scheduler_state_save(sc[i]);
        if (!st) return fg_last_status();
        fg_status s = fg__sd_put(sd, key, st);
        fg_free(st);
        FG_TRY(s);
    }
    return FG_OK;
}

fg_status fg__sched_load(fg_trainer *t, const fg_state_dict *sd) {
    fg_lr_scheduler *sc[FG_FABRIC_MAX_OPTIMIZERS];
    int n = scheds_of(t, sc);
    for (int i = 0; i < n; i++) {
        char key[64];
        sched_key(key, sizeof key, i);
        const char *st = fg_state_dict_get(sd, key);
        if (!st)
            return fg_error(FG_EMISMATCH,
                            "the checkpoint has no %s state (saved without that scheduler?), "
                            "and configure_optimizers gives a %s",
                            key + 8, fg_lr_scheduler_name(sc[i]));
        fg_status s = fg_lr_scheduler_state_load(sc[i], st);
        if (s != FG_OK) return fg_error_wrap(s, "the checkpoint's %s", key + 8);
    }
    return FG_OK;
}
