/* Parameter groups (PyTorch's param_groups): groups made by name patterns,
 * their lr and weight decay, and the "no decay on biases, norms and
 * embeddings" rule. A step reads them through the segments (optim.c). */
#include <fnmatch.h>
#include <math.h>
#include <string.h>

#include "optim_impl.h"

/* Does name match one of the comma-separated patterns? */
static bool matches(const char *patterns, const char *name) {
    const char *p = patterns;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char pat[256];
        if (len > 0 && len < sizeof pat) {
            memcpy(pat, p, len);
            pat[len] = 0;
            if (fnmatch(pat, name, 0) == 0) return true;
        }
        if (!comma) break;
        p = comma + 1;
    }
    return false;
}

int fg_optimizer_add_param_group(fg_optimizer *o, const fg_param_group *g) {
    if (!o || !g || !g->params || !*g->params) {
        fg_error(FG_EINVAL, "add_param_group: NULL optimizer or group, or no params pattern "
                            "(give fnmatch patterns of parameter names, e.g. \"*.bias\")");
        return -1;
    }
    double lr = g->lr == 0 ? o->group[0].lr : g->lr;
    if (!(lr > 0) || !isfinite(lr) || !(g->weight_decay >= 0) || !isfinite(g->weight_decay)) {
        fg_error(FG_EINVAL,
                 "add_param_group \"%s\": lr = %g, weight_decay = %g: expected lr > 0 (0 = the "
                 "optimizer's) and weight_decay >= 0",
                 g->params, g->lr, g->weight_decay);
        return -1;
    }
    fg_module *m = o->m;
    int64_t hit = 0;
    for (int64_t i = 0; i < m->p_count; i++)
        hit += matches(g->params, m->flat->slot[m->p_first + i].name + m->prefix_len);
    if (!hit) {
        fg_error(FG_EINVAL,
                 "add_param_group: \"%s\" matches no parameter of the module (names as "
                 "fg_module_param_name gives them, e.g. \"%s\")",
                 g->params, m->p_count ? m->flat->slot[m->p_first].name + m->prefix_len : "");
        return -1;
    }
    fg__pgroup *grown = fg_realloc(o->group, sizeof *grown * (size_t)(o->ngroups + 1));
    if (!grown) {
        fg_error(FG_ENOMEM, "add_param_group: %d groups", o->ngroups + 1);
        return -1;
    }
    o->group = grown;
    int k = o->ngroups++;
    o->group[k] = (fg__pgroup){.lr = lr, .wd = g->weight_decay};
    for (int64_t i = 0; i < m->p_count; i++)
        if (matches(g->params, m->flat->slot[m->p_first + i].name + m->prefix_len))
            o->p_group[i] = k;
    fg__optimizer_segments(o);
    return k;
}

int fg_optimizer_num_groups(const fg_optimizer *o) { return o ? o->ngroups : 0; }

static bool group_ok(const fg_optimizer *o, int g) { return o && g >= 0 && g < o->ngroups; }

double fg_optimizer_group_lr(const fg_optimizer *o, int g) {
    return group_ok(o, g) ? o->group[g].lr : 0;
}

double fg_optimizer_group_weight_decay(const fg_optimizer *o, int g) {
    return group_ok(o, g) ? o->group[g].wd : 0;
}

double fg_optimizer_group_initial_lr(const fg_optimizer *o, int g) {
    if (!group_ok(o, g)) return 0;
    return o->group[g].has_initial ? o->group[g].initial_lr : o->group[g].lr;
}

bool fg__optimizer_momentum(const fg_optimizer *o, double *m) {
    const char *n = o->vt->name;
    if (!strcmp(n, "SGD") && o->nstates) *m = o->o.sgd.momentum;
    else if (!strcmp(n, "RMSprop") && o->o.rmsprop.momentum > 0) *m = o->o.rmsprop.momentum;
    else if (!strcmp(n, "Adam")) *m = o->o.adam.beta1;
    else if (!strcmp(n, "AdamW")) *m = o->o.adamw.beta1;
    else if (!strcmp(n, "Lion")) *m = o->o.lion.beta1;
    else return false;
    return true;
}

void fg__optimizer_set_momentum(fg_optimizer *o, double m) {
    const char *n = o->vt->name;
    if (!strcmp(n, "SGD")) o->o.sgd.momentum = m;
    else if (!strcmp(n, "RMSprop")) o->o.rmsprop.momentum = m;
    else if (!strcmp(n, "Adam")) o->o.adam.beta1 = m;
    else if (!strcmp(n, "AdamW")) o->o.adamw.beta1 = m;
    else if (!strcmp(n, "Lion")) o->o.lion.beta1 = m;
}

fg_status fg_optimizer_set_group_lr(fg_optimizer *o, int g, double lr) {
    if (!group_ok(o, g))
        return fg_error(FG_EINVAL, "set_group_lr: group %d of %d", g, o ? o->ngroups : 0);
    if (!(lr >= 0) || !isfinite(lr))
        return fg_error(FG_EINVAL, "set_group_lr: group %d lr = %g: expected a finite value >= 0",
                        g, lr);
    o->group[g].lr = lr;
    fg__optimizer_segments(o);
    return FG_OK;
}

fg_status fg_optimizer_set_group_weight_decay(fg_optimizer *o, int g, double wd) {
    if (!group_ok(o, g))
        return fg_error(FG_EINVAL, "set_group_weight_decay: group %d of %d", g, o ? o->ngroups : 0);
    if (!(wd >= 0) || !isfinite(wd))
        return fg_error(FG_EINVAL,
                        "set_group_weight_decay: group %d weight_decay = %g: expected >= 0", g, wd);
    o->group[g].wd = wd;
    fg__optimizer_segments(o);
    return FG_OK;
}

int fg_optimizer_param_group_of(const fg_optimizer *o, int64_t i) {
    return o && i >= 0 && i < o->m->p_count ? o->p_group[i] : -1;
}

bool fg_optimizer_param_no_decay(const fg_optimizer *o, int64_t i) {
    return o && i >= 0 && i < o->m->p_count && o->p_nodecay[i];
}

/* Marks the parameters of module `mod` (and its children) that the rule
 * excludes: all of a norm's or an embedding's, and every "bias". */
static void exclude(fg_optimizer *o, fg_module *mod, int64_t *count) {
    bool whole = strstr(mod->type, "Norm") || !strcmp(mod->type, "Embedding");
    fg_module *m = o->m;
    for (int k = 0; k < mod->params.n; k++) {
        fg__pentry *e = &mod->params.e[k];
        if (!whole && strcmp(e->name, "bias")) continue;
        for (int64_t i = 0; i < m->p_count; i++)
            if (m->flat->slot[m->p_first + i].e == e && !o->p_nodecay[i]) {
                o->p_nodecay[i] = true;
                ++*count;
            }
    }
    for (int c = 0; c < mod->nchild; c++) exclude(o, mod->child[c], count);
}

fg_status fg_optimizer_no_decay_bias_norm_embedding(fg_optimizer *o, int64_t *count) {
    if (!o) return fg_error(FG_EINVAL, "no_decay_bias_norm_embedding: NULL optimizer");
    int64_t n = 0;
    exclude(o, o->m, &n);
    if (count) *count = n;
    fg__optimizer_segments(o);
    return FG_OK;
}
