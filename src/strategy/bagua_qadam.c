/* qadam: Bagua's QAdam (QAdamAlgorithm with QAdamOptimizer) over fulgur's
 * AdamW. The first warmup_steps synchronising backwards average the
 * gradients (as ddp) and the optimizer steps after them are AdamW's own.
 * From then on each bucket's momentum is updated from this rank's gradient,
 * m = beta1 m + (1 - beta1) g, and averaged over the ranks through 8-bit
 * chunks (bytegrad's scatter-gather, hierarchical or flat); the optimizer
 * step keeps the variance v of the last warm-up step and applies
 * p = p (1 - lr wd) - lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps), the
 * AdamW update without its moment updates (the decoupled weight decay is
 * AdamW's: Bagua's QAdamOptimizer takes a weight_decay it never applies,
 * so weight_decay 0 gives Bagua's update).
 *
 * The phase follows the optimizer's step count (restored from a
 * checkpoint), so a resumed run goes on where it stopped.
 *
 * Departure from Bagua's code: its optimizer updates the moments on steps
 * 1 .. warmup_steps - 1 only, so the gradient averaged in backward
 * warmup_steps is never used; here steps 1 .. warmup_steps are plain Adam,
 * as the paper's warm-up. */
#include <math.h>
#include <string.h>

#include "bagua_impl.h"
#include "optim/optim_impl.h"

fg_status fg__qadam_setup(fg_bagua_state *st) {
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
    return FG_OK;
}

fg_status fg__qadam_bucket(fg_bagua_state *st, const fg_ddp_bucket *b) {
    fg_optimizer *o = st->s->opt;
    if (o->steps < st->o.warmup_steps) return fg_ddp_bucket_allreduce(b, b->grad, b->numel, FG_AVG);
    float *m = (float *)fg_tensor_data(o->state[0]) + b->offset;
    const float b1 = (float)o->o.adamw.beta1, c1 = (float)(1 - o->o.adamw.beta1);
    for (int64_t i = 0; i < b->numel; i++) m[i] = m[i] * b1 + c1 * b->grad[i];
    return fg__bagua_centralized(st, m, b->numel, fg__q8_average);
}

fg_status fg__qadam_pre_step(void *ud, fg_optimizer *o, bool *skip) {
    fg_bagua_state *st = ud;
    if (o->steps < st->o.warmup_steps) return FG_OK; /* AdamW's own step */
    *skip = true;
    const fg_adamw_opts *ao = &o->o.adamw;
    double t = (double)(o->steps + 1);
    double bc1 = 1 - pow(ao->beta1, t), bc2 = 1 - pow(ao->beta2, t);
    const float step = (float)(o->lr / bc1), rb = (float)sqrt(bc2), eps = (float)ao->eps;
    float *p = o->param;
    const float *m = fg_tensor_data(o->state[0]), *v = fg_tensor_data(o->state[1]);
    for (int64_t k = 0; k < o->nseg; k++) {
        const float decay = (float)(1 - o->lr * o->seg_wd[k]);
        for (int64_t i = o->seg_begin[k]; i < o->seg_begin[k + 1]; i++)
            p[i] = p[i] * decay - step * (m[i] / (sqrtf(v[i]) / rb + eps));
    }
    return FG_OK;
}
