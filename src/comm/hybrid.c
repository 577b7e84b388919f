/* The hybrid backend: shm among the ranks of a node, Open MPI among nodes.
 *
 * A hybrid communicator holds three others: `base`, the whole group on the
 * flat backend (mpi under mpirun; shm when the nodes are simulated on one
 * machine through the environment, as the tests do); `intra`, the ranks of
 * this node on shm; and `inter`, the ranks with this rank's local index on
 * every node (one per node, ordered by node), split from base.
 *
 *   allreduce       reduce-scatter inside the node, allreduce of each shard
 *                   across nodes (local rank l carries shard l; itself an
 *                   all-to-all with a local sum, then an all-gather),
 *                   all-gather inside the node; from two chunks
 *                   (2 MiB by default) as a pipeline of chunks whose legs overlap (see
 *                   pipelined()); small buffers: allreduce inside the node,
 *                   then across nodes (every local rank at once)
 *   reduce_scatter  inside the node, then across nodes as an all-to-all and
 *                   a sum in node order (blocks permuted so that local rank
 *                   l holds the blocks of every node's l-th rank)
 *   allgather       across nodes, then inside the node (permuted back)
 *   broadcast       across nodes among the root's local index, then inside
 *                   each node from it
 *   the rest        (allgatherv, reduce, barrier, alltoall, send, recv) on base
 *
 * Reductions: sums are summed inside the node first, so a floating-point
 * sum associates differently from the flat backends' (bitwise equal where
 * the partial sums are exact: integers, min, max, exact data); the result is
 * still the same on every rank and from run to run. avg is a sum divided by
 * the group size once at the end. bf16 and f16 are summed in f32 inside the
 * node, and cross between nodes as bf16 or f16 (half the bytes of f32 on the
 * link, which is what a user of fp16 compression asks for): in the scatter
 * path each node's partial sum rounds to the half once before the exchange
 * and the sum of the nodes' once after, so an allreduce of halves rounds
 * twice where the flat backends round once (the same where the partial
 * sums are exact); avg then rounds once more after the division.
 *
 * Hierarchy needs every node to hold the same number of ranks, more than
 * one node and more than one rank per node; otherwise (and in sub-groups
 * made by fg_comm_split) every operation runs on base. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_impl.h"
#include "hybrid_pipe.h"

typedef struct hybrid_state {
    fg_comm *base, *intra, *inter;
    bool flat;           /* everything on base */
    int nodes, per;      /* N nodes x L ranks per node */
    int *wr;             /* world rank of (node k, local l) at [k * per + l] */
    int64_t scatter_min; /* allreduce of fewer bytes skips the scatter */
    int64_t chunk_bytes; /* the pipeline's smallest chunk of the buffer; 0: no pipeline */
    int64_t chunks;      /* the pipeline's chunks when they are larger than that */
    void *scratch;       /* the across-nodes exchange's receive buffer */
    size_t scratch_bytes;
} hybrid_state;

/* FULGUR_HYBRID_SCATTER_BYTES: an allreduce of at least this many bytes
 * runs as reduce-scatter / allreduce / all-gather; smaller ones as two
 * allreduces (default 64 KiB). */
#define DEFAULT_SCATTER_MIN (64 << 10)

/* FULGUR_HYBRID_CHUNK_BYTES: the scatter path of an allreduce of at least
 * two chunks of this many bytes runs as a pipeline (see pipelined()), in
 * FULGUR_HYBRID_CHUNKS chunks or in chunks of this size, whichever are
 * larger; 0 turns the pipeline off. With 1 MiB and 16 chunks a 16 MiB
 * allreduce on 2 test hosts x 2 ranks at 1 Gbit/s took 140 ms against
 * 180-235 ms with the legs one after the other (the link's bound is 134
 * ms), and 64 MiB 580 ms (8 chunks: 620; docs/comm.md). */
#define DEFAULT_CHUNK_BYTES (1 << 20)
#define DEFAULT_CHUNKS 16

/* More nodes than this: the across-nodes allreduce without the all-to-all. */
#define FG_HYBRID_MAX_NODES 64

/* A level failed: the hybrid group is broken, and the other levels are
 * aborted with the reason so that ranks waiting there learn it at once
 * (rather than at the timeout). */
static FG_MUST_USE fg_status sub_fail(fg_comm *c, const fg__comm_args *a, fg_status st,
                                      const char *level) {
    char why[512];
    snprintf(why, sizeof why, "%s", fg_last_error());
    st = fg__comm_fail(c, a, st, "%s: %s", level, why);
    hybrid_state *h = c->impl;
    char reason[256];
    snprintf(reason, sizeof reason, "%s", fg_last_error());
    fg_comm *subs[3] = {h->intra, h->inter, h->base};
    for (int i = 0; i < 3; i++)
        if (subs[i]) fg_comm_abort_reason(subs[i], reason);
    fg_error(st, "%s", reason);
    return st;
}

static const char *intra_name(const fg_comm *c) {
    static _Thread_local char buf[64];
    snprintf(buf, sizeof buf, "inside node %d (shm)", c->node_rank);
    return buf;
}

static const char *inter_name(const fg_comm *c) {
    static _Thread_local char buf[64];
    snprintf(buf, sizeof buf, "across nodes, local rank %d", c->local_rank);
    return buf;
}

#define INTRA(c, a, call)                                                                          \
    do {                                                                                           \
        fg_status st_ = (call);                                                                    \
        if (st_ != FG_OK) return sub_fail(c, a, st_, intra_name(c));                               \
    } while (0)
#define INTER(c, a, call)                                                                          \
    do {                                                                                           \
        fg_status st_ = (call);                                                                    \
        if (st_ != FG_OK) return sub_fail(c, a, st_, inter_name(c));                               \
    } while (0)
#define BASE(c, a, call)                                                                           \
    do {                                                                                           \
        fg_status st_ = (call);                                                                    \
        if (st_ != FG_OK) return sub_fail(c, a, st_, "flat");                                      \
    } while (0)

static bool is_half(fg_dtype dt) { return dt == FG_BF16 || dt == FG_F16; }

static void divide(fg_dtype dt, void *buf, int64_t n, int size) {
    const void *src[1] = {buf};
    fg__reduce(dt, FG_REDUCE_OP_AVG, buf, NULL, src, 1, n, size);
}

/* ------------------------------------------------------------ allreduce */

/* Scratch of at least `bytes`, kept between calls (a communicator is used
 * by one thread at a time). */
static void *scratch(hybrid_state *h, size_t bytes) {
    if (bytes <= h->scratch_bytes) return h->scratch;
    fg_free(h->scratch);
    h->scratch = fg_alloc(bytes);
    h->scratch_bytes = h->scratch ? bytes : 0;
    return h->scratch;
}

/* Allreduce across nodes in place: a reduce-scatter as an all-to-all (every
 * node sends block q to node q, all at once, and sums the N copies of its
 * own block in node order) then an all-gather, so that each rank sends
 * (N-1)/N of the buffer twice, in both directions of its link at once.
 * (Open MPI's nonblocking reduce-scatter is a reduce to one rank and a
 * scatter: with two nodes it sent 3/4 of the buffer one way and 1/4 the
 * other, one after the other; its nonblocking allreduce of two ranks sends
 * all of it twice.) With wire != dt (f32 partial sums of a bf16 or f16
 * buffer) the blocks cross as halves: rounded to wire once, summed in f32
 * in node order and rounded once, gathered and widened back (exact). Small
 * or indivisible remainders as an allreduce of dt. */
static FG_MUST_USE fg_status inter_allreduce(fg_comm *c, const fg__comm_args *a, char *p, int64_t n,
                                             fg_dtype dt, fg_reduce_op op, fg_dtype wire) {
    hybrid_state *h = c->impl;
    size_t esz = fg_dtype_size(dt), wsz = fg_dtype_size(wire);
    int N = h->nodes, k = c->node_rank;
    int64_t b = n / N;
    if ((int64_t)esz * n < h->scatter_min || b == 0 || N > FG_HYBRID_MAX_NODES) {
        INTER(c, a, fg_comm_allreduce(h->inter, p, p, n, dt, op));
        return FG_OK;
    }
    /* the blocks on the wire: p itself, or its halves ahead of `got` */
    size_t blocks = (size_t)(N * b) * wsz;
    char *sx = scratch(h, wire != dt ? 2 * blocks : blocks);
    if (!sx) return fg__comm_fail(c, a, FG_ENOMEM, "out of memory for the exchange buffer");
    char *w = p, *got = sx;
    if (wire != dt) {
        w = sx;
        got = sx + blocks;
        fg__status_drop(fg_convert(w, wire, p, dt, N * b)); /* float to float */
    }
    char *mine = w + (size_t)(k * b) * wsz;
    INTER(c, a, fg_comm_alltoall(h->inter, w, got, b, wire));
    const void *srcs[FG_HYBRID_MAX_NODES];
    for (int q = 0; q < N; q++) srcs[q] = got + (size_t)(q * b) * wsz;
    fg__reduce(wire, op, mine, NULL, srcs, N, b, 1);
    INTER(c, a, fg_comm_allgather(h->inter, mine, w, b, wire));
    if (wire != dt) fg__status_drop(fg_convert(p, dt, w, wire, N * b)); /* float to float */
    if (n > b * N) {
        char *tail = p + (size_t)(b * N) * esz;
        INTER(c, a, fg_comm_allreduce(h->inter, tail, tail, n - b * N, dt, op));
    }
    return FG_OK;
}

/* ------------------------------------------------------------ pipeline */

/* The scatter path of allreduce_levels cut into chunks, so that its legs
 * overlap: while chunk j - 1 crosses between nodes (on a worker thread,
 * hybrid_pipe.c), the node reduce-scatters chunk j, then waits for chunk
 * j - 1 and all-gathers it. The schedule is fixed, so the ranks of a node
 * call their collectives in the same order whatever the timing. The code
 * is written for PIPE_LANES chunks on the link at once, one worker each,
 * but each lane needs an across-nodes group of its own (a second split of
 * base): two lanes measured slower than one (docs/comm.md). The worker's
 * waits on Open MPI must not spin long (the mpi backend sleeps between
 * tests after FULGUR_MPI_SPIN_US): a worker polling Open MPI takes the
 * cores that the node's legs need, which made the pipeline lose when the
 * waits spun for 100 ms.
 *
 * Every element is reduced as without the pipeline, so the results are the
 * same bits: local rank l's shard (b elements) is N blocks of bn and a tail
 * of b - N bn; chunk j takes elements [o, o + cnt) of every block of every
 * shard, staged as [l][q][cnt], so that the node's reduce-scatter leaves
 * local rank l the N pieces of its shard, which cross as in
 * inter_allreduce (all-to-all, the N copies of piece k summed in node
 * order, all-gather). The shards' tails then cross as before (an allreduce
 * of the tail in dt), and allreduce_levels does the buffer's tail. */
#define PIPE_LANES 1 /* more: give each lane its own group in pipe_lane.inter */

typedef struct pipe_ctx pipe_ctx;
typedef struct pipe_lane {
    pipe_ctx *x;
    int lane;
    fg_comm *inter;
    char *w, *got; /* wire buffers: N * cmax of wire each */
} pipe_lane;

struct pipe_ctx {
    fg_comm *c;
    char *p;             /* the buffer */
    int64_t b, bn, cmax; /* shard, block, chunk (elements of each block) */
    fg_dtype dt, wire;
    fg_reduce_op op;
    char *slot[PIPE_LANES + 1]; /* chunk j staged in slot[j % (lanes + 1)]: L N cmax of dt */
    pipe_lane lanes[PIPE_LANES];
};

/* Elements of each block in a chunk of the pipeline: 0 when it does not
 * apply (turned off, no worker thread allowed, too small for two chunks, or
 * the across-nodes leg is not the all-to-all), else the chunk's length. */
static int64_t pipe_chunk(const fg_comm *c, size_t esz, int64_t b) {
    const hybrid_state *h = c->impl;
    int N = h->nodes, L = h->per;
    if (h->chunk_bytes <= 0 || h->inter->no_async || N > FG_HYBRID_MAX_NODES ||
        (int64_t)esz * b < h->scatter_min)
        return 0;
    int64_t bn = b / N, cmin = FG_MAX(1, h->chunk_bytes / ((int64_t)esz * L * N));
    return bn >= 2 * cmin ? FG_MAX(cmin, (bn + h->chunks - 1) / h->chunks) : 0;
}

static int64_t chunk_len(const pipe_ctx *x, int64_t j) {
    return FG_MIN(x->cmax, x->bn - j * x->cmax);
}

static char *chunk_slot(const pipe_ctx *x, int64_t j) { return x->slot[j % (PIPE_LANES + 1)]; }

/* Copies chunk j from the buffer into its slot (in) or back (!in). */
static void stage(const pipe_ctx *x, int64_t j, bool in) {
    const hybrid_state *h = x->c->impl;
    size_t esz = fg_dtype_size(x->dt);
    int64_t o = j * x->cmax, cnt = chunk_len(x, j);
    char *s = chunk_slot(x, j);
    for (int l = 0; l < h->per; l++)
        for (int q = 0; q < h->nodes; q++) {
            char *at = x->p + (size_t)(l * x->b + q * x->bn + o) * esz;
            char *st = s + (size_t)((l * h->nodes + q) * cnt) * esz;
            if (in) memcpy(st, at, (size_t)cnt * esz);
            else memcpy(at, st, (size_t)cnt * esz);
        }
}

/* A lane's worker: this rank's N pieces of its i-th chunk across nodes. */
static FG_MUST_USE fg_status pipe_leg(void *arg, int64_t i) {
    pipe_lane *ln = arg;
    pipe_ctx *x = ln->x;
    fg_comm *c = x->c;
    const hybrid_state *h = c->impl;
    int N = h->nodes, k = c->node_rank;
    size_t esz = fg_dtype_size(x->dt), wsz = fg_dtype_size(x->wire);
    int64_t j = i * PIPE_LANES + ln->lane, cnt = chunk_len(x, j);
    char *mine = chunk_slot(x, j) + (size_t)(c->local_rank * N * cnt) * esz, *w = mine;
    if (x->wire != x->dt) {
        w = ln->w;
        fg__status_drop(fg_convert(w, x->wire, mine, x->dt, N * cnt)); /* float to float */
    }
    FG_TRY(fg_comm_alltoall(ln->inter, w, ln->got, cnt, x->wire));
    const void *srcs[FG_HYBRID_MAX_NODES];
    for (int q = 0; q < N; q++) srcs[q] = ln->got + (size_t)(q * cnt) * wsz;
    char *own = w + (size_t)(k * cnt) * wsz;
    fg__reduce(x->wire, x->op, own, NULL, srcs, N, cnt, 1);
    FG_TRY(fg_comm_allgather(ln->inter, own, w, cnt, x->wire));
    if (x->wire != x->dt)
        fg__status_drop(fg_convert(mine, x->dt, w, x->wire, N * cnt)); /* float to float */
    return FG_OK;
}

static FG_MUST_USE fg_status pipelined(fg_comm *c, const fg__comm_args *a, char *p, int64_t n,
                                       fg_dtype dt, fg_reduce_op op, fg_dtype wire, int64_t cmax) {
    hybrid_state *h = c->impl;
    int N = h->nodes, L = h->per, l = c->local_rank;
    size_t esz = fg_dtype_size(dt), wsz = fg_dtype_size(wire);
    pipe_ctx x = {.c = c, .p = p, .b = n / L, .cmax = cmax, .dt = dt, .wire = wire, .op = op};
    x.bn = x.b / N;
    int64_t K = (x.bn + cmax - 1) / cmax;
    size_t slot = (size_t)(L * N * cmax) * esz, wbuf = (size_t)(N * cmax) * wsz;
    char *sx = scratch(h, (PIPE_LANES + 1) * slot + 2 * PIPE_LANES * wbuf);
    if (!sx) return fg__comm_fail(c, a, FG_ENOMEM, "out of memory for the pipeline's buffers");
    for (int i = 0; i <= PIPE_LANES; i++) x.slot[i] = sx + i * slot;
    fg__hy_pipe *pp[PIPE_LANES] = {0};
    fg_status st = FG_OK;
    const char *level = "";
    for (int i = 0; i < PIPE_LANES; i++) {
        pipe_lane *ln = &x.lanes[i];
        *ln = (pipe_lane){.x = &x, .lane = i, .inter = h->inter};
        ln->w = sx + (PIPE_LANES + 1) * slot + 2 * i * wbuf;
        ln->got = ln->w + wbuf;
        if (!(pp[i] = fg__hy_pipe_start(pipe_leg, ln))) {
            st = fg_last_status();
            level = "pipeline";
        }
    }
    for (int64_t s = 0; s < K + PIPE_LANES && st == FG_OK; s++) {
        if (s < K) {
            int64_t cnt = chunk_len(&x, s);
            char *sl = chunk_slot(&x, s);
            stage(&x, s, true);
            st = fg_comm_reduce_scatter(h->intra, sl, sl + (size_t)(l * N * cnt) * esz, N * cnt, dt,
                                        op);
            if (st != FG_OK) {
                level = intra_name(c);
                break;
            }
            fg__hy_pipe_post(pp[s % PIPE_LANES], s / PIPE_LANES);
        }
        int64_t g = s - PIPE_LANES;
        if (g >= 0) {
            int64_t cnt = chunk_len(&x, g);
            char *sl = chunk_slot(&x, g);
            if ((st = fg__hy_pipe_wait(pp[g % PIPE_LANES], g / PIPE_LANES)) != FG_OK) {
                level = inter_name(c);
                break;
            }
            st = fg_comm_allgather(h->intra, sl + (size_t)(l * N * cnt) * esz, sl, N * cnt, dt);
            if (st != FG_OK) {
                level = intra_name(c);
                break;
            }
            stage(&x, g, false);
        }
    }
    /* a failure aborts the levels first, so that the workers' legs end */
    if (st != FG_OK) st = sub_fail(c, a, st, level);
    for (int i = 0; i < PIPE_LANES; i++) fg__hy_pipe_stop(pp[i]);
    if (st != FG_OK) return st;
    int64_t tn = x.b - N * x.bn;
    if (tn > 0) {
        /* the shards' tails, staged as [l][tn] (tn < N <= L N cmax) */
        char *t = x.slot[0], *tm = t + (size_t)(l * tn) * esz;
        for (int q = 0; q < L; q++)
            memcpy(t + (size_t)(q * tn) * esz, p + (size_t)(q * x.b + N * x.bn) * esz,
                   (size_t)tn * esz);
        INTRA(c, a, fg_comm_reduce_scatter(h->intra, t, tm, tn, dt, op));
        INTER(c, a, fg_comm_allreduce(h->inter, tm, tm, tn, dt, op));
        INTRA(c, a, fg_comm_allgather(h->intra, tm, t, tn, dt));
        for (int q = 0; q < L; q++)
            memcpy(p + (size_t)(q * x.b + N * x.bn) * esz, t + (size_t)(q * tn) * esz,
                   (size_t)tn * esz);
    }
    return FG_OK;
}

/* The hierarchical allreduce in place on buf (a sum, min, max or prod in a
 * dtype that needs no widening; `wire` the dtype across nodes: dt, or the
 * half that f32 buf was widened from). */
static FG_MUST_USE fg_status allreduce_levels(fg_comm *c, const fg__comm_args *a, void *buf,
                                              int64_t n, fg_dtype dt, fg_reduce_op op,
                                              fg_dtype wire) {
    hybrid_state *h = c->impl;
    size_t esz = fg_dtype_size(dt);
    int L = h->per, l = c->local_rank;
    int64_t b = n / L;
    if ((int64_t)esz * n < h->scatter_min || b == 0) {
        INTRA(c, a, fg_comm_allreduce(h->intra, buf, buf, n, dt, op));
        INTER(c, a, fg_comm_allreduce(h->inter, buf, buf, n, dt, op));
        return FG_OK;
    }
    char *p = buf;
    int64_t cmax = pipe_chunk(c, esz, b);
    if (cmax > 0) {
        FG_TRY(pipelined(c, a, p, n, dt, op, wire, cmax));
    } else {
        char *mine = p + (size_t)(l * b) * esz;
        INTRA(c, a, fg_comm_reduce_scatter(h->intra, p, mine, b, dt, op));
        FG_TRY(inter_allreduce(c, a, mine, b, dt, op, wire));
        INTRA(c, a, fg_comm_allgather(h->intra, mine, p, b, dt));
    }
    int64_t rest = n - b * L;
    if (rest) {
        char *tail = p + (size_t)(b * L) * esz;
        INTRA(c, a, fg_comm_allreduce(h->intra, tail, tail, rest, dt, op));
        INTER(c, a, fg_comm_allreduce(h->inter, tail, tail, rest, dt, op));
    }
    return FG_OK;
}

static FG_MUST_USE fg_status hy_allreduce(fg_comm *c, const fg__comm_args *a) {
    hybrid_state *h = c->impl;
    if (h->flat) {
        BASE(c, a, fg_comm_allreduce(h->base, a->send, a->recv, a->count, a->dt, a->rop));
        return FG_OK;
    }
    fg_reduce_op op = a->rop == FG_REDUCE_OP_AVG ? FG_REDUCE_OP_SUM : a->rop;
    if (is_half(a->dt)) {
        float *tmp = fg_alloc((size_t)a->count * sizeof(float));
        if (!tmp) return fg__comm_fail(c, a, FG_ENOMEM, "out of memory for the f32 copy");
        fg__status_drop(fg_convert(tmp, FG_F32, a->send, a->dt, a->count)); /* float to float */
        fg_status st = allreduce_levels(c, a, tmp, a->count, FG_F32, op, a->dt);
        if (st == FG_OK) {
            if (a->rop == FG_REDUCE_OP_AVG) divide(FG_F32, tmp, a->count, c->size);
            fg__status_drop(fg_convert(a->recv, a->dt, tmp, FG_F32, a->count)); /* float to float */
        }
        fg_free(tmp);
        return st;
    }
    if (a->send != a->recv) memcpy(a->recv, a->send, (size_t)a->count * fg_dtype_size(a->dt));
    FG_TRY(allreduce_levels(c, a, a->recv, a->count, a->dt, op, a->dt));
    if (a->rop == FG_REDUCE_OP_AVG) divide(a->dt, a->recv, a->count, c->size);
    return FG_OK;
}

/* ------------------------------------------------------- reduce_scatter */

/* Reduce-scatter across nodes: `mine` holds N blocks of m, block q for
 * node q; node k ends with the N nodes' block k summed in node order, in
 * out (which may be mine's block k). An all-to-all and a local sum, so each
 * byte crosses once, both directions at once (Open MPI's reduce-scatter is
 * a reduce and a scatter: with two nodes 3/4 of the buffer one way, then
 * 1/4 the other). */
static FG_MUST_USE fg_status inter_reduce_scatter(fg_comm *c, char *mine, char *out, int64_t m,
                                                  fg_dtype dt, fg_reduce_op op) {
    hybrid_state *h = c->impl;
    int N = h->nodes;
    size_t esz = fg_dtype_size(dt);
    if (N > FG_HYBRID_MAX_NODES || m == 0)
        return fg_comm_reduce_scatter(h->inter, mine, out, m, dt, op);
    char *got = scratch(h, (size_t)(N * m) * esz);
    if (!got) return fg_error(FG_ENOMEM, "out of memory for the exchange buffer");
    FG_TRY(fg_comm_alltoall(h->inter, mine, got, m, dt));
    const void *srcs[FG_HYBRID_MAX_NODES];
    for (int q = 0; q < N; q++) srcs[q] = got + (size_t)(q * m) * esz;
    fg__reduce(dt, op, out, NULL, srcs, N, m, 1);
    return FG_OK;
}

static FG_MUST_USE fg_status hy_reduce_scatter(fg_comm *c, const fg__comm_args *a) {
    hybrid_state *h = c->impl;
    if (h->flat) {
        BASE(c, a, fg_comm_reduce_scatter(h->base, a->send, a->recv, a->count, a->dt, a->rop));
        return FG_OK;
    }
    int N = h->nodes, L = h->per, l = c->local_rank, k = c->node_rank;
    int64_t m = a->count;
    fg_dtype dt = is_half(a->dt) ? FG_F32 : a->dt;
    size_t esz = fg_dtype_size(dt), isz = fg_dtype_size(a->dt);
    fg_reduce_op op = a->rop == FG_REDUCE_OP_AVG ? FG_REDUCE_OP_SUM : a->rop;
    /* [l][k][m]: the blocks local rank l ends with, node by node */
    char *tmp = fg_alloc((size_t)(m * c->size) * esz + 1);
    if (!tmp) return fg__comm_fail(c, a, FG_ENOMEM, "out of memory for the staging buffer");
    for (int kk = 0; kk < N; kk++)
        for (int ll = 0; ll < L; ll++) {
            const char *src = (const char *)a->send + (size_t)(h->wr[kk * L + ll] * m) * isz;
            char *dst = tmp + (size_t)((ll * N + kk) * m) * esz;
            if (dt != a->dt)
                fg__status_drop(fg_convert(dst, dt, src, a->dt, m)); /* float to float */
            else memcpy(dst, src, (size_t)m * esz);
        }
    fg_status st = FG_OK;
    char *mine = tmp + (size_t)(l * N * m) * esz;
    char *out = mine + (size_t)(k * m) * esz;
    st = fg_comm_reduce_scatter(h->intra, tmp, mine, N * m, dt, op);
    if (st != FG_OK) st = sub_fail(c, a, st, intra_name(c));
    if (st == FG_OK && (st = inter_reduce_scatter(c, mine, out, m, dt, op)) != FG_OK)
        st = sub_fail(c, a, st, inter_name(c));
    if (st == FG_OK) {
        if (a->rop == FG_REDUCE_OP_AVG) divide(dt, out, m, c->size);
        if (dt != a->dt)
            fg__status_drop(fg_convert(a->recv, a->dt, out, dt, m)); /* float to float */
        else memcpy(a->recv, out, (size_t)m * esz);
    }
    fg_free(tmp);
    return st;
}

/* ------------------------------------------------------------ allgather */

static FG_MUST_USE fg_status hy_allgather(fg_comm *c, const fg__comm_args *a) {
    hybrid_state *h = c->impl;
    if (h->flat) {
        BASE(c, a, fg_comm_allgather(h->base, a->send, a->recv, a->count, a->dt));
        return FG_OK;
    }
    int N = h->nodes, L = h->per, l = c->local_rank;
    int64_t m = a->count;
    size_t esz = fg_dtype_size(a->dt);
    /* [l][k][m], then into rank order */
    char *tmp = fg_alloc((size_t)(m * c->size) * esz + 1);
    if (!tmp) return fg__comm_fail(c, a, FG_ENOMEM, "out of memory for the staging buffer");
    char *mine = tmp + (size_t)(l * N * m) * esz;
    fg_status st = fg_comm_allgather(h->inter, a->send, mine, m, a->dt);
    if (st != FG_OK) st = sub_fail(c, a, st, inter_name(c));
    if (st == FG_OK && (st = fg_comm_allgather(h->intra, mine, tmp, N * m, a->dt)) != FG_OK)
        st = sub_fail(c, a, st, intra_name(c));
    if (st == FG_OK)
        for (int kk = 0; kk < N; kk++)
            for (int ll = 0; ll < L; ll++)
                memcpy((char *)a->recv + (size_t)(h->wr[kk * L + ll] * m) * esz,
                       tmp + (size_t)((ll * N + kk) * m) * esz, (size_t)m * esz);
    fg_free(tmp);
    return st;
}

/* ------------------------------------------------------------ broadcast */

static FG_MUST_USE fg_status hy_broadcast(fg_comm *c, const fg__comm_args *a) {
    hybrid_state *h = c->impl;
    if (h->flat) {
        BASE(c, a, fg_comm_broadcast(h->base, a->send, a->recv, a->count, a->dt, a->root));
        return FG_OK;
    }
    int rk = c->node_of[a->root], rl = 0;
    for (int i = 0; i < a->root; i++) rl += c->node_of[i] == rk;
    if (c->rank == a->root && a->send != a->recv)
        memcpy(a->recv, a->send, (size_t)a->count * fg_dtype_size(a->dt));
    if (c->local_rank == rl)
        INTER(c, a, fg_comm_broadcast(h->inter, a->recv, a->recv, a->count, a->dt, rk));
    INTRA(c, a, fg_comm_broadcast(h->intra, a->recv, a->recv, a->count, a->dt, rl));
    return FG_OK;
}

/* ------------------------------------------------------- on base alone */

static FG_MUST_USE fg_status hy_allgatherv(fg_comm *c, const fg__comm_args *a) {
    hybrid_state *h = c->impl;
    BASE(c, a,
         fg_comm_allgatherv(h->base, a->send, a->count, a->recv, a->counts, a->displs, a->dt));
    return FG_OK;
}

static FG_MUST_USE fg_status hy_reduce(fg_comm *c, const fg__comm_args *a) {
    hybrid_state *h = c->impl;
    BASE(c, a, fg_comm_reduce(h->base, a->send, a->recv, a->count, a->dt, a->rop, a->root));
    return FG_OK;
}

static FG_MUST_USE fg_status hy_barrier(fg_comm *c, const fg__comm_args *a) {
    hybrid_state *h = c->impl;
    BASE(c, a, fg_comm_barrier(h->base));
    return FG_OK;
}

static FG_MUST_USE fg_status hy_alltoall(fg_comm *c, const fg__comm_args *a) {
    hybrid_state *h = c->impl;
    BASE(c, a, fg_comm_alltoall(h->base, a->send, a->recv, a->count, a->dt));
    return FG_OK;
}

static FG_MUST_USE fg_status hy_send(fg_comm *c, const fg__comm_args *a) {
    hybrid_state *h = c->impl;
    BASE(c, a, fg_comm_send(h->base, a->send, a->count, a->dt, a->root));
    return FG_OK;
}

static FG_MUST_USE fg_status hy_recv(fg_comm *c, const fg__comm_args *a) {
    hybrid_state *h = c->impl;
    BASE(c, a, fg_comm_recv(h->base, a->recv, a->count, a->dt, a->root));
    return FG_OK;
}

/* -------------------------------------------------------- construction */

static void state_free(hybrid_state *h) {
    if (!h) return;
    fg_comm_free(h->intra);
    fg_comm_free(h->inter);
    fg_comm_free(h->base);
    fg_free(h->wr);
    fg_free(h->scratch);
    fg_free(h);
}

/* Fills the node layout of c from node_of (one entry per rank) and decides
 * whether the hierarchy applies. */
static FG_MUST_USE fg_status layout(fg_comm *c, hybrid_state *h, const int *node_of) {
    int n = c->size, nodes = 0;
    for (int i = 0; i < n; i++) nodes = FG_MAX(nodes, node_of[i] + 1);
    int *count = fg_calloc((size_t)nodes, sizeof(int));
    if (!count) return FG_ENOMEM;
    for (int i = 0; i < n; i++) {
        c->node_of[i] = node_of[i];
        count[node_of[i]]++;
    }
    bool uniform = true;
    for (int k = 0; k < nodes; k++) uniform &= count[k] == count[0];
    int per = count[0];
    c->num_nodes = nodes;
    c->node_rank = node_of[c->rank];
    c->local_size = count[c->node_rank];
    c->local_rank = 0;
    for (int i = 0; i < c->rank; i++) c->local_rank += node_of[i] == c->node_rank;
    fg_free(count);
    h->nodes = nodes;
    h->per = per;
    h->flat = !uniform || nodes < 2 || per < 2;
    if (h->flat) return FG_OK;
    h->wr = fg_alloc(sizeof(int) * (size_t)n);
    if (!h->wr) return FG_ENOMEM;
    int *seen = fg_calloc((size_t)nodes, sizeof(int));
    if (!seen) return FG_ENOMEM;
    for (int i = 0; i < n; i++) {
        int k = node_of[i];
        h->wr[k * per + seen[k]++] = i;
    }
    fg_free(seen);
    return FG_OK;
}

static FG_MUST_USE fg_status hy_init(fg_comm *c, const fg_cluster_info *info) {
    hybrid_state *h = fg_calloc(1, sizeof *h);
    if (!h) return FG_ENOMEM;
    long smin;
    fg_status st = fg__env_int("FULGUR_HYBRID_SCATTER_BYTES", DEFAULT_SCATTER_MIN, &smin);
    if (st != FG_OK) goto fail;
    h->scatter_min = smin < 0 ? 0 : smin;
    long chunk;
    st = fg__env_int("FULGUR_HYBRID_CHUNK_BYTES", DEFAULT_CHUNK_BYTES, &chunk);
    if (st != FG_OK) goto fail;
    h->chunk_bytes = chunk < 0 ? 0 : chunk;
    long chunks;
    st = fg__env_int("FULGUR_HYBRID_CHUNKS", DEFAULT_CHUNKS, &chunks);
    if (st != FG_OK) goto fail;
    h->chunks = chunks < 2 ? 2 : chunks;
    fg_comm_opts sub = {.timeout_s = c->timeout_s, .check = -1};
    int *node_of = NULL;
    if (fg__comm_mpi_world(info)) {
        /* Open MPI knows which ranks share a machine (from the contract after
         * fulgur run's rendezvous) */
        sub.backend = FG_COMM_MPI;
        h->base = fg_comm_new(info, &sub);
        if (!h->base) {
            st = fg_last_status();
            goto fail;
        }
        node_of = h->base->node_of;
    } else {
        /* nodes simulated on one machine: the inter-node level is shm too */
        fg_cluster_info one = *info;
        one.local_rank = info->rank;
        one.local_world_size = info->world_size;
        one.node_rank = 0;
        one.num_nodes = 1;
        sub.backend = FG_COMM_SHM;
        h->base = fg_comm_new(&one, &sub);
        if (!h->base) {
            st = fg_last_status();
            goto fail;
        }
        node_of = c->node_of; /* from the environment's layout (comm.c) */
    }
    c->no_async = h->base->no_async;
    if ((st = layout(c, h, node_of)) != FG_OK) goto fail;
    if (!h->flat) {
        if ((st = fg_comm_split(h->base, c->local_rank, c->node_rank, &h->inter)) != FG_OK)
            goto fail;
        fg_cluster_info node = {.rank = c->local_rank,
                                .world_size = c->local_size,
                                .local_rank = c->local_rank,
                                .local_world_size = c->local_size,
                                .node_rank = 0,
                                .num_nodes = 1,
                                .master_port = info->master_port,
                                .source = "hybrid"};
        snprintf(node.job_id, sizeof node.job_id, "%s.n%d", c->job_key, c->node_rank);
        sub.backend = FG_COMM_SHM;
        h->intra = fg_comm_new(&node, &sub);
        if (!h->intra) {
            st = fg_error_wrap(fg_last_status(), "hybrid: the shm group inside node %d",
                               c->node_rank);
            goto fail;
        }
    }
    c->impl = h;
    return FG_OK;
fail:
    state_free(h);
    return st;
}

/* Sub-groups are flat: a split of base. */
static FG_MUST_USE fg_status hy_split(fg_comm *parent, fg_comm *child, int color, int key) {
    hybrid_state *ph = parent->impl;
    fg_comm *cb = NULL;
    FG_TRY(fg_comm_split(ph->base, child ? color : FG_COMM_SPLIT_NONE, key, &cb));
    if (!child) return FG_OK;
    hybrid_state *h = fg_calloc(1, sizeof *h);
    if (!h) {
        fg_comm_free(cb);
        return FG_ENOMEM;
    }
    h->base = cb;
    h->flat = true;
    child->impl = h;
    child->no_async = parent->no_async;
    return FG_OK;
}

static void hy_destroy(fg_comm *c) {
    state_free(c->impl);
    c->impl = NULL;
}

static void hy_tell_peers(fg_comm *c) {
    hybrid_state *h = c->impl;
    if (!h) return;
    if (h->intra) fg_comm_abort_reason(h->intra, c->abort_why[0] ? c->abort_why : NULL);
    if (h->inter) fg_comm_abort_reason(h->inter, c->abort_why[0] ? c->abort_why : NULL);
    fg_comm_abort_reason(h->base, c->abort_why[0] ? c->abort_why : NULL);
}

const fg__comm_backend fg__comm_hybrid_backend = {
    .name = "hybrid",
    .init = hy_init,
    .split = hy_split,
    .destroy = hy_destroy,
    .tell_peers = hy_tell_peers,
    .allreduce = hy_allreduce,
    .reduce_scatter = hy_reduce_scatter,
    .allgather = hy_allgather,
    .allgatherv = hy_allgatherv,
    .broadcast = hy_broadcast,
    .reduce = hy_reduce,
    .barrier = hy_barrier,
    .alltoall = hy_alltoall,
    .send = hy_send,
    .recv = hy_recv,
};
