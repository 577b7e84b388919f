/* The CUDA op table: each entry checks shapes and dtypes on the host (the
 * CPU table's rules), then enqueues the kernels of the .cu files beside it
 * (launch.h) or a cuBLASLt product (blaslt.c) on the compute stream of the
 * tensors' device. f32, bf16 and f16 tensors (computed in f32, rounded
 * once); f64 is FG_EUNSUPPORTED on the GPU. Entries that hand a value to
 * the host (sums, the cross-entropy's count, an index out of range) wait
 * for their stream. Scratch comes from the device's caching allocator and
 * is freed at once: the block is reused only by work on the same stream,
 * which runs after. Entries left NULL read as "op X is not available on
 * cuda" in the autograd layer. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "blaslt.h"
#include "core/device_cuda.h"
#include "cuda_ops.h"
#include "entry.h"
#include "launch.h"
#include "shared.h"
#include "tensor/tensor_impl.h"

/* rows and the last dim of (..., C) */
static void rows_cols(const fg_tensor *t, int64_t *R, int64_t *C) {
    *C = t->ndim ? t->shape[t->ndim - 1] : 1;
    *R = *C ? t->numel / *C : 0;
}

/* ---------------------------------------------------------------- products */

/* batch entries of (..., r, c) */
static int64_t batch_of(const fg_tensor *t) {
    int64_t b = 1;
    for (int d = 0; d + 2 < t->ndim; d++) b *= t->shape[d];
    return b;
}

static FG_MUST_USE fg_status cu_matmul(const fg_tensor *a, bool ta, const fg_tensor *b, bool tb,
                                       fg_tensor *c, double alpha, double beta) {
    const char *k = "matmul";
    if (a->ndim < 2 || b->ndim < 2 || c->ndim != a->ndim)
        return fg_error(FG_EINVAL,
                        "matmul: a (%d dims), b (%d dims), c (%d dims): want a and c "
                        "(..., M, K), (..., M, N), b (..., K, N) or (K, N)",
                        a->ndim, b->ndim, c->ndim);
    FG_TRY(contig(k, a));
    FG_TRY(contig(k, b));
    FG_TRY(contig(k, c));
    int dta, dtb, dtc;
    FG_TRY(cu_dt(k, a, &dta));
    FG_TRY(cu_dt(k, b, &dtb));
    FG_TRY(cu_dt(k, c, &dtc));
    if (dta != dtb)
        return fg_error(FG_EUNSUPPORTED, "matmul: a %s and b %s: one dtype on cuda",
                        fg_dtype_name(a->dtype), fg_dtype_name(b->dtype));
    int64_t ar = a->shape[a->ndim - 2], ac = a->shape[a->ndim - 1];
    int64_t br = b->shape[b->ndim - 2], bcn = b->shape[b->ndim - 1];
    int64_t M = ta ? ac : ar, K = ta ? ar : ac, Kb = tb ? bcn : br, N = tb ? br : bcn;
    int64_t batch = batch_of(a), bb = batch_of(b);
    if (K != Kb || c->shape[c->ndim - 2] != M || c->shape[c->ndim - 1] != N ||
        batch_of(c) != batch || (b->ndim > 2 && bb != batch)) {
        char x[96], y[96], z[96];
        return fg_error(FG_EINVAL, "matmul: shapes %s%s x %s%s -> %s do not agree",
                        fg_tensor_describe(a, x, sizeof x), ta ? "^T" : "",
                        fg_tensor_describe(b, y, sizeof y), tb ? "^T" : "",
                        fg_tensor_describe(c, z, sizeof z));
    }
    void *st;
    FG_TRY(stream_of(k, c, &st));
    return fg__cuda_gemm(st, fg__cuda_index(c->dev), dta, dtc, ta, tb, M, N, K, a->data, ac,
                         ar * ac, b->data, bcn, b->ndim > 2 ? br * bcn : 0, c->data, N, M * N,
                         batch, (float)alpha, (float)beta, FG_CU_EPI_NONE, NULL, 0);
}

static FG_MUST_USE fg_status cu_bias_add(fg_tensor *y, const fg_tensor *bias) {
    const char *k = "bias_add";
    int64_t R, C;
    rows_cols(y, &R, &C);
    if (bias->numel != C)
        return fg_error(FG_EINVAL, "bias_add: bias of %lld for rows of %lld",
                        (long long)bias->numel, (long long)C);
    int dty, dtb;
    FG_TRY(cu_dt(k, y, &dty));
    FG_TRY(cu_dt(k, bias, &dtb));
    void *st;
    FG_TRY(stream_of(k, y, &st));
    return launched(k, fg__cu_bias_add(st, dty, y->data, dtb, bias->data, R, C));
}

static FG_MUST_USE fg_status cu_bias_grad(const fg_tensor *dy, fg_tensor *db) {
    const char *k = "bias_grad";
    int64_t R, C;
    rows_cols(dy, &R, &C);
    if (db->numel != C)
        return fg_error(FG_EINVAL, "bias_grad: dbias of %lld for rows of %lld",
                        (long long)db->numel, (long long)C);
    int dty, dtb;
    FG_TRY(cu_dt(k, dy, &dty));
    FG_TRY(cu_dt(k, db, &dtb));
    void *st;
    FG_TRY(stream_of(k, dy, &st));
    return launched(k, fg__cu_bias_grad(st, dty, dy->data, dtb, db->data, R, C));
}

/* ---------------------------------------------------------------- elementwise */

/* strides of t seen with shape (nd dims, right-aligned); 0 where broadcast */
static FG_MUST_USE fg_status bstrides(const char *k, const fg_tensor *t, int nd,
                                      const int64_t *shape, int64_t *s) {
    int off = nd - t->ndim;
    if (off < 0) return fg_error(FG_EINVAL, "%s: an operand has more dims than the result", k);
    for (int d = 0; d < nd; d++) {
        int td = d - off;
        if (td < 0) s[d] = 0;
        else if (t->shape[td] == shape[d]) s[d] = shape[d] == 1 ? 0 : t->strides[td];
        else if (t->shape[td] == 1) s[d] = 0;
        else
            return fg_error(FG_EINVAL, "%s: dim %d of size %lld does not broadcast to %lld", k, td,
                            (long long)t->shape[td], (long long)shape[d]);
    }
    return FG_OK;
}

static FG_MUST_USE fg_status cu_binary(fg_binary_op op, const fg_tensor *a, const fg_tensor *b,
                                       fg_tensor *y) {
    const char *k = "binary";
    FG_TRY(contig(k, y));
    if (y->ndim > FG_CU_MAX_DIMS) return fg_error(FG_EUNSUPPORTED, "binary: over 8 dims on cuda");
    fg__cu_bcast bc = {.nd = y->ndim};
    for (int d = 0; d < y->ndim; d++) bc.shape[d] = y->shape[d];
    FG_TRY(bstrides(k, a, y->ndim, y->shape, bc.sa));
    FG_TRY(bstrides(k, b, y->ndim, y->shape, bc.sb));
    if (!bc.nd) { /* 0-d: one element */
        bc.nd = 1;
        bc.shape[0] = 1;
        bc.sa[0] = bc.sb[0] = 0;
    }
    int da, db, dy;
    FG_TRY(cu_dt(k, a, &da));
    FG_TRY(cu_dt(k, b, &db));
    FG_TRY(cu_dt(k, y, &dy));
    void *st;
    FG_TRY(stream_of(k, y, &st));
    return launched(
        k, fg__cu_binary(st, (int)op, da, a->data, db, b->data, dy, y->data, y->numel, &bc));
}

static FG_MUST_USE fg_status cu_sum_to(const fg_tensor *x, fg_tensor *y, double alpha,
                                       double beta) {
    const char *k = "sum_to";
    FG_TRY(contig(k, x));
    FG_TRY(contig(k, y));
    if (x->ndim > FG_CU_MAX_DIMS) return fg_error(FG_EUNSUPPORTED, "sum_to: over 8 dims on cuda");
    fg__cu_bcast bc = {.nd = x->ndim};
    for (int d = 0; d < x->ndim; d++) {
        bc.shape[d] = x->shape[d];
        bc.sb[d] = x->strides[d];
    }
    FG_TRY(bstrides(k, y, x->ndim, x->shape, bc.sa));
    /* a dim of x of size 1 kept in y: mark it kept (stride 1) */
    for (int d = 0; d < x->ndim; d++)
        if (!bc.sa[d] && x->shape[d] == 1 && d - (x->ndim - y->ndim) >= 0) bc.sa[d] = 1;
    int dx, dy;
    FG_TRY(cu_dt(k, x, &dx));
    FG_TRY(cu_dt(k, y, &dy));
    void *st;
    FG_TRY(stream_of(k, y, &st));
    return launched(
        k, fg__cu_sum_to(st, dx, x->data, dy, y->data, y->numel, &bc, (float)alpha, (float)beta));
}

static FG_MUST_USE fg_status cu_axpby(double alpha, const fg_tensor *x, double beta, fg_tensor *y) {
    const char *k = "axpby";
    if (x->numel != y->numel)
        return fg_error(FG_EINVAL, "axpby: %lld and %lld elements", (long long)x->numel,
                        (long long)y->numel);
    FG_TRY(contig(k, x));
    FG_TRY(contig(k, y));
    int dx, dy;
    FG_TRY(cu_dt(k, x, &dx));
    FG_TRY(cu_dt(k, y, &dy));
    void *st;
    FG_TRY(stream_of(k, y, &st));
    return launched(
        k, fg__cu_axpby(st, dx, x->data, dy, y->data, y->numel, (float)alpha, (float)beta));
}

static FG_MUST_USE fg_status cu_scale(const fg_tensor *x, double s, fg_tensor *y) {
    FG_TRY(same("scale", x, y));
    return cu_axpby(s, x, 0, y);
}

/* *out = the sum (of squares) of x, back on the host */
static FG_MUST_USE fg_status sum_all(const char *k, const fg_tensor *x, int sq, double *out) {
    FG_TRY(contig(k, x));
    int dt;
    FG_TRY(cu_dt(k, x, &dt));
    void *st;
    FG_TRY(stream_of(k, x, &st));
    double *scr = fg_dev_alloc(x->dev, (FG_CU_RED_BLOCKS + 1) * sizeof(double), NULL);
    if (!scr) return fg_error_wrap(fg_last_status(), "%s scratch", k);
    fg_status s =
        launched(k, fg__cu_sum_all(st, dt, x->data, x->numel, sq, scr, scr + FG_CU_RED_BLOCKS));
    if (s == FG_OK) s = fg_dev_copy_d2h(x->dev, out, scr + FG_CU_RED_BLOCKS, sizeof *out);
    fg_status f = fg_dev_free(x->dev, scr);
    return s != FG_OK ? s : f;
}
static FG_MUST_USE fg_status cu_sum_all(const fg_tensor *x, double *out) {
    return sum_all("sum_all", x, 0, out);
}
static FG_MUST_USE fg_status cu_sumsq_all(const fg_tensor *x, double *out) {
    return sum_all("sumsq_all", x, 1, out);
}

static FG_MUST_USE fg_status dim_split(const char *k, const fg_tensor *x, int dim, int64_t *o,
                                       int64_t *n, int64_t *in) {
    if (dim < 0 || dim >= x->ndim)
        return fg_error(FG_EINVAL, "%s: dim %d of a %d-d tensor", k, dim, x->ndim);
    *o = 1;
    *in = 1;
    for (int d = 0; d < dim; d++) *o *= x->shape[d];
    for (int d = dim + 1; d < x->ndim; d++) *in *= x->shape[d];
    *n = x->shape[dim];
    return FG_OK;
}

static FG_MUST_USE fg_status cu_sum_dim(const fg_tensor *x, int dim, fg_tensor *y, double alpha) {
    const char *k = "sum_dim";
    int64_t o, n, in;
    FG_TRY(dim_split(k, x, dim, &o, &n, &in));
    if (y->numel != o * in || y->dtype != x->dtype)
        return fg_error(FG_EINVAL, "sum_dim: y of %lld elements, want %lld", (long long)y->numel,
                        (long long)(o * in));
    FG_TRY(contig(k, x));
    FG_TRY(contig(k, y));
    int dt;
    FG_TRY(cu_dt(k, x, &dt));
    void *st;
    FG_TRY(stream_of(k, y, &st));
    return launched(k, fg__cu_sum_dim(st, dt, x->data, y->data, o, n, in, (float)alpha));
}

static FG_MUST_USE fg_status cu_sum_dim_bwd(const fg_tensor *dy, int dim, fg_tensor *dx,
                                            double alpha) {
    const char *k = "sum_dim_bwd";
    int64_t o, n, in;
    FG_TRY(dim_split(k, dx, dim, &o, &n, &in));
    if (dy->numel != o * in || dy->dtype != dx->dtype)
        return fg_error(FG_EINVAL, "sum_dim_bwd: dy of %lld elements, want %lld",
                        (long long)dy->numel, (long long)(o * in));
    FG_TRY(contig(k, dy));
    FG_TRY(contig(k, dx));
    int dt;
    FG_TRY(cu_dt(k, dx, &dt));
    void *st;
    FG_TRY(stream_of(k, dx, &st));
    return launched(k, fg__cu_sum_dim_bwd(st, dt, dy->data, dx->data, o, n, in, (float)alpha));
}

/* ---------------------------------------------------------------- activations */

static FG_MUST_USE fg_status act_fwd(const char *k, int act, const fg_tensor *x, fg_tensor *y) {
    FG_TRY(same(k, x, y));
    FG_TRY(contig(k, x));
    FG_TRY(contig(k, y));
    int dt;
    FG_TRY(cu_dt(k, x, &dt));
    void *st;
    FG_TRY(stream_of(k, y, &st));
    return launched(k, fg__cu_act_fwd(st, act, dt, x->data, y->data, x->numel));
}
static FG_MUST_USE fg_status act_bwd(const char *k, int act, const fg_tensor *x,
                                     const fg_tensor *dy, fg_tensor *dx) {
    FG_TRY(same(k, x, dy));
    FG_TRY(same(k, x, dx));
    FG_TRY(contig(k, x));
    FG_TRY(contig(k, dy));
    FG_TRY(contig(k, dx));
    int dt;
    FG_TRY(cu_dt(k, x, &dt));
    void *st;
    FG_TRY(stream_of(k, dx, &st));
    return launched(k, fg__cu_act_bwd(st, act, dt, x->data, dy->data, dx->data, x->numel));
}
static FG_MUST_USE fg_status cu_relu_fwd(const fg_tensor *x, fg_tensor *y) {
    return act_fwd("relu_fwd", 0, x, y);
}
static FG_MUST_USE fg_status cu_relu_bwd(const fg_tensor *x, const fg_tensor *dy, fg_tensor *dx) {
    return act_bwd("relu_bwd", 0, x, dy, dx);
}
static FG_MUST_USE fg_status cu_gelu_fwd(const fg_tensor *x, fg_tensor *y) {
    return act_fwd("gelu_fwd", 1, x, y);
}
static FG_MUST_USE fg_status cu_gelu_bwd(const fg_tensor *x, const fg_tensor *dy, fg_tensor *dx) {
    return act_bwd("gelu_bwd", 1, x, dy, dx);
}

static FG_MUST_USE fg_status cu_unary_fwd(fg_unary_op op, const fg_tensor *x, double a, double b,
                                          fg_tensor *y) {
    const char *k = "unary_fwd";
    FG_TRY(same(k, x, y));
    FG_TRY(contig(k, x));
    FG_TRY(contig(k, y));
    int dt;
    FG_TRY(cu_dt(k, x, &dt));
    void *st;
    FG_TRY(stream_of(k, y, &st));
    return launched(
        k, fg__cu_unary_fwd(st, (int)op, dt, x->data, y->data, x->numel, (float)a, (float)b));
}
static FG_MUST_USE fg_status cu_unary_bwd(fg_unary_op op, const fg_tensor *x, const fg_tensor *y,
                                          const fg_tensor *dy, double a, double b, fg_tensor *dx) {
    const char *k = "unary_bwd";
    FG_TRY(same(k, x, dy));
    FG_TRY(same(k, x, dx));
    if (y) FG_TRY(same(k, x, y));
    FG_TRY(contig(k, x));
    FG_TRY(contig(k, dy));
    FG_TRY(contig(k, dx));
    int dt;
    FG_TRY(cu_dt(k, x, &dt));
    void *st;
    FG_TRY(stream_of(k, dx, &st));
    return launched(k, fg__cu_unary_bwd(st, (int)op, dt, x->data, y ? y->data : NULL, dy->data,
                                        dx->data, x->numel, (float)a, (float)b));
}

/* ---------------------------------------------------------------- softmax family */

static FG_MUST_USE fg_status sm_fwd(const char *k, int lg, const fg_tensor *x, fg_tensor *y) {
    FG_TRY(same(k, x, y));
    FG_TRY(contig(k, x));
    FG_TRY(contig(k, y));
    int dt;
    FG_TRY(cu_dt(k, x, &dt));
    int64_t R, C;
    rows_cols(x, &R, &C);
    void *st;
    FG_TRY(stream_of(k, y, &st));
    return launched(k, fg__cu_softmax_fwd(st, lg, dt, x->data, y->data, R, C));
}
static FG_MUST_USE fg_status sm_bwd(const char *k, int lg, const fg_tensor *y, const fg_tensor *dy,
                                    fg_tensor *dx) {
    FG_TRY(same(k, y, dy));
    FG_TRY(same(k, y, dx));
    FG_TRY(contig(k, y));
    FG_TRY(contig(k, dy));
    FG_TRY(contig(k, dx));
    int dt;
    FG_TRY(cu_dt(k, y, &dt));
    int64_t R, C;
    rows_cols(y, &R, &C);
    void *st;
    FG_TRY(stream_of(k, dx, &st));
    return launched(k, fg__cu_softmax_bwd(st, lg, dt, y->data, dy->data, dx->data, R, C));
}
static FG_MUST_USE fg_status cu_softmax_fwd(const fg_tensor *x, fg_tensor *y) {
    return sm_fwd("softmax_fwd", 0, x, y);
}
static FG_MUST_USE fg_status cu_softmax_bwd(const fg_tensor *y, const fg_tensor *dy,
                                            fg_tensor *dx) {
    return sm_bwd("softmax_bwd", 0, y, dy, dx);
}
static FG_MUST_USE fg_status cu_log_softmax_fwd(const fg_tensor *x, fg_tensor *y) {
    return sm_fwd("log_softmax_fwd", 1, x, y);
}
static FG_MUST_USE fg_status cu_log_softmax_bwd(const fg_tensor *y, const fg_tensor *dy,
                                                fg_tensor *dx) {
    return sm_bwd("log_softmax_bwd", 1, y, dy, dx);
}

/* ---------------------------------------------------------------- cross-entropy */

static FG_MUST_USE fg_status ce_check(const char *k, const fg_tensor *logits, const fg_tensor *t) {
    if (logits->ndim != 2 || t->ndim != 1 || t->shape[0] != logits->shape[0] || t->dtype != FG_I32)
        return fg_error(FG_EINVAL, "%s: want logits (N, V) and i32 targets (N)", k);
    if (t->dev != logits->dev) return fg_error(FG_EINVAL, "%s: targets on another device", k);
    FG_TRY(contig(k, logits));
    return contig(k, t);
}

static FG_MUST_USE fg_status ce_fwd(const char *k, const fg_tensor *logits, const fg_tensor *t,
                                    int64_t ignore, fg_tensor *loss, int64_t *count,
                                    fg_tensor *stats) {
    FG_TRY(ce_check(k, logits, t));
    int dt, dtl;
    FG_TRY(cu_dt(k, logits, &dt));
    FG_TRY(cu_dt(k, loss, &dtl));
    if (loss->numel != 1) return fg_error(FG_EINVAL, "%s: loss must hold one element", k);
    int64_t N = logits->shape[0], V = logits->shape[1];
    if (stats && (stats->dtype != FG_F64 || stats->numel != 2 * N || stats->dev != logits->dev))
        return fg_error(FG_EINVAL, "%s: stats must be (2, %lld) f64 on the logits' device", k,
                        (long long)N);
    void *st;
    FG_TRY(stream_of(k, logits, &st));
    /* scratch: [stats (2N) unless given] [row losses (N)] [count, bad] */
    size_t nd = (stats ? 0 : 2 * (size_t)N) + (size_t)N + 2;
    double *scr = fg_dev_alloc(logits->dev, nd * sizeof(double), NULL);
    if (!scr) return fg_error_wrap(fg_last_status(), "%s scratch", k);
    double *pst = stats ? stats->data : scr;
    double *rows = scr + (stats ? 0 : 2 * N);
    int64_t *tail = (int64_t *)(rows + N), host[2] = {0, -1};
    fg_status s = launched(k, fg__cu_ce_fwd(st, dt, logits->data, t->data, N, V, ignore, pst, rows,
                                            NULL, dtl, loss->data, tail, tail + 1));
    if (s == FG_OK) s = fg_dev_copy_d2h(logits->dev, host, tail, sizeof host);
    fg_status f = fg_dev_free(logits->dev, scr);
    if (s != FG_OK) return s;
    if (host[1] >= 0)
        return fg_error(FG_EINVAL,
                        "%s: target of row %lld is outside [0, %lld) (ignore_index %lld)", k,
                        (long long)host[1], (long long)V, (long long)ignore);
    *count = host[0];
    return f;
}

static FG_MUST_USE fg_status cu_ce_fwd(const fg_tensor *logits, const fg_tensor *t, int64_t ignore,
                                       fg_tensor *loss, int64_t *count) {
    return ce_fwd("cross_entropy_fwd", logits, t, ignore, loss, count, NULL);
}
static FG_MUST_USE fg_status cu_ce_fwd_stats(const fg_tensor *logits, const fg_tensor *t,
                                             int64_t ignore, fg_tensor *loss, int64_t *count,
                                             fg_tensor *stats) {
    return ce_fwd("cross_entropy_fwd_stats", logits, t, ignore, loss, count, stats);
}

static FG_MUST_USE fg_status ce_bwd(const char *k, const fg_tensor *logits, const fg_tensor *t,
                                    const fg_tensor *stats, int64_t ignore, double dloss,
                                    int64_t count, fg_tensor *dl) {
    FG_TRY(ce_check(k, logits, t));
    FG_TRY(same(k, logits, dl));
    int dt;
    FG_TRY(cu_dt(k, logits, &dt));
    int64_t N = logits->shape[0], V = logits->shape[1];
    if (count <= 0) return FG_OK;
    void *st;
    FG_TRY(stream_of(k, logits, &st));
    double *scr = NULL;
    const double *pst = stats ? stats->data : NULL;
    if (!stats) { /* recompute the statistics with the forward's kernel */
        /* [stats (2N)] [row losses (N)] [count, bad, loss] */
        scr = fg_dev_alloc(logits->dev, (3 * (size_t)N + 3) * sizeof(double), NULL);
        if (!scr) return fg_error_wrap(fg_last_status(), "%s scratch", k);
        int64_t *tail = (int64_t *)(scr + 3 * N);
        FG_TRY(launched(k, fg__cu_ce_fwd(st, dt, logits->data, t->data, N, V, ignore, scr,
                                         scr + 2 * N, NULL, FG_CU_F32, tail + 2, tail, tail + 1)));
        pst = scr;
    }
    fg_status s = launched(k, fg__cu_ce_bwd(st, dt, logits->data, t->data, pst, N, V, ignore,
                                            dloss / (double)count, dl->data));
    if (scr) {
        fg_status f = fg_dev_free(logits->dev, scr);
        if (s == FG_OK) s = f;
    }
    return s;
}

static FG_MUST_USE fg_status cu_ce_bwd(const fg_tensor *logits, const fg_tensor *t, int64_t ignore,
                                       double dloss, int64_t count, fg_tensor *dl) {
    return ce_bwd("cross_entropy_bwd", logits, t, NULL, ignore, dloss, count, dl);
}
static FG_MUST_USE fg_status cu_ce_bwd_stats(const fg_tensor *logits, const fg_tensor *t,
                                             const fg_tensor *stats, int64_t ignore, double dloss,
                                             int64_t count, fg_tensor *dl) {
    return ce_bwd("cross_entropy_bwd_stats", logits, t, stats, ignore, dloss, count, dl);
}

/* ---------------------------------------------------------------- layer norm */

static FG_MUST_USE fg_status ln_vec(const char *k, const char *what, const fg_tensor *v, int64_t n,
                                    fg_dtype dt) {
    if (v && (v->numel != n || v->dtype != dt || !fg_tensor_is_contiguous(v)))
        return fg_error(FG_EINVAL, "%s: %s must be contiguous (%lld) %s", k, what, (long long)n,
                        fg_dtype_name(dt));
    return FG_OK;
}

static FG_MUST_USE fg_status cu_layernorm_fwd(const fg_tensor *x, const fg_tensor *w,
                                              const fg_tensor *b, double eps, fg_tensor *y,
                                              fg_tensor *mean, fg_tensor *rstd) {
    const char *k = "layernorm_fwd";
    FG_TRY(same(k, x, y));
    FG_TRY(contig(k, x));
    FG_TRY(contig(k, y));
    int64_t N, C;
    rows_cols(x, &N, &C);
    if (!mean || !rstd) return fg_error(FG_EINVAL, "layernorm_fwd: mean and rstd are required");
    FG_TRY(ln_vec(k, "weight", w, C, x->dtype));
    FG_TRY(ln_vec(k, "bias", b, C, x->dtype));
    FG_TRY(ln_vec(k, "mean", mean, N, FG_F32));
    FG_TRY(ln_vec(k, "rstd", rstd, N, FG_F32));
    int dt;
    FG_TRY(cu_dt(k, x, &dt));
    void *st;
    FG_TRY(stream_of(k, y, &st));
    return launched(k, fg__cu_layernorm_fwd(st, dt, x->data, w ? w->data : NULL, b ? b->data : NULL,
                                            (float)eps, y->data, mean->data, rstd->data, N, C));
}

static FG_MUST_USE fg_status cu_layernorm_bwd(const fg_tensor *x, const fg_tensor *w,
                                              const fg_tensor *mean, const fg_tensor *rstd,
                                              const fg_tensor *dy, fg_tensor *dx, fg_tensor *dw,
                                              fg_tensor *db) {
    const char *k = "layernorm_bwd";
    FG_TRY(same(k, x, dy));
    if (dx) FG_TRY(same(k, x, dx));
    FG_TRY(contig(k, x));
    FG_TRY(contig(k, dy));
    int64_t N, C;
    rows_cols(x, &N, &C);
    FG_TRY(ln_vec(k, "weight", w, C, x->dtype));
    FG_TRY(ln_vec(k, "dweight", dw, C, x->dtype));
    FG_TRY(ln_vec(k, "dbias", db, C, x->dtype));
    FG_TRY(ln_vec(k, "mean", mean, N, FG_F32));
    FG_TRY(ln_vec(k, "rstd", rstd, N, FG_F32));
    int dt;
    FG_TRY(cu_dt(k, x, &dt));
    void *st;
    FG_TRY(stream_of(k, x, &st));
    return launched(k, fg__cu_layernorm_bwd(st, dt, x->data, w ? w->data : NULL, mean->data,
                                            rstd->data, dy->data, dx ? dx->data : NULL,
                                            dw ? dw->data : NULL, db ? db->data : NULL, N, C));
}

/* ---------------------------------------------------------------- embedding */

static FG_MUST_USE fg_status cu_embedding_fwd(const fg_tensor *idx, const fg_tensor *w,
                                              fg_tensor *y) {
    const char *k = "embedding_fwd";
    if (idx->dtype != FG_I32 || w->ndim != 2 || y->numel != idx->numel * w->shape[1] ||
        y->dtype != w->dtype)
        return fg_error(FG_EINVAL, "embedding_fwd: want i32 idx (N), weight (V, C), y (N, C)");
    FG_TRY(contig(k, idx));
    FG_TRY(contig(k, w));
    FG_TRY(contig(k, y));
    int dt;
    FG_TRY(cu_dt(k, w, &dt));
    void *st;
    FG_TRY(stream_of(k, y, &st));
    int64_t *bad = fg_dev_alloc(y->dev, sizeof *bad, NULL), hb = -1;
    if (!bad) return fg_error_wrap(fg_last_status(), "%s scratch", k);
    int64_t N = idx->numel, V = w->shape[0], C = w->shape[1];
    fg_status s =
        launched(k, fg__cu_embedding_fwd(st, dt, idx->data, w->data, y->data, N, C, V, bad));
    if (s == FG_OK) s = fg_dev_copy_d2h(y->dev, &hb, bad, sizeof hb);
    fg_status f = fg_dev_free(y->dev, bad);
    if (s != FG_OK) return s;
    if (hb >= 0)
        return fg_error(FG_EINVAL, "embedding_fwd: the index at position %lld is outside [0, %lld)",
                        (long long)hb, (long long)V);
    return f;
}

static FG_MUST_USE fg_status cu_embedding_bwd(const fg_tensor *idx, const fg_tensor *dy,
                                              fg_tensor *dw) {
    const char *k = "embedding_bwd";
    if (idx->dtype != FG_I32 || dw->ndim != 2 || dy->numel != idx->numel * dw->shape[1] ||
        dy->dtype != dw->dtype)
        return fg_error(FG_EINVAL, "embedding_bwd: want i32 idx (N), dy (N, C), dweight (V, C)");
    FG_TRY(contig(k, idx));
    FG_TRY(contig(k, dy));
    FG_TRY(contig(k, dw));
    int dt;
    FG_TRY(cu_dt(k, dw, &dt));
    void *st;
    FG_TRY(stream_of(k, dw, &st));
    return launched(k, fg__cu_embedding_bwd(st, dt, idx->data, dy->data, dw->data, idx->numel,
                                            dw->shape[1], dw->shape[0]));
}

/* ---------------------------------------------------------------- dropout */

static FG_MUST_USE fg_status dropout(const char *k, const fg_tensor *x, double p, uint64_t seed,
                                     uint64_t offset, fg_tensor *y, int acc) {
    FG_TRY(same(k, x, y));
    FG_TRY(contig(k, x));
    FG_TRY(contig(k, y));
    if (!(p >= 0 && p < 1))
        return fg_error(FG_EINVAL, "%s: p = %g: expected a probability in [0, 1)", k, p);
    int dt;
    FG_TRY(cu_dt(k, x, &dt));
    uint32_t thr;
    int none;
    fg__sh_dropout_threshold(p, &thr, &none);
    void *st;
    FG_TRY(stream_of(k, y, &st));
    return launched(k, fg__cu_dropout(st, dt, x->data, y->data, x->numel, seed, offset, thr, none,
                                      (float)(1 / (1 - p)), acc));
}
static FG_MUST_USE fg_status cu_dropout_fwd(const fg_tensor *x, double p, uint64_t seed,
                                            uint64_t offset, fg_tensor *y) {
    return dropout("dropout_fwd", x, p, seed, offset, y, 0);
}
static FG_MUST_USE fg_status cu_dropout_bwd(const fg_tensor *dy, double p, uint64_t seed,
                                            uint64_t offset, fg_tensor *dx) {
    return dropout("dropout_bwd", dy, p, seed, offset, dx, 1);
}

/* ---------------------------------------------------------------- attention */

/* Attention with batched products and a fused softmax (causal or not):
 * S = Q K^T (B H, T, T) in f32, P = softmax(S / sqrt(D) [+ mask]) in place,
 * O = P V; the (B H, T, T) matrix lives in scratch for the call only. */
typedef struct att {
    int64_t B, T, H, D, C;
    int dt, gpu;
    void *st;
    size_t esz;
} att;

static FG_MUST_USE fg_status att_check(const char *k, const fg_tensor *qkv, int heads, att *a) {
    if (qkv->ndim != 3 || heads <= 0 || qkv->shape[2] % (3 * (int64_t)heads))
        return fg_error(FG_EINVAL, "%s: want qkv (B, T, 3C) with C a multiple of heads = %d", k,
                        heads);
    FG_TRY(contig(k, qkv));
    FG_TRY(cu_dt(k, qkv, &a->dt));
    a->B = qkv->shape[0];
    a->T = qkv->shape[1];
    a->C = qkv->shape[2] / 3;
    a->H = heads;
    a->D = a->C / heads;
    a->esz = fg_dtype_size(qkv->dtype);
    FG_TRY(stream_of(k, qkv, &a->st));
    a->gpu = fg__cuda_index(qkv->dev);
    return FG_OK;
}

/* the key padding mask: (B, T) u8 or i32 on qkv's device, or NULL */
static FG_MUST_USE fg_status att_mask(const char *k, const fg_tensor *kpm, const att *a,
                                      const fg_tensor *qkv) {
    if (!kpm) return FG_OK;
    char s[96];
    if (kpm->ndim != 2 || kpm->shape[0] != a->B || kpm->shape[1] != a->T ||
        (kpm->dtype != FG_U8 && kpm->dtype != FG_I32) || kpm->dev != qkv->dev)
        return fg_error(FG_EINVAL,
                        "%s: key padding mask %s: expected u8 or i32 (%lld, %lld) on qkv's device",
                        k, fg_tensor_describe(kpm, s, sizeof s), (long long)a->B, (long long)a->T);
    return contig(k, kpm);
}

/* c (BH, M, N) = op(a) op(b) over the BH heads, f32 or the tensors' dtype */
static FG_MUST_USE fg_status bgemm(const att *a, int dtab, int dtc, bool ta, bool tb, int64_t M,
                                   int64_t N, int64_t K, const void *x, int64_t ldx, const void *y,
                                   int64_t ldy, void *c, float alpha, float beta) {
    int64_t BH = a->B * a->H;
    int64_t xr = ta ? K : M, yr = tb ? N : K;
    return fg__cuda_gemm(a->st, a->gpu, dtab, dtc, ta, tb, M, N, K, x, ldx, xr * ldx, y, ldy,
                         yr * ldy, c, N, M * N, BH, alpha, beta, FG_CU_EPI_NONE, NULL, 0);
}

static FG_MUST_USE fg_status cu_attention_fwd(const fg_tensor *qkv, int heads, bool causal,
                                              const fg_tensor *kpm, fg_tensor *y, fg_tensor *lse) {
    const char *k = "attention_fwd";
    att a;
    FG_TRY(att_check(k, qkv, heads, &a));
    FG_TRY(att_mask(k, kpm, &a, qkv));
    if (y->numel != a.B * a.T * a.C || y->dtype != qkv->dtype || lse->numel != a.B * a.H * a.T)
        return fg_error(FG_EINVAL, "%s: want y (B, T, C) and lse (B, H, T)", k);
    int dtl;
    FG_TRY(cu_dt(k, lse, &dtl));
    int64_t BH = a.B * a.H, n = BH * a.T * a.D;
    int64_t tt = BH * a.T * a.T;
    size_t bytes = 4 * (size_t)n * a.esz + (size_t)tt * (4 + a.esz) + (size_t)BH * a.T * 4;
    char *scr = fg_dev_alloc(qkv->dev, bytes, NULL);
    if (!scr) return fg_error_wrap(fg_last_status(), "%s scratch", k);
    void *q = scr, *kk = scr + n * a.esz, *v = scr + 2 * n * a.esz, *o = scr + 3 * n * a.esz;
    float *s = (float *)(scr + 4 * n * a.esz), *l = s + tt;
    void *pn = l + BH * a.T; /* P in the tensors' dtype when that is not f32 */
    fg_status r =
        launched(k, fg__cu_qkv_split(a.st, a.dt, qkv->data, q, kk, v, a.B, a.T, a.H, a.D));
    /* S = Q K^T in f32 (the products of bf16 accumulate in f32 and keep it) */
    if (r == FG_OK)
        r = bgemm(&a, a.dt, FG_CU_F32, false, true, a.T, a.T, a.D, q, a.D, kk, a.D, s, 1, 0);
    if (r == FG_OK)
        r = launched(k, fg__cu_attn_softmax(a.st, s, l, BH, a.T, causal, kpm ? kpm->data : NULL,
                                            kpm && kpm->dtype == FG_U8, a.H,
                                            (float)(1 / sqrt((double)a.D))));
    /* O = P V: P rounded to the dtype of V first where that is not f32 */
    void *p = s;
    if (r == FG_OK && a.dt != FG_CU_F32) {
        r = launched(k, fg__cu_cast(a.st, FG_CU_F32, s, a.dt, pn, tt));
        p = pn;
    }
    if (r == FG_OK) r = bgemm(&a, a.dt, a.dt, false, false, a.T, a.D, a.T, p, a.T, v, a.D, o, 1, 0);
    if (r == FG_OK) r = launched(k, fg__cu_heads_merge(a.st, a.dt, o, y->data, a.B, a.T, a.H, a.D));
    if (r == FG_OK) r = launched(k, fg__cu_cast(a.st, FG_CU_F32, l, dtl, lse->data, BH * a.T));
    fg_status f = fg_dev_free(qkv->dev, scr);
    return r != FG_OK ? r : f;
}

static FG_MUST_USE fg_status cu_attention_bwd(const fg_tensor *qkv, int heads, bool causal,
                                              const fg_tensor *kpm, const fg_tensor *y,
                                              const fg_tensor *lse, const fg_tensor *dy,
                                              fg_tensor *dqkv) {
    const char *k = "attention_bwd";
    (void)y;
    (void)lse; /* P is recomputed from Q and K by the forward's kernels */
    att a;
    FG_TRY(att_check(k, qkv, heads, &a));
    FG_TRY(att_mask(k, kpm, &a, qkv));
    FG_TRY(same(k, qkv, dqkv));
    if (dy->numel != a.B * a.T * a.C || dy->dtype != qkv->dtype)
        return fg_error(FG_EINVAL, "%s: want dy (B, T, C)", k);
    /* f32 throughout: q, k, v, do and their gradients widened */
    int64_t BH = a.B * a.H, n = BH * a.T * a.D, tt = BH * a.T * a.T;
    size_t bytes = (size_t)(7 * n + 2 * tt + BH * a.T) * 4;
    float *scr = fg_dev_alloc(qkv->dev, bytes, NULL);
    if (!scr) return fg_error_wrap(fg_last_status(), "%s scratch", k);
    float *q = scr, *kk = q + n, *v = kk + n, *dO = v + n, *dq = dO + n, *dk = dq + n, *dv = dk + n,
          *p = dv + n, *dp = p + tt, *l = dp + tt;
    float sc = (float)(1 / sqrt((double)a.D));
    fg_status r = FG_OK;
    if (a.dt == FG_CU_F32) {
        r = launched(k, fg__cu_qkv_split(a.st, a.dt, qkv->data, q, kk, v, a.B, a.T, a.H, a.D));
        if (r == FG_OK)
            r = launched(k, fg__cu_heads_split(a.st, a.dt, dy->data, dO, a.B, a.T, a.H, a.D));
    } else { /* widen through the f32 copies: split into dq's room, then cast */
        size_t e = a.esz;
        char *tmp = (char *)dq; /* 3 n elements of the narrow type fit in dq, dk, dv */
        r = launched(k, fg__cu_qkv_split(a.st, a.dt, qkv->data, tmp, tmp + n * e, tmp + 2 * n * e,
                                         a.B, a.T, a.H, a.D));
        if (r == FG_OK) r = launched(k, fg__cu_cast(a.st, a.dt, tmp, FG_CU_F32, q, 3 * n));
        if (r == FG_OK)
            r = launched(k, fg__cu_heads_split(a.st, a.dt, dy->data, tmp, a.B, a.T, a.H, a.D));
        if (r == FG_OK) r = launched(k, fg__cu_cast(a.st, a.dt, tmp, FG_CU_F32, dO, n));
    }
    if (r == FG_OK)
        r = bgemm(&a, FG_CU_F32, FG_CU_F32, false, true, a.T, a.T, a.D, q, a.D, kk, a.D, p, 1, 0);
    if (r == FG_OK)
        r = launched(k, fg__cu_attn_softmax(a.st, p, l, BH, a.T, causal, kpm ? kpm->data : NULL,
                                            kpm && kpm->dtype == FG_U8, a.H, sc));
    /* dV = P^T dO; dP = dO V^T; dS = P (dP - rowsum(dP P)) / sqrt(D) */
    if (r == FG_OK)
        r = bgemm(&a, FG_CU_F32, FG_CU_F32, true, false, a.T, a.D, a.T, p, a.T, dO, a.D, dv, 1, 0);
    if (r == FG_OK)
        r = bgemm(&a, FG_CU_F32, FG_CU_F32, false, true, a.T, a.T, a.D, dO, a.D, v, a.D, dp, 1, 0);
    if (r == FG_OK) r = launched(k, fg__cu_attn_softmax_bwd(a.st, p, dp, BH, a.T, sc));
    /* dQ = dS K; dK = dS^T Q */
    if (r == FG_OK)
        r = bgemm(&a, FG_CU_F32, FG_CU_F32, false, false, a.T, a.D, a.T, dp, a.T, kk, a.D, dq, 1,
                  0);
    if (r == FG_OK)
        r = bgemm(&a, FG_CU_F32, FG_CU_F32, true, false, a.T, a.D, a.T, dp, a.T, q, a.D, dk, 1, 0);
    if (r == FG_OK) {
        if (a.dt == FG_CU_F32) {
            r = launched(
                k, fg__cu_qkv_merge_add(a.st, a.dt, dq, dk, dv, dqkv->data, a.B, a.T, a.H, a.D));
        } else { /* narrow the three gradients into q's room (f32 q, k, v are done) */
            char *tmp = (char *)q;
            size_t e = a.esz;
            r = launched(k, fg__cu_cast(a.st, FG_CU_F32, dq, a.dt, tmp, 3 * n));
            if (r == FG_OK)
                r = launched(k, fg__cu_qkv_merge_add(a.st, a.dt, tmp, tmp + n * e, tmp + 2 * n * e,
                                                     dqkv->data, a.B, a.T, a.H, a.D));
        }
    }
    fg_status f = fg_dev_free(qkv->dev, scr);
    return r != FG_OK ? r : f;
}

/* ---------------------------------------------------------------- layouts, indexing */

static FG_MUST_USE fg_status cu_add_strided(const fg_tensor *x, fg_tensor *y) {
    const char *k = "add_strided";
    FG_TRY(same(k, x, y));
    if (x->ndim > FG_CU_MAX_DIMS)
        return fg_error(FG_EUNSUPPORTED, "add_strided: over 8 dims on cuda");
    int dt;
    FG_TRY(cu_dt(k, x, &dt));
    void *st;
    FG_TRY(stream_of(k, y, &st));
    int64_t one = 1, zero = 0;
    bool scalar = x->ndim == 0;
    return launched(k, fg__cu_add_strided(st, dt, x->data, y->data, scalar ? 1 : x->ndim,
                                          scalar ? &one : x->shape, scalar ? &zero : x->strides,
                                          scalar ? &zero : y->strides, x->numel));
}

static FG_MUST_USE fg_status cu_where(const fg_tensor *cond, const fg_tensor *a, const fg_tensor *b,
                                      double va, double vb, fg_tensor *y) {
    const char *k = "where";
    if (cond->dtype != FG_U8 && cond->dtype != FG_I32)
        return fg_error(FG_EINVAL, "where: condition is %s: expected u8 or i32",
                        fg_dtype_name(cond->dtype));
    if (!fg_tensor_same_shape(cond, y))
        return fg_error(FG_EINVAL, "where: condition and output shapes differ");
    FG_TRY(contig(k, cond));
    FG_TRY(contig(k, y));
    if (a) FG_TRY(same(k, a, y));
    if (b) FG_TRY(same(k, b, y));
    if (a) FG_TRY(contig(k, a));
    if (b) FG_TRY(contig(k, b));
    int dt;
    FG_TRY(cu_dt(k, y, &dt));
    void *st;
    FG_TRY(stream_of(k, y, &st));
    return launched(k, fg__cu_where(st, dt, cond->dtype == FG_U8, cond->data, a ? a->data : NULL,
                                    b ? b->data : NULL, (float)va, (float)vb, y->data, y->numel));
}

/* x (outer, n, inner) along dim (a 0-d x is (1, 1, 1)) */
static FG_MUST_USE fg_status along(const char *k, const fg_tensor *x, int dim, int64_t *o,
                                   int64_t *n, int64_t *in) {
    if (x->ndim == 0 && dim == 0) {
        *o = *n = *in = 1;
        return FG_OK;
    }
    return dim_split(k, x, dim, o, n, in);
}

static FG_MUST_USE fg_status cu_index_select(const fg_tensor *x, int dim, const fg_tensor *idx,
                                             fg_tensor *y) {
    const char *k = "index_select";
    int64_t o, n, in, kk = idx->numel;
    FG_TRY(along(k, x, dim, &o, &n, &in));
    if (idx->dtype != FG_I32 || idx->ndim > 1 || y->dtype != x->dtype || y->numel != o * kk * in)
        return fg_error(FG_EINVAL,
                        "index_select: x, i32 indices (k) and y do not match along dim %d", dim);
    FG_TRY(contig(k, x));
    FG_TRY(contig(k, y));
    int dt;
    FG_TRY(cu_dt(k, x, &dt));
    void *st;
    FG_TRY(stream_of(k, y, &st));
    int64_t *bad = fg_dev_alloc(y->dev, sizeof *bad, NULL), hb = -1;
    if (!bad) return fg_error_wrap(fg_last_status(), "%s scratch", k);
    fg_status s =
        launched(k, fg__cu_index_select(st, dt, x->data, idx->data, y->data, o, n, kk, in, bad));
    if (s == FG_OK) s = fg_dev_copy_d2h(y->dev, &hb, bad, sizeof hb);
    fg_status f = fg_dev_free(y->dev, bad);
    if (s != FG_OK) return s;
    if (hb >= 0)
        return fg_error(FG_EINVAL, "index_select: the index at position %lld is outside [0, %lld)",
                        (long long)hb, (long long)n);
    return f;
}

static FG_MUST_USE fg_status cu_index_add(const fg_tensor *dy, int dim, const fg_tensor *idx,
                                          fg_tensor *dx) {
    const char *k = "index_add";
    int64_t o, n, in, kk = idx->numel;
    FG_TRY(along(k, dx, dim, &o, &n, &in));
    if (idx->dtype != FG_I32 || idx->ndim > 1 || dy->dtype != dx->dtype || dy->numel != o * kk * in)
        return fg_error(FG_EINVAL,
                        "index_add: dx, i32 indices (k) and dy do not match along dim %d", dim);
    FG_TRY(contig(k, dy));
    FG_TRY(contig(k, dx));
    int dt;
    FG_TRY(cu_dt(k, dx, &dt));
    void *st;
    FG_TRY(stream_of(k, dx, &st));
    /* the indices were checked by the forward's index_select */
    return launched(k, fg__cu_index_add(st, dt, dy->data, idx->data, dx->data, o, n, kk, in));
}

static FG_MUST_USE fg_status cu_max_dim(const fg_tensor *x, int dim, bool is_min, fg_tensor *y,
                                        fg_tensor *idx) {
    const char *k = is_min ? "min_dim" : "max_dim";
    int64_t o, n, in;
    FG_TRY(along(k, x, dim, &o, &n, &in));
    if (n == 0)
        return fg_error(FG_EINVAL, "%s: dim %d has no elements: the extreme of none is undefined",
                        k, dim);
    if (y->numel != o * in || y->dtype != x->dtype ||
        (idx && (idx->dtype != FG_I32 || idx->numel != y->numel || !fg_tensor_is_contiguous(idx))))
        return fg_error(FG_EINVAL, "%s: output or indices do not match the input less dim %d", k,
                        dim);
    FG_TRY(contig(k, x));
    FG_TRY(contig(k, y));
    int dt;
    FG_TRY(cu_dt(k, x, &dt));
    void *st;
    FG_TRY(stream_of(k, y, &st));
    return launched(
        k, fg__cu_max_dim(st, dt, x->data, is_min, y->data, idx ? idx->data : NULL, o, n, in));
}

static FG_MUST_USE fg_status cu_cumsum(const fg_tensor *x, int dim, bool reverse, fg_tensor *y) {
    const char *k = "cumsum";
    int64_t o, n, in;
    FG_TRY(along(k, x, dim, &o, &n, &in));
    FG_TRY(same(k, x, y));
    FG_TRY(contig(k, x));
    FG_TRY(contig(k, y));
    int dt;
    FG_TRY(cu_dt(k, x, &dt));
    void *st;
    FG_TRY(stream_of(k, y, &st));
    return launched(k, fg__cu_cumsum(st, dt, x->data, y->data, o, n, in, reverse));
}

/* idx (and y or src) of x's ndim, no larger than x in every dim but dim
 * (no larger than other in any) */
static FG_MUST_USE fg_status gather_check(const char *k, const fg_tensor *x, int dim,
                                          const fg_tensor *idx, const fg_tensor *other) {
    if (dim < 0 || dim >= (x->ndim ? x->ndim : 1) || x->ndim > FG_CU_MAX_DIMS)
        return fg_error(FG_EINVAL, "%s: dim %d of a %d-d tensor", k, dim, x->ndim);
    FG_TRY(contig(k, x));
    FG_TRY(contig(k, other));
    FG_TRY(contig(k, idx));
    bool ok = idx->dtype == FG_I32 && idx->ndim == x->ndim && other->ndim == x->ndim &&
              other->dtype == x->dtype;
    for (int d = 0; ok && d < x->ndim; d++)
        ok = (d == dim || idx->shape[d] <= x->shape[d]) && idx->shape[d] <= other->shape[d];
    if (!ok)
        return fg_error(FG_EINVAL,
                        "%s: the i32 indices need the input's ndim and no larger a size than it "
                        "in every dim but %d",
                        k, dim);
    return FG_OK;
}

static FG_MUST_USE fg_status cu_gather(const fg_tensor *x, int dim, const fg_tensor *idx,
                                       fg_tensor *y) {
    const char *k = "gather";
    FG_TRY(gather_check(k, x, dim, idx, y));
    if (!fg_tensor_same_shape(idx, y))
        return fg_error(FG_EINVAL, "gather: the output needs the indices' shape");
    if (x->ndim == 0) return fg_tensor_copy(y, x);
    int dt;
    FG_TRY(cu_dt(k, x, &dt));
    void *st;
    FG_TRY(stream_of(k, y, &st));
    int64_t *bad = fg_dev_alloc(y->dev, sizeof *bad, NULL), hb = -1;
    if (!bad) return fg_error_wrap(fg_last_status(), "%s scratch", k);
    fg_status s = launched(k, fg__cu_gather(st, dt, 0, x->data, x->strides, idx->data, idx->shape,
                                            y->data, y->strides, x->ndim, dim, x->shape[dim], bad));
    if (s == FG_OK) s = fg_dev_copy_d2h(y->dev, &hb, bad, sizeof hb);
    fg_status f = fg_dev_free(y->dev, bad);
    if (s != FG_OK) return s;
    if (hb >= 0)
        return fg_error(FG_EINVAL, "gather: the index at position %lld is outside [0, %lld)",
                        (long long)hb, (long long)x->shape[dim]);
    return f;
}

static FG_MUST_USE fg_status cu_scatter_add(const fg_tensor *src, int dim, const fg_tensor *idx,
                                            fg_tensor *y) {
    const char *k = "scatter_add";
    FG_TRY(gather_check(k, y, dim, idx, src));
    if (y->ndim == 0) return cu_axpby(1, src, 1, y);
    int dt;
    FG_TRY(cu_dt(k, y, &dt));
    void *st;
    FG_TRY(stream_of(k, y, &st));
    /* indices outside y are not checked on the device: gather's forward,
     * whose backward this is, checked the same indices */
    return launched(k, fg__cu_gather(st, dt, 1, y->data, y->strides, idx->data, idx->shape,
                                     (void *)src->data, src->strides, y->ndim, dim, y->shape[dim],
                                     NULL));
}

/* ---------------------------------------------------------------- the table */

const fg_op_table fg__cuda_ops = {
    .device = "cuda",
    .matmul = cu_matmul,
    .bias_add = cu_bias_add,
    .bias_grad = cu_bias_grad,
    .attention_fwd = cu_attention_fwd,
    .attention_bwd = cu_attention_bwd,
    .binary = cu_binary,
    .sum_to = cu_sum_to,
    .axpby = cu_axpby,
    .scale = cu_scale,
    .sum_all = cu_sum_all,
    .sumsq_all = cu_sumsq_all,
    .sum_dim = cu_sum_dim,
    .sum_dim_bwd = cu_sum_dim_bwd,
    .relu_fwd = cu_relu_fwd,
    .relu_bwd = cu_relu_bwd,
    .gelu_fwd = cu_gelu_fwd,
    .gelu_bwd = cu_gelu_bwd,
    .softmax_fwd = cu_softmax_fwd,
    .softmax_bwd = cu_softmax_bwd,
    .log_softmax_fwd = cu_log_softmax_fwd,
    .log_softmax_bwd = cu_log_softmax_bwd,
    .cross_entropy_fwd = cu_ce_fwd,
    .cross_entropy_bwd = cu_ce_bwd,
    .cross_entropy_fwd_stats = cu_ce_fwd_stats,
    .cross_entropy_bwd_stats = cu_ce_bwd_stats,
    .layernorm_fwd = cu_layernorm_fwd,
    .layernorm_bwd = cu_layernorm_bwd,
    .embedding_fwd = cu_embedding_fwd,
    .embedding_bwd = cu_embedding_bwd,
    .dropout_fwd = cu_dropout_fwd,
    .dropout_bwd = cu_dropout_bwd,
    .unary_fwd = cu_unary_fwd,
    .unary_bwd = cu_unary_bwd,
    .add_strided = cu_add_strided,
    .where = cu_where,
    .index_select = cu_index_select,
    .index_add = cu_index_add,
    .gather = cu_gather,
    .scatter_add = cu_scatter_add,
    .max_dim = cu_max_dim,
    .cumsum = cu_cumsum,
    .pointwise_loss_fwd = fg__cu_pointwise_loss_fwd,
    .pointwise_loss_bwd = fg__cu_pointwise_loss_bwd,
    .nll_fwd = fg__cu_nll_fwd,
    .nll_bwd = fg__cu_nll_bwd,
    .conv2d_fwd = fg__cu_conv2d_fwd,
    .conv2d_bwd_data = fg__cu_conv2d_bwd_data,
    .conv2d_bwd_weight = fg__cu_conv2d_bwd_weight,
    .pool2d_fwd = fg__cu_pool2d_fwd,
    .pool2d_bwd = fg__cu_pool2d_bwd,
    .batch_norm_stats = fg__cu_batch_norm_stats,
    .batch_norm_fwd = fg__cu_batch_norm_fwd,
    .batch_norm_bwd = fg__cu_batch_norm_bwd,
};

/* ---------------------------------------------------------------- beyond the table */

fg_status fg__cuda_cast(const fg_tensor *src, fg_tensor *dst) {
    const char *k = "cast";
    if (src->numel != dst->numel)
        return fg_error(FG_EINVAL, "cast: %lld -> %lld elements", (long long)src->numel,
                        (long long)dst->numel);
    FG_TRY(contig(k, src));
    FG_TRY(contig(k, dst));
    int ds, dd;
    FG_TRY(cu_dt(k, src, &ds));
    FG_TRY(cu_dt(k, dst, &dd));
    void *st;
    FG_TRY(stream_of(k, dst, &st));
    return launched(k, fg__cu_cast(st, ds, src->data, dd, dst->data, src->numel));
}

fg_status fg__cuda_round_f32(const fg_tensor *src, fg_tensor *dst, fg_dtype dt) {
    const char *k = "round_f32";
    void *st;
    FG_TRY(stream_of(k, dst, &st));
    return launched(k, fg__cu_round_f32(st, src->data, dst->data, src->numel,
                                        dt == FG_BF16 ? FG_CU_BF16 : FG_CU_F16));
}

fg_status fg__cuda_linear_lowp(const fg_tensor *x, const fg_tensor *w, const fg_tensor *bias,
                               fg_tensor *y) {
    const char *k = "linear_lowp";
    int dx, dw, dy;
    FG_TRY(cu_dt(k, x, &dx));
    FG_TRY(cu_dt(k, w, &dw));
    FG_TRY(cu_dt(k, y, &dy));
    if (x->ndim != 2 || w->ndim != 2 || y->ndim != 2 || x->shape[1] != w->shape[1] ||
        y->shape[0] != x->shape[0] || y->shape[1] != w->shape[0] || dx != dw)
        return fg_error(FG_EINVAL, "linear_lowp: want x (R, in), w (out, in), y (R, out)");
    void *st;
    FG_TRY(stream_of(k, y, &st));
    int64_t R = x->shape[0], in = x->shape[1], out = w->shape[0];
    return fg__cuda_gemm(st, fg__cuda_index(y->dev), dx, dy, false, true, R, out, in, x->data, in,
                         0, w->data, in, 0, y->data, out, 0, 1, 1, 0,
                         bias ? FG_CU_EPI_BIAS : FG_CU_EPI_NONE, bias ? bias->data : NULL,
                         FG_CU_F32);
}

fg_status fg__cuda_adamw_multi(fg_dev *d, int n, float *const *p, const float *const *g,
                               float *const *m, float *const *v, const int64_t *len, double lr,
                               double b1, double b2, double eps, double wd, int64_t step) {
    const char *k = "adamw_multi";
    void *st = fg__cuda_stream(d, 0);
    if (!st) return fg_error_wrap(fg_last_status(), "%s", k);
    void *scr = fg_dev_alloc(d, (size_t)fg__cu_multi_scratch_bytes(n), NULL);
    if (!scr) return fg_error_wrap(fg_last_status(), "%s scratch", k);
    float bc1 = (float)(1 - pow(b1, (double)step)), bc2 = (float)(1 - pow(b2, (double)step));
    fg_status s = launched(k, fg__cu_adamw_multi(st, n, p, g, m, v, len, (float)lr, (float)b1,
                                                 (float)b2, (float)eps, (float)wd, bc1, bc2, scr));
    fg_status f = fg_dev_free(d, scr);
    return s != FG_OK ? s : f;
}

fg_status fg__cuda_sgd_multi(fg_dev *d, int n, float *const *p, const float *const *g,
                             float *const *buf, const int64_t *len, double lr, double momentum,
                             double dampening, double wd, bool nesterov, bool first) {
    const char *k = "sgd_multi";
    void *st = fg__cuda_stream(d, 0);
    if (!st) return fg_error_wrap(fg_last_status(), "%s", k);
    void *scr = fg_dev_alloc(d, (size_t)fg__cu_multi_scratch_bytes(n), NULL);
    if (!scr) return fg_error_wrap(fg_last_status(), "%s scratch", k);
    fg_status s = launched(k, fg__cu_sgd_multi(st, n, p, g, buf, len, (float)lr, (float)momentum,
                                               (float)dampening, (float)wd, nesterov, first, scr));
    fg_status f = fg_dev_free(d, scr);
    return s != FG_OK ? s : f;
}

fg_status fg__cuda_grad_norm_sq(fg_dev *d, int n, const fg_tensor *const *g, double *out) {
    /* the squares of each tensor in order, summed on the host in that order */
    (void)d;
    double acc = 0;
    for (int i = 0; i < n; i++) {
        double s;
        FG_TRY(sum_all("grad_norm", g[i], 1, &s));
        acc += s;
    }
    *out = acc;
    return FG_OK;
}
