/* k_conv.c's f32 convolutions on oneDNN's convolution primitive (oneDNN
 * 2.x C API): forward, backward data and backward weights (with the
 * bias). The primitive picks its layouts (format "any": blocked nChw16c
 * and the like on AVX-512, where its jit kernels run, backward weights
 * included) and the NCHW / (G)OIHW tensors are reordered in and out
 * around it; FULGUR_CONV=onednn-plain keeps the plain layouts (no
 * reorder; oneDNN then runs gemm:jit, im2col inside). oneDNN writes its
 * outputs, the table's backward entries accumulate: a gradient in oneDNN's
 * layout is added into the caller's by its reorder (a sum post-op), one in
 * the plain layout lands in a buffer first and is added. An input gradient
 * the caller marks as holding nothing yet (fg_conv_params.overwrite: the
 * autograd's fresh buffer) is written instead: a plain reorder (oneDNN's
 * jit:blk; the one with the sum runs jit:uni at about half its speed) or
 * oneDNN writing the caller's memory itself, and no zeroing before.
 *
 * Each thread makes a shape's primitive (and its reorders) once and keeps
 * it, with the buffers of oneDNN's layouts and the scratchpad (given to
 * the primitive: scratchpad mode user), one per role (x / dx, w / dw,
 * y / dy, bias, scratchpad), grown to the largest shape and kept: a
 * training step allocates nothing here after the first. Before, each call
 * made its primitive descriptor, allocated and freed the layout buffers
 * and oneDNN its scratchpad: on the CIFAR ResNet-18 (batch 64, one
 * thread) 85k page faults a step, and backward weights on gemm:jit at 40%
 * of the convolution time. The dy a backward-data call reordered is
 * reused by the backward-weights call right after it with the same dy (a
 * convolution's backward makes the two calls in turn). A shape oneDNN
 * does not implement (or a build without oneDNN) is FG_EUNSUPPORTED, and
 * k_conv.c runs its im2col path. The engine is made once per process. */
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
int fg__dnnl_conv_winograd_made(void) { return 0; }

#else

#include <dnnl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdlib.h>
#include <string.h>

static dnnl_engine_t g_engine;
static atomic_int g_wino_made; /* primitives made on Winograd, for the tests */
static dnnl_status_t g_engine_status = dnnl_runtime_error;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void make_engine(void) { g_engine_status = dnnl_engine_create(&g_engine, dnnl_cpu, 0); }

enum { K_FWD, K_BWD_DATA, K_BWD_WEIGHT };
/* the buffer roles: an argument in oneDNN's layout goes through its
 * role's buffer (x / dx, w / dw, y / dy, the bias or its gradient, the
 * scratchpad) */
enum { R_SRC, R_WEI, R_DST, R_BIAS, R_SCRATCH, R_N };
#define NARG 4
#define KEYN 24

/* One convolution of one shape and direction, made once per thread: the
 * primitive (its scratchpad the caller's: the role buffer), the layout of
 * each argument and, where that is not the plain one, the reorders in
 * (inputs) or out (outputs; accumulating ones with a sum post-op). */
typedef struct centry {
    struct centry *next;
    int64_t key[KEYN];
    bool own; /* fulgur's Winograd (k_conv_wino.c) runs the shape: no primitive */
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t prim;
    int n;
    int arg[NARG], role[NARG];
    bool out[NARG], accum[NARG], conv[NARG];
    dnnl_memory_desc_t plain[NARG], md[NARG];
    dnnl_primitive_t reo[NARG];
    size_t bytes[NARG], scratch;
} centry;

/* The calling thread's primitives, its stream and the role buffers; and
 * which tensor the destination buffer holds in oneDNN's layout (dy, left
 * by a backward-data call for the backward-weights call that follows it
 * with the same dy, as a convolution's backward makes them: taken only
 * when the caller says so (p->dy_as_before), since a pointer alone may be
 * another convolution's dy at an address the arena gave again). */
typedef struct cstate {
    centry *head;
    dnnl_stream_t stream;
    void *buf[R_N];
    size_t cap[R_N];
    const void *dst_holds;
    dnnl_memory_desc_t dst_md;
} cstate;

static pthread_key_t g_key;
static int g_key_err = 1;

static void entry_free(centry *e) {
    for (int i = 0; i < NARG; i++) dnnl_primitive_destroy(e->reo[i]);
    dnnl_primitive_destroy(e->prim);
    dnnl_primitive_desc_destroy(e->pd);
    fg_free(e);
}

static void state_free(void *v) {
    cstate *c = v;
    for (centry *e = c->head, *n; e; e = n) {
        n = e->next;
        entry_free(e);
    }
    dnnl_stream_destroy(c->stream);
    for (int i = 0; i < R_N; i++) fg_free(c->buf[i]);
    fg_free(c);
}

static void make_engine_and_key(void) {
    make_engine();
    g_key_err = pthread_key_create(&g_key, state_free);
}

static FG_MUST_USE fg_status ready(cstate **out) {
    pthread_once(&g_once, make_engine_and_key);
    if (g_engine_status != dnnl_success || g_key_err) return FG_EUNSUPPORTED;
    cstate *c = pthread_getspecific(g_key);
    if (!c) {
        if (!(c = fg_calloc(1, sizeof *c))) return FG_ENOMEM;
        if (dnnl_stream_create(&c->stream, g_engine, dnnl_stream_default_flags) != dnnl_success) {
            fg_free(c);
            return FG_EUNSUPPORTED;
        }
        if (pthread_setspecific(g_key, c)) {
            state_free(c);
            return fg_error(FG_ENOMEM, "conv2d: cannot keep oneDNN's primitives");
        }
    }
    *out = c;
    return FG_OK;
}

/* role r's buffer of at least `bytes` (kept for the next calls) */
static void *role_buf(cstate *c, int r, size_t bytes) {
    if (c->cap[r] < bytes) {
        if (r == R_DST) c->dst_holds = NULL;
        fg_free(c->buf[r]);
        c->buf[r] = NULL;
        c->cap[r] = 0;
        if (!(c->buf[r] = fg_alloc(bytes))) return NULL;
        c->cap[r] = bytes;
    }
    return c->buf[r];
}

/* the descriptors of one convolution */
typedef struct cdesc {
    dnnl_memory_desc_t x, w, b, y; /* the tensors' plain layouts */
    dnnl_memory_desc_t xa, wa, ya; /* the same with the layout left to oneDNN */
    dnnl_dims_t stride, dil, pl, pr;
    bool blocked; /* the primitive picks its layouts (any) */
    int mode;     /* FULGUR_CONV: M_AUTO, M_DIRECT or M_WINOGRAD */
    bool wino;    /* Winograd is a candidate (3x3, stride 1, ...) */
    dnnl_alg_kind_t alg;
    int64_t key[KEYN];
} cdesc;

enum { M_AUTO, M_DIRECT, M_WINOGRAD };
/* Winograd is measured against direct from this many input and output
 * channels (below, it lost on every shape measured: 16 channels 1.3-2.2x
 * slower, the 3-channel stem 4x); FULGUR_CONV=onednn-winograd takes it on
 * any shape oneDNN runs it. */
#define WINO_MIN_CHANNELS 32

static void make_desc(cdesc *d, int kind, const fg_tensor *x, const fg_tensor *y, int64_t O,
                      int64_t KH, int64_t KW, const fg_conv_params *p, bool bias) {
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
    d->mode = e && !strcmp(e, "onednn-direct")     ? M_DIRECT
              : e && !strcmp(e, "onednn-winograd") ? M_WINOGRAD
                                                   : M_AUTO;
    d->wino = d->blocked && d->mode != M_DIRECT && KH == 3 && KW == 3 && G == 1 &&
              p->stride[0] == 1 && p->stride[1] == 1 && p->dilation[0] == 1 &&
              p->dilation[1] == 1 &&
              (d->mode == M_WINOGRAD || (C >= WINO_MIN_CHANNELS && O >= WINO_MIN_CHANNELS));
    d->alg = dnnl_convolution_direct;
    int64_t in[2] = {H, W}, out[2] = {OH, OW}, k[2] = {KH, KW};
    for (int i = 0; i < 2; i++) {
        int64_t range = (k[i] - 1) * p->dilation[i] + 1;
        int64_t pr = (out[i] - 1) * p->stride[i] + range - in[i] - p->pad[i];
        d->stride[i] = p->stride[i];
        d->dil[i] = p->dilation[i] - 1; /* oneDNN counts the gaps */
        d->pl[i] = p->pad[i];
        d->pr[i] = pr > 0 ? pr : 0;
    }
#ifdef _OPENMP
    int64_t threads = omp_get_max_threads(); /* the kernels are laid out for a thread count */
#else
    int64_t threads = 1;
#endif
    int64_t key[KEYN] = {kind,         N,         C,          H,        W,        O,
                         KH,           KW,        OH,         OW,       G,        d->stride[0],
                         d->stride[1], d->dil[0], d->dil[1],  d->pl[0], d->pl[1], d->pr[0],
                         d->pr[1],     bias,      d->blocked, threads,  d->mode,  p->overwrite};
    memcpy(d->key, key, sizeof key);
}

static FG_MUST_USE fg_status fail(const char *kernel, dnnl_status_t s, const char *what) {
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
static dnnl_status_t fwd_pd(dnnl_primitive_desc_t *pd, const cdesc *d, bool bias,
                            dnnl_primitive_attr_t attr) {
    dnnl_convolution_desc_t cd;
    dnnl_status_t s = dnnl_dilated_convolution_forward_desc_init(
        &cd, dnnl_forward_training, d->alg, d->blocked ? &d->xa : &d->x,
        d->blocked ? &d->wa : &d->w, bias ? &d->b : NULL, d->blocked ? &d->ya : &d->y, d->stride,
        d->dil, d->pl, d->pr);
    if (s != dnnl_success) return s;
    return dnnl_primitive_desc_create(pd, &cd, attr, g_engine, NULL);
}

/* One argument of a primitive: its role, the plain layout, the query
 * that tells the layout the primitive chose, whether it is an output, and
 * whether that output is added to what the caller's tensor holds. */
typedef struct io {
    int arg, role;
    dnnl_query_t query;
    int index;
    const dnnl_memory_desc_t *plain;
    bool out, accum;
} io;

/* a reorder from smd to dmd, adding into the destination with sum */
static dnnl_status_t make_reorder(dnnl_primitive_t *prim, const dnnl_memory_desc_t *smd,
                                  const dnnl_memory_desc_t *dmd, bool sum) {
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t rpd = NULL;
    dnnl_status_t s = dnnl_primitive_attr_create(&attr);
    if (s == dnnl_success && sum) {
        s = dnnl_post_ops_create(&po);
        if (s == dnnl_success) s = dnnl_post_ops_append_sum(po, 1.0f);
        if (s == dnnl_success) s = dnnl_primitive_attr_set_post_ops(attr, po);
    }
    if (s == dnnl_success)
        s = dnnl_reorder_primitive_desc_create(&rpd, smd, g_engine, dmd, g_engine, attr);
    if (s == dnnl_success) s = dnnl_primitive_create(prim, rpd);
    dnnl_primitive_desc_destroy(rpd);
    dnnl_post_ops_destroy(po);
    dnnl_primitive_attr_destroy(attr);
    return s;
}

/* The entry of pd (taken over) and its n arguments, made once. */
static FG_MUST_USE fg_status entry_new(const char *kernel, const int64_t *key,
                                       dnnl_primitive_desc_t pd, int n, const io *a, centry **out) {
    fg_status st = FG_OK;
    centry *e = fg_calloc(1, sizeof *e);
    if (!e) {
        dnnl_primitive_desc_destroy(pd);
        return FG_ENOMEM;
    }
    memcpy(e->key, key, sizeof e->key);
    e->pd = pd;
    e->n = n;
    const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    e->scratch = sp ? dnnl_memory_desc_get_size(sp) : 0;
    for (int i = 0; i < n; i++) {
        const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, a[i].query, a[i].index);
        e->arg[i] = a[i].arg;
        e->role[i] = a[i].role;
        e->out[i] = a[i].out;
        e->accum[i] = a[i].accum;
        e->plain[i] = *a[i].plain;
        e->md[i] = md ? *md : *a[i].plain;
        e->conv[i] = !dnnl_memory_desc_equal(&e->md[i], &e->plain[i]);
        e->bytes[i] = dnnl_memory_desc_get_size(&e->md[i]);
        if (e->conv[i]) {
            if (a[i].out)
                DN(make_reorder(&e->reo[i], &e->md[i], &e->plain[i], a[i].accum), "reorder");
            else DN(make_reorder(&e->reo[i], &e->plain[i], &e->md[i], false), "reorder");
        }
    }
    DN(dnnl_primitive_create(&e->prim, pd), "primitive");
    *out = e;
    return FG_OK;
out:
    entry_free(e);
    return st;
}

static void add_into(float *dst, const float *src, int64_t n) {
    FG_PRAGMA(omp parallel for simd if (parallel: n > FG_PAR_MIN) schedule(static))
    for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}

static dnnl_status_t exec2(cstate *c, dnnl_primitive_t prim, const dnnl_memory_desc_t *smd,
                           void *src, const dnnl_memory_desc_t *dmd, void *dst) {
    dnnl_memory_t sm = NULL, dm = NULL;
    dnnl_status_t s = dnnl_memory_create(&sm, smd, g_engine, src);
    if (s == dnnl_success) s = dnnl_memory_create(&dm, dmd, g_engine, dst);
    if (s == dnnl_success) {
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, sm}, {DNNL_ARG_TO, dm}};
        s = dnnl_primitive_execute(prim, c->stream, 2, args);
    }
    dnnl_memory_destroy(sm);
    dnnl_memory_destroy(dm);
    return s;
}

/* Runs entry e on the caller's pointers ptr[0..n-1] (elements[i] each):
 * an argument in a layout other than its plain one goes through its
 * role's buffer (inputs reordered into it first, outputs out of it after,
 * added to the caller's for an accumulating one); an accumulating output
 * in its plain layout is written to its role's buffer and added. */
static FG_MUST_USE fg_status run(const char *kernel, cstate *c, centry *e, void *const *ptr,
                                 const int64_t *elements, bool take_dst, bool leave_dst) {
    fg_status st = FG_OK;
    dnnl_memory_t mem[NARG + 1] = {NULL};
    dnnl_exec_arg_t args[NARG + 1];
    void *at[NARG];
    int na = 0;
    const void *holds = take_dst ? c->dst_holds : NULL;
    c->dst_holds = NULL;
    for (int i = 0; i < e->n; i++) {
        at[i] = ptr[i];
        if (e->conv[i] || (e->out[i] && e->accum[i])) {
            size_t bytes = e->conv[i] ? e->bytes[i] : sizeof(float) * (size_t)elements[i];
            bool have = e->role[i] == R_DST && holds == ptr[i] && c->cap[R_DST] >= bytes &&
                        dnnl_memory_desc_equal(&c->dst_md, &e->md[i]);
            if (!(at[i] = role_buf(c, e->role[i], bytes ? bytes : 1))) {
                st = FG_ENOMEM;
                goto out;
            }
            if (e->conv[i] && !e->out[i] && !have)
                DN(exec2(c, e->reo[i], &e->plain[i], ptr[i], &e->md[i], at[i]), "reorder");
            if (leave_dst && e->conv[i] && !e->out[i] && e->role[i] == R_DST) {
                c->dst_holds = ptr[i];
                c->dst_md = e->md[i];
            }
        }
        DN(dnnl_memory_create(&mem[na], &e->md[i], g_engine, at[i]), "memory");
        args[na] = (dnnl_exec_arg_t){e->arg[i], mem[na]};
        na++;
    }
    if (e->scratch) {
        void *sp = role_buf(c, R_SCRATCH, e->scratch);
        if (!sp) {
            st = FG_ENOMEM;
            goto out;
        }
        const dnnl_memory_desc_t *smd =
            dnnl_primitive_desc_query_md(e->pd, dnnl_query_scratchpad_md, 0);
        DN(dnnl_memory_create(&mem[na], smd, g_engine, sp), "memory");
        args[na] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, mem[na]};
        na++;
    }
    DN(dnnl_primitive_execute(e->prim, c->stream, na, args), "execute");
    for (int i = 0; i < e->n; i++) {
        if (!e->out[i] || at[i] == ptr[i]) continue;
        if (e->conv[i]) DN(exec2(c, e->reo[i], &e->md[i], at[i], &e->plain[i], ptr[i]), "reorder");
        else add_into(ptr[i], at[i], elements[i]);
        if (e->role[i] == R_DST) c->dst_holds = NULL;
    }
    DN(dnnl_stream_wait(c->stream), "stream wait");
out:
    for (int i = 0; i < na; i++) dnnl_memory_destroy(mem[i]);
    if (st) c->dst_holds = NULL;
    return st;
}

/* the thread's entry for d's key, or NULL (the caller makes it) */
static centry *find(cstate *c, const cdesc *d) {
    for (centry **pp = &c->head; *pp; pp = &(*pp)->next)
        if (!memcmp((*pp)->key, d->key, sizeof d->key)) {
            centry *e = *pp; /* to the front: the next call is likely the same */
            *pp = e->next;
            e->next = c->head;
            c->head = e;
            return e;
        }
    return NULL;
}

static void keep(cstate *c, centry *e) {
    e->next = c->head;
    c->head = e;
}

/* attributes with the scratchpad left to the caller */
static dnnl_status_t user_scratchpad(dnnl_primitive_attr_t *attr) {
    dnnl_status_t s = dnnl_primitive_attr_create(attr);
    if (s == dnnl_success)
        s = dnnl_primitive_attr_set_scratchpad_mode(*attr, dnnl_scratchpad_mode_user);
    return s;
}

/* The backward primitive descriptor of kind K_BWD_DATA or K_BWD_WEIGHT
 * (the forward one its hint), its scratchpad the caller's. */
static dnnl_status_t bwd_pd(dnnl_primitive_desc_t *pd, int kind, const cdesc *d, bool bias) {
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t hint = NULL;
    dnnl_convolution_desc_t cd;
    const dnnl_memory_desc_t *x = d->blocked ? &d->xa : &d->x, *w = d->blocked ? &d->wa : &d->w,
                             *y = d->blocked ? &d->ya : &d->y;
    dnnl_status_t s = user_scratchpad(&attr);
    if (s == dnnl_success) s = fwd_pd(&hint, d, bias, NULL);
    if (s == dnnl_success)
        s = kind == K_BWD_DATA
                ? dnnl_dilated_convolution_backward_data_desc_init(&cd, d->alg, x, w, y, d->stride,
                                                                   d->dil, d->pl, d->pr)
                : dnnl_dilated_convolution_backward_weights_desc_init(
                      &cd, d->alg, x, w, bias ? &d->b : NULL, y, d->stride, d->dil, d->pl, d->pr);
    if (s == dnnl_success) s = dnnl_primitive_desc_create(pd, &cd, attr, g_engine, hint);
    dnnl_primitive_desc_destroy(hint);
    dnnl_primitive_attr_destroy(attr);
    return s;
}

/* The entry of direction `kind` for d on its algorithm d->alg: bias (the
 * forward's bias, the backward's bias gradient) or not; the backward
 * data's dx added to or written (accum). */
static FG_MUST_USE fg_status make_entry(const char *kernel, int kind, const cdesc *d, bool bias,
                                        bool accum, centry **out) {
    fg_status st = FG_OK;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    io a[4];
    int n = 3;
    if (kind == K_FWD) {
        DN(user_scratchpad(&attr), "attributes");
        DN(fwd_pd(&pd, d, bias, attr), "convolution descriptor");
        a[0] = (io){DNNL_ARG_SRC, R_SRC, dnnl_query_src_md, 0, &d->x, false, false};
        a[1] = (io){DNNL_ARG_WEIGHTS, R_WEI, dnnl_query_weights_md, 0, &d->w, false, false};
        a[2] = (io){DNNL_ARG_DST, R_DST, dnnl_query_dst_md, 0, &d->y, true, false};
        a[3] = (io){DNNL_ARG_BIAS, R_BIAS, dnnl_query_weights_md, 1, &d->b, false, false};
        n = bias ? 4 : 3;
    } else if (kind == K_BWD_DATA) {
        DN(bwd_pd(&pd, K_BWD_DATA, d, false), "backward data primitive");
        a[0] = (io){DNNL_ARG_DIFF_DST, R_DST, dnnl_query_diff_dst_md, 0, &d->y, false, false};
        a[1] = (io){DNNL_ARG_WEIGHTS, R_WEI, dnnl_query_weights_md, 0, &d->w, false, false};
        a[2] = (io){DNNL_ARG_DIFF_SRC, R_SRC, dnnl_query_diff_src_md, 0, &d->x, true, accum};
    } else {
        DN(bwd_pd(&pd, K_BWD_WEIGHT, d, bias), "backward weights primitive");
        a[0] = (io){DNNL_ARG_SRC, R_SRC, dnnl_query_src_md, 0, &d->x, false, false};
        a[1] = (io){DNNL_ARG_DIFF_DST, R_DST, dnnl_query_diff_dst_md, 0, &d->y, false, false};
        a[2] = (io){DNNL_ARG_DIFF_WEIGHTS, R_WEI, dnnl_query_diff_weights_md, 0, &d->w, true, true};
        a[3] = (io){DNNL_ARG_DIFF_BIAS, R_BIAS, dnnl_query_diff_weights_md, 1, &d->b, true, true};
        n = bias ? 4 : 3;
    }
    st = entry_new(kernel, d->key, pd, n, a, out); /* takes pd */
out:
    dnnl_primitive_attr_destroy(attr);
    return st;
}

/* The caller's tensors of a call in its entry's argument order (forward:
 * x, w, y, b; backward data: dy, w, dx; backward weights: x, dy, dw, db)
 * and its parameters */
typedef struct call {
    const fg_tensor *t[NARG];
    const fg_conv_params *p;
} call;

/* fulgur's Winograd on the call's shapes, over the memory ptr[i] */
static FG_MUST_USE fg_status run_own(int kind, const call *a, void *const *ptr) {
    fg_tensor t[NARG];
    for (int i = 0; i < NARG; i++)
        if (a->t[i]) {
            t[i] = *a->t[i];
            t[i].data = ptr[i];
        }
    if (kind == K_FWD)
        return fg__wino_conv2d_fwd(&t[0], &t[1], a->t[3] ? &t[3] : NULL, a->p, &t[2]);
    if (kind == K_BWD_DATA) return fg__wino_conv2d_bwd_data(&t[0], &t[1], a->p, &t[2]);
    return fg__wino_conv2d_bwd_weight(&t[0], &t[1], a->p, &t[2], a->t[3] ? &t[3] : NULL);
}

/* whether fulgur's Winograd applies to the call */
static bool own_fits(int kind, const call *a) {
    const fg_tensor *x = kind == K_BWD_DATA ? a->t[2] : a->t[0];
    const fg_tensor *w = kind == K_BWD_WEIGHT ? a->t[2] : a->t[1];
    return fg__wino_conv_fits(x, w, a->p);
}

/* what measure needs to make a shape's two entries */
typedef struct mctx {
    const char *kernel;
    cstate *c;
    int kind;
    const cdesc *d;
    bool bias, accum;
    const call *a;
} mctx;

#define MEASURE_ROUNDS 3

/* conv_pick.c's measurement of a shape: its direct and its Winograd entry
 * (oneDNN's, else fulgur's; INFINITY where neither applies), each whole
 * call (reorders included) on scratch tensors of the shape's plain
 * layouts, once to warm up and then interleaved, the best of
 * MEASURE_ROUNDS. */
static fg_status measure(void *ud, double *t) {
    const mctx *m = ud;
    fg_status st = FG_OK;
    centry *e[2] = {NULL, NULL};
    void *ptr[NARG] = {NULL};
    int64_t el[NARG] = {0};
    cdesc d = *m->d;
    for (int k = 0; k < 2 && !st; k++) {
        d.alg = k ? dnnl_convolution_winograd : dnnl_convolution_direct;
        st = make_entry(m->kernel, m->kind, &d, m->bias, m->accum, &e[k]);
        if (st == FG_EUNSUPPORTED) e[k] = NULL, st = FG_OK;
    }
    bool own = !st && e[0] && !e[1] && own_fits(m->kind, m->a);
    if (st || !e[0] || (!e[1] && !own)) goto done; /* nothing to measure: direct (or im2col) */
    for (int i = 0; i < e[0]->n; i++) {
        size_t bytes = dnnl_memory_desc_get_size(&e[0]->plain[i]);
        el[i] = (int64_t)(bytes / sizeof(float));
        float *f = ptr[i] = fg_alloc(bytes ? bytes : 1);
        if (!f) {
            st = FG_ENOMEM;
            goto done;
        }
        for (int64_t j = 0; j < el[i]; j++) f[j] = (float)((j * 7 % 13) - 6) * 0.0625f;
    }
    for (int round = 0; round <= MEASURE_ROUNDS && !st; round++)
        for (int k = 0; k < 2 && !st; k++) {
            double t0 = fg_time();
            st = k && own ? run_own(m->kind, m->a, ptr)
                          : run(m->kernel, m->c, e[k], ptr, el, false, false);
            if (round) t[k] = fmin(t[k], fg_time() - t0); /* round 0 warms up */
        }
done:
    for (int i = 0; i < NARG; i++) fg_free(ptr[i]);
    for (int k = 0; k < 2; k++)
        if (e[k]) entry_free(e[k]);
    return st;
}

/* An entry that runs fulgur's Winograd */
static FG_MUST_USE fg_status own_entry(const cdesc *d, centry **out) {
    if (!(*out = fg_calloc(1, sizeof **out))) return FG_ENOMEM;
    memcpy((*out)->key, d->key, sizeof d->key);
    (*out)->own = true;
    return FG_OK;
}

/* The calling thread's entry of direction kind for d: kept, or made on the
 * algorithm FULGUR_CONV names or conv_pick.c chooses (Winograd where it
 * measured faster: oneDNN's where it has it, else fulgur's, which only
 * the measured choice takes), then kept. */
static FG_MUST_USE fg_status entry_of(const char *kernel, cstate *c, int kind, cdesc *d, bool bias,
                                      bool accum, const call *a, centry **out) {
    if ((*out = find(c, d))) return FG_OK;
    bool wino = d->wino;
    if (wino && d->mode == M_AUTO) {
        mctx m = {kernel, c, kind, d, bias, accum, a};
        /* the key less its last value (whether dx is added or written):
         * one choice for both, so that their bits agree */
        FG_TRY(fg__conv_pick(d->key, KEYN - 1, measure, &m, &wino));
    }
    fg_status st = FG_EUNSUPPORTED;
    if (wino) {
        d->alg = dnnl_convolution_winograd;
        st = make_entry(kernel, kind, d, bias, accum, out);
    }
    if (st == FG_EUNSUPPORTED && wino && d->mode == M_AUTO && own_fits(kind, a))
        st = own_entry(d, out);
    if (st == FG_EUNSUPPORTED) {
        d->alg = dnnl_convolution_direct;
        st = make_entry(kernel, kind, d, bias, accum, out);
    }
    if (!st) keep(c, *out);
    if (!st && d->alg == dnnl_convolution_winograd) atomic_fetch_add(&g_wino_made, 1);
    return st;
}

int fg__dnnl_conv_winograd_made(void) { return atomic_load(&g_wino_made); }

fg_status fg__dnnl_conv2d_fwd(const fg_tensor *x, const fg_tensor *w, const fg_tensor *b,
                              const fg_conv_params *p, fg_tensor *y) {
    cstate *c;
    centry *e;
    cdesc d;
    FG_TRY(ready(&c));
    make_desc(&d, K_FWD, x, y, w->shape[0], w->shape[2], w->shape[3], p, b != NULL);
    call a = {{x, w, y, b}, p};
    FG_TRY(entry_of("conv2d_fwd", c, K_FWD, &d, b != NULL, false, &a, &e));
    void *ptr[4] = {x->data, w->data, y->data, b ? b->data : NULL};
    int64_t el[4] = {x->numel, w->numel, y->numel, b ? b->numel : 0};
    return e->own ? run_own(K_FWD, &a, ptr) : run("conv2d_fwd", c, e, ptr, el, false, false);
}

fg_status fg__dnnl_conv2d_bwd_data(const fg_tensor *dy, const fg_tensor *w, const fg_conv_params *p,
                                   fg_tensor *dx) {
    cstate *c;
    centry *e;
    cdesc d;
    FG_TRY(ready(&c));
    make_desc(&d, K_BWD_DATA, dx, dy, w->shape[0], w->shape[2], w->shape[3], p, false);
    /* dx is added to unless the caller says it holds nothing yet */
    call a = {{dy, w, dx, NULL}, p};
    FG_TRY(entry_of("conv2d_bwd_data", c, K_BWD_DATA, &d, false, !p->overwrite, &a, &e));
    void *ptr[4] = {dy->data, w->data, dx->data, NULL};
    int64_t el[3] = {dy->numel, w->numel, dx->numel};
    if (!e->own) return run("conv2d_bwd_data", c, e, ptr, el, false, true);
    c->dst_holds = NULL; /* no dy left in oneDNN's layout for the weights' call */
    return run_own(K_BWD_DATA, &a, ptr);
}

fg_status fg__dnnl_conv2d_bwd_weight(const fg_tensor *x, const fg_tensor *dy,
                                     const fg_conv_params *p, fg_tensor *dw, fg_tensor *db) {
    cstate *c;
    centry *e;
    cdesc d;
    FG_TRY(ready(&c));
    make_desc(&d, K_BWD_WEIGHT, x, dy, dw->shape[0], dw->shape[2], dw->shape[3], p, db != NULL);
    call a = {{x, dy, dw, db}, p};
    FG_TRY(entry_of("conv2d_bwd_weight", c, K_BWD_WEIGHT, &d, db != NULL, true, &a, &e));
    void *ptr[4] = {x->data, dy->data, dw->data, db ? db->data : NULL};
    int64_t el[4] = {x->numel, dy->numel, dw->numel, db ? db->numel : 0};
    if (!e->own) return run("conv2d_bwd_weight", c, e, ptr, el, p->dy_as_before, false);
    c->dst_holds = NULL;
    return run_own(K_BWD_WEIGHT, &a, ptr);
}
#endif
