// Elementwise, broadcast and reduction kernels of the CUDA op table, the
// casts and dropout (the Philox of shared.h: the CPU's bits).
#include <math.h>
#include <string.h>

#include "cu_common.cuh"
#include "shared.h"

__device__ __forceinline__ void bc_offsets(const fg__cu_bcast &bc, int64_t i, int64_t *oa,
                                           int64_t *ob) {
    int64_t a = 0, b = 0;
    for (int d = bc.nd - 1; d >= 0; d--) {
        int64_t k = i % bc.shape[d];
        i /= bc.shape[d];
        a += k * bc.sa[d];
        b += k * bc.sb[d];
    }
    *oa = a;
    *ob = b;
}

__global__ void k_binary(int op, int dta, const void *a, int dtb, const void *b, int dty, void *y,
                         int64_t n, fg__cu_bcast bc) {
    FG_CU_LOOP(i, n) {
        int64_t ia, ib;
        bc_offsets(bc, i, &ia, &ib);
        float x = fg_ld(a, dta, ia), z = fg_ld(b, dtb, ib), r;
        switch (op) {
        case 0: r = x + z; break;
        case 1: r = x - z; break;
        case 2: r = x * z; break;
        default: r = x / z; break;
        }
        fg_st(y, dty, i, r);
    }
}

extern "C" int fg__cu_binary(void *st, int op, int dta, const void *a, int dtb, const void *b,
                            int dty, void *y, int64_t n, const fg__cu_bcast *bc) {
    if (n)
        k_binary<<<fg_grid(n), FG_CU_THREADS, 0, (cudaStream_t)st>>>(op, dta, a, dtb, b, dty, y, n,
                                                                     *bc);
    return fg_cu_err();
}

__global__ void k_axpby(int dtx, const void *x, int dty, void *y, int64_t n, float alpha,
                        float beta) {
    FG_CU_LOOP(i, n) {
        float r = alpha * fg_ld(x, dtx, i);
        if (beta != 0.f) r += beta * fg_ld(y, dty, i);
        fg_st(y, dty, i, r);
    }
}

extern "C" int fg__cu_axpby(void *st, int dtx, const void *x, int dty, void *y, int64_t n,
                           float alpha, float beta) {
    if (n)
        k_axpby<<<fg_grid(n), FG_CU_THREADS, 0, (cudaStream_t)st>>>(dtx, x, dty, y, n, alpha, beta);
    return fg_cu_err();
}

__global__ void k_cast(int dts, const void *s, int dtd, void *d, int64_t n) {
    FG_CU_LOOP(i, n) fg_st(d, dtd, i, fg_ld(s, dts, i));
}

extern "C" int fg__cu_cast(void *st, int dts, const void *src, int dtd, void *dst, int64_t n) {
    if (n) k_cast<<<fg_grid(n), FG_CU_THREADS, 0, (cudaStream_t)st>>>(dts, src, dtd, dst, n);
    return fg_cu_err();
}

__global__ void k_round_f32(const float *s, float *d, int64_t n, int dt) {
    FG_CU_LOOP(i, n) {
        d[i] = dt == FG_CU_BF16 ? __bfloat162float(__float2bfloat16_rn(s[i]))
                                : __half2float(__float2half_rn(s[i]));
    }
}

extern "C" int fg__cu_round_f32(void *st, const float *src, float *dst, int64_t n, int dt) {
    if (n) k_round_f32<<<fg_grid(n), FG_CU_THREADS, 0, (cudaStream_t)st>>>(src, dst, n, dt);
    return fg_cu_err();
}

// one thread per output: the inputs that map to it, in increasing order
__global__ void k_sum_to(int dtx, const void *x, int dty, void *y, int64_t ny, fg__cu_bcast bc,
                         float alpha, float beta) {
    // bc.shape: x's shape; bc.sa: y's element strides over it (0: summed);
    // bc.sb: x's contiguous strides
    FG_CU_LOOP(j, ny) {
        // the kept dims' index of output j, then every combination of the
        // summed dims
        int64_t base = 0, rem = j;
        for (int d = bc.nd - 1; d >= 0; d--) {
            if (!bc.sa[d]) continue;
            int64_t k = rem % bc.shape[d];
            rem /= bc.shape[d];
            base += k * bc.sb[d];
        }
        int64_t nsum = 1;
        for (int d = 0; d < bc.nd; d++)
            if (!bc.sa[d]) nsum *= bc.shape[d];
        double acc = 0;
        for (int64_t s = 0; s < nsum; s++) {
            int64_t off = base, r = s;
            for (int d = bc.nd - 1; d >= 0; d--) {
                if (bc.sa[d]) continue;
                int64_t k = r % bc.shape[d];
                r /= bc.shape[d];
                off += k * bc.sb[d];
            }
            acc += fg_ld(x, dtx, off);
        }
        float v = alpha * (float)acc;
        if (beta != 0.f) v += beta * fg_ld(y, dty, j);
        fg_st(y, dty, j, v);
    }
}

extern "C" int fg__cu_sum_to(void *st, int dtx, const void *x, int dty, void *y, int64_t ny,
                            const fg__cu_bcast *bc, float alpha, float beta) {
    if (ny)
        k_sum_to<<<fg_grid(ny), FG_CU_THREADS, 0, (cudaStream_t)st>>>(dtx, x, dty, y, ny, *bc,
                                                                      alpha, beta);
    return fg_cu_err();
}

// pass 1: block b sums the slice [b n / B, (b + 1) n / B) of x, thread t
// the elements t, t + 256, ... of it, then the block's tree
__global__ void k_sum_pass1(int dt, const void *x, int64_t n, int sq, double *part) {
    __shared__ double sh[FG_CU_THREADS];
    int64_t lo = n * blockIdx.x / gridDim.x, hi = n * (blockIdx.x + 1) / gridDim.x;
    double acc = 0;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        double v = fg_ld(x, dt, i);
        acc += sq ? v * v : v;
    }
    double s = fg_block_sum(acc, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}
__global__ void k_sum_pass2(const double *part, int nb, double *out) {
    __shared__ double sh[FG_CU_THREADS];
    double acc = 0;
    for (int i = threadIdx.x; i < nb; i += blockDim.x) acc += part[i];
    double s = fg_block_sum(acc, sh);
    if (threadIdx.x == 0) *out = s;
}

extern "C" int fg__cu_sum_all(void *st, int dt, const void *x, int64_t n, int sq, double *scratch,
                             double *out) {
    cudaStream_t s = (cudaStream_t)st;
    k_sum_pass1<<<FG_CU_RED_BLOCKS, FG_CU_THREADS, 0, s>>>(dt, x, n, sq, scratch);
    k_sum_pass2<<<1, FG_CU_THREADS, 0, s>>>(scratch, FG_CU_RED_BLOCKS, out);
    return fg_cu_err();
}

__global__ void k_sum_dim(int dt, const void *x, void *y, int64_t outer, int64_t n, int64_t inner,
                          float alpha) {
    FG_CU_LOOP(j, outer * inner) {
        int64_t o = j / inner, i = j % inner;
        double acc = 0;
        for (int64_t k = 0; k < n; k++) acc += fg_ld(x, dt, (o * n + k) * inner + i);
        fg_st(y, dt, j, alpha * (float)acc);
    }
}
__global__ void k_sum_dim_bwd(int dt, const void *dy, void *dx, int64_t outer, int64_t n,
                              int64_t inner, float alpha) {
    FG_CU_LOOP(j, outer * n * inner) {
        int64_t o = j / (n * inner), i = j % inner;
        fg_st(dx, dt, j, fg_ld(dx, dt, j) + alpha * fg_ld(dy, dt, o * inner + i));
    }
}

extern "C" int fg__cu_sum_dim(void *st, int dt, const void *x, void *y, int64_t outer, int64_t n,
                             int64_t inner, float alpha) {
    if (outer * inner != 0)
        k_sum_dim<<<fg_grid(outer * inner), FG_CU_THREADS, 0, (cudaStream_t)st>>>(dt, x, y, outer,
                                                                                  n, inner, alpha);
    return fg_cu_err();
}
extern "C" int fg__cu_sum_dim_bwd(void *st, int dt, const void *dy, void *dx, int64_t outer,
                                 int64_t n, int64_t inner, float alpha) {
    int64_t m = outer * n * inner;
    if (m)
        k_sum_dim_bwd<<<fg_grid(m), FG_CU_THREADS, 0, (cudaStream_t)st>>>(dt, dy, dx, outer, n,
                                                                          inner, alpha);
    return fg_cu_err();
}

__global__ void k_bias_add(int dty, void *y, int dtb, const void *bias, int64_t R, int64_t C) {
    FG_CU_LOOP(i, R * C) fg_st(y, dty, i, fg_ld(y, dty, i) + fg_ld(bias, dtb, i % C));
}
__global__ void k_bias_grad(int dty, const void *dy, int dtb, void *db, int64_t R, int64_t C) {
    FG_CU_LOOP(c, C) {
        double acc = 0;
        for (int64_t r = 0; r < R; r++) acc += fg_ld(dy, dty, r * C + c);
        fg_st(db, dtb, c, fg_ld(db, dtb, c) + (float)acc);
    }
}
extern "C" int fg__cu_bias_add(void *st, int dty, void *y, int dtb, const void *bias, int64_t R,
                              int64_t C) {
    if (R * C != 0)
        k_bias_add<<<fg_grid(R * C), FG_CU_THREADS, 0, (cudaStream_t)st>>>(dty, y, dtb, bias, R, C);
    return fg_cu_err();
}
extern "C" int fg__cu_bias_grad(void *st, int dty, const void *dy, int dtb, void *db, int64_t R,
                               int64_t C) {
    if (C) k_bias_grad<<<fg_grid(C), FG_CU_THREADS, 0, (cudaStream_t)st>>>(dty, dy, dtb, db, R, C);
    return fg_cu_err();
}

__global__ void k_act_fwd(int act, int dt, const void *x, void *y, int64_t n) {
    FG_CU_LOOP(i, n) {
        float v = fg_ld(x, dt, i);
        fg_st(y, dt, i, act == 0 ? (v > 0.f ? v : 0.f) : fg__sh_gelu(v));
    }
}
__global__ void k_act_bwd(int act, int dt, const void *x, const void *dy, void *dx, int64_t n) {
    FG_CU_LOOP(i, n) {
        float v = fg_ld(x, dt, i), g = fg_ld(dy, dt, i);
        float d = act == 0 ? (v > 0.f ? g : 0.f) : g * fg__sh_gelu_grad(v);
        fg_st(dx, dt, i, fg_ld(dx, dt, i) + d);
    }
}
extern "C" int fg__cu_act_fwd(void *st, int act, int dt, const void *x, void *y, int64_t n) {
    if (n) k_act_fwd<<<fg_grid(n), FG_CU_THREADS, 0, (cudaStream_t)st>>>(act, dt, x, y, n);
    return fg_cu_err();
}
extern "C" int fg__cu_act_bwd(void *st, int act, int dt, const void *x, const void *dy, void *dx,
                             int64_t n) {
    if (n) k_act_bwd<<<fg_grid(n), FG_CU_THREADS, 0, (cudaStream_t)st>>>(act, dt, x, dy, dx, n);
    return fg_cu_err();
}

// fg_unary_op order (fulgur/ops.h)
enum {
    U_EXP,
    U_LOG,
    U_SQRT,
    U_RSQRT,
    U_POW,
    U_ABS,
    U_CLAMP,
    U_SIGMOID,
    U_TANH,
    U_SILU,
    U_GELU_ERF,
    U_SOFTPLUS,
    U_LEAKY_RELU,
    U_ELU
};

__device__ float un_fwd(int op, float x, float a, float b) {
    switch (op) {
    case U_EXP: return expf(x);
    case U_LOG: return logf(x);
    case U_SQRT: return sqrtf(x);
    case U_RSQRT: return 1.f / sqrtf(x);
    case U_POW: return powf(x, a);
    case U_ABS: return fabsf(x);
    case U_CLAMP: return fminf(fmaxf(x, a), b);
    case U_SIGMOID: return 1.f / (1.f + expf(-x));
    case U_TANH: return tanhf(x);
    case U_SILU: return x / (1.f + expf(-x));
    case U_GELU_ERF: return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
    case U_SOFTPLUS: return a * x > b ? x : log1pf(expf(a * x)) / a;
    case U_LEAKY_RELU: return x > 0.f ? x : a * x;
    default: return x > 0.f ? x : a * expm1f(x);
    }
}
__device__ float un_grad(int op, float x, float y, float a, float b) {
    switch (op) {
    case U_EXP: return y;
    case U_LOG: return 1.f / x;
    case U_SQRT: return 0.5f / y;
    case U_RSQRT: return -0.5f * y * y * y;
    case U_POW: return a * powf(x, a - 1.f);
    case U_ABS: return x > 0.f ? 1.f : x < 0.f ? -1.f : 0.f;
    case U_CLAMP: return x >= a && x <= b ? 1.f : 0.f;
    case U_SIGMOID: return y * (1.f - y);
    case U_TANH: return 1.f - y * y;
    case U_SILU: {
        float s = 1.f / (1.f + expf(-x));
        return s * (1.f + x * (1.f - s));
    }
    case U_GELU_ERF:
        return 0.5f * (1.f + erff(x * 0.70710678118654752f)) +
               x * 0.3989422804014327f * expf(-0.5f * x * x);
    case U_SOFTPLUS: return a * x > b ? 1.f : 1.f / (1.f + expf(-a * x));
    case U_LEAKY_RELU: return x > 0.f ? 1.f : a;
    default: return x > 0.f ? 1.f : a * expf(x);
    }
}
__global__ void k_unary_fwd(int op, int dt, const void *x, void *y, int64_t n, float a, float b) {
    FG_CU_LOOP(i, n) fg_st(y, dt, i, un_fwd(op, fg_ld(x, dt, i), a, b));
}
__global__ void k_unary_bwd(int op, int dt, const void *x, const void *y, const void *dy, void *dx,
                            int64_t n, float a, float b) {
    FG_CU_LOOP(i, n) {
        float xv = fg_ld(x, dt, i), yv = y ? fg_ld(y, dt, i) : 0.f;
        fg_st(dx, dt, i, fg_ld(dx, dt, i) + fg_ld(dy, dt, i) * un_grad(op, xv, yv, a, b));
    }
}
extern "C" int fg__cu_unary_fwd(void *st, int op, int dt, const void *x, void *y, int64_t n, float a,
                               float b) {
    if (n) k_unary_fwd<<<fg_grid(n), FG_CU_THREADS, 0, (cudaStream_t)st>>>(op, dt, x, y, n, a, b);
    return fg_cu_err();
}
extern "C" int fg__cu_unary_bwd(void *st, int op, int dt, const void *x, const void *y,
                               const void *dy, void *dx, int64_t n, float a, float b) {
    if (n)
        k_unary_bwd<<<fg_grid(n), FG_CU_THREADS, 0, (cudaStream_t)st>>>(op, dt, x, y, dy, dx, n, a,
                                                                        b);
    return fg_cu_err();
}

// one thread per Philox block: 4 consecutive draws
__global__ void k_dropout(int dt, const void *x, void *y, int64_t n, uint64_t seed, uint64_t offset,
                          uint32_t thr, int none, float scale, int acc) {
    uint64_t first = offset >> 2, last = (offset + (uint64_t)n - 1) >> 2;
    int64_t nblk = (int64_t)(last - first + 1);
    FG_CU_LOOP(b, nblk) {
        uint32_t u[4];
        uint64_t ctr = first + (uint64_t)b;
        fg__sh_philox(seed, ctr, u);
        for (int k = 0; k < 4; k++) {
            uint64_t d = 4 * ctr + (uint64_t)k;
            if (d < offset || d >= offset + (uint64_t)n) continue;
            int64_t i = (int64_t)(d - offset);
            float v = (!none && u[k] >= thr) ? fg_ld(x, dt, i) * scale : 0.f;
            if (acc) v += fg_ld(y, dt, i);
            fg_st(y, dt, i, v);
        }
    }
}
extern "C" int fg__cu_dropout(void *st, int dt, const void *x, void *y, int64_t n, uint64_t seed,
                             uint64_t offset, uint32_t thr, int none, float scale, int accumulate) {
    if (n) {
        uint64_t nblk = ((offset + (uint64_t)n - 1) >> 2) - (offset >> 2) + 1;
        k_dropout<<<fg_grid((int64_t)nblk), FG_CU_THREADS, 0, (cudaStream_t)st>>>(
            dt, x, y, n, seed, offset, thr, none, scale, accumulate);
    }
    return fg_cu_err();
}

// fg_dev_fill on a GPU: element i of count gets the psize-byte pattern (the
// device backend's fill hook, src/core/device_cuda.c, declares this)
typedef struct fill_pat {
    unsigned char b[16];
} fill_pat;
__global__ void k_fill(unsigned char *dst, fill_pat p, int psize, int64_t count) {
    FG_CU_LOOP(i, count) {
        for (int k = 0; k < psize; k++) dst[i * psize + k] = p.b[k];
    }
}
extern "C" int fg__cu_fill(void *st, void *dst, const void *pattern, int psize, int64_t count) {
    fill_pat p;
    memset(&p, 0, sizeof p);
    memcpy(p.b, pattern, (size_t)psize);
    if (count)
        k_fill<<<fg_grid(count), FG_CU_THREADS, 0, (cudaStream_t)st>>>((unsigned char *)dst, p,
                                                                       psize, count);
    return fg_cu_err();
}
