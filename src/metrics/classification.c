/* The classification metrics (Accuracy, Precision, Recall, F1Score,
 * ConfusionMatrix) as TorchMetrics' task wrappers compute them: each batch
 * turned into (target, predicted class) pairs, counted in a confusion
 * matrix (and, for Accuracy's top_k, each class's hits and support); the
 * values are ratios of those counts, micro (over all samples) or macro
 * (the mean over the classes present, TorchMetrics' weights). */
#include <math.h>

#include "metrics_impl.h"

/* preds as (N, C) scores, or N labels */
typedef struct cls_in {
    int64_t N, C;
    bool scores, sigmoid;
} cls_in;

static bool ignored(const fg_tmetric *m, double t) {
    return m->o.has_ignore_index && t == (double)m->o.ignore_index;
}

static FG_MUST_USE fg_status check(fg_tmetric *m, const fg_tensor *preds, const fg_tensor *target,
                                   cls_in *in) {
    const char *name = fg_tmetric_name(m);
    int64_t N = fg_tensor_numel(target), np = fg_tensor_numel(preds), C = m->C;
    *in = (cls_in){.N = N, .C = C};
    bool binary = m->o.task == FG_TM_TASK_BINARY;
    if (!binary && np == N * C && fg_tensor_ndim(preds) >= 2 &&
        fg_tensor_dim(preds, fg_tensor_ndim(preds) - 1) == C && C != 1)
        in->scores = true;
    else if (np != N)
        return fg_error(
            FG_EINVAL, "%s update: preds of %lld elements for %lld targets: expected %s", name,
            (long long)np, (long long)N,
            binary ? "one per target" : "one label per target or (N, num_classes) scores");
    if (!in->scores && m->o.top_k > 1)
        return fg_error(FG_EINVAL, "%s update: top_k = %lld needs (N, %lld) scores, not labels",
                        name, (long long)m->o.top_k, (long long)C);
    bool fl = fg_dtype_is_float(fg_tensor_dtype(preds));
    for (int64_t i = 0; i < np; i++) {
        double p = fg_tensor_get(preds, i);
        if (isnan(p))
            return fg_error(FG_EINVAL, "%s update: preds[%lld] is NaN", name, (long long)i);
        if (binary && fl && (p < 0 || p > 1)) in->sigmoid = true;
        if (!in->scores && !(binary && fl) && (p != floor(p) || p < 0 || p >= (double)C))
            return fg_error(FG_EINVAL, "%s update: preds[%lld] = %g: expected a class in [0, %lld)",
                            name, (long long)i, p, (long long)C);
    }
    for (int64_t i = 0; i < N; i++) {
        double t = fg_tensor_get(target, i);
        if (ignored(m, t)) continue;
        if (!(t == floor(t) && t >= 0 && t < (double)C))
            return fg_error(
                FG_EINVAL, "%s update: target[%lld] = %g: expected a class in [0, %lld)%s", name,
                (long long)i, t, (long long)C, m->o.has_ignore_index ? " or ignore_index" : "");
    }
    return FG_OK;
}

/* the predicted class of sample i, and whether class t is among the top_k */
static int64_t predicted(const fg_tmetric *m, const fg_tensor *preds, const cls_in *in, int64_t i,
                         int64_t t, bool *hit) {
    if (!in->scores) {
        double p = fg_tensor_get(preds, i);
        int64_t c;
        if (m->o.task == FG_TM_TASK_BINARY && fg_dtype_is_float(fg_tensor_dtype(preds))) {
            if (in->sigmoid) p = 1 / (1 + exp(-p));
            c = p > m->o.threshold;
        } else {
            c = (int64_t)p;
        }
        *hit = c == t;
        return c;
    }
    int64_t C = in->C, best = 0, above = 0;
    double bv = fg_tensor_get(preds, i * C), tv = fg_tensor_get(preds, i * C + t);
    for (int64_t c = 1; c < C; c++) {
        double v = fg_tensor_get(preds, i * C + c);
        if (v > bv) {
            bv = v;
            best = c;
        }
    }
    /* t is in the top k when fewer than k scores beat it (ties: the lower
     * class first, as a stable sort) */
    for (int64_t c = 0; c < C; c++) {
        double v = fg_tensor_get(preds, i * C + c);
        above += v > tv || (v == tv && c < t);
    }
    *hit = above < m->o.top_k;
    return best;
}

fg_status fg__tm_class_update(fg_tmetric *m, const fg_tensor *preds, const fg_tensor *target) {
    cls_in in;
    FG_TRY(check(m, preds, target, &in));
    int64_t C = m->C;
    double *cm = m->st, *hits = m->st + C * C, *support = hits + C;
    for (int64_t i = 0; i < in.N; i++) {
        double tv = fg_tensor_get(target, i);
        if (ignored(m, tv)) continue;
        int64_t t = (int64_t)tv;
        bool hit;
        int64_t p = predicted(m, preds, &in, i, t, &hit);
        cm[t * C + p] += 1;
        hits[t] += hit;
        support[t] += 1;
        m->count++;
    }
    return FG_OK;
}

static double safe_div(double a, double b) { return b == 0 ? 0 : a / b; }

double fg__tm_class_value(const fg_tmetric *m, const double *s) {
    int64_t C = m->C;
    const double *cm = s, *hits = s + C * C, *support = hits + C;
    double total = 0, trace = 0, all_hits = 0;
    for (int64_t c = 0; c < C; c++) {
        trace += cm[c * C + c];
        all_hits += hits[c];
        for (int64_t k = 0; k < C; k++) total += cm[c * C + k];
    }
    if (m->kind == FG__M_CONFUSION) return cm[0];
    bool binary = m->o.task == FG_TM_TASK_BINARY;
    if (m->kind == FG__M_ACCURACY && (binary || m->o.average == FG_TM_AVERAGE_MICRO))
        return binary ? safe_div(trace, total) : safe_div(all_hits, total);
    /* per class: tp, fp, fn */
    double sum = 0, weights = 0, stp = 0, sfp = 0, sfn = 0;
    for (int64_t c = binary ? 1 : 0; c < C; c++) {
        double tp = cm[c * C + c], row = 0, col = 0;
        for (int64_t k = 0; k < C; k++) {
            row += cm[c * C + k];
            col += cm[k * C + c];
        }
        double fp = col - tp, fn = row - tp, v;
        stp += tp;
        sfp += fp;
        sfn += fn;
        switch (m->kind) {
        case FG__M_ACCURACY: v = safe_div(hits[c], support[c]); break;
        case FG__M_PRECISION: v = safe_div(tp, tp + fp); break;
        case FG__M_RECALL: v = safe_div(tp, tp + fn); break;
        default: v = safe_div(2 * tp, 2 * tp + fp + fn); break;
        }
        bool present = m->o.top_k > 1 ? support[c] > 0 : tp + fp + fn > 0;
        if (present || binary) {
            sum += v;
            weights += 1;
        }
    }
    if (binary || m->o.average == FG_TM_AVERAGE_MACRO) return binary ? sum : safe_div(sum, weights);
    switch (m->kind) { /* micro */
    case FG__M_PRECISION: return safe_div(stp, stp + sfp);
    case FG__M_RECALL: return safe_div(stp, stp + sfn);
    default: return safe_div(2 * stp, 2 * stp + sfp + sfn);
    }
}
