/* The CPU kernels. Each file implements a group of table entries; table.c
 * puts them together. Float kernels are written once over a type T through
 * the FG_FLOAT_DISPATCH macro, which picks float or double. */
#ifndef FULGUR_CPU_IMPL_H
#define FULGUR_CPU_IMPL_H

#include "fulgur/ops.h"
#include "tensor/tensor_impl.h"

extern const fg_op_table fg__cpu_ops;

/* Runs the body (the variadic arguments, so commas are fine) with T = float
 * or double according to dtype dt, or returns FG_EUNSUPPORTED naming the
 * kernel. Inside the body, write OpenMP pragmas as FG_PRAGMA(omp ...). */
#define FG_FLOAT_DISPATCH(kernel, dt, ...)                                                         \
    do {                                                                                           \
        if ((dt) == FG_F32) {                                                                      \
            typedef float T;                                                                       \
            __VA_ARGS__;                                                                           \
        } else if ((dt) == FG_F64) {                                                               \
            typedef double T;                                                                      \
            __VA_ARGS__;                                                                           \
        } else {                                                                                   \
            return fg_error(FG_EUNSUPPORTED, "%s: dtype %s not supported on cpu", kernel,          \
                            fg_dtype_name(dt));                                                    \
        }                                                                                          \
    } while (0)
#define FG_PRAGMA(x) _Pragma(#x)

/* Work below this many elements stays on one thread. */
#define FG_PAR_MIN 65536

/* Shape checks that name the tensors. */
fg_status fg__expect_same_shape(const char *kernel, const fg_tensor *a, const fg_tensor *b);
fg_status fg__expect_contiguous(const char *kernel, const fg_tensor *t);

/* elementwise.c */
fg_status fg__cpu_binary(fg_binary_op op, const fg_tensor *a, const fg_tensor *b, fg_tensor *y);
fg_status fg__cpu_sum_to(const fg_tensor *x, fg_tensor *y, double alpha, double beta);
fg_status fg__cpu_axpby(double alpha, const fg_tensor *x, double beta, fg_tensor *y);
fg_status fg__cpu_scale(const fg_tensor *x, double s, fg_tensor *y);
fg_status fg__cpu_sum_all(const fg_tensor *x, double *out);
fg_status fg__cpu_sumsq_all(const fg_tensor *x, double *out);

/* matmul.c */
fg_status fg__cpu_matmul(const fg_tensor *a, bool ta, const fg_tensor *b, bool tb, fg_tensor *c,
                         double alpha, double beta);
fg_status fg__cpu_bias_add(fg_tensor *y, const fg_tensor *bias);
fg_status fg__cpu_bias_grad(const fg_tensor *dy, fg_tensor *dbias);

/* matmul_bf16.c: c (f32 or bf16) = alpha op(a) op(b) + beta c with bf16 a
 * and b, contiguous, same shapes as matmul: through oneDNN's bf16 matmul
 * where oneDNN implements it, else through an f32 fallback (the choice:
 * FULGUR_MATMUL_BF16 and fg_matmul_bf16_path). Internal: for the precision
 * layer. */
fg_status fg__cpu_matmul_bf16(const fg_tensor *a, bool ta, const fg_tensor *b, bool tb,
                              fg_tensor *c, double alpha, double beta);
/* Overrides FULGUR_MATMUL_BF16 for this process with "auto", "onednn" or
 * "fallback" (FG_EINVAL for anything else); NULL goes back to the
 * environment's choice. For tests, between products (not thread-safe
 * against products running on other threads). */
fg_status fg__matmul_bf16_set_mode(const char *mode);

/* matmul_dnnl.c: oneDNN's bf16 product on operands fg__cpu_matmul_bf16 has
 * checked (batch, M, K, N all > 0). FG_EUNSUPPORTED when oneDNN implements
 * no such product on this CPU or the build has no oneDNN. */
fg_status fg__dnnl_matmul_bf16(const fg_tensor *a, bool ta, const fg_tensor *b, bool tb,
                               fg_tensor *c, double alpha, double beta, int64_t batch, int64_t M,
                               int64_t K, int64_t N);
/* matmul_dnnl.c: FG_OK when oneDNN implements a plain bf16 matmul on this
 * CPU (asks it for a small primitive each call: cache the answer);
 * FG_EUNSUPPORTED when it does not or the build has no oneDNN. */
fg_status fg__dnnl_bf16_probe(void);
/* matmul_dnnl.c: the ISA oneDNN runs at ("avx512_core_bf16", "avx2"; after
 * ONEDNN_MAX_CPU_ISA), NULL in a build without oneDNN. */
const char *fg__dnnl_isa(void);

/* matmul_dnnl.c: row-major f32 c (M, N) = alpha op(a) op(b) + beta c
 * through oneDNN's matmul, leading dimensions as cblas_sgemm's; returns
 * FG_EUNSUPPORTED (the caller then uses OpenBLAS) in a build without
 * oneDNN or for a variant oneDNN does not implement on this CPU. */
fg_status fg__cpu_gemm_dnnl_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                                const float *a, int64_t lda, const float *b, int64_t ldb,
                                float beta, float *c, int64_t ldc);

/* attention.c */
fg_status fg__cpu_attention_fwd(const fg_tensor *qkv, int heads, fg_tensor *y, fg_tensor *lse);
fg_status fg__cpu_attention_bwd(const fg_tensor *qkv, int heads, const fg_tensor *y,
                                const fg_tensor *lse, const fg_tensor *dy, fg_tensor *dqkv);

/* reduce.c */
fg_status fg__cpu_sum_dim(const fg_tensor *x, int dim, fg_tensor *y, double alpha);
fg_status fg__cpu_sum_dim_bwd(const fg_tensor *dy, int dim, fg_tensor *dx, double alpha);

/* activation.c */
fg_status fg__cpu_relu_fwd(const fg_tensor *x, fg_tensor *y);
fg_status fg__cpu_relu_bwd(const fg_tensor *x, const fg_tensor *dy, fg_tensor *dx);
fg_status fg__cpu_gelu_fwd(const fg_tensor *x, fg_tensor *y);
fg_status fg__cpu_gelu_bwd(const fg_tensor *x, const fg_tensor *dy, fg_tensor *dx);

/* softmax.c */
fg_status fg__cpu_softmax_fwd(const fg_tensor *x, fg_tensor *y);
fg_status fg__cpu_softmax_bwd(const fg_tensor *y, const fg_tensor *dy, fg_tensor *dx);
fg_status fg__cpu_log_softmax_fwd(const fg_tensor *x, fg_tensor *y);
fg_status fg__cpu_log_softmax_bwd(const fg_tensor *y, const fg_tensor *dy, fg_tensor *dx);

/* loss.c */
fg_status fg__cpu_cross_entropy_fwd(const fg_tensor *logits, const fg_tensor *targets,
                                    int64_t ignore_index, fg_tensor *loss, int64_t *count);
fg_status fg__cpu_cross_entropy_bwd(const fg_tensor *logits, const fg_tensor *targets,
                                    int64_t ignore_index, double dloss, int64_t count,
                                    fg_tensor *dlogits);

/* layernorm.c */
fg_status fg__cpu_layernorm_fwd(const fg_tensor *x, const fg_tensor *w, const fg_tensor *b,
                                double eps, fg_tensor *y, fg_tensor *mean, fg_tensor *rstd);
fg_status fg__cpu_layernorm_bwd(const fg_tensor *x, const fg_tensor *w, const fg_tensor *mean,
                                const fg_tensor *rstd, const fg_tensor *dy, fg_tensor *dx,
                                fg_tensor *dw, fg_tensor *db);

/* embedding.c */
fg_status fg__cpu_embedding_fwd(const fg_tensor *idx, const fg_tensor *weight, fg_tensor *y);
fg_status fg__cpu_embedding_bwd(const fg_tensor *idx, const fg_tensor *dy, fg_tensor *dweight);

/* dropout.c */
fg_status fg__cpu_dropout_fwd(const fg_tensor *x, double p, uint64_t seed, uint64_t offset,
                              fg_tensor *y);
fg_status fg__cpu_dropout_bwd(const fg_tensor *dy, double p, uint64_t seed, uint64_t offset,
                              fg_tensor *dx);

#endif
