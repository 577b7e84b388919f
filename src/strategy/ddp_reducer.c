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
 * starts during backward: every bucket goes once backward is over. */
#include <stdio.h>
#include <string.h>

#include "ddp_reducer.h"

typedef struct bucket {
    int64_t begin, end; /* elements of the flat gradient */
    int nparams, pending;
} bucket;

struct fg_ddp_reducer {
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
    fg_status err;
    char errmsg[512];
};

int fg_ddp_reducer_num_buckets(const fg_ddp_reducer *r) { return r->nb; }
void fg_ddp_reducer_bucket_range(const fg_ddp_reducer *r, int b, int64_t *begin, int64_t *end) {
    *begin = r->b[b].begin;
    *end = r->b[b].end;
}

void fg_ddp_reducer_free(fg_ddp_reducer *r) {
    if (!r) return;
    for (int i = 0; i < r->nreqs; i++) fg_comm_wait(r->reqs[i]);
    fg_free(r->reqs);
    fg_free(r->bounds);
    fg_free(r->params);
    fg_free(r->offs);
    fg_free(r->bucket_of);
    fg_free(r->ready);
    fg_free(r->b);
    fg_free(r);
}

fg_status fg_ddp_reducer_new(fg_comm *comm, fg_tensor *flat, int n, fg_tensor *const *params,
                             const int64_t *offs, const fg_ddp_reducer_opts *o,
                             fg_ddp_reducer **out) {
    *out = NULL;
    fg_ddp_reducer_opts d = o ? *o : (fg_ddp_reducer_opts){0};
    double cap = (d.bucket_cap_mb > 0 ? d.bucket_cap_mb : 25.0) * 1048576.0;
    double first = (d.first_bucket_mb > 0 ? d.first_bucket_mb : 1.0) * 1048576.0;
    size_t es = fg_dtype_size(flat->dtype);
    fg_ddp_reducer *r = fg_calloc(1, sizeof *r);
    if (!r) return fg_error_wrap(FG_ENOMEM, "ddp setup");
    r->comm = comm;
    r->flat = flat;
    r->n = n;
    r->find_unused = d.find_unused_parameters;
    r->static_graph = d.static_graph;
    r->after_backward = d.after_backward;
    r->name = d.name ? d.name : "ddp";
    if (d.owner_bounds) {
        r->world = d.world;
        r->bounds = fg_calloc((size_t)d.world + 1, sizeof *r->bounds);
        if (!r->bounds) {
            fg_ddp_reducer_free(r);
            return fg_error_wrap(FG_ENOMEM, "%s setup", r->name);
        }
        memcpy(r->bounds, d.owner_bounds, sizeof *r->bounds * ((size_t)d.world + 1));
    }
    r->params = fg_calloc((size_t)n + 1, sizeof *r->params);
    r->offs = fg_calloc((size_t)n + 1, sizeof *r->offs);
    r->bucket_of = fg_calloc((size_t)n + 1, sizeof *r->bucket_of);
    r->ready = fg_calloc((size_t)n + 1, sizeof *r->ready);
    r->b = fg_calloc((size_t)n + 1, sizeof *r->b);
    if (!r->params || !r->offs || !r->bucket_of || !r->ready || !r->b) {
        fg_ddp_reducer_free(r);
        return fg_error_wrap(FG_ENOMEM, "ddp setup");
    }
    for (int i = 0; i < n; i++) {
        r->params[i] = params[i];
        r->offs[i] = offs[i];
        if (i && offs[i] < offs[i - 1] + fg_tensor_numel(params[i - 1])) {
            fg_ddp_reducer_free(r);
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
        r->bucket_of[i] = cur;
        bytes += (double)fg_tensor_numel(params[i]) * (double)es;
    }
    r->nb = cur + 1;
    /* one request per bucket, or under ZeRO one per piece: a bucket has one
     * piece per shard it meets, and consecutive buckets share at most one
     * shard, so nb + world pieces in all */
    r->reqs_cap = r->nb + (r->bounds ? r->world : 0);
    r->reqs = fg_calloc((size_t)r->reqs_cap, sizeof *r->reqs);
    if (!r->reqs) {
        fg_ddp_reducer_free(r);
        return fg_error_wrap(FG_ENOMEM, "%s setup", r->name);
    }
    *out = r;
    return FG_OK;
}

static void set_err(fg_ddp_reducer *r, fg_status s) {
    if (r->err == FG_OK) {
        r->err = s;
        snprintf(r->errmsg, sizeof r->errmsg, "%s", fg_last_error());
    }
}

/* The shard holding element i (bounds are increasing; empty shards are
 * skipped by taking the last q with bounds[q] <= i). */
static int owner_of(const fg_ddp_reducer *r, int64_t i) {
    int lo = 0, hi = r->world - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (r->bounds[mid] <= i) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Starts bucket bk: one allreduce, or under ZeRO one reduce per shard it
 * meets, to that shard's rank. */
static fg_status start_bucket(fg_ddp_reducer *r, const bucket *bk) {
    size_t es = fg_dtype_size(r->flat->dtype);
    fg_dtype dt = r->flat->dtype;
    char *base = r->flat->data;
    if (!r->bounds) {
        void *p = base + (size_t)bk->begin * es;
        return fg_comm_iallreduce(r->comm, p, p, bk->end - bk->begin, dt, FG_AVG,
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
        FG_TRY(fg_comm_ireduce(r->comm, p, p, hi - lo, dt, FG_AVG, q, &r->reqs[r->nreqs++]));
    }
    return FG_OK;
}

static void launch_ready(fg_ddp_reducer *r) {
    while (r->next < r->nb && r->b[r->next].pending == 0 && r->err == FG_OK) {
        fg_status s = start_bucket(r, &r->b[r->next++]);
        if (s != FG_OK) set_err(r, fg_error_wrap(s, "%s: bucket %d", r->name, r->next - 1));
    }
}

static int find_param(const fg_ddp_reducer *r, const fg_tensor *t) {
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
static fg_status wait_all(fg_ddp_reducer *r) {
    for (int i = 0; i < r->nreqs; i++) {
        fg_status ws = fg_comm_wait(r->reqs[i]);
        r->reqs[i] = NULL;
        if (ws != FG_OK) set_err(r, ws);
    }
    r->nreqs = 0;
    if (r->err != FG_OK) return fg_error(r->err, "%s", r->errmsg);
    return FG_OK;
}

static void on_ready(void *ud, fg_tensor *leaf) {
    fg_ddp_reducer *r = ud;
    int i = find_param(r, leaf);
    if (i < 0 || r->ready[i]) return; /* not one of ours (an input tensor), or seen */
    r->ready[i] = true;
    r->b[r->bucket_of[i]].pending--;
    launch_ready(r);
}

fg_status fg_ddp_reducer_backward(fg_ddp_reducer *r, fg_tensor *loss, bool sync) {
    if (!sync) return fg_backward(loss);
    r->err = FG_OK;
    r->next = 0;
    r->nreqs = 0;
    if (r->after_backward) {
        fg_status s = fg_backward(loss);
        if (s != FG_OK) return s;
        return fg_ddp_reducer_reduce(r);
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
    fg_status ws = wait_all(r);
    return s != FG_OK ? s : ws;
}

fg_status fg_ddp_reducer_reduce(fg_ddp_reducer *r) {
    r->err = FG_OK;
    r->next = 0;
    r->nreqs = 0;
    for (int b = 0; b < r->nb; b++) r->b[b].pending = 0;
    launch_ready(r);
    return wait_all(r);
}
