/* strategy hivemind: 3 peers (forked processes, localhost) train an MLP with
 * a target_batch_size of 24 from batches of 4; every peer reaches the same
 * global epochs with the same parameters (state averaged each epoch), and a
 * 4th peer that joins at epoch 2 starts from a live peer's parameters,
 * optimizer state and epoch (load_state_from_peers). delay_optimizer_step
 * without offload_optimizer is refused with a message (the delays are
 * tests/mp/test_strategy_hivemind_delay.c). */
#include <sys/mman.h>

#include "fulgur/strategy.h"
#include "harness.h"
#include "strategy/strategy_impl.h"

#define NX 8
#define EPOCHS 6

typedef struct shared {
    char addr[128];
    volatile int have_addr;
    volatile int64_t epoch0; /* peer 0's epoch */
    float params[4][600];
    int64_t epochs[4], joined_at[4], rounds[4], loads[4];
    int max_group[4];
    volatile int done[4];
} shared;

static fg_module *make_model(void) {
    return fg_mlp_new(&(fg_mlp_config){.sizes = {NX, 16, 16, 3}, .nlayers = 3, .seed = 3});
}

static fg_ddp_opts opts(const char *initial) {
    return (fg_ddp_opts){.hivemind = {.target_batch_size = 24,
                                      .run_id = "mlp",
                                      .run_secret = "s3cret",
                                      .batch_size = 4,
                                      .initial_peers = initial,
                                      .host = "127.0.0.1",
                                      .matchmaking_time = 2,
                                      .averaging_timeout = 10,
                                      .join_wait = 10}};
}

static int peer_main(int rank, int n, void *arg) {
    (void)n;
    shared *sh = arg;
    CHECK_OK(fg_set_num_threads(1));
    if (getenv("FG_TEST_HIVEMIND_LOG")) fg_set_log(fg_log_file, stderr, FG_LOG_INFO);
    if (rank > 0)
        for (int i = 0; i < 60000 && !__atomic_load_n(&sh->have_addr, __ATOMIC_ACQUIRE); i++)
            usleep(1000);
    if (rank == 3)
        for (int i = 0; i < 120000 && sh->epoch0 < 2; i++) usleep(1000);
    fg_module *m = make_model();
    fg_optimizer *o = fg_sgd_new(m, &(fg_sgd_opts){.lr = 0.05, .momentum = 0.9});
    fg_ddp_opts d = opts(rank ? sh->addr : NULL);
    fg_strategy *s = fg_strategy_new(FG_STRATEGY_HIVEMIND, NULL, m, o, &d, NULL, 0);
    CHECK(s != NULL);
    if (!s) return fprintf(stderr, "  %s\n", fg_last_error()), 1;
    sh->joined_at[rank] = fg__hivemind_epoch(s);
    if (rank == 0) {
        snprintf(sh->addr, sizeof sh->addr, "%s", fg__hivemind_address(s));
        __atomic_store_n(&sh->have_addr, 1, __ATOMIC_RELEASE);
    }
    /* the first three start together (a peer alone would run ahead by itself) */
    if (rank < 3) CHECK_OK(fg_hivemind_wait_peers(fg__hivemind_peer(s), 3, 60));
    for (int it = 0; it < 400 && fg__hivemind_epoch(s) < EPOCHS; it++) {
        int64_t sx[2] = {4, NX}, sy[1] = {4};
        fg_tensor *x = fg_tensor_new(FG_F32, 2, sx), *y = fg_tensor_new(FG_I32, 1, sy);
        fg_rng_fill_normal(7, (uint64_t)(rank * 100000 + it) * 64, fg_tensor_data(x), 4 * NX, 0, 1);
        for (int i = 0; i < 4; i++)
            ((int32_t *)fg_tensor_data(y))[i] =
                (int32_t)(fg_rng_u32_at(8, rank * 1000 + it * 4 + i) % 3);
        fg_optimizer_zero_grad(o);
        CHECK_OK(fg_strategy_backward(s, fg_cross_entropy(fg_module_forward(m, x), y, -100)));
        bool stepped;
        CHECK_OK(fg_strategy_optimizer_step(s, o, &stepped));
        fg_step_reset();
        fg_tensor_free(x);
        fg_tensor_free(y);
        if (rank == 0) sh->epoch0 = fg__hivemind_epoch(s);
    }
    sh->epochs[rank] = fg__hivemind_epoch(s);
    fg__hivemind_counts(s, &sh->rounds[rank], &sh->loads[rank], &sh->max_group[rank]);
    int64_t numel = fg_module_numel(m);
    CHECK(numel <= 600);
    memcpy(sh->params[rank], fg_tensor_data(fg_module_flat_params(m)), (size_t)numel * 4);
    sh->done[rank] = 1;
    /* stay in the swarm until all are done: a peer that left would be waited for */
    for (int i = 0; i < 120000; i++) {
        int all = 1;
        for (int r = 0; r < 4; r++) all &= sh->done[r];
        if (all) break;
        usleep(1000);
    }
    fg_strategy_free(s);
    fg_optimizer_free(o);
    fg_module_free(m);
    return 0;
}

TEST(hivemind_peers_and_a_joiner) {
    shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    memset(sh, 0, sizeof *sh);
    CHECK(fg_test_fork_ranks(4, peer_main, sh, 500) == 0);
    for (int r = 0; r < 4; r++)
        CHECK_MSG(sh->epochs[r] >= EPOCHS, "peer %d ended at epoch %lld", r,
                  (long long)sh->epochs[r]);
    CHECK(sh->joined_at[3] >= 2); /* the joiner started from the swarm's epoch */
    CHECK(sh->loads[3] >= 1);
    for (int r = 0; r < 3; r++) /* they averaged together, not each alone */
        CHECK_MSG(sh->max_group[r] >= 3, "peer %d: groups of %d at most", r, sh->max_group[r]);
    CHECK(sh->rounds[3] < EPOCHS); /* it did not redo the epochs it loaded */
    for (int r = 1; r < 4; r++) {
        int differ = 0;
        for (int i = 0; i < 600; i++) differ += sh->params[r][i] != sh->params[0][i];
        CHECK_MSG(differ == 0, "peer %d: %d parameters differ from peer 0's", r, differ);
    }
    fprintf(stderr, "  epochs %lld %lld %lld %lld, the 4th joined at %lld\n",
            (long long)sh->epochs[0], (long long)sh->epochs[1], (long long)sh->epochs[2],
            (long long)sh->epochs[3], (long long)sh->joined_at[3]);
    munmap(sh, sizeof *sh);
}

TEST(hivemind_refusals) {
    fg_module *m = make_model();
    fg_optimizer *o = fg_sgd_new(m, &(fg_sgd_opts){.lr = 0.05});
    fg_ddp_opts d = opts(NULL);
    d.hivemind.delay_optimizer_step = true;
    CHECK(fg_strategy_new(FG_STRATEGY_HIVEMIND, NULL, m, o, &d, NULL, 0) == NULL);
    CHECK_CONTAINS(fg_last_error(), "delay_optimizer_step needs offload_optimizer");
    d = opts(NULL);
    d.hivemind.target_batch_size = 0;
    CHECK(fg_strategy_new(FG_STRATEGY_HIVEMIND, NULL, m, o, &d, NULL, 0) == NULL);
    CHECK_CONTAINS(fg_last_error(), "target_batch_size");
    fg_strategy_kind k;
    CHECK_OK(fg_strategy_kind_parse("Hivemind", &k, NULL, NULL));
    CHECK(k == FG_STRATEGY_HIVEMIND);
    fg_optimizer_free(o);
    fg_module_free(m);
}
