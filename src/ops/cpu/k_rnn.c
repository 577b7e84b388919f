/* The LSTM and the GRU over a whole sequence, one direction of one layer
 * (rnn.c's fused path, through fg__ops_lstm_fwd / _bwd and fg__ops_gru_fwd /
 * _bwd): per time step one product h_prev W_hh^T for all the gates
 * together, then one pass over the step's rows that adds the input
 * projection and the bias, activates the gates and updates the state
 * (vk_rnn_t.h on the vector ISA, the portable loops below in f64 and on the
 * scalar path). Backward runs the steps in reverse
 * with one product a step for the recurrence (dG W_hh) and leaves the
 * weight gradient to one product over every step (dG^T H_prev), as cuDNN
 * and oneDNN's RNN primitives do. No memory is taken per step: the caller
 * hands the buffers of the whole sequence. */
#include "blas.h"
#include "core/core_impl.h"
#include "cpu_impl.h"
#include "ops/ops_impl.h"
#include "vmath.h"

#define FG_TANH(x) _Generic((x), float : tanhf, default : tanh)(x)

/* c (M, N) = op(a) op(b) + beta c, row-major: the f32 engine of the
 * products' choice (gemm_pick.c), OpenBLAS's dgemm in f64 */
static FG_MUST_USE fg_status gemm(fg_dtype dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                                  const void *a, int64_t lda, const void *b, int64_t ldb,
                                  double beta, void *c, int64_t ldc) {
    if (M == 0 || N == 0 || K == 0) return FG_OK; /* K = 0: dW_hh over one step, beta 1 */
    enum CBLAS_TRANSPOSE oa = ta ? CblasTrans : CblasNoTrans, ob = tb ? CblasTrans : CblasNoTrans;
    if (dt == FG_F64) {
        cblas_dgemm(CblasRowMajor, oa, ob, (int)M, (int)N, (int)K, 1.0, a, (int)lda, b, (int)ldb,
                    beta, c, (int)ldc);
        return FG_OK;
    }
    int nth = fg__threads_now();
    fg__gemm_choice ch;
    FG_TRY(fg__gemm_choose(ta, tb, beta != 0, M, N, K, nth, &ch));
    if (ch.threads != nth) fg__threads_use(ch.threads);
    fg_status s = FG_EUNSUPPORTED;
    if (ch.engine == FG_GEMM_ONEDNN)
        s = fg__cpu_gemm_dnnl_f32(ta, tb, M, N, K, 1.0f, a, lda, b, ldb, (float)beta, c, ldc);
    if (s == FG_EUNSUPPORTED) {
        cblas_sgemm(CblasRowMajor, oa, ob, (int)M, (int)N, (int)K, 1.0f, a, (int)lda, b, (int)ldb,
                    (float)beta, c, (int)ldc);
        s = FG_OK;
    }
    if (ch.threads != nth) fg__threads_use(nth);
    return s;
}

/* The per-step product c (M, N) = a (M, K) op(b) with b the same at every
 * step: oneDNN's matmul with b reordered once (fg__dnnl_fixed) where the
 * products' measured choice for that class is oneDNN (its brgemm kernels
 * on pre-blocked b ran 32x2048x512 at 97 GFLOP/s against 77 with b plain,
 * 32x512x2048 at 114 against 69, one thread of the AVX-512 Xeon), else
 * NULL: gemm() at each step. */
static fg__dnnl_fixed *fixed_for(fg_dtype dt, bool tb, int64_t M, int64_t N, int64_t K,
                                 const void *b, int64_t ldb) {
    fg__gemm_choice ch;
    if (dt != FG_F32 || fg__gemm_choose(false, tb, false, M, N, K, fg__threads_now(), &ch) ||
        ch.engine != FG_GEMM_ONEDNN || ch.threads != fg__threads_now())
        return NULL;
    fg__dnnl_fixed *f = NULL;
    return fg__dnnl_fixed_new(tb, M, N, K, b, ldb, &f) == FG_OK ? f : NULL;
}

static FG_MUST_USE fg_status step_gemm(fg__dnnl_fixed *f, fg_dtype dt, bool tb, int64_t M,
                                       int64_t N, int64_t K, const void *a, const void *b,
                                       int64_t ldb, void *c) {
    if (f) return fg__dnnl_fixed_run(f, a, c);
    return gemm(dt, false, tb, M, N, K, a, K, b, ldb, 0.0, c, N);
}

static FG_MUST_USE fg_status rnn_check(const char *k, const fg_tensor *const *t, int n) {
    if (t[0]->dtype != FG_F32 && t[0]->dtype != FG_F64)
        return fg_error(FG_EUNSUPPORTED, "%s: dtype %s: f32 or f64 only on cpu", k,
                        fg_dtype_name(t[0]->dtype));
    for (int i = 0; i < n; i++)
        if (t[i]) {
            if (t[i]->dtype != t[0]->dtype)
                return fg_error(FG_EINVAL, "%s: dtypes differ (%s, %s)", k,
                                fg_dtype_name(t[0]->dtype), fg_dtype_name(t[i]->dtype));
            FG_TRY(fg__expect_contiguous(k, t[i]));
        }
    return FG_OK;
}

/* the portable step (f64, and f32 on the scalar path): vk_lstm_fwd's math
 * with libm's exp and tanh */
#define LSTM_FWD_ROWS(T, g, xw, b, cp, c, h, rows, H)                                              \
    for (int64_t r = 0; r < (rows); r++)                                                           \
        for (int64_t j = 0; j < (H); j++) {                                                        \
            T *gr = (g) + r * 4 * (H);                                                             \
            const T *xr = (xw) + r * 4 * (H);                                                      \
            T v[4];                                                                                \
            for (int q = 0; q < 4; q++)                                                            \
                v[q] = gr[q * (H) + j] + xr[q * (H) + j] + ((b) ? (b)[q * (H) + j] : (T)0);        \
            T si = 1 / (1 + FG_EXP(-v[0])), sf = 1 / (1 + FG_EXP(-v[1]));                          \
            T tg = FG_TANH(v[2]), so = 1 / (1 + FG_EXP(-v[3]));                                    \
            T cv = sf * (cp)[r * (H) + j] + si * tg;                                               \
            gr[j] = si;                                                                            \
            gr[(H) + j] = sf;                                                                      \
            gr[2 * (H) + j] = tg;                                                                  \
            gr[3 * (H) + j] = so;                                                                  \
            (c)[r * (H) + j] = cv;                                                                 \
            (h)[r * (H) + j] = so * FG_TANH(cv);                                                   \
        }

#define LSTM_BWD_ROWS(T, g, c, cp, dy, dhr, dc, dg, rows, H)                                       \
    for (int64_t r = 0; r < (rows); r++)                                                           \
        for (int64_t j = 0; j < (H); j++) {                                                        \
            const T *gr = (g) + r * 4 * (H);                                                       \
            T *dr = (dg) + r * 4 * (H);                                                            \
            int64_t e = r * (H) + j;                                                               \
            T i = gr[j], f = gr[(H) + j], gt = gr[2 * (H) + j], o = gr[3 * (H) + j];               \
            T tc = FG_TANH((c)[e]), dh = (dy)[e] + (dhr)[e];                                       \
            T dcv = (dc)[e] + dh * o * (1 - tc * tc);                                              \
            dr[j] = dcv * gt * i * (1 - i);                                                        \
            dr[(H) + j] = dcv * (cp)[e] * f * (1 - f);                                             \
            dr[2 * (H) + j] = dcv * i * (1 - gt * gt);                                             \
            dr[3 * (H) + j] = dh * tc * o * (1 - o);                                               \
            (dc)[e] = dcv * f;                                                                     \
        }

fg_status fg__cpu_lstm_fwd(const fg_tensor *xw, const fg_tensor *whh, const fg_tensor *bhh,
                           const fg_tensor *h0, const fg_tensor *c0, bool reverse, fg_tensor *y,
                           fg_tensor *gates, fg_tensor *cs) {
    const fg_tensor *all[8] = {xw, whh, bhh, h0, c0, y, gates, cs};
    FG_TRY(rnn_check("lstm_fwd", all, 8));
    int64_t L = xw->shape[0], N = xw->shape[1], H = whh->shape[1], NH = N * H, NG = 4 * NH;
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    fg_dtype dt = xw->dtype;
    size_t es = fg_dtype_size(dt);
    char *pg = gates->data, *pc = cs->data, *py = y->data;
    const char *px = xw->data;
    fg__dnnl_fixed *fx = fixed_for(dt, true, N, 4 * H, H, whh->data, H);
    fg_status st = FG_OK;
    for (int64_t s = 0; s < L && st == FG_OK; s++) {
        int64_t t = reverse ? L - 1 - s : s, tp = reverse ? t + 1 : t - 1;
        const void *hp = s ? py + (size_t)(tp * NH) * es : h0->data;
        const void *cp = s ? pc + (size_t)(tp * NH) * es : c0->data;
        void *g = pg + (size_t)(t * NG) * es, *c = pc + (size_t)(t * NH) * es;
        void *h = py + (size_t)(t * NH) * es;
        const void *x = px + (size_t)(t * NG) * es;
        /* g (N, 4H) = h_prev (N, H) W_hh^T */
        st = step_gemm(fx, dt, true, N, 4 * H, H, hp, whh->data, H, g);
        if (st != FG_OK) break;
        if (dt == FG_F32 && vk->lstm_fwd) {
            vk->lstm_fwd(g, x, bhh ? bhh->data : NULL, cp, c, h, N, H);
        } else {
            FG_FLOAT_DISPATCH("lstm_fwd", dt, {
                const T *b = bhh ? (const T *)bhh->data : NULL;
                LSTM_FWD_ROWS(T, (T *)g, (const T *)x, b, (const T *)cp, (T *)c, (T *)h, N, H);
            });
        }
    }
    fg__dnnl_fixed_free(fx);
    if (st != FG_OK) return st;
    /* the last row of y: the final cell state */
    memcpy(py + (size_t)(L * NH) * es, pc + (size_t)((reverse ? 0 : L - 1) * NH) * es,
           (size_t)NH * es);
    return FG_OK;
}

fg_status fg__cpu_lstm_bwd(const fg_tensor *whh, const fg_tensor *h0, const fg_tensor *c0,
                           const fg_tensor *y, const fg_tensor *gates, const fg_tensor *cs,
                           const fg_tensor *dy, bool reverse, fg_tensor *dg, fg_tensor *dwhh,
                           fg_tensor *dh0, fg_tensor *dc0) {
    const fg_tensor *all[10] = {whh, h0, c0, y, gates, cs, dy, dg, dwhh, dh0};
    FG_TRY(rnn_check("lstm_bwd", all, 10));
    const fg_tensor *last[2] = {whh, dc0};
    FG_TRY(rnn_check("lstm_bwd", last, 2));
    int64_t L = gates->shape[0], N = gates->shape[1], H = whh->shape[1], NH = N * H, NG = 4 * NH;
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    fg_dtype dt = whh->dtype;
    size_t es = fg_dtype_size(dt);
    /* dhr: the recurrence's part of dh; dc: the cell's gradient (from c_n's) */
    char *dhr = fg_alloc(2 * (size_t)NH * es), *dc = dhr ? dhr + (size_t)NH * es : NULL;
    if (!dhr) return fg_error(FG_ENOMEM, "lstm_bwd: %lld bytes", (long long)(2 * NH * es));
    memset(dhr, 0, (size_t)NH * es);
    memcpy(dc, (const char *)dy->data + (size_t)(L * NH) * es, (size_t)NH * es);
    const char *pg = gates->data, *pc = cs->data, *pdy = dy->data;
    char *pd = dg->data;
    fg_status st = FG_OK;
    fg__dnnl_fixed *fx = fixed_for(dt, false, N, H, 4 * H, whh->data, H);
    for (int64_t s = L - 1; s >= 0 && st == FG_OK; s--) {
        int64_t t = reverse ? L - 1 - s : s, tp = reverse ? t + 1 : t - 1;
        const void *cp = s ? pc + (size_t)(tp * NH) * es : c0->data;
        const void *g = pg + (size_t)(t * NG) * es, *c = pc + (size_t)(t * NH) * es;
        const void *d = pdy + (size_t)(t * NH) * es;
        void *gd = pd + (size_t)(t * NG) * es;
        if (dt == FG_F32 && vk->lstm_bwd) {
            vk->lstm_bwd(g, c, cp, d, (const float *)dhr, (float *)dc, gd, N, H);
        } else {
            FG_FLOAT_DISPATCH("lstm_bwd", dt, {
                LSTM_BWD_ROWS(T, (const T *)g, (const T *)c, (const T *)cp, (const T *)d,
                              (const T *)dhr, (T *)dc, (T *)gd, N, H);
            });
        }
        /* dh_prev (N, H) = dG (N, 4H) W_hh (4H, H) */
        if (s || dh0) st = step_gemm(fx, dt, false, N, H, 4 * H, gd, whh->data, H, dhr);
    }
    fg__dnnl_fixed_free(fx);
    if (st == FG_OK && dwhh) {
        /* dW_hh (4H, H) += dG^T H_prev over the steps after the first
         * (their h_prev are rows of y), then the first step's with h0 */
        size_t first = (size_t)(reverse ? L - 1 : 0), rest = reverse ? 0 : 1;
        st = gemm(dt, true, false, 4 * H, H, (L - 1) * N, pd + rest * (size_t)NG * es, 4 * H,
                  (const char *)y->data + (1 - rest) * (size_t)NH * es, H, 1.0, dwhh->data, H);
        if (st == FG_OK)
            st = gemm(dt, true, false, 4 * H, H, N, pd + first * (size_t)NG * es, 4 * H, h0->data,
                      H, 1.0, dwhh->data, H);
    }
    if (st == FG_OK && (dh0 || dc0)) {
        FG_FLOAT_DISPATCH("lstm_bwd", dt, {
            const T *a = (const T *)dhr, *b = (const T *)dc;
            if (dh0) {
                T *o = dh0->data;
                FG_SIMD for (int64_t e = 0; e < NH; e++) o[e] += a[e];
            }
            if (dc0) {
                T *o = dc0->data;
                FG_SIMD for (int64_t e = 0; e < NH; e++) o[e] += b[e];
            }
        });
    }
    fg_free(dhr);
    return st;
}

/* The GRU's portable step (f64, and f32 on the scalar path): vk_gru_fwd's
 * math with libm's exp and tanh. g (rows, 3H) = h_prev W_hh^T; gates (rows,
 * 4H) gets r, z, n and W_hn h_prev + b_hn, which the backward reads. */
#define GRU_FWD_ROWS(T, g, xw, b, hp, gt, h, rows, H)                                              \
    for (int64_t r = 0; r < (rows); r++)                                                           \
        for (int64_t j = 0; j < (H); j++) {                                                        \
            const T *gr = (g) + r * 3 * (H), *xr = (xw) + r * 3 * (H);                             \
            T *o = (gt) + r * 4 * (H);                                                             \
            T ar = gr[j] + xr[j] + ((b) ? (b)[j] : (T)0);                                          \
            T az = gr[(H) + j] + xr[(H) + j] + ((b) ? (b)[(H) + j] : (T)0);                        \
            T hn = gr[2 * (H) + j] + ((b) ? (b)[2 * (H) + j] : (T)0);                              \
            T rv = 1 / (1 + FG_EXP(-ar)), zv = 1 / (1 + FG_EXP(-az));                              \
            T nv = FG_TANH(xr[2 * (H) + j] + rv * hn), pv = (hp)[r * (H) + j];                     \
            o[j] = rv;                                                                             \
            o[(H) + j] = zv;                                                                       \
            o[2 * (H) + j] = nv;                                                                   \
            o[3 * (H) + j] = hn;                                                                   \
            (h)[r * (H) + j] = nv + zv * (pv - nv);                                                \
        }

/* dh = dy + dhr + dhd (the output's, the product's and the direct
 * recurrence's parts); dx (rows, 3H) the gradient of the input projection's
 * gates, dgh (rows, 3H) that of h_prev W_hh^T + b_hh (the same but in n:
 * there r times it), dhd on return h_prev's direct part dh z */
#define GRU_BWD_ROWS(T, gt, hp, dy, dhr, dhd, dx, dgh, rows, H)                                    \
    for (int64_t r = 0; r < (rows); r++)                                                           \
        for (int64_t j = 0; j < (H); j++) {                                                        \
            const T *o = (gt) + r * 4 * (H);                                                       \
            T *xr = (dx) + r * 3 * (H), *hr = (dgh) + r * 3 * (H);                                 \
            int64_t e = r * (H) + j;                                                               \
            T rv = o[j], zv = o[(H) + j], nv = o[2 * (H) + j], hn = o[3 * (H) + j];                \
            T dh = (dy)[e] + (dhr)[e] + (dhd)[e];                                                  \
            T dan = dh * (1 - zv) * (1 - nv * nv);                                                 \
            T dar = dan * hn * rv * (1 - rv), daz = dh * ((hp)[e] - nv) * zv * (1 - zv);           \
            xr[j] = hr[j] = dar;                                                                   \
            xr[(H) + j] = hr[(H) + j] = daz;                                                       \
            xr[2 * (H) + j] = dan;                                                                 \
            hr[2 * (H) + j] = dan * rv;                                                            \
            (dhd)[e] = dh * zv;                                                                    \
        }

fg_status fg__cpu_gru_fwd(const fg_tensor *xw, const fg_tensor *whh, const fg_tensor *bhh,
                          const fg_tensor *h0, bool reverse, fg_tensor *y, fg_tensor *gates) {
    const fg_tensor *all[6] = {xw, whh, bhh, h0, y, gates};
    FG_TRY(rnn_check("gru_fwd", all, 6));
    int64_t L = xw->shape[0], N = xw->shape[1], H = whh->shape[1], NH = N * H;
    int64_t NX = 3 * NH, NG = 4 * NH;
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    fg_dtype dt = xw->dtype;
    size_t es = fg_dtype_size(dt);
    /* the step's product h_prev W_hh^T (N, 3H), reused at every step */
    char *g = fg_alloc((size_t)NX * es);
    if (!g) return fg_error(FG_ENOMEM, "gru_fwd: %lld bytes", (long long)((size_t)NX * es));
    char *pg = gates->data, *py = y->data;
    const char *px = xw->data;
    fg__dnnl_fixed *fx = fixed_for(dt, true, N, 3 * H, H, whh->data, H);
    fg_status st = FG_OK;
    for (int64_t s = 0; s < L && st == FG_OK; s++) {
        int64_t t = reverse ? L - 1 - s : s, tp = reverse ? t + 1 : t - 1;
        const void *hp = s ? py + (size_t)(tp * NH) * es : h0->data;
        void *gt = pg + (size_t)(t * NG) * es, *h = py + (size_t)(t * NH) * es;
        const void *x = px + (size_t)(t * NX) * es;
        st = step_gemm(fx, dt, true, N, 3 * H, H, hp, whh->data, H, g);
        if (st != FG_OK) break;
        if (dt == FG_F32 && vk->gru_fwd) {
            vk->gru_fwd((const float *)g, x, bhh ? bhh->data : NULL, hp, gt, h, N, H);
        } else {
            FG_FLOAT_DISPATCH("gru_fwd", dt, {
                const T *b = bhh ? (const T *)bhh->data : NULL;
                GRU_FWD_ROWS(T, (const T *)g, (const T *)x, b, (const T *)hp, (T *)gt, (T *)h, N,
                             H);
            });
        }
    }
    fg__dnnl_fixed_free(fx);
    fg_free(g);
    return st;
}

fg_status fg__cpu_gru_bwd(const fg_tensor *whh, const fg_tensor *h0, const fg_tensor *y,
                          const fg_tensor *gates, const fg_tensor *dy, bool reverse, fg_tensor *dx,
                          fg_tensor *dgh, fg_tensor *dwhh, fg_tensor *dh0) {
    const fg_tensor *all[9] = {whh, h0, y, gates, dy, dx, dgh, dwhh, dh0};
    FG_TRY(rnn_check("gru_bwd", all, 9));
    int64_t L = gates->shape[0], N = gates->shape[1], H = whh->shape[1], NH = N * H;
    int64_t NX = 3 * NH, NG = 4 * NH;
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    fg_dtype dt = whh->dtype;
    size_t es = fg_dtype_size(dt);
    /* dhr: h_prev's gradient through the product (dG_h W_hh), dhd: its
     * direct part (dh z); both zero before the last step */
    char *dhr = fg_calloc(2 * (size_t)NH, es), *dhd = dhr ? dhr + (size_t)NH * es : NULL;
    if (!dhr) return fg_error(FG_ENOMEM, "gru_bwd: %lld bytes", (long long)(2 * NH * es));
    const char *pg = gates->data, *py = y->data, *pdy = dy->data;
    char *px = dx->data, *ph = dgh->data;
    fg_status st = FG_OK;
    fg__dnnl_fixed *fx = fixed_for(dt, false, N, H, 3 * H, whh->data, H);
    for (int64_t s = L - 1; s >= 0 && st == FG_OK; s--) {
        int64_t t = reverse ? L - 1 - s : s, tp = reverse ? t + 1 : t - 1;
        const void *hp = s ? py + (size_t)(tp * NH) * es : h0->data;
        const void *gt = pg + (size_t)(t * NG) * es, *d = pdy + (size_t)(t * NH) * es;
        void *gx = px + (size_t)(t * NX) * es, *gh = ph + (size_t)(t * NX) * es;
        if (dt == FG_F32 && vk->gru_bwd) {
            vk->gru_bwd(gt, hp, d, (const float *)dhr, (float *)dhd, gx, gh, N, H);
        } else {
            FG_FLOAT_DISPATCH("gru_bwd", dt, {
                GRU_BWD_ROWS(T, (const T *)gt, (const T *)hp, (const T *)d, (const T *)dhr,
                             (T *)dhd, (T *)gx, (T *)gh, N, H);
            });
        }
        /* dh_prev's product part (N, H) = dG_h (N, 3H) W_hh (3H, H) */
        if (s || dh0) st = step_gemm(fx, dt, false, N, H, 3 * H, gh, whh->data, H, dhr);
    }
    fg__dnnl_fixed_free(fx);
    if (st == FG_OK && dwhh) {
        /* dW_hh (3H, H) += dG_h^T H_prev, the steps after the first from y's
         * rows, then the first step's with h0 (as the LSTM's) */
        size_t first = (size_t)(reverse ? L - 1 : 0), rest = reverse ? 0 : 1;
        st = gemm(dt, true, false, 3 * H, H, (L - 1) * N, ph + rest * (size_t)NX * es, 3 * H,
                  py + (1 - rest) * (size_t)NH * es, H, 1.0, dwhh->data, H);
        if (st == FG_OK)
            st = gemm(dt, true, false, 3 * H, H, N, ph + first * (size_t)NX * es, 3 * H, h0->data,
                      H, 1.0, dwhh->data, H);
    }
    if (st == FG_OK && dh0) {
        FG_FLOAT_DISPATCH("gru_bwd", dt, {
            const T *a = (const T *)dhr, *b = (const T *)dhd;
            T *o = dh0->data;
            FG_SIMD for (int64_t e = 0; e < NH; e++) o[e] += a[e] + b[e];
        });
    }
    fg_free(dhr);
    return st;
}
