/* The fixtures the tests share, so that each is written once:
 *
 *   - a failing and counting allocator (fg_set_allocator's hook): the first
 *     `allowed` allocations succeed, then every later one fails, or only the
 *     next one (fx_alloc_begin_nth); it counts the allocations it was asked
 *     for and the blocks it made that are still live, so that a test can
 *     fail each allocation of a path in turn and check that every failure is
 *     an error and frees what it took; and the bytes it holds, with their
 *     peak since fx_alloc_peak_reset, so that a test can bound what a path
 *     allocates. Thread-safe; state per process (a forked rank has its own).
 *   - the tiny models of the multi-rank and strategy tests, and their global batch as a function of
 * (step, row), so that any rank or micro-batch can make its rows of one global batch and a
 * one-process run makes all of them.
 *
 * Everything is static inline: a test uses what it needs, and links only
 * what it uses (a core test includes this and links fg_core alone). */
#ifndef FULGUR_TEST_FIXTURES_H
#define FULGUR_TEST_FIXTURES_H

#include <limits.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "fulgur/core.h"
#include "fulgur/nn.h"

/* ------------------------------------------------ the failing allocator */

static atomic_long fx_alloc_count_, fx_alloc_live_;
static atomic_long fx_alloc_allowed_;
static atomic_bool fx_alloc_once_;
static atomic_long fx_alloc_bytes_, fx_alloc_peak_, fx_alloc_base_;

/* The bytes of block p (0 where the C library cannot say). */
static inline long fx_block_bytes_(void *p) {
#if defined(__GLIBC__)
    return p ? (long)malloc_usable_size(p) : 0;
#else
    (void)p;
    return 0;
#endif
}

static inline void fx_alloc_grew_(long by) {
    long now = atomic_fetch_add(&fx_alloc_bytes_, by) + by, peak = atomic_load(&fx_alloc_peak_);
    while (now > peak && !atomic_compare_exchange_weak(&fx_alloc_peak_, &peak, now)) {
    }
}

static inline void *fx_alloc_(void *ud, void *ptr, size_t size, size_t align) {
    (void)ud;
    if (size == 0) {
        if (ptr) atomic_fetch_sub(&fx_alloc_live_, 1);
        atomic_fetch_sub(&fx_alloc_bytes_, fx_block_bytes_(ptr));
        free(ptr);
        return NULL;
    }
    long k = atomic_fetch_add(&fx_alloc_count_, 1);
    long allowed = atomic_load(&fx_alloc_allowed_);
    if (atomic_load(&fx_alloc_once_) ? k == allowed : k >= allowed) return NULL;
    if (ptr) {
        long old = fx_block_bytes_(ptr);
        void *q = realloc(ptr, size);
        if (q) fx_alloc_grew_(fx_block_bytes_(q) - old);
        return q;
    }
    void *p = NULL;
    if (posix_memalign(&p, align < 16 ? 16 : align, size) != 0) return NULL;
    atomic_fetch_add(&fx_alloc_live_, 1);
    fx_alloc_grew_(fx_block_bytes_(p));
    return p;
}

/* Sets the allocator: the first `allowed` allocations from now succeed,
 * every later one fails (LONG_MAX: none fails, only counted). */
static inline void fx_alloc_begin(long allowed) {
    atomic_store(&fx_alloc_allowed_, allowed);
    atomic_store(&fx_alloc_once_, false);
    atomic_store(&fx_alloc_count_, 0);
    atomic_store(&fx_alloc_live_, 0);
    fg_set_allocator(fx_alloc_, NULL);
}

/* Sets the allocator: allocation number n from now (1-based) fails, every
 * other one succeeds. */
static inline void fx_alloc_begin_nth(long n) {
    fx_alloc_begin(n - 1);
    atomic_store(&fx_alloc_once_, true);
}

/* Moves the limit of a running fx_alloc_begin: `allowed` counts from the
 * allocator's start, as fx_alloc_count does. */
static inline void fx_alloc_limit(long allowed) { atomic_store(&fx_alloc_allowed_, allowed); }

/* The allocations asked for since the start (the failed ones included). */
static inline long fx_alloc_count(void) { return atomic_load(&fx_alloc_count_); }

/* The blocks this allocator made that are not freed yet. */
static inline long fx_alloc_live(void) { return atomic_load(&fx_alloc_live_); }

/* From now on the peak counts from the bytes held now. */
static inline void fx_alloc_peak_reset(void) {
    long now = atomic_load(&fx_alloc_bytes_);
    atomic_store(&fx_alloc_base_, now);
    atomic_store(&fx_alloc_peak_, now);
}

/* The most bytes held at once since fx_alloc_peak_reset, beyond those held
 * then (blocks from before fx_alloc_begin that are freed count as freed). */
static inline long fx_alloc_peak_above(void) {
    return atomic_load(&fx_alloc_peak_) - atomic_load(&fx_alloc_base_);
}

/* Restores the default allocator; returns the blocks still live. */
static inline long fx_alloc_end(void) {
    fg_set_allocator(NULL, NULL);
    return atomic_load(&fx_alloc_live_);
}

/* ------------------------------------------- tiny models and their data */

/* The tiny GPT of the strategy tests: vocab 17, ctx 8, 2 layers, 2 heads,
 * 16 wide. */
#define FX_GPT_VOCAB 17
#define FX_GPT_CTX 8
static inline fg_module *fx_tiny_gpt(uint64_t seed) {
    return fg_gpt_new(&(fg_gpt_config){.vocab = FX_GPT_VOCAB,
                                       .ctx = FX_GPT_CTX,
                                       .layers = 2,
                                       .heads = 2,
                                       .embd = 16,
                                       .seed = seed});
}

/* The tiny MLP of the strategy tests: 12 -> 32 -> 32 -> 5. */
#define FX_MLP_IN 12
#define FX_MLP_CLASSES 5
static inline fg_module *fx_tiny_mlp(uint64_t seed) {
    return fg_mlp_new(
        &(fg_mlp_config){.sizes = {FX_MLP_IN, 32, 32, FX_MLP_CLASSES}, .nlayers = 3, .seed = seed});
}

/* Rows [r0, r0 + n) of step `step`'s global batch, for the tiny GPT (x and
 * y token ids, (n, 8) i32) or the tiny MLP (x (n, 12) f32 normal, y (n) i32
 * class ids): each element a function of (step, row, column) only, so the
 * rows do not depend on how the batch is split. The caller owns x and y. */
static inline void fx_batch_rows(bool gpt, int step, int64_t r0, int64_t n, fg_tensor **x,
                                 fg_tensor **y) {
    if (gpt) {
        int64_t sh[2] = {n, FX_GPT_CTX};
        *x = fg_empty(FG_I32, 2, sh);
        *y = fg_empty(FG_I32, 2, sh);
        for (int64_t i = 0; i < n * FX_GPT_CTX; i++) {
            uint64_t k = (uint64_t)step * 1000003u + (uint64_t)(r0 * FX_GPT_CTX + i);
            ((int32_t *)fg_tensor_data(*x))[i] = (int32_t)(fg_rng_u32_at(11, k) % FX_GPT_VOCAB);
            ((int32_t *)fg_tensor_data(*y))[i] = (int32_t)(fg_rng_u32_at(12, k) % FX_GPT_VOCAB);
        }
    } else {
        int64_t sx[2] = {n, FX_MLP_IN}, sy[1] = {n};
        *x = fg_empty(FG_F32, 2, sx);
        *y = fg_empty(FG_I32, 1, sy);
        fg_rng_fill_normal(13, (uint64_t)step * 100000u + (uint64_t)r0 * FX_MLP_IN,
                           fg_tensor_data(*x), n * FX_MLP_IN, 0, 1);
        for (int64_t i = 0; i < n; i++)
            ((int32_t *)fg_tensor_data(*y))[i] =
                (int32_t)(fg_rng_u32_at(14, (uint64_t)step * 1000u + (uint64_t)(r0 + i)) %
                          FX_MLP_CLASSES);
    }
}

#endif
