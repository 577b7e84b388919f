/* Tensor creation, accessors, views and copies. Step tensors come from the
 * calling thread's arena; fg_step_reset releases them all at once. Tensors
 * on a device (fg_tensor_new_on, fg_tensor_to) keep their memory in the
 * device's allocator and reach it only through its copy calls. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/device_impl.h"
#include "tensor_impl.h"

static _Thread_local fg_arena *tl_arena;
static _Thread_local uint64_t tl_gen;
/* fg_step_device_set: the device step tensors' data comes from, and its arena */
static _Thread_local fg_dev *tl_dev;
static _Thread_local fg_dev_arena *tl_dev_arena;
/* step memory handed back inside the step (fg__step_recycle), kept in the
 * blocks themselves: each starts with its link and size */
typedef struct spare_block {
    struct spare_block *next;
    size_t bytes;
} spare_block;
static _Thread_local spare_block *tl_spare;
/* counts the releases and resets: a tensor made in an earlier epoch may lie
 * in memory the arena hands out again */
static _Thread_local uint64_t tl_epoch = 1;

static fg_arena *arena(void) {
    if (!tl_arena) tl_arena = fg_arena_new(0);
    return tl_arena;
}

void *fg_step_alloc(size_t bytes) {
    fg_arena *a = arena();
    return a ? fg_arena_alloc(a, bytes) : NULL;
}

void fg_step_reset(void) {
    tl_spare = NULL;
    tl_epoch++;
    if (tl_arena) fg_arena_reset(tl_arena);
    if (tl_dev_arena) fg_dev_arena_reset(tl_dev_arena);
    tl_gen++;
}

void fg_step_thread_release(void) {
    tl_spare = NULL;
    tl_epoch++;
    fg_arena_free(tl_arena);
    tl_arena = NULL;
    fg_dev_arena_free(tl_dev_arena);
    tl_dev_arena = NULL;
    tl_dev = NULL;
    tl_gen++;
}

fg_status fg_step_device_set(fg_dev *dev) {
    if (dev == tl_dev) return FG_OK;
    fg_dev_arena *a = NULL;
    if (dev && !fg_dev_host_accessible(dev) && !(a = fg_dev_arena_new(dev, 0)))
        return fg_error_wrap(fg_last_status(), "step device %s", fg_dev_name(dev));
    /* the old device's step tensors go with its arena */
    tl_spare = NULL;
    tl_epoch++;
    if (tl_arena) fg_arena_reset(tl_arena);
    fg_dev_arena_free(tl_dev_arena);
    tl_dev_arena = a;
    tl_dev = dev;
    tl_gen++;
    return FG_OK;
}

fg_dev *fg_step_device(void) { return tl_dev; }

fg__arena_point fg__step_mark(void) {
    fg_arena *a = arena();
    fg__arena_point m = a ? fg__arena_mark(a) : (fg__arena_point){0};
    if (tl_dev_arena) {
        fg__dev_arena_mark d = fg__dev_arena_mark_get(tl_dev_arena);
        m.dchunk = d.chunk;
        m.dchunk_used = d.chunk_used;
        m.dused = d.used;
    }
    return m;
}

void fg__step_release(fg__arena_point m) {
    tl_spare = NULL;
    tl_epoch++; /* some may lie past the mark */
    if (tl_arena) fg__arena_release(tl_arena, m);
    if (tl_dev_arena)
        fg__dev_arena_release(tl_dev_arena, (fg__dev_arena_mark){m.dchunk, m.dchunk_used, m.dused});
}

uint64_t fg_step_generation(void) { return tl_gen; }
size_t fg_step_bytes(void) { return fg_arena_used(tl_arena); }
size_t fg_step_peak_bytes(void) { return fg_arena_peak(tl_arena); }

fg_status fg__tensor_init_shape(fg_tensor *t, fg_dtype dt, int ndim, const int64_t *shape) {
    if (dt == FG_DTYPE_DEFAULT)
        return fg_error(FG_EINVAL, "tensor: dtype 0 (FG_DTYPE_DEFAULT): a tensor needs a real "
                                   "dtype; pass FG_F32 (or FG_F64, FG_I32, ...)");
    if (!fg_dtype_valid(dt)) return fg_error(FG_EINVAL, "tensor: invalid dtype %d", (int)dt);
    if (ndim < 0 || ndim > FG_MAX_DIMS)
        return fg_error(FG_EINVAL, "tensor: %d dimensions (expected 0..%d)", ndim, FG_MAX_DIMS);
    if (ndim > 0 && !shape) return fg_error(FG_EINVAL, "tensor: NULL shape with %d dims", ndim);
    int64_t n = 1;
    size_t es = fg_dtype_size(dt);
    for (int i = ndim - 1; i >= 0; i--) {
        if (shape[i] < 0)
            return fg_error(FG_EINVAL, "tensor: dimension %d is %lld (must be >= 0)", i,
                            (long long)shape[i]);
        t->shape[i] = shape[i];
        t->strides[i] = n;
        if (shape[i] && n > (int64_t)(INT64_MAX / (int64_t)es) / shape[i])
            return fg_error(FG_EINVAL, "tensor: shape too large (overflows)");
        n *= shape[i];
    }
    t->dtype = dt;
    t->ndim = ndim;
    t->numel = n;
    t->param_index = -1;
    return FG_OK;
}

fg_tensor *fg_empty(fg_dtype dt, int ndim, const int64_t *shape) {
    fg_tensor tmp = {0};
    if (fg__tensor_init_shape(&tmp, dt, ndim, shape) != FG_OK) return NULL;
    size_t bytes = (size_t)tmp.numel * fg_dtype_size(dt);
    if (tl_dev_arena) { /* the header on the host, the data on the step device */
        fg_tensor *t = fg_step_alloc(sizeof *t);
        if (!t) return NULL;
        *t = tmp;
        t->data = fg_dev_arena_alloc(tl_dev_arena, bytes);
        if (!t->data) return NULL;
        t->device = fg_dev_kind(tl_dev);
        t->dev = tl_dev;
        return t;
    }
    /* the header is rounded to 64 bytes so the data after it stays aligned */
    size_t hdr = (sizeof(fg_tensor) + 63) & ~(size_t)63;
    fg_tensor *t = fg_step_alloc(hdr + bytes);
    if (!t) return NULL;
    *t = tmp;
    t->data = (char *)t + hdr;
    return t;
}

void fg__step_recycle(fg_tensor *t) {
    size_t bytes = fg_tensor_nbytes(t);
    if (tl_dev_arena || t->dev || t->device != FG_CPU || t->step_epoch != tl_epoch ||
        (t->flags & (FG_T_PERSISTENT | FG_T_OWNS_DATA)) || bytes < 64 || ((uintptr_t)t->data & 63))
        return;
    spare_block *b = t->data;
    b->bytes = bytes;
    b->next = tl_spare;
    tl_spare = b;
    t->data = NULL;
}

fg_tensor *fg__step_zeros_reuse(fg_dtype dt, int ndim, const int64_t *shape, bool zero) {
    fg_tensor tmp = {0};
    if (fg__tensor_init_shape(&tmp, dt, ndim, shape) != FG_OK) return NULL;
    size_t bytes = (size_t)tmp.numel * fg_dtype_size(dt);
    spare_block **best = NULL;
    if (!tl_dev_arena && bytes >= 64) /* the smallest that holds it, up to twice its size */
        for (spare_block **pp = &tl_spare; *pp; pp = &(*pp)->next)
            if ((*pp)->bytes >= bytes && (*pp)->bytes / 2 <= bytes &&
                (!best || (*pp)->bytes < (*best)->bytes))
                best = pp;
    fg_tensor *t;
    if (!best) {
        t = zero ? fg_zeros(dt, ndim, shape) : fg_empty(dt, ndim, shape);
    } else if ((t = fg_step_alloc(sizeof *t))) {
        *t = tmp;
        t->data = *best;
        *best = (*best)->next;
        if (zero) memset(t->data, 0, bytes);
    }
    if (t) t->step_epoch = tl_epoch;
    return t;
}

fg_tensor *fg_zeros(fg_dtype dt, int ndim, const int64_t *shape) {
    fg_tensor *t = fg_empty(dt, ndim, shape);
    if (t && t->dev && fg_dev_memset(t->dev, t->data, 0, fg_tensor_nbytes(t), NULL) != FG_OK)
        return NULL;
    if (t && !t->dev) memset(t->data, 0, fg_tensor_nbytes(t));
    return t;
}

fg_tensor *fg_full(fg_dtype dt, int ndim, const int64_t *shape, double v) {
    fg_tensor *t = fg_empty(dt, ndim, shape);
    if (t && fg_tensor_fill(t, v) != FG_OK) return NULL;
    return t;
}

fg_tensor *fg_from_data(fg_dtype dt, int ndim, const int64_t *shape, const void *data) {
    fg_tensor *t = fg_empty(dt, ndim, shape);
    if (t && t->numel) {
        if (!data) {
            fg_error(FG_EINVAL, "fg_from_data: NULL data for %lld elements", (long long)t->numel);
            return NULL;
        }
        if (t->dev) { /* host data onto the step device: a copy in */
            if (fg_dev_copy_h2d(t->dev, t->data, data, fg_tensor_nbytes(t)) != FG_OK) return NULL;
        } else {
            memcpy(t->data, data, fg_tensor_nbytes(t));
        }
    }
    return t;
}

fg_tensor *fg_scalar(fg_dtype dt, double v) { return fg_full(dt, 0, NULL, v); }
fg_tensor *fg_empty_like(const fg_tensor *t) { return fg_empty(t->dtype, t->ndim, t->shape); }
fg_tensor *fg_zeros_like(const fg_tensor *t) { return fg_zeros(t->dtype, t->ndim, t->shape); }

fg_tensor *fg_tensor_new(fg_dtype dt, int ndim, const int64_t *shape) {
    fg_tensor tmp = {0};
    if (fg__tensor_init_shape(&tmp, dt, ndim, shape) != FG_OK) return NULL;
    fg_tensor *t = fg_alloc(sizeof *t);
    if (!t) return NULL;
    *t = tmp;
    t->data = fg_calloc(1, fg_tensor_nbytes(t));
    if (!t->data) {
        fg_free(t);
        return NULL;
    }
    t->flags = FG_T_PERSISTENT | FG_T_OWNS_DATA;
    return t;
}

fg_tensor *fg_tensor_wrap(void *data, fg_dtype dt, int ndim, const int64_t *shape) {
    fg_tensor tmp = {0};
    if (fg__tensor_init_shape(&tmp, dt, ndim, shape) != FG_OK) return NULL;
    if (!data && tmp.numel) {
        fg_error(FG_EINVAL, "fg_tensor_wrap: NULL data for %lld elements", (long long)tmp.numel);
        return NULL;
    }
    fg_tensor *t = fg_alloc(sizeof *t);
    if (!t) return NULL;
    *t = tmp;
    t->data = data;
    t->flags = FG_T_PERSISTENT;
    return t;
}

void fg_tensor_free(fg_tensor *t) {
    if (!t || !(t->flags & FG_T_PERSISTENT)) return;
    if (t->flags & FG_T_OWNS_GRAD) fg_tensor_free(t->grad);
    if (t->flags & FG_T_OWNS_DATA) {
        if (t->dev) {
            fg_error_kept kept; /* a _free never changes the caller's error (core.h) */
            fg_error_keep(&kept);
            /* a _free has no caller to tell; the data came from t->dev */
            fg__status_drop(fg_dev_free(t->dev, t->data));
            fg_error_restore(&kept);
        } else {
            fg_free(t->data);
        }
    }
    fg_free(t);
}

/* The device whose memory the host may not touch, for t; NULL for host
 * memory (no device, or the CPU device). */
static fg_dev *mem_dev(const fg_tensor *t) {
    return t->dev && !fg_dev_host_accessible(t->dev) ? t->dev : NULL;
}

static fg_tensor *new_on(fg_dev *dev, fg_dtype dt, int ndim, const int64_t *shape, bool zero) {
    fg_tensor tmp = {0};
    if (fg__tensor_init_shape(&tmp, dt, ndim, shape) != FG_OK) return NULL;
    fg_tensor *t = fg_alloc(sizeof *t);
    if (!t) return NULL;
    *t = tmp;
    size_t bytes = fg_tensor_nbytes(t);
    t->data = fg_dev_alloc(dev, bytes, NULL);
    if (!t->data || (zero && fg_dev_memset(dev, t->data, 0, bytes, NULL) != FG_OK)) {
        /* just allocated on dev: its free cannot fail; the error kept is the
         * allocation's or the memset's */
        if (t->data) fg__status_drop(fg_dev_free(dev, t->data));
        fg_free(t);
        return NULL;
    }
    t->device = fg_dev_kind(dev);
    t->dev = dev;
    t->flags = FG_T_PERSISTENT | FG_T_OWNS_DATA;
    return t;
}

fg_tensor *fg_tensor_new_on(fg_dev *dev, fg_dtype dt, int ndim, const int64_t *shape) {
    return dev ? new_on(dev, dt, ndim, shape, true) : fg_tensor_new(dt, ndim, shape);
}

fg_tensor *fg_tensor_wrap_on(fg_dev *dev, void *data, fg_dtype dt, int ndim, const int64_t *shape) {
    fg_tensor *t = fg_tensor_wrap(data, dt, ndim, shape);
    if (t && dev) {
        t->device = fg_dev_kind(dev);
        t->dev = dev;
    }
    return t;
}

fg_tensor *fg_tensor_to(const fg_tensor *t, fg_dev *dev) {
    if (mem_dev(t) && !fg_tensor_is_contiguous(t)) {
        fg_error(FG_EUNSUPPORTED,
                 "fg_tensor_to: a strided view on device %s: no device kernel copies strided "
                 "views yet; copy the whole tensor",
                 fg_dev_name(t->dev));
        return NULL;
    }
    const fg_tensor *src = fg_tensor_contiguous(t);
    if (!src) return NULL;
    fg_tensor *out = dev ? new_on(dev, t->dtype, t->ndim, t->shape, false)
                         : fg_tensor_new(t->dtype, t->ndim, t->shape);
    if (!out) return NULL;
    if (fg_tensor_copy(out, src) != FG_OK) {
        fg_tensor_free(out);
        return NULL;
    }
    return out;
}

fg_dev *fg_tensor_dev(const fg_tensor *t) { return t->dev; }

bool fg_tensor_is_persistent(const fg_tensor *t) { return t && (t->flags & FG_T_PERSISTENT); }
fg_dtype fg_tensor_dtype(const fg_tensor *t) { return t->dtype; }
fg_device fg_tensor_device(const fg_tensor *t) { return t->device; }
int fg_tensor_ndim(const fg_tensor *t) { return t->ndim; }
const int64_t *fg_tensor_shape(const fg_tensor *t) { return t->shape; }
const int64_t *fg_tensor_strides(const fg_tensor *t) { return t->strides; }
int64_t fg_tensor_numel(const fg_tensor *t) { return t->numel; }
size_t fg_tensor_nbytes(const fg_tensor *t) { return (size_t)t->numel * fg_dtype_size(t->dtype); }
void *fg_tensor_data(const fg_tensor *t) { return t->data; }

int64_t fg_tensor_dim(const fg_tensor *t, int dim) {
    if (dim < 0) dim += t->ndim;
    return dim >= 0 && dim < t->ndim ? t->shape[dim] : -1;
}

bool fg_tensor_is_contiguous(const fg_tensor *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != s) return false;
        s *= t->shape[i];
    }
    return true;
}

bool fg_tensor_same_shape(const fg_tensor *a, const fg_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

/* Offset in elements of logical (row-major) index i. */
static int64_t strided_offset(const fg_tensor *t, int64_t i) {
    int64_t off = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        int64_t n = t->shape[d];
        off += (i % n) * t->strides[d];
        i /= n;
    }
    return off;
}

static double load_at(const fg_tensor *t, int64_t off) {
    double v = 0;
    const char *p = (const char *)t->data + off * (int64_t)fg_dtype_size(t->dtype);
    uint64_t staged;
    if (mem_dev(t)) {
        if (fg_dev_copy_d2h(t->dev, &staged, p, fg_dtype_size(t->dtype)) != FG_OK) return NAN;
        p = (const char *)&staged;
    }
    fg__status_drop(fg_convert(&v, FG_F64, p, t->dtype, 1)); /* a float or integer dtype */
    return v;
}

double fg_tensor_get(const fg_tensor *t, int64_t i) {
    if (i < 0 || i >= t->numel) return NAN;
    return load_at(t, strided_offset(t, i));
}

double fg_item(const fg_tensor *t) { return t && t->numel == 1 ? load_at(t, 0) : NAN; }

const char *fg_tensor_describe(const fg_tensor *t, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "%s[", fg_dtype_name(t->dtype));
    for (int i = 0; i < t->ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}

fg_tensor *fg__tensor_header_like(const fg_tensor *t) {
    fg_tensor *v = fg_step_alloc(sizeof *v);
    if (!v) return NULL;
    *v = *t;
    v->flags = 0;
    v->requires_grad = false;
    v->grad = NULL;
    v->grad_fn = NULL;
    v->grad_for = NULL;
    v->pending = 0;
    v->param_index = -1;
    return v;
}

fg_tensor *fg_tensor_reshape_view(const fg_tensor *t, int ndim, const int64_t *shape) {
    if (!fg_tensor_is_contiguous(t)) {
        fg_error(FG_EINVAL,
                 "reshape_view: the tensor is not contiguous (call fg_tensor_contiguous)");
        return NULL;
    }
    if (ndim < 0 || ndim > FG_MAX_DIMS) {
        fg_error(FG_EINVAL, "reshape: %d dimensions (expected 0..%d)", ndim, FG_MAX_DIMS);
        return NULL;
    }
    int64_t sh[FG_MAX_DIMS], known = 1;
    int infer = -1;
    for (int i = 0; i < ndim; i++) {
        sh[i] = shape[i];
        if (shape[i] == -1 && infer < 0) {
            infer = i;
        } else if (shape[i] < 0) {
            fg_error(FG_EINVAL, "reshape: dimension %d is %lld", i, (long long)shape[i]);
            return NULL;
        } else {
            known *= shape[i];
        }
    }
    if (infer >= 0) sh[infer] = known ? t->numel / known : 0;
    if (infer >= 0 ? (known == 0 || sh[infer] * known != t->numel) : known != t->numel) {
        char b[96];
        fg_error(FG_EINVAL, "reshape: cannot view %s (%lld elements) with the given shape",
                 fg_tensor_describe(t, b, sizeof b), (long long)t->numel);
        return NULL;
    }
    fg_tensor *v = fg__tensor_header_like(t);
    if (!v) return NULL;
    if (fg__tensor_init_shape(v, t->dtype, ndim, sh) != FG_OK) return NULL;
    return v;
}

fg_tensor *fg_tensor_transpose_view(const fg_tensor *t, int d0, int d1) {
    if (d0 < 0) d0 += t->ndim;
    if (d1 < 0) d1 += t->ndim;
    if (d0 < 0 || d1 < 0 || d0 >= t->ndim || d1 >= t->ndim) {
        fg_error(FG_EINVAL, "transpose: dims out of range for a %d-d tensor", t->ndim);
        return NULL;
    }
    fg_tensor *v = fg__tensor_header_like(t);
    if (!v) return NULL;
    int64_t s = v->shape[d0], st = v->strides[d0];
    v->shape[d0] = v->shape[d1];
    v->strides[d0] = v->strides[d1];
    v->shape[d1] = s;
    v->strides[d1] = st;
    return v;
}

fg_tensor *fg_tensor_narrow_view(const fg_tensor *t, int dim, int64_t start, int64_t len) {
    if (dim < 0) dim += t->ndim;
    if (dim < 0 || dim >= t->ndim || start < 0 || len < 0 || start > t->shape[dim] ||
        len > t->shape[dim] - start) {
        fg_error(FG_EINVAL, "narrow: dim %d, start %lld, length %lld out of range", dim,
                 (long long)start, (long long)len);
        return NULL;
    }
    fg_tensor *v = fg__tensor_header_like(t);
    if (!v) return NULL;
    v->data = (char *)t->data + start * t->strides[dim] * (int64_t)fg_dtype_size(t->dtype);
    v->shape[dim] = len;
    v->numel = t->shape[dim] ? t->numel / t->shape[dim] * len : 0;
    return v;
}

/* dst = src for one shape and one dtype in any two layouts, without a
 * division per element (strided_offset): an odometer over all dims but the
 * last two, and the last two copied as a 2-D strided block, by rows with
 * memcpy when both sides have contiguous rows, else in COPY_TILE squares
 * walked along src's smaller stride. The tiles matter for transposes: a
 * column walk at a 4 KiB stride maps every line to one cache set. Measured
 * (f32, one thread): (2048, 256) transposed ~5 ms per-element offsets ->
 * ~1.5 ms; (16, 128, 1024) in dims 1 and 2 ~30 ms -> ~22 ms untiled ->
 * ~5 ms in tiles. */
#define COPY_TILE 16

#define COPY_BLOCK(E)                                                                              \
    do {                                                                                           \
        const E *s_ = (const E *)sp;                                                               \
        E *d_ = (E *)dp;                                                                           \
        for (int64_t a0 = 0; a0 < A; a0 += COPY_TILE)                                              \
            for (int64_t b0 = 0; b0 < B; b0 += COPY_TILE) {                                        \
                int64_t a1 = FG_MIN(A, a0 + COPY_TILE), b1 = FG_MIN(B, b0 + COPY_TILE);            \
                if (a_inner)                                                                       \
                    for (int64_t b = b0; b < b1; b++)                                              \
                        for (int64_t a = a0; a < a1; a++)                                          \
                            d_[a * da + b * db] = s_[a * sa + b * sb];                             \
                else                                                                               \
                    for (int64_t a = a0; a < a1; a++)                                              \
                        for (int64_t b = b0; b < b1; b++)                                          \
                            d_[a * da + b * db] = s_[a * sa + b * sb];                             \
            }                                                                                      \
    } while (0)

static void copy_same_dtype(fg_tensor *dst, const fg_tensor *src) {
    int nd = src->ndim;
    size_t es = fg_dtype_size(src->dtype);
    if (nd == 0) {
        memcpy(dst->data, src->data, es);
        return;
    }
    /* the last two dims as (A, B); a 1-d tensor is (1, B) */
    int64_t A = nd > 1 ? src->shape[nd - 2] : 1, B = src->shape[nd - 1];
    int64_t sa = nd > 1 ? src->strides[nd - 2] : 0, sb = src->strides[nd - 1];
    int64_t da = nd > 1 ? dst->strides[nd - 2] : 0, db = dst->strides[nd - 1];
    bool rows = (sb == 1 || B == 1) && (db == 1 || B == 1);
    bool a_inner = (sa < 0 ? -sa : sa) < (sb < 0 ? -sb : sb);
    int64_t outer = src->numel / (A * B), idx[FG_MAX_DIMS] = {0}, so = 0, dof = 0;
    for (int64_t o = 0; o < outer; o++) {
        const char *sp = (const char *)src->data + so * (int64_t)es;
        char *dp = (char *)dst->data + dof * (int64_t)es;
        if (rows) {
            for (int64_t a = 0; a < A; a++)
                memcpy(dp + a * da * (int64_t)es, sp + a * sa * (int64_t)es, (size_t)B * es);
        } else if (es == 4) {
            COPY_BLOCK(uint32_t);
        } else if (es == 8) {
            COPY_BLOCK(uint64_t);
        } else if (es == 2) {
            COPY_BLOCK(uint16_t);
        } else {
            COPY_BLOCK(uint8_t);
        }
        for (int d = nd - 3; d >= 0; d--) {
            so += src->strides[d];
            dof += dst->strides[d];
            if (++idx[d] < src->shape[d]) break;
            so -= src->strides[d] * src->shape[d];
            dof -= dst->strides[d] * src->shape[d];
            idx[d] = 0;
        }
    }
}

/* The bytes from t's data to one past its last element (a strided view's
 * span; non-negative strides). */
static size_t span(const fg_tensor *t) {
    if (!t->numel) return 0;
    int64_t last = 0;
    for (int i = 0; i < t->ndim; i++) last += (t->shape[i] - 1) * t->strides[i];
    return (size_t)(last + 1) * fg_dtype_size(t->dtype);
}

static FG_MUST_USE fg_status copy_host(fg_tensor *dst, const fg_tensor *src);

/* A converting or strided copy within the guarded device: its kernel is
 * the host's copy run on the device's private alias (as its op table's
 * entries are), so the bits are the CPU's. */
static FG_MUST_USE fg_status copy_guarded(fg_dev *d, fg_tensor *dst, const fg_tensor *src) {
    for (int i = 0; i < src->ndim; i++)
        if (src->strides[i] < 0) return fg_error(FG_EUNSUPPORTED, "copy: a negative stride");
    for (int i = 0; i < dst->ndim; i++)
        if (dst->strides[i] < 0) return fg_error(FG_EUNSUPPORTED, "copy: a negative stride");
    fg_tensor hs = *src, hd = *dst;
    hs.dev = hd.dev = NULL;
    hs.device = hd.device = FG_CPU;
    if (!src->numel) return FG_OK;
    if (!(hs.data = fg__dev_host_view(d, src->data, span(src))) ||
        !(hd.data = fg__dev_host_view(d, dst->data, span(dst))))
        return fg_error_wrap(fg_last_status(), "copy on %s", fg_dev_name(d));
    return copy_host(&hd, &hs);
}

/* dst = src where either is in a device's memory: whole contiguous
 * buffers of one dtype, through the copy calls (staged through pinned host
 * memory between two devices); within the guarded device, any copy (its
 * kernel: copy_guarded). */
static FG_MUST_USE fg_status copy_device(fg_tensor *dst, const fg_tensor *src) {
    fg_dev *sd = mem_dev(src), *dd = mem_dev(dst);
    bool whole =
        src->dtype == dst->dtype && fg_tensor_is_contiguous(src) && fg_tensor_is_contiguous(dst);
    if (!whole && sd && sd == dd && fg_dev_kind(sd) == FG_GUARDED)
        return copy_guarded(sd, dst, src);
    if (!whole) {
        char a[96], b[96];
        return fg_error(FG_EUNSUPPORTED,
                        "copy: %s on %s into %s on %s: a copy that converts or is strided needs "
                        "the device's kernels (not yet built); copy whole tensors of one dtype",
                        fg_tensor_describe(src, a, sizeof a), sd ? fg_dev_name(sd) : "the host",
                        fg_tensor_describe(dst, b, sizeof b), dd ? fg_dev_name(dd) : "the host");
    }
    size_t bytes = fg_tensor_nbytes(src);
    if (!sd) return fg_dev_copy_h2d(dd, dst->data, src->data, bytes);
    if (!dd) return fg_dev_copy_d2h(sd, dst->data, src->data, bytes);
    if (sd == dd) return fg_dev_copy_d2d(sd, dst->data, src->data, bytes);
    void *stage = fg_dev_host_alloc(sd, bytes);
    if (!stage) return fg_last_status();
    fg_status s = fg_dev_copy_d2h(sd, stage, src->data, bytes);
    if (s == FG_OK) s = fg_dev_copy_h2d(dd, dst->data, stage, bytes);
    fg_dev_host_free(sd, stage);
    return s;
}

fg_status fg_tensor_copy(fg_tensor *dst, const fg_tensor *src) {
    if (dst->numel != src->numel) {
        char a[96], b[96];
        return fg_error(FG_EINVAL, "copy: %s into %s: element counts differ",
                        fg_tensor_describe(src, a, sizeof a), fg_tensor_describe(dst, b, sizeof b));
    }
    if ((src->dev || dst->dev) && (mem_dev(src) || mem_dev(dst))) return copy_device(dst, src);
    return copy_host(dst, src);
}

/* fg_tensor_copy of two host tensors (or host views of device memory) */
static FG_MUST_USE fg_status copy_host(fg_tensor *dst, const fg_tensor *src) {
    bool sc = fg_tensor_is_contiguous(src), dc = fg_tensor_is_contiguous(dst);
    if (sc && dc) return fg_convert(dst->data, dst->dtype, src->data, src->dtype, src->numel);
    if (src->dtype == dst->dtype && fg_tensor_same_shape(src, dst)) {
        if (src->numel) copy_same_dtype(dst, src);
        return FG_OK;
    }
    size_t ses = fg_dtype_size(src->dtype), des = fg_dtype_size(dst->dtype);
    if (src->dtype == dst->dtype && src->dtype == FG_F32) {
        const float *s = src->data;
        float *d = dst->data;
        for (int64_t i = 0; i < src->numel; i++)
            d[dc ? i : strided_offset(dst, i)] = s[sc ? i : strided_offset(src, i)];
        return FG_OK;
    }
    for (int64_t i = 0; i < src->numel; i++) {
        int64_t so = sc ? i : strided_offset(src, i), dof = dc ? i : strided_offset(dst, i);
        FG_TRY(fg_convert((char *)dst->data + dof * (int64_t)des, dst->dtype,
                          (const char *)src->data + so * (int64_t)ses, src->dtype, 1));
    }
    return FG_OK;
}

fg_tensor *fg_tensor_contiguous(const fg_tensor *t) {
    if (fg_tensor_is_contiguous(t)) return (fg_tensor *)t;
    fg_tensor *c = fg_empty(t->dtype, t->ndim, t->shape);
    if (c && fg_tensor_copy(c, t) != FG_OK) return NULL;
    return c;
}

fg_status fg_tensor_fill(fg_tensor *t, double v) {
    if (t->dev && mem_dev(t)) {
        if (!fg_tensor_is_contiguous(t))
            return fg_error(FG_EUNSUPPORTED,
                            "fill: a strided view on device %s: no device kernel fills strided "
                            "views yet; fill the whole tensor",
                            fg_dev_name(t->dev));
        uint8_t pat[16];
        FG_TRY(fg_convert(pat, t->dtype, &v, FG_F64, 1));
        return fg_dev_fill(t->dev, t->data, pat, fg_dtype_size(t->dtype), (size_t)t->numel, NULL);
    }
    if (!fg_tensor_is_contiguous(t)) {
        for (int64_t i = 0; i < t->numel; i++)
            FG_TRY(fg_convert((char *)t->data +
                                  strided_offset(t, i) * (int64_t)fg_dtype_size(t->dtype),
                              t->dtype, &v, FG_F64, 1));
        return FG_OK;
    }
    if (t->dtype == FG_F32) {
        float f = (float)v, *p = t->data;
        for (int64_t i = 0; i < t->numel; i++) p[i] = f;
        return FG_OK;
    }
    size_t es = fg_dtype_size(t->dtype);
    if (t->numel == 0) return FG_OK;
    FG_TRY(fg_convert(t->data, t->dtype, &v, FG_F64, 1));
    for (int64_t i = 1; i < t->numel; i++) memcpy((char *)t->data + i * (int64_t)es, t->data, es);
    return FG_OK;
}
