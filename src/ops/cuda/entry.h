/* The checks every CUDA table entry begins with (table.c, cnn.c): the
 * dtype's kernel code, the compute stream of a tensor's device, shapes,
 * contiguity, and a launch's error as a status. */
#ifndef FULGUR_CUDA_ENTRY_H
#define FULGUR_CUDA_ENTRY_H

#include "core/device_cuda.h"
#include "launch.h"
#include "tensor/tensor_impl.h"

static inline FG_MUST_USE fg_status cu_dt(const char *k, const fg_tensor *t, int *dt) {
    *dt = FG_CU_F32; /* set on every path: the compiler cannot see fg_error's status */
    switch (t->dtype) {
    case FG_F32: *dt = FG_CU_F32; return FG_OK;
    case FG_BF16: *dt = FG_CU_BF16; return FG_OK;
    case FG_F16: *dt = FG_CU_F16; return FG_OK;
    default:
        return fg_error(FG_EUNSUPPORTED, "%s: dtype %s not supported on cuda (f32, bf16, f16)", k,
                        fg_dtype_name(t->dtype));
    }
}

/* the compute stream of t's device (and the GPU current) */
static inline FG_MUST_USE fg_status stream_of(const char *k, const fg_tensor *t, void **st) {
    *st = NULL;
    if (t->device != FG_CUDA || !t->dev)
        return fg_error(FG_EINVAL, "%s: a tensor in %s memory given to the cuda kernels", k,
                        fg_device_kind_name(t->device));
    *st = fg__cuda_stream(t->dev, 0);
    return *st ? FG_OK : fg_error_wrap(fg_last_status(), "%s", k);
}

static inline FG_MUST_USE fg_status same(const char *k, const fg_tensor *a, const fg_tensor *b) {
    if (!fg_tensor_same_shape(a, b) || a->dtype != b->dtype) {
        char x[96], y[96];
        return fg_error(FG_EINVAL, "%s: %s and %s must have the same shape and dtype", k,
                        fg_tensor_describe(a, x, sizeof x), fg_tensor_describe(b, y, sizeof y));
    }
    if (a->dev != b->dev) return fg_error(FG_EINVAL, "%s: the tensors are on different devices", k);
    return FG_OK;
}

static inline FG_MUST_USE fg_status contig(const char *k, const fg_tensor *t) {
    if (fg_tensor_is_contiguous(t)) return FG_OK;
    return fg_error(FG_EINVAL, "%s: expects a contiguous tensor", k);
}

static inline FG_MUST_USE fg_status launched(const char *k, int err) {
    return err ? fg__cuda_check(err, k) : FG_OK;
}

#endif
