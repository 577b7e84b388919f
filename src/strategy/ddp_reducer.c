/* DDP's reducer, and ZeRO's. Parameters are grouped, last first, into
 * buckets of about bucket_cap_mb (the first one smaller, so communication
 * starts early); a bucket is a contiguous slice of the flat gradient
 * (gradient_as_bucket_view: nothing is copied). The autograd "gradient
 * ready" hook counts down each bucket; a bucket whose parameters are all
 * final is all-reduced (average) in place on the communicator's progress
 * thread while backward goes on. Buckets start strictly in index order so
 * that every rank issues the same collectives in the same order, whatever
 * order its gradients finished in.
 *
 * ZeRO (owner bounds given): a bucket is reduce-scattered instead, each
 * piece of it that lies in rank q's shard reduced (average) to rank q
 * alone, pieces in rank order. The shm backend reduces every element in
 * rank order whichever collective carries it, so a shard gets the bits an
 * allreduce would have given it. With after_backward (ZeRO-1) nothing
 * starts during backward: every bucket goes once backward is over.
 *
 * Communication hooks (ddp): a ready bucket is handed to the reducer's hook
 * thread instead, which runs the hook on each bucket in index order (its
 * collectives blocking there) while backward goes on, as PyTorch's hooks
 * run asynchronously per bucket; the end of backward waits for the thread
 * to finish every bucket handed to it. Under a hook the backward thread
 * starts no request, so the hook thread is the communicator's only caller
 * until the wait. After a hook's error the thread skips the later buckets
 * (the same collectives as a blocking hook that stopped there), and the
 * wait returns the first error. fg__ddp_reducer_reduce (after backward)
 * runs the hooks on the calling thread. Every element handed to the
 * communicator, with or without a hook, is counted in bytes. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "ddp_reducer.h"
#include "strategy_impl.h"

typedef struct bucket {
    int64_t begin, end; /* elements of the flat gradient */
    int nparams, pending;
    int p0; /* its lowest parameter: it holds p0 .. p0 + nparams - 1 */
} bucket;

struct fg__ddp_reducer {
    fg_comm *comm;
    fg_tensor *flat;
    int n;
    fg_tensor **params;
    int64_t *offs;
    int *bucket_of;
    bool *ready;
    int nb;
    bucket *b;
    int next; /* next bucket to start */
    bool find_unused, static_graph, after_backward;
    const char *name;
    int world;          /* ZeRO: shards, and their bounds (world + 1) */
    int64_t *bounds;    /* NULL under ddp */
    fg_comm_req **reqs; /* started in this backward, in order */
    int nreqs, reqs_cap;
    int64_t *req_suffix; /* ZeRO-3: the finished suffix once reqs[0..i] are done */
    int ndone;           /* reqs[0..ndone) are known finished */
    int64_t suffix;      /* the suffix the buckets started so far cover */
    int64_t max_pending; /* ZeRO: elements started and not finished, at most */
    void (*reduced)(void *ud, int64_t begin);
    void *reduced_ud;
    fg_status err;
    char errmsg[512];
    fg_ddp_hook_fn hook; /* ddp with a communication hook */
    void *hook_state;
    fg_dtype wire;     /* f32, or a wrapper's f16 / bf16 */
    int64_t *rel_offs; /* parameter offsets from their bucket's begin (hooks) */
    uint16_t *half;    /* the wire buffer of a half-precision allreduce */
    int64_t half_cap;
    fg_comm_bytes bytes;
    /* The hook thread. mu guards queued, done, quit and werr /
     * werrmsg; the thread alone touches the buckets' gradients, the hook's
     * state, half and bytes.last_step from queueing until the wait. */
    bool worker_on;
    pthread_t worker;
    pthread_mutex_t mu;
    pthread_cond_t work, idle;
    int queued, done; /* buckets [0, queued) handed over, [0, done) finished */
    bool quit;
    bool threaded_now; /* this backward hands buckets to the thread */
    fg_status werr;
    char werrmsg[512];
};

int fg__ddp_reducer_num_buckets(const fg__ddp_reducer *r) { return r->nb; }
void fg__ddp_reducer_bucket_range(const fg__ddp_reducer *r, int b, int64_t *begin, int64_t *end) {
    *begin = r->b[b].begin;
    *end = r->b[b].end;
}

void fg__ddp_reducer_free(fg__ddp_reducer *r) {
    if (!r) return;
    if (r->worker_on) {
        pthread_mutex_lock(&r->mu);
        r->quit = true;
        pthread_cond_signal(&r->work);
        pthread_mutex_unlock(&r->mu);
        pthread_join(r->worker, NULL);
        pthread_mutex_destroy(&r->mu);
        pthread_cond_destroy(&r->work);
        pthread_cond_destroy(&r->idle);
    }
    for (int i = 0; i < r->nreqs; i++)
        if (fg_comm_wait(r->reqs[i]) != FG_OK) {
            /* freeing: a pending request's error goes nowhere */
        }
    fg_free(r->reqs);
    fg_free(r->req_suffix);
    fg_free(r->rel_offs);
    fg_free(r->half);
    fg_free(r->bounds);
    fg_free(r->params);
    fg_free(r->offs);
    fg_free(r->bucket_of);
    fg_free(r->ready);
    fg_free(r->b);
    fg_free(r);
}

fg_status fg__ddp_reducer_new(fg_comm *comm, fg_tensor *flat, int n, fg_tensor *const *params,
                              const int64_t *offs, const fg__ddp_reducer_opts *o,
                              fg__ddp_reducer **out) {
    *out = NULL;
    fg__ddp_reducer_opts d = o ? *o : (fg__ddp_reducer_opts){0};
    double cap = (d.bucket_cap_mb > 0 ? d.bucket_cap_mb : 25.0) * 1048576.0;
    double first = (d.first_bucket_mb > 0 ? d.first_bucket_mb : 1.0) * 1048576.0;
    size_t es = fg_dtype_size(flat->dtype);
    fg__ddp_reducer *r = fg_calloc(1, sizeof *r);
    if (!r) return fg_error_wrap(FG_ENOMEM, "ddp setup");
    r->comm = comm;
    r->flat = flat;
    r->n = n;
    r->find_unused = d.find_unused_parameters;
    r->static_graph = d.static_graph;
    r->after_backward = d.after_backward;
    r->name = d.name ? d.name : "ddp";
    r->hook = d.hook;
    r->hook_state = d.hook_state;
    r->wire = d.wire ? d.wire : FG_F32;
    r->reduced = d.reduced;
    r->reduced_ud = d.reduced_ud;
    r->max_pending = d.max_pending;
    if (d.owner_bounds) {
        r->world = d.world;
        r->bounds = fg_calloc((size_t)d.world + 1, sizeof *r->bounds);
        if (!r->bounds) {
            const char *name = r->name; /* the caller's string, not r's */
            fg__ddp_reducer_free(r);
            return fg_error_wrap(FG_ENOMEM, "%s setup", name);
        }
        memcpy(r->bounds, d.owner_bounds, sizeof *r->bounds * ((size_t)d.world + 1));
    }
    r->params = fg_calloc((size_t)n + 1, sizeof *r->params);
    r->offs = fg_calloc((size_t)n + 1, sizeof *r->offs);
    r->bucket_of = fg_calloc((size_t)n + 1, sizeof *r->bucket_of);
    r->ready = fg_calloc((size_t)n + 1, sizeof *r->ready);
    r->b = fg_calloc((size_t)n + 1, sizeof *r->b);
    r->rel_offs = fg_calloc((size_t)n + 1, sizeof *r->rel_offs);
    if (!r->params || !r->offs || !r->bucket_of || !r->ready || !r->b || !r->rel_offs) {
        fg__ddp_reducer_free(r);
        return fg_error_wrap(FG_ENOMEM, "ddp setup");
    }
    for (int i = 0; i < n; i++) {
        r->params[i] = params[i];
        r->offs[i] = offs[i];
        if (i && offs[i] < offs[i - 1] + fg_tensor_numel(params[i - 1])) {
            fg__ddp_reducer_free(r);
            return fg_error(FG_EINTERNAL, "ddp: parameter offsets overlap at %d", i);
        }
    }
    /* Buckets, last parameter first. Bucket b spans from its lowest
     * parameter's offset to the end of its highest one (the start of the
     * previous bucket). */
    int64_t end = flat->numel;
    double bytes = 0, limit = first;
    int cur = -1;
    for (int i = n - 1; i >= 0; i--) {
        if (cur < 0 || bytes >= limit) {
            if (cur >= 0) {
                end = r->b[cur].begin;
                limit = cap;
            }
            cur++;
            r->b[cur].end = end;
            bytes = 0;
        }
        r->b[cur].begin = i == 0 ? 0 : offs[i];
        r->b[cur].nparams++;
        r->b[cur].p0 = i;
        r->bucket_of[i] = cur;
        bytes += (double)fg_tensor_numel(params[i]) * (double)es;
    }
    r->nb = cur + 1;
    for (int i = 0; i < n; i++) r->rel_offs[i] = offs[i] - r->b[r->bucket_of[i]].begin;
    r->bytes.dense_step = (uint64_t)flat->numel * es;
    /* one request per bucket, or under ZeRO one per piece: a bucket has one
     * piece per shard it meets, and consecutive buckets share at most one
     * shard, so nb + world pieces in all */
    r->reqs_cap = r->nb + (r->bounds ? r->world : 0);
    r->reqs = fg_calloc((size_t)r->reqs_cap, sizeof *r->reqs);
    r->req_suffix = fg_calloc((size_t)r->reqs_cap + 1, sizeof *r->req_suffix);
    if (!r->reqs || !r->req_suffix) {
        const char *name = r->name;
        fg__ddp_reducer_free(r);
        return fg_error_wrap(FG_ENOMEM, "%s setup", name);
    }
    *out = r;
    return FG_OK;
}

static void set_err(fg__ddp_reducer *r, fg_status s) {
    if (r->err == FG_OK) {
        r->err = s;
        snprintf(r->errmsg, sizeof r->errmsg, "%s", fg_last_error());
    }
}

/* The shard holding element i (bounds are increasing; empty shards are
 * skipped by taking the last q with bounds[q] <= i). */
static int owner_of(const fg__ddp_reducer *r, int64_t i) {
    int lo = 0, hi = r->world - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (r->bounds[mid] <= i) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Rounds n floats to dt (f16 or bf16) and back, in place. */
static void round_to(float *x, int64_t n, fg_dtype dt) {
    for (int64_t i = 0; i < n; i++)
        x[i] = dt == FG_F16 ? fg_f16_to_f32(fg_f32_to_f16(x[i]))
                            : fg_bf16_to_f32(fg_f32_to_bf16(x[i]));
}

fg_status fg__ddp_bucket_allreduce_as(const fg_ddp_bucket *b, float *buf, int64_t count,
                                      fg_dtype wire, fg_reduce_op op) {
    fg__ddp_reducer *r = b->impl;
    if (count < 0 || (count > 0 && !buf))
        return fg_error(FG_EINVAL, "%s: bucket %d: allreduce of %lld elements at %p", r->name,
                        b->index, (long long)count, (void *)buf);
    r->bytes.last_step += (uint64_t)count * fg_dtype_size(wire);
    if (wire == FG_F32) return fg_comm_allreduce(r->comm, buf, buf, count, FG_F32, op);
    if (count > r->half_cap) {
        uint16_t *h = fg_realloc(r->half, (size_t)count * sizeof *h);
        if (!h) return fg_error_wrap(FG_ENOMEM, "%s: bucket %d", r->name, b->index);
        r->half = h;
        r->half_cap = count;
    }
    FG_TRY(fg_convert(r->half, wire, buf, FG_F32, count));
    FG_TRY(fg_comm_allreduce(r->comm, r->half, r->half, count, wire, op));
    return fg_convert(buf, FG_F32, r->half, wire, count);
}

fg_status fg_ddp_bucket_allreduce(const fg_ddp_bucket *b, float *buf, int64_t count,
                                  fg_reduce_op op) {
    if (!b || !b->impl) return fg_error(FG_EINVAL, "ddp_bucket_allreduce: NULL bucket");
    fg__ddp_reducer *r = b->impl;
    return fg__ddp_bucket_allreduce_as(b, buf, count, r->wire, op);
}

/* Bucket bk through the hook (blocking): under a wrapper the bucket is
 * rounded to its dtype first, and without a hook the wrapper wraps the
 * plain average. */
static FG_MUST_USE fg_status run_hook_on(fg__ddp_reducer *r, const bucket *bk, float *grad) {
    fg_ddp_bucket b = {.index = (int)(bk - r->b),
                       .num_buckets = r->nb,
                       .grad = grad,
                       .numel = bk->end - bk->begin,
                       .offset = bk->begin,
                       .nparams = bk->nparams,
                       .params = r->params + bk->p0,
                       .param_offsets = r->rel_offs + bk->p0,
                       .iter = r->bytes.steps,
                       .comm = r->comm,
                       .world_size = fg_comm_size(r->comm),
                       .impl = r};
    if (r->wire != FG_F32) round_to(b.grad, b.numel, r->wire);
    if (!r->hook) return fg_ddp_bucket_allreduce(&b, b.grad, b.numel, FG_REDUCE_OP_AVG);
    fg_status s = r->hook(r->hook_state, &b);
    if (s != FG_OK) return fg_error_wrap(s, "%s: communication hook", r->name);
    return FG_OK;
}

/* On a device whose memory the backend does not read, the hook (and the
 * wire rounding) runs on the bucket's staged host copy: the bucket out,
 * the hook, the result back in (counted as staging). Compression on the
 * device itself comes with the device's kernels. */
static FG_MUST_USE fg_status run_hook(fg__ddp_reducer *r, const bucket *bk) {
    float *grad = (float *)r->flat->data + bk->begin;
    fg_dev *dev = fg_tensor_dev(r->flat);
    if (!dev || fg_dev_host_accessible(dev) || fg_comm_reads_device(r->comm, fg_dev_kind(dev)))
        return run_hook_on(r, bk, grad);
    size_t bytes = (size_t)(bk->end - bk->begin) * sizeof(float);
    float *host = fg_dev_host_alloc(dev, bytes ? bytes : sizeof(float));
    if (!host) return fg_error_wrap(fg_last_status(), "%s: staging a bucket", r->name);
    fg_status s = fg__stage_out(dev, host, grad, bytes);
    if (s == FG_OK) s = run_hook_on(r, bk, host);
    if (s == FG_OK) s = fg__stage_in(dev, grad, host, bytes);
    fg_dev_host_free(dev, host);
    return s;
}

/* Starts bucket bk: one allreduce, or under ZeRO one reduce per shard it
 * meets, to that shard's rank. */
static FG_MUST_USE fg_status start_bucket(fg__ddp_reducer *r, const bucket *bk) {
    size_t es = fg_dtype_size(r->flat->dtype);
    fg_dtype dt = r->flat->dtype;
    char *base = r->flat->data;
    fg_dev *dev = fg_tensor_dev(r->flat);
    if (dev && !fg_dev_host_accessible(dev) && !fg_comm_reads_device(r->comm, fg_dev_kind(dev))) {
        /* a device the backend cannot read: the bucket through host staging,
         * done before the next one starts (no overlap with the backward) */
        if (r->hook || r->wire != FG_F32) return run_hook(r, bk); /* staged there */
        if (!r->bounds) {
            r->bytes.last_step += (uint64_t)(bk->end - bk->begin) * es;
            return fg__staged_allreduce(r->comm, dev, base + (size_t)bk->begin * es,
                                        bk->end - bk->begin, dt, FG_REDUCE_OP_AVG);
        }
        /* ZeRO: each shard's piece reduced to its owner, the owner alone
         * copying the result back; the suffix is finished at once */
        for (int q = bk->end > bk->begin ? owner_of(r, bk->begin) : r->world;
             q < r->world && r->bounds[q] < bk->end; q++) {
            int64_t lo = FG_MAX(bk->begin, r->bounds[q]), hi = FG_MIN(bk->end, r->bounds[q + 1]);
            if (lo >= hi) continue;
            r->bytes.last_step += (uint64_t)(hi - lo) * es;
            FG_TRY(fg__staged_reduce(r->comm, dev, base + (size_t)lo * es, hi - lo, dt,
                                     FG_REDUCE_OP_AVG, q));
        }
        if (bk->end > bk->begin) r->suffix = bk->begin;
        if (r->reduced) r->reduced(r->reduced_ud, r->suffix);
        return FG_OK;
    }
    if (r->hook || r->wire != FG_F32) return run_hook(r, bk);
    if (!r->bounds) {
        void *p = base + (size_t)bk->begin * es;
        r->bytes.last_step += (uint64_t)(bk->end - bk->begin) * es;
        return fg_comm_iallreduce(r->comm, p, p, bk->end - bk->begin, dt, FG_REDUCE_OP_AVG,
                                  &r->reqs[r->nreqs++]);
    }
    if (bk->end <= bk->begin) return FG_OK;
    for (int q = owner_of(r, bk->begin); q < r->world && r->bounds[q] < bk->end; q++) {
        int64_t lo = FG_MAX(bk->begin, r->bounds[q]), hi = FG_MIN(bk->end, r->bounds[q + 1]);
        if (lo >= hi) continue;
        if (r->nreqs == r->reqs_cap)
            return fg_error(FG_EINTERNAL, "%s: more reductions than planned (%d)", r->name,
                            r->reqs_cap);
        void *p = base + (size_t)lo * es;
        r->bytes.last_step += (uint64_t)(hi - lo) * es;
        r->req_suffix[r->nreqs] = r->suffix;
        FG_TRY(
            fg_comm_ireduce(r->comm, p, p, hi - lo, dt, FG_REDUCE_OP_AVG, q, &r->reqs[r->nreqs++]));
    }
    /* the bucket's range is finished once its last piece is */
    if (r->nreqs) r->req_suffix[r->nreqs - 1] = r->suffix = bk->begin;
    return FG_OK;
}

/* ZeRO-3: tells the strategy how far the finished suffix reaches. */
static void poll_done(fg__ddp_reducer *r) {
    int before = r->ndone;
    while (r->ndone < r->nreqs && r->reqs[r->ndone]) {
        bool done = false;
        if (fg_comm_test(r->reqs[r->ndone], &done) != FG_OK || !done) break;
        r->ndone++;
    }
    /* too much started and not finished: wait for the oldest */
    while (r->max_pending > 0 && r->ndone < r->nreqs && r->reqs[r->ndone] &&
           (r->ndone ? r->req_suffix[r->ndone - 1] : r->flat->numel) - r->suffix > r->max_pending) {
        fg_status ws = fg_comm_wait(r->reqs[r->ndone]);
        r->reqs[r->ndone++] = NULL;
        if (ws != FG_OK) {
            set_err(r, fg_error_wrap(ws, "%s: a gradient bucket's reduction", r->name));
            break;
        }
    }
    if (r->ndone > before) r->reduced(r->reduced_ud, r->req_suffix[r->ndone - 1]);
}

/* The hook thread: runs the hook on each bucket handed to it, in index
 * order, until told to quit. */
static void *hook_worker(void *arg) {
    fg__ddp_reducer *r = arg;
    fg_set_grad_enabled(false); /* a hook's tensors are never differentiated */
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->quit && r->done == r->queued) pthread_cond_wait(&r->work, &r->mu);
        if (r->quit) break;
        int b = r->done;
        bool skip = r->werr != FG_OK;
        pthread_mutex_unlock(&r->mu);
        fg_status s = skip ? FG_OK : run_hook(r, &r->b[b]);
        if (s != FG_OK) s = fg_error_wrap(s, "%s: bucket %d", r->name, b);
        char msg[sizeof r->werrmsg];
        if (s != FG_OK) snprintf(msg, sizeof msg, "%s", fg_last_error());
        fg_step_reset(); /* the step tensors a hook made, in this thread's arena */
        pthread_mutex_lock(&r->mu);
        if (s != FG_OK && r->werr == FG_OK) {
            r->werr = s;
            memcpy(r->werrmsg, msg, sizeof msg);
        }
        r->done++;
        if (r->done == r->queued) pthread_cond_signal(&r->idle);
    }
    pthread_mutex_unlock(&r->mu);
    fg_step_thread_release();
    return NULL;
}

static FG_MUST_USE fg_status worker_start(fg__ddp_reducer *r) {
    if (r->worker_on) return FG_OK;
    if (pthread_mutex_init(&r->mu, NULL)) return fg_error(FG_ENOMEM, "%s: hook thread", r->name);
    if (pthread_cond_init(&r->work, NULL)) {
        pthread_mutex_destroy(&r->mu);
        return fg_error(FG_ENOMEM, "%s: hook thread", r->name);
    }
    if (pthread_cond_init(&r->idle, NULL)) {
        pthread_cond_destroy(&r->work);
        pthread_mutex_destroy(&r->mu);
        return fg_error(FG_ENOMEM, "%s: hook thread", r->name);
    }
    r->queued = r->done = 0;
    r->quit = false;
    if (pthread_create(&r->worker, NULL, hook_worker, r)) {
        pthread_cond_destroy(&r->idle);
        pthread_cond_destroy(&r->work);
        pthread_mutex_destroy(&r->mu);
        return fg_error(FG_ENOMEM, "%s: could not start the communication hook's thread", r->name);
    }
    r->worker_on = true;
    return FG_OK;
}

/* Hands the hook thread every ready bucket not yet handed over. */
static void queue_ready(fg__ddp_reducer *r) {
    int next = r->next;
    while (next < r->nb && r->b[next].pending == 0) next++;
    if (next == r->next) return;
    r->next = next;
    pthread_mutex_lock(&r->mu);
    r->queued = next;
    pthread_cond_signal(&r->work);
    pthread_mutex_unlock(&r->mu);
}

/* Waits until the hook thread has finished every bucket handed to it; its
 * first error (naming the bucket) becomes the reducer's. */
static void drain(fg__ddp_reducer *r) {
    pthread_mutex_lock(&r->mu);
    while (r->done < r->queued) pthread_cond_wait(&r->idle, &r->mu);
    if (r->werr != FG_OK && r->err == FG_OK) {
        r->err = r->werr;
        memcpy(r->errmsg, r->werrmsg, sizeof r->errmsg);
    }
    r->werr = FG_OK;
    r->queued = r->done = 0;
    pthread_mutex_unlock(&r->mu);
}

static bool threaded(const fg__ddp_reducer *r) { return r->worker_on && r->threaded_now; }

static void launch_ready(fg__ddp_reducer *r) {
    if (threaded(r)) {
        queue_ready(r);
        return;
    }
    while (r->next < r->nb && r->b[r->next].pending == 0 && r->err == FG_OK) {
        fg_status s = start_bucket(r, &r->b[r->next++]);
        if (s != FG_OK) set_err(r, fg_error_wrap(s, "%s: bucket %d", r->name, r->next - 1));
    }
    if (r->reduced && r->err == FG_OK) poll_done(r);
}

static int find_param(const fg__ddp_reducer *r, const fg_tensor *t) {
    const fg_tensor *g = t->grad;
    if (!g) return -1;
    size_t es = fg_dtype_size(r->flat->dtype);
    ptrdiff_t d = (const char *)g->data - (const char *)r->flat->data;
    if (d < 0 || (size_t)d >= (size_t)r->flat->numel * es) return -1;
    int64_t off = (int64_t)((size_t)d / es);
    int lo = 0, hi = r->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (r->offs[mid] == off) return r->params[mid] == t ? mid : -1;
        if (r->offs[mid] < off) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

/* Waits for every request started, even after an error, so that no request
 * outlives the buffers it works on; then the first error, if any. */
static FG_MUST_USE fg_status wait_all(fg__ddp_reducer *r) {
    for (int i = 0; i < r->nreqs; i++) {
        fg_status ws = fg_comm_wait(r->reqs[i]);
        r->reqs[i] = NULL;
        if (ws != FG_OK) set_err(r, ws);
    }
    r->nreqs = 0;
    if (r->err != FG_OK) return fg_error(r->err, "%s", r->errmsg);
    if (r->reduced) r->reduced(r->reduced_ud, r->suffix);
    return FG_OK;
}

static void on_ready(void *ud, fg_tensor *leaf) {
    fg__ddp_reducer *r = ud;
    int i = find_param(r, leaf);
    if (i < 0 || r->ready[i]) return; /* not one of ours (an input tensor), or seen */
    r->ready[i] = true;
    r->b[r->bucket_of[i]].pending--;
    launch_ready(r);
}

void fg__ddp_reducer_bytes(const fg__ddp_reducer *r, fg_comm_bytes *out) { *out = r->bytes; }
void fg__ddp_reducer_add_bytes(fg__ddp_reducer *r, uint64_t bytes) {
    r->bytes.last_step += bytes;
    r->bytes.total += bytes;
}

/* Counts a synchronisation that ended with status s. */
static FG_MUST_USE fg_status count_step(fg__ddp_reducer *r, fg_status s) {
    r->bytes.total += r->bytes.last_step;
    if (s == FG_OK) r->bytes.steps++;
    return s;
}

fg_status fg__ddp_reducer_backward(fg__ddp_reducer *r, fg_tensor *loss, bool sync) {
    if (!sync) return fg_backward(loss);
    r->err = FG_OK;
    r->next = 0;
    r->nreqs = 0;
    r->ndone = 0;
    r->suffix = r->flat->numel;
    r->bytes.last_step = 0;
    if (r->after_backward) {
        fg_status s = fg_backward(loss);
        if (s != FG_OK) return s;
        return fg__ddp_reducer_reduce(r);
    }
    if ((r->hook || r->wire != FG_F32) && !r->bounds) {
        fg_status ws = worker_start(r);
        if (ws != FG_OK) return count_step(r, ws);
        r->threaded_now = true;
    }
    for (int b = 0; b < r->nb; b++) r->b[b].pending = r->b[b].nparams;
    memset(r->ready, 0, sizeof *r->ready * (size_t)r->n);
    fg_set_grad_ready_hook(on_ready, r);
    fg_status s = fg_backward(loss);
    fg_set_grad_ready_hook(NULL, NULL);
    if (s == FG_OK && r->next < r->nb && r->err == FG_OK) {
        /* Some parameters took no part in this backward. */
        int unused = -1;
        for (int i = 0; i < r->n && unused < 0; i++)
            if (!r->ready[i]) unused = i;
        if (!r->find_unused && !r->static_graph) {
            s = fg_error(FG_ESTATE,
                         "%s: parameter \"%s\" received no gradient in this backward; if the "
                         "model does not use every parameter in every step, set "
                         "find_unused_parameters",
                         r->name, fg_tensor_name(r->params[unused]));
        } else {
            /* Their gradients count as they are (zero after zero_grad), as
             * PyTorch's find_unused_parameters marks them ready. */
            for (int b = r->next; b < r->nb; b++) r->b[b].pending = 0;
            launch_ready(r);
        }
    }
    if (r->threaded_now) {
        drain(r);
        r->threaded_now = false;
    }
    fg_status ws = wait_all(r);
    return count_step(r, s != FG_OK ? s : ws);
}

fg_status fg__ddp_reducer_reduce(fg__ddp_reducer *r) {
    r->err = FG_OK;
    r->next = 0;
    r->nreqs = 0;
    r->ndone = 0;
    r->suffix = r->flat->numel;
    r->bytes.last_step = 0;
    for (int b = 0; b < r->nb; b++) r->b[b].pending = 0;
    launch_ready(r);
    return count_step(r, wait_all(r));
}
