/* The extern "C" launchers of the CUDA kernels (the .cu files here): plain
 * pointers to device memory, sizes and a cudaStream_t passed as void *.
 * Each enqueues its kernels on the stream and returns the cudaError_t of
 * the launch (0: enqueued; a fault inside a kernel shows at the next
 * synchronize). The C side (table.c) checks shapes and dtypes first. dt
 * is one of FG_CU_F32, FG_CU_BF16, FG_CU_F16: kernels load each element
 * as f32, compute in f32 (reductions in f64 where the CPU's do) and round
 * their output once. Reductions run in a fixed order that depends on the
 * sizes alone (FG_CU_RED_BLOCKS blocks whatever the GPU), so two runs give
 * the same bits. */
#ifndef FULGUR_CUDA_LAUNCH_H
#define FULGUR_CUDA_LAUNCH_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { FG_CU_F32 = 0, FG_CU_BF16 = 1, FG_CU_F16 = 2 };
#define FG_CU_MAX_DIMS 8
#define FG_CU_RED_BLOCKS 256

/* A broadcast view: element strides of an operand over y's shape (0 on the
 * dims it broadcasts). */
typedef struct fg__cu_bcast {
    int nd;
    int64_t shape[FG_CU_MAX_DIMS];
    int64_t sa[FG_CU_MAX_DIMS], sb[FG_CU_MAX_DIMS];
} fg__cu_bcast;

/* ---- elementwise (ew.cu) ---- */
/* y = a op b (op: fg_binary_op), broadcast by bc; y contiguous. */
int fg__cu_binary(void *st, int op, int dta, const void *a, int dtb, const void *b, int dty,
                  void *y, int64_t n, const fg__cu_bcast *bc);
/* y = alpha x + beta y (beta == 0: y = alpha x, y may be x) */
int fg__cu_axpby(void *st, int dtx, const void *x, int dty, void *y, int64_t n, float alpha,
                 float beta);
/* dst = src converted (any of the three dtypes; rounding to nearest even) */
int fg__cu_cast(void *st, int dts, const void *src, int dtd, void *dst, int64_t n);
/* dst (f32) = src (f32) rounded to dt and kept in f32 */
int fg__cu_round_f32(void *st, const float *src, float *dst, int64_t n, int dt);
/* y = beta y + alpha sum of x over the dims where y's stride (bc->sb, over
 * x's shape) is 0; y contiguous, each output summed in order by one thread */
int fg__cu_sum_to(void *st, int dtx, const void *x, int dty, void *y, int64_t ny,
                  const fg__cu_bcast *bc, float alpha, float beta);
/* *out (device double) = sum of x (squares when sq), two passes in a fixed
 * order; scratch holds FG_CU_RED_BLOCKS doubles */
int fg__cu_sum_all(void *st, int dt, const void *x, int64_t n, int sq, double *scratch,
                   double *out);
/* y (outer, inner) = alpha sum over n of x (outer, n, inner); bwd: dx +=
 * alpha dy broadcast */
int fg__cu_sum_dim(void *st, int dt, const void *x, void *y, int64_t outer, int64_t n,
                   int64_t inner, float alpha);
int fg__cu_sum_dim_bwd(void *st, int dt, const void *dy, void *dx, int64_t outer, int64_t n,
                       int64_t inner, float alpha);
/* y (R, C) += bias (C); dbias (C) += column sums of dy (R, C) in order */
int fg__cu_bias_add(void *st, int dty, void *y, int dtb, const void *bias, int64_t R, int64_t C);
int fg__cu_bias_grad(void *st, int dty, const void *dy, int dtb, void *db, int64_t R, int64_t C);
/* act: 0 relu, 1 gelu (tanh); fwd y = act(x); bwd dx += dy act'(x) */
int fg__cu_act_fwd(void *st, int act, int dt, const void *x, void *y, int64_t n);
int fg__cu_act_bwd(void *st, int act, int dt, const void *x, const void *dy, void *dx, int64_t n);
/* fg_unary_op */
int fg__cu_unary_fwd(void *st, int op, int dt, const void *x, void *y, int64_t n, float a, float b);
int fg__cu_unary_bwd(void *st, int op, int dt, const void *x, const void *y, const void *dy,
                     void *dx, int64_t n, float a, float b);
/* dropout: y (+)= x keep / (1 - p), keep = Philox draw (seed, offset + i) >= thr */
int fg__cu_dropout(void *st, int dt, const void *x, void *y, int64_t n, uint64_t seed,
                   uint64_t offset, uint32_t thr, int none, float scale, int accumulate);

/* ---- rows (rows.cu) ---- */
/* softmax (log: log-softmax) over the last dim C of R rows */
int fg__cu_softmax_fwd(void *st, int log, int dt, const void *x, void *y, int64_t R, int64_t C);
int fg__cu_softmax_bwd(void *st, int log, int dt, const void *y, const void *dy, void *dx,
                       int64_t R, int64_t C);
/* cross-entropy, fused: per row the statistics (2, N) f64 (maxes, sums),
 * the row's loss into rowloss (N doubles, 0 where ignored), then *loss (a
 * 0-d tensor in dtl) = the sum in a fixed order / count; *count (device
 * int64) the rows that count. scratch: FG_CU_RED_BLOCKS doubles + 1. A
 * target outside [0, V) not ignored sets *bad (device int64, -1 if none)
 * to its row. */
int fg__cu_ce_fwd(void *st, int dt, const void *logits, const int32_t *tgt, int64_t N, int64_t V,
                  int64_t ignore, double *stats, double *rowloss, double *scratch, int dtl,
                  void *loss, int64_t *count, int64_t *bad);
/* dlogits += scale (exp(x - m) / s - onehot) from stats, rows not ignored */
int fg__cu_ce_bwd(void *st, int dt, const void *logits, const int32_t *tgt, const double *stats,
                  int64_t N, int64_t V, int64_t ignore, double scale, void *dlogits);
/* layer norm over C of N rows; w, b may be NULL; mean, rstd f32 (N) */
int fg__cu_layernorm_fwd(void *st, int dt, const void *x, const void *w, const void *b, float eps,
                         void *y, float *mean, float *rstd, int64_t N, int64_t C);
/* dx, dw, db may be NULL; dw, db summed over rows in order by column */
int fg__cu_layernorm_bwd(void *st, int dt, const void *x, const void *w, const float *mean,
                         const float *rstd, const void *dy, void *dx, void *dw, void *db, int64_t N,
                         int64_t C);
/* y (N, C) = w[idx]; an index outside [0, V) sets *bad (device int64) */
int fg__cu_embedding_fwd(void *st, int dt, const int32_t *idx, const void *w, void *y, int64_t N,
                         int64_t C, int64_t V, int64_t *bad);
/* dw (V, C) += dy at idx, each (row range, column) summed in the order of
 * the indices by one thread: deterministic */
int fg__cu_embedding_bwd(void *st, int dt, const int32_t *idx, const void *dy, void *dw, int64_t N,
                         int64_t C, int64_t V);

/* ---- attention pieces (rows.cu): qkv (B, T, 3C) <-> q, k, v (B H, T, D) ---- */
int fg__cu_qkv_split(void *st, int dt, const void *qkv, void *q, void *k, void *v, int64_t B,
                     int64_t T, int64_t H, int64_t D);
/* dqkv += the three (B H, T, D) gradients */
int fg__cu_qkv_merge_add(void *st, int dt, const void *dq, const void *dk, const void *dv,
                         void *dqkv, int64_t B, int64_t T, int64_t H, int64_t D);
/* y (B, T, C) = o (B H, T, D) with the heads side by side */
int fg__cu_heads_merge(void *st, int dt, const void *o, void *y, int64_t B, int64_t T, int64_t H,
                       int64_t D);
/* do (B H, T, D) = dy (B, T, C) */
int fg__cu_heads_split(void *st, int dt, const void *dy, void *dout, int64_t B, int64_t T,
                       int64_t H, int64_t D);
/* in place on s (BH, T, T) f32 scores of B x H rows: p = softmax(s * scale)
 * over the keys kept, the others 0 (past the diagonal when causal != 0, or
 * nonzero in kpm (B, T), u8 when kpm_u8, else i32, or NULL); a row that
 * keeps none is NaN; lse (BH, T) f32 saved */
int fg__cu_attn_softmax(void *st, float *s, float *lse, int64_t BH, int64_t T, int causal,
                        const void *kpm, int kpm_u8, int64_t H, float scale);
/* in place on dp (BH, T, T): ds = p (dp - sum(dp p)) * scale */
int fg__cu_attn_softmax_bwd(void *st, const float *p, float *dp, int64_t BH, int64_t T,
                            float scale);

/* ---- layouts and indexing (index.cu); (outer, n, inner) views along a dim ---- */
/* y += x, one shape (nd dims, shape), any strides (y's without overlap) */
int fg__cu_add_strided(void *st, int dt, const void *x, void *y, int nd, const int64_t *shape,
                       const int64_t *sx, const int64_t *sy, int64_t n);
/* y = cond ? (a ? a : va) : (b ? b : vb); cond u8 (c8) or i32 */
int fg__cu_where(void *st, int dt, int c8, const void *cond, const void *a, const void *b, float va,
                 float vb, void *y, int64_t n);
/* y (outer, k, inner) = x (outer, n, inner) at idx (k); *bad (device int64)
 * = the first position of an index outside [0, n), -1 if none */
int fg__cu_index_select(void *st, int dt, const void *x, const int32_t *idx, void *y, int64_t outer,
                        int64_t n, int64_t k, int64_t inner, int64_t *bad);
/* dx (outer, n, inner) += dy (outer, k, inner) at idx: one thread per
 * (outer, inner), the positions in order (deterministic) */
int fg__cu_index_add(void *st, int dt, const void *dy, const int32_t *idx, void *dx, int64_t outer,
                     int64_t n, int64_t k, int64_t inner);
/* y, idx (outer, inner) = the max (min) over n, the first index; NaN wins */
int fg__cu_max_dim(void *st, int dt, const void *x, int is_min, void *y, int32_t *idx,
                   int64_t outer, int64_t n, int64_t inner);
/* y = the running sum over n (f64 accumulation; from the end when reverse) */
int fg__cu_cumsum(void *st, int dt, const void *x, void *y, int64_t outer, int64_t n, int64_t inner,
                  int reverse);

/* gather: y (idx's shape) = x along dim at idx; scatter_add (scatter 1):
 * x += y along dim at idx, one thread per line along dim, in order (lines
 * never share a target: deterministic, the CPU's order). sx: x's strides,
 * ishape: idx's shape (nd dims), so: y's (or src's) strides. *bad as
 * index_select's (gather only). */
int fg__cu_gather(void *st, int dt, int scatter, void *x, const int64_t *sx, const int32_t *idx,
                  const int64_t *ishape, void *y, const int64_t *so, int nd, int dim, int64_t nx,
                  int64_t *bad);

/* ---- optimizers (optim.cu): n tensors, device pointer arrays ---- */
/* AdamW (PyTorch's): p -= lr wd p; m = b1 m + (1 - b1) g; v = b2 v + (1 -
 * b2) g^2; p -= lr (m / bc1) / (sqrt(v / bc2) + eps); f32 p, g, m, v */
int fg__cu_adamw_multi(void *st, int n, float *const *p, const float *const *g, float *const *m,
                       float *const *v, const int64_t *len, float lr, float b1, float b2, float eps,
                       float wd, float bc1, float bc2, void *dev_scratch);
/* SGD with momentum (PyTorch's): g' = g + wd p; b = mu b + (1 - damp) g'
 * (b = g' at the first step); p -= lr (nesterov ? g' + mu b : b) */
int fg__cu_sgd_multi(void *st, int n, float *const *p, const float *const *g, float *const *buf,
                     const int64_t *len, float lr, float mu, float damp, float wd, int nesterov,
                     int first, void *dev_scratch);
/* bytes of device scratch the two above need for n tensors */
int64_t fg__cu_multi_scratch_bytes(int n);

/* ---- the CNN layers (cnn.cu): f32, NCHW ---- */
/* A convolution's geometry: x (N, C, H, W), w (O, C / G, KH, KW), y (N,
 * O, OH, OW), strides, padding before, dilations, groups. */
typedef struct fg__cu_conv {
    int64_t N, C, H, W, O, KH, KW, OH, OW, G;
    int64_t sh, sw, ph, pw, dh, dw;
} fg__cu_conv;
/* col (C KH KW, nb OH OW) of the images [n0, n0 + nb): row (c, kh, kw),
 * column (n - n0, oh, ow); 0 where the window is in the padding */
int fg__cu_im2col(void *st, const float *x, float *col, const fg__cu_conv *g, int64_t n0,
                  int64_t nb);
/* dx of the images [n0, n0 + nb) (+)= the sum of the entries of col that
 * im2col took from each element (overwrite: =) */
int fg__cu_col2im(void *st, const float *col, float *dx, const fg__cu_conv *g, int64_t n0,
                  int64_t nb, int overwrite);
/* y (N, O, P) of the images [n0, n0 + nb) = yt (O, nb P) + bias (O, or NULL) */
int fg__cu_conv_out(void *st, const float *yt, const float *bias, float *y, int64_t n0, int64_t nb,
                    int64_t O, int64_t P);
/* dyt (O, nb P) = dy (N, O, P) of the images [n0, n0 + nb) */
int fg__cu_conv_dyt(void *st, const float *dy, float *dyt, int64_t n0, int64_t nb, int64_t O,
                    int64_t P);
/* per channel c of x (N, C, S), in f64: mode 0 s1 = sum x; 1 s1 = sum (x -
 * mean_c)^2; 2 s1 = sum dy, s2 = sum dy (x - mean_c) (device arrays of C) */
int fg__cu_chan_sums(void *st, int mode, const float *x, const float *dy, const double *mean,
                     double *s1, double *s2, int64_t N, int64_t C, int64_t S);
/* y[i] += (float)s[i] */
int fg__cu_add_d(void *st, float *y, const double *s, int64_t n);
/* y = (x - mean_c) invstd_c w_c + b_c (w, b may be NULL), as the CPU's */
int fg__cu_bn_fwd(void *st, const float *x, const double *mean, const double *invstd,
                  const float *w, const float *b, float *y, int64_t N, int64_t C, int64_t S);
/* from sg = sum dy and sgx = sum dy (x - mean) of each channel (mode 2):
 * dx (+)= w invstd (dy - sg / n - (x - mean) invstd^2 sgx / n), dw +=
 * sgx invstd, db += sg (dx, dw, db may be NULL) */
int fg__cu_bn_bwd(void *st, const float *x, const float *dy, const double *mean,
                  const double *invstd, const float *w, const double *sg, const double *sgx,
                  float *dx, float *dw, float *db, int64_t N, int64_t C, int64_t S, int overwrite);
/* A pooling over NC planes of H x W into OH x OW (kind: fg_pool_kind's
 * numbers), with the CPU's windows (k_pool.c). */
enum { FG_CU_POOL_MAX = 0, FG_CU_POOL_AVG = 1, FG_CU_POOL_ADAPTIVE_AVG = 2 };
typedef struct fg__cu_pool {
    int kind, count_include_pad;
    int64_t NC, H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw;
} fg__cu_pool;
/* y = the pooling of x; idx (may be NULL) the index of each maximum in its plane */
int fg__cu_pool_fwd(void *st, const float *x, float *y, int32_t *idx, const fg__cu_pool *p);
/* dx += the gradient from dy (max through idx) */
int fg__cu_pool_bwd(void *st, const float *dy, const int32_t *idx, float *dx, const fg__cu_pool *p);

/* ---- the losses beyond cross-entropy (loss.cu), in f64 ---- */
/* y = the elementwise loss op (fg_loss_op's numbers) of x against t, w
 * the pos_weight of BCE_LOGITS (or NULL), all of dtype dt and n elements */
int fg__cu_ploss_fwd(void *st, int op, int dt, const void *x, const void *t, const void *w,
                     double p, void *y, int64_t n);
/* dx += dy dloss/dx, dtg += dy dloss/dt (either may be NULL) */
int fg__cu_ploss_bwd(void *st, int op, int dt, const void *x, const void *t, const void *w,
                     double p, const void *dy, void *dx, void *dtg, int64_t n);
/* the NLL rows of lp (M, C) against t (M): y[m], wrow[m] the target's
 * weight (0 where ignored), bad[m] 1 for a target outside [0, C) that is
 * not ignore (device arrays of M) */
int fg__cu_nll_rows_fwd(void *st, int dt, const void *lp, const int32_t *t, const void *w,
                        int64_t ignore, double eps, void *y, double *wrow, int32_t *bad, int64_t M,
                        int64_t C);
/* dlp (M, C) += the gradient of sum_m dy[m] y[m] */
int fg__cu_nll_rows_bwd(void *st, int dt, const int32_t *t, const void *w, int64_t ignore,
                        double eps, const void *dy, void *dlp, int64_t M, int64_t C);

#ifdef __cplusplus
}
#endif
#endif
