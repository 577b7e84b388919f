/* The sharded strategies of stages 1 and 2 beyond their equivalences with
 * ddp (those are rows of tests/strategy/test_equivalence.c): fsdp with
 * NO_SHARD is ddp, the shard ranges, the errors, and freeing optimizer and
 * strategy in either order. Ranks are forked processes on the shm backend. */
#include <math.h>
#include <stdio.h>
#include <sys/mman.h>

#include "fulgur/strategy.h"
#include "harness.h"
#include "mp/mp_join.h"
#include "optim/optim_impl.h"

#define STEPS 8

typedef struct setup {
    bool gpt;   /* else the MLP */
    bool adamw; /* else SGD with momentum */
    int other;  /* 1-4: Adam (L2, AMSGrad), RMSprop (centred, momentum), Adagrad, Lion;
                   5: Adam in two groups with no decay on biases and norms */
    int world;
    int64_t B;      /* per-rank batch */
    int accum;      /* micro-batches per step (no sync before the last) */
    double clip;    /* max_norm; 0 = off */
    int64_t reduce; /* reduce_bucket_size (elements) */
    int64_t gather; /* allgather_bucket_size (elements) */
    fg_strategy_kind kind;
    fg_sharding_strategy sharding; /* fsdp */
} setup;

typedef struct shared {
    setup s;
    char job[64];
    int64_t n;
    float result[1 << 16];  /* rank 0's final parameters */
    int64_t state_numel[8]; /* per rank: elements of each optimizer state tensor */
    int64_t range[8][2];    /* per rank: its optimizer state range */
    double max_norm_seen;   /* rank 0: the largest norm before clipping */
} shared;

static fg_module *make_model(const setup *s) {
    if (s->gpt)
        return fg_gpt_new(&(fg_gpt_config){
            .vocab = 17, .ctx = 8, .layers = 2, .heads = 2, .embd = 16, .seed = 5});
    return fg_mlp_new(&(fg_mlp_config){.sizes = {12, 32, 32, 5}, .nlayers = 3, .seed = 5});
}

static fg_optimizer *make_opt(const setup *s, fg_module *m) {
    switch (s->other) {
    case 1:
        return fg_adam_new(m, &(fg_adam_opts){.lr = 1e-2, .weight_decay = 0.05, .amsgrad = true});
    case 2:
        return fg_rmsprop_new(
            m, &(fg_rmsprop_opts){
                   .lr = 1e-3, .momentum = 0.5, .weight_decay = 1e-3, .centered = true});
    case 3:
        return fg_adagrad_new(
            m, &(fg_adagrad_opts){.lr = 0.05, .lr_decay = 0.01, .initial_accumulator_value = 0.1});
    case 4: return fg_lion_new(m, &(fg_lion_opts){.lr = 1e-3, .weight_decay = 0.1});
    case 5: {
        fg_optimizer *o = fg_adam_new(m, &(fg_adam_opts){.lr = 1e-2, .weight_decay = 0.05});
        if (o &&
            (fg_optimizer_add_param_group(
                 o, &(fg_param_group){.params = "*.1.*", .lr = 3e-2, .weight_decay = 0.2}) < 0 ||
             fg_optimizer_no_decay_bias_norm_embedding(o, NULL) != FG_OK)) {
            fg_optimizer_free(o);
            return NULL;
        }
        return o;
    }
    default: break;
    }
    if (s->adamw) return fg_adamw_new(m, &(fg_adamw_opts){.lr = 1e-2, .weight_decay = 0.1});
    return fg_sgd_new(m, &(fg_sgd_opts){.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3});
}

/* Rows [r0, r0+n) of step `step`'s global batch: deterministic data. */
static void batch_rows(const setup *s, int step, int64_t r0, int64_t n, fg_tensor **x,
                       fg_tensor **y) {
    if (s->gpt) {
        int64_t sh[2] = {n, 8};
        *x = fg_empty(FG_I32, 2, sh);
        *y = fg_empty(FG_I32, 2, sh);
        for (int64_t i = 0; i < n * 8; i++) {
            uint64_t k = (uint64_t)step * 1000003u + (uint64_t)(r0 * 8 + i);
            ((int32_t *)fg_tensor_data(*x))[i] = (int32_t)(fg_rng_u32_at(11, k) % 17);
            ((int32_t *)fg_tensor_data(*y))[i] = (int32_t)(fg_rng_u32_at(12, k) % 17);
        }
    } else {
        int64_t sx[2] = {n, 12}, sy[1] = {n};
        *x = fg_empty(FG_F32, 2, sx);
        *y = fg_empty(FG_I32, 1, sy);
        fg_rng_fill_normal(13, (uint64_t)step * 100000u + (uint64_t)r0 * 12, fg_tensor_data(*x),
                           n * 12, 0, 1);
        for (int64_t i = 0; i < n; i++)
            ((int32_t *)fg_tensor_data(*y))[i] =
                (int32_t)(fg_rng_u32_at(14, (uint64_t)step * 1000u + (uint64_t)(r0 + i)) % 5);
    }
}

static int train_rank(int rank, int n, void *arg) {
    shared *sh = arg;
    const setup *s = &sh->s;
    fg_comm *c = mp_join_shm(rank, n, sh->job, 60);
    if (!c) return 1;
    CHECK_OK(fg_set_num_threads(1));
    fg_module *m = make_model(s);
    /* other initial weights on ranks 1..: setup must broadcast rank 0's */
    if (rank) CHECK_OK(fg_tensor_fill(fg_module_flat_params(m), 0.25 * rank));
    fg_optimizer *o = make_opt(s, m);
    fg_sharded_opts so = {.reduce_bucket_size = s->reduce,
                          .allgather_bucket_size = s->gather,
                          .sharding_strategy = s->sharding};
    fg_strategy *st = fg_strategy_new(s->kind, c, m, o, NULL, &so, 0);
    if (!st) {
        fprintf(stderr, "rank %d: %s\n", rank, fg_last_error());
        return 1;
    }
    int accum = s->accum ? s->accum : 1;
    int64_t micro = s->B / accum;
    int bad = 0;
    for (int step = 0; step < STEPS && !bad; step++) {
        fg_optimizer_zero_grad(o);
        for (int k = 0; k < accum && !bad; k++) {
            fg_tensor *x, *y;
            batch_rows(s, step, rank * s->B + k * micro, micro, &x, &y);
            fg_tensor *l = fg_cross_entropy(fg_module_forward(m, x), y, -100);
            if (accum > 1) l = fg_scale(l, 1.0 / accum);
            fg_strategy_set_sync(st, k == accum - 1);
            bad |= fg_strategy_backward(st, l) != FG_OK;
        }
        double norm = 0;
        if (!bad && s->clip > 0) bad |= fg_strategy_clip_grad_norm(st, s->clip, &norm) != FG_OK;
        if (rank == 0 && norm > sh->max_norm_seen) sh->max_norm_seen = norm;
        if (!bad) bad |= fg_optimizer_step(o) != FG_OK;
        if (bad) fprintf(stderr, "rank %d step %d: %s\n", rank, step, fg_last_error());
        fg_step_reset();
    }
    fg_tensor *flat = fg_module_flat_params(m);
    int64_t cnt = fg_tensor_numel(flat);
    if (rank == 0) memcpy(sh->result, fg_tensor_data(flat), sizeof(float) * (size_t)cnt);
    sh->state_numel[rank] =
        fg_optimizer_num_states(o) ? fg_tensor_numel(fg_optimizer_state(o, 0)) : -1;
    fg_optimizer_state_range(o, &sh->range[rank][0], &sh->range[rank][1]);
    /* every rank ends with rank 0's parameters */
    bad |= mp_differs_from_rank0(c, rank, fg_tensor_data(flat), cnt);
    fg_strategy_free(st);
    fg_optimizer_free(o);
    fg_module_free(m);
    fg_comm_free(c);
    return bad;
}

/* Runs s on s.world forked ranks; sh (shared) holds the results. */
static bool run(shared *sh, setup s, const char *what) {
    memset(sh, 0, sizeof *sh);
    sh->s = s;
    snprintf(sh->job, sizeof sh->job, "t-zero-%d-%s-%d-%d", getpid(), what, (int)s.kind, s.world);
    int failed = fg_test_fork_ranks(s.world, train_rank, sh, 120);
    CHECK_MSG(failed == 0, "%s (%s, %d ranks): %d ranks failed", what,
              fg_strategy_kind_name(s.kind), s.world, failed);
    return failed == 0;
}

static shared *map_shared(void) {
    return mmap(NULL, sizeof(shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
}

static int64_t model_numel(const setup *s) {
    fg_module *m = make_model(s);
    int64_t n = fg_module_numel(m);
    fg_module_free(m);
    return n;
}

TEST(fsdp_no_shard_is_ddp) {
    shared *ref = map_shared(), *sh = map_shared();
    setup s = {.gpt = true, .adamw = true, .world = 2, .B = 2, .kind = FG_STRATEGY_DDP};
    int64_t numel = model_numel(&s);
    if (run(ref, s, "noshard")) {
        s.kind = FG_STRATEGY_FSDP;
        s.sharding = FG_SHARDING_NO_SHARD;
        if (run(sh, s, "noshard")) {
            CHECK(!memcmp(sh->result, ref->result, sizeof(float) * (size_t)numel));
            CHECK(sh->state_numel[0] == numel && sh->state_numel[1] == numel);
        }
    }
    munmap(ref, sizeof *ref);
    munmap(sh, sizeof *sh);
}

/* ------------------------------------------------------------ one process */

static int ranges_rank(int rank, int n, void *arg) {
    fg_comm *c = mp_join_shm(rank, n, arg, 60);
    if (!c) return 1;
    int bad = 0;
    /* 8 elements over 3 ranks: one 64-byte line, all on the last rank; the
     * others hold none */
    fg_module *tiny = fg_linear_new(3, 2, true, FG_F32);
    CHECK_OK(fg_module_finalize(tiny));
    fg_optimizer *o = fg_adamw_new(tiny, NULL);
    fg_strategy *st = fg_strategy_new(FG_STRATEGY_DEEPSPEED_STAGE_2, c, tiny, o, NULL, NULL, 0);
    if (!st) return 1;
    int64_t b, e;
    for (int r = 0; r < n; r++) {
        bad |= fg_strategy_shard_range(st, r, &b, &e) != FG_OK;
        bad |= b != 0 || e != (r == n - 1 ? 8 : 0);
    }
    bad |= fg_strategy_shard_range(st, n, &b, &e) != FG_EINVAL;
    bad |= !fg_strategy_is_sharded(st);
    /* a step with an empty shard on some ranks still gathers */
    int64_t sx[2] = {4, 3};
    fg_tensor *x = fg_full(FG_F32, 2, sx, 0.5 + rank);
    bad |= fg_strategy_backward(st, fg_sum(fg_module_forward(tiny, x))) != FG_OK;
    bad |= fg_optimizer_step(o) != FG_OK;
    fg_step_reset();
    /* the optimizer freed first: the strategy forgets it */
    fg_optimizer_free(o);
    fg_strategy_free(st);
    /* a 2-rank cut of the GPT: line-aligned bounds */
    setup gs = {.gpt = true};
    fg_module *m = make_model(&gs);
    o = fg_sgd_new(m, &(fg_sgd_opts){.momentum = 0.5});
    st = fg_strategy_new(FG_STRATEGY_DEEPSPEED_STAGE_1, c, m, o, NULL, NULL, 0);
    if (!st) return 1;
    int64_t prev = 0, numel = fg_module_numel(m);
    for (int r = 0; r < n; r++) {
        bad |= fg_strategy_shard_range(st, r, &b, &e) != FG_OK;
        bad |= b != prev || (e % 16 && e != numel);
        prev = e;
    }
    bad |= prev != numel;
    /* the strategy freed first: the optimizer steps its shard alone, no gather */
    fg_optimizer_state_range(o, &b, &e);
    fg_strategy_free(st);
    bad |= fg_optimizer_step(o) != FG_OK;
    int64_t b2, e2;
    fg_optimizer_state_range(o, &b2, &e2);
    bad |= b2 != b || e2 != e;
    fg_optimizer_free(o);
    fg_module_free(m);
    fg_module_free(tiny);
    fg_comm_free(c);
    if (bad) fprintf(stderr, "rank %d: %s\n", rank, fg_last_error());
    return bad;
}

TEST(shard_ranges_and_lifetimes) {
    char job[64];
    snprintf(job, sizeof job, "t-zero-ranges-%d", getpid());
    CHECK(fg_test_fork_ranks(3, ranges_rank, job, 60) == 0);
}

TEST(sharded_errors) {
    setup s = {.gpt = false};
    fg_module *m = make_model(&s), *other = make_model(&s);
    fg_optimizer *o = make_opt(&s, other);
    fg_sharded_opts fsdp_full = {.sharding_strategy = FG_SHARDING_FULL_SHARD};
    /* no communicator */
    CHECK(!fg_strategy_new(FG_STRATEGY_DEEPSPEED_STAGE_1, NULL, m, o, NULL, NULL, 0));
    CHECK(fg_last_status() == FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "deepspeed_stage_1: needs a communicator");
    /* checks made before anything is set up */
    CHECK_OK(fg_strategy_check_sharded(FG_STRATEGY_FSDP, &fsdp_full));
    CHECK_OK(fg_strategy_check_sharded(FG_STRATEGY_FSDP, NULL));
    CHECK_STATUS(fg_strategy_check_sharded(FG_STRATEGY_DEEPSPEED_STAGE_3,
                                           &(fg_sharded_opts){.min_num_params = -1}),
                 FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "min_num_params = -1");
    CHECK_STATUS(
        fg_strategy_check_sharded(FG_STRATEGY_FSDP, &(fg_sharded_opts){.sharding_strategy = 9}),
        FG_EINVAL);
    CHECK_STATUS(fg_strategy_check_sharded(FG_STRATEGY_DEEPSPEED_STAGE_2,
                                           &(fg_sharded_opts){.allgather_bucket_size = -5}),
                 FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "allgather_bucket_size = -5");
    CHECK_OK(fg_strategy_check_sharded(FG_STRATEGY_DEEPSPEED_STAGE_2, NULL));
    CHECK_OK(fg_strategy_check_sharded(FG_STRATEGY_DDP, &fsdp_full)); /* not fsdp: ignored */
    /* names */
    fg_sharding_strategy ss;
    CHECK_OK(fg_sharding_strategy_parse("shard_grad_op", &ss));
    CHECK(ss == FG_SHARDING_SHARD_GRAD_OP);
    CHECK(!strcmp(fg_sharding_strategy_name(FG_SHARDING_NO_SHARD), "NO_SHARD"));
    CHECK(!strcmp(fg_sharding_strategy_name((fg_sharding_strategy)7), "?"));
    CHECK_STATUS(fg_sharding_strategy_parse("ZERO2", &ss), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "sharding_strategy=\"ZERO2\": expected one of FULL_SHARD");
    CHECK(fg_strategy_kind_is_ddp(FG_STRATEGY_FSDP) &&
          fg_strategy_kind_is_sharded(FG_STRATEGY_FSDP));
    CHECK(!fg_strategy_kind_is_sharded(FG_STRATEGY_DDP));
    fg_optimizer_free(o);
    fg_module_free(m);
    fg_module_free(other);
}

/* a sharded strategy needs the optimizer over the model it is given */
static int needs_opt_rank(int rank, int n, void *arg) {
    fg_comm *c = mp_join_shm(rank, n, arg, 60);
    if (!c) return 1;
    setup s = {.gpt = false};
    fg_module *m = make_model(&s), *other = make_model(&s);
    fg_optimizer *o = make_opt(&s, other);
    int bad = 0;
    bad |= fg_strategy_new(FG_STRATEGY_DEEPSPEED_STAGE_2, c, m, NULL, NULL, NULL, 0) != NULL;
    bad |= fg_last_status() != FG_EINVAL || !strstr(fg_last_error(), "got none");
    bad |= fg_strategy_new(FG_STRATEGY_DEEPSPEED_STAGE_2, c, m, o, NULL, NULL, 0) != NULL;
    bad |= !strstr(fg_last_error(), "one over another module");
    int64_t b, e;
    fg_optimizer_state_range(o, &b, &e); /* untouched by the failed setups */
    bad |= b != 0 || e != fg_module_numel(other);
    fg_optimizer_free(o);
    fg_module_free(m);
    fg_module_free(other);
    fg_comm_free(c);
    return bad;
}

TEST(sharded_needs_its_optimizer) {
    char job[64];
    snprintf(job, sizeof job, "t-zero-opt-%d", getpid());
    CHECK(fg_test_fork_ranks(2, needs_opt_rank, job, 60) == 0);
}
