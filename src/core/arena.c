/* The step arena: a list of chunks bumped forward; reset keeps the largest
 * chunk and frees the rest, so a steady training loop reaches a fixed
 * footprint after its first step and then allocates nothing. A mark and
 * release rewind it inside a step; the chunks a release drops go to a spare
 * list (their memory stays valid until reset), reused by the allocations
 * that need a chunk, and counted into the chunk that reset keeps: after a
 * step or two of rewinds everything fits that one chunk again. */
#include <string.h>

#include "core_impl.h"

typedef struct chunk {
    struct chunk *next;
    size_t size, used;
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
    /* Keep one chunk big enough for the whole step, so the next step fits. */
    size_t total = 0;
    bool had_spare = a->spare != NULL;
    for (chunk *c = a->spare, *n; c; c = n) {
        n = c->next;
        total += c->size;
        fg_free(c);
    }
    a->spare = NULL;
    chunk *big = a->head;
    for (chunk *c = a->head; c; c = c->next) {
        total += c->size;
        if (c->size > big->size) big = c;
    }
    if (big->next == NULL && big == a->head && !had_spare) {
        big->used = 0;
        a->used = 0;
        return;
    }
    for (chunk *c = a->head, *n; c; c = n) {
        n = c->next;
        fg_free(c);
    }
    a->head = NULL;
    a->used = 0;
    chunk *nc = fg_alloc(CHUNK_HDR + total);
    if (nc) { /* on failure the next alloc simply starts a fresh chunk */
        nc->size = total;
        nc->used = 0;
        nc->next = NULL;
        a->head = nc;
    }
}

fg_arena_mark fg__arena_mark(const fg_arena *a) {
    return (fg_arena_mark){a->head, a->head ? a->head->used : 0, a->used};
}

void fg__arena_release(fg_arena *a, fg_arena_mark m) {
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
