/* dp: one process, the batch split along its first dim across worker
 * threads. The replicas share the model's parameters (read-only during the
 * step) and each accumulates into a gradient buffer of its own, through
 * autograd's per-thread gradient redirect; the main thread then adds the
 * replica buffers into the model's gradient in replica order, so the result
 * does not depend on thread timing. Kernel threads are set to one inside
 * the workers: the replicas are the parallelism.
 *
 * On a device the replicas are threads sharing it, as the CPU's share the
 * host: the replica gradients are device memory, each worker's step
 * tensors are the device's (its own step arena), and the sum runs on the
 * device's kernels. (Lightning's dp over several GPUs, a replica on each,
 * is the CUDA backend's: the parameters broadcast to each GPU per step.) */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "strategy_impl.h"

struct fg__dp_state {
    int n;
    fg_tensor **grads; /* per replica, same layout as the model's flat gradient */
    fg_dev *dev;       /* the model's device (NULL: the host) */
};

typedef struct job {
    fg_strategy *s;
    int r;
    fg_batch part;
    fg_strategy_step_fn fn;
    void *ud;
    double weight, loss;
    fg_status st;
    char err[512];
} job;

fg_status fg__dp_setup(fg_strategy *s, int threads) {
    fg_tensor *g = fg_module_flat_grads(s->model);
    if (!g) return fg_error(FG_EINVAL, "dp: the model has no flat gradient buffer");
    fg__dp_state *d = fg_calloc(1, sizeof *d);
    if (!d) return fg_error_wrap(FG_ENOMEM, "dp setup");
    s->dp = d;
    d->n = threads;
    d->dev = fg__zero_dev(g);
    d->grads = fg_calloc((size_t)threads, sizeof *d->grads);
    if (!d->grads) return fg_error_wrap(FG_ENOMEM, "dp setup");
    for (int r = 0; r < threads; r++) {
        d->grads[r] = fg_tensor_new_on(d->dev, fg_tensor_dtype(g), 1, fg_tensor_shape(g));
        if (!d->grads[r]) return fg_error_wrap(fg_last_status(), "dp setup");
    }
    return FG_OK;
}

void fg__dp_free(fg_strategy *s) {
    if (!s->dp) return;
    for (int r = 0; r < s->dp->n && s->dp->grads; r++) fg_tensor_free(s->dp->grads[r]);
    fg_free(s->dp->grads);
    fg_free(s->dp);
    s->dp = NULL;
}

static void *worker(void *arg) {
    job *j = arg;
    /* 1 is valid, and FULGUR_ADAPT_THREADS was read by the setting before */
    fg__status_drop(fg_set_num_threads(1));
    fg_tensor *flat = fg_module_flat_grads(j->s->model), *mine = j->s->dp->grads[j->r];
    fg_dev *dev = j->s->dp->dev;
    /* replica 0 is the caller, whose step device is the model's already */
    j->st = j->r != 0 && dev ? fg_step_device_set(dev) : FG_OK;
    if (j->st == FG_OK) j->st = fg_tensor_fill(mine, 0);
    if (j->st != FG_OK) {
        snprintf(j->err, sizeof j->err, "%s", fg_last_error());
        if (j->r != 0) fg_step_thread_release();
        return NULL;
    }
    fg__set_grad_redirect(flat, mine);
    fg_tensor *loss = j->fn(j->s->model, &j->part, j->ud);
    if (!loss) {
        j->st = FG_EINVAL;
    } else {
        j->loss = fg_item(loss);
        fg_tensor *seed =
            fg_full(fg_tensor_dtype(loss), fg_tensor_ndim(loss), fg_tensor_shape(loss), j->weight);
        j->st = seed ? fg_backward_with(loss, seed) : FG_ENOMEM;
    }
    if (j->st != FG_OK) snprintf(j->err, sizeof j->err, "%s", fg_last_error());
    fg__set_grad_redirect(NULL, NULL);
    /* Replica 0 runs on the caller's thread, whose step tensors belong to
     * the caller; the others free their thread's arena before exiting. */
    if (j->r != 0) fg_step_thread_release();
    return NULL;
}

/* Rows [start, start+len) of a batch tensor, as a header over its memory
 * (the batch is persistent and outlives the step). */
static fg_tensor *rows(const fg_tensor *t, int64_t start, int64_t len) {
    return fg_tensor_narrow_view(t, 0, start, len);
}

fg_status fg__dp_step(fg_strategy *s, fg_batch *b, fg_strategy_step_fn fn, void *ud,
                      double *part_losses, int max_parts, int *nparts, double *loss) {
    fg__dp_state *d = s->dp;
    int64_t B = b->size;
    int n = (int)(B < d->n ? B : d->n);
    if (n < 1) return fg_error(FG_EINVAL, "dp: empty batch");
    job jobs[64];
    pthread_t th[64];
    int prev_threads = fg_get_num_threads();
    int64_t start = 0;
    for (int r = 0; r < n; r++) {
        int64_t len = B / n + (r < B % n);
        job *j = &jobs[r];
        memset(j, 0, sizeof *j);
        j->s = s;
        j->r = r;
        j->fn = fn;
        j->ud = ud;
        j->part = *b;
        j->part.x = rows(b->x, start, len);
        j->part.y = rows(b->y, start, len);
        j->part.size = len;
        j->part.valid =
            b->valid - start < 0 ? 0 : (b->valid - start > len ? len : b->valid - start);
        j->part.indices = b->indices ? b->indices + start : NULL;
        j->weight = (double)len / (double)B; /* parts' mean losses weigh by their share */
        if (!j->part.x || !j->part.y) return FG_ENOMEM;
        start += len;
    }
    int started = 0;
    for (int r = 1; r < n; r++, started++)
        if (pthread_create(&th[r], NULL, worker, &jobs[r]) != 0) break;
    worker(&jobs[0]); /* the caller is replica 0 */
    for (int r = 1; r <= started; r++) pthread_join(th[r], NULL);
    fg__status_drop(fg_set_num_threads(prev_threads)); /* the setting before: valid */
    if (started != n - 1) return fg_error(FG_EIO, "dp: could not start %d worker threads", n - 1);
    double total = 0;
    for (int r = 0; r < n; r++) {
        if (jobs[r].st != FG_OK) return fg_error(jobs[r].st, "dp replica %d: %s", r, jobs[r].err);
        total += jobs[r].loss * jobs[r].weight;
        if (part_losses && r < max_parts) part_losses[r] = jobs[r].loss;
    }
    fg_tensor *g = fg_module_flat_grads(s->model);
    const fg_op_table *ops = fg_ops_get(fg_tensor_device(g));
    for (int r = 0; r < n; r++) FG_TRY(ops->axpby(1.0, d->grads[r], 1.0, g));
    if (nparts) *nparts = n;
    if (loss) *loss = total;
    return FG_OK;
}
