/* bf16 tensors through the new functions (each kernel in f32 on widened
 * copies, its output rounded once): conv2d, max/avg pooling, where,
 * gather, cumsum, max_dim, and the backward of cat / slice (add_strided
 * into a strided bf16 gradient). Outputs and input gradients agree with
 * the f32 run on the same (bf16-valued) inputs to bf16's precision (the
 * chains round between their steps). */
#include "gradcheck.h"

/* a persistent bf16 tensor and its f32 twin with the same values */
static void pair(int nd, const int64_t *shape, uint64_t seed, fg_tensor **b, fg_tensor **f) {
    fg_tensor *d = gc_randn(nd, shape, seed, 1);
    *b = fg_tensor_new(FG_BF16, nd, shape);
    *f = fg_tensor_new(FG_F32, nd, shape);
    CHECK_OK(fg_tensor_copy(*b, d));
    CHECK_OK(fg_tensor_copy(*f, *b));
    fg_tensor_set_requires_grad(*b, true);
    fg_tensor_set_requires_grad(*f, true);
    fg_tensor_free(d);
}

typedef fg_tensor *(*op2)(fg_tensor *a, fg_tensor *b);

static fg_tensor *o_conv(fg_tensor *x, fg_tensor *w) {
    return fg_conv2d(x, w, NULL, &(fg_conv2d_opts){.padding = {1, 0}, .stride = {1, 2}});
}
static fg_tensor *o_pool(fg_tensor *x, fg_tensor *w) {
    (void)w;
    fg_tensor *a = fg_max_pool2d(x, (int64_t[]){2, 2}, NULL, NULL, NULL, false, NULL);
    return fg_add(a, fg_avg_pool2d(x, (int64_t[]){2, 2}, NULL, NULL, false, true));
}
static fg_tensor *o_cat(fg_tensor *x, fg_tensor *w) {
    (void)w;
    fg_tensor *parts[3] = {fg_slice(x, 2, 0, 5, 2), x, fg_narrow(x, 3, 1, 3)};
    fg_tensor *a = fg_cat(parts, 2, 2);
    return fg_add(fg_sum(a), fg_sum(fg_cat(&parts[1], 1, 3)));
}
static fg_tensor *o_misc(fg_tensor *x, fg_tensor *w) {
    (void)w;
    fg_tensor *m = fg_zeros(FG_U8, 4, fg_tensor_shape(x));
    ((uint8_t *)fg_tensor_data(m))[3] = 1;
    fg_tensor *y = fg_where(m, x, fg_cumsum(x, 3));
    fg_tensor *mx = fg_max_dim(y, 2, true, NULL);
    fg_tensor *idx = fg_zeros(FG_I32, 4, fg_tensor_shape(mx));
    return fg_add(mx, fg_gather(y, 2, idx));
}

TEST(bf16_layers_agree_with_f32) {
    op2 ops[] = {o_conv, o_pool, o_cat, o_misc};
    const char *names[] = {"conv2d", "pooling", "cat/slice", "where/cumsum/max/gather"};
    int64_t sx[] = {2, 3, 6, 5}, sw[] = {4, 3, 3, 2};
    for (int k = 0; k < 4; k++) {
        fg_tensor *xb, *xf, *wb, *wf;
        pair(4, sx, 1 + k, &xb, &xf);
        pair(4, sw, 11 + k, &wb, &wf);
        fg_tensor *yb = ops[k](xb, wb), *yf = ops[k](xf, wf);
        CHECK_MSG(yb && yf, "%s: %s", names[k], fg_last_error());
        if (!yb || !yf) continue;
        fg_tensor *yr = fg_empty(fg_tensor_dtype(yb), fg_tensor_ndim(yf), fg_tensor_shape(yf));
        CHECK_OK(fg_tensor_copy(yr, yf));
        int off = 0;
        for (int64_t i = 0; i < fg_tensor_numel(yb); i++) {
            double u = fg_tensor_get(yb, i), v = fg_tensor_get(yr, i);
            off += fabs(u - v) > 1e-2 * (1 + fabs(v)); /* composed ops round between */
        }
        CHECK_MSG(off == 0, "%s: %d outputs off", names[k], off);
        fg_tensor *sb = fg_full(fg_tensor_dtype(yb), fg_tensor_ndim(yb), fg_tensor_shape(yb), 1);
        fg_tensor *sf = fg_full(FG_F32, fg_tensor_ndim(yf), fg_tensor_shape(yf), 1);
        CHECK_OK(fg_backward_with(yb, sb));
        CHECK_OK(fg_backward_with(yf, sf));
        fg_tensor *gb = fg_tensor_grad(xb), *gf = fg_tensor_grad(xf);
        CHECK(gb && gf && fg_tensor_dtype(gb) == FG_BF16);
        off = 0;
        for (int64_t i = 0; gb && gf && i < fg_tensor_numel(gb); i++) {
            double u = fg_tensor_get(gb, i), v = fg_tensor_get(gf, i);
            off += fabs(u - v) > 2e-2 * (1 + fabs(v));
        }
        CHECK_MSG(off == 0, "%s: %d input gradients off", names[k], off);
        fg_step_reset();
        fg_tensor_free(xb);
        fg_tensor_free(xf);
        fg_tensor_free(wb);
        fg_tensor_free(wf);
    }
}
