/* fg_fabric_launch: starts the ranks and runs the user's function on each.
 *
 *   already launched (the environment names a rank: fulgur run, mpirun,
 *     srun, torchrun): join the job;
 *   ddp, not launched: re-execute this program once per extra rank with the
 *     FULGUR_* contract; this process is rank 0. A supervisor thread waits on
 *     the children: when one dies abnormally it stops the others and aborts
 *     the communicator, so rank 0 leaves its collective at once. Children get
 *     SIGKILL if the parent dies (PR_SET_PDEATHSIG), so nothing is orphaned;
 *   ddp_spawn / ddp_fork: fork every rank; rank 0 writes its final
 *     parameters and optimizer state to a memfd the parent reads afterwards
 *     (Lightning's ddp_spawn loses the trained model; fulgur hands it back);
 *   single, dp: run here. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fabric_impl.h"

extern char **environ;

typedef struct child {
    pid_t pid;
    int rank;
    int status;
    bool done;
} child;

typedef struct supervisor {
    child *kids;
    int n;
    fg_fabric *f;
    pthread_t thread;
    pthread_mutex_t mu;
    bool stop;
    int failed_rank; /* -1 while none */
    char why[256];
} supervisor;

static void describe_exit(int status, char *buf, size_t n) {
    if (WIFSIGNALED(status))
        snprintf(buf, n, "was killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
    else
        snprintf(buf, n, "exited with code %d", WEXITSTATUS(status));
}

static void stop_children(child *kids, int n) {
    for (int i = 0; i < n; i++)
        if (!kids[i].done) kill(kids[i].pid, SIGTERM);
    double t0 = fg_time();
    for (;;) {
        bool left = false;
        for (int i = 0; i < n; i++) {
            if (kids[i].done) continue;
            if (waitpid(kids[i].pid, &kids[i].status, WNOHANG) == kids[i].pid) kids[i].done = true;
            else left = true;
        }
        if (!left) return;
        if (fg_time() - t0 > 3.0) {
            for (int i = 0; i < n; i++)
                if (!kids[i].done) {
                    kill(kids[i].pid, SIGKILL);
                    waitpid(kids[i].pid, &kids[i].status, 0);
                    kids[i].done = true;
                }
            return;
        }
        usleep(10000);
    }
}

static void *supervise(void *arg) {
    supervisor *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        bool stop = s->stop;
        pthread_mutex_unlock(&s->mu);
        if (stop) return NULL;
        for (int i = 0; i < s->n; i++) {
            child *c = &s->kids[i];
            if (c->done || waitpid(c->pid, &c->status, WNOHANG) != c->pid) continue;
            c->done = true;
            if (WIFEXITED(c->status) && WEXITSTATUS(c->status) == 0) continue;
            char how[128];
            describe_exit(c->status, how, sizeof how);
            pthread_mutex_lock(&s->mu);
            if (s->failed_rank < 0) {
                s->failed_rank = c->rank;
                snprintf(s->why, sizeof s->why, "rank %d (pid %d) %s", c->rank, (int)c->pid, how);
            }
            pthread_mutex_unlock(&s->mu);
            stop_children(s->kids, s->n);
            /* Rank 0 may be waiting on the dead rank in a collective. */
            if (s->f->comm) fg_comm_abort(s->f->comm);
            return NULL;
        }
        usleep(20000);
    }
}

static void set_env_int(const char *k, long v) {
    char b[32];
    snprintf(b, sizeof b, "%ld", v);
    setenv(k, b, 1);
}

/* Exports the contract for rank r of n on this one machine. */
static void export_rank(int r, int n, const char *job, int port) {
    set_env_int("FULGUR_RANK", r);
    set_env_int("FULGUR_WORLD_SIZE", n);
    set_env_int("FULGUR_LOCAL_RANK", r);
    set_env_int("FULGUR_LOCAL_WORLD_SIZE", n);
    set_env_int("FULGUR_NODE_RANK", 0);
    set_env_int("FULGUR_NUM_NODES", 1);
    setenv("FULGUR_MASTER_ADDR", "127.0.0.1", 1);
    set_env_int("FULGUR_MASTER_PORT", port);
    setenv("FULGUR_JOB_ID", job, 1);
}

static fg_status spawn_reexec(fg_fabric *f, int n, const char *job, int port, supervisor *sv) {
    char exe[4096];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) return fg_error(FG_EIO, "ddp launcher: cannot find this program (/proc/self/exe): %s",
                                  strerror(errno));
    exe[len] = '\0';
    FILE *cmd = fopen("/proc/self/cmdline", "rb");
    if (!cmd) return fg_error(FG_EIO, "ddp launcher: cannot read /proc/self/cmdline");
    static char args[65536];
    size_t got = fread(args, 1, sizeof args - 1, cmd);
    fclose(cmd);
    args[got] = '\0';
    char *argv[1024];
    int argc = 0;
    for (size_t i = 0; i < got && argc < 1023; i += strlen(args + i) + 1) argv[argc++] = args + i;
    argv[argc] = NULL;
    sv->kids = fg_calloc((size_t)n, sizeof *sv->kids);
    if (!sv->kids) return FG_ENOMEM;
    pid_t parent = getpid();
    for (int r = 1; r < n; r++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) {
            stop_children(sv->kids, sv->n);
            return fg_error(FG_EIO, "ddp launcher: fork for rank %d: %s", r, strerror(errno));
        }
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) _exit(127); /* the parent died before prctl */
            export_rank(r, n, job, port);
            execve(exe, argv, environ);
            _exit(127);
        }
        sv->kids[sv->n++] = (child){.pid = pid, .rank = r};
    }
    sv->f = f;
    sv->failed_rank = -1;
    pthread_mutex_init(&sv->mu, NULL);
    if (pthread_create(&sv->thread, NULL, supervise, sv) != 0) {
        stop_children(sv->kids, sv->n);
        return fg_error(FG_EIO, "ddp launcher: cannot start the supervisor thread");
    }
    return FG_OK;
}

/* Joins the communicator described by info (world > 1) and sets ranks and threads. */
static fg_status join(fg_fabric *f, const fg_cluster_info *info) {
    f->info = *info;
    f->world_size = info->world_size;
    f->global_rank = info->rank;
    f->local_rank = info->local_rank;
    f->node_rank = info->node_rank;
    fg_set_log_rank(info->rank);
    int local = info->local_world_size > 0 ? info->local_world_size : 1;
    int threads = f->cfg.threads_per_rank;
    if (!threads) {
        long env = 0;
        if (fg__env_int("FULGUR_NUM_THREADS", 0, &env) == FG_OK && env > 0) threads = (int)env;
    }
    if (!threads) threads = fg_num_cores() / local > 0 ? fg_num_cores() / local : 1;
    f->threads = threads;
    FG_TRY(fg_set_num_threads(threads));
    if (info->world_size > 1 && f->kind == FG_STRATEGY_DDP)
        return fg_comm_init(info, NULL, &f->comm);
    return FG_OK;
}

/* Stops the supervisor thread (before the communicator it may abort goes). */
static void stop_supervisor(supervisor *sv) {
    if (!sv->kids) return;
    pthread_mutex_lock(&sv->mu);
    sv->stop = true;
    pthread_mutex_unlock(&sv->mu);
    pthread_join(sv->thread, NULL);
    pthread_mutex_destroy(&sv->mu);
}

/* Waits for the children to finish (they run the same program), stopping
 * them after a while; FG_EPEER naming the first that failed. */
static fg_status wait_children(supervisor *sv) {
    if (!sv->kids) return FG_OK;
    double t0 = fg_time();
    for (;;) {
        bool left = false;
        for (int i = 0; i < sv->n; i++) {
            child *c = &sv->kids[i];
            if (!c->done && waitpid(c->pid, &c->status, WNOHANG) == c->pid) {
                c->done = true;
                if ((!WIFEXITED(c->status) || WEXITSTATUS(c->status)) && sv->failed_rank < 0) {
                    char how[128];
                    describe_exit(c->status, how, sizeof how);
                    sv->failed_rank = c->rank;
                    snprintf(sv->why, sizeof sv->why, "rank %d (pid %d) %s", c->rank, (int)c->pid, how);
                }
            }
            left |= !c->done;
        }
        if (!left || sv->failed_rank >= 0 || fg_time() - t0 > 30) break;
        usleep(10000);
    }
    stop_children(sv->kids, sv->n);
    fg_status s = sv->failed_rank >= 0 ? fg_error(FG_EPEER, "%s", sv->why) : FG_OK;
    fg_free(sv->kids);
    sv->kids = NULL;
    return s;
}

/* ---------------------------------------------------------------- spawn */

static int write_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

/* ddp_spawn: rank 0's state as of its last step (flat parameters, then each
 * optimizer state buffer), copied at every fg_step_end: run() may free its
 * model before returning, and the parent still gets what it trained. */
void fg__spawn_snapshot(fg_fabric *f) {
    if (!f->spawn || f->global_rank != 0 || !f->model) return;
    fg_tensor *flat = fg_module_flat_params(f->model);
    uint64_t nstate = f->opt ? (uint64_t)fg_optimizer_num_states(f->opt) : 0;
    uint64_t bytes = fg_tensor_nbytes(flat);
    uint64_t hdr[3] = {bytes, nstate, f->opt ? (uint64_t)fg_optimizer_step_count(f->opt) : 0};
    size_t need = sizeof hdr + (size_t)bytes * (size_t)(1 + nstate);
    if (f->spawn_blob_len != need) {
        fg_free(f->spawn_blob);
        f->spawn_blob = fg_alloc(need);
        f->spawn_blob_len = f->spawn_blob ? need : 0;
        if (!f->spawn_blob) return;
    }
    char *p = f->spawn_blob;
    memcpy(p, hdr, sizeof hdr);
    memcpy(p + sizeof hdr, fg_tensor_data(flat), bytes);
    for (uint64_t k = 0; k < nstate; k++)
        memcpy(p + sizeof hdr + (k + 1) * bytes, fg_tensor_data(fg_optimizer_state(f->opt, (int)k)), bytes);
}

static int spawn_fork(fg_fabric *f, int n, int (*run)(fg_fabric *, void *), void *arg,
                      const char *job) {
    int fd = memfd_create("fulgur-spawn-result", 0);
    if (fd < 0) {
        fg_error(FG_EIO, "ddp_spawn: memfd_create: %s", strerror(errno));
        return 1;
    }
    child kids[256];
    int nk = 0;
    pid_t parent = getpid();
    for (int r = 0; r < n && r < 256; r++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) {
            stop_children(kids, nk);
            close(fd);
            fg_error(FG_EIO, "ddp_spawn: fork for rank %d: %s", r, strerror(errno));
            return 1;
        }
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) _exit(127);
            fg_cluster_info info = {.rank = r, .world_size = n, .local_rank = r,
                                    .local_world_size = n, .num_nodes = 1, .source = "explicit"};
            snprintf(info.job_id, sizeof info.job_id, "%s", job);
            int rc = 1;
            if (join(f, &info) == FG_OK) {
                rc = run(f, arg);
                if (rc == 0 && r == 0 && f->spawn_blob_len &&
                    write_all(fd, f->spawn_blob, f->spawn_blob_len) != 0)
                    rc = 1;
            }
            fflush(NULL);
            _exit(rc & 0xff);
        }
        kids[nk++] = (child){.pid = pid, .rank = r};
    }
    /* The parent only waits: a failure stops the rest. */
    int failed = -1, left = nk;
    char why[256] = "";
    while (left) {
        int st;
        pid_t p = waitpid(-1, &st, 0);
        if (p < 0) {
            if (errno == EINTR) continue;
            break;
        }
        for (int i = 0; i < nk; i++) {
            if (kids[i].pid != p || kids[i].done) continue;
            kids[i].done = true;
            kids[i].status = st;
            left--;
            if ((!WIFEXITED(st) || WEXITSTATUS(st) != 0) && failed < 0) {
                failed = kids[i].rank;
                char how[128];
                describe_exit(st, how, sizeof how);
                snprintf(why, sizeof why, "rank %d (pid %d) %s", kids[i].rank, (int)p, how);
                stop_children(kids, nk);
                left = 0;
            }
        }
    }
    if (failed >= 0) {
        close(fd);
        fg_error(FG_EPEER, "%s", why);
        return 1;
    }
    off_t size = lseek(fd, 0, SEEK_END);
    if (size > 0) {
        f->spawn_blob = fg_alloc((size_t)size);
        if (f->spawn_blob && pread(fd, f->spawn_blob, (size_t)size, 0) == size)
            f->spawn_blob_len = (size_t)size;
    }
    close(fd);
    return 0;
}

fg_status fg_fabric_spawn_result(fg_fabric *f, fg_module *model, fg_optimizer *opt) {
    if (!f->spawn_blob_len) return fg_error(FG_ESTATE, "spawn_result: no result (not a ddp_spawn launch, or rank 0 set up no model)");
    uint64_t hdr[3];
    memcpy(hdr, f->spawn_blob, sizeof hdr);
    fg_tensor *flat = fg_module_flat_params(model);
    if (hdr[0] != fg_tensor_nbytes(flat))
        return fg_error(FG_EMISMATCH, "spawn_result: the ranks trained %llu bytes of parameters, "
                                      "this model has %zu", (unsigned long long)hdr[0], fg_tensor_nbytes(flat));
    const char *p = (const char *)f->spawn_blob + sizeof hdr;
    memcpy(fg_tensor_data(flat), p, hdr[0]);
    if (opt && (uint64_t)fg_optimizer_num_states(opt) == hdr[1]) {
        for (uint64_t k = 0; k < hdr[1]; k++)
            memcpy(fg_tensor_data(fg_optimizer_state(opt, (int)k)), p + (k + 1) * hdr[0], hdr[0]);
        fg_optimizer_set_step_count(opt, (int64_t)hdr[2]);
    }
    return FG_OK;
}

static fg_status custom_info(fg_fabric *f, fg_cluster_info *info) {
    memset(info, 0, sizeof *info);
    FG_TRY(f->cfg.cluster(f->cfg.cluster_ud, info));
    if (!info->source) info->source = "custom";
    return fg_cluster_validate(info);
}

int fg_fabric_launch(fg_fabric *f, int (*run)(fg_fabric *f, void *arg), void *arg) {
    if (!f || !run) {
        fg_error(FG_EINVAL, "fabric launch: NULL fabric or run function");
        return 1;
    }
    int want = f->kind == FG_STRATEGY_DDP ? f->ndevices * f->num_nodes : 1;
    fg_cluster_info info;
    fg_status s = f->cfg.cluster ? custom_info(f, &info) : fg_cluster_detect(&info);
    if (s != FG_OK) return 1;
    bool launched = info.world_size > 1 || strcmp(info.source, "none") != 0;
    if (launched && f->kind == FG_STRATEGY_DDP && f->spawn) {
        fg_error(FG_EINVAL, "strategy=\"%s\" forks its own ranks, but this process was already "
                            "launched as rank %d of %d (%s); use strategy \"ddp\"",
                 f->strategy_name, info.rank, info.world_size, info.source);
        return 1;
    }
    if (launched && f->kind == FG_STRATEGY_DDP && info.world_size != want) {
        fg_error(FG_EINVAL, "the launcher (%s) started %d ranks, but devices x num_nodes = %d x %d "
                            "= %d; make them agree",
                 info.source, info.world_size, f->ndevices, f->num_nodes, want);
        return 1;
    }
    if (launched && f->kind != FG_STRATEGY_DDP && info.world_size > 1) {
        fg_error(FG_EINVAL, "strategy=\"%s\" runs in one process, but the launcher (%s) started %d "
                            "ranks; use ddp", f->strategy_name, info.source, info.world_size);
        return 1;
    }
    if (!launched && want > 1 && f->num_nodes > 1) {
        fg_error(FG_EINVAL, "num_nodes=%d: start one process per node with `fulgur run --nnodes %d "
                            "--node-rank R ...`, mpirun or srun",
                 f->num_nodes, f->num_nodes);
        return 1;
    }
    char job[64];
    snprintf(job, sizeof job, "fabric-%d-%lld", (int)getpid(), (long long)(fg_time() * 1e6));
    if (!launched && want > 1 && f->spawn) return spawn_fork(f, want, run, arg, job);
    supervisor sv = {0};
    if (!launched && want > 1) {
        int port = 29500 + (int)(getpid() % 20000);
        if (spawn_reexec(f, want, job, port, &sv) != FG_OK) return 1;
        export_rank(0, want, job, port);
        if (fg_cluster_detect(&info) != FG_OK) {
            stop_supervisor(&sv);
            wait_children(&sv);
            return 1;
        }
    }
    int rc = 1;
    s = join(f, &info);
    if (s == FG_OK) rc = run(f, arg);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", fg_last_error());
    if (rc == 0 && f->comm) fg_comm_barrier(f->comm); /* nobody leaves while others still talk */
    stop_supervisor(&sv);
    bool child_failed = sv.failed_rank >= 0;
    fg_strategy_free(f->strategy);
    f->strategy = NULL;
    fg_comm_free(f->comm);
    f->comm = NULL;
    fg_status cs = wait_children(&sv);
    /* A dead child explains rank 0's failure; otherwise rank 0's own message stands. */
    if (cs != FG_OK && (rc == 0 || child_failed)) return rc ? rc : 1;
    if (rc) fg_error(FG_EINVAL, "%s", msg);
    return rc;
}
