/* The distributed sampler dealt in blocks (the deterministic mode's micro-
 * batches) and the loader's position in samples (the elastic resume):
 * exact indices against the rule written out, real counts with padding,
 * the prefix property on any world size, and a position saved on one world
 * size continued on others with every sample of the epoch taken once. */
#include "fulgur/data.h"
#include "harness.h"

/* the rule of data.h, written out: rank r's j-th index */
static int64_t expect_pos(int64_t j, int64_t k, int r, int world) {
    return ((j / k) * world + r) * k + j % k;
}

TEST(sampler_blocks_indices_and_real) {
    static const struct {
        int64_t n, block, round;
        int world;
        bool drop;
    } cases[] = {{24, 2, 0, 3, true},  {25, 2, 0, 3, true},  {25, 2, 0, 3, false},
                 {7, 3, 0, 2, false},  {53, 1, 12, 4, true}, {53, 2, 24, 3, true},
                 {53, 4, 24, 3, true}, {5, 4, 0, 3, false}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t n = cases[c].n, k = cases[c].block;
        int W = cases[c].world;
        int64_t rnd = k * W, cut = cases[c].round ? cases[c].round : rnd;
        int64_t total = cases[c].drop ? n / cut * cut : (n + rnd - 1) / rnd * rnd;
        int64_t seen_real = 0;
        for (int r = 0; r < W; r++) {
            fg_distributed_opts o = {
                .drop_last = cases[c].drop, .block = k, .round = cases[c].round};
            fg_sampler *s = fg_sampler_distributed(n, r, W, &o);
            CHECK_MSG(s, "case %zu: %s", c, fg_last_error());
            if (!s) continue;
            CHECK(fg_sampler_len(s) == total / W);
            int64_t *out = malloc(sizeof(int64_t) * (size_t)(total / W + 1));
            CHECK_OK(fg_sampler_indices(s, 0, out));
            int64_t real = 0;
            for (int64_t j = 0; j < total / W; j++) {
                int64_t p = expect_pos(j, k, r, W);
                CHECK_MSG(out[j] == p % n, "case %zu rank %d j %lld: %lld, want %lld", c, r,
                          (long long)j, (long long)out[j], (long long)(p % n));
                if (p < n) {
                    CHECK_MSG(real == j, "case %zu: padding before a real sample", c);
                    real++;
                }
            }
            CHECK_MSG(fg_sampler_num_real(s) == real, "case %zu rank %d: real %lld, want %lld", c,
                      r, (long long)fg_sampler_num_real(s), (long long)real);
            seen_real += real;
            free(out);
            fg_sampler_free(s);
        }
        CHECK(seen_real == (total < n ? total : n));
    }
    /* bad blocks and rounds are named */
    CHECK(fg_sampler_distributed(10, 0, 2, &(fg_distributed_opts){.block = -1}) == NULL);
    CHECK(fg_last_status() == FG_EINVAL);
    CHECK(fg_sampler_distributed(10, 0, 2, &(fg_distributed_opts){.block = 2, .round = 6}) == NULL);
    CHECK(strstr(fg_last_error(), "round=6") != NULL);
}

/* a dataset whose x is its index */
static int64_t ds_len(void *ud) { return *(int64_t *)ud; }
static void ds_spec(void *ud, fg_sample_spec *x, fg_sample_spec *y) {
    (void)ud;
    *x = (fg_sample_spec){.dtype = FG_I64};
    *y = (fg_sample_spec){.dtype = FG_I64};
}
static fg_status ds_get(void *ud, int64_t i, void *x, void *y) {
    (void)ud;
    *(int64_t *)x = i;
    *(int64_t *)y = i;
    return FG_OK;
}

static fg_dataloader *loader(fg_dataset *ds, int64_t batch, int rank, int world, int64_t block,
                             int64_t round) {
    fg_dataloader *dl = fg_dataloader_new(
        ds, &(fg_loader_opts){.batch = batch, .shuffle = true, .seed = 9, .drop_last = true});
    if (!dl) return NULL;
    fg_distributed_opts o = {
        .shuffle = true, .seed = 9, .drop_last = true, .block = block, .round = round};
    if (fg_dataloader_set_sampler(
            dl, fg_sampler_distributed(fg_dataset_len(ds), rank, world, &o)) != FG_OK) {
        fg_dataloader_free(dl);
        return NULL;
    }
    return dl;
}

/* Takes `batches` batches on every rank of `world` from the sample position
 * (epoch 0, *pos), counting each sample in seen[]; *pos moves on. */
static void take(fg_dataset *ds, int world, int64_t batch, int64_t block, int64_t round,
                 int64_t *pos, int64_t batches, int *seen) {
    int64_t after = -1;
    for (int r = 0; r < world; r++) {
        fg_dataloader *dl = loader(ds, batch, r, world, block, round);
        CHECK(dl != NULL);
        if (!dl) return;
        CHECK_OK(fg_dataloader_set_sample_position(dl, 0, *pos));
        for (int64_t b = 0; b < batches; b++) {
            fg_batch *bt = fg_dataloader_next(dl);
            CHECK(bt != NULL);
            if (!bt) break;
            for (int64_t i = 0; i < bt->size; i++) seen[bt->indices[i]]++;
        }
        int64_t e, s;
        fg_dataloader_sample_position(dl, &e, &s);
        CHECK(e == 0);
        CHECK(after < 0 || after == s); /* every rank at the same sample position */
        after = s;
        fg_dataloader_free(dl);
    }
    *pos = after;
}

TEST(sample_position_maps_across_world_sizes) {
    int64_t n = 53;
    fg_dataset *ds =
        fg_dataset_new(&(fg_dataset_ops){.len = ds_len, .spec = ds_spec, .get = ds_get}, &n, "ids");
    CHECK(ds != NULL);
    if (!ds) return;
    /* PyTorch's rule (block 1), batch 2: 2 ranks x 3 batches = 12 samples,
     * then 1 rank x 6, then 3 ranks x 4 = 24: the epoch's prefix of 48, once each */
    int seen[64] = {0};
    int64_t pos = 0;
    take(ds, 2, 2, 1, 0, &pos, 3, seen);
    CHECK(pos == 12);
    take(ds, 1, 2, 1, 0, &pos, 6, seen);
    CHECK(pos == 24);
    take(ds, 3, 2, 1, 0, &pos, 4, seen);
    CHECK(pos == 48);
    int once = 0, twice = 0;
    for (int i = 0; i < n; i++) {
        once += seen[i] == 1;
        twice += seen[i] > 1;
    }
    CHECK_MSG(once == 48 && twice == 0, "%d samples once, %d more than once", once, twice);
    /* the deterministic mode's blocks: batch 1, global batch 12 (rounds of
     * 12); 4 ranks, 1 rank, 3 ranks, 2 ranks: the 48 samples of 4 steps */
    memset(seen, 0, sizeof seen);
    pos = 0;
    take(ds, 4, 1, 1, 12, &pos, 3, seen);
    take(ds, 1, 1, 1, 12, &pos, 12, seen);
    take(ds, 3, 1, 1, 12, &pos, 4, seen);
    take(ds, 2, 1, 1, 12, &pos, 6, seen);
    CHECK(pos == 48);
    once = twice = 0;
    for (int i = 0; i < n; i++) {
        once += seen[i] == 1;
        twice += seen[i] > 1;
    }
    CHECK_MSG(once == 48 && twice == 0, "%d samples once, %d more than once", once, twice);
    /* a position the world size cannot take is named */
    fg_dataloader *dl = loader(ds, 2, 0, 3, 1, 0);
    CHECK(dl != NULL);
    if (dl) {
        CHECK(fg_dataloader_set_sample_position(dl, 0, 8) == FG_EINVAL);
        CHECK(strstr(fg_last_error(), "multiple of 6") != NULL);
        CHECK(fg_dataloader_set_sample_position(dl, 0, 60) == FG_EINVAL);
        fg_dataloader_free(dl);
    }
    fg_dataset_free(ds);
}
