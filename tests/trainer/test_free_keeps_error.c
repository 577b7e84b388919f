/* core.h's rule "a _free never changes the calling thread's error": with an
 * error set, every public _free (and _close) runs on a live object and on
 * NULL, and the message and status are still the ones set. The user's own
 * free hooks (dataset, sampler, callback, logger) set an error of their
 * own, as a hook that fails to close a file would. Also fg_error_keep /
 * fg_error_restore and the Trainer's constructor keeping its first error.
 * (fg_tmetric_free, in the metrics layer this test does not link, releases
 * memory only.) */
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "trainer/trainer_test_util.h"

#define FIRST "the first error: devices=7"

static void set_first(void) { fg_error(FG_EMISMATCH, "%s", FIRST); }

static int unchanged(void) {
    return fg_last_status() == FG_EMISMATCH && strcmp(fg_last_error(), FIRST) == 0;
}

/* frees x with an error set, then NULL, and checks the error each time */
#define FREE_KEEPS(free_fn, x)                                                                     \
    do {                                                                                           \
        set_first();                                                                               \
        free_fn(x);                                                                                \
        CHECK_MSG(unchanged(), #free_fn " on an object: %s (%d)", fg_last_error(),                 \
                  (int)fg_last_status());                                                          \
        set_first();                                                                               \
        free_fn(NULL);                                                                             \
        CHECK_MSG(unchanged(), #free_fn "(NULL): %s", fg_last_error());                            \
    } while (0)

/* user hooks that fail while releasing */
static void noisy_free(void *ud) {
    (void)ud;
    fg_error(FG_EIO, "close: disk gone");
}
static int64_t s_len(void *ud) {
    (void)ud;
    return 4;
}
static fg_status s_indices(void *ud, int64_t epoch, int64_t *out) {
    (void)ud;
    (void)epoch;
    for (int i = 0; i < 4; i++) out[i] = i;
    return FG_OK;
}

static fg_status lg_metrics(void *ud, const fg_metric *m, int64_t n, int64_t step) {
    (void)ud;
    (void)m;
    (void)n;
    (void)step;
    return FG_OK;
}

TEST(keep_and_restore_return_the_first_error) {
    set_first();
    fg_error_kept k;
    fg_error_keep(&k);
    fg_error(FG_EIO, "cleanup failed too");
    CHECK(fg_error_restore(&k) == FG_EMISMATCH);
    CHECK(unchanged());
    fg_clear_error();
    fg_error_keep(&k);
    fg_error(FG_EIO, "cleanup failed");
    CHECK(fg_error_restore(&k) == FG_OK);
    CHECK(fg_last_status() == FG_OK && fg_last_error()[0] == '\0');
}

TEST(every_public_free_keeps_the_callers_error) {
    tu_clean_env();
    FREE_KEEPS(fg_arena_free, fg_arena_new(0));
    FREE_KEEPS(fg_tensor_free, fg_tensor_new(FG_F32, 1, (int64_t[]){3}));
    FREE_KEEPS(fg_text_vocab_free, fg_text_vocab_from_text("abc", 3));
    FREE_KEEPS(fg_scaler_free, fg_scaler_new(NULL));

    fg_dev *d = fg_dev_open("cpu", NULL);
    CHECK(d != NULL);
    if (d) {
        FREE_KEEPS(fg_event_free, fg_event_new(d));
        set_first();
        fg_dev_host_free(d, fg_dev_host_alloc(d, 64));
        CHECK(unchanged());
        set_first();
        fg_dev_host_free(d, NULL);
        CHECK(unchanged());
        /* a block still allocated: the close reports it (a log line) */
        (void)fg_dev_alloc(d, 128, NULL);
        FREE_KEEPS(fg_dev_close, d);
    }

    fg_dataset *ds =
        fg_dataset_new(&(fg_dataset_ops){s_len, tu_spec, tu_get, noisy_free}, NULL, "noisy");
    FREE_KEEPS(fg_dataset_free, ds);
    FREE_KEEPS(fg_sampler_free,
               fg_sampler_new(&(fg_sampler_ops){s_len, s_indices, noisy_free}, NULL));
    FREE_KEEPS(fg_sampler_free, fg_sampler_sequential(4));
    fg_dataset *tr = tu_dataset(8, 31);
    fg_dataloader *dl = tu_loader(tr, 4, true);
    CHECK(dl && fg_dataloader_next(dl) != NULL); /* workers started */
    FREE_KEEPS(fg_dataloader_free, dl);

    fg_module *net = fg_mlp_new(&(fg_mlp_config){.sizes = {TU_DIM, 3}, .seed = 1});
    fg_optimizer *opt = fg_sgd_new(net, &(fg_sgd_opts){.lr = 0.1});
    FREE_KEEPS(fg_lr_scheduler_free, fg_step_lr_new(opt, 1, 0.5));
    FREE_KEEPS(fg_strategy_free,
               fg_strategy_new(FG_STRATEGY_SINGLE, NULL, net, opt, NULL, NULL, 0));
    FREE_KEEPS(fg_optimizer_free, opt);
    FREE_KEEPS(fg_module_free, net);

    fg_st_writer *w = fg_st_writer_new();
    FREE_KEEPS(fg_st_writer_free, w);
    char path[600];
    snprintf(path, sizeof path, "%s/one.safetensors", tu_tmp());
    float xs[2] = {1, 2};
    w = fg_st_writer_new();
    CHECK_OK(fg_st_writer_add(w, "x", FG_F32, 1, (int64_t[]){2}, xs));
    CHECK_OK(fg_st_writer_write(w, path));
    fg_st_writer_free(w);
    FREE_KEEPS(fg_st_close, fg_st_open(path));

    fg_cluster_info one = {.rank = 0, .world_size = 1, .local_world_size = 1, .num_nodes = 1};
    fg_comm *comm = fg_comm_new(&one, NULL);
    CHECK_MSG(comm != NULL, "%s", fg_last_error());
    FREE_KEEPS(fg_comm_free, comm);

    const char *argv[] = {"true", NULL};
    fg_job *job =
        fg_job_start(&(fg_job_spec){.argv = argv, .nprocs = 1, .first_local_rank = 1}, NULL);
    CHECK_MSG(job != NULL, "%s", fg_last_error());
    FREE_KEEPS(fg_job_free, job);

    FREE_KEEPS(fg_fabric_free, fg_fabric_new(&(fg_fabric_config){.strategy = "single"}));
    FREE_KEEPS(fg_callback_free, fg_callback_new(&(fg_callback_ops){.free = noisy_free}, NULL));
    FREE_KEEPS(
        fg_logger_free,
        fg_logger_new(&(fg_logger_ops){.log_metrics = lg_metrics, .free = noisy_free}, NULL));
    FREE_KEEPS(fg_logger_free, fg_csv_logger_new(&(fg_csv_logger_opts){.save_dir = tu_tmp()}));

    /* a trainer after a fit: its own callbacks, logger and fabric */
    tu_module m = {.lr = 0.1, .log_train = true};
    tu_module_init(&m);
    fg_lightning_module lm = tu_lm(&m);
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){
        .max_epochs = 1, .enable_progress_bar = FG_OFF, .default_root_dir = tu_tmp()});
    fg_dataloader *tl = tu_loader(tr, 4, false);
    CHECK(t && fg_trainer_fit(t, &lm, tl, NULL, NULL) == FG_OK);
    FREE_KEEPS(fg_trainer_free, t);
    fg_dataloader_free(tl);
    fg_module_free(m.net);
    fg_dataset_free(tr);
}

/* A constructor that fails after it made parts returns the first error,
 * not what freeing the parts left (fg_error_keep around fg_trainer_free). */
TEST(trainer_new_keeps_its_first_error) {
    tu_clean_env();
    fg_trainer *t = fg_trainer_new(
        &(fg_trainer_opts){.max_epochs = 1, .enable_progress_bar = FG_OFF, .devices = "banana"});
    CHECK(t == NULL);
    CHECK(fg_last_status() == FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "banana");
}
