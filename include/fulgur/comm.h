/* fulgur comm: collectives over typed buffers, on one machine or many.
 *
 * A communicator (fg_comm) is a group of ranks: processes, never threads.
 * Every collective is called by all ranks of the group in the same order
 * with the same count, dtype, op and root; it moves plain buffers of
 * `count` elements of an fg_dtype and knows nothing of tensors.
 *
 * Backends (chosen at fg_comm_new, the same for the whole group):
 *   shm  the embedded default when every rank runs on one machine: one
 *        shared-memory segment per group, chunked and pipelined
 *        reduce-scatter + allgather, deterministic results;
 *   mpi  Open MPI (when fulgur was built with it), the way across machines;
 *   nccl reserved for GPUs (not implemented yet: FG_EUNSUPPORTED);
 *   hybrid shm among the ranks of a node and mpi among nodes (reduce-scatter
 *        inside the node, allreduce of each shard across nodes, all-gather
 *        inside the node), chosen by auto under mpirun when the job spans
 *        several nodes with several ranks on each.
 *
 * Ranks find each other through the environment (fg_cluster_detect): fulgur's
 * own FULGUR_* variables, torchrun's, Open MPI's or SLURM's, so that a program
 * started by hand, by mpirun or by a launcher works the same.
 *
 * Errors: every call returns fg_status and leaves a message (fg_last_error).
 * Every wait has a timeout (FULGUR_COMM_TIMEOUT_S, default 300 s). On shm a
 * peer that dies is noticed within about 2 s: the others return FG_EPEER with
 * a message like "allreduce #17: rank 1 (pid 1234) died". After FG_EPEER,
 * FG_ETIMEOUT or FG_EMISMATCH a communicator is broken: later calls fail at
 * once with the first message; free it.
 *
 * Threads: a communicator is used from one thread at a time (the caller);
 * asynchronous operations run on a progress thread of the communicator.
 * Different communicators may be used from different threads. */
#ifndef FULGUR_COMM_H
#define FULGUR_COMM_H

#include "fulgur/core.h"
#include "fulgur/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ cluster */

#define FG_CLUSTER_ADDR_MAX 256
#define FG_CLUSTER_JOB_MAX 128

/* Where this process stands in the job: a plain value, filled by
 * fg_cluster_detect or by a launcher (custom cluster environments). */
typedef struct fg_cluster_info {
    int rank;                              /* 0 .. world_size-1 */
    int world_size;                        /* >= 1 */
    int local_rank;                        /* rank among the processes of this machine */
    int local_world_size;                  /* processes on this machine */
    int node_rank;                         /* 0 .. num_nodes-1 */
    int num_nodes;                         /* >= 1 */
    char master_addr[FG_CLUSTER_ADDR_MAX]; /* "" if unknown */
    int master_port;                       /* 0 if unknown */
    char job_id[FG_CLUSTER_JOB_MAX];       /* "" if unknown; names shm segments */
    const char *source; /* "explicit", "fulgur", "torchrun", "openmpi", "slurm" or "none" */
    char derived[256];  /* how values not set by name were derived ("" if none), for messages */
} fg_cluster_info;

/* Reads the environment, first match wins:
 *   fulgur:   FULGUR_RANK, FULGUR_WORLD_SIZE, FULGUR_LOCAL_RANK,
 *             FULGUR_LOCAL_WORLD_SIZE, FULGUR_NODE_RANK, FULGUR_NUM_NODES,
 *             FULGUR_MASTER_ADDR, FULGUR_MASTER_PORT, FULGUR_JOB_ID
 *   torchrun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
 *             GROUP_RANK (or NODE_RANK), MASTER_ADDR, MASTER_PORT,
 *             TORCHELASTIC_RUN_ID
 *   openmpi:  OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE, _NODE_RANK
 *   slurm:    SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID,
 *             SLURM_NNODES (or SLURM_JOB_NUM_NODES), SLURM_JOB_ID,
 *             SLURM_TASKS_PER_NODE ("2(x3),1") and SLURM_NTASKS_PER_NODE for
 *             the local size, SLURM_JOB_NODELIST (or SLURM_NODELIST) for the
 *             master, as Lightning's SLURMEnvironment: MASTER_ADDR, else the
 *             first host of the node list; MASTER_PORT, else 15000 + the job
 *             id's last 4 digits (12910 without a job id). Inconsistent values
 *             are refused, naming both: a node list of another length than
 *             SLURM_NNODES, tasks per node that do not add up to SLURM_NTASKS
 *             or differ from SLURM_NTASKS_PER_NODE, nodes with different task
 *             counts, a rank that is not node offset + SLURM_LOCALID (fulgur
 *             numbers the ranks of a node consecutively: srun's block
 *             distribution). A job named "bash" or "interactive" (salloc's
 *             shell, as Lightning) is not a SLURM launch.
 * torchrun's and fulgur's rank, local rank and node rank must agree too:
 * RANK = node rank x LOCAL_WORLD_SIZE + LOCAL_RANK, GROUP_RANK = NODE_RANK
 * when both are set, GROUP_WORLD_SIZE x LOCAL_WORLD_SIZE = WORLD_SIZE.
 * A source is chosen by its rank variable (FULGUR_RANK, RANK,
 * OMPI_COMM_WORLD_RANK, SLURM_PROCID). Missing local values default to a
 * single machine (local = global, one node). Nothing set gives a world of 1
 * with source "none". FULGUR_JOB_ID, if set, overrides the job id of any
 * source. Validates: numbers parse, 0 <= rank < world_size, local_rank <
 * local_world_size <= world_size, node_rank < num_nodes; the error
 * (FG_EINVAL) names the bad variable. Thread-safe. */
FG_API FG_MUST_USE fg_status fg_cluster_detect(fg_cluster_info *out);

/* Checks a filled fg_cluster_info the same way (launchers, custom
 * environments). FG_EINVAL names the bad field. */
FG_API FG_MUST_USE fg_status fg_cluster_validate(const fg_cluster_info *info);

/* SLURM's compressed host list ("node[01-03,7],gpu[1-2]-ib,login"), as
 * scontrol show hostnames expands it: the host at `index` into out (cap
 * bytes; skipped when index is out of range or out is NULL) and the number
 * of hosts into *count (may be NULL). Several bracket groups in one name
 * multiply; zero padding is kept. FG_EINVAL names the bad part (an
 * unclosed bracket, a range that runs backwards, an empty name); a host
 * longer than cap is FG_EINVAL too. Thread-safe. */
FG_API FG_MUST_USE fg_status fg_cluster_nodelist_host(const char *nodelist, int index, char *out,
                                                      size_t cap, int *count);

/* --------------------------------------------------------- communicator */

typedef struct fg_comm fg_comm;
typedef struct fg_comm_req fg_comm_req;

typedef enum fg_reduce_op {
    FG_REDUCE_OP_SUM,
    FG_REDUCE_OP_AVG, /* sum / group size; integers divide truncating toward zero */
    FG_REDUCE_OP_MIN,
    FG_REDUCE_OP_MAX,
    FG_REDUCE_OP_PROD,
    FG_REDUCE_OP_COUNT
} fg_reduce_op;

typedef enum fg_comm_backend_kind {
    FG_COMM_AUTO = 0, /* FULGUR_BACKEND, else mpi under mpirun, else shm on one node */
    FG_COMM_SHM,
    FG_COMM_MPI,
    FG_COMM_NCCL,
    FG_COMM_HYBRID, /* shm inside each node, mpi across nodes */
    FG_COMM_BACKEND_COUNT
} fg_comm_backend_kind;

/* Options of fg_comm_new; all-zero (or NULL) means the defaults. */
typedef struct fg_comm_opts {
    fg_comm_backend_kind backend; /* FG_COMM_AUTO: see fg_comm_new */
    double timeout_s;             /* every wait; <= 0: FULGUR_COMM_TIMEOUT_S, else 300 */
    int check;                    /* 1 on, -1 off, 0: FULGUR_COMM_CHECK (default off) */
} fg_comm_opts;

/* Creates the world communicator. Collective over all ranks of `info`.
 *   info: where this process stands; NULL = fg_cluster_detect(). Borrowed.
 *   opts: NULL = defaults.
 * Returns the communicator, owned by the caller (fg_comm_free), or NULL on
 * failure (fg_last_error, fg_last_status).
 * Backend auto: FULGUR_BACKEND (auto|shm|mpi|hybrid|nccl) if set; else, when
 * launched by mpirun (info->source "openmpi") and fulgur was built with MPI,
 * hybrid when num_nodes > 1 and local_world_size > 1, else mpi; else shm
 * when num_nodes == 1; else FG_EUNSUPPORTED, naming the command that starts
 * the job across machines (fulgur run --hosts). hybrid without mpirun runs
 * its inter-node level on shm: nodes simulated on one machine (tests).
 * shm: ranks meet at a rendezvous point named after the uid, the job
 * (job_id and master_port, whichever are set, else "default") and the group: local rank 0
 * creates the group's shared-memory segment and hands it to the others, who
 * retry until the timeout. The segment has no name in /dev/shm (a memfd) and
 * the rendezvous point is an abstract unix socket, so nothing is ever left
 * behind, even after a crash. Two jobs of one user running at the same time
 * on one machine need different job ids (FULGUR_JOB_ID or MASTER_PORT).
 * Errors: FG_EINVAL (bad info or options), FG_ETIMEOUT (a rank did not come:
 * the message names it), FG_EPEER, FG_EUNSUPPORTED, FG_EIO, FG_ENOMEM. */
FG_API fg_comm *fg_comm_new(const fg_cluster_info *info, const fg_comm_opts *opts);

/* Frees a communicator after waiting for its pending requests (each up to
 * the timeout). Not collective: peers that still wait on this rank get
 * FG_EPEER ("rank 1 left"). fg_comm_free(NULL) is a no-op. Requests not yet
 * waited on are freed too. */
FG_API void fg_comm_free(fg_comm *c);

/* Breaks the communicator for every rank: peers blocked in (or later
 * entering) a collective return FG_EPEER naming this rank (shm; the mpi
 * backend only marks this rank's side). Pending requests fail. Safe to call
 * from another thread (a launcher's watchdog). The handle must still be
 * freed. */
FG_API void fg_comm_abort(fg_comm *c);

/* fg_comm_abort with the reason (a launcher's "rank 1 (pid 4242) was killed
 * by signal 9 (SIGKILL)"): the errors this rank's calls return from then on
 * end with it, so that they name the cause rather than the abort. why may
 * be NULL (then as fg_comm_abort); it is copied (up to 255 bytes). Safe to
 * call from another thread, as fg_comm_abort. */
FG_API void fg_comm_abort_reason(fg_comm *c, const char *why);

/* Splits `c` into sub-groups: ranks with the same `color` form one group,
 * ordered by `key`, ties by rank in `c`. Collective over `c`. color < 0
 * (FG_COMM_SPLIT_NONE) joins no group and gets *out = NULL. Local ranks and
 * node ranks of the new group follow from the node of each member (intra-node
 * and inter-node groups for the hybrid strategies). The new communicator has
 * its own segment/communicator and is independent of `c` afterwards. */
#define FG_COMM_SPLIT_NONE (-1)
FG_API FG_MUST_USE fg_status fg_comm_split(fg_comm *c, int color, int key, fg_comm **out);

/* Accessors. Thread-safe. */
FG_API int fg_comm_rank(const fg_comm *c);
FG_API int fg_comm_size(const fg_comm *c);
FG_API int fg_comm_local_rank(const fg_comm *c);
FG_API int fg_comm_local_size(const fg_comm *c);
FG_API int fg_comm_node_rank(const fg_comm *c);
FG_API int fg_comm_num_nodes(const fg_comm *c);
FG_API const char *fg_comm_backend_name(const fg_comm *c); /* "shm", "mpi", "hybrid", "nccl" */
/* Whether the backend reads and writes memory of that device kind itself
 * (the CPU's always; nccl: cuda); shm, MPI and hybrid read host memory
 * only, so a layer with buffers on a device stages them through the host
 * (docs/devices.md). */
FG_API bool fg_comm_reads_device(const fg_comm *c, fg_device kind);
/* Whether this build of fulgur has the backend (shm and hybrid always; mpi
 * when built with Open MPI; nccl not yet). Thread-safe. */
FG_API bool fg_comm_backend_built(fg_comm_backend_kind kind);
FG_API const char *fg_reduce_op_name(fg_reduce_op op); /* "sum", ...; "?" if invalid */

/* ---------------------------------------------------------- collectives
 *
 * All are collective over the group (same order, count, dtype, op, root on
 * every rank), take `count` in elements, and accept count 0 (no data moves).
 * dtypes: f64, f32, bf16, f16, i32, i64, u8, u16.
 * bf16 and f16 reductions compute in f32 and round once.
 * Integer sums and products wrap around (two's complement).
 * Buffers are borrowed for the call (for asynchronous forms, until
 * fg_comm_wait/fg_comm_test reports completion).
 *
 * Determinism (shm): every element is reduced once, in rank order
 * 0, 1, ..., N-1, by one rank, and copied to the others: all ranks get the
 * bitwise same result, and the same inputs give the same bits on every run.
 *
 * Errors: FG_EINVAL (negative count, unknown dtype or op, NULL buffer with
 * count > 0, root or peer out of range), FG_EPEER (a peer died or aborted),
 * FG_ETIMEOUT (a peer did not arrive: the message names it), FG_EMISMATCH
 * (ranks called different operations: with FULGUR_COMM_CHECK=1 the message
 * names the rank and both calls; shm also notices most mismatches without
 * it), FG_ESTATE (the communicator is broken by an earlier error). */

/* recv[i] = op over ranks of send[i], on every rank; count elements each.
 * In place: send == recv. */
FG_API FG_MUST_USE fg_status fg_comm_allreduce(fg_comm *c, const void *send, void *recv,
                                               int64_t count, fg_dtype dt, fg_reduce_op op);

/* send has size*recvcount elements; rank r receives the reduction of block r
 * (elements r*recvcount .. (r+1)*recvcount-1) in recv (recvcount elements).
 * In place: recv == send + rank*recvcount elements (NCCL's convention). */
FG_API FG_MUST_USE fg_status fg_comm_reduce_scatter(fg_comm *c, const void *send, void *recv,
                                                    int64_t recvcount, fg_dtype dt,
                                                    fg_reduce_op op);

/* recv (size*sendcount elements) gets every rank's send (sendcount
 * elements) in rank order. In place: send == recv + rank*sendcount elements. */
FG_API FG_MUST_USE fg_status fg_comm_allgather(fg_comm *c, const void *send, void *recv,
                                               int64_t sendcount, fg_dtype dt);

/* Varying counts: rank q contributes counts[q] elements, placed at
 * recv + displs[q] (displs NULL: packed in rank order). counts and displs
 * (size entries each) must be the same on all ranks; sendcount == counts[rank].
 * In place: send == recv + displs[rank] elements. */
FG_API FG_MUST_USE fg_status fg_comm_allgatherv(fg_comm *c, const void *send, int64_t sendcount,
                                                void *recv, const int64_t *counts,
                                                const int64_t *displs, fg_dtype dt);

/* recv on every rank gets root's send. send is read on root only; recv is
 * written on every rank (root too). In place: send == recv. */
FG_API FG_MUST_USE fg_status fg_comm_broadcast(fg_comm *c, const void *send, void *recv,
                                               int64_t count, fg_dtype dt, int root);

/* recv on root = op over ranks of send; recv is not touched on other ranks
 * (may be NULL there). In place: send == recv. */
FG_API FG_MUST_USE fg_status fg_comm_reduce(fg_comm *c, const void *send, void *recv, int64_t count,
                                            fg_dtype dt, fg_reduce_op op, int root);

/* Returns once every rank has entered the barrier. */
FG_API FG_MUST_USE fg_status fg_comm_barrier(fg_comm *c);

/* send and recv have size*count elements; block q of send goes to rank q,
 * block q of recv comes from rank q. In place: send == recv. */
FG_API FG_MUST_USE fg_status fg_comm_alltoall(fg_comm *c, const void *send, void *recv,
                                              int64_t count, fg_dtype dt);

/* Point to point: messages between two ranks arrive in the order sent; a
 * send matches the next recv from that peer, which must name the same count
 * and dtype (else FG_EMISMATCH on the receiver). Small messages (shm: up to
 * 16 KiB) are buffered and send returns at once; larger ones return when the
 * receiver has taken the last piece, so two ranks that both send large
 * messages to each other before receiving deadlock (until the timeout), as
 * with MPI. Not collective; ordered with the asynchronous requests. */
FG_API FG_MUST_USE fg_status fg_comm_send(fg_comm *c, const void *buf, int64_t count, fg_dtype dt,
                                          int peer);
FG_API FG_MUST_USE fg_status fg_comm_recv(fg_comm *c, void *buf, int64_t count, fg_dtype dt,
                                          int peer);

/* --------------------------------------------------------- asynchronous
 *
 * The i-forms queue the operation and return at once with a request; a
 * progress thread of the communicator runs it while the caller computes.
 * Requests on one communicator complete in issue order, and a blocking call
 * made while requests are pending runs after them. Argument errors are
 * reported by the i-call itself (and *req is NULL); communication errors by
 * fg_comm_wait/fg_comm_test. Buffers must stay valid and untouched until the
 * request completes. */
FG_API FG_MUST_USE fg_status fg_comm_iallreduce(fg_comm *c, const void *send, void *recv,
                                                int64_t count, fg_dtype dt, fg_reduce_op op,
                                                fg_comm_req **req);
FG_API FG_MUST_USE fg_status fg_comm_ireduce_scatter(fg_comm *c, const void *send, void *recv,
                                                     int64_t recvcount, fg_dtype dt,
                                                     fg_reduce_op op, fg_comm_req **req);
FG_API FG_MUST_USE fg_status fg_comm_iallgather(fg_comm *c, const void *send, void *recv,
                                                int64_t sendcount, fg_dtype dt, fg_comm_req **req);
FG_API FG_MUST_USE fg_status fg_comm_ibroadcast(fg_comm *c, const void *send, void *recv,
                                                int64_t count, fg_dtype dt, int root,
                                                fg_comm_req **req);
FG_API FG_MUST_USE fg_status fg_comm_ireduce(fg_comm *c, const void *send, void *recv,
                                             int64_t count, fg_dtype dt, fg_reduce_op op, int root,
                                             fg_comm_req **req);
FG_API FG_MUST_USE fg_status fg_comm_ibarrier(fg_comm *c, fg_comm_req **req);

/* Waits for the request, frees it, and returns its status (with its message
 * in fg_last_error). fg_comm_wait(NULL) returns FG_OK. */
FG_API FG_MUST_USE fg_status fg_comm_wait(fg_comm_req *req);

/* Sets *done without blocking. Returns FG_OK, or the request's error once
 * done (the request must still be waited on to free it). */
FG_API FG_MUST_USE fg_status fg_comm_test(fg_comm_req *req, bool *done);

#ifdef __cplusplus
}
#endif
#endif
