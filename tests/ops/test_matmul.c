/* The dense kernels against naive references computed here in double:
 * matmul (every transpose, alpha/beta, odd sizes, batched, shared b folded
 * and looped, transposed and sliced views, empty sizes, threads; on every
 * engine FULGUR_GEMM can force, and on a choice of one thread read from the
 * calibration file), bias_add and bias_grad (accumulating), causal
 * attention forward and backward against an unfused reference, and the
 * errors they report. The calibration file round-trips, and a file that
 * fails any check (garbage, truncated, a changed byte, another key, a line
 * out of range) is refused whole. */
#include <fcntl.h>
#include <math.h>

#include "fulgur/ops.h"
#include "harness.h"
#include "ops/cpu/blas.h"

#define FG_MAX_T(a, b) ((a) > (b) ? (a) : (b))

static const fg_op_table *ops(void) { return fg_ops_get(FG_CPU); }

static fg_tensor *randn(fg_dtype dt, int nd, const int64_t *shape, uint64_t seed) {
    fg_tensor *t = fg_empty(dt, nd, shape);
    fg_rng r = {seed, 0};
    int64_t n = fg_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) {
        double v = fg_rng_normal(&r);
        if (dt == FG_F32) ((float *)fg_tensor_data(t))[i] = (float)v;
        else ((double *)fg_tensor_data(t))[i] = v;
    }
    return t;
}

static int64_t numel_of(int nd, const int64_t *s) {
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= s[i];
    return n;
}

/* Worst |got - want| / (1 + |want|) over all elements (logical order). */
static double max_err(const fg_tensor *got, const double *want) {
    double e = 0;
    for (int64_t i = 0; i < fg_tensor_numel(got); i++) {
        double d = fabs(fg_tensor_get(got, i) - want[i]) / (1 + fabs(want[i]));
        if (!(d <= e)) e = d; /* NaN sticks */
    }
    return e;
}

/* Every element of t in logical order, as doubles (caller frees). */
static double *dense(const fg_tensor *t) {
    int64_t n = fg_tensor_numel(t);
    double *d = malloc(sizeof(double) * (size_t)FG_MAX_T(1, n));
    for (int64_t i = 0; i < n; i++) d[i] = fg_tensor_get(t, i);
    return d;
}

/* want = alpha op(a) op(b) + beta c0 over `batch` entries, from logical
 * element reads (so any layout of a and b is read correctly), each operand
 * read once into doubles: the sums are the same, in the same order, as
 * reading each element at each use. */
static double *ref_matmul(const fg_tensor *a, bool ta, const fg_tensor *b, bool tb,
                          const fg_tensor *c0, double alpha, double beta) {
    int bn = fg_tensor_ndim(b), cn = fg_tensor_ndim(c0);
    int64_t ar = fg_tensor_dim(a, -2), ac = fg_tensor_dim(a, -1);
    int64_t br = fg_tensor_dim(b, -2), bc = fg_tensor_dim(b, -1);
    int64_t M = fg_tensor_dim(c0, -2), N = fg_tensor_dim(c0, -1), K = ta ? ar : ac;
    int64_t batch = numel_of(cn - 2, fg_tensor_shape(c0));
    bool shared = bn == 2;
    double *da = dense(a), *db = dense(b), *dc = beta == 0 ? NULL : dense(c0);
    double *w = malloc(sizeof(double) * (size_t)FG_MAX_T(1, batch * M * N));
    for (int64_t i = 0; i < batch; i++)
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                double s = 0;
                for (int64_t k = 0; k < K; k++) {
                    int64_t ai = i * ar * ac + (ta ? k * ac + m : m * ac + k);
                    int64_t bi = (shared ? 0 : i * br * bc) + (tb ? n * bc + k : k * bc + n);
                    s += da[ai] * db[bi];
                }
                int64_t ci = (i * M + m) * N + n;
                w[ci] = alpha * s + (beta == 0 ? 0 : beta * dc[ci]);
            }
    free(da);
    free(db);
    free(dc);
    return w;
}

/* Runs one product in dtype dt and compares it with the reference. */
static void check_product(fg_dtype dt, int bd, const int64_t *bdims, int64_t M, int64_t K,
                          int64_t N, bool ta, bool tb, bool shared, double alpha, double beta,
                          uint64_t seed) {
    int64_t sa[6], sb[6], sc[6];
    for (int d = 0; d < bd; d++) sa[d] = sb[d] = sc[d] = bdims[d];
    sa[bd] = ta ? K : M;
    sa[bd + 1] = ta ? M : K;
    int bnd = shared ? 2 : bd + 2, bo = shared ? 0 : bd;
    sb[bo] = tb ? N : K;
    sb[bo + 1] = tb ? K : N;
    sc[bd] = M;
    sc[bd + 1] = N;
    fg_tensor *a = randn(dt, bd + 2, sa, seed), *b = randn(dt, bnd, sb, seed + 1);
    fg_tensor *c = randn(dt, bd + 2, sc, seed + 2);
    if (beta == 0) { /* beta = 0 must ignore c's old contents, NaN included */
        for (int64_t i = 0; i < fg_tensor_numel(c); i++) {
            if (dt == FG_F32) ((float *)fg_tensor_data(c))[i] = NAN;
            else ((double *)fg_tensor_data(c))[i] = NAN;
        }
    }
    double *want = ref_matmul(a, ta, b, tb, c, alpha, beta);
    CHECK_OK(ops()->matmul(a, ta, b, tb, c, alpha, beta));
    double tol = dt == FG_F64 ? 1e-12 : 2e-6 * sqrt((double)K + 1);
    double e = max_err(c, want);
    CHECK_MSG(e <= tol,
              "%s batch %d M %lld K %lld N %lld ta %d tb %d shared %d alpha %g beta %g: "
              "error %g",
              fg_dtype_name(dt), bd, (long long)M, (long long)K, (long long)N, ta, tb, shared,
              alpha, beta, e);
    free(want);
}

/* Says which engines this process runs the products on (scripts/test.sh
 * collects the line), and that the line names both dtypes. */
TEST(matmul_paths_named) {
    const char *info = fg_ops_blas_info();
    printf("matmul path: %s\n", info);
    CHECK_CONTAINS(info, "f32: ");
    CHECK_CONTAINS(info, "; bf16: ");
}

TEST(matmul_2d_every_transpose_and_scale) {
    static const int64_t sizes[][3] = {{1, 1, 1},    {3, 5, 7},   {17, 31, 13},
                                       {64, 33, 65}, {2, 130, 3}, {129, 7, 1}};
    static const double ab[][2] = {{1, 0}, {0.5, -1.5}, {-2, 1}};
    fg_dtype dts[] = {FG_F64, FG_F32};
    uint64_t seed = 10;
    for (int di = 0; di < 2; di++)
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
            for (int t = 0; t < 4; t++)
                for (int k = 0; k < 3; k++)
                    check_product(dts[di], 0, NULL, sizes[s][0], sizes[s][1], sizes[s][2], t & 1,
                                  t & 2, true, ab[k][0], ab[k][1], seed += 3);
    fg_step_reset();
}

TEST(matmul_batched_and_shared_b) {
    int64_t b1[] = {5}, b2[] = {2, 3};
    fg_dtype dts[] = {FG_F64, FG_F32};
    uint64_t seed = 100;
    for (int di = 0; di < 2; di++)
        for (int t = 0; t < 4; t++) {
            /* per-entry b, one and two batch dims */
            check_product(dts[di], 1, b1, 7, 9, 11, t & 1, t & 2, false, 1, 0, seed += 3);
            check_product(dts[di], 2, b2, 4, 17, 6, t & 1, t & 2, false, 0.5, 2, seed += 3);
            /* shared b: folds into one gemm when a is not transposed, loops otherwise */
            check_product(dts[di], 1, b1, 7, 9, 11, t & 1, t & 2, true, 1, 1, seed += 3);
            check_product(dts[di], 2, b2, 13, 5, 3, t & 1, t & 2, true, -1, 0, seed += 3);
        }
    fg_step_reset();
}

TEST(matmul_batched_on_two_threads) {
    /* small products split over OpenMP threads, big ones over OpenBLAS's */
    int prev = fg_get_num_threads();
    CHECK_OK(fg_set_num_threads(2));
    int64_t b1[] = {8};
    check_product(FG_F32, 1, b1, 32, 16, 24, false, true, false, 1, 0, 7);
    check_product(FG_F64, 1, b1, 32, 16, 24, true, false, false, 1, 1, 8);
    check_product(FG_F32, 0, NULL, 300, 200, 100, false, false, true, 1, 0, 9);
    CHECK_OK(fg_set_num_threads(prev));
    fg_step_reset();
}

TEST(matmul_reads_views_in_place) {
    /* a transposed view is read as a BLAS transpose, a column slice through
     * its leading dimension (one head of a fused qkv) */
    for (int di = 0; di < 2; di++) {
        fg_dtype dt = di ? FG_F32 : FG_F64;
        int64_t sbase[] = {2, 6, 12}, sb[] = {2, 6, 5}, sc[] = {2, 4, 5};
        fg_tensor *base = randn(dt, 3, sbase, 1);
        fg_tensor *at = fg_tensor_transpose_view(fg_tensor_narrow_view(base, 2, 3, 4), 1, 2);
        /* at is (2, 4, 6): column-major slices of base */
        fg_tensor *b = randn(dt, 3, sb, 2), *c = fg_zeros(dt, 3, sc);
        double *want = ref_matmul(at, false, b, false, c, 1, 0);
        CHECK_OK(ops()->matmul(at, false, b, false, c, 1, 0));
        CHECK(max_err(c, want) <= (di ? 1e-5 : 1e-12));
        free(want);
        /* a row-major slice with a leading dimension bigger than its width */
        int64_t sx[] = {7, 10}, sw[] = {4, 3}, sy[] = {7, 3};
        fg_tensor *x = fg_tensor_narrow_view(randn(dt, 2, sx, 3), 1, 2, 4);
        fg_tensor *w = randn(dt, 2, sw, 4), *y = fg_zeros(dt, 2, sy);
        want = ref_matmul(x, false, w, false, y, 1, 0);
        CHECK_OK(ops()->matmul(x, false, w, false, y, 1, 0));
        CHECK(max_err(y, want) <= (di ? 1e-5 : 1e-12));
        free(want);
    }
    fg_step_reset();
}

TEST(matmul_empty_sizes) {
    int64_t sa[] = {3, 0}, sb[] = {0, 4}, sc[] = {3, 4};
    fg_tensor *a = fg_zeros(FG_F32, 2, sa), *b = fg_zeros(FG_F32, 2, sb);
    fg_tensor *c = fg_full(FG_F32, 2, sc, 2.0);
    CHECK_OK(ops()->matmul(a, false, b, false, c, 1, 0.5)); /* K = 0: c = beta c */
    for (int i = 0; i < 12; i++) CHECK(fg_tensor_get(c, i) == 1.0);
    CHECK_OK(ops()->matmul(a, false, b, false, c, 1, 0));
    for (int i = 0; i < 12; i++) CHECK(fg_tensor_get(c, i) == 0.0);
    int64_t s0[] = {0, 5}, s5[] = {5, 4}, s04[] = {0, 4};
    CHECK_OK(ops()->matmul(fg_zeros(FG_F64, 2, s0), false, fg_zeros(FG_F64, 2, s5), false,
                           fg_zeros(FG_F64, 2, s04), 1, 0));
    int64_t z3[] = {0, 2, 3}, z33[] = {3, 3}, z23[] = {0, 2, 3};
    CHECK_OK(ops()->matmul(fg_zeros(FG_F64, 3, z3), false, fg_zeros(FG_F64, 2, z33), false,
                           fg_zeros(FG_F64, 3, z23), 1, 0));
    fg_step_reset();
}

TEST(matmul_errors_name_the_shapes) {
    int64_t s23[] = {2, 3}, s43[] = {4, 3}, s24[] = {2, 4}, s3[] = {3};
    fg_tensor *a = fg_zeros(FG_F32, 2, s23), *b = fg_zeros(FG_F32, 2, s43);
    fg_tensor *c = fg_zeros(FG_F32, 2, s24);
    CHECK_STATUS(ops()->matmul(a, false, b, false, c, 1, 0), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "f32[2, 3]");
    CHECK_CONTAINS(fg_last_error(), "f32[4, 3]");
    CHECK_OK(ops()->matmul(a, false, b, true, c, 1, 0));
    CHECK_STATUS(ops()->matmul(a, false, fg_zeros(FG_F64, 2, s43), true, c, 1, 0), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "dtypes differ");
    CHECK_STATUS(ops()->matmul(fg_zeros(FG_F32, 1, s3), false, b, true, c, 1, 0), FG_EINVAL);
    CHECK_STATUS(
        ops()->matmul(a, false, b, true,
                      fg_tensor_transpose_view(fg_zeros(FG_F32, 2, (int64_t[]){4, 2}), 0, 1), 1, 0),
        FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "transposed");
    CHECK_STATUS(ops()->matmul(fg_zeros(FG_I32, 2, s23), false, fg_zeros(FG_I32, 2, s43), true,
                               fg_zeros(FG_I32, 2, s24), 1, 0),
                 FG_EUNSUPPORTED);
    int64_t s234[] = {2, 3, 4}, s334[] = {3, 3, 4}, s244[] = {2, 4, 4};
    CHECK_STATUS(ops()->matmul(fg_zeros(FG_F32, 3, s234), true, fg_zeros(FG_F32, 3, s334), false,
                               fg_zeros(FG_F32, 3, s244), 1, 0),
                 FG_EINVAL); /* batch dims differ */
    fg_step_reset();
}

TEST(bias_add_and_grad_accumulate) {
    static const int64_t shapes[][2] = {{5, 3}, {33, 70}, {0, 4}, {300, 257}};
    for (int di = 0; di < 2; di++)
        for (int s = 0; s < 4; s++) {
            fg_dtype dt = di ? FG_F32 : FG_F64;
            int64_t R = shapes[s][0], C = shapes[s][1];
            int64_t sy[] = {R, C}, sbias[] = {C};
            fg_tensor *y = randn(dt, 2, sy, 1 + s), *bias = randn(dt, 1, sbias, 2 + s);
            double *want = malloc(sizeof(double) * (size_t)(R * C + C + 1));
            for (int64_t i = 0; i < R * C; i++)
                want[i] = fg_tensor_get(y, i) + fg_tensor_get(bias, i % C);
            CHECK_OK(ops()->bias_add(y, bias));
            CHECK(max_err(y, want) <= (di ? 1e-6 : 1e-15));
            /* dbias += column sums: starts from bias's values */
            for (int64_t j = 0; j < C; j++) {
                double acc = fg_tensor_get(bias, j);
                for (int64_t r = 0; r < R; r++) acc += fg_tensor_get(y, r * C + j);
                want[j] = acc;
            }
            CHECK_OK(ops()->bias_grad(y, bias));
            CHECK(max_err(bias, want) <= (di ? 1e-5 : 1e-12));
            free(want);
        }
    /* leading dims flatten: (2, 3, 4) rows of 4 */
    int64_t s234[] = {2, 3, 4}, s4[] = {4}, s5[] = {5};
    fg_tensor *y = fg_zeros(FG_F32, 3, s234), *bias = fg_full(FG_F32, 1, s4, 1.5);
    CHECK_OK(ops()->bias_add(y, bias));
    CHECK(fg_tensor_get(y, 23) == 1.5);
    CHECK_STATUS(ops()->bias_add(y, fg_zeros(FG_F32, 1, s5)), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "f32[5]");
    fg_step_reset();
}

/* ---- attention against an unfused reference in double ---- */

typedef struct {
    double *y, *lse, *dqkv;
} att_ref;

/* qkv (B, T, 3C): q at [0, C), k at [C, 2C), v at [2C, 3C), head h at
 * columns [h hs, (h+1) hs) of each. dy seeds the backward. */
static att_ref ref_attention(const fg_tensor *qkv, const fg_tensor *dy, int H, bool causal,
                             const uint8_t *pad) {
    int64_t B = fg_tensor_dim(qkv, 0), T = fg_tensor_dim(qkv, 1), C = fg_tensor_dim(qkv, 2) / 3;
    int64_t hs = C / H;
    double sc = 1 / sqrt((double)hs);
    att_ref r = {calloc((size_t)(B * T * C), sizeof(double)),
                 calloc((size_t)(B * H * T), sizeof(double)),
                 calloc((size_t)(B * T * 3 * C), sizeof(double))};
    double *P = malloc(sizeof(double) * (size_t)(T * T)),
           *dP = malloc(sizeof(double) * (size_t)(T * T));
#define Q(t, d) fg_tensor_get(qkv, (b * T + (t)) * 3 * C + h * hs + (d))
#define K(t, d) fg_tensor_get(qkv, (b * T + (t)) * 3 * C + C + h * hs + (d))
#define V(t, d) fg_tensor_get(qkv, (b * T + (t)) * 3 * C + 2 * C + h * hs + (d))
#define DY(t, d) fg_tensor_get(dy, (b * T + (t)) * C + h * hs + (d))
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            for (int64_t t = 0; t < T; t++) { /* full scores, then mask, then softmax */
                double m = -INFINITY;
                for (int64_t j = 0; j < T; j++) {
                    double s = 0;
                    for (int64_t d = 0; d < hs; d++) s += Q(t, d) * K(j, d);
                    P[t * T + j] =
                        (j <= t || !causal) && !(pad && pad[b * T + j]) ? s * sc : -INFINITY;
                    if (P[t * T + j] > m) m = P[t * T + j];
                }
                double z = 0;
                for (int64_t j = 0; j < T; j++) z += exp(P[t * T + j] - m);
                for (int64_t j = 0; j < T; j++) P[t * T + j] = exp(P[t * T + j] - m) / z;
                r.lse[(b * H + h) * T + t] = m + log(z);
                for (int64_t d = 0; d < hs; d++) {
                    double acc = 0;
                    for (int64_t j = 0; j < T; j++) acc += P[t * T + j] * V(j, d);
                    r.y[(b * T + t) * C + h * hs + d] = acc;
                }
            }
            if (!dy) continue;
            for (int64_t t = 0; t < T; t++) {
                double dot = 0;
                for (int64_t j = 0; j < T; j++) {
                    double s = 0;
                    for (int64_t d = 0; d < hs; d++) s += DY(t, d) * V(j, d);
                    dP[t * T + j] = s;
                    dot += s * P[t * T + j];
                }
                for (int64_t j = 0; j < T; j++)
                    dP[t * T + j] = P[t * T + j] * (dP[t * T + j] - dot);
            }
            for (int64_t t = 0; t < T; t++)
                for (int64_t d = 0; d < hs; d++) {
                    double dq = 0, dk = 0, dv = 0;
                    for (int64_t j = 0; j < T; j++) {
                        dq += dP[t * T + j] * K(j, d) * sc;
                        dk += dP[j * T + t] * Q(j, d) * sc;
                        dv += P[j * T + t] * DY(j, d);
                    }
                    double *g = r.dqkv + (b * T + t) * 3 * C + h * hs + d;
                    g[0] = dq;
                    g[C] = dk;
                    g[2 * C] = dv;
                }
        }
#undef Q
#undef K
#undef V
#undef DY
    free(P);
    free(dP);
    return r;
}

/* pad: every third key of batch entry 1 (not key 0, so no row is left
 * without keys), as a u8 mask or (i32) an i32 one */
static void check_attention_pad(fg_dtype dt, int64_t B, int64_t T, int64_t C, int H, bool causal,
                                int pad, uint64_t seed) {
    int64_t sq[] = {B, T, 3 * C}, sy[] = {B, T, C}, sl[] = {B, H, T};
    fg_tensor *qkv = randn(dt, 3, sq, seed), *dy = randn(dt, 3, sy, seed + 1);
    fg_tensor *y = fg_empty(dt, 3, sy), *lse = fg_empty(dt, 3, sl);
    fg_tensor *dqkv = randn(dt, 3, sq, seed + 2); /* backward accumulates onto this */
    double *g0 = malloc(sizeof(double) * (size_t)(B * T * 3 * C + 1));
    for (int64_t i = 0; i < B * T * 3 * C; i++) g0[i] = fg_tensor_get(dqkv, i);
    uint8_t *pm = calloc((size_t)(B * T + 1), 1);
    fg_tensor *kpm = pad ? fg_zeros(pad == 2 ? FG_I32 : FG_U8, 2, (int64_t[]){B, T}) : NULL;
    for (int64_t j = 1; pad && B > 1 && j < T; j += 3) {
        pm[T + j] = 1;
        if (pad == 2) ((int32_t *)fg_tensor_data(kpm))[T + j] = 7;
        else ((uint8_t *)fg_tensor_data(kpm))[T + j] = 1;
    }
    att_ref r = ref_attention(qkv, dy, H, causal, pad ? pm : NULL);
    for (int64_t i = 0; i < B * T * 3 * C; i++) r.dqkv[i] += g0[i];
    CHECK_OK(ops()->attention_fwd(qkv, H, causal, kpm, y, lse));
    CHECK_OK(ops()->attention_bwd(qkv, H, causal, kpm, y, lse, dy, dqkv));
    free(pm);
    double tol = dt == FG_F64 ? 1e-12 : 2e-5;
    double ey = max_err(y, r.y), el = max_err(lse, r.lse), eg = max_err(dqkv, r.dqkv);
    CHECK_MSG(ey <= tol && el <= tol && eg <= 5 * tol,
              "%s%s%s B %lld T %lld C %lld H %d: errors y %g lse %g dqkv %g",
              causal ? "causal " : "", pad ? "padded " : "", fg_dtype_name(dt), (long long)B,
              (long long)T, (long long)C, H, ey, el, eg);
    fg_tensor_free(kpm);
    free(r.y);
    free(r.lse);
    free(r.dqkv);
    free(g0);
}

static void check_attention(fg_dtype dt, int64_t B, int64_t T, int64_t C, int H, bool causal,
                            uint64_t seed) {
    check_attention_pad(dt, B, T, C, H, causal, 0, seed);
}

TEST(attention_matches_unfused_reference) {
    static const int64_t cases[][4] = {/* B, T, C, H */
                                       {1, 1, 4, 1},   {2, 1, 6, 3},  {1, 5, 8, 2},  {2, 7, 12, 3},
                                       {3, 33, 16, 4}, {1, 70, 8, 1}, {2, 64, 32, 2}};
    for (int causal = 0; causal < 2; causal++)
        for (int di = 0; di < 2; di++)
            for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
                check_attention(di ? FG_F32 : FG_F64, cases[c][0], cases[c][1], cases[c][2],
                                (int)cases[c][3], causal, 50 + c);
    /* without the mask: T = 150 rows go in blocks of 50, T = 1030 in blocks
     * of 32 and 6 (kernel blocks of at most 8192 scores, at least 32 rows) */
    check_attention(FG_F32, 1, 150, 8, 2, false, 60);
    check_attention(FG_F64, 1, 1030, 4, 1, false, 61);
    /* key padding masks, u8 and i32, with and without the causal mask, and
     * over several blocks */
    for (int pad = 1; pad <= 2; pad++)
        for (int causal = 0; causal < 2; causal++) {
            check_attention_pad(FG_F64, 2, 7, 12, 3, causal, pad, 70 + pad);
            check_attention_pad(FG_F32, 3, 33, 16, 4, causal, pad, 72 + pad);
            check_attention_pad(FG_F32, 2, 150, 8, 2, causal, pad, 74 + pad);
        }
    int prev = fg_get_num_threads();
    CHECK_OK(fg_set_num_threads(2)); /* (batch, head) tasks over threads */
    for (int causal = 0; causal < 2; causal++) {
        check_attention(FG_F32, 3, 37, 24, 3, causal, 99);
        check_attention(FG_F64, 1, 37, 24, 1, causal, 98); /* one task: OpenBLAS threads inside */
    }
    CHECK_OK(fg_set_num_threads(prev));
    fg_step_reset();
}

/* a batch entry whose keys are all padding gives NaN rows (PyTorch's
 * MultiheadAttention does), the other entry its own values; a mask of
 * another shape or dtype is refused naming it */
TEST(attention_padding_every_key_is_nan) {
    int64_t sq[] = {2, 5, 6}, sy[] = {2, 5, 2}, sl[] = {2, 1, 5}, sm[] = {2, 5};
    fg_tensor *qkv = randn(FG_F32, 3, sq, 9), *y = fg_empty(FG_F32, 3, sy);
    fg_tensor *lse = fg_empty(FG_F32, 3, sl), *kpm = fg_zeros(FG_U8, 2, sm);
    for (int j = 5; j < 10; j++) ((uint8_t *)fg_tensor_data(kpm))[j] = 1;
    CHECK_OK(ops()->attention_fwd(qkv, 1, false, kpm, y, lse));
    att_ref r = ref_attention(qkv, NULL, 1, false, NULL);
    const float *py = fg_tensor_data(y);
    for (int i = 0; i < 10; i++) CHECK_CLOSE(py[i], r.y[i], 1e-5, 1e-5);
    for (int i = 10; i < 20; i++) CHECK(isnan(py[i]));
    fg_tensor *bad = fg_zeros(FG_F32, 2, sm);
    CHECK_STATUS(ops()->attention_fwd(qkv, 1, false, bad, y, lse), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "key padding mask");
    free(r.y);
    free(r.lse);
    free(r.dqkv);
    fg_step_reset();
    fg_tensor_free(bad);
}

TEST(attention_large_scores_stay_finite) {
    /* scores near +-80 overflow a naive exp in f32; the max shift keeps it finite */
    int64_t sq[] = {1, 9, 6}, sy[] = {1, 9, 2}, sl[] = {1, 1, 9};
    fg_tensor *qkv = randn(FG_F32, 3, sq, 5);
    float *p = fg_tensor_data(qkv);
    for (int i = 0; i < 54; i++) p[i] *= 9.0f;
    fg_tensor *y = fg_empty(FG_F32, 3, sy), *lse = fg_empty(FG_F32, 3, sl);
    CHECK_OK(ops()->attention_fwd(qkv, 1, true, NULL, y, lse));
    att_ref r = ref_attention(qkv, NULL, 1, true, NULL);
    CHECK(max_err(y, r.y) <= 1e-5);
    CHECK(max_err(lse, r.lse) <= 1e-5);
    free(r.y);
    free(r.lse);
    free(r.dqkv);
    fg_step_reset();
}

TEST(attention_errors_name_the_shapes) {
    int64_t sq[] = {2, 4, 12}, sy[] = {2, 4, 4}, sl[] = {2, 2, 4}, sbad[] = {2, 4, 10};
    fg_tensor *qkv = fg_zeros(FG_F32, 3, sq), *y = fg_zeros(FG_F32, 3, sy);
    fg_tensor *lse = fg_zeros(FG_F32, 3, sl);
    CHECK_OK(ops()->attention_fwd(qkv, 2, true, NULL, y, lse));
    CHECK_STATUS(ops()->attention_fwd(qkv, 3, true, NULL, y, lse), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "heads = 3");
    CHECK_STATUS(ops()->attention_fwd(fg_zeros(FG_F32, 3, sbad), 2, true, NULL, y, lse), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "f32[2, 4, 10]");
    CHECK_STATUS(ops()->attention_fwd(qkv, 1, true, NULL, y, lse),
                 FG_EINVAL); /* lse wants (2, 1, 4) */
    CHECK_CONTAINS(fg_last_error(), "expected f32[2, 1, 4]");
    CHECK_STATUS(ops()->attention_bwd(qkv, 2, true, NULL, y, lse, y, y), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "dqkv");
    fg_step_reset();
}

/* Products big enough to go to oneDNN's fp32 matmul (when built with it):
 * every transpose, beta 0 (NaN in c ignored), 1 and 0.5, alpha -2, a strided
 * batch, and the accumulating K < 512, N >= 512 shape kept on OpenBLAS. */
TEST(matmul_large_products_every_path) {
    static const double ab[][2] = {{1, 0}, {-2, 1}, {0.5, 0.5}};
    uint64_t seed = 900;
    for (int t = 0; t < 4; t++)
        for (int k = 0; k < 3; k++)
            check_product(FG_F32, 0, NULL, 192, 160, 144, t & 1, t & 2, true, ab[k][0], ab[k][1],
                          seed += 3);
    int64_t bd[1] = {2};
    check_product(FG_F32, 1, bd, 128, 256, 160, false, true, false, 1, 0, seed += 3);
    check_product(FG_F32, 0, NULL, 64, 256, 640, false, false, true, 1, 1, seed += 3);
    fg_step_reset();
}

/* ---- the engines of single f32 products ---- */

/* Products of every band the calibration measures (and below it), every
 * transpose, overwriting and accumulating. */
static void check_engine_products(uint64_t seed) {
    static const int64_t sizes[][3] = {
        {17, 31, 13}, {64, 64, 64}, {96, 80, 72}, {160, 128, 96}, {192, 160, 144}};
    static const double ab[][2] = {{1, 0}, {1, 1}, {-0.5, 2}};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (int t = 0; t < 4; t++)
            check_product(FG_F32, 0, NULL, sizes[s][0], sizes[s][1], sizes[s][2], t & 1, t & 2,
                          true, ab[(s + t) % 3][0], ab[(s + t) % 3][1], seed += 3);
    check_product(FG_F32, 0, NULL, 256, 256, 256, false, true, true, 1, 0, seed += 3); /* 16M */
    fg_step_reset();
}

/* Two threads stay two whatever the load (FULGUR_ADAPT_THREADS=0), so that
 * the 2-thread paths run on a busy machine too. */
static void set_threads_fixed(int n) {
    setenv("FULGUR_ADAPT_THREADS", "0", 1);
    CHECK_OK(fg_set_num_threads(n));
}

static void set_threads_back(int n) {
    unsetenv("FULGUR_ADAPT_THREADS");
    CHECK_OK(fg_set_num_threads(n));
}

/* The runs with FULGUR_GEMM set (test_matmul_openblas, _onednn) run every
 * other test on that engine; this one and the calibration's set the engine
 * themselves, so they would repeat the default run's sweep exactly. */
static bool engine_forced_by_env(void) {
    const char *e = getenv("FULGUR_GEMM");
    return e && *e;
}

TEST(matmul_every_engine_forced) {
    static const char *const modes[] = {"openblas", "onednn", "auto"};
    if (engine_forced_by_env()) SKIP("FULGUR_GEMM is set: the run without it forces each engine");
    bool dnnl = fg__dnnl_isa() != NULL;
    fg__gemm_forget(); /* measure here, without the user's calibration file */
    for (int th = 1; th <= 2; th++) {
        int prev = fg_get_num_threads();
        set_threads_fixed(th);
        for (int m = 0; m < 3; m++) {
            CHECK_OK(fg__gemm_set_mode(modes[m]));
            char f32[1600];
            printf("threads %d, FULGUR_GEMM=%s: %s\n", th, modes[m],
                   fg__gemm_info(f32, sizeof f32));
            if (m == 1 && !dnnl) {
                int64_t s2[] = {2, 2};
                fg_tensor *x = fg_zeros(FG_F32, 2, s2);
                CHECK_STATUS(ops()->matmul(x, false, x, false, x, 1, 0), FG_EUNSUPPORTED);
                CHECK_CONTAINS(fg_last_error(), "FULGUR_GEMM=onednn");
                continue;
            }
            check_engine_products(2000 + 100 * (uint64_t)m);
        }
        set_threads_back(prev);
    }
    CHECK_OK(fg__gemm_set_mode(NULL));
    CHECK_STATUS(fg__gemm_set_mode("mkl"), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "expected auto, openblas or onednn");
}

/* ---- the calibration file ---- */

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc(1 << 17);
    *len = fread(buf, 1, (1 << 17) - 1, f);
    buf[*len] = 0;
    fclose(f);
    return buf;
}

static void spit(const char *path, const char *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(data, 1, len, f);
    fclose(f);
}

/* The file's body (header, key, entries) with its checksum line appended,
 * as the library writes it: FNV-1a 64 of every byte before "sum ". */
static void spit_summed(const char *path, const char *body) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = body; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    size_t n = strlen(body);
    char *buf = malloc(n + 32);
    memcpy(buf, body, n);
    n += (size_t)snprintf(buf + n, 32, "sum %016llx\n", (unsigned long long)h);
    spit(path, buf, n);
    free(buf);
}

TEST(matmul_calibration_file_round_trips) {
    if (!fg__dnnl_isa()) SKIP("no oneDNN in this build: nothing is calibrated");
    if (engine_forced_by_env()) SKIP("FULGUR_GEMM is set: the run without it calibrates");
    char dir[] = "/tmp/fulgur-gemm-test.XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[128], body_path[128];
    snprintf(path, sizeof path, "%s/gemm.txt", dir);
    snprintf(body_path, sizeof body_path, "%s/crafted.txt", dir);
    CHECK_OK(fg__gemm_set_mode("auto"));
    fg__gemm_forget();
    /* measure a few classes, then save, forget and load them */
    check_product(FG_F32, 0, NULL, 256, 300, 200, false, true, true, 1, 0, 31);
    check_product(FG_F32, 0, NULL, 256, 300, 200, true, false, true, 1, 1, 32);
    check_product(FG_F32, 0, NULL, 64, 64, 64, false, false, true, 1, 0, 33);
    int dn = 0, n = fg__gemm_classes(&dn);
    CHECK(n == 3);
    CHECK_OK(fg__gemm_cache_save(path));
    fg__gemm_forget();
    CHECK(fg__gemm_classes(NULL) == 0);
    CHECK_OK(fg__gemm_cache_load(path));
    int dn2 = 0;
    CHECK(fg__gemm_classes(&dn2) == n && dn2 == dn);
    char f32[1600];
    CHECK_CONTAINS(fg__gemm_info(f32, sizeof f32), ", cached)");
    size_t len = 0;
    char *good = slurp(path, &len);
    CHECK(good && len > 40 && !strncmp(good, "fulgur gemm choices 4\nkey ", 26));
    if (!good) return;

    /* each damaged copy is refused whole and adds nothing */
    char *bad = malloc(len + 64);
    struct {
        const char *what;
        size_t n;
    } cases[4] = {{"truncated", len / 2},
                  {"one byte changed", len},
                  {"checksum line gone", 0},
                  {"garbage", 200}};
    for (int i = 0; i < 4; i++) {
        memcpy(bad, good, len);
        size_t bl = cases[i].n;
        if (i == 1) bad[len / 3] ^= 1;
        if (i == 2) bl = (size_t)(strstr(good, "\nsum ") - good) + 1;
        if (i == 3)
            for (size_t k = 0; k < bl; k++) bad[k] = (char)(k * 131 + 7);
        spit(path, bad, bl);
        fg__gemm_forget();
        CHECK_STATUS(fg__gemm_cache_load(path), FG_EFORMAT);
        CHECK_MSG(fg__gemm_classes(NULL) == 0, "%s: loaded %d classes", cases[i].what,
                  fg__gemm_classes(NULL));
    }
    /* a well-summed file with another key, or a line out of range */
    char *key_end = strchr(strchr(good, '\n') + 1, '\n') + 1, *body = malloc(len + 256);
    size_t head = (size_t)(key_end - good);
    snprintf(body, len + 256, "fulgur gemm choices 4\nkey another cpu\n");
    spit_summed(body_path, body);
    fg__gemm_forget();
    CHECK_STATUS(fg__gemm_cache_load(body_path), FG_EFORMAT);
    CHECK_CONTAINS(fg_last_error(), "another CPU");
    static const char *const lines[] = {"200 1 1 64 64 64 1 1 0 0\n", "1 1 3 64 64 64 1 1 0 0\n",
                                        "1 2 1 64 64 64 nan 1 0 0\n", "1 2 1 64 64 0 1 1 0 0\n",
                                        "1 2 1 64 64 64 1 1 0 0 extra\n"};
    for (size_t i = 0; i < sizeof lines / sizeof *lines; i++) {
        memcpy(body, good, head);
        snprintf(body + head, len + 256 - head, "%s", lines[i]);
        spit_summed(body_path, body);
        fg__gemm_forget();
        CHECK_STATUS(fg__gemm_cache_load(body_path), FG_EFORMAT);
        CHECK_MSG(fg__gemm_classes(NULL) == 0, "line %s", lines[i]);
    }
    /* a crafted file that picks oneDNN on one thread for a 2-thread class:
     * products in that class run so, and still give the reference's numbers */
    memcpy(body, good, head);
    snprintf(body + head, len + 256 - head, "%d 2 3 96 80 72 1 1 1 1\n%d 2 2 96 80 72 1 1 1 1\n",
             1 | 0 << 2 | 1 << 3 | 0 << 4 | 1 << 5, 1 | 1 << 2 | 0 << 3 | 1 << 4 | 1 << 5);
    spit_summed(body_path, body);
    fg__gemm_forget();
    CHECK_OK(fg__gemm_cache_load(body_path));
    CHECK(fg__gemm_classes(&dn) == 2 && dn == 1);
    int prev = fg_get_num_threads();
    set_threads_fixed(2);
    /* M 300, K 200, N 100: 2M-16M, K > N */
    check_product(FG_F32, 0, NULL, 300, 200, 100, false, true, true, 1, 0, 41); /* nt= */
    check_product(FG_F32, 0, NULL, 300, 200, 100, true, false, true, 1, 1, 42); /* tn+= */
    CHECK(fg__gemm_classes(NULL) == 2); /* both ran as the file said, unmeasured */
    set_threads_back(prev);
    fg__gemm_forget();
    CHECK_OK(fg__gemm_set_mode(NULL));
    unlink(path);
    unlink(body_path);
    rmdir(dir);
    free(good);
    free(bad);
    free(body);
    fg_step_reset();
}
