/* A peer that fails while the monitoring callbacks agree over the ranks:
 * the reduce EarlyStopping or ModelCheckpoint makes fails, and fit on the
 * surviving rank returns that failure, with the comm layer's message
 * naming the peer and the callback's context. It used to read the failed
 * reduce as a value (NaN): "don't stop" (fit went on and returned FG_OK) or
 * "another rank failed before the save". Also fg_fabric_reduce_scalar's
 * status form on one rank and on two. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "trainer/trainer_test_util.h"

/* ------------------------------------------------------- reduce_scalar */

TEST(reduce_scalar_one_rank_is_the_value_and_checks_out) {
    tu_clean_env();
    fg_fabric *f = fg_fabric_new(&(fg_fabric_config){.strategy = "single"});
    CHECK(f != NULL);
    if (!f) return;
    double v = -1;
    CHECK_OK(fg_fabric_reduce_scalar(f, 2.5, FG_REDUCE_OP_SUM, &v));
    CHECK(v == 2.5);
    CHECK(fg_fabric_reduce_scalar(f, 1, FG_REDUCE_OP_MAX, NULL) == FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "out is NULL");
    fg_fabric_free(f);
}

/* In a launched fabric of 2: rank 1 leaves after two reduces; rank 0's
 * third reduce fails with the comm layer's message and leaves *out alone. */
static int reduce_run(fg_fabric *f, void *arg) {
    int *checked = arg;
    int rank = fg_fabric_global_rank(f);
    double v = 0;
    CHECK_OK(fg_fabric_reduce_scalar(f, rank + 1, FG_REDUCE_OP_SUM, &v));
    CHECK(v == 3);
    CHECK_OK(fg_fabric_reduce_scalar(f, rank + 1, FG_REDUCE_OP_MAX, &v));
    CHECK(v == 2);
    if (rank == 1) _exit(fg_cur_failed_ ? 1 : 0); /* gone: rank 0's next reduce fails */
    v = 42;
    fg_status s = fg_fabric_reduce_scalar(f, 1, FG_REDUCE_OP_MIN, &v);
    CHECK(s != FG_OK);
    CHECK_MSG(strstr(fg_last_error(), "rank 1") != NULL, "message: %s", fg_last_error());
    CHECK(v == 42); /* left alone: no NaN */
    *checked = 1;
    return 0;
}

static int reduce_rank(int rank, int world, void *arg) {
    (void)arg;
    tu_fake_launcher(rank, world, 40);
    fg_fabric *f = fg_fabric_new(NULL);
    if (!f) {
        fprintf(stderr, "rank %d: %s\n", rank, fg_last_error());
        return 1;
    }
    int checked = 0;
    (void)fg_fabric_launch(f, reduce_run, &checked); /* fails on rank 0: its peer left */
    CHECK(checked == 1);
    fg_fabric_free(f);
    return 0;
}

TEST(reduce_scalar_two_ranks_a_dead_peer_is_a_status) {
    CHECK(fg_test_fork_ranks(2, reduce_rank, NULL, 120) == 0);
}

/* ------------------------------------------------ in the callbacks */

typedef struct pcase {
    int job;
    bool checkpoint; /* ModelCheckpoint on both ranks, else EarlyStopping */
} pcase;

/* Both ranks train one epoch and log "loss". Rank 1's first monitoring
 * callback is an EarlyStopping on a metric nobody logs: its check fails
 * there, before any reduce, rank 1 leaves fit with that error and goes
 * away, while rank 0 is in its callback's reduce. */
static int peer_rank(int rank, int world, void *arg) {
    const pcase *c = arg;
    tu_fake_launcher(rank, world, c->job);
    fg_dataset *tr = tu_dataset(16, 31);
    fg_dataloader *tl = tu_loader(tr, 4, false);
    tu_module m = {.lr = 0.1, .log_train = true};
    tu_module_init(&m);
    fg_lightning_module lm = tu_lm(&m);
    fg_callback *cbs[2];
    int n = 0;
    if (rank == 1) cbs[n++] = fg_early_stopping_new(&(fg_early_stopping_opts){.monitor = "nope"});
    if (c->checkpoint)
        cbs[n++] = fg_model_checkpoint_new(
            &(fg_checkpoint_opts){.dirpath = tu_subdir("ck"), .monitor = "loss", .save_top_k = 1});
    else cbs[n++] = fg_early_stopping_new(&(fg_early_stopping_opts){.monitor = "loss"});
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 1,
                                                      .num_sanity_val_steps = FG_COUNT(0),
                                                      .enable_progress_bar = FG_OFF,
                                                      .logger = FG_OFF,
                                                      .callbacks = cbs,
                                                      .ncallbacks = n});
    if (!t) {
        fprintf(stderr, "rank %d: %s\n", rank, fg_last_error());
        return 1;
    }
    fg_status s = fg_trainer_fit(t, &lm, tl, NULL, NULL);
    if (rank == 1) {
        CHECK(s == FG_EINVAL);
        CHECK_CONTAINS(fg_last_error(), "\"nope\"");
    } else {
        CHECK_MSG(s != FG_OK, "rank 0: fit returned FG_OK after its peer failed");
        const char *msg = fg_last_error();
        CHECK_MSG(strstr(msg, "rank 1") != NULL, "message: %s", msg);
        CHECK_MSG(strstr(msg, c->checkpoint ? "save_checkpoint" : "EarlyStopping") != NULL,
                  "message: %s", msg);
        /* the reduce failed: not read as "another rank failed" */
        CHECK_MSG(strstr(msg, "another rank failed") == NULL, "message: %s", msg);
    }
    fg_trainer_free(t);
    for (int i = 0; i < n; i++) fg_callback_free(cbs[i]);
    fg_module_free(m.net);
    fg_dataloader_free(tl);
    fg_dataset_free(tr);
    return 0;
}

TEST(early_stopping_reduce_failure_stops_fit_with_the_peer) {
    pcase c = {.job = 41, .checkpoint = false};
    CHECK(fg_test_fork_ranks(2, peer_rank, &c, 120) == 0);
}

TEST(checkpoint_save_reduce_failure_stops_fit_with_the_peer) {
    tu_tmp();
    pcase c = {.job = 42, .checkpoint = true};
    CHECK(fg_test_fork_ranks(2, peer_rank, &c, 120) == 0);
}
