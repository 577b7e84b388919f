/* Speed of the CUDA op table's kernels at large shapes against the GPU's
 * own copy bandwidth measured in the same run (a device-to-device copy of
 * 1 GiB), and of its bf16 and f32 products against their peak: the
 * fulgur side of scripts/gpu-check.sh. Each case runs REPS times after a
 * warm-up; the best time counts. GB/s counts the bytes a kernel must read
 * and write once.
 *
 *   gpu_ops_bench
 *
 * Prints one JSON line per case: {"name", "ms", "GB/s", "of_copy"} (or
 * "TFLOP/s" for products). Without a GPU it says why and exits 2. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fulgur/fulgur.h"

#define REPS 10

static fg_dev *g_dev;
static const fg_op_table *G;

static fg_tensor *t_new(fg_dtype dt, int nd, const int64_t *sh) {
    fg_tensor *t = fg_tensor_new_on(g_dev, dt, nd, sh);
    if (!t) {
        fprintf(stderr, "gpu_ops_bench: %s\n", fg_last_error());
        exit(1);
    }
    return t;
}

typedef fg_status (*case_fn)(void *);

/* the best of REPS runs, in ms, after one warm-up */
static double best_ms(case_fn f, void *arg) {
    double best = INFINITY;
    for (int r = 0; r <= REPS; r++) {
        if (fg_dev_synchronize(g_dev) != FG_OK) break;
        double t0 = fg_time();
        fg_status s = f(arg);
        if (s == FG_OK) s = fg_dev_synchronize(g_dev);
        if (s != FG_OK) {
            fprintf(stderr, "gpu_ops_bench: %s\n", fg_last_error());
            return NAN;
        }
        double ms = (fg_time() - t0) * 1e3;
        if (r && ms < best) best = ms;
    }
    return best;
}

typedef struct args {
    fg_tensor *a, *b, *c, *d, *e, *f;
    int64_t n;
    void *pa, *pb;
} args;

static fg_status c_copy(void *p) {
    args *a = p;
    return fg_dev_copy_d2d(g_dev, a->pb, a->pa, (size_t)a->n * 4);
}
static fg_status c_add(void *p) {
    args *a = p;
    return G->binary(FG_BIN_ADD, a->a, a->b, a->c);
}
static fg_status c_axpby(void *p) {
    args *a = p;
    return G->axpby(0.5, a->a, 0.5, a->b);
}
static fg_status c_gelu(void *p) {
    args *a = p;
    return G->gelu_fwd(a->a, a->c);
}
static fg_status c_gelu_bwd(void *p) {
    args *a = p;
    return G->gelu_bwd(a->a, a->b, a->c);
}
static fg_status c_dropout(void *p) {
    args *a = p;
    return G->dropout_fwd(a->a, 0.1, 7, 0, a->c);
}
static fg_status c_softmax(void *p) {
    args *a = p;
    return G->softmax_fwd(a->a, a->c);
}
static fg_status c_layernorm(void *p) {
    args *a = p;
    return G->layernorm_fwd(a->a, a->d, a->e, 1e-5, a->c, a->f, a->b);
}
static fg_status c_sum(void *p) {
    args *a = p;
    double s;
    return G->sumsq_all(a->a, &s);
}
static fg_status c_matmul(void *p) {
    args *a = p;
    return G->matmul(a->a, false, a->b, false, a->c, 1, 0);
}

static void line(const char *name, double ms, double bytes, double copy_gbps) {
    double gbps = bytes / (ms * 1e-3) / 1e9;
    printf("{\"name\": \"%s\", \"ms\": %.4f, \"GB/s\": %.1f, \"of_copy\": %.2f}\n", name, ms, gbps,
           copy_gbps > 0 ? gbps / copy_gbps : 0);
}

int main(void) {
    g_dev = fg_dev_open("cuda:0", NULL);
    if (!g_dev) {
        fprintf(stderr, "gpu_ops_bench: %s\n", fg_last_error());
        return 2;
    }
    G = fg_ops_get(FG_CUDA);
    int64_t n = (int64_t)1 << 28, R = 65536, C = 4096; /* 1 GiB of f32; R x C = n */
    int64_t sh[1] = {n}, rc[2] = {R, C}, cv[1] = {C}, rv[1] = {R};
    args a = {0};
    a.n = n;
    a.a = t_new(FG_F32, 1, sh);
    a.b = t_new(FG_F32, 1, sh);
    a.c = t_new(FG_F32, 1, sh);
    a.pa = fg_tensor_data(a.a);
    a.pb = fg_tensor_data(a.b);
    double copy_ms = best_ms(c_copy, &a), copy = 2.0 * (double)n * 4 / (copy_ms * 1e-3) / 1e9;
    line("copy_d2d", copy_ms, 2.0 * (double)n * 4, copy);
    line("binary_add", best_ms(c_add, &a), 3.0 * (double)n * 4, copy);
    line("axpby", best_ms(c_axpby, &a), 3.0 * (double)n * 4, copy);
    line("gelu_fwd", best_ms(c_gelu, &a), 2.0 * (double)n * 4, copy);
    line("gelu_bwd", best_ms(c_gelu_bwd, &a), 4.0 * (double)n * 4, copy);
    line("dropout_fwd", best_ms(c_dropout, &a), 2.0 * (double)n * 4, copy);
    line("sumsq_all", best_ms(c_sum, &a), 1.0 * (double)n * 4, copy);
    fg_tensor *ra = t_new(FG_F32, 2, rc), *rcc = t_new(FG_F32, 2, rc);
    args r = {.a = ra,
              .c = rcc,
              .d = t_new(FG_F32, 1, cv),
              .e = t_new(FG_F32, 1, cv),
              .f = t_new(FG_F32, 1, rv),
              .b = t_new(FG_F32, 1, rv)};
    line("softmax_fwd", best_ms(c_softmax, &r), 2.0 * (double)n * 4, copy);
    line("layernorm_fwd", best_ms(c_layernorm, &r), 2.0 * (double)n * 4, copy);
    fg_dtype dts[2] = {FG_BF16, FG_F32};
    for (int k = 0; k < 2; k++) {
        int64_t m = 8192, ms[2] = {m, m};
        args p = {.a = t_new(dts[k], 2, ms), .b = t_new(dts[k], 2, ms), .c = t_new(dts[k], 2, ms)};
        double t = best_ms(c_matmul, &p);
        printf("{\"name\": \"matmul_%s_8192\", \"ms\": %.3f, \"TFLOP/s\": %.1f}\n",
               fg_dtype_name(dts[k]), t, 2.0 * (double)m * m * m / (t * 1e-3) / 1e12);
        fg_tensor_free(p.a), fg_tensor_free(p.b), fg_tensor_free(p.c);
    }
    fg_tensor *all[] = {a.a, a.b, a.c, ra, rcc, r.d, r.e, r.f, r.b};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) fg_tensor_free(all[i]);
    fg_dev_close(g_dev);
    return 0;
}
