/* The loss scaler (PyTorch's GradScaler) on one process: its defaults
 * (65536, x2 after 2000 clean steps, x0.5); unscaling divides the
 * gradients exactly and only once; a step with an inf or a NaN gradient is
 * skipped (parameters, optimizer state and step count untouched), the scale
 * halves and the skip is counted and logged; growth after the interval;
 * state get/set; bad options named. The multi-rank skip is
 * tests/mp/test_precision_scaler.c, the checkpoint round trip
 * tests/fabric/test_fabric_precision.c. */
#include <math.h>

#include "fulgur/precision.h"
#include "harness.h"

static fg_module *tiny(void) { return fg_mlp_new(&(fg_mlp_config){.sizes = {3, 4, 2}, .seed = 9}); }

/* every gradient = v * scale */
static void fill_grads(fg_module *m, double v) {
    fg_tensor *g = fg_module_flat_grads(m);
    CHECK_OK(fg_tensor_fill(g, v));
}

static char g_log[512];
static void capture(void *ud, fg_log_level lv, int rank, const char *msg) {
    (void)ud;
    (void)rank;
    if (lv == FG_LOG_WARN) snprintf(g_log, sizeof g_log, "%s", msg);
}

TEST(defaults_and_options) {
    fg_scaler *s = fg_scaler_new(NULL);
    CHECK(s && fg_scaler_scale(s) == 65536.0);
    fg_scaler_state st = fg_scaler_get_state(s);
    CHECK(st.growth_tracker == 0 && st.skipped == 0);
    fg_scaler_free(s);
    fg_scaler_free(NULL);
    CHECK(fg_scaler_new(&(fg_scaler_opts){.backoff_factor = 1.5}) == NULL);
    CHECK(fg_last_status() == FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "scaler: backoff_factor out of range");
    CHECK(fg_scaler_new(&(fg_scaler_opts){.init_scale = -1}) == NULL);
    CHECK_CONTAINS(fg_last_error(), "scaler: init_scale out of range");
    CHECK(fg_scaler_new(&(fg_scaler_opts){.growth_factor = 0.5}) == NULL);
    CHECK(fg_scaler_new(&(fg_scaler_opts){.growth_interval = -3}) == NULL);
}

TEST(unscale_once_and_step) {
    fg_module *m = tiny();
    fg_optimizer *opt = fg_sgd_new(m, &(fg_sgd_opts){.lr = 0.5});
    fg_scaler *s = fg_scaler_new(&(fg_scaler_opts){.init_scale = 1024});
    fill_grads(m, 3.0 * 1024);
    CHECK_OK(fg_scaler_unscale(s, m, NULL));
    CHECK_OK(fg_scaler_unscale(s, m, NULL)); /* a second time does nothing */
    fg_tensor *g = fg_module_flat_grads(m);
    CHECK(fg_tensor_get(g, 0) == 3.0 && fg_tensor_get(g, fg_tensor_numel(g) - 1) == 3.0);
    double p0 = fg_tensor_get(fg_module_flat_params(m), 0);
    bool stepped = false;
    CHECK_OK(fg_scaler_step(s, opt, NULL, &stepped));
    CHECK(stepped && fg_optimizer_step_count(opt) == 1);
    CHECK_CLOSE(fg_tensor_get(fg_module_flat_params(m), 0), p0 - 0.5 * 3.0, 1e-6, 1e-6);
    CHECK(fg_scaler_get_state(s).growth_tracker == 1);
    CHECK_STATUS(fg_scaler_unscale(NULL, m, NULL), FG_EINVAL);
    CHECK_STATUS(fg_scaler_step(s, NULL, NULL, NULL), FG_EINVAL);
    fg_scaler_free(s);
    fg_optimizer_free(opt);
    fg_module_free(m);
}

TEST(skip_on_inf_or_nan) {
    fg_module *m = tiny();
    fg_optimizer *opt = fg_adamw_new(m, NULL);
    fg_scaler *s = fg_scaler_new(NULL);
    fg_set_log(capture, NULL, FG_LOG_WARN);
    double bad[2] = {INFINITY, NAN};
    for (int k = 0; k < 2; k++) {
        fill_grads(m, 1.0);
        ((float *)fg_tensor_data(fg_module_flat_grads(m)))[5] = (float)bad[k];
        fg_tensor *p = fg_module_flat_params(m);
        float before[64];
        int64_t n = fg_tensor_numel(p);
        memcpy(before, fg_tensor_data(p), sizeof(float) * (size_t)n);
        double scale = fg_scaler_scale(s);
        bool stepped = true;
        g_log[0] = 0;
        CHECK_OK(fg_scaler_step(s, opt, NULL, &stepped));
        CHECK(!stepped);
        CHECK(!memcmp(before, fg_tensor_data(p), sizeof(float) * (size_t)n));
        CHECK(fg_optimizer_step_count(opt) == 0);
        CHECK(fg_tensor_get(fg_optimizer_state(opt, 0), 0) == 0); /* exp_avg untouched */
        CHECK(fg_scaler_scale(s) == scale * 0.5);
        CHECK(fg_scaler_get_state(s).skipped == k + 1);
        CHECK_CONTAINS(g_log, "optimizer step skipped: inf/NaN gradients (found on rank 0)");
    }
    CHECK(fg_scaler_scale(s) == 16384.0);
    fg_set_log(NULL, NULL, FG_LOG_WARN);
    fg_scaler_free(s);
    fg_optimizer_free(opt);
    fg_module_free(m);
}

TEST(growth_after_interval) {
    fg_module *m = tiny();
    fg_optimizer *opt = fg_sgd_new(m, &(fg_sgd_opts){.lr = 1e-3});
    fg_scaler *s = fg_scaler_new(&(fg_scaler_opts){.init_scale = 8, .growth_interval = 3});
    double want[] = {8, 8, 16, 16, 16, 32};
    for (int i = 0; i < 6; i++) {
        fill_grads(m, fg_scaler_scale(s));
        CHECK_OK(fg_scaler_step(s, opt, NULL, NULL));
        CHECK_MSG(fg_scaler_scale(s) == want[i], "after step %d: %g, want %g", i + 1,
                  fg_scaler_scale(s), want[i]);
    }
    /* a skip resets the count of clean steps */
    fill_grads(m, INFINITY);
    CHECK_OK(fg_scaler_step(s, opt, NULL, NULL));
    CHECK(fg_scaler_scale(s) == 16 && fg_scaler_get_state(s).growth_tracker == 0);
    for (int i = 0; i < 3; i++) {
        fill_grads(m, 1.0);
        CHECK_OK(fg_scaler_step(s, opt, NULL, NULL));
    }
    CHECK(fg_scaler_scale(s) == 32);
    /* the default interval: 2000 */
    fg_scaler *d = fg_scaler_new(NULL);
    for (int i = 0; i < 1999; i++) {
        fill_grads(m, 0.0);
        CHECK_OK(fg_scaler_step(d, opt, NULL, NULL));
    }
    CHECK(fg_scaler_scale(d) == 65536.0);
    fill_grads(m, 0.0);
    CHECK_OK(fg_scaler_step(d, opt, NULL, NULL));
    CHECK(fg_scaler_scale(d) == 131072.0);
    fg_scaler_free(d);
    fg_scaler_free(s);
    fg_optimizer_free(opt);
    fg_module_free(m);
}

TEST(state) {
    fg_scaler *s = fg_scaler_new(NULL);
    fg_scaler_state st = {.scale = 0.125, .growth_tracker = 17, .skipped = 4};
    CHECK_OK(fg_scaler_set_state(s, &st));
    fg_scaler_state got = fg_scaler_get_state(s);
    CHECK(got.scale == 0.125 && got.growth_tracker == 17 && got.skipped == 4);
    CHECK_STATUS(fg_scaler_set_state(s, &(fg_scaler_state){.scale = INFINITY}), FG_EINVAL);
    CHECK_STATUS(fg_scaler_set_state(s, &(fg_scaler_state){.scale = 1, .skipped = -1}), FG_EINVAL);
    CHECK(fg_scaler_scale(s) == 0.125); /* unchanged */
    fg_scaler_free(s);
}
