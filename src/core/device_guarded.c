/* The guarded test device's backend. Its memory is one memfd mapped
 * twice: PROT_NONE at the addresses fg_dev_alloc hands out (so a host read
 * or write of device memory faults with SIGSEGV at the line that made it,
 * as it would on a GPU), read-write at a private alias that only the copy
 * calls and kernels reach, through fg__dev_host_view. The file spans 64
 * GiB (twice the limit past 32 GiB) but is sparse: a page costs memory only once written,
 * and a segment given back has its pages punched out of the file.
 * Segments are placed first-fit in the file, 2 MiB aligned. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "device_impl.h"

#define GUARDED_DEFAULT ((size_t)64 << 30) /* address space, not memory */
#define GUARDED_ALIGN ((size_t)2 << 20)

typedef struct range {
    size_t off, len;
} range;

typedef struct guarded {
    int fd;
    size_t size;
    char *dev;   /* PROT_NONE: what tensors carry */
    char *alias; /* read-write: the copy calls' and kernels' view */
    range *free; /* free ranges of the file, sorted by offset, coalesced */
    size_t nfree, cap;
} guarded;

static FG_MUST_USE fg_status guarded_open(int index, size_t memory_limit, void **state) {
    guarded *g = fg_calloc(1, sizeof *g);
    if (!g) return fg_last_status();
    /* the allocator holds the limit; the space is larger, so that placing
     * segments in it never fails on fragmentation below the limit */
    size_t size = memory_limit > GUARDED_DEFAULT / 2 ? 2 * memory_limit : GUARDED_DEFAULT;
    size = (size + GUARDED_ALIGN - 1) / GUARDED_ALIGN * GUARDED_ALIGN;
    char nm[32];
    snprintf(nm, sizeof nm, "fulgur-guarded:%d", index);
    g->fd = memfd_create(nm, MFD_CLOEXEC);
    if (g->fd < 0) {
        fg_free(g);
        return fg_error(FG_EIO, "memfd_create: %s", strerror(errno));
    }
    if (ftruncate(g->fd, (off_t)size) != 0) {
        int e = errno;
        close(g->fd);
        fg_free(g);
        return fg_error(FG_EIO, "ftruncate of the memfd to %zu bytes: %s", size, strerror(e));
    }
    g->dev = mmap(NULL, size, PROT_NONE, MAP_SHARED | MAP_NORESERVE, g->fd, 0);
    g->alias = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, g->fd, 0);
    g->free = fg_alloc(16 * sizeof *g->free);
    if (g->dev == MAP_FAILED || g->alias == MAP_FAILED || !g->free) {
        int e = errno;
        if (g->dev != MAP_FAILED) munmap(g->dev, size);
        if (g->alias != MAP_FAILED) munmap(g->alias, size);
        fg_free(g->free);
        close(g->fd);
        fg_free(g);
        return fg_error(FG_EIO, "mmap of %zu bytes, twice: %s", size, strerror(e));
    }
    /* a forked child gets neither view (fg__dev_check_process refuses its
     * calls): ranks must not share a device's memory by inheritance */
    madvise(g->dev, size, MADV_DONTFORK);
    madvise(g->alias, size, MADV_DONTFORK);
    g->size = size;
    g->cap = 16;
    g->free[0] = (range){0, size};
    g->nfree = 1;
    *state = g;
    return FG_OK;
}

static void guarded_close(void *state) {
    guarded *g = state;
    munmap(g->dev, g->size);
    munmap(g->alias, g->size);
    close(g->fd);
    fg_free(g->free);
    fg_free(g);
}

static void *guarded_segment_alloc(void *state, size_t bytes) {
    guarded *g = state;
    bytes = (bytes + GUARDED_ALIGN - 1) / GUARDED_ALIGN * GUARDED_ALIGN;
    for (size_t i = 0; i < g->nfree; i++) {
        if (g->free[i].len < bytes) continue;
        size_t off = g->free[i].off;
        g->free[i].off += bytes;
        g->free[i].len -= bytes;
        if (!g->free[i].len) {
            memmove(g->free + i, g->free + i + 1, (g->nfree - i - 1) * sizeof *g->free);
            g->nfree--;
        }
        return g->dev + off;
    }
    fg_error(FG_ENOMEM, "the guarded device's %zu-byte space has no free range of %zu bytes",
             g->size, bytes);
    return NULL;
}

static void guarded_segment_free(void *state, void *ptr, size_t bytes) {
    guarded *g = state;
    bytes = (bytes + GUARDED_ALIGN - 1) / GUARDED_ALIGN * GUARDED_ALIGN;
    size_t off = (size_t)((char *)ptr - g->dev);
    /* give the pages back; the range reads as zeros when reused */
    (void)fallocate(g->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)bytes);
    size_t i = 0;
    while (i < g->nfree && g->free[i].off < off) i++;
    bool left = i > 0 && g->free[i - 1].off + g->free[i - 1].len == off;
    bool right = i < g->nfree && off + bytes == g->free[i].off;
    if (left && right) {
        g->free[i - 1].len += bytes + g->free[i].len;
        memmove(g->free + i, g->free + i + 1, (g->nfree - i - 1) * sizeof *g->free);
        g->nfree--;
    } else if (left) {
        g->free[i - 1].len += bytes;
    } else if (right) {
        g->free[i].off = off;
        g->free[i].len += bytes;
    } else {
        if (g->nfree == g->cap) {
            range *nr = fg_realloc(g->free, 2 * g->cap * sizeof *nr);
            if (!nr) return; /* the range is lost to this device; its pages are freed */
            g->free = nr;
            g->cap *= 2;
        }
        memmove(g->free + i + 1, g->free + i, (g->nfree - i) * sizeof *g->free);
        g->free[i] = (range){off, bytes};
        g->nfree++;
    }
}

/* Whole pages of the file punched out: they read zero in both views and
 * cost no memory until written again. */
static FG_MUST_USE fg_status guarded_discard(void *state, void *p, size_t bytes) {
    guarded *g = state;
    size_t off = (size_t)((char *)p - g->dev);
    if (fallocate(g->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)bytes))
        return fg_error(FG_EIO, "guarded device: punching %zu bytes out of its memfd: %s", bytes,
                        strerror(errno));
    return FG_OK;
}

static void *guarded_host_view(void *state, const void *p) {
    guarded *g = state;
    const char *c = p;
    if (c < g->dev || c >= g->dev + g->size) return NULL;
    return g->alias + (c - g->dev);
}

const fg__dev_backend fg__dev_guarded_backend = {
    .kind = FG_GUARDED,
    .host_accessible = false,
    .caching = true,
    .default_limit = GUARDED_DEFAULT,
    .open = guarded_open,
    .close = guarded_close,
    .segment_alloc = guarded_segment_alloc,
    .segment_free = guarded_segment_free,
    .host_view = guarded_host_view,
    .discard = guarded_discard,
    .discard_page = 4096,
};
