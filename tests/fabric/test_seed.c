/* fabric: seed_everything really seeds. After it (or cfg.seed), a model
 * built with seed 0 is initialised from the fabric's seed, a loader made
 * with seed 0 shuffles by it (the distributed sampler splits that one order
 * between ranks) and its worker seeds derive from it per rank; each rank's
 * Dropout modules get their own stream. The same seed gives the same
 * weights and batch order; another seed gives others. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fulgur/fabric.h"
#include "harness.h"

#define N 64 /* samples */
#define B 8  /* batch */
#define IN 5 /* model input */

static void clean_env(void) {
    fg_launch_unexport();
    unsetenv("TORCHELASTIC_RUN_ID");
    setenv("FULGUR_CPU_DEVICES", "4", 1);
    setenv("FULGUR_NUM_THREADS", "1", 1);
    fg_set_default_seed(0);
}

/* sample i: x = i, y = i; records the worker seed the loader gives get() */
static _Thread_local uint64_t g_worker_seed;
static fg_status sample(void *ud, int64_t i, void *x, void *y) {
    (void)ud;
    *(int32_t *)x = (int32_t)i;
    *(int32_t *)y = (int32_t)i;
    const fg_worker_info *w = fg_data_worker_info();
    if (w) g_worker_seed = w->seed;
    return FG_OK;
}
static int64_t length(void *ud) {
    (void)ud;
    return N;
}
static void spec(void *ud, fg_sample_spec *x, fg_sample_spec *y) {
    (void)ud;
    *x = (fg_sample_spec){.dtype = FG_I32, .ndim = 0};
    *y = (fg_sample_spec){.dtype = FG_I32, .ndim = 0};
}

/* What one rank saw: its model's first weights, its first epoch's order,
 * its worker seed and its Dropout module's seed. */
typedef struct seen {
    float w[16];
    int64_t order[N];
    int64_t n;
    uint64_t worker_seed, dropout_seed;
    int rank, world;
} seen;

static void observe(fg_fabric *f, seen *out) {
    memset(out, 0, sizeof *out);
    fg_module *m = fg_mlp_new(&(fg_mlp_config){.sizes = {IN, 8, 2}, .dropout = 0.5});
    fg_optimizer *o = fg_sgd_new(m, &(fg_sgd_opts){.lr = 0.1});
    fg_dataset *ds = fg_dataset_new(&(fg_dataset_ops){length, spec, sample, NULL}, NULL, "ids");
    fg_dataloader *dl = fg_dataloader_new(ds, &(fg_loader_opts){.batch = B, .shuffle = true});
    if (!m || !o || !ds || !dl || fg_fabric_setup(f, m, o) != FG_OK ||
        !fg_fabric_setup_dataloader(f, dl, true)) {
        fprintf(stderr, "observe: %s\n", fg_last_error());
        return;
    }
    memcpy(out->w, fg_tensor_data(fg_module_flat_params(m)), sizeof out->w);
    for (fg_batch *b; (b = fg_dataloader_next(dl)) != NULL;)
        for (int64_t i = 0; i < b->size && out->n < N; i++) out->order[out->n++] = b->indices[i];
    out->worker_seed = g_worker_seed;
    /* the MLP is Sequential: 0 Linear, 1 ReLU, 2 Dropout, 3 Linear */
    CHECK_OK(fg_dropout_get_state(fg_module_child(m, "2"), &out->dropout_seed, NULL));
    out->rank = fg_fabric_global_rank(f);
    out->world = fg_fabric_world_size(f);
    fg_dataloader_free(dl);
    fg_dataset_free(ds);
    fg_optimizer_free(o);
    fg_module_free(m);
}

static seen g_one;
static int observe_run(fg_fabric *f, void *arg) {
    (void)arg;
    observe(f, &g_one);
    return 0;
}

/* One process, seeded by cfg.seed (0: not seeded). */
static seen run_single(uint64_t seed) {
    fg_set_default_seed(0);
    fg_fabric *f = fg_fabric_new(&(fg_fabric_config){.seed = seed});
    CHECK(f && fg_fabric_launch(f, observe_run, NULL) == 0);
    if (f) CHECK(fg_fabric_seed(f) == seed);
    fg_fabric_free(f);
    seen s = g_one;
    fg_set_default_seed(0);
    return s;
}

/* What a model and a loader made with an explicit seed give. */
static void explicit(uint64_t seed, float *w, int64_t *order) {
    fg_module *m = fg_mlp_new(&(fg_mlp_config){.sizes = {IN, 8, 2}, .dropout = 0.5, .seed = seed});
    memcpy(w, fg_tensor_data(fg_module_flat_params(m)), 16 * sizeof(float));
    fg_module_free(m);
    fg_sampler *s = fg_sampler_random(N, seed);
    CHECK_OK(fg_sampler_indices(s, 0, order));
    fg_sampler_free(s);
}

TEST(seed_reaches_model_and_loader) {
    clean_env();
    float w[16];
    int64_t order[N];
    seen a = run_single(5), again = run_single(5), other = run_single(6), none = run_single(0);
    explicit(5, w, order);
    CHECK(memcmp(a.w, w, sizeof w) == 0);                         /* init from the fabric's seed */
    CHECK(a.n == N && memcmp(a.order, order, sizeof order) == 0); /* shuffled by it */
    CHECK(a.worker_seed == fg_rng_derive(fg_rng_derive(5, 0), 0));
    CHECK(a.dropout_seed != 0);
    /* the same seed: the same run */
    CHECK(memcmp(a.w, again.w, sizeof w) == 0);
    CHECK(memcmp(a.order, again.order, sizeof order) == 0);
    CHECK(a.worker_seed == again.worker_seed && a.dropout_seed == again.dropout_seed);
    /* another seed: other weights, another order, other streams */
    CHECK(memcmp(a.w, other.w, sizeof w) != 0);
    CHECK(memcmp(a.order, other.order, sizeof order) != 0);
    CHECK(a.worker_seed != other.worker_seed && a.dropout_seed != other.dropout_seed);
    /* not seeded: seed 0, as before */
    explicit(0, w, order);
    CHECK(memcmp(none.w, w, sizeof w) == 0);
    CHECK(memcmp(none.order, order, sizeof order) == 0);
    /* seed_everything itself, and what it leaves behind */
    fg_fabric *f = fg_fabric_new(NULL);
    CHECK(f && fg_fabric_seed(f) == 0 && fg_default_seed() == 0);
    fg_fabric_seed_everything(f, 42);
    CHECK(fg_fabric_seed(f) == 42 && fg_default_seed() == 42);
    CHECK(fg_fabric_rank_seed(f) == fg_rng_derive(42, 1));
    fg_fabric_free(f);
    fg_set_default_seed(0);
}

/* ddp_spawn on 2 ranks, seed 5: every rank starts from the same weights,
 * takes its share of one shuffled order, and has its own worker and
 * dropout streams. */
static int rank_run(fg_fabric *f, void *arg) {
    (void)arg;
    seen s;
    observe(f, &s);
    if (s.rank < 0 || s.rank > 1 || s.world != 2) return 1;
    /* the parent reads it back from a file: forked ranks share no memory */
    char path[512];
    snprintf(path, sizeof path, "%s/seen.%d", getenv("FG_TEST_DIR"), s.rank);
    FILE *fp = fopen(path, "wb");
    if (!fp) return 1;
    fwrite(&s, sizeof s, 1, fp);
    fclose(fp);
    return 0;
}

static bool read_seen(int r, seen *s) {
    char path[512];
    snprintf(path, sizeof path, "%s/seen.%d", getenv("FG_TEST_DIR"), r);
    FILE *fp = fopen(path, "rb");
    if (!fp) return false;
    bool ok = fread(s, sizeof *s, 1, fp) == 1;
    fclose(fp);
    return ok;
}

static void run_ranks(uint64_t seed, seen out[2]) {
    fg_fabric *f =
        fg_fabric_new(&(fg_fabric_config){.devices = "2", .strategy = "ddp_spawn", .seed = seed});
    CHECK(f && fg_fabric_launch(f, rank_run, NULL) == 0);
    fg_fabric_free(f);
    fg_set_default_seed(0);
    for (int r = 0; r < 2; r++) CHECK(read_seen(r, &out[r]));
}

TEST(seed_per_rank) {
    clean_env();
    char dir[] = "/tmp/fg-test-seed.XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    setenv("FG_TEST_DIR", dir, 1);
    seen s[2], again[2], other[2];
    run_ranks(5, s);
    run_ranks(5, again);
    run_ranks(6, other);
    float w[16];
    int64_t order[N];
    explicit(5, w, order);
    for (int r = 0; r < 2; r++) {
        CHECK(s[r].rank == r);
        CHECK(memcmp(s[r].w, w, sizeof w) == 0); /* every rank: the fabric's seed */
        /* rank r takes r, r + 2, ... of the one order */
        fg_sampler *d =
            fg_sampler_distributed(N, r, 2, &(fg_distributed_opts){.shuffle = true, .seed = 5});
        int64_t mine[N];
        CHECK_OK(fg_sampler_indices(d, 0, mine));
        CHECK(s[r].n == N / 2 && memcmp(s[r].order, mine, sizeof(int64_t) * N / 2) == 0);
        for (int64_t i = 0; i < N / 2; i++) CHECK(s[r].order[i] == order[2 * i + r]);
        fg_sampler_free(d);
        CHECK(s[r].worker_seed == fg_rng_derive(fg_rng_derive(5, (uint64_t)r), 0));
        /* the same seed, the same ranks */
        CHECK(memcmp(&s[r], &again[r], sizeof s[r]) == 0);
        /* another seed, other everything */
        CHECK(memcmp(s[r].w, other[r].w, sizeof w) != 0);
        CHECK(memcmp(s[r].order, other[r].order, sizeof(int64_t) * N / 2) != 0);
        CHECK(s[r].worker_seed != other[r].worker_seed);
        CHECK(s[r].dropout_seed != other[r].dropout_seed);
    }
    /* streams that must differ between ranks do */
    CHECK(s[0].worker_seed != s[1].worker_seed);
    CHECK(s[0].dropout_seed != s[1].dropout_seed);
    /* a single process with the same seed has rank 0's dropout stream */
    seen one = run_single(5);
    CHECK(one.dropout_seed == s[0].dropout_seed);
    unsetenv("FG_TEST_DIR");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}
