/* The tape: backward order, gradient accumulation, no-grad mode, the
 * gradient-ready hook, broadcasting gradients by finite differences. */
#include "gradcheck.h"

static fg_tensor *f_add(fg_tensor **in, void *arg) {
    (void)arg;
    return fg_add(in[0], in[1]);
}
static fg_tensor *f_sub(fg_tensor **in, void *arg) {
    (void)arg;
    return fg_sub(in[0], in[1]);
}
static fg_tensor *f_mul(fg_tensor **in, void *arg) {
    (void)arg;
    return fg_mul(in[0], in[1]);
}
static fg_tensor *f_scale(fg_tensor **in, void *arg) {
    (void)arg;
    return fg_scale(in[0], -2.5);
}
static fg_tensor *f_square(fg_tensor **in, void *arg) {
    (void)arg;
    return fg_mul(in[0], in[0]);
}

TEST(binary_ops_gradients_with_broadcasting) {
    int64_t s34[] = {3, 4}, s4[] = {4}, s31[] = {3, 1}, s234[] = {2, 3, 4};
    fg_tensor *a = gc_randn(2, s34, 1, 1), *b = gc_randn(1, s4, 2, 1), *c = gc_randn(2, s31, 3, 1);
    fg_tensor *d = gc_randn(3, s234, 4, 1);
    fg_tensor *all[] = {a, b, c, d};
    for (int i = 0; i < 4; i++) fg_tensor_set_requires_grad(all[i], true);
    fg_tensor *ab[] = {a, b}, *ac[] = {a, c}, *da[] = {d, a}, *cb[] = {c, b};
    CHECK(gradcheck("add (3,4)+(4)", f_add, ab, 2, NULL, 1e-6, 1e-8) == 0);
    CHECK(gradcheck("sub (3,4)-(3,1)", f_sub, ac, 2, NULL, 1e-6, 1e-8) == 0);
    CHECK(gradcheck("mul (2,3,4)*(3,4)", f_mul, da, 2, NULL, 1e-6, 1e-8) == 0);
    CHECK(gradcheck("mul (3,1)*(4)", f_mul, cb, 2, NULL, 1e-6, 1e-8) == 0);
    CHECK(gradcheck("scale", f_scale, ab, 1, NULL, 1e-6, 1e-8) == 0);
    CHECK(gradcheck("x*x", f_square, ab, 1, NULL, 1e-6, 1e-8) == 0);
    for (int i = 0; i < 4; i++) fg_tensor_free(all[i]);
}

TEST(forward_matches_naive_broadcast) {
    float av[6] = {1, 2, 3, 4, 5, 6}, bv[3] = {10, 20, 30};
    int64_t s23[] = {2, 3}, s3[] = {3};
    fg_tensor *a = fg_from_data(FG_F32, 2, s23, av), *b = fg_from_data(FG_F32, 1, s3, bv);
    fg_tensor *y = fg_mul(a, b);
    CHECK(y && fg_tensor_dim(y, 0) == 2 && fg_tensor_dim(y, 1) == 3);
    for (int i = 0; i < 6; i++) CHECK(fg_tensor_get(y, i) == av[i] * bv[i % 3]);
    int64_t s4[] = {4};
    CHECK(fg_add(a, fg_zeros(FG_F32, 1, s4)) == NULL);
    CHECK_CONTAINS(fg_last_error(), "do not broadcast");
    CHECK(fg_add(NULL, a) == NULL);
    fg_step_reset();
}

static int g_ready_order[8], g_nready;
static fg_tensor *g_params[3];
static void on_ready(void *ud, fg_tensor *leaf) {
    (void)ud;
    for (int i = 0; i < 3; i++)
        if (g_params[i] == leaf) g_ready_order[g_nready++] = i;
}

TEST(accumulation_nograd_and_ready_hook) {
    int64_t s[] = {2};
    for (int i = 0; i < 3; i++) {
        g_params[i] = fg_tensor_new(FG_F32, 1, s);
        CHECK_OK(fg_tensor_fill(g_params[i], i + 1.0));
        fg_tensor_set_requires_grad(g_params[i], true);
    }
    /* z = ((p0 * p1) + p2) * p2, seeded with ones: p2 is final after the add
     * (its second use), before the mul that needs p0 and p1 */
    fg_set_grad_ready_hook(on_ready, NULL);
    for (int rep = 0; rep < 2; rep++) {
        g_nready = 0;
        fg_tensor *t = fg_add(fg_mul(g_params[0], g_params[1]), g_params[2]);
        fg_tensor *z = fg_mul(t, g_params[2]);
        CHECK_OK(fg_backward_with(z, fg_full(FG_F32, 1, s, 1.0)));
        CHECK_STATUS(fg_backward_with(z, fg_full(FG_F32, 1, s, 1.0)), FG_ESTATE);
        CHECK(g_nready == 3);
        CHECK(g_ready_order[0] == 2 && g_ready_order[1] == 0 && g_ready_order[2] == 1);
        fg_step_reset();
    }
    fg_set_grad_ready_hook(NULL, NULL);
    /* two backward passes accumulate: d/dp0 = p1*p2 = 2*3 = 6, twice */
    CHECK(fg_tensor_get(fg_tensor_grad(g_params[0]), 0) == 12);
    /* d/dp2 = p0*p1 + 2*p2 = 2 + 6 = 8, twice */
    CHECK(fg_tensor_get(fg_tensor_grad(g_params[2]), 1) == 16);
    fg_tensor_zero_grad(g_params[0]);
    CHECK(fg_tensor_get(fg_tensor_grad(g_params[0]), 0) == 0);
    bool prev = fg_set_grad_enabled(false);
    fg_tensor *q = fg_mul(g_params[0], g_params[1]);
    CHECK(q && !fg_tensor_requires_grad(q) && fg_tape_size() == 0);
    CHECK_STATUS(fg_backward_with(q, NULL), FG_EINVAL);
    fg_set_grad_enabled(prev);
    fg_step_reset();
    for (int i = 0; i < 3; i++) fg_tensor_free(g_params[i]);
}
