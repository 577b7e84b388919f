/* A GAN trained by the Trainer with manual optimization (Lightning's
 * automatic_optimization = False and its basic GAN example): a generator
 * maps noise to 2-D points, a discriminator tells them from points of a
 * ring of 8 Gaussians (radius 2); configure_optimizers returns two Adams,
 * and training_step steps each in turn with toggle_optimizer:
 *
 *   example_gan                          one process, 30 epochs
 *   example_gan --max-epochs 8           shorter
 *   example_gan --devices 2 --strategy ddp
 *   example_gan --accelerator guarded    on the test device (docs/devices.md)
 *   example_gan --default-root-dir runs --ckpt-path runs/checkpoints/...
 *
 * The two models are children of one container module ("generator",
 * "discriminator"), so that ddp reduces both through one flat buffer; under
 * ddp toggling leaves the other model without gradients, which is what
 * find_unused_parameters allows. One line per epoch on rank 0:
 * "epoch E d_loss X g_loss Y d_acc Z", d_acc being the discriminator's
 * accuracy on the epoch's real and generated points; at the end the
 * generated points' mean radius and the share of them within 0.5 of a
 * mode. Checkpoints (ModelCheckpoint's defaults: the last epoch's, under
 * --default-root-dir/checkpoints) hold both models and both Adams' states
 * and lrs; --ckpt-path resumes from one as the uninterrupted run goes on.
 * Exit 2 for bad flags, 1 if training failed. */
#include <fulgur/fulgur.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOISE 8
#define HIDDEN 64
#define MODES 8
#define RADIUS 2.0

/* Real point i: mode i % 8 of the ring, plus N(0, 0.05^2) noise. */
static fg_status sample(void *ud, int64_t i, void *x_out, void *y_out) {
    float *x = x_out, e[2];
    fg_rng_fill_normal(*(uint64_t *)ud, (uint64_t)i * 2, e, 2, 0, 0.05f);
    double a = 2 * M_PI * (double)(i % MODES) / MODES;
    x[0] = (float)(RADIUS * cos(a)) + e[0];
    x[1] = (float)(RADIUS * sin(a)) + e[1];
    *(int32_t *)y_out = (int32_t)(i % MODES);
    return FG_OK;
}
static int64_t length(void *ud) {
    (void)ud;
    return 2048;
}
static void spec(void *ud, fg_sample_spec *x, fg_sample_spec *y) {
    (void)ud;
    *x = (fg_sample_spec){.dtype = FG_F32, .ndim = 1, .shape = {2}};
    *y = (fg_sample_spec){.dtype = FG_I32, .ndim = 0};
}

static fg_module *mlp(int64_t in, int64_t out, bool leaky) {
    fg_module *s = fg_sequential_new();
    fg_status st = fg_sequential_append(s, fg_linear_new(in, HIDDEN, true, FG_F32));
    if (!st) st = fg_sequential_append(s, leaky ? fg_leaky_relu_new(0.2) : fg_relu_new());
    if (!st) st = fg_sequential_append(s, fg_linear_new(HIDDEN, HIDDEN, true, FG_F32));
    if (!st) st = fg_sequential_append(s, leaky ? fg_leaky_relu_new(0.2) : fg_relu_new());
    if (!st) st = fg_sequential_append(s, fg_linear_new(HIDDEN, out, true, FG_F32));
    if (st) {
        fg_module_free(s);
        return NULL;
    }
    return s;
}

typedef struct gan {
    fg_module *net, *g, *d;
    uint64_t seed;
    int64_t epochs;
    const char *ckpt_path; /* resume from there (NULL: from the start) */
} gan;

static fg_module *configure_model(void *ud, fg_trainer *t) {
    (void)t;
    gan *m = ud;
    if (m->net) return m->net;
    fg_module *net = fg_module_new("GAN", NULL, NULL, NULL);
    if (!net || fg_module_add_child(net, "generator", mlp(NOISE, 2, false)) ||
        fg_module_add_child(net, "discriminator", mlp(2, 1, true)) ||
        fg_module_set_seed(net, m->seed) || fg_module_finalize(net)) {
        fg_module_free(net);
        return NULL;
    }
    m->net = net;
    m->g = fg_module_child(net, "generator");
    m->d = fg_module_child(net, "discriminator");
    return net;
}

static fg_status configure_optimizers(void *ud, fg_trainer *t, fg_optimizer_config *out) {
    (void)t;
    gan *m = ud;
    /* Lightning's example: Adam(lr=2e-4, betas=(0.5, 0.999)) for both */
    fg_adam_opts o = {.lr = 1e-3, .beta1 = 0.5, .beta2 = 0.999};
    out->optimizers[0] = fg_adam_new(m->g, &o);
    out->optimizers[1] = fg_adam_new(m->d, &o);
    out->noptimizers = 2;
    return out->optimizers[0] && out->optimizers[1] ? FG_OK : fg_last_status();
}

/* z ~ N(0, 1), (B, NOISE), from a stream of the batch and the rank: drawn
 * in host memory, then a step tensor made from it (on the run's device, a
 * copy in: the step tensors there are device memory). */
static fg_tensor *noise(fg_trainer *t, int64_t b, uint64_t which) {
    float *h = malloc(sizeof(float) * (size_t)(b * NOISE));
    if (!h) return NULL;
    uint64_t s = fg_rng_derive(fg_fabric_rank_seed(fg_trainer_fabric(t)), which);
    fg_rng_fill_normal(s, 0, h, b * NOISE, 0, 1);
    fg_tensor *z = fg_from_data(FG_F32, 2, (int64_t[]){b, NOISE}, h);
    free(h);
    return z;
}

static fg_tensor *bce(fg_tensor *logits, double target) {
    fg_tensor *y =
        logits ? fg_full(FG_F32, fg_tensor_ndim(logits), fg_tensor_shape(logits), target) : NULL;
    return fg_binary_cross_entropy_with_logits(logits, y, NULL, NULL, FG_REDUCTION_MEAN);
}

/* The share of logits on the right side of 0 (real: > 0), read from a
 * host copy (on a device the logits are its memory). */
static double right(fg_tensor *logits, bool real) {
    fg_tensor *h = fg_tensor_to(logits, NULL);
    if (!h) return NAN;
    const float *p = fg_tensor_data(h);
    int64_t n = fg_tensor_numel(h), k = 0;
    for (int64_t i = 0; i < n; i++) k += real ? p[i] > 0 : p[i] <= 0;
    fg_tensor_free(h);
    return (double)k / (double)n;
}

#define LOG(name, v, bar)                                                                          \
    (fg_trainer_log(t, name, v, &(fg_log_opts){.on_epoch = FG_ON, .prog_bar = bar}) == FG_OK)

static fg_tensor *training_step(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    gan *m = ud;
    fg_optimizer *opt_g = fg_trainer_optimizer_at(t, 0), *opt_d = fg_trainer_optimizer_at(t, 1);
    int64_t n = fg_tensor_shape(b->x)[0];
    uint64_t at = (uint64_t)(fg_trainer_current_epoch(t) * 100000 + i);
    /* the generator: fool the discriminator (its own parameters only) */
    if (fg_trainer_toggle_optimizer(t, opt_g)) return NULL;
    fg_tensor *fake = fg_module_forward(m->g, noise(t, n, 2 * at));
    fg_tensor *g_loss = bce(fg_module_forward(m->d, fake), 1.0);
    if (!g_loss || !LOG("g_loss", fg_item(g_loss), true) || fg_trainer_manual_backward(t, g_loss) ||
        fg_trainer_optimizer_step(t, opt_g))
        return NULL;
    fg_optimizer_zero_grad(opt_g);
    fg_trainer_untoggle_optimizer(t, opt_g);
    /* the discriminator: real points 1, generated ones 0 (no gradient into the generator) */
    if (fg_trainer_toggle_optimizer(t, opt_d)) return NULL;
    bool was = fg_set_grad_enabled(false);
    fake = fg_module_forward(m->g, noise(t, n, 2 * at + 1));
    fg_set_grad_enabled(was);
    fg_tensor *real_logits = fg_module_forward(m->d, b->x);
    fg_tensor *fake_logits = fg_module_forward(m->d, fake);
    fg_tensor *d_loss = fg_scale(fg_add(bce(real_logits, 1.0), bce(fake_logits, 0.0)), 0.5);
    if (!d_loss) return NULL;
    double acc = 0.5 * (right(real_logits, true) + right(fake_logits, false));
    if (!LOG("d_loss", fg_item(d_loss), true) || !LOG("d_acc", acc, true) ||
        fg_trainer_manual_backward(t, d_loss) || fg_trainer_optimizer_step(t, opt_d))
        return NULL;
    fg_optimizer_zero_grad(opt_d);
    fg_trainer_untoggle_optimizer(t, opt_d);
    return d_loss; /* shown only: the steps are done */
}

static fg_status on_train_epoch_end(void *ud, fg_trainer *t) {
    (void)ud;
    double dl = NAN, gl = NAN, acc = NAN;
    (void)fg_trainer_callback_metric(t, "d_loss_epoch", &dl);
    (void)fg_trainer_callback_metric(t, "g_loss_epoch", &gl);
    (void)fg_trainer_callback_metric(t, "d_acc_epoch", &acc);
    if (fg_trainer_is_global_zero(t))
        printf("epoch %lld d_loss %.4f g_loss %.4f d_acc %.4f\n",
               (long long)fg_trainer_current_epoch(t), dl, gl, acc);
    fflush(stdout);
    return FG_OK;
}

/* 4096 generated points: their mean radius and the share within 0.5 of a mode. */
static void measure(gan *m) {
    bool was = fg_set_grad_enabled(false);
    float *zh = malloc(sizeof(float) * 4096 * NOISE);
    if (!zh) return;
    fg_rng_fill_normal(12345, 0, zh, 4096 * NOISE, 0, 1);
    fg_tensor *x = fg_module_forward(m->g, fg_from_data(FG_F32, 2, (int64_t[]){4096, NOISE}, zh));
    free(zh);
    fg_set_grad_enabled(was);
    fg_tensor *xh = x ? fg_tensor_to(x, NULL) : NULL; /* the points, in host memory */
    if (!xh) return;
    const float *p = fg_tensor_data(xh);
    double r = 0;
    int64_t near = 0;
    for (int64_t i = 0; i < 4096; i++) {
        double px = p[2 * i], py = p[2 * i + 1], best = 1e30;
        r += sqrt(px * px + py * py);
        for (int k = 0; k < MODES; k++) {
            double a = 2 * M_PI * k / MODES, dx = px - RADIUS * cos(a), dy = py - RADIUS * sin(a);
            best = fmin(best, sqrt(dx * dx + dy * dy));
        }
        near += best < 0.5;
    }
    printf("generated mean radius %.4f near a mode %.4f\n", r / 4096, (double)near / 4096);
    fg_tensor_free(xh);
    fg_step_reset();
}

static int run(fg_trainer *t, void *arg) {
    gan *m = arg;
    uint64_t dseed = 7;
    fg_dataset *ds = fg_dataset_new(&(fg_dataset_ops){length, spec, sample, NULL}, &dseed, "ring");
    fg_dataloader *dl = fg_dataloader_new(ds, &(fg_loader_opts){.batch = 128, .shuffle = true});
    fg_lightning_module lm = {.ud = m,
                              .configure_model = configure_model,
                              .automatic_optimization = FG_OFF,
                              .configure_optimizers = configure_optimizers,
                              .training_step = training_step,
                              .on_train_epoch_end = on_train_epoch_end};
    int rc = fg_trainer_fit(t, &lm, dl, NULL, m->ckpt_path) != FG_OK;
    if (rc) fprintf(stderr, "gan: %s\n", fg_last_error());
    else if (fg_trainer_is_global_zero(t)) measure(m);
    fg_dataloader_free(dl);
    fg_dataset_free(ds);
    return rc;
}

int main(int argc, char **argv) {
    const char *devices = NULL, *strategy = NULL, *root = NULL, *accel = NULL;
    gan m = {.seed = 1, .epochs = 30};
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--devices") && v) devices = argv[++i];
        else if (!strcmp(argv[i], "--accelerator") && v) accel = argv[++i];
        else if (!strcmp(argv[i], "--strategy") && v) strategy = argv[++i];
        else if (!strcmp(argv[i], "--max-epochs") && v) m.epochs = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && v) m.seed = (uint64_t)atoll(argv[++i]);
        else if (!strcmp(argv[i], "--default-root-dir") && v) root = argv[++i];
        else if (!strcmp(argv[i], "--ckpt-path") && v) m.ckpt_path = argv[++i];
        else return fprintf(stderr, "%s: unknown or incomplete flag %s\n", argv[0], argv[i]), 2;
    }
    bool ddp = strategy && strncmp(strategy, "ddp", 3) == 0;
    /* ddp: a fabric of our own, for find_unused_parameters (the parameters a
     * toggle leaves without gradients) */
    fg_fabric *own =
        ddp ? fg_fabric_new(&(fg_fabric_config){.accelerator = accel,
                                                .devices = devices,
                                                .strategy = strategy,
                                                .seed = m.seed,
                                                .ddp = {.find_unused_parameters = true}})
            : NULL;
    if (ddp && !own) return fprintf(stderr, "gan: %s\n", fg_last_error()), 2;
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.accelerator = ddp ? NULL : accel,
                                                      .devices = ddp ? NULL : devices,
                                                      .strategy = ddp ? NULL : strategy,
                                                      .fabric = own,
                                                      .seed = ddp ? 0 : m.seed,
                                                      .max_epochs = m.epochs,
                                                      .enable_progress_bar = FG_OFF,
                                                      .default_root_dir = root,
                                                      .logger = FG_OFF});
    if (!t) return fprintf(stderr, "gan: %s\n", fg_last_error()), 2;
    int rc = fg_trainer_launch(t, run, &m);
    fg_trainer_free(t);
    fg_fabric_free(own);
    fg_module_free(m.net);
    return rc ? 1 : 0;
}
