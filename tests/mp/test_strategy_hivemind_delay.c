/* strategy hivemind with Hivemind's offload_optimizer, delay_optimizer_step,
 * delay_grad_averaging and delay_state_averaging.
 *
 * A lone peer whose epoch is one step call (target_batch_size = batch_size)
 * is checked bit for bit against the same optimizer stepped here on the
 * same batches: with offload_optimizer alone (or nothing) each epoch's
 * gradient is taken at the parameters the previous epoch's step gave,
 * R_k = step(R_{k-1}, g(R_{k-1}; batch k)); with delay_optimizer_step the
 * step of epoch k runs while batch k+1's gradient is computed, so that
 * gradient is one epoch stale: R_k = step(R_{k-1}, g(R_{k-2}; batch k))
 * (R_{-1} = R_0), and the model holds R_{k-2} at call k's backward. Two
 * peers (forked processes, localhost) with every delay on, and with the
 * step alone delayed, reach the same epochs and end with the same
 * parameters (the state is averaged every epoch, the last round's too). A
 * round that fails in the background (an allocation of its all-reduce
 * refused) is the next step call's error; freeing the strategy with a
 * round in flight puts its result in the model. With reuse_grad_buffers
 * the model's gradient buffer accumulates an epoch of several calls, and
 * the parameters equal those of an accumulator of its own (to rounding). The refusals
 * that remain name what to set. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "fulgur/strategy.h"
#include "harness.h"
#include "strategy/strategy_impl.h"

#define NX 8
#define NCALLS 8

static fg_module *make_model(void) {
    return fg_mlp_new(&(fg_mlp_config){.sizes = {NX, 16, 16, 3}, .nlayers = 3, .seed = 3});
}

static fg_optimizer *make_opt(fg_module *m, bool adamw) {
    return adamw ? fg_adamw_new(m, &(fg_adamw_opts){.lr = 0.01})
                 : fg_sgd_new(m, &(fg_sgd_opts){.lr = 0.05, .momentum = 0.9});
}

enum { PLAIN, OFFLOAD, DELAY, DELAY_ALL };
static const char *const k_mode[] = {"plain", "offload_optimizer", "delay_optimizer_step",
                                     "every delay"};

static fg_hivemind_strategy_opts hm_opts(int mode, int64_t target, const char *initial) {
    fg_hivemind_strategy_opts o = {.target_batch_size = target,
                                   .run_id = "delay",
                                   .run_secret = "s3cret",
                                   .batch_size = 4,
                                   .initial_peers = initial,
                                   .host = "127.0.0.1",
                                   .matchmaking_time = 2,
                                   .averaging_timeout = 10,
                                   .join_wait = 10};
    o.offload_optimizer = mode != PLAIN;
    o.delay_optimizer_step = mode >= DELAY;
    o.delay_grad_averaging = o.delay_state_averaging = mode == DELAY_ALL;
    return o;
}

/* batch `it` of `rank`: 4 rows, 3 classes */
static void batch(int rank, int it, fg_tensor **x, fg_tensor **y) {
    int64_t sx[2] = {4, NX}, sy[1] = {4};
    *x = fg_tensor_new(FG_F32, 2, sx);
    *y = fg_tensor_new(FG_I32, 1, sy);
    fg_rng_fill_normal(7, (uint64_t)(rank * 100000 + it) * 64, fg_tensor_data(*x), 4 * NX, 0, 1);
    for (int i = 0; i < 4; i++)
        ((int32_t *)fg_tensor_data(*y))[i] =
            (int32_t)(fg_rng_u32_at(8, rank * 1000 + it * 4 + i) % 3);
}

static float *params(fg_module *m) { return fg_tensor_data(fg_module_flat_params(m)); }

static int ndiffer(const float *a, const float *b, int64_t n) {
    int d = 0;
    for (int64_t i = 0; i < n; i++) d += a[i] != b[i];
    return d;
}

/* The reference: R (stepped by its optimizer) and S, the parameters the
 * gradient of the next call is taken at. */
typedef struct reference {
    fg_module *r, *s;
    fg_optimizer *o;
    bool stale;
} reference;

static void ref_step(reference *ref, fg_tensor *x, fg_tensor *y) {
    int64_t n = fg_module_numel(ref->r);
    fg_module_zero_grad(ref->s);
    CHECK_OK(fg_backward(fg_cross_entropy(fg_module_forward(ref->s, x), y, -100)));
    memcpy(fg_tensor_data(fg_module_flat_grads(ref->r)),
           fg_tensor_data(fg_module_flat_grads(ref->s)), (size_t)n * 4);
    float *before = malloc((size_t)n * 4);
    memcpy(before, params(ref->r), (size_t)n * 4);
    CHECK_OK(fg_optimizer_step(ref->o));
    /* the next gradient's parameters: R_{k-1} when stale, else R_k */
    memcpy(params(ref->s), ref->stale ? before : params(ref->r), (size_t)n * 4);
    free(before);
}

/* One lone peer of `mode` for NCALLS calls against the reference; ends by
 * fg_strategy_settle (settle) or by freeing the strategy. */
static void lone(int mode, bool adamw, bool settle) {
    fg_module *m = make_model();
    fg_optimizer *o = make_opt(m, adamw);
    reference ref = {.r = make_model(), .s = make_model(), .stale = mode >= DELAY};
    ref.o = make_opt(ref.r, adamw);
    int64_t n = fg_module_numel(m);
    fg_ddp_opts d = {.hivemind = hm_opts(mode, 4, NULL)};
    fg_strategy *s = fg_strategy_new(FG_STRATEGY_HIVEMIND, NULL, m, o, &d, NULL, 0);
    CHECK_MSG(s != NULL, "%s: %s", k_mode[mode], fg_last_error());
    if (!s) return;
    int stale_at = -1; /* the first call whose backward saw other parameters than S's */
    for (int k = 1; k <= NCALLS; k++) {
        fg_tensor *x, *y;
        batch(0, k, &x, &y);
        if (stale_at < 0 && ndiffer(params(m), params(ref.s), n)) stale_at = k;
        fg_optimizer_zero_grad(o);
        CHECK_OK(fg_strategy_backward(s, fg_cross_entropy(fg_module_forward(m, x), y, -100)));
        bool stepped = false;
        CHECK_OK(fg_strategy_optimizer_step(s, o, &stepped));
        /* each call applies one epoch's step; the delayed first call has none yet */
        CHECK_MSG(stepped == (mode < DELAY || k > 1), "%s: call %d stepped %d", k_mode[mode], k,
                  stepped);
        ref_step(&ref, x, y);
        fg_step_reset();
        fg_tensor_free(x);
        fg_tensor_free(y);
    }
    CHECK_MSG(stale_at < 0, "%s: the parameters at call %d's backward are not the reference's",
              k_mode[mode], stale_at);
    /* with delay_grad_averaging the last epoch counts once its round has matched */
    int64_t epoch = fg__hivemind_epoch(s);
    CHECK_MSG(epoch == NCALLS || (mode == DELAY_ALL && epoch == NCALLS - 1),
              "%s: epoch %lld after %d calls", k_mode[mode], (long long)epoch, NCALLS);
    if (settle) {
        CHECK_OK(fg_strategy_settle(s));
        CHECK_OK(fg_strategy_settle(s)); /* nothing in flight: at once */
        CHECK(fg__hivemind_epoch(s) == NCALLS);
        CHECK(fg_optimizer_step_count(o) == NCALLS);
    }
    fg_strategy_free(s);
    int differ = ndiffer(params(m), params(ref.r), n);
    CHECK_MSG(differ == 0,
              "%s (%s): %d of %lld parameters differ from the reference's after %d "
              "epochs",
              k_mode[mode], adamw ? "AdamW" : "SGD", differ, (long long)n, NCALLS);
    fg_optimizer_free(ref.o);
    fg_module_free(ref.r);
    fg_module_free(ref.s);
    fg_optimizer_free(o);
    fg_module_free(m);
}

/* nng is not fork-safe: every peer runs in a process of its own */
static int lone_main(int rank, int nr, void *arg) {
    (void)rank, (void)nr, (void)arg;
    CHECK_OK(fg_set_num_threads(1));
    lone(PLAIN, false, false);
    lone(OFFLOAD, false, false);
    lone(DELAY, false, false); /* the round in flight collected by free */
    lone(DELAY, true, true);
    lone(DELAY_ALL, true, true);
    return 0;
}

TEST(hivemind_lone_peer_exact) { CHECK(fg_test_fork_ranks(1, lone_main, NULL, 300) == 0); }

/* The reference's check can fail: the delayed run's parameters are not the
 * fresh-gradient run's. */
static int stale_main(int rank, int nr, void *arg) {
    (void)rank, (void)nr, (void)arg;
    CHECK_OK(fg_set_num_threads(1));
    float *p[2];
    int64_t n = 0;
    for (int mode = 0; mode < 2; mode++) {
        fg_module *m = make_model();
        fg_optimizer *o = make_opt(m, false);
        fg_ddp_opts d = {.hivemind = hm_opts(mode ? DELAY : OFFLOAD, 4, NULL)};
        fg_strategy *s = fg_strategy_new(FG_STRATEGY_HIVEMIND, NULL, m, o, &d, NULL, 0);
        CHECK(s != NULL);
        if (!s) return 1;
        for (int k = 1; k <= NCALLS; k++) {
            fg_tensor *x, *y;
            batch(0, k, &x, &y);
            fg_optimizer_zero_grad(o);
            CHECK_OK(fg_strategy_backward(s, fg_cross_entropy(fg_module_forward(m, x), y, -100)));
            CHECK_OK(fg_strategy_optimizer_step(s, o, NULL));
            fg_step_reset();
            fg_tensor_free(x);
            fg_tensor_free(y);
        }
        CHECK_OK(fg_strategy_settle(s));
        n = fg_module_numel(m);
        p[mode] = malloc((size_t)n * 4);
        memcpy(p[mode], params(m), (size_t)n * 4);
        fg_strategy_free(s);
        fg_optimizer_free(o);
        fg_module_free(m);
    }
    CHECK(ndiffer(p[0], p[1], n) > n / 2);
    free(p[0]);
    free(p[1]);
    return 0;
}

TEST(hivemind_delay_is_stale) { CHECK(fg_test_fork_ranks(1, stale_main, NULL, 300) == 0); }

/* ------------------------------------------------ a round that fails */

static pthread_t g_main;
static volatile size_t g_fail_size;     /* allocations of this size off the main thread fail */
static volatile size_t g_fail_any_size; /* ... and of this size on any thread, */
static _Atomic int g_fail_any_left;     /* this many times */

static void *failing_alloc(void *ud, void *ptr, size_t size, size_t align) {
    (void)ud;
    if (!ptr) {
        if (size == g_fail_size && !pthread_equal(pthread_self(), g_main)) return NULL;
        if (size == g_fail_any_size && atomic_load(&g_fail_any_left) > 0 &&
            atomic_fetch_sub(&g_fail_any_left, 1) > 0)
            return NULL;
        void *p = NULL;
        return posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, size) ? NULL : p;
    }
    if (!size) return free(ptr), NULL;
    return realloc(ptr, size);
}

static int failing_main(int rank, int nr, void *arg) {
    (void)rank, (void)nr, (void)arg;
    g_main = pthread_self();
    fg_set_allocator(failing_alloc, NULL);
    CHECK_OK(fg_set_num_threads(1));
    fg_module *m = make_model();
    fg_optimizer *o = make_opt(m, false);
    int64_t n = fg_module_numel(m);
    fg_ddp_opts d = {.hivemind = hm_opts(DELAY_ALL, 4, NULL)};
    fg_strategy *s = fg_strategy_new(FG_STRATEGY_HIVEMIND, NULL, m, o, &d, NULL, 0);
    CHECK(s != NULL);
    if (!s) return 1;
    float *at3 = malloc((size_t)n * 4);
    for (int k = 1; k <= 4; k++) {
        fg_tensor *x, *y;
        batch(0, k, &x, &y);
        fg_optimizer_zero_grad(o);
        CHECK_OK(fg_strategy_backward(s, fg_cross_entropy(fg_module_forward(m, x), y, -100)));
        /* the round call 3 starts (epoch 2) cannot allocate its all-reduce
         * (the one before it is collected first: its all-reduce allocates too) */
        if (k == 3) {
            CHECK_OK(fg_strategy_settle(s));
            g_fail_size = (size_t)n * sizeof(double);
        }
        fg_status st = fg_strategy_optimizer_step(s, o, NULL);
        if (k < 4) {
            CHECK_OK(st);
            if (k == 3) memcpy(at3, params(m), (size_t)n * 4);
        } else {
            CHECK(st == FG_ENOMEM);
            CHECK_CONTAINS(fg_last_error(), "the round of epoch 2 (in the background");
            CHECK(ndiffer(at3, params(m), n) == 0); /* the model kept epoch 2's */
        }
        fg_step_reset();
        fg_tensor_free(x);
        fg_tensor_free(y);
    }
    g_fail_size = 0;
    fg_strategy_free(s);
    free(at3);
    fg_optimizer_free(o);
    fg_module_free(m);
    return 0;
}

TEST(hivemind_background_failure) { CHECK(fg_test_fork_ranks(1, failing_main, NULL, 120) == 0); }

/* ------------------------------------------------------------ two peers */

#define EPOCHS 6

typedef struct shared {
    int mode;
    bool fail_state;    /* peer 0's state averaging of epoch 2 cannot allocate */
    int state_failures; /* what peer 0 logged of it */
    char addr[128];
    volatile int have_addr;
    float params[2][600];
    int64_t epochs[2], rounds[2];
    int max_group[2];
    volatile int done[2];
} shared;

/* counts peer 0's "state averaging failed" warnings */
static void count_state_failures(void *ud, fg_log_level level, int rank, const char *msg) {
    (void)rank;
    if (level == FG_LOG_WARN && strstr(msg, "the state averaging failed"))
        ((shared *)ud)->state_failures++;
    if (getenv("FG_TEST_HIVEMIND_LOG")) fg_log_file(stderr, level, rank, msg);
}

static int peer_main(int rank, int nr, void *arg) {
    (void)nr;
    shared *sh = arg;
    CHECK_OK(fg_set_num_threads(1));
    if (getenv("FG_TEST_HIVEMIND_LOG")) fg_set_log(fg_log_file, stderr, FG_LOG_INFO);
    if (sh->fail_state && rank == 0) {
        fg_set_log(count_state_failures, sh, FG_LOG_INFO);
        fg_set_allocator(failing_alloc, NULL);
    }
    if (rank > 0)
        for (int i = 0; i < 60000 && !__atomic_load_n(&sh->have_addr, __ATOMIC_ACQUIRE); i++)
            usleep(1000);
    fg_module *m = make_model();
    fg_optimizer *o = make_opt(m, sh->mode == DELAY_ALL);
    fg_ddp_opts d = {.hivemind = hm_opts(sh->mode, 16, rank ? sh->addr : NULL)};
    if (sh->fail_state) d.hivemind.averaging_timeout = 2; /* the other waits that for peer 0 */
    fg_strategy *s = fg_strategy_new(FG_STRATEGY_HIVEMIND, NULL, m, o, &d, NULL, 0);
    CHECK(s != NULL);
    if (!s) return fprintf(stderr, "  %s\n", fg_last_error()), 1;
    /* SGD with momentum: parameters and one moment, 2 x numel values in
     * two parts of numel; a gradient part is half that */
    int64_t numel0 = fg_module_numel(m);
    bool armed = false;
    if (rank == 0) {
        snprintf(sh->addr, sizeof sh->addr, "%s", fg__hivemind_address(s));
        __atomic_store_n(&sh->have_addr, 1, __ATOMIC_RELEASE);
    }
    CHECK_OK(fg_hivemind_wait_peers(fg__hivemind_peer(s), 2, 60));
    for (int it = 0; it < 400; it++) {
        /* from the last epoch on, the round a step started in the background
         * is collected before the epoch is read: read without it, one peer
         * could see EPOCHS - 1 with the last round in flight, step again and
         * go on to an epoch of its own after the other peer stopped */
        if (fg__hivemind_epoch(s) >= EPOCHS - 1) CHECK_OK(fg_strategy_settle(s));
        if (fg__hivemind_epoch(s) >= EPOCHS) break;
        fg_tensor *x, *y;
        batch(rank, it, &x, &y);
        fg_optimizer_zero_grad(o);
        CHECK_OK(fg_strategy_backward(s, fg_cross_entropy(fg_module_forward(m, x), y, -100)));
        if (sh->fail_state && rank == 0 && !armed && fg__hivemind_epoch(s) == 2) {
            g_fail_any_size = (size_t)numel0 * sizeof(double);
            atomic_store(&g_fail_any_left, 1);
            armed = true;
        }
        CHECK_OK(fg_strategy_optimizer_step(s, o, NULL));
        fg_step_reset();
        fg_tensor_free(x);
        fg_tensor_free(y);
    }
    if (sh->fail_state && rank == 0)
        CHECK_MSG(atomic_load(&g_fail_any_left) <= 0, "the state averaging never allocated");
    /* the last round (its state averaging with the other peer) ends here */
    CHECK_OK(fg_strategy_settle(s));
    sh->epochs[rank] = fg__hivemind_epoch(s);
    int64_t loads;
    fg__hivemind_counts(s, &sh->rounds[rank], &loads, &sh->max_group[rank]);
    int64_t numel = fg_module_numel(m);
    CHECK(numel <= 600);
    memcpy(sh->params[rank], params(m), (size_t)numel * 4);
    sh->done[rank] = 1;
    for (int i = 0; i < 120000 && !(sh->done[0] && sh->done[1]); i++) usleep(1000);
    fg_strategy_free(s);
    fg_optimizer_free(o);
    fg_module_free(m);
    return 0;
}

static void two_peers(int mode, bool fail_state) {
    shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    memset(sh, 0, sizeof *sh);
    sh->mode = mode;
    sh->fail_state = fail_state;
    CHECK(fg_test_fork_ranks(2, peer_main, sh, 300) == 0);
    for (int r = 0; r < 2; r++) {
        CHECK_MSG(sh->epochs[r] >= EPOCHS, "%s: peer %d ended at epoch %lld", k_mode[mode], r,
                  (long long)sh->epochs[r]);
        CHECK_MSG(sh->max_group[r] == 2, "%s: peer %d: groups of %d at most", k_mode[mode], r,
                  sh->max_group[r]);
    }
    CHECK(sh->epochs[0] == sh->epochs[1]);
    /* peer 0 logged the failure once, kept its stepped state and went on;
     * the next state averaging brought the two together again */
    if (fail_state) CHECK_MSG(sh->state_failures == 1, "%d failures logged", sh->state_failures);
    int differ = ndiffer(sh->params[0], sh->params[1], 600);
    CHECK_MSG(differ == 0, "%s: %d parameters differ between the peers", k_mode[mode], differ);
    fprintf(stderr, "  %s: epochs %lld %lld, rounds %lld %lld\n", k_mode[mode],
            (long long)sh->epochs[0], (long long)sh->epochs[1], (long long)sh->rounds[0],
            (long long)sh->rounds[1]);
    munmap(sh, sizeof *sh);
}

TEST(hivemind_two_peers_delayed) {
    two_peers(DELAY, false);
    two_peers(DELAY_ALL, false);
}

/* A state averaging that fails after the step (here: peer 0 cannot
 * allocate its part) is logged; the step stands and the epoch ends. */
TEST(hivemind_state_averaging_failure) {
    two_peers(PLAIN, true);
    two_peers(OFFLOAD, true);
}

/* ------------------------------------------------ reuse_grad_buffers */

/* NCALLS + 1 calls of a lone peer whose epoch is 3 step calls (target 12,
 * batch 4), zero_grad before each backward as the fabric's loop does; the
 * parameters and the epoch after them (settled). */
static void accumulating_run(int mode, bool reuse, float *out, int64_t *epoch) {
    fg_module *m = make_model();
    fg_optimizer *o = make_opt(m, mode == OFFLOAD);
    int64_t n = fg_module_numel(m);
    fg_ddp_opts d = {.hivemind = hm_opts(mode, 12, NULL)};
    d.hivemind.reuse_grad_buffers = reuse;
    fg_strategy *s = fg_strategy_new(FG_STRATEGY_HIVEMIND, NULL, m, o, &d, NULL, 0);
    CHECK_MSG(s != NULL, "%s: %s", k_mode[mode], fg_last_error());
    if (!s) return;
    for (int k = 1; k <= NCALLS + 1; k++) {
        fg_tensor *x, *y;
        batch(0, k, &x, &y);
        fg_optimizer_zero_grad(o);
        CHECK_OK(fg_strategy_backward(s, fg_cross_entropy(fg_module_forward(m, x), y, -100)));
        CHECK_OK(fg_strategy_optimizer_step(s, o, NULL));
        /* the delayed round ends here, not at whichever call finds it done:
         * the parameters of the next backward do not depend on the timing */
        if (mode == DELAY) CHECK_OK(fg_strategy_settle(s));
        fg_step_reset();
        fg_tensor_free(x);
        fg_tensor_free(y);
    }
    CHECK_OK(fg_strategy_settle(s));
    *epoch = fg__hivemind_epoch(s);
    memcpy(out, params(m), (size_t)n * 4);
    fg_strategy_free(s);
    /* the model's zero_grad is its own again */
    fg_tensor *x, *y;
    batch(0, 0, &x, &y);
    CHECK_OK(fg_backward(fg_cross_entropy(fg_module_forward(m, x), y, -100)));
    fg_optimizer_zero_grad(o);
    const float *g = fg_tensor_data(fg_module_flat_grads(m));
    int64_t nonzero = 0;
    for (int64_t i = 0; i < n; i++) nonzero += g[i] != 0;
    CHECK_MSG(nonzero == 0, "%s: %lld gradients left by zero_grad after the strategy", k_mode[mode],
              (long long)nonzero);
    fg_step_reset();
    fg_tensor_free(x);
    fg_tensor_free(y);
    fg_optimizer_free(o);
    fg_module_free(m);
}

/* reuse_grad_buffers: the model's gradient buffer accumulates the epoch's
 * 3 calls although zero_grad is called before each backward, and the
 * parameters after 3 epochs are those of the run with an accumulator of
 * its own, up to rounding (a bias's backward adds its rows into the buffer
 * one by one, so the order of additions differs: a few parameters in 467
 * differ in the last bits; without the accumulation the gradient would be
 * a third of the epoch's, 1e-2 away); plain, offloaded and with the step
 * delayed. */
static int reuse_main(int rank, int nr, void *arg) {
    (void)rank, (void)nr, (void)arg;
    CHECK_OK(fg_set_num_threads(1));
    fg_module *m0 = make_model();
    int64_t n = fg_module_numel(m0);
    fg_module_free(m0);
    float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
    int modes[] = {PLAIN, OFFLOAD, DELAY};
    for (int i = 0; i < 3; i++) {
        int64_t ea = -1, eb = -1;
        accumulating_run(modes[i], false, a, &ea);
        accumulating_run(modes[i], true, b, &eb);
        CHECK_MSG(ea == 3 && eb == 3, "%s: epochs %lld and %lld after %d calls of 3 an epoch",
                  k_mode[modes[i]], (long long)ea, (long long)eb, NCALLS + 1);
        int64_t far = 0, worst = 0;
        for (int64_t j = 0; j < n; j++)
            if (fabs(a[j] - b[j]) > 1e-6 + 1e-5 * fabs(a[j])) {
                if (!far++) worst = j;
            }
        CHECK_MSG(far == 0,
                  "%s: %lld of %lld parameters differ between reuse_grad_buffers and an "
                  "accumulator of its own (the first, %lld: %.9g and %.9g)",
                  k_mode[modes[i]], (long long)far, (long long)n, (long long)worst, a[worst],
                  b[worst]);
    }
    free(a);
    free(b);
    return 0;
}

TEST(hivemind_reuse_grad_buffers) { CHECK(fg_test_fork_ranks(1, reuse_main, NULL, 300) == 0); }

TEST(hivemind_delay_refusals) {
    fg_module *m = make_model();
    fg_optimizer *o = make_opt(m, false);
    struct {
        bool off, step, grad, state;
        const char *says;
    } bad[] = {
        {true, false, true, false, "delay_grad_averaging needs delay_optimizer_step"},
        {true, false, false, true, "delay_state_averaging needs delay_optimizer_step"},
        {false, true, false, false, "delay_optimizer_step needs offload_optimizer"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fg_ddp_opts d = {.hivemind = hm_opts(PLAIN, 4, NULL)};
        d.hivemind.offload_optimizer = bad[i].off;
        d.hivemind.delay_optimizer_step = bad[i].step;
        d.hivemind.delay_grad_averaging = bad[i].grad;
        d.hivemind.delay_state_averaging = bad[i].state;
        CHECK(fg_strategy_new(FG_STRATEGY_HIVEMIND, NULL, m, o, &d, NULL, 0) == NULL);
        CHECK(fg_last_status() == FG_EINVAL);
        CHECK_CONTAINS(fg_last_error(), bad[i].says);
    }
    fg_ddp_opts d = {.hivemind = hm_opts(DELAY_ALL, 4, NULL)};
    d.hivemind.reuse_grad_buffers = true;
    CHECK(fg_strategy_new(FG_STRATEGY_HIVEMIND, NULL, m, o, &d, NULL, 0) == NULL);
    CHECK(fg_last_status() == FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "reuse_grad_buffers with delay_grad_averaging");
    fg_optimizer_free(o);
    fg_module_free(m);
}
