/* The environment contract: where this process stands in the job, read from
 * fulgur's own variables, torchrun's, Open MPI's or SLURM's (first match by
 * rank variable wins; SLURM's as Lightning's SLURMEnvironment, with its host
 * lists expanded as scontrol does). Every number is parsed strictly, values
 * given twice must agree, and every error names the variables, so that a
 * typo in a launch script is found at once. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_impl.h"

/* Parses variable `name` as a non-negative int. Unset: *out = def, *set = 0. */
static FG_MUST_USE fg_status env_nonneg(const char *name, int def, int *out, int *set) {
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

/* ------------------------------------------------- SLURM's host lists */

#define NODELIST_GROUPS 8      /* bracket groups in one name */
#define NODELIST_MAX (1 << 20) /* hosts in one list */

/* One bracket group "01-03,7" (without the brackets, len bytes): its number
 * of values, and the idx-th into out (digits, zero-padded as written). */
static FG_MUST_USE fg_status group_value(const char *list, const char *g, size_t len, long idx,
                                         char *out, size_t cap, long *count) {
    long n = 0;
    const char *p = g, *end = g + len;
    while (p < end) {
        const char *a = p;
        while (p < end && *p >= '0' && *p <= '9') p++;
        size_t wa = (size_t)(p - a);
        if (!wa || wa > 18)
            return fg_error(FG_EINVAL,
                            "node list \"%s\": \"[%.*s]\": expected numbers and ranges like "
                            "[01-03,7]",
                            list, (int)len, g);
        long lo = strtol(a, NULL, 10), hi = lo;
        if (p < end && *p == '-') {
            const char *b = ++p;
            while (p < end && *p >= '0' && *p <= '9') p++;
            if (p == b || p - b > 18)
                return fg_error(FG_EINVAL, "node list \"%s\": \"[%.*s]\": a range without its end",
                                list, (int)len, g);
            hi = strtol(b, NULL, 10);
            if (hi < lo)
                return fg_error(FG_EINVAL,
                                "node list \"%s\": range %ld-%ld in \"[%.*s]\" runs backwards",
                                list, lo, hi, (int)len, g);
        }
        if (p < end && *p != ',')
            return fg_error(FG_EINVAL,
                            "node list \"%s\": \"[%.*s]\": unexpected '%c'; expected numbers and "
                            "ranges like [01-03,7]",
                            list, (int)len, g, *p);
        if (p < end) p++;
        if (hi - lo >= NODELIST_MAX - n)
            return fg_error(FG_EINVAL, "node list \"%s\": more than %d hosts", list, NODELIST_MAX);
        if (out && idx >= n && idx <= n + (hi - lo))
            snprintf(out, cap, "%0*ld", (int)wa, lo + (idx - n));
        n += hi - lo + 1;
    }
    *count = n;
    return FG_OK;
}

/* One name with bracket groups, pat[0..len): its number of hosts, and the
 * idx-th (the last group varies fastest) into out when out is not NULL. */
static FG_MUST_USE fg_status pattern_host(const char *list, const char *pat, size_t len, long idx,
                                          char *out, size_t cap, long *count) {
    const char *open[NODELIST_GROUPS], *close[NODELIST_GROUPS];
    long cnt[NODELIST_GROUPS];
    int ng = 0;
    if (!len) return fg_error(FG_EINVAL, "node list \"%s\": an empty host name", list);
    for (size_t i = 0; i < len; i++) {
        if (pat[i] == ']')
            return fg_error(FG_EINVAL, "node list \"%s\": \"%.*s\": ']' without '['", list,
                            (int)len, pat);
        if (pat[i] != '[') continue;
        if (ng == NODELIST_GROUPS)
            return fg_error(FG_EINVAL, "node list \"%s\": \"%.*s\": more than %d bracket groups",
                            list, (int)len, pat, NODELIST_GROUPS);
        const char *c = memchr(pat + i, ']', len - i);
        if (!c)
            return fg_error(FG_EINVAL, "node list \"%s\": \"%.*s\": '[' without ']'", list,
                            (int)len, pat);
        open[ng] = pat + i;
        close[ng] = c;
        FG_TRY(group_value(list, pat + i + 1, (size_t)(c - pat - i - 1), -1, NULL, 0, &cnt[ng]));
        ng++;
        i = (size_t)(c - pat);
    }
    long total = 1;
    for (int g = 0; g < ng; g++) {
        if (cnt[g] > NODELIST_MAX / total)
            return fg_error(FG_EINVAL, "node list \"%s\": more than %d hosts", list, NODELIST_MAX);
        total *= cnt[g];
    }
    *count = total;
    if (!out || idx < 0 || idx >= total) return FG_OK;
    long digit[NODELIST_GROUPS];
    for (int g = ng - 1; g >= 0; g--) {
        digit[g] = idx % cnt[g];
        idx /= cnt[g];
    }
    size_t k = 0;
    const char *p = pat;
    for (int g = 0; g <= ng; g++) {
        const char *stop = g < ng ? open[g] : pat + len;
        k += (size_t)snprintf(out + k, k < cap ? cap - k : 0, "%.*s", (int)(stop - p), p);
        if (g == ng) break;
        char v[24];
        long unused;
        FG_TRY(group_value(list, open[g] + 1, (size_t)(close[g] - open[g] - 1), digit[g], v,
                           sizeof v, &unused));
        k += (size_t)snprintf(out + k, k < cap ? cap - k : 0, "%s", v);
        p = close[g] + 1;
    }
    if (k >= cap)
        return fg_error(FG_EINVAL, "node list \"%s\": host %.*s... is longer than %zu bytes", list,
                        (int)FG_MIN(len, 40), pat, cap ? cap - 1 : 0);
    return FG_OK;
}

fg_status fg_cluster_nodelist_host(const char *nodelist, int index, char *out, size_t cap,
                                   int *count) {
    if (!nodelist) return fg_error(FG_EINVAL, "node list: NULL");
    const char *p = nodelist;
    long n = 0;
    bool found = false;
    for (;;) {
        /* a name runs to the next comma outside brackets */
        const char *q = p;
        int depth = 0;
        while (*q && (depth || *q != ',')) {
            if (*q == '[') depth++;
            else if (*q == ']') depth--;
            q++;
        }
        long c;
        bool mine = out && !found && index >= n;
        FG_TRY(pattern_host(nodelist, p, (size_t)(q - p), index - n, mine ? out : NULL, cap, &c));
        if (mine && index < n + c) found = true;
        if (c > NODELIST_MAX - n)
            return fg_error(FG_EINVAL, "node list \"%s\": more than %d hosts", nodelist,
                            NODELIST_MAX);
        n += c;
        if (!*q) break;
        p = q + 1;
    }
    if (count) *count = (int)n;
    return FG_OK;
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
};

static FG_MUST_USE fg_status detect_from(const env_names *e, fg_cluster_info *o) {
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
    if (lr_set && !lw_set) o->local_world_size = o->world_size;
    if (!lr_set && lw_set) o->local_rank = o->rank % o->local_world_size;
    if (o->local_world_size < 1 || o->local_world_size > o->world_size)
        return fg_error(FG_EINVAL, "%s=%d: must be in [1, %s=%d]",
                        e->local_world ? e->local_world : "local world size", o->local_world_size,
                        e->world, o->world_size);
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

    /* values given twice must agree: fulgur numbers a node's ranks consecutively */
    int nr2 = 0, nr2_set = 0;
    if (nr_set && e->node_rank2 && nr_name == e->node_rank)
        FG_TRY(env_nonneg(e->node_rank2, 0, &nr2, &nr2_set));
    if (nr2_set && nr2 != o->node_rank)
        return fg_error(FG_EINVAL, "%s=%d but %s=%d: both name this node; make them agree",
                        e->node_rank, o->node_rank, e->node_rank2, nr2);
    if (nn_set && lw_set && o->num_nodes * o->local_world_size != o->world_size)
        return fg_error(FG_EINVAL,
                        "%s=%d x %s=%d = %d ranks, but %s=%d: every node holds the same number "
                        "of ranks; make them agree",
                        e->num_nodes, o->num_nodes, e->local_world, o->local_world_size,
                        o->num_nodes * o->local_world_size, e->world, o->world_size);
    if (nr_set && lr_set && lw_set && o->rank != o->node_rank * o->local_world_size + o->local_rank)
        return fg_error(FG_EINVAL,
                        "%s=%d, but %s=%d x %s=%d + %s=%d = %d: the ranks of a node are "
                        "consecutive (rank = node rank x local world size + local rank); make "
                        "them agree",
                        e->rank, o->rank, nr_name, o->node_rank, e->local_world,
                        o->local_world_size, e->local_rank, o->local_rank,
                        o->node_rank * o->local_world_size + o->local_rank);

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

/* ------------------------------------------------------------- SLURM */

/* The first set variable among names: its value, its name into *which. */
static const char *env_any(const char *const *names, const char **which) {
    for (int i = 0; names[i]; i++) {
        const char *v = getenv(names[i]);
        if (v && *v) {
            if (which) *which = names[i];
            return v;
        }
    }
    if (which) *which = names[0];
    return NULL;
}

/* Like env_nonneg over the first set name of names. */
static FG_MUST_USE fg_status env_nonneg_any(const char *const *names, int def, int *out, int *set,
                                            const char **which) {
    const char *w;
    env_any(names, &w);
    if (which) *which = w;
    return env_nonneg(w, def, out, set);
}

/* SLURM_TASKS_PER_NODE ("2(x3),1"): its nodes and tasks, this node's tasks
 * and the tasks of the nodes before it, and whether all nodes hold the same. */
typedef struct {
    int nodes, tasks, here, before;
    bool uniform;
} tasks_per_node;

static FG_MUST_USE fg_status parse_tasks_per_node(const char *name, const char *spec, int node,
                                                  tasks_per_node *t) {
    memset(t, 0, sizeof *t);
    t->here = -1;
    t->uniform = true;
    long first = -1;
    const char *p = spec;
    while (*p) {
        char *end;
        errno = 0;
        long n = strtol(p, &end, 10), rep = 1;
        if (end == p || n < 1 || n > 1L << 20 || errno) goto bad;
        if (*end == '(') {
            if (end[1] != 'x') goto bad;
            const char *r = end + 2;
            rep = strtol(r, &end, 10);
            if (end == r || *end != ')' || rep < 1 || rep > 1L << 20) goto bad;
            end++;
        }
        if (*end && *end != ',') goto bad;
        if (first < 0) first = n;
        t->uniform &= n == first;
        if (t->nodes + rep > 1L << 20 || t->tasks + n * rep > 1L << 30) goto bad;
        if (node >= t->nodes && node < t->nodes + rep) {
            t->here = (int)n;
            t->before = t->tasks + (int)((node - t->nodes) * n);
        }
        t->nodes += (int)rep;
        t->tasks += (int)(n * rep);
        p = *end ? end + 1 : end;
    }
    if (!t->nodes) goto bad;
    return FG_OK;
bad:
    return fg_error(FG_EINVAL, "%s=\"%s\": expected tasks per node like \"2(x3),1\"", name, spec);
}

/* SLURM's srun, read as Lightning's SLURMEnvironment reads it. */
static FG_MUST_USE fg_status detect_slurm(fg_cluster_info *o) {
    static const char *const k_rank[] = {"SLURM_PROCID", NULL};
    static const char *const k_world[] = {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", NULL};
    static const char *const k_nodes[] = {"SLURM_STEP_NUM_NODES", "SLURM_NNODES",
                                          "SLURM_JOB_NUM_NODES", NULL};
    static const char *const k_tpn[] = {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", NULL};
    static const char *const k_list[] = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
                                         "SLURM_NODELIST", NULL};
    const char *w_world, *w_nodes, *w_tpn, *w_list;
    int set, nodes_set, lr_set, ntpn_set, ntpn = 0;
    o->source = "slurm";
    FG_TRY(env_nonneg_any(k_rank, 0, &o->rank, NULL, NULL));
    FG_TRY(env_nonneg_any(k_world, 0, &o->world_size, &set, &w_world));
    if (!set)
        return fg_error(FG_EINVAL, "SLURM_PROCID is set but SLURM_NTASKS is not: run the "
                                   "program with srun inside the allocation");
    if (o->world_size < 1)
        return fg_error(FG_EINVAL, "%s=%d: must be at least 1", w_world, o->world_size);
    if (o->rank >= o->world_size)
        return fg_error(FG_EINVAL, "SLURM_PROCID=%d: must be below %s=%d", o->rank, w_world,
                        o->world_size);
    FG_TRY(env_nonneg("SLURM_NODEID", 0, &o->node_rank, NULL));
    FG_TRY(env_nonneg_any(k_nodes, 1, &o->num_nodes, &nodes_set, &w_nodes));
    FG_TRY(env_nonneg("SLURM_LOCALID", 0, &o->local_rank, &lr_set));
    FG_TRY(env_nonneg("SLURM_NTASKS_PER_NODE", 0, &ntpn, &ntpn_set));
    if (o->num_nodes < 1 || o->num_nodes > o->world_size)
        return fg_error(FG_EINVAL, "%s=%d: must be in [1, %s=%d]", w_nodes, o->num_nodes, w_world,
                        o->world_size);
    if (o->node_rank >= o->num_nodes)
        return fg_error(FG_EINVAL, "SLURM_NODEID=%d: must be below %s=%d", o->node_rank, w_nodes,
                        o->num_nodes);

    const char *tpn_s = env_any(k_tpn, &w_tpn);
    if (tpn_s) {
        tasks_per_node t;
        FG_TRY(parse_tasks_per_node(w_tpn, tpn_s, o->node_rank, &t));
        if (t.nodes != o->num_nodes)
            return fg_error(FG_EINVAL, "%s=\"%s\" lists %d node%s, but %s=%d", w_tpn, tpn_s,
                            t.nodes, t.nodes == 1 ? "" : "s", w_nodes, o->num_nodes);
        if (t.tasks != o->world_size)
            return fg_error(FG_EINVAL, "%s=\"%s\" adds up to %d task%s, but %s=%d", w_tpn, tpn_s,
                            t.tasks, t.tasks == 1 ? "" : "s", w_world, o->world_size);
        if (!t.uniform)
            return fg_error(FG_EINVAL,
                            "%s=\"%s\": fulgur needs the same number of tasks on every node "
                            "(#SBATCH --ntasks-per-node=K)",
                            w_tpn, tpn_s);
        if (ntpn_set && ntpn != t.here)
            return fg_error(FG_EINVAL,
                            "SLURM_NTASKS_PER_NODE=%d, but %s=\"%s\" gives node %d %d task%s; "
                            "make --ntasks-per-node and the tasks of the step agree",
                            ntpn, w_tpn, tpn_s, o->node_rank, t.here, t.here == 1 ? "" : "s");
        o->local_world_size = t.here;
    } else if (ntpn_set && ntpn >= 1) {
        o->local_world_size = ntpn;
    } else if (o->world_size % o->num_nodes == 0) {
        o->local_world_size = o->world_size / o->num_nodes;
    } else {
        return fg_error(FG_EINVAL,
                        "%s=%d tasks on %s=%d nodes, and neither SLURM_TASKS_PER_NODE nor "
                        "SLURM_NTASKS_PER_NODE says how many on each",
                        w_world, o->world_size, w_nodes, o->num_nodes);
    }
    if (o->local_world_size * o->num_nodes != o->world_size)
        return fg_error(FG_EINVAL, "SLURM_NTASKS_PER_NODE=%d x %s=%d nodes, but %s=%d", ntpn,
                        w_nodes, o->num_nodes, w_world, o->world_size);
    if (!lr_set) o->local_rank = o->rank - o->node_rank * o->local_world_size;
    if (o->local_rank < 0 || o->local_rank >= o->local_world_size)
        return fg_error(FG_EINVAL, "SLURM_LOCALID=%d: must be below the %d tasks of node %d",
                        o->local_rank, o->local_world_size, o->node_rank);
    int expect = o->node_rank * o->local_world_size + o->local_rank;
    if (o->rank != expect)
        return fg_error(FG_EINVAL,
                        "SLURM_PROCID=%d, but SLURM_NODEID=%d x %d tasks per node + "
                        "SLURM_LOCALID=%d = %d: fulgur numbers the ranks of a node "
                        "consecutively; run srun with --distribution=block",
                        o->rank, o->node_rank, o->local_world_size, o->local_rank, expect);

    const char *list = env_any(k_list, &w_list);
    char first[FG_CLUSTER_ADDR_MAX] = "";
    if (list) {
        int hosts = 0;
        fg_status st = fg_cluster_nodelist_host(list, 0, first, sizeof first, &hosts);
        if (st != FG_OK) return fg_error(st, "%s: %s", w_list, fg_last_error());
        if (hosts != o->num_nodes)
            return fg_error(FG_EINVAL, "%s=\"%s\" names %d host%s, but %s=%d", w_list, list, hosts,
                            hosts == 1 ? "" : "s", w_nodes, o->num_nodes);
    }
    const char *job = getenv("SLURM_JOB_ID"), *arr = getenv("SLURM_ARRAY_JOB_ID"),
               *task = getenv("SLURM_ARRAY_TASK_ID");
    if (arr && *arr && task && *task) snprintf(o->job_id, sizeof o->job_id, "%s_%s", arr, task);
    else copy_str(o->job_id, sizeof o->job_id, job);

    size_t k = 0;
    const char *addr = getenv("MASTER_ADDR");
    if (addr && *addr) copy_str(o->master_addr, sizeof o->master_addr, addr);
    else if (first[0]) {
        copy_str(o->master_addr, sizeof o->master_addr, first);
        k += (size_t)snprintf(o->derived + k, sizeof o->derived - k,
                              "master %s: the first host of %s", first, w_list);
    }
    int port = 0, port_set = 0;
    FG_TRY(env_nonneg("MASTER_PORT", 0, &port, &port_set));
    if (port_set && port > 65535) return fg_error(FG_EINVAL, "MASTER_PORT=%d: not a port", port);
    if (!port_set) {
        /* Lightning's default: 15000 + the job id's last four digits */
        size_t n = job ? strlen(job) : 0;
        port = n ? 15000 + atoi(job + (n > 4 ? n - 4 : 0)) : 12910;
        if (k < sizeof o->derived)
            snprintf(o->derived + k, sizeof o->derived - k, "%sport %d: %s", k ? "; " : "", port,
                     n ? "15000 + the last 4 digits of SLURM_JOB_ID (Lightning's)"
                       : "Lightning's default without a job id");
    }
    o->master_port = port;
    return FG_OK;
}

/* salloc's shell (a job named bash or interactive) is not a SLURM launch:
 * the user starts the ranks there some other way (Lightning's rule). */
static bool slurm_launched(void) {
    const char *v = getenv("SLURM_PROCID");
    if (!v || !*v) return false;
    const char *name = getenv("SLURM_JOB_NAME");
    return !name || (strcmp(name, "bash") && strcmp(name, "interactive"));
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
    if (!strcmp(o.source, "none") && slurm_launched()) FG_TRY(detect_slurm(&o));
    const char *job = getenv("FULGUR_JOB_ID");
    if (job && *job) copy_str(o.job_id, sizeof o.job_id, job);
    FG_TRY(fg_cluster_validate(&o));
    *out = o;
    return FG_OK;
}
