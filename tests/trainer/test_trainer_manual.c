/* Manual optimization and several optimizers in the Trainer (Lightning's
 * automatic_optimization = False): with one optimizer, a training_step that
 * zeroes, calls manual_backward and steps gives the automatic loop's bits
 * (one process, dropout on, and ddp, deepspeed_stage_2 and fsdp on 2 forked
 * ranks); with two optimizers
 * over two sub-modules each steps only its own parameters (the same bits
 * as one optimizer with a parameter group of the second's lr, and with
 * toggle_optimizer the other's gradients are never touched); the user's
 * scheduler is kept and resumed bitwise from a checkpoint; and the
 * refusals name what to do. */
#include <math.h>

#include "trainer_test_util.h"

/* ------------------------------------------------ one optimizer, bitwise */

typedef struct man_module {
    tu_module tu; /* first: the tu hooks get a tu_module */
    bool manual;
    fg_lr_scheduler *sched_seen;
} man_module;

static fg_tensor *manual_step(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)i;
    man_module *m = ud;
    m->tu.c.train_steps++;
    fg_optimizer *opt = fg_trainer_optimizer_at(t, 0);
    if (!opt) return NULL;
    fg_optimizer_zero_grad(opt);
    fg_tensor *loss = tu_loss(&m->tu, b);
    if (!loss) return NULL;
    if (fg_trainer_log(t, "loss", fg_item(loss), &(fg_log_opts){.on_epoch = FG_ON}) != FG_OK)
        return NULL;
    if (fg_trainer_manual_backward(t, loss) != FG_OK) return NULL;
    if (fg_trainer_optimizer_step(t, opt) != FG_OK) return NULL;
    return loss;
}

typedef struct one_out {
    char *params;
    size_t bytes;
    int64_t step, opt_hooks;
    double loss_epoch;
} one_out;

/* strategy NULL: one process; else the launched ranks' strategy */
static void one_run(bool manual, const char *strategy, one_out *out) {
    bool launched = strategy != NULL;
    if (!launched) tu_clean_env();
    fg_dataset *tr = tu_dataset(launched ? 64 : 32, 11);
    fg_dataloader *tl = tu_loader(tr, 4, true);
    man_module m = {.tu = {.adamw = true, .dropout = 0.2}, .manual = manual};
    tu_module_init(&m.tu);
    fg_lightning_module lm = tu_lm(&m.tu);
    lm.validation_step = NULL;
    if (manual) {
        lm.automatic_optimization = FG_OFF;
        lm.training_step = manual_step;
    } else {
        m.tu.log_train = true;
    }
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 2,
                                                      .seed = 42,
                                                      .devices = launched ? NULL : "1",
                                                      .strategy = strategy,
                                                      .enable_progress_bar = FG_OFF,
                                                      .enable_checkpointing = FG_OFF,
                                                      .logger = FG_OFF});
    CHECK(t != NULL);
    CHECK_OK(fg_trainer_fit(t, &lm, tl, NULL, NULL));
    fg_tensor *flat = fg_module_flat_params(m.tu.net);
    out->bytes = fg_tensor_nbytes(flat);
    out->params = malloc(out->bytes);
    memcpy(out->params, fg_tensor_data(flat), out->bytes);
    out->step = fg_trainer_global_step(t);
    out->opt_hooks = m.tu.c.opt_steps;
    out->loss_epoch = NAN;
    CHECK(fg_trainer_callback_metric(t, "loss_epoch", &out->loss_epoch));
    fg_trainer_free(t);
    fg_dataloader_free(tl);
    fg_dataset_free(tr);
    fg_module_free(m.tu.net);
}

static void check_same(const one_out *a, const one_out *b, const char *what) {
    CHECK_MSG(a->bytes == b->bytes && !memcmp(a->params, b->params, a->bytes),
              "%s: manual and automatic weights differ", what);
    CHECK_MSG(a->step == b->step && a->step == 16, "%s: steps %lld and %lld", what,
              (long long)a->step, (long long)b->step);
    CHECK_MSG(a->opt_hooks == b->opt_hooks, "%s: on_before_optimizer_step %lld and %lld", what,
              (long long)a->opt_hooks, (long long)b->opt_hooks);
    CHECK_MSG(!memcmp(&a->loss_epoch, &b->loss_epoch, sizeof(double)),
              "%s: loss_epoch %.17g and %.17g", what, a->loss_epoch, b->loss_epoch);
}

TEST(manual_one_optimizer_equals_automatic_bitwise) {
    one_out a, b;
    one_run(false, NULL, &a);
    one_run(true, NULL, &b);
    check_same(&a, &b, "one process");
    free(a.params);
    free(b.params);
}

/* under ddp, and under the sharded strategies, whose optimizer step runs
 * on each rank's shard (stage 2) or on the shard of a sharded model (fsdp's
 * FULL_SHARD): manual_backward and the user's step give the automatic
 * loop's bits there too */
static int ddp_rank(int rank, int world, void *arg) {
    (void)arg;
    static const char *const kinds[] = {"ddp", "deepspeed_stage_2", "fsdp"};
    for (int k = 0; k < 3; k++) {
        tu_fake_launcher(rank, world, 31 + 2 * k);
        one_out a, b;
        one_run(false, kinds[k], &a);
        tu_fake_launcher(rank, world, 32 + 2 * k);
        one_run(true, kinds[k], &b);
        char what[64];
        snprintf(what, sizeof what, "%s rank %d", kinds[k], rank);
        check_same(&a, &b, what);
        free(a.params);
        free(b.params);
    }
    return fg_cur_failed_ ? 1 : 0;
}

TEST(manual_equals_automatic_under_ddp_and_sharded) {
    CHECK(fg_test_fork_ranks(2, ddp_rank, NULL, 300) == 0);
    tu_clean_env();
}

/* ------------------------------------------------------ two optimizers */

/* Net: enc (Linear 4 -> 8), ReLU, head (Linear 8 -> 3), as one tree. */
static fg_tensor *net_forward(fg_module *m, fg_tensor *x, void *ud) {
    (void)ud;
    fg_tensor *h = fg_relu(fg_module_forward(fg_module_child(m, "enc"), x));
    return fg_module_forward(fg_module_child(m, "head"), h);
}

static fg_module *two_net(void) {
    fg_module *n = fg_module_new("Net", net_forward, NULL, NULL);
    if (fg_module_add_child(n, "enc", fg_linear_new(TU_DIM, 8, true, FG_F32)) != FG_OK ||
        fg_module_add_child(n, "head", fg_linear_new(8, TU_CLASSES, true, FG_F32)) != FG_OK ||
        fg_module_set_seed(n, 5) != FG_OK || fg_module_finalize(n) != FG_OK) {
        fg_module_free(n);
        return NULL;
    }
    return n;
}

typedef struct two_module {
    fg_module *net;
    int mode; /* 0 automatic, one SGD with a group; 1 manual, two SGDs, both step;
                 2 manual, toggle and step the head's only; 3 two optimizers, automatic;
                 4 two optimizers over the same parameters; 5 manual with a schedule;
                 6 manual, AdamW with a group over enc and SGD with momentum over
                 head, both step (state to checkpoint) */
    bool enc_grads_touched;
    int64_t steps_seen;
} two_module;

static fg_status two_configure(void *ud, fg_trainer *t, fg_optimizer_config *out) {
    (void)t;
    two_module *m = ud;
    fg_module *enc = fg_module_child(m->net, "enc"), *head = fg_module_child(m->net, "head");
    if (m->mode == 0) {
        out->optimizer = fg_sgd_new(m->net, &(fg_sgd_opts){.lr = 0.1});
        if (fg_optimizer_add_param_group(out->optimizer,
                                         &(fg_param_group){.params = "head.*", .lr = 0.05}) != 1)
            return fg_last_status();
        return FG_OK;
    }
    if (m->mode == 6) {
        out->optimizers[0] = fg_adamw_new(enc, &(fg_adamw_opts){.lr = 1e-2, .weight_decay = 0.1});
        out->optimizers[1] = fg_sgd_new(head, &(fg_sgd_opts){.lr = 0.05, .momentum = 0.9});
        out->noptimizers = 2;
        if (!out->optimizers[0] || !out->optimizers[1]) return fg_last_status();
        if (fg_optimizer_add_param_group(out->optimizers[0],
                                         &(fg_param_group){.params = "bias", .lr = 3e-3}) != 1)
            return fg_last_status();
        out->lr_schedulers[0] = fg_step_lr_new(out->optimizers[0], 1, 0.5);
        out->nlr_schedulers = 1;
        return out->lr_schedulers[0] ? FG_OK : fg_last_status();
    }
    out->optimizers[0] = fg_sgd_new(m->mode == 4 ? m->net : enc, &(fg_sgd_opts){.lr = 0.1});
    out->optimizers[1] = fg_sgd_new(head, &(fg_sgd_opts){.lr = 0.05});
    out->noptimizers = 2;
    if (m->mode == 5) out->schedule = &(fg_lr_schedule){.kind = FG_LR_CONSTANT, .lr = 0.1};
    return out->optimizers[0] && out->optimizers[1] ? FG_OK : fg_last_status();
}

static bool all_zero(fg_tensor *g) {
    const float *p = fg_tensor_data(g);
    for (int64_t i = 0; i < fg_tensor_numel(g); i++)
        if (p[i] != 0) return false;
    return true;
}

static fg_tensor *two_step(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)i;
    two_module *m = ud;
    fg_tensor *loss = fg_cross_entropy(fg_module_forward(m->net, b->x), b->y, -100);
    if (m->mode == 0) return loss;
    fg_optimizer *oe = fg_trainer_optimizer_at(t, 0), *oh = fg_trainer_optimizer_at(t, 1);
    fg_optimizer_zero_grad(oe);
    fg_optimizer_zero_grad(oh);
    if (m->mode == 2 && fg_trainer_toggle_optimizer(t, oh) != FG_OK) return NULL;
    if (fg_trainer_manual_backward(t, loss) != FG_OK) return NULL;
    if (!all_zero(fg_module_flat_grads(fg_module_child(m->net, "enc"))))
        m->enc_grads_touched = true;
    if ((m->mode == 1 || m->mode == 6) && fg_trainer_optimizer_step(t, oe) != FG_OK) return NULL;
    if (fg_trainer_optimizer_step(t, oh) != FG_OK) return NULL;
    if (m->mode == 2) fg_trainer_untoggle_optimizer(t, oh);
    m->steps_seen = fg_trainer_global_step(t);
    return NULL; /* Lightning's None: fine under manual optimization */
}

static fg_status two_fit(two_module *m, int64_t epochs, bool ckpt) {
    tu_clean_env();
    fg_dataset *tr = tu_dataset(24, 11);
    fg_dataloader *tl = tu_loader(tr, 4, true);
    fg_lightning_module lm = {.ud = m,
                              .model = m->net,
                              .configure_optimizers = two_configure,
                              .training_step = two_step,
                              .automatic_optimization = m->mode == 0 || m->mode == 3 ? 0 : FG_OFF};
    fg_trainer *t =
        fg_trainer_new(&(fg_trainer_opts){.max_epochs = epochs,
                                          .devices = "1",
                                          .enable_progress_bar = FG_OFF,
                                          .enable_checkpointing = ckpt ? FG_FLAG_DEFAULT : FG_OFF,
                                          .default_root_dir = tu_subdir("two"),
                                          .logger = FG_OFF});
    fg_status s = fg_trainer_fit(t, &lm, tl, NULL, NULL);
    fg_trainer_free(t);
    fg_dataloader_free(tl);
    fg_dataset_free(tr);
    return s;
}

static char *copy_params(fg_module *m, size_t *bytes) {
    fg_tensor *flat = fg_module_flat_params(m);
    *bytes = fg_tensor_nbytes(flat);
    char *p = malloc(*bytes);
    memcpy(p, fg_tensor_data(flat), *bytes);
    return p;
}

TEST(two_optimizers_each_step_their_own) {
    two_module a = {.net = two_net(), .mode = 0}, b = {.net = two_net(), .mode = 1};
    CHECK(a.net && b.net);
    size_t n0;
    char *init = copy_params(a.net, &n0);
    CHECK_OK(two_fit(&a, 2, false));
    CHECK_OK(two_fit(&b, 2, false));
    size_t na, nb;
    char *pa = copy_params(a.net, &na), *pb = copy_params(b.net, &nb);
    /* two SGDs with their lrs = one SGD with the head's group at its lr */
    CHECK(na == nb && !memcmp(pa, pb, na));
    CHECK(memcmp(pa, init, n0) != 0);
    CHECK_MSG(b.steps_seen == 2 * 12, "global_step %lld: two per batch", (long long)b.steps_seen);
    free(pa);
    free(pb);
    /* toggled: the head's optimizer alone steps, the encoder's gradients stay zero */
    two_module c = {.net = two_net(), .mode = 2};
    CHECK_OK(two_fit(&c, 1, false));
    CHECK(!c.enc_grads_touched);
    CHECK(b.enc_grads_touched); /* without the toggle they are computed */
    fg_module *enc = fg_module_child(c.net, "enc"), *head = fg_module_child(c.net, "head");
    int64_t enc_off = fg_module_param_offset(c.net, fg_module_find_param(c.net, "enc.weight"));
    int64_t head_off = fg_module_param_offset(c.net, fg_module_find_param(c.net, "head.weight"));
    const char *pc = fg_tensor_data(fg_module_flat_params(c.net));
    CHECK(!memcmp(pc + enc_off * 4, init + enc_off * 4, (size_t)fg_module_numel(enc) * 4));
    CHECK(memcmp(pc + head_off * 4, init + head_off * 4, (size_t)fg_module_numel(head) * 4));
    /* untoggled: every parameter requires gradients again */
    for (int64_t i = 0; i < fg_module_num_params(c.net); i++)
        CHECK(fg_tensor_requires_grad(fg_module_param(c.net, i)));
    CHECK(c.steps_seen == 6);
    free(init);
    fg_module_free(a.net);
    fg_module_free(b.net);
    fg_module_free(c.net);
}

TEST(refusals_name_what_to_do) {
    two_module m = {.net = two_net(), .mode = 3};
    CHECK_STATUS(two_fit(&m, 1, false), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "automatic_optimization = FG_OFF");
    m.mode = 4;
    CHECK_STATUS(two_fit(&m, 1, false), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "share parameters");
    m.mode = 5;
    CHECK_STATUS(two_fit(&m, 1, false), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "step it yourself");
    fg_module_free(m.net);
    /* manual calls from an automatic module, and automatic options refused */
    tu_clean_env();
    fg_dataset *tr = tu_dataset(8, 11);
    fg_dataloader *tl = tu_loader(tr, 4, false);
    man_module mm = {.tu = {.adamw = true}};
    tu_module_init(&mm.tu);
    fg_lightning_module lm = tu_lm(&mm.tu);
    lm.validation_step = NULL;
    lm.training_step = manual_step; /* automatic: manual_backward is refused */
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 1,
                                                      .devices = "1",
                                                      .enable_progress_bar = FG_OFF,
                                                      .enable_checkpointing = FG_OFF,
                                                      .logger = FG_OFF});
    CHECK_STATUS(fg_trainer_fit(t, &lm, tl, NULL, NULL), FG_ESTATE);
    CHECK_CONTAINS(fg_last_error(), "automatic_optimization = FG_OFF");
    fg_trainer_free(t);
    lm.automatic_optimization = FG_OFF;
    t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 1,
                                          .devices = "1",
                                          .accumulate_grad_batches = 2,
                                          .enable_progress_bar = FG_OFF,
                                          .enable_checkpointing = FG_OFF,
                                          .logger = FG_OFF});
    CHECK_STATUS(fg_trainer_fit(t, &lm, tl, NULL, NULL), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "accumulate in training_step");
    fg_trainer_free(t);
    fg_dataloader_free(tl);
    fg_dataset_free(tr);
    fg_module_free(mm.tu.net);
}

/* ---------------------------------- the user's scheduler, resumed bitwise */

typedef struct sch_module {
    man_module mm;
    int64_t accumulate; /* the user's own accumulation: step every n batches */
} sch_module;

static fg_status sch_configure(void *ud, fg_trainer *t, fg_optimizer_config *out) {
    (void)t;
    sch_module *m = ud;
    out->optimizer = fg_adam_new(m->mm.tu.net, &(fg_adam_opts){.lr = 1e-2});
    out->scheduler = out->optimizer ? fg_step_lr_new(out->optimizer, 1, 0.5) : NULL;
    return out->scheduler ? FG_OK : fg_last_status();
}

static fg_tensor *sch_step(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    sch_module *m = ud;
    fg_optimizer *opt = fg_trainer_optimizer_at(t, 0);
    fg_tensor *loss = fg_scale(tu_loss(&m->mm.tu, b), 1.0 / (double)m->accumulate);
    if (!loss || fg_trainer_manual_backward(t, loss) != FG_OK) return NULL;
    if ((i + 1) % m->accumulate == 0) {
        if (fg_trainer_optimizer_step(t, opt) != FG_OK) return NULL;
        fg_optimizer_zero_grad(opt);
    }
    return loss;
}

static fg_status sch_epoch_end(void *ud, fg_trainer *t) {
    (void)ud;
    return fg_lr_scheduler_step(fg_trainer_lr_scheduler(t, 0));
}

static void sch_run(const char *dir, const char *ckpt, char **params, size_t *bytes, double *lr,
                    int64_t *step) {
    tu_clean_env();
    fg_dataset *tr = tu_dataset(32, 11);
    fg_dataloader *tl = tu_loader(tr, 4, true);
    sch_module m = {.mm = {.tu = {.dropout = 0.2}}, .accumulate = 2};
    tu_module_init(&m.mm.tu);
    fg_lightning_module lm = {.ud = &m,
                              .model = m.mm.tu.net,
                              .automatic_optimization = FG_OFF,
                              .configure_optimizers = sch_configure,
                              .training_step = sch_step,
                              .on_train_epoch_end = sch_epoch_end};
    fg_callback *ck = fg_model_checkpoint_new(
        &(fg_checkpoint_opts){.dirpath = dir, .every_n_train_steps = 3, .save_top_k = -1});
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 3,
                                                      .seed = 9,
                                                      .devices = "1",
                                                      .callbacks = &ck,
                                                      .ncallbacks = 1,
                                                      .enable_progress_bar = FG_OFF,
                                                      .logger = FG_OFF});
    CHECK_OK(fg_trainer_fit(t, &lm, tl, NULL, ckpt));
    CHECK(fg_trainer_num_lr_schedulers(t) == 1 && fg_trainer_num_optimizers(t) == 1);
    *lr = fg_optimizer_lr(fg_trainer_optimizer_at(t, 0));
    *step = fg_trainer_global_step(t);
    *params = copy_params(m.mm.tu.net, bytes);
    fg_trainer_free(t);
    fg_callback_free(ck);
    fg_dataloader_free(tl);
    fg_dataset_free(tr);
    fg_module_free(m.mm.tu.net);
}

TEST(manual_scheduler_and_accumulation_resume_bitwise) {
    const char *d = tu_subdir("sched");
    char dir[600];
    snprintf(dir, sizeof dir, "%s", d);
    char *whole, *r;
    size_t nw, nr;
    double lrw, lrr;
    int64_t sw, sr;
    sch_run(dir, NULL, &whole, &nw, &lrw, &sw);
    /* 8 batches an epoch, a step every 2: 4 steps an epoch; StepLR halves each epoch */
    CHECK_MSG(sw == 12, "global_step %lld", (long long)sw);
    CHECK(lrw == 1e-2 / 8);
    char names[2048];
    tu_list(dir, ".safetensors", names, sizeof names);
    CHECK_CONTAINS(names, "epoch=1-step=6.safetensors");
    static const char *const from[] = {"epoch=0-step=3", "epoch=1-step=6", "epoch=2-step=9"};
    for (int i = 0; i < 3; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s.safetensors", dir, from[i]);
        char sub[700];
        snprintf(sub, sizeof sub, "%s/r%d", dir, i);
        mkdir(sub, 0700);
        sch_run(sub, path, &r, &nr, &lrr, &sr);
        CHECK_MSG(nr == nw && !memcmp(r, whole, nw), "resumed from %s: other weights", from[i]);
        CHECK(lrr == lrw && sr == sw);
        free(r);
    }
    free(whole);
}

/* ------------------------- two optimizers checkpointed, resumed bitwise */

static fg_status two_epoch_end(void *ud, fg_trainer *t) {
    (void)ud;
    return fg_lr_scheduler_step(fg_trainer_lr_scheduler(t, 0));
}

/* mode 6 for 3 epochs (6 batches, 12 optimizer steps each), a checkpoint
 * every 4 steps into dir, from ckpt when given */
static void two_run(const char *dir, const char *ckpt, char **params, size_t *bytes, double lr[3],
                    int64_t *step) {
    tu_clean_env();
    fg_dataset *tr = tu_dataset(24, 11);
    fg_dataloader *tl = tu_loader(tr, 4, true);
    two_module m = {.net = two_net(), .mode = 6};
    fg_lightning_module lm = {.ud = &m,
                              .model = m.net,
                              .configure_optimizers = two_configure,
                              .training_step = two_step,
                              .on_train_epoch_end = two_epoch_end,
                              .automatic_optimization = FG_OFF};
    fg_callback *ck = fg_model_checkpoint_new(
        &(fg_checkpoint_opts){.dirpath = dir, .every_n_train_steps = 4, .save_top_k = -1});
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 3,
                                                      .seed = 9,
                                                      .devices = "1",
                                                      .callbacks = &ck,
                                                      .ncallbacks = 1,
                                                      .enable_progress_bar = FG_OFF,
                                                      .logger = FG_OFF});
    CHECK_OK(fg_trainer_fit(t, &lm, tl, NULL, ckpt));
    CHECK(fg_trainer_num_optimizers(t) == 2);
    lr[0] = fg_optimizer_lr(fg_trainer_optimizer_at(t, 0));
    lr[1] = fg_optimizer_group_lr(fg_trainer_optimizer_at(t, 0), 1);
    lr[2] = fg_optimizer_lr(fg_trainer_optimizer_at(t, 1));
    *step = fg_trainer_global_step(t);
    *params = copy_params(m.net, bytes);
    fg_trainer_free(t);
    fg_callback_free(ck);
    fg_dataloader_free(tl);
    fg_dataset_free(tr);
    fg_module_free(m.net);
}

TEST(two_optimizers_checkpoint_and_resume_bitwise) {
    const char *d = tu_subdir("two_ckpt");
    char dir[600];
    snprintf(dir, sizeof dir, "%s", d);
    char *whole, *r;
    size_t nw, nr;
    double lrw[3], lrr[3];
    int64_t sw, sr;
    two_run(dir, NULL, &whole, &nw, lrw, &sw);
    CHECK_MSG(sw == 36, "global_step %lld: two per batch", (long long)sw);
    CHECK(lrw[0] == 1e-2 / 8 && lrw[2] == 0.05);
    char names[2048];
    tu_list(dir, ".safetensors", names, sizeof names);
    CHECK_CONTAINS(names, "epoch=1-step=16.safetensors");
    /* each optimizer's state under its own prefix, and its settings */
    char path[1024];
    snprintf(path, sizeof path, "%s/epoch=1-step=16.safetensors", dir);
    fg_st_file *f = fg_st_open(path);
    CHECK_MSG(f, "%s", fg_last_error());
    if (f) {
        CHECK(fg_st_find(f, "optimizer.0.exp_avg.weight") >= 0);
        CHECK(fg_st_find(f, "optimizer.0.exp_avg_sq.bias") >= 0);
        CHECK(fg_st_find(f, "optimizer.1.momentum_buffer.weight") >= 0);
        const char *n = fg_st_meta_get(f, "optimizers");
        const char *s0 = fg_st_meta_get(f, "optimizer.0.optimizer_steps");
        const char *lr0 = fg_st_meta_get(f, "optimizer.0.lr");
        CHECK(n && !strcmp(n, "2") && s0 && !strcmp(s0, "8"));
        CHECK(lr0 && strtod(lr0, NULL) == 1e-2 / 2);
        fg_st_close(f);
    }
    static const char *const from[] = {"epoch=0-step=4", "epoch=1-step=16", "epoch=2-step=32"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s.safetensors", dir, from[i]);
        char sub[700];
        snprintf(sub, sizeof sub, "%s/r%d", dir, i);
        mkdir(sub, 0700);
        two_run(sub, path, &r, &nr, lrr, &sr);
        CHECK_MSG(nr == nw && !memcmp(r, whole, nw), "resumed from %s: other weights", from[i]);
        CHECK(lrr[0] == lrw[0] && lrr[1] == lrw[1] && lrr[2] == lrw[2] && sr == sw);
        free(r);
    }
    free(whole);
}
