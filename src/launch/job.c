/* Supervised rank processes (fulgur run, the re-exec launcher).
 *
 * fg_job_start prepares every child's argv and environment on the calling
 * thread, then a supervisor thread forks and execs them and watches them
 * until the last one ends. Forking from the supervisor ties the children's
 * PR_SET_PDEATHSIG to the thread that outlives them in a working job and
 * dies with the process: a crash of the launcher kills its ranks.
 *
 * Each exec is confirmed through a close-on-exec pipe (the child writes its
 * errno there if execve fails), so a rank that cannot start is a start
 * error naming it, not a mysterious exit 127.
 *
 * Each rank's environment also gets GOMP_SPINCOUNT=RANK_SPINCOUNT unless
 * OMP_WAIT_POLICY or GOMP_SPINCOUNT is set: GCC's OpenMP runtime reads its
 * wait policy once, when the rank starts, and its default spin (about 3 ms
 * at each barrier) burns whole time slices when another process holds a
 * core the rank's threads need; the rank itself cannot change it later.
 *
 * Locking: j->mu guards the process table and the state. The supervisor
 * reaps under it and fg_job_signal signals under it, so a pid is never
 * signalled after it was reaped. The supervisor sleeps in poll() on the
 * children's pidfds and an eventfd, without the lock. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "launch_impl.h"

struct fg_job {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* broadcast on every change of state */
    pthread_t thread;
    bool thread_started;
    int wake_fd; /* eventfd: wakes the supervisor */

    fg_job_opts opts;
    double grace;
    fg_cluster_info info; /* of the first process */

    /* what to start, freed once started */
    char path[PATH_MAX];
    char **argv;  /* owned copy */
    char ***envs; /* one environment per process */

    fg__proc *procs;
    int n;
    int running;
    bool start_done;
    fg_status start_status;
    char start_msg[512];

    bool stop_requested;
    fg_rank_exit failed;
    int stopped;
    int signaled;
    int guard_fd; /* guard.c: kills the ranks' groups if this process dies */
    pid_t guard_pid;
};

/* ------------------------------------------------------------ helpers */

static void free_strv(char **v) {
    if (!v) return;
    for (char **p = v; *p; p++) fg_free(*p);
    fg_free(v);
}

/* Copies a NULL-terminated argv. */
static char **dup_argv(const char *const *argv) {
    int n = 0;
    while (argv[n]) n++;
    char **out = fg_calloc((size_t)n + 1, sizeof *out);
    if (!out) return NULL;
    for (int i = 0; i < n; i++)
        if (!(out[i] = fg_strdup(argv[i]))) {
            free_strv(out);
            return NULL;
        }
    return out;
}

/* This process's arguments, from /proc/self/cmdline. */
static FG_MUST_USE fg_status self_argv(char ***out) {
    FILE *f = fopen("/proc/self/cmdline", "rb");
    if (!f) return fg_error(FG_EIO, "re-exec: cannot read /proc/self/cmdline: %s", strerror(errno));
    size_t cap = 4096, len = 0;
    char *buf = fg_alloc(cap);
    while (buf) {
        len += fread(buf + len, 1, cap - len, f);
        if (len < cap) break;
        char *nb = fg_realloc(buf, cap * 2);
        if (!nb) {
            fg_free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    fclose(f);
    if (!buf) return FG_ENOMEM;
    int n = 0;
    for (size_t i = 0; i < len; i += strlen(buf + i) + 1) n++;
    const char **v = fg_calloc((size_t)n + 1, sizeof *v);
    if (!v) {
        fg_free(buf);
        return FG_ENOMEM;
    }
    n = 0;
    for (size_t i = 0; i < len; i += strlen(buf + i) + 1) v[n++] = buf + i;
    if (n == 0) v[n++] = "fulgur-rank"; /* an empty cmdline: exec still needs argv[0] */
    *out = dup_argv(v);
    fg_free(v);
    fg_free(buf);
    return *out ? FG_OK : FG_ENOMEM;
}

/* Finds prog as execvp would, into path. */
static FG_MUST_USE fg_status find_program(const char *prog, char *path, size_t cap) {
    if (!*prog) return fg_error(FG_EINVAL, "launch: empty program name");
    if (strchr(prog, '/')) {
        struct stat st;
        if (stat(prog, &st) != 0)
            return fg_error(FG_EINVAL, "program \"%s\": %s", prog, strerror(errno));
        if (!S_ISREG(st.st_mode) || access(prog, X_OK) != 0)
            return fg_error(FG_EINVAL, "program \"%s\": not an executable file", prog);
        snprintf(path, cap, "%s", prog);
        return FG_OK;
    }
    const char *dirs = getenv("PATH");
    if (!dirs || !*dirs) dirs = "/usr/local/bin:/usr/bin:/bin";
    for (const char *d = dirs; d;) {
        const char *colon = strchr(d, ':');
        int len = colon ? (int)(colon - d) : (int)strlen(d);
        char cand[PATH_MAX];
        snprintf(cand, sizeof cand, "%.*s%s%s", len, len ? d : ".", "/", prog);
        struct stat st;
        if (stat(cand, &st) == 0 && S_ISREG(st.st_mode) && access(cand, X_OK) == 0) {
            snprintf(path, cap, "%s", cand);
            return FG_OK;
        }
        d = colon ? colon + 1 : NULL;
    }
    return fg_error(FG_EINVAL, "program \"%s\": not found in PATH", prog);
}

static void wake(fg_job *j) {
    uint64_t one = 1;
    ssize_t w = write(j->wake_fd, &one, sizeof one);
    (void)w;
}

/* --------------------------------------------------------- the child */

/* After fork, in the child: only async-signal-safe calls until execve. */
static void child_exec(const fg_job *j, int i, pid_t parent, int err_fd) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127); /* the launcher died before prctl */
    static const int k_reset[] = {SIGINT,  SIGTERM, SIGHUP,  SIGQUIT,
                                  SIGCHLD, SIGPIPE, SIGUSR1, SIGUSR2};
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    for (size_t k = 0; k < sizeof k_reset / sizeof k_reset[0]; k++)
        sigaction(k_reset[k], &dfl, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execve(j->path, j->argv, j->envs[i]);
    int e = errno;
    ssize_t w = write(err_fd, &e, sizeof e);
    (void)w;
    _exit(127);
}

/* Starts process i; on failure sets j->start_msg and returns its status. */
static FG_MUST_USE fg_status start_one(fg_job *j, int i) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return fg_error(FG_EIO, "launch: pipe: %s", strerror(errno));
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(fds[0]);
        close(fds[1]);
        return fg_error(FG_EIO, "launch: fork for rank %d: %s", j->procs[i].rank, strerror(e));
    }
    if (pid == 0) {
        close(fds[0]);
        child_exec(j, i, parent, fds[1]);
    }
    close(fds[1]);
    setpgid(pid, pid); /* also here: no window where -pid names no group */
    fg__guard_add(j->guard_fd, (int)pid);
    pthread_mutex_lock(&j->mu);
    j->procs[i].pid = pid;
    j->procs[i].pidfd = -1;
    fg__proc_watch(&j->procs[i]);
    j->running++;
    pthread_mutex_unlock(&j->mu);
    int err = 0;
    ssize_t r;
    do r = read(fds[0], &err, sizeof err);
    while (r < 0 && errno == EINTR);
    close(fds[0]);
    if (r == (ssize_t)sizeof err)
        return fg_error(FG_EINVAL, "launch: rank %d: cannot execute %s: %s", j->procs[i].rank,
                        j->path, strerror(err));
    return FG_OK;
}

/* ------------------------------------------------------ the supervisor */

/* Notes every process that has ended (lock held); on the first failure
 * calls the hook and stops the rest, unless a signal was forwarded to all.
 * Of the failures one scan finds, a rank killed by a signal is named before
 * one that exited with a code: a rank whose collective failed on a killed
 * peer exits right after it, and may be found in the same scan. A stop
 * reaps others, so the scan repeats until nothing changes. */
static void reap_and_react(fg_job *j) {
    for (bool again = true; again;) {
        again = false;
        fg__proc *first = NULL;
        for (int i = 0; i < j->n; i++) {
            fg__proc *p = &j->procs[i];
            if (p->pid <= 0) continue;
            fg__proc_reap(p, !j->signaled); /* after a forwarded signal, leftovers may be saving */
            if (!p->reaped || p->noted) continue;
            p->noted = true;
            j->running--;
            pthread_cond_broadcast(&j->cv);
            if (!fg__proc_failed(p) || j->failed.rank >= 0 || p->stopped) continue;
            if (!first || (WIFSIGNALED(p->status) && !WIFSIGNALED(first->status))) first = p;
        }
        if (!first) break;
        fg__proc_exit(first, &j->failed);
        if (j->opts.on_failure) {
            fg_rank_exit e = j->failed;
            pthread_mutex_unlock(&j->mu);
            j->opts.on_failure(j->opts.ud, &e);
            pthread_mutex_lock(&j->mu);
        }
        if (!j->signaled) {
            j->stopped += fg__procs_stop(j->procs, j->n, j->grace, &j->mu);
            again = true;
        }
    }
}

static void *supervise(void *arg) {
    fg_job *j = arg;
    fg_status s = FG_OK;
    j->guard_fd = fg__guard_start(&j->guard_pid);
    for (int i = 0; i < j->n && s == FG_OK; i++) s = start_one(j, i);
    pthread_mutex_lock(&j->mu);
    if (s != FG_OK) {
        snprintf(j->start_msg, sizeof j->start_msg, "%s", fg_last_error());
        fg__procs_stop(j->procs, j->n, 0.5, &j->mu);
        for (int i = 0; i < j->n; i++) j->procs[i].noted = true;
        j->running = 0;
    }
    j->start_status = s;
    j->start_done = true;
    pthread_cond_broadcast(&j->cv);
    while (j->running > 0) {
        if (j->stop_requested) {
            j->stopped += fg__procs_stop(j->procs, j->n, j->grace, &j->mu);
            j->stop_requested = false;
        }
        reap_and_react(j);
        if (j->running == 0) break;
        pthread_mutex_unlock(&j->mu);
        fg__procs_poll(j->procs, j->n, j->wake_fd, 1.0);
        uint64_t drain;
        ssize_t r = read(j->wake_fd, &drain, sizeof drain);
        (void)r;
        pthread_mutex_lock(&j->mu);
    }
    pthread_mutex_unlock(&j->mu);
    fg__guard_release(j->guard_fd, j->guard_pid); /* every rank ended: nothing to guard */
    j->guard_fd = -1;
    pthread_mutex_lock(&j->mu);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

/* libgomp's spin before a waiting thread sleeps, in its own units (about
 * 100 per microsecond): a tenth of its default, so a thread still catches
 * the next kernel of a step without a wake-up but gives a busy core back
 * within about 0.3 ms. */
#define RANK_SPINCOUNT "30000"

/* Appends GOMP_SPINCOUNT to a rank's environment unless the user chose a
 * wait policy. */
static FG_MUST_USE fg_status add_wait_policy(char ***env) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return FG_OK;
    size_t n = 0;
    while ((*env)[n]) n++;
    char **grown = fg_realloc(*env, (n + 2) * sizeof *grown);
    if (!grown) return FG_ENOMEM;
    *env = grown;
    if (!(grown[n] = fg_strdup("GOMP_SPINCOUNT=" RANK_SPINCOUNT))) return FG_ENOMEM;
    grown[n + 1] = NULL;
    return FG_OK;
}

/* ---------------------------------------------------------------- API */

static void job_destroy(fg_job *j) {
    if (!j) return;
    if (j->envs) {
        for (int i = 0; i < j->n; i++) fg__env_free(j->envs[i]);
        fg_free(j->envs);
    }
    free_strv(j->argv);
    for (int i = 0; i < j->n; i++)
        if (j->procs && j->procs[i].pidfd >= 0) close(j->procs[i].pidfd);
    fg_free(j->procs);
    if (j->wake_fd >= 0) close(j->wake_fd);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    fg_free(j);
}

static FG_MUST_USE fg_status check_spec(const fg_job_spec *sp, int *local_world, int *num_nodes) {
    if (!sp) return fg_error(FG_EINVAL, "launch: NULL job spec");
    if (sp->nprocs < 1 || sp->nprocs > FG_DEVICES_MAX)
        return fg_error(FG_EINVAL, "launch: nprocs=%d: expected 1..%d", sp->nprocs, FG_DEVICES_MAX);
    if (sp->first_local_rank < 0)
        return fg_error(FG_EINVAL, "launch: first_local_rank=%d: expected 0 or more",
                        sp->first_local_rank);
    *local_world = sp->local_world_size ? sp->local_world_size : sp->first_local_rank + sp->nprocs;
    if (sp->first_local_rank + sp->nprocs > *local_world)
        return fg_error(FG_EINVAL, "launch: local ranks %d..%d do not fit local_world_size=%d",
                        sp->first_local_rank, sp->first_local_rank + sp->nprocs - 1, *local_world);
    *num_nodes = sp->num_nodes ? sp->num_nodes : 1;
    if (*num_nodes < 1 || sp->node_rank < 0 || sp->node_rank >= *num_nodes)
        return fg_error(FG_EINVAL,
                        "launch: node_rank=%d, num_nodes=%d: expected 0 <= node_rank < "
                        "num_nodes",
                        sp->node_rank, *num_nodes);
    if ((long)*local_world * *num_nodes > 1L << 24)
        return fg_error(FG_EINVAL, "launch: %d ranks x %d nodes: too many", *local_world,
                        *num_nodes);
    if (sp->master_port < 0 || sp->master_port > 65535)
        return fg_error(FG_EINVAL, "launch: master_port=%d: expected 0..65535", sp->master_port);
    if (sp->master_addr && strlen(sp->master_addr) >= FG_CLUSTER_ADDR_MAX)
        return fg_error(FG_EINVAL, "launch: master address longer than %d bytes",
                        FG_CLUSTER_ADDR_MAX - 1);
    if (sp->job_id && strlen(sp->job_id) >= FG_CLUSTER_JOB_MAX)
        return fg_error(FG_EINVAL, "launch: job id longer than %d bytes", FG_CLUSTER_JOB_MAX - 1);
    return FG_OK;
}

static FG_MUST_USE fg_status job_start(const fg_job_spec *sp, const fg_job_opts *opts,
                                       fg_job **out) {
    *out = NULL;
    int local_world = 0, num_nodes = 0;
    FG_TRY(check_spec(sp, &local_world, &num_nodes));
    fg_job *j = fg_calloc(1, sizeof *j);
    if (!j) return fg_error_wrap(FG_ENOMEM, "launch");
    j->wake_fd = -1;
    pthread_mutex_init(&j->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cv, &ca);
    pthread_condattr_destroy(&ca);
    j->failed.rank = -1;
    if (opts) j->opts = *opts;
    fg_status s = fg__grace(j->opts.grace_s, &j->grace);
    if (s != FG_OK) goto fail;

    /* the contract shared by all: world, node, master, job */
    fg_cluster_info *in = &j->info;
    in->world_size = local_world * num_nodes;
    in->local_world_size = local_world;
    in->node_rank = sp->node_rank;
    in->num_nodes = num_nodes;
    snprintf(in->master_addr, sizeof in->master_addr, "%s",
             sp->master_addr ? sp->master_addr : "127.0.0.1");
    in->master_port = sp->master_port ? sp->master_port : fg__free_port();
    if (sp->job_id) snprintf(in->job_id, sizeof in->job_id, "%s", sp->job_id);
    else fg_launch_new_job_id(in->job_id, sizeof in->job_id);
    in->source = "fulgur";

    if (sp->argv) {
        if (!sp->argv[0]) {
            s = fg_error(FG_EINVAL, "launch: empty argv (no program)");
            goto fail;
        }
        FG_TRY_GOTO(find_program(sp->argv[0], j->path, sizeof j->path), s, fail);
        if (!(j->argv = dup_argv(sp->argv))) {
            s = fg_error_wrap(FG_ENOMEM, "launch");
            goto fail;
        }
    } else {
        snprintf(j->path, sizeof j->path, "/proc/self/exe");
        FG_TRY_GOTO(self_argv(&j->argv), s, fail);
    }
    j->n = sp->nprocs;
    j->procs = fg_calloc((size_t)j->n, sizeof *j->procs);
    j->envs = fg_calloc((size_t)j->n, sizeof *j->envs);
    if (!j->procs || !j->envs) {
        s = fg_error_wrap(FG_ENOMEM, "launch");
        goto fail;
    }
    for (int i = 0; i < j->n; i++) {
        fg_cluster_info ri = *in;
        ri.local_rank = sp->first_local_rank + i;
        ri.rank = sp->node_rank * local_world + ri.local_rank;
        j->procs[i] = (fg__proc){.rank = ri.rank, .pidfd = -1};
        FG_TRY_GOTO(fg__contract_env(&ri, &j->envs[i]), s, fail);
        FG_TRY_GOTO(add_wait_policy(&j->envs[i]), s, fail);
    }
    in->local_rank = sp->first_local_rank;
    in->rank = sp->node_rank * local_world + in->local_rank;

    j->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (j->wake_fd < 0) {
        s = fg_error(FG_EIO, "launch: eventfd: %s", strerror(errno));
        goto fail;
    }
    fflush(NULL); /* children must not repeat buffered output (exec drops it anyway) */
    if (pthread_create(&j->thread, NULL, supervise, j) != 0) {
        s = fg_error(FG_EIO, "launch: cannot start the supervisor thread");
        goto fail;
    }
    j->thread_started = true;
    pthread_mutex_lock(&j->mu);
    while (!j->start_done) pthread_cond_wait(&j->cv, &j->mu);
    s = j->start_status;
    pthread_mutex_unlock(&j->mu);
    if (s != FG_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", j->start_msg);
        pthread_join(j->thread, NULL);
        job_destroy(j);
        return fg_error(s, "%s", msg);
    }
    /* the environments are not needed any more */
    for (int i = 0; i < j->n; i++) {
        fg__env_free(j->envs[i]);
        j->envs[i] = NULL;
    }
    *out = j;
    return FG_OK;
fail:
    job_destroy(j);
    return s;
}

fg_job *fg_job_start(const fg_job_spec *sp, const fg_job_opts *opts) {
    fg_job *j;
    return job_start(sp, opts, &j) == FG_OK ? j : NULL;
}

fg_job *fg_launch_reexec(const fg_launch_plan *plan, const fg_job_opts *opts) {
    if (!plan || plan->launcher != FG_LAUNCHER_REEXEC) {
        fg_error(FG_EINVAL, "re-exec: the plan's launcher is %s, not re-exec",
                 plan ? fg_launcher_name(plan->launcher) : "missing");
        return NULL;
    }
    if (plan->local_world_size < 2) {
        fg_error(FG_EINVAL, "re-exec: %d local rank(s): nothing to start", plan->local_world_size);
        return NULL;
    }
    const fg_cluster_info *c = &plan->cluster;
    fg_job_spec sp = {.argv = NULL,
                      .nprocs = plan->local_world_size - 1,
                      .first_local_rank = 1,
                      .local_world_size = plan->local_world_size,
                      .node_rank = plan->node_rank,
                      .num_nodes = plan->num_nodes,
                      .master_addr = c->master_addr[0] ? c->master_addr : NULL,
                      .master_port = c->master_port,
                      .job_id = c->job_id[0] ? c->job_id : NULL};
    fg_job *j = fg_job_start(&sp, opts);
    if (!j) return NULL;
    fg_cluster_info me;
    fg_job_info(j, &me);
    me.local_rank = 0;
    me.rank = plan->node_rank * plan->local_world_size;
    if (fg_launch_export(&me) != FG_OK) {
        fg_job_free(j); /* leaves this thread's message (the export's) alone */
        return NULL;
    }
    return j;
}

fg_status fg_job_check(fg_job *j) {
    if (!j) return FG_OK;
    pthread_mutex_lock(&j->mu);
    fg_rank_exit e = j->failed;
    pthread_mutex_unlock(&j->mu);
    if (e.rank < 0) return FG_OK;
    char buf[160];
    return fg_error(FG_EPEER, "%s", fg_rank_exit_format(&e, buf, sizeof buf));
}

/* ------------------------------------------------------ joining the ranks */

/* fg_comm_new on a helper thread, so that the caller can stop waiting when
 * a rank of the job dies before it joins. Freed by whichever of the two
 * lets go last. */
typedef struct comm_new_call {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    fg_cluster_info info;
    fg_comm_opts opts;
    bool have_opts, done;
    fg_comm *comm;
    fg_status status;
    char msg[512];
    int refs;
} comm_new_call;

static void call_release(comm_new_call *c) {
    pthread_mutex_lock(&c->mu);
    bool last = --c->refs == 0;
    pthread_mutex_unlock(&c->mu);
    if (!last) return;
    fg_comm_free(c->comm);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    fg_free(c);
}

static void *comm_new_thread(void *arg) {
    comm_new_call *c = arg;
    fg_comm *comm = fg_comm_new(&c->info, c->have_opts ? &c->opts : NULL);
    pthread_mutex_lock(&c->mu);
    c->status = comm ? FG_OK : fg_last_status();
    c->comm = comm;
    snprintf(c->msg, sizeof c->msg, "%s", fg_last_error());
    c->done = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    call_release(c);
    return NULL;
}

fg_comm *fg_job_comm_new(fg_job *j, const fg_cluster_info *info, const fg_comm_opts *opts) {
    if (!j) return fg_comm_new(info, opts);
    if (fg_job_check(j) != FG_OK) {
        fg_error_wrap(FG_EPEER, "joining the communicator");
        return NULL;
    }
    comm_new_call *c = fg_calloc(1, sizeof *c);
    if (!c) return NULL; /* fg_calloc left FG_ENOMEM */
    fg_status s = FG_OK;
    if (info) c->info = *info;
    else if (fg_cluster_detect(&c->info) != FG_OK) {
        fg_free(c);
        return NULL;
    }
    if (opts) c->opts = *opts;
    c->have_opts = opts != NULL;
    c->refs = 2;
    pthread_mutex_init(&c->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_t t;
    if (pthread_create(&t, NULL, comm_new_thread, c) != 0) comm_new_thread(c); /* wait here */
    else pthread_detach(t);
    bool dead = false;
    pthread_mutex_lock(&c->mu);
    while (!c->done && !dead) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += 20 * 1000 * 1000;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&c->cv, &c->mu, &until);
        if (c->done) break;
        pthread_mutex_unlock(&c->mu); /* fg_job_check takes the job's lock */
        dead = fg_job_check(j) != FG_OK;
        pthread_mutex_lock(&c->mu);
    }
    fg_comm *comm = NULL;
    if (c->done) {
        s = c->status;
        comm = c->comm;
        c->comm = NULL;
        if (s != FG_OK) fg_error(s, "%s", c->msg);
    }
    pthread_mutex_unlock(&c->mu);
    call_release(c);
    if (!comm && s == FG_OK) { /* gave up: a rank died */
        if (fg_job_check(j) != FG_OK) {
            /* its message names the rank that died */
        }
        fg_error_wrap(FG_EPEER, "joining the communicator");
    }
    return comm;
}

fg_status fg_job_wait(fg_job *j, double timeout_s) {
    if (!j) return FG_OK;
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    if (timeout_s >= 0) {
        double t = (double)until.tv_sec + until.tv_nsec * 1e-9 + timeout_s;
        until.tv_sec = (time_t)t;
        until.tv_nsec = (long)((t - (double)until.tv_sec) * 1e9);
    }
    pthread_mutex_lock(&j->mu);
    bool timed_out = false;
    while (j->running > 0 && !timed_out) {
        if (timeout_s < 0) pthread_cond_wait(&j->cv, &j->mu);
        else timed_out = pthread_cond_timedwait(&j->cv, &j->mu, &until) == ETIMEDOUT;
    }
    fg_rank_exit failed = j->failed;
    int running = j->running, stopped = j->stopped;
    fg__proc still = {.rank = -1};
    for (int i = 0; i < j->n; i++)
        if (!j->procs[i].reaped) {
            still = j->procs[i];
            break;
        }
    pthread_mutex_unlock(&j->mu);
    char buf[160];
    /* Still running first: after a failure the supervisor is stopping the
     * rest (the lock is free while it waits for them), and the count of
     * stopped ranks is known only once they are all reaped. */
    if (running > 0)
        return fg_error(FG_ETIMEOUT, "rank %d (pid %d) still running after %.3g s (%d rank%s left)",
                        still.rank, (int)still.pid, timeout_s, running, running == 1 ? "" : "s");
    if (failed.rank >= 0) {
        fg_rank_exit_format(&failed, buf, sizeof buf);
        if (stopped > 0)
            return fg_error(FG_EPEER, "%s; stopped the other %d rank%s", buf, stopped,
                            stopped == 1 ? "" : "s");
        return fg_error(FG_EPEER, "%s", buf);
    }
    return FG_OK;
}

int fg_job_signal(fg_job *j, int sig) {
    if (!j) return 0;
    int n = 0;
    pthread_mutex_lock(&j->mu);
    for (int i = 0; i < j->n; i++) {
        fg__proc *p = &j->procs[i];
        if (p->pid <= 0 || p->reaped) continue; /* unreaped: still our pid, maybe a zombie */
        fg__proc_kill(p, sig);
        n++;
    }
    j->signaled = sig;
    pthread_mutex_unlock(&j->mu);
    return n;
}

int fg_job_stop(fg_job *j) {
    if (!j) return 0;
    pthread_mutex_lock(&j->mu);
    int before = j->stopped;
    if (j->running > 0) {
        j->stop_requested = true;
        wake(j);
        while (j->running > 0) pthread_cond_wait(&j->cv, &j->mu);
    }
    int n = j->stopped - before;
    pthread_mutex_unlock(&j->mu);
    return n;
}

void fg_job_get_status(fg_job *j, fg_job_status *out) {
    if (!out) return;
    *out = (fg_job_status){.failed = {.rank = -1}};
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    out->nprocs = j->n;
    out->running = j->running;
    out->failed = j->failed;
    out->stopped = j->stopped;
    out->signaled = j->signaled;
    pthread_mutex_unlock(&j->mu);
}

int fg_job_proc(fg_job *j, int i, fg_rank_exit *e) {
    if (e) *e = (fg_rank_exit){.rank = -1};
    if (!j || i < 0 || i >= j->n) return -1;
    pthread_mutex_lock(&j->mu);
    fg__proc p = j->procs[i];
    pthread_mutex_unlock(&j->mu);
    if (e) fg__proc_exit(&p, e);
    return (int)p.pid;
}

void fg_job_info(const fg_job *j, fg_cluster_info *out) {
    if (!out) return;
    if (!j) {
        memset(out, 0, sizeof *out);
        out->source = "none";
        return;
    }
    *out = j->info; /* fixed once started */
}

void fg_job_free(fg_job *j) {
    if (!j) return;
    fg_error_kept kept; /* a _free never changes the caller's error (core.h) */
    fg_error_keep(&kept);
    if (j->thread_started) {
        fg_job_stop(j);
        pthread_join(j->thread, NULL);
    }
    job_destroy(j);
    fg_error_restore(&kept);
}
