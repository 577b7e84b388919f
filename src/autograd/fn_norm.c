/* The normalisations beside batch and layer norm: group norm, RMS norm,
 * instance norm, and batch norm with its statistics summed over ranks
 * (SyncBatchNorm). All are built from recorded functions (mean_dims, var,
 * sub, mul, rsqrt, add), so their gradients come from theirs; the running
 * statistics are updated outside the tape, as PyTorch's no-grad update.
 * The one new node is the differentiable all-reduce of SyncBatchNorm: its
 * forward sums a tensor over ranks and its backward sums the gradient over
 * ranks, which is the gradient of the sum of every rank's loss (what
 * PyTorch's SyncBatchNorm backward computes with its two all-reduces). */
#include <math.h>
#include <string.h>

#include "autograd_impl.h"

/* (1, C, 1, ...) of x's rank, for broadcasting a per-channel vector */
static void channel_shape(const fg_tensor *x, int64_t *shape) {
    for (int d = 0; d < x->ndim; d++) shape[d] = d == 1 ? x->shape[1] : 1;
}

static FG_MUST_USE fg_status check_vec(const char *fn, const fg_tensor *x, const fg_tensor *v,
                                       int64_t n, const char *what) {
    if (v && (v->numel != n || v->dtype != x->dtype)) {
        char s[96];
        return fg_error(FG_EINVAL, "%s: %s %s: expected (%lld) of %s", fn, what,
                        fg_tensor_describe(v, s, sizeof s), (long long)n, fg_dtype_name(x->dtype));
    }
    return FG_OK;
}

/* y * w + b with w, b per channel (dim 1), each may be NULL */
static fg_tensor *affine_channels(fg_tensor *y, const fg_tensor *x, fg_tensor *w, fg_tensor *b) {
    int64_t shape[FG_MAX_DIMS];
    channel_shape(x, shape);
    if (y && w) y = fg_mul(y, fg_reshape(w, x->ndim, shape));
    if (y && b) y = fg_add(y, fg_reshape(b, x->ndim, shape));
    return y;
}

/* (x - mean) * rsqrt(var + eps) */
static fg_tensor *normalise(fg_tensor *x, fg_tensor *mean, fg_tensor *var, double eps) {
    fg_tensor *e = var ? fg_scalar(x->dtype, eps) : NULL;
    return fg_mul(fg_sub(x, mean), fg_rsqrt(fg_add(var, e)));
}

/* ------------------------------------------------------------ group norm */

fg_tensor *fg_group_norm(fg_tensor *x, int64_t groups, fg_tensor *w, fg_tensor *b, double eps) {
    const char *fn = "group_norm";
    if (fg__check_float(fn, x) || !(x = fg__autocast_f32(x))) return NULL; /* autocast: f32 */
    char s[96];
    if (x->ndim < 2 || groups < 1 || x->shape[1] % groups) {
        fg_error(FG_EINVAL,
                 "%s: input %s with %lld groups: expected (N, C, ...) with C a "
                 "multiple of groups",
                 fn, fg_tensor_describe(x, s, sizeof s), (long long)groups);
        return NULL;
    }
    if (check_vec(fn, x, w, x->shape[1], "weight") || check_vec(fn, x, b, x->shape[1], "bias"))
        return NULL;
    int64_t g3[3] = {x->shape[0], groups, x->numel / (x->shape[0] * groups)};
    if (x->numel == 0) g3[2] = 0;
    fg_tensor *r = fg_reshape(x, 3, g3);
    int d2 = 2;
    fg_tensor *y =
        r ? normalise(r, fg_mean_dims(r, 1, &d2, true), fg_var(r, 1, &d2, 0, true), eps) : NULL;
    y = y ? fg_reshape(y, x->ndim, x->shape) : NULL;
    return affine_channels(y, x, w, b);
}

/* -------------------------------------------------------------- RMS norm */

fg_tensor *fg_rms_norm(fg_tensor *x, int ndims, fg_tensor *w, double eps) {
    const char *fn = "rms_norm";
    if (fg__check_float(fn, x) || !(x = fg__autocast_f32(x))) return NULL; /* autocast: f32 */
    if (ndims < 1 || ndims > x->ndim) {
        char s[96];
        fg_error(FG_EINVAL, "%s: %d normalised dims for input %s: expected 1 to its rank", fn,
                 ndims, fg_tensor_describe(x, s, sizeof s));
        return NULL;
    }
    int dims[FG_MAX_DIMS];
    int64_t n = 1;
    for (int k = 0; k < ndims; k++) {
        dims[k] = x->ndim - ndims + k;
        n *= x->shape[dims[k]];
    }
    if (check_vec(fn, x, w, n, "weight")) return NULL;
    if (eps < 0) eps = x->dtype == FG_F64 ? 2.220446049250313e-16 : 1.1920928955078125e-07;
    fg_tensor *ms = fg_mean_dims(fg_mul(x, x), ndims, dims, true);
    fg_tensor *e = ms ? fg_scalar(x->dtype, eps) : NULL;
    fg_tensor *y = fg_mul(x, fg_rsqrt(fg_add(ms, e)));
    if (y && w) y = fg_mul(y, fg_reshape(w, ndims, x->shape + x->ndim - ndims));
    return y;
}

/* --------------------------------------------------------- running stats */

/* running = (1 - momentum) running + momentum * (the batch's mean, and its
 * variance times n / (n - 1)), outside the tape; mean and var hold C values
 * (rows of `rows` values each are averaged first: instance norm's N) */
static FG_MUST_USE fg_status update_running(fg_tensor *running_mean, fg_tensor *running_var,
                                            fg_tensor *mean, fg_tensor *var, int64_t rows,
                                            int64_t n, double momentum) {
    if (!running_mean || !running_var) return FG_OK;
    bool prev = fg_set_grad_enabled(false);
    int64_t C = running_mean->numel, rc[2] = {rows, C};
    fg_tensor *m = fg_reshape(mean, 2, rc), *v = fg_reshape(var, 2, rc);
    m = fg_mean_dim(m, 0, false);
    v = fg_scale(fg_mean_dim(v, 0, false), n > 1 ? (double)n / (double)(n - 1) : INFINITY);
    fg_set_grad_enabled(prev);
    if (!m || !v) return fg_last_status();
    const fg_op_table *ops = fg__ops(mean);
    FG_TRY(ops->axpby(momentum, m, 1 - momentum, running_mean));
    return ops->axpby(momentum, v, 1 - momentum, running_var);
}

/* ---------------------------------------------------------- instance norm */

fg_tensor *fg_instance_norm(fg_tensor *x, fg_tensor *running_mean, fg_tensor *running_var,
                            fg_tensor *w, fg_tensor *b, bool use_input_stats, double momentum,
                            double eps) {
    const char *fn = "instance_norm";
    if (fg__check_float(fn, x) || !(x = fg__autocast_f32(x))) return NULL; /* autocast: f32 */
    if (x->ndim < 3) {
        char s[96];
        fg_error(FG_EINVAL, "%s: input %s: expected (N, C, spatial...)", fn,
                 fg_tensor_describe(x, s, sizeof s));
        return NULL;
    }
    int64_t C = x->shape[1], shape[FG_MAX_DIMS];
    if (check_vec(fn, x, running_mean, C, "running_mean") ||
        check_vec(fn, x, running_var, C, "running_var") || check_vec(fn, x, w, C, "weight") ||
        check_vec(fn, x, b, C, "bias"))
        return NULL;
    fg_tensor *y;
    if (use_input_stats) {
        int dims[FG_MAX_DIMS], nd = 0;
        for (int d = 2; d < x->ndim; d++) dims[nd++] = d;
        int64_t n = x->numel / (x->shape[0] * C);
        if (n <= 1) {
            fg_error(FG_EINVAL,
                     "%s: one value per instance and channel in training (PyTorch's "
                     "rule)",
                     fn);
            return NULL;
        }
        fg_tensor *mean = fg_mean_dims(x, nd, dims, true), *var = fg_var(x, nd, dims, 0, true);
        if (!mean || !var ||
            update_running(running_mean, running_var, mean, var, x->shape[0], n, momentum))
            return NULL;
        y = normalise(x, mean, var, eps);
    } else {
        if (!running_mean || !running_var) {
            fg_error(FG_EINVAL, "%s: evaluation mode needs the running mean and variance", fn);
            return NULL;
        }
        channel_shape(x, shape);
        y = normalise(x, fg_reshape(running_mean, x->ndim, shape),
                      fg_reshape(running_var, x->ndim, shape), eps);
    }
    return affine_channels(y, x, w, b);
}

/* ------------------------------------------------------ sync batch norm */

/* saved[0]: nothing; ctx: the reduce */
static FG_MUST_USE fg_status allreduce_bw(fg__node *n, const fg_tensor *g) {
    const fg_stats_reduce *r = n->ctx;
    fg_tensor *gs = fg_tensor_contiguous(g);
    fg_tensor *c = gs ? fg_empty_like(gs) : NULL;
    if (!c || fg_tensor_copy(c, gs)) return fg_last_status() ? fg_last_status() : FG_ENOMEM;
    FG_TRY(r->allreduce_sum(r->ud, c));
    fg_tensor *gx = fg__grad_of(n->in[0]);
    if (!gx) return FG_ENOMEM;
    return fg__ops(g)->axpby(1.0, c, 1.0, gx);
}

/* x summed over the ranks of r (a copy; recorded: the gradient is summed
 * over the ranks too) */
static fg_tensor *allreduce_sum(fg_tensor *x, const fg_stats_reduce *r) {
    fg_tensor *c = x ? fg_empty_like(x) : NULL;
    if (!c || fg_tensor_copy(c, x) || r->allreduce_sum(r->ud, c)) return NULL;
    fg__node *node;
    if (fg__record(&node, "sync_batch_norm.allreduce", allreduce_bw, c, 1, &x)) return NULL;
    if (node) node->ctx = (void *)r;
    return c;
}

fg_tensor *fg_sync_batch_norm(fg_tensor *x, fg_tensor *running_mean, fg_tensor *running_var,
                              fg_tensor *w, fg_tensor *b, double momentum, double eps,
                              const fg_stats_reduce *r) {
    const char *fn = "sync_batch_norm";
    if (!r || !r->allreduce_sum)
        return fg_batch_norm(x, running_mean, running_var, w, b, true, momentum, eps);
    if (fg__check_float(fn, x) || !(x = fg__autocast_f32(x))) return NULL; /* autocast: f32 */
    if (x->ndim < 2) {
        char s[96];
        fg_error(FG_EINVAL, "%s: input %s: expected (N, C, ...)", fn,
                 fg_tensor_describe(x, s, sizeof s));
        return NULL;
    }
    int64_t C = x->shape[1], shape[FG_MAX_DIMS];
    if (check_vec(fn, x, running_mean, C, "running_mean") ||
        check_vec(fn, x, running_var, C, "running_var") || check_vec(fn, x, w, C, "weight") ||
        check_vec(fn, x, b, C, "bias"))
        return NULL;
    channel_shape(x, shape);
    int dims[FG_MAX_DIMS], nd = 0;
    for (int d = 0; d < x->ndim; d++)
        if (d != 1) dims[nd++] = d;
    /* the global count, then the global mean, then the sum of squared
     * deviations from it: two-pass, as accurate as one process's */
    fg_tensor *cnt = fg_scalar(x->dtype, (double)(x->numel / C));
    if (!cnt || r->allreduce_sum(r->ud, cnt)) return NULL;
    int64_t n = (int64_t)llround(fg_item(cnt));
    if (n <= 1) {
        fg_error(FG_EINVAL, "%s: one value per channel over all ranks (PyTorch's rule)", fn);
        return NULL;
    }
    fg_tensor *mean = fg_scale(allreduce_sum(fg_sum_dims(x, nd, dims, true), r), 1.0 / (double)n);
    fg_tensor *dev = fg_sub(x, mean);
    fg_tensor *var =
        fg_scale(allreduce_sum(fg_sum_dims(fg_mul(dev, dev), nd, dims, true), r), 1.0 / (double)n);
    if (!var || update_running(running_mean, running_var, mean, var, 1, n, momentum)) return NULL;
    fg_tensor *e = fg_scalar(x->dtype, eps);
    fg_tensor *y = fg_mul(dev, fg_rsqrt(fg_add(var, e)));
    return affine_channels(y, x, w, b);
}
