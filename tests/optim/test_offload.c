/* offload_optimizer_device=nvme at the optimizer: the state streamed from
 * files in small blocks gives bitwise the in-memory optimizer's parameters
 * and state (AdamW and SGD with momentum, a shard that starts off a block,
 * state that existed before the offload, state written through the mapped
 * tensors as a checkpoint load does); nothing is left in the directory;
 * a missing or non-directory nvme_path and a full disk are clear errors at
 * setup naming the path and the bytes, with the optimizer untouched; a disk
 * that fills after setup does not stop the run (the files were allocated
 * whole). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fixtures.h"
#include "fulgur/optim.h"
#include "harness.h"
#include "optim/nvme_store.h"
#include "optim/optim_impl.h"

#define BLOCK 4096 /* 1024 f32 per block: many blocks even for a small model */

static fg_module *model(void) {
    return fg_mlp_new(&(fg_mlp_config){.sizes = {40, 96, 64, 7}, .seed = 3});
}

/* 0 SGD, 1 AdamW, 2 Adam with AMSGrad (three states), 3 Adagrad (a state
 * that starts non-zero), 4 RMSprop centred with momentum (three states) */
static fg_optimizer *opt(fg_module *m, int kind) {
    if (kind == 1) return fg_adamw_new(m, &(fg_adamw_opts){.lr = 1e-2, .weight_decay = 0.1});
    if (kind == 2) return fg_adam_new(m, &(fg_adam_opts){.lr = 1e-2, .amsgrad = true});
    if (kind == 3)
        return fg_adagrad_new(m, &(fg_adagrad_opts){.lr = 0.05, .initial_accumulator_value = 0.1});
    if (kind == 4) return fg_rmsprop_new(m, &(fg_rmsprop_opts){.momentum = 0.5, .centered = true});
    return fg_sgd_new(m, &(fg_sgd_opts){.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3});
}

/* gradients of step k: a pure function of (k, element) */
static void grads(fg_module *m, int k) {
    fg_tensor *g = fg_module_flat_grads(m);
    fg_rng_fill_normal(77, (uint64_t)k * 1000003u, fg_tensor_data(g), fg_tensor_numel(g), 0, 1);
}

static char g_dir[256];

static int entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

static const char *tmpdir(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/fulgur-offload-test-XXXXXX");
    return mkdtemp(g_dir);
}

static bool same_state(fg_optimizer *a, fg_optimizer *b) {
    bool ok = fg_optimizer_num_states(a) == fg_optimizer_num_states(b);
    for (int i = 0; ok && i < fg_optimizer_num_states(a); i++) {
        fg_tensor *x = fg_optimizer_state(a, i), *y = fg_optimizer_state(b, i);
        ok = fg_tensor_numel(x) == fg_tensor_numel(y) &&
             !memcmp(fg_tensor_data(x), fg_tensor_data(y), fg_tensor_nbytes(x));
    }
    return ok;
}

static bool same_params(fg_module *a, fg_module *b) {
    fg_tensor *x = fg_module_flat_params(a), *y = fg_module_flat_params(b);
    return !memcmp(fg_tensor_data(x), fg_tensor_data(y), fg_tensor_nbytes(x));
}

/* in memory vs offloaded after `before` steps in memory, on [lo, hi) of
 * the layout (a shard) or all of it (hi = 0) */
static void bitwise(int adamw, int before, int64_t lo, int64_t hi) {
    const char *dir = tmpdir();
    CHECK(dir != NULL);
    fg_module *ma = model(), *mb = model();
    fg_optimizer *a = opt(ma, adamw), *b = opt(mb, adamw);
    if (hi) {
        CHECK_OK(fg__optimizer_shard_state(a, lo, hi));
        CHECK_OK(fg__optimizer_shard_state(b, lo, hi));
    }
    for (int k = 0; k < 8; k++) {
        if (k == before) {
            CHECK_OK(fg__optimizer_offload_nvme(b, dir, BLOCK));
            CHECK(fg__optimizer_offloaded(b));
            CHECK(entries(dir) == 0); /* unlinked files */
            CHECK(same_state(a, b));  /* what it held, now read from the files */
        }
        grads(ma, k);
        grads(mb, k);
        CHECK_OK(fg_optimizer_step(a));
        CHECK_OK(fg_optimizer_step(b));
    }
    CHECK(same_params(ma, mb));
    CHECK(same_state(a, b));
    uint64_t rd, wr;
    fg__optimizer_offload_counts(b, &rd, &wr);
    int64_t b0, b1;
    fg_optimizer_state_range(b, &b0, &b1);
    size_t bytes = (size_t)(b1 - b0) * 4 * (size_t)fg_optimizer_num_states(b);
    printf("  %s, %d steps in memory first, range [%lld, %lld): %llu bytes read, %llu written "
           "(%zu of state), %s\n",
           fg_optimizer_name(a), before, (long long)b0, (long long)b1, (unsigned long long)rd,
           (unsigned long long)wr, bytes,
           fg__optimizer_offload_direct(b) ? "O_DIRECT" : "buffered");
    CHECK(rd >= (uint64_t)(8 - before) * bytes);
    fg_optimizer_free(a);
    fg_optimizer_free(b);
    CHECK(entries(dir) == 0);
    fg_module_free(ma);
    fg_module_free(mb);
    rmdir(dir);
}

TEST(adamw_bitwise) { bitwise(1, 0, 0, 0); }
TEST(adamw_bitwise_after_steps) { bitwise(1, 3, 0, 0); }
TEST(adamw_shard_off_block) { bitwise(1, 2, 1040, 9000); }
TEST(sgd_bitwise) { bitwise(0, 1, 0, 0); }
TEST(other_optimizers_bitwise) {
    for (int k = 2; k <= 4; k++) {
        bitwise(k, 0, 0, 0);
        bitwise(k, 2, 1040, 9000);
    }
}

/* writing the mapped state (as a checkpoint load does) reaches the next step */
TEST(state_written_through_the_tensors) {
    const char *dir = tmpdir();
    fg_module *ma = model(), *mb = model();
    fg_optimizer *a = opt(ma, true), *b = opt(mb, true);
    CHECK_OK(fg__optimizer_offload_nvme(b, dir, BLOCK));
    for (int k = 0; k < 4; k++) {
        if (k == 2)
            for (int i = 0; i < 2; i++) {
                fg_tensor *x = fg_optimizer_state(a, i), *y = fg_optimizer_state(b, i);
                fg_rng_fill_uniform(9 + (uint64_t)i, 0, fg_tensor_data(x), fg_tensor_numel(x));
                fg_rng_fill_uniform(9 + (uint64_t)i, 0, fg_tensor_data(y), fg_tensor_numel(y));
            }
        grads(ma, k);
        grads(mb, k);
        CHECK_OK(fg_optimizer_step(a));
        CHECK_OK(fg_optimizer_step(b));
    }
    CHECK(same_params(ma, mb));
    CHECK(same_state(a, b));
    fg_optimizer_free(a);
    fg_optimizer_free(b);
    fg_module_free(ma);
    fg_module_free(mb);
    rmdir(dir);
}

static void untouched_after_error(fg_optimizer *o, fg_module *m, const char *path) {
    CHECK(!fg__optimizer_offloaded(o));
    /* the state is still the in-memory one, and steps */
    grads(m, 0);
    CHECK_OK(fg_optimizer_step(o));
    CHECK(fg_optimizer_step_count(o) == 2);
    (void)path;
}

TEST(bad_path) {
    fg_module *m = model();
    fg_optimizer *o = opt(m, true);
    grads(m, 0);
    CHECK_OK(fg_optimizer_step(o));
    CHECK_STATUS(fg__optimizer_offload_nvme(o, "/nonexistent/fulgur-nvme", BLOCK), FG_EIO);
    CHECK_CONTAINS(fg_last_error(), "nvme_path=/nonexistent/fulgur-nvme");
    CHECK_CONTAINS(fg_last_error(), "bytes");
    CHECK_STATUS(fg__optimizer_offload_nvme(o, "/etc/hostname", BLOCK), FG_EIO);
    CHECK_CONTAINS(fg_last_error(), "not a directory");
    CHECK_STATUS(fg__optimizer_offload_nvme(o, NULL, BLOCK), FG_EINVAL);
    CHECK_STATUS(fg__optimizer_offload_nvme(o, "/tmp", 1000), FG_EINVAL);
    untouched_after_error(o, m, NULL);
    fg_optimizer_free(o);
    fg_module_free(m);
}

/* A tmpfs of 64 KiB: the state (2 x ~40 KiB) does not fit. */
TEST(full_disk_tmpfs) {
    const char *dir = tmpdir();
    if (mount("fulgur-test", dir, "tmpfs", 0, "size=64k") != 0) {
        SKIP("cannot mount a small tmpfs (%s): needs root", strerror(errno));
        rmdir(dir);
        return;
    }
    fg_module *m = model();
    fg_optimizer *o = opt(m, true);
    grads(m, 0);
    CHECK_OK(fg_optimizer_step(o));
    fg_tensor *s0 = fg_optimizer_state(o, 0);
    float keep = ((float *)fg_tensor_data(s0))[5];
    CHECK_STATUS(fg__optimizer_offload_nvme(o, dir, BLOCK), FG_EIO);
    printf("  %s\n", fg_last_error());
    CHECK_CONTAINS(fg_last_error(), dir);
    CHECK_CONTAINS(fg_last_error(), "cannot hold");
    char need[64];
    snprintf(need, sizeof need, "needs %zu bytes",
             (size_t)2 * ((fg_module_numel(m) * 4 + 4095) / 4096 * 4096));
    CHECK_CONTAINS(fg_last_error(), need);
    CHECK(((float *)fg_tensor_data(fg_optimizer_state(o, 0)))[5] == keep);
    CHECK(entries(dir) == 0);
    untouched_after_error(o, m, dir);
    fg_optimizer_free(o);
    fg_module_free(m);
    umount(dir);
    rmdir(dir);
}

/* Space that runs out after setup does not reach the run: the files were
 * allocated whole at setup. */
TEST(disk_filling_after_setup) {
    const char *dir = tmpdir();
    if (mount("fulgur-test", dir, "tmpfs", 0, "size=256k") != 0) {
        SKIP("cannot mount a small tmpfs (%s): needs root", strerror(errno));
        rmdir(dir);
        return;
    }
    fg_module *ma = model(), *mb = model();
    fg_optimizer *a = opt(ma, true), *b = opt(mb, true);
    CHECK_OK(fg__optimizer_offload_nvme(b, dir, BLOCK));
    char path[300];
    snprintf(path, sizeof path, "%s/filler", dir);
    int fd = open(path, O_CREAT | O_WRONLY, 0600);
    char chunk[4096] = {1};
    while (fd >= 0 && write(fd, chunk, sizeof chunk) > 0) {
    }
    if (fd >= 0) close(fd);
    for (int k = 0; k < 3; k++) {
        grads(ma, k);
        grads(mb, k);
        CHECK_OK(fg_optimizer_step(a));
        CHECK_OK(fg_optimizer_step(b));
    }
    CHECK(same_params(ma, mb));
    CHECK(same_state(a, b));
    unlink(path);
    fg_optimizer_free(a);
    fg_optimizer_free(b);
    fg_module_free(ma);
    fg_module_free(mb);
    umount(dir);
    rmdir(dir);
}

/* A file-size limit (RLIMIT_FSIZE) below the state's size, in a child:
 * the allocation at setup fails, naming the path and the bytes. */
TEST(file_size_limit) {
    const char *dir = tmpdir();
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {16384, 16384};
        setrlimit(RLIMIT_FSIZE, &rl);
        fg_module *m = model();
        fg_optimizer *o = opt(m, true);
        fg_status st = fg__optimizer_offload_nvme(o, dir, BLOCK);
        int bad = st != FG_EIO || !strstr(fg_last_error(), dir) ||
                  !strstr(fg_last_error(), "File too large") || fg__optimizer_offloaded(o);
        if (bad) fprintf(stderr, "  child: status %d: %s\n", (int)st, fg_last_error());
        else printf("  %s\n", fg_last_error());
        fflush(stdout);
        _exit(bad);
    }
    int ws = 0;
    waitpid(pid, &ws, 0);
    CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    CHECK(entries(dir) == 0);
    rmdir(dir);
}

TEST(store_stream_errors) {
    fg__nvme_store *s = NULL;
    const char *dir = tmpdir();
    CHECK_OK(fg__nvme_store_new(dir, "a test", 2, 10000, BLOCK, &s));
    /* a block fn's failure stops the stream and is its result */
    CHECK(s != NULL);
    fg__nvme_store_free(s);
    CHECK(entries(dir) == 0);
    CHECK_STATUS(fg__nvme_store_new(dir, "a test", 9, 10, BLOCK, &s), FG_EINTERNAL);
    rmdir(dir);
}

/* Each allocation of the offload failing in turn: FG_ENOMEM, the state
 * still in memory and intact, nothing left in the directory. */
TEST(every_failed_allocation_is_an_error) {
    const char *dir = tmpdir();
    fg_module *m = model();
    fg_optimizer *o = opt(m, true);
    grads(m, 0);
    CHECK_OK(fg_optimizer_step(o));
    int errors = 0;
    for (int fail_at = 1; fail_at < 1000; fail_at++) {
        fx_alloc_begin_nth(fail_at);
        fg_status st = fg__optimizer_offload_nvme(o, dir, BLOCK);
        fx_alloc_end();
        if (st == FG_OK) break;
        CHECK_MSG(st == FG_ENOMEM, "failing allocation %d: %s", fail_at, fg_last_error());
        CHECK(!fg__optimizer_offloaded(o) && entries(dir) == 0);
        errors++;
    }
    CHECK(errors > 0 && fg__optimizer_offloaded(o));
    fg_optimizer_free(o);
    fg_module_free(m);
    rmdir(dir);
}
