/* The fabric's precision plugin, one rank (strategy single, the run in
 * this process): bf16-mixed turns the thread's autocast on at setup and
 * off when the run returns, autocast_begin/end nest; under 16-mixed the
 * backward is scaled, fg_fabric_optimizer_step unscales, skips a step with
 * an inf gradient and backs off, a plain fg_optimizer_step in between is
 * refused at the next backward, training_step reports unscaled losses;
 * the scaler's state goes into a checkpoint and a resumed run continues
 * bit for bit (8 steps == 4 + save/load + 4, a skipped step among them). */
#include <math.h>
#include <stdio.h>
#include <sys/stat.h>

#include "fulgur/fabric.h"
#include "harness.h"

static const char *tmp_path(const char *name) {
    static char dir[256], buf[512];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/fulgur-fabric-prec-%d", (int)getpid());
        mkdir(dir, 0700);
    }
    snprintf(buf, sizeof buf, "%s/%s", dir, name);
    return buf;
}

static fg_module *tiny(void) {
    return fg_mlp_new(&(fg_mlp_config){.sizes = {6, 16, 3}, .nlayers = 2, .seed = 3});
}

/* the loss of step `step`'s batch (a pure function of step) */
static fg_tensor *loss_at(fg_module *m, int step) {
    int64_t sx[2] = {8, 6}, sy[1] = {8};
    fg_tensor *x = fg_empty(FG_F32, 2, sx), *y = fg_empty(FG_I32, 1, sy);
    fg_rng_fill_normal(21, (uint64_t)step * 48, fg_tensor_data(x), 48, 0, 1);
    for (int i = 0; i < 8; i++)
        ((int32_t *)fg_tensor_data(y))[i] =
            (int32_t)(fg_rng_u32_at(22, (uint64_t)step * 8 + i) % 3);
    return fg_cross_entropy(fg_module_forward(m, x), y, -100);
}

static int bf16_run(fg_fabric *f, void *arg) {
    (void)arg;
    fg_module *m = tiny();
    fg_optimizer *opt = fg_adamw_new(m, NULL);
    CHECK(fg_autocast_dtype() == FG_DTYPE_DEFAULT);
    CHECK_OK(fg_fabric_setup(f, m, opt));
    CHECK(fg_autocast_dtype() == FG_BF16); /* as Lightning's wrapped forward */
    CHECK(fg_fabric_dtype(f) == FG_F32 && fg_fabric_precision(f) == FG_PRECISION_BF16_MIXED);
    CHECK(fg_fabric_scaler(f) == NULL);
    CHECK_OK(fg_autocast_set(FG_DTYPE_DEFAULT, NULL));
    fg_dtype prev = fg_fabric_autocast_begin(f);
    CHECK(prev == FG_DTYPE_DEFAULT && fg_autocast_dtype() == FG_BF16);
    fg_tensor *loss = loss_at(m, 0);
    fg_fabric_autocast_end(f, prev);
    CHECK(fg_autocast_dtype() == FG_DTYPE_DEFAULT);
    CHECK_OK(fg_fabric_backward(f, loss));
    CHECK_OK(fg_fabric_optimizer_step(f, opt));
    CHECK(fg_optimizer_step_count(opt) == 1);
    fg_fabric_autocast_begin(f); /* left on: the launch turns it off */
    fg_fabric_step_end(f);
    fg_optimizer_free(opt);
    fg_module_free(m);
    return 0;
}

TEST(bf16_mixed_autocast) {
    fg_fabric *f = fg_fabric_new(&(fg_fabric_config){.precision = "bf16-mixed"});
    CHECK_MSG(f != NULL, "%s", fg_last_error());
    if (!f) return;
    CHECK(fg_fabric_launch(f, bf16_run, NULL) == 0);
    CHECK(fg_autocast_dtype() == FG_DTYPE_DEFAULT);
    fg_fabric_free(f);
    /* 32-true: setup leaves autocast off */
    f = fg_fabric_new(NULL);
    CHECK(f && fg_fabric_precision(f) == FG_PRECISION_32_TRUE && !fg_fabric_scaler(f));
    fg_fabric_free(f);
}

/* 16-mixed: steps [from, to) with an inf gradient injected at step
 * inf_step; saves after step save_at when save_at >= 0; loads `load` first
 * when not NULL. Leaves the parameters in out (shared: the caller's). */
typedef struct plan16 {
    int from, to, inf_step, save_at;
    const char *save, *load;
    float out[256];
    int64_t nout;
    fg_scaler_state end;
} plan16;

static int run16(fg_fabric *f, void *arg) {
    plan16 *p = arg;
    fg_module *m = tiny();
    fg_optimizer *opt = fg_adamw_new(m, &(fg_adamw_opts){.lr = 1e-2});
    CHECK_OK(fg_fabric_setup(f, m, opt));
    CHECK(fg_autocast_dtype() == FG_F16);
    if (p->load)
        CHECK_OK(fg_fabric_load(f, p->load, &(fg_train_state){.model = m, .optimizer = opt}));
    for (int step = p->from; step < p->to; step++) {
        fg_optimizer_zero_grad(opt);
        fg_tensor *loss = loss_at(m, step);
        double l = fg_item(loss);
        CHECK_OK(fg_fabric_backward(f, loss));
        /* the gradients are scaled: larger than the loss by far */
        double gmax = 0;
        fg_tensor *g = fg_module_flat_grads(m);
        for (int64_t i = 0; i < fg_tensor_numel(g); i++)
            gmax = fmax(gmax, fabs(fg_tensor_get(g, i)));
        CHECK_MSG(gmax > 100 * l, "step %d: largest gradient %g, loss %g: not scaled?", step, gmax,
                  l);
        if (step == p->inf_step) ((float *)fg_tensor_data(g))[1] = INFINITY;
        CHECK_OK(fg_fabric_optimizer_step(f, opt));
        fg_fabric_step_end(f);
        if (step == p->save_at)
            CHECK_OK(fg_fabric_save(
                f, p->save, &(fg_train_state){.model = m, .optimizer = opt, .step = step + 1}));
    }
    fg_tensor *pp = fg_module_flat_params(m);
    p->nout = fg_tensor_numel(pp);
    memcpy(p->out, fg_tensor_data(pp), sizeof(float) * (size_t)p->nout);
    p->end = fg_scaler_get_state(fg_fabric_scaler(f));
    fg_optimizer_free(opt);
    fg_module_free(m);
    return 0;
}

TEST(fp16_mixed_resume_bitwise) {
    static plan16 whole, first, second;
    char path[512];
    snprintf(path, sizeof path, "%s", tmp_path("s16.safetensors"));
    whole = (plan16){.from = 0, .to = 8, .inf_step = 2, .save_at = -1};
    first = (plan16){.from = 0, .to = 4, .inf_step = 2, .save_at = 3, .save = path};
    second = (plan16){.from = 4, .to = 8, .inf_step = -1, .save_at = -1, .load = path};
    plan16 *runs[3] = {&whole, &first, &second};
    for (int i = 0; i < 3; i++) {
        fg_fabric *f = fg_fabric_new(&(fg_fabric_config){.precision = "16-mixed"});
        CHECK(f && fg_fabric_scaler(f) && fg_scaler_scale(fg_fabric_scaler(f)) == 65536.0);
        if (!f) return;
        CHECK(fg_fabric_launch(f, run16, runs[i]) == 0);
        fg_fabric_free(f);
    }
    CHECK(whole.end.skipped == 1 && whole.end.scale == 32768.0 && whole.end.growth_tracker == 5);
    CHECK(second.end.skipped == whole.end.skipped && second.end.scale == whole.end.scale &&
          second.end.growth_tracker == whole.end.growth_tracker);
    CHECK(whole.nout == second.nout && whole.nout > 0 &&
          !memcmp(whole.out, second.out, sizeof(float) * (size_t)whole.nout));
    fg_st_file *file = fg_st_open(path);
    CHECK(file != NULL);
    if (file) {
        CHECK(!strcmp(fg_st_meta_get(file, "loss_scale"), "32768"));
        CHECK(!strcmp(fg_st_meta_get(file, "loss_scale_growth_tracker"), "1"));
        CHECK(!strcmp(fg_st_meta_get(file, "loss_scale_skipped"), "1"));
        fg_st_close(file);
    }
    remove(path);
}

static int bypass_run(fg_fabric *f, void *arg) {
    (void)arg;
    fg_module *m = tiny();
    fg_optimizer *opt = fg_sgd_new(m, NULL);
    CHECK_OK(fg_fabric_setup(f, m, opt));
    CHECK_OK(fg_fabric_backward(f, loss_at(m, 0)));
    CHECK_OK(fg_optimizer_step(opt)); /* wrong under 16-mixed: scaled gradients */
    fg_fabric_step_end(f);
    CHECK_STATUS(fg_fabric_backward(f, loss_at(m, 1)), FG_ESTATE);
    CHECK_CONTAINS(fg_last_error(),
                   "call fg_fabric_optimizer_step(f, opt) instead of fg_optimizer_step");
    fg_fabric_step_end(f);
    fg_optimizer_free(opt);
    fg_module_free(m);
    return 0;
}

TEST(fp16_mixed_refuses_a_bypassed_scaler) {
    fg_fabric *f = fg_fabric_new(&(fg_fabric_config){.precision = "16"});
    CHECK(f != NULL);
    if (!f) return;
    CHECK(fg_fabric_launch(f, bypass_run, NULL) == 0);
    fg_fabric_free(f);
}

static fg_tensor *step_fn(fg_fabric *f, fg_batch *part, void *ud) {
    (void)f;
    (void)part;
    return loss_at(ud, 5);
}

static int training_step_run(fg_fabric *f, void *arg) {
    (void)arg;
    fg_module *m = tiny();
    fg_optimizer *opt = fg_sgd_new(m, NULL);
    CHECK_OK(fg_fabric_setup(f, m, opt));
    fg_tensor *ref = loss_at(m, 5); /* under f16 autocast too */
    double want = fg_item(ref), got = 0;
    int64_t sx[2] = {8, 6};
    fg_batch b = {
        .x = fg_zeros(FG_F32, 2, sx), .y = fg_zeros(FG_I32, 1, sx), .size = 8, .valid = 8};
    CHECK_OK(fg_fabric_training_step(f, &b, step_fn, NULL, m, &got));
    CHECK_MSG(got == want, "training_step reports %g, the loss is %g", got, want);
    CHECK_OK(fg_fabric_optimizer_step(f, opt));
    fg_fabric_step_end(f);
    fg_optimizer_free(opt);
    fg_module_free(m);
    return 0;
}

TEST(fp16_mixed_training_step_unscaled_loss) {
    fg_fabric *f = fg_fabric_new(&(fg_fabric_config){.precision = "16-mixed"});
    CHECK(f != NULL);
    if (!f) return;
    CHECK(fg_fabric_launch(f, training_step_run, NULL) == 0);
    fg_fabric_free(f);
}
