/* fulgur core: status codes and error messages, logging hook, allocation,
 * the step arena, the counter-based RNG, dtypes and conversions, threads.
 *
 * Everything above builds on this header. Nothing here prints or exits:
 * errors come back as fg_status with a per-thread message (fg_last_error),
 * and log lines go to a hook the program sets (fg_set_log).
 *
 * CONVENTIONS
 *
 * These hold for every public header of fulgur. Where a function departs
 * from one, its comment says so.
 *
 * Errors. A function that can fail returns fg_status, FG_OK (0) on success.
 * On failure it leaves a message in fg_last_error() that names the bad value
 * and what to do about it, and the same status in fg_last_status(). Both
 * belong to the calling thread and describe its most recent failure; after a
 * call that succeeded they mean nothing. The first failure is the one
 * reported: cleanup after it (which may fail too, or succeed and leave a
 * message of its own) does not replace it (fg_error_keep, fg_error_restore).
 *
 * Releasing. A fg_x_free (or fg_x_close) never changes the calling thread's
 * message or status, whether what it releases fails to close cleanly or
 * not, and whether it is given an object or NULL: it can be called on an
 * error path between the failure and its report.
 *
 * Constructors. A function that makes an object (fg_x_new, fg_x_open, ...)
 * returns it, or NULL on failure with the message in fg_last_error() and the
 * status in fg_last_status(). It does not hand the object back through an
 * out-parameter. The caller owns what it gets and releases it with the
 * matching fg_x_free (fg_x_close for what fg_x_open opened); releasing NULL
 * does nothing. Three kinds of call keep the status form, returning
 * fg_status and setting out-parameters (to NULL on failure): one that makes
 * two objects (fg_dataset_split), one for which NULL is a success
 * (fg_comm_split, for a rank in no group), and one that starts an operation
 * rather than makes an object (fg_comm_iallreduce and its kin, whose
 * out-parameter is a request).
 *
 * Ownership. A pointer argument is borrowed: the callee reads or writes it
 * during the call, or until the point its comment names ("borrowed until
 * fg_st_close"), and the caller keeps it. An argument documented as
 * "consumed" passes to the callee, also when the call fails: the callee
 * frees it on that path, so the caller never frees it after the call,
 * whatever the call returned. A NULL where a consumed object is expected
 * fails with the status and message the failed constructor left, so that
 * fg_x_add(parent, fg_y_new(...)) reports the real cause.
 *
 * Options and defaults. Options come in by const pointer to a plain struct;
 * NULL, or a field left zero, means the documented default. A zero fg_dtype
 * is FG_DTYPE_DEFAULT: f32 wherever a dtype is an option. A tensor always
 * has a real dtype: the tensor constructors refuse 0.
 *
 * Threads. Distinct objects may be used on distinct threads at once; one
 * object is used by one thread at a time unless its comment says otherwise.
 * A call marked collective must be made by every rank, in the same order. */
#ifndef FULGUR_CORE_H
#define FULGUR_CORE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define FG_API __attribute__((visibility("default")))
#define FG_PRINTF(f, a) __attribute__((format(printf, f, a)))
/* On every function that returns a status (a failure the caller cannot
 * ignore: a collective, a parse, a copy to a device). Not on fg_error and
 * its kin, which return their argument for convenience, nor on calls that
 * fail only on an argument outside its enum or range (fg_convert between
 * two real dtypes, fg_set_num_threads(n >= 1), fg_autocast_set,
 * fg_st_info_at, fg_st_meta_at). On every pointer to such a function too
 * (a table's entry, a callback's type), so that a call through it is
 * checked as a direct call is. GCC warns even through a (void) cast: a
 * caller that means to drop a status tests it. */
#define FG_MUST_USE __attribute__((warn_unused_result))
#else
#define FG_API
#define FG_PRINTF(f, a)
#define FG_MUST_USE
#endif

#define FG_VERSION_MAJOR 0
#define FG_VERSION_MINOR 1
#define FG_VERSION_PATCH 0
#define FG_VERSION_STRING "0.1.0"

/* The library's version string, "MAJOR.MINOR.PATCH". Thread-safe. */
FG_API const char *fg_version(void);

/* ---------------------------------------------------------------- status */

typedef enum fg_status {
    FG_OK = 0,
    FG_EINVAL,       /* a bad argument or value: the message names it */
    FG_ENOMEM,       /* an allocation failed */
    FG_EIO,          /* a file or system call failed */
    FG_ETIMEOUT,     /* a wait ran past its timeout: the message names the peer */
    FG_EPEER,        /* a peer rank died or left: the message names it */
    FG_EUNSUPPORTED, /* not built in, or not supported for this dtype/device */
    FG_EFORMAT,      /* a malformed or hostile file */
    FG_ESTATE,       /* a call out of order (e.g. backward twice, step outside setup) */
    FG_EMISMATCH,    /* ranks disagree, or a checkpoint does not fit the model */
    FG_EINTERNAL,    /* a bug in fulgur: please report it with the message */
    FG_STATUS_COUNT
} fg_status;

/* A short constant name for a status ("FG_EINVAL: invalid argument"). */
FG_API const char *fg_status_str(fg_status s);

/* The message left by the last failing call on this thread ("" if none).
 * Valid until the next fulgur call on the same thread. Thread-safe. */
FG_API const char *fg_last_error(void);

/* The status of the last failing call on this thread (FG_OK if none, or
 * after fg_clear_error): what a constructor that returned NULL would have
 * returned. Set together with the message by fg_error, fg_verror and
 * fg_error_wrap. Thread-safe. */
FG_API fg_status fg_last_status(void);

/* Sets this thread's error message (printf-style) and status, and returns
 * `s`, so that `return fg_error(FG_EINVAL, "devices=%s: ...", v);` reads
 * naturally. User callbacks (datasets, cluster environments) may use it as
 * well. */
FG_API fg_status fg_error(fg_status s, const char *fmt, ...) FG_PRINTF(2, 3);
FG_API fg_status fg_verror(fg_status s, const char *fmt, va_list ap);

/* Prefixes this thread's current message with `prefix: ` (context while
 * passing an error up), sets the status to `s` and returns `s`. */
FG_API fg_status fg_error_wrap(fg_status s, const char *fmt, ...) FG_PRINTF(2, 3);

/* Clears this thread's error message and status (to "" and FG_OK). */
FG_API void fg_clear_error(void);

/* This thread's message and status, kept aside: the first failure survives
 * the cleanup that follows it (NCCL's rule). fg_error_keep copies them into
 * *k; fg_error_restore puts them back and returns the kept status, so that
 *     fg_error_kept k;
 *     fg_error_keep(&k);
 *     fg_x_free(x);       (or any cleanup that may fail)
 *     return fg_error_restore(&k);
 * returns the first error, not the cleanup's. */
#define FG_ERROR_MSG_MAX 1024
typedef struct fg_error_kept {
    fg_status status;
    char msg[FG_ERROR_MSG_MAX];
} fg_error_kept;
FG_API void fg_error_keep(fg_error_kept *k);
FG_API fg_status fg_error_restore(const fg_error_kept *k);

/* --------------------------------------------------------------- logging */

typedef enum fg_log_level { FG_LOG_DEBUG, FG_LOG_INFO, FG_LOG_WARN, FG_LOG_ERROR } fg_log_level;

/* A log sink: gets the level, the rank that logged (-1 before ranks are
 * known) and one formatted line without a trailing newline. */
typedef void (*fg_log_fn)(void *ud, fg_log_level level, int rank, const char *msg);

/* Sets the process's log sink and the lowest level passed to it. With no
 * sink (the default) the library is silent. fg_log_file is a ready sink
 * that writes "[fulgur rank R] LEVEL: msg" lines to the FILE * given as ud:
 * fg_set_log(fg_log_file, stderr, FG_LOG_INFO). */
FG_API void fg_set_log(fg_log_fn fn, void *ud, fg_log_level min_level);
FG_API void fg_log_file(void *ud, fg_log_level level, int rank, const char *msg);
FG_API void fg_log(fg_log_level level, const char *fmt, ...) FG_PRINTF(2, 3);
/* The rank stamped on log lines of this process (set by the launcher). */
FG_API void fg_set_log_rank(int rank);

/* ------------------------------------------------------------ allocation */

/* The allocator hook, one function as Lua's lua_Alloc:
 *   ptr == NULL, size > 0: allocate `size` bytes aligned to `align` (a power of two);
 *   ptr != NULL, size == 0: free ptr;
 *   ptr != NULL, size > 0: resize (align is 16 or less in that case).
 * Returns NULL on failure. Must be thread-safe. */
typedef void *(*fg_alloc_fn)(void *ud, void *ptr, size_t size, size_t align);

/* Replaces the allocator for all later allocations (NULL restores the
 * default). Set it before any other fulgur call: memory must be freed by the
 * allocator that made it. Not thread-safe. */
FG_API void fg_set_allocator(fg_alloc_fn fn, void *ud);

/* Allocation through the hook. Failures set FG_ENOMEM in fg_last_error and
 * return NULL. fg_free(NULL) is a no-op. fg_alloc aligns to 64 bytes. */
FG_API void *fg_alloc(size_t size);
FG_API void *fg_calloc(size_t n, size_t size); /* zeroed; checks n*size overflow */
FG_API void *fg_realloc(void *ptr, size_t size);
FG_API void fg_free(void *ptr);
FG_API char *fg_strdup(const char *s);

/* ----------------------------------------------------------------- arena */

/* A bump allocator whose memory is released all at once by fg_arena_reset.
 * Step tensors live in one; nothing allocated in it is freed on its own.
 * Allocations are 64-byte aligned. Not thread-safe: one arena per thread. */
typedef struct fg_arena fg_arena;

FG_API fg_arena *fg_arena_new(size_t chunk_bytes); /* 0 = 4 MiB chunks */
FG_API void fg_arena_free(fg_arena *a);
FG_API void *fg_arena_alloc(fg_arena *a, size_t size); /* NULL + FG_ENOMEM */
FG_API void fg_arena_reset(fg_arena *a);               /* keeps one chunk for reuse */
FG_API size_t fg_arena_used(const fg_arena *a);        /* bytes handed out since reset */
FG_API size_t fg_arena_peak(const fg_arena *a);        /* high-water mark of fg_arena_used */

/* ------------------------------------------------------------------- rng */

/* Counter-based RNG (Philox4x32-10): the value at (seed, offset) is a pure
 * function of both, so the same stream comes out on any thread, rank count
 * or order of calls. A fg_rng is a cursor into a stream. */
typedef struct fg_rng {
    uint64_t seed;
    uint64_t offset; /* in 32-bit draws */
} fg_rng;

FG_API void fg_philox(uint64_t seed, uint64_t counter, uint32_t out[4]);
/* The 32-bit draw number `index` of stream `seed`. */
FG_API uint32_t fg_rng_u32_at(uint64_t seed, uint64_t index);
FG_API uint32_t fg_rng_u32(fg_rng *r);
FG_API float fg_rng_uniform(fg_rng *r);              /* [0, 1) */
FG_API double fg_rng_normal(fg_rng *r);              /* mean 0, std 1 (Box-Muller) */
FG_API uint64_t fg_rng_below(fg_rng *r, uint64_t n); /* uniform in [0, n), n > 0 */
/* Fills n floats: element i is a pure function of (seed, offset + i). */
FG_API void fg_rng_fill_uniform(uint64_t seed, uint64_t offset, float *out, int64_t n);
FG_API void fg_rng_fill_normal(uint64_t seed, uint64_t offset, float *out, int64_t n, float mean,
                               float std);
/* A seed for sub-stream `stream` of `seed` (ranks, loader workers). */
FG_API uint64_t fg_rng_derive(uint64_t seed, uint64_t stream);
/* The process's default seed: what a seed left at 0 means where the docs say
 * so (model initialisation, data loaders). 0 until set; Lightning's
 * seed_everything is fg_fabric_seed_everything, which sets it. Thread-safe;
 * set it before building what should use it. */
FG_API void fg_set_default_seed(uint64_t seed);
FG_API uint64_t fg_default_seed(void);

/* ---------------------------------------------------------------- dtypes */

/* Element types. 0 is not a type but FG_DTYPE_DEFAULT, "none chosen": an
 * option struct left zero, or a dtype argument of a model or layer
 * constructor, means f32. Data always has a real type: the tensor
 * constructors, the communicator, fg_convert and the checkpoint layer refuse
 * FG_DTYPE_DEFAULT with FG_EINVAL. */
typedef enum fg_dtype {
    FG_DTYPE_DEFAULT = 0,
    FG_F64,
    FG_F32,
    FG_BF16,
    FG_F16,
    FG_I32,
    FG_I64,
    FG_U8,
    FG_U16,
    FG_DTYPE_COUNT
} fg_dtype;

/* True for a real dtype (FG_F64 .. FG_U16); false for FG_DTYPE_DEFAULT and
 * anything out of range. */
FG_API bool fg_dtype_valid(int dtype);
FG_API size_t fg_dtype_size(fg_dtype dt); /* 0 for FG_DTYPE_DEFAULT or an invalid dtype */
/* "f32", ...; "default" for FG_DTYPE_DEFAULT, "?" if invalid. */
FG_API const char *fg_dtype_name(fg_dtype dt);
/* safetensors names ("F64","F32","BF16","F16","I32","I64","U8","U16"); "?"
 * for FG_DTYPE_DEFAULT or an invalid dtype. */
FG_API const char *fg_dtype_st_name(fg_dtype dt);
/* Parses a real dtype by either name, case-insensitively ("f32", "BF16").
 * Returns FG_OK, or FG_EINVAL naming the unknown name (NULL and "" too: a
 * caller whose setting is optional maps those to FG_DTYPE_DEFAULT itself). */
FG_API FG_MUST_USE fg_status fg_dtype_parse(const char *name, fg_dtype *out);
FG_API bool fg_dtype_is_float(fg_dtype dt);

/* Round-to-nearest-even conversions; NaN stays NaN, overflow goes to inf. */
FG_API uint16_t fg_f32_to_bf16(float f);
FG_API float fg_bf16_to_f32(uint16_t h);
FG_API uint16_t fg_f32_to_f16(float f);
FG_API float fg_f16_to_f32(uint16_t h);
/* Converts n elements between any two dtypes (floats to integers truncate
 * toward zero). dst and src must not overlap unless identical and same dtype. */
FG_API FG_MUST_USE fg_status fg_convert(void *dst, fg_dtype dst_dt, const void *src,
                                        fg_dtype src_dt, int64_t n);

/* --------------------------------------------------------------- threads */

/* Sets the kernel threads of this process: OpenMP and OpenBLAS both obey it,
 * so ranks never oversubscribe the cores. n <= 0 means the default:
 * FULGUR_NUM_THREADS if set, else the cores this process may use (affinity
 * mask, cgroup quota). Kernels use fewer while other processes keep those
 * cores busy (FULGUR_ADAPT_THREADS); fg_get_num_threads returns the
 * setting. Not thread-safe. */
FG_API FG_MUST_USE fg_status fg_set_num_threads(int n);
FG_API int fg_get_num_threads(void);
/* Online cores of the machine (sysconf), at least 1. */
FG_API int fg_num_cores(void);

/* Monotonic clock in seconds. */
FG_API double fg_time(void);

/* The vector ISA the CPU kernels run at, chosen at run time: FG_ISA_AVX2 is
 * AVX2 with FMA and F16C, FG_ISA_AVX512 is AVX-512 F, BW, DQ and VL. */
typedef enum fg_isa { FG_ISA_AUTO, FG_ISA_SCALAR, FG_ISA_AVX2, FG_ISA_AVX512, FG_ISA_COUNT } fg_isa;
/* The ISA in use: the best this CPU has, capped by FULGUR_CPU_ISA, unless
 * fg_set_cpu_isa chose one. Never FG_ISA_AUTO. Thread-safe. */
FG_API fg_isa fg_cpu_isa(void);
/* Runs the kernels at `isa` from now on (FG_ISA_AUTO: the default, with
 * FULGUR_CPU_ISA read again); FG_EUNSUPPORTED naming what the CPU lacks.
 * Call between kernels, not while one runs on another thread. */
FG_API FG_MUST_USE fg_status fg_set_cpu_isa(fg_isa isa);
FG_API const char *fg_isa_name(fg_isa isa); /* "auto", "scalar", "avx2", "avx512"; "?" */

#ifdef __cplusplus
}
#endif
#endif
