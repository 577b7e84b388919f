/* comm, single process: the environment contract (fulgur, torchrun, Open MPI,
 * SLURM, priority, validation naming the bad variable), backend choice, bad
 * arguments, a world of one, and the reduction kernels against scalar
 * references (f16/bf16 rounding bit-exact with the core conversions). */
#include "comm/comm_impl.h"
#include "fulgur/gpu.h"
#include "harness.h"

static const char *const k_vars[] = {"FULGUR_RANK",
                                     "FULGUR_WORLD_SIZE",
                                     "FULGUR_LOCAL_RANK",
                                     "FULGUR_LOCAL_WORLD_SIZE",
                                     "FULGUR_NODE_RANK",
                                     "FULGUR_NUM_NODES",
                                     "FULGUR_MASTER_ADDR",
                                     "FULGUR_MASTER_PORT",
                                     "FULGUR_JOB_ID",
                                     "FULGUR_BACKEND",
                                     "RANK",
                                     "WORLD_SIZE",
                                     "LOCAL_RANK",
                                     "LOCAL_WORLD_SIZE",
                                     "GROUP_RANK",
                                     "NODE_RANK",
                                     "GROUP_WORLD_SIZE",
                                     "MASTER_ADDR",
                                     "MASTER_PORT",
                                     "TORCHELASTIC_RUN_ID",
                                     "OMPI_COMM_WORLD_RANK",
                                     "OMPI_COMM_WORLD_SIZE",
                                     "OMPI_COMM_WORLD_LOCAL_RANK",
                                     "OMPI_COMM_WORLD_LOCAL_SIZE",
                                     "OMPI_COMM_WORLD_NODE_RANK",
                                     "OMPI_MCA_ess_base_jobid",
                                     "PMIX_NAMESPACE",
                                     "SLURM_PROCID",
                                     "SLURM_NTASKS",
                                     "SLURM_LOCALID",
                                     "SLURM_NODEID",
                                     "SLURM_NNODES",
                                     "SLURM_JOB_ID",
                                     "SLURM_TASKS_PER_NODE",
                                     "FULGUR_COMM_TIMEOUT_S",
                                     "FULGUR_COMM_CHECK"};

static void clear_env(void) {
    for (size_t i = 0; i < sizeof k_vars / sizeof k_vars[0]; i++) unsetenv(k_vars[i]);
}

TEST(nothing_set_is_a_world_of_one) {
    clear_env();
    fg_cluster_info ci;
    CHECK_OK(fg_cluster_detect(&ci));
    CHECK(ci.rank == 0 && ci.world_size == 1 && ci.local_rank == 0 && ci.local_world_size == 1);
    CHECK(ci.node_rank == 0 && ci.num_nodes == 1 && !strcmp(ci.source, "none"));
    CHECK(ci.master_addr[0] == 0 && ci.master_port == 0 && ci.job_id[0] == 0);
}

TEST(fulgur_variables) {
    clear_env();
    setenv("FULGUR_RANK", "5", 1);
    setenv("FULGUR_WORLD_SIZE", "8", 1);
    setenv("FULGUR_LOCAL_RANK", "1", 1);
    setenv("FULGUR_LOCAL_WORLD_SIZE", "4", 1);
    setenv("FULGUR_NODE_RANK", "1", 1);
    setenv("FULGUR_NUM_NODES", "2", 1);
    setenv("FULGUR_MASTER_ADDR", "node0", 1);
    setenv("FULGUR_MASTER_PORT", "29500", 1);
    setenv("FULGUR_JOB_ID", "job7", 1);
    /* lower-priority sources are ignored */
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    fg_cluster_info ci;
    CHECK_OK(fg_cluster_detect(&ci));
    CHECK(ci.rank == 5 && ci.world_size == 8 && ci.local_rank == 1 && ci.local_world_size == 4);
    CHECK(ci.node_rank == 1 && ci.num_nodes == 2 && ci.master_port == 29500);
    CHECK(!strcmp(ci.master_addr, "node0") && !strcmp(ci.job_id, "job7"));
    CHECK(!strcmp(ci.source, "fulgur"));
    clear_env();
}

TEST(torchrun_variables) {
    clear_env();
    setenv("RANK", "3", 1);
    setenv("WORLD_SIZE", "4", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    setenv("GROUP_RANK", "1", 1);
    setenv("MASTER_ADDR", "10.0.0.1", 1);
    setenv("MASTER_PORT", "1234", 1);
    setenv("TORCHELASTIC_RUN_ID", "abc", 1);
    fg_cluster_info ci;
    CHECK_OK(fg_cluster_detect(&ci));
    CHECK(ci.rank == 3 && ci.world_size == 4 && ci.local_rank == 1 && ci.local_world_size == 2);
    CHECK(ci.node_rank == 1 && ci.num_nodes == 2 && ci.master_port == 1234);
    CHECK(!strcmp(ci.job_id, "abc") && !strcmp(ci.source, "torchrun"));
    /* NODE_RANK when GROUP_RANK is absent; FULGUR_JOB_ID overrides the job id */
    unsetenv("GROUP_RANK");
    setenv("NODE_RANK", "1", 1);
    setenv("FULGUR_JOB_ID", "mine", 1);
    CHECK_OK(fg_cluster_detect(&ci));
    CHECK(ci.node_rank == 1 && !strcmp(ci.job_id, "mine"));
    clear_env();
}

TEST(openmpi_variables) {
    clear_env();
    setenv("OMPI_COMM_WORLD_RANK", "6", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "2", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4", 1);
    setenv("OMPI_COMM_WORLD_NODE_RANK", "2", 1); /* Open MPI's per-node rank, not the node */
    setenv("OMPI_MCA_ess_base_jobid", "424242", 1);
    fg_cluster_info ci;
    CHECK_OK(fg_cluster_detect(&ci));
    CHECK(ci.rank == 6 && ci.world_size == 8 && ci.local_rank == 2 && ci.local_world_size == 4);
    CHECK(ci.node_rank == 1 && ci.num_nodes == 2);
    CHECK(!strcmp(ci.job_id, "424242") && !strcmp(ci.source, "openmpi"));
    clear_env();
}

TEST(slurm_variables) {
    clear_env();
    setenv("SLURM_PROCID", "3", 1);
    setenv("SLURM_NTASKS", "4", 1);
    setenv("SLURM_LOCALID", "1", 1);
    setenv("SLURM_NODEID", "1", 1);
    setenv("SLURM_NNODES", "2", 1);
    setenv("SLURM_JOB_ID", "991", 1);
    setenv("SLURM_TASKS_PER_NODE", "2(x2)", 1);
    fg_cluster_info ci;
    CHECK_OK(fg_cluster_detect(&ci));
    CHECK(ci.rank == 3 && ci.world_size == 4 && ci.local_rank == 1 && ci.local_world_size == 2);
    /* nodes of different sizes: fulgur numbers a node's ranks consecutively in
     * equal blocks, so "3,2" is refused (tests/comm/test_cluster_env.c has the rest) */
    setenv("SLURM_TASKS_PER_NODE", "3,2", 1);
    setenv("SLURM_NTASKS", "5", 1);
    CHECK_STATUS(fg_cluster_detect(&ci), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "same number of tasks on every node");
    setenv("SLURM_TASKS_PER_NODE", "two", 1);
    CHECK_STATUS(fg_cluster_detect(&ci), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "SLURM_TASKS_PER_NODE");
    clear_env();
}

TEST(bad_variables_are_named) {
    fg_cluster_info ci;
    clear_env();
    setenv("FULGUR_RANK", "x1", 1);
    setenv("FULGUR_WORLD_SIZE", "2", 1);
    CHECK_STATUS(fg_cluster_detect(&ci), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "FULGUR_RANK=\"x1\"");
    setenv("FULGUR_RANK", "2", 1);
    CHECK_STATUS(fg_cluster_detect(&ci), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "FULGUR_RANK=2");
    CHECK_CONTAINS(fg_last_error(), "FULGUR_WORLD_SIZE=2");
    unsetenv("FULGUR_WORLD_SIZE");
    setenv("FULGUR_RANK", "0", 1);
    CHECK_STATUS(fg_cluster_detect(&ci), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "FULGUR_WORLD_SIZE is not");
    setenv("FULGUR_WORLD_SIZE", "4", 1);
    setenv("FULGUR_LOCAL_RANK", "3", 1);
    setenv("FULGUR_LOCAL_WORLD_SIZE", "2", 1);
    CHECK_STATUS(fg_cluster_detect(&ci), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "FULGUR_LOCAL_RANK=3");
    setenv("FULGUR_LOCAL_RANK", "1", 1);
    setenv("FULGUR_NODE_RANK", "3", 1);
    CHECK_STATUS(fg_cluster_detect(&ci), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "FULGUR_NODE_RANK=3");
    unsetenv("FULGUR_NODE_RANK");
    setenv("FULGUR_MASTER_PORT", "70000", 1);
    CHECK_STATUS(fg_cluster_detect(&ci), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "FULGUR_MASTER_PORT");
    setenv("FULGUR_MASTER_PORT", "-3", 1);
    CHECK_STATUS(fg_cluster_detect(&ci), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "FULGUR_MASTER_PORT=\"-3\"");
    clear_env();
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "0", 1);
    CHECK_STATUS(fg_cluster_detect(&ci), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "WORLD_SIZE=0");
    clear_env();
    fg_cluster_info bad = {.rank = 2, .world_size = 2, .local_world_size = 1, .num_nodes = 1};
    CHECK_STATUS(fg_cluster_validate(&bad), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "rank=2");
}

/* ------------------------------------------------------------- backends */

static fg_cluster_info one(void) {
    fg_cluster_info ci = {.rank = 0, .world_size = 1, .local_world_size = 1, .num_nodes = 1};
    return ci;
}

TEST(backend_choice) {
    clear_env();
    fg_comm *c = fg_comm_new(NULL, NULL);
    CHECK_MSG(c, "fg_comm_new: %s", fg_last_error());
    CHECK(c && !strcmp(fg_comm_backend_name(c), "shm") && fg_comm_size(c) == 1);
    fg_comm_free(c);
    fg_comm_free(NULL);
    setenv("FULGUR_BACKEND", "carrier-pigeon", 1);
    CHECK(fg_comm_new(NULL, NULL) == NULL);
    CHECK(fg_last_status() == FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "FULGUR_BACKEND=\"carrier-pigeon\"");
    setenv("FULGUR_BACKEND", "nccl", 1);
    CHECK(fg_comm_new(NULL, NULL) == NULL);
    CHECK(fg_last_status() == FG_EUNSUPPORTED);
    CHECK_CONTAINS(fg_last_error(), "nccl");
    clear_env();
    fg_cluster_info two_nodes = {
        .rank = 0, .world_size = 2, .local_world_size = 1, .num_nodes = 2, .source = "fulgur"};
    CHECK(fg_comm_new(&two_nodes, NULL) == NULL);
    CHECK(fg_last_status() == FG_EUNSUPPORTED);
    CHECK_CONTAINS(fg_last_error(), "mpirun");
    CHECK_CONTAINS(fg_last_error(), "fulgur run --hosts HOST0:1,HOST1:1 -- ");
    fg_comm_opts shm = {.backend = FG_COMM_SHM};
    CHECK(fg_comm_new(&two_nodes, &shm) == NULL);
    CHECK(fg_last_status() == FG_EUNSUPPORTED);
    CHECK_CONTAINS(fg_last_error(), "one machine");
    setenv("FULGUR_COMM_TIMEOUT_S", "soon", 1);
    fg_cluster_info ci = one();
    CHECK(fg_comm_new(&ci, NULL) == NULL);
    CHECK(fg_last_status() == FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "FULGUR_COMM_TIMEOUT_S");
    clear_env();
    /* nccl comes with the CUDA backend (src/comm/nccl.c) */
    CHECK(fg_comm_backend_built(FG_COMM_SHM) &&
          fg_comm_backend_built(FG_COMM_NCCL) == fg_gpu_built());
    CHECK(fg_comm_backend_built(FG_COMM_HYBRID));
    CHECK(!fg_comm_backend_built(FG_COMM_AUTO) && !fg_comm_backend_built((fg_comm_backend_kind)42));
}

/* -------------------------------------------------------- bad arguments */

TEST(bad_arguments_give_einval_with_a_clear_message) {
    clear_env();
    fg_cluster_info ci = one();
    fg_comm *c = fg_comm_new(&ci, NULL);
    CHECK_MSG(c, "fg_comm_new: %s", fg_last_error());
    if (!c) return;
    float x[8] = {0}, y[8];
    CHECK_STATUS(fg_comm_allreduce(c, x, y, -1, FG_F32, FG_REDUCE_OP_SUM), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "allreduce: count=-1");
    CHECK_STATUS(fg_comm_allreduce(c, x, y, 4, (fg_dtype)99, FG_REDUCE_OP_SUM), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "dtype=99");
    CHECK_STATUS(fg_comm_allreduce(c, x, y, 4, (fg_dtype)-1, FG_REDUCE_OP_SUM), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "dtype=-1");
    CHECK_STATUS(fg_comm_allreduce(c, x, y, 4, FG_F32, (fg_reduce_op)9), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "reduce op=9");
    CHECK_STATUS(fg_comm_allreduce(c, NULL, y, 4, FG_F32, FG_REDUCE_OP_SUM), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "send is NULL with count=4");
    CHECK_STATUS(fg_comm_allreduce(c, x, NULL, 4, FG_F32, FG_REDUCE_OP_SUM), FG_EINVAL);
    CHECK_OK(fg_comm_allreduce(c, NULL, NULL, 0, FG_F32, FG_REDUCE_OP_SUM)); /* nothing to move */
    CHECK_STATUS(fg_comm_broadcast(c, x, y, 4, FG_F32, 1), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "broadcast: root=1: out of range [0, 1)");
    CHECK_STATUS(fg_comm_broadcast(c, x, y, 4, FG_F32, -1), FG_EINVAL);
    CHECK_STATUS(fg_comm_reduce(c, x, y, 4, FG_F32, FG_REDUCE_OP_SUM, 3), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "root=3");
    CHECK_STATUS(fg_comm_send(c, x, 4, FG_F32, 0), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "peer=0 is this rank");
    CHECK_STATUS(fg_comm_recv(c, x, 4, FG_F32, 5), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "peer=5");
    int64_t counts[1] = {3};
    CHECK_STATUS(fg_comm_allgatherv(c, x, 4, y, counts, NULL, FG_F32), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "sendcount=4 but counts[0]=3");
    CHECK_STATUS(fg_comm_allgatherv(c, x, 4, y, NULL, NULL, FG_F32), FG_EINVAL);
    counts[0] = -2;
    CHECK_STATUS(fg_comm_allgatherv(c, x, -2, y, counts, NULL, FG_F32), FG_EINVAL);
    CHECK_STATUS(fg_comm_allgather(c, x, y, INT64_MAX / 2, FG_F64), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "too large");
    CHECK_STATUS(fg_comm_alltoall(c, x, NULL, 1, FG_I32), FG_EINVAL);
    CHECK_STATUS(fg_comm_reduce_scatter(NULL, x, y, 1, FG_F32, FG_REDUCE_OP_SUM), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "communicator is NULL");
    fg_comm_req *req = (fg_comm_req *)1;
    CHECK_STATUS(fg_comm_iallreduce(c, x, y, -5, FG_F32, FG_REDUCE_OP_SUM, &req), FG_EINVAL);
    CHECK(req == NULL);
    CHECK_STATUS(fg_comm_iallreduce(c, x, y, 1, FG_F32, FG_REDUCE_OP_SUM, NULL), FG_EINVAL);
    CHECK_STATUS(fg_comm_split(c, 0, 0, NULL), FG_EINVAL);
    CHECK_OK(fg_comm_wait(NULL));
    /* a bad argument does not break the communicator */
    x[0] = 2;
    CHECK_OK(fg_comm_allreduce(c, x, y, 1, FG_F32, FG_REDUCE_OP_SUM));
    CHECK(y[0] == 2);
    fg_comm_free(c);
}

TEST(world_of_one_moves_data_through_every_operation) {
    clear_env();
    fg_cluster_info ci = one();
    fg_comm_opts o = {.check = 1};
    fg_comm *c = fg_comm_new(&ci, &o);
    CHECK_MSG(c, "fg_comm_new: %s", fg_last_error());
    if (!c) return;
    CHECK(fg_comm_rank(c) == 0 && fg_comm_local_size(c) == 1 && fg_comm_num_nodes(c) == 1);
    int32_t a[5] = {1, -2, 3, 7, -9}, b[5];
    for (int op = 0; op < FG_REDUCE_OP_COUNT; op++) {
        memset(b, 0, sizeof b);
        CHECK_OK(fg_comm_allreduce(c, a, b, 5, FG_I32, (fg_reduce_op)op));
        CHECK(!memcmp(a, b, sizeof a));
    }
    uint16_t h[3] = {fg_f32_to_bf16(1.5f), fg_f32_to_bf16(-3.25f), fg_f32_to_bf16(1e-3f)}, g[3];
    CHECK_OK(fg_comm_allreduce(c, h, g, 3, FG_BF16, FG_REDUCE_OP_AVG));
    CHECK(!memcmp(h, g, sizeof h));
    CHECK_OK(fg_comm_reduce_scatter(c, a, b, 5, FG_I32, FG_REDUCE_OP_SUM));
    CHECK(!memcmp(a, b, sizeof a));
    CHECK_OK(fg_comm_allgather(c, a, b, 5, FG_I32));
    CHECK(!memcmp(a, b, sizeof a));
    CHECK_OK(fg_comm_broadcast(c, a, b, 5, FG_I32, 0));
    CHECK(!memcmp(a, b, sizeof a));
    CHECK_OK(fg_comm_alltoall(c, a, b, 5, FG_I32));
    CHECK(!memcmp(a, b, sizeof a));
    CHECK_OK(fg_comm_barrier(c));
    fg_comm_req *r;
    CHECK_OK(fg_comm_iallreduce(c, a, a, 5, FG_I32, FG_REDUCE_OP_SUM, &r));
    CHECK_OK(fg_comm_wait(r));
    fg_comm *sub;
    CHECK_OK(fg_comm_split(c, 3, 0, &sub));
    CHECK(sub && fg_comm_size(sub) == 1);
    fg_comm_free(sub);
    CHECK_OK(fg_comm_split(c, FG_COMM_SPLIT_NONE, 0, &sub));
    CHECK(sub == NULL);
    fg_comm_free(c);
}

/* --------------------------------------------------------------- kernels */

TEST(kernels_match_scalar_references) {
    enum { N = 1037, S = 5 };
    static float fs[S][N];
    static double ds[S][N];
    static uint16_t bs[S][N], hs[S][N];
    static int32_t is[S][N];
    static int64_t ls[S][N];
    static uint8_t us[S][N];
    fg_rng r = {42, 0};
    for (int q = 0; q < S; q++)
        for (int i = 0; i < N; i++) {
            float v = (fg_rng_uniform(&r) - 0.5f) * 100.0f;
            fs[q][i] = v;
            ds[q][i] = (double)v * 1.000001;
            bs[q][i] = fg_f32_to_bf16(v);
            hs[q][i] = fg_f32_to_f16(v);
            is[q][i] = (int32_t)fg_rng_u32(&r);
            ls[q][i] = (int64_t)fg_rng_u32(&r) << 31 | fg_rng_u32(&r);
            us[q][i] = (uint8_t)fg_rng_u32(&r);
        }
    for (int op = 0; op < FG_REDUCE_OP_COUNT; op++)
        for (int ns = 1; ns <= S; ns++) {
            const void *p[S];
            static float fo[N];
            static double dout[N];
            static uint16_t bo[N], ho[N], bo2[N];
            static int32_t io[N];
            static int64_t lo[N];
            static uint8_t uo[N];
            long wrong = 0;
            for (int q = 0; q < ns; q++) p[q] = fs[q];
            fg__reduce(FG_F32, (fg_reduce_op)op, fo, NULL, p, ns, N, ns);
            for (int q = 0; q < ns; q++) p[q] = ds[q];
            fg__reduce(FG_F64, (fg_reduce_op)op, dout, NULL, p, ns, N, ns);
            for (int q = 0; q < ns; q++) p[q] = bs[q];
            fg__reduce(FG_BF16, (fg_reduce_op)op, bo, bo2, p, ns, N, ns);
            for (int q = 0; q < ns; q++) p[q] = hs[q];
            fg__reduce(FG_F16, (fg_reduce_op)op, ho, NULL, p, ns, N, ns);
            for (int q = 0; q < ns; q++) p[q] = is[q];
            fg__reduce(FG_I32, (fg_reduce_op)op, io, NULL, p, ns, N, ns);
            for (int q = 0; q < ns; q++) p[q] = ls[q];
            fg__reduce(FG_I64, (fg_reduce_op)op, lo, NULL, p, ns, N, ns);
            for (int q = 0; q < ns; q++) p[q] = us[q];
            fg__reduce(FG_U8, (fg_reduce_op)op, uo, NULL, p, ns, N, ns);
            for (int i = 0; i < N; i++) {
                float f = fs[0][i], fb = fg_bf16_to_f32(bs[0][i]), fh = fg_f16_to_f32(hs[0][i]);
                double d = ds[0][i];
                uint32_t iu = (uint32_t)is[0][i];
                int32_t imin = is[0][i], imax = is[0][i];
                uint64_t lu = (uint64_t)ls[0][i];
                int64_t lmin = ls[0][i], lmax = ls[0][i];
                uint32_t uu = us[0][i], umin = uu, umax = uu;
                for (int q = 1; q < ns; q++) {
                    float x = fs[q][i], xb = fg_bf16_to_f32(bs[q][i]), xh = fg_f16_to_f32(hs[q][i]);
                    switch (op) {
                    case FG_REDUCE_OP_SUM:
                    case FG_REDUCE_OP_AVG:
                        f += x, fb += xb, fh += xh, d += ds[q][i];
                        iu += (uint32_t)is[q][i], lu += (uint64_t)ls[q][i], uu += us[q][i];
                        break;
                    case FG_REDUCE_OP_PROD:
                        f *= x, fb *= xb, fh *= xh, d *= ds[q][i];
                        iu *= (uint32_t)is[q][i], lu *= (uint64_t)ls[q][i], uu *= us[q][i];
                        break;
                    case FG_REDUCE_OP_MIN:
                        f = x < f ? x : f, fb = xb < fb ? xb : fb, fh = xh < fh ? xh : fh;
                        d = ds[q][i] < d ? ds[q][i] : d;
                        imin = is[q][i] < imin ? is[q][i] : imin;
                        lmin = ls[q][i] < lmin ? ls[q][i] : lmin;
                        umin = us[q][i] < umin ? us[q][i] : umin;
                        break;
                    default:
                        f = x > f ? x : f, fb = xb > fb ? xb : fb, fh = xh > fh ? xh : fh;
                        d = ds[q][i] > d ? ds[q][i] : d;
                        imax = is[q][i] > imax ? is[q][i] : imax;
                        lmax = ls[q][i] > lmax ? ls[q][i] : lmax;
                        umax = us[q][i] > umax ? us[q][i] : umax;
                        break;
                    }
                }
                int32_t iw = op == FG_REDUCE_OP_MIN   ? imin
                             : op == FG_REDUCE_OP_MAX ? imax
                                                      : (int32_t)iu;
                int64_t lw = op == FG_REDUCE_OP_MIN   ? lmin
                             : op == FG_REDUCE_OP_MAX ? lmax
                                                      : (int64_t)lu;
                uint8_t uw = (uint8_t)(op == FG_REDUCE_OP_MIN   ? umin
                                       : op == FG_REDUCE_OP_MAX ? umax
                                                                : uu);
                if (op == FG_REDUCE_OP_AVG) {
                    f /= (float)ns, fb /= (float)ns, fh /= (float)ns, d /= ns;
                    iw /= ns, lw /= ns, uw = (uint8_t)(uw / ns);
                }
                wrong += memcmp(&fo[i], &f, 4) != 0;
                wrong += memcmp(&dout[i], &d, 8) != 0;
                wrong += bo[i] != fg_f32_to_bf16(fb) || bo2[i] != bo[i];
                wrong += ho[i] != fg_f32_to_f16(fh);
                wrong += io[i] != iw || lo[i] != lw || uo[i] != uw;
            }
            CHECK_MSG(wrong == 0, "op %s, %d sources: %ld wrong",
                      fg_reduce_op_name((fg_reduce_op)op), ns, wrong);
        }
}

TEST(half_sums_round_like_core_for_random_bit_patterns) {
    /* f32 sums of random bf16/f16 pairs (subnormals, huge values, halfway
     * cases) rounded by the kernel's vectorised code and by the core */
    enum { N = 1 << 16 };
    static uint16_t a[N], b[N], o[N];
    fg_rng r = {7, 0};
    for (int k = 0; k < 2; k++) {
        fg_dtype dt = k ? FG_F16 : FG_BF16;
        for (int i = 0; i < N; i++) {
            do {
                a[i] = (uint16_t)fg_rng_u32(&r);
                b[i] = (uint16_t)fg_rng_u32(&r);
                if (i % 4 == 1) b[i] = (uint16_t)(a[i] ^ 0x8001); /* near-cancellation */
                if (i % 4 == 2) b[i] &= 0x83ff;                   /* tiny */
            } while (k ? ((a[i] & 0x7c00) == 0x7c00 || (b[i] & 0x7c00) == 0x7c00)
                       : ((a[i] & 0x7f80) == 0x7f80 || (b[i] & 0x7f80) == 0x7f80));
        }
        const void *p[2] = {a, b};
        fg__reduce(dt, FG_REDUCE_OP_SUM, o, NULL, p, 2, N, 2);
        long wrong = 0;
        for (int i = 0; i < N; i++) {
            float x = k ? fg_f16_to_f32(a[i]) + fg_f16_to_f32(b[i])
                        : fg_bf16_to_f32(a[i]) + fg_bf16_to_f32(b[i]);
            uint16_t want = k ? fg_f32_to_f16(x) : fg_f32_to_bf16(x);
            if (o[i] != want && wrong++ < 3)
                fprintf(stderr, "  %s %04x + %04x: got %04x want %04x\n", fg_dtype_name(dt), a[i],
                        b[i], o[i], want);
        }
        CHECK_MSG(wrong == 0, "%s: %ld of %d sums rounded differently", fg_dtype_name(dt), wrong,
                  N);
    }
}
