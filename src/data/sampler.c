/* Samplers: which dataset indices a rank takes in an epoch, in which order.
 *
 * The random order is Fisher-Yates driven by Philox with the seed
 * fg_rng_derive(seed, epoch): a pure function of (n, seed, epoch), so every
 * rank computes the same permutation without talking to the others. The
 * distributed sampler applies PyTorch's DistributedSampler rule to it:
 * position p of the padded list is list[p % n] (padding repeats from the
 * start, cyclically when needed), and rank r takes positions r, r + W, ...
 * (with a block of k > 1, blocks of k positions: rank r takes blocks r,
 * r + W, ..., the deterministic mode's micro-batches). */
#include <stdint.h>
#include <string.h>

#include "data_impl.h"

struct fg_sampler {
    fg_sampler_ops ops;
    void *ud;
    int64_t len, real;
    int rank, world;
};

fg_sampler *fg_sampler_new(const fg_sampler_ops *ops, void *ud) {
    if (!ops || !ops->len || !ops->indices) {
        fg_error(FG_EINVAL, "fg_sampler_new: ops and its len and indices must be set");
        goto fail;
    }
    int64_t len = ops->len(ud);
    if (len < 0) {
        fg_error(FG_EINVAL, "fg_sampler_new: length %lld (must be >= 0)", (long long)len);
        goto fail;
    }
    fg_sampler *s = fg_calloc(1, sizeof *s);
    if (!s) goto fail;
    *s = (fg_sampler){.ops = *ops, .ud = ud, .len = len, .real = len, .rank = 0, .world = 1};
    return s;
fail:
    if (ops && ops->free) ops->free(ud);
    return NULL;
}

void fg_sampler_free(fg_sampler *s) {
    if (!s) return;
    fg_error_kept kept; /* a _free never changes the caller's error (core.h) */
    fg_error_keep(&kept);
    if (s->ops.free) s->ops.free(s->ud);
    fg_free(s);
    fg_error_restore(&kept);
}

int64_t fg_sampler_len(const fg_sampler *s) { return s->len; }
int64_t fg_sampler_num_real(const fg_sampler *s) { return s->real; }
int fg_sampler_rank(const fg_sampler *s) { return s->rank; }
int fg_sampler_world(const fg_sampler *s) { return s->world; }

fg_status fg_sampler_indices(fg_sampler *s, int64_t epoch, int64_t *out) {
    if (!s || (!out && s->len)) return fg_error(FG_EINVAL, "fg_sampler_indices: NULL argument");
    if (epoch < 0)
        return fg_error(FG_EINVAL, "fg_sampler_indices: epoch %lld (must be >= 0)",
                        (long long)epoch);
    return s->ops.indices(s->ud, epoch, out);
}

/* --------------------------------------------------------- built-ins */

typedef struct builtin {
    int64_t n;
    uint64_t seed;
    bool shuffle;
    int rank, world;
    int64_t block;    /* consecutive positions dealt at a time (1: PyTorch's rule) */
    int64_t per_rank; /* indices per epoch for this rank */
} builtin;

static void permutation(int64_t n, uint64_t seed, int64_t epoch, int64_t *out) {
    for (int64_t i = 0; i < n; i++) out[i] = i;
    fg_rng r = {fg_rng_derive(seed, (uint64_t)epoch), 0};
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)fg_rng_below(&r, (uint64_t)i + 1);
        int64_t t = out[i];
        out[i] = out[j];
        out[j] = t;
    }
}

static int64_t builtin_len(void *ud) { return ((builtin *)ud)->per_rank; }
static void builtin_free(void *ud) { fg_free(ud); }

static FG_MUST_USE fg_status builtin_indices(void *ud, int64_t epoch, int64_t *out) {
    builtin *b = ud;
    if (b->world == 1 && b->per_rank == b->n) { /* sequential and random: no padding */
        if (b->shuffle) permutation(b->n, b->seed, epoch, out);
        else
            for (int64_t i = 0; i < b->n; i++) out[i] = i;
        return FG_OK;
    }
    int64_t *list = NULL;
    if (b->shuffle && b->per_rank) {
        if (!(list = fg_alloc((size_t)b->n * sizeof *list))) return FG_ENOMEM;
        permutation(b->n, b->seed, epoch, list);
    }
    for (int64_t j = 0; j < b->per_rank; j++) {
        int64_t p = (((j / b->block) * b->world + b->rank) * b->block + j % b->block) % b->n;
        out[j] = list ? list[p] : p;
    }
    fg_free(list);
    return FG_OK;
}

static fg_sampler *builtin_new(const builtin *b, int64_t real) {
    builtin *ud = fg_alloc(sizeof *ud);
    if (!ud) return NULL;
    *ud = *b;
    static const fg_sampler_ops ops = {builtin_len, builtin_indices, builtin_free};
    fg_sampler *s = fg_sampler_new(&ops, ud);
    if (!s) return NULL;
    s->real = real;
    s->rank = b->rank;
    s->world = b->world;
    return s;
}

fg_sampler *fg_sampler_sequential(int64_t n) {
    if (n < 0) {
        fg_error(FG_EINVAL, "fg_sampler_sequential: n=%lld (must be >= 0)", (long long)n);
        return NULL;
    }
    return builtin_new(&(builtin){.n = n, .world = 1, .block = 1, .per_rank = n}, n);
}

fg_sampler *fg_sampler_random(int64_t n, uint64_t seed) {
    if (n < 0) {
        fg_error(FG_EINVAL, "fg_sampler_random: n=%lld (must be >= 0)", (long long)n);
        return NULL;
    }
    return builtin_new(
        &(builtin){.n = n, .seed = seed, .shuffle = true, .world = 1, .block = 1, .per_rank = n},
        n);
}

fg_sampler *fg_sampler_distributed(int64_t n, int rank, int world, const fg_distributed_opts *o) {
    fg_distributed_opts d = o ? *o : (fg_distributed_opts){0};
    if (n < 0) {
        fg_error(FG_EINVAL, "fg_sampler_distributed: n=%lld (must be >= 0)", (long long)n);
        return NULL;
    }
    if (world < 1 || rank < 0 || rank >= world) {
        fg_error(FG_EINVAL,
                 "fg_sampler_distributed: rank=%d, world=%d: expected world >= 1 and "
                 "0 <= rank < world",
                 rank, world);
        return NULL;
    }
    int64_t k = d.block ? d.block : 1;
    if (k < 0 || d.round < 0 || k > (INT64_MAX / 2) / world ||
        (d.round && d.round % (k * world) != 0)) {
        fg_error(FG_EINVAL,
                 "fg_sampler_distributed: block=%lld, round=%lld on %d ranks: expected block >= 0 "
                 "and round a multiple of block * world (or 0)",
                 (long long)d.block, (long long)d.round, world);
        return NULL;
    }
    int64_t rnd = k * world; /* whole rounds: every rank takes a block of each */
    int64_t cut = d.round ? d.round : rnd;
    int64_t total = d.drop_last ? n / cut * cut : (n + rnd - 1) / rnd * rnd;
    int64_t per = total / world;
    /* positions >= n are padding: whole rounds hold k real ones per rank, and
     * the last, partial round those of its first n % rnd positions */
    int64_t rem = n % rnd, mine = rem - (int64_t)rank * k;
    int64_t real = n / rnd * k + (mine < 0 ? 0 : mine > k ? k : mine);
    if (real > per) real = per;
    builtin b = {.n = n,
                 .seed = d.seed,
                 .shuffle = d.shuffle,
                 .rank = rank,
                 .world = world,
                 .block = k,
                 .per_rank = per};
    return builtin_new(&b, real);
}
