/* Iterable (streaming) datasets: over 1, 2 and 3 ranks and 0-2 workers every
 * sample of an epoch is in exactly one batch (counted), the batches come in
 * PyTorch's round-robin order over the workers, the batch count is known
 * from the length or discovered, a resume at every batch of an epoch gives
 * exactly the remaining batches, with and without the stream's skip, and a
 * stream's failure comes at its place. */
#include <stdint.h>

#include "data/data_impl.h"
#include "fulgur/data.h"
#include "harness.h"

typedef struct src {
    int64_t n;
    bool known, with_skip;
    int64_t fail_at; /* -1: never; in epoch 0 only */
} src;
typedef struct iter {
    int64_t k, epoch;
} iter;

static void s_spec(void *ud, fg_sample_spec *x, fg_sample_spec *y) {
    (void)ud;
    *x = (fg_sample_spec){.dtype = FG_F32, .ndim = 1, .shape = {2}};
    *y = (fg_sample_spec){.dtype = FG_I32};
}
static int64_t s_len(void *ud) {
    src *s = ud;
    return s->known ? s->n : -1;
}
static fg_status s_open(void *ud, int64_t epoch, void **it) {
    (void)ud;
    iter *i = malloc(sizeof *i);
    if (!i) return FG_ENOMEM;
    *i = (iter){0, epoch};
    *it = i;
    return FG_OK;
}
static fg_status s_next(void *ud, void *it, void *x, void *y, bool *end) {
    src *s = ud;
    iter *i = it;
    if (i->k >= s->n) {
        *end = true;
        return FG_OK;
    }
    if (i->epoch == 0 && i->k == s->fail_at)
        return fg_error(FG_EIO, "sample %lld is unreadable", (long long)i->k);
    ((float *)x)[0] = (float)i->k;
    ((float *)x)[1] = (float)i->epoch;
    *(int32_t *)y = (int32_t)i->k;
    i->k++;
    return FG_OK;
}
static fg_status s_skip(void *ud, void *it, int64_t n, int64_t *skipped) {
    src *s = ud;
    iter *i = it;
    *skipped = FG_MIN(n, s->n - i->k);
    i->k += *skipped;
    return FG_OK;
}
static void s_close(void *ud, void *it) {
    (void)ud;
    free(it);
}

static fg_stream *make(src *s) {
    fg_stream_ops ops = {s_spec,  s_len, s_open, s_next, s->with_skip ? s_skip : NULL,
                         s_close, NULL};
    fg_stream *st = fg_stream_new(&ops, s, "counting");
    CHECK_MSG(st != NULL, "%s", fg_last_error());
    return st;
}

/* Every sample once over the ranks, batches within size, values right. */
static void count_epoch(int64_t n, int world, int workers, int64_t batch, bool drop_last,
                        bool with_skip, bool known) {
    src s = {.n = n, .known = known, .with_skip = with_skip, .fail_at = -1};
    fg_stream *st = make(&s);
    if (!st) return;
    int64_t *seen = calloc((size_t)n + 1, sizeof *seen);
    int64_t total = 0, kept_max = 0;
    for (int64_t epoch = 0; epoch < 2; epoch++) {
        memset(seen, 0, (size_t)(n + 1) * sizeof *seen);
        total = 0;
        for (int r = 0; r < world; r++) {
            fg_stream_loader *l =
                fg_stream_loader_new(st, &(fg_stream_loader_opts){.batch = batch,
                                                                  .drop_last = drop_last,
                                                                  .num_workers = workers,
                                                                  .rank = r,
                                                                  .world = world});
            CHECK_MSG(l != NULL, "%s", fg_last_error());
            if (!l) continue;
            if (epoch) CHECK_OK(fg_stream_loader_set_epoch(l, epoch));
            int64_t want_len = fg_stream_loader_len(l), nb = 0;
            CHECK(known ? want_len >= 0 : want_len == -1);
            for (fg_batch *b; (b = fg_stream_loader_next(l)) != NULL; nb++) {
                CHECK(b->size >= 1 && b->size <= batch && b->index == nb && b->epoch == epoch);
                if (drop_last) CHECK(b->size == batch);
                const float *x = fg_tensor_data(b->x);
                const int32_t *y = fg_tensor_data(b->y);
                CHECK(fg_tensor_shape(b->x)[0] == b->size && fg_tensor_shape(b->x)[1] == 2);
                for (int64_t j = 0; j < b->size; j++) {
                    int64_t k = b->indices[j];
                    CHECK(k >= 0 && k < n);
                    if (k < 0 || k >= n) continue;
                    /* this rank's shards only: k % (world W) in [r W, r W + W) */
                    int64_t W = workers ? workers : 1;
                    CHECK((k % (world * W)) / W == r);
                    seen[k]++;
                    CHECK(x[j * 2] == (float)k && x[j * 2 + 1] == (float)epoch && y[j] == k);
                }
                total += b->size;
            }
            CHECK_OK(fg_stream_loader_status(l));
            if (known)
                CHECK_MSG(nb == want_len, "rank %d: %lld batches, len %lld", r, (long long)nb,
                          (long long)want_len);
            CHECK(fg_stream_loader_len(l) == nb); /* discovered, or the same as known */
            CHECK(fg_stream_loader_next(l) == NULL);
            fg_stream_loader_free(l);
        }
        int twice = 0, missed = 0;
        for (int64_t k = 0; k < n; k++) {
            twice += seen[k] > 1;
            missed += seen[k] == 0;
        }
        CHECK_MSG(twice == 0, "n=%lld world=%d workers=%d: %d samples seen twice", (long long)n,
                  world, workers, twice);
        if (!drop_last)
            CHECK_MSG(missed == 0 && total == n,
                      "n=%lld world=%d workers=%d batch=%lld: %d "
                      "samples missed",
                      (long long)n, world, workers, (long long)batch, missed);
        else kept_max = total;
    }
    if (drop_last) { /* each shard keeps whole batches only */
        int64_t W = workers ? workers : 1, S = world * W, want = 0;
        for (int64_t g = 0; g < S; g++) want += (n > g ? (n - g + S - 1) / S : 0) / batch * batch;
        CHECK(kept_max == want);
    }
    free(seen);
    fg_stream_free(st);
}

TEST(stream_every_sample_once_over_ranks_and_workers) {
    for (int world = 1; world <= 3; world++)
        for (int workers = 0; workers <= 2; workers++) {
            count_epoch(101, world, workers, 4, false, true, true);
            count_epoch(101, world, workers, 4, false, false, false);
            count_epoch(5, world, workers, 3, false, true, true); /* fewer samples than shards */
            count_epoch(101, world, workers, 4, true, true, true);
            count_epoch(1, world, workers, 1, false, false, true);
        }
}

static void check_order(int64_t n, int world, int rank, int workers, int64_t batch,
                        const int64_t *want, const int64_t *sizes, int nb) {
    src s = {.n = n, .known = true, .with_skip = true, .fail_at = -1};
    fg_stream *st = make(&s);
    fg_stream_loader *l = fg_stream_loader_new(
        st, &(fg_stream_loader_opts){
                .batch = batch, .num_workers = workers, .rank = rank, .world = world});
    int got = 0;
    for (fg_batch *b; l && (b = fg_stream_loader_next(l)) != NULL; got++) {
        CHECK(got < nb && b->size == sizes[got]);
        for (int64_t j = 0; got < nb && j < b->size; j++) CHECK(b->indices[j] == *want++);
    }
    CHECK(got == nb);
    fg_stream_loader_free(l);
    fg_stream_free(st);
}

TEST(stream_round_robin_order_as_pytorch) {
    /* 2 workers: worker 0 has 0 2 4 6 8, worker 1 has 1 3 5 7 9 */
    check_order(10, 1, 0, 2, 2, (int64_t[]){0, 2, 1, 3, 4, 6, 5, 7, 8, 9},
                (int64_t[]){2, 2, 2, 2, 1, 1}, 6);
    /* worker 1 runs out first, worker 0 goes on alone */
    check_order(9, 1, 0, 2, 2, (int64_t[]){0, 2, 1, 3, 4, 6, 5, 7, 8}, (int64_t[]){2, 2, 2, 2, 1},
                5);
    /* rank 1 of 2 with 2 workers: shards 2 and 3 of 4 */
    check_order(12, 2, 1, 2, 2, (int64_t[]){2, 6, 3, 7, 10, 11}, (int64_t[]){2, 2, 1, 1}, 4);
    /* synchronous rank 2 of 3: shard 2 of 3 */
    check_order(10, 3, 2, 0, 2, (int64_t[]){2, 5, 8}, (int64_t[]){2, 1}, 2);
}

typedef struct rec {
    int64_t size, idx[8];
    float x0[8];
} rec;

static void resume_all(int world, int rank, int workers, int64_t batch, bool drop_last,
                       bool with_skip) {
    src s = {.n = 50, .known = false, .with_skip = with_skip, .fail_at = -1};
    fg_stream *st = make(&s);
    fg_stream_loader_opts o = {.batch = batch,
                               .drop_last = drop_last,
                               .num_workers = workers,
                               .rank = rank,
                               .world = world};
    fg_stream_loader *a = fg_stream_loader_new(st, &o), *b = fg_stream_loader_new(st, &o);
    CHECK(a && b);
    rec all[64];
    int nb = 0;
    CHECK_OK(fg_stream_loader_set_epoch(a, 1));
    for (fg_batch *x; a && (x = fg_stream_loader_next(a)) != NULL && nb < 64; nb++) {
        all[nb].size = x->size;
        for (int64_t j = 0; j < x->size; j++) {
            all[nb].idx[j] = x->indices[j];
            all[nb].x0[j] = ((float *)fg_tensor_data(x->x))[j * 2 + 1];
        }
    }
    for (int k = 0; b && k <= nb; k++) {
        CHECK_OK(fg_stream_loader_set_position(b, 1, k));
        int64_t e, pos;
        fg_stream_loader_position(b, &e, &pos);
        CHECK(e == 1 && pos == k);
        int j = k;
        for (fg_batch *x; (x = fg_stream_loader_next(b)) != NULL; j++) {
            CHECK_MSG(j < nb && x->size == all[j].size && x->index == j,
                      "resume at %d: batch %d differs", k, j);
            for (int64_t q = 0; j < nb && q < x->size; q++)
                CHECK(x->indices[q] == all[j].idx[q] &&
                      ((float *)fg_tensor_data(x->x))[q * 2 + 1] == all[j].x0[q]);
            if (j >= nb) break;
        }
        CHECK_MSG(j == nb, "resume at %d: %d batches, want %d", k, j, nb);
    }
    if (b) {
        CHECK_STATUS(fg_stream_loader_set_position(b, 1, nb + 1), FG_EINVAL);
        CHECK_CONTAINS(fg_last_error(), "is past its end");
        CHECK(fg_stream_loader_next(b) == NULL && fg_stream_loader_status(b) == FG_EINVAL);
        CHECK_OK(fg_stream_loader_set_epoch(b, 0));
        CHECK(fg_stream_loader_next(b) != NULL);
    }
    fg_stream_loader_free(a);
    fg_stream_loader_free(b);
    fg_stream_free(st);
}

TEST(stream_resume_mid_epoch_exactly) {
    for (int workers = 0; workers <= 2; workers++) {
        resume_all(1, 0, workers, 3, false, true);
        resume_all(2, 1, workers, 3, false, false);
        resume_all(3, 2, workers, 4, true, true);
        resume_all(3, 0, workers, 5, false, false);
    }
}

TEST(stream_failure_comes_at_its_place) {
    for (int workers = 0; workers <= 2; workers++) {
        src s = {.n = 40, .known = true, .with_skip = true, .fail_at = 13};
        fg_stream *st = make(&s);
        fg_stream_loader *l =
            fg_stream_loader_new(st, &(fg_stream_loader_opts){.batch = 4, .num_workers = workers});
        CHECK(l != NULL);
        if (!l) continue;
        int nb = 0, W = workers ? workers : 1;
        for (fg_batch *b; (b = fg_stream_loader_next(l)) != NULL; nb++)
            for (int64_t j = 0; j < b->size; j++) CHECK(b->indices[j] != 13);
        /* sample 13 is in shard 13 % W's batch 13 / W / 4: the batches before it in round
         * robin order all come first */
        int shard = 13 % W, within = 13 / W / 4;
        CHECK_MSG(nb == within * W + shard, "workers %d: %d batches before the failure", workers,
                  nb);
        CHECK(fg_stream_loader_status(l) == FG_EIO);
        CHECK_CONTAINS(fg_last_error(), "stream counting: worker");
        CHECK_CONTAINS(fg_last_error(), "epoch 0: sample 13 is unreadable");
        CHECK(fg_stream_loader_next(l) == NULL);
        CHECK_CONTAINS(fg_last_error(), "sample 13 is unreadable");
        CHECK_OK(fg_stream_loader_set_epoch(l, 1)); /* epoch 1 reads it */
        int64_t total = 0;
        for (fg_batch *b; (b = fg_stream_loader_next(l)) != NULL;) total += b->size;
        CHECK(total == 40 && fg_stream_loader_status(l) == FG_OK);
        fg_stream_loader_free(l);
        fg_stream_free(st);
    }
}

TEST(stream_bad_options) {
    src s = {.n = 4, .fail_at = -1};
    fg_stream *st = make(&s);
    CHECK(fg_stream_loader_new(st, &(fg_stream_loader_opts){.rank = 2, .world = 2}) == NULL);
    CHECK_CONTAINS(fg_last_error(), "rank=2 world=2");
    CHECK(fg_stream_loader_new(st, &(fg_stream_loader_opts){.batch = -1}) == NULL);
    CHECK(fg_stream_new(&(fg_stream_ops){.spec = s_spec}, NULL, "x") == NULL);
    CHECK_CONTAINS(fg_last_error(), "spec, open and next must be set");
    fg_stream_free(st);
}
