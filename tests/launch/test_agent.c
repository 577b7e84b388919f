/* torchrun's agent in the library (fg_agent_run, src/launch/agent.c), on
 * this machine with sh programs as the ranks: restarts and the restart
 * count each round sees, no restart after the last, a usage error or a
 * resumable stop; a SIGTERM to the agent reaches every rank; what it says
 * goes through fg_log; the --hosts mpirun command; bad options (the --hosts
 * loop with a stand-in mpirun: tests/hosts/test_hosts_elastic.sh). Each agent runs in a forked
 * child (it blocks signals and sets the environment of its process), which sends its result and its
 * log back through a pipe. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#include "fulgur/launch.h"

typedef struct {
    fg_status st;
    fg_agent_result res;
    char err[1024];
    char log[4096];
} outcome;

static char g_log[4096];

static void log_sink(void *ud, fg_log_level level, int rank, const char *msg) {
    (void)ud;
    (void)level;
    (void)rank;
    size_t n = strlen(g_log);
    snprintf(g_log + n, sizeof g_log - n, "%s\n", msg);
}

/* Runs fg_agent_run(o) in a child; with on_start, calls it with the
 * child's pid once the child is running (before the result). */
static void run_agent(const fg_agent_opts *o, outcome *out, void (*on_start)(pid_t, void *),
                      void *ud) {
    memset(out, 0, sizeof *out);
    int fds[2];
    if (pipe(fds) != 0) {
        out->st = FG_EIO;
        return;
    }
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        outcome r = {0};
        g_log[0] = 0;
        fg_set_log(log_sink, NULL, FG_LOG_INFO);
        r.st = fg_agent_run(o, &r.res);
        snprintf(r.err, sizeof r.err, "%s", r.st ? fg_last_error() : "");
        snprintf(r.log, sizeof r.log, "%s", g_log);
        ssize_t w = write(fds[1], &r, sizeof r);
        _exit(w == (ssize_t)sizeof r ? 0 : 1);
    }
    close(fds[1]);
    if (on_start) on_start(pid, ud);
    size_t got = 0;
    while (got < sizeof *out) {
        ssize_t r = read(fds[0], (char *)out + got, sizeof *out - got);
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fds[0]);
    waitpid(pid, NULL, 0);
    if (got != sizeof *out) {
        memset(out, 0, sizeof *out);
        out->st = FG_EIO;
        snprintf(out->err, sizeof out->err, "the agent's child sent no result");
    }
}

static fg_agent_opts sh_opts(const char *script, int nproc, int restarts) {
    static const char *argv[4];
    argv[0] = "sh";
    argv[1] = "-c";
    argv[2] = script;
    argv[3] = NULL;
    return (fg_agent_opts){.argv = argv, .nproc_per_node = nproc, .max_restarts = restarts};
}

TEST(a_rank_that_fails_twice_is_restarted_twice_and_succeeds) {
    /* each round's ranks see the restart count; rounds 0 and 1 fail */
    fg_agent_opts o = sh_opts("[ \"$FULGUR_RESTART_COUNT\" = \"$TORCHELASTIC_RESTART_COUNT\" ] && "
                              "[ \"$TORCHELASTIC_MAX_RESTARTS\" = 2 ] && "
                              "[ \"$FULGUR_RESTART_COUNT\" -ge 2 ]",
                              2, 2);
    outcome r;
    run_agent(&o, &r, NULL, NULL);
    CHECK_MSG(r.st == FG_OK, "%s", r.err);
    CHECK(r.res.exit_code == 0);
    CHECK(r.res.restarts == 2);
    CHECK(r.res.failed.rank < 0);
    CHECK_CONTAINS(r.log, "exited with code 1; ");
    CHECK_CONTAINS(r.log, "restarting the 2 ranks (restart 1 of 2)");
    CHECK_CONTAINS(r.log, "restarting the 2 ranks (restart 2 of 2)");
}

TEST(no_restart_left_returns_the_failure_naming_the_count) {
    fg_agent_opts o = sh_opts("exit 3", 1, 1);
    outcome r;
    run_agent(&o, &r, NULL, NULL);
    CHECK(r.st == FG_EPEER);
    CHECK(r.res.exit_code == 3);
    CHECK(r.res.restarts == 1);
    CHECK(r.res.failed.rank == 0 && r.res.failed.code == 3);
    CHECK_CONTAINS(r.err, "rank 0 (pid ");
    CHECK_CONTAINS(r.err, "exited with code 3; no other rank was running (after 1 restart of "
                          "--max-restarts 1)");
    CHECK_CONTAINS(r.log, "restarting the 1 ranks (restart 1 of 1)");
}

TEST(a_usage_error_and_a_resumable_stop_are_not_restarted) {
    fg_agent_opts o = sh_opts("exit 2", 1, 3);
    outcome r;
    run_agent(&o, &r, NULL, NULL);
    CHECK(r.st == FG_EPEER && r.res.exit_code == 2 && r.res.restarts == 0);
    CHECK_CONTAINS(r.log, "(exit 2: a usage error, which a restart would repeat); not restarting");
    o = sh_opts("exit 75", 1, 3);
    run_agent(&o, &r, NULL, NULL);
    CHECK(r.st == FG_EPEER && r.res.exit_code == 75 && r.res.restarts == 0);
    CHECK_CONTAINS(r.log, "(stopped with a checkpoint to resume from); not restarting");
}

typedef struct {
    const char *dir;
    int n;
} sig_ctx;

/* once every rank wrote its "up" file: SIGTERM to the agent */
static void term_when_up(pid_t pid, void *ud) {
    sig_ctx *c = ud;
    for (int tries = 0; tries < 3000; tries++) { /* ~30 s: a hang, not a bound */
        int up = 0;
        for (int i = 0; i < c->n; i++) {
            char f[512];
            struct stat sb;
            snprintf(f, sizeof f, "%s/up.%d", c->dir, i);
            up += stat(f, &sb) == 0;
        }
        if (up == c->n) break;
        usleep(10000);
    }
    kill(pid, SIGTERM);
}

TEST(a_sigterm_to_the_agent_reaches_every_rank) {
    char dir[] = "/tmp/fulgur-agent-test.XXXXXX";
    if (!mkdtemp(dir)) {
        FG_FAIL_("mkdtemp");
        return;
    }
    char script[1024];
    snprintf(script, sizeof script,
             "exec 2>/dev/null; trap 'echo term > %s/got.$RANK; exit 0' TERM; touch %s/up.$RANK; "
             "while :; do sleep 0.05; done",
             dir, dir);
    fg_agent_opts o = sh_opts(script, 3, 5);
    sig_ctx c = {.dir = dir, .n = 3};
    outcome r;
    run_agent(&o, &r, term_when_up, &c);
    CHECK(r.st == FG_EPEER);
    CHECK(r.res.exit_code == 128 + SIGTERM);
    CHECK(r.res.signal == SIGTERM);
    CHECK(r.res.restarts == 0); /* a forwarded signal ends the job: no restart */
    CHECK_CONTAINS(r.log, "got SIGTERM; forwarded it to 3 ranks");
    for (int i = 0; i < 3; i++) {
        char f[512];
        snprintf(f, sizeof f, "%s/got.%d", dir, i);
        FILE *fp = fopen(f, "r");
        char line[16] = "";
        if (fp) {
            if (!fgets(line, sizeof line, fp)) line[0] = 0;
            fclose(fp);
        }
        CHECK_MSG(!strcmp(line, "term\n"), "rank %d did not get SIGTERM", i);
        unlink(f);
        snprintf(f, sizeof f, "%s/up.%d", dir, i);
        unlink(f);
    }
    rmdir(dir);
}

/* the command joined by spaces into out */
static void joined(char **cmd, char *out, size_t cap) {
    size_t k = 0;
    out[0] = 0;
    for (int i = 0; cmd[i] && k < cap; i++)
        k += (size_t)snprintf(out + k, cap - k, "%s%s", i ? " " : "", cmd[i]);
}

TEST(the_hosts_command) {
    setenv("FULGUR_AGENT_TEST", "1", 1);
    setenv("FULGUR_RANK", "3", 1); /* the contract: Open MPI's variables replace it */
    fg_hosts_opts h = {
        .hosts = "h1:2,h2", .default_slots = 3, .rsh_agent = "myrsh", .network = "10.0.0.0/24"};
    const char *prog[] = {"prog", "a b", NULL};
    char **cmd = NULL, line[8192];
    int n = 0;
    CHECK(fg_hosts_command(&h, 0, prog, &cmd, &n) == FG_OK && n == 2);
    if (cmd) {
        joined(cmd, line, sizeof line);
        CHECK(!strcmp(cmd[0], "mpirun"));
        CHECK_CONTAINS(line, " --host h1:2,h2:3 -np 5 --bind-to none --mca rtc_hwloc_vmhole none "
                             "--mca plm_rsh_agent myrsh --mca oob_tcp_if_include 10.0.0.0/24 "
                             "--mca btl_tcp_if_include 10.0.0.0/24 ");
        CHECK_CONTAINS(line, " -x FULGUR_AGENT_TEST ");
        CHECK(!strstr(line, "-x FULGUR_RANK "));
        int last = 0;
        while (cmd[last]) last++;
        CHECK(last >= 2 && !strcmp(cmd[last - 2], "prog") && !strcmp(cmd[last - 1], "a b"));
    }
    fg_hosts_command_free(cmd);
    CHECK(fg_hosts_command(&h, 1, prog, &cmd, NULL) == FG_OK); /* the first host only */
    if (cmd) {
        joined(cmd, line, sizeof line);
        CHECK_CONTAINS(line, " --host h1:2 -np 2 ");
    }
    fg_hosts_command_free(cmd);
    const char *bad[][2] = {{"h1:0", "the count after ':' must be 1..4096"},
                            {"h1,", "ends with ','"},
                            {"", "expected HOST:N,HOST:N,..."},
                            {"h 1", "is not a host name or address"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        h.hosts = bad[i][0];
        CHECK(fg_hosts_command(&h, 0, prog, &cmd, NULL) == FG_EINVAL && !cmd);
        CHECK_CONTAINS(fg_last_error(), bad[i][1]);
    }
    unsetenv("FULGUR_AGENT_TEST");
    unsetenv("FULGUR_RANK");
}

TEST(bad_options) {
    fg_agent_result res;
    CHECK(fg_agent_run(NULL, &res) == FG_EINVAL);
    fg_agent_opts o = sh_opts("true", 0, 0);
    CHECK(fg_agent_run(&o, &res) == FG_EINVAL && res.exit_code == 2);
    CHECK_CONTAINS(fg_last_error(), "nproc_per_node=0");
    o = sh_opts("true", 1, -1);
    CHECK(fg_agent_check(&o) == FG_EINVAL);
    o = sh_opts("true", 1, 0);
    o.num_nodes = 2;
    o.node_rank = 2;
    CHECK(fg_agent_check(&o) == FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "node_rank=2: expected 0..1");
    const char *none[] = {NULL};
    o = (fg_agent_opts){.argv = none, .nproc_per_node = 1};
    CHECK(fg_agent_check(&o) == FG_EINVAL);
}
