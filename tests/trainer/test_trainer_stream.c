/* The Trainer over iterable data (fg_dataloader_from_stream: Lightning's
 * DataLoader over an IterableDataset): on one process a stream of the
 * samples trains and validates to the same bits as the map-style loader in
 * order; under ddp on 2 forked ranks the fabric splits the stream by rank
 * (rank r the samples k = r, r + 2, ...), which is one process on the
 * global batch within rounding; ranks whose shards make one batch more or
 * fewer all take the smallest count; a checkpoint in the middle of an epoch
 * resumes the stream exactly (the same bits as the uninterrupted run).
 * A stream with no length: the epoch ends where the stream does (the same
 * bits as the stream with a length, limit_train_batches as a count too,
 * an epoch-interval StepLR stepped at the stream's end; the bar's n/?);
 * under ddp with uneven shards every rank stops at the same step, where
 * the first rank's stream ends (one process on the global batch within
 * rounding); a resume inside such an epoch gives the uninterrupted run's
 * bits. A fraction of an unknown length, accumulation over it, a sampler
 * or deterministic on a stream are refused naming what to do. */
#include <math.h>
#include <sys/mman.h>

#include "trainer_test_util.h"

/* A stream over tu's samples 0..n-1 of stream `seed`, in order. */
typedef struct tu_stream {
    tu_data d;
    bool no_len;
    int64_t fail_at; /* next fails at this sample; -1 = never */
} tu_stream;

static void st_spec(void *ud, fg_sample_spec *x, fg_sample_spec *y) { tu_spec(ud, x, y); }
static int64_t st_len(void *ud) {
    tu_stream *s = ud;
    return s->no_len ? -1 : s->d.n;
}
static fg_status st_open(void *ud, int64_t epoch, void **it) {
    (void)ud, (void)epoch;
    int64_t *k = malloc(sizeof *k);
    if (!k) return fg_error(FG_ENOMEM, "stream iterator");
    *k = 0;
    *it = k;
    return FG_OK;
}
static fg_status st_next(void *ud, void *it, void *x, void *y, bool *end) {
    tu_stream *s = ud;
    int64_t *k = it;
    if (*k >= s->d.n) {
        *end = true;
        return FG_OK;
    }
    if (*k == s->fail_at)
        return fg_error(FG_EIO, "tu-stream: sample %lld unreadable", (long long)*k);
    return tu_get(&s->d, (*k)++, x, y);
}
static void st_close(void *ud, void *it) {
    (void)ud;
    free(it);
}

static fg_stream *tu_stream_new(int64_t n, uint64_t seed, bool no_len, int64_t fail_at) {
    tu_stream *s = malloc(sizeof *s);
    *s = (tu_stream){.d = {.n = n, .seed = seed}, .no_len = no_len, .fail_at = fail_at};
    return fg_stream_new(&(fg_stream_ops){.spec = st_spec,
                                          .len = st_len,
                                          .open = st_open,
                                          .next = st_next,
                                          .close = st_close,
                                          .free = tu_free_data},
                         s, "tu-stream");
}

/* tu's optimizer with a StepLR(step_size=1, gamma=0.5) stepped every epoch */
static fg_status step_lr_configure(void *ud, fg_trainer *t, fg_optimizer_config *out) {
    fg_status st = tu_configure_optimizers(ud, t, out);
    if (st != FG_OK) return st;
    out->scheduler = fg_step_lr_new(out->optimizer, 1, 0.5);
    out->interval = FG_INTERVAL_EPOCH;
    out->frequency = 1;
    return out->scheduler ? FG_OK : fg_last_status();
}

typedef struct out {
    float params[256];
    int64_t n, step, batches, train_steps;
    double val_loss;
    fg_status status;
    char msg[512];
} out;

typedef struct cfg {
    bool stream;
    int64_t n, batch, max_epochs, max_steps;
    const char *strategy; /* NULL: one process */
    bool deterministic, no_len;
    bool val_no_len;             /* the validation stream has no length either */
    fg_batches limit, val_check; /* limit_train_batches, val_check_interval */
    int64_t accumulate;
    FILE *bar;             /* a progress bar's lines there, every batch */
    int64_t fail_at;       /* the training stream fails at this sample (0 = never) */
    bool step_lr;          /* a StepLR(1, 0.5) by epoch */
    const char *dir;       /* ModelCheckpoint every 3 steps there */
    const char *ckpt_path; /* resume from */
} cfg;

static void fit(const cfg *c, out *o) {
    if (!c->strategy) tu_clean_env();
    fg_stream *ts = NULL, *vs = NULL;
    fg_dataset *tr = NULL, *va = NULL;
    fg_dataloader *tl, *vl;
    if (c->stream) {
        ts = tu_stream_new(c->n, 11, c->no_len, c->fail_at ? c->fail_at : -1);
        vs = tu_stream_new(12, 12, c->val_no_len, -1);
        tl = fg_dataloader_from_stream(ts, &(fg_stream_loader_opts){.batch = c->batch});
        vl = fg_dataloader_from_stream(vs, &(fg_stream_loader_opts){.batch = 4});
    } else {
        tr = tu_dataset(c->n, 11);
        va = tu_dataset(12, 12);
        tl = tu_loader(tr, c->batch, false);
        vl = tu_loader(va, 4, false);
    }
    CHECK(tl && vl);
    tu_module m = {.log_val = true};
    tu_module_init(&m);
    fg_lightning_module lm = tu_lm(&m);
    if (c->step_lr) lm.configure_optimizers = step_lr_configure;
    fg_callback *ck = c->dir ? fg_model_checkpoint_new(&(fg_checkpoint_opts){
                                   .dirpath = c->dir, .every_n_train_steps = 3, .save_top_k = -1})
                             : NULL;
    fg_callback *pb = c->bar ? fg_progress_bar_new(&(fg_progress_bar_opts){
                                   .out = c->bar, .refresh_rate = 1, .redraw = FG_OFF})
                             : NULL;
    fg_callback *cbs[2] = {ck, pb};
    int ncbs = 0;
    if (ck) cbs[ncbs++] = ck;
    if (pb) cbs[ncbs++] = pb;
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = c->max_epochs,
                                                      .max_steps = c->max_steps,
                                                      .seed = 42,
                                                      .devices = c->strategy ? NULL : "1",
                                                      .strategy = c->strategy,
                                                      .deterministic = c->deterministic,
                                                      .limit_train_batches = c->limit,
                                                      .val_check_interval = c->val_check,
                                                      .accumulate_grad_batches = c->accumulate,
                                                      .callbacks = ncbs ? cbs : NULL,
                                                      .ncallbacks = ncbs,
                                                      .enable_progress_bar = pb ? FG_ON : FG_OFF,
                                                      .enable_checkpointing = ck ? FG_ON : FG_OFF,
                                                      .num_sanity_val_steps = FG_COUNT(0),
                                                      .logger = FG_OFF});
    CHECK(t != NULL);
    o->status = t ? fg_trainer_fit(t, &lm, tl, vl, c->ckpt_path) : fg_last_status();
    snprintf(o->msg, sizeof o->msg, "%s", o->status ? fg_last_error() : "");
    fg_tensor *flat = fg_module_flat_params(m.net);
    o->n = fg_tensor_numel(flat);
    memcpy(o->params, fg_tensor_data(flat), sizeof(float) * (size_t)o->n);
    o->step = t ? fg_trainer_global_step(t) : -1;
    o->batches = t ? fg_trainer_num_training_batches(t) : -1;
    o->train_steps = m.c.train_steps;
    if (!t || !fg_trainer_callback_metric(t, "val_loss", &o->val_loss)) o->val_loss = NAN;
    fg_trainer_free(t);
    fg_callback_free(ck);
    fg_callback_free(pb);
    fg_dataloader_free(tl);
    fg_dataloader_free(vl);
    fg_stream_free(ts);
    fg_stream_free(vs);
    fg_dataset_free(tr);
    fg_dataset_free(va);
    fg_module_free(m.net);
}

TEST(stream_trains_as_the_map_loader_in_order) {
    out a, b;
    fit(&(cfg){.stream = false, .n = 32, .batch = 4, .max_epochs = 2}, &a);
    fit(&(cfg){.stream = true, .n = 32, .batch = 4, .max_epochs = 2}, &b);
    CHECK_MSG(a.status == FG_OK && b.status == FG_OK, "%s %s", a.msg, b.msg);
    CHECK(a.step == 16 && b.step == 16 && b.batches == 8);
    CHECK(a.n == b.n && !memcmp(a.params, b.params, sizeof(float) * (size_t)a.n));
    CHECK_MSG(!memcmp(&a.val_loss, &b.val_loss, sizeof(double)) && isfinite(a.val_loss),
              "val_loss %.17g and %.17g", a.val_loss, b.val_loss);
}

/* ---------------------------------------------------------------- ddp */

typedef struct ddp_shared {
    out two[2], uneven[2], unknown[2], failed[2];
} ddp_shared;

static int ddp_rank(int rank, int world, void *arg) {
    ddp_shared *sh = arg;
    tu_fake_launcher(rank, world, 41);
    fit(&(cfg){.stream = true, .n = 32, .batch = 4, .max_epochs = 2, .strategy = "ddp"},
        &sh->two[rank]);
    /* 33 samples: rank 0's shard holds 17 (5 batches of 4), rank 1's 16 (4) */
    tu_fake_launcher(rank, world, 42);
    fit(&(cfg){.stream = true, .n = 33, .batch = 4, .max_epochs = 2, .strategy = "ddp"},
        &sh->uneven[rank]);
    /* the same with no length: the ranks agree each step that both still
     * have a batch; rank 0's fifth (its short one) is not used */
    tu_fake_launcher(rank, world, 43);
    fit(&(cfg){.stream = true,
               .n = 33,
               .batch = 4,
               .max_epochs = 2,
               .strategy = "ddp",
               .no_len = true},
        &sh->unknown[rank]);
    /* rank 1's stream fails at its 7th sample (13: batch 1): both ranks stop there */
    tu_fake_launcher(rank, world, 44);
    fit(&(cfg){.stream = true,
               .n = 33,
               .batch = 4,
               .max_epochs = 2,
               .strategy = "ddp",
               .no_len = true,
               .fail_at = rank == 1 ? 13 : 0},
        &sh->failed[rank]);
    return 0;
}

TEST(stream_under_ddp_is_split_by_rank) {
    ddp_shared *sh =
        mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(sh != MAP_FAILED);
    if (sh == MAP_FAILED) return;
    CHECK(fg_test_fork_ranks(2, ddp_rank, sh, 300) == 0);
    tu_clean_env();
    out one;
    fit(&(cfg){.stream = false, .n = 32, .batch = 8, .max_epochs = 2}, &one);
    for (int r = 0; r < 2; r++) {
        CHECK_MSG(sh->two[r].status == FG_OK, "rank %d: %s", r, sh->two[r].msg);
        CHECK(sh->two[r].step == 8 && sh->two[r].batches == 4);
        CHECK_MSG(sh->uneven[r].status == FG_OK, "uneven rank %d: %s", r, sh->uneven[r].msg);
        CHECK_MSG(sh->uneven[r].batches == 4 && sh->uneven[r].step == 8,
                  "uneven rank %d: %lld batches, %lld steps (want the smallest count, 4)", r,
                  (long long)sh->uneven[r].batches, (long long)sh->uneven[r].step);
        CHECK_MSG(sh->unknown[r].status == FG_OK, "unknown rank %d: %s", r, sh->unknown[r].msg);
        CHECK_MSG(sh->unknown[r].batches == -1 && sh->unknown[r].step == 8 &&
                      sh->unknown[r].train_steps == 8,
                  "unknown-length rank %d: %lld batches, %lld steps, %lld training_steps (want "
                  "-1, 8, 8: both stop where rank 1's stream ends)",
                  r, (long long)sh->unknown[r].batches, (long long)sh->unknown[r].step,
                  (long long)sh->unknown[r].train_steps);
        /* the same batches as the length-known run that took the smallest count */
        CHECK_MSG(
            !memcmp(sh->unknown[r].params, sh->uneven[r].params, sizeof(float) * (size_t)one.n),
            "unknown-length rank %d: other weights than the length-known stream", r);
        CHECK_MSG(!memcmp(&sh->unknown[r].val_loss, &sh->uneven[r].val_loss, sizeof(double)) &&
                      isfinite(sh->unknown[r].val_loss),
                  "unknown-length rank %d: val_loss %.17g, length-known %.17g", r,
                  sh->unknown[r].val_loss, sh->uneven[r].val_loss);
    }
    CHECK_STATUS(sh->failed[1].status, FG_EIO);
    CHECK_CONTAINS(sh->failed[1].msg, "sample 13 unreadable");
    CHECK_STATUS(sh->failed[0].status, FG_EPEER);
    CHECK_CONTAINS(sh->failed[0].msg,
                   "the training loader of another rank failed at batch 1 of epoch 0");
    CHECK(sh->failed[0].step == 1 && sh->failed[1].step == 1);
    int udiff = 0;
    for (int64_t i = 0; i < one.n; i++)
        udiff += !(fabsf(sh->unknown[0].params[i] - one.params[i]) <=
                   1e-6f + 1e-5f * fabsf(one.params[i]));
    CHECK_MSG(udiff == 0, "unknown length: %d weights differ from one process on the global batch",
              udiff);
    CHECK(!memcmp(sh->two[0].params, sh->two[1].params, sizeof(float) * (size_t)one.n));
    int differ = 0;
    for (int64_t i = 0; i < one.n; i++)
        differ +=
            !(fabsf(sh->two[0].params[i] - one.params[i]) <= 1e-6f + 1e-5f * fabsf(one.params[i]));
    CHECK_MSG(differ == 0, "%d weights differ from one process on the global batch", differ);
    munmap(sh, sizeof *sh);
}

/* ------------------------------------------------------------- resume */

TEST(stream_resumes_mid_epoch_exactly) {
    const char *dir = tu_subdir("stream-ck");
    out full, resumed;
    /* 10 batches an epoch; the checkpoint at step 3 is inside epoch 0 */
    fit(&(cfg){.stream = true, .n = 40, .batch = 4, .max_epochs = 2, .dir = dir}, &full);
    CHECK_MSG(full.status == FG_OK, "%s", full.msg);
    char path[600];
    snprintf(path, sizeof path, "%s/epoch=0-step=3.safetensors", dir);
    fit(&(cfg){.stream = true, .n = 40, .batch = 4, .max_epochs = 2, .ckpt_path = path}, &resumed);
    CHECK_MSG(resumed.status == FG_OK, "%s", resumed.msg);
    CHECK(resumed.step == 20 && full.step == 20);
    CHECK_MSG(resumed.train_steps == 17, "the resumed fit ran %lld batches, want 17",
              (long long)resumed.train_steps);
    CHECK_MSG(!memcmp(full.params, resumed.params, sizeof(float) * (size_t)full.n),
              "resumed from step 3: other weights than the uninterrupted run");
}

/* --------------------------------------------------- unknown length */

TEST(stream_of_unknown_length_ends_where_the_stream_does) {
    /* 34 samples: 8 batches of 4 and a short one of 2 */
    out known, unknown, lk, lu;
    fit(&(cfg){.stream = true, .n = 34, .batch = 4, .max_epochs = 2}, &known);
    fit(&(cfg){.stream = true, .n = 34, .batch = 4, .max_epochs = 2, .no_len = true}, &unknown);
    CHECK_MSG(known.status == FG_OK && unknown.status == FG_OK, "%s %s", known.msg, unknown.msg);
    CHECK_MSG(unknown.step == 18 && unknown.train_steps == 18 && unknown.batches == -1,
              "%lld steps, %lld training_steps, %lld batches (want 18, 18, -1)",
              (long long)unknown.step, (long long)unknown.train_steps, (long long)unknown.batches);
    CHECK(known.step == 18 && known.batches == 9);
    CHECK(!memcmp(known.params, unknown.params, sizeof(float) * (size_t)known.n));
    /* validation ran at the stream's end as at the known epoch's last batch */
    CHECK_MSG(!memcmp(&known.val_loss, &unknown.val_loss, sizeof(double)) &&
                  isfinite(known.val_loss),
              "val_loss %.17g and %.17g", known.val_loss, unknown.val_loss);
    /* an epoch-interval scheduler steps at the stream's end as at the known last batch */
    out sk, su, none;
    fit(&(cfg){.stream = true, .n = 34, .batch = 4, .max_epochs = 3, .step_lr = true}, &sk);
    fit(
        &(cfg){
            .stream = true, .n = 34, .batch = 4, .max_epochs = 3, .step_lr = true, .no_len = true},
        &su);
    fit(&(cfg){.stream = true, .n = 34, .batch = 4, .max_epochs = 3, .no_len = true}, &none);
    CHECK_MSG(sk.status == FG_OK && su.status == FG_OK && none.status == FG_OK, "%s %s %s", sk.msg,
              su.msg, none.msg);
    CHECK_MSG(!memcmp(sk.params, su.params, sizeof(float) * (size_t)sk.n),
              "StepLR by epoch: the unknown length's weights differ from the known length's");
    CHECK_MSG(memcmp(su.params, none.params, sizeof(float) * (size_t)sk.n) != 0,
              "StepLR by epoch made no difference: it never stepped");
    /* the progress bar: tqdm's n/? for an unknown total */
    char *text = NULL;
    size_t size = 0;
    FILE *bar = open_memstream(&text, &size);
    out o;
    fit(&(cfg){.stream = true, .n = 34, .batch = 4, .max_epochs = 1, .no_len = true, .bar = bar},
        &o);
    fclose(bar);
    CHECK_MSG(o.status == FG_OK, "%s", o.msg);
    CHECK_CONTAINS(text, "Epoch 0: 1/? [");
    CHECK_CONTAINS(text, "Epoch 0: 9/? [");
    free(text);
    /* limit_train_batches as a count: 5 of the stream's batches an epoch */
    fit(&(cfg){.stream = true, .n = 34, .batch = 4, .max_epochs = 2, .limit = FG_COUNT(5)}, &lk);
    fit(&(cfg){.stream = true,
               .n = 34,
               .batch = 4,
               .max_epochs = 2,
               .no_len = true,
               .limit = FG_COUNT(5)},
        &lu);
    CHECK_MSG(lk.status == FG_OK && lu.status == FG_OK, "%s %s", lk.msg, lu.msg);
    CHECK(lu.step == 10 && lu.batches == 5 && lk.step == 10);
    CHECK(!memcmp(lk.params, lu.params, sizeof(float) * (size_t)lk.n));
    CHECK(!memcmp(&lk.val_loss, &lu.val_loss, sizeof(double)));
    /* a count past the stream's end: the stream's end ends the epoch */
    fit(&(cfg){.stream = true,
               .n = 34,
               .batch = 4,
               .max_epochs = 2,
               .no_len = true,
               .limit = FG_COUNT(100)},
        &lu);
    CHECK_MSG(lu.status == FG_OK, "%s", lu.msg);
    CHECK(lu.step == 18 && !memcmp(known.params, lu.params, sizeof(float) * (size_t)known.n));
}

TEST(stream_of_unknown_length_resumes_mid_epoch_exactly) {
    const char *dir = tu_subdir("stream-nolen-ck");
    out full, resumed, again;
    /* 10 batches an epoch, not known; checkpoints at steps 3, 6, 9, 12... */
    fit(&(cfg){.stream = true, .n = 40, .batch = 4, .max_epochs = 2, .dir = dir, .no_len = true},
        &full);
    CHECK_MSG(full.status == FG_OK, "%s", full.msg);
    CHECK(full.step == 20);
    char path[600];
    snprintf(path, sizeof path, "%s/epoch=0-step=3.safetensors", dir);
    fit(&(cfg){.stream = true,
               .n = 40,
               .batch = 4,
               .max_epochs = 2,
               .ckpt_path = path,
               .no_len = true},
        &resumed);
    CHECK_MSG(resumed.status == FG_OK, "%s", resumed.msg);
    CHECK_MSG(resumed.step == 20 && resumed.train_steps == 17,
              "resumed: %lld steps, %lld training_steps (want 20, 17)", (long long)resumed.step,
              (long long)resumed.train_steps);
    CHECK_MSG(!memcmp(full.params, resumed.params, sizeof(float) * (size_t)full.n),
              "resumed from step 3: other weights than the uninterrupted run");
    CHECK(!memcmp(&full.val_loss, &resumed.val_loss, sizeof(double)));
    /* step 12: inside epoch 1, after the first stream's end */
    snprintf(path, sizeof path, "%s/epoch=1-step=12.safetensors", dir);
    fit(&(cfg){.stream = true,
               .n = 40,
               .batch = 4,
               .max_epochs = 2,
               .ckpt_path = path,
               .no_len = true},
        &again);
    CHECK_MSG(again.status == FG_OK, "%s", again.msg);
    CHECK(again.step == 20 && again.train_steps == 8);
    CHECK_MSG(!memcmp(full.params, again.params, sizeof(float) * (size_t)full.n),
              "resumed from step 12: other weights than the uninterrupted run");
}

/* ------------------------------------------------------------ refusals */

TEST(stream_refusals) {
    out o;
    fit(&(cfg){.stream = true,
               .n = 32,
               .batch = 4,
               .max_epochs = 1,
               .no_len = true,
               .val_check = FG_FRACTION(0.5)},
        &o);
    CHECK_STATUS(o.status, FG_EINVAL);
    CHECK_CONTAINS(o.msg, "val_check_interval=FG_FRACTION(0.5) with a training stream of unknown "
                          "length");
    fit(&(cfg){.stream = true,
               .n = 32,
               .batch = 4,
               .max_epochs = 1,
               .no_len = true,
               .limit = FG_FRACTION(0.5)},
        &o);
    CHECK_STATUS(o.status, FG_EINVAL);
    CHECK_CONTAINS(o.msg,
                   "limit_train_batches=FG_FRACTION(0.5): the loader's stream has no length");
    fit(
        &(cfg){
            .stream = true, .n = 32, .batch = 4, .max_epochs = 1, .no_len = true, .accumulate = 2},
        &o);
    CHECK_STATUS(o.status, FG_EINVAL);
    CHECK_CONTAINS(o.msg, "accumulate_grad_batches=2 with a training stream of unknown length");
    fit(&(cfg){.stream = true, .n = 32, .batch = 4, .max_epochs = 1, .val_no_len = true}, &o);
    CHECK_STATUS(o.status, FG_EUNSUPPORTED);
    CHECK_CONTAINS(o.msg, "evaluation loader 0 is over a stream of unknown length");
    fit(&(cfg){.stream = true, .n = 32, .batch = 4, .max_epochs = 1, .deterministic = true}, &o);
    CHECK_STATUS(o.status, FG_EUNSUPPORTED);
    CHECK_CONTAINS(o.msg, "a loader over a stream under deterministic");
    fg_stream *s = tu_stream_new(8, 1, false, -1);
    fg_dataloader *dl = fg_dataloader_from_stream(s, NULL);
    CHECK(dl && fg_dataloader_is_stream(dl) && !fg_dataloader_dataset(dl));
    CHECK_STATUS(fg_dataloader_set_sampler(dl, fg_sampler_sequential(8)), FG_EUNSUPPORTED);
    CHECK_CONTAINS(fg_last_error(), "a stream takes no sampler");
    fg_dataloader_free(dl);
    fg_stream_free(s);
    CHECK(!fg_dataloader_from_stream(NULL, NULL));
}
