/* fulgur ops: the kernels, behind one table per device.
 *
 * A kernel computes into tensors it is given; it allocates nothing the
 * caller sees and records nothing (autograd, the layer above, does that).
 * fg_ops_get(device) returns the table; CPU is built in, a CUDA table slots
 * in later with the same entries.
 *
 * Conventions for every entry:
 *   - float tensors are all the same dtype, FG_F32 or FG_F64, or bf16/f16:
 *     a call with bf16/f16 tensors converts them to f32, runs the f32
 *     kernel and rounds its outputs once (an entry may mix bf16/f16 with
 *     f32 tensors: binary, sum_to, axpby, bias_add, bias_grad, the
 *     attention's and layer norm's f32 statistics); index tensors are FG_I32;
 *   - inputs and outputs are contiguous unless the entry says otherwise;
 *   - "(B, T, C)" comments give shapes; leading dims of ... are flattened;
 *   - forward kernels overwrite their output; backward kernels ACCUMULATE
 *     (+=) into their gradient outputs, so gradients of a tensor used twice
 *     add up without temporaries;
 *   - errors: FG_EINVAL (shapes, naming them), FG_EUNSUPPORTED (dtype).
 * Kernels run on fg_get_num_threads() threads (OpenMP, OpenBLAS). */
#ifndef FULGUR_OPS_H
#define FULGUR_OPS_H

#include "fulgur/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fg_binary_op { FG_BIN_ADD, FG_BIN_SUB, FG_BIN_MUL, FG_BIN_DIV } fg_binary_op;

/* The elementwise functions of one tensor behind unary_fwd/unary_bwd, with
 * their two scalar parameters a, b (unused ones are ignored), as PyTorch's:
 *   EXP, LOG, SQRT, RSQRT, ABS, SIGMOID, TANH, SILU, GELU_ERF (exact GELU,
 *   x Phi(x)); POW x^a; CLAMP to [a, b] (a = -inf / b = inf for no bound;
 *   the gradient passes where a <= x <= b); SOFTPLUS log(1 + exp(a x)) / a,
 *   x itself where a x > b (beta, threshold); LEAKY_RELU slope a; ELU
 *   alpha a. */
typedef enum fg_unary_op {
    FG_UN_EXP,
    FG_UN_LOG,
    FG_UN_SQRT,
    FG_UN_RSQRT,
    FG_UN_POW,
    FG_UN_ABS,
    FG_UN_CLAMP,
    FG_UN_SIGMOID,
    FG_UN_TANH,
    FG_UN_SILU,
    FG_UN_GELU_ERF,
    FG_UN_SOFTPLUS,
    FG_UN_LEAKY_RELU,
    FG_UN_ELU,
} fg_unary_op;

/* A 2-d convolution's geometry (x (N, C, H, W), w (O, C / groups, KH, KW),
 * y (N, O, OH, OW)): strides, the padding before the first row and column
 * (the padding after them follows from the output size the caller gives
 * y), dilations, groups. */
typedef struct fg_conv_params {
    int64_t stride[2], pad[2], dilation[2], groups;
    /* conv2d_bwd_data writes dx instead of adding to it: dx holds nothing
     * yet (a gradient buffer just made, not zeroed) */
    bool overwrite;
    /* conv2d_bwd_weight comes right after conv2d_bwd_data on the same dy
     * (one convolution's backward): a kernel may reuse what it made of dy */
    bool dy_as_before;
} fg_conv_params;

/* A 2-d pooling over x (N, C, H, W) into y (N, C, OH, OW): MAX (indices
 * into each H x W plane, PyTorch's), AVG (count_include_pad as PyTorch's:
 * windows clipped at the padded border count their padding) or
 * ADAPTIVE_AVG (window i of rows [floor(i H / OH), ceil((i + 1) H / OH)),
 * kernel, stride, pad and dilation unused). */
typedef enum fg_pool_kind { FG_POOL_MAX, FG_POOL_AVG, FG_POOL_ADAPTIVE_AVG } fg_pool_kind;
typedef struct fg_pool_params {
    fg_pool_kind kind;
    int64_t kernel[2], stride[2], pad[2], dilation[2];
    bool count_include_pad;
} fg_pool_params;

/* The elementwise losses behind pointwise_loss_fwd/bwd, of x against t
 * (parameter p, optional elementwise tensor w), unreduced:
 *   MSE (x - t)^2; L1 |x - t|; SMOOTH_L1 0.5 d^2 / p where |d| < p, else
 *   |d| - 0.5 p (p = beta; p = 0 is L1); HUBER 0.5 d^2 where |d| <= p,
 *   else p (|d| - 0.5 p) (p = delta); BCE -(t log x + (1 - t) log(1 - x)),
 *   each log clamped at -100 as PyTorch's; BCE_LOGITS the same of
 *   sigmoid(x), stably, w (or NULL) the pos_weight: -(w t log s(x) + (1 - t)
 *   log(1 - s(x))); KL_DIV xlogy(t, t) - t x (0 log 0 = 0; the target's
 *   gradient where t <= 0 is that of -t x), or with p != 0 (log_target)
 *   exp(t) (t - x). */
typedef enum fg_loss_op {
    FG_LOSS_MSE,
    FG_LOSS_L1,
    FG_LOSS_SMOOTH_L1,
    FG_LOSS_HUBER,
    FG_LOSS_BCE,
    FG_LOSS_BCE_LOGITS,
    FG_LOSS_KL_DIV,
} fg_loss_op;

typedef struct fg_op_table {
    const char *device; /* "cpu" */

    /* ---- matrix products ---- */
    /* c = alpha * op(a) @ op(b) + beta * c, where op transposes the last two
     * dims when ta/tb. a (..., M, K), b (..., K, N) or b (K, N) shared by
     * every batch entry, c (..., M, N). The batch dims of a and c agree. */
    FG_MUST_USE fg_status (*matmul)(const fg_tensor *a, bool ta, const fg_tensor *b, bool tb,
                                    fg_tensor *c, double alpha, double beta);
    /* y (R, C) += bias (C), every row. */
    FG_MUST_USE fg_status (*bias_add)(fg_tensor *y, const fg_tensor *bias);
    /* dbias (C) += sum over rows of dy (R, C). */
    FG_MUST_USE fg_status (*bias_grad)(const fg_tensor *dy, fg_tensor *dbias);

    /* ---- elementwise ---- */
    /* y = a op b with numpy broadcasting (y has the broadcast shape). */
    FG_MUST_USE fg_status (*binary)(fg_binary_op op, const fg_tensor *a, const fg_tensor *b,
                                    fg_tensor *y);
    /* y = beta * y + alpha * (x summed down to y's shape): the backward of a
     * broadcast. y's shape is x's with leading dims dropped and/or dims of 1. */
    FG_MUST_USE fg_status (*sum_to)(const fg_tensor *x, fg_tensor *y, double alpha, double beta);
    /* y = alpha * x + beta * y (y may not alias x unless beta == 0 and y == x). */
    FG_MUST_USE fg_status (*axpby)(double alpha, const fg_tensor *x, double beta, fg_tensor *y);
    /* y = x * s (y may be x). */
    FG_MUST_USE fg_status (*scale)(const fg_tensor *x, double s, fg_tensor *y);
    /* sum of all elements, in double */
    FG_MUST_USE fg_status (*sum_all)(const fg_tensor *x, double *out);
    /* sum of squares of all elements, in double (gradient norms) */
    FG_MUST_USE fg_status (*sumsq_all)(const fg_tensor *x, double *out);
    /* y (outer, inner) = sum over dim of x (outer, n, inner), times alpha */
    FG_MUST_USE fg_status (*sum_dim)(const fg_tensor *x, int dim, fg_tensor *y, double alpha);
    /* dx (outer, n, inner) += alpha * dy (outer, inner) broadcast over dim */
    FG_MUST_USE fg_status (*sum_dim_bwd)(const fg_tensor *dy, int dim, fg_tensor *dx, double alpha);

    /* ---- activations ---- */
    FG_MUST_USE fg_status (*relu_fwd)(const fg_tensor *x, fg_tensor *y);
    FG_MUST_USE fg_status (*relu_bwd)(const fg_tensor *x, const fg_tensor *dy, fg_tensor *dx);
    /* GELU, tanh approximation (PyTorch's approximate="tanh"). */
    FG_MUST_USE fg_status (*gelu_fwd)(const fg_tensor *x, fg_tensor *y);
    FG_MUST_USE fg_status (*gelu_bwd)(const fg_tensor *x, const fg_tensor *dy, fg_tensor *dx);

    /* ---- softmax family, over the last dim of (..., C) ---- */
    FG_MUST_USE fg_status (*softmax_fwd)(const fg_tensor *x, fg_tensor *y);
    /* dx += y * (dy - sum(dy * y)) */
    FG_MUST_USE fg_status (*softmax_bwd)(const fg_tensor *y, const fg_tensor *dy, fg_tensor *dx);
    FG_MUST_USE fg_status (*log_softmax_fwd)(const fg_tensor *x, fg_tensor *y);
    /* dx += dy - exp(y) * sum(dy) */
    FG_MUST_USE fg_status (*log_softmax_bwd)(const fg_tensor *y, const fg_tensor *dy,
                                             fg_tensor *dx);
    /* Mean cross-entropy of logits (N, V) against targets (N) (i32); targets
     * equal to ignore_index do not count. loss (0-d) = sum / count (0 when no
     * target counts). Saves nothing: the backward recomputes the softmax. */
    FG_MUST_USE fg_status (*cross_entropy_fwd)(const fg_tensor *logits, const fg_tensor *targets,
                                               int64_t ignore_index, fg_tensor *loss,
                                               int64_t *count);
    /* dlogits += dloss * (softmax(logits) - onehot(target)) / count */
    FG_MUST_USE fg_status (*cross_entropy_bwd)(const fg_tensor *logits, const fg_tensor *targets,
                                               int64_t ignore_index, double dloss, int64_t count,
                                               fg_tensor *dlogits);
    /* The same pair, the forward also saving each row's max m and sum s of
     * exp(logits - m) (its logsumexp is m + log(s)) into stats (2, N) f64
     * (stats[0] the maxes), and the backward taking them instead of
     * recomputing them: dlogits += dloss * (exp(logits - m) / s -
     * onehot(target)) / count, one exp an element. The same bits as the
     * pair above. */
    FG_MUST_USE fg_status (*cross_entropy_fwd_stats)(const fg_tensor *logits,
                                                     const fg_tensor *targets, int64_t ignore_index,
                                                     fg_tensor *loss, int64_t *count,
                                                     fg_tensor *stats);
    FG_MUST_USE fg_status (*cross_entropy_bwd_stats)(const fg_tensor *logits,
                                                     const fg_tensor *targets,
                                                     const fg_tensor *stats, int64_t ignore_index,
                                                     double dloss, int64_t count,
                                                     fg_tensor *dlogits);

    /* ---- normalisation ---- */
    /* x (N, C), weight/bias (C) or NULL; y (N, C); mean, rstd (N) saved. */
    FG_MUST_USE fg_status (*layernorm_fwd)(const fg_tensor *x, const fg_tensor *w,
                                           const fg_tensor *b, double eps, fg_tensor *y,
                                           fg_tensor *mean, fg_tensor *rstd);
    FG_MUST_USE fg_status (*layernorm_bwd)(const fg_tensor *x, const fg_tensor *w,
                                           const fg_tensor *mean, const fg_tensor *rstd,
                                           const fg_tensor *dy, fg_tensor *dx, fg_tensor *dw,
                                           fg_tensor *db); /* dx/dw/db may be NULL */

    /* ---- embedding ---- */
    /* y (N, C) = weight (V, C)[idx (N)]; an index out of [0, V) is FG_EINVAL naming it. */
    FG_MUST_USE fg_status (*embedding_fwd)(const fg_tensor *idx, const fg_tensor *weight,
                                           fg_tensor *y);
    /* dweight (V, C) += scatter of dy (N, C) at idx */
    FG_MUST_USE fg_status (*embedding_bwd)(const fg_tensor *idx, const fg_tensor *dy,
                                           fg_tensor *dweight);

    /* ---- dropout ---- */
    /* y = x * mask / (1 - p), mask element i kept when the Philox draw at
     * (seed, offset + i) is >= p: the same mask on any thread count. */
    FG_MUST_USE fg_status (*dropout_fwd)(const fg_tensor *x, double p, uint64_t seed,
                                         uint64_t offset, fg_tensor *y);
    FG_MUST_USE fg_status (*dropout_bwd)(const fg_tensor *dy, double p, uint64_t seed,
                                         uint64_t offset, fg_tensor *dx);

    /* ---- attention ---- */
    /* Self-attention on a fused qkv (B, T, 3C) with H heads of C/H:
     * y (B, T, C) = concat_h softmax(q k^T / sqrt(C/H) [+ masks]) v, row t
     * seeing keys 0..t when causal, all T keys when not, less the keys kpm
     * (B, T) (u8 or i32, contiguous, or NULL) marks nonzero in its batch
     * entry (a row left without keys is NaN, as PyTorch's). lse (B, H, T)
     * saves the log-sum-exp of each row for the backward. */
    FG_MUST_USE fg_status (*attention_fwd)(const fg_tensor *qkv, int heads, bool causal,
                                           const fg_tensor *kpm, fg_tensor *y, fg_tensor *lse);
    /* dqkv (B, T, 3C) += gradient, from qkv, y, lse and dy (causal and kpm
     * as in the forward). */
    FG_MUST_USE fg_status (*attention_bwd)(const fg_tensor *qkv, int heads, bool causal,
                                           const fg_tensor *kpm, const fg_tensor *y,
                                           const fg_tensor *lse, const fg_tensor *dy,
                                           fg_tensor *dqkv);

    /* ---- elementwise functions (fg_unary_op), x and y of one shape ---- */
    FG_MUST_USE fg_status (*unary_fwd)(fg_unary_op op, const fg_tensor *x, double a, double b,
                                       fg_tensor *y);
    /* dx += dy op'(x); y = op(x) is given too (EXP, SQRT, RSQRT, SIGMOID,
     * TANH read it) */
    FG_MUST_USE fg_status (*unary_bwd)(fg_unary_op op, const fg_tensor *x, const fg_tensor *y,
                                       const fg_tensor *dy, double a, double b, fg_tensor *dx);

    /* ---- layouts ---- */
    /* y += x elementwise, one shape, any strides on both (y's without
     * overlap): the backward of the views (slice, cat, permute). */
    FG_MUST_USE fg_status (*add_strided)(const fg_tensor *x, fg_tensor *y);
    /* y = cond ? (a ? a : va) : (b ? b : vb); cond u8 or i32 (nonzero is
     * true), a, b (or NULL: the scalar) and y of one shape. */
    FG_MUST_USE fg_status (*where)(const fg_tensor *cond, const fg_tensor *a, const fg_tensor *b,
                                   double va, double vb, fg_tensor *y);

    /* ---- indexing along a dim; indices i32, out of range is FG_EINVAL ---- */
    /* y (outer, k, inner) = x (outer, n, inner) at idx (k) along dim */
    FG_MUST_USE fg_status (*index_select)(const fg_tensor *x, int dim, const fg_tensor *idx,
                                          fg_tensor *y);
    /* dx (outer, n, inner) += dy (outer, k, inner) at idx (k) */
    FG_MUST_USE fg_status (*index_add)(const fg_tensor *dy, int dim, const fg_tensor *idx,
                                       fg_tensor *dx);
    /* y = x gathered along dim at idx (y and idx of one shape, of x's ndim,
     * each other dim no larger than x's) */
    FG_MUST_USE fg_status (*gather)(const fg_tensor *x, int dim, const fg_tensor *idx,
                                    fg_tensor *y);
    /* y += src scattered along dim at idx (src at least idx's size) */
    FG_MUST_USE fg_status (*scatter_add)(const fg_tensor *src, int dim, const fg_tensor *idx,
                                         fg_tensor *y);
    /* y (outer, inner) = max (or min) over dim of x (outer, n, inner), the
     * first index of it in idx (i32; NaN counts as the largest) */
    FG_MUST_USE fg_status (*max_dim)(const fg_tensor *x, int dim, bool is_min, fg_tensor *y,
                                     fg_tensor *idx);
    /* y = the running sum along dim (from the end when reverse) */
    FG_MUST_USE fg_status (*cumsum)(const fg_tensor *x, int dim, bool reverse, fg_tensor *y);

    /* ---- losses ---- */
    /* y = the elementwise loss op (fg_loss_op) of x against t, all of one
     * shape (w too, or NULL) */
    FG_MUST_USE fg_status (*pointwise_loss_fwd)(fg_loss_op op, const fg_tensor *x,
                                                const fg_tensor *t, const fg_tensor *w, double p,
                                                fg_tensor *y);
    /* dx += dy dloss/dx, dt += dy dloss/dt (either may be NULL) */
    FG_MUST_USE fg_status (*pointwise_loss_bwd)(fg_loss_op op, const fg_tensor *x,
                                                const fg_tensor *t, const fg_tensor *w, double p,
                                                const fg_tensor *dy, fg_tensor *dx, fg_tensor *dt);
    /* Negative log-likelihood rows of logp (M, C) against targets (M) i32,
     * class weights w (C) or NULL, label smoothing eps: y[m] = (1 - eps)
     * (-w[t] logp[m, t]) + eps / C (-sum_c w[c] logp[m, c]), 0 where t ==
     * ignore; *wsum = the sum of w[t] (1 without weights) over the rows that
     * count. A target outside [0, C) not ignore is FG_EINVAL naming it. */
    FG_MUST_USE fg_status (*nll_fwd)(const fg_tensor *logp, const fg_tensor *t, const fg_tensor *w,
                                     int64_t ignore, double eps, fg_tensor *y, double *wsum);
    /* dlogp (M, C) += the gradient of sum_m dy[m] y[m] */
    FG_MUST_USE fg_status (*nll_bwd)(const fg_tensor *t, const fg_tensor *w, int64_t ignore,
                                     double eps, const fg_tensor *dy, fg_tensor *dlogp);

    /* ---- convolution and pooling, NCHW (fg_conv_params, fg_pool_params) ---- */
    /* y = conv(x, w) + b (b (O) or NULL) */
    FG_MUST_USE fg_status (*conv2d_fwd)(const fg_tensor *x, const fg_tensor *w, const fg_tensor *b,
                                        const fg_conv_params *p, fg_tensor *y);
    /* dx += the gradient of x from dy (dx = it with p->overwrite) */
    FG_MUST_USE fg_status (*conv2d_bwd_data)(const fg_tensor *dy, const fg_tensor *w,
                                             const fg_conv_params *p, fg_tensor *dx);
    /* dw += the gradient of w, db += that of b (either may be NULL) */
    FG_MUST_USE fg_status (*conv2d_bwd_weight)(const fg_tensor *x, const fg_tensor *dy,
                                               const fg_conv_params *p, fg_tensor *dw,
                                               fg_tensor *db);
    /* y = the pooling of x; idx (i32, y's shape) the argmax of MAX (may be
     * NULL there; unused otherwise) */
    FG_MUST_USE fg_status (*pool2d_fwd)(const fg_tensor *x, const fg_pool_params *p, fg_tensor *y,
                                        fg_tensor *idx);
    /* dx += the gradient from dy (MAX through idx) */
    FG_MUST_USE fg_status (*pool2d_bwd)(const fg_tensor *dy, const fg_tensor *idx,
                                        const fg_pool_params *p, fg_tensor *dx);

    /* ---- batch normalisation in training mode, fused; x (N, C, ...)
     * contiguous, statistics per channel in double (C values each) ---- */
    /* mean and biased variance of each channel */
    FG_MUST_USE fg_status (*batch_norm_stats)(const fg_tensor *x, double *mean, double *var);
    /* y = (x - mean) invstd w + b (w, b (C) or NULL) */
    FG_MUST_USE fg_status (*batch_norm_fwd)(const fg_tensor *x, const double *mean,
                                            const double *invstd, const fg_tensor *w,
                                            const fg_tensor *b, fg_tensor *y);
    /* dx += the gradient of x through the normalisation and the batch's
     * statistics (dx = it with dx_overwrite: dx holds nothing yet), dw +=
     * sum dy xhat, db += sum dy (each may be NULL) */
    FG_MUST_USE fg_status (*batch_norm_bwd)(const fg_tensor *x, const fg_tensor *dy,
                                            const double *mean, const double *invstd,
                                            const fg_tensor *w, fg_tensor *dx, fg_tensor *dw,
                                            fg_tensor *db, bool dx_overwrite);
} fg_op_table;

/* The table of a device; NULL (and FG_EUNSUPPORTED in fg_last_error) for a
 * device not built in. Thread-safe. */
FG_API const fg_op_table *fg_ops_get(fg_device device);

/* *first = the index of the first inf or NaN element of x (contiguous, a
 * float dtype), -1 for none, computed on x's device with one scalar back
 * (the CPU and guarded; FG_EUNSUPPORTED on a device without the kernel):
 * the non-finite checks of the layers above on device memory. */
FG_API FG_MUST_USE fg_status fg_ops_first_nonfinite(const fg_tensor *x, int64_t *first);

/* x = min(max(x, -v), v) elementwise, in place, on x's device (contiguous,
 * f32, f64, or bf16/f16 clamped in f32 and rounded back; v >= 0): clipping
 * gradients by value (Lightning's gradient_clip_algorithm="value").
 * FG_EINVAL for a negative or NaN v; FG_EUNSUPPORTED for another dtype or
 * a device without the kernel. */
FG_API FG_MUST_USE fg_status fg_ops_clamp_flat(fg_tensor *x, double v);

/* Which library does the matrix products of each dtype, one line: "f32:
 * auto: openblas or onednn (avx512_core_bf16), measured per shape class,
 * ...; nt= 128M+ K<=N: onednn (2t), ...; bf16: onednn-bf16
 * (avx512_core_bf16)". The f32 part lists the shape classes measured so
 * far and the engine each took (FULGUR_GEMM, docs/env.md). Thread-safe;
 * the string stays valid on the calling thread until its next call. */
FG_API const char *fg_ops_blas_info(void);

/* Which path the bf16 matrix products (bf16 a and b, f32 accumulation) take
 * in this process, with the reason in parentheses:
 *   "onednn-bf16 (avx512_core_bf16)"  oneDNN's bf16 matmul, at that ISA;
 *   "f32-fallback (...)"              a and b widened to f32 and multiplied
 *                                     by the f32 product: where oneDNN has
 *                                     no bf16 matmul (AVX2-only CPUs with
 *                                     oneDNN 2.x), in a build without
 *                                     oneDNN, or when
 *                                     FULGUR_MATMUL_BF16=fallback;
 *   "none (...)"                      FULGUR_MATMUL_BF16 asks for oneDNN
 *                                     where it cannot run, or has a value
 *                                     that does not parse: bf16 products
 *                                     fail with the same reason.
 * The paths agree within bf16 rounding. The first call (or the first bf16
 * product) asks oneDNN once whether it implements the product; the answer
 * is kept for the process. Thread-safe; the string is the calling thread's,
 * valid until its next call. */
FG_API const char *fg_matmul_bf16_path(void);

/* Which path converts bf16/f16 to and from f32 in this process, chosen at
 * run time from the CPU: "avx512_bf16" (vcvtneps2bf16; f32 subnormals
 * become a signed zero), "avx512", "avx2" (F16C for f16) or "scalar".
 * FULGUR_CPU_ISA caps it. The paths give the same bits on every other
 * input. Thread-safe. */
FG_API const char *fg_ops_lowp_path(void);

/* The arithmetic the speed of the f32 kernels comes down to, alone, on the
 * vector path of fg_cpu_isa() and the calling thread: bench/ops_bench holds
 * each kernel that is not bound by memory to these (its compute bound).
 *   fg_ops_cpu_exp: y = exp(x) over n floats, the exp that softmax,
 *     log_softmax, cross-entropy, attention and GELU take (of x - max <= 0,
 *     and of -|2u|): within 2 ulp of expf from -87 to 88; 0 below -88; past
 *     88.37 it saturates at 2.4e38 on the vector paths (the portable path:
 *     inf past 88.72); NaN stays NaN. y may be x.
 *   fg_ops_cpu_philox_xor: *out = the xor of the Philox4x32-10 draws
 *     offset .. offset + n - 1 of stream seed (fg_rng_u32_at), made as
 *     dropout makes them (in registers, transposed into draw order), and
 *     nothing stored.
 * FG_EINVAL for n < 0, and naming FULGUR_CPU_ISA when its value names no
 * ISA. Thread-safe. */
FG_API FG_MUST_USE fg_status fg_ops_cpu_exp(const float *x, float *y, int64_t n);
FG_API FG_MUST_USE fg_status fg_ops_cpu_philox_xor(uint64_t seed, uint64_t offset, int64_t n,
                                                   uint32_t *out);

#ifdef __cplusplus
}
#endif
#endif
