/* layer: comm. The nccl comm backend (src/comm/nccl.c). On every machine:
 * the NCCL unique id made by rank 0 (ncclGetUniqueId works without a GPU)
 * reaches every rank over the job's shm group intact; a communicator asked
 * for nccl without a GPU fails saying why and what to use. With one GPU:
 * one rank's collectives on device memory. Skips, saying why, where NCCL
 * itself cannot make an id or the build has no CUDA. */
#include <stdint.h>
#include <sys/mman.h>

#include "fulgur/comm.h"
#include "fulgur/device.h"
#include "fulgur/gpu.h"
#include "harness.h"
#ifdef FULGUR_HAVE_CUDA
#include "comm/nccl_impl.h"
#endif

static fg_cluster_info info_of(int rank, int n, const char *tag) {
    fg_cluster_info info = {.rank = rank,
                            .world_size = n,
                            .local_rank = rank,
                            .local_world_size = n,
                            .node_rank = 0,
                            .num_nodes = 1,
                            .source = "test"};
    snprintf(info.job_id, sizeof info.job_id, "t%d-%s-%d", (int)getppid(), tag, n);
    return info;
}

#ifdef FULGUR_HAVE_CUDA
/* shared with the children: each rank's id and status */
static unsigned char *g_ids;

static int id_rank(int rank, int n, void *arg) {
    (void)arg;
    fg_cluster_info info = info_of(rank, n, "id");
    fg_comm_opts o = {.backend = FG_COMM_SHM, .timeout_s = 60};
    fg_comm *c = fg_comm_new(&info, &o);
    if (!c) {
        fprintf(stderr, "  rank %d: %s\n", rank, fg_last_error());
        return 1;
    }
    unsigned char id[FG_NCCL_ID_BYTES];
    fg_status s = fg__nccl_exchange_id(c, id);
    g_ids[rank * (FG_NCCL_ID_BYTES + 1)] = s == FG_OK ? 1 : 2;
    if (s == FG_OK) memcpy(g_ids + rank * (FG_NCCL_ID_BYTES + 1) + 1, id, sizeof id);
    else if (rank == 0) fprintf(stderr, "  rank 0: %s\n", fg_last_error());
    fg_comm_free(c);
    return 0;
}
#endif

TEST(unique_id_exchange_over_shm) {
#ifndef FULGUR_HAVE_CUDA
    SKIP("this build has no CUDA backend (FULGUR_CUDA=OFF or no toolkit)");
#else
    /* whether NCCL makes an id here at all: the only reason to skip */
    if (fg__nccl_load() != FG_OK) SKIP("%s", fg_last_error());
    for (int n = 1; n <= 3; n++) {
        size_t bytes = (size_t)n * (FG_NCCL_ID_BYTES + 1);
        g_ids = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        memset(g_ids, 0, bytes);
        CHECK(fg_test_fork_ranks(n, id_rank, NULL, 120) == 0);
        if (g_ids[0] == 2) {
            munmap(g_ids, bytes);
            SKIP("ncclGetUniqueId failed on this machine (rank 0's message above)");
        }
        static const unsigned char zero[FG_NCCL_ID_BYTES];
        CHECK(g_ids[0] == 1);
        CHECK(memcmp(g_ids + 1, zero, FG_NCCL_ID_BYTES) != 0);
        for (int r = 1; r < n; r++) {
            CHECK(g_ids[r * (FG_NCCL_ID_BYTES + 1)] == 1);
            CHECK(memcmp(g_ids + 1, g_ids + r * (FG_NCCL_ID_BYTES + 1) + 1, FG_NCCL_ID_BYTES) == 0);
        }
        munmap(g_ids, bytes);
    }
#endif
}

TEST(nccl_without_a_gpu_says_why) {
    fg_cluster_info info = info_of(0, 1, "nogpu");
    fg_comm_opts o = {.backend = FG_COMM_NCCL, .timeout_s = 30};
    fg_comm *c = fg_comm_new(&info, &o);
    if (c) {
        fg_comm_free(c);
        SKIP("a GPU answers here: backend nccl opens");
    }
    CHECK(fg_last_status() == FG_EUNSUPPORTED);
    if (fg_gpu_built()) {
        CHECK_CONTAINS(fg_last_error(), "nccl");
        CHECK_CONTAINS(fg_last_error(), "FULGUR_BACKEND=shm");
    }
    fprintf(stderr, "  (%s)\n", fg_last_error());
}

TEST(one_rank_collectives_on_the_gpu) {
    fg_dev *d = fg_dev_open("cuda:0", NULL);
    if (!d) SKIP("%s", fg_last_error());
    fg_cluster_info info = info_of(0, 1, "one");
    fg_comm_opts o = {.backend = FG_COMM_NCCL, .timeout_s = 60};
    fg_comm *c = fg_comm_new(&info, &o);
    CHECK_MSG(c != NULL, "nccl: %s", fg_last_error());
    if (!c) {
        fg_dev_close(d);
        return;
    }
    CHECK(!strcmp(fg_comm_backend_name(c), "nccl"));
    enum { N = 1 << 16 };
    float *h = malloc(N * sizeof *h), *back = malloc(N * sizeof *back);
    for (int i = 0; i < N; i++) h[i] = (float)i;
    float *x = fg_dev_alloc(d, N * sizeof(float), NULL),
          *y = fg_dev_alloc(d, N * sizeof(float), NULL);
    CHECK_OK(fg_dev_copy_h2d(d, x, h, N * sizeof(float)));
    CHECK_OK(fg_comm_allreduce(c, x, y, N, FG_F32, FG_REDUCE_OP_SUM));
    CHECK_OK(fg_dev_copy_d2h(d, back, y, N * sizeof(float)));
    CHECK(memcmp(h, back, N * sizeof(float)) == 0);
    CHECK_OK(fg_comm_broadcast(c, x, y, N, FG_F32, 0));
    CHECK_OK(fg_comm_allgather(c, x, y, N, FG_F32));
    CHECK_OK(fg_dev_copy_d2h(d, back, y, N * sizeof(float)));
    CHECK(memcmp(h, back, N * sizeof(float)) == 0);
    fg_comm_free(c);
    CHECK_OK(fg_dev_free(d, x));
    CHECK_OK(fg_dev_free(d, y));
    free(h);
    free(back);
    fg_dev_close(d);
}
