/* k_conv.c's f32 convolutions on oneDNN's convolution primitive (oneDNN
 * 2.x C API): forward, backward data and backward weights (with the
 * bias). The primitive picks its layouts (format "any": blocked nChw16c
 * and the like on AVX-512, where its jit kernels run) and the NCHW /
 * (G)OIHW tensors are reordered in and out around it; FULGUR_CONV=
 * onednn-plain keeps the plain layouts (no reorder; oneDNN then runs
 * gemm:jit, im2col inside). Measured on a 3x3 64 -> 64 convolution of
 * (16, 64, 32, 32), one thread, best of 6 on the loaded 2-vCPU machine,
 * three alternating rounds: forward 25.8-28.9 ms picking vs 21.6-65.7 ms
 * plain, backward 100-149 vs 132-187 ms (backward weights stays on
 * gemm:jit either way: 60% of the backward). oneDNN
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
#include <stdlib.h>
#include <string.h>

static dnnl_engine_t g_engine;
static dnnl_status_t g_engine_status = dnnl_runtime_error;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void make_engine(void) { g_engine_status = dnnl_engine_create(&g_engine, dnnl_cpu, 0); }

/* the descriptors of one convolution */
typedef struct cdesc {
    dnnl_memory_desc_t x, w, b, y; /* the tensors' plain layouts */
    dnnl_memory_desc_t xa, wa, ya; /* the same with the layout left to oneDNN */
    dnnl_dims_t stride, dil, pl, pr;
    bool blocked; /* the primitive picks its layouts (any) */
} cdesc;

static void make_desc(cdesc *d, const fg_tensor *x, const fg_tensor *y, int64_t O, int64_t KH,
                      int64_t KW, const fg_conv_params *p) {
    int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t OH = y->shape[2], OW = y->shape[3], G = p->groups;
    dnnl_dims_t xd = {N, C, H, W}, yd = {N, O, OH, OW}, bd = {O};
    dnnl_memory_desc_init_by_tag(&d->x, 4, xd, dnnl_f32, dnnl_nchw);
    dnnl_memory_desc_init_by_tag(&d->y, 4, yd, dnnl_f32, dnnl_nchw);
    dnnl_memory_desc_init_by_tag(&d->b, 1, bd, dnnl_f32, dnnl_a);
    dnnl_memory_desc_init_by_tag(&d->xa, 4, xd, dnnl_f32, dnnl_format_tag_any);
    dnnl_memory_desc_init_by_tag(&d->ya, 4, yd, dnnl_f32, dnnl_format_tag_any);
    if (G == 1) {
        dnnl_dims_t wd = {O, C, KH, KW};
        dnnl_memory_desc_init_by_tag(&d->w, 4, wd, dnnl_f32, dnnl_oihw);
        dnnl_memory_desc_init_by_tag(&d->wa, 4, wd, dnnl_f32, dnnl_format_tag_any);
    } else {
        dnnl_dims_t wd = {G, O / G, C / G, KH, KW};
        dnnl_memory_desc_init_by_tag(&d->w, 5, wd, dnnl_f32, dnnl_goihw);
        dnnl_memory_desc_init_by_tag(&d->wa, 5, wd, dnnl_f32, dnnl_format_tag_any);
    }
    const char *e = getenv("FULGUR_CONV");
    d->blocked = !(e && !strcmp(e, "onednn-plain"));
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
        &cd, dnnl_forward_training, dnnl_convolution_direct, d->blocked ? &d->xa : &d->x,
        d->blocked ? &d->wa : &d->w, bias ? &d->b : NULL, d->blocked ? &d->ya : &d->y, d->stride,
        d->dil, d->pl, d->pr);
    if (s != dnnl_success) return s;
    return dnnl_primitive_desc_create(pd, &cd, NULL, g_engine, NULL);
}

/* One argument of a primitive: the plain layout and the caller's pointer,
 * the query that tells the layout the primitive chose, and whether it is
 * an output (reordered back after) or an input (reordered in before). */
typedef struct io {
    int arg;
    dnnl_query_t query;
    int index;
    const dnnl_memory_desc_t *plain;
    void *ptr;
    bool out;
} io;

static fg_status reorder(const char *kernel, const dnnl_memory_desc_t *smd, void *src,
                         const dnnl_memory_desc_t *dmd, void *dst) {
    fg_status st = FG_OK;
    dnnl_primitive_desc_t rpd = NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_stream_t stream = NULL;
    dnnl_memory_t sm = NULL, dm = NULL;
    DN(dnnl_reorder_primitive_desc_create(&rpd, smd, g_engine, dmd, g_engine, NULL), "reorder");
    DN(dnnl_memory_create(&sm, smd, g_engine, src), "memory");
    DN(dnnl_memory_create(&dm, dmd, g_engine, dst), "memory");
    DN(dnnl_primitive_create(&prim, rpd), "reorder primitive");
    DN(dnnl_stream_create(&stream, g_engine, dnnl_stream_default_flags), "stream");
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, sm}, {DNNL_ARG_TO, dm}};
    DN(dnnl_primitive_execute(prim, stream, 2, args), "reorder");
    DN(dnnl_stream_wait(stream), "stream wait");
out:
    dnnl_stream_destroy(stream);
    dnnl_primitive_destroy(prim);
    dnnl_memory_destroy(sm);
    dnnl_memory_destroy(dm);
    dnnl_primitive_desc_destroy(rpd);
    return st;
}

/* Runs pd on n arguments, each in the layout pd chose: an argument whose
 * layout differs from its plain one goes through a buffer of that layout
 * (inputs reordered into it first, outputs out of it after). */
static fg_status run(const char *kernel, dnnl_primitive_desc_t pd, int n, const io *a) {
    fg_status st = FG_OK;
    dnnl_primitive_t prim = NULL;
    dnnl_stream_t stream = NULL;
    dnnl_memory_t mem[6] = {NULL};
    void *buf[6] = {NULL};
    const dnnl_memory_desc_t *md[6];
    dnnl_exec_arg_t args[6];
    for (int i = 0; i < n; i++) {
        md[i] = dnnl_primitive_desc_query_md(pd, a[i].query, a[i].index);
        if (!md[i]) md[i] = a[i].plain;
        void *p = a[i].ptr;
        if (!dnnl_memory_desc_equal(md[i], a[i].plain)) {
            size_t bytes = dnnl_memory_desc_get_size(md[i]);
            if (!(buf[i] = fg_alloc(bytes ? bytes : 1))) {
                st = fg_error(FG_ENOMEM, "%s: %zu bytes for oneDNN's layout", kernel, bytes);
                goto out;
            }
            if (!a[i].out && (st = reorder(kernel, a[i].plain, a[i].ptr, md[i], buf[i]))) goto out;
            p = buf[i];
        }
        DN(dnnl_memory_create(&mem[i], md[i], g_engine, p), "memory");
        args[i] = (dnnl_exec_arg_t){a[i].arg, mem[i]};
    }
    DN(dnnl_primitive_create(&prim, pd), "primitive");
    DN(dnnl_stream_create(&stream, g_engine, dnnl_stream_default_flags), "stream");
    DN(dnnl_primitive_execute(prim, stream, n, args), "execute");
    DN(dnnl_stream_wait(stream), "stream wait");
    for (int i = 0; i < n && !st; i++)
        if (a[i].out && buf[i]) st = reorder(kernel, md[i], buf[i], a[i].plain, a[i].ptr);
out:
    dnnl_stream_destroy(stream);
    dnnl_primitive_destroy(prim);
    for (int i = 0; i < n; i++) {
        dnnl_memory_destroy(mem[i]);
        fg_free(buf[i]);
    }
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
        io a[4] = {{DNNL_ARG_SRC, dnnl_query_src_md, 0, &d.x, x->data, false},
                   {DNNL_ARG_WEIGHTS, dnnl_query_weights_md, 0, &d.w, w->data, false},
                   {DNNL_ARG_DST, dnnl_query_dst_md, 0, &d.y, y->data, true},
                   {DNNL_ARG_BIAS, dnnl_query_weights_md, 1, &d.b, b ? b->data : NULL, false}};
        st = run(kernel, pd, b ? 4 : 3, a);
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
    DN(dnnl_dilated_convolution_backward_data_desc_init(
           &cd, dnnl_convolution_direct, d.blocked ? &d.xa : &d.x, d.blocked ? &d.wa : &d.w,
           d.blocked ? &d.ya : &d.y, d.stride, d.dil, d.pl, d.pr),
       "backward data descriptor");
    DN(dnnl_primitive_desc_create(&pd, &cd, NULL, g_engine, hint), "backward data primitive");
    if (!(tmp = fg_alloc(sizeof(float) * (size_t)(dx->numel ? dx->numel : 1)))) {
        st = FG_ENOMEM;
        goto out;
    }
    {
        io a[3] = {{DNNL_ARG_DIFF_DST, dnnl_query_diff_dst_md, 0, &d.y, dy->data, false},
                   {DNNL_ARG_WEIGHTS, dnnl_query_weights_md, 0, &d.w, w->data, false},
                   {DNNL_ARG_DIFF_SRC, dnnl_query_diff_src_md, 0, &d.x, tmp, true}};
        st = run(kernel, pd, 3, a);
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
        io a[4] = {
            {DNNL_ARG_SRC, dnnl_query_src_md, 0, &d.x, x->data, false},
            {DNNL_ARG_DIFF_DST, dnnl_query_diff_dst_md, 0, &d.y, dy->data, false},
            {DNNL_ARG_DIFF_WEIGHTS, dnnl_query_diff_weights_md, 0, &d.w, tmp, true},
            {DNNL_ARG_DIFF_BIAS, dnnl_query_diff_weights_md, 1, &d.b, tmp + dw->numel, true}};
        st = run(kernel, pd, db ? 4 : 3, a);
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
