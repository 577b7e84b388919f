/* torchrun's agent over a list of hosts (fg_agent_opts.hosts, fulgur run
 * --hosts): the job across machines started from one of them through Open
 * MPI's mpirun and its remote agent (ssh by default), with the flags a user
 * would otherwise have to know:
 *   --host h1:2,h2:2 -np 4       the ranks and where they run (by slot: the
 *                                ranks of a host are consecutive)
 *   --bind-to none               fulgur sizes its own threads per rank
 *   --mca rtc_hwloc_vmhole none  Open MPI's daemon crashed inside hwloc at
 *                                start about one time in twelve without it
 *   --allow-run-as-root          when run by root
 *   -x NAME                      every FULGUR_*, HOROVOD_*, OMP_NUM_THREADS and
 *                                LD_LIBRARY_PATH set here (mpirun sends no
 *                                environment to the other machines unless
 *                                told), minus the rank contract, which
 *                                Open MPI's own variables replace
 *   --mca plm_rsh_agent CMD      rsh_agent
 *   --mca oob_tcp_if_include / btl_tcp_if_include NET   network
 * fg_hosts_command builds it (a caller may exec it: mpirun's own signals,
 * output and exit status); fg_agent_run with hosts runs it as a child and
 * starts it again after a failure, with torchrun's elastic membership:
 *
 * Each start first asks every host that is still in the job whether it
 * answers (the rsh agent runs `true` there, 10 s at most; this machine's
 * own names need no asking), and takes the first MAX that do. With fewer
 * than MIN nothing starts: the error names the hosts that are missing and
 * why. When the job fails, mpirun's report (passed on to stderr as it
 * comes) names the rank that failed first and its host: with MIN < MAX that
 * host leaves the job and the next start runs on the others (a host listed
 * beyond MAX joins instead), so long as MIN remain; with a fixed number of
 * hosts the same hosts start again. The ranks see FULGUR_RESTART_COUNT /
 * TORCHELASTIC_RESTART_COUNT (fulgur fit resumes from its newest checkpoint
 * on a count above 0, at the new world size). Signals come from the agent's
 * signalfd (agent.c) and go to mpirun, which forwards them to the ranks;
 * after one of the first four the job is not restarted. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launch_impl.h"

extern char **environ;

#define PROBE_TIMEOUT_S 10

/* The launch contract's variables: Open MPI's replace them on each rank. */
static bool is_contract(const char *name, size_t n) {
    static const char *const k[] = {
        "FULGUR_RANK",      "FULGUR_WORLD_SIZE",   "FULGUR_LOCAL_RANK",  "FULGUR_LOCAL_WORLD_SIZE",
        "FULGUR_NODE_RANK", "FULGUR_NUM_NODES",    "FULGUR_MASTER_ADDR", "FULGUR_MASTER_PORT",
        "FULGUR_JOB_ID",    "FULGUR_RESTART_COUNT"};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (strlen(k[i]) == n && !strncmp(k[i], name, n)) return true;
    return false;
}

static bool exported(const char *name, size_t n) {
    if (n > 7 && !strncmp(name, "FULGUR_", 7)) return !is_contract(name, n);
    if (n > 8 && !strncmp(name, "HOROVOD_", 8)) return true;
    return (n == 15 && !strncmp(name, "OMP_NUM_THREADS", n)) ||
           (n == 15 && !strncmp(name, "LD_LIBRARY_PATH", n));
}

/* "h1:2,h2:2" or "h1,h2" (each with default_slots) into hosts[0..*n) (at
 * most cap); FG_EINVAL naming what is wrong. */
static FG_MUST_USE fg_status hosts_parse(const char *spec, int default_slots, fg__host *hosts,
                                         int cap, int *n) {
    *n = 0;
    const char *p = spec;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char item[sizeof hosts->name + 8];
        if (len == 0 || len >= sizeof item) {
            return fg_error(FG_EINVAL,
                            "--hosts=\"%s\": expected HOST:N,HOST:N,... (an empty or too long "
                            "entry)",
                            spec);
        }
        memcpy(item, p, len);
        item[len] = 0;
        char *colon = strrchr(item, ':');
        long slots = default_slots;
        if (colon) {
            char *e;
            slots = strtol(colon + 1, &e, 10);
            if (e == colon + 1 || *e || slots < 1 || slots > 4096) {
                return fg_error(FG_EINVAL,
                                "--hosts=\"%s\": \"%s\": the count after ':' must be 1..4096", spec,
                                item);
            }
            *colon = 0;
        }
        if (!item[0] || strlen(item) >= sizeof hosts->name ||
            strspn(item, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                         "0123456789.-_") != strlen(item)) {
            return fg_error(FG_EINVAL, "--hosts=\"%s\": \"%s\" is not a host name or address", spec,
                            item);
        }
        if (*n == cap) {
            return fg_error(FG_EINVAL, "--hosts=\"%s\": more than %d hosts", spec, cap);
        }
        memcpy(hosts[*n].name, item, strlen(item) + 1); /* fits: checked above */
        hosts[*n].slots = (int)slots;
        (*n)++;
        p = end ? end + 1 : p + len;
        if (end && !*p) {
            return fg_error(FG_EINVAL, "--hosts=\"%s\": ends with ','", spec);
        }
    }
    if (!*n) return fg_error(FG_EINVAL, "--hosts=\"\": expected HOST:N,HOST:N,...");
    return FG_OK;
}

/* mpirun's --host value (always with counts) and the total; false when too long. */
static bool host_value(const fg__host *hosts, int n, char *out, size_t cap, int *total) {
    size_t k = 0;
    *total = 0;
    out[0] = 0;
    for (int i = 0; i < n; i++) {
        int w = snprintf(out + k, cap - k, "%s%s:%d", k ? "," : "", hosts[i].name, hosts[i].slots);
        if (w < 0 || (size_t)w >= cap - k) return false;
        k += (size_t)w;
        *total += hosts[i].slots;
    }
    return true;
}

void fg_hosts_command_free(char **argv) {
    if (!argv) return;
    for (char **p = argv; *p; p++) fg_free(*p);
    fg_free(argv);
}

/* argv[*k] = a copy of s */
static bool push(char **argv, int *k, const char *s) {
    size_t n = strlen(s) + 1;
    char *c = fg_alloc(n);
    if (!c) return false;
    memcpy(c, s, n);
    argv[(*k)++] = c;
    return true;
}

/* The mpirun command for prog on hosts[0..nhosts), with extra_env (NULL or
 * NULL-terminated "NAME=VALUE" strings) passed to every rank. */
static FG_MUST_USE fg_status command_make(const fg_hosts_opts *o, const fg__host *hosts, int nhosts,
                                          char *const *extra_env, const char *const *prog,
                                          char ***out) {
    *out = NULL;
    char host_arg[4096], np[16];
    int total;
    if (!host_value(hosts, nhosts, host_arg, sizeof host_arg, &total))
        return fg_error(FG_EINVAL, "--hosts=\"%s\": too long", o->hosts);
    snprintf(np, sizeof np, "%d", total);
    int nprog = 0, nextra = 0, nenv = 0;
    while (prog[nprog]) nprog++;
    while (extra_env && extra_env[nextra]) nextra++;
    for (char **e = environ; *e; e++) nenv++;
    char **argv = fg_calloc((size_t)(32 + 2 * (nenv + nextra) + nprog), sizeof *argv);
    if (!argv) return fg_error(FG_ENOMEM, "--hosts: out of memory");
    int k = 0;
    bool ok = push(argv, &k, o->mpirun && *o->mpirun ? o->mpirun : "mpirun");
    if (geteuid() == 0) ok = ok && push(argv, &k, "--allow-run-as-root");
    const char *fixed[] = {"--host", host_arg,           "-np", np, "--bind-to", "none",
                           "--mca",  "rtc_hwloc_vmhole", "none"};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) ok = ok && push(argv, &k, fixed[i]);
    if (o->rsh_agent) {
        ok = ok && push(argv, &k, "--mca") && push(argv, &k, "plm_rsh_agent") &&
             push(argv, &k, o->rsh_agent);
    }
    if (o->network) {
        ok = ok && push(argv, &k, "--mca") && push(argv, &k, "oob_tcp_if_include") &&
             push(argv, &k, o->network) && push(argv, &k, "--mca") &&
             push(argv, &k, "btl_tcp_if_include") && push(argv, &k, o->network);
    }
    for (char **e = environ; *e && ok; e++) {
        const char *eq = strchr(*e, '=');
        if (!eq || !exported(*e, (size_t)(eq - *e))) continue;
        char name[256];
        if ((size_t)(eq - *e) >= sizeof name) continue;
        snprintf(name, sizeof name, "%.*s", (int)(eq - *e), *e);
        ok = push(argv, &k, "-x") && push(argv, &k, name);
    }
    for (int i = 0; i < nextra && ok; i++)
        ok = push(argv, &k, "-x") && push(argv, &k, extra_env[i]);
    for (int i = 0; i < nprog && ok; i++) ok = push(argv, &k, prog[i]);
    argv[k] = NULL;
    if (!ok) {
        fg_hosts_command_free(argv);
        return fg_error(FG_ENOMEM, "--hosts: out of memory");
    }
    *out = argv;
    return FG_OK;
}

fg_status fg_hosts_command(const fg_hosts_opts *o, int first, const char *const *prog,
                           char ***argv_out, int *nlisted) {
    if (!argv_out) return fg_error(FG_EINVAL, "fg_hosts_command: argv_out is NULL");
    *argv_out = NULL;
    if (!o || !o->hosts || !prog || !prog[0])
        return fg_error(FG_EINVAL, "fg_hosts_command: no hosts or no program");
    fg__host *h = fg_calloc(FG_HOSTS_MAX, sizeof *h);
    if (!h) return fg_error(FG_ENOMEM, "--hosts: out of memory");
    int n;
    fg_status st = hosts_parse(o->hosts, o->default_slots, h, FG_HOSTS_MAX, &n);
    if (st == FG_OK && nlisted) *nlisted = n;
    if (st == FG_OK)
        st = command_make(o, h, first > 0 && first < n ? first : n, NULL, prog, argv_out);
    fg_free(h);
    return st;
}

/* This machine's own names: mpirun starts their ranks without the agent. */
static bool is_self(const char *host) {
    char me[256] = {0};
    if (!strcmp(host, "localhost") || !strcmp(host, "127.0.0.1")) return true;
    if (gethostname(me, sizeof me - 1) != 0) return false;
    size_t n = strcspn(me, ".");
    return !strcmp(host, me) || (strlen(host) == n && !strncmp(host, me, n));
}

/* Forks `AGENT HOST true` (through sh, as the agent may carry arguments)
 * with signals unblocked; -1 on failure. */
static pid_t probe_start(const char *agent, const char *host, const sigset_t *old) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    sigprocmask(SIG_SETMASK, old, NULL);
    int fd = open("/dev/null", O_RDWR);
    if (fd >= 0) {
        dup2(fd, 0);
        dup2(fd, 1);
        dup2(fd, 2);
    }
    execl("/bin/sh", "sh", "-c", "exec $0 \"$1\" true", agent, host, (char *)NULL);
    _exit(127);
}

/* Asks each host in[i] (want[i]) whether it answers, all at once; ok[i]
 * true when it did, else why[i] says how it failed. */
static void probe_hosts(const fg_hosts_opts *o, const fg__host *h, const bool *want, int n,
                        bool *ok, char (*why)[96], const sigset_t *old) {
    const char *agent = o->rsh_agent;
    if (!agent) agent = getenv("OMPI_MCA_plm_rsh_agent");
    if (!agent || !*agent) agent = "ssh -o BatchMode=yes -o ConnectTimeout=10";
    pid_t pid[FG_HOSTS_MAX];
    int left = 0;
    for (int i = 0; i < n; i++) {
        ok[i] = false;
        pid[i] = 0;
        why[i][0] = 0;
        if (!want[i]) continue;
        if (is_self(h[i].name)) {
            ok[i] = true;
            continue;
        }
        pid[i] = probe_start(agent, h[i].name, old);
        if (pid[i] < 0) snprintf(why[i], sizeof why[i], "cannot fork: %s", strerror(errno));
        else left++;
    }
    double end = fg_time() + PROBE_TIMEOUT_S;
    while (left > 0) {
        for (int i = 0; i < n; i++) {
            if (pid[i] <= 0) continue;
            int st;
            pid_t r = waitpid(pid[i], &st, WNOHANG);
            if (r == 0 && fg_time() < end) continue;
            if (r == 0) {
                kill(pid[i], SIGKILL);
                waitpid(pid[i], &st, 0);
                snprintf(why[i], sizeof why[i], "no answer in %d s", PROBE_TIMEOUT_S);
            } else if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
                ok[i] = true;
            } else if (WIFEXITED(st)) {
                snprintf(why[i], sizeof why[i], "the agent exited with code %d", WEXITSTATUS(st));
            } else {
                snprintf(why[i], sizeof why[i], "the agent was killed by signal %d", WTERMSIG(st));
            }
            pid[i] = 0;
            left--;
        }
        if (left > 0) usleep(20000);
    }
}

/* What mpirun's report says about the first failure: the rank (-1 unknown)
 * and the node it names ("" unknown). Ranks that lose a peer often exit
 * non-zero before the peer's death reaches mpirun, so the evidence is
 * ranked: a lost daemon, then a rank killed by a signal, then the peer
 * host a rank saw disconnect, then a non-zero exit. */
typedef struct failure {
    int rank, prio;
    char node[256];
} failure;

static void note_failure(failure *f, int prio, int rank, const char *node, size_t nlen) {
    if (prio <= f->prio) return;
    f->prio = prio;
    f->rank = rank;
    f->node[0] = 0;
    if (node && nlen < sizeof f->node) {
        memcpy(f->node, node, nlen);
        f->node[nlen] = 0;
    }
}

/* One line of mpirun's output. Open MPI 4 writes:
 *   mpirun noticed that process rank 2 with PID 0 on node h2 exited on signal 9 (Killed).
 *     Process name: [[14545,1],1]        (after "The first process to do so was:")
 *     Remote daemon: [[61541,0],1] on node h2   (after "lost communication")
 *     Peer host:  h2          (after "An MPI communication peer process has
 *                              unexpectedly disconnected") */
static void scan_line(const char *line, failure *f) {
    const char *node = strstr(line, " on node ");
    size_t nlen = 0;
    if (node) {
        node += 9;
        nlen = strcspn(node, " \t\r\n");
        while (nlen && node[nlen - 1] == '.') nlen--;
    }
    const char *p;
    if ((p = strstr(line, "noticed that process rank "))) {
        int rank = atoi(p + 26);
        note_failure(f, strstr(line, "on signal") ? 4 : 2, rank, node, nlen);
    } else if ((p = strstr(line, "Remote daemon:")) && node) {
        note_failure(f, 5, -1, node, nlen);
    } else if ((p = strstr(line, "Peer host:"))) {
        p += 10;
        p += strspn(p, " \t");
        note_failure(f, 3, -1, p, strcspn(p, " \t\r\n"));
    } else if ((p = strstr(line, "Process name: [["))) {
        const char *c = strstr(p, "],");
        if (c) note_failure(f, 1, atoi(c + 2), NULL, 0);
    }
}

/* The host of the failure among hosts[0..n) (the job's, in rank order), or -1. */
static int failed_host(const failure *f, const fg__host *hosts, int n) {
    if (f->rank >= 0) {
        int first = 0;
        for (int i = 0; i < n; i++) {
            if (f->rank < first + hosts[i].slots) return i;
            first += hosts[i].slots;
        }
    }
    if (f->node[0]) {
        size_t nl = strcspn(f->node, ".");
        for (int i = 0; i < n; i++) {
            size_t hl = strcspn(hosts[i].name, ".");
            if (!strcmp(f->node, hosts[i].name) ||
                (nl == hl && !strncmp(f->node, hosts[i].name, hl)))
                return i;
        }
    }
    return -1;
}

/* Runs argv with its stderr through a pipe (passed on to this process's
 * stderr as it comes, the ranks' output among it, and scanned into *f),
 * forwarding the agent's signals to it; returns the wait status (-1 when it
 * cannot start). */
static int run_mpirun(fg__agent *a, char *const *argv, failure *f) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return -1;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        sigprocmask(SIG_SETMASK, &a->old, NULL);
        dup2(fds[1], 2);
        execvp(argv[0], argv);
        dprintf(2, "fulgur run: --hosts: cannot run %s (%s)\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    a->child = pid;
    char buf[8192];
    size_t have = 0;
    bool open_pipe = true;
    while (open_pipe) {
        struct pollfd pf[2] = {{.fd = fds[0], .events = POLLIN}, {.fd = a->sfd, .events = POLLIN}};
        if (poll(pf, 2, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (pf[1].revents & POLLIN) fg__agent_signals(a);
        if (pf[0].revents & (POLLIN | POLLHUP)) {
            char in[4096];
            ssize_t r = read(fds[0], in, sizeof in);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) {
                open_pipe = false;
                r = 0;
            }
            /* passed on at once (a progress bar's \r lines too), read by line */
            for (ssize_t w = 0; w < r;) {
                ssize_t d = write(2, in + w, (size_t)(r - w));
                if (d < 0 && errno == EINTR) continue;
                if (d <= 0) break;
                w += d;
            }
            for (ssize_t i = 0; i < r; i++) {
                if (in[i] != '\n' && have < sizeof buf - 1) {
                    buf[have++] = in[i];
                    continue;
                }
                buf[have] = 0;
                scan_line(buf, f);
                have = 0;
            }
            if (!open_pipe && have) {
                buf[have] = 0;
                scan_line(buf, f);
            }
        }
    }
    close(fds[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    a->child = 0;
    return st;
}

/* "h1, h2" from hosts[i] where pick[i]. */
static void names_of(const fg__host *h, const bool *pick, int n, char *out, size_t cap) {
    size_t k = 0;
    out[0] = 0;
    for (int i = 0; i < n && k < cap; i++)
        if (pick[i]) {
            int w = snprintf(out + k, cap - k, "%s%s", k ? ", " : "", h[i].name);
            if (w < 0) break;
            k += (size_t)w;
        }
}

/* The loop's state, zeroed for each run. */
typedef struct hosts_state {
    fg__host h[FG_HOSTS_MAX], job[FG_HOSTS_MAX];
    bool gone[FG_HOSTS_MAX], want[FG_HOSTS_MAX], ok[FG_HOSTS_MAX], pick[FG_HOSTS_MAX];
    char why[FG_HOSTS_MAX][96];
} hosts_state;

static FG_MUST_USE fg_status hosts_loop(fg__agent *a, hosts_state *hs, fg_agent_result *out);

fg_status fg__agent_hosts(fg__agent *a, fg_agent_result *out) {
    hosts_state *hs = fg_calloc(1, sizeof *hs);
    if (!hs) return fg_error(FG_ENOMEM, "--hosts: out of memory");
    fg_status st = hosts_loop(a, hs, out);
    fg_free(hs);
    return st;
}

static FG_MUST_USE fg_status hosts_loop(fg__agent *a, hosts_state *hs, fg_agent_result *out) {
    const fg_agent_opts *o = a->o;
    const fg_hosts_opts *ho = o->hosts;
    fg__host *h = hs->h, *job = hs->job;
    bool *gone = hs->gone, *want = hs->want, *ok = hs->ok, *pick = hs->pick;
    char(*why)[96] = hs->why;
    int n;
    fg_status ret = hosts_parse(ho->hosts, ho->default_slots, h, FG_HOSTS_MAX, &n);
    if (ret != FG_OK) return ret;
    int max_nodes = o->num_nodes > 0 ? o->num_nodes : n, min_nodes = o->min_nodes;
    bool elastic = min_nodes > 0 && min_nodes < max_nodes;
    int max_restarts = o->max_restarts;
    if (!elastic) min_nodes = max_nodes = n;
    if (n < min_nodes)
        return fg_error(FG_EINVAL, "--nnodes %d:%d: --hosts lists %d host%s; list at least %d",
                        min_nodes, max_nodes, n, n == 1 ? "" : "s", min_nodes);
    const char *cmd0 = ho->mpirun && *ho->mpirun ? ho->mpirun : "mpirun";
    int exit_code = 1;
    for (int attempt = 0;; attempt++) {
        out->restarts = attempt;
        for (int i = 0; i < n; i++) want[i] = !gone[i];
        probe_hosts(ho, h, want, n, ok, why, &a->old);
        int k = 0;
        for (int i = 0; i < n; i++) {
            pick[i] = ok[i] && k < max_nodes;
            if (pick[i]) job[k++] = h[i];
        }
        if (k < min_nodes) {
            char msg[4096];
            size_t m = 0;
            msg[0] = 0;
            for (int i = 0; i < n && m < sizeof msg; i++) {
                if (ok[i]) continue;
                int w = snprintf(msg + m, sizeof msg - m, "%s%s (%s)", m ? ", " : "", h[i].name,
                                 gone[i] ? "left the job after its ranks failed" : why[i]);
                if (w < 0) break;
                m += (size_t)w;
            }
            if (elastic)
                ret =
                    fg_error(FG_EPEER,
                             "--nnodes %d:%d needs at least %d host%s, but only %d of the %d "
                             "listed can run the job; missing: %s",
                             min_nodes, max_nodes, min_nodes, min_nodes == 1 ? "" : "s", k, n, msg);
            else
                ret = fg_error(FG_EPEER,
                               "--hosts: %d of the %d hosts cannot run the job: %s (with --nnodes "
                               "MIN:MAX the job runs on those that can)",
                               n - k, n, msg);
            fg_log(FG_LOG_ERROR, "%s", fg_last_error());
            exit_code = 1;
            break;
        }
        if (attempt || k < n || elastic) {
            char names[1024];
            names_of(h, pick, n, names, sizeof names);
            int world = 0;
            for (int i = 0; i < k; i++) world += job[i].slots;
            char missing[2048];
            size_t m = 0;
            missing[0] = 0;
            for (int i = 0; i < n && m < sizeof missing; i++) {
                if (ok[i] || gone[i]) continue;
                int w = snprintf(missing + m, sizeof missing - m, "%s%s (%s)",
                                 m ? ", " : "; not answering: ", h[i].name, why[i]);
                if (w < 0) break;
                m += (size_t)w;
            }
            fg_log(FG_LOG_INFO, "%s on %d host%s (%s), %d rank%s%s",
                   attempt ? "restarting" : "starting", k, k == 1 ? "" : "s", names, world,
                   world == 1 ? "" : "s", missing);
        }
        char count[48], tcount[48], tmax[48];
        snprintf(count, sizeof count, "FULGUR_RESTART_COUNT=%d", attempt);
        snprintf(tcount, sizeof tcount, "TORCHELASTIC_RESTART_COUNT=%d", attempt);
        snprintf(tmax, sizeof tmax, "TORCHELASTIC_MAX_RESTARTS=%d", max_restarts);
        char *extra[] = {count, tcount, tmax, NULL};
        char **cmd;
        if ((ret = command_make(ho, job, k, extra, o->argv, &cmd)) != FG_OK) {
            exit_code = 2;
            break;
        }
        failure f = {.rank = -1};
        int st = run_mpirun(a, cmd, &f);
        int e = errno;
        fg_hosts_command_free(cmd);
        if (st < 0) {
            ret = fg_error(FG_EIO, "--hosts: cannot start %s: %s", cmd0, strerror(e));
            exit_code = 1;
            break;
        }
        exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        out->signal = a->got;
        if (exit_code == 0) break;
        if (a->got) {
            if (exit_code != 75) exit_code = 128 + a->got;
            ret = fg_error(FG_EPEER, "got SIG%s; forwarded it to mpirun",
                           sigabbrev_np(a->got) ? sigabbrev_np(a->got) : "?");
            break;
        }
        if (exit_code == 127 && attempt == 0) { /* mpirun or the program not found */
            ret = fg_error(FG_EPEER, "--hosts: mpirun or the program was not found (exit 127)");
            break;
        }
        if (exit_code == 75) {
            fg_log(FG_LOG_INFO, "a rank stopped with a checkpoint to resume from; not restarting");
            ret = fg_error(FG_EPEER, "a rank stopped with a checkpoint to resume from (exit 75)");
            break;
        }
        if (exit_code == 2) { /* bad flags or a missing file fail again */
            fg_log(FG_LOG_ERROR, "the job exited 2 (a usage error, which a restart would "
                                 "repeat); not restarting");
            ret = fg_error(FG_EPEER, "the job exited 2 (a usage error); not restarted");
            break;
        }
        int bad = failed_host(&f, job, k);
        int bad_i = -1; /* its index in h */
        for (int i = 0, j = 0; i < n && bad >= 0; i++)
            if (pick[i] && j++ == bad) bad_i = i;
        char what[320];
        if (bad_i >= 0 && f.rank >= 0)
            snprintf(what, sizeof what, "rank %d on host %s failed", f.rank, h[bad_i].name);
        else if (bad_i >= 0) snprintf(what, sizeof what, "host %s failed", h[bad_i].name);
        else snprintf(what, sizeof what, "the job failed (exit %d)", exit_code);
        if (attempt >= max_restarts) {
            fg_log(FG_LOG_ERROR, "%s; no restart left (--max-restarts %d)", what, max_restarts);
            ret =
                fg_error(FG_EPEER, "%s; no restart left (after %d restart%s of --max-restarts %d)",
                         what, attempt, attempt == 1 ? "" : "s", max_restarts);
            break;
        }
        if (elastic && bad_i >= 0) {
            gone[bad_i] = true;
            int left = 0;
            for (int i = 0; i < n; i++) left += !gone[i];
            if (left < min_nodes) {
                ret = fg_error(FG_EPEER,
                               "%s; without %s %d host%s %s left, below --nnodes %d:%d's minimum "
                               "%d: stopping",
                               what, h[bad_i].name, left, left == 1 ? "" : "s",
                               left == 1 ? "is" : "are", min_nodes, max_nodes, min_nodes);
                fg_log(FG_LOG_ERROR, "%s", fg_last_error());
                break;
            }
            fg_log(FG_LOG_WARN, "%s; %s leaves the job (restart %d of %d)", what, h[bad_i].name,
                   attempt + 1, max_restarts);
        } else {
            fg_log(FG_LOG_WARN, "%s; restarting (restart %d of %d)", what, attempt + 1,
                   max_restarts);
        }
    }
    out->exit_code = exit_code;
    return exit_code == 0 ? FG_OK
           : ret != FG_OK ? ret
                          : fg_error(FG_EPEER, "the job exited %d", exit_code);
}
