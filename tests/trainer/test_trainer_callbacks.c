/* The built-in callbacks and logger at work, and the optimizer step's
 * extras: the CSV logger's folders and files as Lightning's CSVLogger lays
 * them out; LearningRateMonitor's rows; Timer (max_time) stopping a fit and
 * saving its clock; the progress bar's lines and redraws in a FILE*; a user
 * callback's state through a resume; gradient clipping by value and by
 * norm; detect_anomaly naming the step and the tensor; ddp_fork handing
 * rank 0's weights to the parent. */
#include <math.h>

#include "trainer_test_util.h"

typedef struct fixture {
    fg_dataset *tr, *va;
    fg_dataloader *tl, *vl;
    tu_module m;
    fg_lightning_module lm;
} fixture;

static void fx_init(fixture *f, int64_t ntrain) {
    tu_clean_env();
    f->tr = tu_dataset(ntrain, 11);
    f->va = tu_dataset(12, 12);
    f->tl = tu_loader(f->tr, 4, true);
    f->vl = tu_loader(f->va, 4, false);
    tu_module_init(&f->m);
    f->lm = tu_lm(&f->m);
}

static void fx_free(fixture *f) {
    fg_dataloader_free(f->tl);
    fg_dataloader_free(f->vl);
    fg_dataset_free(f->tr);
    fg_dataset_free(f->va);
    fg_module_free(f->m.net);
}

/* ------------------------------------------------------------- the CSV logger */

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

TEST(csv_logger_layout) {
    fixture f = {.m = {.log_train = true, .log_val = true}};
    fx_init(&f, 40);
    const char *root = tu_subdir("csv");
    static const fg_kv hp[] = {{"lr", "0.1"}, {"model", "mlp"}, {"note", "a: b"}};
    f.lm.hparams = hp;
    f.lm.nhparams = 3;
    for (int run = 0; run < 2; run++) {
        fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 2,
                                                          .devices = "1",
                                                          .log_every_n_steps = 5,
                                                          .default_root_dir = root,
                                                          .enable_progress_bar = FG_OFF});
        CHECK_OK(fg_trainer_fit(t, &f.lm, f.tl, f.vl, NULL));
        char want[1024];
        snprintf(want, sizeof want, "%s/lightning_logs/version_%d", root, run);
        CHECK_MSG(!strcmp(fg_trainer_log_dir(t), want), "%s", fg_trainer_log_dir(t));
        fg_trainer_free(t);
    }
    char path[1024], names[512];
    snprintf(path, sizeof path, "%s/lightning_logs", root);
    tu_list(path, "", names, sizeof names);
    CHECK_MSG(!strcmp(names, "version_0 version_1"), "%s", names);
    snprintf(path, sizeof path, "%s/lightning_logs/version_1", root);
    tu_list(path, "", names, sizeof names);
    CHECK_MSG(!strcmp(names, "checkpoints hparams.yaml metrics.csv"), "%s", names);
    snprintf(path, sizeof path, "%s/lightning_logs/version_1/checkpoints", root);
    tu_list(path, "", names, sizeof names);
    CHECK_MSG(!strcmp(names, "epoch=1-step=20.safetensors"), "%s", names);
    snprintf(path, sizeof path, "%s/lightning_logs/version_1/metrics.csv", root);
    char *csv = tu_read(path);
    CHECK(csv != NULL);
    if (csv) {
        /* the sorted union of the names, "step" among them, rows ending in \r\n; the header
         * was widened when val_loss first came */
        CHECK_MSG(!strncmp(csv, "epoch,loss_epoch,loss_step,step,val_loss\r\n", 42), "%.80s", csv);
        CHECK(count_lines(csv) == 9);
        /* the step column: rows every 5 steps, validation and epoch rows at the epoch's last */
        int64_t steps[8], n = 0;
        for (char *line = strchr(csv, '\n') + 1; *line && n < 8; line = strchr(line, '\n') + 1) {
            char *p = line;
            for (int comma = 0; comma < 3; p++) comma += *p == ',';
            steps[n++] = atoll(p);
        }
        static const int64_t want[] = {4, 9, 9, 9, 14, 19, 19, 19};
        for (int i = 0; i < 8; i++)
            CHECK_MSG(steps[i] == want[i], "row %d step %lld", i, (long long)steps[i]);
        CHECK(strstr(csv, "\r\n0,,") != NULL); /* a step row leaves loss_epoch empty */
        free(csv);
    }
    snprintf(path, sizeof path, "%s/lightning_logs/version_1/hparams.yaml", root);
    char *yaml = tu_read(path);
    CHECK_MSG(yaml && !strcmp(yaml, "lr: 0.1\nmodel: mlp\nnote: 'a: b'\n"), "%s", yaml ? yaml : "");
    free(yaml);
    fx_free(&f);
}

/* A full disk loses the logger's records: an error naming the file, not a
 * run that ends well with an empty metrics.csv. /dev/full takes the file's
 * place (a symbolic link) once the folder is made, for the rows and then
 * for hparams.yaml. */
typedef struct full_cb {
    const char *file; /* "metrics.csv" or "hparams.yaml" */
    bool linked;
} full_cb;

static fg_status full_link(void *ud, fg_trainer *t) {
    full_cb *c = ud;
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", fg_trainer_log_dir(t), c->file);
    remove(path);
    c->linked = symlink("/dev/full", path) == 0;
    return FG_OK;
}

TEST(csv_logger_full_disk_is_an_error) {
    for (int k = 0; k < 2; k++) {
        fixture f = {.m = {.log_train = true}};
        fx_init(&f, 16);
        const char *root = tu_subdir(k ? "csv-full-hp" : "csv-full");
        char r[512];
        snprintf(r, sizeof r, "%s", root);
        full_cb fc = {.file = k ? "hparams.yaml" : "metrics.csv"};
        fg_callback *cb =
            fg_callback_new(&(fg_callback_ops){.name = "full", .on_train_start = full_link}, &fc);
        fg_logger *lg = fg_csv_logger_new(&(fg_csv_logger_opts){.save_dir = r});
        fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 1,
                                                          .devices = "1",
                                                          .log_every_n_steps = 1,
                                                          .loggers = &lg,
                                                          .nloggers = 1,
                                                          .callbacks = &cb,
                                                          .ncallbacks = 1,
                                                          .enable_checkpointing = FG_OFF,
                                                          .enable_progress_bar = FG_OFF});
        fg_status s = fg_trainer_fit(t, &f.lm, f.tl, NULL, NULL);
        CHECK(fc.linked);
        CHECK_MSG(s == FG_EIO, "%s: status %d", fc.file, (int)s);
        CHECK_MSG(strstr(fg_last_error(), fc.file) && strstr(fg_last_error(), "No space left"),
                  "%s", fg_last_error());
        fg_trainer_free(t);
        fg_callback_free(cb);
        fg_logger_free(lg);
        fx_free(&f);
    }
}

TEST(csv_logger_named_version_and_empty_hparams) {
    fixture f = {.m = {.log_train = true}};
    fx_init(&f, 8);
    const char *root = tu_subdir("csv2");
    fg_logger *lg = fg_csv_logger_new(&(fg_csv_logger_opts){
        .save_dir = root,
        .name = "",
        .version = "run-a",
        .prefix = "tr",
        .flush_logs_every_n_steps = 1}); /* each row written at once: the header widens */
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 1,
                                                      .devices = "1",
                                                      .log_every_n_steps = 1,
                                                      .loggers = &lg,
                                                      .nloggers = 1,
                                                      .enable_checkpointing = FG_OFF,
                                                      .enable_progress_bar = FG_OFF});
    CHECK_OK(fg_trainer_fit(t, &f.lm, f.tl, NULL, NULL));
    char path[1024];
    snprintf(path, sizeof path, "%s/run-a", root);
    CHECK(fg_logger_log_dir(lg) && !strcmp(fg_logger_log_dir(lg), path));
    snprintf(path, sizeof path, "%s/run-a/hparams.yaml", root);
    char *yaml = tu_read(path);
    CHECK(yaml && !strcmp(yaml, "{}\n"));
    free(yaml);
    snprintf(path, sizeof path, "%s/run-a/metrics.csv", root);
    char *csv = tu_read(path);
    /* the prefix goes before every name but step, the epoch the trainer adds included */
    CHECK_MSG(csv && !strncmp(csv, "step,tr-epoch,tr-loss_epoch,tr-loss_step\r\n0,0,,", 47), "%s",
              csv ? csv : "");
    CHECK(csv && count_lines(csv) == 4); /* steps 0, 1 and the epoch row */
    /* the rows written before tr-loss_epoch came got its empty column */
    char *row2 = csv ? strchr(strchr(csv, '\n') + 1, '\n') + 1 : NULL;
    CHECK(row2 && !strncmp(row2, "1,0,,", 5));
    char *row3 = row2 ? strchr(row2, '\n') + 1 : NULL;
    CHECK(row3 && !strncmp(row3, "1,0,", 4) && row3[4] != ',' && strstr(row3, ",\r\n"));
    free(csv);
    fg_trainer_free(t);
    fg_logger_free(lg);
    fx_free(&f);
}

/* ----------------------------------------------------------- LR monitor */

typedef struct cap_logger {
    int64_t steps[64];
    double lr[64];
    int n;
} cap_logger;

static fg_status cap_log(void *ud, const fg_metric *m, int64_t n, int64_t step) {
    cap_logger *c = ud;
    for (int64_t i = 0; i < n; i++)
        if (!strncmp(m[i].name, "lr-", 3) && c->n < 64) {
            CHECK(!strcmp(m[i].name, "lr-SGD"));
            c->steps[c->n] = step;
            c->lr[c->n++] = m[i].value;
        }
    return FG_OK;
}

TEST(lr_monitor_rows) {
    for (int per_step = 0; per_step < 2; per_step++) {
        fixture f = {.m = {.use_schedule = true,
                           .interval = per_step ? FG_INTERVAL_STEP : FG_INTERVAL_EPOCH,
                           .schedule = {.kind = FG_LR_COSINE,
                                        .lr = 0.1,
                                        .min_lr = 0.01,
                                        .warmup_steps = 2,
                                        .decay_steps = 8}}};
        fx_init(&f, 40);
        cap_logger cap = {0};
        fg_logger *lg = fg_logger_new(&(fg_logger_ops){.log_metrics = cap_log}, &cap);
        fg_callback *mon = fg_lr_monitor_new(NULL);
        fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 2,
                                                          .devices = "1",
                                                          .log_every_n_steps = 4,
                                                          .callbacks = &mon,
                                                          .ncallbacks = 1,
                                                          .loggers = &lg,
                                                          .nloggers = 1,
                                                          .enable_checkpointing = FG_OFF,
                                                          .enable_progress_bar = FG_OFF});
        CHECK_OK(fg_trainer_fit(t, &f.lm, f.tl, f.vl, NULL));
        if (per_step) {
            /* when the logs are due: batches that begin steps 3, 7, 11, 15, 19 */
            CHECK_MSG(cap.n == 5, "%d rows", cap.n);
            for (int i = 0; i < cap.n && i < 5; i++) {
                CHECK(cap.steps[i] == 3 + 4 * i);
                CHECK(cap.lr[i] == fg_lr_at(&f.m.schedule, 3 + 4 * i));
            }
        } else {
            /* once an epoch: the schedule's value for the epoch */
            CHECK_MSG(cap.n == 2, "%d rows", cap.n);
            CHECK(cap.n == 2 && cap.steps[0] == 0 && cap.steps[1] == 10);
            CHECK(cap.n == 2 && cap.lr[0] == fg_lr_at(&f.m.schedule, 0) &&
                  cap.lr[1] == fg_lr_at(&f.m.schedule, 1));
        }
        fg_trainer_free(t);
        /* without a logger it refuses to run */
        t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 1,
                                              .devices = "1",
                                              .callbacks = &mon,
                                              .ncallbacks = 1,
                                              .logger = FG_OFF,
                                              .enable_checkpointing = FG_OFF,
                                              .enable_progress_bar = FG_OFF});
        CHECK_STATUS(fg_trainer_fit(t, &f.lm, f.tl, f.vl, NULL), FG_EINVAL);
        CHECK_CONTAINS(fg_last_error(), "LearningRateMonitor needs a logger");
        fg_trainer_free(t);
        fg_callback_free(mon);
        fg_logger_free(lg);
        fx_free(&f);
    }
}

/* ---------------------------------------------------------------- Timer */

TEST(max_time_stops) {
    fixture f = {.m = {.log_val = true}};
    fx_init(&f, 40);
    const char *dir = tu_subdir("timer");
    char path[1024];
    snprintf(path, sizeof path, "%s/t.safetensors", dir);
    double secs = 0;
    CHECK_OK(fg_trainer_parse_duration("00:00:00:01", &secs));
    CHECK(secs == 1);
    CHECK_OK(fg_trainer_parse_duration("01:02:03:04", &secs));
    CHECK(secs == 86400 + 2 * 3600 + 3 * 60 + 4);
    CHECK_OK(fg_trainer_parse_duration("90", &secs));
    CHECK(secs == 90);
    CHECK_STATUS(fg_trainer_parse_duration("1:x", &secs), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "max_time=\"1:x\"");
    /* any time at all passes 1 ns: the first batch end stops the fit, after validating */
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 5,
                                                      .max_time = 1e-9,
                                                      .devices = "1",
                                                      .logger = FG_OFF,
                                                      .enable_checkpointing = FG_OFF,
                                                      .enable_progress_bar = FG_OFF});
    CHECK_OK(fg_trainer_fit(t, &f.lm, f.tl, f.vl, NULL));
    CHECK(f.m.c.train_steps == 1 && f.m.c.val_runs == 1 && fg_trainer_should_stop(t));
    fg_trainer_free(t);
    /* a Timer's clock is in the checkpoint */
    fg_callback *timer = fg_timer_new(&(fg_timer_opts){0});
    CHECK(fg_timer_time_remaining(timer) == INFINITY);
    t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 1,
                                          .devices = "1",
                                          .callbacks = &timer,
                                          .ncallbacks = 1,
                                          .logger = FG_OFF,
                                          .enable_checkpointing = FG_OFF,
                                          .enable_progress_bar = FG_OFF});
    CHECK_OK(fg_trainer_fit(t, &f.lm, f.tl, f.vl, NULL));
    double train = fg_timer_time_elapsed(timer, FG_STAGE_TRAIN);
    CHECK(train > 0 && fg_timer_time_elapsed(timer, FG_STAGE_VALIDATE) > 0);
    fg_trainer_free(t);
    fg_callback_free(timer);
    fx_free(&f);
}

/* --------------------------------------------------------- progress bar */

TEST(progress_bar_lines) {
    fixture f = {.m = {.log_train = true, .log_val = true}};
    fx_init(&f, 40);
    for (int redraw = 0; redraw < 2; redraw++) {
        FILE *fp = tmpfile();
        fg_callback *bar = fg_progress_bar_new(&(fg_progress_bar_opts){
            .out = fp, .refresh_rate = 5, .redraw = redraw ? FG_ON : FG_OFF});
        fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 2,
                                                          .devices = "1",
                                                          .callbacks = &bar,
                                                          .ncallbacks = 1,
                                                          .logger = FG_OFF,
                                                          .enable_checkpointing = FG_OFF});
        CHECK_OK(fg_trainer_fit(t, &f.lm, f.tl, f.vl, NULL));
        fg_trainer_free(t);
        fg_callback_free(bar);
        long n = ftell(fp);
        rewind(fp);
        char *s = calloc(1, (size_t)n + 1);
        CHECK(fread(s, 1, (size_t)n, fp) == (size_t)n);
        fclose(fp);
        if (!redraw) {
            /* per epoch: batch 5, the epoch's end, its validation */
            CHECK_MSG(count_lines(s) == 6 && !strchr(s, '\r'), "%s", s);
            CHECK(!strncmp(s, "Epoch 0: 5/10 [", 15));
            CHECK(strstr(s, "Epoch 1: 10/10 [") && strstr(s, "Validation: 3/3 ["));
            CHECK(strstr(s, "it/s, loss_step=") && strstr(s, "Epoch 1: 10/10 [") &&
                  strstr(strstr(s, "Epoch 1: 10/10 ["), "loss_epoch="));
        } else {
            CHECK(strchr(s, '\r') && strstr(s, "Epoch 0:  50%|##########          | 5/10 ["));
            CHECK(count_lines(s) == 2); /* one finished line per epoch */
        }
        free(s);
    }
    fx_free(&f);
}

/* Without a FILE* the bar picks no stream: its lines go through the log
 * hook at info level (the default trainer's bar too), none to stdout. */
typedef struct log_lines {
    int n, epoch_lines;
} log_lines;

static void collect_log(void *ud, fg_log_level level, int rank, const char *msg) {
    (void)rank;
    log_lines *l = ud;
    if (level != FG_LOG_INFO) return;
    l->n++;
    if (!strncmp(msg, "Epoch ", 6) && !strchr(msg, '\r')) l->epoch_lines++;
}

TEST(progress_bar_no_stream_logs) {
    fixture f = {.m = {.log_train = true}};
    fx_init(&f, 40);
    log_lines l = {0};
    fg_set_log(collect_log, &l, FG_LOG_INFO);
    fflush(stdout);
    long before = ftell(stdout);
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 2,
                                                      .devices = "1",
                                                      .log_every_n_steps = 5,
                                                      .logger = FG_OFF,
                                                      .enable_checkpointing = FG_OFF});
    CHECK_OK(fg_trainer_fit(t, &f.lm, f.tl, NULL, NULL));
    fg_trainer_free(t);
    fg_set_log(NULL, NULL, FG_LOG_WARN);
    fflush(stdout);
    /* per epoch: batch 5 and the epoch's end, as plain lines */
    CHECK_MSG(l.epoch_lines == 4, "%d epoch lines of %d", l.epoch_lines, l.n);
    if (before >= 0) CHECK(ftell(stdout) == before); /* stdout a file: nothing written */
    fx_free(&f);
}

/* ------------------------------------------------- a user callback's state */

typedef struct counter {
    int64_t batches, loaded;
} counter;

static fg_status ctr_batch(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)t;
    (void)b;
    (void)i;
    ((counter *)ud)->batches++;
    return FG_OK;
}
static fg_status ctr_save(void *ud, fg_trainer *t, fg_state_dict *sd) {
    (void)t;
    return fg_state_dict_set_i64(sd, "batches", ((counter *)ud)->batches);
}
static fg_status ctr_load(void *ud, fg_trainer *t, const fg_state_dict *sd) {
    (void)t;
    counter *c = ud;
    CHECK(fg_state_dict_get_i64(sd, "batches", &c->batches));
    c->loaded++;
    return FG_OK;
}

TEST(user_callback_state_through_resume) {
    fixture f = {0};
    fx_init(&f, 40);
    const char *dir = tu_subdir("usercb");
    counter c = {0};
    fg_callback_ops ops = {.name = "counter",
                           .on_train_batch_end = ctr_batch,
                           .state_dict = ctr_save,
                           .load_state_dict = ctr_load};
    fg_callback *cb = fg_callback_new(&ops, &c);
    fg_callback *ck =
        fg_model_checkpoint_new(&(fg_checkpoint_opts){.dirpath = dir, .save_last = true});
    fg_callback *cbs[] = {cb, ck};
    CHECK(!strcmp(fg_callback_state_key(cb), "counter"));
    for (int part = 0; part < 2; part++) {
        fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = part ? 3 : 1,
                                                          .devices = "1",
                                                          .callbacks = cbs,
                                                          .ncallbacks = 2,
                                                          .logger = FG_OFF,
                                                          .enable_progress_bar = FG_OFF});
        if (part) c.batches = 0; /* a fresh process would start at 0 */
        CHECK_OK(fg_trainer_fit(t, &f.lm, f.tl, f.vl, part ? "last" : NULL));
        fg_trainer_free(t);
    }
    CHECK(c.loaded == 1 && c.batches == 30);
    fg_callback_free(cb);
    fg_callback_free(ck);
    fx_free(&f);
}

/* ------------------------------------------------------ clipping, anomaly */

typedef struct grab {
    float *grads;
    size_t n;
} grab;

static fg_status grab_grads(void *ud, fg_trainer *t) {
    grab *g = ud;
    fg_tensor *flat = fg_module_flat_grads(fg_trainer_model(t));
    g->n = (size_t)fg_tensor_numel(flat);
    g->grads = malloc(g->n * sizeof(float));
    memcpy(g->grads, fg_tensor_data(flat), g->n * sizeof(float));
    return FG_OK;
}

static fg_status plain_sgd(void *ud, fg_trainer *t, fg_optimizer_config *out) {
    (void)t;
    out->optimizer = fg_sgd_new(((tu_module *)ud)->net, &(fg_sgd_opts){.lr = 1.0});
    return FG_OK;
}

/* by value and by norm, on true gradients also under 16-mixed (the loss scaler's gradients are
 * unscaled before on_before_optimizer_step and the clipping, as Lightning's) */
TEST(gradient_clipping) {
    for (int k = 0; k < 4; k++) {
        int alg = k % 2;
        const char *precision = k < 2 ? NULL : "16-mixed";
        fixture f = {0};
        fx_init(&f, 40);
        f.lm.configure_optimizers = plain_sgd;
        fg_tensor *p = fg_module_flat_params(f.m.net);
        size_t n = (size_t)fg_tensor_numel(p);
        float *before = malloc(n * sizeof(float));
        memcpy(before, fg_tensor_data(p), n * sizeof(float));
        grab g = {0};
        fg_callback *cb = fg_callback_new(
            &(fg_callback_ops){.name = "grab", .on_before_optimizer_step = grab_grads}, &g);
        double clip = alg ? 0.05 : 0.01;
        fg_trainer *t = fg_trainer_new(
            &(fg_trainer_opts){.max_steps = 1,
                               .gradient_clip_val = clip,
                               .gradient_clip_algorithm = alg ? FG_CLIP_NORM : FG_CLIP_VALUE,
                               .devices = "1",
                               .precision = precision,
                               .callbacks = &cb,
                               .ncallbacks = 1,
                               .logger = FG_OFF,
                               .enable_checkpointing = FG_OFF,
                               .enable_progress_bar = FG_OFF});
        CHECK_OK(fg_trainer_fit(t, &f.lm, f.tl, NULL, NULL));
        double norm = 0;
        for (size_t i = 0; i < n; i++) norm += (double)g.grads[i] * g.grads[i];
        norm = sqrt(norm);
        CHECK(alg == 0 || norm > clip); /* the norm case clips for real */
        const float *after = fg_tensor_data(p);
        int wrong = 0;
        for (size_t i = 0; i < n; i++) {
            double want = alg ? g.grads[i] * (clip / (norm + 1e-6))
                              : fmax(-clip, fmin(clip, (double)g.grads[i]));
            if (fabs((before[i] - after[i]) - want) > 1e-6) wrong++;
        }
        CHECK_MSG(wrong == 0, "%s %s: %d elements", alg ? "norm" : "value",
                  precision ? precision : "32-true", wrong);
        fg_trainer_free(t);
        fg_callback_free(cb);
        free(g.grads);
        free(before);
        fx_free(&f);
    }
}

static fg_tensor *nan_step(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    fg_tensor *loss = tu_training_step(ud, t, b, i);
    return i == 3 ? fg_scale(loss, NAN) : loss;
}

static fg_status poison_grad(void *ud, fg_trainer *t) {
    (void)ud;
    if (fg_trainer_global_step(t) == 2)
        ((float *)fg_tensor_data(fg_module_flat_grads(fg_trainer_model(t))))[9] = INFINITY;
    return FG_OK;
}

TEST(detect_anomaly_names_step_and_tensor) {
    fixture f = {0};
    fx_init(&f, 40);
    f.lm.training_step = nan_step;
    fg_trainer_opts o = {.max_epochs = 1,
                         .detect_anomaly = true,
                         .devices = "1",
                         .logger = FG_OFF,
                         .enable_checkpointing = FG_OFF,
                         .enable_progress_bar = FG_OFF};
    fg_trainer *t = fg_trainer_new(&o);
    CHECK_STATUS(fg_trainer_fit(t, &f.lm, f.tl, NULL, NULL), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "detect_anomaly: training_step returned a loss of nan at "
                                    "global step 3 (epoch 0, batch 3)");
    fg_trainer_free(t);
    /* without it the NaN trains on (Lightning's default) */
    o.detect_anomaly = false;
    t = fg_trainer_new(&o);
    CHECK_OK(fg_trainer_fit(t, &f.lm, f.tl, NULL, NULL));
    fg_trainer_free(t);
    fx_free(&f);
    /* a gradient: named with its parameter and element */
    fx_init(&f, 40);
    f.lm.on_before_optimizer_step = poison_grad;
    o.detect_anomaly = true;
    t = fg_trainer_new(&o);
    CHECK_STATUS(fg_trainer_fit(t, &f.lm, f.tl, NULL, NULL), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "the gradient of \"0.weight\" holds inf (element 9) before "
                                    "the optimizer step at global step 2 (epoch 0, batch 2)");
    fg_trainer_free(t);
    fx_free(&f);
}

/* ------------------------------------------------------------- ddp_fork */

TEST(ddp_fork_gives_the_parent_rank0_weights) {
    fixture f = {0};
    fx_init(&f, 40);
    fg_tensor *p = fg_module_flat_params(f.m.net);
    size_t bytes = fg_tensor_nbytes(p);
    char *init = malloc(bytes);
    memcpy(init, fg_tensor_data(p), bytes);
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 1,
                                                      .devices = "2",
                                                      .strategy = "ddp_fork",
                                                      .logger = FG_OFF,
                                                      .enable_checkpointing = FG_OFF,
                                                      .enable_progress_bar = FG_OFF});
    CHECK_MSG(t != NULL, "%s", fg_last_error());
    if (t) CHECK_OK(fg_trainer_fit(t, &f.lm, f.tl, f.vl, NULL));
    CHECK(memcmp(fg_tensor_data(p), init, bytes) != 0);
    CHECK(f.m.c.train_steps == 0); /* the steps ran in the children */
    fg_trainer_free(t);
    free(init);
    fx_free(&f);
}
