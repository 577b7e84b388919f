/* Joining, slicing and indexing: cat (2 to 9 inputs, the tree of nodes
 * past four), stack, split, narrow, slice with steps, permute, expand,
 * flatten, index_select, gather, scatter_add, where, masked_fill, max/min
 * over a dim with indices, argmax/argmin and cumsum. Gradients by finite
 * differences in f64 at odd sizes, values against naive loops, f32 values,
 * and the errors (an index out of range named). */
#include "gradcheck.h"

static void req(fg_tensor **t, int n) {
    for (int i = 0; i < n; i++) fg_tensor_set_requires_grad(t[i], true);
}
static void free_all(fg_tensor **t, int n) {
    for (int i = 0; i < n; i++) fg_tensor_free(t[i]);
}
static fg_tensor *ints(int nd, const int64_t *shape, const int32_t *v) {
    fg_tensor *t = fg_tensor_new(FG_I32, nd, shape);
    memcpy(fg_tensor_data(t), v, fg_tensor_nbytes(t));
    return t;
}

#define GC(what, f, in, nin, arg) gradcheck(what, f, in, nin, arg, 1e-6, 1e-8)

/* A weighted chain so that every output element matters differently. */
typedef struct {
    int n, dim;
} cat_arg;

static fg_tensor *f_cat(fg_tensor **in, void *arg) {
    cat_arg *a = arg;
    return fg_cat(in, a->n, a->dim);
}
static fg_tensor *f_stack(fg_tensor **in, void *arg) {
    cat_arg *a = arg;
    return fg_stack(in, a->n, a->dim);
}

TEST(cat_and_stack_gradients_and_values) {
    fg_tensor *in[9];
    for (int k = 0; k < 9; k++) {
        int64_t s[] = {3, 1 + k % 3, 5};
        in[k] = gc_randn(3, s, 10 + k, 1);
    }
    req(in, 9);
    int ns[] = {1, 2, 4, 5, 9};
    for (int j = 0; j < 5; j++) {
        cat_arg a = {ns[j], 1};
        CHECK_MSG(GC("cat", f_cat, in, ns[j], &a) == 0, "cat of %d", ns[j]);
    }
    fg_tensor *y = fg_cat(in, 9, -2);
    CHECK(y && fg_tensor_dim(y, 1) == 18);
    /* element (2, 4, 3): input 2 (sizes 1, 2, 3 before: rows 0, 1-2, 3-5) at row 1 */
    CHECK(y &&
          fg_tensor_get(y, 2 * 18 * 5 + 4 * 5 + 3) == fg_tensor_get(in[2], 2 * 15 + 1 * 5 + 3));
    fg_step_reset();
    /* stack: same shapes, every new dim */
    fg_tensor *st[5];
    for (int k = 0; k < 5; k++) st[k] = gc_randn(2, (int64_t[]){2, 3}, 40 + k, 1);
    req(st, 5);
    for (int d = -3; d < 3; d++) {
        cat_arg a = {5, d};
        CHECK_MSG(GC("stack", f_stack, st, 5, &a) == 0, "stack dim %d", d);
    }
    y = fg_stack(st, 5, 1);
    CHECK(y && fg_tensor_ndim(y) == 3 && fg_tensor_dim(y, 1) == 5 &&
          fg_tensor_get(y, 1 * 15 + 3 * 3 + 2) == fg_tensor_get(st[3], 1 * 3 + 2));
    /* errors */
    CHECK(fg_cat(in, 2, 0) == NULL);
    CHECK_CONTAINS(fg_last_error(), "does not match tensor 0");
    CHECK(fg_stack(in, 2, 0) == NULL);
    CHECK(fg_cat(in, 2, 3) == NULL);
    CHECK_CONTAINS(fg_last_error(), "out of range");
    fg_step_reset();
    free_all(in, 9);
    free_all(st, 5);
}

typedef struct {
    int kind, dim;
    int64_t a, b, c;
} sl_arg;

static fg_tensor *f_slice(fg_tensor **in, void *arg) {
    sl_arg *s = arg;
    if (s->kind == 0) return fg_narrow(in[0], s->dim, s->a, s->b);
    if (s->kind == 1) return fg_slice(in[0], s->dim, s->a, s->b, s->c);
    fg_tensor *out[8];
    int n = 0;
    if (fg_split(in[0], s->a, s->dim, out, 8, &n)) return NULL;
    /* the pieces weighed differently, then joined back */
    for (int k = 0; k < n; k++) out[k] = fg_scale(out[k], 1.0 + k);
    return fg_cat(out, n, s->dim);
}

TEST(narrow_slice_split_gradients_and_values) {
    int64_t s[] = {4, 7, 3};
    fg_tensor *x = gc_randn(3, s, 5, 1);
    req(&x, 1);
    sl_arg args[] = {{0, 1, 2, 4, 0},   {0, -1, 1, 2, 0},     {0, 0, -2, 2, 0}, {1, 1, 1, 7, 2},
                     {1, 1, -5, -1, 3}, {1, 0, -100, 100, 1}, {1, 2, 0, 3, 5},  {2, 1, 3, 0, 0},
                     {2, 0, 1, 0, 0},   {2, 2, 2, 0, 0}};
    for (int k = 0; k < 10; k++)
        CHECK_MSG(GC("slice", f_slice, &x, 1, &args[k]) == 0, "case %d", k);
    fg_tensor *y = fg_slice(x, 1, 1, 7, 2); /* rows 1, 3, 5 */
    CHECK(y && fg_tensor_dim(y, 1) == 3 && fg_tensor_is_contiguous(y));
    CHECK(y && fg_tensor_get(y, 2 * 9 + 2 * 3 + 1) == fg_tensor_get(x, 2 * 21 + 5 * 3 + 1));
    y = fg_slice(x, 1, 5, 2, 1); /* empty */
    CHECK(y && fg_tensor_numel(y) == 0);
    fg_tensor *out[8];
    int n = 0;
    CHECK_OK(fg_split(x, 3, 1, out, 8, &n));
    CHECK(n == 3 && fg_tensor_dim(out[2], 1) == 1);
    CHECK_OK(fg_split_sizes(x, (int64_t[]){2, 0, 5}, 3, 1, out));
    CHECK(fg_tensor_dim(out[1], 1) == 0 && fg_tensor_dim(out[2], 1) == 5);
    CHECK(fg_split_sizes(x, (int64_t[]){2, 4}, 2, 1, out) != FG_OK);
    CHECK_CONTAINS(fg_last_error(), "sum to 6");
    CHECK(fg_split(x, 1, 1, out, 3, &n) != FG_OK);
    CHECK(fg_narrow(x, 1, 5, 3) == NULL);
    CHECK(fg_slice(x, 1, 0, 3, 0) == NULL);
    fg_step_reset();
    fg_tensor_free(x);
}

typedef struct {
    int perm[4];
    int nd;
    int64_t shape[4];
} pe_arg;

static fg_tensor *f_permute(fg_tensor **in, void *arg) {
    return fg_permute(in[0], ((pe_arg *)arg)->perm);
}
static fg_tensor *f_expand(fg_tensor **in, void *arg) {
    pe_arg *a = arg;
    return fg_expand(in[0], a->nd, a->shape);
}

TEST(permute_expand_flatten_gradients_and_values) {
    int64_t s[] = {2, 3, 5};
    fg_tensor *x = gc_randn(3, s, 6, 1);
    req(&x, 1);
    pe_arg ps[] = {
        {{2, 0, 1}, 0, {0}}, {{1, 2, 0}, 0, {0}}, {{0, 1, 2}, 0, {0}}, {{-1, 0, -2}, 0, {0}}};
    for (int k = 0; k < 4; k++) CHECK_MSG(GC("permute", f_permute, &x, 1, &ps[k]) == 0, "%d", k);
    fg_tensor *y = fg_permute(x, (int[]){2, 0, 1}); /* (5, 2, 3) */
    CHECK(y && fg_tensor_dim(y, 0) == 5 &&
          fg_tensor_get(y, 4 * 6 + 1 * 3 + 2) == fg_tensor_get(x, 1 * 15 + 2 * 5 + 4));
    CHECK(fg_permute(x, (int[]){0, 0, 1}) == NULL);
    CHECK_CONTAINS(fg_last_error(), "repeats");
    int64_t s2[] = {3, 1};
    fg_tensor *e = gc_randn(2, s2, 7, 1);
    req(&e, 1);
    pe_arg es[] = {{{0}, 2, {3, 4}}, {{0}, 3, {2, 3, 5}}, {{0}, 3, {2, -1, -1}}, {{0}, 2, {3, 1}}};
    for (int k = 0; k < 4; k++) CHECK_MSG(GC("expand", f_expand, &e, 1, &es[k]) == 0, "%d", k);
    y = fg_expand(e, 3, (int64_t[]){2, 3, 5});
    CHECK(y && fg_tensor_get(y, 1 * 15 + 2 * 5 + 3) == fg_tensor_get(e, 2));
    CHECK(fg_expand(e, 2, (int64_t[]){4, 4}) == NULL);
    CHECK_CONTAINS(fg_last_error(), "only dims of size 1");
    y = fg_flatten(x, 1, -1);
    CHECK(y && fg_tensor_ndim(y) == 2 && fg_tensor_dim(y, 1) == 15);
    y = fg_flatten(x, 0, 1);
    CHECK(y && fg_tensor_ndim(y) == 2 && fg_tensor_dim(y, 0) == 6);
    fg_step_reset();
    fg_tensor_free(x);
    fg_tensor_free(e);
}

typedef struct {
    int dim;
    fg_tensor *idx;
} ix_arg;

static fg_tensor *f_index_select(fg_tensor **in, void *arg) {
    ix_arg *a = arg;
    return fg_index_select(in[0], a->dim, a->idx);
}
static fg_tensor *f_gather(fg_tensor **in, void *arg) {
    ix_arg *a = arg;
    return fg_gather(in[0], a->dim, a->idx);
}
static fg_tensor *f_scatter_add(fg_tensor **in, void *arg) {
    ix_arg *a = arg;
    return fg_scatter_add(in[0], a->dim, a->idx, in[1]);
}

TEST(index_select_gather_scatter_add_gradients_and_values) {
    int64_t s[] = {4, 5, 3};
    fg_tensor *x = gc_randn(3, s, 8, 1);
    req(&x, 1);
    int64_t k5 = 5;
    int32_t iv[] = {3, 0, 3, 1, 4}; /* repeated indices add up */
    fg_tensor *idx = ints(1, &k5, iv);
    for (int d = 0; d < 3; d++) {
        int32_t clipped[5];
        for (int k = 0; k < 5; k++) clipped[k] = iv[k] % (int32_t)s[d];
        fg_tensor *ic = ints(1, &k5, clipped);
        ix_arg a = {d, ic};
        CHECK_MSG(GC("index_select", f_index_select, &x, 1, &a) == 0, "dim %d", d);
        fg_tensor_free(ic);
    }
    fg_tensor *y = fg_index_select(x, 1, idx);
    CHECK(y && fg_tensor_dim(y, 1) == 5 &&
          fg_tensor_get(y, 2 * 15 + 2 * 3 + 1) == fg_tensor_get(x, 2 * 15 + 3 * 3 + 1));
    /* gather along each dim with an index smaller than x elsewhere */
    int64_t gs[] = {3, 4, 2};
    fg_tensor *gi = fg_tensor_new(FG_I32, 3, gs);
    int32_t *pg = fg_tensor_data(gi);
    for (int d = 0; d < 3; d++) {
        for (int i = 0; i < 24; i++) pg[i] = (int32_t)((i * 7 + 3) % s[d]);
        ix_arg a = {d, gi};
        CHECK_MSG(GC("gather", f_gather, &x, 1, &a) == 0, "gather dim %d", d);
        /* scatter_add of src (3, 4, 2) into a (4, 5, 3): gradients into both */
        fg_tensor *in[2] = {x, gc_randn(3, gs, 60 + d, 1)};
        req(in, 2);
        CHECK_MSG(GC("scatter_add", f_scatter_add, in, 2, &a) == 0, "scatter dim %d", d);
        /* a larger src: its corner is used */
        fg_tensor *in2[2] = {x, gc_randn(3, (int64_t[]){4, 5, 3}, 70 + d, 1)};
        req(in2, 2);
        CHECK_MSG(GC("scatter_add big src", f_scatter_add, in2, 2, &a) == 0, "dim %d", d);
        if (d == 1) { /* values: naive */
            fg_tensor *g = fg_gather(x, 1, gi), *sa = fg_scatter_add(x, 1, gi, in[1]);
            double want[60];
            for (int i = 0; i < 60; i++) want[i] = fg_tensor_get(x, i);
            int bad = 0;
            for (int i = 0; i < 3; i++)
                for (int j = 0; j < 4; j++)
                    for (int k = 0; k < 2; k++) {
                        int q = pg[i * 8 + j * 2 + k];
                        bad += fg_tensor_get(g, i * 8 + j * 2 + k) !=
                               fg_tensor_get(x, i * 15 + q * 3 + k);
                        want[i * 15 + q * 3 + k] += fg_tensor_get(in[1], i * 8 + j * 2 + k);
                    }
            for (int i = 0; i < 60; i++) bad += fabs(fg_tensor_get(sa, i) - want[i]) > 1e-15;
            CHECK_MSG(bad == 0, "gather/scatter values: %d off", bad);
        }
        fg_step_reset();
        fg_tensor_free(in[1]);
        fg_tensor_free(in2[1]);
    }
    /* errors: the bad index named */
    pg[5] = 9;
    CHECK(fg_gather(x, 2, gi) == NULL);
    CHECK_CONTAINS(fg_last_error(), "index 9 (at 5)");
    iv[2] = -1;
    memcpy(fg_tensor_data(idx), iv, sizeof iv);
    CHECK(fg_index_select(x, 0, idx) == NULL);
    CHECK_CONTAINS(fg_last_error(), "index -1 (at 2)");
    CHECK(fg_gather(x, 0, x) == NULL);
    CHECK_CONTAINS(fg_last_error(), "expected i32");
    fg_step_reset();
    fg_tensor_free(x);
    fg_tensor_free(idx);
    fg_tensor_free(gi);
}

typedef struct {
    fg_tensor *mask;
} wh_arg;

static fg_tensor *f_where(fg_tensor **in, void *arg) {
    return fg_where(((wh_arg *)arg)->mask, in[0], in[1]);
}
static fg_tensor *f_masked_fill(fg_tensor **in, void *arg) {
    return fg_masked_fill(in[0], ((wh_arg *)arg)->mask, -3.5);
}

TEST(where_and_masked_fill_gradients_with_broadcasting) {
    int64_t sm[] = {3, 1, 5}, sa[] = {4, 5}, sb[] = {3, 4, 1};
    fg_tensor *m = fg_tensor_new(FG_U8, 3, sm);
    uint8_t *pm = fg_tensor_data(m);
    for (int i = 0; i < 15; i++) pm[i] = (uint8_t)(i % 3 == 0);
    fg_tensor *in[2] = {gc_randn(2, sa, 1, 1), gc_randn(3, sb, 2, 1)};
    req(in, 2);
    wh_arg a = {m};
    CHECK(GC("where", f_where, in, 2, &a) == 0);
    fg_tensor *y = fg_where(m, in[0], in[1]);
    CHECK(y && fg_tensor_ndim(y) == 3 && fg_tensor_dim(y, 1) == 4);
    /* (1, 2, 3): mask[1][0][3] = (8 % 3 == 0) false -> b[1][2][0] */
    CHECK(y && fg_tensor_get(y, 1 * 20 + 2 * 5 + 3) == fg_tensor_get(in[1], 1 * 4 + 2));
    CHECK(y && fg_tensor_get(y, 1 * 20 + 2 * 5 + 4) == fg_tensor_get(in[0], 2 * 5 + 4));
    /* masked_fill with an i32 mask broadcast over rows */
    int64_t s5[] = {5};
    int32_t mv[] = {0, 7, 0, 0, -1};
    fg_tensor *mi = ints(1, s5, mv);
    wh_arg b = {mi};
    CHECK(GC("masked_fill", f_masked_fill, in, 1, &b) == 0);
    y = fg_masked_fill(in[0], mi, -3.5);
    CHECK(y && fg_tensor_get(y, 6) == -3.5 && fg_tensor_get(y, 9) == -3.5 &&
          fg_tensor_get(y, 7) == fg_tensor_get(in[0], 7));
    CHECK(fg_where(in[0], in[0], in[1]) == NULL);
    CHECK_CONTAINS(fg_last_error(), "expected u8 or i32");
    fg_step_reset();
    free_all(in, 2);
    fg_tensor_free(m);
    fg_tensor_free(mi);
}

typedef struct {
    int dim;
    bool keep, is_min;
} mx_arg;

static fg_tensor *f_max(fg_tensor **in, void *arg) {
    mx_arg *a = arg;
    return a->is_min ? fg_min_dim(in[0], a->dim, a->keep, NULL)
                     : fg_max_dim(in[0], a->dim, a->keep, NULL);
}
static fg_tensor *f_cumsum(fg_tensor **in, void *arg) { return fg_cumsum(in[0], *(int *)arg); }

TEST(max_min_argmax_cumsum_gradients_and_values) {
    int64_t s[] = {3, 7, 4};
    fg_tensor *x = gc_randn(3, s, 12, 1);
    req(&x, 1);
    for (int d = -3; d < 3; d++)
        for (int k = 0; k < 4; k++) {
            mx_arg a = {d, k & 1, k >> 1};
            CHECK_MSG(GC("max/min", f_max, &x, 1, &a) == 0, "dim %d mode %d", d, k);
            CHECK_MSG(GC("cumsum", f_cumsum, &x, 1, &d) == 0, "cumsum dim %d", d);
        }
    fg_tensor *idx = NULL;
    fg_tensor *y = fg_max_dim(x, 1, false, &idx);
    fg_tensor *am = fg_argmax(x, 1, true), *an = fg_argmin(x, -1, false);
    CHECK(y && idx && fg_tensor_ndim(y) == 2 && fg_tensor_dtype(idx) == FG_I32 &&
          fg_tensor_ndim(am) == 3 && fg_tensor_dim(an, 1) == 7);
    int bad = 0;
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 4; k++) {
            int b = 0;
            for (int j = 1; j < 7; j++)
                if (fg_tensor_get(x, i * 28 + j * 4 + k) > fg_tensor_get(x, i * 28 + b * 4 + k))
                    b = j;
            bad += fg_tensor_get(idx, i * 4 + k) != b || fg_tensor_get(am, i * 4 + k) != b;
            bad += fg_tensor_get(y, i * 4 + k) != fg_tensor_get(x, i * 28 + b * 4 + k);
        }
    CHECK_MSG(bad == 0, "max values/indices: %d off", bad);
    fg_tensor *c = fg_cumsum(x, 1);
    double acc = 0;
    for (int j = 0; j < 7; j++) acc += fg_tensor_get(x, 2 * 28 + j * 4 + 3);
    CHECK_CLOSE(fg_tensor_get(c, 2 * 28 + 6 * 4 + 3), acc, 1e-14, 1e-14);
    /* ties: the first index; NaN is the largest */
    int64_t s4[] = {4};
    double tv[] = {1, 3, 3, NAN};
    fg_tensor *t = fg_from_data(FG_F64, 1, s4, tv);
    CHECK(fg_tensor_get(fg_argmax(fg_narrow(t, 0, 0, 3), 0, false), 0) == 1);
    CHECK(fg_tensor_get(fg_argmax(t, 0, false), 0) == 3 &&
          isnan(fg_item(fg_max_dim(t, 0, false, NULL))));
    CHECK(fg_tensor_get(fg_argmin(t, 0, false), 0) == 3);
    /* f32 values */
    fg_tensor *x32 = fg_empty(FG_F32, 3, s);
    CHECK_OK(fg_tensor_copy(x32, x));
    fg_tensor *y32 = fg_max_dim(x32, 1, false, NULL), *c32 = fg_cumsum(x32, 1);
    CHECK(y32 && fg_tensor_get(y32, 5) == (double)(float)fg_tensor_get(y, 5));
    CHECK_CLOSE(fg_tensor_get(c32, 2 * 28 + 6 * 4 + 3), acc, 1e-6, 1e-6);
    CHECK(fg_max_dim(fg_narrow(x, 1, 0, 0), 1, false, NULL) == NULL);
    CHECK_CONTAINS(fg_last_error(), "no elements");
    fg_step_reset();
    fg_tensor_free(x);
}
