/* The fused recurrent nodes (fn_rnn.c over k_rnn.c's kernels: one node a
 * layer and direction) on their own: the GRU's (fg__gru_seq) and the
 * LSTM's (fg__lstm_seq) gradients of every input (the input projection,
 * W_hh, b_hh, the initial states) against finite differences in f64,
 * forward and reverse, with and without b_hh; the GRU's values against
 * torch.nn.GRU's cell written out here; and the dtypes and shapes refused. */
#include <math.h>
#include <stdlib.h>

#include "autograd/autograd_impl.h"
#include "gradcheck.h"

typedef struct seq_arg {
    bool reverse, bias;
} seq_arg;

/* in: xw (T, N, 3H), whh (3H, H), h0 (N, H), bhh (3H) */
static fg_tensor *f_gru(fg_tensor **in, void *arg) {
    const seq_arg *a = arg;
    return fg__gru_seq(in[0], in[1], a->bias ? in[3] : NULL, in[2], a->reverse);
}

/* in: xw (T, N, 4H), whh (4H, H), h0, c0 (N, H), bhh (4H) */
static fg_tensor *f_lstm(fg_tensor **in, void *arg) {
    const seq_arg *a = arg;
    return fg__lstm_seq(in[0], in[1], a->bias ? in[4] : NULL, in[2], in[3], a->reverse);
}

TEST(gru_node_gradients_match_finite_differences_f64) {
    int64_t T = 4, N = 2, H = 3;
    for (int k = 0; k < 4; k++) {
        seq_arg a = {.reverse = k & 1, .bias = k < 2};
        fg_tensor *in[4] = {gc_randn(3, (int64_t[]){T, N, 3 * H}, 10 + k, 1.0),
                            gc_randn(2, (int64_t[]){3 * H, H}, 20 + k, 0.6),
                            gc_randn(2, (int64_t[]){N, H}, 30 + k, 0.5),
                            gc_randn(1, (int64_t[]){3 * H}, 40 + k, 0.5)};
        for (int i = 0; i < 4; i++) fg_tensor_set_requires_grad(in[i], i < 3 || a.bias);
        CHECK_MSG(gradcheck("gru", f_gru, in, 4, &a, 1e-6, 1e-8) == 0, "reverse %d bias %d",
                  a.reverse, a.bias);
        for (int i = 0; i < 4; i++) fg_tensor_free(in[i]);
    }
}

TEST(lstm_node_gradients_match_finite_differences_f64) {
    int64_t T = 4, N = 2, H = 3;
    for (int k = 0; k < 4; k++) {
        seq_arg a = {.reverse = k & 1, .bias = k < 2};
        fg_tensor *in[5] = {gc_randn(3, (int64_t[]){T, N, 4 * H}, 50 + k, 1.0),
                            gc_randn(2, (int64_t[]){4 * H, H}, 60 + k, 0.6),
                            gc_randn(2, (int64_t[]){N, H}, 70 + k, 0.5),
                            gc_randn(2, (int64_t[]){N, H}, 80 + k, 0.5),
                            gc_randn(1, (int64_t[]){4 * H}, 90 + k, 0.5)};
        for (int i = 0; i < 5; i++) fg_tensor_set_requires_grad(in[i], i < 4 || a.bias);
        CHECK_MSG(gradcheck("lstm", f_lstm, in, 5, &a, 1e-6, 1e-8) == 0, "reverse %d bias %d",
                  a.reverse, a.bias);
        for (int i = 0; i < 5; i++) fg_tensor_free(in[i]);
    }
}

static double sig(double v) { return 1 / (1 + exp(-v)); }

/* torch.nn.GRU's cell, step by step in double: r = sigmoid(x_r + W_hr h +
 * b_hr), z likewise, n = tanh(x_n + r (W_hn h + b_hn)), h' = (1 - z) n + z h */
/* H 21: a vector of 16 and 5 over on AVX-512, two of 8 and 5 over on AVX2 */
TEST(gru_node_values_follow_pytorch_cell_f32_f64) {
    enum { T = 3, N = 2, H = 21 };
    for (int k = 0; k < 4; k++) {
        bool reverse = k & 1, f32 = k >= 2;
        fg_tensor *in[4] = {gc_randn(3, (int64_t[]){T, N, 3 * H}, 1 + k, 1.0),
                            gc_randn(2, (int64_t[]){3 * H, H}, 2 + k, 0.6),
                            gc_randn(2, (int64_t[]){N, H}, 3 + k, 0.5),
                            gc_randn(1, (int64_t[]){3 * H}, 4 + k, 0.5)};
        const double *x = fg_tensor_data(in[0]), *w = fg_tensor_data(in[1]);
        const double *b = fg_tensor_data(in[3]);
        double h[N][H], want[T][N][H];
        for (int64_t i = 0; i < N * H; i++) h[i / H][i % H] = ((double *)fg_tensor_data(in[2]))[i];
        for (int64_t s = 0; s < T; s++) {
            int64_t t = reverse ? T - 1 - s : s;
            double nh[N][H];
            for (int64_t r = 0; r < N; r++)
                for (int64_t j = 0; j < H; j++) {
                    double g[3];
                    for (int q = 0; q < 3; q++) {
                        g[q] = b[q * H + j];
                        for (int64_t i = 0; i < H; i++) g[q] += w[(q * H + j) * H + i] * h[r][i];
                    }
                    const double *xr = x + (t * N + r) * 3 * H;
                    double rv = sig(xr[j] + g[0]), zv = sig(xr[H + j] + g[1]);
                    double nv = tanh(xr[2 * H + j] + rv * g[2]);
                    nh[r][j] = (1 - zv) * nv + zv * h[r][j];
                }
            for (int64_t r = 0; r < N; r++)
                for (int64_t j = 0; j < H; j++) want[t][r][j] = h[r][j] = nh[r][j];
        }
        fg_tensor *c[4];
        for (int i = 0; i < 4; i++) c[i] = f32 ? fg_cast(in[i], FG_F32) : in[i];
        fg_tensor *y = fg__gru_seq(c[0], c[1], c[3], c[2], reverse);
        CHECK_MSG(y != NULL, "%s", fg_last_error());
        double worst = 0;
        for (int64_t i = 0; y && i < T * N * H; i++)
            worst = fmax(worst, fabs(fg_tensor_get(y, i) - (&want[0][0][0])[i]));
        CHECK_MSG(worst < (f32 ? 2e-6 : 1e-14), "reverse %d %s: largest gap %g", reverse,
                  f32 ? "f32" : "f64", worst);
        fg_step_reset();
        for (int i = 0; i < 4; i++) fg_tensor_free(in[i]);
    }
}

TEST(gru_node_refuses_other_dtypes) {
    int64_t T = 2, N = 1, H = 2;
    fg_tensor *xw = fg_zeros(FG_BF16, 3, (int64_t[]){T, N, 3 * H});
    fg_tensor *w = fg_zeros(FG_BF16, 2, (int64_t[]){3 * H, H});
    fg_tensor *h0 = fg_zeros(FG_BF16, 2, (int64_t[]){N, H});
    CHECK(!fg__lstm_seq_available(xw));
    CHECK(fg__gru_seq(xw, w, NULL, h0, false) == NULL);
    CHECK(fg_last_status() == FG_EUNSUPPORTED);
    CHECK_CONTAINS(fg_last_error(), "gru_fwd");
    fg_tensor *w4 = fg_zeros(FG_F32, 2, (int64_t[]){4 * H, H}), *x3 = fg_cast(xw, FG_F32);
    CHECK(fg__gru_seq(x3, w4, NULL, fg_cast(h0, FG_F32), false) == NULL);
    CHECK(fg_last_status() == FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "(3H, H)");
    CHECK(fg__gru_seq(NULL, w, NULL, h0, false) == NULL);
    CHECK_CONTAINS(fg_last_error(), "NULL input");
    fg_step_reset();
}
