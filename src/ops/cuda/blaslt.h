/* Matrix products of the CUDA backend through cuBLASLt (blaslt.c). */
#ifndef FULGUR_CUDA_BLASLT_H
#define FULGUR_CUDA_BLASLT_H

#include <stdbool.h>
#include <stdint.h>

#include "fulgur/core.h"

/* Epilogues fused into the product. */
enum { FG_CU_EPI_NONE = 0, FG_CU_EPI_BIAS = 1, FG_CU_EPI_GELU_BIAS = 2, FG_CU_EPI_GELU = 3 };

/* c (M, N) = alpha op(a) op(b) + beta c, row-major like cblas_sgemm (lda,
 * ldb, ldc the stored row lengths), `batch` times with element strides
 * sa, sb, sc between the batch entries (sb 0: b shared), on stream `st`
 * of GPU `gpu`; dtab (FG_CU_* of launch.h) for a and b, dtc for c; f32
 * and bf16/f16 accumulate in f32; f32 products use TF32 only when
 * fg__cuda_matmul_precision() is "high" or "medium". epi adds bias (N, in
 * dtc, or f32 for bf16/f16) and/or the tanh GELU after the product.
 * FG_EUNSUPPORTED naming cuBLASLt's status when it has no algorithm, and
 * when libcublasLt cannot be opened (saying which file). */
FG_MUST_USE fg_status fg__cuda_gemm(void *st, int gpu, int dtab, int dtc, bool ta, bool tb,
                                    int64_t M, int64_t N, int64_t K, const void *a, int64_t lda,
                                    int64_t sa, const void *b, int64_t ldb, int64_t sb, void *c,
                                    int64_t ldc, int64_t sc, int64_t batch, float alpha, float beta,
                                    int epi, const void *bias, int dtbias);

/* "highest", "high" or "medium": FULGUR_MATMUL_PRECISION at the first
 * product, or what fg__cuda_set_matmul_precision set (as
 * torch.set_float32_matmul_precision). */
const char *fg__cuda_matmul_precision(void);
FG_MUST_USE fg_status fg__cuda_set_matmul_precision(const char *p);

#endif
