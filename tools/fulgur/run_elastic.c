/* fulgur run --hosts with --nnodes MIN:MAX (torchrun's elastic membership)
 * or --max-restarts K: mpirun runs as a child instead of replacing this
 * process, and when it fails it is started again, up to K times.
 *
 * Each start first asks every host that is still in the job whether it
 * answers (the rsh agent runs `true` there, 10 s at most; this machine's
 * own names need no asking), and takes the first MAX that do. With fewer
 * than MIN nothing starts: the error names the hosts that are missing and
 * why. When the job fails, mpirun's report (relayed line by line to stderr)
 * names the rank that failed first and its host: under --nnodes MIN:MAX
 * that host leaves the job and the next start runs on the others (a host
 * listed beyond MAX joins instead), so long as MIN remain; with a fixed
 * number of hosts the same hosts start again. The ranks see
 * FULGUR_RESTART_COUNT / TORCHELASTIC_RESTART_COUNT (fulgur fit resumes from
 * its newest checkpoint on a count above 0, at the new world size).
 *
 * Signals (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1) are taken through a
 * signalfd and forwarded to mpirun, which forwards them to the ranks; after
 * one of the first four the job is not restarted. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "run_hosts.h"

#define PROBE_TIMEOUT_S 10

static const int k_forward[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1};

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
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
static void probe_hosts(const run_hosts_opts *o, const run_host *h, const bool *want, int n,
                        bool *ok, char (*why)[96], const sigset_t *old) {
    const char *agent = o->rsh_agent;
    if (!agent) agent = getenv("OMPI_MCA_plm_rsh_agent");
    if (!agent || !*agent) agent = "ssh -o BatchMode=yes -o ConnectTimeout=10";
    pid_t pid[RUN_HOSTS_MAX];
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
    double end = now_s() + PROBE_TIMEOUT_S;
    while (left > 0) {
        for (int i = 0; i < n; i++) {
            if (pid[i] <= 0) continue;
            int st;
            pid_t r = waitpid(pid[i], &st, WNOHANG);
            if (r == 0 && now_s() < end) continue;
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
static int failed_host(const failure *f, const run_host *hosts, int n) {
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

/* Runs argv with its stderr through a pipe (relayed to ours line by line
 * and scanned into *f), forwarding the signals read from sfd; returns the
 * wait status (-1 when it cannot start) and sets *got to the last signal
 * that ends the job. */
static int run_mpirun(const char *const *argv, int sfd, const sigset_t *old, failure *f, int *got) {
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
        sigprocmask(SIG_SETMASK, old, NULL);
        dup2(fds[1], 2);
        execvp(argv[0], (char *const *)argv);
        fprintf(stderr, "fulgur run: --hosts: cannot run %s (%s)\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    char buf[8192];
    size_t have = 0;
    bool open_pipe = true;
    while (open_pipe) {
        struct pollfd pf[2] = {{.fd = fds[0], .events = POLLIN}, {.fd = sfd, .events = POLLIN}};
        if (poll(pf, 2, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (pf[1].revents & POLLIN) {
            struct signalfd_siginfo si;
            if (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
                if (si.ssi_signo != SIGUSR1) *got = (int)si.ssi_signo;
                kill(pid, (int)si.ssi_signo);
            }
        }
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
    return st;
}

/* "h1, h2" from hosts[i] where pick[i]. */
static void names_of(const run_host *h, const bool *pick, int n, char *out, size_t cap) {
    size_t k = 0;
    out[0] = 0;
    for (int i = 0; i < n && k < cap; i++)
        if (pick[i]) {
            int w = snprintf(out + k, cap - k, "%s%s", k ? ", " : "", h[i].name);
            if (w < 0) break;
            k += (size_t)w;
        }
}

int run_hosts_elastic(const run_hosts_opts *o, int min_nodes, int max_nodes, bool elastic,
                      int max_restarts, char **prog) {
    static run_host h[RUN_HOSTS_MAX];
    int n;
    if (!run_hosts_parse(o->hosts, o->default_slots, h, RUN_HOSTS_MAX, &n)) return FG_EXIT_USAGE;
    if (!elastic) min_nodes = max_nodes = n;
    if (n < min_nodes) {
        cli_error("--nnodes %d:%d: --hosts lists %d host%s; list at least %d", min_nodes, max_nodes,
                  n, n == 1 ? "" : "s", min_nodes);
        return FG_EXIT_USAGE;
    }
    if (o->dry_run) {
        run_hosts_cmd cmd;
        int k = n < max_nodes ? n : max_nodes;
        if (!run_hosts_cmd_make(o, h, k, NULL, prog, &cmd)) return FG_EXIT_USAGE;
        printf("(each start, on the first %d hosts that answer of %d:)\n", k, n);
        for (int i = 0; cmd.argv[i]; i++) printf("%s%s", i ? " " : "", cmd.argv[i]);
        printf("\n");
        run_hosts_cmd_free(&cmd);
        return FG_EXIT_OK;
    }

    sigset_t set, old;
    sigemptyset(&set);
    for (size_t i = 0; i < sizeof k_forward / sizeof k_forward[0]; i++)
        sigaddset(&set, k_forward[i]);
    sigprocmask(SIG_BLOCK, &set, &old);
    int sfd = signalfd(-1, &set, SFD_CLOEXEC);
    if (sfd < 0) {
        cli_error("signalfd: %s", strerror(errno));
        sigprocmask(SIG_SETMASK, &old, NULL);
        return FG_EXIT_FAIL;
    }

    static bool gone[RUN_HOSTS_MAX], want[RUN_HOSTS_MAX], ok[RUN_HOSTS_MAX], pick[RUN_HOSTS_MAX];
    static char why[RUN_HOSTS_MAX][96];
    static run_host job[RUN_HOSTS_MAX];
    int exit_code = FG_EXIT_FAIL, got = 0;
    for (int attempt = 0;; attempt++) {
        for (int i = 0; i < n; i++) want[i] = !gone[i];
        probe_hosts(o, h, want, n, ok, why, &old);
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
                fprintf(stderr,
                        "fulgur run: --nnodes %d:%d needs at least %d host%s, but only %d of the "
                        "%d listed can run the job; missing: %s\n",
                        min_nodes, max_nodes, min_nodes, min_nodes == 1 ? "" : "s", k, n, msg);
            else
                fprintf(stderr,
                        "fulgur run: --hosts: %d of the %d hosts cannot run the job: %s (with "
                        "--nnodes MIN:MAX the job runs on those that can)\n",
                        n - k, n, msg);
            exit_code = FG_EXIT_FAIL;
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
            fprintf(stderr, "fulgur run: %s on %d host%s (%s), %d rank%s%s\n",
                    attempt ? "restarting" : "starting", k, k == 1 ? "" : "s", names, world,
                    world == 1 ? "" : "s", missing);
        }
        char count[48], tcount[48], tmax[48];
        snprintf(count, sizeof count, "FULGUR_RESTART_COUNT=%d", attempt);
        snprintf(tcount, sizeof tcount, "TORCHELASTIC_RESTART_COUNT=%d", attempt);
        snprintf(tmax, sizeof tmax, "TORCHELASTIC_MAX_RESTARTS=%d", max_restarts);
        char *extra[] = {count, tcount, tmax, NULL};
        run_hosts_cmd cmd;
        if (!run_hosts_cmd_make(o, job, k, extra, prog, &cmd)) {
            exit_code = FG_EXIT_USAGE;
            break;
        }
        failure f = {.rank = -1};
        int st = run_mpirun(cmd.argv, sfd, &old, &f, &got);
        run_hosts_cmd_free(&cmd);
        if (st < 0) {
            cli_error("--hosts: cannot start %s: %s", o->mpirun, strerror(errno));
            exit_code = FG_EXIT_FAIL;
            break;
        }
        exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (exit_code == 0) break;
        if (got) {
            if (exit_code != FG_EXIT_RESUMABLE) exit_code = 128 + got;
            break;
        }
        if (exit_code == 127 && attempt == 0) break; /* mpirun or the program not found */
        if (exit_code == FG_EXIT_RESUMABLE) {
            fprintf(stderr, "fulgur run: a rank stopped with a checkpoint to resume from; not "
                            "restarting\n");
            break;
        }
        if (exit_code == FG_EXIT_USAGE) { /* bad flags or a missing file fail again */
            fprintf(stderr, "fulgur run: the job exited 2 (a usage error, which a restart would "
                            "repeat); not restarting\n");
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
            fprintf(stderr, "fulgur run: %s; no restart left (--max-restarts %d)\n", what,
                    max_restarts);
            break;
        }
        if (elastic && bad_i >= 0) {
            gone[bad_i] = true;
            int left = 0;
            for (int i = 0; i < n; i++) left += !gone[i];
            if (left < min_nodes) {
                fprintf(stderr,
                        "fulgur run: %s; without %s %d host%s %s left, below --nnodes %d:%d's "
                        "minimum %d: stopping\n",
                        what, h[bad_i].name, left, left == 1 ? "" : "s", left == 1 ? "is" : "are",
                        min_nodes, max_nodes, min_nodes);
                break;
            }
            fprintf(stderr, "fulgur run: %s; %s leaves the job (restart %d of %d)\n", what,
                    h[bad_i].name, attempt + 1, max_restarts);
        } else {
            fprintf(stderr, "fulgur run: %s; restarting (restart %d of %d)\n", what, attempt + 1,
                    max_restarts);
        }
    }
    close(sfd);
    sigprocmask(SIG_SETMASK, &old, NULL);
    return exit_code;
}
