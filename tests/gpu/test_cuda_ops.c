/* layer: ops. Every entry of the CUDA op table against the CPU table, on
 * random inputs at several shapes: f32 within 1e-5 of the largest value
 * (TF32 off: FULGUR_MATMUL_PRECISION is forced to highest), bf16 within
 * 1e-2; dropout's masks identical; each GPU entry run twice gives the same
 * bits. Skips, saying why, without a GPU. Each comparison prints one line
 * "entry <name> <dtype> <shape>: err <e> (bound <b>)" that
 * scripts/gpu-check.sh collects. */
#include <stdint.h>

#include "fulgur/gpu.h"
#include "fulgur/ops.h"
#include "harness.h"

static fg_dev *g_dev;
static char g_why[512];
static const fg_op_table *C_, *G_;

static bool gpu(void) {
    if (g_dev) return true;
    if (g_why[0]) return false;
    setenv("FULGUR_MATMUL_PRECISION", "highest", 1);
    g_dev = fg_dev_open("cuda:0", NULL);
    if (!g_dev) {
        snprintf(g_why, sizeof g_why, "%s", fg_last_error());
        return false;
    }
    C_ = fg_ops_get(FG_CPU);
    G_ = fg_ops_get(FG_CUDA);
    return G_ != NULL;
}
#define NEED_GPU()                                                                                 \
    do {                                                                                           \
        if (!gpu()) SKIP("%s", g_why);                                                             \
    } while (0)

static uint64_t g_seed = 42;
static float frand(float lo, float hi) {
    g_seed = g_seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return lo + (hi - lo) * (float)((double)(g_seed >> 40) / 16777216.0);
}

/* a host tensor of dt with random values in [lo, hi) */
static fg_tensor *rnd(fg_dtype dt, int nd, const int64_t *sh, float lo, float hi) {
    fg_tensor *t = fg_tensor_new(dt, nd, sh);
    int64_t n = fg_tensor_numel(t);
    float *f = malloc((size_t)(n ? n : 1) * sizeof *f);
    for (int64_t i = 0; i < n; i++) f[i] = frand(lo, hi);
    CHECK_OK(fg_convert(fg_tensor_data(t), dt, f, FG_F32, n));
    free(f);
    return t;
}
static fg_tensor *on(const fg_tensor *h) { return fg_tensor_to(h, g_dev); }
static fg_tensor *back(const fg_tensor *d) { return fg_tensor_to(d, NULL); }

/* max |gpu - cpu| / max(max |cpu|, tiny); prints the entry's line */
static double compare(const char *name, const fg_tensor *cpu, const fg_tensor *gdev, double bound) {
    fg_tensor *g = back(gdev);
    int64_t n = fg_tensor_numel(cpu);
    double *a = malloc((size_t)(n ? n : 1) * sizeof *a),
           *b = malloc((size_t)(n ? n : 1) * sizeof *b);
    CHECK_OK(fg_convert(a, FG_F64, fg_tensor_data(cpu), fg_tensor_dtype(cpu), n));
    CHECK_OK(fg_convert(b, FG_F64, fg_tensor_data(g), fg_tensor_dtype(g), n));
    double mx = 1e-30, err = 0;
    for (int64_t i = 0; i < n; i++) mx = fmax(mx, fabs(a[i]));
    for (int64_t i = 0; i < n; i++) {
        double e = fabs(a[i] - b[i]);
        if (!(e <= err)) err = isnan(e) ? INFINITY : e;
    }
    err /= mx;
    char sh[64] = "";
    for (int d = 0; d < fg_tensor_ndim(cpu); d++)
        snprintf(sh + strlen(sh), sizeof sh - strlen(sh), "%s%lld", d ? "x" : "",
                 (long long)fg_tensor_dim(cpu, d));
    printf("entry %s %s %s: err %.3g (bound %.0e)%s\n", name, fg_dtype_name(fg_tensor_dtype(cpu)),
           sh[0] ? sh : "scalar", err, bound, err <= bound ? "" : " FAIL");
    CHECK_MSG(err <= bound, "%s: error %g past %g", name, err, bound);
    free(a);
    free(b);
    fg_tensor_free(g);
    return err;
}

/* the bytes of two device tensors agree */
static void same_bits(const char *name, const fg_tensor *x, const fg_tensor *y) {
    fg_tensor *a = back(x), *b = back(y);
    bool eq = memcmp(fg_tensor_data(a), fg_tensor_data(b), fg_tensor_nbytes(a)) == 0;
    printf("repeat %s: %s\n", name, eq ? "bit-identical" : "DIFFERS");
    CHECK_MSG(eq, "%s: two runs differ", name);
    fg_tensor_free(a);
    fg_tensor_free(b);
}

static double bound_of(fg_dtype dt) { return dt == FG_F32 ? 1e-5 : 1e-2; }

TEST(matmul) {
    NEED_GPU();
    static const int64_t mnk[][4] = {
        {1, 1, 1, 1}, {3, 65, 31, 17}, {4, 128, 96, 200}, {1, 512, 768, 768}};
    fg_dtype dts[] = {FG_F32, FG_BF16};
    for (int di = 0; di < 2; di++)
        for (size_t s = 0; s < sizeof mnk / sizeof *mnk; s++)
            for (int t = 0; t < 4; t++) {
                bool ta = t & 1, tb = t & 2;
                int64_t B = mnk[s][0], M = mnk[s][1], N = mnk[s][2], K = mnk[s][3];
                int64_t sa[3] = {B, ta ? K : M, ta ? M : K}, sb[3] = {B, tb ? N : K, tb ? K : N},
                        sc[3] = {B, M, N};
                fg_dtype dt = dts[di];
                fg_tensor *a = rnd(dt, 3, sa, -1, 1), *b = rnd(dt, 3, sb, -1, 1);
                fg_tensor *c = rnd(dt, 3, sc, -1, 1);
                fg_tensor *ga = on(a), *gb = on(b), *gc = on(c), *gc2 = on(c);
                CHECK_OK(C_->matmul(a, ta, b, tb, c, 0.5, 0.25));
                CHECK_OK(G_->matmul(ga, ta, gb, tb, gc, 0.5, 0.25));
                CHECK_OK(G_->matmul(ga, ta, gb, tb, gc2, 0.5, 0.25));
                compare(ta ? (tb ? "matmul_tt" : "matmul_tn") : (tb ? "matmul_nt" : "matmul_nn"), c,
                        gc, dt == FG_F32 ? 1e-5 : 2e-2);
                same_bits("matmul", gc, gc2);
                fg_tensor_free(a), fg_tensor_free(b), fg_tensor_free(c);
                fg_tensor_free(ga), fg_tensor_free(gb), fg_tensor_free(gc), fg_tensor_free(gc2);
            }
}

/* x, y of shape sh: y_cpu = f(x), y_gpu = f(x) twice, compared */
#define UNARY_CASE(NAME, DT, ND, SH, LO, HI, CALL_C, CALL_G)                                       \
    do {                                                                                           \
        fg_tensor *x = rnd(DT, ND, SH, LO, HI), *y = rnd(DT, ND, SH, -1, 1);                       \
        fg_tensor *gx = on(x), *gy = on(y), *gy2 = on(y);                                          \
        {                                                                                          \
            fg_tensor *X = x, *Y = y;                                                              \
            CHECK_OK(CALL_C);                                                                      \
        }                                                                                          \
        {                                                                                          \
            fg_tensor *X = gx, *Y = gy;                                                            \
            CHECK_OK(CALL_G);                                                                      \
        }                                                                                          \
        {                                                                                          \
            fg_tensor *X = gx, *Y = gy2;                                                           \
            CHECK_OK(CALL_G);                                                                      \
        }                                                                                          \
        compare(NAME, y, gy, bound_of(DT));                                                        \
        same_bits(NAME, gy, gy2);                                                                  \
        fg_tensor_free(x), fg_tensor_free(y), fg_tensor_free(gx), fg_tensor_free(gy),              \
            fg_tensor_free(gy2);                                                                   \
    } while (0)

/* x, dy, dx (accumulated): dx_cpu += f'(x) dy, the same on the GPU */
#define GRAD_CASE(NAME, DT, ND, SH, LO, HI, CALL_C, CALL_G)                                        \
    do {                                                                                           \
        fg_tensor *x = rnd(DT, ND, SH, LO, HI), *dy = rnd(DT, ND, SH, -1, 1),                      \
                  *dx = rnd(DT, ND, SH, -1, 1);                                                    \
        fg_tensor *gx = on(x), *gdy = on(dy), *gdx = on(dx);                                       \
        {                                                                                          \
            fg_tensor *X = x, *DY = dy, *DX = dx;                                                  \
            CHECK_OK(CALL_C);                                                                      \
        }                                                                                          \
        {                                                                                          \
            fg_tensor *X = gx, *DY = gdy, *DX = gdx;                                               \
            CHECK_OK(CALL_G);                                                                      \
        }                                                                                          \
        compare(NAME, dx, gdx, bound_of(DT));                                                      \
        fg_tensor_free(x), fg_tensor_free(dy), fg_tensor_free(dx), fg_tensor_free(gx),             \
            fg_tensor_free(gdy), fg_tensor_free(gdx);                                              \
    } while (0)

static const int64_t SH1[] = {1}, SH2[] = {37, 129}, SH3[] = {4, 64, 1024};
static const struct {
    int nd;
    const int64_t *sh;
} SHAPES[] = {{1, SH1}, {2, SH2}, {3, SH3}};
#define NSH (sizeof SHAPES / sizeof *SHAPES)

TEST(activations_softmax_unary) {
    NEED_GPU();
    fg_dtype dts[] = {FG_F32, FG_BF16};
    for (int di = 0; di < 2; di++)
        for (size_t s = 0; s < NSH; s++) {
            fg_dtype dt = dts[di];
            int nd = SHAPES[s].nd;
            const int64_t *sh = SHAPES[s].sh;
            UNARY_CASE("relu_fwd", dt, nd, sh, -3, 3, C_->relu_fwd(X, Y), G_->relu_fwd(X, Y));
            UNARY_CASE("gelu_fwd", dt, nd, sh, -6, 6, C_->gelu_fwd(X, Y), G_->gelu_fwd(X, Y));
            UNARY_CASE("softmax_fwd", dt, nd, sh, -8, 8, C_->softmax_fwd(X, Y),
                       G_->softmax_fwd(X, Y));
            UNARY_CASE("log_softmax_fwd", dt, nd, sh, -8, 8, C_->log_softmax_fwd(X, Y),
                       G_->log_softmax_fwd(X, Y));
            UNARY_CASE("scale", dt, nd, sh, -8, 8, C_->scale(X, 0.3, Y), G_->scale(X, 0.3, Y));
            UNARY_CASE("axpby", dt, nd, sh, -8, 8, C_->axpby(0.3, X, -1.5, Y),
                       G_->axpby(0.3, X, -1.5, Y));
            GRAD_CASE("relu_bwd", dt, nd, sh, -3, 3, C_->relu_bwd(X, DY, DX),
                      G_->relu_bwd(X, DY, DX));
            GRAD_CASE("gelu_bwd", dt, nd, sh, -6, 6, C_->gelu_bwd(X, DY, DX),
                      G_->gelu_bwd(X, DY, DX));
            /* the softmax backwards take y = softmax(x): x in (0, 1) stands in */
            GRAD_CASE("softmax_bwd", dt, nd, sh, 0, 1, C_->softmax_bwd(X, DY, DX),
                      G_->softmax_bwd(X, DY, DX));
            GRAD_CASE("log_softmax_bwd", dt, nd, sh, -4, 0, C_->log_softmax_bwd(X, DY, DX),
                      G_->log_softmax_bwd(X, DY, DX));
            static const struct {
                fg_unary_op op;
                const char *name;
                float lo, hi, a, b;
            } un[] = {{FG_UN_EXP, "exp", -4, 4, 0, 0},
                      {FG_UN_LOG, "log", 0.1f, 4, 0, 0},
                      {FG_UN_SQRT, "sqrt", 0.1f, 4, 0, 0},
                      {FG_UN_RSQRT, "rsqrt", 0.1f, 4, 0, 0},
                      {FG_UN_POW, "pow", 0.1f, 3, 2.5f, 0},
                      {FG_UN_ABS, "abs", -3, 3, 0, 0},
                      {FG_UN_CLAMP, "clamp", -3, 3, -1, 1},
                      {FG_UN_SIGMOID, "sigmoid", -6, 6, 0, 0},
                      {FG_UN_TANH, "tanh", -4, 4, 0, 0},
                      {FG_UN_SILU, "silu", -6, 6, 0, 0},
                      {FG_UN_GELU_ERF, "gelu_erf", -5, 5, 0, 0},
                      {FG_UN_SOFTPLUS, "softplus", -6, 6, 1, 20},
                      {FG_UN_LEAKY_RELU, "leaky_relu", -3, 3, 0.1f, 0},
                      {FG_UN_ELU, "elu", -3, 3, 1, 0}};
            for (size_t u = 0; u < sizeof un / sizeof *un; u++) {
                char nm[48];
                snprintf(nm, sizeof nm, "unary_fwd_%s", un[u].name);
                UNARY_CASE(nm, dt, nd, sh, un[u].lo, un[u].hi,
                           C_->unary_fwd(un[u].op, X, un[u].a, un[u].b, Y),
                           G_->unary_fwd(un[u].op, X, un[u].a, un[u].b, Y));
                snprintf(nm, sizeof nm, "unary_bwd_%s", un[u].name);
                /* y = op(x) from the CPU for both */
                fg_tensor *x = rnd(dt, nd, sh, un[u].lo, un[u].hi), *y = fg_tensor_new(dt, nd, sh);
                CHECK_OK(C_->unary_fwd(un[u].op, x, un[u].a, un[u].b, y));
                fg_tensor *dy = rnd(dt, nd, sh, -1, 1), *dx = rnd(dt, nd, sh, -1, 1);
                fg_tensor *gx = on(x), *gy = on(y), *gdy = on(dy), *gdx = on(dx);
                CHECK_OK(C_->unary_bwd(un[u].op, x, y, dy, un[u].a, un[u].b, dx));
                CHECK_OK(G_->unary_bwd(un[u].op, gx, gy, gdy, un[u].a, un[u].b, gdx));
                compare(nm, dx, gdx, bound_of(dt));
                fg_tensor_free(x), fg_tensor_free(y), fg_tensor_free(dy), fg_tensor_free(dx);
                fg_tensor_free(gx), fg_tensor_free(gy), fg_tensor_free(gdy), fg_tensor_free(gdx);
            }
        }
}

TEST(binary_broadcast_sum_to_bias) {
    NEED_GPU();
    static const int64_t ya[] = {4, 5, 6}, bb[] = {5, 1}, b0[] = {1};
    static const char *const names[] = {"binary_add", "binary_sub", "binary_mul", "binary_div"};
    for (int op = 0; op < 4; op++) {
        const int64_t *bs[] = {ya, bb, b0};
        int bnd[] = {3, 2, 1};
        for (int k = 0; k < 3; k++) {
            fg_tensor *a = rnd(FG_F32, 3, ya, -2, 2), *b = rnd(FG_F32, bnd[k], bs[k], 0.5f, 2);
            fg_tensor *y = fg_tensor_new(FG_F32, 3, ya);
            fg_tensor *ga = on(a), *gb = on(b), *gy = on(y);
            CHECK_OK(C_->binary((fg_binary_op)op, a, b, y));
            CHECK_OK(G_->binary((fg_binary_op)op, ga, gb, gy));
            compare(names[op], y, gy, 1e-5);
            /* sum_to: the broadcast's backward, to b's shape */
            fg_tensor *s = rnd(FG_F32, bnd[k], bs[k], -1, 1), *gs = on(s);
            CHECK_OK(C_->sum_to(a, s, 0.5, 1.0));
            CHECK_OK(G_->sum_to(ga, gs, 0.5, 1.0));
            compare("sum_to", s, gs, 1e-5);
            fg_tensor_free(a), fg_tensor_free(b), fg_tensor_free(y), fg_tensor_free(s);
            fg_tensor_free(ga), fg_tensor_free(gb), fg_tensor_free(gy), fg_tensor_free(gs);
        }
    }
    int64_t rc[2] = {300, 77}, c1 = 77;
    fg_tensor *y = rnd(FG_F32, 2, rc, -1, 1), *bias = rnd(FG_F32, 1, &c1, -1, 1);
    fg_tensor *db = rnd(FG_F32, 1, &c1, -1, 1);
    fg_tensor *gyv = on(y), *gbias = on(bias), *gdb = on(db);
    CHECK_OK(C_->bias_grad(y, db));
    CHECK_OK(G_->bias_grad(gyv, gdb));
    compare("bias_grad", db, gdb, 1e-5);
    CHECK_OK(C_->bias_add(y, bias));
    CHECK_OK(G_->bias_add(gyv, gbias));
    compare("bias_add", y, gyv, 1e-5);
    fg_tensor_free(y), fg_tensor_free(bias), fg_tensor_free(db);
    fg_tensor_free(gyv), fg_tensor_free(gbias), fg_tensor_free(gdb);
}

TEST(reductions_fixed_order) {
    NEED_GPU();
    for (size_t s = 0; s < NSH; s++) {
        fg_tensor *x = rnd(FG_F32, SHAPES[s].nd, SHAPES[s].sh, -1, 1), *gx = on(x);
        double c1, g1, g2, c2, h1;
        CHECK_OK(C_->sum_all(x, &c1));
        CHECK_OK(G_->sum_all(gx, &g1));
        CHECK_OK(G_->sum_all(gx, &g2));
        CHECK(g1 == g2);
        CHECK_CLOSE(g1, c1, 1e-9, 1e-9 * (double)fg_tensor_numel(x));
        CHECK_OK(C_->sumsq_all(x, &c2));
        CHECK_OK(G_->sumsq_all(gx, &h1));
        CHECK_CLOSE(h1, c2, 1e-9, 0);
        printf("entry sum_all f32 %lld: %.17g vs %.17g\nentry sumsq_all f32 %lld: %.17g vs %.17g\n",
               (long long)fg_tensor_numel(x), g1, c1, (long long)fg_tensor_numel(x), h1, c2);
        fg_tensor_free(x), fg_tensor_free(gx);
    }
    int64_t sh[3] = {3, 50, 7}, ys[2] = {3, 7};
    fg_tensor *x = rnd(FG_F32, 3, sh, -1, 1), *y = fg_tensor_new(FG_F32, 2, ys);
    fg_tensor *gx = on(x), *gy = on(y);
    CHECK_OK(C_->sum_dim(x, 1, y, 0.5));
    CHECK_OK(G_->sum_dim(gx, 1, gy, 0.5));
    compare("sum_dim", y, gy, 1e-5);
    CHECK_OK(C_->sum_dim_bwd(y, 1, x, 2.0));
    CHECK_OK(G_->sum_dim_bwd(gy, 1, gx, 2.0));
    compare("sum_dim_bwd", x, gx, 1e-5);
    fg_tensor_free(x), fg_tensor_free(y), fg_tensor_free(gx), fg_tensor_free(gy);
}

TEST(cross_entropy_layernorm_embedding) {
    NEED_GPU();
    static const int64_t nv[][2] = {{1, 2}, {33, 100}, {64, 50257}};
    for (size_t s = 0; s < 3; s++) {
        int64_t N = nv[s][0], V = nv[s][1], s2[2] = {2, N};
        fg_tensor *lg = rnd(FG_F32, 2, nv[s], -6, 6), *t = fg_tensor_new(FG_I32, 1, &N);
        int32_t *pt = fg_tensor_data(t);
        for (int64_t i = 0; i < N; i++) pt[i] = i % 7 == 6 ? -100 : (int32_t)(i * 7919 % V);
        fg_tensor *loss = fg_tensor_new(FG_F32, 0, NULL), *st = fg_tensor_new(FG_F64, 2, s2);
        fg_tensor *glg = on(lg), *gt = on(t), *gloss = on(loss), *gst = on(st);
        int64_t cc = 0, gc = 0;
        CHECK_OK(C_->cross_entropy_fwd_stats(lg, t, -100, loss, &cc, st));
        CHECK_OK(G_->cross_entropy_fwd_stats(glg, gt, -100, gloss, &gc, gst));
        CHECK(cc == gc);
        compare("cross_entropy_fwd_stats", loss, gloss, 1e-5);
        compare("cross_entropy_stats", st, gst, 1e-9);
        fg_tensor *dl = rnd(FG_F32, 2, nv[s], -1, 1), *gdl = on(dl), *gdl2 = on(dl);
        CHECK_OK(C_->cross_entropy_bwd_stats(lg, t, st, -100, 1.5, cc, dl));
        CHECK_OK(G_->cross_entropy_bwd_stats(glg, gt, gst, -100, 1.5, gc, gdl));
        CHECK_OK(G_->cross_entropy_bwd(glg, gt, -100, 1.5, gc, gdl2));
        compare("cross_entropy_bwd_stats", dl, gdl, 1e-5);
        compare("cross_entropy_bwd", dl, gdl2, 1e-5);
        fg_tensor_free(lg), fg_tensor_free(t), fg_tensor_free(loss), fg_tensor_free(st);
        fg_tensor_free(glg), fg_tensor_free(gt), fg_tensor_free(gloss), fg_tensor_free(gst);
        fg_tensor_free(dl), fg_tensor_free(gdl), fg_tensor_free(gdl2);
    }
    /* an out-of-range target is an error naming its row */
    {
        int64_t sh[2] = {4, 10}, n4 = 4;
        fg_tensor *lg = rnd(FG_F32, 2, sh, -1, 1), *t = fg_zeros(FG_I32, 1, &n4);
        ((int32_t *)fg_tensor_data(t))[2] = 10;
        fg_tensor *loss = fg_tensor_new(FG_F32, 0, NULL);
        fg_tensor *glg = on(lg), *gt = on(t), *gloss = on(loss);
        int64_t c = 0;
        CHECK_STATUS(G_->cross_entropy_fwd(glg, gt, -100, gloss, &c), FG_EINVAL);
        CHECK_CONTAINS(fg_last_error(), "row 2");
        fg_tensor_free(lg), fg_tensor_free(t), fg_tensor_free(loss);
        fg_tensor_free(glg), fg_tensor_free(gt), fg_tensor_free(gloss);
    }
    static const int64_t nc[][2] = {{1, 1}, {64, 768}, {300, 33}};
    fg_dtype dts[] = {FG_F32, FG_BF16};
    for (int di = 0; di < 2; di++)
        for (size_t s = 0; s < 3; s++) {
            fg_dtype dt = dts[di];
            int64_t N = nc[s][0], C = nc[s][1];
            fg_tensor *x = rnd(dt, 2, nc[s], -3, 3), *w = rnd(dt, 1, &C, 0.5f, 1.5f);
            fg_tensor *b = rnd(dt, 1, &C, -1, 1), *y = fg_tensor_new(dt, 2, nc[s]);
            fg_tensor *m = fg_tensor_new(FG_F32, 1, &N), *r = fg_tensor_new(FG_F32, 1, &N);
            fg_tensor *gx = on(x), *gw = on(w), *gb = on(b), *gy = on(y), *gm = on(m), *gr = on(r);
            CHECK_OK(C_->layernorm_fwd(x, w, b, 1e-5, y, m, r));
            CHECK_OK(G_->layernorm_fwd(gx, gw, gb, 1e-5, gy, gm, gr));
            compare("layernorm_fwd", y, gy, bound_of(dt));
            compare("layernorm_rstd", r, gr, 1e-5);
            fg_tensor *dy = rnd(dt, 2, nc[s], -1, 1), *dx = rnd(dt, 2, nc[s], -1, 1);
            fg_tensor *dw = rnd(dt, 1, &C, -1, 1), *db = rnd(dt, 1, &C, -1, 1);
            fg_tensor *gdy = on(dy), *gdx = on(dx), *gdw = on(dw), *gdb = on(db);
            CHECK_OK(C_->layernorm_bwd(x, w, m, r, dy, dx, dw, db));
            CHECK_OK(G_->layernorm_bwd(gx, gw, gm, gr, gdy, gdx, gdw, gdb));
            compare("layernorm_bwd_dx", dx, gdx, dt == FG_F32 ? 1e-5 : 2e-2);
            compare("layernorm_bwd_dw", dw, gdw, dt == FG_F32 ? 1e-5 : 2e-2);
            compare("layernorm_bwd_db", db, gdb, dt == FG_F32 ? 1e-5 : 2e-2);
            fg_tensor *all[] = {x,  w,  b,  y,  m,  r,  gx,  gw,  gb,  gy,
                                gm, gr, dy, dx, dw, db, gdy, gdx, gdw, gdb};
            for (size_t i = 0; i < sizeof all / sizeof *all; i++) fg_tensor_free(all[i]);
        }
    int64_t V = 1000, Cc = 96, N = 513, wsh[2] = {V, Cc}, ysh[2] = {N, Cc};
    fg_tensor *idx = fg_tensor_new(FG_I32, 1, &N);
    for (int64_t i = 0; i < N; i++) ((int32_t *)fg_tensor_data(idx))[i] = (int32_t)((i * 37) % 50);
    fg_tensor *w = rnd(FG_F32, 2, wsh, -1, 1), *y = fg_tensor_new(FG_F32, 2, ysh);
    fg_tensor *gi = on(idx), *gw = on(w), *gy = on(y);
    CHECK_OK(C_->embedding_fwd(idx, w, y));
    CHECK_OK(G_->embedding_fwd(gi, gw, gy));
    compare("embedding_fwd", y, gy, 0);
    fg_tensor *dw = rnd(FG_F32, 2, wsh, -1, 1), *gdw = on(dw), *gdw2 = on(dw);
    CHECK_OK(C_->embedding_bwd(idx, y, dw));
    CHECK_OK(G_->embedding_bwd(gi, gy, gdw));
    CHECK_OK(G_->embedding_bwd(gi, gy, gdw2));
    compare("embedding_bwd", dw, gdw, 1e-5);
    same_bits("embedding_bwd", gdw, gdw2);
    fg_tensor_free(idx), fg_tensor_free(w), fg_tensor_free(y), fg_tensor_free(dw);
    fg_tensor_free(gi), fg_tensor_free(gw), fg_tensor_free(gy), fg_tensor_free(gdw),
        fg_tensor_free(gdw2);
}

TEST(dropout_masks_identical) {
    NEED_GPU();
    static const double ps[] = {0.0, 0.1, 0.5};
    static const uint64_t offs[] = {0, 3, 1000001};
    for (size_t a = 0; a < 3; a++)
        for (size_t o = 0; o < 3; o++) {
            int64_t n = 100003;
            fg_tensor *x = rnd(FG_F32, 1, &n, -1, 1), *y = fg_tensor_new(FG_F32, 1, &n);
            fg_tensor *gx = on(x), *gy = on(y);
            CHECK_OK(C_->dropout_fwd(x, ps[a], 77, offs[o], y));
            CHECK_OK(G_->dropout_fwd(gx, ps[a], 77, offs[o], gy));
            compare("dropout_fwd", y, gy, 0);
            CHECK_OK(C_->dropout_bwd(x, ps[a], 77, offs[o], y));
            CHECK_OK(G_->dropout_bwd(gx, ps[a], 77, offs[o], gy));
            compare("dropout_bwd", y, gy, 0);
            fg_tensor_free(x), fg_tensor_free(y), fg_tensor_free(gx), fg_tensor_free(gy);
        }
}

TEST(attention) {
    NEED_GPU();
    static const int64_t bth[][4] = {{1, 1, 1, 8}, {2, 17, 2, 16}, {4, 128, 4, 64}};
    fg_dtype dts[] = {FG_F32, FG_BF16};
    /* causal and not, f32 and bf16; then padded keys (a u8 and an i32 mask)
     * with and without the causal mask */
    for (int ci = 0; ci < 8; ci++)
        for (size_t s = 0; s < 3; s++) {
            fg_dtype dt = dts[ci % 2];
            bool causal = ci % 4 < 2, padded = ci >= 4;
            int64_t B = bth[s][0], T = bth[s][1], H = bth[s][2], D = bth[s][3], C = H * D;
            int64_t qs[3] = {B, T, 3 * C}, ys[3] = {B, T, C}, ls[3] = {B, H, T};
            fg_tensor *qkv = rnd(dt, 3, qs, -1, 1), *y = fg_tensor_new(dt, 3, ys);
            fg_tensor *lse = fg_tensor_new(dt, 3, ls);
            fg_tensor *gq = on(qkv), *gy = on(y), *gl = on(lse);
            int64_t ms[2] = {B, T};
            fg_tensor *kpm = padded ? fg_tensor_new(ci % 2 ? FG_I32 : FG_U8, 2, ms) : NULL;
            for (int64_t j = 0; kpm && j < B * T; j++) /* the last batch entry's keys 1, 4, 7.. */
                if (ci % 2) ((int32_t *)fg_tensor_data(kpm))[j] = j >= (B - 1) * T && j % 3 == 1;
                else ((uint8_t *)fg_tensor_data(kpm))[j] = j >= (B - 1) * T && j % 3 == 1;
            fg_tensor *gk = kpm ? on(kpm) : NULL;
            CHECK_OK(C_->attention_fwd(qkv, (int)H, causal, kpm, y, lse));
            CHECK_OK(G_->attention_fwd(gq, (int)H, causal, gk, gy, gl));
            compare("attention_fwd", y, gy, bound_of(dt));
            compare("attention_lse", lse, gl, bound_of(dt));
            fg_tensor *dy = rnd(dt, 3, ys, -1, 1), *dq = rnd(dt, 3, qs, -1, 1);
            fg_tensor *gdy = on(dy), *gdq = on(dq);
            CHECK_OK(C_->attention_bwd(qkv, (int)H, causal, kpm, y, lse, dy, dq));
            CHECK_OK(G_->attention_bwd(gq, (int)H, causal, gk, gy, gl, gdy, gdq));
            compare("attention_bwd", dq, gdq, dt == FG_F32 ? 1e-5 : 2e-2);
            fg_tensor *all[] = {qkv, y, lse, gq, gy, gl, dy, dq, gdy, gdq, kpm, gk};
            for (size_t i = 0; i < sizeof all / sizeof *all; i++) fg_tensor_free(all[i]);
        }
}

TEST(layouts_and_indexing) {
    NEED_GPU();
    int64_t sh[3] = {5, 40, 33}, n40 = 40, k = 17, ysh[3] = {5, 17, 33};
    fg_tensor *x = rnd(FG_F32, 3, sh, -2, 2), *y = rnd(FG_F32, 3, sh, -1, 1);
    fg_tensor *gx = on(x), *gy = on(y);
    CHECK_OK(C_->add_strided(x, y));
    CHECK_OK(G_->add_strided(gx, gy));
    compare("add_strided", y, gy, 1e-6);
    fg_tensor *cond = fg_tensor_new(FG_U8, 3, sh);
    for (int64_t i = 0; i < fg_tensor_numel(cond); i++)
        ((uint8_t *)fg_tensor_data(cond))[i] = i % 3 == 0;
    fg_tensor *gc = on(cond), *w = fg_tensor_new(FG_F32, 3, sh), *gw = on(w);
    CHECK_OK(C_->where(cond, x, NULL, 0, -7.5, w));
    CHECK_OK(G_->where(gc, gx, NULL, 0, -7.5, gw));
    compare("where", w, gw, 0);
    fg_tensor *idx = fg_tensor_new(FG_I32, 1, &k);
    for (int64_t i = 0; i < k; i++) ((int32_t *)fg_tensor_data(idx))[i] = (int32_t)((i * 7) % n40);
    ((int32_t *)fg_tensor_data(idx))[3] = ((int32_t *)fg_tensor_data(idx))[5]; /* a repeat */
    fg_tensor *gi = on(idx), *sel = fg_tensor_new(FG_F32, 3, ysh), *gsel = on(sel);
    CHECK_OK(C_->index_select(x, 1, idx, sel));
    CHECK_OK(G_->index_select(gx, 1, gi, gsel));
    compare("index_select", sel, gsel, 0);
    CHECK_OK(C_->index_add(sel, 1, idx, y));
    CHECK_OK(G_->index_add(gsel, 1, gi, gy));
    compare("index_add", y, gy, 1e-6);
    int64_t msh[2] = {5, 33};
    for (int mn = 0; mn < 2; mn++) {
        fg_tensor *m = fg_tensor_new(FG_F32, 2, msh), *mi = fg_tensor_new(FG_I32, 2, msh);
        fg_tensor *gm = on(m), *gmi = on(mi);
        CHECK_OK(C_->max_dim(x, 1, mn, m, mi));
        CHECK_OK(G_->max_dim(gx, 1, mn, gm, gmi));
        compare(mn ? "min_dim" : "max_dim", m, gm, 0);
        compare(mn ? "min_dim_index" : "max_dim_index", mi, gmi, 0);
        fg_tensor_free(m), fg_tensor_free(mi), fg_tensor_free(gm), fg_tensor_free(gmi);
    }
    for (int rev = 0; rev < 2; rev++) {
        fg_tensor *c = fg_tensor_new(FG_F32, 3, sh), *gcs = on(c);
        CHECK_OK(C_->cumsum(x, 1, rev, c));
        CHECK_OK(G_->cumsum(gx, 1, rev, gcs));
        compare(rev ? "cumsum_reverse" : "cumsum", c, gcs, 1e-6);
        fg_tensor_free(c), fg_tensor_free(gcs);
    }
    /* gather along dim 1 with indices (4, 9, 30) into x (5, 40, 33); scatter_add back */
    int64_t gsh[3] = {4, 9, 30};
    fg_tensor *gidx = fg_tensor_new(FG_I32, 3, gsh);
    for (int64_t i = 0; i < fg_tensor_numel(gidx); i++)
        ((int32_t *)fg_tensor_data(gidx))[i] = (int32_t)((i * 13) % 40);
    fg_tensor *gg = fg_tensor_new(FG_F32, 3, gsh), *ggi = on(gidx), *ggg = on(gg);
    CHECK_OK(C_->gather(x, 1, gidx, gg));
    CHECK_OK(G_->gather(gx, 1, ggi, ggg));
    compare("gather", gg, ggg, 0);
    CHECK_OK(C_->scatter_add(gg, 1, gidx, y));
    CHECK_OK(G_->scatter_add(ggg, 1, ggi, gy));
    compare("scatter_add", y, gy, 1e-6);
    fg_tensor_free(gidx), fg_tensor_free(gg), fg_tensor_free(ggi), fg_tensor_free(ggg);
    ((int32_t *)fg_tensor_data(idx))[9] = 40;
    fg_tensor *gbad = on(idx);
    CHECK_STATUS(G_->index_select(gx, 1, gbad, gsel), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "position 9");
    fg_tensor *all[] = {x, y, gx, gy, cond, gc, w, gw, idx, gi, sel, gsel, gbad};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) fg_tensor_free(all[i]);
}

/* conv2d (strides, padding, dilation, groups, 1 x 1), pooling (max with
 * indices, average with and without the padding counted, adaptive) and
 * batch norm in training mode against the CPU table */
TEST(cnn_conv_pool_batch_norm) {
    NEED_GPU();
    /* N, C, H, W, O, KH, KW, stride, pad, dilation, groups */
    static const int64_t cv[][11] = {{2, 3, 7, 9, 4, 3, 3, 1, 1, 1, 1},
                                     {3, 4, 8, 8, 6, 3, 2, 2, 0, 1, 2},
                                     {1, 6, 11, 10, 6, 3, 3, 1, 2, 2, 3},
                                     {2, 8, 5, 5, 16, 1, 1, 1, 0, 1, 1}};
    fg_dtype dts[] = {FG_F32, FG_BF16};
    for (int di = 0; di < 2; di++)
        for (size_t c = 0; c < sizeof cv / sizeof *cv; c++) {
            const int64_t *v = cv[c];
            fg_dtype dt = dts[di];
            fg_conv_params p = {.stride = {v[7], v[7]},
                                .pad = {v[8], v[8]},
                                .dilation = {v[9], v[9]},
                                .groups = v[10]};
            int64_t OH = (v[2] + 2 * v[8] - v[9] * (v[5] - 1) - 1) / v[7] + 1;
            int64_t OW = (v[3] + 2 * v[8] - v[9] * (v[6] - 1) - 1) / v[7] + 1;
            int64_t xs[4] = {v[0], v[1], v[2], v[3]}, ws[4] = {v[4], v[1] / v[10], v[5], v[6]};
            int64_t ys[4] = {v[0], v[4], OH, OW}, bs[1] = {v[4]};
            fg_tensor *x = rnd(dt, 4, xs, -1, 1), *w = rnd(dt, 4, ws, -1, 1);
            fg_tensor *b = rnd(dt, 1, bs, -1, 1), *y = fg_tensor_new(dt, 4, ys);
            fg_tensor *gx = on(x), *gw = on(w), *gb = on(b), *gy = on(y), *gy2 = on(y);
            CHECK_OK(C_->conv2d_fwd(x, w, b, &p, y));
            CHECK_OK(G_->conv2d_fwd(gx, gw, gb, &p, gy));
            CHECK_OK(G_->conv2d_fwd(gx, gw, gb, &p, gy2));
            compare("conv2d_fwd", y, gy, bound_of(dt));
            same_bits("conv2d_fwd", gy, gy2);
            fg_tensor *dy = rnd(dt, 4, ys, -1, 1), *dx = rnd(dt, 4, xs, -1, 1);
            fg_tensor *dw = rnd(dt, 4, ws, -1, 1), *db = rnd(dt, 1, bs, -1, 1);
            fg_tensor *gdy = on(dy), *gdx = on(dx), *gdw = on(dw), *gdb = on(db);
            CHECK_OK(C_->conv2d_bwd_data(dy, w, &p, dx)); /* accumulated onto dx */
            CHECK_OK(G_->conv2d_bwd_data(gdy, gw, &p, gdx));
            compare("conv2d_bwd_data", dx, gdx, bound_of(dt));
            fg_conv_params po = p;
            po.overwrite = true;
            CHECK_OK(C_->conv2d_bwd_data(dy, w, &po, dx));
            CHECK_OK(G_->conv2d_bwd_data(gdy, gw, &po, gdx));
            compare("conv2d_bwd_data_overwrite", dx, gdx, bound_of(dt));
            CHECK_OK(C_->conv2d_bwd_weight(x, dy, &p, dw, db));
            CHECK_OK(G_->conv2d_bwd_weight(gx, gdy, &p, gdw, gdb));
            compare("conv2d_bwd_weight", dw, gdw, bound_of(dt) * 4);
            compare("conv2d_bwd_bias", db, gdb, bound_of(dt) * 4);
            CHECK_OK(C_->conv2d_bwd_weight(x, dy, &p, NULL, db)); /* the bias alone */
            CHECK_OK(G_->conv2d_bwd_weight(gx, gdy, &p, NULL, gdb));
            compare("conv2d_bwd_bias_alone", db, gdb, bound_of(dt) * 4);
            fg_tensor *all[] = {x,  w,  b,  y,  gx,  gw,  gb,  gy, gy2,
                                dy, dx, dw, db, gdy, gdx, gdw, gdb};
            for (size_t i = 0; i < sizeof all / sizeof *all; i++) fg_tensor_free(all[i]);
        }
    /* pooling: kind, kernel, stride, pad, dilation, count_include_pad, OH, OW of a 2x3x9x8 input */
    static const int64_t pl[][8] = {
        {FG_POOL_MAX, 3, 2, 1, 1, 0, 5, 4},          {FG_POOL_MAX, 2, 1, 0, 2, 0, 7, 6},
        {FG_POOL_AVG, 3, 2, 1, 1, 1, 5, 4},          {FG_POOL_AVG, 3, 2, 1, 1, 0, 5, 4},
        {FG_POOL_ADAPTIVE_AVG, 0, 0, 0, 0, 0, 4, 3}, {FG_POOL_ADAPTIVE_AVG, 0, 0, 0, 0, 0, 1, 1}};
    for (int di = 0; di < 2; di++)
        for (size_t c = 0; c < sizeof pl / sizeof *pl; c++) {
            const int64_t *v = pl[c];
            fg_dtype dt = dts[di];
            fg_pool_params p = {.kind = (fg_pool_kind)v[0],
                                .kernel = {v[1], v[1]},
                                .stride = {v[2], v[2]},
                                .pad = {v[3], v[3]},
                                .dilation = {v[4], v[4]},
                                .count_include_pad = v[5] != 0};
            int64_t xs[4] = {2, 3, 9, 8}, ys[4] = {2, 3, v[6], v[7]};
            fg_tensor *x = rnd(dt, 4, xs, -1, 1), *y = fg_tensor_new(dt, 4, ys);
            fg_tensor *idx = fg_tensor_new(FG_I32, 4, ys), *gidx = on(idx);
            fg_tensor *gx = on(x), *gy = on(y);
            bool mx = p.kind == FG_POOL_MAX;
            CHECK_OK(C_->pool2d_fwd(x, &p, y, mx ? idx : NULL));
            CHECK_OK(G_->pool2d_fwd(gx, &p, gy, mx ? gidx : NULL));
            compare("pool2d_fwd", y, gy, mx ? 0 : bound_of(dt));
            if (mx) compare("pool2d_fwd_indices", idx, gidx, 0);
            fg_tensor *dy = rnd(dt, 4, ys, -1, 1), *dx = rnd(dt, 4, xs, -1, 1);
            fg_tensor *gdy = on(dy), *gdx = on(dx);
            CHECK_OK(C_->pool2d_bwd(dy, mx ? idx : NULL, &p, dx));
            CHECK_OK(G_->pool2d_bwd(gdy, mx ? gidx : NULL, &p, gdx));
            compare("pool2d_bwd", dx, gdx, bound_of(dt));
            fg_tensor *all[] = {x, y, idx, gidx, gx, gy, dy, dx, gdy, gdx};
            for (size_t i = 0; i < sizeof all / sizeof *all; i++) fg_tensor_free(all[i]);
        }
    /* batch norm over (N, C, S) and (N, C) */
    static const int64_t bn[][4] = {{4, 3, 5, 7}, {33, 5, 1, 1}};
    for (size_t c = 0; c < 2; c++) {
        int64_t xs[4] = {bn[c][0], bn[c][1], bn[c][2], bn[c][3]}, C = bn[c][1], cs[1] = {C};
        int nd = bn[c][2] == 1 ? 2 : 4;
        fg_tensor *x = rnd(FG_F32, nd, xs, -2, 3), *w = rnd(FG_F32, 1, cs, 0.5f, 1.5f);
        fg_tensor *b = rnd(FG_F32, 1, cs, -1, 1), *y = fg_tensor_new(FG_F32, nd, xs);
        fg_tensor *gx = on(x), *gw = on(w), *gb = on(b), *gy = on(y);
        double m[8], v[8], gm[8], gv[8], is[8];
        CHECK_OK(C_->batch_norm_stats(x, m, v));
        CHECK_OK(G_->batch_norm_stats(gx, gm, gv));
        double e = 0;
        for (int64_t k = 0; k < C; k++) e = fmax(e, fmax(fabs(m[k] - gm[k]), fabs(v[k] - gv[k])));
        printf("entry batch_norm_stats f32 C %lld: err %.3g (bound 1e-9)\n", (long long)C, e);
        CHECK_MSG(e <= 1e-9, "batch_norm_stats: mean or variance off by %g", e);
        for (int64_t k = 0; k < C; k++) is[k] = 1 / sqrt(v[k] + 1e-5);
        CHECK_OK(C_->batch_norm_fwd(x, m, is, w, b, y));
        CHECK_OK(G_->batch_norm_fwd(gx, m, is, gw, gb, gy));
        compare("batch_norm_fwd", y, gy, 1e-6);
        fg_tensor *dy = rnd(FG_F32, nd, xs, -1, 1), *dx = rnd(FG_F32, nd, xs, -1, 1);
        fg_tensor *dw = rnd(FG_F32, 1, cs, -1, 1), *db = rnd(FG_F32, 1, cs, -1, 1);
        fg_tensor *gdy = on(dy), *gdx = on(dx), *gdw = on(dw), *gdb = on(db), *gdx2 = on(dx);
        CHECK_OK(C_->batch_norm_bwd(x, dy, m, is, w, dx, dw, db, false));
        CHECK_OK(G_->batch_norm_bwd(gx, gdy, m, is, gw, gdx, gdw, gdb, false));
        compare("batch_norm_bwd_dx", dx, gdx, 1e-5);
        compare("batch_norm_bwd_dw", dw, gdw, 1e-5);
        compare("batch_norm_bwd_db", db, gdb, 1e-5);
        CHECK_OK(C_->batch_norm_bwd(x, dy, m, is, NULL, dx, NULL, NULL, true));
        CHECK_OK(G_->batch_norm_bwd(gx, gdy, m, is, NULL, gdx, NULL, NULL, true));
        CHECK_OK(G_->batch_norm_bwd(gx, gdy, m, is, NULL, gdx2, NULL, NULL, true));
        compare("batch_norm_bwd_overwrite", dx, gdx, 1e-5);
        same_bits("batch_norm_bwd", gdx, gdx2);
        fg_tensor *bf = fg_tensor_new(FG_BF16, nd, xs), *gbf = on(bf);
        CHECK_STATUS(G_->batch_norm_stats(gbf, gm, gv), FG_EUNSUPPORTED);
        CHECK_CONTAINS(fg_last_error(), "f32 only on cuda");
        fg_tensor *all[] = {x,  w,  b,   y,   gx,  gw,  gb,   gy, dy, dx,
                            dw, db, gdy, gdx, gdw, gdb, gdx2, bf, gbf};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) fg_tensor_free(all[i]);
    }
}

/* the elementwise losses (each op, with and without pos_weight) and the
 * NLL rows (class weights, ignore_index, label smoothing) against the CPU */
TEST(losses_pointwise_nll) {
    NEED_GPU();
    int64_t sh[2] = {5, 33};
    fg_dtype dts[] = {FG_F32, FG_BF16};
    for (int di = 0; di < 2; di++)
        for (int op = FG_LOSS_MSE; op <= FG_LOSS_KL_DIV; op++)
            for (int pv = 0; pv < 2; pv++) {
                fg_dtype dt = dts[di];
                bool bce = op == FG_LOSS_BCE, kl = op == FG_LOSS_KL_DIV;
                double p = op == FG_LOSS_SMOOTH_L1 ? 0.5 : op == FG_LOSS_HUBER ? 1.0 : kl ? pv : 0;
                fg_tensor *x = rnd(dt, 2, sh, bce ? 0.02f : -2, bce ? 0.98f : 2);
                fg_tensor *t = rnd(dt, 2, sh, bce || (kl && !pv) ? 0 : -2, bce ? 1 : 2);
                fg_tensor *w = op == FG_LOSS_BCE_LOGITS && pv ? rnd(dt, 2, sh, 0.5f, 2) : NULL;
                fg_tensor *y = fg_tensor_new(dt, 2, sh), *dy = rnd(dt, 2, sh, -1, 1);
                fg_tensor *dx = rnd(dt, 2, sh, -1, 1), *dtt = rnd(dt, 2, sh, -1, 1);
                fg_tensor *gx = on(x), *gt = on(t), *gw = w ? on(w) : NULL, *gy = on(y);
                fg_tensor *gdy = on(dy), *gdx = on(dx), *gdt = on(dtt);
                char nm[48];
                snprintf(nm, sizeof nm, "pointwise_loss_fwd_%d%s", op, pv ? "_p" : "");
                CHECK_OK(C_->pointwise_loss_fwd((fg_loss_op)op, x, t, w, p, y));
                CHECK_OK(G_->pointwise_loss_fwd((fg_loss_op)op, gx, gt, gw, p, gy));
                compare(nm, y, gy, bound_of(dt));
                snprintf(nm, sizeof nm, "pointwise_loss_bwd_%d%s", op, pv ? "_p" : "");
                CHECK_OK(C_->pointwise_loss_bwd((fg_loss_op)op, x, t, w, p, dy, dx, dtt));
                CHECK_OK(G_->pointwise_loss_bwd((fg_loss_op)op, gx, gt, gw, p, gdy, gdx, gdt));
                compare(nm, dx, gdx, bound_of(dt));
                compare(nm, dtt, gdt, bound_of(dt));
                fg_tensor *all[] = {x, t, w, y, dy, dx, dtt, gx, gt, gw, gy, gdy, gdx, gdt};
                for (size_t i = 0; i < sizeof all / sizeof *all; i++) fg_tensor_free(all[i]);
            }
    int64_t ls[2] = {7, 11}, ts[1] = {7}, cs[1] = {11};
    for (int wi = 0; wi < 2; wi++)
        for (int e = 0; e < 2; e++) {
            double eps = e ? 0.1 : 0;
            fg_tensor *lp = rnd(FG_F32, 2, ls, -4, 0), *t = fg_tensor_new(FG_I32, 1, ts);
            for (int m = 0; m < 7; m++)
                ((int32_t *)fg_tensor_data(t))[m] = m == 3 ? -100 : (m * 5) % 11;
            fg_tensor *w = wi ? rnd(FG_F32, 1, cs, 0.5f, 2) : NULL;
            fg_tensor *y = fg_tensor_new(FG_F32, 1, ts), *dy = rnd(FG_F32, 1, ts, -1, 1);
            fg_tensor *dl = rnd(FG_F32, 2, ls, -1, 1);
            fg_tensor *glp = on(lp), *gt = on(t), *gw = w ? on(w) : NULL, *gy = on(y);
            fg_tensor *gdy = on(dy), *gdl = on(dl);
            double ws = 0, gws = 0;
            CHECK_OK(C_->nll_fwd(lp, t, w, -100, eps, y, &ws));
            CHECK_OK(G_->nll_fwd(glp, gt, gw, -100, eps, gy, &gws));
            compare("nll_fwd", y, gy, 1e-6);
            printf("entry nll_fwd_wsum f32 7x11: err %.3g (bound 1e-12)\n", fabs(ws - gws));
            CHECK(fabs(ws - gws) <= 1e-12 * fmax(1, fabs(ws)));
            CHECK_OK(C_->nll_bwd(t, w, -100, eps, dy, dl));
            CHECK_OK(G_->nll_bwd(gt, gw, -100, eps, gdy, gdl));
            compare("nll_bwd", dl, gdl, 1e-6);
            ((int32_t *)fg_tensor_data(t))[5] = 11;
            fg_tensor *gbad = on(t);
            CHECK_STATUS(G_->nll_fwd(glp, gbad, gw, -100, eps, gy, &gws), FG_EINVAL);
            CHECK_CONTAINS(fg_last_error(), "target 11 (row 5)");
            fg_tensor *all[] = {lp, t, w, y, dy, dl, glp, gt, gw, gy, gdy, gdl, gbad};
            for (size_t i = 0; i < sizeof all / sizeof *all; i++) fg_tensor_free(all[i]);
        }
}

TEST(zz_leak_check) {
    NEED_GPU();
    CHECK_OK(fg_dev_leak_check(g_dev));
    fg_dev_close(g_dev);
    g_dev = NULL;
    snprintf(g_why, sizeof g_why, "closed");
}
