/* Process bookkeeping shared by the launchers: watching a child through its
 * pidfd (so waiting costs nothing and wakes at once), reaping it by pid,
 * signalling its process group, describing how it ended, and stopping a set
 * of children with SIGTERM then SIGKILL (at once for a stopped child, which
 * cannot act on SIGTERM).
 *
 * Invariant: a pid is signalled only while it is not reaped (its zombie
 * holds the pid and the process group id), so a reused pid is never hit. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launch_impl.h"

void fg__proc_watch(fg__proc *p) {
#ifdef SYS_pidfd_open
    p->pidfd = (int)syscall(SYS_pidfd_open, p->pid, 0);
#else
    p->pidfd = -1;
#endif
}

bool fg__proc_reap(fg__proc *p, bool kill_leftovers) {
    if (p->pid <= 0) p->reaped = true;
    if (p->reaped) return false;
    if (kill_leftovers) {
        /* Look without reaping: while the zombie holds the pid, its process
         * group id cannot name anyone else, so what the rank started (a
         * shell's children) can be killed with it. */
        siginfo_t si;
        memset(&si, 0, sizeof si);
        if (waitid(P_PID, (id_t)p->pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == 0)
            return false;
        if (si.si_pid == p->pid && !(si.si_code == CLD_EXITED && si.si_status == 0))
            kill(-p->pid, SIGKILL);
    }
    int st = 0;
    pid_t r;
    do r = waitpid(p->pid, &st, WNOHANG);
    while (r < 0 && errno == EINTR);
    if (r == 0) return false;
    if (r < 0) st = 0; /* ECHILD: someone else reaped it; nothing to report */
    p->status = st;
    p->reaped = true;
    if (p->pidfd >= 0) close(p->pidfd);
    p->pidfd = -1;
    return true;
}

void fg__proc_kill(const fg__proc *p, int sig) {
    if (p->reaped || p->pid <= 0) return;
    if (kill(-p->pid, sig) != 0) kill(p->pid, sig);
}

void fg__procs_poll(const fg__proc *ps, int n, int extra_fd, double timeout_s) {
    struct pollfd fds[FG_DEVICES_MAX + 1];
    int nf = 0;
    bool blind = false; /* a child without a pidfd: look again soon */
    for (int i = 0; i < n && nf < FG_DEVICES_MAX; i++) {
        if (ps[i].reaped || ps[i].pid <= 0) continue;
        if (ps[i].pidfd >= 0) fds[nf++] = (struct pollfd){.fd = ps[i].pidfd, .events = POLLIN};
        else blind = true;
    }
    if (extra_fd >= 0) fds[nf++] = (struct pollfd){.fd = extra_fd, .events = POLLIN};
    if (blind && (timeout_s < 0 || timeout_s > 0.01)) timeout_s = 0.01;
    int ms = timeout_s < 0 ? -1 : (int)(timeout_s * 1000.0 + 0.999);
    if (nf == 0 && ms < 0) return; /* nothing can wake us */
    poll(fds, (nfds_t)nf, ms);
}

void fg__proc_exit(const fg__proc *p, fg_rank_exit *e) {
    *e = (fg_rank_exit){.rank = p->rank, .pid = (int)p->pid, .code = -1, .signal = 0};
    if (!p->reaped) {
        e->rank = -1;
        return;
    }
    if (WIFSIGNALED(p->status)) e->signal = WTERMSIG(p->status);
    else e->code = WEXITSTATUS(p->status);
}

bool fg__proc_failed(const fg__proc *p) {
    return p->reaped && !(WIFEXITED(p->status) && WEXITSTATUS(p->status) == 0);
}

fg_status fg__grace(double g, double *out) {
    *out = g;
    if (g > 0) return FG_OK;
    FG_TRY(fg__env_double("FULGUR_KILL_GRACE_S", 3.0, out));
    if (!(*out > 0))
        return fg_error(FG_EINVAL,
                        "FULGUR_KILL_GRACE_S=\"%s\": expected a number of seconds above 0 "
                        "(unset it for the default, 3)",
                        getenv("FULGUR_KILL_GRACE_S"));
    return FG_OK;
}

static int reap_all(fg__proc *ps, int n) {
    int left = 0;
    for (int i = 0; i < n; i++) {
        fg__proc_reap(&ps[i], true);
        left += !ps[i].reaped;
    }
    return left;
}

bool fg__proc_is_stopped(const fg__proc *p) {
    if (p->reaped || p->pid <= 0) return false;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)p->pid);
    FILE *f = fopen(path, "re");
    if (!f) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* "pid (comm) S ...": the state follows the last ')' (comm may hold one) */
    const char *rp = strrchr(buf, ')');
    return rp && rp[1] == ' ' && (rp[2] == 'T' || rp[2] == 't');
}

/* SIGKILL to the stopped ones: SIGTERM stays pending in a stopped process,
 * so waiting a grace period for it would only waste the period. */
static void kill_stopped(fg__proc *ps, int n) {
    for (int i = 0; i < n; i++)
        if (fg__proc_is_stopped(&ps[i])) fg__proc_kill(&ps[i], SIGKILL);
}

int fg__procs_stop(fg__proc *ps, int n, double grace_s, pthread_mutex_t *mu) {
    int signalled = 0;
    for (int i = 0; i < n; i++) {
        if (fg__proc_reap(&ps[i], true) || ps[i].reaped) continue;
        fg__proc_kill(&ps[i], SIGTERM);
        ps[i].stopped = true;
        signalled++;
    }
    kill_stopped(ps, n);
    double t0 = fg_time();
    while (reap_all(ps, n) > 0) {
        kill_stopped(ps, n); /* also one stopped during the grace period */
        double left = grace_s - (fg_time() - t0);
        if (left <= 0) {
            for (int i = 0; i < n; i++) fg__proc_kill(&ps[i], SIGKILL);
            for (int i = 0; i < n; i++) {
                if (ps[i].reaped) continue;
                /* SIGKILL cannot be refused: the wait is short. Poll so a
                 * process reaped elsewhere (ECHILD) cannot hang us. */
                while (!fg__proc_reap(&ps[i], true) && !ps[i].reaped) {
                    if (mu) pthread_mutex_unlock(mu);
                    fg__procs_poll(&ps[i], 1, -1, 0.05);
                    if (mu) pthread_mutex_lock(mu);
                }
            }
            break;
        }
        if (mu) pthread_mutex_unlock(mu);
        fg__procs_poll(ps, n, -1, left < 0.1 ? left : 0.1); /* 0.1: look for stopped ones */
        if (mu) pthread_mutex_lock(mu);
    }
    return signalled;
}

int fg_rank_exit_status(const fg_rank_exit *e) {
    if (!e || e->rank < 0) return 0;
    return e->signal ? 128 + e->signal : e->code;
}

char *fg_rank_exit_format(const fg_rank_exit *e, char *buf, size_t cap) {
    if (!buf || !cap) return buf;
    if (!e || e->rank < 0) {
        snprintf(buf, cap, "no rank failed");
    } else if (e->signal) {
        const char *abbrev = sigabbrev_np(e->signal);
        snprintf(buf, cap, "rank %d (pid %d) was killed by signal %d (SIG%s)", e->rank, e->pid,
                 e->signal, abbrev ? abbrev : "?");
    } else {
        snprintf(buf, cap, "rank %d (pid %d) exited with code %d", e->rank, e->pid, e->code);
    }
    return buf;
}
