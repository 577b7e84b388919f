/* The CUDA op table and the CUDA kernels beyond it (table.c), for the ops
 * layer's dispatch (ops.c) and for the layers that reach them there. Only
 * in builds with FULGUR_HAVE_CUDA. */
#ifndef FULGUR_CUDA_OPS_H
#define FULGUR_CUDA_OPS_H

#include "fulgur/ops.h"

extern const fg_op_table fg__cuda_ops;

/* The table's CNN entries (cnn.c), the fg_op_table entries of the same
 * names ... */
FG_MUST_USE fg_status fg__cu_conv2d_fwd(const fg_tensor *x, const fg_tensor *w, const fg_tensor *b,
                                        const fg_conv_params *p, fg_tensor *y);
FG_MUST_USE fg_status fg__cu_conv2d_bwd_data(const fg_tensor *dy, const fg_tensor *w,
                                             const fg_conv_params *p, fg_tensor *dx);
FG_MUST_USE fg_status fg__cu_conv2d_bwd_weight(const fg_tensor *x, const fg_tensor *dy,
                                               const fg_conv_params *p, fg_tensor *dw,
                                               fg_tensor *db);
FG_MUST_USE fg_status fg__cu_pool2d_fwd(const fg_tensor *x, const fg_pool_params *p, fg_tensor *y,
                                        fg_tensor *idx);
FG_MUST_USE fg_status fg__cu_pool2d_bwd(const fg_tensor *dy, const fg_tensor *idx,
                                        const fg_pool_params *p, fg_tensor *dx);
FG_MUST_USE fg_status fg__cu_batch_norm_stats(const fg_tensor *x, double *mean, double *var);
FG_MUST_USE fg_status fg__cu_batch_norm_fwd(const fg_tensor *x, const double *mean,
                                            const double *invstd, const fg_tensor *w,
                                            const fg_tensor *b, fg_tensor *y);
FG_MUST_USE fg_status fg__cu_batch_norm_bwd(const fg_tensor *x, const fg_tensor *dy,
                                            const double *mean, const double *invstd,
                                            const fg_tensor *w, fg_tensor *dx, fg_tensor *dw,
                                            fg_tensor *db, bool dx_overwrite);
/* ... and the losses beyond cross-entropy (loss.c) */
FG_MUST_USE fg_status fg__cu_pointwise_loss_fwd(fg_loss_op op, const fg_tensor *x,
                                                const fg_tensor *t, const fg_tensor *w, double p,
                                                fg_tensor *y);
FG_MUST_USE fg_status fg__cu_pointwise_loss_bwd(fg_loss_op op, const fg_tensor *x,
                                                const fg_tensor *t, const fg_tensor *w, double p,
                                                const fg_tensor *dy, fg_tensor *dx, fg_tensor *dt);
FG_MUST_USE fg_status fg__cu_nll_fwd(const fg_tensor *logp, const fg_tensor *t, const fg_tensor *w,
                                     int64_t ignore, double eps, fg_tensor *y, double *wsum);
FG_MUST_USE fg_status fg__cu_nll_bwd(const fg_tensor *t, const fg_tensor *w, int64_t ignore,
                                     double eps, const fg_tensor *dy, fg_tensor *dlogp);

/* dst = src converted between f32, bf16 and f16 (to nearest even), both
 * contiguous, one size, on dst's device. */
FG_MUST_USE fg_status fg__cuda_cast(const fg_tensor *src, fg_tensor *dst);
/* dst (f32) = src (f32) rounded to dt (bf16, f16), kept in f32 */
FG_MUST_USE fg_status fg__cuda_round_f32(const fg_tensor *src, fg_tensor *dst, fg_dtype dt);
/* y (R, out) = x (R, in) @ w (out, in)^T + bias (f32, or NULL) as one
 * cuBLASLt product with the bias as its epilogue, f32 accumulation */
FG_MUST_USE fg_status fg__cuda_linear_lowp(const fg_tensor *x, const fg_tensor *w,
                                           const fg_tensor *bias, fg_tensor *y);
/* Multi-tensor steps over n f32 tensors of device d (device pointers in
 * host arrays), as PyTorch's AdamW (decoupled weight decay, bias
 * corrections at `step`, from 1) and SGD (momentum, dampening, nesterov,
 * weight decay; `first`: the momentum buffer starts as the gradient). */
FG_MUST_USE fg_status fg__cuda_adamw_multi(fg_dev *d, int n, float *const *p, const float *const *g,
                                           float *const *m, float *const *v, const int64_t *len,
                                           double lr, double b1, double b2, double eps, double wd,
                                           int64_t step);
FG_MUST_USE fg_status fg__cuda_sgd_multi(fg_dev *d, int n, float *const *p, const float *const *g,
                                         float *const *buf, const int64_t *len, double lr,
                                         double momentum, double dampening, double wd,
                                         bool nesterov, bool first);
/* *out = the sum of the squares of n tensors (the gradient norm squared),
 * each tensor's sum in the fixed order of sumsq_all, added in order */
FG_MUST_USE fg_status fg__cuda_grad_norm_sq(fg_dev *d, int n, const fg_tensor *const *g,
                                            double *out);

#endif
