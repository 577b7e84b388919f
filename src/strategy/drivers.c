/* One driver per mode (strategy_impl.h, fg__strategy_driver): what setup,
 * backward, a training step, clipping, the byte counts and gathering the
 * parameters mean under it, as ggml's backend interface, each optional entry
 * saying what NULL means. strategy.c picks the driver once, at
 * fg_strategy_new, and the public calls dispatch through it: no call tests
 * which parts of the state happen to exist. The deterministic mode is a
 * driver of its own (single and ddp with ddp_opts.deterministic). */
#include "ddp_hooks.h"
#include "strategy_impl.h"

/* ------------------------------------------------------------- setups */

static FG_MUST_USE fg_status setup_dp(fg_strategy *s, const fg_ddp_opts *ddp,
                                      const fg_sharded_opts *sh, int dp_threads) {
    (void)ddp;
    (void)sh;
    FG_TRY(fg__dp_setup(s, dp_threads > 0 ? dp_threads : 2));
    return s->kind == FG_STRATEGY_DDP2 ? fg__ddp2_setup(s) : FG_OK;
}

static FG_MUST_USE fg_status setup_ddp(fg_strategy *s, const fg_ddp_opts *o,
                                       const fg_sharded_opts *sh, int dp_threads) {
    (void)sh;
    (void)dp_threads;
    FG_TRY(fg__strategy_broadcast_params(s));
    fg__ddp_reducer_opts ro = {.bucket_cap_mb = o ? o->bucket_cap_mb : 0,
                               .find_unused_parameters = o && o->find_unused_parameters,
                               .static_graph = o && o->static_graph,
                               .name = fg_strategy_kind_name(s->kind)};
    FG_TRY(fg__ddp_hooks_setup(s, o, &ro));
    FG_TRY(fg__strategy_reducer_new(s, s->comm, &ro));
    return fg__ddp_hooks_attach(s);
}

static FG_MUST_USE fg_status setup_zero(fg_strategy *s, const fg_ddp_opts *ddp,
                                        const fg_sharded_opts *sh, int dp_threads) {
    (void)ddp;
    (void)dp_threads;
    return fg__zero_setup(s, sh);
}

static FG_MUST_USE fg_status setup_bagua(fg_strategy *s, const fg_ddp_opts *ddp,
                                         const fg_sharded_opts *sh, int dp_threads) {
    (void)sh;
    (void)dp_threads;
    return fg__bagua_setup(s, ddp);
}

static FG_MUST_USE fg_status setup_horovod(fg_strategy *s, const fg_ddp_opts *ddp,
                                           const fg_sharded_opts *sh, int dp_threads) {
    (void)sh;
    (void)dp_threads;
    return fg__horovod_setup(s, ddp);
}

static FG_MUST_USE fg_status setup_hivemind(fg_strategy *s, const fg_ddp_opts *ddp,
                                            const fg_sharded_opts *sh, int dp_threads) {
    (void)sh;
    (void)dp_threads;
    return fg__hivemind_setup(s, ddp);
}

static FG_MUST_USE fg_status setup_det(fg_strategy *s, const fg_ddp_opts *ddp,
                                       const fg_sharded_opts *sh, int dp_threads) {
    (void)ddp;
    (void)sh;
    (void)dp_threads;
    return fg__det_setup(s);
}

/* ---------------------------------------------------------- backwards */

/* dp and ddp2: the replicas' gradients are in the model's; ddp2 averages
 * them across the processes (a no-op under dp) */
static FG_MUST_USE fg_status backward_dp(fg_strategy *s, fg_tensor *loss) {
    FG_TRY(fg_backward(loss));
    return fg__ddp2_sync(s);
}

static FG_MUST_USE fg_status backward_ddp(fg_strategy *s, fg_tensor *loss) {
    return fg__ddp_reducer_backward(s->reducer, loss, s->sync);
}

static FG_MUST_USE fg_status backward_zero(fg_strategy *s, fg_tensor *loss) {
    fg__zero_before_backward(s);
    return fg__ddp_reducer_backward(s->reducer, loss, s->sync);
}

static FG_MUST_USE fg_status backward_det(fg_strategy *s, fg_tensor *loss) {
    return fg__det_backward(s, loss, s->sync);
}

/* -------------------------------------------------------- other entries */

static FG_MUST_USE fg_status step_dp(fg_strategy *s, fg_batch *b, fg_strategy_step_fn fn, void *ud,
                                     double *part_losses, int max_parts, int *nparts,
                                     double *loss) {
    FG_TRY(fg__dp_step(s, b, fn, ud, part_losses, max_parts, nparts, loss));
    return fg__ddp2_sync(s);
}

static void bytes_reducer(const fg_strategy *s, fg_comm_bytes *out) {
    if (s->reducer) fg__ddp_reducer_bytes(s->reducer, out);
}

static const fg__strategy_driver k_drivers[] = {
    [FG_MODE_SINGLE] = {.name = "single"},
    [FG_MODE_DP] = {.name = "dp", .setup = setup_dp, .backward = backward_dp, .step = step_dp},
    [FG_MODE_DDP] = {.name = "ddp",
                     .setup = setup_ddp,
                     .backward = backward_ddp,
                     .bytes = bytes_reducer},
    [FG_MODE_ZERO1] = {.name = "zero1",
                       .setup = setup_zero,
                       .backward = backward_zero,
                       .clip = fg__zero_clip,
                       .bytes = bytes_reducer},
    [FG_MODE_ZERO2] = {.name = "zero2",
                       .setup = setup_zero,
                       .backward = backward_zero,
                       .clip = fg__zero_clip,
                       .bytes = bytes_reducer},
    [FG_MODE_BAGUA] = {.name = "bagua",
                       .setup = setup_bagua,
                       .backward = fg__bagua_backward,
                       .bytes = fg__bagua_bytes},
    [FG_MODE_ZERO3] = {.name = "zero3",
                       .setup = setup_zero,
                       .backward = fg__zero3_backward,
                       .clip = fg__zero_clip,
                       .bytes = bytes_reducer,
                       .gather = fg__zero3_gather_all,
                       .release = fg__zero3_release_all},
    [FG_MODE_HOROVOD] = {.name = "horovod",
                         .setup = setup_horovod,
                         .backward = fg__horovod_backward},
    [FG_MODE_HIVEMIND] = {.name = "hivemind",
                          .setup = setup_hivemind,
                          .optimizer_step = fg__hivemind_optimizer_step},
};

static const fg__strategy_driver k_det = {
    .name = "deterministic", .setup = setup_det, .backward = backward_det, .bytes = bytes_reducer};

const fg__strategy_driver *fg__strategy_driver_of(fg__strategy_mode mode, bool deterministic) {
    return deterministic ? &k_det : &k_drivers[mode];
}
