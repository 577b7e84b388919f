/* Strategies: dp with thread replicas gives the parameters of one process
 * with the whole batch (ddp's equivalences with one process are rows of
 * tests/strategy/test_equivalence.c); an unused parameter is an error naming
 * it unless find_unused_parameters or static_graph (its gradient then zero,
 * the used ones reduced); buckets tile the flat gradient; the errors of
 * fg_strategy_new. Ranks are forked processes on the shm backend. */
#include <math.h>
#include <stdio.h>
#include <sys/mman.h>

#include "fulgur/strategy.h"
#include "harness.h"
#include "mp/mp_join.h"
#include "strategy/ddp_reducer.h"

#define STEPS 20

typedef struct setup {
    bool gpt;
    int world; /* ranks (ddp) or replicas (dp) */
    int64_t B; /* per-rank batch */
    int accum; /* micro-batches per step under no_sync */
    double bucket_mb;
    bool adamw; /* else SGD with momentum */
    double tol; /* relative; 0 = 1e-5 */
} setup;

static fg_module *make_model(const setup *s) {
    if (s->gpt)
        return fg_gpt_new(&(fg_gpt_config){
            .vocab = 17, .ctx = 8, .layers = 2, .heads = 2, .embd = 16, .seed = 5});
    return fg_mlp_new(&(fg_mlp_config){.sizes = {12, 32, 32, 5}, .nlayers = 3, .seed = 5});
}

static fg_optimizer *make_opt(const setup *s, fg_module *m) {
    if (s->adamw) return fg_adamw_new(m, &(fg_adamw_opts){.lr = 1e-3, .weight_decay = 0.1});
    return fg_sgd_new(m, &(fg_sgd_opts){.lr = 0.05, .momentum = 0.9});
}

/* Rows [r0, r0+n) of step `step`'s global batch: deterministic data. */
static void batch_rows(const setup *s, int step, int64_t r0, int64_t n, fg_tensor **x,
                       fg_tensor **y) {
    if (s->gpt) {
        int64_t sh[2] = {n, 8};
        *x = fg_empty(FG_I32, 2, sh);
        *y = fg_empty(FG_I32, 2, sh);
        for (int64_t i = 0; i < n * 8; i++) {
            uint64_t k = (uint64_t)step * 1000003u + (uint64_t)(r0 * 8 + i);
            ((int32_t *)fg_tensor_data(*x))[i] = (int32_t)(fg_rng_u32_at(11, k) % 17);
            ((int32_t *)fg_tensor_data(*y))[i] = (int32_t)(fg_rng_u32_at(12, k) % 17);
        }
    } else {
        int64_t sx[2] = {n, 12}, sy[1] = {n};
        *x = fg_empty(FG_F32, 2, sx);
        *y = fg_empty(FG_I32, 1, sy);
        fg_rng_fill_normal(13, (uint64_t)step * 100000u + (uint64_t)r0 * 12, fg_tensor_data(*x),
                           n * 12, 0, 1);
        for (int64_t i = 0; i < n; i++)
            ((int32_t *)fg_tensor_data(*y))[i] =
                (int32_t)(fg_rng_u32_at(14, (uint64_t)step * 1000u + (uint64_t)(r0 + i)) % 5);
    }
}

static fg_tensor *loss_of(fg_module *m, fg_tensor *x, fg_tensor *y) {
    return fg_cross_entropy(fg_module_forward(m, x), y, -100);
}

/* One process, global batch world*B (accumulation splits it the same way). */
static fg_tensor *train_single(const setup *s) {
    fg_module *m = make_model(s);
    fg_optimizer *o = make_opt(s, m);
    for (int step = 0; step < STEPS; step++) {
        fg_optimizer_zero_grad(o);
        fg_tensor *x, *y;
        batch_rows(s, step, 0, s->world * s->B, &x, &y);
        if (fg_backward(loss_of(m, x, y)) != FG_OK) fprintf(stderr, "%s\n", fg_last_error());
        CHECK_OK(fg_optimizer_step(o));
        fg_step_reset();
    }
    fg_tensor *flat = fg_module_flat_params(m);
    fg_tensor *out = fg_tensor_new(FG_F32, 1, fg_tensor_shape(flat));
    CHECK_OK(fg_tensor_copy(out, flat));
    fg_optimizer_free(o);
    fg_module_free(m);
    return out;
}

/* Largest |a-b| relative to the largest |b|. */
static double rel_diff(const float *a, const float *b, int64_t n) {
    double d = 0, mx = 0;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        mx = fmax(mx, fabs((double)b[i]));
    }
    return d / (mx > 0 ? mx : 1);
}

typedef struct shared {
    setup s;
    float *result; /* rank 0 writes its final parameters here (shared mapping) */
    int64_t n;
    char job[64];
} shared;

static fg_tensor *dp_step_fn(fg_module *replica, fg_batch *part, void *ud) {
    (void)ud;
    return loss_of(replica, part->x, part->y);
}

TEST(strategy_new_errors) {
    setup s = {.world = 1, .B = 6};
    fg_module *m = make_model(&s);
    CHECK(fg_strategy_new(FG_STRATEGY_SINGLE, NULL, NULL, NULL, NULL, NULL, 0) == NULL);
    CHECK(fg_last_status() == FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "NULL model");
    CHECK(fg_strategy_new((fg_strategy_kind)99, NULL, m, NULL, NULL, NULL, 0) == NULL);
    CHECK(fg_last_status() == FG_EINVAL);
    CHECK(fg_strategy_new(FG_STRATEGY_DDP, NULL, m, NULL, NULL, NULL, 0) == NULL);
    CHECK(fg_last_status() == FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "needs a communicator");
    fg_strategy *st = fg_strategy_new(FG_STRATEGY_SINGLE, NULL, m, NULL, NULL, NULL, 0);
    CHECK_MSG(st && fg_strategy_kind_of(st) == FG_STRATEGY_SINGLE, "%s", fg_last_error());
    fg_strategy_free(st);
    fg_module_free(m);
}

TEST(dp_equals_single_process) {
    for (int gpt = 0; gpt < 2; gpt++) {
        setup s = {.gpt = gpt, .world = 1, .B = 6};
        fg_tensor *ref = train_single(&s);
        fg_module *m = make_model(&s);
        fg_optimizer *o = make_opt(&s, m);
        fg_strategy *st = fg_strategy_new(FG_STRATEGY_DP, NULL, m, o, NULL, NULL, 2);
        CHECK_MSG(st, "fg_strategy_new(dp): %s", fg_last_error());
        for (int step = 0; step < STEPS && st; step++) {
            fg_optimizer_zero_grad(o);
            fg_tensor *x, *y;
            batch_rows(&s, step, 0, s.B, &x, &y);
            /* the loader's batches are persistent tensors */
            fg_tensor *px =
                fg_tensor_new(fg_tensor_dtype(x), fg_tensor_ndim(x), fg_tensor_shape(x));
            fg_tensor *py =
                fg_tensor_new(fg_tensor_dtype(y), fg_tensor_ndim(y), fg_tensor_shape(y));
            CHECK_OK(fg_tensor_copy(px, x));
            CHECK_OK(fg_tensor_copy(py, y));
            fg_batch b = {.x = px, .y = py, .size = s.B, .valid = s.B};
            double parts[4], loss = 0;
            int n = 0;
            CHECK_OK(fg_strategy_step(st, &b, dp_step_fn, NULL, parts, 4, &n, &loss));
            CHECK(n == 2);
            CHECK_CLOSE(loss, (parts[0] + parts[1]) / 2, 1e-12, 1e-12);
            CHECK_OK(fg_optimizer_step(o));
            fg_tensor_free(px);
            fg_tensor_free(py);
            fg_step_reset();
        }
        double d = rel_diff(fg_tensor_data(fg_module_flat_params(m)), fg_tensor_data(ref),
                            fg_tensor_numel(ref));
        CHECK_MSG(d <= 1e-5, "dp (%s): parameters differ from one process by %.3g",
                  gpt ? "gpt" : "mlp", d);
        fg_strategy_free(st);
        fg_optimizer_free(o);
        fg_module_free(m);
        fg_tensor_free(ref);
    }
}

static int unused_rank(int rank, int n, void *arg) {
    const char *job = arg;
    fg_comm *c = mp_join_shm(rank, n, job, 30);
    if (!c) return 1;
    int bad = 0;
    /* mode 0: neither, 1: find_unused_parameters, 2: static_graph (PyTorch's:
     * the same parameters every step, so the unused ones are known and their
     * gradients count as zero, with no search each step) */
    for (int mode = 0; mode < 3; mode++) {
        bool find = mode != 0;
        /* two heads; the loss uses only the first */
        fg_module *root = fg_module_new("two_heads", NULL, NULL, NULL);
        fg_module *a = fg_linear_new(4, 3, true, FG_F32), *b = fg_linear_new(4, 3, true, FG_F32);
        CHECK_OK(fg_module_add_child(root, "a", a));
        CHECK_OK(fg_module_add_child(root, "b", b));
        CHECK_OK(fg_module_finalize(root));
        fg_ddp_opts o = {.find_unused_parameters = mode == 1, .static_graph = mode == 2};
        fg_strategy *st = fg_strategy_new(FG_STRATEGY_DDP, c, root, NULL, &o, NULL, 0);
        if (!st) return 1;
        int64_t sx[2] = {2, 4};
        fg_tensor *x = fg_full(FG_F32, 2, sx, 1.0);
        fg_status s = fg_strategy_backward(st, fg_sum(fg_module_forward(a, x)));
        if (find) {
            bad |= s != FG_OK;
            /* a's gradient reduced over ranks (each rank's is the batch's sum
             * of x = 1: 2), b's zero */
            const float *g = fg_tensor_data(fg_module_flat_grads(root));
            for (int64_t k = 0; k < fg_module_num_params(root); k++) {
                const char *name = fg_module_param_name(root, k);
                float want = name[0] == 'a' ? 2.0f : 0.0f;
                int64_t off = fg_module_param_offset(root, k);
                for (int64_t i = 0; i < fg_tensor_numel(fg_module_param(root, k)); i++)
                    if (g[off + i] != want) {
                        if (!bad && rank == 0)
                            fprintf(stderr, "  mode %d: %s[%lld] gradient %g, want %g\n", mode,
                                    name, (long long)i, g[off + i], want);
                        bad = 1;
                    }
            }
        } else {
            bad |= s != FG_ESTATE || !strstr(fg_last_error(), "b.weight") ||
                   !strstr(fg_last_error(), "find_unused_parameters");
            if (rank == 0) fprintf(stderr, "  (expected) %s\n", fg_last_error());
        }
        fg_step_reset();
        fg_strategy_free(st);
        fg_module_free(root);
        if (!find) { /* the communicator saw a partial round; start a fresh one */
            fg_comm_free(c);
            char again[80];
            snprintf(again, sizeof again, "%s-b", job);
            if (!(c = mp_join_shm(rank, n, again, 30))) return 1;
        }
    }
    fg_comm_free(c);
    return bad;
}

TEST(ddp_unused_parameter) {
    char job[64];
    snprintf(job, sizeof job, "test-ddp-unused-%d", getpid());
    CHECK(fg_test_fork_ranks(2, unused_rank, job, 60) == 0);
}

TEST(buckets_tile_the_flat_gradient) {
    setup s = {.gpt = true};
    fg_module *m = make_model(&s);
    int np = (int)fg_module_num_params(m);
    fg_tensor **ps = calloc((size_t)np, sizeof *ps);
    int64_t *offs = calloc((size_t)np, sizeof *offs);
    for (int i = 0; i < np; i++) {
        ps[i] = fg_module_param(m, i);
        offs[i] = fg_module_param_offset(m, i);
    }
    fg__ddp_reducer *r = NULL;
    fg__ddp_reducer_opts o = {.bucket_cap_mb = 0.004, .first_bucket_mb = 0.001};
    CHECK_OK(fg__ddp_reducer_new(NULL, fg_module_flat_grads(m), np, ps, offs, &o, &r));
    int nb = fg__ddp_reducer_num_buckets(r);
    CHECK(nb > 3);
    int64_t expect_end = fg_module_numel(m);
    for (int b = 0; b < nb; b++) { /* bucket 0 ends the buffer; each starts where the next ends */
        int64_t lo, hi;
        fg__ddp_reducer_bucket_range(r, b, &lo, &hi);
        CHECK(hi == expect_end && lo < hi);
        expect_end = lo;
    }
    CHECK(expect_end == 0);
    fg__ddp_reducer_free(r);
    free(ps);
    free(offs);
    fg_module_free(m);
}
