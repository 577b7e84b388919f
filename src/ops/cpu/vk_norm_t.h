/* The row loops of batch normalisation (k_norm.c): per (image, channel)
 * row of S elements, the sums of the statistics and of the backward in
 * NACC chains of double (element k into chain k mod NACC, the chains kept
 * by the caller across rows) and the two elementwise passes. One source,
 * instantiated by NORM_ROWS(T, SUF): k_norm.c for float and double at the
 * build's baseline (the scalar path, and f64), vk_avx2.c and vk_avx512.c
 * for float at their ISA (the fg__vk entries bn_*), where the compiler
 * vectorises the chains (NACC doubles: one AVX-512 register, two AVX2
 * ones) and the passes. With -ffp-contract=off on all three files nothing
 * is fused, and every instantiation does each element's operations in the
 * same order: the same bits on every path. */
#ifndef FULGUR_CPU_VK_NORM_T_H
#define FULGUR_CPU_VK_NORM_T_H

#include <string.h>

#define NACC 8

/* s[j] += x[k] over the row's k = j mod NACC; with m: s[j] += (x[k] - m)^2;
 * with g: s[j] += g[k], t[j] += g[k] (x[k] - m) (the chains in locals:
 * through s they went by memory each element); y = x a + o; dx = (or +=)
 * k1 (g - mg - (x - m) is mgx) */
#define NORM_ROWS(T, SUF)                                                                          \
    static void bn_row_sum_##SUF(const T *x, int64_t n, double *s) {                               \
        double a[NACC];                                                                            \
        memcpy(a, s, sizeof a);                                                                    \
        int64_t k = 0;                                                                             \
        for (; k + NACC <= n; k += NACC)                                                           \
            for (int j = 0; j < NACC; j++) a[j] += (double)x[k + j];                               \
        for (int j = 0; k < n; k++, j++) a[j] += (double)x[k];                                     \
        memcpy(s, a, sizeof a);                                                                    \
    }                                                                                              \
    static void bn_row_sq_##SUF(const T *x, int64_t n, double m, double *s) {                      \
        double a[NACC];                                                                            \
        memcpy(a, s, sizeof a);                                                                    \
        int64_t k = 0;                                                                             \
        for (; k + NACC <= n; k += NACC)                                                           \
            for (int j = 0; j < NACC; j++) {                                                       \
                double d = (double)x[k + j] - m;                                                   \
                a[j] += d * d;                                                                     \
            }                                                                                      \
        for (int j = 0; k < n; k++, j++) {                                                         \
            double d = (double)x[k] - m;                                                           \
            a[j] += d * d;                                                                         \
        }                                                                                          \
        memcpy(s, a, sizeof a);                                                                    \
    }                                                                                              \
    static void bn_row_gsum_##SUF(const T *x, const T *g, int64_t n, double m, double *s,          \
                                  double *t) {                                                     \
        double a[NACC], b[NACC];                                                                   \
        memcpy(a, s, sizeof a);                                                                    \
        memcpy(b, t, sizeof b);                                                                    \
        int64_t k = 0;                                                                             \
        for (; k + NACC <= n; k += NACC)                                                           \
            for (int j = 0; j < NACC; j++) {                                                       \
                a[j] += (double)g[k + j];                                                          \
                b[j] += (double)g[k + j] * ((double)x[k + j] - m);                                 \
            }                                                                                      \
        for (int j = 0; k < n; k++, j++) {                                                         \
            a[j] += (double)g[k];                                                                  \
            b[j] += (double)g[k] * ((double)x[k] - m);                                             \
        }                                                                                          \
        memcpy(s, a, sizeof a);                                                                    \
        memcpy(t, b, sizeof b);                                                                    \
    }                                                                                              \
    static void bn_fwd_row_##SUF(const T *x, T *y, int64_t n, T a, T o) {                          \
        FG_PRAGMA(omp simd)                                                                        \
        for (int64_t k = 0; k < n; k++) y[k] = x[k] * a + o;                                       \
    }                                                                                              \
    static void bn_bwd_row_##SUF(const T *x, const T *g, T *dx, int64_t n, const double *c,        \
                                 bool overwrite) {                                                 \
        double k1 = c[0], mg = c[1], m = c[2], is = c[3], mgx = c[4];                              \
        if (overwrite) {                                                                           \
            FG_PRAGMA(omp simd)                                                                    \
            for (int64_t k = 0; k < n; k++)                                                        \
                dx[k] = (T)(k1 * ((double)g[k] - mg - ((double)x[k] - m) * is * mgx));             \
        } else {                                                                                   \
            FG_PRAGMA(omp simd)                                                                    \
            for (int64_t k = 0; k < n; k++)                                                        \
                dx[k] += (T)(k1 * ((double)g[k] - mg - ((double)x[k] - m) * is * mgx));            \
        }                                                                                          \
    }

#define VK_NORM_ENTRIES                                                                            \
    .bn_row_sum = bn_row_sum_f32, .bn_row_sq = bn_row_sq_f32, .bn_row_gsum = bn_row_gsum_f32,      \
    .bn_fwd_row = bn_fwd_row_f32, .bn_bwd_row = bn_bwd_row_f32

#endif
