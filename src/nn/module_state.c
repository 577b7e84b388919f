/* The state dict: a module's parameters then its buffers, by dotted name
 * relative to the module ("blocks.0.attn.qkv.weight"), and loading one.
 *
 * load_state checks every entry before it writes any, so a failed load
 * leaves the model as it was, and it reports all shape mismatches (and, when
 * strict, all missing and unexpected names) in one message rather than the
 * first: fixing a checkpoint should not take one run per name. A tied weight
 * answers to each of its names. */
#include <stdio.h>
#include <string.h>

#include "nn_impl.h"

int64_t fg_module_state_count(fg_module *m) {
    return fg__module_flat(m) ? m->p_count + m->b_count : -1;
}

const char *fg_module_state_name(fg_module *m, int64_t i) {
    if (!fg__module_flat(m) ||
        !fg__module_index_ok(m, i, m->p_count + m->b_count, "module_state_name"))
        return NULL;
    return i < m->p_count ? fg_module_param_name(m, i) : fg_module_buffer_name(m, i - m->p_count);
}

fg_tensor *fg_module_state_tensor(fg_module *m, int64_t i) {
    if (!fg__module_flat(m) ||
        !fg__module_index_ok(m, i, m->p_count + m->b_count, "module_state_tensor"))
        return NULL;
    return i < m->p_count ? fg_module_param(m, i) : fg_module_buffer(m, i - m->p_count);
}

/* State entry k of m (params then buffers) whose name is `name`, or -1. */
static int64_t find_state(fg_module *m, const char *name) {
    int64_t i = fg_module_find_param(m, name);
    if (i >= 0) return i;
    for (int64_t b = 0; b < m->b_count; b++)
        if (!strcmp(m->flat->slot[m->flat->np + m->b_first + b].name + m->prefix_len, name))
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
    if (b->len >= sizeof b->s - 1) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->s + b->len, sizeof b->s - b->len, fmt, ap);
    va_end(ap);
    if (k > 0) b->len = FG_MIN(sizeof b->s - 1, b->len + (size_t)k);
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
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
            if (nunexp < LIST_MAX) msg_add(&unexp, "%s%s", nunexp ? ", " : "", e->name);
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
        for (int d = 0; same && d < t->ndim; d++) same = e->shape[d] == t->shape[d];
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
        if (seen[i]) continue;
        /* a shape mismatch already reports it */
        bool reported = false;
        for (int64_t k = 0; k < n && !reported; k++) reported = target[k] == i;
        if (reported) continue;
        if (nmiss < LIST_MAX) msg_add(&miss, "%s%s", nmiss ? ", " : "", fg_module_state_name(m, i));
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
    /* a model made under empty init gets its initial values first (the
     * entries not loaded keep them), so that no setup re-initialises what
     * is loaded here (init_module(empty_init=True) + load_from_checkpoint) */
    if (fg__module_deferred(m)) {
        s = fg__module_materialize(m);
        if (s != FG_OK) goto done;
    }
    for (int64_t k = 0; k < n; k++) {
        if (target[k] < 0) continue;
        fg_tensor *t = fg_module_state_tensor(m, target[k]);
        s = fg_convert(t->data, t->dtype, entries[k].data, entries[k].dtype, t->numel);
        if (s != FG_OK) goto done; /* cannot happen: dtypes were checked */
    }
done:
    fg_free(target);
    fg_free(seen);
    return s;
}
