/* Private header of the comm layer: the communicator object, the operation
 * descriptor every backend receives, the backend table, and the reduction
 * kernels. The api (comm.c) validates arguments, numbers operations, runs
 * the asynchronous queue and the FULGUR_COMM_CHECK mode; backends only move
 * data and report failures through fg__comm_fail. */
#ifndef FULGUR_COMM_IMPL_H
#define FULGUR_COMM_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "core/core_impl.h"
#include "fulgur/comm.h"

typedef enum fg__comm_opcode {
    FG_OP_ALLREDUCE,
    FG_OP_REDUCE_SCATTER,
    FG_OP_ALLGATHER,
    FG_OP_ALLGATHERV,
    FG_OP_BROADCAST,
    FG_OP_REDUCE,
    FG_OP_BARRIER,
    FG_OP_ALLTOALL,
    FG_OP_SEND,
    FG_OP_RECV,
    FG_OP_SPLIT, /* the allgather inside fg_comm_split */
    FG_OP_CHECK, /* the allgather of call signatures (FULGUR_COMM_CHECK) */
    FG_OP_COUNT
} fg__comm_opcode;

extern const char *const fg__comm_op_names[FG_OP_COUNT];

/* One operation as the backend sees it: validated, with in-place settled. */
typedef struct fg__comm_args {
    fg__comm_opcode op;
    const char *name; /* the user's operation, for messages ("allreduce") */
    const void *send;
    void *recv;
    int64_t count; /* elements: allreduce/broadcast/reduce: count; reduce_scatter:
                      recvcount; allgather(v): sendcount; alltoall: per peer; send/recv */
    fg_dtype dt;
    fg_reduce_op rop;
    int root;              /* broadcast/reduce root, send/recv peer */
    const int64_t *counts; /* allgatherv: size entries */
    const int64_t *displs; /* allgatherv: size entries, always filled */
    uint64_t seq;          /* number of this operation on the communicator (from 1) */
} fg__comm_args;

typedef struct fg__comm_backend {
    const char *name;
    /* The device kinds whose memory the backend reads and writes itself, a
     * bit (1u << kind) each; 0: host memory only (shm, MPI), so device
     * buffers go through host staging in the layers above. */
    unsigned device_kinds;
    /* Fills c->impl for the world group; c->rank/size/... are set. */
    FG_MUST_USE fg_status (*init)(fg_comm *c, const fg_cluster_info *info);
    /* Builds `child` (rank/size/node fields and group_id set; NULL on ranks
     * that join no group). Called by every rank of `parent`, with the same
     * `color` and `key` the user gave. */
    FG_MUST_USE fg_status (*split)(fg_comm *parent, fg_comm *child, int color, int key);
    void (*destroy)(fg_comm *c);
    /* Tells peers this rank gave up (may run on another thread). */
    void (*tell_peers)(fg_comm *c);
    FG_MUST_USE fg_status (*allreduce)(fg_comm *c, const fg__comm_args *a);
    FG_MUST_USE fg_status (*reduce_scatter)(fg_comm *c, const fg__comm_args *a);
    FG_MUST_USE fg_status (*allgather)(fg_comm *c, const fg__comm_args *a);
    FG_MUST_USE fg_status (*allgatherv)(fg_comm *c, const fg__comm_args *a);
    FG_MUST_USE fg_status (*broadcast)(fg_comm *c, const fg__comm_args *a);
    FG_MUST_USE fg_status (*reduce)(fg_comm *c, const fg__comm_args *a);
    FG_MUST_USE fg_status (*barrier)(fg_comm *c, const fg__comm_args *a);
    FG_MUST_USE fg_status (*alltoall)(fg_comm *c, const fg__comm_args *a);
    FG_MUST_USE fg_status (*send)(fg_comm *c, const fg__comm_args *a);
    FG_MUST_USE fg_status (*recv)(fg_comm *c, const fg__comm_args *a);
} fg__comm_backend;

extern const fg__comm_backend fg__comm_shm_backend;
extern const fg__comm_backend fg__comm_hybrid_backend;
#ifdef FULGUR_HAVE_MPI
extern const fg__comm_backend fg__comm_mpi_backend;
#endif
#ifdef FULGUR_HAVE_CUDA
extern const fg__comm_backend fg__comm_nccl_backend; /* nccl.c */
#endif

struct fg_comm_req {
    fg__comm_args a;
    int64_t *vec; /* owned copy of allgatherv counts and displs */
    fg_status status;
    char msg[512];
    int done; /* under comm->mu */
    struct fg_comm_req *next;
    fg_comm *comm;
};

struct fg_comm {
    const fg__comm_backend *be;
    void *impl;
    int rank, size, local_rank, local_size, node_rank, num_nodes;
    int *node_of;  /* node rank of each member, size entries */
    int *world_of; /* rank in the world group of each member */
    double timeout_s;
    bool check;
    bool no_async;     /* the backend cannot run on another thread: i-forms run at once */
    char job_key[80];  /* sanitized job id: names shm segments */
    char group_id[96]; /* "w" for the world, parent id + ".s<n>c<color>" below */
    uint64_t seq;      /* collectives issued (caller thread) */
    uint64_t p2p_seq;  /* sends and receives issued, numbered apart */
    int nsplit;

    /* broken state: the first error that broke the group, then every call fails */
    _Atomic int broken;
    fg_status broken_status;
    char broken_msg[512];
    _Atomic int aborted;
    char abort_why[256]; /* fg_comm_abort_reason's, written before aborted is set */

    /* asynchronous queue, run in order by the progress thread */
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    pthread_t thread;
    bool thread_started, stop;
    fg_comm_req *head, *tail;
    int pending; /* queued or running */
};

/* Whether Open MPI can form this job's world: started by mpirun, by srun
 * with PMIx or PMI2, or by fulgur run's rendezvous (FULGUR_MPI_SERVER). */
bool fg__comm_mpi_world(const fg_cluster_info *info);

/* Marks the communicator broken with a message "<op> #<seq>: <msg>" (the
 * first one wins), sets it as this thread's error, and returns st. */
FG_MUST_USE fg_status fg__comm_fail(fg_comm *c, const fg__comm_args *a, fg_status st,
                                    const char *fmt, ...) FG_PRINTF(4, 5);

/* ----------------------------------------------------- reduction kernels */

/* dst[i] = op(srcs[0][i], srcs[1][i], ..., srcs[nsrc-1][i]) in that order,
 * for i < n; also written to dst2 if not NULL. bf16/f16 accumulate in f32
 * and round once. FG_REDUCE_OP_AVG divides the sum by `divisor`. dst may alias any
 * source element-wise (same index). */
void fg__reduce(fg_dtype dt, fg_reduce_op op, void *dst, void *dst2, const void *const *srcs,
                int nsrc, int64_t n, int divisor);

/* memcpy; with `nt`, non-temporal stores (outputs larger than the caches). */
void fg__copy(void *dst, const void *src, size_t n, bool nt);

#endif
