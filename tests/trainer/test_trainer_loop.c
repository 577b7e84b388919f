/* The fit loop counts as Lightning's: for combinations of max_epochs,
 * max_steps, min_epochs, min_steps, accumulate_grad_batches,
 * val_check_interval, check_val_every_n_epoch, limit_*_batches,
 * num_sanity_val_steps, fast_dev_run and should_stop, the number of
 * training steps, optimizer steps (global_step), validation runs and
 * batches, sanity batches, epochs and the final current_epoch. The
 * expected numbers are derived by hand from Lightning's documented rules
 * (its _FitLoop, _TrainingEpochLoop and val-check logic), written beside
 * each row. One process, 40 training samples in batches of 4 (10 batches
 * an epoch), 12 validation samples (3 batches). */
#include "trainer_test_util.h"

typedef struct loop_case {
    const char *name;
    fg_trainer_opts o;
    int64_t stop_at_step, stop_after_epoch;
    /* expected */
    int64_t train, steps, val_runs, val_batches, sanity, epochs_ended, epoch;
} loop_case;

static fg_trainer_opts quiet(fg_trainer_opts o) {
    o.enable_progress_bar = FG_OFF;
    o.enable_checkpointing = FG_OFF;
    o.logger = FG_OFF;
    o.devices = "1";
    return o;
}

static void run_case(const loop_case *c) {
    tu_clean_env();
    fg_dataset *tr = tu_dataset(40, 11), *va = tu_dataset(12, 12);
    fg_dataloader *tl = tu_loader(tr, 4, true), *vl = tu_loader(va, 4, false);
    tu_module m = {.stop_at_step = c->stop_at_step, .stop_after_epoch = c->stop_after_epoch};
    tu_module_init(&m);
    fg_lightning_module lm = tu_lm(&m);
    fg_trainer_opts o = quiet(c->o);
    fg_trainer *t = fg_trainer_new(&o);
    CHECK_MSG(t != NULL, "%s: %s", c->name, fg_last_error());
    if (t) {
        fg_status s = fg_trainer_fit(t, &lm, tl, vl, NULL);
        CHECK_MSG(s == FG_OK, "%s: fit: %s", c->name, fg_last_error());
        tu_counts *k = &m.c;
#define EQ(got, want)                                                                              \
    CHECK_MSG((got) == (want), "%s: %s = %lld, want %lld", c->name, #got, (long long)(got),        \
              (long long)(want))
        EQ(k->train_steps, c->train);
        EQ(k->opt_steps, c->steps);
        EQ(fg_trainer_global_step(t), c->steps);
        EQ(k->val_runs, c->val_runs);
        EQ(k->val_steps, c->val_batches);
        EQ(k->sanity_steps, c->sanity);
        EQ(k->epochs_ended, c->epochs_ended);
        EQ(k->epochs_started, c->epochs_ended);
        EQ(fg_trainer_current_epoch(t), c->epoch);
        EQ(k->fit_start, 1);
        EQ(k->fit_end, 1);
        EQ(k->train_start, 1);
        EQ(k->train_end, 1);
#undef EQ
    }
    fg_trainer_free(t);
    fg_dataloader_free(tl);
    fg_dataloader_free(vl);
    fg_dataset_free(tr);
    fg_dataset_free(va);
    fg_module_free(m.net);
}

TEST(loop_counts_as_lightning) {
    const loop_case cases[] = {
        /* 10 batches an epoch: 10 steps, validation after the last batch */
        {"two epochs", {.max_epochs = 2}, 0, 0, 20, 20, 2, 6, 2, 2, 2},
        /* windows of 3 close at batches 3, 6, 9 and the epoch's last, 10 */
        {"accumulate 3",
         {.max_epochs = 2, .accumulate_grad_batches = 3},
         0,
         0,
         20,
         8,
         2,
         6,
         2,
         2,
         2},
        /* stops inside epoch 0: no validation (batch 7 is no val-check batch); the cut epoch
         * still ends, so current_epoch is 1 */
        {"max_steps 7", {.max_steps = 7}, 0, 0, 7, 7, 0, 0, 2, 1, 1},
        /* 5 steps in epoch 0 (validated at its end), steps 6 and 7 at batches 2 and 4 of 1 */
        {"max_steps 7, accumulate 2",
         {.max_steps = 7, .accumulate_grad_batches = 2},
         0,
         0,
         14,
         7,
         1,
         3,
         2,
         2,
         2},
        /* every max(1, int(10 * 0.25)) = 2 batches: 2, 4, 6, 8, 10 */
        {"val_check_interval 0.25",
         {.max_epochs = 1, .val_check_interval = FG_FRACTION(0.25)},
         0,
         0,
         10,
         10,
         5,
         15,
         2,
         1,
         1},
        /* an int: batches 3, 6, 9 of each epoch, none after batch 10 */
        {"val_check_interval 3",
         {.max_epochs = 2, .val_check_interval = FG_COUNT(3)},
         0,
         0,
         20,
         20,
         6,
         18,
         2,
         2,
         2},
        /* check_val_every_n_epoch None: every 4 batches of the run, 4, 8, ..., 28 */
        {"val every 4 batches of the run",
         {.max_epochs = 3, .val_check_interval = FG_COUNT(4), .check_val_every_n_epoch = -1},
         0,
         0,
         30,
         30,
         7,
         21,
         2,
         3,
         3},
        /* epochs 1 and 3 (0-based) */
        {"check_val_every_n_epoch 2",
         {.max_epochs = 5, .check_val_every_n_epoch = 2},
         0,
         0,
         50,
         50,
         2,
         6,
         2,
         5,
         5},
        {"limit_train_batches 4",
         {.max_epochs = 2, .limit_train_batches = FG_COUNT(4)},
         0,
         0,
         8,
         8,
         2,
         6,
         2,
         2,
         2},
        {"limit_train_batches 0.5",
         {.max_epochs = 2, .limit_train_batches = FG_FRACTION(0.5)},
         0,
         0,
         10,
         10,
         2,
         6,
         2,
         2,
         2},
        /* the sanity check runs min(2, 1) batches */
        {"limit_val_batches 1",
         {.max_epochs = 1, .limit_val_batches = FG_COUNT(1)},
         0,
         0,
         10,
         10,
         1,
         1,
         1,
         1,
         1},
        {"limit_val_batches 0",
         {.max_epochs = 1, .limit_val_batches = FG_COUNT(0)},
         0,
         0,
         10,
         10,
         0,
         0,
         0,
         1,
         1},
        /* one batch of each, no sanity check, one epoch */
        {"fast_dev_run", {.fast_dev_run = 1}, 0, 0, 1, 1, 1, 1, 0, 1, 1},
        /* 3 batches: a window of 2 and the epoch's last batch */
        {"fast_dev_run 3, accumulate 2",
         {.fast_dev_run = 3, .accumulate_grad_batches = 2},
         0,
         0,
         3,
         2,
         1,
         3,
         0,
         1,
         1},
        {"no sanity check",
         {.max_epochs = 1, .num_sanity_val_steps = FG_COUNT(0)},
         0,
         0,
         10,
         10,
         1,
         3,
         0,
         1,
         1},
        {"sanity check of all",
         {.max_epochs = 1, .num_sanity_val_steps = FG_COUNT(-1)},
         0,
         0,
         10,
         10,
         1,
         3,
         3,
         1,
         1},
        /* asked to stop after epoch 0, but min_epochs 3 keeps it going to 3 */
        {"should_stop before min_epochs",
         {.max_epochs = 10, .min_epochs = 3},
         0,
         1,
         30,
         30,
         3,
         9,
         2,
         3,
         3},
        /* stopping at a batch end validates first (Lightning runs validation when stopping) */
        {"should_stop mid-epoch", {.max_epochs = 10}, 5, 0, 5, 5, 1, 3, 2, 1, 1},
        /* windows of 4: steps at 4, 8, 10; validation at 3, 6, 9 (mid-window) */
        {"accumulate 4, val every 3",
         {.max_epochs = 1, .accumulate_grad_batches = 4, .val_check_interval = FG_COUNT(3)},
         0,
         0,
         10,
         3,
         3,
         9,
         2,
         1,
         1},
        /* stop asked after epoch 0, allowed at step 25 (batch 5 of epoch 2), validating there */
        {"should_stop before min_steps",
         {.max_epochs = 10, .min_steps = 25},
         0,
         1,
         25,
         25,
         3,
         9,
         2,
         3,
         3},
        {"max_epochs -1, max_steps 25",
         {.max_epochs = -1, .max_steps = 25},
         0,
         0,
         25,
         25,
         2,
         6,
         2,
         3,
         3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
}

TEST(resolved_defaults) {
    tu_clean_env();
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.logger = FG_OFF});
    CHECK(t && fg_trainer_max_epochs(t) == 1000 && fg_trainer_max_steps(t) == -1);
    CHECK(t && fg_trainer_log_every_n_steps(t) == 50 && fg_trainer_accumulate_grad_batches(t) == 1);
    CHECK(t && !strcmp(fg_trainer_default_root_dir(t), "."));
    fg_trainer_free(t);
    t = fg_trainer_new(&(fg_trainer_opts){.max_steps = 100, .logger = FG_OFF});
    CHECK(t && fg_trainer_max_epochs(t) == -1);
    fg_trainer_free(t);
    t = fg_trainer_new(&(fg_trainer_opts){.max_time = 60, .logger = FG_OFF});
    CHECK(t && fg_trainer_max_epochs(t) == -1);
    fg_trainer_free(t);
    t = fg_trainer_new(&(fg_trainer_opts){.fast_dev_run = 2, .max_epochs = 7, .logger = FG_OFF});
    CHECK(t && fg_trainer_max_epochs(t) == 1 && fg_trainer_max_steps(t) == 2);
    fg_trainer_free(t);
}

TEST(bad_options_are_named) {
    tu_clean_env();
    const struct {
        fg_trainer_opts o;
        const char *words;
    } bad[] = {
        {{.max_epochs = -2}, "max_epochs=-2"},
        {{.max_steps = -5}, "max_steps=-5"},
        {{.accumulate_grad_batches = -1}, "accumulate_grad_batches=-1"},
        {{.gradient_clip_val = -1}, "gradient_clip_val=-1"},
        {{.gradient_clip_algorithm = (fg_clip_algorithm)7}, "gradient_clip_algorithm=7"},
        {{.val_check_interval = FG_FRACTION(1.5)}, "val_check_interval=FG_FRACTION(1.5)"},
        {{.val_check_interval = FG_COUNT(0)}, "val_check_interval=FG_COUNT(0)"},
        {{.limit_val_batches = FG_COUNT(2.5)}, "limit_val_batches=FG_COUNT(2.5)"},
        {{.check_val_every_n_epoch = -1}, "needs val_check_interval=FG_COUNT(n)"},
        {{.num_sanity_val_steps = FG_FRACTION(0.5)}, "num_sanity_val_steps is a count"},
        {{.max_time = -3}, "max_time=-3"},
        {{.enable_progress_bar = (fg_flag)5}, "enable_progress_bar=5"},
        {{.devices = "abc"}, "devices=\"abc\""},
        {{.precision = "bf16-tru"}, "bf16-tru"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fg_trainer_opts o = bad[i].o;
        o.logger = FG_OFF;
        fg_trainer *t = fg_trainer_new(&o);
        CHECK_MSG(!t, "case %zu accepted", i);
        CHECK_CONTAINS(fg_last_error(), bad[i].words);
        fg_trainer_free(t);
    }
    fg_callback *ck = fg_model_checkpoint_new(NULL);
    fg_callback *cbs[] = {ck};
    CHECK(!fg_trainer_new(&(fg_trainer_opts){
        .callbacks = cbs, .ncallbacks = 1, .enable_checkpointing = FG_OFF, .logger = FG_OFF}));
    CHECK_CONTAINS(fg_last_error(), "enable_checkpointing=FG_OFF but a ModelCheckpoint");
    fg_callback *twice[] = {ck, ck};
    CHECK(
        !fg_trainer_new(&(fg_trainer_opts){.callbacks = twice, .ncallbacks = 2, .logger = FG_OFF}));
    CHECK_CONTAINS(fg_last_error(), "state key");
    fg_callback_free(ck);
}

/* val_check_interval past the epoch is Lightning's error, raised by fit */
TEST(val_check_interval_past_the_epoch) {
    tu_clean_env();
    fg_dataset *tr = tu_dataset(40, 11), *va = tu_dataset(12, 12);
    fg_dataloader *tl = tu_loader(tr, 4, true), *vl = tu_loader(va, 4, false);
    tu_module m = {0};
    tu_module_init(&m);
    fg_lightning_module lm = tu_lm(&m);
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 1,
                                                      .val_check_interval = FG_COUNT(11),
                                                      .devices = "1",
                                                      .enable_progress_bar = FG_OFF,
                                                      .enable_checkpointing = FG_OFF,
                                                      .logger = FG_OFF});
    CHECK_STATUS(fg_trainer_fit(t, &lm, tl, vl, NULL), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "val_check_interval=FG_COUNT(11) must be at most the 10");
    /* a module without training_step is refused before anything runs */
    lm.training_step = NULL;
    CHECK_STATUS(fg_trainer_fit(t, &lm, tl, vl, NULL), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "training_step");
    fg_trainer_free(t);
    fg_dataloader_free(tl);
    fg_dataloader_free(vl);
    fg_dataset_free(tr);
    fg_dataset_free(va);
    fg_module_free(m.net);
}

/* fast_dev_run writes no checkpoint and no log, even with the defaults on */
TEST(fast_dev_run_writes_nothing) {
    tu_clean_env();
    const char *root = tu_subdir("fdr");
    fg_dataset *tr = tu_dataset(40, 11), *va = tu_dataset(12, 12);
    fg_dataloader *tl = tu_loader(tr, 4, true), *vl = tu_loader(va, 4, false);
    tu_module m = {.log_train = true, .log_val = true};
    tu_module_init(&m);
    fg_lightning_module lm = tu_lm(&m);
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){
        .fast_dev_run = 2, .default_root_dir = root, .enable_progress_bar = FG_OFF});
    CHECK_OK(fg_trainer_fit(t, &lm, tl, vl, NULL));
    char names[512];
    tu_list(root, "", names, sizeof names);
    CHECK_MSG(names[0] == '\0', "fast_dev_run wrote: %s", names);
    CHECK(m.c.train_steps == 2 && m.c.val_steps == 2);
    fg_trainer_free(t);
    fg_dataloader_free(tl);
    fg_dataloader_free(vl);
    fg_dataset_free(tr);
    fg_dataset_free(va);
    fg_module_free(m.net);
}

/* validate, test and predict run their steps over their limits */
TEST(validate_test_predict) {
    tu_clean_env();
    fg_dataset *va = tu_dataset(12, 12);
    fg_dataloader *vl = tu_loader(va, 4, false);
    tu_module m = {.log_val = true};
    tu_module_init(&m);
    fg_lightning_module lm = tu_lm(&m);
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.limit_test_batches = FG_COUNT(2),
                                                      .devices = "1",
                                                      .enable_progress_bar = FG_OFF,
                                                      .logger = FG_OFF});
    CHECK_OK(fg_trainer_validate(t, &lm, vl, NULL));
    CHECK(m.c.val_steps == 3 && m.c.val_runs == 1);
    double v = 0;
    CHECK(fg_trainer_callback_metric(t, "val_loss", &v) && v > 0);
    CHECK_OK(fg_trainer_test(t, &lm, vl, NULL));
    CHECK(m.c.test_steps == 2);
    CHECK(fg_trainer_callback_metric(t, "test_loss", &v) && v > 0);
    CHECK(!fg_trainer_callback_metric(t, "val_loss", NULL)); /* each entry point starts afresh */
    CHECK_OK(fg_trainer_predict(t, &lm, vl, NULL));
    CHECK(m.c.predict_steps == 3);
    CHECK(fg_trainer_global_step(t) == 0);
    fg_trainer_free(t);
    fg_dataloader_free(vl);
    fg_dataset_free(va);
    fg_module_free(m.net);
}

/* one launch, several entry points: fg_trainer_launch, and a handed fabric */
typedef struct launch_arg {
    tu_module *m;
    fg_dataloader *tl, *vl;
} launch_arg;

static int fit_then_test(fg_trainer *t, void *arg) {
    launch_arg *a = arg;
    fg_lightning_module lm = tu_lm(a->m);
    CHECK(fg_fabric_running(fg_trainer_fabric(t)));
    if (fg_trainer_fit(t, &lm, a->tl, a->vl, NULL) != FG_OK) return 1;
    if (fg_trainer_test(t, &lm, a->vl, NULL) != FG_OK) return 1;
    return fg_trainer_validate(t, &lm, a->vl, NULL) != FG_OK;
}

static int fabric_run(fg_fabric *f, void *arg) {
    launch_arg *a = arg;
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.fabric = f,
                                                      .max_epochs = 1,
                                                      .enable_progress_bar = FG_OFF,
                                                      .enable_checkpointing = FG_OFF,
                                                      .logger = FG_OFF});
    int rc = t ? fit_then_test(t, a) : 1;
    fg_trainer_free(t);
    return rc;
}

TEST(launch_once_fit_then_test) {
    tu_clean_env();
    fg_dataset *tr = tu_dataset(40, 11), *va = tu_dataset(12, 12);
    fg_dataloader *tl = tu_loader(tr, 4, true), *vl = tu_loader(va, 4, false);
    for (int handed = 0; handed < 2; handed++) {
        tu_module m = {.log_val = true};
        tu_module_init(&m);
        launch_arg a = {&m, tl, vl};
        int rc;
        if (handed) {
            fg_fabric *f = fg_fabric_new(&(fg_fabric_config){.devices = "1"});
            rc = fg_fabric_launch(f, fabric_run, &a);
            fg_fabric_free(f);
        } else {
            fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 1,
                                                              .devices = "1",
                                                              .enable_progress_bar = FG_OFF,
                                                              .enable_checkpointing = FG_OFF,
                                                              .logger = FG_OFF});
            rc = fg_trainer_launch(t, fit_then_test, &a);
            fg_trainer_free(t);
        }
        CHECK_MSG(rc == 0, "%s", fg_last_error());
        CHECK(m.c.opt_steps == 10 && m.c.test_steps == 3 && m.c.val_runs == 2);
        fg_module_free(m.net);
    }
    fg_dataloader_free(tl);
    fg_dataloader_free(vl);
    fg_dataset_free(tr);
    fg_dataset_free(va);
}
