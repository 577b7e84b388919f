/* The loss scaler on several ranks (forked processes, shm backend): an inf
 * gradient on ONE rank skips the step on EVERY rank (one allreduce of the
 * finding), every rank halves its scale the same way and names the rank
 * that found it; the next clean step is taken everywhere and the ranks'
 * parameters stay equal. World sizes 2 and 3, the inf on each rank in
 * turn. */
#include <math.h>
#include <stdio.h>

#include "fulgur/precision.h"
#include "harness.h"
#include "mp_join.h"

typedef struct arg {
    int bad_rank;
    char job[64];
} arg;

static char g_log[512];
static void capture(void *ud, fg_log_level lv, int rank, const char *msg) {
    (void)ud;
    (void)rank;
    if (lv == FG_LOG_WARN) snprintf(g_log, sizeof g_log, "%s", msg);
}

static int rank_main(int rank, int n, void *p) {
    const arg *a = p;
    fg_comm *c = mp_join_shm(rank, n, a->job, 60);
    if (!c) return 1;
    CHECK_OK(fg_set_num_threads(1));
    fg_set_log(capture, NULL, FG_LOG_WARN);
    fg_module *m = fg_mlp_new(&(fg_mlp_config){.sizes = {3, 4, 2}, .seed = 9});
    fg_optimizer *opt = fg_sgd_new(m, &(fg_sgd_opts){.lr = 0.25});
    fg_scaler *s = fg_scaler_new(NULL);
    fg_tensor *g = fg_module_flat_grads(m), *p0 = fg_module_flat_params(m);
    double before = fg_tensor_get(p0, 0);
    /* step 1: the same gradients everywhere, one inf on a->bad_rank */
    CHECK_OK(fg_tensor_fill(g, 2.0 * fg_scaler_scale(s)));
    if (rank == a->bad_rank) ((float *)fg_tensor_data(g))[3] = INFINITY;
    bool stepped = true;
    CHECK_OK(fg_scaler_step(s, opt, c, &stepped));
    CHECK_MSG(!stepped, "rank %d stepped past an inf on rank %d", rank, a->bad_rank);
    CHECK(fg_optimizer_step_count(opt) == 0 && fg_tensor_get(p0, 0) == before);
    CHECK_MSG(fg_scaler_scale(s) == 32768.0, "rank %d: scale %g", rank, fg_scaler_scale(s));
    char want[96];
    snprintf(want, sizeof want, "found on rank %d", a->bad_rank);
    CHECK_CONTAINS(g_log, want);
    /* step 2: clean everywhere: taken everywhere, the same update */
    CHECK_OK(fg_tensor_fill(g, 2.0 * fg_scaler_scale(s)));
    CHECK_OK(fg_scaler_step(s, opt, c, &stepped));
    CHECK(stepped && fg_optimizer_step_count(opt) == 1);
    CHECK_CLOSE(fg_tensor_get(p0, 0), before - 0.25 * 2.0, 1e-6, 1e-6);
    /* and every rank holds the same parameters */
    int64_t np = fg_tensor_numel(p0);
    float *mx = fg_alloc(sizeof(float) * (size_t)np), *mn = fg_alloc(sizeof(float) * (size_t)np);
    CHECK_OK(fg_comm_allreduce(c, fg_tensor_data(p0), mx, np, FG_F32, FG_REDUCE_OP_MAX));
    CHECK_OK(fg_comm_allreduce(c, fg_tensor_data(p0), mn, np, FG_F32, FG_REDUCE_OP_MIN));
    CHECK(!memcmp(mx, mn, sizeof(float) * (size_t)np));
    fg_free(mx);
    fg_free(mn);
    fg_scaler_free(s);
    fg_optimizer_free(opt);
    fg_module_free(m);
    fg_comm_free(c);
    return 0;
}

TEST(inf_on_one_rank_skips_on_all) {
    for (int world = 2; world <= 3; world++)
        for (int bad = 0; bad < world; bad++) {
            arg a = {.bad_rank = bad};
            snprintf(a.job, sizeof a.job, "test-scaler-%d-%d-%d", (int)getpid(), world, bad);
            int failed = fg_test_fork_ranks(world, rank_main, &a, 60);
            CHECK_MSG(failed == 0, "world %d, inf on rank %d: %d rank(s) failed", world, bad,
                      failed);
        }
}
