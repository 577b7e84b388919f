/* Device memory bookkeeping: the caching allocator (cuda, guarded) and the
 * counting allocator (cpu), with PyTorch's memory_stats figures, the
 * out-of-memory message and the leak check.
 *
 * The caching allocator follows PyTorch's CUDACachingAllocator:
 *   - sizes are rounded up to 512 bytes;
 *   - requests of 1 MiB or less come from 2 MiB segments (the small pool),
 *     larger ones from 20 MiB segments below 10 MiB and from segments of
 *     their own size rounded to 2 MiB above (the large pool);
 *   - a free block is reused best-fit, only by a request for the same
 *     stream (a block freed on one stream may still be read by work queued
 *     there);
 *   - a block is split only when the remainder is large enough to be
 *     useful (512 bytes in the small pool, more than 1 MiB in the large
 *     one), so that no block wastes more than that on its request;
 *   - oversize requests (max_split_bytes or more) get a segment of their
 *     own that is never split and serves later requests only up to 20 MiB
 *     larger; freed, it is cached only while the oversize bytes cached
 *     stay within oversize_cache_bytes, else given back at once;
 *   - freed neighbours in a segment merge; a segment with no allocation is
 *     given back by fg_dev_empty_cache, and before an out-of-memory.
 * All functions here run with d->mu held. */
#include <stdio.h>
#include <string.h>

#include "device_impl.h"

#define ROUND 512u
#define SMALL_SIZE ((size_t)1 << 20) /* largest small-pool request */
#define SMALL_SEG ((size_t)2 << 20)  /* small-pool segment */
#define LARGE_SEG ((size_t)20 << 20) /* segment for 1..10 MiB requests */
#define MIN_LARGE_ALLOC ((size_t)10 << 20)
#define SEG_ROUND ((size_t)2 << 20)
#define OVERSIZE_SLACK ((size_t)20 << 20)

enum { POOL_SMALL, POOL_LARGE, POOL_OVERSIZE, POOL_DIRECT };

struct fg__segment {
    char *base;
    size_t size;
    int pool;
    fg__segment *next;
    fg__block *first; /* blocks in address order */
};

struct fg__block {
    char *ptr;
    size_t size, requested;
    fg__segment *seg; /* NULL for the CPU's direct blocks */
    fg_stream *stream;
    bool allocated;
    fg__block *prev, *next;           /* neighbours in the segment */
    fg__block *free_prev, *free_next; /* in the pool's free list */
};

const char *fg__fmt_bytes(uint64_t b, char *buf, size_t n) {
    if (b >= ((uint64_t)1 << 30))
        snprintf(buf, n, "%.2f GiB", (double)b / (double)((uint64_t)1 << 30));
    else if (b >= ((uint64_t)1 << 20))
        snprintf(buf, n, "%.2f MiB", (double)b / (double)((uint64_t)1 << 20));
    else if (b >= 1024) snprintf(buf, n, "%.2f KiB", (double)b / 1024.0);
    else snprintf(buf, n, "%llu bytes", (unsigned long long)b);
    return buf;
}

void fg__dev_alloc_init(fg_dev *d, const fg_dev_options *o, size_t limit) {
    fg__dev_alloc *a = &d->alloc;
    memset(a, 0, sizeof *a);
    a->limit = limit;
    a->max_split = o->max_split_bytes ? o->max_split_bytes : (size_t)64 << 20;
    if (a->max_split <= SMALL_SIZE) a->max_split = SMALL_SIZE + ROUND;
    a->oversize_cache = o->oversize_cache_bytes ? o->oversize_cache_bytes : (size_t)128 << 20;
    a->no_cache = o->no_cache;
    a->st.memory_limit = limit;
}

/* Block headers are kept for reuse: a split and a merge per allocation
 * would otherwise cost a host allocation each. */
static fg__block *block_new(fg__dev_alloc *a) {
    fg__block *b = a->spare;
    if (!b) return fg_calloc(1, sizeof *b);
    a->spare = b->next;
    memset(b, 0, sizeof *b);
    return b;
}

static void block_drop(fg__dev_alloc *a, fg__block *b) {
    if (!b) return;
    b->next = a->spare;
    a->spare = b;
}

/* ---------------------------------------------------------- live table */

static size_t live_lower_bound(const fg__dev_alloc *a, const char *p) {
    size_t lo = 0, hi = a->nlive;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (a->live[mid]->ptr < p) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static bool live_insert(fg__dev_alloc *a, fg__block *b) {
    if (a->nlive == a->cap_live) {
        size_t cap = a->cap_live ? a->cap_live * 2 : 64;
        fg__block **nl = fg_realloc(a->live, cap * sizeof *nl);
        if (!nl) return false;
        a->live = nl;
        a->cap_live = cap;
    }
    size_t i = live_lower_bound(a, b->ptr);
    memmove(a->live + i + 1, a->live + i, (a->nlive - i) * sizeof *a->live);
    a->live[i] = b;
    a->nlive++;
    return true;
}

static fg__block *live_remove(fg__dev_alloc *a, const char *p) {
    size_t i = live_lower_bound(a, p);
    if (i >= a->nlive || a->live[i]->ptr != p) return NULL;
    fg__block *b = a->live[i];
    memmove(a->live + i, a->live + i + 1, (a->nlive - i - 1) * sizeof *a->live);
    a->nlive--;
    return b;
}

const fg__block *fg__dev_find_locked(const fg_dev *d, const void *p, size_t bytes) {
    const fg__dev_alloc *a = &d->alloc;
    const char *c = p;
    size_t i = live_lower_bound(a, c + 1); /* first block starting after c */
    if (i == 0) return NULL;
    const fg__block *b = a->live[i - 1];
    if (c < b->ptr || (size_t)(c - b->ptr) > b->requested ||
        bytes > b->requested - (size_t)(c - b->ptr))
        return NULL;
    return b;
}

void fg__dev_live_summary_locked(const fg_dev *d, char *buf, size_t n) {
    const fg__dev_alloc *a = &d->alloc;
    size_t top[3] = {0, 0, 0};
    for (size_t i = 0; i < a->nlive; i++) {
        size_t s = a->live[i]->requested;
        for (int k = 0; k < 3; k++)
            if (s > top[k]) {
                for (int j = 2; j > k; j--) top[j] = top[j - 1];
                top[k] = s;
                break;
            }
    }
    char tb[32], t0[32], t1[32], t2[32];
    uint64_t live = a->st.active_allocs;
    size_t k =
        (size_t)snprintf(buf, n, "%llu allocation%s (%s) still live", (unsigned long long)live,
                         live == 1 ? "" : "s", fg__fmt_bytes(a->st.requested_bytes, tb, sizeof tb));
    if (a->nlive && k < n)
        snprintf(buf + k, n - k, ", the largest %s%s%s%s%s", fg__fmt_bytes(top[0], t0, sizeof t0),
                 a->nlive > 1 ? ", " : "", a->nlive > 1 ? fg__fmt_bytes(top[1], t1, sizeof t1) : "",
                 a->nlive > 2 ? ", " : "",
                 a->nlive > 2 ? fg__fmt_bytes(top[2], t2, sizeof t2) : "");
}

/* ---------------------------------------------------------- free lists */

static fg__block **pool_list(fg__dev_alloc *a, int pool) {
    return pool == POOL_SMALL   ? &a->free_small
           : pool == POOL_LARGE ? &a->free_large
                                : &a->free_oversize;
}

static void free_push(fg__dev_alloc *a, fg__block *b) {
    fg__block **l = pool_list(a, b->seg->pool);
    b->free_prev = NULL;
    b->free_next = *l;
    if (*l) (*l)->free_prev = b;
    *l = b;
}

static void free_unlink(fg__dev_alloc *a, fg__block *b) {
    fg__block **l = pool_list(a, b->seg->pool);
    if (b->free_prev) b->free_prev->free_next = b->free_next;
    else *l = b->free_next;
    if (b->free_next) b->free_next->free_prev = b->free_prev;
    b->free_prev = b->free_next = NULL;
}

/* ------------------------------------------------------------ segments */

static void segment_release(fg_dev *d, fg__segment *s) {
    fg__dev_alloc *a = &d->alloc;
    fg__block *b = s->first; /* one free block spanning the segment */
    free_unlink(a, b);
    if (s->pool == POOL_OVERSIZE) a->oversize_cached -= s->size;
    for (fg__segment **pp = &a->segments; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    d->be->segment_free(d->state, s->base, s->size);
    a->st.reserved_bytes -= s->size;
    a->st.segment_frees++;
    block_drop(a, b);
    fg_free(s);
}

static bool segment_is_free(const fg__segment *s) {
    return !s->first->allocated && s->first->next == NULL;
}

void fg__dev_empty_cache_locked(fg_dev *d) {
    fg__segment *s = d->alloc.segments;
    while (s) {
        fg__segment *next = s->next;
        if (segment_is_free(s)) segment_release(d, s);
        s = next;
    }
}

static size_t segment_size(const fg__dev_alloc *a, size_t size, int pool) {
    (void)a;
    if (pool == POOL_SMALL) return SMALL_SEG;
    if (pool == POOL_LARGE && size < MIN_LARGE_ALLOC) return LARGE_SEG;
    return (size + SEG_ROUND - 1) / SEG_ROUND * SEG_ROUND;
}

static void oom_error(fg_dev *d, size_t request, size_t seg, fg_stream *s) {
    fg__dev_alloc *a = &d->alloc;
    char rq[32], sg[32], lim[32], res[32], al[32], fr[32], pk[32], live[512];
    fg__dev_live_summary_locked(d, live, sizeof live);
    a->st.num_ooms++;
    fg_error(FG_ENOMEM,
             "device %s: out of memory: an allocation of %s (%zu bytes) for the %s stream needs "
             "a new segment of %s; limit %s, %s reserved (%s allocated, %s cached and free), "
             "peak %s allocated; %s. Free tensors first, call fg_dev_empty_cache, or raise the "
             "limit (FULGUR_DEVICE_MEMORY_LIMIT or fg_dev_options.memory_limit)",
             d->name, fg__fmt_bytes(request, rq, sizeof rq), request,
             s->kind == FG_STREAM_COMM ? "comm" : "compute", fg__fmt_bytes(seg, sg, sizeof sg),
             a->limit ? fg__fmt_bytes(a->limit, lim, sizeof lim) : "none",
             fg__fmt_bytes(a->st.reserved_bytes, res, sizeof res),
             fg__fmt_bytes(a->st.allocated_bytes, al, sizeof al),
             fg__fmt_bytes(a->st.reserved_bytes - a->st.allocated_bytes, fr, sizeof fr),
             fg__fmt_bytes(a->st.allocated_bytes_peak, pk, sizeof pk), live);
}

static fg__segment *segment_new(fg_dev *d, size_t size, size_t request, int pool, fg_stream *st) {
    fg__dev_alloc *a = &d->alloc;
    size_t seg = segment_size(a, size, pool);
    if (a->limit && a->st.reserved_bytes + seg > a->limit) fg__dev_empty_cache_locked(d);
    /* near the limit, a large request takes a segment of its own size
     * rather than a 20 MiB one */
    size_t own = (size + SEG_ROUND - 1) / SEG_ROUND * SEG_ROUND;
    if (a->limit && a->st.reserved_bytes + seg > a->limit && pool != POOL_SMALL &&
        a->st.reserved_bytes + own <= a->limit)
        seg = own;
    if (a->limit && a->st.reserved_bytes + seg > a->limit) {
        oom_error(d, request, seg, st);
        return NULL;
    }
    fg__segment *s = fg_calloc(1, sizeof *s);
    fg__block *b = block_new(a);
    char *base = s && b ? d->be->segment_alloc(d->state, seg) : NULL;
    if (!base && s && b) {
        fg__dev_empty_cache_locked(d);
        base = d->be->segment_alloc(d->state, seg);
        if (!base) oom_error(d, request, seg, st);
    }
    if (!base) {
        fg_free(s);
        block_drop(a, b);
        return NULL;
    }
    s->base = base;
    s->size = seg;
    s->pool = pool;
    s->first = b;
    s->next = a->segments;
    a->segments = s;
    b->ptr = base;
    b->size = seg;
    b->seg = s;
    b->stream = st;
    free_push(a, b);
    if (pool == POOL_OVERSIZE) a->oversize_cached += seg;
    a->st.reserved_bytes += seg;
    if (a->st.reserved_bytes > a->st.reserved_bytes_peak)
        a->st.reserved_bytes_peak = a->st.reserved_bytes;
    a->st.segment_allocs++;
    return s;
}

/* ----------------------------------------------------------- allocate */

static fg__block *best_fit(fg__dev_alloc *a, size_t size, int pool, fg_stream *st) {
    fg__block *best = NULL;
    for (fg__block *b = *pool_list(a, pool); b; b = b->free_next) {
        if (b->stream != st || b->size < size) continue;
        if (pool == POOL_OVERSIZE && b->size > size + OVERSIZE_SLACK) continue;
        if (!best || b->size < best->size) best = b;
    }
    return best;
}

static bool should_split(const fg__block *b, size_t size) {
    size_t rest = b->size - size;
    if (b->seg->pool == POOL_SMALL) return rest >= ROUND;
    if (b->seg->pool == POOL_LARGE) return rest > SMALL_SIZE;
    return false;
}

static void account_alloc(fg__dev_alloc *a, const fg__block *b) {
    a->st.allocated_bytes += b->size;
    a->st.requested_bytes += b->requested;
    if (a->st.allocated_bytes > a->st.allocated_bytes_peak)
        a->st.allocated_bytes_peak = a->st.allocated_bytes;
    a->st.active_allocs++;
    a->st.num_allocs++;
}

static void *alloc_direct(fg_dev *d, size_t bytes, fg_stream *st) {
    fg__dev_alloc *a = &d->alloc;
    size_t size = bytes ? bytes : 1;
    if (a->limit && a->st.reserved_bytes + size > a->limit) {
        oom_error(d, bytes, size, st);
        return NULL;
    }
    fg__block *b = block_new(a);
    char *p = b ? d->be->segment_alloc(d->state, size) : NULL;
    if (!p || !live_insert(a, b)) {
        if (p) d->be->segment_free(d->state, p, size);
        block_drop(a, b);
        if (p || b) oom_error(d, bytes, size, st);
        return NULL;
    }
    b->ptr = p;
    b->size = size;
    b->requested = bytes;
    b->stream = st;
    b->allocated = true;
    a->st.reserved_bytes += size;
    if (a->st.reserved_bytes > a->st.reserved_bytes_peak)
        a->st.reserved_bytes_peak = a->st.reserved_bytes;
    a->st.segment_allocs++;
    account_alloc(a, b);
    return p;
}

void *fg__dev_alloc_locked(fg_dev *d, size_t bytes, fg_stream *st) {
    fg__dev_alloc *a = &d->alloc;
    if (!d->be->caching) return alloc_direct(d, bytes, st);
    if (bytes > SIZE_MAX - (size_t)(64 << 20)) {
        oom_error(d, bytes, bytes, st);
        return NULL;
    }
    size_t size = bytes ? (bytes + ROUND - 1) / ROUND * ROUND : ROUND;
    int pool = size <= SMALL_SIZE ? POOL_SMALL : size < a->max_split ? POOL_LARGE : POOL_OVERSIZE;
    fg__block *b = best_fit(a, size, pool, st);
    bool hit = b != NULL;
    if (!b) {
        fg__segment *s = segment_new(d, size, bytes, pool, st);
        if (!s) return NULL;
        b = s->first;
    }
    free_unlink(a, b);
    if (should_split(b, size)) {
        fg__block *r = block_new(a);
        if (r) {
            r->ptr = b->ptr + size;
            r->size = b->size - size;
            r->seg = b->seg;
            r->stream = st;
            r->prev = b;
            r->next = b->next;
            if (b->next) b->next->prev = r;
            b->next = r;
            b->size = size;
            free_push(a, r);
        }
    }
    if (!live_insert(a, b)) {
        free_push(a, b);
        fg_error(FG_ENOMEM, "device %s: out of host memory for the allocator's table", d->name);
        return NULL;
    }
    if (b->seg->pool == POOL_OVERSIZE) a->oversize_cached -= b->size;
    b->allocated = true;
    b->requested = bytes;
    b->stream = st;
    if (hit) a->st.cache_hits++;
    account_alloc(a, b);
    return b->ptr;
}

/* ---------------------------------------------------------------- free */

static void merge_into(fg__dev_alloc *a, fg__block *b, fg__block *n) {
    /* n follows b; both free; n disappears */
    free_unlink(a, n);
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    block_drop(a, n);
}

fg_status fg__dev_free_locked(fg_dev *d, void *p) {
    fg__dev_alloc *a = &d->alloc;
    fg__block *b = live_remove(a, p);
    if (!b)
        return fg_error(FG_EINVAL,
                        "device %s: fg_dev_free(%p): not a live allocation of this device (freed "
                        "twice, a pointer inside a block, or another device's)",
                        d->name, p);
    a->st.allocated_bytes -= b->size;
    a->st.requested_bytes -= b->requested;
    a->st.active_allocs--;
    a->st.num_frees++;
    b->allocated = false;
    if (!b->seg) { /* direct */
        d->be->segment_free(d->state, b->ptr, b->size);
        a->st.reserved_bytes -= b->size;
        a->st.segment_frees++;
        block_drop(a, b);
        return FG_OK;
    }
    free_push(a, b);
    if (b->next && !b->next->allocated) merge_into(a, b, b->next);
    if (b->prev && !b->prev->allocated) {
        fg__block *prev = b->prev;
        merge_into(a, prev, b);
        b = prev;
    }
    fg__segment *s = b->seg;
    if (s->pool == POOL_OVERSIZE) {
        a->oversize_cached += b->size;
        if (a->oversize_cached > a->oversize_cache || a->no_cache) segment_release(d, s);
    } else if (a->no_cache && segment_is_free(s)) {
        segment_release(d, s);
    }
    return FG_OK;
}

void fg__dev_stats_locked(const fg_dev *d, fg_dev_memory_stats *out) {
    *out = d->alloc.st;
    out->inactive_split_bytes = 0;
    for (const fg__segment *s = d->alloc.segments; s; s = s->next)
        if (s->first->next) /* split */
            for (const fg__block *b = s->first; b; b = b->next)
                if (!b->allocated) out->inactive_split_bytes += b->size;
}

void fg__dev_alloc_release_all(fg_dev *d, bool give_back) {
    fg__dev_alloc *a = &d->alloc;
    if (!d->be->caching) {
        for (size_t i = 0; i < a->nlive; i++) {
            if (give_back) d->be->segment_free(d->state, a->live[i]->ptr, a->live[i]->size);
            fg_free(a->live[i]);
        }
    } else {
        for (fg__segment *s = a->segments, *next; s; s = next) {
            next = s->next;
            for (fg__block *b = s->first, *bn; b; b = bn) {
                bn = b->next;
                fg_free(b);
            }
            if (give_back) d->be->segment_free(d->state, s->base, s->size);
            fg_free(s);
        }
    }
    for (fg__block *b = a->spare, *bn; b; b = bn) {
        bn = b->next;
        fg_free(b);
    }
    fg_free(a->live);
    memset(a, 0, sizeof *a);
}
