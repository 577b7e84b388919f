/* fulgur launch: from what the user asked for (accelerator, devices,
 * strategy, num_nodes) and where this process stands (the environment), to
 * the ranks of a job, and the launchers that start them.
 *
 *   parsing   accelerator, devices and strategy strings as Lightning reads
 *             them; every error names the value and what is allowed;
 *   plan      fg_launch_plan_make: world size, this process's rank, threads
 *             per rank, and which launcher applies;
 *   launchers re-exec (ddp: this process is rank 0 and runs this program
 *             again once per other local rank), fork (ddp_spawn/ddp_fork:
 *             fork the ranks inside the program; rank 0 hands a result back
 *             to the parent), any program on N ranks (fulgur run), and none
 *             when mpirun, srun, torchrun or fulgur run already started us.
 *
 * On CPU a device is a rank: a process with its share of the cores. The CPU
 * devices of a machine are its cores (fg_num_cores), or FULGUR_CPU_DEVICES
 * when set, to run more ranks than cores (tests, debugging on a laptop).
 *
 * The environment contract: every launcher here gives each rank it starts
 * fulgur's variables FULGUR_RANK, FULGUR_WORLD_SIZE, FULGUR_LOCAL_RANK,
 * FULGUR_LOCAL_WORLD_SIZE, FULGUR_NODE_RANK, FULGUR_NUM_NODES,
 * FULGUR_MASTER_ADDR, FULGUR_MASTER_PORT, FULGUR_JOB_ID (fresh for each
 * launch) and torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
 * NODE_RANK, GROUP_RANK, MASTER_ADDR, MASTER_PORT, for programs that read
 * those. fg_cluster_detect (comm.h) reads them back.
 *
 * Processes: each rank a launcher starts gets its own process group (so that
 * stopping a rank, or a rank dying abnormally, ends whatever it started,
 * e.g. a shell's children) and SIGKILL when the launcher dies
 * (PR_SET_PDEATHSIG), so no rank is orphaned. What a rank started in turn
 * (the children of a shell script rank) is ended too when a launcher is
 * killed with SIGKILL: a small guard process ("fulgur-guard", a child of
 * the launcher, one per job while it runs) SIGKILLs each rank's process
 * group when the launcher dies.
 * A launcher reaps its own children by pid: a program that sets SIGCHLD to
 * SIG_IGN or calls waitpid(-1) takes their exit status away from it.
 *
 * Environment settings read here:
 *   FULGUR_CPU_DEVICES   CPU devices of this machine (default: the cores)
 *   FULGUR_NUM_THREADS   kernel threads per rank (default: cores / local ranks)
 *   FULGUR_KILL_GRACE_S  seconds between SIGTERM and SIGKILL when ranks are
 *                        stopped (default 3)
 *   NODE_RANK, FULGUR_NODE_RANK, GROUP_RANK, MASTER_ADDR, MASTER_PORT (and
 *   FULGUR_MASTER_*): for a ddp program started by hand on each of several
 *   nodes, as Lightning's seed shows.
 *
 * Nothing here prints or exits; errors come back as fg_status with the
 * message in fg_last_error(). */
#ifndef FULGUR_LAUNCH_H
#define FULGUR_LAUNCH_H

#include <stddef.h>

#include "fulgur/comm.h"
#include "fulgur/core.h"
#include "fulgur/kinds.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------- parsing */

typedef enum fg_accelerator {
    FG_ACCELERATOR_CPU = 0,
    FG_ACCELERATOR_GPU,     /* CUDA: a build with the CUDA backend, on a machine with a GPU */
    FG_ACCELERATOR_GUARDED, /* the guarded test device (device.h): every build */
} fg_accelerator;

/* Parses an accelerator name: "cpu", "auto" (a GPU when the CUDA backend
 * is built in and a device answers, else the CPU; NULL means "auto"),
 * "gpu" or "cuda", "guarded" (the test device whose memory the host cannot
 * touch: docs/devices.md). Case does not matter. No device is opened.
 * Errors: FG_EUNSUPPORTED for gpu/cuda without a CUDA backend or without a
 * GPU (saying which, and what to use instead) and for accelerators fulgur
 * does not have (tpu, ipu, hpu, mps); FG_EINVAL for anything else, listing
 * the valid names. Thread-safe. */
FG_API FG_MUST_USE fg_status fg_launch_parse_accelerator(const char *s, fg_accelerator *out);

/* The name of an accelerator ("cpu", "gpu"). */
FG_API const char *fg_accelerator_name(fg_accelerator a);

#define FG_DEVICES_MAX 1024

/* Which devices of this machine a job uses, as Lightning reads them:
 *   3, "3"           the first three: ids 0, 1, 2
 *   -1, "-1"         all of them
 *   [1, 3], "1, 3"   those ids ("[1, 3]" and "0," are lists too)
 *   "auto", NULL     one device (id 0) */
typedef struct fg_devices {
    int count;               /* devices used, >= 1 */
    int ids[FG_DEVICES_MAX]; /* their ids, count of them, in the order given */
    int available;           /* devices this machine has (what parsing checked against) */
    bool all;                /* given as -1 */
    bool listed;             /* given as a list of ids rather than a count */
} fg_devices;

/* Parses a devices string against `available` devices (> 0; on CPU pass
 * fg_launch_cpu_devices()). Accepts the forms of fg_devices, with spaces
 * anywhere between tokens. Errors (FG_EINVAL, naming the value and what is
 * allowed): not a number or list (`devices="abc": expected ...`), 0, "",
 * "[]", negative numbers other than -1, a count or id past what the machine
 * has (`devices=5: only 2 CPU devices here (cores); use 1..2 or -1`), an id
 * listed twice (`devices="[1, 1]": device 1 is listed twice`). Thread-safe. */
FG_API FG_MUST_USE fg_status fg_launch_parse_devices(const char *s, int available, fg_devices *out);

/* The same for an integer: k > 0 is the first k devices, -1 all of them; 0
 * and other negatives are errors. Thread-safe. */
FG_API FG_MUST_USE fg_status fg_launch_devices_count(int k, int available, fg_devices *out);

/* The same for a list of ids (Lightning's [1, 3]); n >= 1. Thread-safe. */
FG_API FG_MUST_USE fg_status fg_launch_devices_list(const int *ids, int n, int available,
                                                    fg_devices *out);

/* Writes the devices as a list ("[0, 1, 2]") into buf (always terminated).
 * Returns buf. */
FG_API char *fg_devices_format(const fg_devices *d, char *buf, size_t cap);

/* CPU devices of this machine: FULGUR_CPU_DEVICES if set (1..FG_DEVICES_MAX),
 * else fg_num_cores() (at most FG_DEVICES_MAX). Errors: FG_EINVAL when the
 * variable is not a number in range (the message names it). Thread-safe. */
FG_API FG_MUST_USE fg_status fg_launch_cpu_devices(int *out);

/* Parses a strategy name into fulgur's one list of strategies
 * (fg_strategy_kind): a name or alias of the strategy table (kinds.h,
 * fg_strategy_kind_parse; fg_strategy_names lists them all), any case.
 * "auto" (or NULL) means ddp when devices x num_nodes is more than 1, else
 * single; the choice needs `ndevices` and `num_nodes` (pass 1 and 1 if
 * unknown). fsdp_shard_grad_op, fsdp_no_shard, fsdp_full_shard,
 * fsdp_hybrid_shard and hybrid: FG_EINVAL naming fulgur's spelling (fsdp
 * with a sharding strategy, or ddp2). A kind of one process without
 * replicas (single) with several devices, a kind of one process (single,
 * dp) with several nodes: FG_EINVAL saying what to use. Anything else:
 * FG_EINVAL listing every name. Thread-safe. */
FG_API FG_MUST_USE fg_status fg_launch_parse_strategy(const char *s, int ndevices, int num_nodes,
                                                      fg_strategy_kind *out);

/* The offload a strategy name implies, as Lightning registers the name (the
 * alias's offload in the strategy table, kinds.h): deepspeed_stage_2_offload
 * and deepspeed_stage_3_offload put the optimizer state on the cpu (and
 * stage 3's parameters too), deepspeed_stage_3_offload_nvme both on nvme,
 * fsdp_cpu_offload both on the cpu (FSDP's cpu_offload); FG_OFFLOAD_NONE for
 * both with every other name (NULL too). Either pointer may be NULL.
 * Thread-safe. */
FG_API void fg_launch_strategy_offload(const char *s, fg_offload_device *optimizer,
                                       fg_offload_device *params);

/* Parses a precision setting into fg_precision_kind (the policy table of
 * kinds.h, which holds what each means): the six names and their short forms
 * "64", "32", "16", "bf16"; NULL means "32-true". Case does not matter.
 * Errors: FG_EUNSUPPORTED for a setting whose row says it is not built,
 * naming the value and what is available (fg_precision_available); FG_EINVAL
 * for anything else, listing the valid names. Every setting is built today.
 * *out is set only on FG_OK. Thread-safe. */
FG_API FG_MUST_USE fg_status fg_launch_parse_precision(const char *s, fg_precision_kind *out);

/* ---------------------------------------------------------------- plan */

/* fg_launcher and fg_launcher_name are in kinds.h: each strategy's row names
 * the launcher a job of more than one rank gets. */

/* What the user asked for. All-zero (or NULL) means the defaults. */
typedef struct fg_launch_opts {
    const char *accelerator; /* NULL = "auto" */
    const char *devices;     /* NULL = "auto" (one device, or the launcher's ranks on this node) */
    const char *strategy;    /* NULL = "auto" */
    const char *precision;   /* NULL = "32-true" */
    int num_nodes;           /* 0 = 1, or the launcher's nodes */
    int threads_per_rank;    /* 0 = FULGUR_NUM_THREADS, else cores / local ranks */
} fg_launch_opts;

/* How the job runs, from fg_launch_plan_make. */
typedef struct fg_launch_plan {
    fg_accelerator accelerator;
    fg_devices devices;        /* per node */
    fg_strategy_kind strategy; /* "auto" resolved */
    fg_precision_kind precision;
    int num_nodes;
    fg_launcher launcher;
    bool launched;        /* the environment says a launcher already started this process */
    int world_size;       /* ranks in the job (1 for single and dp) */
    int local_world_size; /* ranks on this node */
    int rank;             /* this process's global rank once launched; -1 for the
                             parent of a fork launch, which is no rank */
    int local_rank;       /* likewise, on this node */
    int node_rank;
    int threads_per_rank; /* kernel threads of each rank (dp: of the one process) */
    const char
        *threads_from;       /* "threads_per_rank", "FULGUR_NUM_THREADS" or "cores / local ranks" */
    bool accelerator_auto;   /* accelerator "auto" (or NULL) was asked for */
    fg_cluster_info cluster; /* what this process will be: the environment's
                                when launched, else what the launcher gives it
                                (job_id "" and master_port 0 until it launches) */
} fg_launch_plan;

/* Makes the plan.
 *   opts: what the user asked for (NULL = defaults). Borrowed.
 *   env:  where this process stands; NULL = fg_cluster_detect(). Borrowed.
 *         env->source "none" (or world_size 1 with source "none") means not
 *         launched.
 *   out:  the plan.
 * Rules:
 *   already launched (env names a rank): launcher none; devices "auto" (or
 *     NULL) means the ranks the launcher started on this node, and
 *     num_nodes 0 its nodes, so that a program with default settings runs
 *     as DDP under `fulgur run --nproc-per-node 4`; ddp needs the
 *     launcher's world size to equal devices x num_nodes, and says so
 *     naming both; ddp_spawn/ddp_fork, single and dp under a launcher of
 *     more than one rank are errors that say to use ddp;
 *   not launched: single -> none; dp -> threads; ddp -> re-exec (none when
 *     the world is one rank); ddp_spawn/ddp_fork -> fork. With num_nodes > 1
 *     this process is one node's rank 0: its node rank comes from
 *     FULGUR_NODE_RANK, NODE_RANK or GROUP_RANK and the master from
 *     FULGUR_MASTER_ADDR/PORT or MASTER_ADDR/PORT (an error says what to set,
 *     or to start it with `fulgur run --nnodes`, mpirun or srun);
 *     ddp_spawn with num_nodes > 1 is an error (use ddp);
 *   threads per rank: opts->threads_per_rank, else FULGUR_NUM_THREADS, else
 *     cores / local ranks (at least 1).
 * Errors: FG_EINVAL, FG_EUNSUPPORTED (from parsing), FG_EMISMATCH (the
 * launcher's world size disagrees). Thread-safe. */
FG_API FG_MUST_USE fg_status fg_launch_plan_make(const fg_launch_opts *opts,
                                                 const fg_cluster_info *env, fg_launch_plan *out);

/* Kernel threads for each of `local_ranks` ranks on this machine:
 * FULGUR_NUM_THREADS if set (an integer >= 1, else FG_EINVAL naming it),
 * else fg_num_cores() / local_ranks, at least 1. *from (may be NULL) gets
 * "FULGUR_NUM_THREADS" or "cores / local ranks". Thread-safe. */
FG_API FG_MUST_USE fg_status fg_launch_threads_per_rank(int local_ranks, int *out,
                                                        const char **from);

/* Writes one line describing the plan into buf ("ddp on cpu, 2 ranks (2 per
 * node x 1 node, devices [0, 1]), not launched, this process is rank 0,
 * launcher re-exec, 1 thread per rank (cores / local ranks), precision
 * 32-true"). Returns buf. */
FG_API char *fg_launch_plan_format(const fg_launch_plan *p, char *buf, size_t cap);

/* ------------------------------------------------------- the contract */

/* Sets the environment contract for `info` in this process's environment
 * (fulgur's and torchrun's names; FULGUR_JOB_ID and the master only when
 * set in info). fg_cluster_detect() then returns info. Uses setenv: not
 * thread-safe, call before starting threads that read the environment.
 * Errors: FG_EINVAL (fg_cluster_validate's), FG_ENOMEM. */
FG_API FG_MUST_USE fg_status fg_launch_export(const fg_cluster_info *info);

/* Removes every variable fg_launch_export sets. Not thread-safe. */
FG_API void fg_launch_unexport(void);

/* Writes a fresh job id ("fg-<pid>-<microseconds>") into buf. */
FG_API void fg_launch_new_job_id(char *buf, size_t cap);

/* --------------------------------------------------------- rank exits */

/* How one rank's process ended. */
typedef struct fg_rank_exit {
    int rank; /* global rank; -1 when this describes nothing */
    int pid;
    int code;   /* exit code, or -1 when it was killed by a signal */
    int signal; /* the signal that killed it, else 0 */
} fg_rank_exit;

/* The shell's view of an exit: the code, or 128 + signal. */
FG_API int fg_rank_exit_status(const fg_rank_exit *e);

/* Writes "rank 1 (pid 4242) was killed by signal 9 (SIGKILL)" or "rank 1
 * (pid 4242) exited with code 3" into buf. Returns buf. */
FG_API char *fg_rank_exit_format(const fg_rank_exit *e, char *buf, size_t cap);

/* ------------------------------------------------ supervised processes */

/* A group of rank processes started on this machine by a launcher and
 * watched by a supervisor thread. When one dies abnormally (a non-zero exit
 * or a signal) the supervisor calls on_failure and stops the others: SIGTERM
 * to each rank's process group, SIGKILL after the grace period (at once to a stopped one). Until
 * the job is freed, its processes die with the thread that supervises them (PR_SET_PDEATHSIG), so a
 * crash of this program leaves no orphans. */
typedef struct fg_job fg_job;

/* Options of a job; all-zero (or NULL) means the defaults. */
typedef struct fg_job_opts {
    double grace_s; /* SIGTERM -> SIGKILL; <= 0: FULGUR_KILL_GRACE_S, else 3 */
    /* Called once, on the supervisor thread, when the first rank fails and
     * before the others are stopped (a launcher aborts its communicator
     * here, so that rank 0 leaves a collective at once). Must not call
     * fg_job functions on the same job except fg_job_check. */
    void (*on_failure)(void *ud, const fg_rank_exit *e);
    void *ud;
} fg_job_opts;

/* Which processes to start. Global rank = node_rank * local_world_size +
 * local rank. */
typedef struct fg_job_spec {
    /* The program and its arguments, NULL-terminated; argv[0] without a '/'
     * is searched in PATH (before anything starts: an error if absent).
     * NULL: this program again (/proc/self/exe) with this process's
     * arguments (/proc/self/cmdline), the re-exec launcher. Borrowed. */
    const char *const *argv;
    int nprocs;              /* processes to start, >= 1 */
    int first_local_rank;    /* local rank of the first; 1 when the caller is local rank 0 */
    int local_world_size;    /* ranks on this node in all; 0 = first_local_rank + nprocs */
    int node_rank;           /* 0 .. num_nodes-1 */
    int num_nodes;           /* 0 = 1 */
    const char *master_addr; /* NULL = "127.0.0.1" */
    int master_port;         /* 0 = a free port of this machine */
    const char *job_id;      /* NULL = a fresh one (fg_launch_new_job_id) */
} fg_job_spec;

/* Starts the processes and their supervisor. They live as long as the
 * supervisor: if this process exits (or is killed) before fg_job_wait saw
 * them end, they are killed.
 *   spec: what to start. Borrowed for the call.
 *   opts: NULL = defaults. Copied.
 * Returns the job, owned by the caller (fg_job_free), or NULL on failure
 * (fg_last_error, fg_last_status).
 * Each process gets this process's environment plus the contract for its
 * rank, default signal dispositions, an empty signal mask, and its own
 * process group. The job's master port and job id are fg_job_info's.
 * Errors: FG_EINVAL (bad spec, program not found), FG_EIO (fork, thread),
 * FG_ENOMEM; nothing is left running on failure. Call from one thread at a
 * time; the job's functions below are thread-safe. */
FG_API fg_job *fg_job_start(const fg_job_spec *spec, const fg_job_opts *opts);

/* The re-exec launcher (plan->launcher FG_LAUNCHER_REEXEC): starts local
 * ranks 1 .. local_world_size-1 running this program again with the same
 * arguments, then exports the contract for rank 0 into this process's own
 * environment (fg_launch_export: not thread-safe), so that this process
 * goes on as rank 0 and fg_cluster_detect()/fg_comm_new(NULL, ...) find
 * the job. plan->cluster's master and job id are used when set, else a free
 * port and a fresh id. Returns the job of the other ranks, owned by the
 * caller (fg_job_free), or NULL on failure (fg_last_error, fg_last_status:
 * FG_EINVAL when the plan is not a re-exec plan, and fg_job_start's). */
FG_API fg_job *fg_launch_reexec(const fg_launch_plan *plan, const fg_job_opts *opts);

/* FG_OK while no rank has failed; else FG_EPEER with a message naming the
 * first that failed ("rank 2 (pid 4242) was killed by signal 9 (SIGKILL)").
 * Never blocks. Thread-safe. */
FG_API FG_MUST_USE fg_status fg_job_check(fg_job *j);

/* fg_comm_new for a process whose fellow ranks are this job's (the
 * re-exec launcher's rank 0): the same, except that it gives up as soon as
 * one of the job's processes fails, instead of waiting at the rendezvous
 * for the comm timeout for a rank that will never come (a rank that dies
 * after joining is the comm layer's dead-peer detection's, or
 * fg_job_opts.on_failure's, to report). The init runs on a helper thread;
 * given up on, it finishes on its own and frees what it made.
 *   j: the job (NULL: plain fg_comm_new). info, opts: as fg_comm_new.
 * Returns the communicator, owned by the caller (fg_comm_free), or NULL on
 * failure (fg_last_error, fg_last_status): fg_comm_new's errors; FG_EPEER
 * naming the rank that failed ("joining the communicator: rank 2 (pid 4242)
 * exited with code 3"), noticed within about 20 ms. Collective with the
 * job's ranks, as fg_comm_new. */
FG_API fg_comm *fg_job_comm_new(fg_job *j, const fg_cluster_info *info, const fg_comm_opts *opts);

/* Waits until every process has ended, or timeout_s passed (< 0: no limit).
 * Does not stop anything on its own, except that a failure makes the
 * supervisor stop the rest. Returns FG_OK when all exited with code 0 (or
 * were ended by fg_job_stop), FG_EPEER naming the first that failed ("rank 2
 * (pid 4242) was killed by signal 9 (SIGKILL); stopped the other 2 ranks"),
 * FG_ETIMEOUT naming one still running. Thread-safe. */
FG_API FG_MUST_USE fg_status fg_job_wait(fg_job *j, double timeout_s);

/* Sends `sig` to every running rank (to its process group), as a launcher
 * forwards SIGINT and SIGTERM. Failures after a forwarded signal do not
 * make the supervisor stop the other ranks (they got the signal too).
 * Returns how many ranks it was sent to. Thread-safe. */
FG_API int fg_job_signal(fg_job *j, int sig);

/* Stops every running rank: SIGTERM, then SIGKILL after the grace period (at once to a stopped
 * rank); returns once all have ended, with how many it stopped. Thread-safe. */
FG_API int fg_job_stop(fg_job *j);

/* The state of a job. */
typedef struct fg_job_status {
    int nprocs;          /* processes started */
    int running;         /* still running */
    fg_rank_exit failed; /* the first that failed; rank -1 while none */
    int stopped;         /* ranks the launcher stopped (after a failure or fg_job_stop) */
    int signaled;        /* the last signal sent by fg_job_signal, 0 if none */
} fg_job_status;

/* Fills *out. Thread-safe. */
FG_API void fg_job_get_status(fg_job *j, fg_job_status *out);

/* The i-th process (0 .. nprocs-1): its pid and its exit (rank -1 in *e
 * while it runs; e may be NULL). Returns the pid, or -1 if i is out of
 * range. Thread-safe. */
FG_API int fg_job_proc(fg_job *j, int i, fg_rank_exit *e);

/* The contract the job's processes got: world size, node, master (the port
 * chosen when 0 was asked for) and job id; rank and local rank are those of
 * the first process. Thread-safe. */
FG_API void fg_job_info(const fg_job *j, fg_cluster_info *out);

/* Stops whatever still runs (as fg_job_stop), ends the supervisor and frees
 * the job. fg_job_free(NULL) is a no-op. */
FG_API void fg_job_free(fg_job *j);

/* --------------------------------------------------------- fork launch */

/* Options of fg_launch_fork; all-zero (or NULL) means the defaults. */
typedef struct fg_fork_opts {
    double grace_s;       /* as fg_job_opts */
    int threads_per_rank; /* > 0: each child calls fg_set_num_threads with it; 0: untouched */
    const char *job_id;   /* NULL = a fresh one */
    int master_port;      /* exported as the master port; 0 = none */
} fg_fork_opts;

/* What fg_launch_fork hands back to the parent. */
typedef struct fg_fork_result {
    void *data; /* rank 0's last fg_launch_send_result blob (fg_alloc'd, the
                   caller frees it with fg_free), NULL if it sent none */
    size_t len;
    fg_rank_exit failed; /* the first rank that failed; rank -1 if none */
} fg_fork_result;

/* The fork launcher (ddp_spawn, ddp_fork): forks nprocs children; child r
 * exports the contract for rank r of nprocs on this machine (so that
 * fg_comm_new(NULL, ...) joins the group), sets its log rank, calls
 * fn(r, nprocs, arg) and exits with its return value (0 = success). Rank 0
 * may hand a byte blob back with fg_launch_send_result. The parent, which
 * is no rank, waits for all; when one fails it stops the others.
 *   out: the result; zeroed first, then filled (also on failure: which rank).
 * Returns FG_OK when every rank returned 0; FG_EPEER naming the first that
 * failed, with its own last error message when fn returned non-zero
 * ("rank 1 (pid 4242) exited with code 1: allreduce #3: ..."); FG_EINVAL,
 * FG_EIO, FG_ENOMEM. Fork before this process starts threads of its own
 * (kernels, loaders): a child has only the calling thread. Blocks until
 * all ranks end. Not thread-safe (one fork launch at a time). */
FG_API FG_MUST_USE fg_status fg_launch_fork(int nprocs,
                                            int (*fn)(int rank, int world_size, void *arg),
                                            void *arg, const fg_fork_opts *opts,
                                            fg_fork_result *out);

/* In the parent of a fork launch under way (inside fg_launch_fork, e.g.
 * from a signal handler): sends signal `sig` to every rank still running,
 * so that a stop asked of the parent (SIGTERM, SIGINT, SIGUSR1) reaches
 * the ranks, which are process groups of their own. Returns the number of
 * ranks signalled; 0 outside a fork launch's parent. Async-signal-safe. */
FG_API int fg_launch_fork_signal(int sig);

/* In a rank started by fg_launch_fork: sends `len` bytes to the parent,
 * replacing what was sent before (call it at every checkpoint of the state
 * the parent wants; the last one before rank 0 exits is delivered, and only
 * when every rank succeeded). Errors: FG_ESTATE outside a fork-launched
 * rank or on a rank other than 0; FG_EIO. */
FG_API FG_MUST_USE fg_status fg_launch_send_result(const void *data, size_t len);

/* --------------------------------------------------- the rendezvous */

/* Nodes started each on its own (torchrun's --nnodes N --node-rank R
 * --master-addr A --master-port P) meet at node 0, which listens on P
 * (src/launch/rdzv.c has the protocol). */
typedef struct fg_rdzv fg_rdzv;

typedef struct fg_rdzv_opts {
    const char *master_addr; /* node 0's address, as the other nodes reach it */
    int master_port;         /* 1..65535: node 0 listens there */
    int node_rank;           /* 0 .. num_nodes-1 */
    int num_nodes;           /* >= 2 */
    int nproc_per_node;      /* ranks on each node: every node must say the same */
    const char *job_id;      /* every node must say the same; NULL: "none" */
    double timeout_s;        /* the join's wait; <= 0: FULGUR_RDZV_TIMEOUT_S, else 300 */
    bool mpi_server;         /* node 0 starts Open MPI's ompi-server; its URI is the value */
    /* Elastic (torchrun's --nnodes MIN:MAX): min_nodes below num_nodes (MAX).
     * The machine of master_addr hosts (node 0; a second node there joins
     * it), node_rank is ignored (-1 is fine) and node 0 gives the ranks in
     * order of arrival: the job forms with MAX nodes, or with those that
     * came FULGUR_RDZV_LAST_CALL_S (10 s) after the MIN-th, within the
     * timeout. 0: num_nodes, a fixed job. */
    int min_nodes;
    int round; /* node 0: the round it hands every node (its restart count) */
    /* Node 0: the last round it may hold (its --max-restarts). A node that
     * comes while round < last_round is held (told so, connected) and joins
     * the next round first; from last_round on, or after fg_rdzv_end, it is
     * told at once that it cannot join, naming the job and what happened. */
    int last_round;
    /* Read while waiting (NULL: never): non-zero ends the wait with FG_EPEER
     * (a launcher's signal handler sets it). Borrowed for the call. */
    const volatile int *cancel;
    /* Asked while waiting (NULL: never), as often as *cancel is read: true
     * ends the wait as cancel does (fg_agent_run reads its signalfd here). */
    bool (*cancelled)(void *ud);
    void *cancel_ud;
} fg_rdzv_opts;

/* Joins the rendezvous: node 0 waits until every node has joined (or the
 * timeout), checks them and hands each the value (the ompi-server URI, or
 * "-" without mpi_server), which lands in value (cap bytes) on every node.
 * Returns the membership, owned by the caller (fg_rdzv_free), or NULL:
 * FG_EMISMATCH when the master port is taken on node 0, when two nodes say
 * the same node rank, when nodes disagree on num_nodes or nproc_per_node
 * (the world sizes) or on the job; FG_ETIMEOUT naming the node ranks that
 * never came (node 0) or node 0 that never answered (the others); FG_EPEER
 * on the other nodes with node 0's reason when the rendezvous failed there.
 * Blocks up to the timeout (a little longer on the other nodes). */
FG_API fg_rdzv *fg_rdzv_join(const fg_rdzv_opts *opts, char *value, size_t cap);

/* The next round of the same job (a restart), on the same membership r:
 * node 0 keeps its port (nodes that came during the last round are in
 * first) and `round` is the round it hands out; the others meet it again.
 * Errors as fg_rdzv_join (then free r); FG_ESTATE after fg_rdzv_end. */
FG_API FG_MUST_USE fg_status fg_rdzv_rejoin(fg_rdzv *r, int round, char *value, size_t cap);

/* Node 0: no round follows (the job is over, `what` says how, e.g. "its
 * ranks finished"): every held node, and every node that comes until
 * fg_rdzv_free, is told at once "job ID ended at HH:MM:SS UTC (what); start
 * a new --rdzv-id". No-op on the other nodes. */
FG_API void fg_rdzv_end(fg_rdzv *r, const char *what);

/* The job formed: this node's rank, the number of nodes and node 0's round
 * (the restart count every node uses). */
FG_API void fg_rdzv_layout(const fg_rdzv *r, int *node_rank, int *num_nodes, int *round);

/* Whether addr (a name or an IPv4 address) is one of this machine's. */
FG_API bool fg_rdzv_is_local(const char *addr);

/* During the job, never blocking: FG_OK, or FG_EPEER with the reason in why
 * (cap bytes) when another node failed or left (node 0 then tells every
 * other node to stop, with that reason). */
FG_API FG_MUST_USE fg_status fg_rdzv_poll(fg_rdzv *r, char *why, size_t cap);

/* This node's ranks ended: why = NULL when they all exited 0, else the
 * failure, which node 0 passes on to every node. */
FG_API void fg_rdzv_finish(fg_rdzv *r, const char *why);

/* Node 0, after fg_rdzv_finish: waits up to wait_s for the other nodes to
 * say their ranks ended (so that ompi-server outlives them). FG_ETIMEOUT
 * names how many still run. FG_OK at once on other nodes. */
FG_API FG_MUST_USE fg_status fg_rdzv_wait_done(fg_rdzv *r, double wait_s);

/* Closes the connections and stops node 0's ompi-server (node 0 ends the
 * job first if fg_rdzv_end was not called). NULL: no-op. */
FG_API void fg_rdzv_free(fg_rdzv *r);

/* ------------------------------------------------------------ the agent */

/* torchrun's agent: the program's ranks on this machine, met with the
 * other machines' at the rendezvous when there are several, restarted after
 * a failure, with the signals that stop a job forwarded to every rank.
 * Zero fields are the defaults. */
#define FG_HOSTS_MAX 256 /* hosts in one list */

/* A job started from this machine on a list of hosts through Open MPI's
 * mpirun (fulgur run --hosts). */
typedef struct fg_hosts_opts {
    const char *hosts;     /* "h1:2,h2:2" or "h1,h2" */
    int default_slots;     /* ranks on a host given without ":N" */
    const char *mpirun;    /* NULL: "mpirun" from PATH */
    const char *rsh_agent; /* Open MPI's plm_rsh_agent; NULL: its default (ssh) */
    const char *network;   /* a subnet or interface for Open MPI's TCP traffic, or NULL */
} fg_hosts_opts;

/* The mpirun command (NULL-terminated, free with fg_hosts_command_free) of
 * prog on the first `first` hosts of h (<= 0: all), with the flags the
 * hosts need and this process's FULGUR_*, HOROVOD_*, OMP_NUM_THREADS and
 * LD_LIBRARY_PATH passed on (src/launch/hosts.c); *nlisted (may be NULL)
 * the hosts listed. FG_EINVAL naming a bad entry of the list. A caller may
 * exec it (mpirun's own signals, output and exit status). */
FG_API FG_MUST_USE fg_status fg_hosts_command(const fg_hosts_opts *h, int first,
                                              const char *const *prog, char ***argv_out,
                                              int *nlisted);
FG_API void fg_hosts_command_free(char **argv);

typedef struct fg_agent_opts {
    const char *const *argv; /* the program and its arguments, NULL-terminated. Borrowed */
    int nproc_per_node;      /* ranks on this machine, >= 1 */
    int num_nodes;           /* machines (MAX when elastic); 0 = 1 */
    int min_nodes;           /* elastic (torchrun's --nnodes MIN:MAX): MIN < num_nodes; 0: fixed */
    int node_rank;           /* this machine's, fixed jobs (elastic: given by node 0) */
    const char *master_addr; /* node 0's address; NULL = "127.0.0.1" */
    int master_port;         /* 0: a free port alone, 29500 with several nodes */
    const char *job_id;      /* NULL: fresh alone, master_addr:master_port with several */
    bool no_rdzv;            /* several nodes without a rendezvous (the contract only) */
    double rdzv_timeout_s;   /* as fg_rdzv_opts.timeout_s */
    bool mpi_server;         /* node 0 starts ompi-server (the ranks' Open MPI world) */
    int max_restarts;        /* start the ranks again after a failure, up to this many times */
    double grace_s;          /* a forwarded signal: SIGKILL after; <= 0: FULGUR_KILL_GRACE_S, 3 */
    double stop_grace_s;     /* the job's SIGTERM -> SIGKILL when it stops ranks (fg_job_opts) */
    /* Non-NULL: the job runs on these hosts through mpirun, started from
     * here, as a child started again after a failure (the fields above that
     * apply: argv, num_nodes / min_nodes over the list, max_restarts). Each
     * start asks every host still in the job whether it answers (the rsh
     * agent runs `true` there, 10 s at most) and takes the first MAX that
     * do; with MIN < MAX the host of the first failed rank (read from
     * mpirun's report, passed on to stderr as it comes) leaves the job. */
    const fg_hosts_opts *hosts;
} fg_agent_opts;

typedef struct fg_agent_result {
    int exit_code;       /* the shell's status: 0; the failed rank's (128 + signal when killed);
                            128 + a forwarded signal; 75 a resumable stop; 127 not started */
    int restarts;        /* restarts made (the last round's restart count) */
    int signal;          /* the forwarded signal that ended the job, 0 if none */
    fg_rank_exit failed; /* the rank that failed last (rank -1 if none) */
    int node_rank, num_nodes; /* the last round's layout */
} fg_agent_result;

/* Runs the agent until the job ends. Each round exports the contract,
 * FULGUR_RESTART_COUNT and TORCHELASTIC_RESTART_COUNT (node 0's round with
 * several nodes) and TORCHELASTIC_MAX_RESTARTS into this process's
 * environment, which the ranks inherit. A failed round (a rank's non-zero
 * exit or signal, another node's failure) starts again while restarts are
 * left; not after a forwarded signal, a rank's exit 75 (stopped with a
 * checkpoint to resume from) or exit 2 (a usage error, which would repeat).
 * SIGINT, SIGTERM, SIGHUP, SIGQUIT and SIGUSR1 are blocked in the calling
 * thread and read from a signalfd for the run (block them in every other
 * thread of the process first); each is forwarded to every rank, and a rank
 * still running grace_s after one of the first four gets SIGKILL. What it
 * does is said through fg_log (info: the layout, restarts; error: the
 * failure), never printed. Returns FG_OK when every rank exited 0; FG_EPEER
 * naming the failure and the restart count ("rank 0 (pid 42) exited with
 * code 1; ... (after 1 restart of --max-restarts 1)"), a forwarded signal or
 * a resumable stop; the rendezvous's errors; FG_EINVAL for bad options. *out
 * is filled in every case. */
FG_API FG_MUST_USE fg_status fg_agent_run(const fg_agent_opts *opts, fg_agent_result *out);

/* The checks of fg_agent_run's options, before anything starts. */
FG_API FG_MUST_USE fg_status fg_agent_check(const fg_agent_opts *opts);

/* SLURM's auto-requeue (Lightning's SLURMEnvironment(auto_requeue=True)):
 * runs `scontrol requeue $SLURM_JOB_ID` (the array job and task under an
 * array; FULGUR_SCONTROL names another scontrol), waiting up to timeout_s
 * (<= 0: 60). Call from one rank after the checkpoint is saved: SLURM ends
 * the job's processes and starts the job again with SLURM_RESTART_COUNT
 * above 0. FG_EINVAL outside a SLURM job; FG_EIO with scontrol's message
 * when it fails; FG_ETIMEOUT. */
FG_API FG_MUST_USE fg_status fg_launch_slurm_requeue(double timeout_s);

#ifdef __cplusplus
}
#endif
#endif
