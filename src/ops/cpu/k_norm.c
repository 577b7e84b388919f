/* Batch normalisation in training mode, fused, NCHW (any number of
 * trailing spatial dims): the per-channel statistics (mean and biased
 * variance, two passes accumulated in double), the normalisation with the
 * affine transform in one pass, and the backward of all of it (the
 * gradient through the batch statistics included) in two passes per
 * channel: what the composed ops of fg_batch_norm compute, without their
 * broadcast temporaries. Channels run in parallel: each channel's values
 * and its gradients are one thread's. f32 and f64.
 *
 * The sums over a channel run in NACC chains (element k into chain k mod
 * NACC within each row of a channel, the chains added in order at the
 * end): one chain waited on the latency of each double add (a third of
 * the CIFAR ResNet-18's step outside the convolutions). The order is
 * fixed, so the bits are the same on every machine and thread count; the
 * elementwise passes are vectorised (omp simd) with each element's
 * operations as they were. The rows are vk_norm_t.h's, for f32 those of
 * the ISA in use (fg__vk's bn_*: the chains in vector registers; this file
 * built for the baseline had them in SSE2 pairs, 8% of that step), with
 * the same bits on every path. The input gradient is added to, or written
 * where the caller's buffer holds nothing yet (dx_overwrite: the
 * autograd's fresh gradient, not zeroed: a conv's output feeds only its
 * batch norm). */
#include <math.h>
#include <string.h>

#include "k_ops.h"
#include "vk_norm_t.h"

NORM_ROWS(float, f32)
NORM_ROWS(double, f64)

/* The f32 rows of the ISA in use (vk_norm_t.h's, vectorised) or the
 * baseline's; f64 always the baseline's. */
typedef struct rows32 {
    void (*row_sum)(const float *x, int64_t n, double *s);
    void (*row_sq)(const float *x, int64_t n, double m, double *s);
    void (*row_gsum)(const float *x, const float *g, int64_t n, double m, double *s, double *t);
    void (*fwd_row)(const float *x, float *y, int64_t n, float a, float o);
    void (*bwd_row)(const float *x, const float *g, float *dx, int64_t n, const double *c,
                    bool overwrite);
} rows32;

static FG_MUST_USE fg_status rows_f32(rows32 *r) {
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    *r = vk->bn_row_sum ? (rows32){vk->bn_row_sum, vk->bn_row_sq, vk->bn_row_gsum, vk->bn_fwd_row,
                                   vk->bn_bwd_row}
                        : (rows32){bn_row_sum_f32, bn_row_sq_f32, bn_row_gsum_f32, bn_fwd_row_f32,
                                   bn_bwd_row_f32};
    return FG_OK;
}

/* the row function NAME of T: r32's for float, the baseline's for double */
#define ROW(T, NAME) _Generic((T)0, float : r32.NAME, double : bn_##NAME##_f64)

static double chains(const double *s) {
    double r = 0;
    for (int j = 0; j < NACC; j++) r += s[j];
    return r;
}

static FG_MUST_USE fg_status check(const char *kernel, const fg_tensor *x, const fg_tensor *y) {
    char a[96], b[96];
    if (x->ndim < 2 || !fg_tensor_is_contiguous(x) ||
        (y && (!fg_tensor_is_contiguous(y) || y->numel != x->numel || y->dtype != x->dtype)))
        return fg_error(FG_EINVAL,
                        "%s: input %s and output %s: expected contiguous (N, C, ...) "
                        "of one shape and dtype",
                        kernel, fg_tensor_describe(x, a, sizeof a),
                        y ? fg_tensor_describe(y, b, sizeof b) : "(none)");
    return FG_OK;
}

fg_status fg__cpu_batch_norm_stats(const fg_tensor *x, double *mean, double *var) {
    FG_TRY(check("batch_norm_stats", x, NULL));
    rows32 r32;
    FG_TRY(rows_f32(&r32));
    int64_t N = x->shape[0], C = x->shape[1], S = N > 0 && C > 0 ? x->numel / (N * C) : 0;
    double n = (double)(N * S);
    FG_FLOAT_DISPATCH("batch_norm_stats", x->dtype, {
        const T *px = x->data;
        FG_PRAGMA(omp parallel for schedule(static) if (x->numel > FG_PAR_MIN))
        for (int64_t c = 0; c < C; c++) {
            double s[NACC] = {0}, ss[NACC] = {0};
            for (int64_t i = 0; i < N; i++) {
                const T *p = px + (i * C + c) * S;
                ROW(T, row_sum)(p, S, s);
            }
            double m = chains(s) / n;
            for (int64_t i = 0; i < N; i++) {
                const T *p = px + (i * C + c) * S;
                ROW(T, row_sq)(p, S, m, ss);
            }
            mean[c] = m;
            var[c] = chains(ss) / n;
        }
    });
    return FG_OK;
}

fg_status fg__cpu_batch_norm_fwd(const fg_tensor *x, const double *mean, const double *invstd,
                                 const fg_tensor *w, const fg_tensor *b, fg_tensor *y) {
    FG_TRY(check("batch_norm_fwd", x, y));
    rows32 r32;
    FG_TRY(rows_f32(&r32));
    int64_t N = x->shape[0], C = x->shape[1], S = N > 0 && C > 0 ? x->numel / (N * C) : 0;
    FG_FLOAT_DISPATCH("batch_norm_fwd", x->dtype, {
        const T *px = x->data, *pw = w ? w->data : NULL, *pb = b ? b->data : NULL;
        T *py = y->data;
        FG_PRAGMA(omp parallel for schedule(static) if (x->numel > FG_PAR_MIN))
        for (int64_t c = 0; c < C; c++) {
            double sc = invstd[c] * (pw ? (double)pw[c] : 1.0);
            double sh = (pb ? (double)pb[c] : 0.0) - mean[c] * sc;
            T a = (T)sc, o = (T)sh;
            for (int64_t i = 0; i < N; i++) {
                const T *p = px + (i * C + c) * S;
                T *q = py + (i * C + c) * S;
                ROW(T, fwd_row)(p, q, S, a, o);
            }
        }
    });
    return FG_OK;
}

fg_status fg__cpu_batch_norm_bwd(const fg_tensor *x, const fg_tensor *dy, const double *mean,
                                 const double *invstd, const fg_tensor *w, fg_tensor *dx,
                                 fg_tensor *dw, fg_tensor *db, bool dx_overwrite) {
    FG_TRY(check("batch_norm_bwd", x, dy));
    if (dx) FG_TRY(check("batch_norm_bwd", x, dx));
    rows32 r32;
    FG_TRY(rows_f32(&r32));
    int64_t N = x->shape[0], C = x->shape[1], S = N > 0 && C > 0 ? x->numel / (N * C) : 0;
    double n = (double)(N * S);
    FG_FLOAT_DISPATCH("batch_norm_bwd", x->dtype, {
        const T *px = x->data, *pg = dy->data, *pw = w ? w->data : NULL;
        T *pdx = dx ? dx->data : NULL, *pdw = dw ? dw->data : NULL, *pdb = db ? db->data : NULL;
        FG_PRAGMA(omp parallel for schedule(static) if (x->numel > FG_PAR_MIN))
        for (int64_t c = 0; c < C; c++) {
            double m = mean[c], is = invstd[c], sgc[NACC] = {0}, sgxc[NACC] = {0};
            for (int64_t i = 0; i < N; i++) {
                const T *p = px + (i * C + c) * S, *g = pg + (i * C + c) * S;
                ROW(T, row_gsum)(p, g, S, m, sgc, sgxc);
            }
            double sg = chains(sgc), sgx = chains(sgxc) * is; /* the sum of dy * xhat */
            if (pdw) pdw[c] += (T)sgx;
            if (pdb) pdb[c] += (T)sg;
            if (!pdx) continue;
            /* dx = w invstd (dy - mean(dy) - xhat mean(dy xhat)) */
            double k[5] = {is * (pw ? (double)pw[c] : 1.0), sg / n, m, is, sgx / n};
            for (int64_t i = 0; i < N; i++) {
                const T *p = px + (i * C + c) * S, *g = pg + (i * C + c) * S;
                ROW(T, bwd_row)(p, g, pdx + (i * C + c) * S, S, k, dx_overwrite);
            }
        }
    });
    return FG_OK;
}
