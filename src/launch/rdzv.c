/* The rendezvous of nodes started each on its own (fulgur run --nnodes N
 * --node-rank R --master-addr A --master-port P, torchrun's contract).
 *
 * Node 0 listens on P and, when asked, starts Open MPI's ompi-server, the
 * name service through which the ranks find each other (src/comm/mpi.c
 * connects them; no data moves through this file). Every other node
 * connects to A:P and says who it is: "JOIN 1 <node_rank> <nnodes>
 * <nproc_per_node> <job>". Node 0 answers each with "OK <value>" (the
 * ompi-server's URI) once all N have joined, or with "ERR <why>" when the
 * rendezvous fails: a node rank taken twice, world sizes that disagree, a
 * node of another job, a node that never came within the join timeout.
 * The connections stay open for the job's life: a node whose ranks failed
 * sends "FAIL <why>", one whose ranks finished "DONE", and node 0 passes a
 * failure (or a node whose connection dropped) on to every node as
 * "STOP <why>", so that every node stops its ranks naming the cause.
 *
 * Node 0 keeps listening from its first round to its end, so that a node
 * is never left knocking at a closed port: one that comes while a round
 * runs is answered at once, "WAIT <round> <nodes> <since>" when a restart
 * round may still come (it is held, connected, and joins that round first:
 * no window to hit), or "ERR <why>" naming the job and what happened (its
 * last round is under way, it ended at such a time, the rank is in it).
 * Lines are short text; every wait is bounded. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "launch_impl.h"

#define LINE_MAX_ 1024
#define DEFAULT_TIMEOUT_S 300.0
#define LATE_MAX 64 /* connections held between rounds */

typedef struct peer {
    int fd;
    int node; /* -1 until its JOIN */
    char addr[64];
    char buf[LINE_MAX_];
    size_t len;
    bool done;      /* said DONE */
    bool gone;      /* a member that failed or left: its node rank may come back */
    bool held;      /* told WAIT: it joins the next round */
    char join[160]; /* a held node's JOIN line, taken again at the next round */
} peer;

struct fg_rdzv {
    fg_rdzv_opts o;
    int min_nodes;                   /* o.min_nodes, or o.num_nodes when fixed */
    bool elastic;                    /* node ranks assigned here, in order of arrival */
    bool host;                       /* node 0: holds the rendezvous */
    int node_rank, num_nodes, round; /* the job formed */
    char job[FG_CLUSTER_JOB_MAX];
    char addr[FG_CLUSTER_ADDR_MAX];
    int listen_fd; /* node 0 */
    peer *peers;   /* node 0: one per other node, by node rank after the join */
    int npeers;
    int fd; /* other nodes: the connection to node 0 */
    char buf[LINE_MAX_];
    size_t len;
    pid_t server; /* node 0: the ompi-server, 0 if none */
    char server_dir[64];
    bool stopped; /* a STOP was sent or received */
    /* node 0: connections that came after the round formed (held or not
     * yet heard), and what a late node is told */
    peer *late;
    int nlate;
    time_t formed_at, ended_at;
    bool ended;
    char ended_what[256];
};

static bool cancelled(const fg_rdzv *r) {
    return (r->o.cancel && *r->o.cancel) || (r->o.cancelled && r->o.cancelled(r->o.cancel_ud));
}

/* "07:42:13 UTC" */
static void clock_of(time_t t, char *out, size_t cap) {
    struct tm tm;
    if (!gmtime_r(&t, &tm) || !strftime(out, cap, "%H:%M:%S UTC", &tm)) snprintf(out, cap, "?");
}

static double timeout_of(const fg_rdzv_opts *o, double *out) {
    double t = o->timeout_s;
    if (t <= 0) {
        if (fg__env_double("FULGUR_RDZV_TIMEOUT_S", DEFAULT_TIMEOUT_S, &t) != FG_OK) return -1;
        if (!(t > 0)) {
            fg_error(FG_EINVAL, "FULGUR_RDZV_TIMEOUT_S=%s: expected seconds above 0",
                     getenv("FULGUR_RDZV_TIMEOUT_S"));
            return -1;
        }
    }
    *out = t;
    return t;
}

static void send_line(int fd, const char *fmt, ...) FG_PRINTF(2, 3);
static void send_line(int fd, const char *fmt, ...) {
    char b[LINE_MAX_];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b, sizeof b - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (n > (int)sizeof b - 2) n = (int)sizeof b - 2;
    for (int i = 0; i < n; i++)
        if (b[i] == '\n') b[i] = ' ';
    b[n++] = '\n';
    for (int off = 0; off < n;) {
        ssize_t w = send(fd, b + off, (size_t)(n - off), MSG_NOSIGNAL);
        if (w <= 0) return;
        off += (int)w;
    }
}

/* Reads what is there into buf; a whole line into line (returns 1), no line
 * yet (0), or the peer closed / failed (-1). */
static int read_line(int fd, char *buf, size_t *len, char *line, size_t cap) {
    for (;;) {
        char *nl = memchr(buf, '\n', *len);
        if (nl) {
            size_t n = (size_t)(nl - buf);
            snprintf(line, cap, "%.*s", (int)n, buf);
            memmove(buf, nl + 1, *len - n - 1);
            *len -= n + 1;
            return 1;
        }
        if (*len >= LINE_MAX_ - 1) return -1;
        ssize_t r = recv(fd, buf + *len, LINE_MAX_ - 1 - *len, MSG_DONTWAIT);
        if (r == 0) return -1;
        if (r < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
        *len += (size_t)r;
    }
}

/* ------------------------------------------------------- ompi-server */

/* Starts ompi-server and waits (up to t seconds) for its URI. */
static FG_MUST_USE fg_status start_server(fg_rdzv *r, double t, char *uri, size_t cap) {
    snprintf(r->server_dir, sizeof r->server_dir, "/tmp/fulgur-rdzv.XXXXXX");
    if (!mkdtemp(r->server_dir)) {
        r->server_dir[0] = 0;
        return fg_error(FG_EIO, "rendezvous: cannot make a folder in /tmp: %s", strerror(errno));
    }
    char file[128];
    snprintf(file, sizeof file, "%s/uri", r->server_dir);
    const char *exe = getenv("FULGUR_OMPI_SERVER");
    if (!exe || !*exe) exe = "ompi-server";
    pid_t pid = fork();
    if (pid < 0) return fg_error(FG_EIO, "rendezvous: fork: %s", strerror(errno));
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* a killed fulgur run leaves no server behind */
        if (getppid() == 1) _exit(1);
        int dn = open("/dev/null", O_RDWR);
        if (dn >= 0) {
            dup2(dn, 0);
            dup2(dn, 1);
        }
        execlp(exe, exe, "--no-daemonize", "-r", file, (char *)NULL);
        dprintf(2, "rendezvous: cannot run %s: %s\n", exe, strerror(errno));
        _exit(127);
    }
    r->server = pid;
    double t0 = fg_time();
    for (;;) {
        FILE *f = fopen(file, "r");
        if (f) {
            bool got = fgets(uri, (int)cap, f) != NULL;
            fclose(f);
            if (got && strchr(uri, '\n')) {
                uri[strcspn(uri, "\n")] = 0;
                if (*uri) return FG_OK;
            }
        }
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            r->server = 0;
            return fg_error(FG_EIO,
                            "rendezvous: %s exited (status %d) before it gave its address: is "
                            "Open MPI's openmpi-bin installed (FULGUR_OMPI_SERVER names another)?",
                            exe, WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
        }
        if (fg_time() - t0 > t)
            return fg_error(FG_ETIMEOUT, "rendezvous: %s gave no address within %.3g s", exe, t);
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

static void stop_server(fg_rdzv *r) {
    if (r->server > 0) {
        kill(-r->server, SIGTERM);
        kill(r->server, SIGTERM);
        for (int i = 0; i < 200; i++) {
            if (waitpid(r->server, NULL, WNOHANG) == r->server) {
                r->server = 0;
                break;
            }
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        if (r->server > 0) {
            kill(-r->server, SIGKILL);
            kill(r->server, SIGKILL);
            waitpid(r->server, NULL, 0);
        }
        r->server = 0;
    }
    if (r->server_dir[0]) {
        char file[128];
        snprintf(file, sizeof file, "%s/uri", r->server_dir);
        unlink(file);
        rmdir(r->server_dir);
        r->server_dir[0] = 0;
    }
}

/* ---------------------------------------------------------- node 0 */

static void fail_all(fg_rdzv *r, const char *why) {
    for (int i = 0; i < r->npeers; i++)
        if (r->peers[i].fd >= 0) send_line(r->peers[i].fd, "ERR %s", why);
}

/* The missing node ranks, "1, 3" into out. */
static void missing_nodes(const fg_rdzv *r, char *out, size_t cap) {
    size_t k = 0;
    out[0] = 0;
    for (int n = 1; n < r->o.num_nodes && k < cap; n++) {
        bool here = false;
        for (int i = 0; i < r->npeers; i++) here |= r->peers[i].node == n;
        if (!here) k += (size_t)snprintf(out + k, cap - k, "%s%d", k ? ", " : "", n);
    }
}

/* A JOIN line from the node at addr, checked against the job: its format,
 * job, world size and (fixed jobs) the range of its node rank into *node. */
static FG_MUST_USE fg_status check_join(const fg_rdzv *r, const char *addr, const char *line,
                                        int *node_out) {
    int ver, node, nnodes, nmin, nproc;
    char job[FG_CLUSTER_JOB_MAX];
    if (sscanf(line, "JOIN %d %d %d:%d %d %127s", &ver, &node, &nmin, &nnodes, &nproc, job) != 6 ||
        ver != 1)
        return fg_error(FG_EFORMAT,
                        "rendezvous at %s:%d: %s sent \"%.60s\", not a fulgur node's join: is "
                        "another service on this port?",
                        r->addr, r->o.master_port, addr, line);
    if (strcmp(job, r->job))
        return fg_error(FG_EMISMATCH,
                        "rendezvous at %s:%d: node rank %d (%s) is of job \"%s\", this one is "
                        "\"%s\": start every machine with the same --rdzv-id / --master-addr "
                        "and --master-port",
                        r->addr, r->o.master_port, node, addr, job, r->job);
    if (r->elastic &&
        (nmin != r->min_nodes || nnodes != r->o.num_nodes || nproc != r->o.nproc_per_node))
        return fg_error(FG_EMISMATCH,
                        "world sizes disagree: the node at %s has --nnodes %d:%d "
                        "--nproc-per-node %d, node 0 has --nnodes %d:%d --nproc-per-node %d: "
                        "start every machine with the same",
                        addr, nmin, nnodes, nproc, r->min_nodes, r->o.num_nodes,
                        r->o.nproc_per_node);
    if (!r->elastic && (nnodes != r->o.num_nodes || nmin != nnodes || nproc != r->o.nproc_per_node))
        return fg_error(FG_EMISMATCH,
                        "world sizes disagree: node rank %d (%s) has --nnodes %d "
                        "--nproc-per-node %d (%d ranks), node 0 has --nnodes %d "
                        "--nproc-per-node %d (%d ranks): start every machine with the same",
                        node, addr, nnodes, nproc, nnodes * nproc, r->o.num_nodes,
                        r->o.nproc_per_node, r->o.num_nodes * r->o.nproc_per_node);
    if (!r->elastic && (node < 1 || node >= r->o.num_nodes))
        return fg_error(
            FG_EINVAL, "node rank %d (%s): %s; give each machine its own --node-rank in 0..%d",
            node, addr, node == 0 ? "node 0 is this machine (the master) already" : "out of range",
            r->o.num_nodes - 1);
    *node_out = node;
    return FG_OK;
}

/* A JOIN line from peer p in a round being formed. */
static FG_MUST_USE fg_status take_join(fg_rdzv *r, peer *p, const char *line) {
    int node;
    fg_status st = check_join(r, p->addr, line, &node);
    if (st != FG_OK) return st;
    if (r->elastic) { /* the rank is given at the end, in order of arrival */
        p->node = 1000000 + (int)(p - r->peers);
        return FG_OK;
    }
    for (int i = 0; i < r->npeers; i++)
        if (&r->peers[i] != p && r->peers[i].node == node)
            return fg_error(FG_EMISMATCH,
                            "two nodes claim node rank %d: %s and %s; give each machine its "
                            "own --node-rank in 0..%d",
                            node, r->peers[i].addr, p->addr, r->o.num_nodes - 1);
    p->node = node;
    return FG_OK;
}

/* Listens on the master port (once: it stays open until fg_rdzv_free). */
static FG_MUST_USE fg_status host_listen(fg_rdzv *r) {
    if (r->listen_fd >= 0) return FG_OK;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return fg_error(FG_EIO, "rendezvous: socket: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)r->o.master_port)};
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, 64) < 0) {
        int e = errno;
        close(fd);
        if (e == EADDRINUSE)
            return fg_error(FG_EMISMATCH,
                            "master port %d is taken on this machine (node 0, --master-addr %s): "
                            "another job or service listens there; pick another --master-port "
                            "(MASTER_PORT) and give it to every node",
                            r->o.master_port, r->addr);
        return fg_error(FG_EIO, "rendezvous: cannot listen on port %d: %s", r->o.master_port,
                        strerror(e));
    }
    r->listen_fd = fd;
    return FG_OK;
}

/* Takes the connections waiting on the listening socket into peers[*n..cap). */
static void accept_all(fg_rdzv *r, peer *peers, int *n, int cap) {
    int one = 1;
    for (;;) {
        struct sockaddr_in ca;
        socklen_t cl = sizeof ca;
        int c = accept4(r->listen_fd, (struct sockaddr *)&ca, &cl, SOCK_CLOEXEC);
        if (c < 0) return;
        if (*n >= cap) {
            send_line(c,
                      "ERR the rendezvous at %s:%d has %d connections waiting already: too "
                      "many nodes for --nnodes %d",
                      r->addr, r->o.master_port, cap, r->o.num_nodes);
            close(c);
            continue;
        }
        peer *p = &peers[(*n)++];
        memset(p, 0, sizeof *p);
        p->fd = c;
        p->node = -1;
        inet_ntop(AF_INET, &ca.sin_addr, p->addr, sizeof p->addr);
        setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
}

static FG_MUST_USE fg_status host_join(fg_rdzv *r, double t) {
    fg_status st = host_listen(r);
    if (st != FG_OK) return st;
    int want = r->o.num_nodes - 1;
    int cap = want * 2 + 8 + r->nlate;
    fg_free(r->peers);
    r->npeers = 0;
    r->peers = fg_calloc((size_t)cap, sizeof *r->peers);
    if (!r->peers) return fg_error(FG_ENOMEM, "rendezvous: out of memory");
    int joined = 0;
    /* the nodes held since the last round come first, in order of arrival;
     * those not heard yet are read below */
    for (int i = 0; i < r->nlate; i++) {
        peer *p = &r->peers[r->npeers++];
        *p = r->late[i];
        p->node = -1;
        p->held = false;
        if (p->join[0] && joined < want && (st = take_join(r, p, p->join)) == FG_OK) joined++;
        if (st != FG_OK) break;
    }
    r->nlate = 0;
    double t0 = fg_time(), t_min = -1, last_call = 10;
    if (st == FG_OK && r->elastic) {
        if (fg__env_double("FULGUR_RDZV_LAST_CALL_S", 10, &last_call) != FG_OK) st = FG_EINVAL;
        last_call = FG_MIN(last_call, t);
    }
    bool final_pass = false; /* the last call ran out: what is there already is read once more */
    while (joined < want && st == FG_OK) {
        double left = t - (fg_time() - t0);
        if (cancelled(r)) {
            st = fg_error(FG_EPEER, "the rendezvous at %s:%d was interrupted (a signal)", r->addr,
                          r->o.master_port);
            break;
        }
        /* elastic: MIN came; the others get a last call, then the job forms */
        if (r->elastic && joined + 1 >= r->min_nodes) {
            if (t_min < 0) t_min = fg_time();
            if (final_pass) break;
            if (fg_time() - t_min >= last_call || left <= 0) final_pass = true;
        }
        if (left <= 0 && r->elastic && !final_pass) {
            st = fg_error(FG_ETIMEOUT,
                          "the rendezvous at %s:%d: %d node%s joined within %.3g s, below "
                          "--nnodes %d:%d's minimum %d (--rdzv-timeout / FULGUR_RDZV_TIMEOUT_S "
                          "sets the wait)",
                          r->addr, r->o.master_port, joined + 1, joined ? "s" : "", t, r->min_nodes,
                          r->o.num_nodes, r->min_nodes);
            break;
        }
        if (left <= 0 && !r->elastic) {
            char miss[256];
            missing_nodes(r, miss, sizeof miss);
            st = fg_error(FG_ETIMEOUT,
                          "the rendezvous at %s:%d: %d of %d nodes joined within %.3g s; node "
                          "rank%s %s never came (started with --master-addr %s --master-port "
                          "%d? --rdzv-timeout / FULGUR_RDZV_TIMEOUT_S sets the wait)",
                          r->addr, r->o.master_port, joined + 1, r->o.num_nodes, t,
                          want - joined == 1 ? "" : "s", miss, r->addr, r->o.master_port);
            break;
        }
        struct pollfd pf[cap + 1];
        pf[0] = (struct pollfd){.fd = r->listen_fd, .events = POLLIN};
        int polled = r->npeers;
        for (int i = 0; i < polled; i++)
            pf[i + 1] = (struct pollfd){.fd = r->peers[i].fd, .events = POLLIN};
        int ms = final_pass ? 0 : (int)FG_MIN(FG_MAX(left, 0) * 1000 + 1, 200);
        if (poll(pf, (nfds_t)polled + 1, ms) < 0 && errno != EINTR) {
            st = fg_error(FG_EIO, "rendezvous: poll: %s", strerror(errno));
            break;
        }
        accept_all(r, r->peers, &r->npeers, cap);
        /* every peer is read, a new one too (its JOIN may be there already) */
        for (int i = 0; i < r->npeers && st == FG_OK && joined < want; i++) {
            peer *p = &r->peers[i];
            if (i < polled && !(pf[i + 1].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            char line[LINE_MAX_];
            int got = read_line(p->fd, p->buf, &p->len, line, sizeof line);
            if (got < 0) { /* a node that left before the job formed: its slot is free again */
                close(p->fd);
                if (p->node >= 0) joined--;
                *p = r->peers[--r->npeers];
                if (polled > r->npeers) polled = r->npeers;
                i--;
                continue;
            }
            if (got == 0 || p->node >= 0) continue;
            st = take_join(r, p, line);
            if (st == FG_OK) {
                snprintf(p->join, sizeof p->join, "%.159s", line);
                joined++;
            }
        }
    }
    if (st != FG_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", fg_last_error());
        fail_all(r, why);
        fg_error(st, "%s", why);
        return st;
    }
    r->num_nodes = joined + 1;
    r->formed_at = time(NULL);
    /* the connections not in the job (not heard yet, or beyond MAX) wait
     * for the next round: fg_rdzv_poll answers them */
    if (!r->late) r->late = fg_calloc(LATE_MAX, sizeof *r->late);
    if (!r->late) return fg_error(FG_ENOMEM, "rendezvous: out of memory");
    int k = 0;
    for (int i = 0; i < r->npeers; i++) {
        if (r->peers[i].node < 0) {
            r->peers[i].held = r->peers[i].join[0] != 0; /* told WAIT before: still held */
            if (r->nlate < LATE_MAX) r->late[r->nlate++] = r->peers[i];
            else close(r->peers[i].fd);
            continue;
        }
        r->peers[k] = r->peers[i];
        if (r->elastic) r->peers[k].node = k + 1; /* ranks in order of arrival */
        k++;
    }
    r->npeers = k;
    /* peers by node rank, node k at k - 1 */
    for (int i = 0; i < r->npeers; i++)
        while (r->peers[i].node - 1 != i) {
            peer tmp = r->peers[r->peers[i].node - 1];
            r->peers[r->peers[i].node - 1] = r->peers[i];
            r->peers[i] = tmp;
        }
    return FG_OK;
}

static void late_drop(fg_rdzv *r, int i) {
    close(r->late[i].fd);
    r->late[i] = r->late[--r->nlate];
}

/* What a node that came after the round formed is told: held for the
 * next round (WAIT), or why it cannot join (ERR, then dropped). */
static void late_answer(fg_rdzv *r, int i, const char *line) {
    peer *p = &r->late[i];
    char at[32], why[LINE_MAX_ - 8];
    int node;
    if (check_join(r, p->addr, line, &node) != FG_OK) {
        snprintf(why, sizeof why, "%s", fg_last_error());
        fg_clear_error();
        goto refuse;
    }
    if (r->ended) {
        clock_of(r->ended_at, at, sizeof at);
        snprintf(why, sizeof why,
                 "job %s ended at %s (%s); start a new --rdzv-id (or another --master-port) "
                 "for a new job",
                 r->job, at, r->ended_what);
        goto refuse;
    }
    clock_of(r->formed_at, at, sizeof at);
    if (r->round >= r->o.last_round) {
        snprintf(why, sizeof why,
                 "job %s formed at %s with %d node%s and its last round is under way (restart "
                 "%d of --max-restarts %d): no node can join it; start a new --rdzv-id (or "
                 "another --master-port) for a new job",
                 r->job, at, r->num_nodes, r->num_nodes == 1 ? "" : "s", r->round, r->o.last_round);
        goto refuse;
    }
    if (!r->elastic) {
        for (int j = 0; j < r->npeers; j++)
            if (r->peers[j].node == node && !r->peers[j].gone) {
                snprintf(why, sizeof why,
                         "job %s formed at %s and node rank %d is in it (%s), running: give "
                         "each machine its own --node-rank in 0..%d, or start a new --rdzv-id "
                         "for a new job",
                         r->job, at, node, r->peers[j].addr, r->o.num_nodes - 1);
                goto refuse;
            }
        for (int j = 0; j < r->nlate; j++)
            if (j != i && r->late[j].held && atoi(r->late[j].join + 7) == node) {
                snprintf(why, sizeof why,
                         "two nodes claim node rank %d for job %s's next round: %s and %s; "
                         "give each machine its own --node-rank in 0..%d",
                         node, r->job, r->late[j].addr, p->addr, r->o.num_nodes - 1);
                goto refuse;
            }
    }
    snprintf(p->join, sizeof p->join, "%.159s", line);
    p->held = true;
    send_line(p->fd, "WAIT %d %d %s", r->round, r->num_nodes, at);
    fg_log(FG_LOG_INFO, "the node at %s waits for job %s's next round (a restart)", p->addr,
           r->job);
    return;
refuse:
    send_line(p->fd, "ERR %s", why);
    fg_log(FG_LOG_INFO, "refused the node at %s: %s", p->addr, why);
    late_drop(r, i);
}

/* Node 0 during a round and after it: takes and answers late nodes. */
static void serve_late(fg_rdzv *r) {
    if (!r->host || r->listen_fd < 0 || !r->late) return;
    accept_all(r, r->late, &r->nlate, LATE_MAX);
    for (int i = 0; i < r->nlate; i++) {
        peer *p = &r->late[i];
        char line[LINE_MAX_];
        int got = read_line(p->fd, p->buf, &p->len, line, sizeof line);
        if (got < 0) { /* gave up, or a held node went away */
            late_drop(r, i--);
            continue;
        }
        if (got > 0 && !p->held) late_answer(r, i--, line);
    }
}

/* ------------------------------------------------------ other nodes */

static FG_MUST_USE fg_status node_join(fg_rdzv *r, double t, char *value, size_t cap) {
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", r->o.master_port);
    double t0 = fg_time();
    int fd = -1;
    char last[256] = "no answer";
    while (fd < 0) {
        if (cancelled(r))
            return fg_error(FG_EPEER,
                            "the rendezvous with node 0 at %s:%d was interrupted (a "
                            "signal)",
                            r->addr, r->o.master_port);
        if (fg_time() - t0 > t)
            return fg_error(FG_ETIMEOUT,
                            "node 0 at %s:%d did not answer within %.3g s (%s): is it started, "
                            "with the same --master-addr and --master-port? (--rdzv-timeout / "
                            "FULGUR_RDZV_TIMEOUT_S sets the wait)",
                            r->addr, r->o.master_port, t, last);
        struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
        int gai = getaddrinfo(r->addr, port_s, &hints, &ai);
        if (gai) {
            snprintf(last, sizeof last, "%s", gai_strerror(gai));
        } else {
            fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
                snprintf(last, sizeof last, "%s", strerror(errno));
                close(fd);
                fd = -1;
            }
            freeaddrinfo(ai);
        }
        if (fd < 0) {
            struct timespec ts = {0, 100 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    r->fd = fd;
    send_line(fd, "JOIN 1 %d %d:%d %d %s", r->elastic ? -1 : r->o.node_rank, r->min_nodes,
              r->o.num_nodes, r->o.nproc_per_node, r->job);
    /* node 0 answers when every node is in, or says why not; it waits t
     * itself, so this side waits a little longer to hear why */
    double t1 = fg_time();
    bool held = false; /* node 0 said WAIT: its job runs, this node joins its next round */
    for (;;) {
        char line[LINE_MAX_];
        int got = read_line(fd, r->buf, &r->len, line, sizeof line);
        if (got < 0)
            return fg_error(FG_EPEER, "node 0 at %s:%d closed the rendezvous without an answer",
                            r->addr, r->o.master_port);
        if (got > 0) {
            int nr, nn, rd, off = 0;
            if (sscanf(line, "WAIT %d %d %n", &rd, &nn, &off) == 2 && off > 0) {
                held = true;
                char where[FG_CLUSTER_ADDR_MAX + 16]; /* the endpoint, unless it names the job */
                snprintf(where, sizeof where, "%s:%d", r->addr, r->o.master_port);
                if (strcmp(where, r->job))
                    snprintf(where, sizeof where, " at %s:%d", r->addr, r->o.master_port);
                else where[0] = 0;
                fg_log(FG_LOG_INFO,
                       "job %s%s runs with %d node%s since %s (round %d): this node waits for "
                       "its next restart round",
                       r->job, where, nn, nn == 1 ? "" : "s", line + off, rd);
                continue;
            }
            if (sscanf(line, "OK %d %d %d %n", &nr, &nn, &rd, &off) == 3 && off > 0) {
                r->node_rank = nr;
                r->num_nodes = nn;
                r->round = rd;
                snprintf(value, cap, "%s", line + off);
                return FG_OK;
            }
            if (!strncmp(line, "ERR ", 4))
                return fg_error(FG_EPEER, "the rendezvous failed at node 0 (%s:%d): %s", r->addr,
                                r->o.master_port, line + 4);
            return fg_error(FG_EFORMAT, "node 0 at %s:%d answered \"%.60s\": not a fulgur node",
                            r->addr, r->o.master_port, line);
        }
        if (cancelled(r))
            return fg_error(FG_EPEER,
                            "the rendezvous with node 0 at %s:%d was interrupted (a "
                            "signal)",
                            r->addr, r->o.master_port);
        if (fg_time() - t1 > t + 10 && held)
            return fg_error(FG_ETIMEOUT,
                            "node 0 at %s:%d held this node for the next restart round of job "
                            "%s, which did not come within %.3g s (the job runs on without it; "
                            "--rdzv-timeout / FULGUR_RDZV_TIMEOUT_S sets the wait)",
                            r->addr, r->o.master_port, r->job, t + 10);
        if (fg_time() - t1 > t + 10)
            return fg_error(FG_ETIMEOUT,
                            "node 0 at %s:%d took this node in but did not start the job "
                            "within %.3g s",
                            r->addr, r->o.master_port, t + 10);
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        poll(&pf, 1, 200);
    }
}

/* ------------------------------------------------------------ the api */

/* After host_join (node 0, its status st) or instead of it (the others):
 * node 0 starts the ompi-server and hands every node its place. */
static FG_MUST_USE fg_status round_join(fg_rdzv *r, double t, fg_status st, char *value,
                                        size_t cap) {
    if (!r->host) return node_join(r, t, value, cap);
    r->node_rank = 0;
    /* one node (an elastic job that formed alone): no machine to reach */
    if (st == FG_OK && r->o.mpi_server && r->num_nodes > 1)
        st = start_server(r, FG_MIN(t, 60.0), value, cap);
    else if (st == FG_OK) snprintf(value, cap, "-");
    if (st == FG_OK) {
        for (int i = 0; i < r->npeers; i++)
            send_line(r->peers[i].fd, "OK %d %d %d %s", r->peers[i].node, r->num_nodes, r->round,
                      value);
    } else if (r->npeers) {
        char why[512];
        snprintf(why, sizeof why, "%s", fg_last_error());
        fail_all(r, why);
        fg_error(st, "%s", why);
    }
    return st;
}

fg_rdzv *fg_rdzv_join(const fg_rdzv_opts *opts, char *value, size_t cap) {
    if (!opts || !value || !cap) {
        fg_error(FG_EINVAL, "fg_rdzv_join: NULL argument");
        return NULL;
    }
    const fg_rdzv_opts *o = opts;
    int min_nodes = o->min_nodes > 0 ? o->min_nodes : o->num_nodes;
    bool elastic = min_nodes < o->num_nodes;
    if (o->num_nodes < (elastic ? 1 : 2) || min_nodes > o->num_nodes ||
        o->node_rank < (elastic ? -1 : 0) || o->node_rank >= o->num_nodes ||
        o->nproc_per_node < 1 || o->master_port < 1 || o->master_port > 65535 || !o->master_addr ||
        !*o->master_addr) {
        fg_error(FG_EINVAL,
                 "fg_rdzv_join: node_rank=%d num_nodes=%d nproc_per_node=%d master %s:%d: expected "
                 "2 or more nodes, 0 <= node_rank < num_nodes, a master address and a port",
                 o->node_rank, o->num_nodes, o->nproc_per_node,
                 o->master_addr ? o->master_addr : "(null)", o->master_port);
        return NULL;
    }
    double t;
    if (timeout_of(o, &t) < 0) return NULL;
    fg_rdzv *r = fg_calloc(1, sizeof *r);
    if (!r) {
        fg_error(FG_ENOMEM, "fg_rdzv_join: out of memory");
        return NULL;
    }
    r->o = *o;
    r->listen_fd = r->fd = -1;
    r->min_nodes = min_nodes;
    r->elastic = elastic;
    r->node_rank = o->node_rank;
    r->num_nodes = o->num_nodes;
    r->round = o->round;
    snprintf(r->addr, sizeof r->addr, "%s", o->master_addr);
    /* the job's name, one word */
    snprintf(r->job, sizeof r->job, "%s", o->job_id && *o->job_id ? o->job_id : "none");
    for (char *p = r->job; *p; p++)
        if (*p == ' ' || *p == '\t') *p = '_';
    r->o.master_addr = r->addr;
    r->o.job_id = r->job;
    fg_status st = FG_OK;
    /* elastic: the machine of the master address hosts; a second node there
     * finds the port taken by the first and joins it */
    r->host = elastic ? fg_rdzv_is_local(r->addr) : o->node_rank == 0;
    if (r->host) {
        st = host_join(r, t);
        if (elastic && st == FG_EMISMATCH && r->listen_fd < 0 && !r->peers) {
            r->host = false;
            st = FG_OK;
            fg_clear_error();
        }
    }
    if (!r->host && elastic) r->o.node_rank = -1;
    st = round_join(r, t, st, value, cap);
    if (st != FG_OK) {
        char why[1024];
        snprintf(why, sizeof why, "%s", fg_last_error());
        fg_rdzv_free(r);
        fg_error(st, "%s", why);
        return NULL;
    }
    return r;
}

fg_status fg_rdzv_rejoin(fg_rdzv *r, int round, char *value, size_t cap) {
    if (!r || !value || !cap) return fg_error(FG_EINVAL, "fg_rdzv_rejoin: NULL argument");
    if (r->ended)
        return fg_error(FG_ESTATE, "fg_rdzv_rejoin: job %s was ended (fg_rdzv_end)", r->job);
    double t;
    if (timeout_of(&r->o, &t) < 0) return fg_last_status();
    r->round = r->o.round = round;
    r->num_nodes = r->o.num_nodes;
    r->stopped = false;
    fg_status st = FG_OK;
    if (r->host) {
        /* the last round's members are done with; each comes back as a new
         * connection (and the held nodes join first) */
        stop_server(r);
        for (int i = 0; i < r->npeers; i++)
            if (r->peers[i].fd >= 0) close(r->peers[i].fd);
        r->npeers = 0;
        st = host_join(r, t);
    } else {
        if (r->fd >= 0) close(r->fd);
        r->fd = -1;
        r->len = 0;
    }
    return round_join(r, t, st, value, cap);
}

void fg_rdzv_end(fg_rdzv *r, const char *what) {
    if (!r || !r->host || r->ended) return;
    r->ended = true;
    r->ended_at = time(NULL);
    snprintf(r->ended_what, sizeof r->ended_what, "%s", what && *what ? what : "its run ended");
    char at[32];
    clock_of(r->ended_at, at, sizeof at);
    for (int i = 0; r->late && i < r->nlate; i++)
        if (r->late[i].held) {
            send_line(r->late[i].fd,
                      "ERR job %s ended at %s (%s) before its next round; start a new --rdzv-id "
                      "(or another --master-port) for a new job",
                      r->job, at, r->ended_what);
            late_drop(r, i--);
        }
    serve_late(r);
}

/* node 0: tells every node but `except` to stop */
static void stop_others(fg_rdzv *r, int except, const char *why) {
    for (int i = 0; i < r->npeers; i++)
        if (i != except && r->peers[i].fd >= 0 && !r->peers[i].done)
            send_line(r->peers[i].fd, "STOP %s", why);
    r->stopped = true;
}

bool fg_rdzv_is_local(const char *addr) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_DGRAM}, *ai = NULL;
    if (!addr || getaddrinfo(addr, NULL, &hints, &ai) || !ai) return false;
    bool local = false;
    for (struct addrinfo *a = ai; a && !local; a = a->ai_next) {
        int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0) continue;
        struct sockaddr_in sa = *(struct sockaddr_in *)a->ai_addr;
        sa.sin_port = 0;
        local = bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
        close(fd);
    }
    freeaddrinfo(ai);
    return local;
}

void fg_rdzv_layout(const fg_rdzv *r, int *node_rank, int *num_nodes, int *round) {
    if (!r) return;
    if (node_rank) *node_rank = r->node_rank;
    if (num_nodes) *num_nodes = r->num_nodes;
    if (round) *round = r->round;
}

fg_status fg_rdzv_poll(fg_rdzv *r, char *why, size_t cap) {
    if (!r) return FG_OK;
    if (!r->host) {
        if (r->fd < 0) return FG_OK;
        char line[LINE_MAX_];
        int got = read_line(r->fd, r->buf, &r->len, line, sizeof line);
        if (got == 0) return FG_OK;
        close(r->fd);
        r->fd = -1;
        r->stopped = true;
        if (got > 0 && !strncmp(line, "STOP ", 5)) snprintf(why, cap, "%s", line + 5);
        else
            snprintf(why, cap,
                     "node 0 (%s:%d) left the job: its fulgur run ended or its "
                     "machine is gone",
                     r->addr, r->o.master_port);
        return FG_EPEER;
    }
    for (int i = 0; i < r->npeers; i++) {
        peer *p = &r->peers[i];
        if (p->fd < 0) continue;
        char line[LINE_MAX_];
        int got;
        while ((got = read_line(p->fd, p->buf, &p->len, line, sizeof line)) > 0) {
            if (!strcmp(line, "DONE")) p->done = true;
            else if (!strncmp(line, "FAIL ", 5)) {
                p->gone = true;
                snprintf(why, cap, "node %d (%s): %s", p->node, p->addr, line + 5);
                stop_others(r, i, why);
                return FG_EPEER;
            }
        }
        if (got < 0) {
            close(p->fd);
            p->fd = -1;
            p->gone = true;
            if (!p->done) {
                snprintf(why, cap,
                         "node %d (%s) left the job before its ranks finished: its fulgur run "
                         "was killed or its machine is gone",
                         p->node, p->addr);
                stop_others(r, i, why);
                return FG_EPEER;
            }
        }
    }
    serve_late(r);
    return FG_OK;
}

void fg_rdzv_finish(fg_rdzv *r, const char *why) {
    if (!r) return;
    if (!r->host) {
        if (r->fd >= 0) {
            if (why) send_line(r->fd, "FAIL %s", why);
            else send_line(r->fd, "DONE");
        }
        return;
    }
    if (why && !r->stopped) {
        char b[LINE_MAX_];
        snprintf(b, sizeof b, "node 0 (%s): %s", r->addr, why);
        stop_others(r, -1, b);
    }
}

fg_status fg_rdzv_wait_done(fg_rdzv *r, double wait_s) {
    if (!r || !r->host) return FG_OK;
    double t0 = fg_time();
    for (bool first = true;; first = false) {
        int open_ = 0;
        for (int i = 0; i < r->npeers; i++) {
            peer *p = &r->peers[i];
            if (p->fd < 0) continue;
            char line[LINE_MAX_];
            int got;
            while ((got = read_line(p->fd, p->buf, &p->len, line, sizeof line)) > 0)
                if (!strcmp(line, "DONE")) p->done = true;
            if (got < 0 || p->done) {
                close(p->fd);
                p->fd = -1;
            } else {
                open_++;
            }
        }
        if (first && open_)
            fg_log(FG_LOG_INFO,
                   "node 0's ranks ended: waiting up to %.3g s for %d node%s still running", wait_s,
                   open_, open_ == 1 ? "" : "s");
        serve_late(r);
        if (!open_) return FG_OK;
        if (fg_time() - t0 > wait_s)
            return fg_error(FG_ETIMEOUT, "%d node%s still running %.3g s after node 0 finished",
                            open_, open_ == 1 ? "" : "s", wait_s);
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

void fg_rdzv_free(fg_rdzv *r) {
    if (!r) return;
    fg_rdzv_end(r, NULL); /* a held node is told, not just dropped */
    stop_server(r);
    if (r->listen_fd >= 0) close(r->listen_fd);
    if (r->fd >= 0) close(r->fd);
    for (int i = 0; i < r->npeers; i++)
        if (r->peers[i].fd >= 0) close(r->peers[i].fd);
    for (int i = 0; i < r->nlate; i++) close(r->late[i].fd);
    fg_free(r->peers);
    fg_free(r->late);
    fg_free(r);
}
