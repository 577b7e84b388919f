/* qadam: Bagua's QAdam (QAdamAlgorithm with QAdamOptimizer; Tang et al.
 * 2020, APMSqueeze) over fulgur's AdamW. The first warmup_steps
 * synchronising backwards average the gradients (as ddp) and the optimizer
 * steps after them are AdamW's own. From then on the gradients stay local;
 * at each optimizer step the momentum is updated from this rank's
 * gradient, m = beta1 m + (1 - beta1) g, averaged over the ranks through
 * 8-bit chunks bucket by bucket (bytegrad's scatter-gather, hierarchical or
 * flat), and the step keeps the variance v of the last warm-up step W:
 * p = p (1 - lr wd) - lr / bc1(t) * m / (sqrt(v) / sqrt(bc2(W)) + eps), the
 * AdamW update without its moment updates (the decoupled weight decay is
 * AdamW's: Bagua's QAdamOptimizer takes a weight_decay it never applies, so
 * weight_decay 0 gives Bagua's update). The phase follows the optimizer's
 * step count (restored from a checkpoint).
 *
 * Departures from Bagua's code, each to the paper's algorithm or to
 * Lightning's loop: its optimizer updates the moments on steps
 * 1 .. warmup_steps - 1 only, so the gradient averaged in backward
 * warmup_steps is never used (here steps 1 .. warmup_steps are plain Adam);
 * it corrects the frozen variance by 1 - beta2^t of the current step t,
 * which grows while v stays, so its steps grow up to 1 / sqrt(1 - beta2^W)
 * times Adam's (3.2x for W = 100; here the variance as it froze,
 * bias-corrected at W); and it updates the momentum in backward, before
 * gradient clipping and loss unscaling, which would then apply to the
 * warm-up's moments and not to the later ones (here at the step, from the
 * gradient as clipped and unscaled). */
#include <math.h>
#include <string.h>

#include "bagua_impl.h"
#include "optim/optim_impl.h"

fg_status fg__qadam_setup(fg__bagua_state *st) {
    fg_optimizer *o = st->s->opt;
    if (!o || strcmp(fg_optimizer_name(o), "AdamW") || fg_optimizer_module(o) != st->s->model)
        return fg_error(FG_EINVAL,
                        "bagua qadam: needs an AdamW optimizer over the whole model (QAdam is "
                        "Adam with compressed momentum); got %s",
                        o ? fg_optimizer_name(o) : "no optimizer");
    int64_t b, e;
    fg_optimizer_state_range(o, &b, &e);
    if (b != 0 || e != st->n)
        return fg_error(FG_EINVAL, "bagua qadam: the optimizer's state is sharded");
    if (st->dev && !(st->qh = fg_alloc(3 * sizeof(float) * (size_t)FG_MAX(st->n, 1))))
        return fg_error_wrap(FG_ENOMEM, "bagua qadam: host copies of the optimizer state");
    return FG_OK;
}

fg_status fg__qadam_bucket(fg__bagua_state *st, const fg_ddp_bucket *b) {
    if (st->s->opt->steps < st->o.warmup_steps)
        return fg_ddp_bucket_allreduce(b, b->grad, b->numel, FG_REDUCE_OP_AVG);
    return FG_OK; /* the gradient stays local: the momentum travels at the step */
}

fg_status fg__qadam_pre_step(void *ud, fg_optimizer *o, bool *skip) {
    fg__bagua_state *st = ud;
    if (o->steps < st->o.warmup_steps) return FG_OK; /* AdamW's own step */
    FG_TRY(fg__optimizer_ensure_state(o));
    *skip = true;
    const fg_adamw_opts *ao = &o->o.adamw;
    float *dp = o->param, *dm = fg_tensor_data(o->state[0]);
    const float *dg = o->grad, *dv = fg_tensor_data(o->state[1]);
    float *p = dp, *m = dm;
    const float *g = dg, *v = dv;
    size_t bytes = sizeof(float) * (size_t)st->n;
    if (st->dev) { /* on a device: the step on host copies, p and m back in after */
        float *hg = st->qh + st->n, *hv = st->qh + 2 * st->n;
        FG_TRY(fg__stage_out(st->dev, p = st->xh, dp, bytes));
        FG_TRY(fg__stage_out(st->dev, m = st->qh, dm, bytes));
        FG_TRY(fg__stage_out(st->dev, hg, dg, bytes));
        FG_TRY(fg__stage_out(st->dev, hv, dv, bytes));
        g = hg;
        v = hv;
    }
    const float b1 = (float)ao->beta1, c1 = (float)(1 - ao->beta1);
    for (int64_t i = 0; i < st->n; i++) m[i] = m[i] * b1 + c1 * g[i];
    /* bucket by bucket, as ddp's buckets (the same on every rank) */
    int nb = fg__ddp_reducer_num_buckets(st->s->reducer);
    for (int k = 0; k < nb; k++) {
        int64_t lo, hi;
        fg__ddp_reducer_bucket_range(st->s->reducer, k, &lo, &hi);
        fg_status rc = fg__bagua_centralized(st, m + lo, hi - lo, fg__q8_average);
        if (rc != FG_OK)
            return fg_error_wrap(rc,
                                 "bagua qadam: averaging the momentum of bucket %d at step %lld", k,
                                 (long long)o->steps + 1);
    }
    /* the momentum's bias correction of this step; the variance's of the
     * step it froze at */
    double t = (double)(o->steps + 1), t2 = (double)st->o.warmup_steps;
    double bc1 = 1 - pow(ao->beta1, t), bc2 = 1 - pow(ao->beta2, t2);
    const float rb = (float)sqrt(bc2), eps = (float)ao->eps;
    for (int64_t k = 0; k < o->nseg; k++) {
        const float step = (float)(o->seg_lr[k] / bc1);
        const float decay = (float)(1 - o->seg_lr[k] * o->seg_wd[k]);
        for (int64_t i = o->seg_begin[k]; i < o->seg_begin[k + 1]; i++)
            p[i] = p[i] * decay - step * (m[i] / (sqrtf(v[i]) / rb + eps));
    }
    if (st->dev) {
        FG_TRY(fg__stage_in(st->dev, dp, p, bytes));
        FG_TRY(fg__stage_in(st->dev, dm, m, bytes));
    }
    return FG_OK;
}
