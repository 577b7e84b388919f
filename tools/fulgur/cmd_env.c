/* fulgur env: what fulgur detects here: cores and threads per rank, the
 * cluster environment and its rank variables, the backends and kernels
 * built in. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void show_var(const char *name) {
    const char *v = getenv(name);
    if (v) printf("    %-26s %s\n", name, v);
}

int cmd_env(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: fulgur env\n\nPrints cores, threads per rank, the detected cluster "
               "environment, and the backends built in.\n");
        return FG_EXIT_OK;
    }
    if (argc > 1) {
        cli_error("env takes no arguments (got \"%s\")", argv[1]);
        return FG_EXIT_USAGE;
    }
    printf("fulgur %s\n", fg_version());
    int cores = fg_num_cores();
    printf("cores:                 %d\n", cores);
    fg_cluster_info info;
    if (fg_cluster_detect(&info) != FG_OK) {
        printf("cluster environment:   invalid: %s\n", fg_last_error());
    } else {
        int local = info.local_world_size > 0 ? info.local_world_size : 1;
        const char *t = getenv("FULGUR_NUM_THREADS");
        printf("threads per rank:      %s%d (%s)\n", "", t ? atoi(t) : (cores / local ? cores / local : 1),
               t ? "FULGUR_NUM_THREADS" : "cores / local ranks");
        printf("cluster environment:   %s\n", info.source);
        printf("    rank %d of %d, local rank %d of %d, node %d of %d\n", info.rank,
               info.world_size, info.local_rank, info.local_world_size, info.node_rank,
               info.num_nodes);
        if (info.master_addr[0]) printf("    master %s:%d\n", info.master_addr, info.master_port);
        if (info.job_id[0]) printf("    job id %s\n", info.job_id);
    }
    static const char *const vars[] = {
        "FULGUR_RANK", "FULGUR_WORLD_SIZE", "FULGUR_LOCAL_RANK", "FULGUR_LOCAL_WORLD_SIZE",
        "FULGUR_NODE_RANK", "FULGUR_NUM_NODES", "FULGUR_MASTER_ADDR", "FULGUR_MASTER_PORT",
        "FULGUR_JOB_ID", "FULGUR_BACKEND", "FULGUR_NUM_THREADS", "FULGUR_COMM_TIMEOUT_S",
        "FULGUR_COMM_CHECK", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
        "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
        "SLURM_NODEID", "OPENBLAS_CORETYPE", "OMP_NUM_THREADS", NULL};
    printf("variables set:\n");
    for (int i = 0; vars[i]; i++) show_var(vars[i]);
    printf("backends built in:     shm%s%s\n", fg_comm_backend_built(FG_COMM_MPI) ? ", mpi (Open MPI)" : "",
           fg_comm_backend_built(FG_COMM_NCCL) ? ", nccl" : "");
    printf("accelerators:          cpu (no GPU support built in)\n");
    printf("kernels:               %s\n", fg_ops_blas_info());
    return FG_EXIT_OK;
}
