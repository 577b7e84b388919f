/* ModelCheckpoint's monitor is checked at the end of the first validation
 * of a fit: a name that validation did not log (a misspelt "val_los") is an
 * error there, naming the monitor and the keys logged, not at the first
 * save many steps later (nor never, when no validation runs at all). A
 * monitor that is logged trains to the end. One process. */
#include "trainer_test_util.h"

typedef struct mon_run {
    fg_status status;
    int64_t global_step;
    tu_counts c;
} mon_run;

static mon_run fit_with(const char *monitor, bool with_val, const char *dir) {
    tu_clean_env();
    fg_dataset *tr = tu_dataset(40, 11), *va = tu_dataset(12, 12);
    fg_dataloader *tl = tu_loader(tr, 4, true), *vl = tu_loader(va, 4, false);
    tu_module m = {.log_val = true};
    tu_module_init(&m);
    fg_lightning_module lm = tu_lm(&m);
    /* validation every 5 steps, the first save at step 25 */
    fg_callback *ck = fg_model_checkpoint_new(&(fg_checkpoint_opts){
        .dirpath = dir, .monitor = monitor, .save_top_k = 2, .every_n_train_steps = 25});
    CHECK_MSG(ck != NULL, "%s", fg_last_error());
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 3,
                                                      .devices = "1",
                                                      .callbacks = &ck,
                                                      .ncallbacks = 1,
                                                      .val_check_interval = FG_COUNT(5),
                                                      .num_sanity_val_steps = FG_COUNT(0),
                                                      .enable_progress_bar = FG_OFF,
                                                      .logger = FG_OFF});
    CHECK_MSG(t != NULL, "%s", fg_last_error());
    mon_run r = {.status =
                     t ? fg_trainer_fit(t, &lm, tl, with_val ? vl : NULL, NULL) : fg_last_status()};
    r.global_step = t ? fg_trainer_global_step(t) : -1;
    r.c = m.c;
    fg_trainer_free(t);
    fg_callback_free(ck);
    fg_dataloader_free(tl);
    fg_dataloader_free(vl);
    fg_dataset_free(tr);
    fg_dataset_free(va);
    fg_module_free(m.net);
    return r;
}

TEST(a_monitor_the_first_validation_did_not_log_is_an_error_there) {
    mon_run r = fit_with("val_los", true, tu_subdir("misspelt"));
    CHECK_STATUS(r.status, FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "monitor=\"val_los\"");
    CHECK_CONTAINS(fg_last_error(), "val_loss"); /* the keys logged */
    CHECK_MSG(r.global_step == 5 && r.c.val_runs == 1,
              "stopped at step %lld after %lld validations", (long long)r.global_step,
              (long long)r.c.val_runs);
}

TEST(without_validation_a_monitor_not_logged_is_an_error_at_the_first_save) {
    mon_run r = fit_with("val_loss", false, tu_subdir("noval"));
    CHECK_STATUS(r.status, FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "monitor=\"val_loss\"");
    CHECK(r.global_step == 25);
}

TEST(a_logged_monitor_trains_to_the_end) {
    mon_run r = fit_with("val_loss", true, tu_subdir("logged"));
    CHECK_MSG(r.status == FG_OK, "%s", fg_last_error());
    CHECK(r.global_step == 30);
}
