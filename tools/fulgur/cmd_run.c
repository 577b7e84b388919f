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
 * The loop itself, the restarts, the rendezvous and the signal forwarding
 * are the library's agent (fg_agent_run, src/launch/agent.c): this file is
 * the flags and the call, and prints the agent's fg_log lines. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cli_flags.h"

static const char *const k_usage =
    "fulgur run [--nproc-per-node N] [--nnodes N --node-rank R --master-addr A --master-port P "
    "[--rdzv-backend static|c10d|none] [--rdzv-endpoint A:P] [--rdzv-id ID] [--rdzv-timeout S]] "
    "[--max-restarts K] [--] PROGRAM [ARGS...]\n"
    "       fulgur run --hosts HOST:N,HOST:N,... [--nnodes MIN:MAX] [--max-restarts K] "
    "[--rsh-agent CMD] [--network NET] [--dry-run] [--] PROGRAM [ARGS...]";

/* The library's lines (the rendezvous: a node held for the next round, one
 * refused) as the command's own. */
static void run_log(void *ud, fg_log_level level, int rank, const char *msg) {
    (void)ud;
    (void)level;
    (void)rank;
    fprintf(stderr, "fulgur run: %s\n", msg);
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
           "host and Open MPI between hosts. Started on each machine instead (torchrun's\n"
           "--nnodes N --node-rank R --master-addr A --master-port P, or a scheduler's\n"
           "equivalent), node 0 listens on P and waits --rdzv-timeout seconds for every node\n"
           "(each must give the same --nnodes and --nproc-per-node, and its own node rank),\n"
           "starts Open MPI's ompi-server, and the ranks join one Open MPI world through it;\n"
           "when a node's ranks fail every node stops its ranks, naming that node and rank.\n"
           "--rdzv-backend c10d --rdzv-endpoint A:P --rdzv-id ID is torchrun's spelling of\n"
           "the same; --rdzv-backend none skips the rendezvous. Elastic, --nnodes MIN:MAX\n"
           "on each machine: the machine of --master-addr holds the rendezvous, the job forms\n"
           "with MAX nodes or those that came FULGUR_RDZV_LAST_CALL_S (10 s) after the MIN-th,\n"
           "node ranks in order of arrival; with --max-restarts every node meets again after a\n"
           "failure (a lost node is left out, a new one may join). With --nnodes MIN:MAX (and\n"
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

/* --hosts: mpirun becomes this process (a fixed list, no restarts), or the
 * agent runs it as a child it starts again (src/launch/hosts.c). */
static int run_on_hosts(const fg_hosts_opts *ho, bool elastic, int min_nodes, int max_nodes,
                        int restarts, bool dry_run, double grace, const char *const *prog) {
    char **cmd;
    int n;
    if (fg_hosts_command(ho, elastic ? max_nodes : 0, prog, &cmd, &n) != FG_OK) {
        cli_error("%s", fg_last_error());
        return FG_EXIT_USAGE;
    }
    bool agent = elastic || restarts;
    if (elastic && n < min_nodes) {
        cli_error("--nnodes %d:%d: --hosts lists %d host%s; list at least %d", min_nodes, max_nodes,
                  n, n == 1 ? "" : "s", min_nodes);
        fg_hosts_command_free(cmd);
        return FG_EXIT_USAGE;
    }
    if (dry_run) {
        if (agent)
            printf("(each start, on the first %d hosts that answer of %d:)\n",
                   elastic && max_nodes < n ? max_nodes : n, n);
        for (int i = 0; cmd[i]; i++) printf("%s%s", i ? " " : "", cmd[i]);
        printf("\n");
        fg_hosts_command_free(cmd);
        return FG_EXIT_OK;
    }
    if (!agent) {
        fflush(stdout);
        fflush(stderr);
        execvp(cmd[0], cmd);
        cli_error("--hosts: cannot run %s (%s): install Open MPI (apt-get install openmpi-bin) "
                  "or give its path with --mpirun",
                  cmd[0], strerror(errno));
        fg_hosts_command_free(cmd);
        return 127;
    }
    fg_hosts_command_free(cmd);
    fg_agent_opts ao = {.argv = prog,
                        .nproc_per_node = ho->default_slots,
                        .num_nodes = elastic ? max_nodes : 0,
                        .min_nodes = elastic ? min_nodes : 0,
                        .max_restarts = restarts,
                        .grace_s = grace,
                        .hosts = ho};
    fg_agent_result res;
    fg_set_log(run_log, NULL, FG_LOG_INFO);
    fg_status st = fg_agent_run(&ao, &res);
    fg_set_log(NULL, NULL, FG_LOG_INFO);
    if (st == FG_EINVAL && res.exit_code == FG_EXIT_USAGE) cli_error("%s", fg_last_error());
    return res.exit_code;
}

/* The flags of run, as given. */
typedef struct run_opts {
    const char *nproc_s;
    const char *nnodes_s;
    const char *addr;
    const char *job_id;
    const char *hosts;
    const char *rsh_agent;
    const char *network;
    const char *mpirun;
    const char *rdzv_backend;
    const char *rdzv_endpoint;
    const char *rdzv_id;
    int64_t node_rank;
    int64_t port;
    int64_t restarts;
    double grace;
    double rdzv_timeout;
    bool standalone;
    bool dry_run;
} run_opts;

static const cli_flag_def k_run_flags[] = {
    {.name = "hosts",
     .type = CLI_STR,
     .off = offsetof(run_opts, hosts),
     .help = "run across machines from here: HOST:N,HOST:N,... (N ranks on each; a HOST "
             "without :N gets --nproc-per-node) through Open MPI's mpirun"},
    {.name = "rsh-agent",
     .type = CLI_STR,
     .off = offsetof(run_opts, rsh_agent),
     .help = "with --hosts: the command that runs a command on another host (Open MPI's "
             "plm_rsh_agent) [default: ssh]"},
    {.name = "network",
     .type = CLI_STR,
     .off = offsetof(run_opts, network),
     .help = "with --hosts: the subnet (10.0.0.0/24) or interface Open MPI's traffic uses"},
    {.name = "mpirun",
     .type = CLI_STR,
     .off = offsetof(run_opts, mpirun),
     .def = "mpirun",
     .help = "with --hosts: the mpirun to run"},
    {.name = "dry-run",
     .type = CLI_BOOL,
     .off = offsetof(run_opts, dry_run),
     .help = "with --hosts: print the mpirun command instead of running it"},
    {.name = "nproc-per-node",
     .type = CLI_STR,
     .off = offsetof(run_opts, nproc_s),
     .def = "1",
     .help = "ranks to start on this machine: a number, or auto (one per CPU device: the "
             "cores, or FULGUR_CPU_DEVICES)"},
    {.name = "nnodes",
     .type = CLI_STR,
     .off = offsetof(run_opts, nnodes_s),
     .def = "1",
     .help = "machines in the job, or MIN:MAX (elastic: with --hosts the job runs on the "
             "hosts that answer, at least MIN; started on each machine, the nodes that "
             "join the rendezvous at --master-addr, at least MIN, ranks in order of "
             "arrival; with --max-restarts it goes on without a failed node, and a node "
             "may join at a restart)"},
    {.name = "node-rank",
     .type = CLI_INT,
     .off = offsetof(run_opts, node_rank),
     .def = "0",
     .min = 0,
     .max = 65535,
     .help = "this machine's index, 0 .. nnodes-1"},
    {.name = "master-addr",
     .type = CLI_STR,
     .off = offsetof(run_opts, addr),
     .def = "127.0.0.1",
     .help = "address of node 0 (MASTER_ADDR)"},
    {.name = "master-port",
     .type = CLI_INT,
     .off = offsetof(run_opts, port),
     .def = "0",
     .min = 0,
     .max = 65535,
     .help = "port on node 0 (MASTER_PORT); 0: a free port on one node, 29500 with several"},
    {.name = "job-id",
     .type = CLI_STR,
     .off = offsetof(run_opts, job_id),
     .help = "FULGUR_JOB_ID of the ranks (names the shared memory) [default: fresh on one "
             "node; master-addr:master-port with several, so that all nodes agree]"},
    {.name = "max-restarts",
     .type = CLI_INT,
     .off = offsetof(run_opts, restarts),
     .def = "0",
     .min = 0,
     .max = 1000,
     .help = "start the ranks again after a failure, up to N times (with --hosts: the "
             "whole job; they see FULGUR_RESTART_COUNT and TORCHELASTIC_RESTART_COUNT)"},
    {.name = "rdzv-backend",
     .type = CLI_STR,
     .off = offsetof(run_opts, rdzv_backend),
     .def = "static",
     .help = "with --nnodes N on each machine: static (node 0 at --master-addr:--master-port "
             "gathers the nodes), c10d (the same at --rdzv-endpoint, job --rdzv-id, as "
             "torchrun's), or none (no rendezvous: the ranks get the contract only, for a "
             "program that finds its peers itself)"},
    {.name = "rdzv-endpoint",
     .type = CLI_STR,
     .off = offsetof(run_opts, rdzv_endpoint),
     .help = "with --rdzv-backend c10d: HOST:PORT of node 0 (torchrun's; it becomes the "
             "master address and port)"},
    {.name = "rdzv-id",
     .type = CLI_STR,
     .off = offsetof(run_opts, rdzv_id),
     .help = "with --rdzv-backend c10d: the job's id, the same on every node (the job id "
             "and TORCHELASTIC_RUN_ID)"},
    {.name = "rdzv-timeout",
     .type = CLI_DOUBLE,
     .off = offsetof(run_opts, rdzv_timeout),
     .def = "0",
     .help = "with --nnodes N on each machine: seconds node 0 waits for every node to join "
             "(and the others for node 0); 0: FULGUR_RDZV_TIMEOUT_S, else 300"},
    {.name = "grace",
     .type = CLI_DOUBLE,
     .off = offsetof(run_opts, grace),
     .def = "0",
     .help = "seconds between SIGTERM and SIGKILL when ranks are stopped; 0: "
             "FULGUR_KILL_GRACE_S, else 3"},
    {.name = "standalone",
     .type = CLI_BOOL,
     .off = offsetof(run_opts, standalone),
     .help = "one machine on its own (torchrun's flag; the default here)"},
};

/* Runs the command once the flags (fa[1..split), dashed) are split from
 * the program (argv[split..]). */
static int run_flags(int argc, char **argv, int split, char **fa) {
    run_opts given = {0};
    cli_flag flags[CLI_COUNT(k_run_flags)];
    cli_flags_bind(k_run_flags, CLI_COUNT(k_run_flags), &given, flags);
    int nflags = CLI_COUNT(k_run_flags);
    int rc = cli_flags_parse(flags, nflags, split, fa, k_usage, NULL, 0, NULL);
    if (rc < 0) {
        more_help();
        return FG_EXIT_OK;
    }
    if (rc) return rc;
    const char *nproc_s = given.nproc_s, *nnodes_s = given.nnodes_s, *addr = given.addr,
               *job_id = given.job_id, *hosts = given.hosts, *rsh_agent = given.rsh_agent,
               *network = given.network, *mpirun = given.mpirun, *rdzv_backend = given.rdzv_backend,
               *rdzv_endpoint = given.rdzv_endpoint, *rdzv_id = given.rdzv_id;
    int64_t node_rank = given.node_rank, port = given.port, restarts = given.restarts;
    double grace = given.grace, rdzv_timeout = given.rdzv_timeout;
    bool standalone = given.standalone, dry_run = given.dry_run;

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
        if (hi > FG_HOSTS_MAX) {
            cli_error("--nnodes=\"%s\": at most %d nodes", nnodes_s, FG_HOSTS_MAX);
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
    if (hosts) {
        if (!elastic && (nnodes > 1 || node_rank)) {
            cli_error("--hosts starts every machine's ranks from here: drop --nnodes and "
                      "--node-rank");
            return FG_EXIT_USAGE;
        }
        if (elastic && node_rank) {
            cli_error("--hosts starts every machine's ranks from here: drop --node-rank");
            return FG_EXIT_USAGE;
        }
        return run_on_hosts(&(fg_hosts_opts){.hosts = hosts,
                                             .default_slots = (int)nproc,
                                             .mpirun = mpirun,
                                             .rsh_agent = rsh_agent,
                                             .network = network},
                            elastic, min_nodes, max_nodes, (int)restarts, dry_run,
                            grace > 0 ? grace : env_grace, (const char *const *)(argv + prog));
    }
    if (rsh_agent || network || dry_run) {
        cli_error("--%s goes with --hosts", rsh_agent ? "rsh-agent"
                                            : network ? "network"
                                                      : "dry-run");
        return FG_EXIT_USAGE;
    }
    bool rdzv_none = !strcmp(rdzv_backend, "none");
    if (strcmp(rdzv_backend, "static") && strcmp(rdzv_backend, "c10d") && !rdzv_none) {
        cli_error("--rdzv-backend=\"%s\": expected static, c10d or none", rdzv_backend);
        return FG_EXIT_USAGE;
    }
    if ((rdzv_endpoint || rdzv_id) && strcmp(rdzv_backend, "c10d")) {
        cli_error("--%s goes with --rdzv-backend c10d",
                  rdzv_endpoint ? "rdzv-endpoint" : "rdzv-id");
        return FG_EXIT_USAGE;
    }
    static char ep_addr[FG_CLUSTER_ADDR_MAX];
    if (rdzv_endpoint) {
        /* HOST:PORT (torchrun's default port 29400 when PORT is left out) */
        const char *c = strrchr(rdzv_endpoint, ':');
        int64_t p = 29400;
        size_t n = c ? (size_t)(c - rdzv_endpoint) : strlen(rdzv_endpoint);
        if (!n || n >= sizeof ep_addr || (c && (!cli_parse_int(c + 1, &p) || p < 1 || p > 65535))) {
            cli_error("--rdzv-endpoint=\"%s\": expected HOST:PORT (port 1..65535)", rdzv_endpoint);
            return FG_EXIT_USAGE;
        }
        snprintf(ep_addr, sizeof ep_addr, "%.*s", (int)n, rdzv_endpoint);
        addr = ep_addr;
        port = p;
    }
    if (rdzv_id) {
        if (!*rdzv_id || strlen(rdzv_id) >= FG_CLUSTER_JOB_MAX - 16 || strchr(rdzv_id, ' ')) {
            cli_error("--rdzv-id=\"%s\": expected 1..%d characters without spaces", rdzv_id,
                      FG_CLUSTER_JOB_MAX - 17);
            return FG_EXIT_USAGE;
        }
        if (!job_id) job_id = rdzv_id;
        setenv("TORCHELASTIC_RUN_ID", rdzv_id, 1);
    }
    if ((nnodes > 1 || elastic) && !port) port = 29500;
    if (rdzv_timeout < 0) {
        cli_error("--rdzv-timeout=%g: expected 0 or more seconds", rdzv_timeout);
        return FG_EXIT_USAGE;
    }

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

    /* torchrun's agent (src/launch/agent.c): the restarts, the rendezvous,
     * the signals; its lines are the command's */
    fg_agent_opts ao = {.argv = (const char *const *)(argv + prog),
                        .nproc_per_node = (int)nproc,
                        .num_nodes = elastic ? max_nodes : (int)nnodes,
                        .min_nodes = elastic ? min_nodes : 0,
                        .node_rank = elastic ? 0 : (int)node_rank,
                        .master_addr = addr,
                        .master_port = (int)port,
                        .job_id = job_id,
                        .no_rdzv = rdzv_none,
                        .rdzv_timeout_s = rdzv_timeout,
                        .mpi_server = fg_comm_backend_built(FG_COMM_MPI),
                        .max_restarts = (int)restarts,
                        .grace_s = grace > 0 ? grace : env_grace,
                        .stop_grace_s = grace};
    fg_agent_result res;
    fg_set_log(run_log, NULL, FG_LOG_INFO);
    fg_status st = fg_agent_run(&ao, &res);
    fg_set_log(NULL, NULL, FG_LOG_INFO);
    if (st == FG_EINVAL && res.exit_code == FG_EXIT_USAGE) { /* checked before anything ran */
        cli_error("%s", fg_last_error());
        return FG_EXIT_USAGE;
    }
    return res.exit_code;
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
