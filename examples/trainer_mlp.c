/* A model of its own, trained by the Trainer (Lightning's LightningModule +
 * Trainer), with a checkpoint callback and the CSV logger:
 *
 *   example_trainer_mlp                                  one process
 *   example_trainer_mlp --devices 2 --strategy ddp       2 ranks (re-executes itself)
 *   example_trainer_mlp --devices 2 --strategy dp        2 threads in one process
 *   example_trainer_mlp --resume last                    on from the last checkpoint
 *   example_trainer_mlp --accelerator guarded            on the test device (docs/devices.md)
 *
 * Writes RUN/lightning_logs/version_N/{metrics.csv, hparams.yaml} and
 * RUN/checkpoints/ (RUN: --root, default "runs"). Exit 2 for bad flags, 1
 * if training failed. */
#include <fulgur/fulgur.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIM 16
#define CLASSES 4

/* Sample i of a stream: x normal, y = the largest of four fixed sums of x. */
static fg_status sample(void *ud, int64_t i, void *x_out, void *y_out) {
    float *x = x_out;
    fg_rng_fill_normal(((int64_t *)ud)[1], (uint64_t)i * DIM, x, DIM, 0, 1);
    float best = -1e30f;
    for (int c = 0; c < CLASSES; c++) {
        float s = x[c] + 0.5f * x[c + 4] - 0.25f * x[(c + 1) % DIM];
        if (s > best) best = s, *(int32_t *)y_out = c;
    }
    return FG_OK;
}
static int64_t length(void *ud) { return ((int64_t *)ud)[0]; }
static void spec(void *ud, fg_sample_spec *x, fg_sample_spec *y) {
    (void)ud;
    *x = (fg_sample_spec){.dtype = FG_F32, .ndim = 1, .shape = {DIM}};
    *y = (fg_sample_spec){.dtype = FG_I32, .ndim = 0};
}

/* The network: logits = fc2(relu(fc1(x))) + skip(x). */
static fg_tensor *skipnet_forward(fg_module *m, fg_tensor *x, void *ud) {
    (void)ud;
    fg_tensor *h = fg_relu(fg_module_forward(fg_module_child(m, "fc1"), x));
    return fg_add(fg_module_forward(fg_module_child(m, "fc2"), h),
                  fg_module_forward(fg_module_child(m, "skip"), x));
}

/* configure_model: built on each rank inside the run, once (ud: where it is kept) */
static fg_module *configure_model(void *ud, fg_trainer *t) {
    fg_module **net = ud, *m = *net;
    if (m) return m;
    fg_dtype dt = fg_fabric_dtype(fg_trainer_fabric(t));
    if (!(*net = m = fg_module_new("SkipNet", skipnet_forward, NULL, NULL)) ||
        fg_module_add_child(m, "fc1", fg_linear_new(DIM, 64, true, dt)) ||
        fg_module_add_child(m, "fc2", fg_linear_new(64, CLASSES, true, dt)) ||
        fg_module_add_child(m, "skip", fg_linear_new(DIM, CLASSES, false, dt)))
        return NULL;
    return fg_module_finalize(m) == FG_OK ? m : NULL;
}

static fg_status configure_optimizers(void *ud, fg_trainer *t, fg_optimizer_config *out) {
    (void)t;
    static const fg_lr_schedule cosine = {
        .kind = FG_LR_COSINE, .lr = 3e-3, .min_lr = 3e-4, .warmup_steps = 20, .decay_steps = 600};
    out->optimizer = fg_adamw_new(*(fg_module **)ud, &(fg_adamw_opts){.lr = 3e-3});
    out->schedule = &cosine;
    out->interval = FG_INTERVAL_STEP;
    return out->optimizer ? FG_OK : fg_last_status();
}

static fg_tensor *training_step(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)i;
    fg_tensor *loss = fg_cross_entropy(fg_module_forward(*(fg_module **)ud, b->x), b->y, -100);
    if (loss &&
        fg_trainer_log(t, "train_loss", fg_item(loss), &(fg_log_opts){.prog_bar = true}) != FG_OK)
        return NULL; /* fit stops with the log's error */
    return loss;     /* the trainer calls backward on it */
}

static fg_status validation_step(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)i;
    fg_tensor *loss = fg_cross_entropy(fg_module_forward(*(fg_module **)ud, b->x), b->y, -100);
    if (!loss) return fg_last_status();
    /* the epoch mean over every rank's batches (Lightning's sync_dist=True) */
    return fg_trainer_log(t, "val_loss", fg_item(loss),
                          &(fg_log_opts){.sync_dist = true, .prog_bar = true});
}

int main(int argc, char **argv) {
    const char *devices = NULL, *strategy = NULL, *root = "runs", *resume = NULL, *accel = NULL;
    int64_t epochs = 5;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--devices") && v) devices = argv[++i];
        else if (!strcmp(argv[i], "--accelerator") && v) accel = argv[++i];
        else if (!strcmp(argv[i], "--strategy") && v) strategy = argv[++i];
        else if (!strcmp(argv[i], "--max-epochs") && v) epochs = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--root") && v) root = argv[++i];
        else if (!strcmp(argv[i], "--resume") && v) resume = argv[++i];
        else return fprintf(stderr, "%s: unknown or incomplete flag %s\n", argv[0], argv[i]), 2;
    }
    int64_t tr_ud[2] = {4096, 42}, va_ud[2] = {1024, 43};
    fg_dataset *tr = fg_dataset_new(&(fg_dataset_ops){length, spec, sample, NULL}, tr_ud, "train");
    fg_dataset *va = fg_dataset_new(&(fg_dataset_ops){length, spec, sample, NULL}, va_ud, "val");
    fg_dataloader *tl = fg_dataloader_new(tr, &(fg_loader_opts){.batch = 64, .shuffle = true});
    fg_dataloader *vl = fg_dataloader_new(va, &(fg_loader_opts){.batch = 128});
    char ckdir[4096]; /* one folder for every run, so that --resume last finds the last */
    snprintf(ckdir, sizeof ckdir, "%s/checkpoints", root);
    fg_callback *ckpt =
        fg_model_checkpoint_new(&(fg_checkpoint_opts){.dirpath = ckdir,
                                                      .monitor = "val_loss",
                                                      .save_top_k = 2,
                                                      .save_last = true,
                                                      .filename = "{epoch}-{val_loss:.3f}"});
    /* the library picks no stream: the program hands the progress bar stdout */
    fg_callback *bar = fg_progress_bar_new(&(fg_progress_bar_opts){.out = stdout});
    fg_callback *cbs[] = {ckpt, bar};
    fg_logger *csv = fg_csv_logger_new(&(fg_csv_logger_opts){.save_dir = root});
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.accelerator = accel,
                                                      .devices = devices,
                                                      .strategy = strategy,
                                                      .seed = 1,
                                                      .max_epochs = epochs,
                                                      .log_every_n_steps = 16,
                                                      .default_root_dir = root,
                                                      .callbacks = cbs,
                                                      .ncallbacks = 2,
                                                      .loggers = &csv,
                                                      .nloggers = 1});
    if (!t) return fprintf(stderr, "trainer_mlp: %s\n", fg_last_error()), 2; /* a bad option */
    fg_module *net = NULL;
    static const fg_kv hparams[] = {{"hidden", "64"}, {"lr", "0.003"}, {"batch_size", "64"}};
    fg_lightning_module lm = {.ud = &net,
                              .configure_model = configure_model,
                              .configure_optimizers = configure_optimizers,
                              .training_step = training_step,
                              .validation_step = validation_step,
                              .hparams = hparams,
                              .nhparams = 3};
    int rc = fg_trainer_fit(t, &lm, tl, vl, resume) != FG_OK;
    if (rc) fprintf(stderr, "trainer_mlp: %s\n", fg_last_error());
    else if (fg_trainer_is_global_zero(t) && fg_model_checkpoint_best_path(ckpt)[0])
        printf("best checkpoint %s (val_loss %.4f); logs in %s\n",
               fg_model_checkpoint_best_path(ckpt), fg_model_checkpoint_best_score(ckpt),
               fg_trainer_log_dir(t));
    fg_trainer_free(t);
    fg_logger_free(csv);
    fg_callback_free(ckpt);
    fg_callback_free(bar);
    fg_module_free(net);
    fg_dataloader_free(tl);
    fg_dataloader_free(vl);
    fg_dataset_free(tr);
    fg_dataset_free(va);
    return rc;
}
