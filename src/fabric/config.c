/* Validation of the Fabric configuration, before anything starts: the
 * accelerator, devices as the seeds' table reads them, the strategy and the
 * precision. Every error names the value given and lists what is allowed. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fabric_impl.h"

static const char *const k_strategies = "auto, single, dp, ddp, ddp_spawn, ddp_fork";
/* Strategies of FEATURES.md that are recognised but not built yet. */
static const char *const k_later[] = {"ddp2", "hybrid", "horovod", "bagua", "fsdp",
                                      "fsdp_cpu_offload", "deepspeed", "deepspeed_stage_1",
                                      "deepspeed_stage_2", "deepspeed_stage_2_offload",
                                      "deepspeed_stage_3", "deepspeed_stage_3_offload", NULL};

fg_status fg__parse_accelerator(const char *s) {
    if (!s || !*s || !strcmp(s, "auto") || !strcmp(s, "cpu")) return FG_OK;
    if (!strcmp(s, "gpu") || !strcmp(s, "cuda") || !strcmp(s, "mps") || !strcmp(s, "tpu"))
        return fg_error(FG_EUNSUPPORTED,
                        "accelerator=\"%s\": no GPU support is built into this fulgur; use "
                        "\"cpu\" or \"auto\"", s);
    return fg_error(FG_EINVAL, "accelerator=\"%s\": expected one of auto, cpu, gpu, cuda", s);
}

/* devices: "3" (the first three), "-1" (all), "1, 3" or "[1, 3]" (those ids).
 * On CPU a device is a rank: a count may exceed the cores (ranks share
 * them), ids must exist (0 .. cores-1). *n gets the number of ranks. */
fg_status fg__parse_devices(const char *s, int cores, int *n) {
    const char *allowed = "expected a count like \"2\", \"-1\" for all, or ids like \"0,1\" / "
                          "\"[0, 1]\"";
    if (!s) s = "1";
    const char *p = s;
    while (isspace((unsigned char)*p)) p++;
    bool bracket = *p == '[';
    if (bracket) p++;
    long ids[256];
    int count = 0;
    bool list = bracket || strchr(s, ',') != NULL;
    for (;;) {
        while (isspace((unsigned char)*p)) p++;
        if (*p == ']' || *p == '\0') break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno) return fg_error(FG_EINVAL, "devices=\"%s\": %s", s, allowed);
        if (count == 256) return fg_error(FG_EINVAL, "devices=\"%s\": too many ids", s);
        ids[count++] = v;
        p = end;
        while (isspace((unsigned char)*p)) p++;
        if (*p == ',') {
            p++;
            continue;
        }
        if (*p == ']' || *p == '\0') break;
        return fg_error(FG_EINVAL, "devices=\"%s\": %s", s, allowed);
    }
    if (bracket && *p != ']') return fg_error(FG_EINVAL, "devices=\"%s\": missing \"]\"", s);
    if (*p == ']') p++;
    while (isspace((unsigned char)*p)) p++;
    if (*p) return fg_error(FG_EINVAL, "devices=\"%s\": %s", s, allowed);
    if (count == 0)
        return fg_error(FG_EINVAL, "devices=\"%s\": no device given; %s", s, allowed);
    if (!list) {
        long v = ids[0];
        if (v == -1) {
            *n = cores;
            return FG_OK;
        }
        if (v == 0)
            return fg_error(FG_EINVAL, "devices=0: at least one device is needed (-1 = all %d)", cores);
        if (v < 0 || v > 4096)
            return fg_error(FG_EINVAL, "devices=%ld: expected 1..4096 or -1 (all %d cores)", v, cores);
        *n = (int)v;
        return FG_OK;
    }
    for (int i = 0; i < count; i++) {
        if (ids[i] < 0 || ids[i] >= cores)
            return fg_error(FG_EINVAL, "devices=\"%s\": device %ld does not exist; this machine "
                                       "has CPU devices 0..%d",
                            s, ids[i], cores - 1);
        for (int j = 0; j < i; j++)
            if (ids[j] == ids[i])
                return fg_error(FG_EINVAL, "devices=\"%s\": device %ld is listed twice", s, ids[i]);
    }
    *n = count;
    return FG_OK;
}

fg_status fg__parse_strategy(const char *s, int ndevices, fg_strategy_kind *kind, bool *spawn,
                             const char **canonical) {
    *spawn = false;
    if (!s || !*s || !strcmp(s, "auto")) {
        *kind = ndevices > 1 ? FG_STRATEGY_DDP : FG_STRATEGY_SINGLE;
        *canonical = ndevices > 1 ? "ddp" : "single";
        return FG_OK;
    }
    static const struct {
        const char *name;
        fg_strategy_kind kind;
        bool spawn;
    } k[] = {{"single", FG_STRATEGY_SINGLE, false}, {"single_device", FG_STRATEGY_SINGLE, false},
             {"dp", FG_STRATEGY_DP, false},         {"ddp", FG_STRATEGY_DDP, false},
             {"ddp_spawn", FG_STRATEGY_DDP, true},  {"ddp_fork", FG_STRATEGY_DDP, true}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (!strcmp(s, k[i].name)) {
            *kind = k[i].kind;
            *spawn = k[i].spawn;
            *canonical = k[i].name;
            if (*kind == FG_STRATEGY_SINGLE && ndevices > 1)
                return fg_error(FG_EINVAL, "strategy=\"%s\" runs on one device, but devices gives "
                                           "%d; use ddp or dp for several", s, ndevices);
            return FG_OK;
        }
    for (int i = 0; k_later[i]; i++)
        if (!strcmp(s, k_later[i]))
            return fg_error(FG_EUNSUPPORTED, "strategy=\"%s\" is not built into this fulgur yet; "
                                             "available: %s", s, k_strategies);
    return fg_error(FG_EINVAL, "strategy=\"%s\": unknown; expected one of %s", s, k_strategies);
}

fg_status fg__parse_precision(const char *s, fg_dtype *dt) {
    if (!s || !*s || !strcmp(s, "32") || !strcmp(s, "32-true")) {
        *dt = FG_F32;
        return FG_OK;
    }
    if (!strcmp(s, "64") || !strcmp(s, "64-true")) {
        *dt = FG_F64;
        return FG_OK;
    }
    static const char *const later[] = {"16", "16-mixed", "bf16", "bf16-mixed", "16-true",
                                        "bf16-true", NULL};
    for (int i = 0; later[i]; i++)
        if (!strcmp(s, later[i]))
            return fg_error(FG_EUNSUPPORTED, "precision=\"%s\" is not built into this fulgur yet; "
                                             "available: 32 (32-true), 64 (64-true)", s);
    return fg_error(FG_EINVAL, "precision=\"%s\": expected one of 32, 32-true, 64, 64-true "
                               "(16-mixed, bf16-mixed later)", s);
}

fg_fabric *fg_fabric_new(const fg_fabric_config *cfg) {
    fg_fabric_config c = cfg ? *cfg : (fg_fabric_config){0};
    int cores = fg_num_cores(), n = 0;
    fg_dtype dt;
    fg_strategy_kind kind;
    bool spawn;
    const char *canon;
    if (fg__parse_accelerator(c.accelerator) != FG_OK ||
        fg__parse_devices(c.devices, cores, &n) != FG_OK ||
        fg__parse_strategy(c.strategy, n, &kind, &spawn, &canon) != FG_OK ||
        fg__parse_precision(c.precision, &dt) != FG_OK)
        return NULL;
    if (c.num_nodes < 0 || c.num_nodes > 65536) {
        fg_error(FG_EINVAL, "num_nodes=%d: expected 1 or more", c.num_nodes);
        return NULL;
    }
    if (c.threads_per_rank < 0) {
        fg_error(FG_EINVAL, "threads_per_rank=%d: expected 0 (automatic) or more", c.threads_per_rank);
        return NULL;
    }
    if (kind == FG_STRATEGY_DP && c.num_nodes > 1) {
        fg_error(FG_EINVAL, "strategy=\"dp\" runs in one process; num_nodes=%d needs ddp", c.num_nodes);
        return NULL;
    }
    fg_fabric *f = fg_calloc(1, sizeof *f);
    if (!f) return NULL;
    f->cfg = c;
    snprintf(f->strategy_name, sizeof f->strategy_name, "%s", canon);
    f->kind = kind;
    f->spawn = spawn;
    f->ndevices = n;
    f->num_nodes = c.num_nodes ? c.num_nodes : 1;
    f->dtype = dt;
    f->seed = c.seed;
    f->world_size = 1;
    return f;
}

void fg_fabric_free(fg_fabric *f) {
    if (!f) return;
    fg_strategy_free(f->strategy);
    fg_comm_free(f->comm);
    fg_free(f->spawn_blob);
    fg_free(f->loaded_meta);
    fg_free(f);
}

fg_dtype fg_fabric_dtype(const fg_fabric *f) { return f->dtype; }
int fg_fabric_threads(const fg_fabric *f) { return f->threads; }
