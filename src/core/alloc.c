/* Heap allocation through one replaceable hook (lua_Alloc's shape), so that
 * tests can fail the N-th allocation and embedders can bring their own.
 *
 * The default allocator is the C library's, with one difference: a large
 * block is shrunk before it is freed. glibc raises its mmap threshold to
 * the size of any mapped block that is freed (up to 32 MiB); blocks below
 * the new threshold then come from the heap, and stay resident after they
 * are freed. Freeing one large buffer (a sharding strategy's full-size
 * optimizer state, cut to a shard at setup) thus kept every later step
 * arena chunk resident: 90 MB more peak memory per rank on a 3M-parameter
 * GPT. A block shrunk first is unmapped but for a page, and freeing that
 * page leaves the threshold where it was.
 *
 * fg_calloc of a large block on the default allocator zeroes its whole
 * pages by dropping them (MADV_DONTNEED) instead of writing them: a zero
 * buffer costs no memory until it is written (an optimizer's state that
 * offload_nvme moves to disk before the first step never becomes
 * resident). */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "core_impl.h"

#define SHRINK_BEFORE_FREE ((size_t)128 << 10) /* glibc's lowest mmap threshold */

static void *default_alloc(void *ud, void *ptr, size_t size, size_t align) {
    (void)ud;
    if (size == 0) {
#if defined(__GLIBC__)
        if (ptr && malloc_usable_size(ptr) >= SHRINK_BEFORE_FREE) {
            void *small = realloc(ptr, 1);
            if (small) ptr = small;
        }
#endif
        free(ptr);
        return NULL;
    }
    if (ptr) return realloc(ptr, size);
    void *p = NULL;
    if (align < sizeof(void *)) align = sizeof(void *);
    if (posix_memalign(&p, align, size) != 0) return NULL;
    return p;
}

static fg_alloc_fn g_alloc = default_alloc;
static void *g_alloc_ud;

void fg_set_allocator(fg_alloc_fn fn, void *ud) {
    g_alloc = fn ? fn : default_alloc;
    g_alloc_ud = fn ? ud : NULL;
}

bool fg__alloc_is_default(void) { return g_alloc == default_alloc; }

void *fg_alloc(size_t size) {
    if (size == 0) size = 1;
    void *p = g_alloc(g_alloc_ud, NULL, size, 64);
    if (!p) fg_error(FG_ENOMEM, "out of memory allocating %zu bytes", size);
    return p;
}

void *fg_calloc(size_t n, size_t size) {
    if (size && n > SIZE_MAX / size) {
        fg_error(FG_ENOMEM, "allocation of %zu x %zu bytes overflows", n, size);
        return NULL;
    }
    size_t bytes = n * size;
    void *p = fg_alloc(bytes);
    if (!p) return NULL;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (g_alloc == default_alloc && bytes >= 64 * page) {
        char *lo = (char *)(((uintptr_t)p + page - 1) & ~(uintptr_t)(page - 1));
        char *hi = (char *)(((uintptr_t)p + bytes) & ~(uintptr_t)(page - 1));
        if (madvise(lo, (size_t)(hi - lo), MADV_DONTNEED) == 0) {
            memset(p, 0, (size_t)(lo - (char *)p));
            memset(hi, 0, (size_t)((char *)p + bytes - hi));
            return p;
        }
    }
    memset(p, 0, bytes ? bytes : 1);
    return p;
}

void *fg_realloc(void *ptr, size_t size) {
    if (!ptr) return fg_alloc(size);
    if (size == 0) size = 1;
    void *p = g_alloc(g_alloc_ud, ptr, size, 16);
    if (!p) fg_error(FG_ENOMEM, "out of memory growing a block to %zu bytes", size);
    return p;
}

void fg_free(void *ptr) {
    if (ptr) g_alloc(g_alloc_ud, ptr, 0, 0);
}

char *fg_strdup(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *p = fg_alloc(n);
    if (p) memcpy(p, s, n);
    return p;
}
