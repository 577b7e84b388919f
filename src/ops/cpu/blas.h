/* The BLAS calls of the CPU kernels (matmul.c, attention.c), written once
 * over the kernel type T: FG_GEMM(T) is cblas_sgemm for float and
 * cblas_dgemm for double. Callers keep every size and leading dimension
 * valid (ld >= max(1, cols), sizes <= INT_MAX): OpenBLAS reports a bad
 * argument by printing from xerbla, and the library never prints. */
#ifndef FULGUR_CPU_BLAS_H
#define FULGUR_CPU_BLAS_H

#include <cblas.h>
#include <limits.h>

#define FG_GEMM(T) _Generic((T)0, float : cblas_sgemm, double : cblas_dgemm)

/* Below this many multiply-adds per product, a batch of products is split
 * across OpenMP threads (each gemm on one thread: OpenBLAS's OpenMP build
 * runs single-threaded inside a parallel region) rather than handing each
 * product to OpenBLAS's threads, whose fork/join costs more than the work. */
#define FG_GEMM_SMALL (1 << 21)

/* From this many multiply-adds up, an f32 product goes to oneDNN's matmul
 * when the build has it. */
#define FG_GEMM_DNNL_MIN (1 << 22)

#endif
