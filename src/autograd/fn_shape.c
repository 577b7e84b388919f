/* reshape and transpose.
 *
 * reshape returns a view of a contiguous input (no copy; a non-contiguous
 * one is copied first) and is recorded like any op, so gradients flow
 * through it: the gradient has the same elements in the same order, so the
 * backward is one flat add into the input's gradient.
 *
 * transpose returns a contiguous copy (the kernels read contiguous
 * tensors); its backward copies the gradient transposed back, then adds.
 *
 * Neither computes on values, so any dtype goes through (an i32 target
 * tensor can be reshaped); only float tensors ever require grad. */
#include "autograd_impl.h"

static FG_MUST_USE fg_status check_input(const char *fn, const fg_tensor *a) {
    /* wrap, not format: the earlier message lives in the buffer fg_error writes */
    if (!a) return fg_error_wrap(FG_EINVAL, "%s: NULL input (an earlier call failed)", fn);
    return FG_OK;
}

static FG_MUST_USE fg_status reshape_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *ga = fg__grad_of(n->in[0]);
    if (!ga) return FG_ENOMEM;
    return fg__ops(g)->axpby(1.0, g, 1.0, ga); /* same numel, both contiguous */
}

fg_tensor *fg_reshape(fg_tensor *a, int ndim, const int64_t *shape) {
    if (check_input("reshape", a)) return NULL;
    if (ndim > 0 && !shape) {
        fg_error(FG_EINVAL, "reshape: NULL shape for %d dims", ndim);
        return NULL;
    }
    fg_tensor *ac = fg_tensor_contiguous(a);
    fg_tensor *y = ac ? fg_tensor_reshape_view(ac, ndim, shape) : NULL;
    if (!y) return NULL;
    fg__node *node;
    if (fg__record(&node, "reshape", reshape_bw, y, 1, &a)) return NULL;
    return y;
}

/* i[0], i[1] = the swapped dims */
static FG_MUST_USE fg_status transpose_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *ga = fg__grad_of(n->in[0]);
    if (!ga) return FG_ENOMEM;
    fg_tensor *gt = fg_tensor_transpose_view(g, (int)n->i[0], (int)n->i[1]); /* a's shape */
    fg_tensor *tmp = gt ? fg_empty_like(ga) : NULL;
    if (!tmp) return FG_ENOMEM;
    FG_TRY(fg_tensor_copy(tmp, gt));
    return fg__ops(g)->axpby(1.0, tmp, 1.0, ga);
}

fg_tensor *fg_transpose(fg_tensor *a, int d0, int d1) {
    if (check_input("transpose", a)) return NULL;
    int nd = a->ndim, e0 = d0 < 0 ? d0 + nd : d0, e1 = d1 < 0 ? d1 + nd : d1;
    if (e0 < 0 || e0 >= nd || e1 < 0 || e1 >= nd) {
        char s[96];
        fg_error(FG_EINVAL, "transpose: dims %d and %d: out of range for %s", d0, d1,
                 fg_tensor_describe(a, s, sizeof s));
        return NULL;
    }
    fg_tensor *v = fg_tensor_transpose_view(a, e0, e1);
    fg_tensor *y = v ? fg_empty(a->dtype, v->ndim, v->shape) : NULL;
    if (!y || fg_tensor_copy(y, v)) return NULL;
    fg__node *node;
    if (fg__record(&node, "transpose", transpose_bw, y, 1, &a)) return NULL;
    if (node) {
        node->i[0] = e0;
        node->i[1] = e1;
    }
    return y;
}
