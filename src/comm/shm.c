/* The shm backend: all ranks of a group on one machine share one segment.
 *
 * Layout of the segment (offsets fixed by the creator, read by all):
 *   header   magic, group size, sizes, the abort word and message
 *   ctl[N]   one block per rank: the words it posts (ready, mid, done: one
 *            cache line, written by that rank only), its signature ring, its
 *            pid and state, and the count of peers sleeping on its words
 *   p2p      one channel per ordered pair (src, dst): two slots
 *   data     per rank, K slots of slot_bytes: the staging area of chunks
 *
 * Every collective is a sequence of chunks; chunk number g (a counter all
 * ranks keep in step) uses slot g % K of every rank. For each chunk a rank
 * posts ready = g+1 once its input is in its slot, mid = g+1 once its share
 * of the reduction is done, done = g+1 once it no longer reads any slot of
 * chunk g. A rank writes slot g % K only after every rank posted done >=
 * g-K+1, so no rank runs more than K chunks ahead of another, and while one
 * rank reduces chunk g another already copies in chunk g+1: both cores
 * stream memory at once.
 *
 * Allreduce of a large buffer (reduce-scatter + allgather per chunk): each
 * rank copies its chunk in, reduces its slice of the chunk over all ranks'
 * slots in rank order 0..N-1 (into its own slot and its output), then copies
 * the other slices out. Every element is reduced once, in a fixed order, by
 * one rank: the result is bitwise the same on every rank and every run.
 * Small buffers take one chunk in which every rank reduces the whole buffer
 * itself, still in rank order.
 *
 * Waiting: spin briefly (an adaptive budget), then yield the core for a
 * while (a peer may need it), then sleep on a futex (the poster wakes only
 * when a peer sleeps on it), checking every 50 ms whether the awaited peer
 * died (pidfd), left, or the group was aborted, and giving up after the
 * timeout.
 * Rendezvous: group rank 0 makes the segment as a memfd (shared memory with
 * no name) and hands it over an abstract unix socket named after the uid,
 * the job and the group (checked to be the same uid) to each peer that
 * connects; the socket closes once all have it. Neither has a file: any
 * exit, a crash included, leaves nothing in /dev/shm or elsewhere. */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "comm_impl.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

#define SHM_MAGIC 0x46475348u /* "FGSH" */
#define SHM_VERSION 1u
#define HDR_BYTES 4096
#define CTL_BYTES 256
#define SIGRING 4    /* signature ring entries; == K below */
#define P2P_HDR 64   /* per slot: message header */
#define CHAN_HDR 192 /* per channel: head, tail, sleepers on separate lines */

/* FULGUR_SHM_CHUNK_BYTES: bytes of each rank's slot, the pipeline's chunk
 * (default 512 KiB; tune with bench/comm). FULGUR_SHM_SPIN_US: the most a
 * wait spins before it yields (default 50 us, or 1 us when there are more
 * ranks than cores; it adapts down when spinning does not pay);
 * FULGUR_SHM_YIELD_US: how long it then calls sched_yield, so that a peer
 * sharing this core can run, before sleeping on a futex (default 1000 us).
 * FULGUR_SHM_NT_BYTES: allreduce outputs at least this large are written
 * with streaming stores (default 8 MiB). */
#define DEFAULT_CHUNK (512 << 10)
#define NSLOTS SIGRING
#define ONE_SHOT_MAX (16 << 10)

enum { ST_NONE = 0, ST_ATTACHED = 1, ST_LEFT = 2 };
enum { W_READY, W_MID, W_DONE };

typedef struct shm_hdr {
    _Atomic uint32_t magic;
    uint32_t version;
    int32_t size;
    int32_t creator_pid;
    uint64_t slot_bytes, p2p_slot, total;
    uint32_t nslots;
    _Atomic int32_t attached;
    _Atomic int32_t abort_rank;  /* -1 while healthy, else who broke the group */
    _Atomic int32_t abort_ready; /* the fields below are written */
    int32_t abort_status;
    uint64_t abort_seq;
    char abort_op[32];
    char abort_msg[600];
} shm_hdr;

typedef struct shm_ctl {
    /* line 0: written by the owner only, polled by the peers */
    _Atomic uint32_t w[3]; /* ready, mid, done */
    _Atomic uint32_t sig[SIGRING][3]; /* per chunk: seq, op/dtype/rop/root, count */
    uint32_t pad0;
    /* line 1 */
    _Atomic int32_t pid;
    _Atomic int32_t state;
    _Atomic uint32_t sleepers; /* peers sleeping on this rank's words */
} shm_ctl;

typedef struct shm_chan {
    _Atomic uint32_t head; /* pieces written by src */
    char pad1[60];
    _Atomic uint32_t tail; /* pieces consumed by dst */
    char pad2[60];
    _Atomic uint32_t sleep_head, sleep_tail;
    char pad3[56];
} shm_chan;

typedef struct p2p_piece {
    int64_t count;
    int32_t dt;
    uint32_t bytes;
    uint32_t first;
} p2p_piece;

typedef struct shm_state {
    char *base;
    size_t len;
    shm_hdr *hdr;
    char *ctl_base, *chan_base, *data;
    int n, me;
    size_t slot_bytes, p2p_slot, chan_bytes;
    uint32_t g;          /* next chunk number */
    uint32_t *lb_done;   /* lower bounds of the peers' done words */
    int *pidfd;
    int *pids;
    bool *watch; /* peers whose death this rank can see */
    double spin_s, yield_s, spin_cur;
    size_t nt_bytes; /* allreduce outputs from this size on are streamed */
    bool oversub;
    char name[200];
} shm_state;

static inline shm_ctl *ctl(shm_state *s, int r) {
    return (shm_ctl *)(s->ctl_base + (size_t)r * CTL_BYTES);
}
static inline shm_chan *chan(shm_state *s, int src, int dst) {
    return (shm_chan *)(s->chan_base + (size_t)(src * s->n + dst) * s->chan_bytes);
}
static inline char *chan_slot(shm_state *s, shm_chan *ch, uint32_t i) {
    return (char *)ch + CHAN_HDR + (size_t)(i & 1) * s->p2p_slot;
}
static inline char *slot(shm_state *s, int r, uint32_t g) {
    return s->data + ((size_t)r * NSLOTS + g % NSLOTS) * s->slot_bytes;
}
static inline bool reached(uint32_t v, uint32_t target) { return (int32_t)(v - target) >= 0; }

/* ------------------------------------------------------------- futexes */

static void futex_wake_all(_Atomic uint32_t *w) {
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
}
static void futex_wait(_Atomic uint32_t *w, uint32_t val, double seconds) {
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, val, &ts, NULL, 0);
}

/* Stores v and wakes the peers sleeping on this rank, if any. The store and
 * the load of the sleeper count are sequentially consistent, and so are the
 * sleeper's increment and re-check: one side always sees the other. */
static inline void post_word(_Atomic uint32_t *w, _Atomic uint32_t *sleepers, uint32_t v) {
    atomic_store_explicit(w, v, memory_order_seq_cst);
    if (atomic_load_explicit(sleepers, memory_order_seq_cst)) futex_wake_all(w);
}

static inline void post(shm_state *s, int which, uint32_t v) {
    shm_ctl *m = ctl(s, s->me);
    post_word(&m->w[which], &m->sleepers, v);
}

static void wake_everyone(shm_state *s) {
    for (int r = 0; r < s->n; r++) {
        for (int k = 0; k < 3; k++) futex_wake_all(&ctl(s, r)->w[k]);
        for (int d = 0; d < s->n; d++) {
            futex_wake_all(&chan(s, r, d)->head);
            futex_wake_all(&chan(s, r, d)->tail);
        }
    }
}

/* ------------------------------------------------------------- liveness */

static int pidfd_open_(int pid) {
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

static bool pid_dead(int pid, int pidfd) {
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

static fg_status group_fail(fg_comm *c, shm_state *s, const fg_comm_args *a, fg_status st,
                            const char *fmt, ...) FG_PRINTF(5, 6);
static void wake_everyone(shm_state *s);

/* Publishes why the group broke (the first rank to fail wins), so that
 * ranks blocked on someone else learn the cause. Returns false if another
 * rank was first. */
static bool publish_abort(shm_state *s, fg_status st, const char *op, uint64_t seq, const char *msg) {
    int32_t none = -1;
    if (!atomic_compare_exchange_strong(&s->hdr->abort_rank, &none, s->me)) return false;
    shm_hdr *h = s->hdr;
    h->abort_status = (int32_t)st;
    h->abort_seq = seq;
    snprintf(h->abort_op, sizeof h->abort_op, "%s", op ? op : "");
    snprintf(h->abort_msg, sizeof h->abort_msg, "%s", msg);
    atomic_store_explicit(&h->abort_ready, 1, memory_order_release);
    wake_everyone(s);
    return true;
}

/* Reports a failure this rank found, and tells every peer. */
static fg_status group_fail(fg_comm *c, shm_state *s, const fg_comm_args *a, fg_status st,
                            const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    publish_abort(s, st, a->name, a->seq, msg);
    return fg__comm_fail(c, a, st, "%s", msg);
}

/* The group was broken by another rank (or by this one on another thread). */
static fg_status aborted_elsewhere(fg_comm *c, shm_state *s, const fg_comm_args *a) {
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

/* Waits until *w (posted by rank q, whose sleeper count is *sleepers)
 * reaches target. Spins, then sleeps; every 50 ms checks the abort word,
 * whether q died or left, and the timeout. */
static fg_status wait_word(fg_comm *c, shm_state *s, const fg_comm_args *a, int q,
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
                return aborted_elsewhere(c, s, a);
        }
    }
    s->spin_cur = FG_MAX(1e-6, s->spin_cur * 0.5);
    /* yield: the peer may need this core */
    while (now - t0 < s->spin_cur + s->yield_s) {
        sched_yield();
        if (reached(atomic_load_explicit(w, memory_order_acquire), target)) return FG_OK;
        if (atomic_load_explicit(&s->hdr->abort_rank, memory_order_relaxed) >= 0)
            return aborted_elsewhere(c, s, a);
        now = fg_time();
    }
    /* sleep on the futex, checking the peer every 50 ms */
    for (;;) {
        atomic_fetch_add_explicit(sleepers, 1, memory_order_seq_cst);
        uint32_t v = atomic_load_explicit(w, memory_order_seq_cst);
        if (!reached(v, target) && atomic_load(&s->hdr->abort_rank) < 0) futex_wait(w, v, 0.05);
        atomic_fetch_sub_explicit(sleepers, 1, memory_order_seq_cst);
        if (reached(atomic_load_explicit(w, memory_order_acquire), target)) return FG_OK;
        if (atomic_load(&s->hdr->abort_rank) >= 0) return aborted_elsewhere(c, s, a);
        now = fg_time();
        if (now >= next_check) {
            next_check = now + 0.05;
            if (q >= 0 && q != s->me) {
                if (atomic_load(&ctl(s, q)->state) == ST_LEFT)
                    return group_fail(c, s, a, FG_EPEER,
                                      "rank %d (pid %d) left the group (fg_comm_free) while this "
                                      "rank waited for its %s",
                                      q, s->pids[q], what);
                if (s->watch[q] && pid_dead(s->pids[q], s->pidfd[q]))
                    return group_fail(c, s, a, FG_EPEER, "rank %d (pid %d) died", q, s->pids[q]);
            }
            if (c->aborted) return aborted_elsewhere(c, s, a);
            if (now - t0 > c->timeout_s) {
                char st = q >= 0 ? proc_state(s->pids[q]) : 0;
                return group_fail(c, s, a, FG_ETIMEOUT,
                                  "timed out after %.3g s waiting for rank %d (pid %d%s) to post "
                                  "its %s (FULGUR_COMM_TIMEOUT_S)",
                                  c->timeout_s, q, q >= 0 ? s->pids[q] : -1,
                                  st == 'T' || st == 't' ? ", stopped" : "", what);
            }
        }
    }
}

static const char *const k_word_names[3] = {"input", "reduced slice", "completion"};

/* Waits for word `which` of every rank (or just `only` if >= 0) to reach
 * target, skipping this rank. */
static fg_status wait_all(fg_comm *c, shm_state *s, const fg_comm_args *a, int which,
                          uint32_t target, int only) {
    for (int q = 0; q < s->n; q++) {
        if (q == s->me || (only >= 0 && q != only)) continue;
        if (which == W_DONE && reached(s->lb_done[q], target)) continue;
        shm_ctl *p = ctl(s, q);
        FG_TRY(wait_word(c, s, a, q, &p->w[which], &p->sleepers, target, k_word_names[which]));
        uint32_t v = atomic_load_explicit(&p->w[which], memory_order_relaxed);
        uint32_t lb = which == W_DONE ? v : v - 1; /* ready/mid of g imply done of g-1 */
        if (reached(lb, s->lb_done[q])) s->lb_done[q] = lb;
    }
    return FG_OK;
}

/* --------------------------------------------------------------- chunks */

static void sig_of(const fg_comm_args *a, int n, uint32_t out[3]) {
    int64_t count = a->count;
    if (a->op == FG_OP_ALLGATHERV) {
        count = 0;
        for (int q = 0; q < n; q++) count += a->counts[q];
    }
    out[0] = (uint32_t)a->seq;
    out[1] = (uint32_t)a->op | (uint32_t)a->dt << 8 | (uint32_t)a->rop << 16 |
             (uint32_t)(a->root & 0xff) << 24;
    out[2] = (uint32_t)count;
}

/* Starts chunk g: waits until every rank is done with chunk g-K (its slots
 * are free), publishes the call's signature for chunk g. */
static fg_status chunk_begin(fg_comm *c, shm_state *s, const fg_comm_args *a, const uint32_t sig[3]) {
    uint32_t g = s->g;
    /* a broken group moves no more data, even where a peer's words allow it */
    if (atomic_load_explicit(&s->hdr->abort_rank, memory_order_acquire) >= 0)
        return aborted_elsewhere(c, s, a);
    FG_TRY(wait_all(c, s, a, W_DONE, g - NSLOTS + 1, -1));
    shm_ctl *m = ctl(s, s->me);
    for (int k = 0; k < 3; k++)
        atomic_store_explicit(&m->sig[g % SIGRING][k], sig[k], memory_order_relaxed);
    return FG_OK;
}

static void describe_sig(const uint32_t sg[3], char *buf, size_t cap) {
    unsigned op = sg[1] & 0xff, dt = (sg[1] >> 8) & 0xff;
    snprintf(buf, cap, "%s #%u (count %u, %s)", op < FG_OP_COUNT ? fg__comm_op_names[op] : "?",
             sg[0], sg[2], fg_dtype_name((fg_dtype)dt));
}

/* After the peers posted ready for the first chunk of a call: did they all
 * enter the same call? (Their ring entry for chunk g stays put until this
 * rank is done with g.) */
static fg_status check_sigs(fg_comm *c, shm_state *s, const fg_comm_args *a, const uint32_t sig[3],
                            int only) {
    uint32_t g = s->g;
    for (int q = 0; q < s->n; q++) {
        if (q == s->me || (only >= 0 && q != only)) continue;
        uint32_t theirs[3];
        for (int k = 0; k < 3; k++)
            theirs[k] = atomic_load_explicit(&ctl(s, q)->sig[g % SIGRING][k], memory_order_relaxed);
        if (memcmp(theirs, sig, sizeof theirs) != 0) {
            char mine[160], other[160];
            describe_sig(sig, mine, sizeof mine);
            describe_sig(theirs, other, sizeof other);
            return group_fail(c, s, a, FG_EMISMATCH,
                              "rank %d is in %s while rank %d is in %s: all ranks must call the "
                              "same collectives in the same order (FULGUR_COMM_CHECK=1 tells more)",
                              q, other, s->me, mine);
        }
    }
    return FG_OK;
}

/* ready of chunk g: publish, wait for the peers (all, or `only`), and on the
 * first chunk of a call compare signatures. */
static fg_status chunk_wait_ready(fg_comm *c, shm_state *s, const fg_comm_args *a,
                                  const uint32_t sig[3], bool first, int only) {
    FG_TRY(wait_all(c, s, a, W_READY, s->g + 1, only));
    if (first) FG_TRY(check_sigs(c, s, a, sig, only));
    return FG_OK;
}

static fg_status chunk_ready(fg_comm *c, shm_state *s, const fg_comm_args *a, const uint32_t sig[3],
                             bool first, int only) {
    post(s, W_READY, s->g + 1);
    return chunk_wait_ready(c, s, a, sig, first, only);
}

static void chunk_end(shm_state *s) {
    post(s, W_DONE, s->g + 1);
    s->g++;
}

/* Elements per chunk for a slot holding `parts` pieces, a multiple of 64
 * bytes' worth so slices stay on cache lines. */
static int64_t chunk_elems(shm_state *s, size_t esz, int parts) {
    int64_t e = (int64_t)(s->slot_bytes / (size_t)parts / esz);
    int64_t line = (int64_t)(64 / esz);
    if (line > 1 && e > line) e -= e % line;
    return e > 0 ? e : 1; /* slot_bytes >= 8 * size: one element always fits */
}

/* Slice [lo, hi) of rank r when m elements are split over n ranks on
 * 64-byte boundaries. */
static void slice_of(int64_t m, int n, int r, size_t esz, int64_t *lo, int64_t *hi) {
    int64_t line = (int64_t)(64 / esz);
    int64_t lines = (m + line - 1) / line;
    int64_t a = lines * r / n * line, b = lines * (r + 1) / n * line;
    *lo = a < m ? a : m;
    *hi = b < m ? b : m;
}

/* ---------------------------------------------------------- collectives */

static fg_status shm_allreduce(fg_comm *c, const fg_comm_args *a) {
    shm_state *s = c->impl;
    size_t esz = fg_dtype_size(a->dt);
    const char *send = a->send;
    char *recv = a->recv;
    uint32_t sig[3];
    sig_of(a, s->n, sig);
    const void *srcs[64];
    const void **sp = s->n <= 64 ? srcs : fg_alloc(sizeof(void *) * (size_t)s->n);
    if (!sp) return fg__comm_fail(c, a, FG_ENOMEM, "out of memory");
    fg_status st = FG_OK;
    size_t bytes = (size_t)a->count * esz;
    /* outputs beyond the caches: stream them (no read-for-ownership) */
    bool nt = bytes >= s->nt_bytes;

    if (bytes <= ONE_SHOT_MAX && bytes <= s->slot_bytes) {
        FG_TRY_GOTO(chunk_begin(c, s, a, sig), st, out);
        memcpy(slot(s, s->me, s->g), send, bytes);
        FG_TRY_GOTO(chunk_ready(c, s, a, sig, true, -1), st, out);
        for (int q = 0; q < s->n; q++) sp[q] = slot(s, q, s->g);
        fg__reduce(a->dt, a->rop, recv, NULL, sp, s->n, a->count, s->n);
        chunk_end(s);
        goto out;
    }
    int64_t per = chunk_elems(s, esz, 1);
    for (int64_t off = 0; off < a->count; off += per) {
        int64_t m = FG_MIN(per, a->count - off);
        FG_TRY_GOTO(chunk_begin(c, s, a, sig), st, out);
        /* the peers read every slice of this rank's input but its own one,
         * which this rank reduces straight from the send buffer */
        int64_t lo, hi;
        slice_of(m, s->n, s->me, esz, &lo, &hi);
        char *base = slot(s, s->me, s->g);
        const char *in = send + off * (int64_t)esz;
        memcpy(base, in, (size_t)lo * esz);
        memcpy(base + hi * (int64_t)esz, in + hi * (int64_t)esz, (size_t)(m - hi) * esz);
        FG_TRY_GOTO(chunk_ready(c, s, a, sig, off == 0, -1), st, out);
        for (int q = 0; q < s->n; q++) sp[q] = slot(s, q, s->g) + lo * (int64_t)esz;
        sp[s->me] = in + lo * (int64_t)esz;
        char *mine = base + lo * (int64_t)esz;
        fg__reduce(a->dt, a->rop, mine, nt ? NULL : recv + (off + lo) * (int64_t)esz, sp, s->n,
                   hi - lo, s->n);
        post(s, W_MID, s->g + 1);
        if (nt) fg__copy(recv + (off + lo) * (int64_t)esz, mine, (size_t)(hi - lo) * esz, true);
        for (int k = 1; k < s->n; k++) {
            int q = (s->me + k) % s->n; /* start at the next rank: spread the readers */
            FG_TRY_GOTO(wait_all(c, s, a, W_MID, s->g + 1, q), st, out);
            slice_of(m, s->n, q, esz, &lo, &hi);
            fg__copy(recv + (off + lo) * (int64_t)esz, slot(s, q, s->g) + lo * (int64_t)esz,
                     (size_t)(hi - lo) * esz, nt);
        }
        chunk_end(s);
    }
out:
    if (sp != srcs) fg_free(sp);
    return st;
}

static fg_status shm_reduce(fg_comm *c, const fg_comm_args *a) {
    shm_state *s = c->impl;
    size_t esz = fg_dtype_size(a->dt);
    const char *send = a->send;
    char *recv = a->recv;
    bool root = s->me == a->root;
    uint32_t sig[3];
    sig_of(a, s->n, sig);
    const void *srcs[64];
    const void **sp = s->n <= 64 ? srcs : fg_alloc(sizeof(void *) * (size_t)s->n);
    if (!sp) return fg__comm_fail(c, a, FG_ENOMEM, "out of memory");
    fg_status st = FG_OK;
    int64_t per = chunk_elems(s, esz, 1);
    for (int64_t off = 0; off < a->count; off += per) {
        int64_t m = FG_MIN(per, a->count - off);
        FG_TRY_GOTO(chunk_begin(c, s, a, sig), st, out);
        memcpy(slot(s, s->me, s->g), send + off * (int64_t)esz, (size_t)m * esz);
        FG_TRY_GOTO(chunk_ready(c, s, a, sig, off == 0, -1), st, out);
        int64_t lo, hi;
        slice_of(m, s->n, s->me, esz, &lo, &hi);
        for (int q = 0; q < s->n; q++) sp[q] = slot(s, q, s->g) + lo * (int64_t)esz;
        fg__reduce(a->dt, a->rop, slot(s, s->me, s->g) + lo * (int64_t)esz,
                   root ? recv + (off + lo) * (int64_t)esz : NULL, sp, s->n, hi - lo, s->n);
        post(s, W_MID, s->g + 1);
        if (root) {
            for (int k = 1; k < s->n; k++) {
                int q = (s->me + k) % s->n;
                FG_TRY_GOTO(wait_all(c, s, a, W_MID, s->g + 1, q), st, out);
                slice_of(m, s->n, q, esz, &lo, &hi);
                memcpy(recv + (off + lo) * (int64_t)esz, slot(s, q, s->g) + lo * (int64_t)esz,
                       (size_t)(hi - lo) * esz);
            }
        }
        chunk_end(s);
    }
out:
    if (sp != srcs) fg_free(sp);
    return st;
}

static fg_status shm_reduce_scatter(fg_comm *c, const fg_comm_args *a) {
    shm_state *s = c->impl;
    size_t esz = fg_dtype_size(a->dt);
    const char *send = a->send;
    char *recv = a->recv;
    int64_t rc = a->count;
    uint32_t sig[3];
    sig_of(a, s->n, sig);
    const void *srcs[64];
    const void **sp = s->n <= 64 ? srcs : fg_alloc(sizeof(void *) * (size_t)s->n);
    if (!sp) return fg__comm_fail(c, a, FG_ENOMEM, "out of memory");
    fg_status st = FG_OK;
    int64_t per = chunk_elems(s, esz, s->n);
    for (int64_t off = 0; off < rc; off += per) {
        int64_t m = FG_MIN(per, rc - off);
        FG_TRY_GOTO(chunk_begin(c, s, a, sig), st, out);
        char *mine = slot(s, s->me, s->g);
        for (int b = 0; b < s->n; b++)
            memcpy(mine + (size_t)b * (size_t)per * esz, send + ((int64_t)b * rc + off) * (int64_t)esz,
                   (size_t)m * esz);
        FG_TRY_GOTO(chunk_ready(c, s, a, sig, off == 0, -1), st, out);
        for (int q = 0; q < s->n; q++)
            sp[q] = slot(s, q, s->g) + (size_t)s->me * (size_t)per * esz;
        fg__reduce(a->dt, a->rop, recv + off * (int64_t)esz, NULL, sp, s->n, m, s->n);
        chunk_end(s);
    }
out:
    if (sp != srcs) fg_free(sp);
    return st;
}

/* allgather and allgatherv: rank q's piece of counts[q] elements goes to
 * recv + displs[q] (counts NULL: a->count each, packed in rank order). */
static fg_status gatherv(fg_comm *c, const fg_comm_args *a, const int64_t *counts,
                         const int64_t *displs) {
    shm_state *s = c->impl;
    size_t esz = fg_dtype_size(a->dt);
    const char *send = a->send;
    char *recv = a->recv;
    uint32_t sig[3];
    sig_of(a, s->n, sig);
#define CNT(q) (counts ? counts[q] : a->count)
#define DSP(q) (displs ? displs[q] : (int64_t)(q) * a->count)
    int64_t maxc = 0;
    for (int q = 0; q < s->n; q++) maxc = FG_MAX(maxc, CNT(q));
    bool inplace = send == recv + DSP(s->me) * (int64_t)esz;
    int64_t per = chunk_elems(s, esz, 1);
    for (int64_t off = 0; off < maxc; off += per) {
        FG_TRY(chunk_begin(c, s, a, sig));
        int64_t m = FG_MIN(per, CNT(s->me) - off);
        if (m > 0) memcpy(slot(s, s->me, s->g), send + off * (int64_t)esz, (size_t)m * esz);
        post(s, W_READY, s->g + 1);
        /* this rank's own piece while the peers copy theirs in */
        if (m > 0 && !inplace)
            memcpy(recv + (DSP(s->me) + off) * (int64_t)esz, send + off * (int64_t)esz,
                   (size_t)m * esz);
        FG_TRY(chunk_wait_ready(c, s, a, sig, off == 0, -1));
        for (int k = 1; k < s->n; k++) {
            int q = (s->me + k) % s->n;
            int64_t mq = FG_MIN(per, CNT(q) - off);
            if (mq > 0)
                memcpy(recv + (DSP(q) + off) * (int64_t)esz, slot(s, q, s->g), (size_t)mq * esz);
        }
        chunk_end(s);
    }
#undef CNT
#undef DSP
    return FG_OK;
}

static fg_status shm_allgather(fg_comm *c, const fg_comm_args *a) {
    return gatherv(c, a, NULL, NULL);
}

static fg_status shm_allgatherv(fg_comm *c, const fg_comm_args *a) {
    return gatherv(c, a, a->counts, a->displs);
}

static fg_status shm_broadcast(fg_comm *c, const fg_comm_args *a) {
    shm_state *s = c->impl;
    size_t esz = fg_dtype_size(a->dt);
    bool root = s->me == a->root;
    const char *send = a->send;
    char *recv = a->recv;
    uint32_t sig[3];
    sig_of(a, s->n, sig);
    int64_t per = chunk_elems(s, esz, 1);
    for (int64_t off = 0; off < a->count; off += per) {
        int64_t m = FG_MIN(per, a->count - off);
        FG_TRY(chunk_begin(c, s, a, sig));
        if (root) {
            memcpy(slot(s, s->me, s->g), send + off * (int64_t)esz, (size_t)m * esz);
            if (send != recv)
                memcpy(recv + off * (int64_t)esz, send + off * (int64_t)esz, (size_t)m * esz);
            /* the root waits for nobody here; the others' signatures are
             * checked by them against the root's */
            post(s, W_READY, s->g + 1);
        } else {
            FG_TRY(chunk_ready(c, s, a, sig, off == 0, a->root));
            memcpy(recv + off * (int64_t)esz, slot(s, a->root, s->g), (size_t)m * esz);
        }
        chunk_end(s);
    }
    return FG_OK;
}

static fg_status shm_barrier(fg_comm *c, const fg_comm_args *a) {
    shm_state *s = c->impl;
    uint32_t sig[3];
    sig_of(a, s->n, sig);
    FG_TRY(chunk_begin(c, s, a, sig));
    FG_TRY(chunk_ready(c, s, a, sig, true, -1));
    chunk_end(s);
    return FG_OK;
}

static fg_status shm_alltoall(fg_comm *c, const fg_comm_args *a) {
    shm_state *s = c->impl;
    size_t esz = fg_dtype_size(a->dt);
    const char *send = a->send;
    char *recv = a->recv;
    int64_t cnt = a->count;
    uint32_t sig[3];
    sig_of(a, s->n, sig);
    int64_t per = chunk_elems(s, esz, s->n);
    for (int64_t off = 0; off < cnt; off += per) {
        int64_t m = FG_MIN(per, cnt - off);
        FG_TRY(chunk_begin(c, s, a, sig));
        char *mine = slot(s, s->me, s->g);
        for (int b = 0; b < s->n; b++)
            memcpy(mine + (size_t)b * (size_t)per * esz, send + ((int64_t)b * cnt + off) * (int64_t)esz,
                   (size_t)m * esz);
        FG_TRY(chunk_ready(c, s, a, sig, off == 0, -1));
        for (int q = 0; q < s->n; q++)
            memcpy(recv + ((int64_t)q * cnt + off) * (int64_t)esz,
                   slot(s, q, s->g) + (size_t)s->me * (size_t)per * esz, (size_t)m * esz);
        chunk_end(s);
    }
    return FG_OK;
}

/* ------------------------------------------------------- point to point */

static fg_status shm_send(fg_comm *c, const fg_comm_args *a) {
    shm_state *s = c->impl;
    int peer = a->root;
    shm_chan *ch = chan(s, s->me, peer);
    size_t esz = fg_dtype_size(a->dt), total = (size_t)a->count * esz, off = 0;
    size_t cap = s->p2p_slot - P2P_HDR;
    uint32_t head = atomic_load_explicit(&ch->head, memory_order_relaxed);
    do {
        /* a slot is free once the receiver consumed the piece two back */
        FG_TRY(wait_word(c, s, a, peer, &ch->tail, &ch->sleep_tail, head - 1, "receive"));
        char *sl = chan_slot(s, ch, head);
        size_t k = total - off < cap ? total - off : cap;
        p2p_piece ph = {.count = a->count, .dt = (int32_t)a->dt, .bytes = (uint32_t)k, .first = off == 0};
        memcpy(sl, &ph, sizeof ph);
        memcpy(sl + P2P_HDR, (const char *)a->send + off, k);
        off += k;
        head++;
        post_word(&ch->head, &ch->sleep_head, head);
    } while (off < total);
    return FG_OK;
}

static fg_status shm_recv(fg_comm *c, const fg_comm_args *a) {
    shm_state *s = c->impl;
    int peer = a->root;
    shm_chan *ch = chan(s, peer, s->me);
    size_t esz = fg_dtype_size(a->dt), total = (size_t)a->count * esz, off = 0;
    uint32_t tail = atomic_load_explicit(&ch->tail, memory_order_relaxed);
    do {
        FG_TRY(wait_word(c, s, a, peer, &ch->head, &ch->sleep_head, tail + 1, "send"));
        const char *sl = chan_slot(s, ch, tail);
        p2p_piece ph;
        memcpy(&ph, sl, sizeof ph);
        if (off == 0 && (!ph.first || ph.count != a->count || ph.dt != (int32_t)a->dt))
            return group_fail(c, s, a, FG_EMISMATCH,
                              "rank %d sent %lld elements of %s but this rank (%d) receives %lld "
                              "of %s",
                              peer, (long long)ph.count, fg_dtype_name((fg_dtype)ph.dt), s->me,
                              (long long)a->count, fg_dtype_name(a->dt));
        if (ph.bytes > total - off || ph.bytes > s->p2p_slot - P2P_HDR)
            return group_fail(c, s, a, FG_EINTERNAL, "corrupt message from rank %d", peer);
        memcpy((char *)a->recv + off, sl + P2P_HDR, ph.bytes);
        off += ph.bytes;
        tail++;
        post_word(&ch->tail, &ch->sleep_tail, tail);
    } while (off < total);
    return FG_OK;
}

/* ------------------------------------------------------- rendezvous */

static void sleep_s(double t) {
    struct timespec ts = {(time_t)t, (long)((t - (double)(time_t)t) * 1e9)};
    nanosleep(&ts, NULL);
}

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static void layout(shm_state *s, int n, size_t slot_bytes, size_t p2p_slot) {
    s->n = n;
    s->slot_bytes = slot_bytes;
    s->p2p_slot = p2p_slot;
    s->chan_bytes = CHAN_HDR + 2 * p2p_slot;
    size_t ctl_off = HDR_BYTES;
    size_t chan_off = round_up(ctl_off + (size_t)n * CTL_BYTES, 4096);
    size_t data_off = round_up(chan_off + (size_t)n * (size_t)n * s->chan_bytes, 4096);
    s->len = data_off + (size_t)n * NSLOTS * slot_bytes;
    s->ctl_base = (char *)(uintptr_t)ctl_off;   /* offsets until mapped */
    s->chan_base = (char *)(uintptr_t)chan_off;
    s->data = (char *)(uintptr_t)data_off;
}

static void rebase(shm_state *s, char *base) {
    s->base = base;
    s->hdr = (shm_hdr *)base;
    s->ctl_base = base + (uintptr_t)s->ctl_base;
    s->chan_base = base + (uintptr_t)s->chan_base;
    s->data = base + (uintptr_t)s->data;
}

/* The rendezvous point: an abstract unix socket (no file, gone when its
 * owner exits) named after the uid, the job and the group. */
static socklen_t sock_addr(const shm_state *s, struct sockaddr_un *addr) {
    memset(addr, 0, sizeof *addr);
    addr->sun_family = AF_UNIX;
    int k = snprintf(addr->sun_path + 1, sizeof addr->sun_path - 1, "%s", s->name + 1);
    if (k < 0 || (size_t)k >= sizeof addr->sun_path - 1) k = (int)sizeof addr->sun_path - 1;
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)k);
}

static void init_header(shm_state *s) {
    shm_hdr *h = s->hdr;
    h->version = SHM_VERSION;
    h->size = s->n;
    h->creator_pid = (int32_t)getpid();
    h->slot_bytes = s->slot_bytes;
    h->p2p_slot = s->p2p_slot;
    h->total = s->len;
    h->nslots = NSLOTS;
    atomic_store(&h->abort_rank, -1);
    atomic_store_explicit(&h->magic, SHM_MAGIC, memory_order_release);
}

static void missing_ranks(shm_state *s, char *buf, size_t cap) {
    size_t k = 0;
    buf[0] = 0;
    for (int q = 0; q < s->n && k + 16 < cap; q++)
        if (q != s->me && !atomic_load(&ctl(s, q)->pid))
            k += (size_t)snprintf(buf + k, cap - k, "%s%d", k ? ", " : "", q);
}

/* Group rank 0: makes the memory (a memfd: it has no name, so nothing can
 * be left behind) and hands it to each peer that connects to the socket. */
static fg_status create_segment(fg_comm *c, shm_state *s, double deadline) {
    int fd = memfd_create("fulgur-shm", MFD_CLOEXEC);
    if (fd < 0) return fg_error(FG_EIO, "shm: memfd_create failed: %s", strerror(errno));
    int err = posix_fallocate(fd, 0, (off_t)s->len);
    if (err) {
        close(fd);
        return fg_error(FG_ENOMEM, "shm: cannot reserve %.1f MiB of shared memory: %s",
                        (double)s->len / 1048576.0, strerror(err));
    }
    void *p = mmap(NULL, s->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return fg_error(FG_EIO, "shm: mmap failed: %s", strerror(errno));
    }
    rebase(s, p);
    init_header(s);
    atomic_store(&ctl(s, 0)->pid, (int32_t)getpid());

    fg_status st = FG_OK;
    struct sockaddr_un addr;
    socklen_t alen = sock_addr(s, &addr);
    int ls = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (ls < 0 || bind(ls, (struct sockaddr *)&addr, alen) != 0 || listen(ls, s->n) != 0) {
        int e = errno;
        st = fg_error(e == EADDRINUSE ? FG_EINVAL : FG_EIO,
                      "shm: cannot open the rendezvous point %s: %s%s", s->name, strerror(e),
                      e == EADDRINUSE ? " (another job with the same job id is running on this "
                                        "machine: set FULGUR_JOB_ID or MASTER_PORT to tell them apart)"
                                      : "");
        goto out;
    }
    for (int served = 0; served < s->n - 1;) {
        int conn = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
        if (conn < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                st = fg_error(FG_EIO, "shm: accept on %s failed: %s", s->name, strerror(errno));
                goto out;
            }
            if (fg_time() > deadline) {
                char miss[256];
                missing_ranks(s, miss, sizeof miss);
                st = fg_error(FG_ETIMEOUT,
                              "shm: timed out after %.3g s waiting for rank(s) %s to join %s "
                              "(FULGUR_COMM_TIMEOUT_S; same job id and world size everywhere?)",
                              c->timeout_s, miss, s->name);
                goto out;
            }
            struct pollfd pf = {.fd = ls, .events = POLLIN};
            poll(&pf, 1, 10);
            continue;
        }
        struct ucred cred;
        socklen_t cl = sizeof cred;
        if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0 && cred.uid == getuid()) {
            char cmsgbuf[CMSG_SPACE(sizeof(int))];
            memset(cmsgbuf, 0, sizeof cmsgbuf);
            uint64_t len = s->len;
            struct iovec iov = {.iov_base = &len, .iov_len = sizeof len};
            struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cmsgbuf,
                                .msg_controllen = sizeof cmsgbuf};
            struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
            cm->cmsg_level = SOL_SOCKET;
            cm->cmsg_type = SCM_RIGHTS;
            cm->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(cm), &fd, sizeof fd);
            if (sendmsg(conn, &mh, MSG_NOSIGNAL) == (ssize_t)sizeof len) served++;
        }
        close(conn);
    }
out:
    if (ls >= 0) close(ls);
    close(fd);
    return st;
}

/* The other ranks: connect (retrying until the timeout) and map the memory
 * rank 0 hands over. */
static fg_status open_segment(fg_comm *c, shm_state *s, double deadline) {
    struct sockaddr_un addr;
    socklen_t alen = sock_addr(s, &addr);
    double pause = 0.0005;
    for (;;) {
        int sk = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (sk < 0) return fg_error(FG_EIO, "shm: socket failed: %s", strerror(errno));
        if (connect(sk, (struct sockaddr *)&addr, alen) == 0) {
            struct pollfd pf = {.fd = sk, .events = POLLIN};
            while (poll(&pf, 1, 10) == 0 && fg_time() < deadline) {
            }
            uint64_t len = 0;
            char cmsgbuf[CMSG_SPACE(sizeof(int))];
            struct iovec iov = {.iov_base = &len, .iov_len = sizeof len};
            struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cmsgbuf,
                                .msg_controllen = sizeof cmsgbuf};
            ssize_t k = pf.revents ? recvmsg(sk, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC) : -1;
            close(sk);
            struct cmsghdr *cm = k == (ssize_t)sizeof len ? CMSG_FIRSTHDR(&mh) : NULL;
            if (cm && cm->cmsg_type == SCM_RIGHTS) {
                int fd;
                memcpy(&fd, CMSG_DATA(cm), sizeof fd);
                if (len != s->len) {
                    close(fd);
                    return fg_error(FG_EINVAL,
                                    "shm: rank 0's segment %s has %llu bytes, this rank expects "
                                    "%zu: ranks disagree on the world size or on "
                                    "FULGUR_SHM_CHUNK_BYTES",
                                    s->name, (unsigned long long)len, s->len);
                }
                void *p = mmap(NULL, s->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                close(fd);
                if (p == MAP_FAILED)
                    return fg_error(FG_EIO, "shm: mmap failed: %s", strerror(errno));
                shm_hdr *h = p;
                if (atomic_load_explicit(&h->magic, memory_order_acquire) != SHM_MAGIC ||
                    h->size != s->n) {
                    int other = h->size;
                    munmap(p, s->len);
                    return fg_error(FG_EINVAL,
                                    "shm: segment %s is for %d ranks, this rank expects %d: ranks "
                                    "disagree on the world size, or two jobs share a job id",
                                    s->name, other, s->n);
                }
                rebase(s, p);
                return FG_OK;
            }
        } else {
            close(sk);
        }
        if (fg_time() > deadline) break;
        sleep_s(pause);
        if (pause < 0.01) pause *= 2;
    }
    return fg_error(FG_ETIMEOUT,
                    "shm: rank %d could not reach rank 0 at %s within %.3g s: is rank 0 running, "
                    "with the same job id (FULGUR_JOB_ID, MASTER_PORT) and world size?",
                    c->rank, s->name, c->timeout_s);
}

static void shm_free_state(shm_state *s) {
    if (!s) return;
    if (s->pidfd)
        for (int q = 0; q < s->n; q++)
            if (s->pidfd[q] >= 0) close(s->pidfd[q]);
    if (s->base) munmap(s->base, s->len);
    fg_free(s->pidfd);
    fg_free(s->pids);
    fg_free(s->lb_done);
    fg_free(s->watch);
    fg_free(s);
}

static fg_status env_size(const char *name, long def, long lo, long hi, long *out) {
    FG_TRY(fg__env_int(name, def, out));
    if (*out < lo || *out > hi)
        return fg_error(FG_EINVAL, "%s=%ld: must be in [%ld, %ld]", name, *out, lo, hi);
    return FG_OK;
}

/* Builds the group's state: members meet in a segment named after the uid,
 * the job and the group; `creator` is the group's rank 0. */
static fg_status shm_join(fg_comm *c) {
    fg_status st = FG_OK;
    shm_state *s = fg_calloc(1, sizeof *s);
    if (!s) return FG_ENOMEM;
    int n = c->size;
    s->me = c->rank;
    if (n > 4096) {
        fg_free(s);
        return fg_error(FG_EUNSUPPORTED, "shm: %d ranks on one machine: at most 4096", n);
    }
    s->pidfd = fg_alloc(sizeof(int) * (size_t)n);
    s->pids = fg_calloc((size_t)n, sizeof(int));
    s->lb_done = fg_calloc((size_t)n, sizeof(uint32_t));
    s->watch = fg_alloc((size_t)n * sizeof(bool));
    if (!s->pidfd || !s->pids || !s->lb_done || !s->watch) {
        st = FG_ENOMEM;
        goto fail;
    }
    for (int q = 0; q < n; q++) {
        s->pidfd[q] = -1;
        s->watch[q] = true;
    }
    long chunk, spin_us;
    FG_TRY_GOTO(env_size("FULGUR_SHM_CHUNK_BYTES", DEFAULT_CHUNK, 4096, 64 << 20, &chunk), st, fail);
    chunk = chunk / 4096 * 4096;
    if (n > 16 && chunk > (8L << 20) / n) chunk = FG_MAX(32768L, (8L << 20) / n / 4096 * 4096);
    int ncores = fg_num_cores();
    s->oversub = n > ncores;
    long yield_us;
    FG_TRY_GOTO(env_size("FULGUR_SHM_SPIN_US", s->oversub ? 1 : 50, 0, 10000000, &spin_us), st, fail);
    FG_TRY_GOTO(env_size("FULGUR_SHM_YIELD_US", 1000, 0, 10000000, &yield_us), st,
                fail);
    s->spin_s = s->spin_cur = (double)spin_us * 1e-6;
    s->yield_s = (double)yield_us * 1e-6;
    long ntb;
    FG_TRY_GOTO(env_size("FULGUR_SHM_NT_BYTES", 8L << 20, 0, 1L << 40, &ntb), st, fail);
    s->nt_bytes = (size_t)ntb;
    layout(s, n, (size_t)chunk, n <= 16 ? (16 << 10) + P2P_HDR : (4 << 10) + P2P_HDR);

    if (n == 1) { /* a world of one needs no segment: private memory, same code */
        void *p = mmap(NULL, s->len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            st = fg_error(FG_ENOMEM, "shm: cannot map %zu bytes: %s", s->len, strerror(errno));
            goto fail;
        }
        rebase(s, p);
        atomic_store(&s->hdr->abort_rank, -1);
        s->hdr->size = 1;
        atomic_store(&ctl(s, 0)->pid, (int32_t)getpid());
        s->pids[0] = getpid();
        snprintf(s->name, sizeof s->name, "(private)");
        c->impl = s;
        return FG_OK;
    }

    snprintf(s->name, sizeof s->name, "@fulgur-%u-%s-%s", (unsigned)getuid(), c->job_key,
             c->group_id);
    double t0 = fg_time(), deadline = t0 + c->timeout_s;
    bool creator = c->rank == 0;
    if (creator) FG_TRY_GOTO(create_segment(c, s, deadline), st, fail);
    else FG_TRY_GOTO(open_segment(c, s, deadline), st, fail);

    shm_hdr *h = s->hdr;
    shm_ctl *m = ctl(s, s->me);
    int32_t zero = 0, mypid = (int32_t)getpid();
    if (!creator && !atomic_compare_exchange_strong(&m->pid, &zero, mypid)) {
        st = fg_error(FG_EINVAL,
                      "shm: rank %d of %s is already taken by pid %d: two processes were given "
                      "the same rank (check FULGUR_RANK / RANK)",
                      s->me, s->name, zero);
        goto fail;
    }
    atomic_store(&m->state, ST_ATTACHED);
    atomic_fetch_add(&h->attached, 1);
    /* wait until everybody has mapped the memory */
    for (double pause = 0.0002;; pause = pause < 0.005 ? pause * 2 : pause) {
        if (atomic_load(&h->attached) == n) break;
        if (atomic_load(&h->abort_rank) >= 0) {
            st = fg_error(FG_EPEER, "shm: group aborted during set-up: %s", h->abort_msg);
            goto fail;
        }
        for (int q = 0; q < n; q++) {
            int pid = atomic_load(&ctl(s, q)->pid);
            if (pid && pid_dead(pid, -1)) {
                st = fg_error(FG_EPEER, "shm: rank %d (pid %d) died while the group was set up", q,
                              pid);
                goto fail;
            }
        }
        if (fg_time() > deadline) {
            char miss[256];
            missing_ranks(s, miss, sizeof miss);
            st = fg_error(FG_ETIMEOUT, "shm: timed out after %.3g s waiting for rank(s) %s to map %s",
                          c->timeout_s, miss, s->name);
            goto fail;
        }
        sleep_s(pause);
    }
    /* Watch each peer through a pidfd. A peer whose pid is not a live
     * process here although it just attached lives in another pid namespace
     * (containers sharing memory): it cannot be watched, and its death shows
     * as the timeout instead. */
    for (int q = 0; q < n; q++) {
        s->pids[q] = atomic_load(&ctl(s, q)->pid);
        if (q == s->me) continue;
        s->pidfd[q] = pidfd_open_(s->pids[q]);
        if (s->pidfd[q] < 0 && errno != ENOSYS) s->watch[q] = false;
        else if (s->pidfd[q] < 0 && pid_dead(s->pids[q], -1)) s->watch[q] = false;
        if (!s->watch[q])
            fg_log(FG_LOG_WARN,
                   "comm shm: rank %d (pid %d) is not visible from this process (another pid "
                   "namespace?): its death will show as a timeout only",
                   q, s->pids[q]);
    }
    c->impl = s;
    return FG_OK;

fail:
    if (s->base && s->hdr && s->n > 1) {
        char msg[700];
        snprintf(msg, sizeof msg, "rank %d failed to join: %s", s->me, fg_last_error());
        publish_abort(s, FG_EPEER, NULL, 0, msg);
    }
    shm_free_state(s);
    return st;
}

static fg_status shm_init(fg_comm *c, const fg_cluster_info *info) {
    (void)info;
    FG_TRY(shm_join(c));
    return FG_OK;
}

static fg_status shm_split(fg_comm *parent, fg_comm *child, int color, int key) {
    (void)parent;
    (void)color;
    (void)key;
    return child ? shm_join(child) : FG_OK;
}

static void shm_destroy(fg_comm *c) {
    shm_state *s = c->impl;
    if (!s) return;
    if (s->n > 1) {
        atomic_store(&ctl(s, s->me)->state, ST_LEFT);
        shm_ctl *m = ctl(s, s->me);
        for (int k = 0; k < 3; k++) futex_wake_all(&m->w[k]);
        for (int d = 0; d < s->n; d++) {
            futex_wake_all(&chan(s, s->me, d)->head);
            futex_wake_all(&chan(s, d, s->me)->tail);
        }
    }
    shm_free_state(s);
    c->impl = NULL;
}

static void shm_abort(fg_comm *c) {
    shm_state *s = c->impl;
    if (!s) return;
    char msg[64];
    snprintf(msg, sizeof msg, "rank %d aborted the group (fg_comm_abort)", s->me);
    if (!publish_abort(s, FG_EPEER, NULL, 0, msg)) wake_everyone(s);
}

const fg_comm_backend fg__comm_shm_backend = {
    .name = "shm",
    .init = shm_init,
    .split = shm_split,
    .destroy = shm_destroy,
    .abort = shm_abort,
    .allreduce = shm_allreduce,
    .reduce_scatter = shm_reduce_scatter,
    .allgather = shm_allgather,
    .allgatherv = shm_allgatherv,
    .broadcast = shm_broadcast,
    .reduce = shm_reduce,
    .barrier = shm_barrier,
    .alltoall = shm_alltoall,
    .send = shm_send,
    .recv = shm_recv,
};
