/* The Trainer with a PyTorch scheduler (fg_optimizer_config.scheduler,
 * Lightning's lr_scheduler_config): interval step with a frequency, interval
 * epoch, ReduceLROnPlateau on a monitored validation metric (by epoch and
 * by step), the errors (no monitor, a monitor never logged, a scheduler on
 * another optimizer), and a run with parameter groups and a chained
 * scheduler (or a plateau) resumed from checkpoints taken anywhere ending
 * with the straight run's bits and learning rates. */
#include <math.h>

#include "trainer_test_util.h"

typedef struct sched_case {
    int kind; /* 0 StepLR(1, 0.5); 1 ExponentialLR(0.5); 2 plateau by epoch on val_loss;
                 3 plateau by step on val_loss; 4 Adam in groups + Chained(LinearLR, Cosine);
                 5 AdamW + plateau by epoch; 6 plateau without monitor; 7 monitor never logged;
                 8 scheduler on another optimizer; 9 an lr_at schedule going negative */
    fg_lr_interval interval;
    int64_t frequency;
    fg_optimizer *other; /* kind 8 */
} sched_case;

typedef struct sched_module {
    tu_module tu; /* first: the tu hooks get a tu_module */
    sched_case c;
    double lr_at_batch[64]; /* group 0's lr at each batch start (global batch index) */
    double lr1_at_batch[64];
    int64_t nbatches;
} sched_module;

/* 0.1 for indices 0-2, then -1, which the optimizer refuses */
static double negative_from_3(void *ud, int64_t i) {
    (void)ud;
    return i < 3 ? 0.1 : -1.0;
}

static fg_status sched_configure(void *ud, fg_trainer *t, fg_optimizer_config *out) {
    (void)t;
    sched_module *m = ud;
    fg_module *net = m->tu.net;
    out->interval = m->c.interval;
    out->frequency = m->c.frequency;
    switch (m->c.kind) {
    case 0:
    case 1:
    case 2:
    case 3:
    case 6:
    case 7:
    case 8:
    case 9: out->optimizer = fg_sgd_new(net, &(fg_sgd_opts){.lr = 0.1, .momentum = 0.9}); break;
    case 4: {
        out->optimizer = fg_adam_new(net, &(fg_adam_opts){.lr = 1e-2, .weight_decay = 1e-3});
        CHECK(fg_optimizer_add_param_group(out->optimizer,
                                           &(fg_param_group){.params = "2.*", .lr = 3e-2}) == 1);
        CHECK_OK(fg_optimizer_no_decay_bias_norm_embedding(out->optimizer, NULL));
        break;
    }
    default: out->optimizer = fg_adamw_new(net, &(fg_adamw_opts){.lr = 1e-2}); break;
    }
    fg_optimizer *o = m->c.kind == 8 ? m->c.other : out->optimizer;
    switch (m->c.kind) {
    case 0:
    case 8: out->scheduler = fg_step_lr_new(o, 1, 0.5); break;
    case 1: out->scheduler = fg_exponential_lr_new(o, 0.5); break;
    case 2:
    case 3:
    case 5:
        out->scheduler = fg_reduce_lr_on_plateau_new(
            o, &(fg_plateau_opts){.patience_zero = true, .factor = 0.5, .threshold_zero = true});
        out->monitor = "val_loss";
        break;
    case 4: {
        fg_lr_scheduler *p[2] = {
            fg_linear_lr_new(o, &(fg_linear_lr_opts){.start_factor = 0.2, .total_iters = 3}),
            fg_cosine_annealing_lr_new(o, 9, 1e-4)};
        out->scheduler = fg_chained_scheduler_new(p, 2);
        break;
    }
    case 6: out->scheduler = fg_reduce_lr_on_plateau_new(o, NULL); break;
    case 9: out->lr_at = negative_from_3; return out->optimizer ? FG_OK : fg_last_status();
    default:
        out->scheduler = fg_reduce_lr_on_plateau_new(o, NULL);
        out->monitor = "no_such_metric";
        break;
    }
    return out->optimizer && out->scheduler ? FG_OK : fg_last_status();
}

static fg_status record_lr(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)b;
    (void)i;
    sched_module *m = ud;
    fg_optimizer *o = fg_trainer_optimizer(t);
    if (m->nbatches < 64) {
        m->lr_at_batch[m->nbatches] = fg_optimizer_group_lr(o, 0);
        m->lr1_at_batch[m->nbatches] = fg_optimizer_group_lr(o, fg_optimizer_num_groups(o) - 1);
    }
    m->nbatches++;
    return FG_OK;
}

typedef struct run_out {
    fg_status st;
    char err[512];
    char *params;
    size_t bytes;
    double lr0, lr1;
    int64_t step;
} run_out;

static fg_logger *g_logger; /* a test's logger, or none */

/* 10 batches of 4 an epoch; val every val_every batches (0: each epoch) */
static void run(sched_module *m, int64_t max_epochs, int64_t max_steps, int64_t val_every,
                const double *val_curve, int64_t ncurve, fg_callback *cb, const char *ckpt,
                run_out *out) {
    tu_clean_env();
    fg_dataset *tr = tu_dataset(40, 11), *va = tu_dataset(8, 12);
    fg_dataloader *tl = tu_loader(tr, 4, true), *vl = tu_loader(va, 4, false);
    m->tu.log_val = true;
    m->tu.log_train = true;
    m->tu.val_curve = val_curve;
    m->tu.val_curve_n = ncurve;
    tu_module_init(&m->tu);
    m->nbatches = 0;
    fg_lightning_module lm = tu_lm(&m->tu);
    lm.ud = m;
    lm.configure_optimizers = sched_configure;
    lm.on_train_batch_start = record_lr;
    fg_trainer *t = fg_trainer_new(
        &(fg_trainer_opts){.max_epochs = max_epochs,
                           .max_steps = max_steps ? max_steps : -1,
                           .val_check_interval = val_every ? FG_COUNT(val_every) : FG_FRACTION(1.0),
                           .num_sanity_val_steps = FG_COUNT(0),
                           .seed = 42,
                           .devices = "1",
                           .callbacks = cb ? &cb : NULL,
                           .ncallbacks = cb ? 1 : 0,
                           .enable_progress_bar = FG_OFF,
                           .enable_checkpointing = FG_OFF,
                           .log_every_n_steps = 1,
                           .loggers = g_logger ? &g_logger : NULL,
                           .nloggers = g_logger ? 1 : 0,
                           .logger = g_logger ? FG_FLAG_DEFAULT : FG_OFF});
    out->st = fg_trainer_fit(t, &lm, tl, vl, ckpt);
    snprintf(out->err, sizeof out->err, "%s", out->st != FG_OK ? fg_last_error() : "");
    fg_optimizer *o = fg_trainer_optimizer(t);
    out->lr0 = o ? fg_optimizer_group_lr(o, 0) : 0;
    out->lr1 = o ? fg_optimizer_group_lr(o, fg_optimizer_num_groups(o) - 1) : 0;
    fg_tensor *p = fg_module_flat_params(m->tu.net);
    out->bytes = fg_tensor_nbytes(p);
    out->params = malloc(out->bytes);
    memcpy(out->params, fg_tensor_data(p), out->bytes);
    out->step = fg_trainer_global_step(t);
    fg_trainer_free(t);
    fg_dataloader_free(tl);
    fg_dataloader_free(vl);
    fg_dataset_free(tr);
    fg_dataset_free(va);
    fg_module_free(m->tu.net);
}

TEST(interval_step_with_frequency) {
    /* StepLR(1, 0.5) every 2 optimizer steps: (batch_idx + 1) % 2 == 0 */
    sched_module m = {.c = {.kind = 0, .interval = FG_INTERVAL_STEP, .frequency = 2}};
    run_out r;
    run(&m, 2, 0, 0, NULL, 0, NULL, NULL, &r);
    CHECK_OK(r.st);
    CHECK(m.nbatches == 20);
    for (int64_t b = 0; b < 20; b++)
        CHECK_MSG(m.lr_at_batch[b] == 0.1 * pow(0.5, (double)((b % 10) / 2 + 5 * (b / 10))),
                  "batch %lld: lr %.17g", (long long)b, m.lr_at_batch[b]);
    CHECK(r.lr0 == 0.1 * pow(0.5, 10));
    free(r.params);
}

TEST(interval_epoch) {
    sched_module m = {.c = {.kind = 1, .interval = FG_INTERVAL_EPOCH}};
    run_out r;
    run(&m, 3, 0, 0, NULL, 0, NULL, NULL, &r);
    CHECK_OK(r.st);
    for (int64_t b = 0; b < 30; b++)
        CHECK_MSG(m.lr_at_batch[b] == 0.1 * pow(0.5, (double)(b / 10)), "batch %lld: lr %.17g",
                  (long long)b, m.lr_at_batch[b]);
    CHECK(r.lr0 == 0.1 * 0.125);
    free(r.params);
    /* frequency 2: after epochs 2 and 4 */
    m = (sched_module){.c = {.kind = 1, .interval = FG_INTERVAL_EPOCH, .frequency = 2}};
    run(&m, 4, 0, 0, NULL, 0, NULL, NULL, &r);
    CHECK_OK(r.st);
    CHECK(m.lr_at_batch[15] == 0.1 && m.lr_at_batch[25] == 0.05 && r.lr0 == 0.025);
    free(r.params);
}

TEST(plateau_on_val_loss) {
    /* patience 0, threshold 0: every epoch whose val_loss is not below the
     * best halves the lr, after that epoch's validation */
    static const double curve[] = {1.0, 0.8, 0.9, 0.7, 0.7, 0.6};
    sched_module m = {.c = {.kind = 2, .interval = FG_INTERVAL_EPOCH}};
    run_out r;
    run(&m, 6, 0, 0, curve, 6, NULL, NULL, &r);
    CHECK_OK(r.st);
    static const double want[] = {0.1, 0.1, 0.1, 0.05, 0.05, 0.025};
    for (int e = 0; e < 6; e++)
        CHECK_MSG(m.lr_at_batch[10 * e + 3] == want[e], "epoch %d: lr %.17g, want %g", e,
                  m.lr_at_batch[10 * e + 3], want[e]);
    CHECK(r.lr0 == 0.025);
    free(r.params);
    /* by step (frequency 5): it steps after the validation of batches 5 and
     * 10, on that validation's val_loss (the curve is by epoch: constant in
     * one): epoch 0's first sets the best, its second halves the lr; epoch
     * 1's first improves, its second halves again */
    m = (sched_module){.c = {.kind = 3, .interval = FG_INTERVAL_STEP, .frequency = 5}};
    run(&m, 2, 0, 5, curve, 6, NULL, NULL, &r);
    CHECK_OK(r.st);
    CHECK_MSG(m.lr_at_batch[4] == 0.1 && m.lr_at_batch[5] == 0.1 && m.lr_at_batch[10] == 0.05 &&
                  m.lr_at_batch[15] == 0.05 && r.lr0 == 0.025,
              "%g %g %g %g %g", m.lr_at_batch[4], m.lr_at_batch[5], m.lr_at_batch[10],
              m.lr_at_batch[15], r.lr0);
    free(r.params);
}

TEST(errors) {
    sched_module m = {.c = {.kind = 6}};
    run_out r;
    run(&m, 1, 0, 0, NULL, 0, NULL, NULL, &r);
    CHECK_STATUS(r.st, FG_EINVAL);
    CHECK_CONTAINS(r.err, "ReduceLROnPlateau needs out->monitor");
    free(r.params);
    m = (sched_module){.c = {.kind = 7}};
    run(&m, 1, 0, 0, NULL, 0, NULL, NULL, &r);
    CHECK_STATUS(r.st, FG_EINVAL);
    CHECK_CONTAINS(r.err, "conditioned on metric \"no_such_metric\"");
    CHECK_CONTAINS(r.err, "val_loss");
    free(r.params);
    /* a schedule's lr the optimizer refuses stops the run, naming the index */
    m = (sched_module){.c = {.kind = 9, .interval = FG_INTERVAL_STEP, .frequency = 1}};
    run(&m, 1, 0, 0, NULL, 0, NULL, NULL, &r);
    CHECK_STATUS(r.st, FG_EINVAL);
    CHECK_CONTAINS(r.err, "the lr schedule at 3");
    CHECK_CONTAINS(r.err, "lr = -1");
    CHECK(m.nbatches == 3 && r.lr0 == 0.1);
    free(r.params);
    fg_module *net = fg_linear_new(2, 2, true, FG_F32);
    m = (sched_module){.c = {.kind = 8, .other = fg_sgd_new(net, NULL)}};
    run(&m, 1, 0, 0, NULL, 0, NULL, NULL, &r);
    CHECK_STATUS(r.st, FG_EINVAL);
    CHECK_CONTAINS(r.err, "another optimizer");
    free(r.params);
    fg_optimizer_free(m.c.other);
    fg_module_free(net);
}

/* LearningRateMonitor: per step with a scheduler by step, one column per
 * group ("lr-Adam/pg1", "lr-Adam/pg2"), the lrs the batches ran with */
typedef struct cap_logger {
    double lr[2][64];
    int64_t step[2][64];
    int n[2];
    bool bad_name;
} cap_logger;

static fg_status cap_log(void *ud, const fg_metric *m, int64_t n, int64_t step) {
    cap_logger *c = ud;
    for (int64_t i = 0; i < n; i++) {
        if (strncmp(m[i].name, "lr-", 3)) continue;
        int g = !strcmp(m[i].name, "lr-Adam/pg1") ? 0 : !strcmp(m[i].name, "lr-Adam/pg2") ? 1 : -1;
        if (g < 0) {
            c->bad_name = true;
            continue;
        }
        if (c->n[g] < 64) {
            c->step[g][c->n[g]] = step;
            c->lr[g][c->n[g]++] = m[i].value;
        }
    }
    return FG_OK;
}

TEST(lr_monitor_per_group) {
    cap_logger cap = {0};
    g_logger = fg_logger_new(&(fg_logger_ops){.log_metrics = cap_log}, &cap);
    fg_callback *mon = fg_lr_monitor_new(NULL);
    sched_module m = {.c = {.kind = 4, .interval = FG_INTERVAL_STEP}};
    run_out r;
    run(&m, 1, 0, 0, NULL, 0, mon, NULL, &r);
    CHECK_OK(r.st);
    CHECK(!cap.bad_name);
    CHECK_MSG(cap.n[0] == 10 && cap.n[1] == 10, "%d and %d rows", cap.n[0], cap.n[1]);
    for (int k = 0; k < cap.n[0] && k < 10; k++) {
        int64_t b = cap.step[0][k];
        CHECK(b == k && cap.step[1][k] == k);
        CHECK_MSG(cap.lr[0][k] == m.lr_at_batch[b] && cap.lr[1][k] == m.lr1_at_batch[b],
                  "step %lld: logged %g/%g, the batch ran with %g/%g", (long long)b, cap.lr[0][k],
                  cap.lr[1][k], m.lr_at_batch[b], m.lr1_at_batch[b]);
    }
    CHECK(m.lr_at_batch[0] != m.lr1_at_batch[0] && m.lr_at_batch[1] != m.lr_at_batch[0]);
    free(r.params);
    fg_callback_free(mon);
    fg_logger_free(g_logger);
    g_logger = NULL;
}

/* -------------------------------------------------------------- resume */

typedef struct saver {
    const char *dir;
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
    int64_t e = fg_trainer_current_epoch(t);
    if (e == 0 && i == 3) return save_as(ud, t, "a-batch");
    if (e == 1 && i == 6) return save_as(ud, t, "c-batch");
    return FG_OK;
}

static fg_status sv_epoch_end(void *ud, fg_trainer *t) {
    if (fg_trainer_current_epoch(t) == 0) return save_as(ud, t, "b-epoch-end");
    return FG_OK;
}

static void resume_case(sched_case c, const char *what) {
    static const double curve[] = {1.0, 0.9, 0.95, 0.7};
    const char *dir = tu_subdir(what);
    saver s = {.dir = dir};
    fg_callback *cb = fg_callback_new(&(fg_callback_ops){.name = "saver",
                                                         .on_train_batch_end = sv_batch_end,
                                                         .on_train_epoch_end = sv_epoch_end},
                                      &s);
    sched_module m = {.c = c};
    run_out whole, plain;
    run(&m, 3, 0, 5, curve, 4, cb, NULL, &whole);
    CHECK_OK(whole.st);
    CHECK_MSG(s.saved == 3, "%d checkpoints", s.saved);
    run(&m, 3, 0, 5, curve, 4, NULL, NULL, &plain);
    CHECK(!memcmp(plain.params, whole.params, whole.bytes) && plain.lr0 == whole.lr0);
    CHECK_MSG(whole.lr0 != 1e-2, "%s: the lr never moved", what);
    if (c.kind == 4) CHECK(whole.lr1 != whole.lr0); /* two groups, two lrs */
    free(plain.params);
    static const char *const names[] = {"a-batch", "b-epoch-end", "c-batch"};
    for (int i = 0; i < 3; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s.safetensors", dir, names[i]);
        run_out r;
        run(&m, 3, 0, 5, curve, 4, NULL, path, &r);
        CHECK_OK(r.st);
        CHECK_MSG(r.bytes == whole.bytes && !memcmp(r.params, whole.params, whole.bytes),
                  "%s resumed from %s: other weights", what, names[i]);
        CHECK_MSG(!memcmp(&r.lr0, &whole.lr0, sizeof(double)) &&
                      !memcmp(&r.lr1, &whole.lr1, sizeof(double)),
                  "%s resumed from %s: lr %.17g/%.17g, straight %.17g/%.17g", what, names[i], r.lr0,
                  r.lr1, whole.lr0, whole.lr1);
        free(r.params);
    }
    free(whole.params);
    fg_callback_free(cb);
}

TEST(resume_is_bitwise) {
    resume_case((sched_case){.kind = 4, .interval = FG_INTERVAL_STEP}, "sched-chained");
    resume_case((sched_case){.kind = 5, .interval = FG_INTERVAL_EPOCH}, "sched-plateau");
}
