/* Parameter offload to nvme under ZeRO stage 3 (offload_params_device =
 * nvme), on forked ranks (shm): deepspeed_stage_3 on 2 and 3 ranks ends
 * with bitwise the parameters and optimizer state of stage 3 in memory
 * (GPT with AdamW and clipping, units per block; MLP with SGD and
 * momentum, units by size; small gather and reduce pieces, 4 KiB blocks);
 * between steps a rank holds none of its shard's parameter pages (mincore)
 * and reads it back from disk each forward and backward; freeing the
 * optimizer or the strategy first leaves the model with its shard; nothing
 * is left under nvme_path; a full disk (a small tmpfs, a file-size limit)
 * fails the setup on every rank naming the path; the checks. The runs are
 * rows of the equivalence engine (tests/strategy/equiv.h), against the
 * same row in memory. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <unistd.h>

#include "strategy/equiv.h"

#define STEPS 4
#define DS3 FG_STRATEGY_DEEPSPEED_STAGE_3

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

static int entries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    if (d) closedir(d);
    return n;
}

/* the parameter shards under a fresh folder */
static void to_nvme(eq_case *c) {
    static char dir[8][64];
    static int k;
    char *d = dir[k++ % 8];
    snprintf(d, sizeof dir[0], "/tmp/fulgur-poffload-mp-XXXXXX");
    CHECK(mkdtemp(d) != NULL);
    c->dir = d;
    c->sharded.offload_params_device = FG_OFFLOAD_NVME;
    c->sharded.nvme_path = d;
}

static void in_memory(eq_case *c) {
    c->sharded.offload_params_device = FG_OFFLOAD_NONE;
    c->sharded.nvme_path = NULL;
}

static void remove_dir(const eq_case *c) {
    if (c->dir) rmdir(c->dir);
}

static void blocks(const eq_case *c, int rank) {
    (void)c, (void)rank;
    setenv("FULGUR_NVME_BLOCK_BYTES", "4096", 1);
}

/* after the last step: the shard's resident pages, the bytes read, the
 * state on disk */
static void shard_figures(const eq_case *c, int rank, fg_strategy *st, fg_module *m,
                          fg_optimizer *o, eq_result *r) {
    (void)c;
    int64_t lo = 0, hi = 0;
    CHECK_OK(fg_strategy_shard_range(st, rank, &lo, &hi));
    const char *flat = fg_tensor_data(fg_module_flat_params(m));
    r->extra[rank][0] = resident_pages(flat + (size_t)lo * 4, (size_t)(hi - lo) * 4);
    uint64_t read = 0;
    fg_optimizer_state_on_disk(o, &read, NULL);
    r->extra[rank][1] = (int64_t)read;
    r->extra[rank][2] = fg_optimizer_state_on_disk(o, NULL, NULL);
}

/* strategy and optimizer freed (in the row's order): the model still holds
 * its shard of the trained parameters (rank 0's, which every rank has) */
static void shard_kept(const eq_case *c, int rank, fg_module *m, eq_result *r) {
    (void)c;
    int64_t lo = r->range[rank][0], hi = r->range[rank][1];
    const float *flat = fg_tensor_data(fg_module_flat_params(m));
    r->extra[rank][3] = !memcmp(flat + lo, r->params + lo, sizeof(float) * (size_t)(hi - lo));
}

static void offload_check(const eq_case *c, const eq_result *got, const eq_result *ref) {
    uint64_t shard_bytes = (uint64_t)got->numel * 4 / (uint64_t)c->world;
    for (int r = 0; r < c->world; r++) {
        CHECK(got->extra[r][2] == 1 && ref->extra[r][2] == 0);
        CHECK_MSG(got->extra[r][3] && ref->extra[r][3], "%s rank %d: the shard after free (%d %d)",
                  c->name, r, (int)ref->extra[r][3], (int)got->extra[r][3]);
        /* between steps: none of the shard's pages but one at most per
         * unit bound (a page two units share is kept); in memory: all */
        CHECK_MSG(got->extra[r][0] <= 4 && ref->extra[r][0] >= 4 * got->extra[r][0],
                  "%s rank %d: %d shard pages resident (%d in memory)", c->name, r,
                  (int)got->extra[r][0], (int)ref->extra[r][0]);
        /* every step read the shard for forward and backward, and the
         * optimizer read it once more with the state */
        CHECK_MSG((uint64_t)got->extra[r][1] >= (uint64_t)STEPS * 2 * shard_bytes * 9 / 10,
                  "%s rank %d: %llu bytes read", c->name, r, (unsigned long long)got->extra[r][1]);
    }
    CHECK(entries(c->dir) == 0);
}

static const eq_hooks k_nvme = {.before = to_nvme,
                                .plain = in_memory,
                                .check = offload_check,
                                .after = remove_dir,
                                .rank_setup = blocks,
                                .rank_done = shard_figures,
                                .rank_end = shard_kept};

/* 4 steps of 2 rows a rank, gather pieces of 200, reduce buckets of 300,
 * against stage 3 in memory, states too */
#define POFF(nm, w, first, ...)                                                                    \
    {                                                                                              \
        .name = nm, .kind = DS3, .world = w, .steps = STEPS, .batch = 2, .reduce = 300,            \
        .gather = 200, .ref = EQ_VS_PLAIN, .state = true, .opt_first = first, .hooks = &k_nvme,    \
        __VA_ARGS__                                                                                \
    }
#define GPT .model = EQ_GPT_WIDE, .opt = EQ_ADAMW, .clip = 0.5
#define MLP .model = EQ_MLP_WIDE, .sharded = {.min_num_params = 1000}

static const eq_case k_gpt[] = {
    POFF("gpt-adamw", 2, false, GPT),
    POFF("gpt-adamw-optfirst", 2, true, GPT),
    POFF("gpt-adamw", 3, false, GPT),
};

static const eq_case k_mlp[] = {POFF("mlp-sgd", 2, true, MLP)};

#define RUN(table) eq_run_table(table, sizeof table / sizeof table[0], getenv("FULGUR_EQ_CASE"))

TEST(param_offload_gpt_adamw_bitwise) { RUN(k_gpt); }

TEST(param_offload_mlp_sgd_bitwise) { RUN(k_mlp); }

/* A full disk under nvme_path fails the setup of every rank, naming the
 * path; nothing is left there. */
static void fsize_limit(const eq_case *c, int rank) {
    (void)rank;
    blocks(c, rank);
    if (c->expect) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {(rlim_t)c->expect, (rlim_t)c->expect};
        setrlimit(RLIMIT_FSIZE, &rl);
    }
}

static void full_check(const eq_case *c, const eq_result *got, const eq_result *ref) {
    (void)ref;
    for (int r = 0; r < c->world; r++) {
        CHECK_CONTAINS(got->err[r], c->dir);
        CHECK_CONTAINS(got->err[r], "parameters");
        CHECK_CONTAINS(got->err[r], c->expect ? "File too large" : "cannot hold");
        if (r == 0) printf("  %s\n", got->err[r]);
    }
    CHECK(entries(c->dir) == 0);
}

static const eq_hooks k_full = {.check = full_check, .rank_setup = fsize_limit};

/* fsize: RLIMIT_FSIZE in the ranks (0: a 16 KiB tmpfs instead) */
static void full_disk(const char *how, long fsize) {
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/fulgur-poffload-full-XXXXXX");
    CHECK(mkdtemp(dir) != NULL);
    bool mounted = false;
    if (!fsize) {
        if (mount("fulgur-test", dir, "tmpfs", 0, "size=16k") != 0) {
            SKIP("cannot mount a small tmpfs (%s): needs root", strerror(errno));
            rmdir(dir);
            return;
        }
        mounted = true;
    }
    eq_case c = POFF(how, 2, false, GPT, .setup_fails = true, .expect = fsize, .dir = dir,
                     .sharded = {.offload_params_device = FG_OFFLOAD_NVME, .nvme_path = dir});
    c.hooks = &k_full;
    eq_run(&c);
    if (mounted) umount(dir);
    rmdir(dir);
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

/* Stage 3 without a communicator is a single device: nothing is sharded to
 * offload (the fabric gives one rank a group of one). */
TEST(param_offload_one_rank) {
    fg_module *m = eq_model_new(&(eq_case){.model = EQ_GPT_WIDE});
    fg_optimizer *o = fg_adamw_new(m, &(fg_adamw_opts){.lr = 1e-2});
    fg_sharded_opts so = {.offload_params_device = FG_OFFLOAD_NVME, .nvme_path = "/tmp"};
    CHECK(fg_strategy_new(FG_STRATEGY_SINGLE, NULL, m, o, NULL, &so, 0) == NULL);
    CHECK_CONTAINS(fg_last_error(), "give it a communicator");
    fg_optimizer_free(o);
    fg_module_free(m);
}
