/* The step arena: a list of chunks bumped forward; reset keeps the largest
 * chunk and frees the rest, so a steady training loop reaches a fixed
 * footprint after its first step and then allocates nothing. */
#include <string.h>

#include "core_impl.h"

typedef struct chunk {
    struct chunk *next;
    size_t size, used;
    /* data follows, 64-byte aligned */
} chunk;

#define CHUNK_HDR 64

struct fg_arena {
    chunk *head; /* current chunk first */
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
        chunk *nc = fg_alloc(CHUNK_HDR + sz);
        if (!nc) return NULL;
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
    chunk *big = a->head;
    for (chunk *c = a->head; c; c = c->next) {
        total += c->size;
        if (c->size > big->size) big = c;
    }
    if (big->next == NULL && big == a->head) {
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

size_t fg_arena_used(const fg_arena *a) { return a ? a->used : 0; }
size_t fg_arena_peak(const fg_arena *a) { return a ? a->peak : 0; }
