/* What every optimizer shares: construction over a module's flat buffers,
 * the weight-decay segments, state buffers, step bookkeeping and lr. */
#include <math.h>
#include <string.h>

#include "optim_impl.h"

fg_optimizer *fg__optimizer_new(const fg__optim_vt *vt, fg_module *m, double lr, int nstates,
                                const char *const *names, double wd, bool matrices_only) {
    if (!m) {
        fg_error(FG_EINVAL, "%s: NULL module (an earlier constructor failed?)", vt->name);
        return NULL;
    }
    if (fg__module_ready(m)) {
        fg_error_wrap(FG_EINVAL, "%s", vt->name);
        return NULL;
    }
    fg_optimizer *o = fg_calloc(1, sizeof *o);
    if (!o) return NULL;
    o->vt = vt;
    o->m = m;
    o->dt = m->flat->dtype;
    o->sdt = o->dt == FG_BF16 || o->dt == FG_F16 ? FG_F32 : o->dt;
    o->numel = m->p_numel;
    o->param = fg_tensor_data(m->flat_p);
    o->grad = fg_tensor_data(m->flat_g);
    o->lr = lr;
    o->state_end = o->numel;
    o->nstates = nstates;
    /* the state buffers come at first use (fg__optimizer_ensure_state), so
     * that an optimizer a sharded strategy cuts at setup only ever holds its
     * shard */
    for (int i = 0; i < nstates; i++) o->state_name[i] = names[i];
    /* one group, every parameter in it; AdamW's ndim < 2 rule as exclusions */
    int64_t np = m->p_count;
    o->ngroups = 1;
    o->group = fg_calloc(1, sizeof *o->group);
    o->p_group = fg_calloc((size_t)np + 1, sizeof *o->p_group);
    o->p_nodecay = fg_calloc((size_t)np + 1, sizeof *o->p_nodecay);
    o->seg_begin = fg_calloc((size_t)np + 2, sizeof *o->seg_begin);
    o->seg_wd = fg_calloc((size_t)np + 1, sizeof *o->seg_wd);
    o->seg_lr = fg_calloc((size_t)np + 1, sizeof *o->seg_lr);
    if (!o->group || !o->p_group || !o->p_nodecay || !o->seg_begin || !o->seg_wd || !o->seg_lr)
        goto fail;
    o->group[0] = (fg__pgroup){.lr = lr, .wd = wd};
    for (int64_t i = 0; i < np; i++)
        o->p_nodecay[i] = matrices_only && m->flat->slot[m->p_first + i].t->ndim < 2;
    fg__optimizer_segments(o);
    return o;
fail:
    fg_error_wrap(FG_ENOMEM, "%s: parameter groups of %lld parameters", vt->name, (long long)np);
    fg_optimizer_free(o);
    return NULL;
}

void fg__optimizer_segments(fg_optimizer *o) {
    fg_module *m = o->m;
    o->lr = o->group[0].lr;
    o->nseg = 0;
    for (int64_t i = 0; i < m->p_count; i++) {
        fg_tensor *p = m->flat->slot[m->p_first + i].t;
        const fg__pgroup *g = &o->group[o->p_group[i]];
        double d = o->p_nodecay[i] ? 0 : g->wd;
        int64_t off = m->flat->slot[m->p_first + i].off - m->p_off;
        if (p->numel == 0) continue;
        if (o->nseg == 0 || o->seg_wd[o->nseg - 1] != d || o->seg_lr[o->nseg - 1] != g->lr) {
            o->seg_begin[o->nseg] = off;
            o->seg_wd[o->nseg] = d;
            o->seg_lr[o->nseg++] = g->lr;
        }
    }
    o->seg_begin[o->nseg] = o->numel;
}

fg_status fg__optimizer_ensure_state(fg_optimizer *o) {
    int64_t n = o->state_end - o->state_begin;
    for (int i = 0; i < o->nstates; i++) {
        if (o->state[i]) continue;
        o->state[i] = fg_tensor_new_on(o->host_state ? NULL : o->dev, o->sdt, 1, &n);
        fg_status s = o->state[i] ? FG_OK : FG_ENOMEM;
        if (s == FG_OK && o->state_init[i] != 0) s = fg_tensor_fill(o->state[i], o->state_init[i]);
        if (s != FG_OK) {
            for (int k = 0; k <= i; k++) {
                fg_tensor_free(o->state[k]);
                o->state[k] = NULL;
            }
            return fg_error_wrap(s, "%s: state for %lld parameters", o->vt->name, (long long)n);
        }
    }
    return FG_OK;
}

fg_status fg_optimizer_to_device(fg_optimizer *o) {
    if (!o) return fg_error(FG_EINVAL, "optimizer to_device: NULL optimizer");
    fg_dev *dev = fg_tensor_dev(o->m->flat_p);
    if (dev && fg_dev_host_accessible(dev)) dev = NULL;
    if (dev == o->dev) return FG_OK;
    if (dev && (o->offload || o->state_begin != 0 || o->state_end != o->numel))
        return fg_error(FG_EUNSUPPORTED,
                        "%s on device %s: an offloaded or sharded optimizer stays on the host",
                        o->vt->name, fg_dev_name(dev));
    for (int i = 0; i < o->nstates; i++) { /* a state made before the move follows it */
        if (!o->state[i]) continue;
        fg_tensor *moved = fg_tensor_to(o->state[i], dev);
        if (!moved) return fg_error_wrap(fg_last_status(), "%s state", o->vt->name);
        fg_tensor_free(o->state[i]);
        o->state[i] = moved;
    }
    if (o->dev) fg_dev_close(o->dev); /* the reference taken below */
    if (dev) fg_dev_retain(dev);
    o->dev = dev;
    o->param = fg_tensor_data(o->m->flat_p);
    o->grad = fg_tensor_data(o->m->flat_g);
    return FG_OK;
}

void fg_optimizer_free(fg_optimizer *o) {
    if (!o) return;
    fg_error_kept kept; /* a _free never changes the caller's error (core.h) */
    fg_error_keep(&kept);
    if (o->hook.detach) o->hook.detach(o->hook.ud);
    for (int i = 0; i < o->nstates; i++) fg_tensor_free(o->state[i]);
    fg__offload_free(o);
    fg_free(o->hbuf);
    fg_free(o->host_params);
    fg_dev_close(o->dev); /* the optimizer's reference */
    fg_free(o->seg_begin);
    fg_free(o->seg_wd);
    fg_free(o->seg_lr);
    fg_free(o->group);
    fg_free(o->p_group);
    fg_free(o->p_nodecay);
    fg_free(o);
    fg_error_restore(&kept);
}

/* A step of an optimizer on a device whose state is in host memory or on
 * disk: the parameter range (unless the nvme store holds it) and the
 * gradient range out to host buffers, the CPU's step on them, the
 * parameters back in: what offload moves, counted by the device. */
static FG_MUST_USE fg_status host_step(fg_optimizer *o, int64_t begin, int64_t end, void *param,
                                       const void *grad) {
    size_t bytes = fg_dtype_size(o->dt) * (size_t)(end - begin);
    bool in_store = fg__optimizer_offload_param_store(o, NULL) != NULL || o->host_params;
    if (o->hbuf_cap < 2 * bytes) {
        void *b = fg_realloc(o->hbuf, 2 * bytes);
        if (!b) return fg_error_wrap(FG_ENOMEM, "%s step: host buffers for offload", o->vt->name);
        o->hbuf = b;
        o->hbuf_cap = 2 * bytes;
    }
    char *hp = o->hbuf, *hg = hp + bytes;
    if (o->host_params) /* the parameters' only copy: updated in place */
        hp = (char *)o->host_params + fg_dtype_size(o->dt) * (size_t)(begin - o->state_begin);
    if (!in_store) FG_TRY(fg_dev_copy_d2h(o->dev, hp, param, bytes));
    FG_TRY(fg_dev_copy_d2h(o->dev, hg, grad, bytes));
    o->step_host = true;
    fg_status st;
    if (o->offload) {
        st = fg__offload_step_range(o, begin, end, hp, hg);
    } else {
        st = fg__optimizer_ensure_state(o);
        void *state[FG_OPTIM_MAX_STATES] = {0};
        for (int i = 0; st == FG_OK && i < o->nstates; i++)
            state[i] = (char *)fg_tensor_data(o->state[i]) +
                       fg_dtype_size(o->sdt) * (size_t)(begin - o->state_begin);
        if (st == FG_OK) st = o->vt->step_range(o, begin, end, hp, hg, state, o->steps + 1);
    }
    o->step_host = false;
    if (st == FG_OK && !in_store) st = fg_dev_copy_h2d(o->dev, param, hp, bytes);
    return st;
}

fg_status fg__optimizer_offload_cpu(fg_optimizer *o) {
    if (!o || !o->dev || o->host_state) return FG_OK;
    if (o->offload)
        return fg_error(FG_ESTATE, "offload_optimizer_device=cpu: the state is on disk already");
    for (int i = 0; i < o->nstates; i++) { /* a state made already moves to the host */
        if (!o->state[i]) continue;
        fg_tensor *h = fg_tensor_to(o->state[i], NULL);
        if (!h) return fg_error_wrap(fg_last_status(), "offload_optimizer_device=cpu");
        fg_tensor_free(o->state[i]);
        o->state[i] = h;
    }
    o->host_state = true;
    return FG_OK;
}

fg_status fg__optimizer_offload_params_cpu(fg_optimizer *o) {
    if (!o || !o->dev || o->host_params) return FG_OK;
    if (!o->host_state || o->offload)
        return fg_error(FG_ESTATE, "offload_params_device=cpu: the state must be in host memory "
                                   "(offload_optimizer_device=cpu) first");
    size_t es = fg_dtype_size(o->dt), bytes = es * (size_t)(o->state_end - o->state_begin);
    void *h = fg_alloc(bytes ? bytes : 1);
    if (!h) return fg_error_wrap(FG_ENOMEM, "offload_params_device=cpu: %zu bytes", bytes);
    fg_status st =
        fg_dev_copy_d2h(o->dev, h, (char *)o->param + es * (size_t)o->state_begin, bytes);
    if (st != FG_OK) {
        fg_free(h);
        return fg_error_wrap(st, "offload_params_device=cpu");
    }
    o->host_params = h;
    return FG_OK;
}

void *fg__optimizer_host_params(const fg_optimizer *o) { return o ? o->host_params : NULL; }

fg_status fg__optimizer_step_range(fg_optimizer *o, int64_t begin, int64_t end, void *param,
                                   const void *grad) {
    if (!o) return fg_error(FG_EINVAL, "optimizer step: NULL optimizer");
    if (begin < o->state_begin || end < begin || end > o->state_end)
        return fg_error(FG_EINVAL, "%s step: range [%lld, %lld) outside the state's [%lld, %lld)",
                        o->vt->name, (long long)begin, (long long)end, (long long)o->state_begin,
                        (long long)o->state_end);
    size_t es = fg_dtype_size(o->dt), at = es * (size_t)begin;
    if (!param) param = (char *)o->param + at;
    if (!grad) grad = (const char *)o->grad + at;
    if (o->dev && (o->host_state || o->offload)) return host_step(o, begin, end, param, grad);
    if (o->offload) return fg__offload_step_range(o, begin, end, param, grad);
    FG_TRY(fg__optimizer_ensure_state(o));
    void *state[FG_OPTIM_MAX_STATES] = {0};
    for (int i = 0; i < o->nstates; i++)
        state[i] = (char *)fg_tensor_data(o->state[i]) +
                   fg_dtype_size(o->sdt) * (size_t)(begin - o->state_begin);
    return o->vt->step_range(o, begin, end, param, grad, state, o->steps + 1);
}

/* memcpy into zeroed memory, leaving the pages of all-zero parts of src
 * untouched (a fresh state never written is all zero: cutting it to a
 * shard then makes no page resident). */
static void copy_nonzero(char *dst, const char *src, size_t n) {
    enum { CHUNK = 4096 };
    for (size_t at = 0; at < n; at += CHUNK) {
        size_t len = n - at < CHUNK ? n - at : CHUNK;
        const char *p = src + at;
        size_t k = 0;
        while (k < len && !p[k]) k++;
        if (k < len) memcpy(dst + at, p, len);
    }
}

fg_status fg__optimizer_shard_state(fg_optimizer *o, int64_t begin, int64_t end) {
    if (!o || begin < 0 || end < begin || end > o->numel)
        return fg_error(FG_EINVAL, "optimizer shard: range [%lld, %lld) outside [0, %lld)",
                        (long long)begin, (long long)end, (long long)(o ? o->numel : 0));
    if (o->offload)
        return fg_error(FG_ESTATE, "optimizer shard: the state is offloaded to disk already; shard "
                                   "it before offloading it");
    if (o->nstates && !o->state[0]) { /* never used: made at the shard's size */
        int64_t b = o->state_begin, e = o->state_end;
        o->state_begin = begin;
        o->state_end = end;
        fg_status st = fg__optimizer_ensure_state(o);
        if (st != FG_OK) {
            o->state_begin = b;
            o->state_end = e;
        }
        return st;
    }
    fg_tensor *fresh[FG_OPTIM_MAX_STATES] = {0};
    int64_t n = end - begin;
    fg_dev *sdev = o->nstates ? fg_tensor_dev(o->state[0]) : NULL; /* NULL: the host */
    if (sdev && fg_dev_host_accessible(sdev)) sdev = NULL;
    for (int i = 0; i < o->nstates; i++)
        if (!(fresh[i] = fg_tensor_new_on(sdev, o->sdt, 1, &n))) {
            for (int k = 0; k < i; k++) fg_tensor_free(fresh[k]);
            return fg_error_wrap(FG_ENOMEM, "optimizer shard of %lld elements", (long long)n);
        } else if (o->state_init[i] != 0) {
            /* a new host tensor of the state's dtype: its fill cannot fail */
            fg__status_drop(fg_tensor_fill(fresh[i], o->state_init[i]));
        }
    int64_t lo = FG_MAX(begin, o->state_begin), hi = FG_MIN(end, o->state_end);
    size_t es = fg_dtype_size(o->sdt);
    for (int i = 0; i < o->nstates; i++) {
        fg_status cs = FG_OK;
        if (sdev && lo < hi) /* on a device: a copy on it */
            cs = fg_dev_copy_d2d(sdev, (char *)fg_tensor_data(fresh[i]) + es * (size_t)(lo - begin),
                                 (char *)fg_tensor_data(o->state[i]) +
                                     es * (size_t)(lo - o->state_begin),
                                 es * (size_t)(hi - lo));
        if (cs != FG_OK) {
            for (int k = 0; k < o->nstates; k++) fg_tensor_free(fresh[k]);
            return fg_error_wrap(cs, "optimizer shard");
        }
        if (!sdev && lo < hi && o->state_init[i] != 0)
            memcpy((char *)fg_tensor_data(fresh[i]) + es * (size_t)(lo - begin),
                   (char *)fg_tensor_data(o->state[i]) + es * (size_t)(lo - o->state_begin),
                   es * (size_t)(hi - lo));
        else if (!sdev && lo < hi)
            copy_nonzero((char *)fg_tensor_data(fresh[i]) + es * (size_t)(lo - begin),
                         (char *)fg_tensor_data(o->state[i]) + es * (size_t)(lo - o->state_begin),
                         es * (size_t)(hi - lo));
        fg_tensor_free(o->state[i]);
        o->state[i] = fresh[i];
    }
    o->state_begin = begin;
    o->state_end = end;
    return FG_OK;
}

void fg__optimizer_advance(fg_optimizer *o) { o->steps++; }

void fg__optimizer_set_hook(fg_optimizer *o, const fg__optim_hook *h) {
    o->hook = h ? *h : (fg__optim_hook){0};
}

fg_status fg_optimizer_step(fg_optimizer *o) {
    if (!o) return fg_error(FG_EINVAL, "optimizer step: NULL optimizer");
    bool skip = false;
    if (o->hook.pre_step) FG_TRY(o->hook.pre_step(o->hook.ud, o, &skip));
    if (!skip) FG_TRY(fg__optimizer_step_range(o, o->state_begin, o->state_end, NULL, NULL));
    fg__optimizer_advance(o);
    return o->hook.post_step ? o->hook.post_step(o->hook.ud, o) : FG_OK;
}

void fg_optimizer_zero_grad(fg_optimizer *o) {
    if (o) fg_module_zero_grad(o->m);
}

double fg_optimizer_lr(const fg_optimizer *o) { return o ? o->lr : 0; }

fg_status fg_optimizer_set_lr(fg_optimizer *o, double lr) {
    if (!o) return fg_error(FG_EINVAL, "set_lr: NULL optimizer");
    if (!(lr >= 0) || !isfinite(lr))
        return fg_error(FG_EINVAL, "set_lr: lr = %g: expected a finite value >= 0", lr);
    for (int g = 0; g < o->ngroups; g++) o->group[g].lr = lr;
    fg__optimizer_segments(o);
    return FG_OK;
}

int64_t fg_optimizer_step_count(const fg_optimizer *o) { return o ? o->steps : 0; }

fg_status fg_optimizer_set_step_count(fg_optimizer *o, int64_t steps) {
    if (!o) return fg_error(FG_EINVAL, "set_step_count: NULL optimizer");
    if (steps < 0)
        return fg_error(FG_EINVAL, "set_step_count: %lld: expected >= 0", (long long)steps);
    o->steps = steps;
    return FG_OK;
}

const char *fg_optimizer_name(const fg_optimizer *o) { return o ? o->vt->name : "(null)"; }
fg_module *fg_optimizer_module(const fg_optimizer *o) { return o ? o->m : NULL; }
int fg_optimizer_num_states(const fg_optimizer *o) { return o ? o->nstates : 0; }

const char *fg_optimizer_state_name(const fg_optimizer *o, int i) {
    return o && i >= 0 && i < o->nstates ? o->state_name[i] : NULL;
}

void fg_optimizer_state_range(const fg_optimizer *o, int64_t *begin, int64_t *end) {
    if (begin) *begin = o ? o->state_begin : 0;
    if (end) *end = o ? o->state_end : 0;
}

fg_tensor *fg_optimizer_state(fg_optimizer *o, int i) {
    if (!o || i < 0 || i >= o->nstates) {
        fg_error(FG_EINVAL, "optimizer_state: index %d out of range (%d states)", i,
                 o ? o->nstates : 0);
        return NULL;
    }
    return fg__optimizer_ensure_state(o) == FG_OK ? o->state[i] : NULL;
}

/* ------------------------------------------------------------ schedules */

double fg_lr_at(const fg_lr_schedule *s, int64_t step) {
    if (!s) return 0;
    if (step < 0) step = 0;
    if (step < s->warmup_steps) return s->lr * (double)(step + 1) / (double)(s->warmup_steps + 1);
    if (s->kind != FG_LR_COSINE) return s->lr;
    if (s->decay_steps <= s->warmup_steps || step >= s->decay_steps) return s->min_lr;
    double r = (double)(step - s->warmup_steps) / (double)(s->decay_steps - s->warmup_steps);
    return s->min_lr + 0.5 * (1.0 + cos(3.14159265358979323846 * r)) * (s->lr - s->min_lr);
}
