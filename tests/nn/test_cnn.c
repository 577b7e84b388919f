/* A small CNN made of the new layers learns: Sequential(Conv2d(1, 6, 3,
 * padding 1), BatchNorm2d(6), ReLU, MaxPool2d(2), Conv2d(6, 8, 3, groups
 * 2, padding "same"), SiLU, AdaptiveAvgPool2d(2), Flatten, Linear(32, 3))
 * on 8 x 8 images of three stroke directions, trained by plain SGD on the
 * flat buffers, in f32 and f64: the loss falls by 4x and every training
 * image is classified right in evaluation mode. Also the state dict's
 * names and order are PyTorch's nn.Sequential's (BatchNorm's buffers after
 * the parameters), and BatchNorm's running statistics move in training
 * mode only. */
#include <math.h>
#include <string.h>

#include "fulgur/nn.h"
#include "harness.h"

#define NIMG 24

/* image i of class i % 3: a horizontal, vertical or diagonal stroke at an
 * offset, plus a fixed pseudo-random speckle */
static void make_data(float *x, int32_t *t) {
    fg_rng r = {99, 0};
    for (int i = 0; i < NIMG; i++) {
        int c = i % 3, off = 1 + (i / 3) % 6;
        t[i] = c;
        for (int p = 0; p < 64; p++) {
            int row = p / 8, col = p % 8;
            bool on = c == 0 ? row == off : c == 1 ? col == off : (row + off) % 8 == col;
            x[i * 64 + p] = (on ? 1.0f : 0.0f) + 0.2f * (float)fg_rng_normal(&r);
        }
    }
}

static fg_module *make_cnn(fg_dtype dt) {
    fg_module *s = fg_sequential_new();
    CHECK_OK(fg_sequential_append(
        s, fg_conv2d_new(1, 6, (int64_t[]){3, 3}, &(fg_conv2d_opts){.padding = {1, 1}}, true, dt)));
    CHECK_OK(fg_sequential_append(s, fg_batch_norm2d_new(6, 1e-5, 0.1, true, true, dt)));
    CHECK_OK(fg_sequential_append(s, fg_relu_new()));
    CHECK_OK(
        fg_sequential_append(s, fg_max_pool2d_new((int64_t[]){2, 2}, NULL, NULL, NULL, false)));
    CHECK_OK(fg_sequential_append(s, fg_conv2d_new(6, 8, (int64_t[]){3, 3},
                                                   &(fg_conv2d_opts){.groups = 2, .same = true},
                                                   true, dt)));
    CHECK_OK(fg_sequential_append(s, fg_silu_new()));
    CHECK_OK(fg_sequential_append(s, fg_adaptive_avg_pool2d_new(2, 2)));
    CHECK_OK(fg_sequential_append(s, fg_flatten_new(1, -1)));
    CHECK_OK(fg_sequential_append(s, fg_linear_new(32, 3, true, dt)));
    CHECK_OK(fg_module_set_seed(s, 5));
    return fg_module_finalize(s) == FG_OK ? s : NULL;
}

TEST(state_dict_names_are_pytorch_sequential_names) {
    fg_module *m = make_cnn(FG_F32);
    CHECK(m != NULL);
    if (!m) return;
    const char *want[] = {"0.weight",
                          "0.bias",
                          "1.weight",
                          "1.bias",
                          "4.weight",
                          "4.bias",
                          "8.weight",
                          "8.bias",
                          "1.running_mean",
                          "1.running_var",
                          "1.num_batches_tracked"};
    CHECK(fg_module_state_count(m) == 11);
    for (int i = 0; i < 11 && i < fg_module_state_count(m); i++)
        CHECK_MSG(strcmp(fg_module_state_name(m, i), want[i]) == 0, "entry %d is %s, want %s", i,
                  fg_module_state_name(m, i), want[i]);
    CHECK(fg_tensor_dim(fg_module_state_tensor(m, 4), 1) == 3); /* groups 2: (8, 3, 3, 3) */
    fg_module_free(m);
}

static void train(fg_dtype dt) {
    fg_module *m = make_cnn(dt);
    CHECK(m != NULL);
    if (!m) return;
    float xf[NIMG * 64];
    int32_t tv[NIMG];
    make_data(xf, tv);
    int64_t xs[] = {NIMG, 1, 8, 8}, ns = NIMG;
    fg_tensor *x32 = fg_tensor_wrap(xf, FG_F32, 4, xs), *x = fg_tensor_new(dt, 4, xs);
    CHECK_OK(fg_tensor_copy(x, x32));
    fg_tensor *t = fg_tensor_wrap(tv, FG_I32, 1, &ns);
    fg_tensor *p = fg_module_flat_params(m), *g = fg_module_flat_grads(m);
    double first = 0, last = 0;
    for (int step = 0; step < 150; step++) {
        fg_module_zero_grad(m);
        fg_tensor *loss = fg_cross_entropy_ex(fg_module_forward(m, x), t, NULL);
        CHECK_MSG(loss != NULL, "step %d: %s", step, fg_last_error());
        if (!loss) break;
        if (step == 0) first = fg_item(loss);
        last = fg_item(loss);
        CHECK_OK(fg_backward(loss));
        /* p -= 0.1 g */
        for (int64_t i = 0; i < fg_tensor_numel(p); i++) {
            double v = fg_tensor_get(p, i) - 0.1 * fg_tensor_get(g, i);
            if (dt == FG_F32) ((float *)fg_tensor_data(p))[i] = (float)v;
            else ((double *)fg_tensor_data(p))[i] = v;
        }
        fg_step_reset();
    }
    printf("  %s: loss %.4f -> %.4f in 150 steps\n", fg_dtype_name(dt), first, last);
    CHECK_MSG(last < first / 4, "%s: loss %g -> %g", fg_dtype_name(dt), first, last);
    /* evaluation mode: the running statistics normalise; they no longer move */
    fg_tensor *rm = fg_module_state_tensor(m, 8);
    double rm0 = fg_tensor_get(rm, 0);
    CHECK(rm0 != 0);
    fg_module_train(m, false);
    fg_tensor *logits = fg_module_forward(m, x);
    fg_tensor *pred = fg_argmax(logits, 1, false);
    int right = 0;
    for (int i = 0; pred && i < NIMG; i++) right += fg_tensor_get(pred, i) == tv[i];
    CHECK_MSG(right == NIMG, "%s: %d of %d right in evaluation mode", fg_dtype_name(dt), right,
              NIMG);
    CHECK(fg_tensor_get(rm, 0) == rm0);
    CHECK(fg_item(fg_module_state_tensor(m, 10)) == 150); /* num_batches_tracked */
    fg_step_reset();
    fg_tensor_free(x32);
    fg_tensor_free(x);
    fg_tensor_free(t);
    fg_module_free(m);
}

TEST(small_cnn_learns_f32) { train(FG_F32); }
TEST(small_cnn_learns_f64) { train(FG_F64); }
