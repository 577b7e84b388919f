/* fg_trainer_log and what it feeds, as Lightning's ResultCollection and
 * logger connector: each (hook, name) logged holds its value for this batch
 * and its reduction over the epoch (a mean weighted by batch size, a sum, a
 * max or a min). At a batch's end the step values, at an epoch's end the
 * epoch values (reduced over ranks for sync_dist) go into the three metric
 * sets (callback, logged, progress bar) and into a row for the loggers,
 * under name_step / name_epoch when a value is logged both ways.
 *
 * Invariants: results are appended under log_mu (dp's replica threads log
 * at once); epoch reductions over ranks happen at fixed points every rank
 * reaches, over the sync_dist values in the order they were first logged,
 * after checking that every rank reduces as many. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer_impl.h"

/* ------------------------------------------------------------- metric sets */

void fg__map_free(fg__metric_map *m) {
    fg__map_clear(m);
    fg_free(m->m);
    m->m = NULL;
    m->cap = 0;
}

void fg__map_clear(fg__metric_map *m) {
    for (int64_t i = 0; i < m->n; i++) fg_free((char *)m->m[i].name);
    m->n = 0;
}

const fg_metric *fg__map_get(const fg__metric_map *m, const char *name) {
    for (int64_t i = 0; i < m->n; i++)
        if (!strcmp(m->m[i].name, name)) return &m->m[i];
    return NULL;
}

fg_status fg__map_set(fg__metric_map *m, const char *name, double v) {
    for (int64_t i = 0; i < m->n; i++)
        if (!strcmp(m->m[i].name, name)) {
            m->m[i].value = v;
            return FG_OK;
        }
    if (m->n == m->cap) {
        int64_t cap = m->cap ? 2 * m->cap : 16;
        fg_metric *p = fg_realloc(m->m, (size_t)cap * sizeof *p);
        if (!p) return FG_ENOMEM;
        m->m = p;
        m->cap = cap;
    }
    char *copy = fg_strdup(name);
    if (!copy) return FG_ENOMEM;
    m->m[m->n++] = (fg_metric){copy, v};
    return FG_OK;
}

void fg__metrics_reset(fg_trainer *t) {
    fg__map_clear(&t->callback_m);
    fg__map_clear(&t->logged_m);
    fg__map_clear(&t->pbar_m);
}

bool fg_trainer_callback_metric(const fg_trainer *t, const char *name, double *out) {
    const fg_metric *m = t && name ? fg__map_get(&t->callback_m, name) : NULL;
    if (m && out) *out = m->value;
    return m != NULL;
}

int64_t fg_trainer_metrics(const fg_trainer *t, fg_metric_set which, const fg_metric **out) {
    const fg__metric_map *m = which == FG_LOGGED_METRICS         ? &t->logged_m
                              : which == FG_PROGRESS_BAR_METRICS ? &t->pbar_m
                                                                 : &t->callback_m;
    if (out) *out = m->m;
    return m->n;
}

/* ----------------------------------------------------------------- results */

void fg__results_free(fg__results *r) {
    fg__results_reset(r);
    fg_free(r->r);
    r->r = NULL;
    r->cap = 0;
}

void fg__results_reset(fg__results *r) {
    for (int64_t i = 0; i < r->n; i++) fg_free(r->r[i].name);
    r->n = 0;
}

fg_status fg__results_copy(fg__results *dst, const fg__results *src) {
    fg__results_reset(dst);
    if (dst->cap < src->n) {
        fg__result *p = fg_realloc(dst->r, (size_t)src->n * sizeof *p);
        if (!p) return FG_ENOMEM;
        dst->r = p;
        dst->cap = src->n;
    }
    for (int64_t i = 0; i < src->n; i++) {
        dst->r[i] = src->r[i];
        if (!(dst->r[i].name = fg_strdup(src->r[i].name))) {
            dst->n = i;
            return FG_ENOMEM;
        }
        dst->n = i + 1;
    }
    return FG_OK;
}

void fg__results_batch_start(fg__results *r) {
    for (int64_t i = 0; i < r->n; i++) {
        fg__result *e = &r->r[i];
        e->step_set = false;
        e->step_n = 0;
        e->step_acc = e->step_w = 0;
    }
}

static double reduce2(fg_reduce_fx fx, double a, double b) {
    switch (fx) {
    case FG_REDUCE_FX_MAX: return a > b || isnan(a) ? a : b;
    case FG_REDUCE_FX_MIN: return a < b || isnan(a) ? a : b;
    default: return a + b;
    }
}

static const char *const fx_names[] = {"mean", "sum", "max", "min"};

/* fg_trainer_log, and fg_trainer_log_metric with `metric` (whose forward
 * value `value` is, when on_step) */
static FG_MUST_USE fg_status log_value(fg_trainer *t, const char *name, double value,
                                       const fg_log_opts *opts, fg_tmetric *metric) {
    fg_log_opts o = opts ? *opts : (fg_log_opts){0};
    if (metric) { /* a metric reduces itself */
        o.reduce_fx = FG_REDUCE_FX_MEAN;
        o.sync_dist = false;
    }
    fg__fx_kind fx = t->fx;
    if (fx == FG__FX_NONE)
        return fg_error(FG_ESTATE,
                        "fg_trainer_log(\"%s\"): logging is not allowed %s%s (log from a step, "
                        "a batch hook or an epoch hook)",
                        name, t->hook ? "in " : "outside a hook", t->hook ? t->hook : "");
    if (o.reduce_fx < FG_REDUCE_FX_MEAN || o.reduce_fx > FG_REDUCE_FX_MIN)
        return fg_error(FG_EINVAL,
                        "fg_trainer_log(\"%s\"): reduce_fx=%d: expected "
                        "FG_REDUCE_FX_MEAN, _SUM, _MAX or _MIN",
                        name, (int)o.reduce_fx);
    if (o.batch_size < 0)
        return fg_error(FG_EINVAL, "fg_trainer_log(\"%s\"): batch_size=%lld: expected >= 1", name,
                        (long long)o.batch_size);
    bool step_default = fx == FG__FX_TRAIN_STEP;
    bool epoch_hook = fx == FG__FX_TRAIN_EPOCH || fx == FG__FX_EVAL_EPOCH;
    bool on_step = o.on_step == FG_FLAG_DEFAULT ? step_default : o.on_step == FG_ON;
    bool on_epoch = o.on_epoch == FG_FLAG_DEFAULT ? !step_default : o.on_epoch == FG_ON;
    if (on_step && epoch_hook)
        return fg_error(FG_EINVAL,
                        "fg_trainer_log(\"%s\", on_step) in %s: an epoch hook logs on_epoch "
                        "only",
                        name, t->hook);
    if (!on_step && !on_epoch)
        return fg_error(FG_EINVAL,
                        "fg_trainer_log(\"%s\"): on_step and on_epoch both off logs "
                        "nothing",
                        name);
    if (metric && on_step && !fg_tmetric_batch_value(metric, &value))
        return fg_error(FG_EINVAL,
                        "fg_trainer_log_metric(\"%s\", on_step): the %s has no batch value: "
                        "update it with fg_tmetric_forward, or log it on_epoch only",
                        name, fg_tmetric_name(metric));
    /* several evaluation loaders: a step's value names its loader (Lightning's
     * add_dataloader_idx); epoch hooks log for all of them */
    char idx_name[512];
    if (fx == FG__FX_EVAL_STEP && t->nevals > 1) {
        snprintf(idx_name, sizeof idx_name, "%s/dataloader_idx_%d", name, t->dl_idx);
        name = idx_name;
    }
    bool sync = o.sync_dist && !o.rank_zero_only && fg_fabric_world_size(t->f) > 1;
    double step_v = value;
    /* replicas on threads share one communicator: their step values are
     * synced once, combined, at the batch end (fg__results_batch_end) */
    if (sync && on_step && !t->dp) {
        static const fg_reduce_op ops[] = {FG_REDUCE_OP_AVG, FG_REDUCE_OP_SUM, FG_REDUCE_OP_MAX,
                                           FG_REDUCE_OP_MIN};
        FG_TRY(fg_fabric_reduce_scalar(t->f, value, ops[o.reduce_fx], &step_v));
    }
    double bs =
        (double)(o.batch_size ? o.batch_size : (fg__cur_batch_size > 0 ? fg__cur_batch_size : 1));
    fg__results *r = (t->stage == FG_STAGE_TRAIN) ? &t->train_res : &t->eval_res;
    fg_status s = FG_OK;
    pthread_mutex_lock(&t->log_mu);
    fg__result *e = NULL;
    for (int64_t i = 0; i < r->n && !e; i++)
        if (!strcmp(r->r[i].name, name) && !strcmp(r->r[i].hook, t->hook)) e = &r->r[i];
    if (e && (e->on_step != on_step || e->on_epoch != on_epoch || e->reduce != o.reduce_fx ||
              e->sync != o.sync_dist || (e->metric && e->metric != metric))) {
        if (e->metric && e->metric != metric) {
            s = fg_error(FG_EINVAL,
                         "fg_trainer_log(\"%s\") in %s: logged there as %s before: log a name "
                         "one way",
                         name, t->hook, e->metric ? "another metric object" : "a plain value");
            goto out;
        }
        s = fg_error(FG_EINVAL,
                     "fg_trainer_log(\"%s\") in %s with on_step=%d on_epoch=%d reduce_fx=%s "
                     "sync_dist=%d, but it was logged there with on_step=%d on_epoch=%d "
                     "reduce_fx=%s sync_dist=%d: log a name one way",
                     name, t->hook, on_step, on_epoch, fx_names[o.reduce_fx], o.sync_dist,
                     e->on_step, e->on_epoch, fx_names[e->reduce], e->sync);
        goto out;
    }
    if (!e) {
        if (r->n == r->cap) {
            int64_t cap = r->cap ? 2 * r->cap : 16;
            fg__result *p = fg_realloc(r->r, (size_t)cap * sizeof *p);
            if (!p) {
                s = FG_ENOMEM;
                goto out;
            }
            r->r = p;
            r->cap = cap;
        }
        e = &r->r[r->n];
        memset(e, 0, sizeof *e);
        if (!(e->name = fg_strdup(name))) {
            s = FG_ENOMEM;
            goto out;
        }
        e->hook = fg__intern_hook(t->hook);
        if (!e->hook) e->hook = "?";
        e->on_step = on_step;
        e->on_epoch = on_epoch;
        e->sync = o.sync_dist;
        e->rank_zero_only = o.rank_zero_only;
        e->reduce = o.reduce_fx;
        r->n++;
    }
    e->prog_bar = o.prog_bar;
    e->logger = o.logger != FG_OFF;
    if (on_step) {
        double part = o.reduce_fx == FG_REDUCE_FX_MEAN ? step_v * bs : step_v;
        e->step_acc = e->step_n ? reduce2(o.reduce_fx, e->step_acc, part) : part;
        e->step_w += bs;
        e->step_n++;
        e->step_last = step_v;
        e->step_set = true;
    }
    if (on_epoch && metric) {
        e->metric = metric;
        e->epoch_set = true;
        e->dirty = true;
    } else if (on_epoch) {
        double part = o.reduce_fx == FG_REDUCE_FX_MEAN ? value * bs : value;
        e->acc = e->epoch_set ? reduce2(o.reduce_fx, e->acc, part) : part;
        e->w += bs;
        e->epoch_set = true;
        e->dirty = true;
    }
out:
    pthread_mutex_unlock(&t->log_mu);
    return s;
}

fg_status fg_trainer_log(fg_trainer *t, const char *name, double value, const fg_log_opts *opts) {
    if (!t || !name || !name[0])
        return fg_error(FG_EINVAL, "fg_trainer_log: needs a trainer and a non-empty name");
    return log_value(t, name, value, opts, NULL);
}

fg_status fg_trainer_log_metric(fg_trainer *t, const char *name, fg_tmetric *m,
                                const fg_log_opts *opts) {
    if (!t || !name || !name[0] || !m)
        return fg_error(FG_EINVAL,
                        "fg_trainer_log_metric: needs a trainer, a non-empty name and a metric");
    return log_value(t, name, 0, opts, m);
}

/* name, or name_step / name_epoch when logged both ways */
static void forked(const fg__result *e, bool step, char *buf, size_t cap) {
    if (e->on_step && e->on_epoch) snprintf(buf, cap, "%s_%s", e->name, step ? "step" : "epoch");
    else snprintf(buf, cap, "%s", e->name);
}

static FG_MUST_USE fg_status publish(fg_trainer *t, const fg__result *e, double v, bool step,
                                     fg__metric_map *row) {
    char fk[512];
    forked(e, step, fk, sizeof fk);
    /* callback metrics: in training both names, in evaluation only epoch values */
    if (t->stage == FG_STAGE_TRAIN || !step) {
        FG_TRY(fg__map_set(&t->callback_m, e->name, v));
        FG_TRY(fg__map_set(&t->callback_m, fk, v));
    }
    if (e->logger) {
        FG_TRY(fg__map_set(&t->logged_m, fk, v));
        if (row) FG_TRY(fg__map_set(row, fk, v));
    }
    if (e->prog_bar) FG_TRY(fg__map_set(&t->pbar_m, fk, v));
    return FG_OK;
}

fg_status fg__results_batch_end(fg_trainer *t, fg__results *r, fg__metric_map *row) {
    for (int64_t i = 0; i < r->n; i++) {
        fg__result *e = &r->r[i];
        if (!e->on_step || !e->step_set) continue;
        double v = e->step_last;
        if (t->dp && e->step_n > 1)
            v = e->reduce == FG_REDUCE_FX_MEAN ? e->step_acc / e->step_w : e->step_acc;
        if (t->dp && e->sync && !e->rank_zero_only && fg_fabric_world_size(t->f) > 1) {
            static const fg_reduce_op ops[] = {FG_REDUCE_OP_AVG, FG_REDUCE_OP_SUM, FG_REDUCE_OP_MAX,
                                               FG_REDUCE_OP_MIN};
            FG_TRY(fg_fabric_reduce_scalar(t->f, v, ops[e->reduce], &v));
        }
        e->step_value = v;
        FG_TRY(publish(t, e, v, true, row));
    }
    return FG_OK;
}

/* Reduces the pending epoch values over ranks: one check that every rank
 * reduces as many values of each kind, then one all-reduce per kind. */
static FG_MUST_USE fg_status sync_epoch(fg_trainer *t, fg__results *r, const int64_t *idx,
                                        int64_t n) {
    int64_t cnt[3] = {0, 0, 0}; /* sum slots, max, min */
    for (int64_t k = 0; k < n; k++) {
        const fg__result *e = &r->r[idx[k]];
        if (e->reduce == FG_REDUCE_FX_MAX) cnt[1]++;
        else if (e->reduce == FG_REDUCE_FX_MIN) cnt[2]++;
        else cnt[0] += e->reduce == FG_REDUCE_FX_MEAN ? 2 : 1;
    }
    for (int k = 0; k < 3; k++) {
        double lo = 0, hi = 0;
        FG_TRY(fg_fabric_reduce_scalar(t->f, (double)cnt[k], FG_REDUCE_OP_MIN, &lo));
        FG_TRY(fg_fabric_reduce_scalar(t->f, (double)cnt[k], FG_REDUCE_OP_MAX, &hi));
        if (lo != hi || lo != (double)cnt[k])
            return fg_error(FG_EMISMATCH,
                            "sync_dist: rank %d reduces %lld %s values at this epoch end, "
                            "another rank %g: log the same names with sync_dist on every rank",
                            fg_fabric_global_rank(t->f), (long long)cnt[k],
                            k == 0   ? "mean/sum"
                            : k == 1 ? "max"
                                     : "min",
                            lo != (double)cnt[k] ? lo : hi);
    }
    int64_t total = cnt[0] + cnt[1] + cnt[2];
    if (total == 0) return FG_OK;
    double *buf = fg_alloc((size_t)total * sizeof(double));
    if (!buf) return FG_ENOMEM;
    double *sum = buf, *mx = buf + cnt[0], *mn = mx + cnt[1];
    int64_t a = 0, b = 0, c = 0;
    for (int64_t k = 0; k < n; k++) {
        const fg__result *e = &r->r[idx[k]];
        if (e->reduce == FG_REDUCE_FX_MAX) mx[b++] = e->acc;
        else if (e->reduce == FG_REDUCE_FX_MIN) mn[c++] = e->acc;
        else {
            sum[a++] = e->acc;
            if (e->reduce == FG_REDUCE_FX_MEAN) sum[a++] = e->w;
        }
    }
    fg_comm *comm = fg_fabric_comm(t->f);
    fg_status s = FG_OK;
    if (cnt[0]) s = fg_comm_allreduce(comm, sum, sum, cnt[0], FG_F64, FG_REDUCE_OP_SUM);
    if (s == FG_OK && cnt[1]) s = fg_comm_allreduce(comm, mx, mx, cnt[1], FG_F64, FG_REDUCE_OP_MAX);
    if (s == FG_OK && cnt[2]) s = fg_comm_allreduce(comm, mn, mn, cnt[2], FG_F64, FG_REDUCE_OP_MIN);
    a = b = c = 0;
    for (int64_t k = 0; k < n && s == FG_OK; k++) {
        fg__result *e = &r->r[idx[k]];
        if (e->reduce == FG_REDUCE_FX_MAX) e->computed = mx[b++];
        else if (e->reduce == FG_REDUCE_FX_MIN) e->computed = mn[c++];
        else if (e->reduce == FG_REDUCE_FX_SUM) e->computed = sum[a++];
        else {
            e->computed = sum[a] / sum[a + 1];
            a += 2;
        }
    }
    fg_free(buf);
    return s;
}

fg_status fg__results_epoch_compute(fg_trainer *t, fg__results *r, fg__metric_map *row) {
    int64_t n = 0, nsync = 0;
    int64_t *idx = fg_alloc((size_t)(r->n + 1) * sizeof(int64_t) * 2);
    if (!idx) return FG_ENOMEM;
    int64_t *sidx = idx + r->n + 1;
    bool multi = fg_fabric_world_size(t->f) > 1;
    for (int64_t i = 0; i < r->n; i++) {
        fg__result *e = &r->r[i];
        if (!e->on_epoch || !e->epoch_set || !e->dirty) continue;
        idx[n++] = i;
        if (e->metric) continue; /* computed below, in order, on every rank */
        if (e->sync && !e->rank_zero_only && multi) sidx[nsync++] = i;
        else e->computed = e->reduce == FG_REDUCE_FX_MEAN ? e->acc / e->w : e->acc;
    }
    fg_status s = multi ? sync_epoch(t, r, sidx, nsync) : FG_OK;
    for (int64_t k = 0; k < n && s == FG_OK; k++) {
        fg__result *e = &r->r[idx[k]];
        if (!e->metric) continue;
        /* Lightning syncs a logged Metric over the process group */
        fg_comm *own = fg_tmetric_comm(e->metric);
        if (multi && !own) fg_tmetric_set_comm(e->metric, fg_fabric_comm(t->f));
        s = fg_tmetric_compute(e->metric, &e->computed);
        fg_tmetric_set_comm(e->metric, own); /* the launch's communicator dies with it */
        if (s != FG_OK) s = fg_error_wrap(s, "the epoch value of \"%s\"", e->name);
        fg_tmetric_reset(e->metric);
    }
    for (int64_t k = 0; k < n && s == FG_OK; k++) {
        fg__result *e = &r->r[idx[k]];
        e->dirty = false;
        s = publish(t, e, e->computed, false, row);
    }
    fg_free(idx);
    return s;
}

/* ----------------------------------------------------------------- loggers */

bool fg__should_update_logs(const fg_trainer *t) {
    return (t->batches_that_stepped + 1) % t->log_every == 0 || t->should_stop;
}

static bool loggers_on(const fg_trainer *t) {
    return t->nloggers > 0 && !t->fast_dev_run && fg_fabric_is_global_zero(t->f);
}

fg_status fg__loggers_log(fg_trainer *t, fg__metric_map *row, int64_t step, bool add_epoch) {
    if (!loggers_on(t) || row->n == 0) return FG_OK;
    if (add_epoch && !fg__map_get(row, "epoch"))
        FG_TRY(fg__map_set(row, "epoch", (double)t->current_epoch));
    for (int i = 0; i < t->nloggers; i++) {
        fg_logger *lg = t->loggers[i];
        const char *name = lg->ops.name ? lg->ops.name : "logger";
        if (lg->ops.log_metrics) {
            fg_status s = lg->ops.log_metrics(lg->ud, row->m, row->n, step);
            if (s != FG_OK) return fg_error_wrap(s, "%s: log_metrics", name);
        }
        if (lg->ops.save) {
            fg_status s = lg->ops.save(lg->ud);
            if (s != FG_OK) return fg_error_wrap(s, "%s: save", name);
        }
    }
    return FG_OK;
}

fg_status fg__loggers_hparams(fg_trainer *t) {
    if (!loggers_on(t)) return FG_OK;
    for (int i = 0; i < t->nloggers; i++) {
        fg_logger *lg = t->loggers[i];
        if (!lg->ops.log_hyperparams) continue;
        fg_status s =
            lg->ops.log_hyperparams(lg->ud, t->m.hparams, t->m.hparams ? t->m.nhparams : 0);
        if (s != FG_OK)
            return fg_error_wrap(s, "%s: log_hyperparams", lg->ops.name ? lg->ops.name : "logger");
    }
    return FG_OK;
}

fg_status fg__loggers_finalize(fg_trainer *t, const char *status) {
    if (!loggers_on(t)) return FG_OK;
    fg_status first = FG_OK;
    for (int i = 0; i < t->nloggers; i++) {
        fg_logger *lg = t->loggers[i];
        if (!lg->ops.finalize) continue;
        fg_status s = lg->ops.finalize(lg->ud, status);
        if (s != FG_OK && first == FG_OK)
            first = fg_error_wrap(s, "%s: finalize", lg->ops.name ? lg->ops.name : "logger");
    }
    return first;
}

const char *fg__logger_version(const fg_trainer *t) {
    if (!t->nloggers || t->fast_dev_run || !t->loggers[0]->ops.version) return NULL;
    return t->loggers[0]->ops.version(t->loggers[0]->ud);
}

/* -------------------------------------------------------- checkpoint form */

/* One line per result: hook, name (with %, tab and newline escaped),
 * flags, reduce_fx, epoch_set, acc and w as hex floats (exact). */
static void escape(const char *s, char *out, size_t cap) {
    size_t k = 0;
    for (; *s && k + 4 < cap; s++) {
        if (*s == '%' || *s == '\t' || *s == '\n')
            k += (size_t)snprintf(out + k, cap - k, "%%%02X", (unsigned char)*s);
        else out[k++] = *s;
    }
    out[k] = '\0';
}

static void unescape(char *s) {
    char *w = s;
    for (char *p = s; *p; p++) {
        if (*p == '%' && p[1] && p[2]) {
            char hex[3] = {p[1], p[2], 0};
            *w++ = (char)strtol(hex, NULL, 16);
            p += 2;
        } else {
            *w++ = *p;
        }
    }
    *w = '\0';
}

char *fg__results_encode(const fg__results *r) {
    size_t cap = 64 + (size_t)r->n * 1400, k = 0;
    char *out = fg_alloc(cap);
    if (!out) return NULL;
    out[0] = '\0';
    for (int64_t i = 0; i < r->n; i++) {
        const fg__result *e = &r->r[i];
        char name[1100];
        escape(e->name, name, sizeof name);
        int flags = e->on_step | e->on_epoch << 1 | e->prog_bar << 2 | e->logger << 3 |
                    e->sync << 4 | e->rank_zero_only << 5 | e->epoch_set << 6;
        k += (size_t)snprintf(out + k, cap - k, "%s\t%s\t%d\t%d\t%a\t%a\n", e->hook, name, flags,
                              (int)e->reduce, e->acc, e->w);
    }
    return out;
}

fg_status fg__results_decode(fg__results *r, const char *s) {
    fg__results_reset(r);
    char *copy = fg_strdup(s ? s : "");
    if (!copy) return FG_ENOMEM;
    fg_status st = FG_OK;
    char *save = NULL;
    for (char *line = strtok_r(copy, "\n", &save); line && st == FG_OK;
         line = strtok_r(NULL, "\n", &save)) {
        char *f[6];
        int nf = 0;
        char *save2 = NULL;
        for (char *p = strtok_r(line, "\t", &save2); p && nf < 6; p = strtok_r(NULL, "\t", &save2))
            f[nf++] = p;
        const char *hook = nf == 6 ? fg__intern_hook(f[0]) : NULL;
        if (!hook) {
            st = fg_error(FG_EFORMAT, "checkpoint: trainer.results has a malformed line");
            break;
        }
        if (r->n == r->cap) {
            int64_t cap = r->cap ? 2 * r->cap : 16;
            fg__result *p = fg_realloc(r->r, (size_t)cap * sizeof *p);
            if (!p) {
                st = FG_ENOMEM;
                break;
            }
            r->r = p;
            r->cap = cap;
        }
        fg__result *e = &r->r[r->n];
        memset(e, 0, sizeof *e);
        unescape(f[1]);
        if (!(e->name = fg_strdup(f[1]))) {
            st = FG_ENOMEM;
            break;
        }
        int flags = atoi(f[2]);
        e->hook = hook;
        e->on_step = flags & 1;
        e->on_epoch = flags >> 1 & 1;
        e->prog_bar = flags >> 2 & 1;
        e->logger = flags >> 3 & 1;
        e->sync = flags >> 4 & 1;
        e->rank_zero_only = flags >> 5 & 1;
        e->epoch_set = flags >> 6 & 1;
        e->dirty = e->epoch_set;
        e->reduce = (fg_reduce_fx)atoi(f[3]);
        e->acc = strtod(f[4], NULL);
        e->w = strtod(f[5], NULL);
        r->n++;
    }
    fg_free(copy);
    return st;
}
