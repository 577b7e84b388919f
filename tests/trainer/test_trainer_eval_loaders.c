/* Several validation and test loaders (Lightning's list of
 * val_dataloaders): each loader in turn, fg_trainer_dataloader_idx during
 * its batches, step values named "<name>/dataloader_idx_<i>" and each the
 * value a validation over that loader alone gives, epoch-hook values
 * unnamed, the sanity check's limit per loader, test the same, metrics.csv
 * columns, the refusals. */
#include "trainer_test_util.h"

typedef struct ev_module {
    tu_module tu;
    char seen[128]; /* the dataloader_idx of each validation batch, in order */
    int64_t sanity_batches;
} ev_module;

static fg_status ev_val(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)i;
    ev_module *m = ud;
    size_t n = strlen(m->seen);
    if (fg_trainer_stage(t) == FG_STAGE_SANITY_CHECK) m->sanity_batches++;
    else if (n + 1 < sizeof m->seen) m->seen[n] = (char)('0' + fg_trainer_dataloader_idx(t));
    fg_tensor *loss = tu_loss(&m->tu, b);
    if (!loss) return fg_last_status();
    return fg_trainer_log(t, fg_trainer_stage(t) == FG_STAGE_TEST ? "test_loss" : "val_loss",
                          fg_item(loss), NULL);
}

static fg_status ev_val_epoch_end(void *ud, fg_trainer *t) {
    (void)ud;
    return fg_trainer_log(t, "val_runs_seen", 1, &(fg_log_opts){.reduce_fx = FG_REDUCE_FX_SUM});
}

static void ev_setup(ev_module *m, fg_lightning_module *lm) {
    tu_module_init(&m->tu);
    *lm = tu_lm(&m->tu);
    lm->ud = m;
    lm->validation_step = ev_val;
    lm->test_step = ev_val;
    lm->on_validation_epoch_end = ev_val_epoch_end;
    lm->on_train_epoch_start = lm->on_train_epoch_end = NULL;
    lm->on_train_batch_end = NULL;
    lm->on_before_optimizer_step = NULL;
}

static fg_trainer *ev_trainer(int64_t epochs, const char *dir, fg_logger **csv) {
    return fg_trainer_new(&(fg_trainer_opts){.max_epochs = epochs,
                                             .devices = "1",
                                             .loggers = csv,
                                             .nloggers = csv ? 1 : 0,
                                             .logger = csv ? FG_FLAG_DEFAULT : FG_OFF,
                                             .default_root_dir = dir,
                                             .enable_progress_bar = FG_OFF,
                                             .enable_checkpointing = FG_OFF});
}

TEST(two_validation_loaders) {
    tu_clean_env();
    const char *d = tu_subdir("two");
    char dir[600];
    snprintf(dir, sizeof dir, "%s", d);
    fg_dataset *tr = tu_dataset(16, 11), *v0 = tu_dataset(12, 12), *v1 = tu_dataset(8, 13);
    fg_dataloader *tl = tu_loader(tr, 4, true), *l0 = tu_loader(v0, 4, false),
                  *l1 = tu_loader(v1, 4, false);
    ev_module m = {0};
    fg_lightning_module lm;
    ev_setup(&m, &lm);
    fg_logger *csv = fg_csv_logger_new(&(fg_csv_logger_opts){.save_dir = dir, .version = "v"});
    fg_trainer *t = ev_trainer(2, dir, &csv);
    fg_dataloader *vals[] = {l0, l1};
    CHECK_OK(fg_trainer_fit_loaders(t, &lm, tl, vals, 2, NULL));
    /* each epoch: loader 0's 3 batches, then loader 1's 2 */
    CHECK_MSG(!strcmp(m.seen, "0001100011"), "dataloader_idx order %s", m.seen);
    CHECK_MSG(m.sanity_batches == 4, "%lld sanity batches: 2 of each", (long long)m.sanity_batches);
    double a = NAN, b = NAN, runs = NAN, plain;
    CHECK(fg_trainer_callback_metric(t, "val_loss/dataloader_idx_0", &a));
    CHECK(fg_trainer_callback_metric(t, "val_loss/dataloader_idx_1", &b));
    CHECK(!fg_trainer_callback_metric(t, "val_loss", &plain));
    CHECK(fg_trainer_callback_metric(t, "val_runs_seen", &runs) && runs == 1);
    CHECK(fg_trainer_num_val_batches(t) == 5);
    /* each is the value of a validation over its loader alone */
    CHECK_OK(fg_trainer_validate(t, &lm, l1, NULL));
    CHECK(fg_trainer_callback_metric(t, "val_loss", &plain));
    CHECK_MSG(!memcmp(&plain, &b, sizeof b), "loader 1: %.17g alone, %.17g of two", plain, b);
    CHECK_OK(fg_trainer_validate(t, &lm, l0, NULL));
    CHECK(fg_trainer_callback_metric(t, "val_loss", &plain) && !memcmp(&plain, &a, sizeof a));
    /* test over both */
    CHECK_OK(fg_trainer_test_loaders(t, &lm, vals, 2, NULL));
    CHECK(fg_trainer_callback_metric(t, "test_loss/dataloader_idx_0", &plain));
    CHECK(fg_trainer_callback_metric(t, "test_loss/dataloader_idx_1", &plain));
    fg_trainer_free(t);
    char path[1024];
    snprintf(path, sizeof path, "%s/lightning_logs/v/metrics.csv", dir);
    char *text = tu_read(path);
    CHECK(text != NULL);
    if (text) {
        CHECK_CONTAINS(text, "val_loss/dataloader_idx_0");
        CHECK_CONTAINS(text, "val_loss/dataloader_idx_1");
        free(text);
    }
    /* refusals */
    t = ev_trainer(1, dir, NULL);
    CHECK_STATUS(fg_trainer_fit_loaders(t, &lm, tl, vals, 0, NULL), FG_EINVAL);
    fg_dataloader *bad[] = {l0, NULL};
    CHECK_STATUS(fg_trainer_validate_loaders(t, &lm, bad, 2, NULL), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "loader 1 of 2 is NULL");
    fg_trainer_free(t);
    fg_logger_free(csv);
    fg_dataloader_free(tl);
    fg_dataloader_free(l0);
    fg_dataloader_free(l1);
    fg_dataset_free(tr);
    fg_dataset_free(v0);
    fg_dataset_free(v1);
    fg_module_free(m.tu.net);
}
