/* fulgur env's model-state table: for a model of --params parameters (or
 * a GPT of --layers/--embd/--vocab/--ctx), the bytes of parameters,
 * gradients and optimizer state each rank holds under the strategy asked
 * (each sharded strategy when none is), beside ddp's, from the library's
 * own cut (fg_strategy_memory_of): nothing is built. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "env_memory.h"

/* nanoGPT's GPT with biases (lm_head tied to wte): wte, wpe, per block
 * 12 C^2 + 13 C, ln_f. */
int64_t env_gpt_params(int64_t layers, int64_t embd, int64_t vocab, int64_t ctx) {
    return vocab * embd + ctx * embd + layers * (12 * embd * embd + 13 * embd) + 2 * embd;
}

static const char *human(int64_t b, char *buf, size_t cap) {
    static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int k = 0;
    while (v >= 1024 && k < 4) v /= 1024, k++;
    snprintf(buf, cap, k ? "%.2f %s" : "%.0f %s", v, u[k]);
    return buf;
}

static void row(const char *name, const char *rank, const fg_strategy_memory *m, int64_t ddp,
                int64_t state_elems) {
    char a[32], b[32], c[32], d[32];
    int64_t total = m->param_bytes + m->grad_bytes + m->optim_bytes;
    printf("    %-20s %-5s %11s %11s %11s %11s  %.2fx  %" PRId64 "\n", name, rank,
           human(m->param_bytes, a, sizeof a), human(m->grad_bytes, b, sizeof b),
           human(m->optim_bytes, c, sizeof c), human(total, d, sizeof d),
           ddp ? (double)total / (double)ddp : 0.0, state_elems);
}

int env_memory_print(const char *strategy, const char *sharding, int world, int64_t numel,
                     fg_dtype dtype) {
    const int nstates = 2; /* AdamW: exp_avg, exp_avg_sq */
    fg_strategy_memory ddp;
    if (fg_strategy_memory_of(FG_STRATEGY_DDP, NULL, world, 0, numel, dtype, nstates, &ddp) !=
        FG_OK) {
        cli_error("model state: %s", fg_last_error());
        return FG_EXIT_USAGE;
    }
    int64_t ddp_total = ddp.param_bytes + ddp.grad_bytes + ddp.optim_bytes;
    printf("model state per rank: %" PRId64 " parameters of %s, AdamW (2 state buffers), %d "
           "rank%s\n",
           numel, fg_dtype_name(dtype), world, world == 1 ? "" : "s");
    printf("    %-20s %-5s %11s %11s %11s %11s  %s  %s\n", "strategy", "rank", "parameters",
           "gradients", "optimizer", "total", "x ddp", "state elements");
    row("ddp", "each", &ddp, ddp_total, numel);
    fg_strategy_kind asked = FG_STRATEGY_COUNT;
    if (strategy && strcmp(strategy, "auto") &&
        fg_launch_parse_strategy(strategy, world, 1, &asked) != FG_OK) {
        cli_error("--strategy: %s", fg_last_error());
        return FG_EXIT_USAGE;
    }
    fg_sharded_opts o = {0};
    if (sharding && fg_sharding_strategy_parse(sharding, &o.sharding_strategy) != FG_OK) {
        cli_error("--sharding-strategy: %s", fg_last_error());
        return FG_EXIT_USAGE;
    }
    for (int k = 0; k < FG_STRATEGY_COUNT; k++) {
        fg_strategy_kind kind = (fg_strategy_kind)k;
        if (!fg_strategy_kind_is_sharded(kind) || (asked != FG_STRATEGY_COUNT && kind != asked))
            continue;
        fg_sharded_opts ko = o;
        if (kind == FG_STRATEGY_FSDP && asked != FG_STRATEGY_FSDP)
            ko.sharding_strategy = FG_SHARDING_FULL_SHARD; /* fsdp's default */
        char name[64];
        snprintf(name, sizeof name, "%s%s%s", fg_strategy_kind_name(kind),
                 kind == FG_STRATEGY_FSDP ? " " : "",
                 kind == FG_STRATEGY_FSDP ? fg_sharding_strategy_name(ko.sharding_strategy) : "");
        for (int r = 0; r < world; r++) {
            fg_strategy_memory m;
            if (fg_strategy_memory_of(kind, &ko, world, r, numel, dtype, nstates, &m) != FG_OK) {
                printf("    %-20s %s\n", name, fg_last_error());
                break;
            }
            char rank[16];
            snprintf(rank, sizeof rank, "%d", r);
            row(r ? "" : name, rank, &m, ddp_total,
                m.optim_bytes / nstates / (int64_t)fg_dtype_size(dtype));
        }
    }
    printf(
        "    (parameters stay whole on every rank under stages 1 and 2, gradients under\n"
        "    stage 1; stage 2 (fsdp SHARD_GRAD_OP) keeps the gradient's shard between steps\n"
        "    and stage 3 (fsdp FULL_SHARD) the parameters' too: this is what a rank holds\n"
        "    between steps, plus the gradient buckets not reduced yet during backward and,\n"
        "    under stage 3, the units gathered in use. Shards are cut on 64-byte lines. On a\n"
        "    CPU everything lives in host memory: there is no device memory to offload from.)\n");
    return FG_EXIT_OK;
}
