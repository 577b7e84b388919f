/* matmul, linear and causal attention: gradients by finite differences in
 * f64 (every input, batched and shared-b products, linear with and without
 * bias on 1-d, 2-d and 3-d inputs, attention over several B, T, H including
 * T = 1, odd T and T across the kernel's row blocks), forward values in f32
 * against naive loops, accumulation across backward calls, and errors. */
#include "gradcheck.h"

static fg_tensor *f_matmul(fg_tensor **in, void *arg) {
    (void)arg;
    return fg_matmul(in[0], in[1]);
}
static fg_tensor *f_linear(fg_tensor **in, void *arg) {
    (void)arg;
    return fg_linear(in[0], in[1], in[2]);
}
static fg_tensor *f_linear_nobias(fg_tensor **in, void *arg) {
    (void)arg;
    return fg_linear(in[0], in[1], NULL);
}
static fg_tensor *f_attention(fg_tensor **in, void *arg) {
    return fg_causal_attention(in[0], *(int *)arg);
}
/* b seen through a transposed (non-contiguous) view: the forward copies
 * it, the gradient of a is unchanged */
static fg_tensor *f_matmul_bt(fg_tensor **in, void *arg) {
    (void)arg;
    return fg_matmul(in[0], fg_tensor_transpose_view(in[1], -1, -2));
}

static void all_require_grad(fg_tensor **t, int n) {
    for (int i = 0; i < n; i++) fg_tensor_set_requires_grad(t[i], true);
}
static void free_all(fg_tensor **t, int n) {
    for (int i = 0; i < n; i++) fg_tensor_free(t[i]);
}

TEST(matmul_gradients) {
    struct {
        int an, bn;
        int64_t as[4], bs[4];
        const char *what;
    } cases[] = {
        {2, 2, {3, 5}, {5, 4}, "2-d"},
        {2, 2, {1, 1}, {1, 7}, "1x1 @ 1x7"},
        {3, 3, {2, 3, 4}, {2, 4, 5}, "batched"},
        {4, 4, {2, 2, 3, 4}, {2, 2, 4, 3}, "two batch dims"},
        {3, 2, {3, 5, 2}, {2, 6}, "broadcast b (folded)"},
        {4, 2, {2, 3, 4, 5}, {5, 3}, "broadcast b, two batch dims"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        fg_tensor *in[2] = {gc_randn(cases[c].an, cases[c].as, 10 + c, 1),
                            gc_randn(cases[c].bn, cases[c].bs, 20 + c, 1)};
        all_require_grad(in, 2);
        CHECK_MSG(gradcheck(cases[c].what, f_matmul, in, 2, NULL, 1e-6, 1e-8) == 0, "matmul %s",
                  cases[c].what);
        fg_tensor_set_requires_grad(in[0], false); /* only b */
        CHECK_MSG(gradcheck(cases[c].what, f_matmul, in, 2, NULL, 1e-6, 1e-8) == 0,
                  "matmul %s, b only", cases[c].what);
        free_all(in, 2);
    }
    int64_t s[] = {4, 3}, s2[] = {2, 3};
    fg_tensor *in[2] = {gc_randn(2, s, 1, 1), gc_randn(2, s2, 2, 1)};
    fg_tensor_set_requires_grad(in[0], true);
    CHECK(gradcheck("a @ b^T view", f_matmul_bt, in, 2, NULL, 1e-6, 1e-8) == 0);
    free_all(in, 2);
}

TEST(linear_gradients) {
    struct {
        int xn;
        int64_t xs[4];
        int64_t out;
        const char *what;
    } cases[] = {
        {1, {5}, 3, "1-d x"},
        {2, {4, 5}, 3, "2-d x"},
        {3, {2, 3, 5}, 4, "3-d x"},
        {3, {1, 7, 1}, 2, "in = 1"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int64_t in_f = cases[c].xs[cases[c].xn - 1];
        int64_t ws[] = {cases[c].out, in_f}, bs[] = {cases[c].out};
        fg_tensor *in[3] = {gc_randn(cases[c].xn, cases[c].xs, 30 + c, 1),
                            gc_randn(2, ws, 40 + c, 1), gc_randn(1, bs, 50 + c, 1)};
        all_require_grad(in, 3);
        CHECK_MSG(gradcheck(cases[c].what, f_linear, in, 3, NULL, 1e-6, 1e-8) == 0, "linear %s",
                  cases[c].what);
        CHECK_MSG(gradcheck(cases[c].what, f_linear_nobias, in, 2, NULL, 1e-6, 1e-8) == 0,
                  "linear %s without bias", cases[c].what);
        fg_tensor_set_requires_grad(in[0], false); /* parameters only, as in training */
        CHECK_MSG(gradcheck(cases[c].what, f_linear, in, 3, NULL, 1e-6, 1e-8) == 0,
                  "linear %s, parameters only", cases[c].what);
        free_all(in, 3);
    }
}

TEST(causal_attention_gradients) {
    static const int64_t cases[][4] = {/* B, T, C, H */
                                       {1, 1, 4, 1}, {2, 1, 4, 2},  {1, 2, 2, 1}, {2, 5, 6, 3},
                                       {1, 7, 8, 2}, {1, 35, 4, 2}, {3, 4, 8, 4}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int64_t s[] = {cases[c][0], cases[c][1], 3 * cases[c][2]};
        int heads = (int)cases[c][3];
        fg_tensor *in[1] = {gc_randn(3, s, 60 + c, 1)};
        all_require_grad(in, 1);
        CHECK_MSG(gradcheck("attention", f_attention, in, 1, &heads, 1e-6, 1e-8) == 0,
                  "attention B %lld T %lld C %lld H %d", (long long)s[0], (long long)s[1],
                  (long long)cases[c][2], heads);
        free_all(in, 1);
    }
}

TEST(attention_forward_matches_unfused_ops) {
    /* the fused op equals q k^T scaled, masked, softmax, times v, per head */
    int64_t B = 2, T = 9, C = 8, H = 2, hs = C / H;
    int64_t s[] = {B, T, 3 * C};
    fg_tensor *qkv = gc_randn(3, s, 7, 1);
    fg_tensor *y = fg_causal_attention(qkv, (int)H);
    CHECK(y && fg_tensor_dim(y, 2) == C);
    double worst = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++) {
                double sc[16], m = -1e300, z = 0;
                for (int64_t j = 0; j <= t; j++) {
                    double acc = 0;
                    for (int64_t d = 0; d < hs; d++)
                        acc += fg_tensor_get(qkv, (b * T + t) * 3 * C + h * hs + d) *
                               fg_tensor_get(qkv, (b * T + j) * 3 * C + C + h * hs + d);
                    sc[j] = acc / sqrt((double)hs);
                    m = sc[j] > m ? sc[j] : m;
                }
                for (int64_t j = 0; j <= t; j++) z += exp(sc[j] - m);
                for (int64_t d = 0; d < hs; d++) {
                    double acc = 0;
                    for (int64_t j = 0; j <= t; j++)
                        acc += exp(sc[j] - m) / z *
                               fg_tensor_get(qkv, (b * T + j) * 3 * C + 2 * C + h * hs + d);
                    double e = fabs(acc - fg_tensor_get(y, (b * T + t) * C + h * hs + d));
                    worst = e > worst ? e : worst;
                }
            }
    CHECK(worst < 1e-12);
    fg_tensor_free(qkv);
    fg_step_reset();
}

TEST(linear_forward_f32_and_accumulation) {
    int64_t xs[] = {2, 3, 4}, ws[] = {5, 4}, bs[] = {5};
    fg_tensor *x = fg_tensor_new(FG_F32, 3, xs), *w = fg_tensor_new(FG_F32, 2, ws);
    fg_tensor *b = fg_tensor_new(FG_F32, 1, bs);
    fg_rng r = {3, 0};
    float *px = fg_tensor_data(x), *pw = fg_tensor_data(w), *pb = fg_tensor_data(b);
    for (int i = 0; i < 24; i++) px[i] = fg_rng_uniform(&r) - 0.5f;
    for (int i = 0; i < 20; i++) pw[i] = fg_rng_uniform(&r) - 0.5f;
    for (int i = 0; i < 5; i++) pb[i] = fg_rng_uniform(&r) - 0.5f;
    fg_tensor_set_requires_grad(w, true);
    fg_tensor_set_requires_grad(b, true);
    for (int rep = 0; rep < 2; rep++) {
        fg_tensor *y = fg_linear(x, w, b);
        CHECK(y && fg_tensor_ndim(y) == 3 && fg_tensor_dim(y, 2) == 5);
        for (int row = 0; row < 6; row++)
            for (int o = 0; o < 5; o++) {
                double acc = pb[o];
                for (int k = 0; k < 4; k++) acc += (double)px[row * 4 + k] * pw[o * 4 + k];
                CHECK_CLOSE(fg_tensor_get(y, row * 5 + o), acc, 1e-5, 1e-6);
            }
        CHECK_OK(fg_backward_with(y, fg_full(FG_F32, 3, (int64_t[]){2, 3, 5}, 1.0)));
        fg_step_reset();
    }
    /* d sum(y) / db = rows, twice; d / dw[o, k] = sum over rows of x[., k], twice */
    for (int o = 0; o < 5; o++) CHECK_CLOSE(fg_tensor_get(fg_tensor_grad(b), o), 12.0, 1e-6, 0);
    for (int k = 0; k < 4; k++) {
        double colsum = 0;
        for (int row = 0; row < 6; row++) colsum += px[row * 4 + k];
        CHECK_CLOSE(fg_tensor_get(fg_tensor_grad(w), 2 * 4 + k), 2 * colsum, 1e-5, 1e-6);
    }
    fg_tensor_free(x);
    fg_tensor_free(w);
    fg_tensor_free(b);
}

TEST(dense_errors_name_the_shapes) {
    int64_t s23[] = {2, 3}, s43[] = {4, 3}, s5[] = {5}, s234[] = {2, 3, 4}, s345[] = {3, 4, 5};
    fg_tensor *a = fg_zeros(FG_F32, 2, s23), *w = fg_zeros(FG_F32, 2, s43);
    CHECK(fg_matmul(a, w) == NULL);
    CHECK_CONTAINS(fg_last_error(), "f32[2, 3] @ f32[4, 3]");
    CHECK(fg_matmul(fg_zeros(FG_F32, 3, s234), fg_zeros(FG_F32, 3, s345)) == NULL);
    CHECK_CONTAINS(fg_last_error(), "batch dims");
    CHECK(fg_linear(a, w, fg_zeros(FG_F32, 1, s5)) == NULL);
    CHECK_CONTAINS(fg_last_error(), "bias f32[5]");
    CHECK(fg_linear(a, fg_zeros(FG_F64, 2, s43), NULL) == NULL);
    CHECK_CONTAINS(fg_last_error(), "dtypes differ");
    CHECK(fg_causal_attention(fg_zeros(FG_F32, 3, s234), 2) == NULL);
    CHECK_CONTAINS(fg_last_error(), "f32[2, 3, 4]");
    CHECK(fg_matmul(NULL, w) == NULL);
    CHECK(fg_linear(NULL, w, NULL) == NULL);
    CHECK(fg_causal_attention(NULL, 1) == NULL);
    fg_step_reset();
}
