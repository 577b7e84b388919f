/* fg_trainer_log_metric: a TorchMetrics object logged as Lightning logs one
 * (self.log("train_acc", self.train_acc)): the on_step value is the
 * batch's forward value, the on_epoch value the metric's compute over the
 * epoch, reduced over the ranks (the fabric's communicator given to a
 * metric without one), the metric reset after it; the values reach the
 * callback metrics, the progress bar set and the loggers' rows; on 1, 2 and
 * 3 ranks the validation accuracy is the whole validation set's, the same
 * as one process computes; the refusals. */
#include <math.h>

#include "trainer_test_util.h"

#define TRY_(e)                                                                                    \
    do {                                                                                           \
        fg_status s_ = (e);                                                                        \
        if (s_ != FG_OK) return s_;                                                                \
    } while (0)

typedef struct lm_module {
    tu_module tu;
    fg_tmetric *train_acc, *val_acc, *check_epoch; /* check_epoch: the test's own */
    double last_batch_acc;
    bool have_prev;
    int64_t forward_missing; /* 1: update instead of forward (on_step refused) */
    bool rows_ok;
} lm_module;

static fg_tensor *lm_train(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)i;
    lm_module *m = ud;
    /* the step value of the batch before is that batch's forward value, on this rank */
    double v;
    if (m->have_prev && (!fg_trainer_callback_metric(t, "train_acc_step", &v) ||
                         memcmp(&v, &m->last_batch_acc, sizeof v)))
        m->rows_ok = false;
    m->have_prev = !m->forward_missing;
    fg_tensor *logits = fg_module_forward(m->tu.net, b->x);
    fg_tensor *loss = fg_cross_entropy(logits, b->y, -100);
    if (!loss) return NULL;
    fg_status s = m->forward_missing
                      ? fg_tmetric_update(m->train_acc, logits, b->y)
                      : fg_tmetric_forward(m->train_acc, logits, b->y, &m->last_batch_acc);
    if (s == FG_OK) s = fg_tmetric_update(m->check_epoch, logits, b->y);
    if (s == FG_OK)
        s = fg_trainer_log_metric(
            t, "train_acc", m->train_acc,
            &(fg_log_opts){.on_step = FG_ON, .on_epoch = FG_ON, .prog_bar = true});
    return s == FG_OK ? loss : NULL;
}

static fg_status lm_train_epoch_end(void *ud, fg_trainer *t) {
    lm_module *m = ud;
    double v, want;
    CHECK_OK(fg_tmetric_compute(m->check_epoch, &want));
    fg_tmetric_reset(m->check_epoch);
    if (!fg_trainer_callback_metric(t, "train_acc_epoch", &v) || v != want) m->rows_ok = false;
    /* reset by the trainer after its epoch compute */
    if (fg_tmetric_count(m->train_acc) != 0) m->rows_ok = false;
    return FG_OK;
}

static fg_status lm_val(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)i;
    lm_module *m = ud;
    fg_tensor *logits = fg_module_forward(m->tu.net, b->x);
    if (!logits) return fg_last_status();
    TRY_(fg_tmetric_update(m->val_acc, logits, b->y));
    /* the same by hand, summed over the ranks by sync_dist: hits and samples */
    fg_tensor *pred = fg_argmax(logits, 1, false);
    const int32_t *p = fg_tensor_data(pred);
    const int32_t *y = fg_tensor_data(b->y);
    double hits = 0;
    for (int64_t k = 0; k < b->valid; k++) hits += p[k] == y[k];
    fg_log_opts sum = {.reduce_fx = FG_REDUCE_FX_SUM, .sync_dist = true};
    TRY_(fg_trainer_log(t, "val_hits", hits, &sum));
    TRY_(fg_trainer_log(t, "val_n", (double)b->valid, &sum));
    return fg_trainer_log_metric(t, "val_acc", m->val_acc, &(fg_log_opts){.prog_bar = true});
}

typedef struct lm_out {
    double val_acc, train_acc_epoch, by_hand;
    bool rows_ok, in_pbar, in_logged;
    char csv_head[512];
} lm_out;

static void lm_run(bool launched, const char *dir, lm_out *out) {
    if (!launched) tu_clean_env();
    fg_dataset *tr = tu_dataset(48, 11), *va = tu_dataset(36, 12);
    fg_dataloader *tl = tu_loader(tr, 4, true), *vl = tu_loader(va, 6, false);
    lm_module m = {.rows_ok = true};
    tu_module_init(&m.tu);
    fg_tmetric_opts o = {.num_classes = TU_CLASSES};
    m.train_acc = fg_accuracy_new(&o);
    m.val_acc = fg_accuracy_new(&o);
    m.check_epoch = fg_accuracy_new(&o); /* this rank's own: compared on one process */
    fg_lightning_module lm = tu_lm(&m.tu);
    lm.ud = &m;
    lm.training_step = lm_train;
    lm.validation_step = lm_val;
    lm.on_train_batch_end = NULL;
    lm.on_train_epoch_end = launched ? NULL : lm_train_epoch_end;
    lm.on_train_epoch_start = NULL;
    lm.on_validation_epoch_end = NULL;
    lm.on_before_optimizer_step = NULL;
    fg_logger *csv = fg_csv_logger_new(&(fg_csv_logger_opts){.save_dir = dir, .version = "v"});
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 2,
                                                      .devices = launched ? NULL : "1",
                                                      .strategy = launched ? "ddp" : NULL,
                                                      .num_sanity_val_steps = FG_COUNT(0),
                                                      .log_every_n_steps = 1,
                                                      .loggers = dir ? &csv : NULL,
                                                      .nloggers = dir ? 1 : 0,
                                                      .logger = dir ? FG_FLAG_DEFAULT : FG_OFF,
                                                      .enable_progress_bar = FG_OFF,
                                                      .enable_checkpointing = FG_OFF});
    CHECK_OK(fg_trainer_fit(t, &lm, tl, vl, NULL));
    out->val_acc = out->train_acc_epoch = NAN;
    CHECK(fg_trainer_callback_metric(t, "val_acc", &out->val_acc));
    CHECK(fg_trainer_callback_metric(t, "train_acc_epoch", &out->train_acc_epoch));
    double hits = NAN, n = NAN;
    CHECK(fg_trainer_callback_metric(t, "val_hits", &hits));
    CHECK(fg_trainer_callback_metric(t, "val_n", &n));
    CHECK_MSG(n == 36, "%g validation samples, want the whole set's 36", n);
    out->by_hand = hits / n;
    const fg_metric *pm;
    int64_t np = fg_trainer_metrics(t, FG_PROGRESS_BAR_METRICS, &pm);
    out->in_pbar = false;
    for (int64_t i = 0; i < np; i++) out->in_pbar |= !strcmp(pm[i].name, "val_acc");
    np = fg_trainer_metrics(t, FG_LOGGED_METRICS, &pm);
    out->in_logged = false;
    for (int64_t i = 0; i < np; i++) out->in_logged |= !strcmp(pm[i].name, "train_acc_step");
    out->rows_ok = m.rows_ok;
    out->csv_head[0] = '\0';
    fg_trainer_free(t);
    if (dir) {
        char path[1024];
        snprintf(path, sizeof path, "%s/lightning_logs/v/metrics.csv", dir);
        char *text = tu_read(path);
        if (text) {
            snprintf(out->csv_head, sizeof out->csv_head, "%.*s", (int)strcspn(text, "\r\n"), text);
            free(text);
        }
    }
    fg_logger_free(csv);
    fg_tmetric_free(m.train_acc);
    fg_tmetric_free(m.val_acc);
    fg_tmetric_free(m.check_epoch);
    fg_dataloader_free(tl);
    fg_dataloader_free(vl);
    fg_dataset_free(tr);
    fg_dataset_free(va);
    fg_module_free(m.tu.net);
}

TEST(step_and_epoch_values_reach_every_set) {
    lm_out o;
    lm_run(false, tu_subdir("one"), &o);
    CHECK(o.rows_ok);
    CHECK(o.in_pbar && o.in_logged);
    CHECK_MSG(o.val_acc == o.by_hand, "val_acc %.17g, by hand %.17g", o.val_acc, o.by_hand);
    CHECK_CONTAINS(o.csv_head, "train_acc_epoch");
    CHECK_CONTAINS(o.csv_head, "train_acc_step");
    CHECK_CONTAINS(o.csv_head, "val_acc");
}

static int ranks_fn(int rank, int world, void *arg) {
    (void)arg;
    tu_fake_launcher(rank, world, 40 + world);
    lm_out o;
    lm_run(true, NULL, &o);
    /* every rank holds the whole validation set's accuracy (its hits and
     * samples summed over the ranks by sync_dist), not its own share's */
    CHECK_MSG(o.val_acc == o.by_hand, "world %d rank %d: val_acc %.17g, by hand %.17g", world, rank,
              o.val_acc, o.by_hand);
    CHECK(o.rows_ok);
    return fg_cur_failed_ ? 1 : 0;
}

TEST(validation_accuracy_over_2_and_3_ranks) {
    for (int world = 2; world <= 3; world++)
        CHECK_MSG(fg_test_fork_ranks(world, ranks_fn, NULL, 300) == 0, "world %d", world);
    tu_clean_env();
}

TEST(refusals) {
    tu_clean_env();
    fg_dataset *tr = tu_dataset(8, 11);
    fg_dataloader *tl = tu_loader(tr, 4, false);
    lm_module m = {.forward_missing = 1};
    tu_module_init(&m.tu);
    fg_tmetric_opts o = {.num_classes = TU_CLASSES};
    m.train_acc = fg_accuracy_new(&o);
    m.check_epoch = fg_accuracy_new(&o);
    fg_lightning_module lm = tu_lm(&m.tu);
    lm.ud = &m;
    lm.training_step = lm_train;
    lm.validation_step = NULL;
    lm.on_train_epoch_start = NULL;
    lm.on_train_epoch_end = NULL;
    lm.on_before_optimizer_step = NULL;
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 1,
                                                      .devices = "1",
                                                      .logger = FG_OFF,
                                                      .enable_progress_bar = FG_OFF,
                                                      .enable_checkpointing = FG_OFF});
    CHECK_STATUS(fg_trainer_fit(t, &lm, tl, NULL, NULL), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "fg_tmetric_forward");
    CHECK_STATUS(fg_trainer_log_metric(t, "x", NULL, NULL), FG_EINVAL);
    fg_trainer_free(t);
    fg_tmetric_free(m.train_acc);
    fg_tmetric_free(m.check_epoch);
    fg_dataloader_free(tl);
    fg_dataset_free(tr);
    fg_module_free(m.tu.net);
}
