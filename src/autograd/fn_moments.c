/* Sums, means, variances and standard deviations over several dims (all
 * of them when ndims is 0, as PyTorch's dim=None), keepdim as PyTorch's.
 * Built from recorded functions (sum_dim, sub, mul, scale, sqrt), so the
 * gradients come from theirs: the variance is two-pass (the mean first,
 * then the sum of squared deviations), divided by max(0, N - correction). */
#include <math.h>
#include <string.h>

#include "autograd_impl.h"

/* Normalises dims into mark[] (which dims are reduced) and returns how many
 * elements each reduced slot holds in *count; ndims 0 marks every dim. */
static FG_MUST_USE fg_status mark_dims(const char *fn, const fg_tensor *a, int ndims,
                                       const int *dims, bool *mark, int64_t *count) {
    int nd = a->ndim;
    memset(mark, 0, sizeof(bool) * FG_MAX_DIMS);
    int64_t c = 1;
    if (ndims == 0) {
        for (int d = 0; d < nd; d++) mark[d] = true;
        *count = a->numel;
        return FG_OK;
    }
    if (ndims < 0 || !dims) return fg_error(FG_EINVAL, "%s: %d dims given as NULL", fn, ndims);
    for (int k = 0; k < ndims; k++) {
        int n = nd ? nd : 1, d = dims[k] < 0 ? dims[k] + n : dims[k];
        if (d < 0 || d >= n) {
            char s[96];
            return fg_error(FG_EINVAL, "%s: dim %d is out of range for %s", fn, dims[k],
                            fg_tensor_describe(a, s, sizeof s));
        }
        if (mark[d]) return fg_error(FG_EINVAL, "%s: dim %d appears twice", fn, dims[k]);
        mark[d] = true;
        c *= nd ? a->shape[d] : 1;
    }
    *count = c;
    return FG_OK;
}

/* sum over the marked dims, kept as dims of 1 */
static fg_tensor *sum_marked(fg_tensor *a, const bool *mark) {
    for (int d = a->ndim - 1; d >= 0 && a; d--)
        if (mark[d]) a = fg_sum_dim(a, d, true);
    return a;
}

/* y (keepdim shape) reshaped without the marked dims unless keepdim */
static fg_tensor *finish(fg_tensor *y, int nd, const bool *mark, bool keepdim) {
    if (!y || keepdim || nd == 0) return y;
    int64_t shape[FG_MAX_DIMS];
    int k = 0;
    for (int d = 0; d < nd; d++)
        if (!mark[d]) shape[k++] = fg_tensor_dim(y, d);
    return fg_reshape(y, k, shape);
}

fg_tensor *fg_sum_dims(fg_tensor *a, int ndims, const int *dims, bool keepdim) {
    bool mark[FG_MAX_DIMS];
    int64_t n;
    if (fg__check_float("sum_dims", a) || mark_dims("sum_dims", a, ndims, dims, mark, &n))
        return NULL;
    if (a->ndim == 0) return fg_sum(a);
    return finish(sum_marked(a, mark), a->ndim, mark, keepdim);
}

fg_tensor *fg_mean_dims(fg_tensor *a, int ndims, const int *dims, bool keepdim) {
    bool mark[FG_MAX_DIMS];
    int64_t n;
    if (fg__check_float("mean_dims", a) || mark_dims("mean_dims", a, ndims, dims, mark, &n))
        return NULL;
    if (a->ndim == 0) return fg_mean(a);
    /* the mean of nothing is NaN (0 * inf), as PyTorch's */
    return fg_scale(finish(sum_marked(a, mark), a->ndim, mark, keepdim), 1.0 / (double)n);
}

fg_tensor *fg_var(fg_tensor *a, int ndims, const int *dims, double correction, bool keepdim) {
    bool mark[FG_MAX_DIMS];
    int64_t n;
    if (fg__check_float("var", a) || mark_dims("var", a, ndims, dims, mark, &n)) return NULL;
    bool scalar = a->ndim == 0;
    if (scalar) a = fg_reshape(a, 1, (int64_t[]){1});
    fg_tensor *m = fg_scale(sum_marked(a, mark), 1.0 / (double)n);
    fg_tensor *dev = fg_sub(a, m);
    fg_tensor *ss = sum_marked(fg_mul(dev, dev), mark);
    double den = (double)n - correction;
    fg_tensor *v = fg_scale(ss, 1.0 / (den > 0 ? den : 0.0));
    if (scalar) return v ? fg_reshape(v, 0, NULL) : NULL;
    return finish(v, a->ndim, mark, keepdim);
}

fg_tensor *fg_std(fg_tensor *a, int ndims, const int *dims, double correction, bool keepdim) {
    return fg_sqrt(fg_var(a, ndims, dims, correction, keepdim));
}
