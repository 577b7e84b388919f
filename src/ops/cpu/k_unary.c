/* The elementwise functions of one tensor (fg_unary_op: exp, log, sqrt,
 * rsqrt, pow, abs, clamp, sigmoid, tanh, SiLU, exact GELU, softplus, leaky
 * ReLU, ELU), forward and backward, f32 and f64, over contiguous tensors of
 * one shape. The formulas and the edge cases (the derivative at a kink,
 * NaN) are PyTorch's CPU kernels'; the loops are in k_unary_t.h. The
 * backward accumulates into dx. */
#include "vmath.h" /* before tgmath.h: its functions are plain C */

#include <tgmath.h>

#include "k_ops.h"

#define T float
#define SUF f32
#include "k_unary_t.h"
#undef T
#undef SUF
#define T double
#define SUF f64
#include "k_unary_t.h"
#undef T
#undef SUF

static bool reads_output(fg_unary_op op) {
    return op == FG_UN_EXP || op == FG_UN_SQRT || op == FG_UN_RSQRT || op == FG_UN_SIGMOID ||
           op == FG_UN_TANH;
}

static FG_MUST_USE fg_status check_op(const char *kernel, fg_unary_op op) {
    if ((int)op < (int)FG_UN_EXP || (int)op > (int)FG_UN_ELU)
        return fg_error(FG_EINVAL, "%s: op %d is not an fg_unary_op", kernel, (int)op);
    return FG_OK;
}

/* f32 exact GELU on the ISA's vector kernels (out = y, or dx with dy);
 * *done false where the table has none (the scalar path): the caller runs
 * k_unary_t.h's loop */
static FG_MUST_USE fg_status gelu_erf_vector(const fg_tensor *x, const fg_tensor *dy,
                                             fg_tensor *out, bool *done) {
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    bool bwd = dy != NULL;
    if (!(*done = bwd ? vk->gelu_erf_bwd != NULL : vk->gelu_erf_fwd != NULL)) return FG_OK;
    const float *px = x->data, *pg = bwd ? dy->data : NULL;
    float *po = out->data;
    int64_t n = x->numel;
    FG_PRAGMA(omp parallel for if (n > FG_PAR_MIN) schedule(static))
    for (int64_t i = 0; i < n; i += FG_VK_PIECE) {
        int64_t k = FG_MIN(FG_VK_PIECE, n - i);
        if (bwd) vk->gelu_erf_bwd(px + i, pg + i, po + i, k);
        else vk->gelu_erf_fwd(px + i, po + i, k);
    }
    return FG_OK;
}

static FG_MUST_USE fg_status check_pair(const char *kernel, const fg_tensor *x,
                                        const fg_tensor *y) {
    FG_TRY(fg__expect_same_shape(kernel, x, y));
    FG_TRY(fg__expect_contiguous(kernel, x));
    return fg__expect_contiguous(kernel, y);
}

fg_status fg__cpu_unary_fwd(fg_unary_op op, const fg_tensor *x, double a, double b, fg_tensor *y) {
    FG_TRY(check_op("unary_fwd", op));
    FG_TRY(check_pair("unary_fwd", x, y));
    bool done = false;
    if (x->dtype == FG_F32 && op == FG_UN_GELU_ERF) FG_TRY(gelu_erf_vector(x, NULL, y, &done));
    if (done) return FG_OK;
    if (x->dtype == FG_F32) {
        un_fwd_f32(op, x->data, (float)a, (float)b, y->data, x->numel);
    } else if (x->dtype == FG_F64) {
        un_fwd_f64(op, x->data, a, b, y->data, x->numel);
    } else {
        return fg_error(FG_EUNSUPPORTED, "unary_fwd: dtype %s not supported on cpu",
                        fg_dtype_name(x->dtype));
    }
    return FG_OK;
}

fg_status fg__cpu_unary_bwd(fg_unary_op op, const fg_tensor *x, const fg_tensor *y,
                            const fg_tensor *dy, double a, double b, fg_tensor *dx) {
    FG_TRY(check_op("unary_bwd", op));
    FG_TRY(check_pair("unary_bwd", x, dy));
    FG_TRY(check_pair("unary_bwd", x, dx));
    if (reads_output(op)) {
        if (!y) return fg_error(FG_EINVAL, "unary_bwd: op %d reads its output: y is NULL", (int)op);
        FG_TRY(check_pair("unary_bwd", x, y));
    }
    const void *py = y ? y->data : NULL;
    bool done = false;
    if (x->dtype == FG_F32 && op == FG_UN_GELU_ERF) FG_TRY(gelu_erf_vector(x, dy, dx, &done));
    if (done) return FG_OK;
    if (x->dtype == FG_F32) {
        un_bwd_f32(op, x->data, py, dy->data, (float)a, (float)b, dx->data, x->numel);
    } else if (x->dtype == FG_F64) {
        un_bwd_f64(op, x->data, py, dy->data, a, b, dx->data, x->numel);
    } else {
        return fg_error(FG_EUNSUPPORTED, "unary_bwd: dtype %s not supported on cpu",
                        fg_dtype_name(x->dtype));
    }
    return FG_OK;
}
