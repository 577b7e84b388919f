/* ZeRO stages 1 and 2, as DeepSpeed names them (fsdp's SHARD_GRAD_OP is
 * stage 2), and what stage 3 shares with them (its own part: zero3.c).
 *
 * The flat parameter vector is cut into world_size contiguous shards in
 * rank order, on 64-byte lines and without padding (they differ by at most
 * one line). Rank r keeps the optimizer state of shard r only: setup cuts
 * the optimizer's state tensors to that range (fg__optimizer_shard_state).
 * A backward with sync reduce-scatters the flat gradient through the
 * reducer in owner mode, so that shard r of rank r's flat gradient holds
 * the average over ranks: stage 1 once backward is over, stage 2 bucket by
 * bucket while backward runs. The user's fg_optimizer_step then updates
 * shard r alone, and the post-step hook set here all-gathers the parameters
 * in place (allgatherv, in pieces of allgather_bucket_size elements), so
 * every rank holds the whole updated model again.
 *
 * Stage 2 (and SHARD_GRAD_OP) shards the gradient as DeepSpeed's does: as
 * soon as a bucket's reduction has ended, the part of it other ranks own
 * is handed back to the kernel (madvise DONTNEED: it reads zero after), and
 * fg_module_zero_grad zeroes the shard and releases the rest, so between
 * steps a rank holds 1/N of the gradient, and during backward the buckets
 * not reduced yet. Without reduce_bucket_size its buckets are ddp's (25 MiB)
 * rather than one of the whole model, so that they go while backward runs.
 * This needs fulgur's default allocator (released pages of private
 * anonymous memory read as zero); under another one the gradient stays
 * whole. Under stages 2 and 3, backward waits for the oldest reduction once
 * two buckets' worth are started and not finished, so that the gradient
 * not released yet stays about two buckets whatever the machine's load.
 *
 * Invariants: bounds[0] = 0 <= bounds[1] <= ... <= bounds[world] = numel;
 * while z->opt is set, the optimizer's state range is [bounds[rank],
 * bounds[rank + 1]) and its hook points here. Whichever of optimizer and
 * strategy is freed first unhooks the other (detach / fg__zero_free). */
#include <math.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "optim/optim_impl.h"
#include "strategy_impl.h"

#define DEFAULT_BUCKET 200000000 /* elements: Lightning's DeepSpeedStrategy default */

struct fg__zero_state {
    fg_comm *comm; /* the shard group: the strategy's, or HYBRID_SHARD's (borrowed) */
    int world, rank;
    int64_t *bounds;          /* world + 1 */
    int64_t *counts, *displs; /* world each: one all-gather piece */
    int64_t piece;            /* elements per rank per all-gather piece */
    fg_optimizer *opt;        /* NULL once the optimizer was freed */
    /* stage 2: the gradient outside the shard released (see the top) */
    bool release_grads;
    char *gbase;
    size_t es;
    int64_t numel, released; /* [released, numel) released in this backward */
    fg__module_wrap wrap;    /* its zero_grad only: no units */
    bool model_gone;
    fg_dev *dev; /* the flat buffers' device when the host cannot touch it, else NULL */
};

fg_dev *fg__zero_dev(fg_tensor *flat) {
    fg_dev *d = fg_tensor_dev(flat);
    return d && !fg_dev_host_accessible(d) ? d : NULL;
}

/* Zeroes gradient elements [a, b) outside this rank's shard by handing
 * their whole pages back to the kernel (they read zero after) and clearing
 * the bytes of the pages at the ends. */
static void release_grad(fg__zero_state *z, int64_t a, int64_t b) {
    int64_t lo = z->bounds[z->rank], hi = z->bounds[z->rank + 1];
    int64_t cut[2][2] = {{a, FG_MIN(b, lo)}, {FG_MAX(a, hi), b}};
    long v = sysconf(_SC_PAGESIZE);
    uintptr_t ps = v > 0 ? (uintptr_t)v : 4096;
    for (int k = 0; k < 2; k++) {
        if (cut[k][0] >= cut[k][1]) continue;
        char *p0 = z->gbase + (size_t)cut[k][0] * z->es, *p1 = z->gbase + (size_t)cut[k][1] * z->es;
        if (z->dev) { /* the device's pages given back through it */
            /* a range of the flat buffer, a live allocation: it cannot fail */
            fg__status_drop(fg_dev_discard(z->dev, p0, (size_t)(p1 - p0), true, NULL));
            continue;
        }
        uintptr_t q0 = ((uintptr_t)p0 + ps - 1) & ~(ps - 1), q1 = (uintptr_t)p1 & ~(ps - 1);
        if (q1 > q0 && madvise((void *)q0, q1 - q0, MADV_DONTNEED) == 0) {
            memset(p0, 0, (size_t)((char *)q0 - p0));
            memset((char *)q1, 0, (size_t)(p1 - (char *)q1));
        } else {
            memset(p0, 0, (size_t)(p1 - p0));
        }
    }
}

/* The reducer's news: gradient elements [begin, numel) are reduced. */
static void grads_reduced(void *ud, int64_t begin) {
    fg__zero_state *z = ud;
    if (begin >= z->released) return;
    release_grad(z, begin, z->released);
    z->released = begin;
}

static void zero_grad2(void *ud) {
    fg__zero_state *z = ud;
    int64_t lo = z->bounds[z->rank], hi = z->bounds[z->rank + 1];
    if (z->dev) /* a range of the flat buffer, a live allocation: it cannot fail */
        fg__status_drop(fg_dev_memset(z->dev, z->gbase + (size_t)lo * z->es, 0,
                                      (size_t)(hi - lo) * z->es, NULL));
    else memset(z->gbase + (size_t)lo * z->es, 0, (size_t)(hi - lo) * z->es);
    release_grad(z, 0, z->numel);
}

static void detach_model2(void *ud) { ((fg__zero_state *)ud)->model_gone = true; }

void fg__zero_before_backward(fg_strategy *s) {
    if (s->zero && s->zero->release_grads) s->zero->released = s->zero->numel;
}

/* Shards of numel elements of es bytes over world ranks: whole 64-byte
 * lines each, as even as that allows. */
void fg__zero_cut(int64_t numel, int world, size_t es, int64_t *bounds) {
    int64_t line = es < 64 ? (int64_t)(64 / es) : 1;
    int64_t lines = (numel + line - 1) / line;
    for (int q = 0; q <= world; q++) bounds[q] = FG_MIN(numel, lines * q / world * line);
}

void fg__zero_range(const fg_strategy *s, int rank, int64_t *begin, int64_t *end) {
    /* HYBRID_SHARD: world rank r is rank r % size of its shard group */
    int q = rank % s->zero->world;
    *begin = s->zero->bounds[q];
    *end = s->zero->bounds[q + 1];
}

const int64_t *fg__zero_bounds(const fg_strategy *s) { return s->zero->bounds; }

/* The post-step hook: every rank's updated shard to every rank, in place. */
static FG_MUST_USE fg_status gather_params(void *ud, fg_optimizer *o) {
    (void)o;
    fg_strategy *s = ud;
    fg__zero_state *z = s->zero;
    fg_tensor *flat = fg_module_flat_params(s->model);
    fg_dtype dt = fg_tensor_dtype(flat);
    char *base = fg_tensor_data(flat);
    fg_dev *dev = fg__zero_dev(flat);
    int64_t longest = 0;
    for (int q = 0; q < z->world; q++) longest = FG_MAX(longest, z->bounds[q + 1] - z->bounds[q]);
    for (int64_t off = 0; off < longest; off += z->piece) {
        for (int q = 0; q < z->world; q++) {
            int64_t lo = FG_MIN(z->bounds[q] + off, z->bounds[q + 1]);
            z->displs[q] = lo;
            z->counts[q] = FG_MIN(z->piece, z->bounds[q + 1] - lo);
        }
        fg_status st = fg__staged_allgatherv(z->comm, dev, base, z->counts, z->displs, dt);
        if (st != FG_OK)
            return fg_error_wrap(st, "%s: all-gathering the parameters after the optimizer step",
                                 fg_strategy_kind_name(s->kind));
    }
    return FG_OK;
}

static FG_MUST_USE fg_status after_step3(void *ud, fg_optimizer *o) {
    (void)o;
    return fg__zero3_release_all(ud);
}

static void detach(void *ud) {
    fg_strategy *s = ud;
    fg__zero3_params_home(s); /* offloaded parameters back before their file goes */
    s->zero->opt = NULL;
    s->opt = NULL;
}

fg_status fg__zero_setup(fg_strategy *s, const fg_sharded_opts *o) {
    fg_sharded_opts d = o ? *o : (fg_sharded_opts){0};
    const char *name = fg_strategy_kind_name(s->kind);
    fg_module *m = s->model;
    if (!s->opt || fg_optimizer_module(s->opt) != m)
        return fg_error(FG_EINVAL,
                        "%s: needs the optimizer over the whole model (it shards the optimizer's "
                        "state); got %s",
                        name, s->opt ? "one over another module" : "none");
    bool s3 = s->mode == FG_MODE_ZERO3;
    fg_comm *group = s->comm;
    if (s3) FG_TRY(fg__zero3_groups(s, o, &group));
    /* sharded initialisation (a model made under empty init): rank 0's
     * seed, each rank initialising its shard alone, below */
    bool empty = s3 && fg__module_deferred(m);
    uint64_t seed = empty ? fg__module_root(m)->flat->seed : 0;
    if (empty) {
        fg_status st = fg_comm_broadcast(s->comm, &seed, &seed, 1, FG_I64, 0);
        if (st != FG_OK) return fg_error_wrap(st, "%s setup: broadcasting the seed", name);
    } else {
        FG_TRY(fg__strategy_broadcast_params(s));
    }
    fg__zero_state *z = fg_calloc(1, sizeof *z);
    if (!z) return fg_error_wrap(FG_ENOMEM, "%s setup", name);
    s->zero = z;
    z->comm = group;
    z->world = fg_comm_size(group);
    z->rank = fg_comm_rank(group);
    z->bounds = fg_calloc((size_t)z->world + 1, sizeof *z->bounds);
    z->counts = fg_calloc((size_t)z->world, sizeof *z->counts);
    z->displs = fg_calloc((size_t)z->world, sizeof *z->displs);
    if (!z->bounds || !z->counts || !z->displs) return fg_error_wrap(FG_ENOMEM, "%s setup", name);
    fg_tensor *grads = fg_module_flat_grads(m);
    size_t es = fg_dtype_size(fg_tensor_dtype(grads));
    fg__zero_cut(fg_tensor_numel(grads), z->world, es, z->bounds);
    int64_t gather = d.allgather_bucket_size ? d.allgather_bucket_size : DEFAULT_BUCKET;
    z->piece = FG_MAX(1, gather / z->world);
    int64_t reduce = d.reduce_bucket_size ? d.reduce_bucket_size : DEFAULT_BUCKET;
    double mb = (double)reduce * (double)es / 1048576.0;
    /* Parameters no backward reached count with the gradient they hold
     * (zero after zero_grad), as DeepSpeed reduces every bucket. */
    fg__ddp_reducer_opts ro = {.bucket_cap_mb = mb,
                               .first_bucket_mb = mb,
                               .find_unused_parameters = true,
                               .name = name,
                               .owner_bounds = z->bounds,
                               .world = z->world,
                               .after_backward = s->mode == FG_MODE_ZERO1};
    if (s3) ro = fg__zero3_reducer_opts(s, ro, o);
    /* on a device its own discard gives the pages back */
    z->dev = fg__zero_dev(grads);
    z->release_grads = s->mode == FG_MODE_ZERO2 && (fg__alloc_is_default() || z->dev);
    if (z->release_grads) {
        z->gbase = fg_tensor_data(grads);
        z->es = es;
        z->numel = z->released = fg_tensor_numel(grads);
        ro.reduced = grads_reduced;
        ro.reduced_ud = z;
        if (!d.reduce_bucket_size) {
            ro.bucket_cap_mb = 25;  /* ddp's */
            ro.first_bucket_mb = 1; /* ddp's: communication starts early */
        }
    }
    /* stages 2 and 3: at most two buckets' worth of reductions started and
     * not finished, so that the gradient they release is never far behind
     * backward (on a busy machine the communication lags) */
    if (ro.reduced) ro.max_pending = (int64_t)(2 * ro.bucket_cap_mb * 1048576.0 / (double)es);
    FG_TRY(fg__strategy_reducer_new(s, group, &ro));
    if (s3) FG_TRY(fg__zero3_setup(s, o));
    /* last: a failure before leaves the optimizer as it was */
    FG_TRY(fg__optimizer_shard_state(s->opt, z->bounds[z->rank], z->bounds[z->rank + 1]));
    z->opt = s->opt;
    /* stage 3 gathers nothing after the step: the parameters stay sharded
     * (and copies gathered before it, now stale, are released) */
    fg__optimizer_set_hook(z->opt, &(fg__optim_hook){.post_step = s3 ? after_step3 : gather_params,
                                                     .detach = detach,
                                                     .ud = s});
    /* nothing fails from here on: a failed setup left the model as it was */
    if (empty) fg__module_init_elements(m, z->bounds[z->rank], z->bounds[z->rank + 1], seed);
    if (s3) fg__zero3_start(s);
    if (z->release_grads) {
        z->wrap = (fg__module_wrap){.zero_grad = zero_grad2, /* no units */
                                    .detach = detach_model2,
                                    .ud = z};
        fg__module_set_wrap(m, &z->wrap, NULL, 0);
        zero_grad2(z);
    }
    return FG_OK;
}

void fg__zero_free(fg_strategy *s) {
    fg__zero_state *z = s->zero;
    if (!z) return;
    if (z->opt) fg__optimizer_set_hook(z->opt, NULL);
    if (z->release_grads && !z->model_gone) fg__module_set_wrap(s->model, NULL, NULL, 0);
    fg_free(z->bounds);
    fg_free(z->counts);
    fg_free(z->displs);
    fg_free(z);
    s->zero = NULL;
}

fg_status fg__zero_clip(fg_strategy *s, double max_norm, double *total_norm) {
    fg__zero_state *z = s->zero;
    fg_tensor *g = fg_module_flat_grads(s->model);
    fg_dtype dt = fg_tensor_dtype(g);
    int64_t lo = z->bounds[z->rank], n = z->bounds[z->rank + 1] - lo;
    char *mine = (char *)fg_tensor_data(g) + (size_t)lo * fg_dtype_size(dt);
    fg_dev *dev = fg__zero_dev(g);
    fg_tensor *shard = NULL; /* on a device: the shard as a tensor, for its kernels */
    if (dev && !(shard = fg_tensor_wrap_on(dev, mine, dt, 1, &n)))
        return fg_error_wrap(fg_last_status(), "%s: clip_gradients",
                             fg_strategy_kind_name(s->kind));
    double sq = 0;
    fg_status ss = shard ? fg__ops_sumsq(shard, &sq) : fg__sumsq(mine, dt, n, &sq);
    if (ss != FG_OK) {
        fg_tensor_free(shard);
        return ss;
    }
    fg_status st = fg_comm_allreduce(z->comm, &sq, &sq, 1, FG_F64, FG_REDUCE_OP_SUM);
    if (st != FG_OK) {
        fg_tensor_free(shard);
        return fg_error_wrap(st, "%s: clip_gradients: summing the shards' squares",
                             fg_strategy_kind_name(s->kind));
    }
    double norm = sqrt(sq);
    if (total_norm) *total_norm = norm;
    double c = max_norm / (norm + 1e-6);
    if (max_norm > 0 && norm > max_norm)
        st = shard ? fg__ops_scale_flat(shard, c) : fg__scale(mine, dt, n, c);
    fg_tensor_free(shard);
    return st;
}
