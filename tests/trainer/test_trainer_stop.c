/* How a fit ends besides max_steps/max_epochs: a stop request (a signal
 * handler's fg_fabric_request_stop) saves that step and resumes bitwise;
 * ModelCheckpoint's save_last="link" and save_on_fit_end; on_nonfinite stop
 * and skip. */
#include <math.h>
#include <sys/stat.h>

#include "trainer_test_util.h"

typedef struct ender {
    int64_t request_at; /* > 0: request a stop at the end of this global step */
    int64_t nan_at;     /* > 0: the loss of the batch at this global step is NaN, once */
    bool nan_done;
    tu_module *m;
} ender;

static fg_status end_batch_end(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)b;
    (void)i;
    ender *e = ud;
    if (e->request_at && fg_trainer_global_step(t) == e->request_at)
        fg_fabric_request_stop(fg_trainer_fabric(t));
    return FG_OK;
}

static ender *g_ender;
static bool g_sharded; /* the fabric saves sharded folders (state_dict_type sharded) */

static fg_tensor *nan_training_step(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    fg_tensor *loss = tu_training_step(ud, t, b, i);
    if (loss && g_ender && !g_ender->nan_done && fg_trainer_global_step(t) == g_ender->nan_at) {
        g_ender->nan_done = true;
        return fg_scale(loss, NAN);
    }
    return loss;
}

typedef struct run_out {
    fg_status status;
    char error[1024];
    int64_t step, skipped, train_end;
    bool interrupted;
    char skip_reason[256], last_saved[1024];
    void *params;
    size_t bytes;
} run_out;

/* A fit of 40 samples in batches of 4 (10 batches an epoch) to max_steps,
 * checkpoints "step-{step:03d}" in dir with save_last="link". */
static void run(const char *dir, int64_t max_steps, int64_t every, bool fit_end, ender *e,
                fg_nonfinite nonfinite, const char *ckpt, run_out *out) {
    fg_dataset *tr = tu_dataset(40, 11);
    fg_dataloader *tl = tu_loader(tr, 4, true);
    tu_module m = {.adamw = true, .dropout = 0.2};
    tu_module_init(&m);
    fg_lightning_module lm = tu_lm(&m);
    lm.training_step = nan_training_step;
    g_ender = e;
    fg_callback *cbs[2] = {
        fg_model_checkpoint_new(&(fg_checkpoint_opts){.dirpath = dir,
                                                      .filename = "step-{step:03d}",
                                                      .no_auto_insert_metric_name = true,
                                                      .save_top_k = -1,
                                                      .save_last_link = true,
                                                      .every_n_train_steps = every,
                                                      .every_n_epochs = 1000000,
                                                      .save_on_fit_end = fit_end}),
        fg_callback_new(&(fg_callback_ops){.name = "ender", .on_train_batch_end = end_batch_end},
                        e)};
    fg_fabric *f =
        g_sharded
            ? fg_fabric_new(&(fg_fabric_config){
                  .devices = "1", .seed = 5, .sharded.state_dict_type = FG_STATE_DICT_SHARDED})
            : NULL;
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_steps = max_steps,
                                                      .seed = f ? 0 : 5,
                                                      .devices = f ? NULL : "1",
                                                      .fabric = f,
                                                      .on_nonfinite = nonfinite,
                                                      .callbacks = cbs,
                                                      .ncallbacks = 2,
                                                      .enable_progress_bar = FG_OFF,
                                                      .logger = FG_OFF});
    CHECK(t != NULL);
    out->status = fg_trainer_fit(t, &lm, tl, NULL, ckpt);
    snprintf(out->error, sizeof out->error, "%s", out->status ? fg_last_error() : "");
    out->step = fg_trainer_global_step(t);
    out->interrupted = fg_trainer_interrupted(t);
    const char *why;
    out->skipped = fg_trainer_skipped_steps(t, &why);
    snprintf(out->skip_reason, sizeof out->skip_reason, "%s", why);
    snprintf(out->last_saved, sizeof out->last_saved, "%s", fg_trainer_last_saved_path(t));
    out->train_end = m.c.train_end;
    fg_tensor *p = fg_module_flat_params(m.net);
    out->bytes = fg_tensor_nbytes(p);
    out->params = malloc(out->bytes);
    memcpy(out->params, fg_tensor_data(p), out->bytes);
    fg_trainer_free(t);
    fg_fabric_free(f);
    fg_callback_free(cbs[0]);
    fg_callback_free(cbs[1]);
    fg_dataloader_free(tl);
    fg_dataset_free(tr);
    fg_module_free(m.net);
    g_ender = NULL;
}

static bool link_names(const char *dir, const char *want) {
    char path[600], target[600];
    snprintf(path, sizeof path, "%s/last.safetensors", dir);
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n < 0) return false;
    target[n] = '\0';
    return !strcmp(target, want);
}

TEST(stop_request_saves_and_resumes_bitwise) {
    run_out whole = {0}, stopped = {0}, resumed = {0};
    ender none = {0};
    run(tu_subdir("whole"), 14, 0, true, &none, FG_NONFINITE_IGNORE, NULL, &whole);
    CHECK_OK(whole.status);
    CHECK(whole.step == 14 && !whole.interrupted && whole.train_end == 1);

    const char *dir = tu_subdir("stopped");
    ender stop = {.request_at = 6};
    run(dir, 14, 0, true, &stop, FG_NONFINITE_IGNORE, NULL, &stopped);
    CHECK_OK(stopped.status);
    CHECK_MSG(stopped.interrupted && stopped.step == 6, "step %lld", (long long)stopped.step);
    CHECK(stopped.train_end == 0); /* Lightning's interrupt: no end hooks */
    CHECK(strstr(stopped.last_saved, "/step-006.safetensors") != NULL);
    CHECK(link_names(dir, "step-006.safetensors"));

    /* the same fit from "last" ends where the uninterrupted one did, bitwise
     * (mid-epoch: batch 6 of 10, dropout on) */
    ender none2 = {0};
    run(dir, 14, 0, true, &none2, FG_NONFINITE_IGNORE, "last", &resumed);
    CHECK_OK(resumed.status);
    CHECK(resumed.step == 14 && !resumed.interrupted);
    CHECK(resumed.bytes == whole.bytes && !memcmp(resumed.params, whole.params, whole.bytes));
    CHECK(link_names(dir, "step-014.safetensors"));
    free(whole.params);
    free(stopped.params);
    free(resumed.params);
}

/* The same through sharded saves: "last" links a folder, and ckpt_path
 * "last" finds it. */
TEST(stop_and_resume_through_sharded_folders) {
    run_out whole = {0}, stopped = {0}, resumed = {0};
    ender none = {0}, stop = {.request_at = 6}, none2 = {0};
    run(tu_subdir("whole-sh"), 14, 0, true, &none, FG_NONFINITE_IGNORE, NULL, &whole);
    g_sharded = true;
    const char *dir = tu_subdir("stopped-sh");
    run(dir, 14, 0, true, &stop, FG_NONFINITE_IGNORE, NULL, &stopped);
    CHECK_OK(stopped.status);
    CHECK(stopped.interrupted && stopped.step == 6 && link_names(dir, "step-006.safetensors"));
    char folder[600];
    snprintf(folder, sizeof folder, "%s/step-006.safetensors", dir);
    struct stat sb;
    CHECK(stat(folder, &sb) == 0 && S_ISDIR(sb.st_mode));
    run(dir, 14, 0, true, &none2, FG_NONFINITE_IGNORE, "last", &resumed);
    g_sharded = false;
    CHECK_OK(resumed.status);
    CHECK(resumed.step == 14);
    CHECK(resumed.bytes == whole.bytes && !memcmp(resumed.params, whole.params, whole.bytes));
    free(whole.params);
    free(stopped.params);
    free(resumed.params);
}

TEST(save_on_fit_end_and_last_link) {
    const char *dir = tu_subdir("fitend");
    run_out o = {0};
    ender none = {0};
    run(dir, 7, 5, true, &none, FG_NONFINITE_IGNORE, NULL, &o);
    CHECK_OK(o.status);
    char names[512];
    tu_list(dir, ".safetensors", names, sizeof names);
    CHECK_MSG(!strcmp(names, "last.safetensors step-005.safetensors step-007.safetensors"), "%s",
              names);
    CHECK(link_names(dir, "step-007.safetensors"));
    free(o.params);
    /* without save_on_fit_end the end of the run is not saved */
    dir = tu_subdir("nofitend");
    run(dir, 7, 5, false, &none, FG_NONFINITE_IGNORE, NULL, &o);
    tu_list(dir, ".safetensors", names, sizeof names);
    CHECK_MSG(!strcmp(names, "last.safetensors step-005.safetensors"), "%s", names);
    CHECK(link_names(dir, "step-005.safetensors"));
    free(o.params);
}

TEST(nonfinite_stop_names_step_and_last_finite_checkpoint) {
    const char *dir = tu_subdir("nanstop");
    run_out o = {0};
    ender e = {.nan_at = 3};
    run(dir, 10, 1, true, &e, FG_NONFINITE_STOP, NULL, &o);
    CHECK(o.status == FG_EINVAL);
    CHECK_MSG(strstr(o.error, "step 4: the loss is not finite; stopped on every rank (last "
                              "checkpoint with finite weights: ") &&
                  strstr(o.error, "/step-003.safetensors)"),
              "%s", o.error);
    CHECK(o.step == 3);
    free(o.params);
}

TEST(nonfinite_skip_skips_one_step_and_counts_it) {
    run_out o = {0}, ignore = {0};
    ender e = {.nan_at = 3};
    run(tu_subdir("nanskip"), 10, 0, false, &e, FG_NONFINITE_SKIP, NULL, &o);
    CHECK_OK(o.status);
    CHECK(o.step == 10 && o.skipped == 1);
    CHECK_MSG(!strcmp(o.skip_reason, "step 4: the loss is not finite"), "%s", o.skip_reason);
    const float *p = o.params;
    bool finite = true;
    for (size_t i = 0; i < o.bytes / sizeof(float); i++) finite = finite && isfinite(p[i]);
    CHECK(finite);
    /* ignored (Lightning's default), the NaN reaches the weights */
    ender e2 = {.nan_at = 3};
    run(tu_subdir("nanignore"), 10, 0, false, &e2, FG_NONFINITE_IGNORE, NULL, &ignore);
    CHECK_OK(ignore.status);
    CHECK(ignore.skipped == 0 && ignore.step == 10);
    p = ignore.params;
    finite = true;
    for (size_t i = 0; i < ignore.bytes / sizeof(float); i++) finite = finite && isfinite(p[i]);
    CHECK(!finite);
    free(o.params);
    free(ignore.params);
}

TEST(bad_on_nonfinite_is_refused) {
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.on_nonfinite = (fg_nonfinite)7});
    CHECK(t == NULL && fg_last_status() == FG_EINVAL);
    CHECK(strstr(fg_last_error(), "on_nonfinite=7") != NULL);
}
