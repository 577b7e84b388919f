/* horovod: N ranks (forked, shm) give the parameters of one process with
 * batch N*B (20 SGD steps on an MLP, within 1e-5 relative; fp16 compression
 * within 1e-3), the same bits on every rank, from rank 0's initial weights:
 * with the default fusion buffer (64 MiB: one allreduce a cycle), a buffer
 * of 600 bytes (many per cycle), no fusion, a 0.05 ms cycle, and
 * backward_passes_per_step 2; every gradient element is sent exactly once a
 * step (the bytes counted: 4 each, 2 under fp16). The runs are rows of the
 * equivalence engine (tests/strategy/equiv.h). */
#include <stdio.h>
#include <stdlib.h>

#include "strategy/equiv.h"
#include "strategy/strategy_impl.h"

#define STEPS 20

/* the fusion buffer's allreduces and the bytes sent, per rank */
static void hvd_counts(const eq_case *c, int rank, fg_strategy *st, fg_module *m, fg_optimizer *o,
                       eq_result *r) {
    (void)c, (void)m, (void)o;
    r->extra[rank][0] = fg__horovod_allreduces(st);
    r->extra[rank][1] = (int64_t)fg__horovod_bytes_sent(st);
}

/* every element once a step (4 bytes, 2 under fp16), the same allreduces on
 * every rank, at least c->expect of them */
static void hvd_check(const eq_case *c, const eq_result *got, const eq_result *ref) {
    (void)ref;
    int64_t want =
        got->numel * STEPS * (c->ddp.horovod.compression == FG_HOROVOD_COMPRESSION_FP16 ? 2 : 4);
    printf("  %s, %d ranks: %lld allreduces of the fusion buffer, %lld bytes sent (want %lld)\n",
           c->name, c->world, (long long)got->extra[0][0], (long long)got->extra[0][1],
           (long long)want);
    for (int r = 0; r < c->world; r++) {
        CHECK_MSG(got->extra[r][1] == want, "%s rank %d sent %lld bytes, want %lld", c->name, r,
                  (long long)got->extra[r][1], (long long)want);
        CHECK(got->extra[r][0] == got->extra[0][0]);
    }
    CHECK_MSG(got->extra[0][0] >= c->expect, "%s: %lld allreduces, want >= %lld", c->name,
              (long long)got->extra[0][0], (long long)c->expect);
}

static const eq_hooks k_hvd = {.rank_done = hvd_counts, .check = hvd_check};

/* Horovod's way to turn fusion off */
static void no_fusion_env(const eq_case *c, int rank) {
    (void)c, (void)rank;
    setenv("HOROVOD_FUSION_THRESHOLD", "0", 1);
}

static const eq_hooks k_hvd_env = {
    .rank_setup = no_fusion_env, .rank_done = hvd_counts, .check = hvd_check};

/* a row: name, ranks, rows per rank, tolerance, the fewest allreduces */
#define HVD(nm, w, b, tol_, expect_, hooks_, ...)                                                  \
    {                                                                                              \
        .name = "horovod " nm, .kind = FG_STRATEGY_HOROVOD, .world = w, .batch = b,                \
        .steps = STEPS, .ref = EQ_VS_SINGLE, .tol = tol_, .expect = expect_, .hooks = hooks_,      \
        __VA_ARGS__                                                                                \
    }

static const eq_case k_default[] = {
    HVD("default fusion", 2, 8, 1e-5, STEPS, &k_hvd),
    HVD("default fusion", 4, 4, 1e-5, STEPS, &k_hvd),
};

static const eq_case k_fusion[] = {
    /* 600 bytes: the 32x32 weights (4 KiB) go alone, the biases together */
    HVD("600-byte buffer", 2, 8, 1e-5, 3 * STEPS, &k_hvd,
        .ddp = {.horovod = {.fusion_threshold = 600}}),
    /* no fusion: one allreduce per gradient, 6 parameters */
    HVD("no fusion", 2, 8, 1e-5, 6 * STEPS, &k_hvd, .ddp = {.horovod = {.fusion_threshold = -1}}),
    HVD("0.05 ms cycle", 3, 6, 1e-5, STEPS, &k_hvd, .ddp = {.horovod = {.cycle_time_ms = 0.05}}),
};

static const eq_case k_passes_fp16[] = {
    HVD("2 backward passes a step", 2, 8, 1e-5, STEPS, &k_hvd,
        .ddp = {.horovod = {.backward_passes_per_step = 2}}, .accum = 2),
    HVD("fp16 compression", 2, 8, 1e-3, STEPS, &k_hvd,
        .ddp = {.horovod = {.compression = FG_HOROVOD_COMPRESSION_FP16}}),
};

static const eq_case k_env[] = {
    HVD("HOROVOD_FUSION_THRESHOLD=0", 2, 8, 1e-5, 6 * STEPS, &k_hvd_env),
};

#define RUN(table) eq_run_table(table, sizeof table / sizeof table[0], getenv("FULGUR_EQ_CASE"))

TEST(horovod_equals_one_process_with_the_global_batch) { RUN(k_default); }

TEST(horovod_small_fusion_buffer_no_fusion_short_cycle) { RUN(k_fusion); }

TEST(horovod_backward_passes_per_step_and_fp16) { RUN(k_passes_fp16); }

TEST(horovod_env_and_bad_options) {
    RUN(k_env);
    fg_module *m = fx_tiny_mlp(5);
    CHECK(fg_strategy_new(FG_STRATEGY_HOROVOD, NULL, m, NULL, NULL, NULL, 0) == NULL);
    CHECK(fg_last_status() == FG_EINVAL); /* needs a communicator, as ddp */
    fg_cluster_info one = {.world_size = 1, .local_world_size = 1, .num_nodes = 1};
    fg_comm *c = fg_comm_new(&one, &(fg_comm_opts){.backend = FG_COMM_SHM});
    CHECK(c != NULL);
    setenv("HOROVOD_CYCLE_TIME", "-1", 1);
    CHECK(fg_strategy_new(FG_STRATEGY_HOROVOD, c, m, NULL, NULL, NULL, 0) == NULL);
    CHECK_CONTAINS(fg_last_error(), "HOROVOD_CYCLE_TIME=\"-1\"");
    unsetenv("HOROVOD_CYCLE_TIME");
    fg_ddp_opts d = {.horovod = {.compression = (fg_horovod_compression)7}};
    CHECK(fg_strategy_new(FG_STRATEGY_HOROVOD, c, m, NULL, &d, NULL, 0) == NULL);
    CHECK_CONTAINS(fg_last_error(), "compression 7");
    d = (fg_ddp_opts){.comm_hook = FG_DDP_HOOK_FP16_COMPRESS};
    CHECK(fg_strategy_new(FG_STRATEGY_HOROVOD, c, m, NULL, &d, NULL, 0) == NULL);
    CHECK_CONTAINS(fg_last_error(), "fg_horovod_opts.compression");
    fg_strategy *st = fg_strategy_new(FG_STRATEGY_HOROVOD, c, m, NULL, NULL, NULL, 0);
    CHECK(st != NULL && fg_strategy_kind_of(st) == FG_STRATEGY_HOROVOD);
    CHECK(!strcmp(fg_strategy_kind_name(FG_STRATEGY_HOROVOD), "horovod"));
    fg_strategy_free(st);
    fg_comm_free(c);
    fg_module_free(m);
}
