/* fulgur tensors: shape, strides, dtype, device, and storage that may be a
 * view into a larger flat buffer (a parameter or a gradient is a slice of one
 * flat buffer; DDP buckets and FSDP shards rely on this).
 *
 * Lifetimes, in two kinds only (no reference counting):
 *   step tensors  - made by fg_empty/fg_zeros/... and by every op; they live
 *                   in this thread's step arena and die together at
 *                   fg_step_reset() (which the training loop calls once per
 *                   step, through fg_fabric_step_end in the fabric layer).
 *   persistent    - made by fg_tensor_new/fg_tensor_wrap; live until
 *                   fg_tensor_free. Parameters, gradients, optimizer state,
 *                   loader batches.
 * Shapes and strides are in elements (int64_t). Index tensors (token ids,
 * targets) are FG_I32. */
#ifndef FULGUR_TENSOR_H
#define FULGUR_TENSOR_H

#include "fulgur/core.h"
#include "fulgur/device.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FG_MAX_DIMS 8

typedef struct fg_tensor fg_tensor;

/* ------------------------------------------------------------ step tensors */

/* A new contiguous step tensor, uninitialised (fg_empty), zero (fg_zeros),
 * filled with v (fg_full) or copied from `data` (fg_from_data, which reads
 * numel * dtype size bytes). NULL with fg_last_error set on a dtype that
 * is not a real one (FG_DTYPE_DEFAULT included: a tensor's dtype is never
 * implied, FG_EINVAL says to name one), a bad shape (negative dims, more
 * than FG_MAX_DIMS, overflowing size) or out of memory. */
FG_API fg_tensor *fg_empty(fg_dtype dt, int ndim, const int64_t *shape);
FG_API fg_tensor *fg_zeros(fg_dtype dt, int ndim, const int64_t *shape);
FG_API fg_tensor *fg_full(fg_dtype dt, int ndim, const int64_t *shape, double v);
FG_API fg_tensor *fg_from_data(fg_dtype dt, int ndim, const int64_t *shape, const void *data);
FG_API fg_tensor *fg_scalar(fg_dtype dt, double v); /* a 0-d tensor */
/* A step tensor of the same dtype and shape as t, uninitialised / zero. */
FG_API fg_tensor *fg_empty_like(const fg_tensor *t);
FG_API fg_tensor *fg_zeros_like(const fg_tensor *t);

/* Releases every step tensor of the calling thread at once (and the
 * autograd tape recorded on it). Pointers to step tensors are invalid after. */
FG_API void fg_step_reset(void);
/* Frees the calling thread's step arena (and so its step tensors): call it
 * before a worker thread that made step tensors exits. */
FG_API void fg_step_thread_release(void);
/* The calling thread's step device (torch.set_default_device for step
 * tensors): with a device the host cannot touch (guarded, cuda), every
 * step tensor made on this thread from now on (fg_empty, fg_zeros,
 * fg_full, fg_from_data, so every op's output) has its data in that
 * device's step arena, released with the host arena by fg_step_reset;
 * fg_from_data copies its host data in. NULL (or the cpu device): host
 * memory, as before. Changing it releases the thread's step tensors; the
 * device must outlive the setting (set NULL, or fg_step_thread_release,
 * before closing it). FG_ENOMEM when the arena cannot be made. */
FG_API FG_MUST_USE fg_status fg_step_device_set(fg_dev *dev);
FG_API fg_dev *fg_step_device(void);
/* Counts fg_step_reset calls on this thread (layers above use it to drop
 * per-step state). */
FG_API uint64_t fg_step_generation(void);
/* Bytes in use / high-water mark of this thread's step arena. */
FG_API size_t fg_step_bytes(void);
FG_API size_t fg_step_peak_bytes(void);
/* Allocates raw step memory (64-byte aligned) in this thread's arena. */
FG_API void *fg_step_alloc(size_t bytes);

/* ------------------------------------------------------ persistent tensors */

/* A new persistent, contiguous, zeroed tensor owning its memory. NULL on
 * the errors of fg_empty. */
FG_API fg_tensor *fg_tensor_new(fg_dtype dt, int ndim, const int64_t *shape);
/* A persistent tensor header over memory the caller owns (`data`, borrowed
 * for the tensor's life): how parameters view a flat buffer. NULL on the
 * errors of fg_empty, or a NULL data with elements. */
FG_API fg_tensor *fg_tensor_wrap(void *data, fg_dtype dt, int ndim, const int64_t *shape);
/* Frees a persistent tensor (and its gradient if autograd made one).
 * NULL is a no-op; a step tensor is ignored (it dies with its step). */
FG_API void fg_tensor_free(fg_tensor *t);
FG_API bool fg_tensor_is_persistent(const fg_tensor *t);

/* ---------------------------------------------------------- on a device */

/* Tensors in a device's memory (device.h). Their data pointer is an address
 * on the device: only the device's copy calls and kernels may read or write
 * it (on the guarded device a host access faults). Free them with
 * fg_tensor_free before the device closes. A `dev` of NULL is the host, as
 * fg_tensor_new and fg_tensor_wrap. */

/* A new persistent, contiguous, zeroed tensor on `dev`. NULL on the errors
 * of fg_empty or the device's out-of-memory. */
FG_API fg_tensor *fg_tensor_new_on(fg_dev *dev, fg_dtype dt, int ndim, const int64_t *shape);
/* A persistent tensor header over memory of `dev` the caller owns (from
 * fg_dev_alloc: a flat buffer's slice), as fg_tensor_wrap. */
FG_API fg_tensor *fg_tensor_wrap_on(fg_dev *dev, void *data, fg_dtype dt, int ndim,
                                    const int64_t *shape);
/* A new persistent, contiguous copy of t on `dev` (NULL: the host), with
 * t's dtype, shape and bytes, whatever device t is on (a copy even when it
 * is the same device). t may be strided on the host; on a device it must be
 * contiguous (FG_EUNSUPPORTED otherwise, until the device's kernels copy
 * strided views). */
FG_API fg_tensor *fg_tensor_to(const fg_tensor *t, fg_dev *dev);
/* The device holding t's memory: NULL for host memory (every tensor not
 * made on a device). */
FG_API fg_dev *fg_tensor_dev(const fg_tensor *t);

/* -------------------------------------------------------------- accessors */

FG_API fg_dtype fg_tensor_dtype(const fg_tensor *t);
FG_API fg_device fg_tensor_device(const fg_tensor *t);
FG_API int fg_tensor_ndim(const fg_tensor *t);
/* Size of dimension `dim` (negative counts from the end); -1 if out of range. */
FG_API int64_t fg_tensor_dim(const fg_tensor *t, int dim);
FG_API const int64_t *fg_tensor_shape(const fg_tensor *t);
FG_API const int64_t *fg_tensor_strides(const fg_tensor *t);
FG_API int64_t fg_tensor_numel(const fg_tensor *t);
FG_API size_t fg_tensor_nbytes(const fg_tensor *t); /* numel * dtype size */
/* Pointer to the first element (the view's offset already applied). */
FG_API void *fg_tensor_data(const fg_tensor *t);
FG_API bool fg_tensor_is_contiguous(const fg_tensor *t);
/* The value of a one-element tensor, converted to double (NaN if not one
 * element). On a device, the element is copied to the host (synchronizing,
 * as PyTorch's .item()). */
FG_API double fg_item(const fg_tensor *t);
/* Element at flat (row-major logical) index i, converted to double (on a
 * device, copied to the host). */
FG_API double fg_tensor_get(const fg_tensor *t, int64_t i);
FG_API bool fg_tensor_same_shape(const fg_tensor *a, const fg_tensor *b);
/* Writes "f32[4, 128, 256]" into buf; returns buf. */
FG_API const char *fg_tensor_describe(const fg_tensor *t, char *buf, size_t n);

/* ---------------------------------------------------------------- views */

/* Views share memory with t and are step tensors (their header lives in the
 * step arena). fg_tensor_reshape_view needs a contiguous t; one dim may be -1. */
FG_API fg_tensor *fg_tensor_reshape_view(const fg_tensor *t, int ndim, const int64_t *shape);
FG_API fg_tensor *fg_tensor_transpose_view(const fg_tensor *t, int d0, int d1);
/* Elements [start, start+len) of dimension dim. */
FG_API fg_tensor *fg_tensor_narrow_view(const fg_tensor *t, int dim, int64_t start, int64_t len);

/* A contiguous step copy of t (t itself if already contiguous). */
FG_API fg_tensor *fg_tensor_contiguous(const fg_tensor *t);
/* Copies src into dst elementwise (same numel; any strides; converts dtype).
 * Where either is in a device's memory, both must be contiguous and of one
 * dtype, and the copy goes through the devices' copy calls
 * (FG_EUNSUPPORTED otherwise). */
FG_API FG_MUST_USE fg_status fg_tensor_copy(fg_tensor *dst, const fg_tensor *src);
FG_API FG_MUST_USE fg_status fg_tensor_fill(fg_tensor *t, double v);

#ifdef __cplusplus
}
#endif
#endif
