/* horovod: Horovod's DistributedOptimizer on fulgur's communicator.
 *
 * Setup (collective): rank 0's parameters and optimizer state to every rank
 * (hvd.broadcast_parameters, hvd.broadcast_optimizer_state).
 *
 * Backward: the first backward_passes_per_step - 1 passes accumulate
 * locally; the last one runs with a background thread that, every cycle
 * (HOROVOD_CYCLE_TIME), does what Horovod's coordinator does: the ranks
 * agree on how many gradients are ready on all of them, in one fixed order
 * (the order backward produces them: the last parameter first), with an
 * allreduce (min) of each rank's count; the newly agreed gradients are
 * packed into the fusion buffer (HOROVOD_FUSION_THRESHOLD bytes; as f16
 * under fp16 compression), averaged with one allreduce per filled buffer,
 * and copied back. Every rank thus issues the same allreduces in the same
 * order whatever its timing. Once backward is over the thread takes all
 * that is left and the caller waits for it.
 *
 * A parameter backward did not reach counts as ready with its gradient as
 * it stands (zero after zero_grad), so a model with unused parameters does
 * not stall. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "strategy_impl.h"

#define DEFAULT_THRESHOLD ((int64_t)64 << 20)
#define DEFAULT_CYCLE_MS 5.0

struct fg__horovod_state {
    int n;              /* parameters */
    int64_t *off;       /* element offset of each parameter's gradient in the flat gradient */
    int64_t *len;       /* its elements */
    fg_tensor **prm;    /* the parameters, to find a ready leaf */
    _Atomic int *ready; /* per parameter, set by the backward thread */
    int64_t threshold;  /* bytes; 0: no fusion */
    double cycle_s;
    int passes, pass;
    fg_horovod_compression compression;
    void *fusion; /* threshold bytes (f32 or f16 elements), on dev when set */
    fg_dev *dev;  /* the gradients' device when the host cannot touch it (else NULL) */
    int64_t fusion_elems;
    uint64_t bytes_sent, allreduces, cycles;

    /* one synchronised backward */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done_backward;
    fg_status st;
    char err[512];
};

static int find_param(const fg__horovod_state *h, const fg_tensor *t) {
    for (int i = 0; i < h->n; i++)
        if (h->prm[i] == t) return i;
    return -1;
}

static void on_ready(void *ud, fg_tensor *leaf) {
    fg__horovod_state *h = ud;
    int i = find_param(h, leaf);
    if (i >= 0) atomic_store(&h->ready[i], 1);
}

/* Parameters in the order backward produces them: the last one first. */
static int order(const fg__horovod_state *h, int k) { return h->n - 1 - k; }

/* n elements at src (dtype sdt) into dst (ddt): on the host, or with the
 * device's kernel on dev. */
static FG_MUST_USE fg_status convert(fg_dev *dev, void *dst, fg_dtype ddt, const void *src,
                                     fg_dtype sdt, int64_t n) {
    if (!dev) return fg_convert(dst, ddt, src, sdt, n);
    fg_tensor *d = fg_tensor_wrap_on(dev, dst, ddt, 1, &n);
    fg_tensor *s = d ? fg_tensor_wrap_on(dev, (void *)src, sdt, 1, &n) : NULL;
    fg_status st = s ? fg__ops_convert(d, s) : fg_last_status();
    fg_tensor_free(s);
    fg_tensor_free(d);
    return st;
}

static void *buf_alloc(fg_dev *dev, size_t bytes) {
    return dev ? fg_dev_alloc(dev, bytes, NULL) : fg_alloc(bytes);
}

static void buf_free(fg_dev *dev, void *p) {
    if (dev && p) fg__status_drop(fg_dev_free(dev, p)); /* a buffer of dev's, freed once */
    else if (!dev) fg_free(p);
}

/* Averages parameters order(from) .. order(to-1) through the fusion buffer
 * (on the device with the gradients: packed and unpacked by its kernels,
 * the allreduce staged through the host when the backend reads host
 * memory only). */
static FG_MUST_USE fg_status reduce_range(fg_strategy *s, int from, int to) {
    fg__horovod_state *h = s->horovod;
    float *g = fg_tensor_data(fg_module_flat_grads(s->model));
    fg_dtype wire = h->compression == FG_HOROVOD_COMPRESSION_FP16 ? FG_F16 : FG_F32;
    size_t esz = fg_dtype_size(wire);
    int k = from;
    while (k < to) {
        /* fill: whole gradients while they fit, or one larger than the buffer alone */
        int first = k;
        int64_t used = 0;
        while (k < to) {
            int64_t l = h->len[order(h, k)];
            if (k > first && (h->threshold == 0 || used + l > h->fusion_elems)) break;
            used += l;
            k++;
            if (h->threshold == 0) break;
        }
        void *buf = h->fusion;
        void *big = NULL;
        if (used > h->fusion_elems) { /* one gradient larger than the buffer */
            big = buf_alloc(h->dev, (size_t)used * esz);
            if (!big)
                return fg_error(FG_ENOMEM, "horovod: out of memory for a %lld-element gradient",
                                (long long)used);
            buf = big;
        }
        int64_t at = 0;
        fg_status st = FG_OK;
        for (int j = first; j < k && st == FG_OK; j++) {
            int p = order(h, j);
            st = convert(h->dev, (char *)buf + at * (int64_t)esz, wire, g + h->off[p], FG_F32,
                         h->len[p]);
            at += h->len[p];
        }
        if (st == FG_OK)
            st = fg__staged_allreduce(s->comm, h->dev, buf, used, wire, FG_REDUCE_OP_AVG);
        if (st == FG_OK) {
            at = 0;
            for (int j = first; j < k && st == FG_OK; j++) {
                int p = order(h, j);
                st = convert(h->dev, g + h->off[p], FG_F32, (char *)buf + at * (int64_t)esz, wire,
                             h->len[p]);
                at += h->len[p];
            }
            h->bytes_sent += (uint64_t)used * esz;
            h->allreduces++;
        }
        buf_free(h->dev, big);
        if (st != FG_OK)
            return fg_error_wrap(st, "horovod: allreduce of the fusion buffer (%lld elements)",
                                 (long long)used);
    }
    return FG_OK;
}

static void *cycle_thread(void *arg) {
    fg_strategy *s = arg;
    fg__horovod_state *h = s->horovod;
    int done = 0;
    fg_status st = FG_OK;
    while (done < h->n && st == FG_OK) {
        pthread_mutex_lock(&h->mu);
        if (!h->done_backward) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            long ns = ts.tv_nsec + (long)(h->cycle_s * 1e9);
            ts.tv_sec += ns / 1000000000L;
            ts.tv_nsec = ns % 1000000000L;
            pthread_cond_timedwait(&h->cv, &h->mu, &ts);
        }
        bool finished = h->done_backward;
        pthread_mutex_unlock(&h->mu);
        int64_t mine = done;
        if (finished) mine = h->n;
        else
            while (mine < h->n && atomic_load(&h->ready[order(h, (int)mine)])) mine++;
        int64_t agreed = mine;
        h->cycles++;
        st = fg_comm_allreduce(s->comm, &mine, &agreed, 1, FG_I64, FG_REDUCE_OP_MIN);
        if (st != FG_OK) st = fg_error_wrap(st, "horovod: agreeing on the ready gradients");
        if (st == FG_OK && agreed > done) st = reduce_range(s, done, (int)agreed);
        if (st == FG_OK) done = (int)agreed;
    }
    h->st = st;
    if (st != FG_OK) snprintf(h->err, sizeof h->err, "%s", fg_last_error());
    return NULL;
}

fg_status fg__horovod_backward(fg_strategy *s, fg_tensor *loss) {
    fg__horovod_state *h = s->horovod;
    bool last = ++h->pass >= h->passes;
    if (!last || !s->sync || !s->comm || fg_comm_size(s->comm) < 2) {
        if (last) h->pass = 0;
        return fg_backward(loss);
    }
    h->pass = 0;
    for (int i = 0; i < h->n; i++) atomic_store(&h->ready[i], 0);
    h->done_backward = false;
    h->st = FG_OK;
    pthread_t th;
    if (pthread_create(&th, NULL, cycle_thread, s) != 0)
        return fg_error(FG_EIO, "horovod: cannot start the background thread");
    fg_set_grad_ready_hook(on_ready, h);
    fg_status bst = fg_backward(loss);
    fg_set_grad_ready_hook(NULL, NULL);
    fg_error_kept berr; /* backward's error, if it failed */
    fg_error_keep(&berr);
    /* the thread still averages what is left, so every rank issues the same
     * allreduces even when this rank's backward failed */
    pthread_mutex_lock(&h->mu);
    h->done_backward = true;
    pthread_cond_signal(&h->cv);
    pthread_mutex_unlock(&h->mu);
    pthread_join(th, NULL);
    if (bst != FG_OK) {
        fg_error_restore(&berr);
        return bst;
    }
    if (h->st != FG_OK) return fg_error(h->st, "%s", h->err);
    return FG_OK;
}

void fg__horovod_free(fg_strategy *s) {
    fg__horovod_state *h = s->horovod;
    if (!h) return;
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    fg_free(h->off);
    fg_free(h->len);
    fg_free(h->prm);
    fg_free((void *)h->ready);
    buf_free(h->dev, h->fusion);
    fg_free(h);
    s->horovod = NULL;
}

static FG_MUST_USE fg_status env_num(const char *name, double *out, bool *set) {
    const char *v = getenv(name);
    *set = false;
    if (!v || !*v) return FG_OK;
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end || !(x >= 0))
        return fg_error(FG_EINVAL, "%s=\"%s\": expected a number >= 0", name, v);
    *out = x;
    *set = true;
    return FG_OK;
}

fg_status fg__horovod_setup(fg_strategy *s, const fg_ddp_opts *o) {
    fg_horovod_opts ho = o ? o->horovod : (fg_horovod_opts){0};
    if (o && (o->comm_hook || o->comm_wrapper || o->user_hook))
        return fg_error(FG_EINVAL, "horovod: ddp's communication hooks do not apply; use "
                                   "fg_horovod_opts.compression (none or fp16)");
    if ((int)ho.compression < 0 || ho.compression >= FG_HOROVOD_COMPRESSION_COUNT)
        return fg_error(FG_EINVAL, "horovod: compression %d: expected none or fp16",
                        (int)ho.compression);
    if (ho.backward_passes_per_step < 0 || ho.cycle_time_ms < 0 || ho.fusion_threshold < -1)
        return fg_error(FG_EINVAL,
                        "horovod: backward_passes_per_step=%d, cycle_time_ms=%g, "
                        "fusion_threshold=%lld: expected >= 0 (fusion_threshold -1: no fusion)",
                        ho.backward_passes_per_step, ho.cycle_time_ms,
                        (long long)ho.fusion_threshold);
    int64_t threshold = ho.fusion_threshold;
    double cycle = ho.cycle_time_ms;
    bool set;
    if (threshold == 0) {
        double v = 0;
        FG_TRY(env_num("HOROVOD_FUSION_THRESHOLD", &v, &set));
        threshold = set ? (int64_t)v : DEFAULT_THRESHOLD;
    } else if (threshold < 0) {
        threshold = 0;
    }
    if (cycle == 0) {
        double v = 0;
        FG_TRY(env_num("HOROVOD_CYCLE_TIME", &v, &set));
        cycle = set ? v : DEFAULT_CYCLE_MS;
    }
    fg_module *m = s->model;
    fg_tensor *flat = fg_module_flat_grads(m);
    if (!flat || fg_tensor_dtype(flat) != FG_F32)
        return fg_error(FG_EUNSUPPORTED, "horovod: needs f32 gradients in one flat buffer");
    fg__horovod_state *h = fg_calloc(1, sizeof *h);
    if (!h) return fg_error_wrap(FG_ENOMEM, "horovod setup");
    s->horovod = h;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    h->n = (int)fg_module_num_params(m);
    h->off = fg_calloc((size_t)h->n + 1, sizeof *h->off);
    h->len = fg_calloc((size_t)h->n + 1, sizeof *h->len);
    h->prm = fg_calloc((size_t)h->n + 1, sizeof *h->prm);
    h->ready = fg_calloc((size_t)h->n + 1, sizeof *h->ready);
    if (!h->off || !h->len || !h->prm || !h->ready)
        return fg_error_wrap(FG_ENOMEM, "horovod setup");
    for (int i = 0; i < h->n; i++) {
        h->prm[i] = fg_module_param(m, i);
        h->off[i] = fg_module_param_offset(m, i);
        h->len[i] = fg_tensor_numel(h->prm[i]);
    }
    h->threshold = threshold;
    h->cycle_s = cycle / 1000.0;
    h->passes = ho.backward_passes_per_step > 0 ? ho.backward_passes_per_step : 1;
    h->compression = ho.compression;
    size_t esz = h->compression == FG_HOROVOD_COMPRESSION_FP16 ? 2 : 4;
    h->fusion_elems = threshold > 0 ? threshold / (int64_t)esz : 0;
    if (h->fusion_elems > fg_tensor_numel(flat)) h->fusion_elems = fg_tensor_numel(flat);
    h->dev = fg__zero_dev(flat);
    if (h->fusion_elems > 0) {
        h->fusion = buf_alloc(h->dev, (size_t)h->fusion_elems * esz);
        if (!h->fusion) return fg_error_wrap(FG_ENOMEM, "horovod: the fusion buffer");
    }
    if (!s->comm || fg_comm_size(s->comm) < 2) return FG_OK;
    FG_TRY(fg__strategy_broadcast_params(s));
    if (s->opt) /* hvd.broadcast_optimizer_state(opt, root_rank=0) */
        for (int i = 0; i < fg_optimizer_num_states(s->opt); i++) {
            fg_tensor *t = fg_optimizer_state(s->opt, i);
            if (!t) continue;
            fg_status st = fg__staged_broadcast(s->comm, fg_tensor_dev(t), fg_tensor_data(t),
                                                fg_tensor_numel(t), fg_tensor_dtype(t), 0);
            if (st != FG_OK)
                return fg_error_wrap(st,
                                     "horovod setup: broadcasting the optimizer's %s from "
                                     "rank 0",
                                     fg_optimizer_state_name(s->opt, i));
        }
    return FG_OK;
}

int64_t fg__horovod_cycles(const fg_strategy *s) {
    return s->horovod ? (int64_t)s->horovod->cycles : 0;
}
int64_t fg__horovod_allreduces(const fg_strategy *s) {
    return s->horovod ? (int64_t)s->horovod->allreduces : 0;
}
uint64_t fg__horovod_bytes_sent(const fg_strategy *s) {
    return s->horovod ? s->horovod->bytes_sent : 0;
}
