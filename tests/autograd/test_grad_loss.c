/* The losses by finite differences in f64 (tests/gradcheck.h): mse, l1,
 * smooth_l1, huber, binary_cross_entropy (with weight),
 * binary_cross_entropy_with_logits (weight, pos_weight), kl_div (both
 * target forms), nll_loss and cross_entropy_ex (class weights,
 * ignore_index, label smoothing, (N, C, d) inputs), every reduction,
 * gradients into the input and, where it requires grad, the target. Then
 * values against a naive loop and the errors. */
#include "gradcheck.h"

static void req(fg_tensor **t, int n) {
    for (int i = 0; i < n; i++) fg_tensor_set_requires_grad(t[i], true);
}

#define GC(what, f, in, nin, arg) gradcheck(what, f, in, nin, arg, 1e-6, 1e-8)

typedef struct {
    int kind;
    fg_reduction red;
    double p;
    fg_tensor *w, *pw;
} pl_arg;

static fg_tensor *f_pl(fg_tensor **in, void *arg) {
    pl_arg *a = arg;
    switch (a->kind) {
    case 0: return fg_mse_loss(in[0], in[1], a->red);
    case 1: return fg_l1_loss(in[0], in[1], a->red);
    case 2: return fg_smooth_l1_loss(in[0], in[1], a->red, a->p);
    case 3: return fg_huber_loss(in[0], in[1], a->red, a->p);
    case 4: return fg_binary_cross_entropy(in[0], in[1], a->w, a->red);
    case 5: return fg_binary_cross_entropy_with_logits(in[0], in[1], a->w, a->pw, a->red);
    default: return fg_kl_div(in[0], in[1], a->red, a->p != 0);
    }
}

/* keeps |x - t| away from 0 and from the kinks at p */
static void away(fg_tensor *x, fg_tensor *t, double p) {
    double *px = fg_tensor_data(x), *pt = fg_tensor_data(t);
    for (int64_t i = 0; i < fg_tensor_numel(x); i++) {
        double d = px[i] - pt[i];
        if (fabs(d) < 1e-3 || fabs(fabs(d) - p) < 1e-3) px[i] += 5e-3;
    }
}

TEST(regression_losses_gradients_into_input_and_target) {
    int64_t s[] = {3, 5, 2};
    fg_reduction reds[] = {FG_REDUCTION_MEAN, FG_REDUCTION_SUM, FG_REDUCTION_NONE};
    for (int kind = 0; kind < 4; kind++)
        for (int r = 0; r < 3; r++) {
            fg_tensor *in[2] = {gc_randn(3, s, 10 + kind, 1.5), gc_randn(3, s, 20 + r, 1)};
            double p = kind == 2 ? 0.6 : kind == 3 ? 0.8 : 0;
            away(in[0], in[1], p);
            req(in, 2);
            pl_arg a = {kind, reds[r], p, NULL, NULL};
            CHECK_MSG(GC("regression loss", f_pl, in, 2, &a) == 0, "kind %d red %d", kind, r);
            fg_tensor_free(in[0]);
            fg_tensor_free(in[1]);
        }
    /* values: huber and smooth_l1 at both sides of the kink */
    int64_t n = 4;
    double xv[] = {0.1, 2, -3, 0.5}, tv[] = {0, 0, 0, 0};
    fg_tensor *x = fg_from_data(FG_F64, 1, &n, xv), *t = fg_from_data(FG_F64, 1, &n, tv);
    fg_tensor *h = fg_huber_loss(x, t, FG_REDUCTION_NONE, 1);
    CHECK(h != NULL);
    CHECK_CLOSE(fg_tensor_get(h, 0), 0.5 * 0.1 * 0.1, 1e-15, 0);
    CHECK(fg_tensor_get(h, 1) == 1.5 && fg_tensor_get(h, 2) == 2.5);
    fg_tensor *sl = fg_smooth_l1_loss(x, t, FG_REDUCTION_SUM, 0.5);
    CHECK_CLOSE(fg_item(sl), 0.5 * 0.01 / 0.5 + 1.75 + 2.75 + 0.25, 1e-15, 1e-15);
    CHECK_CLOSE(fg_item(fg_smooth_l1_loss(x, t, FG_REDUCTION_MEAN, 0)), 5.6 / 4, 1e-15, 1e-15);
    CHECK_CLOSE(fg_item(fg_mse_loss(x, t, FG_REDUCTION_MEAN)), (0.01 + 4 + 9 + 0.25) / 4, 1e-15, 0);
    /* errors */
    fg_tensor *x3 = fg_zeros(FG_F64, 1, (int64_t[]){3});
    CHECK(fg_mse_loss(x, x3, FG_REDUCTION_MEAN) == NULL);
    CHECK_CONTAINS(fg_last_error(), "one shape and dtype");
    CHECK(fg_mse_loss(x, t, FG_REDUCTION_BATCHMEAN) == NULL);
    CHECK(fg_huber_loss(x, t, FG_REDUCTION_SUM, 0) == NULL);
    CHECK(fg_l1_loss(x, t, (fg_reduction)9) == NULL);
    fg_step_reset();
}

TEST(binary_cross_entropy_gradients_weights_pos_weight) {
    int64_t s[] = {4, 3}, s3[] = {3};
    fg_reduction reds[] = {FG_REDUCTION_MEAN, FG_REDUCTION_SUM, FG_REDUCTION_NONE};
    fg_tensor *w = gc_randn(1, s3, 5, 0.3), *pw = gc_randn(1, s3, 6, 0.5);
    for (int i = 0; i < 3; i++) {
        ((double *)fg_tensor_data(w))[i] += 1;
        ((double *)fg_tensor_data(pw))[i] = fabs(((double *)fg_tensor_data(pw))[i]) + 0.5;
    }
    for (int r = 0; r < 3; r++) {
        fg_tensor *in[2] = {gc_randn(2, s, 30 + r, 1), gc_randn(2, s, 40 + r, 1)};
        double *px = fg_tensor_data(in[0]), *pt = fg_tensor_data(in[1]);
        for (int i = 0; i < 12; i++) {
            px[i] = 0.1 + 0.8 / (1 + exp(-px[i])); /* probabilities well inside (0, 1) */
            pt[i] = 1 / (1 + exp(-pt[i]));
        }
        req(in, 2);
        pl_arg a = {4, reds[r], 0, NULL, NULL};
        CHECK_MSG(GC("bce", f_pl, in, 2, &a) == 0, "bce red %d", r);
        a.w = w;
        CHECK_MSG(GC("bce weight", f_pl, in, 2, &a) == 0, "bce weight red %d", r);
        for (int i = 0; i < 12; i++) px[i] = 4 * (px[i] - 0.5); /* logits */
        a.kind = 5;
        a.w = NULL;
        CHECK_MSG(GC("bce logits", f_pl, in, 2, &a) == 0, "bcel red %d", r);
        a.w = w;
        a.pw = pw;
        CHECK_MSG(GC("bce logits pos_weight", f_pl, in, 2, &a) == 0, "bcel pw red %d", r);
        /* value: element 4 of the none form */
        if (reds[r] == FG_REDUCTION_NONE) {
            fg_tensor *y = f_pl(in, &a);
            double x = px[4], t = pt[4], q = fg_tensor_get(pw, 1), ww = fg_tensor_get(w, 1);
            double want =
                ww * -(q * t * log(1 / (1 + exp(-x))) + (1 - t) * log(1 - 1 / (1 + exp(-x))));
            CHECK_CLOSE(fg_tensor_get(y, 4), want, 1e-13, 1e-14);
        }
        fg_tensor_free(in[0]);
        fg_tensor_free(in[1]);
    }
    /* bce clamps its logs at -100 */
    int64_t one = 1;
    fg_tensor *z = fg_zeros(FG_F64, 1, &one), *o = fg_full(FG_F64, 1, &one, 1);
    CHECK(fg_item(fg_binary_cross_entropy(z, o, NULL, FG_REDUCTION_SUM)) == 100);
    fg_step_reset();
    fg_tensor_free(w);
    fg_tensor_free(pw);
}

TEST(kl_div_gradients_both_target_forms) {
    int64_t s[] = {3, 4};
    fg_reduction reds[] = {FG_REDUCTION_MEAN, FG_REDUCTION_SUM, FG_REDUCTION_NONE,
                           FG_REDUCTION_BATCHMEAN};
    for (int r = 0; r < 4; r++)
        for (int lt = 0; lt < 2; lt++) {
            fg_tensor *in[2] = {gc_randn(2, s, 50 + r, 1), gc_randn(2, s, 60 + r, 1)};
            double *pt = fg_tensor_data(in[1]);
            if (!lt)
                for (int i = 0; i < 12; i++) pt[i] = 0.05 + fabs(pt[i]); /* t > 0 */
            req(in, 2);
            pl_arg a = {6, reds[r], lt, NULL, NULL};
            CHECK_MSG(GC("kl_div", f_pl, in, 2, &a) == 0, "red %d log_target %d", r, lt);
            fg_tensor_free(in[0]);
            fg_tensor_free(in[1]);
        }
    /* batchmean: the sum over the batch size; 0 log 0 = 0 */
    int64_t n = 2;
    double xv[] = {-1, -2}, tv[] = {0.5, 0};
    fg_tensor *x = fg_from_data(FG_F64, 1, &n, xv), *t = fg_from_data(FG_F64, 1, &n, tv);
    CHECK_CLOSE(fg_item(fg_kl_div(x, t, FG_REDUCTION_BATCHMEAN, false)), 0.5 * (log(0.5) + 1) / 2,
                1e-15, 1e-15);
    fg_step_reset();
}

typedef struct {
    fg_tensor *t;
    fg_class_loss_opts o;
    bool ce;
} cl_arg;

static fg_tensor *f_cl(fg_tensor **in, void *arg) {
    cl_arg *a = arg;
    return a->ce ? fg_cross_entropy_ex(in[0], a->t, &a->o) : fg_nll_loss(in[0], a->t, &a->o);
}

TEST(nll_and_cross_entropy_gradients_weights_ignore_smoothing) {
    int64_t s2[] = {7, 5}, s3[] = {3, 5, 4}, n7 = 7, t34[] = {3, 4}, c5 = 5;
    int32_t tv[] = {0, 4, 2, -100, 2, 1, 3}, tv3[12] = {0, 1, 2, 3, 4, 2, 2, 1, 0, 4, 4, 3};
    fg_tensor *t = fg_tensor_new(FG_I32, 1, &n7), *t3 = fg_tensor_new(FG_I32, 2, t34);
    memcpy(fg_tensor_data(t), tv, sizeof tv);
    memcpy(fg_tensor_data(t3), tv3, sizeof tv3);
    fg_tensor *w = gc_randn(1, &c5, 3, 0.3);
    for (int i = 0; i < 5; i++) ((double *)fg_tensor_data(w))[i] += 1;
    fg_tensor *x = gc_randn(2, s2, 70, 1.5), *x3 = gc_randn(3, s3, 71, 1.5);
    req(&x, 1);
    req(&x3, 1);
    fg_reduction reds[] = {FG_REDUCTION_MEAN, FG_REDUCTION_SUM, FG_REDUCTION_NONE};
    for (int r = 0; r < 3; r++)
        for (int mode = 0; mode < 8; mode++) {
            cl_arg a = {t, fg_class_loss_defaults(), mode & 1};
            a.o.reduction = reds[r];
            if (mode & 2) a.o.weight = w;
            if (mode & 4) a.o.label_smoothing = a.ce ? 0.2 : 0;
            CHECK_MSG(GC("class loss (7, 5)", f_cl, &x, 1, &a) == 0, "red %d mode %d", r, mode);
            a.t = t3;
            a.o.ignore_index = 2;
            CHECK_MSG(GC("class loss (3, 5, 4)", f_cl, &x3, 1, &a) == 0, "3d red %d mode %d", r,
                      mode);
        }
    /* values: weighted mean nll = sum -w[t] x[t] / sum w[t] over the counted rows */
    cl_arg a = {t, fg_class_loss_defaults(), false};
    a.o.weight = w;
    double num = 0, den = 0;
    for (int i = 0; i < 7; i++) {
        if (tv[i] == -100) continue;
        num -= fg_tensor_get(w, tv[i]) * fg_tensor_get(x, i * 5 + tv[i]);
        den += fg_tensor_get(w, tv[i]);
    }
    CHECK_CLOSE(fg_item(f_cl(&x, &a)), num / den, 1e-14, 1e-15);
    /* label smoothing: (1 - e) nll + e / C * -sum log p, mean over counted rows */
    a.ce = true;
    a.o.weight = NULL;
    a.o.label_smoothing = 0.3;
    double want = 0;
    for (int i = 0; i < 7; i++) {
        if (tv[i] == -100) continue;
        double z = 0, sl = 0;
        for (int j = 0; j < 5; j++) z += exp(fg_tensor_get(x, i * 5 + j));
        for (int j = 0; j < 5; j++) sl += fg_tensor_get(x, i * 5 + j) - log(z);
        want += 0.7 * (log(z) - fg_tensor_get(x, i * 5 + tv[i])) - 0.3 / 5 * sl;
    }
    CHECK_CLOSE(fg_item(f_cl(&x, &a)), want / 6, 1e-13, 1e-14);
    /* every target ignored: 0 */
    a.o.ignore_index = 2;
    a.t = fg_full(FG_I32, 1, &n7, 2);
    CHECK(fg_item(f_cl(&x, &a)) == 0);
    /* errors */
    a.o.weight = fg_zeros(FG_F64, 1, (int64_t[]){4});
    a.t = t;
    CHECK(f_cl(&x, &a) == NULL);
    CHECK_CONTAINS(fg_last_error(), "class weights");
    fg_step_reset();
    fg_tensor_free(t);
    fg_tensor_free(t3);
    fg_tensor_free(w);
    fg_tensor_free(x);
    fg_tensor_free(x3);
}
