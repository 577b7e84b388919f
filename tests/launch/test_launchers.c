/* launch: the launchers for real.
 *
 *   re-exec: this test binary runs itself again as ranks 1..N-1 (the
 *     children recognise themselves by FG_TEST_LAUNCH_CHILD in a
 *     constructor, before the harness starts): each child reports the
 *     contract it sees; a child that is SIGKILLed makes the supervisor stop
 *     the rest within seconds and the failure names it; the comm layer's
 *     next collective on rank 0 fails naming the dead rank; fg_job_comm_new
 *     joins, and gives up naming a rank that died before joining; nothing
 *     is left running, even when the launcher itself is killed;
 *   programs: fg_job_start with a shell command, a missing program, a file
 *     that cannot be executed, signals, stop, wait with a timeout;
 *   fork: N children run a function, rank 0's blob comes back to the
 *     parent, a failing or SIGKILLed child is reported by rank with its
 *     message, send_result is refused where it does not belong. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fulgur/launch.h"
#include "harness.h"

/* ------------------------------------------------------ child side */

static void child_write(const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", getenv("FG_TEST_DIR"), name);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* The arguments of this process, joined by spaces. */
static void self_cmdline(char *buf, size_t cap) {
    buf[0] = '\0';
    FILE *f = fopen("/proc/self/cmdline", "rb");
    if (!f) return;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
    for (size_t i = 0; n && i < n - 1; i++)
        if (!buf[i]) buf[i] = ' ';
}

static int env_int(const char *k) {
    const char *v = getenv(k);
    return v ? atoi(v) : -1;
}

/* A re-executed rank: does what FG_TEST_LAUNCH_CHILD says, then exits. */
__attribute__((constructor)) static void launched_child(void) {
    const char *mode = getenv("FG_TEST_LAUNCH_CHILD");
    if (!mode || !getenv("FULGUR_RANK") || !strcmp(getenv("FULGUR_RANK"), "0")) return;
    int rank = env_int("FULGUR_RANK");
    char name[64], line[2048], cmd[1024];
    snprintf(name, sizeof name, "pid.%d", rank);
    snprintf(line, sizeof line, "%d\n", (int)getpid());
    child_write(name, line);
    if (!strcmp(mode, "env")) {
        self_cmdline(cmd, sizeof cmd);
        snprintf(line, sizeof line,
                 "rank=%s world=%s local=%s/%s node=%s/%s job=%s torch=%s/%s/%s/%s/%s master=%s:%s "
                 "cmd=%s\n",
                 getenv("FULGUR_RANK"), getenv("FULGUR_WORLD_SIZE"), getenv("FULGUR_LOCAL_RANK"),
                 getenv("FULGUR_LOCAL_WORLD_SIZE"), getenv("FULGUR_NODE_RANK"),
                 getenv("FULGUR_NUM_NODES"), getenv("FULGUR_JOB_ID"), getenv("RANK"),
                 getenv("WORLD_SIZE"), getenv("LOCAL_RANK"), getenv("LOCAL_WORLD_SIZE"),
                 getenv("NODE_RANK"), getenv("MASTER_ADDR"), getenv("MASTER_PORT"), cmd);
        snprintf(name, sizeof name, "rank.%d", rank);
        child_write(name, line);
        _exit(0);
    }
    int victim = env_int("FG_TEST_VICTIM");
    if (!strcmp(mode, "stubborn")) signal(SIGTERM, SIG_IGN);
    if (!strcmp(mode, "comm")) {
        /* the real thing: join the group, meet once, then the victim dies */
        fg_comm *c = fg_comm_new(NULL, NULL);
        if (!c || fg_comm_barrier(c) != FG_OK) _exit(1);
        if (rank == victim) {
            usleep(100000);
            raise(SIGKILL);
        }
        fg_status s = fg_comm_barrier(c);
        fg_comm_free(c);
        _exit(s == FG_OK ? 0 : 1);
    }
    if (rank == victim) {
        usleep(200000);
        if (!strcmp(mode, "exit3")) _exit(3);
        raise(SIGKILL);
    }
    for (int i = 0; i < 300; i++) usleep(100000); /* 30 s: only a stop ends this early */
    _exit(0);
}

/* ------------------------------------------------------ parent side */

static char g_dir[256];

static void make_dir(void) {
    snprintf(g_dir, sizeof g_dir, "%s/fulgur-launch-test.XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_dir)) g_dir[0] = '\0';
    setenv("FG_TEST_DIR", g_dir, 1);
}

static void remove_dir(void) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (g_dir[0] && system(cmd) != 0) fprintf(stderr, "  (could not remove %s)\n", g_dir);
}

static bool read_file(const char *name, char *buf, size_t cap) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    fclose(f);
    return true;
}

/* Back to a process that nothing launched. */
static void reset_env(void) {
    fg_launch_unexport();
    unsetenv("FG_TEST_LAUNCH_CHILD");
    unsetenv("FG_TEST_VICTIM");
    setenv("FULGUR_CPU_DEVICES", "8", 1);
    setenv("FULGUR_NUM_THREADS", "1", 1);
}

static bool gone(int pid) { return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH; }

static fg_status plan_ddp(int n, fg_launch_plan *p) {
    char devs[16];
    snprintf(devs, sizeof devs, "%d", n);
    fg_cluster_info none = {
        .world_size = 1, .local_world_size = 1, .num_nodes = 1, .source = "none"};
    return fg_launch_plan_make(&(fg_launch_opts){.devices = devs, .strategy = "ddp"}, &none, p);
}

TEST(reexec_children_see_the_contract) {
    reset_env();
    make_dir();
    setenv("FG_TEST_LAUNCH_CHILD", "env", 1);
    fg_launch_plan p;
    CHECK_OK(plan_ddp(3, &p));
    CHECK(p.launcher == FG_LAUNCHER_REEXEC);
    fg_job *j = fg_launch_reexec(&p, NULL);
    CHECK_MSG(j, "fg_launch_reexec: %s", fg_last_error());
    if (!j) return;
    /* this process goes on as rank 0 */
    CHECK(!strcmp(getenv("FULGUR_RANK"), "0") && !strcmp(getenv("FULGUR_WORLD_SIZE"), "3"));
    fg_cluster_info me;
    CHECK_OK(fg_cluster_detect(&me));
    CHECK(me.rank == 0 && me.world_size == 3 && me.local_world_size == 3 && me.master_port > 0);
    CHECK_OK(fg_job_wait(j, 20));
    char cmd[1024], want[2048], got[2048];
    self_cmdline(cmd, sizeof cmd);
    for (int r = 1; r < 3; r++) {
        char name[32];
        snprintf(name, sizeof name, "rank.%d", r);
        CHECK_MSG(read_file(name, got, sizeof got), "rank %d wrote nothing", r);
        snprintf(want, sizeof want,
                 "rank=%d world=3 local=%d/3 node=0/1 job=%s torch=%d/3/%d/3/0 master=127.0.0.1:%d "
                 "cmd=%s\n",
                 r, r, me.job_id, r, r, me.master_port, cmd);
        CHECK_MSG(!strcmp(got, want), "rank %d saw\n    %s  want\n    %s", r, got, want);
        fg_rank_exit e;
        int pid = fg_job_proc(j, r - 1, &e);
        CHECK(e.rank == r && e.code == 0 && e.signal == 0);
        CHECK(gone(pid));
    }
    fg_job_status st;
    fg_job_get_status(j, &st);
    CHECK(st.nprocs == 2 && st.running == 0 && st.failed.rank == -1 && st.stopped == 0);
    CHECK_OK(fg_job_check(j));
    fg_job_free(j);
    /* a plan that is not re-exec is refused */
    CHECK_OK(plan_ddp(1, &p));
    CHECK(fg_launch_reexec(&p, NULL) == NULL);
    CHECK(fg_last_status() == FG_EINVAL);
    reset_env();
    remove_dir();
}

static atomic_int g_hook_rank = -1;
static void on_failure(void *ud, const fg_rank_exit *e) {
    (void)ud;
    atomic_store(&g_hook_rank, e->rank);
}

/* Runs a re-exec job of n ranks in `mode` with one victim; returns the
 * wait's status and the seconds it took. */
static fg_status run_victim_job(const char *mode, int n, int victim, double grace, double *secs,
                                fg_job **out) {
    reset_env();
    setenv("FG_TEST_LAUNCH_CHILD", mode, 1);
    char v[16];
    snprintf(v, sizeof v, "%d", victim);
    setenv("FG_TEST_VICTIM", v, 1);
    fg_launch_plan p;
    fg_status s = plan_ddp(n, &p);
    if (s != FG_OK) return s;
    atomic_store(&g_hook_rank, -1);
    fg_job_opts o = {.grace_s = grace, .on_failure = on_failure};
    double t0 = fg_time();
    if (!(*out = fg_launch_reexec(&p, &o))) return fg_last_status();
    s = fg_job_wait(*out, 30);
    *secs = fg_time() - t0;
    return s;
}

TEST(reexec_sigkill_stops_the_rest) {
    make_dir();
    fg_job *j = NULL;
    double secs = 0;
    fg_status s = run_victim_job("kill", 4, 2, 0, &secs, &j);
    CHECK_STATUS(s, FG_EPEER);
    CHECK_CONTAINS(fg_last_error(), "rank 2 (pid ");
    CHECK_CONTAINS(fg_last_error(), "was killed by signal 9 (SIGKILL); stopped the other 2 ranks");
    CHECK_MSG(secs < 5, "the job took %.1f s to end", secs);
    if (j) {
        CHECK_STATUS(fg_job_check(j), FG_EPEER);
        CHECK_CONTAINS(fg_last_error(), "rank 2 (pid");
        CHECK(atomic_load(&g_hook_rank) == 2);
        fg_job_status st;
        fg_job_get_status(j, &st);
        CHECK(st.failed.rank == 2 && st.failed.signal == SIGKILL && st.stopped == 2);
        CHECK(fg_rank_exit_status(&st.failed) == 137);
        for (int i = 0; i < 3; i++) {
            fg_rank_exit e;
            int pid = fg_job_proc(j, i, &e);
            CHECK_MSG(gone(pid), "rank %d (pid %d) is still there", i + 1, pid);
            if (i + 1 != 2) CHECK(e.signal == SIGTERM); /* stopped politely */
        }
    }
    fg_job_free(j);
    reset_env();
    remove_dir();
}

TEST(reexec_sigterm_ignored_gets_sigkill) {
    make_dir();
    fg_job *j = NULL;
    double secs = 0;
    CHECK_STATUS(run_victim_job("stubborn", 3, 1, 0.3, &secs, &j), FG_EPEER);
    CHECK_CONTAINS(fg_last_error(), "rank 1 (pid");
    CHECK_MSG(secs < 5, "the job took %.1f s to end", secs);
    if (j) {
        fg_rank_exit e;
        int pid = fg_job_proc(j, 1, &e); /* rank 2 ignored SIGTERM */
        CHECK(e.rank == 2 && e.signal == SIGKILL);
        CHECK(gone(pid));
    }
    fg_job_free(j);
    /* an exit code is a failure too */
    CHECK_STATUS(run_victim_job("exit3", 3, 1, 0, &secs, &j), FG_EPEER);
    CHECK_CONTAINS(fg_last_error(), "exited with code 3; stopped the other 1 rank");
    fg_job_free(j);
    reset_env();
    remove_dir();
}

TEST(reexec_rank0_collective_names_the_dead_rank) {
    make_dir();
    reset_env();
    setenv("FG_TEST_LAUNCH_CHILD", "comm", 1);
    setenv("FG_TEST_VICTIM", "2", 1);
    fg_launch_plan p;
    CHECK_OK(plan_ddp(3, &p));
    fg_job *j = fg_launch_reexec(&p, NULL);
    CHECK_MSG(j, "fg_launch_reexec: %s", fg_last_error());
    fg_comm *c = j ? fg_comm_new(NULL, NULL) : NULL;
    CHECK_MSG(c, "fg_comm_new: %s", fg_last_error());
    if (c) {
        CHECK_OK(fg_comm_barrier(c));
        double t0 = fg_time();
        CHECK_STATUS(fg_comm_barrier(c), FG_EPEER);
        CHECK_CONTAINS(fg_last_error(), "rank 2");
        CHECK_MSG(fg_time() - t0 < 10, "the dead rank was noticed after %.1f s", fg_time() - t0);
    }
    fg_comm_free(c);
    CHECK_STATUS(fg_job_wait(j, 20), FG_EPEER);
    /* the victim, though rank 1 (whose own collective failed on it) may
     * exit in the same moment: a killed rank is named first */
    CHECK_CONTAINS(fg_last_error(), "rank 2 (pid");
    fg_job_free(j);
    reset_env();
    remove_dir();
}

/* fg_job_comm_new: joins like fg_comm_new; a rank that dies before it
 * joins ends rank 0's wait at the rendezvous with its name, instead of the
 * comm timeout. */
TEST(reexec_job_comm_new) {
    make_dir();
    reset_env();
    setenv("FG_TEST_LAUNCH_CHILD", "comm", 1); /* no victim: join, meet twice */
    fg_launch_plan p;
    CHECK_OK(plan_ddp(3, &p));
    fg_job *j = fg_launch_reexec(&p, NULL);
    CHECK_MSG(j, "fg_launch_reexec: %s", fg_last_error());
    fg_comm *c = j ? fg_job_comm_new(j, NULL, NULL) : NULL;
    CHECK_MSG(c, "fg_job_comm_new: %s", fg_last_error());
    if (c) {
        CHECK(fg_comm_size(c) == 3 && fg_comm_rank(c) == 0);
        CHECK_OK(fg_comm_barrier(c));
        CHECK_OK(fg_comm_barrier(c));
    }
    fg_comm_free(c);
    CHECK_OK(fg_job_wait(j, -1));
    fg_job_free(j);
    /* rank 2 exits with code 3 without joining; rank 1 never joins either */
    reset_env();
    setenv("FG_TEST_LAUNCH_CHILD", "exit3", 1);
    setenv("FG_TEST_VICTIM", "2", 1);
    CHECK_OK(plan_ddp(3, &p));
    j = fg_launch_reexec(&p, NULL);
    CHECK_MSG(j, "fg_launch_reexec: %s", fg_last_error());
    if (j) {
        CHECK(fg_job_comm_new(j, NULL, NULL) == NULL);
        CHECK(fg_last_status() == FG_EPEER);
        CHECK_CONTAINS(fg_last_error(), "joining the communicator: rank 2 (pid ");
        CHECK_CONTAINS(fg_last_error(), "exited with code 3");
        /* once failed, it says so at once */
        CHECK(fg_job_comm_new(j, NULL, NULL) == NULL);
        CHECK(fg_last_status() == FG_EPEER);
        CHECK_STATUS(fg_job_wait(j, -1), FG_EPEER);
    }
    fg_job_free(j);
    /* no job: plain fg_comm_new (a world of one here) */
    reset_env();
    c = fg_job_comm_new(NULL, NULL, NULL);
    CHECK_MSG(c && fg_comm_size(c) == 1, "fg_job_comm_new(NULL, ...): %s", fg_last_error());
    fg_comm_free(c);
    reset_env();
    remove_dir();
}

TEST(no_orphans_when_the_launcher_dies) {
    reset_env();
    prctl(PR_SET_CHILD_SUBREAPER, 1); /* orphans come to us: we can see how they ended */
    int fds[2];
    CHECK(pipe(fds) == 0);
    fflush(NULL);
    pid_t launcher = fork();
    if (launcher == 0) {
        close(fds[0]);
        const char *argv[] = {"sleep", "30", NULL};
        fg_job *j = fg_job_start(&(fg_job_spec){.argv = argv, .nprocs = 3}, NULL);
        if (!j) _exit(1);
        for (int i = 0; i < 3; i++) {
            int pid = fg_job_proc(j, i, NULL);
            if (write(fds[1], &pid, sizeof pid) != sizeof pid) _exit(1);
        }
        raise(SIGKILL); /* no cleanup at all */
    }
    close(fds[1]);
    int pids[3] = {0};
    for (int i = 0; i < 3; i++) CHECK(read(fds[0], &pids[i], sizeof pids[i]) == sizeof pids[i]);
    close(fds[0]);
    int st;
    waitpid(launcher, &st, 0);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    double t0 = fg_time();
    for (int i = 0; i < 3; i++) {
        if (pids[i] <= 0) continue;
        bool reaped = false;
        while (!reaped && fg_time() - t0 < 5) {
            pid_t r = waitpid(pids[i], &st, WNOHANG);
            if (r == pids[i]) reaped = true;
            else if (r < 0) break; /* reaped elsewhere */
            else usleep(10000);
        }
        CHECK_MSG(reaped && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL,
                  "rank %d (pid %d) outlived its launcher", i, pids[i]);
        if (!reaped) kill(pids[i], SIGKILL);
        CHECK(gone(pids[i]));
    }
    prctl(PR_SET_CHILD_SUBREAPER, 0);
}

/* ---------------------------------------------------- any program */

TEST(job_runs_a_program_on_a_node) {
    reset_env();
    make_dir();
    const char *argv[] = {
        "sh", "-c",
        "echo \"$FULGUR_RANK $RANK $LOCAL_RANK/$LOCAL_WORLD_SIZE "
        "$FULGUR_WORLD_SIZE $NODE_RANK $GROUP_WORLD_SIZE $MASTER_ADDR:$MASTER_PORT "
        "$FULGUR_JOB_ID\" > \"$FG_TEST_DIR/out.$FULGUR_RANK\"",
        NULL};
    fg_job *j = fg_job_start(&(fg_job_spec){.argv = argv,
                                            .nprocs = 3,
                                            .node_rank = 1,
                                            .num_nodes = 2,
                                            .master_addr = "10.9.8.7",
                                            .master_port = 4321,
                                            .job_id = "jobby"},
                             NULL);
    CHECK_MSG(j, "fg_job_start: %s", fg_last_error());
    if (!j) return;
    CHECK_OK(fg_job_wait(j, 20));
    for (int r = 3; r < 6; r++) {
        char name[32], got[256], want[256];
        snprintf(name, sizeof name, "out.%d", r);
        snprintf(want, sizeof want, "%d %d %d/3 6 1 2 10.9.8.7:4321 jobby\n", r, r, r - 3);
        CHECK_MSG(read_file(name, got, sizeof got) && !strcmp(got, want), "rank %d: %s", r, got);
    }
    fg_cluster_info info;
    fg_job_info(j, &info);
    CHECK(info.world_size == 6 && info.rank == 3 && info.master_port == 4321);
    fg_job_free(j);
    remove_dir();
}

TEST(job_start_errors) {
    reset_env();
    const char *missing[] = {"no-such-program-fulgur", NULL};
    CHECK(fg_job_start(&(fg_job_spec){.argv = missing, .nprocs = 2}, NULL) == NULL);
    CHECK(fg_last_status() == FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "program \"no-such-program-fulgur\": not found in PATH");
    const char *nofile[] = {"./no/such/file", NULL};
    CHECK(fg_job_start(&(fg_job_spec){.argv = nofile, .nprocs = 1}, NULL) == NULL);
    CHECK(fg_last_status() == FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "No such file");
    /* a file without the execute bit */
    make_dir();
    char plain[512];
    snprintf(plain, sizeof plain, "%s/plain", g_dir);
    FILE *pf = fopen(plain, "w");
    if (pf) fclose(pf);
    chmod(plain, 0644);
    const char *notexe[] = {plain, NULL};
    if (geteuid() != 0 || access(plain, X_OK) != 0) {
        CHECK(fg_job_start(&(fg_job_spec){.argv = notexe, .nprocs = 1}, NULL) == NULL);
        CHECK(fg_last_status() == FG_EINVAL);
        CHECK_CONTAINS(fg_last_error(), "not an executable file");
    }
    remove_dir();
    /* executable but not a program: execve says so, and the start fails naming the rank */
    make_dir();
    char path[512];
    snprintf(path, sizeof path, "%s/garbage", g_dir);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs("\x01\x02 not a program\n", f);
        fclose(f);
    }
    chmod(path, 0755);
    const char *bad[] = {path, NULL};
    CHECK(fg_job_start(&(fg_job_spec){.argv = bad, .nprocs = 2}, NULL) == NULL);
    CHECK(fg_last_status() == FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "rank 0: cannot execute");
    CHECK_CONTAINS(fg_last_error(), "Exec format error");
    remove_dir();
    const char *ok[] = {"true", NULL};
    CHECK(fg_job_start(&(fg_job_spec){.argv = ok, .nprocs = 0}, NULL) == NULL);
    CHECK(fg_last_status() == FG_EINVAL);
    CHECK(fg_job_start(&(fg_job_spec){.argv = ok, .nprocs = 2, .node_rank = 1}, NULL) == NULL);
    CHECK(fg_last_status() == FG_EINVAL);
    CHECK(fg_job_start(
              &(fg_job_spec){.argv = ok, .nprocs = 2, .first_local_rank = 1, .local_world_size = 2},
              NULL) == NULL);
    CHECK(fg_last_status() == FG_EINVAL);
    CHECK(fg_job_start(NULL, NULL) == NULL);
    CHECK(fg_last_status() == FG_EINVAL);
    fg_job_free(NULL);
}

TEST(job_signal_stop_and_timeout) {
    reset_env();
    const char *argv[] = {"sleep", "30", NULL};
    fg_job *j = NULL;
    /* a forwarded signal: every rank gets it, nothing is stopped on top */
    j = fg_job_start(&(fg_job_spec){.argv = argv, .nprocs = 3}, NULL);
    CHECK_MSG(j, "fg_job_start: %s", fg_last_error());
    if (!j) return;
    CHECK_STATUS(fg_job_wait(j, 0.2), FG_ETIMEOUT);
    CHECK_CONTAINS(fg_last_error(), "still running after 0.2 s (3 ranks left)");
    CHECK(fg_job_signal(j, SIGINT) == 3);
    CHECK_STATUS(fg_job_wait(j, 10), FG_EPEER);
    CHECK_CONTAINS(fg_last_error(), "was killed by signal 2 (SIGINT)");
    fg_job_status st;
    fg_job_get_status(j, &st);
    CHECK(st.signaled == SIGINT && st.stopped == 0 && st.running == 0);
    CHECK(fg_job_signal(j, SIGINT) == 0);
    fg_job_free(j);
    /* a stop asked for is no failure */
    j = fg_job_start(&(fg_job_spec){.argv = argv, .nprocs = 3}, NULL);
    CHECK_MSG(j, "fg_job_start: %s", fg_last_error());
    if (!j) return;
    double t0 = fg_time();
    CHECK(fg_job_stop(j) == 3);
    CHECK_MSG(fg_time() - t0 < 2, "stop took %.1f s", fg_time() - t0);
    CHECK_OK(fg_job_wait(j, 1));
    fg_job_get_status(j, &st);
    CHECK(st.stopped == 3 && st.failed.rank == -1);
    for (int i = 0; i < 3; i++) CHECK(gone(fg_job_proc(j, i, NULL)));
    CHECK(fg_job_stop(j) == 0);
    fg_job_free(j);
    /* free stops what still runs */
    j = fg_job_start(&(fg_job_spec){.argv = argv, .nprocs = 2}, NULL);
    CHECK_MSG(j, "fg_job_start: %s", fg_last_error());
    if (!j) return;
    int pid = fg_job_proc(j, 0, NULL);
    fg_job_free(j);
    CHECK(gone(pid));
    /* a shell's children are stopped with it (each rank is a process group) */
    make_dir();
    const char *sh[] = {"sh", "-c", "sleep 30 & echo $! > \"$FG_TEST_DIR/bg\"; wait", NULL};
    j = fg_job_start(&(fg_job_spec){.argv = sh, .nprocs = 1}, NULL);
    CHECK_MSG(j, "fg_job_start: %s", fg_last_error());
    if (!j) return;
    char got[64] = "";
    /* the whole line: the shell creates the file before it writes the pid */
    for (int i = 0; i < 1000 && !(read_file("bg", got, sizeof got) && strchr(got, '\n')); i++)
        usleep(10000); /* up to 10 s under load */
    usleep(50000);
    fg_job_free(j);
    int bg = atoi(got);
    usleep(100000);
    CHECK_MSG(bg > 0 && (gone(bg) || kill(bg, 0) == 0), "no background pid");
    /* the background sleep was reparented; if it lives, it is not a zombie of ours */
    char stat_path[64], state[512] = "";
    snprintf(stat_path, sizeof stat_path, "/proc/%d/stat", bg);
    FILE *f = fopen(stat_path, "r");
    if (f) {
        if (!fgets(state, sizeof state, f)) state[0] = '\0';
        fclose(f);
    }
    const char *paren = strrchr(state, ')');
    CHECK_MSG(!f || (paren && (paren[2] == 'Z' || paren[2] == 'X')),
              "the rank's background child %d still runs: %s", bg, state);
    remove_dir();
}

/* -------------------------------------------------------- fork */

typedef struct {
    _Atomic int *seen; /* shared: bit r set by rank r */
    int fail_rank;
    const char *how; /* "error", "kill", "ok" */
} fork_arg;

static int fork_fn(int rank, int world, void *argp) {
    fork_arg *a = argp;
    fg_cluster_info c;
    if (fg_cluster_detect(&c) != FG_OK || c.rank != rank || c.world_size != world ||
        c.local_rank != rank || strcmp(c.source, "fulgur") || !c.job_id[0])
        return 10;
    if (atoi(getenv("RANK")) != rank) return 11;
    atomic_fetch_or(a->seen, 1 << rank);
    if (rank == 0) {
        /* the first send is replaced by the second */
        static char big[1 << 20];
        memset(big, 'x', sizeof big);
        if (fg_launch_send_result(big, sizeof big) != FG_OK) return 12;
        char msg[64];
        int n = snprintf(msg, sizeof msg, "trained on %d ranks", world);
        if (fg_launch_send_result(msg, (size_t)n + 1) != FG_OK) return 13;
    } else if (fg_launch_send_result("no", 2) != FG_ESTATE) {
        return 14;
    }
    if (rank == a->fail_rank) {
        usleep(100000);
        if (!strcmp(a->how, "kill")) raise(SIGKILL);
        fg_error(FG_EIO, "disk full at step 7");
        return 1;
    }
    if (a->fail_rank >= 0)
        for (int i = 0; i < 300; i++) usleep(100000); /* until stopped */
    return 0;
}

static _Atomic int *shared_int(void) {
    void *p =
        mmap(NULL, sizeof(_Atomic int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

TEST(fork_runs_ranks_and_hands_back_the_result) {
    reset_env();
    _Atomic int *seen = shared_int();
    if (!seen) SKIP("no shared mapping");
    *seen = 0;
    fork_arg a = {.seen = seen, .fail_rank = -1, .how = "ok"};
    fg_fork_result r;
    CHECK_OK(fg_launch_fork(3, fork_fn, &a, &(fg_fork_opts){.master_port = 1234}, &r));
    CHECK(*seen == 7);
    CHECK(r.failed.rank == -1);
    CHECK_MSG(r.data && r.len == strlen("trained on 3 ranks") + 1 &&
                  !strcmp(r.data, "trained on 3 ranks"),
              "result %zu bytes: %.40s", r.len, r.data ? (char *)r.data : "(none)");
    fg_free(r.data);
    /* nothing sent: no data */
    CHECK_OK(fg_launch_fork(1, fork_fn, &a, NULL, &r)); /* rank 0 sends: data */
    CHECK(r.data != NULL);
    fg_free(r.data);
    CHECK(getenv("FULGUR_RANK") == NULL); /* the parent's environment is untouched */
    munmap((void *)seen, sizeof *seen);
}

static int big_fn(int rank, int world, void *arg) {
    (void)world;
    (void)arg;
    if (rank != 0) return 0;
    size_t n = 8u << 20;
    unsigned char *b = malloc(n);
    if (!b) return 2;
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(i * 131 + 7);
    fg_status s = fg_launch_send_result(b, n);
    free(b);
    return s == FG_OK ? 0 : 3;
}

static int threads_fn(int rank, int world, void *arg) {
    (void)rank;
    (void)world;
    (void)arg;
    return fg_get_num_threads() == 1 ? 0 : 5;
}

static int quiet_fn(int rank, int world, void *arg) {
    (void)rank;
    (void)world;
    (void)arg;
    return 0;
}

TEST(fork_big_result_threads_and_nothing_sent) {
    reset_env();
    fg_fork_result r;
    CHECK_OK(fg_launch_fork(2, big_fn, NULL, NULL, &r));
    bool same = r.data && r.len == 8u << 20;
    for (size_t i = 0; same && i < r.len; i++)
        same = ((unsigned char *)r.data)[i] == (unsigned char)(i * 131 + 7);
    CHECK_MSG(same, "8 MiB result came back as %zu bytes, or different", r.len);
    fg_free(r.data);
    CHECK_OK(fg_launch_fork(2, threads_fn, NULL, &(fg_fork_opts){.threads_per_rank = 1}, &r));
    CHECK_OK(fg_launch_fork(2, quiet_fn, NULL, NULL, &r));
    CHECK(r.data == NULL && r.len == 0);
    CHECK_OK(fg_launch_fork(2, quiet_fn, NULL, NULL, NULL)); /* no result wanted */
}

TEST(fork_failing_rank_is_named) {
    reset_env();
    _Atomic int *seen = shared_int();
    if (!seen) SKIP("no shared mapping");
    fork_arg a = {.seen = seen, .fail_rank = 1, .how = "error"};
    fg_fork_result r;
    double t0 = fg_time();
    CHECK_STATUS(fg_launch_fork(3, fork_fn, &a, NULL, &r), FG_EPEER);
    CHECK_CONTAINS(fg_last_error(), "rank 1 (pid ");
    CHECK_CONTAINS(fg_last_error(), "exited with code 1: disk full at step 7; stopped the other 2 "
                                    "ranks");
    CHECK_MSG(fg_time() - t0 < 5, "took %.1f s", fg_time() - t0);
    CHECK(r.failed.rank == 1 && r.failed.code == 1);
    CHECK(r.data == NULL); /* a failed job hands nothing back */
    a.fail_rank = 2;
    a.how = "kill";
    t0 = fg_time();
    CHECK_STATUS(fg_launch_fork(4, fork_fn, &a, &(fg_fork_opts){.grace_s = 0.5}, &r), FG_EPEER);
    CHECK_CONTAINS(fg_last_error(), "rank 2 (pid ");
    CHECK_CONTAINS(fg_last_error(), "was killed by signal 9 (SIGKILL); stopped the other 3 ranks");
    CHECK(r.failed.rank == 2 && r.failed.signal == SIGKILL &&
          fg_rank_exit_status(&r.failed) == 137);
    CHECK_MSG(fg_time() - t0 < 5, "took %.1f s", fg_time() - t0);
    CHECK(gone(r.failed.pid));
    munmap((void *)seen, sizeof *seen);
}

TEST(fork_misuse) {
    fg_fork_result r;
    CHECK_STATUS(fg_launch_send_result("x", 1), FG_ESTATE);
    CHECK_CONTAINS(fg_last_error(), "not started by fg_launch_fork");
    CHECK_STATUS(fg_launch_fork(0, quiet_fn, NULL, NULL, &r), FG_EINVAL);
    CHECK_STATUS(fg_launch_fork(2, NULL, NULL, NULL, &r), FG_EINVAL);
    CHECK_STATUS(fg_launch_fork(2, quiet_fn, NULL, &(fg_fork_opts){.master_port = 70000}, &r),
                 FG_EINVAL);
}
