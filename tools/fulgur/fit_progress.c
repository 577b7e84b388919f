/* Rank 0's view of a run: a one-line progress bar redrawn on stderr when it
 * is a terminal (at most 10 times a second), plain lines on stdout every
 * --log-every steps otherwise, and metrics.csv (one row per --log-every
 * steps with the window's mean loss and throughput, one per validation).
 * Other ranks pass NULL everywhere and print nothing. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fit.h"

struct fit_progress {
    const fit_opts *o;
    FILE *csv;
    bool bar;       /* redraw a bar on stderr */
    bool lines;     /* plain lines on stdout */
    bool bar_drawn; /* the bar occupies the current stderr line */
    int64_t total, start;
    const char *unit;
    double t0, t_last_draw;
    /* window since the last log row */
    double win_t0, win_loss, win_items;
    int64_t win_steps;
    /* for the bar: the latest values */
    double last_loss, last_rate, last_val;
    int64_t last_epoch;
    double total_items, run_t0;
};

fit_progress *fit_progress_new(const fit_opts *o, int64_t total_steps, int64_t start_step,
                               const char *unit, const char *csv_path, bool append) {
    fit_progress *p = calloc(1, sizeof *p);
    if (!p) {
        fg_error(FG_ENOMEM, "progress: out of memory");
        return NULL;
    }
    p->o = o;
    p->total = total_steps;
    p->start = start_step;
    p->unit = unit;
    p->t0 = p->win_t0 = p->run_t0 = fg_time();
    p->last_val = -1;
    bool tty = isatty(STDERR_FILENO);
    const char *mode = o->progress;
    p->bar = !strcmp(mode, "bar") || (!strcmp(mode, "auto") && tty);
    p->lines = !strcmp(mode, "lines") || (!strcmp(mode, "auto") && !tty);
    if (csv_path) {
        bool exists = append && access(csv_path, F_OK) == 0;
        p->csv = fopen(csv_path, append ? "a" : "w");
        if (!p->csv) {
            fg_error(FG_EIO, "metrics file %s: cannot open for writing", csv_path);
            free(p);
            return NULL;
        }
        if (!exists) fprintf(p->csv, "step,epoch,train_loss,val_loss,lr,throughput,elapsed_s\n");
        fflush(p->csv);
    }
    return p;
}

double fit_progress_elapsed(const fit_progress *p) { return p ? fg_time() - p->t0 : 0; }

static void fmt_time(char *buf, size_t n, double s) {
    if (s < 0 || s > 1e8) {
        snprintf(buf, n, "?");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
}

static void fmt_rate(char *buf, size_t n, double r) {
    if (r >= 1e6) snprintf(buf, n, "%.2fM", r / 1e6);
    else if (r >= 1e3) snprintf(buf, n, "%.1fk", r / 1e3);
    else snprintf(buf, n, "%.1f", r);
}

static double eta(const fit_progress *p, int64_t step) {
    if (p->total <= 0 || step <= p->start) return -1;
    double per = (fg_time() - p->t0) / (double)(step - p->start);
    return per * (double)(p->total - step);
}

static void clear_bar(fit_progress *p) {
    if (p->bar_drawn) {
        fputs("\r\033[K", stderr);
        p->bar_drawn = false;
    }
}

static void draw_bar(fit_progress *p, int64_t step) {
    char bar[32], rate[32], left[32], el[32], val[48] = "";
    int w = 24, fill = p->total > 0 ? (int)((double)w * (double)step / (double)p->total) : 0;
    if (fill > w) fill = w;
    for (int i = 0; i < w; i++) bar[i] = i < fill ? '#' : '.';
    bar[w] = '\0';
    fmt_rate(rate, sizeof rate, p->last_rate);
    fmt_time(left, sizeof left, eta(p, step));
    fmt_time(el, sizeof el, fg_time() - p->t0);
    if (p->last_val >= 0) snprintf(val, sizeof val, "  val %.4f", p->last_val);
    char total[32] = "?";
    if (p->total > 0) snprintf(total, sizeof total, "%lld", (long long)p->total);
    fprintf(stderr, "\r\033[Kepoch %lld [%s] %lld/%s  loss %.4f%s  %s %s/s  %s<%s",
            (long long)p->last_epoch, bar, (long long)step, total, p->last_loss, val, rate, p->unit,
            el, left);
    fflush(stderr);
    p->bar_drawn = true;
}

void fit_progress_step(fit_progress *p, int64_t step, int64_t epoch, double loss, double lr,
                       double items) {
    if (!p) return;
    p->win_loss += loss;
    p->win_items += items;
    p->win_steps++;
    p->last_loss = loss;
    p->last_epoch = epoch;
    double now = fg_time();
    bool log_row = step % p->o->log_every == 0 || step == p->total;
    if (log_row) {
        double dt = now - p->win_t0;
        double rate = dt > 0 ? p->win_items / dt : 0;
        double mean = p->win_loss / (double)p->win_steps;
        p->last_rate = rate;
        if (p->csv) {
            fprintf(p->csv, "%lld,%lld,%.6f,,%.6g,%.1f,%.2f\n", (long long)step, (long long)epoch,
                    mean, lr, rate, now - p->t0);
            fflush(p->csv);
        }
        if (p->lines) {
            char r[32], left[32];
            fmt_rate(r, sizeof r, rate);
            fmt_time(left, sizeof left, eta(p, step));
            char total[32] = "?";
            if (p->total > 0) snprintf(total, sizeof total, "%lld", (long long)p->total);
            printf("step %lld/%s  epoch %lld  loss %.4f  lr %.3g  %s %s/s  ETA %s\n",
                   (long long)step, total, (long long)epoch, mean, lr, r, p->unit, left);
            fflush(stdout);
        }
        p->win_t0 = now;
        p->win_loss = p->win_items = 0;
        p->win_steps = 0;
    } else if (p->last_rate == 0 && now > p->win_t0) {
        p->last_rate = p->win_items / (now - p->win_t0);
    }
    if (p->bar && (now - p->t_last_draw >= 0.1 || step == p->total)) {
        draw_bar(p, step);
        p->t_last_draw = now;
    }
}

void fit_progress_val(fit_progress *p, int64_t step, int64_t epoch, double val_loss) {
    if (!p) return;
    p->last_val = val_loss;
    if (p->csv) {
        fprintf(p->csv, "%lld,%lld,,%.6f,,,%.2f\n", (long long)step, (long long)epoch, val_loss,
                fg_time() - p->t0);
        fflush(p->csv);
    }
    fit_progress_note(p, "step %lld  val loss %.4f", (long long)step, val_loss);
}

void fit_progress_note(fit_progress *p, const char *fmt, ...) {
    if (!p) return;
    clear_bar(p);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

void fit_progress_free(fit_progress *p) {
    if (!p) return;
    if (p->bar_drawn) fputc('\n', stderr);
    if (p->csv) fclose(p->csv);
    free(p);
}
