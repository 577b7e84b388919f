/* horovod: N ranks (forked, shm) give the parameters of one process with
 * batch N*B (20 SGD steps on an MLP, within 1e-5 relative; fp16 compression
 * within 1e-3), the same bits on every rank, from rank 0's initial weights:
 * with the default fusion buffer (64 MiB: one allreduce a cycle), a buffer
 * of 600 bytes (many per cycle), no fusion, a 0.05 ms cycle, and
 * backward_passes_per_step 2; every gradient element is sent exactly once a
 * step (the bytes counted: 4 each, 2 under fp16). */
#include <math.h>
#include <stdio.h>
#include <sys/mman.h>

#include "fulgur/strategy.h"
#include "harness.h"
#include "mp_join.h"
#include "strategy/strategy_impl.h"

#define STEPS 20
#define NX 12

static fg_module *make_model(void) {
    return fg_mlp_new(&(fg_mlp_config){.sizes = {NX, 32, 32, 5}, .nlayers = 3, .seed = 5});
}

static fg_optimizer *make_opt(fg_module *m) {
    return fg_sgd_new(m, &(fg_sgd_opts){.lr = 0.05, .momentum = 0.9});
}

/* Rows [r0, r0+n) of step `step`'s global batch (persistent tensors). */
static fg_batch batch_rows(int step, int64_t r0, int64_t n) {
    int64_t sx[2] = {n, NX}, sy[1] = {n};
    fg_batch b = {.size = n, .valid = n};
    b.x = fg_tensor_new(FG_F32, 2, sx);
    b.y = fg_tensor_new(FG_I32, 1, sy);
    fg_rng_fill_normal(13, (uint64_t)step * 100000u + (uint64_t)r0 * NX, fg_tensor_data(b.x),
                       n * NX, 0, 1);
    for (int64_t i = 0; i < n; i++)
        ((int32_t *)fg_tensor_data(b.y))[i] =
            (int32_t)(fg_rng_u32_at(14, (uint64_t)step * 1000u + (uint64_t)(r0 + i)) % 5);
    return b;
}

static fg_tensor *step_fn(fg_module *replica, fg_batch *part, void *ud) {
    double scale = ud ? *(double *)ud : 1.0;
    fg_tensor *l = fg_cross_entropy(fg_module_forward(replica, part->x), part->y, -100);
    return scale != 1.0 ? fg_scale(l, scale) : l;
}

static void train_single(int64_t B, float *out, int64_t n) {
    fg_module *m = make_model();
    fg_optimizer *o = make_opt(m);
    for (int step = 0; step < STEPS; step++) {
        fg_optimizer_zero_grad(o);
        fg_batch b = batch_rows(step, 0, B);
        CHECK_OK(fg_backward(step_fn(m, &b, NULL)));
        CHECK_OK(fg_optimizer_step(o));
        fg_step_reset();
        fg_tensor_free(b.x);
        fg_tensor_free(b.y);
    }
    memcpy(out, fg_tensor_data(fg_module_flat_params(m)), sizeof(float) * (size_t)n);
    fg_optimizer_free(o);
    fg_module_free(m);
}

typedef struct shared {
    int64_t B, n;
    fg_horovod_opts ho;
    float *result; /* [rank][n] */
    int64_t allreduces[8];
    uint64_t bytes[8];
    char job[64];
} shared;

static int hvd_rank(int rank, int np, void *arg) {
    shared *sh = arg;
    fg_comm *c = mp_join_shm(rank, np, sh->job, 60);
    if (!c) return 1;
    fg_set_num_threads(1);
    fg_module *m = make_model();
    if (rank) fg_tensor_fill(fg_module_flat_params(m), 0.25 * rank); /* setup broadcasts */
    fg_optimizer *o = make_opt(m);
    fg_ddp_opts d = {.horovod = sh->ho};
    fg_strategy *st = fg_strategy_new(FG_STRATEGY_HOROVOD, c, m, o, &d, NULL, 0);
    if (!st) {
        fprintf(stderr, "rank %d: %s\n", rank, fg_last_error());
        return 1;
    }
    int passes = sh->ho.backward_passes_per_step ? sh->ho.backward_passes_per_step : 1;
    int64_t micro = sh->B / passes;
    double scale = 1.0 / passes;
    for (int step = 0; step < STEPS; step++) {
        fg_optimizer_zero_grad(o);
        for (int k = 0; k < passes; k++) {
            fg_batch b = batch_rows(step, rank * sh->B + k * micro, micro);
            fg_status s = fg_strategy_backward(st, step_fn(m, &b, &scale));
            if (s != FG_OK) {
                fprintf(stderr, "rank %d step %d: %s\n", rank, step, fg_last_error());
                return 1;
            }
            fg_tensor_free(b.x);
            fg_tensor_free(b.y);
        }
        CHECK_OK(fg_optimizer_step(o));
        fg_step_reset();
    }
    memcpy(sh->result + (size_t)rank * (size_t)sh->n, fg_tensor_data(fg_module_flat_params(m)),
           sizeof(float) * (size_t)sh->n);
    sh->allreduces[rank] = fg__horovod_allreduces(st);
    sh->bytes[rank] = fg__horovod_bytes_sent(st);
    fg_strategy_free(st);
    fg_optimizer_free(o);
    fg_module_free(m);
    fg_comm_free(c);
    return 0;
}

static double rel_diff(const float *a, const float *b, int64_t n) {
    double d = 0, mx = 0;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        mx = fmax(mx, fabs((double)b[i]));
    }
    return d / (mx > 0 ? mx : 1);
}

static void check_hvd(const char *what, int np, int64_t B, fg_horovod_opts ho, double tol,
                      int64_t min_allreduces) {
    fg_module *m = make_model();
    int64_t n = fg_module_numel(m);
    fg_module_free(m);
    float *ref = malloc(sizeof(float) * (size_t)n);
    train_single(np * B, ref, n);
    shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    *sh = (shared){.B = B, .n = n, .ho = ho};
    sh->result = mmap(NULL, sizeof(float) * (size_t)(n * np), PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    snprintf(sh->job, sizeof sh->job, "test-hvd-%d-%s-%d", getpid(), what, np);
    int failed = fg_test_fork_ranks(np, hvd_rank, sh, 120);
    CHECK_MSG(failed == 0, "%s: %d ranks failed", what, failed);
    if (!failed) {
        double d = rel_diff(sh->result, ref, n);
        CHECK_MSG(d <= tol, "horovod %s on %d ranks: %.3g from one process (relative)", what, np,
                  d);
        uint64_t want =
            (uint64_t)n * STEPS * (ho.compression == FG_HOROVOD_COMPRESSION_FP16 ? 2u : 4u);
        printf("  horovod %s, %d ranks: %.3g from one process; %lld allreduces of the fusion "
               "buffer, %llu bytes sent (want %llu)\n",
               what, np, d, (long long)sh->allreduces[0], (unsigned long long)sh->bytes[0],
               (unsigned long long)want);
        for (int r = 0; r < np; r++) {
            CHECK_MSG(sh->bytes[r] == want, "rank %d sent %llu bytes, want %llu", r,
                      (unsigned long long)sh->bytes[r], (unsigned long long)want);
            CHECK(sh->allreduces[r] == sh->allreduces[0]);
            if (r)
                CHECK_MSG(!memcmp(sh->result, sh->result + (size_t)r * (size_t)n,
                                  sizeof(float) * (size_t)n),
                          "rank %d ends with other parameters than rank 0", r);
        }
        CHECK(sh->allreduces[0] >= min_allreduces);
    }
    munmap(sh->result, sizeof(float) * (size_t)(n * np));
    munmap(sh, sizeof *sh);
    free(ref);
}

TEST(horovod_equals_one_process_with_the_global_batch) {
    check_hvd("default fusion", 2, 8, (fg_horovod_opts){0}, 1e-5, STEPS);
    check_hvd("default fusion", 4, 4, (fg_horovod_opts){0}, 1e-5, STEPS);
}

TEST(horovod_small_fusion_buffer_no_fusion_short_cycle) {
    /* 600 bytes: the 32x32 weights (4 KiB) go alone, the biases together */
    check_hvd("600-byte buffer", 2, 8, (fg_horovod_opts){.fusion_threshold = 600}, 1e-5, 3 * STEPS);
    /* no fusion: one allreduce per gradient, 6 parameters */
    check_hvd("no fusion", 2, 8, (fg_horovod_opts){.fusion_threshold = -1}, 1e-5, 6 * STEPS);
    check_hvd("0.05 ms cycle", 3, 6, (fg_horovod_opts){.cycle_time_ms = 0.05}, 1e-5, STEPS);
}

TEST(horovod_backward_passes_per_step_and_fp16) {
    check_hvd("2 backward passes a step", 2, 8, (fg_horovod_opts){.backward_passes_per_step = 2},
              1e-5, STEPS);
    check_hvd("fp16 compression", 2, 8,
              (fg_horovod_opts){.compression = FG_HOROVOD_COMPRESSION_FP16}, 1e-3, STEPS);
}

TEST(horovod_env_and_bad_options) {
    setenv("HOROVOD_FUSION_THRESHOLD", "0", 1); /* Horovod's way to turn fusion off */
    check_hvd("HOROVOD_FUSION_THRESHOLD=0", 2, 8, (fg_horovod_opts){0}, 1e-5, 6 * STEPS);
    unsetenv("HOROVOD_FUSION_THRESHOLD");
    fg_module *m = make_model();
    CHECK(fg_strategy_new(FG_STRATEGY_HOROVOD, NULL, m, NULL, NULL, NULL, 0) == NULL);
    CHECK(fg_last_status() == FG_EINVAL); /* needs a communicator, as ddp */
    fg_cluster_info one = {.world_size = 1, .local_world_size = 1, .num_nodes = 1};
    fg_comm *c = fg_comm_new(&one, &(fg_comm_opts){.backend = FG_COMM_SHM});
    CHECK(c != NULL);
    setenv("HOROVOD_CYCLE_TIME", "-1", 1);
    CHECK(fg_strategy_new(FG_STRATEGY_HOROVOD, c, m, NULL, NULL, NULL, 0) == NULL);
    CHECK_CONTAINS(fg_last_error(), "HOROVOD_CYCLE_TIME=\"-1\"");
    unsetenv("HOROVOD_CYCLE_TIME");
    fg_ddp_opts d = {.horovod = {.compression = (fg_horovod_compression)7}};
    CHECK(fg_strategy_new(FG_STRATEGY_HOROVOD, c, m, NULL, &d, NULL, 0) == NULL);
    CHECK_CONTAINS(fg_last_error(), "compression 7");
    d = (fg_ddp_opts){.comm_hook = FG_DDP_HOOK_FP16_COMPRESS};
    CHECK(fg_strategy_new(FG_STRATEGY_HOROVOD, c, m, NULL, &d, NULL, 0) == NULL);
    CHECK_CONTAINS(fg_last_error(), "fg_horovod_opts.compression");
    fg_strategy *st = fg_strategy_new(FG_STRATEGY_HOROVOD, c, m, NULL, NULL, NULL, 0);
    CHECK(st != NULL && fg_strategy_kind_of(st) == FG_STRATEGY_HOROVOD);
    CHECK(!strcmp(fg_strategy_kind_name(FG_STRATEGY_HOROVOD), "horovod"));
    fg_strategy_free(st);
    fg_comm_free(c);
    fg_module_free(m);
}
