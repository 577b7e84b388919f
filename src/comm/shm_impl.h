/* Private header of the shm backend, shared by shm.c (the segment, the
 * rendezvous, the backend table), shm_wait.c (waiting, liveness, aborts) and
 * shm_coll.c (the collectives and point to point).
 *
 * Layout of the segment (offsets fixed by the creator, read by all):
 *   header   magic, group size, sizes, the abort word and message
 *   ctl[N]   one block per rank: the words it posts (ready, mid, done: one
 *            cache line, written by that rank only), its signature ring, its
 *            pid and state, and the count of peers sleeping on its words
 *   p2p      one channel per ordered pair (src, dst): two slots
 *   data     per rank, K slots of slot_bytes: the staging area of chunks
 *
 * The structs below are that memory, shared by every process of the group:
 * their layout is the protocol between the ranks. */
#ifndef FULGUR_SHM_IMPL_H
#define FULGUR_SHM_IMPL_H

#include <linux/futex.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "comm_impl.h"

#define SHM_MAGIC 0x46475348u /* "FGSH" */
#define SHM_VERSION 1u
#define HDR_BYTES 4096
#define CTL_BYTES 256
#define SIGRING 4      /* signature ring entries; == K below */
#define P2P_HDR 64     /* per slot: message header */
#define CHAN_HDR 192   /* per channel: head, tail, sleepers on separate lines */
#define NSLOTS SIGRING /* K: chunk slots per rank */

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
    _Atomic uint32_t w[3];            /* ready, mid, done */
    _Atomic uint32_t sig[SIGRING][3]; /* per chunk: seq, op/dtype/rop/root, count */
    uint32_t pad0;
    /* line 1 */
    _Atomic int32_t pid;
    _Atomic int32_t state;
    _Atomic uint32_t sleepers; /* peers sleeping on this rank's words */
    _Atomic uint64_t pidns;    /* the owner's pid namespace (inode), set before state */
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
    uint32_t g;        /* next chunk number */
    uint32_t *lb_done; /* lower bounds of the peers' done words */
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

/* ------------------------------------------------------------- posting */

static inline void futex_wake_all(_Atomic uint32_t *w) {
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
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

/* ------------------------------------------------------------- shm_wait.c */

/* Wakes everything sleeping on any word of the segment. */
void fg__shm_wake_everyone(shm_state *s);
/* pidfd_open(2); -1 with errno ENOSYS where the system has none. */
int fg__shm_pidfd_open(int pid);
/* Has pid exited (a zombie counts)? Through its pidfd when >= 0. */
bool fg__shm_pid_dead(int pid, int pidfd);
/* Publishes why the group broke (the first rank to fail wins), so that
 * ranks blocked on someone else learn the cause. Returns false if another
 * rank was first. */
bool fg__shm_publish_abort(shm_state *s, fg_status st, const char *op, uint64_t seq,
                           const char *msg);
/* Reports a failure this rank found, and tells every peer. */
FG_MUST_USE fg_status fg__shm_group_fail(fg_comm *c, shm_state *s, const fg__comm_args *a,
                                         fg_status st, const char *fmt, ...) FG_PRINTF(5, 6);
/* The group was broken by another rank (or by this one on another thread). */
FG_MUST_USE fg_status fg__shm_aborted_elsewhere(fg_comm *c, shm_state *s, const fg__comm_args *a);
/* Waits until *w (posted by rank q, whose sleeper count is *sleepers)
 * reaches target. Spins, then sleeps; every 50 ms checks the abort word,
 * whether q died or left, and the timeout.
 * `what` names the word in messages ("input"). */
FG_MUST_USE fg_status fg__shm_wait_word(fg_comm *c, shm_state *s, const fg__comm_args *a, int q,
                                        _Atomic uint32_t *w, _Atomic uint32_t *sleepers,
                                        uint32_t target, const char *what);
/* Waits for word `which` of every rank (or just `only` if >= 0) to reach
 * target, skipping this rank. `which` is W_READY, W_MID or W_DONE. */
FG_MUST_USE fg_status fg__shm_wait_all(fg_comm *c, shm_state *s, const fg__comm_args *a, int which,
                                       uint32_t target, int only);

/* ------------------------------------------------------------- shm_coll.c */

FG_MUST_USE fg_status fg__shm_allreduce(fg_comm *c, const fg__comm_args *a);
FG_MUST_USE fg_status fg__shm_reduce(fg_comm *c, const fg__comm_args *a);
FG_MUST_USE fg_status fg__shm_reduce_scatter(fg_comm *c, const fg__comm_args *a);
FG_MUST_USE fg_status fg__shm_allgather(fg_comm *c, const fg__comm_args *a);
FG_MUST_USE fg_status fg__shm_allgatherv(fg_comm *c, const fg__comm_args *a);
FG_MUST_USE fg_status fg__shm_broadcast(fg_comm *c, const fg__comm_args *a);
FG_MUST_USE fg_status fg__shm_barrier(fg_comm *c, const fg__comm_args *a);
FG_MUST_USE fg_status fg__shm_alltoall(fg_comm *c, const fg__comm_args *a);
FG_MUST_USE fg_status fg__shm_send(fg_comm *c, const fg__comm_args *a);
FG_MUST_USE fg_status fg__shm_recv(fg_comm *c, const fg__comm_args *a);

#endif
