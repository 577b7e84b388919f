/* Checkpoints under the sharded strategies, through the fabric (ranks are
 * forked processes that a custom cluster environment places): a save under
 * deepspeed_stage_2 on 2 ranks is one whole file (rank 0 gathers the
 * optimizer state); loading it and going on gives bitwise the parameters
 * and optimizer state of the uninterrupted run, under stage 2 and under
 * stage 1; and on 3 ranks the shards are cut again on load: stage 2,
 * stage 1 and fsdp SHARD_GRAD_OP continue bitwise as ddp does from the same
 * file. Under stage 3 (deepspeed_stage_3, fsdp FULL_SHARD: the parameters
 * sharded too) the save gathers the parameter shards on rank 0 into the
 * same whole file and a load reads each rank's range: a stage-3 run resumes
 * bitwise, on 3 ranks as ddp does, and a 3-rank save (and a HYBRID_SHARD
 * save on 2 groups of 2) holds what the ranks held. Clipping goes through fg_fabric_clip_gradients.
 */
#include <math.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "fulgur/fabric.h"
#include "harness.h"

#define STEPS 8
#define SAVE_AT 4
#define MAXN 8192

typedef struct job {
    const char *strategy;
    fg_sharding_strategy sharding;
    int hybrid; /* HYBRID_SHARD's shard group size */
    int world;
    double clip;
    bool save, load; /* save at SAVE_AT; start from the file */
    char path[256], id[96];
    char save_end[256]; /* if set: save there after the last step */
    /* results */
    int64_t n;
    float params[MAXN];   /* rank 0's final parameters */
    float state[2][MAXN]; /* the optimizer state, each rank writing its range */
    int64_t start_step;
} job;

static fg_module *make_model(void) {
    return fg_gpt_new(
        &(fg_gpt_config){.vocab = 17, .ctx = 8, .layers = 2, .heads = 2, .embd = 16, .seed = 5});
}

static void batch_rows(int step, int64_t r0, int64_t n, fg_tensor **x, fg_tensor **y) {
    int64_t sh[2] = {n, 8};
    *x = fg_empty(FG_I32, 2, sh);
    *y = fg_empty(FG_I32, 2, sh);
    for (int64_t i = 0; i < n * 8; i++) {
        uint64_t k = (uint64_t)step * 1000003u + (uint64_t)(r0 * 8 + i);
        ((int32_t *)fg_tensor_data(*x))[i] = (int32_t)(fg_rng_u32_at(11, k) % 17);
        ((int32_t *)fg_tensor_data(*y))[i] = (int32_t)(fg_rng_u32_at(12, k) % 17);
    }
}

static int g_rank; /* this forked process's rank, for the cluster callback */

static fg_status cluster(void *ud, fg_cluster_info *out) {
    const job *j = ud;
    *out = (fg_cluster_info){.rank = g_rank,
                             .world_size = j->world,
                             .local_rank = g_rank,
                             .local_world_size = j->world,
                             .num_nodes = 1,
                             .source = "test"};
    snprintf(out->job_id, sizeof out->job_id, "%s", j->id);
    return FG_OK;
}

static int train(fg_fabric *f, void *arg) {
    job *j = arg;
    int rank = fg_fabric_global_rank(f);
    fg_module *m = make_model();
    fg_optimizer *o = fg_adamw_new(m, &(fg_adamw_opts){.lr = 1e-2, .weight_decay = 0.1});
    int bad = fg_fabric_setup(f, m, o) != FG_OK;
    int start = 0;
    if (!bad && j->load) {
        fg_train_state st = {.model = m, .optimizer = o};
        bad |= fg_fabric_load(f, j->path, &st) != FG_OK;
        start = (int)st.step;
        j->start_step = st.step;
    }
    for (int step = start; step < STEPS && !bad; step++) {
        fg_optimizer_zero_grad(o);
        fg_tensor *x, *y;
        batch_rows(step, rank * 2, 2, &x, &y);
        bad |= fg_fabric_backward(f, fg_cross_entropy(fg_module_forward(m, x), y, -100)) != FG_OK;
        if (!bad && j->clip > 0) bad |= fg_fabric_clip_gradients(f, j->clip, NULL) != FG_OK;
        if (!bad) bad |= fg_optimizer_step(o) != FG_OK;
        fg_fabric_step_end(f);
        if (!bad && j->save && step + 1 == SAVE_AT) {
            fg_train_state st = {.model = m, .optimizer = o, .step = SAVE_AT};
            bad |= fg_fabric_save(f, j->path, &st) != FG_OK;
        }
    }
    if (!bad && j->save_end[0]) {
        fg_train_state st = {.model = m, .optimizer = o, .step = STEPS};
        bad |= fg_fabric_save(f, j->save_end, &st) != FG_OK;
    }
    if (bad) fprintf(stderr, "rank %d (%s): %s\n", rank, j->strategy, fg_last_error());
    /* stage 3: the whole model on every rank to read it */
    fg_strategy *strat = (fg_strategy *)fg_fabric_strategy(f);
    if (!bad && strat && fg_strategy_shards_params(strat))
        bad |= fg_strategy_gather_params(strat) != FG_OK;
    fg_tensor *flat = fg_module_flat_params(m);
    j->n = fg_tensor_numel(flat);
    if (rank == 0) memcpy(j->params, fg_tensor_data(flat), sizeof(float) * (size_t)j->n);
    int64_t b, e;
    fg_optimizer_state_range(o, &b, &e);
    for (int k = 0; k < 2 && rank < j->world; k++)
        memcpy(j->state[k] + b, fg_tensor_data(fg_optimizer_state(o, k)),
               sizeof(float) * (size_t)(e - b));
    fg_optimizer_free(o);
    fg_module_free(m);
    return bad;
}

static int rank_main(int rank, int n, void *arg) {
    (void)n;
    job *j = arg;
    g_rank = rank;
    fg_fabric *f = fg_fabric_new(&(fg_fabric_config){.strategy = j->strategy,
                                                     .threads_per_rank = 1,
                                                     .sharded.sharding_strategy = j->sharding,
                                                     .sharded.reduce_bucket_size = 700,
                                                     .sharded.hybrid_shard_size = j->hybrid,
                                                     .cluster = cluster,
                                                     .cluster_ud = j});
    if (!f) {
        fprintf(stderr, "rank %d: %s\n", rank, fg_last_error());
        return 1;
    }
    int rc = fg_fabric_launch(f, train, j);
    fg_fabric_free(f);
    return rc;
}

static int g_hybrid; /* the next run_job's HYBRID_SHARD group size */

static job *run_job(const char *strategy, fg_sharding_strategy sharding, int world, double clip,
                    bool save, bool load, const char *path, const char *save_end) {
    job *j = mmap(NULL, sizeof *j, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    memset(j, 0, sizeof *j);
    j->strategy = strategy;
    j->sharding = sharding;
    j->hybrid = g_hybrid;
    j->world = world;
    j->clip = clip;
    j->save = save;
    j->load = load;
    snprintf(j->path, sizeof j->path, "%s", path);
    snprintf(j->save_end, sizeof j->save_end, "%s", save_end ? save_end : "");
    static int seq;
    snprintf(j->id, sizeof j->id, "t-fzero-%d-%d", getpid(), seq++);
    int failed = fg_test_fork_ranks(world, rank_main, j, 120);
    CHECK_MSG(failed == 0, "%s on %d ranks: %d ranks failed", strategy, world, failed);
    if (failed) j->n = 0;
    return j;
}

static void check_same(const job *a, const job *b, const char *what) {
    if (!a->n || !b->n) return;
    CHECK(a->n == b->n);
    CHECK_MSG(!memcmp(a->params, b->params, sizeof(float) * (size_t)a->n), "%s: parameters differ",
              what);
    for (int k = 0; k < 2; k++)
        CHECK_MSG(!memcmp(a->state[k], b->state[k], sizeof(float) * (size_t)a->n),
                  "%s: optimizer state %d differs", what, k);
}

static void release(job *j) { munmap(j, sizeof *j); }

/* The file at path holds j's final parameters and optimizer state, bitwise. */
static void check_file(const char *path, const job *j) {
    if (!j->n) return;
    fg_st_file *file = fg_st_open(path);
    CHECK_MSG(file, "%s", fg_last_error());
    if (!file) return;
    fg_module *m = make_model();
    static const char *const prefix[3] = {"", "optimizer.exp_avg.", "optimizer.exp_avg_sq."};
    const float *want[3] = {j->params, j->state[0], j->state[1]};
    int bad = 0;
    float *buf = malloc(sizeof(float) * MAXN);
    for (int k = 0; k < 3; k++)
        for (int64_t i = 0; i < fg_module_num_params(m); i++) {
            char name[256];
            snprintf(name, sizeof name, "%s%s", prefix[k], fg_module_param_name(m, i));
            int64_t e = fg_st_find(file, name), n = fg_tensor_numel(fg_module_param(m, i));
            if (e < 0 || fg_st_read(file, e, buf, FG_F32, n) != FG_OK ||
                memcmp(buf, want[k] + fg_module_param_offset(m, i), sizeof(float) * (size_t)n))
                bad++;
        }
    CHECK_MSG(bad == 0, "%s: %d tensors differ from what the ranks held", path, bad);
    free(buf);
    fg_module_free(m);
    fg_st_close(file);
}

TEST(zero_save_load_continue_bitwise) {
    char dir[] = "/tmp/fg-zero-ckpt-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[256];
    snprintf(path, sizeof path, "%s/step-%d.safetensors", dir, SAVE_AT);
    /* uninterrupted, saving on the way */
    job *u = run_job("deepspeed_stage_2", 0, 2, 0.5, true, false, path, NULL);
    struct stat sb;
    CHECK(stat(path, &sb) == 0);
    /* the same world size: stage 2 and stage 1 go on as the run that saved */
    job *r2 = run_job("deepspeed_stage_2", 0, 2, 0.5, false, true, path, NULL);
    CHECK(r2->start_step == SAVE_AT);
    check_same(u, r2, "stage 2 resumed on 2 ranks vs uninterrupted");
    job *r1 = run_job("deepspeed_stage_1", 0, 2, 0.5, false, true, path, NULL);
    check_same(u, r1, "stage 1 resumed on 2 ranks vs stage 2 uninterrupted");
    /* 3 ranks: the shards are cut again; each sharded strategy goes on as
     * ddp does from the same file */
    job *d3 = run_job("ddp", 0, 3, 0, false, true, path, NULL);
    char end3[256];
    snprintf(end3, sizeof end3, "%s/end3.safetensors", dir);
    job *z3 = run_job("deepspeed_stage_2", 0, 3, 0, false, true, path, end3);
    job *o3 = run_job("deepspeed_stage_1", 0, 3, 0, false, true, path, NULL);
    job *f3 = run_job("fsdp", FG_SHARDING_SHARD_GRAD_OP, 3, 0, false, true, path, NULL);
    check_same(d3, z3, "stage 2 resumed on 3 ranks vs ddp");
    check_same(d3, o3, "stage 1 resumed on 3 ranks vs ddp");
    check_same(d3, f3, "fsdp SHARD_GRAD_OP resumed on 3 ranks vs ddp");
    /* a save on 3 ranks (rank 0 gathers from two others): the file holds
     * what the ranks held, whole */
    check_file(end3, z3);
    /* and the sharded file is the one ddp writes: ddp on 2 ranks resumes it
     * as stage 2 does (no clipping: ddp's norm sums in another order) */
    job *u0 = run_job("deepspeed_stage_2", 0, 2, 0, true, false, path, NULL);
    job *dd = run_job("ddp", 0, 2, 0, false, true, path, NULL);
    check_same(u0, dd, "ddp resumed from a stage 2 file vs stage 2 uninterrupted");
    job *all[] = {u, r2, r1, d3, z3, o3, f3, u0, dd};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) release(all[i]);
    unlink(path);
    unlink(end3);
    rmdir(dir);
}

TEST(stage3_save_load_continue_bitwise) {
    char dir[] = "/tmp/fg-zero3-ckpt-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[256], end3[256];
    snprintf(path, sizeof path, "%s/step-%d.safetensors", dir, SAVE_AT);
    snprintf(end3, sizeof end3, "%s/end3.safetensors", dir);
    job *u = run_job("deepspeed_stage_3", 0, 2, 0.5, true, false, path, NULL);
    job *r = run_job("deepspeed_stage_3", 0, 2, 0.5, false, true, path, NULL);
    CHECK(r->start_step == SAVE_AT);
    check_same(u, r, "stage 3 resumed on 2 ranks vs uninterrupted");
    job *d3 = run_job("ddp", 0, 3, 0, false, true, path, NULL);
    job *f3 = run_job("fsdp", FG_SHARDING_FULL_SHARD, 3, 0, false, true, path, end3);
    check_same(d3, f3, "fsdp FULL_SHARD resumed on 3 ranks vs ddp");
    check_file(end3, f3);
    /* the stage-3 file is ddp's: a ddp run writes the same bits */
    job *u0 = run_job("deepspeed_stage_3", 0, 2, 0, true, false, path, NULL);
    job *dd = run_job("ddp", 0, 2, 0, false, true, path, NULL);
    check_same(u0, dd, "ddp resumed from a stage 3 file vs stage 3 uninterrupted");
    /* HYBRID_SHARD on 4 ranks in groups of 2: the first group's shards
     * make the file, which holds what the ranks held */
    char endh[256];
    snprintf(endh, sizeof endh, "%s/endh.safetensors", dir);
    g_hybrid = 2;
    job *h4 = run_job("fsdp", FG_SHARDING_HYBRID_SHARD, 4, 0, false, true, path, endh);
    g_hybrid = 0;
    CHECK(h4->start_step == SAVE_AT);
    check_file(endh, h4);
    unlink(endh);
    job *all[] = {u, r, d3, f3, u0, dd, h4};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) release(all[i]);
    unlink(path);
    unlink(end3);
    rmdir(dir);
}
