/* Private entries of the ops layer for the layers above it (autograd's
 * autocast): what the public op table does not carry yet. */
#ifndef FULGUR_OPS_IMPL_H
#define FULGUR_OPS_IMPL_H

#include "fulgur/ops.h"

/* c (f32 or bf16) = alpha op(a) op(b) + beta c with bf16 a and b, shapes as
 * the table's matmul, all contiguous, on a's device: oneDNN's bf16 product
 * or the f32 fallback, as fg_matmul_bf16_path says. FG_EUNSUPPORTED on a
 * device without one. */
fg_status fg__ops_matmul_bf16(const fg_tensor *a, bool ta, const fg_tensor *b, bool tb,
                              fg_tensor *c, double alpha, double beta);

/* y (R, out) bf16/f16 = x (R, in) @ w (out, in)^T + bias (out, f32, or
 * NULL): x and w in y's dtype, accumulated in f32, the bias added before
 * the one rounding (PyTorch's addmm under autocast). */
fg_status fg__ops_linear_lowp(const fg_tensor *x, const fg_tensor *w, const fg_tensor *bias,
                              fg_tensor *y);

/* Its backward, for g (R, out) the output's gradient in x's and w's
 * dtype: dx (R, in) = g @ w + beta_dx dx, dw (out, in) += g^T @ x (f32
 * accumulation, written in dw's own dtype), db (out) += the column sums of
 * gbias (R, out: g, or the gradient before its rounding to g's dtype) in
 * f32; NULL skips one. Where the product has no low-precision hardware, g
 * is widened once for all three. */
fg_status fg__ops_linear_lowp_bwd(const fg_tensor *x, const fg_tensor *w, const fg_tensor *g,
                                  const fg_tensor *gbias, fg_tensor *dx, double beta_dx,
                                  fg_tensor *dw, fg_tensor *db);

/* Raw conversions on the same paths: f32 dst (n) = bf16/f16 src, exactly;
 * bf16/f16 dst (n) = f32 src, rounded to nearest even. */
void fg__ops_widen(float *dst, const uint16_t *src, int64_t n, fg_dtype dt);
void fg__ops_narrow(uint16_t *dst, const float *src, int64_t n, fg_dtype dt);

/* dst (bf16 or f16) = src (f32) rounded to nearest even, both contiguous
 * and of one size, on the conversion path of fg_ops_lowp_path. */
fg_status fg__ops_round(const fg_tensor *src, fg_tensor *dst);

/* Whether products in dt run on low-precision hardware on device (oneDNN's
 * bf16 matmul); false: they widen their operands to f32, so an operand kept
 * in f32 with dt's values (fg__ops_round_f32) spares the widening. */
bool fg__ops_lowp_product_native(fg_device device, fg_dtype dt);

/* dst (f32) = src (f32) rounded to dt (bf16 or f16) to nearest even, kept
 * in f32; both contiguous and of one size. */
fg_status fg__ops_round_f32(const fg_tensor *src, fg_tensor *dst, fg_dtype dt);

/* c (M, N) = op(a) op(b) + beta c in f32, row-major with leading
 * dimensions as cblas_sgemm's, on OpenBLAS on the calling thread alone
 * whatever the thread setting and FULGUR_GEMM: the same bits on every rank
 * and thread count of one machine type (for results every rank must agree
 * on, such as PowerSGD's low-rank products). FG_EINVAL for a size or
 * leading dimension out of range (negative, above INT_MAX, or ld below the
 * row length). */
fg_status fg__ops_sgemm_serial(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *a,
                               int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                               int64_t ldc);

#endif
