/* Layout and indexing kernels: y += x across any two layouts (the backward
 * of every view: slice, cat, permute), where, index_select and its
 * backward index_add, gather / scatter_add, max / min over a dim with the
 * first index of the extreme, cumsum. A tensor of shape (..., n, ...)
 * reduced or indexed along dim is seen as (outer, n, inner). Indices are
 * i32 and checked before anything is written: one outside [0, n) is
 * FG_EINVAL naming it and n. */
#include <math.h>
#include <string.h>

#include "k_ops.h"

/* outer and inner sizes of t around dim (the caller checked dim) */
static void split_dim(const fg_tensor *t, int dim, int64_t *outer, int64_t *inner) {
    int64_t o = 1, in = 1;
    for (int d = 0; d < dim; d++) o *= t->shape[d];
    for (int d = dim + 1; d < t->ndim; d++) in *= t->shape[d];
    *outer = o;
    *inner = in;
}

static FG_MUST_USE fg_status check_dim(const char *kernel, const fg_tensor *t, int dim) {
    if (dim < 0 || dim >= (t->ndim ? t->ndim : 1))
        return fg_error(FG_EINVAL, "%s: dim %d out of range for %d dims", kernel, dim, t->ndim);
    return FG_OK;
}

static int64_t dim_size(const fg_tensor *t, int dim) { return t->ndim ? t->shape[dim] : 1; }

static FG_MUST_USE fg_status check_index(const char *kernel, const fg_tensor *idx, int64_t n) {
    if (idx->dtype != FG_I32)
        return fg_error(FG_EINVAL, "%s: indices are %s: expected i32", kernel,
                        fg_dtype_name(idx->dtype));
    FG_TRY(fg__expect_contiguous(kernel, idx));
    const int32_t *p = idx->data;
    for (int64_t i = 0; i < idx->numel; i++)
        if (p[i] < 0 || p[i] >= n)
            return fg_error(FG_EINVAL, "%s: index %d (at %lld) is out of range for a dim of %lld",
                            kernel, (int)p[i], (long long)i, (long long)n);
    return FG_OK;
}

/* ------------------------------------------------------------ add_strided */

fg_status fg__cpu_add_strided(const fg_tensor *x, fg_tensor *y) {
    if (!fg_tensor_same_shape(x, y) || x->dtype != y->dtype) {
        char a[96], b[96];
        return fg_error(FG_EINVAL, "add_strided: %s and %s must have one shape and dtype",
                        fg_tensor_describe(x, a, sizeof a), fg_tensor_describe(y, b, sizeof b));
    }
    if (x->numel == 0) return FG_OK;
    int nd = x->ndim;
    FG_FLOAT_DISPATCH("add_strided", x->dtype, {
        const T *px = x->data;
        T *py = y->data;
        if (nd == 0) {
            py[0] += px[0];
            return FG_OK;
        }
        int64_t last = x->shape[nd - 1], sx = x->strides[nd - 1], sy = y->strides[nd - 1];
        int64_t rows = x->numel / last;
        FG_PRAGMA(omp parallel for if (x->numel > FG_PAR_MIN) schedule(static))
        for (int64_t r = 0; r < rows; r++) {
            int64_t ox = 0, oy = 0, rem = r;
            for (int d = nd - 2; d >= 0; d--) {
                int64_t i = rem % x->shape[d];
                rem /= x->shape[d];
                ox += i * x->strides[d];
                oy += i * y->strides[d];
            }
            for (int64_t j = 0; j < last; j++) py[oy + j * sy] += px[ox + j * sx];
        }
    });
    return FG_OK;
}

/* ------------------------------------------------------------------ where */

fg_status fg__cpu_where(const fg_tensor *cond, const fg_tensor *a, const fg_tensor *b, double va,
                        double vb, fg_tensor *y) {
    if (cond->dtype != FG_U8 && cond->dtype != FG_I32)
        return fg_error(FG_EINVAL, "where: condition is %s: expected u8 or i32",
                        fg_dtype_name(cond->dtype));
    if (!fg_tensor_same_shape(cond, y) || cond->numel != y->numel)
        return fg_error(FG_EINVAL, "where: condition and output shapes differ");
    FG_TRY(fg__expect_contiguous("where", cond));
    FG_TRY(fg__expect_contiguous("where", y));
    if (a) FG_TRY(fg__expect_same_shape("where", a, y));
    if (a) FG_TRY(fg__expect_contiguous("where", a));
    if (b) FG_TRY(fg__expect_same_shape("where", b, y));
    if (b) FG_TRY(fg__expect_contiguous("where", b));
    int64_t n = y->numel;
    bool u8 = cond->dtype == FG_U8;
    const uint8_t *c8 = cond->data;
    const int32_t *c32 = cond->data;
    FG_FLOAT_DISPATCH("where", y->dtype, {
        const T *pa = a ? a->data : NULL, *pb = b ? b->data : NULL;
        T *py = y->data, sa = (T)va, sb = (T)vb;
        FG_PRAGMA(omp parallel for if (n > FG_PAR_MIN) schedule(static))
        for (int64_t i = 0; i < n; i++) {
            bool c = u8 ? c8[i] != 0 : c32[i] != 0;
            py[i] = c ? (pa ? pa[i] : sa) : (pb ? pb[i] : sb);
        }
    });
    return FG_OK;
}

/* ----------------------------------------------------------- index_select */

/* x (outer, n, inner) and y (outer, k, inner) for idx (k) */
static FG_MUST_USE fg_status check_select(const char *kernel, const fg_tensor *x, int dim,
                                          const fg_tensor *idx, const fg_tensor *y) {
    FG_TRY(check_dim(kernel, x, dim));
    FG_TRY(fg__expect_contiguous(kernel, x));
    FG_TRY(fg__expect_contiguous(kernel, y));
    bool ok = x->dtype == y->dtype && y->ndim == (x->ndim ? x->ndim : 1) && idx->ndim <= 1;
    for (int d = 0; ok && d < x->ndim; d++)
        ok = y->shape[d] == (d == dim ? idx->numel : x->shape[d]);
    if (!ok) {
        char a[96], b[96], c[96];
        return fg_error(FG_EINVAL, "%s: %s, indices %s and %s do not match along dim %d", kernel,
                        fg_tensor_describe(x, a, sizeof a), fg_tensor_describe(idx, b, sizeof b),
                        fg_tensor_describe(y, c, sizeof c), dim);
    }
    return check_index(kernel, idx, dim_size(x, dim));
}

fg_status fg__cpu_index_select(const fg_tensor *x, int dim, const fg_tensor *idx, fg_tensor *y) {
    FG_TRY(check_select("index_select", x, dim, idx, y));
    int64_t outer, inner, n = dim_size(x, dim), k = idx->numel;
    split_dim(x, dim, &outer, &inner);
    size_t es = fg_dtype_size(x->dtype), row = es * (size_t)inner;
    const int32_t *pi = idx->data;
    const char *px = x->data;
    char *py = y->data;
    FG_PRAGMA(omp parallel for if (y->numel > FG_PAR_MIN) schedule(static))
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < k; j++)
            memcpy(py + (size_t)(o * k + j) * row, px + (size_t)(o * n + pi[j]) * row, row);
    return FG_OK;
}

fg_status fg__cpu_index_add(const fg_tensor *dy, int dim, const fg_tensor *idx, fg_tensor *dx) {
    FG_TRY(check_select("index_add", dx, dim, idx, dy));
    int64_t outer, inner, n = dim_size(dx, dim), k = idx->numel;
    split_dim(dx, dim, &outer, &inner);
    const int32_t *pi = idx->data;
    FG_FLOAT_DISPATCH("index_add", dx->dtype, {
        const T *pg = dy->data;
        T *pd = dx->data;
        /* threads own outer rows: repeated indices add in order, no races */
        FG_PRAGMA(omp parallel for if (dy->numel > FG_PAR_MIN) schedule(static))
        for (int64_t o = 0; o < outer; o++)
            for (int64_t j = 0; j < k; j++) {
                const T *g = pg + (o * k + j) * inner;
                T *d = pd + (o * n + pi[j]) * inner;
                for (int64_t c = 0; c < inner; c++) d[c] += g[c];
            }
    });
    return FG_OK;
}

/* ------------------------------------------------------ gather / scatter */

/* idx (and y or src) of x's ndim, each dim but `dim` no larger than x's */
static FG_MUST_USE fg_status check_gather(const char *kernel, const fg_tensor *x, int dim,
                                          const fg_tensor *idx, const fg_tensor *other) {
    FG_TRY(check_dim(kernel, x, dim));
    FG_TRY(fg__expect_contiguous(kernel, x));
    FG_TRY(fg__expect_contiguous(kernel, other));
    if (idx->dtype != FG_I32)
        return fg_error(FG_EINVAL, "%s: indices are %s: expected i32", kernel,
                        fg_dtype_name(idx->dtype));
    FG_TRY(fg__expect_contiguous(kernel, idx));
    bool ok = idx->ndim == x->ndim && other->ndim == x->ndim && other->dtype == x->dtype;
    for (int d = 0; ok && d < x->ndim; d++)
        ok = (d == dim || idx->shape[d] <= x->shape[d]) && idx->shape[d] <= other->shape[d];
    if (!ok) {
        char a[96], b[96], c[96];
        return fg_error(FG_EINVAL,
                        "%s: %s, indices %s, %s: the indices need the input's ndim and no "
                        "larger a size than it in every dim but %d",
                        kernel, fg_tensor_describe(x, a, sizeof a),
                        fg_tensor_describe(idx, b, sizeof b),
                        fg_tensor_describe(other, c, sizeof c), dim);
    }
    return check_index(kernel, idx, dim_size(x, dim));
}

/* The offsets of idx's element i in x (along dim at its value) and in o
 * (at i's position): both contiguous. */
static void gather_offsets(const fg_tensor *x, const fg_tensor *o, const fg_tensor *idx, int dim,
                           int64_t i, int64_t *ox, int64_t *oo) {
    int64_t rem = i, a = 0, b = 0;
    const int32_t *pi = idx->data;
    for (int d = idx->ndim - 1; d >= 0; d--) {
        int64_t c = rem % idx->shape[d];
        rem /= idx->shape[d];
        a += (d == dim ? pi[i] : c) * x->strides[d];
        b += c * o->strides[d];
    }
    *ox = a;
    *oo = b;
}

fg_status fg__cpu_gather(const fg_tensor *x, int dim, const fg_tensor *idx, fg_tensor *y) {
    FG_TRY(check_gather("gather", x, dim, idx, y));
    if (!fg_tensor_same_shape(idx, y))
        return fg_error(FG_EINVAL, "gather: the output needs the indices' shape");
    if (x->ndim == 0) return fg_tensor_copy(y, x);
    int64_t n = idx->numel;
    FG_FLOAT_DISPATCH("gather", x->dtype, {
        const T *px = x->data;
        T *py = y->data;
        FG_PRAGMA(omp parallel for if (n > FG_PAR_MIN) schedule(static))
        for (int64_t i = 0; i < n; i++) {
            int64_t ox, oy;
            gather_offsets(x, y, idx, dim, i, &ox, &oy);
            py[oy] = px[ox];
        }
    });
    return FG_OK;
}

fg_status fg__cpu_scatter_add(const fg_tensor *src, int dim, const fg_tensor *idx, fg_tensor *y) {
    FG_TRY(check_gather("scatter_add", y, dim, idx, src));
    int64_t n = idx->numel;
    FG_FLOAT_DISPATCH("scatter_add", y->dtype, {
        const T *ps = src->data;
        T *py = y->data;
        if (y->ndim == 0) {
            py[0] += ps[0];
            return FG_OK;
        }
        /* in index order on one thread: repeated indices add deterministically */
        for (int64_t i = 0; i < n; i++) {
            int64_t oy, os;
            gather_offsets(y, src, idx, dim, i, &oy, &os);
            py[oy] += ps[os];
        }
    });
    return FG_OK;
}

/* ---------------------------------------------------------------- max_dim */

fg_status fg__cpu_max_dim(const fg_tensor *x, int dim, bool is_min, fg_tensor *y, fg_tensor *idx) {
    const char *kernel = is_min ? "min_dim" : "max_dim";
    FG_TRY(check_dim(kernel, x, dim));
    FG_TRY(fg__expect_contiguous(kernel, x));
    FG_TRY(fg__expect_contiguous(kernel, y));
    int64_t outer, inner, n = dim_size(x, dim);
    split_dim(x, dim, &outer, &inner);
    if (n == 0)
        return fg_error(FG_EINVAL, "%s: dim %d has no elements: the extreme of none is undefined",
                        kernel, dim);
    if (y->numel != outer * inner || y->dtype != x->dtype ||
        (idx && (idx->dtype != FG_I32 || idx->numel != y->numel || !fg_tensor_is_contiguous(idx))))
        return fg_error(FG_EINVAL, "%s: output or indices do not match the input less dim %d",
                        kernel, dim);
    int32_t *pi = idx ? idx->data : NULL;
    FG_FLOAT_DISPATCH(kernel, x->dtype, {
        const T *px = x->data;
        T *py = y->data;
        FG_PRAGMA(omp parallel for if (x->numel > FG_PAR_MIN) schedule(static))
        for (int64_t o = 0; o < outer; o++)
            for (int64_t j = 0; j < inner; j++) {
                const T *p = px + o * n * inner + j;
                T best = p[0];
                int64_t bi = 0;
                for (int64_t r = 1; r < n && !isnan(best); r++) {
                    T v = p[r * inner];
                    if (isnan(v) || (is_min ? v < best : v > best)) {
                        best = v;
                        bi = r;
                    }
                }
                py[o * inner + j] = best;
                if (pi) pi[o * inner + j] = (int32_t)bi;
            }
    });
    return FG_OK;
}

/* ----------------------------------------------------------------- cumsum */

fg_status fg__cpu_cumsum(const fg_tensor *x, int dim, bool reverse, fg_tensor *y) {
    FG_TRY(check_dim("cumsum", x, dim));
    FG_TRY(fg__expect_same_shape("cumsum", x, y));
    FG_TRY(fg__expect_contiguous("cumsum", x));
    FG_TRY(fg__expect_contiguous("cumsum", y));
    int64_t outer, inner, n = dim_size(x, dim);
    split_dim(x, dim, &outer, &inner);
    FG_FLOAT_DISPATCH("cumsum", x->dtype, {
        const T *px = x->data;
        T *py = y->data;
        /* accumulated in double, as PyTorch's CPU cumsum does for float */
        FG_PRAGMA(omp parallel for if (x->numel > FG_PAR_MIN) schedule(static))
        for (int64_t o = 0; o < outer; o++)
            for (int64_t j = 0; j < inner; j++) {
                double acc = 0;
                for (int64_t r = 0; r < n; r++) {
                    int64_t rr = reverse ? n - 1 - r : r, off = (o * n + rr) * inner + j;
                    acc += (double)px[off];
                    py[off] = (T)acc;
                }
            }
    });
    return FG_OK;
}
