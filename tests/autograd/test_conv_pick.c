/* The choice of a convolution's algorithm on oneDNN (conv_pick.c,
 * k_conv_dnnl.c): Winograd only when measured faster by the margin, each
 * shape measured once, a failed measurement keeping nothing, the choices
 * through a file and back (a damaged or foreign file refused whole), and
 * the convolutions themselves: FULGUR_CONV=onednn-winograd makes Winograd
 * primitives where oneDNN has them (AVX-512) and onednn-direct none,
 * FULGUR_CONV=winograd runs fulgur's (other bits, the same values to its
 * rounding), and the default measures a shape once, runs Winograd where
 * its choice says, and then repeats its bits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gradcheck.h"
#include "ops/cpu/k_ops.h"

typedef struct {
    double t[2];
    fg_status st;
    int calls;
} fake;

static fg_status fake_measure(void *ud, double *t) {
    fake *f = ud;
    f->calls++;
    t[0] = f->t[0], t[1] = f->t[1];
    return f->st;
}

static bool pick(const int64_t *key, int n, fake *f) {
    bool w = false;
    CHECK_OK(fg__conv_pick(key, n, fake_measure, f, &w));
    return w;
}

TEST(conv_pick_measures_once_and_wins_by_the_margin) {
    fg__conv_pick_forget();
    int64_t k1[] = {1, 2, 3}, k2[] = {1, 2, 4}, k3[] = {1, 2, 5}, k4[] = {9};
    fake near = {{1.0, 0.95}, FG_OK, 0}, far = {{1.0, 0.5}, FG_OK, 0};
    fake none = {{1.0, 1.0 / 0.0}, FG_OK, 0}, broken = {{1.0, 0.1}, FG_ENOMEM, 0};
    CHECK(!pick(k1, 3, &near)); /* 5% faster: within the margin, direct */
    CHECK(pick(k2, 3, &far));
    CHECK(!pick(k3, 3, &none));                      /* Winograd could not run */
    CHECK(!pick(k1, 3, &far) && pick(k2, 3, &near)); /* decided: not measured again */
    CHECK(near.calls == 1 && far.calls == 1 && none.calls == 1);
    bool w = true;
    CHECK_STATUS(fg__conv_pick(k4, 1, fake_measure, &broken, &w), FG_ENOMEM);
    CHECK_STATUS(fg__conv_pick(k4, 1, fake_measure, &broken, &w), FG_ENOMEM);
    CHECK(broken.calls == 2); /* nothing kept: measured again */
    int wn = 0, cached = -1;
    CHECK(fg__conv_pick_count(&wn, &cached) == 3 && wn == 1 && cached == 0);
    int64_t big[FG_CONV_KEY + 1] = {0};
    CHECK_STATUS(fg__conv_pick(big, FG_CONV_KEY + 1, fake_measure, &far, &w), FG_EINTERNAL);
    fg_clear_error();
}

static void spit(const char *path, const char *buf, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f) fwrite(buf, 1, n, f), fclose(f);
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *b = calloc(1, 1 << 16);
    *len = fread(b, 1, (1 << 16) - 1, f);
    fclose(f);
    return b;
}

TEST(conv_pick_choices_round_trip_through_a_file) {
    char dir[] = "/tmp/fulgur-conv-pick.XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[128];
    snprintf(path, sizeof path, "%s/conv.txt", dir);
    fg__conv_pick_forget();
    int64_t a[] = {0, 64, 64, 32, 32}, b[] = {1, 64, 64, 32, 32}, c[] = {2, 3};
    fake fast = {{2.0, 1.0}, FG_OK, 0}, slow = {{1.0, 2.0}, FG_OK, 0};
    CHECK(pick(a, 5, &fast) && !pick(b, 5, &slow) && pick(c, 2, &fast));
    CHECK_OK(fg__conv_pick_cache_save(path));
    fg__conv_pick_forget();
    CHECK(fg__conv_pick_count(NULL, NULL) == 0);
    CHECK_OK(fg__conv_pick_cache_load(path));
    int wn = 0, cached = 0;
    CHECK(fg__conv_pick_count(&wn, &cached) == 3 && wn == 2 && cached == 3);
    fake never = {{1.0, 1.0}, FG_EINTERNAL, 0}; /* a measurement would fail the pick */
    CHECK(pick(a, 5, &never) && !pick(b, 5, &never) && pick(c, 2, &never));
    CHECK(never.calls == 0);
    /* a shorter key is another shape */
    CHECK(!pick(a, 4, &slow) && slow.calls == 2);

    size_t len = 0;
    char *good = slurp(path, &len);
    CHECK(good && !strncmp(good, "fulgur conv choices 2\nkey ", 26));
    if (!good) return;
    char *bad = malloc(len + 64);
    memcpy(bad, good, len);
    bad[len - 30] ^= 1; /* one byte of the last line */
    spit(path, bad, len);
    fg__conv_pick_forget();
    CHECK_STATUS(fg__conv_pick_cache_load(path), FG_EFORMAT);
    CHECK_CONTAINS(fg_last_error(), "checksum");
    CHECK(fg__conv_pick_count(NULL, NULL) == 0);
    /* a gemm file is not a conv file */
    const char *gemm = "fulgur gemm choices 4\nkey x\nsum 0000000000000000\n";
    spit(path, gemm, strlen(gemm));
    CHECK_STATUS(fg__conv_pick_cache_load(path), FG_EFORMAT);
    CHECK(fg__conv_pick_count(NULL, NULL) == 0);
    fg_clear_error();
    free(bad);
    free(good);
    unlink(path);
    rmdir(dir);
}

/* one 3x3 stride-1 convolution forward and backward on the path FULGUR_CONV
 * names, its output and gradients into out (persistent copies) */
static void conv_once(const char *path, fg_tensor **in, fg_tensor **out) {
    if (path) setenv("FULGUR_CONV", path, 1);
    else unsetenv("FULGUR_CONV");
    for (int k = 0; k < 3; k++) fg_tensor_zero_grad(in[k]);
    fg_conv2d_opts o = {.stride = {1, 1}, .padding = {1, 1}};
    fg_tensor *y = fg_conv2d(in[0], in[1], in[2], &o);
    CHECK(y != NULL);
    if (!y) return;
    CHECK_OK(fg_backward(fg_sum(y)));
    fg_tensor *src[4] = {y, fg_tensor_grad(in[0]), fg_tensor_grad(in[1]), fg_tensor_grad(in[2])};
    for (int k = 0; k < 4; k++) {
        out[k] = fg_tensor_new(FG_F32, fg_tensor_ndim(src[k]), fg_tensor_shape(src[k]));
        CHECK_OK(fg_tensor_copy(out[k], src[k]));
    }
    fg_step_reset();
    unsetenv("FULGUR_CONV");
}

static bool same(fg_tensor **a, fg_tensor **b) {
    for (int k = 0; k < 4; k++)
        if (memcmp(fg_tensor_data(a[k]), fg_tensor_data(b[k]), fg_tensor_nbytes(a[k])))
            return false;
    return true;
}

TEST(conv2d_winograd_where_onednn_has_it_and_the_default_repeats) {
    const char *isa = fg__dnnl_isa();
    if (!isa) SKIP("no oneDNN in this build: convolutions run im2col");
    setenv("FULGUR_ADAPT_THREADS", "0", 1); /* one thread count: bits repeat */
    CHECK_OK(fg_set_num_threads(0));
    int64_t sx[] = {2, 32, 9, 7}, sw[] = {32, 32, 3, 3}, sb[] = {32};
    fg_tensor *d[3] = {gc_randn(4, sx, 11, 1), gc_randn(4, sw, 12, 0.2), gc_randn(1, sb, 13, 1)};
    fg_tensor *in[3];
    for (int k = 0; k < 3; k++) {
        in[k] = fg_tensor_new(FG_F32, fg_tensor_ndim(d[k]), fg_tensor_shape(d[k]));
        CHECK_OK(fg_tensor_copy(in[k], d[k]));
        fg_tensor_set_requires_grad(in[k], true);
    }
    fg_tensor *r[5][4];
    int w0 = fg__dnnl_conv_winograd_made();
    conv_once("onednn-direct", in, r[0]);
    CHECK(fg__dnnl_conv_winograd_made() == w0);
    conv_once("onednn-winograd", in, r[1]);
    int made = fg__dnnl_conv_winograd_made() - w0;
    /* the default: measured once (fresh choices, no file), then the same;
     * the shapes it runs on Winograd (oneDNN's, or fulgur's where oneDNN
     * has none) are the ones the choices say */
    fg__conv_pick_forget();
    int w1 = fg__dnnl_conv_winograd_made();
    conv_once(NULL, in, r[2]);
    int wn = -1, n = fg__conv_pick_count(&wn, NULL);
    CHECK_MSG(n == 3, "%d shapes measured, want 3 (forward, backward data, weights)", n);
    CHECK_MSG(fg__dnnl_conv_winograd_made() - w1 == wn, "%d made on Winograd, %d chosen",
              fg__dnnl_conv_winograd_made() - w1, wn);
    conv_once(NULL, in, r[3]);
    CHECK(fg__conv_pick_count(NULL, NULL) == n && same(r[2], r[3]));
    /* fulgur's Winograd: other bits than the direct kernel's, the same
     * values to its rounding (test_grad_conv bounds it against im2col) */
    fg_conv_params cp = {.stride = {1, 1}, .pad = {1, 1}, .dilation = {1, 1}, .groups = 1};
    bool own = fg__wino_conv_fits(in[0], in[1], &cp);
    conv_once("winograd", in, r[4]);
    bool own_differs = !same(r[0], r[4]);
    double gap = 0;
    for (int k = 0; k < 4; k++)
        for (int64_t i = 0; i < fg_tensor_numel(r[0][k]); i++) {
            double u = fg_tensor_get(r[4][k], i), v = fg_tensor_get(r[0][k], i);
            gap = fmax(gap, fabs(u - v) / (1 + fabs(v)));
        }
    CHECK_MSG(gap < 1.2e-4, "fulgur's Winograd %.2e from the direct kernel", gap);
    CHECK(own_differs == own);
    char info[400];
    CHECK_CONTAINS(fg__conv_pick_info(info, sizeof info), "3 shapes measured");
    /* fulgur's Winograd needs a vector ISA (the shape fits it) */
    CHECK_CONTAINS(fg_ops_blas_info(),
                   strstr(isa, "avx512") ? "conv: onednn (oneDNN's winograd or direct per shape"
                   : own                 ? "conv: onednn (fulgur's winograd or direct per shape"
                                         : "conv: onednn (direct: no Winograd on the scalar path");
    for (int k = 0; k < 3; k++) fg_tensor_free(in[k]), fg_tensor_free(d[k]);
    bool differ = !same(r[0], r[1]);
    for (int i = 0; i < 5; i++)
        for (int k = 0; k < 4; k++) fg_tensor_free(r[i][k]);
    if (strstr(isa, "avx512")) {
        CHECK_MSG(made == 3, "%d Winograd primitives made, want 3", made);
        CHECK(differ); /* the other algorithm: other last bits */
    } else {
        CHECK(made == 0 && !differ);
        SKIP("oneDNN runs %s here: its f32 Winograd needs AVX-512 (its direct path ran; "
             "fulgur's Winograd and the default's choices were checked)",
             isa);
    }
}
