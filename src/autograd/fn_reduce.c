/* sum and mean, of everything or over one dim (keepdim as PyTorch). All
 * four are the table's sum_dim with a scale (1 or 1/n): the whole-tensor
 * forms view the input as one flat dim. The backward broadcasts the
 * gradient back over the summed dim with sum_dim_bwd, accumulating straight
 * into the input's gradient. */
#include "autograd_impl.h"

/* i[0] = dim of the input the sum ran over; f[0] = scale */
static FG_MUST_USE fg_status sum_dim_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *ga = fg__grad_of(n->in[0]);
    if (!ga) return FG_ENOMEM;
    return fg__ops(g)->sum_dim_bwd(g, (int)n->i[0], ga, n->f[0]);
}

/* f[0] = scale; the input's gradient is seen flat */
static FG_MUST_USE fg_status sum_all_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *ga = fg__grad_of(n->in[0]);
    fg_tensor *flat = ga ? fg_tensor_reshape_view(ga, 1, &ga->numel) : NULL; /* (numel) */
    if (!flat) return FG_ENOMEM;
    return fg__ops(g)->sum_dim_bwd(g, 0, flat, n->f[0]);
}

static fg_tensor *reduce_all(const char *fn, fg_tensor *a, bool mean) {
    if (fg__check_float(fn, a) || !(a = fg__autocast_f32(a))) return NULL; /* autocast: f32 */
    const fg_op_table *ops = fg__ops(a);
    if (!ops || FG_OP(ops, sum_dim) || FG_OP(ops, sum_dim_bwd)) return NULL;
    fg_tensor *ac = fg_tensor_contiguous(a);
    fg_tensor *flat = ac ? fg_tensor_reshape_view(ac, 1, &ac->numel) : NULL; /* (numel) */
    fg_tensor *y = flat ? fg_empty(a->dtype, 0, NULL) : NULL;
    /* the mean of nothing is NaN (0 * inf), as PyTorch's */
    double scale = mean ? 1.0 / (double)a->numel : 1.0;
    if (!y || ops->sum_dim(flat, 0, y, scale)) return NULL;
    fg__node *node;
    if (fg__record(&node, fn, sum_all_bw, y, 1, &a)) return NULL;
    if (node) node->f[0] = scale;
    return y;
}

fg_tensor *fg_sum(fg_tensor *a) { return reduce_all("sum", a, false); }
fg_tensor *fg_mean(fg_tensor *a) { return reduce_all("mean", a, true); }

static fg_tensor *reduce_dim(const char *fn, fg_tensor *a, int dim, bool keepdim, bool mean) {
    if (fg__check_float(fn, a) || !(a = fg__autocast_f32(a))) return NULL; /* autocast: f32 */
    int nd = a->ndim, d = dim < 0 ? dim + nd : dim;
    if (nd == 0 ? !(dim == 0 || dim == -1) : (d < 0 || d >= nd)) {
        char s[96];
        fg_error(FG_EINVAL, "%s: dim %d is out of range for %s (expected %d..%d)", fn, dim,
                 fg_tensor_describe(a, s, sizeof s), nd ? -nd : -1, nd ? nd - 1 : 0);
        return NULL;
    }
    const fg_op_table *ops = fg__ops(a);
    if (!ops || FG_OP(ops, sum_dim) || FG_OP(ops, sum_dim_bwd)) return NULL;
    int64_t shape[FG_MAX_DIMS];
    int yn = 0;
    int64_t n = 1;
    if (nd == 0) {
        d = 0;
    } else {
        n = a->shape[d];
        for (int k = 0; k < nd; k++) {
            if (k != d) shape[yn++] = a->shape[k];
            else if (keepdim) shape[yn++] = 1;
        }
    }
    double scale = mean ? 1.0 / (double)n : 1.0;
    fg_tensor *ac = fg_tensor_contiguous(a);
    fg_tensor *y = ac ? fg_empty(a->dtype, yn, shape) : NULL;
    if (!y || ops->sum_dim(ac, d, y, scale)) return NULL;
    fg__node *node;
    if (fg__record(&node, fn, sum_dim_bw, y, 1, &a)) return NULL;
    if (node) {
        node->i[0] = d;
        node->f[0] = scale;
    }
    return y;
}

fg_tensor *fg_sum_dim(fg_tensor *a, int dim, bool keepdim) {
    return reduce_dim("sum_dim", a, dim, keepdim, false);
}
fg_tensor *fg_mean_dim(fg_tensor *a, int dim, bool keepdim) {
    return reduce_dim("mean_dim", a, dim, keepdim, true);
}
