/* The loss scaler of 16-mixed, PyTorch's GradScaler: the loss is multiplied
 * by `scale` before backward so that small f16 gradients do not flush to
 * zero; before the step the gradients are divided by it again and checked.
 * A step whose gradients hold an inf or a NaN on any rank is skipped on
 * every rank (one allreduce of one float decides), and the scale backs off;
 * after growth_interval clean steps in a row it grows.
 *
 * Invariants: the scale is a power of two as long as the factors are (the
 * defaults are), so scaling and unscaling are exact in f32; `unscaled` is
 * true between fg_scaler_unscale and the end of fg_scaler_step, and
 * `found_inf` holds the agreed finding for that step. */
#include <math.h>

#include "core/core_impl.h"
#include "fulgur/precision.h"
#include "ops/ops_impl.h"

struct fg_scaler {
    fg_scaler_opts o;
    fg_scaler_state st;
    bool unscaled;
    int found_inf; /* 0: clean on every rank; else 1 + a rank that found one */
};

fg_scaler *fg_scaler_new(const fg_scaler_opts *o) {
    fg_scaler_opts d = o ? *o : (fg_scaler_opts){0};
    if (d.init_scale == 0) d.init_scale = 65536.0;
    if (d.growth_factor == 0) d.growth_factor = 2.0;
    if (d.backoff_factor == 0) d.backoff_factor = 0.5;
    if (d.growth_interval == 0) d.growth_interval = 2000;
    const char *bad = !(isfinite(d.init_scale) && d.init_scale > 0)         ? "init_scale"
                      : !(isfinite(d.growth_factor) && d.growth_factor > 1) ? "growth_factor"
                      : !(d.backoff_factor > 0 && d.backoff_factor < 1)     ? "backoff_factor"
                      : d.growth_interval < 0                               ? "growth_interval"
                                                                            : NULL;
    if (bad) {
        fg_error(FG_EINVAL,
                 "scaler: %s out of range (init_scale %g > 0, growth_factor %g > 1, "
                 "backoff_factor %g in (0, 1), growth_interval %lld > 0; 0 means the default)",
                 bad, d.init_scale, d.growth_factor, d.backoff_factor,
                 (long long)d.growth_interval);
        return NULL;
    }
    fg_scaler *s = fg_calloc(1, sizeof *s);
    if (!s) return NULL;
    s->o = d;
    s->st.scale = d.init_scale;
    return s;
}

void fg_scaler_free(fg_scaler *s) { fg_free(s); }

double fg_scaler_scale(const fg_scaler *s) { return s ? s->st.scale : 1.0; }

fg_status fg_scaler_unscale(fg_scaler *s, fg_module *m, fg_comm *comm) {
    if (!s || !m) return fg_error(FG_EINVAL, "scaler unscale: NULL %s", s ? "module" : "scaler");
    if (s->unscaled) return FG_OK;
    fg_tensor *g = fg_module_flat_grads(m);
    if (!g) return fg_error_wrap(FG_EINVAL, "scaler unscale: the module's gradients");
    bool bad; /* on the gradients' device: the flag alone comes back */
    FG_TRY(fg__ops_unscale(g, 1.0 / s->st.scale, &bad));
    /* 1 + this rank when it found one: the max names a rank that did */
    float flag = bad ? (float)(1 + (comm ? fg_comm_rank(comm) : 0)) : 0.0f;
    if (comm) FG_TRY(fg_comm_allreduce(comm, &flag, &flag, 1, FG_F32, FG_REDUCE_OP_MAX));
    s->found_inf = (int)flag;
    s->unscaled = true;
    return FG_OK;
}

fg_status fg_scaler_step(fg_scaler *s, fg_optimizer *opt, fg_comm *comm, bool *stepped) {
    if (stepped) *stepped = false;
    if (!s || !opt) return fg_error(FG_EINVAL, "scaler step: NULL %s", s ? "optimizer" : "scaler");
    FG_TRY(fg_scaler_unscale(s, fg_optimizer_module(opt), comm));
    s->unscaled = false;
    if (s->found_inf) {
        double old = s->st.scale;
        s->st.scale *= s->o.backoff_factor;
        s->st.growth_tracker = 0;
        s->st.skipped++;
        fg_log(FG_LOG_WARN,
               "16-mixed: optimizer step skipped: inf/NaN gradients (found on rank %d); loss "
               "scale %g -> %g; %lld skipped so far",
               s->found_inf - 1, old, s->st.scale, (long long)s->st.skipped);
        return FG_OK;
    }
    FG_TRY(fg_optimizer_step(opt));
    if (stepped) *stepped = true;
    if (++s->st.growth_tracker >= s->o.growth_interval) {
        double grown = s->st.scale * s->o.growth_factor;
        if (isfinite(grown)) s->st.scale = grown;
        s->st.growth_tracker = 0;
    }
    return FG_OK;
}

fg_scaler_state fg_scaler_get_state(const fg_scaler *s) {
    return s ? s->st : (fg_scaler_state){.scale = 1.0};
}

fg_status fg_scaler_set_state(fg_scaler *s, const fg_scaler_state *st) {
    if (!s || !st) return fg_error(FG_EINVAL, "scaler set_state: NULL argument");
    if (!(isfinite(st->scale) && st->scale > 0) || st->growth_tracker < 0 || st->skipped < 0)
        return fg_error(FG_EINVAL,
                        "scaler set_state: scale %g (want finite and > 0), growth_tracker %lld, "
                        "skipped %lld (want >= 0)",
                        st->scale, (long long)st->growth_tracker, (long long)st->skipped);
    s->st = *st;
    s->unscaled = false;
    s->found_inf = 0;
    return FG_OK;
}
