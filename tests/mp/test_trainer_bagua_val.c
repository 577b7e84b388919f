/* Validation under strategy bagua, on forked ranks (shm) under a faked
 * launcher: the algorithms that leave the ranks with different weights
 * (decentralized, low_precision_decentralized; flat on 2 ranks and
 * hierarchical on 4 as 2 nodes of 2) validate as Lightning with Bagua does:
 * every rank runs its own current weights on its own shard of the
 * validation set (the distributed sampler's), and the logged val_loss
 * (sync_dist, weighted by the batch's samples) is the sample-weighted mean
 * of those per-rank losses over all shards. The test recomputes that figure
 * outside the trainer (each rank's own weights over the loader it was
 * given), checks that the ranks' weights do differ, and that the figure is
 * not the one rank 0's weights give on every shard (the weights a
 * checkpoint holds), in the launch that trained and in a launch of its own
 * (where the strategy is set up again, without an optimizer, and must keep
 * each rank's weights). gradient_allreduce, whose ranks stay equal, is the
 * control: there both figures are the same. low_precision_decentralized set
 * up for a validation refuses to train in the same launch. */
#include <math.h>
#include <stdio.h>

#include "harness.h"
#include "mp_join.h"
#include "strategy/bagua_impl.h"
#include "trainer/trainer_test_util.h"

typedef struct vcfg {
    fg_bagua_algorithm algo;
    int world, node_size, job;
    bool differ;       /* the ranks' weights end different */
    bool two_launches; /* fit in one launch, validate in another */
} vcfg;

typedef struct vmod {
    fg_module *net;
    const struct vcfg *c;
    fg_dataloader *tl, *vl;
    int launch; /* 0: the first */
} vmod;

static fg_tensor *v_loss(fg_module *net, fg_batch *b) {
    fg_tensor *x = b->x, *y = b->y;
    if (b->valid < b->size) {
        x = fg_tensor_narrow_view(x, 0, 0, b->valid);
        y = fg_tensor_narrow_view(y, 0, 0, b->valid);
    }
    return fg_cross_entropy(fg_module_forward(net, x), y, -100);
}

static fg_status v_opt(void *ud, fg_trainer *t, fg_optimizer_config *out) {
    (void)t;
    out->optimizer = fg_sgd_new(((vmod *)ud)->net, &(fg_sgd_opts){.lr = 0.5});
    return out->optimizer ? FG_OK : fg_last_status();
}

static fg_tensor *v_train(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)t;
    (void)i;
    return v_loss(((vmod *)ud)->net, b);
}

static fg_status v_val(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)i;
    if (b->valid == 0) return FG_OK;
    fg_tensor *loss = v_loss(((vmod *)ud)->net, b);
    if (!loss) return fg_last_status();
    return fg_trainer_log(t, "val_loss", fg_item(loss),
                          &(fg_log_opts){.sync_dist = true, .batch_size = b->valid});
}

/* The sample-weighted mean over every rank's shard of net's loss: each rank
 * runs net over its loader dl (the shard the trainer gave it). Collective. */
static double shard_mean(fg_fabric *f, fg_module *net, fg_dataloader *dl) {
    double sum = 0, count = 0;
    bool grad = fg_set_grad_enabled(false);
    CHECK_OK(fg_dataloader_set_epoch(dl, 0));
    for (fg_batch *b; (b = fg_dataloader_next(dl));) {
        if (b->valid > 0) {
            sum += fg_item(v_loss(net, b)) * (double)b->valid;
            count += (double)b->valid;
        }
        fg_step_reset();
    }
    fg_set_grad_enabled(grad);
    CHECK_OK(fg_fabric_reduce_scalar(f, sum, FG_REDUCE_OP_SUM, &sum));
    CHECK_OK(fg_fabric_reduce_scalar(f, count, FG_REDUCE_OP_SUM, &count));
    return sum / count;
}

static fg_module *v_net(void) {
    return fg_mlp_new(&(fg_mlp_config){.sizes = {TU_DIM, 16, TU_CLASSES}, .seed = 3});
}

static fg_lightning_module v_lm(vmod *m) {
    return (fg_lightning_module){.ud = m,
                                 .model = m->net,
                                 .configure_optimizers = v_opt,
                                 .training_step = v_train,
                                 .validation_step = v_val};
}

static fg_trainer *v_trainer(fg_fabric *f) {
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.fabric = f,
                                                      .max_steps = 6,
                                                      .num_sanity_val_steps = FG_COUNT(0),
                                                      .enable_progress_bar = FG_OFF,
                                                      .enable_checkpointing = FG_OFF,
                                                      .logger = FG_OFF});
    if (!t) fprintf(stderr, "rank %d: %s\n", fg_fabric_global_rank(f), fg_last_error());
    return t;
}

/* Inside a launch of the fabric (as `fulgur fit` runs the Trainer: fit and
 * validate in one), so that the checks below can reduce over the ranks.
 * With two launches the first only fits, and the second validates under a
 * strategy set up again without an optimizer. */
static int v_body(fg_fabric *f, void *arg) {
    vmod *m = arg;
    const vcfg *c = m->c;
    int rank = fg_fabric_global_rank(f), world = fg_fabric_world_size(f);
    CHECK(world == c->world);
    fg_lightning_module lm = v_lm(m);
    fg_trainer *t = v_trainer(f);
    if (!t) return 1;
    bool fit = m->launch == 0, validate = !c->two_launches || m->launch == 1;
    m->launch++;
    if (fit) {
        fg_status s = fg_trainer_fit(t, &lm, m->tl, NULL, NULL);
        CHECK_MSG(s == FG_OK, "rank %d: fit: %s", rank, fg_last_error());
    }
    if (!validate) {
        fg_trainer_free(t);
        return 0;
    }
    fg_status s = fg_trainer_validate(t, &lm, m->vl, NULL);
    CHECK_MSG(s == FG_OK, "rank %d: validate: %s", rank, fg_last_error());
    double v = NAN;
    CHECK(fg_trainer_callback_metric(t, "val_loss", &v));
    /* each rank's own weights on its own shard */
    double own = shard_mean(f, m->net, m->vl);
    CHECK_CLOSE(v, own, 1e-12, 0);
    /* rank 0's weights on every shard */
    fg_module *zero = v_net();
    fg_tensor *zp = fg_module_flat_params(zero);
    int64_t n = fg_tensor_numel(zp);
    const float *mine = fg_tensor_data(fg_module_flat_params(m->net));
    memcpy(fg_tensor_data(zp), mine, sizeof(float) * (size_t)n);
    CHECK_OK(fg_fabric_broadcast(f, zp, 0));
    double r0 = shard_mean(f, zero, m->vl);
    bool differs = mp_differs_from_rank0(fg_fabric_comm(f), rank, mine, n);
    double anyv = 0;
    CHECK_OK(fg_fabric_reduce_scalar(f, differs ? 1 : 0, FG_REDUCE_OP_MAX, &anyv));
    bool any = anyv > 0;
    const char *name = fg_bagua_algorithm_name(c->algo);
    if (c->differ) {
        CHECK_MSG(any, "%s on %d ranks: the ranks' weights are all rank 0's", name, world);
        CHECK_MSG(fabs(v - r0) > 1e-6, "%s: val_loss %.9g is rank 0's weights' %.9g", name, v, r0);
    } else {
        CHECK(!any);
        CHECK(v == r0);
    }
    if (rank == 0)
        printf("  %s, %d ranks%s: val_loss %.7f (own weights per shard), rank 0's weights "
               "%.7f\n",
               name, world, c->two_launches ? ", validated in another launch" : "", v, r0);
    fg_module_free(zero);
    fg_trainer_free(t);
    return 0;
}

static int v_rank(int rank, int world, void *arg) {
    const vcfg *c = arg;
    tu_fake_launcher(rank, world, c->job);
    fg__bagua_node_size = c->node_size;
    /* 22 validation samples: shards of 11 (2 ranks) or 6 with padding (4),
     * batches of 4 with a short last one, so that the weighting matters */
    fg_dataset *tr = tu_dataset(64, 41), *va = tu_dataset(22, 42);
    vmod m = {.net = v_net(), .c = c, .tl = tu_loader(tr, 4, true), .vl = tu_loader(va, 4, false)};
    fg_fabric *f = fg_fabric_new(
        &(fg_fabric_config){.strategy = "bagua", .ddp.bagua = {.algorithm = c->algo}});
    int rc = 1;
    if (!f) fprintf(stderr, "rank %d: %s\n", rank, fg_last_error());
    for (int l = 0; f && l < (c->two_launches ? 2 : 1); l++) {
        rc = fg_fabric_launch(f, v_body, &m);
        CHECK_MSG(rc == 0, "rank %d: launch %d: %s", rank, l, fg_last_error());
        if (rc) break;
    }
    fg_fabric_free(f);
    fg_module_free(m.net);
    fg_dataloader_free(m.tl);
    fg_dataloader_free(m.vl);
    fg_dataset_free(tr);
    fg_dataset_free(va);
    return rc;
}

/* Validate first, then fit, in one launch: the strategy set up for the
 * validation (no optimizer) stays, and low_precision_decentralized, which
 * acts at the optimizer's steps, refuses to train under it, on every rank
 * at the same backward, with a message saying what to do. */
static int v_eval_first(fg_fabric *f, void *arg) {
    vmod *m = arg;
    fg_lightning_module lm = v_lm(m);
    fg_trainer *t = v_trainer(f);
    if (!t) return 1;
    CHECK_OK(fg_trainer_validate(t, &lm, m->vl, NULL));
    fg_status s = fg_trainer_fit(t, &lm, m->tl, NULL, NULL);
    CHECK(s == FG_ESTATE);
    CHECK_MSG(strstr(fg_last_error(), "set up without an optimizer"), "%s", fg_last_error());
    fg_trainer_free(t);
    return 0;
}

static int v_eval_first_rank(int rank, int world, void *arg) {
    tu_fake_launcher(rank, world, 9);
    fg__bagua_node_size = 0;
    fg_dataset *tr = tu_dataset(64, 41), *va = tu_dataset(22, 42);
    vmod m = {.net = v_net(), .tl = tu_loader(tr, 4, true), .vl = tu_loader(va, 4, false)};
    fg_fabric *f = fg_fabric_new(&(fg_fabric_config){
        .strategy = "bagua", .ddp.bagua = {.algorithm = *(fg_bagua_algorithm *)arg}});
    int rc = f ? fg_fabric_launch(f, v_eval_first, &m) : 1;
    CHECK_MSG(rc == 0, "rank %d: %s", rank, fg_last_error());
    fg_fabric_free(f);
    fg_module_free(m.net);
    fg_dataloader_free(m.tl);
    fg_dataloader_free(m.vl);
    fg_dataset_free(tr);
    fg_dataset_free(va);
    return rc;
}

static void run(vcfg c) {
    CHECK_MSG(fg_test_fork_ranks(c.world, v_rank, &c, 120) == 0, "%s on %d ranks",
              fg_bagua_algorithm_name(c.algo), c.world);
}

TEST(gradient_allreduce_validates_the_common_weights) {
    run((vcfg){FG_BAGUA_GRADIENT_ALLREDUCE, 2, 0, 1, false, false});
    run((vcfg){FG_BAGUA_GRADIENT_ALLREDUCE, 2, 0, 8, false, true});
    tu_clean_env();
}

TEST(decentralized_validates_each_ranks_own_weights) {
    run((vcfg){FG_BAGUA_DECENTRALIZED, 2, 0, 2, true, false});
    run((vcfg){FG_BAGUA_DECENTRALIZED, 4, 2, 3, true, false}); /* hierarchical: 2 nodes of 2 */
    run((vcfg){FG_BAGUA_DECENTRALIZED, 2, 0, 6, true, true});
    tu_clean_env();
}

TEST(low_precision_decentralized_validates_each_ranks_own_weights) {
    run((vcfg){FG_BAGUA_LOW_PRECISION_DECENTRALIZED, 2, 0, 4, true, false});
    run((vcfg){FG_BAGUA_LOW_PRECISION_DECENTRALIZED, 4, 2, 5, true, false});
    run((vcfg){FG_BAGUA_LOW_PRECISION_DECENTRALIZED, 2, 0, 7, true, true});
    tu_clean_env();
}

TEST(validate_then_fit_in_one_launch_is_refused_where_the_optimizer_is_needed) {
    fg_bagua_algorithm a = FG_BAGUA_LOW_PRECISION_DECENTRALIZED;
    CHECK(fg_test_fork_ranks(2, v_eval_first_rank, &a, 120) == 0);
    tu_clean_env();
}
