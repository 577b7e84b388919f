/* The CUDA table's CNN entries: 2-d convolution (im2col, then one batched
 * cuBLASLt product over the groups per chunk of images; col2im for the
 * input's gradient), pooling, and batch normalisation in training mode, on
 * the kernels of cnn.cu, with the CPU table's shapes and rules (k_conv.c,
 * k_pool.c, k_norm.c). f32; bf16 and f16 convolutions and poolings run on
 * f32 copies (computed in f32, rounded once), as the CPU's low-precision
 * table does; batch norm takes f32 (autocast keeps norms in f32). Scratch
 * comes from the device's caching allocator and is freed at once (the
 * block is reused only by later work on the same stream). */
#include <string.h>

#include "blaslt.h"
#include "cuda_ops.h"
#include "entry.h"

/* bytes of im2col's patch matrix a chunk of images may take */
#define COL_BYTES ((size_t)256 << 20)

/* ------------------------------------------------------------ f32 copies */

/* frees device scratch p (when not NULL) and returns r, or the free's
 * failure after a success */
static FG_MUST_USE fg_status freed(fg_dev *d, void *p, fg_status r) {
    fg_status f = p ? fg_dev_free(d, p) : FG_OK;
    return r != FG_OK ? r : f;
}

/* t's data as f32: t's own when it is f32, else a copy (cast when load) */
typedef struct f32v {
    const fg_tensor *t;
    float *p;
    bool own;
} f32v;

static FG_MUST_USE fg_status widen(const char *k, void *st, const fg_tensor *t, bool load,
                                   f32v *v) {
    *v = (f32v){.t = t};
    if (!t) return FG_OK;
    int dt;
    FG_TRY(cu_dt(k, t, &dt));
    FG_TRY(contig(k, t));
    if (dt == FG_CU_F32) {
        v->p = t->data;
        return FG_OK;
    }
    v->p = fg_dev_alloc(t->dev, sizeof(float) * (size_t)(t->numel ? t->numel : 1), NULL);
    if (!v->p)
        return fg_error_wrap(fg_last_status(), "%s: f32 copy of %s", k, fg_dtype_name(t->dtype));
    v->own = true;
    return load ? launched(k, fg__cu_cast(st, dt, t->data, FG_CU_F32, v->p, t->numel)) : FG_OK;
}

/* the f32 copy rounded back into its tensor (when there is one and r is
 * FG_OK), then freed; returns the first failure */
static FG_MUST_USE fg_status settle(const char *k, void *st, f32v *v, bool store, fg_status r) {
    if (!v->own) return r;
    int dt = FG_CU_F32;
    if (r == FG_OK && store && cu_dt(k, v->t, &dt) == FG_OK)
        r = launched(k, fg__cu_cast(st, FG_CU_F32, v->p, dt, v->t->data, v->t->numel));
    v->own = false;
    return freed(v->t->dev, v->p, r);
}

/* ------------------------------------------------------------ convolution */

/* the geometry of x (N, C, H, W), a weight of (O, C / G, KH, KW) (kh, kw
 * its last dims) and y (N, O, OH, OW), checked as the CPU's */
static FG_MUST_USE fg_status conv_geo(const char *k, const fg_tensor *x, int64_t O, int64_t Cw,
                                      int64_t kh, int64_t kw, const fg_tensor *y,
                                      const fg_conv_params *p, fg__cu_conv *g) {
    char a[96], b[96];
    bool ok = x->ndim == 4 && y->ndim == 4 && x->dtype == y->dtype && p->groups >= 1 &&
              fg_tensor_is_contiguous(x) && fg_tensor_is_contiguous(y) && x->dev == y->dev;
    if (ok) {
        *g = (fg__cu_conv){.N = x->shape[0],
                           .C = x->shape[1],
                           .H = x->shape[2],
                           .W = x->shape[3],
                           .O = O,
                           .KH = kh,
                           .KW = kw,
                           .OH = y->shape[2],
                           .OW = y->shape[3],
                           .G = p->groups,
                           .sh = p->stride[0],
                           .sw = p->stride[1],
                           .ph = p->pad[0],
                           .pw = p->pad[1],
                           .dh = p->dilation[0],
                           .dw = p->dilation[1]};
        ok = g->C % g->G == 0 && g->O % g->G == 0 && Cw == g->C / g->G && y->shape[0] == g->N &&
             y->shape[1] == g->O && g->sh > 0 && g->sw > 0 && g->dh > 0 && g->dw > 0 &&
             g->ph >= 0 && g->pw >= 0 && kh > 0 && kw > 0;
    }
    if (!ok)
        return fg_error(FG_EINVAL,
                        "%s: input %s, output %s and a weight of (%lld, %lld, %lld, %lld) do not "
                        "make a convolution (contiguous (N, C, H, W), (O, C / groups, KH, KW), "
                        "(N, O, OH, OW), groups %lld, one device)",
                        k, fg_tensor_describe(x, a, sizeof a), fg_tensor_describe(y, b, sizeof b),
                        (long long)O, (long long)Cw, (long long)kh, (long long)kw,
                        (long long)p->groups);
    return FG_OK;
}

static FG_MUST_USE fg_status conv_weight_geo(const char *k, const fg_tensor *x, const fg_tensor *w,
                                             const fg_tensor *y, const fg_conv_params *p,
                                             fg__cu_conv *g) {
    if (w->ndim != 4 || w->dtype != x->dtype || !fg_tensor_is_contiguous(w) || w->dev != x->dev) {
        char a[96];
        return fg_error(FG_EINVAL,
                        "%s: weight %s: expected contiguous (O, C / groups, KH, KW) "
                        "of the input's dtype and device",
                        k, fg_tensor_describe(w, a, sizeof a));
    }
    return conv_geo(k, x, w->shape[0], w->shape[1], w->shape[2], w->shape[3], y, p, g);
}

/* images a chunk: im2col's matrix within COL_BYTES, at least one */
static int64_t chunk_images(const fg__cu_conv *g) {
    size_t per = sizeof(float) * (size_t)(g->C * g->KH * g->KW) * (size_t)(g->OH * g->OW);
    int64_t nb = per ? (int64_t)(COL_BYTES / per) : g->N;
    return nb < 1 ? 1 : nb > g->N ? g->N : nb;
}

/* the chunk's scratch: col (C KH KW, nb P) and t (O, nb P) */
static float *conv_scratch(const char *k, fg_dev *d, const fg__cu_conv *g, int64_t nb, float **t) {
    size_t P = (size_t)(g->OH * g->OW), ncol = (size_t)(g->C * g->KH * g->KW) * (size_t)nb * P;
    size_t nt = (size_t)g->O * (size_t)nb * P;
    float *col = fg_dev_alloc(d, sizeof(float) * (ncol + nt + 1), NULL);
    if (!col) fg_error_wrap(fg_last_status(), "%s: scratch for %lld images", k, (long long)nb);
    *t = col ? col + ncol : NULL;
    return col;
}

fg_status fg__cu_conv2d_fwd(const fg_tensor *x, const fg_tensor *w, const fg_tensor *b,
                            const fg_conv_params *p, fg_tensor *y) {
    const char *k = "conv2d_fwd";
    fg__cu_conv g;
    FG_TRY(conv_weight_geo(k, x, w, y, p, &g));
    if (b && (b->numel != g.O || b->dtype != x->dtype || b->dev != x->dev))
        return fg_error(FG_EINVAL, "%s: the bias needs %lld elements of %s", k, (long long)g.O,
                        fg_dtype_name(x->dtype));
    if (y->numel == 0) return FG_OK;
    void *st;
    FG_TRY(stream_of(k, y, &st));
    f32v xv, wv, bv, yv;
    fg_status r = widen(k, st, x, true, &xv);
    if (r == FG_OK) r = widen(k, st, w, true, &wv);
    if (r == FG_OK) r = widen(k, st, b, true, &bv);
    if (r == FG_OK) r = widen(k, st, y, false, &yv);
    int64_t Cg = g.C / g.G, Og = g.O / g.G, CK = Cg * g.KH * g.KW, P = g.OH * g.OW;
    int64_t nb = chunk_images(&g);
    float *t = NULL, *col = r == FG_OK ? conv_scratch(k, y->dev, &g, nb, &t) : NULL;
    if (r == FG_OK && !col) r = fg_last_status();
    for (int64_t n0 = 0; r == FG_OK && n0 < g.N; n0 += nb) {
        int64_t m = g.N - n0 < nb ? g.N - n0 : nb, L = m * P;
        r = launched(k, fg__cu_im2col(st, xv.p, col, &g, n0, m));
        /* per group: t_g (Og, L) = w_g (Og, CK) col_g (CK, L) */
        if (r == FG_OK)
            r = fg__cuda_gemm(st, fg__cuda_index(y->dev), FG_CU_F32, FG_CU_F32, false, false, Og, L,
                              CK, wv.p, CK, Og * CK, col, L, CK * L, t, L, Og * L, g.G, 1.0f, 0.0f,
                              FG_CU_EPI_NONE, NULL, 0);
        if (r == FG_OK) r = launched(k, fg__cu_conv_out(st, t, bv.p, yv.p, n0, m, g.O, P));
    }
    r = freed(y->dev, col, r);
    r = settle(k, st, &yv, true, r);
    r = settle(k, st, &bv, false, r);
    r = settle(k, st, &wv, false, r);
    return settle(k, st, &xv, false, r);
}

fg_status fg__cu_conv2d_bwd_data(const fg_tensor *dy, const fg_tensor *w, const fg_conv_params *p,
                                 fg_tensor *dx) {
    const char *k = "conv2d_bwd_data";
    fg__cu_conv g;
    FG_TRY(conv_weight_geo(k, dx, w, dy, p, &g));
    if (dx->numel == 0) return FG_OK;
    void *st;
    FG_TRY(stream_of(k, dx, &st));
    f32v gv, wv, xv;
    fg_status r = widen(k, st, dy, true, &gv);
    if (r == FG_OK) r = widen(k, st, w, true, &wv);
    if (r == FG_OK) r = widen(k, st, dx, !p->overwrite, &xv);
    int64_t Cg = g.C / g.G, Og = g.O / g.G, CK = Cg * g.KH * g.KW, P = g.OH * g.OW;
    int64_t nb = chunk_images(&g);
    float *t = NULL, *col = r == FG_OK ? conv_scratch(k, dx->dev, &g, nb, &t) : NULL;
    if (r == FG_OK && !col) r = fg_last_status();
    for (int64_t n0 = 0; r == FG_OK && n0 < g.N; n0 += nb) {
        int64_t m = g.N - n0 < nb ? g.N - n0 : nb, L = m * P;
        r = launched(k, fg__cu_conv_dyt(st, gv.p, t, n0, m, g.O, P));
        /* per group: col_g (CK, L) = w_g^T (CK, Og) t_g (Og, L) */
        if (r == FG_OK)
            r = fg__cuda_gemm(st, fg__cuda_index(dx->dev), FG_CU_F32, FG_CU_F32, true, false, CK, L,
                              Og, wv.p, CK, Og * CK, t, L, Og * L, col, L, CK * L, g.G, 1.0f, 0.0f,
                              FG_CU_EPI_NONE, NULL, 0);
        if (r == FG_OK) r = launched(k, fg__cu_col2im(st, col, xv.p, &g, n0, m, p->overwrite));
    }
    r = freed(dx->dev, col, r);
    r = settle(k, st, &xv, true, r);
    r = settle(k, st, &wv, false, r);
    return settle(k, st, &gv, false, r);
}

/* db += the sum of dy (N, O, P) over N and P, per channel */
static FG_MUST_USE fg_status bias_sums(const char *k, void *st, const float *dy, float *db,
                                       fg_dev *d, int64_t N, int64_t O, int64_t P) {
    double *s = fg_dev_alloc(d, sizeof(double) * (size_t)(O ? O : 1), NULL);
    if (!s) return fg_error_wrap(fg_last_status(), "%s: scratch", k);
    fg_status r = launched(k, fg__cu_chan_sums(st, 0, dy, NULL, NULL, s, NULL, N, O, P));
    if (r == FG_OK) r = launched(k, fg__cu_add_d(st, db, s, O));
    return freed(d, s, r);
}

fg_status fg__cu_conv2d_bwd_weight(const fg_tensor *x, const fg_tensor *dy, const fg_conv_params *p,
                                   fg_tensor *dw, fg_tensor *db) {
    const char *k = "conv2d_bwd_weight";
    if (!dw && !db) return FG_OK;
    fg__cu_conv g;
    if (dw) FG_TRY(conv_weight_geo(k, x, dw, dy, p, &g));
    else /* the bias alone: a 1 x 1 weight for the checks */
        FG_TRY(conv_geo(k, x, dy->ndim == 4 ? dy->shape[1] : 0,
                        x->ndim == 4 && p->groups > 0 ? x->shape[1] / p->groups : 0, 1, 1, dy, p,
                        &g));
    if (db && (db->numel != g.O || db->dtype != x->dtype || !fg_tensor_is_contiguous(db) ||
               db->dev != x->dev))
        return fg_error(FG_EINVAL, "%s: the bias gradient needs %lld elements of %s", k,
                        (long long)g.O, fg_dtype_name(x->dtype));
    if (dy->numel == 0) return FG_OK;
    void *st;
    FG_TRY(stream_of(k, dy, &st));
    f32v xv = {0}, gv, wv = {0}, bv = {0};
    fg_status r = widen(k, st, dy, true, &gv);
    if (r == FG_OK && dw) r = widen(k, st, x, true, &xv);
    if (r == FG_OK) r = widen(k, st, dw, true, &wv);
    if (r == FG_OK) r = widen(k, st, db, true, &bv);
    int64_t Cg = g.C / g.G, Og = g.O / g.G, CK = Cg * g.KH * g.KW, P = g.OH * g.OW;
    if (r == FG_OK && db) r = bias_sums(k, st, gv.p, bv.p, dy->dev, g.N, g.O, P);
    int64_t nb = chunk_images(&g);
    float *t = NULL, *col = r == FG_OK && dw ? conv_scratch(k, dy->dev, &g, nb, &t) : NULL;
    if (r == FG_OK && dw && !col) r = fg_last_status();
    for (int64_t n0 = 0; r == FG_OK && dw && n0 < g.N; n0 += nb) {
        int64_t m = g.N - n0 < nb ? g.N - n0 : nb, L = m * P;
        r = launched(k, fg__cu_im2col(st, xv.p, col, &g, n0, m));
        if (r == FG_OK) r = launched(k, fg__cu_conv_dyt(st, gv.p, t, n0, m, g.O, P));
        /* per group: dw_g (Og, CK) += t_g (Og, L) col_g^T (L, CK) */
        if (r == FG_OK)
            r = fg__cuda_gemm(st, fg__cuda_index(dy->dev), FG_CU_F32, FG_CU_F32, false, true, Og,
                              CK, L, t, L, Og * L, col, L, CK * L, wv.p, CK, Og * CK, g.G, 1.0f,
                              1.0f, FG_CU_EPI_NONE, NULL, 0);
    }
    r = freed(dy->dev, col, r);
    r = settle(k, st, &bv, true, r);
    r = settle(k, st, &wv, true, r);
    r = settle(k, st, &xv, false, r);
    return settle(k, st, &gv, false, r);
}

/* ---------------------------------------------------------------- pooling */

static FG_MUST_USE fg_status pool_geo(const char *k, const fg_tensor *x, const fg_tensor *y,
                                      const fg_pool_params *p, fg__cu_pool *q) {
    char a[96], b[96];
    bool ok = x->ndim == 4 && y->ndim == 4 && x->dtype == y->dtype && x->shape[0] == y->shape[0] &&
              x->shape[1] == y->shape[1] && fg_tensor_is_contiguous(x) &&
              fg_tensor_is_contiguous(y) && x->dev == y->dev;
    if (ok && p->kind != FG_POOL_ADAPTIVE_AVG)
        for (int i = 0; i < 2; i++)
            ok = ok && p->kernel[i] > 0 && p->stride[i] > 0 && p->dilation[i] > 0 && p->pad[i] >= 0;
    if (ok && p->kind == FG_POOL_ADAPTIVE_AVG) ok = y->shape[2] > 0 && y->shape[3] > 0;
    if (!ok)
        return fg_error(FG_EINVAL, "%s: input %s and output %s do not make a pooling", k,
                        fg_tensor_describe(x, a, sizeof a), fg_tensor_describe(y, b, sizeof b));
    *q = (fg__cu_pool){.kind = p->kind == FG_POOL_MAX   ? FG_CU_POOL_MAX
                               : p->kind == FG_POOL_AVG ? FG_CU_POOL_AVG
                                                        : FG_CU_POOL_ADAPTIVE_AVG,
                       .count_include_pad = p->count_include_pad,
                       .NC = x->shape[0] * x->shape[1],
                       .H = x->shape[2],
                       .W = x->shape[3],
                       .OH = y->shape[2],
                       .OW = y->shape[3],
                       .kh = p->kernel[0],
                       .kw = p->kernel[1],
                       .sh = p->stride[0],
                       .sw = p->stride[1],
                       .ph = p->pad[0],
                       .pw = p->pad[1],
                       .dh = p->dilation[0],
                       .dw = p->dilation[1]};
    return FG_OK;
}

fg_status fg__cu_pool2d_fwd(const fg_tensor *x, const fg_pool_params *p, fg_tensor *y,
                            fg_tensor *idx) {
    const char *k = "pool2d_fwd";
    fg__cu_pool q;
    FG_TRY(pool_geo(k, x, y, p, &q));
    bool mx = p->kind == FG_POOL_MAX;
    if (mx && idx &&
        (idx->dtype != FG_I32 || idx->numel != y->numel || !fg_tensor_is_contiguous(idx) ||
         idx->dev != y->dev))
        return fg_error(FG_EINVAL, "%s: indices need the output's size, i32, on its device", k);
    if (y->numel == 0) return FG_OK;
    void *st;
    FG_TRY(stream_of(k, y, &st));
    f32v xv, yv;
    fg_status r = widen(k, st, x, true, &xv);
    if (r == FG_OK) r = widen(k, st, y, false, &yv);
    if (r == FG_OK)
        r = launched(k, fg__cu_pool_fwd(st, xv.p, yv.p, mx && idx ? idx->data : NULL, &q));
    r = settle(k, st, &yv, true, r);
    return settle(k, st, &xv, false, r);
}

fg_status fg__cu_pool2d_bwd(const fg_tensor *dy, const fg_tensor *idx, const fg_pool_params *p,
                            fg_tensor *dx) {
    const char *k = "pool2d_bwd";
    fg__cu_pool q;
    FG_TRY(pool_geo(k, dx, dy, p, &q));
    bool mx = p->kind == FG_POOL_MAX;
    if (mx && (!idx || idx->dtype != FG_I32 || idx->numel != dy->numel ||
               !fg_tensor_is_contiguous(idx) || idx->dev != dy->dev))
        return fg_error(FG_EINVAL, "%s: max pooling needs its i32 indices on the device", k);
    if (dy->numel == 0) return FG_OK;
    void *st;
    FG_TRY(stream_of(k, dx, &st));
    f32v gv, xv;
    fg_status r = widen(k, st, dy, true, &gv);
    if (r == FG_OK) r = widen(k, st, dx, true, &xv);
    if (r == FG_OK) r = launched(k, fg__cu_pool_bwd(st, gv.p, mx ? idx->data : NULL, xv.p, &q));
    r = settle(k, st, &xv, true, r);
    return settle(k, st, &gv, false, r);
}

/* ------------------------------------------------------------ batch norm */

/* x (N, C, ...) f32 contiguous, y like it (when given): N, C and S */
static FG_MUST_USE fg_status bn_check(const char *k, const fg_tensor *x, const fg_tensor *y,
                                      int64_t *N, int64_t *C, int64_t *S) {
    char a[96], b[96];
    if (x->dtype != FG_F32)
        return fg_error(FG_EUNSUPPORTED, "%s: dtype %s: f32 only on cuda", k,
                        fg_dtype_name(x->dtype));
    if (x->ndim < 2 || !fg_tensor_is_contiguous(x) ||
        (y && (!fg_tensor_same_shape(x, y) || y->dtype != x->dtype || !fg_tensor_is_contiguous(y) ||
               y->dev != x->dev)))
        return fg_error(FG_EINVAL, "%s: %s and %s: expected contiguous (N, C, ...) of one shape", k,
                        fg_tensor_describe(x, a, sizeof a),
                        y ? fg_tensor_describe(y, b, sizeof b) : "-");
    *N = x->shape[0];
    *C = x->shape[1];
    *S = *N > 0 && *C > 0 ? x->numel / (*N * *C) : 0;
    return FG_OK;
}

static FG_MUST_USE fg_status chan_vec(const char *k, const fg_tensor *t, int64_t C) {
    if (t && (t->dtype != FG_F32 || t->numel != C || !fg_tensor_is_contiguous(t)))
        return fg_error(FG_EINVAL, "%s: a per-channel tensor needs %lld f32 elements", k,
                        (long long)C);
    return FG_OK;
}

fg_status fg__cu_batch_norm_stats(const fg_tensor *x, double *mean, double *var) {
    const char *k = "batch_norm_stats";
    int64_t N, C, S;
    FG_TRY(bn_check(k, x, NULL, &N, &C, &S));
    if (C == 0) return FG_OK;
    void *st;
    FG_TRY(stream_of(k, x, &st));
    double *d = fg_dev_alloc(x->dev, sizeof(double) * (size_t)(2 * C), NULL);
    if (!d) return fg_error_wrap(fg_last_status(), "%s: scratch", k);
    double n = (double)(N * S);
    fg_status r = launched(k, fg__cu_chan_sums(st, 0, x->data, NULL, NULL, d, NULL, N, C, S));
    if (r == FG_OK) r = fg_dev_copy_d2h(x->dev, mean, d, sizeof(double) * (size_t)C);
    for (int64_t c = 0; r == FG_OK && c < C; c++) mean[c] /= n;
    if (r == FG_OK) r = fg_dev_copy_h2d(x->dev, d, mean, sizeof(double) * (size_t)C);
    if (r == FG_OK)
        r = launched(k, fg__cu_chan_sums(st, 1, x->data, NULL, d, d + C, NULL, N, C, S));
    if (r == FG_OK) r = fg_dev_copy_d2h(x->dev, var, d + C, sizeof(double) * (size_t)C);
    for (int64_t c = 0; r == FG_OK && c < C; c++) var[c] /= n;
    return freed(x->dev, d, r);
}

/* mean and invstd (host arrays of C) into a device array of 2C (+ room) */
static double *stats_to_device(const char *k, fg_dev *dev, const double *mean, const double *invstd,
                               int64_t C, int64_t room) {
    double *d = fg_dev_alloc(dev, sizeof(double) * (size_t)(2 * C + room), NULL);
    if (!d) {
        fg_error_wrap(fg_last_status(), "%s: scratch", k);
        return NULL;
    }
    if (fg_dev_copy_h2d(dev, d, mean, sizeof(double) * (size_t)C) ||
        fg_dev_copy_h2d(dev, d + C, invstd, sizeof(double) * (size_t)C)) {
        fg_status s = fg_last_status(), f = fg_dev_free(dev, d); /* the copy's error first */
        fg_error_wrap(s != FG_OK ? s : f, "%s: the statistics", k);
        return NULL;
    }
    return d;
}

fg_status fg__cu_batch_norm_fwd(const fg_tensor *x, const double *mean, const double *invstd,
                                const fg_tensor *w, const fg_tensor *b, fg_tensor *y) {
    const char *k = "batch_norm_fwd";
    int64_t N, C, S;
    FG_TRY(bn_check(k, x, y, &N, &C, &S));
    FG_TRY(chan_vec(k, w, C));
    FG_TRY(chan_vec(k, b, C));
    if (x->numel == 0) return FG_OK;
    void *st;
    FG_TRY(stream_of(k, y, &st));
    double *d = stats_to_device(k, x->dev, mean, invstd, C, 0);
    if (!d) return fg_last_status();
    fg_status r = launched(k, fg__cu_bn_fwd(st, x->data, d, d + C, w ? w->data : NULL,
                                            b ? b->data : NULL, y->data, N, C, S));
    return freed(x->dev, d, r);
}

fg_status fg__cu_batch_norm_bwd(const fg_tensor *x, const fg_tensor *dy, const double *mean,
                                const double *invstd, const fg_tensor *w, fg_tensor *dx,
                                fg_tensor *dw, fg_tensor *db, bool dx_overwrite) {
    const char *k = "batch_norm_bwd";
    int64_t N, C, S;
    FG_TRY(bn_check(k, x, dy, &N, &C, &S));
    if (dx) FG_TRY(bn_check(k, x, dx, &N, &C, &S));
    FG_TRY(chan_vec(k, w, C));
    FG_TRY(chan_vec(k, dw, C));
    FG_TRY(chan_vec(k, db, C));
    if (C == 0) return FG_OK;
    void *st;
    FG_TRY(stream_of(k, dy, &st));
    double *d = stats_to_device(k, x->dev, mean, invstd, C, 2 * C);
    if (!d) return fg_last_status();
    double *sg = d + 2 * C, *sgx = d + 3 * C;
    fg_status r = launched(k, fg__cu_chan_sums(st, 2, x->data, dy->data, d, sg, sgx, N, C, S));
    if (r == FG_OK)
        r = launched(k, fg__cu_bn_bwd(st, x->data, dy->data, d, d + C, w ? w->data : NULL, sg, sgx,
                                      dx ? dx->data : NULL, dw ? dw->data : NULL,
                                      db ? db->data : NULL, N, C, S, dx_overwrite));
    return freed(x->dev, d, r);
}
