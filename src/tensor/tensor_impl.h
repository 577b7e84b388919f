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

struct fg_node; /* autograd */

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
    fg_tensor *grad;         /* persistent for leaves, step for the rest */
    struct fg_node *grad_fn; /* the tape node that made this tensor */
    uint64_t grad_fn_gen;    /* step generation grad_fn belongs to */
    int32_t pending;         /* uses left in the running backward (leaves) */
    int32_t param_index;     /* index given by the module tree, -1 if none */
    const char *name;        /* borrowed; dotted name for parameters */

    /* the device holding data (borrowed); NULL for host memory */
    fg_dev *dev;
};

/* Fills shape/strides/numel of a contiguous layout; FG_EINVAL on a bad shape. */
fg_status fg__tensor_init_shape(fg_tensor *t, fg_dtype dt, int ndim, const int64_t *shape);
/* A step tensor header (no data) copied from t's metadata, autograd fields cleared. */
fg_tensor *fg__tensor_header_like(const fg_tensor *t);

/* Rewinds the calling thread's step arena (fg__arena_mark): step tensors
 * made after the mark are gone after the release. Activation checkpointing
 * drops a block's recomputed activations with it. */
fg_arena_mark fg__step_mark(void);
void fg__step_release(fg_arena_mark m);

#define FG_F32P(t) ((float *)(t)->data)
#define FG_F64P(t) ((double *)(t)->data)
#define FG_I32P(t) ((int32_t *)(t)->data)

#endif
