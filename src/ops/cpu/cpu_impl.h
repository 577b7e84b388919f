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

/* isa.c: the f32 kernels of one vector ISA, written once in vk_t.h and
 * compiled per ISA (vk_avx2.c, vk_avx512.c). An op takes the table of the
 * ISA in use (fg_cpu_isa) at each call and runs its f32 rows through it.
 * The scalar table's entries are all NULL: the op then runs its portable
 * loop, the one it runs for f64 (compiled for the build's -march), which is
 * the reference the vector paths are tested against. Rows have n >= 1. */
/* loss.c's blocks of short rows: rows a call at most (fg__rows_per_call), the
 * longest row */
#define FG_CE_BLOCK 64
#define FG_CE_BLOCK_N 256
/* softmax.c's blocks of log_softmax rows: rows a call at most
 * (fg__rows_per_call), the longest row */
#define FG_SM_BLOCK 64
#define FG_SM_BLOCK_N 1024
/* layernorm.c's forward blocks: rows a block, the longest row (16 KiB rows
 * at 1024 ran 0.95x; 16 rows rather than 8 ran (2048, 256) about 1.04x) */
#define FG_LN_BLOCK 16
#define FG_LN_BLOCK_N 512

typedef struct fg__vk {
    fg_isa isa;
    /* activation.c, over n elements: y = gelu(x); dx += dy gelu'(x) */
    void (*gelu_fwd)(const float *x, float *y, int64_t n);
    void (*gelu_bwd)(const float *x, const float *dy, float *dx, int64_t n);
    /* softmax.c, one row of n: y = softmax(x), y = log_softmax(x) and their
     * backward, adding into dx */
    void (*softmax_row)(const float *x, float *y, int64_t n);
    void (*softmax_bwd_row)(const float *y, const float *dy, float *dx, int64_t n);
    void (*log_softmax_row)(const float *x, float *y, int64_t n);
    void (*log_softmax_bwd_row)(const float *y, const float *dy, float *dx, int64_t n);
    /* log_softmax over a block of rows <= FG_SM_BLOCK of n <= FG_SM_BLOCK_N
     * (the same bits as the row kernel, faster on short rows) */
    void (*log_softmax_rows)(const float *x, float *y, int64_t n, int64_t rows);
    /* loss.c, one row of n logits: m = max(x), s = sum exp(x - m) (the
     * row's logsumexp is m + log(s)); the same over a block of rows <=
     * FG_CE_BLOCK of n <= FG_CE_BLOCK_N (the same bits, faster on short
     * rows), with l[r] = log(s[r]) by a vector log (to rounding; l may be
     * NULL); dx += scale (exp(x - m[r]) / s[r] - onehot(t[r])) on the rows
     * whose t[r] != ignore (any rows, any n; the bits of the row's softmax
     * recomputed from m and s) */
    void (*ce_stats_row)(const float *x, int64_t n, double *m, double *s);
    void (*ce_stats_rows)(const float *x, int64_t n, int64_t rows, double *m, double *s, double *l);
    void (*ce_bwd_rows)(const float *x, float *dx, int64_t n, int64_t rows, const int32_t *t,
                        int64_t ignore, double scale, const double *m, const double *s);
    /* attention.c, a score row s[0, lds) (lds a multiple of 16) with keys
     * j < n live: s = softmax, returning log sum exp; s = exp(s - l). Both
     * write zeros on [n, lds). */
    float (*att_softmax_row)(float *s, int lds, int n);
    void (*att_exp_row)(float *s, int lds, int n, float l);
    /* layernorm.c, one row of C: forward (w, b may be NULL), and backward
     * adding into dx (NULL: weight gradients only, and then w may be NULL)
     * and into the chunk sums aw, ab (NULL: none) */
    void (*ln_fwd_row)(const float *x, const float *w, const float *b, int64_t C, double eps,
                       float *y, float *mean, float *rstd);
    /* the same over a block of rows <= FG_LN_BLOCK (the same bits as the
     * row kernel, faster on short rows) */
    void (*ln_fwd_rows)(const float *x, const float *w, const float *b, int64_t C, double eps,
                        float *y, float *mean, float *rstd, int64_t rows);
    void (*ln_bwd_row)(const float *x, const float *dy, const float *w, float mean, float rstd,
                       int64_t C, float *dx, float *aw, float *ab);
    /* dropout.c, elements [0, n) with draws offset .. offset + n - 1 of
     * stream seed: y = x keep scale (acc: y +=), keep = draw >= thr */
    void (*dropout)(const float *x, float *y, int64_t n, uint64_t seed, uint64_t offset,
                    uint32_t thr, float scale, bool acc);
    /* the primitives alone (ops.h's fg_ops_cpu_exp and fg_ops_cpu_philox_xor:
     * prim.c, dropout.c): y = exp(x) as the row kernels and GELU take it,
     * over n; the xor of draws offset .. offset + n - 1 as dropout makes
     * them, nothing stored */
    void (*exp)(const float *x, float *y, int64_t n);
    uint32_t (*philox_xor)(uint64_t seed, uint64_t offset, int64_t n);
    /* vk_ew_t.h, over n elements, on one thread (the ops split the work):
     * elementwise.c's same-shape binary op and axpby (y = alpha x + beta y;
     * beta 0: y is not read), activation.c's relu and its backward (dx +=),
     * y += b (matmul.c's bias_add rows, embedding.c's backward), y += v
     * (reduce.c's sum_dim_bwd), acc[j] += x[r ld + j] over rows r in order,
     * in double (column sums: bias_grad, sum_to, sum_dim), the sum of x in
     * double (row sums: sum_dim) */
    void (*binary)(fg_binary_op op, const float *a, const float *b, float *y, int64_t n);
    void (*axpby)(float alpha, const float *x, float beta, float *y, int64_t n);
    void (*relu_fwd)(const float *x, float *y, int64_t n);
    void (*relu_bwd)(const float *x, const float *dy, float *dx, int64_t n);
    void (*add_row)(float *y, const float *b, int64_t n);
    void (*add_const)(float *y, float v, int64_t n);
    void (*acc_rows_d)(double *acc, const float *x, int64_t ld, int64_t rows, int64_t n);
    double (*sum_d)(const float *x, int64_t n);
    /* k_unary.c's exact GELU, y = x cdf(x) and dx += dy gelu'(x), over n */
    void (*gelu_erf_fwd)(const float *x, float *y, int64_t n);
    void (*gelu_erf_bwd)(const float *x, const float *dy, float *dx, int64_t n);
    /* vk_rnn_t.h, one LSTM time step over rows of H (k_rnn.c): the gates'
     * activation and the cell (forward), and its backward */
    void (*lstm_fwd)(float *g, const float *xw, const float *b, const float *cp, float *c, float *h,
                     int64_t rows, int64_t H);
    void (*lstm_bwd)(const float *g, const float *c, const float *cp, const float *dy,
                     const float *dhr, float *dc, float *dg, int64_t rows, int64_t H);
    /* vk_rnn_t.h, one GRU time step over rows of H (k_rnn.c): the gates
     * from h_prev W_hh^T and the input projection, and its backward */
    void (*gru_fwd)(const float *g, const float *xw, const float *b, const float *hp, float *gates,
                    float *h, int64_t rows, int64_t H);
    void (*gru_bwd)(const float *gates, const float *hp, const float *dy, const float *dhr,
                    float *dhd, float *dx, float *dgh, int64_t rows, int64_t H);
    /* vk_norm_t.h, k_norm.c's batch-norm rows of n: the sums of the
     * statistics and of the backward into NACC chains of double (s, t),
     * y = x a + o, and dx = (overwrite) or += c[0] (g - c[1] - (x - c[2])
     * c[3] c[4]); the bits of k_norm.c's own f32 rows */
    void (*bn_row_sum)(const float *x, int64_t n, double *s);
    void (*bn_row_sq)(const float *x, int64_t n, double m, double *s);
    void (*bn_row_gsum)(const float *x, const float *g, int64_t n, double m, double *s, double *t);
    void (*bn_fwd_row)(const float *x, float *y, int64_t n, float a, float o);
    void (*bn_bwd_row)(const float *x, const float *g, float *dx, int64_t n, const double *c,
                       bool overwrite);
    /* vk_wino_t.h, k_conv_wino.c's Winograd F(4x4, 3x3) transforms over
     * tiles [t0, t1) (th x tw a plane), laid out (tiles, 36, channels)
     * from tile t0 (filter planes from row r0, o0): the
     * input patches of x (N, C, h, w; padding ph, pw) to v; the outputs of
     * m into y (N, O, oh, ow; + bias (O or NULL), added or written); the
     * tiles of dy (N, O, oh, ow) to z. The filters over rows [r0, r1): U
     * (36 planes ldu apart of R x S) = G w[r][s] G^T (w (R, S, 3, 3)), or
     * of w[s][r] turned 180 degrees (flip: w (S, R, 3, 3)); dw[o][c] +=
     * G^T dU G over rows [o0, o1) of dU (36 planes of O x C). */
    void (*wino_in)(const float *x, int64_t C, int64_t h, int64_t w, int64_t ph, int64_t pw,
                    int64_t th, int64_t tw, int64_t t0, int64_t t1, float *v);
    void (*wino_out)(const float *m, int64_t O, int64_t th, int64_t tw, int64_t t0, int64_t t1,
                     float *y, int64_t oh, int64_t ow, const float *bias, bool add);
    void (*wino_dout)(const float *dy, int64_t O, int64_t oh, int64_t ow, int64_t th, int64_t tw,
                      int64_t t0, int64_t t1, float *z);
    void (*wino_wt)(const float *w, int64_t R, int64_t S, bool flip, int64_t r0, int64_t r1,
                    float *U, int64_t ldu);
    void (*wino_dwt)(const float *dU, int64_t ldu, int64_t C, int64_t o0, int64_t o1, float *dw);
} fg__vk;

extern const fg__vk fg__vk_avx2, fg__vk_avx512;

/* The table of the ISA in use; FG_EINVAL naming FULGUR_CPU_ISA when its
 * value is not a name (see core/cpu_isa.h). */
FG_MUST_USE fg_status fg__vk_get(const fg__vk **vk);

/* Rows a call of a block kernel (at most `most`, at least 8, fewer where
 * the rows would not give each thread two calls): the kernels give a row
 * the same bits whatever the block, so this may follow the thread count. */
static inline int64_t fg__rows_per_call(int64_t rows, int64_t most) {
    int64_t per = most, calls = 2 * (int64_t)fg_get_num_threads();
    while (per > 8 && (rows + per - 1) / per < calls) per /= 2;
    return per;
}

/* Elementwise f32 work goes to the vector kernels in pieces of this many
 * elements, the pieces split across threads. */
#define FG_VK_PIECE 16384

/* Shape checks that name the tensors. */
FG_MUST_USE fg_status fg__expect_same_shape(const char *kernel, const fg_tensor *a,
                                            const fg_tensor *b);
FG_MUST_USE fg_status fg__expect_contiguous(const char *kernel, const fg_tensor *t);

/* elementwise.c */
FG_MUST_USE fg_status fg__cpu_binary(fg_binary_op op, const fg_tensor *a, const fg_tensor *b,
                                     fg_tensor *y);
FG_MUST_USE fg_status fg__cpu_sum_to(const fg_tensor *x, fg_tensor *y, double alpha, double beta);
FG_MUST_USE fg_status fg__cpu_axpby(double alpha, const fg_tensor *x, double beta, fg_tensor *y);
FG_MUST_USE fg_status fg__cpu_scale(const fg_tensor *x, double s, fg_tensor *y);
FG_MUST_USE fg_status fg__cpu_sum_all(const fg_tensor *x, double *out);
FG_MUST_USE fg_status fg__cpu_sumsq_all(const fg_tensor *x, double *out);

/* matmul.c */
FG_MUST_USE fg_status fg__cpu_matmul(const fg_tensor *a, bool ta, const fg_tensor *b, bool tb,
                                     fg_tensor *c, double alpha, double beta);
FG_MUST_USE fg_status fg__cpu_bias_add(fg_tensor *y, const fg_tensor *bias);
FG_MUST_USE fg_status fg__cpu_bias_grad(const fg_tensor *dy, fg_tensor *dbias);

/* matmul_bf16.c: c (f32 or bf16) = alpha op(a) op(b) + beta c with bf16 a
 * and b, contiguous, same shapes as matmul: through oneDNN's bf16 matmul
 * where oneDNN implements it, else through an f32 fallback (the choice:
 * FULGUR_MATMUL_BF16 and fg_matmul_bf16_path). Internal: for the precision
 * layer. */
FG_MUST_USE fg_status fg__cpu_matmul_bf16(const fg_tensor *a, bool ta, const fg_tensor *b, bool tb,
                                          fg_tensor *c, double alpha, double beta);
/* Overrides FULGUR_MATMUL_BF16 for this process with "auto", "onednn" or
 * "fallback" (FG_EINVAL for anything else); NULL goes back to the
 * environment's choice. For tests, between products (not thread-safe
 * against products running on other threads). */
FG_MUST_USE fg_status fg__matmul_bf16_set_mode(const char *mode);

/* matmul_dnnl.c: oneDNN's bf16 product on operands fg__cpu_matmul_bf16 has
 * checked (batch, M, K, N all > 0). FG_EUNSUPPORTED when oneDNN implements
 * no such product on this CPU or the build has no oneDNN. */
FG_MUST_USE fg_status fg__dnnl_matmul_bf16(const fg_tensor *a, bool ta, const fg_tensor *b, bool tb,
                                           fg_tensor *c, double alpha, double beta, int64_t batch,
                                           int64_t M, int64_t K, int64_t N);
/* matmul_dnnl.c: FG_OK when oneDNN implements a plain bf16 matmul on this
 * CPU (asks it for a small primitive each call: cache the answer);
 * FG_EUNSUPPORTED when it does not or the build has no oneDNN. */
FG_MUST_USE fg_status fg__dnnl_bf16_probe(void);
/* matmul_dnnl.c: the ISA oneDNN runs at ("avx512_core_bf16", "avx2"; after
 * ONEDNN_MAX_CPU_ISA), NULL in a build without oneDNN. */
const char *fg__dnnl_isa(void);

/* matmul_dnnl.c: row-major f32 c (M, N) = alpha op(a) op(b) + beta c
 * through oneDNN's matmul, leading dimensions as cblas_sgemm's; returns
 * FG_EUNSUPPORTED (the caller then uses OpenBLAS) in a build without
 * oneDNN or for a variant oneDNN does not implement on this CPU. */
FG_MUST_USE fg_status fg__cpu_gemm_dnnl_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                                            float alpha, const float *a, int64_t lda,
                                            const float *b, int64_t ldb, float beta, float *c,
                                            int64_t ldc);

/* matmul_dnnl.c: c (M, N) = a (M, K) op(b), a and c contiguous, for many
 * calls with the same b (K, N; its transpose when tb; row stride ldb),
 * which fg__dnnl_fixed_new reorders once into the layout oneDNN's matmul
 * prefers (and copies: b may change after). FG_EUNSUPPORTED without
 * oneDNN or where it implements no such product; free with
 * fg__dnnl_fixed_free (NULL is fine). One thread at a time per handle. */
typedef struct fg__dnnl_fixed fg__dnnl_fixed;
FG_MUST_USE fg_status fg__dnnl_fixed_new(bool tb, int64_t M, int64_t N, int64_t K, const float *b,
                                         int64_t ldb, fg__dnnl_fixed **out);
FG_MUST_USE fg_status fg__dnnl_fixed_run(fg__dnnl_fixed *f, const float *a, float *c);
void fg__dnnl_fixed_free(fg__dnnl_fixed *f);

/* k_rnn.c: fg__ops_lstm_fwd and fg__ops_lstm_bwd on the CPU */
FG_MUST_USE fg_status fg__cpu_lstm_fwd(const fg_tensor *xw, const fg_tensor *whh,
                                       const fg_tensor *bhh, const fg_tensor *h0,
                                       const fg_tensor *c0, bool reverse, fg_tensor *y,
                                       fg_tensor *gates, fg_tensor *cs);
FG_MUST_USE fg_status fg__cpu_lstm_bwd(const fg_tensor *whh, const fg_tensor *h0,
                                       const fg_tensor *c0, const fg_tensor *y,
                                       const fg_tensor *gates, const fg_tensor *cs,
                                       const fg_tensor *dy, bool reverse, fg_tensor *dg,
                                       fg_tensor *dwhh, fg_tensor *dh0, fg_tensor *dc0);

/* k_rnn.c: fg__ops_gru_fwd and fg__ops_gru_bwd on the CPU */
FG_MUST_USE fg_status fg__cpu_gru_fwd(const fg_tensor *xw, const fg_tensor *whh,
                                      const fg_tensor *bhh, const fg_tensor *h0, bool reverse,
                                      fg_tensor *y, fg_tensor *gates);
FG_MUST_USE fg_status fg__cpu_gru_bwd(const fg_tensor *whh, const fg_tensor *h0, const fg_tensor *y,
                                      const fg_tensor *gates, const fg_tensor *dy, bool reverse,
                                      fg_tensor *dx, fg_tensor *dgh, fg_tensor *dwhh,
                                      fg_tensor *dh0);

/* attention.c */
FG_MUST_USE fg_status fg__cpu_attention_fwd(const fg_tensor *qkv, int heads, bool causal,
                                            const fg_tensor *kpm, fg_tensor *y, fg_tensor *lse);
FG_MUST_USE fg_status fg__cpu_attention_bwd(const fg_tensor *qkv, int heads, bool causal,
                                            const fg_tensor *kpm, const fg_tensor *y,
                                            const fg_tensor *lse, const fg_tensor *dy,
                                            fg_tensor *dqkv);

/* reduce.c */
FG_MUST_USE fg_status fg__cpu_sum_dim(const fg_tensor *x, int dim, fg_tensor *y, double alpha);
FG_MUST_USE fg_status fg__cpu_sum_dim_bwd(const fg_tensor *dy, int dim, fg_tensor *dx,
                                          double alpha);

/* activation.c */
FG_MUST_USE fg_status fg__cpu_relu_fwd(const fg_tensor *x, fg_tensor *y);
FG_MUST_USE fg_status fg__cpu_relu_bwd(const fg_tensor *x, const fg_tensor *dy, fg_tensor *dx);
FG_MUST_USE fg_status fg__cpu_gelu_fwd(const fg_tensor *x, fg_tensor *y);
FG_MUST_USE fg_status fg__cpu_gelu_bwd(const fg_tensor *x, const fg_tensor *dy, fg_tensor *dx);

/* softmax.c */
FG_MUST_USE fg_status fg__cpu_softmax_fwd(const fg_tensor *x, fg_tensor *y);
FG_MUST_USE fg_status fg__cpu_softmax_bwd(const fg_tensor *y, const fg_tensor *dy, fg_tensor *dx);
FG_MUST_USE fg_status fg__cpu_log_softmax_fwd(const fg_tensor *x, fg_tensor *y);
FG_MUST_USE fg_status fg__cpu_log_softmax_bwd(const fg_tensor *y, const fg_tensor *dy,
                                              fg_tensor *dx);

/* loss.c */
FG_MUST_USE fg_status fg__cpu_cross_entropy_fwd(const fg_tensor *logits, const fg_tensor *targets,
                                                int64_t ignore_index, fg_tensor *loss,
                                                int64_t *count);
FG_MUST_USE fg_status fg__cpu_cross_entropy_bwd(const fg_tensor *logits, const fg_tensor *targets,
                                                int64_t ignore_index, double dloss, int64_t count,
                                                fg_tensor *dlogits);
FG_MUST_USE fg_status fg__cpu_cross_entropy_fwd_stats(const fg_tensor *logits,
                                                      const fg_tensor *targets,
                                                      int64_t ignore_index, fg_tensor *loss,
                                                      int64_t *count, fg_tensor *stats);
FG_MUST_USE fg_status fg__cpu_cross_entropy_bwd_stats(const fg_tensor *logits,
                                                      const fg_tensor *targets,
                                                      const fg_tensor *stats, int64_t ignore_index,
                                                      double dloss, int64_t count,
                                                      fg_tensor *dlogits);

/* layernorm.c */
FG_MUST_USE fg_status fg__cpu_layernorm_fwd(const fg_tensor *x, const fg_tensor *w,
                                            const fg_tensor *b, double eps, fg_tensor *y,
                                            fg_tensor *mean, fg_tensor *rstd);
FG_MUST_USE fg_status fg__cpu_layernorm_bwd(const fg_tensor *x, const fg_tensor *w,
                                            const fg_tensor *mean, const fg_tensor *rstd,
                                            const fg_tensor *dy, fg_tensor *dx, fg_tensor *dw,
                                            fg_tensor *db);

/* embedding.c */
FG_MUST_USE fg_status fg__cpu_embedding_fwd(const fg_tensor *idx, const fg_tensor *weight,
                                            fg_tensor *y);
FG_MUST_USE fg_status fg__cpu_embedding_bwd(const fg_tensor *idx, const fg_tensor *dy,
                                            fg_tensor *dweight);

/* dropout.c */
FG_MUST_USE fg_status fg__cpu_dropout_fwd(const fg_tensor *x, double p, uint64_t seed,
                                          uint64_t offset, fg_tensor *y);
FG_MUST_USE fg_status fg__cpu_dropout_bwd(const fg_tensor *dy, double p, uint64_t seed,
                                          uint64_t offset, fg_tensor *dx);

#endif
