/* Binary AUROC (TorchMetrics' thresholds=None: exact, from every score
 * kept): the scores and labels of every update, gathered from every rank at
 * compute, sorted by score, and the area under the ROC curve by the
 * trapezoid rule over the distinct thresholds (scikit-learn's
 * roc_auc_score; tied scores make one point). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "metrics_impl.h"

fg_status fg__tm_auroc_update(fg_tmetric *m, const fg_tensor *preds, const fg_tensor *target) {
    int64_t n = fg_tensor_numel(target);
    if (fg_tensor_numel(preds) != n)
        return fg_error(FG_EINVAL, "AUROC update: %lld scores for %lld targets",
                        (long long)fg_tensor_numel(preds), (long long)n);
    bool sig = false;
    for (int64_t i = 0; i < n; i++) {
        double p = fg_tensor_get(preds, i), t = fg_tensor_get(target, i);
        if (isnan(p)) return fg_error(FG_EINVAL, "AUROC update: preds[%lld] is NaN", (long long)i);
        if (p < 0 || p > 1) sig = true;
        if (m->o.has_ignore_index && t == (double)m->o.ignore_index) continue;
        if (t != 0 && t != 1)
            return fg_error(FG_EINVAL, "AUROC update: target[%lld] = %g: expected 0 or 1",
                            (long long)i, t);
    }
    if (m->n + n > m->cap) {
        int64_t cap = m->cap ? m->cap : 256;
        while (cap < m->n + n) cap *= 2;
        double *s = fg_realloc(m->scores, sizeof(double) * (size_t)cap);
        if (s) m->scores = s;
        double *l = s ? fg_realloc(m->labels, sizeof(double) * (size_t)cap) : NULL;
        if (l) m->labels = l;
        if (!s || !l) return fg_error(FG_ENOMEM, "AUROC update: %lld scores", (long long)cap);
        m->cap = cap;
    }
    for (int64_t i = 0; i < n; i++) {
        double p = fg_tensor_get(preds, i), t = fg_tensor_get(target, i);
        if (m->o.has_ignore_index && t == (double)m->o.ignore_index) continue;
        m->scores[m->n] = sig ? 1 / (1 + exp(-p)) : p;
        m->labels[m->n++] = t;
        m->count++;
    }
    return FG_OK;
}

typedef struct pair {
    double s, l;
} pair;

static int by_score_desc(const void *a, const void *b) {
    double x = ((const pair *)a)->s, y = ((const pair *)b)->s;
    return (x < y) - (x > y);
}

fg_status fg__tm_auroc_compute(fg_tmetric *m, double *out) {
    fg_comm *c = m->o.no_sync_on_compute ? NULL : m->o.comm;
    int world = c ? fg_comm_size(c) : 1;
    int64_t *counts = fg_calloc((size_t)world, sizeof *counts), total = m->n;
    if (!counts) return fg_error(FG_ENOMEM, "AUROC compute");
    counts[c ? fg_comm_rank(c) : 0] = m->n;
    fg_status st = FG_OK;
    if (world > 1) {
        st = fg_comm_allreduce(c, counts, counts, world, FG_I64, FG_REDUCE_OP_SUM);
        total = 0;
        for (int r = 0; r < world; r++) total += counts[r];
    }
    double *s = fg_alloc(sizeof(double) * (size_t)(total ? total : 1));
    double *l = fg_alloc(sizeof(double) * (size_t)(total ? total : 1));
    pair *p = fg_alloc(sizeof(pair) * (size_t)(total ? total : 1));
    if (st == FG_OK && (!s || !l || !p))
        st = fg_error(FG_ENOMEM, "AUROC compute: %lld scores", (long long)total);
    if (st == FG_OK && world > 1) {
        st = fg_comm_allgatherv(c, m->scores, m->n, s, counts, NULL, FG_F64);
        if (st == FG_OK) st = fg_comm_allgatherv(c, m->labels, m->n, l, counts, NULL, FG_F64);
        if (st != FG_OK) st = fg_error_wrap(st, "AUROC compute: the ranks' scores");
    } else if (st == FG_OK && total) {
        memcpy(s, m->scores, sizeof(double) * (size_t)total);
        memcpy(l, m->labels, sizeof(double) * (size_t)total);
    }
    if (st == FG_OK) {
        double pos = 0, neg = 0;
        for (int64_t i = 0; i < total; i++) {
            p[i] = (pair){s[i], l[i]};
            pos += l[i];
        }
        neg = (double)total - pos;
        qsort(p, (size_t)total, sizeof *p, by_score_desc);
        /* (fpr, tpr) at each distinct threshold, from (0, 0) */
        double tp = 0, fp = 0, area = 0, x0 = 0, y0 = 0;
        for (int64_t i = 0; i < total;) {
            int64_t j = i;
            while (j < total && p[j].s == p[i].s) {
                tp += p[j].l;
                fp += 1 - p[j].l;
                j++;
            }
            double x = neg > 0 ? fp / neg : 0, y = pos > 0 ? tp / pos : 0;
            area += (x - x0) * (y + y0) / 2;
            x0 = x;
            y0 = y;
            i = j;
        }
        /* one class only: TorchMetrics warns and gives 0 */
        *out = pos > 0 && neg > 0 ? area : 0;
    }
    fg_free(counts);
    fg_free(s);
    fg_free(l);
    fg_free(p);
    return st;
}
