/* The multi-process tests' group helpers. mp_join_shm: forked rank `rank`
 * of n, all on one node, joined over the shm backend under the job name
 * `job`; NULL, with the reason on stderr, when the group cannot be joined.
 * mp_differs_from_rank0 (collective): whether this rank's n floats differ
 * from rank 0's, bit for bit (said on stderr when they do). */
#ifndef FULGUR_TEST_MP_JOIN_H
#define FULGUR_TEST_MP_JOIN_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static inline bool mp_differs_from_rank0(fg_comm *c, int rank, const float *mine, int64_t n) {
    float *r0 = malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (!r0) return true;
    memcpy(r0, mine, sizeof(float) * (size_t)n);
    bool differs = fg_comm_broadcast(c, r0, r0, n, FG_F32, 0) != FG_OK ||
                   memcmp(r0, mine, sizeof(float) * (size_t)n) != 0;
    if (differs) fprintf(stderr, "rank %d: parameters differ from rank 0's\n", rank);
    free(r0);
    return differs;
}

#endif
