/* The comm api: argument checks, backend choice, operation numbering, the
 * FULGUR_COMM_CHECK mode, split, and the asynchronous queue.
 *
 * Invariants: backends see only valid arguments; every operation gets the
 * next sequence number at issue, in the caller's thread, so blocking and
 * asynchronous calls share one numbering; collectives and point to point
 * are numbered apart (a collective's number is part of the signature the
 * ranks compare, and only two ranks take part in a send/recv, so a rank
 * that sent or received more than another must still meet it at the next
 * collective); at most one thread runs backend
 * code of a communicator at a time (the caller when nothing is queued, else
 * the progress thread), so operations run in issue order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_impl.h"

const char *const fg__comm_op_names[FG_OP_COUNT] = {
    [FG_OP_ALLREDUCE] = "allreduce", [FG_OP_REDUCE_SCATTER] = "reduce_scatter",
    [FG_OP_ALLGATHER] = "allgather", [FG_OP_ALLGATHERV] = "allgatherv",
    [FG_OP_BROADCAST] = "broadcast", [FG_OP_REDUCE] = "reduce",
    [FG_OP_BARRIER] = "barrier",     [FG_OP_ALLTOALL] = "alltoall",
    [FG_OP_SEND] = "send",           [FG_OP_RECV] = "recv",
    [FG_OP_SPLIT] = "split",         [FG_OP_CHECK] = "check",
};

static const char *const k_rop_names[FG_REDUCE_OP_COUNT] = {"sum", "avg", "min", "max", "prod"};

const char *fg_reduce_op_name(fg_reduce_op op) {
    return (int)op >= 0 && op < FG_REDUCE_OP_COUNT ? k_rop_names[op] : "?";
}

fg_status fg__comm_fail(fg_comm *c, const fg__comm_args *a, fg_status st, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* after an abort with a reason, say the reason (not only who aborted) */
    if (atomic_load(&c->aborted) && c->abort_why[0] && !strstr(msg, c->abort_why)) {
        size_t n = strlen(msg);
        snprintf(msg + n, sizeof msg - n, ": %s", c->abort_why);
    }
    fg_error(st, "%s #%llu: %s", a->name, (unsigned long long)a->seq, msg);
    int zero = 0;
    if (atomic_compare_exchange_strong(&c->broken, &zero, 1)) {
        c->broken_status = st;
        snprintf(c->broken_msg, sizeof c->broken_msg, "%s", fg_last_error());
    }
    return st;
}

/* ------------------------------------------------------------- backends */

static const struct {
    const char *name;
    const fg__comm_backend *be;
} k_backends[FG_COMM_BACKEND_COUNT] = {
    [FG_COMM_AUTO] = {"auto", NULL},
    [FG_COMM_SHM] = {"shm", &fg__comm_shm_backend},
#ifdef FULGUR_HAVE_MPI
    [FG_COMM_MPI] = {"mpi", &fg__comm_mpi_backend},
#else
    [FG_COMM_MPI] = {"mpi", NULL},
#endif
#ifdef FULGUR_HAVE_CUDA
    [FG_COMM_NCCL] = {"nccl", &fg__comm_nccl_backend},
#else
    [FG_COMM_NCCL] = {"nccl", NULL},
#endif
    [FG_COMM_HYBRID] = {"hybrid", &fg__comm_hybrid_backend},
};

bool fg_comm_backend_built(fg_comm_backend_kind kind) {
    return (int)kind > 0 && kind < FG_COMM_BACKEND_COUNT && k_backends[kind].be != NULL;
}

/* The command line of this process, quoted for a shell where needed (at
 * most cap bytes; "PROGRAM" when it cannot be read). */
static void this_command(char *out, size_t cap) {
    snprintf(out, cap, "PROGRAM");
    FILE *f = fopen("/proc/self/cmdline", "rb");
    if (!f) return;
    char raw[1024];
    size_t n = fread(raw, 1, sizeof raw - 1, f);
    fclose(f);
    if (!n) return;
    raw[n] = 0;
    size_t k = 0;
    out[0] = 0;
    for (size_t i = 0; i < n && k + 4 < cap; i += strlen(raw + i) + 1) {
        const char *w = raw + i;
        bool plain = *w != 0;
        for (const char *q = w; *q; q++)
            plain &= (*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') ||
                     (*q >= '0' && *q <= '9') || strchr("-_./=:,+@%", *q) != NULL;
        k += (size_t)snprintf(out + k, cap - k, plain ? "%s%s" : "%s'%s'", k ? " " : "", w);
    }
    if (k >= cap) snprintf(out + cap - 4, 4, "...");
}

/* What to run instead when ranks on several machines have no Open MPI. */
static FG_MUST_USE fg_status across_machines(const fg_cluster_info *info, const char *why) {
    char cmd[600], hosts[200];
    this_command(cmd, sizeof cmd);
    const char *a0 = info->master_addr[0] ? info->master_addr : "HOST0";
    int per = info->local_world_size;
    snprintf(hosts, sizeof hosts, info->num_nodes == 2 ? "%s:%d,HOST1:%d" : "%s:%d,HOST1:%d,...",
             a0, per, per);
    return fg_error(FG_EUNSUPPORTED,
                    "num_nodes=%d: %s; fulgur moves data between machines through Open MPI (fulgur "
                    "%s built with it), so start the job once, from one machine: fulgur run "
                    "--hosts %s -- %s (HOST1 = node 1's host name); or on each machine fulgur run "
                    "--nnodes %d --node-rank R --master-addr %s --nproc-per-node %d, or srun "
                    "--mpi=pmix",
                    info->num_nodes, why, k_backends[FG_COMM_MPI].be ? "is" : "was not", hosts, cmd,
                    info->num_nodes, a0, per);
}

bool fg__comm_mpi_world(const fg_cluster_info *info) {
    if (!k_backends[FG_COMM_MPI].be || !info->source) return false;
    if (!strcmp(info->source, "openmpi")) return true; /* mpirun */
    const char *server = getenv("FULGUR_MPI_SERVER");
    if (server && *server && info->num_nodes > 1) return true; /* fulgur run's rendezvous */
    /* srun's direct launch: Open MPI reads the world from Slurm's PMIx or PMI2 */
    const char *pmix = getenv("PMIX_RANK"), *pmi = getenv("PMI_RANK");
    return !strcmp(info->source, "slurm") && ((pmix && *pmix) || (pmi && *pmi));
}

static FG_MUST_USE fg_status pick_backend(const fg_cluster_info *info, fg_comm_backend_kind want,
                                          const fg__comm_backend **out) {
    if ((int)want < 0 || want >= FG_COMM_BACKEND_COUNT)
        return fg_error(FG_EINVAL, "fg_comm_new: backend=%d: unknown", (int)want);
    const char *env = getenv("FULGUR_BACKEND");
    if (want == FG_COMM_AUTO && env && *env) {
        int k = -1;
        for (int i = 0; i < FG_COMM_BACKEND_COUNT; i++)
            if (!strcmp(env, k_backends[i].name)) k = i;
        if (k < 0)
            return fg_error(FG_EINVAL,
                            "FULGUR_BACKEND=\"%s\": expected auto, shm, mpi, hybrid or nccl", env);
        want = (fg_comm_backend_kind)k;
    }
    bool mpirun = fg__comm_mpi_world(info);
    bool slurm = info->source && !strcmp(info->source, "slurm");
    if (want == FG_COMM_AUTO) {
        if (mpirun && (info->num_nodes > 1 || !slurm))
            want = info->num_nodes > 1 && info->local_world_size > 1 ? FG_COMM_HYBRID : FG_COMM_MPI;
        else if (info->num_nodes == 1) want = FG_COMM_SHM;
        else
            return across_machines(info, slurm ? "srun started this task without PMIx (srun "
                                                 "--mpi=pmix, or MpiDefault=pmix in slurm.conf)"
                                               : "this process was not started by mpirun, "
                                                 "srun or fulgur run");
    }
    if (want == FG_COMM_SHM && info->num_nodes > 1)
        return across_machines(info, "backend shm works on one machine only");
    if (want == FG_COMM_MPI && !mpirun && k_backends[FG_COMM_MPI].be && info->num_nodes > 1)
        return across_machines(info, "backend mpi needs the ranks started by mpirun, srun "
                                     "--mpi=pmix or fulgur run");
    if (!k_backends[want].be) {
        if (want == FG_COMM_NCCL)
            return fg_error(FG_EUNSUPPORTED,
                            "backend nccl is not implemented yet: use shm, mpi or hybrid");
        return fg_error(FG_EUNSUPPORTED,
                        "backend mpi: fulgur was built without Open MPI (install libopenmpi-dev "
                        "openmpi-bin and rebuild)");
    }
    *out = k_backends[want].be;
    return FG_OK;
}

/* A job id usable in a segment name: [A-Za-z0-9_.-], at most 60 chars. */
static void make_job_key(const fg_cluster_info *info, char *out, size_t cap) {
    /* both when both are known: torchrun's run id is "none" unless set */
    char raw[FG_CLUSTER_JOB_MAX + 16];
    if (info->job_id[0] && info->master_port)
        snprintf(raw, sizeof raw, "%s-p%d", info->job_id, info->master_port);
    else if (info->job_id[0]) snprintf(raw, sizeof raw, "%s", info->job_id);
    else if (info->master_port) snprintf(raw, sizeof raw, "p%d", info->master_port);
    else snprintf(raw, sizeof raw, "default");
    size_t n = strlen(raw);
    if (n > 60) {
        uint64_t h = 1469598103934665603ull;
        for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)raw[i]) * 1099511628211ull;
        snprintf(out, cap, "h%016llx", (unsigned long long)h);
        return;
    }
    for (size_t i = 0; i <= n; i++) {
        char ch = raw[i];
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                  (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '.' || ch == 0;
        out[i] = ok ? ch : '_';
    }
}

/* --------------------------------------------------------- construction */

static fg_comm *comm_new(void) {
    fg_comm *c = fg_calloc(1, sizeof *c);
    if (!c) return NULL;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv_work, NULL);
    pthread_cond_init(&c->cv_done, NULL);
    return c;
}

static void comm_delete(fg_comm *c) {
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv_work);
    pthread_cond_destroy(&c->cv_done);
    fg_free(c->node_of);
    fg_free(c->world_of);
    fg_free(c);
}

static FG_MUST_USE fg_status comm_create(const fg_cluster_info *info, const fg_comm_opts *opts,
                                         fg_comm **out) {
    *out = NULL;
    fg_cluster_info detected;
    if (!info) {
        FG_TRY(fg_cluster_detect(&detected));
        info = &detected;
    } else {
        FG_TRY(fg_cluster_validate(info));
    }
    fg_comm_opts o = opts ? *opts : (fg_comm_opts){0};
    const fg__comm_backend *be = NULL;
    FG_TRY(pick_backend(info, o.backend, &be));
    double timeout = o.timeout_s;
    if (timeout <= 0) {
        FG_TRY(fg__env_double("FULGUR_COMM_TIMEOUT_S", 300.0, &timeout));
        if (!(timeout > 0))
            return fg_error(FG_EINVAL,
                            "FULGUR_COMM_TIMEOUT_S=%s: must be a positive number of seconds",
                            getenv("FULGUR_COMM_TIMEOUT_S"));
    }
    bool check = o.check > 0;
    if (o.check == 0) {
        long v;
        FG_TRY(fg__env_int("FULGUR_COMM_CHECK", 0, &v));
        check = v != 0;
    }

    fg_comm *c = comm_new();
    if (!c) return fg_error_wrap(FG_ENOMEM, "fg_comm_new");
    c->be = be;
    c->rank = info->rank;
    c->size = info->world_size;
    c->local_rank = info->local_rank;
    c->local_size = info->local_world_size;
    c->node_rank = info->node_rank;
    c->num_nodes = info->num_nodes;
    c->timeout_s = timeout;
    c->check = check;
    make_job_key(info, c->job_key, sizeof c->job_key);
    snprintf(c->group_id, sizeof c->group_id, "w");
    c->node_of = fg_calloc((size_t)c->size, sizeof(int));
    c->world_of = fg_calloc((size_t)c->size, sizeof(int));
    if (!c->node_of || !c->world_of) {
        comm_delete(c);
        return fg_error_wrap(FG_ENOMEM, "fg_comm_new");
    }
    for (int i = 0; i < c->size; i++) {
        c->world_of[i] = i;
        c->node_of[i] = info->local_world_size == info->world_size ? 0 : i / info->local_world_size;
    }
    fg_status st = be->init(c, info);
    if (st != FG_OK) {
        comm_delete(c);
        return fg_error_wrap(st, "fg_comm_new (backend %s, rank %d of %d)", be->name, info->rank,
                             info->world_size);
    }
    *out = c;
    return FG_OK;
}

fg_comm *fg_comm_new(const fg_cluster_info *info, const fg_comm_opts *opts) {
    fg_comm *c;
    return comm_create(info, opts, &c) == FG_OK ? c : NULL;
}

int fg_comm_rank(const fg_comm *c) { return c ? c->rank : -1; }
int fg_comm_size(const fg_comm *c) { return c ? c->size : 0; }
int fg_comm_local_rank(const fg_comm *c) { return c ? c->local_rank : -1; }
int fg_comm_local_size(const fg_comm *c) { return c ? c->local_size : 0; }
int fg_comm_node_rank(const fg_comm *c) { return c ? c->node_rank : -1; }
int fg_comm_num_nodes(const fg_comm *c) { return c ? c->num_nodes : 0; }
const char *fg_comm_backend_name(const fg_comm *c) { return c ? c->be->name : "?"; }

bool fg_comm_reads_device(const fg_comm *c, fg_device kind) {
    if (!c) return false;
    if (kind == FG_CPU) return true;
    return (int)kind >= 0 && kind < FG_DEVICE_KIND_COUNT && (c->be->device_kinds >> kind) & 1u;
}

/* ------------------------------------------------------------ execution */

static bool is_collective(fg__comm_opcode op) { return op != FG_OP_SEND && op != FG_OP_RECV; }

static int64_t op_count(const fg_comm *c, const fg__comm_args *a) {
    if (a->op == FG_OP_BARRIER) return 1;
    if (a->op != FG_OP_ALLGATHERV) return a->count;
    int64_t t = 0;
    for (int q = 0; q < c->size; q++) t += a->counts[q];
    return t;
}

typedef struct call_sig {
    int32_t op, dt, rop, root;
    int64_t count;
    uint64_t seq, vhash;
} call_sig;

static call_sig sig_of(const fg_comm *c, const fg__comm_args *a) {
    call_sig s;
    memset(&s, 0, sizeof s);
    s.op = a->op;
    s.dt = a->dt;
    s.rop = a->rop;
    s.root = a->root;
    s.count = op_count(c, a);
    s.seq = a->seq;
    if (a->op == FG_OP_ALLGATHERV) {
        uint64_t h = 1469598103934665603ull;
        for (int q = 0; q < c->size; q++) {
            h = (h ^ (uint64_t)a->counts[q]) * 1099511628211ull;
            h = (h ^ (uint64_t)a->displs[q]) * 1099511628211ull;
        }
        s.vhash = h;
    }
    return s;
}

static void describe(const call_sig *s, char *buf, size_t cap) {
    const char *name = s->op >= 0 && s->op < FG_OP_COUNT ? fg__comm_op_names[s->op] : "?";
    const char *dt = fg_dtype_name((fg_dtype)s->dt);
    switch (s->op) {
    case FG_OP_BARRIER: snprintf(buf, cap, "barrier #%llu", (unsigned long long)s->seq); break;
    case FG_OP_ALLREDUCE:
    case FG_OP_REDUCE_SCATTER:
        snprintf(buf, cap, "%s #%llu (count %lld, %s, %s)", name, (unsigned long long)s->seq,
                 (long long)s->count, dt, fg_reduce_op_name((fg_reduce_op)s->rop));
        break;
    case FG_OP_REDUCE:
        snprintf(buf, cap, "reduce #%llu (count %lld, %s, %s, root %d)", (unsigned long long)s->seq,
                 (long long)s->count, dt, fg_reduce_op_name((fg_reduce_op)s->rop), s->root);
        break;
    case FG_OP_BROADCAST:
        snprintf(buf, cap, "broadcast #%llu (count %lld, %s, root %d)", (unsigned long long)s->seq,
                 (long long)s->count, dt, s->root);
        break;
    case FG_OP_ALLGATHERV:
        snprintf(buf, cap, "allgatherv #%llu (total %lld, %s, counts hash %llx)",
                 (unsigned long long)s->seq, (long long)s->count, dt, (unsigned long long)s->vhash);
        break;
    default:
        snprintf(buf, cap, "%s #%llu (count %lld, %s)", name, (unsigned long long)s->seq,
                 (long long)s->count, dt);
        break;
    }
}

/* FULGUR_COMM_CHECK: all ranks exchange what they are about to call; if
 * they differ, every rank fails with a message naming the odd ones. */
static FG_MUST_USE fg_status check_call(fg_comm *c, const fg__comm_args *a) {
    int n = c->size;
    call_sig mine = sig_of(c, a);
    call_sig *all = fg_alloc(sizeof(call_sig) * (size_t)n);
    if (!all) return fg__comm_fail(c, a, FG_ENOMEM, "out of memory");
    fg__comm_args ca = {.op = FG_OP_CHECK,
                        .name = a->name,
                        .send = &mine,
                        .recv = all,
                        .count = (int64_t)sizeof mine,
                        .dt = FG_U8,
                        .seq = a->seq};
    fg_status st = c->be->allgather(c, &ca);
    if (st != FG_OK) {
        fg_free(all);
        return st;
    }
    int best = 0, best_votes = 0;
    for (int i = 0; i < n; i++) {
        int v = 0;
        for (int j = 0; j < n; j++) v += !memcmp(&all[i], &all[j], sizeof mine);
        if (v > best_votes) {
            best = i;
            best_votes = v;
        }
    }
    if (best_votes == n) {
        fg_free(all);
        return FG_OK;
    }
    char ref[200], odd[200], ranks[128] = "";
    describe(&all[best], ref, sizeof ref);
    int first_odd = -1;
    size_t k = 0;
    for (int j = 0; j < n; j++)
        if (memcmp(&all[best], &all[j], sizeof mine)) {
            if (first_odd < 0) first_odd = j;
            if (k < sizeof ranks - 12)
                k += (size_t)snprintf(ranks + k, sizeof ranks - k, "%s%d", k ? ", " : "", j);
        }
    describe(&all[first_odd], odd, sizeof odd);
    fg_free(all);
    if (best_votes * 2 > n)
        return fg__comm_fail(c, a, FG_EMISMATCH,
                             "rank %s called %s but the other ranks called %s (FULGUR_COMM_CHECK)",
                             ranks, odd, ref);
    return fg__comm_fail(
        c, a, FG_EMISMATCH,
        "ranks disagree: rank %d called %s but rank %d called %s (FULGUR_COMM_CHECK)", first_odd,
        odd, best, ref);
}

static FG_MUST_USE fg_status exec_op(fg_comm *c, const fg__comm_args *a) {
    if (atomic_load(&c->broken))
        return fg_error(c->broken_status == FG_OK ? FG_ESTATE : c->broken_status,
                        "%s #%llu: the communicator is broken by an earlier error: %s", a->name,
                        (unsigned long long)a->seq, c->broken_msg);
    if (c->aborted)
        return fg__comm_fail(c, a, FG_EPEER, "the communicator was aborted (fg_comm_abort)");
    if (c->check && is_collective(a->op)) FG_TRY(check_call(c, a));
    if (is_collective(a->op) && a->op != FG_OP_BARRIER && op_count(c, a) == 0) return FG_OK;
    const fg__comm_backend *be = c->be;
    switch (a->op) {
    case FG_OP_ALLREDUCE: return be->allreduce(c, a);
    case FG_OP_REDUCE_SCATTER: return be->reduce_scatter(c, a);
    case FG_OP_ALLGATHER: return be->allgather(c, a);
    case FG_OP_ALLGATHERV: return be->allgatherv(c, a);
    case FG_OP_BROADCAST: return be->broadcast(c, a);
    case FG_OP_REDUCE: return be->reduce(c, a);
    case FG_OP_BARRIER: return be->barrier(c, a);
    case FG_OP_ALLTOALL: return be->alltoall(c, a);
    case FG_OP_SEND: return be->send(c, a);
    case FG_OP_RECV: return be->recv(c, a);
    case FG_OP_SPLIT:
    case FG_OP_CHECK: return be->allgather(c, a);
    default: return fg_error(FG_EINTERNAL, "unknown operation %d", (int)a->op);
    }
}

/* ------------------------------------------------------ progress thread */

static void *progress_main(void *arg) {
    fg_comm *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->head && !c->stop) pthread_cond_wait(&c->cv_work, &c->mu);
        if (!c->head) break;
        fg_comm_req *r = c->head;
        pthread_mutex_unlock(&c->mu);
        fg_clear_error();
        fg_status st = exec_op(c, &r->a);
        pthread_mutex_lock(&c->mu);
        r->status = st;
        snprintf(r->msg, sizeof r->msg, "%s", st == FG_OK ? "" : fg_last_error());
        c->head = r->next;
        if (!c->head) c->tail = NULL;
        r->next = NULL;
        r->done = 1;
        c->pending--;
        pthread_cond_broadcast(&c->cv_done);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* Queues r (under c->mu held by the caller); starts the thread if needed. */
static FG_MUST_USE fg_status enqueue_locked(fg_comm *c, fg_comm_req *r) {
    if (!c->thread_started) {
        if (pthread_create(&c->thread, NULL, progress_main, c) != 0)
            return fg_error(FG_EIO, "comm: cannot start the progress thread");
        c->thread_started = true;
    }
    r->comm = c;
    r->next = NULL;
    if (c->tail) c->tail->next = r;
    else c->head = r;
    c->tail = r;
    c->pending++;
    pthread_cond_signal(&c->cv_work);
    return FG_OK;
}

static FG_MUST_USE fg_status wait_req(fg_comm_req *r) {
    fg_comm *c = r->comm;
    pthread_mutex_lock(&c->mu);
    while (!r->done) pthread_cond_wait(&c->cv_done, &c->mu);
    pthread_mutex_unlock(&c->mu);
    if (r->status != FG_OK) return fg_error(r->status, "%s", r->msg);
    return FG_OK;
}

/* Runs an operation in issue order: at once on this thread when nothing is
 * queued, else behind the queued requests. */
static FG_MUST_USE fg_status run(fg_comm *c, fg__comm_args *a) {
    a->seq = is_collective(a->op) ? ++c->seq : ++c->p2p_seq;
    pthread_mutex_lock(&c->mu);
    if (c->pending == 0) {
        pthread_mutex_unlock(&c->mu);
        return exec_op(c, a);
    }
    fg_comm_req r;
    memset(&r, 0, sizeof r);
    r.a = *a;
    fg_status st = enqueue_locked(c, &r);
    pthread_mutex_unlock(&c->mu);
    if (st != FG_OK) return st;
    return wait_req(&r);
}

static FG_MUST_USE fg_status submit(fg_comm *c, fg__comm_args *a, fg_comm_req **req) {
    *req = NULL;
    fg_comm_req *r = fg_calloc(1, sizeof *r);
    if (!r) return FG_ENOMEM;
    a->seq = is_collective(a->op) ? ++c->seq : ++c->p2p_seq;
    r->a = *a;
    if (a->op == FG_OP_ALLGATHERV) {
        r->vec = fg_alloc(sizeof(int64_t) * 2 * (size_t)c->size);
        if (!r->vec) {
            fg_free(r);
            return FG_ENOMEM;
        }
        memcpy(r->vec, a->counts, sizeof(int64_t) * (size_t)c->size);
        memcpy(r->vec + c->size, a->displs, sizeof(int64_t) * (size_t)c->size);
        r->a.counts = r->vec;
        r->a.displs = r->vec + c->size;
    }
    fg_status st = FG_EUNSUPPORTED;
    if (!c->no_async) {
        pthread_mutex_lock(&c->mu);
        st = enqueue_locked(c, r);
        pthread_mutex_unlock(&c->mu);
    }
    if (st != FG_OK) {
        /* no thread: run it here and hand back a finished request */
        r->comm = c;
        r->status = exec_op(c, &r->a);
        snprintf(r->msg, sizeof r->msg, "%s", r->status == FG_OK ? "" : fg_last_error());
        r->done = 1;
    }
    *req = r;
    return FG_OK;
}

fg_status fg_comm_wait(fg_comm_req *req) {
    if (!req) return FG_OK;
    fg_status st = wait_req(req);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", req->msg);
    fg_free(req->vec);
    fg_free(req);
    if (st != FG_OK) return fg_error(st, "%s", msg);
    return FG_OK;
}

fg_status fg_comm_test(fg_comm_req *req, bool *done) {
    if (!req || !done) return fg_error(FG_EINVAL, "fg_comm_test: req and done must not be NULL");
    fg_comm *c = req->comm;
    pthread_mutex_lock(&c->mu);
    *done = req->done != 0;
    pthread_mutex_unlock(&c->mu);
    if (*done && req->status != FG_OK) return fg_error(req->status, "%s", req->msg);
    return FG_OK;
}

void fg_comm_abort(fg_comm *c) { fg_comm_abort_reason(c, NULL); }

void fg_comm_abort_reason(fg_comm *c, const char *why) {
    if (!c) return;
    if (why && !atomic_load(&c->aborted)) snprintf(c->abort_why, sizeof c->abort_why, "%s", why);
    c->aborted = 1;
    c->be->tell_peers(c);
}

void fg_comm_free(fg_comm *c) {
    if (!c) return;
    fg_error_kept kept; /* a _free never changes the caller's error (core.h) */
    fg_error_keep(&kept);
    pthread_mutex_lock(&c->mu);
    while (c->pending > 0) pthread_cond_wait(&c->cv_done, &c->mu);
    c->stop = true;
    pthread_cond_broadcast(&c->cv_work);
    pthread_mutex_unlock(&c->mu);
    if (c->thread_started) pthread_join(c->thread, NULL);
    c->be->destroy(c);
    comm_delete(c);
    fg_error_restore(&kept);
}

/* ------------------------------------------------------------ arguments */

static FG_MUST_USE fg_status bad(const char *op, const char *fmt, ...) FG_PRINTF(2, 3);
static FG_MUST_USE fg_status bad(const char *op, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return fg_error(FG_EINVAL, "%s: %s", op, msg);
}

static FG_MUST_USE fg_status check_common(const fg_comm *c, const char *op, int64_t count,
                                          fg_dtype dt) {
    if (!c) return bad(op, "communicator is NULL");
    if (count < 0) return bad(op, "count=%lld: must be >= 0", (long long)count);
    if (!fg_dtype_valid((int)dt))
        return bad(op, "dtype=%d: unknown; expected f64, f32, bf16, f16, i32, i64, u8 or u16",
                   (int)dt);
    size_t esz = fg_dtype_size(dt);
    if ((uint64_t)count > (UINT64_C(1) << 56) / esz / (uint64_t)c->size)
        return bad(op, "count=%lld: too large", (long long)count);
    return FG_OK;
}

static FG_MUST_USE fg_status check_rop(const char *op, fg_reduce_op rop) {
    if ((int)rop < 0 || rop >= FG_REDUCE_OP_COUNT)
        return bad(op,
                   "reduce op=%d: unknown; expected FG_REDUCE_OP_SUM, FG_REDUCE_OP_AVG, "
                   "FG_REDUCE_OP_MIN, FG_REDUCE_OP_MAX or FG_REDUCE_OP_PROD",
                   (int)rop);
    return FG_OK;
}

static FG_MUST_USE fg_status check_buf(const char *op, const char *what, const void *p,
                                       int64_t count) {
    if (!p && count > 0) return bad(op, "%s is NULL with count=%lld", what, (long long)count);
    return FG_OK;
}

static FG_MUST_USE fg_status check_root(const fg_comm *c, const char *op, const char *what,
                                        int root) {
    if (root < 0 || root >= c->size)
        return bad(op, "%s=%d: out of range [0, %d)", what, root, c->size);
    return FG_OK;
}

static FG_MUST_USE fg_status prep_allreduce(fg_comm *c, const void *send, void *recv, int64_t count,
                                            fg_dtype dt, fg_reduce_op op, fg__comm_args *a) {
    const char *n = "allreduce";
    FG_TRY(check_common(c, n, count, dt));
    FG_TRY(check_rop(n, op));
    FG_TRY(check_buf(n, "send", send, count));
    FG_TRY(check_buf(n, "recv", recv, count));
    *a = (fg__comm_args){.op = FG_OP_ALLREDUCE,
                         .name = n,
                         .send = send,
                         .recv = recv,
                         .count = count,
                         .dt = dt,
                         .rop = op};
    return FG_OK;
}

static FG_MUST_USE fg_status prep_reduce_scatter(fg_comm *c, const void *send, void *recv,
                                                 int64_t recvcount, fg_dtype dt, fg_reduce_op op,
                                                 fg__comm_args *a) {
    const char *n = "reduce_scatter";
    FG_TRY(check_common(c, n, recvcount, dt));
    FG_TRY(check_rop(n, op));
    FG_TRY(check_buf(n, "send", send, recvcount));
    FG_TRY(check_buf(n, "recv", recv, recvcount));
    *a = (fg__comm_args){.op = FG_OP_REDUCE_SCATTER,
                         .name = n,
                         .send = send,
                         .recv = recv,
                         .count = recvcount,
                         .dt = dt,
                         .rop = op};
    return FG_OK;
}

static FG_MUST_USE fg_status prep_allgather(fg_comm *c, const void *send, void *recv,
                                            int64_t sendcount, fg_dtype dt, fg__comm_args *a) {
    const char *n = "allgather";
    FG_TRY(check_common(c, n, sendcount, dt));
    FG_TRY(check_buf(n, "send", send, sendcount));
    FG_TRY(check_buf(n, "recv", recv, sendcount));
    *a = (fg__comm_args){
        .op = FG_OP_ALLGATHER, .name = n, .send = send, .recv = recv, .count = sendcount, .dt = dt};
    return FG_OK;
}

static FG_MUST_USE fg_status prep_broadcast(fg_comm *c, const void *send, void *recv, int64_t count,
                                            fg_dtype dt, int root, fg__comm_args *a) {
    const char *n = "broadcast";
    FG_TRY(check_common(c, n, count, dt));
    FG_TRY(check_root(c, n, "root", root));
    if (c->rank == root) FG_TRY(check_buf(n, "send (on the root)", send, count));
    FG_TRY(check_buf(n, "recv", recv, count));
    *a = (fg__comm_args){.op = FG_OP_BROADCAST,
                         .name = n,
                         .send = send,
                         .recv = recv,
                         .count = count,
                         .dt = dt,
                         .root = root};
    return FG_OK;
}

static FG_MUST_USE fg_status prep_reduce(fg_comm *c, const void *send, void *recv, int64_t count,
                                         fg_dtype dt, fg_reduce_op op, int root, fg__comm_args *a) {
    const char *n = "reduce";
    FG_TRY(check_common(c, n, count, dt));
    FG_TRY(check_rop(n, op));
    FG_TRY(check_root(c, n, "root", root));
    FG_TRY(check_buf(n, "send", send, count));
    if (c->rank == root) FG_TRY(check_buf(n, "recv (on the root)", recv, count));
    *a = (fg__comm_args){.op = FG_OP_REDUCE,
                         .name = n,
                         .send = send,
                         .recv = recv,
                         .count = count,
                         .dt = dt,
                         .rop = op,
                         .root = root};
    return FG_OK;
}

fg_status fg_comm_allreduce(fg_comm *c, const void *send, void *recv, int64_t count, fg_dtype dt,
                            fg_reduce_op op) {
    fg__comm_args a;
    FG_TRY(prep_allreduce(c, send, recv, count, dt, op, &a));
    return run(c, &a);
}

fg_status fg_comm_reduce_scatter(fg_comm *c, const void *send, void *recv, int64_t recvcount,
                                 fg_dtype dt, fg_reduce_op op) {
    fg__comm_args a;
    FG_TRY(prep_reduce_scatter(c, send, recv, recvcount, dt, op, &a));
    return run(c, &a);
}

fg_status fg_comm_allgather(fg_comm *c, const void *send, void *recv, int64_t sendcount,
                            fg_dtype dt) {
    fg__comm_args a;
    FG_TRY(prep_allgather(c, send, recv, sendcount, dt, &a));
    return run(c, &a);
}

fg_status fg_comm_allgatherv(fg_comm *c, const void *send, int64_t sendcount, void *recv,
                             const int64_t *counts, const int64_t *displs, fg_dtype dt) {
    const char *n = "allgatherv";
    FG_TRY(check_common(c, n, sendcount, dt));
    if (!counts) return bad(n, "counts is NULL");
    if (counts[c->rank] != sendcount)
        return bad(n, "sendcount=%lld but counts[%d]=%lld: they must agree", (long long)sendcount,
                   c->rank, (long long)counts[c->rank]);
    int64_t stackv[64], *packed = stackv;
    if (!displs && c->size > 64) {
        packed = fg_alloc(sizeof(int64_t) * (size_t)c->size);
        if (!packed) return FG_ENOMEM;
    }
    int64_t total = 0;
    fg_status st = FG_OK;
    for (int q = 0; q < c->size; q++) {
        if (counts[q] < 0 || (displs && displs[q] < 0)) {
            st = bad(n, "counts[%d]=%lld, displs[%d]=%lld: must be >= 0", q, (long long)counts[q],
                     q, displs ? (long long)displs[q] : 0LL);
            goto out;
        }
        if (!displs) packed[q] = total;
        total += counts[q];
    }
    if ((st = check_common(c, n, total / c->size + 1, dt)) != FG_OK) goto out;
    if (!send && sendcount > 0) {
        st = bad(n, "send is NULL with sendcount=%lld", (long long)sendcount);
        goto out;
    }
    if (!recv && total > 0) {
        st = bad(n, "recv is NULL with a total count of %lld", (long long)total);
        goto out;
    }
    fg__comm_args a = {.op = FG_OP_ALLGATHERV,
                       .name = n,
                       .send = send,
                       .recv = recv,
                       .count = sendcount,
                       .dt = dt,
                       .counts = counts,
                       .displs = displs ? displs : packed};
    st = run(c, &a);
out:
    if (packed != stackv) fg_free(packed);
    return st;
}

fg_status fg_comm_broadcast(fg_comm *c, const void *send, void *recv, int64_t count, fg_dtype dt,
                            int root) {
    fg__comm_args a;
    FG_TRY(prep_broadcast(c, send, recv, count, dt, root, &a));
    return run(c, &a);
}

fg_status fg_comm_reduce(fg_comm *c, const void *send, void *recv, int64_t count, fg_dtype dt,
                         fg_reduce_op op, int root) {
    fg__comm_args a;
    FG_TRY(prep_reduce(c, send, recv, count, dt, op, root, &a));
    return run(c, &a);
}

fg_status fg_comm_barrier(fg_comm *c) {
    if (!c) return bad("barrier", "communicator is NULL");
    fg__comm_args a = {.op = FG_OP_BARRIER, .name = "barrier", .dt = FG_U8};
    return run(c, &a);
}

fg_status fg_comm_alltoall(fg_comm *c, const void *send, void *recv, int64_t count, fg_dtype dt) {
    const char *n = "alltoall";
    FG_TRY(check_common(c, n, count, dt));
    FG_TRY(check_buf(n, "send", send, count));
    FG_TRY(check_buf(n, "recv", recv, count));
    fg__comm_args a = {
        .op = FG_OP_ALLTOALL, .name = n, .send = send, .recv = recv, .count = count, .dt = dt};
    return run(c, &a);
}

static FG_MUST_USE fg_status p2p(fg_comm *c, fg__comm_opcode op, void *buf, int64_t count,
                                 fg_dtype dt, int peer) {
    const char *n = fg__comm_op_names[op];
    FG_TRY(check_common(c, n, count, dt));
    FG_TRY(check_buf(n, "buf", buf, count));
    FG_TRY(check_root(c, n, "peer", peer));
    if (peer == c->rank) return bad(n, "peer=%d is this rank: a rank cannot message itself", peer);
    fg__comm_args a = {
        .op = op, .name = n, .send = buf, .recv = buf, .count = count, .dt = dt, .root = peer};
    return run(c, &a);
}

fg_status fg_comm_send(fg_comm *c, const void *buf, int64_t count, fg_dtype dt, int peer) {
    return p2p(c, FG_OP_SEND, (void *)(uintptr_t)buf, count, dt, peer);
}

fg_status fg_comm_recv(fg_comm *c, void *buf, int64_t count, fg_dtype dt, int peer) {
    return p2p(c, FG_OP_RECV, buf, count, dt, peer);
}

fg_status fg_comm_iallreduce(fg_comm *c, const void *send, void *recv, int64_t count, fg_dtype dt,
                             fg_reduce_op op, fg_comm_req **req) {
    if (!req) return bad("iallreduce", "req is NULL");
    *req = NULL;
    fg__comm_args a;
    FG_TRY(prep_allreduce(c, send, recv, count, dt, op, &a));
    return submit(c, &a, req);
}

fg_status fg_comm_ireduce_scatter(fg_comm *c, const void *send, void *recv, int64_t recvcount,
                                  fg_dtype dt, fg_reduce_op op, fg_comm_req **req) {
    if (!req) return bad("ireduce_scatter", "req is NULL");
    *req = NULL;
    fg__comm_args a;
    FG_TRY(prep_reduce_scatter(c, send, recv, recvcount, dt, op, &a));
    return submit(c, &a, req);
}

fg_status fg_comm_iallgather(fg_comm *c, const void *send, void *recv, int64_t sendcount,
                             fg_dtype dt, fg_comm_req **req) {
    if (!req) return bad("iallgather", "req is NULL");
    *req = NULL;
    fg__comm_args a;
    FG_TRY(prep_allgather(c, send, recv, sendcount, dt, &a));
    return submit(c, &a, req);
}

fg_status fg_comm_ibroadcast(fg_comm *c, const void *send, void *recv, int64_t count, fg_dtype dt,
                             int root, fg_comm_req **req) {
    if (!req) return bad("ibroadcast", "req is NULL");
    *req = NULL;
    fg__comm_args a;
    FG_TRY(prep_broadcast(c, send, recv, count, dt, root, &a));
    return submit(c, &a, req);
}

fg_status fg_comm_ireduce(fg_comm *c, const void *send, void *recv, int64_t count, fg_dtype dt,
                          fg_reduce_op op, int root, fg_comm_req **req) {
    if (!req) return bad("ireduce", "req is NULL");
    *req = NULL;
    fg__comm_args a;
    FG_TRY(prep_reduce(c, send, recv, count, dt, op, root, &a));
    return submit(c, &a, req);
}

fg_status fg_comm_ibarrier(fg_comm *c, fg_comm_req **req) {
    if (!req) return bad("ibarrier", "req is NULL");
    *req = NULL;
    if (!c) return bad("ibarrier", "communicator is NULL");
    fg__comm_args a = {.op = FG_OP_BARRIER, .name = "barrier", .dt = FG_U8};
    return submit(c, &a, req);
}

/* ---------------------------------------------------------------- split */

typedef struct split_entry {
    int32_t color, key, node, rank;
} split_entry;

static int cmp_entry(const void *x, const void *y) {
    const split_entry *a = x, *b = y;
    if (a->key != b->key) return a->key < b->key ? -1 : 1;
    return a->rank < b->rank ? -1 : a->rank > b->rank;
}

fg_status fg_comm_split(fg_comm *c, int color, int key, fg_comm **out) {
    if (!out) return bad("split", "out is NULL");
    *out = NULL;
    if (!c) return bad("split", "communicator is NULL");
    if (color < FG_COMM_SPLIT_NONE) color = FG_COMM_SPLIT_NONE;
    int n = c->size;
    split_entry mine = {color, key, c->node_of[c->rank], c->rank};
    split_entry *all = fg_alloc(sizeof(split_entry) * (size_t)n);
    if (!all) return FG_ENOMEM;
    fg__comm_args a = {.op = FG_OP_SPLIT,
                       .name = "split",
                       .send = &mine,
                       .recv = all,
                       .count = (int64_t)sizeof mine,
                       .dt = FG_U8};
    fg_status st = run(c, &a);
    if (st != FG_OK) {
        fg_free(all);
        return st;
    }
    int split_no = c->nsplit++;
    fg_comm *child = NULL;
    if (color >= 0) {
        int m = 0;
        for (int i = 0; i < n; i++)
            if (all[i].color == color) all[m++] = all[i];
        qsort(all, (size_t)m, sizeof *all, cmp_entry);
        child = comm_new();
        if (!child) {
            st = FG_ENOMEM;
        } else {
            child->be = c->be;
            child->size = m;
            child->timeout_s = c->timeout_s;
            child->check = c->check;
            memcpy(child->job_key, c->job_key, sizeof c->job_key);
            char gid[200];
            snprintf(gid, sizeof gid, "%s.s%dc%d", c->group_id, split_no, color);
            if (strlen(gid) >= sizeof child->group_id - 1) {
                uint64_t h = 1469598103934665603ull;
                for (const char *p = gid; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
                snprintf(child->group_id, sizeof child->group_id, "g%016llx",
                         (unsigned long long)h);
            } else {
                memcpy(child->group_id, gid, strlen(gid) + 1);
            }
            child->node_of = fg_calloc((size_t)m, sizeof(int));
            child->world_of = fg_calloc((size_t)m, sizeof(int));
            if (!child->node_of || !child->world_of) st = FG_ENOMEM;
            /* nodes in the new group: dense indices in order of node id */
            int *nodes = fg_alloc(sizeof(int) * (size_t)m);
            if (!nodes) st = FG_ENOMEM;
            int nn = 0;
            for (int i = 0; st == FG_OK && i < m; i++) {
                int nd = all[i].node, seen = 0;
                for (int j = 0; j < nn; j++) seen |= nodes[j] == nd;
                if (!seen) nodes[nn++] = nd;
            }
            for (int i = 1; st == FG_OK && i < nn; i++) /* insertion sort: few nodes */
                for (int j = i; j > 0 && nodes[j - 1] > nodes[j]; j--) {
                    int t = nodes[j];
                    nodes[j] = nodes[j - 1];
                    nodes[j - 1] = t;
                }
            for (int i = 0; st == FG_OK && i < m; i++) {
                int idx = 0;
                while (nodes[idx] != all[i].node) idx++;
                child->node_of[i] = idx;
                child->world_of[i] = c->world_of[all[i].rank];
                if (all[i].rank == c->rank) child->rank = i;
            }
            if (st == FG_OK) {
                child->num_nodes = nn;
                child->node_rank = child->node_of[child->rank];
                child->local_rank = child->local_size = 0;
                for (int i = 0; i < m; i++)
                    if (child->node_of[i] == child->node_rank) {
                        if (i < child->rank) child->local_rank++;
                        child->local_size++;
                    }
            }
            fg_free(nodes);
        }
    }
    fg_free(all);
    fg_status bst = c->be->split(c, st == FG_OK ? child : NULL, color, key);
    if (st == FG_OK) st = bst;
    if (st != FG_OK) {
        if (child) comm_delete(child);
        return fg_error_wrap(st, "split #%d of group %s (color %d)", split_no, c->group_id, color);
    }
    *out = child;
    return FG_OK;
}
