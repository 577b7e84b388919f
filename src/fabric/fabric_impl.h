/* Private state of the fabric layer. */
#ifndef FULGUR_FABRIC_IMPL_H
#define FULGUR_FABRIC_IMPL_H

#include "core/core_impl.h"
#include "fulgur/fabric.h"

struct fg_fabric {
    fg_fabric_config cfg;
    char strategy_name[32];
    fg_strategy_kind kind;
    bool spawn; /* ddp_spawn / ddp_fork */
    int ndevices, num_nodes, threads;
    fg_dtype dtype;
    uint64_t seed;
    /* after launch */
    fg_cluster_info info;
    int world_size, global_rank, local_rank, node_rank;
    fg_comm *comm;
    fg_strategy *strategy;
    fg_module *model;
    fg_optimizer *opt;
    bool no_sync;
    /* ddp_spawn's result in the parent */
    void *spawn_blob;
    size_t spawn_blob_len;
    fg_kv *loaded_meta; /* fabric_ckpt.c: the last load's metadata, one block */
    int64_t nloaded_meta;
};

/* launch.c: ddp_spawn's copy of rank 0's state at the end of each step */
void fg__spawn_snapshot(fg_fabric *f);

/* config.c: validation of the configuration values */
fg_status fg__parse_accelerator(const char *s);
fg_status fg__parse_devices(const char *s, int cores, int *n);
fg_status fg__parse_strategy(const char *s, int ndevices, fg_strategy_kind *kind, bool *spawn,
                             const char **canonical);
fg_status fg__parse_precision(const char *s, fg_dtype *dt);

#endif
