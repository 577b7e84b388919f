/* group_norm, rms_norm, instance_norm (training and evaluation),
 * conv_transpose2d (stride, padding, output_padding, dilation, groups,
 * bias) and sync_batch_norm with a one-rank reduce: gradients by finite
 * differences in f64, values against the definition, the running
 * statistics, and the errors. */
#include <stdlib.h>

#include "gradcheck.h"

static void req(fg_tensor **t, int n) {
    for (int i = 0; i < n; i++) fg_tensor_set_requires_grad(t[i], true);
}
static void free_all(fg_tensor **t, int n) {
    for (int i = 0; i < n; i++) fg_tensor_free(t[i]);
}

#define GC(what, f, in, nin, arg) gradcheck(what, f, in, nin, arg, 1e-6, 1e-8)

static fg_tensor *f_group(fg_tensor **in, void *arg) {
    return fg_group_norm(in[0], *(int64_t *)arg, in[1], in[2], 1e-5);
}

TEST(group_norm_gradients_and_values) {
    int64_t groups[] = {1, 2, 6};
    for (int k = 0; k < 3; k++) {
        fg_tensor *in[3] = {gc_randn(4, (int64_t[]){2, 6, 3, 2}, 1 + k, 1.5),
                            gc_randn(1, (int64_t[]){6}, 2, 1), gc_randn(1, (int64_t[]){6}, 3, 1)};
        req(in, 3);
        CHECK(GC("group_norm", f_group, in, 3, &groups[k]) == 0);
        /* value: group 0 of sample 1 by the definition */
        fg_tensor *y = fg_group_norm(in[0], groups[k], NULL, NULL, 1e-5);
        int64_t per = 6 / groups[k] * 6, base = 36; /* sample 1, group 0 */
        double m = 0, v = 0;
        for (int64_t i = 0; i < per; i++) m += fg_tensor_get(in[0], base + i);
        m /= (double)per;
        for (int64_t i = 0; i < per; i++) {
            double d = fg_tensor_get(in[0], base + i) - m;
            v += d * d;
        }
        v /= (double)per;
        CHECK_CLOSE(fg_tensor_get(y, base + 1),
                    (fg_tensor_get(in[0], base + 1) - m) / sqrt(v + 1e-5), 1e-12, 1e-12);
        free_all(in, 3);
        fg_step_reset();
    }
    fg_tensor *x = fg_zeros(FG_F64, 3, (int64_t[]){2, 6, 4});
    CHECK(fg_group_norm(x, 4, NULL, NULL, 1e-5) == NULL);
    CHECK_CONTAINS(fg_last_error(), "multiple of groups");
    fg_step_reset();
}

static fg_tensor *f_rms(fg_tensor **in, void *arg) {
    return fg_rms_norm(in[0], *(int *)arg, in[1], 1e-6);
}

TEST(rms_norm_gradients_and_values) {
    int nd[] = {1, 2};
    int64_t wshape[2][2] = {{5, 0}, {3, 5}};
    for (int k = 0; k < 2; k++) {
        fg_tensor *in[2] = {gc_randn(3, (int64_t[]){2, 3, 5}, 7 + k, 2),
                            gc_randn(nd[k], wshape[k], 8, 1)};
        req(in, 2);
        CHECK(GC("rms_norm", f_rms, in, 2, &nd[k]) == 0);
        free_all(in, 2);
        fg_step_reset();
    }
    /* eps=None is the dtype's epsilon: x = 0 gives 0, not NaN */
    fg_tensor *x = fg_zeros(FG_F32, 2, (int64_t[]){2, 4});
    fg_tensor *y = fg_rms_norm(x, 1, NULL, -1);
    CHECK(y && fg_tensor_get(y, 3) == 0);
    x = gc_randn(2, (int64_t[]){1, 4}, 9, 1);
    y = fg_rms_norm(x, 1, NULL, 0);
    double ms = 0;
    for (int i = 0; i < 4; i++) ms += fg_tensor_get(x, i) * fg_tensor_get(x, i) / 4;
    CHECK_CLOSE(fg_tensor_get(y, 2), fg_tensor_get(x, 2) / sqrt(ms), 1e-14, 1e-14);
    fg_tensor_free(x);
    CHECK(fg_rms_norm(y, 3, NULL, 0) == NULL);
    CHECK_CONTAINS(fg_last_error(), "normalised dims");
    fg_step_reset();
}

typedef struct {
    bool stats;
    fg_tensor *rm, *rv;
} in_arg;

static fg_tensor *f_inst(fg_tensor **in, void *arg) {
    in_arg *a = arg;
    return fg_instance_norm(in[0], a->rm, a->rv, in[1], in[2], a->stats, 0.1, 1e-5);
}

TEST(instance_norm_gradients_running_stats_eval) {
    fg_tensor *in[3] = {gc_randn(4, (int64_t[]){3, 2, 4, 3}, 11, 1.2),
                        gc_randn(1, (int64_t[]){2}, 12, 1), gc_randn(1, (int64_t[]){2}, 13, 1)};
    req(in, 3);
    in_arg a = {true, NULL, NULL};
    CHECK(GC("instance_norm", f_inst, in, 3, &a) == 0);
    /* the running statistics: momentum of the mean over N of the
     * instances' means and unbiased variances */
    fg_tensor *rm = fg_tensor_new(FG_F64, 1, (int64_t[]){2});
    fg_tensor *rv = fg_tensor_new(FG_F64, 1, (int64_t[]){2});
    CHECK_OK(fg_tensor_fill(rm, 0));
    CHECK_OK(fg_tensor_fill(rv, 1));
    CHECK(fg_instance_norm(in[0], rm, rv, NULL, NULL, true, 0.1, 1e-5) != NULL);
    double mm = 0, vv = 0;
    for (int n = 0; n < 3; n++) {
        double m = 0, v = 0;
        for (int i = 0; i < 12; i++) m += fg_tensor_get(in[0], (n * 2 + 1) * 12 + i) / 12;
        for (int i = 0; i < 12; i++) {
            double d = fg_tensor_get(in[0], (n * 2 + 1) * 12 + i) - m;
            v += d * d / 11;
        }
        mm += m / 3;
        vv += v / 3;
    }
    CHECK_CLOSE(fg_tensor_get(rm, 1), 0.1 * mm, 1e-13, 1e-14);
    CHECK_CLOSE(fg_tensor_get(rv, 1), 0.9 + 0.1 * vv, 1e-13, 1e-14);
    /* evaluation: the running statistics normalise, gradients still flow */
    a = (in_arg){false, rm, rv};
    CHECK(GC("instance_norm eval", f_inst, in, 3, &a) == 0);
    fg_tensor *y = fg_instance_norm(in[0], rm, rv, NULL, NULL, false, 0.1, 1e-5);
    CHECK_CLOSE(fg_tensor_get(y, 12),
                (fg_tensor_get(in[0], 12) - fg_tensor_get(rm, 1)) /
                    sqrt(fg_tensor_get(rv, 1) + 1e-5),
                1e-13, 1e-14);
    CHECK(fg_instance_norm(in[0], NULL, NULL, NULL, NULL, false, 0.1, 1e-5) == NULL);
    CHECK_CONTAINS(fg_last_error(), "running mean");
    free_all(in, 3);
    fg_tensor_free(rm);
    fg_tensor_free(rv);
    fg_step_reset();
}

typedef struct {
    fg_conv_transpose2d_opts o;
    bool bias;
} ct_arg;

static fg_tensor *f_convt(fg_tensor **in, void *arg) {
    ct_arg *a = arg;
    return fg_conv_transpose2d(in[0], in[1], a->bias ? in[2] : NULL, &a->o);
}

/* y[n][o][i][j] of the transposed convolution by scattering x, in double */
static void naive_convt(const fg_tensor *x, const fg_tensor *w, const fg_tensor *b, const ct_arg *a,
                        double *y, int64_t OH, int64_t OW) {
    int64_t N = fg_tensor_dim(x, 0), C = fg_tensor_dim(x, 1), H = fg_tensor_dim(x, 2),
            W = fg_tensor_dim(x, 3);
    int64_t Og = fg_tensor_dim(w, 1), KH = fg_tensor_dim(w, 2), KW = fg_tensor_dim(w, 3);
    int64_t G = a->o.groups ? a->o.groups : 1, Cg = C / G, O = Og * G;
    int64_t sh = a->o.stride[0] ? a->o.stride[0] : 1, sw = a->o.stride[1] ? a->o.stride[1] : 1;
    int64_t dh = a->o.dilation[0] ? a->o.dilation[0] : 1;
    int64_t dw = a->o.dilation[1] ? a->o.dilation[1] : 1;
    for (int64_t i = 0; i < N * O * OH * OW; i++)
        y[i] = b ? fg_tensor_get(b, (i / (OH * OW)) % O) : 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t v = 0; v < W; v++)
                    for (int64_t og = 0; og < Og; og++)
                        for (int64_t kh = 0; kh < KH; kh++)
                            for (int64_t kw = 0; kw < KW; kw++) {
                                int64_t oh = h * sh - a->o.padding[0] + kh * dh;
                                int64_t ow = v * sw - a->o.padding[1] + kw * dw;
                                if (oh < 0 || oh >= OH || ow < 0 || ow >= OW) continue;
                                int64_t o = (c / Cg) * Og + og;
                                y[((n * O + o) * OH + oh) * OW + ow] +=
                                    fg_tensor_get(x, ((n * C + c) * H + h) * W + v) *
                                    fg_tensor_get(w, ((c * Og + og) * KH + kh) * KW + kw);
                            }
}

TEST(conv_transpose2d_gradients_and_values_every_option) {
    struct {
        int64_t N, C, H, W, Og, KH, KW;
        ct_arg a;
        int64_t oh, ow; /* PyTorch's output size */
    } cases[] = {
        {2, 3, 4, 3, 2, 3, 3, {{{1, 1}, {0, 0}, {0, 0}, {1, 1}, 1}, true}, 6, 5},
        {1, 4, 3, 4, 3, 3, 2, {{{2, 3}, {1, 0}, {1, 2}, {1, 1}, 2}, true}, 6, 13},
        {2, 2, 3, 3, 2, 2, 3, {{{2, 1}, {0, 1}, {1, 0}, {2, 2}, 1}, false}, 8, 5},
        {1, 6, 2, 3, 1, 1, 1, {{{1, 1}, {0, 0}, {0, 0}, {1, 1}, 3}, true}, 2, 3},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int64_t G = cases[k].a.o.groups;
        fg_tensor *in[3] = {
            gc_randn(4, (int64_t[]){cases[k].N, cases[k].C, cases[k].H, cases[k].W}, 20 + k, 1),
            gc_randn(4, (int64_t[]){cases[k].C, cases[k].Og, cases[k].KH, cases[k].KW}, 30 + k,
                     0.5),
            gc_randn(1, (int64_t[]){cases[k].Og * G}, 40 + k, 1)};
        req(in, 3);
        fg_tensor *y = f_convt(in, &cases[k].a);
        CHECK_MSG(y && fg_tensor_dim(y, 2) == cases[k].oh && fg_tensor_dim(y, 3) == cases[k].ow,
                  "case %zu: %s", k, y ? "wrong output size" : fg_last_error());
        if (y) {
            double *want = malloc(sizeof(double) * (size_t)fg_tensor_numel(y));
            naive_convt(in[0], in[1], cases[k].a.bias ? in[2] : NULL, &cases[k].a, want,
                        cases[k].oh, cases[k].ow);
            int bad = 0;
            for (int64_t i = 0; i < fg_tensor_numel(y); i++)
                bad += !(fabs(fg_tensor_get(y, i) - want[i]) <= 1e-12);
            CHECK_MSG(bad == 0, "case %zu: %d values off the definition", k, bad);
            free(want);
        }
        CHECK_MSG(GC("conv_transpose2d", f_convt, in, cases[k].a.bias ? 3 : 2, &cases[k].a) == 0,
                  "case %zu", k);
        /* f32 (oneDNN where built in) against f64 */
        fg_tensor *x32 = fg_empty(FG_F32, 4, fg_tensor_shape(in[0]));
        fg_tensor *w32 = fg_empty(FG_F32, 4, fg_tensor_shape(in[1]));
        CHECK_OK(fg_tensor_copy(x32, in[0]));
        CHECK_OK(fg_tensor_copy(w32, in[1]));
        fg_tensor *y32 = fg_conv_transpose2d(x32, w32, NULL, &cases[k].a.o);
        fg_tensor *y64 = fg_conv_transpose2d(in[0], in[1], NULL, &cases[k].a.o);
        CHECK(y32 && y64);
        if (y32 && y64)
            for (int64_t i = 0; i < fg_tensor_numel(y64); i++)
                CHECK_CLOSE(fg_tensor_get(y32, i), fg_tensor_get(y64, i), 1e-5, 1e-5);
        free_all(in, 3);
        fg_step_reset();
    }
    fg_tensor *x = fg_zeros(FG_F64, 4, (int64_t[]){1, 2, 3, 3});
    fg_tensor *w = fg_zeros(FG_F64, 4, (int64_t[]){2, 1, 3, 3});
    fg_conv_transpose2d_opts bad = {.stride = {2, 2}, .output_padding = {2, 0}};
    CHECK(fg_conv_transpose2d(x, w, NULL, &bad) == NULL);
    CHECK_CONTAINS(fg_last_error(), "output_padding 2");
    fg_tensor *w3 = fg_zeros(FG_F64, 4, (int64_t[]){3, 1, 3, 3});
    CHECK(fg_conv_transpose2d(x, w3, NULL, NULL) == NULL);
    CHECK_CONTAINS(fg_last_error(), "(C_in, C_out / groups, KH, KW)");
    fg_step_reset();
}

/* a one-rank "all-reduce" (the identity) that counts its calls */
static fg_status count_reduce(void *ud, fg_tensor *t) {
    (void)t;
    (*(int *)ud)++;
    return FG_OK;
}

typedef struct {
    const fg_stats_reduce *r;
    bool sync;
} sb_arg;

static fg_tensor *f_sbn(fg_tensor **in, void *arg) {
    sb_arg *a = arg;
    if (a->sync) return fg_sync_batch_norm(in[0], NULL, NULL, in[1], in[2], 0.1, 1e-5, a->r);
    return fg_batch_norm(in[0], NULL, NULL, in[1], in[2], true, 0.1, 1e-5);
}

TEST(sync_batch_norm_one_rank_is_batch_norm) {
    int calls = 0;
    fg_stats_reduce r = {count_reduce, &calls};
    fg_tensor *in[3] = {gc_randn(4, (int64_t[]){3, 2, 3, 2}, 51, 1.3),
                        gc_randn(1, (int64_t[]){2}, 52, 1), gc_randn(1, (int64_t[]){2}, 53, 1)};
    req(in, 3);
    sb_arg a = {&r, true};
    CHECK(GC("sync_batch_norm", f_sbn, in, 3, &a) == 0);
    calls = 0;
    fg_tensor *y = f_sbn(in, &a);
    CHECK(calls == 3); /* count, sum, squared deviations */
    fg_tensor *seed = fg_zeros(FG_F64, 4, fg_tensor_shape(y));
    CHECK_OK(fg_tensor_fill(seed, 1));
    CHECK_OK(fg_backward_with(y, seed));
    CHECK(calls == 5); /* and the two sums' gradients */
    sb_arg plain = {NULL, false};
    fg_tensor *yb = f_sbn(in, &plain);
    for (int64_t i = 0; i < fg_tensor_numel(y); i++)
        CHECK_CLOSE(fg_tensor_get(y, i), fg_tensor_get(yb, i), 1e-14, 1e-14);
    /* running statistics as batch_norm's */
    fg_tensor *rm[2], *rv[2];
    for (int k = 0; k < 2; k++) {
        rm[k] = fg_tensor_new(FG_F64, 1, (int64_t[]){2});
        rv[k] = fg_tensor_new(FG_F64, 1, (int64_t[]){2});
        CHECK_OK(fg_tensor_fill(rm[k], 0.5));
        CHECK_OK(fg_tensor_fill(rv[k], 2));
    }
    CHECK(fg_sync_batch_norm(in[0], rm[0], rv[0], NULL, NULL, 0.3, 1e-5, &r) != NULL);
    CHECK(fg_batch_norm(in[0], rm[1], rv[1], NULL, NULL, true, 0.3, 1e-5) != NULL);
    for (int c = 0; c < 2; c++) {
        CHECK_CLOSE(fg_tensor_get(rm[0], c), fg_tensor_get(rm[1], c), 1e-14, 1e-14);
        CHECK_CLOSE(fg_tensor_get(rv[0], c), fg_tensor_get(rv[1], c), 1e-14, 1e-14);
    }
    free_all(rm, 2);
    free_all(rv, 2);
    free_all(in, 3);
    fg_step_reset();
}

/* Autocast's lists: under bf16 autocast a convolution (conv2d, conv1d,
 * conv_transpose2d) of f32 tensors runs in bf16 (a bf16 output near the
 * f32 one, f32 gradients for the f32 weights), and the norms and losses
 * take a bf16 input in f32. */
TEST(autocast_convs_in_bf16_norms_and_losses_in_f32) {
    fg_tensor *x = fg_tensor_new(FG_F32, 4, (int64_t[]){2, 3, 6, 5});
    fg_tensor *w = fg_tensor_new(FG_F32, 4, (int64_t[]){4, 3, 3, 3});
    fg_tensor *wt = fg_tensor_new(FG_F32, 4, (int64_t[]){3, 2, 2, 2});
    fg_rng_fill_normal(1, 0, fg_tensor_data(x), fg_tensor_numel(x), 0, 1);
    fg_rng_fill_normal(2, 0, fg_tensor_data(w), fg_tensor_numel(w), 0, 0.3);
    fg_rng_fill_normal(3, 0, fg_tensor_data(wt), fg_tensor_numel(wt), 0, 0.3);
    fg_tensor_set_requires_grad(w, true);
    fg_tensor *y32 = fg_conv2d(x, w, NULL, NULL);
    CHECK_OK(fg_backward(fg_sum(y32)));
    fg_tensor *g32 = fg_empty(FG_F32, 4, fg_tensor_shape(w));
    CHECK_OK(fg_tensor_copy(g32, fg_tensor_grad(w)));
    fg_tensor_zero_grad(w);
    fg_dtype prev;
    CHECK_OK(fg_autocast_set(FG_BF16, &prev));
    fg_tensor *y = fg_conv2d(x, w, NULL, NULL);
    CHECK(y && fg_tensor_dtype(y) == FG_BF16);
    double worst = 0;
    for (int64_t i = 0; y && i < fg_tensor_numel(y); i++)
        worst = fmax(worst, fabs(fg_tensor_get(y, i) - fg_tensor_get(y32, i)));
    CHECK_MSG(worst < 0.1, "bf16 conv off the f32 one by %g", worst);
    CHECK_OK(fg_backward(fg_sum(y)));
    fg_tensor *g = fg_tensor_grad(w);
    CHECK(g && fg_tensor_dtype(g) == FG_F32);
    for (int64_t i = 0; g && i < fg_tensor_numel(g); i++)
        CHECK_CLOSE(fg_tensor_get(g, i), fg_tensor_get(g32, i), 3e-2, 0.3);
    fg_tensor *t = fg_conv_transpose2d(x, wt, NULL, NULL);
    CHECK(t && fg_tensor_dtype(t) == FG_BF16);
    fg_tensor *x1 = fg_reshape(x, 3, (int64_t[]){2, 3, 30});
    fg_tensor *w1 = fg_reshape(w, 3, (int64_t[]){4, 3, 9});
    fg_tensor *c1 = fg_conv1d(x1, w1, NULL, NULL);
    CHECK(c1 && fg_tensor_dtype(c1) == FG_BF16);
    /* the norms and losses: f32 out of a bf16 input */
    fg_tensor *bn = fg_batch_norm(y, NULL, NULL, NULL, NULL, true, 0.1, 1e-5);
    fg_tensor *gn = fg_group_norm(y, 2, NULL, NULL, 1e-5);
    fg_tensor *rn = fg_rms_norm(y, 1, NULL, -1);
    fg_tensor *in = fg_instance_norm(y, NULL, NULL, NULL, NULL, true, 0.1, 1e-5);
    fg_tensor *ms = fg_mse_loss(y, fg_cast(y32, FG_BF16), FG_REDUCTION_MEAN);
    CHECK(bn && fg_tensor_dtype(bn) == FG_F32 && gn && fg_tensor_dtype(gn) == FG_F32);
    CHECK(rn && fg_tensor_dtype(rn) == FG_F32 && in && fg_tensor_dtype(in) == FG_F32);
    CHECK(ms && fg_tensor_dtype(ms) == FG_F32 && fg_item(ms) < 1e-3);
    CHECK_OK(fg_autocast_set(prev, NULL));
    fg_step_reset();
    fg_tensor_free(x);
    fg_tensor_free(w);
    fg_tensor_free(wt);
}
