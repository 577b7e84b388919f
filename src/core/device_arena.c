/* The step arena of a device: fg_arena's policy (chunks bumped forward; a
 * reset keeps one chunk as large as the whole step, so a steady loop
 * allocates nothing after its first step) over device memory from
 * fg_dev_alloc. The bookkeeping lives in host memory; the chunks are
 * device addresses, never dereferenced here. */
#include "device_impl.h"

#define ALIGN ((size_t)512)

typedef struct dchunk {
    struct dchunk *next;
    char *base; /* device memory */
    size_t size, used;
} dchunk;

struct fg_dev_arena {
    fg_dev *dev;
    dchunk *head; /* current chunk first */
    size_t chunk_bytes, used, peak;
};

fg_dev_arena *fg_dev_arena_new(fg_dev *d, size_t chunk_bytes) {
    fg_dev_arena *a = fg_calloc(1, sizeof *a);
    if (!a) return NULL;
    a->dev = d;
    a->chunk_bytes = chunk_bytes ? chunk_bytes : ((size_t)4 << 20);
    return a;
}

static void drop_chunks(fg_dev_arena *a) {
    for (dchunk *c = a->head, *n; c; c = n) {
        n = c->next;
        /* the chunk came from this device: a free fails only in a forked
         * child, whose copy of the bookkeeping goes with it */
        fg__status_drop(fg_dev_free(a->dev, c->base));
        fg_free(c);
    }
    a->head = NULL;
}

void fg_dev_arena_free(fg_dev_arena *a) {
    if (!a) return;
    drop_chunks(a);
    fg_free(a);
}

static dchunk *chunk_new(fg_dev_arena *a, size_t size) {
    dchunk *c = fg_calloc(1, sizeof *c);
    if (!c) return NULL;
    c->base = fg_dev_alloc(a->dev, size, NULL);
    if (!c->base) {
        fg_free(c);
        return NULL;
    }
    c->size = size;
    return c;
}

void *fg_dev_arena_alloc(fg_dev_arena *a, size_t size) {
    size_t need = (size + ALIGN - 1) & ~(ALIGN - 1);
    if (need < size) {
        fg_error(FG_ENOMEM, "device %s: arena allocation of %zu bytes overflows",
                 fg_dev_name(a->dev), size);
        return NULL;
    }
    if (!need) need = ALIGN; /* a unique address, as fg_dev_alloc's */
    dchunk *c = a->head;
    if (!c || c->size - c->used < need) {
        dchunk *nc = chunk_new(a, need > a->chunk_bytes ? need : a->chunk_bytes);
        if (!nc) {
            fg_error_wrap(fg_last_status(), "step arena");
            return NULL;
        }
        nc->next = c;
        a->head = c = nc;
    }
    char *p = c->base + c->used;
    c->used += need;
    a->used += need;
    if (a->used > a->peak) a->peak = a->used;
    return p;
}

void fg_dev_arena_reset(fg_dev_arena *a) {
    if (!a || !a->head) return;
    a->used = 0;
    if (!a->head->next) { /* one chunk: it held the whole step */
        a->head->used = 0;
        return;
    }
    size_t total = 0;
    for (dchunk *c = a->head; c; c = c->next) total += c->size;
    drop_chunks(a);
    a->head = chunk_new(a, total); /* on failure the next alloc starts afresh */
}

fg__dev_arena_mark fg__dev_arena_mark_get(const fg_dev_arena *a) {
    return (fg__dev_arena_mark){a->head, a->head ? a->head->used : 0, a->used};
}

void fg__dev_arena_release(fg_dev_arena *a, fg__dev_arena_mark m) {
    while (a->head && (void *)a->head != m.chunk) {
        dchunk *c = a->head;
        a->head = c->next;
        /* the chunk came from this device: a free fails only in a forked
         * child, whose copy of the bookkeeping goes with it */
        fg__status_drop(fg_dev_free(a->dev, c->base));
        fg_free(c);
    }
    if (a->head) a->head->used = m.chunk_used;
    a->used = m.used;
}

size_t fg_dev_arena_used(const fg_dev_arena *a) { return a ? a->used : 0; }
size_t fg_dev_arena_peak(const fg_dev_arena *a) { return a ? a->peak : 0; }
