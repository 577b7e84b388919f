/* async: Bagua's AsyncModelAverageAlgorithm. The first warmup_steps
 * synchronising backwards average the gradients (as ddp); then gradients
 * stay local and a background thread averages the weights over the ranks,
 * on a communicator of its own, about every sync_interval_ms.
 *
 * Threads: the background thread never touches the model. The training
 * thread hands it a snapshot s of the weights at the end of an optimizer
 * step (the only moment no forward, backward or update reads or writes
 * them); the thread sums the ranks' snapshots into `sum`, and at a later
 * step end the training thread applies x += sum / p - s, keeping the
 * progress it made meanwhile (Bagua's async_model_average). The phase
 * (under mu) says who owns snap and sum: IDLE and DONE the training
 * thread, SNAP the background thread. Every sync_interval_ms the ranks'
 * threads agree by a one-byte MAX allreduce: stop (a rank's strategy is
 * being freed: every thread ends), skip (a rank has no fresh snapshot yet)
 * or average. They meet on that schedule whatever their training threads
 * do, so a rank that stops is heard by its peers even while they are done
 * training and wait for it, and no thread waits in a collective on a
 * training thread. A communication error ends the thread and is returned by
 * this rank's next optimizer step. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "bagua_impl.h"

enum { PH_IDLE, PH_SNAP, PH_DONE };

struct fg__bagua_async {
    fg__bagua_state *st;
    fg_comm *comm; /* the background thread's */
    pthread_t th;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int phase;
    bool stop, ended;
    fg_status err;
    char msg[512];
    float *snap, *sum;
    int64_t applied;
    uint64_t bytes; /* handed to the communicator, not yet counted in st */
};

static void deadline_after(struct timespec *t, int64_t ms) {
    clock_gettime(CLOCK_MONOTONIC, t);
    t->tv_sec += ms / 1000;
    t->tv_nsec += (ms % 1000) * 1000000;
    if (t->tv_nsec >= 1000000000) {
        t->tv_sec++;
        t->tv_nsec -= 1000000000;
    }
}

static bool passed(const struct timespec *t) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec > t->tv_sec || (now.tv_sec == t->tv_sec && now.tv_nsec >= t->tv_nsec);
}

static void *loop(void *arg) {
    fg__bagua_async *a = arg;
    int64_t n = a->st->n;
    struct timespec next;
    deadline_after(&next, a->st->o.sync_interval_ms);
    fg_status st = FG_OK;
    int64_t round = 0;
    for (;;) {
        pthread_mutex_lock(&a->mu);
        while (!a->stop && !passed(&next)) pthread_cond_timedwait(&a->cv, &a->mu, &next);
        /* 2: stop; 1: no snapshot here, skip the round; 0: ready */
        uint8_t flag = a->stop ? 2 : a->phase == PH_SNAP ? 0 : 1;
        a->bytes += 1;
        pthread_mutex_unlock(&a->mu);
        st = fg_comm_allreduce(a->comm, &flag, &flag, 1, FG_U8, FG_REDUCE_OP_MAX);
        if (st != FG_OK || flag == 2) break;
        if (flag == 0) {
            st = fg_comm_allreduce(a->comm, a->snap, a->sum, n, FG_F32, FG_REDUCE_OP_SUM);
            if (st != FG_OK) break;
            pthread_mutex_lock(&a->mu);
            a->bytes += (uint64_t)n * sizeof(float);
            a->phase = PH_DONE;
            pthread_mutex_unlock(&a->mu);
            round++;
        }
        deadline_after(&next, a->st->o.sync_interval_ms);
    }
    pthread_mutex_lock(&a->mu);
    if (st != FG_OK) {
        a->err = st;
        snprintf(a->msg, sizeof a->msg, "bagua async: model averaging round %lld: %s",
                 (long long)round, fg_last_error());
    }
    a->ended = true;
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

fg_status fg__async_setup(fg__bagua_state *st) {
    fg__bagua_async *a = fg_calloc(1, sizeof *a);
    if (!a) return fg_error_wrap(FG_ENOMEM, "bagua async setup");
    st->async = a;
    a->st = st;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&a->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&a->mu, NULL);
    a->snap = fg_alloc(sizeof(float) * (size_t)st->n);
    a->sum = fg_alloc(sizeof(float) * (size_t)st->n);
    if (!a->snap || !a->sum) return fg_error_wrap(FG_ENOMEM, "bagua async setup");
    fg_comm *c = st->s->comm;
    FG_TRY(fg_comm_split(c, 0, fg_comm_rank(c), &a->comm));
    if (pthread_create(&a->th, NULL, loop, a))
        return fg_error(FG_EIO, "bagua async: cannot start the averaging thread: %s",
                        strerror(errno));
    a->started = true;
    return FG_OK;
}

void fg__async_free(fg__bagua_state *st) {
    fg__bagua_async *a = st->async;
    if (!a) return;
    if (a->started) {
        pthread_mutex_lock(&a->mu);
        a->stop = true;
        pthread_cond_signal(&a->cv);
        pthread_mutex_unlock(&a->mu);
        pthread_join(a->th, NULL);
    }
    fg_comm_free(a->comm);
    fg_free(a->snap);
    fg_free(a->sum);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    fg_free(a);
    st->async = NULL;
}

fg_status fg__async_after_step(fg__bagua_state *st) {
    fg__bagua_async *a = st->async;
    if (fg_optimizer_step_count(st->opt) <= st->o.warmup_steps) return FG_OK;
    float *dx = fg_tensor_data(fg_module_flat_params(st->s->model));
    float *x = st->dev ? st->xh : dx; /* on a device: its host copy */
    size_t bytes = sizeof(float) * (size_t)st->n;
    pthread_mutex_lock(&a->mu);
    if (a->err != FG_OK) {
        fg_status e = a->err;
        pthread_mutex_unlock(&a->mu);
        return fg_error(e, "%s", a->msg);
    }
    fg_status rc = FG_OK;
    if (a->phase == PH_DONE) {
        const float p = (float)fg_comm_size(a->comm);
        if (st->dev) rc = fg__stage_out(st->dev, x, dx, bytes);
        for (int64_t i = 0; rc == FG_OK && i < st->n; i++)
            x[i] = x[i] + (a->sum[i] / p - a->snap[i]);
        if (rc == FG_OK && st->dev) rc = fg__stage_in(st->dev, dx, x, bytes);
        a->applied++;
        a->phase = PH_IDLE;
    }
    if (rc != FG_OK) {
        pthread_mutex_unlock(&a->mu);
        return fg_error_wrap(rc, "bagua async: applying the average");
    }
    if (a->phase == PH_IDLE && !a->ended) {
        if (st->dev) rc = fg__stage_out(st->dev, a->snap, dx, bytes);
        else memcpy(a->snap, x, bytes);
        if (rc != FG_OK) {
            pthread_mutex_unlock(&a->mu);
            return fg_error_wrap(rc, "bagua async: the weights' snapshot");
        }
        a->phase = PH_SNAP;
        pthread_cond_signal(&a->cv);
    }
    uint64_t b = a->bytes;
    a->bytes = 0;
    pthread_mutex_unlock(&a->mu);
    fg__bagua_count(st, b);
    return FG_OK;
}

int64_t fg__async_applied(const fg_strategy *s) {
    fg__bagua_async *a = s->bagua ? s->bagua->async : NULL;
    if (!a) return 0;
    pthread_mutex_lock(&a->mu);
    int64_t n = a->applied;
    pthread_mutex_unlock(&a->mu);
    return n;
}
