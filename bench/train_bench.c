/* fulgur's side of bench/compare: the mlp and gpt of the comparison trained
 * for a few steps through the Fabric API (single, or ddp on --devices N
 * ranks), timed per step after warm-up; prints one JSON line from rank 0:
 *   {"model", "mode", "ms_per_step", "items_per_s", "unit", "peak_rss_mb"}
 *
 *   train_bench --model gpt [--steps 10] [--threads 1] [--devices 2] [--batch B]
 *               [--accumulate A] [--deterministic] [--precision bf16-mixed]
 *
 * --accumulate A runs A micro-batches of B per rank and optimizer step
 * (the mode "ddp2xA"); --deterministic turns on the fabric's deterministic
 * mode (the mode gets "-det"): bench/determ_cost compares the two.
 *
 * --precision is Lightning's setting (the fabric's: autocast from setup on,
 * the optimizer step through fg_fabric_optimizer_step, the model made in
 * the setting's parameter dtype).
 * --threads 0 is the default thread count (the cores over the ranks, fewer
 * while other processes keep cores busy); "threads" in the output is the
 * setting, "blas" the engines each product class took. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "fulgur/fulgur.h"

typedef struct args {
    const char *model, *precision;
    int steps, warmup, threads, devices, accumulate;
    int64_t batch;
    bool deterministic;
} args;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int run(fg_fabric *f, void *arg) {
    args *a = arg;
    bool gpt = !strcmp(a->model, "gpt");
    fg_set_num_threads(a->threads);
    fg_module *model;
    fg_optimizer *opt;
    int64_t B = a->batch ? a->batch : gpt ? 16 : 256, T = 128, V = 65;
    fg_tensor *x, *y;
    if (gpt) {
        model = fg_gpt_new(&(fg_gpt_config){.vocab = V,
                                            .ctx = T,
                                            .layers = 4,
                                            .heads = 4,
                                            .embd = 256,
                                            .seed = 0,
                                            .dtype = fg_fabric_dtype(f)});
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
        model = fg_mlp_new(&(fg_mlp_config){
            .sizes = {784, 1024, 1024, 10}, .nlayers = 3, .seed = 0, .dtype = fg_fabric_dtype(f)});
        opt = fg_sgd_new(model, &(fg_sgd_opts){.lr = 0.01, .momentum = 0.9});
        int64_t xs[2] = {B, 784}, ys[1] = {B};
        fg_tensor *x32 = fg_tensor_new(FG_F32, 2, xs);
        y = fg_tensor_new(FG_I32, 1, ys);
        fg_rng_fill_normal(1, 0, fg_tensor_data(x32), B * 784, 0, 1);
        x = fg_tensor_new(fg_fabric_dtype(f), 2, xs); /* the model's dtype (bf16-true: bf16) */
        if (x) fg_tensor_copy(x, x32);
        fg_tensor_free(x32);
        fg_rng r = {2, 0};
        for (int64_t i = 0; i < B; i++)
            ((int32_t *)fg_tensor_data(y))[i] = (int32_t)fg_rng_below(&r, 10);
    }
    if (!model || !opt || fg_fabric_setup(f, model, opt) != FG_OK) {
        fprintf(stderr, "train_bench: %s\n", fg_last_error());
        return 1;
    }
    double *times = calloc((size_t)(a->warmup + a->steps), sizeof *times);
    for (int s = 0; s < a->warmup + a->steps; s++) {
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
    ms = fg_fabric_reduce_scalar(f, ms, FG_MAX);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double items = (double)(gpt ? B * T : B) * fg_fabric_world_size(f) * a->accumulate;
    char acc[32] = "";
    if (a->accumulate > 1) snprintf(acc, sizeof acc, "x%d", a->accumulate);
    if (fg_fabric_is_global_zero(f))
        printf(
            "{\"model\": \"%s\", \"mode\": \"%s%d%s%s\", \"ms_per_step\": %.3f, \"items_per_s\": "
            "%.1f, \"unit\": \"%s\", \"peak_rss_mb\": %.1f, \"threads\": %d, \"precision\": "
            "\"%s\", "
            "\"blas\": \"%s\"}\n",
            a->model, fg_fabric_world_size(f) > 1 ? "ddp" : "single", fg_fabric_world_size(f), acc,
            a->deterministic ? "-det" : "", ms, items / (ms / 1e3), gpt ? "tokens/s" : "samples/s",
            ru.ru_maxrss / 1024.0, fg_get_num_threads(),
            fg_precision_kind_name(fg_fabric_precision(f)), fg_ops_blas_info());
    free(times);
    fg_tensor_free(x);
    fg_tensor_free(y);
    fg_optimizer_free(opt);
    fg_module_free(model);
    return 0;
}

int main(int argc, char **argv) {
    args a = {
        .model = "gpt", .steps = 10, .warmup = 3, .threads = 1, .devices = 1, .accumulate = 1};
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
        else {
            fprintf(stderr, "usage: train_bench --model mlp|gpt [--steps N] [--warmup N] "
                            "[--threads N] [--devices N] [--batch B] [--accumulate A] "
                            "[--deterministic] [--precision S]\n");
            return 2;
        }
    }
    if (strcmp(a.model, "gpt") && strcmp(a.model, "mlp")) {
        fprintf(stderr, "train_bench: --model %s: expected mlp or gpt\n", a.model);
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
