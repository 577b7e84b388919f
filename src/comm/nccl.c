/* The nccl comm backend: collectives between GPUs on device memory, by
 * NCCL (opened with dlopen at the first communicator: FULGUR_NCCL_LIBRARY,
 * else libnccl.so.2, from the CUDA toolkit or PyTorch's wheels). The
 * unique id goes from rank 0 to the others over a bootstrap communicator
 * of the job's own kind (shm on one machine, MPI or hybrid under mpirun);
 * the NCCL communicator is made non-blocking (config.blocking = 0) and
 * polled against the collective timeout. Every call is enqueued on the
 * backend's own CUDA stream and waited for: the rank polls the stream and
 * ncclCommGetAsyncError until the work is done, NCCL reports an error, or
 * the timeout passes; then the communicator is aborted and the call fails
 * naming this rank, the operation and what it waited for, as the shm
 * backend does. Buffers are device memory of the rank's GPU (local rank
 * modulo the GPUs it sees): one GPU per rank on a machine. */
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_impl.h"
#include "nccl_impl.h"

typedef struct nccl_api {
    void *h;
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*init_rank_config)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);
    ncclResult_t (*async_error)(ncclComm_t, ncclResult_t *);
    ncclResult_t (*comm_abort)(ncclComm_t); /* ncclCommAbort */
    ncclResult_t (*finalize)(ncclComm_t);
    ncclResult_t (*destroy)(ncclComm_t);
    const char *(*error_string)(ncclResult_t);
    const char *(*last_error)(ncclComm_t);
    ncclResult_t (*allreduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                              cudaStream_t);
    ncclResult_t (*reduce_scatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                                   ncclComm_t, cudaStream_t);
    ncclResult_t (*allgather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t,
                              cudaStream_t);
    ncclResult_t (*broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
                              cudaStream_t);
    ncclResult_t (*reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int,
                           ncclComm_t, cudaStream_t);
    ncclResult_t (*send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
} nccl_api;

static nccl_api g_api;
static fg_status g_load_status;
static char g_load_msg[512];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void load(void) {
    const char *name = getenv("FULGUR_NCCL_LIBRARY");
    if (!name || !*name) name = "libnccl.so.2";
    const fg__dl_sym syms[] = {
        {&g_api.get_unique_id, "ncclGetUniqueId", false},
        {&g_api.init_rank_config, "ncclCommInitRankConfig", false},
        {&g_api.async_error, "ncclCommGetAsyncError", false},
        {&g_api.comm_abort, "ncclCommAbort", false},
        {&g_api.finalize, "ncclCommFinalize", false},
        {&g_api.destroy, "ncclCommDestroy", false},
        {&g_api.error_string, "ncclGetErrorString", false},
        {&g_api.last_error, "ncclGetLastError", false},
        {&g_api.allreduce, "ncclAllReduce", false},
        {&g_api.reduce_scatter, "ncclReduceScatter", false},
        {&g_api.allgather, "ncclAllGather", false},
        {&g_api.broadcast, "ncclBroadcast", false},
        {&g_api.reduce, "ncclReduce", false},
        {&g_api.send, "ncclSend", false},
        {&g_api.recv, "ncclRecv", false},
        {&g_api.group_start, "ncclGroupStart", false},
        {&g_api.group_end, "ncclGroupEnd", false},
    };
    char why[400];
    g_api.h = fg__dl_open(name, syms, sizeof syms / sizeof *syms, why, sizeof why);
    if (!g_api.h) {
        g_load_status = FG_EUNSUPPORTED;
        snprintf(g_load_msg, sizeof g_load_msg,
                 "NCCL: %s (NCCL 2.14 or newer; FULGUR_NCCL_LIBRARY names the library, e.g. "
                 "PyTorch's nvidia/nccl/lib/libnccl.so.2)",
                 why);
    }
}

fg_status fg__nccl_load(void) {
    pthread_once(&g_once, load);
    if (g_load_status != FG_OK) return fg_error(g_load_status, "%s", g_load_msg);
    return FG_OK;
}

fg_status fg__nccl_exchange_id(fg_comm *boot, unsigned char id[FG_NCCL_ID_BYTES]) {
    _Static_assert(sizeof(ncclUniqueId) == FG_NCCL_ID_BYTES, "ncclUniqueId is 128 bytes");
    /* byte 0: whether rank 0 made an id; then the id */
    unsigned char msg[1 + FG_NCCL_ID_BYTES] = {0};
    char why[400] = "";
    if (fg_comm_rank(boot) == 0) {
        fg_status s = fg__nccl_load();
        if (s == FG_OK) {
            ncclUniqueId u;
            ncclResult_t r = g_api.get_unique_id(&u);
            if (r == ncclSuccess) {
                msg[0] = 1;
                memcpy(msg + 1, &u, sizeof u);
            } else {
                snprintf(why, sizeof why, "ncclGetUniqueId: %s", g_api.error_string(r));
            }
        } else {
            snprintf(why, sizeof why, "%s", fg_last_error());
        }
    }
    FG_TRY(fg_comm_broadcast(boot, msg, msg, sizeof msg, FG_U8, 0));
    if (!msg[0]) {
        if (fg_comm_rank(boot) == 0) return fg_error(FG_EUNSUPPORTED, "%s", why);
        return fg_error(FG_EPEER, "rank 0 could not make the NCCL unique id");
    }
    memcpy(id, msg + 1, FG_NCCL_ID_BYTES);
    return FG_OK;
}

/* ---------------------------------------------------------------- the backend */

typedef struct nccl {
    ncclComm_t comm;
    cudaStream_t stream;
    int gpu;
    fg_comm *boot;
} nccl;

static void pause_briefly(void) {
    struct timespec ts = {0, 50 * 1000};
    nanosleep(&ts, NULL);
}

/* waits for NCCL's async state to leave ncclInProgress: its result */
static ncclResult_t settle(nccl *n, double timeout_s, bool *timed_out) {
    double t0 = fg_time();
    *timed_out = false;
    for (;;) {
        ncclResult_t r = ncclSuccess;
        ncclResult_t q = g_api.async_error(n->comm, &r);
        if (q != ncclSuccess) return q;
        if (r != ncclInProgress) return r;
        if (fg_time() - t0 > timeout_s) {
            *timed_out = true;
            return ncclInProgress;
        }
        pause_briefly();
    }
}

static void kill_comm(nccl *n) {
    if (n->comm) g_api.comm_abort(n->comm);
    n->comm = NULL;
}

static FG_MUST_USE fg_status nccl_init(fg_comm *c, const fg_cluster_info *info) {
    if (fg__nccl_load() != FG_OK) {
        char why[600];
        snprintf(why, sizeof why, "%s", fg_last_error());
        return fg_error(FG_EUNSUPPORTED,
                        "backend nccl: %s; use FULGUR_BACKEND=shm (or mpi) for host memory", why);
    }
    int ngpu = 0;
    cudaError_t ce = cudaGetDeviceCount(&ngpu);
    if (ce != cudaSuccess || ngpu == 0) {
        (void)cudaGetLastError();
        return fg_error(FG_EUNSUPPORTED,
                        "backend nccl: no CUDA device: cudaGetDeviceCount: %s; use "
                        "FULGUR_BACKEND=shm (or mpi) for host memory",
                        ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
    }
    if (info->local_world_size > ngpu)
        return fg_error(FG_EUNSUPPORTED,
                        "backend nccl: %d ranks on this machine and %d GPU%s: NCCL needs one GPU "
                        "per rank; ranks sharing a GPU use FULGUR_BACKEND=shm, which stages device "
                        "buffers through host memory",
                        info->local_world_size, ngpu, ngpu == 1 ? "" : "s");
    nccl *n = fg_calloc(1, sizeof *n);
    if (!n) return fg_last_status();
    n->gpu = info->local_rank % ngpu;
    /* the bootstrap group: the job's own kind, under a name of its own */
    fg_cluster_info bi = *info;
    snprintf(bi.job_id, sizeof bi.job_id, "%.*s.nccl", (int)sizeof bi.job_id - 6, info->job_id);
    bool mpirun = info->source && !strcmp(info->source, "openmpi");
    fg_comm_opts bo = {.backend = mpirun && fg_comm_backend_built(FG_COMM_MPI)
                                      ? (info->num_nodes > 1 ? FG_COMM_HYBRID : FG_COMM_MPI)
                                      : FG_COMM_SHM,
                       .timeout_s = c->timeout_s};
    fg_status s = FG_OK;
    n->boot = fg_comm_new(&bi, &bo);
    if (!n->boot) {
        s = fg_error_wrap(fg_last_status(), "backend nccl: the bootstrap group");
        goto fail;
    }
    unsigned char id[FG_NCCL_ID_BYTES];
    if ((s = fg__nccl_exchange_id(n->boot, id)) != FG_OK) goto fail;
    if ((ce = cudaSetDevice(n->gpu)) != cudaSuccess ||
        (ce = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        (void)cudaGetLastError();
        s = fg_error(FG_EIO, "backend nccl: GPU %d: %s", n->gpu, cudaGetErrorString(ce));
        goto fail;
    }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclResult_t r = g_api.init_rank_config(&n->comm, c->size, u, c->rank, &cfg);
    bool late = false;
    if (r == ncclSuccess || r == ncclInProgress) r = settle(n, c->timeout_s, &late);
    if (r != ncclSuccess) {
        s = fg_error(late ? FG_ETIMEOUT : FG_EIO,
                     "backend nccl: rank %d: ncclCommInitRankConfig: %s", c->rank,
                     late ? "not done within the timeout (a rank did not join)"
                          : g_api.error_string(r));
        kill_comm(n);
        goto fail;
    }
    c->impl = n;
    return FG_OK;
fail:
    if (n->stream) cudaStreamDestroy(n->stream);
    fg_comm_free(n->boot);
    fg_free(n);
    return s;
}

static void nccl_destroy(fg_comm *c) {
    nccl *n = c->impl;
    if (!n) return;
    if (n->comm) {
        bool late;
        ncclResult_t r = g_api.finalize(n->comm); /* flushes, non-blocking */
        if (r == ncclSuccess || r == ncclInProgress) r = settle(n, c->timeout_s, &late);
        if (r == ncclSuccess) g_api.destroy(n->comm);
        else g_api.comm_abort(n->comm);
        n->comm = NULL;
    }
    if (n->stream) cudaStreamDestroy(n->stream);
    fg_comm_free(n->boot);
    fg_free(n);
    c->impl = NULL;
}

static void nccl_tell_peers(fg_comm *c) {
    nccl *n = c->impl;
    if (n && n->boot && n->boot->be->tell_peers) n->boot->be->tell_peers(n->boot);
}

static FG_MUST_USE fg_status nccl_split(fg_comm *parent, fg_comm *child, int color, int key) {
    (void)parent;
    (void)child;
    (void)key;
    return fg_error(FG_EUNSUPPORTED,
                    "backend nccl: fg_comm_split (color %d) is not built yet; use "
                    "FULGUR_BACKEND=shm or mpi for strategies that split the world",
                    color);
}

static bool nccl_type(fg_dtype dt, ncclDataType_t *t) {
    switch (dt) {
    case FG_F32: *t = ncclFloat32; return true;
    case FG_F64: *t = ncclFloat64; return true;
    case FG_BF16: *t = ncclBfloat16; return true;
    case FG_F16: *t = ncclFloat16; return true;
    case FG_I32: *t = ncclInt32; return true;
    case FG_I64: *t = ncclInt64; return true;
    case FG_U8: *t = ncclUint8; return true;
    default: return false;
    }
}

static ncclRedOp_t nccl_op(fg_reduce_op op) {
    switch (op) {
    case FG_REDUCE_OP_AVG: return ncclAvg;
    case FG_REDUCE_OP_MIN: return ncclMin;
    case FG_REDUCE_OP_MAX: return ncclMax;
    case FG_REDUCE_OP_PROD: return ncclProd;
    default: return ncclSum;
    }
}

/* after enqueuing: NCCL's result, then the stream, against the timeout */
static FG_MUST_USE fg_status finish(fg_comm *c, const fg__comm_args *a, ncclResult_t r) {
    nccl *n = c->impl;
    double t0 = fg_time();
    if (r != ncclSuccess && r != ncclInProgress) {
        const char *why = g_api.last_error(n->comm);
        kill_comm(n);
        return fg__comm_fail(c, a, FG_EIO, "rank %d: NCCL: %s (%s); communicator aborted", c->rank,
                             g_api.error_string(r), why ? why : "");
    }
    for (;;) {
        if (atomic_load(&c->aborted)) {
            kill_comm(n);
            return fg__comm_fail(c, a, FG_EPEER, "rank %d: aborted (%s)", c->rank, c->abort_why);
        }
        ncclResult_t e = ncclSuccess;
        g_api.async_error(n->comm, &e);
        if (e != ncclSuccess && e != ncclInProgress) {
            const char *why = g_api.last_error(n->comm);
            kill_comm(n);
            return fg__comm_fail(c, a, FG_EPEER,
                                 "rank %d: NCCL reported %s (%s): a peer rank failed; "
                                 "communicator aborted",
                                 c->rank, g_api.error_string(e), why ? why : "");
        }
        if (e == ncclSuccess) {
            cudaError_t q = cudaStreamQuery(n->stream);
            if (q == cudaSuccess) return FG_OK;
            if (q != cudaErrorNotReady) {
                (void)cudaGetLastError();
                kill_comm(n);
                return fg__comm_fail(c, a, FG_EIO, "rank %d: GPU %d: %s; communicator aborted",
                                     c->rank, n->gpu, cudaGetErrorString(q));
            }
        }
        if (fg_time() - t0 > c->timeout_s) {
            kill_comm(n);
            return fg__comm_fail(c, a, FG_ETIMEOUT,
                                 "rank %d: timed out after %.3g s waiting for the NCCL %s of "
                                 "%lld elements to complete: another rank of the %d stalled or "
                                 "died; the NCCL communicator was aborted "
                                 "(FULGUR_COMM_TIMEOUT_S sets the bound)",
                                 c->rank, c->timeout_s, a->name, (long long)a->count, c->size);
        }
        pause_briefly();
    }
}

static FG_MUST_USE fg_status ready(fg_comm *c, const fg__comm_args *a, ncclDataType_t *t) {
    nccl *n = c->impl;
    if (!n || !n->comm)
        return fg__comm_fail(c, a, FG_ESTATE, "rank %d: the NCCL communicator was aborted",
                             c->rank);
    if (!nccl_type(a->dt, t))
        return fg_error(FG_EUNSUPPORTED, "backend nccl: %s of %s: no NCCL type", a->name,
                        fg_dtype_name(a->dt));
    if (cudaSetDevice(n->gpu) != cudaSuccess) {
        (void)cudaGetLastError();
        return fg__comm_fail(c, a, FG_EIO, "rank %d: cudaSetDevice(%d) failed", c->rank, n->gpu);
    }
    return FG_OK;
}

#define N_ (((nccl *)c->impl)->comm)
#define S_ (((nccl *)c->impl)->stream)

static FG_MUST_USE fg_status nccl_allreduce(fg_comm *c, const fg__comm_args *a) {
    ncclDataType_t t;
    FG_TRY(ready(c, a, &t));
    return finish(c, a,
                  g_api.allreduce(a->send, a->recv, (size_t)a->count, t, nccl_op(a->rop), N_, S_));
}
static FG_MUST_USE fg_status nccl_reduce_scatter(fg_comm *c, const fg__comm_args *a) {
    ncclDataType_t t;
    FG_TRY(ready(c, a, &t));
    return finish(
        c, a, g_api.reduce_scatter(a->send, a->recv, (size_t)a->count, t, nccl_op(a->rop), N_, S_));
}
static FG_MUST_USE fg_status nccl_allgather(fg_comm *c, const fg__comm_args *a) {
    ncclDataType_t t;
    FG_TRY(ready(c, a, &t));
    return finish(c, a, g_api.allgather(a->send, a->recv, (size_t)a->count, t, N_, S_));
}
static FG_MUST_USE fg_status nccl_broadcast(fg_comm *c, const fg__comm_args *a) {
    ncclDataType_t t;
    FG_TRY(ready(c, a, &t));
    return finish(c, a, g_api.broadcast(a->send, a->recv, (size_t)a->count, t, a->root, N_, S_));
}
static FG_MUST_USE fg_status nccl_reduce(fg_comm *c, const fg__comm_args *a) {
    ncclDataType_t t;
    FG_TRY(ready(c, a, &t));
    return finish(
        c, a,
        g_api.reduce(a->send, a->recv, (size_t)a->count, t, nccl_op(a->rop), a->root, N_, S_));
}
static FG_MUST_USE fg_status nccl_send(fg_comm *c, const fg__comm_args *a) {
    ncclDataType_t t;
    FG_TRY(ready(c, a, &t));
    return finish(c, a, g_api.send(a->send, (size_t)a->count, t, a->root, N_, S_));
}
static FG_MUST_USE fg_status nccl_recv(fg_comm *c, const fg__comm_args *a) {
    ncclDataType_t t;
    FG_TRY(ready(c, a, &t));
    return finish(c, a, g_api.recv(a->recv, (size_t)a->count, t, a->root, N_, S_));
}
/* alltoall: a group of sends and receives, per peer */
static FG_MUST_USE fg_status nccl_alltoall(fg_comm *c, const fg__comm_args *a) {
    ncclDataType_t t;
    FG_TRY(ready(c, a, &t));
    size_t b = (size_t)a->count * fg_dtype_size(a->dt);
    ncclResult_t r = g_api.group_start();
    for (int p = 0; p < c->size && (r == ncclSuccess || r == ncclInProgress); p++) {
        r = g_api.send((const char *)a->send + (size_t)p * b, (size_t)a->count, t, p, N_, S_);
        if (r == ncclSuccess || r == ncclInProgress)
            r = g_api.recv((char *)a->recv + (size_t)p * b, (size_t)a->count, t, p, N_, S_);
    }
    ncclResult_t e = g_api.group_end();
    return finish(c, a, r == ncclSuccess || r == ncclInProgress ? e : r);
}
/* the barrier and allgatherv go through the bootstrap group (no data on
 * the GPU in the barrier; allgatherv is a broadcast from each rank) */
static FG_MUST_USE fg_status nccl_barrier(fg_comm *c, const fg__comm_args *a) {
    (void)a;
    nccl *n = c->impl;
    return fg_comm_barrier(n->boot);
}
static FG_MUST_USE fg_status nccl_allgatherv(fg_comm *c, const fg__comm_args *a) {
    ncclDataType_t t;
    FG_TRY(ready(c, a, &t));
    size_t e = fg_dtype_size(a->dt);
    ncclResult_t r = g_api.group_start();
    for (int p = 0; p < c->size && (r == ncclSuccess || r == ncclInProgress); p++)
        r = g_api.broadcast(p == c->rank ? a->send : NULL,
                            (char *)a->recv + (size_t)a->displs[p] * e, (size_t)a->counts[p], t, p,
                            N_, S_);
    ncclResult_t g = g_api.group_end();
    return finish(c, a, r == ncclSuccess || r == ncclInProgress ? g : r);
}

const fg__comm_backend fg__comm_nccl_backend = {
    .name = "nccl",
    .init = nccl_init,
    .split = nccl_split,
    .destroy = nccl_destroy,
    .tell_peers = nccl_tell_peers,
    .allreduce = nccl_allreduce,
    .reduce_scatter = nccl_reduce_scatter,
    .allgather = nccl_allgather,
    .allgatherv = nccl_allgatherv,
    .broadcast = nccl_broadcast,
    .reduce = nccl_reduce,
    .barrier = nccl_barrier,
    .alltoall = nccl_alltoall,
    .send = nccl_send,
    .recv = nccl_recv,
};
