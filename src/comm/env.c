/* The environment contract: where this process stands in the job, read from
 * fulgur's own variables, torchrun's, Open MPI's or SLURM's (first match by
 * rank variable wins). Every number is parsed strictly and every error names
 * the variable, so that a typo in a launch script is found at once. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_impl.h"

/* Parses variable `name` as a non-negative int. Unset: *out = def, *set = 0. */
static fg_status env_nonneg(const char *name, int def, int *out, int *set) {
    const char *v = getenv(name);
    *out = def;
    if (set) *set = 0;
    if (!v || !*v) return FG_OK;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    while (*end == ' ') end++;
    if (errno || *end || end == v || x < 0 || x > 1L << 30)
        return fg_error(FG_EINVAL, "%s=\"%s\": expected a non-negative integer", name, v);
    *out = (int)x;
    if (set) *set = 1;
    return FG_OK;
}

static void copy_str(char *dst, size_t cap, const char *src) {
    snprintf(dst, cap, "%s", src ? src : "");
}

/* SLURM_TASKS_PER_NODE looks like "2(x3),1": tasks on each node in order. */
static int slurm_tasks_on_node(const char *spec, int node) {
    int idx = 0;
    const char *p = spec;
    while (p && *p) {
        char *end;
        long n = strtol(p, &end, 10);
        if (end == p) return -1;
        long rep = 1;
        if (*end == '(') {
            if (end[1] != 'x') return -1;
            rep = strtol(end + 2, &end, 10);
            if (*end != ')') return -1;
            end++;
        }
        if (node < idx + rep) return (int)n;
        idx += (int)rep;
        p = *end == ',' ? end + 1 : NULL;
    }
    return -1;
}

fg_status fg_cluster_validate(const fg_cluster_info *in) {
    const char *src = in->source ? in->source : "explicit";
    if (in->world_size < 1)
        return fg_error(FG_EINVAL, "cluster (%s): world_size=%d: must be at least 1", src,
                        in->world_size);
    if (in->rank < 0 || in->rank >= in->world_size)
        return fg_error(FG_EINVAL, "cluster (%s): rank=%d: must be in [0, world_size=%d)", src,
                        in->rank, in->world_size);
    if (in->local_world_size < 1 || in->local_world_size > in->world_size)
        return fg_error(FG_EINVAL,
                        "cluster (%s): local_world_size=%d: must be in [1, world_size=%d]", src,
                        in->local_world_size, in->world_size);
    if (in->local_rank < 0 || in->local_rank >= in->local_world_size)
        return fg_error(FG_EINVAL,
                        "cluster (%s): local_rank=%d: must be in [0, local_world_size=%d)", src,
                        in->local_rank, in->local_world_size);
    if (in->num_nodes < 1 || in->num_nodes > in->world_size)
        return fg_error(FG_EINVAL, "cluster (%s): num_nodes=%d: must be in [1, world_size=%d]", src,
                        in->num_nodes, in->world_size);
    if (in->node_rank < 0 || in->node_rank >= in->num_nodes)
        return fg_error(FG_EINVAL, "cluster (%s): node_rank=%d: must be in [0, num_nodes=%d)", src,
                        in->node_rank, in->num_nodes);
    if (in->master_port < 0 || in->master_port > 65535)
        return fg_error(FG_EINVAL, "cluster (%s): master_port=%d: must be in [0, 65535]", src,
                        in->master_port);
    return FG_OK;
}

/* The names one source uses. NULL entries are not part of that source. */
typedef struct {
    const char *source, *rank, *world, *local_rank, *local_world, *node_rank, *node_rank2,
        *num_nodes, *addr, *port, *job;
} env_names;

static const env_names k_sources[] = {
    {"fulgur", "FULGUR_RANK", "FULGUR_WORLD_SIZE", "FULGUR_LOCAL_RANK", "FULGUR_LOCAL_WORLD_SIZE",
     "FULGUR_NODE_RANK", NULL, "FULGUR_NUM_NODES", "FULGUR_MASTER_ADDR", "FULGUR_MASTER_PORT",
     "FULGUR_JOB_ID"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
     "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"},
    /* OMPI_COMM_WORLD_NODE_RANK is Open MPI's rank among the processes of the
     * node (across jobs), not the node's index: the node index is derived. */
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", NULL, NULL, NULL, NULL, NULL, "OMPI_MCA_ess_base_jobid"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL, "SLURM_NODEID", NULL,
     "SLURM_NNODES", NULL, NULL, "SLURM_JOB_ID"},
};

static fg_status detect_from(const env_names *e, fg_cluster_info *o) {
    int set;
    o->source = e->source;
    FG_TRY(env_nonneg(e->rank, 0, &o->rank, NULL));
    FG_TRY(env_nonneg(e->world, 0, &o->world_size, &set));
    if (!set)
        return fg_error(FG_EINVAL, "%s is set but %s is not: set both (source %s)", e->rank,
                        e->world, e->source);
    if (o->world_size < 1)
        return fg_error(FG_EINVAL, "%s=%d: must be at least 1", e->world, o->world_size);
    if (o->rank >= o->world_size)
        return fg_error(FG_EINVAL, "%s=%d: must be below %s=%d", e->rank, o->rank, e->world,
                        o->world_size);

    int lr_set = 0, lw_set = 0;
    if (e->local_rank) FG_TRY(env_nonneg(e->local_rank, o->rank, &o->local_rank, &lr_set));
    else o->local_rank = o->rank;
    if (e->local_world)
        FG_TRY(env_nonneg(e->local_world, o->world_size, &o->local_world_size, &lw_set));
    else o->local_world_size = o->world_size;
    if (!strcmp(e->source, "slurm")) {
        const char *tpn = getenv("SLURM_TASKS_PER_NODE");
        int node = 0;
        FG_TRY(env_nonneg("SLURM_NODEID", 0, &node, NULL));
        int n = tpn ? slurm_tasks_on_node(tpn, node) : -1;
        if (n > 0) {
            o->local_world_size = n;
            lw_set = 1;
        } else if (tpn && *tpn) {
            return fg_error(FG_EINVAL,
                            "SLURM_TASKS_PER_NODE=\"%s\": expected a list like \"2(x3),1\"", tpn);
        }
    }
    if (lr_set && !lw_set) o->local_world_size = o->world_size;
    if (!lr_set && lw_set) o->local_rank = o->rank % o->local_world_size;
    if (o->local_world_size < 1 || o->local_world_size > o->world_size)
        return fg_error(FG_EINVAL, "%s=%d: must be in [1, %s=%d]",
                        e->local_world ? e->local_world : "SLURM_TASKS_PER_NODE",
                        o->local_world_size, e->world, o->world_size);
    if (o->local_rank >= o->local_world_size)
        return fg_error(FG_EINVAL, "%s=%d: must be below the local world size %d",
                        e->local_rank ? e->local_rank : e->rank, o->local_rank,
                        o->local_world_size);

    /* nodes: given, or derived from a uniform layout of local_world_size */
    int nr_set = 0, nn_set = 0;
    const char *nr_name = e->node_rank;
    if (e->node_rank) FG_TRY(env_nonneg(e->node_rank, 0, &o->node_rank, &nr_set));
    if (!nr_set && e->node_rank2) {
        FG_TRY(env_nonneg(e->node_rank2, 0, &o->node_rank, &nr_set));
        nr_name = e->node_rank2;
    }
    if (e->num_nodes) FG_TRY(env_nonneg(e->num_nodes, 1, &o->num_nodes, &nn_set));
    bool uniform = o->world_size % o->local_world_size == 0;
    if (!nn_set) o->num_nodes = uniform ? o->world_size / o->local_world_size : o->node_rank + 1;
    if (!nr_set) o->node_rank = uniform ? o->rank / o->local_world_size : 0;
    if (o->num_nodes < 1 || o->num_nodes > o->world_size)
        return fg_error(FG_EINVAL, "%s=%d: must be in [1, %s=%d]",
                        e->num_nodes ? e->num_nodes : "nodes", o->num_nodes, e->world,
                        o->world_size);
    if (o->node_rank >= o->num_nodes)
        return fg_error(FG_EINVAL, "%s=%d: must be below the number of nodes %d",
                        nr_name ? nr_name : "node rank", o->node_rank, o->num_nodes);
    if (o->num_nodes == 1 && o->local_world_size != o->world_size)
        return fg_error(FG_EINVAL, "%s=%d: one node but the world has %d ranks",
                        e->local_world ? e->local_world : "local world size", o->local_world_size,
                        o->world_size);

    if (e->addr) copy_str(o->master_addr, sizeof o->master_addr, getenv(e->addr));
    if (e->port) {
        int port = 0;
        FG_TRY(env_nonneg(e->port, 0, &port, NULL));
        if (port > 65535) return fg_error(FG_EINVAL, "%s=%d: not a port", e->port, port);
        o->master_port = port;
    }
    if (e->job) copy_str(o->job_id, sizeof o->job_id, getenv(e->job));
    if (!strcmp(e->source, "openmpi") && !o->job_id[0])
        copy_str(o->job_id, sizeof o->job_id, getenv("PMIX_NAMESPACE"));
    return FG_OK;
}

fg_status fg_cluster_detect(fg_cluster_info *out) {
    if (!out) return fg_error(FG_EINVAL, "fg_cluster_detect: out is NULL");
    fg_cluster_info o;
    memset(&o, 0, sizeof o);
    o.world_size = o.local_world_size = o.num_nodes = 1;
    o.source = "none";
    for (size_t i = 0; i < sizeof k_sources / sizeof k_sources[0]; i++) {
        const char *v = getenv(k_sources[i].rank);
        if (!v || !*v) continue;
        FG_TRY(detect_from(&k_sources[i], &o));
        break;
    }
    const char *job = getenv("FULGUR_JOB_ID");
    if (job && *job) copy_str(o.job_id, sizeof o.job_id, job);
    FG_TRY(fg_cluster_validate(&o));
    *out = o;
    return FG_OK;
}
