/* DDP communication hooks: the names of the built-in hooks and wrappers,
 * the check of ddp's options, and the one table the strategy picks a hook
 * from (each hook lives in its hook_*.c). */
#include <strings.h>

#include "ddp_hooks.h"

static const fg__ddp_hook_vt k_none = {.name = "none"};

static const fg__ddp_hook_vt *const k_hooks[FG_DDP_HOOK_COUNT] = {
    [FG_DDP_HOOK_NONE] = &k_none,
    [FG_DDP_HOOK_FP16_COMPRESS] = &fg__hook_fp16,
    [FG_DDP_HOOK_BF16_COMPRESS] = &fg__hook_bf16,
    [FG_DDP_HOOK_POWERSGD] = &fg__hook_powersgd,
    [FG_DDP_HOOK_POST_LOCALSGD] = &fg__hook_localsgd};

static const struct {
    const char *name, *alias;
    fg_dtype wire;
} k_wrappers[FG_DDP_WRAPPER_COUNT] = {
    [FG_DDP_WRAPPER_NONE] = {"none", "none", FG_F32},
    [FG_DDP_WRAPPER_FP16] = {"fp16", "fp16_compress_wrapper", FG_F16},
    [FG_DDP_WRAPPER_BF16] = {"bf16", "bf16_compress_wrapper", FG_BF16}};

const char *fg_ddp_comm_hook_name(fg_ddp_comm_hook h) {
    return (int)h >= 0 && h < FG_DDP_HOOK_COUNT ? k_hooks[h]->name : "?";
}

fg_status fg_ddp_comm_hook_parse(const char *name, fg_ddp_comm_hook *out) {
    for (int i = 0; name && i < FG_DDP_HOOK_COUNT; i++)
        if (!strcasecmp(name, k_hooks[i]->name)) {
            if (out) *out = (fg_ddp_comm_hook)i;
            return FG_OK;
        }
    return fg_error(FG_EINVAL,
                    "ddp_comm_hook=\"%s\": expected one of fp16_compress, bf16_compress, "
                    "powersgd, post_localsgd (or none)",
                    name ? name : "(null)");
}

const char *fg_ddp_comm_wrapper_name(fg_ddp_comm_wrapper w) {
    return (int)w >= 0 && w < FG_DDP_WRAPPER_COUNT ? k_wrappers[w].name : "?";
}

fg_status fg_ddp_comm_wrapper_parse(const char *name, fg_ddp_comm_wrapper *out) {
    for (int i = 0; name && i < FG_DDP_WRAPPER_COUNT; i++)
        if (!strcasecmp(name, k_wrappers[i].name) || !strcasecmp(name, k_wrappers[i].alias)) {
            if (out) *out = (fg_ddp_comm_wrapper)i;
            return FG_OK;
        }
    return fg_error(FG_EINVAL,
                    "ddp_comm_wrapper=\"%s\": expected fp16 or bf16 (fp16_compress_wrapper, "
                    "bf16_compress_wrapper), or none",
                    name ? name : "(null)");
}

fg_status fg_strategy_check_ddp(const fg_ddp_opts *o) {
    if (!o) return FG_OK;
    if ((int)o->comm_hook < 0 || o->comm_hook >= FG_DDP_HOOK_COUNT)
        return fg_error(FG_EINVAL,
                        "ddp: comm_hook %d: expected one of fg_ddp_comm_hook (none, "
                        "fp16_compress, bf16_compress, powersgd, post_localsgd)",
                        (int)o->comm_hook);
    if ((int)o->comm_wrapper < 0 || o->comm_wrapper >= FG_DDP_WRAPPER_COUNT)
        return fg_error(FG_EINVAL, "ddp: comm_wrapper %d: expected none, fp16 or bf16",
                        (int)o->comm_wrapper);
    if (o->comm_hook != FG_DDP_HOOK_NONE && o->user_hook)
        return fg_error(FG_EINVAL,
                        "ddp: both comm_hook=%s and a user_hook: set one (a wrapper may go "
                        "around either)",
                        fg_ddp_comm_hook_name(o->comm_hook));
    const fg_powersgd_opts *p = &o->powersgd;
    if (o->bucket_cap_mb < 0 || p->matrix_approximation_rank < 0 || p->min_compression_rate < 0 ||
        p->orthogonalization_epsilon < 0 || o->post_localsgd.start_localSGD_iter < 0 ||
        o->post_localsgd.period < 0)
        return fg_error(FG_EINVAL,
                        "ddp: bucket_cap_mb %g, powersgd matrix_approximation_rank %d, "
                        "min_compression_rate %g, orthogonalization_epsilon %g, post_localsgd "
                        "start_localSGD_iter %lld, period %lld: expected values >= 0 (0: the "
                        "default)",
                        o->bucket_cap_mb, p->matrix_approximation_rank, p->min_compression_rate,
                        p->orthogonalization_epsilon,
                        (long long)o->post_localsgd.start_localSGD_iter,
                        (long long)o->post_localsgd.period);
    return fg__bagua_check(&o->bagua);
}

fg_status fg__ddp_hooks_setup(fg_strategy *s, const fg_ddp_opts *o, fg__ddp_reducer_opts *ro) {
    if (!o || (o->comm_hook == FG_DDP_HOOK_NONE && !o->user_hook &&
               o->comm_wrapper == FG_DDP_WRAPPER_NONE))
        return FG_OK;
    fg_dtype dt = fg_tensor_dtype(fg_module_flat_grads(s->model));
    if (dt != FG_F32)
        return fg_error(FG_EUNSUPPORTED,
                        "ddp: communication hooks work on f32 gradients; this model's are %s "
                        "(precision 64-true?): use 32-true or a mixed precision, or no hook",
                        fg_dtype_name(dt));
    ro->wire = k_wrappers[o->comm_wrapper].wire;
    if (o->user_hook) {
        ro->hook = o->user_hook;
        ro->hook_state = o->user_state;
        return FG_OK;
    }
    const fg__ddp_hook_vt *vt = k_hooks[o->comm_hook];
    if (!vt->run) return FG_OK;
    if (vt->state_new) FG_TRY(vt->state_new(s, o, &s->hook_state));
    s->hook = vt;
    ro->hook = vt->run;
    ro->hook_state = s->hook_state;
    return FG_OK;
}

fg_status fg__ddp_hooks_attach(fg_strategy *s) {
    return s->hook && s->hook->attach ? s->hook->attach(s, s->hook_state) : FG_OK;
}

void fg__ddp_hooks_free(fg_strategy *s) {
    if (s->hook && s->hook->state_free) s->hook->state_free(s->hook_state);
    s->hook = NULL;
    s->hook_state = NULL;
}
