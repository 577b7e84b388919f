/* The other side of bench/offload.sh: a GPT trained through the Fabric API
 * with deepspeed_stage_2, its AdamW state offloaded to nvme (or kept in
 * memory: --no-offload), or with --params deepspeed_stage_3 on --devices
 * ranks with the parameter shards offloaded too
 * (deepspeed_stage_3_offload_nvme); activation checkpointing on, on one
 * fixed batch per rank (so the loss falls within a few steps). Rank 0
 * prints a line per step and one JSON line at the end:
 *   {"params", "state_bytes", "steps", "first_loss", "last_loss",
 *    "tokens_per_s", "opt_step_s", "disk_read_bps", "disk_write_bps",
 *    "io_read_bps", "io_write_bps", "peak_rss_mb", "offload", "ranks"}
 * tokens/s (all ranks) over the steps after the first; disk_*_bps are the
 * bytes rank 0's optimizer streamed from and to its files over the time of
 * its steps; io_*_bps all the bytes every rank moved (the parameter
 * fetches of forward and backward too) over the whole steps; the loss is
 * rank 0's.
 *
 *   offload_bench --nvme-path DIR [--layers 4] [--embd 768] [--ctx 64]
 *                 [--batch 1] [--steps 5] [--threads 0] [--no-offload]
 *                 [--params] [--devices 1] [--lr 2e-5] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "fulgur/fulgur.h"

typedef struct args {
    const char *nvme_path;
    int layers, steps, threads, devices;
    int64_t embd, ctx, batch;
    double lr;
    bool offload, params;
} args;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* This process's resident memory now and at its peak, MiB (/proc). */
static void rss_mb(double *now_mb, double *peak_mb) {
    *now_mb = *peak_mb = 0;
    FILE *fp = fopen("/proc/self/status", "r");
    char line[256];
    while (fp && fgets(line, sizeof line, fp)) {
        long kb;
        if (sscanf(line, "VmRSS: %ld", &kb) == 1) *now_mb = (double)kb / 1024;
        if (sscanf(line, "VmHWM: %ld", &kb) == 1) *peak_mb = (double)kb / 1024;
    }
    if (fp) fclose(fp);
}

static int run(fg_fabric *f, void *arg) {
    args *a = arg;
    if (fg_set_num_threads(a->threads) != FG_OK) {
        fprintf(stderr, "offload_bench: %s\n", fg_last_error());
        return 1;
    }
    const char *text = "to be, or not to be, that is the question: whether tis nobler in the "
                       "mind to suffer the slings and arrows of outrageous fortune, ";
    int64_t V = 128, B = a->batch, T = a->ctx, L = (int64_t)strlen(text);
    int rank = fg_fabric_global_rank(f), world = fg_fabric_world_size(f);
    if (rank) freopen("/dev/null", "w", stdout);
    /* stage 3: each rank initialises its shard only (init_module(empty_init=True)) */
    fg_module_set_empty_init(a->params);
    fg_module *m = fg_gpt_new(&(fg_gpt_config){.vocab = V,
                                               .ctx = T,
                                               .layers = a->layers,
                                               .heads = (int)(a->embd / 64),
                                               .embd = a->embd,
                                               .seed = 1});
    fg_module_set_empty_init(false);
    fg_optimizer *o =
        m ? fg_adamw_new(m, &(fg_adamw_opts){.lr = a->lr, .weight_decay = 0.1}) : NULL;
    if (!o || fg_fabric_setup(f, m, o) != FG_OK) {
        fprintf(stderr, "offload_bench: %s\n", fg_last_error());
        return 1;
    }
    int64_t shape[2] = {B, T};
    fg_tensor *x = fg_tensor_new(FG_I32, 2, shape), *y = fg_tensor_new(FG_I32, 2, shape);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            ((int32_t *)fg_tensor_data(x))[b * T + t] = text[((rank * B + b) * 7 + t) % L];
            ((int32_t *)fg_tensor_data(y))[b * T + t] = text[((rank * B + b) * 7 + t + 1) % L];
        }
    int64_t P = fg_module_numel(m);
    printf("gpt: %lld parameters (%d layers, embd %lld, ctx %lld), batch %lld x %d ranks; "
           "training state %.0f MiB (16 B per parameter), of which the optimizer state %.0f MiB "
           "%s%s\n",
           (long long)P, a->layers, (long long)a->embd, (long long)T, (long long)B, world,
           16.0 * (double)P / 1048576, 8.0 * (double)P / 1048576,
           fg_optimizer_state_on_disk(o, NULL, NULL) ? "on disk" : "in memory",
           a->params && a->offload ? ", the parameters' shards too" : "");
    double rss0, hwm0;
    rss_mb(&rss0, &hwm0);
    printf("after setup: rank 0 resident %.0f MiB, peak %.0f MiB\n", rss0, hwm0);
    fflush(stdout);
    double first = 0, last = 0, t_train = 0, t_opt = 0;
    uint64_t rd0 = 0, wr0 = 0, rd = 0, wr = 0, io_r0 = 0, io_w0 = 0;
    for (int s = 0; s < a->steps; s++) {
        double t0 = now();
        if (s == 1) fg_optimizer_state_on_disk(o, &io_r0, &io_w0);
        fg_optimizer_zero_grad(o);
        fg_tensor *loss = fg_cross_entropy(fg_module_forward(m, x), y, -100);
        if (!loss || fg_fabric_backward(f, loss) != FG_OK) {
            fprintf(stderr, "offload_bench: step %d: %s\n", s, fg_last_error());
            return 1;
        }
        double l = fg_item(loss), t1 = now();
        fg_optimizer_state_on_disk(o, &rd0, &wr0);
        if (fg_optimizer_step(o) != FG_OK) {
            fprintf(stderr, "offload_bench: step %d: %s\n", s, fg_last_error());
            return 1;
        }
        double t2 = now();
        fg_optimizer_state_on_disk(o, &rd, &wr);
        fg_fabric_step_end(f);
        if (s == 0) first = l;
        last = l;
        if (s > 0) {
            t_train += t2 - t0;
            t_opt += t2 - t1;
        }
        double rss, hwm;
        rss_mb(&rss, &hwm);
        printf("step %d: loss %.4f, %.2f s (optimizer %.2f s: %.0f MB read, %.0f MB written); "
               "rank 0 resident %.0f MiB, peak %.0f MiB\n",
               s, l, t2 - t0, t2 - t1, (double)(rd - rd0) / 1e6, (double)(wr - wr0) / 1e6, rss,
               hwm);
        fflush(stdout);
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    int n = a->steps - 1;
    /* every rank's bytes moved over the steps after the first */
    double io[2] = {(double)(rd - io_r0), (double)(wr - io_w0)};
    fg_comm *c = fg_fabric_comm(f);
    if (c && fg_comm_allreduce(c, io, io, 2, FG_F64, FG_REDUCE_OP_SUM) != FG_OK) io[0] = io[1] = 0;
    printf("{\"params\": %lld, \"state_bytes\": %lld, \"steps\": %d, \"first_loss\": %.4f, "
           "\"last_loss\": %.4f, \"tokens_per_s\": %.1f, \"opt_step_s\": %.3f, "
           "\"disk_read_bps\": %.0f, \"disk_write_bps\": %.0f, \"io_read_bps\": %.0f, "
           "\"io_write_bps\": %.0f, \"peak_rss_mb\": %.1f, \"offload\": %s, \"ranks\": %d}\n",
           (long long)P, (long long)(16 * P), a->steps, first, last,
           n > 0 ? (double)(B * T * n * world) / t_train : 0, n > 0 ? t_opt / n : 0,
           n > 0 && t_opt > 0 ? (double)rd / (t_opt * a->steps / n) : 0,
           n > 0 && t_opt > 0 ? (double)wr / (t_opt * a->steps / n) : 0,
           n > 0 ? io[0] / t_train : 0, n > 0 ? io[1] / t_train : 0, (double)ru.ru_maxrss / 1024,
           a->offload ? "true" : "false", world);
    fg_tensor_free(x);
    fg_tensor_free(y);
    /* the model first: under parameter offload, freeing the optimizer or
     * the strategy first would bring the shard back into memory for it */
    fg_module_free(m);
    fg_optimizer_free(o);
    return 0;
}

int main(int argc, char **argv) {
    args a = {.layers = 4,
              .steps = 5,
              .embd = 768,
              .ctx = 64,
              .batch = 1,
              .offload = true,
              .devices = 1,
              .lr = 2e-5};
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(k, "--no-offload")) a.offload = false;
        else if (!strcmp(k, "--params")) a.params = true;
        else if (!v) break;
        else if (!strcmp(k, "--nvme-path")) a.nvme_path = v, i++;
        else if (!strcmp(k, "--layers")) a.layers = atoi(v), i++;
        else if (!strcmp(k, "--embd")) a.embd = atoll(v), i++;
        else if (!strcmp(k, "--ctx")) a.ctx = atoll(v), i++;
        else if (!strcmp(k, "--batch")) a.batch = atoll(v), i++;
        else if (!strcmp(k, "--steps")) a.steps = atoi(v), i++;
        else if (!strcmp(k, "--threads")) a.threads = atoi(v), i++;
        else if (!strcmp(k, "--devices")) a.devices = atoi(v), i++;
        else if (!strcmp(k, "--lr")) a.lr = atof(v), i++;
    }
    if (a.offload && !a.nvme_path) {
        fprintf(stderr, "offload_bench: --nvme-path DIR is required (or --no-offload)\n");
        return 2;
    }
    char devices[16];
    snprintf(devices, sizeof devices, "%d", a.devices);
    fg_fabric_config cfg = {.devices = devices,
                            .strategy = a.params ? "deepspeed_stage_3" : "deepspeed_stage_2",
                            .activation_checkpointing = true};
    if (a.offload) {
        cfg.sharded.offload_optimizer_device = FG_OFFLOAD_NVME;
        if (a.params) cfg.sharded.offload_params_device = FG_OFFLOAD_NVME;
        cfg.sharded.nvme_path = a.nvme_path;
    }
    fg_fabric *f = fg_fabric_new(&cfg);
    if (!f) {
        fprintf(stderr, "offload_bench: %s\n", fg_last_error());
        return 2;
    }
    int rc = fg_fabric_launch(f, run, &a);
    if (rc) fprintf(stderr, "offload_bench: %s\n", fg_last_error());
    fg_fabric_free(f);
    return rc;
}
