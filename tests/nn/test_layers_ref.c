/* The activations (as modules: Sigmoid, Tanh, SiLU, GELU both forms,
 * Softplus, LeakyReLU, ELU, Softmax, LogSoftmax, ReLU) and the losses (mse,
 * l1, smooth_l1, huber, bce with weights, bce_with_logits with pos_weight,
 * kl_div, nll_loss and cross_entropy_ex with class weights, ignore_index
 * and label smoothing, in every reduction) against PyTorch 1.13, forward
 * and backward, in f32 and f64: tests/ref/gen_layers_ref.py wrote
 * tests/ref/layers_ref.bin, one case per "<name>.<dt>.cfg" array. Then
 * Flatten and Identity, and that cross_entropy_ex with the defaults is
 * fg_cross_entropy bit for bit. */
#include <math.h>
#include <string.h>

#include "fulgur/nn.h"
#include "harness.h"
#include "ref/ref_file.h"

static fg_tensor *from_ref(const ref_array *a, bool grad) {
    fg_tensor *t = fg_tensor_new(a->dtype, a->ndim, a->shape);
    memcpy(fg_tensor_data(t), a->data, fg_tensor_nbytes(t));
    fg_tensor_set_requires_grad(t, grad);
    return t;
}

static const ref_array *opt(const ref_file *r, const char *pre, const char *k) {
    char name[160];
    snprintf(name, sizeof name, "%s.%s", pre, k);
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->a[i].name, name)) return &r->a[i];
    return NULL;
}

/* elements of got off ref beyond atol + rtol |ref|, the largest gap in *worst */
static int compare(const fg_tensor *got, const ref_array *want, double rtol, double atol,
                   double *worst) {
    if (!got || fg_tensor_numel(got) != want->numel) return -1;
    int bad = 0;
    for (int64_t i = 0; i < want->numel; i++) {
        double a = fg_tensor_get(got, i), b = ref_at(want, i), d = fabs(a - b);
        if (!(d <= atol + rtol * fabs(b))) bad++;
        if (d > *worst) *worst = d;
    }
    return bad;
}

static fg_module *act_module(int kind, double a, double b) {
    switch (kind) {
    case 0: return fg_sigmoid_new();
    case 1: return fg_tanh_new();
    case 2: return fg_silu_new();
    case 3: return fg_gelu_new_approximate("none");
    case 4: return fg_gelu_new_approximate("tanh");
    case 5: return fg_softplus_new(a, b);
    case 6: return fg_leaky_relu_new(a);
    case 7: return fg_elu_new(a);
    case 8: return fg_softmax_new((int)a);
    case 9: return fg_log_softmax_new((int)a);
    default: return fg_relu_new();
    }
}

static fg_tensor *run_loss(int kind, fg_reduction red, double a, int64_t ignore, fg_tensor *x,
                           fg_tensor *t, fg_tensor *w, fg_tensor *pw) {
    fg_class_loss_opts o = fg_class_loss_defaults();
    o.weight = w;
    o.ignore_index = ignore;
    o.reduction = red;
    o.label_smoothing = a;
    switch (kind) {
    case 20: return fg_mse_loss(x, t, red);
    case 21: return fg_l1_loss(x, t, red);
    case 22: return fg_smooth_l1_loss(x, t, red, a);
    case 23: return fg_huber_loss(x, t, red, a);
    case 24: return fg_binary_cross_entropy(x, t, w, red);
    case 25: return fg_binary_cross_entropy_with_logits(x, t, w, pw, red);
    case 26: return fg_kl_div(x, t, red, a != 0);
    case 27: return fg_nll_loss(x, t, &o);
    default: return fg_cross_entropy_ex(x, t, &o);
    }
}

TEST(activations_and_losses_match_pytorch_f32_f64) {
    ref_file *r = ref_open(fg_test_path("ref/layers_ref.bin"));
    CHECK(r != NULL);
    if (!r) return;
    int ncases = 0;
    double worst32 = 0, worst64 = 0;
    for (int i = 0; i < r->n; i++) {
        size_t len = strlen(r->a[i].name);
        if (len < 4 || strcmp(r->a[i].name + len - 4, ".cfg") || ref_at(&r->a[i], 0) >= 40)
            continue;
        char pre[128];
        snprintf(pre, sizeof pre, "%.*s", (int)(len - 4), r->a[i].name);
        const ref_array *cfg = &r->a[i];
        int kind = (int)ref_at(cfg, 0);
        fg_reduction red = (fg_reduction)(int)ref_at(cfg, 1);
        double a = ref_at(cfg, 2), b = ref_at(cfg, 3);
        int64_t ignore = (int64_t)ref_at(cfg, 4);
        const ref_array *rx = opt(r, pre, "x"), *rt = opt(r, pre, "t"), *rw = opt(r, pre, "w"),
                        *rpw = opt(r, pre, "pw"), *rgy = opt(r, pre, "gy"), *ry = opt(r, pre, "y"),
                        *rgx = opt(r, pre, "gx"), *rgt = opt(r, pre, "gt");
        CHECK_MSG(rx && rgy && ry && rgx, "%s: arrays missing", pre);
        if (!rx || !rgy || !ry || !rgx) continue;
        bool f32 = rx->dtype == FG_F32;
        double rtol = f32 ? 1e-5 : 1e-12, atol = f32 ? 1e-6 : 1e-13;
        double *worst = f32 ? &worst32 : &worst64;
        fg_tensor *x = from_ref(rx, true), *t = rt ? from_ref(rt, rgt != NULL) : NULL;
        fg_tensor *tv = t;
        /* numpy writes a 0-d target as (1): PyTorch's (C) input takes a 0-d one */
        if (t && rx->ndim == 1 && rt->dtype == FG_I32) tv = fg_tensor_reshape_view(t, 0, NULL);
        fg_tensor *w = rw ? from_ref(rw, false) : NULL, *pw = rpw ? from_ref(rpw, false) : NULL;
        fg_module *m = NULL;
        fg_tensor *y;
        if (kind < 20) {
            m = act_module(kind, a, b);
            y = fg_module_forward(m, x);
        } else {
            y = run_loss(kind, red, a, ignore, x, tv, w, pw);
        }
        CHECK_MSG(y != NULL, "%s: %s", pre, fg_last_error());
        if (y) {
            fg_tensor *gy = fg_empty(rgy->dtype, fg_tensor_ndim(y), fg_tensor_shape(y));
            CHECK_MSG(fg_tensor_numel(gy) == rgy->numel, "%s: output has %lld elements, want %lld",
                      pre, (long long)fg_tensor_numel(gy), (long long)rgy->numel);
            if (fg_tensor_numel(gy) == rgy->numel) {
                memcpy(fg_tensor_data(gy), rgy->data, fg_tensor_nbytes(gy));
                CHECK_OK(fg_backward_with(y, gy));
                int by = compare(y, ry, rtol, atol, worst);
                int bx = compare(fg_tensor_grad(x), rgx, rtol, atol, worst);
                int bt = rgt ? compare(fg_tensor_grad(t), rgt, rtol, atol, worst) : 0;
                CHECK_MSG(by == 0 && bx == 0 && bt == 0,
                          "%s: %d output, %d input-gradient, %d target-gradient elements off", pre,
                          by, bx, bt);
            }
        }
        ncases++;
        fg_step_reset();
        fg_module_free(m);
        fg_tensor_free(x);
        fg_tensor_free(t);
        fg_tensor_free(w);
        fg_tensor_free(pw);
    }
    printf("  %d cases; largest gap f32 %.3g, f64 %.3g\n", ncases, worst32, worst64);
    CHECK(ncases >= 150);
    ref_close(r);
}

/* the module of a layer case from its cfg (geometry after entry 5) */
static fg_module *layer_module(const ref_array *cfg, fg_dtype dt) {
    int kind = (int)ref_at(cfg, 0);
    double g[16] = {0};
    for (int k = 0; k < 16 && 5 + k < cfg->numel; k++) g[k] = ref_at(cfg, 5 + k);
    if (kind == 40 || kind == 41) {
        fg_conv2d_opts o = {.stride = {(int64_t)g[4], (int64_t)g[5]},
                            .padding = {(int64_t)g[6], (int64_t)g[7]},
                            .dilation = {(int64_t)g[8], (int64_t)g[9]},
                            .groups = (int64_t)g[10],
                            .same = g[11] != 0};
        if (kind == 40)
            return fg_conv2d_new((int64_t)g[0], (int64_t)g[1],
                                 (int64_t[]){(int64_t)g[2], (int64_t)g[3]}, &o, g[12] != 0, dt);
        return fg_conv1d_new((int64_t)g[0], (int64_t)g[1], (int64_t)g[2], &o, g[12] != 0, dt);
    }
    if (kind == 42 || kind == 43) {
        int64_t k[2] = {(int64_t)g[0], (int64_t)g[1]}, st[2] = {(int64_t)g[2], (int64_t)g[3]};
        int64_t pd[2] = {(int64_t)g[4], (int64_t)g[5]}, dl[2] = {(int64_t)g[6], (int64_t)g[7]};
        if (kind == 42) return fg_max_pool2d_new(k, st, pd, dl, g[8] != 0);
        return fg_avg_pool2d_new(k, st, pd, g[8] != 0, g[9] != 0);
    }
    if (kind == 44) return fg_adaptive_avg_pool2d_new((int64_t)g[0], (int64_t)g[1]);
    if (kind == 45) return fg_batch_norm2d_new((int64_t)g[0], g[1], g[2], g[3] != 0, true, dt);
    if (kind == 47) return fg_group_norm_new((int64_t)g[0], (int64_t)g[1], g[2], g[3] != 0, dt);
    if (kind == 48)
        return fg_instance_norm2d_new((int64_t)g[0], g[1], g[2], g[3] != 0, g[4] != 0, dt);
    if (kind == 49) return fg_rms_norm_new((int64_t)g[0], g[1], g[2] != 0, dt);
    if (kind == 50) {
        fg_conv_transpose2d_opts o = {.stride = {(int64_t)g[4], (int64_t)g[5]},
                                      .padding = {(int64_t)g[6], (int64_t)g[7]},
                                      .output_padding = {(int64_t)g[8], (int64_t)g[9]},
                                      .dilation = {(int64_t)g[10], (int64_t)g[11]},
                                      .groups = (int64_t)g[12]};
        return fg_conv_transpose2d_new((int64_t)g[0], (int64_t)g[1],
                                       (int64_t[]){(int64_t)g[2], (int64_t)g[3]}, &o, g[13] != 0,
                                       dt);
    }
    return fg_batch_norm1d_new((int64_t)g[0], g[1], g[2], g[3] != 0, true, dt);
}

TEST(cnn_layers_match_pytorch_f32_f64) {
    ref_file *r = ref_open(fg_test_path("ref/layers_ref.bin"));
    CHECK(r != NULL);
    if (!r) return;
    int ncases = 0;
    double worst32 = 0, worst64 = 0;
    for (int i = 0; i < r->n; i++) {
        size_t len = strlen(r->a[i].name);
        if (len < 4 || strcmp(r->a[i].name + len - 4, ".cfg") || ref_at(&r->a[i], 0) < 40) continue;
        char pre[128];
        snprintf(pre, sizeof pre, "%.*s", (int)(len - 4), r->a[i].name);
        const ref_array *rx = opt(r, pre, "x"), *rgy = opt(r, pre, "gy"), *ry = opt(r, pre, "y"),
                        *rgx = opt(r, pre, "gx");
        CHECK_MSG(rx && rgy && ry && rgx, "%s: arrays missing", pre);
        if (!rx || !rgy || !ry || !rgx) continue;
        bool f32 = rx->dtype == FG_F32;
        double rtol = f32 ? 2e-5 : 1e-11, atol = f32 ? 2e-6 : 1e-13;
        double *worst = f32 ? &worst32 : &worst64;
        fg_module *m = layer_module(&r->a[i], rx->dtype);
        CHECK_MSG(m != NULL, "%s: %s", pre, fg_last_error());
        if (!m) continue;
        /* PyTorch's parameters and names: loaded strictly */
        fg_state_entry e[2];
        int ne = 0;
        const char *pn[2] = {"weight", "bias"};
        for (int k = 0; k < 2; k++) {
            const ref_array *a = opt(r, pre, pn[k]);
            if (a) e[ne++] = (fg_state_entry){pn[k], a->dtype, a->ndim, a->shape, a->data};
        }
        CHECK_OK(fg_module_finalize(m));
        int np = ne;
        /* BatchNorm: PyTorch's fresh buffers too, so that the load is strict */
        int64_t C = (int64_t)ref_at(&r->a[i], 5), one = 1;
        double zeros[8] = {0}, ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};
        fg_state_entry be[5];
        memcpy(be, e, sizeof(fg_state_entry) * (size_t)ne);
        if (fg_module_num_buffers(m) == 3 && C <= 8) {
            be[ne++] = (fg_state_entry){"running_mean", FG_F64, 1, &C, zeros};
            be[ne++] = (fg_state_entry){"running_var", FG_F64, 1, &C, ones};
            be[ne++] = (fg_state_entry){"num_batches_tracked", FG_F64, 0, &one, zeros};
        }
        CHECK_OK(fg_module_load_state(m, be, ne, true));
        CHECK(fg_module_num_params(m) == np);
        ne = np;
        fg_tensor *x = from_ref(rx, true);
        fg_tensor *y = fg_module_forward(m, x);
        CHECK_MSG(y != NULL, "%s: %s", pre, fg_last_error());
        if (y && fg_tensor_numel(y) == rgy->numel) {
            fg_tensor *gy = fg_empty(rgy->dtype, fg_tensor_ndim(y), fg_tensor_shape(y));
            memcpy(fg_tensor_data(gy), rgy->data, fg_tensor_nbytes(gy));
            CHECK_OK(fg_backward_with(y, gy));
            int bad = compare(y, ry, rtol, atol, worst);
            bad += compare(fg_tensor_grad(x), rgx, rtol, atol, worst);
            for (int k = 0; k < ne; k++) {
                char gname[16];
                snprintf(gname, sizeof gname, "g%s", pn[k]);
                fg_tensor *pt = fg_module_param(m, fg_module_find_param(m, pn[k]));
                bad += compare(fg_tensor_grad(pt), opt(r, pre, gname), rtol, atol, worst);
            }
            const ref_array *rm = opt(r, pre, "running_mean"), *rv = opt(r, pre, "running_var");
            if (rm && rv) {
                bad += compare(fg_module_buffer(m, 0), rm, rtol, atol, worst);
                bad += compare(fg_module_buffer(m, 1), rv, rtol, atol, worst);
                CHECK(fg_item(fg_module_buffer(m, 2)) == 1); /* num_batches_tracked */
                CHECK(strcmp(fg_module_buffer_name(m, 2), "num_batches_tracked") == 0);
                fg_module_train(m, false);
                fg_tensor *ye = fg_module_forward(m, x);
                bad += compare(ye, opt(r, pre, "y_eval"), rtol, atol, worst);
            }
            CHECK_MSG(bad == 0, "%s: %d values off", pre, bad);
        } else {
            CHECK_MSG(false, "%s: output of %lld elements, want %lld", pre,
                      y ? (long long)fg_tensor_numel(y) : -1LL, (long long)rgy->numel);
        }
        ncases++;
        fg_step_reset();
        fg_module_free(m);
        fg_tensor_free(x);
    }
    printf("  %d layer cases; largest gap f32 %.3g, f64 %.3g\n", ncases, worst32, worst64);
    CHECK(ncases >= 70);
    ref_close(r);
}

TEST(cross_entropy_ex_defaults_are_fg_cross_entropy_bits) {
    int64_t s[] = {6, 11}, n = 6;
    fg_tensor *x = fg_empty(FG_F32, 2, s);
    float *p = fg_tensor_data(x);
    for (int i = 0; i < 66; i++) p[i] = (float)sin(i * 1.7) * 3;
    int32_t tv[] = {3, -100, 10, 0, 5, 5};
    fg_tensor *t = fg_from_data(FG_I32, 1, &n, tv);
    fg_tensor *a = fg_cross_entropy(x, t, -100), *b = fg_cross_entropy_ex(x, t, NULL);
    CHECK(a && b && memcmp(fg_tensor_data(a), fg_tensor_data(b), 4) == 0);
    /* and through the general path (sum / count) within rounding */
    fg_class_loss_opts o = fg_class_loss_defaults();
    o.reduction = FG_REDUCTION_SUM;
    fg_tensor *c = fg_cross_entropy_ex(x, t, &o);
    CHECK(c);
    if (c && a) CHECK_CLOSE(fg_item(c) / 5, fg_item(a), 1e-6, 1e-7);
    /* a bad target named; a bad smoothing */
    tv[2] = 11;
    t = fg_from_data(FG_I32, 1, &n, tv);
    CHECK(fg_cross_entropy_ex(x, t, &o) == NULL);
    CHECK_CONTAINS(fg_last_error(), "target 11 (row 2)");
    o.label_smoothing = 1.5;
    CHECK(fg_cross_entropy_ex(x, t, &o) == NULL);
    CHECK_CONTAINS(fg_last_error(), "label_smoothing");
    CHECK(fg_cross_entropy_ex(x, x, NULL) == NULL);
    CHECK_CONTAINS(fg_last_error(), "i32 targets");
    fg_step_reset();
}

TEST(flatten_identity_modules) {
    fg_module *f = fg_flatten_new(1, -1), *id = fg_identity_new(), *g = fg_flatten_new(0, 1);
    fg_tensor *x = fg_zeros(FG_F32, 4, (int64_t[]){2, 3, 4, 5});
    fg_tensor *y = fg_module_forward(f, x);
    CHECK(y && fg_tensor_ndim(y) == 2 && fg_tensor_dim(y, 1) == 60);
    CHECK(fg_module_forward(id, x) == x);
    y = fg_module_forward(g, x);
    CHECK(y && fg_tensor_ndim(y) == 3 && fg_tensor_dim(y, 0) == 6);
    CHECK(fg_module_num_params(f) == 0 && fg_module_state_count(id) == 0);
    CHECK(strcmp(fg_module_type(f), "Flatten") == 0);
    CHECK(fg_gelu_new_approximate("exact") == NULL);
    CHECK_CONTAINS(fg_last_error(), "\"none\" or \"tanh\"");
    fg_step_reset();
    fg_module_free(f);
    fg_module_free(id);
    fg_module_free(g);
}
