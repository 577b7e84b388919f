/* comm faults on the shm backend: a peer killed with SIGKILL (noticed within
 * 2 s, FG_EPEER naming the rank, the operation and its number), a stalled
 * peer (SIGSTOP: FG_ETIMEOUT naming it), mismatched calls (with and without
 * FULGUR_COMM_CHECK), abort, a peer that left, rendezvous timeouts, and
 * nothing left behind in /dev/shm or as a socket afterwards. Each rank
 * writes what it saw into shared memory; the parent checks it. */
#include <pthread.h>
#include <sys/mman.h>

#include "fulgur/comm.h"
#include "harness.h"

typedef struct {
    int status, done;
    double elapsed;
    char msg[700];
} outcome;

static outcome *g_out; /* shared with the children */
static int g_case;
static int leftovers(void);

__attribute__((constructor)) static void map_outcomes(void) {
    g_out =
        mmap(NULL, sizeof(outcome) * 16, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
}

static void record(int rank, fg_status s, double t0) {
    g_out[rank].status = s;
    g_out[rank].elapsed = fg_time() - t0;
    snprintf(g_out[rank].msg, sizeof g_out[rank].msg, "%s", s ? fg_last_error() : "");
    g_out[rank].done = 1;
}

static fg_status join(int rank, int n, double timeout, int check, fg_comm **c) {
    fg_cluster_info info = {.rank = rank,
                            .world_size = n,
                            .local_rank = rank,
                            .local_world_size = n,
                            .num_nodes = 1,
                            .source = "test"};
    snprintf(info.job_id, sizeof info.job_id, "f%d-%d", (int)getppid(), g_case);
    fg_comm_opts o = {.backend = FG_COMM_SHM, .timeout_s = timeout, .check = check};
    *c = fg_comm_new(&info, &o);
    return *c ? FG_OK : fg_last_status();
}

/* Forks n ranks running fn; waits up to `limit` s, then kills what is left
 * (stopped ones too). Returns how many ranks died by a signal. */
static int run_group(int n, void (*fn)(int rank, int n), double limit) {
    memset(g_out, 0, sizeof(outcome) * 16);
    g_case++;
    pid_t pids[16];
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < n; r++)
        if ((pids[r] = fork()) == 0) {
            fn(r, n);
            _exit(0);
        }
    int signaled = 0, left = n, stopped = 0;
    double t0 = fg_time();
    int done[16] = {0};
    while (left > 0) {
        for (int r = 0; r < n; r++) {
            int st;
            if (!done[r] && waitpid(pids[r], &st, WNOHANG | WUNTRACED) == pids[r]) {
                if (WIFSTOPPED(st)) {
                    stopped++;
                    continue;
                }
                done[r] = 1;
                left--;
                signaled += WIFSIGNALED(st);
            }
        }
        /* once only stopped ranks are left, they will never finish */
        if (left && (fg_time() - t0 > limit || left == stopped)) {
            for (int r = 0; r < n; r++)
                if (!done[r]) {
                    kill(pids[r], SIGKILL);
                    kill(pids[r], SIGCONT);
                    waitpid(pids[r], NULL, 0);
                    done[r] = 1;
                    left--;
                    signaled++;
                }
        }
        usleep(1000);
    }
    return signaled;
}

/* ---------------------------------------------------------------- killed */

static void killed_fn(int rank, int n) {
    fg_comm *c;
    if (join(rank, n, 60, 0, &c)) return;
    float x[100] = {0};
    for (int i = 0; i < 3; i++) CHECK_OK(fg_comm_allreduce(c, x, x, 100, FG_F32, FG_REDUCE_OP_SUM));
    if (rank == 1) {
        usleep(100000); /* the others are waiting (asleep) by now */
        raise(SIGKILL);
    }
    double t0 = fg_time();
    fg_status s = fg_comm_allreduce(c, x, x, 100, FG_F32, FG_REDUCE_OP_SUM);
    record(rank, s, t0);
    /* the communicator stays broken, fast */
    t0 = fg_time();
    s = fg_comm_barrier(c);
    g_out[rank + 8].status = s;
    g_out[rank + 8].elapsed = fg_time() - t0;
    fg_comm_free(c);
}

TEST(killed_peer_is_noticed_within_2_s) {
    CHECK(run_group(3, killed_fn, 30) == 1);
    for (int r = 0; r < 3; r += 2) {
        CHECK(g_out[r].done);
        CHECK(g_out[r].status == FG_EPEER);
        CHECK_MSG(g_out[r].elapsed < 2.0, "rank %d noticed after %.2f s", r, g_out[r].elapsed);
        CHECK_CONTAINS(g_out[r].msg, "allreduce #4");
        CHECK_CONTAINS(g_out[r].msg, "rank 1 (pid");
        CHECK_CONTAINS(g_out[r].msg, "died");
        CHECK(g_out[r + 8].status == FG_EPEER && g_out[r + 8].elapsed < 0.1);
        printf("  rank %d: %.3f s: %s\n", r, g_out[r].elapsed, g_out[r].msg);
    }
    CHECK(leftovers() == 0);
}

/* killed in the middle of a large asynchronous allreduce */
static void killed_midway_fn(int rank, int n) {
    fg_comm *c;
    if (join(rank, n, 60, 0, &c)) return;
    int64_t cnt = 32 << 20;
    float *x = calloc((size_t)cnt, 4);
    fg_comm_req *req = NULL;
    double t0 = fg_time();
    fg_status s = fg_comm_iallreduce(c, x, x, cnt, FG_F32, FG_REDUCE_OP_SUM, &req);
    if (rank == 1) {
        usleep(20000);
        raise(SIGKILL);
    }
    if (!s) s = fg_comm_wait(req);
    record(rank, s, t0);
    fg_comm_free(c);
    free(x);
}

TEST(peer_killed_midway_through_a_large_async_allreduce) {
    CHECK(run_group(2, killed_midway_fn, 30) == 1);
    CHECK(g_out[0].status == FG_EPEER);
    CHECK_CONTAINS(g_out[0].msg, "allreduce #1: rank 1 (pid");
    CHECK(g_out[0].elapsed < 2.5);
}

/* --------------------------------------------------------------- stalled */

static void stalled_fn(int rank, int n) {
    fg_comm *c;
    if (join(rank, n, 1.0, 0, &c)) return;
    int32_t v = 1;
    CHECK_OK(fg_comm_allreduce(c, &v, &v, 1, FG_I32, FG_REDUCE_OP_SUM));
    if (rank == 1) raise(SIGSTOP);
    double t0 = fg_time();
    fg_status s = fg_comm_allreduce(c, &v, &v, 1, FG_I32, FG_REDUCE_OP_SUM);
    record(rank, s, t0);
    fg_comm_free(c);
}

TEST(stalled_peer_times_out_naming_it) {
    CHECK(run_group(2, stalled_fn, 10) == 1);
    CHECK(g_out[0].status == FG_ETIMEOUT);
    CHECK_CONTAINS(g_out[0].msg, "allreduce #2");
    CHECK_CONTAINS(g_out[0].msg, "rank 1 (pid");
    CHECK_CONTAINS(g_out[0].msg, "stopped");
    CHECK(g_out[0].elapsed >= 1.0 && g_out[0].elapsed < 5.0);
    printf("  %s\n", g_out[0].msg);
}

/* -------------------------------------------------------------- mismatch */

static int g_mode;

static void mismatch_fn(int rank, int n) {
    fg_comm *c;
    if (join(rank, n, 10, g_mode < 10, &c)) return;
    float x[16] = {0};
    fg_status s;
    double t0 = fg_time();
    switch (g_mode % 10) {
    case 0: /* rank 1 broadcasts while the others reduce */
        s = rank == 1 ? fg_comm_broadcast(c, x, x, 10, FG_F32, 0)
                      : fg_comm_allreduce(c, x, x, 10, FG_F32, FG_REDUCE_OP_SUM);
        break;
    case 1: /* rank 2 passes another count */
        s = fg_comm_allreduce(c, x, x, rank == 2 ? 11 : 10, FG_F32, FG_REDUCE_OP_SUM);
        break;
    case 2: /* rank 0 passes another dtype */
        s = fg_comm_allreduce(c, x, x, 4, rank == 0 ? FG_I32 : FG_F32, FG_REDUCE_OP_SUM);
        break;
    default: /* rank 1 waits at a barrier */
        s = rank == 1 ? fg_comm_barrier(c)
                      : fg_comm_allreduce(c, x, x, 10, FG_F32, FG_REDUCE_OP_SUM);
        break;
    }
    record(rank, s, t0);
    fg_comm_free(c);
}

static void expect_mismatch(int n, int mode, const char *odd) {
    g_mode = mode;
    CHECK(run_group(n, mismatch_fn, 20) == 0);
    for (int r = 0; r < n; r++) {
        CHECK(g_out[r].done);
        CHECK_MSG(g_out[r].status == FG_EMISMATCH, "mode %d rank %d: %s: %s", mode, r,
                  fg_status_str(g_out[r].status), g_out[r].msg);
        CHECK_CONTAINS(g_out[r].msg, odd);
    }
    printf("  %s\n", g_out[0].msg);
}

TEST(mismatched_calls_name_the_odd_rank_with_check) {
    expect_mismatch(3, 0,
                    "rank 1 called broadcast #1 (count 10, f32, root 0) but the other ranks "
                    "called allreduce #1 (count 10, f32, sum)");
    expect_mismatch(3, 1, "rank 2 called allreduce #1 (count 11");
    expect_mismatch(3, 2, "rank 0 called allreduce #1 (count 4, i32");
    CHECK_CONTAINS(g_out[1].msg, "FULGUR_COMM_CHECK");
}

TEST(mismatched_calls_are_caught_without_check) {
    expect_mismatch(2, 12, "rank 1");
    expect_mismatch(2, 12, "i32");
    expect_mismatch(3, 10, "broadcast");
    expect_mismatch(2, 13, "barrier");
}

/* ----------------------------------------------------------- abort, left */

static void abort_fn(int rank, int n) {
    fg_comm *c;
    if (join(rank, n, 30, 0, &c)) return;
    float x[4] = {0};
    CHECK_OK(fg_comm_allreduce(c, x, x, 4, FG_F32, FG_REDUCE_OP_SUM));
    double t0 = fg_time();
    fg_status s;
    if (rank == 2) {
        usleep(50000);
        fg_comm_abort(c);
        s = fg_comm_allreduce(c, x, x, 4, FG_F32, FG_REDUCE_OP_SUM);
    } else if (rank == 1) {
        fg_comm_free(c); /* leaves while the others wait */
        record(rank, FG_OK, t0);
        return;
    } else {
        s = fg_comm_allreduce(c, x, x, 4, FG_F32, FG_REDUCE_OP_SUM);
    }
    record(rank, s, t0);
    fg_comm_free(c);
}

TEST(abort_and_a_peer_that_left_fail_the_others) {
    CHECK(run_group(3, abort_fn, 20) == 0);
    CHECK(g_out[0].status == FG_EPEER && g_out[2].status == FG_EPEER);
    /* rank 0 learns of rank 1 leaving or of rank 2's abort, whichever it sees first */
    bool named = strstr(g_out[0].msg, "rank 1") || strstr(g_out[0].msg, "rank 2");
    CHECK_MSG(named, "%s", g_out[0].msg);
    CHECK(g_out[0].elapsed < 2.0);
    printf("  rank 0: %s\n  rank 2: %s\n", g_out[0].msg, g_out[2].msg);
}

/* A launcher's watchdog thread aborts while this rank is blocked. */
static void *watchdog(void *arg) {
    usleep(100000);
    fg_comm_abort(arg);
    return NULL;
}

static void watchdog_fn(int rank, int n) {
    fg_comm *c;
    if (join(rank, n, 30, 0, &c)) return;
    float x[4] = {0};
    double t0 = fg_time();
    fg_status s;
    if (rank == 0) {
        pthread_t t;
        pthread_create(&t, NULL, watchdog, c);
        s = fg_comm_allreduce(c, x, x, 4, FG_F32, FG_REDUCE_OP_SUM); /* rank 1 is not there yet */
        pthread_join(t, NULL);
    } else {
        usleep(600000);
        s = fg_comm_allreduce(c, x, x, 4, FG_F32, FG_REDUCE_OP_SUM);
    }
    record(rank, s, t0);
    fg_comm_free(c);
}

TEST(abort_from_another_thread_unblocks_a_waiting_call) {
    CHECK(run_group(2, watchdog_fn, 20) == 0);
    CHECK(g_out[0].status == FG_EPEER && g_out[1].status == FG_EPEER);
    CHECK(g_out[0].elapsed < 0.5);
    CHECK_CONTAINS(g_out[0].msg, "rank 0 aborted the group (fg_comm_abort)");
    CHECK_CONTAINS(g_out[1].msg, "rank 0 aborted the group");
    printf("  rank 0 after %.3f s: %s\n  rank 1: %s\n", g_out[0].elapsed, g_out[0].msg,
           g_out[1].msg);
}

/* ------------------------------------------------------------ rendezvous */

static void alone_fn(int rank, int n) {
    (void)n;
    fg_comm *c = NULL;
    double t0 = fg_time();
    fg_status s = join(g_mode, 3, 1.0, 0, &c); /* only one of 3 ranks starts */
    record(rank, s, t0);
    fg_comm_free(c);
}

TEST(missing_ranks_time_out_at_rendezvous) {
    g_mode = 0;
    CHECK(run_group(1, alone_fn, 10) == 0);
    CHECK(g_out[0].status == FG_ETIMEOUT);
    CHECK_CONTAINS(g_out[0].msg, "rank(s) 1, 2");
    printf("  %s\n", g_out[0].msg);
    g_mode = 2;
    CHECK(run_group(1, alone_fn, 10) == 0);
    CHECK(g_out[0].status == FG_ETIMEOUT);
    CHECK_CONTAINS(g_out[0].msg, "rank 2 could not reach rank 0");
    printf("  %s\n", g_out[0].msg);
}

/* Nothing of this test's jobs in /dev/shm or among the unix sockets. */
static int leftovers(void) {
    int found = 0;
    char mine[64];
    snprintf(mine, sizeof mine, "-f%d-", (int)getpid());
    FILE *p = popen("ls /dev/shm 2>/dev/null; cat /proc/net/unix 2>/dev/null", "r");
    char line[512];
    while (p && fgets(line, sizeof line, p))
        if (strstr(line, mine) || (strstr(line, "fulgur") && !strchr(line, ':'))) {
            fprintf(stderr, "  left behind: %s", line);
            found++;
        }
    if (p) pclose(p);
    return found;
}

TEST(nothing_is_left_behind_after_crashes) {
    /* rank 0 killed while it waits for its peers at the rendezvous */
    pid_t pid = fork();
    if (pid == 0) {
        g_case = 99;
        fg_comm *c;
        _exit(join(0, 2, 30, 0, &c) == FG_OK ? 0 : 1); /* killed before it returns */
    }
    usleep(300000);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    CHECK(leftovers() == 0);
    /* and after all the crashes of the tests above */
    g_case = 0;
}
