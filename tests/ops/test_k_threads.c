/* The kernels of user models (unary, where, add_strided, index_select /
 * index_add, gather / scatter_add, max_dim, cumsum, the pointwise losses,
 * nll, conv2d's im2col path, pooling) at sizes past their threading
 * threshold: on 3 threads the same bits as on one (each output element is
 * written by one thread, in the same order), f32 and f64; conv2d to
 * rounding (its matrix products choose their engine per thread count). */
#include <string.h>

#include "fulgur/ops.h"
#include "harness.h"

static fg_tensor *rnd(fg_dtype dt, int nd, const int64_t *shape, uint64_t seed) {
    fg_tensor *t = fg_empty(dt, nd, shape);
    fg_rng r = {seed, 0};
    for (int64_t i = 0; i < fg_tensor_numel(t); i++) {
        double v = fg_rng_normal(&r);
        if (dt == FG_F32) ((float *)fg_tensor_data(t))[i] = (float)v;
        else ((double *)fg_tensor_data(t))[i] = v;
    }
    return t;
}

/* where conv2d's three outputs are in out[]: its products may take another
 * engine at another thread count (FULGUR_GEMM=auto measures per shape and
 * thread count), so they are compared to rounding, not bitwise */
static int g_conv_first;

/* Runs every kernel into fresh outputs; out[k] collects them. */
static int run_all(fg_dtype dt, fg_tensor **out) {
    const fg_op_table *ops = fg_ops_get(FG_CPU);
    int k = 0;
    int64_t s[] = {64, 33, 40}; /* 84480 elements */
    fg_tensor *x = rnd(dt, 3, s, 1), *y = rnd(dt, 3, s, 2);
    for (int op = FG_UN_EXP; op <= FG_UN_ELU; op++) {
        fg_tensor *xa = fg_empty_like(x);
        CHECK_OK(ops->unary_fwd(FG_UN_ABS, x, 0, 0, xa)); /* a domain for log, sqrt */
        fg_tensor *o = fg_empty_like(x), *d = fg_zeros_like(x);
        CHECK_OK(ops->unary_fwd((fg_unary_op)op, xa, 0.5, 3, o));
        CHECK_OK(ops->unary_bwd((fg_unary_op)op, xa, o, y, 0.5, 3, d));
        out[k++] = o;
        out[k++] = d;
    }
    fg_tensor *m = fg_empty(FG_U8, 3, s);
    for (int64_t i = 0; i < fg_tensor_numel(m); i++) ((uint8_t *)fg_tensor_data(m))[i] = i % 3 == 0;
    fg_tensor *w = fg_empty_like(x);
    CHECK_OK(ops->where(m, x, NULL, 0, 2, w));
    out[k++] = w;
    fg_tensor *acc = fg_zeros_like(x);
    CHECK_OK(
        ops->add_strided(fg_tensor_transpose_view(y, 0, 2), fg_tensor_transpose_view(acc, 0, 2)));
    out[k++] = acc;
    int64_t ni = 50;
    fg_tensor *idx = fg_empty(FG_I32, 1, &ni);
    for (int i = 0; i < 50; i++) ((int32_t *)fg_tensor_data(idx))[i] = (i * 7) % 33;
    int64_t so[] = {64, 50, 40};
    fg_tensor *sel = fg_empty(dt, 3, so), *ia = fg_zeros_like(x);
    CHECK_OK(ops->index_select(x, 1, idx, sel));
    CHECK_OK(ops->index_add(sel, 1, idx, ia));
    out[k++] = sel;
    out[k++] = ia;
    int64_t sg[] = {64, 20, 40};
    fg_tensor *gi = fg_empty(FG_I32, 3, sg);
    for (int64_t i = 0; i < fg_tensor_numel(gi); i++)
        ((int32_t *)fg_tensor_data(gi))[i] = (int32_t)((i * 13) % 33);
    fg_tensor *ga = fg_empty(dt, 3, sg), *sc = fg_zeros_like(x);
    CHECK_OK(ops->gather(x, 1, gi, ga));
    CHECK_OK(ops->scatter_add(ga, 1, gi, sc));
    out[k++] = ga;
    out[k++] = sc;
    int64_t sm[] = {64, 40};
    fg_tensor *mx = fg_empty(dt, 2, sm), *mi = fg_empty(FG_I32, 2, sm), *cs = fg_empty_like(x);
    CHECK_OK(ops->max_dim(x, 1, false, mx, mi));
    CHECK_OK(ops->cumsum(x, 1, true, cs));
    out[k++] = mx;
    out[k++] = mi;
    out[k++] = cs;
    for (int op = FG_LOSS_MSE; op <= FG_LOSS_KL_DIV; op++) {
        fg_tensor *l = fg_empty_like(x), *dx = fg_zeros_like(x), *dt2 = fg_zeros_like(x);
        fg_tensor *pr = fg_empty_like(x);
        CHECK_OK(ops->unary_fwd(FG_UN_SIGMOID, x, 0, 0, pr)); /* probabilities for BCE */
        const fg_tensor *in = op == FG_LOSS_BCE ? pr : x;
        CHECK_OK(ops->pointwise_loss_fwd((fg_loss_op)op, in, pr, NULL, 0.7, l));
        CHECK_OK(ops->pointwise_loss_bwd((fg_loss_op)op, in, pr, NULL, 0.7, y, dx, dt2));
        out[k++] = l;
        out[k++] = dx;
        out[k++] = dt2;
    }
    int64_t s2[] = {2112, 40}, nr = 2112;
    fg_tensor *lp = fg_tensor_reshape_view(x, 2, s2), *tt = fg_empty(FG_I32, 1, &nr);
    for (int i = 0; i < 2112; i++)
        ((int32_t *)fg_tensor_data(tt))[i] = i % 41 == 40 ? -100 : i % 40;
    fg_tensor *rows = fg_empty(dt, 1, &nr), *dl = fg_zeros(dt, 2, s2);
    double wsum = 0;
    CHECK_OK(ops->nll_fwd(lp, tt, NULL, -100, 0.1, rows, &wsum));
    CHECK_OK(ops->nll_bwd(tt, NULL, -100, 0.1, rows, dl));
    out[k++] = rows;
    out[k++] = dl;
    int64_t sx[] = {4, 6, 31, 29}, sw[] = {8, 3, 3, 3};
    fg_tensor *cx = rnd(dt, 4, sx, 3), *cw = rnd(dt, 4, sw, 4);
    fg_conv_params cp = {{1, 2}, {1, 1}, {1, 2}, 2, false, false};
    int64_t sy[] = {4, 8, 31, 14};
    fg_tensor *cy = fg_empty(dt, 4, sy), *cdx = fg_zeros_like(cx), *cdw = fg_zeros_like(cw);
    g_conv_first = k;
    CHECK_OK(ops->conv2d_fwd(cx, cw, NULL, &cp, cy));
    CHECK_OK(ops->conv2d_bwd_data(cy, cw, &cp, cdx));
    CHECK_OK(ops->conv2d_bwd_weight(cx, cy, &cp, cdw, NULL));
    out[k++] = cy;
    out[k++] = cdx;
    out[k++] = cdw;
    for (int kind = 0; kind < 3; kind++) {
        fg_pool_params pp = {(fg_pool_kind)kind, {3, 3}, {2, 2}, {1, 1}, {1, 1}, kind == 1};
        int64_t sp[] = {4, 6, 16, 15};
        fg_tensor *py = fg_empty(dt, 4, sp), *pi = fg_empty(FG_I32, 4, sp), *pd = fg_zeros_like(cx);
        CHECK_OK(ops->pool2d_fwd(cx, &pp, py, pi));
        CHECK_OK(ops->pool2d_bwd(py, pi, &pp, pd));
        out[k++] = py;
        out[k++] = pd;
    }
    return k;
}

TEST(threaded_kernels_give_one_threads_bits) {
    setenv("FULGUR_CONV", "im2col", 1); /* oneDNN's own threading is its own */
    fg_dtype dts[] = {FG_F32, FG_F64};
    for (int d = 0; d < 2; d++) {
        fg_tensor *a[80], *b[80];
        CHECK_OK(fg_set_num_threads(1));
        int na = run_all(dts[d], a);
        CHECK_OK(fg_set_num_threads(3));
        int nb = run_all(dts[d], b);
        CHECK(na == nb && na > 40);
        int bad = 0;
        for (int k = 0; k < na && k < nb; k++) {
            if (k >= g_conv_first && k < g_conv_first + 3) {
                int off = 0;
                for (int64_t i = 0; i < fg_tensor_numel(a[k]); i++) {
                    double u = fg_tensor_get(a[k], i), v = fg_tensor_get(b[k], i);
                    off += fabs(u - v) > 1e-5 * (1 + fabs(u));
                }
                if (off) fprintf(stderr, "  conv output %d: %d values differ\n", k, off);
                bad += off != 0;
                continue;
            }
            if (memcmp(fg_tensor_data(a[k]), fg_tensor_data(b[k]), fg_tensor_nbytes(a[k])) != 0) {
                fprintf(stderr, "  output %d differs (%s)\n", k, fg_dtype_name(dts[d]));
                bad++;
            }
        }
        CHECK_MSG(bad == 0, "%s: %d outputs differ across thread counts", fg_dtype_name(dts[d]),
                  bad);
        fg_step_reset();
    }
    unsetenv("FULGUR_CONV");
    CHECK_OK(fg_set_num_threads(1));
}
