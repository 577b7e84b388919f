/* conv2d / conv1d (stride, padding, "same", dilation, groups, bias),
 * max / avg / adaptive-avg pooling and batch_norm: gradients by finite
 * differences in f64 (im2col and the matrix product), values against the
 * definition, the f32 oneDNN path against im2col (FULGUR_CONV),
 * the output sizes of PyTorch (ceil_mode, "same"), the running statistics
 * and the errors. */
#include <stdlib.h>

#include "gradcheck.h"
#include "ops/cpu/k_ops.h"

static void req(fg_tensor **t, int n) {
    for (int i = 0; i < n; i++) fg_tensor_set_requires_grad(t[i], true);
}
static void free_all(fg_tensor **t, int n) {
    for (int i = 0; i < n; i++) fg_tensor_free(t[i]);
}

#define GC(what, f, in, nin, arg) gradcheck(what, f, in, nin, arg, 1e-6, 1e-8)

typedef struct {
    fg_conv2d_opts o;
    bool bias, one_d;
} cv_arg;

static fg_tensor *f_conv(fg_tensor **in, void *arg) {
    cv_arg *a = arg;
    return a->one_d ? fg_conv1d(in[0], in[1], a->bias ? in[2] : NULL, &a->o)
                    : fg_conv2d(in[0], in[1], a->bias ? in[2] : NULL, &a->o);
}

/* y[n][o][i][j] by the definition, in double */
static double naive(const fg_tensor *x, const fg_tensor *w, const fg_tensor *b, const cv_arg *a,
                    int64_t n, int64_t o, int64_t i, int64_t j, int64_t ph, int64_t pw) {
    int64_t C = fg_tensor_dim(x, 1), H = fg_tensor_dim(x, 2), W = fg_tensor_dim(x, 3);
    int64_t G = a->o.groups ? a->o.groups : 1, Cg = C / G, O = fg_tensor_dim(w, 0);
    int64_t KH = fg_tensor_dim(w, 2), KW = fg_tensor_dim(w, 3), g = o / (O / G);
    int64_t sh = a->o.stride[0] ? a->o.stride[0] : 1, sw = a->o.stride[1] ? a->o.stride[1] : 1;
    int64_t dh = a->o.dilation[0] ? a->o.dilation[0] : 1;
    int64_t dw = a->o.dilation[1] ? a->o.dilation[1] : 1;
    double s = b ? fg_tensor_get(b, o) : 0;
    for (int64_t c = 0; c < Cg; c++)
        for (int64_t kh = 0; kh < KH; kh++)
            for (int64_t kw = 0; kw < KW; kw++) {
                int64_t ih = i * sh - ph + kh * dh, iw = j * sw - pw + kw * dw;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                s += fg_tensor_get(x, ((n * C + g * Cg + c) * H + ih) * W + iw) *
                     fg_tensor_get(w, ((o * Cg + c) * KH + kh) * KW + kw);
            }
    return s;
}

TEST(conv2d_gradients_and_values_every_option) {
    struct {
        int64_t N, C, H, W, O, KH, KW;
        fg_conv2d_opts o;
        int64_t oh, ow; /* PyTorch's output size */
    } cases[] = {
        {2, 3, 7, 6, 4, 3, 3, {{1, 1}, {0, 0}, {1, 1}, 1, false}, 5, 4},
        {1, 4, 9, 8, 6, 3, 2, {{2, 3}, {1, 2}, {1, 1}, 2, false}, 5, 4},
        {2, 2, 7, 7, 3, 3, 3, {{1, 1}, {2, 1}, {2, 3}, 1, false}, 7, 3},
        {1, 3, 6, 5, 3, 2, 4, {{1, 1}, {0, 0}, {1, 2}, 3, true}, 6, 5},
        {1, 6, 5, 5, 4, 1, 1, {{2, 2}, {0, 0}, {1, 1}, 2, false}, 3, 3},
        {3, 1, 4, 5, 2, 4, 5, {{0, 0}, {0, 0}, {0, 0}, 0, false}, 1, 1},
        {2, 4, 5, 3, 6, 1, 1, {{1, 1}, {0, 0}, {1, 1}, 2, false}, 5, 3}, /* no patch matrix */
    };
    for (int c = 0; c < 7; c++) {
        int64_t G = cases[c].o.groups ? cases[c].o.groups : 1;
        int64_t sx[] = {cases[c].N, cases[c].C, cases[c].H, cases[c].W};
        int64_t sw[] = {cases[c].O, cases[c].C / G, cases[c].KH, cases[c].KW}, sb[] = {cases[c].O};
        fg_tensor *in[3] = {gc_randn(4, sx, 10 + c, 1), gc_randn(4, sw, 20 + c, 0.5),
                            gc_randn(1, sb, 30 + c, 1)};
        req(in, 3);
        for (int bias = 0; bias < 2; bias++) {
            cv_arg a = {cases[c].o, bias, false};
            CHECK_MSG(GC("conv2d", f_conv, in, 3, &a) == 0, "case %d bias %d", c, bias);
        }
        cv_arg a = {cases[c].o, true, false};
        fg_tensor *y = f_conv(in, &a);
        CHECK_MSG(y && fg_tensor_dim(y, 2) == cases[c].oh && fg_tensor_dim(y, 3) == cases[c].ow,
                  "case %d: output %lld x %lld, want %lld x %lld", c,
                  y ? (long long)fg_tensor_dim(y, 2) : -1LL,
                  y ? (long long)fg_tensor_dim(y, 3) : -1LL, (long long)cases[c].oh,
                  (long long)cases[c].ow);
        int64_t ph = cases[c].o.padding[0], pw = cases[c].o.padding[1];
        if (cases[c].o.same) {
            int64_t dh = cases[c].o.dilation[0] ? cases[c].o.dilation[0] : 1;
            int64_t dw = cases[c].o.dilation[1] ? cases[c].o.dilation[1] : 1;
            ph = dh * (cases[c].KH - 1) / 2;
            pw = dw * (cases[c].KW - 1) / 2;
        }
        int bad = 0;
        for (int64_t i = 0; y && i < fg_tensor_numel(y); i++) {
            int64_t OH = fg_tensor_dim(y, 2), OW = fg_tensor_dim(y, 3), O = cases[c].O;
            int64_t n = i / (O * OH * OW), o = i / (OH * OW) % O, r = i / OW % OH, s = i % OW;
            bad += fabs(fg_tensor_get(y, i) - naive(in[0], in[1], in[2], &a, n, o, r, s, ph, pw)) >
                   1e-13;
        }
        CHECK_MSG(bad == 0, "case %d: %d values off the definition", c, bad);
        /* f32: oneDNN (where built in) against im2col */
        fg_tensor *x32[3];
        for (int k = 0; k < 3; k++) {
            x32[k] = fg_tensor_new(FG_F32, fg_tensor_ndim(in[k]), fg_tensor_shape(in[k]));
            CHECK_OK(fg_tensor_copy(x32[k], in[k]));
        }
        req(x32, 3);
        fg_tensor *grads[2][3], *ys[2];
        for (int path = 0; path < 2; path++) {
            if (path) setenv("FULGUR_CONV", "im2col", 1);
            else unsetenv("FULGUR_CONV");
            for (int k = 0; k < 3; k++) fg_tensor_zero_grad(x32[k]);
            ys[path] = f_conv(x32, &a);
            fg_tensor *seed = ys[path] ? fg_full(FG_F32, 4, fg_tensor_shape(ys[path]), 0.5) : NULL;
            CHECK_OK(fg_backward_with(ys[path], seed));
            for (int k = 0; k < 3; k++) {
                grads[path][k] = fg_empty(FG_F32, fg_tensor_ndim(in[k]), fg_tensor_shape(in[k]));
                CHECK_OK(fg_tensor_copy(grads[path][k], fg_tensor_grad(x32[k])));
            }
        }
        unsetenv("FULGUR_CONV");
        bad = 0;
        for (int64_t i = 0; ys[0] && ys[1] && i < fg_tensor_numel(ys[0]); i++)
            bad += fabs(fg_tensor_get(ys[0], i) - fg_tensor_get(ys[1], i)) > 1e-5;
        for (int k = 0; k < 3; k++)
            for (int64_t i = 0; i < fg_tensor_numel(grads[0][k]); i++)
                bad += fabs(fg_tensor_get(grads[0][k], i) - fg_tensor_get(grads[1][k], i)) >
                       1e-5 * (1 + fabs(fg_tensor_get(grads[1][k], i)));
        CHECK_MSG(bad == 0, "case %d: f32 paths differ in %d values", c, bad);
        fg_step_reset();
        free_all(in, 3);
        free_all(x32, 3);
    }
    /* errors */
    fg_tensor *x = fg_zeros(FG_F64, 4, (int64_t[]){1, 4, 5, 5});
    fg_tensor *w = fg_zeros(FG_F64, 4, (int64_t[]){2, 3, 3, 3});
    CHECK(fg_conv2d(x, w, NULL, NULL) == NULL);
    CHECK_CONTAINS(fg_last_error(), "groups 1");
    w = fg_zeros(FG_F64, 4, (int64_t[]){2, 4, 7, 3});
    CHECK(fg_conv2d(x, w, NULL, NULL) == NULL);
    CHECK_CONTAINS(fg_last_error(), "smaller than");
    CHECK(fg_conv2d(x, w, NULL, &(fg_conv2d_opts){.stride = {2, 2}, .same = true}) == NULL);
    CHECK_CONTAINS(fg_last_error(), "stride 1");
    fg_step_reset();
}

/* f32 copies of f64 tensors (persistent, requiring gradients where asked) */
static fg_tensor *f32_of(const fg_tensor *t, bool grad) {
    fg_tensor *r = fg_tensor_new(FG_F32, fg_tensor_ndim(t), fg_tensor_shape(t));
    if (r && fg_tensor_copy(r, t)) fg_tensor_free(r), r = NULL;
    if (r && grad) fg_tensor_set_requires_grad(r, true);
    return r;
}

/* One f32 convolution's output and gradients (x, w, b into out[0..3]) on
 * the path FULGUR_CONV names (NULL: the default, oneDNN's blocked
 * layouts): route 0 with x a leaf, so that its gradient is added to (the
 * sum post-op of the blocked reorder); route 1 through x * 1 (exact), a
 * fresh gradient the convolution writes (fg_conv_params.overwrite); route
 * 2 twice on the leaf without zeroing, the second added to the first. */
static void conv_f32_run(const char *path, int route, fg_tensor **in, const fg_tensor *seed,
                         const fg_conv2d_opts *o, fg_tensor **out) {
    if (path) setenv("FULGUR_CONV", path, 1);
    else unsetenv("FULGUR_CONV");
    for (int k = 0; k < 3; k++) fg_tensor_zero_grad(in[k]);
    fg_tensor *y = NULL;
    for (int rep = 0; rep < (route == 2 ? 2 : 1); rep++) {
        fg_tensor *x = route == 1 ? fg_scale(in[0], 1.0) : in[0];
        y = fg_conv2d(x, in[1], in[2], o);
        CHECK_OK(fg_backward_with(y, seed));
    }
    out[0] = fg_empty(FG_F32, fg_tensor_ndim(y), fg_tensor_shape(y));
    CHECK_OK(fg_tensor_copy(out[0], y));
    for (int k = 0; k < 3; k++) {
        out[k + 1] = fg_empty(FG_F32, fg_tensor_ndim(in[k]), fg_tensor_shape(in[k]));
        CHECK_OK(fg_tensor_copy(out[k + 1], fg_tensor_grad(in[k])));
    }
    unsetenv("FULGUR_CONV");
}

/* values of a and b (times scale_b) that differ: bitwise when tol is 0,
 * else beyond tol (1 + |b|) */
static int differ(const fg_tensor *a, const fg_tensor *b, double scale_b, double tol) {
    int bad = 0;
    for (int64_t i = 0; i < fg_tensor_numel(a); i++) {
        double u = fg_tensor_get(a, i), v = scale_b * fg_tensor_get(b, i);
        bad += tol == 0 ? u != v : fabs(u - v) > tol * (1 + fabs(v));
    }
    return bad;
}

/* fulgur's Winograd in chunks of tiles and of filter rows (a scratch
 * buffer of 4 KiB: 16 tiles, 16 rows a chunk, the weight gradient summed
 * over the chunks of tiles) against its one-chunk run and im2col, on a
 * shape whose tiles and rows are not whole chunks */
TEST(conv2d_winograd_in_chunks_agrees) {
    /* 27 tiles (2 chunks); 4 tiles (1 chunk: the weight gradient's rows
     * then go in chunks too) */
    int64_t shapes[2][4] = {{3, 33, 11, 9}, {1, 33, 5, 7}};
    for (int c = 0; c < 2; c++) {
        int64_t *sx = shapes[c], sw[] = {40, 33, 3, 3}, sb[] = {40};
        fg_conv2d_opts o = {{1, 1}, {1, 1}, {1, 1}, 1, false};
        fg_tensor *d[3] = {gc_randn(4, sx, 81 + c, 1), gc_randn(4, sw, 82, 0.2),
                           gc_randn(1, sb, 83, 1)};
        fg_tensor *in[3] = {f32_of(d[0], true), f32_of(d[1], true), f32_of(d[2], true)};
        fg_conv_params cp = {.stride = {1, 1}, .pad = {1, 1}, .dilation = {1, 1}, .groups = 1};
        if (!fg__wino_conv_fits(in[0], in[1], &cp)) {
            free_all(d, 3);
            free_all(in, 3);
            SKIP("no vector ISA in use: fulgur's Winograd has no transforms here");
        }
        fg_tensor *y = fg_conv2d(in[0], in[1], in[2], &o);
        fg_tensor *sd = y ? gc_randn(4, fg_tensor_shape(y), 84, 1) : NULL;
        fg_tensor *seed = sd ? f32_of(sd, false) : NULL;
        CHECK(seed != NULL);
        if (!seed) return;
        fg_tensor *r[3][4]; /* one chunk, chunks, im2col */
        conv_f32_run("winograd", 0, in, seed, &o, r[0]);
        fg__wino_set_chunk(4096);
        conv_f32_run("winograd", 0, in, seed, &o, r[1]);
        fg__wino_set_chunk(0);
        conv_f32_run("im2col", 0, in, seed, &o, r[2]);
        for (int k = 0; k < 4; k++) {
            CHECK_MSG(differ(r[1][k], r[0][k], 1, 1.2e-4) == 0,
                      "shape %d tensor %d: chunks and one differ", c, k);
            CHECK_MSG(differ(r[1][k], r[2][k], 1, 1.2e-4) == 0,
                      "shape %d tensor %d: chunks and im2col differ", c, k);
        }
        fg_step_reset();
        for (int i = 0; i < 3; i++) free_all(r[i], 4);
        free_all(d, 3);
        free_all(in, 3);
        fg_tensor_free(sd);
        fg_tensor_free(seed);
    }
}

/* oneDNN's blocked layouts (nChw16c on AVX-512, nChw8c on AVX2: the test
 * runs again with oneDNN capped to AVX2) on its direct and its Winograd
 * algorithm (3x3, stride 1: where oneDNN has it, AVX-512; the default
 * measures which), fulgur's Winograd (k_conv_wino.c, on any vector ISA)
 * against oneDNN's plain layouts and im2col, at shapes whose
 * channels make oneDNN block them: strided, 1x1 with stride 2 (inputs no
 * window reads, whose gradient must be written as 0), rows the last
 * window leaves out, groups, sizes no 4x4 Winograd tile divides, channels
 * no vector divides, padding 2 (the input gradient's 0). Within
 * one path the written (fresh) and the added input gradient are bitwise
 * the same, and the twice-added one is twice the single; across paths
 * the kernels differ (jit against gemm, Winograd's transforms), so within
 * 1e-5 (1 + |v|) of im2col, 6e-5 on Winograd. */
TEST(conv2d_onednn_blocked_and_plain_layouts_agree) {
    /* bitwise within one path: the same thread count for every run (a
     * product's bits can depend on it, and the load lowers it) */
    setenv("FULGUR_ADAPT_THREADS", "0", 1);
    CHECK_OK(fg_set_num_threads(0));
    const char *isa = fg__dnnl_isa();
    bool dnnl_wino = isa && strstr(isa, "avx512");
    struct {
        int64_t N, C, H, W, O, K;
        fg_conv2d_opts o;
    } cases[] = {
        {2, 32, 9, 7, 32, 3, {{1, 1}, {1, 1}, {1, 1}, 1, false}},
        {2, 32, 9, 9, 48, 3, {{2, 2}, {1, 1}, {1, 1}, 1, false}},
        {3, 16, 8, 7, 32, 1, {{2, 2}, {0, 0}, {1, 1}, 1, false}},
        {1, 24, 6, 6, 40, 3, {{2, 2}, {0, 0}, {1, 1}, 1, false}},
        {2, 32, 7, 7, 32, 3, {{1, 1}, {1, 1}, {1, 1}, 2, false}},
        {3, 40, 6, 10, 36, 3, {{1, 1}, {0, 0}, {1, 1}, 1, false}},
        {1, 64, 5, 3, 48, 3, {{1, 1}, {1, 1}, {1, 1}, 1, false}},
        {2, 33, 5, 6, 35, 3, {{1, 1}, {2, 1}, {1, 1}, 1, false}},
    };
    enum { NCASE = sizeof cases / sizeof cases[0] };
    /* the default (Winograd or direct as measured), each algorithm forced,
     * the plain layouts, im2col (the last: it adds piece by piece) */
    const char *paths[] = {NULL,       "onednn-direct", "onednn-winograd",
                           "winograd", "onednn-plain",  "im2col"};
    enum { NPATH = 6 };
    for (int c = 0; c < NCASE; c++) {
        int64_t G = cases[c].o.groups ? cases[c].o.groups : 1;
        int64_t sx[] = {cases[c].N, cases[c].C, cases[c].H, cases[c].W};
        int64_t sw[] = {cases[c].O, cases[c].C / G, cases[c].K, cases[c].K}, sb[] = {cases[c].O};
        fg_tensor *d[3] = {gc_randn(4, sx, 40 + c, 1), gc_randn(4, sw, 50 + c, 0.2),
                           gc_randn(1, sb, 60 + c, 1)};
        fg_tensor *in[3] = {f32_of(d[0], true), f32_of(d[1], true), f32_of(d[2], true)};
        fg_tensor *y = fg_conv2d(in[0], in[1], in[2], &cases[c].o);
        fg_tensor *sd = y ? gc_randn(4, fg_tensor_shape(y), 70 + c, 1) : NULL;
        fg_tensor *seed = sd ? f32_of(sd, false) : NULL;
        CHECK(seed != NULL);
        fg_tensor *r[NPATH][3][4]; /* path, route, y / dx / dw / db */
        for (int pa = 0; pa < NPATH && seed; pa++)
            for (int ro = 0; ro < 3; ro++)
                conv_f32_run(paths[pa], ro, in, seed, &cases[c].o, r[pa][ro]);
        for (int pa = 0; pa < NPATH && seed; pa++) {
            for (int k = 0; k < 4; k++)
                CHECK_MSG(differ(r[pa][1][k], r[pa][0][k], 1, 0) == 0,
                          "case %d path %d tensor %d: written and added gradients differ", c, pa,
                          k);
            /* im2col adds piece by piece (each patch into dx, each image
             * into dw): the second pass adds to the first's sums, so only on
             * oneDNN's paths (the whole gradient made, then added) */
            for (int k = 1; pa < NPATH - 1 && k < 4; k++)
                CHECK_MSG(differ(r[pa][2][k], r[pa][0][k], 2, 0) == 0,
                          "case %d path %d gradient %d: twice added is not twice", c, pa, k);
            /* each against im2col; Winograd's transforms round more (on
             * these shapes oneDNN's largest gap was 2.4e-5 (1 + |v|), 3-5x
             * the direct kernel's; fulgur's, its filters' transforms in
             * f32, 6.6e-5, on the weight gradient; the default takes
             * fulgur's where oneDNN has none, below AVX-512) */
            double tol = pa == 1 || pa >= 4                  ? 1e-5
                         : pa == 2 || (pa == 0 && dnnl_wino) ? 6e-5
                                                             : 1.2e-4;
            for (int k = 0; pa < NPATH - 1 && k < 4; k++)
                CHECK_MSG(differ(r[pa][0][k], r[NPATH - 1][0][k], 1, tol) == 0,
                          "case %d tensor %d: %s and im2col differ", c, k,
                          paths[pa] ? paths[pa] : "the default");
        }
        fg_step_reset();
        free_all(d, 3);
        free_all(in, 3);
        fg_tensor_free(sd);
        fg_tensor_free(seed);
    }
}

TEST(conv1d_gradients) {
    int64_t sx[] = {2, 4, 11}, sw[] = {6, 2, 3}, sb[] = {6};
    fg_tensor *in[3] = {gc_randn(3, sx, 1, 1), gc_randn(3, sw, 2, 0.5), gc_randn(1, sb, 3, 1)};
    req(in, 3);
    cv_arg args[] = {{{{2, 0}, {1, 0}, {2, 0}, 2, false}, true, true},
                     {{{1, 0}, {0, 0}, {3, 0}, 2, true}, false, true}};
    for (int k = 0; k < 2; k++) CHECK_MSG(GC("conv1d", f_conv, in, 3, &args[k]) == 0, "%d", k);
    fg_tensor *y = f_conv(in, &args[0]); /* (11 + 2 - 5) / 2 + 1 = 5 */
    CHECK(y && fg_tensor_ndim(y) == 3 && fg_tensor_dim(y, 2) == 5);
    y = f_conv(in, &args[1]);
    CHECK(y && fg_tensor_dim(y, 2) == 11);
    fg_step_reset();
    free_all(in, 3);
}

typedef struct {
    int kind;
    int64_t k[2], s[2], p[2], d[2];
    bool ceil, cip;
    int64_t oh, ow;
} pl_arg;

static fg_tensor *f_pool(fg_tensor **in, void *arg) {
    pl_arg *a = arg;
    if (a->kind == 0) return fg_max_pool2d(in[0], a->k, a->s, a->p, a->d, a->ceil, NULL);
    if (a->kind == 1) return fg_avg_pool2d(in[0], a->k, a->s, a->p, a->ceil, a->cip);
    return fg_adaptive_avg_pool2d(in[0], a->oh, a->ow);
}

TEST(pooling_gradients_sizes_and_values) {
    int64_t sx[] = {2, 3, 7, 9};
    fg_tensor *x = gc_randn(4, sx, 5, 1);
    req(&x, 1);
    pl_arg cases[] = {
        {0, {2, 2}, {2, 2}, {0, 0}, {1, 1}, false, false, 3, 4},
        {0, {3, 2}, {2, 1}, {1, 1}, {1, 2}, true, false, 4, 9},
        {0, {3, 3}, {0, 0}, {1, 0}, {2, 1}, false, false, 2, 3},
        {1, {3, 3}, {2, 2}, {1, 1}, {1, 1}, false, true, 4, 5},
        {1, {3, 3}, {2, 2}, {1, 1}, {1, 1}, true, false, 4, 5},
        {1, {2, 4}, {3, 3}, {0, 2}, {1, 1}, true, true, 3, 4},
        {2, {0, 0}, {0, 0}, {0, 0}, {0, 0}, false, false, 3, 4},
        {2, {0, 0}, {0, 0}, {0, 0}, {0, 0}, false, false, 1, 1},
        {2, {0, 0}, {0, 0}, {0, 0}, {0, 0}, false, false, 7, 9},
    };
    for (int c = 0; c < 9; c++) {
        CHECK_MSG(GC("pool", f_pool, &x, 1, &cases[c]) == 0, "case %d", c);
        fg_tensor *y = f_pool(&x, &cases[c]);
        CHECK_MSG(y && fg_tensor_dim(y, 2) == cases[c].oh && fg_tensor_dim(y, 3) == cases[c].ow,
                  "case %d: %lld x %lld", c, y ? (long long)fg_tensor_dim(y, 2) : -1LL,
                  y ? (long long)fg_tensor_dim(y, 3) : -1LL);
    }
    /* values: max with its index; avg with and without the padding counted */
    fg_tensor *idx = NULL;
    fg_tensor *y = fg_max_pool2d(x, (int64_t[]){2, 2}, NULL, NULL, NULL, false, &idx);
    double m = -INFINITY;
    int best = -1;
    for (int i = 2; i < 4; i++)
        for (int j = 4; j < 6; j++)
            if (fg_tensor_get(x, 63 + i * 9 + j) > m)
                m = fg_tensor_get(x, 63 + i * 9 + j), best = i * 9 + j;
    CHECK(y && fg_tensor_get(y, 12 + 1 * 4 + 2) == m && fg_tensor_get(idx, 12 + 6) == best);
    y = fg_avg_pool2d(x, (int64_t[]){3, 3}, (int64_t[]){2, 2}, (int64_t[]){1, 1}, false, true);
    double s = 0;
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) s += fg_tensor_get(x, i * 9 + j);
    CHECK_CLOSE(fg_tensor_get(y, 0), s / 9, 1e-15, 1e-15);
    y = fg_avg_pool2d(x, (int64_t[]){3, 3}, (int64_t[]){2, 2}, (int64_t[]){1, 1}, false, false);
    CHECK_CLOSE(fg_tensor_get(y, 0), s / 4, 1e-15, 1e-15);
    y = fg_adaptive_avg_pool2d(x, 1, 1);
    s = 0;
    for (int i = 0; i < 63; i++) s += fg_tensor_get(x, i);
    CHECK_CLOSE(fg_tensor_get(y, 0), s / 63, 1e-14, 1e-15);
    CHECK(fg_max_pool2d(x, (int64_t[]){2, 2}, NULL, (int64_t[]){2, 0}, NULL, false, NULL) == NULL);
    CHECK_CONTAINS(fg_last_error(), "half the kernel");
    fg_step_reset();
    fg_tensor_free(x);
}

typedef struct {
    bool training;
    fg_tensor *rm, *rv;
} bn_arg;

static fg_tensor *f_bn(fg_tensor **in, void *arg) {
    bn_arg *a = arg;
    return fg_batch_norm(in[0], a->rm, a->rv, in[1], in[2], a->training, 0.1, 1e-5);
}

TEST(batch_norm_gradients_and_running_stats) {
    int64_t sx[] = {4, 3, 5, 2}, sc[] = {3}, s1[] = {6, 3};
    fg_tensor *in[3] = {gc_randn(4, sx, 7, 2), gc_randn(1, sc, 8, 1), gc_randn(1, sc, 9, 1)};
    req(in, 3);
    fg_tensor *rm = fg_tensor_new(FG_F64, 1, sc), *rv = fg_tensor_new(FG_F64, 1, sc);
    CHECK_OK(fg_tensor_fill(rv, 2));
    bn_arg tr = {true, NULL, NULL}, ev = {false, rm, rv};
    CHECK(GC("batch_norm train", f_bn, in, 3, &tr) == 0);
    CHECK(GC("batch_norm eval", f_bn, in, 3, &ev) == 0);
    fg_tensor *x1[3] = {gc_randn(2, s1, 10, 1), in[1], in[2]};
    req(x1, 1);
    CHECK(GC("batch_norm (N, C)", f_bn, x1, 3, &tr) == 0);
    /* the running statistics: 0.9 old + 0.1 batch (unbiased variance) */
    bn_arg up = {true, rm, rv};
    fg_tensor *y = f_bn(in, &up);
    CHECK(y != NULL);
    double m = 0, v = 0;
    for (int n = 0; n < 4; n++)
        for (int k = 0; k < 10; k++) m += fg_tensor_get(in[0], n * 30 + 1 * 10 + k);
    m /= 40;
    for (int n = 0; n < 4; n++)
        for (int k = 0; k < 10; k++) {
            double d = fg_tensor_get(in[0], n * 30 + 10 + k) - m;
            v += d * d;
        }
    CHECK_CLOSE(fg_tensor_get(rm, 1), 0.1 * m, 1e-14, 1e-15);
    CHECK_CLOSE(fg_tensor_get(rv, 1), 0.9 * 2 + 0.1 * v / 39, 1e-14, 1e-15);
    /* normalised: channel 1 of y has mean b[1] and biased variance w[1]^2 (to eps) */
    double ym = 0;
    for (int n = 0; n < 4; n++)
        for (int k = 0; k < 10; k++) ym += fg_tensor_get(y, n * 30 + 10 + k);
    CHECK_CLOSE(ym / 40, fg_tensor_get(in[2], 1), 1e-12, 1e-12);
    /* the input gradient written into a fresh buffer (through x * 1) and
     * added to the leaf's zeroed one: bitwise the same */
    fg_tensor *seed = gc_randn(4, sx, 11, 1), *gr[2];
    for (int route = 0; route < 2; route++) {
        fg_tensor_zero_grad(in[0]);
        fg_tensor *xin[3] = {route ? fg_scale(in[0], 1.0) : in[0], in[1], in[2]};
        CHECK_OK(fg_backward_with(f_bn(xin, &tr), seed));
        gr[route] = fg_empty(FG_F64, 4, sx);
        CHECK_OK(fg_tensor_copy(gr[route], fg_tensor_grad(in[0])));
    }
    int bad = 0;
    for (int64_t i = 0; i < fg_tensor_numel(gr[0]); i++)
        bad += fg_tensor_get(gr[0], i) != fg_tensor_get(gr[1], i);
    CHECK_MSG(bad == 0, "batch_norm: written and added input gradients differ in %d", bad);
    fg_tensor_free(seed);
    fg_step_reset();
    free_all(in, 3);
    fg_tensor_free(x1[0]);
    fg_tensor_free(rm);
    fg_tensor_free(rv);
}

/* relu_ after batch norm (training) and after add, in place, and where it
 * must not be: after a node whose backward reads its output (softmax),
 * on a tensor a later node reads (a product), with grad mode off */
static fg_tensor *f_bn_relu_(fg_tensor **in, void *arg) {
    (void)arg;
    fg_tensor *h = fg_batch_norm(in[0], NULL, NULL, in[1], in[2], true, 0.1, 1e-5);
    return fg_mul(fg_relu_(fg_add(fg_relu_(h), in[0])), in[0]);
}
static fg_tensor *f_relu_read_later(fg_tensor **in, void *arg) {
    (void)arg;
    fg_tensor *h = fg_add(in[0], in[0]);
    fg_tensor *t = fg_mul(h, h); /* reads h: relu_ must leave it */
    return fg_add(fg_relu_(h), t);
}
static fg_tensor *f_relu_after_softmax(fg_tensor **in, void *arg) {
    (void)arg;
    fg_tensor *s = fg_softmax(in[0]);
    return fg_mul(fg_relu_(fg_scale(s, 1.0)), fg_relu_(s));
}

TEST(relu_in_place_where_safe_and_gradients) {
    int64_t sx[] = {4, 3, 5, 2}, sc[] = {3};
    fg_tensor *in[3] = {gc_randn(4, sx, 41, 2), gc_randn(1, sc, 42, 1), gc_randn(1, sc, 43, 1)};
    req(in, 3);
    /* (draws whose values keep clear of the kink at 0, which a finite
     * difference would cross: seeds 21 and 31 had one within its step) */
    CHECK(GC("relu_ after batch norm and add", f_bn_relu_, in, 3, NULL) == 0);
    CHECK(GC("relu_ of a tensor read later", f_relu_read_later, in, 1, NULL) == 0);
    CHECK(GC("relu_ after softmax", f_relu_after_softmax, in, 1, NULL) == 0);
    /* in place: the result is the batch norm's memory; the gradient is
     * fg_relu's, bit for bit */
    fg_tensor *h = fg_batch_norm(in[0], NULL, NULL, in[1], in[2], true, 0.1, 1e-5);
    fg_tensor *r = fg_relu_(h);
    CHECK(r && fg_tensor_data(r) == fg_tensor_data(h));
    fg_tensor *sum = fg_add(in[0], in[0]);
    CHECK(sum && fg_tensor_data(fg_relu_(sum)) == fg_tensor_data(sum));
    fg_tensor *g[2];
    for (int k = 0; k < 2; k++) {
        fg_tensor_zero_grad(in[0]);
        fg_tensor *b = fg_batch_norm(in[0], NULL, NULL, in[1], in[2], true, 0.1, 1e-5);
        CHECK_OK(fg_backward(fg_sum(fg_mul(k ? fg_relu_(b) : fg_relu(b), in[0]))));
        g[k] = fg_tensor_new(FG_F64, 4, sx);
        CHECK_OK(fg_tensor_copy(g[k], fg_tensor_grad(in[0])));
    }
    CHECK(memcmp(fg_tensor_data(g[0]), fg_tensor_data(g[1]), fg_tensor_nbytes(g[0])) == 0);
    /* not in place: read later, after softmax, grad mode off, a leaf */
    fg_tensor *a = fg_add(in[0], in[0]);
    fg_tensor *m = fg_mul(a, a);
    CHECK(m && fg_tensor_data(fg_relu_(a)) != fg_tensor_data(a));
    fg_tensor *s = fg_softmax(in[0]);
    CHECK(s && fg_tensor_data(fg_relu_(s)) != fg_tensor_data(s));
    bool prev = fg_set_grad_enabled(false);
    fg_tensor *q = fg_add(in[0], in[0]);
    CHECK(q && fg_tensor_data(fg_relu_(q)) != fg_tensor_data(q));
    fg_set_grad_enabled(prev);
    CHECK(fg_tensor_data(fg_relu_(in[0])) != fg_tensor_data(in[0]));
    int neg = 0; /* each left as it was */
    for (int64_t i = 0; i < fg_tensor_numel(a); i++)
        neg +=
            (fg_tensor_get(a, i) < 0) + (fg_tensor_get(q, i) < 0) + (fg_tensor_get(in[0], i) < 0);
    CHECK(neg > 0);
    CHECK(fg_relu_(NULL) == NULL);
    fg_step_reset();
    for (int k = 0; k < 2; k++) fg_tensor_free(g[k]);
    free_all(in, 3);
}
