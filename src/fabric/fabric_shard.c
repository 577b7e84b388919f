/* Consolidated checkpoints under a sharding strategy. The gathering save
 * (fg__fabric_save_gathered, the reference of the streamed one in
 * fabric_save_stream.c) has rank 0 gather every rank's optimizer state
 * shard into whole buffers (point to point, rank after rank) and write one
 * file, the same as ddp's; at load,
 * every rank reads its own shard's range of each state tensor from that
 * file, so a run resumes at another world size or under another strategy
 * (the shards are cut again by the strategy of the run that loads).
 * Sharded saves (a file per rank and an index) are fabric_save_sharded.c.
 * fg__fabric_held, at the end, is where the checkpoint code asks what this
 * rank holds of the flat layout.
 *
 * The shards are whatever the optimizers say they hold
 * (fg_optimizer_state_range): the ranks agree on them first, and they must
 * tile the flat layout in rank order. */
#include <stdio.h>
#include <string.h>

#include "fabric_impl.h"
#include "strategy/strategy_impl.h"

void fg__fabric_free_states(fg_tensor **full, int n) {
    for (int k = 0; k < n; k++) {
        fg_tensor_free(full[k]);
        full[k] = NULL;
    }
}

/* Every rank's state range, in rank order, into ranges (2 x world). */
static FG_MUST_USE fg_status all_ranges(fg_fabric *f, const fg_optimizer *opt, int64_t *ranges) {
    int64_t mine[2];
    fg_optimizer_state_range(opt, &mine[0], &mine[1]);
    if (!f->comm) {
        memcpy(ranges, mine, sizeof mine);
        return FG_OK;
    }
    return fg_comm_allgather(f->comm, mine, ranges, 2, FG_I64);
}

fg_status fg__fabric_gather_states(fg_fabric *f, fg_optimizer *opt, fg_tensor **full) {
    int nstates = fg_optimizer_num_states(opt);
    int world = f->comm ? fg_comm_size(f->comm) : 1, rank = f->comm ? fg_comm_rank(f->comm) : 0;
    int64_t numel = fg_module_numel(fg_optimizer_module(opt));
    for (int k = 0; k < nstates; k++) full[k] = NULL;
    int64_t stackr[2 * 16], *ranges = world <= 16 ? stackr : fg_calloc(2 * (size_t)world, 8);
    if (!ranges) return fg_error_wrap(FG_ENOMEM, "save: gathering the optimizer state");
    fg_status s = all_ranges(f, opt, ranges);
    bool whole = true, tiled = true;
    for (int q = 0; s == FG_OK && q < world; q++)
        whole = whole && ranges[2 * q] == 0 && ranges[2 * q + 1] == numel;
    /* HYBRID_SHARD: the first shard group's ranks tile the vector, the
     * others hold copies of their shards and send nothing */
    for (int q = 0; s == FG_OK && !whole && q < world; q++)
        if (ranges[2 * q + 1] == numel) {
            world = q + 1;
            break;
        }
    for (int q = 0; s == FG_OK && q < world; q++) {
        whole = whole && ranges[2 * q] == 0 && ranges[2 * q + 1] == numel;
        tiled = tiled && ranges[2 * q] == (q ? ranges[2 * q - 1] : 0) &&
                ranges[2 * q + 1] >= ranges[2 * q] && (q < world - 1 || ranges[2 * q + 1] == numel);
    }
    if (s != FG_OK || whole || nstates == 0) goto out; /* each rank holds it all, as ddp */
    if (!tiled) {
        s = fg_error(FG_EMISMATCH,
                     "save: the ranks' optimizer state shards do not tile the %lld parameter "
                     "elements in rank order (rank 0 holds [%lld, %lld))",
                     (long long)numel, (long long)ranges[0], (long long)ranges[1]);
        goto out;
    }
    fg_dtype dt = fg_tensor_dtype(fg_optimizer_state(opt, 0));
    size_t es = fg_dtype_size(dt);
    int32_t ok = 1;
    if (rank == 0)
        for (int k = 0; k < nstates && ok; k++) ok = (full[k] = fg_tensor_new(dt, 1, &numel)) != 0;
    char msg[512] = "";
    if (!ok) snprintf(msg, sizeof msg, "%s", fg_last_error());
    if ((s = fg_comm_broadcast(f->comm, &ok, &ok, 1, FG_I32, 0)) != FG_OK) goto out;
    if (!ok) {
        s = rank == 0 ? fg_error(FG_ENOMEM, "save: rank 0 gathering the optimizer state: %s", msg)
                      : fg_error(FG_ENOMEM, "save: rank 0 could not hold the optimizer state");
        goto out;
    }
    for (int k = 0; k < nstates && s == FG_OK; k++) {
        fg_tensor *state = fg_optimizer_state(opt, k);
        const char *mine = fg_tensor_data(state);
        fg_dev *dev = fg__zero_dev(state); /* a shard on a device: staged out */
        if (rank >= world) continue;       /* a copy of a shard the first group sends */
        int64_t n0 = ranges[2 * rank + 1] - ranges[2 * rank];
        if (rank != 0) {
            if (n0 > 0) s = fg__staged_send(f->comm, dev, mine, n0, dt, 0);
            continue;
        }
        char *dst = fg_tensor_data(full[k]);
        if (dev) s = fg_dev_copy_d2h(dev, dst, mine, (size_t)n0 * es);
        else memcpy(dst, mine, (size_t)n0 * es);
        for (int q = 1; q < world && s == FG_OK; q++) {
            int64_t nq = ranges[2 * q + 1] - ranges[2 * q];
            if (nq > 0)
                s = fg__staged_recv(f->comm, NULL, dst + (size_t)ranges[2 * q] * es, nq, dt, q);
        }
    }
    if (s != FG_OK) s = fg_error_wrap(s, "save: gathering the optimizer state on rank 0");
out:
    if (s != FG_OK) fg__fabric_free_states(full, nstates);
    if (ranges != stackr) fg_free(ranges);
    return s;
}

fg_status fg__fabric_held(fg_fabric *f, const fg_train_state *st, fg__held *h) {
    fg_module *m = st->model;
    fg_tensor *flat = fg_module_flat_params(m);
    if (!flat) return fg_error(FG_ESTATE, "checkpoint: the model is not finalized");
    *h = (fg__held){.numel = fg_module_numel(m), .pdt = fg_tensor_dtype(flat)};
    fg__fabric_param_range(f, m, &h->plo, &h->phi); /* stage 3: this rank's shard */
    h->params = fg__fabric_param_data(f, m, h->plo);
    /* on the device unless an offload keeps the shard on the host */
    const char *fb = fg_tensor_data(flat);
    size_t fbytes = (size_t)h->numel * fg_dtype_size(h->pdt);
    if (h->params >= fb && h->params < fb + fbytes) h->pdev = fg__zero_dev(flat);
    fg_optimizer *opt = st->optimizer;
    if (!opt) return FG_OK;
    h->nstates = fg_optimizer_num_states(opt);
    if (h->nstates > FG_FABRIC_MAX_STATES)
        return fg_error(FG_EINTERNAL, "checkpoint: %d optimizer states, at most %d", h->nstates,
                        FG_FABRIC_MAX_STATES);
    fg_optimizer_state_range(opt, &h->slo, &h->shi);
    for (int k = 0; k < h->nstates; k++) {
        fg_tensor *t = fg_optimizer_state(opt, k);
        h->sdt = fg_tensor_dtype(t);
        h->states[k] = fg_tensor_data(t);
        h->sdev = fg__zero_dev(t);
    }
    return FG_OK;
}
