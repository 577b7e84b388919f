/* Private side of the device model (device.h): the backend a device kind
 * plugs in, the device struct, and the host view of device memory that
 * only copy calls and kernels may use. */
#ifndef FULGUR_DEVICE_IMPL_H
#define FULGUR_DEVICE_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>

#include "core_impl.h"
#include "fulgur/device.h"

/* One kind of device. Memory comes from the backend in segments, which the
 * allocator (device_alloc.c) cuts into blocks. Streams and events are
 * immediate when the stream hooks are NULL (cpu, guarded): work is done
 * when the call that enqueues it returns. */
typedef struct fg__dev_backend {
    fg_device kind;
    bool host_accessible; /* the host may dereference device addresses */
    bool caching;         /* segments are expensive: cache freed blocks */
    size_t default_limit; /* the limit when none is set (0: none) */
    /* Opens the backend state for device `index` with the limit in force
     * (0: none); sets *state. fg_error on failure. */
    FG_MUST_USE fg_status (*open)(int index, size_t memory_limit, void **state);
    void (*close)(void *state);
    /* A segment of `bytes` (a multiple of 2 MiB for caching backends), or
     * NULL with fg_error (FG_ENOMEM when the device has no room). */
    void *(*segment_alloc)(void *state, size_t bytes);
    void (*segment_free)(void *state, void *ptr, size_t bytes);
    /* The host address of device address p (NULL if p is not the
     * backend's), or NULL for a device the host cannot map (cuda): then
     * copy must be set. */
    void *(*host_view)(void *state, const void *p);
    /* A real device's copy (dir: 0 h2d, 1 d2h, 2 d2d) on stream `s`,
     * asynchronous when `async`; NULL: memcpy through host_view. */
    FG_MUST_USE fg_status (*copy)(void *state, void *dst, const void *src, size_t bytes, int dir,
                                  fg_stream *s, bool async);
    /* Waits for all the device's work; NULL: nothing to wait for. */
    FG_MUST_USE fg_status (*synchronize)(void *state);
    /* How many devices of the kind answer, without creating a context;
     * 0 with the reason in why (n bytes). NULL: one device (cpu), or the
     * whole index range (guarded). */
    int (*device_count)(char *why, size_t n);
    /* Optional hooks of a device with real streams (cuda); NULL on the
     * immediate devices. Streams are named by kind (fg_stream_kind). */
    FG_MUST_USE fg_status (*memset)(void *state, void *dst, int value, size_t bytes, int stream);
    FG_MUST_USE fg_status (*fill)(void *state, void *dst, const void *pattern, size_t psize,
                                  size_t count, int stream);
    FG_MUST_USE fg_status (*stream_synchronize)(void *state, int stream);
    /* Gives back the memory behind [p, p + bytes), whole pages of
     * `page` bytes (page-aligned on the device), which then read zero;
     * NULL: the device cannot (fg_dev_discard clears instead). */
    FG_MUST_USE fg_status (*discard)(void *state, void *p, size_t bytes);
    size_t discard_page;
    void *(*host_alloc)(void *state, size_t bytes); /* pinned host memory */
    void (*host_free)(void *state, void *ptr);
    void *(*event_new)(void *state); /* NULL with fg_error */
    void (*event_free)(void *state, void *ev);
    FG_MUST_USE fg_status (*event_record)(void *state, void *ev, int stream);
    FG_MUST_USE fg_status (*event_wait)(void *state, int stream, void *ev);
    bool (*event_query)(void *state, void *ev);
    FG_MUST_USE fg_status (*event_synchronize)(void *state, void *ev);
} fg__dev_backend;

/* The allocator's state, embedded in fg_dev (device_alloc.c). */
typedef struct fg__block fg__block;
typedef struct fg__segment fg__segment;
typedef struct fg__dev_alloc {
    fg__segment *segments;
    fg__block *free_small, *free_large, *free_oversize; /* per-pool free lists */
    fg__block *spare; /* block headers kept for reuse, linked through next */
    fg__block **live; /* live blocks, sorted by address */
    size_t nlive, cap_live;
    size_t limit, max_split, oversize_cache, oversize_cached;
    bool no_cache;
    fg_dev_memory_stats st;
} fg__dev_alloc;

struct fg_stream {
    fg_dev *dev;
    fg_stream_kind kind;
    uint64_t work;
};

struct fg_dev {
    fg_device_id id;
    char name[FG_DEVICE_NAME_MAX];
    const fg__dev_backend *be;
    void *state;
    pthread_mutex_t mu; /* the allocator and the counters */
    fg__dev_alloc alloc;
    fg_stream streams[2];
    pid_t pid;       /* the process that opened it: a forked child may not use it */
    atomic_int refs; /* fg_dev_retain's and the open's; the last close releases */
};

/* FG_OK in the process that opened d; FG_ESTATE naming the fork otherwise. */
FG_MUST_USE fg_status fg__dev_check_process(const fg_dev *d);

/* The backends. */
extern const fg__dev_backend fg__dev_cpu_backend;
extern const fg__dev_backend fg__dev_guarded_backend;
#ifdef FULGUR_HAVE_CUDA
extern const fg__dev_backend fg__dev_cuda_backend; /* device_cuda.c */
#endif

/* Allocator (device_alloc.c); the caller holds d->mu. */
void fg__dev_alloc_init(fg_dev *d, const fg_dev_options *o, size_t limit);
/* Frees the bookkeeping, and gives the segments back to the backend when
 * `give_back` (not in a forked child: its inherited memfd is the parent's). */
void fg__dev_alloc_release_all(fg_dev *d, bool give_back);
void *fg__dev_alloc_locked(fg_dev *d, size_t bytes, fg_stream *s);
FG_MUST_USE fg_status fg__dev_free_locked(fg_dev *d, void *p);
void fg__dev_empty_cache_locked(fg_dev *d);
/* The stats with the figures computed on demand (inactive split bytes). */
void fg__dev_stats_locked(const fg_dev *d, fg_dev_memory_stats *out);
/* The live allocation holding [p, p + bytes), or NULL. */
const fg__block *fg__dev_find_locked(const fg_dev *d, const void *p, size_t bytes);
/* Writes "N allocations (B bytes) still live, the largest ..." into buf. */
void fg__dev_live_summary_locked(const fg_dev *d, char *buf, size_t n);
/* "1.50 MiB" */
const char *fg__fmt_bytes(uint64_t b, char *buf, size_t n);

/* A point of a device step arena to rewind to (activation checkpointing's
 * fg__step_mark): the chunks taken after it are given back. */
typedef struct fg__dev_arena_mark {
    void *chunk;
    size_t chunk_used, used;
} fg__dev_arena_mark;
fg__dev_arena_mark fg__dev_arena_mark_get(const fg_dev_arena *a);
void fg__dev_arena_release(fg_dev_arena *a, fg__dev_arena_mark m);

/* The host address of device memory [p, p + bytes), for the device's copy
 * calls and kernels only (the guarded device's private alias; p itself on
 * the CPU). NULL with fg_error (FG_EINVAL) when the range is not inside
 * one live allocation of d, or FG_EUNSUPPORTED when the device has no host
 * view (cuda). Thread-safe. */
void *fg__dev_host_view(fg_dev *d, const void *p, size_t bytes);

#endif
