/* The flat layout: finalize lays every parameter of a tree out in one flat
 * buffer (PyTorch's named_parameters order), moves the tensors' data
 * pointers into it, points each gradient into one flat gradient buffer of
 * the same layout and initialises from the root's seed; the parameter and
 * buffer accessors then index that layout.
 *
 * Before finalize each parameter owns its own zeroed storage. Parameter
 * tensor pointers never change, so forward callbacks may keep them. A
 * module's parameters are one run of slots and of elements, so its flat
 * views and zero_grad cover exactly its subtree. An initial value depends
 * only on the seed, the slot and the element index, never on the number of
 * threads. A failed finalize leaves the tensors as they were, so it can be
 * retried. */
#include <math.h>
#include <string.h>

#include "nn_impl.h"

void fg__module_flat_free(fg__flat *f) {
    if (!f) return;
    if (f->dev) { /* fg_module_to_device's buffers, and its reference to the device */
        /* a _free has no caller to tell; the buffers came from f->dev */
        fg__status_drop(fg_dev_free(f->dev, f->pdata));
        fg__status_drop(fg_dev_free(f->dev, f->gdata));
        fg__status_drop(fg_dev_free(f->dev, f->bdata));
        fg_dev_close(f->dev);
    } else {
        fg_free(f->pdata);
        fg_free(f->gdata);
        fg_free(f->bdata);
    }
    for (int64_t i = 0; f->slot && i < f->np + f->nb; i++) {
        fg_tensor_free(f->slot[i].grad);
        fg_free(f->slot[i].name);
    }
    for (int64_t i = 0; i < f->nalias; i++) fg_free(f->alias_name[i]);
    fg_free(f->slot);
    fg_free(f->alias_name);
    fg_free(f->alias_idx);
    fg_free(f->mods);
    fg_free(f);
}

/* ------------------------------------------------------------ finalize */

/* Growable arrays used while collecting the tree. */
typedef struct collect {
    fg__pentry **pe;
    int64_t np, capp;
    fg__pentry **be;
    int64_t nb, capb;
    fg__pentry **al; /* alias entries */
    char **alname;
    int64_t nal, capal, capaln;
    fg_module **mods;
    int64_t nmod, capmod;
} collect;

static FG_MUST_USE fg_status grow(void **p, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return FG_OK;
    int64_t c = *cap ? *cap * 2 : 16;
    while (c < need) c *= 2;
    void *q = fg_realloc(*p, elem * (size_t)c);
    if (!q) return FG_ENOMEM;
    *p = q;
    *cap = c;
    return FG_OK;
}

static char *join(const char *path, const char *name) {
    size_t a = strlen(path), b = strlen(name);
    char *s = fg_alloc(a + b + 2);
    if (!s) return NULL;
    if (a) {
        memcpy(s, path, a);
        s[a] = '.';
        memcpy(s + a + 1, name, b + 1);
    } else {
        memcpy(s, name, b + 1);
    }
    return s;
}

/* Preorder walk: own parameters, own buffers, then children. Sets each
 * module's index and ranges (relative to the collected arrays). Paths are
 * allocated into path_out[] (indexed by module preorder). */
static FG_MUST_USE fg_status collect_tree(fg_module *m, const char *path, collect *c, char ***paths,
                                          int64_t *cappaths) {
    FG_TRY(grow((void **)&c->mods, &c->capmod, c->nmod + 1, sizeof *c->mods));
    FG_TRY(grow((void **)paths, cappaths, c->nmod + 1, sizeof **paths));
    int64_t idx = c->nmod++;
    c->mods[idx] = m;
    (*paths)[idx] = fg_strdup(path);
    if (!(*paths)[idx]) return FG_ENOMEM;
    m->index = idx;
    m->p_first = c->np;
    m->b_first = c->nb;
    for (int i = 0; i < m->params.n; i++) {
        fg__pentry *e = &m->params.e[i];
        if (e->alias) {
            FG_TRY(grow((void **)&c->al, &c->capal, c->nal + 1, sizeof *c->al));
            FG_TRY(grow((void **)&c->alname, &c->capaln, c->nal + 1, sizeof *c->alname));
            c->alname[c->nal] = join(path, e->name);
            if (!c->alname[c->nal]) return FG_ENOMEM;
            c->al[c->nal++] = e;
            continue;
        }
        FG_TRY(grow((void **)&c->pe, &c->capp, c->np + 1, sizeof *c->pe));
        c->pe[c->np++] = e;
    }
    for (int i = 0; i < m->buffers.n; i++) {
        FG_TRY(grow((void **)&c->be, &c->capb, c->nb + 1, sizeof *c->be));
        c->be[c->nb++] = &m->buffers.e[i];
    }
    for (int i = 0; i < m->nchild; i++) {
        char *sub = join(path, m->child[i]->name);
        if (!sub) return FG_ENOMEM;
        fg_status s = collect_tree(m->child[i], sub, c, paths, cappaths);
        fg_free(sub);
        FG_TRY(s);
    }
    m->p_count = c->np - m->p_first;
    m->b_count = c->nb - m->b_first;
    return FG_OK;
}

/* Value i of an init from the Philox block that holds its draws: element i
 * of a normal init uses draws 2i and 2i+1 of the stream (as
 * fg_rng_fill_normal and fg_rng_normal: Box-Muller, cosine branch), so one
 * block serves two elements; a uniform init uses draw i (four per block). */
static double init_value(const fg_init *in, const uint32_t blk[4], int64_t i) {
    switch (in->kind) {
    case FG_INIT_ONES: return 1;
    case FG_INIT_CONST: return in->a;
    case FG_INIT_NORMAL: {
        int w = (int)(i & 1) * 2;
        double u1 = ((double)(blk[w] >> 8) + 1.0) / 16777216.0;
        double u2 = (double)(blk[w + 1] >> 8) / 16777216.0;
        return in->a + in->b * (sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
    }
    case FG_INIT_UNIFORM: return in->a + (in->b - in->a) * ((double)(blk[i & 3] >> 8) / 16777216.0);
    default: return 0;
    }
}

/* Fills elements [i0, i1) of a parameter (data points at its element 0)
 * from its init and stream `seed`. Chunks run in parallel: element i is a
 * function of (seed, i) alone, so a part is bitwise that part of a whole
 * fill (sharded initialisation relies on it). */
/* Elements [i0, i1) of a tensor's initial values, element i at
 * data[i - base]. */
static void init_fill_part(void *data, int64_t base, fg_dtype dt, int64_t i0, int64_t i1,
                           const fg_init *in, uint64_t seed) {
    if (in->kind == FG_INIT_KEEP || i1 <= i0) return;
    bool random = in->kind == FG_INIT_NORMAL || in->kind == FG_INIT_UNIFORM;
    int per_block = in->kind == FG_INIT_NORMAL ? 2 : 4; /* elements per Philox block */
    const int64_t chunk = 1 << 14;                      /* a multiple of per_block */
    int64_t c0 = i0 / chunk, nchunks = (i1 - 1) / chunk + 1 - c0;
#pragma omp parallel for schedule(static) if (nchunks > 1)
    for (int64_t c = c0; c < c0 + nchunks; c++) {
        int64_t lo = FG_MAX(i0, c * chunk), hi = FG_MIN(i1, (c + 1) * chunk);
        uint32_t blk[4] = {0};
        for (int64_t i = lo; i < hi; i++) {
            if (random && (i % per_block == 0 || i == lo))
                fg_philox(seed, (uint64_t)(i / per_block), blk);
            double v = init_value(in, blk, i);
            int64_t at = i - base;
            if (dt == FG_F64) ((double *)data)[at] = v;
            else if (dt == FG_BF16) ((uint16_t *)data)[at] = fg_f32_to_bf16((float)v);
            else if (dt == FG_F16) ((uint16_t *)data)[at] = fg_f32_to_f16((float)v);
            else ((float *)data)[at] = (float)v;
        }
    }
}

/* Elements [i0, i1) of slot tensor data (on f's device, if any: made on
 * the host a bounded chunk at a time and copied in). */
static void init_slot(const fg__flat *f, void *data, int64_t i0, int64_t i1, const fg_init *in,
                      uint64_t seed) {
    if (!f->dev || fg_dev_host_accessible(f->dev)) {
        init_fill_part(data, 0, f->dtype, i0, i1, in, seed);
        return;
    }
    if (in->kind == FG_INIT_KEEP) return;
    _Alignas(64) unsigned char tmp[32768];
    size_t es = fg_dtype_size(f->dtype);
    int64_t per = (int64_t)(sizeof tmp / es);
    for (int64_t a = i0; a < i1; a += per) {
        int64_t b = FG_MIN(i1, a + per);
        init_fill_part(tmp, a, f->dtype, a, b, in, seed);
        /* the range is inside the flat buffer: the copy cannot fail */
        fg__status_drop(
            fg_dev_copy_h2d(f->dev, (char *)data + (size_t)a * es, tmp, (size_t)(b - a) * es));
    }
}

static void init_fill(const fg__flat *f, void *data, int64_t n, const fg_init *in, uint64_t seed) {
    init_slot(f, data, 0, n, in, seed);
}

/* Stream of buffer i: after every parameter's (derive's stream space is 2^64). */
#define BUFFER_STREAM(i) (((uint64_t)1 << 63) + (uint64_t)(i))
#define DROPOUT_STREAM (~(uint64_t)0)

static void init_range(fg__flat *f, int64_t p0, int64_t p1, int64_t b0, int64_t b1, uint64_t seed) {
    for (int64_t i = p0; i < p1; i++) {
        const fg__slot *sl = &f->slot[i];
        init_fill(f, sl->t->data, sl->t->numel, &sl->e->init, fg_rng_derive(seed, (uint64_t)i));
    }
    for (int64_t i = b0; i < b1; i++) {
        const fg__slot *sl = &f->slot[f->np + i];
        init_fill(f, sl->t->data, sl->t->numel, &sl->e->init,
                  fg_rng_derive(seed, BUFFER_STREAM(i)));
    }
}

void fg__seed_dropouts(fg_module *m, uint64_t seed) {
    if (m->kind == fg__kind_dropout) {
        fg__dropout_state *d = m->ud;
        d->seed = fg_rng_derive(fg_rng_derive(seed, DROPOUT_STREAM), (uint64_t)m->index);
        atomic_store(&d->offset, 0);
    }
    for (int i = 0; i < m->nchild; i++) fg__seed_dropouts(m->child[i], seed);
}

fg_status fg_module_finalize(fg_module *root) {
    if (!root) return fg_error(FG_EINVAL, "finalize: NULL module");
    if (root->flat) return FG_OK;
    if (root->parent)
        return fg_error(FG_EINVAL, "finalize: module %s has a parent: finalize its root",
                        root->type);
    fg_status s = FG_OK;
    collect c = {0};
    char **paths = NULL;
    int64_t cappaths = 0;
    fg__flat *f = NULL;
    fg_tensor **mviews = NULL; /* 3 per module */
    if ((s = collect_tree(root, "", &c, &paths, &cappaths)) != FG_OK) goto fail;

    /* one float dtype for everything */
    fg_dtype dt = FG_F32;
    bool have = false;
    for (int64_t i = 0; i < c.np + c.nb; i++) {
        fg__pentry *e = i < c.np ? c.pe[i] : c.be[i - c.np];
        if (!have) {
            dt = e->t->dtype;
            have = true;
        } else if (e->t->dtype != dt) {
            s = fg_error(FG_EINVAL,
                         "finalize: \"%s\" is %s but \"%s\" is %s: every parameter and "
                         "buffer of a model has one dtype",
                         (i < c.np ? c.pe[0] : c.be[0])->name, fg_dtype_name(dt), e->name,
                         fg_dtype_name(e->t->dtype));
            goto fail;
        }
    }
    f = fg_calloc(1, sizeof *f);
    if (!f) goto nomem;
    f->dtype = dt;
    f->seed = root->seed ? root->seed : fg_default_seed();
    f->np = c.np;
    f->nb = c.nb;
    size_t es = fg_dtype_size(dt);
    f->slot = fg_calloc((size_t)(c.np + c.nb) + 1, sizeof *f->slot);
    f->alias_name = fg_calloc((size_t)c.nal + 1, sizeof *f->alias_name);
    f->alias_idx = fg_calloc((size_t)c.nal + 1, sizeof *f->alias_idx);
    mviews = fg_calloc((size_t)c.nmod * 3 + 1, sizeof *mviews);
    if (!f->slot || !f->alias_name || !f->alias_idx || !mviews) goto nomem;
    f->mods = c.mods;
    f->nmod = c.nmod;
    c.mods = NULL;

    for (int64_t i = 0; i < f->np; i++) {
        fg__slot *sl = &f->slot[i];
        sl->e = c.pe[i];
        sl->t = sl->e->t;
        sl->off = f->pnumel;
        f->pnumel += sl->t->numel;
    }
    for (int64_t i = 0; i < f->nb; i++) {
        fg__slot *sl = &f->slot[f->np + i];
        sl->e = c.be[i];
        sl->t = sl->e->t;
        sl->off = f->bnumel;
        f->bnumel += sl->t->numel;
    }
    /* full names: path of the owning module + local name */
    for (int64_t k = 0; k < f->nmod; k++) {
        fg_module *m = f->mods[k];
        int64_t pi = m->p_first, bi = m->b_first;
        for (int i = 0; i < m->params.n; i++)
            if (!m->params.e[i].alias)
                if (!(f->slot[pi++].name = join(paths[k], m->params.e[i].name))) goto nomem;
        for (int i = 0; i < m->buffers.n; i++)
            if (!(f->slot[f->np + bi++].name = join(paths[k], m->buffers.e[i].name))) goto nomem;
    }
    /* aliases must name a parameter of this tree */
    for (int64_t a = 0; a < c.nal; a++) {
        int64_t found = -1;
        for (int64_t i = 0; i < f->np && found < 0; i++)
            if (f->slot[i].t == c.al[a]->t) found = i;
        if (found < 0) {
            s = fg_error(FG_EINVAL,
                         "finalize: tied weight \"%s\" does not point at a parameter "
                         "of this model",
                         c.alname[a]);
            goto fail;
        }
        f->alias_idx[a] = found;
    }
    f->nalias = c.nal;
    for (int64_t a = 0; a < c.nal; a++) {
        f->alias_name[a] = c.alname[a];
        c.alname[a] = NULL;
    }
    f->pdata = fg_alloc(es * (size_t)f->pnumel + 64);
    /* under empty init nothing is touched: a strategy initialises its shard
     * (fg__module_init_elements) or the first forward everything */
    f->deferred = fg__tl_empty_init;
    f->gdata = f->deferred ? fg_alloc(es * (size_t)f->pnumel + 64)
                           : fg_calloc(1, es * (size_t)f->pnumel + 64);
    f->bdata = fg_alloc(es * (size_t)f->bnumel + 64);
    if (!f->pdata || !f->gdata || !f->bdata) goto nomem;
    for (int64_t i = 0; i < f->np; i++) {
        fg__slot *sl = &f->slot[i];
        sl->grad =
            fg_tensor_wrap((char *)f->gdata + es * (size_t)sl->off, dt, sl->t->ndim, sl->t->shape);
        if (!sl->grad) goto nomem;
    }
    for (int64_t k = 0; k < f->nmod; k++) {
        fg_module *m = f->mods[k];
        m->p_off = m->p_first < f->np ? f->slot[m->p_first].off : f->pnumel;
        m->p_numel = 0;
        for (int64_t i = m->p_first; i < m->p_first + m->p_count; i++)
            m->p_numel += f->slot[i].t->numel;
        m->b_off = m->b_first < f->nb ? f->slot[f->np + m->b_first].off : f->bnumel;
        m->b_numel = 0;
        for (int64_t i = m->b_first; i < m->b_first + m->b_count; i++)
            m->b_numel += f->slot[f->np + i].t->numel;
        mviews[3 * k] =
            fg_tensor_wrap((char *)f->pdata + es * (size_t)m->p_off, dt, 1, &m->p_numel);
        mviews[3 * k + 1] =
            fg_tensor_wrap((char *)f->gdata + es * (size_t)m->p_off, dt, 1, &m->p_numel);
        mviews[3 * k + 2] =
            fg_tensor_wrap((char *)f->bdata + es * (size_t)m->b_off, dt, 1, &m->b_numel);
        if (!mviews[3 * k] || !mviews[3 * k + 1] || !mviews[3 * k + 2]) goto nomem;
    }

    /* nothing can fail from here on: move the data */
    for (int64_t i = 0; i < f->np; i++) {
        fg_tensor *t = f->slot[i].t;
        void *dst = (char *)f->pdata + es * (size_t)f->slot[i].off;
        if (t->data) memcpy(dst, t->data, fg_tensor_nbytes(t)); /* FG_INIT_KEEP values */
        if (t->flags & FG_T_OWNS_DATA) fg_free(t->data);
        t->data = dst;
        t->flags &= ~(uint32_t)FG_T_OWNS_DATA;
        /* the slot's gradient view has t's shape and dtype: cannot be refused */
        fg__status_drop(fg_tensor_set_grad(t, f->slot[i].grad));
        t->requires_grad = true;
        t->param_index = (int32_t)i;
        t->name = f->slot[i].name;
    }
    for (int64_t i = 0; i < f->nb; i++) {
        fg_tensor *t = f->slot[f->np + i].t;
        void *dst = (char *)f->bdata + es * (size_t)f->slot[f->np + i].off;
        if (t->data) memcpy(dst, t->data, fg_tensor_nbytes(t));
        if (t->flags & FG_T_OWNS_DATA) fg_free(t->data);
        t->data = dst;
        t->flags &= ~(uint32_t)FG_T_OWNS_DATA;
        t->requires_grad = false;
        t->name = f->slot[f->np + i].name;
    }
    for (int64_t k = 0; k < f->nmod; k++) {
        fg_module *m = f->mods[k];
        m->flat = f;
        m->path = paths[k];
        paths[k] = NULL;
        m->prefix_len = m->path[0] ? strlen(m->path) + 1 : 0;
        m->flat_p = mviews[3 * k];
        m->flat_g = mviews[3 * k + 1];
        m->flat_b = mviews[3 * k + 2];
        /* two views of one shape and dtype: cannot be refused */
        fg__status_drop(fg_tensor_set_grad(m->flat_p, m->flat_g));
    }
    if (f->deferred) init_range(f, f->np, f->np, 0, f->nb, f->seed); /* buffers only */
    else init_range(f, 0, f->np, 0, f->nb, f->seed);
    fg__seed_dropouts(root, f->seed);
    for (int64_t k = 0; k < cappaths && k < f->nmod; k++) fg_free(paths[k]);
    fg_free(paths);
    fg_free(mviews);
    fg_free(c.al);
    fg_free(c.alname);
    fg_free(c.pe);
    fg_free(c.be);
    return FG_OK;

nomem:
    s = fg_error_wrap(FG_ENOMEM, "finalize: laying out the parameters");
fail: /* the modules were not touched beyond their (recomputed) ranges */
    fg__module_flat_free(f);
    if (mviews)
        for (int64_t k = 0; k < 3 * c.nmod; k++) fg_tensor_free(mviews[k]);
    fg_free(mviews);
    for (int64_t k = 0; k < c.nmod && paths; k++) fg_free(paths[k]);
    fg_free(paths);
    for (int64_t a = 0; a < c.nal; a++) fg_free(c.alname ? c.alname[a] : NULL);
    fg_free(c.alname);
    fg_free(c.al);
    fg_free(c.pe);
    fg_free(c.be);
    fg_free(c.mods);
    return s;
}

bool fg_module_is_finalized(const fg_module *m) { return m && fg__module_root(m)->flat; }

fg_status fg__module_ready(fg_module *m) {
    if (!m) return fg_error(FG_EINVAL, "NULL module");
    if (m->flat) return FG_OK;
    return fg_module_finalize(fg__module_root(m));
}

_Thread_local bool fg__tl_empty_init;

bool fg_module_set_empty_init(bool on) {
    bool prev = fg__tl_empty_init;
    fg__tl_empty_init = on;
    return prev;
}

bool fg__module_deferred(const fg_module *m) {
    const fg_module *r = fg__module_root(m);
    return r->flat && r->flat->deferred;
}

fg_status fg__module_materialize(fg_module *m) {
    fg_module *r = fg__module_root(m);
    fg__flat *f = r->flat;
    if (!f || !f->deferred) return FG_OK;
    init_range(f, 0, f->np, 0, 0, f->seed);
    size_t gb = fg_dtype_size(f->dtype) * (size_t)f->pnumel;
    if (f->dev && !fg_dev_host_accessible(f->dev))
        FG_TRY(fg_dev_memset(f->dev, f->gdata, 0, gb, NULL));
    else memset(f->gdata, 0, gb);
    f->deferred = false;
    return FG_OK;
}

void fg__module_init_elements(fg_module *m, int64_t lo, int64_t hi, uint64_t seed) {
    fg__flat *f = fg__module_root(m)->flat;
    for (int64_t i = 0; i < f->np; i++) {
        const fg__slot *sl = &f->slot[i];
        int64_t a = FG_MAX(lo, sl->off), b = FG_MIN(hi, sl->off + sl->t->numel);
        if (a >= b) continue;
        init_slot(f, sl->t->data, a - sl->off, b - sl->off, &sl->e->init,
                  fg_rng_derive(seed, (uint64_t)i));
    }
    f->seed = seed;
    f->deferred = false;
}

fg_status fg_module_reset_parameters(fg_module *m, uint64_t seed) {
    FG_TRY(fg__module_ready(m));
    fg__flat *f = m->flat;
    if (f->deferred) FG_TRY(fg__module_materialize(m));
    init_range(f, m->p_first, m->p_first + m->p_count, m->b_first, m->b_first + m->b_count, seed);
    if (!m->parent) f->seed = seed;
    return FG_OK;
}

/* ------------------------------------------------------------ parameters */

fg__flat *fg__module_flat(fg_module *m) {
    if (fg__module_ready(m)) return NULL;
    return m->flat;
}

int64_t fg_module_num_params(fg_module *m) { return fg__module_flat(m) ? m->p_count : -1; }
int64_t fg_module_numel(fg_module *m) { return fg__module_flat(m) ? m->p_numel : -1; }
fg_dtype fg_module_dtype(fg_module *m) { return fg__module_flat(m) ? m->flat->dtype : FG_F32; }

bool fg__module_index_ok(fg_module *m, int64_t i, int64_t n, const char *what) {
    if (i >= 0 && i < n) return true;
    fg_error(FG_EINVAL, "%s: index %lld out of range (module %s has %lld)", what, (long long)i,
             m->type, (long long)n);
    return false;
}

fg_tensor *fg_module_param(fg_module *m, int64_t i) {
    if (!fg__module_flat(m) || !fg__module_index_ok(m, i, m->p_count, "module_param")) return NULL;
    return m->flat->slot[m->p_first + i].t;
}

const char *fg_module_param_name(fg_module *m, int64_t i) {
    if (!fg__module_flat(m) || !fg__module_index_ok(m, i, m->p_count, "module_param_name"))
        return NULL;
    return m->flat->slot[m->p_first + i].name + m->prefix_len;
}

int64_t fg_module_param_offset(fg_module *m, int64_t i) {
    if (!fg__module_flat(m) || !fg__module_index_ok(m, i, m->p_count, "module_param_offset"))
        return -1;
    return m->flat->slot[m->p_first + i].off - m->p_off;
}

fg_tensor *fg_module_flat_params(fg_module *m) { return fg__module_flat(m) ? m->flat_p : NULL; }
fg_tensor *fg_module_flat_grads(fg_module *m) { return fg__module_flat(m) ? m->flat_g : NULL; }

/* Does the full name `full` lie under m (and what is its relative part)? */
static const char *relative(const fg_module *m, const char *full) {
    if (!m->prefix_len) return full;
    if (strncmp(full, m->path, m->prefix_len - 1) || full[m->prefix_len - 1] != '.') return NULL;
    return full + m->prefix_len;
}

int64_t fg_module_find_param(fg_module *m, const char *name) {
    if (!name || !fg__module_flat(m)) return -1;
    fg__flat *f = m->flat;
    for (int64_t i = m->p_first; i < m->p_first + m->p_count; i++)
        if (!strcmp(f->slot[i].name + m->prefix_len, name)) return i - m->p_first;
    for (int64_t a = 0; a < f->nalias; a++) {
        const char *rel = relative(m, f->alias_name[a]);
        int64_t i = f->alias_idx[a];
        if (rel && !strcmp(rel, name) && i >= m->p_first && i < m->p_first + m->p_count)
            return i - m->p_first;
    }
    return -1;
}

void fg_module_zero_grad(fg_module *m) {
    if (!fg__module_flat(m)) return;
    if (!m->parent && m->flat->wrap) { /* sharded parameters: only the shard is resident */
        m->flat->wrap->zero_grad(m->flat->wrap->ud);
        return;
    }
    if (m->flat->dev) { /* the device's own memset */
        /* no status to return: a device fill's failure stays in fg_last_error */
        fg__status_drop(fg_tensor_fill(m->flat_g, 0));
        return;
    }
    size_t es = fg_dtype_size(m->flat->dtype);
    char *g = (char *)m->flat->gdata + es * (size_t)m->p_off;
    size_t bytes = es * (size_t)m->p_numel;
    const size_t chunk = (size_t)1 << 20;
    int64_t nch = (int64_t)((bytes + chunk - 1) / chunk);
#pragma omp parallel for schedule(static) if (nch > 4)
    for (int64_t c = 0; c < nch; c++) {
        size_t lo = (size_t)c * chunk, len = FG_MIN(chunk, bytes - lo);
        memset(g + lo, 0, len);
    }
}

int64_t fg_module_num_buffers(fg_module *m) { return fg__module_flat(m) ? m->b_count : -1; }

fg_tensor *fg_module_buffer(fg_module *m, int64_t i) {
    if (!fg__module_flat(m) || !fg__module_index_ok(m, i, m->b_count, "module_buffer")) return NULL;
    return m->flat->slot[m->flat->np + m->b_first + i].t;
}

const char *fg_module_buffer_name(fg_module *m, int64_t i) {
    if (!fg__module_flat(m) || !fg__module_index_ok(m, i, m->b_count, "module_buffer_name"))
        return NULL;
    return m->flat->slot[m->flat->np + m->b_first + i].name + m->prefix_len;
}

/* ------------------------------------------------------------ devices */

/* p moved from the buffer `from` to the buffer `to` */
static void *rebase(void *p, const void *from, void *to) {
    return (char *)to + ((const char *)p - (const char *)from);
}

/* A view of [from, from + bytes) now points into `to`, on dev (NULL: host
 * memory). */
static void retarget(fg_tensor *t, const void *from, size_t bytes, void *to, fg_dev *dev) {
    if (!t || !t->data || (const char *)t->data < (const char *)from ||
        (const char *)t->data > (const char *)from + bytes)
        return;
    t->data = rebase(t->data, from, to);
    t->dev = dev;
    t->device = dev ? fg_dev_kind(dev) : FG_CPU;
}

/* Where a move puts the three buffers: on dev (NULL: host memory). */
typedef struct flat_bufs {
    void *p, *g, *b;
} flat_bufs;

static void bufs_free(fg_dev *dev, flat_bufs *x) {
    void *v[3] = {x->p, x->g, x->b};
    for (int i = 0; i < 3; i++) {
        /* just allocated on dev: their free cannot fail */
        if (dev) fg__status_drop(fg_dev_free(dev, v[i]));
        else fg_free(v[i]);
    }
}

/* bytes from `src` on `from` (NULL: the host) to `dst` on `to` (NULL: the
 * host), through a bounded host buffer when both are devices: never the
 * whole model in host memory at once. */
#define MOVE_CHUNK ((size_t)4 << 20)
static FG_MUST_USE fg_status move_bytes(fg_dev *to, void *dst, fg_dev *from, const void *src,
                                        size_t bytes, void *stage) {
    if (!bytes) return FG_OK;
    if (!from) return fg_dev_copy_h2d(to, dst, src, bytes);
    if (!to) return fg_dev_copy_d2h(from, dst, src, bytes);
    for (size_t at = 0; at < bytes; at += MOVE_CHUNK) {
        size_t n = FG_MIN(MOVE_CHUNK, bytes - at);
        FG_TRY(fg_dev_copy_d2h(from, stage, (const char *)src + at, n));
        FG_TRY(fg_dev_copy_h2d(to, (char *)dst + at, stage, n));
    }
    return FG_OK;
}

/* Moves the flat buffers from f->dev (NULL: the host) to `to` (NULL: the
 * host): the new buffers are made and filled first, so a failure leaves
 * the model where it was; then every view follows, the old buffers are
 * freed and the device reference moves with them. */
static FG_MUST_USE fg_status move_flat(fg__flat *f, fg_dev *to, const char *to_name) {
    fg_dev *from = f->dev;
    size_t es = fg_dtype_size(f->dtype);
    size_t pb = es * (size_t)f->pnumel, bb = es * (size_t)f->bnumel;
    flat_bufs nb = {0};
    void *stage = NULL;
    if (to) {
        nb.p = fg_dev_alloc(to, pb, NULL);
        nb.g = nb.p ? fg_dev_alloc(to, pb, NULL) : NULL;
        nb.b = nb.g ? fg_dev_alloc(to, bb, NULL) : NULL;
    } else { /* as finalize lays them out */
        nb.p = fg_alloc(pb + 64);
        nb.g = nb.p ? fg_alloc(pb + 64) : NULL;
        nb.b = nb.g ? fg_alloc(bb + 64) : NULL;
        if (!nb.b)
            fg_error(FG_ENOMEM, "%zu bytes of host memory for the flat buffers", 2 * pb + bb);
    }
    fg_status s = nb.b ? FG_OK : fg_last_status();
    if (s == FG_OK && from && to && !(stage = fg_alloc(FG_MIN(MOVE_CHUNK, FG_MAX(pb, bb)) + 64)))
        s = fg_error(FG_ENOMEM, "a host buffer to stage the move through");
    if (s == FG_OK) s = move_bytes(to, nb.p, from, f->pdata, pb, stage);
    if (s == FG_OK) s = move_bytes(to, nb.g, from, f->gdata, pb, stage);
    if (s == FG_OK) s = move_bytes(to, nb.b, from, f->bdata, bb, stage);
    fg_free(stage);
    if (s != FG_OK) {
        bufs_free(to, &nb);
        return fg_error_wrap(s, "module to_device %s", to_name);
    }
    /* nothing fails from here on: every view of the three buffers follows */
    for (int64_t i = 0; i < f->np + f->nb; i++) {
        fg__slot *sl = &f->slot[i];
        bool param = i < f->np;
        retarget(sl->t, param ? f->pdata : f->bdata, param ? pb : bb, param ? nb.p : nb.b, to);
        retarget(sl->grad, f->gdata, pb, nb.g, to);
    }
    for (int64_t k = 0; k < f->nmod; k++) {
        fg_module *m = f->mods[k];
        retarget(m->flat_p, f->pdata, pb, nb.p, to);
        retarget(m->flat_g, f->gdata, pb, nb.g, to);
        retarget(m->flat_b, f->bdata, bb, nb.b, to);
    }
    flat_bufs old = {f->pdata, f->gdata, f->bdata};
    bufs_free(from, &old);
    f->pdata = nb.p;
    f->gdata = nb.g;
    f->bdata = nb.b;
    if (to) fg_dev_retain(to);
    if (from) fg_dev_close(from); /* the reference the move there took */
    f->dev = to;
    return FG_OK;
}

fg_status fg_module_to_device(fg_module *root, fg_dev *dev) {
    if (!root || root->parent)
        return fg_error(FG_EINVAL, "module to_device: %s", root ? "not a root module" : "NULL");
    FG_TRY(fg_module_finalize(root));
    fg__flat *f = root->flat;
    if (dev && fg_dev_host_accessible(dev)) dev = NULL; /* the CPU device is host memory */
    if (f->dev == dev) return FG_OK;
    /* a model under empty init moves as it is: its strategy initialises
     * its shard on the device (fg__module_init_elements) */
    if (f->wrap)
        return fg_error(FG_EUNSUPPORTED,
                        "module to_device %s: a model whose parameters a strategy shards stays "
                        "on %s (its shards and units are the strategy's); move it before the "
                        "setup, or save a full checkpoint and load it where it should be",
                        dev ? fg_dev_name(dev) : "cpu", f->dev ? fg_dev_name(f->dev) : "cpu");
    return move_flat(f, dev, dev ? fg_dev_name(dev) : "cpu");
}

fg_dev *fg_module_device(const fg_module *m) { return m && m->flat ? m->flat->dev : NULL; }
