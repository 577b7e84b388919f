/* fg_fabric_setup_many: several models and optimizers in one fabric
 * (Lightning's fabric.setup(model, opt1, opt2) and a setup per model). The
 * models are sub-modules of one tree, so that the strategy (ddp's buckets,
 * the checkpoint's layout) is made once over its root; each optimizer steps
 * its own range of that root's flat buffers. */
#include <stdio.h>
#include <string.h>

#include "fabric_impl.h"

static fg_module *root_of(fg_module *m) {
    while (fg_module_parent(m)) m = fg_module_parent(m);
    return m;
}

/* m is `anc` or lies below it. */
static bool is_within(fg_module *m, const fg_module *anc) {
    for (; m; m = fg_module_parent(m))
        if (m == anc) return true;
    return false;
}

/* The element range [lo, hi) of sub-module m in its root's flat buffers. */
static FG_MUST_USE fg_status range_of(fg_module *root, fg_module *m, int64_t *lo, int64_t *hi) {
    fg_tensor *rf = fg_module_flat_params(root), *mf = fg_module_flat_params(m);
    if (!rf || !mf) return fg_last_status() ? fg_last_status() : FG_EINVAL;
    int64_t es = (int64_t)fg_dtype_size(fg_tensor_dtype(rf));
    *lo = ((const char *)fg_tensor_data(mf) - (const char *)fg_tensor_data(rf)) / es;
    *hi = *lo + fg_module_numel(m);
    return FG_OK;
}

static bool several_ok(fg_strategy_kind k) {
    return k == FG_STRATEGY_SINGLE || k == FG_STRATEGY_DDP || k == FG_STRATEGY_DDP_SPAWN ||
           k == FG_STRATEGY_DDP_FORK;
}

fg_status fg_fabric_setup_many(fg_fabric *f, fg_module *const *models, int nmodels,
                               fg_optimizer *const *opts, int nopts) {
    if (!f || !models) return fg_error(FG_EINVAL, "fabric setup_many: NULL fabric or models");
    if (nmodels < 1 || nmodels > FG_FABRIC_MAX_OPTIMIZERS)
        return fg_error(FG_EINVAL, "fabric setup_many: %d models: give 1 to %d", nmodels,
                        FG_FABRIC_MAX_OPTIMIZERS);
    if (nopts < 0 || nopts > FG_FABRIC_MAX_OPTIMIZERS || (nopts > 0 && !opts))
        return fg_error(FG_EINVAL, "fabric setup_many: %d optimizers: give 0 to %d", nopts,
                        FG_FABRIC_MAX_OPTIMIZERS);
    for (int i = 0; i < nmodels; i++)
        if (!models[i]) return fg_error(FG_EINVAL, "fabric setup_many: models[%d] is NULL", i);
    fg_module *root = root_of(models[0]);
    for (int i = 1; i < nmodels; i++)
        if (root_of(models[i]) != root)
            return fg_error(FG_EINVAL,
                            "fabric setup_many: models[%d] is not in the tree of models[0]: put "
                            "the models under one container module (fg_module_add_child), so "
                            "that their parameters share one flat buffer",
                            i);
    FG_TRY(fg_module_finalize(root));
    int64_t lo[FG_FABRIC_MAX_OPTIMIZERS], hi[FG_FABRIC_MAX_OPTIMIZERS];
    for (int j = 0; j < nopts; j++) {
        if (!opts[j]) return fg_error(FG_EINVAL, "fabric setup_many: opts[%d] is NULL", j);
        fg_module *om = fg_optimizer_module(opts[j]);
        bool found = false;
        for (int i = 0; i < nmodels && !found; i++) found = is_within(om, models[i]);
        if (!found)
            return fg_error(FG_EINVAL,
                            "fabric setup_many: opts[%d] (%s) is over a module that is none of "
                            "the models nor inside one",
                            j, fg_optimizer_name(opts[j]));
        FG_TRY(range_of(root, om, &lo[j], &hi[j]));
        for (int k = 0; k < j; k++)
            if (lo[j] < hi[k] && lo[k] < hi[j] && hi[j] > lo[j] && hi[k] > lo[k])
                return fg_error(FG_EINVAL,
                                "fabric setup_many: opts[%d] and opts[%d] share parameters "
                                "(elements %lld..%lld and %lld..%lld of the flat buffer): give "
                                "each parameter one optimizer",
                                k, j, (long long)lo[k], (long long)hi[k], (long long)lo[j],
                                (long long)hi[j]);
    }
    if (nopts > 1) {
        fg_strategy_kind k = f->plan.strategy;
        if (!several_ok(k))
            return fg_error(FG_EUNSUPPORTED,
                            "fabric setup_many: %d optimizers under strategy %s: several "
                            "optimizers run under single, ddp, ddp_spawn and ddp_fork only",
                            nopts, fg_fabric_strategy_name(f));
        if (f->scaler)
            return fg_error(FG_EUNSUPPORTED,
                            "fabric setup_many: %d optimizers under precision 16-mixed: its loss "
                            "scaler steps one optimizer; use bf16-mixed or 32-true",
                            nopts);
    }
    /* a sharding strategy cuts the optimizer it is given: it must cover the root */
    if (nopts == 1 && fg_optimizer_module(opts[0]) != root &&
        fg_strategy_kind_is_sharded(f->plan.strategy))
        return fg_error(FG_EUNSUPPORTED,
                        "fabric setup_many: strategy %s shards the optimizer's state over the "
                        "whole model: the optimizer must be over the root of the models' tree",
                        fg_fabric_strategy_name(f));
    FG_TRY(fg_fabric_setup(f, root, nopts ? opts[0] : NULL));
    /* on a device the setup moved the model and the first optimizer: the
     * others follow (their parameters and gradients are the device's now) */
    for (int j = 1; f->dev && j < nopts; j++) FG_TRY(fg_optimizer_to_device(opts[j]));
    return FG_OK;
}
