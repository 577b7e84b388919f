/* Cross-entropy of logits (N, V) against i32 targets (N), fused: the loss
 * of a row is logsumexp(x) - x[target], with the max subtracted before exp,
 * so no softmax or log-softmax tensor is ever made. The backward takes
 * softmax(x) = exp(x - max) / sum from each row's max and sum, which the
 * _stats forward saves ((2, N) f64: one exp an element in the backward)
 * and the plain backward recomputes first (the same values, the same
 * bits).
 *
 * Targets equal to ignore_index do not count; any other target outside
 * [0, V) is FG_EINVAL naming it (checked before any work, so a bad batch
 * leaves the outputs untouched). The mean is over the rows that count; 0
 * when none does (PyTorch would give NaN; the table's contract says 0).
 *
 * Row losses go into a scratch array and are summed in row order in double
 * after the parallel loop, so the loss is the same on any thread count.
 * f32 rows go through the vector kernels of the ISA in use (cpu_impl.h's
 * fg__vk), short rows (V <= FG_CE_BLOCK_N) a block of FG_CE_BLOCK at a
 * call, with the same bits (their log of the sum is a vector log's, to
 * rounding); the loops below are the f64 kernels and the scalar path. */
#include "cpu_impl.h"
#include "vmath.h"

static FG_MUST_USE fg_status check(const char *kernel, const fg_tensor *logits,
                                   const fg_tensor *targets, int64_t ignore_index, int64_t *count) {
    char a[96], b[96];
    FG_TRY(fg__expect_contiguous(kernel, logits));
    FG_TRY(fg__expect_contiguous(kernel, targets));
    if (logits->ndim != 2 || targets->dtype != FG_I32 || targets->ndim != 1 ||
        targets->shape[0] != logits->shape[0])
        return fg_error(FG_EINVAL,
                        "%s: logits %s and targets %s: expected logits (N, V) and "
                        "i32 targets (N)",
                        kernel, fg_tensor_describe(logits, a, sizeof a),
                        fg_tensor_describe(targets, b, sizeof b));
    int64_t N = logits->shape[0], V = logits->shape[1], c = 0;
    const int32_t *t = targets->data;
    for (int64_t i = 0; i < N; i++) {
        if (t[i] == ignore_index) continue;
        if (t[i] < 0 || t[i] >= V)
            return fg_error(FG_EINVAL,
                            "%s: target %d at row %lld is out of range for %lld classes "
                            "(expected 0..%lld, or ignore_index %lld)",
                            kernel, (int)t[i], (long long)i, (long long)V, (long long)V - 1,
                            (long long)ignore_index);
        c++;
    }
    *count = c;
    return FG_OK;
}

/* stats (2, N) f64: expected where the caller gives one */
static FG_MUST_USE fg_status check_stats(const char *kernel, const fg_tensor *stats, int64_t N) {
    if (stats->dtype != FG_F64 || stats->ndim != 2 || stats->shape[0] != 2 ||
        stats->shape[1] != N || !fg_tensor_is_contiguous(stats)) {
        char s[96];
        return fg_error(FG_EINVAL, "%s: stats %s: expected a contiguous f64 (2, %lld)", kernel,
                        fg_tensor_describe(stats, s, sizeof s), (long long)N);
    }
    return FG_OK;
}

/* m[i], s[i] = row i's max and sum of exp(x - max), every row; row[i] (when
 * not NULL) = its loss m + log(s) - x[t], 0 where t is ignore */
static FG_MUST_USE fg_status row_stats(const char *kernel, const fg_tensor *logits,
                                       const int32_t *t, int64_t ignore_index, double *m, double *s,
                                       double *row) {
    int64_t N = logits->shape[0], V = logits->shape[1], work = logits->numel;
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    if (logits->dtype == FG_F32 && vk->ce_stats_rows && V <= FG_CE_BLOCK_N) {
        const float *px = logits->data;
        int64_t per = fg__rows_per_call(N, FG_CE_BLOCK), nb = (N + per - 1) / per;
FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
for (int64_t b = 0; b < nb; b++) {
    int64_t i0 = b * per, rows = N - i0 < per ? N - i0 : per;
    vk->ce_stats_rows(px + i0 * V, V, rows, m + i0, s + i0, row ? row + i0 : NULL);
    for (int64_t i = i0; row && i < i0 + rows; i++) /* row[i] = log(s[i]) on entry */
        row[i] = t[i] == ignore_index ? 0 : m[i] + row[i] - (double)px[i * V + t[i]];
}
    } else if (logits->dtype == FG_F32 && vk->ce_stats_row) {
        const float *px = logits->data;
FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
for (int64_t i = 0; i < N; i++) {
    vk->ce_stats_row(px + i * V, V, m + i, s + i);
    if (row) row[i] = t[i] == ignore_index ? 0 : m[i] + log(s[i]) - (double)px[i * V + t[i]];
}
    } else
        FG_FLOAT_DISPATCH(kernel, logits->dtype, {
            const T *px = logits->data;
        FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
        for (int64_t i = 0; i < N; i++) {
            const T *xr = px + i * V; /* (V) */
            T mm = xr[0];
            FG_PRAGMA(omp simd reduction(max : mm))
            for (int64_t j = 1; j < V; j++) mm = xr[j] > mm ? xr[j] : mm;
            m[i] = (double)mm;
            s[i] = FG_EXPSUM(xr, V, mm, (T *)NULL);
            if (row) row[i] = t[i] == ignore_index ? 0 : m[i] + log(s[i]) - (double)xr[t[i]];
        }
        });
    return FG_OK;
}

static FG_MUST_USE fg_status ce_fwd(const char *kernel, const fg_tensor *logits,
                                    const fg_tensor *targets, int64_t ignore_index, fg_tensor *loss,
                                    int64_t *count, fg_tensor *stats) {
    int64_t c;
    FG_TRY(check(kernel, logits, targets, ignore_index, &c));
    if (loss->numel != 1 || loss->dtype != logits->dtype) {
        char s[96];
        return fg_error(FG_EINVAL, "%s: loss %s: expected one %s element", kernel,
                        fg_tensor_describe(loss, s, sizeof s), fg_dtype_name(logits->dtype));
    }
    int64_t N = logits->shape[0];
    if (stats) FG_TRY(check_stats(kernel, stats, N));
    size_t n = (size_t)(N ? N : 1);
    double *row = fg_step_alloc(sizeof(double) * n * (stats ? 1 : 3)); /* (N) [, m, s] */
    if (!row) return fg_error_wrap(FG_ENOMEM, "%s: %lld row losses", kernel, (long long)N);
    double *m = stats ? stats->data : row + n, *s = stats ? m + N : row + 2 * n;
    FG_TRY(row_stats(kernel, logits, targets->data, ignore_index, m, s, row));
    double sum = 0;
    for (int64_t i = 0; i < N; i++) sum += row[i];
    double v = c ? sum / (double)c : 0.0;
    if (loss->dtype == FG_F32) *(float *)loss->data = (float)v;
    else *(double *)loss->data = v;
    if (count) *count = c;
    return FG_OK;
}

fg_status fg__cpu_cross_entropy_fwd(const fg_tensor *logits, const fg_tensor *targets,
                                    int64_t ignore_index, fg_tensor *loss, int64_t *count) {
    return ce_fwd("cross_entropy_fwd", logits, targets, ignore_index, loss, count, NULL);
}

fg_status fg__cpu_cross_entropy_fwd_stats(const fg_tensor *logits, const fg_tensor *targets,
                                          int64_t ignore_index, fg_tensor *loss, int64_t *count,
                                          fg_tensor *stats) {
    return ce_fwd("cross_entropy_fwd_stats", logits, targets, ignore_index, loss, count, stats);
}

/* dx += scale (exp(x - m) / s - onehot(t)) from the rows' m and s */
static FG_MUST_USE fg_status ce_bwd(const char *kernel, const fg_tensor *logits, const int32_t *t,
                                    int64_t ignore_index, double scale, const double *m,
                                    const double *s, fg_tensor *dlogits) {
    int64_t N = logits->shape[0], V = logits->shape[1], work = logits->numel;
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    if (logits->dtype == FG_F32 && vk->ce_bwd_rows) {
        const float *px = logits->data;
        float *pd = dlogits->data;
        int64_t per = fg__rows_per_call(N, FG_CE_BLOCK), nb = (N + per - 1) / per;
FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
for (int64_t b = 0; b < nb; b++) {
    int64_t i0 = b * per, rows = N - i0 < per ? N - i0 : per;
    vk->ce_bwd_rows(px + i0 * V, pd + i0 * V, V, rows, t + i0, ignore_index, scale, m + i0, s + i0);
}
return FG_OK;
    }
    FG_FLOAT_DISPATCH(kernel, logits->dtype, {
        const T *px = logits->data;
        T *pd = dlogits->data;
        FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
        for (int64_t i = 0; i < N; i++) { /* dx += scale * (softmax(x) - onehot(t)) */
            if (t[i] == ignore_index) continue;
            const T *xr = px + i * V;
            T *dr = pd + i * V, mm = (T)m[i];
            T k = (T)(scale / s[i]);
            FG_SIMD
            for (int64_t j = 0; j < V; j++) dr[j] += k * FG_EXP(xr[j] - mm);
            dr[t[i]] -= (T)scale;
        }
    });
    return FG_OK;
}

/* the backward's arguments: check()'s, and dlogits contiguous, logits' shape */
static FG_MUST_USE fg_status check_bwd(const char *kernel, const fg_tensor *logits,
                                       const fg_tensor *targets, int64_t ignore_index,
                                       const fg_tensor *dlogits) {
    int64_t c;
    FG_TRY(check(kernel, logits, targets, ignore_index, &c));
    FG_TRY(fg__expect_same_shape(kernel, logits, dlogits));
    return fg__expect_contiguous(kernel, dlogits);
}

fg_status fg__cpu_cross_entropy_bwd(const fg_tensor *logits, const fg_tensor *targets,
                                    int64_t ignore_index, double dloss, int64_t count,
                                    fg_tensor *dlogits) {
    const char *k = "cross_entropy_bwd";
    FG_TRY(check_bwd(k, logits, targets, ignore_index, dlogits));
    if (count <= 0) return FG_OK; /* no row counted: the loss is the constant 0 */
    int64_t N = logits->shape[0];
    size_t n = (size_t)(N ? N : 1);
    double *m = fg_step_alloc(sizeof(double) * 2 * n); /* (2, N): the softmax recomputed */
    if (!m) return fg_error_wrap(FG_ENOMEM, "%s: %lld row maxes and sums", k, (long long)N);
    FG_TRY(row_stats(k, logits, targets->data, ignore_index, m, m + n, NULL));
    return ce_bwd(k, logits, targets->data, ignore_index, dloss / (double)count, m, m + n, dlogits);
}

fg_status fg__cpu_cross_entropy_bwd_stats(const fg_tensor *logits, const fg_tensor *targets,
                                          const fg_tensor *stats, int64_t ignore_index,
                                          double dloss, int64_t count, fg_tensor *dlogits) {
    const char *k = "cross_entropy_bwd_stats";
    FG_TRY(check_bwd(k, logits, targets, ignore_index, dlogits));
    FG_TRY(check_stats(k, stats, logits->shape[0]));
    if (count <= 0) return FG_OK;
    const double *m = stats->data;
    return ce_bwd(k, logits, targets->data, ignore_index, dloss / (double)count, m,
                  m + logits->shape[0], dlogits);
}
