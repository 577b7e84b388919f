/* Finite-difference gradient checks in f64 (kann's kad_check_grad, ggml's
 * test-backend-ops): for a function of several inputs, the analytic gradient
 * of L = sum(f(x) * w) (w fixed random weights) must match central
 * differences (L(x + h) - L(x - h)) / 2h for every element of every input
 * that requires grad. */
#ifndef FULGUR_TEST_GRADCHECK_H
#define FULGUR_TEST_GRADCHECK_H

#include "fulgur/autograd.h"
#include "harness.h"

typedef fg_tensor *(*fg_gc_fn)(fg_tensor **in, void *arg);

/* A persistent f64 tensor with values from a seeded normal (times scale). */
static inline fg_tensor *gc_randn(int ndim, const int64_t *shape, uint64_t seed, double scale) {
    fg_tensor *t = fg_tensor_new(FG_F64, ndim, shape);
    double *p = fg_tensor_data(t);
    fg_rng r = {seed, 0};
    for (int64_t i = 0; i < fg_tensor_numel(t); i++) p[i] = scale * fg_rng_normal(&r);
    return t;
}

static inline double gc_loss(fg_gc_fn f, fg_tensor **in, void *arg, const double *w) {
    bool prev = fg_set_grad_enabled(false);
    fg_tensor *y = f(in, arg);
    fg_set_grad_enabled(prev);
    if (!y) return NAN;
    double s = 0;
    for (int64_t i = 0; i < fg_tensor_numel(y); i++) s += fg_tensor_get(y, i) * w[i];
    return s;
}

/* Returns the number of elements whose gradient differs by more than
 * atol + rtol*|numeric|; prints the first few. in[k] must be persistent f64;
 * those with requires_grad set are checked. */
static inline int gradcheck(const char *what, fg_gc_fn f, fg_tensor **in, int nin, void *arg,
                            double rtol, double atol) {
    fg_step_reset();
    for (int k = 0; k < nin; k++)
        if (fg_tensor_requires_grad(in[k])) fg_tensor_zero_grad(in[k]);
    fg_tensor *y = f(in, arg);
    if (!y) {
        fprintf(stderr, "  %s: forward failed: %s\n", what, fg_last_error());
        return 1;
    }
    int64_t ny = fg_tensor_numel(y);
    double *w = malloc(sizeof(double) * (size_t)(ny ? ny : 1));
    fg_rng r = {1234, 0};
    for (int64_t i = 0; i < ny; i++) w[i] = fg_rng_normal(&r);
    fg_tensor *seed = fg_from_data(FG_F64, fg_tensor_ndim(y), fg_tensor_shape(y), w);
    fg_status s = fg_backward_with(y, seed);
    if (s != FG_OK) {
        fprintf(stderr, "  %s: backward failed: %s\n", what, fg_last_error());
        free(w);
        return 1;
    }
    int bad = 0;
    const double h = 1e-6;
    for (int k = 0; k < nin; k++) {
        if (!fg_tensor_requires_grad(in[k])) continue;
        fg_tensor *g = fg_tensor_grad(in[k]);
        double *x = fg_tensor_data(in[k]);
        for (int64_t i = 0; i < fg_tensor_numel(in[k]); i++) {
            double x0 = x[i];
            x[i] = x0 + h;
            double lp = gc_loss(f, in, arg, w);
            x[i] = x0 - h;
            double lm = gc_loss(f, in, arg, w);
            x[i] = x0;
            double num = (lp - lm) / (2 * h), ana = g ? fg_tensor_get(g, i) : 0.0;
            if (!(fabs(num - ana) <= atol + rtol * fabs(num))) {
                if (bad < 5)
                    fprintf(stderr, "  %s: input %d element %lld: analytic %.10g numeric %.10g\n",
                            what, k, (long long)i, ana, num);
                bad++;
            }
        }
    }
    free(w);
    fg_step_reset();
    return bad;
}

#endif
