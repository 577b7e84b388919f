/* Sharded saves (state_dict_type sharded): the checkpoint is a folder of
 * one safetensors file per rank and an index (FG_ST_INDEX_NAME, the layout
 * of Hugging Face's model.safetensors.index.json), written as a whole.
 *
 * The ranks cut the flat layout into ranges that tile it in rank order:
 * the optimizer's state shards under a sharding strategy, else an even cut
 * (every rank holds everything, as under ddp). Every tensor, a parameter
 * or an optimizer state of one ("optimizer.<state>.<param>", the names of
 * the consolidated file), is written whole by the rank whose range holds
 * its first element. A tensor that runs past the end of its owner's range
 * gets its tail from the ranks after it, point to point; nothing else
 * moves, and no rank needs more than its own range plus that one tensor.
 * The module's buffers (BatchNorm's running statistics), whole on every
 * rank, go last into the first file, as the full save writes them last.
 *
 * Atomic as a whole: rank 0 makes a temporary folder beside `path`, every
 * rank writes its file into it, the ranks agree that all did, and only
 * then rank 0 writes the index and moves the folder into place
 * (fg_st_folder_commit). A failure on any rank removes the temporary
 * folder and leaves `path` (and so any "last" link) as it was; a kill
 * leaves the temporary folder for fg_st_remove_stale_tmp.
 *
 * One save, one id: rank 0 draws 128 random bits (save_id, in hex), which
 * go into the index and into every file's metadata beside its step, shard
 * number and count, so that the reader (st_index.c) refuses a file of
 * another save or another run put into the folder. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "fabric_impl.h"
#include "strategy/strategy_impl.h"

#define SHARD_FORMAT "fulgur-checkpoint-shard-1"

typedef struct plan {
    int world, rank, ntens; /* ntens: parameters of the model */
    int64_t *lo, *hi;       /* world each: the ranges */
    int *owner;             /* ntens: the rank writing parameter i's tensors */
    int64_t *tail_hi;       /* world: rank q needs [hi[q], tail_hi[q]) from the ranks after */
    int *file;              /* world: 1-based number of rank q's file, 0 if it writes none */
    int nfiles;
} plan;

static void plan_free(plan *p) {
    fg_free(p->lo);
    fg_free(p->owner);
    fg_free(p->tail_hi);
    fg_free(p->file);
}

static FG_MUST_USE fg_status plan_alloc(fg_fabric *f, fg_module *m, plan *p) {
    p->world = f->comm ? fg_comm_size(f->comm) : 1;
    p->rank = f->comm ? fg_comm_rank(f->comm) : 0;
    p->ntens = (int)fg_module_num_params(m);
    p->lo = fg_calloc(6 * (size_t)p->world, sizeof *p->lo); /* lo, hi, gathered ranges */
    p->owner = fg_calloc((size_t)p->ntens + 1, sizeof *p->owner);
    p->tail_hi = fg_calloc((size_t)p->world, sizeof *p->tail_hi);
    p->file = fg_calloc((size_t)p->world, sizeof *p->file);
    if (!p->lo || !p->owner || !p->tail_hi || !p->file)
        return fg_error(FG_ENOMEM, "save: out of memory planning the shards");
    p->hi = p->lo + p->world;
    return FG_OK;
}

/* The ranks' ranges: the parameter shards when the strategy shards the
 * parameters, else the optimizer's state shards when it shards those (the
 * first ranks whose shards tile the layout in rank order write; ranks after
 * them, holding copies as HYBRID_SHARD's other groups do, get an empty
 * range), else an even cut (every rank holds everything). Collective;
 * every rank reaches the same result. */
static FG_MUST_USE fg_status cut(fg_fabric *f, const fg__held *h, bool has_opt, plan *p) {
    int64_t *all = p->lo + 2 * p->world, *r = all;
    int64_t mine[4] = {h->plo, h->phi, has_opt ? h->slo : 0, has_opt ? h->shi : h->numel};
    if (f->comm) FG_TRY(fg_comm_allgather(f->comm, mine, all, 4, FG_I64));
    else memcpy(all, mine, sizeof mine);
    bool pwhole = true, swhole = true;
    for (int q = 0; q < p->world; q++) {
        pwhole = pwhole && all[4 * q] == 0 && all[4 * q + 1] == h->numel;
        swhole = swhole && all[4 * q + 2] == 0 && all[4 * q + 3] == h->numel;
    }
    if (pwhole && swhole) {
        for (int q = 0; q < p->world; q++) {
            p->lo[q] = h->numel * q / p->world;
            p->hi[q] = h->numel * (q + 1) / p->world;
        }
        return FG_OK;
    }
    /* the pairs to follow, packed in place as (lo, hi) per rank */
    int off = pwhole ? 2 : 0;
    for (int q = 0; q < p->world; q++) {
        int64_t lo = all[4 * q + off], hi = all[4 * q + off + 1];
        r[2 * q] = lo;
        r[2 * q + 1] = hi;
    }
    int64_t covered = 0;
    int g = -1; /* the last rank of the tiling prefix */
    for (int q = 0; q < p->world && r[2 * q] == covered && r[2 * q + 1] >= covered; q++) {
        covered = r[2 * q + 1];
        if (covered == h->numel) {
            g = q;
            break;
        }
    }
    if (g < 0)
        return fg_error(FG_EMISMATCH,
                        "save: the ranks' %s shards do not tile the %lld parameter elements in "
                        "rank order (rank 0 holds [%lld, %lld))",
                        pwhole ? "optimizer state" : "parameter", (long long)h->numel,
                        (long long)r[0], (long long)r[1]);
    for (int q = 0; q < p->world; q++) {
        p->lo[q] = q <= g ? r[2 * q] : h->numel;
        p->hi[q] = q <= g ? r[2 * q + 1] : h->numel;
    }
    return FG_OK;
}

/* Owners, tails and file numbers from the ranges and the layout. */
static FG_MUST_USE fg_status make_plan(fg_fabric *f, fg_module *m, const fg__held *h, bool has_opt,
                                       plan *p) {
    FG_TRY(cut(f, h, has_opt, p));
    for (int q = 0; q < p->world; q++) p->tail_hi[q] = p->hi[q];
    int last = 0; /* the last rank with a non-empty range */
    for (int q = 0; q < p->world; q++)
        if (p->hi[q] > p->lo[q]) last = q;
    for (int i = 0; i < p->ntens; i++) {
        int64_t a = fg_module_param_offset(m, i);
        int64_t b = a + fg_tensor_numel(fg_module_param(m, i));
        int q = last;
        for (int k = 0; k < p->world; k++)
            if (p->lo[k] <= a && a < p->hi[k]) {
                q = k;
                break;
            }
        p->owner[i] = q;
        if (b > p->tail_hi[q]) p->tail_hi[q] = b;
    }
    for (int i = 0; i < p->ntens; i++) p->file[p->owner[i]] = 1;
    for (int q = 0; q < p->world; q++)
        if (p->file[q]) p->file[q] = ++p->nfiles;
    return FG_OK;
}

#define SAVE_ID_BYTES 16

/* 128 random bits in hex into id (2 * SAVE_ID_BYTES + 1 bytes). */
static FG_MUST_USE fg_status new_save_id(char *id) {
    unsigned char r[SAVE_ID_BYTES];
    size_t got = 0;
    while (got < sizeof r) {
        ssize_t k = getrandom(r + got, sizeof r - got, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return fg_error(FG_EIO, "save: cannot draw the save's id (getrandom failed, errno %d)",
                            errno);
        got += (size_t)k;
    }
    for (size_t i = 0; i < sizeof r; i++) snprintf(id + 2 * i, 3, "%02x", r[i]);
    return FG_OK;
}

static void file_name(const plan *p, int q, char *out, size_t cap) {
    snprintf(out, cap, "model-%05d-of-%05d.safetensors", p->file[q], p->nfiles);
}

/* The buffers a tensor's elements come from: 0 the parameters, 1 + k
 * optimizer state k. */
static char *held_at(const fg__held *h, int b, int64_t x) {
    if (b == 0) return h->params + (size_t)(x - h->plo) * fg_dtype_size(h->pdt);
    return h->states[b - 1] + (size_t)(x - h->slo) * fg_dtype_size(h->sdt);
}
static fg_dtype buf_dtype(const fg__held *h, int b) { return b == 0 ? h->pdt : h->sdt; }
static fg_dev *buf_dev(const fg__held *h, int b) { return b == 0 ? h->pdev : h->sdev; }

/* The part of rank q's range that rank p's tail needs. */
static void piece(const plan *pl, int q, int p, int64_t *a, int64_t *b) {
    *a = FG_MAX(pl->lo[q], pl->hi[p]);
    *b = FG_MIN(pl->hi[q], pl->tail_hi[p]);
}

/* The tail exchange (collective): rank r's tail [hi[r], tail_hi[r]) of
 * every buffer into tail[b] (elements from hi[r] on). In round d each rank
 * sends to the rank d before it, then receives from the rank d after it:
 * the ranks below d only receive, so no send waits in a cycle. */
static FG_MUST_USE fg_status exchange(fg_fabric *f, const plan *pl, const fg__held *h, int nbuf,
                                      char **tail) {
    for (int d = 1; d < pl->world; d++) {
        int p = pl->rank - d, q = pl->rank + d;
        int64_t a, b;
        if (p >= 0) {
            piece(pl, pl->rank, p, &a, &b);
            for (int k = 0; a < b && k < nbuf; k++)
                FG_TRY(fg__staged_send(f->comm, buf_dev(h, k), held_at(h, k, a), b - a,
                                       buf_dtype(h, k), p));
        }
        if (q < pl->world) {
            piece(pl, q, pl->rank, &a, &b);
            for (int k = 0; a < b && k < nbuf; k++) {
                size_t es = fg_dtype_size(buf_dtype(h, k));
                char *dst = tail[k] + (size_t)(a - pl->hi[pl->rank]) * es;
                FG_TRY(fg__staged_recv(f->comm, NULL, dst, b - a, buf_dtype(h, k), q));
            }
        }
    }
    return FG_OK;
}

/* This rank's file: every tensor it owns, parameters first, then each
 * optimizer state, in the model's order. */
static FG_MUST_USE fg_status write_shard(fg_fabric *f, const fg_train_state *st, const plan *pl,
                                         const fg__held *h, int nbuf, char **tail, const char *dir,
                                         const char *save_id) {
    fg_module *m = st->model;
    int r = pl->rank;
    fg_st_writer *w = fg_st_writer_new();
    if (!w) return FG_ENOMEM;
    fg_status s = FG_OK;
    for (int k = 0; k < nbuf && s == FG_OK; k++)
        for (int i = 0; i < pl->ntens && s == FG_OK; i++) {
            if (pl->owner[i] != r) continue;
            fg_tensor *p = fg_module_param(m, i);
            int64_t a = fg_module_param_offset(m, i), n = fg_tensor_numel(p);
            char name[320];
            if (k == 0) snprintf(name, sizeof name, "%s", fg_module_param_name(m, i));
            else
                snprintf(name, sizeof name, "optimizer.%s.%s",
                         fg_optimizer_state_name(st->optimizer, k - 1), fg_module_param_name(m, i));
            const char *data = held_at(h, k, a);
            fg_dev *dev = buf_dev(h, k); /* the writer copies device data out in chunks */
            if (a + n > pl->hi[r]) {     /* runs past this range: its own part, then the tail */
                size_t es = fg_dtype_size(buf_dtype(h, k));
                char *whole = tail[nbuf + k];
                if (dev) s = fg_dev_copy_d2h(dev, whole, data, (size_t)(pl->hi[r] - a) * es);
                else memcpy(whole, data, (size_t)(pl->hi[r] - a) * es);
                dev = NULL;
                memcpy(whole + (size_t)(pl->hi[r] - a) * es, tail[k],
                       (size_t)(a + n - pl->hi[r]) * es);
                data = whole;
            }
            if (s == FG_OK)
                s = fg_st_writer_add_on(w, name, buf_dtype(h, k), fg_tensor_ndim(p),
                                        fg_tensor_shape(p), data, dev);
        }
    for (int64_t i = 0; pl->file[r] == 1 && i < fg_module_num_buffers(m) && s == FG_OK; i++) {
        fg_tensor *b = fg_module_buffer(m, i);
        s = fg_st_writer_add_on(w, fg_module_buffer_name(m, i), fg_tensor_dtype(b),
                                fg_tensor_ndim(b), fg_tensor_shape(b), fg_tensor_data(b),
                                fg_tensor_dev(b));
    }
    char num[32], path[4600], fname[64];
    snprintf(num, sizeof num, "%d", pl->file[r]);
    if (s == FG_OK) s = fg_st_writer_set_meta(w, "format", SHARD_FORMAT);
    if (s == FG_OK) s = fg_st_writer_set_meta(w, "shard", num);
    snprintf(num, sizeof num, "%d", pl->nfiles);
    if (s == FG_OK) s = fg_st_writer_set_meta(w, "num_shards", num);
    snprintf(num, sizeof num, "%lld", (long long)st->step);
    if (s == FG_OK) s = fg_st_writer_set_meta(w, "step", num);
    if (s == FG_OK) s = fg_st_writer_set_meta(w, "save_id", save_id);
    file_name(pl, r, fname, sizeof fname);
    snprintf(path, sizeof path, "%s/%s", dir, fname);
    if (s == FG_OK) s = fg_st_writer_write(w, path);
    (void)f;
    fg_st_writer_free(w);
    return s;
}

/* Rank 0: the index into dir, naming every tensor once, in the order of
 * the consolidated file; the metadata are that file's. */
static FG_MUST_USE fg_status write_index(const fg_train_state *st, const plan *pl,
                                         const fg__held *h, int nbuf, fg_st_writer *meta,
                                         const char *dir) {
    fg_module *m = st->model;
    int64_t nb = fg_module_num_buffers(m), n = (int64_t)pl->ntens * nbuf + nb,
            nmeta = fg_st_writer_meta_count(meta);
    char(*names)[320] = fg_calloc((size_t)n + 1, sizeof *names);
    char(*files)[64] = fg_calloc((size_t)pl->world, sizeof *files);
    const char **np = fg_calloc((size_t)n + 1, sizeof *np),
               **fp = fg_calloc((size_t)n + 1, sizeof *fp);
    fg_kv *kv = fg_calloc((size_t)nmeta + 1, sizeof *kv);
    fg_status s = (!names || !files || !np || !fp || !kv) ? FG_ENOMEM : FG_OK;
    uint64_t total = 0;
    for (int q = 0; s == FG_OK && q < pl->world; q++)
        if (pl->file[q]) file_name(pl, q, files[q], sizeof files[q]);
    for (int k = 0, j = 0; s == FG_OK && k < nbuf; k++)
        for (int i = 0; i < pl->ntens; i++, j++) {
            if (k == 0) snprintf(names[j], sizeof names[j], "%s", fg_module_param_name(m, i));
            else
                snprintf(names[j], sizeof names[j], "optimizer.%s.%s",
                         fg_optimizer_state_name(st->optimizer, k - 1), fg_module_param_name(m, i));
            np[j] = names[j];
            fp[j] = files[pl->owner[i]];
            total +=
                (uint64_t)fg_tensor_numel(fg_module_param(m, i)) * fg_dtype_size(buf_dtype(h, k));
        }
    /* the buffers: in the first file, after everything else */
    int first = 0;
    while (first < pl->world && pl->file[first] != 1) first++;
    for (int64_t i = 0, j = n - nb; s == FG_OK && i < nb; i++, j++) {
        fg_tensor *b = fg_module_buffer(m, i);
        snprintf(names[j], sizeof names[j], "%s", fg_module_buffer_name(m, i));
        np[j] = names[j];
        fp[j] = files[first < pl->world ? first : 0];
        total += (uint64_t)fg_tensor_numel(b) * fg_dtype_size(fg_tensor_dtype(b));
    }
    for (int64_t i = 0; s == FG_OK && i < nmeta; i++)
        s = fg_st_writer_meta_at(meta, i, &kv[i].key, &kv[i].value);
    char path[4600];
    snprintf(path, sizeof path, "%s/%s", dir, FG_ST_INDEX_NAME);
    if (s == FG_OK) s = fg_st_write_index(path, n, np, fp, total, kv, nmeta);
    fg_free(names);
    fg_free(files);
    fg_free(np);
    fg_free(fp);
    fg_free(kv);
    return s;
}

/* Agreement: every rank learns the first rank whose ok is false (world if
 * none). Collective. */
static FG_MUST_USE fg_status first_failed(fg_fabric *f, const plan *pl, bool ok, int *first) {
    int32_t v = ok ? pl->world : pl->rank;
    if (f->comm) FG_TRY(fg_comm_allreduce(f->comm, &v, &v, 1, FG_I32, FG_REDUCE_OP_MIN));
    *first = v;
    return FG_OK;
}

fg_status fg__fabric_save_sharded(fg_fabric *f, const char *path, const fg_train_state *st) {
    fg__held h;
    plan pl = {0};
    char *tail[2 * (1 + FG_FABRIC_MAX_STATES)] = {0};
    char tmp[4096] = "", msg[512] = "", save_id[2 * SAVE_ID_BYTES + 1] = "";
    fg_st_writer *meta = NULL;
    int first = 0, nbuf = 0, r = f->comm ? fg_comm_rank(f->comm) : 0;
    /* local checks, the metadata and the plan's memory; the ranks agree
     * before anything moves */
    fg_status s = fg__fabric_held(f, st, &h);
    if (s == FG_OK) {
        nbuf = 1 + h.nstates;
        if (!(meta = fg_st_writer_new())) s = FG_ENOMEM;
    }
    if (s == FG_OK) s = fg__fabric_ckpt_meta(f, st, meta);
    if (s == FG_OK) s = plan_alloc(f, st->model, &pl);
    pl.world = f->comm ? fg_comm_size(f->comm) : 1;
    pl.rank = r;
    fg_status cs = first_failed(f, &pl, s == FG_OK, &first);
    if (s != FG_OK || cs != FG_OK) {
        if (s == FG_OK) s = cs;
        goto out;
    }
    if (first < pl.world) {
        s = fg_error(FG_EINVAL, "save %s: rank %d could not start the save", path, first);
        goto out;
    }
    /* the plan: the same on every rank, so a mismatch fails everywhere */
    if ((s = make_plan(f, st->model, &h, st->optimizer != NULL, &pl)) != FG_OK) goto out;
    bool held = pl.lo[r] == pl.hi[r] || (h.plo <= pl.lo[r] && pl.hi[r] <= h.phi &&
                                         (!h.nstates || (h.slo <= pl.lo[r] && pl.hi[r] <= h.shi)));
    if (!held)
        snprintf(msg, sizeof msg,
                 "rank %d holds [%lld, %lld) of the parameters, not its range [%lld, %lld)", r,
                 (long long)h.plo, (long long)h.phi, (long long)pl.lo[r], (long long)pl.hi[r]);
    if ((s = first_failed(f, &pl, held, &first)) != FG_OK) goto out;
    if (first < pl.world) {
        s = fg_error(FG_EINTERNAL, "save %s: %s", path,
                     first == r ? msg : "a rank does not hold its range");
        goto out;
    }
    /* rank 0 makes the temporary folder; every rank learns its name */
    bool ok = true;

    if (r == 0) ok = new_save_id(save_id) == FG_OK;
    if (r == 0 && ok) ok = fg_st_writer_set_meta(meta, "save_id", save_id) == FG_OK;
    if (r == 0 && ok) ok = fg_st_folder_begin(path, tmp, sizeof tmp) == FG_OK;
    if (!ok) snprintf(msg, sizeof msg, "%s", fg_last_error());
    int32_t okv = ok;
    if (f->comm && (s = fg_comm_broadcast(f->comm, &okv, &okv, 1, FG_I32, 0)) != FG_OK) goto out;
    if (!okv) {
        s = r == 0 ? fg_error(FG_EIO, "save: %s", msg)
                   : fg_error(FG_EIO, "save %s: rank 0 could not start the save", path);
        goto out;
    }
    if (f->comm && (s = fg_comm_broadcast(f->comm, tmp, tmp, sizeof tmp, FG_U8, 0)) != FG_OK)
        goto out;
    if (f->comm &&
        (s = fg_comm_broadcast(f->comm, save_id, save_id, sizeof save_id, FG_U8, 0)) != FG_OK)
        goto out;
    /* the tail of the tensor that runs past this rank's range */
    int64_t ntail = pl.tail_hi[r] - pl.hi[r], nwhole = 0; /* the one tensor crossing hi[r] */
    for (int i = 0; i < pl.ntens; i++) {
        int64_t a = fg_module_param_offset(st->model, i);
        int64_t n = fg_tensor_numel(fg_module_param(st->model, i));
        if (pl.owner[i] == r && a + n > pl.hi[r]) nwhole = n;
    }
    ok = true;
    for (int k = 0; ntail > 0 && k < nbuf && ok; k++) {
        size_t es = fg_dtype_size(buf_dtype(&h, k));
        ok = (tail[k] = fg_alloc((size_t)ntail * es)) &&
             (tail[nbuf + k] = fg_alloc((size_t)nwhole * es));
    }
    if (!ok) snprintf(msg, sizeof msg, "%s", fg_last_error());
    if ((s = first_failed(f, &pl, ok, &first)) != FG_OK) goto out;
    if (first < pl.world) {
        s = fg_error(FG_ENOMEM, "save %s: rank %d: %s", path, first,
                     first == r ? msg : "out of memory for a tensor's tail");
        goto abort;
    }
    if ((s = exchange(f, &pl, &h, nbuf, tail)) != FG_OK) {
        s = fg_error_wrap(s, "save %s: moving the tensors that cross a shard's end", path);
        goto abort;
    }
    /* every rank its file, then the agreement */
    fg_status ws = pl.file[r] ? write_shard(f, st, &pl, &h, nbuf, tail, tmp, save_id) : FG_OK;
    if (ws != FG_OK) snprintf(msg, sizeof msg, "%s", fg_last_error());
    if ((s = first_failed(f, &pl, ws == FG_OK, &first)) != FG_OK) goto out;
    if (first < pl.world) {
        s = first == r
                ? fg_error(ws, "save %s: rank %d: %s", path, r, msg)
                : fg_error(FG_EIO, "save %s: rank %d could not write its file; nothing saved", path,
                           first);
        goto abort;
    }
    /* rank 0: the index, then the folder into place; the others hear how it went */
    ok = true;
    if (r == 0) {
        fg_status is = write_index(st, &pl, &h, nbuf, meta, tmp);
        if (is == FG_OK) is = fg_st_folder_commit(tmp, path);
        if (is != FG_OK) {
            snprintf(msg, sizeof msg, "%s", fg_last_error());
            if (fg_st_remove(tmp) != FG_OK) {
                /* msg holds the first error */
            }
            ok = false;
        }
    }
    okv = ok;
    if (f->comm && (s = fg_comm_broadcast(f->comm, &okv, &okv, 1, FG_I32, 0)) != FG_OK) goto out;
    if (!okv)
        s = r == 0 ? fg_error(FG_EIO, "save: %s", msg)
                   : fg_error(FG_EIO, "save %s: rank 0 could not write the index", path);
    goto out;
abort:
    if (r == 0 && tmp[0]) {
        fg_error_kept why; /* the failure that aborted, not the cleanup's */
        fg_error_keep(&why);
        if (fg_st_remove(tmp) != FG_OK) fg_error_restore(&why);
    }
out:
    for (size_t k = 0; k < sizeof tail / sizeof tail[0]; k++) fg_free(tail[k]);
    fg_st_writer_free(meta);
    plan_free(&pl);
    return s;
}
