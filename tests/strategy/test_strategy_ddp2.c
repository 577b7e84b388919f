/* ddp2: P processes ("nodes", forked, on shm), each dp with R thread
 * replicas over its share B of the batch, give the parameters of one
 * process with batch P*B (20 SGD steps on an MLP, within 1e-5 relative), the
 * same bits on every process, from rank 0's initial weights; with no sync
 * on all but the last of 2 micro-batches, the same; ddp2 without a
 * communicator is plain dp. */
#include <math.h>
#include <stdio.h>
#include <sys/mman.h>

#include "fulgur/strategy.h"
#include "harness.h"
#include "mp/mp_join.h"

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
    int64_t B, n; /* per-process batch, parameter count */
    int threads, accum;
    bool no_comm;
    float *result; /* [rank][n] */
    char job[64];
} shared;

static int ddp2_rank(int rank, int np, void *arg) {
    shared *sh = arg;
    fg_comm *c = NULL;
    if (!sh->no_comm) {
        c = mp_join_shm(rank, np, sh->job, 60);
        if (!c) return 1;
    }
    fg_module *m = make_model();
    if (rank)
        CHECK_OK(fg_tensor_fill(fg_module_flat_params(m), 0.25 * rank)); /* setup broadcasts */
    fg_optimizer *o = make_opt(m);
    fg_strategy *st = fg_strategy_new(FG_STRATEGY_DDP2, c, m, o, NULL, NULL, sh->threads);
    if (!st) {
        fprintf(stderr, "rank %d: %s\n", rank, fg_last_error());
        return 1;
    }
    CHECK(fg_strategy_kind_of(st) == FG_STRATEGY_DDP2);
    int accum = sh->accum ? sh->accum : 1;
    int64_t micro = sh->B / accum;
    double scale = 1.0 / accum;
    for (int step = 0; step < STEPS; step++) {
        fg_optimizer_zero_grad(o);
        for (int k = 0; k < accum; k++) {
            fg_batch b = batch_rows(step, rank * sh->B + k * micro, micro);
            fg_strategy_set_sync(st, k == accum - 1);
            int parts = 0;
            double loss = 0;
            fg_status s = fg_strategy_step(st, &b, step_fn, &scale, NULL, 0, &parts, &loss);
            if (s != FG_OK) {
                fprintf(stderr, "rank %d step %d: %s\n", rank, step, fg_last_error());
                return 1;
            }
            CHECK(parts == sh->threads);
            fg_tensor_free(b.x);
            fg_tensor_free(b.y);
        }
        CHECK_OK(fg_optimizer_step(o));
        fg_step_reset();
    }
    memcpy(sh->result + (size_t)rank * (size_t)sh->n, fg_tensor_data(fg_module_flat_params(m)),
           sizeof(float) * (size_t)sh->n);
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

static void check_ddp2(int procs, int threads, int64_t B, int accum, bool no_comm) {
    fg_module *m = make_model();
    int64_t n = fg_module_numel(m);
    fg_module_free(m);
    float *ref = malloc(sizeof(float) * (size_t)n);
    train_single(procs * B, ref, n);
    shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    *sh = (shared){.B = B, .n = n, .threads = threads, .accum = accum, .no_comm = no_comm};
    sh->result = mmap(NULL, sizeof(float) * (size_t)(n * procs), PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    snprintf(sh->job, sizeof sh->job, "test-ddp2-%d-%d-%d", getpid(), procs, accum);
    int failed = fg_test_fork_ranks(procs, ddp2_rank, sh, 120);
    CHECK_MSG(failed == 0, "%d processes failed", failed);
    if (!failed) {
        double d = rel_diff(sh->result, ref, n);
        CHECK_MSG(d <= 1e-5, "ddp2 %d x %d threads (accum %d): %.3g from one process (relative)",
                  procs, threads, accum, d);
        printf("  ddp2 %d processes x %d threads%s: %.3g from one process at batch %lld\n", procs,
               threads, accum > 1 ? ", 2 micro-batches" : "", d, (long long)(procs * B));
        for (int r = 1; r < procs; r++)
            CHECK_MSG(
                !memcmp(sh->result, sh->result + (size_t)r * (size_t)n, sizeof(float) * (size_t)n),
                "process %d ends with other parameters than process 0", r);
    }
    munmap(sh->result, sizeof(float) * (size_t)(n * procs));
    munmap(sh, sizeof *sh);
    free(ref);
}

TEST(ddp2_equals_one_process_with_the_global_batch) {
    check_ddp2(2, 2, 8, 1, false);
    check_ddp2(3, 2, 6, 1, false);
}

TEST(ddp2_gradient_accumulation) { check_ddp2(2, 2, 8, 2, false); }

TEST(ddp2_without_a_communicator_is_dp) { check_ddp2(1, 3, 12, 1, true); }
