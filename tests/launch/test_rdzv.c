/* The rendezvous of per-machine starts (src/launch/rdzv.c) on this machine,
 * one thread per node on 127.0.0.1: a job forms with every node's place; a
 * node's failure reaches node 0 and, through it, the others; a node that
 * leaves is named; and each failure of the join has its message: a node
 * that never comes, node 0 that never answers, the port taken, two nodes
 * with one rank, world sizes or jobs that disagree, an elastic job below
 * its minimum. No ompi-server is started (mpi_server false). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

#include "fulgur/launch.h"

/* a port nobody listens on now */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    bind(fd, (struct sockaddr *)&sa, sizeof sa);
    getsockname(fd, (struct sockaddr *)&sa, &len);
    close(fd);
    return ntohs(sa.sin_port);
}

typedef struct {
    fg_rdzv_opts o;
    fg_rdzv *r;
    fg_status st;
    char msg[1024], value[256];
    int node_rank, num_nodes, round;
} node;

static void *join_main(void *arg) {
    node *n = arg;
    n->r = fg_rdzv_join(&n->o, n->value, sizeof n->value);
    n->st = n->r ? FG_OK : fg_last_status();
    snprintf(n->msg, sizeof n->msg, "%s", n->r ? "" : fg_last_error());
    if (n->r) fg_rdzv_layout(n->r, &n->node_rank, &n->num_nodes, &n->round);
    return NULL;
}

/* runs the nodes' joins at once, each on its own thread */
static void join_all(node *ns, int n) {
    pthread_t th[8];
    for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, join_main, &ns[i]);
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
}

static fg_rdzv_opts opts(int port, int rank, int nodes, int nproc, double timeout) {
    return (fg_rdzv_opts){.master_addr = "127.0.0.1",
                          .master_port = port,
                          .node_rank = rank,
                          .num_nodes = nodes,
                          .nproc_per_node = nproc,
                          .job_id = "job7",
                          .timeout_s = timeout};
}

/* polls r until it reports (or ~5 s) */
static fg_status poll_until(fg_rdzv *r, char *why, size_t cap) {
    for (int i = 0; i < 500; i++) {
        fg_status st = fg_rdzv_poll(r, why, cap);
        if (st != FG_OK) return st;
        usleep(10000);
    }
    return FG_OK;
}

TEST(three_nodes_form_and_a_failure_reaches_all) {
    int port = free_port();
    node ns[3] = {{.o = opts(port, 0, 3, 2, 10)},
                  {.o = opts(port, 2, 3, 2, 10)},
                  {.o = opts(port, 1, 3, 2, 10)}};
    join_all(ns, 3);
    for (int i = 0; i < 3; i++) {
        CHECK_MSG(ns[i].st == FG_OK, "node %d: %s", i, ns[i].msg);
        CHECK(!strcmp(ns[i].value, "-"));
        CHECK(ns[i].num_nodes == 3 && ns[i].node_rank == ns[i].o.node_rank && ns[i].round == 0);
    }
    if (!ns[0].r || !ns[1].r || !ns[2].r) goto out;
    char why[512] = "";
    CHECK(fg_rdzv_poll(ns[0].r, why, sizeof why) == FG_OK);
    fg_rdzv_finish(ns[1].r, "rank 5 (pid 42) exited with code 3");
    CHECK(poll_until(ns[0].r, why, sizeof why) == FG_EPEER);
    CHECK_CONTAINS(why, "node 2 (127.0.0.1): rank 5 (pid 42) exited with code 3");
    CHECK(poll_until(ns[2].r, why, sizeof why) == FG_EPEER);
    CHECK_CONTAINS(why, "node 2 (127.0.0.1): rank 5 (pid 42) exited with code 3");
out:
    for (int i = 0; i < 3; i++) fg_rdzv_free(ns[i].r);
}

TEST(a_node_that_leaves_is_named_and_done_nodes_are_not) {
    int port = free_port();
    node ns[3] = {{.o = opts(port, 0, 3, 1, 10)},
                  {.o = opts(port, 1, 3, 1, 10)},
                  {.o = opts(port, 2, 3, 1, 10)}};
    join_all(ns, 3);
    if (!ns[0].r || !ns[1].r || !ns[2].r) {
        FG_FAIL_("join: %s %s %s", ns[0].msg, ns[1].msg, ns[2].msg);
        goto out;
    }
    char why[512] = "";
    fg_rdzv_finish(ns[2].r, NULL); /* done: leaving now is no failure */
    fg_rdzv_free(ns[2].r);
    ns[2].r = NULL;
    usleep(100000);
    CHECK(fg_rdzv_poll(ns[0].r, why, sizeof why) == FG_OK);
    fg_rdzv_free(ns[1].r); /* gone without a word: its machine died */
    ns[1].r = NULL;
    CHECK(poll_until(ns[0].r, why, sizeof why) == FG_EPEER);
    CHECK_CONTAINS(why, "node 1 (127.0.0.1) left the job before its ranks finished");
out:
    for (int i = 0; i < 3; i++) fg_rdzv_free(ns[i].r);
}

TEST(a_node_never_comes) {
    int port = free_port();
    node n0 = {.o = opts(port, 0, 3, 2, 0.3)};
    node n2 = {.o = opts(port, 2, 3, 2, 0.3)};
    node both[2] = {n0, n2};
    join_all(both, 2);
    CHECK(both[0].st == FG_ETIMEOUT);
    CHECK_CONTAINS(both[0].msg, "2 of 3 nodes joined within 0.3 s; node rank 1 never came");
    CHECK(both[1].st == FG_EPEER);
    CHECK_CONTAINS(both[1].msg, "the rendezvous failed at node 0 (127.0.0.1:");
    CHECK_CONTAINS(both[1].msg, "node rank 1 never came");
    node alone = {.o = opts(free_port(), 1, 2, 2, 0.3)};
    join_main(&alone);
    CHECK(alone.st == FG_ETIMEOUT);
    CHECK_CONTAINS(alone.msg, "did not answer within 0.3 s (Connection refused)");
}

TEST(the_master_port_taken) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t len = sizeof sa;
    bind(fd, (struct sockaddr *)&sa, sizeof sa);
    listen(fd, 1);
    getsockname(fd, (struct sockaddr *)&sa, &len);
    int port = ntohs(sa.sin_port);
    node n0 = {.o = opts(port, 0, 2, 2, 1)};
    join_main(&n0);
    CHECK(n0.st == FG_EMISMATCH);
    char want[128];
    snprintf(want, sizeof want, "master port %d is taken on this machine", port);
    CHECK_CONTAINS(n0.msg, want);
    close(fd);
}

TEST(two_nodes_with_one_rank) {
    int port = free_port();
    node ns[3] = {{.o = opts(port, 0, 3, 2, 5)},
                  {.o = opts(port, 1, 3, 2, 5)},
                  {.o = opts(port, 1, 3, 2, 5)}};
    join_all(ns, 3);
    CHECK(ns[0].st == FG_EMISMATCH);
    CHECK_CONTAINS(ns[0].msg, "two nodes claim node rank 1: 127.0.0.1 and 127.0.0.1; give each "
                              "machine its own --node-rank in 0..2");
    for (int i = 1; i < 3; i++) {
        CHECK(ns[i].st == FG_EPEER);
        CHECK_CONTAINS(ns[i].msg, "the rendezvous failed at node 0");
        CHECK_CONTAINS(ns[i].msg, "two nodes claim node rank 1");
    }
}

TEST(world_sizes_and_jobs_that_disagree) {
    int port = free_port();
    node ns[2] = {{.o = opts(port, 0, 2, 2, 5)}, {.o = opts(port, 1, 2, 4, 5)}};
    join_all(ns, 2);
    CHECK(ns[0].st == FG_EMISMATCH);
    CHECK_CONTAINS(ns[0].msg, "world sizes disagree: node rank 1 (127.0.0.1) has --nnodes 2 "
                              "--nproc-per-node 4 (8 ranks), node 0 has --nnodes 2 "
                              "--nproc-per-node 2 (4 ranks)");
    CHECK(ns[1].st == FG_EPEER);
    CHECK_CONTAINS(ns[1].msg, "world sizes disagree");
    port = free_port();
    node js[2] = {{.o = opts(port, 0, 2, 2, 5)}, {.o = opts(port, 1, 2, 2, 5)}};
    js[1].o.job_id = "other";
    join_all(js, 2);
    CHECK(js[0].st == FG_EMISMATCH);
    CHECK_CONTAINS(js[0].msg, "node rank 1 (127.0.0.1) is of job \"other\", this one is \"job7\"");
}

TEST(elastic_forms_with_who_came_and_names_the_minimum) {
    setenv("FULGUR_RDZV_LAST_CALL_S", "0.3", 1);
    int port = free_port();
    node ns[2] = {{.o = opts(port, -1, 3, 2, 5)}, {.o = opts(port, -1, 3, 2, 5)}};
    ns[0].o.min_nodes = ns[1].o.min_nodes = 1;
    ns[0].o.round = ns[1].o.round = 4;
    join_all(ns, 2); /* both on this machine: the first to bind hosts, the other joins */
    CHECK_MSG(ns[0].st == FG_OK && ns[1].st == FG_OK, "%s | %s", ns[0].msg, ns[1].msg);
    CHECK(ns[0].num_nodes == 2 && ns[1].num_nodes == 2);
    CHECK(ns[0].node_rank + ns[1].node_rank == 1); /* 0 and 1, in order of arrival */
    CHECK(ns[0].round == 4 && ns[1].round == 4);
    fg_rdzv_free(ns[0].r);
    fg_rdzv_free(ns[1].r);
    node few = {.o = opts(free_port(), -1, 4, 2, 0.3)};
    few.o.min_nodes = 2;
    join_main(&few);
    CHECK(few.st == FG_ETIMEOUT);
    CHECK_CONTAINS(few.msg, "1 node joined within 0.3 s, below --nnodes 2:4's minimum 2");
    unsetenv("FULGUR_RDZV_LAST_CALL_S");
}

static volatile int g_cancel;

static void *cancel_soon(void *arg) {
    (void)arg;
    usleep(200000);
    g_cancel = 1;
    return NULL;
}

TEST(a_signal_ends_the_wait) {
    node n0 = {.o = opts(free_port(), 0, 2, 1, 30)};
    n0.o.cancel = &g_cancel;
    g_cancel = 0;
    pthread_t th;
    pthread_create(&th, NULL, cancel_soon, NULL);
    join_main(&n0); /* would wait 30 s for node 1 */
    pthread_join(th, NULL);
    CHECK(n0.st == FG_EPEER);
    CHECK_CONTAINS(n0.msg, "was interrupted (a signal)");
    node n1 = {.o = opts(free_port(), 1, 2, 1, 30)};
    n1.o.cancel = &g_cancel;
    g_cancel = 0;
    pthread_create(&th, NULL, cancel_soon, NULL);
    join_main(&n1); /* would retry node 0 for 30 s */
    pthread_join(th, NULL);
    CHECK(n1.st == FG_EPEER);
    CHECK_CONTAINS(n1.msg, "the rendezvous with node 0 at 127.0.0.1:");
}

/* ---- nodes that come after a round formed */

static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_log[8192];

static void log_sink(void *ud, fg_log_level level, int rank, const char *msg) {
    (void)ud;
    (void)level;
    (void)rank;
    pthread_mutex_lock(&g_log_mu);
    size_t n = strlen(g_log);
    snprintf(g_log + n, sizeof g_log - n, "%s\n", msg);
    pthread_mutex_unlock(&g_log_mu);
}

static bool log_has(const char *s) {
    pthread_mutex_lock(&g_log_mu);
    bool has = strstr(g_log, s) != NULL;
    pthread_mutex_unlock(&g_log_mu);
    return has;
}

typedef struct {
    node *n;
    int round; /* > 0: fg_rdzv_rejoin n->r at this round instead of a join */
    volatile int done;
} bg;

static void *bg_main(void *arg) {
    bg *b = arg;
    if (b->round > 0) {
        b->n->st = fg_rdzv_rejoin(b->n->r, b->round, b->n->value, sizeof b->n->value);
        snprintf(b->n->msg, sizeof b->n->msg, "%s", b->n->st ? fg_last_error() : "");
        fg_rdzv_layout(b->n->r, &b->n->node_rank, &b->n->num_nodes, &b->n->round);
    } else {
        join_main(b->n);
    }
    b->done = 1;
    return NULL;
}

/* node 0 serves its late nodes (fg_rdzv_poll) until b is done or the log
 * shows `until` (~20 s at most: a hang, not a bound on the answer) */
static void serve_until(fg_rdzv *r, bg *b, const char *until) {
    char why[256];
    for (int i = 0; i < 2000 && !b->done && !(until && log_has(until)); i++) {
        if (fg_rdzv_poll(r, why, sizeof why) != FG_OK) break;
        usleep(10000);
    }
}

TEST(elastic_a_node_that_comes_during_a_round_joins_the_next_first) {
    setenv("FULGUR_RDZV_LAST_CALL_S", "0.2", 1);
    g_log[0] = 0;
    fg_set_log(log_sink, NULL, FG_LOG_INFO);
    int port = free_port();
    node h = {.o = opts(port, -1, 2, 2, 20)};
    h.o.min_nodes = 1;
    h.o.last_round = 1;
    join_main(&h); /* alone: the job forms with 1 node after the last call */
    CHECK_MSG(h.st == FG_OK && h.num_nodes == 1 && h.node_rank == 0, "%s", h.msg);
    node late = {.o = opts(port, -1, 2, 2, 20)};
    late.o.min_nodes = 1;
    bg b = {.n = &late};
    pthread_t th;
    if (!h.r) goto out;
    /* on this machine too: the port is node 0's still, so it joins node 0 */
    pthread_create(&th, NULL, bg_main, &b);
    serve_until(h.r, &b, "waits for its next restart round");
    CHECK_MSG(log_has("job job7 at 127.0.0.1:") && log_has("runs with 1 node since "), "%s", g_log);
    CHECK(log_has("waits for job job7's next round (a restart)"));
    CHECK(!b.done); /* held, connected */
    fg_rdzv_finish(h.r, "rank 1 (pid 9) exited with code 1");
    char v[64];
    /* the held node is in at once: no window to hit, no last call to wait */
    CHECK(fg_rdzv_rejoin(h.r, 1, v, sizeof v) == FG_OK);
    pthread_join(th, NULL);
    CHECK_MSG(late.st == FG_OK, "%s", late.msg);
    int nr = -1, nn = -1, rd = -1;
    fg_rdzv_layout(h.r, &nr, &nn, &rd);
    CHECK(nr == 0 && nn == 2 && rd == 1);
    CHECK(late.node_rank == 1 && late.num_nodes == 2 && late.round == 1);
    fg_rdzv_free(late.r);
out:
    fg_rdzv_free(h.r);
    fg_set_log(NULL, NULL, FG_LOG_INFO);
    unsetenv("FULGUR_RDZV_LAST_CALL_S");
}

TEST(a_late_node_is_told_at_once_the_last_round_runs_or_the_job_ended) {
    setenv("FULGUR_RDZV_LAST_CALL_S", "0.2", 1);
    int port = free_port();
    node h = {.o = opts(port, -1, 2, 2, 20)};
    h.o.min_nodes = 1; /* last_round 0: no restart round will come */
    join_main(&h);
    CHECK_MSG(h.st == FG_OK, "%s", h.msg);
    if (!h.r) goto out;
    node late = {.o = opts(port, -1, 2, 2, 20)};
    late.o.min_nodes = 1;
    bg b = {.n = &late};
    pthread_t th;
    pthread_create(&th, NULL, bg_main, &b);
    serve_until(h.r, &b, NULL);
    pthread_join(th, NULL);
    CHECK(late.st == FG_EPEER);
    CHECK_CONTAINS(late.msg, "the rendezvous failed at node 0 (127.0.0.1:");
    CHECK_CONTAINS(late.msg, "job job7 formed at ");
    CHECK_CONTAINS(late.msg, " with 1 node and its last round is under way (restart 0 of "
                             "--max-restarts 0): no node can join it; start a new --rdzv-id");
    fg_rdzv_end(h.r, "its ranks finished");
    node after = {.o = opts(port, -1, 2, 2, 20)};
    after.o.min_nodes = 1;
    bg b2 = {.n = &after};
    pthread_create(&th, NULL, bg_main, &b2);
    for (int i = 0; i < 2000 && !b2.done; i++) { /* node 0 waits for its nodes' DONE */
        CHECK(fg_rdzv_wait_done(h.r, 1) == FG_OK);
        usleep(10000);
    }
    pthread_join(th, NULL);
    CHECK(after.st == FG_EPEER);
    CHECK_CONTAINS(after.msg, "job job7 ended at ");
    CHECK_CONTAINS(after.msg, " UTC (its ranks finished); start a new --rdzv-id");
    char v[16];
    CHECK(fg_rdzv_rejoin(h.r, 1, v, sizeof v) == FG_ESTATE);
out:
    fg_rdzv_free(h.r);
    unsetenv("FULGUR_RDZV_LAST_CALL_S");
}

TEST(fixed_a_node_with_a_running_rank_is_refused_and_members_meet_again) {
    int port = free_port();
    node ns[2] = {{.o = opts(port, 0, 2, 1, 10)}, {.o = opts(port, 1, 2, 1, 10)}};
    ns[0].o.last_round = ns[1].o.last_round = 1;
    join_all(ns, 2);
    CHECK_MSG(ns[0].st == FG_OK && ns[1].st == FG_OK, "%s | %s", ns[0].msg, ns[1].msg);
    if (!ns[0].r || !ns[1].r) goto out;
    node dup = {.o = opts(port, 1, 2, 1, 10)};
    bg b = {.n = &dup};
    pthread_t th;
    pthread_create(&th, NULL, bg_main, &b);
    serve_until(ns[0].r, &b, NULL);
    pthread_join(th, NULL);
    CHECK(dup.st == FG_EPEER);
    CHECK_CONTAINS(dup.msg, "node rank 1 is in it (127.0.0.1), running: give each machine its "
                            "own --node-rank in 0..1, or start a new --rdzv-id");
    /* node 1 fails; both meet again at round 1, node 1 first */
    char why[256];
    fg_rdzv_finish(ns[1].r, "rank 1 (pid 7) exited with code 1");
    CHECK(poll_until(ns[0].r, why, sizeof why) == FG_EPEER);
    bg b1 = {.n = &ns[1], .round = 1};
    pthread_create(&th, NULL, bg_main, &b1);
    usleep(50000);
    char v[64];
    CHECK(fg_rdzv_rejoin(ns[0].r, 1, v, sizeof v) == FG_OK);
    pthread_join(th, NULL);
    CHECK_MSG(ns[1].st == FG_OK, "%s", ns[1].msg);
    CHECK(ns[1].node_rank == 1 && ns[1].num_nodes == 2 && ns[1].round == 1);
out:
    fg_rdzv_free(ns[0].r);
    fg_rdzv_free(ns[1].r);
}

TEST(bad_options) {
    char v[16];
    fg_rdzv_opts o = opts(0, 0, 2, 1, 1);
    CHECK(fg_rdzv_join(&o, v, sizeof v) == NULL && fg_last_status() == FG_EINVAL);
    o = opts(1234, 2, 2, 1, 1);
    CHECK(fg_rdzv_join(&o, v, sizeof v) == NULL && fg_last_status() == FG_EINVAL);
    CHECK(fg_rdzv_is_local("127.0.0.1"));
    CHECK(!fg_rdzv_is_local("203.0.113.254")); /* TEST-NET-3: nobody's */
    fg_rdzv_free(NULL);
}
