/* What every metric shares: construction from the options, update and
 * compute dispatched to the kinds, the state summed over the ranks at
 * compute (sync_on_compute), reset, names. */
#include <math.h>
#include <string.h>

#include "metrics_impl.h"

static const char *const k_names[] = {
    [FG__M_ACCURACY] = "Accuracy",
    [FG__M_PRECISION] = "Precision",
    [FG__M_RECALL] = "Recall",
    [FG__M_F1] = "F1Score",
    [FG__M_CONFUSION] = "ConfusionMatrix",
    [FG__M_AUROC] = "AUROC",
    [FG__M_MSE] = "MeanSquaredError",
    [FG__M_MAE] = "MeanAbsoluteError",
    [FG__M_R2] = "R2Score",
    [FG__M_PERPLEXITY] = "Perplexity",
};

bool fg__tm_is_classification(fg__mk k) { return k <= FG__M_CONFUSION; }

fg_tmetric *fg__tm_alloc(fg__mk kind, const fg_tmetric_opts *opts, int64_t nst) {
    fg_tmetric *m = fg_calloc(1, sizeof *m);
    if (!m) return NULL;
    m->kind = kind;
    m->o = opts ? *opts : (fg_tmetric_opts){0};
    m->nst = nst;
    m->st = fg_calloc((size_t)(nst ? nst : 1), sizeof *m->st);
    if (!m->st) {
        fg_free(m);
        fg_error(FG_ENOMEM, "%s: a state of %lld numbers", k_names[kind], (long long)nst);
        return NULL;
    }
    return m;
}

/* the classification metrics: a C x C confusion matrix, then per class the
 * top-k hits and the support */
static fg_tmetric *classification(fg__mk kind, const fg_tmetric_opts *opts) {
    fg_tmetric_opts o = opts ? *opts : (fg_tmetric_opts){0};
    const char *name = k_names[kind];
    if (o.task != FG_TM_TASK_BINARY && o.task != FG_TM_TASK_MULTICLASS) {
        fg_error(FG_EINVAL, "%s: task %d: expected FG_TM_TASK_BINARY or FG_TM_TASK_MULTICLASS",
                 name, (int)o.task);
        return NULL;
    }
    if (o.task == FG_TM_TASK_MULTICLASS && (o.num_classes < 2 || o.num_classes > (1 << 16))) {
        fg_error(FG_EINVAL, "%s(task=\"multiclass\"): num_classes = %lld: expected 2 .. 65536",
                 name, (long long)o.num_classes);
        return NULL;
    }
    if (o.top_k == 0) o.top_k = 1;
    if (o.top_k < 1 || (o.task == FG_TM_TASK_MULTICLASS && o.top_k > o.num_classes) ||
        (o.top_k > 1 && (o.task == FG_TM_TASK_BINARY || kind != FG__M_ACCURACY))) {
        fg_error(FG_EINVAL,
                 "%s: top_k = %lld: expected 1 .. num_classes (%lld), and only for a multiclass "
                 "Accuracy",
                 name, (long long)o.top_k, (long long)o.num_classes);
        return NULL;
    }
    if (o.threshold == 0) o.threshold = 0.5;
    if (!(o.threshold > 0 && o.threshold < 1)) {
        fg_error(FG_EINVAL, "%s: threshold = %g: expected a value in (0, 1)", name, o.threshold);
        return NULL;
    }
    if (o.average != FG_TM_AVERAGE_MICRO && o.average != FG_TM_AVERAGE_MACRO) {
        fg_error(FG_EINVAL, "%s: average %d: expected FG_TM_AVERAGE_MICRO or FG_TM_AVERAGE_MACRO",
                 name, (int)o.average);
        return NULL;
    }
    int64_t C = o.task == FG_TM_TASK_BINARY ? 2 : o.num_classes;
    fg_tmetric *m = fg__tm_alloc(kind, &o, C * C + 2 * C);
    if (m) m->C = C;
    return m;
}

fg_tmetric *fg_accuracy_new(const fg_tmetric_opts *o) { return classification(FG__M_ACCURACY, o); }
fg_tmetric *fg_precision_new(const fg_tmetric_opts *o) {
    return classification(FG__M_PRECISION, o);
}
fg_tmetric *fg_recall_new(const fg_tmetric_opts *o) { return classification(FG__M_RECALL, o); }
fg_tmetric *fg_f1_score_new(const fg_tmetric_opts *o) { return classification(FG__M_F1, o); }
fg_tmetric *fg_confusion_matrix_new(const fg_tmetric_opts *o) {
    return classification(FG__M_CONFUSION, o);
}

fg_tmetric *fg_auroc_new(const fg_tmetric_opts *o) {
    if (o && o->task != FG_TM_TASK_BINARY) {
        fg_error(FG_EINVAL, "AUROC: task %d: only task=\"binary\" (FG_TM_TASK_BINARY) is supported",
                 (int)o->task);
        return NULL;
    }
    fg_tmetric_opts b = o ? *o : (fg_tmetric_opts){0};
    b.task = FG_TM_TASK_BINARY;
    return fg__tm_alloc(FG__M_AUROC, &b, 0);
}

fg_tmetric *fg_mean_squared_error_new(const fg_tmetric_opts *o) {
    return fg__tm_alloc(FG__M_MSE, o, 2);
}
fg_tmetric *fg_mean_absolute_error_new(const fg_tmetric_opts *o) {
    return fg__tm_alloc(FG__M_MAE, o, 2);
}
fg_tmetric *fg_r2_score_new(const fg_tmetric_opts *o) { return fg__tm_alloc(FG__M_R2, o, 4); }
fg_tmetric *fg_perplexity_new(const fg_tmetric_opts *o) {
    return fg__tm_alloc(FG__M_PERPLEXITY, o, 2);
}

void fg_tmetric_free(fg_tmetric *m) {
    if (!m) return;
    fg_free(m->st);
    fg_free(m->scores);
    fg_free(m->labels);
    fg_free(m);
}

fg_status fg_tmetric_update(fg_tmetric *m, const fg_tensor *preds, const fg_tensor *target) {
    if (!m || !preds || !target)
        return fg_error(FG_EINVAL, "tmetric_update: NULL metric, preds or target");
    if (fg__tm_is_classification(m->kind)) return fg__tm_class_update(m, preds, target);
    if (m->kind == FG__M_AUROC) return fg__tm_auroc_update(m, preds, target);
    return fg__tm_reg_update(m, preds, target);
}

/* the state summed over the ranks into s (nst numbers), or this rank's */
static FG_MUST_USE fg_status synced(fg_tmetric *m, double *s) {
    memcpy(s, m->st, sizeof(double) * (size_t)m->nst);
    if (!m->o.comm || m->o.no_sync_on_compute || fg_comm_size(m->o.comm) == 1) return FG_OK;
    fg_status st = fg_comm_allreduce(m->o.comm, s, s, m->nst, FG_F64, FG_REDUCE_OP_SUM);
    return st == FG_OK ? FG_OK
                       : fg_error_wrap(st, "%s compute: the ranks' states", k_names[m->kind]);
}

fg_status fg_tmetric_compute(fg_tmetric *m, double *out) {
    if (!m || !out) return fg_error(FG_EINVAL, "tmetric_compute: NULL metric or out");
    if (m->kind == FG__M_AUROC) return fg__tm_auroc_compute(m, out);
    double stack[64], *s = m->nst <= 64 ? stack : fg_alloc(sizeof(double) * (size_t)m->nst);
    if (!s) return fg_error(FG_ENOMEM, "%s compute", k_names[m->kind]);
    fg_status st = synced(m, s);
    if (st == FG_OK) {
        if (fg__tm_is_classification(m->kind)) *out = fg__tm_class_value(m, s);
        else st = fg__tm_reg_value(m, s, out);
    }
    if (s != stack) fg_free(s);
    return st;
}

fg_status fg_tmetric_compute_matrix(fg_tmetric *m, double *out, int64_t n) {
    if (!m || !out || m->kind != FG__M_CONFUSION || n < m->C * m->C)
        return fg_error(FG_EINVAL,
                        "tmetric_compute_matrix: %s with room for %lld numbers: expected a "
                        "ConfusionMatrix and num_classes^2 (%lld)",
                        m ? k_names[m->kind] : "NULL", (long long)n,
                        (long long)(m ? m->C * m->C : 0));
    double *s = fg_alloc(sizeof(double) * (size_t)m->nst);
    if (!s) return fg_error(FG_ENOMEM, "ConfusionMatrix compute");
    fg_status st = synced(m, s);
    if (st == FG_OK) memcpy(out, s, sizeof(double) * (size_t)(m->C * m->C));
    fg_free(s);
    return st;
}

fg_status fg_tmetric_forward(fg_tmetric *m, const fg_tensor *preds, const fg_tensor *target,
                             double *batch_value) {
    if (!m || !preds || !target)
        return fg_error(FG_EINVAL, "tmetric_forward: NULL metric, preds or target");
    /* the batch alone: a twin with an empty state, on this rank only */
    fg_tmetric_opts o = m->o;
    o.comm = NULL;
    fg_tmetric *b = fg__tm_alloc(m->kind, &o, m->nst);
    if (!b) return fg_last_status();
    b->C = m->C;
    fg_status s = fg_tmetric_update(b, preds, target);
    double v = NAN;
    if (s == FG_OK) {
        fg_error_kept k;
        fg_error_keep(&k);
        if (fg_tmetric_compute(b, &v) != FG_OK) v = NAN; /* none for the batch alone */
        fg_error_restore(&k);
    }
    fg_tmetric_free(b);
    if (s == FG_OK) s = fg_tmetric_update(m, preds, target);
    if (s != FG_OK) return s;
    m->has_fwd = true;
    m->fwd = v;
    if (batch_value) *batch_value = v;
    return FG_OK;
}

bool fg_tmetric_batch_value(const fg_tmetric *m, double *out) {
    if (!m || !m->has_fwd) return false;
    if (out) *out = m->fwd;
    return true;
}

void fg_tmetric_set_comm(fg_tmetric *m, fg_comm *comm) {
    if (m) m->o.comm = comm;
}
fg_comm *fg_tmetric_comm(const fg_tmetric *m) { return m ? m->o.comm : NULL; }

void fg_tmetric_reset(fg_tmetric *m) {
    if (!m) return;
    m->has_fwd = false;
    memset(m->st, 0, sizeof(double) * (size_t)m->nst);
    m->n = 0;
    m->count = 0;
}

const char *fg_tmetric_name(const fg_tmetric *m) { return m ? k_names[m->kind] : "(null)"; }
int64_t fg_tmetric_count(const fg_tmetric *m) { return m ? m->count : 0; }
