/* The Trainer's `deterministic` (Lightning's name): for one global batch of
 * 24 samples (micro-batches of 4), one process accumulating 6, ddp_fork on
 * 2 ranks accumulating 3 and on 3 ranks accumulating 2 end with bitwise the
 * same weights; without it 2 ranks differ from 1 (so the equality is the
 * mode's doing). */
#include "trainer_test_util.h"

/* The weights after 2 epochs of 48 samples on `devices` ranks. */
static float *train(const char *devices, int64_t accumulate, bool deterministic, size_t *bytes) {
    tu_clean_env();
    fg_dataset *tr = tu_dataset(48, 11), *va = tu_dataset(12, 12);
    fg_dataloader *tl = tu_loader(tr, 4, true), *vl = tu_loader(va, 4, false);
    tu_module m = {0};
    tu_module_init(&m);
    fg_lightning_module lm = tu_lm(&m);
    bool one = !strcmp(devices, "1");
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 2,
                                                      .devices = devices,
                                                      .strategy = one ? "auto" : "ddp_fork",
                                                      .accumulate_grad_batches = accumulate,
                                                      .deterministic = deterministic,
                                                      .logger = FG_OFF,
                                                      .enable_checkpointing = FG_OFF,
                                                      .enable_progress_bar = FG_OFF});
    CHECK_MSG(t != NULL, "%s", fg_last_error());
    float *out = NULL;
    if (t) {
        fg_status s = fg_trainer_fit(t, &lm, tl, vl, NULL);
        CHECK_MSG(s == FG_OK, "%s on %s: %s", deterministic ? "deterministic" : "plain", devices,
                  fg_last_error());
        fg_tensor *p = fg_module_flat_params(m.net);
        *bytes = fg_tensor_nbytes(p);
        out = malloc(*bytes);
        memcpy(out, fg_tensor_data(p), *bytes);
    }
    fg_trainer_free(t);
    fg_module_free(m.net);
    fg_dataloader_free(tl);
    fg_dataloader_free(vl);
    fg_dataset_free(tr);
    fg_dataset_free(va);
    return out;
}

TEST(deterministic_trainer_on_1_2_3_ranks_bitwise) {
    size_t n1 = 0, n2 = 0, n3 = 0, np = 0;
    float *w1 = train("1", 6, true, &n1);
    float *w2 = train("2", 3, true, &n2);
    float *w3 = train("3", 2, true, &n3);
    float *plain = train("2", 3, false, &np);
    if (w1 && w2 && w3 && plain) {
        CHECK(n1 == n2 && n1 == n3 && n1 == np);
        CHECK_MSG(!memcmp(w1, w2, n1), "2 ranks differ from 1 under deterministic");
        CHECK_MSG(!memcmp(w1, w3, n1), "3 ranks differ from 1 under deterministic");
        CHECK_MSG(memcmp(w1, plain, n1) != 0, "plain ddp on 2 ranks is bitwise 1 rank's");
    }
    free(w1);
    free(w2);
    free(w3);
    free(plain);
}
