/* softmax and log_softmax over the last dim of (..., C), forward and
 * backward. Rows are independent: split across threads when the tensor is
 * large, one row per task.
 *
 * Every row subtracts its max before exp (no overflow for any finite
 * input); the row sums (of exp, of dy * y, of dy) accumulate in double, so
 * a long f32 row keeps the digits a naive float sum would lose. A row with
 * a NaN gives NaN, and a row of -inf gives NaN (0/0), as in PyTorch.
 *
 * f32 rows go through the vector kernels of the ISA in use (cpu_impl.h's
 * fg__vk), log_softmax's short rows (C <= FG_SM_BLOCK_N) a block of
 * FG_SM_BLOCK at a call, with the same bits; the loops below are the f64 kernels and the scalar
 * path. */
#include "cpu_impl.h"
#include "vmath.h"

/* rows and C of (..., C); a 0-d tensor is one row of one. */
static void rows_of(const fg_tensor *t, int64_t *rows, int64_t *C) {
    *C = t->ndim ? t->shape[t->ndim - 1] : 1;
    *rows = *C ? t->numel / *C : 0;
}

static FG_MUST_USE fg_status check2(const char *kernel, const fg_tensor *a, const fg_tensor *b) {
    FG_TRY(fg__expect_same_shape(kernel, a, b));
    FG_TRY(fg__expect_contiguous(kernel, a));
    return fg__expect_contiguous(kernel, b);
}

/* The max of a row of n >= 1 values. */
#define ROW_MAX(r, n, m)                                                                           \
    do {                                                                                           \
        m = (r)[0];                                                                                \
        FG_PRAGMA(omp simd reduction(max : m))                                                     \
        for (int64_t j_ = 1; j_ < (n); j_++) m = (r)[j_] > m ? (r)[j_] : m;                        \
    } while (0)

fg_status fg__cpu_softmax_fwd(const fg_tensor *x, fg_tensor *y) {
    FG_TRY(check2("softmax_fwd", x, y));
    int64_t rows, C, work = x->numel;
    rows_of(x, &rows, &C);
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    if (x->dtype == FG_F32 && vk->softmax_row) {
        const float *px = x->data;
        float *py = y->data;
FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
for (int64_t r = 0; r < rows; r++) vk->softmax_row(px + r * C, py + r * C, C);
return FG_OK;
    }
    FG_FLOAT_DISPATCH("softmax_fwd", x->dtype, {
        const T *px = x->data;
        T *py = y->data;
        FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
        for (int64_t r = 0; r < rows; r++) { /* (C) */
            const T *xr = px + r * C;
            T *yr = py + r * C, m;
            ROW_MAX(xr, C, m);
            T inv = (T)(1 / FG_EXPSUM(xr, C, m, yr));
            FG_SIMD
            for (int64_t j = 0; j < C; j++) yr[j] *= inv;
        }
    });
    return FG_OK;
}

fg_status fg__cpu_softmax_bwd(const fg_tensor *y, const fg_tensor *dy, fg_tensor *dx) {
    FG_TRY(check2("softmax_bwd", y, dy));
    FG_TRY(check2("softmax_bwd", y, dx));
    int64_t rows, C, work = y->numel;
    rows_of(y, &rows, &C);
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    if (y->dtype == FG_F32 && vk->softmax_bwd_row) {
        const float *py = y->data, *pg = dy->data;
        float *pd = dx->data;
FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
for (int64_t r = 0; r < rows; r++) vk->softmax_bwd_row(py + r * C, pg + r * C, pd + r * C, C);
return FG_OK;
    }
    FG_FLOAT_DISPATCH("softmax_bwd", y->dtype, {
        const T *py = y->data, *pg = dy->data;
        T *pd = dx->data;
        FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
        for (int64_t r = 0; r < rows; r++) { /* dx += y * (dy - sum(dy * y)) */
            const T *yr = py + r * C, *gr = pg + r * C;
            T *dr = pd + r * C;
            double s = 0;
            FG_PRAGMA(omp simd reduction(+ : s))
            for (int64_t j = 0; j < C; j++) s += (double)gr[j] * yr[j];
            T dot = (T)s;
            FG_SIMD
            for (int64_t j = 0; j < C; j++) dr[j] += yr[j] * (gr[j] - dot);
        }
    });
    return FG_OK;
}

fg_status fg__cpu_log_softmax_fwd(const fg_tensor *x, fg_tensor *y) {
    FG_TRY(check2("log_softmax_fwd", x, y));
    int64_t rows, C, work = x->numel;
    rows_of(x, &rows, &C);
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    if (x->dtype == FG_F32 && vk->log_softmax_rows && C <= FG_SM_BLOCK_N) {
        const float *px = x->data;
        float *py = y->data;
        int64_t per = fg__rows_per_call(rows, FG_SM_BLOCK), nb = (rows + per - 1) / per;
FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
for (int64_t b = 0; b < nb; b++) {
    int64_t r0 = b * per, k = rows - r0 < per ? rows - r0 : per;
    vk->log_softmax_rows(px + r0 * C, py + r0 * C, C, k);
}
return FG_OK;
    }
    if (x->dtype == FG_F32 && vk->log_softmax_row) {
        const float *px = x->data;
        float *py = y->data;
FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
for (int64_t r = 0; r < rows; r++) vk->log_softmax_row(px + r * C, py + r * C, C);
return FG_OK;
    }
    FG_FLOAT_DISPATCH("log_softmax_fwd", x->dtype, {
        const T *px = x->data;
        T *py = y->data;
        FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
        for (int64_t r = 0; r < rows; r++) { /* y = x - max - log sum exp(x - max) */
            const T *xr = px + r * C;
            T *yr = py + r * C, m;
            ROW_MAX(xr, C, m);
            /* (x - m) - log s: x - m is exact near the max, where x - (m + log s)
             * would round m + log s to the ulp of m first */
            T ls = (T)log(FG_EXPSUM(xr, C, m, (T *)NULL));
            FG_SIMD
            for (int64_t j = 0; j < C; j++) yr[j] = (xr[j] - m) - ls;
        }
    });
    return FG_OK;
}

fg_status fg__cpu_log_softmax_bwd(const fg_tensor *y, const fg_tensor *dy, fg_tensor *dx) {
    FG_TRY(check2("log_softmax_bwd", y, dy));
    FG_TRY(check2("log_softmax_bwd", y, dx));
    int64_t rows, C, work = y->numel;
    rows_of(y, &rows, &C);
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    if (y->dtype == FG_F32 && vk->log_softmax_bwd_row) {
        const float *py = y->data, *pg = dy->data;
        float *pd = dx->data;
FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
for (int64_t r = 0; r < rows; r++) vk->log_softmax_bwd_row(py + r * C, pg + r * C, pd + r * C, C);
return FG_OK;
    }
    FG_FLOAT_DISPATCH("log_softmax_bwd", y->dtype, {
        const T *py = y->data, *pg = dy->data;
        T *pd = dx->data;
        FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
        for (int64_t r = 0; r < rows; r++) { /* dx += dy - exp(y) * sum(dy) */
            const T *yr = py + r * C, *gr = pg + r * C;
            T *dr = pd + r * C;
            double s = 0;
            FG_PRAGMA(omp simd reduction(+ : s))
            for (int64_t j = 0; j < C; j++) s += gr[j];
            T gs = (T)s;
            FG_SIMD
            for (int64_t j = 0; j < C; j++) dr[j] += gr[j] - FG_EXP(yr[j]) * gs;
        }
    });
    return FG_OK;
}
