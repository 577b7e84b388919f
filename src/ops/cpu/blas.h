/* The BLAS calls of the CPU kernels (matmul.c, attention.c), written once
 * over the kernel type T: FG_GEMM(T) is cblas_sgemm for float and
 * cblas_dgemm for double; and the choice of engine for f32 products. Callers keep every size and
 * leading dimension valid (ld >= max(1, cols), sizes <= INT_MAX): OpenBLAS reports a bad argument
 * by printing from xerbla, and the library never prints. */
#ifndef FULGUR_CPU_BLAS_H
#define FULGUR_CPU_BLAS_H

#include <cblas.h>
#include <limits.h>

#include "cpu_impl.h"

#define FG_GEMM(T) _Generic((T)0, float : cblas_sgemm, double : cblas_dgemm)

/* Below this many multiply-adds per product, a batch of products is split
 * across OpenMP threads (each gemm on one thread: OpenBLAS's OpenMP build
 * runs single-threaded inside a parallel region) rather than handing each
 * product to OpenBLAS's threads, whose fork/join costs more than the work. */
#define FG_GEMM_SMALL (1 << 21)

/* gemm_pick.c: the engine of a single f32 product (one gemm, the batch
 * folded or 1), chosen per shape class by measurement (FULGUR_GEMM). */
typedef enum { FG_GEMM_OPENBLAS, FG_GEMM_ONEDNN } fg__gemm_engine;
typedef struct {
    fg__gemm_engine engine;
    int threads; /* the threads to run it on: T, or 1 where one thread was faster */
} fg__gemm_choice;

/* The choice for c (M, N) = op(a) op(b) (+= when acc) on T threads; the
 * first product of a class measures it. FG_EINVAL for a FULGUR_GEMM that
 * does not parse, FG_EUNSUPPORTED for FULGUR_GEMM=onednn without oneDNN.
 * Thread-safe. */
FG_MUST_USE fg_status fg__gemm_choose(bool ta, bool tb, bool acc, int64_t M, int64_t N, int64_t K,
                                      int T, fg__gemm_choice *out);
/* matmul_dnnl.c: oneDNN's version, "2.6.3 (hash)"; "none" without it. */
const char *fg__dnnl_version(void);
/* The f32 part of fg_ops_blas_info, into buf. Thread-safe. */
const char *fg__gemm_info(char *buf, size_t cap);
/* For tests, between products: overrides FULGUR_GEMM with "auto",
 * "openblas" or "onednn" (NULL: back to the environment's); reads and
 * writes the calibration file at path (a file that fails a check is
 * FG_EFORMAT and changes nothing); forgets every class measured or loaded
 * and stops using the calibration file of FULGUR_GEMM_CACHE for the rest of
 * the process; counts the classes known (and how many chose oneDNN). */
FG_MUST_USE fg_status fg__gemm_set_mode(const char *mode);
FG_MUST_USE fg_status fg__gemm_cache_load(const char *path);
FG_MUST_USE fg_status fg__gemm_cache_save(const char *path);
void fg__gemm_forget(void);
int fg__gemm_classes(int *onednn);

#endif
