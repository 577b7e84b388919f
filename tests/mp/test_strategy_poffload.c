/* Parameter offload to nvme under ZeRO stage 3 (offload_params_device =
 * nvme), on forked ranks (shm): deepspeed_stage_3 on 2 and 3 ranks ends
 * with bitwise the parameters and optimizer state of stage 3 in memory
 * (GPT with AdamW and clipping, units per block; MLP with SGD and
 * momentum, units by size; small gather and reduce pieces, 4 KiB blocks);
 * between steps a rank holds none of its shard's parameter pages (mincore)
 * and reads it back from disk each forward and backward; freeing the
 * optimizer or the strategy first leaves the model with its shard; nothing
 * is left under nvme_path; a full disk (a small tmpfs, a file-size limit)
 * fails the setup on every rank naming the path; the checks. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <unistd.h>

#include "fulgur/strategy.h"
#include "harness.h"
#include "mp_join.h"

#define STEPS 4

typedef struct shared {
    bool gpt, nvme, opt_first;
    int world;
    long fsize; /* RLIMIT_FSIZE in the ranks (0: none) */
    bool expect_fail;
    char job[64], dir[128];
    float params[1 << 16];
    float state[2][1 << 16]; /* each rank writes its shard's range */
    int on_disk[8], home_ok[8], setup_failed[8], resident[8];
    uint64_t read[8];
    char err[8][512];
} shared;

static fg_module *make_model(bool gpt) {
    if (gpt)
        return fg_gpt_new(&(fg_gpt_config){
            .vocab = 17, .ctx = 8, .layers = 3, .heads = 2, .embd = 32, .seed = 5});
    return fg_mlp_new(&(fg_mlp_config){.sizes = {12, 128, 128, 128, 5}, .seed = 5});
}

/* Resident pages of [p, p + n) that lie wholly inside it. */
static int resident_pages(const char *p, size_t n) {
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + ps - 1) & ~(uintptr_t)(ps - 1),
              b = (uintptr_t)(p + n) & ~(ps - 1);
    if (b <= a) return 0;
    size_t np = (b - a) / ps;
    unsigned char v[4096];
    if (np > sizeof v || mincore((void *)a, b - a, v)) return -1;
    int r = 0;
    for (size_t i = 0; i < np; i++) r += v[i] & 1;
    return r;
}

static fg_tensor *batch(bool gpt, int step, int rank, fg_tensor **y) {
    int64_t B = 2, r0 = rank * B;
    fg_tensor *x;
    if (gpt) {
        x = fg_empty(FG_I32, 2, (int64_t[]){B, 8});
        *y = fg_empty(FG_I32, 2, (int64_t[]){B, 8});
        for (int64_t i = 0; i < B * 8; i++) {
            uint64_t k = (uint64_t)step * 1000003u + (uint64_t)(r0 * 8 + i);
            ((int32_t *)fg_tensor_data(x))[i] = (int32_t)(fg_rng_u32_at(11, k) % 17);
            ((int32_t *)fg_tensor_data(*y))[i] = (int32_t)(fg_rng_u32_at(12, k) % 17);
        }
    } else {
        x = fg_empty(FG_F32, 2, (int64_t[]){B, 12});
        *y = fg_empty(FG_I32, 1, (int64_t[]){B});
        fg_rng_fill_normal(13, (uint64_t)step * 100000u + (uint64_t)r0 * 12, fg_tensor_data(x),
                           B * 12, 0, 1);
        for (int64_t i = 0; i < B; i++)
            ((int32_t *)fg_tensor_data(*y))[i] =
                (int32_t)(fg_rng_u32_at(14, (uint64_t)step * 1000u + (uint64_t)(r0 + i)) % 5);
    }
    return x;
}

static int rank_main(int rank, int n, void *arg) {
    shared *sh = arg;
    fg_comm *c = mp_join_shm(rank, n, sh->job, 60);
    if (!c) return 1;
    fg_set_num_threads(1);
    setenv("FULGUR_NVME_BLOCK_BYTES", "4096", 1);
    if (sh->fsize) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {(rlim_t)sh->fsize, (rlim_t)sh->fsize};
        setrlimit(RLIMIT_FSIZE, &rl);
    }
    fg_module *m = make_model(sh->gpt);
    fg_optimizer *o =
        sh->gpt ? fg_adamw_new(m, &(fg_adamw_opts){.lr = 1e-2, .weight_decay = 0.1})
                : fg_sgd_new(m, &(fg_sgd_opts){.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3});
    fg_sharded_opts so = {.reduce_bucket_size = 300,
                          .allgather_bucket_size = 200,
                          .min_num_params = sh->gpt ? 0 : 1000};
    if (sh->nvme) {
        so.offload_params_device = FG_OFFLOAD_NVME;
        so.nvme_path = sh->dir;
    }
    fg_strategy *st = fg_strategy_new(FG_STRATEGY_DEEPSPEED_STAGE_3, c, m, o, NULL, &so, 0);
    if (!st) {
        sh->setup_failed[rank] = 1;
        snprintf(sh->err[rank], sizeof sh->err[rank], "%s", fg_last_error());
        fg_optimizer_free(o);
        fg_module_free(m);
        fg_comm_free(c);
        return sh->expect_fail ? 0 : 1;
    }
    fg_tensor *flat = fg_module_flat_params(m);
    int64_t lo, hi;
    CHECK_OK(fg_strategy_shard_range(st, rank, &lo, &hi));
    char *shard = (char *)fg_tensor_data(flat) + (size_t)lo * 4;
    int bad = 0;
    for (int step = 0; step < STEPS && !bad; step++) {
        fg_optimizer_zero_grad(o);
        fg_tensor *y, *x = batch(sh->gpt, step, rank, &y);
        fg_tensor *l = fg_cross_entropy(fg_module_forward(m, x), y, -100);
        bad |= fg_strategy_backward(st, l) != FG_OK;
        if (!bad && sh->gpt) bad |= fg_strategy_clip_grad_norm(st, 0.5, NULL) != FG_OK;
        if (!bad) bad |= fg_optimizer_step(o) != FG_OK;
        if (bad) fprintf(stderr, "rank %d step %d: %s\n", rank, step, fg_last_error());
        fg_step_reset();
    }
    sh->resident[rank] = resident_pages(shard, (size_t)(hi - lo) * 4);
    fg_optimizer_state_on_disk(o, &sh->read[rank], NULL);
    bad |= fg_strategy_gather_params(st) != FG_OK;
    if (rank == 0) memcpy(sh->params, fg_tensor_data(flat), fg_tensor_nbytes(flat));
    float *mine = malloc(sizeof(float) * (size_t)(hi - lo + 1));
    memcpy(mine, shard, sizeof(float) * (size_t)(hi - lo));
    bad |= fg_strategy_release_params(st) != FG_OK;
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
    /* the model keeps its shard either way */
    sh->home_ok[rank] = !memcmp(mine, shard, sizeof(float) * (size_t)(hi - lo));
    free(mine);
    fg_module_free(m);
    fg_comm_free(c);
    return bad;
}

static bool run(shared *sh, const char *what) {
    snprintf(sh->job, sizeof sh->job, "t-poff-%d-%s-%d-%d-%d", getpid(), what, sh->world, sh->nvme,
             sh->opt_first);
    int failed = fg_test_fork_ranks(sh->world, rank_main, sh, 120);
    CHECK_MSG(failed == 0, "%s (%d ranks, nvme %d): %d ranks failed", what, sh->world, sh->nvme,
              failed);
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

static shared *new_shared(void) {
    shared *s =
        mmap(NULL, sizeof(shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    *s = (shared){0};
    return s;
}

static void compare(bool gpt, int world, bool opt_first, const char *what) {
    shared *a = new_shared(), *b = new_shared();
    a->gpt = b->gpt = gpt;
    a->world = b->world = world;
    b->nvme = true;
    b->opt_first = opt_first;
    snprintf(b->dir, sizeof b->dir, "/tmp/fulgur-poffload-mp-XXXXXX");
    CHECK(mkdtemp(b->dir) != NULL);
    if (run(a, what) && run(b, what)) {
        fg_module *m = make_model(gpt);
        int64_t numel = fg_module_numel(m);
        size_t bytes = fg_tensor_nbytes(fg_module_flat_params(m));
        fg_module_free(m);
        CHECK_MSG(!memcmp(a->params, b->params, bytes), "%s on %d ranks: parameters differ", what,
                  world);
        CHECK_MSG(!memcmp(a->state, b->state, sizeof a->state),
                  "%s on %d ranks: optimizer state differs", what, world);
        uint64_t shard_bytes = (uint64_t)numel * 4 / (uint64_t)world;
        for (int r = 0; r < world; r++) {
            CHECK(b->on_disk[r] == 1 && a->on_disk[r] == 0);
            CHECK_MSG(b->home_ok[r] && a->home_ok[r], "%s rank %d: the shard after free (%d %d)",
                      what, r, a->home_ok[r], b->home_ok[r]);
            /* between steps: none of the shard's pages but one at most per
             * unit bound (a page two units share is kept); in memory: all */
            CHECK_MSG(b->resident[r] <= 4 && a->resident[r] >= 4 * b->resident[r],
                      "%s rank %d: %d shard pages resident (%d in memory)", what, r, b->resident[r],
                      a->resident[r]);
            /* every step read the shard for forward and backward, and the
             * optimizer read it once more with the state */
            CHECK_MSG(b->read[r] >= (uint64_t)STEPS * 2 * shard_bytes * 9 / 10,
                      "%s rank %d: %llu bytes read", what, r, (unsigned long long)b->read[r]);
        }
        CHECK(entries(b->dir) == 0);
    }
    rmdir(b->dir);
    munmap(a, sizeof *a);
    munmap(b, sizeof *b);
}

TEST(param_offload_gpt_adamw_bitwise) {
    compare(true, 2, false, "gpt-adamw");
    compare(true, 2, true, "gpt-adamw-optfirst");
    compare(true, 3, false, "gpt-adamw");
}

TEST(param_offload_mlp_sgd_bitwise) { compare(false, 2, true, "mlp-sgd"); }

/* A full disk under nvme_path fails the setup of every rank, naming the
 * path; nothing is left there. */
static void full_disk(const char *how, long fsize) {
    shared *sh = new_shared();
    sh->gpt = true;
    sh->world = 2;
    sh->nvme = true;
    sh->fsize = fsize;
    sh->expect_fail = true;
    snprintf(sh->dir, sizeof sh->dir, "/tmp/fulgur-poffload-full-XXXXXX");
    CHECK(mkdtemp(sh->dir) != NULL);
    bool mounted = false;
    if (!fsize) {
        if (mount("fulgur-test", sh->dir, "tmpfs", 0, "size=16k") != 0) {
            SKIP("cannot mount a small tmpfs (%s): needs root", strerror(errno));
            rmdir(sh->dir);
            munmap(sh, sizeof *sh);
            return;
        }
        mounted = true;
    }
    if (run(sh, how))
        for (int r = 0; r < 2; r++) {
            CHECK_MSG(sh->setup_failed[r], "%s: rank %d set up", how, r);
            CHECK_CONTAINS(sh->err[r], sh->dir);
            CHECK_CONTAINS(sh->err[r], "parameters");
            CHECK_CONTAINS(sh->err[r], fsize ? "File too large" : "cannot hold");
            if (r == 0) printf("  %s\n", sh->err[r]);
        }
    CHECK(entries(sh->dir) == 0);
    if (mounted) umount(sh->dir);
    rmdir(sh->dir);
    munmap(sh, sizeof *sh);
}

TEST(param_offload_full_disk_tmpfs) { full_disk("tmpfs", 0); }
TEST(param_offload_file_size_limit) { full_disk("fsize", 16384); }

TEST(param_offload_checks) {
    fg_sharded_opts so = {.offload_params_device = FG_OFFLOAD_NVME};
    CHECK_STATUS(fg_strategy_check_sharded(FG_STRATEGY_DEEPSPEED_STAGE_3, &so), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "offload_params_device=nvme needs nvme_path");
    so.nvme_path = "/tmp";
    CHECK_OK(fg_strategy_check_sharded(FG_STRATEGY_DEEPSPEED_STAGE_3, &so));
    so.offload_optimizer_device = FG_OFFLOAD_NVME;
    CHECK_OK(fg_strategy_check_sharded(FG_STRATEGY_DEEPSPEED_STAGE_3, &so));
    so.offload_optimizer_device = FG_OFFLOAD_CPU;
    CHECK_STATUS(fg_strategy_check_sharded(FG_STRATEGY_DEEPSPEED_STAGE_3, &so), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "must be nvme (or unset)");
    so.offload_optimizer_device = FG_OFFLOAD_NONE;
    CHECK_STATUS(fg_strategy_check_sharded(FG_STRATEGY_DEEPSPEED_STAGE_2, &so), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "needs deepspeed_stage_3");
    CHECK_STATUS(fg_strategy_check_sharded(FG_STRATEGY_FSDP, &so), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "cpu only");
    so.offload_params_device = FG_OFFLOAD_CPU; /* nothing to move */
    CHECK_OK(fg_strategy_check_sharded(FG_STRATEGY_DEEPSPEED_STAGE_3, &so));
}

/* Stage 3 on one rank is a single device: nothing is sharded to offload. */
TEST(param_offload_one_rank) {
    fg_module *m = make_model(true);
    fg_optimizer *o = fg_adamw_new(m, &(fg_adamw_opts){.lr = 1e-2});
    fg_sharded_opts so = {.offload_params_device = FG_OFFLOAD_NVME, .nvme_path = "/tmp"};
    CHECK(fg_strategy_new(FG_STRATEGY_SINGLE, NULL, m, o, NULL, &so, 0) == NULL);
    CHECK_CONTAINS(fg_last_error(), "2 or more ranks");
    fg_optimizer_free(o);
    fg_module_free(m);
}
