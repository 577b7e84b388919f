/* The stream loader: R * W shards of an epoch's stream (rank r's worker w
 * reads shard r * W + w), each worker making its own batches into a ring of
 * P slots, returned round robin over the workers that still have batches.
 *
 * A worker fills slot produced % P only while produced - consumed < P;
 * `consumed` counts batches the caller has released (the one it holds is
 * not), so the caller's batch is never overwritten. A worker that reads a
 * short batch, an empty one or fails sets `ended` (with st) and stops; the
 * caller reaches that in round-robin order, so the batches and the error
 * come at the same place on any thread timing. Repositioning stops and
 * joins the threads, reopens the shards, replays the round robin over the
 * shards passing over samples (the same rule as next, without data) and
 * starts the threads again. With num_workers == 0 the one worker is filled
 * on the caller's thread inside next. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "data_impl.h"
#include "tensor/tensor_impl.h"

#define MSG_MAX 1024
#define MAX_WORKERS 256

typedef struct sslot {
    fg_tensor *x, *y;
    int64_t *idx;
    int64_t size;
} sslot;

typedef struct sworker {
    struct fg_stream_loader *l;
    int id;
    fg__shard sh;
    sslot *slots;
    int64_t produced, consumed;
    bool ended;
    fg_status st;
    char msg[MSG_MAX];
    pthread_t th;
    bool started;
} sworker;

struct fg_stream_loader {
    fg_stream *s;
    fg_stream_loader_opts o;
    int64_t B;
    int W, P;
    bool threaded;
    sworker *w;
    int64_t epoch, cur, len, discovered;
    int rr, held;
    fg_status status;
    char errmsg[MSG_MAX];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop, sync_init;
    fg_batch b;
};

/* Reads worker w's next batch into slot (x NULL: passes over it); *size is
 * its samples, 0 when the shard had none left or drop_last dropped them. */
static FG_MUST_USE fg_status fill(fg_stream_loader *l, sworker *w, sslot *slot, bool skip,
                                  int64_t *size) {
    const fg_stream *s = l->s;
    char *x = skip ? NULL : fg_tensor_data(slot->x), *y = skip ? NULL : fg_tensor_data(slot->y);
    int64_t j = 0, idx;
    for (; j < l->B; j++) {
        bool got;
        fg_status st = fg__shard_next(s, &w->sh, x ? x + (size_t)j * s->xbytes : NULL,
                                      y ? y + (size_t)j * s->ybytes : NULL, &idx, &got);
        if (st != FG_OK)
            return fg_error_wrap(st, "stream %s: worker %d (shard %lld of %lld), epoch %lld",
                                 s->name, w->id, (long long)(l->o.rank * l->W + w->id),
                                 (long long)(l->W * l->o.world), (long long)l->epoch);
        if (!got) break;
        if (slot) slot->idx[j] = idx;
    }
    if (j < l->B && l->o.drop_last) j = 0;
    *size = j;
    if (!skip && j > 0) {
        int64_t shape[FG_MAX_DIMS] = {j};
        memcpy(shape + 1, s->x.shape, (size_t)s->x.ndim * sizeof(int64_t));
        FG_TRY(fg__tensor_init_shape(slot->x, s->x.dtype, s->x.ndim + 1, shape));
        memcpy(shape + 1, s->y.shape, (size_t)s->y.ndim * sizeof(int64_t));
        FG_TRY(fg__tensor_init_shape(slot->y, s->y.dtype, s->y.ndim + 1, shape));
    }
    return FG_OK;
}

/* One fill of worker w's next slot; the caller holds no lock. Returns
 * with w's counters updated under the lock when threaded. */
static void produce(fg_stream_loader *l, sworker *w) {
    sslot *slot = &w->slots[w->produced % l->P];
    int64_t size = 0;
    fg_clear_error();
    fg_status st = fill(l, w, slot, false, &size);
    if (l->threaded) pthread_mutex_lock(&l->mu);
    if (st != FG_OK) {
        w->st = st;
        snprintf(w->msg, sizeof w->msg, "%s", fg_last_error());
        w->ended = true;
    } else {
        slot->size = size;
        if (size > 0) w->produced++;
        if (size < l->B) w->ended = true;
    }
    if (l->threaded) {
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
    }
}

static void *worker_main(void *arg) {
    sworker *w = arg;
    fg_stream_loader *l = w->l;
    pthread_mutex_lock(&l->mu);
    while (!l->stop && !w->ended) {
        if (w->produced - w->consumed >= l->P) {
            pthread_cond_wait(&l->cv, &l->mu);
            continue;
        }
        pthread_mutex_unlock(&l->mu);
        produce(l, w); /* takes and releases the lock itself */
        pthread_mutex_lock(&l->mu);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

static void stop_threads(fg_stream_loader *l) {
    if (!l->threaded) return;
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    for (int k = 0; k < l->W; k++)
        if (l->w[k].started) {
            pthread_join(l->w[k].th, NULL);
            l->w[k].started = false;
        }
    l->stop = false;
}

static FG_MUST_USE fg_status start_threads(fg_stream_loader *l) {
    if (!l->threaded) return FG_OK;
    for (int k = 0; k < l->W; k++) {
        if (pthread_create(&l->w[k].th, NULL, worker_main, &l->w[k]) != 0) {
            stop_threads(l);
            return fg_error(FG_EIO, "stream loader: cannot start worker thread %d", k);
        }
        l->w[k].started = true;
    }
    return FG_OK;
}

/* Reopens every shard at `epoch` and passes over `batch` batches in the
 * order next returns them. Threads are stopped. */
static FG_MUST_USE fg_status rewind_to(fg_stream_loader *l, int64_t epoch, int64_t batch) {
    l->epoch = epoch;
    l->cur = 0;
    l->rr = 0;
    l->held = -1;
    l->status = FG_OK;
    int64_t S = (int64_t)l->W * l->o.world;
    for (int k = 0; k < l->W; k++) {
        sworker *w = &l->w[k];
        w->produced = w->consumed = 0;
        w->ended = false;
        w->st = FG_OK;
        w->msg[0] = '\0';
        FG_TRY(fg__shard_open(l->s, &w->sh, epoch, (int64_t)l->o.rank * l->W + k, S));
    }
    while (l->cur < batch) {
        int k = 0;
        while (k < l->W && l->w[l->rr].ended) {
            l->rr = (l->rr + 1) % l->W;
            k++;
        }
        if (k == l->W)
            return fg_error(FG_EINVAL,
                            "stream %s: batch %lld of epoch %lld is past its end (%lld batches on "
                            "this rank): was the position saved with another stream, batch size, "
                            "worker count or world size?",
                            l->s->name, (long long)batch, (long long)epoch, (long long)l->cur);
        sworker *w = &l->w[l->rr];
        int64_t size;
        FG_TRY(fill(l, w, NULL, true, &size));
        if (size < l->B) w->ended = true;
        if (size == 0) continue;
        l->cur++;
        l->rr = (l->rr + 1) % l->W;
    }
    for (int k = 0; k < l->W; k++) l->w[k].produced = l->w[k].consumed = 0;
    return FG_OK;
}

fg_status fg_stream_loader_set_position(fg_stream_loader *l, int64_t epoch, int64_t batch) {
    if (!l) return fg_error(FG_EINVAL, "fg_stream_loader_set_position: NULL loader");
    if (epoch < 0 || batch < 0)
        return fg_error(FG_EINVAL,
                        "stream loader: position (epoch %lld, batch %lld): both must "
                        "be >= 0",
                        (long long)epoch, (long long)batch);
    stop_threads(l);
    fg_status st = rewind_to(l, epoch, batch);
    if (st != FG_OK) {
        l->status = st;
        snprintf(l->errmsg, sizeof l->errmsg, "%s", fg_last_error());
        return st;
    }
    return start_threads(l);
}

fg_status fg_stream_loader_set_epoch(fg_stream_loader *l, int64_t epoch) {
    return fg_stream_loader_set_position(l, epoch, 0);
}

void fg_stream_loader_position(const fg_stream_loader *l, int64_t *epoch, int64_t *batch) {
    if (epoch) *epoch = l->epoch;
    if (batch) *batch = l->cur;
}

static fg_batch *fail(fg_stream_loader *l) {
    fg_error(l->status, "%s", l->errmsg);
    return NULL;
}

fg_batch *fg_stream_loader_next(fg_stream_loader *l) {
    if (!l) {
        fg_error(FG_EINVAL, "fg_stream_loader_next: NULL loader");
        return NULL;
    }
    if (l->status != FG_OK) return fail(l);
    if (l->threaded) pthread_mutex_lock(&l->mu);
    if (l->held >= 0) {
        l->w[l->held].consumed++;
        l->held = -1;
        if (l->threaded) pthread_cond_broadcast(&l->cv);
    }
    for (int tried = 0; tried < l->W;) {
        sworker *w = &l->w[l->rr];
        if (!l->threaded && w->produced == w->consumed && !w->ended) produce(l, w);
        while (l->threaded && w->produced == w->consumed && !w->ended)
            pthread_cond_wait(&l->cv, &l->mu);
        if (w->produced > w->consumed) {
            sslot *slot = &w->slots[w->consumed % l->P];
            l->held = l->rr;
            l->rr = (l->rr + 1) % l->W;
            l->b = (fg_batch){.x = slot->x,
                              .y = slot->y,
                              .size = slot->size,
                              .valid = slot->size,
                              .epoch = l->epoch,
                              .index = l->cur++,
                              .indices = slot->idx};
            if (l->threaded) pthread_mutex_unlock(&l->mu);
            return &l->b;
        }
        if (w->st != FG_OK) { /* ended by a failure: reached in order */
            l->status = w->st;
            snprintf(l->errmsg, sizeof l->errmsg, "%.900s (batch %lld)", w->msg, (long long)l->cur);
            if (l->threaded) pthread_mutex_unlock(&l->mu);
            return fail(l);
        }
        l->rr = (l->rr + 1) % l->W; /* this worker's shard is done */
        tried++;
    }
    if (l->threaded) pthread_mutex_unlock(&l->mu);
    l->discovered = l->cur;
    return NULL;
}

fg_status fg_stream_loader_status(const fg_stream_loader *l) { return l ? l->status : FG_EINVAL; }

int64_t fg_stream_loader_len(const fg_stream_loader *l) {
    return l->len >= 0 ? l->len : l->discovered;
}

fg_stream_loader *fg_stream_loader_new(fg_stream *s, const fg_stream_loader_opts *o) {
    static const fg_stream_loader_opts zero = {0};
    if (!s) {
        fg_error(FG_EINVAL, "fg_stream_loader_new: NULL stream");
        return NULL;
    }
    if (!o) o = &zero;
    int world = o->world ? o->world : 1;
    if (o->batch < 0 || o->num_workers < 0 || o->num_workers > MAX_WORKERS || o->prefetch < 0 ||
        o->prefetch > 4096 || world < 1 || o->rank < 0 || o->rank >= world) {
        fg_error(FG_EINVAL,
                 "stream loader %s: batch=%lld num_workers=%d prefetch=%d rank=%d world=%d: "
                 "expected batch >= 0, 0 <= num_workers <= %d, 0 <= prefetch <= 4096, "
                 "0 <= rank < world",
                 s->name, (long long)o->batch, o->num_workers, o->prefetch, o->rank, o->world,
                 MAX_WORKERS);
        return NULL;
    }
    fg_stream_loader *l = fg_calloc(1, sizeof *l);
    if (!l) return NULL;
    l->s = s;
    l->o = *o;
    l->o.world = world;
    l->B = o->batch ? o->batch : 1;
    l->threaded = o->num_workers > 0;
    l->W = l->threaded ? o->num_workers : 1;
    l->P = l->threaded ? (o->prefetch ? o->prefetch : 2) + 1 : 1;
    l->held = -1;
    l->discovered = -1;
    l->len = -1;
    int64_t n = s->ops.len ? s->ops.len(s->ud) : -1;
    if (n >= 0) {
        l->len = 0;
        int64_t S = (int64_t)l->W * world;
        for (int k = 0; k < l->W; k++) {
            int64_t g = (int64_t)o->rank * l->W + k, cnt = n > g ? (n - g + S - 1) / S : 0;
            l->len += o->drop_last ? cnt / l->B : (cnt + l->B - 1) / l->B;
        }
    }
    if (pthread_mutex_init(&l->mu, NULL) != 0) {
        fg_free(l);
        fg_error(FG_EIO, "stream loader: cannot make its mutex");
        return NULL;
    }
    pthread_cond_init(&l->cv, NULL);
    l->sync_init = true;
    l->w = fg_calloc((size_t)l->W, sizeof *l->w);
    if (!l->w) goto fail;
    for (int k = 0; k < l->W; k++) {
        sworker *w = &l->w[k];
        w->l = l;
        w->id = k;
        w->slots = fg_calloc((size_t)l->P, sizeof *w->slots);
        if (!w->slots) goto fail;
        for (int p = 0; p < l->P; p++) {
            int64_t shape[FG_MAX_DIMS] = {l->B};
            memcpy(shape + 1, s->x.shape, (size_t)s->x.ndim * sizeof(int64_t));
            if (!(w->slots[p].x = fg_tensor_new(s->x.dtype, s->x.ndim + 1, shape))) goto fail;
            memcpy(shape + 1, s->y.shape, (size_t)s->y.ndim * sizeof(int64_t));
            if (!(w->slots[p].y = fg_tensor_new(s->y.dtype, s->y.ndim + 1, shape))) goto fail;
            if (!(w->slots[p].idx = fg_alloc((size_t)l->B * sizeof(int64_t)))) goto fail;
        }
    }
    if (rewind_to(l, 0, 0) != FG_OK || start_threads(l) != FG_OK) goto fail;
    return l;
fail:
    fg_stream_loader_free(l);
    return NULL;
}

void fg_stream_loader_free(fg_stream_loader *l) {
    if (!l) return;
    stop_threads(l);
    for (int k = 0; l->w && k < l->W; k++) {
        sworker *w = &l->w[k];
        fg__shard_close(l->s, &w->sh);
        fg_free(w->sh.scratch);
        for (int p = 0; w->slots && p < l->P; p++) {
            fg_tensor_free(w->slots[p].x);
            fg_tensor_free(w->slots[p].y);
            fg_free(w->slots[p].idx);
        }
        fg_free(w->slots);
    }
    fg_free(l->w);
    if (l->sync_init) {
        pthread_mutex_destroy(&l->mu);
        pthread_cond_destroy(&l->cv);
    }
    fg_free(l);
}
