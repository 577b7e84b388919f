/* The launch plan: what the user asked for plus where this process stands
 * gives the world size, this process's rank, the threads of each rank and
 * the launcher. A plan is pure: it reads the environment (through
 * fg_cluster_detect and the few variables documented in launch.h) but
 * starts nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fulgur/device.h"
#include "launch_impl.h"

fg_status fg_launch_cpu_devices(int *out) {
    long v = 0;
    FG_TRY(fg__env_int("FULGUR_CPU_DEVICES", 0, &v));
    if (getenv("FULGUR_CPU_DEVICES") && *getenv("FULGUR_CPU_DEVICES") &&
        (v < 1 || v > FG_DEVICES_MAX))
        return fg_error(FG_EINVAL, "FULGUR_CPU_DEVICES=%ld: expected 1..%d", v, FG_DEVICES_MAX);
    if (v == 0) v = fg_num_cores();
    *out = (int)FG_MIN(FG_MAX(v, 1), FG_DEVICES_MAX);
    return FG_OK;
}

fg_status fg_launch_threads_per_rank(int local_ranks, int *out, const char **from) {
    long env = 0;
    FG_TRY(fg__env_int("FULGUR_NUM_THREADS", 0, &env));
    const char *v = getenv("FULGUR_NUM_THREADS");
    if (v && *v) {
        if (env < 1 || env > 4096)
            return fg_error(FG_EINVAL, "FULGUR_NUM_THREADS=%s: expected 1..4096", v);
        *out = (int)env;
        if (from) *from = "FULGUR_NUM_THREADS";
        return FG_OK;
    }
    if (local_ranks < 1) local_ranks = 1;
    *out = FG_MAX(fg_num_cores() / local_ranks, 1);
    if (from) *from = "cores / local ranks";
    return FG_OK;
}

/* Reads an optional integer variable among names into *out (unchanged if
 * none is set); the error names the variable. */
static FG_MUST_USE fg_status env_int_any(const char *const *names, int lo, int hi, int *out,
                                         bool *set) {
    const char *which;
    const char *v = fg__getenv_any(names, &which);
    if (set) *set = v != NULL;
    if (!v) return FG_OK;
    char *end;
    long x = strtol(v, &end, 10);
    if (end == v || *end || x < lo || x > hi)
        return fg_error(FG_EINVAL, "%s=\"%s\": expected an integer in %d..%d", which, v, lo, hi);
    *out = (int)x;
    return FG_OK;
}

/* A ddp program started by hand on each of several nodes (the seed's
 * "NODE_RANK=1 ... python my_file.py"): its node and the master. */
static FG_MUST_USE fg_status manual_nodes(int num_nodes, fg_cluster_info *c) {
    static const char *const k_node[] = {"FULGUR_NODE_RANK", "NODE_RANK", "GROUP_RANK", NULL};
    static const char *const k_addr[] = {"FULGUR_MASTER_ADDR", "MASTER_ADDR", NULL};
    static const char *const k_port[] = {"FULGUR_MASTER_PORT", "MASTER_PORT", NULL};
    bool have_node, have_port;
    FG_TRY(env_int_any(k_node, 0, num_nodes - 1, &c->node_rank, &have_node));
    const char *addr = fg__getenv_any(k_addr, NULL);
    FG_TRY(env_int_any(k_port, 1, 65535, &c->master_port, &have_port));
    if (!have_node || !addr || !have_port)
        return fg_error(FG_EINVAL,
                        "num_nodes=%d, but this process was not started by a launcher "
                        "and %s is not set; on each node set NODE_RANK (0..%d), "
                        "MASTER_ADDR and MASTER_PORT, or start it with `fulgur run "
                        "--nnodes %d --node-rank R ...`, mpirun or srun",
                        num_nodes,
                        !have_node ? "NODE_RANK"
                        : !addr    ? "MASTER_ADDR"
                                   : "MASTER_PORT",
                        num_nodes - 1, num_nodes);
    snprintf(c->master_addr, sizeof c->master_addr, "%s", addr);
    return FG_OK;
}

/* devices NULL or "auto" (with spaces, any case) */
static bool is_auto(const char *d) {
    if (!d) return true;
    while (*d == ' ') d++;
    if (strncasecmp(d, "auto", 4)) return false;
    for (d += 4; *d == ' '; d++) {
    }
    return !*d;
}

fg_status fg_launch_plan_make(const fg_launch_opts *opts, const fg_cluster_info *env,
                              fg_launch_plan *out) {
    if (!out) return fg_error(FG_EINVAL, "launch plan: NULL output");
    memset(out, 0, sizeof *out);
    fg_launch_opts o = opts ? *opts : (fg_launch_opts){0};
    if (o.num_nodes < 0 || o.num_nodes > 65536)
        return fg_error(FG_EINVAL, "num_nodes=%d: expected 1 or more", o.num_nodes);
    if (o.threads_per_rank < 0 || o.threads_per_rank > 4096)
        return fg_error(FG_EINVAL, "threads_per_rank=%d: expected 0 (automatic) or 1..4096",
                        o.threads_per_rank);
    int num_nodes = o.num_nodes ? o.num_nodes : 1;

    fg_cluster_info detected;
    if (!env) {
        FG_TRY(fg_cluster_detect(&detected));
        env = &detected;
    }
    const char *source = env->source ? env->source : "explicit";
    out->launched = strcmp(source, "none") != 0;

    FG_TRY(fg_launch_parse_accelerator(o.accelerator, &out->accelerator));
    out->accelerator_auto = !o.accelerator || !strcasecmp(o.accelerator, "auto");
    FG_TRY(fg_launch_parse_precision(o.precision, &out->precision));
    int available;
    FG_TRY(fg_launch_cpu_devices(&available));
    const char *what = getenv("FULGUR_CPU_DEVICES") && *getenv("FULGUR_CPU_DEVICES")
                           ? "CPU devices here (FULGUR_CPU_DEVICES)"
                           : "CPU devices here (cores)";
    if (out->launched && is_auto(o.devices) && env->local_world_size >= 1 &&
        env->local_world_size <= FG_DEVICES_MAX) {
        /* devices left to fulgur under a launcher: as many as it started here */
        FG_TRY(fg_launch_devices_count(env->local_world_size,
                                       FG_MAX(available, env->local_world_size), &out->devices));
        if (!o.num_nodes && env->num_nodes >= 1) num_nodes = env->num_nodes;
    } else {
        FG_TRY(fg__launch_parse_devices(o.devices, available, what, &out->devices));
    }
    FG_TRY(fg_launch_parse_strategy(o.strategy, out->devices.count, num_nodes, &out->strategy));
    out->num_nodes = num_nodes;
    /* the strategy's row says what a process is and what starts the ranks */
    const fg_strategy_info *row = fg_strategy_info_of(out->strategy);
    const char *sname = row->name;
    bool ddp = row->ranks == FG_RANKS_PER_DEVICE;
    bool ddp2 = row->ranks == FG_RANKS_PER_NODE; /* one process per node, devices its threads */
    bool spawn = row->launcher == FG_LAUNCHER_FORK;
    bool threads = row->launcher == FG_LAUNCHER_THREADS; /* dp, ddp2: replicas on threads */
    int want = ddp ? out->devices.count * num_nodes : ddp2 ? num_nodes : 1;
    fg_cluster_info *c = &out->cluster;

    if (out->launched) {
        FG_TRY(fg_cluster_validate(env));
        if (spawn && env->world_size > 1)
            return fg_error(FG_EINVAL,
                            "strategy=\"%s\" forks its own ranks, but this process was "
                            "already launched as rank %d of %d (%s); use strategy "
                            "\"ddp\"",
                            sname, env->rank, env->world_size, source);
        if (ddp2 && env->world_size != num_nodes)
            return fg_error(FG_EMISMATCH,
                            "strategy=\"ddp2\" runs one process per node, but the launcher (%s) "
                            "started %d ranks for num_nodes=%d; start one per node (fulgur run "
                            "--hosts h1:1,h2:1, mpirun --map-by node)",
                            source, env->world_size, num_nodes);
        if (!ddp && !ddp2 && env->world_size > 1)
            return fg_error(FG_EINVAL,
                            "strategy=\"%s\" runs in one process, but the launcher "
                            "(%s) started %d ranks; use strategy \"ddp\"",
                            sname, source, env->world_size);
        if (ddp && !strcmp(source, "slurm") && out->devices.count != env->local_world_size)
            return fg_error(FG_EMISMATCH,
                            "devices=%d, but SLURM started %d task%s on this node: set "
                            "#SBATCH --ntasks-per-node=%d (one task per device, as Lightning "
                            "asks) or devices=%d",
                            out->devices.count, env->local_world_size,
                            env->local_world_size == 1 ? "" : "s", out->devices.count,
                            env->local_world_size);
        if (ddp && !strcmp(source, "slurm") && o.num_nodes && o.num_nodes != env->num_nodes)
            return fg_error(FG_EMISMATCH,
                            "num_nodes=%d, but SLURM's job has %d node%s: set #SBATCH --nodes=%d "
                            "or num_nodes=%d",
                            o.num_nodes, env->num_nodes, env->num_nodes == 1 ? "" : "s",
                            o.num_nodes, env->num_nodes);
        if (ddp && !spawn && env->world_size != want)
            return fg_error(FG_EMISMATCH,
                            "the launcher (%s) started %d rank%s, but devices x "
                            "num_nodes = %d x %d = %d; make them agree",
                            source, env->world_size, env->world_size == 1 ? "" : "s",
                            out->devices.count, num_nodes, want);
        if (!spawn || env->world_size > 1) {
            *c = *env;
            c->source = source;
            out->launcher = threads ? FG_LAUNCHER_THREADS : FG_LAUNCHER_NONE;
            out->world_size = env->world_size;
            out->local_world_size = env->local_world_size;
            out->rank = env->rank;
            out->local_rank = env->local_rank;
            out->node_rank = env->node_rank;
            goto threads;
        }
        /* ddp_spawn under a launcher of one rank: fork as if not launched */
    }

    /* not launched: this process starts the job (or is all of it) */
    *c = (fg_cluster_info){.num_nodes = num_nodes, .source = "fulgur"};
    snprintf(c->master_addr, sizeof c->master_addr, "127.0.0.1");
    if ((ddp || ddp2) && num_nodes > 1) {
        if (spawn)
            return fg_error(FG_EINVAL,
                            "strategy=\"%s\" forks its ranks on one machine, but "
                            "num_nodes=%d; use strategy \"ddp\" across nodes",
                            sname, num_nodes);
        FG_TRY(manual_nodes(num_nodes, c));
    } else {
        static const char *const k_port[] = {"FULGUR_MASTER_PORT", "MASTER_PORT", NULL};
        FG_TRY(env_int_any(k_port, 1, 65535, &c->master_port, NULL));
    }
    out->world_size = want;
    out->local_world_size = ddp ? out->devices.count : 1;
    out->node_rank = c->node_rank;
    out->rank = out->node_rank * out->local_world_size;
    out->local_rank = 0;
    if (spawn || threads || want > 1) out->launcher = row->launcher;
    else out->launcher = FG_LAUNCHER_NONE;
    c->world_size = out->world_size;
    c->local_world_size = out->local_world_size;
    c->rank = out->rank;
    c->local_rank = 0;
    if (spawn) {
        /* the parent is no rank; cluster describes rank 0 */
        out->rank = -1;
        out->local_rank = -1;
    }

threads:
    if (o.threads_per_rank > 0) {
        out->threads_per_rank = o.threads_per_rank;
        out->threads_from = "threads_per_rank";
        return FG_OK;
    }
    return fg_launch_threads_per_rank(out->local_world_size, &out->threads_per_rank,
                                      &out->threads_from);
}

char *fg_launch_plan_format(const fg_launch_plan *p, char *buf, size_t cap) {
    if (!buf || !cap) return buf;
    if (!p) {
        snprintf(buf, cap, "(no plan)");
        return buf;
    }
    char devs[128];
    fg_devices_format(&p->devices, devs, sizeof devs);
    const char *how = p->launched ? p->cluster.source : "not launched";
    const fg_strategy_info *row = fg_strategy_info_of(p->strategy);
    if (row && row->ranks == FG_RANKS_ONE_PROCESS && row->replica_threads)
        snprintf(buf, cap,
                 "dp, 1 process with %d worker threads on %s (devices %s), %s, launcher %s, "
                 "%d kernel thread%s, precision %s",
                 p->devices.count, fg_accelerator_name(p->accelerator), devs, how,
                 fg_launcher_name(p->launcher), p->threads_per_rank,
                 p->threads_per_rank == 1 ? "" : "s", fg_precision_kind_name(p->precision));
    else {
        char me[48] = "";
        if (p->rank >= 0) snprintf(me, sizeof me, ", this process is rank %d", p->rank);
        else snprintf(me, sizeof me, ", this process is the parent");
        snprintf(buf, cap,
                 "%s on %s, %d rank%s (%d per node x %d node%s, devices %s), %s%s, "
                 "launcher %s, %d thread%s per rank (%s), precision %s",
                 fg_strategy_kind_name(p->strategy), fg_accelerator_name(p->accelerator),
                 p->world_size, p->world_size == 1 ? "" : "s", p->local_world_size, p->num_nodes,
                 p->num_nodes == 1 ? "" : "s", devs, how, me, fg_launcher_name(p->launcher),
                 p->threads_per_rank, p->threads_per_rank == 1 ? "" : "s", p->threads_from,
                 fg_precision_kind_name(p->precision));
    }
    if (p->accelerator_auto) { /* which accelerator auto took, and why */
        char why[256];
        int gpus = fg_device_count(FG_CUDA, why, sizeof why);
        size_t len = strlen(buf);
        if (gpus > 0)
            snprintf(buf + len, cap - len, ", accelerator auto: gpu (%d GPU%s answer%s)", gpus,
                     gpus == 1 ? "" : "s", gpus == 1 ? "s" : "");
        else
            snprintf(buf + len, cap - len, ", accelerator auto: cpu (%s)",
                     strncmp(why, "this build has no CUDA", 22) == 0
                         ? "no CUDA backend in this build"
                         : "no GPU answers");
    }
    return buf;
}
