/* Bagua's decentralized algorithms.
 *
 * decentralized (D-PSGD): at every communication_interval-th synchronising
 * backward the weights x the gradient is computed at are averaged with the
 * peers' (all: every rank, an allreduce that runs while backward does;
 * shift_one: one peer, Bagua's pairing by communication count), and the
 * average replaces x before the optimizer step, which then applies this
 * rank's own gradient: x' = avg(x) - lr g(x). Under the hierarchical
 * pattern the node's average is exchanged between the nodes' first ranks
 * and broadcast inside the node.
 *
 * low_precision_decentralized (Tang et al. 2018, as Bagua's
 * DecentralizedLowPrecisionSynchronous, ring peers): each rank keeps w (its
 * weights as its neighbours know them) and copies l, r of its left and
 * right neighbours' w, all equal to the start weights. After optimizer step
 * k (when k % communication_interval == 0) with weights x:
 *   d = x + l / 3 + r / 3 - 5 w / 3   (= (l + w + r) / 3 + (x - w) - w)
 *   D = q8(d), one chunk per ddp bucket, sent to both neighbours;
 *   l += deq(D from left), r += deq(D from right), w += deq(D), x = w.
 * So x moves to the neighbours' average plus this rank's own progress, and
 * l on rank i stays bitwise rank i-1's w (both add the same dequantised
 * floats to the same start). */
#include <string.h>

#include "bagua_impl.h"

int fg__bagua_shift_one_peer(int rank, int size, int64_t k) {
    int64_t h = size / 2, r = rank;
    if (r < h) return (int)((k + r) % ((size + 1) / 2) + h);
    int64_t p = (r - h - k) % h;
    return (int)(p < 0 ? p + h : p);
}

/* the group the peers are found in: everyone, or the nodes' first ranks */
static fg_comm *peer_comm(const fg__bagua_state *st) { return st->hier ? st->inter : st->s->comm; }

fg_status fg__decent_setup(fg__bagua_state *st) {
    size_t bytes = sizeof(float) * (size_t)st->n;
    const float *x = fg_tensor_data(fg_module_flat_params(st->s->model));
    int groups = st->hier ? -1 : fg_comm_size(st->s->comm);
    if (st->hier) { /* the number of nodes, known on every rank */
        int leaders = st->inter ? fg_comm_size(st->inter) : 0;
        FG_TRY(fg_comm_allreduce(st->s->comm, &leaders, &leaders, 1, FG_I32, FG_REDUCE_OP_MAX));
        groups = leaders;
    }
    if (st->o.algorithm == FG_BAGUA_DECENTRALIZED &&
        st->o.peer_selection_mode == FG_BAGUA_PEERS_SHIFT_ONE && groups % 2)
        return fg_error(FG_EINVAL,
                        "bagua decentralized: peer_selection_mode shift_one pairs the %s, and "
                        "there are %d of them: it needs an even number (or use "
                        "peer_selection_mode all)",
                        st->hier ? "nodes (hierarchical)" : "ranks", groups);
    st->peer = fg_alloc(bytes);
    st->diff = fg_alloc(bytes);
    if (!st->peer || !st->diff) return fg_error_wrap(FG_ENOMEM, "bagua setup");
    if (st->o.algorithm != FG_BAGUA_LOW_PRECISION_DECENTRALIZED) return FG_OK;
    st->w = fg_alloc(bytes);
    st->left = fg_alloc(bytes);
    st->right = fg_alloc(bytes);
    if (!st->w || !st->left || !st->right) return fg_error_wrap(FG_ENOMEM, "bagua setup");
    FG_TRY(fg__stage_out(st->dev, st->w, x, bytes));
    memcpy(st->left, st->w, bytes);
    memcpy(st->right, st->w, bytes);
    return FG_OK;
}

/* shift_one over c: buf becomes (peer's + own) / 2 */
static FG_MUST_USE fg_status shift_one(fg__bagua_state *st, fg_comm *c, float *buf) {
    int r = fg_comm_rank(c), q = fg_comm_size(c);
    if (q < 2) return FG_OK;
    int peer = fg__bagua_shift_one_peer(r, q, st->comm_steps);
    int64_t n = st->n;
    fg__bagua_count(st, (uint64_t)n * sizeof(float));
    if (r < peer) {
        FG_TRY(fg_comm_send(c, buf, n, FG_F32, peer));
        FG_TRY(fg_comm_recv(c, st->diff, n, FG_F32, peer));
    } else {
        FG_TRY(fg_comm_recv(c, st->diff, n, FG_F32, peer));
        FG_TRY(fg_comm_send(c, buf, n, FG_F32, peer));
    }
    for (int64_t i = 0; i < n; i++) buf[i] = (st->diff[i] + buf[i]) * 0.5f;
    return FG_OK;
}

static FG_MUST_USE fg_status exchange(fg__bagua_state *st, float *buf) {
    fg_comm *c = peer_comm(st);
    if (!c) return FG_OK;
    if (st->o.peer_selection_mode == FG_BAGUA_PEERS_SHIFT_ONE) return shift_one(st, c, buf);
    if (fg_comm_size(c) < 2) return FG_OK;
    fg__bagua_count(st, (uint64_t)st->n * sizeof(float));
    return fg_comm_allreduce(c, buf, buf, st->n, FG_F32, FG_REDUCE_OP_AVG);
}

fg_status fg__decent_backward(fg__bagua_state *st, fg_tensor *loss) {
    if (st->steps % st->o.communication_interval) return fg_backward(loss);
    float *x = fg_tensor_data(fg_module_flat_params(st->s->model));
    size_t bytes = sizeof(float) * (size_t)st->n;
    fg_status rc;
    if (!st->hier && st->o.peer_selection_mode == FG_BAGUA_PEERS_ALL) {
        /* the weights do not change during backward: average them meanwhile */
        fg__bagua_count(st, bytes);
        const float *send = x; /* on a device: its host copy */
        if (st->dev) {
            FG_TRY(fg__stage_out(st->dev, st->xh, x, bytes));
            send = st->xh;
        }
        FG_TRY(fg_comm_iallreduce(st->s->comm, send, st->peer, st->n, FG_F32, FG_REDUCE_OP_AVG,
                                  &st->req));
        rc = fg_backward(loss);
        fg_status ws = fg_comm_wait(st->req);
        st->req = NULL;
        if (rc != FG_OK) return rc;
        if (ws != FG_OK) return fg_error_wrap(ws, "bagua decentralized: averaging the weights");
    } else {
        FG_TRY(fg_backward(loss));
        FG_TRY(fg__stage_out(st->dev, st->peer, x, bytes));
        bool several = st->hier && fg_comm_size(st->intra) > 1;
        if (several) {
            fg__bagua_count(st, bytes);
            FG_TRY(
                fg_comm_reduce(st->intra, st->peer, st->peer, st->n, FG_F32, FG_REDUCE_OP_AVG, 0));
        }
        rc = exchange(st, st->peer);
        if (rc != FG_OK) return fg_error_wrap(rc, "bagua decentralized: exchanging the weights");
        if (several) {
            fg__bagua_count(st, bytes);
            FG_TRY(fg_comm_broadcast(st->intra, st->peer, st->peer, st->n, FG_F32, 0));
        }
    }
    FG_TRY(fg__stage_in(st->dev, x, st->peer, bytes));
    st->comm_steps++;
    return FG_OK;
}

/* ------------------------------------------------- low precision, ring */

/* Sends rec (bytes) to `to` and receives into in from `from`; even ranks
 * send first, odd ones receive first, so that blocking sends of large
 * messages cannot all wait on each other around the ring. */
static FG_MUST_USE fg_status ring_pass(fg_comm *c, const uint8_t *rec, uint8_t *in, int64_t bytes,
                                       int to, int from) {
    if (fg_comm_rank(c) % 2 == 0) {
        FG_TRY(fg_comm_send(c, rec, bytes, FG_U8, to));
        return fg_comm_recv(c, in, bytes, FG_U8, from);
    }
    FG_TRY(fg_comm_recv(c, in, bytes, FG_U8, from));
    return fg_comm_send(c, rec, bytes, FG_U8, to);
}

static FG_MUST_USE fg_status lpd_ring(fg__bagua_state *st, fg_comm *c, float *x) {
    int p = fg_comm_size(c), r = fg_comm_rank(c);
    if (p < 2) return FG_OK;
    int64_t n = st->n;
    fg__ddp_reducer *red = st->s->reducer;
    int nb = fg__ddp_reducer_num_buckets(red);
    size_t total = (size_t)n + (size_t)nb * FG_Q8_HEADER;
    FG_TRY(fg__q8_reserve(st, 3 * total, 0));
    uint8_t *own = st->rec, *fl = own + total, *fr = fl + total;
    float *d = st->diff, *w = st->w, *l = st->left, *rt = st->right;
    const float third = 1.0f / 3.0f, five_thirds = -5.0f / 3.0f;
    for (int64_t i = 0; i < n; i++) {
        float t = x[i] + l[i] * third;
        t = t + rt[i] * third;
        d[i] = t + w[i] * five_thirds;
    }
    size_t at = 0;
    for (int b = 0; b < nb; b++) {
        int64_t lo, hi;
        fg__ddp_reducer_bucket_range(red, b, &lo, &hi);
        fg__q8_compress(d + lo, hi - lo, hi - lo, own + at);
        at += FG_Q8_HEADER + (size_t)(hi - lo);
    }
    int left = (r + p - 1) % p, right = (r + 1) % p;
    fg__bagua_count(st, 2 * (uint64_t)total);
    FG_TRY(ring_pass(c, own, fl, (int64_t)total, right, left));
    FG_TRY(ring_pass(c, own, fr, (int64_t)total, left, right));
    at = 0;
    for (int b = 0; b < nb; b++) {
        int64_t lo, hi;
        fg__ddp_reducer_bucket_range(red, b, &lo, &hi);
        int64_t m = hi - lo;
        fg__q8_decompress(fl + at, m, d + lo);
        for (int64_t i = lo; i < hi; i++) l[i] += d[i];
        fg__q8_decompress(fr + at, m, d + lo);
        for (int64_t i = lo; i < hi; i++) rt[i] += d[i];
        fg__q8_decompress(own + at, m, d + lo);
        for (int64_t i = lo; i < hi; i++) x[i] = w[i] = d[i] + w[i];
        at += FG_Q8_HEADER + (size_t)m;
    }
    return FG_OK;
}

fg_status fg__lpd_after_step(fg__bagua_state *st) {
    if ((st->opt_steps - 1) % st->o.communication_interval) return FG_OK;
    float *dx = fg_tensor_data(fg_module_flat_params(st->s->model));
    bool several = st->hier && fg_comm_size(st->intra) > 1;
    size_t bytes = sizeof(float) * (size_t)st->n;
    float *x = st->dev ? st->xh : dx; /* on a device: its host copy, out and back in */
    fg_status rc = st->dev ? fg__stage_out(st->dev, x, dx, bytes) : FG_OK;
    if (several) {
        fg__bagua_count(st, bytes);
        rc = fg_comm_reduce(st->intra, x, x, st->n, FG_F32, FG_REDUCE_OP_AVG, 0);
    }
    fg_comm *c = peer_comm(st);
    if (rc == FG_OK && c) rc = lpd_ring(st, c, x);
    if (rc == FG_OK && several) {
        fg__bagua_count(st, bytes);
        rc = fg_comm_broadcast(st->intra, x, x, st->n, FG_F32, 0);
    }
    if (rc == FG_OK && st->dev) rc = fg__stage_in(st->dev, dx, x, bytes);
    if (rc != FG_OK)
        return fg_error_wrap(rc, "bagua low_precision_decentralized: after optimizer step %lld",
                             (long long)st->opt_steps);
    return FG_OK;
}
