/* 2-d convolution, NCHW, with strides, padding, dilation and groups:
 * forward, the gradient of the input (accumulated) and those of the
 * weight and bias (accumulated). f32 goes to oneDNN's convolution
 * primitive (k_conv_dnnl.c: its direct or Winograd algorithm, or fulgur's
 * Winograd (k_conv_wino.c) where oneDNN has none, measured per shape in
 * conv_pick.c) where it is built in and implements the shape,
 * unless FULGUR_CONV=im2col; f64, and f32 otherwise, take the path below:
 * per image and group, im2col (the (C/G KH KW, OH OW) patch matrix, or the
 * image itself for a 1 x 1 kernel of stride 1 without padding) and the
 * table's matrix product (OpenBLAS / oneDNN matmul), col2im for the input
 * gradient. The images run one after the other (the product threads). */
#include <stdlib.h>
#include <string.h>

#include "core/core_impl.h"

#include "k_ops.h"

typedef struct geo {
    int64_t N, C, H, W, O, KH, KW, OH, OW, G, Cg, Og;
    int64_t sh, sw, ph, pw, dh, dw;
} geo;

static FG_MUST_USE fg_status check(const char *kernel, const fg_tensor *x, const fg_tensor *w,
                                   const fg_tensor *y, const fg_conv_params *p, geo *g) {
    char a[96], b[96], c[96];
    bool ok = x->ndim == 4 && w->ndim == 4 && y->ndim == 4 && x->dtype == w->dtype &&
              y->dtype == x->dtype && p->groups >= 1 && fg_tensor_is_contiguous(x) &&
              fg_tensor_is_contiguous(w) && fg_tensor_is_contiguous(y);
    if (ok) {
        *g = (geo){.N = x->shape[0],
                   .C = x->shape[1],
                   .H = x->shape[2],
                   .W = x->shape[3],
                   .O = w->shape[0],
                   .KH = w->shape[2],
                   .KW = w->shape[3],
                   .OH = y->shape[2],
                   .OW = y->shape[3],
                   .G = p->groups,
                   .sh = p->stride[0],
                   .sw = p->stride[1],
                   .ph = p->pad[0],
                   .pw = p->pad[1],
                   .dh = p->dilation[0],
                   .dw = p->dilation[1]};
        g->Cg = g->C / g->G;
        g->Og = g->O / g->G;
        ok = g->C % g->G == 0 && g->O % g->G == 0 && w->shape[1] == g->Cg && y->shape[0] == g->N &&
             y->shape[1] == g->O && g->sh > 0 && g->sw > 0 && g->dh > 0 && g->dw > 0 &&
             g->ph >= 0 && g->pw >= 0;
    }
    if (!ok)
        return fg_error(FG_EINVAL,
                        "%s: input %s, weight %s, output %s do not make a convolution (contiguous "
                        "(N, C, H, W), (O, C / groups, KH, KW), (N, O, OH, OW), groups %lld)",
                        kernel, fg_tensor_describe(x, a, sizeof a),
                        fg_tensor_describe(w, b, sizeof b), fg_tensor_describe(y, c, sizeof c),
                        (long long)p->groups);
    return FG_OK;
}

static bool use_dnnl(const fg_tensor *x) {
    if (x->dtype != FG_F32) return false;
    const char *e = getenv("FULGUR_CONV");
    return !(e && !strcmp(e, "im2col"));
}

/* FULGUR_CONV=winograd: fulgur's Winograd wherever it applies */
static bool forced_wino(const fg_tensor *x, const fg_tensor *w, const fg_conv_params *p) {
    const char *e = getenv("FULGUR_CONV");
    return e && !strcmp(e, "winograd") && fg__wino_conv_fits(x, w, p);
}

const char *fg__cpu_conv_path(void) {
    const char *e = getenv("FULGUR_CONV");
#ifdef FULGUR_HAVE_DNNL
    static const char *const named[] = {"onednn-plain", "onednn-direct", "onednn-winograd",
                                        "winograd", "im2col"};
    for (int i = 0; e && i < 5; i++)
        if (!strcmp(e, named[i])) return named[i];
    return "onednn";
#else
    return e && !strcmp(e, "winograd") ? "winograd" : "im2col";
#endif
}

/* a 2-d header over raw memory */
static void view2(fg_tensor *v, fg_dtype dt, void *data, int64_t r, int64_t c) {
    memset(v, 0, sizeof *v);
    /* the kernel's own dtype and two sizes >= 0: the shape cannot be refused */
    fg__status_drop(fg__tensor_init_shape(v, dt, 2, (int64_t[]){r, c}));
    v->data = data;
    v->device = FG_CPU;
}

/* Whether the patch matrix of image plane group is the plane itself. */
static bool pointwise(const geo *g) {
    return g->KH == 1 && g->KW == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0;
}

/* col (Cg KH KW, OH OW) = the patches of xg (Cg, H, W); add: xg += col's
 * patches instead (col2im). T float or double. */
#define IM2COL(T, SUF)                                                                             \
    static void im2col_##SUF(const geo *g, T *xg, T *col, bool add) {                              \
        int64_t L = g->OH * g->OW;                                                                 \
        FG_PRAGMA(omp parallel for schedule(static) if (g->Cg * g->KH * g->KW * L > FG_PAR_MIN))   \
        for (int64_t c = 0; c < g->Cg; c++) {                                                      \
            T *xc = xg + c * g->H * g->W;                                                          \
            for (int64_t kh = 0; kh < g->KH; kh++)                                                 \
                for (int64_t kw = 0; kw < g->KW; kw++) {                                           \
                    T *row = col + ((c * g->KH + kh) * g->KW + kw) * L;                            \
                    for (int64_t oh = 0; oh < g->OH; oh++) {                                       \
                        int64_t ih = oh * g->sh - g->ph + kh * g->dh;                              \
                        T *r = row + oh * g->OW;                                                   \
                        if (ih < 0 || ih >= g->H) {                                                \
                            if (!add)                                                              \
                                for (int64_t ow = 0; ow < g->OW; ow++) r[ow] = 0;                  \
                            continue;                                                              \
                        }                                                                          \
                        for (int64_t ow = 0; ow < g->OW; ow++) {                                   \
                            int64_t iw = ow * g->sw - g->pw + kw * g->dw;                          \
                            bool in = iw >= 0 && iw < g->W;                                        \
                            if (add) {                                                             \
                                if (in) xc[ih * g->W + iw] += r[ow];                               \
                            } else {                                                               \
                                r[ow] = in ? xc[ih * g->W + iw] : (T)0;                            \
                            }                                                                      \
                        }                                                                          \
                    }                                                                              \
                }                                                                                  \
        }                                                                                          \
    }
IM2COL(float, f32)
IM2COL(double, f64)

static void im2col(const geo *g, fg_dtype dt, void *xg, void *col, bool add) {
    if (dt == FG_F32) im2col_f32(g, xg, col, add);
    else im2col_f64(g, xg, col, add);
}

/* the scratch patch matrix (NULL for pointwise convolutions) */
static FG_MUST_USE fg_status col_alloc(const geo *g, fg_dtype dt, void **col) {
    *col = NULL;
    if (pointwise(g)) return FG_OK;
    size_t bytes = fg_dtype_size(dt) * (size_t)(g->Cg * g->KH * g->KW) * (size_t)(g->OH * g->OW);
    if (!(*col = fg_alloc(bytes ? bytes : 1)))
        return fg_error(FG_ENOMEM, "conv2d: %zu bytes of patch matrix", bytes);
    return FG_OK;
}

static FG_MUST_USE fg_status check_dtype(const char *kernel, fg_dtype dt) {
    if (dt == FG_F32 || dt == FG_F64) return FG_OK;
    return fg_error(FG_EUNSUPPORTED, "%s: dtype %s not supported on cpu", kernel,
                    fg_dtype_name(dt));
}

fg_status fg__cpu_conv2d_fwd(const fg_tensor *x, const fg_tensor *w, const fg_tensor *b,
                             const fg_conv_params *p, fg_tensor *y) {
    geo g;
    FG_TRY(check("conv2d_fwd", x, w, y, p, &g));
    FG_TRY(check_dtype("conv2d_fwd", x->dtype));
    if (b && (b->numel != g.O || b->dtype != x->dtype || !fg_tensor_is_contiguous(b)))
        return fg_error(FG_EINVAL, "conv2d_fwd: the bias needs %lld elements", (long long)g.O);
    if (forced_wino(x, w, p)) return fg__wino_conv2d_fwd(x, w, b, p, y);
    if (use_dnnl(x)) {
        fg_status s = fg__dnnl_conv2d_fwd(x, w, b, p, y);
        if (s != FG_EUNSUPPORTED) return s;
    }
    size_t es = fg_dtype_size(x->dtype);
    int64_t L = g.OH * g.OW, K = g.Cg * g.KH * g.KW;
    void *col;
    FG_TRY(col_alloc(&g, x->dtype, &col));
    fg_status st = FG_OK;
    for (int64_t n = 0; n < g.N && !st; n++)
        for (int64_t gi = 0; gi < g.G && !st; gi++) {
            char *xg = (char *)x->data + es * (size_t)((n * g.C + gi * g.Cg) * g.H * g.W);
            char *yg = (char *)y->data + es * (size_t)((n * g.O + gi * g.Og) * L);
            char *wg = (char *)w->data + es * (size_t)(gi * g.Og * K);
            if (col) im2col(&g, x->dtype, xg, col, false);
            fg_tensor A, B, Cm;
            view2(&A, x->dtype, wg, g.Og, K);
            view2(&B, x->dtype, col ? col : xg, K, L);
            view2(&Cm, x->dtype, yg, g.Og, L);
            st = fg__cpu_matmul(&A, false, &B, false, &Cm, 1.0, 0.0);
        }
    fg_free(col);
    FG_TRY(st);
    if (b)
        FG_FLOAT_DISPATCH("conv2d_fwd", x->dtype, {
            const T *pb = b->data;
            T *py = y->data;
            FG_PRAGMA(omp parallel for schedule(static) if (y->numel > FG_PAR_MIN))
            for (int64_t no = 0; no < g.N * g.O; no++)
                for (int64_t k = 0; k < L; k++) py[no * L + k] += pb[no % g.O];
        });
    return FG_OK;
}

fg_status fg__cpu_conv2d_bwd_data(const fg_tensor *dy, const fg_tensor *w, const fg_conv_params *p,
                                  fg_tensor *dx) {
    geo g;
    FG_TRY(check("conv2d_bwd_data", dx, w, dy, p, &g));
    FG_TRY(check_dtype("conv2d_bwd_data", dx->dtype));
    if (forced_wino(dx, w, p)) return fg__wino_conv2d_bwd_data(dy, w, p, dx);
    if (use_dnnl(dx)) {
        fg_status s = fg__dnnl_conv2d_bwd_data(dy, w, p, dx);
        if (s != FG_EUNSUPPORTED) return s;
    }
    if (p->overwrite) memset(dx->data, 0, fg_tensor_nbytes(dx)); /* col2im adds */
    size_t es = fg_dtype_size(dx->dtype);
    int64_t L = g.OH * g.OW, K = g.Cg * g.KH * g.KW;
    void *col;
    FG_TRY(col_alloc(&g, dx->dtype, &col));
    fg_status st = FG_OK;
    for (int64_t n = 0; n < g.N && !st; n++)
        for (int64_t gi = 0; gi < g.G && !st; gi++) {
            char *dxg = (char *)dx->data + es * (size_t)((n * g.C + gi * g.Cg) * g.H * g.W);
            char *dyg = (char *)dy->data + es * (size_t)((n * g.O + gi * g.Og) * L);
            char *wg = (char *)w->data + es * (size_t)(gi * g.Og * K);
            fg_tensor A, B, Cm;
            view2(&A, dx->dtype, wg, g.Og, K);
            view2(&B, dx->dtype, dyg, g.Og, L);
            view2(&Cm, dx->dtype, col ? col : dxg, K, L);
            /* pointwise: straight into dx (beta 1); else into col, then col2im */
            st = fg__cpu_matmul(&A, true, &B, false, &Cm, 1.0, col ? 0.0 : 1.0);
            if (!st && col) im2col(&g, dx->dtype, dxg, col, true);
        }
    fg_free(col);
    return st;
}

fg_status fg__cpu_conv2d_bwd_weight(const fg_tensor *x, const fg_tensor *dy,
                                    const fg_conv_params *p, fg_tensor *dw, fg_tensor *db) {
    geo g;
    if (!dw && !db) return FG_OK;
    const fg_tensor *wref = dw;
    fg_tensor wfake;
    if (!wref) { /* the bias alone: a weight shape for the checks */
        wfake = *x;
        wfake.ndim = 4;
        wfake.shape[0] = dy->shape[1];
        wfake.shape[1] = x->shape[1] / p->groups;
        wfake.shape[2] = wfake.shape[3] = 1;
        wref = &wfake;
    }
    FG_TRY(check("conv2d_bwd_weight", x, wref, dy, p, &g));
    FG_TRY(check_dtype("conv2d_bwd_weight", x->dtype));
    if (db && (db->numel != g.O || db->dtype != x->dtype || !fg_tensor_is_contiguous(db)))
        return fg_error(FG_EINVAL, "conv2d_bwd_weight: the bias gradient needs %lld elements",
                        (long long)g.O);
    if (dw && forced_wino(x, dw, p)) return fg__wino_conv2d_bwd_weight(x, dy, p, dw, db);
    if (use_dnnl(x) && dw) {
        fg_status s = fg__dnnl_conv2d_bwd_weight(x, dy, p, dw, db);
        if (s != FG_EUNSUPPORTED) return s;
    }
    int64_t L = g.OH * g.OW, K = g.Cg * g.KH * g.KW;
    if (db)
        FG_FLOAT_DISPATCH("conv2d_bwd_weight", x->dtype, {
            const T *pg = dy->data;
            T *pdb = db->data;
            FG_PRAGMA(omp parallel for schedule(static) if (dy->numel > FG_PAR_MIN))
            for (int64_t o = 0; o < g.O; o++) {
                double s = 0;
                for (int64_t n = 0; n < g.N; n++)
                    for (int64_t k = 0; k < L; k++) s += (double)pg[(n * g.O + o) * L + k];
                pdb[o] += (T)s;
            }
        });
    if (!dw) return FG_OK;
    size_t es = fg_dtype_size(x->dtype);
    void *col;
    FG_TRY(col_alloc(&g, x->dtype, &col));
    fg_status st = FG_OK;
    for (int64_t n = 0; n < g.N && !st; n++)
        for (int64_t gi = 0; gi < g.G && !st; gi++) {
            char *xg = (char *)x->data + es * (size_t)((n * g.C + gi * g.Cg) * g.H * g.W);
            char *dyg = (char *)dy->data + es * (size_t)((n * g.O + gi * g.Og) * L);
            char *dwg = (char *)dw->data + es * (size_t)(gi * g.Og * K);
            if (col) im2col(&g, x->dtype, xg, col, false);
            fg_tensor A, B, Cm;
            view2(&A, x->dtype, dyg, g.Og, L);
            view2(&B, x->dtype, col ? col : xg, K, L);
            view2(&Cm, x->dtype, dwg, g.Og, K);
            st = fg__cpu_matmul(&A, false, &B, true, &Cm, 1.0, 1.0);
        }
    fg_free(col);
    return st;
}
