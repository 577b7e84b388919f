/* The environment contract a launcher gives each rank: fulgur's FULGUR_*
 * names and torchrun's, written into this process (fg_launch_export) or into
 * the environment a child is started with (fg__contract_env). The child's
 * environment is this process's minus every contract variable, so a stale
 * value from an outer launcher never leaks into a rank. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "launch_impl.h"

extern char **environ;

/* Every variable the contract sets, in the order they are written. */
static const char *const k_vars[] = {"FULGUR_RANK",
                                     "FULGUR_WORLD_SIZE",
                                     "FULGUR_LOCAL_RANK",
                                     "FULGUR_LOCAL_WORLD_SIZE",
                                     "FULGUR_NODE_RANK",
                                     "FULGUR_NUM_NODES",
                                     "FULGUR_MASTER_ADDR",
                                     "FULGUR_MASTER_PORT",
                                     "FULGUR_JOB_ID",
                                     "RANK",
                                     "WORLD_SIZE",
                                     "LOCAL_RANK",
                                     "LOCAL_WORLD_SIZE",
                                     "NODE_RANK",
                                     "GROUP_RANK",
                                     "GROUP_WORLD_SIZE",
                                     "MASTER_ADDR",
                                     "MASTER_PORT",
                                     NULL};

#define NVARS 18
#define VALMAX (FG_CLUSTER_ADDR_MAX + 8)

/* The contract's values for info, in k_vars' order; "" for a variable left
 * unset (the master and the job id when unknown). */
static void contract_values(const fg_cluster_info *info, char vals[NVARS][VALMAX]) {
    const int nums[NVARS] = {
        [0] = info->rank,
        [1] = info->world_size,
        [2] = info->local_rank,
        [3] = info->local_world_size,
        [4] = info->node_rank,
        [5] = info->num_nodes,
        [7] = info->master_port,
        [9] = info->rank,
        [10] = info->world_size,
        [11] = info->local_rank,
        [12] = info->local_world_size,
        [13] = info->node_rank, /* torchrun: NODE_RANK and GROUP_RANK are both the node */
        [14] = info->node_rank,
        [15] = info->num_nodes,
        [17] = info->master_port};
    for (int i = 0; i < NVARS; i++) snprintf(vals[i], VALMAX, "%d", nums[i]);
    snprintf(vals[6], VALMAX, "%s", info->master_addr);
    snprintf(vals[16], VALMAX, "%s", info->master_addr);
    snprintf(vals[8], VALMAX, "%s", info->job_id);
    if (info->master_port <= 0) vals[7][0] = vals[17][0] = '\0';
}

fg_status fg_launch_export(const fg_cluster_info *info) {
    if (!info) return fg_error(FG_EINVAL, "launch export: NULL cluster info");
    FG_TRY(fg_cluster_validate(info));
    char vals[NVARS][VALMAX];
    contract_values(info, vals);
    for (int i = 0; k_vars[i]; i++) {
        int rc = vals[i][0] ? setenv(k_vars[i], vals[i], 1) : unsetenv(k_vars[i]);
        if (rc != 0) return fg_error(FG_ENOMEM, "launch export: cannot set %s", k_vars[i]);
    }
    return FG_OK;
}

void fg_launch_unexport(void) {
    for (int i = 0; k_vars[i]; i++) unsetenv(k_vars[i]);
}

static bool is_contract_var(const char *entry) {
    for (int i = 0; k_vars[i]; i++) {
        size_t n = strlen(k_vars[i]);
        if (!strncmp(entry, k_vars[i], n) && entry[n] == '=') return true;
    }
    return false;
}

void fg__env_free(char **env) {
    if (!env) return;
    for (char **e = env; *e; e++) fg_free(*e);
    fg_free(env);
}

fg_status fg__contract_env(const fg_cluster_info *info, char ***out) {
    *out = NULL;
    size_t n = 0;
    for (char **e = environ; e && *e; e++) n++;
    char **env = fg_calloc(n + NVARS + 1, sizeof *env);
    if (!env) return FG_ENOMEM;
    size_t k = 0;
    for (char **e = environ; e && *e; e++) {
        if (is_contract_var(*e)) continue;
        if (!(env[k++] = fg_strdup(*e))) goto nomem;
    }
    char vals[NVARS][VALMAX];
    contract_values(info, vals);
    for (int i = 0; k_vars[i]; i++) {
        if (!vals[i][0]) continue;
        size_t len = strlen(k_vars[i]) + strlen(vals[i]) + 2;
        if (!(env[k] = fg_alloc(len))) goto nomem;
        snprintf(env[k++], len, "%s=%s", k_vars[i], vals[i]);
    }
    *out = env;
    return FG_OK;
nomem:
    fg__env_free(env);
    return fg_error(FG_ENOMEM, "launch: out of memory building a rank's environment");
}

void fg_launch_new_job_id(char *buf, size_t cap) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    unsigned long long us =
        (unsigned long long)tv.tv_sec * 1000000ull + (unsigned long long)tv.tv_usec;
    /* a counter too: two launches in one microsecond from one process differ */
    static _Atomic unsigned seq;
    snprintf(buf, cap, "fg-%d-%llx-%u", (int)getpid(), us, seq++);
}

int fg__free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int port = 0;
    if (fd >= 0) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof a;
        if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
            getsockname(fd, (struct sockaddr *)&a, &len) == 0)
            port = ntohs(a.sin_port);
        close(fd);
    }
    return port > 0 ? port : 29500 + (int)(getpid() % 10000);
}

const char *fg__getenv_any(const char *const *names, const char **which) {
    for (int i = 0; names[i]; i++) {
        const char *v = getenv(names[i]);
        if (v && *v) {
            if (which) *which = names[i];
            return v;
        }
    }
    if (which) *which = NULL;
    return NULL;
}
