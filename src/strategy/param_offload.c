/* ZeRO stage 3's parameter offload to nvme (DeepSpeed's offload_param with
 * device nvme; deepspeed_stage_3_offload_nvme): this rank's parameter
 * shard lives in a file under nvme_path, beside its optimizer state (one
 * more array of the optimizer's nvme store, optim/offload.c), and not in
 * memory. The optimizer step streams the parameters with their state, so
 * the update happens on disk block by block; zero3.c keeps the shard's
 * pages of the flat parameter buffer released like the rest, and when it
 * gathers a unit it first fetches the unit's part of the shard from the
 * file (asynchronously, started when the unit is prefetched, so the read
 * overlaps the compute of the unit before), then broadcasts it as usual.
 *
 * Invariants: the file is the only valid copy of the shard between units;
 * a fetch of unit k is finished (landed or dropped) before k is fetched
 * again or the store is freed; a unit's fetches are its ranges' parts in
 * the shard, in range order. */
#include <string.h>

#include "optim/nvme_store.h"
#include "optim/optim_impl.h"
#include "strategy_impl.h"

typedef struct fetch {
    int n;
    fg__nvme_read **rd;
    int64_t *at, *len; /* the first element of each read, and its elements */
} fetch;

struct fg__poffload {
    fg_optimizer *opt;
    fg__nvme_store *store;
    int array;
    int64_t lo, hi;
    size_t es;
    int nunits;
    fetch *f;
    char *hp;    /* offload_params_device=cpu on a device: the shard in host memory */
    fg_dev *dev; /* the flat buffer's device if the host cannot touch it: reads land on the
                    host, then go in */
    void *host;  /* that landing buffer */
    size_t host_cap;
};

fg_status fg__poffload_new(fg_optimizer *opt, int64_t lo, int64_t hi, size_t es, int nunits,
                           const int *nranges, fg__poffload **out) {
    *out = NULL;
    fg__poffload *p = fg_calloc(1, sizeof *p);
    if (!p) return FG_ENOMEM;
    p->opt = opt;
    p->dev = fg__zero_dev(fg_module_flat_params(fg_optimizer_module(opt)));
    p->store = fg__optimizer_offload_param_store(opt, &p->array);
    p->hp = p->store ? NULL : fg__optimizer_host_params(opt);
    p->lo = lo;
    p->hi = hi;
    p->es = es;
    p->nunits = nunits;
    p->f = fg_calloc((size_t)nunits, sizeof *p->f);
    bool ok = (p->store || p->hp) && p->f;
    for (int k = 0; ok && k < nunits; k++) {
        p->f[k].rd = fg_calloc((size_t)nranges[k] + 1, sizeof *p->f[k].rd);
        p->f[k].at = fg_calloc((size_t)nranges[k] + 1, sizeof *p->f[k].at);
        p->f[k].len = fg_calloc((size_t)nranges[k] + 1, sizeof *p->f[k].len);
        ok = p->f[k].rd && p->f[k].at && p->f[k].len;
    }
    if (!ok) {
        fg_status st = p->store ? FG_ENOMEM : fg_error(FG_EINTERNAL, "parameter offload: no store");
        fg__poffload_free(p);
        return st;
    }
    *out = p;
    return FG_OK;
}

fg_status fg__poffload_fetch(fg__poffload *p, int k, int64_t (*r)[2], int nr) {
    fetch *f = &p->f[k];
    fg__poffload_drop(p, k);
    for (int i = 0; i < nr; i++) {
        int64_t a = FG_MAX(r[i][0], p->lo), b = FG_MIN(r[i][1], p->hi);
        if (a >= b) continue;
        if (p->hp) { /* in host memory: copied in when it lands */
            f->rd[f->n] = NULL;
            f->len[f->n] = b - a;
            f->at[f->n++] = a;
            continue;
        }
        FG_TRY(fg__nvme_store_read_start(p->store, p->array, (size_t)(a - p->lo) * p->es,
                                         (size_t)(b - a) * p->es, &f->rd[f->n]));
        f->len[f->n] = b - a;
        f->at[f->n++] = a;
    }
    return FG_OK;
}

fg_status fg__poffload_land(fg__poffload *p, int k, char *pbase) {
    fetch *f = &p->f[k];
    fg_status first = FG_OK;
    for (int i = 0; i < f->n; i++) {
        char *dst = pbase + (size_t)f->at[i] * p->es;
        size_t bytes = (size_t)f->len[i] * p->es;
        if (p->hp) {
            fg_status st =
                fg__stage_in(p->dev, dst, p->hp + (size_t)(f->at[i] - p->lo) * p->es, bytes);
            if (first == FG_OK) first = st;
            continue;
        }
        if (p->dev && p->host_cap < bytes) {
            void *h = fg_realloc(p->host, bytes);
            if (h) p->host = h, p->host_cap = bytes;
        }
        bool via = p->dev != NULL;
        fg_status st;
        if (via && p->host_cap < bytes) {
            /* no buffer to land it in: the read is dropped, the error reported */
            fg__status_drop(fg__nvme_store_read_finish(f->rd[i], NULL));
            st = fg_error(FG_ENOMEM, "parameter offload: a %zu-byte landing buffer", bytes);
        } else {
            st = fg__nvme_store_read_finish(f->rd[i], via ? p->host : dst);
            if (via && st == FG_OK) st = fg__stage_in(p->dev, dst, p->host, bytes);
        }
        if (first == FG_OK) first = st;
        f->rd[i] = NULL;
    }
    f->n = 0;
    return first;
}

void fg__poffload_drop(fg__poffload *p, int k) {
    fetch *f = &p->f[k];
    /* the reads are dropped, not used: a failed one has nothing to say (none
     * in host memory: nothing in flight) */
    for (int i = 0; i < f->n; i++)
        if (f->rd[i]) fg__status_drop(fg__nvme_store_read_finish(f->rd[i], NULL));
    f->n = 0;
}

void fg__poffload_home(fg__poffload *p) {
    for (int k = 0; k < p->nunits; k++) fg__poffload_drop(p, k);
    fg__optimizer_offload_params_home(p->opt);
}

void fg__poffload_free(fg__poffload *p) {
    if (!p) return;
    for (int k = 0; p->f && k < p->nunits; k++) {
        if (p->f[k].rd) fg__poffload_drop(p, k);
        fg_free(p->f[k].rd);
        fg_free(p->f[k].at);
        fg_free(p->f[k].len);
    }
    fg_free(p->f);
    fg_free(p->host);
    fg_free(p);
}

void *fg__poffload_data(fg__poffload *p) {
    return p->hp ? p->hp : fg__nvme_store_map(p->store, p->array);
}

/* offload_params_device=cpu on a device (deepspeed_stage_3_offload,
 * fsdp_cpu_offload): the optimizer's state and this rank's parameter shard
 * in host memory, the step on the CPU updating the shard there, each unit
 * gathered from it (the shard's part copied in, then broadcast); the
 * shard's device pages released. On the host there is nothing to move. */
fg_status fg__poffload_setup_cpu(fg_strategy *s) {
    const char *name = fg_strategy_kind_name(s->kind);
    if (!s->zero3)
        return fg_error(FG_EUNSUPPORTED,
                        "%s: offload_params_device=cpu on a device offloads ZeRO stage 3's "
                        "parameter shards: it needs the parameters sharded (deepspeed_stage_3, "
                        "fsdp FULL_SHARD or HYBRID_SHARD on 2 or more ranks)",
                        name);
    FG_TRY(fg__optimizer_offload_cpu(s->opt));
    FG_TRY(fg__optimizer_offload_params_cpu(s->opt));
    fg_status st = fg__zero3_offload_params(s);
    if (st != FG_OK) { /* the parameters go on on the device, as they were */
        fg__optimizer_offload_params_home(s->opt);
        return fg_error_wrap(st, "%s setup", name);
    }
    return FG_OK;
}

/* The strategy's nvme parameter offload, after the optimizer's state was
 * cut to this rank's shard: the shard and the state to the files, then the
 * shard's pages released. */
fg_status fg__poffload_setup(fg_strategy *s, const char *dir, size_t block) {
    const char *name = fg_strategy_kind_name(s->kind);
    if (!s->zero3)
        return fg_error(FG_EUNSUPPORTED,
                        "%s: offload_params_device=nvme offloads ZeRO stage 3's parameter shards, "
                        "and without a communicator stage 3 runs as a single device with nothing "
                        "sharded: give it a communicator (a group of one on one rank: the fabric "
                        "and fulgur fit make one), or offload the optimizer state only "
                        "(offload_optimizer_device=nvme)",
                        name);
    fg_status st = fg__optimizer_offload_nvme_params(s->opt, dir, block);
    if (st != FG_OK) return fg_error_wrap(st, "%s setup", name);
    st = fg__zero3_offload_params(s);
    if (st != FG_OK) { /* the parameters go on in memory, as they were */
        fg__optimizer_offload_params_home(s->opt);
        return fg_error_wrap(st, "%s setup", name);
    }
    return FG_OK;
}

void *fg_strategy_param_data(fg_strategy *s) {
    if (!s || !s->model) return NULL;
    void *po = s->zero3 ? fg__zero3_param_offload(s) : NULL;
    if (po) return fg__poffload_data(po);
    int64_t lo = 0, hi = 0;
    if (fg_strategy_shards_params(s) && s->comm &&
        fg_strategy_shard_range(s, fg_comm_rank(s->comm), &lo, &hi) != FG_OK)
        return NULL;
    fg_tensor *flat = fg_module_flat_params(s->model);
    return (char *)fg_tensor_data(flat) + (size_t)lo * fg_dtype_size(fg_tensor_dtype(flat));
}
