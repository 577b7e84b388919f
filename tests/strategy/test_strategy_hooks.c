/* DDP communication hooks on forked ranks (shm backend): fp16_compress and
 * bf16_compress give plain ddp's averaged gradient within their dtype's
 * rounding and hand the communicator half the bytes; powersgd is plain ddp
 * bitwise before start_powerSGD_iter, equals it within rounding at full
 * rank, trains an MLP at rank 1 with error feedback keeping (applied +
 * residual) equal to the true sum, leaves every rank's weights equal bit for
 * bit on ranks of different thread counts, orthogonalizes as PyTorch's
 * Gram-Schmidt within f32 rounding (tests/ref/gen_powersgd_ref.py), and sends r (n + m) / (n m) of
 * the bytes; the fp16 wrapper halves those again; post_localsgd makes the ranks' weights equal
 * right after every period-th step and only then; a user hook runs once per bucket in order; bad
 * options are errors naming them. */
#include <math.h>
#include <stdio.h>
#include <sys/mman.h>

#include "fulgur/strategy.h"
#include "harness.h"
#include "mp/mp_join.h"
#include "ref/ref_file.h"
#include "strategy/ddp_hooks.h"
#include "strategy/equiv.h"
#include "strategy/strategy_impl.h"

#define MAXR 4
#define MAXSTEPS 40

enum { M_MLP, M_WIDE, M_LINEAR };
enum { C_NONE, C_EF, C_LOCALSGD };

typedef struct cfg {
    int model, world, steps, check;
    int64_t B;
    bool fixed_data;      /* the same batch every step (a loss that can fall) */
    bool user;            /* the recording user hook */
    bool threads_by_rank; /* rank r runs its kernels on r + 1 threads (else 1) */
    fg_ddp_opts ddp;
} cfg;

typedef struct shared {
    cfg c;
    int64_t n;
    float *params; /* world x n: each rank's parameters at the end */
    float *grad0;  /* world x n: the flat gradient after the first backward */
    float *local0; /* world x n: each rank's own gradient of the first step */
    double loss[MAXR][MAXSTEPS];
    fg_comm_bytes bytes[MAXR][MAXSTEPS];
    int equal[MAXSTEPS];       /* C_LOCALSGD: every rank's weights equal after step k */
    double ef_dev;             /* C_EF: |sum(g) - (N sum(applied) + sum(e))| / max */
    int calls[MAXR][MAXSTEPS]; /* user hook calls per step */
    int order_bad[MAXR];       /* user hook: buckets out of order or wrong count */
    int nbuckets;
    char job[96];
} shared;

static fg_module *make_model(int kind) {
    if (kind == M_LINEAR) return fg_linear_new(64, 48, false, FG_F32);
    int64_t h = kind == M_WIDE ? 600 : 32;
    return fg_mlp_new(&(fg_mlp_config){.sizes = {12, h, h, 5}, .nlayers = 3, .seed = 5});
}

static void batch(const cfg *c, int step, int rank, fg_tensor **x, fg_tensor **y) {
    int64_t in = c->model == M_LINEAR ? 64 : 12, classes = c->model == M_LINEAR ? 48 : 5;
    int64_t sx[2] = {c->B, in}, sy[1] = {c->B};
    uint64_t s = c->fixed_data ? 0 : (uint64_t)step;
    *x = fg_empty(FG_F32, 2, sx);
    *y = fg_empty(FG_I32, 1, sy);
    fg_rng_fill_normal(13, s * 1000000u + (uint64_t)rank * 10000u, fg_tensor_data(*x), c->B * in, 0,
                       1);
    for (int64_t i = 0; i < c->B; i++)
        ((int32_t *)fg_tensor_data(*y))[i] =
            (int32_t)(fg_rng_u32_at(14, s * 1000u + (uint64_t)rank * 100u + (uint64_t)i) %
                      (uint64_t)classes);
}

static fg_tensor *loss_of(fg_module *m, const cfg *c, int step, int rank) {
    fg_tensor *x, *y;
    batch(c, step, rank, &x, &y);
    return fg_cross_entropy(fg_module_forward(m, x), y, -100);
}

typedef struct recorder {
    shared *sh;
    int rank, step, next;
} recorder;

/* The user hook: records the call, then averages as plain ddp would. */
static fg_status user_hook(void *state, const fg_ddp_bucket *b) {
    recorder *r = state;
    r->sh->calls[r->rank][r->step]++;
    if (b->index != r->next++ || b->num_buckets != r->sh->nbuckets) r->sh->order_bad[r->rank]++;
    return fg_ddp_bucket_allreduce(b, b->grad, b->numel, FG_REDUCE_OP_AVG);
}

/* Whether every rank holds the same n floats (bitwise): min == max. */
static bool all_equal(fg_comm *c, const float *v, int64_t n) {
    float *lo = malloc(sizeof *lo * (size_t)n), *hi = malloc(sizeof *hi * (size_t)n);
    memcpy(lo, v, sizeof *lo * (size_t)n);
    memcpy(hi, v, sizeof *hi * (size_t)n);
    CHECK_OK(fg_comm_allreduce(c, lo, lo, n, FG_F32, FG_REDUCE_OP_MIN));
    CHECK_OK(fg_comm_allreduce(c, hi, hi, n, FG_F32, FG_REDUCE_OP_MAX));
    bool eq = !memcmp(lo, hi, sizeof *lo * (size_t)n);
    free(lo);
    free(hi);
    return eq;
}

static int hook_rank(int rank, int world, void *arg) {
    shared *sh = arg;
    const cfg *c = &sh->c;
    fg_comm *comm = mp_join_shm(rank, world, sh->job, 60);
    if (!comm) return 1;
    CHECK_OK(fg_set_num_threads(c->threads_by_rank ? rank + 1 : 1));
    fg_module *m = make_model(c->model);
    fg_optimizer *o = fg_sgd_new(m, &(fg_sgd_opts){.lr = 0.1});
    fg_ddp_opts d = c->ddp;
    recorder rec = {.sh = sh, .rank = rank};
    if (c->user) {
        d.user_hook = user_hook;
        d.user_state = &rec;
    }
    fg_strategy *st = fg_strategy_new(FG_STRATEGY_DDP, comm, m, o, &d, NULL, 0);
    if (!st) {
        fprintf(stderr, "rank %d: %s\n", rank, fg_last_error());
        return 1;
    }
    if (rank == 0) sh->nbuckets = fg__ddp_reducer_num_buckets(st->reducer);
    CHECK_OK(fg_comm_barrier(comm));
    int64_t n = fg_module_numel(m);
    float *flatg = fg_tensor_data(fg_module_flat_grads(m));
    float *flatp = fg_tensor_data(fg_module_flat_params(m));
    double *sum_g = calloc((size_t)n, sizeof *sum_g), *sum_a = calloc((size_t)n, sizeof *sum_a);
    int rc = 0;
    for (int step = 0; step < c->steps && !rc; step++) {
        if (c->check == C_EF || step == 0) { /* this rank's own gradient first */
            fg_optimizer_zero_grad(o);
            CHECK_OK(fg_backward(loss_of(m, c, step, rank)));
            for (int64_t i = 0; i < n; i++) sum_g[i] += flatg[i];
            if (step == 0) memcpy(sh->local0 + rank * n, flatg, sizeof(float) * (size_t)n);
        }
        fg_optimizer_zero_grad(o);
        rec.step = step;
        rec.next = 0;
        fg_tensor *l = loss_of(m, c, step, rank);
        sh->loss[rank][step] = fg_item(l);
        if (fg_strategy_backward(st, l) != FG_OK) {
            fprintf(stderr, "rank %d step %d: %s\n", rank, step, fg_last_error());
            rc = 1;
            break;
        }
        if (step == 0) memcpy(sh->grad0 + rank * n, flatg, sizeof(float) * (size_t)n);
        if (c->check == C_EF)
            for (int64_t i = 0; i < n; i++) sum_a[i] += flatg[i];
        if (fg_optimizer_step(o) != FG_OK) {
            fprintf(stderr, "rank %d step %d: %s\n", rank, step, fg_last_error());
            rc = 1;
        }
        CHECK_OK(fg_strategy_comm_bytes(st, &sh->bytes[rank][step]));
        if (c->check == C_LOCALSGD) {
            bool eq = all_equal(comm, flatp, n);
            if (rank == 0) sh->equal[step] = eq;
        }
        fg_step_reset();
    }
    if (!rc && c->check == C_EF) {
        /* sum over ranks of (sum_t g - e) must be N sum_t applied */
        const float *e = fg__powersgd_residual(st, 0);
        if (!e || sh->nbuckets != 1) {
            fprintf(stderr, "rank %d: no residual\n", rank);
            rc = 1;
        } else {
            for (int64_t i = 0; i < n; i++) sum_g[i] -= e[i];
            CHECK_OK(fg_comm_allreduce(comm, sum_g, sum_g, n, FG_F64, FG_REDUCE_OP_SUM));
            double dev = 0, mx = 0;
            for (int64_t i = 0; i < n; i++) {
                dev = fmax(dev, fabs(sum_g[i] - world * sum_a[i]));
                mx = fmax(mx, fabs(sum_g[i]));
            }
            if (rank == 0) sh->ef_dev = dev / mx;
        }
    }
    memcpy(sh->params + rank * n, flatp, sizeof(float) * (size_t)n);
    free(sum_g);
    free(sum_a);
    fg_strategy_free(st);
    fg_optimizer_free(o);
    fg_module_free(m);
    fg_comm_free(comm);
    return rc;
}

static int g_runs;

/* Runs c on its ranks; the caller munmaps with done(). NULL on failure. */
static shared *run(cfg c) {
    shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    memset(sh, 0, sizeof *sh);
    sh->c = c;
    /* no OpenMP threads in this process: a rank forked from it with a
     * thread pool would wait forever on its copy of the pool */
    CHECK_OK(fg_set_num_threads(1));
    fg_module *m = make_model(c.model);
    sh->n = fg_module_numel(m);
    fg_module_free(m);
    size_t bytes = sizeof(float) * (size_t)sh->n * (size_t)c.world;
    sh->params = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    sh->grad0 = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    sh->local0 = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    snprintf(sh->job, sizeof sh->job, "test-hooks-%d-%d", getpid(), g_runs++);
    int failed = fg_test_fork_ranks(c.world, hook_rank, sh, 300);
    CHECK_MSG(failed == 0, "%d ranks failed", failed);
    return sh;
}

static void done(shared *sh) {
    size_t bytes = sizeof(float) * (size_t)sh->n * (size_t)sh->c.world;
    munmap(sh->params, bytes);
    munmap(sh->grad0, bytes);
    munmap(sh->local0, bytes);
    munmap(sh, sizeof *sh);
}

/* Largest |a - b| relative to the largest |b|. */
static double rel_diff(const float *a, const float *b, int64_t n) {
    double d = 0, mx = 0;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        mx = fmax(mx, fabs((double)b[i]));
    }
    return d / (mx > 0 ? mx : 1);
}

static const cfg k_base = {.model = M_MLP, .world = 2, .steps = 4, .B = 16};

TEST(compress_hooks_equal_ddp_within_rounding) {
    shared *ref = run(k_base);
    struct {
        fg_ddp_comm_hook hook;
        fg_ddp_comm_wrapper wrap;
        double rtol, atol;
    } cases[] = {{FG_DDP_HOOK_FP16_COMPRESS, 0, 0x1p-11, 0x1p-24},
                 {FG_DDP_HOOK_BF16_COMPRESS, 0, 0x1p-8, 1e-38},
                 {FG_DDP_HOOK_NONE, FG_DDP_WRAPPER_FP16, 0x1p-11, 0x1p-24},
                 {FG_DDP_HOOK_NONE, FG_DDP_WRAPPER_BF16, 0x1p-8, 1e-38}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        cfg c = k_base;
        c.ddp.comm_hook = cases[k].hook;
        c.ddp.comm_wrapper = cases[k].wrap;
        shared *sh = run(c);
        const char *what = cases[k].wrap ? fg_ddp_comm_wrapper_name(cases[k].wrap)
                                         : fg_ddp_comm_hook_name(cases[k].hook);
        int bad = 0;
        /* each rank's share g / 2 is rounded once to the dtype (unit
         * roundoff u), the sum once more: |error| <= u (|g0| + |g1|) / 2 +
         * u |sum|, plus the smallest subnormal for f16 */
        for (int64_t i = 0; i < sh->n; i++) {
            double a = sh->grad0[i], b = ref->grad0[i];
            double shares = (fabs(sh->local0[i]) + fabs(sh->local0[sh->n + i])) / 2;
            if (fabs(a - b) > cases[k].rtol * (shares + fabs(b)) + cases[k].atol) bad++;
        }
        CHECK_MSG(bad == 0, "%s: %d gradient elements beyond the dtype's rounding", what, bad);
        CHECK_MSG(!memcmp(sh->grad0, sh->grad0 + sh->n, sizeof(float) * (size_t)sh->n),
                  "%s: ranks got different gradients", what);
        for (int s = 0; s < c.steps; s++)
            CHECK_MSG(sh->bytes[0][s].last_step * 2 == sh->bytes[0][s].dense_step,
                      "%s step %d: %llu bytes, expected half of %llu", what, s,
                      (unsigned long long)sh->bytes[0][s].last_step,
                      (unsigned long long)sh->bytes[0][s].dense_step);
        done(sh);
    }
    /* plain ddp hands over every f32 element */
    CHECK(ref->bytes[0][0].last_step == (uint64_t)ref->n * 4);
    CHECK(ref->bytes[0][3].total == (uint64_t)ref->n * 16 && ref->bytes[0][3].steps == 4);
    done(ref);
}

/* powersgd before start_powerSGD_iter (1000) against ddp: a row of the
 * equivalence engine (tests/strategy/equiv.h), bitwise, ddp's bytes */
static void bytes_of(const eq_case *c, int rank, fg_strategy *st, fg_module *m, fg_optimizer *o,
                     eq_result *r) {
    (void)c, (void)m, (void)o;
    fg_comm_bytes b = {0};
    CHECK_OK(fg_strategy_comm_bytes(st, &b));
    r->extra[rank][0] = (int64_t)b.total;
}

static void bytes_check(const eq_case *c, const eq_result *got, const eq_result *ref) {
    (void)c;
    CHECK(got->extra[0][0] == ref->extra[0][0] && got->extra[0][0] > 0);
}

static const eq_hooks k_bytes = {.check = bytes_check, .rank_done = bytes_of};

static const eq_case k_before_start[] = {
    {.name = "powersgd before start",
     .kind = FG_STRATEGY_DDP,
     .ddp = {.comm_hook = FG_DDP_HOOK_POWERSGD},
     .world = 2,
     .steps = 4,
     .batch = 16,
     .ref = EQ_VS_DDP,
     .hooks = &k_bytes},
};

TEST(powersgd_before_start_is_ddp_bitwise) {
    eq_run_table(k_before_start, sizeof k_before_start / sizeof k_before_start[0], NULL);
}

TEST(powersgd_full_rank_equals_ddp) {
    cfg c = k_base;
    c.B = 48; /* more samples than any matrix's side */
    c.steps = 5;
    shared *ref = run(c);
    c.ddp.comm_hook = FG_DDP_HOOK_POWERSGD;
    c.ddp.powersgd = (fg_powersgd_opts){
        .matrix_approximation_rank = 1000, .start_powerSGD_iter = -1, .min_compression_rate = 1e-9};
    shared *sh = run(c);
    double dg = rel_diff(sh->grad0, ref->grad0, sh->n),
           dp = rel_diff(sh->params, ref->params, sh->n);
    CHECK_MSG(dg < 1e-5, "first gradient differs from ddp's by %.3g (relative)", dg);
    /* error feedback carries each step's rounding into the next, and the
     * columns of P past the rank of the summed gradient are dropped at 1e-5
     * of their norm: 1e-4 after 5 steps */
    CHECK_MSG(dp < 1e-4, "parameters after %d steps differ from ddp's by %.3g", c.steps, dp);
    CHECK(!memcmp(sh->params, sh->params + sh->n, sizeof(float) * (size_t)sh->n));
    done(sh);
    done(ref);
}

/* P Q^T, which every rank computes from the same P and Q, and the
 * Gram-Schmidt of the reused Qs must come out the same on every rank
 * whatever its thread count: products of 600 x 600 matrices, large enough
 * for OpenBLAS to split across threads, on ranks of 1 and 2 threads. */
TEST(powersgd_ranks_agree_bitwise_across_thread_counts) {
    cfg c = k_base;
    c.model = M_WIDE;
    c.steps = 3;
    c.threads_by_rank = true;
    c.ddp.comm_hook = FG_DDP_HOOK_POWERSGD;
    c.ddp.powersgd = (fg_powersgd_opts){.matrix_approximation_rank = 4, .start_powerSGD_iter = -1};
    shared *sh = run(c);
    CHECK(sh->bytes[0][2].last_step < sh->bytes[0][2].dense_step / 10);
    CHECK(!memcmp(sh->params, sh->params + sh->n, sizeof(float) * (size_t)sh->n));
    done(sh);
}

/* The hook's Gram-Schmidt against PyTorch's _orthogonalize_gram_schmidt
 * (tests/ref/gen_powersgd_ref.py): within f32 rounding of PyTorch's float64
 * result and of its float32 one, also where a column loses most of its norm
 * to the projections and fulgur projects it twice ("close"). */
TEST(powersgd_gram_schmidt_matches_pytorch) {
    ref_file *ref = ref_open(fg_test_path("ref/powersgd_ref.bin"));
    CHECK(ref);
    if (!ref) return;
    const char *cases[] = {"wide", "square", "close"};
    for (int k = 0; k < 3; k++) {
        char name[64];
        snprintf(name, sizeof name, "%s.in", cases[k]);
        const ref_array *in = ref_get(ref, name);
        snprintf(name, sizeof name, "%s.f32", cases[k]);
        const ref_array *o32 = ref_get(ref, name);
        snprintf(name, sizeof name, "%s.f64", cases[k]);
        const ref_array *o64 = ref_get(ref, name);
        snprintf(name, sizeof name, "%s.eps", cases[k]);
        const ref_array *eps = ref_get(ref, name);
        CHECK(in && o32 && o64 && eps);
        if (!in || !o32 || !o64 || !eps) continue;
        int64_t n = in->shape[0], r = in->shape[1];
        float *a = malloc(sizeof *a * (size_t)(n * r)); /* column-major, as the hook keeps P */
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < r; j++) a[j * n + i] = (float)ref_at(in, i * r + j);
        fg__powersgd_orthogonalize(a, n, r, ref_at(eps, 0));
        double d32 = 0, d64 = 0, mx = 0;
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < r; j++) {
                double v = a[j * n + i], w = ref_at(o64, i * r + j);
                d32 = fmax(d32, fabs(v - ref_at(o32, i * r + j)));
                d64 = fmax(d64, fabs(v - w));
                mx = fmax(mx, fabs(w));
            }
        /* entries are about 1 / sqrt(n); f32 rounding of the projections */
        CHECK_MSG(d64 <= 1e-5 * mx, "%s: %.3g from PyTorch's float64 (largest entry %.3g)",
                  cases[k], d64, mx);
        CHECK_MSG(d32 <= 2e-5 * mx, "%s: %.3g from PyTorch's float32 (largest entry %.3g)",
                  cases[k], d32, mx);
        fprintf(stderr,
                "  %s (%lld x %lld): %.2g of the largest entry from PyTorch's f64, %.2g "
                "from its f32\n",
                cases[k], (long long)n, (long long)r, d64 / mx, d32 / mx);
        free(a);
    }
    ref_close(ref);
}

TEST(powersgd_rank1_trains_and_error_feedback_keeps_the_sum) {
    cfg c = k_base;
    c.steps = 30;
    c.fixed_data = true;
    shared *ref = run(c);
    c.check = C_EF;
    c.ddp.comm_hook = FG_DDP_HOOK_POWERSGD;
    c.ddp.powersgd = (fg_powersgd_opts){.start_powerSGD_iter = 2};
    shared *sh = run(c);
    double first = (sh->loss[0][0] + sh->loss[1][0]) / 2,
           last = (sh->loss[0][29] + sh->loss[1][29]) / 2;
    double ddp_last = (ref->loss[0][29] + ref->loss[1][29]) / 2;
    /* rank 1 sends 1/10 of the gradient of the 32x32 matrix: the loss falls, at
     * least half as far as ddp's in the same steps */
    CHECK_MSG(last < first - 0.5 * (first - ddp_last),
              "loss %.4f -> %.4f under powersgd rank 1, -> %.4f under ddp", first, last, ddp_last);
    CHECK_MSG(sh->ef_dev < 1e-5,
              "sum of gradients vs N x applied + residuals: %.3g apart (relative)", sh->ef_dev);
    CHECK(sh->bytes[0][5].last_step < sh->bytes[0][5].dense_step / 2);
    CHECK(!memcmp(sh->params, sh->params + sh->n, sizeof(float) * (size_t)sh->n));
    done(sh);
    done(ref);
}

TEST(powersgd_bytes_are_r_m_plus_n_over_mn) {
    for (int wrap = 0; wrap < 2; wrap++)
        for (int r = 1; r <= 4; r *= 4) {
            cfg c = {.model = M_LINEAR, .world = 2, .steps = 2, .B = 8};
            c.ddp.comm_hook = FG_DDP_HOOK_POWERSGD;
            c.ddp.comm_wrapper = wrap ? FG_DDP_WRAPPER_FP16 : FG_DDP_WRAPPER_NONE;
            c.ddp.powersgd =
                (fg_powersgd_opts){.matrix_approximation_rank = r, .start_powerSGD_iter = 1};
            shared *sh = run(c);
            /* weight (48, 64): n = 48, m = 64 */
            uint64_t want = (uint64_t)r * (48 + 64) * (wrap ? 2 : 4);
            CHECK_MSG(sh->bytes[0][1].last_step == want,
                      "rank %d%s: %llu bytes, expected r (m + n) x %d = %llu", r,
                      wrap ? " fp16-wrapped" : "", (unsigned long long)sh->bytes[0][1].last_step,
                      wrap ? 2 : 4, (unsigned long long)want);
            CHECK(sh->bytes[0][0].last_step == 48 * 64 * (wrap ? 2 : 4)); /* plain before start */
            CHECK(sh->bytes[0][1].dense_step == 48 * 64 * 4);
            done(sh);
        }
}

TEST(post_localsgd_averages_every_period) {
    cfg c = k_base;
    c.steps = 12;
    c.check = C_LOCALSGD;
    c.ddp.comm_hook = FG_DDP_HOOK_POST_LOCALSGD;
    c.ddp.post_localsgd = (fg_post_localsgd_opts){.start_localSGD_iter = 3, .period = 4};
    shared *sh = run(c);
    uint64_t dense = sh->bytes[0][0].dense_step;
    for (int k = 0; k < c.steps; k++) {
        bool avg = k >= 3 && (k - 3) % 4 == 0;
        bool want = k < 3 || avg;
        CHECK_MSG(sh->equal[k] == want, "after step %d: ranks %s, expected %s", k,
                  sh->equal[k] ? "equal" : "different", want ? "equal" : "different");
        uint64_t bytes = k < 3 ? dense : avg ? (uint64_t)sh->n * 4 : 0;
        CHECK_MSG(sh->bytes[0][k].last_step == bytes, "step %d: %llu bytes, expected %llu", k,
                  (unsigned long long)sh->bytes[0][k].last_step, (unsigned long long)bytes);
    }
    done(sh);
}

TEST(user_hook_runs_once_per_bucket_in_order) {
    cfg c = {.model = M_WIDE, .world = 2, .steps = 2, .B = 4};
    c.ddp.bucket_cap_mb = 0.25;
    shared *ref = run(c);
    c.user = true;
    shared *sh = run(c);
    CHECK_MSG(sh->nbuckets >= 2, "%d buckets: the test wants several", sh->nbuckets);
    for (int r = 0; r < 2; r++) {
        CHECK(sh->order_bad[r] == 0);
        for (int s = 0; s < c.steps; s++)
            CHECK_MSG(sh->calls[r][s] == sh->nbuckets, "rank %d step %d: %d calls for %d buckets",
                      r, s, sh->calls[r][s], sh->nbuckets);
    }
    CHECK(!memcmp(sh->params, ref->params, sizeof(float) * (size_t)sh->n));
    CHECK(sh->bytes[0][1].last_step == sh->bytes[0][1].dense_step);
    done(sh);
    done(ref);
}

TEST(options_are_checked) {
    CHECK_STATUS(fg_strategy_check_ddp(&(fg_ddp_opts){.comm_hook = FG_DDP_HOOK_COUNT}), FG_EINVAL);
    CHECK_STATUS(fg_strategy_check_ddp(
                     &(fg_ddp_opts){.comm_hook = FG_DDP_HOOK_POWERSGD, .user_hook = user_hook}),
                 FG_EINVAL);
    CHECK_STATUS(
        fg_strategy_check_ddp(&(fg_ddp_opts){.powersgd = {.matrix_approximation_rank = -1}}),
        FG_EINVAL);
    CHECK(strstr(fg_last_error(), "matrix_approximation_rank -1") != NULL);
    fg_ddp_comm_hook h;
    CHECK_STATUS(fg_ddp_comm_hook_parse("powersdg", &h), FG_EINVAL);
    CHECK(strstr(fg_last_error(), "\"powersdg\"") && strstr(fg_last_error(), "post_localsgd"));
    CHECK_OK(fg_ddp_comm_hook_parse("PowerSGD", &h));
    CHECK(h == FG_DDP_HOOK_POWERSGD);
    fg_ddp_comm_wrapper w;
    CHECK_STATUS(fg_ddp_comm_wrapper_parse("fp32", &w), FG_EINVAL);
    CHECK(strstr(fg_last_error(), "\"fp32\"") != NULL);
    CHECK_OK(fg_ddp_comm_wrapper_parse("bf16_compress_wrapper", &w));
    CHECK(w == FG_DDP_WRAPPER_BF16);
}
