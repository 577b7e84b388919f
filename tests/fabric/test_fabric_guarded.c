/* Accelerator guarded through the fabric API: an MLP trained with the
 * single strategy on the guarded device (parameters, gradients, optimizer
 * state and every step tensor in memory the host cannot touch) ends
 * bitwise equal to the same run on the CPU, with each optimizer (AdamW, SGD
 * with momentum, Adam with AMSGrad, centered RMSprop with momentum, Adagrad,
 * Lion), gradient clipping included; each step copies the batch in and
 * the loss out and nothing else; every device allocation is freed by the
 * end of the run. Host batches are copied in through two staging slots
 * in turn on the comm stream, no batch overwritten while the next is
 * copied, the step's bytes in as before and the CPU's bits. A model a
 * strategy shards is not moved off its device. Strategies and precisions
 * not device-clean yet are refused by name. */
#include <string.h>

#include "fulgur/fulgur.h"
#include "harness.h"

#define STEPS 3
#define ROWS 8

typedef struct run_out {
    int opt; /* which optimizer: make_opt */
    float params[512];
    int64_t nparams;
    double loss[STEPS], norm[STEPS];
    uint64_t h2d[STEPS], d2h[STEPS];
    bool leak_free;
    fg_status leak_status;
} run_out;

#define NOPTS 6
static fg_optimizer *make_opt(int k, fg_module *m) {
    switch (k) {
    case 0: return fg_sgd_new(m, &(fg_sgd_opts){.lr = 0.1, .momentum = 0.9});
    case 1: return fg_adamw_new(m, &(fg_adamw_opts){.lr = 0.01});
    case 2: return fg_adam_new(m, &(fg_adam_opts){.lr = 0.01, .amsgrad = true});
    case 3:
        return fg_rmsprop_new(m, &(fg_rmsprop_opts){.lr = 0.01, .momentum = 0.9, .centered = true});
    case 4:
        return fg_adagrad_new(m, &(fg_adagrad_opts){.lr = 0.1, .initial_accumulator_value = 0.1});
    default: return fg_lion_new(m, &(fg_lion_opts){.lr = 0.001, .weight_decay = 0.1});
    }
}

static int train(fg_fabric *f, void *arg) {
    run_out *out = arg;
    fg_module *m = fg_mlp_new(&(fg_mlp_config){.sizes = {6, 16, 3}, .seed = 7});
    fg_optimizer *o = make_opt(out->opt, m);
    if (!m || !o || fg_fabric_setup(f, m, o) != FG_OK) return 1;
    fg_dev *d = fg_fabric_device(f);
    if (d) fg_dev_retain(d); /* kept past the model for the leak check */
    for (int step = 0; step < STEPS; step++) {
        float x[ROWS * 6];
        int32_t y[ROWS];
        fg_rng_fill_normal(21, (uint64_t)step * ROWS * 6, x, ROWS * 6, 0, 1);
        for (int i = 0; i < ROWS; i++) y[i] = (int32_t)(fg_rng_u32_at(22, step * ROWS + i) % 3);
        if (d) fg_dev_reset_copy_stats(d);
        /* the batch: host memory copied to the step device (the CPU: host) */
        fg_tensor *tx = fg_from_data(FG_F32, 2, (int64_t[]){ROWS, 6}, x);
        fg_tensor *ty = fg_from_data(FG_I32, 1, (int64_t[]){ROWS}, y);
        fg_optimizer_zero_grad(o);
        fg_tensor *loss = fg_cross_entropy(fg_module_forward(m, tx), ty, -100);
        if (!loss || fg_fabric_backward(f, loss) != FG_OK) return 2;
        if (fg_fabric_clip_gradients(f, 0.5, &out->norm[step]) != FG_OK) return 3;
        if (fg_fabric_optimizer_step(f, o) != FG_OK) return 4;
        out->loss[step] = fg_item(loss);
        if (d) {
            fg_dev_memory_stats s = fg_dev_memory_stats_get(d);
            out->h2d[step] = s.h2d_bytes;
            out->d2h[step] = s.d2h_bytes;
        }
        fg_fabric_step_end(f);
    }
    fg_tensor *p = fg_tensor_to(fg_module_flat_params(m), NULL);
    out->nparams = p ? fg_tensor_numel(p) : 0;
    if (p && out->nparams <= 512) memcpy(out->params, fg_tensor_data(p), fg_tensor_nbytes(p));
    fg_tensor_free(p);
    fg_optimizer_free(o);
    fg_module_free(m);
    fg_step_reset();
    if (d) {
        CHECK_OK(fg_step_device_set(NULL));
        out->leak_status = fg_dev_leak_check(d);
        fg_dev_close(d);
    }
    return 0;
}

static void run(const char *accel, run_out *out) {
    fg_fabric *f = fg_fabric_new(&(fg_fabric_config){.accelerator = accel, .devices = "1"});
    CHECK_MSG(f != NULL, "%s", fg_last_error());
    if (!f) return;
    int rc = fg_fabric_launch(f, train, out);
    CHECK_MSG(rc == 0, "%s: rc %d: %s", accel, rc, fg_last_error());
    fg_fabric_free(f);
}

TEST(mlp_single_on_guarded_equals_the_cpu_bitwise) {
    for (int k = 0; k < NOPTS; k++) {
        run_out cpu = {.opt = k}, g = {.opt = k};
        run("cpu", &cpu);
        run("guarded", &g);
        CHECK(cpu.nparams == 6 * 16 + 16 + 16 * 3 + 3 && g.nparams == cpu.nparams);
        CHECK_MSG(memcmp(cpu.params, g.params, sizeof cpu.params) == 0, "optimizer %d", k);
        for (int s = 0; s < STEPS; s++) {
            CHECK_MSG(cpu.loss[s] == g.loss[s], "step %d: %.17g %.17g", s, cpu.loss[s], g.loss[s]);
            CHECK(cpu.norm[s] == g.norm[s] && cpu.norm[s] > 0);
            /* in: the batch (x f32 and y i32); out: the loss (f32), and the
             * loss's gradient, which the cross-entropy backward entry takes as
             * a host scalar (docs/devices.md); nothing else */
            CHECK_MSG(g.h2d[s] == ROWS * 6 * 4 + ROWS * 4, "step %d: %llu bytes in", s,
                      (unsigned long long)g.h2d[s]);
            CHECK_MSG(g.d2h[s] == 4 + 4, "step %d: %llu bytes out", s,
                      (unsigned long long)g.d2h[s]);
        }
        CHECK_OK(g.leak_status);
    }
}

TEST(what_is_not_device_clean_yet_is_refused_by_name) {
    /* fsdp NO_SHARD shards no parameter, so there is none to offload */
    fg_fabric_config cfg = {.accelerator = "guarded", .strategy = "fsdp"};
    cfg.sharded.sharding_strategy = FG_SHARDING_NO_SHARD;
    cfg.sharded.offload_params_device = FG_OFFLOAD_CPU;
    fg_fabric *f = fg_fabric_new(&cfg);
    CHECK(f != NULL);
    if (!f) return;
    fg_module *m = fg_mlp_new(&(fg_mlp_config){.sizes = {4, 3}});
    fg_optimizer *o = fg_sgd_new(m, &(fg_sgd_opts){.lr = 0.1});
    CHECK_STATUS(fg_fabric_setup(f, m, o), FG_EUNSUPPORTED);
    CHECK_CONTAINS(fg_last_error(), "with the parameters offloaded to the cpu");
    CHECK(fg_module_device(m) == NULL);
    fg_optimizer_free(o);
    fg_module_free(m);
    fg_fabric_free(f);
}

/* A model whose parameters a strategy shards stays where it is: back to the
 * host, or to another device, is refused by name, and the model keeps
 * training where it was. */
static int sharded_stays(fg_fabric *f, void *arg) {
    (void)arg;
    fg_module *m = fg_mlp_new(&(fg_mlp_config){.sizes = {6, 16, 3}, .seed = 7});
    fg_optimizer *o = fg_sgd_new(m, &(fg_sgd_opts){.lr = 0.1});
    CHECK_OK(fg_fabric_setup(f, m, o));
    CHECK(fg_fabric_shards_params(f));
    fg_dev *d = fg_module_device(m);
    CHECK(d != NULL && d == fg_fabric_device(f));
    CHECK_STATUS(fg_module_to_device(m, NULL), FG_EUNSUPPORTED);
    CHECK_CONTAINS(fg_last_error(),
                   "a model whose parameters a strategy shards stays on guarded:0");
    fg_dev *other = fg_dev_open("guarded:1", NULL);
    CHECK_STATUS(fg_module_to_device(m, other), FG_EUNSUPPORTED);
    CHECK(fg_module_device(m) == d);
    CHECK(fg_dev_memory_stats_get(other).num_allocs == 0);
    fg_dev_close(other);
    fg_optimizer_free(o);
    fg_module_free(m);
    fg_step_reset();
    return 0;
}

TEST(a_model_a_strategy_shards_is_not_moved) {
    fg_fabric_config cfg = {.accelerator = "guarded", .strategy = "deepspeed_stage_3_offload"};
    fg_fabric *f = fg_fabric_new(&cfg);
    CHECK_MSG(f != NULL, "%s", fg_last_error());
    if (!f) return;
    CHECK(fg_fabric_launch(f, sharded_stays, NULL) == 0);
    fg_fabric_free(f);
}

/* ------------------------------------------------ the batches' copies in */

#define NB 4
typedef struct stage_out {
    double loss[NB];
    float params[512];
    uint64_t last_h2d[NB], comm_h2d[NB];
    fg_dev *dev; /* retained, for the leak check after the launch */
} stage_out;

/* Host batch k: x (ROWS, 6) f32, y (ROWS) i32, persistent host tensors as a
 * loader's. */
static fg_batch host_batch(int k, fg_tensor **x, fg_tensor **y) {
    *x = fg_tensor_new(FG_F32, 2, (int64_t[]){ROWS, 6});
    *y = fg_tensor_new(FG_I32, 1, (int64_t[]){ROWS});
    if (*x && *y) {
        fg_rng_fill_normal(31, (uint64_t)k * ROWS * 6, fg_tensor_data(*x), ROWS * 6, 0, 1);
        int32_t *yy = fg_tensor_data(*y);
        for (int i = 0; i < ROWS; i++) yy[i] = (int32_t)(fg_rng_u32_at(32, k * ROWS + i) % 3);
    }
    return (fg_batch){.x = *x, .y = *y, .size = ROWS, .valid = ROWS, .index = k};
}

/* whether device tensor d holds host tensor h's bytes */
static bool holds(const fg_tensor *d, const fg_tensor *h) {
    fg_tensor *back = fg_tensor_to(d, NULL);
    bool same = back && fg_tensor_nbytes(back) == fg_tensor_nbytes(h) &&
                memcmp(fg_tensor_data(back), fg_tensor_data(h), fg_tensor_nbytes(h)) == 0;
    fg_tensor_free(back);
    return same;
}

static fg_tensor *stage_step(fg_fabric *f, fg_batch *b, void *ud) {
    (void)f;
    return fg_cross_entropy(fg_module_forward(ud, b->x), b->y, -100);
}

static int stage_train(fg_fabric *f, void *arg) {
    stage_out *out = arg;
    fg_module *m = fg_mlp_new(&(fg_mlp_config){.sizes = {6, 16, 3}, .seed = 7});
    fg_optimizer *o = fg_adamw_new(m, &(fg_adamw_opts){.lr = 0.01});
    if (!m || !o || fg_fabric_setup(f, m, o) != FG_OK) return 1;
    fg_dev *d = fg_fabric_device(f);
    if (d) fg_dev_retain(d);
    out->dev = d;
    fg_tensor *x[NB], *y[NB];
    fg_batch b[NB];
    for (int k = 0; k < NB; k++) b[k] = host_batch(k, &x[k], &y[k]);
    if (d) {
        /* two staging slots in turn: batch k's bytes stay on the device
         * while batch k + 1 is copied in, and slot k % 2 comes back for
         * batch k + 2; each copy in is one async copy of x and one of y on
         * the comm stream (after a wait for the slot's last step, before an
         * event the compute stream waits for) */
        fg_batch on[NB];
        void *at[NB]; /* the device address of each batch's x */
        size_t xb = ROWS * 6 * 4, yb = ROWS * 4;
        for (int k = 0; k < NB; k++) {
            fg_stream *comm = fg_dev_stream(d, FG_STREAM_COMM);
            uint64_t work = fg_stream_work_count(comm);
            fg_dev_memory_stats s0 = fg_dev_memory_stats_get(d);
            CHECK_OK(fg_fabric_batch_to_device(f, &b[k], &on[k]));
            fg_dev_memory_stats s1 = fg_dev_memory_stats_get(d);
            CHECK(s1.h2d_copies - s0.h2d_copies == 2 && s1.h2d_bytes - s0.h2d_bytes == xb + yb);
            CHECK(s1.comm_h2d_bytes - s0.comm_h2d_bytes == xb + yb);
            CHECK_MSG(fg_stream_work_count(comm) - work == 4, "batch %d: %llu items on comm", k,
                      (unsigned long long)(fg_stream_work_count(comm) - work));
            CHECK(fg_tensor_dev(on[k].x) == d && fg_tensor_dev(on[k].y) == d);
            at[k] = fg_tensor_data(on[k].x);
            CHECK(on[k].size == ROWS && on[k].index == k);
            CHECK_MSG(holds(on[k].x, x[k]) && holds(on[k].y, y[k]), "batch %d", k);
            if (k >= 1) { /* the batch before is untouched by this one's copy */
                CHECK(at[k] != at[k - 1]);
                CHECK_MSG(holds(on[k - 1].x, x[k - 1]) && holds(on[k - 1].y, y[k - 1]),
                          "batch %d after batch %d was staged", k - 1, k);
            }
            /* batch k - 2's tensors are gone: its slot is batch k's */
            if (k >= 2) CHECK(at[k] == at[k - 2]);
        }
    }
    /* training steps from host batches: the step copies the batch in, and
     * that copy on the comm stream is the step's, not the communicator's */
    for (int k = 0; k < NB; k++) {
        fg_optimizer_zero_grad(o);
        if (fg_fabric_training_step(f, &b[k], stage_step, NULL, m, &out->loss[k]) != FG_OK)
            return 2;
        if (fg_fabric_optimizer_step(f, o) != FG_OK) return 3;
        fg_fabric_copies c = fg_fabric_device_copies(f);
        out->last_h2d[k] = c.last_h2d;
        out->comm_h2d[k] = c.total_comm_h2d;
        fg_fabric_step_end(f);
    }
    fg_tensor *p = fg_tensor_to(fg_module_flat_params(m), NULL);
    if (p && fg_tensor_numel(p) <= 512) memcpy(out->params, fg_tensor_data(p), fg_tensor_nbytes(p));
    fg_tensor_free(p);
    for (int k = 0; k < NB; k++) {
        fg_tensor_free(x[k]);
        fg_tensor_free(y[k]);
    }
    fg_optimizer_free(o);
    fg_module_free(m);
    fg_step_reset();
    return 0;
}

TEST(host_batches_are_copied_in_double_buffered_on_the_comm_stream) {
    stage_out cpu = {0}, g = {0};
    const char *accel[2] = {"cpu", "guarded"};
    stage_out *outs[2] = {&cpu, &g};
    for (int i = 0; i < 2; i++) {
        fg_fabric *f = fg_fabric_new(&(fg_fabric_config){.accelerator = accel[i], .devices = "1"});
        CHECK_MSG(f != NULL, "%s", fg_last_error());
        if (!f) return;
        int rc = fg_fabric_launch(f, stage_train, outs[i]);
        CHECK_MSG(rc == 0, "%s: rc %d: %s", accel[i], rc, fg_last_error());
        /* the launch's end gave the staging back: nothing is left on the device */
        if (outs[i]->dev) {
            CHECK_OK(fg_step_device_set(NULL));
            CHECK_OK(fg_dev_leak_check(outs[i]->dev));
            fg_dev_close(outs[i]->dev);
        }
        fg_fabric_free(f);
    }
    CHECK(cpu.dev == NULL && g.dev != NULL);
    CHECK(memcmp(cpu.params, g.params, sizeof cpu.params) == 0);
    for (int k = 0; k < NB; k++) {
        CHECK_MSG(cpu.loss[k] == g.loss[k], "step %d: %.17g %.17g", k, cpu.loss[k], g.loss[k]);
        CHECK_MSG(g.last_h2d[k] == ROWS * 6 * 4 + ROWS * 4, "step %d: %llu bytes in", k,
                  (unsigned long long)g.last_h2d[k]);
        CHECK(g.comm_h2d[k] == 0);
    }
}
