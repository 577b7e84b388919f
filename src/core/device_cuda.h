/* Private entries of the CUDA device backend (device_cuda.c) for the CUDA
 * op table (src/ops/cuda) and the NCCL comm backend: the CUDA stream of a
 * device's fg_stream, and the error text of a CUDA call. Only in builds
 * with FULGUR_HAVE_CUDA. */
#ifndef FULGUR_DEVICE_CUDA_H
#define FULGUR_DEVICE_CUDA_H

#include "fulgur/device.h"

/* Makes d's GPU the calling thread's current device and returns the
 * cudaStream_t (as void *) of its compute (kind 0) or comm (1) stream;
 * NULL with fg_error when d is not an open cuda device of this process or
 * cudaSetDevice fails. */
void *fg__cuda_stream(fg_dev *d, int kind);

/* The GPU index of a cuda device. */
int fg__cuda_index(const fg_dev *d);

/* FG_OK for err == 0 (cudaSuccess); else fg_error(FG_EIO or FG_ENOMEM)
 * "<what>: <cudaGetErrorString>" and the runtime's sticky error cleared
 * where it can be. `err` is a cudaError_t. */
FG_MUST_USE fg_status fg__cuda_check(int err, const char *what);

/* The number of CUDA devices, or an error "no CUDA device:
 * cudaGetDeviceCount: <why>" (FG_EUNSUPPORTED) when there is none. */
FG_MUST_USE fg_status fg__cuda_device_count(int *n);

#endif
