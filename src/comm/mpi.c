/* The mpi backend: Open MPI, the way across machines.
 *
 * Each operation is started with MPI's nonblocking form and tested in a loop
 * that gives up after the communicator's timeout (MPI itself waits forever).
 * bf16 and f16 reductions cross the network as halves (half the bytes of
 * f32, which is what fp16/bf16 compression is for) and are summed here, not
 * by MPI: an all-to-all hands rank q the q-th block of every rank, which
 * sums the p blocks in rank order in f32 and rounds once (fg__reduce, the
 * shm backend's kernel: bitwise its result), and an all-gather (allreduce)
 * or a gather to the root (reduce) hands the blocks back; reduce_scatter is
 * the all-to-all and the sum. avg is a sum divided afterwards. MPI counts are int: the
 * rooted and element-wise operations are cut into pieces below 2^31; the
 * others refuse larger counts. MPI is initialised here unless the program
 * did it, and finalised at exit if fulgur initialised it, at thread level
 * MULTIPLE: the api keeps one thread at a time on a communicator, but
 * different communicators may be used from different threads at once
 * (strategy bagua's async averaging thread has its own), which MPI's
 * SERIALIZED level forbids process-wide. */
#ifdef FULGUR_HAVE_MPI
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_impl.h"

typedef struct mpi_state {
    MPI_Comm comm;
    double spin_s; /* FULGUR_MPI_SPIN_US: a wait tests back to back this long, then sleeps */
} mpi_state;

/* FULGUR_MPI_SPIN_US: how long a wait calls MPI_Test back to back before it
 * sleeps 100 us between tests. 1 ms: an operation over TCP that takes longer
 * is bound by the network, and spinning on longer only takes the core from
 * the ranks (and the kernel's TCP work) that have something to do; on 2
 * test hosts x 2 ranks sharing 2 cores the hybrid's legs across nodes took
 * 20-40% longer with 100 ms of spinning (docs/comm.md). */
#define DEFAULT_SPIN_US 1000
#define SLEEP_NS 100000

static int g_we_initialized;

static void finalize_at_exit(void) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
}

static FG_MUST_USE fg_status mpi_err(fg_comm *c, const fg__comm_args *a, int rc, const char *what) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, s, &len);
    return fg__comm_fail(c, a, FG_EPEER, "%s failed: %s", what, s);
}

/* A wait's i-th test, begun at t0, done: after FULGUR_MPI_SPIN_US of
 * tests back to back, sleeps SLEEP_NS before the next. */
static void back_off(const mpi_state *m, unsigned i, double t0) {
    if (i > 16 && fg_time() - t0 > m->spin_s) {
        struct timespec ts = {0, SLEEP_NS};
        nanosleep(&ts, NULL);
    }
}

/* Tests the request until done or the timeout. MPI_Test is what drives a
 * nonblocking collective forward, so it is called back to back (as
 * MPI_Wait would poll; Open MPI yields inside when oversubscribed) for
 * FULGUR_MPI_SPIN_US; a longer wait, one bound by the network or by a late
 * peer, sleeps 100 us between tests (the kernel keeps moving the data that
 * Open MPI has handed to the sockets meanwhile). */
static FG_MUST_USE fg_status mpi_wait(fg_comm *c, const fg__comm_args *a, MPI_Request *req,
                                      const char *what) {
    const mpi_state *m = c->impl;
    double t0 = fg_time();
    for (unsigned i = 0;; i++) {
        int flag = 0;
        int rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_err(c, a, rc, what);
        if (flag) return FG_OK;
        if ((i & 255) == 0) {
            double dt = fg_time() - t0;
            if (dt > c->timeout_s)
                return fg__comm_fail(c, a, FG_ETIMEOUT,
                                     "timed out after %.3g s in %s (FULGUR_COMM_TIMEOUT_S; the mpi "
                                     "backend cannot tell which rank is missing)",
                                     c->timeout_s, what);
            if (c->aborted) return fg__comm_fail(c, a, FG_EPEER, "aborted (fg_comm_abort)");
        }
        back_off(m, i, t0);
    }
}

static MPI_Datatype mpi_type(fg_dtype dt) {
    switch (dt) {
    case FG_F64: return MPI_DOUBLE;
    case FG_F32: return MPI_FLOAT;
    case FG_I32: return MPI_INT32_T;
    case FG_I64: return MPI_INT64_T;
    case FG_U8: return MPI_UINT8_T;
    default: return MPI_UINT16_T; /* u16; bf16 and f16 move as bits, reduce through f32 */
    }
}

static MPI_Op mpi_op(fg_reduce_op op) {
    switch (op) {
    case FG_REDUCE_OP_MIN: return MPI_MIN;
    case FG_REDUCE_OP_MAX: return MPI_MAX;
    case FG_REDUCE_OP_PROD: return MPI_PROD;
    default: return MPI_SUM;
    }
}

static bool is_half(fg_dtype dt) { return dt == FG_BF16 || dt == FG_F16; }

/* avg = sum / size, in the element type (f32 for halves, done by caller). */
static void divide(void *buf, int64_t n, fg_dtype dt, int size) {
    switch (dt) {
    case FG_F64:
        for (int64_t i = 0; i < n; i++) ((double *)buf)[i] /= size;
        break;
    case FG_F32:
        for (int64_t i = 0; i < n; i++) ((float *)buf)[i] /= (float)size;
        break;
    case FG_I32:
        for (int64_t i = 0; i < n; i++) ((int32_t *)buf)[i] /= size;
        break;
    case FG_I64:
        for (int64_t i = 0; i < n; i++) ((int64_t *)buf)[i] /= size;
        break;
    case FG_U8:
        for (int64_t i = 0; i < n; i++) ((uint8_t *)buf)[i] = (uint8_t)(((uint8_t *)buf)[i] / size);
        break;
    case FG_U16:
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)buf)[i] = (uint16_t)(((uint16_t *)buf)[i] / size);
        break;
    default: break;
    }
}

#define PIECE ((int64_t)1 << 30)
/* elements of a half reduction per round of exchanges: bounds the scratch
 * (3 copies of the piece's halves) whatever the count */
#define HALF_PIECE ((int64_t)1 << 24)

/* The halves of piece [off, off + n) of a->send: the all-to-all of blocks
 * of len = ceil(n / p) (the last rank's block padded with zeros), rank
 * k's block of the p ranks' summed in rank order into `mine` (f32, rounded
 * once), then gathered into a->recv: by every rank (all) or by the root. */
static FG_MUST_USE fg_status half_piece(fg_comm *c, const fg__comm_args *a, bool all, int64_t off,
                                        int64_t n, uint16_t *x, const void **srcs) {
    mpi_state *m = c->impl;
    int p = c->size;
    int64_t len = (n + p - 1) / p, span = len * p;
    uint16_t *got = x + span, *mine = got + span;
    memcpy(x, (const uint16_t *)a->send + off, (size_t)n * 2);
    memset(x + n, 0, (size_t)(span - n) * 2);
    MPI_Request req;
    int bytes = (int)(len * 2);
    int rc = MPI_Ialltoall(x, bytes, MPI_BYTE, got, bytes, MPI_BYTE, m->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_err(c, a, rc, "MPI_Ialltoall");
    FG_TRY(mpi_wait(c, a, &req, "MPI_Ialltoall"));
    for (int q = 0; q < p; q++) srcs[q] = got + (int64_t)q * len;
    fg__reduce(a->dt, a->rop, mine, NULL, srcs, p, len, p);
    bool here = all || c->rank == a->root;
    if (all) rc = MPI_Iallgather(mine, bytes, MPI_BYTE, x, bytes, MPI_BYTE, m->comm, &req);
    else rc = MPI_Igather(mine, bytes, MPI_BYTE, x, bytes, MPI_BYTE, a->root, m->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_err(c, a, rc, all ? "MPI_Iallgather" : "MPI_Igather");
    FG_TRY(mpi_wait(c, a, &req, all ? "MPI_Iallgather" : "MPI_Igather"));
    if (here) memcpy((uint16_t *)a->recv + off, x, (size_t)n * 2);
    return FG_OK;
}

/* allreduce / reduce of bf16 or f16, as halves on the wire */
static FG_MUST_USE fg_status half_reduce(fg_comm *c, const fg__comm_args *a, bool all) {
    if (a->count == 0) return FG_OK;
    int64_t piece = FG_MIN(a->count, HALF_PIECE), span = (piece + c->size - 1) / c->size * c->size;
    uint16_t *x = fg_alloc((size_t)(3 * span) * 2);
    const void **srcs = fg_alloc(sizeof *srcs * (size_t)c->size);
    fg_status st = FG_OK;
    if (!x || !srcs) st = fg__comm_fail(c, a, FG_ENOMEM, "out of memory for the half blocks");
    for (int64_t off = 0; st == FG_OK && off < a->count; off += HALF_PIECE)
        st = half_piece(c, a, all, off, FG_MIN(HALF_PIECE, a->count - off), x, srcs);
    fg_free(srcs);
    fg_free(x);
    return st;
}

/* allreduce / reduce of one dtype the MPI way; halves as halves above. */
static FG_MUST_USE fg_status reduce_common(fg_comm *c, const fg__comm_args *a, bool all) {
    if (is_half(a->dt)) return half_reduce(c, a, all);
    mpi_state *m = c->impl;
    bool here = all || c->rank == a->root;
    const void *send = a->send;
    void *recv = a->recv;
    fg_dtype dt = a->dt;
    fg_status st = FG_OK;
    size_t esz = fg_dtype_size(dt);
    for (int64_t off = 0; off < a->count; off += PIECE) {
        int k = (int)FG_MIN(PIECE, a->count - off);
        const char *sp = (const char *)send + off * (int64_t)esz;
        char *rp = recv ? (char *)recv + off * (int64_t)esz : NULL;
        const void *sarg = sp == rp ? MPI_IN_PLACE : sp;
        MPI_Request req;
        int rc;
        if (all) {
            rc = MPI_Iallreduce(sarg, rp, k, mpi_type(dt), mpi_op(a->rop), m->comm, &req);
        } else {
            if (!here) sarg = sp;
            rc = MPI_Ireduce(sarg, rp, k, mpi_type(dt), mpi_op(a->rop), a->root, m->comm, &req);
        }
        if (rc != MPI_SUCCESS) {
            st = mpi_err(c, a, rc, all ? "MPI_Iallreduce" : "MPI_Ireduce");
            goto out;
        }
        if ((st = mpi_wait(c, a, &req, all ? "MPI_Iallreduce" : "MPI_Ireduce")) != FG_OK) goto out;
    }
    if (here && a->rop == FG_REDUCE_OP_AVG) divide(recv, a->count, dt, c->size);
out:
    return st;
}

static FG_MUST_USE fg_status mpi_allreduce(fg_comm *c, const fg__comm_args *a) {
    return reduce_common(c, a, true);
}
static FG_MUST_USE fg_status mpi_reduce(fg_comm *c, const fg__comm_args *a) {
    return reduce_common(c, a, false);
}

static FG_MUST_USE fg_status too_big(fg_comm *c, const fg__comm_args *a, int64_t n) {
    if (n <= INT_MAX) return FG_OK;
    return fg__comm_fail(c, a, FG_EUNSUPPORTED,
                         "count %lld exceeds the mpi backend's limit of 2^31-1", (long long)n);
}

/* reduce_scatter of bf16 or f16: the all-to-all of the blocks as halves,
 * then this rank's p blocks summed in rank order in f32, rounded once */
static FG_MUST_USE fg_status half_reduce_scatter(fg_comm *c, const fg__comm_args *a) {
    mpi_state *m = c->impl;
    int p = c->size;
    int64_t n = a->count;
    FG_TRY(too_big(c, a, n * 2));
    if (n == 0) return FG_OK;
    uint16_t *got = fg_alloc((size_t)(n * p) * 2);
    const void **srcs = fg_alloc(sizeof *srcs * (size_t)p);
    fg_status st = FG_OK;
    if (!got || !srcs) st = fg__comm_fail(c, a, FG_ENOMEM, "out of memory for the half blocks");
    MPI_Request req;
    int rc = MPI_SUCCESS;
    if (st == FG_OK) {
        rc = MPI_Ialltoall(a->send, (int)(n * 2), MPI_BYTE, got, (int)(n * 2), MPI_BYTE, m->comm,
                           &req);
        st = rc != MPI_SUCCESS ? mpi_err(c, a, rc, "MPI_Ialltoall")
                               : mpi_wait(c, a, &req, "MPI_Ialltoall");
    }
    if (st == FG_OK) {
        for (int q = 0; q < p; q++) srcs[q] = got + (int64_t)q * n;
        fg__reduce(a->dt, a->rop, a->recv, NULL, srcs, p, n, p);
    }
    fg_free(srcs);
    fg_free(got);
    return st;
}

static FG_MUST_USE fg_status mpi_reduce_scatter(fg_comm *c, const fg__comm_args *a) {
    mpi_state *m = c->impl;
    FG_TRY(too_big(c, a, a->count * c->size));
    if (is_half(a->dt)) return half_reduce_scatter(c, a);
    int64_t n = a->count;
    fg_dtype dt = a->dt;
    const void *send = a->send;
    fg_status st = FG_OK;
    /* in place (recv inside send) goes through a copy: MPI's in-place
     * form puts the result at the start of the buffer */
    void *out = fg_alloc((size_t)n * fg_dtype_size(dt));
    if (!out) return fg__comm_fail(c, a, FG_ENOMEM, "out of memory");
    MPI_Request req;
    int rc =
        MPI_Ireduce_scatter_block(send, out, (int)n, mpi_type(dt), mpi_op(a->rop), m->comm, &req);
    if (rc != MPI_SUCCESS) st = mpi_err(c, a, rc, "MPI_Ireduce_scatter_block");
    else st = mpi_wait(c, a, &req, "MPI_Ireduce_scatter_block");
    if (st == FG_OK) {
        if (a->rop == FG_REDUCE_OP_AVG) divide(out, n, dt, c->size);
        memcpy(a->recv, out, (size_t)n * fg_dtype_size(dt));
    }
    fg_free(out);
    return st;
}

static FG_MUST_USE fg_status mpi_allgatherv(fg_comm *c, const fg__comm_args *a) {
    mpi_state *m = c->impl;
    size_t esz = fg_dtype_size(a->dt);
    int *ci = fg_alloc(sizeof(int) * 2 * (size_t)c->size);
    if (!ci) return fg__comm_fail(c, a, FG_ENOMEM, "out of memory");
    fg_status st = FG_OK;
    /* counted in bytes so every dtype moves as MPI_BYTE */
    for (int q = 0; q < c->size && st == FG_OK; q++) {
        int64_t cb = a->counts[q] * (int64_t)esz, db = a->displs[q] * (int64_t)esz;
        if ((st = too_big(c, a, FG_MAX(cb, db))) == FG_OK) {
            ci[q] = (int)cb;
            ci[c->size + q] = (int)db;
        }
    }
    if (st == FG_OK) {
        const char *mine = (const char *)a->recv + a->displs[c->rank] * (int64_t)esz;
        const void *sarg = a->send == mine ? MPI_IN_PLACE : a->send;
        MPI_Request req;
        int rc = MPI_Iallgatherv(sarg, ci[c->rank], MPI_BYTE, a->recv, ci, ci + c->size, MPI_BYTE,
                                 m->comm, &req);
        st = rc != MPI_SUCCESS ? mpi_err(c, a, rc, "MPI_Iallgatherv")
                               : mpi_wait(c, a, &req, "MPI_Iallgatherv");
    }
    fg_free(ci);
    return st;
}

static FG_MUST_USE fg_status mpi_allgather(fg_comm *c, const fg__comm_args *a) {
    mpi_state *m = c->impl;
    size_t esz = fg_dtype_size(a->dt);
    int64_t bytes = a->count * (int64_t)esz;
    FG_TRY(too_big(c, a, bytes * c->size));
    const char *mine = (const char *)a->recv + (int64_t)c->rank * bytes;
    const void *sarg = a->send == mine ? MPI_IN_PLACE : a->send;
    MPI_Request req;
    int rc =
        MPI_Iallgather(sarg, (int)bytes, MPI_BYTE, a->recv, (int)bytes, MPI_BYTE, m->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_err(c, a, rc, "MPI_Iallgather");
    return mpi_wait(c, a, &req, "MPI_Iallgather");
}

static FG_MUST_USE fg_status mpi_broadcast(fg_comm *c, const fg__comm_args *a) {
    mpi_state *m = c->impl;
    size_t esz = fg_dtype_size(a->dt);
    if (c->rank == a->root && a->send != a->recv) memcpy(a->recv, a->send, (size_t)a->count * esz);
    int64_t bytes = a->count * (int64_t)esz;
    for (int64_t off = 0; off < bytes; off += PIECE) {
        MPI_Request req;
        int rc = MPI_Ibcast((char *)a->recv + off, (int)FG_MIN(PIECE, bytes - off), MPI_BYTE,
                            a->root, m->comm, &req);
        if (rc != MPI_SUCCESS) return mpi_err(c, a, rc, "MPI_Ibcast");
        FG_TRY(mpi_wait(c, a, &req, "MPI_Ibcast"));
    }
    return FG_OK;
}

static FG_MUST_USE fg_status mpi_barrier(fg_comm *c, const fg__comm_args *a) {
    mpi_state *m = c->impl;
    MPI_Request req;
    int rc = MPI_Ibarrier(m->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_err(c, a, rc, "MPI_Ibarrier");
    return mpi_wait(c, a, &req, "MPI_Ibarrier");
}

static FG_MUST_USE fg_status mpi_alltoall(fg_comm *c, const fg__comm_args *a) {
    mpi_state *m = c->impl;
    int64_t bytes = a->count * (int64_t)fg_dtype_size(a->dt);
    FG_TRY(too_big(c, a, bytes * c->size));
    const void *send = a->send;
    void *tmp = NULL;
    if (send == a->recv) { /* in place through a copy */
        tmp = fg_alloc((size_t)(bytes * c->size));
        if (!tmp) return fg__comm_fail(c, a, FG_ENOMEM, "out of memory");
        memcpy(tmp, send, (size_t)(bytes * c->size));
        send = tmp;
    }
    MPI_Request req;
    fg_status st;
    int rc =
        MPI_Ialltoall(send, (int)bytes, MPI_BYTE, a->recv, (int)bytes, MPI_BYTE, m->comm, &req);
    st = rc != MPI_SUCCESS ? mpi_err(c, a, rc, "MPI_Ialltoall")
                           : mpi_wait(c, a, &req, "MPI_Ialltoall");
    fg_free(tmp);
    return st;
}

static FG_MUST_USE fg_status mpi_send(fg_comm *c, const fg__comm_args *a) {
    mpi_state *m = c->impl;
    int64_t bytes = a->count * (int64_t)fg_dtype_size(a->dt);
    FG_TRY(too_big(c, a, bytes));
    MPI_Request req;
    int rc = MPI_Isend(a->send, (int)bytes, MPI_BYTE, a->root, 0, m->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_err(c, a, rc, "MPI_Isend");
    return mpi_wait(c, a, &req, "MPI_Isend");
}

static FG_MUST_USE fg_status mpi_recv(fg_comm *c, const fg__comm_args *a) {
    mpi_state *m = c->impl;
    int64_t bytes = a->count * (int64_t)fg_dtype_size(a->dt);
    FG_TRY(too_big(c, a, bytes));
    /* probe first, so a size mismatch is reported instead of truncated */
    MPI_Message msg;
    MPI_Status status;
    double t0 = fg_time();
    for (unsigned i = 0;; i++) {
        int flag = 0;
        int rc = MPI_Improbe(a->root, 0, m->comm, &flag, &msg, &status);
        if (rc != MPI_SUCCESS) return mpi_err(c, a, rc, "MPI_Improbe");
        if (flag) break;
        if ((i & 255) == 0 && fg_time() - t0 > c->timeout_s)
            return fg__comm_fail(c, a, FG_ETIMEOUT,
                                 "timed out after %.3g s waiting for rank %d to send", c->timeout_s,
                                 a->root);
        back_off(m, i, t0);
    }
    int got = 0;
    MPI_Get_count(&status, MPI_BYTE, &got);
    if (got != bytes) {
        return fg__comm_fail(
            c, a, FG_EMISMATCH,
            "rank %d sent %d bytes but this rank (%d) receives %lld elements of %s "
            "(%lld bytes)",
            a->root, got, c->rank, (long long)a->count, fg_dtype_name(a->dt), (long long)bytes);
    }
    MPI_Request req;
    int rc = MPI_Imrecv(a->recv, (int)bytes, MPI_BYTE, &msg, &req);
    if (rc != MPI_SUCCESS) return mpi_err(c, a, rc, "MPI_Imrecv");
    return mpi_wait(c, a, &req, "MPI_Imrecv");
}

/* Node layout of a communicator: ranks sharing memory form a node; nodes
 * are numbered in the order of their lowest rank. */
static FG_MUST_USE fg_status node_layout(fg_comm *c, MPI_Comm comm) {
    MPI_Comm local;
    if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &local) !=
        MPI_SUCCESS)
        return fg_error(FG_EIO, "mpi: MPI_Comm_split_type failed");
    int lr, ls, leader = c->rank;
    MPI_Comm_rank(local, &lr);
    MPI_Comm_size(local, &ls);
    MPI_Bcast(&leader, 1, MPI_INT, 0, local);
    MPI_Comm_free(&local);
    int *leaders = fg_alloc(sizeof(int) * (size_t)c->size);
    if (!leaders) return FG_ENOMEM;
    MPI_Allgather(&leader, 1, MPI_INT, leaders, 1, MPI_INT, comm);
    int nodes = 0;
    for (int i = 0; i < c->size; i++) {
        if (leaders[i] == i) nodes++;
        int idx = 0; /* leaders below this one's leader */
        for (int j = 0; j < c->size; j++) idx += leaders[j] == j && j < leaders[i];
        c->node_of[i] = idx;
    }
    fg_free(leaders);
    c->local_rank = lr;
    c->local_size = ls;
    c->num_nodes = nodes;
    c->node_rank = c->node_of[c->rank];
    return FG_OK;
}

/* The world of ranks started on each machine by itself (fulgur run
 * --nnodes, the rendezvous): every rank is an MPI singleton, and they join
 * one at a time in rank order through Open MPI's dynamic processes. Rank 0
 * opens a port and, for r = 1 .. size-1, publishes it under the name
 * "fulgur.<job>.<r>" at the job's ompi-server (FULGUR_MPI_SERVER, which
 * Open MPI reads as pmix_server_uri) and accepts, with every rank already
 * joined, on the group so far; rank r looks its name up (retrying until
 * the communicator's timeout: the name appears when the ranks before it
 * are in) and connects. Each accept is merged into the group, so the
 * group's ranks are the contract's. */
static FG_MUST_USE fg_status connect_world(fg_comm *c, MPI_Comm *out) {
    char port[MPI_MAX_PORT_NAME] = "", name[160];
    MPI_Comm world = MPI_COMM_NULL, inter, merged;
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int rc, joined = 1;
    if (c->rank == 0) {
        if ((rc = MPI_Open_port(MPI_INFO_NULL, port)) != MPI_SUCCESS)
            return fg_error(FG_EIO, "mpi: MPI_Open_port failed (rank 0 of the rendezvous)");
        MPI_Comm_dup(MPI_COMM_SELF, &world);
    } else {
        snprintf(name, sizeof name, "fulgur.%s.%d", c->job_key, c->rank);
        double t0 = fg_time();
        while ((rc = MPI_Lookup_name(name, MPI_INFO_NULL, port)) != MPI_SUCCESS) {
            if (fg_time() - t0 > c->timeout_s)
                return fg_error(FG_ETIMEOUT,
                                "mpi: rank %d: rank 0 did not offer this rank its turn to join "
                                "within %.3g s (name %s at the job's ompi-server; "
                                "FULGUR_COMM_TIMEOUT_S): a rank before it never joined",
                                c->rank, c->timeout_s, name);
            struct timespec ts = {0, 20 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        if ((rc = MPI_Comm_connect(port, MPI_INFO_NULL, 0, MPI_COMM_SELF, &inter)) != MPI_SUCCESS)
            return fg_error(FG_EIO, "mpi: rank %d: MPI_Comm_connect to rank 0 failed", c->rank);
        MPI_Intercomm_merge(inter, 1, &world);
        MPI_Comm_free(&inter);
        MPI_Comm_size(world, &joined);
    }
    while (joined < c->size) {
        /* the next rank's turn; every rank in the group takes part */
        if (c->rank == 0) {
            snprintf(name, sizeof name, "fulgur.%s.%d", c->job_key, joined);
            if (MPI_Publish_name(name, MPI_INFO_NULL, port) != MPI_SUCCESS) {
                MPI_Comm_free(&world);
                return fg_error(FG_EIO,
                                "mpi: rank 0: MPI_Publish_name(%s) failed: is the job's "
                                "ompi-server (FULGUR_MPI_SERVER) running?",
                                name);
            }
        }
        rc = MPI_Comm_accept(port, MPI_INFO_NULL, 0, world, &inter);
        if (c->rank == 0) MPI_Unpublish_name(name, MPI_INFO_NULL, port);
        if (rc != MPI_SUCCESS) {
            MPI_Comm_free(&world);
            return fg_error(FG_EIO, "mpi: rank %d: MPI_Comm_accept of rank %d failed", c->rank,
                            joined);
        }
        MPI_Intercomm_merge(inter, 0, &merged);
        MPI_Comm_free(&inter);
        MPI_Comm_free(&world);
        world = merged;
        MPI_Comm_size(world, &joined);
    }
    if (c->rank == 0) MPI_Close_port(port);
    int r;
    MPI_Comm_rank(world, &r);
    if (r != c->rank) {
        MPI_Comm_free(&world);
        return fg_error(FG_EIO, "mpi: rank %d joined the rendezvous as rank %d", c->rank, r);
    }
    *out = world;
    return FG_OK;
}

static FG_MUST_USE fg_status mpi_init_(fg_comm *c, const fg_cluster_info *info) {
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
            return fg_error(FG_EIO, "mpi: MPI_Init_thread failed");
        if (!g_we_initialized) atexit(finalize_at_exit);
        g_we_initialized = 1;
    } else {
        MPI_Query_thread(&provided);
    }
    c->no_async = provided < MPI_THREAD_SERIALIZED;
    int size, rank;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    const char *server = getenv("FULGUR_MPI_SERVER");
    bool rdzv = server && *server && size == 1 && c->size > 1;
    bool slurm = info->source && !strcmp(info->source, "slurm");
    if (!rdzv && (size != c->size || rank != c->rank))
        return fg_error(FG_EINVAL,
                        "mpi: MPI says rank %d of %d but the cluster info (%s) says rank %d of %d: "
                        "%s",
                        rank, size, info->source ? info->source : "explicit", c->rank, c->size,
                        slurm && size == 1
                            ? "srun started this task without PMIx; run srun --mpi=pmix (or set "
                              "MpiDefault=pmix in slurm.conf)"
                            : "launch with mpirun, or leave the rank variables to it");
    long spin_us;
    FG_TRY(fg__env_int("FULGUR_MPI_SPIN_US", DEFAULT_SPIN_US, &spin_us));
    mpi_state *m = fg_calloc(1, sizeof *m);
    if (!m) return FG_ENOMEM;
    m->spin_s = spin_us < 0 ? 0 : (double)spin_us * 1e-6;
    fg_status st = FG_OK;
    if (rdzv) {
        /* the ranks' layout is the contract's (comm.c filled node_of) */
        st = connect_world(c, &m->comm);
        if (st != FG_OK) {
            fg_free(m);
            return st;
        }
        MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
        c->impl = m;
        return FG_OK;
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &m->comm);
    MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    st = node_layout(c, m->comm);
    if (st != FG_OK) {
        MPI_Comm_free(&m->comm);
        fg_free(m);
        return st;
    }
    c->impl = m;
    return FG_OK;
}

static FG_MUST_USE fg_status mpi_split(fg_comm *parent, fg_comm *child, int color, int key) {
    mpi_state *pm = parent->impl;
    MPI_Comm nc;
    int rc = MPI_Comm_split(pm->comm, child ? color : MPI_UNDEFINED, key, &nc);
    if (rc != MPI_SUCCESS) return fg_error(FG_EIO, "mpi: MPI_Comm_split failed");
    if (!child) return FG_OK;
    mpi_state *m = fg_calloc(1, sizeof *m);
    if (!m) {
        MPI_Comm_free(&nc);
        return FG_ENOMEM;
    }
    m->comm = nc;
    m->spin_s = pm->spin_s;
    MPI_Comm_set_errhandler(nc, MPI_ERRORS_RETURN);
    child->impl = m;
    child->no_async = parent->no_async;
    return FG_OK;
}

static void mpi_destroy(fg_comm *c) {
    mpi_state *m = c->impl;
    if (!m) return;
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Comm_free(&m->comm);
    fg_free(m);
    c->impl = NULL;
}

static void mpi_tell_peers(fg_comm *c) {
    (void)c; /* MPI has no way to tell peers without killing them */
}

const fg__comm_backend fg__comm_mpi_backend = {
    .name = "mpi",
    .init = mpi_init_,
    .split = mpi_split,
    .destroy = mpi_destroy,
    .tell_peers = mpi_tell_peers,
    .allreduce = mpi_allreduce,
    .reduce_scatter = mpi_reduce_scatter,
    .allgather = mpi_allgather,
    .allgatherv = mpi_allgatherv,
    .broadcast = mpi_broadcast,
    .reduce = mpi_reduce,
    .barrier = mpi_barrier,
    .alltoall = mpi_alltoall,
    .send = mpi_send,
    .recv = mpi_recv,
};
#else
typedef int fg__comm_mpi_not_built; /* ISO C wants a declaration in every file */
#endif
