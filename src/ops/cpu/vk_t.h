/* The f32 kernels of the fg__vk table, written once over simd.h's vectors
 * and compiled once per ISA (vk_avx2.c, vk_avx512.c). Each computes what
 * the portable loop of its op computes (activation.c, softmax.c, loss.c,
 * attention.c, layernorm.c, dropout.c: the scalar path), in the same order
 * of operations per element, fusing a multiply-add exactly where it says
 * v_fma (the files are compiled with -ffp-contract=off), which is where
 * GCC fuses the portable loop at an -march with FMA. Sums over a row go
 * lane by lane, in two chains where a chain would wait on add latency, and
 * the lanes are added at the end: the order of the additions differs from
 * the scalar path's, so row results agree with it to rounding only
 * (tests/ops/test_isa.c has the tolerances). The dropout mask is integer
 * arithmetic: the same bits on every path.
 *
 * Every loop runs whole vectors, then one masked vector for the tail. */
#ifndef FULGUR_CPU_VK_T_H
#define FULGUR_CPU_VK_T_H

/* ------------------------------------------------------------------ exp */

/* exp, as the row kernels take it (softmax, log_softmax, cross-entropy,
 * attention: of x - max <= 0; GELU: of -|2u|), in 15 instructions where
 * vmath.h's fg__expf (the scalar path's) takes 19: x clamped to
 * [-88, 88.376] (88.376: the largest x whose n below is 127, so that 2^n
 * stays a normal float; -88 gives n = -127, whose bits are 0: a flush to
 * zero), n = round(x / ln2) by the 1.5 2^23 trick (t's low mantissa bits
 * hold n), r = x - n ln2 in two parts (n C1 is exact), then exp(r) on
 * |r| <= ln2 / 2 by one Horner chain of degree 6, 1 + r + r^2 P(r), P fitted
 * here to exp's relative error (3e-9 in exact arithmetic: the float
 * rounding, about 1 ulp, dominates; fg__expf's Cephes polynomial has
 * degree 7 with two more instructions), and 2^n from t's bits. Past 88.376
 * it saturates at exp(88.376) = 2.4e38; NaN stays NaN (each clamp returns
 * its second operand, x, for a NaN). */
static inline vf v_exp_core(vf x) {
    vf t = v_fma(x, v_set1(1.44269504088896341f), v_set1(12582912.0f));
    vf n = v_sub(t, v_set1(12582912.0f));
    vf r = v_fnma(n, v_set1(0.693359375f), x);
    r = v_fma(n, v_set1(2.12194440e-4f), r);
    vf p = v_set1(1.381461275741458e-3f);
    p = v_fma(p, r, v_set1(8.368710055947304e-3f));
    p = v_fma(p, r, v_set1(4.166838899254799e-2f));
    p = v_fma(p, r, v_set1(1.666652113199234e-1f));
    p = v_fma(p, r, v_set1(4.999999403953552e-1f));
    p = v_fma(p, r, v_set1(1.0f));
    p = v_fma(p, r, v_set1(1.0f));
    vf s = v_as_f(v_u_shl23(v_u_sub(v_as_u(t), v_u_set1(0x4B400000u - 127u))));
    return v_mul(p, s);
}
static inline vf v_exp_sat(vf x) {
    return v_exp_core(v_min(v_set1(88.3762626647949f), v_max(v_set1(-88.0f), x)));
}

/* v_exp_sat of x <= 0 or NaN (x - max of a row that holds x: a NaN where
 * x and the max are the same infinity), without the upper clamp, which
 * returns x there: the same bits, one instruction less an exp */
static inline vf v_exp_le0(vf x) { return v_exp_core(v_max(v_set1(-88.0f), x)); }

/* exp over the whole float range: v_exp_sat, and +inf past log(FLT_MAX)
 * as expf (log_softmax's backward takes exp of a y it is given) */
static inline vf v_exp(vf x) {
    return v_select(v_gt(x, v_set1(88.7228394f)), v_set1(INFINITY), v_exp_sat(x));
}

/* log of s > 0 or NaN (NaN stays NaN; not +inf, not 0): s = 2^e f with f
 * in (sqrt(1/2), sqrt(2)], log s = e ln2 + log(f), log(1 + z) = z - z^2 / 2
 * + z^3 P(z) with Cephes logf's degree 8 polynomial, ln2 in two parts (e
 * C1 is exact). Within 0.83 ulp of log on [1, 300] (every float there,
 * against double). Cross-entropy's rows take it for log(sum of exps) in
 * [1, 256]. */
static inline vf v_log(vf s) {
    vu u = v_as_u(s);
    vf e = v_u_tof(v_u_sub(v_u_shr23(u), v_u_set1(127u)));
    vf f = v_as_f(v_u_or(v_u_and(u, v_u_set1(0x007fffffu)), v_u_set1(0x3f800000u)));
    vmask big = v_gt(f, v_set1(1.41421356f));
    f = v_select(big, v_mul(f, v_set1(0.5f)), f);
    e = v_select(big, v_add(e, v_set1(1.0f)), e);
    vf z = v_sub(f, v_set1(1.0f)), z2 = v_mul(z, z);
    vf p = v_set1(7.0376836292e-2f);
    p = v_fma(p, z, v_set1(-1.1514610310e-1f));
    p = v_fma(p, z, v_set1(1.1676998740e-1f));
    p = v_fma(p, z, v_set1(-1.2420140846e-1f));
    p = v_fma(p, z, v_set1(1.4249322787e-1f));
    p = v_fma(p, z, v_set1(-1.6668057665e-1f));
    p = v_fma(p, z, v_set1(2.0000714765e-1f));
    p = v_fma(p, z, v_set1(-2.4999993993e-1f));
    p = v_fma(p, z, v_set1(3.3333331174e-1f));
    vf y = v_mul(v_mul(p, z), z2);
    y = v_fma(e, v_set1(-2.12194440e-4f), y);
    y = v_fma(v_set1(-0.5f), z2, y);
    vf r = v_fma(e, v_set1(0.693359375f), v_add(z, y));
    return v_add(r, v_mul(s, v_zero())); /* + NaN for a NaN s, + 0 otherwise */
}

/* ------------------------------------------------------------------ gelu */

#define VK_GELU_K0 0.7978845608028654f /* sqrt(2 / pi) */
#define VK_GELU_K1 0.044715f

static inline vf v_clamp30(vf v) { return v_min(v_set1(30.0f), v_max(v_set1(-30.0f), v)); }

/* x sigmoid(2u), 2u = x (A + B x^2), from one exp that cannot overflow:
 * e = exp(-|2u|) in [0, 1], and x sigmoid(2u) = x / (1 + e) where 2u >= 0,
 * x e / (1 + e) where 2u < 0 (one division either way). No clamp: a huge
 * |x| makes 2u infinite and e 0, so y is x or -0; x = -inf gives NaN
 * (-inf 0), as the portable loop's -inf / inf. (A refined reciprocal
 * instead of the division measured slower on Zen 5, as did the portable
 * loop's form with its clamp and its exp of -2u.) */
#define VK_GELU_A (2 * VK_GELU_K0)
#define VK_GELU_B (2 * VK_GELU_K0 * VK_GELU_K1)

static inline vf gelu1(vf v) {
    vf u2 = v_mul(v, v_fma(v_mul(v, v), v_set1(VK_GELU_B), v_set1(VK_GELU_A)));
    vf e = v_exp_sat(v_negabs(u2));
    return v_div(v_mul(v, v_select_neg(u2, e, v_set1(1.0f))), v_add(v_set1(1.0f), e));
}

/* dx + dy gelu'(x) */
static inline vf gelu_grad1(vf v, vf g, vf d) {
    vf c = v_clamp30(v), c2 = v_mul(c, c);
    vf u = v_mul(v_set1(VK_GELU_K0), v_fma(v_mul(v_set1(VK_GELU_K1), c2), c, c));
    vf e = v_exp_sat(v_min(v_set1(80.0f), v_mul(v_set1(-2.0f), u)));
    vf s = v_div(v_set1(1.0f), v_add(v_set1(1.0f), e));
    vf du = v_mul(v_set1(VK_GELU_K0), v_fma(v_set1(3 * VK_GELU_K1), c2, v_set1(1.0f)));
    vf k = v_mul(v_mul(v_mul(v_set1(2.0f), c), v_mul(e, s)), s); /* e s = 1 - s */
    return v_fma(g, v_fma(k, du, s), d);
}

/* gelu1 in two passes over a piece of GELU_PIECE elements in L1: e =
 * exp(-|2u|) for the piece (stored), then x e / (1 + e) or x / (1 + e) by
 * the sign of x (the sign of 2u = x (A + B x^2): A + B x^2 > 0) - the
 * same operations on the same values as gelu1, the same bits. One vector's
 * chain through u, exp and the division is some 75 cycles long, and the
 * core keeps too few vectors in flight to cover it: the exp pass alone
 * runs near the exp's rate, and the second pass is short. 1.08-1.12x on
 * both ISAs at (2048, 256); pieces of 512 and 2048 measured no faster. */
#define GELU_PIECE 256
static inline vf gelu_e(vf v) {
    return v_exp_sat(v_negabs(v_mul(v, v_fma(v_mul(v, v), v_set1(VK_GELU_B), v_set1(VK_GELU_A)))));
}
static inline vf gelu_y(vf v, vf e) {
    return v_div(v_mul(v, v_select_neg(v, e, v_set1(1.0f))), v_add(v_set1(1.0f), e));
}

static void vk_gelu_fwd(const float *x, float *y, int64_t n) {
    float eb[GELU_PIECE];
    int64_t i = 0;
    for (; i + GELU_PIECE <= n; i += GELU_PIECE) {
        const float *xp = x + i;
        float *yp = y + i;
        for (int j = 0; j < GELU_PIECE; j += 2 * VK_W) {
            vf a = gelu_e(v_load(xp + j)), b = gelu_e(v_load(xp + j + VK_W));
            v_store(eb + j, a);
            v_store(eb + j + VK_W, b);
        }
        for (int j = 0; j < GELU_PIECE; j += VK_W)
            v_store(yp + j, gelu_y(v_load(xp + j), v_load(eb + j)));
    }
    for (; i + VK_W <= n; i += VK_W) v_store(y + i, gelu1(v_load(x + i)));
    vmask m = v_first(n - i);
    v_store_n(y + i, m, gelu1(v_load_n(x + i, m)));
}

static void vk_gelu_bwd(const float *x, const float *dy, float *dx, int64_t n) {
    int64_t i = 0;
    for (; i + 2 * VK_W <= n; i += 2 * VK_W) {
        vf a = gelu_grad1(v_load(x + i), v_load(dy + i), v_load(dx + i));
        vf b = gelu_grad1(v_load(x + i + VK_W), v_load(dy + i + VK_W), v_load(dx + i + VK_W));
        v_store(dx + i, a);
        v_store(dx + i + VK_W, b);
    }
    for (; i + VK_W <= n; i += VK_W)
        v_store(dx + i, gelu_grad1(v_load(x + i), v_load(dy + i), v_load(dx + i)));
    vmask m = v_first(n - i);
    v_store_n(dx + i, m, gelu_grad1(v_load_n(x + i, m), v_load_n(dy + i, m), v_load_n(dx + i, m)));
}

/* Exact GELU's cdf: vmath.h's fg__normcdff on vectors (its erfc fit,
 * fused multiply-adds: within its bounds, other last bits). */
static inline vf normcdf1(vf x) {
    vf z = v_mul(v_negabs(x), v_set1(-0.70710678118654752f));
    vf t = v_div(v_set1(1.0f), v_fma(v_set1(0.5f), z, v_set1(1.0f)));
    vf p = v_set1(0.17087277f);
    p = v_fma(t, p, v_set1(-0.82215223f));
    p = v_fma(t, p, v_set1(1.48851587f));
    p = v_fma(t, p, v_set1(-1.13520398f));
    p = v_fma(t, p, v_set1(0.27886807f));
    p = v_fma(t, p, v_set1(-0.18628806f));
    p = v_fma(t, p, v_set1(0.09678418f));
    p = v_fma(t, p, v_set1(0.37409196f));
    p = v_fma(t, p, v_set1(1.00002368f));
    p = v_fma(t, p, v_set1(-1.26551223f));
    vf h = v_mul(v_mul(v_set1(0.5f), t), v_exp_sat(v_fnma(z, z, p))); /* P(X > |x|) */
    return v_select_neg(x, h, v_sub(v_set1(1.0f), h));
}

/* k_unary.c's exact GELU: y = x cdf(x); dx += dy (cdf(x) + x pdf(x)) */
static void vk_gelu_erf_fwd(const float *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + VK_W <= n; i += VK_W) {
        vf v = v_load(x + i);
        v_store(y + i, v_mul(v, normcdf1(v)));
    }
    vmask m = v_first(n - i);
    vf v = v_load_n(x + i, m);
    v_store_n(y + i, m, v_mul(v, normcdf1(v)));
}

static inline vf gelu_erf_grad1(vf v, vf g, vf d) {
    vf pdf = v_mul(v_exp_sat(v_mul(v_set1(-0.5f), v_mul(v, v))), v_set1(0.39894228040143267794f));
    return v_fma(g, v_fma(v, pdf, normcdf1(v)), d);
}

static void vk_gelu_erf_bwd(const float *x, const float *dy, float *dx, int64_t n) {
    int64_t i = 0;
    for (; i + VK_W <= n; i += VK_W)
        v_store(dx + i, gelu_erf_grad1(v_load(x + i), v_load(dy + i), v_load(dx + i)));
    vmask m = v_first(n - i);
    v_store_n(dx + i, m,
              gelu_erf_grad1(v_load_n(x + i, m), v_load_n(dy + i, m), v_load_n(dx + i, m)));
}

/* ------------------------------------------------------------------ rows */

/* The max of x (n >= 1), as softmax.c's ROW_MAX: a NaN is never taken over
 * a number, but a NaN x[0] stays. */
static float row_max(const float *x, int64_t n) {
    vf m0 = v_set1(x[0]), m1 = m0; /* two chains: a max waits for the one before */
    int64_t j = 0;
    for (; j + 2 * VK_W <= n; j += 2 * VK_W) {
        m0 = v_max(v_load(x + j), m0);
        m1 = v_max(v_load(x + j + VK_W), m1);
    }
    for (; j + VK_W <= n; j += VK_W) m0 = v_max(v_load(x + j), m0);
    vmask k = v_first(n - j);
    m0 = v_max(v_load_n_or(x + j, k, m0), m0);
    return v_hmax(v_max(m0, m1));
}

/* sum_j exp(x[j] - m) in double, storing each exp in y[j] when y is not
 * NULL: vmath.h's fg__expsum_f32 (float lanes within blocks of
 * FG_EXPSUM_BLOCK, the blocks added in double; vk_avx*.c include vmath.h). */
static double exp_sum(const float *x, int64_t n, float m, float *y) {
    double total = 0;
    vf bm = v_set1(m);
    for (int64_t j0 = 0; j0 < n; j0 += FG_EXPSUM_BLOCK) {
        int64_t j1 = n - j0 < FG_EXPSUM_BLOCK ? n : j0 + FG_EXPSUM_BLOCK, j = j0;
        vf s = v_zero(), s1 = v_zero(); /* two vectors an iteration, as GELU's */
        for (; j + 2 * VK_W <= j1; j += 2 * VK_W) {
            vf e = v_exp_le0(v_sub(v_load(x + j), bm));
            vf f = v_exp_le0(v_sub(v_load(x + j + VK_W), bm));
            if (y) {
                v_store(y + j, e);
                v_store(y + j + VK_W, f);
            }
            s = v_add(s, e);
            s1 = v_add(s1, f);
        }
        s = v_add(s, s1);
        for (; j + VK_W <= j1; j += VK_W) {
            vf e = v_exp_le0(v_sub(v_load(x + j), bm));
            if (y) v_store(y + j, e);
            s = v_add(s, e);
        }
        if (j < j1) {
            vmask k = v_first(j1 - j);
            vf e = v_keep(k, v_exp_le0(v_sub(v_load_n(x + j, k), bm)));
            if (y) v_store_n(y + j, k, e);
            s = v_add(s, e);
        }
        total += (double)v_hsum(s);
    }
    return total;
}

/* y *= s */
static void scale_row(float *y, int64_t n, float s) {
    vf bs = v_set1(s);
    int64_t j = 0;
    for (; j + VK_W <= n; j += VK_W) v_store(y + j, v_mul(v_load(y + j), bs));
    vmask k = v_first(n - j);
    v_store_n(y + j, k, v_mul(v_load_n(y + j, k), bs));
}

/* sum_j a[j] b[j] (b NULL: sum_j a[j]) in double lanes */
/* s0, s1 += the halves of x z in double (b false: of x) */
static inline void dot_step(vd *s0, vd *s1, vf x, vf z, bool b) {
    if (b) {
        *s0 = vd_fma(vd_lo(x), vd_lo(z), *s0);
        *s1 = vd_fma(vd_hi(x), vd_hi(z), *s1);
    } else {
        *s0 = vd_add(*s0, vd_lo(x));
        *s1 = vd_add(*s1, vd_hi(x));
    }
}

static double dot_d(const float *a, const float *b, int64_t n) {
    vd s0 = vd_zero(), s1 = vd_zero(), s2 = vd_zero(), s3 = vd_zero(); /* four chains */
    vf one = v_set1(1.0f);
    int64_t j = 0;
    for (; j + 2 * VK_W <= n; j += 2 * VK_W) {
        dot_step(&s0, &s1, v_load(a + j), b ? v_load(b + j) : one, b);
        dot_step(&s2, &s3, v_load(a + j + VK_W), b ? v_load(b + j + VK_W) : one, b);
    }
    for (; j + VK_W <= n; j += VK_W) dot_step(&s0, &s1, v_load(a + j), b ? v_load(b + j) : one, b);
    vmask k = v_first(n - j); /* zero past the end: adds nothing */
    dot_step(&s2, &s3, v_load_n(a + j, k), b ? v_load_n(b + j, k) : one, b);
    return vd_hsum(vd_add(vd_add(s0, s1), vd_add(s2, s3)));
}

/* softmax.c's rows (C = n >= 1) */
static void vk_softmax_row(const float *x, float *y, int64_t n) {
    float m = row_max(x, n);
    scale_row(y, n, (float)(1 / exp_sum(x, n, m, y)));
}

static void vk_log_softmax_row(const float *x, float *y, int64_t n) {
    float m = row_max(x, n), ls = (float)log(exp_sum(x, n, m, NULL));
    vf bm = v_set1(m), bl = v_set1(ls);
    int64_t j = 0;
    for (; j + VK_W <= n; j += VK_W) v_store(y + j, v_sub(v_sub(v_load(x + j), bm), bl));
    vmask k = v_first(n - j);
    v_store_n(y + j, k, v_sub(v_sub(v_load_n(x + j, k), bm), bl));
}

/* y = x - m - l on a row of n */
static inline void lsm_write(const float *x, float *y, int64_t n, float m, float l) {
    vf bm = v_set1(m), bl = v_set1(l);
    int64_t j = 0;
    for (; j + VK_W <= n; j += VK_W) v_store(y + j, v_sub(v_sub(v_load(x + j), bm), bl));
    vmask k = v_first(n - j);
    v_store_n(y + j, k, v_sub(v_sub(v_load_n(x + j, k), bm), bl));
}

/* softmax.c's log_softmax over rows <= FG_SM_BLOCK (n <= FG_SM_BLOCK_N):
 * vk_log_softmax_row's steps (the max; the sum of exps and its log; the
 * writes), the same bits, in a pipeline over the rows: row r's sum, row r +
 * LSM_AHEAD's max and row r - LSM_AHEAD's writes in one iteration. A row's
 * steps wait on each other, its max on memory and its writes on the
 * stores; rows apart do not, and the core overlaps one row's exps with the
 * others' loads and stores. At n = 256, 1.1x on AVX-512 over phases on
 * blocks of 8 rows (every row's max, then every row's sum, then the
 * writes), which were 1.03-1.09x over a row at a time; 2 or 8 rows ahead
 * measured the same as 4. */
#define LSM_AHEAD 4
static void vk_log_softmax_rows(const float *x, float *y, int64_t n, int64_t rows) {
    float m[FG_SM_BLOCK];
    double s[FG_SM_BLOCK];
    for (int64_t r = 0; r < rows && r < LSM_AHEAD; r++) m[r] = row_max(x + r * n, n);
    for (int64_t r = 0; r < rows + LSM_AHEAD; r++) {
        if (r + LSM_AHEAD < rows) m[r + LSM_AHEAD] = row_max(x + (r + LSM_AHEAD) * n, n);
        if (r < rows) s[r] = exp_sum(x + r * n, n, m[r], NULL);
        int64_t w = r - LSM_AHEAD;
        if (w >= 0) lsm_write(x + w * n, y + w * n, n, m[w], (float)log(s[w]));
    }
}

/* dx += y (dy - sum(dy y)) */
static void vk_softmax_bwd_row(const float *y, const float *dy, float *dx, int64_t n) {
    vf dot = v_set1((float)dot_d(dy, y, n));
    int64_t j = 0;
    for (; j + VK_W <= n; j += VK_W)
        v_store(dx + j, v_fma(v_load(y + j), v_sub(v_load(dy + j), dot), v_load(dx + j)));
    vmask k = v_first(n - j);
    v_store_n(dx + j, k,
              v_fma(v_load_n(y + j, k), v_sub(v_load_n(dy + j, k), dot), v_load_n(dx + j, k)));
}

/* dx += dy - exp(y) sum(dy) */
static void vk_log_softmax_bwd_row(const float *y, const float *dy, float *dx, int64_t n) {
    vf gs = v_set1((float)dot_d(dy, NULL, n));
    int64_t j = 0;
    for (; j + VK_W <= n; j += VK_W)
        v_store(dx + j, v_add(v_load(dx + j), v_fnma(v_exp(v_load(y + j)), gs, v_load(dy + j))));
    vmask k = v_first(n - j);
    v_store_n(
        dx + j, k,
        v_add(v_load_n(dx + j, k), v_fnma(v_exp(v_load_n(y + j, k)), gs, v_load_n(dy + j, k))));
}

/* loss.c's rows: the row's max m and sum of exp(x - m) (the forward's
 * logsumexp is m + log(s)) */
static void vk_ce_stats_row(const float *x, int64_t n, double *m, double *s) {
    float mf = row_max(x, n);
    *m = mf;
    *s = exp_sum(x, n, mf, NULL);
}

/* loss.c's blocks of short rows (n <= FG_CE_BLOCK_N), VK_W rows at a time.
 * A short row done alone is a chain of dependent steps with little in each
 * (the max, its horizontal reduction, exp, the sum's reduction, log), and
 * its last partial vector costs a whole exp: V = 65 is four vectors and a
 * tail of one. Here each row runs its whole vectors [0, q) as the row
 * kernels do, the partial max and sum vectors of the block's rows are
 * reduced together (v_max_rows, v_add_rows: lane r holds row r), and the
 * tails [q, n) go column by column with a lane a row (v_gather_n), so a
 * tail costs one exp per column for the block. The max is the row's max
 * (exact; a NaN anywhere makes the row NaN either way); the sum adds in
 * another order than the row kernels' (rounding only). On return: m, s
 * (lanes r < rows) the rows' max and sum of exp(x - max). */
/* the max of a row's whole vectors [0, q) in lanes, x[0] where q = 0 */
static inline vf ce_pmax(const float *xr, int64_t q) {
    vf m0 = v_set1(xr[0]), m1 = m0; /* two chains */
    int64_t j = 0;
    for (; j + 2 * VK_W <= q; j += 2 * VK_W) {
        m0 = v_max(v_load(xr + j), m0);
        m1 = v_max(v_load(xr + j + VK_W), m1);
    }
    if (j < q) m0 = v_max(v_load(xr + j), m0);
    return v_max(m0, m1);
}

/* ce_pmax of rows [0, rows) of x into p, zero in p[rows, VK_W) */
static inline void ce_pmax_rows(const float *x, int64_t n, int64_t rows, vf *p) {
    int64_t q = n / VK_W * VK_W;
    for (int64_t r = 0; r < VK_W; r++) p[r] = r < rows ? ce_pmax(x + r * n, q) : v_zero();
}

/* p holds ce_pmax_rows of the block on entry; pn (when xn is not NULL)
 * gets that of the next block's rn rows, xn: their loads and maxes go
 * into the loop of this block's exps, where the core has room for them,
 * instead of into a phase of their own that waits on memory and on the
 * maxes' chains (the same values either way) */
static inline void ce_block(const float *x, int64_t n, int64_t rows, vf *m, vf *s, vf *p,
                            const float *xn, int64_t rn, vf *pn) {
    int64_t q = n / VK_W * VK_W, nt = n - q;
    vmask live = v_first(rows);
    vf tc[VK_W];
    vf bm = v_max_rows(p);
    for (int64_t j = 0; j < nt; j++) {
        tc[j] = v_gather_n(x + q + j, n, live);
        bm = v_max(tc[j], bm);
    }
    float mr[VK_W];
    v_store(mr, bm);
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        vf br = v_set1(mr[r]), s0 = v_zero(), s1 = v_zero();
        int64_t j = 0;
        for (; j + 4 * VK_W <= q; j += 4 * VK_W) { /* four exps in flight */
            vf a = v_exp_le0(v_sub(v_load(xr + j), br));
            vf b = v_exp_le0(v_sub(v_load(xr + j + VK_W), br));
            vf c = v_exp_le0(v_sub(v_load(xr + j + 2 * VK_W), br));
            vf d = v_exp_le0(v_sub(v_load(xr + j + 3 * VK_W), br));
            s0 = v_add(s0, v_add(a, c));
            s1 = v_add(s1, v_add(b, d));
        }
        for (; j + 2 * VK_W <= q; j += 2 * VK_W) {
            vf a = v_exp_le0(v_sub(v_load(xr + j), br));
            vf b = v_exp_le0(v_sub(v_load(xr + j + VK_W), br));
            s0 = v_add(s0, a);
            s1 = v_add(s1, b);
        }
        if (j < q) {
            vf a = v_exp_le0(v_sub(v_load(xr + j), br));
            s0 = v_add(s0, a);
        }
        p[r] = v_add(s0, s1);
        if (xn) pn[r] = r < rn ? ce_pmax(xn + r * n, q) : v_zero();
    }
    for (int64_t r = rows; xn && r < VK_W; r++) pn[r] = r < rn ? ce_pmax(xn + r * n, q) : v_zero();
    vf sum = v_add_rows(p), ts = v_zero();
    for (int64_t j = 0; j < nt; j++) {
        vf a = v_keep(live, v_exp_le0(v_sub(tc[j], bm)));
        ts = v_add(ts, a);
    }
    *m = bm;
    *s = v_add(sum, ts);
}

/* m[r], s[r] = row r's max and sum of exp(x - max), rows <= FG_CE_BLOCK;
 * l[r] (l not NULL) = log(s[r]) by v_log, the block's rows in one vector */
static void vk_ce_stats_rows(const float *x, int64_t n, int64_t rows, double *m, double *s,
                             double *l) {
    vf p[VK_W], pn[VK_W];
    ce_pmax_rows(x, n, rows < VK_W ? rows : VK_W, p);
    for (int64_t r0 = 0; r0 < rows; r0 += VK_W) {
        int64_t k = rows - r0 < VK_W ? rows - r0 : VK_W, r1 = r0 + VK_W;
        int64_t kn = rows - r1 < VK_W ? rows - r1 : VK_W;
        vf bm, bs;
        ce_block(x + r0 * n, n, k, &bm, &bs, p, kn > 0 ? x + r1 * n : NULL, kn, pn);
        for (int64_t r = 0; r < VK_W; r++) p[r] = pn[r];
        float mf[VK_W], sf[VK_W], lf[VK_W];
        v_store(mf, bm);
        v_store(sf, bs);
        if (l) v_store(lf, v_log(bs));
        for (int64_t r = 0; r < k; r++) {
            m[r0 + r] = mf[r];
            s[r0 + r] = sf[r];
            if (l) l[r0 + r] = lf[r];
        }
    }
}

/* dx += scale (exp(x - m) / s - onehot(t)) on the rows whose target is not
 * ignore, the others untouched, from the forward's m and s (one exp an
 * element: no max, no sum). The exps are those of ce_block and exp_sum
 * (v_exp_le0 of x - m <= 0, lane by lane: m is the forward's row max; a
 * stats m under a row's max, from another x, gives meaningless values
 * either way) and dx gets k exp + dx with k =
 * scale / s rounded to float: the bits of recomputing the softmax. Rows of
 * n <= FG_CE_BLOCK_N take their tails [q, n) column by column with a lane
 * a row (VK_W rows at a time), as ce_block; longer rows one masked
 * vector. */
static void vk_ce_bwd_rows(const float *x, float *dx, int64_t n, int64_t rows, const int32_t *t,
                           int64_t ignore, double scale, const double *m, const double *s) {
    int64_t q = n / VK_W * VK_W, nt = n - q;
    bool cols = n <= FG_CE_BLOCK_N;
    for (int64_t r0 = 0; r0 < rows; r0 += VK_W) {
        int64_t k = rows - r0 < VK_W ? rows - r0 : VK_W;
        float kr[VK_W], mr[VK_W];
        for (int64_t r = 0; r < VK_W; r++) {
            bool on = r < k && t[r0 + r] != ignore;
            kr[r] = on ? (float)(scale / s[r0 + r]) : 0.0f;
            mr[r] = on ? (float)m[r0 + r] : 0.0f;
        }
        for (int64_t r = 0; r < k; r++) {
            if (t[r0 + r] == ignore) continue;
            const float *xr = x + (r0 + r) * n;
            float *d = dx + (r0 + r) * n;
            vf bm = v_set1(mr[r]), bk = v_set1(kr[r]);
            int64_t j = 0;
            for (; j + 2 * VK_W <= q; j += 2 * VK_W) {
                vf a = v_exp_le0(v_sub(v_load(xr + j), bm));
                vf b = v_exp_le0(v_sub(v_load(xr + j + VK_W), bm));
                v_store(d + j, v_fma(bk, a, v_load(d + j)));
                v_store(d + j + VK_W, v_fma(bk, b, v_load(d + j + VK_W)));
            }
            if (j < q)
                v_store(d + j, v_fma(bk, v_exp_le0(v_sub(v_load(xr + j), bm)), v_load(d + j)));
            if (!cols && nt) {
                vmask km = v_first(nt);
                v_store_n(
                    d + q, km,
                    v_fma(bk, v_exp_le0(v_sub(v_load_n(xr + q, km), bm)), v_load_n(d + q, km)));
            }
        }
        if (cols && nt) {
            vmask live = v_first(k);
            vf bm = v_load(mr);
            float te[VK_W];
            for (int64_t j = 0; j < nt; j++) {
                v_store(te, v_exp_le0(v_sub(v_gather_n(x + r0 * n + q + j, n, live), bm)));
                for (int64_t r = 0; r < k; r++)
                    if (t[r0 + r] != ignore) {
                        float *dj = dx + (r0 + r) * n + q + j;
                        *dj = fmaf(kr[r], te[r], *dj);
                    }
            }
        }
        for (int64_t r = 0; r < k; r++)
            if (t[r0 + r] != ignore) dx[(r0 + r) * n + t[r0 + r]] -= (float)scale;
    }
}

/* attention.c's score rows: s[0, lds) with keys j < n live, lds a multiple
 * of the vector width (ATT_PAD). s = softmax(s[0, n)) and zero after;
 * returns log sum exp. */
static float vk_att_softmax_row(float *s, int lds, int n) {
    float m = row_max(s, n);
    vf bm = v_set1(m), sum = v_zero();
    for (int j = 0; j < lds; j += VK_W) {
        vf e = v_keep(v_first(n - j), v_exp_sat(v_sub(v_load(s + j), bm)));
        v_store(s + j, e);
        sum = v_add(sum, e);
    }
    float total = v_hsum(sum);
    vf inv = v_set1(1.0f / total);
    for (int j = 0; j < n; j += VK_W) v_store(s + j, v_mul(v_load(s + j), inv));
    return m + logf(total);
}

/* s = exp(s - l) on [0, n), zero after */
static void vk_att_exp_row(float *s, int lds, int n, float l) {
    vf bl = v_set1(l);
    for (int j = 0; j < lds; j += VK_W)
        v_store(s + j, v_keep(v_first(n - j), v_exp_sat(v_sub(v_load(s + j), bl))));
}

/* ------------------------------------------------------------- layernorm */

/* layernorm.c's forward, in three steps a row: the mean, rstd, the
 * output. The row kernel runs them in turn; vk_ln_fwd_rows runs each over
 * a block of rows before the next (the same bits): a row's steps wait on
 * each other (two sums, each ending in a horizontal reduction, then a
 * square root and a division in double), a step's rows do not. */

/* the mean of x (C), summed after shifting by x[0] */
static inline float ln_mean(const float *x, int64_t C) {
    /* four accumulators per sum: the adds of a row wait on each other, and
     * at C = 256 on AVX2 two chains left the row's latency the bound */
    float x0 = x[0];
    vf b0 = v_set1(x0), s0 = v_zero(), s1 = v_zero(), s2 = v_zero(), s3 = v_zero();
    /* half the shifts as x 1 + (-x0), one rounding of the same exact value
     * (the bits of x - x0): they go to the FMA units, the adds to the
     * others, and the adds' units had the more of the row's work */
    vf one = v_set1(1.0f), nb0 = v_set1(-x0);
    int64_t j = 0;
    for (; j + 4 * VK_W <= C; j += 4 * VK_W) {
        s0 = v_add(s0, v_sub(v_load(x + j), b0));
        s1 = v_add(s1, v_sub(v_load(x + j + VK_W), b0));
        s2 = v_add(s2, v_fma(v_load(x + j + 2 * VK_W), one, nb0));
        s3 = v_add(s3, v_fma(v_load(x + j + 3 * VK_W), one, nb0));
    }
    for (; j + VK_W <= C; j += VK_W) s0 = v_add(s0, v_sub(v_load(x + j), b0));
    /* a tail only when there is one: adding the masked +0 changes no bit
     * (the lanes start at +0 and a sum never turns them to -0), and a row of
     * whole vectors saves the masked load */
    if (j < C) {
        vmask k = v_first(C - j);
        s1 = v_add(s1, v_keep(k, v_sub(v_load_n(x + j, k), b0)));
    }
    return x0 + v_hsum(v_add(v_add(s0, s1), v_add(s2, s3))) / (float)C;
}

/* 1 / sqrt(var + eps), var the mean of (x - m)^2 */
static inline float ln_rstd(const float *x, int64_t C, float m, double eps) {
    vf bm = v_set1(m), v0 = v_zero(), v1 = v_zero(), v2 = v_zero(), v3 = v_zero();
    int64_t j = 0;
    for (; j + 4 * VK_W <= C; j += 4 * VK_W) {
        vf d0 = v_sub(v_load(x + j), bm), d1 = v_sub(v_load(x + j + VK_W), bm);
        vf d2 = v_sub(v_load(x + j + 2 * VK_W), bm), d3 = v_sub(v_load(x + j + 3 * VK_W), bm);
        v0 = v_fma(d0, d0, v0);
        v1 = v_fma(d1, d1, v1);
        v2 = v_fma(d2, d2, v2);
        v3 = v_fma(d3, d3, v3);
    }
    for (; j + VK_W <= C; j += VK_W) {
        vf d = v_sub(v_load(x + j), bm);
        v0 = v_fma(d, d, v0);
    }
    if (j < C) { /* as ln_mean's tail: the lanes of squares stay >= +0 */
        vmask k = v_first(C - j);
        vf d = v_keep(k, v_sub(v_load_n(x + j, k), bm));
        v1 = v_fma(d, d, v1);
    }
    v0 = v_add(v_add(v0, v1), v_add(v2, v3));
    return (float)(1 / sqrt((double)v_hsum(v0) / (double)C + eps));
}

/* y = (x - m) r w + b, w and b (C) or NULL */
static inline void ln_out(const float *x, const float *w, const float *b, int64_t C, float m,
                          float r, float *y) {
    vf bm = v_set1(m), br = v_set1(r), one = v_set1(1.0f), zero = v_zero();
    int64_t j = 0;
    if (w && b) /* the common case without the tests of w and b in the loop */
        for (; j + 2 * VK_W <= C; j += 2 * VK_W) {
            vf a = v_fma(v_mul(v_sub(v_load(x + j), bm), br), v_load(w + j), v_load(b + j));
            vf c = v_fma(v_mul(v_sub(v_load(x + j + VK_W), bm), br), v_load(w + j + VK_W),
                         v_load(b + j + VK_W));
            v_store(y + j, a);
            v_store(y + j + VK_W, c);
        }
    for (; j + VK_W <= C; j += VK_W) {
        vf wv = w ? v_load(w + j) : one, bv = b ? v_load(b + j) : zero;
        v_store(y + j, v_fma(v_mul(v_sub(v_load(x + j), bm), br), wv, bv));
    }
    if (j == C) return;
    vmask k = v_first(C - j);
    vf wv = w ? v_load_n(w + j, k) : one, bv = b ? v_load_n(b + j, k) : zero;
    v_store_n(y + j, k, v_fma(v_mul(v_sub(v_load_n(x + j, k), bm), br), wv, bv));
}

/* layernorm.c's forward row: x, y (C), w and b (C) or NULL */
static void vk_ln_fwd_row(const float *x, const float *w, const float *b, int64_t C, double eps,
                          float *y, float *mean, float *rstd) {
    float m = ln_mean(x, C), r = ln_rstd(x, C, m, eps);
    *mean = m;
    *rstd = r;
    ln_out(x, w, b, C, m, r, y);
}

/* the same over rows <= FG_LN_BLOCK rows of C, in steps over the block:
 * every row's mean, then every row's rstd, then the outputs (the block of
 * rows stays in L1 for C <= FG_LN_BLOCK_N) */
static void vk_ln_fwd_rows(const float *x, const float *w, const float *b, int64_t C, double eps,
                           float *y, float *mean, float *rstd, int64_t rows) {
    for (int64_t r = 0; r < rows; r++) mean[r] = ln_mean(x + r * C, C);
    for (int64_t r = 0; r < rows; r++) rstd[r] = ln_rstd(x + r * C, C, mean[r], eps);
    for (int64_t r = 0; r < rows; r++) ln_out(x + r * C, w, b, C, mean[r], rstd[r], y + r * C);
}

/* One vector of layernorm.c's backward row: dx += r (g w - a - xh c) with
 * xh = (x - m) r, and aw += g xh, ab += g when aw is not NULL. */
static inline void ln_bwd_vec(vf x, vf g, vf w, vf bm, vf br, vf a, vf c, float *dx, float *aw,
                              float *ab, vmask k, bool tail) {
    /* g w rounded, as in the sum that made a: a row of C = 1 gives 0 */
    vf xh = v_mul(v_sub(x, bm), br);
    vf e = v_fnma(xh, c, v_sub(v_mul(g, w), a));
    if (tail) {
        v_store_n(dx, k, v_fma(br, e, v_load_n(dx, k)));
        if (aw) {
            v_store_n(aw, k, v_fma(g, xh, v_load_n(aw, k)));
            v_store_n(ab, k, v_add(v_load_n(ab, k), g));
        }
    } else {
        v_store(dx, v_fma(br, e, v_load(dx)));
        if (aw) {
            v_store(aw, v_fma(g, xh, v_load(aw)));
            v_store(ab, v_add(v_load(ab), g));
        }
    }
}

/* layernorm.c's backward row: x, dy (C); w (C), or NULL when dx is NULL
 * (weight gradients only); aw and ab (C) the chunk's dw and db sums, or NULL
 * (no weight gradients). */
static void vk_ln_bwd_row(const float *x, const float *dy, const float *w, float m, float r,
                          int64_t C, float *dx, float *aw, float *ab) {
    vf bm = v_set1(m), br = v_set1(r);
    int64_t j = 0;
    vmask k;
    if (!dx) {
        for (; j + VK_W <= C; j += VK_W) {
            vf g = v_load(dy + j), xh = v_mul(v_sub(v_load(x + j), bm), br);
            v_store(aw + j, v_fma(g, xh, v_load(aw + j)));
            v_store(ab + j, v_add(v_load(ab + j), g));
        }
        k = v_first(C - j);
        vf g = v_load_n(dy + j, k), xh = v_mul(v_sub(v_load_n(x + j, k), bm), br);
        v_store_n(aw + j, k, v_fma(g, xh, v_load_n(aw + j, k)));
        v_store_n(ab + j, k, v_add(v_load_n(ab + j, k), g));
        return;
    }
    vf s1 = v_zero(), s2 = v_zero(), t1 = v_zero(), t2 = v_zero(); /* two chains each */
    for (; j + 2 * VK_W <= C; j += 2 * VK_W) {
        vf g = v_mul(v_load(dy + j), v_load(w + j));
        vf h = v_mul(v_load(dy + j + VK_W), v_load(w + j + VK_W));
        s1 = v_add(s1, g);
        t1 = v_add(t1, h);
        s2 = v_fma(g, v_mul(v_sub(v_load(x + j), bm), br), s2);
        t2 = v_fma(h, v_mul(v_sub(v_load(x + j + VK_W), bm), br), t2);
    }
    for (; j + VK_W <= C; j += VK_W) {
        vf g = v_mul(v_load(dy + j), v_load(w + j));
        s1 = v_add(s1, g);
        s2 = v_fma(g, v_mul(v_sub(v_load(x + j), bm), br), s2);
    }
    k = v_first(C - j);
    vf g = v_mul(v_load_n(dy + j, k), v_load_n(w + j, k)); /* zero past the end */
    s1 = v_add(s1, g);
    s2 = v_fma(g, v_mul(v_sub(v_load_n(x + j, k), bm), br), s2);
    vf a = v_set1(v_hsum(v_add(s1, t1)) / (float)C);
    vf c = v_set1(v_hsum(v_add(s2, t2)) / (float)C);
    for (j = 0; j + VK_W <= C; j += VK_W)
        ln_bwd_vec(v_load(x + j), v_load(dy + j), v_load(w + j), bm, br, a, c, dx + j,
                   aw ? aw + j : NULL, ab ? ab + j : NULL, k, false);
    ln_bwd_vec(v_load_n(x + j, k), v_load_n(dy + j, k), v_load_n(w + j, k), bm, br, a, c, dx + j,
               aw ? aw + j : NULL, ab ? ab + j : NULL, k, true);
}

/* --------------------------------------------------------------- dropout */

#define VK_PHILOX_M0 0xD2511F53u
#define VK_PHILOX_M1 0xCD9E8D57u
#define VK_PHILOX_W0 0x9E3779B9u
#define VK_PHILOX_W1 0xBB67AE85u

#if VK_W == 16
/* 16 blocks ctr0 .. ctr0 + 15 as two groups of 8, a block a 64-bit lane, as
 * the AVX2 one's below (one vpmuludq gives a word pair's hi and lo words;
 * vpternlogd makes the xor of three): two independent chains, since one
 * round waits on the multiply before it, and the dropout kernel's loads and
 * stores left too few of the next batch's rounds in flight to hide that
 * (16 u32 lanes a block word, as before: the same instructions a draw, one
 * chain). */
#define VK_PX 64 /* draws a philox_v call makes */
static inline void philox_v(uint64_t seed, uint64_t ctr0, __m512i o[4]) {
    __m512i c = _mm512_set1_epi64((long long)ctr0);
    __m512i A0 = _mm512_add_epi64(c, _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7));
    __m512i A1 = _mm512_add_epi64(c, _mm512_setr_epi64(8, 9, 10, 11, 12, 13, 14, 15));
    __m512i B0 = _mm512_setzero_si512(), B1 = B0;
    const __m512i m0 = _mm512_set1_epi64(VK_PHILOX_M0), m1 = _mm512_set1_epi64(VK_PHILOX_M1);
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        __m512i K0 = _mm512_set1_epi64(k0), K1 = _mm512_set1_epi64(k1);
        __m512i p0 = _mm512_mul_epu32(A0, m0), q0 = _mm512_mul_epu32(B0, m1);
        __m512i p1 = _mm512_mul_epu32(A1, m0), q1 = _mm512_mul_epu32(B1, m1);
        /* a0 = hi(a2 M1) ^ a1 ^ k0, a1 = lo(a2 M1); a2 = hi(a0 M0) ^ a3 ^ k1, a3 = lo(a0 M0) */
        A0 = _mm512_ternarylogic_epi32(_mm512_shuffle_epi32(q0, 0xB1), _mm512_srli_epi64(A0, 32),
                                       K0, 0x96);
        __m512i nB0 = _mm512_ternarylogic_epi32(_mm512_shuffle_epi32(p0, 0xB1),
                                                _mm512_srli_epi64(B0, 32), K1, 0x96);
        A1 = _mm512_ternarylogic_epi32(_mm512_shuffle_epi32(q1, 0xB1), _mm512_srli_epi64(A1, 32),
                                       K0, 0x96);
        B1 = _mm512_ternarylogic_epi32(_mm512_shuffle_epi32(p1, 0xB1), _mm512_srli_epi64(B1, 32),
                                       K1, 0x96);
        B0 = nB0;
        k0 += VK_PHILOX_W0;
        k1 += VK_PHILOX_W1;
    }
    /* (a0, a1, a2, a3) of blocks 0, 2, 4, 6 (unpacklo: one a 128-bit lane), of 1, 3, 5, 7 */
    const __m512i lo4 = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
    const __m512i hi4 = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    __m512i l0 = _mm512_unpacklo_epi64(A0, B0), h0 = _mm512_unpackhi_epi64(A0, B0);
    __m512i l1 = _mm512_unpacklo_epi64(A1, B1), h1 = _mm512_unpackhi_epi64(A1, B1);
    o[0] = _mm512_permutex2var_epi64(l0, lo4, h0);
    o[1] = _mm512_permutex2var_epi64(l0, hi4, h0);
    o[2] = _mm512_permutex2var_epi64(l1, lo4, h1);
    o[3] = _mm512_permutex2var_epi64(l1, hi4, h1);
}
#else
/* 8 blocks ctr0 .. ctr0 + 7 as two groups of 4, a block a 64-bit lane:
 * A = (a0, a1) and B = (a2, a3) in its low and high words. vpmuludq
 * multiplies the low words and leaves the 64-bit product in the lane, so a
 * round is one multiply per word pair, and the product's words swapped
 * (hi, lo) are the new (a0 ^ ..., a1) before the xors: 2 multiplies per 4
 * blocks and round, where 8 u32 lanes a block word took 3 (the hi words of
 * two vpmuludq and the lo words of a vpmulld); 10% faster on Zen 5. A is the
 * 64-bit counter itself (a0 its low word), so its carry comes free. */
#define VK_PX 32 /* draws a philox_v call makes */
static inline void philox_v(uint64_t seed, uint64_t ctr0, __m256i o[4]) {
    __m256i c = _mm256_set1_epi64x((long long)ctr0);
    __m256i A0 = _mm256_add_epi64(c, _mm256_setr_epi64x(0, 1, 2, 3));
    __m256i A1 = _mm256_add_epi64(c, _mm256_setr_epi64x(4, 5, 6, 7));
    __m256i B0 = _mm256_setzero_si256(), B1 = B0;
    const __m256i m0 = _mm256_set1_epi64x(VK_PHILOX_M0), m1 = _mm256_set1_epi64x(VK_PHILOX_M1);
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        __m256i K0 = _mm256_set1_epi64x(k0), K1 = _mm256_set1_epi64x(k1);
        __m256i p0 = _mm256_mul_epu32(A0, m0), q0 = _mm256_mul_epu32(B0, m1);
        __m256i p1 = _mm256_mul_epu32(A1, m0), q1 = _mm256_mul_epu32(B1, m1);
        /* a0 = hi(a2 M1) ^ a1 ^ k0, a1 = lo(a2 M1); a2 = hi(a0 M0) ^ a3 ^ k1, a3 = lo(a0 M0) */
        __m256i nA0 = _mm256_xor_si256(_mm256_shuffle_epi32(q0, 0xB1), _mm256_srli_epi64(A0, 32));
        __m256i nB0 = _mm256_xor_si256(_mm256_shuffle_epi32(p0, 0xB1), _mm256_srli_epi64(B0, 32));
        __m256i nA1 = _mm256_xor_si256(_mm256_shuffle_epi32(q1, 0xB1), _mm256_srli_epi64(A1, 32));
        __m256i nB1 = _mm256_xor_si256(_mm256_shuffle_epi32(p1, 0xB1), _mm256_srli_epi64(B1, 32));
        A0 = _mm256_xor_si256(nA0, K0);
        B0 = _mm256_xor_si256(nB0, K1);
        A1 = _mm256_xor_si256(nA1, K0);
        B1 = _mm256_xor_si256(nB1, K1);
        k0 += VK_PHILOX_W0;
        k1 += VK_PHILOX_W1;
    }
    /* (a0, a1, a2, a3) of blocks 0 and 2 (unpacklo: one a 128-bit lane), 1 and 3 */
    __m256i l0 = _mm256_unpacklo_epi64(A0, B0), h0 = _mm256_unpackhi_epi64(A0, B0);
    __m256i l1 = _mm256_unpacklo_epi64(A1, B1), h1 = _mm256_unpackhi_epi64(A1, B1);
    o[0] = _mm256_permute2x128_si256(l0, h0, 0x20);
    o[1] = _mm256_permute2x128_si256(l0, h0, 0x31);
    o[2] = _mm256_permute2x128_si256(l1, h1, 0x20);
    o[3] = _mm256_permute2x128_si256(l1, h1, 0x31);
}
#endif

/* One vector of the mask: z = x scale where draw u >= thr, else 0; y = z
 * or y += z */
static inline void drop_vec(const float *x, float *y, vu u, vu bt, vf bs, bool acc) {
    vf z = v_keep_ge(u, bt, v_mul(v_load(x), bs));
    v_store(y, acc ? v_add(v_load(y), z) : z);
}

/* dropout.c's mask on elements [0, n) whose draws are offset .. offset+n-1:
 * y = x keep scale, or y += x keep scale (acc), keep = draw >= thr. A whole
 * batch of VK_PX draws goes from registers to the stores; the batches at
 * the ends (cut by offset or n) go through u[]. */
static void vk_dropout(const float *x, float *y, int64_t n, uint64_t seed, uint64_t offset,
                       uint32_t thr, float scale, bool acc) {
    uint32_t u[VK_PX + VK_W] = {0}; /* a vector from any k < VK_PX stays inside */
    vu bt = v_u_set1(thr);
    vf bs = v_set1(scale);
    uint64_t end = offset + (uint64_t)n;
    /* batches of VK_PX draws from the block holding draw `offset` */
    for (uint64_t d0 = offset & ~(uint64_t)3; d0 < end; d0 += VK_PX) {
        vu o[4];
        philox_v(seed, d0 >> 2, o);
        /* draws d0 + k for k in [k0, k1) are elements d0 + k - offset */
        int64_t k0 = d0 < offset ? (int64_t)(offset - d0) : 0;
        int64_t k1 = end - d0 < VK_PX ? (int64_t)(end - d0) : VK_PX;
        int64_t k = k0, i = (int64_t)(d0 + (uint64_t)k0 - offset);
        if (k0 == 0 && k1 == VK_PX) {
            /* x's lines 16 KiB ahead: without it a stream from beyond the
             * caches (16 MiB at (2048, 1024)) ran at half the speed of one
             * in them, the loads coming only between Philox rounds (past
             * the end: a prefetch does not fault) */
            for (int q = 0; q < 4; q++) __builtin_prefetch(x + i + q * VK_W + 4096, 0, 3);
            for (int q = 0; q < 4; q++)
                drop_vec(x + i + q * VK_W, y + i + q * VK_W, o[q], bt, bs, acc);
            continue;
        }
        for (int q = 0; q < 4; q++) v_u_store(u + q * VK_W, o[q]);
        for (; k + VK_W <= k1; k += VK_W, i += VK_W)
            drop_vec(x + i, y + i, v_u_load(u + k), bt, bs, acc);
        if (k < k1) {
            vmask live = v_first(k1 - k);
            vf z = v_keep_ge(v_u_load(u + k), bt, v_mul(v_load_n(x + i, live), bs));
            v_store_n(y + i, live, acc ? v_add(v_load_n(y + i, live), z) : z);
        }
    }
}

/* ------------------------------------------------------------ primitives */

/* y = exp(x) by v_exp_sat: the exp the row kernels and GELU take, alone
 * (prim.c's fg_ops_cpu_exp, the compute bound of bench/ops_bench) */
static void vk_exp(const float *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 2 * VK_W <= n; i += 2 * VK_W) {
        vf a = v_exp_sat(v_load(x + i)), b = v_exp_sat(v_load(x + i + VK_W));
        v_store(y + i, a);
        v_store(y + i + VK_W, b);
    }
    for (; i + VK_W <= n; i += VK_W) v_store(y + i, v_exp_sat(v_load(x + i)));
    vmask m = v_first(n - i);
    v_store_n(y + i, m, v_exp_sat(v_load_n(x + i, m)));
}

/* The xor of draws offset .. offset + n - 1, made as vk_dropout makes them
 * (prim.c's fg_ops_cpu_philox_xor): whole batches in registers, the ends
 * through u[] and cut to the draws asked for */
static uint32_t vk_philox_xor(uint64_t seed, uint64_t offset, int64_t n) {
    uint32_t u[VK_PX], acc = 0;
    vu ax = v_u_set1(0);
    uint64_t end = offset + (uint64_t)n;
    for (uint64_t d0 = offset & ~(uint64_t)3; d0 < end; d0 += VK_PX) {
        vu o[4];
        philox_v(seed, d0 >> 2, o);
        int64_t k0 = d0 < offset ? (int64_t)(offset - d0) : 0;
        int64_t k1 = end - d0 < VK_PX ? (int64_t)(end - d0) : VK_PX;
        if (k0 == 0 && k1 == VK_PX) {
            ax = v_u_xor(ax, v_u_xor(v_u_xor(o[0], o[1]), v_u_xor(o[2], o[3])));
            continue;
        }
        for (int q = 0; q < 4; q++) v_u_store(u + q * VK_W, o[q]);
        for (int64_t k = k0; k < k1; k++) acc ^= u[k];
    }
    return acc ^ v_u_hxor(ax);
}

/* The table's entries, for `const fg__vk fg__vk_<isa> = {.isa = ..., VK_ENTRIES};` */
#define VK_ENTRIES                                                                                 \
    .gelu_fwd = vk_gelu_fwd, .gelu_bwd = vk_gelu_bwd, .gelu_erf_fwd = vk_gelu_erf_fwd,             \
    .gelu_erf_bwd = vk_gelu_erf_bwd, .softmax_row = vk_softmax_row,                                \
    .softmax_bwd_row = vk_softmax_bwd_row, .log_softmax_row = vk_log_softmax_row,                  \
    .log_softmax_bwd_row = vk_log_softmax_bwd_row, .ce_stats_row = vk_ce_stats_row,                \
    .ce_stats_rows = vk_ce_stats_rows, .log_softmax_rows = vk_log_softmax_rows,                    \
    .ce_bwd_rows = vk_ce_bwd_rows, .att_softmax_row = vk_att_softmax_row,                          \
    .att_exp_row = vk_att_exp_row, .ln_fwd_row = vk_ln_fwd_row, .ln_fwd_rows = vk_ln_fwd_rows,     \
    .ln_bwd_row = vk_ln_bwd_row, .dropout = vk_dropout, .exp = vk_exp, .philox_xor = vk_philox_xor

#endif
