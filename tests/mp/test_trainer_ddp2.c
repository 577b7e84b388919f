/* The Trainer under ddp2 on 2 processes ("nodes", started by mpirun on this
 * machine), each with 2 dp replicas on threads: a value the training step
 * logs with sync_dist and on_step is combined over the replicas (weighted
 * by their parts' sizes) and then averaged over the processes, once per
 * batch from the training thread, as the strategy's row says (replicas on
 * threads). It was one replica's value, and the replicas' threads each
 * reduced it over the processes at once, on the one communicator.
 * Skipped without mpirun or Open MPI in the build. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"
#include "trainer/trainer_test_util.h"

typedef struct dmod {
    fg_module *net;
    int rank;
} dmod;

static fg_status d_opt(void *ud, fg_trainer *t, fg_optimizer_config *out) {
    (void)t;
    out->optimizer = fg_sgd_new(((dmod *)ud)->net, &(fg_sgd_opts){.lr = 0.1});
    return out->optimizer ? FG_OK : fg_last_status();
}

/* each replica logs rank * 100 + its part's size: per process the parts'
 * weighted mean is rank * 100 + (3 * 3 + 2 * 2) / 5, over 2 processes 52.6 */
static fg_tensor *d_train(void *ud, fg_trainer *t, fg_batch *part, int64_t i) {
    (void)i;
    dmod *m = ud;
    fg_status s = fg_trainer_log(t, "v", (double)(m->rank * 100) + (double)part->size,
                                 &(fg_log_opts){.sync_dist = true, .on_step = FG_ON});
    if (s != FG_OK) return NULL;
    return fg_cross_entropy(fg_module_forward(m->net, part->x), part->y, -100);
}

/* One process of the job (run by mpirun from the test below). */
TEST(ddp2_child) {
    if (!getenv("FG_TEST_DDP2_CHILD")) return; /* only under the test below */
    int rank = atoi(getenv("OMPI_COMM_WORLD_RANK") ? getenv("OMPI_COMM_WORLD_RANK") : "0");
    fg_dataset *tr = tu_dataset(20, 31);
    fg_dataloader *tl = tu_loader(tr, 5, false); /* 2 batches of 5 per process: parts 3, 2 */
    dmod m = {.net = fg_mlp_new(&(fg_mlp_config){.sizes = {TU_DIM, 3}, .seed = 1}), .rank = rank};
    fg_lightning_module lm = {
        .ud = &m, .model = m.net, .configure_optimizers = d_opt, .training_step = d_train};
    fg_fabric *f =
        fg_fabric_new(&(fg_fabric_config){.strategy = "ddp2", .devices = "2", .num_nodes = 2});
    CHECK_MSG(f != NULL, "rank %d: %s", rank, fg_last_error());
    fg_trainer *t = f ? fg_trainer_new(&(fg_trainer_opts){.fabric = f,
                                                          .max_epochs = 1,
                                                          .enable_progress_bar = FG_OFF,
                                                          .enable_checkpointing = FG_OFF,
                                                          .logger = FG_OFF})
                      : NULL;
    CHECK_MSG(!f || t, "rank %d: %s", rank, fg_last_error());
    if (t) {
        CHECK_MSG(fg_trainer_fit(t, &lm, tl, NULL, NULL) == FG_OK, "rank %d: %s", rank,
                  fg_last_error());
        double v = NAN;
        CHECK(fg_trainer_callback_metric(t, "v", &v));
        CHECK_MSG(fabs(v - 52.6) < 1e-12, "rank %d: v %.17g, want 52.6", rank, v);
    }
    fg_trainer_free(t);
    fg_fabric_free(f);
    fg_module_free(m.net);
    fg_dataloader_free(tl);
    fg_dataset_free(tr);
}

TEST(ddp2_sync_dist_step_value_is_every_replica_of_every_process) {
    if (getenv("FG_TEST_DDP2_CHILD")) return;
    if (!fg_comm_backend_built(FG_COMM_MPI)) SKIP("built without Open MPI");
    if (system("command -v mpirun >/dev/null 2>&1") != 0) SKIP("no mpirun");
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(n > 0);
    if (n <= 0) return;
    self[n] = '\0';
    tu_clean_env();
    char cmd[PATH_MAX + 256];
    snprintf(cmd, sizeof cmd,
             "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 mpirun "
             "--oversubscribe -np 2 -x FG_TEST_DDP2_CHILD=1 -x FULGUR_NUM_THREADS=1 '%s' "
             "ddp2_child",
             self);
    int rc = system(cmd);
    CHECK_MSG(rc == 0, "mpirun -np 2 (ddp2 on 2 processes): status %d", rc);
}
