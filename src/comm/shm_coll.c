/* The collectives and point to point, over the segment of shm_impl.h.
 *
 * Every collective is a sequence of chunks; chunk number g (a counter all
 * ranks keep in step) uses slot g % K of every rank. For each chunk a rank
 * posts ready = g+1 once its input is in its slot, mid = g+1 once its share
 * of the reduction is done, done = g+1 once it no longer reads any slot of
 * chunk g. A rank writes slot g % K only after every rank posted done >=
 * g-K+1, so no rank runs more than K chunks ahead of another, and while one
 * rank reduces chunk g another already copies in chunk g+1: both cores
 * stream memory at once. (The allreduce copies chunks in up to K ahead of
 * the ones it is done with: its ready and mid of g say only that g-K is
 * done.)
 *
 * Allreduce of a large buffer (reduce-scatter + allgather per chunk): each
 * rank copies its chunk in, reduces its slice of the chunk over all ranks'
 * slots in rank order 0..N-1 (into its own slot and its output), then copies
 * the other slices out; the three steps of different chunks interleave as
 * the peers' words allow. Every element is reduced once, in
 * a fixed order, by one rank: the result is bitwise the same on every rank and every run. Small
 * buffers take one chunk in which every rank reduces the whole buffer itself, still in rank order.
 *
 * Point to point: each ordered pair of ranks has a channel of two slots; a
 * message goes in pieces, the sender filling one slot while the receiver
 * empties the other. */
#include <stdio.h>
#include <string.h>

#include "shm_impl.h"

#define ONE_SHOT_MAX (16 << 10)

/* --------------------------------------------------------------- chunks */

static void sig_of(const fg__comm_args *a, int n, uint32_t out[3]) {
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
static FG_MUST_USE fg_status chunk_begin_at(fg_comm *c, shm_state *s, const fg__comm_args *a,
                                            const uint32_t sig[3], uint32_t g) {
    /* a broken group moves no more data, even where a peer's words allow it */
    if (atomic_load_explicit(&s->hdr->abort_rank, memory_order_acquire) >= 0)
        return fg__shm_aborted_elsewhere(c, s, a);
    FG_TRY(fg__shm_wait_all(c, s, a, W_DONE, g - NSLOTS + 1, -1));
    shm_ctl *m = ctl(s, s->me);
    for (int k = 0; k < 3; k++)
        atomic_store_explicit(&m->sig[g % SIGRING][k], sig[k], memory_order_relaxed);
    return FG_OK;
}

static FG_MUST_USE fg_status chunk_begin(fg_comm *c, shm_state *s, const fg__comm_args *a,
                                         const uint32_t sig[3]) {
    return chunk_begin_at(c, s, a, sig, s->g);
}

static void describe_sig(const uint32_t sg[3], char *buf, size_t cap) {
    unsigned op = sg[1] & 0xff, dt = (sg[1] >> 8) & 0xff;
    snprintf(buf, cap, "%s #%u (count %u, %s)", op < FG_OP_COUNT ? fg__comm_op_names[op] : "?",
             sg[0], sg[2], fg_dtype_name((fg_dtype)dt));
}

/* After the peers posted ready for the first chunk of a call: did they all
 * enter the same call? (Their ring entry for chunk g stays put until this
 * rank is done with g.) */
static FG_MUST_USE fg_status check_sigs(fg_comm *c, shm_state *s, const fg__comm_args *a,
                                        const uint32_t sig[3], int only, uint32_t g) {
    for (int q = 0; q < s->n; q++) {
        if (q == s->me || (only >= 0 && q != only)) continue;
        uint32_t theirs[3];
        for (int k = 0; k < 3; k++)
            theirs[k] = atomic_load_explicit(&ctl(s, q)->sig[g % SIGRING][k], memory_order_relaxed);
        if (memcmp(theirs, sig, sizeof theirs) != 0) {
            char mine[160], other[160];
            describe_sig(sig, mine, sizeof mine);
            describe_sig(theirs, other, sizeof other);
            return fg__shm_group_fail(
                c, s, a, FG_EMISMATCH,
                "rank %d is in %s while rank %d is in %s: all ranks must call the "
                "same collectives in the same order (FULGUR_COMM_CHECK=1 tells more)",
                q, other, s->me, mine);
        }
    }
    return FG_OK;
}

/* ready of chunk g: publish, wait for the peers (all, or `only`), and on the
 * first chunk of a call compare signatures. */
static FG_MUST_USE fg_status chunk_wait_ready_at(fg_comm *c, shm_state *s, const fg__comm_args *a,
                                                 const uint32_t sig[3], bool first, int only,
                                                 uint32_t g) {
    FG_TRY(fg__shm_wait_all(c, s, a, W_READY, g + 1, only));
    if (first) FG_TRY(check_sigs(c, s, a, sig, only, g));
    return FG_OK;
}

static FG_MUST_USE fg_status chunk_wait_ready(fg_comm *c, shm_state *s, const fg__comm_args *a,
                                              const uint32_t sig[3], bool first, int only) {
    return chunk_wait_ready_at(c, s, a, sig, first, only, s->g);
}

static FG_MUST_USE fg_status chunk_ready(fg_comm *c, shm_state *s, const fg__comm_args *a,
                                         const uint32_t sig[3], bool first, int only) {
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

/* Has every peer posted word `which` >= target? (No waiting.) */
static bool peers_reached(shm_state *s, int which, uint32_t target) {
    for (int q = 0; q < s->n; q++)
        if (q != s->me &&
            !reached(atomic_load_explicit(&ctl(s, q)->w[which], memory_order_acquire), target))
            return false;
    return true;
}

/* Allreduce: starts chunk g (elements [off, off+m) of the call) and copies
 * this rank's input in, all of it but its own slice, which it reduces
 * straight from its send buffer; then posts ready. */
static FG_MUST_USE fg_status copy_in(fg_comm *c, shm_state *s, const fg__comm_args *a,
                                     const uint32_t sig[3], uint32_t g, int64_t off, int64_t m) {
    size_t esz = fg_dtype_size(a->dt);
    FG_TRY(chunk_begin_at(c, s, a, sig, g));
    int64_t lo, hi;
    slice_of(m, s->n, s->me, esz, &lo, &hi);
    char *base = slot(s, s->me, g);
    const char *in = (const char *)a->send + off * (int64_t)esz;
    memcpy(base, in, (size_t)lo * esz);
    memcpy(base + hi * (int64_t)esz, in + hi * (int64_t)esz, (size_t)(m - hi) * esz);
    post(s, W_READY, g + 1);
    return FG_OK;
}

fg_status fg__shm_allreduce(fg_comm *c, const fg__comm_args *a) {
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
    /* Three steps per chunk, run as soon as each can: reduce this rank's
     * slice (the peers wait for it), copy a chunk in up to K chunks ahead
     * (the peers wait for it), copy the peers' slices out (only this rank
     * waits for that). A rank whose peer is late, or off its core on a busy
     * machine, keeps working instead of waiting, and a peer that gets its
     * core back finds several chunks to reduce. With nothing to do, it waits
     * for the oldest step it needs. */
    int64_t per = chunk_elems(s, esz, 1);
    uint32_t g0 = s->g, nch = (uint32_t)((a->count + per - 1) / per);
    uint32_t ci = 0, rd = 0, co = 0; /* chunks copied in, reduced, copied out */
    while (co < nch) {
        bool moved = false;
        if (rd < ci && peers_reached(s, W_READY, g0 + rd + 1)) {
            if (rd == 0) FG_TRY_GOTO(check_sigs(c, s, a, sig, -1, g0), st, out);
            uint32_t g = g0 + rd;
            int64_t off = (int64_t)rd * per, m = FG_MIN(per, a->count - off), lo, hi;
            slice_of(m, s->n, s->me, esz, &lo, &hi);
            for (int q = 0; q < s->n; q++) sp[q] = slot(s, q, g) + lo * (int64_t)esz;
            sp[s->me] = send + (off + lo) * (int64_t)esz;
            char *mine = slot(s, s->me, g) + lo * (int64_t)esz;
            char *out_ = recv + (off + lo) * (int64_t)esz;
            fg__reduce(a->dt, a->rop, mine, nt ? NULL : out_, sp, s->n, hi - lo, s->n);
            post(s, W_MID, g + 1);
            if (nt) fg__copy(out_, mine, (size_t)(hi - lo) * esz, true);
            rd++;
            moved = true;
        }
        if (ci < nch && ci < co + NSLOTS && peers_reached(s, W_DONE, g0 + ci - NSLOTS + 1)) {
            int64_t off = (int64_t)ci * per;
            FG_TRY_GOTO(copy_in(c, s, a, sig, g0 + ci, off, FG_MIN(per, a->count - off)), st, out);
            ci++;
            moved = true;
        }
        if (co < rd && peers_reached(s, W_MID, g0 + co + 1)) {
            uint32_t g = g0 + co;
            int64_t off = (int64_t)co * per, m = FG_MIN(per, a->count - off), lo, hi;
            for (int k = 1; k < s->n; k++) {
                int q = (s->me + k) % s->n; /* start at the next rank: spread the readers */
                slice_of(m, s->n, q, esz, &lo, &hi);
                fg__copy(recv + (off + lo) * (int64_t)esz, slot(s, q, g) + lo * (int64_t)esz,
                         (size_t)(hi - lo) * esz, nt);
            }
            post(s, W_DONE, g + 1);
            co++;
            moved = true;
        }
        if (moved) continue;
        if (co < rd) FG_TRY_GOTO(fg__shm_wait_all(c, s, a, W_MID, g0 + co + 1, -1), st, out);
        else if (rd < ci) FG_TRY_GOTO(fg__shm_wait_all(c, s, a, W_READY, g0 + rd + 1, -1), st, out);
        else FG_TRY_GOTO(fg__shm_wait_all(c, s, a, W_DONE, g0 + ci - NSLOTS + 1, -1), st, out);
    }
    s->g = g0 + nch;
out:
    if (sp != srcs) fg_free(sp);
    return st;
}

fg_status fg__shm_reduce(fg_comm *c, const fg__comm_args *a) {
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
                FG_TRY_GOTO(fg__shm_wait_all(c, s, a, W_MID, s->g + 1, q), st, out);
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

fg_status fg__shm_reduce_scatter(fg_comm *c, const fg__comm_args *a) {
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
            memcpy(mine + (size_t)b * (size_t)per * esz,
                   send + ((int64_t)b * rc + off) * (int64_t)esz, (size_t)m * esz);
        FG_TRY_GOTO(chunk_ready(c, s, a, sig, off == 0, -1), st, out);
        for (int q = 0; q < s->n; q++) sp[q] = slot(s, q, s->g) + (size_t)s->me * (size_t)per * esz;
        fg__reduce(a->dt, a->rop, recv + off * (int64_t)esz, NULL, sp, s->n, m, s->n);
        chunk_end(s);
    }
out:
    if (sp != srcs) fg_free(sp);
    return st;
}

/* allgather and allgatherv: rank q's piece of counts[q] elements goes to
 * recv + displs[q] (counts NULL: a->count each, packed in rank order). */
static FG_MUST_USE fg_status gatherv(fg_comm *c, const fg__comm_args *a, const int64_t *counts,
                                     const int64_t *displs) {
    shm_state *s = c->impl;
    size_t esz = fg_dtype_size(a->dt);
    const char *send = a->send;
    char *recv = a->recv;
    uint32_t sig[3];
    sig_of(a, s->n, sig);
#define CNT(q) (counts ? counts[q] : a->count)
#define DSP(q) (displs ? displs[q] : (int64_t)(q)*a->count)
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

fg_status fg__shm_allgather(fg_comm *c, const fg__comm_args *a) {
    return gatherv(c, a, NULL, NULL);
}

fg_status fg__shm_allgatherv(fg_comm *c, const fg__comm_args *a) {
    return gatherv(c, a, a->counts, a->displs);
}

fg_status fg__shm_broadcast(fg_comm *c, const fg__comm_args *a) {
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

fg_status fg__shm_barrier(fg_comm *c, const fg__comm_args *a) {
    shm_state *s = c->impl;
    uint32_t sig[3];
    sig_of(a, s->n, sig);
    FG_TRY(chunk_begin(c, s, a, sig));
    FG_TRY(chunk_ready(c, s, a, sig, true, -1));
    chunk_end(s);
    return FG_OK;
}

fg_status fg__shm_alltoall(fg_comm *c, const fg__comm_args *a) {
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
            memcpy(mine + (size_t)b * (size_t)per * esz,
                   send + ((int64_t)b * cnt + off) * (int64_t)esz, (size_t)m * esz);
        FG_TRY(chunk_ready(c, s, a, sig, off == 0, -1));
        for (int q = 0; q < s->n; q++)
            memcpy(recv + ((int64_t)q * cnt + off) * (int64_t)esz,
                   slot(s, q, s->g) + (size_t)s->me * (size_t)per * esz, (size_t)m * esz);
        chunk_end(s);
    }
    return FG_OK;
}

/* ------------------------------------------------------- point to point */

fg_status fg__shm_send(fg_comm *c, const fg__comm_args *a) {
    shm_state *s = c->impl;
    int peer = a->root;
    shm_chan *ch = chan(s, s->me, peer);
    size_t esz = fg_dtype_size(a->dt), total = (size_t)a->count * esz, off = 0;
    size_t cap = s->p2p_slot - P2P_HDR;
    uint32_t head = atomic_load_explicit(&ch->head, memory_order_relaxed);
    do {
        /* a slot is free once the receiver consumed the piece two back */
        FG_TRY(fg__shm_wait_word(c, s, a, peer, &ch->tail, &ch->sleep_tail, head - 1, "receive"));
        char *sl = chan_slot(s, ch, head);
        size_t k = total - off < cap ? total - off : cap;
        p2p_piece ph = {
            .count = a->count, .dt = (int32_t)a->dt, .bytes = (uint32_t)k, .first = off == 0};
        memcpy(sl, &ph, sizeof ph);
        memcpy(sl + P2P_HDR, (const char *)a->send + off, k);
        off += k;
        head++;
        post_word(&ch->head, &ch->sleep_head, head);
    } while (off < total);
    return FG_OK;
}

fg_status fg__shm_recv(fg_comm *c, const fg__comm_args *a) {
    shm_state *s = c->impl;
    int peer = a->root;
    shm_chan *ch = chan(s, peer, s->me);
    size_t esz = fg_dtype_size(a->dt), total = (size_t)a->count * esz, off = 0;
    uint32_t tail = atomic_load_explicit(&ch->tail, memory_order_relaxed);
    do {
        FG_TRY(fg__shm_wait_word(c, s, a, peer, &ch->head, &ch->sleep_head, tail + 1, "send"));
        const char *sl = chan_slot(s, ch, tail);
        p2p_piece ph;
        memcpy(&ph, sl, sizeof ph);
        if (off == 0 && (!ph.first || ph.count != a->count || ph.dt != (int32_t)a->dt))
            return fg__shm_group_fail(
                c, s, a, FG_EMISMATCH,
                "rank %d sent %lld elements of %s but this rank (%d) receives %lld "
                "of %s",
                peer, (long long)ph.count, fg_dtype_name((fg_dtype)ph.dt), s->me,
                (long long)a->count, fg_dtype_name(a->dt));
        if (ph.bytes > total - off || ph.bytes > s->p2p_slot - P2P_HDR)
            return fg__shm_group_fail(c, s, a, FG_EINTERNAL, "corrupt message from rank %d", peer);
        memcpy((char *)a->recv + off, sl + P2P_HDR, ph.bytes);
        off += ph.bytes;
        tail++;
        post_word(&ch->tail, &ch->sleep_tail, tail);
    } while (off < total);
    return FG_OK;
}
