/* The CPU op table as fg_ops_get hands it out: f32 and f64 calls go
 * straight to the kernels of fg__cpu_ops; a call with bf16 or f16 tensors
 * converts them (lowp.h): each such input to an f32 copy, each output to
 * an f32 buffer (holding its current values when the entry accumulates
 * into it), runs the f32 kernel, and rounds the outputs back once. The
 * copies live in scratch buffers of the calling thread (fg_alloc'ed, grown
 * to the largest tensor seen, freed when the thread ends), not in the step
 * arena, so a step keeps only the bf16/f16 tensors themselves; reusing
 * them spares a fresh mapping, and its page faults, per call.
 *
 * bf16 products (matmul with bf16 a and b) go to matmul_bf16.c instead:
 * oneDNN's bf16 matmul where it runs, its f32 fallback elsewhere. */
#include <pthread.h>
#include <string.h>

#include "k_ops.h"
#include "lowp.h"

/* ------------------------------------------------------------ stand-ins */

#define LP_MAX 8

typedef struct lp {
    int n;
    fg_tensor tmp[LP_MAX];
    fg_tensor *orig[LP_MAX]; /* the caller's output, written back at the end */
    bool out[LP_MAX];
    fg_status st;
} lp;

static bool lowp(const fg_tensor *t) { return t && fg__is_lowp(t->dtype); }

/* The calling thread's scratch: one buffer per stand-in slot, and one for
 * matmul_bf16.c's fallback (fg__lowp_scratch). */
#define LP_SLOTS (LP_MAX + 1)
typedef struct lp_cache {
    void *p[LP_SLOTS];
    size_t cap[LP_SLOTS];
} lp_cache;

static pthread_key_t g_key;
static pthread_once_t g_key_once = PTHREAD_ONCE_INIT;
static int g_key_err;

static void cache_free(void *v) {
    lp_cache *c = v;
    for (int i = 0; i < LP_SLOTS; i++) fg_free(c->p[i]);
    fg_free(c);
}

static void key_init(void) { g_key_err = pthread_key_create(&g_key, cache_free); }

/* slot's buffer of at least `bytes`, or NULL (FG_ENOMEM set) */
static void *scratch(int slot, size_t bytes) {
    pthread_once(&g_key_once, key_init);
    if (g_key_err) {
        fg_error(FG_ENOMEM, "lowp: no thread key for the scratch buffers");
        return NULL;
    }
    lp_cache *c = pthread_getspecific(g_key);
    if (!c) {
        if (!(c = fg_calloc(1, sizeof *c))) return NULL;
        if (pthread_setspecific(g_key, c)) {
            fg_free(c);
            fg_error(FG_ENOMEM, "lowp: cannot keep the scratch buffers");
            return NULL;
        }
    }
    if (c->cap[slot] < bytes) {
        fg_free(c->p[slot]);
        c->cap[slot] = 0;
        size_t want = bytes + bytes / 4; /* some room: sizes vary a little */
        if (!(c->p[slot] = fg_alloc(want))) return NULL;
        c->cap[slot] = want;
    }
    return c->p[slot];
}

void *fg__lowp_scratch(size_t bytes) { return scratch(LP_MAX, bytes); }

/* f32 dst = t's elements in row-major order, t any strides */
static void gather(float *dst, const fg_tensor *t) {
    if (fg_tensor_is_contiguous(t)) {
        fg__lowp_widen(dst, t->data, t->numel, t->dtype);
        return;
    }
    int64_t idx[FG_MAX_DIMS] = {0};
    const uint16_t *p = t->data;
    for (int64_t i = 0; i < t->numel; i++) {
        int64_t off = 0;
        for (int d = 0; d < t->ndim; d++) off += idx[d] * t->strides[d];
        fg__lowp_widen(dst + i, p + off, 1, t->dtype);
        for (int d = t->ndim - 1; d >= 0; d--) {
            if (++idx[d] < t->shape[d]) break;
            idx[d] = 0;
        }
    }
}

static fg_tensor *stand_in(lp *c, const fg_tensor *t, bool out, bool acc) {
    if (c->st) return NULL;
    if (c->n == LP_MAX) {
        c->st = fg_error(FG_EINVAL, "lowp: too many tensors in one call");
        return NULL;
    }
    if (out && !fg_tensor_is_contiguous(t)) {
        char s[96];
        c->st = fg_error(FG_EINVAL, "lowp: output %s is not contiguous",
                         fg_tensor_describe(t, s, sizeof s));
        return NULL;
    }
    fg_tensor *f = &c->tmp[c->n];
    memset(f, 0, sizeof *f);
    c->st = fg__tensor_init_shape(f, FG_F32, t->ndim, t->shape);
    if (c->st) return NULL;
    f->device = t->device;
    f->data = scratch(c->n, sizeof(float) * (size_t)(t->numel ? t->numel : 1));
    if (!f->data) {
        c->st = fg_error(FG_ENOMEM, "lowp: %lld floats for an f32 copy of a %s tensor",
                         (long long)t->numel, fg_dtype_name(t->dtype));
        return NULL;
    }
    c->orig[c->n] = (fg_tensor *)t;
    c->out[c->n] = out;
    c->n++;
    if (!out || acc) gather(f->data, t);
    return f;
}

/* t itself when it is not bf16/f16 (or NULL), else its f32 copy */
static const fg_tensor *lp_in(lp *c, const fg_tensor *t) {
    return lowp(t) ? stand_in(c, t, false, false) : t;
}
/* t itself when it is not bf16/f16, else an f32 buffer written back at
 * lp_end; acc: the buffer starts with t's values */
static fg_tensor *lp_out(lp *c, fg_tensor *t, bool acc) {
    return lowp(t) ? stand_in(c, t, true, acc) : t;
}

static FG_MUST_USE fg_status lp_end(lp *c, fg_status st) {
    if (!st) st = c->st;
    for (int i = 0; i < c->n; i++) {
        if (!st && c->out[i])
            fg__lowp_narrow(c->orig[i]->data, c->tmp[i].data, c->orig[i]->numel, c->orig[i]->dtype);
    } /* the buffers stay with the thread for the next call */
    return st;
}

/* The body of an entry: K is the f32 kernel call on the stand-ins. */
#define LP_RUN(K) return lp_end(&c, c.st ? c.st : (K))

/* ----------------------------------------------------- elementwise pieces */

/* Elementwise entries (GELU, ReLU, dropout, same-shape add/mul, axpby,
 * scale) run in pieces of PIECE elements instead: each piece's bf16/f16
 * operands are widened into buffers on the stack, the f32 kernel runs on
 * them and the output piece is rounded back, all while the piece is in the
 * first-level cache. Pieces are split across threads; a piece is below the
 * kernels' own threading threshold, so they run it on the calling thread. */
#define PIECE 2048

/* The f32 kernel on one piece: in[] and out are 1-D f32 views of PIECE or
 * fewer elements; off is the piece's first element. */
typedef FG_MUST_USE fg_status (*pw_fn)(const void *ud, const fg_tensor *const *in, fg_tensor *out,
                                       int64_t off);

/* f32 views over the kernels' own buffers (sizes >= 0; also reshaped to
 * two dims below): the shape cannot be refused, so its status is dropped */
static void view1(fg_tensor *v, float *data, int64_t n) {
    memset(v, 0, sizeof *v);
    fg__status_drop(fg__tensor_init_shape(v, FG_F32, 1, &n));
    v->data = data;
    v->device = FG_CPU;
}

/* Whether piecewise() takes a call: every tensor contiguous, of out's
 * element count, and f32 or bf16/f16. */
static bool pw_ok(int nin, const fg_tensor *const *in, const fg_tensor *out) {
    if (!fg_tensor_is_contiguous(out) || (out->dtype != FG_F32 && !lowp(out))) return false;
    for (int k = 0; k < nin; k++)
        if (!fg_tensor_is_contiguous(in[k]) || in[k]->numel != out->numel ||
            (in[k]->dtype != FG_F32 && !lowp(in[k])))
            return false;
    return true;
}

static FG_MUST_USE fg_status piecewise(int nin, const fg_tensor *const *in, fg_tensor *out,
                                       bool acc, pw_fn f, const void *ud) {
    int64_t n = out->numel, np = (n + PIECE - 1) / PIECE;
    fg_status first = FG_OK;
    bool par = np > 8 && fg_get_num_threads() > 1;
    FG_PRAGMA(omp parallel for if (par) schedule(static))
    for (int64_t p = 0; p < np; p++) {
        float buf[4][PIECE];
        fg_tensor vin[3], vout;
        const fg_tensor *pin[3];
        int64_t off = p * PIECE, k = FG_MIN(PIECE, n - off);
        for (int j = 0; j < nin; j++) {
            const fg_tensor *t = in[j];
            if (lowp(t)) {
                fg__lowp_widen(buf[j], (const uint16_t *)t->data + off, k, t->dtype);
                view1(&vin[j], buf[j], k);
            } else {
                view1(&vin[j], (float *)t->data + off, k);
            }
            pin[j] = &vin[j];
        }
        if (lowp(out)) {
            if (acc) fg__lowp_widen(buf[3], (const uint16_t *)out->data + off, k, out->dtype);
            view1(&vout, buf[3], k);
        } else {
            view1(&vout, (float *)out->data + off, k);
        }
        fg_status st = f(ud, pin, &vout, off);
        if (st != FG_OK) {
            FG_PRAGMA(omp critical(fg__lowp_piece))
            if (first == FG_OK) first = st;
            continue;
        }
        if (lowp(out)) fg__lowp_narrow((uint16_t *)out->data + off, buf[3], k, out->dtype);
    }
    return first;
}

typedef struct pw_ud {
    FG_MUST_USE fg_status (*fwd)(const fg_tensor *, fg_tensor *);
    FG_MUST_USE fg_status (*bwd)(const fg_tensor *, const fg_tensor *, fg_tensor *);
    fg_binary_op op;
    double a, b;
    uint64_t seed, offset;
} pw_ud;

static FG_MUST_USE fg_status pw_fwd(const void *u, const fg_tensor *const *in, fg_tensor *out,
                                    int64_t off) {
    (void)off;
    return ((const pw_ud *)u)->fwd(in[0], out);
}
static FG_MUST_USE fg_status pw_bwd(const void *u, const fg_tensor *const *in, fg_tensor *out,
                                    int64_t off) {
    (void)off;
    return ((const pw_ud *)u)->bwd(in[0], in[1], out);
}
static FG_MUST_USE fg_status pw_binary(const void *u, const fg_tensor *const *in, fg_tensor *out,
                                       int64_t off) {
    (void)off;
    return fg__cpu_binary(((const pw_ud *)u)->op, in[0], in[1], out);
}
static FG_MUST_USE fg_status pw_axpby(const void *u, const fg_tensor *const *in, fg_tensor *out,
                                      int64_t off) {
    (void)off;
    const pw_ud *d = u;
    return fg__cpu_axpby(d->a, in[0], d->b, out);
}
static FG_MUST_USE fg_status pw_scale(const void *u, const fg_tensor *const *in, fg_tensor *out,
                                      int64_t off) {
    (void)off;
    return fg__cpu_scale(in[0], ((const pw_ud *)u)->a, out);
}
/* a piece's mask draws start at the piece's first element */
static FG_MUST_USE fg_status pw_drop_fwd(const void *u, const fg_tensor *const *in, fg_tensor *out,
                                         int64_t off) {
    const pw_ud *d = u;
    return fg__cpu_dropout_fwd(in[0], d->a, d->seed, d->offset + (uint64_t)off, out);
}
static FG_MUST_USE fg_status pw_drop_bwd(const void *u, const fg_tensor *const *in, fg_tensor *out,
                                         int64_t off) {
    const pw_ud *d = u;
    return fg__cpu_dropout_bwd(in[0], d->a, d->seed, d->offset + (uint64_t)off, out);
}

/* ------------------------------------------------------------- products */

static FG_MUST_USE fg_status lp_matmul(const fg_tensor *a, bool ta, const fg_tensor *b, bool tb,
                                       fg_tensor *c_, double alpha, double beta) {
    if (!lowp(a) && !lowp(b) && !lowp(c_)) return fg__cpu_matmul(a, ta, b, tb, c_, alpha, beta);
    if (a->dtype == FG_BF16 && b->dtype == FG_BF16 && (c_->dtype == FG_F32 || c_->dtype == FG_BF16))
        return fg__cpu_matmul_bf16(a, ta, b, tb, c_, alpha, beta);
    lp c = {0};
    const fg_tensor *af = lp_in(&c, a), *bf = lp_in(&c, b);
    fg_tensor *cf = lp_out(&c, c_, beta != 0);
    LP_RUN(fg__cpu_matmul(af, ta, bf, tb, cf, alpha, beta));
}

static FG_MUST_USE fg_status lp_bias_add(fg_tensor *y, const fg_tensor *bias) {
    if (!lowp(y) && !lowp(bias)) return fg__cpu_bias_add(y, bias);
    lp c = {0};
    fg_tensor *yf = lp_out(&c, y, true);
    const fg_tensor *bf = lp_in(&c, bias);
    LP_RUN(fg__cpu_bias_add(yf, bf));
}

static FG_MUST_USE fg_status lp_bias_grad(const fg_tensor *dy, fg_tensor *db) {
    if (!lowp(dy) && !lowp(db)) return fg__cpu_bias_grad(dy, db);
    lp c = {0};
    const fg_tensor *gf = lp_in(&c, dy);
    fg_tensor *bf = lp_out(&c, db, true);
    LP_RUN(fg__cpu_bias_grad(gf, bf));
}

/* At least this many rows per block: each block's product packs w again. */
#define LIN_MIN_ROWS 256

/* Rows per block of the linear forward without a low-precision product:
 * a block of x and of y in f32 within this many bytes. */
#ifndef LIN_BLOCK_BYTES
#define LIN_BLOCK_BYTES (1 << 20)
#endif

/* Rows per block of its backward: a block of g and of x in f32 within
 * this many bytes (dw gathers over the blocks, beta 1). */
#ifndef LIN_BWD_BLOCK_BYTES
#define LIN_BWD_BLOCK_BYTES (1 << 20)
#endif

/* yf (R, out) f32 = each row the bias (f32 or bf16/f16, widened) */
static void fill_rows(float *yf, int64_t R, int64_t out, const fg_tensor *bias) {
    if (lowp(bias)) fg__lowp_widen(yf, bias->data, out, bias->dtype);
    else memcpy(yf, bias->data, sizeof(float) * (size_t)out);
    for (int64_t r = 1; r < R; r++) memcpy(yf + r * out, yf, sizeof(float) * (size_t)out);
}

fg_status fg__cpu_linear_lowp(const fg_tensor *x, const fg_tensor *w, const fg_tensor *bias,
                              fg_tensor *y) {
    if (!lowp(y) || x->dtype != y->dtype || (w->dtype != y->dtype && w->dtype != FG_F32))
        return fg_error(FG_EUNSUPPORTED,
                        "linear_lowp: x %s, w %s, y %s: expected x and y in one of bf16, f16, w "
                        "in it or in f32",
                        fg_dtype_name(x->dtype), fg_dtype_name(w->dtype), fg_dtype_name(y->dtype));
    lp c = {0};
    fg_tensor *yf = lp_out(&c, y, false);
    if (c.st) return lp_end(&c, c.st);
    fg_status st = FG_OK;
    if (y->dtype == FG_BF16 && w->dtype == FG_BF16 && fg__matmul_bf16_native()) {
        st = fg__cpu_matmul_bf16(x, false, w, true, yf, 1.0, 0.0);
        if (!st && bias) {
            const fg_tensor *bf = lp_in(&c, bias);
            st = c.st ? c.st : fg__cpu_bias_add(yf, bf);
        }
        return lp_end(&c, st);
    }
    /* no low-precision product here: the f32 product of the widened
     * operands, a block of rows at a time (x's rows widened, y's computed
     * and rounded back while they are in cache), into rows that start as
     * the bias (beta 1: no zeroing pass and no bias pass after; the bias
     * still enters before the rounding) */
    const fg_tensor *wf = lp_in(&c, w);
    if (c.st) return lp_end(&c, c.st);
    int64_t R = x->shape[0], in = x->shape[1], out = w->shape[0];
    bool fill = bias && bias->numel == out && fg_tensor_is_contiguous(bias) &&
                (bias->dtype == FG_F32 || bias->dtype == y->dtype) && fg_tensor_is_contiguous(x);
    if (!fill) { /* whole tensors */
        const fg_tensor *xf = lp_in(&c, x);
        st = c.st ? c.st : fg__cpu_matmul(xf, false, wf, true, yf, 1.0, 0.0);
        if (!st && bias) {
            const fg_tensor *bf = lp_in(&c, bias);
            st = c.st ? c.st : fg__cpu_bias_add(yf, bf);
        }
        return lp_end(&c, st);
    }
    int64_t mb = FG_MAX(LIN_MIN_ROWS, LIN_BLOCK_BYTES / ((int64_t)sizeof(float) * (in + out)));
    float *xb = scratch(c.n, sizeof(float) * (size_t)(FG_MIN(mb, R) * in));
    if (!xb) return lp_end(&c, FG_ENOMEM);
    for (int64_t r0 = 0; r0 < R && !st; r0 += mb) {
        int64_t k = FG_MIN(mb, R - r0);
        fg_tensor xv, yv;
        float *yb = (float *)yf->data + r0 * out; /* yf: y's f32 stand-in */
        view1(&xv, xb, k * in);
        view1(&yv, yb, k * out);
        fg__status_drop(fg__tensor_init_shape(&xv, FG_F32, 2, (int64_t[]){k, in}));
        fg__status_drop(fg__tensor_init_shape(&yv, FG_F32, 2, (int64_t[]){k, out}));
        fg__lowp_widen(xb, (const uint16_t *)x->data + r0 * in, k * in, x->dtype);
        fill_rows(yb, k, out, bias);
        st = fg__cpu_matmul(&xv, false, wf, true, &yv, 1.0, 1.0);
        if (!st) fg__lowp_narrow((uint16_t *)y->data + r0 * out, yb, k * out, y->dtype);
    }
    c.n = 0; /* written back above */
    return lp_end(&c, st);
}

fg_status fg__cpu_linear_lowp_bwd(const fg_tensor *x, const fg_tensor *w, const fg_tensor *g,
                                  const fg_tensor *gbias, fg_tensor *dx, double beta_dx,
                                  fg_tensor *dw, fg_tensor *db) {
    if (!lowp(g) || x->dtype != g->dtype || (w->dtype != g->dtype && w->dtype != FG_F32))
        return fg_error(FG_EUNSUPPORTED,
                        "linear_lowp_bwd: x %s, w %s, g %s: expected x and g in one of bf16, f16, "
                        "w in it or in f32",
                        fg_dtype_name(x->dtype), fg_dtype_name(w->dtype), fg_dtype_name(g->dtype));
    fg_status st = FG_OK;
    if (g->dtype == FG_BF16 && w->dtype == FG_BF16 && fg__matmul_bf16_native()) {
        if (dx) st = fg__cpu_matmul_bf16(g, false, w, false, dx, 1.0, beta_dx);
        if (!st && dw) st = fg__cpu_matmul_bf16(g, true, x, false, dw, 1.0, 1.0);
        if (!st && db) st = lp_bias_grad(gbias, db);
        return st;
    }
    /* no low-precision product here: a block of rows at a time, g's and
     * x's rows widened once for the three products while in cache */
    if (!fg_tensor_is_contiguous(x) || !fg_tensor_is_contiguous(g) || x->ndim != 2 ||
        g->ndim != 2 || (dx && !fg_tensor_is_contiguous(dx)))
        return fg_error(FG_EINVAL, "linear_lowp_bwd: x, g and dx must be contiguous (R, n)");
    int64_t R = g->shape[0], out = g->shape[1], in = x->shape[1];
    lp c = {0};
    const fg_tensor *wf = dx ? lp_in(&c, w) : NULL;
    fg_tensor *dwf = dw ? lp_out(&c, dw, true) : NULL;
    bool bias_blocks = db && gbias == g;
    fg_tensor *dbf = db ? lp_out(&c, db, true) : NULL;
    if (c.st) return lp_end(&c, c.st);
    if (db && !bias_blocks) { /* the f32 gradient before its rounding: as it is */
        const fg_tensor *gsrc = lp_in(&c, gbias);
        st = c.st ? c.st : fg__cpu_bias_grad(gsrc, dbf);
    }
    int64_t mb = FG_MAX(LIN_MIN_ROWS, LIN_BWD_BLOCK_BYTES / ((int64_t)sizeof(float) * (in + out)));
    mb = FG_MIN(mb, R);
    float *gb = scratch(LP_MAX - 3, sizeof(float) * (size_t)(mb * out));
    float *xb = dw ? scratch(LP_MAX - 2, sizeof(float) * (size_t)(mb * in)) : NULL;
    float *db_ = dx && lowp(dx) ? scratch(LP_MAX - 1, sizeof(float) * (size_t)(mb * in)) : NULL;
    if (!gb || (dw && !xb) || (dx && lowp(dx) && !db_)) return lp_end(&c, FG_ENOMEM);
    for (int64_t r0 = 0; r0 < R && !st; r0 += mb) {
        int64_t k = FG_MIN(mb, R - r0);
        fg_tensor gv, xv, dv;
        view1(&gv, gb, k * out);
        fg__status_drop(fg__tensor_init_shape(&gv, FG_F32, 2, (int64_t[]){k, out}));
        fg__lowp_widen(gb, (const uint16_t *)g->data + r0 * out, k * out, g->dtype);
        if (dx) {
            float *d = lowp(dx) ? db_ : (float *)dx->data + r0 * in;
            view1(&dv, d, k * in);
            fg__status_drop(fg__tensor_init_shape(&dv, FG_F32, 2, (int64_t[]){k, in}));
            if (lowp(dx) && beta_dx != 0)
                fg__lowp_widen(d, (const uint16_t *)dx->data + r0 * in, k * in, dx->dtype);
            st = fg__cpu_matmul(&gv, false, wf, false, &dv, 1.0, beta_dx);
            if (!st && lowp(dx))
                fg__lowp_narrow((uint16_t *)dx->data + r0 * in, d, k * in, dx->dtype);
        }
        if (!st && dw) {
            view1(&xv, xb, k * in);
            fg__status_drop(fg__tensor_init_shape(&xv, FG_F32, 2, (int64_t[]){k, in}));
            fg__lowp_widen(xb, (const uint16_t *)x->data + r0 * in, k * in, x->dtype);
            st = fg__cpu_matmul(&gv, true, &xv, false, dwf, 1.0, 1.0);
        }
        if (!st && bias_blocks) st = fg__cpu_bias_grad(&gv, dbf);
    }
    return lp_end(&c, st);
}

/* ----------------------------------------------------------- elementwise */

static FG_MUST_USE fg_status lp_binary(fg_binary_op op, const fg_tensor *a, const fg_tensor *b,
                                       fg_tensor *y) {
    if (!lowp(a) && !lowp(b) && !lowp(y)) return fg__cpu_binary(op, a, b, y);
    const fg_tensor *in[2] = {a, b};
    if (pw_ok(2, in, y) && fg_tensor_same_shape(a, y) && fg_tensor_same_shape(b, y))
        return piecewise(2, in, y, false, pw_binary, &(pw_ud){.op = op});
    lp c = {0};
    const fg_tensor *af = lp_in(&c, a), *bf = lp_in(&c, b);
    fg_tensor *yf = lp_out(&c, y, false);
    LP_RUN(fg__cpu_binary(op, af, bf, yf));
}

static FG_MUST_USE fg_status lp_sum_to(const fg_tensor *x, fg_tensor *y, double alpha,
                                       double beta) {
    if (!lowp(x) && !lowp(y)) return fg__cpu_sum_to(x, y, alpha, beta);
    lp c = {0};
    const fg_tensor *xf = lp_in(&c, x);
    fg_tensor *yf = lp_out(&c, y, beta != 0);
    LP_RUN(fg__cpu_sum_to(xf, yf, alpha, beta));
}

static FG_MUST_USE fg_status lp_axpby(double alpha, const fg_tensor *x, double beta, fg_tensor *y) {
    if (!lowp(x) && !lowp(y)) return fg__cpu_axpby(alpha, x, beta, y);
    if (pw_ok(1, &x, y))
        return piecewise(1, &x, y, beta != 0, pw_axpby, &(pw_ud){.a = alpha, .b = beta});
    lp c = {0};
    const fg_tensor *xf = lp_in(&c, x);
    fg_tensor *yf = lp_out(&c, y, beta != 0);
    LP_RUN(fg__cpu_axpby(alpha, xf, beta, yf));
}

static FG_MUST_USE fg_status lp_scale(const fg_tensor *x, double s, fg_tensor *y) {
    if (!lowp(x) && !lowp(y)) return fg__cpu_scale(x, s, y);
    if (pw_ok(1, &x, y)) return piecewise(1, &x, y, false, pw_scale, &(pw_ud){.a = s});
    lp c = {0};
    const fg_tensor *xf = lp_in(&c, x);
    fg_tensor *yf = lp_out(&c, y, false);
    LP_RUN(fg__cpu_scale(xf, s, yf));
}

static FG_MUST_USE fg_status lp_sum_all(const fg_tensor *x, double *out) {
    if (!lowp(x)) return fg__cpu_sum_all(x, out);
    lp c = {0};
    const fg_tensor *xf = lp_in(&c, x);
    LP_RUN(fg__cpu_sum_all(xf, out));
}

static FG_MUST_USE fg_status lp_sumsq_all(const fg_tensor *x, double *out) {
    if (!lowp(x)) return fg__cpu_sumsq_all(x, out);
    lp c = {0};
    const fg_tensor *xf = lp_in(&c, x);
    LP_RUN(fg__cpu_sumsq_all(xf, out));
}

static FG_MUST_USE fg_status lp_sum_dim(const fg_tensor *x, int dim, fg_tensor *y, double alpha) {
    if (!lowp(x) && !lowp(y)) return fg__cpu_sum_dim(x, dim, y, alpha);
    lp c = {0};
    const fg_tensor *xf = lp_in(&c, x);
    fg_tensor *yf = lp_out(&c, y, false);
    LP_RUN(fg__cpu_sum_dim(xf, dim, yf, alpha));
}

static FG_MUST_USE fg_status lp_sum_dim_bwd(const fg_tensor *dy, int dim, fg_tensor *dx,
                                            double alpha) {
    if (!lowp(dy) && !lowp(dx)) return fg__cpu_sum_dim_bwd(dy, dim, dx, alpha);
    lp c = {0};
    const fg_tensor *gf = lp_in(&c, dy);
    fg_tensor *xf = lp_out(&c, dx, true);
    LP_RUN(fg__cpu_sum_dim_bwd(gf, dim, xf, alpha));
}

/* ----------------------------------------------------------- activations */

typedef FG_MUST_USE fg_status (*fwd_fn)(const fg_tensor *, fg_tensor *);
typedef FG_MUST_USE fg_status (*bwd_fn)(const fg_tensor *, const fg_tensor *, fg_tensor *);

static FG_MUST_USE fg_status unary_fwd(fwd_fn k, const fg_tensor *x, fg_tensor *y) {
    if (!lowp(x) && !lowp(y)) return k(x, y);
    /* softmax's rows are not elementwise: they take the generic path */
    if (k != fg__cpu_softmax_fwd && k != fg__cpu_log_softmax_fwd && pw_ok(1, &x, y))
        return piecewise(1, &x, y, false, pw_fwd, &(pw_ud){.fwd = k});
    lp c = {0};
    const fg_tensor *xf = lp_in(&c, x);
    fg_tensor *yf = lp_out(&c, y, false);
    LP_RUN(k(xf, yf));
}

/* softmax's backward reads whole rows: it takes the generic path */
static FG_MUST_USE fg_status unary_bwd(bwd_fn k, const fg_tensor *x, const fg_tensor *dy,
                                       fg_tensor *dx) {
    if (!lowp(x) && !lowp(dy) && !lowp(dx)) return k(x, dy, dx);
    const fg_tensor *in[2] = {x, dy};
    if (k != fg__cpu_softmax_bwd && k != fg__cpu_log_softmax_bwd && pw_ok(2, in, dx))
        return piecewise(2, in, dx, true, pw_bwd, &(pw_ud){.bwd = k});
    lp c = {0};
    const fg_tensor *xf = lp_in(&c, x), *gf = lp_in(&c, dy);
    fg_tensor *df = lp_out(&c, dx, true);
    LP_RUN(k(xf, gf, df));
}

static FG_MUST_USE fg_status lp_relu_fwd(const fg_tensor *x, fg_tensor *y) {
    return unary_fwd(fg__cpu_relu_fwd, x, y);
}
static FG_MUST_USE fg_status lp_relu_bwd(const fg_tensor *x, const fg_tensor *dy, fg_tensor *dx) {
    return unary_bwd(fg__cpu_relu_bwd, x, dy, dx);
}
static FG_MUST_USE fg_status lp_gelu_fwd(const fg_tensor *x, fg_tensor *y) {
    return unary_fwd(fg__cpu_gelu_fwd, x, y);
}
static FG_MUST_USE fg_status lp_gelu_bwd(const fg_tensor *x, const fg_tensor *dy, fg_tensor *dx) {
    return unary_bwd(fg__cpu_gelu_bwd, x, dy, dx);
}
static FG_MUST_USE fg_status lp_softmax_fwd(const fg_tensor *x, fg_tensor *y) {
    return unary_fwd(fg__cpu_softmax_fwd, x, y);
}
static FG_MUST_USE fg_status lp_softmax_bwd(const fg_tensor *y, const fg_tensor *dy,
                                            fg_tensor *dx) {
    return unary_bwd(fg__cpu_softmax_bwd, y, dy, dx);
}
static FG_MUST_USE fg_status lp_log_softmax_fwd(const fg_tensor *x, fg_tensor *y) {
    return unary_fwd(fg__cpu_log_softmax_fwd, x, y);
}
static FG_MUST_USE fg_status lp_log_softmax_bwd(const fg_tensor *y, const fg_tensor *dy,
                                                fg_tensor *dx) {
    return unary_bwd(fg__cpu_log_softmax_bwd, y, dy, dx);
}

/* ----------------------------------------------------------------- losses */

static FG_MUST_USE fg_status lp_ce_fwd(const fg_tensor *logits, const fg_tensor *targets,
                                       int64_t ignore, fg_tensor *loss, int64_t *count) {
    if (!lowp(logits) && !lowp(loss))
        return fg__cpu_cross_entropy_fwd(logits, targets, ignore, loss, count);
    lp c = {0};
    const fg_tensor *lf = lp_in(&c, logits);
    fg_tensor *of = lp_out(&c, loss, false);
    LP_RUN(fg__cpu_cross_entropy_fwd(lf, targets, ignore, of, count));
}

static FG_MUST_USE fg_status lp_ce_bwd(const fg_tensor *logits, const fg_tensor *targets,
                                       int64_t ignore, double dloss, int64_t count,
                                       fg_tensor *dlogits) {
    if (!lowp(logits) && !lowp(dlogits))
        return fg__cpu_cross_entropy_bwd(logits, targets, ignore, dloss, count, dlogits);
    lp c = {0};
    const fg_tensor *lf = lp_in(&c, logits);
    fg_tensor *df = lp_out(&c, dlogits, true);
    LP_RUN(fg__cpu_cross_entropy_bwd(lf, targets, ignore, dloss, count, df));
}

/* stats (2, N) f64 stays as it is */
static FG_MUST_USE fg_status lp_ce_fwd_stats(const fg_tensor *logits, const fg_tensor *targets,
                                             int64_t ignore, fg_tensor *loss, int64_t *count,
                                             fg_tensor *stats) {
    if (!lowp(logits) && !lowp(loss))
        return fg__cpu_cross_entropy_fwd_stats(logits, targets, ignore, loss, count, stats);
    lp c = {0};
    const fg_tensor *lf = lp_in(&c, logits);
    fg_tensor *of = lp_out(&c, loss, false);
    LP_RUN(fg__cpu_cross_entropy_fwd_stats(lf, targets, ignore, of, count, stats));
}

static FG_MUST_USE fg_status lp_ce_bwd_stats(const fg_tensor *logits, const fg_tensor *targets,
                                             const fg_tensor *stats, int64_t ignore, double dloss,
                                             int64_t count, fg_tensor *dlogits) {
    if (!lowp(logits) && !lowp(dlogits))
        return fg__cpu_cross_entropy_bwd_stats(logits, targets, stats, ignore, dloss, count,
                                               dlogits);
    lp c = {0};
    const fg_tensor *lf = lp_in(&c, logits);
    fg_tensor *df = lp_out(&c, dlogits, true);
    LP_RUN(fg__cpu_cross_entropy_bwd_stats(lf, targets, stats, ignore, dloss, count, df));
}

/* --------------------------------------------------------- normalisation */

static FG_MUST_USE fg_status lp_ln_fwd(const fg_tensor *x, const fg_tensor *w, const fg_tensor *b,
                                       double eps, fg_tensor *y, fg_tensor *mean, fg_tensor *rstd) {
    if (!lowp(x) && !lowp(w) && !lowp(b) && !lowp(y) && !lowp(mean) && !lowp(rstd))
        return fg__cpu_layernorm_fwd(x, w, b, eps, y, mean, rstd);
    lp c = {0};
    const fg_tensor *xf = lp_in(&c, x), *wf = lp_in(&c, w), *bf = lp_in(&c, b);
    fg_tensor *yf = lp_out(&c, y, false), *mf = lp_out(&c, mean, false),
              *rf = lp_out(&c, rstd, false);
    LP_RUN(fg__cpu_layernorm_fwd(xf, wf, bf, eps, yf, mf, rf));
}

static FG_MUST_USE fg_status lp_ln_bwd(const fg_tensor *x, const fg_tensor *w,
                                       const fg_tensor *mean, const fg_tensor *rstd,
                                       const fg_tensor *dy, fg_tensor *dx, fg_tensor *dw,
                                       fg_tensor *db) {
    if (!lowp(x) && !lowp(w) && !lowp(mean) && !lowp(rstd) && !lowp(dy) && !lowp(dx) && !lowp(dw) &&
        !lowp(db))
        return fg__cpu_layernorm_bwd(x, w, mean, rstd, dy, dx, dw, db);
    lp c = {0};
    const fg_tensor *xf = lp_in(&c, x), *wf = lp_in(&c, w), *mf = lp_in(&c, mean),
                    *rf = lp_in(&c, rstd), *gf = lp_in(&c, dy);
    fg_tensor *dxf = dx ? lp_out(&c, dx, true) : NULL, *dwf = dw ? lp_out(&c, dw, true) : NULL,
              *dbf = db ? lp_out(&c, db, true) : NULL;
    LP_RUN(fg__cpu_layernorm_bwd(xf, wf, mf, rf, gf, dxf, dwf, dbf));
}

/* ------------------------------------------------- embedding, dropout */

static FG_MUST_USE fg_status lp_emb_fwd(const fg_tensor *idx, const fg_tensor *weight,
                                        fg_tensor *y) {
    if (!lowp(weight) && !lowp(y)) return fg__cpu_embedding_fwd(idx, weight, y);
    if (weight->dtype == y->dtype && fg_tensor_is_contiguous(weight) &&
        fg_tensor_is_contiguous(y) && weight->ndim == 2 && y->ndim == 2 && idx->ndim == 1 &&
        idx->dtype == FG_I32 && y->shape[0] == idx->numel && y->shape[1] == weight->shape[1]) {
        /* a lookup copies rows: no rounding, so no conversion either */
        int64_t V = weight->shape[0], C = weight->shape[1];
        const int32_t *ix = idx->data;
        for (int64_t i = 0; i < idx->numel; i++)
            if (ix[i] < 0 || ix[i] >= V)
                return fg_error(FG_EINVAL,
                                "embedding_fwd: index %lld at position %lld is out of "
                                "[0, %lld)",
                                (long long)ix[i], (long long)i, (long long)V);
        const uint16_t *w = weight->data;
        uint16_t *py = y->data;
        for (int64_t i = 0; i < idx->numel; i++)
            memcpy(py + i * C, w + (int64_t)ix[i] * C, sizeof(uint16_t) * (size_t)C);
        return FG_OK;
    }
    lp c = {0};
    const fg_tensor *wf = lp_in(&c, weight);
    fg_tensor *yf = lp_out(&c, y, false);
    LP_RUN(fg__cpu_embedding_fwd(idx, wf, yf));
}

static FG_MUST_USE fg_status lp_emb_bwd(const fg_tensor *idx, const fg_tensor *dy,
                                        fg_tensor *dweight) {
    if (!lowp(dy) && !lowp(dweight)) return fg__cpu_embedding_bwd(idx, dy, dweight);
    lp c = {0};
    const fg_tensor *gf = lp_in(&c, dy);
    fg_tensor *wf = lp_out(&c, dweight, true);
    LP_RUN(fg__cpu_embedding_bwd(idx, gf, wf));
}

static FG_MUST_USE fg_status lp_dropout_fwd(const fg_tensor *x, double p, uint64_t seed,
                                            uint64_t offset, fg_tensor *y) {
    if (!lowp(x) && !lowp(y)) return fg__cpu_dropout_fwd(x, p, seed, offset, y);
    if (pw_ok(1, &x, y))
        return piecewise(1, &x, y, false, pw_drop_fwd,
                         &(pw_ud){.a = p, .seed = seed, .offset = offset});
    lp c = {0};
    const fg_tensor *xf = lp_in(&c, x);
    fg_tensor *yf = lp_out(&c, y, false);
    LP_RUN(fg__cpu_dropout_fwd(xf, p, seed, offset, yf));
}

static FG_MUST_USE fg_status lp_dropout_bwd(const fg_tensor *dy, double p, uint64_t seed,
                                            uint64_t offset, fg_tensor *dx) {
    if (!lowp(dy) && !lowp(dx)) return fg__cpu_dropout_bwd(dy, p, seed, offset, dx);
    if (pw_ok(1, &dy, dx))
        return piecewise(1, &dy, dx, true, pw_drop_bwd,
                         &(pw_ud){.a = p, .seed = seed, .offset = offset});
    lp c = {0};
    const fg_tensor *gf = lp_in(&c, dy);
    fg_tensor *xf = lp_out(&c, dx, true);
    LP_RUN(fg__cpu_dropout_bwd(gf, p, seed, offset, xf));
}

/* -------------------------------------------------------------- attention */

/* Attention on bf16/f16 tensors runs a few batch entries at a time: each
 * chunk's operands are widened into the thread's scratch (a chunk of qkv
 * is T x 3C floats, a few hundred KiB: it stays in the second-level cache
 * for the kernel), the f32 kernel runs on the chunk, and its outputs are
 * rounded back before the next chunk. Whole tensors would go through
 * memory three times (widen, kernel, round) instead of once. */
#define ATT_CHUNK_BYTES (512 << 10)

/* a chunk of t: batch entries [b0, b0 + nb) of its dim 0, as an f32 tensor
 * in v: t's own memory when t is f32, else the scratch of slot, widened
 * unless `fresh` (an output the kernel overwrites) */
static FG_MUST_USE fg_status att_chunk(fg_tensor *v, const fg_tensor *t, int64_t b0, int64_t nb,
                                       int slot, bool fresh) {
    int64_t shape[FG_MAX_DIMS], per = t->numel / t->shape[0];
    for (int d = 0; d < t->ndim; d++) shape[d] = t->shape[d];
    shape[0] = nb;
    memset(v, 0, sizeof *v);
    FG_TRY(fg__tensor_init_shape(v, FG_F32, t->ndim, shape));
    v->device = t->device;
    if (!lowp(t)) {
        v->data = (float *)t->data + b0 * per;
        return FG_OK;
    }
    if (!(v->data = scratch(slot, sizeof(float) * (size_t)(nb * per))))
        return fg_error(FG_ENOMEM, "attention: %lld floats for a chunk of a %s tensor",
                        (long long)(nb * per), fg_dtype_name(t->dtype));
    if (!fresh) fg__lowp_widen(v->data, (const uint16_t *)t->data + b0 * per, nb * per, t->dtype);
    return FG_OK;
}

/* the mask rows [b0, b0 + nb) of kpm (B, T) as a view in v; NULL for none */
static const fg_tensor *att_mask_rows(fg_tensor *v, const fg_tensor *kpm, int64_t b0, int64_t nb) {
    if (!kpm || kpm->ndim != 2) return kpm; /* the kernel names what is wrong */
    *v = *kpm;
    v->shape[0] = nb;
    v->numel = nb * kpm->shape[1];
    v->data = (char *)kpm->data + (size_t)(b0 * kpm->shape[1]) * fg_dtype_size(kpm->dtype);
    return v;
}

/* v's values back into t's entries from b0, rounded, when t is bf16/f16 */
static void att_store(fg_tensor *t, const fg_tensor *v, int64_t b0) {
    if (lowp(t))
        fg__lowp_narrow((uint16_t *)t->data + b0 * (t->numel / t->shape[0]), v->data, v->numel,
                        t->dtype);
}

/* whether the chunked path takes a call: 3-d contiguous f32 or bf16/f16
 * tensors with one batch dimension, qkv a whole number of (T, 3C) rows */
static bool att_chunkable(int n, const fg_tensor *const *t) {
    for (int k = 0; k < n; k++)
        if (!t[k] || t[k]->ndim != 3 || !fg_tensor_is_contiguous(t[k]) ||
            t[k]->shape[0] != t[0]->shape[0] || t[k]->shape[0] == 0 ||
            (t[k]->dtype != FG_F32 && !lowp(t[k])))
            return false;
    return true;
}

/* batch entries per chunk: a chunk of qkv within ATT_CHUNK_BYTES per
 * thread, at least one entry per thread */
static int64_t att_nb(const fg_tensor *qkv) {
    int64_t per = (int64_t)sizeof(float) * (qkv->numel / qkv->shape[0]);
    int64_t th = fg_get_num_threads() > 1 ? fg_get_num_threads() : 1;
    int64_t nb = FG_MAX(th, th * (ATT_CHUNK_BYTES / FG_MAX(per, 1)));
    return FG_MIN(nb, qkv->shape[0]);
}

static FG_MUST_USE fg_status lp_att_fwd(const fg_tensor *qkv, int heads, bool causal,
                                        const fg_tensor *kpm, fg_tensor *y, fg_tensor *lse) {
    if (!lowp(qkv) && !lowp(y) && !lowp(lse))
        return fg__cpu_attention_fwd(qkv, heads, causal, kpm, y, lse);
    const fg_tensor *all[3] = {qkv, y, lse};
    if (att_chunkable(3, all)) {
        int64_t B = qkv->shape[0], nb = att_nb(qkv);
        for (int64_t b0 = 0; b0 < B; b0 += nb) {
            int64_t k = FG_MIN(nb, B - b0);
            fg_tensor q, yv, lv, mv;
            FG_TRY(att_chunk(&q, qkv, b0, k, 0, false));
            FG_TRY(att_chunk(&yv, y, b0, k, 1, true));
            FG_TRY(att_chunk(&lv, lse, b0, k, 2, true));
            FG_TRY(
                fg__cpu_attention_fwd(&q, heads, causal, att_mask_rows(&mv, kpm, b0, k), &yv, &lv));
            att_store(y, &yv, b0);
            att_store(lse, &lv, b0);
        }
        return FG_OK;
    }
    lp c = {0};
    const fg_tensor *qf = lp_in(&c, qkv);
    fg_tensor *yf = lp_out(&c, y, false), *lf = lp_out(&c, lse, false);
    LP_RUN(fg__cpu_attention_fwd(qf, heads, causal, kpm, yf, lf));
}

static FG_MUST_USE fg_status lp_att_bwd(const fg_tensor *qkv, int heads, bool causal,
                                        const fg_tensor *kpm, const fg_tensor *y,
                                        const fg_tensor *lse, const fg_tensor *dy,
                                        fg_tensor *dqkv) {
    if (!lowp(qkv) && !lowp(y) && !lowp(lse) && !lowp(dy) && !lowp(dqkv))
        return fg__cpu_attention_bwd(qkv, heads, causal, kpm, y, lse, dy, dqkv);
    const fg_tensor *all[5] = {qkv, y, lse, dy, dqkv};
    if (att_chunkable(5, all)) {
        int64_t B = qkv->shape[0], nb = att_nb(qkv);
        for (int64_t b0 = 0; b0 < B; b0 += nb) {
            int64_t k = FG_MIN(nb, B - b0);
            fg_tensor q, yv, lv, gv, dv, mv;
            FG_TRY(att_chunk(&q, qkv, b0, k, 0, false));
            FG_TRY(att_chunk(&yv, y, b0, k, 1, false));
            FG_TRY(att_chunk(&lv, lse, b0, k, 2, false));
            FG_TRY(att_chunk(&gv, dy, b0, k, 3, false));
            FG_TRY(att_chunk(&dv, dqkv, b0, k, 4, false)); /* the kernel accumulates */
            FG_TRY(fg__cpu_attention_bwd(&q, heads, causal, att_mask_rows(&mv, kpm, b0, k), &yv,
                                         &lv, &gv, &dv));
            att_store(dqkv, &dv, b0);
        }
        return FG_OK;
    }
    lp c = {0};
    const fg_tensor *qf = lp_in(&c, qkv), *yf = lp_in(&c, y), *lf = lp_in(&c, lse),
                    *gf = lp_in(&c, dy);
    fg_tensor *df = lp_out(&c, dqkv, true);
    LP_RUN(fg__cpu_attention_bwd(qf, heads, causal, kpm, yf, lf, gf, df));
}

/* ------------------------------------------- functions and losses of user models */
/* bf16/f16 through f32 copies, as above (add_strided element by element);
 * index_select copies any dtype and the NLL rows take f32 and f64 (the
 * losses run after autocast's f32 log_softmax): they go straight to the
 * kernels. */

static FG_MUST_USE fg_status lp_unary_fwd(fg_unary_op op, const fg_tensor *x, double a, double b,
                                          fg_tensor *y) {
    if (!lowp(x) && !lowp(y)) return fg__cpu_unary_fwd(op, x, a, b, y);
    lp c = {0};
    const fg_tensor *xf = lp_in(&c, x);
    fg_tensor *yf = lp_out(&c, y, false);
    LP_RUN(fg__cpu_unary_fwd(op, xf, a, b, yf));
}

static FG_MUST_USE fg_status lp_unary_bwd(fg_unary_op op, const fg_tensor *x, const fg_tensor *y,
                                          const fg_tensor *dy, double a, double b, fg_tensor *dx) {
    if (!lowp(x) && !lowp(y) && !lowp(dy) && !lowp(dx))
        return fg__cpu_unary_bwd(op, x, y, dy, a, b, dx);
    lp c = {0};
    const fg_tensor *xf = lp_in(&c, x), *yf = lp_in(&c, y), *gf = lp_in(&c, dy);
    fg_tensor *df = lp_out(&c, dx, true);
    LP_RUN(fg__cpu_unary_bwd(op, xf, yf, gf, a, b, df));
}

static FG_MUST_USE fg_status lp_ploss_fwd(fg_loss_op op, const fg_tensor *x, const fg_tensor *t,
                                          const fg_tensor *w, double p, fg_tensor *y) {
    if (!lowp(x) && !lowp(t) && !lowp(w) && !lowp(y))
        return fg__cpu_pointwise_loss_fwd(op, x, t, w, p, y);
    lp c = {0};
    const fg_tensor *xf = lp_in(&c, x), *tf = lp_in(&c, t), *wf = lp_in(&c, w);
    fg_tensor *yf = lp_out(&c, y, false);
    LP_RUN(fg__cpu_pointwise_loss_fwd(op, xf, tf, wf, p, yf));
}

static FG_MUST_USE fg_status lp_ploss_bwd(fg_loss_op op, const fg_tensor *x, const fg_tensor *t,
                                          const fg_tensor *w, double p, const fg_tensor *dy,
                                          fg_tensor *dx, fg_tensor *dt) {
    if (!lowp(x) && !lowp(t) && !lowp(w) && !lowp(dy) && !lowp(dx) && !lowp(dt))
        return fg__cpu_pointwise_loss_bwd(op, x, t, w, p, dy, dx, dt);
    lp c = {0};
    const fg_tensor *xf = lp_in(&c, x), *tf = lp_in(&c, t), *wf = lp_in(&c, w), *gf = lp_in(&c, dy);
    fg_tensor *dxf = dx ? lp_out(&c, dx, true) : NULL, *dtf = dt ? lp_out(&c, dt, true) : NULL;
    LP_RUN(fg__cpu_pointwise_loss_bwd(op, xf, tf, wf, p, gf, dxf, dtf));
}

/* y += x across layouts: y is a strided view (a gradient's slice), so it
 * cannot stand in; bf16/f16 elements are widened and rounded one at a
 * time (the same value as f32 arithmetic rounded once per element). */
static FG_MUST_USE fg_status lp_add_strided(const fg_tensor *x, fg_tensor *y) {
    if (!lowp(x) && !lowp(y)) return fg__cpu_add_strided(x, y);
    if (!fg_tensor_same_shape(x, y) || x->dtype != y->dtype)
        return fg_error(FG_EINVAL, "add_strided: one shape and dtype expected");
    int64_t idx[FG_MAX_DIMS] = {0};
    const uint16_t *px = x->data;
    uint16_t *py = y->data;
    for (int64_t i = 0; i < x->numel; i++) {
        int64_t ox = 0, oy = 0;
        for (int d = 0; d < x->ndim; d++) {
            ox += idx[d] * x->strides[d];
            oy += idx[d] * y->strides[d];
        }
        float a, b;
        fg__lowp_widen(&a, px + ox, 1, x->dtype);
        fg__lowp_widen(&b, py + oy, 1, y->dtype);
        b += a;
        fg__lowp_narrow(py + oy, &b, 1, y->dtype);
        for (int d = x->ndim - 1; d >= 0; d--) {
            if (++idx[d] < x->shape[d]) break;
            idx[d] = 0;
        }
    }
    return FG_OK;
}

static FG_MUST_USE fg_status lp_where(const fg_tensor *cond, const fg_tensor *a, const fg_tensor *b,
                                      double va, double vb, fg_tensor *y) {
    if (!lowp(a) && !lowp(b) && !lowp(y)) return fg__cpu_where(cond, a, b, va, vb, y);
    lp c = {0};
    const fg_tensor *af = lp_in(&c, a), *bf = lp_in(&c, b);
    fg_tensor *yf = lp_out(&c, y, false);
    LP_RUN(fg__cpu_where(cond, af, bf, va, vb, yf));
}

static FG_MUST_USE fg_status lp_index_add(const fg_tensor *dy, int dim, const fg_tensor *idx,
                                          fg_tensor *dx) {
    if (!lowp(dy) && !lowp(dx)) return fg__cpu_index_add(dy, dim, idx, dx);
    lp c = {0};
    const fg_tensor *gf = lp_in(&c, dy);
    fg_tensor *df = lp_out(&c, dx, true);
    LP_RUN(fg__cpu_index_add(gf, dim, idx, df));
}

static FG_MUST_USE fg_status lp_gather(const fg_tensor *x, int dim, const fg_tensor *idx,
                                       fg_tensor *y) {
    if (!lowp(x) && !lowp(y)) return fg__cpu_gather(x, dim, idx, y);
    lp c = {0};
    const fg_tensor *xf = lp_in(&c, x);
    fg_tensor *yf = lp_out(&c, y, false);
    LP_RUN(fg__cpu_gather(xf, dim, idx, yf));
}

static FG_MUST_USE fg_status lp_scatter_add(const fg_tensor *src, int dim, const fg_tensor *idx,
                                            fg_tensor *y) {
    if (!lowp(src) && !lowp(y)) return fg__cpu_scatter_add(src, dim, idx, y);
    lp c = {0};
    const fg_tensor *sf = lp_in(&c, src);
    fg_tensor *yf = lp_out(&c, y, true);
    LP_RUN(fg__cpu_scatter_add(sf, dim, idx, yf));
}

static FG_MUST_USE fg_status lp_max_dim(const fg_tensor *x, int dim, bool is_min, fg_tensor *y,
                                        fg_tensor *idx) {
    if (!lowp(x) && !lowp(y)) return fg__cpu_max_dim(x, dim, is_min, y, idx);
    lp c = {0};
    const fg_tensor *xf = lp_in(&c, x);
    fg_tensor *yf = lp_out(&c, y, false);
    LP_RUN(fg__cpu_max_dim(xf, dim, is_min, yf, idx));
}

static FG_MUST_USE fg_status lp_cumsum(const fg_tensor *x, int dim, bool reverse, fg_tensor *y) {
    if (!lowp(x) && !lowp(y)) return fg__cpu_cumsum(x, dim, reverse, y);
    lp c = {0};
    const fg_tensor *xf = lp_in(&c, x);
    fg_tensor *yf = lp_out(&c, y, false);
    LP_RUN(fg__cpu_cumsum(xf, dim, reverse, yf));
}

static FG_MUST_USE fg_status lp_conv_fwd(const fg_tensor *x, const fg_tensor *w, const fg_tensor *b,
                                         const fg_conv_params *p, fg_tensor *y) {
    if (!lowp(x) && !lowp(w) && !lowp(b) && !lowp(y)) return fg__cpu_conv2d_fwd(x, w, b, p, y);
    lp c = {0};
    const fg_tensor *xf = lp_in(&c, x), *wf = lp_in(&c, w), *bf = lp_in(&c, b);
    fg_tensor *yf = lp_out(&c, y, false);
    LP_RUN(fg__cpu_conv2d_fwd(xf, wf, bf, p, yf));
}

static FG_MUST_USE fg_status lp_conv_bwd_data(const fg_tensor *dy, const fg_tensor *w,
                                              const fg_conv_params *p, fg_tensor *dx) {
    if (!lowp(dy) && !lowp(w) && !lowp(dx)) return fg__cpu_conv2d_bwd_data(dy, w, p, dx);
    lp c = {0};
    const fg_tensor *gf = lp_in(&c, dy), *wf = lp_in(&c, w);
    fg_tensor *df = lp_out(&c, dx, !p->overwrite);
    LP_RUN(fg__cpu_conv2d_bwd_data(gf, wf, p, df));
}

static FG_MUST_USE fg_status lp_conv_bwd_weight(const fg_tensor *x, const fg_tensor *dy,
                                                const fg_conv_params *p, fg_tensor *dw,
                                                fg_tensor *db) {
    if (!lowp(x) && !lowp(dy) && !lowp(dw) && !lowp(db))
        return fg__cpu_conv2d_bwd_weight(x, dy, p, dw, db);
    lp c = {0};
    const fg_tensor *xf = lp_in(&c, x), *gf = lp_in(&c, dy);
    fg_tensor *dwf = dw ? lp_out(&c, dw, true) : NULL, *dbf = db ? lp_out(&c, db, true) : NULL;
    LP_RUN(fg__cpu_conv2d_bwd_weight(xf, gf, p, dwf, dbf));
}

static FG_MUST_USE fg_status lp_pool_fwd(const fg_tensor *x, const fg_pool_params *p, fg_tensor *y,
                                         fg_tensor *idx) {
    if (!lowp(x) && !lowp(y)) return fg__cpu_pool2d_fwd(x, p, y, idx);
    lp c = {0};
    const fg_tensor *xf = lp_in(&c, x);
    fg_tensor *yf = lp_out(&c, y, false);
    LP_RUN(fg__cpu_pool2d_fwd(xf, p, yf, idx));
}

static FG_MUST_USE fg_status lp_pool_bwd(const fg_tensor *dy, const fg_tensor *idx,
                                         const fg_pool_params *p, fg_tensor *dx) {
    if (!lowp(dy) && !lowp(dx)) return fg__cpu_pool2d_bwd(dy, idx, p, dx);
    lp c = {0};
    const fg_tensor *gf = lp_in(&c, dy);
    fg_tensor *df = lp_out(&c, dx, true);
    LP_RUN(fg__cpu_pool2d_bwd(gf, idx, p, df));
}

const fg_op_table fg__cpu_ops_lowp = {
    .device = "cpu",
    .matmul = lp_matmul,
    .bias_add = lp_bias_add,
    .bias_grad = lp_bias_grad,
    .attention_fwd = lp_att_fwd,
    .attention_bwd = lp_att_bwd,
    .binary = lp_binary,
    .sum_to = lp_sum_to,
    .axpby = lp_axpby,
    .scale = lp_scale,
    .sum_all = lp_sum_all,
    .sumsq_all = lp_sumsq_all,
    .sum_dim = lp_sum_dim,
    .sum_dim_bwd = lp_sum_dim_bwd,
    .relu_fwd = lp_relu_fwd,
    .relu_bwd = lp_relu_bwd,
    .gelu_fwd = lp_gelu_fwd,
    .gelu_bwd = lp_gelu_bwd,
    .softmax_fwd = lp_softmax_fwd,
    .softmax_bwd = lp_softmax_bwd,
    .log_softmax_fwd = lp_log_softmax_fwd,
    .log_softmax_bwd = lp_log_softmax_bwd,
    .cross_entropy_fwd = lp_ce_fwd,
    .cross_entropy_bwd = lp_ce_bwd,
    .cross_entropy_fwd_stats = lp_ce_fwd_stats,
    .cross_entropy_bwd_stats = lp_ce_bwd_stats,
    .layernorm_fwd = lp_ln_fwd,
    .layernorm_bwd = lp_ln_bwd,
    .embedding_fwd = lp_emb_fwd,
    .embedding_bwd = lp_emb_bwd,
    .dropout_fwd = lp_dropout_fwd,
    .dropout_bwd = lp_dropout_bwd,
    .unary_fwd = lp_unary_fwd,
    .unary_bwd = lp_unary_bwd,
    .add_strided = lp_add_strided,
    .where = lp_where,
    .index_select = fg__cpu_index_select,
    .index_add = lp_index_add,
    .gather = lp_gather,
    .scatter_add = lp_scatter_add,
    .max_dim = lp_max_dim,
    .cumsum = lp_cumsum,
    .pointwise_loss_fwd = lp_ploss_fwd,
    .pointwise_loss_bwd = lp_ploss_bwd,
    .nll_fwd = fg__cpu_nll_fwd,
    .nll_bwd = fg__cpu_nll_bwd,
    .conv2d_fwd = lp_conv_fwd,
    .conv2d_bwd_data = lp_conv_bwd_data,
    .conv2d_bwd_weight = lp_conv_bwd_weight,
    .pool2d_fwd = lp_pool_fwd,
    .pool2d_bwd = lp_pool_bwd,
    /* f32 and f64 only: fg_batch_norm composes bf16/f16 from the entries above */
    .batch_norm_stats = fg__cpu_batch_norm_stats,
    .batch_norm_fwd = fg__cpu_batch_norm_fwd,
    .batch_norm_bwd = fg__cpu_batch_norm_bwd,
};
