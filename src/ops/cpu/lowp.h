/* bf16 and f16 on the CPU: the conversions between them and f32, each with
 * a fast path chosen at run time, and the op table's entries for tensors of
 * those dtypes.
 *
 * Every low-precision kernel here converts its bf16/f16 operands to f32,
 * runs the f32 kernel of the table (whose own vector path fg__vk is chosen
 * from the CPU) and rounds its outputs back once, to nearest even. So a
 * result of any path is the f32 result rounded once; the conversion paths
 * below agree bit for bit on every input but one class: AVX512-BF16's
 * vcvtneps2bf16 flushes f32 subnormals (|x| < 2^-126) to a signed zero, as
 * its definition says, where the others round them. The bf16 matrix
 * products go to matmul_bf16.c (oneDNN's bf16 matmul or its fallback). */
#ifndef FULGUR_CPU_LOWP_H
#define FULGUR_CPU_LOWP_H

#include "cpu_impl.h"

/* The conversion paths, best last. */
typedef enum fg__lowp_path {
    FG_LOWP_SCALAR = 0,  /* portable C: fg_f32_to_bf16's and fg_f32_to_f16's rounding */
    FG_LOWP_AVX2,        /* 8 lanes: bf16 by integer rounding, f16 by F16C */
    FG_LOWP_AVX512,      /* 16 lanes: bf16 by integer rounding, f16 by AVX-512's vcvtps2ph */
    FG_LOWP_AVX512_BF16, /* as AVX512, bf16 narrowed by vcvtneps2bf16 */
    FG_LOWP_COUNT
} fg__lowp_path;

/* The path in use: the best the CPU has under fg_cpu_isa() (FULGUR_CPU_ISA
 * caps it: avx2 gives FG_LOWP_AVX2 on any CPU), or the one a test forced. */
fg__lowp_path fg__lowp_path_get(void);
/* Forces a path for tests (p < 0: back to the CPU's choice). FG_EUNSUPPORTED
 * when the CPU lacks it. Not thread-safe against running kernels. */
FG_MUST_USE fg_status fg__lowp_path_force(int p);
/* "avx512_bf16", "avx512", "avx2", "scalar" */
const char *fg__lowp_path_name(fg__lowp_path p);
/* Whether the CPU (and the build) can run path p. */
bool fg__lowp_path_available(fg__lowp_path p);

/* dst (n) f32 = src (n) bf16 or f16: exact. */
void fg__lowp_widen(float *dst, const uint16_t *src, int64_t n, fg_dtype dt);
/* dst (n) bf16 or f16 = src (n) f32, rounded to nearest even; NaN stays a
 * (quiet) NaN, f16 overflows to inf. */
void fg__lowp_narrow(uint16_t *dst, const float *src, int64_t n, fg_dtype dt);

/* dst (n) f32 = src (n) f32 rounded to dt (bf16 or f16) and widened back:
 * fg__lowp_narrow then fg__lowp_widen, in one pass. dst may be src. */
void fg__lowp_round_f32(float *dst, const float *src, int64_t n, fg_dtype dt);

static inline bool fg__is_lowp(fg_dtype dt) { return dt == FG_BF16 || dt == FG_F16; }

/* lowp_ops.c: the op table's CPU entries for every dtype: f32/f64 tensors
 * go straight to the kernels of cpu_impl.h, calls with bf16/f16 tensors
 * (mixed with f32 ones where an entry allows: binary, sum_to, axpby,
 * bias_add, bias_grad, the attention's f32 lse) convert as described at
 * the top. */
extern const fg_op_table fg__cpu_ops_lowp;

/* lowp_ops.c: a buffer of at least `bytes` that the calling thread keeps
 * (grown as needed, freed when the thread ends), for matmul_bf16.c's f32
 * copies; valid until the thread's next call. NULL with FG_ENOMEM. */
void *fg__lowp_scratch(size_t bytes);

/* lowp_ops.c: y (R, out) bf16/f16 = x (R, in) @ w (out, in)^T + bias (out,
 * f32, or NULL), x and w in y's dtype, the product accumulated in f32 and
 * the bias added before the one rounding. */
FG_MUST_USE fg_status fg__cpu_linear_lowp(const fg_tensor *x, const fg_tensor *w,
                                          const fg_tensor *bias, fg_tensor *y);

/* lowp_ops.c: the backward of fg__cpu_linear_lowp, for g (R, out) the
 * output's gradient in x's and w's dtype: dx (R, in) = g @ w + beta_dx dx,
 * dw (out, in) += g^T @ x, db (out) += the column sums of gbias (R, out;
 * g itself, or the gradient before its rounding), each skipped when NULL.
 * Where the bf16 product has no hardware (fg__matmul_bf16_native false)
 * and for f16, g is widened to f32 once for all three. */
FG_MUST_USE fg_status fg__cpu_linear_lowp_bwd(const fg_tensor *x, const fg_tensor *w,
                                              const fg_tensor *g, const fg_tensor *gbias,
                                              fg_tensor *dx, double beta_dx, fg_tensor *dw,
                                              fg_tensor *db);

/* matmul_bf16.c: whether bf16 products run on a bf16 product (oneDNN's)
 * rather than the f32 fallback: the mode (FULGUR_MATMUL_BF16) is not
 * fallback and oneDNN has a bf16 matmul on this CPU. */
bool fg__matmul_bf16_native(void);

#endif
