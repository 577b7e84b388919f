/* The f32 product engines side by side on the products of the benchmark
 * models (bench/compare's gpt, mlp and vit): OpenBLAS's sgemm, oneDNN's f32
 * matmul as fulgur runs it, BLIS (when Debian's libblis4 is installed: it
 * is opened at run time, never linked, so that its BLAS symbols cannot
 * shadow OpenBLAS's), and with 2 threads two ways of splitting a product
 * over the threads with one-thread sgemm calls.
 *
 *   gemm_engines [threads [set]]   (default 1 thread, every set; set: gpt, mlp or vit)
 *
 * The shapes: every linear layer's forward y = x w^T (nt), backward
 * dx = dy w (nn, accumulating) and dw += dy^T x (tn), for the gpt's four
 * layer kinds and its tied head (2048 rows = batch 16 x context 128) and
 * the mlp's three layers (256 rows); for the gpt also the causal
 * attention's per-head block products (32-row blocks, 64 wide, reading the
 * fused qkv with its row stride of 768; the middle block's 64 keys stand
 * for the 32 to 128 of the others).
 *
 * Engines:
 *   openblas       cblas_sgemm on the threads
 *   onednn         fulgur's oneDNN f32 matmul (a cached primitive per shape)
 *   blis           bli_sgemm on the threads (BLIS_ARCH_TYPE picks its kernels)
 *   split          2 threads only: each thread one cblas_sgemm on half of the
 *                  rows of c (of its columns when c has fewer rows than columns)
 *   pair           2 threads only, backward only: dx on one thread and dw on
 *                  the other at once, against both on 2 threads in turn
 *
 * And for each forward product with a bias, the bias fused into the
 * product (c filled with the bias rows, then sgemm with beta = 1) against
 * fulgur's way (sgemm with beta = 0, then its bias_add kernel): "fused".
 *
 * Every engine runs each shape REPS times interleaved with the others (so
 * that load from other processes hits all alike); the best run counts (load
 * only ever slows a run, so the best is the nearest to an idle machine's).
 * Prints one JSON line per shape: {"name": "gemm_engines", "set", "shape",
 * "threads", then GFLOP/s per engine (0: not available)}, and a line per
 * set with each engine's rate over the whole set (total flops / total
 * time, each product counted as often as a step runs it).
 * Every engine's result is checked against OpenBLAS's: "max_rel_err". */
#include <cblas.h>
#include <dlfcn.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fulgur/fulgur.h"

#define REPS 7
#define MIN_FLOPS 2e7 /* a timed run repeats a product up to this many flops */

/* fulgur's internal products (src/ops/cpu), declared here as gemm_bench
 * declares its own: no public header has them. */
fg_status fg__cpu_gemm_dnnl_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                                const float *a, int64_t lda, const float *b, int64_t ldb,
                                float beta, float *c, int64_t ldc);
const char *fg__dnnl_isa(void);
fg_status fg__cpu_bias_add(fg_tensor *y, const fg_tensor *bias);

/* BLIS's typed API, as its blis.h declares it on x86-64 (dim_t and inc_t
 * are 64-bit; BLIS_TRANSPOSE is 0x08). */
typedef void (*bli_sgemm_fn)(int, int, int64_t, int64_t, int64_t, const float *, const float *,
                             int64_t, int64_t, const float *, int64_t, int64_t, const float *,
                             float *, int64_t, int64_t);
static bli_sgemm_fn g_bli_sgemm;
static char g_blis_arch[32] = "none";

/* dlsym's object pointer as a function pointer, the way POSIX allows */
#define SYM(h, fn, name) (*(void **)&(fn) = dlsym(h, name))

static void open_blis(int threads) {
    void *h = dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
    void (*set_threads)(int64_t);
    int (*arch_id)(void);
    const char *(*arch_name)(int);
    if (!SYM(h, set_threads, "bli_thread_set_num_threads") ||
        !SYM(h, arch_id, "bli_arch_query_id") || !SYM(h, arch_name, "bli_arch_string") ||
        !SYM(h, g_bli_sgemm, "bli_sgemm")) {
        g_bli_sgemm = NULL;
        return;
    }
    set_threads(threads);
    snprintf(g_blis_arch, sizeof g_blis_arch, "%s", arch_name(arch_id()));
}

typedef struct {
    const char *name;
    bool ta, tb;
    int M, N, K;
    float beta;
    int lda, ldb; /* 0: packed */
    int per_step; /* how many of it one step runs */
} shape;

/* the gpt: rows R = 16 x 128, width 256, 4 layers; the head is tied to the
 * 65-token embedding */
static const shape k_gpt[] = {
    {"fwd c_attn", false, true, 2048, 768, 256, 0, 0, 0, 4},
    {"fwd attn.c_proj", false, true, 2048, 256, 256, 0, 0, 0, 4},
    {"fwd c_fc", false, true, 2048, 1024, 256, 0, 0, 0, 4},
    {"fwd mlp.c_proj", false, true, 2048, 256, 1024, 0, 0, 0, 4},
    {"fwd lm_head", false, true, 2048, 65, 256, 0, 0, 0, 1},
    {"dx c_attn", false, false, 2048, 256, 768, 1, 0, 0, 4},
    {"dx attn.c_proj", false, false, 2048, 256, 256, 1, 0, 0, 4},
    {"dx c_fc", false, false, 2048, 256, 1024, 1, 0, 0, 4},
    {"dx mlp.c_proj", false, false, 2048, 1024, 256, 1, 0, 0, 4},
    {"dx lm_head", false, false, 2048, 256, 65, 1, 0, 0, 1},
    {"dw c_attn", true, false, 768, 256, 2048, 1, 0, 0, 4},
    {"dw attn.c_proj", true, false, 256, 256, 2048, 1, 0, 0, 4},
    {"dw c_fc", true, false, 1024, 256, 2048, 1, 0, 0, 4},
    {"dw mlp.c_proj", true, false, 256, 1024, 2048, 1, 0, 0, 4},
    {"dw lm_head", true, false, 65, 256, 2048, 1, 0, 0, 1},
    /* attention, per (layer, batch, head, 32-row block): 4 x 64 x 4 blocks
     * a step, each with 3 nt products (scores forward and again backward,
     * dP), 2 nn (y, dq) and 2 tn (dv, dk); the middle block's shapes stand
     * for all (c packed here) */
    {"att S=qk^T", false, true, 32, 64, 64, 0, 768, 768, 4 * 64 * 4 * 3},
    {"att y=Pv", false, false, 32, 64, 64, 0, 64, 768, 4 * 64 * 4 * 2},
    {"att dv+=P^Tdy", true, false, 64, 64, 32, 1, 64, 256, 4 * 64 * 4 * 2},
    {NULL, false, false, 0, 0, 0, 0, 0, 0, 0},
};

/* the vit: rows R = 64 x 65 (64 patches and the class token), width 192,
 * MLP 768, 6 layers; attention non-causal, one block of all 65 query rows
 * per (layer, batch, head): 6 x 64 x 3 blocks a step, 3 nt products (scores
 * forward and again backward, dP), 2 nn (y, dq), 2 tn (dv, dk), reading
 * the packed qkv with its row stride of 576 */
static const shape k_vit[] = {
    {"fwd in_proj", false, true, 4160, 576, 192, 0, 0, 0, 6},
    {"fwd out_proj", false, true, 4160, 192, 192, 0, 0, 0, 6},
    {"fwd mlp.0", false, true, 4160, 768, 192, 0, 0, 0, 6},
    {"fwd mlp.3", false, true, 4160, 192, 768, 0, 0, 0, 6},
    {"dx in_proj", false, false, 4160, 192, 576, 1, 0, 0, 6},
    {"dx out_proj", false, false, 4160, 192, 192, 1, 0, 0, 6},
    {"dx mlp.0", false, false, 4160, 192, 768, 1, 0, 0, 6},
    {"dx mlp.3", false, false, 4160, 768, 192, 1, 0, 0, 6},
    {"dw in_proj", true, false, 576, 192, 4160, 1, 0, 0, 6},
    {"dw out_proj", true, false, 192, 192, 4160, 1, 0, 0, 6},
    {"dw mlp.0", true, false, 768, 192, 4160, 1, 0, 0, 6},
    {"dw mlp.3", true, false, 192, 768, 4160, 1, 0, 0, 6},
    {"att S=qk^T", false, true, 65, 65, 64, 0, 576, 576, 6 * 64 * 3 * 3},
    {"att y=Pv", false, false, 65, 64, 65, 0, 80, 576, 6 * 64 * 3 * 2},
    {"att dv+=P^Tdy", true, false, 65, 64, 65, 1, 80, 192, 6 * 64 * 3 * 2},
    {NULL, false, false, 0, 0, 0, 0, 0, 0, 0},
};

/* the mlp 784-1024-1024-10, batch 256 (the first layer's dx is not needed) */
static const shape k_mlp[] = {
    {"fwd fc1", false, true, 256, 1024, 784, 0, 0, 0, 1},
    {"fwd fc2", false, true, 256, 1024, 1024, 0, 0, 0, 1},
    {"fwd fc3", false, true, 256, 10, 1024, 0, 0, 0, 1},
    {"dx fc2", false, false, 256, 1024, 1024, 1, 0, 0, 1},
    {"dx fc3", false, false, 256, 1024, 10, 1, 0, 0, 1},
    {"dw fc1", true, false, 1024, 784, 256, 1, 0, 0, 1},
    {"dw fc2", true, false, 1024, 1024, 256, 1, 0, 0, 1},
    {"dw fc3", true, false, 10, 1024, 256, 1, 0, 0, 1},
    {NULL, false, false, 0, 0, 0, 0, 0, 0, 0},
};

enum { E_OPENBLAS, E_ONEDNN, E_BLIS, E_SPLIT, NENG };
static const char *const k_eng[NENG] = {"openblas", "onednn", "blis", "split"};

typedef struct {
    const shape *s;
    int lda, ldb;
    float *a, *b, *c;
} operands;

static void sgemm1(const operands *o, int m0, int m1, int n0, int n1) {
    const shape *s = o->s;
    const float *a = s->ta ? o->a + m0 : o->a + (int64_t)m0 * o->lda;
    const float *b = s->tb ? o->b + (int64_t)n0 * o->ldb : o->b + n0;
    cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans,
                m1 - m0, n1 - n0, s->K, 1.0f, a, o->lda, b, o->ldb, s->beta,
                o->c + (int64_t)m0 * s->N + n0, s->N);
}

/* One product on engine e; false when the engine cannot run it. */
static bool run(int e, const operands *o, int threads) {
    const shape *s = o->s;
    switch (e) {
    case E_OPENBLAS: sgemm1(o, 0, s->M, 0, s->N); return true;
    case E_ONEDNN:
        return fg__dnnl_isa() &&
               fg__cpu_gemm_dnnl_f32(s->ta, s->tb, s->M, s->N, s->K, 1.0f, o->a, o->lda, o->b,
                                     o->ldb, s->beta, o->c, s->N) == FG_OK;
    case E_BLIS:
        if (!g_bli_sgemm) return false;
        g_bli_sgemm(s->ta ? 8 : 0, s->tb ? 8 : 0, s->M, s->N, s->K, &(float){1.0f}, o->a, o->lda, 1,
                    o->b, o->ldb, 1, &s->beta, o->c, s->N, 1);
        return true;
    case E_SPLIT:
        if (threads != 2) return false;
            /* OpenBLAS's OpenMP build runs one thread inside a parallel region */
#pragma omp parallel num_threads(2)
        {
            int t = omp_get_thread_num();
            if (s->M >= s->N) {
                int h = (s->M / 2 + 7) / 8 * 8;
                sgemm1(o, t ? h : 0, t ? s->M : h, 0, s->N);
            } else {
                int h = (s->N / 2 + 15) / 16 * 16;
                sgemm1(o, 0, s->M, t ? h : 0, t ? s->N : h);
            }
        }
        return true;
    }
    return false;
}

static float *frand(int64_t n, uint64_t seed) {
    float *p = aligned_alloc(64, (size_t)((n * 4 + 63) / 64 * 64));
    fg_rng_fill_normal(seed, 0, p, n, 0.0f, 0.5f);
    return p;
}

static int cmp_d(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static void bench_set(const char *set, const shape *shapes, int threads) {
    double tot_flops = 0, tot_t[NENG] = {0};
    bool all[NENG] = {true, true, true, true};
    for (const shape *s = shapes; s->name; s++) {
        operands o = {.s = s};
        o.lda = s->lda ? s->lda : s->ta ? s->M : s->K;
        o.ldb = s->ldb ? s->ldb : s->tb ? s->K : s->N;
        int64_t na = (int64_t)(s->ta ? s->K : s->M) * o.lda,
                nb = (int64_t)(s->tb ? s->N : s->K) * o.ldb, nc = (int64_t)s->M * s->N;
        o.a = frand(na, 1);
        o.b = frand(nb, 2);
        o.c = frand(nc, 3);
        float *ref = frand(nc, 4), *c0 = malloc(sizeof(float) * (size_t)nc);
        memcpy(c0, o.c, sizeof(float) * (size_t)nc);
        double flops = 2.0 * s->M * s->N * s->K;
        int reps = (int)fmax(1.0, ceil(MIN_FLOPS / flops));
        double t[NENG][REPS], err[NENG] = {0};
        bool ok[NENG];
        /* one product each from the same c: the check, and the warm-up */
        memcpy(ref, c0, sizeof(float) * (size_t)nc);
        operands oref = o;
        oref.c = ref;
        run(E_OPENBLAS, &oref, threads);
        for (int e = 0; e < NENG; e++) {
            memcpy(o.c, c0, sizeof(float) * (size_t)nc);
            ok[e] = run(e, &o, threads);
            fg_clear_error();
            for (int64_t i = 0; ok[e] && i < nc; i++)
                err[e] = fmax(err[e], fabs((double)o.c[i] - ref[i]) / (1 + fabs((double)ref[i])));
        }
        for (int r = 0; r < REPS; r++)
            for (int e = 0; e < NENG; e++) {
                if (!ok[e]) continue;
                double t0 = fg_time();
                for (int i = 0; i < reps; i++) run(e, &o, threads);
                t[e][r] = (fg_time() - t0) / reps;
            }
        printf("{\"name\": \"gemm_engines\", \"set\": \"%s\", \"shape\": \"%s %c%c%s %dx%dx%d\", "
               "\"threads\": %d",
               set, s->name, s->ta ? 't' : 'n', s->tb ? 't' : 'n', s->beta != 0 ? "+=" : "=", s->M,
               s->N, s->K, threads);
        double emax = 0;
        for (int e = 0; e < NENG; e++) {
            double best = 0; /* the best run */
            if (ok[e]) {
                qsort(t[e], REPS, sizeof(double), cmp_d);
                best = t[e][0];
                tot_t[e] += best * s->per_step;
                emax = fmax(emax, err[e]);
            } else {
                all[e] = false;
            }
            printf(", \"%s\": %.1f", k_eng[e], ok[e] ? flops / best * 1e-9 : 0.0);
        }
        tot_flops += flops * s->per_step;
        printf(", \"max_rel_err\": %.1e}\n", emax);
        fflush(stdout);
        free(o.a), free(o.b), free(o.c), free(ref), free(c0);
    }
    printf("{\"name\": \"gemm_engines_total\", \"set\": \"%s\", \"threads\": %d", set, threads);
    for (int e = 0; e < NENG; e++)
        printf(", \"%s\": %.1f", k_eng[e], all[e] ? tot_flops / tot_t[e] * 1e-9 : 0.0);
    printf(", \"unit\": \"GFLOP/s\", \"step_ms_openblas\": %.2f}\n", tot_t[E_OPENBLAS] * 1e3);
}

/* 2 threads: a linear layer's two backward products, dx = dy w and
 * dw += dy^T x, one after the other on 2 threads each (as fulgur runs them)
 * against one on each thread at once. */
static void bench_pairs(const char *set, const shape *shapes) {
    for (const shape *dx = shapes; dx->name; dx++) {
        if (strncmp(dx->name, "dx ", 3) != 0) continue;
        const shape *dw = NULL;
        for (const shape *s = shapes; s->name; s++)
            if (!strncmp(s->name, "dw ", 3) && !strcmp(s->name + 3, dx->name + 3)) dw = s;
        if (!dw) continue;
        operands ox = {.s = dx, .lda = dx->K, .ldb = dx->N},
                 ow = {.s = dw, .lda = dw->M, .ldb = dw->N};
        ox.a = frand((int64_t)dx->M * dx->K, 1), ox.b = frand((int64_t)dx->K * dx->N, 2);
        ox.c = frand((int64_t)dx->M * dx->N, 3);
        ow.a = frand((int64_t)dw->K * dw->M, 4), ow.b = frand((int64_t)dw->K * dw->N, 5);
        ow.c = frand((int64_t)dw->M * dw->N, 6);
        double seq[REPS], par[REPS];
        for (int r = -1; r < REPS; r++) {
            double t0 = fg_time();
            run(E_OPENBLAS, &ox, 2);
            run(E_OPENBLAS, &ow, 2);
            double t1 = fg_time();
#pragma omp parallel num_threads(2)
            sgemm1(omp_get_thread_num() ? &ow : &ox, 0, omp_get_thread_num() ? dw->M : dx->M, 0,
                   omp_get_thread_num() ? dw->N : dx->N);
            double t2 = fg_time();
            if (r >= 0) seq[r] = t1 - t0, par[r] = t2 - t1;
        }
        qsort(seq, REPS, sizeof(double), cmp_d);
        qsort(par, REPS, sizeof(double), cmp_d);
        double flops = 2.0 * dx->M * dx->N * dx->K + 2.0 * dw->M * dw->N * dw->K;
        printf("{\"name\": \"gemm_engines_pair\", \"set\": \"%s\", \"shape\": \"dx+dw %s\", "
               "\"threads\": 2, \"openblas\": %.1f, \"pair\": %.1f, \"unit\": \"GFLOP/s\"}\n",
               set, dx->name + 3, flops / seq[0] * 1e-9, flops / par[0] * 1e-9);
        fflush(stdout);
        free(ox.a), free(ox.b), free(ox.c), free(ow.a), free(ow.b), free(ow.c);
    }
}

/* y = x w^T + bias: sgemm (beta 0) then fulgur's bias_add, against the
 * bias rows copied into y and sgemm with beta 1. */
static void bench_bias(const char *set, const shape *shapes) {
    for (const shape *s = shapes; s->name; s++) {
        if (strncmp(s->name, "fwd ", 4) != 0 || !strcmp(s->name, "fwd lm_head")) continue;
        operands o = {.s = s, .lda = s->K, .ldb = s->K};
        o.a = frand((int64_t)s->M * s->K, 1), o.b = frand((int64_t)s->N * s->K, 2);
        o.c = frand((int64_t)s->M * s->N, 3);
        float *bias = frand(s->N, 4);
        fg_tensor *ty = fg_tensor_wrap(o.c, FG_F32, 2, (int64_t[]){s->M, s->N});
        fg_tensor *tb = fg_tensor_wrap(bias, FG_F32, 1, (int64_t[]){s->N});
        shape s1 = *s;
        double two[REPS], fused[REPS];
        for (int r = -1; r < REPS; r++) {
            double t0 = fg_time();
            s1.beta = 0;
            o.s = &s1;
            sgemm1(&o, 0, s->M, 0, s->N);
            if (fg__cpu_bias_add(ty, tb) != FG_OK) {
                fprintf(stderr, "gemm_engines: %s\n", fg_last_error());
                exit(1);
            }
            double t1 = fg_time();
            for (int i = 0; i < s->M; i++)
                memcpy(o.c + (int64_t)i * s->N, bias, sizeof(float) * (size_t)s->N);
            s1.beta = 1;
            sgemm1(&o, 0, s->M, 0, s->N);
            double t2 = fg_time();
            if (r >= 0) two[r] = t1 - t0, fused[r] = t2 - t1;
        }
        qsort(two, REPS, sizeof(double), cmp_d);
        qsort(fused, REPS, sizeof(double), cmp_d);
        printf("{\"name\": \"gemm_engines_bias\", \"set\": \"%s\", \"shape\": \"%s %dx%dx%d\", "
               "\"threads\": %d, \"sgemm_then_bias_add_ms\": %.3f, \"fused_ms\": %.3f, "
               "\"saved_ms\": %.3f}\n",
               set, s->name, s->M, s->N, s->K, fg_get_num_threads(), two[0] * 1e3, fused[0] * 1e3,
               (two[0] - fused[0]) * 1e3);
        fflush(stdout);
        fg_tensor_free(ty), fg_tensor_free(tb);
        free(o.a), free(o.b), free(o.c), free(bias);
    }
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    const char *only = argc > 2 ? argv[2] : "";
    /* the engines are compared on the threads asked for, even while other
     * processes keep cores busy (fulgur would then run fewer) */
    setenv("FULGUR_ADAPT_THREADS", "0", 1);
    if (fg_set_num_threads(threads) != FG_OK) {
        fprintf(stderr, "gemm_engines: %s\n", fg_last_error());
        return 1;
    }
    fg_get_num_threads(); /* applies the count to OpenMP and OpenBLAS */
    open_blis(threads);
    fprintf(stderr,
            "gemm_engines: %d thread(s); openblas %s (%s); onednn %s; blis %s "
            "(BLIS_ARCH_TYPE=%s)\n",
            threads, openblas_get_corename(), openblas_get_config(),
            fg__dnnl_isa() ? fg__dnnl_isa() : "none", g_blis_arch,
            getenv("BLIS_ARCH_TYPE") ? getenv("BLIS_ARCH_TYPE") : "unset");
    if (!*only || !strcmp(only, "gpt")) bench_set("gpt", k_gpt, threads);
    if (!*only || !strcmp(only, "mlp")) bench_set("mlp", k_mlp, threads);
    if (!*only || !strcmp(only, "vit")) bench_set("vit", k_vit, threads);
    if (!*only || !strcmp(only, "gpt")) bench_bias("gpt", k_gpt);
    if (!*only || !strcmp(only, "mlp")) bench_bias("mlp", k_mlp);
    if (threads == 2 && (!*only || !strcmp(only, "gpt"))) bench_pairs("gpt", k_gpt);
    if (threads == 2 && (!*only || !strcmp(only, "mlp"))) bench_pairs("mlp", k_mlp);
    return 0;
}
