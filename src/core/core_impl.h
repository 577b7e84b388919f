/* Private helpers of the core layer, shared by every layer above. */
#ifndef FULGUR_CORE_IMPL_H
#define FULGUR_CORE_IMPL_H

#include "fulgur/core.h"

/* Passes a failure up: `FG_TRY(fg_foo(...));` returns its status if not FG_OK. */
#define FG_TRY(expr)                                                                               \
    do {                                                                                           \
        fg_status fg__try_s_ = (expr);                                                             \
        if (fg__try_s_ != FG_OK) return fg__try_s_;                                                \
    } while (0)

/* Jumps to `fail` with `st` set (NCCL's NCCLCHECKGOTO pattern). */
#define FG_TRY_GOTO(expr, st, label)                                                               \
    do {                                                                                           \
        (st) = (expr);                                                                             \
        if ((st) != FG_OK) goto label;                                                             \
    } while (0)

/* Drops a status on purpose, where a failure cannot matter to the caller
 * (each use says why): GCC's warn_unused_result (FG_MUST_USE) warns even
 * through a (void) cast. */
static inline void fg__status_drop(fg_status s) { (void)s; }

/* Reads an environment variable as an integer; returns `def` if unset and
 * FG_EINVAL (naming the variable) if set but not an integer. */
FG_MUST_USE fg_status fg__env_int(const char *name, long def, long *out);
FG_MUST_USE fg_status fg__env_double(const char *name, double def, double *out);

/* One symbol of a library opened by fg__dl_open: its name, where its
 * address goes (a function pointer's address), and whether it may be
 * missing (the pointer is then left as it was). */
typedef struct fg__dl_sym {
    void *dst;
    const char *sym;
    bool optional;
} fg__dl_sym;

/* dlopen(name) and every symbol of syms[0..n) into its dst; the handle, or
 * NULL with the reason in why (dlerror's text, or "NAME: no SYMBOL"; the
 * library is then closed). Sets no error of its own: the caller says what
 * the library is for. */
void *fg__dl_open(const char *name, const fg__dl_sym *syms, size_t n, char *why, size_t why_len);

/* The threads kernels use now, on this thread: fg_get_num_threads's
 * setting, or fewer while other processes keep cores busy (threads.c);
 * applies the count to OpenMP and OpenBLAS for this thread. Thread-safe. */
int fg__threads_now(void);
/* Runs this thread's next kernels on n threads, until fg__threads_now (the
 * next product) applies the load's count again. */
void fg__threads_use(int n);
/* From now on kernels use the setting whatever the load, for the rest of
 * the process (the deterministic mode: bits that do not depend on it). */
void fg__threads_pin(void);
/* The cores this process may use: its affinity mask, capped by a cgroup
 * CPU quota; at least 1. Thread-safe. */
int fg__cores_usable(void);
/* Of those, the ones other processes left free over the last load window
 * (>= 0); measured at most every 0.25 s. Thread-safe. */
double fg__cores_free(void);

/* A point of an arena to rewind to (activation checkpointing frees a
 * block's recomputed activations before the next block's): what the arena
 * handed out after fg__arena_mark is released by fg__arena_release, and the
 * chunks it needed are kept as a spare for the next rewind's allocations.
 * Pointers into the released part are invalid after. */
typedef struct fg__arena_point {
    void *chunk;
    size_t chunk_used, used;
    /* the thread's device step arena at the mark (fg__step_mark) */
    void *dchunk;
    size_t dchunk_used, dused;
} fg__arena_point;
fg__arena_point fg__arena_mark(const fg_arena *a);
void fg__arena_release(fg_arena *a, fg__arena_point m);
/* Whether fg_alloc is the default allocator (the C library's: its large
 * blocks are private anonymous memory, which madvise can release). */
bool fg__alloc_is_default(void);

#define FG_MIN(a, b) ((a) < (b) ? (a) : (b))
#define FG_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
