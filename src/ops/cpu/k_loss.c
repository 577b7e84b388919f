/* The loss kernels: the elementwise losses (fg_loss_op: MSE, L1, smooth
 * L1, Huber, BCE, BCE with logits, KL divergence) unreduced, forward and
 * backward (into the input and, where asked, the target), and the rows of
 * the negative log-likelihood with class weights, ignore_index and label
 * smoothing. The formulas follow PyTorch 1.13's CPU kernels (BCE's logs
 * clamped at -100 and its backward's denominator at 1e-12; BCE with logits
 * through max(-x, 0); kl_div as xlogy(t, t) - t x). f32 and f64, contiguous
 * tensors of one shape; the reductions are left to the caller. */
#include <math.h>

#include "k_ops.h"

static FG_MUST_USE fg_status check_same(const char *kernel, const fg_tensor *x,
                                        const fg_tensor *t) {
    FG_TRY(fg__expect_same_shape(kernel, x, t));
    return fg__expect_contiguous(kernel, t);
}

/* log(1 + exp(v)) without overflow */
static inline double softplus(double v) { return v > 0 ? v + log1p(exp(-v)) : log1p(exp(v)); }

fg_status fg__cpu_pointwise_loss_fwd(fg_loss_op op, const fg_tensor *x, const fg_tensor *t,
                                     const fg_tensor *w, double p, fg_tensor *y) {
    FG_TRY(check_same("pointwise_loss_fwd", x, x));
    FG_TRY(check_same("pointwise_loss_fwd", x, t));
    FG_TRY(check_same("pointwise_loss_fwd", x, y));
    if (w) FG_TRY(check_same("pointwise_loss_fwd", x, w));
    int64_t n = x->numel;
    FG_FLOAT_DISPATCH("pointwise_loss_fwd", x->dtype, {
        const T *px = x->data, *pt = t->data, *pw = w ? w->data : NULL;
        T *py = y->data;
        FG_PRAGMA(omp parallel for if (n > FG_PAR_MIN) schedule(static))
        for (int64_t i = 0; i < n; i++) {
            T v = px[i], tt = pt[i], d = v - tt, ad = d < 0 ? -d : d, r = 0;
            switch (op) {
            case FG_LOSS_MSE: r = d * d; break;
            case FG_LOSS_L1: r = ad; break;
            case FG_LOSS_SMOOTH_L1:
                r = ad < (T)p ? (T)0.5 * d * d / (T)p : ad - (T)(0.5 * p);
                break;
            case FG_LOSS_HUBER: r = ad <= (T)p ? (T)0.5 * d * d : (T)p * (ad - (T)(0.5 * p)); break;
            case FG_LOSS_BCE: {
                double l1 = fmax(log((double)v), -100.0), l0 = fmax(log1p(-(double)v), -100.0);
                r = (T)((tt - 1) * l0 - tt * l1);
                break;
            }
            case FG_LOSS_BCE_LOGITS: {
                double m = v < 0 ? -(double)v : 0.0;
                double sp = log(exp(-m) + exp(-(double)v - m)) + m; /* log(1 + exp(-v)) */
                double lw = pw ? 1 + ((double)pw[i] - 1) * tt : 1.0;
                r = (T)((1 - (double)tt) * v + lw * sp);
                break;
            }
            case FG_LOSS_KL_DIV:
                if (p != 0) r = (T)(exp((double)tt) * ((double)tt - v));
                else r = (T)((tt == 0 ? 0.0 : tt * log((double)tt)) - (double)tt * v);
                break;
            }
            py[i] = r;
        }
    });
    return FG_OK;
}

fg_status fg__cpu_pointwise_loss_bwd(fg_loss_op op, const fg_tensor *x, const fg_tensor *t,
                                     const fg_tensor *w, double p, const fg_tensor *dy,
                                     fg_tensor *dx, fg_tensor *dt) {
    FG_TRY(check_same("pointwise_loss_bwd", x, x));
    FG_TRY(check_same("pointwise_loss_bwd", x, t));
    FG_TRY(check_same("pointwise_loss_bwd", x, dy));
    if (w) FG_TRY(check_same("pointwise_loss_bwd", x, w));
    if (dx) FG_TRY(check_same("pointwise_loss_bwd", x, dx));
    if (dt) FG_TRY(check_same("pointwise_loss_bwd", x, dt));
    int64_t n = x->numel;
    FG_FLOAT_DISPATCH("pointwise_loss_bwd", x->dtype, {
        const T *px = x->data, *pt = t->data, *pw = w ? w->data : NULL, *pg = dy->data;
        T *pdx = dx ? dx->data : NULL, *pdt = dt ? dt->data : NULL;
        FG_PRAGMA(omp parallel for if (n > FG_PAR_MIN) schedule(static))
        for (int64_t i = 0; i < n; i++) {
            double v = px[i], tt = pt[i], g = pg[i], d = v - tt, gx = 0, gt = 0;
            double sg = d > 0 ? 1.0 : d < 0 ? -1.0 : 0.0;
            switch (op) {
            case FG_LOSS_MSE: gx = 2 * d * g, gt = -gx; break;
            case FG_LOSS_L1: gx = sg * g, gt = -gx; break;
            case FG_LOSS_SMOOTH_L1: gx = (fabs(d) < p ? d / p : sg) * g, gt = -gx; break;
            case FG_LOSS_HUBER: gx = (d < -p ? -p : d > p ? p : d) * g, gt = -gx; break;
            case FG_LOSS_BCE:
                gx = g * (v - tt) / fmax((1 - v) * v, 1e-12);
                gt = g * (fmax(log1p(-v), -100.0) - fmax(log(v), -100.0));
                break;
            case FG_LOSS_BCE_LOGITS: {
                double pwi = pw ? (double)pw[i] : 1.0, s = 1 / (1 + exp(-v));
                gx = g * ((pwi * tt + 1 - tt) * s - pwi * tt);
                gt = g * (pwi * softplus(-v) - softplus(v));
                break;
            }
            case FG_LOSS_KL_DIV:
                if (p != 0) {
                    double e = exp(tt);
                    gx = -e * g, gt = g * e * (tt - v + 1);
                } else {
                    gx = -tt * g, gt = g * (tt > 0 ? log(tt) + 1 - v : -v);
                }
                break;
            }
            if (pdx) pdx[i] += (T)gx;
            if (pdt) pdt[i] += (T)gt;
        }
    });
    return FG_OK;
}

/* logp (M, C), t (M) i32 in range (or ignore), w (C) or NULL */
static FG_MUST_USE fg_status check_nll(const char *kernel, const fg_tensor *logp,
                                       const fg_tensor *t, const fg_tensor *w, int64_t ignore) {
    FG_TRY(fg__expect_contiguous(kernel, logp));
    FG_TRY(fg__expect_contiguous(kernel, t));
    char a[96], b[96];
    if (logp->ndim != 2 || t->dtype != FG_I32 || t->numel != logp->shape[0])
        return fg_error(FG_EINVAL,
                        "%s: log-probabilities %s and targets %s: expected (M, C) and "
                        "i32 (M)",
                        kernel, fg_tensor_describe(logp, a, sizeof a),
                        fg_tensor_describe(t, b, sizeof b));
    int64_t C = logp->shape[1];
    if (w && (w->numel != C || w->dtype != logp->dtype || !fg_tensor_is_contiguous(w)))
        return fg_error(FG_EINVAL, "%s: class weights %s: expected (%lld) of %s", kernel,
                        fg_tensor_describe(w, a, sizeof a), (long long)C,
                        fg_dtype_name(logp->dtype));
    const int32_t *pt = t->data;
    for (int64_t m = 0; m < t->numel; m++)
        if (pt[m] != ignore && (pt[m] < 0 || pt[m] >= C))
            return fg_error(FG_EINVAL,
                            "%s: target %d (row %lld) is outside [0, %lld) and not "
                            "ignore_index %lld",
                            kernel, (int)pt[m], (long long)m, (long long)C, (long long)ignore);
    return FG_OK;
}

fg_status fg__cpu_nll_fwd(const fg_tensor *logp, const fg_tensor *t, const fg_tensor *w,
                          int64_t ignore, double eps, fg_tensor *y, double *wsum) {
    FG_TRY(check_nll("nll_fwd", logp, t, w, ignore));
    if (y->numel != t->numel || y->dtype != logp->dtype || !fg_tensor_is_contiguous(y))
        return fg_error(FG_EINVAL, "nll_fwd: the output needs one %s per target",
                        fg_dtype_name(logp->dtype));
    int64_t M = logp->shape[0], C = logp->shape[1];
    const int32_t *pt = t->data;
    double total = 0;
    FG_FLOAT_DISPATCH("nll_fwd", logp->dtype, {
        const T *pl = logp->data, *pw = w ? w->data : NULL;
        T *py = y->data;
        FG_PRAGMA(omp parallel for reduction(+ : total) if (logp->numel > FG_PAR_MIN))
        for (int64_t m = 0; m < M; m++) {
            if (pt[m] == ignore) {
                py[m] = 0;
                continue;
            }
            const T *row = pl + m * C;
            double wt = pw ? (double)pw[pt[m]] : 1.0, r = -wt * (double)row[pt[m]];
            if (eps != 0) {
                double s = 0;
                for (int64_t c = 0; c < C; c++) s += (pw ? (double)pw[c] : 1.0) * (double)row[c];
                r = (1 - eps) * r - eps / (double)C * s;
            }
            py[m] = (T)r;
            total += wt;
        }
    });
    *wsum = total;
    return FG_OK;
}

fg_status fg__cpu_nll_bwd(const fg_tensor *t, const fg_tensor *w, int64_t ignore, double eps,
                          const fg_tensor *dy, fg_tensor *dlogp) {
    FG_TRY(check_nll("nll_bwd", dlogp, t, w, ignore));
    if (dy->numel != t->numel || dy->dtype != dlogp->dtype || !fg_tensor_is_contiguous(dy))
        return fg_error(FG_EINVAL, "nll_bwd: the gradient needs one %s per target",
                        fg_dtype_name(dlogp->dtype));
    int64_t M = dlogp->shape[0], C = dlogp->shape[1];
    const int32_t *pt = t->data;
    FG_FLOAT_DISPATCH("nll_bwd", dlogp->dtype, {
        const T *pw = w ? w->data : NULL, *pg = dy->data;
        T *pd = dlogp->data;
        FG_PRAGMA(omp parallel for if (dlogp->numel > FG_PAR_MIN) schedule(static))
        for (int64_t m = 0; m < M; m++) {
            if (pt[m] == ignore) continue;
            double g = pg[m], wt = pw ? (double)pw[pt[m]] : 1.0;
            T *row = pd + m * C;
            if (eps != 0) {
                double s = -eps / (double)C * g;
                for (int64_t c = 0; c < C; c++) row[c] += (T)(s * (pw ? (double)pw[c] : 1.0));
            }
            row[pt[m]] += (T)(-(1 - eps) * wt * g);
        }
    });
    return FG_OK;
}
