/* Elementwise math that the compiler vectorises, for the CPU kernels.
 *
 * glibc's expf/tanhf are scalar calls here: their vector forms (libmvec)
 * are only declared under -ffast-math, and a loop with a call in it is not
 * vectorised at all. fg__expf is written so that GCC vectorises a loop
 * calling it (under `omp simd`, see FG_SIMD): no libm calls, no float to int
 * conversion (2^n comes from the bits of the rounding sum), only selects,
 * which GCC blends only where it may assume no float operation traps: the
 * vector kernels' files are built with -fno-trapping-math (CMakeLists.txt);
 * elsewhere such a loop stays scalar.
 * Cephes' expf polynomial: within 2 ulp of expf on [-87, 88]. Below -88
 * it flushes to 0 (exp(-inf) = 0), past log(FLT_MAX) it is +inf as expf,
 * in between it stays at exp(88) = 1.65e38; NaN stays NaN.
 *
 * vk_t.h's v_exp_sat is the vector paths' exp (AVX2 and AVX-512, chosen
 * at run time): the same range reduction with a degree-6 polynomial in one
 * Horner chain, four instructions fewer (this one serves the scalar path).
 * No tanh is needed: GELU's tanh is written as a sigmoid (activation.c).
 *
 * FG_EXP / FG_LOG pick the float or double function by the argument's type,
 * so a kernel body written once over T (FG_FLOAT_DISPATCH) uses fg__expf in
 * f32 and libm's exact exp in f64 (the finite-difference tests run in f64). */
#ifndef FULGUR_CPU_VMATH_H
#define FULGUR_CPU_VMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* A loop the compiler must vectorise: the build's -O2 uses GCC's
 * "very cheap" cost model, which leaves most loops with a runtime trip count
 * scalar; `omp simd` (OpenMP is on for every layer) lifts that. */
#define FG_SIMD _Pragma("omp simd")

static inline float fg__expf(float xin) {
    float x = xin < -88.0f ? -88.0f : xin;
    x = x > 88.0f ? 88.0f : x;
    /* n = round(x / ln2) by the 1.5 * 2^23 trick: t's low mantissa bits hold n */
    float t = x * 1.44269504088896341f + 12582912.0f;
    float n = t - 12582912.0f;
    float r = x - n * 0.693359375f; /* ln2 in two parts: n * C1 is exact */
    r = r + n * 2.12194440e-4f;
    float z = r * r;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * z + r + 1.0f;
    uint32_t tb;
    memcpy(&tb, &t, sizeof tb);
    /* 2^n as float bits; n = -127 (x near -88) gives 0, a flush to zero */
    uint32_t eb = (tb - 0x4B400000u + 127u) << 23;
    float s;
    memcpy(&s, &eb, sizeof s);
    return xin > 88.7228394f ? INFINITY : p * s; /* past log(FLT_MAX) */
}

/* P(X <= x) for a standard normal X, exact GELU's cdf: 0.5 (1 + erf(x /
 * sqrt 2)). glibc's erff is a scalar call; this one vectorises. From erfc
 * of z = |x| / sqrt 2 by Numerical Recipes' Chebyshev fit (erfcc: relative
 * error below 1.2e-7 for every z >= 0) on fg__expf, so that the tail
 * (x < 0: 0.5 erfc(z)) keeps its relative accuracy where 1 + erff(x)
 * cancels: measured against the exact cdf, absolute error below 1.9e-7,
 * relative 1.2e-6 for |x| < 3 and 8e-6 at |x| = 9 (exp's argument rounds),
 * where 0.5 (1 + erff(x)) was 1.1e-5 at x = -3 and 0 past x = -7.9. */
static inline float fg__normcdff(float x) {
    float z = fabsf(x) * 0.70710678118654752f;
    float t = 1.0f / (1.0f + 0.5f * z);
    float p = 0.17087277f;
    p = -0.82215223f + t * p;
    p = 1.48851587f + t * p;
    p = -1.13520398f + t * p;
    p = 0.27886807f + t * p;
    p = -0.18628806f + t * p;
    p = 0.09678418f + t * p;
    p = 0.37409196f + t * p;
    p = 1.00002368f + t * p;
    p = -1.26551223f + t * p;
    float h = 0.5f * t * fg__expf(p - z * z); /* P(X > |x|) */
    return x < 0 ? h : 1.0f - h;
}

static inline double fg__normcdf(double x) { return 0.5 * (1.0 + erf(x * 0.70710678118654752440)); }

#define FG_EXP(x) _Generic((x), float : fg__expf, default : exp)(x)
#define FG_NORMCDF(x) _Generic((x), float : fg__normcdff, default : fg__normcdf)(x)
#define FG_LOG(x) _Generic((x), float : logf, default : log)(x)

/* sum_j exp(x[j] - m) over j < n in double, also storing each exp in y[j]
 * when y is not NULL (softmax rows, cross-entropy, log-softmax). In f32 the
 * lanes add in float within blocks of FG_EXPSUM_BLOCK and the blocks in
 * double: GCC leaves the exp loop scalar when its accumulator is double
 * while the data is float. A float lane sums at most 64 values here (4 SSE
 * lanes; 16 with AVX-512): the lane that holds a row's max, 1, drops the
 * exps below 2^-24 of it, and 256 of those lost 3e-6 of a softmax. */
#define FG_EXPSUM_BLOCK 256

static inline double fg__expsum_f32(const float *x, int64_t n, float m, float *y) {
    double total = 0;
    for (int64_t j0 = 0; j0 < n; j0 += FG_EXPSUM_BLOCK) {
        int64_t j1 = n - j0 < FG_EXPSUM_BLOCK ? n : j0 + FG_EXPSUM_BLOCK;
        float s = 0;
        if (y) {
            _Pragma("omp simd reduction(+:s)") for (int64_t j = j0; j < j1; j++) {
                float e = fg__expf(x[j] - m);
                y[j] = e;
                s += e;
            }
        } else {
            _Pragma("omp simd reduction(+:s)") for (int64_t j = j0; j < j1; j++) s +=
                fg__expf(x[j] - m);
        }
        total += s;
    }
    return total;
}

static inline double fg__expsum_f64(const double *x, int64_t n, double m, double *y) {
    double s = 0;
    for (int64_t j = 0; j < n; j++) {
        double e = exp(x[j] - m);
        if (y) y[j] = e;
        s += e;
    }
    return s;
}

#define FG_EXPSUM(x, n, m, y)                                                                      \
    _Generic((x), const float *: fg__expsum_f32, float *: fg__expsum_f32,                          \
             default: fg__expsum_f64)(x, n, m, y)

#endif
