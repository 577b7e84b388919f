/* nvme offload under the sharded strategies, on forked ranks (shm): with
 * offload_optimizer_device = nvme, deepspeed_stage_1 and deepspeed_stage_2
 * on 1, 2 and 3 ranks end with bitwise the parameters and optimizer state
 * of the same strategy in memory (GPT with AdamW and clipping, MLP with SGD
 * and momentum, small buckets, the state streamed in 4 KiB blocks); each
 * rank's state is its shard, on disk; nothing is left under nvme_path;
 * freeing strategy and optimizer in either order. The runs are rows of the
 * equivalence engine (tests/strategy/equiv.h), against the same row with
 * the state in memory. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "strategy/equiv.h"

static int entries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    if (d) closedir(d);
    return n;
}

/* the state under a fresh folder, in 4 KiB blocks */
static void to_nvme(eq_case *c) {
    static char dir[8][64];
    static int k;
    char *d = dir[k++ % 8];
    snprintf(d, sizeof dir[0], "/tmp/fulgur-offload-mp-XXXXXX");
    CHECK(mkdtemp(d) != NULL);
    c->dir = d;
    c->sharded.offload_optimizer_device = FG_OFFLOAD_NVME;
    c->sharded.nvme_path = d;
}

static void in_memory(eq_case *c) {
    c->sharded.offload_optimizer_device = FG_OFFLOAD_NONE;
    c->sharded.nvme_path = NULL;
}

static void blocks(const eq_case *c, int rank) {
    (void)c, (void)rank;
    setenv("FULGUR_NVME_BLOCK_BYTES", "4096", 1);
}

static void on_disk(const eq_case *c, int rank, fg_strategy *st, fg_module *m, fg_optimizer *o,
                    eq_result *r) {
    (void)c, (void)st, (void)m;
    r->extra[rank][0] = fg_optimizer_state_on_disk(o, NULL, NULL);
}

/* each rank's state on disk (in memory in the reference); nothing left */
static void disk_check(const eq_case *c, const eq_result *got, const eq_result *ref) {
    for (int r = 0; r < c->world; r++)
        CHECK_MSG(got->extra[r][0] == 1 && ref->extra[r][0] == 0,
                  "%s rank %d: state on disk %lld (in memory: %lld)", c->name, r,
                  (long long)got->extra[r][0], (long long)ref->extra[r][0]);
    CHECK_MSG(entries(c->dir) == 0, "%s: %d files left under %s", c->name, entries(c->dir), c->dir);
}

static void remove_dir(const eq_case *c) {
    if (c->dir) rmdir(c->dir);
}

static const eq_hooks k_nvme = {.before = to_nvme,
                                .plain = in_memory,
                                .check = disk_check,
                                .after = remove_dir,
                                .rank_setup = blocks,
                                .rank_done = on_disk};

#define DS1 FG_STRATEGY_DEEPSPEED_STAGE_1
#define DS2 FG_STRATEGY_DEEPSPEED_STAGE_2

/* 5 steps, 2 rows a rank, buckets of 300 and 200 elements, against the
 * same row in memory, states too; a world of 1 is the single strategy */
#define OFF(nm, k, w, ...)                                                                         \
    {                                                                                              \
        .name = nm, .kind = (w) > 1 ? (k) : FG_STRATEGY_SINGLE, .world = w, .steps = 5,            \
        .batch = 2, .reduce = 300, .gather = 200, .ref = EQ_VS_PLAIN, .state = true,               \
        .opt_first = (w) == 2, .hooks = &k_nvme, __VA_ARGS__                                       \
    }
#define GPT .model = EQ_GPT, .opt = EQ_ADAMW, .clip = 0.5

static const eq_case k_gpt[] = {
    OFF("gpt-adamw", DS2, 1, GPT), OFF("gpt-adamw", DS2, 2, GPT), OFF("gpt-adamw", DS1, 2, GPT),
    OFF("gpt-adamw", DS2, 3, GPT), OFF("gpt-adamw", DS1, 3, GPT),
};

static const eq_case k_mlp[] = {
    OFF("mlp-sgd", DS2, 1),
    OFF("mlp-sgd", DS2, 2),
};

#define RUN(table) eq_run_table(table, sizeof table / sizeof table[0], getenv("FULGUR_EQ_CASE"))

TEST(offload_gpt_adamw_bitwise) { RUN(k_gpt); }

TEST(offload_mlp_sgd_bitwise) { RUN(k_mlp); }

TEST(offload_checks) {
    fg_sharded_opts so = {.offload_optimizer_device = FG_OFFLOAD_NVME};
    CHECK_STATUS(fg_strategy_check_sharded(FG_STRATEGY_DEEPSPEED_STAGE_2, &so), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "needs nvme_path");
    so.nvme_path = "/tmp";
    CHECK_OK(fg_strategy_check_sharded(FG_STRATEGY_DEEPSPEED_STAGE_2, &so));
    CHECK_OK(fg_strategy_check_sharded(FG_STRATEGY_SINGLE, &so));
    CHECK_STATUS(fg_strategy_check_sharded(FG_STRATEGY_DDP, &so), FG_EINVAL);
    CHECK_STATUS(fg_strategy_check_sharded(FG_STRATEGY_FSDP, &so), FG_EINVAL);
    so = (fg_sharded_opts){.offload_params_device = FG_OFFLOAD_CPU,
                           .sharding_strategy = FG_SHARDING_SHARD_GRAD_OP};
    CHECK_OK(fg_strategy_check_sharded(FG_STRATEGY_FSDP, &so));
    CHECK_STATUS(fg_strategy_check_sharded(FG_STRATEGY_DEEPSPEED_STAGE_2, &so), FG_EINVAL);
    so = (fg_sharded_opts){.offload_optimizer_device = (fg_offload_device)7};
    CHECK_STATUS(fg_strategy_check_sharded(FG_STRATEGY_DEEPSPEED_STAGE_1, &so), FG_EINVAL);
    fg_offload_device d;
    CHECK_OK(fg_offload_device_parse("NVMe", &d));
    CHECK(d == FG_OFFLOAD_NVME && !strcmp(fg_offload_device_name(d), "nvme"));
    CHECK_STATUS(fg_offload_device_parse("disk", &d), FG_EINVAL);
    CHECK(fg_offload_nvme_available());
}
