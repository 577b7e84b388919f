/* One f32 product on OpenBLAS on the calling thread alone (ops_impl.h):
 * for results that must not depend on the engine gemm_pick.c measured or on
 * the thread count, which differ between processes. */
#include "blas.h"
#include "ops/ops_impl.h"

fg_status fg__ops_sgemm_serial(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *a,
                               int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                               int64_t ldc) {
    /* the stored row lengths of a, b and c, which their ld must cover */
    int64_t ra = ta ? M : K, rb = tb ? K : N;
    if (M < 0 || N < 0 || K < 0 || M > INT_MAX || N > INT_MAX || K > INT_MAX ||
        lda < FG_MAX(1, ra) || ldb < FG_MAX(1, rb) || ldc < FG_MAX(1, N) || lda > INT_MAX ||
        ldb > INT_MAX || ldc > INT_MAX)
        return fg_error(FG_EINVAL,
                        "sgemm_serial: sizes M %lld N %lld K %lld with lda %lld ldb %lld ldc "
                        "%lld out of range (0..INT_MAX, ld at least the row length)",
                        (long long)M, (long long)N, (long long)K, (long long)lda, (long long)ldb,
                        (long long)ldc);
    if (M == 0 || N == 0) return FG_OK;
    if (K == 0) { /* c = beta c (BLAS would reject an ld of 0 here) */
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) c[i * ldc + j] = beta == 0 ? 0 : beta * c[i * ldc + j];
        return FG_OK;
    }
    int nth = fg__threads_now();
    if (nth != 1) fg__threads_use(1);
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (int)M, (int)N, (int)K, 1.0f, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
    if (nth != 1) fg__threads_use(nth);
    return FG_OK;
}
