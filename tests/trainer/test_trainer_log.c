/* fg_trainer_log as Lightning's self.log: defaults by hook, name_step and
 * name_epoch, what lands in the callback, logged and progress-bar sets,
 * epoch values weighted by batch size (and summed, maxed, minned), the
 * loggers' rows at Lightning's steps, dp's parts combined, refusals; and
 * sync_dist over 2 and 3 ranks (forked ranks under a faked launcher). */
#include <math.h>

#include "trainer_test_util.h"

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        fg_status s_ = (expr);                                                                     \
        if (s_ != FG_OK) return s_;                                                                \
    } while (0)

/* ------------------------------------------------------- a module that logs */

typedef struct log_mod {
    fg_module *net;
    int64_t checks;    /* hooks that checked something */
    double epoch_mean; /* "w_epoch" seen at on_train_epoch_end */
    fg_status bad[4];  /* statuses of refused calls */
    char bad_msg[4][256];
    int rank, world;
    bool ranks_test;
} log_mod;

static fg_status lm_opt(void *ud, fg_trainer *t, fg_optimizer_config *out) {
    (void)t;
    out->optimizer = fg_sgd_new(((log_mod *)ud)->net, &(fg_sgd_opts){.lr = 0.01});
    return FG_OK;
}

/* batch k (0-based) of an epoch logs k + 1 */
static fg_tensor *lm_train(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    log_mod *m = ud;
    double v = (double)(i + 1);
    CHECK_OK(fg_trainer_log(t, "a", v, NULL)); /* step only */
    CHECK_OK(
        fg_trainer_log(t, "w", v, &(fg_log_opts){.on_epoch = FG_ON, .prog_bar = true})); /* both */
    CHECK_OK(fg_trainer_log(t, "u", v,
                            &(fg_log_opts){.on_step = FG_OFF, .on_epoch = FG_ON, .batch_size = 1}));
    CHECK_OK(fg_trainer_log(
        t, "s", v,
        &(fg_log_opts){.on_step = FG_OFF, .on_epoch = FG_ON, .reduce_fx = FG_REDUCE_FX_SUM}));
    CHECK_OK(fg_trainer_log(
        t, "mx", v,
        &(fg_log_opts){.on_step = FG_OFF, .on_epoch = FG_ON, .reduce_fx = FG_REDUCE_FX_MAX}));
    CHECK_OK(fg_trainer_log(
        t, "mn", v,
        &(fg_log_opts){.on_step = FG_OFF, .on_epoch = FG_ON, .reduce_fx = FG_REDUCE_FX_MIN}));
    CHECK_OK(fg_trainer_log(t, "quiet", v, &(fg_log_opts){.logger = FG_OFF}));
    if (i == 0 && m->bad[0] == FG_OK) {
        m->bad[0] = fg_trainer_log(t, "a", v, &(fg_log_opts){.on_epoch = FG_ON});
        snprintf(m->bad_msg[0], 256, "%s", fg_last_error());
    }
    (void)b;
    return fg_cross_entropy(fg_module_forward(m->net, b->x), b->y, -100);
}

static fg_status lm_batch_end(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)b;
    log_mod *m = ud;
    double v;
    /* the step values are published after on_train_batch_end: here, the previous batch's */
    if (i > 0 && fg_trainer_callback_metric(t, "w_step", &v)) {
        CHECK(v == (double)i);
        m->checks++;
    }
    return FG_OK;
}

static fg_status lm_epoch_end(void *ud, fg_trainer *t) {
    log_mod *m = ud;
    double v;
    CHECK(fg_trainer_callback_metric(t, "w_epoch", &m->epoch_mean));
    CHECK(fg_trainer_callback_metric(t, "w", &v) && v == m->epoch_mean);
    m->bad[1] = fg_trainer_log(t, "e", 1.0, &(fg_log_opts){.on_step = FG_ON});
    snprintf(m->bad_msg[1], 256, "%s", fg_last_error());
    CHECK_OK(fg_trainer_log(t, "e", 7.0, NULL)); /* an epoch hook logs on_epoch */
    m->checks++;
    return FG_OK;
}

static fg_status lm_val(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)ud;
    (void)i;
    return fg_trainer_log(t, "v", (double)b->size, NULL); /* epoch only in validation */
}

static fg_status lm_predict(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)b;
    (void)i;
    log_mod *m = ud;
    m->bad[2] = fg_trainer_log(t, "p", 1.0, NULL);
    snprintf(m->bad_msg[2], 256, "%s", fg_last_error());
    return FG_OK;
}

static fg_lightning_module log_lm(log_mod *m) {
    return (fg_lightning_module){.ud = m,
                                 .model = m->net,
                                 .configure_optimizers = lm_opt,
                                 .training_step = lm_train,
                                 .validation_step = lm_val,
                                 .predict_step = lm_predict,
                                 .on_train_batch_end = lm_batch_end,
                                 .on_train_epoch_end = lm_epoch_end};
}

/* ------------------------------------------------------ a capturing logger */

typedef struct cap_logger {
    char rows[64][256];
    int n;
    int hparams;
} cap_logger;

static fg_status cap_log(void *ud, const fg_metric *m, int64_t n, int64_t step) {
    cap_logger *c = ud;
    if (c->n >= 64) return FG_OK;
    char *r = c->rows[c->n++];
    snprintf(r, 256, "%lld:", (long long)step);
    for (int64_t i = 0; i < n; i++)
        snprintf(r + strlen(r), 256 - strlen(r), "%s%s=%g", i ? "," : "", m[i].name, m[i].value);
    return FG_OK;
}

static fg_status cap_hparams(void *ud, const fg_kv *hp, int64_t n) {
    (void)hp;
    ((cap_logger *)ud)->hparams += (int)n + 1;
    return FG_OK;
}

TEST(log_defaults_names_and_epoch_means) {
    tu_clean_env();
    /* 10 samples in batches of 4: sizes 4, 4, 2 */
    fg_dataset *tr = tu_dataset(10, 21), *va = tu_dataset(6, 22);
    fg_dataloader *tl = tu_loader(tr, 4, false), *vl = tu_loader(va, 4, false);
    log_mod m = {.net = fg_mlp_new(&(fg_mlp_config){.sizes = {TU_DIM, 3}, .seed = 1})};
    fg_lightning_module lm = log_lm(&m);
    cap_logger cap = {0};
    fg_logger *lg = fg_logger_new(
        &(fg_logger_ops){.name = "cap", .log_metrics = cap_log, .log_hyperparams = cap_hparams},
        &cap);
    fg_logger *lgs[] = {lg};
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 1,
                                                      .devices = "1",
                                                      .log_every_n_steps = 2,
                                                      .num_sanity_val_steps = FG_COUNT(0),
                                                      .enable_progress_bar = FG_OFF,
                                                      .enable_checkpointing = FG_OFF,
                                                      .loggers = lgs,
                                                      .nloggers = 1});
    CHECK_OK(fg_trainer_fit(t, &lm, tl, vl, NULL));
    /* epoch values: weighted by batch size unless batch_size is given */
    CHECK_CLOSE(m.epoch_mean, (1 * 4 + 2 * 4 + 3 * 2) / 10.0, 1e-12, 0);
    double v;
    CHECK(fg_trainer_callback_metric(t, "u", &v) && v == 2.0);
    CHECK(fg_trainer_callback_metric(t, "s", &v) && v == 6.0);
    CHECK(fg_trainer_callback_metric(t, "mx", &v) && v == 3.0);
    CHECK(fg_trainer_callback_metric(t, "mn", &v) && v == 1.0);
    CHECK(fg_trainer_callback_metric(t, "a", &v) && v == 3.0);      /* the last step's */
    CHECK(fg_trainer_callback_metric(t, "w_step", &v) && v == 3.0); /* both ways: both names */
    CHECK(fg_trainer_callback_metric(t, "e", &v) && v == 7.0);
    CHECK(fg_trainer_callback_metric(t, "v", &v) && v == (4 * 4 + 2 * 2) / 6.0);
    CHECK(!fg_trainer_callback_metric(t, "v_epoch", NULL)); /* only both-ways names fork */
    CHECK(m.checks == 3);
    /* the progress bar set has the forked names of prog_bar values */
    const fg_metric *pm;
    int64_t np = fg_trainer_metrics(t, FG_PROGRESS_BAR_METRICS, &pm);
    CHECK(np == 2 && !strcmp(pm[0].name, "w_step") && !strcmp(pm[1].name, "w_epoch"));
    /* logger=FG_OFF stays out of the logged set */
    const fg_metric *lgm;
    int64_t nl = fg_trainer_metrics(t, FG_LOGGED_METRICS, &lgm);
    bool quiet_logged = false;
    for (int64_t i = 0; i < nl; i++) quiet_logged |= !strcmp(lgm[i].name, "quiet");
    CHECK(nl > 0 && !quiet_logged);
    /* refusals */
    CHECK(m.bad[0] == FG_EINVAL);
    CHECK_CONTAINS(m.bad_msg[0], "log a name one way");
    CHECK(m.bad[1] == FG_EINVAL);
    CHECK_CONTAINS(m.bad_msg[1], "an epoch hook logs on_epoch only");
    CHECK_STATUS(fg_trainer_log(t, "x", 1, NULL), FG_ESTATE); /* outside a hook */
    CHECK_OK(fg_trainer_predict(t, &lm, vl, NULL));
    CHECK(m.bad[2] == FG_ESTATE);
    CHECK_CONTAINS(m.bad_msg[2], "not allowed in predict_step");
    /* rows, at Lightning's steps: after global step 2 (log_every_n_steps) a row at step 1;
     * batch 3 validates (a row at batches_that_stepped, 2) and ends the epoch (its row at
     * the step of its last batch, 2) */
    CHECK_MSG(cap.n == 3, "%d rows", cap.n);
    CHECK_MSG(!strcmp(cap.rows[0], "1:a=2,w_step=2,epoch=0"), "%s", cap.rows[0]);
    CHECK_MSG(!strcmp(cap.rows[1], "2:v=3.33333,epoch=0"), "%s", cap.rows[1]);
    CHECK_MSG(!strcmp(cap.rows[2], "2:w_epoch=1.8,u=2,s=6,mx=3,mn=1,e=7,epoch=0"), "%s",
              cap.rows[2]);
    CHECK(cap.hparams == 1);
    fg_trainer_free(t);
    fg_logger_free(lg);
    fg_dataloader_free(tl);
    fg_dataloader_free(vl);
    fg_dataset_free(tr);
    fg_dataset_free(va);
    fg_module_free(m.net);
}

/* -------------------------------------------------------------------- dp */

static fg_tensor *dp_train(void *ud, fg_trainer *t, fg_batch *part, int64_t i) {
    (void)i;
    log_mod *m = ud;
    /* each dp part logs its own size: the batch's value is their weighted mean */
    if (fg_trainer_log(t, "sz", (double)part->size, &(fg_log_opts){.on_epoch = FG_ON}) != FG_OK)
        return NULL;
    return fg_cross_entropy(fg_module_forward(m->net, part->x), part->y, -100);
}

/* Under dp and ddp2 (one node here: the same replicas on threads, as the
 * strategy's row says) the logged step value is the parts' weighted mean,
 * not one replica's. */
TEST(dp_parts_combine) {
    tu_clean_env();
    fg_dataset *tr = tu_dataset(10, 23);
    fg_dataloader *tl = tu_loader(tr, 5, false); /* two batches of 5: parts of 3 and 2 */
    static const char *const k_strategy[] = {NULL, "dp", "ddp2"};
    for (int dp = 0; dp < 3; dp++) {
        log_mod m = {.net = fg_mlp_new(&(fg_mlp_config){.sizes = {TU_DIM, 3}, .seed = 1})};
        fg_lightning_module lm = {
            .ud = &m, .model = m.net, .configure_optimizers = lm_opt, .training_step = dp_train};
        fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 1,
                                                          .devices = dp ? "2" : "1",
                                                          .strategy = k_strategy[dp],
                                                          .enable_progress_bar = FG_OFF,
                                                          .enable_checkpointing = FG_OFF,
                                                          .logger = FG_OFF});
        CHECK_MSG(t != NULL, "%s", fg_last_error());
        if (!t) continue;
        CHECK_OK(fg_trainer_fit(t, &lm, tl, NULL, NULL));
        double want = dp ? (3.0 * 3 + 2.0 * 2) / 5 : 5.0, v;
        CHECK(fg_trainer_callback_metric(t, "sz_step", &v));
        CHECK_MSG(fabs(v - want) < 1e-12, "strategy %s: sz_step %g, want %g",
                  k_strategy[dp] ? k_strategy[dp] : "auto", v, want);
        CHECK(fg_trainer_callback_metric(t, "sz_epoch", &v));
        CHECK_CLOSE(v, want, 1e-12, 0);
        fg_trainer_free(t);
        fg_module_free(m.net);
    }
    fg_dataloader_free(tl);
    fg_dataset_free(tr);
}

/* ----------------------------------------------------------- sync_dist */

/* Rank r, validation batch j: v = (r + 1) * 10 + j, weighted by batch size */
static fg_status sync_val(void *ud, fg_trainer *t, fg_batch *b, int64_t j) {
    log_mod *m = ud;
    double v = (double)(m->rank + 1) * 10 + (double)j;
    TRY(fg_trainer_log(t, "sv", v, &(fg_log_opts){.sync_dist = true}));
    TRY(fg_trainer_log(t, "sv_sum", v,
                       &(fg_log_opts){.sync_dist = true, .reduce_fx = FG_REDUCE_FX_SUM}));
    TRY(fg_trainer_log(t, "sv_max", v,
                       &(fg_log_opts){.sync_dist = true, .reduce_fx = FG_REDUCE_FX_MAX}));
    TRY(fg_trainer_log(t, "sv_min", v,
                       &(fg_log_opts){.sync_dist = true, .reduce_fx = FG_REDUCE_FX_MIN}));
    TRY(fg_trainer_log(t, "local", v, NULL));
    if (m->rank == 0) TRY(fg_trainer_log(t, "zero", v, &(fg_log_opts){.rank_zero_only = true}));
    (void)b;
    return FG_OK;
}

static fg_tensor *sync_train(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)i;
    log_mod *m = ud;
    if (fg_trainer_log(t, "ts", (double)(m->rank + 1), &(fg_log_opts){.sync_dist = true}) != FG_OK)
        return NULL;
    return fg_cross_entropy(fg_module_forward(m->net, b->x), b->y, -100);
}

static fg_status sync_batch_end(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)b;
    (void)i;
    log_mod *m = ud;
    double v;
    /* after the first batch the step value is the plain mean over ranks */
    if (i > 0 && fg_trainer_callback_metric(t, "ts", &v)) {
        CHECK_CLOSE(v, (m->world + 1) / 2.0, 1e-12, 0);
        m->checks++;
    }
    return FG_OK;
}

static int sync_rank(int rank, int world, void *arg) {
    int job = *(int *)arg;
    tu_fake_launcher(rank, world, job);
    /* 12 validation samples: per rank 12 / world, in batches of 4 */
    fg_dataset *tr = tu_dataset(24, 31), *va = tu_dataset(12, 32);
    fg_dataloader *tl = tu_loader(tr, 4, true), *vl = tu_loader(va, 4, false);
    log_mod m = {.net = fg_mlp_new(&(fg_mlp_config){.sizes = {TU_DIM, 3}, .seed = 1}),
                 .rank = rank,
                 .world = world};
    fg_lightning_module lm = {.ud = &m,
                              .model = m.net,
                              .configure_optimizers = lm_opt,
                              .training_step = sync_train,
                              .validation_step = sync_val,
                              .on_train_batch_end = sync_batch_end};
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 1,
                                                      .num_sanity_val_steps = FG_COUNT(0),
                                                      .enable_progress_bar = FG_OFF,
                                                      .enable_checkpointing = FG_OFF,
                                                      .logger = FG_OFF});
    if (!t) {
        fprintf(stderr, "rank %d: %s\n", rank, fg_last_error());
        return 1;
    }
    CHECK(fg_trainer_world_size(t) == world || fg_trainer_world_size(t) == 1);
    fg_status s = fg_trainer_fit(t, &lm, tl, vl, NULL);
    CHECK_MSG(s == FG_OK, "rank %d: %s", rank, fg_last_error());
    /* what every rank computes: all ranks' batches */
    int64_t per = 12 / world;
    double num = 0, den = 0, sum = 0, mx = -1e30, mn = 1e30, lnum = 0, lden = 0;
    for (int r = 0; r < world; r++)
        for (int64_t j = 0; j * 4 < per; j++) {
            double bs = (double)(per - j * 4 < 4 ? per - j * 4 : 4), v = (r + 1) * 10.0 + (double)j;
            num += v * bs;
            den += bs;
            sum += v;
            mx = v > mx ? v : mx;
            mn = v < mn ? v : mn;
            if (r == rank) lnum += v * bs, lden += bs;
        }
    double v;
    CHECK(fg_trainer_callback_metric(t, "sv", &v));
    CHECK_CLOSE(v, num / den, 1e-12, 0);
    CHECK(fg_trainer_callback_metric(t, "sv_sum", &v) && v == sum);
    CHECK(fg_trainer_callback_metric(t, "sv_max", &v) && v == mx);
    CHECK(fg_trainer_callback_metric(t, "sv_min", &v) && v == mn);
    CHECK(fg_trainer_callback_metric(t, "local", &v));
    CHECK_CLOSE(v, lnum / lden, 1e-12, 0); /* not synced: this rank's own */
    CHECK(fg_trainer_callback_metric(t, "zero", NULL) == (rank == 0));
    CHECK(m.checks == 24 / world / 4 - 1);
    fg_trainer_free(t);
    fg_dataloader_free(tl);
    fg_dataloader_free(vl);
    fg_dataset_free(tr);
    fg_dataset_free(va);
    fg_module_free(m.net);
    return 0;
}

TEST(sync_dist_over_2_and_3_ranks) {
    for (int world = 2; world <= 3; world++) {
        int job = world;
        CHECK_MSG(fg_test_fork_ranks(world, sync_rank, &job, 120) == 0, "world %d", world);
    }
    tu_clean_env();
}
