/* The elementwise f32 loops of the fg__vk table (binary ops, axpby, relu,
 * row and constant adds, sums in double), compiled once per ISA beside
 * vk_t.h (vk_avx2.c, vk_avx512.c), so that they run at the width of
 * fg_cpu_isa() like every other kernel (a compiler's target_clones would
 * follow the CPU alone, whatever FULGUR_CPU_ISA says, and could not be
 * tested path by path). Each is the portable loop of its op, element for
 * element: with -ffp-contract=off nothing is fused, so every entry but
 * sum_d gives the scalar path's bits (acc_rows_d adds each column in row
 * order, as the scalar loop); sum_d adds in double lanes, which only
 * reorders the sum. Loops run on one thread: the ops split the work. */
#ifndef FULGUR_CPU_VK_EW_T_H
#define FULGUR_CPU_VK_EW_T_H

static void vk_binary(fg_binary_op op, const float *a, const float *b, float *y, int64_t n) {
    switch (op) {
    case FG_BIN_ADD: FG_SIMD for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i]; break;
    case FG_BIN_SUB: FG_SIMD for (int64_t i = 0; i < n; i++) y[i] = a[i] - b[i]; break;
    case FG_BIN_MUL: FG_SIMD for (int64_t i = 0; i < n; i++) y[i] = a[i] * b[i]; break;
    case FG_BIN_DIV: FG_SIMD for (int64_t i = 0; i < n; i++) y[i] = a[i] / b[i]; break;
    }
}

static void vk_axpby(float al, const float *x, float be, float *y, int64_t n) {
    if (be == 1) {
        FG_SIMD for (int64_t i = 0; i < n; i++) y[i] += al * x[i];
    } else if (be == 0) {
        FG_SIMD for (int64_t i = 0; i < n; i++) y[i] = al * x[i];
    } else {
        FG_SIMD for (int64_t i = 0; i < n; i++) y[i] = al * x[i] + be * y[i];
    }
}

/* x < 0 ? 0 : x lets NaN through, as PyTorch's relu does */
static void vk_relu_fwd(const float *x, float *y, int64_t n) {
    FG_SIMD for (int64_t i = 0; i < n; i++) y[i] = x[i] < 0 ? 0.0f : x[i];
}

static void vk_relu_bwd(const float *x, const float *dy, float *dx, int64_t n) {
    FG_SIMD for (int64_t i = 0; i < n; i++) dx[i] += x[i] > 0 ? dy[i] : 0.0f;
}

static void vk_add_row(float *y, const float *b, int64_t n) {
    FG_SIMD for (int64_t i = 0; i < n; i++) y[i] += b[i];
}

static void vk_add_const(float *y, float v, int64_t n) {
    FG_SIMD for (int64_t i = 0; i < n; i++) y[i] += v;
}

/* acc[j] += x[r ld + j] for the rows r < rows in order, in double: four
 * rows a pass over acc (a vector of floats widened in two halves), so acc
 * is loaded and stored once for four rows; each column still adds its rows
 * one by one, in row order (the bits of the one-row loop). On AVX2, two
 * rows a pass, each half widened straight from memory: the chains of
 * dependent adds are shorter, and the sum of (2048, 256) ran 1.1x faster
 * (four rows that way ran slower than the register form; on AVX-512 two
 * rows ran 0.94x, so it keeps four). */
static void vk_acc_rows_d(double *acc, const float *x, int64_t ld, int64_t rows, int64_t n) {
    int64_t r = 0;
#if VK_W == 8
    for (; r + 2 <= rows; r += 2) {
        const float *x0 = x + r * ld, *x1 = x0 + ld;
        int64_t j = 0;
        for (; j + VK_W <= n; j += VK_W) {
            int64_t h = j + VK_W / 2;
            vd_store(acc + j, vd_add(vd_add(vd_load(acc + j), vd_from(x0 + j)), vd_from(x1 + j)));
            vd_store(acc + h, vd_add(vd_add(vd_load(acc + h), vd_from(x0 + h)), vd_from(x1 + h)));
        }
        for (; j < n; j++) acc[j] = (acc[j] + (double)x0[j]) + (double)x1[j];
    }
#endif
    for (; r + 4 <= rows; r += 4) {
        const float *x0 = x + r * ld, *x1 = x0 + ld, *x2 = x1 + ld, *x3 = x2 + ld;
        int64_t j = 0;
        for (; j + VK_W <= n; j += VK_W) {
            vd lo = vd_load(acc + j), hi = vd_load(acc + j + VK_W / 2);
            vf v0 = v_load(x0 + j), v1 = v_load(x1 + j), v2 = v_load(x2 + j), v3 = v_load(x3 + j);
            lo = vd_add(vd_add(vd_add(vd_add(lo, vd_lo(v0)), vd_lo(v1)), vd_lo(v2)), vd_lo(v3));
            hi = vd_add(vd_add(vd_add(vd_add(hi, vd_hi(v0)), vd_hi(v1)), vd_hi(v2)), vd_hi(v3));
            vd_store(acc + j, lo);
            vd_store(acc + j + VK_W / 2, hi);
        }
        for (; j < n; j++)
            acc[j] = (((acc[j] + (double)x0[j]) + (double)x1[j]) + (double)x2[j]) + (double)x3[j];
    }
    for (; r < rows; r++) {
        const float *x0 = x + r * ld;
        int64_t j = 0;
        for (; j + VK_W <= n; j += VK_W) {
            vf v = v_load(x0 + j);
            vd_store(acc + j, vd_add(vd_load(acc + j), vd_lo(v)));
            vd_store(acc + j + VK_W / 2, vd_add(vd_load(acc + j + VK_W / 2), vd_hi(v)));
        }
        for (; j < n; j++) acc[j] += (double)x0[j];
    }
}

static double vk_sum_d(const float *x, int64_t n) { return dot_d(x, NULL, n); }

#define VK_EW_ENTRIES                                                                              \
    .binary = vk_binary, .axpby = vk_axpby, .relu_fwd = vk_relu_fwd, .relu_bwd = vk_relu_bwd,      \
    .add_row = vk_add_row, .add_const = vk_add_const, .acc_rows_d = vk_acc_rows_d,                 \
    .sum_d = vk_sum_d

#endif
