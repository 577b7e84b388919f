/* Speed of the non-matmul kernels at GPT training sizes ((B*T) = 2048 rows,
 * C = 256, 4C = 1024, V = 65 and 512; attention at B 16, T 128, C 256, 4
 * heads; an AdamW step over 1 Mi and 8 Mi parameters) on every vector ISA
 * path this CPU runs (fg_set_cpu_isa: scalar, avx2, avx512),
 * against the same ops written the plain way, as llm.c's CPU reference does
 * them (scalar tanhf/expf/logf, float sums, one fg_rng_u32_at per dropout
 * element), built with the same flags. Both sides run on the same thread
 * count (OpenMP over rows where llm.c has it; the baselines get `omp
 * parallel for` over rows too).
 *
 *   ops_bench [--isa scalar|avx2|avx512|all] [threads [filter]]
 *
 * Defaults: every path the CPU has, 1 thread, every case. Prints one JSON
 * line per case and path:
 *   {"name": ..., "isa": ..., "fulgur_ms": ..., "GB/s": ..., "baseline_ms": ..., "speedup": b/f}
 * ("isa": "-" for a kernel with one path only), then a table of GB/s by
 * path, each line starting with '#'. GB/s counts the bytes the kernel must
 * read and write once. The paths and the baseline take turns, REPS rounds;
 * the best run of each counts (a busy machine only ever adds time).
 *
 * The memory bandwidth each case is held to: a copy of half its bytes
 * (memcpy: as many bytes read as written, from buffers as large as the
 * case's), on the same threads, timed in the same rounds; the table gives
 * it ("copy") and each path's share of it.
 *
 * The compute bound of a kernel whose arithmetic, not memory, limits it:
 * the time its core primitive alone takes on the same path and threads,
 * for the count the kernel needs, on data in L1 (fg_ops_cpu_exp over 2048
 * floats a thread, again and again: one exp an element for GELU, softmax,
 * log_softmax, two for cross-entropy's forward and backward; dropout:
 * fg_ops_cpu_philox_xor, one Philox draw an element, made in registers and
 * never stored). The kernel cannot beat the slower of the copy and that
 * bound, so "held" = max(copy time, bound time) / kernel time is its share
 * of what it could reach ("bound" alone: of the arithmetic; no bound: held
 * is the copy's share). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fulgur/fulgur.h"

#define REPS 15

static const fg_op_table *ops;

/* A case's kernel failed: its times would measure nothing. */
static void ok(fg_status s) {
    if (s == FG_OK) return;
    fprintf(stderr, "ops_bench: %s\n", fg_last_error());
    exit(1);
}

/* the paths to time, in order */
static fg_isa g_paths[FG_ISA_COUNT];
static int g_npaths;

/* the table printed at the end: GB/s of each case on each path */
typedef struct {
    char name[32], shape[32];
    double gbs[FG_ISA_COUNT];  /* 0: not run */
    double held[FG_ISA_COUNT]; /* max(copy, bound time) / kernel time */
    double copy_gbs;           /* the memory bandwidth at this size */
    bool one_path;
} row;
static row g_rows[64];
static int g_nrows;

/* a path main() found usable (or FG_ISA_AUTO): a failure is a bench bug */
static void set_isa(fg_isa isa) {
    if (fg_set_cpu_isa(isa) != FG_OK) {
        fprintf(stderr, "ops_bench: %s\n", fg_last_error());
        exit(1);
    }
}

static fg_tensor *randn(int nd, const int64_t *s, uint64_t seed, float scale) {
    fg_tensor *t = fg_tensor_new(FG_F32, nd, s);
    fg_rng_fill_normal(seed, 0, fg_tensor_data(t), fg_tensor_numel(t), 0.0f, scale);
    return t;
}
static float *F(fg_tensor *t) { return fg_tensor_data(t); }

typedef void (*run_fn)(void *ctx);

/* the copy that measures memory bandwidth: bytes / 2 from src to dst, the
 * threads each copying a slice */
static char *g_src, *g_dst;
static size_t g_copy_cap;
static void copy_ref(void *p) {
    size_t half = *(const size_t *)p, nth = (size_t)fg_get_num_threads();
    size_t part = (half / nth + 63) / 64 * 64;
#pragma omp parallel for num_threads(nth) schedule(static)
    for (size_t t = 0; t < nth; t++) {
        size_t a = t * part, b = a + part < half ? a + part : half;
        if (a < b) memcpy(g_dst + a, g_src + a, b - a);
    }
}

/* ------------------------------------------------------- compute bounds */

typedef enum { BOUND_NONE, BOUND_EXP, BOUND_PHILOX } bound_kind;
static const char *const BOUND_NAME[] = {"-", "exp", "philox"};

/* what a case's bound runs: per primitive of `kind`, `units` of them */
typedef struct {
    bound_kind kind;
    double units;
} bound;

#define L1_N 2048 /* floats a thread: 8 KiB in, 8 KiB out */
#define MAX_TH 64
static float g_l1[MAX_TH][2 * L1_N] __attribute__((aligned(64)));
static volatile uint32_t g_sink;

static void bound_run(void *p) {
    const bound *b = p;
    int nth = fg_get_num_threads();
    if (nth > MAX_TH) nth = MAX_TH;
    int64_t per = (int64_t)(b->units / nth + 0.5);
#pragma omp parallel for num_threads(nth) schedule(static)
    for (int t = 0; t < nth; t++) {
        if (b->kind == BOUND_EXP) {
            for (int64_t d = 0; d < per; d += L1_N) {
                int64_t k = per - d < L1_N ? per - d : L1_N;
                if (fg_ops_cpu_exp(g_l1[t], g_l1[t] + L1_N, k) != FG_OK) abort();
            }
        } else {
            uint32_t x = 0;
            if (fg_ops_cpu_philox_xor(42, (uint64_t)t << 40, per, &x) != FG_OK) abort();
            g_sink ^= x;
        }
    }
}

/* the step arena is reset before each call, as a training step resets it:
 * an op that takes scratch from it (cross-entropy's row losses, the
 * layernorm backward's partial sums) reuses the pages it touched instead
 * of faulting in fresh ones on every call of the run */
static void timed(run_fn f, void *ctx, double *best) {
    fg_step_reset();
    double t0 = fg_time();
    f(ctx);
    double dt = fg_time() - t0;
    if (dt < *best) *best = dt;
}

/* Times fu on every path (one_path: once, on the default path) and base
 * (may be NULL), taking turns; prints a JSON line per path and keeps a row
 * of the table. */
static void emit_paths(const char *name, const char *shape, run_fn fu, run_fn base, void *ctx,
                       double bytes, bool one_path, bound bd) {
    int np = one_path ? 1 : g_npaths;
    double tf[FG_ISA_COUNT], tbd[FG_ISA_COUNT], tb = 1e30, tc = 1e30;
    size_t half = (size_t)(bytes / 2);
    if (half > g_copy_cap) {
        free(g_src);
        free(g_dst);
        g_src = malloc(half);
        g_dst = malloc(half);
        memset(g_src, 1, half);
        memset(g_dst, 2, half);
        g_copy_cap = half;
    }
    copy_ref(&half);
    for (int k = 0; k < np; k++) {
        tf[k] = tbd[k] = 1e30;
        set_isa(one_path ? FG_ISA_AUTO : g_paths[k]);
        fu(ctx); /* warm-up: first touch, thread start */
    }
    if (base) base(ctx);
    for (int r = 0; r < REPS; r++) {
        for (int k = 0; k < np; k++) {
            set_isa(one_path ? FG_ISA_AUTO : g_paths[k]);
            timed(fu, ctx, &tf[k]);
            if (bd.kind != BOUND_NONE) timed(bound_run, &bd, &tbd[k]);
        }
        if (base) timed(base, ctx, &tb);
        timed(copy_ref, &half, &tc);
    }
    set_isa(FG_ISA_AUTO);
    row *w = g_nrows < 64 ? &g_rows[g_nrows++] : NULL;
    if (w) {
        memset(w, 0, sizeof *w);
        snprintf(w->name, sizeof w->name, "%s", name);
        snprintf(w->shape, sizeof w->shape, "%s", shape);
        w->one_path = one_path;
        w->copy_gbs = bytes / tc * 1e-9;
    }
    for (int k = 0; k < np; k++) {
        const char *isa = one_path ? "-" : fg_isa_name(g_paths[k]);
        printf("{\"name\": \"%s\", \"shape\": \"%s\", \"isa\": \"%s\", \"threads\": %d, "
               "\"fulgur_ms\": %.4f, \"GB/s\": %.1f",
               name, shape, isa, fg_get_num_threads(), tf[k] * 1e3, bytes / tf[k] * 1e-9);
        if (base) printf(", \"baseline_ms\": %.4f, \"speedup\": %.2f", tb * 1e3, tb / tf[k]);
        printf(", \"copy_GB/s\": %.1f, \"of_copy\": %.2f", bytes / tc * 1e-9, tc / tf[k]);
        double held = tc / tf[k];
        if (bd.kind != BOUND_NONE) {
            printf(", \"bound\": \"%s x %.0f\", \"bound_ms\": %.4f, \"of_bound\": %.2f",
                   BOUND_NAME[bd.kind], bd.units, tbd[k] * 1e3, tbd[k] / tf[k]);
            if (tbd[k] > tc) held = tbd[k] / tf[k];
        }
        printf(", \"held\": %.2f}\n", held);
        if (w) {
            w->gbs[one_path ? 0 : g_paths[k]] = bytes / tf[k] * 1e-9;
            w->held[one_path ? 0 : g_paths[k]] = held;
        }
    }
    fflush(stdout);
}

static void emit(const char *name, const char *shape, run_fn fu, run_fn base, void *ctx,
                 double bytes) {
    emit_paths(name, shape, fu, base, ctx, bytes, false, (bound){BOUND_NONE, 0});
}

/* the same, held to a compute bound too */
static void emit_b(const char *name, const char *shape, run_fn fu, run_fn base, void *ctx,
                   double bytes, bound_kind kind, double units) {
    emit_paths(name, shape, fu, base, ctx, bytes, false, (bound){kind, units});
}

/* ------------------------------------------------------------------ cases */

typedef struct {
    int64_t N, C, V;
    fg_tensor *x, *y, *dy, *dx, *w, *b, *dw, *db, *mean, *rstd, *idx, *tgt, *loss, *wte;
    int64_t count;
} ctx;

static void ln_fwd(void *p) {
    ctx *c = p;
    ok(ops->layernorm_fwd(c->x, c->w, c->b, 1e-5, c->y, c->mean, c->rstd));
}
static void ln_bwd(void *p) {
    ctx *c = p;
    ok(ops->layernorm_bwd(c->x, c->w, c->mean, c->rstd, c->dy, c->dx, c->dw, c->db));
}
/* llm.c layernorm_forward / layernorm_backward */
static void ln_fwd_base(void *p) {
    ctx *c = p;
    int64_t N = c->N, C = c->C;
    float *x = F(c->x), *y = F(c->y), *w = F(c->w), *b = F(c->b), *m = F(c->mean), *rs = F(c->rstd);
#pragma omp parallel for
    for (int64_t i = 0; i < N; i++) {
        float *xi = x + i * C, mu = 0, v = 0;
        for (int64_t j = 0; j < C; j++) mu += xi[j];
        mu /= C;
        for (int64_t j = 0; j < C; j++) v += (xi[j] - mu) * (xi[j] - mu);
        v /= C;
        float s = 1.0f / sqrtf(v + 1e-5f);
        for (int64_t j = 0; j < C; j++) y[i * C + j] = s * (xi[j] - mu) * w[j] + b[j];
        m[i] = mu;
        rs[i] = s;
    }
}
static void ln_bwd_base(void *p) {
    ctx *c = p;
    int64_t N = c->N, C = c->C;
    float *x = F(c->x), *dy = F(c->dy), *dx = F(c->dx), *w = F(c->w), *dw = F(c->dw),
          *db = F(c->db), *m = F(c->mean), *rs = F(c->rstd);
    for (int64_t i = 0; i < N; i++) { /* llm.c: serial (dw/db are shared) */
        float *xi = x + i * C, *g = dy + i * C, *d = dx + i * C, dn = 0, dnx = 0;
        for (int64_t j = 0; j < C; j++) {
            float nh = (xi[j] - m[i]) * rs[i], dnorm = w[j] * g[j];
            dn += dnorm;
            dnx += dnorm * nh;
        }
        dn /= C;
        dnx /= C;
        for (int64_t j = 0; j < C; j++) {
            float nh = (xi[j] - m[i]) * rs[i], dnorm = w[j] * g[j];
            db[j] += g[j];
            dw[j] += nh * g[j];
            d[j] += (dnorm - dn - nh * dnx) * rs[i];
        }
    }
}

static void gelu_fwd(void *p) {
    ctx *c = p;
    ok(ops->gelu_fwd(c->x, c->y));
}
static void gelu_bwd(void *p) {
    ctx *c = p;
    ok(ops->gelu_bwd(c->x, c->dy, c->dx));
}
static void gelu_erf_fwd(void *p) {
    ctx *c = p;
    ok(ops->unary_fwd(FG_UN_GELU_ERF, c->x, 0, 0, c->y));
}
static void gelu_erf_bwd(void *p) {
    ctx *c = p;
    ok(ops->unary_bwd(FG_UN_GELU_ERF, c->x, c->y, c->dy, 0, 0, c->dx));
}
/* exact GELU the plain way: x (1 + erf(x / sqrt 2)) / 2 */
static void gelu_erf_fwd_base(void *p) {
    ctx *c = p;
    int64_t n = fg_tensor_numel(c->x);
    float *x = F(c->x), *y = F(c->y);
#pragma omp parallel for
    for (int64_t i = 0; i < n; i++) y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678f));
}
static void gelu_erf_bwd_base(void *p) {
    ctx *c = p;
    int64_t n = fg_tensor_numel(c->x);
    float *x = F(c->x), *dy = F(c->dy), *dx = F(c->dx);
#pragma omp parallel for
    for (int64_t i = 0; i < n; i++) {
        float v = x[i], cdf = 0.5f * (1.0f + erff(v * 0.70710678f));
        dx[i] += dy[i] * (cdf + v * 0.39894228f * expf(-0.5f * v * v));
    }
}
#define GS 0.7978845608f
static void gelu_fwd_base(void *p) {
    ctx *c = p;
    int64_t n = fg_tensor_numel(c->x);
    float *x = F(c->x), *y = F(c->y);
#pragma omp parallel for
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + tanhf(GS * (v + 0.044715f * v * v * v)));
    }
}
static void gelu_bwd_base(void *p) {
    ctx *c = p;
    int64_t n = fg_tensor_numel(c->x);
    float *x = F(c->x), *dy = F(c->dy), *dx = F(c->dx);
#pragma omp parallel for
    for (int64_t i = 0; i < n; i++) {
        float v = x[i], cube = 0.044715f * v * v * v, arg = GS * (v + cube);
        float t = tanhf(arg), ch = coshf(arg), sech2 = 1.0f / (ch * ch);
        float g = 0.5f * (1.0f + t) + v * 0.5f * sech2 * GS * (1.0f + 3.0f * 0.044715f * v * v);
        dx[i] += g * dy[i];
    }
}

/* the pair training runs (fn_loss.c): the backward from the forward's row
 * maxes and sums (c->mean, (2, N) f64) */
static void ce(void *p) {
    ctx *c = p;
    ok(ops->cross_entropy_fwd_stats(c->x, c->tgt, -100, c->loss, &c->count, c->mean));
    ok(ops->cross_entropy_bwd_stats(c->x, c->tgt, c->mean, -100, 1.0, c->count, c->dx));
}
/* llm.c: softmax into probs, then -log(probs[t]), then dlogits from probs */
static void ce_base(void *p) {
    ctx *c = p;
    int64_t N = c->N, V = c->V;
    float *x = F(c->x), *pr = F(c->y), *dx = F(c->dx);
    const int32_t *t = fg_tensor_data(c->tgt);
    double loss = 0;
#pragma omp parallel for reduction(+ : loss)
    for (int64_t i = 0; i < N; i++) {
        float *xi = x + i * V, *pi = pr + i * V, mx = -INFINITY, s = 0;
        for (int64_t j = 0; j < V; j++) mx = xi[j] > mx ? xi[j] : mx;
        for (int64_t j = 0; j < V; j++) s += pi[j] = expf(xi[j] - mx);
        for (int64_t j = 0; j < V; j++) pi[j] /= s;
        loss += -logf(pi[t[i]]);
        for (int64_t j = 0; j < V; j++) dx[i * V + j] += (pi[j] - (j == t[i])) / (float)N;
    }
    *F(c->loss) = (float)(loss / N);
}

static void sm_fwd(void *p) {
    ctx *c = p;
    ok(ops->softmax_fwd(c->x, c->y));
}
static void sm_fwd_base(void *p) {
    ctx *c = p;
    int64_t N = c->N, C = c->C;
    float *x = F(c->x), *y = F(c->y);
#pragma omp parallel for
    for (int64_t i = 0; i < N; i++) {
        float *xi = x + i * C, *yi = y + i * C, mx = -INFINITY, s = 0;
        for (int64_t j = 0; j < C; j++) mx = xi[j] > mx ? xi[j] : mx;
        for (int64_t j = 0; j < C; j++) s += yi[j] = expf(xi[j] - mx);
        for (int64_t j = 0; j < C; j++) yi[j] /= s;
    }
}

static void emb_fwd(void *p) {
    ctx *c = p;
    ok(ops->embedding_fwd(c->idx, c->wte, c->y));
}
static void emb_bwd(void *p) {
    ctx *c = p;
    ok(ops->embedding_bwd(c->idx, c->dy, c->dw));
}
static void emb_fwd_base(void *p) {
    ctx *c = p;
    const int32_t *ix = fg_tensor_data(c->idx);
    float *w = F(c->wte), *y = F(c->y);
    for (int64_t i = 0; i < c->N; i++) memcpy(y + i * c->C, w + ix[i] * c->C, 4 * (size_t)c->C);
}
static void emb_bwd_base(void *p) {
    ctx *c = p;
    const int32_t *ix = fg_tensor_data(c->idx);
    float *dw = F(c->dw), *dy = F(c->dy);
    for (int64_t i = 0; i < c->N; i++)
        for (int64_t j = 0; j < c->C; j++) dw[ix[i] * c->C + j] += dy[i * c->C + j];
}

static void drop_fwd(void *p) {
    ctx *c = p;
    ok(ops->dropout_fwd(c->x, 0.1, 42, 1000, c->y));
}
static void drop_fwd_base(void *p) {
    ctx *c = p;
    int64_t n = fg_tensor_numel(c->x);
    float *x = F(c->x), *y = F(c->y), sc = 1.0f / 0.9f;
#pragma omp parallel for
    for (int64_t i = 0; i < n; i++)
        y[i] = fg_rng_u32_at(42, 1000 + (uint64_t)i) >= 429496730u ? x[i] * sc : 0.0f;
}

static void sum0(void *p) {
    ctx *c = p;
    ok(ops->sum_dim(c->x, 0, c->db, 1.0));
}
static void sum0_base(void *p) {
    ctx *c = p;
    float *x = F(c->x), *o = F(c->db);
    memset(o, 0, 4 * (size_t)c->C);
    for (int64_t i = 0; i < c->N; i++)
        for (int64_t j = 0; j < c->C; j++) o[j] += x[i * c->C + j];
}

static void bias_add(void *p) {
    ctx *c = p;
    ok(ops->bias_add(c->y, c->b));
}
static void bias_grad(void *p) {
    ctx *c = p;
    ok(ops->bias_grad(c->dy, c->db));
}
static void add(void *p) {
    ctx *c = p;
    ok(ops->binary(FG_BIN_ADD, c->x, c->dy, c->y));
}
static void axpy(void *p) {
    ctx *c = p;
    ok(ops->axpby(0.5, c->dy, 1.0, c->y));
}
static void relu_fwd(void *p) {
    ctx *c = p;
    ok(ops->relu_fwd(c->x, c->y));
}
static void sm_bwd(void *p) {
    ctx *c = p;
    ok(ops->softmax_bwd(c->y, c->dy, c->dx));
}
static void lsm_fwd(void *p) {
    ctx *c = p;
    ok(ops->log_softmax_fwd(c->x, c->y));
}
static void lsm_bwd(void *p) {
    ctx *c = p;
    ok(ops->log_softmax_bwd(c->y, c->dy, c->dx));
}
static void drop_bwd(void *p) {
    ctx *c = p;
    ok(ops->dropout_bwd(c->dy, 0.1, 42, 1000, c->dx));
}

/* causal attention on qkv (B, T, 3C) */
typedef struct {
    int heads;
    fg_tensor *qkv, *y, *lse, *dy, *dqkv;
} att_ctx;
static void att_fwd(void *p) {
    att_ctx *a = p;
    ok(ops->attention_fwd(a->qkv, a->heads, true, NULL, a->y, a->lse));
}
static void att_bwd(void *p) {
    att_ctx *a = p;
    ok(ops->attention_bwd(a->qkv, a->heads, true, NULL, a->y, a->lse, a->dy, a->dqkv));
}

/* One AdamW step over a linear layer's weight: the update kernel
 * (optim/kernels.c) over the flat buffers, through the public API */
static void adamw(void *p) {
    if (fg_optimizer_step(p) != FG_OK) {
        fprintf(stderr, "ops_bench: %s\n", fg_last_error());
        exit(1);
    }
}

static bool want(const char *filter, const char *name) { return !filter || strstr(name, filter); }

static bool parse_isa(const char *v) {
    g_npaths = 0;
    for (int l = FG_ISA_SCALAR; l < FG_ISA_COUNT; l++) {
        fg_isa isa = (fg_isa)l;
        if (strcmp(v, "all") && strcmp(v, fg_isa_name(isa))) continue;
        if (fg_set_cpu_isa(isa) != FG_OK) {
            fprintf(stderr, "ops_bench: %s\n", fg_last_error());
            if (strcmp(v, "all")) return false;
            continue;
        }
        g_paths[g_npaths++] = isa;
    }
    set_isa(FG_ISA_AUTO);
    if (!g_npaths)
        fprintf(stderr, "ops_bench: --isa %s: expected scalar, avx2, avx512 or all\n", v);
    return g_npaths > 0;
}

static void print_table(void) {
    printf("# GB/s (%% of the copy's, %% held: of the slower of the copy and the compute "
           "bound), best of %d, %d thread(s); a kernel with one path only shows it under %s\n",
           REPS, fg_get_num_threads(), fg_isa_name(g_paths[0]));
    printf("# %-22s %-14s %6s", "kernel", "shape", "copy");
    for (int k = 0; k < g_npaths; k++) printf(" %19s", fg_isa_name(g_paths[k]));
    printf("\n");
    for (int i = 0; i < g_nrows; i++) {
        const row *w = &g_rows[i];
        printf("# %-22s %-14s %6.1f", w->name, w->shape, w->copy_gbs);
        for (int k = 0; k < g_npaths; k++) {
            int p = w->one_path ? 0 : g_paths[k];
            double g = w->gbs[p];
            if (w->one_path && k) printf(" %19s", "-");
            else printf(" %6.1f (%3.0f%%, %3.0f%%)", g, 100 * g / w->copy_gbs, 100 * w->held[p]);
        }
        printf("\n");
    }
}

int main(int argc, char **argv) {
    const char *pos[2] = {NULL, NULL}, *isa = "all";
    for (int i = 1, np = 0; i < argc; i++) {
        if (strcmp(argv[i], "--isa") == 0 && i + 1 < argc) isa = argv[++i];
        else if (np < 2) pos[np++] = argv[i];
    }
    if (!parse_isa(isa)) return 2;
    int threads = pos[0] ? atoi(pos[0]) : 1;
    const char *filter = pos[1];
    if (fg_set_num_threads(threads) != FG_OK) {
        fprintf(stderr, "%s\n", fg_last_error());
        return 1;
    }
    ops = fg_ops_get(FG_CPU);
    for (int t = 0; t < MAX_TH; t++) /* exp's inputs: x - max, in [-16, 0) */
        for (int i = 0; i < L1_N; i++) g_l1[t][i] = -16.0f * (float)((i * 7919) % L1_N) / L1_N;
    int64_t N = 2048;
    for (int k = 0; k < 2; k++) {
        int64_t C = k ? 1024 : 256, s[] = {N, C};
        ctx c = {.N = N, .C = C};
        c.x = randn(2, s, 1, 1.5f);
        c.y = randn(2, s, 2, 1);
        c.dy = randn(2, s, 3, 1);
        c.dx = randn(2, s, 4, 1);
        c.w = randn(1, &C, 5, 1);
        c.b = randn(1, &C, 6, 1);
        c.dw = randn(1, &C, 7, 1);
        c.db = randn(1, &C, 8, 1);
        c.mean = randn(1, &N, 9, 1);
        c.rstd = randn(1, &N, 10, 1);
        char shape[64];
        snprintf(shape, sizeof shape, "(%lld, %lld)", (long long)N, (long long)C);
        double nb = 4.0 * (double)(N * C), ne = (double)(N * C);
        if (want(filter, "layernorm")) {
            emit("layernorm_fwd", shape, ln_fwd, ln_fwd_base, &c, 2 * nb);
            emit("layernorm_bwd", shape, ln_bwd, ln_bwd_base, &c, 4 * nb);
        }
        if (want(filter, "gelu")) {
            emit_b("gelu_fwd", shape, gelu_fwd, gelu_fwd_base, &c, 2 * nb, BOUND_EXP, ne);
            emit_b("gelu_bwd", shape, gelu_bwd, gelu_bwd_base, &c, 4 * nb, BOUND_EXP, ne);
            emit_b("gelu_erf_fwd", shape, gelu_erf_fwd, gelu_erf_fwd_base, &c, 2 * nb, BOUND_EXP,
                   ne);
            emit_b("gelu_erf_bwd", shape, gelu_erf_bwd, gelu_erf_bwd_base, &c, 4 * nb, BOUND_EXP,
                   2 * ne);
        }
        if (want(filter, "softmax")) {
            emit_b("softmax_fwd", shape, sm_fwd, sm_fwd_base, &c, 2 * nb, BOUND_EXP, ne);
            emit("softmax_bwd", shape, sm_bwd, NULL, &c, 4 * nb);
            emit_b("log_softmax_fwd", shape, lsm_fwd, NULL, &c, 2 * nb, BOUND_EXP, ne);
            emit_b("log_softmax_bwd", shape, lsm_bwd, NULL, &c, 4 * nb, BOUND_EXP, ne);
        }
        if (want(filter, "dropout")) {
            emit_b("dropout_fwd", shape, drop_fwd, drop_fwd_base, &c, 2 * nb, BOUND_PHILOX, ne);
            emit_b("dropout_bwd", shape, drop_bwd, NULL, &c, 3 * nb, BOUND_PHILOX, ne);
        }
        if (want(filter, "sum_dim")) emit("sum_dim0", shape, sum0, sum0_base, &c, nb);
        if (want(filter, "elementwise")) {
            emit("bias_add", shape, bias_add, NULL, &c, 2 * nb);
            emit("bias_grad", shape, bias_grad, NULL, &c, nb);
            emit("add", shape, add, NULL, &c, 3 * nb);
            emit("axpy", shape, axpy, NULL, &c, 3 * nb);
            emit("relu_fwd", shape, relu_fwd, NULL, &c, 2 * nb);
        }
        if (!k && want(filter, "embedding")) {
            int64_t V = 65, es[] = {V, C};
            c.wte = randn(2, es, 11, 1);
            c.dw = fg_tensor_new(FG_F32, 2, es);
            c.idx = fg_tensor_new(FG_I32, 1, &N);
            int32_t *ix = fg_tensor_data(c.idx);
            for (int64_t i = 0; i < N; i++) ix[i] = (int32_t)(i * 7919 % V);
            emit_paths("embedding_fwd", shape, emb_fwd, emb_fwd_base, &c, 2 * nb, true,
                       (bound){BOUND_NONE, 0});
            emit("embedding_bwd", shape, emb_bwd, emb_bwd_base, &c, 2 * nb);
        }
    }
    for (int k = 0; k < 2 && want(filter, "cross_entropy"); k++) {
        int64_t V = k ? 512 : 65, s[] = {N, V};
        ctx c = {.N = N, .V = V};
        c.x = randn(2, s, 1, 2);
        c.y = fg_tensor_new(FG_F32, 2, s);
        c.dx = fg_tensor_new(FG_F32, 2, s);
        c.loss = fg_tensor_new(FG_F32, 0, NULL);
        c.mean = fg_tensor_new(FG_F64, 2, (int64_t[]){2, N});
        c.tgt = fg_tensor_new(FG_I32, 1, &N);
        int32_t *tg = fg_tensor_data(c.tgt);
        for (int64_t i = 0; i < N; i++) tg[i] = (int32_t)(i * 31 % V);
        char shape[64];
        snprintf(shape, sizeof shape, "(%lld, %lld)", (long long)N, (long long)V);
        /* one exp an element in the forward's sum, one in the backward's */
        emit_b("cross_entropy_fwd_bwd", shape, ce, ce_base, &c, 3 * 4.0 * (double)(N * V),
               BOUND_EXP, 2.0 * (double)(N * V));
    }
    if (want(filter, "attention")) { /* GB/s of qkv in and y out: the gemms dominate */
        int64_t B = 16, T = 128, C = 256, sq[] = {B, T, 3 * C}, sy[] = {B, T, C}, sl[] = {B, 4, T};
        att_ctx a = {.heads = 4};
        a.qkv = randn(3, sq, 1, 1);
        a.dqkv = randn(3, sq, 2, 1);
        a.y = fg_tensor_new(FG_F32, 3, sy);
        a.dy = randn(3, sy, 3, 1);
        a.lse = fg_tensor_new(FG_F32, 3, sl);
        double nb = 4.0 * (double)(B * T * 4 * C);
        emit("attention_fwd", "(16, 128, 768)", att_fwd, NULL, &a, nb);
        emit("attention_bwd", "(16, 128, 768)", att_bwd, NULL, &a, 2 * nb);
    }
    for (int k = 0; k < 2 && want(filter, "adamw"); k++) { /* in L3, and well past it */
        int64_t in = k ? 2048 : 1024, out = k ? 4096 : 1024, n = in * out;
        fg_module *m = fg_linear_new(in, out, false, FG_F32);
        fg_tensor *g = fg_module_flat_grads(m);
        fg_rng_fill_normal(7, 0, fg_tensor_data(g), fg_tensor_numel(g), 0, 1);
        fg_optimizer *opt = fg_adamw_new(m, NULL);
        char shape[64];
        snprintf(shape, sizeof shape, "(%lld)", (long long)n);
        /* p, g, m, v read; p, m, v written */
        emit("adamw", shape, adamw, NULL, opt, 7 * 4.0 * (double)n);
        fg_optimizer_free(opt);
        fg_module_free(m);
    }
    print_table();
    return 0;
}
