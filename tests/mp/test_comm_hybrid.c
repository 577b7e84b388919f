/* comm on the hybrid backend with nodes simulated on one machine through the
 * environment (FULGUR_NODE_RANK, FULGUR_LOCAL_WORLD_SIZE, ...; the
 * inter-node level is then shm as well): the correctness matrix on 2 nodes
 * x 2 ranks, 3 x 2 and 2 x 3; float sums equal to the serial sum in the
 * hybrid's order (node by node) and bitwise the same on every rank and run;
 * integer sums bitwise equal to the flat shm backend's; the node layout the
 * accessors report; asynchronous requests; a split (flat) of a hybrid group;
 * the automatic choice and the errors. The same on real hosts (network
 * namespaces and Open MPI): tests/hosts/test_hosts.sh. */
#include <sys/mman.h>

#include "comm_matrix.h"
#include "harness.h"

static int g_nodes, g_per;

/* Exports rank's place in a world of g_nodes x g_per as fulgur's launcher
 * would, and makes the communicator from the environment alone. */
static fg_comm *env_comm(int rank, const char *tag, const char *backend) {
    char b[64];
    int n = g_nodes * g_per;
#define PUT(name, ...)                                                                             \
    do {                                                                                           \
        snprintf(b, sizeof b, __VA_ARGS__);                                                        \
        setenv(name, b, 1);                                                                        \
    } while (0)
    PUT("FULGUR_RANK", "%d", rank);
    PUT("FULGUR_WORLD_SIZE", "%d", n);
    PUT("FULGUR_LOCAL_RANK", "%d", rank % g_per);
    PUT("FULGUR_LOCAL_WORLD_SIZE", "%d", g_per);
    PUT("FULGUR_NODE_RANK", "%d", rank / g_per);
    PUT("FULGUR_NUM_NODES", "%d", g_nodes);
    PUT("FULGUR_JOB_ID", "hy%d-%s-%dx%d", (int)getppid(), tag, g_nodes, g_per);
    PUT("FULGUR_COMM_TIMEOUT_S", "60");
#undef PUT
    setenv("FULGUR_BACKEND", backend, 1);
    fg_comm *c = fg_comm_new(NULL, NULL);
    if (!c) fprintf(stderr, "  rank %d: init: %s\n", rank, fg_last_error());
    return c;
}

static int matrix_rank(int rank, int n, void *arg) {
    (void)arg;
    fg_comm *c = env_comm(rank, "mx", "hybrid");
    if (!c) return 1;
    CHECK(fg_comm_rank(c) == rank && fg_comm_size(c) == n);
    CHECK(!strcmp(fg_comm_backend_name(c), "hybrid"));
    CHECK(fg_comm_node_rank(c) == rank / g_per && fg_comm_num_nodes(c) == g_nodes);
    CHECK(fg_comm_local_rank(c) == rank % g_per && fg_comm_local_size(c) == g_per);
    double t0 = fg_time();
    mx_stats st = mx_run(c, MX_BIG);
    fg_comm_free(c);
    if (rank == 0)
        printf("  %d nodes x %d: %ld calls, %ld wrong elements, %ld errors (%.2f s)\n", g_nodes,
               g_per, st.calls, st.wrong, st.errors, fg_time() - t0);
    return st.wrong || st.errors;
}

static void matrix(int nodes, int per) {
    g_nodes = nodes;
    g_per = per;
    CHECK(fg_test_fork_ranks(nodes * per, matrix_rank, NULL, 300) == 0);
}

TEST(matrix_hybrid_2_nodes_x_2) { matrix(2, 2); }
TEST(matrix_hybrid_3_nodes_x_2) { matrix(3, 2); }
TEST(matrix_hybrid_2_nodes_x_3) { matrix(2, 3); }

/* ------------------------------------------------------ reduction order */

/* Random floats whose sum depends on the order of additions. Each rank
 * writes what it got into shared memory; the parent compares. */
#define NF 300007     /* above the scatter threshold, not a multiple of 2 or 3 */
static float *g_out;  /* [rank][NF] results, shared */
static int32_t *g_io; /* [rank][NF] integer results of hybrid, then of shm */

static float rank_value(int r, int64_t i) {
    uint32_t x = (uint32_t)(i * 2654435761u) ^ (uint32_t)(r * 40503u + 17u);
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    return (float)(x & 0xffffff) / 16777216.0f - 0.5f;
}

static int order_rank(int rank, int n, void *arg) {
    (void)arg;
    fg_comm *c = env_comm(rank, "ord", "hybrid");
    if (!c) return 1;
    float *buf = malloc(sizeof(float) * NF);
    int32_t *ib = malloc(sizeof(int32_t) * NF);
    for (int64_t i = 0; i < NF; i++) {
        buf[i] = rank_value(rank, i);
        ib[i] = (int32_t)(rank_value(rank, i) * 1e6f);
    }
    CHECK_OK(fg_comm_allreduce(c, buf, buf, NF, FG_F32, FG_REDUCE_OP_SUM));
    CHECK_OK(fg_comm_allreduce(c, ib, ib, NF, FG_I32, FG_REDUCE_OP_SUM));
    memcpy(g_out + (size_t)rank * NF, buf, sizeof(float) * NF);
    memcpy(g_io + (size_t)rank * NF, ib, sizeof(int32_t) * NF);
    fg_comm_free(c);
    (void)n;
    free(buf);
    free(ib);
    return 0;
}

static int flat_rank(int rank, int n, void *arg) {
    (void)arg;
    fg_cluster_info info = {.rank = rank,
                            .world_size = n,
                            .local_rank = rank,
                            .local_world_size = n,
                            .num_nodes = 1,
                            .source = "test"};
    snprintf(info.job_id, sizeof info.job_id, "hyflat%d", (int)getppid());
    fg_comm *c = fg_comm_new(&info, &(fg_comm_opts){.backend = FG_COMM_SHM, .timeout_s = 60});
    if (!c) return 1;
    int32_t *ib = malloc(sizeof(int32_t) * NF);
    for (int64_t i = 0; i < NF; i++) ib[i] = (int32_t)(rank_value(rank, i) * 1e6f);
    CHECK_OK(fg_comm_allreduce(c, ib, ib, NF, FG_I32, FG_REDUCE_OP_SUM));
    int64_t diff = 0;
    for (int64_t i = 0; i < NF; i++) diff += ib[i] != g_io[(size_t)rank * NF + i];
    CHECK_MSG(diff == 0, "rank %d: %lld integer sums differ from the flat shm backend's", rank,
              (long long)diff);
    free(ib);
    fg_comm_free(c);
    return 0;
}

TEST(float_sums_follow_the_node_order_and_integers_equal_flat) {
    g_nodes = 2;
    g_per = 2;
    int n = 4;
    g_out = mmap(NULL, sizeof(float) * NF * n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                 -1, 0);
    g_io = mmap(NULL, sizeof(int32_t) * NF * n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                -1, 0);
    CHECK(g_out != MAP_FAILED && g_io != MAP_FAILED);
    CHECK(fg_test_fork_ranks(n, order_rank, NULL, 120) == 0);
    int64_t wrong = 0, differ = 0, reassoc = 0;
    for (int64_t i = 0; i < NF; i++) {
        float want = (rank_value(0, i) + rank_value(1, i)) + (rank_value(2, i) + rank_value(3, i));
        float flat = ((rank_value(0, i) + rank_value(1, i)) + rank_value(2, i)) + rank_value(3, i);
        wrong += memcmp(&g_out[i], &want, sizeof want) != 0;
        reassoc += memcmp(&flat, &want, sizeof want) != 0;
        for (int r = 1; r < n; r++) differ += memcmp(&g_out[i], &g_out[(size_t)r * NF + i], 4) != 0;
    }
    CHECK_MSG(wrong == 0, "%lld sums differ from (x0 + x1) + (x2 + x3)", (long long)wrong);
    CHECK_MSG(differ == 0, "%lld results differ between ranks", (long long)differ);
    printf("  %lld of %d float sums differ from the flat rank-order sum (reassociation)\n",
           (long long)reassoc, NF);
    CHECK(fg_test_fork_ranks(n, flat_rank, NULL, 120) == 0);
    munmap(g_out, sizeof(float) * NF * n);
    munmap(g_io, sizeof(int32_t) * NF * n);
}

/* ---------------------------------------------------------- pipeline */

/* The sum of element i the hybrid way: each node's ranks in rank order,
 * then the nodes in node order. */
static float hybrid_sum(int64_t i, int64_t off) {
    float total = 0;
    for (int k = 0; k < g_nodes; k++) {
        float node = rank_value(k * g_per, i + off);
        for (int l = 1; l < g_per; l++) node += rank_value(k * g_per + l, i + off);
        total = k ? total + node : node;
    }
    return total;
}

/* A communicator whose allreduce takes the scatter path at every size,
 * pipelined in chunks of chunk_bytes or a thousandth of the buffer (0: not
 * pipelined). */
static fg_comm *chunk_comm(int rank, const char *tag, const char *chunk_bytes) {
    setenv("FULGUR_HYBRID_SCATTER_BYTES", "0", 1);
    setenv("FULGUR_HYBRID_CHUNK_BYTES", chunk_bytes, 1);
    setenv("FULGUR_HYBRID_CHUNKS", "1000", 1);
    fg_comm *c = env_comm(rank, tag, "hybrid");
    unsetenv("FULGUR_HYBRID_SCATTER_BYTES");
    unsetenv("FULGUR_HYBRID_CHUNK_BYTES");
    unsetenv("FULGUR_HYBRID_CHUNKS");
    return c;
}

/* Sizes around the chunks (100 bytes: 4 to 6 f32 of each block) and the
 * blocks: 1 element, fewer than the ranks, not divisible by chunks x ranks. */
static const int64_t pipe_sizes[] = {1, 2, 3, 5, 13, 47, 48, 49, 97, 1000, 10007, 65537};

static int pipe_rank(int rank, int n, void *arg) {
    (void)arg;
    (void)n;
    fg_comm *cp = chunk_comm(rank, "pp", "100"), *c0 = chunk_comm(rank, "p0", "0");
    if (!cp || !c0) return 1;
    enum { MAXN = 65537 };
    float *x = malloc(sizeof(float) * MAXN), *y = malloc(sizeof(float) * MAXN);
    uint16_t *h = malloc(2 * MAXN), *k = malloc(2 * MAXN);
    int32_t *q = malloc(sizeof(int32_t) * MAXN);
    int64_t wrong = 0, differ = 0;
    for (size_t si = 0; si < sizeof pipe_sizes / sizeof *pipe_sizes; si++) {
        int64_t m = pipe_sizes[si];
        /* f32 sum: the hybrid order exactly, and the same bits unpipelined */
        for (int64_t i = 0; i < m; i++) x[i] = y[i] = rank_value(rank, i);
        CHECK_OK(fg_comm_allreduce(cp, x, x, m, FG_F32, FG_REDUCE_OP_SUM));
        CHECK_OK(fg_comm_allreduce(c0, y, y, m, FG_F32, FG_REDUCE_OP_SUM));
        for (int64_t i = 0; i < m; i++) {
            float want = hybrid_sum(i, 0);
            wrong += memcmp(&x[i], &want, 4) != 0;
            differ += memcmp(&x[i], &y[i], 4) != 0;
        }
        /* bf16 and f16 (halves on the wire between nodes) and avg */
        for (int dt = 0; dt < 2; dt++) {
            fg_dtype hd = dt ? FG_F16 : FG_BF16;
            fg_reduce_op op = dt ? FG_REDUCE_OP_AVG : FG_REDUCE_OP_SUM;
            for (int64_t i = 0; i < m; i++) x[i] = rank_value(rank, i) * 3.0f;
            CHECK_OK(fg_convert(h, hd, x, FG_F32, m));
            memcpy(k, h, 2 * (size_t)m);
            CHECK_OK(fg_comm_allreduce(cp, h, h, m, hd, op));
            CHECK_OK(fg_comm_allreduce(c0, k, k, m, hd, op));
            differ += m - (memcmp(h, k, 2 * (size_t)m) == 0 ? m : 0);
        }
        /* integers: exact */
        for (int64_t i = 0; i < m; i++) q[i] = (int32_t)(i % 1000) * (rank + 1) - rank;
        CHECK_OK(fg_comm_allreduce(cp, q, q, m, FG_I32, FG_REDUCE_OP_SUM));
        int nr = g_nodes * g_per;
        for (int64_t i = 0; i < m; i++)
            wrong += q[i] != (int32_t)(i % 1000) * nr * (nr + 1) / 2 - nr * (nr - 1) / 2;
    }
    CHECK_MSG(wrong == 0, "rank %d (%d x %d): %lld elements differ from the hybrid-order sum", rank,
              g_nodes, g_per, (long long)wrong);
    CHECK_MSG(differ == 0, "rank %d (%d x %d): %lld elements differ from the unpipelined path",
              rank, g_nodes, g_per, (long long)differ);
    free(x);
    free(y);
    free(h);
    free(k);
    free(q);
    fg_comm_free(cp);
    fg_comm_free(c0);
    return 0;
}

TEST(pipelined_allreduce_at_chunk_boundaries_equals_the_unpipelined_bits) {
    static const int layouts[][2] = {{2, 2}, {2, 3}, {3, 2}};
    for (int i = 0; i < 3; i++) {
        g_nodes = layouts[i][0];
        g_per = layouts[i][1];
        CHECK(fg_test_fork_ranks(g_nodes * g_per, pipe_rank, NULL, 300) == 0);
    }
}

/* reduce_scatter across nodes as an all-to-all and a sum in node order: the
 * hybrid order exactly, at block sizes 1, odd and large. */
static int rs_rank(int rank, int n, void *arg) {
    (void)arg;
    fg_comm *c = env_comm(rank, "rs", "hybrid");
    if (!c) return 1;
    static const int64_t ms[] = {1, 7, 1001, 70001};
    float *send = malloc(sizeof(float) * 70001 * (size_t)n), *out = malloc(sizeof(float) * 70001);
    int64_t wrong = 0;
    for (int mi = 0; mi < 4; mi++) {
        int64_t m = ms[mi];
        for (int64_t i = 0; i < m * n; i++) send[i] = rank_value(rank, i);
        CHECK_OK(fg_comm_reduce_scatter(c, send, out, m, FG_F32, FG_REDUCE_OP_SUM));
        for (int64_t i = 0; i < m; i++) {
            float want = hybrid_sum(i, (int64_t)rank * m);
            wrong += memcmp(&out[i], &want, 4) != 0;
        }
        /* in place: the block of this rank in the send buffer */
        for (int64_t i = 0; i < m * n; i++) send[i] = rank_value(rank, i);
        float *mine = send + (size_t)rank * (size_t)m;
        CHECK_OK(fg_comm_reduce_scatter(c, send, mine, m, FG_F32, FG_REDUCE_OP_SUM));
        wrong += memcmp(mine, out, sizeof(float) * (size_t)m) != 0;
    }
    CHECK_MSG(wrong == 0, "rank %d (%d x %d): %lld elements differ from the hybrid-order sum", rank,
              g_nodes, g_per, (long long)wrong);
    free(send);
    free(out);
    fg_comm_free(c);
    return 0;
}

TEST(reduce_scatter_sums_in_the_hybrid_order) {
    static const int layouts[][2] = {{2, 2}, {2, 3}, {3, 2}};
    for (int i = 0; i < 3; i++) {
        g_nodes = layouts[i][0];
        g_per = layouts[i][1];
        CHECK(fg_test_fork_ranks(g_nodes * g_per, rs_rank, NULL, 300) == 0);
    }
}

/* ---------------------------------------------------- async and split */

static int async_split_rank(int rank, int n, void *arg) {
    (void)arg;
    fg_comm *c = env_comm(rank, "as", "hybrid");
    if (!c) return 1;
    enum { M = 200003 };
    int64_t *a = malloc(sizeof(int64_t) * M), *b = malloc(sizeof(int64_t) * M);
    for (int64_t i = 0; i < M; i++) a[i] = b[i] = rank * 1000 + i;
    fg_comm_req *r1, *r2;
    CHECK_OK(fg_comm_iallreduce(c, a, a, M, FG_I64, FG_REDUCE_OP_SUM, &r1));
    CHECK_OK(fg_comm_iallreduce(c, b, b, M, FG_I64, FG_REDUCE_OP_MAX, &r2));
    CHECK_OK(fg_comm_wait(r1));
    CHECK_OK(fg_comm_wait(r2));
    int64_t bad = 0;
    for (int64_t i = 0; i < M; i++) {
        bad += a[i] != (int64_t)n * i + 1000 * (int64_t)n * (n - 1) / 2;
        bad += b[i] != (int64_t)(n - 1) * 1000 + i;
    }
    CHECK_MSG(bad == 0, "rank %d: %lld wrong elements", rank, (long long)bad);
    /* even ranks and odd ranks: one rank per node each, flat inside */
    fg_comm *sub = NULL;
    CHECK_OK(fg_comm_split(c, rank % 2, rank, &sub));
    if (sub) {
        CHECK(fg_comm_size(sub) == n / 2 && fg_comm_rank(sub) == rank / 2);
        CHECK(fg_comm_num_nodes(sub) == g_nodes && fg_comm_local_size(sub) == 1);
        int64_t v = rank, s = 0;
        CHECK_OK(fg_comm_allreduce(sub, &v, &s, 1, FG_I64, FG_REDUCE_OP_SUM));
        CHECK(s == (rank % 2 ? 1 + 3 : 0 + 2));
        fg_comm_free(sub);
    }
    /* broadcast from a root on the second node, not its first rank */
    int64_t x = rank == 3 ? 4242 : -1;
    CHECK_OK(fg_comm_broadcast(c, &x, &x, 1, FG_I64, 3));
    CHECK(x == 4242);
    free(a);
    free(b);
    fg_comm_free(c);
    return 0;
}

TEST(async_requests_split_and_broadcast) {
    g_nodes = 2;
    g_per = 2;
    CHECK(fg_test_fork_ranks(4, async_split_rank, NULL, 120) == 0);
}

/* ------------------------------------------------------ choice, errors */

static int auto_rank(int rank, int n, void *arg) {
    (void)arg;
    (void)n;
    /* without mpirun, auto across nodes is refused with the command to run */
    fg_comm *c = env_comm(rank, "auto", "auto");
    CHECK(c == NULL);
    CHECK(fg_last_status() == FG_EUNSUPPORTED);
    CHECK_CONTAINS(fg_last_error(), "fulgur run --hosts HOST0:2,HOST1:2 -- ");
    fg_comm_free(c);
    return 0;
}

TEST(auto_without_mpirun_names_the_command) {
    g_nodes = 2;
    g_per = 2;
    CHECK(fg_test_fork_ranks(1, auto_rank, NULL, 60) == 0);
}

/* A dead rank on the other node is named, through the level that saw it. */
static int death_rank(int rank, int n, void *arg) {
    (void)arg;
    (void)n;
    setenv("FULGUR_COMM_TIMEOUT_S", "20", 1);
    fg_comm *c = env_comm(rank, "die", "hybrid");
    if (!c) return 1;
    if (rank == 3) _exit(9);
    enum { M = 100000 };
    float *a = calloc(M, sizeof(float));
    fg_status s = fg_comm_allreduce(c, a, a, M, FG_F32, FG_REDUCE_OP_SUM);
    CHECK(s == FG_EPEER);
    CHECK_CONTAINS(fg_last_error(), "died");
    CHECK_CONTAINS(fg_last_error(), "allreduce #1");
    if (rank == 2) CHECK_CONTAINS(fg_last_error(), "inside node 1");
    free(a);
    fg_comm_free(c);
    return 0;
}

TEST(a_dead_rank_is_named) {
    g_nodes = 2;
    g_per = 2;
    /* rank 3 exits on purpose: only the three others report */
    int rc = fg_test_fork_ranks(4, death_rank, NULL, 120);
    CHECK(rc == 1); /* rank 3's exit code; the others passed */
}
