/* The tensor struct, shared with the layers above inside the library (the
 * public API sees an opaque handle). Invariants:
 *   - data points at element [0,...,0]; strides are in elements;
 *   - numel == product(shape) (1 for 0-d);
 *   - a step tensor's header lives in its thread's arena; a persistent one
 *     was fg_alloc'ed and owns data only with FG_T_OWNS_DATA. */
#ifndef FULGUR_TENSOR_IMPL_H
#define FULGUR_TENSOR_IMPL_H

#include "core/core_impl.h"
#include "fulgur/tensor.h"

enum {
    FG_T_PERSISTENT = 1u << 0,
    FG_T_OWNS_DATA = 1u << 1,
    FG_T_OWNS_GRAD = 1u << 2, /* grad was allocated by autograd and is freed with t */
};

struct fg__node; /* autograd */

struct fg_tensor {
    void *data;
    fg_dtype dtype;
    fg_device device;
    int ndim;
    uint32_t flags;
    int64_t numel;
    int64_t shape[FG_MAX_DIMS];
    int64_t strides[FG_MAX_DIMS];

    /* autograd (owned by the autograd layer; zero for plain tensors) */
    bool requires_grad;
    fg_tensor *grad;          /* persistent for leaves, step for the rest */
    struct fg__node *grad_fn; /* the tape node that made this tensor */
    uint64_t grad_fn_gen;     /* step generation grad_fn belongs to */
    int32_t pending;          /* uses left in the running backward (leaves) */
    int32_t param_index;      /* index given by the module tree, -1 if none */
    const char *name;         /* borrowed; dotted name for parameters */
    /* a step gradient autograd made: the tensor it is the gradient of (its
     * memory is handed back once that tensor's node has run) */
    struct fg_tensor *grad_for;
    uint64_t step_epoch; /* fg__step_zeros_reuse: the step memory's epoch it was made in */

    /* the device holding data (borrowed); NULL for host memory */
    fg_dev *dev;
};

/* Fills shape/strides/numel of a contiguous layout; FG_EINVAL on a bad shape. */
FG_MUST_USE fg_status fg__tensor_init_shape(fg_tensor *t, fg_dtype dt, int ndim,
                                            const int64_t *shape);
/* A step tensor header (no data) copied from t's metadata, autograd fields cleared. */
fg_tensor *fg__tensor_header_like(const fg_tensor *t);

/* Rewinds the calling thread's step arena (fg__arena_mark): step tensors
 * made after the mark are gone after the release. Activation checkpointing
 * drops a block's recomputed activations with it. */
fg__arena_point fg__step_mark(void);
void fg__step_release(fg__arena_point m);
/* Hands the data of step tensor t, made by fg__step_zeros_reuse, back to
 * the step (t's data is NULL after; nothing may read it again): a later
 * fg__step_zeros_reuse of a size it holds gets it, until the step ends or
 * a release. Host tensors made since the last release only (memory past a
 * release's mark is the arena's again); others are left as they are. */
void fg__step_recycle(fg_tensor *t);
/* A step tensor of that shape (zeroed when zero) in memory handed back,
 * else in new step memory (fg_zeros / fg_empty). */
fg_tensor *fg__step_zeros_reuse(fg_dtype dt, int ndim, const int64_t *shape, bool zero);

#define FG_F32P(t) ((float *)(t)->data)
#define FG_F64P(t) ((double *)(t)->data)
#define FG_I32P(t) ((int32_t *)(t)->data)

#endif
