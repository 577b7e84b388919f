/* comm on the shm backend with forked ranks: the correctness matrix at world
 * sizes 1, 2, 3, 4, 8 (more ranks than cores is on purpose), bitwise
 * determinism of float sums, asynchronous requests, split. */
#include <sys/mman.h>

#include "comm_matrix.h"
#include "harness.h"

static fg_status init_rank(int rank, int n, const char *tag, fg_comm **c) {
    fg_cluster_info info = {.rank = rank,
                            .world_size = n,
                            .local_rank = rank,
                            .local_world_size = n,
                            .node_rank = 0,
                            .num_nodes = 1,
                            .source = "test"};
    snprintf(info.job_id, sizeof info.job_id, "t%d-%s-%d", (int)getppid(), tag, n);
    fg_comm_opts o = {.backend = FG_COMM_SHM, .timeout_s = 60};
    *c = fg_comm_new(&info, &o);
    fg_status s = *c ? FG_OK : fg_last_status();
    if (s) fprintf(stderr, "  rank %d: init: %s\n", rank, fg_last_error());
    return s;
}

static int matrix_rank(int rank, int n, void *arg) {
    (void)arg;
    fg_comm *c;
    if (init_rank(rank, n, "mx", &c)) return 1;
    CHECK(fg_comm_rank(c) == rank && fg_comm_size(c) == n);
    CHECK(!strcmp(fg_comm_backend_name(c), "shm"));
    double t0 = fg_time();
    mx_stats st = mx_run(c, MX_BIG);
    fg_comm_free(c);
    if (rank == 0)
        printf("  world %d: %ld calls, %ld wrong elements, %ld errors (%.2f s)\n", n, st.calls,
               st.wrong, st.errors, fg_time() - t0);
    return st.wrong || st.errors;
}

static void matrix(int n) { CHECK(fg_test_fork_ranks(n, matrix_rank, NULL, 300) == 0); }

TEST(matrix_shm_world_1) { matrix(1); }
TEST(matrix_shm_world_2) { matrix(2); }
TEST(matrix_shm_world_3) { matrix(3); }
TEST(matrix_shm_world_4) { matrix(4); }
TEST(matrix_shm_world_8) { matrix(8); }

/* Tiny chunks: thousands of pipeline steps per call, slots reused all the
 * time, slices a few cache lines wide. */
TEST(matrix_shm_4k_chunks_world_3) {
    setenv("FULGUR_SHM_CHUNK_BYTES", "4096", 1);
    matrix(3);
    unsetenv("FULGUR_SHM_CHUNK_BYTES");
}

/* ------------------------------------------------------------ determinism */

/* Random (non-integer) floats: the sum depends on the order of additions,
 * so equality with a serial sum in rank order 0..N-1 shows the order is
 * fixed; hashes from two separate runs show runs agree bitwise. */
static uint64_t *g_hashes; /* shared with the children: [run][count][rank] */
static int g_run;

static uint64_t fnv(const void *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
    return h;
}

static void rank_data(int r, float *buf, int64_t n) {
    fg_rng_fill_uniform(1234, (uint64_t)r << 32, buf, n);
    for (int64_t i = 0; i < n; i++) buf[i] = (buf[i] - 0.5f) * (float)(1 + (i % 7) * 100);
}

static int determinism_rank(int rank, int n, void *arg) {
    (void)arg;
    fg_comm *c;
    if (init_rank(rank, n, g_run ? "det1" : "det0", &c)) return 1;
    static const int64_t counts[] = {7, 1023, 65536 + 5, 262144 + 3};
    float *x = malloc(MX_BIG * 4), *ref = malloc(MX_BIG * 4), *tmp = malloc(MX_BIG * 4);
    uint16_t *hx = malloc(MX_BIG * 2), *hout = malloc(MX_BIG * 2);
    int fails = 0;
    for (int ci = 0; ci < 4; ci++) {
        int64_t cnt = counts[ci];
        /* f32: serial reference in rank order */
        rank_data(0, ref, cnt);
        for (int r = 1; r < n; r++) {
            rank_data(r, tmp, cnt);
            for (int64_t i = 0; i < cnt; i++) ref[i] += tmp[i];
        }
        rank_data(rank, x, cnt);
        CHECK_OK(fg_comm_allreduce(c, x, x, cnt, FG_F32, FG_REDUCE_OP_SUM));
        int64_t wrong = 0;
        for (int64_t i = 0; i < cnt; i++) wrong += memcmp(&x[i], &ref[i], 4) != 0;
        CHECK_MSG(wrong == 0, "f32 count %lld: %lld elements differ from the rank-order sum",
                  (long long)cnt, (long long)wrong);
        fails += wrong != 0;
        uint64_t h = fnv(x, (size_t)cnt * 4);
        /* bf16: f32 accumulation in rank order, one rounding */
        for (int64_t i = 0; i < cnt; i++) ref[i] = 0;
        for (int r = 0; r < n; r++) {
            rank_data(r, tmp, cnt);
            for (int64_t i = 0; i < cnt; i++) {
                float v = fg_bf16_to_f32(fg_f32_to_bf16(tmp[i]));
                ref[i] = r == 0 ? v : ref[i] + v;
            }
        }
        rank_data(rank, tmp, cnt);
        for (int64_t i = 0; i < cnt; i++) hx[i] = fg_f32_to_bf16(tmp[i]);
        CHECK_OK(fg_comm_allreduce(c, hx, hout, cnt, FG_BF16, FG_REDUCE_OP_SUM));
        wrong = 0;
        for (int64_t i = 0; i < cnt; i++) wrong += hout[i] != fg_f32_to_bf16(ref[i]);
        CHECK_MSG(wrong == 0, "bf16 count %lld: %lld elements differ from the rank-order sum",
                  (long long)cnt, (long long)wrong);
        fails += wrong != 0;
        h ^= fnv(hout, (size_t)cnt * 2) * 31;
        g_hashes[(g_run * 4 + ci) * 8 + rank] = h;
    }
    free(x);
    free(ref);
    free(tmp);
    free(hx);
    free(hout);
    fg_comm_free(c);
    return fails;
}

TEST(allreduce_is_bitwise_deterministic) {
    g_hashes = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(g_hashes != MAP_FAILED);
    static const int worlds[] = {2, 3, 4, 8};
    for (int wi = 0; wi < 4; wi++) {
        int n = worlds[wi];
        memset(g_hashes, 0, 4096);
        for (g_run = 0; g_run < 2; g_run++)
            CHECK(fg_test_fork_ranks(n, determinism_rank, NULL, 120) == 0);
        for (int ci = 0; ci < 4; ci++)
            for (int r = 0; r < n; r++) {
                CHECK_MSG(g_hashes[ci * 8 + r] == g_hashes[ci * 8],
                          "world %d count #%d: rank %d differs from rank 0", n, ci, r);
                CHECK_MSG(g_hashes[(4 + ci) * 8 + r] == g_hashes[ci * 8],
                          "world %d count #%d: run 2 differs from run 1 on rank %d", n, ci, r);
            }
    }
    munmap(g_hashes, 4096);
}

/* ---------------------------------------------------------------- async */

static int async_rank(int rank, int n, void *arg) {
    (void)arg;
    fg_comm *c;
    if (init_rank(rank, n, "async", &c)) return 1;
    enum { K = 6, CNT = 300000 };
    float *buf[K];
    fg_comm_req *req[K];
    for (int k = 0; k < K; k++) {
        buf[k] = malloc(CNT * 4);
        for (int i = 0; i < CNT; i++) buf[k][i] = (float)(rank + k + (i % 5));
        CHECK_OK(fg_comm_iallreduce(c, buf[k], buf[k], CNT, FG_F32, FG_REDUCE_OP_SUM, &req[k]));
    }
    /* compute while the progress thread works */
    volatile double acc = 0;
    for (int i = 0; i < 2000000; i++) acc += i * 1e-9;
    /* a blocking call now runs after the queued ones */
    int32_t one = 1, sum = 0;
    CHECK_OK(fg_comm_allreduce(c, &one, &sum, 1, FG_I32, FG_REDUCE_OP_SUM));
    CHECK(sum == n);
    /* everything issued before the blocking call has completed */
    for (int k = 0; k < K; k++) {
        bool done = false;
        CHECK_OK(fg_comm_test(req[k], &done));
        CHECK(done);
        CHECK_OK(fg_comm_wait(req[k]));
        int64_t wrong = 0;
        for (int i = 0; i < CNT; i++) {
            float want = (float)(n * (n - 1) / 2 + n * (k + (i % 5)));
            wrong += buf[k][i] != want;
        }
        CHECK_MSG(wrong == 0, "request %d: %lld wrong", k, (long long)wrong);
        free(buf[k]);
    }
    /* the other asynchronous forms, completing in issue order */
    int64_t cnt = 1000;
    int32_t *x = malloc(sizeof(int32_t) * (size_t)cnt * (size_t)n);
    int32_t *y = malloc(sizeof(int32_t) * (size_t)cnt * (size_t)n);
    int32_t *z = malloc(sizeof(int32_t) * (size_t)cnt);
    int32_t *bc = malloc(sizeof(int32_t) * (size_t)cnt);
    int32_t *rd = malloc(sizeof(int32_t) * (size_t)cnt);
    for (int64_t i = 0; i < cnt * n; i++) x[i] = (int32_t)(rank * 1000 + i);
    for (int64_t i = 0; i < cnt; i++) bc[i] = rank == 0 ? (int32_t)(7 * i) : -1;
    fg_comm_req *r1, *r2, *r3, *r4, *r5;
    CHECK_OK(fg_comm_ireduce_scatter(c, x, z, cnt, FG_I32, FG_REDUCE_OP_MAX, &r1));
    CHECK_OK(fg_comm_iallgather(c, x, y, cnt, FG_I32, &r2));
    CHECK_OK(fg_comm_ibroadcast(c, bc, bc, cnt, FG_I32, 0, &r3));
    CHECK_OK(fg_comm_ireduce(c, x, rd, cnt, FG_I32, FG_REDUCE_OP_MIN, n - 1, &r4));
    CHECK_OK(fg_comm_ibarrier(c, &r5));
    bool done = false;
    while (!done) CHECK_OK(fg_comm_test(r5, &done));
    fg_comm_req *earlier[4] = {r1, r2, r3, r4};
    for (int k = 0; k < 4; k++) {
        bool d = false;
        CHECK_OK(fg_comm_test(earlier[k], &d));
        CHECK(d); /* issued before r5, which is done */
    }
    CHECK_OK(fg_comm_wait(r1));
    CHECK_OK(fg_comm_wait(r2));
    CHECK_OK(fg_comm_wait(r3));
    CHECK_OK(fg_comm_wait(r4));
    CHECK_OK(fg_comm_wait(r5));
    for (int64_t i = 0; i < cnt; i++) {
        CHECK(z[i] == (int32_t)((n - 1) * 1000 + rank * cnt + i));
        CHECK(bc[i] == 7 * i);
        if (rank == n - 1) CHECK(rd[i] == (int32_t)i);
    }
    for (int q = 0; q < n; q++)
        for (int64_t i = 0; i < cnt; i++) CHECK(y[q * cnt + i] == (int32_t)(q * 1000 + i));
    free(x);
    free(y);
    free(z);
    free(bc);
    free(rd);
    /* freeing with requests pending waits for them */
    float *big = calloc(1 << 20, 4);
    fg_comm_req *pend;
    CHECK_OK(fg_comm_iallreduce(c, big, big, 1 << 20, FG_F32, FG_REDUCE_OP_SUM, &pend));
    CHECK_OK(fg_comm_wait(pend));
    free(big);
    fg_comm_free(c);
    return 0;
}

TEST(async_requests_overlap_and_complete_in_order) {
    CHECK(fg_test_fork_ranks(2, async_rank, NULL, 120) == 0);
    CHECK(fg_test_fork_ranks(3, async_rank, NULL, 120) == 0);
}

/* ---------------------------------------------------------------- split */

static int split_rank(int rank, int n, void *arg) {
    (void)arg;
    fg_comm *c;
    if (init_rank(rank, n, "split", &c)) return 1;
    /* two groups by parity, ordered by descending rank; rank 5 joins none */
    int color = rank == 5 ? FG_COMM_SPLIT_NONE : rank % 2;
    fg_comm *sub = NULL;
    CHECK_OK(fg_comm_split(c, color, -rank, &sub));
    if (rank == 5) {
        CHECK(sub == NULL);
    } else if (sub) {
        int members = 0, above = 0;
        for (int q = 0; q < n; q++)
            if (q != 5 && q % 2 == rank % 2) {
                members++;
                above += q > rank;
            }
        CHECK(fg_comm_size(sub) == members);
        CHECK(fg_comm_rank(sub) == above);
        CHECK(fg_comm_local_size(sub) == members && fg_comm_local_rank(sub) == above);
        CHECK(fg_comm_num_nodes(sub) == 1 && fg_comm_node_rank(sub) == 0);
        int64_t v = rank, s = 0;
        CHECK_OK(fg_comm_allreduce(sub, &v, &s, 1, FG_I64, FG_REDUCE_OP_SUM));
        int64_t want = 0;
        for (int q = 0; q < n; q++)
            if (q != 5 && q % 2 == rank % 2) want += q;
        CHECK(s == want);
        /* the parent still works while the child exists, and a child of a child */
        fg_comm *subsub = NULL;
        CHECK_OK(fg_comm_split(sub, 0, 0, &subsub));
        CHECK(subsub && fg_comm_size(subsub) == members);
        CHECK_OK(fg_comm_barrier(subsub));
        fg_comm_free(subsub);
        fg_comm_free(sub);
    }
    int64_t v = 1, s = 0;
    CHECK_OK(fg_comm_allreduce(c, &v, &s, 1, FG_I64, FG_REDUCE_OP_SUM));
    CHECK(s == n);
    fg_comm_free(c);
    return 0;
}

TEST(split_by_color_and_key) { CHECK(fg_test_fork_ranks(6, split_rank, NULL, 120) == 0); }

/* Rank 0 gathers by point to point, as a consolidated checkpoint does: it
 * receives once from each other rank, which send once each, so rank 0 makes
 * more sends and receives than any other. The next collectives still meet
 * (collectives are numbered apart from point to point), with and without
 * FULGUR_COMM_CHECK's comparison of the calls. */
static int gather_p2p_rank(int rank, int n, void *arg) {
    bool check = arg != NULL;
    if (check) setenv("FULGUR_COMM_CHECK", "1", 1);
    fg_comm *c;
    if (init_rank(rank, n, check ? "p2pc" : "p2p", &c)) return 1;
    for (int round = 0; round < 3; round++) {
        int64_t mine[2] = {rank, 100 * round + rank}, got[2];
        if (rank == 0) {
            for (int q = 1; q < n; q++) {
                CHECK_OK(fg_comm_recv(c, got, 2, FG_I64, q));
                CHECK(got[0] == q && got[1] == 100 * round + q);
            }
        } else {
            CHECK_OK(fg_comm_send(c, mine, 2, FG_I64, 0));
        }
        int64_t s = 0;
        CHECK_OK(fg_comm_allreduce(c, &mine[0], &s, 1, FG_I64, FG_REDUCE_OP_SUM));
        CHECK(s == (int64_t)n * (n - 1) / 2);
        CHECK_OK(fg_comm_broadcast(c, &s, &s, 1, FG_I64, 0));
    }
    fg_comm_free(c);
    return 0;
}

TEST(collectives_after_uneven_point_to_point) {
    CHECK(fg_test_fork_ranks(3, gather_p2p_rank, NULL, 60) == 0);
    CHECK(fg_test_fork_ranks(3, gather_p2p_rank, "check", 60) == 0);
}
