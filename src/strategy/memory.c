/* What each rank holds of a model's state under each strategy between
 * steps (under stage 3 the units gathered during forward and backward come
 * on top, under stages 2 and 3 the gradient buckets not reduced yet),
 * computed
 * from the same cut the strategies make (fg__zero_cut), without building
 * anything: `fulgur env` prints it for a model of any size. */
#include "strategy_impl.h"

fg_status fg_strategy_memory_of(fg_strategy_kind kind, const fg_sharded_opts *o, int world,
                                int rank, int64_t numel, fg_dtype dtype, int nstates,
                                fg_strategy_memory *out) {
    if (!out || world < 1 || rank < 0 || rank >= world || numel < 0 || nstates < 0 ||
        !fg_dtype_valid((int)dtype))
        return fg_error(FG_EINVAL,
                        "strategy_memory: world %d, rank %d, numel %lld, nstates %d: expected "
                        "0 <= rank < world, numel >= 0, nstates >= 0 and a real dtype",
                        world, rank, (long long)numel, nstates);
    if ((unsigned)kind >= FG_STRATEGY_COUNT)
        return fg_error(FG_EINVAL, "strategy_memory: strategy kind %d out of range", (int)kind);
    FG_TRY(fg_strategy_check_sharded(kind, o));
    int64_t es = (int64_t)fg_dtype_size(dtype), state = numel;
    fg_sharding_strategy ss = o ? o->sharding_strategy : FG_SHARDING_FULL_SHARD;
    /* what the kind shards: its row's (fsdp: by its sharding strategy) */
    unsigned what = fg_strategy_shards(kind, ss);
    bool s3 = what & FG_SHARDS_PARAMS;
    bool shards = what != 0;
    /* HYBRID_SHARD: shard groups of hybrid_shard_size consecutive ranks
     * (0 here: one group of all, the ranks of one node) */
    int group = world;
    if (fg_strategy_takes(kind, ss) & FG_TAKES_SHARDING_STRATEGY &&
        ss == FG_SHARDING_HYBRID_SHARD && o && o->hybrid_shard_size)
        group = o->hybrid_shard_size;
    if (world % group)
        return fg_error(FG_EINVAL,
                        "strategy_memory: HYBRID_SHARD groups of %d ranks do not divide %d ranks",
                        group, world);
    if (shards && group > 1) {
        int64_t stack[65], *b = group < 65 ? stack : fg_calloc((size_t)group + 1, sizeof *b);
        if (!b) return FG_ENOMEM;
        fg__zero_cut(numel, group, (size_t)es, b);
        state = b[rank % group + 1] - b[rank % group];
        if (b != stack) fg_free(b);
    }
    int64_t held = s3 ? state : numel; /* stage 3: parameters and gradients sharded too */
    /* stage 2 (SHARD_GRAD_OP): the gradient outside the shard released */
    bool s2 = (what & FG_SHARDS_GRADS) && !s3;
    *out = (fg_strategy_memory){.param_bytes = held * es,
                                .grad_bytes = (s3 || s2 ? state : numel) * es,
                                .optim_bytes = state * es * nstates};
    return FG_OK;
}
