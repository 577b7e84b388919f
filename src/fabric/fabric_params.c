/* Consolidated checkpoints when the parameters are sharded (stage 3, fsdp
 * FULL_SHARD and HYBRID_SHARD): between steps a rank holds only its range
 * of the flat parameter vector (fg_strategy_param_range), so at save the
 * streamed save (fabric_save_stream.c) receives the ranges a window at a
 * time, and the gathering save, its reference, has rank 0 receive every
 * other rank's range (point to point, rank after rank, the
 * first ranks whose ranges tile the vector: under HYBRID_SHARD the first
 * shard group) into one whole buffer and writes the same file as ddp; at
 * load (and in a sharded save) each rank reads (writes) its own range of
 * each parameter, which fg__fabric_held takes from fg__fabric_param_range,
 * and the rest of its buffer stays released. */
#include <stdio.h>
#include <string.h>

#include "fabric_impl.h"
#include "strategy/strategy_impl.h"

/* Does f shard model's parameters? */
static bool sharded(const fg_fabric *f, fg_module *m) {
    return f->strategy && f->model == m && fg_strategy_shards_params(f->strategy) && f->comm;
}

fg_status fg__fabric_gather_params(fg_fabric *f, fg_module *m, fg_tensor **full) {
    *full = NULL;
    if (!sharded(f, m)) return FG_OK;
    int world = fg_comm_size(f->comm), rank = fg_comm_rank(f->comm);
    fg_tensor *flat = fg_module_flat_params(m);
    fg_dev *dev = fg__zero_dev(flat); /* shards on a device: staged out */
    int64_t numel = fg_tensor_numel(flat);
    fg_dtype dt = fg_tensor_dtype(flat);
    size_t es = fg_dtype_size(dt);
    int64_t *ranges = fg_calloc(2 * (size_t)world, sizeof *ranges);
    if (!ranges) return fg_error_wrap(FG_ENOMEM, "save: gathering the parameters");
    int64_t mine[2];
    fg_status s = fg_strategy_param_range(f->strategy, rank, &mine[0], &mine[1]);
    if (s == FG_OK) s = fg_comm_allgather(f->comm, mine, ranges, 2, FG_I64);
    /* the senders: ranks in order whose ranges continue the covered prefix */
    int64_t covered = 0;
    int last = -1;
    for (int q = 0; s == FG_OK && q < world && covered < numel; q++)
        if (ranges[2 * q] == covered) {
            covered = ranges[2 * q + 1];
            last = q;
        }
    if (s == FG_OK && covered != numel)
        s = fg_error(FG_EMISMATCH,
                     "save: the ranks' parameter shards do not cover the %lld elements (rank 0 "
                     "holds [%lld, %lld))",
                     (long long)numel, (long long)ranges[0], (long long)ranges[1]);
    int32_t ok = 1;
    if (s == FG_OK && rank == 0) ok = (*full = fg_tensor_new(dt, 1, &numel)) != NULL;
    if (s == FG_OK) s = fg_comm_broadcast(f->comm, &ok, &ok, 1, FG_I32, 0);
    if (s == FG_OK && !ok) s = fg_error(FG_ENOMEM, "save: rank 0 could not hold the parameters");
    covered = 0;
    for (int q = 0; s == FG_OK && q <= last; q++) {
        if (ranges[2 * q] != covered) continue;
        int64_t lo = ranges[2 * q], n = ranges[2 * q + 1] - lo;
        covered = ranges[2 * q + 1];
        const char *src = rank == q ? fg__fabric_param_data(f, m, lo) : NULL;
        if (n <= 0) continue;
        /* on the device, unless the shard lives in an nvme store (host) */
        const char *fb = fg_tensor_data(flat);
        fg_dev *sd = dev && src >= fb && src < fb + (size_t)numel * es ? dev : NULL;
        if (rank == 0) {
            char *dst = (char *)fg_tensor_data(*full) + (size_t)lo * es;
            if (q == 0 && sd) s = fg_dev_copy_d2h(sd, dst, src, (size_t)n * es);
            else if (q == 0) memcpy(dst, src, (size_t)n * es);
            else s = fg__staged_recv(f->comm, NULL, dst, n, dt, q);
        } else if (rank == q) {
            s = fg__staged_send(f->comm, sd, src, n, dt, 0);
        }
    }
    if (s != FG_OK) {
        fg_tensor_free(*full);
        *full = NULL;
        s = fg_error_wrap(s, "save: gathering the parameter shards on rank 0");
    }
    fg_free(ranges);
    return s;
}

void fg__fabric_param_range(fg_fabric *f, fg_module *m, int64_t *lo, int64_t *hi) {
    *lo = 0;
    *hi = fg_module_numel(m);
    if (sharded(f, m) &&
        fg_strategy_param_range(f->strategy, fg_comm_rank(f->comm), lo, hi) != FG_OK) {
        *lo = 0;
        *hi = fg_module_numel(m);
    }
}

char *fg__fabric_param_data(fg_fabric *f, fg_module *m, int64_t lo) {
    if (sharded(f, m)) return fg_strategy_param_data(f->strategy);
    fg_tensor *flat = fg_module_flat_params(m);
    return (char *)fg_tensor_data(flat) + (size_t)lo * fg_dtype_size(fg_tensor_dtype(flat));
}
