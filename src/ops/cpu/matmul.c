/* Matrix products through OpenBLAS (sgemm/dgemm) and the bias kernels of a
 * linear layer.
 *
 * matmul accepts any operand whose last two dims have unit stride in one of
 * them (a contiguous matrix, a transposed view, or a column slice such as
 * one head of a fused qkv): a transposed layout becomes a BLAS transpose
 * flag, the row stride becomes the leading dimension, so no operand is ever
 * copied. Batch dims must collapse to one stride. The output must have unit
 * stride along its rows.
 *
 * Batches run as one big gemm when b is shared and a and c are row-major
 * with no gap between batch entries (the batch folds into M); otherwise as
 * a loop of gemms, split across OpenMP threads when each product is small.
 * A single f32 product (one gemm) runs on the engine gemm_pick.c measured
 * fastest for its class (OpenBLAS, or oneDNN's matmul in matmul_dnnl.c),
 * on one thread where one thread was faster. bias_grad sums each column in
 * row order in double, so the result does not depend on the thread count. */
#include <string.h>

#include "blas.h"
#include "cpu_impl.h"

/* One operand seen as `batch` matrices of (rows, cols) as the tensor's last
 * two dims say; `colmajor` when it is stored transposed (unit stride down
 * the rows), `ld` the stride between stored rows. */
typedef struct {
    char *data;
    int64_t rows, cols;
    bool colmajor;
    int64_t ld;
    int64_t batch, bstride; /* bstride in elements, 0 when batch == 1 */
} mat_view;

static FG_MUST_USE fg_status bad_layout(const char *what, const fg_tensor *t, const char *why) {
    char b[96];
    return fg_error(FG_EINVAL, "matmul: %s %s %s (make it contiguous first)", what,
                    fg_tensor_describe(t, b, sizeof b), why);
}

static FG_MUST_USE fg_status view_of(const char *what, const fg_tensor *t, mat_view *v) {
    if (t->ndim < 2) return bad_layout(what, t, "has fewer than 2 dims");
    int nd = t->ndim;
    int64_t r = t->shape[nd - 2], c = t->shape[nd - 1];
    int64_t sr = t->strides[nd - 2], sc = t->strides[nd - 1];
    v->data = t->data;
    v->rows = r;
    v->cols = c;
    if (t->numel == 0) { /* nothing is read or written: any layout will do */
        v->colmajor = false;
        v->ld = FG_MAX(c, 1);
        v->batch = 1;
        for (int d = 0; d < nd - 2; d++) v->batch *= t->shape[d];
        v->bstride = 0;
        return FG_OK;
    }
    if ((sc == 1 || c <= 1) && (r <= 1 || sr >= FG_MAX(c, 1))) {
        v->colmajor = false;
        v->ld = r <= 1 ? FG_MAX(c, 1) : sr;
    } else if ((sr == 1 || r <= 1) && (c <= 1 || sc >= FG_MAX(r, 1))) {
        v->colmajor = true;
        v->ld = c <= 1 ? FG_MAX(r, 1) : sc;
    } else {
        return bad_layout(what, t, "has no unit stride in its last two dims");
    }
    /* collapse the batch dims to one stride, innermost first */
    int64_t batch = 1, bstride = 0;
    for (int d = nd - 3; d >= 0; d--) {
        if (t->shape[d] == 1) continue;
        if (batch == 1) bstride = t->strides[d];
        else if (t->strides[d] != bstride * batch)
            return bad_layout(what, t, "has batch dims that do not collapse to one stride");
        batch *= t->shape[d];
    }
    v->batch = batch;
    v->bstride = batch > 1 ? bstride : 0;
    if (v->ld > INT_MAX || r > INT_MAX || c > INT_MAX)
        return bad_layout(what, t, "is too large for a 32-bit BLAS");
    return FG_OK;
}

static bool same_batch_dims(const fg_tensor *x, const fg_tensor *y) {
    if (x->ndim != y->ndim) return false;
    for (int d = 0; d < x->ndim - 2; d++)
        if (x->shape[d] != y->shape[d]) return false;
    return true;
}

fg_status fg__cpu_matmul(const fg_tensor *a, bool ta, const fg_tensor *b, bool tb, fg_tensor *c,
                         double alpha, double beta) {
    char sa[96], sb[96], sc[96];
    if (a->dtype != b->dtype || a->dtype != c->dtype)
        return fg_error(FG_EINVAL, "matmul: dtypes differ (%s, %s, %s)", fg_dtype_name(a->dtype),
                        fg_dtype_name(b->dtype), fg_dtype_name(c->dtype));
    mat_view va, vb, vc;
    FG_TRY(view_of("a", a, &va));
    FG_TRY(view_of("b", b, &vb));
    FG_TRY(view_of("c", c, &vc));
    int64_t M = ta ? va.cols : va.rows, K = ta ? va.rows : va.cols;
    int64_t Kb = tb ? vb.cols : vb.rows, N = tb ? vb.rows : vb.cols;
    bool shared_b = b->ndim == 2;
    if (K != Kb || vc.rows != M || vc.cols != N || !same_batch_dims(a, c) ||
        (!shared_b && !same_batch_dims(a, b)))
        return fg_error(FG_EINVAL,
                        "matmul: shapes do not fit: a %s%s @ b %s%s -> c %s (want a (..., M, K), "
                        "b (..., K, N) or (K, N), c (..., M, N))",
                        fg_tensor_describe(a, sa, sizeof sa), ta ? "^T" : "",
                        fg_tensor_describe(b, sb, sizeof sb), tb ? "^T" : "",
                        fg_tensor_describe(c, sc, sizeof sc));
    if (vc.colmajor)
        return bad_layout("c", c, "is transposed (the output needs unit stride along its rows)");
    int64_t batch = va.batch;
    if (batch == 0 || M == 0 || N == 0) return FG_OK;
    int nth = fg__threads_now(); /* applies the thread count to OpenMP and OpenBLAS */

    if (K == 0) { /* no products: c = beta * c (BLAS would reject ld = 0 here) */
        FG_FLOAT_DISPATCH("matmul", c->dtype, {
            for (int64_t i = 0; i < batch; i++)
                for (int64_t m = 0; m < M; m++) {
                    T *row = (T *)vc.data + i * vc.bstride + m * vc.ld;
                    for (int64_t n = 0; n < N; n++) row[n] = beta == 0 ? 0 : (T)(beta * row[n]);
                }
        });
        return FG_OK;
    }

    enum CBLAS_TRANSPOSE opa = (ta != va.colmajor) ? CblasTrans : CblasNoTrans;
    enum CBLAS_TRANSPOSE opb = (tb != vb.colmajor) ? CblasTrans : CblasNoTrans;
    /* the batch folds into M when a's and c's entries follow one another
     * row after row and every entry meets the same b */
    bool fold = batch > 1 && shared_b && opa == CblasNoTrans && va.bstride == M * va.ld &&
                vc.bstride == M * vc.ld && M * batch <= INT_MAX;
    if (fold) {
        M *= batch;
        batch = 1;
    }
    int im = (int)M, in = (int)N, ik = (int)K, lda = (int)va.ld, ldb = (int)vb.ld, ldc = (int)vc.ld;
    if (c->dtype == FG_F32 && batch == 1) {
        fg__gemm_choice ch;
        FG_TRY(fg__gemm_choose(opa == CblasTrans, opb == CblasTrans, beta != 0, M, N, K, nth, &ch));
        if (ch.threads != nth) fg__threads_use(ch.threads);
        fg_status s = FG_EUNSUPPORTED;
        if (ch.engine == FG_GEMM_ONEDNN)
            s = fg__cpu_gemm_dnnl_f32(opa == CblasTrans, opb == CblasTrans, M, N, K, (float)alpha,
                                      (const float *)va.data, lda, (const float *)vb.data, ldb,
                                      (float)beta, (float *)vc.data, ldc);
        if (s == FG_EUNSUPPORTED) { /* OpenBLAS's, or a variant oneDNN refuses */
            cblas_sgemm(CblasRowMajor, opa, opb, im, in, ik, (float)alpha, (const float *)va.data,
                        lda, (const float *)vb.data, ldb, (float)beta, (float *)vc.data, ldc);
            s = FG_OK;
        }
        if (ch.threads != nth) fg__threads_use(nth);
        return s;
    }
    int64_t bsa = va.bstride, bsb = shared_b ? 0 : vb.bstride, bsc = vc.bstride;
    bool par = batch > 1 && nth > 1 && M * N * K < FG_GEMM_SMALL;
    FG_FLOAT_DISPATCH("matmul", c->dtype, {
        const T *pa = (const T *)va.data, *pb = (const T *)vb.data;
        T *pc = (T *)vc.data;
        FG_PRAGMA(omp parallel for if (par) schedule(static))
        for (int64_t i = 0; i < batch; i++) FG_GEMM(T)
        (CblasRowMajor, opa, opb, im, in, ik, (T)alpha, pa + i * bsa, lda, pb + i * bsb, ldb,
         (T)beta, pc + i * bsc, ldc);
    });
    return FG_OK;
}

/* Rows and columns of y seen as (R, C) with C the bias length. */
static FG_MUST_USE fg_status bias_shape(const char *kernel, const fg_tensor *y,
                                        const fg_tensor *bias, int64_t *rows, int64_t *cols) {
    char sy[96], sbias[96];
    if (y->dtype != bias->dtype)
        return fg_error(FG_EINVAL, "%s: dtypes differ (%s and %s)", kernel, fg_dtype_name(y->dtype),
                        fg_dtype_name(bias->dtype));
    FG_TRY(fg__expect_contiguous(kernel, y));
    FG_TRY(fg__expect_contiguous(kernel, bias));
    int64_t C = bias->numel;
    if (bias->ndim != 1 || y->ndim < 1 || y->shape[y->ndim - 1] != C)
        return fg_error(FG_EINVAL, "%s: bias %s does not match the last dim of %s", kernel,
                        fg_tensor_describe(bias, sbias, sizeof sbias),
                        fg_tensor_describe(y, sy, sizeof sy));
    *cols = C;
    *rows = C ? y->numel / C : 0;
    return FG_OK;
}

fg_status fg__cpu_bias_add(fg_tensor *y, const fg_tensor *bias) {
    int64_t R, C;
    FG_TRY(bias_shape("bias_add", y, bias, &R, &C));
    bool par = y->numel > FG_PAR_MIN;
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    if (y->dtype == FG_F32 && vk->add_row) {
        const float *pb = bias->data;
        float *py = y->data;
        FG_PRAGMA(omp parallel for if (par) schedule(static))
        for (int64_t r = 0; r < R; r++) vk->add_row(py + r * C, pb, C);
        return FG_OK;
    }
    FG_FLOAT_DISPATCH("bias_add", y->dtype, {
        const T *pb = bias->data;
        T *py = y->data;
        FG_PRAGMA(omp parallel for if (par) schedule(static))
        for (int64_t r = 0; r < R; r++) {
            T *row = py + r * C;
            FG_PRAGMA(omp simd)
            for (int64_t j = 0; j < C; j++) row[j] += pb[j];
        }
    });
    return FG_OK;
}

/* bias_grad walks dy in row order over blocks of at most BIAS_BLOCK columns
 * (a block's double sums, 4 KiB, stay in L1): with one block per thread
 * (or a whole row) the rows stream from memory in order. Blocks of 64
 * columns that ran down all the rows first were 4-5x slower in a GPT step,
 * where dy comes from outside the cache. Each column is still summed in row
 * order in double, so the block split changes no bit. */
#define BIAS_BLOCK 512

fg_status fg__cpu_bias_grad(const fg_tensor *dy, fg_tensor *dbias) {
    int64_t R, C;
    FG_TRY(bias_shape("bias_grad", dy, dbias, &R, &C));
    if (C == 0) return FG_OK;
    bool par = dy->numel > FG_PAR_MIN;
    int64_t nth = par ? fg_get_num_threads() : 1;
    int64_t w = FG_MIN(BIAS_BLOCK, ((C + nth - 1) / nth + 15) / 16 * 16);
    int64_t nblocks = (C + w - 1) / w;
    par = par && nblocks > 1;
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    bool vacc = dy->dtype == FG_F32 && vk->acc_rows_d;
    FG_FLOAT_DISPATCH("bias_grad", dy->dtype, {
        const T *pg = dy->data;
        T *pd = dbias->data;
        FG_PRAGMA(omp parallel for if (par) schedule(static))
        for (int64_t blk = 0; blk < nblocks; blk++) {
            int64_t j0 = blk * w, n = FG_MIN(w, C - j0);
            double acc[BIAS_BLOCK] = {0};
            if (vacc) vk->acc_rows_d(acc, (const float *)pg + j0, C, R, n);
            for (int64_t r = 0; !vacc && r < R; r++) {
                const T *row = pg + r * C + j0;
                FG_PRAGMA(omp simd)
                for (int64_t j = 0; j < n; j++) acc[j] += row[j];
            }
            for (int64_t j = 0; j < n; j++) pd[j0 + j] = (T)(pd[j0 + j] + acc[j]);
        }
    });
    return FG_OK;
}
