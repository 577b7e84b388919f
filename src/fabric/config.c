/* The fabric's configuration is a launch plan: accelerator, devices,
 * strategy, precision and num_nodes are parsed by the launch layer
 * (fg_launch_plan_make), the one place that reads them, so that a program,
 * `fulgur fit` and `fulgur env` accept and refuse the same values. What the
 * strategy's row does not take, and what its ranks' setup would refuse on
 * this plan's world (fg_strategy_check_job), is refused here, before any
 * rank starts. */
#include <string.h>

#include "fabric_impl.h"

fg_status fg__fabric_plan(fg_fabric *f, fg_launch_plan *out) {
    fg_launch_opts o = {.accelerator = f->cfg.accelerator,
                        .devices = f->cfg.devices,
                        .strategy = f->cfg.strategy,
                        .precision = f->cfg.precision,
                        .num_nodes = f->cfg.num_nodes,
                        .threads_per_rank = f->cfg.threads_per_rank};
    /* deterministic: a fixed thread count, whatever the ranks per node */
    if (f->cfg.deterministic && !o.threads_per_rank) o.threads_per_rank = 1;
    if (!f->cfg.cluster) return fg_launch_plan_make(&o, NULL, out);
    fg_cluster_info env;
    memset(&env, 0, sizeof env);
    FG_TRY(f->cfg.cluster(f->cfg.cluster_ud, &env));
    if (!env.source) env.source = "custom";
    FG_TRY(fg_cluster_validate(&env));
    return fg_launch_plan_make(&o, &env, out);
}

fg_fabric *fg_fabric_new(const fg_fabric_config *cfg) {
    fg_fabric *f = fg_calloc(1, sizeof *f);
    if (!f) return NULL;
    f->cfg = cfg ? *cfg : (fg_fabric_config){0};
    const char **s[4] = {&f->cfg.accelerator, &f->cfg.devices, &f->cfg.strategy, &f->cfg.precision};
    for (int i = 0; i < 4; i++)
        if (*s[i] && !(*s[i] = f->strings[i] = fg_strdup(*s[i]))) goto fail;
    if (f->cfg.sharded.nvme_path &&
        !(f->cfg.sharded.nvme_path = f->nvme_path = fg_strdup(f->cfg.sharded.nvme_path)))
        goto fail;
    if (f->cfg.sharded.wrap_module_type && !(f->cfg.sharded.wrap_module_type = f->wrap_type =
                                                 fg_strdup(f->cfg.sharded.wrap_module_type)))
        goto fail;
    if (f->cfg.deepspeed_config && fg__fabric_apply_deepspeed_config(f) != FG_OK) goto fail;
    f->cfg.deepspeed_config = NULL; /* read: the strategy and options hold it now */
    if (fg__fabric_plan(f, &f->plan) != FG_OK) goto fail;
    fg_offload_device od, pd; /* what a name like deepspeed_stage_2_offload turns on */
    fg_launch_strategy_offload(f->cfg.strategy, &od, &pd);
    if (!f->cfg.sharded.offload_optimizer_device) f->cfg.sharded.offload_optimizer_device = od;
    if (!f->cfg.sharded.offload_params_device) f->cfg.sharded.offload_params_device = pd;
    if (fg__fabric_precision_init(f) != FG_OK) goto fail;
    if (fg_strategy_check_sharded(f->plan.strategy, &f->cfg.sharded) != FG_OK) goto fail;
    if (fg_strategy_check_ddp(&f->cfg.ddp) != FG_OK) goto fail;
    if (f->plan.strategy == FG_STRATEGY_HIVEMIND && f->cfg.ddp.hivemind.reuse_grad_buffers &&
        f->scaler) {
        /* the scaler unscales the buffer at every step call, and under
         * reuse_grad_buffers the buffer holds the calls before it too */
        fg_error(FG_EUNSUPPORTED,
                 "strategy hivemind: reuse_grad_buffers with precision %s: the loss scaler "
                 "would unscale the gradients accumulated before each step call again; use "
                 "bf16-mixed or 32-true, or leave reuse_grad_buffers false",
                 fg_precision_kind_name(f->plan.precision));
        goto fail;
    }
    if ((unsigned)f->cfg.sharded.state_dict_type >= FG_STATE_DICT_COUNT) {
        fg_error(FG_EINVAL,
                 "sharded.state_dict_type = %d: expected FG_STATE_DICT_AUTO, "
                 "FG_STATE_DICT_FULL or FG_STATE_DICT_SHARDED",
                 (int)f->cfg.sharded.state_dict_type);
        goto fail;
    }
    /* what the kind's row does not take is refused here, once, before any
     * rank starts, rather than by every rank's setup */
    const fg_strategy_info *row = fg_strategy_info_of(f->plan.strategy);
    if (f->cfg.deterministic && (!(row->takes & FG_TAKES_DETERMINISTIC) || f->cfg.ddp.comm_hook ||
                                 f->cfg.ddp.comm_wrapper || f->cfg.ddp.user_hook)) {
        fg_error(FG_EUNSUPPORTED,
                 "deterministic: built for the single and ddp strategies (ddp_spawn, ddp_fork) "
                 "without a communication hook; strategy=\"%s\"%s is not built yet in this mode",
                 fg_strategy_kind_name(f->plan.strategy),
                 f->cfg.ddp.comm_hook || f->cfg.ddp.comm_wrapper || f->cfg.ddp.user_hook
                     ? " with a communication hook"
                     : "");
        goto fail;
    }
    const fg_precision_policy *pol = fg_precision_policy_of(f->plan.precision);
    if (fg_strategy_check_job(f->plan.strategy, &f->cfg.ddp, &f->cfg.sharded, pol->param_dtype,
                              pol->grad_dtype, f->plan.world_size, f->plan.num_nodes,
                              f->plan.local_world_size) != FG_OK)
        goto fail;
    pthread_mutex_init(&f->comm_mu, NULL);
    f->world_size = 1;
    if (f->cfg.seed) fg_fabric_seed_everything(f, f->cfg.seed);
    return f;
fail:
    fg_scaler_free(f->scaler);
    for (int i = 0; i < 4; i++) fg_free(f->strings[i]);
    fg_free(f->nvme_path);
    fg_free(f->wrap_type);
    fg_free(f);
    return NULL;
}

void fg_fabric_free(fg_fabric *f) {
    if (!f) return;
    fg_error_kept kept; /* a _free never changes the caller's error (core.h) */
    fg_error_keep(&kept);
    fg_job_free(f->job);
    fg_strategy_free(f->strategy);
    fg_comm_free(f->comm);
    pthread_mutex_destroy(&f->comm_mu);
    for (int i = 0; i < 4; i++) fg_free(f->strings[i]);
    fg_free(f->nvme_path);
    fg_free(f->wrap_type);
    fg_free(f->spawn_blob);
    fg_free(f->loaded_meta);
    fg_scaler_free(f->scaler);
    fg__fabric_stage_free(f);
    if (f->dev) { /* the model and optimizer hold their own references */
        /* back to host step tensors: setting no device cannot fail */
        if (fg_step_device() == f->dev) fg__status_drop(fg_step_device_set(NULL));
        fg_dev_close(f->dev);
    }
    fg_free(f);
    fg_error_restore(&kept);
}

fg_dev *fg_fabric_device(const fg_fabric *f) { return f ? f->dev : NULL; }

const fg_launch_plan *fg_fabric_plan(const fg_fabric *f) { return &f->plan; }
fg_dtype fg_fabric_dtype(const fg_fabric *f) { return f->dtype; }
int fg_fabric_threads(const fg_fabric *f) { return f->threads; }
