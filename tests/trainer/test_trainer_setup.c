/* How an entry point sets the model up: configure_model builds it on every
 * rank, under empty init where setup shards the parameters (deepspeed_stage_3
 * on 2 ranks: the sharded model is the one a whole init makes, and its
 * validation loss is ddp's) and not elsewhere; a model made under empty init
 * and loaded before setup (init_module(empty_init=True) + load_from_checkpoint)
 * keeps the loaded weights through setup, on one rank and sharded on two;
 * training_step_end sees each step's part losses and the *_step_end hooks
 * follow their step with the same batch. */
#include <math.h>
#include <sys/mman.h>

#include "trainer_test_util.h"

typedef struct setup_mod {
    fg_module *net;
    bool build_empty; /* configure_model's model made under empty init by the test itself */
    bool saw_empty;   /* the thread's empty init inside configure_model */
    int configured;
    const float *load; /* weights loaded into the model before setup, or NULL */
    int64_t nload;
    /* the *_step_end hooks */
    int64_t train_end_calls, val_end_calls, test_end_calls, predict_end_calls;
    int64_t end_mismatch; /* a step_end whose batch or index was not its step's */
    fg_batch *last_b;
    int64_t last_i;
    double part_sum;
    int nparts_seen;
} setup_mod;

static fg_module *make_net(void) {
    return fg_mlp_new(&(fg_mlp_config){.sizes = {TU_DIM, 16, 16, TU_CLASSES}, .seed = 9});
}

static fg_module *sm_configure(void *ud, fg_trainer *t) {
    (void)t;
    setup_mod *m = ud;
    bool on = fg_module_set_empty_init(false);
    fg_module_set_empty_init(on);
    if (!m->net) {
        m->saw_empty = on;
        m->net = make_net();
    }
    m->configured++;
    return m->net;
}

static fg_status sm_opt(void *ud, fg_trainer *t, fg_optimizer_config *out) {
    (void)t;
    out->optimizer = fg_sgd_new(((setup_mod *)ud)->net, &(fg_sgd_opts){.lr = 0.1});
    return out->optimizer ? FG_OK : fg_last_status();
}

static fg_tensor *sm_train(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)t;
    (void)i;
    setup_mod *m = ud;
    return fg_cross_entropy(fg_module_forward(m->net, b->x), b->y, -100);
}

static fg_status sm_train_end(void *ud, fg_trainer *t, const double *parts, int n) {
    (void)t;
    setup_mod *m = ud;
    m->train_end_calls++;
    m->nparts_seen = n;
    for (int k = 0; k < n; k++) m->part_sum += parts[k];
    return FG_OK;
}

static fg_status eval_loss(setup_mod *m, fg_trainer *t, fg_batch *b, const char *name) {
    m->last_b = b;
    fg_tensor *l = fg_cross_entropy(fg_module_forward(m->net, b->x), b->y, -100);
    if (!l) return fg_last_status();
    return fg_trainer_log(t, name, fg_item(l),
                          &(fg_log_opts){.sync_dist = true, .batch_size = b->size});
}

static fg_status sm_val(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    ((setup_mod *)ud)->last_i = i;
    return eval_loss(ud, t, b, "val_loss");
}
static fg_status sm_test(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    ((setup_mod *)ud)->last_i = i;
    return eval_loss(ud, t, b, "test_loss");
}
static fg_status sm_predict(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)t;
    setup_mod *m = ud;
    m->last_b = b;
    m->last_i = i;
    return FG_OK;
}

static void check_end(setup_mod *m, fg_batch *b, int64_t i, int64_t *calls) {
    (*calls)++;
    if (b != m->last_b || i != m->last_i) m->end_mismatch++;
}
static fg_status sm_val_end(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)t;
    check_end(ud, b, i, &((setup_mod *)ud)->val_end_calls);
    return FG_OK;
}
static fg_status sm_test_end(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)t;
    check_end(ud, b, i, &((setup_mod *)ud)->test_end_calls);
    return FG_OK;
}
static fg_status sm_predict_end(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)t;
    check_end(ud, b, i, &((setup_mod *)ud)->predict_end_calls);
    return FG_OK;
}

static fg_lightning_module sm_lm(setup_mod *m, bool by_configure) {
    return (fg_lightning_module){.ud = m,
                                 .model = by_configure ? NULL : m->net,
                                 .configure_model = by_configure ? sm_configure : NULL,
                                 .configure_optimizers = sm_opt,
                                 .training_step = sm_train,
                                 .training_step_end = sm_train_end,
                                 .validation_step = sm_val,
                                 .test_step = sm_test,
                                 .predict_step = sm_predict,
                                 .validation_step_end = sm_val_end,
                                 .test_step_end = sm_test_end,
                                 .predict_step_end = sm_predict_end};
}

static fg_trainer *quiet_trainer(const char *strategy, const char *devices) {
    return fg_trainer_new(&(fg_trainer_opts){.strategy = strategy,
                                             .devices = devices,
                                             .max_epochs = 1,
                                             .num_sanity_val_steps = FG_COUNT(0),
                                             .enable_progress_bar = FG_OFF,
                                             .enable_checkpointing = FG_OFF,
                                             .logger = FG_OFF});
}

/* A model made under empty init (or not), then values loaded into it. */
static fg_module *loaded(const float *w, int64_t n, bool empty) {
    bool was = fg_module_set_empty_init(empty);
    fg_module *net = make_net();
    fg_module_set_empty_init(was);
    if (!net) return NULL;
    int64_t k = 0;
    fg_state_entry e[16];
    for (int64_t i = 0; i < fg_module_num_params(net) && i < 16; i++) {
        fg_tensor *p = fg_module_param(net, i);
        e[i] = (fg_state_entry){.name = fg_module_param_name(net, i),
                                .dtype = FG_F32,
                                .ndim = fg_tensor_ndim(p),
                                .shape = fg_tensor_shape(p),
                                .data = w + k};
        k += fg_tensor_numel(p);
    }
    CHECK(k == n);
    CHECK_OK(fg_module_load_state(net, e, fg_module_num_params(net), true));
    return net;
}

/* Weights unlike the seed's: what "loaded" means below. */
static float *other_weights(int64_t *n) {
    fg_module *ref = make_net();
    *n = fg_module_numel(ref);
    float *w = malloc((size_t)*n * sizeof *w);
    for (int64_t i = 0; i < *n; i++) w[i] = 0.01f * (float)((i * 7919) % 101 - 50);
    fg_module_free(ref);
    return w;
}

/* ---------------------------------------------------------- one process */

TEST(load_into_an_empty_init_model_survives_setup) {
    tu_clean_env();
    int64_t n;
    float *w = other_weights(&n);
    fg_module *net = loaded(w, n, true);
    CHECK(net != NULL);
    fg_dataset *va = tu_dataset(12, 12);
    fg_dataloader *vl = tu_loader(va, 4, false);
    setup_mod m = {.net = net};
    fg_lightning_module lm = sm_lm(&m, false);
    fg_trainer *t = quiet_trainer(NULL, "1");
    CHECK_OK(fg_trainer_validate(t, &lm, vl, NULL));
    const float *p = fg_tensor_data(fg_module_flat_params(net));
    int64_t diff = 0;
    for (int64_t i = 0; i < n; i++) diff += p[i] != w[i];
    CHECK_MSG(diff == 0, "%lld of %lld loaded weights changed by setup", (long long)diff,
              (long long)n);
    /* and the *_step_end hooks: one per step, with its batch and index */
    CHECK(m.val_end_calls == 3 && m.end_mismatch == 0);
    CHECK_OK(fg_trainer_test(t, &lm, vl, NULL));
    CHECK(m.test_end_calls == 3 && m.end_mismatch == 0);
    CHECK_OK(fg_trainer_predict(t, &lm, vl, NULL));
    CHECK(m.predict_end_calls == 3 && m.end_mismatch == 0);
    fg_trainer_free(t);
    fg_dataloader_free(vl);
    fg_dataset_free(va);
    fg_module_free(net);
    free(w);
}

TEST(training_step_end_sees_the_part_losses) {
    tu_clean_env();
    for (int dp = 0; dp < 2; dp++) {
        fg_dataset *tr = tu_dataset(16, 11);
        fg_dataloader *tl = tu_loader(tr, 4, false);
        setup_mod m = {0};
        fg_lightning_module lm = sm_lm(&m, true);
        fg_trainer *t = quiet_trainer(dp ? "dp" : NULL, dp ? "2" : "1");
        CHECK_MSG(t, "%s", fg_last_error());
        CHECK_OK(fg_trainer_fit(t, &lm, tl, NULL, NULL));
        /* one call a batch, dp's two halves as two parts */
        CHECK_MSG(m.train_end_calls == 4 && m.nparts_seen == (dp ? 2 : 1), "dp %d: %lld calls, %d",
                  dp, (long long)m.train_end_calls, m.nparts_seen);
        CHECK(isfinite(m.part_sum) && m.part_sum > 0);
        CHECK(m.configured == 1 && !m.saw_empty); /* one process: nothing to shard */
        fg_trainer_free(t);
        fg_dataloader_free(tl);
        fg_dataset_free(tr);
        fg_module_free(m.net);
    }
}

/* --------------------------------------------------------------- 2 ranks */

typedef struct shared {
    double val[2][2]; /* [kind][rank]: ddp, deepspeed_stage_3 */
    int saw_empty[2][2];
    double loaded_val[2];
} shared;

typedef struct job {
    shared *sh;
    int id;
} job;

static int rank_fn(int rank, int world, void *arg) {
    job *j = arg;
    shared *sh = j->sh;
    fg_dataset *va = tu_dataset(16, 12);
    for (int kind = 0; kind < 2; kind++) {
        tu_fake_launcher(rank, world, j->id * 10 + kind);
        fg_dataloader *vl = tu_loader(va, 4, false);
        setup_mod m = {0};
        fg_lightning_module lm = sm_lm(&m, true);
        fg_trainer *t = quiet_trainer(kind ? "deepspeed_stage_3" : "ddp", "auto");
        if (!t || fg_trainer_validate(t, &lm, vl, NULL) != FG_OK) {
            fprintf(stderr, "rank %d %s: %s\n", rank, kind ? "stage 3" : "ddp", fg_last_error());
            return 1;
        }
        CHECK(fg_trainer_callback_metric(t, "val_loss", &sh->val[kind][rank]));
        sh->saw_empty[kind][rank] = m.saw_empty;
        fg_trainer_free(t);
        fg_dataloader_free(vl);
        fg_module_free(m.net);
    }
    /* empty init + load, then stage 3's setup shards what was loaded */
    tu_fake_launcher(rank, world, j->id * 10 + 5);
    int64_t n;
    float *w = other_weights(&n);
    setup_mod m = {.net = loaded(w, n, true)};
    fg_lightning_module lm = sm_lm(&m, false);
    fg_dataloader *vl = tu_loader(va, 4, false);
    fg_trainer *t = quiet_trainer("deepspeed_stage_3", "auto");
    if (!t || fg_trainer_validate(t, &lm, vl, NULL) != FG_OK) {
        fprintf(stderr, "rank %d loaded: %s\n", rank, fg_last_error());
        return 1;
    }
    CHECK(fg_trainer_callback_metric(t, "val_loss", &sh->loaded_val[rank]));
    fg_trainer_free(t);
    fg_dataloader_free(vl);
    fg_module_free(m.net);
    free(w);
    fg_dataset_free(va);
    return 0;
}

TEST(configure_model_under_stage_3_is_empty_init) {
    shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(sh != MAP_FAILED);
    if (sh == MAP_FAILED) return;
    job j = {.sh = sh, .id = (int)getpid() % 100000};
    CHECK(fg_test_fork_ranks(2, rank_fn, &j, 120) == 0);
    tu_clean_env();
    for (int r = 0; r < 2; r++) {
        CHECK_MSG(sh->saw_empty[1][r] && !sh->saw_empty[0][r],
                  "rank %d: empty init in configure_model: ddp %d, stage 3 %d", r,
                  sh->saw_empty[0][r], sh->saw_empty[1][r]);
        /* the sharded init is the whole one: ddp's validation loss */
        CHECK_CLOSE(sh->val[1][r], sh->val[0][0], 1e-6, 0);
    }
    /* the weights loaded before setup, sharded: their loss, on one rank
     * with a model made the plain way */
    int64_t n;
    float *w = other_weights(&n);
    fg_module *net = loaded(w, n, false);
    fg_dataset *va = tu_dataset(16, 12);
    fg_dataloader *vl = tu_loader(va, 4, false);
    setup_mod m = {.net = net};
    fg_lightning_module lm = sm_lm(&m, false);
    fg_trainer *t = quiet_trainer(NULL, "1");
    CHECK_OK(fg_trainer_validate(t, &lm, vl, NULL));
    double want;
    CHECK(fg_trainer_callback_metric(t, "val_loss", &want));
    for (int r = 0; r < 2; r++)
        CHECK_MSG(fabs(sh->loaded_val[r] - want) <= 1e-6 * fabs(want),
                  "rank %d: stage 3 over loaded weights: val_loss %.9g, the weights' %.9g", r,
                  sh->loaded_val[r], want);
    fg_trainer_free(t);
    fg_dataloader_free(vl);
    fg_dataset_free(va);
    fg_module_free(net);
    free(w);
    munmap(sh, sizeof *sh);
}
