/* Activation checkpointing under stage 3 (deepspeed_stage_3, fsdp
 * FULL_SHARD and HYBRID_SHARD), on 2 and 3 forked ranks (shm backend): a
 * GPT with dropout, its blocks checkpointed, trains to bitwise the
 * parameters of the same stage-3 run without checkpointing, with units per
 * block (the checkpoint inside the unit), units smaller than a block (the
 * units inside the checkpoint: their forwards run again in its backward),
 * no units but the root's, small gather and reduce pieces, gradient
 * accumulation. The checkpointed runs gather no more parameters at once
 * than the plain ones (units per block) and keep a lower step-arena peak
 * (their activations are dropped); every rank ends with rank 0's model. */
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fulgur/strategy.h"
#include "harness.h"
#include "mp/mp_join.h"

#define STEPS 4
#define MAXN (1 << 17)

typedef struct setup {
    int world;
    bool ckpt;
    int accum;
    int64_t reduce, gather, min_params;
    int hybrid;
    fg_strategy_kind kind;
    fg_sharding_strategy sharding;
} setup;

typedef struct shared {
    setup s;
    char job[64];
    float result[MAXN];
    int64_t numel;
    int64_t peak_gathered[4], shard[4];
    size_t arena_peak[4];
    int nckpt;
} shared;

enum { B = 2, T = 8, VOCAB = 33 };

static fg_module *make_model(void) {
    return fg_gpt_new(&(fg_gpt_config){
        .vocab = VOCAB, .ctx = T, .layers = 8, .heads = 2, .embd = 32, .dropout = 0.1, .seed = 5});
}

static void batch(int step, int64_t r0, int64_t n, fg_tensor **x, fg_tensor **y) {
    int64_t sh[2] = {n, T};
    *x = fg_empty(FG_I32, 2, sh);
    *y = fg_empty(FG_I32, 2, sh);
    for (int64_t i = 0; i < n * T; i++) {
        uint64_t k = (uint64_t)step * 1000003u + (uint64_t)(r0 * T + i);
        ((int32_t *)fg_tensor_data(*x))[i] = (int32_t)(fg_rng_u32_at(21, k) % VOCAB);
        ((int32_t *)fg_tensor_data(*y))[i] = (int32_t)(fg_rng_u32_at(22, k) % VOCAB);
    }
}

static int train_rank(int rank, int n, void *arg) {
    shared *sh = arg;
    const setup *s = &sh->s;
    fg_comm *c = mp_join_shm(rank, n, sh->job, 60);
    if (!c) return 1;
    CHECK_OK(fg_set_num_threads(1));
    fg_module *m = make_model();
    int nckpt = 0;
    if (s->ckpt && fg_module_set_activation_checkpointing(m, NULL, true, &nckpt) != FG_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, fg_last_error());
        return 1;
    }
    fg_optimizer *o = fg_adamw_new(m, &(fg_adamw_opts){.lr = 1e-2, .weight_decay = 0.1});
    fg_sharded_opts so = {.reduce_bucket_size = s->reduce,
                          .allgather_bucket_size = s->gather,
                          .sharding_strategy = s->sharding,
                          .min_num_params = s->min_params,
                          .hybrid_shard_size = s->hybrid};
    fg_strategy *st = fg_strategy_new(s->kind, c, m, o, NULL, &so, 0);
    if (!st) {
        fprintf(stderr, "rank %d: %s\n", rank, fg_last_error());
        return 1;
    }
    int accum = s->accum ? s->accum : 1, bad = 0;
    int64_t micro = B / accum;
    for (int step = 0; step < STEPS && !bad; step++) {
        fg_optimizer_zero_grad(o);
        for (int k = 0; k < accum && !bad; k++) {
            fg_tensor *x, *y;
            batch(step, rank * B + k * micro, micro, &x, &y);
            fg_tensor *l = fg_cross_entropy(fg_module_forward(m, x), y, -100);
            if (accum > 1) l = fg_scale(l, 1.0 / accum);
            fg_strategy_set_sync(st, k == accum - 1);
            bad |= fg_strategy_backward(st, l) != FG_OK;
        }
        if (!bad) bad |= fg_optimizer_step(o) != FG_OK;
        if (bad) fprintf(stderr, "rank %d step %d: %s\n", rank, step, fg_last_error());
        fg_step_reset();
    }
    sh->arena_peak[rank] = fg_step_peak_bytes();
    sh->peak_gathered[rank] = fg_strategy_peak_gathered(st);
    int64_t b = 0, e = 0;
    CHECK_OK(fg_strategy_param_range(st, rank, &b, &e));
    sh->shard[rank] = e - b;
    sh->nckpt = nckpt;
    bad |= !bad && fg_strategy_gather_params(st) != FG_OK;
    fg_tensor *flat = fg_module_flat_params(m);
    int64_t cnt = fg_tensor_numel(flat);
    if (cnt > MAXN) {
        fprintf(stderr, "the model (%lld) is larger than the result buffer\n", (long long)cnt);
        bad = 1;
        cnt = MAXN;
    }
    sh->numel = cnt;
    if (rank == 0) memcpy(sh->result, fg_tensor_data(flat), sizeof(float) * (size_t)cnt);
    bad |= mp_differs_from_rank0(c, rank, fg_tensor_data(flat), cnt);
    fg_strategy_free(st);
    fg_optimizer_free(o);
    fg_module_free(m);
    fg_comm_free(c);
    return bad;
}

static bool run(shared *sh, setup s, const char *what) {
    memset(sh, 0, sizeof *sh);
    sh->s = s;
    snprintf(sh->job, sizeof sh->job, "t-z3c-%d-%s-%d-%d-%d-%d", getpid(), what, (int)s.kind,
             (int)s.sharding, s.world, (int)s.ckpt);
    int failed = fg_test_fork_ranks(s.world, train_rank, sh, 180);
    CHECK_MSG(failed == 0, "%s (%s, %d ranks, checkpointing %s): %d ranks failed", what,
              fg_strategy_kind_name(s.kind), s.world, s.ckpt ? "on" : "off", failed);
    return failed == 0;
}

static shared *map_shared(void) {
    return mmap(NULL, sizeof(shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
}

/* s with checkpointing against s without: bitwise parameters; with
 * below_model, a rank never holds the whole model; with same_gathers, no
 * more is gathered at once than without checkpointing. */
static void check(setup s, const char *what, bool below_model, bool same_gathers) {
    shared *plain = map_shared(), *ck = map_shared();
    s.ckpt = false;
    setup c = s;
    c.ckpt = true;
    if (run(plain, s, what) && run(ck, c, what)) {
        CHECK_MSG(ck->nckpt == 8, "%d blocks checkpointed, 8 expected", ck->nckpt);
        int64_t first = -1;
        for (int64_t i = 0; i < plain->numel && first < 0; i++)
            if (memcmp(&ck->result[i], &plain->result[i], sizeof(float))) first = i;
        CHECK_MSG(first < 0,
                  "%s on %d ranks (%s): parameter %lld is %.9g checkpointed, %.9g without "
                  "(bitwise expected)",
                  fg_strategy_kind_name(s.kind), s.world, what, (long long)first,
                  first < 0 ? 0 : ck->result[first], first < 0 ? 0 : plain->result[first]);
        for (int r = 0; r < s.world; r++) {
            CHECK_MSG(ck->arena_peak[r] < plain->arena_peak[r],
                      "%s rank %d: step-arena peak %zu B checkpointed, %zu B without", what, r,
                      ck->arena_peak[r], plain->arena_peak[r]);
            CHECK_MSG(!below_model || ck->peak_gathered[r] + ck->shard[r] < plain->numel,
                      "%s rank %d: gathered %lld elements beside a shard of %lld of %lld", what, r,
                      (long long)ck->peak_gathered[r], (long long)ck->shard[r],
                      (long long)plain->numel);
            if (same_gathers)
                CHECK_MSG(ck->peak_gathered[r] <= plain->peak_gathered[r],
                          "%s rank %d: at most %lld elements gathered at once checkpointed, %lld "
                          "without",
                          what, r, (long long)ck->peak_gathered[r],
                          (long long)plain->peak_gathered[r]);
        }
        if (s.world == 2)
            printf("  %s (%s): step-arena peak %zu B checkpointed, %zu B without (%.2fx); most "
                   "gathered at once %lld / %lld elements\n",
                   what, fg_strategy_kind_name(s.kind), ck->arena_peak[0], plain->arena_peak[0],
                   (double)ck->arena_peak[0] / (double)plain->arena_peak[0],
                   (long long)ck->peak_gathered[0], (long long)plain->peak_gathered[0]);
    }
    munmap(plain, sizeof *plain);
    munmap(ck, sizeof *ck);
}

TEST(stage3_units_per_block) {
    check((setup){.world = 2, .kind = FG_STRATEGY_DEEPSPEED_STAGE_3}, "blocks", true, true);
    check((setup){.world = 3, .kind = FG_STRATEGY_DEEPSPEED_STAGE_3}, "blocks3", true, true);
}

TEST(full_shard_units_per_block) {
    check((setup){.world = 2, .kind = FG_STRATEGY_FSDP, .sharding = FG_SHARDING_FULL_SHARD},
          "blocks", true, true);
}

TEST(hybrid_shard_units_per_block) {
    /* one shard group of 2, and groups of one rank (replicas) */
    check((setup){.world = 2,
                  .kind = FG_STRATEGY_FSDP,
                  .sharding = FG_SHARDING_HYBRID_SHARD,
                  .hybrid = 2},
          "hybrid2", true, true);
    check((setup){.world = 2,
                  .kind = FG_STRATEGY_FSDP,
                  .sharding = FG_SHARDING_HYBRID_SHARD,
                  .hybrid = 1},
          "hybrid1", false, true);
}

TEST(units_inside_the_checkpoint) {
    /* min_num_params 3000: attn.c_attn (3168), mlp.c_fc (4224) and
     * mlp.c_proj (4128) of each block are units; the checkpointed block
     * gathers them again while it recomputes */
    check((setup){.world = 2, .kind = FG_STRATEGY_DEEPSPEED_STAGE_3, .min_params = 3000}, "inner",
          true, false);
    check((setup){.world = 2,
                  .kind = FG_STRATEGY_FSDP,
                  .sharding = FG_SHARDING_FULL_SHARD,
                  .min_params = 3000},
          "inner", true, false);
}

TEST(root_unit_only) {
    /* no module holds 10^6 parameters: the root's unit, gathered through
     * forward and backward */
    check((setup){.world = 2, .kind = FG_STRATEGY_DEEPSPEED_STAGE_3, .min_params = 1000000}, "root",
          false, true);
}

TEST(pieces_and_accumulation) {
    check((setup){.world = 2,
                  .kind = FG_STRATEGY_DEEPSPEED_STAGE_3,
                  .accum = 2,
                  .reduce = 3000,
                  .gather = 1000},
          "pieces", true, true);
}
