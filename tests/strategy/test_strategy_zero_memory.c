/* What a rank holds under the sharded strategies. The optimizer's state is
 * only ever the shard's: on 2 and 3 forked ranks (shm backend), under deepspeed_stage_1,
 * _2, _3, fsdp SHARD_GRAD_OP and FULL_SHARD, counted by an allocator that
 * keeps the live bytes of the process:
 *   - fg_adamw_new allocates no state at all (well under one state buffer
 *     of the model);
 *   - the most memory that constructing the optimizer and setting up the
 *     strategy ever holds on top of the model is the shard's state (2 x 4
 *     bytes per element of the rank's shard, AdamW in f32) plus the
 *     strategy's small bookkeeping, never the whole model's state;
 *   - after setup and after 3 steps each state tensor has exactly the
 *     shard's elements (fg_strategy_shard_range), so its bytes are
 *     2 x 4 x shard, and the shards tile the model;
 *   - under ddp the state is the whole model's (made at the first step).
 * And stage 3's units rewind the step arena in backward: the step memory's
 * high-water mark over the same steps is under what a forward makes (2
 * Blocks of this small GPT: the root's embeddings, head and loss are most
 * of it) and three quarters more (backward's memory does not stay until
 * the step ends), and not above ddp's (whose autograd hands each
 * activation's gradient back to the step once its node has run, but keeps
 * the kernels' scratch).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "fulgur/strategy.h"
#include "harness.h"
#include "mp/mp_join.h"

#define SLACK ((int64_t)64 << 10) /* the strategy's own structures */

/* ------------------------------------------------------------ counting */

/* The blocks this allocator made, by address (open addressing): a block
 * made before it was set (in the parent, before the fork) is passed to the
 * C library's free and realloc uncounted. */
#define SLOTS (1 << 18)
static struct {
    void *p;
    size_t size;
} g_blocks[SLOTS];
static int64_t g_live, g_peak;

static size_t slot_of(const void *p) {
    size_t i = ((uintptr_t)p >> 6) * 0x9E3779B97F4A7C15u >> 46;
    while (g_blocks[i].p && g_blocks[i].p != p) i = (i + 1) & (SLOTS - 1);
    return i;
}

static void forget(size_t i) { /* backward-shift deletion */
    g_blocks[i].p = NULL;
    for (size_t j = (i + 1) & (SLOTS - 1); g_blocks[j].p; j = (j + 1) & (SLOTS - 1)) {
        void *p = g_blocks[j].p;
        size_t size = g_blocks[j].size;
        g_blocks[j].p = NULL;
        size_t k = slot_of(p);
        g_blocks[k].p = p;
        g_blocks[k].size = size;
    }
}

static void *counting(void *ud, void *ptr, size_t size, size_t align) {
    (void)ud;
    size_t old = 0;
    if (ptr) {
        size_t i = slot_of(ptr);
        if (!g_blocks[i].p) { /* not ours */
            if (size == 0) free(ptr);
            return size ? realloc(ptr, size) : NULL;
        }
        old = g_blocks[i].size;
        forget(i);
        g_live -= (int64_t)old;
    }
    if (size == 0) {
        free(ptr);
        return NULL;
    }
    void *p = NULL;
    if (posix_memalign(&p, align < 64 ? 64 : align, size) != 0) return NULL;
    if (ptr) {
        memcpy(p, ptr, old < size ? old : size);
        free(ptr);
    }
    size_t i = slot_of(p);
    g_blocks[i].p = p;
    g_blocks[i].size = size;
    g_live += (int64_t)size;
    if (g_live > g_peak) g_peak = g_live;
    return p;
}

/* ------------------------------------------------------------ ranks */

typedef struct shared {
    char job[64];
    fg_strategy_kind kind;
    fg_sharding_strategy sharding;
    int64_t numel;
    int64_t new_bytes[8];   /* live bytes fg_adamw_new added */
    int64_t setup_peak[8];  /* most bytes above the model during new + setup */
    int64_t shard[8][2];    /* fg_strategy_shard_range */
    int64_t state[8][2][2]; /* per state tensor: elements after setup, after 3 steps */
    int64_t range[8][2];    /* fg_optimizer_state_range after the steps */
    int64_t arena_peak[8];  /* fg_step_peak_bytes after the steps */
    int64_t forward[8];     /* step bytes after the last forward */
} shared;

static fg_module *make_model(void) {
    return fg_gpt_new(
        &(fg_gpt_config){.vocab = 17, .ctx = 8, .layers = 2, .heads = 2, .embd = 64, .seed = 5});
}

static int state_rank(int rank, int n, void *arg) {
    shared *sh = arg;
    fg_set_allocator(counting, NULL);
    fg_comm *c = mp_join_shm(rank, n, sh->job, 60);
    if (!c) return 1;
    CHECK_OK(fg_set_num_threads(1));
    fg_module *m = make_model();
    int64_t before = g_live;
    g_peak = g_live;
    fg_optimizer *o = fg_adamw_new(m, &(fg_adamw_opts){.lr = 1e-2});
    sh->new_bytes[rank] = g_live - before;
    fg_sharded_opts so = {.sharding_strategy = sh->sharding};
    fg_strategy *st = o ? fg_strategy_new(sh->kind, c, m, o, NULL, &so, 0) : NULL;
    sh->setup_peak[rank] = g_peak - before;
    if (!st) {
        fprintf(stderr, "rank %d: %s\n", rank, fg_last_error());
        return 1;
    }
    sh->numel = fg_module_numel(m);
    if (fg_strategy_is_sharded(st))
        CHECK_OK(fg_strategy_shard_range(st, rank, &sh->shard[rank][0], &sh->shard[rank][1]));
    else sh->shard[rank][1] = sh->numel;
    for (int k = 0; k < 2; k++) sh->state[rank][k][0] = fg_tensor_numel(fg_optimizer_state(o, k));
    int bad = 0;
    for (int step = 0; step < 3 && !bad; step++) {
        int64_t shape[2] = {2, 8};
        fg_tensor *x = fg_empty(FG_I32, 2, shape), *y = fg_empty(FG_I32, 2, shape);
        for (int64_t i = 0; i < 16; i++) {
            ((int32_t *)fg_tensor_data(x))[i] = (int32_t)((i * 7 + step + rank) % 17);
            ((int32_t *)fg_tensor_data(y))[i] = (int32_t)((i * 5 + step) % 17);
        }
        fg_optimizer_zero_grad(o);
        size_t at = fg_step_bytes();
        fg_tensor *l = fg_cross_entropy(fg_module_forward(m, x), y, -100);
        sh->forward[rank] = (int64_t)(fg_step_bytes() - at);
        bad |= fg_strategy_backward(st, l) != FG_OK || fg_optimizer_step(o) != FG_OK;
        if (bad) fprintf(stderr, "rank %d step %d: %s\n", rank, step, fg_last_error());
        fg_step_reset();
    }
    for (int k = 0; k < 2; k++) sh->state[rank][k][1] = fg_tensor_numel(fg_optimizer_state(o, k));
    fg_optimizer_state_range(o, &sh->range[rank][0], &sh->range[rank][1]);
    sh->arena_peak[rank] = (int64_t)fg_step_peak_bytes();
    fg_strategy_free(st);
    fg_optimizer_free(o);
    fg_module_free(m);
    fg_comm_free(c);
    fg_step_thread_release();
    fg_set_allocator(NULL, NULL);
    return bad;
}

static const struct {
    fg_strategy_kind kind;
    fg_sharding_strategy sharding;
    const char *name;
} k_kinds[] = {
    {FG_STRATEGY_DEEPSPEED_STAGE_1, 0, "deepspeed_stage_1"},
    {FG_STRATEGY_DEEPSPEED_STAGE_2, 0, "deepspeed_stage_2"},
    {FG_STRATEGY_FSDP, FG_SHARDING_SHARD_GRAD_OP, "fsdp SHARD_GRAD_OP"},
    {FG_STRATEGY_DEEPSPEED_STAGE_3, 0, "deepspeed_stage_3"},
    {FG_STRATEGY_FSDP, FG_SHARDING_FULL_SHARD, "fsdp FULL_SHARD"},
};

static shared *run(fg_strategy_kind kind, fg_sharding_strategy ss, int world) {
    shared *sh =
        mmap(NULL, sizeof(shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) return NULL;
    memset(sh, 0, sizeof *sh);
    sh->kind = kind;
    sh->sharding = ss;
    snprintf(sh->job, sizeof sh->job, "t-zst-%d-%d-%d-%d", getpid(), (int)kind, (int)ss, world);
    int failed = fg_test_fork_ranks(world, state_rank, sh, 120);
    CHECK_MSG(failed == 0, "%s on %d ranks: %d ranks failed", fg_strategy_kind_name(kind), world,
              failed);
    return failed == 0 ? sh : NULL;
}

TEST(sharded_optimizer_state_is_the_shard_only) {
    for (int world = 2; world <= 3; world++)
        for (size_t i = 0; i < sizeof k_kinds / sizeof *k_kinds; i++) {
            shared *sh = run(k_kinds[i].kind, k_kinds[i].sharding, world);
            if (!sh) continue;
            int64_t full = 2 * 4 * sh->numel, covered = 0;
            for (int r = 0; r < world; r++) {
                int64_t lo = sh->shard[r][0], hi = sh->shard[r][1], n = hi - lo;
                int64_t bytes = 2 * 4 * n;
                CHECK_MSG(lo == covered, "%s, %d ranks: rank %d's shard starts at %lld, not %lld",
                          k_kinds[i].name, world, r, (long long)lo, (long long)covered);
                covered = hi;
                CHECK_MSG(n <= sh->numel / world + 16,
                          "%s, %d ranks: rank %d's shard of %lld elements is more than 1/%d of "
                          "%lld",
                          k_kinds[i].name, world, r, (long long)n, world, (long long)sh->numel);
                CHECK_MSG(sh->new_bytes[r] < full / 16,
                          "%s, %d ranks: rank %d: fg_adamw_new allocated %lld bytes (the whole "
                          "state is %lld)",
                          k_kinds[i].name, world, r, (long long)sh->new_bytes[r], (long long)full);
                CHECK_MSG(sh->setup_peak[r] <= bytes + SLACK,
                          "%s, %d ranks: rank %d held %lld bytes over the model during optimizer "
                          "and setup; its shard's state is %lld, the whole state %lld",
                          k_kinds[i].name, world, r, (long long)sh->setup_peak[r], (long long)bytes,
                          (long long)full);
                for (int k = 0; k < 2; k++)
                    for (int when = 0; when < 2; when++)
                        CHECK_MSG(sh->state[r][k][when] == n,
                                  "%s, %d ranks: rank %d: state %d holds %lld elements %s, its "
                                  "shard %lld",
                                  k_kinds[i].name, world, r, k, (long long)sh->state[r][k][when],
                                  when ? "after 3 steps" : "after setup", (long long)n);
                CHECK(sh->range[r][0] == lo && sh->range[r][1] == hi);
            }
            CHECK_MSG(covered == sh->numel, "%s, %d ranks: the shards cover %lld of %lld",
                      k_kinds[i].name, world, (long long)covered, (long long)sh->numel);
            CHECK(full / world > 2 * SLACK); /* the bound above tells a shard from the whole */
            munmap(sh, sizeof *sh);
        }
}

TEST(ddp_optimizer_state_is_whole) {
    shared *sh = run(FG_STRATEGY_DDP, 0, 2);
    if (!sh) return;
    for (int r = 0; r < 2; r++) {
        CHECK(sh->new_bytes[r] < 2 * 4 * sh->numel / 16); /* made at the first step */
        for (int k = 0; k < 2; k++) CHECK(sh->state[r][k][1] == sh->numel);
        CHECK(sh->range[r][0] == 0 && sh->range[r][1] == sh->numel);
    }
    munmap(sh, sizeof *sh);
}

TEST(stage3_backward_rewinds_the_step_arena) {
    shared *d = run(FG_STRATEGY_DDP, 0, 2);
    shared *z = run(FG_STRATEGY_DEEPSPEED_STAGE_3, 0, 2);
    shared *f = run(FG_STRATEGY_FSDP, FG_SHARDING_FULL_SHARD, 2);
    if (!d || !z || !f) return;
    for (int r = 0; r < 2; r++) {
        CHECK_MSG(d->forward[r] > 0, "rank %d: the forward made no step memory", r);
        for (shared *s3 = z; s3; s3 = s3 == z ? f : NULL)
            CHECK_MSG(s3->arena_peak[r] + d->forward[r] / 4 < 2 * d->forward[r] &&
                          s3->arena_peak[r] <= d->arena_peak[r],
                      "rank %d: stage 3's step arena peaked at %lld bytes, ddp's at %lld (a "
                      "forward makes %lld)",
                      r, (long long)s3->arena_peak[r], (long long)d->arena_peak[r],
                      (long long)d->forward[r]);
    }
    munmap(d, sizeof *d);
    munmap(z, sizeof *z);
    munmap(f, sizeof *f);
}
