/* What each rank holds of a model's state under each strategy, computed
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
    bool shards =
        kind == FG_STRATEGY_DEEPSPEED_STAGE_1 || kind == FG_STRATEGY_DEEPSPEED_STAGE_2 ||
        (kind == FG_STRATEGY_FSDP && o && o->sharding_strategy == FG_SHARDING_SHARD_GRAD_OP);
    if (shards && world > 1) {
        int64_t stack[65], *b = world < 65 ? stack : fg_calloc((size_t)world + 1, sizeof *b);
        if (!b) return FG_ENOMEM;
        fg__zero_cut(numel, world, (size_t)es, b);
        state = b[rank + 1] - b[rank];
        if (b != stack) fg_free(b);
    }
    *out = (fg_strategy_memory){
        .param_bytes = numel * es, .grad_bytes = numel * es, .optim_bytes = state * es * nstates};
    return FG_OK;
}
