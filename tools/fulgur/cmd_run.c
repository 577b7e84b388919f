/* fulgur run: torchrun's job, on the launch layer (fg_job_start).
 *
 * Starts --nproc-per-node copies of a program on this machine with the
 * environment contract (global rank = node_rank * nproc + local rank),
 * forwards SIGINT, SIGTERM, SIGHUP, SIGQUIT and SIGUSR1 to them (SIGKILL
 * after the grace period to a rank still running after one of the first
 * four), stops the rest when one fails, and exits with that rank's code (128
 * + signal when it was killed), printing one line that names the rank and
 * why. With --max-restarts K a failed group is started again, up to K
 * times; a rank that exits 75 (EX_TEMPFAIL: stopped with a checkpoint to
 * resume from, as fulgur fit after SIGUSR1) is not restarted here, nor one
 * that exits 2 (a usage error: bad flags or a missing file fail again).
 *
 * Signals: they are blocked in every thread before the ranks start (a rank
 * resets its mask before exec) and taken by one thread with sigwait, which
 * forwards them through fg_job_signal; the main thread only waits. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cli_flags.h"
#include "run_hosts.h"

static const char *const k_usage =
    "fulgur run [--nproc-per-node N] [--nnodes N --node-rank R --master-addr A --master-port P] "
    "[--max-restarts K] [--] PROGRAM [ARGS...]\n"
    "       fulgur run --hosts HOST:N,HOST:N,... [--nnodes MIN:MAX] [--max-restarts K] "
    "[--rsh-agent CMD] [--network NET] [--dry-run] [--] PROGRAM [ARGS...]";

/* --------------------------------------------------- signal forwarding */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static fg_job *g_job;     /* the running group, NULL between groups */
static int g_got;         /* the last signal that ends the job, 0 if none */
static double g_got_time; /* when the first such signal came (fg_time) */
static int g_forwarded;   /* ranks it was forwarded to */

/* SIGUSR1 (SLURM's "time is nearly up": checkpoint and stop) is forwarded
 * too, but does not end the job by itself: ranks that ignore it run on. */
static const int k_forward[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1};

static void forward_set(sigset_t *set) {
    sigemptyset(set);
    for (size_t i = 0; i < sizeof k_forward / sizeof k_forward[0]; i++)
        sigaddset(set, k_forward[i]);
}

static void *signal_thread(void *arg) {
    (void)arg;
    sigset_t set;
    forward_set(&set);
    for (;;) {
        int sig;
        if (sigwait(&set, &sig) != 0) continue;
        pthread_mutex_lock(&g_mu);
        if (sig != SIGUSR1) {
            if (!g_got) g_got_time = fg_time();
            g_got = sig;
        }
        if (g_job) g_forwarded = fg_job_signal(g_job, sig);
        pthread_mutex_unlock(&g_mu);
    }
    return NULL;
}

/* ------------------------------------------------------------- flags */

/* torchrun spells its flags both ways: --nproc_per_node = --nproc-per-node. */
static char *dashed(const char *a) {
    char *c = strdup(a);
    if (!c) return NULL;
    for (char *p = c + 2; *p && *p != '='; p++)
        if (*p == '_') *p = '-';
    return c;
}

static bool is_bool_flag(const char *a) {
    return !strcmp(a, "--standalone") || !strcmp(a, "--help") || !strcmp(a, "-h") ||
           !strcmp(a, "--dry-run");
}

/* "4" or "auto"/"cpu" (the CPU devices here) into *n; false on junk. */
static bool parse_nproc(const char *s, int64_t *n) {
    fg_clear_error();
    if (!strcmp(s, "auto") || !strcmp(s, "cpu")) {
        int d;
        if (fg_launch_cpu_devices(&d) != FG_OK) return false;
        *n = d;
        return true;
    }
    return cli_parse_int(s, n);
}

static void more_help(void) {
    printf("\nEach rank gets fulgur's FULGUR_RANK, FULGUR_WORLD_SIZE, FULGUR_LOCAL_RANK,\n"
           "FULGUR_LOCAL_WORLD_SIZE, FULGUR_NODE_RANK, FULGUR_NUM_NODES, FULGUR_MASTER_ADDR,\n"
           "FULGUR_MASTER_PORT, FULGUR_JOB_ID (fresh for each run) and torchrun's RANK,\n"
           "WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, GROUP_RANK, GROUP_WORLD_SIZE,\n"
           "MASTER_ADDR, MASTER_PORT; global rank = node rank x nproc-per-node + local rank.\n"
           "OMP_NUM_THREADS is set to cores / nproc-per-node (or FULGUR_NUM_THREADS) unless\n"
           "already set. Each rank is its own process group and dies if fulgur run dies.\n"
           "Several machines: --hosts h1:2,h2:2 starts the whole job from this machine\n"
           "through Open MPI's mpirun (and its remote agent, ssh unless --rsh-agent), with\n"
           "the flags it needs; the ranks of a host are consecutive, shm moves data inside a\n"
           "host and Open MPI between hosts. Started by hand on each machine (--nnodes,\n"
           "--node-rank), the ranks have no way to reach the other machines and refuse to\n"
           "start, naming the --hosts command to use instead. With --nnodes MIN:MAX (and\n"
           "--max-restarts K), --hosts is elastic: the job starts on the first MAX hosts\n"
           "that answer (at least MIN), and when a rank fails its host leaves the job and\n"
           "the job starts again on the others while MIN remain and restarts are left.\n"
           "\n"
           "SIGINT, SIGTERM, SIGHUP, SIGQUIT and SIGUSR1 are forwarded to every rank; a rank\n"
           "still running --grace seconds after one of the first four gets SIGKILL. When a\n"
           "rank fails (non-zero exit or a signal), the others get SIGTERM, then SIGKILL\n"
           "after FULGUR_KILL_GRACE_S seconds (default 3; at once for a stopped rank), and\n"
           "fulgur run prints which rank failed and why. What a rank started (a script's\n"
           "children) is killed with it, also when fulgur run itself is killed.\n"
           "\n"
           "Exit status: 0 when every rank exits 0; the failed rank's code, or 128 + signal\n"
           "when it was killed; 128 + signal after a forwarded signal; 75 when a rank\n"
           "stopped with a checkpoint to resume from (fulgur fit after SIGUSR1; no restart);\n"
           "2 for bad flags (nothing started; a rank that exits 2, a usage error, is not\n"
           "restarted either); 127 when the program cannot be found or\n"
           "executed.\n");
}

/* --nnodes MIN:MAX with MIN > 1 (or a --node-rank) without --hosts: torchrun
 * would wait for other machines to join; here they join only through
 * --hosts, started from one machine. Prints the command that works. */
static void elastic_refusal(const char *nnodes_s, int64_t nproc, int64_t restarts, char **prog) {
    char me[256] = "THIS_HOST", cmd[2048];
    gethostname(me, sizeof me - 1);
    const char *colon = strchr(nnodes_s, ':');
    int max = atoi(colon + 1);
    size_t k = 0;
    k += (size_t)snprintf(cmd + k, sizeof cmd - k, "fulgur run --hosts %s:%lld", me,
                          (long long)nproc);
    for (int i = 1; i < max && i < 4 && k < sizeof cmd; i++)
        k += (size_t)snprintf(cmd + k, sizeof cmd - k, ",HOST%d:%lld", i, (long long)nproc);
    if (max > 4 && k < sizeof cmd) k += (size_t)snprintf(cmd + k, sizeof cmd - k, ",...");
    if (k < sizeof cmd) k += (size_t)snprintf(cmd + k, sizeof cmd - k, " --nnodes %s", nnodes_s);
    if (restarts && k < sizeof cmd)
        k += (size_t)snprintf(cmd + k, sizeof cmd - k, " --max-restarts %lld", (long long)restarts);
    if (k < sizeof cmd) k += (size_t)snprintf(cmd + k, sizeof cmd - k, " --");
    for (int i = 0; prog[i] && k < sizeof cmd; i++)
        k += (size_t)snprintf(cmd + k, sizeof cmd - k, " %s", prog[i]);
    if (k >= sizeof cmd) strcpy(cmd + sizeof cmd - 5, "...");
    cli_error("--nnodes=\"%s\": the other machines of an elastic job are started from this one; "
              "started on its own, this machine is one node, below the minimum. Run once, here:\n"
              "  %s\n(HOST1, ... = the other machines)",
              nnodes_s, cmd);
}

/* Runs the command once the flags (fa[1..split), dashed) are split from
 * the program (argv[split..]). */
static int run_flags(int argc, char **argv, int split, char **fa) {
    const char *nproc_s, *nnodes_s, *addr, *job_id, *hosts, *rsh_agent, *network, *mpirun;
    int64_t node_rank, port, restarts;
    double grace;
    bool standalone, dry_run;
    cli_flag flags[] = {
        {.name = "hosts",
         .type = CLI_STR,
         .dst = &hosts,
         .help = "run across machines from here: HOST:N,HOST:N,... (N ranks on each; a HOST "
                 "without :N gets --nproc-per-node) through Open MPI's mpirun"},
        {.name = "rsh-agent",
         .type = CLI_STR,
         .dst = &rsh_agent,
         .help = "with --hosts: the command that runs a command on another host (Open MPI's "
                 "plm_rsh_agent) [default: ssh]"},
        {.name = "network",
         .type = CLI_STR,
         .dst = &network,
         .help = "with --hosts: the subnet (10.0.0.0/24) or interface Open MPI's traffic uses"},
        {.name = "mpirun",
         .type = CLI_STR,
         .dst = &mpirun,
         .def = "mpirun",
         .help = "with --hosts: the mpirun to run"},
        {.name = "dry-run",
         .type = CLI_BOOL,
         .dst = &dry_run,
         .help = "with --hosts: print the mpirun command instead of running it"},
        {.name = "nproc-per-node",
         .type = CLI_STR,
         .dst = &nproc_s,
         .def = "1",
         .help = "ranks to start on this machine: a number, or auto (one per CPU device: the "
                 "cores, or FULGUR_CPU_DEVICES)"},
        {.name = "nnodes",
         .type = CLI_STR,
         .dst = &nnodes_s,
         .def = "1",
         .help = "machines in the job, or MIN:MAX with --hosts (elastic: the job runs on the "
                 "hosts that answer, at least MIN, and goes on without a host whose ranks "
                 "failed while --max-restarts allows)"},
        {.name = "node-rank",
         .type = CLI_INT,
         .dst = &node_rank,
         .def = "0",
         .min = 0,
         .max = 65535,
         .help = "this machine's index, 0 .. nnodes-1"},
        {.name = "master-addr",
         .type = CLI_STR,
         .dst = &addr,
         .def = "127.0.0.1",
         .help = "address of node 0 (MASTER_ADDR)"},
        {.name = "master-port",
         .type = CLI_INT,
         .dst = &port,
         .def = "0",
         .min = 0,
         .max = 65535,
         .help = "port on node 0 (MASTER_PORT); 0: a free port on one node, 29500 with several"},
        {.name = "job-id",
         .type = CLI_STR,
         .dst = &job_id,
         .help = "FULGUR_JOB_ID of the ranks (names the shared memory) [default: fresh on one "
                 "node; master-addr:master-port with several, so that all nodes agree]"},
        {.name = "max-restarts",
         .type = CLI_INT,
         .dst = &restarts,
         .def = "0",
         .min = 0,
         .max = 1000,
         .help = "start the ranks again after a failure, up to N times (with --hosts: the "
                 "whole job; they see FULGUR_RESTART_COUNT and TORCHELASTIC_RESTART_COUNT)"},
        {.name = "grace",
         .type = CLI_DOUBLE,
         .dst = &grace,
         .def = "0",
         .help = "seconds between SIGTERM and SIGKILL when ranks are stopped; 0: "
                 "FULGUR_KILL_GRACE_S, else 3"},
        {.name = "standalone",
         .type = CLI_BOOL,
         .dst = &standalone,
         .help = "one machine on its own (torchrun's flag; the default here)"},
    };
    int nflags = (int)(sizeof flags / sizeof flags[0]);
    int rc = cli_flags_parse(flags, nflags, split, fa, k_usage, NULL, 0, NULL);
    if (rc < 0) {
        more_help();
        return FG_EXIT_OK;
    }
    if (rc) return rc;

    int64_t nproc, nnodes;
    bool elastic = false; /* --nnodes MIN:MAX with MIN < MAX */
    int min_nodes = 1, max_nodes = 1;
    if (!parse_nproc(nproc_s, &nproc)) {
        if (fg_last_status() != FG_OK) /* auto: FULGUR_CPU_DEVICES is the bad value */
            cli_error("--nproc-per-node=%s: %s", nproc_s, fg_last_error());
        else cli_error("--nproc-per-node=\"%s\": expected 1..%d or auto", nproc_s, FG_DEVICES_MAX);
        return FG_EXIT_USAGE;
    }
    if (nproc < 1 || nproc > FG_DEVICES_MAX) {
        cli_error("--nproc-per-node=\"%s\": expected 1..%d or auto", nproc_s, FG_DEVICES_MAX);
        return FG_EXIT_USAGE;
    }
    /* the grace after a forwarded signal; checked before anything starts */
    double env_grace;
    if (!cli_env_double("FULGUR_KILL_GRACE_S", 3, &env_grace)) return FG_EXIT_USAGE;
    if (!(env_grace > 0)) {
        cli_error("FULGUR_KILL_GRACE_S=\"%s\": expected a number of seconds above 0 (unset it "
                  "for the default, 3)",
                  getenv("FULGUR_KILL_GRACE_S"));
        return FG_EXIT_USAGE;
    }
    const char *colon = strchr(nnodes_s, ':');
    if (colon) {
        int64_t lo, hi;
        char lo_s[32];
        snprintf(lo_s, sizeof lo_s, "%.*s", (int)(colon - nnodes_s), nnodes_s);
        if (!cli_parse_int(lo_s, &lo) || !cli_parse_int(colon + 1, &hi) || lo < 1 || hi < lo) {
            cli_error("--nnodes=\"%s\": expected N, or MIN:MAX with 1 <= MIN <= MAX", nnodes_s);
            return FG_EXIT_USAGE;
        }
        if (hi > RUN_HOSTS_MAX) {
            cli_error("--nnodes=\"%s\": at most %d nodes", nnodes_s, RUN_HOSTS_MAX);
            return FG_EXIT_USAGE;
        }
        nnodes = lo;
        if (lo != hi) {
            elastic = true;
            min_nodes = (int)lo;
            max_nodes = (int)hi;
        }
    } else if (!cli_parse_int(nnodes_s, &nnodes) || nnodes < 1 || nnodes > 65536) {
        cli_error("--nnodes=\"%s\": expected a number of nodes, 1..65536", nnodes_s);
        return FG_EXIT_USAGE;
    }
    if (node_rank >= nnodes) {
        cli_error("--node-rank=%lld: must be below --nnodes %lld (0 .. %lld)", (long long)node_rank,
                  (long long)nnodes, (long long)nnodes - 1);
        return FG_EXIT_USAGE;
    }
    if (standalone && nnodes > 1) {
        cli_error("--standalone: one machine on its own, but --nnodes %lld", (long long)nnodes);
        return FG_EXIT_USAGE;
    }
    if (!*addr || strlen(addr) >= FG_CLUSTER_ADDR_MAX) {
        cli_error("--master-addr=\"%s\": expected a host name or address", addr);
        return FG_EXIT_USAGE;
    }
    if (grace < 0) {
        cli_error("--grace=%g: expected 0 or more seconds", grace);
        return FG_EXIT_USAGE;
    }
    if (job_id && (!*job_id || strlen(job_id) >= FG_CLUSTER_JOB_MAX - 16)) {
        cli_error("--job-id=\"%s\": expected 1..%d characters", job_id, FG_CLUSTER_JOB_MAX - 17);
        return FG_EXIT_USAGE;
    }
    int prog = split < argc && !strcmp(argv[split], "--") ? split + 1 : split;
    if (prog >= argc) {
        cli_error("no program to run\nusage: %s", k_usage);
        return FG_EXIT_USAGE;
    }
    if (elastic && !hosts) {
        if (min_nodes > 1 || node_rank) {
            elastic_refusal(nnodes_s, nproc, restarts, argv + prog);
            return FG_EXIT_USAGE;
        }
        /* torchrun on one machine: its agent is the only node that joins */
        fprintf(stderr,
                "fulgur run: --nnodes %s without --hosts: this machine is the only node (%lld "
                "rank%s); other machines join through --hosts\n",
                nnodes_s, (long long)nproc, nproc == 1 ? "" : "s");
        nnodes = 1;
    }
    if (hosts) {
        if (!elastic && (nnodes > 1 || node_rank)) {
            cli_error("--hosts starts every machine's ranks from here: drop --nnodes and "
                      "--node-rank");
            return FG_EXIT_USAGE;
        }
        run_hosts_opts ho = {.hosts = hosts,
                             .default_slots = (int)nproc,
                             .mpirun = mpirun,
                             .rsh_agent = rsh_agent,
                             .network = network,
                             .dry_run = dry_run};
        if (elastic && node_rank) {
            cli_error("--hosts starts every machine's ranks from here: drop --node-rank");
            return FG_EXIT_USAGE;
        }
        if (elastic || restarts)
            return run_hosts_elastic(&ho, min_nodes, max_nodes, elastic, (int)restarts,
                                     argv + prog);
        return run_hosts(&ho, argv + prog);
    }
    if (rsh_agent || network || dry_run) {
        cli_error("--%s goes with --hosts", rsh_agent ? "rsh-agent"
                                            : network ? "network"
                                                      : "dry-run");
        return FG_EXIT_USAGE;
    }
    if (nnodes > 1 && !port) port = 29500;

    /* kernel threads: each rank gets its share unless told */
    if (!getenv("OMP_NUM_THREADS")) {
        int t;
        if (fg_launch_threads_per_rank((int)nproc, &t, NULL) != FG_OK) {
            cli_error("%s", fg_last_error());
            return FG_EXIT_USAGE;
        }
        char b[16];
        snprintf(b, sizeof b, "%d", t);
        setenv("OMP_NUM_THREADS", b, 1);
    }

    sigset_t set;
    forward_set(&set);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    pthread_t sig_thread;
    if (pthread_create(&sig_thread, NULL, signal_thread, NULL) != 0) {
        cli_error("cannot start the signal thread");
        return FG_EXIT_FAIL;
    }
    pthread_detach(sig_thread);

    char max_s[16];
    snprintf(max_s, sizeof max_s, "%lld", (long long)restarts);
    setenv("TORCHELASTIC_MAX_RESTARTS", max_s, 1);
    double kill_grace = grace > 0 ? grace : env_grace;
    int exit_code = 0;
    for (int attempt = 0;; attempt++) {
        char count[16], jid[FG_CLUSTER_JOB_MAX];
        snprintf(count, sizeof count, "%d", attempt);
        setenv("FULGUR_RESTART_COUNT", count, 1);
        setenv("TORCHELASTIC_RESTART_COUNT", count, 1);
        const char *use_id = NULL;
        if (job_id) {
            snprintf(jid, sizeof jid, attempt ? "%s-r%d" : "%s", job_id, attempt);
            use_id = jid;
        } else if (nnodes > 1) {
            snprintf(jid, sizeof jid, attempt ? "%.200s:%d-r%d" : "%.200s:%d", addr, (int)port,
                     attempt);
            use_id = jid;
        }
        fg_job_spec spec = {.argv = (const char *const *)(argv + prog),
                            .nprocs = (int)nproc,
                            .node_rank = (int)node_rank,
                            .num_nodes = (int)nnodes,
                            .master_addr = addr,
                            .master_port = (int)port,
                            .job_id = use_id};
        pthread_mutex_lock(&g_mu);
        int got = g_got;
        fg_job *job = got ? NULL : fg_job_start(&spec, &(fg_job_opts){.grace_s = grace});
        g_job = job;
        pthread_mutex_unlock(&g_mu);
        if (got) { /* a signal came between two groups: no restart */
            exit_code = 128 + got;
            break;
        }
        if (!job) {
            fprintf(stderr, "fulgur run: %s\n", fg_last_error());
            exit_code = attempt ? FG_EXIT_FAIL : 127;
            break;
        }
        /* After a forwarded signal the ranks get the grace period to finish
         * (a fit saves a checkpoint), then SIGKILL: a rank that ignores
         * SIGTERM does not hold the job forever. */
        bool killed = false;
        while (fg_job_wait(job, 0.1) == FG_ETIMEOUT) {
            pthread_mutex_lock(&g_mu);
            bool late = g_got && fg_time() - g_got_time >= kill_grace;
            pthread_mutex_unlock(&g_mu);
            if (late && !killed) {
                int n = fg_job_signal(job, SIGKILL);
                fprintf(stderr,
                        "fulgur run: %d rank%s still running %.3g s after the signal: "
                        "sent SIGKILL\n",
                        n, n == 1 ? "" : "s", kill_grace);
                killed = true;
            }
        }
        fg_job_status st;
        fg_job_get_status(job, &st);
        pthread_mutex_lock(&g_mu);
        g_job = NULL;
        got = g_got;
        int forwarded = g_forwarded;
        pthread_mutex_unlock(&g_mu);
        fg_job_free(job);
        if (got) {
            const char *abbrev = sigabbrev_np(got);
            fprintf(stderr, "fulgur run: got SIG%s; forwarded it to %d rank%s\n",
                    abbrev ? abbrev : "?", forwarded, forwarded == 1 ? "" : "s");
            /* a rank that stopped resumably (fulgur fit saved a checkpoint) says so */
            exit_code = fg_rank_exit_status(&st.failed) == FG_EXIT_RESUMABLE ? FG_EXIT_RESUMABLE
                                                                             : 128 + got;
            break;
        }
        if (st.failed.rank < 0) {
            exit_code = 0;
            break;
        }
        char how[160], others[64];
        fg_rank_exit_format(&st.failed, how, sizeof how);
        exit_code = fg_rank_exit_status(&st.failed);
        if (exit_code == FG_EXIT_RESUMABLE) { /* stopped on purpose: resume later, not now */
            fprintf(stderr,
                    "fulgur run: %s (stopped with a checkpoint to resume from); not restarting\n",
                    how);
            break;
        }
        if (exit_code == FG_EXIT_USAGE && attempt < restarts) {
            /* a usage error (bad flags, a missing file) fails the same way again */
            fprintf(stderr,
                    "fulgur run: %s (exit 2: a usage error, which a restart would repeat); not "
                    "restarting\n",
                    how);
            break;
        }
        if (st.stopped)
            snprintf(others, sizeof others, "stopped the other %d rank%s", st.stopped,
                     st.stopped == 1 ? "" : "s");
        else snprintf(others, sizeof others, "no other rank was running");
        if (attempt < restarts)
            fprintf(stderr, "fulgur run: %s; %s; restarting the %lld ranks (restart %d of %lld)\n",
                    how, others, (long long)nproc, attempt + 1, (long long)restarts);
        else fprintf(stderr, "fulgur run: %s; %s\n", how, others);
        if (attempt >= restarts) break;
    }
    return exit_code;
}

int cmd_run(int argc, char **argv) {
    /* Flags end at "--" or at the first word that is not a flag: the program. */
    int split = argc;
    char **fa = calloc((size_t)argc + 1, sizeof *fa);
    if (!fa) {
        cli_error("out of memory");
        return FG_EXIT_FAIL;
    }
    fa[0] = argv[0];
    int rc = FG_EXIT_OK;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--") || argv[i][0] != '-' || !argv[i][1]) {
            split = i;
            break;
        }
        fa[i] = strncmp(argv[i], "--", 2) ? argv[i] : dashed(argv[i]);
        if (!fa[i]) {
            cli_error("out of memory");
            rc = FG_EXIT_FAIL;
            break;
        }
        if (!strchr(fa[i], '=') && !is_bool_flag(fa[i]) && i + 1 < argc) {
            i++;
            fa[i] = argv[i];
        }
    }
    if (rc == FG_EXIT_OK) rc = run_flags(argc, argv, split, fa);
    for (int i = 1; i < argc; i++)
        if (fa[i] != argv[i]) free(fa[i]);
    free(fa);
    return rc;
}
