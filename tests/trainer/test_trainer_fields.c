/* The Trainer over batches of named fields (fg_fields_loader_loader: a
 * dict of tensors per sample, collated): the (x, y) dataset as two fields
 * trains to the plain loader's bits, shuffled, with validation; a dataset
 * with a variable-length field reaches training_step padded to the batch's
 * longest with its mask, beside x and y; and a collate failure stops fit
 * naming the batch. */
#include <math.h>

#include "trainer_test_util.h"

typedef struct run_out {
    float params[256];
    int64_t n, step, seen_fields;
    double val_loss;
    fg_status status;
    char msg[512];
} run_out;

static int64_t g_seen, g_bad_masks;

/* tu's training step, after checking what the batch's fields hold */
static fg_tensor *fields_step(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    if (b->fields) {
        g_seen++;
        fg_tensor *tok = fg_fields_batch_get(b->fields, "tokens");
        fg_tensor *mask = fg_fields_batch_get(b->fields, "tokens_mask");
        if (tok || mask) {
            /* sample j has j % 3 + 1 tokens of value j + 1: the batch's longest */
            int64_t longest = 0;
            for (int64_t j = 0; j < b->size; j++)
                longest = b->indices[j] % 3 + 1 > longest ? b->indices[j] % 3 + 1 : longest;
            bool ok = tok && mask && fg_tensor_dim(tok, 0) == b->size &&
                      fg_tensor_dim(tok, 1) == longest && fg_tensor_dim(mask, 1) == longest;
            for (int64_t j = 0; ok && j < b->size; j++)
                for (int64_t k = 0; k < longest; k++) {
                    bool in = k < b->indices[j] % 3 + 1;
                    ok = ok && ((const uint8_t *)fg_tensor_data(mask))[j * longest + k] == in &&
                         ((const int32_t *)fg_tensor_data(tok))[j * longest + k] ==
                             (in ? (int32_t)b->indices[j] + 1 : 0);
                }
            g_bad_masks += !ok;
        }
    }
    return tu_training_step(ud, t, b, i);
}

/* tu's samples as fields x, y and (with tokens) a variable-length tokens */
typedef struct three {
    tu_data d;
    bool fail_at_5;
} three;

static int64_t three_len(void *ud) { return ((three *)ud)->d.n; }
static fg_status three_get(void *ud, int64_t i, fg_sample_field *f) {
    three *s = ud;
    fg_status st = tu_get(&s->d, i, f[0].data, f[1].data);
    if (st != FG_OK) return st;
    f[2].len = s->fail_at_5 && i == 5 ? 0 : i % 3 + 1;
    for (int64_t k = 0; k < f[2].len; k++) ((int32_t *)f[2].data)[k] = (int32_t)i + 1;
    return FG_OK;
}

/* a collate that fails on a sample with no tokens */
static fg_status picky_collate(void *ud, const fg_fields_dataset *fd, const fg_sample_field *s,
                               int64_t n, fg_collate_out *out) {
    for (int64_t j = 0; j < n; j++)
        if (s[j * 3 + 2].len == 0) return fg_error(FG_EINVAL, "a sample without tokens");
    return fg_collate_default(ud, fd, s, n, out);
}

static void fit(int mode, bool shuffle, run_out *o) {
    /* mode 0: the plain loader; 1: its fields; 2: three fields; 3: the picky collate */
    tu_clean_env();
    fg_dataset *tr = tu_dataset(32, 11), *va = tu_dataset(12, 12);
    fg_fields_dataset *ftr = NULL, *fva = NULL;
    fg_fields_loader *ftl = NULL, *fvl = NULL;
    fg_dataloader *tl = NULL, *vl = NULL, *own_tl = NULL, *own_vl = NULL;
    fg_loader_opts lo = {.batch = 4, .shuffle = shuffle, .seed = 7};
    if (mode == 0) {
        tl = own_tl = tu_loader(tr, 4, shuffle);
        vl = own_vl = tu_loader(va, 4, false);
    } else {
        if (mode == 1) {
            ftr = fg_fields_dataset_from(tr);
        } else {
            three *s = malloc(sizeof *s);
            *s = (three){.d = {.n = 32, .seed = 11}, .fail_at_5 = mode == 3};
            fg_field_spec f[3] = {{.name = "x", .dtype = FG_F32, .ndim = 1, .shape = {TU_DIM}},
                                  {.name = "y", .dtype = FG_I32},
                                  {.name = "tokens",
                                   .dtype = FG_I32,
                                   .ndim = 1,
                                   .shape = {FG_FIELD_VAR},
                                   .max_len = 3}};
            ftr = fg_fields_dataset_new(&(fg_fields_ops){three_len, three_get, tu_free_data}, s, f,
                                        3, "three");
        }
        fva = fg_fields_dataset_from(va);
        ftl = fg_fields_loader_new(
            ftr,
            &(fg_fields_loader_opts){.loader = lo, .collate = mode == 3 ? picky_collate : NULL});
        fvl = fg_fields_loader_new(fva, &(fg_fields_loader_opts){.loader = {.batch = 4}});
        tl = fg_fields_loader_loader(ftl);
        vl = fg_fields_loader_loader(fvl);
    }
    CHECK(tl && vl);
    tu_module m = {.log_val = true};
    tu_module_init(&m);
    fg_lightning_module lm = tu_lm(&m);
    lm.training_step = fields_step;
    g_seen = g_bad_masks = 0;
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 2,
                                                      .seed = 42,
                                                      .devices = "1",
                                                      .enable_progress_bar = FG_OFF,
                                                      .enable_checkpointing = FG_OFF,
                                                      .num_sanity_val_steps = FG_COUNT(0),
                                                      .logger = FG_OFF});
    CHECK(t != NULL);
    o->status = t ? fg_trainer_fit(t, &lm, tl, vl, NULL) : fg_last_status();
    snprintf(o->msg, sizeof o->msg, "%s", o->status ? fg_last_error() : "");
    fg_tensor *flat = fg_module_flat_params(m.net);
    o->n = fg_tensor_numel(flat);
    memcpy(o->params, fg_tensor_data(flat), sizeof(float) * (size_t)o->n);
    o->step = t ? fg_trainer_global_step(t) : -1;
    o->seen_fields = g_seen;
    if (!t || !fg_trainer_callback_metric(t, "val_loss", &o->val_loss)) o->val_loss = NAN;
    fg_trainer_free(t);
    fg_dataloader_free(own_tl);
    fg_dataloader_free(own_vl);
    fg_fields_loader_free(ftl);
    fg_fields_loader_free(fvl);
    fg_fields_dataset_free(ftr);
    fg_fields_dataset_free(fva);
    fg_dataset_free(tr);
    fg_dataset_free(va);
    fg_module_free(m.net);
}

TEST(two_fields_train_as_the_plain_loader) {
    run_out a, b;
    fit(0, true, &a);
    fit(1, true, &b);
    CHECK_MSG(a.status == FG_OK && b.status == FG_OK, "%s %s", a.msg, b.msg);
    CHECK(a.step == 16 && b.step == 16);
    CHECK(a.seen_fields == 0 && b.seen_fields == 16);
    CHECK(a.n == b.n && !memcmp(a.params, b.params, sizeof(float) * (size_t)a.n));
    CHECK_MSG(!memcmp(&a.val_loss, &b.val_loss, sizeof(double)) && isfinite(a.val_loss),
              "val_loss %.17g and %.17g", a.val_loss, b.val_loss);
}

TEST(a_padded_field_reaches_training_step) {
    run_out a, b;
    fit(0, false, &a);
    fit(2, false, &b);
    CHECK_MSG(b.status == FG_OK, "%s", b.msg);
    CHECK(b.seen_fields == 16);
    CHECK_MSG(g_bad_masks == 0, "%lld batches with a wrong tokens or tokens_mask",
              (long long)g_bad_masks);
    /* x and y are the first two fields: the plain run's bits */
    CHECK(!memcmp(a.params, b.params, sizeof(float) * (size_t)a.n));
}

TEST(a_collate_failure_stops_fit) {
    run_out o;
    fit(3, false, &o);
    CHECK_STATUS(o.status, FG_EINVAL);
    CHECK_CONTAINS(o.msg, "collate of batch 1 of epoch 0");
    CHECK_CONTAINS(o.msg, "a sample without tokens");
    CHECK(o.step == 1);
}
