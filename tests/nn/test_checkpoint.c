/* Activation checkpointing: fg_checkpoint and a GPT's blocks checkpointed
 * through fg_module_set_activation_checkpointing give bitwise the gradients
 * and losses of the plain run (dropout on, autocast on too), report every
 * parameter to the "gradient ready" hook once with its final gradient, keep
 * the tape short and the step arena's peak lower; the errors. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"
#include "fulgur/nn.h"
#include "harness.h"

static fg_module *gpt(double dropout) {
    return fg_gpt_new(&(fg_gpt_config){.vocab = 65,
                                       .ctx = 32,
                                       .layers = 3,
                                       .heads = 2,
                                       .embd = 48,
                                       .dropout = dropout,
                                       .seed = 7});
}

static fg_tensor *ids(int64_t B, int64_t T, uint64_t seed) {
    int32_t buf[4096];
    fg_rng r = {seed, 0};
    for (int64_t i = 0; i < B * T; i++) buf[i] = (int32_t)fg_rng_below(&r, 65);
    return fg_from_data(FG_I32, 2, (int64_t[]){B, T}, buf);
}

/* What the hook saw: per parameter, how often it fired and the sum of its
 * gradient's bits then. */
typedef struct seen {
    fg_module *m;
    int calls[64];
    uint64_t sum[64];
} seen;

static uint64_t bits_sum(const fg_tensor *g) {
    const uint32_t *p = fg_tensor_data((fg_tensor *)g);
    uint64_t s = 0;
    for (int64_t i = 0; i < fg_tensor_numel(g); i++) s = s * 31 + p[i];
    return s;
}

static void on_ready(void *ud, fg_tensor *leaf) {
    seen *s = ud;
    for (int64_t i = 0; i < fg_module_num_params(s->m) && i < 64; i++)
        if (fg_module_param(s->m, i) == leaf) {
            s->calls[i]++;
            s->sum[i] = bits_sum(fg_tensor_grad(leaf));
        }
}

typedef struct run {
    double dropout;
    bool ckpt, autocast;
    int steps;
    /* out */
    fg_module *m;
    double loss[4];
    size_t peak;
    int64_t tape;
    seen hook;
    bool ok;
} run;

static void *train(void *arg) {
    run *r = arg;
    r->m = gpt(r->dropout);
    if (!r->m) return NULL;
    if (r->ckpt) {
        int n = 0;
        if (fg_module_set_activation_checkpointing(r->m, NULL, true, &n) || n != 3) return NULL;
    }
    r->hook.m = r->m;
    fg_set_grad_ready_hook(on_ready, &r->hook);
    fg_dtype prev = FG_DTYPE_DEFAULT;
    if (r->autocast) CHECK_OK(fg_autocast_set(FG_BF16, &prev));
    for (int s = 0; s < r->steps; s++) {
        fg_tensor *x = ids(4, 32, 100 + (uint64_t)s), *y = ids(4, 32, 200 + (uint64_t)s);
        fg_tensor *logits = fg_module_forward(r->m, x);
        fg_tensor *loss = logits ? fg_cross_entropy(logits, y, -100) : NULL;
        if (!loss) return NULL;
        r->tape = fg_tape_size();
        r->loss[s] = fg_tensor_get(loss, 0);
        if (s == r->steps - 1) memset(&r->hook.calls, 0, sizeof r->hook.calls);
        if (fg_backward(loss)) return NULL;
        fg_step_reset();
    }
    if (r->autocast) CHECK_OK(fg_autocast_set(prev, NULL));
    fg_set_grad_ready_hook(NULL, NULL);
    r->peak = fg_step_peak_bytes();
    fg_step_thread_release();
    r->ok = true;
    return NULL;
}

/* Each run on its own thread: its own step arena, so its own peak. */
static void go(run *r) {
    pthread_t t;
    pthread_create(&t, NULL, train, r);
    pthread_join(t, NULL);
}

static void compare(double dropout, bool autocast) {
    /* A product's last bits may depend on its thread count (docs/env.md:
     * oneDNN splits K for small M x N), and on a loaded machine the count
     * adapts: the two runs keep the setting, as a run that must repeat bit
     * for bit does. */
    setenv("FULGUR_ADAPT_THREADS", "0", 1);
    CHECK_OK(fg_set_num_threads(0));
    run a = {.dropout = dropout, .autocast = autocast, .steps = 3};
    run b = {.dropout = dropout, .autocast = autocast, .steps = 3, .ckpt = true};
    go(&a);
    go(&b);
    CHECK_MSG(a.ok && b.ok, "%s", fg_last_error());
    if (!a.ok || !b.ok) goto done;
    for (int s = 0; s < 3; s++)
        CHECK_MSG(a.loss[s] == b.loss[s], "step %d: loss %.17g vs %.17g", s, a.loss[s], b.loss[s]);
    fg_tensor *ga = fg_module_flat_grads(a.m), *gb = fg_module_flat_grads(b.m);
    CHECK(!memcmp(fg_tensor_data(ga), fg_tensor_data(gb), fg_tensor_nbytes(ga)));
    int64_t np = fg_module_num_params(a.m);
    for (int64_t i = 0; i < np; i++) {
        CHECK_MSG(a.hook.calls[i] == 1 && b.hook.calls[i] == 1, "param %s: hook %d and %d times",
                  fg_module_param_name(a.m, i), a.hook.calls[i], b.hook.calls[i]);
        /* reported with its final gradient */
        CHECK(b.hook.sum[i] == bits_sum(fg_tensor_grad(fg_module_param(b.m, i))));
    }
    printf("  dropout %.1f%s: step-arena peak %zu B plain, %zu B checkpointed (%.2fx); "
           "tape %lld vs %lld nodes\n",
           dropout, autocast ? ", bf16 autocast" : "", a.peak, b.peak,
           (double)b.peak / (double)a.peak, (long long)a.tape, (long long)b.tape);
    CHECK(b.peak < a.peak);
    CHECK(b.tape < a.tape);
done:
    fg_module_free(a.m);
    fg_module_free(b.m);
}

TEST(gpt_bitwise_no_dropout) { compare(0, false); }
TEST(gpt_bitwise_dropout) { compare(0.2, false); }
TEST(gpt_bitwise_dropout_autocast) { compare(0.2, true); }

/* fg_checkpoint on a function of the caller's: a two-layer MLP with
 * dropout at an explicit offset, in f64 */
typedef struct mlp2 {
    fg_tensor *w1, *w2;
} mlp2;

static fg_tensor *mlp_fn(fg_tensor *x, void *ud) {
    mlp2 *p = ud;
    fg_tensor *h = fg_gelu(fg_linear(x, p->w1, NULL));
    return fg_linear(fg_dropout(h, 0.3, 5, 17), p->w2, NULL);
}

TEST(function_bitwise) {
    int64_t s1[2] = {16, 8}, s2[2] = {4, 16}, sx[2] = {5, 8};
    mlp2 p = {fg_tensor_new(FG_F64, 2, s1), fg_tensor_new(FG_F64, 2, s2)};
    fg_tensor *x0 = fg_tensor_new(FG_F64, 2, sx);
    double *d1 = fg_tensor_data(p.w1), *d2 = fg_tensor_data(p.w2), *dx = fg_tensor_data(x0);
    for (int64_t i = 0; i < 128; i++) d1[i] = sin((double)i);
    for (int64_t i = 0; i < 64; i++) d2[i] = cos((double)i);
    for (int64_t i = 0; i < 40; i++) dx[i] = 0.1 * (double)i - 2;
    fg_tensor_set_requires_grad(p.w1, true);
    fg_tensor_set_requires_grad(p.w2, true);
    fg_tensor_set_requires_grad(x0, true);
    double g[2][3][128] = {0};
    for (int k = 0; k < 2; k++) {
        fg_tensor_zero_grad(p.w1);
        fg_tensor_zero_grad(p.w2);
        fg_tensor_zero_grad(x0);
        /* x goes through a node first, so that its gradient is a step one */
        fg_tensor *x = fg_scale(x0, 1.5);
        fg_tensor *y = k ? fg_checkpoint(mlp_fn, x, &p) : mlp_fn(x, &p);
        fg_tensor *l = y ? fg_sum(fg_mul(y, y)) : NULL;
        CHECK_OK(l ? fg_backward(l) : FG_EINVAL);
        if (!l) return;
        memcpy(g[k][0], fg_tensor_data(fg_tensor_grad(p.w1)), 128 * 8);
        memcpy(g[k][1], fg_tensor_data(fg_tensor_grad(p.w2)), 64 * 8);
        memcpy(g[k][2], fg_tensor_data(fg_tensor_grad(x0)), 40 * 8);
        fg_step_reset();
    }
    CHECK(!memcmp(g[0], g[1], sizeof g[0]));
    /* without grad mode it is the function itself, nothing recorded */
    bool prev = fg_set_grad_enabled(false);
    fg_tensor *y = fg_checkpoint(mlp_fn, x0, &p);
    CHECK(y != NULL && fg_tape_size() == 0);
    fg_set_grad_enabled(prev);
    fg_step_reset();
    fg_tensor_free(p.w1);
    fg_tensor_free(p.w2);
    fg_tensor_free(x0);
}

static fg_tensor *shifty(fg_tensor *x, void *ud) {
    int *calls = ud;
    fg_tensor *y = fg_scale(x, 2);
    if ((*calls)++ == 0) return y;
    return fg_reshape(y, 1, (int64_t[]){-1}); /* another shape the second time */
}

TEST(errors) {
    fg_tensor *w = fg_tensor_new(FG_F32, 1, (int64_t[]){4});
    fg_tensor_set_requires_grad(w, true);
    CHECK(fg_checkpoint(NULL, w, NULL) == NULL && fg_last_status() == FG_EINVAL);
    CHECK(fg_checkpoint(shifty, NULL, NULL) == NULL && fg_last_status() == FG_EINVAL);
    int calls = 0;
    fg_tensor *y = fg_checkpoint(shifty, fg_reshape(w, 2, (int64_t[]){2, 2}), &calls);
    CHECK(y != NULL);
    if (y) {
        CHECK_STATUS(fg_backward(fg_sum(y)), FG_ESTATE);
        CHECK_CONTAINS(fg_last_error(), "recomputed forward differs");
    }
    fg_step_reset();
    fg_module *m = fg_mlp_new(&(fg_mlp_config){.sizes = {4, 8, 2}});
    int n = -1;
    CHECK_STATUS(fg_module_set_activation_checkpointing(m, NULL, true, &n), FG_EINVAL);
    CHECK(n == 0);
    CHECK_CONTAINS(fg_last_error(), "\"Block\"");
    CHECK_OK(fg_module_set_activation_checkpointing(m, "Linear", true, &n));
    CHECK(n >= 2);
    fg_module_free(m);
    fg_tensor_free(w);
}

/* Each allocation of a checkpointed forward and backward failing in turn
 * (the arena's chunks, the draw log, the parameter list): an error, never
 * a crash; then the step goes through. */
static void *failing_steps(void *arg) {
    int *errors = arg;
    fg_module *m = gpt(0.2);
    if (fg_module_set_activation_checkpointing(m, NULL, true, NULL) != FG_OK)
        (*errors) = -1000000; /* set up before any failure is injected: must not fail */
    fg_tensor *x = ids(2, 16, 1), *y = ids(2, 16, 2);
    (void)x, (void)y;
    fg_step_reset();
    for (int fail_at = 1; fail_at < 5000; fail_at++) {
        fg_step_thread_release(); /* a fresh arena: its chunks are allocated again */
        x = ids(2, 16, 1);
        y = ids(2, 16, 2);
        fx_alloc_begin_nth(fail_at);
        fg_tensor *loss = fg_cross_entropy(fg_module_forward(m, x), y, -100);
        fg_status st = loss ? fg_backward(loss) : fg_last_status();
        fx_alloc_end();
        if (st == FG_OK && fx_alloc_count() < fail_at) break;
        if (st != FG_OK) {
            if (fg_last_error()[0] == '\0') (*errors) = -1000000;
            (*errors)++;
        }
        fg_module_zero_grad(m);
    }
    fg_step_thread_release();
    fg_module_free(m);
    return NULL;
}

TEST(every_failed_allocation_is_an_error) {
    int errors = 0;
    pthread_t t;
    pthread_create(&t, NULL, failing_steps, &errors);
    pthread_join(t, NULL);
    CHECK_MSG(errors > 0, "%d failed steps", errors);
}
