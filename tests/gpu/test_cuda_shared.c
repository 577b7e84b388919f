/* layer: ops. The scalar math the CUDA kernels share with the host
 * (src/ops/cuda/shared.h), compiled here for the host from the same
 * source and held to the CPU kernels, on every machine: the Philox blocks
 * against core's fg_philox, dropout's mask made as the CUDA kernel makes
 * it (one Philox block a thread, the CPU's threshold) against the CPU
 * table's dropout bit for bit, the fused cross-entropy's row statistics
 * merged in the CUDA kernel's order (256 strided partial sums, then a
 * tree) against the CPU's cross_entropy_fwd_stats and its gradient
 * against cross_entropy_bwd_stats, GELU against gelu_fwd/bwd, and the
 * CNN and loss kernels' per-element math (shared_cnn.h): the convolution
 * made as cnn.c makes it (im2col, the products as it lays them out,
 * col2im) against the CPU's three entries, the pooling bit for bit,
 * batch norm's input gradient, every elementwise loss. */
#include <stdint.h>

#include "fulgur/ops.h"
#include "harness.h"
#include "ops/cuda/shared.h"
#include "ops/cuda/shared_cnn.h"

static const fg_op_table *cpu(void) { return fg_ops_get(FG_CPU); }

static uint64_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 11;
}
static float frand(uint64_t *s, float lo, float hi) {
    return lo + (hi - lo) * (float)((double)(lcg(s) & 0xFFFFFF) / 16777216.0);
}

TEST(philox_blocks_are_cores) {
    uint64_t s = 1;
    for (int i = 0; i < 20000; i++) {
        uint64_t seed = lcg(&s) * 2654435761ULL,
                 ctr = i < 10000 ? (uint64_t)i : (lcg(&s) << 20) >> 2; /* 4 ctr fits */
        uint32_t a[4], b[4];
        fg__sh_philox(seed, ctr, a);
        fg_philox(seed, ctr, b);
        CHECK(memcmp(a, b, sizeof a) == 0);
        CHECK(a[ctr & 3] == fg_rng_u32_at(seed, 4 * ctr + (ctr & 3)));
    }
}

/* y = dropout(x) made as k_dropout (src/ops/cuda/ew.cu) makes it */
static void dropout_as_cuda(const float *x, float *y, int64_t n, uint64_t seed, uint64_t offset,
                            double p) {
    uint32_t thr;
    int none;
    fg__sh_dropout_threshold(p, &thr, &none);
    float scale = (float)(1 / (1 - p));
    uint64_t first = offset >> 2, last = (offset + (uint64_t)n - 1) >> 2;
    for (uint64_t ctr = first; ctr <= last; ctr++) {
        uint32_t u[4];
        fg__sh_philox(seed, ctr, u);
        for (int k = 0; k < 4; k++) {
            uint64_t d = 4 * ctr + (uint64_t)k;
            if (d < offset || d >= offset + (uint64_t)n) continue;
            int64_t i = (int64_t)(d - offset);
            y[i] = (!none && u[k] >= thr) ? x[i] * scale : 0.f;
        }
    }
}

TEST(dropout_mask_is_the_cpus_bit_for_bit) {
    static const double ps[] = {0.0, 0.1, 0.5, 0.9, 1 - 1e-10};
    static const int64_t ns[] = {1, 7, 64, 1000, 70001};
    static const uint64_t offs[] = {0, 1, 3, 4, 1234567};
    uint64_t s = 7;
    for (size_t a = 0; a < sizeof ps / sizeof *ps; a++)
        for (size_t b = 0; b < sizeof ns / sizeof *ns; b++)
            for (size_t c = 0; c < sizeof offs / sizeof *offs; c++) {
                int64_t n = ns[b];
                fg_tensor *x = fg_tensor_new(FG_F32, 1, &n), *y = fg_tensor_new(FG_F32, 1, &n);
                float *px = fg_tensor_data(x), *want = malloc((size_t)n * sizeof *want);
                for (int64_t i = 0; i < n; i++) px[i] = frand(&s, -2, 2);
                uint64_t seed = 0x1234ABCDULL + a * 977 + b;
                CHECK_OK(cpu()->dropout_fwd(x, ps[a], seed, offs[c], y));
                dropout_as_cuda(px, want, n, seed, offs[c], ps[a]);
                CHECK_MSG(memcmp(fg_tensor_data(y), want, (size_t)n * sizeof *want) == 0,
                          "p %g n %lld offset %llu: masks differ", ps[a], (long long)n,
                          (unsigned long long)offs[c]);
                free(want);
                fg_tensor_free(x);
                fg_tensor_free(y);
            }
}

/* row statistics in k_ce_rows's order: thread t of 256 folds elements t,
 * t + 256, ...; then the tree halves 128, 64, ..., 1 */
static fg__sh_lse row_stats_as_cuda(const float *x, int64_t V) {
    fg__sh_lse part[256];
    for (int t = 0; t < 256; t++) {
        part[t] = fg__sh_lse_init();
        for (int64_t c = t; c < V; c += 256) part[t] = fg__sh_lse_push(part[t], x[c]);
    }
    for (int h = 128; h > 0; h >>= 1)
        for (int t = 0; t < h; t++) part[t] = fg__sh_lse_merge(part[t], part[t + h]);
    return part[0];
}

TEST(cross_entropy_statistics_match_the_cpus) {
    static const int64_t shapes[][2] = {{1, 1}, {3, 10}, {17, 300}, {8, 50257}, {64, 257}};
    uint64_t s = 11;
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        int64_t N = shapes[k][0], V = shapes[k][1], sh2[2] = {2, N};
        fg_tensor *lg = fg_tensor_new(FG_F32, 2, shapes[k]), *tg = fg_tensor_new(FG_I32, 1, &N);
        fg_tensor *loss = fg_tensor_new(FG_F32, 0, NULL), *st = fg_tensor_new(FG_F64, 2, sh2);
        fg_tensor *dl = fg_zeros(FG_F32, 2, shapes[k]);
        float *x = fg_tensor_data(lg);
        int32_t *t = fg_tensor_data(tg);
        for (int64_t i = 0; i < N * V; i++) x[i] = frand(&s, -8, 8);
        for (int64_t i = 0; i < N; i++) t[i] = i % 5 == 4 ? -100 : (int32_t)(lcg(&s) % V);
        int64_t count = 0;
        CHECK_OK(cpu()->cross_entropy_fwd_stats(lg, tg, -100, loss, &count, st));
        CHECK_OK(cpu()->cross_entropy_bwd_stats(lg, tg, st, -100, 1.0, count, dl));
        const double *m = fg_tensor_data(st), *sum = m + N;
        double total = 0;
        int64_t cnt = 0;
        const float *g = fg_tensor_data(dl);
        double worst = 0;
        for (int64_t r = 0; r < N; r++) {
            fg__sh_lse a = row_stats_as_cuda(x + r * V, V);
            CHECK(a.m == m[r]);
            /* the CPU's f32 rows sum their exps in f32 (vector exp within 2
             * ulp), the shared code in f64 */
            CHECK_CLOSE(a.s, sum[r], 2e-6, 0);
            if (t[r] == -100) continue;
            total += fg__sh_ce_loss(a, x[r * V + t[r]]);
            cnt++;
        }
        for (int64_t r = 0; r < N; r++) {
            if (t[r] == -100) continue;
            fg__sh_lse a = row_stats_as_cuda(x + r * V, V);
            for (int64_t c = 0; c < V; c++) {
                double want = fg__sh_ce_grad(a, x[r * V + c], c == t[r], 1.0 / (double)cnt);
                double d = fabs((double)g[r * V + c] - want);
                if (d > worst) worst = d;
            }
        }
        CHECK(cnt == count);
        CHECK_CLOSE(cnt ? total / (double)cnt : 0.0, *(float *)fg_tensor_data(loss), 1e-6, 1e-7);
        CHECK_MSG(worst < 1e-7, "shape %lld x %lld: gradient differs by %g", (long long)N,
                  (long long)V, worst);
        fg_tensor_free(lg);
        fg_tensor_free(tg);
        fg_tensor_free(loss);
        fg_tensor_free(st);
        fg_tensor_free(dl);
    }
}

TEST(gelu_matches_the_cpus) {
    int64_t n = 4099;
    fg_tensor *x = fg_tensor_new(FG_F32, 1, &n), *y = fg_tensor_new(FG_F32, 1, &n);
    fg_tensor *g = fg_full(FG_F32, 1, &n, 1.0), *dx = fg_zeros(FG_F32, 1, &n);
    float *px = fg_tensor_data(x);
    uint64_t s = 5;
    for (int64_t i = 0; i < n; i++) px[i] = i < 8 ? (float)(i - 4) * 20 : frand(&s, -12, 12);
    CHECK_OK(cpu()->gelu_fwd(x, y));
    CHECK_OK(cpu()->gelu_bwd(x, g, dx));
    const float *py = fg_tensor_data(y), *pd = fg_tensor_data(dx);
    for (int64_t i = 0; i < n; i++) {
        CHECK_CLOSE(fg__sh_gelu(px[i]), py[i], 1e-5, 1e-6);
        CHECK_CLOSE(fg__sh_gelu_grad(px[i]), pd[i], 1e-5, 1e-6);
    }
    fg_tensor_free(x);
    fg_tensor_free(y);
    fg_tensor_free(g);
    fg_tensor_free(dx);
}

/* ---- the CNN kernels' per-element math (shared_cnn.h) ---- */

static fg_tensor *rnd_f32(uint64_t *s, int nd, const int64_t *sh, float lo, float hi) {
    fg_tensor *t = fg_tensor_new(FG_F32, nd, sh);
    float *p = fg_tensor_data(t);
    for (int64_t i = 0; i < fg_tensor_numel(t); i++) p[i] = frand(s, lo, hi);
    return t;
}

static float *copy_f32(const fg_tensor *t) {
    size_t n = (size_t)fg_tensor_numel(t);
    float *p = malloc(sizeof(float) * (n ? n : 1));
    memcpy(p, fg_tensor_data(t), sizeof(float) * n);
    return p;
}

/* largest |a - b| over the largest |b| */
static double rel_gap(const float *a, const float *b, int64_t n) {
    double mx = 1e-30, e = 0;
    for (int64_t i = 0; i < n; i++) mx = fmax(mx, fabs((double)b[i]));
    for (int64_t i = 0; i < n; i++) e = fmax(e, fabs((double)a[i] - (double)b[i]));
    return e / mx;
}

/* c_g (M, N) (+)= op(a_g) op(b_g) for each group g, row-major with the
 * strides cnn.c hands cuBLASLt (lda, ldb, ldc the stored row lengths) */
static void gemm_groups(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *a,
                        int64_t lda, int64_t sa, const float *b, int64_t ldb, int64_t sb, float *c,
                        int64_t ldc, int64_t sc, int64_t G, float beta) {
    for (int64_t g = 0; g < G; g++)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double s = 0;
                for (int64_t k = 0; k < K; k++)
                    s += (double)a[g * sa + (ta ? k * lda + i : i * lda + k)] *
                         b[g * sb + (tb ? j * ldb + k : k * ldb + j)];
                float *o = c + g * sc + i * ldc + j;
                *o = (float)s + beta * *o;
            }
}

/* cnn.c's three convolution entries done here with shared_cnn.h's im2col
 * and col2im, the products as cnn.c lays them out, one image a chunk (so
 * that n0 moves), against the CPU table's */
TEST(convolution_as_cuda_matches_the_cpus) {
    /* N, C, H, W, O, KH, KW, stride, pad, dilation, groups */
    static const int64_t cv[][11] = {{2, 3, 7, 9, 4, 3, 3, 1, 1, 1, 1},
                                     {3, 4, 8, 8, 6, 3, 2, 2, 0, 1, 2},
                                     {1, 6, 11, 10, 6, 3, 3, 1, 2, 2, 3},
                                     {2, 8, 5, 5, 16, 1, 1, 1, 0, 1, 1}};
    uint64_t s = 17;
    for (size_t c = 0; c < sizeof cv / sizeof *cv; c++) {
        const int64_t *v = cv[c];
        fg_conv_params p = {
            .stride = {v[7], v[7]}, .pad = {v[8], v[8]}, .dilation = {v[9], v[9]}, .groups = v[10]};
        fg__cu_conv g = {.N = v[0],
                         .C = v[1],
                         .H = v[2],
                         .W = v[3],
                         .O = v[4],
                         .KH = v[5],
                         .KW = v[6],
                         .G = v[10],
                         .sh = v[7],
                         .sw = v[7],
                         .ph = v[8],
                         .pw = v[8],
                         .dh = v[9],
                         .dw = v[9]};
        g.OH = (g.H + 2 * g.ph - g.dh * (g.KH - 1) - 1) / g.sh + 1;
        g.OW = (g.W + 2 * g.pw - g.dw * (g.KW - 1) - 1) / g.sw + 1;
        int64_t Cg = g.C / g.G, Og = g.O / g.G, CK = Cg * g.KH * g.KW, P = g.OH * g.OW;
        int64_t xs[4] = {g.N, g.C, g.H, g.W}, ws[4] = {g.O, Cg, g.KH, g.KW};
        int64_t ys[4] = {g.N, g.O, g.OH, g.OW}, bs[1] = {g.O};
        fg_tensor *x = rnd_f32(&s, 4, xs, -1, 1), *w = rnd_f32(&s, 4, ws, -1, 1);
        fg_tensor *b = rnd_f32(&s, 1, bs, -1, 1), *y = fg_tensor_new(FG_F32, 4, ys);
        fg_tensor *dy = rnd_f32(&s, 4, ys, -1, 1), *dx = rnd_f32(&s, 4, xs, -1, 1);
        fg_tensor *dw = rnd_f32(&s, 4, ws, -1, 1), *db = rnd_f32(&s, 1, bs, -1, 1);
        const float *px = fg_tensor_data(x), *pw = fg_tensor_data(w), *pb = fg_tensor_data(b);
        const float *pg = fg_tensor_data(dy);
        float *hy = malloc(sizeof(float) * (size_t)fg_tensor_numel(y)), *hdx = copy_f32(dx);
        float *hdw = copy_f32(dw), *hdb = copy_f32(db);
        float *col = malloc(sizeof(float) * (size_t)(g.C * g.KH * g.KW * P));
        float *t = malloc(sizeof(float) * (size_t)(g.O * P));
        for (int64_t n0 = 0; n0 < g.N; n0++) { /* chunks of one image */
            for (int64_t i = 0; i < g.C * g.KH * g.KW * P; i++)
                col[i] = fg__sh_im2col(px, &g, n0, 1, i);
            gemm_groups(false, false, Og, P, CK, pw, CK, Og * CK, col, P, CK * P, t, P, Og * P, g.G,
                        0);
            for (int64_t i = 0; i < g.O * P; i++) /* k_conv_out */
                hy[n0 * g.O * P + i] = t[i / P * P + i % P] + pb[i / P];
            for (int64_t o = 0; o < g.O; o++) /* k_conv_dyt */
                for (int64_t q = 0; q < P; q++) t[o * P + q] = pg[(n0 * g.O + o) * P + q];
            gemm_groups(false, true, Og, CK, P, t, P, Og * P, col, P, CK * P, hdw, CK, Og * CK, g.G,
                        1);
            gemm_groups(true, false, CK, P, Og, pw, CK, Og * CK, t, P, Og * P, col, P, CK * P, g.G,
                        0);
            for (int64_t i = 0; i < g.C * g.H * g.W; i++)
                hdx[n0 * g.C * g.H * g.W + i] += fg__sh_col2im(col, &g, 1, i);
        }
        for (int64_t o = 0; o < g.O; o++) {
            double sb = 0;
            for (int64_t n = 0; n < g.N; n++)
                for (int64_t q = 0; q < P; q++) sb += pg[(n * g.O + o) * P + q];
            hdb[o] += (float)sb;
        }
        CHECK_OK(cpu()->conv2d_fwd(x, w, b, &p, y));
        CHECK_OK(cpu()->conv2d_bwd_data(dy, w, &p, dx));
        CHECK_OK(cpu()->conv2d_bwd_weight(x, dy, &p, dw, db));
        double e[4] = {rel_gap(hy, fg_tensor_data(y), fg_tensor_numel(y)),
                       rel_gap(hdx, fg_tensor_data(dx), fg_tensor_numel(dx)),
                       rel_gap(hdw, fg_tensor_data(dw), fg_tensor_numel(dw)),
                       rel_gap(hdb, fg_tensor_data(db), fg_tensor_numel(db))};
        CHECK_MSG(e[0] <= 1e-5 && e[1] <= 1e-5 && e[2] <= 1e-5 && e[3] <= 1e-5,
                  "conv case %zu: gaps y %g dx %g dw %g db %g", c, e[0], e[1], e[2], e[3]);
        free(hy), free(hdx), free(hdw), free(hdb), free(col), free(t);
        fg_tensor *all[] = {x, w, b, y, dy, dx, dw, db};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) fg_tensor_free(all[i]);
    }
}

/* the pooling outputs, indices and plane backward of shared_cnn.h equal
 * the CPU table's bit for bit (the same sums in the same order) */
TEST(pooling_as_cuda_is_the_cpus_bit_for_bit) {
    /* kind, kernel, stride, pad, dilation, count_include_pad, OH, OW of 2x3x9x8 */
    static const int64_t pl[][8] = {
        {FG_POOL_MAX, 3, 2, 1, 1, 0, 5, 4},          {FG_POOL_MAX, 2, 1, 0, 2, 0, 7, 6},
        {FG_POOL_AVG, 3, 2, 1, 1, 1, 5, 4},          {FG_POOL_AVG, 3, 2, 1, 1, 0, 5, 4},
        {FG_POOL_ADAPTIVE_AVG, 0, 0, 0, 0, 0, 4, 3}, {FG_POOL_ADAPTIVE_AVG, 0, 0, 0, 0, 0, 1, 1}};
    uint64_t s = 23;
    for (size_t c = 0; c < sizeof pl / sizeof *pl; c++) {
        const int64_t *v = pl[c];
        fg_pool_params p = {.kind = (fg_pool_kind)v[0],
                            .kernel = {v[1], v[1]},
                            .stride = {v[2], v[2]},
                            .pad = {v[3], v[3]},
                            .dilation = {v[4], v[4]},
                            .count_include_pad = v[5] != 0};
        fg__cu_pool q = {.kind = (int)v[0],
                         .count_include_pad = (int)v[5],
                         .NC = 6,
                         .H = 9,
                         .W = 8,
                         .OH = v[6],
                         .OW = v[7],
                         .kh = v[1],
                         .kw = v[1],
                         .sh = v[2],
                         .sw = v[2],
                         .ph = v[3],
                         .pw = v[3],
                         .dh = v[4],
                         .dw = v[4]};
        int64_t xs[4] = {2, 3, 9, 8}, ys[4] = {2, 3, v[6], v[7]};
        fg_tensor *x = rnd_f32(&s, 4, xs, -1, 1), *y = fg_tensor_new(FG_F32, 4, ys);
        ((float *)fg_tensor_data(x))[5] = NAN; /* NaN is the largest */
        fg_tensor *idx = fg_tensor_new(FG_I32, 4, ys), *dy = rnd_f32(&s, 4, ys, -1, 1);
        fg_tensor *dx = rnd_f32(&s, 4, xs, -1, 1);
        int64_t ny = fg_tensor_numel(y), nx = fg_tensor_numel(x);
        float *hy = malloc(sizeof(float) * (size_t)ny), *hdx = copy_f32(dx);
        int32_t *hi = malloc(sizeof(int32_t) * (size_t)ny);
        bool mx = p.kind == FG_POOL_MAX;
        for (int64_t o = 0; o < ny; o++) hy[o] = fg__sh_pool_out(fg_tensor_data(x), &q, o, &hi[o]);
        CHECK_OK(cpu()->pool2d_fwd(x, &p, y, mx ? idx : NULL));
        for (int64_t nc = 0; nc < q.NC; nc++)
            fg__sh_pool_plane_bwd(fg_tensor_data(dy), mx ? fg_tensor_data(idx) : NULL, hdx, &q, nc);
        CHECK_OK(cpu()->pool2d_bwd(dy, mx ? idx : NULL, &p, dx));
        CHECK_MSG(memcmp(hy, fg_tensor_data(y), sizeof(float) * (size_t)ny) == 0,
                  "pool case %zu: outputs differ", c);
        if (mx)
            CHECK_MSG(memcmp(hi, fg_tensor_data(idx), sizeof(int32_t) * (size_t)ny) == 0,
                      "pool case %zu: indices differ", c);
        CHECK_MSG(memcmp(hdx, fg_tensor_data(dx), sizeof(float) * (size_t)nx) == 0,
                  "pool case %zu: gradients differ", c);
        free(hy), free(hdx), free(hi);
        fg_tensor *all[] = {x, y, idx, dy, dx};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) fg_tensor_free(all[i]);
    }
}

/* batch norm's input gradient from the channel sums the CUDA kernel makes */
TEST(batch_norm_gradient_as_cuda_matches_the_cpus) {
    uint64_t s = 29;
    int64_t N = 4, C = 3, S = 35, xs[3] = {N, C, S}, cs[1] = {C};
    fg_tensor *x = rnd_f32(&s, 3, xs, -2, 3), *dy = rnd_f32(&s, 3, xs, -1, 1);
    fg_tensor *w = rnd_f32(&s, 1, cs, 0.5f, 1.5f), *dx = rnd_f32(&s, 3, xs, -1, 1);
    double m[3], var[3], is[3];
    CHECK_OK(cpu()->batch_norm_stats(x, m, var));
    for (int c = 0; c < 3; c++) is[c] = 1 / sqrt(var[c] + 1e-5);
    float *hdx = copy_f32(dx);
    const float *px = fg_tensor_data(x), *pg = fg_tensor_data(dy), *pw = fg_tensor_data(w);
    for (int64_t c = 0; c < C; c++) {
        double sg = 0, sgx = 0;
        for (int64_t n = 0; n < N; n++)
            for (int64_t j = 0; j < S; j++) {
                int64_t e = (n * C + c) * S + j;
                sg += pg[e];
                sgx += pg[e] * ((double)px[e] - m[c]);
            }
        for (int64_t n = 0; n < N; n++)
            for (int64_t j = 0; j < S; j++) {
                int64_t e = (n * C + c) * S + j;
                hdx[e] += fg__sh_bn_dx(px[e], pg[e], m[c], is[c], pw[c], sg, sgx, (double)(N * S));
            }
    }
    CHECK_OK(cpu()->batch_norm_bwd(x, dy, m, is, w, dx, NULL, NULL, false));
    double e = rel_gap(hdx, fg_tensor_data(dx), fg_tensor_numel(dx));
    CHECK_MSG(e <= 1e-6, "batch norm dx gap %g", e);
    free(hdx);
    fg_tensor_free(x), fg_tensor_free(dy), fg_tensor_free(w), fg_tensor_free(dx);
}

/* every elementwise loss and its two gradients against the CPU's f64 kernels */
TEST(losses_as_cuda_match_the_cpus) {
    uint64_t s = 31;
    int64_t n = 257;
    for (int op = FG_LOSS_MSE; op <= FG_LOSS_KL_DIV; op++)
        for (int pv = 0; pv < 2; pv++) {
            bool bce = op == FG_LOSS_BCE, kl = op == FG_LOSS_KL_DIV;
            double p = op == FG_LOSS_SMOOTH_L1 ? 0.5 : op == FG_LOSS_HUBER ? 1.0 : kl ? pv : 0;
            fg_tensor *x = fg_tensor_new(FG_F64, 1, &n), *t = fg_tensor_new(FG_F64, 1, &n);
            fg_tensor *w = fg_tensor_new(FG_F64, 1, &n), *g = fg_tensor_new(FG_F64, 1, &n);
            fg_tensor *y = fg_tensor_new(FG_F64, 1, &n), *dx = fg_zeros(FG_F64, 1, &n);
            fg_tensor *dt = fg_zeros(FG_F64, 1, &n);
            double *px = fg_tensor_data(x), *pt = fg_tensor_data(t), *pw = fg_tensor_data(w);
            double *pg = fg_tensor_data(g);
            for (int64_t i = 0; i < n; i++) {
                px[i] = bce ? frand(&s, 0.02f, 0.98f) : frand(&s, -2, 2);
                pt[i] = bce         ? frand(&s, 0, 1)
                        : kl && !pv ? (i % 9 ? frand(&s, 0, 2) : 0)
                                    : frand(&s, -2, 2);
                pw[i] = frand(&s, 0.5f, 2);
                pg[i] = frand(&s, -1, 1);
            }
            bool withw = op == FG_LOSS_BCE_LOGITS && pv;
            CHECK_OK(cpu()->pointwise_loss_fwd((fg_loss_op)op, x, t, withw ? w : NULL, p, y));
            CHECK_OK(
                cpu()->pointwise_loss_bwd((fg_loss_op)op, x, t, withw ? w : NULL, p, g, dx, dt));
            const double *py = fg_tensor_data(y), *pdx = fg_tensor_data(dx),
                         *pdt = fg_tensor_data(dt);
            for (int64_t i = 0; i < n; i++) {
                double wi = withw ? pw[i] : 1.0, gx, gt;
                fg__sh_ploss_grad(op, px[i], pt[i], wi, p, pg[i], &gx, &gt);
                CHECK_CLOSE(fg__sh_ploss(op, px[i], pt[i], wi, p), py[i], 1e-12, 1e-14);
                CHECK_CLOSE(gx, pdx[i], 1e-12, 1e-14);
                CHECK_CLOSE(gt, pdt[i], 1e-12, 1e-14);
            }
            fg_tensor *all[] = {x, t, w, g, y, dx, dt};
            for (size_t i = 0; i < sizeof all / sizeof *all; i++) fg_tensor_free(all[i]);
        }
}
