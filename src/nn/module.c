/* The module tree: building it, finalizing it into flat buffers, forward
 * dispatch, modes, parameter accessors and the state dict.
 *
 * Before finalize each parameter owns its own zeroed storage; finalize lays
 * every parameter of the tree out in one flat buffer (PyTorch's
 * named_parameters order), moves the tensors' data pointers into it, points
 * each gradient into one flat gradient buffer of the same layout and
 * initialises from the root's seed. Parameter tensor pointers never change,
 * so forward callbacks may keep them. After finalize the tree's shape is
 * frozen: adding children or parameters is FG_ESTATE. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "nn_impl.h"

/* ------------------------------------------------------------ small helpers */

static bool valid_name(const char *name) {
    return name && name[0] && !strchr(name, '.');
}

static fg_module *root_of(const fg_module *m) {
    while (m->parent)
        m = m->parent;
    return (fg_module *)m;
}

fg_module *fg__module_root(const fg_module *m) {
    return root_of(m);
}

static bool name_taken(const fg_module *m, const char *name) {
    for (int i = 0; i < m->nchild; i++)
        if (!strcmp(m->child[i]->name, name))
            return true;
    for (int i = 0; i < m->params.n; i++)
        if (!strcmp(m->params.e[i].name, name))
            return true;
    for (int i = 0; i < m->buffers.n; i++)
        if (!strcmp(m->buffers.e[i].name, name))
            return true;
    return false;
}

const char *fg__module_path(const fg_module *m, char *buf, size_t n) {
    if (m->path) {
        snprintf(buf, n, "%s", m->path[0] ? m->path : "(root)");
        return buf;
    }
    /* before finalize: walk up */
    const fg_module *chain[64];
    int k = 0;
    for (const fg_module *p = m; p->parent && k < 64; p = p->parent)
        chain[k++] = p;
    size_t len = 0;
    buf[0] = 0;
    for (int i = k - 1; i >= 0 && len < n; i--)
        len += (size_t)snprintf(buf + len, n - len, "%s%s", i == k - 1 ? "" : ".", chain[i]->name);
    if (!k)
        snprintf(buf, n, "(root)");
    return buf;
}

static fg_status check_open(const fg_module *m, const char *what) {
    const fg_module *r = root_of(m);
    if (r->flat) {
        char b[256];
        return fg_error(FG_ESTATE,
                        "%s: module %s is already finalized (its parameters live in "
                        "flat buffers); add everything before the first forward or "
                        "fg_module_finalize",
                        what, fg__module_path(m, b, sizeof b));
    }
    return FG_OK;
}

/* ------------------------------------------------------------ construction */

fg_module *fg_module_new(const char *type, fg_module_forward_fn forward, void *ud,
                         void (*free_ud)(void *ud)) {
    fg_module *m = fg_calloc(1, sizeof *m);
    if (!m)
        goto fail;
    m->type = fg_strdup(type ? type : "Module");
    m->name = fg_strdup("");
    if (!m->type || !m->name)
        goto fail;
    m->forward = forward;
    m->ud = ud;
    m->free_ud = free_ud;
    m->training = true;
    return m;
fail:
    if (m) {
        fg_free(m->type);
        fg_free(m->name);
        fg_free(m);
    }
    if (free_ud)
        free_ud(ud);
    fg_error_wrap(FG_ENOMEM, "fg_module_new(%s)", type ? type : "Module");
    return NULL;
}

static void free_flat(fg_flat *f) {
    if (!f)
        return;
    for (int64_t i = 0; i < f->np; i++) {
        fg_tensor_free(f->gview ? f->gview[i] : NULL);
        fg_free(f->pname ? f->pname[i] : NULL);
    }
    for (int64_t i = 0; i < f->nb; i++)
        fg_free(f->bname ? f->bname[i] : NULL);
    for (int64_t i = 0; i < f->nalias; i++)
        fg_free(f->alias_name[i]);
    fg_free(f->p);
    fg_free(f->pe);
    fg_free(f->pname);
    fg_free(f->poff);
    fg_free(f->gview);
    fg_free(f->b);
    fg_free(f->be);
    fg_free(f->bname);
    fg_free(f->boff);
    fg_free(f->alias_name);
    fg_free(f->alias_idx);
    fg_free(f->mods);
    /* pdata/gdata/bdata are freed by the caller (after the tensors) */
    fg_free(f);
}

static void free_tree(fg_module *m) {
    for (int i = 0; i < m->nchild; i++)
        free_tree(m->child[i]);
    for (int i = 0; i < m->params.n; i++) {
        if (!m->params.e[i].alias)
            fg_tensor_free(m->params.e[i].t);
        fg_free(m->params.e[i].name);
    }
    for (int i = 0; i < m->buffers.n; i++) {
        fg_tensor_free(m->buffers.e[i].t);
        fg_free(m->buffers.e[i].name);
    }
    fg_free(m->params.e);
    fg_free(m->buffers.e);
    fg_free(m->child);
    fg_tensor_free(m->flat_p);
    fg_tensor_free(m->flat_g);
    fg_tensor_free(m->flat_b);
    fg_free(m->path);
    if (m->free_ud)
        m->free_ud(m->ud);
    fg_free(m->type);
    fg_free(m->name);
    fg_free(m);
}

void fg_module_free(fg_module *m) {
    if (!m || m->parent)
        return;
    fg_flat *f = m->flat;
    free_tree(m);
    if (f) {
        fg_free(f->pdata);
        fg_free(f->gdata);
        fg_free(f->bdata);
        free_flat(f);
    }
}

fg_status fg_module_add_child(fg_module *m, const char *name, fg_module *child) {
    fg_status s = FG_OK;
    if (!child)
        return fg_error_wrap(fg_last_status() ? fg_last_status() : FG_EINVAL,
                             "add_child(%s): NULL child (an earlier constructor failed)",
                             name ? name : "?");
    if (!m) {
        s = fg_error(FG_EINVAL, "add_child(%s): NULL parent", name ? name : "?");
        goto fail;
    }
    if (child->parent) /* not ours to free */
        return fg_error(FG_EINVAL, "add_child(%s): the child already belongs to module %s",
                        name ? name : "?", child->parent->type);
    if (!valid_name(name)) {
        s = fg_error(FG_EINVAL, "add_child: name \"%s\": expected a non-empty name without '.'",
                     name ? name : "(null)");
        goto fail;
    }
    if ((s = check_open(m, "add_child")) != FG_OK)
        goto fail;
    if (child->flat) {
        s = fg_error(FG_ESTATE,
                     "add_child(%s): the child %s is already finalized (add modules "
                     "before their first use)",
                     name, child->type);
        goto fail;
    }
    if (root_of(m) == child) /* m's own tree: freeing it would free m */
        return fg_error(FG_EINVAL, "add_child(%s): a module cannot contain its own root", name);
    if (name_taken(m, name)) {
        s = fg_error(FG_EINVAL, "add_child: module %s already has a child or parameter \"%s\"",
                     m->type, name);
        goto fail;
    }
    if (m->nchild == m->capchild) {
        int cap = m->capchild ? 2 * m->capchild : 4;
        fg_module **c = fg_realloc(m->child, sizeof *c * (size_t)cap);
        if (!c) {
            s = FG_ENOMEM;
            goto fail;
        }
        m->child = c;
        m->capchild = cap;
    }
    char *nm = fg_strdup(name);
    if (!nm) {
        s = FG_ENOMEM;
        goto fail;
    }
    fg_free(child->name);
    child->name = nm;
    child->parent = m;
    m->child[m->nchild++] = child;
    return FG_OK;
fail:
    fg_module_free(child);
    return s;
}

static fg_status plist_push(fg_plist *l, fg_pentry e) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 4;
        fg_pentry *p = fg_realloc(l->e, sizeof *p * (size_t)cap);
        if (!p)
            return FG_ENOMEM;
        l->e = p;
        l->cap = cap;
    }
    l->e[l->n++] = e;
    return FG_OK;
}

static fg_tensor *add_tensor(fg_module *m, fg_plist *l, const char *what, const char *name,
                             fg_dtype dt, int ndim, const int64_t *shape, const fg_init *init) {
    if (!m) {
        fg_error(FG_EINVAL, "%s(%s): NULL module", what, name ? name : "?");
        return NULL;
    }
    if (!valid_name(name)) {
        fg_error(FG_EINVAL, "%s: name \"%s\": expected a non-empty name without '.'", what,
                 name ? name : "(null)");
        return NULL;
    }
    if (check_open(m, what))
        return NULL;
    if (name_taken(m, name)) {
        fg_error(FG_EINVAL, "%s: module %s already has a child or parameter \"%s\"", what, m->type,
                 name);
        return NULL;
    }
    if (dt != FG_F32 && dt != FG_F64) {
        fg_error(FG_EUNSUPPORTED, "%s(%s): dtype %s: parameters are f32 or f64", what, name,
                 fg_dtype_name(dt));
        return NULL;
    }
    if (init && (init->kind < FG_INIT_ZEROS || init->kind > FG_INIT_KEEP)) {
        fg_error(FG_EINVAL, "%s(%s): unknown init kind %d", what, name, (int)init->kind);
        return NULL;
    }
    fg_tensor *t = fg_tensor_new(dt, ndim, shape);
    char *nm = t ? fg_strdup(name) : NULL;
    if (!nm || plist_push(l, (fg_pentry){nm, t, init ? *init : (fg_init){0}, false}) != FG_OK) {
        fg_tensor_free(t);
        fg_free(nm);
        fg_error_wrap(FG_EINVAL, "%s(%s)", what, name);
        return NULL;
    }
    t->param_index = -1;
    t->name = nm;
    return t;
}

fg_tensor *fg_module_add_param(fg_module *m, const char *name, fg_dtype dt, int ndim,
                               const int64_t *shape, const fg_init *init) {
    fg_tensor *t = add_tensor(m, &m->params, "add_param", name, dt, ndim, shape, init);
    if (t)
        t->requires_grad = true;
    return t;
}

fg_tensor *fg_module_add_buffer(fg_module *m, const char *name, fg_dtype dt, int ndim,
                                const int64_t *shape, const fg_init *init) {
    return add_tensor(m, &m->buffers, "add_buffer", name, dt, ndim, shape, init);
}

fg_status fg_module_add_tied(fg_module *m, const char *name, fg_tensor *param) {
    if (!m || !param)
        return fg_error(FG_EINVAL, "add_tied(%s): NULL %s", name ? name : "?",
                        m ? "parameter" : "module");
    if (!valid_name(name))
        return fg_error(FG_EINVAL, "add_tied: name \"%s\": expected a non-empty name without '.'",
                        name ? name : "(null)");
    FG_TRY(check_open(m, "add_tied"));
    if (name_taken(m, name))
        return fg_error(FG_EINVAL, "add_tied: module %s already has a child or parameter \"%s\"",
                        m->type, name);
    char *nm = fg_strdup(name);
    if (!nm)
        return FG_ENOMEM;
    if (plist_push(&m->params, (fg_pentry){nm, param, {FG_INIT_KEEP, 0, 0}, true}) != FG_OK) {
        fg_free(nm);
        return FG_ENOMEM;
    }
    return FG_OK;
}

static fg_pentry *own_entry(const fg_module *m, const char *name, bool buffers) {
    const fg_plist *l = buffers ? &m->buffers : &m->params;
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->e[i].name, name))
            return &l->e[i];
    return NULL;
}

fg_status fg_module_set_init(fg_module *m, const char *name, const fg_init *init) {
    if (!m || !name)
        return fg_error(FG_EINVAL, "set_init: NULL module or name");
    fg_pentry *e = own_entry(m, name, false);
    if (!e)
        e = own_entry(m, name, true);
    if (!e || e->alias)
        return fg_error(FG_EINVAL, "set_init: module %s has no own parameter \"%s\"", m->type,
                        name);
    if (init && (init->kind < FG_INIT_ZEROS || init->kind > FG_INIT_KEEP))
        return fg_error(FG_EINVAL, "set_init(%s): unknown init kind %d", name, (int)init->kind);
    e->init = init ? *init : (fg_init){0};
    return FG_OK;
}

fg_status fg_module_set_seed(fg_module *root, uint64_t seed) {
    if (!root)
        return fg_error(FG_EINVAL, "set_seed: NULL module");
    if (root->parent)
        return fg_error(FG_EINVAL, "set_seed: module %s is not a root (set the seed of its root)",
                        root->type);
    FG_TRY(check_open(root, "set_seed"));
    root->seed = seed;
    return FG_OK;
}

/* ------------------------------------------------------------ finalize */

/* Growable arrays used while collecting the tree. */
typedef struct collect {
    fg_pentry **pe;
    int64_t np, capp;
    fg_pentry **be;
    int64_t nb, capb;
    fg_pentry **al; /* alias entries */
    char **alname;
    int64_t nal, capal, capaln;
    fg_module **mods;
    int64_t nmod, capmod;
} collect;

static fg_status grow(void **p, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap)
        return FG_OK;
    int64_t c = *cap ? *cap * 2 : 16;
    while (c < need)
        c *= 2;
    void *q = fg_realloc(*p, elem * (size_t)c);
    if (!q)
        return FG_ENOMEM;
    *p = q;
    *cap = c;
    return FG_OK;
}

static char *join(const char *path, const char *name) {
    size_t a = strlen(path), b = strlen(name);
    char *s = fg_alloc(a + b + 2);
    if (!s)
        return NULL;
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
static fg_status collect_tree(fg_module *m, const char *path, collect *c, char ***paths,
                              int64_t *cappaths) {
    FG_TRY(grow((void **)&c->mods, &c->capmod, c->nmod + 1, sizeof *c->mods));
    FG_TRY(grow((void **)paths, cappaths, c->nmod + 1, sizeof **paths));
    int64_t idx = c->nmod++;
    c->mods[idx] = m;
    (*paths)[idx] = fg_strdup(path);
    if (!(*paths)[idx])
        return FG_ENOMEM;
    m->index = idx;
    m->p_first = c->np;
    m->b_first = c->nb;
    for (int i = 0; i < m->params.n; i++) {
        fg_pentry *e = &m->params.e[i];
        if (e->alias) {
            FG_TRY(grow((void **)&c->al, &c->capal, c->nal + 1, sizeof *c->al));
            FG_TRY(grow((void **)&c->alname, &c->capaln, c->nal + 1, sizeof *c->alname));
            c->alname[c->nal] = join(path, e->name);
            if (!c->alname[c->nal])
                return FG_ENOMEM;
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
        if (!sub)
            return FG_ENOMEM;
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
    case FG_INIT_ONES:
        return 1;
    case FG_INIT_CONST:
        return in->a;
    case FG_INIT_NORMAL: {
        int w = (int)(i & 1) * 2;
        double u1 = ((double)(blk[w] >> 8) + 1.0) / 16777216.0;
        double u2 = (double)(blk[w + 1] >> 8) / 16777216.0;
        return in->a + in->b * (sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
    }
    case FG_INIT_UNIFORM:
        return in->a + (in->b - in->a) * ((double)(blk[i & 3] >> 8) / 16777216.0);
    default:
        return 0;
    }
}

/* Fills n elements of a parameter from its init and stream `seed`. Chunks
 * run in parallel: element i is a function of (seed, i) alone. */
static void init_fill(void *data, fg_dtype dt, int64_t n, const fg_init *in, uint64_t seed) {
    if (in->kind == FG_INIT_KEEP)
        return;
    bool random = in->kind == FG_INIT_NORMAL || in->kind == FG_INIT_UNIFORM;
    int per_block = in->kind == FG_INIT_NORMAL ? 2 : 4; /* elements per Philox block */
    const int64_t chunk = 1 << 14;                      /* a multiple of per_block */
    int64_t nchunks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (nchunks > 1)
    for (int64_t c = 0; c < nchunks; c++) {
        int64_t lo = c * chunk, hi = FG_MIN(n, lo + chunk);
        uint32_t blk[4] = {0};
        for (int64_t i = lo; i < hi; i++) {
            if (random && i % per_block == 0)
                fg_philox(seed, (uint64_t)(i / per_block), blk);
            double v = init_value(in, blk, i);
            if (dt == FG_F64)
                ((double *)data)[i] = v;
            else
                ((float *)data)[i] = (float)v;
        }
    }
}

/* Stream of buffer i: after every parameter's (derive's stream space is 2^64). */
#define BUFFER_STREAM(i) (((uint64_t)1 << 63) + (uint64_t)(i))
#define DROPOUT_STREAM (~(uint64_t)0)

static void init_range(fg_flat *f, int64_t p0, int64_t p1, int64_t b0, int64_t b1, uint64_t seed) {
    for (int64_t i = p0; i < p1; i++)
        init_fill(f->p[i]->data, f->dtype, f->p[i]->numel, &f->pe[i]->init,
                  fg_rng_derive(seed, (uint64_t)i));
    for (int64_t i = b0; i < b1; i++)
        init_fill(f->b[i]->data, f->dtype, f->b[i]->numel, &f->be[i]->init,
                  fg_rng_derive(seed, BUFFER_STREAM(i)));
}

void fg__seed_dropouts(fg_module *m, uint64_t seed) {
    if (m->kind == fg__kind_dropout) {
        fg_dropout_state *d = m->ud;
        d->seed = fg_rng_derive(fg_rng_derive(seed, DROPOUT_STREAM), (uint64_t)m->index);
        atomic_store(&d->offset, 0);
    }
    for (int i = 0; i < m->nchild; i++)
        fg__seed_dropouts(m->child[i], seed);
}

fg_status fg_module_finalize(fg_module *root) {
    if (!root)
        return fg_error(FG_EINVAL, "finalize: NULL module");
    if (root->flat)
        return FG_OK;
    if (root->parent)
        return fg_error(FG_EINVAL, "finalize: module %s has a parent: finalize its root",
                        root->type);
    fg_status s = FG_OK;
    collect c = {0};
    char **paths = NULL;
    int64_t cappaths = 0;
    fg_flat *f = NULL;
    fg_tensor **mviews = NULL; /* 3 per module */
    if ((s = collect_tree(root, "", &c, &paths, &cappaths)) != FG_OK)
        goto fail;

    /* one float dtype for everything */
    fg_dtype dt = FG_F32;
    bool have = false;
    for (int64_t i = 0; i < c.np + c.nb; i++) {
        fg_pentry *e = i < c.np ? c.pe[i] : c.be[i - c.np];
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
    if (!f)
        goto nomem;
    f->dtype = dt;
    f->seed = root->seed;
    f->np = c.np;
    f->nb = c.nb;
    size_t es = fg_dtype_size(dt);
    f->p = fg_calloc((size_t)c.np + 1, sizeof *f->p);
    f->pname = fg_calloc((size_t)c.np + 1, sizeof *f->pname);
    f->poff = fg_calloc((size_t)c.np + 1, sizeof *f->poff);
    f->gview = fg_calloc((size_t)c.np + 1, sizeof *f->gview);
    f->b = fg_calloc((size_t)c.nb + 1, sizeof *f->b);
    f->bname = fg_calloc((size_t)c.nb + 1, sizeof *f->bname);
    f->boff = fg_calloc((size_t)c.nb + 1, sizeof *f->boff);
    f->alias_name = fg_calloc((size_t)c.nal + 1, sizeof *f->alias_name);
    f->alias_idx = fg_calloc((size_t)c.nal + 1, sizeof *f->alias_idx);
    mviews = fg_calloc((size_t)c.nmod * 3 + 1, sizeof *mviews);
    if (!f->p || !f->pname || !f->poff || !f->gview || !f->b || !f->bname || !f->boff ||
        !f->alias_name || !f->alias_idx || !mviews)
        goto nomem;
    f->pe = c.pe;
    f->be = c.be;
    c.pe = c.be = NULL;
    f->mods = c.mods;
    f->nmod = c.nmod;
    c.mods = NULL;

    for (int64_t i = 0; i < f->np; i++) {
        f->p[i] = f->pe[i]->t;
        f->poff[i] = f->pnumel;
        f->pnumel += f->p[i]->numel;
    }
    for (int64_t i = 0; i < f->nb; i++) {
        f->b[i] = f->be[i]->t;
        f->boff[i] = f->bnumel;
        f->bnumel += f->b[i]->numel;
    }
    /* full names: path of the owning module + local name */
    for (int64_t k = 0; k < f->nmod; k++) {
        fg_module *m = f->mods[k];
        int64_t pi = m->p_first, bi = m->b_first;
        for (int i = 0; i < m->params.n; i++)
            if (!m->params.e[i].alias)
                if (!(f->pname[pi++] = join(paths[k], m->params.e[i].name)))
                    goto nomem;
        for (int i = 0; i < m->buffers.n; i++)
            if (!(f->bname[bi++] = join(paths[k], m->buffers.e[i].name)))
                goto nomem;
    }
    /* aliases must name a parameter of this tree */
    for (int64_t a = 0; a < c.nal; a++) {
        int64_t found = -1;
        for (int64_t i = 0; i < f->np && found < 0; i++)
            if (f->p[i] == c.al[a]->t)
                found = i;
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
    f->gdata = fg_calloc(1, es * (size_t)f->pnumel + 64);
    f->bdata = fg_alloc(es * (size_t)f->bnumel + 64);
    if (!f->pdata || !f->gdata || !f->bdata)
        goto nomem;
    for (int64_t i = 0; i < f->np; i++) {
        f->gview[i] = fg_tensor_wrap((char *)f->gdata + es * (size_t)f->poff[i], dt, f->p[i]->ndim,
                                     f->p[i]->shape);
        if (!f->gview[i])
            goto nomem;
    }
    for (int64_t k = 0; k < f->nmod; k++) {
        fg_module *m = f->mods[k];
        m->p_off = m->p_first < f->np ? f->poff[m->p_first] : f->pnumel;
        m->p_numel = 0;
        for (int64_t i = m->p_first; i < m->p_first + m->p_count; i++)
            m->p_numel += f->p[i]->numel;
        m->b_off = m->b_first < f->nb ? f->boff[m->b_first] : f->bnumel;
        m->b_numel = 0;
        for (int64_t i = m->b_first; i < m->b_first + m->b_count; i++)
            m->b_numel += f->b[i]->numel;
        mviews[3 * k] =
            fg_tensor_wrap((char *)f->pdata + es * (size_t)m->p_off, dt, 1, &m->p_numel);
        mviews[3 * k + 1] =
            fg_tensor_wrap((char *)f->gdata + es * (size_t)m->p_off, dt, 1, &m->p_numel);
        mviews[3 * k + 2] =
            fg_tensor_wrap((char *)f->bdata + es * (size_t)m->b_off, dt, 1, &m->b_numel);
        if (!mviews[3 * k] || !mviews[3 * k + 1] || !mviews[3 * k + 2])
            goto nomem;
    }

    /* nothing can fail from here on: move the data */
    for (int64_t i = 0; i < f->np; i++) {
        fg_tensor *t = f->p[i];
        void *dst = (char *)f->pdata + es * (size_t)f->poff[i];
        memcpy(dst, t->data, fg_tensor_nbytes(t)); /* FG_INIT_KEEP values */
        if (t->flags & FG_T_OWNS_DATA)
            fg_free(t->data);
        t->data = dst;
        t->flags &= ~(uint32_t)FG_T_OWNS_DATA;
        fg_tensor_set_grad(t, f->gview[i]);
        t->requires_grad = true;
        t->param_index = (int32_t)i;
        t->name = f->pname[i];
    }
    for (int64_t i = 0; i < f->nb; i++) {
        fg_tensor *t = f->b[i];
        void *dst = (char *)f->bdata + es * (size_t)f->boff[i];
        memcpy(dst, t->data, fg_tensor_nbytes(t));
        if (t->flags & FG_T_OWNS_DATA)
            fg_free(t->data);
        t->data = dst;
        t->flags &= ~(uint32_t)FG_T_OWNS_DATA;
        t->requires_grad = false;
        t->name = f->bname[i];
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
        fg_tensor_set_grad(m->flat_p, m->flat_g);
    }
    init_range(f, 0, f->np, 0, f->nb, f->seed);
    fg__seed_dropouts(root, f->seed);
    for (int64_t k = 0; k < cappaths && k < f->nmod; k++)
        fg_free(paths[k]);
    fg_free(paths);
    fg_free(mviews);
    fg_free(c.al);
    fg_free(c.alname);
    return FG_OK;

nomem:
    s = fg_error_wrap(FG_ENOMEM, "finalize: laying out the parameters");
fail: /* the modules were not touched beyond their (recomputed) ranges */
    if (f) {
        fg_free(f->pdata);
        fg_free(f->gdata);
        fg_free(f->bdata);
        free_flat(f); /* and the arrays moved into it from c */
    }
    if (mviews)
        for (int64_t k = 0; k < 3 * c.nmod; k++)
            fg_tensor_free(mviews[k]);
    fg_free(mviews);
    for (int64_t k = 0; k < c.nmod && paths; k++)
        fg_free(paths[k]);
    fg_free(paths);
    for (int64_t a = 0; a < c.nal; a++)
        fg_free(c.alname ? c.alname[a] : NULL);
    fg_free(c.alname);
    fg_free(c.al);
    fg_free(c.pe);
    fg_free(c.be);
    fg_free(c.mods);
    return s;
}

bool fg_module_is_finalized(const fg_module *m) {
    return m && root_of(m)->flat;
}

fg_status fg__module_ready(fg_module *m) {
    if (!m)
        return fg_error(FG_EINVAL, "NULL module");
    if (m->flat)
        return FG_OK;
    return fg_module_finalize(root_of(m));
}

fg_status fg_module_reset_parameters(fg_module *m, uint64_t seed) {
    FG_TRY(fg__module_ready(m));
    fg_flat *f = m->flat;
    init_range(f, m->p_first, m->p_first + m->p_count, m->b_first, m->b_first + m->b_count, seed);
    if (!m->parent)
        f->seed = seed;
    return FG_OK;
}

/* ------------------------------------------------------------ accessors */

void *fg_module_data(const fg_module *m) {
    return m ? m->ud : NULL;
}
const char *fg_module_type(const fg_module *m) {
    return m ? m->type : "(null)";
}
const char *fg_module_name(const fg_module *m) {
    return m ? m->name : "";
}
fg_module *fg_module_parent(const fg_module *m) {
    return m ? m->parent : NULL;
}
int fg_module_num_children(const fg_module *m) {
    return m ? m->nchild : 0;
}
fg_module *fg_module_child_at(const fg_module *m, int i) {
    return m && i >= 0 && i < m->nchild ? m->child[i] : NULL;
}

fg_module *fg_module_child(const fg_module *m, const char *name) {
    if (!m || !name) {
        fg_error(FG_EINVAL, "module_child: NULL module or name");
        return NULL;
    }
    const fg_module *cur = m;
    const char *p = name;
    while (*p) {
        const char *dot = strchr(p, '.');
        size_t len = dot ? (size_t)(dot - p) : strlen(p);
        const fg_module *next = NULL;
        for (int i = 0; i < cur->nchild && !next; i++)
            if (strlen(cur->child[i]->name) == len && !strncmp(cur->child[i]->name, p, len))
                next = cur->child[i];
        if (!next) {
            fg_error(FG_EINVAL, "module_child: module %s has no child \"%s\"", m->type, name);
            return NULL;
        }
        cur = next;
        p += len + (dot ? 1 : 0);
    }
    return (fg_module *)cur;
}

fg_tensor *fg_module_own_param(const fg_module *m, const char *name) {
    if (!m || !name)
        return NULL;
    fg_pentry *e = own_entry(m, name, false);
    return e ? e->t : NULL;
}

/* ------------------------------------------------------------ forward, modes */

static _Thread_local int tl_depth;
static _Thread_local bool tl_wrapped;

fg_tensor *fg_module_forward(fg_module *m, fg_tensor *x) {
    if (!m) {
        fg_error(FG_EINVAL, "module_forward: NULL module");
        return NULL;
    }
    if (!x) {
        fg_error_wrap(FG_EINVAL, "forward of %s: NULL input (an earlier call failed)", m->type);
        return NULL;
    }
    if (fg__module_ready(m))
        return NULL;
    if (!m->forward) {
        char b[256];
        fg_error(FG_EUNSUPPORTED, "module %s (%s) is a container without a forward",
                 fg__module_path(m, b, sizeof b), m->type);
        return NULL;
    }
    if (tl_depth++ == 0)
        tl_wrapped = false;
    fg_tensor *y = m->forward(m, x, m->ud);
    if (!y && !tl_wrapped) { /* name the innermost module once */
        char b[256];
        fg_error_wrap(FG_EINVAL, "in module %s (%s)", fg__module_path(m, b, sizeof b), m->type);
        tl_wrapped = true;
    }
    tl_depth--;
    return y;
}

void fg_module_train(fg_module *m, bool on) {
    if (!m)
        return;
    m->training = on;
    for (int i = 0; i < m->nchild; i++)
        fg_module_train(m->child[i], on);
}

bool fg_module_is_training(const fg_module *m) {
    return m && m->training;
}

/* ------------------------------------------------------------ parameters */

static fg_flat *ready_flat(fg_module *m) {
    if (fg__module_ready(m))
        return NULL;
    return m->flat;
}

int64_t fg_module_num_params(fg_module *m) {
    return ready_flat(m) ? m->p_count : -1;
}
int64_t fg_module_numel(fg_module *m) {
    return ready_flat(m) ? m->p_numel : -1;
}
fg_dtype fg_module_dtype(fg_module *m) {
    return ready_flat(m) ? m->flat->dtype : FG_F32;
}

static bool check_index(fg_module *m, int64_t i, int64_t n, const char *what) {
    if (i >= 0 && i < n)
        return true;
    fg_error(FG_EINVAL, "%s: index %lld out of range (module %s has %lld)", what, (long long)i,
             m->type, (long long)n);
    return false;
}

fg_tensor *fg_module_param(fg_module *m, int64_t i) {
    if (!ready_flat(m) || !check_index(m, i, m->p_count, "module_param"))
        return NULL;
    return m->flat->p[m->p_first + i];
}

const char *fg_module_param_name(fg_module *m, int64_t i) {
    if (!ready_flat(m) || !check_index(m, i, m->p_count, "module_param_name"))
        return NULL;
    return m->flat->pname[m->p_first + i] + m->prefix_len;
}

int64_t fg_module_param_offset(fg_module *m, int64_t i) {
    if (!ready_flat(m) || !check_index(m, i, m->p_count, "module_param_offset"))
        return -1;
    return m->flat->poff[m->p_first + i] - m->p_off;
}

fg_tensor *fg_module_flat_params(fg_module *m) {
    return ready_flat(m) ? m->flat_p : NULL;
}
fg_tensor *fg_module_flat_grads(fg_module *m) {
    return ready_flat(m) ? m->flat_g : NULL;
}

/* Does the full name `full` lie under m (and what is its relative part)? */
static const char *relative(const fg_module *m, const char *full) {
    if (!m->prefix_len)
        return full;
    if (strncmp(full, m->path, m->prefix_len - 1) || full[m->prefix_len - 1] != '.')
        return NULL;
    return full + m->prefix_len;
}

int64_t fg_module_find_param(fg_module *m, const char *name) {
    if (!name || !ready_flat(m))
        return -1;
    fg_flat *f = m->flat;
    for (int64_t i = m->p_first; i < m->p_first + m->p_count; i++)
        if (!strcmp(f->pname[i] + m->prefix_len, name))
            return i - m->p_first;
    for (int64_t a = 0; a < f->nalias; a++) {
        const char *rel = relative(m, f->alias_name[a]);
        int64_t i = f->alias_idx[a];
        if (rel && !strcmp(rel, name) && i >= m->p_first && i < m->p_first + m->p_count)
            return i - m->p_first;
    }
    return -1;
}

void fg_module_zero_grad(fg_module *m) {
    if (!ready_flat(m))
        return;
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

int64_t fg_module_num_buffers(fg_module *m) {
    return ready_flat(m) ? m->b_count : -1;
}

fg_tensor *fg_module_buffer(fg_module *m, int64_t i) {
    if (!ready_flat(m) || !check_index(m, i, m->b_count, "module_buffer"))
        return NULL;
    return m->flat->b[m->b_first + i];
}

const char *fg_module_buffer_name(fg_module *m, int64_t i) {
    if (!ready_flat(m) || !check_index(m, i, m->b_count, "module_buffer_name"))
        return NULL;
    return m->flat->bname[m->b_first + i] + m->prefix_len;
}

/* ------------------------------------------------------------ state dict */

int64_t fg_module_state_count(fg_module *m) {
    return ready_flat(m) ? m->p_count + m->b_count : -1;
}

const char *fg_module_state_name(fg_module *m, int64_t i) {
    if (!ready_flat(m) || !check_index(m, i, m->p_count + m->b_count, "module_state_name"))
        return NULL;
    return i < m->p_count ? fg_module_param_name(m, i) : fg_module_buffer_name(m, i - m->p_count);
}

fg_tensor *fg_module_state_tensor(fg_module *m, int64_t i) {
    if (!ready_flat(m) || !check_index(m, i, m->p_count + m->b_count, "module_state_tensor"))
        return NULL;
    return i < m->p_count ? fg_module_param(m, i) : fg_module_buffer(m, i - m->p_count);
}

/* State entry k of m (params then buffers) whose name is `name`, or -1. */
static int64_t find_state(fg_module *m, const char *name) {
    int64_t i = fg_module_find_param(m, name);
    if (i >= 0)
        return i;
    for (int64_t b = 0; b < m->b_count; b++)
        if (!strcmp(m->flat->bname[m->b_first + b] + m->prefix_len, name))
            return m->p_count + b;
    return -1;
}

/* A growing message: "what (a, b, c and N more)". */
typedef struct msgbuf {
    char s[2048];
    size_t len;
} msgbuf;

static void msg_add(msgbuf *b, const char *fmt, ...) FG_PRINTF(2, 3);
static void msg_add(msgbuf *b, const char *fmt, ...) {
    if (b->len >= sizeof b->s - 1)
        return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->s + b->len, sizeof b->s - b->len, fmt, ap);
    va_end(ap);
    if (k > 0)
        b->len = FG_MIN(sizeof b->s - 1, b->len + (size_t)k);
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < n)
        snprintf(buf + k, n - k, "]");
}

#define LIST_MAX 8

fg_status fg_module_load_state(fg_module *m, const fg_state_entry *entries, int64_t n,
                               bool strict) {
    if (!m || (n > 0 && !entries) || n < 0)
        return fg_error(FG_EINVAL, "load_state: NULL module or entries, or negative count");
    FG_TRY(fg__module_ready(m));
    int64_t ns = m->p_count + m->b_count;
    int64_t *target = fg_calloc((size_t)n + 1, sizeof *target);
    bool *seen = fg_calloc((size_t)ns + 1, sizeof *seen);
    fg_status s = FG_OK;
    if (!target || !seen) {
        s = FG_ENOMEM;
        goto done;
    }
    msgbuf shp = {0}, unexp = {0}, miss = {0};
    int64_t nshape = 0, nunexp = 0, nmiss = 0;
    for (int64_t k = 0; k < n; k++) {
        const fg_state_entry *e = &entries[k];
        if (!e->name || (e->ndim > 0 && !e->shape) || e->ndim < 0 || e->ndim > FG_MAX_DIMS) {
            s = fg_error(FG_EINVAL,
                         "load_state: entry %lld (%s) has no name, a bad ndim %d or "
                         "no shape",
                         (long long)k, e->name ? e->name : "(null)", e->ndim);
            goto done;
        }
        for (int64_t j = 0; j < k; j++)
            if (!strcmp(entries[j].name, e->name)) {
                s = fg_error(FG_EINVAL, "load_state: \"%s\" appears twice", e->name);
                goto done;
            }
        int64_t i = find_state(m, e->name);
        target[k] = i;
        if (i < 0) {
            if (nunexp < LIST_MAX)
                msg_add(&unexp, "%s%s", nunexp ? ", " : "", e->name);
            nunexp++;
            continue;
        }
        if (!fg_dtype_is_float(e->dtype)) {
            s = fg_error(FG_EINVAL,
                         "load_state: \"%s\" has dtype %s; parameters load from float "
                         "data",
                         e->name, fg_dtype_name(e->dtype));
            goto done;
        }
        fg_tensor *t = fg_module_state_tensor(m, i);
        bool same = e->ndim == t->ndim;
        for (int d = 0; same && d < t->ndim; d++)
            same = e->shape[d] == t->shape[d];
        if (!same) {
            char a[128], b[128];
            shape_str(a, sizeof a, e->ndim, e->shape);
            shape_str(b, sizeof b, t->ndim, t->shape);
            if (nshape < LIST_MAX)
                msg_add(&shp, "%s%s: given %s, model %s", nshape ? "; " : "", e->name, a, b);
            nshape++;
            continue;
        }
        if (!e->data && t->numel) {
            s = fg_error(FG_EINVAL, "load_state: \"%s\" has no data", e->name);
            goto done;
        }
        seen[i] = true;
    }
    for (int64_t i = 0; i < ns; i++) {
        if (seen[i])
            continue;
        /* a shape mismatch already reports it */
        bool reported = false;
        for (int64_t k = 0; k < n && !reported; k++)
            reported = target[k] == i;
        if (reported)
            continue;
        if (nmiss < LIST_MAX)
            msg_add(&miss, "%s%s", nmiss ? ", " : "", fg_module_state_name(m, i));
        nmiss++;
    }
    if (nshape || (strict && (nmiss || nunexp))) {
        msgbuf all = {0};
        msg_add(&all, "load_state into %s:", m->type);
        if (nshape)
            msg_add(&all, " %lld shape mismatch%s (%s%s)", (long long)nshape,
                    nshape > 1 ? "es" : "", shp.s, nshape > LIST_MAX ? "; ..." : "");
        if (strict && nmiss)
            msg_add(&all, "%s %lld missing (%s%s)", nshape ? ";" : "", (long long)nmiss, miss.s,
                    nmiss > LIST_MAX ? ", ..." : "");
        if (strict && nunexp)
            msg_add(&all, "%s %lld unexpected (%s%s)", nshape || nmiss ? ";" : "",
                    (long long)nunexp, unexp.s, nunexp > LIST_MAX ? ", ..." : "");
        s = fg_error(FG_EMISMATCH, "%s", all.s);
        goto done;
    }
    for (int64_t k = 0; k < n; k++) {
        if (target[k] < 0)
            continue;
        fg_tensor *t = fg_module_state_tensor(m, target[k]);
        s = fg_convert(t->data, t->dtype, entries[k].data, entries[k].dtype, t->numel);
        if (s != FG_OK)
            goto done; /* cannot happen: dtypes were checked */
    }
done:
    fg_free(target);
    fg_free(seen);
    return s;
}
