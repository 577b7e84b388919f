/* The multi-process tests' communicator: forked rank `rank` of n, all on
 * one node, joined over the shm backend under the job name `job`. Returns
 * NULL, with the reason on stderr, when the group cannot be joined. */
#ifndef FULGUR_TEST_MP_JOIN_H
#define FULGUR_TEST_MP_JOIN_H

#include <stdio.h>

#include "fulgur/comm.h"
#include "fulgur/core.h"

static inline fg_comm *mp_join_shm(int rank, int n, const char *job, double timeout_s) {
    fg_cluster_info info = {.rank = rank,
                            .world_size = n,
                            .local_rank = rank,
                            .local_world_size = n,
                            .num_nodes = 1,
                            .source = "explicit"};
    snprintf(info.job_id, sizeof info.job_id, "%s", job);
    fg_comm *c =
        fg_comm_new(&info, &(fg_comm_opts){.backend = FG_COMM_SHM, .timeout_s = timeout_s});
    if (!c) fprintf(stderr, "rank %d: %s\n", rank, fg_last_error());
    return c;
}

#endif
