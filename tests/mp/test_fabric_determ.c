/* The deterministic mode and the elastic resume through the fabric (ranks
 * are forked processes that a custom cluster environment places):
 *   - ddp under `deterministic` on 1, 2, 3 and 4 ranks, for one global
 *     batch of 12 samples (micro-batches of 1, 12 / world per rank), gives
 *     bitwise the same parameters and the same step losses, and every rank
 *     takes every sample of an epoch's 48 exactly once;
 *   - a run that goes 2 ranks -> 1 rank -> 3 ranks through checkpoints
 *     (the global batch kept, the accumulation recomputed, the position
 *     mapped in samples) ends bitwise equal to the uninterrupted run, and
 *     over the three runs no sample of an epoch is lost or taken twice
 *     (counted from the batches' dataset indices);
 *   - plain ddp resumed from 2 ranks on 3: no sample lost or twice either;
 *   - a global batch the new world size cannot make is refused, naming the
 *     batch sizes that would;
 *   - a deterministic resume that keeps the global batch with another
 *     micro-batch says it gives other bits (and one with the same says
 *     nothing). */
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "fulgur/fabric.h"
#include "harness.h"

#define NSAMPLES 53
#define GLOBAL 12 /* samples per optimizer step; 48 per epoch */
#define STEPS 10  /* epochs 0 and 1 whole, 2 of 4 steps of epoch 2 */
#define MAXN 4096
#define IN 6

static char g_warned[1024]; /* the micro-batch warning a rank's process got (warn_case) */

typedef struct job {
    bool det;
    int world;
    int64_t batch;  /* per micro-batch */
    int64_t accum;  /* asked for; the fabric may change it on resume */
    int stop;       /* run until this step */
    char load[256]; /* start from this checkpoint ("" = from scratch) */
    char save[256]; /* save at the stop ("" = none) */
    char id[96];
    /* results */
    int failed_setup;
    char msg[512];
    int64_t n, accum_used;
    float params[MAXN];
    double loss[STEPS + 1]; /* rank 0's step losses, by step */
    int seen[3][NSAMPLES];  /* per epoch: how often a sample was taken, over ranks */
} job;

static int64_t ds_len(void *ud) {
    (void)ud;
    return NSAMPLES;
}
static void ds_spec(void *ud, fg_sample_spec *x, fg_sample_spec *y) {
    (void)ud;
    *x = (fg_sample_spec){.dtype = FG_F32, .ndim = 1, .shape = {IN}};
    *y = (fg_sample_spec){.dtype = FG_I32};
}
static fg_status ds_get(void *ud, int64_t i, void *x, void *y) {
    (void)ud;
    float *xf = x;
    for (int k = 0; k < IN; k++)
        xf[k] = (float)(fg_rng_u32_at(21, (uint64_t)(i * IN + k)) % 2001) / 1000.0f - 1.0f;
    *(int32_t *)y = (int32_t)(i % 3);
    return FG_OK;
}

static int g_rank;

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

/* The next batch, going on to the next epoch at the end of one. */
static fg_batch *next(fg_dataloader *dl) {
    fg_batch *b = fg_dataloader_next(dl);
    if (b || fg_dataloader_status(dl) != FG_OK) return b;
    int64_t e;
    fg_dataloader_position(dl, &e, NULL);
    if (fg_dataloader_set_epoch(dl, e + 1) != FG_OK) return NULL;
    return fg_dataloader_next(dl);
}

static int train(fg_fabric *f, void *arg) {
    job *j = arg;
    int rank = fg_fabric_global_rank(f);
    fg_dataset *ds = fg_dataset_new(
        &(fg_dataset_ops){.len = ds_len, .spec = ds_spec, .get = ds_get}, NULL, "ids");
    fg_module *m = fg_mlp_new(&(fg_mlp_config){.sizes = {IN, 16, 3}, .seed = 3});
    fg_optimizer *o = m ? fg_adamw_new(m, &(fg_adamw_opts){.lr = 1e-2, .weight_decay = 0.1}) : NULL;
    fg_dataloader *dl = ds ? fg_dataloader_new(ds, &(fg_loader_opts){.batch = j->batch,
                                                                     .shuffle = true,
                                                                     .seed = 77,
                                                                     .drop_last = true})
                           : NULL;
    int bad = !ds || !m || !o || !dl;
    bad = bad || fg_fabric_setup(f, m, o) != FG_OK || !fg_fabric_setup_dataloader(f, dl, true);
    fg_train_state st = {.model = m, .optimizer = o};
    int64_t accum = j->accum;
    if (!bad && j->load[0]) bad = fg_fabric_load(f, j->load, &st) != FG_OK;
    if (!bad && fg_fabric_setup_global_batch(f, dl, &accum, j->load[0] ? &st : NULL) != FG_OK) {
        bad = 1;
        j->failed_setup = 1;
        if (rank == 0) snprintf(j->msg, sizeof j->msg, "%s", fg_last_error());
    }
    j->accum_used = accum;
    if (rank == 0 && !j->failed_setup && g_warned[0]) snprintf(j->msg, sizeof j->msg, "warned");
    for (int64_t step = st.step; step < j->stop && !bad; step++) {
        fg_optimizer_zero_grad(o);
        double sum = 0;
        for (int64_t k = 0; k < accum && !bad; k++) {
            fg_batch *b = next(dl);
            if (!b) {
                bad = 1;
                break;
            }
            for (int64_t i = 0; i < b->size && b->epoch < 3; i++)
                __atomic_fetch_add(&j->seen[b->epoch][b->indices[i]], 1, __ATOMIC_RELAXED);
            fg_fabric_set_no_backward_sync(f, k + 1 < accum);
            fg_tensor *loss = fg_cross_entropy(fg_module_forward(m, b->x), b->y, -100);
            sum += fg_item(loss);
            if (!j->det) loss = fg_scale(loss, 1.0 / (double)accum);
            bad |= fg_fabric_backward(f, loss) != FG_OK;
            fg_fabric_step_end(f);
        }
        if (!bad) bad |= fg_optimizer_step(o) != FG_OK;
        double l = sum / (double)accum;
        if (!bad && j->det) bad |= fg_fabric_step_loss(f, &l) != FG_OK;
        if (rank == 0) j->loss[step + 1] = l;
        fg_fabric_step_end(f);
    }
    if (!bad && j->save[0]) {
        int64_t e, s;
        fg_dataloader_sample_position(dl, &e, &s);
        fg_train_state sv = {.model = m,
                             .optimizer = o,
                             .step = j->stop,
                             .epoch = e,
                             .samples_in_epoch = s,
                             .global_batch = j->batch * j->world * accum};
        bad |= fg_fabric_save(f, j->save, &sv) != FG_OK;
    }
    if (bad && !j->failed_setup) fprintf(stderr, "rank %d: %s\n", rank, fg_last_error());
    if (m && rank == 0) {
        fg_tensor *flat = fg_module_flat_params(m);
        j->n = fg_tensor_numel(flat);
        memcpy(j->params, fg_tensor_data(flat), sizeof(float) * (size_t)j->n);
    }
    fg_dataloader_free(dl);
    fg_optimizer_free(o);
    fg_module_free(m);
    fg_dataset_free(ds);
    return bad;
}

static int rank_main(int rank, int n, void *arg) {
    (void)n;
    job *j = arg;
    g_rank = rank;
    fg_fabric *f = fg_fabric_new(&(fg_fabric_config){.strategy = "ddp",
                                                     .deterministic = j->det,
                                                     .threads_per_rank = 1,
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

/* Runs a job from `load` (NULL: from scratch) to step `stop`, saving there
 * into `save` (NULL: no save). */
static job *run_job(bool det, int world, int64_t batch, int64_t accum, int stop, const char *load,
                    const char *save, bool expect_fail) {
    job *j = mmap(NULL, sizeof *j, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    memset(j, 0, sizeof *j);
    *j = (job){.det = det, .world = world, .batch = batch, .accum = accum, .stop = stop};
    snprintf(j->load, sizeof j->load, "%s", load ? load : "");
    snprintf(j->save, sizeof j->save, "%s", save ? save : "");
    static int seq;
    snprintf(j->id, sizeof j->id, "t-fdet-%d-%d", getpid(), seq++);
    int failed = fg_test_fork_ranks(world, rank_main, j, 300);
    if (!expect_fail)
        CHECK_MSG(failed == 0, "%s on %d ranks: %d ranks failed", det ? "deterministic" : "ddp",
                  world, failed);
    if (failed && !expect_fail && j->msg[0]) fprintf(stderr, "  %s\n", j->msg);
    if (failed) j->n = 0;
    return j;
}

static void release(job *j) { munmap(j, sizeof *j); }

/* Every sample of the epoch's first `want` positions taken once: `want`
 * samples seen once and none twice (j's counts summed over the jobs). */
static void check_once(job *const *jobs, int njobs, int epoch, int want, const char *what) {
    int once = 0, more = 0;
    for (int i = 0; i < NSAMPLES; i++) {
        int c = 0;
        for (int k = 0; k < njobs; k++) c += jobs[k]->seen[epoch][i];
        once += c == 1;
        more += c > 1;
    }
    CHECK_MSG(once == want && more == 0, "%s, epoch %d: %d samples once (want %d), %d more often",
              what, epoch, once, want, more);
}

TEST(deterministic_ddp_on_1_2_3_4_ranks_bitwise) {
    job *ref = run_job(true, 1, 1, GLOBAL, STEPS, NULL, NULL, false);
    CHECK(ref->accum_used == GLOBAL);
    check_once(&ref, 1, 0, 48, "1 rank");
    check_once(&ref, 1, 1, 48, "1 rank");
    check_once(&ref, 1, 2, 24, "1 rank");
    for (int w = 2; w <= 4; w++) {
        job *j = run_job(true, w, 1, GLOBAL / w, STEPS, NULL, NULL, false);
        if (ref->n && j->n) {
            CHECK(j->n == ref->n);
            CHECK_MSG(!memcmp(j->params, ref->params, sizeof(float) * (size_t)ref->n),
                      "%d ranks: the parameters differ from 1 rank's", w);
            for (int s = 1; s <= STEPS; s++)
                CHECK_MSG(j->loss[s] == ref->loss[s], "%d ranks, step %d: loss %.17g vs %.17g", w,
                          s, j->loss[s], ref->loss[s]);
        }
        char what[32];
        snprintf(what, sizeof what, "%d ranks", w);
        check_once(&j, 1, 0, 48, what);
        check_once(&j, 1, 1, 48, what);
        check_once(&j, 1, 2, 24, what);
        release(j);
    }
    /* and not a no-op: the parameters moved from their initial values */
    job *none = run_job(true, 1, 1, GLOBAL, 0, NULL, NULL, false);
    if (none->n && ref->n)
        CHECK(memcmp(none->params, ref->params, sizeof(float) * (size_t)ref->n) != 0);
    release(none);
    release(ref);
}

/* An elastic chain: on w[0] ranks to step stop[0], then from that
 * checkpoint on w[1] ranks to stop[1], then on w[2] ranks to STEPS, each run
 * asking for accumulation 1 after the first (the checkpoint's global batch
 * is kept); want[e] samples of epoch e taken once over the chain, none
 * twice. Under det, bitwise the uninterrupted run's parameters and losses
 * (`ref`, on 1 rank). */
static void elastic(bool det, const int w[3], const int stop[2], const int want[3]) {
    char dir[] = "/tmp/fg-det-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char p1[300], p2[300], what[96];
    snprintf(p1, sizeof p1, "%s/a.safetensors", dir);
    snprintf(p2, sizeof p2, "%s/b.safetensors", dir);
    snprintf(what, sizeof what, "%s %d -> %d -> %d ranks", det ? "deterministic" : "ddp", w[0],
             w[1], w[2]);
    job *a = run_job(det, w[0], 1, GLOBAL / w[0], stop[0], NULL, p1, false);
    job *b = run_job(det, w[1], 1, 1, stop[1], p1, p2, false);
    CHECK_MSG(b->accum_used == GLOBAL / w[1], "%s: accumulation %lld on %d ranks (%s)", what,
              (long long)b->accum_used, w[1], b->msg);
    job *c = run_job(det, w[2], 1, 1, STEPS, p2, NULL, false);
    CHECK_MSG(c->accum_used == GLOBAL / w[2], "%s: accumulation %lld on %d ranks (%s)", what,
              (long long)c->accum_used, w[2], c->msg);
    job *all[3] = {a, b, c};
    for (int e = 0; e < 3; e++) check_once(all, 3, e, want[e], what);
    if (det) {
        job *ref = run_job(det, 1, 1, GLOBAL, STEPS, NULL, NULL, false);
        if (ref->n && c->n) {
            CHECK(c->n == ref->n);
            CHECK_MSG(!memcmp(c->params, ref->params, sizeof(float) * (size_t)ref->n),
                      "%s: the parameters differ from the uninterrupted run's", what);
            for (int s = 1; s <= STEPS; s++) {
                double got = s <= stop[0] ? a->loss[s] : s <= stop[1] ? b->loss[s] : c->loss[s];
                CHECK_MSG(got == ref->loss[s], "%s, step %d: loss %.17g vs %.17g", what, s, got,
                          ref->loss[s]);
            }
        }
        release(ref);
    }
    release(a);
    release(b);
    release(c);
    unlink(p1);
    unlink(p2);
    rmdir(dir);
}

/* epochs of whole global batches: 48 samples each; step 5 is 12 samples
 * into epoch 1, step 7 36 */
TEST(elastic_deterministic_2_then_1_then_3_ranks_bitwise_every_sample_once) {
    elastic(true, (int[]){2, 1, 3}, (int[]){5, 7}, (int[]){48, 48, 24});
}

/* PyTorch's rule: an epoch is what the world size leaves after drop_last
 * (52 on 2 ranks, 51 on 3, 53 on 1), and a step may span two epochs: step 4
 * ends 48 samples into epoch 0 (a position 3 ranks can take), step 8 45
 * into epoch 1 (so 3 ranks took epoch 0's 48..50, and 1 rank takes epoch
 * 1's 45..52, then 16 of epoch 2) */
TEST(elastic_ddp_2_then_3_then_1_ranks_every_sample_once) {
    elastic(false, (int[]){2, 3, 1}, (int[]){4, 8}, (int[]){51, 53, 16});
}

static void keep_warn(void *ud, fg_log_level level, int rank, const char *msg) {
    (void)ud;
    (void)rank;
    if (level == FG_LOG_WARN && strstr(msg, "micro-batches"))
        snprintf(g_warned, sizeof g_warned, "%s", msg);
}

/* The warning is rank 0's, in its own process: the job carries it back. */
static void warn_case(const char *p, int world, int64_t batch, bool want) {
    fg_set_log(keep_warn, NULL, FG_LOG_WARN);
    g_warned[0] = '\0';
    job *b = run_job(true, world, batch, 1, 3, p, NULL, false);
    CHECK_MSG(!strcmp(b->msg, want ? "warned" : ""), "%d ranks x %lld: \"%s\"", world,
              (long long)batch, b->msg);
    release(b);
    fg_set_log(NULL, NULL, FG_LOG_WARN);
}

TEST(deterministic_resume_with_another_micro_batch_says_so) {
    char dir[] = "/tmp/fg-det-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char p[300];
    snprintf(p, sizeof p, "%s/a.safetensors", dir);
    job *a = run_job(true, 2, 2, GLOBAL / 4, 2, NULL, p, false); /* micro-batches of 2 */
    release(a);
    warn_case(p, 1, 2, false); /* 2 per micro-batch, accumulated 6 times: the same bits */
    warn_case(p, 3, 2, false);
    warn_case(p, 1, 4, true); /* 12 = 4 x 3: other bits */
    warn_case(p, 6, 1, true);
    unlink(p);
    rmdir(dir);
}

TEST(elastic_global_batch_that_cannot_be_kept_is_named) {
    char dir[] = "/tmp/fg-det-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char p[300];
    snprintf(p, sizeof p, "%s/a.safetensors", dir);
    job *a = run_job(true, 2, 1, GLOBAL / 2, 2, NULL, p, false);
    release(a);
    /* micro-batches of 5 cannot make 12 on 1 rank; of 1 not on 5 ranks */
    job *b = run_job(true, 1, 5, 1, 4, p, NULL, true);
    CHECK(b->failed_setup);
    CHECK_MSG(strstr(b->msg, "global batch is 12") &&
                  strstr(b->msg, "batch size of 1, 2, 3, 4, 6, 12"),
              "%s", b->msg);
    release(b);
    job *c = run_job(true, 5, 1, 1, 4, p, NULL, true);
    CHECK(c->failed_setup);
    CHECK_MSG(strstr(c->msg, "(none: fewer ranks)") != NULL, "%s", c->msg);
    release(c);
    unlink(p);
    rmdir(dir);
}
