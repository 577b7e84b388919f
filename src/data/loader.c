/* The loader: batches of samples in the order a sampler gives, read either
 * on the caller's thread inside fg_dataloader_next (num_workers == 0) or by
 * worker threads ahead of it.
 *
 * Slots: S = prefetch + 1 batch buffers (1 when synchronous); batch k lives
 * in slot k % S. `released` is the first batch the caller may still hold:
 * batches below it are free. A worker takes batch k = next_fill (in order,
 * under the lock) only while k < released + S, i.e. while its slot holds
 * nothing the caller can see; so the caller's batch is never overwritten and
 * at most S - 1 batches are prepared ahead.
 *
 * Repositioning (set_epoch, reset, set_position, set_sampler) sets `pausing`
 * so no worker takes new work, waits until no fill is running (busy == 0),
 * then swaps the order and counters; workers read the order and the dataset
 * without the lock only while busy, so they never see a half-made change.
 *
 * A failed read marks its slot FAILED with the worker's message and stops
 * further work; the caller gets the batches before it, then the error at
 * exactly the batch where the synchronous loader would have failed. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "data_impl.h"
#include "tensor/tensor_impl.h"

#define MSG_MAX 1024
#define MAX_WORKERS 256
#define MAX_PREFETCH 4096

enum { SLOT_EMPTY, SLOT_READY, SLOT_FAILED };

typedef struct slot {
    fg_tensor *x, *y;
    int64_t *idx;
    fg_batch b;
    int64_t batch; /* the batch it holds or is being filled with; -1 none */
    int state;
    fg_status st;
    char msg[MSG_MAX];
} slot;

typedef struct worker {
    struct fg_dataloader *dl;
    int id;
} worker;

struct fg_dataloader {
    fg_dataset *ds;
    fg_loader_opts opts;
    int64_t B;
    fg_sampler *sampler;
    int64_t epoch;
    int64_t n, nreal, nbatches;
    int64_t *order; /* n dataset indices of this epoch */
    int nslots;
    slot *slots;
    int64_t cur;    /* next batch to return */
    uint64_t moves; /* repositionings so far (fg__dataloader_moves) */
    fg_status status;
    char errmsg[MSG_MAX];

    int nworkers, nstarted;
    pthread_t *th;
    worker *wk;
    bool sync_init;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    bool stop, failed, pausing;
    int busy;
    int64_t next_fill, released;

    /* a fields loader's own: next collates through it (which reads the
     * samples with fg__dataloader_next_samples) */
    fg_fields_loader *fields;
    fg_batch fb;

    /* fg_dataloader_from_stream: every call goes to the stream loader */
    fg_stream *stream;
    fg_stream_loader *sl;
    fg_stream_loader_opts sopts;
};

static _Thread_local const fg_worker_info *tl_info;

const fg_worker_info *fg_data_worker_info(void) { return tl_info; }

/* --------------------------------------------------------------- filling */

static FG_MUST_USE fg_status fill(fg_dataloader *dl, slot *s, int64_t k, int worker_id) {
    fg_dataset *ds = dl->ds;
    int64_t start = k * dl->B, size = FG_MIN(dl->B, dl->n - start);
    if (s->x->shape[0] != size) {
        int64_t shape[FG_MAX_DIMS] = {size};
        memcpy(shape + 1, ds->x.shape, (size_t)ds->x.ndim * sizeof(int64_t));
        FG_TRY(fg__tensor_init_shape(s->x, ds->x.dtype, ds->x.ndim + 1, shape));
        memcpy(shape + 1, ds->y.shape, (size_t)ds->y.ndim * sizeof(int64_t));
        FG_TRY(fg__tensor_init_shape(s->y, ds->y.dtype, ds->y.ndim + 1, shape));
    }
    int rank = fg_sampler_rank(dl->sampler);
    uint64_t sroot = fg_rng_derive(dl->opts.seed ^ 0x53414D504C45ULL, (uint64_t)dl->epoch);
    fg_worker_info info = {
        .id = worker_id,
        .num_workers = dl->nworkers,
        .rank = rank,
        .seed = fg_rng_derive(fg_rng_derive(dl->opts.seed, (uint64_t)rank), (uint64_t)worker_id),
        .epoch = dl->epoch,
    };
    char *x = fg_tensor_data(s->x), *y = fg_tensor_data(s->y);
    fg_status st = FG_OK;
    tl_info = &info;
    for (int64_t j = 0; j < size; j++) {
        int64_t i = dl->order[start + j];
        s->idx[j] = i;
        info.sample_seed = fg_rng_derive(sroot, (uint64_t)i);
        fg_clear_error();
        st = ds->ops.get(ds->ud, i, x + (size_t)j * ds->xbytes, y + (size_t)j * ds->ybytes);
        if (st != FG_OK) {
            fg_error_wrap(st, "dataset %s: sample %lld (batch %lld of epoch %lld)", ds->name,
                          (long long)i, (long long)k, (long long)dl->epoch);
            snprintf(s->msg, sizeof s->msg, "%s", fg_last_error());
            break;
        }
    }
    tl_info = NULL;
    s->b = (fg_batch){
        .x = s->x,
        .y = s->y,
        .size = size,
        .valid = FG_MAX(0, FG_MIN(size, dl->nreal - start)),
        .epoch = dl->epoch,
        .index = k,
        .indices = s->idx,
    };
    return st;
}

static void *worker_main(void *arg) {
    worker *w = arg;
    fg_dataloader *dl = w->dl;
    pthread_mutex_lock(&dl->mu);
    while (!dl->stop) {
        if (!dl->pausing && !dl->failed && dl->next_fill < dl->nbatches &&
            dl->next_fill < dl->released + dl->nslots) {
            int64_t k = dl->next_fill++;
            slot *s = &dl->slots[k % dl->nslots];
            s->batch = k;
            s->state = SLOT_EMPTY;
            dl->busy++;
            pthread_mutex_unlock(&dl->mu);
            fg_status st = fill(dl, s, k, w->id);
            pthread_mutex_lock(&dl->mu);
            dl->busy--;
            s->st = st;
            s->state = st == FG_OK ? SLOT_READY : SLOT_FAILED;
            if (st != FG_OK) dl->failed = true;
            pthread_cond_broadcast(&dl->cv_done);
        } else {
            pthread_cond_wait(&dl->cv_work, &dl->mu);
        }
    }
    pthread_mutex_unlock(&dl->mu);
    return NULL;
}

/* ----------------------------------------------------------- positioning */

/* The order of `epoch` from sampler s, checked against the dataset. */
static FG_MUST_USE fg_status make_order(fg_dataloader *dl, fg_sampler *s, int64_t epoch,
                                        int64_t **out) {
    int64_t n = fg_sampler_len(s);
    int64_t *o = fg_alloc((size_t)(n ? n : 1) * sizeof *o);
    if (!o) return FG_ENOMEM;
    fg_status st = fg_sampler_indices(s, epoch, o);
    if (st != FG_OK) {
        fg_free(o);
        return fg_error_wrap(st, "dataloader: sampler, epoch %lld", (long long)epoch);
    }
    for (int64_t j = 0; j < n; j++)
        if (o[j] < 0 || o[j] >= dl->ds->len) {
            st = fg_error(FG_EINVAL,
                          "dataloader: the sampler gave index %lld at position %lld of epoch %lld, "
                          "outside dataset %s of %lld samples",
                          (long long)o[j], (long long)j, (long long)epoch, dl->ds->name,
                          (long long)dl->ds->len);
            fg_free(o);
            return st;
        }
    *out = o;
    return FG_OK;
}

/* Moves to (epoch, batch) with `order` (consumed; NULL keeps the current one)
 * and, if s is not NULL, a new sampler (consumed; the old one is freed). */
static void reposition(fg_dataloader *dl, int64_t epoch, int64_t batch, int64_t *order,
                       fg_sampler *s) {
    dl->moves++;
    if (dl->nworkers) {
        pthread_mutex_lock(&dl->mu);
        dl->pausing = true;
        while (dl->busy > 0) pthread_cond_wait(&dl->cv_done, &dl->mu);
    }
    if (s) {
        fg_sampler_free(dl->sampler);
        dl->sampler = s;
        dl->n = fg_sampler_len(s);
        dl->nreal = fg_sampler_num_real(s);
        dl->nbatches = dl->opts.drop_last ? dl->n / dl->B : (dl->n + dl->B - 1) / dl->B;
    }
    if (order) {
        fg_free(dl->order);
        dl->order = order;
    }
    dl->epoch = epoch;
    dl->cur = dl->released = dl->next_fill = FG_MIN(batch, dl->nbatches);
    dl->status = FG_OK;
    dl->errmsg[0] = '\0';
    dl->failed = false;
    for (int i = 0; i < dl->nslots; i++) {
        dl->slots[i].batch = -1;
        dl->slots[i].state = SLOT_EMPTY;
    }
    if (dl->nworkers) {
        dl->pausing = false;
        pthread_cond_broadcast(&dl->cv_work);
        pthread_mutex_unlock(&dl->mu);
    }
}

fg_status fg_dataloader_set_position(fg_dataloader *dl, int64_t epoch, int64_t batch) {
    if (!dl) return fg_error(FG_EINVAL, "fg_dataloader_set_position: NULL loader");
    if (dl->sl) {
        dl->moves++;
        return fg_stream_loader_set_position(dl->sl, epoch, batch);
    }
    if (epoch < 0)
        return fg_error(FG_EINVAL, "dataloader: epoch %lld (must be >= 0)", (long long)epoch);
    if (batch < 0 || batch > dl->nbatches)
        return fg_error(FG_EINVAL,
                        "dataloader: batch %lld of epoch %lld is outside [0, %lld]: was the "
                        "position saved with another dataset, batch size or world size?",
                        (long long)batch, (long long)epoch, (long long)dl->nbatches);
    dl->moves++; /* even when already there: the caller asked to move */
    /* already there (set_epoch(0) right after creation): keep what the
     * workers prepared */
    if (epoch == dl->epoch && batch == dl->cur && dl->status == FG_OK) return FG_OK;
    int64_t *order = NULL;
    if (epoch != dl->epoch) FG_TRY(make_order(dl, dl->sampler, epoch, &order));
    reposition(dl, epoch, batch, order, NULL);
    return FG_OK;
}

fg_status fg_dataloader_set_epoch(fg_dataloader *dl, int64_t epoch) {
    return fg_dataloader_set_position(dl, epoch, 0);
}

fg_status fg_dataloader_reset(fg_dataloader *dl) {
    if (!dl) return fg_error(FG_EINVAL, "fg_dataloader_reset: NULL loader");
    int64_t epoch = dl->epoch;
    if (dl->sl) fg_stream_loader_position(dl->sl, &epoch, NULL);
    return fg_dataloader_set_position(dl, epoch, 0);
}

fg_status fg_dataloader_set_sampler(fg_dataloader *dl, fg_sampler *s) {
    if (!dl) {
        fg_sampler_free(s);
        return fg_error(FG_EINVAL, "fg_dataloader_set_sampler: NULL loader");
    }
    if (!s) /* keeps the message of the sampler constructor that failed */
        return fg_error_wrap(fg_last_status() ? fg_last_status() : FG_EINVAL,
                             "fg_dataloader_set_sampler: NULL sampler");
    if (dl->sl) {
        fg_sampler_free(s);
        return fg_error(FG_EUNSUPPORTED,
                        "dataloader over stream \"%s\": a stream takes no sampler (its samples "
                        "come in their order); it is split by rank by fg_dataloader_split_stream "
                        "(fg_fabric_setup_dataloader does it)",
                        dl->stream->name);
    }
    int64_t *order = NULL;
    fg_status st = make_order(dl, s, dl->epoch, &order);
    if (st != FG_OK) {
        fg_sampler_free(s);
        return st;
    }
    reposition(dl, dl->epoch, 0, order, s);
    return FG_OK;
}

void fg_dataloader_position(const fg_dataloader *dl, int64_t *epoch, int64_t *batch) {
    if (dl->sl) {
        fg_stream_loader_position(dl->sl, epoch, batch);
        return;
    }
    if (epoch) *epoch = dl->epoch;
    if (batch) *batch = dl->cur;
}

static int world_of(const fg_dataloader *dl) {
    if (dl->sl) return dl->sopts.world ? dl->sopts.world : 1;
    return fg_sampler_world(dl->sampler);
}

void fg_dataloader_sample_position(const fg_dataloader *dl, int64_t *epoch, int64_t *samples) {
    int64_t e = dl->epoch, cur = dl->cur;
    if (dl->sl) fg_stream_loader_position(dl->sl, &e, &cur);
    if (epoch) *epoch = e;
    if (samples) *samples = cur * dl->B * (int64_t)world_of(dl);
}

fg_status fg_dataloader_set_sample_position(fg_dataloader *dl, int64_t epoch, int64_t samples) {
    if (!dl) return fg_error(FG_EINVAL, "fg_dataloader_set_sample_position: NULL loader");
    if (dl->sl) { /* batches of every rank: the same split resumes at a batch */
        int64_t step = dl->B * (int64_t)world_of(dl);
        if (samples < 0 || samples % step != 0)
            return fg_error(FG_EINVAL,
                            "dataloader over stream \"%s\": %lld samples into epoch %lld is no "
                            "position of batch %lld on %d rank%s: a stream resumes with the batch "
                            "size and world size it was saved with",
                            dl->stream->name, (long long)samples, (long long)epoch,
                            (long long)dl->B, world_of(dl), world_of(dl) == 1 ? "" : "s");
        return fg_dataloader_set_position(dl, epoch, samples / step);
    }
    int world = fg_sampler_world(dl->sampler);
    int64_t step = dl->B * (int64_t)world;
    if (samples < 0 || samples % step != 0 || samples / step > dl->nbatches)
        return fg_error(FG_EINVAL,
                        "dataloader: %lld samples into epoch %lld cannot be a position on %d "
                        "rank%s with batch %lld: expected a multiple of %lld (batch x ranks) up to "
                        "%lld; resume with a batch size and world size whose product divides it",
                        (long long)samples, (long long)epoch, world, world == 1 ? "" : "s",
                        (long long)dl->B, (long long)step, (long long)(dl->nbatches * step));
    return fg_dataloader_set_position(dl, epoch, samples / step);
}

/* ------------------------------------------------------------- next */

static fg_batch *failed(fg_dataloader *dl) {
    fg_error(dl->status, "%s", dl->errmsg);
    return NULL;
}

fg_batch *fg_dataloader_next(fg_dataloader *dl) {
    if (!dl) {
        fg_error(FG_EINVAL, "fg_dataloader_next: NULL loader");
        return NULL;
    }
    if (dl->sl) return fg_stream_loader_next(dl->sl);
    if (dl->fields) {
        fg_fields_batch *fb = fg_fields_loader_next(dl->fields);
        if (!fb) return NULL;
        dl->fb = (fg_batch){.x = fb->nfields > 0 ? fb->tensors[0] : NULL,
                            .y = fb->nfields > 1 ? fb->tensors[1] : NULL,
                            .size = fb->size,
                            .valid = fb->valid,
                            .epoch = fb->epoch,
                            .index = fb->index,
                            .indices = fb->indices,
                            .fields = fb};
        return &dl->fb;
    }
    return fg__dataloader_next_samples(dl);
}

fg_batch *fg__dataloader_next_samples(fg_dataloader *dl) {
    if (dl->status != FG_OK) return failed(dl);
    if (!dl->nworkers) {
        if (dl->cur >= dl->nbatches) return NULL;
        slot *s = &dl->slots[0];
        fg_status st = fill(dl, s, dl->cur, 0);
        if (st != FG_OK) {
            dl->status = st;
            snprintf(dl->errmsg, sizeof dl->errmsg, "%s", s->msg);
            return failed(dl);
        }
        dl->cur++;
        return &s->b;
    }
    pthread_mutex_lock(&dl->mu);
    dl->released = dl->cur;
    pthread_cond_broadcast(&dl->cv_work);
    if (dl->cur >= dl->nbatches) {
        pthread_mutex_unlock(&dl->mu);
        return NULL;
    }
    slot *s = &dl->slots[dl->cur % dl->nslots];
    while (s->batch != dl->cur || s->state == SLOT_EMPTY) pthread_cond_wait(&dl->cv_done, &dl->mu);
    if (s->state == SLOT_FAILED) {
        dl->status = s->st;
        snprintf(dl->errmsg, sizeof dl->errmsg, "%s", s->msg);
        pthread_mutex_unlock(&dl->mu);
        return failed(dl);
    }
    dl->cur++;
    pthread_mutex_unlock(&dl->mu);
    return &s->b;
}

uint64_t fg__dataloader_moves(const fg_dataloader *dl) { return dl->moves; }
void fg__dataloader_set_fields(fg_dataloader *dl, fg_fields_loader *fl) { dl->fields = fl; }

fg_status fg_dataloader_status(const fg_dataloader *dl) {
    if (dl && dl->sl) return fg_stream_loader_status(dl->sl);
    if (dl && dl->fields) {
        fg_status cs = fg__fields_loader_collate_status(dl->fields);
        if (cs != FG_OK) return cs;
    }
    return dl ? dl->status : FG_EINVAL;
}
int64_t fg_dataloader_len(const fg_dataloader *dl) {
    return dl->sl ? fg_stream_loader_len(dl->sl) : dl->nbatches;
}
int64_t fg_dataloader_num_samples(const fg_dataloader *dl) {
    if (!dl->sl) return dl->n;
    int64_t len = dl->stream->ops.len ? dl->stream->ops.len(dl->stream->ud) : -1;
    return len < 0 ? -1 : (len + world_of(dl) - 1) / world_of(dl);
}
fg_dataset *fg_dataloader_dataset(const fg_dataloader *dl) { return dl->ds; }
const fg_loader_opts *fg_dataloader_opts(const fg_dataloader *dl) { return &dl->opts; }
const fg_sampler *fg_dataloader_sampler(const fg_dataloader *dl) { return dl->sampler; }

/* ------------------------------------------------------- new and free */

fg_dataloader *fg_dataloader_new(fg_dataset *ds, const fg_loader_opts *o) {
    fg_loader_opts opts = o ? *o : (fg_loader_opts){0};
    if (!opts.seed) opts.seed = fg_default_seed();
    if (!ds) {
        fg_error(FG_EINVAL, "fg_dataloader_new: NULL dataset");
        return NULL;
    }
    if (opts.batch < 0) {
        fg_error(FG_EINVAL, "dataloader: batch=%lld: expected a batch size >= 1 (0 = 1)",
                 (long long)opts.batch);
        return NULL;
    }
    if (opts.num_workers < 0 || opts.num_workers > MAX_WORKERS) {
        fg_error(FG_EINVAL, "dataloader: num_workers=%d: expected 0..%d", opts.num_workers,
                 MAX_WORKERS);
        return NULL;
    }
    if (opts.prefetch < 0 || opts.prefetch > MAX_PREFETCH) {
        fg_error(FG_EINVAL, "dataloader: prefetch=%d: expected 0..%d", opts.prefetch, MAX_PREFETCH);
        return NULL;
    }
    fg_dataloader *dl = fg_calloc(1, sizeof *dl);
    if (!dl) return NULL;
    dl->ds = ds;
    dl->opts = opts;
    dl->B = opts.batch ? opts.batch : 1;
    dl->nworkers = opts.num_workers;
    dl->nslots = dl->nworkers ? (opts.prefetch ? opts.prefetch : 2 * dl->nworkers) + 1 : 1;
    fg_sampler *s =
        opts.shuffle ? fg_sampler_random(ds->len, opts.seed) : fg_sampler_sequential(ds->len);
    if (!s) goto fail;
    dl->sampler = s;
    dl->n = fg_sampler_len(s);
    dl->nreal = fg_sampler_num_real(s);
    dl->nbatches = opts.drop_last ? dl->n / dl->B : (dl->n + dl->B - 1) / dl->B;
    if (make_order(dl, s, 0, &dl->order) != FG_OK) goto fail;
    if (!(dl->slots = fg_calloc((size_t)dl->nslots, sizeof *dl->slots))) goto fail;
    for (int i = 0; i < dl->nslots; i++) {
        slot *sl = &dl->slots[i];
        int64_t shape[FG_MAX_DIMS] = {dl->B};
        memcpy(shape + 1, ds->x.shape, (size_t)ds->x.ndim * sizeof(int64_t));
        if (!(sl->x = fg_tensor_new(ds->x.dtype, ds->x.ndim + 1, shape))) goto fail;
        memcpy(shape + 1, ds->y.shape, (size_t)ds->y.ndim * sizeof(int64_t));
        if (!(sl->y = fg_tensor_new(ds->y.dtype, ds->y.ndim + 1, shape))) goto fail;
        if (!(sl->idx = fg_alloc((size_t)dl->B * sizeof(int64_t)))) goto fail;
        sl->batch = -1;
    }
    if (dl->nworkers) {
        if (pthread_mutex_init(&dl->mu, NULL) != 0) goto fail_sync;
        if (pthread_cond_init(&dl->cv_work, NULL) != 0) {
            pthread_mutex_destroy(&dl->mu);
            goto fail_sync;
        }
        if (pthread_cond_init(&dl->cv_done, NULL) != 0) {
            pthread_cond_destroy(&dl->cv_work);
            pthread_mutex_destroy(&dl->mu);
            goto fail_sync;
        }
        dl->sync_init = true;
        dl->th = fg_calloc((size_t)dl->nworkers, sizeof *dl->th);
        dl->wk = fg_calloc((size_t)dl->nworkers, sizeof *dl->wk);
        if (!dl->th || !dl->wk) goto fail;
        for (int i = 0; i < dl->nworkers; i++) {
            dl->wk[i] = (worker){dl, i};
            int e = pthread_create(&dl->th[i], NULL, worker_main, &dl->wk[i]);
            if (e != 0) {
                fg_error(FG_EIO, "dataloader: cannot start worker thread %d of %d: %s", i,
                         dl->nworkers, strerror(e));
                goto fail;
            }
            dl->nstarted++;
        }
    }
    return dl;
fail_sync:
    fg_error(FG_EIO, "dataloader: cannot create a mutex or condition variable");
fail:
    fg_dataloader_free(dl);
    return NULL;
}

/* ------------------------------------------------------------ streams */

fg_dataloader *fg_dataloader_from_stream(fg_stream *s, const fg_stream_loader_opts *o) {
    if (!s) {
        fg_error(FG_EINVAL, "fg_dataloader_from_stream: NULL stream");
        return NULL;
    }
    fg_dataloader *dl = fg_calloc(1, sizeof *dl);
    if (!dl) {
        fg_error(FG_ENOMEM, "fg_dataloader_from_stream");
        return NULL;
    }
    dl->stream = s;
    dl->sopts = o ? *o : (fg_stream_loader_opts){0};
    dl->B = dl->sopts.batch > 0 ? dl->sopts.batch : 1;
    dl->opts = (fg_loader_opts){.batch = dl->B,
                                .drop_last = dl->sopts.drop_last,
                                .num_workers = dl->sopts.num_workers,
                                .prefetch = dl->sopts.prefetch};
    if (!(dl->sl = fg_stream_loader_new(s, &dl->sopts))) {
        fg_free(dl);
        return NULL;
    }
    return dl;
}

bool fg_dataloader_is_stream(const fg_dataloader *dl) { return dl && dl->sl; }

bool fg_dataloader_len_known(const fg_dataloader *dl) {
    return dl && (!dl->sl || (dl->stream->ops.len && dl->stream->ops.len(dl->stream->ud) >= 0));
}

fg_status fg_dataloader_split_stream(fg_dataloader *dl, int rank, int world) {
    if (!dl || !dl->sl)
        return fg_error(FG_EINVAL, "fg_dataloader_split_stream: %s",
                        dl ? "the loader is not over a stream" : "NULL loader");
    fg_stream_loader_opts o = dl->sopts;
    o.rank = rank;
    o.world = world;
    fg_stream_loader *fresh = fg_stream_loader_new(dl->stream, &o);
    if (!fresh) return fg_last_status();
    fg_stream_loader_free(dl->sl);
    dl->sl = fresh;
    dl->sopts = o;
    dl->moves++;
    return FG_OK;
}

void fg_dataloader_free(fg_dataloader *dl) {
    if (!dl) return;
    fg_error_kept kept; /* a _free never changes the caller's error (core.h) */
    fg_error_keep(&kept);
    if (dl->sl) {
        fg_stream_loader_free(dl->sl);
        fg_free(dl);
        fg_error_restore(&kept);
        return;
    }
    if (dl->sync_init) {
        pthread_mutex_lock(&dl->mu);
        dl->stop = true;
        pthread_cond_broadcast(&dl->cv_work);
        pthread_mutex_unlock(&dl->mu);
        for (int i = 0; i < dl->nstarted; i++) pthread_join(dl->th[i], NULL);
        pthread_cond_destroy(&dl->cv_done);
        pthread_cond_destroy(&dl->cv_work);
        pthread_mutex_destroy(&dl->mu);
    }
    if (dl->slots)
        for (int i = 0; i < dl->nslots; i++) {
            fg_tensor_free(dl->slots[i].x);
            fg_tensor_free(dl->slots[i].y);
            fg_free(dl->slots[i].idx);
        }
    fg_free(dl->slots);
    fg_free(dl->th);
    fg_free(dl->wk);
    fg_free(dl->order);
    fg_sampler_free(dl->sampler);
    fg_free(dl);
    fg_error_restore(&kept);
}
