/* Dense-op speed against the engine underneath: fulgur's fg_linear /
 * fg_matmul forward + backward (through autograd) vs the same three
 * cblas_sgemm calls alone, fused causal attention vs an unfused per-head
 * sgemm implementation that keeps the (T, T) probabilities, and oneDNN's
 * bf16 matmul vs OpenBLAS sgemm on the same shapes.
 *
 *   gemm_bench [threads [filter]]   (default 1 thread, every case; filter:
 *                                    linear, matmul, attention or onednn)
 *
 * Prints one JSON line per case:
 *   {"name": ..., "fulgur": GFLOP/s, "baseline": GFLOP/s, "unit": "GFLOP/s", "ratio": f/b, ...}
 * Each side runs REPS times, alternating with the other so that load from
 * other processes hits both alike; the best run of each counts (the first
 * run of a new shape class also calibrates fulgur's engine choice).
 * FULGUR_GEMM=openblas or onednn forces fulgur's engine; the engines and
 * the choices made go to stderr at the start and the end. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fulgur/fulgur.h"

#ifdef FULGUR_HAVE_DNNL /* set by CMake when oneDNN is built in */
#include <dnnl.h>
#endif

#define REPS 7

static void die(void) {
    fprintf(stderr, "gemm_bench: %s\n", fg_last_error());
    exit(1);
}

static float *frand(int64_t n, uint64_t seed) {
    float *p = aligned_alloc(64, (size_t)((n * 4 + 63) / 64 * 64));
    fg_rng_fill_normal(seed, 0, p, n, 0.0f, 0.5f);
    return p;
}

static void emit(const char *name, const char *shape, double flops, double tf, double tb,
                 const char *extra) {
    double gf = flops / tf * 1e-9, gb = flops / tb * 1e-9;
    printf(
        "{\"name\": \"%s\", \"shape\": \"%s\", \"fulgur\": %.1f, \"baseline\": %.1f, "
        "\"unit\": \"GFLOP/s\", \"ratio\": %.3f, \"fulgur_ms\": %.3f, \"baseline_ms\": %.3f%s}\n",
        name, shape, gf, gb, gf / gb, tf * 1e3, tb * 1e3, extra ? extra : "");
    fflush(stdout);
}

/* ------------------------------------------------------------- linear */

typedef struct {
    int64_t R, in, out;
    float *x, *w, *b, *dy, *dx, *dw, *db, *y;
} lin_case;

/* The three products of a linear layer, as sgemm calls and nothing else. */
static double run_raw_linear(lin_case *c) {
    double t0 = fg_time();
    int R = (int)c->R, in = (int)c->in, out = (int)c->out;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, out, in, 1, c->x, in, c->w, in, 0, c->y,
                out);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, R, in, out, 1, c->dy, out, c->w, in, 1,
                c->dx, in);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, R, 1, c->dy, out, c->x, in, 1,
                c->dw, in);
    return fg_time() - t0;
}

/* The seeding fg_backward_with does (a zeroed gradient for y plus the seed
 * added into it): part of the fulgur timing, reported on its own. */
static double run_seed_only(const fg_tensor *seed) {
    double t0 = fg_time();
    fg_tensor *g = fg_zeros(FG_F32, fg_tensor_ndim(seed), fg_tensor_shape(seed));
    if (!g || fg_ops_get(FG_CPU)->axpby(1.0, seed, 1.0, g) != FG_OK) die();
    double t = fg_time() - t0;
    fg_step_reset();
    return t;
}

static void bench_linear(int64_t R, int64_t in, int64_t out, bool matmul) {
    lin_case c = {R,
                  in,
                  out,
                  frand(R * in, 1),
                  frand(out * in, 2),
                  frand(out, 3),
                  frand(R * out, 4),
                  frand(R * in, 5),
                  frand(out * in, 6),
                  frand(out, 7),
                  frand(R * out, 8)};
    int64_t xs[] = {R / 128, 128, in}, ws[] = {out, in}, wts[] = {in, out}, bs[] = {out},
            ys[] = {R / 128, 128, out};
    fg_tensor *x = fg_tensor_wrap(c.x, FG_F32, 3, xs);
    fg_tensor *w = fg_tensor_wrap(c.w, FG_F32, 2, matmul ? wts : ws);
    fg_tensor *b = fg_tensor_wrap(c.b, FG_F32, 1, bs);
    fg_tensor *seed = fg_tensor_wrap(c.dy, FG_F32, 3, ys);
    fg_tensor *gx = fg_tensor_wrap(c.dx, FG_F32, 3, xs);
    fg_tensor *gw = fg_tensor_wrap(c.dw, FG_F32, 2, matmul ? wts : ws);
    fg_tensor *gb = fg_tensor_wrap(c.db, FG_F32, 1, bs);
    fg_tensor *pts[] = {x, w, b}, *gts[] = {gx, gw, gb};
    for (int i = 0; i < 3; i++) {
        fg_tensor_set_requires_grad(pts[i], true);
        if (fg_tensor_set_grad(pts[i], gts[i]) != FG_OK) die();
    }
    double best_f = 1e30, best_b = 1e30, best_s = 1e30;
    for (int rep = 0; rep < REPS; rep++) {
        double t0 = fg_time();
        fg_tensor *y = matmul ? fg_matmul(x, w) : fg_linear(x, w, b);
        fg_status st = fg_backward_with(y, seed);
        double t = fg_time() - t0;
        if (!y || st != FG_OK) {
            fprintf(stderr, "gemm_bench: %s\n", fg_last_error());
            exit(1);
        }
        fg_step_reset();
        best_f = fmin(best_f, t);
        best_b = fmin(best_b, run_raw_linear(&c));
        best_s = fmin(best_s, run_seed_only(seed));
    }
    char shape[96], extra[96];
    snprintf(shape, sizeof shape, "(%lldx%lld)@(%lldx%lld)", (long long)R, (long long)in,
             (long long)in, (long long)out);
    snprintf(extra, sizeof extra, ", \"seed_ms\": %.3f", best_s * 1e3);
    emit(matmul ? "matmul_fwd_bwd" : "linear_fwd_bwd", shape, 6.0 * R * in * out, best_f, best_b,
         extra);
    for (int i = 0; i < 3; i++) fg_tensor_free(pts[i]);
    fg_tensor_free(seed);
    for (int i = 0; i < 3; i++) fg_tensor_free(gts[i]);
    free(c.x), free(c.w), free(c.b), free(c.dy), free(c.dx), free(c.dw), free(c.db), free(c.y);
}

/* ---------------------------------------------------------- attention */

/* Unfused attention as a framework without a fused kernel runs it: per
 * (batch, head) the full (T, T) scores by sgemm, masked softmax with expf,
 * probabilities kept for backward, then the four backward products. */
static double run_unfused_attention(const float *qkv, const float *dy, float *y, float *dqkv,
                                    float *P, float *dP, int B, int T, int C, int H) {
    int hs = C / H, ld = 3 * C;
    float sc = 1.0f / sqrtf((float)hs);
    double t0 = fg_time();
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const float *q = qkv + (int64_t)b * T * ld + h * hs, *k = q + C, *v = q + 2 * C;
            float *yb = y + (int64_t)b * T * C + h * hs, *p = P + ((int64_t)b * H + h) * T * T;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, sc, q, ld, k, ld, 0, p,
                        T);
            for (int t = 0; t < T; t++) {
                float *r = p + (int64_t)t * T, m = -INFINITY, z = 0;
                for (int j = 0; j <= t; j++) m = fmaxf(m, r[j]);
                for (int j = 0; j < T; j++) {
                    r[j] = j <= t ? expf(r[j] - m) : 0.0f;
                    z += r[j];
                }
                for (int j = 0; j <= t; j++) r[j] /= z;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1, p, T, v, ld, 0, yb,
                        C);
        }
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const float *q = qkv + (int64_t)b * T * ld + h * hs, *k = q + C, *v = q + 2 * C;
            float *dq = dqkv + (int64_t)b * T * ld + h * hs, *dk = dq + C, *dv = dq + 2 * C;
            const float *g = dy + (int64_t)b * T * C + h * hs,
                        *yb = y + (int64_t)b * T * C + h * hs;
            const float *p = P + ((int64_t)b * H + h) * T * T;
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1, p, T, g, C, 1, dv,
                        ld);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1, g, C, v, ld, 0, dP,
                        T);
            for (int t = 0; t < T; t++) {
                float d = 0;
                for (int c = 0; c < hs; c++) d += g[(int64_t)t * C + c] * yb[(int64_t)t * C + c];
                for (int j = 0; j < T; j++)
                    dP[(int64_t)t * T + j] =
                        p[(int64_t)t * T + j] * (dP[(int64_t)t * T + j] - d) * sc;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1, dP, T, k, ld, 1, dq,
                        ld);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1, dP, T, q, ld, 1, dk,
                        ld);
        }
    return fg_time() - t0;
}

static void bench_attention(int B, int T, int C, int H) {
    int64_t n = (int64_t)B * T * 3 * C;
    float *qkv = frand(n, 11), *dy = frand((int64_t)B * T * C, 12), *dq = frand(n, 13);
    float *y = frand((int64_t)B * T * C, 14), *P = frand((int64_t)B * H * T * T, 15);
    float *dP = frand((int64_t)T * T, 16);
    int64_t qs[] = {B, T, 3 * C}, ys[] = {B, T, C};
    fg_tensor *tq = fg_tensor_wrap(qkv, FG_F32, 3, qs), *tg = fg_tensor_wrap(dq, FG_F32, 3, qs);
    fg_tensor *seed = fg_tensor_wrap(dy, FG_F32, 3, ys);
    fg_tensor_set_requires_grad(tq, true);
    if (fg_tensor_set_grad(tq, tg) != FG_OK) die();
    double best_f = 1e30, best_b = 1e30, best_fwd = 1e30, best_s = 1e30;
    for (int rep = 0; rep < REPS; rep++) {
        double t0 = fg_time();
        fg_tensor *out = fg_causal_attention(tq, H);
        double t1 = fg_time();
        fg_status st = fg_backward_with(out, seed);
        double t = fg_time() - t0;
        if (!out || st != FG_OK) {
            fprintf(stderr, "gemm_bench: %s\n", fg_last_error());
            exit(1);
        }
        fg_step_reset();
        best_f = fmin(best_f, t);
        best_fwd = fmin(best_fwd, t1 - t0);
        best_b = fmin(best_b, run_unfused_attention(qkv, dy, y, dq, P, dP, B, T, C, H));
        best_s = fmin(best_s, run_seed_only(seed));
    }
    /* flops of the six (T, T, hs) products of a full (unmasked) square,
     * the usual count, so that the two GFLOP/s compare as times do */
    double flops = 12.0 * B * H * (double)T * T * (C / H);
    char shape[64], extra[128];
    snprintf(shape, sizeof shape, "B%d T%d C%d H%d", B, T, C, H);
    snprintf(extra, sizeof extra, ", \"fulgur_fwd_ms\": %.3f, \"seed_ms\": %.3f", best_fwd * 1e3,
             best_s * 1e3);
    emit("attention_fwd_bwd", shape, flops, best_f, best_b, extra);
    fg_tensor_free(tq);
    fg_tensor_free(tg);
    fg_tensor_free(seed);
    free(qkv), free(dy), free(dq), free(y), free(P), free(dP);
}

/* -------------------------------------------------------- oneDNN bf16 */

#ifdef FULGUR_HAVE_DNNL
#define DN(x)                                                                                      \
    do {                                                                                           \
        dnnl_status_t s_ = (x);                                                                    \
        if (s_ != dnnl_success) {                                                                  \
            fprintf(stderr, "gemm_bench: %s failed: %d\n", #x, (int)s_);                           \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* fulgur's internal bf16 product (src/ops/cpu/matmul_dnnl.c), declared
 * here because no public header has it yet. */
fg_status fg__cpu_matmul_bf16(const fg_tensor *a, bool ta, const fg_tensor *b, bool tb,
                              fg_tensor *c, double alpha, double beta);

/* c (M, N) f32 = a (M, K) bf16 @ b (K, N) bf16, b stored (N, K) when bt
 * (a linear layer's weight); a stored (K, M) when at. "fulgur" is
 * fg__cpu_matmul_bf16 (descriptor, cached primitive, scratchpad per call);
 * raw_ms is the same primitive made once and executed alone. */
static void bench_dnnl(int64_t M, int64_t K, int64_t N, bool at, bool bt, const char *what) {
    dnnl_engine_t eng;
    dnnl_stream_t str;
    DN(dnnl_engine_create(&eng, dnnl_cpu, 0));
    DN(dnnl_stream_create(&str, eng, dnnl_stream_default_flags));
    dnnl_memory_desc_t amd, bmd, cmd;
    dnnl_dims_t ad = {M, K}, bd = {K, N}, cd = {M, N};
    DN(dnnl_memory_desc_init_by_tag(&amd, 2, ad, dnnl_bf16, at ? dnnl_ba : dnnl_ab));
    DN(dnnl_memory_desc_init_by_tag(&bmd, 2, bd, dnnl_bf16, bt ? dnnl_ba : dnnl_ab));
    DN(dnnl_memory_desc_init_by_tag(&cmd, 2, cd, dnnl_f32, dnnl_ab));
    dnnl_matmul_desc_t md;
    DN(dnnl_matmul_desc_init(&md, &amd, &bmd, NULL, &cmd));
    dnnl_primitive_desc_t pd;
    DN(dnnl_primitive_desc_create(&pd, &md, NULL, eng, NULL));
    const char *impl = "?";
    DN(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl));
    dnnl_primitive_t prim;
    DN(dnnl_primitive_create(&prim, pd));
    float *af = frand(M * K, 21), *bf = frand(K * N, 22), *c = frand(M * N, 23),
          *cref = frand(M * N, 24);
    uint16_t *a16 = aligned_alloc(64, (size_t)((M * K * 2 + 63) / 64 * 64));
    uint16_t *b16 = aligned_alloc(64, (size_t)((K * N * 2 + 63) / 64 * 64));
    if (fg_convert(a16, FG_BF16, af, FG_F32, M * K) != FG_OK) die();
    if (fg_convert(b16, FG_BF16, bf, FG_F32, K * N) != FG_OK) die();
    dnnl_memory_t am, bm, cm;
    DN(dnnl_memory_create(&am, &amd, eng, a16));
    DN(dnnl_memory_create(&bm, &bmd, eng, b16));
    DN(dnnl_memory_create(&cm, &cmd, eng, c));
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
    int64_t ash[] = {at ? K : M, at ? M : K}, bsh[] = {bt ? N : K, bt ? K : N}, csh[] = {M, N};
    fg_tensor *ta = fg_tensor_wrap(a16, FG_BF16, 2, ash),
              *tb = fg_tensor_wrap(b16, FG_BF16, 2, bsh);
    fg_tensor *tc = fg_tensor_wrap(c, FG_F32, 2, csh);
    double best_d = 1e30, best_s = 1e30, best_cv = 1e30, best_f = 1e30;
    int lda = at ? (int)M : (int)K, ldb = bt ? (int)K : (int)N;
    for (int rep = 0; rep < REPS; rep++) {
        double t0 = fg_time();
        DN(dnnl_primitive_execute(prim, str, 3, args));
        DN(dnnl_stream_wait(str));
        best_d = fmin(best_d, fg_time() - t0);
        t0 = fg_time();
        if (fg__cpu_matmul_bf16(ta, at, tb, bt, tc, 1.0, 0.0) != FG_OK) {
            fprintf(stderr, "gemm_bench: %s\n", fg_last_error());
            exit(1);
        }
        best_f = fmin(best_f, fg_time() - t0);
        t0 = fg_time();
        cblas_sgemm(CblasRowMajor, at ? CblasTrans : CblasNoTrans, bt ? CblasTrans : CblasNoTrans,
                    (int)M, (int)N, (int)K, 1, af, lda, bf, ldb, 0, cref, (int)N);
        best_s = fmin(best_s, fg_time() - t0);
        t0 = fg_time(); /* what a bf16 path pays to convert its f32 inputs */
        if (fg_convert(a16, FG_BF16, af, FG_F32, M * K) != FG_OK) die();
        if (fg_convert(b16, FG_BF16, bf, FG_F32, K * N) != FG_OK) die();
        best_cv = fmin(best_cv, fg_time() - t0);
    }
    double err = 0, scale = 0;
    for (int64_t i = 0; i < M * N; i++) {
        err = fmax(err, fabs((double)c[i] - cref[i]));
        scale = fmax(scale, fabs((double)cref[i]));
    }
    char shape[96], extra[256];
    snprintf(shape, sizeof shape, "%s (%lldx%lld)@(%lldx%lld)", what, (long long)M, (long long)K,
             (long long)K, (long long)N);
    snprintf(extra, sizeof extra,
             ", \"impl\": \"%s\", \"raw_ms\": %.3f, \"convert_ms\": %.3f, "
             "\"max_err_rel\": %.2e, \"note\": \"fulgur = fg__cpu_matmul_bf16 (bf16 in, f32 "
             "out), baseline = sgemm\"",
             impl, best_d * 1e3, best_cv * 1e3, err / scale);
    emit("onednn_bf16_matmul", shape, 2.0 * M * N * K, best_f, best_s, extra);
    fg_tensor_free(ta);
    fg_tensor_free(tb);
    fg_tensor_free(tc);
    dnnl_memory_destroy(am);
    dnnl_memory_destroy(bm);
    dnnl_memory_destroy(cm);
    dnnl_primitive_destroy(prim);
    dnnl_primitive_desc_destroy(pd);
    dnnl_stream_destroy(str);
    dnnl_engine_destroy(eng);
    free(af), free(bf), free(c), free(cref), free(a16), free(b16);
}
#endif

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    if (fg_set_num_threads(threads) != FG_OK) {
        fprintf(stderr, "gemm_bench: %s\n", fg_last_error());
        return 1;
    }
    fprintf(stderr, "gemm_bench: %d thread(s), %s, OPENBLAS_CORETYPE=%s, %s\n", threads,
            fg_ops_blas_info(), getenv("OPENBLAS_CORETYPE") ? getenv("OPENBLAS_CORETYPE") : "unset",
            openblas_get_config());
    static const int64_t shapes[][3] = {
        {2048, 256, 768}, {2048, 256, 1024}, {2048, 1024, 256}, {2048, 256, 256}};
    const char *only = argc > 2 ? argv[2] : "";
#define WANT(s) (strstr(s, only) != NULL)
    for (int i = 0; WANT("linear") && i < 4; i++)
        bench_linear(shapes[i][0], shapes[i][1], shapes[i][2], false);
    if (WANT("matmul")) bench_linear(2048, 256, 768, true);
    if (WANT("attention")) bench_attention(16, 128, 256, 4);
#ifdef FULGUR_HAVE_DNNL
    for (int i = 0; WANT("onednn") && i < 4; i++) {
        int64_t R = shapes[i][0], in = shapes[i][1], out = shapes[i][2];
        bench_dnnl(R, in, out, false, true, "fwd y=x@w^T");
        bench_dnnl(R, out, in, false, false, "bwd dx=dy@w");
        bench_dnnl(out, R, in, true, false, "bwd dw=dy^T@x");
    }
#endif
    fprintf(stderr, "gemm_bench: chosen: %s\n", fg_ops_blas_info());
    return 0;
}
