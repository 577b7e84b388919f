/* Layer normalisation over the last dim of x (N, C), as PyTorch's
 * layer_norm: y = (x - mean) * rstd * w + b with the biased variance and
 * rstd = 1 / sqrt(var + eps); w and b (C) may each be NULL (1 and 0).
 * Forward saves mean and rstd (N) for the backward.
 *
 * Mean and variance are two passes in double over the row (no
 * E[x^2] - E[x]^2 cancellation; the double sums cost nothing next to the
 * loads at C in the hundreds). Backward:
 *   xhat = (x - mean) * rstd,  g = dy * w,
 *   dx += rstd * (g - mean(g) - xhat * mean(g * xhat)),
 *   dw += sum over rows of dy * xhat,  db += sum over rows of dy.
 * dx is split across threads by rows; dw and db by column blocks, each
 * column summed over the rows in order in double, so the weight gradients
 * are the same on any thread count and no thread writes another's column. */
#include "cpu_impl.h"
#include "vmath.h"

/* Columns one dw/db task owns (two double blocks on its stack). */
#define LN_COLS 64

static fg_status check_vec(const char *kernel, const char *what, const fg_tensor *v,
                           const fg_tensor *x, int64_t n) {
    if (!v) return FG_OK;
    if (v->dtype != x->dtype || v->numel != n) {
        char a[96], b[96];
        return fg_error(FG_EINVAL, "%s: %s is %s, expected %lld %s elements for x %s", kernel,
                        what, fg_tensor_describe(v, a, sizeof a), (long long)n,
                        fg_dtype_name(x->dtype), fg_tensor_describe(x, b, sizeof b));
    }
    return fg__expect_contiguous(kernel, v);
}

static fg_status check_x(const char *kernel, const fg_tensor *x, int64_t *N, int64_t *C) {
    FG_TRY(fg__expect_contiguous(kernel, x));
    if (x->ndim != 2) {
        char a[96];
        return fg_error(FG_EINVAL, "%s: x %s: expected (N, C)", kernel,
                        fg_tensor_describe(x, a, sizeof a));
    }
    *N = x->shape[0];
    *C = x->shape[1];
    return FG_OK;
}

fg_status fg__cpu_layernorm_fwd(const fg_tensor *x, const fg_tensor *w, const fg_tensor *b,
                                double eps, fg_tensor *y, fg_tensor *mean, fg_tensor *rstd) {
    int64_t N, C;
    FG_TRY(check_x("layernorm_fwd", x, &N, &C));
    FG_TRY(check_vec("layernorm_fwd", "weight", w, x, C));
    FG_TRY(check_vec("layernorm_fwd", "bias", b, x, C));
    FG_TRY(fg__expect_same_shape("layernorm_fwd", x, y));
    FG_TRY(fg__expect_contiguous("layernorm_fwd", y));
    if (!mean || !rstd) return fg_error(FG_EINVAL, "layernorm_fwd: mean and rstd are required");
    FG_TRY(check_vec("layernorm_fwd", "mean", mean, x, N));
    FG_TRY(check_vec("layernorm_fwd", "rstd", rstd, x, N));
    int64_t work = x->numel;
    FG_FLOAT_DISPATCH("layernorm_fwd", x->dtype, {
        const T *px = x->data, *pw = w ? w->data : NULL, *pb = b ? b->data : NULL;
        T *py = y->data, *pm = mean->data, *pr = rstd->data;
FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
        for (int64_t i = 0; i < N; i++) {
            const T *xr = px + i * C; /* (C) */
            T *yr = py + i * C;
            double s = 0, v = 0;
FG_PRAGMA(omp simd reduction(+:s))
            for (int64_t j = 0; j < C; j++) s += xr[j];
            double mu = s / (double)C;
FG_PRAGMA(omp simd reduction(+:v))
            for (int64_t j = 0; j < C; j++) {
                double d = xr[j] - mu;
                v += d * d;
            }
            T m = (T)mu, r = (T)(1 / sqrt(v / (double)C + eps));
            pm[i] = m;
            pr[i] = r;
            if (pw && pb) {
                FG_SIMD
                for (int64_t j = 0; j < C; j++) yr[j] = (xr[j] - m) * r * pw[j] + pb[j];
            } else if (pw) {
                FG_SIMD
                for (int64_t j = 0; j < C; j++) yr[j] = (xr[j] - m) * r * pw[j];
            } else if (pb) {
                FG_SIMD
                for (int64_t j = 0; j < C; j++) yr[j] = (xr[j] - m) * r + pb[j];
            } else {
                FG_SIMD
                for (int64_t j = 0; j < C; j++) yr[j] = (xr[j] - m) * r;
            }
        }
    });
    return FG_OK;
}

fg_status fg__cpu_layernorm_bwd(const fg_tensor *x, const fg_tensor *w, const fg_tensor *mean,
                                const fg_tensor *rstd, const fg_tensor *dy, fg_tensor *dx,
                                fg_tensor *dw, fg_tensor *db) {
    int64_t N, C;
    FG_TRY(check_x("layernorm_bwd", x, &N, &C));
    FG_TRY(check_vec("layernorm_bwd", "weight", w, x, C));
    if (!mean || !rstd) return fg_error(FG_EINVAL, "layernorm_bwd: mean and rstd are required");
    FG_TRY(check_vec("layernorm_bwd", "mean", mean, x, N));
    FG_TRY(check_vec("layernorm_bwd", "rstd", rstd, x, N));
    FG_TRY(fg__expect_same_shape("layernorm_bwd", x, dy));
    FG_TRY(fg__expect_contiguous("layernorm_bwd", dy));
    if (dx) {
        FG_TRY(fg__expect_same_shape("layernorm_bwd", x, dx));
        FG_TRY(fg__expect_contiguous("layernorm_bwd", dx));
    }
    FG_TRY(check_vec("layernorm_bwd", "dweight", dw, x, C));
    FG_TRY(check_vec("layernorm_bwd", "dbias", db, x, C));
    int64_t work = x->numel;
    FG_FLOAT_DISPATCH("layernorm_bwd", x->dtype, {
        const T *px = x->data, *pg = dy->data, *pm = mean->data, *pr = rstd->data;
        const T *pw = w ? w->data : NULL;
        if (dx) {
            T *pd = dx->data;
FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
            for (int64_t i = 0; i < N; i++) {
                const T *xr = px + i * C, *gr = pg + i * C; /* (C) */
                T *dr = pd + i * C, m = pm[i], r = pr[i];
                double s1 = 0, s2 = 0;
                if (pw) {
FG_PRAGMA(omp simd reduction(+:s1, s2))
                    for (int64_t j = 0; j < C; j++) {
                        T g = gr[j] * pw[j];
                        s1 += g;
                        s2 += g * ((xr[j] - m) * r);
                    }
                    T a = (T)(s1 / (double)C), c = (T)(s2 / (double)C);
                    FG_SIMD
                    for (int64_t j = 0; j < C; j++)
                        dr[j] += r * (gr[j] * pw[j] - a - (xr[j] - m) * r * c);
                } else {
FG_PRAGMA(omp simd reduction(+:s1, s2))
                    for (int64_t j = 0; j < C; j++) {
                        s1 += gr[j];
                        s2 += gr[j] * ((xr[j] - m) * r);
                    }
                    T a = (T)(s1 / (double)C), c = (T)(s2 / (double)C);
                    FG_SIMD
                    for (int64_t j = 0; j < C; j++) dr[j] += r * (gr[j] - a - (xr[j] - m) * r * c);
                }
            }
        }
        if (dw || db) {
            T *pdw = dw ? dw->data : NULL, *pdb = db ? db->data : NULL;
            int64_t nb = (C + LN_COLS - 1) / LN_COLS;
FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
            for (int64_t blk = 0; blk < nb; blk++) {
                int64_t c0 = blk * LN_COLS, nc = FG_MIN(LN_COLS, C - c0);
                double aw[LN_COLS] = {0}, ab[LN_COLS] = {0};
                for (int64_t i = 0; i < N; i++) {
                    const T *xr = px + i * C + c0, *gr = pg + i * C + c0;
                    T m = pm[i], r = pr[i];
                    FG_SIMD
                    for (int64_t k = 0; k < nc; k++) {
                        aw[k] += (double)gr[k] * ((xr[k] - m) * r);
                        ab[k] += gr[k];
                    }
                }
                for (int64_t k = 0; k < nc; k++) {
                    if (pdw) pdw[c0 + k] += (T)aw[k];
                    if (pdb) pdb[c0 + k] += (T)ab[k];
                }
            }
        }
    });
    return FG_OK;
}
