/* The module tree: building it (children, parameters, buffers, tied
 * weights), walking it, forward dispatch and the train/eval mode.
 *
 * Within a module, children, parameters and buffers share one namespace and
 * no name holds a '.', so a dotted path names one thing. A module has at
 * most one parent and the root owns the whole tree: freeing a child is a
 * no-op, and add_child takes the child even when it fails (so chained
 * constructors need no cleanup), unless the child already has a parent.
 * Once the root is finalized (module_flat.c) the tree's shape is frozen:
 * adding anything is FG_ESTATE, since the flat buffers hold exactly the
 * parameters that were there. */
#include <stdio.h>
#include <string.h>

#include "nn_impl.h"

/* ------------------------------------------------------------ small helpers */

static bool valid_name(const char *name) { return name && name[0] && !strchr(name, '.'); }

static fg_module *root_of(const fg_module *m) {
    while (m->parent) m = m->parent;
    return (fg_module *)m;
}

fg_module *fg__module_root(const fg_module *m) { return root_of(m); }

static bool name_taken(const fg_module *m, const char *name) {
    for (int i = 0; i < m->nchild; i++)
        if (!strcmp(m->child[i]->name, name)) return true;
    for (int i = 0; i < m->params.n; i++)
        if (!strcmp(m->params.e[i].name, name)) return true;
    for (int i = 0; i < m->buffers.n; i++)
        if (!strcmp(m->buffers.e[i].name, name)) return true;
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
    for (const fg_module *p = m; p->parent && k < 64; p = p->parent) chain[k++] = p;
    size_t len = 0;
    buf[0] = 0;
    for (int i = k - 1; i >= 0 && len < n; i--)
        len += (size_t)snprintf(buf + len, n - len, "%s%s", i == k - 1 ? "" : ".", chain[i]->name);
    if (!k) snprintf(buf, n, "(root)");
    return buf;
}

static FG_MUST_USE fg_status check_open(const fg_module *m, const char *what) {
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
    if (!m) goto fail;
    m->type = fg_strdup(type ? type : "Module");
    m->name = fg_strdup("");
    if (!m->type || !m->name) goto fail;
    m->forward = forward;
    m->ud = ud;
    m->free_ud = free_ud;
    m->training = true;
    m->wrap_unit = -1;
    return m;
fail:
    if (m) {
        fg_free(m->type);
        fg_free(m->name);
        fg_free(m);
    }
    if (free_ud) free_ud(ud);
    fg_error_wrap(FG_ENOMEM, "fg_module_new(%s)", type ? type : "Module");
    return NULL;
}

static void free_tree(fg_module *m) {
    for (int i = 0; i < m->nchild; i++) free_tree(m->child[i]);
    for (int i = 0; i < m->params.n; i++) {
        if (!m->params.e[i].alias) fg_tensor_free(m->params.e[i].t);
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
    if (m->free_ud) m->free_ud(m->ud);
    fg_free(m->type);
    fg_free(m->name);
    fg_free(m);
}

void fg_module_free(fg_module *m) {
    if (!m || m->parent) return;
    fg_error_kept kept; /* a _free never changes the caller's error (core.h) */
    fg_error_keep(&kept);
    fg__flat *f = m->flat;
    if (f && f->wrap) f->wrap->detach(f->wrap->ud); /* a strategy freed after its model */
    free_tree(m);
    fg__module_flat_free(f);
    fg_error_restore(&kept);
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
    if ((s = check_open(m, "add_child")) != FG_OK) goto fail;
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

static FG_MUST_USE fg_status plist_push(fg__plist *l, fg__pentry e) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 4;
        fg__pentry *p = fg_realloc(l->e, sizeof *p * (size_t)cap);
        if (!p) return FG_ENOMEM;
        l->e = p;
        l->cap = cap;
    }
    l->e[l->n++] = e;
    return FG_OK;
}

static fg_tensor *empty_tensor(fg_dtype dt, int ndim, const int64_t *shape) {
    fg_tensor *t = fg_calloc(1, sizeof *t);
    if (t && fg__tensor_init_shape(t, dt, ndim, shape) != FG_OK) {
        fg_free(t);
        return NULL;
    }
    if (t) t->flags = FG_T_PERSISTENT;
    return t;
}

static fg_tensor *add_tensor(fg_module *m, fg__plist *l, const char *what, const char *name,
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
    if (check_open(m, what)) return NULL;
    if (name_taken(m, name)) {
        fg_error(FG_EINVAL, "%s: module %s already has a child or parameter \"%s\"", what, m->type,
                 name);
        return NULL;
    }
    if (dt != FG_F32 && dt != FG_F64 && dt != FG_BF16 && dt != FG_F16) {
        fg_error(FG_EUNSUPPORTED, "%s(%s): dtype %s: parameters are f32, f64, bf16 or f16", what,
                 name, fg_dtype_name(dt));
        return NULL;
    }
    if (init && (init->kind < FG_INIT_ZEROS || init->kind > FG_INIT_KEEP)) {
        fg_error(FG_EINVAL, "%s(%s): unknown init kind %d", what, name, (int)init->kind);
        return NULL;
    }
    /* under empty init a parameter gets no storage before finalize */
    fg_tensor *t =
        fg__tl_empty_init ? empty_tensor(dt, ndim, shape) : fg_tensor_new(dt, ndim, shape);
    char *nm = t ? fg_strdup(name) : NULL;
    if (!nm || plist_push(l, (fg__pentry){nm, t, init ? *init : (fg_init){0}, false}) != FG_OK) {
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
    if (t) t->requires_grad = true;
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
    if (!nm) return FG_ENOMEM;
    if (plist_push(&m->params, (fg__pentry){nm, param, {FG_INIT_KEEP, 0, 0}, true}) != FG_OK) {
        fg_free(nm);
        return FG_ENOMEM;
    }
    return FG_OK;
}

static fg__pentry *own_entry(const fg_module *m, const char *name, bool buffers) {
    const fg__plist *l = buffers ? &m->buffers : &m->params;
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->e[i].name, name)) return &l->e[i];
    return NULL;
}

fg_status fg_module_set_init(fg_module *m, const char *name, const fg_init *init) {
    if (!m || !name) return fg_error(FG_EINVAL, "set_init: NULL module or name");
    fg__pentry *e = own_entry(m, name, false);
    if (!e) e = own_entry(m, name, true);
    if (!e || e->alias)
        return fg_error(FG_EINVAL, "set_init: module %s has no own parameter \"%s\"", m->type,
                        name);
    if (init && (init->kind < FG_INIT_ZEROS || init->kind > FG_INIT_KEEP))
        return fg_error(FG_EINVAL, "set_init(%s): unknown init kind %d", name, (int)init->kind);
    e->init = init ? *init : (fg_init){0};
    return FG_OK;
}

fg_status fg_module_set_seed(fg_module *root, uint64_t seed) {
    if (!root) return fg_error(FG_EINVAL, "set_seed: NULL module");
    if (root->parent)
        return fg_error(FG_EINVAL, "set_seed: module %s is not a root (set the seed of its root)",
                        root->type);
    FG_TRY(check_open(root, "set_seed"));
    root->seed = seed;
    return FG_OK;
}

/* ------------------------------------------------------------ accessors */

void *fg_module_data(const fg_module *m) { return m ? m->ud : NULL; }
const char *fg_module_type(const fg_module *m) { return m ? m->type : "(null)"; }
const char *fg_module_name(const fg_module *m) { return m ? m->name : ""; }
fg_module *fg_module_parent(const fg_module *m) { return m ? m->parent : NULL; }
int fg_module_num_children(const fg_module *m) { return m ? m->nchild : 0; }
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
    if (!m || !name) return NULL;
    fg__pentry *e = own_entry(m, name, false);
    return e ? e->t : NULL;
}

/* ------------------------------------------------------------ forward, modes */

static _Thread_local int tl_depth;
static _Thread_local bool tl_wrapped;

static fg_tensor *checkpointed_fwd(fg_tensor *x, void *ud) {
    fg_module *m = ud;
    return m->forward(m, x, m->ud);
}

fg_tensor *fg__module_forward_body(fg_module *m, fg_tensor *x) {
    return m->checkpoint ? fg_checkpoint(checkpointed_fwd, x, m) : m->forward(m, x, m->ud);
}

fg_tensor *fg_module_forward(fg_module *m, fg_tensor *x) {
    if (!m) {
        fg_error(FG_EINVAL, "module_forward: NULL module");
        return NULL;
    }
    if (!x) {
        fg_error_wrap(FG_EINVAL, "forward of %s: NULL input (an earlier call failed)", m->type);
        return NULL;
    }
    if (fg__module_ready(m)) return NULL;
    if (m->flat->deferred && fg__module_materialize(m)) return NULL; /* empty init, no strategy */
    if (!m->forward) {
        char b[256];
        fg_error(FG_EUNSUPPORTED, "module %s (%s) is a container without a forward",
                 fg__module_path(m, b, sizeof b), m->type);
        return NULL;
    }
    if (tl_depth++ == 0) tl_wrapped = false;
    fg_tensor *y = m->wrap_unit >= 0 && m->flat->wrap ? fg__module_forward_wrapped(m, x)
                                                      : fg__module_forward_body(m, x);
    if (!y && !tl_wrapped) { /* name the innermost module once */
        char b[256];
        fg_error_wrap(FG_EINVAL, "in module %s (%s)", fg__module_path(m, b, sizeof b), m->type);
        tl_wrapped = true;
    }
    tl_depth--;
    return y;
}

void fg_module_train(fg_module *m, bool on) {
    if (!m) return;
    m->training = on;
    for (int i = 0; i < m->nchild; i++) fg_module_train(m->child[i], on);
}

bool fg_module_is_training(const fg_module *m) { return m && m->training; }
