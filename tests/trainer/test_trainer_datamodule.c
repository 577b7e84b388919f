/* The DataModule (Lightning's LightningDataModule) handed to the entry
 * points: prepare_data once per node on its local rank 0 (the others
 * wait; its failure fails every rank), setup before the module's, the
 * loaders from its hooks, teardown after the module's (also after a
 * failure); on one process and on 2 ranks. */
#include "trainer_test_util.h"

typedef struct dm_state {
    int64_t prepared, setups, teardowns, loaders;
    bool fail_prepare;
    char order[256];
    fg_dataset *tr, *va;
    fg_dataloader *tl, *vl;
} dm_state;

static void note(dm_state *d, const char *what) {
    size_t n = strlen(d->order);
    snprintf(d->order + n, sizeof d->order - n, "%s%s", n ? " " : "", what);
}

static fg_status dm_prepare(void *ud, fg_trainer *t) {
    (void)t;
    dm_state *d = ud;
    d->prepared++;
    note(d, "prepare");
    return d->fail_prepare ? fg_error(FG_EIO, "no disk space for the download") : FG_OK;
}
static fg_status dm_setup(void *ud, fg_trainer *t, fg_trainer_fn fn) {
    (void)t;
    dm_state *d = ud;
    d->setups++;
    note(d, fn == FG_FIT ? "dm.setup(fit)" : fn == FG_TEST ? "dm.setup(test)" : "dm.setup");
    if (!d->tr) {
        d->tr = tu_dataset(fg_trainer_world_size(t) * 16, 11);
        d->va = tu_dataset(fg_trainer_world_size(t) * 8, 12);
    }
    return FG_OK;
}
static void dm_teardown(void *ud, fg_trainer *t, fg_trainer_fn fn) {
    (void)t;
    (void)fn;
    dm_state *d = ud;
    d->teardowns++;
    note(d, "dm.teardown");
    fg_dataloader_free(d->tl);
    fg_dataloader_free(d->vl);
    d->tl = d->vl = NULL;
}
static fg_dataloader *dm_train(void *ud, fg_trainer *t) {
    (void)t;
    dm_state *d = ud;
    d->loaders++;
    return d->tl = tu_loader(d->tr, 4, true);
}
static fg_dataloader *dm_val(void *ud, fg_trainer *t) {
    (void)t;
    dm_state *d = ud;
    d->loaders++;
    return d->vl = tu_loader(d->va, 4, false);
}

static dm_state *k_dm; /* the module's hooks note into the data module's order */
static fg_status mod_setup(void *ud, fg_trainer *t, fg_trainer_fn fn) {
    (void)ud;
    (void)t;
    (void)fn;
    note(k_dm, "module.setup");
    return FG_OK;
}
static void mod_teardown(void *ud, fg_trainer *t, fg_trainer_fn fn) {
    (void)ud;
    (void)t;
    (void)fn;
    note(k_dm, "module.teardown");
}

static fg_status run_dm(dm_state *d, bool launched, int64_t *val_steps) {
    if (!launched) tu_clean_env();
    k_dm = d;
    tu_module m = {.log_val = true};
    tu_module_init(&m);
    fg_lightning_module lm = tu_lm(&m);
    lm.setup = mod_setup;
    lm.teardown = mod_teardown;
    fg_datamodule dm = {.ud = d,
                        .prepare_data = dm_prepare,
                        .setup = dm_setup,
                        .teardown = dm_teardown,
                        .train_dataloader = dm_train,
                        .val_dataloader = dm_val,
                        .test_dataloader = dm_val};
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 2,
                                                      .devices = launched ? NULL : "1",
                                                      .strategy = launched ? "ddp" : NULL,
                                                      .num_sanity_val_steps = FG_COUNT(0),
                                                      .enable_progress_bar = FG_OFF,
                                                      .enable_checkpointing = FG_OFF,
                                                      .logger = FG_OFF});
    fg_status s = fg_trainer_fit_datamodule(t, &lm, &dm, NULL);
    if (s == FG_OK) {
        CHECK(fg_trainer_global_step(t) == 8); /* 16 samples a rank, batch 4, 2 epochs */
        s = fg_trainer_test_datamodule(t, &lm, &dm, NULL);
    }
    *val_steps = m.c.val_steps + m.c.test_steps;
    fg_trainer_free(t);
    fg_module_free(m.net);
    fg_dataset_free(d->tr);
    fg_dataset_free(d->va);
    d->tr = d->va = NULL;
    return s;
}

TEST(one_process) {
    dm_state d = {0};
    int64_t evals = 0;
    CHECK_OK(run_dm(&d, false, &evals));
    CHECK(d.prepared == 2 && d.setups == 2 && d.teardowns == 2);
    CHECK(d.loaders == 3); /* fit: train + val; test: its own */
    CHECK_MSG(evals == 2 * 2 + 2, "%lld evaluation steps", (long long)evals);
    CHECK_MSG(!strcmp(d.order, "prepare dm.setup(fit) module.setup module.teardown dm.teardown "
                               "prepare dm.setup(test) module.setup module.teardown dm.teardown"),
              "order: %s", d.order);
    /* a failed prepare_data stops the entry point, with teardown */
    dm_state f = {.fail_prepare = true};
    CHECK_STATUS(run_dm(&f, false, &evals), FG_EIO);
    CHECK_CONTAINS(fg_last_error(), "prepare_data");
    CHECK_CONTAINS(fg_last_error(), "no disk space");
    CHECK(f.teardowns == 1 && f.setups == 0);
}

static int ranks_fn(int rank, int world, void *arg) {
    bool fail = arg != NULL;
    tu_fake_launcher(rank, world, fail ? 52 : 51);
    dm_state d = {.fail_prepare = fail};
    int64_t evals = 0;
    fg_status s = run_dm(&d, true, &evals);
    if (fail) {
        /* local rank 0 fails itself; the other rank waits, then fails naming it */
        CHECK_STATUS(s, rank == 0 ? FG_EIO : FG_EPEER);
        CHECK(d.prepared == (rank == 0 ? 1 : 0));
    } else {
        CHECK_OK(s);
        CHECK_MSG(d.prepared == (rank == 0 ? 2 : 0), "rank %d prepared %lld times", rank,
                  (long long)d.prepared);
        CHECK(d.setups == 2);
    }
    return fg_cur_failed_ ? 1 : 0;
}

TEST(two_ranks_prepare_on_local_rank_0) {
    CHECK(fg_test_fork_ranks(2, ranks_fn, NULL, 300) == 0);
    CHECK(fg_test_fork_ranks(2, ranks_fn, (void *)1, 300) == 0);
    tu_clean_env();
}
