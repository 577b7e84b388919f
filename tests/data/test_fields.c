/* Batches of named fields: every field shape (scalar, fixed 1-d and 2-d,
 * variable first dimension with and without trailing dims, several dtypes)
 * through the default collate, padding values and masks, batches whose
 * longest field is empty; the (x, y) case equal to fg_dataloader's batches;
 * a custom collate and its failure; spec errors; resume through the sample
 * loader; failing allocations. */
#include <stdint.h>

#include "data/data_impl.h"
#pragma GCC diagnostic ignored "-Wunused-function" /* only the failing allocator is used */
#include "data_test_util.h"
#include "fulgur/data.h"
#include "harness.h"

#define N 23
#define TOK_MAX 7
#define EMB_MAX 5

/* Fields: w f64 scalar; ids (4) i64; grid (2, 3) u16; tok (L) i32 var; emb (L, 3) f32 var;
 * raw (L) u8 var. Sample i: tok has i % 8 elements, emb (3 i) % 6 rows, raw i % 3. */
static const fg_field_spec FIELDS[] = {
    {.name = "w", .dtype = FG_F64},
    {.name = "ids", .dtype = FG_I64, .ndim = 1, .shape = {4}},
    {.name = "grid", .dtype = FG_U16, .ndim = 2, .shape = {2, 3}},
    {.name = "tok", .dtype = FG_I32, .ndim = 1, .shape = {FG_FIELD_VAR}, .max_len = TOK_MAX},
    {.name = "emb", .ndim = 2, .shape = {FG_FIELD_VAR, 3}, .max_len = EMB_MAX},
    {.name = "raw", .dtype = FG_U8, .ndim = 1, .shape = {FG_FIELD_VAR}, .max_len = 2},
};
static int64_t tok_len(int64_t i) { return i % 8; }
static int64_t emb_len(int64_t i) { return (3 * i) % 6; }
static int64_t raw_len(int64_t i) { return i % 3; }

static int64_t ds_len(void *ud) {
    (void)ud;
    return N;
}
static fg_status ds_get(void *ud, int64_t i, fg_sample_field *f) {
    (void)ud;
    *(double *)f[0].data = 0.5 * (double)i;
    for (int k = 0; k < 4; k++) ((int64_t *)f[1].data)[k] = i * 10 + k;
    for (int k = 0; k < 6; k++) ((uint16_t *)f[2].data)[k] = (uint16_t)(i * 100 + k);
    CHECK(f[3].len == TOK_MAX && f[4].len == EMB_MAX && f[1].len == 4 && f[0].len == 1);
    f[3].len = tok_len(i);
    for (int64_t k = 0; k < f[3].len; k++) ((int32_t *)f[3].data)[k] = (int32_t)(i * 1000 + k);
    f[4].len = emb_len(i);
    for (int64_t k = 0; k < 3 * f[4].len; k++) ((float *)f[4].data)[k] = (float)i + 0.25f * k;
    f[5].len = raw_len(i);
    for (int64_t k = 0; k < f[5].len; k++) ((uint8_t *)f[5].data)[k] = (uint8_t)(i + k);
    return FG_OK;
}
static const fg_fields_ops OPS = {ds_len, ds_get, NULL};

static bool shape_is(const fg_tensor *t, int ndim, const int64_t *want) {
    if (!t || fg_tensor_ndim(t) != ndim) return false;
    for (int d = 0; d < ndim; d++)
        if (fg_tensor_shape(t)[d] != want[d]) return false;
    return true;
}

/* Checks one batch of the default collate with pad value `pad` and masks. */
static void check_batch(const fg_fields_batch *b, double pad, bool masks) {
    int64_t n = b->size;
    CHECK(b->nfields == (masks ? 9 : 6));
    static const char *order[] = {"w",   "ids",      "grid", "tok",     "tok_mask",
                                  "emb", "emb_mask", "raw",  "raw_mask"};
    for (int k = 0, j = 0; k < 9; k++) {
        if (!masks && strstr(order[k], "_mask")) continue;
        CHECK_MSG(strcmp(b->names[j], order[k]) == 0, "field %d is %s, want %s", j, b->names[j],
                  order[k]);
        j++;
    }
    int64_t Lt = 0, Le = 0, Lr = 0;
    for (int64_t j = 0; j < n; j++) {
        Lt = FG_MAX(Lt, tok_len(b->indices[j]));
        Le = FG_MAX(Le, emb_len(b->indices[j]));
        Lr = FG_MAX(Lr, raw_len(b->indices[j]));
    }
    fg_tensor *w = fg_fields_batch_get(b, "w"), *ids = fg_fields_batch_get(b, "ids");
    fg_tensor *grid = fg_fields_batch_get(b, "grid"), *tok = fg_fields_batch_get(b, "tok");
    fg_tensor *emb = fg_fields_batch_get(b, "emb"), *raw = fg_fields_batch_get(b, "raw");
    CHECK(shape_is(w, 1, (int64_t[]){n}) && fg_tensor_dtype(w) == FG_F64);
    CHECK(shape_is(ids, 2, (int64_t[]){n, 4}) && fg_tensor_dtype(ids) == FG_I64);
    CHECK(shape_is(grid, 3, (int64_t[]){n, 2, 3}) && fg_tensor_dtype(grid) == FG_U16);
    CHECK(shape_is(tok, 2, (int64_t[]){n, Lt}) && fg_tensor_dtype(tok) == FG_I32);
    CHECK(shape_is(emb, 3, (int64_t[]){n, Le, 3}) && fg_tensor_dtype(emb) == FG_F32);
    CHECK(shape_is(raw, 2, (int64_t[]){n, Lr}) && fg_tensor_dtype(raw) == FG_U8);
    if (!w || !ids || !grid || !tok || !emb || !raw) return;
    fg_tensor *tm = fg_fields_batch_get(b, "tok_mask"), *em = fg_fields_batch_get(b, "emb_mask");
    fg_tensor *rm = fg_fields_batch_get(b, "raw_mask");
    if (masks) {
        CHECK(shape_is(tm, 2, (int64_t[]){n, Lt}) && fg_tensor_dtype(tm) == FG_U8);
        CHECK(shape_is(em, 2, (int64_t[]){n, Le}) && fg_tensor_dtype(em) == FG_U8);
        CHECK(shape_is(rm, 2, (int64_t[]){n, Lr}));
        if (!tm || !em || !rm) return;
    } else {
        CHECK(!tm && !em && !rm);
    }
    int bad = 0;
    for (int64_t j = 0; j < n; j++) {
        int64_t i = b->indices[j];
        bad += ((double *)fg_tensor_data(w))[j] != 0.5 * (double)i;
        for (int k = 0; k < 4; k++)
            bad += ((int64_t *)fg_tensor_data(ids))[j * 4 + k] != i * 10 + k;
        for (int k = 0; k < 6; k++)
            bad += ((uint16_t *)fg_tensor_data(grid))[j * 6 + k] != (uint16_t)(i * 100 + k);
        for (int64_t k = 0; k < Lt; k++) {
            int32_t v = ((int32_t *)fg_tensor_data(tok))[j * Lt + k];
            bool real = k < tok_len(i);
            bad += v != (real ? (int32_t)(i * 1000 + k) : (int32_t)pad);
            if (masks) bad += ((uint8_t *)fg_tensor_data(tm))[j * Lt + k] != real;
        }
        for (int64_t r = 0; r < Le; r++) {
            bool real = r < emb_len(i);
            for (int c = 0; c < 3; c++) {
                float v = ((float *)fg_tensor_data(emb))[(j * Le + r) * 3 + c];
                bad += v != (real ? (float)i + 0.25f * (float)(r * 3 + c) : (float)pad);
            }
            if (masks) bad += ((uint8_t *)fg_tensor_data(em))[j * Le + r] != real;
        }
        for (int64_t k = 0; k < Lr; k++) {
            uint8_t v = ((uint8_t *)fg_tensor_data(raw))[j * Lr + k];
            bool real = k < raw_len(i);
            bad += v != (real ? (uint8_t)(i + k) : (uint8_t)(int64_t)pad);
            if (masks) bad += ((uint8_t *)fg_tensor_data(rm))[j * Lr + k] != real;
        }
    }
    CHECK_MSG(bad == 0, "batch %lld of epoch %lld: %d wrong values", (long long)b->index,
              (long long)b->epoch, bad);
}

static void run_epochs(int64_t batch, int workers, bool shuffle, double pad, bool no_mask) {
    fg_fields_dataset *fd = fg_fields_dataset_new(&OPS, NULL, FIELDS, 6, "shapes");
    CHECK_MSG(fd != NULL, "%s", fg_last_error());
    if (!fd) return;
    CHECK(fg_fields_dataset_len(fd) == N && fg_fields_dataset_nfields(fd) == 6);
    CHECK(strcmp(fg_fields_dataset_field(fd, 3)->name, "tok") == 0);
    CHECK(fg_fields_dataset_field(fd, 4)->dtype == FG_F32); /* 0 read as f32 */
    CHECK(fg_fields_dataset_field(fd, 6) == NULL);
    fg_fields_loader *fl = fg_fields_loader_new(
        fd, &(fg_fields_loader_opts){
                .loader = {.batch = batch, .shuffle = shuffle, .seed = 7, .num_workers = workers},
                .collate_opts = {.pad_value = pad, .no_mask = no_mask}});
    CHECK_MSG(fl != NULL, "%s", fg_last_error());
    if (fl) {
        for (int64_t e = 0; e < 2; e++) {
            CHECK_OK(fg_dataloader_set_epoch(fg_fields_loader_loader(fl), e));
            int64_t seen[N] = {0}, nb = 0;
            for (fg_fields_batch *b; (b = fg_fields_loader_next(fl)) != NULL; nb++) {
                CHECK(b->epoch == e && b->index == nb && b->valid == b->size);
                check_batch(b, pad, !no_mask);
                for (int64_t j = 0; j < b->size; j++) seen[b->indices[j]]++;
            }
            CHECK_OK(fg_fields_loader_status(fl));
            CHECK(nb == (N + batch - 1) / batch);
            for (int i = 0; i < N; i++)
                CHECK_MSG(seen[i] == 1, "sample %d seen %lld times", i, (long long)seen[i]);
        }
    }
    fg_fields_loader_free(fl);
    fg_fields_dataset_free(fd);
}

TEST(fields_every_shape_padding_and_masks) {
    run_epochs(5, 0, false, 0, false);
    run_epochs(4, 2, true, -1, false); /* -1 as u8 is 255, as PyTorch's uint8 cast */
    run_epochs(6, 1, true, 3.5, true);
    run_epochs(1, 0, false, 9, false); /* single samples: sample 0's tok and emb are empty */
    run_epochs(N, 2, true, 0, false);  /* one batch of everything */
}

/* an (x, y) dataset: x (3, 2) f32, y i32 */
static int64_t xy_len(void *ud) {
    (void)ud;
    return 17;
}
static void xy_spec(void *ud, fg_sample_spec *x, fg_sample_spec *y) {
    (void)ud;
    *x = (fg_sample_spec){.dtype = FG_F32, .ndim = 2, .shape = {3, 2}};
    *y = (fg_sample_spec){.dtype = FG_I32};
}
static fg_status xy_get(void *ud, int64_t i, void *x, void *y) {
    (void)ud;
    for (int k = 0; k < 6; k++) ((float *)x)[k] = (float)(i * 6 + k) / 7.0f;
    *(int32_t *)y = (int32_t)(i * i);
    return FG_OK;
}

TEST(fields_xy_case_equals_the_dataloader) {
    static const fg_dataset_ops ops = {xy_len, xy_spec, xy_get, NULL};
    fg_dataset *ds = fg_dataset_new(&ops, NULL, "xy");
    fg_fields_dataset *fd = fg_fields_dataset_from(ds);
    CHECK(fd != NULL);
    fg_loader_opts lo = {.batch = 5, .shuffle = true, .seed = 3, .num_workers = 2};
    fg_dataloader *dl = fg_dataloader_new(ds, &lo);
    fg_fields_loader *fl = fg_fields_loader_new(fd, &(fg_fields_loader_opts){.loader = lo});
    CHECK(dl && fl);
    if (dl && fl) {
        CHECK(fg_dataloader_len(fg_fields_loader_loader(fl)) == fg_dataloader_len(dl));
        for (int64_t e = 0; e < 2; e++) {
            CHECK_OK(fg_dataloader_set_epoch(dl, e));
            CHECK_OK(fg_dataloader_set_epoch(fg_fields_loader_loader(fl), e));
            int nb = 0;
            for (fg_batch *a; (a = fg_dataloader_next(dl)) != NULL; nb++) {
                fg_fields_batch *b = fg_fields_loader_next(fl);
                CHECK(b != NULL);
                if (!b) break;
                CHECK(b->nfields == 2 && strcmp(b->names[0], "x") == 0 &&
                      strcmp(b->names[1], "y") == 0);
                fg_tensor *x = fg_fields_batch_get(b, "x"), *y = fg_fields_batch_get(b, "y");
                CHECK(fg_tensor_same_shape(x, a->x) && fg_tensor_same_shape(y, a->y));
                CHECK(fg_tensor_dtype(x) == FG_F32 && fg_tensor_dtype(y) == FG_I32);
                CHECK(memcmp(fg_tensor_data(x), fg_tensor_data(a->x), fg_tensor_nbytes(a->x)) == 0);
                CHECK(memcmp(fg_tensor_data(y), fg_tensor_data(a->y), fg_tensor_nbytes(a->y)) == 0);
                CHECK(b->size == a->size && b->index == a->index &&
                      memcmp(b->indices, a->indices, (size_t)a->size * 8) == 0);
            }
            CHECK(nb == 4 && fg_fields_loader_next(fl) == NULL);
        }
    }
    fg_fields_loader_free(fl);
    fg_dataloader_free(dl);
    fg_fields_dataset_free(fd);
    fg_dataset_free(ds);
}

static fg_status with_lengths(void *ud, const fg_fields_dataset *fd, const fg_sample_field *s,
                              int64_t n, fg_collate_out *out) {
    int *calls = ud;
    if (++*calls == 2) return fg_error(FG_EINVAL, "the second batch is refused");
    FG_TRY(fg_collate_default(&(fg_collate_opts){.no_mask = true}, fd, s, n, out));
    fg_tensor *t = fg_collate_tensor(out, "tok_len", FG_I64, 1, (int64_t[]){n});
    if (!t) return fg_last_status();
    for (int64_t j = 0; j < n; j++) ((int64_t *)fg_tensor_data(t))[j] = s[j * 6 + 3].len;
    CHECK(fg_collate_tensor(out, "tok_len", FG_I64, 1, (int64_t[]){n}) == NULL);
    CHECK_CONTAINS(fg_last_error(), "already has a field 'tok_len'");
    return FG_OK;
}

TEST(fields_custom_collate_and_its_failure) {
    fg_fields_dataset *fd = fg_fields_dataset_new(&OPS, NULL, FIELDS, 6, "shapes");
    int calls = 0;
    fg_fields_loader *fl = fg_fields_loader_new(
        fd, &(fg_fields_loader_opts){
                .loader = {.batch = 4}, .collate = with_lengths, .collate_ud = &calls});
    CHECK(fl != NULL);
    if (!fl) {
        fg_fields_dataset_free(fd);
        return;
    }
    fg_fields_batch *b = fg_fields_loader_next(fl);
    CHECK(b && b->nfields == 7 && strcmp(b->names[6], "tok_len") == 0);
    if (b) {
        check_batch(&(fg_fields_batch){.nfields = 6,
                                       .names = b->names,
                                       .tensors = b->tensors,
                                       .size = b->size,
                                       .indices = b->indices},
                    0, false);
        const int64_t *lens = fg_tensor_data(fg_fields_batch_get(b, "tok_len"));
        CHECK(lens[0] == 0 && lens[1] == 1 && lens[3] == 3);
    }
    CHECK(fg_fields_loader_next(fl) == NULL);
    CHECK(fg_fields_loader_status(fl) == FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "collate of batch 1 of epoch 0: the second batch is refused");
    CHECK(fg_fields_loader_next(fl) == NULL); /* the same error, not the next batch */
    CHECK_CONTAINS(fg_last_error(), "collate of batch 1 of epoch 0");
    CHECK(calls == 2);
    CHECK_OK(fg_dataloader_set_position(fg_fields_loader_loader(fl), 0, 2));
    b = fg_fields_loader_next(fl);
    CHECK(b && b->index == 2 && b->indices[0] == 8);
    CHECK_OK(fg_fields_loader_status(fl));
    fg_fields_loader_free(fl);
    fg_fields_dataset_free(fd);
}

static fg_status too_long(void *ud, int64_t i, fg_sample_field *f) {
    fg_status s = ds_get(ud, i, f);
    if (i == 6) f[3].len = TOK_MAX + 1;
    return s;
}

TEST(fields_spec_errors_and_bad_lengths) {
    fg_field_spec f[2] = {{.name = "a"}, {.name = "a"}};
    CHECK(fg_fields_dataset_new(&OPS, NULL, f, 2, "d") == NULL);
    CHECK_CONTAINS(fg_last_error(), "fields 0 and 1 are both named 'a'");
    f[1] = (fg_field_spec){.name = "a_mask"};
    CHECK(fg_fields_dataset_new(&OPS, NULL, f, 2, "d") == NULL);
    CHECK_CONTAINS(fg_last_error(), "field 'a_mask': a name ending in \"_mask\"");
    f[1] = (fg_field_spec){.name = NULL};
    CHECK(fg_fields_dataset_new(&OPS, NULL, f, 2, "d") == NULL);
    CHECK_CONTAINS(fg_last_error(), "field 1 has no name");
    f[1] = (fg_field_spec){.name = "v", .ndim = 1, .shape = {FG_FIELD_VAR}};
    CHECK(fg_fields_dataset_new(&OPS, NULL, f, 2, "d") == NULL);
    CHECK_CONTAINS(fg_last_error(), "field 'v' has a variable length: set max_len");
    f[1] = (fg_field_spec){.name = "v", .ndim = 2, .shape = {2, FG_FIELD_VAR}, .max_len = 3};
    CHECK(fg_fields_dataset_new(&OPS, NULL, f, 2, "d") == NULL);
    CHECK_CONTAINS(fg_last_error(), "field 'v': dimension 1 is -1");
    f[1] = (fg_field_spec){.name = "v", .ndim = FG_MAX_DIMS};
    CHECK(fg_fields_dataset_new(&OPS, NULL, f, 2, "d") == NULL);
    CHECK_CONTAINS(fg_last_error(), "field 'v' has");
    CHECK(fg_fields_dataset_new(&OPS, NULL, f, 0, "d") == NULL);
    CHECK_CONTAINS(fg_last_error(), "0 fields");

    static const fg_fields_ops bad = {ds_len, too_long, NULL};
    fg_fields_dataset *fd = fg_fields_dataset_new(&bad, NULL, FIELDS, 6, "long");
    fg_fields_loader *fl =
        fg_fields_loader_new(fd, &(fg_fields_loader_opts){.loader = {.batch = 4}});
    CHECK(fl && fg_fields_loader_next(fl) != NULL);
    CHECK(fg_fields_loader_next(fl) == NULL);
    CHECK(fg_fields_loader_status(fl) == FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "sample 6 (batch 1 of epoch 0)");
    CHECK_CONTAINS(fg_last_error(), "field 'tok': length 8 is outside [0, 7]");
    fg_fields_loader_free(fl);
    fg_fields_dataset_free(fd);
}

TEST(fields_resume_mid_epoch_exactly) {
    fg_fields_dataset *fd = fg_fields_dataset_new(&OPS, NULL, FIELDS, 6, "shapes");
    fg_fields_loader_opts o = {
        .loader = {.batch = 3, .shuffle = true, .seed = 11, .num_workers = 2}};
    fg_fields_loader *a = fg_fields_loader_new(fd, &o), *b = fg_fields_loader_new(fd, &o);
    CHECK(a && b);
    if (a && b) {
        CHECK_OK(fg_dataloader_set_epoch(fg_fields_loader_loader(a), 1));
        for (int k = 0; k < 3; k++) fg_fields_loader_next(a);
        int64_t e, pos;
        fg_dataloader_position(fg_fields_loader_loader(a), &e, &pos);
        CHECK(e == 1 && pos == 3);
        CHECK_OK(fg_dataloader_set_position(fg_fields_loader_loader(b), e, pos));
        for (fg_fields_batch *x; (x = fg_fields_loader_next(a)) != NULL;) {
            fg_fields_batch *y = fg_fields_loader_next(b);
            CHECK(y && y->index == x->index && y->nfields == x->nfields);
            for (int k = 0; y && k < x->nfields; k++)
                CHECK(fg_tensor_same_shape(x->tensors[k], y->tensors[k]) &&
                      memcmp(fg_tensor_data(x->tensors[k]), fg_tensor_data(y->tensors[k]),
                             fg_tensor_nbytes(x->tensors[k])) == 0);
        }
        CHECK(fg_fields_loader_next(b) == NULL);
    }
    fg_fields_loader_free(a);
    fg_fields_loader_free(b);
    fg_fields_dataset_free(fd);
}

TEST(fields_alloc_failures_never_leak) {
    int fails = 0;
    for (long n = 0; n < 500; n++) {
        fx_alloc_begin(n);
        fg_fields_dataset *fd = fg_fields_dataset_new(&OPS, NULL, FIELDS, 6, "shapes");
        fg_fields_loader *fl =
            fd ? fg_fields_loader_new(fd, &(fg_fields_loader_opts){.loader = {.batch = 4}}) : NULL;
        fg_fields_batch *b = fl ? fg_fields_loader_next(fl) : NULL;
        bool ok = b != NULL;
        fg_fields_loader_free(fl);
        fg_fields_dataset_free(fd);
        long live = fx_alloc_end();
        CHECK_MSG(live == 0, "failing allocation %ld: %ld blocks leaked", n, live);
        if (ok) break;
        fails++;
    }
    CHECK(fails >= 5);
}

TEST(fields_distributed_sampler_over_three_ranks) {
    fg_fields_dataset *fd = fg_fields_dataset_new(&OPS, NULL, FIELDS, 6, "shapes");
    int64_t seen[N] = {0};
    for (int r = 0; r < 3; r++) {
        fg_fields_loader *fl = fg_fields_loader_new(
            fd, &(fg_fields_loader_opts){.loader = {.batch = 2, .num_workers = 1}});
        CHECK(fl != NULL);
        if (!fl) continue;
        fg_dataloader *dl = fg_fields_loader_loader(fl);
        CHECK_OK(fg_dataloader_set_sampler(
            dl, fg_sampler_distributed(N, r, 3, &(fg_distributed_opts){.shuffle = true})));
        CHECK_OK(fg_dataloader_set_epoch(dl, 2));
        for (fg_fields_batch *b; (b = fg_fields_loader_next(fl)) != NULL;) {
            check_batch(b, 0, true);
            for (int64_t j = 0; j < b->valid; j++) seen[b->indices[j]]++;
        }
        CHECK_OK(fg_fields_loader_status(fl));
        fg_fields_loader_free(fl);
    }
    for (int i = 0; i < N; i++) CHECK_MSG(seen[i] == 1, "sample %d: %lld", i, (long long)seen[i]);
    fg_fields_dataset_free(fd);
}
