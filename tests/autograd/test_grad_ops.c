/* The differentiable functions other than matmul/linear/attention, by
 * finite differences in f64 (tests/gradcheck.h), several shapes each: sum,
 * mean, sum_dim and mean_dim (every dim, keepdim both ways), reshape,
 * transpose, relu, gelu, softmax, log_softmax, cross_entropy (ignore_index,
 * all ignored, 1-d logits), layer_norm (weight and bias each optional),
 * embedding (repeated indices), dropout (a fixed seed makes it a fixed
 * linear map), and chains of them (layer_norm -> gelu -> mean; a tiny
 * embedding -> layer_norm -> linear -> cross_entropy language model).
 * Then the forward contracts: output shapes, reshape as a view, dropout with
 * p = 0 returning its input, NULL propagation and the errors. */
#include "gradcheck.h"

static void req(fg_tensor **t, int n) {
    for (int i = 0; i < n; i++) fg_tensor_set_requires_grad(t[i], true);
}
static void free_all(fg_tensor **t, int n) {
    for (int i = 0; i < n; i++) fg_tensor_free(t[i]);
}

/* A persistent i32 tensor with the given values. */
static fg_tensor *ints(int nd, const int64_t *shape, const int32_t *v) {
    fg_tensor *t = fg_tensor_new(FG_I32, nd, shape);
    memcpy(fg_tensor_data(t), v, fg_tensor_nbytes(t));
    return t;
}

#define GC(what, f, in, nin, arg) gradcheck(what, f, in, nin, arg, 1e-6, 1e-8)

/* ------------------------------------------------------------------ reductions */

static fg_tensor *f_sum(fg_tensor **in, void *arg) {
    (void)arg;
    return fg_sum(in[0]);
}
static fg_tensor *f_mean(fg_tensor **in, void *arg) {
    (void)arg;
    return fg_mean(in[0]);
}

typedef struct {
    int dim;
    bool keepdim;
} dim_arg;

static fg_tensor *f_sum_dim(fg_tensor **in, void *arg) {
    dim_arg *a = arg;
    return fg_sum_dim(in[0], a->dim, a->keepdim);
}
static fg_tensor *f_mean_dim(fg_tensor **in, void *arg) {
    dim_arg *a = arg;
    return fg_mean_dim(in[0], a->dim, a->keepdim);
}

TEST(sum_and_mean_gradients) {
    struct {
        int nd;
        int64_t s[3];
    } cases[] = {{2, {3, 4}}, {1, {5}}, {0, {0}}, {3, {2, 3, 4}}};
    for (int c = 0; c < 4; c++) {
        fg_tensor *x = gc_randn(cases[c].nd, cases[c].s, 1 + c, 1);
        req(&x, 1);
        CHECK_MSG(GC("sum", f_sum, &x, 1, NULL) == 0, "sum case %d", c);
        CHECK_MSG(GC("mean", f_mean, &x, 1, NULL) == 0, "mean case %d", c);
        fg_tensor_free(x);
    }
}

TEST(sum_dim_and_mean_dim_gradients_every_dim_keepdim_both_ways) {
    int64_t s[] = {3, 4, 5};
    fg_tensor *x = gc_randn(3, s, 7, 1);
    req(&x, 1);
    for (int dim = -3; dim < 3; dim++)
        for (int k = 0; k < 2; k++) {
            dim_arg a = {dim, k};
            CHECK_MSG(GC("sum_dim", f_sum_dim, &x, 1, &a) == 0, "sum_dim %d keepdim %d", dim, k);
            CHECK_MSG(GC("mean_dim", f_mean_dim, &x, 1, &a) == 0, "mean_dim %d keepdim %d", dim, k);
        }
    int64_t s1[] = {6};
    fg_tensor *v = gc_randn(1, s1, 8, 1);
    req(&v, 1);
    dim_arg a = {0, false};
    CHECK(GC("sum_dim 1-d", f_sum_dim, &v, 1, &a) == 0);
    a.keepdim = true;
    CHECK(GC("mean_dim 1-d keepdim", f_mean_dim, &v, 1, &a) == 0);
    /* output shapes as PyTorch's */
    fg_tensor *y = fg_sum_dim(x, 1, true);
    CHECK(y && fg_tensor_ndim(y) == 3 && fg_tensor_dim(y, 0) == 3 && fg_tensor_dim(y, 1) == 1 &&
          fg_tensor_dim(y, 2) == 5);
    y = fg_mean_dim(x, -1, false);
    CHECK(y && fg_tensor_ndim(y) == 2 && fg_tensor_dim(y, 1) == 4);
    CHECK_CLOSE(fg_tensor_get(y, 0),
                (fg_tensor_get(x, 0) + fg_tensor_get(x, 1) + fg_tensor_get(x, 2) +
                 fg_tensor_get(x, 3) + fg_tensor_get(x, 4)) /
                    5,
                1e-14, 1e-14);
    y = fg_sum_dim(v, 0, false);
    CHECK(y && fg_tensor_ndim(y) == 0);
    CHECK(fg_sum_dim(x, 3, false) == NULL);
    CHECK_CONTAINS(fg_last_error(), "dim 3 is out of range");
    CHECK(fg_mean_dim(x, -4, true) == NULL);
    fg_step_reset();
    fg_tensor_free(x);
    fg_tensor_free(v);
}

/* ------------------------------------------------------------------ shapes */

typedef struct {
    int nd;
    int64_t s[4];
} shape_arg;

static fg_tensor *f_reshape(fg_tensor **in, void *arg) {
    shape_arg *a = arg;
    return fg_reshape(in[0], a->nd, a->s);
}

typedef struct {
    int d0, d1;
} tr_arg;

static fg_tensor *f_transpose(fg_tensor **in, void *arg) {
    tr_arg *a = arg;
    return fg_transpose(in[0], a->d0, a->d1);
}

/* transpose, then reshape (a view of the copy), then a product that
 * weighs every element differently */
static fg_tensor *f_shape_chain(fg_tensor **in, void *arg) {
    (void)arg;
    fg_tensor *t = fg_transpose(in[0], 0, 2);                  /* (4, 3, 2) */
    fg_tensor *r = fg_reshape(t, 2, (int64_t[]){-1, 6});       /* (4, 6) */
    return fg_mul(r, fg_reshape(in[1], 2, (int64_t[]){4, 6})); /* (4, 6) */
}

TEST(reshape_and_transpose_gradients) {
    int64_t s[] = {2, 3, 4};
    fg_tensor *x = gc_randn(3, s, 3, 1);
    req(&x, 1);
    shape_arg ra[] = {{2, {6, 4}}, {1, {-1}}, {4, {2, 1, 3, 4}}, {3, {4, -1, 2}}};
    for (int i = 0; i < 4; i++)
        CHECK_MSG(GC("reshape", f_reshape, &x, 1, &ra[i]) == 0, "reshape %d", i);
    tr_arg ta[] = {{0, 2}, {-1, -2}, {1, 1}, {2, 0}};
    for (int i = 0; i < 4; i++)
        CHECK_MSG(GC("transpose", f_transpose, &x, 1, &ta[i]) == 0, "transpose %d", i);
    int64_t s24[] = {24};
    fg_tensor *in[2] = {x, gc_randn(1, s24, 4, 1)};
    req(in, 2);
    CHECK(GC("transpose -> reshape -> mul", f_shape_chain, in, 2, NULL) == 0);

    /* reshape of a contiguous tensor is a view; transpose a contiguous copy */
    fg_tensor *y = fg_reshape(x, 2, (int64_t[]){4, 6});
    CHECK(y && fg_tensor_data(y) == fg_tensor_data(x) && fg_tensor_requires_grad(y));
    fg_tensor *t = fg_transpose(x, 0, 2);
    CHECK(t && fg_tensor_is_contiguous(t) && fg_tensor_dim(t, 0) == 4 && fg_tensor_dim(t, 2) == 2);
    CHECK(fg_tensor_get(t, 1 * 6 + 2 * 2 + 1) == fg_tensor_get(x, 1 * 12 + 2 * 4 + 1));
    /* a non-contiguous input is copied first (values in logical order) */
    fg_tensor *v = fg_tensor_transpose_view(x, 0, 1);
    fg_tensor *vr = fg_reshape(v, 1, (int64_t[]){-1});
    CHECK(vr && fg_tensor_get(vr, 4) == fg_tensor_get(x, 1 * 12 + 0 * 4 + 0));
    CHECK(fg_reshape(x, 2, (int64_t[]){5, 5}) == NULL);
    CHECK_CONTAINS(fg_last_error(), "cannot view");
    CHECK(fg_transpose(x, 0, 3) == NULL);
    CHECK_CONTAINS(fg_last_error(), "out of range");
    fg_step_reset();
    free_all(in, 2);
}

TEST(transpose_copies_in_logical_order_any_dtype) {
    /* odd sizes past the copy's 16 x 16 tiles, every pair of dims */
    int64_t s[] = {37, 19, 23};
    fg_dtype dts[] = {FG_F64, FG_F32, FG_U16, FG_U8, FG_I64};
    for (int k = 0; k < 5; k++) {
        fg_tensor *x = fg_empty(dts[k], 3, s);
        for (int64_t i = 0; i < fg_tensor_numel(x); i++) {
            double v = (double)(i % 251);
            CHECK_OK(fg_convert((char *)fg_tensor_data(x) + i * (int64_t)fg_dtype_size(dts[k]),
                                dts[k], &v, FG_F64, 1));
        }
        for (int d0 = 0; d0 < 3; d0++)
            for (int d1 = 0; d1 < 3; d1++) {
                fg_tensor *v = fg_tensor_transpose_view(x, d0, d1), *y = fg_transpose(x, d0, d1);
                CHECK(y && fg_tensor_is_contiguous(y) && fg_tensor_same_shape(v, y));
                int bad = 0;
                for (int64_t i = 0; i < fg_tensor_numel(y); i++)
                    bad += fg_tensor_get(y, i) != fg_tensor_get(v, i);
                CHECK_MSG(bad == 0, "%s transpose %d %d: %d wrong", fg_dtype_name(dts[k]), d0, d1,
                          bad);
                /* strided into strided: back through the view */
                fg_tensor *z = fg_zeros_like(x);
                CHECK_OK(fg_tensor_copy(fg_tensor_transpose_view(z, d0, d1), v));
                CHECK(memcmp(fg_tensor_data(z), fg_tensor_data(x), fg_tensor_nbytes(x)) == 0);
            }
        fg_step_reset();
    }
}

/* ------------------------------------------------------------------ activations */

static fg_tensor *f_relu(fg_tensor **in, void *arg) {
    (void)arg;
    return fg_relu(in[0]);
}
static fg_tensor *f_gelu(fg_tensor **in, void *arg) {
    (void)arg;
    return fg_gelu(in[0]);
}
static fg_tensor *f_softmax(fg_tensor **in, void *arg) {
    (void)arg;
    return fg_softmax(in[0]);
}
static fg_tensor *f_log_softmax(fg_tensor **in, void *arg) {
    (void)arg;
    return fg_log_softmax(in[0]);
}

TEST(activation_and_softmax_gradients) {
    struct {
        int nd;
        int64_t s[3];
    } cases[] = {{2, {4, 7}}, {1, {5}}, {3, {2, 3, 6}}, {2, {3, 1}}, {0, {0}}};
    for (int c = 0; c < 5; c++) {
        fg_tensor *x = gc_randn(cases[c].nd, cases[c].s, 20 + c, 2);
        req(&x, 1);
        CHECK_MSG(GC("relu", f_relu, &x, 1, NULL) == 0, "relu case %d", c);
        CHECK_MSG(GC("gelu", f_gelu, &x, 1, NULL) == 0, "gelu case %d", c);
        CHECK_MSG(GC("softmax", f_softmax, &x, 1, NULL) == 0, "softmax case %d", c);
        CHECK_MSG(GC("log_softmax", f_log_softmax, &x, 1, NULL) == 0, "log_softmax case %d", c);
        fg_tensor_free(x);
    }
}

/* ------------------------------------------------------------------ cross-entropy */

typedef struct {
    fg_tensor *targets;
    int64_t ignore;
} ce_arg;

static fg_tensor *f_ce(fg_tensor **in, void *arg) {
    ce_arg *a = arg;
    return fg_cross_entropy(in[0], a->targets, a->ignore);
}

TEST(cross_entropy_gradients_with_ignore_index) {
    int64_t s2[] = {6, 5}, n6 = 6;
    int32_t t6[] = {0, 4, -100, 2, 2, -100};
    fg_tensor *x = gc_randn(2, s2, 30, 2), *t = ints(1, &n6, t6);
    req(&x, 1);
    ce_arg a = {t, -100};
    CHECK(GC("cross_entropy (6, 5)", f_ce, &x, 1, &a) == 0);
    /* the loss: mean over the 4 counted rows */
    fg_tensor *loss = fg_cross_entropy(x, t, -100);
    double want = 0;
    for (int i = 0; i < 6; i++) {
        if (t6[i] == -100) continue;
        double z = 0;
        for (int j = 0; j < 5; j++) z += exp(fg_tensor_get(x, i * 5 + j));
        want += log(z) - fg_tensor_get(x, i * 5 + t6[i]);
    }
    CHECK(loss && fg_tensor_ndim(loss) == 0);
    CHECK_CLOSE(fg_item(loss), want / 4, 1e-13, 1e-13);
    fg_step_reset();

    /* (2, 3, 4) logits with (2, 3) targets; ignore_index 1 (a real class) */
    int64_t s3[] = {2, 3, 4}, ts[] = {2, 3};
    int32_t t23[] = {1, 3, 0, 2, 1, 3};
    fg_tensor *x3 = gc_randn(3, s3, 31, 1), *tt = ints(2, ts, t23);
    req(&x3, 1);
    ce_arg a3 = {tt, 1};
    CHECK(GC("cross_entropy (2, 3, 4)", f_ce, &x3, 1, &a3) == 0);

    /* every row ignored: loss 0, gradient 0 */
    ce_arg ai = {tt, 7};
    int32_t all7[] = {7, 7, 7, 7, 7, 7};
    memcpy(fg_tensor_data(tt), all7, sizeof all7);
    CHECK(GC("cross_entropy all ignored", f_ce, &x3, 1, &ai) == 0);
    loss = fg_cross_entropy(x3, tt, 7);
    CHECK(loss && fg_item(loss) == 0);
    fg_step_reset();

    /* 1-d logits (V) with a 0-d target */
    int64_t s1[] = {7};
    int32_t t0[] = {3};
    fg_tensor *x1 = gc_randn(1, s1, 32, 1), *t1 = ints(0, NULL, t0);
    req(&x1, 1);
    ce_arg a1 = {t1, -100};
    CHECK(GC("cross_entropy (7)", f_ce, &x1, 1, &a1) == 0);

    /* errors: shapes, dtype, a bad target named */
    CHECK(fg_cross_entropy(x, tt, -100) == NULL);
    CHECK_CONTAINS(fg_last_error(), "same leading dims");
    CHECK(fg_cross_entropy(x, x, -100) == NULL);
    CHECK(fg_cross_entropy(x, NULL, -100) == NULL);
    t6[1] = 5;
    memcpy(fg_tensor_data(t), t6, sizeof t6);
    CHECK(fg_cross_entropy(x, t, -100) == NULL);
    CHECK_CONTAINS(fg_last_error(), "target 5 at row 1");
    fg_step_reset();
    fg_tensor *all[] = {x, t, x3, tt, x1, t1};
    free_all(all, 6);
}

/* ------------------------------------------------------------------ layer_norm */

static fg_tensor *f_ln(fg_tensor **in, void *arg) {
    int mode = *(int *)arg; /* bit 0: weight, bit 1: bias */
    return fg_layer_norm(in[0], mode & 1 ? in[1] : NULL, mode & 2 ? in[2] : NULL, 1e-5);
}

TEST(layer_norm_gradients_weight_and_bias_optional) {
    struct {
        int nd;
        int64_t s[3];
    } cases[] = {{2, {4, 6}}, {3, {2, 3, 5}}, {1, {7}}, {2, {3, 1}}};
    for (int c = 0; c < 4; c++) {
        int64_t C = cases[c].s[cases[c].nd - 1];
        fg_tensor *in[3] = {gc_randn(cases[c].nd, cases[c].s, 40 + c, 1.5), gc_randn(1, &C, 41, 1),
                            gc_randn(1, &C, 42, 1)};
        req(in, 3);
        for (int mode = 0; mode < 4; mode++)
            CHECK_MSG(GC("layer_norm", f_ln, in, 3, &mode) == 0, "layer_norm case %d mode %d", c,
                      mode);
        /* x alone requiring grad; then the weight alone */
        fg_tensor_set_requires_grad(in[1], false);
        fg_tensor_set_requires_grad(in[2], false);
        int mode = 3;
        CHECK_MSG(GC("layer_norm x only", f_ln, in, 3, &mode) == 0, "case %d x only", c);
        fg_tensor_set_requires_grad(in[0], false);
        fg_tensor_set_requires_grad(in[1], true);
        CHECK_MSG(GC("layer_norm w only", f_ln, in, 3, &mode) == 0, "case %d w only", c);
        free_all(in, 3);
    }
    int64_t s[] = {2, 4}, c3 = 3;
    fg_tensor *x = gc_randn(2, s, 1, 1), *w = gc_randn(1, &c3, 2, 1);
    CHECK(fg_layer_norm(x, w, NULL, 1e-5) == NULL);
    CHECK_CONTAINS(fg_last_error(), "weight f64[3]");
    CHECK(fg_layer_norm(x, NULL, NULL, -1) == NULL);
    fg_tensor_free(x);
    fg_tensor_free(w);
}

/* ------------------------------------------------------------------ embedding */

static fg_tensor *f_emb(fg_tensor **in, void *arg) { return fg_embedding(arg, in[0]); }

TEST(embedding_gradients_with_repeated_indices) {
    int64_t ws[] = {5, 4}, is[] = {2, 3}, n4 = 4;
    int32_t iv[] = {1, 3, 1, 0, 4, 1}, iv1[] = {2, 2, 0, 4};
    fg_tensor *w = gc_randn(2, ws, 50, 1), *idx = ints(2, is, iv), *idx1 = ints(1, &n4, iv1);
    req(&w, 1);
    CHECK(GC("embedding (2, 3) idx", f_emb, &w, 1, idx) == 0);
    CHECK(GC("embedding (4) idx", f_emb, &w, 1, idx1) == 0);
    fg_tensor *y = fg_embedding(idx, w);
    CHECK(y && fg_tensor_ndim(y) == 3 && fg_tensor_dim(y, 1) == 3 && fg_tensor_dim(y, 2) == 4);
    CHECK(fg_tensor_get(y, 4 * 4 + 2) == fg_tensor_get(w, 4 * 4 + 2));
    iv[2] = 5;
    memcpy(fg_tensor_data(idx), iv, sizeof iv);
    CHECK(fg_embedding(idx, w) == NULL);
    CHECK_CONTAINS(fg_last_error(), "index 5 at position 2");
    CHECK_CONTAINS(fg_last_error(), "vocabulary of 5");
    CHECK(fg_embedding(w, w) == NULL);
    CHECK(fg_embedding(NULL, w) == NULL);
    fg_step_reset();
    fg_tensor *all[] = {w, idx, idx1};
    free_all(all, 3);
}

/* ------------------------------------------------------------------ dropout */

static fg_tensor *f_dropout(fg_tensor **in, void *arg) {
    return fg_dropout(in[0], *(double *)arg, 1234, 17);
}

TEST(dropout_gradients_and_contract) {
    int64_t s[] = {7, 9};
    fg_tensor *x = gc_randn(2, s, 60, 1);
    req(&x, 1);
    double ps[] = {0.3, 0.9};
    for (int i = 0; i < 2; i++)
        CHECK_MSG(GC("dropout", f_dropout, &x, 1, &ps[i]) == 0, "p %g", ps[i]);
    CHECK(fg_dropout(x, 0.0, 1, 0) == x);
    CHECK(fg_dropout(x, 1.0, 1, 0) == NULL);
    CHECK_CONTAINS(fg_last_error(), "p = 1");
    CHECK(fg_dropout(x, -0.1, 1, 0) == NULL);
    CHECK(fg_dropout(x, NAN, 1, 0) == NULL);
    /* same seed and offset, same output; the gradient is the same mask */
    fg_tensor *a = fg_dropout(x, 0.5, 9, 100), *b = fg_dropout(x, 0.5, 9, 100);
    CHECK(a && b && memcmp(fg_tensor_data(a), fg_tensor_data(b), fg_tensor_nbytes(a)) == 0);
    fg_step_reset();
    fg_tensor_free(x);
}

/* ------------------------------------------------------------------ chains */

static fg_tensor *f_ln_gelu_mean(fg_tensor **in, void *arg) {
    (void)arg;
    return fg_mean(fg_gelu(fg_layer_norm(in[0], in[1], in[2], 1e-5)));
}

/* a tiny language model: embedding -> layer_norm -> linear -> cross_entropy,
 * plus dropout and a softmax side branch summed in */
static fg_tensor *f_tiny_lm(fg_tensor **in, void *arg) {
    fg_tensor **ints_ = arg;                                  /* idx (2, 3), targets (2, 3) */
    fg_tensor *h = fg_embedding(ints_[0], in[0]);             /* (2, 3, 4) */
    h = fg_layer_norm(h, in[1], in[2], 1e-5);                 /* (2, 3, 4) */
    h = fg_dropout(fg_gelu(h), 0.25, 77, 0);                  /* (2, 3, 4) */
    fg_tensor *logits = fg_linear(h, in[3], NULL);            /* (2, 3, 5) */
    fg_tensor *ce = fg_cross_entropy(logits, ints_[1], -100); /* () */
    fg_tensor *side = fg_mean(fg_sum_dim(fg_softmax(fg_transpose(logits, 1, 2)), 1, false));
    return fg_add(ce, fg_scale(side, 0.5));
}

TEST(chains_of_ops_have_the_right_gradients) {
    int64_t s[] = {3, 5}, c5 = 5;
    fg_tensor *in[3] = {gc_randn(2, s, 70, 1), gc_randn(1, &c5, 71, 1), gc_randn(1, &c5, 72, 1)};
    req(in, 3);
    CHECK(GC("layer_norm -> gelu -> mean", f_ln_gelu_mean, in, 3, NULL) == 0);
    free_all(in, 3);

    int64_t ws[] = {6, 4}, c4 = 4, ls[] = {5, 4}, is[] = {2, 3};
    int32_t iv[] = {0, 5, 2, 2, 1, 3}, tv[] = {4, -100, 0, 1, 1, 3};
    fg_tensor *p[4] = {gc_randn(2, ws, 80, 1), gc_randn(1, &c4, 81, 1), gc_randn(1, &c4, 82, 1),
                       gc_randn(2, ls, 83, 1)};
    req(p, 4);
    fg_tensor *ix[2] = {ints(2, is, iv), ints(2, is, tv)};
    CHECK(GC("tiny language model", f_tiny_lm, p, 4, ix) == 0);
    free_all(p, 4);
    free_all(ix, 2);
}

/* ------------------------------------------------------------------ contracts */

TEST(null_inputs_propagate_and_dtypes_are_checked) {
    CHECK(fg_sum(NULL) == NULL && fg_mean(NULL) == NULL && fg_relu(NULL) == NULL);
    CHECK(fg_gelu(NULL) == NULL && fg_softmax(NULL) == NULL && fg_log_softmax(NULL) == NULL);
    CHECK(fg_sum_dim(NULL, 0, false) == NULL && fg_mean_dim(NULL, 0, true) == NULL);
    CHECK(fg_reshape(NULL, 1, (int64_t[]){1}) == NULL && fg_transpose(NULL, 0, 1) == NULL);
    CHECK(fg_cross_entropy(NULL, NULL, -100) == NULL && fg_layer_norm(NULL, NULL, NULL, 1) == NULL);
    CHECK(fg_embedding(NULL, NULL) == NULL && fg_dropout(NULL, 0.5, 0, 0) == NULL);
    fg_error(FG_EINVAL, "the first failure");
    CHECK(fg_relu(fg_gelu(NULL)) == NULL);
    CHECK_CONTAINS(fg_last_error(), "the first failure");
    int64_t s[] = {3};
    fg_tensor *i = fg_zeros(FG_I32, 1, s);
    CHECK(fg_relu(i) == NULL);
    CHECK_CONTAINS(fg_last_error(), "i32");
    /* i32 tensors reshape (targets do) */
    fg_tensor *r = fg_reshape(i, 2, (int64_t[]){1, 3});
    CHECK(r && fg_tensor_dtype(r) == FG_I32 && fg_tensor_dim(r, 1) == 3);
    /* no-grad mode records nothing */
    fg_tensor *x = fg_tensor_new(FG_F32, 1, s);
    fg_tensor_set_requires_grad(x, true);
    bool prev = fg_set_grad_enabled(false);
    fg_tensor *y = fg_mean(fg_gelu(fg_layer_norm(x, NULL, NULL, 1e-5)));
    CHECK(y && !fg_tensor_requires_grad(y) && fg_tape_size() == 0);
    fg_set_grad_enabled(prev);
    fg_step_reset();
    fg_tensor_free(x);
}

TEST(f32_forward_values_through_autograd) {
    int64_t s[] = {2, 3};
    float xv[6] = {-1, 0.5f, 2, 3, -4, 0};
    fg_tensor *x = fg_from_data(FG_F32, 2, s, xv);
    fg_tensor *y = fg_relu(x);
    for (int i = 0; i < 6; i++) CHECK(fg_tensor_get(y, i) == (xv[i] > 0 ? xv[i] : 0));
    y = fg_softmax(x);
    double z = exp(-1) + exp(0.5) + exp(2);
    CHECK_CLOSE(fg_tensor_get(y, 1), exp(0.5) / z, 1e-6, 1e-7);
    y = fg_sum(x);
    CHECK(fg_tensor_dtype(y) == FG_F32 && fg_item(y) == 0.5);
    y = fg_mean_dim(x, 0, false);
    CHECK(fg_tensor_get(y, 0) == 1.0 && fg_tensor_get(y, 1) == -1.75);
    fg_step_reset();
}
