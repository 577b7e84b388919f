/* fg_module_to_device both ways: an MLP moved to the guarded device with
 * its optimizer, trained a step there, moved back to host memory (module.cpu())
 * and trained another: parameters, gradients and the optimizer state end
 * bitwise those of the same two steps on the CPU, and the guarded device
 * holds nothing afterwards (every buffer freed, the references released).
 * From one device to another through the host, bitwise; a move the target
 * device has no room for leaves the model where it was. */
#include <string.h>

#include "fulgur/fulgur.h"
#include "harness.h"

#define ROWS 8
#define NPARAMS (6 * 16 + 16 + 16 * 3 + 3)

static fg_module *model(void) {
    return fg_mlp_new(&(fg_mlp_config){.sizes = {6, 16, 3}, .seed = 7});
}

/* One training step on batch `step`, on the device the model is on (its
 * batch and step tensors there too). */
static fg_status train_step(fg_module *m, fg_optimizer *o, int step) {
    fg_dev *d = fg_module_device(m);
    fg_status ds = fg_step_device_set(d);
    if (ds != FG_OK) return ds;
    float x[ROWS * 6];
    int32_t y[ROWS];
    fg_rng_fill_normal(21, (uint64_t)step * ROWS * 6, x, ROWS * 6, 0, 1);
    for (int i = 0; i < ROWS; i++) y[i] = (int32_t)(fg_rng_u32_at(22, step * ROWS + i) % 3);
    fg_optimizer_zero_grad(o);
    fg_tensor *tx = fg_from_data(FG_F32, 2, (int64_t[]){ROWS, 6}, x);
    fg_tensor *ty = fg_from_data(FG_I32, 1, (int64_t[]){ROWS}, y);
    fg_tensor *loss = tx && ty ? fg_cross_entropy(fg_module_forward(m, tx), ty, -100) : NULL;
    fg_status s = loss ? fg_backward(loss) : fg_last_status();
    if (s == FG_OK) s = fg_optimizer_step(o);
    fg_step_reset();
    fg_status u = fg_step_device_set(NULL);
    return s != FG_OK ? s : u;
}

/* t's bytes (on a device or not) into host memory dst. */
static void bytes_of(const fg_tensor *t, void *dst) {
    fg_tensor *h = fg_tensor_to(t, NULL);
    CHECK_MSG(h != NULL, "%s", fg_last_error());
    if (h) memcpy(dst, fg_tensor_data(h), fg_tensor_nbytes(h));
    fg_tensor_free(h);
}

typedef struct snap {
    float p[NPARAMS], g[NPARAMS], m1[NPARAMS], m2[NPARAMS];
} snap;

static void take(fg_module *m, fg_optimizer *o, snap *s) {
    CHECK(fg_module_numel(m) == NPARAMS);
    bytes_of(fg_module_flat_params(m), s->p);
    bytes_of(fg_module_flat_grads(m), s->g);
    CHECK(fg_optimizer_num_states(o) == 2);
    bytes_of(fg_optimizer_state(o, 0), s->m1);
    bytes_of(fg_optimizer_state(o, 1), s->m2);
}

static void cpu_run(snap *after1, snap *after2) {
    fg_module *m = model();
    fg_optimizer *o = fg_adamw_new(m, &(fg_adamw_opts){.lr = 0.01});
    CHECK_OK(train_step(m, o, 0));
    take(m, o, after1);
    CHECK_OK(train_step(m, o, 1));
    take(m, o, after2);
    fg_optimizer_free(o);
    fg_module_free(m);
}

/* every view of the model on dev (NULL: host memory) */
static void check_where(fg_module *m, fg_dev *dev) {
    fg_device kind = dev ? fg_dev_kind(dev) : FG_CPU;
    CHECK(fg_module_device(m) == dev);
    CHECK(fg_tensor_dev(fg_module_flat_params(m)) == dev);
    CHECK(fg_tensor_dev(fg_module_flat_grads(m)) == dev);
    for (int64_t i = 0; i < fg_module_num_params(m); i++) {
        fg_tensor *p = fg_module_param(m, i);
        CHECK_MSG(fg_tensor_dev(p) == dev && fg_tensor_device(p) == kind, "parameter %lld",
                  (long long)i);
        CHECK(fg_tensor_dev(fg_tensor_grad(p)) == dev);
    }
    for (int i = 0; i < fg_module_num_children(m); i++) {
        fg_module *c = fg_module_child_at(m, i);
        if (fg_module_numel(c) > 0) CHECK(fg_tensor_dev(fg_module_flat_params(c)) == dev);
    }
}

TEST(to_guarded_a_step_and_back_to_the_host_is_the_cpu_run_bitwise) {
    snap cpu1, cpu2, g1, g2;
    cpu_run(&cpu1, &cpu2);
    fg_dev *d = fg_dev_open("guarded:0", NULL);
    CHECK_MSG(d != NULL, "%s", fg_last_error());
    if (!d) return;
    fg_module *m = model();
    /* the optimizer made before the move follows it each way */
    fg_optimizer *o = fg_adamw_new(m, &(fg_adamw_opts){.lr = 0.01});
    CHECK_OK(fg_module_to_device(m, d));
    CHECK_OK(fg_optimizer_to_device(o));
    check_where(m, d);
    CHECK_OK(train_step(m, o, 0));
    take(m, o, &g1);
    CHECK(fg_dev_memory_stats_get(d).active_allocs == 3 + 2); /* flat buffers, AdamW's state */
    CHECK_OK(fg_module_to_device(m, NULL));                   /* model.cpu() */
    CHECK_OK(fg_optimizer_to_device(o));
    check_where(m, NULL);
    CHECK(fg_tensor_dev(fg_optimizer_state(o, 0)) == NULL);
    /* nothing of the model or the optimizer is left on the device */
    fg_dev_memory_stats s = fg_dev_memory_stats_get(d);
    CHECK_MSG(s.allocated_bytes == 0 && s.active_allocs == 0, "%llu bytes in %llu allocations",
              (unsigned long long)s.allocated_bytes, (unsigned long long)s.active_allocs);
    CHECK(s.num_frees == s.num_allocs);
    CHECK_OK(fg_dev_leak_check(d));
    fg_dev_empty_cache(d);
    CHECK(fg_dev_memory_stats_get(d).reserved_bytes == 0);
    /* the second step on the host, from what came back */
    CHECK_OK(train_step(m, o, 1));
    take(m, o, &g2);
    CHECK(memcmp(&cpu1, &g1, sizeof cpu1) == 0);
    CHECK(memcmp(&cpu2, &g2, sizeof cpu2) == 0);
    /* the host data is the host's own: readable directly */
    CHECK(memcmp(fg_tensor_data(fg_module_flat_params(m)), cpu2.p, sizeof cpu2.p) == 0);
    CHECK_OK(fg_module_to_device(m, NULL)); /* already there: a no-op */
    fg_optimizer_free(o);
    fg_module_free(m);
    CHECK_OK(fg_dev_leak_check(d));
    fg_dev_close(d);
}

TEST(from_one_device_to_another_through_the_host) {
    snap cpu1, cpu2, g1, g2;
    cpu_run(&cpu1, &cpu2);
    fg_dev *d0 = fg_dev_open("guarded:0", NULL), *d1 = fg_dev_open("guarded:1", NULL);
    CHECK(d0 && d1);
    if (!d0 || !d1) return;
    fg_module *m = model();
    fg_optimizer *o = fg_adamw_new(m, &(fg_adamw_opts){.lr = 0.01});
    CHECK_OK(fg_module_to_device(m, d0));
    CHECK_OK(fg_optimizer_to_device(o));
    CHECK_OK(train_step(m, o, 0));
    take(m, o, &g1);
    fg_dev_reset_copy_stats(d0);
    CHECK_OK(fg_module_to_device(m, d1));
    CHECK_OK(fg_optimizer_to_device(o));
    check_where(m, d1);
    /* out of d0 and into d1, each byte once: parameters, gradients, state */
    size_t pb = NPARAMS * sizeof(float);
    fg_dev_memory_stats s0 = fg_dev_memory_stats_get(d0), s1 = fg_dev_memory_stats_get(d1);
    CHECK_MSG(s0.d2h_bytes == 4 * pb && s1.h2d_bytes == 4 * pb, "%llu out, %llu in",
              (unsigned long long)s0.d2h_bytes, (unsigned long long)s1.h2d_bytes);
    CHECK(s0.active_allocs == 0 && s0.allocated_bytes == 0);
    CHECK(s1.active_allocs == 5);
    CHECK_OK(train_step(m, o, 1));
    take(m, o, &g2);
    CHECK(memcmp(&cpu1, &g1, sizeof cpu1) == 0);
    CHECK(memcmp(&cpu2, &g2, sizeof cpu2) == 0);
    /* back to the first device, then freed while there */
    CHECK_OK(fg_module_to_device(m, d0));
    CHECK_OK(fg_optimizer_to_device(o));
    CHECK(fg_dev_memory_stats_get(d1).active_allocs == 0);
    fg_optimizer_free(o);
    fg_module_free(m);
    CHECK_OK(fg_dev_leak_check(d0));
    CHECK_OK(fg_dev_leak_check(d1));
    fg_dev_close(d0);
    fg_dev_close(d1);
}

TEST(a_move_that_does_not_fit_leaves_the_model_where_it_was) {
    fg_dev *d0 = fg_dev_open("guarded:0", NULL);
    /* over 1 MiB of parameters: a 2 MiB segment of their own, and as much
     * for the gradients, for which a 2 MiB device has no room left */
    fg_dev *small = fg_dev_open("guarded:1", &(fg_dev_options){.memory_limit = (size_t)2 << 20});
    CHECK(d0 && small);
    if (!d0 || !small) return;
    fg_module *m = fg_mlp_new(&(fg_mlp_config){.sizes = {512, 600}, .seed = 3});
    CHECK_OK(fg_module_to_device(m, d0));
    int64_t n = fg_module_numel(m);
    CHECK(n == 512 * 600 + 600);
    float *before = fg_alloc((size_t)n * sizeof(float)),
          *after = fg_alloc((size_t)n * sizeof(float));
    bytes_of(fg_module_flat_params(m), before);
    CHECK_STATUS(fg_module_to_device(m, small), FG_ENOMEM);
    CHECK_CONTAINS(fg_last_error(), "module to_device guarded:1");
    check_where(m, d0);
    bytes_of(fg_module_flat_params(m), after);
    CHECK(memcmp(before, after, (size_t)n * sizeof(float)) == 0);
    CHECK(fg_dev_memory_stats_get(small).active_allocs == 0);
    CHECK(fg_dev_memory_stats_get(small).num_ooms == 1);
    CHECK(fg_dev_memory_stats_get(d0).active_allocs == 3);
    fg_free(before);
    fg_free(after);
    fg_module_free(m);
    CHECK_OK(fg_dev_leak_check(d0));
    fg_dev_close(d0);
    fg_dev_close(small);
}
