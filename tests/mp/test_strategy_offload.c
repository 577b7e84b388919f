/* nvme offload under the sharded strategies, on forked ranks (shm): with
 * offload_optimizer_device = nvme, deepspeed_stage_1 and deepspeed_stage_2
 * on 1, 2 and 3 ranks end with bitwise the parameters and optimizer state
 * of the same strategy in memory (GPT with AdamW and clipping, MLP with SGD
 * and momentum, small buckets, the state streamed in 4 KiB blocks); each
 * rank's state is its shard, on disk; nothing is left under nvme_path;
 * freeing strategy and optimizer in either order. */
#include <dirent.h>
#include <stdio.h>
#include <sys/mman.h>

#include "fulgur/strategy.h"
#include "harness.h"
#include "mp_join.h"

#define STEPS 5

typedef struct shared {
    bool gpt, nvme, opt_first;
    int world;
    fg_strategy_kind kind;
    char job[64], dir[128];
    float params[1 << 15];
    float state[2][1 << 15]; /* each rank writes its shard's range */
    int on_disk[8];
} shared;

static fg_module *make_model(bool gpt) {
    if (gpt)
        return fg_gpt_new(&(fg_gpt_config){
            .vocab = 17, .ctx = 8, .layers = 2, .heads = 2, .embd = 16, .seed = 5});
    return fg_mlp_new(&(fg_mlp_config){.sizes = {12, 32, 32, 5}, .seed = 5});
}

static int rank_main(int rank, int n, void *arg) {
    shared *sh = arg;
    fg_comm *c = n > 1 ? mp_join_shm(rank, n, sh->job, 60) : NULL;
    if (n > 1 && !c) return 1;
    fg_set_num_threads(1);
    setenv("FULGUR_NVME_BLOCK_BYTES", "4096", 1);
    fg_module *m = make_model(sh->gpt);
    fg_optimizer *o =
        sh->gpt ? fg_adamw_new(m, &(fg_adamw_opts){.lr = 1e-2, .weight_decay = 0.1})
                : fg_sgd_new(m, &(fg_sgd_opts){.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3});
    fg_sharded_opts so = {.reduce_bucket_size = 300, .allgather_bucket_size = 200};
    if (sh->nvme) {
        so.offload_optimizer_device = FG_OFFLOAD_NVME;
        so.nvme_path = sh->dir;
    }
    fg_strategy *st = fg_strategy_new(n > 1 ? sh->kind : FG_STRATEGY_SINGLE, c, m, o, NULL, &so, 0);
    if (!st) {
        fprintf(stderr, "rank %d: %s\n", rank, fg_last_error());
        return 1;
    }
    int bad = 0;
    for (int step = 0; step < STEPS && !bad; step++) {
        fg_optimizer_zero_grad(o);
        int64_t B = 2, r0 = rank * B;
        fg_tensor *x, *y;
        if (sh->gpt) {
            x = fg_empty(FG_I32, 2, (int64_t[]){B, 8});
            y = fg_empty(FG_I32, 2, (int64_t[]){B, 8});
            for (int64_t i = 0; i < B * 8; i++) {
                uint64_t k = (uint64_t)step * 1000003u + (uint64_t)(r0 * 8 + i);
                ((int32_t *)fg_tensor_data(x))[i] = (int32_t)(fg_rng_u32_at(11, k) % 17);
                ((int32_t *)fg_tensor_data(y))[i] = (int32_t)(fg_rng_u32_at(12, k) % 17);
            }
        } else {
            x = fg_empty(FG_F32, 2, (int64_t[]){B, 12});
            y = fg_empty(FG_I32, 1, (int64_t[]){B});
            fg_rng_fill_normal(13, (uint64_t)step * 100000u + (uint64_t)r0 * 12, fg_tensor_data(x),
                               B * 12, 0, 1);
            for (int64_t i = 0; i < B; i++)
                ((int32_t *)fg_tensor_data(y))[i] =
                    (int32_t)(fg_rng_u32_at(14, (uint64_t)step * 1000u + (uint64_t)(r0 + i)) % 5);
        }
        fg_tensor *l = fg_cross_entropy(fg_module_forward(m, x), y, -100);
        bad |= fg_strategy_backward(st, l) != FG_OK;
        if (!bad && sh->gpt) bad |= fg_strategy_clip_grad_norm(st, 0.5, NULL) != FG_OK;
        if (!bad) bad |= fg_optimizer_step(o) != FG_OK;
        if (bad) fprintf(stderr, "rank %d step %d: %s\n", rank, step, fg_last_error());
        fg_step_reset();
    }
    fg_tensor *flat = fg_module_flat_params(m);
    if (rank == 0) memcpy(sh->params, fg_tensor_data(flat), fg_tensor_nbytes(flat));
    int64_t lo, hi;
    fg_optimizer_state_range(o, &lo, &hi);
    for (int i = 0; i < fg_optimizer_num_states(o); i++)
        memcpy(sh->state[i] + lo, fg_tensor_data(fg_optimizer_state(o, i)),
               sizeof(float) * (size_t)(hi - lo));
    sh->on_disk[rank] = fg_optimizer_state_on_disk(o, NULL, NULL);
    if (sh->opt_first) {
        fg_optimizer_free(o);
        fg_strategy_free(st);
    } else {
        fg_strategy_free(st);
        fg_optimizer_free(o);
    }
    fg_module_free(m);
    fg_comm_free(c);
    return bad;
}

static bool run(shared *sh, const char *what) {
    snprintf(sh->job, sizeof sh->job, "t-off-%d-%s-%d-%d-%d", getpid(), what, (int)sh->kind,
             sh->world, sh->nvme);
    int failed = fg_test_fork_ranks(sh->world, rank_main, sh, 120);
    CHECK_MSG(failed == 0, "%s (%s, %d ranks, nvme %d): %d ranks failed", what,
              fg_strategy_kind_name(sh->kind), sh->world, sh->nvme, failed);
    return failed == 0;
}

static int entries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    if (d) closedir(d);
    return n;
}

static void compare(bool gpt, fg_strategy_kind kind, int world, const char *what) {
    shared *a =
        mmap(NULL, sizeof(shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    shared *b =
        mmap(NULL, sizeof(shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    *a = (shared){.gpt = gpt, .world = world, .kind = kind};
    *b = (shared){.gpt = gpt, .world = world, .kind = kind, .nvme = true, .opt_first = world == 2};
    snprintf(b->dir, sizeof b->dir, "/tmp/fulgur-offload-mp-XXXXXX");
    CHECK(mkdtemp(b->dir) != NULL);
    if (run(a, what) && run(b, what)) {
        fg_module *m = make_model(gpt);
        size_t bytes = fg_tensor_nbytes(fg_module_flat_params(m));
        fg_module_free(m);
        CHECK_MSG(!memcmp(a->params, b->params, bytes), "%s, %s on %d ranks: parameters differ",
                  what, fg_strategy_kind_name(kind), world);
        CHECK_MSG(!memcmp(a->state, b->state, sizeof a->state),
                  "%s, %s on %d ranks: optimizer state differs", what, fg_strategy_kind_name(kind),
                  world);
        for (int r = 0; r < world; r++) CHECK(b->on_disk[r] == 1 && a->on_disk[r] == 0);
        CHECK(entries(b->dir) == 0);
    }
    rmdir(b->dir);
    munmap(a, sizeof *a);
    munmap(b, sizeof *b);
}

TEST(offload_gpt_adamw_bitwise) {
    compare(true, FG_STRATEGY_DEEPSPEED_STAGE_2, 1, "gpt-adamw");
    for (int w = 2; w <= 3; w++) {
        compare(true, FG_STRATEGY_DEEPSPEED_STAGE_2, w, "gpt-adamw");
        compare(true, FG_STRATEGY_DEEPSPEED_STAGE_1, w, "gpt-adamw");
    }
}

TEST(offload_mlp_sgd_bitwise) {
    for (int w = 1; w <= 2; w++) compare(false, FG_STRATEGY_DEEPSPEED_STAGE_2, w, "mlp-sgd");
}

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
