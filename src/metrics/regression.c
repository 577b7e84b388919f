/* MeanSquaredError, MeanAbsoluteError and R2Score (TorchMetrics' sums:
 * squared or absolute errors and the count; R2's sum of targets, of their
 * squares and of squared residuals), and Perplexity (the summed negative
 * log-softmax of the targets and their count). */
#include <math.h>

#include "metrics_impl.h"

static FG_MUST_USE fg_status check_pairs(const fg_tmetric *m, const fg_tensor *preds,
                                         const fg_tensor *target) {
    int64_t n = fg_tensor_numel(target);
    if (fg_tensor_numel(preds) != n)
        return fg_error(FG_EINVAL,
                        "%s update: preds of %lld elements, target of %lld: expected "
                        "as many",
                        fg_tmetric_name(m), (long long)fg_tensor_numel(preds), (long long)n);
    for (int64_t i = 0; i < n; i++)
        if (isnan(fg_tensor_get(preds, i)) || isnan(fg_tensor_get(target, i)))
            return fg_error(FG_EINVAL, "%s update: a NaN at element %lld", fg_tmetric_name(m),
                            (long long)i);
    return FG_OK;
}

static FG_MUST_USE fg_status perplexity_update(fg_tmetric *m, const fg_tensor *preds,
                                               const fg_tensor *target) {
    int64_t M = fg_tensor_numel(target), nd = fg_tensor_ndim(preds);
    int64_t V = nd >= 1 ? fg_tensor_dim(preds, nd - 1) : 0;
    if (nd < 2 || V < 1 || fg_tensor_numel(preds) != M * V)
        return fg_error(FG_EINVAL,
                        "Perplexity update: preds of %lld elements (last dim %lld) for %lld "
                        "targets: expected (..., vocab) logits with one row per target",
                        (long long)fg_tensor_numel(preds), (long long)V, (long long)M);
    for (int64_t i = 0; i < M; i++) {
        double t = fg_tensor_get(target, i);
        if (m->o.has_ignore_index && t == (double)m->o.ignore_index) continue;
        if (!(t == floor(t) && t >= 0 && t < (double)V))
            return fg_error(FG_EINVAL, "Perplexity update: target[%lld] = %g: expected [0, %lld)",
                            (long long)i, t, (long long)V);
    }
    double total = 0;
    int64_t count = 0;
    for (int64_t i = 0; i < M; i++) {
        double t = fg_tensor_get(target, i);
        if (m->o.has_ignore_index && t == (double)m->o.ignore_index) continue;
        double mx = -INFINITY, z = 0;
        for (int64_t v = 0; v < V; v++) mx = fmax(mx, fg_tensor_get(preds, i * V + v));
        for (int64_t v = 0; v < V; v++) z += exp(fg_tensor_get(preds, i * V + v) - mx);
        double lp = fg_tensor_get(preds, i * V + (int64_t)t) - mx - log(z);
        if (isnan(lp))
            return fg_error(FG_EINVAL, "Perplexity update: row %lld of the logits holds a NaN",
                            (long long)i);
        total -= lp;
        count++;
    }
    m->st[0] += total;
    m->st[1] += (double)count;
    m->count += count;
    return FG_OK;
}

fg_status fg__tm_reg_update(fg_tmetric *m, const fg_tensor *preds, const fg_tensor *target) {
    if (m->kind == FG__M_PERPLEXITY) return perplexity_update(m, preds, target);
    FG_TRY(check_pairs(m, preds, target));
    int64_t n = fg_tensor_numel(target);
    double a = 0, b = 0, c = 0;
    for (int64_t i = 0; i < n; i++) {
        double p = fg_tensor_get(preds, i), t = fg_tensor_get(target, i), d = p - t;
        if (m->kind == FG__M_MSE) a += d * d;
        else if (m->kind == FG__M_MAE) a += fabs(d);
        else {
            a += t;
            b += t * t;
            c += d * d;
        }
    }
    if (m->kind == FG__M_R2) {
        m->st[0] += a;
        m->st[1] += b;
        m->st[2] += c;
        m->st[3] += (double)n;
    } else {
        m->st[0] += a;
        m->st[1] += (double)n;
    }
    m->count += n;
    return FG_OK;
}

fg_status fg__tm_reg_value(const fg_tmetric *m, const double *s, double *out) {
    switch (m->kind) {
    case FG__M_R2: {
        if (s[3] < 2)
            return fg_error(FG_ESTATE, "R2Score compute: %g samples; it needs at least two", s[3]);
        double mean = s[0] / s[3], tss = s[1] - s[0] * mean;
        *out = 1 - s[2] / tss;
        return FG_OK;
    }
    case FG__M_PERPLEXITY:
        if (s[1] == 0)
            return fg_error(FG_ESTATE, "Perplexity compute: no target counted (every update "
                                       "empty or ignored)");
        *out = exp(s[0] / s[1]);
        return FG_OK;
    default: *out = s[1] == 0 ? 0 : s[0] / s[1]; return FG_OK;
    }
}
