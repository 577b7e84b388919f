/* Private entries of the ops layer for the layers above it (autograd's
 * autocast): what the public op table does not carry yet. */
#ifndef FULGUR_OPS_IMPL_H
#define FULGUR_OPS_IMPL_H

#include "fulgur/ops.h"

/* c (f32 or bf16) = alpha op(a) op(b) + beta c with bf16 a and b, shapes as
 * the table's matmul, all contiguous, on a's device: oneDNN's bf16 product
 * or the f32 fallback, as fg_matmul_bf16_path says. FG_EUNSUPPORTED on a
 * device without one. */
FG_MUST_USE fg_status fg__ops_matmul_bf16(const fg_tensor *a, bool ta, const fg_tensor *b, bool tb,
                                          fg_tensor *c, double alpha, double beta);

/* y (R, out) bf16/f16 = x (R, in) @ w (out, in)^T + bias (out, f32, or
 * NULL): x and w in y's dtype, accumulated in f32, the bias added before
 * the one rounding (PyTorch's addmm under autocast). */
FG_MUST_USE fg_status fg__ops_linear_lowp(const fg_tensor *x, const fg_tensor *w,
                                          const fg_tensor *bias, fg_tensor *y);

/* Its backward, for g (R, out) the output's gradient in x's and w's
 * dtype: dx (R, in) = g @ w + beta_dx dx, dw (out, in) += g^T @ x (f32
 * accumulation, written in dw's own dtype), db (out) += the column sums of
 * gbias (R, out: g, or the gradient before its rounding to g's dtype) in
 * f32; NULL skips one. Where the product has no low-precision hardware, g
 * is widened once for all three. */
FG_MUST_USE fg_status fg__ops_linear_lowp_bwd(const fg_tensor *x, const fg_tensor *w,
                                              const fg_tensor *g, const fg_tensor *gbias,
                                              fg_tensor *dx, double beta_dx, fg_tensor *dw,
                                              fg_tensor *db);

/* guarded.c: the five entries here (matmul_bf16, linear_lowp and its
 * backward, round, round_f32) on the guarded device, every tensor on it. */
FG_MUST_USE fg_status fg__guarded_matmul_bf16(const fg_tensor *a, bool ta, const fg_tensor *b,
                                              bool tb, fg_tensor *c, double alpha, double beta);
FG_MUST_USE fg_status fg__guarded_linear_lowp(const fg_tensor *x, const fg_tensor *w,
                                              const fg_tensor *bias, fg_tensor *y);
FG_MUST_USE fg_status fg__guarded_linear_lowp_bwd(const fg_tensor *x, const fg_tensor *w,
                                                  const fg_tensor *g, const fg_tensor *gbias,
                                                  fg_tensor *dx, double beta_dx, fg_tensor *dw,
                                                  fg_tensor *db);
FG_MUST_USE fg_status fg__guarded_round(const fg_tensor *src, fg_tensor *dst);
FG_MUST_USE fg_status fg__guarded_round_f32(const fg_tensor *src, fg_tensor *dst, fg_dtype dt);

/* Raw conversions on the same paths: f32 dst (n) = bf16/f16 src, exactly;
 * bf16/f16 dst (n) = f32 src, rounded to nearest even. */
void fg__ops_widen(float *dst, const uint16_t *src, int64_t n, fg_dtype dt);
void fg__ops_narrow(uint16_t *dst, const float *src, int64_t n, fg_dtype dt);

/* dst (bf16 or f16) = src (f32) rounded to nearest even, both contiguous
 * and of one size, on the conversion path of fg_ops_lowp_path. */
FG_MUST_USE fg_status fg__ops_round(const fg_tensor *src, fg_tensor *dst);

/* Whether products in dt run on low-precision hardware on device (oneDNN's
 * bf16 matmul); false: they widen their operands to f32, so an operand kept
 * in f32 with dt's values (fg__ops_round_f32) spares the widening. */
bool fg__ops_lowp_product_native(fg_device device, fg_dtype dt);

/* dst (f32) = src (f32) rounded to dt (bf16 or f16) to nearest even, kept
 * in f32; both contiguous and of one size. */
FG_MUST_USE fg_status fg__ops_round_f32(const fg_tensor *src, fg_tensor *dst, fg_dtype dt);

/* c (M, N) = op(a) op(b) + beta c in f32, row-major with leading
 * dimensions as cblas_sgemm's, on OpenBLAS on the calling thread alone
 * whatever the thread setting and FULGUR_GEMM: the same bits on every rank
 * and thread count of one machine type (for results every rank must agree
 * on, such as PowerSGD's low-rank products). FG_EINVAL for a size or
 * leading dimension out of range (negative, above INT_MAX, or ld below the
 * row length). */
FG_MUST_USE fg_status fg__ops_sgemm_serial(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                                           const float *a, int64_t lda, const float *b, int64_t ldb,
                                           float beta, float *c, int64_t ldc);

/* The LSTM over a sequence, one direction of one layer (nn's LSTM,
 * through autograd's fg__lstm_seq), in f32 or f64, every tensor
 * contiguous and of one dtype, on the CPU (cpu/k_rnn.c; FG_EUNSUPPORTED on
 * another device: the caller then composes the recorded ops). Gates in
 * PyTorch's order i, f, g, o. Forward: xw (T, N, 4H) the input projection
 * of every step (x W_ih^T + b_ih), whh (4H, H), bhh (4H) or NULL, h0 and c0
 * (N, H); reverse runs the steps from T - 1 down. Writes y (T + 1, N, H):
 * row t the hidden state of time t, row T the final cell state; gates
 * (T, N, 4H) the activated gates and cs (T, N, H) the cell states, which
 * the backward reads. Backward: dy (T + 1, N, H) the gradient of y; writes
 * dg (T, N, 4H), the gradient of the gates before their activation (which
 * is xw's, and bhh's summed over the rows), and adds into dwhh (4H, H), dh0
 * and dc0 (N, H); each of those three may be NULL. */
FG_MUST_USE fg_status fg__ops_lstm_fwd(const fg_tensor *xw, const fg_tensor *whh,
                                       const fg_tensor *bhh, const fg_tensor *h0,
                                       const fg_tensor *c0, bool reverse, fg_tensor *y,
                                       fg_tensor *gates, fg_tensor *cs);
FG_MUST_USE fg_status fg__ops_lstm_bwd(const fg_tensor *whh, const fg_tensor *h0,
                                       const fg_tensor *c0, const fg_tensor *y,
                                       const fg_tensor *gates, const fg_tensor *cs,
                                       const fg_tensor *dy, bool reverse, fg_tensor *dg,
                                       fg_tensor *dwhh, fg_tensor *dh0, fg_tensor *dc0);

/* The GRU over a sequence, one direction of one layer (nn's GRU, through
 * autograd's fg__gru_seq), with the LSTM's rules on dtypes, contiguity and
 * devices. Gates in PyTorch's order r, z, n; n = tanh(x_n + r (h W_hn^T +
 * b_hn)), h' = (1 - z) n + z h. Forward: xw (T, N, 3H) the input projection
 * of every step (x W_ih^T + b_ih), whh (3H, H), bhh (3H) or NULL, h0 (N, H);
 * reverse runs the steps from T - 1 down. Writes y (T, N, H), row t the
 * hidden state of time t, and gates (T, N, 4H): r, z, n and h W_hn^T + b_hn
 * of every step, which the backward reads. Backward: dy (T, N, H) the
 * gradient of y; writes dx (T, N, 3H), xw's gradient, and dgh (T, N, 3H),
 * that of h W_hh^T + b_hh (bhh's is its column sums; it differs from dx in
 * n alone), and adds into dwhh (3H, H) and dh0 (N, H), either may be NULL. */
FG_MUST_USE fg_status fg__ops_gru_fwd(const fg_tensor *xw, const fg_tensor *whh,
                                      const fg_tensor *bhh, const fg_tensor *h0, bool reverse,
                                      fg_tensor *y, fg_tensor *gates);
FG_MUST_USE fg_status fg__ops_gru_bwd(const fg_tensor *whh, const fg_tensor *h0, const fg_tensor *y,
                                      const fg_tensor *gates, const fg_tensor *dy, bool reverse,
                                      fg_tensor *dx, fg_tensor *dgh, fg_tensor *dwhh,
                                      fg_tensor *dh0);

/* ---- optimizer kernels (cpu/k_optim.c), on host memory ---- */
/* Ranges of at least this many elements are split over OpenMP threads. */
#define FG_OPTIM_PAR_MIN 32768
/* Block size of the sum of squares (fixed: the result must not depend on
 * the thread count). */
#define FG_OPTIM_BLOCK 8192

/* The kernels (cpu/k_optim_t.h), on n elements of dtype dt (f32 or f64). */
void fg__k_sgd(fg_dtype dt, void *p, const void *g, void *buf, int64_t n, double lr, double wd,
               double mu, double damp, bool first, bool nesterov);
void fg__k_adamw(fg_dtype dt, void *p, const void *g, void *m1, void *m2, int64_t n, double decay,
                 double beta1, double beta2, double step, double bc2_sqrt, double eps);
/* Adam: m3 (max_exp_avg_sq) NULL unless amsgrad */
void fg__k_adam(fg_dtype dt, void *p, const void *g, void *m1, void *m2, void *m3, int64_t n,
                double wd, double beta1, double beta2, double step, double bc2_sqrt, double eps);
/* RMSprop: buf NULL without momentum, ga NULL unless centered */
void fg__k_rmsprop(fg_dtype dt, void *p, const void *g, void *sq, void *buf, void *ga, int64_t n,
                   double lr, double wd, double alpha, double eps, double mu);
void fg__k_adagrad(fg_dtype dt, void *p, const void *g, void *sum, int64_t n, double clr, double wd,
                   double eps);
void fg__k_lion(fg_dtype dt, void *p, const void *g, void *m, int64_t n, double lr, double decay,
                double beta1, double beta2);

/* Sum of squares of n elements of dtype dt (f32/f64) in double, and x *= s:
 * the clipping halves over a plain buffer (a gradient shard). */
FG_MUST_USE fg_status fg__sumsq(const void *x, fg_dtype dt, int64_t n, double *out);
FG_MUST_USE fg_status fg__scale(void *x, fg_dtype dt, int64_t n, double s);

/* The optimizer steps as device entries: p, g (numel n, p's dtype), the
 * state tensors (n, f32 for bf16/f16 parameters, else p's dtype; buf NULL
 * without momentum), contiguous, all on p's device; the arguments as
 * fg__k_adamw's and fg__k_sgd's. On the CPU the kernel itself; on the
 * guarded device the same kernel through its alias; elsewhere
 * FG_EUNSUPPORTED naming the op and the device. */
FG_MUST_USE fg_status fg__ops_adamw(fg_tensor *p, const fg_tensor *g, fg_tensor *m1, fg_tensor *m2,
                                    double decay, double beta1, double beta2, double step,
                                    double bc2_sqrt, double eps);
FG_MUST_USE fg_status fg__ops_sgd(fg_tensor *p, const fg_tensor *g, fg_tensor *buf, double lr,
                                  double wd, double mu, double damp, bool first, bool nesterov);
/* Adam (m3 NULL unless amsgrad), RMSprop (buf NULL without momentum, ga
 * NULL unless centered), Adagrad and Lion the same way, the arguments as
 * their fg__k_ kernels'. */
FG_MUST_USE fg_status fg__ops_adam(fg_tensor *p, const fg_tensor *g, fg_tensor *m1, fg_tensor *m2,
                                   fg_tensor *m3, double wd, double beta1, double beta2,
                                   double step, double bc2_sqrt, double eps);
FG_MUST_USE fg_status fg__ops_rmsprop(fg_tensor *p, const fg_tensor *g, fg_tensor *sq,
                                      fg_tensor *buf, fg_tensor *ga, double lr, double wd,
                                      double alpha, double eps, double mu);
FG_MUST_USE fg_status fg__ops_adagrad(fg_tensor *p, const fg_tensor *g, fg_tensor *sum, double clr,
                                      double wd, double eps);
FG_MUST_USE fg_status fg__ops_lion(fg_tensor *p, const fg_tensor *g, fg_tensor *m, double lr,
                                   double decay, double beta1, double beta2);
/* *out = the sum of squares of x's elements in double (fg__sumsq's blocks,
 * so the bits of the host path), and x *= s, on x's device. */
FG_MUST_USE fg_status fg__ops_sumsq(const fg_tensor *x, double *out);
FG_MUST_USE fg_status fg__ops_scale_flat(fg_tensor *x, double s);
/* dst = src converted elementwise to dst's dtype (fg_convert's bits), both
 * contiguous, of one length, on one device. */
FG_MUST_USE fg_status fg__ops_convert(fg_tensor *dst, const fg_tensor *src);
/* g (f32 or f64, contiguous) *= inv on g's device (inv rounded to f32 for
 * f32); *bad: one of the products is inf or NaN (the loss scaler's check:
 * one flag back). */
FG_MUST_USE fg_status fg__ops_unscale(fg_tensor *g, double inv, bool *bad);

/* The registry (ops.c). fg__ops_complete copies `in` into `out` with each
 * entry `in` leaves NULL set to a stub failing with FG_EUNSUPPORTED naming
 * the op and device `kind`, and returns how many it filled;
 * fg__ops_missing is that count for the registered table of a kind (-1:
 * none registered). */
int fg__ops_complete(const fg_op_table *in, fg_device kind, fg_op_table *out);
int fg__ops_missing(fg_device device);

#endif
