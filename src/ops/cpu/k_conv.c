/* 2-d convolution, NCHW, with strides, padding, dilation and groups:
 * forward, the gradient of the input (accumulated) and those of the
 * weight and bias (accumulated). f32 goes to oneDNN's convolution
 * primitive (k_conv_dnnl.c) where it is built in and implements the shape,
 * unless FULGUR_CONV=direct; f64, and f32 otherwise, run the direct loops
 * below, the reference the oneDNN path is tested against. The loops
 * accumulate each output in double; the input gradient is computed per
 * input plane and the weight gradient per output channel, so threads never
 * write the same element. */
#include <stdlib.h>
#include <string.h>

#include "k_ops.h"

typedef struct geo {
    int64_t N, C, H, W, O, KH, KW, OH, OW, G, Cg, Og;
    int64_t sh, sw, ph, pw, dh, dw;
} geo;

static fg_status check(const char *kernel, const fg_tensor *x, const fg_tensor *w,
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
    return !(e && !strcmp(e, "direct"));
}

const char *fg__cpu_conv_path(void) {
    const char *e = getenv("FULGUR_CONV");
#ifdef FULGUR_HAVE_DNNL
    return e && !strcmp(e, "direct") ? "direct" : "onednn";
#else
    (void)e;
    return "direct";
#endif
}

fg_status fg__cpu_conv2d_fwd(const fg_tensor *x, const fg_tensor *w, const fg_tensor *b,
                             const fg_conv_params *p, fg_tensor *y) {
    geo g;
    FG_TRY(check("conv2d_fwd", x, w, y, p, &g));
    if (b && (b->numel != g.O || b->dtype != x->dtype || !fg_tensor_is_contiguous(b)))
        return fg_error(FG_EINVAL, "conv2d_fwd: the bias needs %lld elements", (long long)g.O);
    if (use_dnnl(x)) {
        fg_status s = fg__dnnl_conv2d_fwd(x, w, b, p, y);
        if (s != FG_EUNSUPPORTED) return s;
    }
    FG_FLOAT_DISPATCH("conv2d_fwd", x->dtype, {
        const T *px = x->data, *pw = w->data, *pb = b ? b->data : NULL;
        T *py = y->data;
        FG_PRAGMA(omp parallel for schedule(static) if (y->numel * g.Cg * g.KH * g.KW > FG_PAR_MIN))
        for (int64_t no = 0; no < g.N * g.O; no++) {
            int64_t n = no / g.O, o = no % g.O, gi = o / g.Og;
            const T *wo = pw + o * g.Cg * g.KH * g.KW;
            for (int64_t oh = 0; oh < g.OH; oh++)
                for (int64_t ow = 0; ow < g.OW; ow++) {
                    double acc = pb ? (double)pb[o] : 0.0;
                    for (int64_t c = 0; c < g.Cg; c++) {
                        const T *xc = px + (n * g.C + gi * g.Cg + c) * g.H * g.W;
                        const T *wc = wo + c * g.KH * g.KW;
                        for (int64_t kh = 0; kh < g.KH; kh++) {
                            int64_t ih = oh * g.sh - g.ph + kh * g.dh;
                            if (ih < 0 || ih >= g.H) continue;
                            for (int64_t kw = 0; kw < g.KW; kw++) {
                                int64_t iw = ow * g.sw - g.pw + kw * g.dw;
                                if (iw < 0 || iw >= g.W) continue;
                                acc += (double)xc[ih * g.W + iw] * (double)wc[kh * g.KW + kw];
                            }
                        }
                    }
                    py[(no * g.OH + oh) * g.OW + ow] = (T)acc;
                }
        }
    });
    return FG_OK;
}

fg_status fg__cpu_conv2d_bwd_data(const fg_tensor *dy, const fg_tensor *w, const fg_conv_params *p,
                                  fg_tensor *dx) {
    geo g;
    FG_TRY(check("conv2d_bwd_data", dx, w, dy, p, &g));
    if (use_dnnl(dx)) {
        fg_status s = fg__dnnl_conv2d_bwd_data(dy, w, p, dx);
        if (s != FG_EUNSUPPORTED) return s;
    }
    FG_FLOAT_DISPATCH("conv2d_bwd_data", dx->dtype, {
        const T *pg = dy->data, *pw = w->data;
        T *pd = dx->data;
        FG_PRAGMA(omp parallel for schedule(static) if (dy->numel * g.Cg * g.KH * g.KW > FG_PAR_MIN))
        for (int64_t nc = 0; nc < g.N * g.C; nc++) {
            int64_t n = nc / g.C, ci = nc % g.C, gi = ci / g.Cg, c = ci % g.Cg;
            T *d = pd + nc * g.H * g.W;
            for (int64_t oo = 0; oo < g.Og; oo++) {
                int64_t o = gi * g.Og + oo;
                const T *go = pg + (n * g.O + o) * g.OH * g.OW;
                const T *wc = pw + (o * g.Cg + c) * g.KH * g.KW;
                for (int64_t kh = 0; kh < g.KH; kh++)
                    for (int64_t kw = 0; kw < g.KW; kw++) {
                        T wv = wc[kh * g.KW + kw];
                        for (int64_t oh = 0; oh < g.OH; oh++) {
                            int64_t ih = oh * g.sh - g.ph + kh * g.dh;
                            if (ih < 0 || ih >= g.H) continue;
                            for (int64_t ow = 0; ow < g.OW; ow++) {
                                int64_t iw = ow * g.sw - g.pw + kw * g.dw;
                                if (iw >= 0 && iw < g.W)
                                    d[ih * g.W + iw] += go[oh * g.OW + ow] * wv;
                            }
                        }
                    }
            }
        }
    });
    return FG_OK;
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
    if (db && (db->numel != g.O || db->dtype != x->dtype || !fg_tensor_is_contiguous(db)))
        return fg_error(FG_EINVAL, "conv2d_bwd_weight: the bias gradient needs %lld elements",
                        (long long)g.O);
    if (use_dnnl(x) && dw) {
        fg_status s = fg__dnnl_conv2d_bwd_weight(x, dy, p, dw, db);
        if (s != FG_EUNSUPPORTED) return s;
    }
    FG_FLOAT_DISPATCH("conv2d_bwd_weight", x->dtype, {
        const T *px = x->data, *pg = dy->data;
        T *pdw = dw ? dw->data : NULL, *pdb = db ? db->data : NULL;
        FG_PRAGMA(omp parallel for schedule(static) if (dy->numel * g.Cg * g.KH * g.KW > FG_PAR_MIN))
        for (int64_t o = 0; o < g.O; o++) {
            int64_t gi = o / g.Og;
            if (pdb) {
                double s = 0;
                for (int64_t n = 0; n < g.N; n++)
                    for (int64_t k = 0; k < g.OH * g.OW; k++)
                        s += (double)pg[(n * g.O + o) * g.OH * g.OW + k];
                pdb[o] += (T)s;
            }
            if (!pdw) continue;
            for (int64_t c = 0; c < g.Cg; c++)
                for (int64_t kh = 0; kh < g.KH; kh++)
                    for (int64_t kw = 0; kw < g.KW; kw++) {
                        double s = 0;
                        for (int64_t n = 0; n < g.N; n++) {
                            const T *go = pg + (n * g.O + o) * g.OH * g.OW;
                            const T *xc = px + (n * g.C + gi * g.Cg + c) * g.H * g.W;
                            for (int64_t oh = 0; oh < g.OH; oh++) {
                                int64_t ih = oh * g.sh - g.ph + kh * g.dh;
                                if (ih < 0 || ih >= g.H) continue;
                                for (int64_t ow = 0; ow < g.OW; ow++) {
                                    int64_t iw = ow * g.sw - g.pw + kw * g.dw;
                                    if (iw >= 0 && iw < g.W)
                                        s += (double)go[oh * g.OW + ow] * (double)xc[ih * g.W + iw];
                                }
                            }
                        }
                        pdw[((o * g.Cg + c) * g.KH + kh) * g.KW + kw] += (T)s;
                    }
        }
    });
    return FG_OK;
}
