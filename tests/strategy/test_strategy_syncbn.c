/* SyncBatchNorm on 2 and 3 ranks (forked processes on the shm backend)
 * equals BatchNorm on one process over the global batch: a Conv2d ->
 * BatchNorm2d -> ReLU -> Conv2d model in f64, converted with
 * fg_module_convert_sync_batchnorm; each rank runs an uneven slice of one
 * batch of 7 (and BatchNorm1d a slice of 9 rows), back-propagates its
 * slice of the output gradient, and the parameter gradients summed over
 * ranks, the rank's rows of the output and of the input gradient, and the
 * running statistics are the single process's, to 1e-12; evaluation mode
 * is then the single process's too, without communication. */
#include <math.h>

#include "fulgur/nn.h"
#include "harness.h"
#include "mp/mp_join.h"

#include <unistd.h>

static fg_status comm_sum(void *ud, fg_tensor *t) {
    return fg_comm_allreduce(ud, fg_tensor_data(t), fg_tensor_data(t), fg_tensor_numel(t),
                             fg_tensor_dtype(t), FG_REDUCE_OP_SUM);
}

/* rank r of w takes rows [n r^2 / w^2, n (r+1)^2 / w^2): uneven slices */
static int64_t cut(int64_t n, int r, int w) { return n * r * r / ((int64_t)w * w); }

static fg_module *model2d(void) {
    fg_module *s = fg_sequential_new();
    fg_conv2d_opts o = {.padding = {1, 1}};
    CHECK_OK(fg_sequential_append(s, fg_conv2d_new(2, 3, (int64_t[]){3, 3}, &o, true, FG_F64)));
    CHECK_OK(fg_sequential_append(s, fg_batch_norm2d_new(3, 1e-5, 0.1, true, true, FG_F64)));
    CHECK_OK(fg_sequential_append(s, fg_relu_new()));
    CHECK_OK(fg_sequential_append(s, fg_conv2d_new(3, 2, (int64_t[]){1, 1}, NULL, false, FG_F64)));
    CHECK_OK(fg_module_set_seed(s, 7));
    return s;
}

static fg_module *model1d(void) {
    fg_module *s = fg_sequential_new();
    CHECK_OK(fg_sequential_append(s, fg_linear_new(4, 5, true, FG_F64)));
    CHECK_OK(fg_sequential_append(s, fg_batch_norm1d_new(5, 1e-5, 0.2, true, true, FG_F64)));
    CHECK_OK(fg_module_set_seed(s, 8));
    return s;
}

static fg_tensor *randn(int nd, const int64_t *shape, uint64_t seed) {
    fg_tensor *t = fg_empty(FG_F64, nd, shape);
    double *p = fg_tensor_data(t);
    fg_rng r = {seed, 0};
    for (int64_t i = 0; i < fg_tensor_numel(t); i++) p[i] = fg_rng_normal(&r) * 1.7 + 0.3;
    return t;
}

static bool close_to(double a, double b) { return fabs(a - b) <= 1e-12 * fmax(1, fabs(b)); }

/* one training step of model on rows [lo, hi) of x with output gradient
 * rows of gy, then one evaluation; *bad counts the values off the
 * reference's (ref: the same model run on every row by one process) */
static int run_case(fg_module *(*make)(void), int nd, const int64_t *xs, const int64_t *ys,
                    fg_comm *comm, int rank, int world) {
    fg_module *ref = make(), *m = make();
    fg_stats_reduce r = {comm_sum, comm};
    int bad = 0;
    if (fg_module_convert_sync_batchnorm(m, &r) != 1) bad++;
    if (strcmp(fg_module_type(fg_module_child(m, "1")), "SyncBatchNorm")) bad++;
    int64_t N = xs[0], lo = cut(N, rank, world), hi = cut(N, rank + 1, world);
    fg_tensor *x = randn(nd, xs, 11), *gy = randn(nd, ys, 12);
    fg_tensor *xr = fg_tensor_new(FG_F64, nd, xs), *xm;
    fg_tensor_set_requires_grad(xr, true);
    CHECK_OK(fg_tensor_copy(xr, x));
    int64_t sub[4];
    memcpy(sub, xs, sizeof(int64_t) * (size_t)nd);
    sub[0] = hi - lo;
    xm = fg_tensor_new(FG_F64, nd, sub);
    fg_tensor_set_requires_grad(xm, true);
    CHECK_OK(fg_tensor_copy(xm, fg_tensor_narrow_view(x, 0, lo, hi - lo)));
    fg_tensor *yr = fg_module_forward(ref, xr), *ym = fg_module_forward(m, xm);
    if (!yr || !ym) {
        fprintf(stderr, "rank %d: %s\n", rank, fg_last_error());
        return 1;
    }
    fg_tensor *gym = fg_tensor_contiguous(fg_tensor_narrow_view(gy, 0, lo, hi - lo));
    if (fg_backward_with(yr, gy) || fg_backward_with(ym, gym)) {
        fprintf(stderr, "rank %d: %s\n", rank, fg_last_error());
        return 1;
    }
    int64_t per = fg_tensor_numel(yr) / N, perx = fg_tensor_numel(xr) / N;
    for (int64_t i = 0; i < (hi - lo) * per; i++)
        bad += !close_to(fg_tensor_get(ym, i), fg_tensor_get(yr, lo * per + i));
    for (int64_t i = 0; i < (hi - lo) * perx; i++)
        bad += !close_to(fg_tensor_get(fg_tensor_grad(xm), i),
                         fg_tensor_get(fg_tensor_grad(xr), lo * perx + i));
    fg_tensor *g = fg_module_flat_grads(m), *gr = fg_module_flat_grads(ref);
    if (comm_sum(comm, g)) bad++;
    for (int64_t i = 0; i < fg_tensor_numel(g); i++)
        bad += !close_to(fg_tensor_get(g, i), fg_tensor_get(gr, i));
    for (int64_t b = 0; b < fg_module_num_buffers(m); b++)
        for (int64_t i = 0; i < fg_tensor_numel(fg_module_buffer(m, b)); i++)
            bad += !close_to(fg_tensor_get(fg_module_buffer(m, b), i),
                             fg_tensor_get(fg_module_buffer(ref, b), i));
    /* evaluation mode: the running statistics, no collective (rank 0 alone
     * runs it) */
    fg_module_train(m, false);
    fg_module_train(ref, false);
    if (rank == 0) {
        fg_tensor *e = fg_module_forward(m, xm), *er = fg_module_forward(ref, xr);
        for (int64_t i = 0; e && er && i < (hi - lo) * per; i++)
            bad += !close_to(fg_tensor_get(e, i), fg_tensor_get(er, lo * per + i));
        bad += !e || !er;
    }
    if (bad)
        fprintf(stderr, "rank %d of %d: %d values off the single process's\n", rank, world, bad);
    fg_step_reset();
    fg_tensor_free(xr);
    fg_tensor_free(xm);
    fg_module_free(m);
    fg_module_free(ref);
    return bad;
}

static int syncbn_rank(int rank, int world, void *arg) {
    (void)arg;
    char job[64];
    snprintf(job, sizeof job, "syncbn-%d-%d", world, (int)getppid());
    fg_comm *comm = mp_join_shm(rank, world, job, 60);
    if (!comm) return 1;
    int bad =
        run_case(model2d, 4, (int64_t[]){9, 2, 5, 4}, (int64_t[]){9, 2, 5, 4}, comm, rank, world);
    bad += run_case(model1d, 2, (int64_t[]){10, 4}, (int64_t[]){10, 5}, comm, rank, world);
    CHECK(bad == 0);
    fg_comm_free(comm);
    return bad != 0;
}

TEST(sync_batchnorm_2_ranks_is_batchnorm_over_the_global_batch) {
    CHECK(fg_test_fork_ranks(2, syncbn_rank, NULL, 120) == 0);
}
TEST(sync_batchnorm_3_ranks_is_batchnorm_over_the_global_batch) {
    CHECK(fg_test_fork_ranks(3, syncbn_rank, NULL, 120) == 0);
}
