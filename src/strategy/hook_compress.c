/* fp16_compress and bf16_compress (torch's default_hooks.fp16_compress_hook
 * and bf16_compress_hook): the bucket divided by the world size, cast to
 * the half dtype, summed over ranks in it, cast back to f32 in place.
 * PyTorch casts first and divides in f16; here the division is done in f32
 * before the one rounding to f16 (the same result or closer to the exact
 * one), and the communicator sums halves in f32 and rounds once. */
#include "ddp_hooks.h"

static FG_MUST_USE fg_status compress(const fg_ddp_bucket *b, fg_dtype dt) {
    float n = (float)b->world_size;
    for (int64_t i = 0; i < b->numel; i++) b->grad[i] /= n;
    return fg__ddp_bucket_allreduce_as(b, b->grad, b->numel, dt, FG_REDUCE_OP_SUM);
}

static FG_MUST_USE fg_status fp16_run(void *state, const fg_ddp_bucket *b) {
    (void)state;
    return compress(b, FG_F16);
}

static FG_MUST_USE fg_status bf16_run(void *state, const fg_ddp_bucket *b) {
    (void)state;
    return compress(b, FG_BF16);
}

const fg__ddp_hook_vt fg__hook_fp16 = {.name = "fp16_compress", .run = fp16_run};
const fg__ddp_hook_vt fg__hook_bf16 = {.name = "bf16_compress", .run = bf16_run};
