/* fulgur env: the model-state bytes per rank of each strategy (env_memory.c). */
#ifndef FULGUR_ENV_MEMORY_H
#define FULGUR_ENV_MEMORY_H

#include "fulgur/fulgur.h"

/* The parameters of nanoGPT's GPT (biases on, lm_head tied). */
int64_t env_gpt_params(int64_t layers, int64_t embd, int64_t vocab, int64_t ctx);

/* Prints the table for a model of numel parameters of dtype on world
 * ranks: ddp's line, then each rank's under `strategy` (NULL or "auto":
 * every sharded strategy; fsdp with `sharding`, default SHARD_GRAD_OP).
 * Returns an exit code (FG_EXIT_USAGE for a bad strategy). */
int env_memory_print(const char *strategy, const char *sharding, int world, int64_t numel,
                     fg_dtype dtype);

#endif
