/* Memory and speed of the sharded strategies: a GPT trained for a few
 * steps through the Fabric API on --devices ranks under --strategy (ddp,
 * deepspeed_stage_2, deepspeed_stage_3, ...), AdamW in f32. Each rank
 * measures
 *   - its peak resident memory (VmHWM) over the whole run, setup included,
 *     and over the training steps alone (the peak is reset after setup);
 *   - its model state between steps: the resident bytes of the flat
 *     parameter and gradient buffers (mincore: released pages do not
 *     count) and the optimizer state's bytes, beside the ideal 16 / N bytes
 *     per parameter of a fully sharded rank;
 *   - the median step time, and the CPU time of a step (every thread of
 *     the rank, the communicator's progress thread included: on a machine
 *     shared with other jobs this moves less than the wall time).
 * Rank 0 prints one JSON line with the largest value over the ranks.
 * Under stage 3 the model is made under empty init (each rank initialises
 * its shard only).
 *
 *   shard_bench --strategy S [--devices 2] [--steps 6] [--threads 1] [--long]
 *               [--activation-checkpointing] [--phases]
 *
 * The default GPT has 8 layers of width 384 (14M parameters); --long takes
 * one of about 200M (12 layers of width 1152), minutes per run and several
 * GB per rank. --activation-checkpointing recomputes each block in backward
 * (the fabric's option). --phases samples the resident memory and prints
 * its peak in each phase of the first and the last step, and the step
 * arena's size. bench/shard_bench.sh runs the strategies and prints the
 * ratios. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "fulgur/fulgur.h"

typedef struct args {
    const char *strategy;
    int steps, warmup, threads, devices;
    bool longer, ac, phases; /* --long; --activation-checkpointing; --phases */
} args;

/* --phases: a thread samples the resident memory every millisecond and
 * keeps, per phase of the step, the largest value seen (the peak's phase
 * is where the memory goes). */
enum { PH_MODEL, PH_OPTIM, PH_SETUP, PH_FORWARD, PH_BACKWARD, PH_STEP, PH_OTHER, PH_N };
static const char *const ph_name[PH_N] = {"model new", "optim new", "setup", "forward",
                                          "backward",  "step",      "other"};
static volatile int g_phase = PH_MODEL, g_stop;
static double g_ph_peak[PH_N], g_first_peak[PH_N];
static double g_act_bytes, g_arena_peak; /* step arena after forward, its peak */

static double statm_rss(void) {
    FILE *fp = fopen("/proc/self/statm", "r");
    long size = 0, res = 0;
    if (fp) {
        if (fscanf(fp, "%ld %ld", &size, &res) != 2) res = 0;
        fclose(fp);
    }
    return (double)res * (double)sysconf(_SC_PAGESIZE);
}

static void *sampler(void *arg) {
    (void)arg;
    while (!g_stop) {
        double r = statm_rss();
        int ph = g_phase;
        if (r > g_ph_peak[ph]) g_ph_peak[ph] = r;
        usleep(1000);
    }
    return NULL;
}

/* CPU seconds this process (every thread) used so far. */
static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
           (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A /proc/self/status field in bytes (kB there). */
static double status_bytes(const char *key) {
    FILE *fp = fopen("/proc/self/status", "r");
    char line[256];
    double v = 0;
    size_t n = strlen(key);
    while (fp && fgets(line, sizeof line, fp))
        if (!strncmp(line, key, n) && line[n] == ':') v = atof(line + n + 1) * 1024.0;
    if (fp) fclose(fp);
    return v;
}

static void reset_peak(void) {
    FILE *fp = fopen("/proc/self/clear_refs", "w");
    if (fp) {
        fputs("5", fp); /* resets VmHWM to the current RSS */
        fclose(fp);
    }
}

static double resident(const fg_tensor *t) {
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)fg_tensor_data(t) & ~(uintptr_t)(ps - 1);
    uintptr_t b = (uintptr_t)fg_tensor_data(t) + (size_t)fg_tensor_numel(t) * sizeof(float);
    size_t pages = (b - a + ps - 1) / ps;
    unsigned char *vec = malloc(pages);
    double r = 0;
    if (vec && mincore((void *)a, b - a, vec) == 0)
        for (size_t i = 0; i < pages; i++) r += (vec[i] & 1) ? (double)ps : 0;
    free(vec);
    return r;
}

/* v's maximum over the ranks; the first failed reduce is kept in *bad
 * (the figures are then not printed) */
static double max_over(fg_fabric *f, double v, fg_status *bad) {
    double out = v;
    fg_status s = fg_fabric_reduce_scalar(f, v, FG_REDUCE_OP_MAX, &out);
    if (s != FG_OK && *bad == FG_OK) *bad = s;
    return out;
}

static int run(fg_fabric *f, void *arg) {
    args *a = arg;
    if (fg_set_num_threads(a->threads) != FG_OK) {
        fprintf(stderr, "shard_bench: %s\n", fg_last_error());
        return 1;
    }
    pthread_t th;
    bool sampling = a->phases && pthread_create(&th, NULL, sampler, NULL) == 0;
    int64_t B = a->longer ? 2 : 4, T = a->longer ? 256 : 128, V = 65;
    fg_gpt_config cfg = {.vocab = V, .ctx = T, .layers = 8, .heads = 6, .embd = 384, .seed = 0};
    if (a->longer)
        cfg = (fg_gpt_config){
            .vocab = V, .ctx = T, .layers = 12, .heads = 12, .embd = 1152, .seed = 0};
    bool s3 = !strcmp(a->strategy, "deepspeed_stage_3") || !strcmp(a->strategy, "fsdp");
    double base = statm_rss(); /* before the model: the process itself */
    bool was = fg_module_set_empty_init(s3);
    fg_module *model = fg_gpt_new(&cfg);
    fg_module_set_empty_init(was);
    g_phase = PH_OPTIM;
    fg_optimizer *opt =
        model ? fg_adamw_new(model, &(fg_adamw_opts){.lr = 3e-4, .weight_decay = 0.1}) : NULL;
    int64_t shape[2] = {B, T};
    fg_tensor *x = fg_tensor_new(FG_I32, 2, shape), *y = fg_tensor_new(FG_I32, 2, shape);
    fg_rng r = {1, (uint64_t)fg_fabric_global_rank(f)};
    for (int64_t i = 0; i < B * T; i++) {
        ((int32_t *)fg_tensor_data(x))[i] = (int32_t)fg_rng_below(&r, (uint64_t)V);
        ((int32_t *)fg_tensor_data(y))[i] = (int32_t)fg_rng_below(&r, (uint64_t)V);
    }
    g_phase = PH_SETUP;
    if (!model || !opt || fg_fabric_setup(f, model, opt) != FG_OK) {
        fprintf(stderr, "shard_bench: %s\n", fg_last_error());
        return 1;
    }
    double setup_peak = status_bytes("VmHWM");
    reset_peak();
    double *times = calloc((size_t)(a->warmup + a->steps), sizeof *times);
    double state = 0, cpu0 = 0;
    for (int s = 0; s < a->warmup + a->steps; s++) {
        if (s == a->warmup) cpu0 = cpu_seconds();
        double t0 = fg_time();
        if (s == 1) memcpy(g_first_peak, g_ph_peak, sizeof g_ph_peak);
        if (s == a->warmup + a->steps - 1)
            for (int p = PH_FORWARD; p < PH_N; p++) g_ph_peak[p] = 0;
        g_phase = PH_OTHER;
        fg_optimizer_zero_grad(opt);
        g_phase = PH_FORWARD;
        fg_tensor *loss = fg_cross_entropy(fg_module_forward(model, x), y, -100);
        g_act_bytes = (double)fg_step_bytes();
        g_phase = PH_BACKWARD;
        fg_status bst = loss ? fg_fabric_backward(f, loss) : FG_ENOMEM;
        g_phase = PH_STEP;
        if (!loss || bst != FG_OK || fg_optimizer_step(opt) != FG_OK) {
            fprintf(stderr, "shard_bench: rank %d: %s\n", fg_fabric_global_rank(f),
                    fg_last_error());
            return 1;
        }
        g_phase = PH_OTHER;
        g_arena_peak = (double)fg_step_peak_bytes();
        fg_fabric_step_end(f);
        times[s] = fg_time() - t0;
        /* model state between steps (gradients as the step left them) */
        double st = resident(fg_module_flat_params(model)) + resident(fg_module_flat_grads(model));
        for (int k = 0; k < fg_optimizer_num_states(opt); k++)
            st += (double)fg_tensor_numel(fg_optimizer_state(opt, k)) * sizeof(float);
        if (st > state) state = st;
    }
    fg_status bad = FG_OK;
    double cpu_ms = max_over(f, (cpu_seconds() - cpu0) * 1e3 / a->steps, &bad);
    qsort(times + a->warmup, (size_t)a->steps, sizeof *times, cmp_double);
    double ms = max_over(f, times[a->warmup + a->steps / 2] * 1e3, &bad);
    double train_peak = max_over(f, status_bytes("VmHWM"), &bad);
    double all_peak = max_over(f, setup_peak > train_peak ? setup_peak : train_peak, &bad);
    state = max_over(f, state, &bad);
    int64_t P = fg_module_numel(model);
    int N = fg_fabric_world_size(f);
    double base_max = max_over(f, base, &bad);
    if (bad == FG_OK && fg_fabric_is_global_zero(f))
        printf("{\"strategy\": \"%s%s\", \"ranks\": %d, \"params\": %lld, \"ms_per_step\": %.1f, "
               "\"steps_per_s\": %.3f, \"peak_rss_mb\": %.1f, \"peak_rss_train_mb\": %.1f, "
               "\"model_state_mb\": %.1f, \"ideal_mb\": %.1f, \"ddp_state_mb\": %.1f, "
               "\"tokens_per_s\": %.1f, \"base_rss_mb\": %.1f, \"cpu_ms_per_step\": %.1f}\n",
               a->strategy, a->ac ? "+ac" : "", N, (long long)P, ms, 1e3 / ms, all_peak / 1048576.0,
               train_peak / 1048576.0, state / 1048576.0, 16.0 * (double)P / N / 1048576.0,
               16.0 * (double)P / 1048576.0, (double)(B * T * N) / (ms / 1e3), base_max / 1048576.0,
               cpu_ms);
    if (sampling) {
        g_stop = 1;
        pthread_join(th, NULL);
        for (int p = 0; p < PH_N; p++) {
            double v = max_over(f, g_ph_peak[p], &bad);
            double w = max_over(f, g_first_peak[p], &bad);
            if (bad == FG_OK && fg_fabric_is_global_zero(f))
                printf("  peak RSS during %-9s first step %9.1f MiB, last step %9.1f MiB\n",
                       ph_name[p], w / 1048576.0, v / 1048576.0);
        }
        double act = max_over(f, g_act_bytes, &bad);
        double ap = max_over(f, g_arena_peak, &bad);
        if (bad == FG_OK && fg_fabric_is_global_zero(f))
            printf("  step arena: %.1f MiB after forward, %.1f MiB at its peak\n", act / 1048576.0,
                   ap / 1048576.0);
    }
    free(times);
    fg_tensor_free(x);
    fg_tensor_free(y);
    fg_optimizer_free(opt);
    fg_module_free(model);
    return bad == FG_OK ? 0 : 1;
}

int main(int argc, char **argv) {
    args a = {.strategy = "ddp", .steps = 6, .warmup = 2, .threads = 1, .devices = 2};
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--strategy") && v) a.strategy = argv[++i];
        else if (!strcmp(argv[i], "--steps") && v) a.steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && v) a.threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--devices") && v) a.devices = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--long")) a.longer = true;
        else if (!strcmp(argv[i], "--activation-checkpointing")) a.ac = true;
        else if (!strcmp(argv[i], "--phases")) a.phases = true;
        else {
            fprintf(stderr, "usage: shard_bench --strategy S [--devices N] [--steps N] "
                            "[--threads N] [--long] [--activation-checkpointing] [--phases]\n");
            return 2;
        }
    }
    if (a.steps < 1) a.steps = 1;
    char dev[16];
    snprintf(dev, sizeof dev, "%d", a.devices);
    fg_fabric *f = fg_fabric_new(&(fg_fabric_config){.devices = dev,
                                                     .strategy = a.strategy,
                                                     .threads_per_rank = a.threads,
                                                     .activation_checkpointing = a.ac});
    if (!f) {
        fprintf(stderr, "shard_bench: %s\n", fg_last_error());
        return 2;
    }
    int rc = fg_fabric_launch(f, run, &a);
    if (rc) fprintf(stderr, "shard_bench: %s\n", fg_last_error());
    fg_fabric_free(f);
    return rc;
}
