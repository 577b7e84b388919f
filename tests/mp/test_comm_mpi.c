/* comm on the mpi backend: the test binary starts itself under mpirun
 * (--oversubscribe, and --allow-run-as-root as root) at world sizes 1, 2,
 * 3, 4, 8; each rank runs the correctness matrix, bf16/f16 sums that round
 * (comm_halves.h: bitwise the shm backend's f32 sum in rank order, rounded
 * once, although the halves cross as halves), split and asynchronous
 * requests through fulgur's mpi backend and exits non-zero on any wrong
 * element. Skipped when fulgur was built without Open MPI or mpirun is
 * missing. */
#include <sys/wait.h>

#include "comm_halves.h"
#include "comm_matrix.h"
#include "harness.h"

#define CHILD_VAR "FULGUR_TEST_MPI_CHILD"

/* The rank side: runs before main when started by mpirun. */
__attribute__((constructor)) static void mpi_rank_main(void) {
    const char *mode = getenv(CHILD_VAR);
    if (!mode || !getenv("OMPI_COMM_WORLD_RANK")) return;
    fg_comm *c = fg_comm_new(NULL, NULL);
    if (!c) {
        fprintf(stderr, "  mpi rank: init: %s\n", fg_last_error());
        exit(1);
    }
    int me = fg_comm_rank(c), n = fg_comm_size(c), bad = 0;
    /* tests/hosts runs this across hosts, where the choice may be hybrid */
    const char *want_be = getenv("FULGUR_TEST_MPI_WANT") ? getenv("FULGUR_TEST_MPI_WANT") : "mpi";
    if (strcmp(fg_comm_backend_name(c), want_be) != 0) {
        fprintf(stderr, "  rank %d: backend %s, want %s\n", me, fg_comm_backend_name(c), want_be);
        bad = 1;
    }
    double t0 = fg_time();
    mx_stats st = mx_run(c, atol(mode));
    bad |= st.wrong || st.errors;
    /* halves whose sums round: bitwise the widen-sum-round of shm (hybrid
     * rounds each node's partial sum too: docs/comm.md) */
    long hw = strcmp(fg_comm_backend_name(c), "mpi") ? 0 : mx_halves_exact(c);
    bad |= hw != 0;
    /* split into halves, reversed */
    fg_comm *sub = NULL;
    if (fg_comm_split(c, me % 2, -me, &sub) != FG_OK || !sub) {
        fprintf(stderr, "  rank %d: split: %s\n", me, fg_last_error());
        bad = 1;
    } else {
        int64_t v = me, s = 0, want = 0;
        for (int q = me % 2; q < n; q += 2) want += q;
        if (fg_comm_allreduce(sub, &v, &s, 1, FG_I64, FG_REDUCE_OP_SUM) || s != want) {
            fprintf(stderr, "  rank %d: split allreduce %lld want %lld\n", me, (long long)s,
                    (long long)want);
            bad = 1;
        }
        fg_comm_free(sub);
    }
    /* asynchronous requests */
    float x[1000];
    fg_comm_req *r[3];
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < 1000; i++) x[i] = 1.0f;
        if (fg_comm_iallreduce(c, x, x, 1000, FG_F32, FG_REDUCE_OP_SUM, &r[k]) ||
            fg_comm_wait(r[k]) || x[999] != (float)n) {
            fprintf(stderr, "  rank %d: iallreduce: %s\n", me, fg_last_error());
            bad = 1;
        }
    }
    if (me == 0)
        printf("  %s world %d: %ld calls, %ld wrong elements, %ld errors; %ld wrong rounded "
               "halves (%.2f s)\n",
               want_be, n, st.calls, st.wrong, st.errors, hw, fg_time() - t0);
    fflush(stdout);
    fg_comm_free(c);
    exit(bad);
}

static const char *find_mpirun(void) {
    static char path[4096];
    const char *p = getenv("PATH");
    while (p && *p) {
        const char *e = strchr(p, ':');
        size_t k = e ? (size_t)(e - p) : strlen(p);
        snprintf(path, sizeof path, "%.*s/mpirun", (int)k, p);
        if (access(path, X_OK) == 0) return path;
        p = e ? e + 1 : NULL;
    }
    return NULL;
}

/* Runs this binary on n ranks under mpirun; returns its exit status. */
static int run_mpirun(const char *mpirun, int n, int64_t max_count, double limit) {
    char np[16], cnt[32];
    snprintf(np, sizeof np, "%d", n);
    snprintf(cnt, sizeof cnt, "%lld", (long long)max_count);
    setenv(CHILD_VAR, cnt, 1);
    /* Open MPI's own allocations are not ours to report */
    if (!getenv("ASAN_OPTIONS")) setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        const char *argv[16];
        int k = 0;
        argv[k++] = mpirun;
        if (geteuid() == 0) argv[k++] = "--allow-run-as-root";
        argv[k++] = "--oversubscribe";
        argv[k++] = "-np";
        argv[k++] = np;
        argv[k++] = "-x";
        argv[k++] = CHILD_VAR;
        argv[k++] = "/proc/self/exe";
        argv[k] = NULL;
        char self[4096];
        ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
        if (len > 0) {
            self[len] = 0;
            argv[k - 1] = self;
        }
        execv(mpirun, (char *const *)argv);
        _exit(127);
    }
    unsetenv(CHILD_VAR);
    double t0 = fg_time();
    for (;;) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
        if (fg_time() - t0 > limit) {
            fprintf(stderr, "  mpirun -np %d still running after %.0f s: killed\n", n, limit);
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            return 124;
        }
        usleep(10000);
    }
}

static void matrix(int n, int64_t max_count) {
    if (!fg_comm_backend_built(FG_COMM_MPI)) SKIP("fulgur was built without Open MPI");
    const char *mpirun = find_mpirun();
    if (!mpirun) SKIP("mpirun not found (apt-get install openmpi-bin)");
    int rc = run_mpirun(mpirun, n, max_count, 300);
    CHECK_MSG(rc == 0, "mpirun -np %d exited with %d", n, rc);
}

/* Under the sanitizers (a Debug build, 3-10x slower) the largest count runs
 * at world size 2 only; the release build runs it everywhere. */
#if defined(__SANITIZE_ADDRESS__)
#define MX_BIG_WIDE 1023
#else
#define MX_BIG_WIDE MX_BIG
#endif

TEST(matrix_mpi_world_1) { matrix(1, MX_BIG_WIDE); }
TEST(matrix_mpi_world_2) { matrix(2, MX_BIG); }
TEST(matrix_mpi_world_3) { matrix(3, MX_BIG_WIDE); }
TEST(matrix_mpi_world_4) { matrix(4, MX_BIG_WIDE); }
TEST(matrix_mpi_world_8) { matrix(8, MX_BIG_WIDE); }
