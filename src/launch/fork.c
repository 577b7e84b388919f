/* The fork launcher (ddp_spawn, ddp_fork): the ranks are forked children
 * running a function of this program; the parent is no rank, it waits.
 *
 * Unlike Lightning's ddp_spawn, the parent gets the trained state back: a
 * memfd made before the fork is shared by all children, and rank 0 writes
 * its result blob there (fg_launch_send_result, replacing the previous one)
 * for the parent to read once every rank has succeeded. A shared anonymous
 * mapping holds one message slot per rank, where a child whose function
 * failed leaves its fg_last_error(), so the parent's error says why.
 *
 * The children are process group leaders (a terminal's ^C reaches only the
 * parent), so the parent's signal handler forwards stop signals with
 * fg_launch_fork_signal, which reads the ranks of the launch under way
 * (g_live) and signals each through its pidfd: a rank already reaped is
 * never confused with a process that took its pid. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launch_impl.h"

#define MSG_SLOT 512

/* In a fork-launched child: where the result goes. -1 elsewhere. */
static int g_result_fd = -1;
static int g_rank = -1;

/* In the parent, while fg_launch_fork waits: its ranks (NULL otherwise). */
static fg__proc *volatile g_live;
static volatile sig_atomic_t g_nlive;

int fg_launch_fork_signal(int sig) {
    fg__proc *ps = g_live;
    int n = ps ? (int)g_nlive : 0, sent = 0;
    if (g_rank >= 0) return 0; /* a rank: it has no ranks of its own */
    for (int r = 0; r < n; r++) {
        if (ps[r].reaped || ps[r].pid <= 0) continue;
        int fd = ps[r].pidfd, rc = -1;
#ifdef SYS_pidfd_send_signal
        if (fd >= 0) rc = (int)syscall(SYS_pidfd_send_signal, fd, sig, NULL, 0);
        else
#endif
            rc = kill(ps[r].pid, sig);
        (void)fd;
        sent += rc == 0;
    }
    return sent;
}

fg_status fg_launch_send_result(const void *data, size_t len) {
    if (g_result_fd < 0)
        return fg_error(FG_ESTATE, "send_result: this process was not started by fg_launch_fork");
    if (g_rank != 0)
        return fg_error(FG_ESTATE, "send_result: only rank 0 sends the result (this is rank %d)",
                        g_rank);
    if (!data && len) return fg_error(FG_EINVAL, "send_result: NULL data with %zu bytes", len);
    if (ftruncate(g_result_fd, 0) != 0) return fg_error(FG_EIO, "send_result: %s", strerror(errno));
    const char *p = data;
    size_t done = 0;
    while (done < len) {
        ssize_t w = pwrite(g_result_fd, p + done, len - done, (off_t)done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return fg_error(FG_EIO, "send_result: writing %zu bytes: %s", len,
                            w < 0 ? strerror(errno) : "short write");
        done += (size_t)w;
    }
    return FG_OK;
}

/* In the child: becomes rank r of n and runs fn. Never returns. */
static void child_run(int r, int n, int (*fn)(int, int, void *), void *arg, const fg_fork_opts *o,
                      const char *job_id, pid_t parent, int fd, char *msgs) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    g_result_fd = fd;
    g_rank = r;
    fg_cluster_info info = {.rank = r,
                            .world_size = n,
                            .local_rank = r,
                            .local_world_size = n,
                            .node_rank = 0,
                            .num_nodes = 1,
                            .master_port = o->master_port,
                            .source = "fulgur"};
    snprintf(info.master_addr, sizeof info.master_addr, "127.0.0.1");
    snprintf(info.job_id, sizeof info.job_id, "%s", job_id);
    int rc = 1;
    fg_status s = fg_launch_export(&info);
    if (s == FG_OK && o->threads_per_rank > 0) s = fg_set_num_threads(o->threads_per_rank);
    if (s == FG_OK) {
        fg_set_log_rank(r);
        fg_clear_error();
        rc = fn(r, n, arg);
    }
    if (rc != 0) snprintf(msgs + (size_t)r * MSG_SLOT, MSG_SLOT, "%s", fg_last_error());
    fflush(NULL);
    _exit(rc == 0 ? 0 : (rc & 0xff) ? (rc & 0xff) : 1);
}

fg_status fg_launch_fork(int nprocs, int (*fn)(int rank, int world_size, void *arg), void *arg,
                         const fg_fork_opts *opts, fg_fork_result *out) {
    if (out) *out = (fg_fork_result){.failed = {.rank = -1}};
    if (!fn) return fg_error(FG_EINVAL, "fork launch: NULL function");
    if (nprocs < 1 || nprocs > FG_DEVICES_MAX)
        return fg_error(FG_EINVAL, "fork launch: nprocs=%d: expected 1..%d", nprocs,
                        FG_DEVICES_MAX);
    if (g_rank >= 0)
        return fg_error(FG_ESTATE, "fork launch: called inside rank %d of a fork launch", g_rank);
    fg_fork_opts o = opts ? *opts : (fg_fork_opts){0};
    if (o.master_port < 0 || o.master_port > 65535)
        return fg_error(FG_EINVAL, "fork launch: master_port=%d: expected 0..65535", o.master_port);
    double grace;
    FG_TRY(fg__grace(o.grace_s, &grace));
    char job_id[FG_CLUSTER_JOB_MAX];
    if (o.job_id) snprintf(job_id, sizeof job_id, "%s", o.job_id);
    else fg_launch_new_job_id(job_id, sizeof job_id);

    fg_status s = FG_OK;
    int fd = memfd_create("fulgur-fork-result", MFD_CLOEXEC);
    if (fd < 0) return fg_error(FG_EIO, "fork launch: memfd_create: %s", strerror(errno));
    size_t msgs_len = (size_t)nprocs * MSG_SLOT;
    char *msgs = mmap(NULL, msgs_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    fg__proc *ps = fg_calloc((size_t)nprocs, sizeof *ps);
    if (msgs == MAP_FAILED || !ps) {
        s = msgs == MAP_FAILED ? fg_error(FG_ENOMEM, "fork launch: mmap: %s", strerror(errno))
                               : FG_ENOMEM;
        if (msgs == MAP_FAILED) msgs = NULL;
        goto done;
    }
    memset(msgs, 0, msgs_len);
    for (int r = 0; r < nprocs; r++) ps[r] = (fg__proc){.rank = r, .pidfd = -1, .reaped = true};

    pid_t parent = getpid();
    for (int r = 0; r < nprocs; r++) {
        fflush(NULL); /* or each child would write the parent's buffered output again */
        pid_t pid = fork();
        if (pid < 0) {
            s = fg_error(FG_EIO, "fork launch: fork for rank %d: %s", r, strerror(errno));
            fg__procs_stop(ps, nprocs, grace, NULL);
            goto done;
        }
        if (pid == 0) child_run(r, nprocs, fn, arg, &o, job_id, parent, fd, msgs);
        setpgid(pid, pid);
        ps[r].pid = pid;
        ps[r].reaped = false;
        fg__proc_watch(&ps[r]);
        g_live = ps;
        g_nlive = r + 1;
    }

    /* wait; the first failure stops the others */
    fg_rank_exit failed = {.rank = -1};
    int stopped = 0, left = nprocs;
    while (left > 0) {
        fg__procs_poll(ps, nprocs, -1, 1.0);
        for (int r = 0; r < nprocs; r++) {
            if (!fg__proc_reap(&ps[r], true)) continue;
            left--;
            if (failed.rank < 0 && fg__proc_failed(&ps[r]) && !ps[r].stopped) {
                fg__proc_exit(&ps[r], &failed);
                int before = 0;
                for (int k = 0; k < nprocs; k++) before += !ps[k].reaped;
                stopped = fg__procs_stop(ps, nprocs, grace, NULL);
                left -= before;
            }
        }
    }
    if (failed.rank >= 0) {
        if (out) out->failed = failed;
        char how[160], why[MSG_SLOT + 8] = "";
        fg_rank_exit_format(&failed, how, sizeof how);
        const char *m = msgs + (size_t)failed.rank * MSG_SLOT;
        if (!failed.signal && m[0]) snprintf(why, sizeof why, ": %.*s", MSG_SLOT - 1, m);
        if (stopped)
            s = fg_error(FG_EPEER, "%s%s; stopped the other %d rank%s", how, why, stopped,
                         stopped == 1 ? "" : "s");
        else s = fg_error(FG_EPEER, "%s%s", how, why);
        goto done;
    }
    off_t size = lseek(fd, 0, SEEK_END);
    if (size > 0 && out) {
        out->data = fg_alloc((size_t)size);
        if (!out->data) {
            s = FG_ENOMEM;
            goto done;
        }
        size_t got = 0;
        while (got < (size_t)size) {
            ssize_t r = pread(fd, (char *)out->data + got, (size_t)size - got, (off_t)got);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) break;
            got += (size_t)r;
        }
        if (got != (size_t)size) {
            fg_free(out->data);
            out->data = NULL;
            s = fg_error(FG_EIO, "fork launch: reading rank 0's result (%lld bytes)",
                         (long long)size);
            goto done;
        }
        out->len = (size_t)size;
    }
done:
    g_nlive = 0;
    g_live = NULL;
    if (ps)
        for (int r = 0; r < nprocs; r++)
            if (ps[r].pidfd >= 0) close(ps[r].pidfd);
    fg_free(ps);
    if (msgs) munmap(msgs, msgs_len);
    close(fd);
    return s;
}
