/* The progress bar (Lightning's TQDMProgressBar), on global rank 0 only and
 * only into the FILE* it was given, or, without one, as lines through the
 * log hook at info level (the library picks no stream: fg_fabric_print's
 * rule). On a terminal one line is redrawn in place with a bar; elsewhere
 * (a file, a pipe, CI logs, the log hook) plain lines are written every
 * refresh_rate batches and at the end of each epoch, validation and test
 * run. A line reads
 *   Epoch 2:  40%|########            | 40/100 [00:03<00:04, 13.20it/s, v_num=0, loss=0.512]
 * with the elapsed time, the time left, the rate and the metrics logged
 * with prog_bar.
 *
 * By step (by_step): optimizer steps over the whole fit, as a command line
 * shows a run: "step 40/100  epoch 0  train_loss 0.5123  12.3k tok/s  ETA
 * 0:04" every refresh_rate steps and at the last, or redrawn as
 * "epoch 0 [######......] 40/100  train_loss 0.5123  12.3k tok/s  0:03<0:04";
 * after each validation of the fit (and of a validate after it) "step 40
 * val_loss 0.4981"; test and predict runs show nothing. The rate
 * counts the batches' samples on every rank (times unit_per_sample) since
 * the previous line. fg_progress_bar_write puts a line above the bar. */
#include <math.h>
#include <stdarg.h>
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
    /* by step */
    bool by_step;
    char unit[32];
    int64_t per_sample;
    int64_t total, start, seen_step, win_step; /* the fit's steps, where it began, the last
                                                  drawn, the window's first */
    double fit_t0, win_t0, win_items, rate;
    char last_line[2048]; /* the bar on screen, redrawn after a written line */
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

/* The by-step clock: m:ss, as the command's lines have always read. */
static void fmt_clock(char *buf, size_t cap, double s) {
    if (!isfinite(s) || s < 0 || s > 1e8) {
        snprintf(buf, cap, "?");
        return;
    }
    long v = (long)(s + 0.5);
    if (v >= 3600) snprintf(buf, cap, "%ld:%02ld:%02ld", v / 3600, v / 60 % 60, v % 60);
    else snprintf(buf, cap, "%ld:%02ld", v / 60, v % 60);
}

static void fmt_rate(char *buf, size_t cap, double r) {
    if (!isfinite(r) || r < 0) snprintf(buf, cap, "?");
    else if (r >= 1e6) snprintf(buf, cap, "%.2fM", r / 1e6);
    else if (r >= 1e3) snprintf(buf, cap, "%.1fk", r / 1e3);
    else snprintf(buf, cap, "%.1f", r);
}

/* A metric's value on a by-step line: four decimals where they say
 * something (losses), three significant digits below 0.01 (rates). */
static void fmt_metric(char *buf, size_t cap, double v) {
    if (isfinite(v) && v != 0 && fabs(v) < 0.01) snprintf(buf, cap, "%.3g", v);
    else snprintf(buf, cap, "%.4f", v);
}

/* One finished line: to the stream, or through the log hook. */
static void emit(pbar_cb *c, const char *line) {
    if (c->out) {
        fprintf(c->out, "%s\n", line);
        fflush(c->out);
    } else {
        fg_log(FG_LOG_INFO, "%s", line);
    }
}

/* The line redrawn in place (c->redraw: c->out is a terminal). */
static void redraw_line(pbar_cb *c, const char *line, bool end_line) {
    size_t k = strlen(line);
    fprintf(c->out, "\r%s", line);
    if (c->last_len > k) fprintf(c->out, "%*s", (int)(c->last_len - k), "");
    c->last_len = k;
    snprintf(c->last_line, sizeof c->last_line, "%s", line);
    if (end_line) {
        fputc('\n', c->out);
        c->last_len = 0;
        c->last_line[0] = '\0';
    }
    fflush(c->out);
}

static void draw(pbar_cb *c, fg_trainer *t, const char *desc, int64_t n, int64_t total, double t0,
                 bool end_line) {
    char line[2048], el[32], left[32];
    double dt = fg_time() - t0, rate = dt > 0 ? (double)n / dt : NAN;
    fmt_time(el, sizeof el, dt);
    /* total < 0: unknown (a stream without a length), tqdm's "n/?" */
    fmt_time(left, sizeof left, rate > 0 && total >= 0 ? (double)(total - n) / rate : NAN);
    size_t k = (size_t)snprintf(line, sizeof line, "%s: ", desc);
    if (c->redraw && total > 0) {
        int pct = (int)(100 * n / total), width = 20, fill = (int)(width * n / total);
        k += (size_t)snprintf(line + k, sizeof line - k, "%3d%%|%.*s%*s| ", pct, fill,
                              "####################", width - fill, "");
    }
    char tot[32] = "?";
    if (total >= 0) snprintf(tot, sizeof tot, "%lld", (long long)total);
    k += (size_t)snprintf(line + k, sizeof line - k, "%lld/%s [%s<%s, ", (long long)n, tot, el,
                          left);
    if (isfinite(rate)) k += (size_t)snprintf(line + k, sizeof line - k, "%.2fit/s", rate);
    else k += (size_t)snprintf(line + k, sizeof line - k, "?it/s");
    const char *v = fg__logger_version(t);
    if (v) k += (size_t)snprintf(line + k, sizeof line - k, ", v_num=%s", v);
    const fg_metric *m;
    int64_t nm = fg_trainer_metrics(t, FG_PROGRESS_BAR_METRICS, &m);
    for (int64_t i = 0; i < nm && k + 64 < sizeof line; i++)
        k += (size_t)snprintf(line + k, sizeof line - k, ", %s=%.3g", m[i].name, m[i].value);
    snprintf(line + k, sizeof line - k, "]");
    if (c->redraw) redraw_line(c, line, end_line);
    else emit(c, line);
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
    c->last_line[0] = '\0';
}

static FG_MUST_USE fg_status setup(void *ud, fg_trainer *t, fg_trainer_fn fn) {
    (void)fn;
    start(ud, t);
    return FG_OK;
}

static void teardown(void *ud, fg_trainer *t, fg_trainer_fn fn) {
    (void)t;
    (void)fn;
    pbar_cb *c = ud;
    if (c->redraw && c->last_len) {
        fputc('\n', c->out); /* the bar stays on screen, the next output below it */
        fflush(c->out);
    }
    c->last_len = 0;
    c->last_line[0] = '\0';
}

/* ------------------------------------------------------------ by step */

/* After the checkpoint (if any) is restored: the steps this fit will end
 * at, from max_steps and max_epochs. */
static FG_MUST_USE fg_status on_train_start(void *ud, fg_trainer *t) {
    pbar_cb *c = ud;
    int64_t acc = t->accumulate;
    /* a stream of unknown length: -1, the steps an epoch are not known */
    int64_t per_epoch =
        t->num_training_batches == FG__LEN_UNKNOWN ? -1 : (t->num_training_batches + acc - 1) / acc;
    c->total = t->max_steps;
    if (t->max_epochs > 0 && per_epoch >= 0 &&
        (c->total < 0 || per_epoch * t->max_epochs < c->total))
        c->total = per_epoch * t->max_epochs;
    c->start = c->seen_step = c->win_step = t->global_step;
    c->fit_t0 = c->win_t0 = fg_time();
    c->win_items = 0;
    c->rate = 0;
    return FG_OK;
}

/* "  name value" for each progress-bar metric of the training loop: a
 * value logged in this batch as it stands now (the trainer publishes the
 * batch's values after its end hooks, this one among them), else the one
 * published. */
static size_t put_metrics(const fg_trainer *t, char *line, size_t k, size_t cap) {
    const fg_metric *m;
    int64_t nm = fg_trainer_metrics(t, FG_PROGRESS_BAR_METRICS, &m);
    for (int64_t j = 0; j < t->train_res.n && k + 96 < cap; j++) {
        const fg__result *e = &t->train_res.r[j];
        if (!e->prog_bar) continue;
        char name[512];
        double v = NAN;
        bool have = false;
        if (e->on_step && e->step_set) {
            v = e->step_last;
            if (t->dp && e->step_n > 1)
                v = e->reduce == FG_REDUCE_FX_MEAN ? e->step_acc / e->step_w : e->step_acc;
            have = true;
        }
        snprintf(name, sizeof name, "%s%s", e->name, e->on_step && e->on_epoch ? "_step" : "");
        for (int64_t i = 0; i < nm && !have; i++)
            if (!strcmp(m[i].name, name)) v = m[i].value, have = true;
        if (!have) continue;
        char s[48];
        fmt_metric(s, sizeof s, v);
        k += (size_t)snprintf(line + k, cap - k, "  %s %s", name, s);
    }
    return k;
}

static void step_line(pbar_cb *c, fg_trainer *t, bool lines) {
    int64_t step = t->global_step;
    double now = fg_time();
    char total[32] = "?", r[32], el[32], left[32], line[2048];
    if (c->total > 0) snprintf(total, sizeof total, "%lld", (long long)c->total);
    double per = step > c->start ? (now - c->fit_t0) / (double)(step - c->start) : NAN;
    fmt_clock(left, sizeof left, c->total > 0 ? per * (double)(c->total - step) : NAN);
    fmt_rate(r, sizeof r, c->rate);
    const char *unit = c->unit[0] ? c->unit : "it";
    size_t k;
    if (lines) {
        k = (size_t)snprintf(line, sizeof line, "step %lld/%s  epoch %lld", (long long)step, total,
                             (long long)t->current_epoch);
        k = put_metrics(t, line, k, sizeof line);
        snprintf(line + k, sizeof line - k, "  %s %s/s  ETA %s", r, unit, left);
        emit(c, line);
        return;
    }
    char bar[32];
    int w = 24, fill = c->total > 0 ? (int)((double)w * (double)step / (double)c->total) : 0;
    if (fill > w) fill = w;
    for (int i = 0; i < w; i++) bar[i] = i < fill ? '#' : '.';
    bar[w] = '\0';
    fmt_clock(el, sizeof el, now - c->fit_t0);
    k = (size_t)snprintf(line, sizeof line, "\033[Kepoch %lld [%s] %lld/%s",
                         (long long)t->current_epoch, bar, (long long)step, total);
    k = put_metrics(t, line, k, sizeof line);
    snprintf(line + k, sizeof line - k, "  %s %s/s  %s<%s", r, unit, el, left);
    redraw_line(c, line, false);
}

static void step_batch_end(pbar_cb *c, fg_trainer *t, fg_batch *b) {
    int64_t rows = b && b->x && fg_tensor_ndim(b->x) > 0 ? fg_tensor_dim(b->x, 0) : 1;
    c->win_items += (double)rows * (double)(c->per_sample ? c->per_sample : 1) *
                    (double)fg_trainer_world_size(t);
    int64_t step = t->global_step;
    if (step == c->seen_step) return; /* mid-accumulation, or a skipped step */
    c->seen_step = step;
    bool line_due = step % c->refresh == 0 || step == c->total;
    if (!c->redraw && !line_due) return;
    /* the rate over the steps since the previous line */
    double now = fg_time();
    if ((line_due || c->rate == 0) && now > c->win_t0) {
        c->rate = c->unit[0] ? c->win_items / (now - c->win_t0)
                             : (double)(step - c->win_step) / (now - c->win_t0);
        if (line_due) {
            c->win_t0 = now;
            c->win_items = 0;
            c->win_step = step;
        }
    }
    step_line(c, t, !c->redraw);
}

/* After a validation of the fit: its progress-bar metrics */
static void step_val_end(pbar_cb *c, fg_trainer *t) {
    char line[2048];
    size_t k = (size_t)snprintf(line, sizeof line, "step %lld", (long long)t->global_step);
    bool any = false;
    for (int64_t i = 0; i < t->eval_res.n && k + 96 < sizeof line; i++) {
        const fg__result *e = &t->eval_res.r[i];
        double v;
        if (!e->prog_bar || !e->on_epoch || !fg_trainer_callback_metric(t, e->name, &v)) continue;
        char s[48];
        fmt_metric(s, sizeof s, v);
        k += (size_t)snprintf(line + k, sizeof line - k, "  %s %s", e->name, s);
        any = true;
    }
    if (!any) return;
    char saved[2048];
    snprintf(saved, sizeof saved, "%s", c->last_line);
    clear_line(c);
    emit(c, line);
    if (c->redraw && saved[0]) redraw_line(c, saved, false);
}

/* ------------------------------------------------------------ hooks */

static FG_MUST_USE fg_status on_train_epoch_start(void *ud, fg_trainer *t) {
    (void)t;
    ((pbar_cb *)ud)->t0 = fg_time();
    return FG_OK;
}

static void epoch_desc(const fg_trainer *t, char *buf, size_t cap) {
    snprintf(buf, cap, "Epoch %lld", (long long)t->current_epoch);
}

static FG_MUST_USE fg_status on_train_batch_end(void *ud, fg_trainer *t, fg_batch *b, int64_t idx) {
    pbar_cb *c = ud;
    if (!c->active) return FG_OK;
    if (c->by_step) {
        step_batch_end(c, t, b);
        return FG_OK;
    }
    int64_t n = idx + 1, total = fg_trainer_num_training_batches(t);
    if ((n % c->refresh != 0 && n != total) || (!c->redraw && n == total)) return FG_OK;
    char desc[64];
    epoch_desc(t, desc, sizeof desc);
    draw(c, t, desc, n, total, c->t0, false);
    return FG_OK;
}

static FG_MUST_USE fg_status on_train_epoch_end(void *ud, fg_trainer *t) {
    pbar_cb *c = ud;
    if (!c->active || c->by_step) return FG_OK;
    char desc[64];
    epoch_desc(t, desc, sizeof desc);
    draw(c, t, desc, t->batch_idx, fg_trainer_num_training_batches(t), c->t0, true);
    return FG_OK;
}

static FG_MUST_USE fg_status eval_start(void *ud, fg_trainer *t) {
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

static FG_MUST_USE fg_status eval_batch_end(void *ud, fg_trainer *t, fg_batch *b, int64_t idx) {
    (void)b;
    pbar_cb *c = ud;
    c->eval_n = idx + 1;
    if (!c->active || !c->redraw || t->stage == FG_STAGE_SANITY_CHECK) return FG_OK;
    if (c->by_step) return FG_OK; /* the fit's bar stays; the result gets its line */
    int64_t total = t->stage == FG_STAGE_VALIDATE ? t->num_val_batches : 0;
    draw(c, t, eval_desc(t), idx + 1, total ? total : idx + 1, c->eval_t0, false);
    return FG_OK;
}

static FG_MUST_USE fg_status eval_end(void *ud, fg_trainer *t) {
    pbar_cb *c = ud;
    if (!c->active || t->stage == FG_STAGE_SANITY_CHECK) return FG_OK;
    if (c->by_step) { /* fit's validations, and a validate after it: their line */
        if (t->stage == FG_STAGE_VALIDATE) step_val_end(c, t);
        return FG_OK;
    }
    /* inside fit a terminal keeps the epoch's line; elsewhere the run gets its own */
    if (c->redraw) clear_line(c);
    if (!c->redraw || t->fn != FG_FIT)
        draw(c, t, eval_desc(t), c->eval_n, c->eval_n, c->eval_t0, true);
    return FG_OK;
}

static void pbar_free(void *ud) { fg_free(ud); }

void fg_progress_bar_write(fg_callback *cb, FILE *to, const char *fmt, ...) {
    pbar_cb *c = cb && cb->kind == FG__CB_PROGRESS ? cb->ud : NULL;
    if (!fmt) return;
    char line[2048], saved[2048] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (c && c->redraw) {
        snprintf(saved, sizeof saved, "%s", c->last_line);
        clear_line(c);
    }
    if (to) {
        fprintf(to, "%s\n", line);
        fflush(to);
    } else if (c) {
        emit(c, line);
    } else {
        return;
    }
    if (c && c->redraw && saved[0]) redraw_line(c, saved, false);
}

fg_callback *fg_progress_bar_new(const fg_progress_bar_opts *opts) {
    fg_progress_bar_opts o = opts ? *opts : (fg_progress_bar_opts){0};
    if (o.refresh_rate < 0 || o.unit_per_sample < 0 ||
        (o.redraw != FG_FLAG_DEFAULT && o.redraw != FG_ON && o.redraw != FG_OFF)) {
        fg_error(FG_EINVAL,
                 "progress bar: refresh_rate=%lld redraw=%d unit_per_sample=%lld: expected "
                 "refresh_rate >= 0, redraw FG_ON, FG_OFF or 0, and unit_per_sample >= 0",
                 (long long)o.refresh_rate, (int)o.redraw, (long long)o.unit_per_sample);
        return NULL;
    }
    if (o.unit && (!o.unit[0] || strlen(o.unit) >= sizeof((pbar_cb *)0)->unit)) {
        fg_error(FG_EINVAL, "progress bar: unit=\"%s\": expected a short name (\"tok\")", o.unit);
        return NULL;
    }
    pbar_cb *c = fg_calloc(1, sizeof *c);
    if (!c) return NULL;
    c->out = o.out;
    c->refresh_opt = o.refresh_rate;
    c->redraw_opt = o.redraw;
    c->by_step = o.by_step;
    c->per_sample = o.unit_per_sample;
    if (o.unit) snprintf(c->unit, sizeof c->unit, "%s", o.unit);
    fg_callback_ops ops = {.name = "TQDMProgressBar",
                           .setup = setup,
                           .teardown = teardown,
                           .on_train_start = on_train_start,
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
