/* Sums over one dimension and their backward. x is seen as (outer, n,
 * inner), n the size of the summed dim; y is (outer, inner) whatever its
 * dims say (keepdim or not: only the element count is checked).
 *
 * Sums accumulate in double, each output element in a fixed order (rows j =
 * 0..n-1; a row's sum in the lanes of the ISA in use: the f32 loops are
 * cpu_impl.h's fg__vk entries), so the result does not depend on the thread
 * count. Work is split across threads by output
 * elements, never inside one sum. */
#include "cpu_impl.h"
#include "vmath.h"

/* Output columns one task accumulates at a time (a double block on the stack). */
#define SUM_BLOCK 256

/* outer, n, inner of t around dim (negative counts from the end); a 0-d
 * tensor has one element along its one "dim" 0 (as PyTorch's sum(0)). */
static FG_MUST_USE fg_status split_dim(const char *kernel, const fg_tensor *t, int dim,
                                       int64_t *outer, int64_t *n, int64_t *inner) {
    int nd = t->ndim;
    if (nd == 0 && (dim == 0 || dim == -1)) {
        *outer = *n = *inner = 1;
        return FG_OK;
    }
    int d = dim < 0 ? dim + nd : dim;
    if (d < 0 || d >= nd) {
        char s[96];
        return fg_error(FG_EINVAL, "%s: dim %d is out of range for %s", kernel, dim,
                        fg_tensor_describe(t, s, sizeof s));
    }
    *outer = 1;
    *inner = 1;
    for (int i = 0; i < d; i++) *outer *= t->shape[i];
    for (int i = d + 1; i < nd; i++) *inner *= t->shape[i];
    *n = t->shape[d];
    return FG_OK;
}

/* big (outer, n, inner) and small (outer, inner): contiguous, same dtype. */
static FG_MUST_USE fg_status check_pair(const char *kernel, const fg_tensor *big, int dim,
                                        const fg_tensor *small, int64_t *outer, int64_t *n,
                                        int64_t *inner) {
    FG_TRY(split_dim(kernel, big, dim, outer, n, inner));
    FG_TRY(fg__expect_contiguous(kernel, big));
    FG_TRY(fg__expect_contiguous(kernel, small));
    if (big->dtype != small->dtype || small->numel != *outer * *inner) {
        char a[96], b[96];
        return fg_error(FG_EINVAL,
                        "%s: %s summed over dim %d gives %lld elements, but the other "
                        "tensor is %s",
                        kernel, fg_tensor_describe(big, a, sizeof a), dim,
                        (long long)(*outer * *inner), fg_tensor_describe(small, b, sizeof b));
    }
    return FG_OK;
}

fg_status fg__cpu_sum_dim(const fg_tensor *x, int dim, fg_tensor *y, double alpha) {
    int64_t outer, n, inner;
    FG_TRY(check_pair("sum_dim", x, dim, y, &outer, &n, &inner));
    int64_t work = x->numel;
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    bool vec = x->dtype == FG_F32 && vk->sum_d && vk->acc_rows_d;
    FG_FLOAT_DISPATCH("sum_dim", x->dtype, {
        const T *px = x->data;
        T *py = y->data;
        if (inner == 1) { /* (outer, n): one row sum per output */
            FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
            for (int64_t o = 0; o < outer; o++) {
                const T *r = px + o * n;
                double s = 0;
                if (vec) {
                    s = vk->sum_d((const float *)r, n);
                } else {
                    FG_PRAGMA(omp simd reduction(+ : s))
                    for (int64_t j = 0; j < n; j++) s += r[j];
                }
                py[o] = (T)(alpha * s);
            }
        } else { /* tasks: (o, column block); rows j added into a double block */
            int64_t nb = (inner + SUM_BLOCK - 1) / SUM_BLOCK, tasks = outer * nb;
            FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
            for (int64_t t = 0; t < tasks; t++) {
                int64_t o = t / nb, k0 = (t % nb) * SUM_BLOCK;
                int64_t m = FG_MIN(SUM_BLOCK, inner - k0);
                double acc[SUM_BLOCK];
                for (int64_t k = 0; k < m; k++) acc[k] = 0;
                if (vec) vk->acc_rows_d(acc, (const float *)px + o * n * inner + k0, inner, n, m);
                for (int64_t j = 0; !vec && j < n; j++) {
                    const T *r = px + (o * n + j) * inner + k0;
                    FG_SIMD
                    for (int64_t k = 0; k < m; k++) acc[k] += r[k];
                }
                T *yo = py + o * inner + k0;
                for (int64_t k = 0; k < m; k++) yo[k] = (T)(alpha * acc[k]);
            }
        }
    });
    return FG_OK;
}

fg_status fg__cpu_sum_dim_bwd(const fg_tensor *dy, int dim, fg_tensor *dx, double alpha) {
    int64_t outer, n, inner;
    FG_TRY(check_pair("sum_dim_bwd", dx, dim, dy, &outer, &n, &inner));
    int64_t work = dx->numel;
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    bool vec = dx->dtype == FG_F32 && vk->add_const && vk->axpby;
    FG_FLOAT_DISPATCH("sum_dim_bwd", dx->dtype, {
        const T *pg = dy->data;
        T *pd = dx->data;
        if (outer == 1 && inner == 1) { /* the sum of everything: one flat loop */
            T v = (T)(alpha * pg[0]);
            if (vec) {
                FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
                for (int64_t j = 0; j < n; j += FG_VK_PIECE)
                    vk->add_const((float *)pd + j, (float)v, FG_MIN(FG_VK_PIECE, n - j));
                return FG_OK;
            }
            FG_PRAGMA(omp parallel for simd if (parallel: work > FG_PAR_MIN) schedule(static))
            for (int64_t j = 0; j < n; j++) pd[j] += v;
        } else if (inner == 1) { /* (outer, n) += dy (outer, 1) */
            FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
            for (int64_t o = 0; o < outer; o++) {
                T v = (T)(alpha * pg[o]), *d = pd + o * n;
                if (vec) {
                    vk->add_const((float *)d, (float)v, n);
                    continue;
                }
                FG_SIMD
                for (int64_t j = 0; j < n; j++) d[j] += v;
            }
        } else { /* (outer, n, inner) += dy (outer, 1, inner) */
            T a = (T)alpha;
            FG_PRAGMA(omp parallel for collapse(2) if (work > FG_PAR_MIN) schedule(static))
            for (int64_t o = 0; o < outer; o++)
                for (int64_t j = 0; j < n; j++) {
                    const T *g = pg + o * inner;
                    T *d = pd + (o * n + j) * inner;
                    if (vec) {
                        vk->axpby((float)a, (const float *)g, 1.0f, (float *)d, inner);
                        continue;
                    }
                    FG_SIMD
                    for (int64_t k = 0; k < inner; k++) d[k] += a * g[k];
                }
        }
    });
    return FG_OK;
}
