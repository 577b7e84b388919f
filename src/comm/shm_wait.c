/* Waiting and liveness: how a rank waits for a word a peer posts, how it
 * learns that the peer died, left or stalled, and how one rank's failure
 * reaches every rank.
 *
 * Waiting: spin briefly (an adaptive budget), then yield the core for a
 * while (a peer may need it), then sleep on a futex (the poster wakes only
 * when a peer sleeps on it), checking every 50 ms whether the awaited peer
 * died (pidfd), left, or the group was aborted, and giving up after the
 * timeout.
 *
 * When cores are short (other processes, the peers included, leave this
 * rank less than SHORT_CORES of a core: fg__cores_free), a peer that has
 * not posted is most likely waiting for a core, and a rank that spins or
 * yields keeps its own core busy, so the scheduler never moves the peer
 * there. Then a wait whose spin did not pay drops its budget to the minimum
 * at once (not by halves) and yields only SHORT_YIELD_S before it sleeps.
 *
 * No wake-up is lost: a sleeper counts itself in the poster's sleepers
 * before it re-reads the word, the poster stores the word before it reads
 * the count, all sequentially consistent. The abort word is claimed once
 * (the first failure wins) and its message is complete before abort_ready,
 * so every rank reports the same first cause, however it noticed. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "shm_impl.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

#define SHORT_CORES 0.75
#define SHORT_YIELD_S 20e-6

/* ------------------------------------------------------------- futexes */

static void futex_wait(_Atomic uint32_t *w, uint32_t val, double seconds) {
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, val, &ts, NULL, 0);
}

void fg__shm_wake_everyone(shm_state *s) {
    for (int r = 0; r < s->n; r++) {
        for (int k = 0; k < 3; k++) futex_wake_all(&ctl(s, r)->w[k]);
        for (int d = 0; d < s->n; d++) {
            futex_wake_all(&chan(s, r, d)->head);
            futex_wake_all(&chan(s, r, d)->tail);
        }
    }
}

/* ------------------------------------------------------------- liveness */

int fg__shm_pidfd_open(int pid) {
#ifdef SYS_pidfd_open
    return (int)syscall(SYS_pidfd_open, pid, 0);
#else
    (void)pid;
    errno = ENOSYS;
    return -1;
#endif
}

/* /proc/<pid>/stat state letter, or 0 if unreadable. */
static char proc_state(int pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t k = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (k <= 0) return 0;
    buf[k] = 0;
    char *p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p[2] : 0;
}

bool fg__shm_pid_dead(int pid, int pidfd) {
    if (pid <= 0) return false;
    if (pidfd >= 0) {
        struct pollfd pf = {.fd = pidfd, .events = POLLIN};
        return poll(&pf, 1, 0) > 0;
    }
    if (kill(pid, 0) != 0 && errno == ESRCH) return true;
    char st = proc_state(pid);
    return st == 'Z' || st == 'X';
}

/* ------------------------------------------------------------- failures */

bool fg__shm_publish_abort(shm_state *s, fg_status st, const char *op, uint64_t seq,
                           const char *msg) {
    int32_t none = -1;
    if (!atomic_compare_exchange_strong(&s->hdr->abort_rank, &none, s->me)) return false;
    shm_hdr *h = s->hdr;
    h->abort_status = (int32_t)st;
    h->abort_seq = seq;
    snprintf(h->abort_op, sizeof h->abort_op, "%s", op ? op : "");
    snprintf(h->abort_msg, sizeof h->abort_msg, "%s", msg);
    atomic_store_explicit(&h->abort_ready, 1, memory_order_release);
    fg__shm_wake_everyone(s);
    return true;
}

fg_status fg__shm_group_fail(fg_comm *c, shm_state *s, const fg__comm_args *a, fg_status st,
                             const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fg__shm_publish_abort(s, st, a->name, a->seq, msg);
    return fg__comm_fail(c, a, st, "%s", msg);
}

fg_status fg__shm_aborted_elsewhere(fg_comm *c, shm_state *s, const fg__comm_args *a) {
    shm_hdr *h = s->hdr;
    int r = atomic_load(&h->abort_rank);
    for (int i = 0; i < 100000 && !atomic_load_explicit(&h->abort_ready, memory_order_acquire); i++)
        CPU_RELAX();
    fg_status st = (fg_status)h->abort_status;
    if (st != FG_ETIMEOUT && st != FG_EMISMATCH) st = FG_EPEER;
    if (!h->abort_op[0] || r == s->me) /* an abort: the message says who */
        return fg__comm_fail(c, a, st, "%s", h->abort_msg);
    if (h->abort_seq == a->seq && !strcmp(h->abort_op, a->name))
        return fg__comm_fail(c, a, st, "%s (noticed by rank %d)", h->abort_msg, r);
    return fg__comm_fail(c, a, st, "%s (noticed by rank %d in %s #%llu)", h->abort_msg, r,
                         h->abort_op, (unsigned long long)h->abort_seq);
}

/* ----------------------------------------------------------------- wait */

fg_status fg__shm_wait_word(fg_comm *c, shm_state *s, const fg__comm_args *a, int q,
                            _Atomic uint32_t *w, _Atomic uint32_t *sleepers, uint32_t target,
                            const char *what) {
    if (reached(atomic_load_explicit(w, memory_order_acquire), target)) return FG_OK;
    double t0 = fg_time(), now = t0, next_check = t0 + 0.05;
    /* spin: the peer is usually a few microseconds away. The budget adapts:
     * it shrinks when spinning did not pay (the peer was not running: more
     * processes than free cores) and grows back when it does. */
    for (uint32_t i = 1;; i++) {
        CPU_RELAX();
        if (reached(atomic_load_explicit(w, memory_order_acquire), target)) {
            s->spin_cur = FG_MIN(s->spin_s, s->spin_cur * 1.1 + 1e-7);
            return FG_OK;
        }
        if ((i & 63) == 0) {
            now = fg_time();
            if (now - t0 > s->spin_cur) break;
            if (atomic_load_explicit(&s->hdr->abort_rank, memory_order_relaxed) >= 0)
                return fg__shm_aborted_elsewhere(c, s, a);
        }
    }
    bool cores_short = fg__cores_free() < SHORT_CORES;
    s->spin_cur = cores_short ? 1e-6 : FG_MAX(1e-6, s->spin_cur * 0.5);
    double yield_s = cores_short ? FG_MIN(s->yield_s, SHORT_YIELD_S) : s->yield_s;
    /* yield: the peer may need this core */
    while (now - t0 < s->spin_cur + yield_s) {
        sched_yield();
        if (reached(atomic_load_explicit(w, memory_order_acquire), target)) return FG_OK;
        if (atomic_load_explicit(&s->hdr->abort_rank, memory_order_relaxed) >= 0)
            return fg__shm_aborted_elsewhere(c, s, a);
        now = fg_time();
    }
    /* sleep on the futex, checking the peer every 50 ms */
    for (;;) {
        atomic_fetch_add_explicit(sleepers, 1, memory_order_seq_cst);
        uint32_t v = atomic_load_explicit(w, memory_order_seq_cst);
        if (!reached(v, target) && atomic_load(&s->hdr->abort_rank) < 0) futex_wait(w, v, 0.05);
        atomic_fetch_sub_explicit(sleepers, 1, memory_order_seq_cst);
        if (reached(atomic_load_explicit(w, memory_order_acquire), target)) return FG_OK;
        if (atomic_load(&s->hdr->abort_rank) >= 0) return fg__shm_aborted_elsewhere(c, s, a);
        now = fg_time();
        if (now >= next_check) {
            next_check = now + 0.05;
            if (q >= 0 && q != s->me) {
                if (atomic_load(&ctl(s, q)->state) == ST_LEFT)
                    return fg__shm_group_fail(
                        c, s, a, FG_EPEER,
                        "rank %d (pid %d) left the group (fg_comm_free) while this "
                        "rank waited for its %s",
                        q, s->pids[q], what);
                if (s->watch[q] && fg__shm_pid_dead(s->pids[q], s->pidfd[q]))
                    return fg__shm_group_fail(c, s, a, FG_EPEER, "rank %d (pid %d) died", q,
                                              s->pids[q]);
            }
            if (c->aborted) return fg__shm_aborted_elsewhere(c, s, a);
            if (now - t0 > c->timeout_s) {
                char st = q >= 0 ? proc_state(s->pids[q]) : 0;
                return fg__shm_group_fail(
                    c, s, a, FG_ETIMEOUT,
                    "timed out after %.3g s waiting for rank %d (pid %d%s) to post "
                    "its %s (FULGUR_COMM_TIMEOUT_S)",
                    c->timeout_s, q, q >= 0 ? s->pids[q] : -1,
                    st == 'T' || st == 't' ? ", stopped" : "", what);
            }
        }
    }
}

static const char *const k_word_names[3] = {"input", "reduced slice", "completion"};

fg_status fg__shm_wait_all(fg_comm *c, shm_state *s, const fg__comm_args *a, int which,
                           uint32_t target, int only) {
    for (int q = 0; q < s->n; q++) {
        if (q == s->me || (only >= 0 && q != only)) continue;
        if (which == W_DONE && reached(s->lb_done[q], target)) continue;
        shm_ctl *p = ctl(s, q);
        FG_TRY(
            fg__shm_wait_word(c, s, a, q, &p->w[which], &p->sleepers, target, k_word_names[which]));
        uint32_t v = atomic_load_explicit(&p->w[which], memory_order_relaxed);
        /* ready and mid of g imply done of g-K only: the allreduce copies
         * chunks in up to K ahead of the ones it is done with */
        uint32_t lb = which == W_DONE ? v : v - NSLOTS;
        if (reached(lb, s->lb_done[q])) s->lb_done[q] = lb;
    }
    return FG_OK;
}
