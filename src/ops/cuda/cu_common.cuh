// Helpers of the CUDA kernels: element loads and stores in the three
// dtypes (computing in f32), grid sizes, block reductions in a fixed order.
#ifndef FULGUR_CU_COMMON_CUH
#define FULGUR_CU_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "launch.h"

#define FG_CU_THREADS 256

__device__ __forceinline__ float fg_ld(const void *p, int dt, int64_t i) {
    if (dt == FG_CU_BF16) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    if (dt == FG_CU_F16) return __half2float(((const __half *)p)[i]);
    return ((const float *)p)[i];
}
__device__ __forceinline__ void fg_st(void *p, int dt, int64_t i, float v) {
    if (dt == FG_CU_BF16) ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else if (dt == FG_CU_F16) ((__half *)p)[i] = __float2half_rn(v);
    else ((float *)p)[i] = v;
}

static inline unsigned fg_grid(int64_t n) {
    int64_t b = (n + FG_CU_THREADS - 1) / FG_CU_THREADS;
    if (b < 1) b = 1;
    if (b > 65535 * 8) b = 65535 * 8; // kernels loop over the rest (grid-stride)
    return (unsigned)b;
}
#define FG_CU_LOOP(i, n)                                                                           \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                      \
         i += (int64_t)gridDim.x * blockDim.x)

static inline int fg_cu_err(void) { return (int)cudaGetLastError(); }

// Sum over the block's threads, tree order fixed by the block size
// (FG_CU_THREADS); every thread gets the result.
template <typename T> __device__ T fg_block_sum(T v, T *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    T r = sh[0];
    __syncthreads();
    return r;
}
template <typename T> __device__ T fg_block_max(T v, T *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] = max(sh[threadIdx.x], sh[threadIdx.x + s]);
        __syncthreads();
    }
    T r = sh[0];
    __syncthreads();
    return r;
}

#endif
