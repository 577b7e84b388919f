/* The deterministic mode (Lightning's `deterministic`): the gradients, and
 * the step's loss, are bitwise the same on 1, 2, 3, ... ranks for the same
 * global batch.
 *
 * Why ddp alone is not: a rank sums its own micro-batches first, then the
 * allreduce sums the ranks; another world size brackets the same sum
 * differently, and float addition is not associative. Here the bracketing
 * is fixed by the global batch alone:
 *   - each backward computes one micro-batch's gradient alone (the flat
 *     gradient is zeroed before it) and copies it into a slot of its own;
 *   - the synchronising backward sums the M = A * world micro-batches of
 *     the step in one pairwise tree over their global index j (stride 1,
 *     2, 4, ...: j += j + stride), the same tree for any world size, and
 *     divides by M. Rank r's k-th micro-batch is j = k * world + r, as the
 *     distributed sampler's blocks deal them.
 * Realised as a reduce-scatter of the slots: the flat gradient is cut into
 * world slices; an alltoall hands rank q slice q of every micro-batch of
 * every rank, q sums its slice over the M micro-batches in the tree's
 * order, and an allgather puts the slices back together. Each element is
 * summed by one rank in the one order, so the bits do not depend on who
 * sums it. A rank sends A * P * (world - 1) / world elements and receives
 * as many, then the allgather's P: about A times an allreduce's volume, and
 * A + 2 gradient-sized buffers of memory.
 *
 * The per-micro-batch gradient must not depend on the world size either:
 * the fabric pins the kernel threads and the matrix product engine in this
 * mode (fabric.h); the micro-batch's samples come from the sampler's
 * blocks.
 *
 * On a device the slots and the tree are host memory: each micro-batch's
 * gradient is staged out (fg__stage_out, on the comm stream, counted as
 * staging) and the mean staged back in, the host side of backends that
 * read host memory; the sums are the same loops, so the same bits. A
 * device backend with its own collectives would sum on the device. */
#include <string.h>

#include "strategy_impl.h"

struct fg__det_state {
    int64_t P;     /* elements of the flat gradient */
    size_t es;     /* its element size (f32 or f64) */
    char *slots;   /* A local micro-batch gradients of P elements */
    double *loss;  /* their losses */
    int A, cap;    /* slots used, allocated */
    char *send;    /* alltoall: world blocks of A slices of S */
    char *recv;    /* world blocks of A slices of S, then the tree */
    double *lossv; /* every rank's losses, A per rank */
    int64_t xcap;  /* elements allocated in send and recv */
    int lcap;      /* doubles allocated in lossv */
    double step_loss;
    bool have_loss;
    fg_dev *dev; /* the flat gradient's device (NULL: the host) */
};

fg_status fg__det_setup(fg_strategy *s) {
    fg_tensor *g = fg_module_flat_grads(s->model);
    if (!g || !fg_module_flat_params(s->model))
        return fg_error(FG_EINVAL, "deterministic: the model has no flat gradient buffer");
    fg_dtype dt = fg_tensor_dtype(g);
    if (dt != FG_F32 && dt != FG_F64)
        return fg_error(FG_EUNSUPPORTED, "deterministic: %s gradients (built for f32 and f64)",
                        fg_dtype_name(dt));
    if (s->comm) FG_TRY(fg__strategy_broadcast_params(s));
    s->det = fg_calloc(1, sizeof *s->det);
    if (!s->det) return fg_error_wrap(FG_ENOMEM, "deterministic setup");
    s->det->P = fg_tensor_numel(g);
    s->det->es = dt == FG_F64 ? sizeof(double) : sizeof(float);
    s->det->dev = fg__zero_dev(g);
    return FG_OK;
}

void fg__det_free(fg_strategy *s) {
    fg__det_state *d = s->det;
    if (!d) return;
    fg_free(d->slots);
    fg_free(d->loss);
    fg_free(d->send);
    fg_free(d->recv);
    fg_free(d->lossv);
    fg_free(d);
    s->det = NULL;
}

/* Grows *p to hold n elements of es bytes (keeping its content). */
static FG_MUST_USE fg_status grow(void *pp, size_t n, size_t es) {
    void **p = pp;
    void *q = fg_realloc(*p, n * es);
    if (!q && n) return fg_error_wrap(FG_ENOMEM, "deterministic: %zu bytes for gradients", n * es);
    *p = q;
    return FG_OK;
}

/* The fixed tree: v[j] for j in [0, m), n elements each, pairwise over j
 * (stride 1, 2, 4, ...); the sum lands in v[0]. */
#define TREE(T)                                                                                    \
    static void tree_##T(T **v, int m, int64_t n) {                                                \
        for (int st = 1; st < m; st *= 2)                                                          \
            for (int j = 0; j + st < m; j += 2 * st) {                                             \
                T *a = v[j];                                                                       \
                const T *b = v[j + st];                                                            \
                for (int64_t i = 0; i < n; i++) a[i] += b[i];                                      \
            }                                                                                      \
    }
TREE(float)
TREE(double)

static void tree_sum(fg__det_state *d, void **v, int m, int64_t n, void *out) {
    if (d->es == sizeof(double)) {
        tree_double((double **)v, m, n);
        double *o = out;
        const double *a = v[0];
        for (int64_t i = 0; i < n; i++) o[i] = a[i] / (double)m;
    } else {
        tree_float((float **)v, m, n);
        float *o = out;
        const float *a = v[0];
        for (int64_t i = 0; i < n; i++) o[i] = a[i] / (float)m;
    }
}

/* The losses of the step: every rank's A, in the tree's order. */
static FG_MUST_USE fg_status reduce_losses(fg_strategy *s, int world) {
    fg__det_state *d = s->det;
    int m = d->A * world;
    if (m > d->lcap) {
        FG_TRY(grow(&d->lossv, (size_t)m, sizeof(double)));
        d->lcap = m;
    }
    if (s->comm) FG_TRY(fg_comm_allgather(s->comm, d->loss, d->lossv, d->A, FG_F64));
    else memcpy(d->lossv, d->loss, (size_t)d->A * sizeof(double));
    /* lossv is [p][k]; the tree wants j = k * world + p */
    double tmp[256], *t = m <= 256 ? tmp : fg_alloc((size_t)m * sizeof *t);
    if (!t) return fg_error_wrap(FG_ENOMEM, "deterministic: losses");
    for (int p = 0; p < world; p++)
        for (int k = 0; k < d->A; k++) t[k * world + p] = d->lossv[p * d->A + k];
    for (int st = 1; st < m; st *= 2)
        for (int j = 0; j + st < m; j += 2 * st) t[j] += t[j + st];
    d->step_loss = t[0] / (double)m;
    d->have_loss = true;
    if (t != tmp) fg_free(t);
    return FG_OK;
}

static FG_MUST_USE fg_status synchronise(fg_strategy *s) {
    fg__det_state *d = s->det;
    fg_tensor *g = fg_module_flat_grads(s->model);
    int world = s->comm ? fg_comm_size(s->comm) : 1;
    int rank = s->comm ? fg_comm_rank(s->comm) : 0;
    if (s->comm) { /* every rank must hold as many micro-batches */
        double v[2] = {(double)d->A, -(double)d->A};
        FG_TRY(fg_comm_allreduce(s->comm, v, v, 2, FG_F64, FG_REDUCE_OP_MAX));
        if (v[0] != -v[1])
            return fg_error(FG_EMISMATCH,
                            "deterministic: the ranks ran between %.0f and %.0f micro-batches "
                            "since the last synchronised backward (this rank %d): every rank must "
                            "run the same number (the sampler's blocks make that so)",
                            -v[1], v[0], d->A);
    }
    FG_TRY(reduce_losses(s, world));
    int m = d->A * world;
    void *ptrs[256], **v = m <= 256 ? ptrs : fg_alloc((size_t)m * sizeof *v);
    if (!v) return fg_error_wrap(FG_ENOMEM, "deterministic: micro-batches");
    fg_status st = FG_OK;
    if (world == 1) {
        for (int k = 0; k < m; k++) v[k] = d->slots + (size_t)k * (size_t)d->P * d->es;
        /* on a device the mean in the first slot (each element divided in
         * place), then in */
        tree_sum(d, v, m, d->P, d->dev ? v[0] : fg_tensor_data(g));
        if (d->dev) st = fg__stage_in(d->dev, fg_tensor_data(g), v[0], (size_t)d->P * d->es);
        goto out;
    }
    int64_t S = (d->P + world - 1) / world; /* slice q: [q * S, min((q + 1) * S, P)) */
    int64_t need = (int64_t)world * d->A * S;
    if (need > d->xcap) {
        if ((st = grow(&d->send, (size_t)need, d->es)) != FG_OK ||
            (st = grow(&d->recv, (size_t)need, d->es)) != FG_OK)
            goto out;
        d->xcap = need;
    }
    for (int q = 0; q < world; q++) {
        int64_t b = q * S, n = d->P - b < S ? (d->P - b > 0 ? d->P - b : 0) : S;
        for (int k = 0; k < d->A; k++) {
            char *dst = d->send + ((size_t)(q * d->A + k) * (size_t)S) * d->es;
            const char *src = d->slots + ((size_t)k * (size_t)d->P + (size_t)b) * d->es;
            memcpy(dst, src, (size_t)n * d->es);
            memset(dst + (size_t)n * d->es, 0, (size_t)(S - n) * d->es);
        }
    }
    fg_dtype dt = fg_tensor_dtype(g);
    if ((st = fg_comm_alltoall(s->comm, d->send, d->recv, (int64_t)d->A * S, dt)) != FG_OK)
        goto out;
    for (int p = 0; p < world; p++) /* from rank p, its k-th micro-batch: j = k * world + p */
        for (int k = 0; k < d->A; k++)
            v[k * world + p] = d->recv + ((size_t)(p * d->A + k) * (size_t)S) * d->es;
    /* the mean of this rank's slice into send (free now), then every slice */
    tree_sum(d, v, m, S, d->send + (size_t)rank * (size_t)S * d->es);
    if ((st = fg_comm_allgather(s->comm, d->send + (size_t)rank * (size_t)S * d->es, d->send, S,
                                dt)) != FG_OK)
        goto out;
    st = fg__stage_in(d->dev, fg_tensor_data(g), d->send, (size_t)d->P * d->es);
out:
    if (v != ptrs) fg_free(v);
    d->A = 0;
    return st;
}

fg_status fg__det_backward(fg_strategy *s, fg_tensor *loss, bool sync) {
    fg__det_state *d = s->det;
    fg_tensor *g = fg_module_flat_grads(s->model);
    if (d->A == d->cap) {
        int cap = d->cap ? d->cap * 2 : 4;
        FG_TRY(grow(&d->slots, (size_t)cap * (size_t)d->P, d->es));
        FG_TRY(grow(&d->loss, (size_t)cap, sizeof(double)));
        d->cap = cap;
    }
    /* this micro-batch's gradient alone: the previous ones are in their slots */
    size_t bytes = (size_t)d->P * d->es;
    if (d->dev) FG_TRY(fg_dev_memset(d->dev, fg_tensor_data(g), 0, bytes, NULL));
    else memset(fg_tensor_data(g), 0, bytes);
    d->loss[d->A] = fg_item(loss);
    FG_TRY(fg_backward(loss));
    FG_TRY(fg__stage_out(d->dev, d->slots + (size_t)d->A * bytes, fg_tensor_data(g), bytes));
    d->A++;
    if (!sync) return FG_OK;
    return synchronise(s);
}

fg_status fg_strategy_step_loss(const fg_strategy *s, double *loss) {
    if (!s || !loss) return fg_error(FG_EINVAL, "strategy_step_loss: NULL argument");
    if (!s->det)
        return fg_error(FG_ESTATE, "strategy_step_loss: the strategy is not deterministic");
    if (!s->det->have_loss)
        return fg_error(FG_ESTATE, "strategy_step_loss: no synchronised backward yet");
    *loss = s->det->step_loss;
    return FG_OK;
}
