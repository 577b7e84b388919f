/* Joining, slicing and indexing, with gradients: cat, stack, split,
 * narrow and slice, permute, expand, flatten, index_select, gather,
 * scatter_add, where, masked_fill, max / min over a dim (values and
 * indices), argmax / argmin and cumsum.
 *
 * Every result is a new contiguous tensor (the kernels read contiguous
 * tensors): the views (slice, permute, expand) are copied once in forward
 * through fg_tensor_copy, and their backward adds the gradient into the
 * same view of the input's gradient (add_strided; expand's sums it down
 * with sum_to). cat records one node per at most FG_NODE_MAX_IN inputs: a
 * cat of more is a tree of nodes whose inner outputs are views of the
 * result, so its values are still copied once. Index tensors are i32 and
 * copied when recorded (a caller may refill a batch before backward).
 * max/min take the first index of the extreme (NaN the largest), their
 * gradient flows to it alone, as PyTorch's. */
#include <string.h>

#include "autograd_impl.h"

static FG_MUST_USE fg_status check_in(const char *fn, const fg_tensor *a) {
    if (!a) return fg_error_wrap(FG_EINVAL, "%s: NULL input (an earlier call failed)", fn);
    return FG_OK;
}

/* dim normalised against nd dims (0-d tensors take dim 0 or -1 as 1-d) */
static FG_MUST_USE fg_status norm_dim(const char *fn, const fg_tensor *a, int dim, int nd,
                                      int *out) {
    int n = nd ? nd : 1, d = dim < 0 ? dim + n : dim;
    if (d < 0 || d >= n) {
        char s[96];
        return fg_error(FG_EINVAL, "%s: dim %d is out of range for %s (expected %d..%d)", fn, dim,
                        fg_tensor_describe(a, s, sizeof s), -n, n - 1);
    }
    *out = d;
    return FG_OK;
}

/* A contiguous i32 copy of idx to keep for backward (idx itself when it
 * is a step tensor already contiguous). */
static fg_tensor *keep_index(const char *fn, fg_tensor *idx) {
    if (!idx) {
        fg_error_wrap(FG_EINVAL, "%s: NULL index (an earlier call failed)", fn);
        return NULL;
    }
    if (idx->dtype != FG_I32) {
        fg_error(FG_EINVAL, "%s: index is %s: expected i32", fn, fg_dtype_name(idx->dtype));
        return NULL;
    }
    if (fg_tensor_is_contiguous(idx) && !fg_tensor_is_persistent(idx)) return idx;
    fg_tensor *c = fg_empty(FG_I32, idx->ndim, idx->shape);
    if (!c || fg_tensor_copy(c, idx)) return NULL;
    return c;
}

/* The view of t with its dim `dim` taken from start in steps of step,
 * count elements. */
static fg_tensor *step_view(const fg_tensor *t, int dim, int64_t start, int64_t count,
                            int64_t step) {
    fg_tensor *v = fg__tensor_header_like(t);
    if (!v) return NULL;
    v->data = (char *)t->data + start * t->strides[dim] * (int64_t)fg_dtype_size(t->dtype);
    v->shape[dim] = count;
    v->strides[dim] = t->strides[dim] * step;
    v->numel = t->shape[dim] ? t->numel / t->shape[dim] * count : 0;
    return v;
}

static fg_tensor *permute_view(const fg_tensor *t, const int *perm) {
    fg_tensor *v = fg__tensor_header_like(t);
    if (!v) return NULL;
    for (int d = 0; d < t->ndim; d++) {
        v->shape[d] = t->shape[perm[d]];
        v->strides[d] = t->strides[perm[d]];
    }
    return v;
}

/* --------------------------------------------------------- slice / narrow */

/* i[0] = dim, i[1] = start, i[2] = count, i[3] = step */
static FG_MUST_USE fg_status slice_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *ga = fg__grad_of(n->in[0]);
    fg_tensor *v = ga ? step_view(ga, (int)n->i[0], n->i[1], n->i[2], n->i[3]) : NULL;
    if (!v) return FG_ENOMEM;
    return fg__ops(g)->add_strided(g, v);
}

static fg_tensor *slice_rec(const char *fn, fg_tensor *a, int d, int64_t start, int64_t count,
                            int64_t step) {
    fg_tensor *v = step_view(a, d, start, count, step);
    fg_tensor *y = v ? fg_empty(a->dtype, v->ndim, v->shape) : NULL;
    if (!y || fg_tensor_copy(y, v)) return NULL;
    fg__node *node;
    if (fg__record(&node, fn, slice_bw, y, 1, &a)) return NULL;
    if (node) {
        if (FG_OP(fg__ops(a), add_strided)) return NULL;
        node->i[0] = d;
        node->i[1] = start;
        node->i[2] = count;
        node->i[3] = step;
    }
    return y;
}

fg_tensor *fg_narrow(fg_tensor *a, int dim, int64_t start, int64_t length) {
    int d = 0;
    if (check_in("narrow", a)) return NULL;
    if (a->ndim == 0) {
        fg_error(FG_EINVAL, "narrow: a 0-d tensor has no dim to narrow");
        return NULL;
    }
    if (norm_dim("narrow", a, dim, a->ndim, &d)) return NULL;
    int64_t n = a->shape[d];
    if (start < 0) start += n; /* PyTorch takes a negative start from the end */
    if (start < 0 || start > n || length < 0 || length > n - start) {
        fg_error(FG_EINVAL, "narrow: start %lld, length %lld out of range for dim %d of size %lld",
                 (long long)start, (long long)length, dim, (long long)n);
        return NULL;
    }
    return slice_rec("narrow", a, d, start, length, 1);
}

fg_tensor *fg_slice(fg_tensor *a, int dim, int64_t start, int64_t end, int64_t step) {
    int d = 0;
    if (check_in("slice", a)) return NULL;
    if (a->ndim == 0) {
        fg_error(FG_EINVAL, "slice: a 0-d tensor cannot be sliced");
        return NULL;
    }
    if (norm_dim("slice", a, dim, a->ndim, &d)) return NULL;
    if (step <= 0) {
        fg_error(FG_EINVAL, "slice: step %lld: expected > 0 (as PyTorch's)", (long long)step);
        return NULL;
    }
    /* Python's rules: negative bounds count from the end, then clamp */
    int64_t n = a->shape[d];
    if (start < 0) start += n;
    if (end < 0) end += n;
    start = start < 0 ? 0 : start > n ? n : start;
    end = end < start ? start : end > n ? n : end;
    int64_t count = (end - start + step - 1) / step;
    return slice_rec("slice", a, d, start, count, step);
}

fg_status fg_split_sizes(fg_tensor *a, const int64_t *sizes, int n, int dim, fg_tensor **out) {
    int d = 0;
    FG_TRY(check_in("split", a));
    if (a->ndim == 0) return fg_error(FG_EINVAL, "split: a 0-d tensor cannot be split");
    FG_TRY(norm_dim("split", a, dim, a->ndim, &d));
    int64_t total = 0;
    for (int k = 0; k < n; k++) {
        if (sizes[k] < 0)
            return fg_error(FG_EINVAL, "split: size %lld at %d is negative", (long long)sizes[k],
                            k);
        total += sizes[k];
    }
    if (total != a->shape[d])
        return fg_error(FG_EINVAL, "split: sizes sum to %lld, dim %d has %lld", (long long)total,
                        dim, (long long)a->shape[d]);
    int64_t off = 0;
    for (int k = 0; k < n; k++) {
        out[k] = slice_rec("split", a, d, off, sizes[k], 1);
        if (!out[k]) return fg_error_wrap(FG_ENOMEM, "split: piece %d", k);
        off += sizes[k];
    }
    return FG_OK;
}

fg_status fg_split(fg_tensor *a, int64_t split_size, int dim, fg_tensor **out, int max_out,
                   int *n_out) {
    int d = 0;
    FG_TRY(check_in("split", a));
    if (a->ndim == 0) return fg_error(FG_EINVAL, "split: a 0-d tensor cannot be split");
    FG_TRY(norm_dim("split", a, dim, a->ndim, &d));
    if (split_size <= 0)
        return fg_error(FG_EINVAL, "split: split_size %lld: expected > 0", (long long)split_size);
    int64_t n = a->shape[d], k = n ? (n + split_size - 1) / split_size : 1;
    if (k > max_out)
        return fg_error(FG_EINVAL,
                        "split: %lld pieces of %lld along a dim of %lld do not fit "
                        "in max_out = %d",
                        (long long)k, (long long)split_size, (long long)n, max_out);
    int64_t sizes[64], *sz = k <= 64 ? sizes : fg_step_alloc(sizeof(int64_t) * (size_t)k);
    if (!sz) return FG_ENOMEM;
    for (int64_t j = 0; j < k; j++) sz[j] = FG_MIN(split_size, n - j * split_size);
    if (n == 0) sz[0] = 0;
    if (n_out) *n_out = (int)k;
    return fg_split_sizes(a, sz, (int)k, dim, out);
}

/* ------------------------------------------------------------- cat, stack */

/* i[0] = dim; the inputs are in[0 .. nin), their slices of the output in order */
static FG_MUST_USE fg_status cat_bw(fg__node *n, const fg_tensor *g) {
    int d = (int)n->i[0];
    int64_t off = 0;
    for (int k = 0; k < n->nin; k++) {
        fg_tensor *t = n->in[k];
        int64_t len = t->shape[d];
        if (fg__needs_grad(t)) {
            fg_tensor *gt = fg__grad_of(t);
            fg_tensor *v = gt ? fg_tensor_narrow_view(g, d, off, len) : NULL;
            if (!v) return FG_ENOMEM;
            FG_TRY(fg__ops(g)->add_strided(v, gt));
        }
        off += len;
    }
    return FG_OK;
}

/* Records out = cat(in[0 .. n)) along d, out a view of the result: a tree
 * of nodes of at most FG_NODE_MAX_IN inputs each. */
static FG_MUST_USE fg_status cat_record(fg_tensor *out, fg_tensor *const *in, int n, int d) {
    fg__node *node;
    if (n <= FG_NODE_MAX_IN) {
        FG_TRY(fg__record(&node, "cat", cat_bw, out, n, in));
        if (node) node->i[0] = d;
        return FG_OK;
    }
    int per = (n + FG_NODE_MAX_IN - 1) / FG_NODE_MAX_IN, ng = 0;
    fg_tensor *sub[FG_NODE_MAX_IN];
    int64_t off = 0;
    for (int k = 0; k < n; k += per, ng++) {
        int cnt = FG_MIN(per, n - k);
        int64_t len = 0;
        for (int j = 0; j < cnt; j++) len += in[k + j]->shape[d];
        sub[ng] = fg_tensor_narrow_view(out, d, off, len);
        if (!sub[ng]) return FG_ENOMEM;
        FG_TRY(cat_record(sub[ng], in + k, cnt, d));
        off += len;
    }
    FG_TRY(fg__record(&node, "cat", cat_bw, out, ng, sub));
    if (node) node->i[0] = d;
    return FG_OK;
}

fg_tensor *fg_cat(fg_tensor *const *ts, int n, int dim) {
    if (!ts || n <= 0) {
        fg_error(FG_EINVAL, "cat: %d tensors: expected at least one", n);
        return NULL;
    }
    for (int k = 0; k < n; k++)
        if (check_in("cat", ts[k])) return NULL;
    const fg_tensor *a = ts[0];
    int d = 0;
    if (a->ndim == 0) {
        fg_error(FG_EINVAL, "cat: 0-d tensors cannot be concatenated (stack them)");
        return NULL;
    }
    if (norm_dim("cat", a, dim, a->ndim, &d)) return NULL;
    int64_t shape[FG_MAX_DIMS];
    memcpy(shape, a->shape, sizeof shape);
    shape[d] = 0;
    for (int k = 0; k < n; k++) {
        const fg_tensor *t = ts[k];
        bool ok = t->ndim == a->ndim && t->dtype == a->dtype && t->device == a->device;
        for (int j = 0; ok && j < a->ndim; j++) ok = j == d || t->shape[j] == a->shape[j];
        if (!ok) {
            char s0[96], s1[96];
            fg_error(FG_EINVAL, "cat: tensor %d %s does not match tensor 0 %s but along dim %d", k,
                     fg_tensor_describe(t, s1, sizeof s1), fg_tensor_describe(a, s0, sizeof s0),
                     dim);
            return NULL;
        }
        shape[d] += t->shape[d];
    }
    fg_tensor *y = fg_empty(a->dtype, a->ndim, shape);
    if (!y) return NULL;
    int64_t off = 0;
    for (int k = 0; k < n; k++) {
        fg_tensor *v = fg_tensor_narrow_view(y, d, off, ts[k]->shape[d]);
        if (!v || fg_tensor_copy(v, ts[k])) return NULL;
        off += ts[k]->shape[d];
    }
    bool any = false;
    for (int k = 0; k < n; k++) any |= fg__needs_grad(ts[k]);
    if (any && fg_is_grad_enabled()) {
        if (FG_OP(fg__ops(a), add_strided) || cat_record(y, ts, n, d)) return NULL;
    }
    return y;
}

fg_tensor *fg_stack(fg_tensor *const *ts, int n, int dim) {
    if (!ts || n <= 0) {
        fg_error(FG_EINVAL, "stack: %d tensors: expected at least one", n);
        return NULL;
    }
    for (int k = 0; k < n; k++)
        if (check_in("stack", ts[k])) return NULL;
    int nd = ts[0]->ndim, d;
    if (norm_dim("stack", ts[0], dim, nd + 1, &d)) return NULL;
    fg_tensor **u = fg_step_alloc(sizeof *u * (size_t)n);
    if (!u) return NULL;
    for (int k = 0; k < n; k++) {
        if (ts[k]->ndim != nd || !fg_tensor_same_shape(ts[k], ts[0])) {
            char s0[96], s1[96];
            fg_error(FG_EINVAL, "stack: tensor %d %s differs in shape from tensor 0 %s", k,
                     fg_tensor_describe(ts[k], s1, sizeof s1),
                     fg_tensor_describe(ts[0], s0, sizeof s0));
            return NULL;
        }
        int64_t shape[FG_MAX_DIMS];
        for (int j = 0, s = 0; j <= nd; j++) shape[j] = j == d ? 1 : ts[k]->shape[s++];
        if (!(u[k] = fg_reshape(ts[k], nd + 1, shape))) return NULL;
    }
    return fg_cat(u, n, d);
}

/* --------------------------------------------------------- permute, expand */

/* ctx = the permutation (int[ndim]) */
static FG_MUST_USE fg_status permute_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *ga = fg__grad_of(n->in[0]);
    fg_tensor *v = ga ? permute_view(ga, n->ctx) : NULL;
    if (!v) return FG_ENOMEM;
    return fg__ops(g)->add_strided(g, v);
}

fg_tensor *fg_permute(fg_tensor *a, const int *dims) {
    if (check_in("permute", a)) return NULL;
    int nd = a->ndim;
    int *perm = fg_step_alloc(sizeof(int) * (size_t)(nd ? nd : 1));
    if (!perm || (nd && !dims)) {
        if (perm) fg_error(FG_EINVAL, "permute: NULL dims");
        return NULL;
    }
    bool seen[FG_MAX_DIMS] = {false};
    for (int k = 0; k < nd; k++) {
        int d = 0;
        if (norm_dim("permute", a, dims[k], nd, &d)) return NULL;
        if (seen[d]) {
            fg_error(FG_EINVAL, "permute: dim %d repeats: dims must be a permutation of 0..%d",
                     dims[k], nd - 1);
            return NULL;
        }
        seen[d] = true;
        perm[k] = d;
    }
    fg_tensor *v = permute_view(a, perm);
    fg_tensor *y = v ? fg_empty(a->dtype, nd, v->shape) : NULL;
    if (!y || fg_tensor_copy(y, v)) return NULL;
    fg__node *node;
    if (fg__record(&node, "permute", permute_bw, y, 1, &a)) return NULL;
    if (node) {
        if (FG_OP(fg__ops(a), add_strided)) return NULL;
        node->ctx = perm;
    }
    return y;
}

static FG_MUST_USE fg_status expand_bw(fg__node *n, const fg_tensor *g) {
    double beta;
    fg_tensor *ga = fg__grad_for_write(n->in[0], &beta);
    if (!ga) return FG_ENOMEM;
    return fg__ops(g)->sum_to(g, ga, 1.0, beta);
}

fg_tensor *fg_expand(fg_tensor *a, int ndim, const int64_t *shape) {
    if (check_in("expand", a)) return NULL;
    if (ndim < a->ndim || ndim > FG_MAX_DIMS || (ndim && !shape)) {
        fg_error(FG_EINVAL, "expand: %d dims for a tensor of %d (expected %d..%d)", ndim, a->ndim,
                 a->ndim, FG_MAX_DIMS);
        return NULL;
    }
    fg_tensor *v = fg__tensor_header_like(a);
    if (!v) return NULL;
    int off = ndim - a->ndim;
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        int64_t src = d >= off ? a->shape[d - off] : 1, want = shape[d];
        if (want == -1 && d >= off) want = src;
        if (want < 0 || (src != 1 && want != src)) {
            char s[96];
            fg_error(FG_EINVAL,
                     "expand: %s cannot expand to size %lld in dim %d (only dims of "
                     "size 1 expand; -1 keeps a size)",
                     fg_tensor_describe(a, s, sizeof s), (long long)shape[d], d);
            return NULL;
        }
        v->shape[d] = want;
        v->strides[d] = d >= off && src == want && src != 1 ? a->strides[d - off] : 0;
        numel *= want;
    }
    v->ndim = ndim;
    v->numel = numel;
    fg_tensor *y = fg_empty(a->dtype, ndim, v->shape);
    if (!y || fg_tensor_copy(y, v)) return NULL;
    fg__node *node;
    if (fg__record(&node, "expand", expand_bw, y, 1, &a)) return NULL;
    if (node && FG_OP(fg__ops(a), sum_to)) return NULL;
    return y;
}

fg_tensor *fg_flatten(fg_tensor *a, int start_dim, int end_dim) {
    if (check_in("flatten", a)) return NULL;
    int nd = a->ndim, s, e;
    if (nd == 0) return fg_reshape(a, 1, (int64_t[]){1});
    if (norm_dim("flatten", a, start_dim, nd, &s) || norm_dim("flatten", a, end_dim, nd, &e))
        return NULL;
    if (s > e) {
        fg_error(FG_EINVAL, "flatten: start_dim %d comes after end_dim %d", start_dim, end_dim);
        return NULL;
    }
    int64_t shape[FG_MAX_DIMS];
    int k = 0;
    for (int d = 0; d < nd; d++) {
        if (d <= s || d > e) shape[k++] = a->shape[d];
        else shape[k - 1] *= a->shape[d];
    }
    return fg_reshape(a, k, shape);
}

/* ------------------------------------------------------ index_select etc. */

/* saved[0] = index; i[0] = dim */
static FG_MUST_USE fg_status index_select_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *ga = fg__grad_of(n->in[0]);
    if (!ga) return FG_ENOMEM;
    return fg__ops(g)->index_add(g, (int)n->i[0], n->saved[0], ga);
}

fg_tensor *fg_index_select(fg_tensor *a, int dim, fg_tensor *index) {
    int d = 0;
    if (check_in("index_select", a) || norm_dim("index_select", a, dim, a->ndim, &d)) return NULL;
    fg_tensor *idx = keep_index("index_select", index);
    if (!idx) return NULL;
    if (idx->ndim > 1) {
        fg_error(FG_EINVAL, "index_select: the index has %d dims: expected 1", idx->ndim);
        return NULL;
    }
    const fg_op_table *ops = fg__ops(a);
    if (!ops || FG_OP(ops, index_select)) return NULL;
    fg_tensor *ac = fg_tensor_contiguous(a);
    if (ac && a->ndim == 0) ac = fg_tensor_reshape_view(ac, 1, (int64_t[]){1});
    if (!ac) return NULL;
    int64_t shape[FG_MAX_DIMS];
    memcpy(shape, ac->shape, sizeof shape);
    shape[d] = idx->numel;
    fg_tensor *y = fg_empty(a->dtype, ac->ndim, shape);
    if (!y || ops->index_select(ac, d, idx, y)) return NULL;
    if (a->ndim == 0 && !(y = fg_tensor_reshape_view(y, idx->ndim, idx->shape))) return NULL;
    fg__node *node;
    if (fg__record(&node, "index_select", index_select_bw, y, 1, &a)) return NULL;
    if (node) {
        if (FG_OP(ops, index_add)) return NULL;
        if (a->ndim == 0) {
            fg_error(FG_EUNSUPPORTED, "index_select: no gradient through a 0-d input");
            return NULL;
        }
        node->saved[0] = idx;
        node->i[0] = d;
    }
    return y;
}

/* saved[0] = index; i[0] = dim */
static FG_MUST_USE fg_status gather_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *ga = fg__grad_of(n->in[0]);
    if (!ga) return FG_ENOMEM;
    return fg__ops(g)->scatter_add(g, (int)n->i[0], n->saved[0], ga);
}

fg_tensor *fg_gather(fg_tensor *a, int dim, fg_tensor *index) {
    int d = 0;
    if (check_in("gather", a) || norm_dim("gather", a, dim, a->ndim, &d)) return NULL;
    fg_tensor *idx = keep_index("gather", index);
    const fg_op_table *ops = idx ? fg__ops(a) : NULL;
    if (!ops || FG_OP(ops, gather)) return NULL;
    fg_tensor *ac = fg_tensor_contiguous(a);
    fg_tensor *y = ac ? fg_empty(a->dtype, idx->ndim, idx->shape) : NULL;
    if (!y || ops->gather(ac, d, idx, y)) return NULL;
    fg__node *node;
    if (fg__record(&node, "gather", gather_bw, y, 1, &a)) return NULL;
    if (node) {
        if (FG_OP(ops, scatter_add)) return NULL;
        node->saved[0] = idx;
        node->i[0] = d;
    }
    return y;
}

/* in = {a, src}; saved[0] = index; i[0] = dim */
static FG_MUST_USE fg_status scatter_add_bw(fg__node *n, const fg_tensor *g) {
    const fg_op_table *ops = fg__ops(g);
    fg_tensor *a = n->in[0], *src = n->in[1], *idx = n->saved[0];
    if (fg__needs_grad(a)) {
        fg_tensor *ga = fg__grad_of(a);
        if (!ga) return FG_ENOMEM;
        FG_TRY(ops->axpby(1.0, g, 1.0, ga));
    }
    if (fg__needs_grad(src)) {
        fg_tensor *gs = fg__grad_of(src);
        fg_tensor *tmp = gs ? fg_empty(g->dtype, idx->ndim, idx->shape) : NULL;
        if (!tmp) return FG_ENOMEM;
        FG_TRY(ops->gather(g, (int)n->i[0], idx, tmp));
        fg_tensor *v = gs; /* the corner of src the index covers */
        for (int d = 0; v && d < idx->ndim; d++) v = fg_tensor_narrow_view(v, d, 0, idx->shape[d]);
        if (!v) return FG_ENOMEM;
        FG_TRY(ops->add_strided(tmp, v));
    }
    return FG_OK;
}

fg_tensor *fg_scatter_add(fg_tensor *a, int dim, fg_tensor *index, fg_tensor *src) {
    int d = 0;
    if (check_in("scatter_add", a) || check_in("scatter_add", src) ||
        norm_dim("scatter_add", a, dim, a->ndim, &d) || fg__check_same_dtype("scatter_add", a, src))
        return NULL;
    fg_tensor *idx = keep_index("scatter_add", index);
    const fg_op_table *ops = idx ? fg__ops(a) : NULL;
    if (!ops || FG_OP(ops, scatter_add)) return NULL;
    fg_tensor *sc = fg_tensor_contiguous(src);
    fg_tensor *y = sc ? fg_empty(a->dtype, a->ndim, a->shape) : NULL;
    if (!y || fg_tensor_copy(y, a) || ops->scatter_add(sc, d, idx, y)) return NULL;
    fg__node *node;
    fg_tensor *in[2] = {a, src};
    if (fg__record(&node, "scatter_add", scatter_add_bw, y, 2, in)) return NULL;
    if (node) {
        if (FG_OP(ops, gather) || FG_OP(ops, add_strided)) return NULL;
        node->saved[0] = idx;
        node->i[0] = d;
    }
    return y;
}

/* ------------------------------------------------------ where, masked_fill */

/* t seen with the broadcast shape (nd, shape), copied contiguous */
static fg_tensor *broadcast_copy(const char *fn, const fg_tensor *t, int nd, const int64_t *shape) {
    fg_tensor *v = fg__tensor_header_like(t);
    if (!v) return NULL;
    int off = nd - t->ndim;
    for (int d = 0; d < nd; d++) {
        int64_t s = d >= off ? t->shape[d - off] : 1;
        if (s != shape[d] && s != 1) {
            char a[96];
            fg_error(FG_EINVAL, "%s: %s does not broadcast to the result's shape", fn,
                     fg_tensor_describe(t, a, sizeof a));
            return NULL;
        }
        v->shape[d] = shape[d];
        v->strides[d] = d >= off && s == shape[d] && s != 1 ? t->strides[d - off] : 0;
    }
    v->ndim = nd;
    fg_tensor *c = fg_empty(t->dtype, nd, shape);
    if (!c) return NULL;
    v->numel = c->numel;
    if (fg_tensor_copy(c, v)) return NULL;
    return c;
}

/* the broadcast shape of up to three tensors (NULL ones skipped) */
static FG_MUST_USE fg_status bshape(const char *fn, const fg_tensor *const *t, int n, int *nd,
                                    int64_t *shape) {
    int m = 0;
    for (int k = 0; k < n; k++)
        if (t[k] && t[k]->ndim > m) m = t[k]->ndim;
    for (int d = 0; d < m; d++) {
        int64_t s = 1;
        for (int k = 0; k < n; k++) {
            if (!t[k]) continue;
            int td = d - (m - t[k]->ndim);
            int64_t v = td >= 0 ? t[k]->shape[td] : 1;
            if (v != 1 && s != 1 && v != s)
                return fg_error(FG_EINVAL, "%s: shapes do not broadcast (dim %d: %lld and %lld)",
                                fn, d, (long long)s, (long long)v);
            if (v != 1) s = v;
        }
        shape[d] = s;
    }
    *nd = m;
    return FG_OK;
}

/* in = {a, b} (b NULL for masked_fill, whose a is in[0]); saved[0] = the
 * broadcast condition; i[0] = 1 for masked_fill */
static FG_MUST_USE fg_status where_bw(fg__node *n, const fg_tensor *g) {
    const fg_op_table *ops = fg__ops(g);
    fg_tensor *tmp = fg_empty_like(g);
    if (!tmp) return FG_ENOMEM;
    for (int k = 0; k < 2; k++) {
        fg_tensor *t = n->in[k];
        if (!fg__needs_grad(t)) continue;
        bool on_true = n->i[0] ? false : k == 0; /* masked_fill: a shows where mask is false */
        FG_TRY(ops->where(n->saved[0], on_true ? g : NULL, on_true ? NULL : g, 0, 0, tmp));
        double beta;
        fg_tensor *gt = fg__grad_for_write(t, &beta);
        if (!gt) return FG_ENOMEM;
        FG_TRY(ops->sum_to(tmp, gt, 1.0, beta));
    }
    return FG_OK;
}

static bool is_mask(const fg_tensor *m) { return m->dtype == FG_U8 || m->dtype == FG_I32; }

fg_tensor *fg_where(fg_tensor *cond, fg_tensor *a, fg_tensor *b) {
    if (check_in("where", cond) || fg__check_float("where", a) || fg__check_float("where", b) ||
        fg__check_same_dtype("where", a, b))
        return NULL;
    if (!is_mask(cond)) {
        fg_error(FG_EINVAL, "where: condition is %s: expected u8 or i32 (nonzero is true)",
                 fg_dtype_name(cond->dtype));
        return NULL;
    }
    const fg_op_table *ops = fg__ops(a);
    if (!ops || FG_OP(ops, where)) return NULL;
    int nd = 0;
    int64_t shape[FG_MAX_DIMS];
    const fg_tensor *all[3] = {cond, a, b};
    if (bshape("where", all, 3, &nd, shape)) return NULL;
    fg_tensor *c = broadcast_copy("where", cond, nd, shape);
    fg_tensor *ac = c ? broadcast_copy("where", a, nd, shape) : NULL;
    fg_tensor *bc = ac ? broadcast_copy("where", b, nd, shape) : NULL;
    fg_tensor *y = bc ? fg_empty(a->dtype, nd, shape) : NULL;
    if (!y || ops->where(c, ac, bc, 0, 0, y)) return NULL;
    fg__node *node;
    fg_tensor *in[2] = {a, b};
    if (fg__record(&node, "where", where_bw, y, 2, in)) return NULL;
    if (node) {
        if (FG_OP(ops, sum_to)) return NULL;
        node->saved[0] = c;
        node->i[0] = 0;
    }
    return y;
}

fg_tensor *fg_masked_fill(fg_tensor *a, fg_tensor *mask, double value) {
    if (fg__check_float("masked_fill", a) || check_in("masked_fill", mask)) return NULL;
    if (!is_mask(mask)) {
        fg_error(FG_EINVAL, "masked_fill: mask is %s: expected u8 or i32 (nonzero is true)",
                 fg_dtype_name(mask->dtype));
        return NULL;
    }
    const fg_op_table *ops = fg__ops(a);
    if (!ops || FG_OP(ops, where)) return NULL;
    fg_tensor *c = broadcast_copy("masked_fill", mask, a->ndim, a->shape);
    fg_tensor *ac = c ? fg_tensor_contiguous(a) : NULL;
    fg_tensor *y = ac ? fg_empty_like(ac) : NULL;
    if (!y || ops->where(c, NULL, ac, value, 0, y)) return NULL;
    fg__node *node;
    fg_tensor *in[2] = {a, NULL};
    if (fg__record(&node, "masked_fill", where_bw, y, 2, in)) return NULL;
    if (node) {
        if (FG_OP(ops, sum_to)) return NULL;
        node->saved[0] = c;
        node->i[0] = 1;
    }
    return y;
}

/* ------------------------------------------------------------ max / min */

/* saved[0] = indices (keepdim shape); i[0] = dim */
static FG_MUST_USE fg_status max_dim_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *ga = fg__grad_of(n->in[0]);
    fg_tensor *idx = n->saved[0];
    fg_tensor *gk = ga ? fg_tensor_reshape_view(g, idx->ndim, idx->shape) : NULL;
    fg_tensor *gav = gk && ga->ndim == 0 ? fg_tensor_reshape_view(ga, 1, (int64_t[]){1}) : ga;
    if (!gav) return FG_ENOMEM;
    return fg__ops(g)->scatter_add(gk, (int)n->i[0], idx, gav);
}

static fg_tensor *extreme(const char *fn, fg_tensor *a, int dim, bool keepdim, bool is_min,
                          fg_tensor **indices, bool values) {
    int d = 0;
    if (indices) *indices = NULL;
    if (fg__check_float(fn, a) || norm_dim(fn, a, dim, a->ndim, &d)) return NULL;
    const fg_op_table *ops = fg__ops(a);
    if (!ops || FG_OP(ops, max_dim)) return NULL;
    fg_tensor *ac = fg_tensor_contiguous(a);
    if (ac && a->ndim == 0) ac = fg_tensor_reshape_view(ac, 1, (int64_t[]){1});
    if (!ac) return NULL;
    int64_t kshape[FG_MAX_DIMS], shape[FG_MAX_DIMS];
    int nd = 0;
    for (int k = 0; k < ac->ndim; k++) {
        kshape[k] = k == d ? 1 : ac->shape[k];
        if (k != d || keepdim) shape[nd++] = kshape[k];
    }
    if (a->ndim == 0) nd = 0;
    fg_tensor *idx = fg_empty(FG_I32, ac->ndim, kshape);
    fg_tensor *y = idx ? fg_empty(a->dtype, ac->ndim, kshape) : NULL;
    if (!y || ops->max_dim(ac, d, is_min, y, idx)) return NULL;
    fg_tensor *yo = fg_tensor_reshape_view(y, nd, shape);
    fg_tensor *io = yo ? fg_tensor_reshape_view(idx, nd, shape) : NULL;
    if (!io) return NULL;
    if (!values) return io;
    if (indices) *indices = io;
    fg__node *node;
    if (fg__record(&node, fn, max_dim_bw, yo, 1, &a)) return NULL;
    if (node) {
        if (FG_OP(ops, scatter_add)) return NULL;
        node->saved[0] = idx;
        node->i[0] = d;
    }
    return yo;
}

fg_tensor *fg_max_dim(fg_tensor *a, int dim, bool keepdim, fg_tensor **indices) {
    return extreme("max_dim", a, dim, keepdim, false, indices, true);
}
fg_tensor *fg_min_dim(fg_tensor *a, int dim, bool keepdim, fg_tensor **indices) {
    return extreme("min_dim", a, dim, keepdim, true, indices, true);
}
fg_tensor *fg_argmax(fg_tensor *a, int dim, bool keepdim) {
    return extreme("argmax", a, dim, keepdim, false, NULL, false);
}
fg_tensor *fg_argmin(fg_tensor *a, int dim, bool keepdim) {
    return extreme("argmin", a, dim, keepdim, true, NULL, false);
}

/* ---------------------------------------------------------------- cumsum */

/* i[0] = dim */
static FG_MUST_USE fg_status cumsum_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *ga = fg__grad_of(n->in[0]);
    fg_tensor *tmp = ga ? fg_empty_like(g) : NULL;
    if (!tmp) return FG_ENOMEM;
    const fg_op_table *ops = fg__ops(g);
    FG_TRY(ops->cumsum(g, (int)n->i[0], true, tmp));
    return ops->axpby(1.0, tmp, 1.0, ga);
}

fg_tensor *fg_cumsum(fg_tensor *a, int dim) {
    int d = 0;
    if (fg__check_float("cumsum", a) || norm_dim("cumsum", a, dim, a->ndim, &d)) return NULL;
    const fg_op_table *ops = fg__ops(a);
    if (!ops || FG_OP(ops, cumsum)) return NULL;
    fg_tensor *ac = fg_tensor_contiguous(a);
    fg_tensor *y = ac ? fg_empty_like(ac) : NULL;
    if (!y || ops->cumsum(ac, d, false, y)) return NULL;
    fg__node *node;
    if (fg__record(&node, "cumsum", cumsum_bw, y, 1, &a)) return NULL;
    if (node) node->i[0] = d;
    return y;
}
