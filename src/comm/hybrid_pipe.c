/* The hybrid backend's pipeline worker (hybrid_pipe.h). */
#include <stdio.h>

#include "hybrid_pipe.h"

struct fg__hy_pipe {
    fg__hy_leg leg;
    void *ctx;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t posted; /* chunks ready: 0..posted-1 */
    int64_t done;   /* chunks whose leg has run */
    bool stop;
    fg_status status; /* the first failure; the worker stops there */
    char msg[512];
};

static void *worker(void *arg) {
    fg__hy_pipe *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->done == p->posted) pthread_cond_wait(&p->cv, &p->mu);
        if (p->stop) break;
        int64_t k = p->done;
        pthread_mutex_unlock(&p->mu);
        fg_status st = p->leg(p->ctx, k);
        pthread_mutex_lock(&p->mu);
        if (st != FG_OK) {
            p->status = st;
            snprintf(p->msg, sizeof p->msg, "%s", fg_last_error());
            pthread_cond_broadcast(&p->cv);
            break;
        }
        p->done = k + 1;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

fg__hy_pipe *fg__hy_pipe_start(fg__hy_leg leg, void *ctx) {
    fg__hy_pipe *p = fg_calloc(1, sizeof *p);
    if (!p) {
        fg_error(FG_ENOMEM, "hybrid: out of memory for the pipeline");
        return NULL;
    }
    p->leg = leg;
    p->ctx = ctx;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    int rc = pthread_create(&p->thread, NULL, worker, p);
    if (rc != 0) {
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
        fg_free(p);
        fg_error(FG_EIO, "hybrid: could not start the pipeline's thread (error %d)", rc);
        return NULL;
    }
    return p;
}

void fg__hy_pipe_post(fg__hy_pipe *p, int64_t k) {
    pthread_mutex_lock(&p->mu);
    if (k + 1 > p->posted) p->posted = k + 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

fg_status fg__hy_pipe_wait(fg__hy_pipe *p, int64_t k) {
    pthread_mutex_lock(&p->mu);
    while (p->done <= k && p->status == FG_OK) pthread_cond_wait(&p->cv, &p->mu);
    fg_status st = p->done > k ? FG_OK : p->status;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", p->msg);
    pthread_mutex_unlock(&p->mu);
    if (st != FG_OK) fg_error(st, "%s", msg);
    return st;
}

void fg__hy_pipe_stop(fg__hy_pipe *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    fg_free(p);
}
