/* Elementwise kernels: broadcasting binary ops and the reductions that undo a
 * broadcast in backward, axpby, scale and whole-tensor sums. The common case
 * (same shapes, contiguous) runs as one flat loop; broadcasting walks an
 * index over the output shape. */
#include <string.h>

#include "cpu_impl.h"
#include "vmath.h"

fg_status fg__expect_same_shape(const char *kernel, const fg_tensor *a, const fg_tensor *b) {
    if (fg_tensor_same_shape(a, b) && a->dtype == b->dtype) return FG_OK;
    char x[96], y[96];
    return fg_error(FG_EINVAL, "%s: %s and %s must have the same shape and dtype", kernel,
                    fg_tensor_describe(a, x, sizeof x), fg_tensor_describe(b, y, sizeof y));
}

fg_status fg__expect_contiguous(const char *kernel, const fg_tensor *t) {
    if (fg_tensor_is_contiguous(t)) return FG_OK;
    return fg_error(FG_EINVAL, "%s: expects a contiguous tensor", kernel);
}

/* Strides (elements) of `t` seen with y's shape: 0 along broadcast dims. */
static FG_MUST_USE fg_status broadcast_strides(const fg_tensor *t, const fg_tensor *y,
                                               int64_t *st) {
    int off = y->ndim - t->ndim;
    if (off < 0) return fg_error(FG_EINVAL, "broadcast: operand has more dims than the result");
    for (int d = 0; d < y->ndim; d++) {
        int td = d - off;
        if (td < 0) {
            st[d] = 0;
        } else if (t->shape[td] == y->shape[d]) {
            st[d] = t->shape[td] == 1 ? 0 : t->strides[td];
        } else if (t->shape[td] == 1) {
            st[d] = 0;
        } else {
            char a[96], b[96];
            return fg_error(FG_EINVAL, "broadcast: %s does not broadcast to %s",
                            fg_tensor_describe(t, a, sizeof a), fg_tensor_describe(y, b, sizeof b));
        }
    }
    return FG_OK;
}

#define BIN_APPLY(op, x, z)                                                                        \
    ((op) == FG_BIN_ADD   ? (x) + (z)                                                              \
     : (op) == FG_BIN_SUB ? (x) - (z)                                                              \
     : (op) == FG_BIN_MUL ? (x) * (z)                                                              \
                          : (x) / (z))

fg_status fg__cpu_binary(fg_binary_op op, const fg_tensor *a, const fg_tensor *b, fg_tensor *y) {
    if (a->dtype != y->dtype || b->dtype != y->dtype)
        return fg_error(FG_EINVAL, "binary: dtypes differ");
    FG_TRY(fg__expect_contiguous("binary", y));
    int64_t n = y->numel;
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    if (fg_tensor_same_shape(a, y) && fg_tensor_same_shape(b, y) && fg_tensor_is_contiguous(a) &&
        fg_tensor_is_contiguous(b)) {
        if (y->dtype == FG_F32 && vk->binary) {
            const float *pa = a->data, *pb = b->data;
            float *py = y->data;
            FG_PRAGMA(omp parallel for if (n > FG_PAR_MIN) schedule(static))
            for (int64_t i = 0; i < n; i += FG_VK_PIECE)
                vk->binary(op, pa + i, pb + i, py + i, FG_MIN(FG_VK_PIECE, n - i));
            return FG_OK;
        }
        FG_FLOAT_DISPATCH("binary", y->dtype, {
            const T *pa = a->data, *pb = b->data;
            T *py = y->data;
            switch (op) {
            case FG_BIN_ADD:
                FG_PRAGMA(omp parallel for if (n > FG_PAR_MIN) schedule(static))
                for (int64_t i = 0; i < n; i++) py[i] = pa[i] + pb[i];
                break;
            case FG_BIN_SUB:
                FG_PRAGMA(omp parallel for if (n > FG_PAR_MIN) schedule(static))
                for (int64_t i = 0; i < n; i++) py[i] = pa[i] - pb[i];
                break;
            case FG_BIN_MUL:
                FG_PRAGMA(omp parallel for if (n > FG_PAR_MIN) schedule(static))
                for (int64_t i = 0; i < n; i++) py[i] = pa[i] * pb[i];
                break;
            case FG_BIN_DIV:
                FG_PRAGMA(omp parallel for if (n > FG_PAR_MIN) schedule(static))
                for (int64_t i = 0; i < n; i++) py[i] = pa[i] / pb[i];
                break;
            }
        });
        return FG_OK;
    }
    int64_t sa[FG_MAX_DIMS], sb[FG_MAX_DIMS];
    FG_TRY(broadcast_strides(a, y, sa));
    FG_TRY(broadcast_strides(b, y, sb));
    int nd = y->ndim;
    FG_FLOAT_DISPATCH("binary", y->dtype, {
        const T *pa = a->data, *pb = b->data;
        T *py = y->data;
        int64_t idx[FG_MAX_DIMS] = {0}, oa = 0, ob = 0;
        for (int64_t i = 0; i < n; i++) {
            py[i] = BIN_APPLY(op, pa[oa], pb[ob]);
            for (int d = nd - 1; d >= 0; d--) { /* odometer over y's shape */
                oa += sa[d];
                ob += sb[d];
                if (++idx[d] < y->shape[d]) break;
                oa -= sa[d] * y->shape[d];
                ob -= sb[d] * y->shape[d];
                idx[d] = 0;
            }
        }
    });
    return FG_OK;
}

/* y = beta y + alpha (x summed to y's shape); with beta = 0, y is written
 * without being read (a fresh gradient buffer may hold anything). Same
 * shape: one flat loop, in T when alpha is +-1 and beta is 0 or 1 (the
 * exact sum rounded once, as the double formula gives). y's shape a trailing
 * block of x's (a (T, C) position table under (B, T, C)): the outer blocks
 * add in order into a double row. Any other broadcast walks an index. */
fg_status fg__cpu_sum_to(const fg_tensor *x, fg_tensor *y, double alpha, double beta) {
    if (x->dtype != y->dtype) return fg_error(FG_EINVAL, "sum_to: dtypes differ");
    FG_TRY(fg__expect_contiguous("sum_to", x));
    FG_TRY(fg__expect_contiguous("sum_to", y));
    int64_t sy[FG_MAX_DIMS];
    FG_TRY(broadcast_strides(y, x, sy)); /* y's strides over x's index space */
    int nd = x->ndim, off = x->ndim - y->ndim;
    bool trailing = y->numel > 0;
    for (int d = 0; trailing && d < y->ndim; d++) trailing = y->shape[d] == x->shape[d + off];
    int64_t n = x->numel;
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    if (x->dtype == FG_F32 && vk->axpby && fg_tensor_same_shape(x, y) && beta == 1 &&
        (alpha == 1 || alpha == -1)) {
        const float *px = x->data;
        float *py = y->data;
        FG_PRAGMA(omp parallel for if (n > FG_PAR_MIN) schedule(static))
        for (int64_t i = 0; i < n; i += FG_VK_PIECE)
            vk->axpby((float)alpha, px + i, 1.0f, py + i, FG_MIN(FG_VK_PIECE, n - i));
        return FG_OK;
    }
    bool vacc = x->dtype == FG_F32 && vk->acc_rows_d;
    FG_FLOAT_DISPATCH("sum_to", x->dtype, {
        const T *px = x->data;
        T *py = y->data;
        if (fg_tensor_same_shape(x, y)) {
            if (beta == 0 && alpha == 1) {
                memcpy(py, px, sizeof(T) * (size_t)n);
            } else if (beta == 1 && (alpha == 1 || alpha == -1)) {
                T a = (T)alpha;
                FG_PRAGMA(omp parallel for simd if (parallel: n > FG_PAR_MIN) schedule(static))
                for (int64_t i = 0; i < n; i++) py[i] += a * px[i];
            } else if (beta == 0) {
                for (int64_t i = 0; i < n; i++) py[i] = (T)(alpha * px[i]);
            } else {
                for (int64_t i = 0; i < n; i++) py[i] = (T)(beta * py[i] + alpha * px[i]);
            }
        } else {
            /* accumulate in double scratch for accuracy and determinism */
            double *acc = fg_step_alloc(sizeof(double) * (size_t)(y->numel ? y->numel : 1));
            if (!acc) return FG_ENOMEM;
            memset(acc, 0, sizeof(double) * (size_t)y->numel);
            if (trailing) { /* x is (outer, y->numel) */
                int64_t inner = y->numel;
                if (vacc) vk->acc_rows_d(acc, (const float *)px, inner, n / inner, inner);
                for (int64_t o = 0; !vacc && o < n / inner; o++) {
                    const T *xo = px + o * inner;
                    FG_SIMD
                    for (int64_t j = 0; j < inner; j++) acc[j] += xo[j];
                }
            } else {
                int64_t idx[FG_MAX_DIMS] = {0}, oy = 0;
                for (int64_t i = 0; i < n; i++) {
                    acc[oy] += px[i];
                    for (int d = nd - 1; d >= 0; d--) {
                        oy += sy[d];
                        if (++idx[d] < x->shape[d]) break;
                        oy -= sy[d] * x->shape[d];
                        idx[d] = 0;
                    }
                }
            }
            for (int64_t i = 0; i < y->numel; i++)
                py[i] = beta == 0 ? (T)(alpha * acc[i]) : (T)(beta * py[i] + alpha * acc[i]);
        }
    });
    return FG_OK;
}

fg_status fg__cpu_axpby(double alpha, const fg_tensor *x, double beta, fg_tensor *y) {
    if (x->numel != y->numel || x->dtype != y->dtype) return fg__expect_same_shape("axpby", x, y);
    FG_TRY(fg__expect_contiguous("axpby", x));
    FG_TRY(fg__expect_contiguous("axpby", y));
    int64_t n = y->numel;
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    if (y->dtype == FG_F32 && vk->axpby) {
        const float *px = x->data;
        float *py = y->data;
        float al = (float)alpha, be = (float)beta;
        FG_PRAGMA(omp parallel for if (n > FG_PAR_MIN) schedule(static))
        for (int64_t i = 0; i < n; i += FG_VK_PIECE)
            vk->axpby(al, px + i, be, py + i, FG_MIN(FG_VK_PIECE, n - i));
        return FG_OK;
    }
    FG_FLOAT_DISPATCH("axpby", y->dtype, {
        const T *px = x->data;
        T *py = y->data;
        T al = (T)alpha, be = (T)beta;
        if (be == 1) {
            FG_PRAGMA(omp parallel for if (n > FG_PAR_MIN) schedule(static))
            for (int64_t i = 0; i < n; i++) py[i] += al * px[i];
        } else if (be == 0) {
            FG_PRAGMA(omp parallel for if (n > FG_PAR_MIN) schedule(static))
            for (int64_t i = 0; i < n; i++) py[i] = al * px[i];
        } else {
            FG_PRAGMA(omp parallel for if (n > FG_PAR_MIN) schedule(static))
            for (int64_t i = 0; i < n; i++) py[i] = al * px[i] + be * py[i];
        }
    });
    return FG_OK;
}

fg_status fg__cpu_scale(const fg_tensor *x, double s, fg_tensor *y) {
    return fg__cpu_axpby(s, x, 0.0, y);
}

fg_status fg__cpu_sum_all(const fg_tensor *x, double *out) {
    FG_TRY(fg__expect_contiguous("sum_all", x));
    double acc = 0;
    FG_FLOAT_DISPATCH("sum_all", x->dtype, {
        const T *p = x->data;
        for (int64_t i = 0; i < x->numel; i++) acc += p[i];
    });
    *out = acc;
    return FG_OK;
}

fg_status fg__cpu_sumsq_all(const fg_tensor *x, double *out) {
    FG_TRY(fg__expect_contiguous("sumsq_all", x));
    double acc = 0;
    FG_FLOAT_DISPATCH("sumsq_all", x->dtype, {
        const T *p = x->data;
        for (int64_t i = 0; i < x->numel; i++) acc += (double)p[i] * p[i];
    });
    *out = acc;
    return FG_OK;
}
