/* The strategies against their references, as one table (tests/strategy/
 * equiv.h runs each row: forked ranks on the shm backend, then the
 * comparison the row names):
 *   - ddp on N ranks with per-rank batch B equals one process on batch N*B
 *     (20 steps; the MLP with SGD and the GPT with SGD within 1e-5 of the
 *     largest parameter; AdamW within 5e-4, see the note at its row), with
 *     small buckets (reductions overlapping backward) and with no_sync
 *     accumulation;
 *   - deepspeed_stage_1, deepspeed_stage_2 and fsdp SHARD_GRAD_OP equal ddp
 *     on the same ranks bitwise (8 steps, clipping off: the shm backend
 *     reduces every element in rank order, by allreduce or by reduce to the
 *     shard's rank), with every optimizer, groups and decay exclusions, small
 *     buckets crossing shard bounds and accumulation; within 1e-6 with
 *     clipping (the norm sums the shards' squares in another order); and
 *     each rank holds the optimizer state of its shard only.
 * A row's `device` (NULL: the CPU) is the column a device adds. */
#include "equiv.h"

#define DS1 FG_STRATEGY_DEEPSPEED_STAGE_1
#define DS2 FG_STRATEGY_DEEPSPEED_STAGE_2
#define FSDP FG_STRATEGY_FSDP

/* One setup under each sharded kind of stages 1 and 2, against ddp. */
#define SHARDED(nm, ...)                                                                           \
    {.name = nm " deepspeed_stage_1", .kind = DS1, .ref = EQ_VS_DDP, __VA_ARGS__},                 \
        {.name = nm " deepspeed_stage_2", .kind = DS2, .ref = EQ_VS_DDP, __VA_ARGS__}, {           \
        .name = nm " fsdp SHARD_GRAD_OP", .kind = FSDP, .sharding = FG_SHARDING_SHARD_GRAD_OP,     \
        .ref = EQ_VS_DDP, __VA_ARGS__                                                              \
    }

static const eq_case k_ddp[] = {
    {.name = "ddp mlp", .kind = FG_STRATEGY_DDP, .world = 2, .batch = 8, .steps = 20, .tol = 1e-5},
    {.name = "ddp mlp", .kind = FG_STRATEGY_DDP, .world = 4, .batch = 4, .steps = 20, .tol = 1e-5},
    {.name = "ddp gpt",
     .kind = FG_STRATEGY_DDP,
     .world = 2,
     .batch = 3,
     .steps = 20,
     .model = EQ_GPT,
     .tol = 1e-5},
    {.name = "ddp gpt",
     .kind = FG_STRATEGY_DDP,
     .world = 4,
     .batch = 2,
     .steps = 20,
     .model = EQ_GPT,
     .tol = 1e-5},
    /* AdamW divides each gradient by its running RMS, so gradients that are
     * nearly zero turn float rounding (about 1e-7 of the largest gradient,
     * measured) into steps of a sizeable fraction of lr: after 20 steps the
     * runs agree to about 1e-4, not 1e-5. The gradients themselves are what
     * the SGD rows pin down to 1e-5. */
    {.name = "ddp gpt-adamw",
     .kind = FG_STRATEGY_DDP,
     .world = 2,
     .batch = 3,
     .steps = 20,
     .model = EQ_GPT,
     .opt = EQ_ADAMW,
     .lr = 1e-3,
     .tol = 5e-4},
    /* many buckets (0.001 MB) so reductions overlap backward, and no_sync
     * accumulation over 2 micro-batches */
    {.name = "ddp gpt-buckets",
     .kind = FG_STRATEGY_DDP,
     .ddp = {.bucket_cap_mb = 0.001},
     .world = 2,
     .batch = 4,
     .steps = 20,
     .model = EQ_GPT,
     .tol = 1e-5},
    {.name = "ddp mlp-accum",
     .kind = FG_STRATEGY_DDP,
     .world = 2,
     .batch = 8,
     .accum = 2,
     .steps = 20,
     .tol = 1e-5},
};

static const eq_case k_sharded[] = {
    SHARDED("gpt-adamw", .world = 2, .batch = 2, .model = EQ_GPT, .opt = EQ_ADAMW),
    SHARDED("gpt-adamw", .world = 3, .batch = 2, .model = EQ_GPT, .opt = EQ_ADAMW),
    SHARDED("mlp-sgd", .world = 2, .batch = 4),
    SHARDED("mlp-sgd", .world = 3, .batch = 4),
    /* the state of every optimizer is elementwise: sharded, it steps the
     * same bits as ddp's whole state (Adagrad's starts at its initial value
     * in each shard); groups and decay exclusions cut the same segments */
    SHARDED("mlp-adam", .world = 2, .batch = 4, .opt = EQ_ADAM_AMSGRAD, .reduce = 500),
    SHARDED("mlp-rmsprop", .world = 2, .batch = 4, .opt = EQ_RMSPROP_CENTERED, .reduce = 500),
    SHARDED("mlp-adagrad", .world = 2, .batch = 4, .opt = EQ_ADAGRAD, .reduce = 500),
    SHARDED("mlp-lion", .world = 2, .batch = 4, .opt = EQ_LION, .reduce = 500),
    SHARDED("gpt-adam-groups", .world = 3, .batch = 2, .model = EQ_GPT, .opt = EQ_ADAM_GROUPS),
    /* buckets of ~300 elements: many reductions during backward (stage 2),
     * several crossing a shard bound; all-gather in pieces of 100 */
    SHARDED("gpt-buckets", .world = 2, .batch = 2, .model = EQ_GPT, .opt = EQ_ADAMW, .reduce = 300,
            .gather = 100),
    SHARDED("gpt-buckets", .world = 3, .batch = 2, .model = EQ_GPT, .opt = EQ_ADAMW, .reduce = 300,
            .gather = 100),
    SHARDED("mlp-accum", .world = 2, .batch = 4, .accum = 2, .reduce = 500),
};

static const eq_case k_clipped[] = {
    SHARDED("gpt-clip", .world = 2, .batch = 2, .model = EQ_GPT, .opt = EQ_ADAMW, .clip = 0.5,
            .tol = 1e-6),
    SHARDED("mlp-clip", .world = 2, .batch = 4, .clip = 0.3, .reduce = 400, .tol = 1e-6),
    SHARDED("gpt-clip", .world = 3, .batch = 2, .model = EQ_GPT, .opt = EQ_ADAMW, .clip = 0.5,
            .tol = 1e-6),
    SHARDED("mlp-clip", .world = 3, .batch = 4, .clip = 0.3, .reduce = 400, .tol = 1e-6),
};

#define RUN(table) eq_run_table(table, sizeof table / sizeof table[0], getenv("FULGUR_EQ_CASE"))

TEST(ddp_equals_one_process) { RUN(k_ddp); }

TEST(sharded_bitwise_ddp) { RUN(k_sharded); }

TEST(sharded_clipping_close_to_ddp) { RUN(k_clipped); }
