/* The full save (state_dict_type full) streamed: one safetensors file on
 * rank 0, byte for byte the file of the gathering save (fabric_ckpt.c's
 * fg__fabric_save_gathered), without ever holding the whole model there.
 *
 * The header depends only on the names, dtypes and shapes, so rank 0
 * writes it first (fg_st_writer_begin) and then the tensors in the file's
 * order: the parameters, then each optimizer state, then the states of
 * several optimizers and the module's buffers. A flat buffer that rank 0
 * holds whole (the parameters under ddp or stage 1/2, the state under ddp)
 * is written from where it lies, with nothing copied. A buffer the ranks
 * shard (the parameters under stage 3 and fsdp FULL_SHARD, the optimizer
 * state under every sharded kind) is gathered a window at a time: a run of
 * consecutive tensors of at most WINDOW_BYTES (or one larger tensor), each
 * rank holding part of it sending that part to rank 0 point to point, and
 * rank 0 writing the window's tensors before it receives the next. Rank 0
 * thus holds one window beyond its training memory, the other ranks
 * nothing.
 *
 * The senders of a sharded buffer are the ranks, in rank order, whose
 * ranges continue the covered prefix of the flat layout (under
 * HYBRID_SHARD the first shard group; the other groups hold copies and
 * send nothing), as the gathering save chose them. Every rank computes the
 * same windows from the model's layout, so the messages pair up.
 *
 * Errors: rank 0 checks the metadata, allocates its window and opens the
 * file before any tensor moves, and every rank hears how that went. A
 * write that fails later (a full disk) stops the writing, not the
 * receiving, so that no sender waits on rank 0; at the end every rank
 * hears whether the file is whole. */
#include <stdio.h>
#include <string.h>

#include "fabric_impl.h"
#include "strategy/strategy_impl.h"

#define WINDOW_BYTES ((size_t)1 << 20)

/* Where the elements of one flat buffer are. */
typedef struct src {
    bool whole;  /* every rank holds all of it: rank 0 writes it from its own memory */
    int64_t *lo; /* world each (in one block with hi): a sender's range, empty for others */
    int64_t *hi;
    fg_dtype dt;
    const char *mine; /* this rank's elements, from its element lo[rank] (from 0 when whole) */
    fg_dev *dev;      /* the device whose memory mine is (NULL: the host) */
} src;

static void src_free(src *s) {
    fg_free(s->lo);
    s->lo = s->hi = NULL;
}

/* The senders of a buffer of numel elements of which this rank holds
 * [mlo, mhi). strict: the ranks tile the layout in rank order up to the
 * first that reaches its end (the optimizer's state shards), else the ranks
 * that continue the covered prefix send and the others are copies (the
 * parameter shards). Collective. */
static FG_MUST_USE fg_status sources(fg_fabric *f, int64_t mlo, int64_t mhi, int64_t numel,
                                     bool strict, const char *what, src *s) {
    int world = f->comm ? fg_comm_size(f->comm) : 1;
    s->lo = fg_calloc(4 * (size_t)world, sizeof *s->lo);
    if (!s->lo) return fg_error_wrap(FG_ENOMEM, "save: planning the %s", what);
    s->hi = s->lo + world;
    int64_t *all = s->lo + 2 * world, mine[2] = {mlo, mhi};
    if (f->comm) FG_TRY(fg_comm_allgather(f->comm, mine, all, 2, FG_I64));
    else memcpy(all, mine, sizeof mine);
    s->whole = true;
    for (int q = 0; q < world; q++)
        s->whole = s->whole && all[2 * q] == 0 && all[2 * q + 1] == numel;
    if (s->whole) return FG_OK;
    int64_t covered = 0;
    for (int q = 0; q < world; q++) {
        int64_t lo = all[2 * q], hi = all[2 * q + 1];
        s->lo[q] = s->hi[q] = numel; /* sends nothing */
        if (covered == numel) continue;
        if (lo == covered && hi >= lo) {
            s->lo[q] = lo;
            s->hi[q] = covered = hi;
        } else if (strict) {
            break;
        }
    }
    if (covered != numel)
        return fg_error(FG_EMISMATCH,
                        "save: the ranks' %s shards do not %s the %lld parameter elements in "
                        "rank order (rank 0 holds [%lld, %lld))",
                        what, strict ? "tile" : "cover", (long long)numel, (long long)all[0],
                        (long long)all[1]);
    return FG_OK;
}

/* The window starting at tensor i: tensors [i, *j) of m, elements
 * [*a, *b) of the flat layout (consecutive tensors in increasing offsets,
 * at most `cap` elements unless one tensor alone is more). */
static void window(fg_module *m, int i, int64_t cap, int *j, int64_t *a, int64_t *b) {
    int n = fg_module_num_params(m);
    *a = fg_module_param_offset(m, i);
    *b = *a + fg_tensor_numel(fg_module_param(m, i));
    int k = i + 1;
    for (; k < n; k++) {
        int64_t o = fg_module_param_offset(m, k), e = o + fg_tensor_numel(fg_module_param(m, k));
        if (o < *b || e - *a > cap) break;
        *b = e;
    }
    *j = k;
}

/* The most bytes one window of a buffer of element size es spans. */
static size_t window_bytes(fg_module *m, size_t es) {
    int64_t cap = (int64_t)(WINDOW_BYTES / es), a, b, most = 0;
    for (int i = 0, j; i < fg_module_num_params(m); i = j) {
        window(m, i, cap, &j, &a, &b);
        if (b - a > most) most = b - a;
    }
    return (size_t)most * es;
}

/* Streams buffer s (tensors of m's shapes) through rank 0's window buf
 * into w: collective over the ranks. *wst: rank 0's first write failure,
 * after which it only receives. */
static FG_MUST_USE fg_status stream_buffer(fg_fabric *f, fg_module *m, const src *s, char *buf,
                                           fg_st_writer *w, fg_status *wst) {
    int rank = f->comm ? fg_comm_rank(f->comm) : 0, world = f->comm ? fg_comm_size(f->comm) : 1;
    size_t es = fg_dtype_size(s->dt);
    int64_t cap = (int64_t)(WINDOW_BYTES / es);
    for (int i = 0, j; i < fg_module_num_params(m); i = j) {
        int64_t a, b;
        window(m, i, cap, &j, &a, &b);
        for (int q = 0; q < world; q++) {
            int64_t x = FG_MAX(a, s->lo[q]), y = FG_MIN(b, s->hi[q]);
            if (x >= y || (rank != 0 && rank != q)) continue;
            const char *from = s->mine + (size_t)(x - s->lo[q]) * es;
            char *to = buf + (size_t)(x - a) * es;
            if (rank == 0 && q == 0 && s->dev)
                FG_TRY(fg_dev_copy_d2h(s->dev, to, from, (size_t)(y - x) * es));
            else if (rank == 0 && q == 0) memcpy(to, from, (size_t)(y - x) * es);
            /* messages of at most 4 MiB either side: a sender on a device stages */
            else if (rank == 0) FG_TRY(fg__staged_recv(f->comm, NULL, to, y - x, s->dt, q));
            else FG_TRY(fg__staged_send(f->comm, s->dev, from, y - x, s->dt, 0));
        }
        for (int k = i; rank == 0 && k < j && *wst == FG_OK; k++) {
            int64_t o = fg_module_param_offset(m, k), n = fg_tensor_numel(fg_module_param(m, k));
            *wst = fg_st_writer_put(w, buf + (size_t)(o - a) * es, (size_t)n * es, NULL);
        }
    }
    return FG_OK;
}

/* Rank 0: entries of buffer s under `prefix` into w: with their data when
 * rank 0 holds the buffer whole, else declared for stream_buffer. */
static FG_MUST_USE fg_status add_entries(fg_st_writer *w, fg_module *m, const char *prefix,
                                         const src *s) {
    size_t es = fg_dtype_size(s->dt);
    for (int i = 0; i < fg_module_num_params(m); i++) {
        fg_tensor *p = fg_module_param(m, i);
        char name[320];
        snprintf(name, sizeof name, "%s%s", prefix, fg_module_param_name(m, i));
        if (s->whole)
            FG_TRY(fg_st_writer_add_on(w, name, s->dt, fg_tensor_ndim(p), fg_tensor_shape(p),
                                       s->mine + (size_t)fg_module_param_offset(m, i) * es,
                                       s->dev));
        else FG_TRY(fg_st_writer_declare(w, name, s->dt, fg_tensor_ndim(p), fg_tensor_shape(p)));
    }
    return FG_OK;
}

/* Rank 0: every entry and the metadata into w, then the file begun. */
static FG_MUST_USE fg_status begin_file(fg_fabric *f, const char *path, const fg_train_state *st,
                                        const src *bufs, int nbuf, fg_st_writer *w) {
    fg_module *m = st->model;
    FG_TRY(add_entries(w, m, "", &bufs[0]));
    for (int k = 1; k < nbuf; k++) {
        char prefix[96];
        snprintf(prefix, sizeof prefix, "optimizer.%s.",
                 fg_optimizer_state_name(st->optimizer, k - 1));
        FG_TRY(add_entries(w, m, prefix, &bufs[k]));
    }
    for (int n = 0; n < st->noptimizers; n++) { /* whole states (check_many) */
        fg_optimizer *o = st->optimizers[n];
        fg_module *sub = fg_optimizer_module(o);
        for (int k = 0; k < fg_optimizer_num_states(o); k++) {
            fg_tensor *t = fg_optimizer_state(o, k);
            char prefix[128];
            snprintf(prefix, sizeof prefix, "optimizer.%d.%s.", n, fg_optimizer_state_name(o, k));
            src s = {.whole = true,
                     .dt = fg_tensor_dtype(t),
                     .mine = fg_tensor_data(t),
                     .dev = fg_tensor_dev(t)};
            FG_TRY(add_entries(w, sub, prefix, &s));
        }
    }
    /* the buffers (BatchNorm's running statistics), whole on every rank,
     * after the parameters as in PyTorch's state_dict */
    for (int64_t i = 0; i < fg_module_num_buffers(m); i++) {
        fg_tensor *b = fg_module_buffer(m, i);
        FG_TRY(fg_st_writer_add_on(w, fg_module_buffer_name(m, i), fg_tensor_dtype(b),
                                   fg_tensor_ndim(b), fg_tensor_shape(b), fg_tensor_data(b),
                                   fg_tensor_dev(b)));
    }
    FG_TRY(fg__fabric_ckpt_meta(f, st, w));
    return fg_st_writer_begin(w, path);
}

/* Rank 0's ok to every rank (no comm: itself). */
static FG_MUST_USE fg_status tell(fg_fabric *f, int32_t *ok) {
    return f->comm ? fg_comm_broadcast(f->comm, ok, ok, 1, FG_I32, 0) : FG_OK;
}

fg_status fg__fabric_save_streamed(fg_fabric *f, const char *path, const fg_train_state *st) {
    fg_module *m = st->model;
    int rank = f->comm ? fg_comm_rank(f->comm) : 0;
    fg__held h;
    FG_TRY(fg__fabric_held(f, st, &h));
    int nbuf = 1 + h.nstates;
    src bufs[1 + FG_FABRIC_MAX_STATES] = {{0}};
    fg_st_writer *w = NULL;
    char *win = NULL;
    char msg[512] = "";
    /* the senders of each buffer: collective, the same on every rank */
    fg_status s = sources(f, h.plo, h.phi, h.numel, false, "parameter", &bufs[0]);
    bufs[0].dt = h.pdt;
    bufs[0].mine = h.params;
    bufs[0].dev = h.pdev; /* NULL when an offload holds the shard on the host */
    for (int k = 1; k < nbuf && s == FG_OK; k++) {
        s = sources(f, h.slo, h.shi, h.numel, true, "optimizer state", &bufs[k]);
        fg_tensor *t = fg_optimizer_state(st->optimizer, k - 1);
        bufs[k].dt = fg_tensor_dtype(t);
        bufs[k].mine = h.states[k - 1];
        bufs[k].dev = h.sdev;
    }
    if (s != FG_OK) goto out;
    /* rank 0: the window, the header and the file opened; then everyone hears */
    int32_t ok = 1;
    if (rank == 0) {
        size_t most = 0;
        for (int k = 0; k < nbuf; k++)
            if (!bufs[k].whole) most = FG_MAX(most, window_bytes(m, fg_dtype_size(bufs[k].dt)));
        fg_status bs = (w = fg_st_writer_new()) ? FG_OK : FG_ENOMEM;
        if (bs == FG_OK && most && !(win = fg_alloc(most)))
            bs = fg_error_wrap(FG_ENOMEM, "save: rank 0's window of %zu bytes", most);
        if (bs == FG_OK) bs = begin_file(f, path, st, bufs, nbuf, w);
        if (bs != FG_OK) {
            snprintf(msg, sizeof msg, "%s", fg_last_error());
            s = bs;
            ok = 0;
        }
    }
    fg_status cs = tell(f, &ok);
    if (cs != FG_OK || !ok) {
        if (s == FG_OK)
            s = cs != FG_OK ? cs : fg_error(FG_EIO, "save: rank 0 could not write %s", path);
        else s = fg_error(s, "%s", msg);
        goto out;
    }
    /* the tensors, window by window */
    fg_status ws = FG_OK; /* rank 0's writing */
    for (int k = 0; k < nbuf && s == FG_OK; k++)
        if (!bufs[k].whole) s = stream_buffer(f, m, &bufs[k], win, w, &ws);
    if (s != FG_OK) {
        s = fg_error_wrap(s, "save %s: gathering the shards on rank 0", path);
        goto out;
    }
    if (rank == 0 && ws == FG_OK) ws = fg_st_writer_finish(w);
    if (ws != FG_OK) snprintf(msg, sizeof msg, "%s", fg_last_error());
    /* Tell every rank whether the file is whole before anyone goes on. */
    ok = ws == FG_OK;
    if ((s = tell(f, &ok)) != FG_OK) goto out;
    if (ws != FG_OK) s = fg_error(ws, "%s", msg);
    else if (!ok) s = fg_error(FG_EIO, "save: rank 0 could not write %s", path);
out:
    fg_st_writer_free(w); /* a file begun and not finished is removed */
    fg_free(win);
    for (int k = 0; k < nbuf; k++) src_free(&bufs[k]);
    return s;
}
