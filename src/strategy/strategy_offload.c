/* Offload (DeepSpeed's offload_optimizer / offload_param, FSDP's
 * cpu_offload): the checks of fg_sharded_opts' offload fields,
 * and the setup of nvme offload once the strategy has cut the optimizer's
 * state to this rank's shard (the optim layer's offload.c moves it to
 * disk; stage 3's parameters go with it: param_offload.c). cpu offload
 * moves nothing: on a CPU, parameters and state are in host memory
 * already. */
#include "optim/nvme_store.h"
#include "optim/optim_impl.h"
#include "strategy_impl.h"

bool fg_offload_nvme_available(void) { return fg__nvme_available(); }

fg_status fg__offload_check(fg_strategy_kind kind, const fg_sharded_opts *d) {
    const char *name = fg_strategy_kind_name(kind);
    fg_offload_device od = d->offload_optimizer_device, pd = d->offload_params_device;
    if ((int)od < 0 || od >= FG_OFFLOAD_COUNT || (int)pd < 0 || pd >= FG_OFFLOAD_COUNT)
        return fg_error(FG_EINVAL,
                        "%s: offload_optimizer_device %d, offload_params_device %d: expected "
                        "fg_offload_device values (none, cpu, nvme)",
                        name, (int)od, (int)pd);
    if (!od && !pd) return FG_OK;
    unsigned takes = fg_strategy_takes(kind, d->sharding_strategy);
    if (!(takes & FG_TAKES_OFFLOAD) && kind != FG_STRATEGY_SINGLE)
        return fg_error(FG_EINVAL,
                        "strategy \"%s\": offload is an option of the sharded strategies "
                        "(deepspeed_stage_1, deepspeed_stage_2, fsdp)",
                        name);
    /* parameters to nvme: ZeRO stage 3's own offload */
    bool s3 = (takes & FG_TAKES_OFFLOAD_PARAMS) && (takes & FG_TAKES_OFFLOAD_NVME);
    if (pd && !(takes & FG_TAKES_OFFLOAD_PARAMS) && kind != FG_STRATEGY_SINGLE)
        return fg_error(FG_EINVAL,
                        "%s: offload_params_device=%s offloads ZeRO stage 3's parameter shards: it "
                        "needs deepspeed_stage_3 (deepspeed_stage_3_offload, _offload_nvme), as in "
                        "DeepSpeed",
                        name, fg_offload_device_name(pd));
    if (pd == FG_OFFLOAD_NVME && !s3 && kind != FG_STRATEGY_SINGLE)
        return fg_error(
            FG_EINVAL,
            "%s: offload_params_device=nvme is DeepSpeed's ZeRO stage 3 offload "
            "(deepspeed_stage_3 with offload_params_device nvme, or "
            "deepspeed_stage_3_offload_nvme)%s",
            name, kind == FG_STRATEGY_FSDP ? "; fsdp's cpu_offload offloads to the cpu only" : "");
    if (pd == FG_OFFLOAD_NVME && od == FG_OFFLOAD_CPU)
        return fg_error(FG_EINVAL,
                        "%s: offload_params_device=nvme keeps each parameter shard on disk with "
                        "its optimizer state, which goes to nvme too: offload_optimizer_device "
                        "must be nvme (or unset), not cpu",
                        name);
    if (od != FG_OFFLOAD_NVME && pd != FG_OFFLOAD_NVME) return FG_OK;
    if (!(takes & FG_TAKES_OFFLOAD_NVME) && kind != FG_STRATEGY_SINGLE)
        return fg_error(FG_EINVAL,
                        "fsdp: its cpu_offload offloads to the cpu only; nvme offload is "
                        "DeepSpeed's (deepspeed_stage_2 with offload_optimizer_device "
                        "nvme)");
    const char *which =
        od == FG_OFFLOAD_NVME ? "offload_optimizer_device" : "offload_params_device";
    if (!d->nvme_path || !*d->nvme_path)
        return fg_error(FG_EINVAL, "%s: %s=nvme needs nvme_path, a directory on a local disk", name,
                        which);
    if (!fg__nvme_available())
        return fg_error(FG_EUNSUPPORTED,
                        "%s: %s=nvme: offload_nvme is unavailable in this fulgur, built without "
                        "liburing (install liburing-dev and rebuild)",
                        name, which);
    return FG_OK;
}

fg_status fg__offload_setup(fg_strategy *s, const fg_sharded_opts *o) {
    const char *name = fg_strategy_kind_name(s->kind);
    if (!s->opt)
        return fg_error(FG_EINVAL, "%s: offload_optimizer_device=nvme needs the optimizer at setup",
                        name);
    long block = 0;
    FG_TRY(fg__env_int("FULGUR_NVME_BLOCK_BYTES", 0, &block));
    if (block < 0 || block % FG_NVME_ALIGN)
        return fg_error(FG_EINVAL,
                        "FULGUR_NVME_BLOCK_BYTES=%ld: expected a positive multiple of %d (bytes "
                        "per state array per block), or unset for %zu",
                        block, FG_NVME_ALIGN, FG_NVME_DEFAULT_BLOCK);
    if (o->offload_params_device == FG_OFFLOAD_NVME)
        return fg__poffload_setup(s, o->nvme_path, (size_t)block);
    fg_status st = fg__optimizer_offload_nvme(s->opt, o->nvme_path, (size_t)block);
    return st == FG_OK ? FG_OK : fg_error_wrap(st, "%s setup", name);
}
