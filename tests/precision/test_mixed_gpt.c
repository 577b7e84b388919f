/* A small GPT trained for 100 steps (AdamW, the same data and seed) under
 * 32-true, bf16-mixed and 16-mixed (autocast plus the loss scaler, as the
 * fabric runs them): the mixed runs end within 3% of 32-true's loss, after
 * the loss fell well below its start. Tiny on purpose (a few seconds). */
#include <math.h>

#include "fulgur/precision.h"
#include "harness.h"

#define STEPS 100
#define V 23
#define T 16
#define B 8

/* a learnable sequence: token t+1 = (3 * token t + 1) mod V, random starts */
static void batch(int step, fg_tensor **x, fg_tensor **y) {
    int64_t sh[2] = {B, T};
    *x = fg_empty(FG_I32, 2, sh);
    *y = fg_empty(FG_I32, 2, sh);
    int32_t *px = fg_tensor_data(*x), *py = fg_tensor_data(*y);
    for (int b = 0; b < B; b++) {
        int32_t tok = (int32_t)(fg_rng_u32_at(77, (uint64_t)(step * B + b)) % V);
        for (int t = 0; t < T; t++) {
            px[b * T + t] = tok;
            tok = (3 * tok + 1) % V;
            py[b * T + t] = tok;
        }
    }
}

/* the mean loss of the last 10 steps; *first the first step's */
static double train(fg_precision_kind kind, double *first) {
    const fg_precision_policy *pol = fg_precision_policy_of(kind);
    fg_module *m = fg_gpt_new(
        &(fg_gpt_config){.vocab = V, .ctx = T, .layers = 2, .heads = 2, .embd = 32, .seed = 4});
    fg_optimizer *opt = fg_adamw_new(m, &(fg_adamw_opts){.lr = 3e-3});
    fg_scaler *sc = pol->loss_scaling ? fg_scaler_new(NULL) : NULL;
    fg_dtype prev;
    CHECK_OK(fg_autocast_set(pol->master_weights ? pol->compute : FG_DTYPE_DEFAULT, &prev));
    double tail = 0;
    for (int step = 0; step < STEPS; step++) {
        fg_tensor *x, *y;
        batch(step, &x, &y);
        fg_optimizer_zero_grad(opt);
        fg_tensor *loss = fg_cross_entropy(fg_module_forward(m, x), y, -100);
        double l = fg_item(loss);
        if (step == 0) *first = l;
        if (step >= STEPS - 10) tail += l / 10;
        if (sc) {
            CHECK_OK(fg_backward(fg_scale(loss, fg_scaler_scale(sc))));
            CHECK_OK(fg_scaler_step(sc, opt, NULL, NULL));
        } else {
            CHECK_OK(fg_backward(loss));
            CHECK_OK(fg_optimizer_step(opt));
        }
        fg_step_reset();
    }
    CHECK_OK(fg_autocast_set(prev, NULL));
    if (sc)
        printf("    16-mixed: %lld steps skipped, scale %g\n",
               (long long)fg_scaler_get_state(sc).skipped, fg_scaler_scale(sc));
    fg_scaler_free(sc);
    fg_optimizer_free(opt);
    fg_module_free(m);
    return tail;
}

TEST(mixed_lands_near_f32) {
    CHECK_OK(fg_set_num_threads(1));
    printf("    bf16 products: %s\n", fg_matmul_bf16_path());
    double f0, b0, h0;
    double f32 = train(FG_PRECISION_32_TRUE, &f0);
    double bf16 = train(FG_PRECISION_BF16_MIXED, &b0);
    double f16 = train(FG_PRECISION_16_MIXED, &h0);
    printf("    loss over the last 10 steps: 32-true %.4f, bf16-mixed %.4f, 16-mixed %.4f (from "
           "%.4f)\n",
           f32, bf16, f16, f0);
    CHECK_MSG(f32 < 0.5 * f0, "32-true did not learn: %g -> %g", f0, f32);
    CHECK_MSG(fabs(bf16 - f32) <= 0.03 * f32, "bf16-mixed %g vs 32-true %g", bf16, f32);
    CHECK_MSG(fabs(f16 - f32) <= 0.03 * f32, "16-mixed %g vs 32-true %g", f16, f32);
}
