/* strategy bagua on forked ranks (shm backend), at 2 and 3 ranks (4 for the
 * hierarchical pattern, as 2 nodes of 2): gradient_allreduce is ddp bitwise
 * (hierarchical: within rounding, with the bytes of its three collectives);
 * bytegrad's averaged gradient is within the 8-bit bound of the true average
 * (the largest min-max range of the chunks it came from / 255), the same on
 * every rank, with p (8 + ceil(n / p)) bytes per bucket; decentralized
 * replaces the weights by the exact average of all ranks' (or of the
 * shift_one peer's, whose pattern changes by step as Bagua's) and leaves the
 * local gradient, every communication_interval steps; shift_one on an odd
 * world is refused; low_precision_decentralized keeps each rank's copy of a
 * neighbour bitwise equal to that neighbour's weights and moves within the
 * 8-bit bound of the exact update; qadam is AdamW on ddp bitwise during
 * warm-up, then freezes the variance and keeps the momentum equal on every
 * rank; async is ddp bitwise during warm-up and then leaves every rank with
 * the average of the ranks' weights (learning rate 0). The 8-bit chunks
 * round-trip within half a step, exactly for a constant chunk, and a NaN or
 * infinity turns its whole chunk into NaN. */
#include <math.h>
#include <stdio.h>
#include <sys/mman.h>

#include "fulgur/strategy.h"
#include "harness.h"
#include "mp/mp_join.h"
#include "optim/optim_impl.h"
#include "strategy/bagua_impl.h"
#include "strategy/equiv.h"

#define MAXR 4
#define MAXS 8

enum {
    K_PRE,
    K_POST,
    K_GRAD,
    K_LOCAL,
    K_AFTER,
    K_X,
    K_W,
    K_L,
    K_R,
    K_W2,
    K_L2,
    K_R2,
    K_M,
    K_V,
    K_N
};

typedef struct cfg {
    fg_strategy_kind kind;
    fg_bagua_opts bagua;
    int world, steps, node_size;
    bool adamw, perturb, manual_lpd, async_avg;
} cfg;

typedef struct shared {
    cfg c;
    int64_t n;
    int nb;
    int64_t bucket[8][2];
    fg_comm_bytes bytes[MAXR][MAXS];
    int64_t async_steps[MAXR];
    char job[96];
    char err[MAXR][256];
} shared;

static float *g_rec; /* K_N x MAXS x MAXR x n floats, shared */

static float *rec(const shared *sh, int k, int s, int r) {
    return g_rec + (((size_t)k * MAXS + (size_t)s) * MAXR + (size_t)r) * (size_t)sh->n;
}

static fg_module *make_model(void) {
    return fg_mlp_new(&(fg_mlp_config){.sizes = {12, 32, 32, 5}, .nlayers = 3, .seed = 5});
}

static fg_tensor *loss_of(fg_module *m, int step, int rank) {
    int64_t B = 16, sx[2] = {B, 12}, sy[1] = {B};
    fg_tensor *x = fg_empty(FG_F32, 2, sx), *y = fg_empty(FG_I32, 1, sy);
    fg_rng_fill_normal(13, (uint64_t)step * 1000000u + (uint64_t)rank * 10000u, fg_tensor_data(x),
                       B * 12, 0, 1);
    for (int64_t i = 0; i < B; i++)
        ((int32_t *)fg_tensor_data(y))[i] =
            (int32_t)(fg_rng_u32_at(14,
                                    (uint64_t)step * 1000u + (uint64_t)rank * 100u + (uint64_t)i) %
                      5u);
    return fg_cross_entropy(fg_module_forward(m, x), y, -100);
}

static void cp(float *dst, const float *src, int64_t n) {
    memcpy(dst, src, sizeof *dst * (size_t)n);
}

static int fail(shared *sh, int rank, const char *what) {
    snprintf(sh->err[rank], sizeof sh->err[rank], "%s: %s", what, fg_last_error());
    fprintf(stderr, "rank %d: %s: %s\n", rank, what, fg_last_error());
    return 1;
}

static int bagua_rank(int rank, int world, void *arg) {
    shared *sh = arg;
    const cfg *c = &sh->c;
    fg_comm *comm = mp_join_shm(rank, world, sh->job, 60);
    if (!comm) return fail(sh, rank, "comm");
    CHECK_OK(fg_set_num_threads(1));
    fg__bagua_node_size = c->node_size;
    fg_module *m = make_model();
    fg_optimizer *o = c->adamw ? fg_adamw_new(m, &(fg_adamw_opts){.lr = 0.01, .weight_decay = 0.1})
                               : fg_sgd_new(m, &(fg_sgd_opts){.lr = c->async_avg ? 1e-30 : 0.1});
    fg_ddp_opts d = {.bagua = c->bagua};
    fg_strategy *st = fg_strategy_new(c->kind, comm, m, o, &d, NULL, 0);
    if (!st) {
        int rc = fail(sh, rank, "strategy");
        fg_optimizer_free(o);
        fg_module_free(m);
        fg_comm_free(comm);
        return rc;
    }
    int64_t n = fg_module_numel(m);
    float *x = fg_tensor_data(fg_module_flat_params(m)),
          *g = fg_tensor_data(fg_module_flat_grads(m));
    if (rank == 0) {
        sh->nb = fg__ddp_reducer_num_buckets(st->reducer);
        for (int b = 0; b < sh->nb && b < 8; b++)
            fg__ddp_reducer_bucket_range(st->reducer, b, &sh->bucket[b][0], &sh->bucket[b][1]);
    }
    if (c->perturb) /* different weights on every rank */
        for (int64_t i = 0; i < n; i++) x[i] += 0.01f * (float)((i * 7 + rank * 13) % 11 - 5);
    int rc = 0;
    int64_t steps = c->async_avg ? 1000000 : c->steps;
    for (int64_t s = 0; s < steps && !rc; s++) {
        int k = (int)FG_MIN(s, MAXS - 2);
        fg_optimizer_zero_grad(o);
        CHECK_OK(fg_backward(loss_of(m, (int)s, rank)));
        cp(rec(sh, K_LOCAL, k, rank), g, n);
        fg_optimizer_zero_grad(o);
        cp(rec(sh, K_PRE, k, rank), x, n);
        if (fg_strategy_backward(st, loss_of(m, (int)s, rank)) != FG_OK) {
            rc = fail(sh, rank, "backward");
            break;
        }
        cp(rec(sh, K_POST, k, rank), x, n);
        cp(rec(sh, K_GRAD, k, rank), g, n);
        if (c->manual_lpd) {
            fg__bagua_state *b = st->bagua;
            for (int64_t i = 0; i < n; i++) x[i] -= 0.1f * g[i];
            cp(rec(sh, K_X, k, rank), x, n);
            cp(rec(sh, K_W, k, rank), b->w, n);
            cp(rec(sh, K_L, k, rank), b->left, n);
            cp(rec(sh, K_R, k, rank), b->right, n);
            b->opt_steps++;
            if (fg__lpd_after_step(b) != FG_OK) rc = fail(sh, rank, "lpd");
            cp(rec(sh, K_W2, k, rank), b->w, n);
            cp(rec(sh, K_L2, k, rank), b->left, n);
            cp(rec(sh, K_R2, k, rank), b->right, n);
        } else if (fg_optimizer_step(o) != FG_OK) {
            rc = fail(sh, rank, "step");
        }
        cp(rec(sh, K_AFTER, k, rank), x, n);
        if (c->adamw) {
            cp(rec(sh, K_M, k, rank), fg_tensor_data(fg_optimizer_state(o, 0)), n);
            cp(rec(sh, K_V, k, rank), fg_tensor_data(fg_optimizer_state(o, 1)), n);
        }
        CHECK_OK(fg_strategy_comm_bytes(st, &sh->bytes[rank][k]));
        fg_step_reset();
        if (c->async_avg && fg__async_applied(st) > 0) {
            sh->async_steps[rank] = s + 1;
            break;
        }
    }
    if (c->async_avg) cp(rec(sh, K_AFTER, MAXS - 1, rank), x, n);
    fg_strategy_free(st);
    fg_optimizer_free(o);
    fg_module_free(m);
    fg_comm_free(comm);
    return rc;
}

static int g_runs;

static shared *run_quiet(cfg c, int *failed) {
    shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    memset(sh, 0, sizeof *sh);
    sh->c = c;
    fg_module *m = make_model();
    sh->n = fg_module_numel(m);
    fg_module_free(m);
    g_rec = mmap(NULL, sizeof(float) * K_N * MAXS * MAXR * (size_t)sh->n, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    snprintf(sh->job, sizeof sh->job, "test-bagua-%d-%d", getpid(), g_runs++);
    *failed = fg_test_fork_ranks(c.world, bagua_rank, sh, 300);
    return sh;
}

static shared *run(cfg c) {
    int failed;
    shared *sh = run_quiet(c, &failed);
    CHECK_MSG(failed == 0, "%s on %d ranks: %d ranks failed",
              fg_bagua_algorithm_name(c.bagua.algorithm), c.world, failed);
    return sh;
}

/* the records of a run: copied out, as the next run reuses g_rec */
typedef struct saved {
    shared *sh;
    float *r;
} saved;

static saved keep(shared *sh) {
    size_t bytes = sizeof(float) * K_N * MAXS * MAXR * (size_t)sh->n;
    saved s = {sh, malloc(bytes)};
    memcpy(s.r, g_rec, bytes);
    munmap(g_rec, bytes);
    g_rec = NULL;
    return s;
}

static float *at(const saved *s, int k, int step, int r) {
    return s->r + (((size_t)k * MAXS + (size_t)step) * MAXR + (size_t)r) * (size_t)s->sh->n;
}

static void drop(saved s) {
    munmap(s.sh, sizeof *s.sh);
    free(s.r);
}

static const cfg k_ddp = {.kind = FG_STRATEGY_DDP, .steps = 4};

static cfg bagua(fg_bagua_algorithm a, int world) {
    return (cfg){.kind = FG_STRATEGY_BAGUA, .bagua = {.algorithm = a}, .world = world, .steps = 4};
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* gradient_allreduce against ddp: a row of the equivalence engine
 * (tests/strategy/equiv.h), bitwise, with ddp's bytes */
static void bytes_of(const eq_case *c, int rank, fg_strategy *st, fg_module *m, fg_optimizer *o,
                     eq_result *r) {
    (void)c, (void)m, (void)o;
    fg_comm_bytes b = {0};
    CHECK_OK(fg_strategy_comm_bytes(st, &b));
    r->extra[rank][0] = (int64_t)b.total;
    r->extra[rank][1] = (int64_t)b.last_step;
    r->extra[rank][2] = b.steps;
}

static void bytes_check(const eq_case *c, const eq_result *got, const eq_result *ref) {
    CHECK(got->extra[0][0] == ref->extra[0][0]);
    CHECK(got->extra[0][1] == got->numel * 4 && got->extra[0][2] == eq_steps(c));
}

static const eq_hooks k_bytes = {.check = bytes_check, .rank_done = bytes_of};

static const eq_case k_allreduce[] = {
    {.name = "bagua gradient_allreduce",
     .kind = FG_STRATEGY_BAGUA,
     .world = 2,
     .steps = 4,
     .batch = 16,
     .ref = EQ_VS_DDP,
     .hooks = &k_bytes},
    {.name = "bagua gradient_allreduce",
     .kind = FG_STRATEGY_BAGUA,
     .world = 3,
     .steps = 4,
     .batch = 16,
     .ref = EQ_VS_DDP,
     .hooks = &k_bytes},
};

TEST(gradient_allreduce_is_ddp_bitwise) {
    eq_run_table(k_allreduce, sizeof k_allreduce / sizeof k_allreduce[0], NULL);
}

TEST(gradient_allreduce_hierarchical) {
    /* 4 ranks as 2 nodes of 2, and 2 ranks on this one machine */
    for (int w = 2; w <= 4; w += 2) {
        cfg r = k_ddp;
        r.world = w;
        saved ref = keep(run(r));
        cfg c = bagua(FG_BAGUA_GRADIENT_ALLREDUCE, w);
        c.bagua.hierarchical = 1;
        c.node_size = w == 4 ? 2 : 0;
        saved sh = keep(run(c));
        int64_t n = sh.sh->n;
        int bad = 0;
        for (int q = 0; q < w; q++)
            for (int64_t i = 0; i < n; i++) {
                float a = at(&sh, K_GRAD, 0, q)[i], b = at(&ref, K_GRAD, 0, q)[i];
                if (fabsf(a - b) > 1e-6f * fabsf(b) + 1e-9f) bad++;
            }
        CHECK_MSG(bad == 0, "%d ranks: %d gradient elements beyond rounding of ddp's", w, bad);
        for (int q = 1; q < w; q++)
            CHECK(!memcmp(at(&sh, K_GRAD, 0, q), at(&sh, K_GRAD, 0, 0), sizeof(float) * n));
        /* leaders: reduce + allreduce over the leaders + broadcast; others two */
        for (int q = 0; q < w; q++) {
            uint64_t want = (uint64_t)n * 4 * (w == 4 ? (q % 2 == 0 ? 3 : 2) : 2);
            CHECK_MSG(sh.sh->bytes[q][0].last_step == want,
                      "%d ranks, rank %d: %llu bytes, want %llu", w, q,
                      (unsigned long long)sh.sh->bytes[q][0].last_step, (unsigned long long)want);
        }
        drop(sh);
        drop(ref);
    }
}

/* bytegrad's gradient against the exact average: within the largest min-max
 * range of the chunks it passed through / 255 */
static void check_bytegrad(const saved *sh, int world, int groups, const char *what) {
    int64_t n = sh->sh->n;
    int bad = 0;
    double worst = 0;
    for (int b = 0; b < sh->sh->nb; b++) {
        int64_t lo = sh->sh->bucket[b][0], hi = sh->sh->bucket[b][1],
                len = ceil_div(hi - lo, groups);
        for (int64_t c0 = lo; c0 < hi; c0 += len) {
            int64_t c1 = FG_MIN(hi, c0 + len);
            double range = 0;
            for (int q = 0; q < world; q++) {
                float mn = INFINITY, mx = -INFINITY;
                for (int64_t i = c0; i < c1; i++) {
                    mn = fminf(mn, at(sh, K_LOCAL, 0, q)[i]);
                    mx = fmaxf(mx, at(sh, K_LOCAL, 0, q)[i]);
                }
                range = fmax(range, (double)mx - mn);
            }
            for (int64_t i = c0; i < c1; i++) {
                double avg = 0;
                for (int q = 0; q < world; q++) avg += at(sh, K_LOCAL, 0, q)[i];
                avg /= world;
                double e = fabs(at(sh, K_GRAD, 0, 0)[i] - avg);
                worst = fmax(worst, e / (range / 255));
                if (e > range / 255 * 1.01 + 1e-7) bad++;
            }
        }
    }
    CHECK_MSG(bad == 0, "%s: %d elements beyond the 8-bit bound (worst %.3g of it)", what, bad,
              worst);
    CHECK_MSG(worst > 0.01, "%s: the gradient looks exact (%.3g of the bound): not quantised?",
              what, worst);
    for (int q = 1; q < world; q++)
        CHECK_MSG(!memcmp(at(sh, K_GRAD, 0, q), at(sh, K_GRAD, 0, 0), sizeof(float) * n),
                  "%s: rank %d's gradient differs from rank 0's", what, q);
}

TEST(bytegrad_within_the_8bit_bound_with_a_quarter_of_the_bytes) {
    for (int w = 2; w <= 3; w++) {
        saved sh = keep(run(bagua(FG_BAGUA_BYTEGRAD, w)));
        char what[64];
        snprintf(what, sizeof what, "bytegrad on %d ranks", w);
        check_bytegrad(&sh, w, w, what);
        uint64_t want = 0;
        for (int b = 0; b < sh.sh->nb; b++)
            want += (uint64_t)w * (8 + ceil_div(sh.sh->bucket[b][1] - sh.sh->bucket[b][0], w));
        for (int q = 0; q < w; q++)
            CHECK_MSG(sh.sh->bytes[q][2].last_step == want, "%s: rank %d %llu bytes, want %llu",
                      what, q, (unsigned long long)sh.sh->bytes[q][2].last_step,
                      (unsigned long long)want);
        CHECK(sh.sh->bytes[0][2].last_step * 3 < sh.sh->bytes[0][2].dense_step);
        drop(sh);
    }
    /* hierarchical, 2 nodes of 2: averaged in the node, quantised between
     * the 2 leaders */
    cfg c = bagua(FG_BAGUA_BYTEGRAD, 4);
    c.node_size = 2; /* hierarchical by default: 2 nodes with 2 ranks each */
    saved sh = keep(run(c));
    check_bytegrad(&sh, 4, 2, "hierarchical bytegrad");
    drop(sh);
}

TEST(decentralized_all_is_the_exact_average_of_the_weights) {
    for (int w = 2; w <= 3; w++) {
        for (int interval = 1; interval <= 2; interval++) {
            cfg c = bagua(FG_BAGUA_DECENTRALIZED, w);
            c.perturb = true;
            c.bagua.communication_interval = interval;
            saved sh = keep(run(c));
            int64_t n = sh.sh->n;
            for (int s = 0; s < c.steps; s++) {
                bool comm = s % interval == 0;
                for (int q = 0; q < w; q++) {
                    int bad = 0;
                    for (int64_t i = 0; i < n; i++) {
                        float sum = 0; /* shm sums in rank order, then divides */
                        for (int j = 0; j < w; j++) sum += at(&sh, K_PRE, s, j)[i];
                        float want = comm ? sum / (float)w : at(&sh, K_PRE, s, q)[i];
                        if (at(&sh, K_POST, s, q)[i] != want) bad++;
                    }
                    CHECK_MSG(bad == 0,
                              "%d ranks, interval %d, step %d, rank %d: %d weights not %s", w,
                              interval, s, q, bad, comm ? "the average" : "left alone");
                    CHECK_MSG(
                        !memcmp(at(&sh, K_GRAD, s, q), at(&sh, K_LOCAL, s, q), sizeof(float) * n),
                        "step %d rank %d: the gradient is not the local one", s, q);
                    CHECK(sh.sh->bytes[q][s].last_step == (comm ? (uint64_t)n * 4 : 0));
                }
            }
            drop(sh);
        }
    }
}

TEST(decentralized_shift_one_pairs_by_step) {
    /* Bagua's pairing at 4 ranks: step 0 {0,2} {1,3}, step 1 {0,3} {1,2} */
    static const int want[2][4] = {{2, 3, 0, 1}, {3, 2, 1, 0}};
    for (int s = 0; s < 2; s++)
        for (int r = 0; r < 4; r++) CHECK(fg__bagua_shift_one_peer(r, 4, s) == want[s][r]);
    CHECK(fg__bagua_shift_one_peer(0, 2, 5) == 1 && fg__bagua_shift_one_peer(1, 2, 5) == 0);
    for (int w = 2; w <= 4; w += 2) {
        cfg c = bagua(FG_BAGUA_DECENTRALIZED, w);
        c.perturb = true;
        c.bagua.peer_selection_mode = FG_BAGUA_PEERS_SHIFT_ONE;
        saved sh = keep(run(c));
        int64_t n = sh.sh->n;
        for (int s = 0; s < c.steps; s++)
            for (int q = 0; q < w; q++) {
                int p = fg__bagua_shift_one_peer(q, w, s), bad = 0;
                for (int64_t i = 0; i < n; i++) {
                    float want_v = (at(&sh, K_PRE, s, p)[i] + at(&sh, K_PRE, s, q)[i]) * 0.5f;
                    if (at(&sh, K_POST, s, q)[i] != want_v) bad++;
                }
                CHECK_MSG(bad == 0, "%d ranks, step %d: rank %d is not averaged with rank %d", w, s,
                          q, p);
            }
        drop(sh);
    }
    /* an odd world cannot be paired */
    cfg c = bagua(FG_BAGUA_DECENTRALIZED, 3);
    c.bagua.peer_selection_mode = FG_BAGUA_PEERS_SHIFT_ONE;
    int failed;
    shared *sh = run_quiet(c, &failed);
    CHECK(failed == 3);
    CHECK_CONTAINS(sh->err[0], "shift_one pairs the ranks, and there are 3 of them");
    munmap(g_rec, sizeof(float) * K_N * MAXS * MAXR * (size_t)sh->n);
    munmap(sh, sizeof *sh);
}

TEST(low_precision_decentralized_tracks_its_neighbours) {
    for (int w = 2; w <= 3; w++) {
        cfg c = bagua(FG_BAGUA_LOW_PRECISION_DECENTRALIZED, w);
        c.manual_lpd = true;
        saved sh = keep(run(c));
        int64_t n = sh.sh->n;
        int nb = sh.sh->nb;
        for (int s = 0; s < c.steps; s++)
            for (int q = 0; q < w; q++) {
                int l = (q + w - 1) % w, r = (q + 1) % w;
                CHECK_MSG(!memcmp(at(&sh, K_L2, s, q), at(&sh, K_W2, s, l), sizeof(float) * n) &&
                              !memcmp(at(&sh, K_R2, s, q), at(&sh, K_W2, s, r), sizeof(float) * n),
                          "%d ranks, step %d: rank %d's copies of its neighbours drifted", w, s, q);
                CHECK(!memcmp(at(&sh, K_AFTER, s, q), at(&sh, K_W2, s, q), sizeof(float) * n));
                /* x' - w = q8(x + l/3 + r/3 - 5w/3), one chunk per bucket */
                const float *x = at(&sh, K_X, s, q), *wq = at(&sh, K_W, s, q),
                            *lq = at(&sh, K_L, s, q), *rq = at(&sh, K_R, s, q),
                            *x2 = at(&sh, K_AFTER, s, q);
                int bad = 0;
                for (int b = 0; b < nb; b++) {
                    int64_t lo = sh.sh->bucket[b][0], hi = sh.sh->bucket[b][1];
                    float mn = INFINITY, mx = -INFINITY;
                    float *d = malloc(sizeof *d * (size_t)(hi - lo));
                    for (int64_t i = lo; i < hi; i++) {
                        float t = x[i] + lq[i] * (1.0f / 3.0f);
                        t = t + rq[i] * (1.0f / 3.0f);
                        d[i - lo] = t + wq[i] * (-5.0f / 3.0f);
                        mn = fminf(mn, d[i - lo]);
                        mx = fmaxf(mx, d[i - lo]);
                    }
                    for (int64_t i = lo; i < hi; i++) {
                        double e = fabs((double)x2[i] - ((double)wq[i] + d[i - lo]));
                        if (e > (mx - mn) / 510.0 * 1.01 + 1e-6 * fabs(x2[i])) bad++;
                    }
                    free(d);
                }
                CHECK_MSG(bad == 0, "%d ranks, step %d, rank %d: %d weights beyond the 8-bit bound",
                          w, s, q, bad);
                CHECK(sh.sh->bytes[q][s].last_step == 2 * (uint64_t)(n + 8 * nb));
            }
        drop(sh);
    }
}

TEST(qadam_is_adam_during_warmup_then_freezes_the_variance) {
    for (int w = 2; w <= 3; w++) {
        cfg r = k_ddp;
        r.world = w;
        r.adamw = true;
        r.steps = 6;
        saved ref = keep(run(r));
        cfg c = bagua(FG_BAGUA_QADAM, w);
        c.adamw = true;
        c.steps = 6;
        c.bagua.warmup_steps = 3;
        saved sh = keep(run(c));
        int64_t n = sh.sh->n;
        for (int s = 0; s < 3; s++)
            for (int q = 0; q < w; q++)
                CHECK_MSG(
                    !memcmp(at(&sh, K_AFTER, s, q), at(&ref, K_AFTER, s, q), sizeof(float) * n),
                    "%d ranks, warm-up step %d, rank %d: not AdamW's weights", w, s, q);
        for (int s = 3; s < 6; s++)
            for (int q = 0; q < w; q++) {
                CHECK_MSG(!memcmp(at(&sh, K_V, s, q), at(&sh, K_V, 2, q), sizeof(float) * n),
                          "step %d: the variance moved after warm-up", s);
                CHECK_MSG(!memcmp(at(&sh, K_M, s, q), at(&sh, K_M, s, 0), sizeof(float) * n),
                          "step %d: rank %d's momentum differs from rank 0's", s, q);
                CHECK(memcmp(at(&sh, K_M, s, q), at(&sh, K_M, s - 1, q), sizeof(float) * n));
                CHECK(!memcmp(at(&sh, K_GRAD, s, q), at(&sh, K_LOCAL, s, q), sizeof(float) * n));
                uint64_t want = (uint64_t)w * (8 + ceil_div(n, w));
                CHECK(sh.sh->nb == 1 && sh.sh->bytes[q][s].last_step == want);
            }
        CHECK(sh.sh->bytes[0][2].last_step == (uint64_t)n * 4);
        drop(sh);
        drop(ref);
    }
}

TEST(async_warmup_is_ddp_then_weights_are_averaged) {
    for (int w = 2; w <= 3; w++) {
        cfg r = k_ddp;
        r.world = w;
        saved ref = keep(run(r));
        cfg c = bagua(FG_BAGUA_ASYNC, w);
        c.bagua.warmup_steps = 3;
        c.bagua.sync_interval_ms = 1;
        saved sh = keep(run(c));
        int64_t n = sh.sh->n;
        for (int s = 0; s < 3; s++)
            for (int q = 0; q < w; q++)
                CHECK_MSG(
                    !memcmp(at(&sh, K_AFTER, s, q), at(&ref, K_AFTER, s, q), sizeof(float) * n),
                    "%d ranks, warm-up step %d, rank %d: not ddp's weights", w, s, q);
        CHECK(!memcmp(at(&sh, K_GRAD, 3, 0), at(&sh, K_LOCAL, 3, 0), sizeof(float) * n));
        drop(sh);
        drop(ref);
        /* no warm-up, different weights, steps that change nothing: once a
         * round is applied every rank holds the average of the weights */
        c = bagua(FG_BAGUA_ASYNC, w);
        c.bagua.sync_interval_ms = 1;
        c.perturb = true;
        c.async_avg = true;
        sh = keep(run(c));
        int bad = 0;
        for (int q = 0; q < w; q++) {
            CHECK(sh.sh->async_steps[q] > 0);
            for (int64_t i = 0; i < n; i++) {
                double avg = 0;
                for (int j = 0; j < w; j++) avg += at(&sh, K_PRE, 0, j)[i];
                avg /= w;
                if (fabs(at(&sh, K_AFTER, MAXS - 1, q)[i] - avg) > 1e-6 * (fabs(avg) + 1)) bad++;
            }
        }
        CHECK_MSG(bad == 0, "%d ranks: %d weights are not the average", w, bad);
        drop(sh);
    }
}

TEST(q8_chunks_round_trip_within_half_a_step) {
    enum { N = 1000 };
    float x[N], y[N];
    uint8_t rec[FG_Q8_HEADER + N + 8];
    fg_rng_fill_normal(3, 0, x, N, 0.5, 2);
    fg__q8_compress(x, N, N + 8, rec);
    fg__q8_decompress(rec, N, y);
    float lo = x[0], hi = x[0];
    for (int i = 0; i < N; i++) lo = fminf(lo, x[i]), hi = fmaxf(hi, x[i]);
    int bad = 0;
    for (int i = 0; i < N; i++) bad += fabs((double)y[i] - x[i]) > (hi - lo) / 510.0 * 1.0001;
    CHECK_MSG(bad == 0, "%d elements beyond (max - min) / 510", bad);
    CHECK(y[0] != x[0] || y[1] != x[1]);      /* quantised, not copied */
    for (int i = 0; i < N; i++) x[i] = 0.25f; /* a constant chunk comes back exactly */
    fg__q8_compress(x, N, N, rec);
    fg__q8_decompress(rec, N, y);
    CHECK(!memcmp(x, y, sizeof x));
    x[17] = NAN; /* a non-finite element poisons its chunk instead of vanishing */
    fg__q8_compress(x, N, N, rec);
    fg__q8_decompress(rec, N, y);
    CHECK(isnan(y[0]) && isnan(y[17]) && isnan(y[N - 1]));
    x[17] = INFINITY;
    fg__q8_compress(x, N, N, rec);
    fg__q8_decompress(rec, N, y);
    CHECK(isnan(y[3]));
}

TEST(options_are_checked) {
    fg_bagua_algorithm a;
    CHECK_STATUS(fg_bagua_algorithm_parse("bytegrd", &a), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "\"bytegrd\"");
    CHECK_CONTAINS(fg_last_error(), "low_precision_decentralized");
    CHECK_OK(fg_bagua_algorithm_parse("QAdam", &a));
    CHECK(a == FG_BAGUA_QADAM);
    fg_bagua_peer_selection p;
    CHECK_STATUS(fg_bagua_peer_selection_parse("ring", &p), FG_EINVAL);
    CHECK_STATUS(fg_strategy_check_ddp(&(fg_ddp_opts){.bagua = {.algorithm = 99}}), FG_EINVAL);
    CHECK_STATUS(fg_strategy_check_ddp(
                     &(fg_ddp_opts){.bagua = {.algorithm = FG_BAGUA_QADAM, .warmup_steps = -1}}),
                 FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "warmup_steps -1");
    CHECK_STATUS(fg_strategy_check_ddp(
                     &(fg_ddp_opts){.bagua = {.algorithm = FG_BAGUA_BYTEGRAD,
                                              .peer_selection_mode = FG_BAGUA_PEERS_SHIFT_ONE}}),
                 FG_EINVAL);
    CHECK_STATUS(fg_strategy_check_ddp(&(fg_ddp_opts){.bagua = {.hierarchical = 2}}), FG_EINVAL);
    /* qadam needs AdamW */
    cfg c = bagua(FG_BAGUA_QADAM, 2);
    int failed;
    shared *sh = run_quiet(c, &failed);
    CHECK(failed == 2);
    CHECK_CONTAINS(sh->err[0], "needs an AdamW optimizer");
    munmap(g_rec, sizeof(float) * K_N * MAXS * MAXR * (size_t)sh->n);
    munmap(sh, sizeof *sh);
}
