/* ZeRO stage 3 (deepspeed_stage_3) and FSDP's FULL_SHARD and HYBRID_SHARD:
 * the parameters are sharded too.
 *
 * Design: the flat layout stays. Every parameter is still a view into the
 * root's one flat parameter buffer and its gradient a view into the flat
 * gradient, at the offsets of every other strategy; the shards are the
 * contiguous ranges stages 1 and 2 already cut (zero.c), so the optimizer,
 * clipping and the reducer work unchanged on [bounds[r], bounds[r+1]).
 * What changes is which pages of the two buffers are resident: outside its
 * shard a rank's buffers are released to the kernel (madvise DONTNEED:
 * private anonymous memory then holds no page there and reads as zero)
 * and filled again only while a unit needs them. So a rank holds its 1/N
 * shard persistently, plus the units gathered at that moment, and nothing
 * above this layer notices that the rest of the buffer is empty.
 *
 * Units (FSDP's wrapped modules): by default every module of type "Block"
 * (the GPT's transformer blocks; Lightning's auto_wrap_policy={Block}), or
 * of the type wrap_module_type names, or those a callable wrap_policy
 * picks, or with min_num_params the smallest modules holding at least that
 * many parameters (none of their children does). Each unit is a contiguous
 * range; what no unit covers (embeddings, final norm) is the root's unit.
 * nn/module_wrap.c calls the hooks below around a unit's forward and, from
 * two identity nodes on the tape, around its backward:
 *   pre_forward   gather the unit (waiting for its prefetch), prefetch the
 *                 next unit in forward order;
 *   post_forward  release it (the root's stays until backward is over,
 *                 the last unit's until its backward, which comes first);
 *   pre_backward  gather it again, prefetch the previous unit;
 *   post_backward release it.
 * fsdp SHARD_GRAD_OP with its parameters offloaded (strategy.c) keeps each
 * unit from its post_forward to its post_backward, PyTorch's
 * SHARD_GRAD_OP: one gather a step, the parameters sharded between steps.
 * Gathering a unit is one broadcast from each rank whose shard meets the
 * unit (pieces of allgather_bucket_size elements), asynchronous on the
 * communicator's progress thread, so a prefetch overlaps the compute of the
 * unit before it. The gradients are reduce-scattered by the reducer in
 * owner mode as under stage 2 (bucket by bucket during backward); each time
 * the finished suffix of the flat gradient grows, the part other ranks own
 * is released. fg_module_zero_grad (root) zeroes the shard and releases the
 * rest.
 *
 * Activation checkpointing: a checkpointed unit's recomputation runs
 * between its pre_backward and post_backward (module_wrap.c), gathered.
 * Units inside a checkpointed module run their forward again in its
 * backward: there pre_forward prefetches nothing and post_forward keeps
 * the unit for its backward, which follows at once.
 *
 * Released pages are only relied on to read as zero for gradients, and
 * only under fulgur's default allocator (malloc: private anonymous memory);
 * under another allocator the gradients are zeroed with memset instead and
 * only the parameter pages are released (their content is never read before
 * a gather rewrites it). A page shared by two ranges is never released.
 *
 * Pages: the two flat buffers ask for transparent huge pages, so that a
 * gather faults 2 MiB at a time (huge_pages); a released unit also
 * releases the pages it shares with released neighbours (edge_pages).
 *
 * HYBRID_SHARD: the shards are cut over the ranks of one shard group
 * (consecutive ranks, hybrid_shard_size of them: a node by default), the
 * gathers and the reduce-scatter run in that group, and after backward each
 * rank averages its shard of the gradient with the ranks holding the same
 * shard in the other groups (an allreduce over the replica group).
 *
 * Sharded initialisation: a model made under empty init has never been
 * touched; zero.c broadcasts rank 0's seed and each rank initialises its
 * shard alone (fg__module_init_elements), so the model never exists whole.
 * fg_strategy_gather_params gathers every unit and idles the hooks until
 * release or the next backward (FSDP's summon_full_params).
 *
 * Invariants: outside [bounds[rank], bounds[rank+1]) a parameter element
 * is valid only while its unit is GATHERED; requests of a unit are waited
 * before its pages are released; every rank issues the same collectives in
 * the same order (the hooks run at the same tape positions on every rank). */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "autograd/autograd_impl.h"
#include "optim/optim_impl.h"
#include "strategy_impl.h"

/* FETCHING: offloaded parameters (param_offload.c) being read from disk;
 * the broadcasts go out when the unit is needed */
enum { RELEASED = 0, FETCHING, IN_FLIGHT, GATHERED };

typedef struct span {
    int64_t a, b;
    int unit;
} span;

typedef struct unit {
    int nr;
    int64_t (*r)[2]; /* its element ranges: one, or the root's gaps */
    int state;
    fg_comm_req **reqs;
    int nreqs, cap;
} unit;

struct fg__zero3_state {
    fg_strategy *s;
    fg_comm *group, *replicas; /* shard group; HYBRID_SHARD's replica group (else NULL) */
    fg_comm *own_group;        /* split from s->comm here (freed here) */
    int world, rank;           /* in the shard group */
    int64_t lo, hi;            /* this rank's shard */
    int64_t numel, piece;
    size_t es;
    fg_dtype dt;
    char *pbase, *gbase;
    bool zero_pages; /* released pages read as zero (the default allocator) */
    int nunits;      /* units[nunits - 1] is the root's */
    unit *units;
    fg_module **mods;
    struct span *spans; /* every unit's ranges, by offset (edge_pages) */
    int nspans;
    fg__module_wrap wrap;
    int64_t grad_released;           /* the gradient suffix released in this backward */
    int64_t peak_gathered, gathered; /* parameter elements outside the shard, resident */
    bool model_gone;                 /* the model was freed first */
    bool summoned;                   /* fg_strategy_gather_params: all gathered, the hooks idle */
    bool keep_forward;     /* SHARD_GRAD_OP (offloaded): a unit stays gathered until its backward */
    fg__poffload *po;      /* offload_params_device=nvme (param_offload.c), or NULL */
    bool grad_shard_pages; /* zero_grad releases the shard's pages too (parameter offload) */
    fg_dev *dev; /* the buffers' device if the host cannot touch it: its discard, staging */
};

/* ------------------------------------------------------------ pages */

#define HUGE_PAGE ((size_t)2 << 20) /* x86-64's and arm64's (4 KiB pages) PMD size */

static size_t page_size(void) {
    static size_t ps;
    if (!ps) {
        long v = sysconf(_SC_PAGESIZE);
        ps = v > 0 ? (size_t)v : 4096;
    }
    return ps;
}

/* Releases the whole pages inside elements [a, b) of base, leaving the
 * shard alone; with zero, the elements of [a, b) outside the shard read
 * zero afterwards (the bytes of partial pages are cleared). */
static void release_range(fg__zero3_state *z, char *base, int64_t a, int64_t b, bool zero) {
    int64_t cut[2][2] = {{a, FG_MIN(b, z->lo)}, {FG_MAX(a, z->hi), b}};
    size_t ps = page_size();
    for (int k = 0; k < 2; k++) {
        if (cut[k][0] >= cut[k][1]) continue;
        char *p0 = base + (size_t)cut[k][0] * z->es, *p1 = base + (size_t)cut[k][1] * z->es;
        if (z->dev) { /* device memory: given back through the device */
            /* a range of the flat buffer, a live allocation: it cannot fail */
            fg__status_drop(fg_dev_discard(z->dev, p0, (size_t)(p1 - p0), zero, NULL));
            continue;
        }
        uintptr_t q0 = ((uintptr_t)p0 + ps - 1) & ~(uintptr_t)(ps - 1);
        uintptr_t q1 = (uintptr_t)p1 & ~(uintptr_t)(ps - 1);
        bool pages = q1 > q0 && (!zero || z->zero_pages);
        if (pages) madvise((void *)q0, q1 - q0, MADV_DONTNEED);
        if (!zero) continue;
        if (!pages) {
            memset(p0, 0, (size_t)(p1 - p0));
        } else {
            memset(p0, 0, (size_t)((char *)q0 - p0));
            memset((char *)q1, 0, (size_t)(p1 - (char *)q1));
        }
    }
}

static int64_t outside_shard(const fg__zero3_state *z, int64_t a, int64_t b) {
    int64_t in = FG_MAX(0, FG_MIN(b, z->hi) - FG_MAX(a, z->lo));
    return b - a - in;
}

/* ------------------------------------------------------------ units */

/* Releases the whole pages inside elements [a, b) of base (the shard's
 * too: offloaded parameters). */
static void drop_pages(fg__zero3_state *z, char *base, int64_t a, int64_t b) {
    size_t ps = page_size();
    uintptr_t q0 = ((uintptr_t)(base + (size_t)a * z->es) + ps - 1) & ~(uintptr_t)(ps - 1);
    uintptr_t q1 = (uintptr_t)(base + (size_t)b * z->es) & ~(uintptr_t)(ps - 1);
    if (a < b && z->dev) /* a range of the flat buffer, a live allocation: it cannot fail */
        fg__status_drop(
            fg_dev_discard(z->dev, base + (size_t)a * z->es, (size_t)(b - a) * z->es, false, NULL));
    else if (a < b && q1 > q0) madvise((void *)q0, q1 - q0, MADV_DONTNEED);
}

static FG_MUST_USE fg_status broadcasts(fg__zero3_state *z, unit *u) {
    u->nreqs = 0;
    u->state = IN_FLIGHT;
    const int64_t *bounds = fg__zero_bounds(z->s);
    for (int k = 0; k < u->nr; k++)
        for (int q = 0; q < z->world; q++) {
            int64_t lo = FG_MAX(u->r[k][0], bounds[q]), hi = FG_MIN(u->r[k][1], bounds[q + 1]);
            for (int64_t off = lo; off < hi; off += z->piece) {
                int64_t n = FG_MIN(z->piece, hi - off);
                char *p = z->pbase + (size_t)off * z->es;
                /* device memory: staged through the host, synchronously */
                fg_status st =
                    z->dev ? fg__staged_broadcast(z->group, z->dev, p, n, z->dt, q)
                           : fg_comm_ibroadcast(z->group, p, p, n, z->dt, q, &u->reqs[u->nreqs]);
                if (st != FG_OK)
                    return fg_error_wrap(st, "%s: gathering the parameters of a unit",
                                         fg_strategy_kind_name(z->s->kind));
                if (!z->dev) u->nreqs++;
            }
        }
    return FG_OK;
}

static FG_MUST_USE fg_status start(fg__zero3_state *z, unit *u) {
    if (u->state != RELEASED) return FG_OK;
    for (int k = 0; k < u->nr; k++) z->gathered += outside_shard(z, u->r[k][0], u->r[k][1]);
    z->peak_gathered = FG_MAX(z->peak_gathered, z->gathered);
    if (!z->po) return broadcasts(z, u);
    /* this rank's part comes from disk first; the broadcasts in finish */
    u->state = FETCHING;
    fg_status st = fg__poffload_fetch(z->po, (int)(u - z->units), u->r, u->nr);
    return st == FG_OK ? FG_OK
                       : fg_error_wrap(st, "%s: reading the parameters of a unit",
                                       fg_strategy_kind_name(z->s->kind));
}

static FG_MUST_USE fg_status finish(fg__zero3_state *z, unit *u) {
    fg_status first = FG_OK;
    if (u->state == FETCHING) { /* every rank broadcasts, even after a failed read */
        first = fg__poffload_land(z->po, (int)(u - z->units), z->pbase);
        fg_status st = broadcasts(z, u);
        if (first == FG_OK) first = st;
    }
    for (int i = 0; i < u->nreqs; i++) {
        fg_status st = fg_comm_wait(u->reqs[i]);
        if (st != FG_OK && first == FG_OK) first = st;
    }
    u->nreqs = 0;
    if (u->state == IN_FLIGHT) u->state = GATHERED;
    if (first != FG_OK)
        return fg_error_wrap(first, "%s: gathering the parameters of a unit",
                             fg_strategy_kind_name(z->s->kind));
    return FG_OK;
}

static FG_MUST_USE fg_status ensure(fg__zero3_state *z, int k) {
    unit *u = &z->units[k];
    FG_TRY(start(z, u));
    return u->state == IN_FLIGHT || u->state == FETCHING ? finish(z, u) : FG_OK;
}

/* Waits for what is in flight for u; a fetch not yet broadcast (every
 * rank has it in the same state) is dropped without communicating. */
static FG_MUST_USE fg_status quiesce(fg__zero3_state *z, unit *u) {
    if (u->state != FETCHING) return finish(z, u);
    fg__poffload_drop(z->po, (int)(u - z->units));
    u->state = GATHERED; /* nothing in flight; what it holds is stale */
    return FG_OK;
}

/* Whether the parameter page holding elements [e0, e1) is unused: outside
 * the shard, and every unit whose range meets it released. */
static bool page_unused(const fg__zero3_state *z, int64_t e0, int64_t e1) {
    if (!z->spans || (e0 < z->hi && e1 > z->lo)) return false;
    int a = 0, b = z->nspans;
    while (a < b) { /* the first span ending after e0 */
        int mid = (a + b) / 2;
        if (z->spans[mid].b <= e0) a = mid + 1;
        else b = mid;
    }
    for (int i = a; i < z->nspans && z->spans[i].a < e1; i++)
        if (z->units[z->spans[i].unit].state != RELEASED) return false;
    return true;
}

/* After unit u's release: the pages at its ranges' ends, which it shares
 * with the units next to it, go too once nothing uses them. (Kept, they
 * would also leave a 2 MiB block partly resident between steps, which the
 * kernel's khugepaged may fill to a whole huge page.) */
static void edge_pages(fg__zero3_state *z, const unit *u) {
    size_t ps = page_size();
    uintptr_t lo = (uintptr_t)z->pbase, hi = lo + (size_t)z->numel * z->es;
    for (int i = 0; i < u->nr; i++)
        for (int end = 0; end < 2; end++) {
            int64_t e = end ? u->r[i][1] - 1 : u->r[i][0];
            if (e < 0 || e >= z->numel) continue;
            uintptr_t p = (lo + (size_t)e * z->es) & ~(uintptr_t)(ps - 1);
            if (p < lo || p + ps > hi) continue; /* shared with memory not the buffer's */
            int64_t e0 = (int64_t)((p - lo) / z->es), e1 = e0 + (int64_t)(ps / z->es);
            if (e0 >= u->r[i][0] && e1 <= u->r[i][1]) continue; /* released whole already */
            if (!page_unused(z, e0, e1)) continue;
            /* a range of the flat buffer, a live allocation: it cannot fail */
            if (z->dev) fg__status_drop(fg_dev_discard(z->dev, (void *)p, ps, false, NULL));
            else madvise((void *)p, ps, MADV_DONTNEED);
        }
}

static FG_MUST_USE fg_status release(fg__zero3_state *z, int k) {
    unit *u = &z->units[k];
    if (u->state == RELEASED) return FG_OK;
    fg_status st = quiesce(z, u); /* nothing may still write into the pages */
    for (int i = 0; i < u->nr; i++) {
        release_range(z, z->pbase, u->r[i][0], u->r[i][1], false);
        if (z->po) drop_pages(z, z->pbase, FG_MAX(u->r[i][0], z->lo), FG_MIN(u->r[i][1], z->hi));
        z->gathered -= outside_shard(z, u->r[i][0], u->r[i][1]);
    }
    u->state = RELEASED;
    edge_pages(z, u);
    return st;
}

static FG_MUST_USE fg_status release_all(fg__zero3_state *z) {
    fg_status first = FG_OK;
    for (int k = 0; k < z->nunits; k++) {
        fg_status st = release(z, k);
        if (first == FG_OK) first = st;
    }
    return first;
}

/* ------------------------------------------------------------ hooks */

static FG_MUST_USE fg_status pre_forward(void *ud, int k) {
    fg__zero3_state *z = ud;
    if (z->summoned) return FG_OK;
    int root = z->nunits - 1;
    FG_TRY(ensure(z, k));
    /* a checkpoint's recomputation in backward: the next unit's backward
     * is over */
    if (fg__checkpoint_recomputing()) return FG_OK;
    int next = k == root ? 0 : k + 1;
    if (next < root) FG_TRY(start(z, &z->units[next]));
    return FG_OK;
}

static FG_MUST_USE fg_status post_forward(void *ud, int k) {
    fg__zero3_state *z = ud;
    if (z->summoned) return FG_OK;
    /* in a checkpoint's recomputation the unit's backward comes next:
     * post_backward releases it */
    if (fg__checkpoint_recomputing()) return FG_OK;
    /* the last unit's backward comes first: it stays gathered (FSDP does
     * not reshard it after forward either); so does the root's, until
     * backward is over. Without a backward to come, everything goes now. */
    int root = z->nunits - 1;
    if (!fg_is_grad_enabled()) return k == root ? release_all(z) : release(z, k);
    return k < root - 1 && !z->keep_forward ? release(z, k) : FG_OK;
}

static FG_MUST_USE fg_status pre_backward(void *ud, int k) {
    fg__zero3_state *z = ud;
    if (z->summoned) return FG_OK;
    int root = z->nunits - 1;
    FG_TRY(ensure(z, k));
    int prev = k == root ? root - 1 : k - 1;
    if (prev >= 0 && prev != root) FG_TRY(start(z, &z->units[prev]));
    return FG_OK;
}

static FG_MUST_USE fg_status post_backward(void *ud, int k) {
    fg__zero3_state *z = ud;
    if (z->summoned) return FG_OK;
    return k == z->nunits - 1 ? FG_OK : release(z, k);
}

static void zero_grad(void *ud) {
    fg__zero3_state *z = ud;
    char *p0 = z->gbase + (size_t)z->lo * z->es, *p1 = z->gbase + (size_t)z->hi * z->es;
    if (z->dev) { /* the shard cleared (or given back), the rest given back */
        /* a range of the flat buffer, a live allocation: it cannot fail */
        fg__status_drop(fg_dev_discard(z->dev, p0, (size_t)(p1 - p0), true, NULL));
        release_range(z, z->gbase, 0, z->numel, true);
        return;
    }
    if (z->grad_shard_pages && z->zero_pages) { /* released pages read zero: only edges to clear */
        size_t ps = page_size();
        char *q0 = (char *)(((uintptr_t)p0 + ps - 1) & ~(uintptr_t)(ps - 1));
        char *q1 = (char *)((uintptr_t)p1 & ~(uintptr_t)(ps - 1));
        if (q1 > q0) {
            drop_pages(z, z->gbase, z->lo, z->hi);
            memset(p0, 0, (size_t)(q0 - p0));
            p0 = q1;
        }
    }
    memset(p0, 0, (size_t)(p1 - p0));
    release_range(z, z->gbase, 0, z->numel, true);
}

/* The reducer's news: gradient elements [begin, numel) are reduced. */
static void reduced(void *ud, int64_t begin) {
    fg__zero3_state *z = ud;
    if (begin >= z->grad_released || !z->zero_pages) return;
    if (z->dev) { /* no huge pages on a device */
        release_range(z, z->gbase, begin, z->grad_released, true);
        z->grad_released = begin;
        return;
    }
    /* with the rest of the huge page a later gradient faulted in across
     * the bound, into the part released already (reduced, reading zero):
     * up to the next 2 MiB bound, where no partial page needs clearing */
    uintptr_t at = (uintptr_t)(z->gbase + (size_t)z->grad_released * z->es);
    uintptr_t up = (at + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1);
    int64_t end = z->grad_released + (int64_t)((up - at) / z->es);
    release_range(z, z->gbase, begin, FG_MIN(end, z->numel), true);
    z->grad_released = begin;
}

/* The model is being freed before the strategy. */
static void detach_model(void *ud) {
    fg__zero3_state *z = ud;
    /* the model goes whatever a wait says (fg_module_free keeps the
     * caller's error): nothing may write into its pages after this */
    for (int k = 0; k < z->nunits; k++) fg__status_drop(quiesce(z, &z->units[k]));
    z->model_gone = true;
    fg__zero3_params_home(z->s); /* the module's buffer goes: nothing to copy into */
}

/* ------------------------------------------------------------ setup */

/* The auto-wrap policy of the sharded options (NULL: the defaults). */
static bool is_unit(fg_module *m, const fg_sharded_opts *o) {
    if (!m->parent || m->p_numel == 0) return false;
    if (o && o->wrap_policy) return o->wrap_policy(m, o->wrap_policy_ud);
    int64_t min_params = o ? o->min_num_params : 0;
    if (!min_params)
        return !strcmp(m->type, o && o->wrap_module_type ? o->wrap_module_type : "Block");
    if (m->p_numel < min_params) return false;
    for (int i = 0; i < m->nchild; i++)
        if (m->child[i]->p_numel >= min_params) return false;
    return true;
}

static void collect_units(fg_module *m, const fg_sharded_opts *o, fg_module **out, int *n) {
    if (is_unit(m, o)) {
        if (out) out[*n] = m;
        (*n)++;
        return;
    }
    for (int i = 0; i < m->nchild; i++) collect_units(m->child[i], o, out, n);
}

static FG_MUST_USE fg_status make_units(fg__zero3_state *z, fg_module *root,
                                        const fg_sharded_opts *o) {
    int n = 0;
    collect_units(root, o, NULL, &n);
    z->nunits = n + 1;
    z->units = fg_calloc((size_t)z->nunits, sizeof *z->units);
    z->mods = fg_calloc((size_t)z->nunits, sizeof *z->mods);
    if (!z->units || !z->mods) return FG_ENOMEM;
    n = 0;
    collect_units(root, o, z->mods, &n);
    z->mods[n] = root;
    for (int k = 0; k < n; k++) {
        unit *u = &z->units[k];
        u->nr = 1;
        if (!(u->r = fg_calloc(1, sizeof *u->r))) return FG_ENOMEM;
        u->r[0][0] = z->mods[k]->p_off;
        u->r[0][1] = z->mods[k]->p_off + z->mods[k]->p_numel;
    }
    /* the root's: the gaps between the units (preorder: increasing offsets) */
    unit *ru = &z->units[n];
    if (!(ru->r = fg_calloc((size_t)n + 1, sizeof *ru->r))) return FG_ENOMEM;
    int64_t at = 0;
    for (int k = 0; k <= n; k++) {
        int64_t end = k < n ? z->units[k].r[0][0] : z->numel;
        if (end > at) {
            ru->r[ru->nr][0] = at;
            ru->r[ru->nr][1] = end;
            ru->nr++;
        }
        if (k < n) at = z->units[k].r[0][1];
    }
    /* request slots: one per piece per shard a range meets */
    for (int k = 0; k <= n; k++) {
        unit *u = &z->units[k];
        const int64_t *b = fg__zero_bounds(z->s);
        for (int i = 0; i < u->nr; i++)
            for (int q = 0; q < z->world; q++) {
                int64_t lo = FG_MAX(u->r[i][0], b[q]), hi = FG_MIN(u->r[i][1], b[q + 1]);
                if (hi > lo) u->cap += (int)((hi - lo + z->piece - 1) / z->piece);
            }
        if (!(u->reqs = fg_calloc((size_t)u->cap + 1, sizeof *u->reqs))) return FG_ENOMEM;
    }
    /* the spans by offset: the root's gaps lie between the units' ranges */
    if (!(z->spans = fg_calloc((size_t)(n + ru->nr), sizeof *z->spans))) return FG_ENOMEM;
    for (int k = 0, g = 0; k < n || g < ru->nr;) {
        bool gap = k == n || (g < ru->nr && ru->r[g][0] < z->units[k].r[0][0]);
        const int64_t *r = gap ? ru->r[g++] : z->units[k++].r[0];
        z->spans[z->nspans++] = (span){r[0], r[1], gap ? n : k - 1};
    }
    return FG_OK;
}

/* Transparent huge pages for the two flat buffers (MADV_HUGEPAGE: the
 * kernel's THP mode is often madvise). Every gather faults a unit's pages
 * in again, and the gradient's once a step, a fault per 4 KiB page: with
 * 2 MiB pages the kernel zeroes the same bytes in 512 times fewer faults
 * (the 14M-parameter bench GPT: a step's faults fell by 80%). Releasing
 * part of a huge page splits it and frees that part, so what a rank holds
 * is unchanged but for the huge pages on a unit's edges, while it is
 * gathered. The 2 MiB blocks the shard's bounds or two units' edge cut
 * keep small pages: there the kernel's background collapse (khugepaged)
 * would fill the released side of a block whose other side is resident
 * (for good on the shard's edge; until its next release on a unit's). Where
 * the kernel has no huge page at hand it faults small pages, as before;
 * FULGUR_STAGE3_HUGE_PAGES=0 asks for small pages only. */
static void huge_pages(fg__zero3_state *z) {
    const uintptr_t hp = HUGE_PAGE;
    char *bufs[2] = {z->pbase, z->gbase};
    for (int i = 0; i < 2; i++) {
        uintptr_t a = ((uintptr_t)bufs[i] + hp - 1) & ~(hp - 1);
        uintptr_t b = ((uintptr_t)bufs[i] + (size_t)z->numel * z->es) & ~(hp - 1);
        if (b <= a || madvise((void *)a, b - a, MADV_HUGEPAGE) != 0) continue;
        int64_t bound[2] = {z->lo, z->hi};
        for (int k = 0; k < 2; k++) {
            uintptr_t c = ((uintptr_t)bufs[i] + (size_t)bound[k] * z->es) & ~(hp - 1);
            if (c >= a && c < b) madvise((void *)c, hp, MADV_NOHUGEPAGE);
        }
        /* and the blocks two units share: released while its neighbour is
         * gathered, a unit's side would be filled again by the collapse */
        for (int k = 1; k < z->nspans; k++) {
            if (z->spans[k].unit == z->spans[k - 1].unit) continue;
            uintptr_t c = ((uintptr_t)bufs[i] + (size_t)z->spans[k].a * z->es) & ~(hp - 1);
            if (c >= a && c < b) madvise((void *)c, hp, MADV_NOHUGEPAGE);
        }
    }
}

fg_status fg__zero3_groups(fg_strategy *s, const fg_sharded_opts *o, fg_comm **group) {
    const char *name = fg_strategy_kind_name(s->kind);
    fg__zero3_state *z = fg_calloc(1, sizeof *z);
    if (!z) return fg_error_wrap(FG_ENOMEM, "%s setup", name);
    s->zero3 = z;
    z->s = s;
    z->group = s->comm;
    bool hybrid =
        s->kind == FG_STRATEGY_FSDP && o && o->sharding_strategy == FG_SHARDING_HYBRID_SHARD;
    if (hybrid) {
        int world = fg_comm_size(s->comm), rank = fg_comm_rank(s->comm);
        int size = o->hybrid_shard_size > 0 ? o->hybrid_shard_size : fg_comm_local_size(s->comm);
        if (size < 1 || world % size)
            return fg_error(FG_EINVAL,
                            "fsdp HYBRID_SHARD: a shard group of %d ranks does not divide the %d "
                            "ranks: set hybrid_shard_size (--hybrid-shard-size) to a divisor of "
                            "the world size",
                            size, world);
        fg_status st = fg_comm_split(s->comm, rank / size, rank, &z->own_group);
        if (st == FG_OK) st = fg_comm_split(s->comm, rank % size, rank, &z->replicas);
        if (st != FG_OK)
            return fg_error_wrap(st, "fsdp HYBRID_SHARD: making the shard and replica groups");
        z->group = z->own_group;
    }
    *group = z->group;
    return FG_OK;
}

fg_status fg__zero3_setup(fg_strategy *s, const fg_sharded_opts *o) {
    fg__zero3_state *z = s->zero3;
    fg_module *m = s->model;
    fg_sharded_opts d = o ? *o : (fg_sharded_opts){0};
    long huge;
    FG_TRY(fg__env_int("FULGUR_STAGE3_HUGE_PAGES", 1, &huge));
    if (huge != 0 && huge != 1)
        return fg_error(FG_EINVAL,
                        "FULGUR_STAGE3_HUGE_PAGES=\"%s\": expected 1 (huge pages for "
                        "the flat buffers, the default) or 0 (small pages only)",
                        getenv("FULGUR_STAGE3_HUGE_PAGES"));
    z->world = fg_comm_size(z->group);
    z->rank = fg_comm_rank(z->group);
    fg__zero_range(s, fg_comm_rank(s->comm), &z->lo, &z->hi);
    fg_tensor *flat = fg_module_flat_params(m);
    z->dt = fg_tensor_dtype(flat);
    z->es = fg_dtype_size(z->dt);
    z->numel = fg_tensor_numel(flat);
    z->pbase = fg_tensor_data(flat);
    z->gbase = fg_tensor_data(fg_module_flat_grads(m));
    z->piece = d.allgather_bucket_size > 0 ? d.allgather_bucket_size : 200000000;
    z->dev = fg__zero_dev(flat);
    z->zero_pages = fg__alloc_is_default() || z->dev; /* a device's discard reads zero */
    /* with the parameters on disk nothing of the gradient stays resident
     * between steps either (and setup does not write the shard) */
    z->grad_shard_pages = d.offload_params_device == FG_OFFLOAD_NVME;
    z->grad_released = z->numel;
    z->keep_forward =
        s->kind == FG_STRATEGY_FSDP && d.sharding_strategy == FG_SHARDING_SHARD_GRAD_OP;
    if (make_units(z, m, &d) != FG_OK)
        return fg_error_wrap(FG_ENOMEM, "%s setup", fg_strategy_kind_name(s->kind));
    if (z->zero_pages && huge && !z->dev) huge_pages(z);
    z->wrap = (fg__module_wrap){.pre_forward = pre_forward,
                                .post_forward = post_forward,
                                .pre_backward = pre_backward,
                                .post_backward = post_backward,
                                .zero_grad = zero_grad,
                                .detach = detach_model,
                                .ud = z};
    fg__module_set_wrap(m, &z->wrap, z->mods, z->nunits);
    for (int k = 0; k < z->nunits; k++) z->units[k].state = GATHERED;
    z->gathered = z->numel - (z->hi - z->lo);
    return FG_OK;
}

void fg__zero3_start(fg_strategy *s) {
    fg__zero3_state *z = s->zero3;
    fg__status_drop(release_all(z)); /* nothing in flight: nothing to wait for or fail */
    z->peak_gathered = 0;
    zero_grad(z);
}

fg__ddp_reducer_opts fg__zero3_reducer_opts(fg_strategy *s, fg__ddp_reducer_opts ro,
                                            const fg_sharded_opts *o) {
    fg__zero3_state *z = s->zero3;
    ro.reduced = reduced;
    ro.reduced_ud = z;
    /* without a bucket size, one bucket per unit or so: each unit's
     * gradient is released soon after its backward */
    if (!o || !o->reduce_bucket_size) {
        fg_module *m = s->model;
        int n = 0;
        collect_units(m, o, NULL, &n);
        int64_t numel = fg_module_numel(m), each = n ? numel / (n + 1) : numel;
        double mb = (double)FG_MAX(each, 1) * (double)fg_dtype_size(fg_module_dtype(m)) / 1048576.0;
        if (mb < ro.bucket_cap_mb) ro.bucket_cap_mb = ro.first_bucket_mb = mb;
    }
    return ro;
}

fg_status fg__zero3_backward(fg_strategy *s, fg_tensor *loss) {
    fg__zero3_state *z = s->zero3;
    if (z->summoned) FG_TRY(fg__zero3_release_all(s)); /* the hooks take over again */
    z->grad_released = z->numel;
    fg_status st = fg__ddp_reducer_backward(s->reducer, loss, s->sync);
    fg_status rs = release_all(z);
    if (st == FG_OK) st = rs;
    if (st == FG_OK && s->sync && z->replicas && fg_comm_size(z->replicas) > 1) {
        char *g = z->gbase + (size_t)z->lo * z->es;
        st = fg__staged_allreduce(z->replicas, z->dev, g, z->hi - z->lo, z->dt, FG_REDUCE_OP_AVG);
        if (st != FG_OK)
            st = fg_error_wrap(st, "fsdp HYBRID_SHARD: averaging the gradient shard over the "
                                   "replica groups");
    }
    return st;
}

void fg__zero3_free(fg_strategy *s) {
    fg__zero3_state *z = s->zero3;
    if (!z) return;
    if (z->units)
        for (int k = 0; k < z->nunits; k++) /* freed whatever a wait says */
            fg__status_drop(quiesce(z, &z->units[k]));
    if (!z->model_gone) fg__zero3_params_home(s); /* the model keeps its shard */
    if (z->mods && !z->model_gone) fg__module_set_wrap(s->model, NULL, NULL, 0);
    for (int k = 0; z->units && k < z->nunits; k++) {
        fg_free(z->units[k].r);
        fg_free(z->units[k].reqs);
    }
    fg_free(z->units);
    fg_free(z->mods);
    fg_free(z->spans);
    fg_comm_free(z->own_group);
    fg_comm_free(z->replicas);
    fg_free(z);
    s->zero3 = NULL;
}

int64_t fg__zero3_peak_gathered(const fg_strategy *s) {
    return s->zero3 ? s->zero3->peak_gathered : 0;
}

int fg__zero3_num_units(const fg_strategy *s) { return s->zero3 ? s->zero3->nunits : 0; }

int64_t fg__zero3_gathered(const fg_strategy *s) { return s->zero3 ? s->zero3->gathered : 0; }

fg_status fg__zero3_gather_all(fg_strategy *s) {
    fg__zero3_state *z = s->zero3;
    for (int k = 0; k < z->nunits; k++) FG_TRY(ensure(z, k));
    z->summoned = true;
    return FG_OK;
}

fg_status fg__zero3_release_all(fg_strategy *s) {
    s->zero3->summoned = false;
    return release_all(s->zero3);
}

/* ------------------------------------------------------------ nvme parameter offload */

fg_status fg__zero3_offload_params(fg_strategy *s) {
    fg__zero3_state *z = s->zero3;
    int *nr = fg_calloc((size_t)z->nunits, sizeof *nr);
    if (!nr) return FG_ENOMEM;
    for (int k = 0; k < z->nunits; k++) nr[k] = z->units[k].nr;
    fg_status st = fg__poffload_new(s->opt, z->lo, z->hi, z->es, z->nunits, nr, &z->po);
    fg_free(nr);
    if (st != FG_OK) return st;
    FG_TRY(release_all(z));
    drop_pages(z, z->pbase, z->lo, z->hi);
    return FG_OK;
}

fg__poffload *fg__zero3_param_offload(const fg_strategy *s) {
    return s->zero3 ? s->zero3->po : NULL;
}

void fg__zero3_params_home(fg_strategy *s) {
    fg__zero3_state *z = s->zero3;
    if (!z || !z->po) return;
    for (int k = 0; k < z->nunits; k++)
        if (z->units[k].state == FETCHING) /* a fetch's read is dropped, not waited on */
            fg__status_drop(release(z, k));
    if (!z->model_gone) fg__poffload_home(z->po);
    fg__poffload_free(z->po);
    z->po = NULL;
}
