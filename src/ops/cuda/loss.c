/* The CUDA table's losses beyond cross-entropy: the elementwise losses
 * (fg_loss_op) forward and backward and the negative log-likelihood rows,
 * on loss.cu's kernels, with the CPU table's shapes and rules (k_loss.c):
 * contiguous tensors of one shape and dtype (f32, bf16, f16; computed in
 * f64, rounded once), targets i32 checked on the device (the first row out
 * of range is FG_EINVAL naming it). */
#include "cuda_ops.h"
#include "entry.h"
#include "shared_cnn.h"

_Static_assert((int)FG_LOSS_MSE == FG__SH_MSE && (int)FG_LOSS_L1 == FG__SH_L1 &&
                   (int)FG_LOSS_SMOOTH_L1 == FG__SH_SMOOTH_L1 &&
                   (int)FG_LOSS_HUBER == FG__SH_HUBER && (int)FG_LOSS_BCE == FG__SH_BCE &&
                   (int)FG_LOSS_BCE_LOGITS == FG__SH_BCE_LOGITS &&
                   (int)FG_LOSS_KL_DIV == FG__SH_KL_DIV,
               "shared_cnn.h numbers fg_loss_op as ops.h does");

/* a and b (when given) of one shape, dtype and device, both contiguous */
static FG_MUST_USE fg_status like(const char *k, const fg_tensor *a, const fg_tensor *b) {
    if (!b) return FG_OK;
    FG_TRY(same(k, a, b));
    FG_TRY(contig(k, a));
    return contig(k, b);
}

fg_status fg__cu_pointwise_loss_fwd(fg_loss_op op, const fg_tensor *x, const fg_tensor *t,
                                    const fg_tensor *w, double p, fg_tensor *y) {
    const char *k = "pointwise_loss_fwd";
    FG_TRY(like(k, x, t));
    FG_TRY(like(k, x, w));
    FG_TRY(like(k, x, y));
    int dt;
    FG_TRY(cu_dt(k, x, &dt));
    void *st;
    FG_TRY(stream_of(k, y, &st));
    return launched(k, fg__cu_ploss_fwd(st, (int)op, dt, x->data, t->data, w ? w->data : NULL, p,
                                        y->data, x->numel));
}

fg_status fg__cu_pointwise_loss_bwd(fg_loss_op op, const fg_tensor *x, const fg_tensor *t,
                                    const fg_tensor *w, double p, const fg_tensor *dy,
                                    fg_tensor *dx, fg_tensor *dt) {
    const char *k = "pointwise_loss_bwd";
    FG_TRY(like(k, x, t));
    FG_TRY(like(k, x, w));
    FG_TRY(like(k, x, dy));
    FG_TRY(like(k, x, dx));
    FG_TRY(like(k, x, dt));
    int d;
    FG_TRY(cu_dt(k, x, &d));
    void *st;
    FG_TRY(stream_of(k, dy, &st));
    return launched(k, fg__cu_ploss_bwd(st, (int)op, d, x->data, t->data, w ? w->data : NULL, p,
                                        dy->data, dx ? dx->data : NULL, dt ? dt->data : NULL,
                                        x->numel));
}

/* logp (M, C), t (M) i32, w (C) or NULL, all on one device */
static FG_MUST_USE fg_status nll_check(const char *k, const fg_tensor *logp, const fg_tensor *t,
                                       const fg_tensor *w, int *dt) {
    char a[96], b[96];
    FG_TRY(contig(k, logp));
    FG_TRY(contig(k, t));
    if (logp->ndim != 2 || t->dtype != FG_I32 || t->numel != logp->shape[0] || t->dev != logp->dev)
        return fg_error(FG_EINVAL,
                        "%s: log-probabilities %s and targets %s: expected (M, C) and i32 (M) on "
                        "one device",
                        k, fg_tensor_describe(logp, a, sizeof a),
                        fg_tensor_describe(t, b, sizeof b));
    if (w && (w->numel != logp->shape[1] || w->dtype != logp->dtype ||
              !fg_tensor_is_contiguous(w) || w->dev != logp->dev))
        return fg_error(FG_EINVAL, "%s: class weights %s: expected (%lld) of %s", k,
                        fg_tensor_describe(w, a, sizeof a), (long long)logp->shape[1],
                        fg_dtype_name(logp->dtype));
    return cu_dt(k, logp, dt);
}

fg_status fg__cu_nll_fwd(const fg_tensor *logp, const fg_tensor *t, const fg_tensor *w,
                         int64_t ignore, double eps, fg_tensor *y, double *wsum) {
    const char *k = "nll_fwd";
    int dt;
    FG_TRY(nll_check(k, logp, t, w, &dt));
    if (y->numel != t->numel || y->dtype != logp->dtype || !fg_tensor_is_contiguous(y) ||
        y->dev != logp->dev)
        return fg_error(FG_EINVAL, "%s: the output needs one %s per target", k,
                        fg_dtype_name(logp->dtype));
    *wsum = 0;
    int64_t M = logp->shape[0], C = logp->shape[1];
    if (M == 0) return FG_OK;
    void *st;
    FG_TRY(stream_of(k, y, &st));
    size_t bytes = (sizeof(double) + sizeof(int32_t)) * (size_t)M;
    double *wrow = fg_dev_alloc(y->dev, bytes, NULL);
    double *h = wrow ? fg_calloc(1, bytes) : NULL;
    if (!h) {
        fg_status f = wrow ? fg_dev_free(y->dev, wrow) : FG_OK;
        (void)f; /* the allocation's error is the one to report */
        return fg_error(FG_ENOMEM, "%s: scratch for %lld rows", k, (long long)M);
    }
    int32_t *bad = (int32_t *)(wrow + M), *hb = (int32_t *)(h + M);
    fg_status r = launched(k, fg__cu_nll_rows_fwd(st, dt, logp->data, t->data, w ? w->data : NULL,
                                                  ignore, eps, y->data, wrow, bad, M, C));
    if (r == FG_OK) r = fg_dev_copy_d2h(y->dev, h, wrow, bytes);
    for (int64_t m = 0; r == FG_OK && m < M; m++) {
        if (hb[m]) {
            int32_t tv = -1;
            fg_status c = fg_dev_copy_d2h(y->dev, &tv, (const int32_t *)t->data + m, sizeof tv);
            r = c != FG_OK ? c
                           : fg_error(FG_EINVAL,
                                      "%s: target %d (row %lld) is outside [0, %lld) and not "
                                      "ignore_index %lld",
                                      k, (int)tv, (long long)m, (long long)C, (long long)ignore);
            break;
        }
        *wsum += h[m]; /* in row order */
    }
    fg_free(h);
    fg_status f = fg_dev_free(y->dev, wrow);
    return r != FG_OK ? r : f;
}

fg_status fg__cu_nll_bwd(const fg_tensor *t, const fg_tensor *w, int64_t ignore, double eps,
                         const fg_tensor *dy, fg_tensor *dlogp) {
    const char *k = "nll_bwd";
    int dt;
    FG_TRY(nll_check(k, dlogp, t, w, &dt));
    if (dy->numel != t->numel || dy->dtype != dlogp->dtype || !fg_tensor_is_contiguous(dy) ||
        dy->dev != dlogp->dev)
        return fg_error(FG_EINVAL, "%s: the gradient needs one %s per target", k,
                        fg_dtype_name(dlogp->dtype));
    void *st;
    FG_TRY(stream_of(k, dlogp, &st));
    /* targets out of range were refused by the forward of the same rows */
    return launched(k,
                    fg__cu_nll_rows_bwd(st, dt, t->data, w ? w->data : NULL, ignore, eps, dy->data,
                                        dlogp->data, dlogp->shape[0], dlogp->shape[1]));
}
