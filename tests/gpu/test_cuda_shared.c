/* layer: ops. The scalar math the CUDA kernels share with the host
 * (src/ops/cuda/shared.h), compiled here for the host from the same
 * source and held to the CPU kernels, on every machine: the Philox blocks
 * against core's fg_philox, dropout's mask made as the CUDA kernel makes
 * it (one Philox block a thread, the CPU's threshold) against the CPU
 * table's dropout bit for bit, the fused cross-entropy's row statistics
 * merged in the CUDA kernel's order (256 strided partial sums, then a
 * tree) against the CPU's cross_entropy_fwd_stats and its gradient
 * against cross_entropy_bwd_stats, and GELU against gelu_fwd/bwd. */
#include <stdint.h>

#include "fulgur/ops.h"
#include "harness.h"
#include "ops/cuda/shared.h"

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
