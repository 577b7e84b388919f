/* k_conv.c's f32 convolutions on oneDNN's convolution primitive (oneDNN
 * 2.x C API), NCHW / (G)OIHW plain layouts so that nothing is reordered:
 * forward, backward data and backward weights (with the bias). oneDNN
 * writes its outputs, the table's backward entries accumulate: the
 * gradients land in a scratch buffer first and are added. A shape oneDNN
 * does not implement (or a build without oneDNN) is FG_EUNSUPPORTED, and
 * k_conv.c runs its im2col path. The engine is made once per process, a
 * stream per call; primitives are found again in oneDNN's primitive
 * cache. */
#include "k_ops.h"

#ifndef FULGUR_HAVE_DNNL

fg_status fg__dnnl_conv2d_fwd(const fg_tensor *x, const fg_tensor *w, const fg_tensor *b,
                              const fg_conv_params *p, fg_tensor *y) {
    (void)x, (void)w, (void)b, (void)p, (void)y;
    return FG_EUNSUPPORTED;
}
fg_status fg__dnnl_conv2d_bwd_data(const fg_tensor *dy, const fg_tensor *w, const fg_conv_params *p,
                                   fg_tensor *dx) {
    (void)dy, (void)w, (void)p, (void)dx;
    return FG_EUNSUPPORTED;
}
fg_status fg__dnnl_conv2d_bwd_weight(const fg_tensor *x, const fg_tensor *dy,
                                     const fg_conv_params *p, fg_tensor *dw, fg_tensor *db) {
    (void)x, (void)dy, (void)p, (void)dw, (void)db;
    return FG_EUNSUPPORTED;
}

#else

#include <dnnl.h>
#include <pthread.h>

static dnnl_engine_t g_engine;
static dnnl_status_t g_engine_status = dnnl_runtime_error;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void make_engine(void) { g_engine_status = dnnl_engine_create(&g_engine, dnnl_cpu, 0); }

/* the descriptors of one convolution */
typedef struct cdesc {
    dnnl_memory_desc_t x, w, b, y;
    dnnl_dims_t stride, dil, pl, pr;
} cdesc;

static void make_desc(cdesc *d, const fg_tensor *x, const fg_tensor *y, int64_t O, int64_t KH,
                      int64_t KW, const fg_conv_params *p) {
    int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t OH = y->shape[2], OW = y->shape[3], G = p->groups;
    dnnl_dims_t xd = {N, C, H, W}, yd = {N, O, OH, OW}, bd = {O};
    dnnl_memory_desc_init_by_tag(&d->x, 4, xd, dnnl_f32, dnnl_nchw);
    dnnl_memory_desc_init_by_tag(&d->y, 4, yd, dnnl_f32, dnnl_nchw);
    dnnl_memory_desc_init_by_tag(&d->b, 1, bd, dnnl_f32, dnnl_a);
    if (G == 1) {
        dnnl_dims_t wd = {O, C, KH, KW};
        dnnl_memory_desc_init_by_tag(&d->w, 4, wd, dnnl_f32, dnnl_oihw);
    } else {
        dnnl_dims_t wd = {G, O / G, C / G, KH, KW};
        dnnl_memory_desc_init_by_tag(&d->w, 5, wd, dnnl_f32, dnnl_goihw);
    }
    int64_t in[2] = {H, W}, out[2] = {OH, OW}, k[2] = {KH, KW};
    for (int i = 0; i < 2; i++) {
        int64_t range = (k[i] - 1) * p->dilation[i] + 1;
        int64_t pr = (out[i] - 1) * p->stride[i] + range - in[i] - p->pad[i];
        d->stride[i] = p->stride[i];
        d->dil[i] = p->dilation[i] - 1; /* oneDNN counts the gaps */
        d->pl[i] = p->pad[i];
        d->pr[i] = pr > 0 ? pr : 0;
    }
}

static fg_status fail(const char *kernel, dnnl_status_t s, const char *what) {
    if (s == dnnl_unimplemented || s == dnnl_invalid_arguments) return FG_EUNSUPPORTED;
    return fg_error(FG_EINTERNAL, "%s: oneDNN %s failed (status %d)", kernel, what, (int)s);
}

#define DN(call, what)                                                                             \
    do {                                                                                           \
        dnnl_status_t dn_s_ = (call);                                                              \
        if (dn_s_ != dnnl_success) {                                                               \
            st = fail(kernel, dn_s_, what);                                                        \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/* the forward primitive descriptor (also the hint of the backward ones) */
static dnnl_status_t fwd_pd(dnnl_primitive_desc_t *pd, const cdesc *d, bool bias) {
    dnnl_convolution_desc_t cd;
    dnnl_status_t s = dnnl_dilated_convolution_forward_desc_init(
        &cd, dnnl_forward_training, dnnl_convolution_direct, &d->x, &d->w, bias ? &d->b : NULL,
        &d->y, d->stride, d->dil, d->pl, d->pr);
    if (s != dnnl_success) return s;
    return dnnl_primitive_desc_create(pd, &cd, NULL, g_engine, NULL);
}

/* Runs pd with n (arg, descriptor, pointer) triples. */
static fg_status run(const char *kernel, dnnl_primitive_desc_t pd, int n, const int *arg,
                     const dnnl_memory_desc_t *const *md, void *const *ptr) {
    fg_status st = FG_OK;
    dnnl_primitive_t prim = NULL;
    dnnl_stream_t stream = NULL;
    dnnl_memory_t mem[6] = {NULL};
    dnnl_exec_arg_t args[6];
    for (int i = 0; i < n; i++) {
        DN(dnnl_memory_create(&mem[i], md[i], g_engine, ptr[i]), "memory");
        args[i] = (dnnl_exec_arg_t){arg[i], mem[i]};
    }
    DN(dnnl_primitive_create(&prim, pd), "primitive");
    DN(dnnl_stream_create(&stream, g_engine, dnnl_stream_default_flags), "stream");
    DN(dnnl_primitive_execute(prim, stream, n, args), "execute");
    DN(dnnl_stream_wait(stream), "stream wait");
out:
    dnnl_stream_destroy(stream);
    dnnl_primitive_destroy(prim);
    for (int i = 0; i < n; i++) dnnl_memory_destroy(mem[i]);
    return st;
}

static fg_status ready(void) {
    pthread_once(&g_once, make_engine);
    return g_engine_status == dnnl_success ? FG_OK : FG_EUNSUPPORTED;
}

static void add_into(float *dst, const float *src, int64_t n) {
    FG_PRAGMA(omp parallel for simd if (parallel: n > FG_PAR_MIN) schedule(static))
    for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}

fg_status fg__dnnl_conv2d_fwd(const fg_tensor *x, const fg_tensor *w, const fg_tensor *b,
                              const fg_conv_params *p, fg_tensor *y) {
    const char *kernel = "conv2d_fwd";
    FG_TRY(ready());
    fg_status st = FG_OK;
    cdesc d;
    make_desc(&d, x, y, w->shape[0], w->shape[2], w->shape[3], p);
    dnnl_primitive_desc_t pd = NULL;
    DN(fwd_pd(&pd, &d, b != NULL), "convolution descriptor");
    {
        int arg[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS};
        const dnnl_memory_desc_t *md[4] = {&d.x, &d.w, &d.y, &d.b};
        void *ptr[4] = {x->data, w->data, y->data, b ? b->data : NULL};
        st = run(kernel, pd, b ? 4 : 3, arg, md, ptr);
    }
out:
    dnnl_primitive_desc_destroy(pd);
    return st;
}

fg_status fg__dnnl_conv2d_bwd_data(const fg_tensor *dy, const fg_tensor *w, const fg_conv_params *p,
                                   fg_tensor *dx) {
    const char *kernel = "conv2d_bwd_data";
    FG_TRY(ready());
    fg_status st = FG_OK;
    cdesc d;
    make_desc(&d, dx, dy, w->shape[0], w->shape[2], w->shape[3], p);
    dnnl_primitive_desc_t hint = NULL, pd = NULL;
    float *tmp = NULL;
    dnnl_convolution_desc_t cd;
    DN(fwd_pd(&hint, &d, false), "convolution descriptor");
    DN(dnnl_dilated_convolution_backward_data_desc_init(&cd, dnnl_convolution_direct, &d.x, &d.w,
                                                        &d.y, d.stride, d.dil, d.pl, d.pr),
       "backward data descriptor");
    DN(dnnl_primitive_desc_create(&pd, &cd, NULL, g_engine, hint), "backward data primitive");
    if (!(tmp = fg_alloc(sizeof(float) * (size_t)(dx->numel ? dx->numel : 1)))) {
        st = FG_ENOMEM;
        goto out;
    }
    {
        int arg[3] = {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC};
        const dnnl_memory_desc_t *md[3] = {&d.y, &d.w, &d.x};
        void *ptr[3] = {dy->data, w->data, tmp};
        st = run(kernel, pd, 3, arg, md, ptr);
    }
    if (!st) add_into(dx->data, tmp, dx->numel);
out:
    fg_free(tmp);
    dnnl_primitive_desc_destroy(pd);
    dnnl_primitive_desc_destroy(hint);
    return st;
}

fg_status fg__dnnl_conv2d_bwd_weight(const fg_tensor *x, const fg_tensor *dy,
                                     const fg_conv_params *p, fg_tensor *dw, fg_tensor *db) {
    const char *kernel = "conv2d_bwd_weight";
    FG_TRY(ready());
    fg_status st = FG_OK;
    cdesc d;
    make_desc(&d, x, dy, dw->shape[0], dw->shape[2], dw->shape[3], p);
    dnnl_primitive_desc_t hint = NULL, pd = NULL;
    float *tmp = NULL;
    dnnl_convolution_desc_t cd;
    DN(fwd_pd(&hint, &d, db != NULL), "convolution descriptor");
    DN(dnnl_dilated_convolution_backward_weights_desc_init(&cd, dnnl_convolution_direct, &d.x, &d.w,
                                                           db ? &d.b : NULL, &d.y, d.stride, d.dil,
                                                           d.pl, d.pr),
       "backward weights descriptor");
    DN(dnnl_primitive_desc_create(&pd, &cd, NULL, g_engine, hint), "backward weights primitive");
    int64_t nb = db ? db->numel : 0;
    if (!(tmp = fg_alloc(sizeof(float) * (size_t)(dw->numel + nb)))) {
        st = FG_ENOMEM;
        goto out;
    }
    {
        int arg[4] = {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS, DNNL_ARG_DIFF_BIAS};
        const dnnl_memory_desc_t *md[4] = {&d.x, &d.y, &d.w, &d.b};
        void *ptr[4] = {x->data, dy->data, tmp, tmp + dw->numel};
        st = run(kernel, pd, db ? 4 : 3, arg, md, ptr);
    }
    if (!st) {
        add_into(dw->data, tmp, dw->numel);
        if (db) add_into(db->data, tmp + dw->numel, nb);
    }
out:
    fg_free(tmp);
    dnnl_primitive_desc_destroy(pd);
    dnnl_primitive_desc_destroy(hint);
    return st;
}

#endif
