/* Checkpoints under the trainer: ModelCheckpoint keeps exactly the top k
 * by the monitored value plus "last" (and the newest, or every one, without
 * a monitor); EarlyStopping stops at the epoch its rules say; both carry
 * their state through a resume and end where an uninterrupted run ends
 * (several resumes leave the k files an uninterrupted run leaves: the
 * checkpoint resumed from leaves top-k as any other);
 * and a run resumed from a checkpoint taken anywhere (after an optimizer
 * step with its validation check pending, inside an accumulation window,
 * in a validation, at an epoch's end) ends with the same bits as one that
 * never stopped. One process. */
#include <math.h>

#include "st_rewrite.h"
#include "trainer_test_util.h"

typedef struct run_cfg {
    fg_trainer_opts o;
    fg_checkpoint_opts ck;
    bool with_ck, with_es;
    fg_early_stopping_opts es;
    const double *curve;
    int64_t ncurve;
    const char *ckpt_path;
    fg_status want; /* what fit returns (FG_OK) */
} run_cfg;

typedef struct run_out {
    tu_counts c;
    int64_t global_step, epoch, es_stopped, es_wait;
    double es_best, best_score;
    char best_path[512], files[2048];
    fg_status status;
    char msg[1024];
} run_out;

static void run(const run_cfg *cfg, const char *dir, run_out *out) {
    tu_clean_env();
    fg_dataset *tr = tu_dataset(40, 11), *va = tu_dataset(12, 12);
    fg_dataloader *tl = tu_loader(tr, 4, true), *vl = tu_loader(va, 4, false);
    tu_module m = {.log_val = true, .val_curve = cfg->curve, .val_curve_n = cfg->ncurve};
    tu_module_init(&m);
    fg_lightning_module lm = tu_lm(&m);
    fg_checkpoint_opts ck = cfg->ck;
    ck.dirpath = dir;
    fg_callback *cbs[2];
    int n = 0;
    fg_callback *ckcb = cfg->with_ck ? fg_model_checkpoint_new(&ck) : NULL;
    fg_callback *es = cfg->with_es ? fg_early_stopping_new(&cfg->es) : NULL;
    if (ckcb) cbs[n++] = ckcb;
    if (es) cbs[n++] = es;
    fg_trainer_opts o = cfg->o;
    o.callbacks = cbs;
    o.ncallbacks = n;
    o.devices = "1";
    o.enable_progress_bar = FG_OFF;
    o.logger = FG_OFF;
    o.num_sanity_val_steps = FG_COUNT(0);
    if (!ckcb) o.enable_checkpointing = FG_OFF;
    fg_trainer *t = fg_trainer_new(&o);
    CHECK_MSG(t != NULL, "%s", fg_last_error());
    memset(out, 0, sizeof *out);
    out->status = t ? fg_trainer_fit(t, &lm, tl, vl, cfg->ckpt_path) : fg_last_status();
    CHECK_MSG(out->status == cfg->want, "fit: %s", fg_last_error());
    snprintf(out->msg, sizeof out->msg, "%s", out->status ? fg_last_error() : "");
    out->c = m.c;
    if (t) {
        out->global_step = fg_trainer_global_step(t);
        out->epoch = fg_trainer_current_epoch(t);
    }
    if (es) {
        out->es_stopped = fg_early_stopping_stopped_epoch(es);
        out->es_wait = fg_early_stopping_wait_count(es);
        out->es_best = fg_early_stopping_best_score(es);
    }
    if (ckcb) {
        snprintf(out->best_path, sizeof out->best_path, "%s", fg_model_checkpoint_best_path(ckcb));
        out->best_score = fg_model_checkpoint_best_score(ckcb);
    }
    tu_list(dir, "", out->files, sizeof out->files);
    fg_trainer_free(t);
    fg_callback_free(ckcb);
    fg_callback_free(es);
    fg_dataloader_free(tl);
    fg_dataloader_free(vl);
    fg_dataset_free(tr);
    fg_dataset_free(va);
    fg_module_free(m.net);
}

static const double k_curve[] = {0.5, 0.4, 0.6, 0.3, 0.45, 0.35};

TEST(top_k_and_last) {
    run_cfg cfg = {.o = {.max_epochs = 6},
                   .with_ck = true,
                   .ck = {.monitor = "val_loss",
                          .save_top_k = 2,
                          .save_last = true,
                          .filename = "{epoch}-{val_loss:.2f}"},
                   .curve = k_curve,
                   .ncurve = 6};
    run_out r;
    const char *dir = tu_subdir("topk");
    run(&cfg, dir, &r);
    /* the two lowest of 0.5 0.4 0.6 0.3 0.45 0.35, and last */
    CHECK_MSG(!strcmp(r.files, "epoch=3-val_loss=0.30.safetensors "
                               "epoch=5-val_loss=0.35.safetensors last.safetensors"),
              "%s", r.files);
    CHECK(strstr(r.best_path, "epoch=3-val_loss=0.30.safetensors") != NULL);
    CHECK_CLOSE(r.best_score, 0.3, 0, 1e-12);
    /* mode max keeps the two highest */
    cfg.ck.mode = FG_MONITOR_MAX;
    cfg.ck.save_last = false;
    dir = tu_subdir("topk-max");
    run(&cfg, dir, &r);
    CHECK_MSG(!strcmp(r.files, "epoch=0-val_loss=0.50.safetensors "
                               "epoch=2-val_loss=0.60.safetensors"),
              "%s", r.files);
    /* no monitor: the newest only (save_top_k 1), by steps */
    run_cfg steps = {.o = {.max_epochs = 1}, .with_ck = true, .ck = {.every_n_train_steps = 3}};
    dir = tu_subdir("steps1");
    run(&steps, dir, &r);
    CHECK_MSG(!strcmp(r.files, "epoch=0-step=9.safetensors"), "%s", r.files);
    /* ... or every one (save_top_k -1) */
    steps.ck.save_top_k = -1;
    dir = tu_subdir("steps-all");
    run(&steps, dir, &r);
    CHECK_MSG(!strcmp(r.files, "epoch=0-step=3.safetensors epoch=0-step=6.safetensors "
                               "epoch=0-step=9.safetensors"),
              "%s", r.files);
    /* Lightning's default: once per epoch, the newest, named {epoch}-{step} */
    run_cfg def = {.o = {.max_epochs = 3}, .with_ck = true};
    dir = tu_subdir("default");
    run(&def, dir, &r);
    CHECK_MSG(!strcmp(r.files, "epoch=2-step=30.safetensors"), "%s", r.files);
}

TEST(checkpoint_options_refused) {
    CHECK(!fg_model_checkpoint_new(&(fg_checkpoint_opts){.save_top_k = 3}));
    CHECK_CONTAINS(fg_last_error(), "no quantity for top_k to track");
    CHECK(!fg_model_checkpoint_new(&(fg_checkpoint_opts){.filename = "{epoch"}));
    CHECK_CONTAINS(fg_last_error(), "not closed");
    CHECK(!fg_model_checkpoint_new(&(fg_checkpoint_opts){.filename = "{step:.2q}"}));
    CHECK_CONTAINS(fg_last_error(), "format spec");
    CHECK(!fg_early_stopping_new(&(fg_early_stopping_opts){.patience = 3}));
    CHECK_CONTAINS(fg_last_error(), "monitor is required");
}

TEST(early_stopping_epoch) {
    /* improves at 0 and 1, then 3 checks without: stops after epoch 4 */
    static const double curve[] = {1.0, 0.9, 0.95, 0.93, 0.92, 0.1, 0.1, 0.1};
    run_cfg cfg = {.o = {.max_epochs = 8},
                   .with_es = true,
                   .es = {.monitor = "val_loss"},
                   .curve = curve,
                   .ncurve = 8};
    run_out r;
    run(&cfg, tu_subdir("es1"), &r);
    CHECK(r.es_stopped == 4 && r.c.epochs_ended == 5 && r.epoch == 5);
    CHECK(r.es_wait == 3 && r.es_best == 0.9);
    /* min_delta 0.11: 0.9 is no improvement on 1.0 by more than it */
    cfg.es.min_delta = 0.11;
    run(&cfg, tu_subdir("es2"), &r);
    CHECK_MSG(r.es_stopped == 3 && r.epoch == 4, "stopped %lld epoch %lld", (long long)r.es_stopped,
              (long long)r.epoch);
    /* stopping_threshold: stops as soon as val_loss < 0.94 */
    cfg.es.min_delta = 0;
    cfg.es.stopping_threshold = &(double){0.94};
    run(&cfg, tu_subdir("es3"), &r);
    CHECK(r.es_stopped == 1 && r.epoch == 2);
    /* divergence_threshold: stops as soon as val_loss > 0.94 */
    cfg.es.stopping_threshold = NULL;
    cfg.es.divergence_threshold = &(double){0.94};
    run(&cfg, tu_subdir("es4"), &r);
    CHECK(r.es_stopped == 0 && r.epoch == 1);
    /* check_finite: a NaN stops it */
    static const double nan_curve[] = {1.0, 0.9, NAN, 0.5};
    cfg.es.divergence_threshold = NULL;
    cfg.curve = nan_curve;
    cfg.ncurve = 4;
    run(&cfg, tu_subdir("es5"), &r);
    CHECK(r.es_stopped == 2 && r.epoch == 3);
    /* a monitor that is never logged is an error naming the ones there are */
    cfg.es.monitor = "val_acc";
    tu_clean_env();
    fg_dataset *tr = tu_dataset(40, 11), *va = tu_dataset(12, 12);
    fg_dataloader *tl = tu_loader(tr, 4, true), *vl = tu_loader(va, 4, false);
    tu_module m = {.log_val = true};
    tu_module_init(&m);
    fg_lightning_module lm = tu_lm(&m);
    fg_callback *es = fg_early_stopping_new(&cfg.es);
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 2,
                                                      .devices = "1",
                                                      .callbacks = &es,
                                                      .ncallbacks = 1,
                                                      .enable_progress_bar = FG_OFF,
                                                      .enable_checkpointing = FG_OFF,
                                                      .logger = FG_OFF});
    CHECK_STATUS(fg_trainer_fit(t, &lm, tl, vl, NULL), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "conditioned on metric \"val_acc\"");
    CHECK_CONTAINS(fg_last_error(), "val_loss");
    fg_trainer_free(t);
    fg_callback_free(es);
    fg_dataloader_free(tl);
    fg_dataloader_free(vl);
    fg_dataset_free(tr);
    fg_dataset_free(va);
    fg_module_free(m.net);
}

/* ModelCheckpoint and EarlyStopping through a resume: 3 epochs, then on
 * from "last" to the end, against one run */
TEST(callbacks_survive_resume) {
    static const double curve[] = {0.9, 0.8, 0.85, 0.7, 0.75, 0.76, 0.77, 0.5, 0.4, 0.3};
    run_cfg cfg = {.o = {.max_epochs = 10},
                   .with_ck = true,
                   .ck = {.monitor = "val_loss",
                          .save_top_k = 2,
                          .save_last = true,
                          .filename = "{epoch}-{val_loss:.2f}"},
                   .with_es = true,
                   .es = {.monitor = "val_loss", .patience = 3},
                   .curve = curve,
                   .ncurve = 10};
    run_out whole, part, rest;
    run(&cfg, tu_subdir("whole"), &whole);
    /* 0.7 at epoch 3, then 3 epochs without improvement: stop after epoch 6 */
    CHECK(whole.es_stopped == 6 && whole.epoch == 7);
    const char *dir = tu_subdir("parts");
    cfg.o.max_epochs = 5;
    run(&cfg, dir, &part);
    CHECK(part.epoch == 5 && part.es_stopped == 0 && part.es_wait == 1);
    cfg.o.max_epochs = 10;
    cfg.ckpt_path = "last";
    run(&cfg, dir, &rest);
    CHECK_MSG(rest.es_stopped == 6 && rest.epoch == 7, "stopped %lld epoch %lld",
              (long long)rest.es_stopped, (long long)rest.epoch);
    CHECK(rest.es_wait == whole.es_wait && rest.es_best == whole.es_best);
    CHECK(rest.c.epochs_ended == 2 && rest.global_step == whole.global_step);
    CHECK_MSG(!strcmp(rest.files, whole.files), "%s vs %s", rest.files, whole.files);
    CHECK(rest.best_score == whole.best_score);
    CHECK(strstr(rest.best_path, "epoch=3-val_loss=0.70.safetensors") != NULL);
    /* "last" with no checkpoint starts from scratch, as Lightning */
    run(&cfg, tu_subdir("empty"), &rest);
    CHECK(rest.status == FG_OK && rest.global_step == whole.global_step &&
          rest.c.epochs_ended == 7);
}

/* save_top_k 2 by step (fulgur fit --save-top-k 2), a save every step:
 * three resumes from the newest file (the path "last" names, as fulgur fit
 * --ckpt-path last gives it) leave the two newest files, as one run does,
 * where each resume used to leave the file it resumed from behind */
TEST(resumes_leak_no_checkpoint) {
    run_cfg cfg = {.o = {.max_steps = 3},
                   .with_ck = true,
                   .ck = {.monitor = "step",
                          .mode = FG_MONITOR_MAX,
                          .save_top_k = 2,
                          .every_n_train_steps = 1,
                          .filename = "step-{step:02d}",
                          .no_auto_insert_metric_name = true,
                          .save_last_link = true}};
    run_out r;
    const char *dir = tu_subdir("leak");
    run(&cfg, dir, &r);
    CHECK_MSG(!strcmp(r.files, "last.safetensors step-02.safetensors step-03.safetensors"), "%s",
              r.files);
    char from[600];
    cfg.ckpt_path = from;
    for (int64_t steps = 5; steps <= 9; steps += 2) {
        snprintf(from, sizeof from, "%s/step-%02lld.safetensors", dir, (long long)steps - 2);
        cfg.o.max_steps = steps;
        run(&cfg, dir, &r);
        char want[256];
        snprintf(want, sizeof want,
                 "last.safetensors step-%02lld.safetensors step-%02lld.safetensors",
                 (long long)steps - 1, (long long)steps);
        CHECK_MSG(!strcmp(r.files, want), "after the resume to step %lld: %s", (long long)steps,
                  r.files);
    }
    /* a checkpoint from elsewhere (not one this callback tracks) is kept */
    char other[600];
    snprintf(other, sizeof other, "%s/step-09.safetensors", dir);
    cfg.ckpt_path = other;
    cfg.o.max_steps = 12;
    run(&cfg, tu_subdir("leak-other"), &r);
    struct stat sb;
    CHECK(stat(other, &sb) == 0);
}

/* A checkpoint whose trainer counters are out of range, or disagree with
 * the batches taken (an epoch or a step takes a batch), is refused before
 * anything is loaded, naming the file, the key and the value */
TEST(resume_checks_the_trainer_counters) {
    run_cfg cfg = {.o = {.max_steps = 3},
                   .with_ck = true,
                   .ck = {.monitor = "step",
                          .mode = FG_MONITOR_MAX,
                          .every_n_train_steps = 1,
                          .filename = "s{step}",
                          .no_auto_insert_metric_name = true}};
    run_out r;
    const char *dir = tu_subdir("counters");
    run(&cfg, dir, &r);
    char good[600], bad[600];
    snprintf(good, sizeof good, "%s/s3.safetensors", dir);
    snprintf(bad, sizeof bad, "%s/edited.safetensors", tu_subdir("counters-edited"));
    const char *edits[][3] = {
        {"epoch", "999999", "\"epoch\" is 999999, more than the 3 batches the run had taken"},
        {"step", "7", "\"step\" is 7, more than the 3 batches"},
        {"trainer.batches_that_stepped", "4", "\"trainer.batches_that_stepped\" is 4, more"},
        {"trainer.total_batch_idx", "-1", "\"trainer.total_batch_idx\" is \"-1\": expected an"},
        {"trainer.pending_advance", "2", "\"trainer.pending_advance\" is \"2\""},
        {"trainer.val_done_at", "x", "\"trainer.val_done_at\" is \"x\""},
        {"step", "abc", "\"step\" is \"abc\": expected a decimal integer >= 0"},
        {"samples_in_epoch", "-7", "\"samples_in_epoch\" is \"-7\""},
        {"global_batch", "0", "\"global_batch\" is \"0\""}};
    cfg.want = FG_EFORMAT;
    cfg.ckpt_path = bad;
    cfg.o.max_steps = 6;
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        rewrite_with(good, bad, edits[i][0], edits[i][1]);
        run(&cfg, tu_subdir("counters-resumed"), &r);
        CHECK_MSG(strstr(r.msg, edits[i][2]) && strstr(r.msg, bad), "%s = %s: %s", edits[i][0],
                  edits[i][1], r.msg);
        CHECK(r.global_step == 0 && r.c.train_steps == 0 && r.c.fit_start == 0);
    }
}

/* ------------------------------------------------------- exact resume */

/* Saves at chosen points, each to its own file (F_*.safetensors) */
typedef struct saver {
    const char *dir;
    int nval;
    int saved;
} saver;

static fg_status save_as(saver *s, fg_trainer *t, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.safetensors", s->dir, name);
    s->saved++;
    return fg_trainer_save_checkpoint(t, path);
}

static fg_status sv_batch_end(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)b;
    saver *s = ud;
    int64_t e = fg_trainer_current_epoch(t);
    if (e == 0 && i == 1) return save_as(s, t, "a-stepped");    /* validation check pending */
    if (e == 0 && i == 5) return save_as(s, t, "c-before-val"); /* batch 6 validates next */
    if (e == 1 && i == 6) return save_as(s, t, "f-mid-window"); /* batch 7 of a window */
    return FG_OK;
}

static fg_status sv_val_end(void *ud, fg_trainer *t) {
    saver *s = ud;
    if (fg_trainer_stage(t) != FG_STAGE_VALIDATE) return FG_OK;
    s->nval++;
    if (s->nval == 1) return save_as(s, t, "b-val-mid-window"); /* after batch 3 */
    if (s->nval == 6) return save_as(s, t, "e-val-epoch1");     /* after batch 9 of epoch 1 */
    return FG_OK;
}

static fg_status sv_epoch_end(void *ud, fg_trainer *t) {
    if (fg_trainer_current_epoch(t) == 0) return save_as(ud, t, "d-epoch-end");
    return FG_OK;
}

typedef struct exact_out {
    char *params;
    size_t bytes;
    double loss_epoch, val_loss;
    int64_t step, epoch, train_steps;
} exact_out;

/* One process, or (launched) one rank of ranks a faked launcher started. */
typedef struct exact_cfg {
    bool launched;
    const char *strategy, *precision;
} exact_cfg;

static void exact_run_on(exact_cfg cfg, const char *save_dir, const char *ckpt, exact_out *out,
                         int *saved) {
    bool launched = cfg.launched;
    if (!launched) tu_clean_env();
    /* 10 batches of 4 an epoch on each rank */
    fg_dataset *tr = tu_dataset(launched ? 80 : 40, 11), *va = tu_dataset(12, 12);
    fg_dataloader *tl = tu_loader(tr, 4, true), *vl = tu_loader(va, 4, false);
    tu_module m = {.log_val = true,
                   .log_train = true,
                   .adamw = true,
                   .dropout = 0.2,
                   .use_schedule = true,
                   .interval = FG_INTERVAL_STEP,
                   .schedule = {.kind = FG_LR_COSINE,
                                .lr = 1e-2,
                                .min_lr = 1e-3,
                                .warmup_steps = 3,
                                .decay_steps = 13}};
    tu_module_init(&m);
    fg_lightning_module lm = tu_lm(&m);
    saver s = {.dir = save_dir};
    fg_callback *cb = fg_callback_new(&(fg_callback_ops){.name = "saver",
                                                         .on_train_batch_end = sv_batch_end,
                                                         .on_validation_end = sv_val_end,
                                                         .on_train_epoch_end = sv_epoch_end},
                                      &s);
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_steps = 13,
                                                      .accumulate_grad_batches = 2,
                                                      .val_check_interval = FG_COUNT(3),
                                                      .gradient_clip_val = 0.5,
                                                      .seed = 42,
                                                      .devices = launched ? NULL : "1",
                                                      .strategy = cfg.strategy,
                                                      .precision = cfg.precision,
                                                      .callbacks = save_dir ? &cb : NULL,
                                                      .ncallbacks = save_dir ? 1 : 0,
                                                      .enable_progress_bar = FG_OFF,
                                                      .enable_checkpointing = FG_OFF,
                                                      .logger = FG_OFF});
    CHECK_OK(fg_trainer_fit(t, &lm, tl, vl, ckpt));
    if (cfg.strategy) CHECK(!strcmp(fg_fabric_strategy_name(fg_trainer_fabric(t)), cfg.strategy));
    if (cfg.launched) CHECK(fg_trainer_world_size(t) == 2);
    fg_tensor *p = fg_module_flat_params(m.net);
    out->bytes = fg_tensor_nbytes(p);
    out->params = malloc(out->bytes);
    memcpy(out->params, fg_tensor_data(p), out->bytes);
    CHECK(fg_trainer_callback_metric(t, "loss_epoch", &out->loss_epoch));
    CHECK(fg_trainer_callback_metric(t, "val_loss", &out->val_loss));
    out->step = fg_trainer_global_step(t);
    out->train_steps = m.c.train_steps;
    out->epoch = fg_trainer_current_epoch(t);
    if (saved) *saved = s.saved;
    fg_trainer_free(t);
    fg_callback_free(cb);
    fg_dataloader_free(tl);
    fg_dataloader_free(vl);
    fg_dataset_free(tr);
    fg_dataset_free(va);
    fg_module_free(m.net);
}

static void exact_run(const char *save_dir, const char *ckpt, exact_out *out, int *saved) {
    exact_run_on((exact_cfg){0}, save_dir, ckpt, out, saved);
}

TEST(resume_anywhere_is_bitwise) {
    const char *dir = tu_subdir("exact");
    exact_out whole, plain;
    int saved = 0;
    exact_run(dir, NULL, &whole, &saved);
    CHECK_MSG(saved == 6, "%d checkpoints", saved);
    CHECK(whole.step == 13 && whole.epoch == 3);
    /* the saving callback changes nothing */
    exact_run(NULL, NULL, &plain, NULL);
    CHECK(plain.bytes == whole.bytes && !memcmp(plain.params, whole.params, whole.bytes));
    free(plain.params);
    CHECK(whole.train_steps == 26);
    static const char *const names[] = {"a-stepped",   "b-val-mid-window", "c-before-val",
                                        "d-epoch-end", "e-val-epoch1",     "f-mid-window"};
    /* the batches each resumed run trains: all but those before the point (a window open at
     * the point is run again from its start) */
    static const int64_t left[] = {24, 24, 20, 16, 8, 10};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s.safetensors", dir, names[i]);
        exact_out r;
        exact_run(NULL, path, &r, NULL);
        CHECK_MSG(r.bytes == whole.bytes && !memcmp(r.params, whole.params, whole.bytes),
                  "resumed from %s: other weights", names[i]);
        CHECK_MSG(r.loss_epoch == whole.loss_epoch, "%s: loss_epoch %.17g vs %.17g", names[i],
                  r.loss_epoch, whole.loss_epoch);
        CHECK_MSG(r.val_loss == whole.val_loss, "%s: val_loss %.17g vs %.17g", names[i], r.val_loss,
                  whole.val_loss);
        CHECK(r.step == whole.step && r.epoch == whole.epoch);
        CHECK_MSG(r.train_steps == left[i], "%s: %lld batches trained, want %lld", names[i],
                  (long long)r.train_steps, (long long)left[i]);
        free(r.params);
    }
    free(whole.params);
}

/* the same under ddp and deepspeed_stage_2 (optimizer state sharded) on 2
 * ranks, and under 16-mixed (the loss scaler's state travels with the
 * fabric's checkpoint): each run ends with the bits it had */
static void resume_points(exact_cfg cfg, const char *dir, const char *what) {
    exact_out whole;
    int saved = 0;
    exact_run_on(cfg, dir, NULL, &whole, &saved);
    CHECK(saved == 6 && whole.step == 13);
    static const char *const names[] = {"b-val-mid-window", "c-before-val", "f-mid-window"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s.safetensors", dir, names[i]);
        exact_out r;
        exact_run_on(cfg, NULL, path, &r, NULL);
        CHECK_MSG(r.bytes == whole.bytes && !memcmp(r.params, whole.params, whole.bytes),
                  "%s: resumed from %s: other weights", what, names[i]);
        CHECK(r.loss_epoch == whole.loss_epoch && r.val_loss == whole.val_loss);
        free(r.params);
    }
    free(whole.params);
}

static int sharded_resume_rank(int rank, int world, void *arg) {
    const char *dir = arg;
    static const char *const strategies[] = {"ddp", "deepspeed_stage_2"};
    for (int k = 0; k < 2; k++) {
        tu_fake_launcher(rank, world, 7 + k);
        char what[64];
        snprintf(what, sizeof what, "rank %d, %s", rank, strategies[k]);
        resume_points((exact_cfg){.launched = true, .strategy = strategies[k]}, dir, what);
    }
    return 0;
}

TEST(ddp_and_sharded_resume_is_bitwise) {
    const char *dir = tu_subdir("exact-ddp");
    CHECK(fg_test_fork_ranks(2, sharded_resume_rank, (void *)dir, 300) == 0);
    tu_clean_env();
}

TEST(mixed_precision_resume_is_bitwise) {
    resume_points((exact_cfg){.precision = "16-mixed"}, tu_subdir("exact-16"), "16-mixed");
    resume_points((exact_cfg){.precision = "bf16-mixed"}, tu_subdir("exact-bf16"), "bf16-mixed");
}

/* the module's own pairs travel in the checkpoint; "best" loads for test */
TEST(module_state_and_best) {
    tu_clean_env();
    const char *dir = tu_subdir("best");
    fg_dataset *tr = tu_dataset(40, 11), *va = tu_dataset(12, 12);
    fg_dataloader *tl = tu_loader(tr, 4, true), *vl = tu_loader(va, 4, false);
    tu_module m = {.log_val = true, .val_curve = k_curve, .val_curve_n = 6};
    tu_module_init(&m);
    snprintf(m.extra_key, sizeof m.extra_key, "my_config");
    snprintf(m.extra_value, sizeof m.extra_value, "{\"hidden\": 8}");
    fg_lightning_module lm = tu_lm(&m);
    fg_callback *ck = fg_model_checkpoint_new(
        &(fg_checkpoint_opts){.dirpath = dir, .monitor = "val_loss", .save_last = true});
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 6,
                                                      .devices = "1",
                                                      .callbacks = &ck,
                                                      .ncallbacks = 1,
                                                      .enable_progress_bar = FG_OFF,
                                                      .logger = FG_OFF});
    CHECK_OK(fg_trainer_fit(t, &lm, tl, vl, NULL));
    CHECK(fg_trainer_checkpoint_callback(t) == ck);
    CHECK_CONTAINS(fg_model_checkpoint_best_path(ck), "epoch=3-step=40.safetensors");
    CHECK_OK(fg_trainer_test(t, &lm, vl, "best"));
    CHECK_CONTAINS(fg_trainer_ckpt_path(t), "epoch=3-step=40.safetensors");
    CHECK(!strcmp(m.loaded_extra, "{\"hidden\": 8}"));
    /* a reserved key is refused, naming it */
    snprintf(m.extra_key, sizeof m.extra_key, "trainer.mine");
    m.loaded_extra[0] = '\0';
    CHECK_STATUS(fg_trainer_fit(t, &lm, tl, vl, NULL), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "trainer.mine");
    fg_trainer_free(t);
    fg_callback_free(ck);
    /* "best" with nothing saved is an error that says why */
    t = fg_trainer_new(&(fg_trainer_opts){.devices = "1",
                                          .enable_progress_bar = FG_OFF,
                                          .enable_checkpointing = FG_OFF,
                                          .logger = FG_OFF});
    CHECK_STATUS(fg_trainer_test(t, &lm, vl, "best"), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "no ModelCheckpoint");
    fg_trainer_free(t);
    fg_dataloader_free(tl);
    fg_dataloader_free(vl);
    fg_dataset_free(tr);
    fg_dataset_free(va);
    fg_module_free(m.net);
}

/* ckpt_path resolution, by a trainer of a new process (the fit's state
 * not in memory): "last" is the newest last's file, "best" the best path
 * the newest checkpoint recorded, a folder its last, a path itself; what
 * is not there is an error before any rank starts */
TEST(resolve_ckpt_path) {
    tu_clean_env();
    const char *d = tu_subdir("resolve");
    char dir[512];
    snprintf(dir, sizeof dir, "%s", d);
    fg_dataset *tr = tu_dataset(40, 11), *va = tu_dataset(12, 12);
    fg_dataloader *tl = tu_loader(tr, 4, true), *vl = tu_loader(va, 4, false);
    tu_module m = {.log_val = true, .val_curve = k_curve, .val_curve_n = 6};
    tu_module_init(&m);
    fg_lightning_module lm = tu_lm(&m);
    fg_callback *ck = fg_model_checkpoint_new(&(fg_checkpoint_opts){
        .dirpath = dir, .monitor = "val_loss", .save_top_k = 2, .save_last_link = true});
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 6,
                                                      .devices = "1",
                                                      .callbacks = &ck,
                                                      .ncallbacks = 1,
                                                      .enable_progress_bar = FG_OFF,
                                                      .logger = FG_OFF});
    CHECK_OK(fg_trainer_fit(t, &lm, tl, vl, NULL));
    char best[1024], last[1024];
    snprintf(best, sizeof best, "%s", fg_model_checkpoint_best_path(ck));
    snprintf(last, sizeof last, "%s", fg_model_checkpoint_last_path(ck));
    CHECK_CONTAINS(best, "epoch=3-step=40.safetensors");
    fg_trainer_free(t);
    fg_callback_free(ck);

    /* a new trainer over the same folder, as a new command would make */
    fg_callback *ck2 = fg_model_checkpoint_new(&(fg_checkpoint_opts){.dirpath = dir});
    t = fg_trainer_new(&(fg_trainer_opts){.devices = "1",
                                          .callbacks = &ck2,
                                          .ncallbacks = 1,
                                          .enable_progress_bar = FG_OFF,
                                          .logger = FG_OFF});
    char out[1024];
    CHECK_OK(fg_trainer_resolve_ckpt_path(t, "last", out, sizeof out));
    CHECK_MSG(strstr(out, "epoch=5-step=60.safetensors") && !strstr(out, "last"), "last: %s", out);
    CHECK_OK(fg_trainer_resolve_ckpt_path(t, "best", out, sizeof out));
    CHECK_MSG(!strcmp(out, best), "best: %s, the fit's %s", out, best);
    CHECK_OK(fg_trainer_resolve_ckpt_path(t, dir, out, sizeof out)); /* a folder: its last */
    CHECK_CONTAINS(out, "epoch=5-step=60.safetensors");
    CHECK_OK(fg_trainer_resolve_ckpt_path(t, best, out, sizeof out));
    CHECK(!strcmp(out, best));
    CHECK_OK(fg_trainer_resolve_ckpt_path(t, NULL, out, sizeof out));
    CHECK(out[0] == '\0');
    char missing[1100];
    snprintf(missing, sizeof missing, "%s/nothing.safetensors", dir);
    CHECK_STATUS(fg_trainer_resolve_ckpt_path(t, missing, out, sizeof out), FG_EIO);
    CHECK_CONTAINS(fg_last_error(), "nothing.safetensors");
    /* and the entry point takes "best" the same way */
    CHECK_OK(fg_trainer_test(t, &lm, vl, "best"));
    CHECK(!strcmp(fg_trainer_ckpt_path(t), best));
    fg_trainer_free(t);
    fg_callback_free(ck2);

    /* a folder with no checkpoint: "last" is none (fit starts afresh), "best" an error */
    const char *e = tu_subdir("resolve-empty");
    char edir[512];
    snprintf(edir, sizeof edir, "%s", e);
    fg_callback *ck3 = fg_model_checkpoint_new(&(fg_checkpoint_opts){.dirpath = edir});
    t = fg_trainer_new(&(fg_trainer_opts){.devices = "1",
                                          .callbacks = &ck3,
                                          .ncallbacks = 1,
                                          .enable_progress_bar = FG_OFF,
                                          .logger = FG_OFF});
    CHECK_OK(fg_trainer_resolve_ckpt_path(t, "last", out, sizeof out));
    CHECK(out[0] == '\0');
    CHECK_STATUS(fg_trainer_resolve_ckpt_path(t, "best", out, sizeof out), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "no checkpoint yet");
    fg_trainer_free(t);
    fg_callback_free(ck3);
    (void)last;
    fg_dataloader_free(tl);
    fg_dataloader_free(vl);
    fg_dataset_free(tr);
    fg_dataset_free(va);
    fg_module_free(m.net);
}
