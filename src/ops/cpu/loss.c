/* Cross-entropy of logits (N, V) against i32 targets (N), fused: the loss
 * of a row is logsumexp(x) - x[target], with the max subtracted before exp,
 * so no softmax or log-softmax tensor is ever made, and backward recomputes
 * softmax(x) row by row instead of reading a saved one.
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
 * call, with the same bits; the loops below are the f64 kernels and the
 * scalar path. */
#include "cpu_impl.h"
#include "vmath.h"

static fg_status check(const char *kernel, const fg_tensor *logits, const fg_tensor *targets,
                       int64_t ignore_index, int64_t *count) {
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

fg_status fg__cpu_cross_entropy_fwd(const fg_tensor *logits, const fg_tensor *targets,
                                    int64_t ignore_index, fg_tensor *loss, int64_t *count) {
    int64_t c;
    FG_TRY(check("cross_entropy_fwd", logits, targets, ignore_index, &c));
    if (loss->numel != 1 || loss->dtype != logits->dtype) {
        char s[96];
        return fg_error(FG_EINVAL, "cross_entropy_fwd: loss %s: expected one %s element",
                        fg_tensor_describe(loss, s, sizeof s), fg_dtype_name(logits->dtype));
    }
    int64_t N = logits->shape[0], V = logits->shape[1], work = logits->numel;
    const int32_t *t = targets->data;
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    double *row = fg_step_alloc(sizeof(double) * (size_t)(N ? N : 1)); /* (N) */
    if (!row) return fg_error_wrap(FG_ENOMEM, "cross_entropy_fwd: %lld row losses", (long long)N);
    if (logits->dtype == FG_F32 && vk->ce_lse_rows && V <= FG_CE_BLOCK_N) {
        const float *px = logits->data;
        int64_t per = fg__rows_per_call(N, FG_CE_BLOCK), nb = (N + per - 1) / per;
FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
for (int64_t b = 0; b < nb; b++) {
    int64_t i0 = b * per, rows = N - i0 < per ? N - i0 : per;
    vk->ce_lse_rows(px + i0 * V, V, rows, row + i0);
    for (int64_t i = i0; i < i0 + rows; i++)
        row[i] = t[i] == ignore_index ? 0 : row[i] - (double)px[i * V + t[i]];
}
    } else if (logits->dtype == FG_F32 && vk->ce_fwd_row) {
        const float *px = logits->data;
FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
for (int64_t i = 0; i < N; i++)
    row[i] = t[i] == ignore_index ? 0 : vk->ce_fwd_row(px + i * V, V, t[i]);
    } else
        FG_FLOAT_DISPATCH("cross_entropy_fwd", logits->dtype, {
            const T *px = logits->data;
        FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
        for (int64_t i = 0; i < N; i++) {
            if (t[i] == ignore_index) {
                row[i] = 0;
                continue;
            }
            const T *xr = px + i * V; /* (V) */
            T m = xr[0];
            FG_PRAGMA(omp simd reduction(max : m))
            for (int64_t j = 1; j < V; j++) m = xr[j] > m ? xr[j] : m;
            double s = FG_EXPSUM(xr, V, m, (T *)NULL);
            row[i] = (double)m + log(s) - (double)xr[t[i]];
        }
        });
    double sum = 0;
    for (int64_t i = 0; i < N; i++) sum += row[i];
    double v = c ? sum / (double)c : 0.0;
    if (loss->dtype == FG_F32) *(float *)loss->data = (float)v;
    else *(double *)loss->data = v;
    if (count) *count = c;
    return FG_OK;
}

fg_status fg__cpu_cross_entropy_bwd(const fg_tensor *logits, const fg_tensor *targets,
                                    int64_t ignore_index, double dloss, int64_t count,
                                    fg_tensor *dlogits) {
    int64_t c;
    FG_TRY(check("cross_entropy_bwd", logits, targets, ignore_index, &c));
    FG_TRY(fg__expect_same_shape("cross_entropy_bwd", logits, dlogits));
    FG_TRY(fg__expect_contiguous("cross_entropy_bwd", dlogits));
    if (count <= 0) return FG_OK; /* no row counted: the loss is the constant 0 */
    int64_t N = logits->shape[0], V = logits->shape[1], work = logits->numel;
    const int32_t *t = targets->data;
    double scale = dloss / (double)count;
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    if (logits->dtype == FG_F32 && vk->ce_bwd_rows && V <= FG_CE_BLOCK_N) {
        const float *px = logits->data;
        float *pd = dlogits->data;
        int64_t per = fg__rows_per_call(N, FG_CE_BLOCK), nb = (N + per - 1) / per;
FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
for (int64_t b = 0; b < nb; b++) {
    int64_t i0 = b * per, rows = N - i0 < per ? N - i0 : per;
    vk->ce_bwd_rows(px + i0 * V, pd + i0 * V, V, rows, t + i0, ignore_index, scale);
}
return FG_OK;
    }
    if (logits->dtype == FG_F32 && vk->ce_bwd_row) {
        const float *px = logits->data;
        float *pd = dlogits->data;
FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
for (int64_t i = 0; i < N; i++)
    if (t[i] != ignore_index) vk->ce_bwd_row(px + i * V, pd + i * V, V, t[i], scale);
return FG_OK;
    }
    FG_FLOAT_DISPATCH("cross_entropy_bwd", logits->dtype, {
        const T *px = logits->data;
        T *pd = dlogits->data;
        FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
        for (int64_t i = 0; i < N; i++) { /* dx += scale * (softmax(x) - onehot(t)) */
            if (t[i] == ignore_index) continue;
            const T *xr = px + i * V;
            T *dr = pd + i * V, m = xr[0];
            FG_PRAGMA(omp simd reduction(max : m))
            for (int64_t j = 1; j < V; j++) m = xr[j] > m ? xr[j] : m;
            double s = FG_EXPSUM(xr, V, m, (T *)NULL);
            T k = (T)(scale / s);
            FG_SIMD
            for (int64_t j = 0; j < V; j++) dr[j] += k * FG_EXP(xr[j] - m);
            dr[t[i]] -= (T)scale;
        }
    });
    return FG_OK;
}
