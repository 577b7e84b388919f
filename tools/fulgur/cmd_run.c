/* fulgur run: torchrun's job. Starts --nproc-per-node copies of a program on
 * this machine with the rank environment (fulgur's FULGUR_* and torchrun's
 * names), forwards SIGINT and SIGTERM to them, stops the rest when one
 * fails, and exits with that rank's code (128 + signal when it was killed),
 * saying which rank failed and why. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "cli_flags.h"

static const char *const k_usage =
    "fulgur run [--nproc-per-node N] [--nnodes N --node-rank R --master-addr A --master-port P] "
    "[--] PROGRAM [ARGS...]";

static volatile sig_atomic_t g_signal;
static void on_signal(int sig) { g_signal = sig; }

static void setenv_int(const char *k, long v) {
    char b[32];
    snprintf(b, sizeof b, "%ld", v);
    setenv(k, b, 1);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Sends SIGTERM to the live children, then SIGKILL to those still alive
 * after 3 s; reaps them all. Returns how many were stopped. */
static int stop_all(pid_t *pids, int *done, int n, int sig) {
    int stopped = 0;
    for (int i = 0; i < n; i++)
        if (!done[i] && kill(pids[i], sig) == 0) stopped++;
    double t0 = now();
    for (;;) {
        int left = 0;
        for (int i = 0; i < n; i++) {
            if (done[i]) continue;
            int st;
            if (waitpid(pids[i], &st, WNOHANG) == pids[i]) done[i] = 1;
            else left++;
        }
        if (!left) break;
        if (now() - t0 > 3.0)
            for (int i = 0; i < n; i++)
                if (!done[i]) kill(pids[i], SIGKILL);
        usleep(10000);
    }
    return stopped;
}

int cmd_run(int argc, char **argv) {
    /* Flags end at "--" or at the first word that is not a flag: the program. */
    int split = argc;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) {
            split = i;
            break;
        }
        if (strncmp(argv[i], "--", 2) && strcmp(argv[i], "-h")) {
            split = i;
            break;
        }
        if (!strchr(argv[i], '=') && strcmp(argv[i], "--help") && strcmp(argv[i], "-h")) i++;
    }
    int64_t nproc = 1, nnodes = 1, node_rank = 0, port = 29500;
    const char *addr = "127.0.0.1";
    cli_flag flags[] = {
        {.name = "nproc-per-node", .type = CLI_INT, .dst = &nproc, .def = "1", .min = 1, .max = 4096,
         .help = "ranks to start on this machine"},
        {.name = "nnodes", .type = CLI_INT, .dst = &nnodes, .def = "1", .min = 1, .max = 65536,
         .help = "machines in the job (run this command once on each)"},
        {.name = "node-rank", .type = CLI_INT, .dst = &node_rank, .def = "0", .min = 0, .max = 65535,
         .help = "this machine's index, 0 .. nnodes-1"},
        {.name = "master-addr", .type = CLI_STR, .dst = &addr, .def = "127.0.0.1",
         .help = "address of node 0 (MASTER_ADDR)"},
        {.name = "master-port", .type = CLI_INT, .dst = &port, .def = "29500", .min = 1, .max = 65535,
         .help = "port on node 0 (MASTER_PORT); also names the job's shared memory"},
    };
    int nflags = (int)(sizeof flags / sizeof flags[0]);
    int rc = cli_flags_parse(flags, nflags, split, argv, k_usage, NULL, 0, NULL);
    if (rc < 0) {
        printf("\nStarts the ranks with FULGUR_RANK, FULGUR_WORLD_SIZE, FULGUR_LOCAL_RANK, ...\n"
               "and torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK,\n"
               "MASTER_ADDR, MASTER_PORT. When one rank fails the others are stopped and\n"
               "fulgur run exits with that rank's code (128+signal if it was killed).\n");
        return FG_EXIT_OK;
    }
    if (rc) return rc;
    if (node_rank >= nnodes) {
        cli_error("--node-rank %lld: must be below --nnodes %lld", (long long)node_rank,
                  (long long)nnodes);
        return FG_EXIT_USAGE;
    }
    int prog = split < argc && !strcmp(argv[split], "--") ? split + 1 : split;
    if (prog >= argc) {
        cli_error("no program to run\nusage: %s", k_usage);
        return FG_EXIT_USAGE;
    }
    int n = (int)nproc;
    long world = (long)nproc * nnodes;
    char job[64];
    snprintf(job, sizeof job, "run-%d-%lld", (int)getpid(), (long long)port);
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    int *done = calloc((size_t)n, sizeof *done);
    if (!pids || !done) {
        cli_error("out of memory");
        return FG_EXIT_FAIL;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    pid_t me = getpid();
    for (int r = 0; r < n; r++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) {
            cli_error("fork for local rank %d: %s", r, strerror(errno));
            stop_all(pids, done, r, SIGTERM);
            return FG_EXIT_FAIL;
        }
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != me) _exit(127);
            signal(SIGINT, SIG_DFL);
            signal(SIGTERM, SIG_DFL);
            long rank = (long)node_rank * nproc + r;
            setenv_int("FULGUR_RANK", rank);
            setenv_int("FULGUR_WORLD_SIZE", world);
            setenv_int("FULGUR_LOCAL_RANK", r);
            setenv_int("FULGUR_LOCAL_WORLD_SIZE", n);
            setenv_int("FULGUR_NODE_RANK", node_rank);
            setenv_int("FULGUR_NUM_NODES", nnodes);
            setenv("FULGUR_MASTER_ADDR", addr, 1);
            setenv_int("FULGUR_MASTER_PORT", port);
            setenv("FULGUR_JOB_ID", job, 1);
            setenv_int("RANK", rank);
            setenv_int("WORLD_SIZE", world);
            setenv_int("LOCAL_RANK", r);
            setenv_int("LOCAL_WORLD_SIZE", n);
            setenv_int("NODE_RANK", node_rank);
            setenv_int("GROUP_RANK", node_rank);
            setenv("MASTER_ADDR", addr, 1);
            setenv_int("MASTER_PORT", port);
            execvp(argv[prog], argv + prog);
            fprintf(stderr, "fulgur run: rank %ld: cannot run %s: %s\n", rank, argv[prog],
                    strerror(errno));
            _exit(127);
        }
        pids[r] = pid;
    }
    int left = n, exit_code = 0, forwarded = 0;
    while (left) {
        if (g_signal && !forwarded) {
            forwarded = g_signal;
            for (int i = 0; i < n; i++)
                if (!done[i]) kill(pids[i], g_signal);
        }
        int st;
        pid_t p = waitpid(-1, &st, 0);
        if (p < 0) {
            if (errno == EINTR) continue;
            break;
        }
        int r = -1;
        for (int i = 0; i < n; i++)
            if (pids[i] == p) r = i;
        if (r < 0 || done[r]) continue;
        done[r] = 1;
        left--;
        bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
        if (ok || exit_code) continue;
        long rank = (long)node_rank * nproc + r;
        int stopped = stop_all(pids, done, n, SIGTERM);
        left = 0;
        if (WIFSIGNALED(st)) {
            exit_code = 128 + WTERMSIG(st);
            fprintf(stderr, "fulgur run: rank %ld (pid %d) was killed by signal %d (%s); stopped "
                            "the other %d rank%s\n",
                    rank, (int)p, WTERMSIG(st), strsignal(WTERMSIG(st)), stopped, stopped == 1 ? "" : "s");
        } else {
            exit_code = WEXITSTATUS(st);
            fprintf(stderr, "fulgur run: rank %ld (pid %d) exited with code %d; stopped the other "
                            "%d rank%s\n",
                    rank, (int)p, exit_code, stopped, stopped == 1 ? "" : "s");
        }
    }
    free(pids);
    free(done);
    if (!exit_code && forwarded) exit_code = 128 + forwarded;
    return exit_code;
}
