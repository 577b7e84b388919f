/* DDP communication hooks run off the backward thread (shm backend, 2
 * ranks): a user hook runs on a thread other than the one calling backward,
 * and while the hook of the first bucket runs, backward goes on to
 * recompute the model's first layer (a checkpoint, whose parameters are in
 * the last bucket): each waits for the other to have begun, which ends
 * only if they overlap (a hook on the backward thread does not wait, and
 * fails the test instead). The gradient then equals plain ddp's bitwise. A hook
 * that fails on one rank makes that rank's backward return its error,
 * naming the bucket, and the other rank's backward return an error too
 * (no hang). */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <sys/mman.h>

#include "fulgur/strategy.h"
#include "harness.h"
#include "mp/mp_join.h"
#include "strategy/strategy_impl.h"

typedef struct shared {
    int64_t n;
    float grad[2][400000]; /* each rank's flat gradient after backward */
    int off_thread[2];     /* hook calls on another thread than backward's */
    int on_thread[2];      /* hook calls on backward's thread */
    int saw_later[2];      /* bucket 0's hook saw backward recompute the first layer */
    int calls[2], nbuckets;
    int fail_rank; /* the rank whose hook fails on bucket 1; -1: none */
    int status[2];
    char msg[2][512];
    char job[96];
} shared;

typedef struct ctx {
    shared *sh;
    int rank;
    pthread_t backward_thread;
    fg_module *m;
    bool hooked;
    int first_calls;   /* of first(): the second is backward's recomputation */
    int recomputing;   /* set by backward's recomputation (atomic) */
    int hook0_started; /* bucket 0's hook began (atomic): 1 off the backward thread, 2 on it */
    int nb;            /* buckets */
} ctx;

static void wait_flag(int *flag) {
    while (!__atomic_load_n(flag, __ATOMIC_ACQUIRE)) sched_yield();
}

/* The first Linear and its activation, checkpointed. */
static fg_tensor *first(fg_tensor *x, void *ud) {
    ctx *c = ud;
    if (++c->first_calls == 2 && c->hooked) {
        __atomic_store_n(&c->recomputing, 1, __ATOMIC_RELEASE);
        if (c->nb > 1) wait_flag(&c->hook0_started);
    }
    return fg_module_forward(fg_module_child_at(c->m, 1),
                             fg_module_forward(fg_module_child_at(c->m, 0), x));
}

static fg_tensor *forward(ctx *c, fg_tensor *x) {
    x = fg_checkpoint(first, x, c);
    for (int i = 2; fg_module_child_at(c->m, i); i++)
        x = fg_module_forward(fg_module_child_at(c->m, i), x);
    return x;
}

static fg_status hook(void *state, const fg_ddp_bucket *b) {
    ctx *c = state;
    shared *sh = c->sh;
    sh->calls[c->rank]++;
    if (pthread_equal(pthread_self(), c->backward_thread)) {
        sh->on_thread[c->rank]++;
        if (b->index == 0) __atomic_store_n(&c->hook0_started, 2, __ATOMIC_RELEASE);
    } else {
        sh->off_thread[c->rank]++;
    }
    if (c->rank == sh->fail_rank && b->index == 1)
        return fg_error(FG_EINVAL, "test hook refuses bucket %d on rank %d", b->index, c->rank);
    /* Bucket 0 holds the last parameters: it is ready before backward
     * reaches the first layer. Off the backward thread, wait until backward
     * recomputes that layer (on the backward thread this would never end). */
    if (b->index == 0 && b->num_buckets > 1 && !pthread_equal(pthread_self(), c->backward_thread)) {
        __atomic_store_n(&c->hook0_started, 1, __ATOMIC_RELEASE);
        wait_flag(&c->recomputing);
        sh->saw_later[c->rank] = 1;
    }
    return fg_ddp_bucket_allreduce(b, b->grad, b->numel, FG_REDUCE_OP_AVG);
}

static int rank_main(int rank, int world, void *arg) {
    shared *sh = arg;
    fg_comm *comm = mp_join_shm(rank, world, sh->job, 10);
    if (!comm) return 1;
    CHECK_OK(fg_set_num_threads(1));
    fg_module *m =
        fg_mlp_new(&(fg_mlp_config){.sizes = {12, 600, 600, 5}, .nlayers = 3, .seed = 5});
    fg_optimizer *o = fg_sgd_new(m, &(fg_sgd_opts){.lr = 0.1});
    bool hooked = sh->fail_rank != -2; /* -2: plain ddp, the reference */
    ctx c = {.sh = sh, .rank = rank, .backward_thread = pthread_self(), .m = m, .hooked = hooked};
    fg_ddp_opts d = {0};
    if (hooked) {
        d.user_hook = hook;
        d.user_state = &c;
    }
    fg_strategy *st = fg_strategy_new(FG_STRATEGY_DDP, comm, m, o, &d, NULL, 0);
    if (!st) {
        fprintf(stderr, "rank %d: %s\n", rank, fg_last_error());
        return 1;
    }
    c.nb = fg__ddp_reducer_num_buckets(st->reducer);
    if (rank == 0) sh->nbuckets = c.nb;
    sh->n = fg_module_numel(m);
    fg_tensor *flat = fg_module_flat_grads(m);
    int64_t sx[2] = {16, 12}, sy[1] = {16};
    fg_tensor *x = fg_empty(FG_F32, 2, sx), *y = fg_empty(FG_I32, 1, sy);
    fg_rng_fill_normal(13, (uint64_t)rank * 10000u, fg_tensor_data(x), 16 * 12, 0, 1);
    for (int i = 0; i < 16; i++)
        ((int32_t *)fg_tensor_data(y))[i] =
            (int32_t)(fg_rng_u32_at(14, (uint64_t)(rank * 100 + i)) % 5);
    fg_optimizer_zero_grad(o);
    fg_status s = fg_strategy_backward(st, fg_cross_entropy(forward(&c, x), y, -100));
    sh->status[rank] = s;
    snprintf(sh->msg[rank], sizeof sh->msg[rank], "%s", s == FG_OK ? "" : fg_last_error());
    if (s == FG_OK && sh->n <= 400000)
        memcpy(sh->grad[rank], fg_tensor_data(flat), sizeof(float) * (size_t)sh->n);
    fg_step_reset();
    fg_strategy_free(st);
    fg_optimizer_free(o);
    fg_module_free(m);
    fg_comm_free(comm);
    return 0;
}

static int g_runs;

static shared *run(int fail_rank) {
    shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    memset(sh, 0, sizeof *sh);
    sh->fail_rank = fail_rank;
    snprintf(sh->job, sizeof sh->job, "test-hooks-async-%d-%d", getpid(), g_runs++);
    int failed = fg_test_fork_ranks(2, rank_main, sh, 300);
    CHECK_MSG(failed == 0, "%d ranks failed", failed);
    return sh;
}

TEST(user_hook_runs_off_the_backward_thread_while_backward_goes_on) {
    shared *ref = run(-2);
    shared *sh = run(-1);
    CHECK_MSG(sh->nbuckets >= 2, "%d buckets: the test needs 2 or more", sh->nbuckets);
    CHECK(sh->n <= 400000);
    for (int r = 0; r < 2; r++) {
        CHECK_MSG(sh->status[r] == FG_OK, "rank %d: %s", r, sh->msg[r]);
        CHECK_MSG(sh->calls[r] == sh->nbuckets, "rank %d: %d hook calls for %d buckets", r,
                  sh->calls[r], sh->nbuckets);
        CHECK_MSG(sh->on_thread[r] == 0 && sh->off_thread[r] == sh->nbuckets,
                  "rank %d: %d hook calls on the backward thread, %d off it", r, sh->on_thread[r],
                  sh->off_thread[r]);
        CHECK_MSG(sh->saw_later[r],
                  "rank %d: bucket 0's hook did not run while backward recomputed the first layer",
                  r);
        CHECK_MSG(!memcmp(sh->grad[r], ref->grad[0], sizeof(float) * (size_t)sh->n),
                  "rank %d: the hooked gradient differs from plain ddp's", r);
    }
    munmap(ref, sizeof *ref);
    munmap(sh, sizeof *sh);
}

TEST(hook_error_on_one_rank_is_reported_not_hung) {
    shared *sh = run(1);
    CHECK_MSG(sh->status[1] == FG_EINVAL, "rank 1: status %d: %s", sh->status[1], sh->msg[1]);
    CHECK_MSG(strstr(sh->msg[1], "bucket 1") && strstr(sh->msg[1], "test hook refuses"),
              "rank 1: %s", sh->msg[1]);
    /* rank 0 waited in bucket 1's allreduce for a rank that never came */
    CHECK_MSG(sh->status[0] != FG_OK, "rank 0: backward succeeded without rank 1");
    CHECK_MSG(strstr(sh->msg[0], "bucket 1") != NULL, "rank 0: %s", sh->msg[0]);
    munmap(sh, sizeof *sh);
}
