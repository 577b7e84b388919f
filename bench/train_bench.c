/* fulgur's side of bench/compare: the mlp, gpt, resnet (CIFAR-style
 * ResNet-18, 32x32, batch 64, SGD momentum), lstm (2 layers of 512,
 * sequence 64, batch 32, AdamW), gru (the same shape: Embedding, a
 * batch-first GRU and a Linear in a Sequential, as PyTorch would write it,
 * so without fg_lstm_lm_new's projected embedding table) and vit (32x32, patches of 4, 6 layers of
 * 192, batch 64, AdamW) of the comparison trained
 * for a few steps through the Fabric API (single, or ddp on --devices N
 * ranks), timed per step after warm-up; prints one JSON line from rank 0:
 *   {"model", "mode", "ms_per_step", "items_per_s", "unit", "peak_rss_mb"}
 *
 *   train_bench --model gpt [--steps 10] [--threads 1] [--devices 2] [--batch B]
 *               [--accumulate A] [--deterministic] [--precision bf16-mixed]
 *               [--loop plain|fabric|trainer]
 *
 * --accumulate A runs A micro-batches of B per rank and optimizer step
 * (the mode "ddp2xA"); --deterministic turns on the fabric's deterministic
 * mode (the mode gets "-det"): bench/determ_cost compares the two.
 *
 * --precision is Lightning's setting (the fabric's: autocast from setup on,
 * the optimizer step through fg_fabric_optimizer_step, the model made in
 * the setting's parameter dtype).
 *
 * --loop plain (the default) steps on one fixed batch; fabric and trainer
 * read the same batch's rows through a data loader, fabric in a bare loop
 * over the fabric (zero_grad, training_step, optimizer step, step_end) and
 * trainer through fg_trainer_fit (no logger, checkpoint, progress bar or
 * validation, as Lightning's bench runs it): the two differ by the
 * Trainer's own work only. Both time a step from one step's end to the
 * next, so the loader's fetch counts in both.
 * (--loop fabric|trainer take neither --accumulate nor --deterministic.)
 *
 * --threads 0 is the default thread count (the cores over the ranks, fewer
 * while other processes keep cores busy); "threads" in the output is the
 * setting, "blas" the engines each product class took. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "fulgur/fulgur.h"

typedef struct args {
    const char *model, *precision, *loop;
    int steps, warmup, threads, devices, accumulate;
    int64_t batch;
    bool deterministic;
} args;

/* ------------------------------------------ the loader modes' dataset */

typedef struct rows {
    fg_tensor *x, *y;
    int64_t n, b; /* samples, and rows of x to cycle through */
} rows;

static int64_t rows_len(void *ud) { return ((rows *)ud)->n; }
static void rows_spec(void *ud, fg_sample_spec *xs, fg_sample_spec *ys) {
    rows *r = ud;
    *xs = (fg_sample_spec){.dtype = fg_tensor_dtype(r->x), .ndim = 1};
    xs->shape[0] = fg_tensor_dim(r->x, 1);
    *ys = (fg_sample_spec){.dtype = FG_I32, .ndim = fg_tensor_ndim(r->y) - 1};
    if (ys->ndim) ys->shape[0] = fg_tensor_dim(r->y, 1);
}
static fg_status rows_get(void *ud, int64_t i, void *x, void *y) {
    rows *r = ud;
    int64_t k = i % r->b;
    size_t xb = fg_tensor_nbytes(r->x) / (size_t)r->b, yb = fg_tensor_nbytes(r->y) / (size_t)r->b;
    memcpy(x, (const char *)fg_tensor_data(r->x) + (size_t)k * xb, xb);
    memcpy(y, (const char *)fg_tensor_data(r->y) + (size_t)k * yb, yb);
    return FG_OK;
}

typedef struct bench_module {
    fg_module *model;
    fg_optimizer *opt;
    double *ends; /* the time each step ended */
    int n;
} bench_module;

static fg_tensor *loss_of(fg_module *m, fg_batch *b) {
    return fg_cross_entropy(fg_module_forward(m, b->x), b->y, -100);
}
static fg_tensor *bm_step(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)t;
    (void)i;
    return loss_of(((bench_module *)ud)->model, b);
}
static fg_status bm_opt(void *ud, fg_trainer *t, fg_optimizer_config *out) {
    (void)t;
    out->optimizer = ((bench_module *)ud)->opt; /* consumed by the trainer */
    ((bench_module *)ud)->opt = NULL;
    return FG_OK;
}
static fg_status bm_batch_end(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)t;
    (void)b;
    (void)i;
    bench_module *m = ud;
    m->ends[m->n++] = fg_time();
    return FG_OK;
}
static fg_tensor *fabric_step(fg_fabric *f, fg_batch *part, void *ud) {
    (void)f;
    return loss_of(ud, part);
}

/* Step times (end to end) of the fabric or trainer loop over a loader of
 * x's rows, into times[0..warmup+steps-1]. */
static int loader_loop(fg_fabric *f, args *a, fg_module *model, fg_optimizer **opt, fg_tensor *x,
                       fg_tensor *y, int64_t B, double *times) {
    int total = a->warmup + a->steps;
    rows r = {x, y, B * (total + 1) * fg_fabric_world_size(f), B};
    fg_dataset *ds =
        fg_dataset_new(&(fg_dataset_ops){rows_len, rows_spec, rows_get, NULL}, &r, "rows");
    fg_dataloader *dl = ds ? fg_dataloader_new(ds, &(fg_loader_opts){.batch = B}) : NULL;
    double *ends = calloc((size_t)total + 1, sizeof *ends);
    int rc = 1;
    if (!dl || !ends) goto out;
    if (!strcmp(a->loop, "trainer")) {
        bench_module bm = {.model = model, .opt = *opt, .ends = ends + 1};
        *opt = NULL;
        fg_lightning_module lm = {.ud = &bm,
                                  .model = model,
                                  .configure_optimizers = bm_opt,
                                  .training_step = bm_step,
                                  .on_train_batch_end = bm_batch_end,
                                  .on_train_batch_start = NULL};
        fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.fabric = f,
                                                          .max_steps = total,
                                                          .enable_progress_bar = FG_OFF,
                                                          .enable_checkpointing = FG_OFF,
                                                          .logger = FG_OFF,
                                                          .num_sanity_val_steps = FG_COUNT(0)});
        ends[0] = fg_time();
        fg_status s = t ? fg_trainer_fit(t, &lm, dl, NULL, NULL) : fg_last_status();
        fg_trainer_free(t); /* frees the optimizer it was handed */
        if (s != FG_OK) goto out;
    } else {
        if (!fg_fabric_setup_dataloader(f, dl, true) || fg_dataloader_set_epoch(dl, 0)) goto out;
        ends[0] = fg_time();
        for (int s = 0; s < total; s++) {
            fg_batch *b = fg_dataloader_next(dl);
            fg_optimizer_zero_grad(*opt);
            if (!b || fg_fabric_training_step(f, b, fabric_step, NULL, model, NULL) != FG_OK ||
                fg_fabric_optimizer_step(f, *opt) != FG_OK)
                goto out;
            fg_fabric_step_end(f);
            ends[s + 1] = fg_time();
        }
    }
    for (int s = 0; s < total; s++) times[s] = ends[s + 1] - ends[s];
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "train_bench: rank %d: %s\n", fg_fabric_global_rank(f), fg_last_error());
    free(ends);
    fg_dataloader_free(dl);
    fg_dataset_free(ds);
    return rc;
}

/* the gru row's model: embedding (V, 512) -> GRU (2 layers of 512,
 * batch_first) -> Linear (512, V), bench/torch_bench.py's GRULM */
static fg_module *gru_lm_new(int64_t V, fg_dtype dt) {
    fg_module *m = fg_sequential_new();
    fg_rnn_opts o = {.num_layers = 2, .batch_first = true};
    if (!m || fg_sequential_append(m, fg_embedding_new(V, 512, dt)) ||
        fg_sequential_append(m, fg_gru_new(512, 512, &o, dt)) ||
        fg_sequential_append(m, fg_linear_new(512, V, true, dt)) || fg_module_finalize(m)) {
        fg_module_free(m);
        return NULL;
    }
    return m;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int run(fg_fabric *f, void *arg) {
    args *a = arg;
    bool gpt = !strcmp(a->model, "gpt"), gru = !strcmp(a->model, "gru");
    bool lstm = !strcmp(a->model, "lstm") || gru; /* the rnn rows' shape */
    bool image = !strcmp(a->model, "resnet") || !strcmp(a->model, "vit");
    bool tokens = gpt || lstm;
    if (fg_set_num_threads(a->threads) != FG_OK) {
        fprintf(stderr, "train_bench: %s\n", fg_last_error());
        return 1;
    }
    fg_module *model;
    fg_optimizer *opt;
    int64_t B = a->batch ? a->batch : gpt ? 16 : lstm ? 32 : image ? 64 : 256;
    int64_t T = lstm ? 64 : 128, V = 65;
    fg_tensor *x, *y;
    if (tokens) {
        if (gpt)
            model = fg_gpt_new(&(fg_gpt_config){.vocab = V,
                                                .ctx = T,
                                                .layers = 4,
                                                .heads = 4,
                                                .embd = 256,
                                                .seed = 0,
                                                .dtype = fg_fabric_dtype(f)});
        else if (gru) model = gru_lm_new(V, fg_fabric_dtype(f));
        else /* 2 layers of 512, sequence 64 */
            model = fg_lstm_lm_new(&(fg_lstm_lm_config){
                .vocab = V, .embd = 512, .hidden = 512, .layers = 2, .dtype = fg_fabric_dtype(f)});
        opt = fg_adamw_new(model, &(fg_adamw_opts){.lr = 3e-4, .weight_decay = 0.1});
        int64_t shape[2] = {B, T};
        x = fg_tensor_new(FG_I32, 2, shape);
        y = fg_tensor_new(FG_I32, 2, shape);
        fg_rng r = {1, 0};
        for (int64_t i = 0; i < B * T; i++) {
            ((int32_t *)fg_tensor_data(x))[i] = (int32_t)fg_rng_below(&r, (uint64_t)V);
            ((int32_t *)fg_tensor_data(y))[i] = (int32_t)fg_rng_below(&r, (uint64_t)V);
        }
    } else {
        int64_t xs4[4] = {B, 3, 32, 32}, xs2[2] = {B, 784}, ys[1] = {B};
        int nd = image ? 4 : 2;
        const int64_t *xs = image ? xs4 : xs2;
        if (!strcmp(a->model, "resnet")) { /* CIFAR-style ResNet-18, SGD momentum */
            model = fg_resnet_new(&(fg_resnet_config){.depth = 18, .dtype = fg_fabric_dtype(f)});
            opt = fg_sgd_new(model, &(fg_sgd_opts){.lr = 0.01, .momentum = 0.9});
        } else if (image) { /* a small ViT: 32x32, patches of 4, 6 layers of 192 */
            model = fg_vit_new(&(fg_vit_config){
                .hidden_dim = 192, .num_heads = 3, .mlp_dim = 768, .dtype = fg_fabric_dtype(f)});
            opt = fg_adamw_new(model, &(fg_adamw_opts){.lr = 3e-4, .weight_decay = 0.05});
        } else {
            model = fg_mlp_new(&(fg_mlp_config){.sizes = {784, 1024, 1024, 10},
                                                .nlayers = 3,
                                                .seed = 0,
                                                .dtype = fg_fabric_dtype(f)});
            opt = fg_sgd_new(model, &(fg_sgd_opts){.lr = 0.01, .momentum = 0.9});
        }
        int64_t n = image ? B * 3 * 32 * 32 : B * 784;
        fg_tensor *x32 = fg_tensor_new(FG_F32, nd, xs);
        y = fg_tensor_new(FG_I32, 1, ys);
        fg_rng_fill_normal(1, 0, fg_tensor_data(x32), n, 0, 1);
        x = fg_tensor_new(fg_fabric_dtype(f), nd, xs); /* the model's dtype (bf16-true: bf16) */
        if (x && fg_tensor_copy(x, x32) != FG_OK) {
            fprintf(stderr, "train_bench: %s\n", fg_last_error());
            return 1;
        }
        fg_tensor_free(x32);
        fg_rng r = {2, 0};
        for (int64_t i = 0; i < B; i++)
            ((int32_t *)fg_tensor_data(y))[i] = (int32_t)fg_rng_below(&r, 10);
    }
    bool trainer = !strcmp(a->loop, "trainer");
    if (!model || !opt || (!trainer && fg_fabric_setup(f, model, opt) != FG_OK)) {
        fprintf(stderr, "train_bench: %s\n", fg_last_error());
        return 1;
    }
    double *times = calloc((size_t)(a->warmup + a->steps), sizeof *times);
    if (strcmp(a->loop, "plain") && loader_loop(f, a, model, &opt, x, y, B, times)) return 1;
    for (int s = 0; !strcmp(a->loop, "plain") && s < a->warmup + a->steps; s++) {
        double t0 = fg_time();
        fg_optimizer_zero_grad(opt);
        bool ok = true;
        for (int k = 0; ok && k < a->accumulate; k++) {
            fg_fabric_set_no_backward_sync(f, k + 1 < a->accumulate);
            fg_tensor *loss = fg_cross_entropy(fg_module_forward(model, x), y, -100);
            /* deterministic: the fabric averages the micro-batches itself */
            if (loss && a->accumulate > 1 && !a->deterministic)
                loss = fg_scale(loss, 1.0 / a->accumulate);
            ok = loss && fg_fabric_backward(f, loss) == FG_OK;
            if (k + 1 < a->accumulate) fg_fabric_step_end(f);
        }
        if (!ok || fg_fabric_optimizer_step(f, opt) != FG_OK) {
            fprintf(stderr, "train_bench: rank %d: %s\n", fg_fabric_global_rank(f),
                    fg_last_error());
            return 1;
        }
        fg_fabric_step_end(f);
        times[s] = fg_time() - t0;
    }
    qsort(times + a->warmup, (size_t)a->steps, sizeof *times, cmp_double);
    double ms = times[a->warmup + a->steps / 2] * 1e3;
    /* the slowest rank sets the pace */
    if (fg_fabric_reduce_scalar(f, ms, FG_REDUCE_OP_MAX, &ms) != FG_OK) {
        fprintf(stderr, "train_bench: rank %d: %s\n", fg_fabric_global_rank(f), fg_last_error());
        return 1;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double items = (double)(tokens ? B * T : B) * fg_fabric_world_size(f) * a->accumulate;
    char acc[32] = "";
    if (a->accumulate > 1) snprintf(acc, sizeof acc, "x%d", a->accumulate);
    if (fg_fabric_is_global_zero(f))
        printf(
            "{\"model\": \"%s\", \"mode\": \"%s%d%s%s\", \"loop\": \"%s\", \"ms_per_step\": %.3f, "
            "\"items_per_s\": %.1f, \"unit\": \"%s\", \"peak_rss_mb\": %.1f, \"threads\": %d, "
            "\"precision\": \"%s\", \"blas\": \"%s\"}\n",
            a->model, fg_fabric_world_size(f) > 1 ? "ddp" : "single", fg_fabric_world_size(f), acc,
            a->deterministic ? "-det" : "", a->loop, ms, items / (ms / 1e3),
            tokens ? "tokens/s" : "samples/s", ru.ru_maxrss / 1024.0, fg_get_num_threads(),
            fg_precision_kind_name(fg_fabric_precision(f)), fg_ops_blas_info());
    free(times);
    fg_tensor_free(x);
    fg_tensor_free(y);
    fg_optimizer_free(opt);
    fg_module_free(model);
    return 0;
}

int main(int argc, char **argv) {
    args a = {.model = "gpt",
              .loop = "plain",
              .steps = 10,
              .warmup = 3,
              .threads = 1,
              .devices = 1,
              .accumulate = 1};
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--model") && v) a.model = argv[++i];
        else if (!strcmp(argv[i], "--steps") && v) a.steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && v) a.warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && v) a.threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--devices") && v) a.devices = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && v) a.batch = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--accumulate") && v) a.accumulate = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--deterministic")) a.deterministic = true;
        else if (!strcmp(argv[i], "--precision") && v) a.precision = argv[++i];
        else if (!strcmp(argv[i], "--loop") && v) a.loop = argv[++i];
        else {
            fprintf(
                stderr,
                "usage: train_bench --model mlp|gpt|resnet|lstm|gru|vit [--steps N] [--warmup N] "
                "[--threads N] [--devices N] [--batch B] [--accumulate A] "
                "[--deterministic] [--precision S] [--loop plain|fabric|trainer]\n");
            return 2;
        }
    }
    if (strcmp(a.loop, "plain") && strcmp(a.loop, "fabric") && strcmp(a.loop, "trainer")) {
        fprintf(stderr, "train_bench: --loop %s: expected plain, fabric or trainer\n", a.loop);
        return 2;
    }
    if (strcmp(a.model, "gpt") && strcmp(a.model, "mlp") && strcmp(a.model, "resnet") &&
        strcmp(a.model, "lstm") && strcmp(a.model, "gru") && strcmp(a.model, "vit")) {
        fprintf(stderr, "train_bench: --model %s: expected mlp, gpt, resnet, lstm, gru or vit\n",
                a.model);
        return 2;
    }
    if (a.accumulate < 1) {
        fprintf(stderr, "train_bench: --accumulate %d: expected >= 1\n", a.accumulate);
        return 2;
    }
    char dev[16];
    snprintf(dev, sizeof dev, "%d", a.devices);
    fg_fabric *f = fg_fabric_new(&(fg_fabric_config){.devices = dev,
                                                     .strategy = a.devices > 1 ? "ddp" : "single",
                                                     .threads_per_rank = a.threads,
                                                     .deterministic = a.deterministic,
                                                     .precision = a.precision});
    if (!f) {
        fprintf(stderr, "train_bench: %s\n", fg_last_error());
        return 2;
    }
    int rc = fg_fabric_launch(f, run, &a);
    if (rc) fprintf(stderr, "train_bench: %s\n", fg_last_error());
    fg_fabric_free(f);
    return rc;
}
