/* fulgur devices: where tensor memory lives and where kernels run.
 *
 * A device is a kind and an index: "cpu", "cuda:1", "guarded:0". Each open
 * device (fg_dev) has an allocator, a compute stream and a comm stream,
 * events on them, copies between host and device memory, and a
 * synchronize. A device's memory is never read or written by the host
 * outside that device's own kernels and copy calls: the pointer
 * fg_dev_alloc returns is an address on the device, and on any device but
 * the CPU dereferencing it on the host is a bug.
 *
 * Kinds:
 *   cpu      - host memory; the allocator is fg_alloc; streams and events
 *              are immediate (work is done when the call returns).
 *   cuda     - an NVIDIA GPU; needs a build with the CUDA backend (this
 *              build's fg_dev_open says when it has none).
 *   guarded  - a test device built into every build: its memory is a
 *              mapping the host cannot read or write (a host access faults
 *              with SIGSEGV at the line that made it, as it would on a GPU),
 *              reached only through its copy calls; streams and events are
 *              immediate; every copy is counted. Use it to prove that code
 *              is device-clean (docs/devices.md).
 *
 * Allocation on cuda and guarded goes through a caching allocator (size
 * classes, per-stream reuse, a bound on fragmentation) with PyTorch's
 * memory_stats figures; the CPU device counts the same figures without a
 * cache. An out-of-memory is FG_ENOMEM with a message naming the request,
 * the limit, what is reserved and free, the peak and the largest live
 * blocks.
 *
 * Threads: one fg_dev may be used from several threads at once (the
 * allocator and the counters are locked); a stream is used by one thread at
 * a time. The conventions of core.h hold. */
#ifndef FULGUR_DEVICE_H
#define FULGUR_DEVICE_H

#include "fulgur/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The kind of a device. A tensor's fg_tensor_device is its kind. */
typedef enum fg_device { FG_CPU = 0, FG_CUDA = 1, FG_GUARDED = 2, FG_DEVICE_KIND_COUNT } fg_device;

/* A device's name: a kind and an index (0 for the CPU, which is one device). */
typedef struct fg_device_id {
    fg_device kind;
    int index;
} fg_device_id;

#define FG_DEVICE_INDEX_MAX 1023
#define FG_DEVICE_NAME_MAX 24 /* bytes fg_device_format needs at most, with the NUL */

/* "cpu", "cuda", "guarded"; "?" for anything else. */
FG_API const char *fg_device_kind_name(fg_device kind);
/* Parses "cpu", "cpu:0", "cuda", "cuda:N", "guarded", "guarded:N" (kind
 * case-insensitive; no index means 0; N in 0..FG_DEVICE_INDEX_MAX; the CPU
 * has index 0 only). FG_EINVAL naming the text and what is expected. */
FG_API FG_MUST_USE fg_status fg_device_parse(const char *name, fg_device_id *out);
/* Writes the canonical name ("cpu", "cuda:1", "guarded:0") into buf (at
 * least FG_DEVICE_NAME_MAX bytes are enough) and returns buf; "?" for an
 * id fg_device_parse would refuse. fg_device_parse(fg_device_format(id))
 * gives id back. */
FG_API const char *fg_device_format(fg_device_id id, char *buf, size_t n);

/* How many devices of `kind` this process can open without opening one:
 * cpu 1, guarded FG_DEVICE_INDEX_MAX + 1 (a test device, always there),
 * cuda what the CUDA backend counts (no device context is created, so it
 * is safe before the ranks fork). 0 when there are none, with the reason
 * in why (NULL, or n bytes): "this build has no CUDA backend (...)" or
 * what the backend says ("no CUDA device: ..."). Thread-safe; the
 * calling thread's error (fg_last_error) is left as it was. */
FG_API int fg_device_count(fg_device kind, char *why, size_t n);

/* ---------------------------------------------------------------- devices */

typedef struct fg_dev fg_dev;
typedef struct fg_stream fg_stream;
typedef struct fg_event fg_event;

typedef struct fg_dev_options {
    /* Bytes the device may hold (reserved, in the allocator's terms); an
     * allocation past it is FG_ENOMEM. 0: FULGUR_DEVICE_MEMORY_LIMIT when
     * set (bytes, or with a K, M or G suffix, powers of 1024), else the
     * device's own memory (guarded: 64 GiB of address space, pages used
     * only when written; cpu: no limit). */
    size_t memory_limit;
    /* Caching allocator (cuda, guarded). Requests of max_split_bytes or
     * more are "oversize": they get a segment of their own, never split,
     * and are cached, once freed, only while the oversize bytes cached stay
     * within oversize_cache_bytes; past that they go back to the device at
     * free. 0: 64 MiB and 128 MiB. */
    size_t max_split_bytes;
    size_t oversize_cache_bytes;
    /* true: the caching allocator keeps nothing (every free releases its
     * segment): for tools that look for use-after-free on the device. */
    bool no_cache;
} fg_dev_options;

/* Opens the device named `name` (fg_device_parse's names). NULL on a bad
 * name (FG_EINVAL), a kind this build lacks or a device the machine lacks
 * (FG_EUNSUPPORTED, saying which and what to use instead) or a failing
 * system call (FG_EIO). Each call opens a device of its own, with its own
 * memory and counters. A device belongs to the process that opened it: in
 * a child forked after the open, its calls fail with FG_ESTATE (as a CUDA
 * context does not survive a fork), so open devices after the ranks fork. */
FG_API fg_dev *fg_dev_open(const char *name, const fg_dev_options *opt);
/* Synchronizes and releases the device and all its memory. Live
 * allocations are logged (FG_LOG_WARN, with fg_dev_leak_check's message)
 * and then released: tensors on the device must be freed before. NULL is a
 * no-op. */
FG_API void fg_dev_close(fg_dev *d);
/* Takes one more reference to d: each fg_dev_retain is matched by one
 * fg_dev_close, and only the last close releases the device. A module or
 * optimizer on a device holds one, so they may be freed after the code
 * that opened the device closed it. */
FG_API void fg_dev_retain(fg_dev *d);

FG_API fg_device_id fg_dev_id(const fg_dev *d);
FG_API fg_device fg_dev_kind(const fg_dev *d);
FG_API const char *fg_dev_name(const fg_dev *d); /* "guarded:0"; valid for the device's life */
/* Whether the host may read and write this device's memory directly (only
 * the CPU's). */
FG_API bool fg_dev_host_accessible(const fg_dev *d);

/* --------------------------------------------------------------- memory */

/* Allocates `bytes` of device memory for use on `stream` (NULL: the compute
 * stream), 512-byte aligned (64 on the CPU); its contents are undefined. A
 * freed block is reused only by allocations for the same stream. bytes == 0
 * returns a unique non-NULL pointer that holds nothing. NULL with FG_ENOMEM
 * on an out-of-memory. Thread-safe. */
FG_API void *fg_dev_alloc(fg_dev *d, size_t bytes, fg_stream *stream);
/* Frees what fg_dev_alloc returned (NULL: no-op); the block goes back to
 * the cache. FG_EINVAL for a pointer this device did not hand out. */
FG_API FG_MUST_USE fg_status fg_dev_free(fg_dev *d, void *ptr);
/* Releases every cached block that holds no allocation back to the
 * device, as torch.cuda.empty_cache. Thread-safe. */
FG_API void fg_dev_empty_cache(fg_dev *d);

/* PyTorch's torch.cuda.memory_stats figures, for one device. */
typedef struct fg_dev_memory_stats {
    uint64_t allocated_bytes;      /* held by live allocations (rounded sizes) */
    uint64_t allocated_bytes_peak; /* since open or fg_dev_reset_peak_stats */
    uint64_t requested_bytes;      /* held by live allocations, as asked for */
    uint64_t reserved_bytes;       /* taken from the device (live + cached) */
    uint64_t reserved_bytes_peak;
    uint64_t active_allocs;        /* live allocations */
    uint64_t num_allocs;           /* fg_dev_alloc calls that succeeded */
    uint64_t num_frees;            /* fg_dev_free calls that freed something */
    uint64_t cache_hits;           /* allocations served from a cached block */
    uint64_t segment_allocs;       /* allocations from the device itself */
    uint64_t segment_frees;        /* segments given back (free, empty_cache) */
    uint64_t num_ooms;             /* allocations refused for lack of memory */
    uint64_t inactive_split_bytes; /* cached remainders of split segments */
    uint64_t memory_limit;         /* the limit in force (0: none) */
    /* copies through the copy calls, in bytes and calls */
    uint64_t h2d_bytes, d2h_bytes, d2d_bytes;
    uint64_t h2d_copies, d2h_copies, d2d_copies;
    /* of those, the bytes copied on the comm stream: the host staging of
     * collectives whose backend reads host memory (shm, MPI) */
    uint64_t comm_h2d_bytes, comm_d2h_bytes;
    uint64_t discarded_bytes; /* given back by fg_dev_discard, all calls together */
} fg_dev_memory_stats;

FG_API fg_dev_memory_stats fg_dev_memory_stats_get(fg_dev *d);
/* Sets the peaks to the current values, as torch.cuda.reset_peak_memory_stats. */
FG_API void fg_dev_reset_peak_stats(fg_dev *d);
/* Zeroes the copy counters (bytes and calls). */
FG_API void fg_dev_reset_copy_stats(fg_dev *d);
/* A few lines (torch.cuda.memory_summary's figures) into buf; returns buf. */
FG_API const char *fg_dev_memory_summary(fg_dev *d, char *buf, size_t n);

/* FG_OK when the device holds no live allocation; else FG_ESTATE with a
 * message naming the device, the count and bytes still live and the
 * largest of them. */
FG_API FG_MUST_USE fg_status fg_dev_leak_check(fg_dev *d);

/* Page-locked host memory for asynchronous copies (cudaMallocHost on a
 * GPU; plain 64-byte aligned host memory on cpu and guarded). The host may
 * read and write it. Free it with fg_dev_host_free on the same device. */
FG_API void *fg_dev_host_alloc(fg_dev *d, size_t bytes);
FG_API void fg_dev_host_free(fg_dev *d, void *ptr);

/* ------------------------------------------------------------ step arena */

/* A device's step arena: core.h's fg_arena (chunks bumped forward, all
 * released at once by the reset, which keeps one chunk as large as the
 * whole step) over this device's memory. Allocations are device memory,
 * 512-byte aligned, for the compute stream; the copy calls accept ranges
 * inside them. Not thread-safe: one arena per thread. Free it before the
 * device closes. */
typedef struct fg_dev_arena fg_dev_arena;

FG_API fg_dev_arena *fg_dev_arena_new(fg_dev *d, size_t chunk_bytes); /* 0 = 4 MiB chunks */
FG_API void fg_dev_arena_free(fg_dev_arena *a);
/* NULL with the device's out-of-memory message (prefixed "step arena"). */
FG_API void *fg_dev_arena_alloc(fg_dev_arena *a, size_t size);
FG_API void fg_dev_arena_reset(fg_dev_arena *a);
FG_API size_t fg_dev_arena_used(const fg_dev_arena *a); /* bytes handed out since reset */
FG_API size_t fg_dev_arena_peak(const fg_dev_arena *a); /* high-water mark of used */

/* --------------------------------------------------------------- copies */

/* Synchronous copies (done when they return): host to device, device to
 * host, device to device (within one device). Device pointers may point
 * inside an allocation; the whole range must lie in one allocation
 * (FG_EINVAL otherwise, naming the range). Counted in the stats. */
FG_API FG_MUST_USE fg_status fg_dev_copy_h2d(fg_dev *d, void *dst, const void *src, size_t bytes);
FG_API FG_MUST_USE fg_status fg_dev_copy_d2h(fg_dev *d, void *dst, const void *src, size_t bytes);
FG_API FG_MUST_USE fg_status fg_dev_copy_d2d(fg_dev *d, void *dst, const void *src, size_t bytes);
/* Sets `bytes` of device memory to the byte `value`. */
FG_API FG_MUST_USE fg_status fg_dev_memset(fg_dev *d, void *dst, int value, size_t bytes,
                                           fg_stream *stream);
/* Gives the device's memory behind the whole pages of [dst, dst + bytes)
 * back, keeping the addresses (the range must lie in one allocation): the
 * device side of madvise(MADV_DONTNEED), for ZeRO-2/3 and FSDP, which hold
 * a flat buffer but only part of it between uses. With `zero` the whole
 * range reads zero afterwards (the partial pages at its ends are cleared);
 * without, its contents are undefined afterwards and the partial pages at
 * its ends are left as they are (a neighbour's bytes share them). A page
 * costs memory again once written. On a device that cannot give part of an
 * allocation back the range is cleared (zero) or left alone; `*given` (may
 * be NULL) is the bytes given back. Not a copy: not counted as one. */
FG_API FG_MUST_USE fg_status fg_dev_discard(fg_dev *d, void *dst, size_t bytes, bool zero,
                                            size_t *given);
/* Writes `count` copies of the psize-byte pattern (1 to 16 bytes: one
 * element of any dtype) at device address dst, on `stream` (NULL: compute):
 * a kernel of the device, not a copy, so not counted in the copy stats. */
FG_API FG_MUST_USE fg_status fg_dev_fill(fg_dev *d, void *dst, const void *pattern, size_t psize,
                                         size_t count, fg_stream *stream);
/* Asynchronous copies on `stream` (NULL: the compute stream): ordered after
 * the work already on it; the host buffer is borrowed until the stream (or
 * an event recorded after the copy) completes. From pageable host memory
 * a real device goes through pinned staging; fg_dev_host_alloc memory is
 * copied directly. On cpu and guarded they are done when they return. */
FG_API FG_MUST_USE fg_status fg_dev_copy_h2d_async(fg_dev *d, void *dst, const void *src,
                                                   size_t bytes, fg_stream *stream);
FG_API FG_MUST_USE fg_status fg_dev_copy_d2h_async(fg_dev *d, void *dst, const void *src,
                                                   size_t bytes, fg_stream *stream);

/* ------------------------------------------------------ streams, events */

typedef enum fg_stream_kind { FG_STREAM_COMPUTE = 0, FG_STREAM_COMM = 1 } fg_stream_kind;

/* The device's compute or comm stream; owned by the device. */
FG_API fg_stream *fg_dev_stream(fg_dev *d, fg_stream_kind kind);
FG_API fg_dev *fg_stream_dev(const fg_stream *s);
/* Waits until all work on the stream is done. */
FG_API FG_MUST_USE fg_status fg_stream_synchronize(fg_stream *s);
/* Items of work enqueued on the stream since the device opened (copies,
 * memsets, event records, waits): a stream's clock. */
FG_API uint64_t fg_stream_work_count(const fg_stream *s);
/* Waits until all work on every stream of the device is done. */
FG_API FG_MUST_USE fg_status fg_dev_synchronize(fg_dev *d);

/* An event marks a point in a stream's work. A new event is complete (as
 * a CUDA event never recorded). */
FG_API fg_event *fg_event_new(fg_dev *d);
FG_API void fg_event_free(fg_event *e);
/* Marks the point after the work on `stream` so far. */
FG_API FG_MUST_USE fg_status fg_event_record(fg_event *e, fg_stream *stream);
/* Work enqueued on `stream` after this call runs after the event's point
 * (it may be on the device's other stream). FG_EINVAL across devices. */
FG_API FG_MUST_USE fg_status fg_stream_wait_event(fg_stream *stream, fg_event *e);
/* Whether the work before the event's point is done (never blocks). */
FG_API bool fg_event_query(const fg_event *e);
/* Waits until the event's point is reached. */
FG_API FG_MUST_USE fg_status fg_event_synchronize(fg_event *e);
/* The stream the event was last recorded on (NULL if never) and that
 * stream's fg_stream_work_count at the record. */
FG_API fg_stream *fg_event_stream(const fg_event *e);
FG_API uint64_t fg_event_point(const fg_event *e);

#ifdef __cplusplus
}
#endif
#endif
