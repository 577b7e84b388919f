/* Collectives on buffers in device memory, for backends that read host
 * memory only (shm, MPI: fg_comm_reads_device): the buffer goes through one
 * bounded page-locked host buffer, a chunk at a time, with the copies on
 * the device's comm stream (counted apart, as comm_*_bytes). A buffer on
 * the host, or a backend that reads the device, is passed straight on.
 * Each rank copies out only what the collective reads from it and back
 * only what it writes there: an allreduce both ways, a broadcast out on
 * the root and in elsewhere, a reduce out everywhere and in on the root,
 * an all-gather this rank's part out and the others' in. */
#include <string.h>

#include "strategy_impl.h"

#define STAGE_BYTES ((size_t)4 << 20)

static bool direct(fg_comm *c, fg_dev *dev) {
    return !dev || fg_dev_host_accessible(dev) || fg_comm_reads_device(c, fg_dev_kind(dev));
}

/* A group of one (stage 3 on one rank): an in-place collective leaves the
 * buffer as it is, so device memory is not staged for it. */
static bool alone(fg_comm *c) { return fg_comm_size(c) == 1; }

/* op(chunk in host memory, n elements) for each chunk of p (n elements). */
typedef FG_MUST_USE fg_status (*chunk_fn)(fg_comm *c, void *host, int64_t n, fg_dtype dt,
                                          const void *arg);

static FG_MUST_USE fg_status staged(fg_comm *c, fg_dev *dev, void *p, int64_t n, fg_dtype dt,
                                    chunk_fn fn, const void *arg, bool copy_out, bool copy_in) {
    size_t es = fg_dtype_size(dt);
    int64_t per = (int64_t)(STAGE_BYTES / es);
    void *stage = fg_dev_host_alloc(dev, (size_t)FG_MIN(n, per) * es);
    if (!stage && n) return fg_error_wrap(fg_last_status(), "host staging of a collective");
    fg_stream *s = fg_dev_stream(dev, FG_STREAM_COMM);
    fg_status st = FG_OK;
    for (int64_t at = 0; at < n && st == FG_OK; at += per) {
        int64_t k = FG_MIN(per, n - at);
        char *d = (char *)p + (size_t)at * es;
        if (copy_out) st = fg_dev_copy_d2h_async(dev, stage, d, (size_t)k * es, s);
        if (st == FG_OK) st = fg_stream_synchronize(s);
        if (st == FG_OK) st = fn(c, stage, k, dt, arg);
        if (st == FG_OK && copy_in) st = fg_dev_copy_h2d_async(dev, d, stage, (size_t)k * es, s);
        if (st == FG_OK) st = fg_stream_synchronize(s);
    }
    fg_dev_host_free(dev, stage);
    return st;
}

static FG_MUST_USE fg_status do_allreduce(fg_comm *c, void *host, int64_t n, fg_dtype dt,
                                          const void *arg) {
    return fg_comm_allreduce(c, host, host, n, dt, *(const fg_reduce_op *)arg);
}

static FG_MUST_USE fg_status do_broadcast(fg_comm *c, void *host, int64_t n, fg_dtype dt,
                                          const void *arg) {
    return fg_comm_broadcast(c, host, host, n, dt, *(const int *)arg);
}

struct reduce_arg {
    fg_reduce_op op;
    int root;
};

static FG_MUST_USE fg_status do_reduce(fg_comm *c, void *host, int64_t n, fg_dtype dt,
                                       const void *arg) {
    const struct reduce_arg *a = arg;
    return fg_comm_reduce(c, host, host, n, dt, a->op, a->root);
}

static FG_MUST_USE fg_status do_send(fg_comm *c, void *host, int64_t n, fg_dtype dt,
                                     const void *arg) {
    return fg_comm_send(c, host, n, dt, *(const int *)arg);
}

static FG_MUST_USE fg_status do_recv(fg_comm *c, void *host, int64_t n, fg_dtype dt,
                                     const void *arg) {
    return fg_comm_recv(c, host, n, dt, *(const int *)arg);
}

fg_status fg__staged_allreduce(fg_comm *c, fg_dev *dev, void *p, int64_t n, fg_dtype dt,
                               fg_reduce_op op) {
    if (!direct(c, dev) && alone(c)) return FG_OK;
    if (direct(c, dev)) return fg_comm_allreduce(c, p, p, n, dt, op);
    return staged(c, dev, p, n, dt, do_allreduce, &op, true, true);
}

fg_status fg__staged_broadcast(fg_comm *c, fg_dev *dev, void *p, int64_t n, fg_dtype dt, int root) {
    if (!direct(c, dev) && alone(c)) return FG_OK;
    if (direct(c, dev)) return fg_comm_broadcast(c, p, p, n, dt, root);
    bool me = fg_comm_rank(c) == root;
    return staged(c, dev, p, n, dt, do_broadcast, &root, me, !me);
}

fg_status fg__staged_reduce(fg_comm *c, fg_dev *dev, void *p, int64_t n, fg_dtype dt,
                            fg_reduce_op op, int root) {
    if (!direct(c, dev) && alone(c)) return FG_OK;
    if (direct(c, dev)) return fg_comm_reduce(c, p, p, n, dt, op, root);
    struct reduce_arg a = {op, root};
    return staged(c, dev, p, n, dt, do_reduce, &a, true, fg_comm_rank(c) == root);
}

/* Point to point in messages of at most STAGE_BYTES, on both sides whatever
 * memory each holds, so that a sender on a device and a receiver on the
 * host (rank 0 gathering a checkpoint) agree on the messages. */
fg_status fg__staged_send(fg_comm *c, fg_dev *dev, const void *p, int64_t n, fg_dtype dt,
                          int peer) {
    if (!direct(c, dev)) return staged(c, dev, (void *)p, n, dt, do_send, &peer, true, false);
    size_t es = fg_dtype_size(dt);
    int64_t per = (int64_t)(STAGE_BYTES / es);
    for (int64_t at = 0; at < n; at += per)
        FG_TRY(fg_comm_send(c, (const char *)p + (size_t)at * es, FG_MIN(per, n - at), dt, peer));
    return FG_OK;
}

fg_status fg__staged_recv(fg_comm *c, fg_dev *dev, void *p, int64_t n, fg_dtype dt, int peer) {
    if (!direct(c, dev)) return staged(c, dev, p, n, dt, do_recv, &peer, false, true);
    size_t es = fg_dtype_size(dt);
    int64_t per = (int64_t)(STAGE_BYTES / es);
    for (int64_t at = 0; at < n; at += per)
        FG_TRY(fg_comm_recv(c, (char *)p + (size_t)at * es, FG_MIN(per, n - at), dt, peer));
    return FG_OK;
}

fg_status fg__staged_allgatherv(fg_comm *c, fg_dev *dev, void *p, const int64_t *counts,
                                const int64_t *displs, fg_dtype dt) {
    int world = fg_comm_size(c), rank = fg_comm_rank(c);
    size_t es = fg_dtype_size(dt);
    if (!direct(c, dev) && alone(c)) return FG_OK;
    if (direct(c, dev))
        return fg_comm_allgatherv(c, (char *)p + (size_t)displs[rank] * es, counts[rank], p, counts,
                                  displs, dt);
    /* pieces of at most `per` elements of each rank's part, packed in rank
     * order in the host buffer */
    int64_t longest = 0;
    for (int q = 0; q < world; q++) longest = FG_MAX(longest, counts[q]);
    int64_t per = FG_MAX(1, (int64_t)(STAGE_BYTES / es) / world);
    int64_t *cnt = fg_calloc(2 * (size_t)world, sizeof *cnt), *dsp = cnt + world;
    char *stage = cnt ? fg_dev_host_alloc(dev, (size_t)(FG_MIN(per, longest) * world) * es) : NULL;
    if (!cnt || (!stage && longest)) {
        fg_free(cnt);
        return fg_error_wrap(FG_ENOMEM, "host staging of an all-gather");
    }
    fg_stream *s = fg_dev_stream(dev, FG_STREAM_COMM);
    fg_status st = FG_OK;
    for (int64_t off = 0; off < longest && st == FG_OK; off += per) {
        int64_t at = 0;
        for (int q = 0; q < world; q++) {
            cnt[q] = FG_MAX(0, FG_MIN(per, counts[q] - off));
            dsp[q] = at;
            at += cnt[q];
        }
        char *mine = stage + (size_t)dsp[rank] * es;
        char *src = (char *)p + (size_t)(displs[rank] + off) * es;
        if (cnt[rank]) st = fg_dev_copy_d2h_async(dev, mine, src, (size_t)cnt[rank] * es, s);
        if (st == FG_OK) st = fg_stream_synchronize(s);
        if (st == FG_OK) st = fg_comm_allgatherv(c, mine, cnt[rank], stage, cnt, dsp, dt);
        for (int q = 0; q < world && st == FG_OK; q++)
            if (q != rank && cnt[q])
                st = fg_dev_copy_h2d_async(dev, (char *)p + (size_t)(displs[q] + off) * es,
                                           stage + (size_t)dsp[q] * es, (size_t)cnt[q] * es, s);
        if (st == FG_OK) st = fg_stream_synchronize(s);
    }
    fg_dev_host_free(dev, stage);
    fg_free(cnt);
    return st;
}

fg_status fg__stage_out(fg_dev *dev, void *host, const void *p, size_t bytes) {
    if (!dev || fg_dev_host_accessible(dev)) {
        if (host != p) memcpy(host, p, bytes);
        return FG_OK;
    }
    fg_stream *s = fg_dev_stream(dev, FG_STREAM_COMM);
    FG_TRY(fg_dev_copy_d2h_async(dev, host, p, bytes, s));
    return fg_stream_synchronize(s);
}

fg_status fg__stage_in(fg_dev *dev, void *p, const void *host, size_t bytes) {
    if (!dev || fg_dev_host_accessible(dev)) {
        if (host != p) memcpy(p, host, bytes);
        return FG_OK;
    }
    fg_stream *s = fg_dev_stream(dev, FG_STREAM_COMM);
    FG_TRY(fg_dev_copy_h2d_async(dev, p, host, bytes, s));
    return fg_stream_synchronize(s);
}
