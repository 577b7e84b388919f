/* The step arena: a list of chunks bumped forward. Reset keeps every
 * chunk, those the step used first in the order it took them: a steady
 * training loop asks for the same sizes in the same order each step, so
 * from its second step on it takes the same chunks again and allocates
 * nothing, and the memory it touched in its first step is the memory it
 * touches after (no page is faulted in twice; merging the chunks into one
 * new block at the first reset, as this did before, faulted in the whole
 * step's footprint again in the second step: on the CIFAR ResNet-18 of
 * bench/compare, 1.4 GB). A step that needs less (an evaluation step)
 * leaves the rest for the next. A mark and release rewind it inside a
 * step; the chunks a release drops go to the spare list (their memory
 * stays valid until reset), reused by the allocations that need a chunk. */
#include <string.h>

#include "core_impl.h"

typedef struct chunk {
    struct chunk *next;
    size_t size, used;
    bool taken; /* in use this step (or dropped by a release in it) */
    /* data follows, 64-byte aligned */
} chunk;

#define CHUNK_HDR 64

struct fg_arena {
    chunk *head;  /* current chunk first */
    chunk *spare; /* the chunks releases dropped, reused before new ones */
    size_t chunk_bytes;
    size_t used, peak;
};

fg_arena *fg_arena_new(size_t chunk_bytes) {
    fg_arena *a = fg_calloc(1, sizeof *a);
    if (!a) return NULL;
    a->chunk_bytes = chunk_bytes ? chunk_bytes : ((size_t)4 << 20);
    return a;
}

void fg_arena_free(fg_arena *a) {
    if (!a) return;
    for (chunk *c = a->head, *n; c; c = n) {
        n = c->next;
        fg_free(c);
    }
    for (chunk *c = a->spare, *n; c; c = n) {
        n = c->next;
        fg_free(c);
    }
    fg_free(a);
}

void *fg_arena_alloc(fg_arena *a, size_t size) {
    size_t need = (size + 63) & ~(size_t)63;
    if (need < size) {
        fg_error(FG_ENOMEM, "arena allocation of %zu bytes overflows", size);
        return NULL;
    }
    chunk *c = a->head;
    if (!c || c->size - c->used < need) {
        size_t sz = need > a->chunk_bytes ? need : a->chunk_bytes;
        chunk **pp = &a->spare, *nc = NULL;
        while (*pp && (*pp)->size < need) pp = &(*pp)->next;
        if (*pp) {
            nc = *pp;
            *pp = nc->next;
            sz = nc->size;
        } else if (!(nc = fg_alloc(CHUNK_HDR + sz))) {
            return NULL;
        }
        nc->size = sz;
        nc->used = 0;
        nc->taken = true;
        nc->next = c;
        a->head = c = nc;
    }
    void *p = (char *)c + CHUNK_HDR + c->used;
    c->used += need;
    a->used += need;
    if (a->used > a->peak) a->peak = a->used;
    return p;
}

void fg_arena_reset(fg_arena *a) {
    if (!a || !a->head) return;
    /* the step's chunks in the order it took them (the head list is newest
     * first), then those a release dropped in it, then the untouched */
    chunk *order = NULL, *untaken = NULL, **ut = &untaken;
    for (chunk *c = a->head, *n; c; c = n) {
        n = c->next;
        c->next = order;
        order = c;
    }
    chunk **tail = &order;
    while (*tail) tail = &(*tail)->next;
    for (chunk *c = a->spare, *n; c; c = n) {
        n = c->next;
        c->next = NULL;
        if (c->taken) {
            *tail = c;
            tail = &c->next;
        } else {
            *ut = c;
            ut = &c->next;
        }
    }
    *tail = untaken;
    for (chunk *c = order; c; c = c->next) {
        c->used = 0;
        c->taken = false;
    }
    a->head = order;
    a->spare = order->next;
    order->next = NULL;
    order->taken = true;
    a->used = 0;
}

fg__arena_point fg__arena_mark(const fg_arena *a) {
    return (fg__arena_point){a->head, a->head ? a->head->used : 0, a->used, NULL, 0, 0};
}

void fg__arena_release(fg_arena *a, fg__arena_point m) {
    while (a->head && a->head != m.chunk) {
        chunk *c = a->head;
        a->head = c->next;
        c->next = a->spare;
        a->spare = c;
    }
    if (a->head) a->head->used = m.chunk_used;
    a->used = m.used;
}

size_t fg_arena_used(const fg_arena *a) { return a ? a->used : 0; }
size_t fg_arena_peak(const fg_arena *a) { return a ? a->peak : 0; }
