/* The strategy table and the precision policy table (kinds.h): one row per
 * kind, the names and aliases that parse to it, and the lists for messages
 * and help, printed from the rows so that they cannot drift from them. Every
 * other layer asks these rows rather than testing a kind or a name. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "fulgur/kinds.h"

/* ------------------------------------------------------------ strategies */

#define DDP_TAKES (FG_TAKES_COMM_HOOK | FG_TAKES_DETERMINISTIC | FG_TAKES_DDP_BUCKETS)
#define ZERO_TAKES (FG_TAKES_BUCKET_SIZES | FG_TAKES_OFFLOAD | FG_TAKES_OFFLOAD_NVME)

static const fg_strategy_info k_rows[FG_STRATEGY_COUNT] = {
    [FG_STRATEGY_SINGLE] = {.name = "single",
                            .summary = "one process, one device",
                            .aliases = {{"single_device"}},
                            .naliases = 1,
                            .launcher = FG_LAUNCHER_NONE,
                            .ranks = FG_RANKS_ONE_PROCESS,
                            .takes = FG_TAKES_DETERMINISTIC},
    [FG_STRATEGY_DP] = {.name = "dp",
                        .summary = "one process, the batch split over replicas on threads",
                        .launcher = FG_LAUNCHER_THREADS,
                        .ranks = FG_RANKS_ONE_PROCESS,
                        .replica_threads = true},
    [FG_STRATEGY_DDP] = {.name = "ddp",
                         .summary = "a process per device, gradients averaged in buckets "
                                    "during backward",
                         .launcher = FG_LAUNCHER_REEXEC,
                         .ranks = FG_RANKS_PER_DEVICE,
                         .takes = DDP_TAKES},
    [FG_STRATEGY_DDP_SPAWN] = {.name = "ddp_spawn",
                               .summary = "ddp with the ranks forked inside the program",
                               .launcher = FG_LAUNCHER_FORK,
                               .ranks = FG_RANKS_PER_DEVICE,
                               .takes = DDP_TAKES},
    [FG_STRATEGY_DDP_FORK] = {.name = "ddp_fork",
                              .summary = "the same as ddp_spawn (fork is how fulgur spawns)",
                              .aliases = {{"ddp_notebook"}},
                              .naliases = 1,
                              .launcher = FG_LAUNCHER_FORK,
                              .ranks = FG_RANKS_PER_DEVICE,
                              .takes = DDP_TAKES},
    [FG_STRATEGY_DEEPSPEED_STAGE_1] = {.name = "deepspeed_stage_1",
                                       .summary = "ZeRO stage 1: optimizer state sharded",
                                       .launcher = FG_LAUNCHER_REEXEC,
                                       .ranks = FG_RANKS_PER_DEVICE,
                                       .shards = FG_SHARDS_OPTIM_STATE,
                                       .takes = ZERO_TAKES | FG_TAKES_DEEPSPEED,
                                       .saves_sharded = true},
    [FG_STRATEGY_DEEPSPEED_STAGE_2] =
        {.name = "deepspeed_stage_2",
         .summary = "ZeRO stage 2: optimizer state and gradients sharded",
         .aliases = {{"deepspeed"}, /* Lightning's DeepSpeedStrategy: stage 2 */
                     {"ddp_sharded"},
                     {"ddp_sharded_spawn"}, /* FairScale's sharded DDP: ZeRO stage 2 */
                     {"deepspeed_stage_2_offload", FG_OFFLOAD_CPU, FG_OFFLOAD_NONE}},
         .naliases = 4,
         .launcher = FG_LAUNCHER_REEXEC,
         .ranks = FG_RANKS_PER_DEVICE,
         .shards = FG_SHARDS_OPTIM_STATE | FG_SHARDS_GRADS,
         .takes = ZERO_TAKES | FG_TAKES_DEEPSPEED,
         .saves_sharded = true},
    [FG_STRATEGY_FSDP] = {.name = "fsdp",
                          .summary = "FSDP: by its sharding strategy (FULL_SHARD = stage 3, "
                                     "SHARD_GRAD_OP = stage 2, NO_SHARD = ddp, HYBRID_SHARD)",
                          .aliases = {{"fsdp_cpu_offload", FG_OFFLOAD_CPU, FG_OFFLOAD_CPU}},
                          .naliases = 1,
                          .launcher = FG_LAUNCHER_REEXEC,
                          .ranks = FG_RANKS_PER_DEVICE,
                          .shards = FG_SHARDS_OPTIM_STATE | FG_SHARDS_GRADS | FG_SHARDS_PARAMS,
                          .takes = FG_TAKES_BUCKET_SIZES | FG_TAKES_OFFLOAD |
                                   FG_TAKES_OFFLOAD_PARAMS | FG_TAKES_SHARDING_STRATEGY},
    [FG_STRATEGY_BAGUA] = {.name = "bagua",
                           .summary = "Bagua's algorithms (--bagua-algorithm)",
                           .launcher = FG_LAUNCHER_REEXEC,
                           .ranks = FG_RANKS_PER_DEVICE,
                           .takes = FG_TAKES_BAGUA | FG_TAKES_DDP_BUCKETS},
    [FG_STRATEGY_DEEPSPEED_STAGE_3] =
        {.name = "deepspeed_stage_3",
         .summary = "ZeRO stage 3: optimizer state, gradients and parameters sharded",
         .aliases = {{"deepspeed_stage_3_offload", FG_OFFLOAD_CPU, FG_OFFLOAD_CPU},
                     {"deepspeed_stage_3_offload_nvme", FG_OFFLOAD_NVME, FG_OFFLOAD_NVME}},
         .naliases = 2,
         .launcher = FG_LAUNCHER_REEXEC,
         .ranks = FG_RANKS_PER_DEVICE,
         .shards = FG_SHARDS_OPTIM_STATE | FG_SHARDS_GRADS | FG_SHARDS_PARAMS,
         .takes = ZERO_TAKES | FG_TAKES_OFFLOAD_PARAMS | FG_TAKES_WRAP_POLICY | FG_TAKES_DEEPSPEED,
         .saves_sharded = true},
    [FG_STRATEGY_DDP2] = {.name = "ddp2",
                          .summary = "a process per node, its devices dp replicas on threads, "
                                     "the gradient averaged across nodes",
                          .launcher = FG_LAUNCHER_THREADS,
                          .ranks = FG_RANKS_PER_NODE,
                          .replica_threads = true},
    [FG_STRATEGY_HOROVOD] = {.name = "horovod",
                             .summary = "a process per device, gradients averaged through "
                                        "Horovod's fusion buffer",
                             .launcher = FG_LAUNCHER_REEXEC,
                             .ranks = FG_RANKS_PER_DEVICE,
                             .takes = FG_TAKES_HOROVOD},
    [FG_STRATEGY_HIVEMIND] = {.name = "hivemind",
                              .summary = "a peer of a swarm (DHT): gradients averaged when the "
                                         "swarm reaches target_batch_size",
                              .launcher = FG_LAUNCHER_NONE,
                              .ranks = FG_RANKS_ONE_PROCESS,
                              .takes = FG_TAKES_HIVEMIND},
};

const fg_strategy_info *fg_strategy_info_of(fg_strategy_kind k) {
    return (int)k >= 0 && k < FG_STRATEGY_COUNT ? &k_rows[k] : NULL;
}

const char *fg_strategy_kind_name(fg_strategy_kind k) {
    return (int)k >= 0 && k < FG_STRATEGY_COUNT ? k_rows[k].name : "?";
}

static char g_names[1024];
static pthread_once_t g_names_once = PTHREAD_ONCE_INIT;

static void make_names(void) {
    size_t n = 0;
    for (int k = 0; k < FG_STRATEGY_COUNT; k++)
        n += (size_t)snprintf(g_names + n, sizeof g_names - n, "%s%s", k ? ", " : "",
                              k_rows[k].name);
    const char *sep = "; also ";
    for (int k = 0; k < FG_STRATEGY_COUNT; k++)
        for (int a = 0; a < k_rows[k].naliases; a++) {
            n += (size_t)snprintf(g_names + n, sizeof g_names - n, "%s%s (%s)", sep,
                                  k_rows[k].aliases[a].name, k_rows[k].name);
            sep = ", ";
        }
}

const char *fg_strategy_names(void) {
    pthread_once(&g_names_once, make_names);
    return g_names;
}

fg_status fg_strategy_kind_parse(const char *name, fg_strategy_kind *out,
                                 fg_offload_device *optimizer, fg_offload_device *params) {
    for (int k = 0; name && k < FG_STRATEGY_COUNT; k++) {
        const fg_strategy_info *r = &k_rows[k];
        fg_strategy_alias hit = {NULL};
        if (!strcasecmp(name, r->name)) hit.name = r->name;
        for (int a = 0; !hit.name && a < r->naliases; a++)
            if (!strcasecmp(name, r->aliases[a].name)) hit = r->aliases[a];
        if (!hit.name) continue;
        if (out) *out = (fg_strategy_kind)k;
        if (optimizer) *optimizer = hit.optimizer;
        if (params) *params = hit.params;
        return FG_OK;
    }
    return fg_error(FG_EINVAL, "strategy=\"%s\": unknown; expected one of auto, %s",
                    name ? name : "(null)", fg_strategy_names());
}

bool fg_strategy_kind_is_ddp(fg_strategy_kind k) {
    return (int)k >= 0 && k < FG_STRATEGY_COUNT && k_rows[k].ranks == FG_RANKS_PER_DEVICE;
}

bool fg_strategy_kind_is_sharded(fg_strategy_kind k) {
    return (int)k >= 0 && k < FG_STRATEGY_COUNT && k_rows[k].shards != 0;
}

fg_strategy_kind fg_strategy_algorithm(fg_strategy_kind k, fg_sharding_strategy ss) {
    if (k != FG_STRATEGY_FSDP) return k;
    switch (ss) {
    case FG_SHARDING_NO_SHARD: return FG_STRATEGY_DDP;
    case FG_SHARDING_SHARD_GRAD_OP: return FG_STRATEGY_DEEPSPEED_STAGE_2;
    default: return FG_STRATEGY_DEEPSPEED_STAGE_3;
    }
}

unsigned fg_strategy_shards(fg_strategy_kind k, fg_sharding_strategy ss) {
    const fg_strategy_info *r = fg_strategy_info_of(fg_strategy_algorithm(k, ss));
    return r ? r->shards : 0;
}

unsigned fg_strategy_takes(fg_strategy_kind k, fg_sharding_strategy ss) {
    const fg_strategy_info *r = fg_strategy_info_of(k);
    if (!r) return 0;
    if (k != FG_STRATEGY_FSDP) return r->takes;
    unsigned from_algo = FG_TAKES_COMM_HOOK | FG_TAKES_DDP_BUCKETS | FG_TAKES_WRAP_POLICY;
    return r->takes | (fg_strategy_takes(fg_strategy_algorithm(k, ss), ss) & from_algo);
}

const char *fg_strategy_kinds_taking(unsigned takes) {
    static _Thread_local char buf[512];
    size_t n = 0;
    buf[0] = '\0';
    for (int k = 0; k < FG_STRATEGY_COUNT && n < sizeof buf; k++)
        if ((k_rows[k].takes & takes) == takes)
            n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%s", n ? ", " : "", k_rows[k].name);
    return buf;
}

static const char *const k_sharding_names[FG_SHARDING_COUNT] = {
    [FG_SHARDING_FULL_SHARD] = "FULL_SHARD",
    [FG_SHARDING_SHARD_GRAD_OP] = "SHARD_GRAD_OP",
    [FG_SHARDING_NO_SHARD] = "NO_SHARD",
    [FG_SHARDING_HYBRID_SHARD] = "HYBRID_SHARD"};

const char *fg_sharding_strategy_name(fg_sharding_strategy s) {
    return (int)s >= 0 && s < FG_SHARDING_COUNT ? k_sharding_names[s] : "?";
}

fg_status fg_sharding_strategy_parse(const char *name, fg_sharding_strategy *out) {
    for (int i = 0; name && i < FG_SHARDING_COUNT; i++)
        if (!strcasecmp(name, k_sharding_names[i])) {
            if (out) *out = (fg_sharding_strategy)i;
            return FG_OK;
        }
    return fg_error(FG_EINVAL,
                    "sharding_strategy=\"%s\": expected one of FULL_SHARD, SHARD_GRAD_OP, "
                    "NO_SHARD, HYBRID_SHARD",
                    name ? name : "(null)");
}

static const char *const k_offload_names[FG_OFFLOAD_COUNT] = {
    [FG_OFFLOAD_NONE] = "none", [FG_OFFLOAD_CPU] = "cpu", [FG_OFFLOAD_NVME] = "nvme"};

const char *fg_offload_device_name(fg_offload_device d) {
    return (int)d >= 0 && d < FG_OFFLOAD_COUNT ? k_offload_names[d] : "?";
}

fg_status fg_offload_device_parse(const char *name, fg_offload_device *out) {
    for (int i = 0; name && i < FG_OFFLOAD_COUNT; i++)
        if (!strcasecmp(name, k_offload_names[i])) {
            if (out) *out = (fg_offload_device)i;
            return FG_OK;
        }
    return fg_error(FG_EINVAL, "offload device \"%s\": expected cpu or nvme",
                    name ? name : "(null)");
}

const char *fg_launcher_name(fg_launcher l) {
    switch (l) {
    case FG_LAUNCHER_NONE: return "none";
    case FG_LAUNCHER_REEXEC: return "re-exec";
    case FG_LAUNCHER_FORK: return "fork";
    case FG_LAUNCHER_THREADS: return "threads";
    }
    return "?";
}

/* ------------------------------------------------------------ precisions */

/* param, compute (autocast), grad, optimizer state, master weights, loss
 * scaling, built. bf16-true and 16-true keep f32 optimizer state, as
 * Lightning's true-half settings leave it to the optimizer. */
static const fg_precision_policy k_policy[FG_PRECISION_COUNT] = {
    [FG_PRECISION_64_TRUE] = {"64-true", "64", FG_F64, FG_DTYPE_DEFAULT, FG_F64, FG_F64, false,
                              false, true},
    [FG_PRECISION_32_TRUE] = {"32-true", "32", FG_F32, FG_DTYPE_DEFAULT, FG_F32, FG_F32, false,
                              false, true},
    [FG_PRECISION_BF16_MIXED] = {"bf16-mixed", "bf16", FG_F32, FG_BF16, FG_F32, FG_F32, true, false,
                                 true},
    [FG_PRECISION_16_MIXED] = {"16-mixed", "16", FG_F32, FG_F16, FG_F32, FG_F32, true, true, true},
    [FG_PRECISION_BF16_TRUE] = {"bf16-true", NULL, FG_BF16, FG_BF16, FG_BF16, FG_F32, false, false,
                                true},
    [FG_PRECISION_16_TRUE] = {"16-true", NULL, FG_F16, FG_F16, FG_F16, FG_F32, false, false, true},
};

const fg_precision_policy *fg_precision_policy_of(fg_precision_kind p) {
    return (int)p >= 0 && p < FG_PRECISION_COUNT ? &k_policy[p] : NULL;
}

const char *fg_precision_kind_name(fg_precision_kind p) {
    return (int)p >= 0 && p < FG_PRECISION_COUNT ? k_policy[p].name : "?";
}

/* Every setting, or (built) those this fulgur runs, in the enum's order. */
static void precision_list(char *buf, size_t cap, bool built_only) {
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < FG_PRECISION_COUNT && n < cap; i++) {
        const fg_precision_policy *p = &k_policy[i];
        if (built_only && !p->built) continue;
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", p->name);
        if (p->alias && n < cap) n += (size_t)snprintf(buf + n, cap - n, " (%s)", p->alias);
    }
}

static char g_prec_all[256], g_prec_built[256];
static pthread_once_t g_prec_once = PTHREAD_ONCE_INIT;

static void make_prec(void) {
    precision_list(g_prec_all, sizeof g_prec_all, false);
    precision_list(g_prec_built, sizeof g_prec_built, true);
}

fg_status fg_precision_parse(const char *s, fg_precision_kind *out) {
    if (!out) return fg_error(FG_EINVAL, "precision: NULL output");
    if (!s) {
        *out = FG_PRECISION_32_TRUE;
        return FG_OK;
    }
    for (int i = 0; i < FG_PRECISION_COUNT; i++) {
        const char *alias = k_policy[i].alias;
        if (strcasecmp(s, k_policy[i].name) && (!alias || strcasecmp(s, alias))) continue;
        *out = (fg_precision_kind)i;
        return FG_OK;
    }
    pthread_once(&g_prec_once, make_prec);
    return fg_error(FG_EINVAL, "precision=\"%s\": unknown; expected one of %s", s, g_prec_all);
}

const char *fg_precision_available(void) {
    pthread_once(&g_prec_once, make_prec);
    return g_prec_built;
}
