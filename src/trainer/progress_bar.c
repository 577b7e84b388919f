/* The progress bar (Lightning's TQDMProgressBar), on global rank 0 only and
 * only into the FILE* it was given, or, without one, as lines through the
 * log hook at info level (the library picks no stream: fg_fabric_print's
 * rule). On a terminal one line is redrawn in place with a bar; elsewhere
 * (a file, a pipe, CI logs, the log hook) plain lines are written every
 * refresh_rate batches and at the end of each epoch, validation and test
 * run. A line reads
 *   Epoch 2:  40%|########            | 40/100 [00:03<00:04, 13.20it/s, v_num=0, loss=0.512]
 * with the elapsed time, the time left, the rate and the metrics logged
 * with prog_bar. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "trainer_impl.h"

typedef struct pbar_cb {
    FILE *out;
    int64_t refresh_opt, refresh;
    fg_flag redraw_opt;
    bool redraw, active;
    double t0, eval_t0;
    int64_t eval_n;  /* batches of the evaluation run so far */
    size_t last_len; /* of the line on screen, to blank what a shorter one leaves */
} pbar_cb;

static void fmt_time(char *buf, size_t cap, double s) {
    if (!isfinite(s) || s < 0) {
        snprintf(buf, cap, "?");
        return;
    }
    long v = (long)(s + 0.5);
    if (v >= 3600) snprintf(buf, cap, "%ld:%02ld:%02ld", v / 3600, v / 60 % 60, v % 60);
    else snprintf(buf, cap, "%02ld:%02ld", v / 60, v % 60);
}

static void draw(pbar_cb *c, fg_trainer *t, const char *desc, int64_t n, int64_t total, double t0,
                 bool end_line) {
    char line[2048], el[32], left[32];
    double dt = fg_time() - t0, rate = dt > 0 ? (double)n / dt : NAN;
    fmt_time(el, sizeof el, dt);
    fmt_time(left, sizeof left, rate > 0 ? (double)(total - n) / rate : NAN);
    size_t k = (size_t)snprintf(line, sizeof line, "%s: ", desc);
    if (c->redraw && total > 0) {
        int pct = (int)(100 * n / total), width = 20, fill = (int)(width * n / total);
        k += (size_t)snprintf(line + k, sizeof line - k, "%3d%%|%.*s%*s| ", pct, fill,
                              "####################", width - fill, "");
    }
    k += (size_t)snprintf(line + k, sizeof line - k, "%lld/%lld [%s<%s, ", (long long)n,
                          (long long)total, el, left);
    if (isfinite(rate)) k += (size_t)snprintf(line + k, sizeof line - k, "%.2fit/s", rate);
    else k += (size_t)snprintf(line + k, sizeof line - k, "?it/s");
    const char *v = fg__logger_version(t);
    if (v) k += (size_t)snprintf(line + k, sizeof line - k, ", v_num=%s", v);
    const fg_metric *m;
    int64_t nm = fg_trainer_metrics(t, FG_PROGRESS_BAR_METRICS, &m);
    for (int64_t i = 0; i < nm && k + 64 < sizeof line; i++)
        k += (size_t)snprintf(line + k, sizeof line - k, ", %s=%.3g", m[i].name, m[i].value);
    snprintf(line + k, sizeof line - k, "]");
    k = strlen(line);
    if (c->redraw) {
        fprintf(c->out, "\r%s", line);
        if (c->last_len > k) fprintf(c->out, "%*s", (int)(c->last_len - k), "");
        c->last_len = k;
        if (end_line) {
            fputc('\n', c->out);
            c->last_len = 0;
        }
    } else if (c->out) {
        fprintf(c->out, "%s\n", line);
    } else {
        fg_log(FG_LOG_INFO, "%s", line);
        return;
    }
    fflush(c->out);
}

static void clear_line(pbar_cb *c) {
    if (!c->redraw || !c->last_len) return;
    fprintf(c->out, "\r%*s\r", (int)c->last_len, "");
    c->last_len = 0;
    fflush(c->out);
}

static void start(pbar_cb *c, fg_trainer *t) {
    c->active = fg_trainer_is_global_zero(t);
    /* without a stream the lines go through the log hook: nothing to redraw */
    c->redraw = c->out && (c->redraw_opt == FG_FLAG_DEFAULT ? isatty(fileno(c->out)) == 1
                                                            : c->redraw_opt == FG_ON);
    c->refresh = c->refresh_opt ? c->refresh_opt : c->redraw ? 1 : t->log_every;
    c->last_len = 0;
}

static fg_status setup(void *ud, fg_trainer *t, fg_trainer_fn fn) {
    (void)fn;
    start(ud, t);
    return FG_OK;
}

static fg_status on_train_epoch_start(void *ud, fg_trainer *t) {
    (void)t;
    ((pbar_cb *)ud)->t0 = fg_time();
    return FG_OK;
}

static void epoch_desc(const fg_trainer *t, char *buf, size_t cap) {
    snprintf(buf, cap, "Epoch %lld", (long long)t->current_epoch);
}

static fg_status on_train_batch_end(void *ud, fg_trainer *t, fg_batch *b, int64_t idx) {
    (void)b;
    pbar_cb *c = ud;
    int64_t n = idx + 1, total = t->num_training_batches;
    if (!c->active || (n % c->refresh != 0 && n != total) || (!c->redraw && n == total))
        return FG_OK;
    char desc[64];
    epoch_desc(t, desc, sizeof desc);
    draw(c, t, desc, n, total, c->t0, false);
    return FG_OK;
}

static fg_status on_train_epoch_end(void *ud, fg_trainer *t) {
    pbar_cb *c = ud;
    if (!c->active) return FG_OK;
    char desc[64];
    epoch_desc(t, desc, sizeof desc);
    draw(c, t, desc, t->batch_idx, t->num_training_batches, c->t0, true);
    return FG_OK;
}

static fg_status eval_start(void *ud, fg_trainer *t) {
    (void)t;
    ((pbar_cb *)ud)->eval_t0 = fg_time();
    ((pbar_cb *)ud)->eval_n = 0;
    return FG_OK;
}

static const char *eval_desc(const fg_trainer *t) {
    switch (t->stage) {
    case FG_STAGE_TEST: return "Testing";
    case FG_STAGE_PREDICT: return "Predicting";
    default: return "Validation";
    }
}

static fg_status eval_batch_end(void *ud, fg_trainer *t, fg_batch *b, int64_t idx) {
    (void)b;
    pbar_cb *c = ud;
    c->eval_n = idx + 1;
    if (!c->active || !c->redraw || t->stage == FG_STAGE_SANITY_CHECK) return FG_OK;
    int64_t total = t->stage == FG_STAGE_VALIDATE ? t->num_val_batches : 0;
    draw(c, t, eval_desc(t), idx + 1, total ? total : idx + 1, c->eval_t0, false);
    return FG_OK;
}

static fg_status eval_end(void *ud, fg_trainer *t) {
    pbar_cb *c = ud;
    if (!c->active || t->stage == FG_STAGE_SANITY_CHECK) return FG_OK;
    /* inside fit a terminal keeps the epoch's line; elsewhere the run gets its own */
    if (c->redraw) clear_line(c);
    if (!c->redraw || t->fn != FG_FIT)
        draw(c, t, eval_desc(t), c->eval_n, c->eval_n, c->eval_t0, true);
    return FG_OK;
}

static void pbar_free(void *ud) { fg_free(ud); }

fg_callback *fg_progress_bar_new(const fg_progress_bar_opts *opts) {
    fg_progress_bar_opts o = opts ? *opts : (fg_progress_bar_opts){0};
    if (o.refresh_rate < 0 ||
        (o.redraw != FG_FLAG_DEFAULT && o.redraw != FG_ON && o.redraw != FG_OFF)) {
        fg_error(FG_EINVAL,
                 "progress bar: refresh_rate=%lld redraw=%d: expected refresh_rate >= 0 "
                 "and redraw FG_ON, FG_OFF or 0",
                 (long long)o.refresh_rate, (int)o.redraw);
        return NULL;
    }
    pbar_cb *c = fg_calloc(1, sizeof *c);
    if (!c) return NULL;
    c->out = o.out;
    c->refresh_opt = o.refresh_rate;
    c->redraw_opt = o.redraw;
    fg_callback_ops ops = {.name = "TQDMProgressBar",
                           .setup = setup,
                           .on_train_epoch_start = on_train_epoch_start,
                           .on_train_batch_end = on_train_batch_end,
                           .on_train_epoch_end = on_train_epoch_end,
                           .on_validation_start = eval_start,
                           .on_validation_batch_end = eval_batch_end,
                           .on_validation_end = eval_end,
                           .on_test_start = eval_start,
                           .on_test_batch_end = eval_batch_end,
                           .on_test_end = eval_end,
                           .on_predict_start = eval_start,
                           .on_predict_batch_end = eval_batch_end,
                           .on_predict_end = eval_end,
                           .free = pbar_free};
    return fg__callback_make(&ops, c, FG__CB_PROGRESS, "TQDMProgressBar");
}
