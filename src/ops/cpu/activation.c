/* ReLU and GELU (tanh approximation), forward and backward: flat loops over
 * contiguous tensors of one shape, split across threads when large.
 *
 * GELU: PyTorch's approximate="tanh" is 0.5 x (1 + tanh(u)) with
 * u = sqrt(2/pi) (x + 0.044715 x^3). Since 0.5 (1 + tanh(u)) = sigmoid(2u),
 * it is computed as x / (1 + exp(-2u)): one exp, no cancellation near
 * u = 0 (1 + tanh(u) loses digits there), and the f32 exp vectorises
 * (vmath.h); tanhf would be a scalar libm call per element. The derivative
 * is s + 2 x s (1 - s) u'(x) with s = sigmoid(2u), which is PyTorch's
 * 0.5 (1 + t) + 0.5 x (1 - t^2) u' written with s; 1 - s is computed as
 * e s with e = exp(-2u), which does not cancel where s is near 1 (1 - s
 * there was good to 6e-8 absolute, and times 2 x u' it moved the gradient
 * by 1e-6), with -2u capped at 80 so that e stays finite (e s s is then
 * below 2^-115, 0 in f32).
 *
 * Past |x| = 30 the sigmoid is exactly 0 or 1 in f32 and f64 (exp(1974)
 * overflows, exp(-1974) underflows), so x is clamped to [-30, 30] inside u:
 * the same values, without x^3 overflowing into inf * 0 = NaN at huge |x|.
 * NaN passes through the clamp.
 *
 * y may be x (in place); backward kernels accumulate into dx. */
#include "cpu_impl.h"
#include "vmath.h"

#define GELU_K0 0.7978845608028654 /* sqrt(2 / pi) */
#define GELU_K1 0.044715

static FG_MUST_USE fg_status check_fwd(const char *kernel, const fg_tensor *x, const fg_tensor *y) {
    FG_TRY(fg__expect_same_shape(kernel, x, y));
    FG_TRY(fg__expect_contiguous(kernel, x));
    return fg__expect_contiguous(kernel, y);
}

static FG_MUST_USE fg_status check_bwd(const char *kernel, const fg_tensor *x, const fg_tensor *dy,
                                       const fg_tensor *dx) {
    FG_TRY(check_fwd(kernel, x, dy));
    return check_fwd(kernel, x, dx);
}

fg_status fg__cpu_relu_fwd(const fg_tensor *x, fg_tensor *y) {
    FG_TRY(check_fwd("relu_fwd", x, y));
    int64_t n = x->numel;
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    if (x->dtype == FG_F32 && vk->relu_fwd) {
        const float *px = x->data;
        float *py = y->data;
        FG_PRAGMA(omp parallel for if (n > FG_PAR_MIN) schedule(static))
        for (int64_t i = 0; i < n; i += FG_VK_PIECE)
            vk->relu_fwd(px + i, py + i, FG_MIN(FG_VK_PIECE, n - i));
        return FG_OK;
    }
    FG_FLOAT_DISPATCH("relu_fwd", x->dtype, {
        const T *px = x->data;
        T *py = y->data;
        /* x < 0 ? 0 : x lets NaN through, as PyTorch's relu does */
        FG_PRAGMA(omp parallel for simd if (parallel: n > FG_PAR_MIN) schedule(static))
        for (int64_t i = 0; i < n; i++) py[i] = px[i] < 0 ? (T)0 : px[i];
    });
    return FG_OK;
}

fg_status fg__cpu_relu_bwd(const fg_tensor *x, const fg_tensor *dy, fg_tensor *dx) {
    FG_TRY(check_bwd("relu_bwd", x, dy, dx));
    int64_t n = x->numel;
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    if (x->dtype == FG_F32 && vk->relu_bwd) {
        const float *px = x->data, *pg = dy->data;
        float *pd = dx->data;
        FG_PRAGMA(omp parallel for if (n > FG_PAR_MIN) schedule(static))
        for (int64_t i = 0; i < n; i += FG_VK_PIECE)
            vk->relu_bwd(px + i, pg + i, pd + i, FG_MIN(FG_VK_PIECE, n - i));
        return FG_OK;
    }
    FG_FLOAT_DISPATCH("relu_bwd", x->dtype, {
        const T *px = x->data, *pg = dy->data;
        T *pd = dx->data;
        FG_PRAGMA(omp parallel for simd if (parallel: n > FG_PAR_MIN) schedule(static))
        for (int64_t i = 0; i < n; i++) pd[i] += px[i] > 0 ? pg[i] : (T)0;
    });
    return FG_OK;
}

/* f32 through the vector kernels, in pieces split across threads */
fg_status fg__cpu_gelu_fwd(const fg_tensor *x, fg_tensor *y) {
    FG_TRY(check_fwd("gelu_fwd", x, y));
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    int64_t n = x->numel;
    if (x->dtype == FG_F32 && vk->gelu_fwd) {
        const float *px = x->data;
        float *py = y->data;
FG_PRAGMA(omp parallel for if (n > FG_PAR_MIN) schedule(static))
for (int64_t i = 0; i < n; i += FG_VK_PIECE)
    vk->gelu_fwd(px + i, py + i, FG_MIN(FG_VK_PIECE, n - i));
return FG_OK;
    }
    FG_FLOAT_DISPATCH("gelu_fwd", x->dtype, {
        const T *px = x->data;
        T *py = y->data;
        const T k0 = (T)GELU_K0, k1 = (T)GELU_K1;
        FG_PRAGMA(omp parallel for simd if (parallel: n > FG_PAR_MIN) schedule(static))
        for (int64_t i = 0; i < n; i++) {
            T v = px[i], c = v < -30 ? (T)-30 : v > 30 ? (T)30 : v;
            T u = k0 * (c + k1 * c * c * c);
            py[i] = v / (1 + FG_EXP(-2 * u));
        }
    });
    return FG_OK;
}

fg_status fg__cpu_gelu_bwd(const fg_tensor *x, const fg_tensor *dy, fg_tensor *dx) {
    FG_TRY(check_bwd("gelu_bwd", x, dy, dx));
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    int64_t n = x->numel;
    if (x->dtype == FG_F32 && vk->gelu_bwd) {
        const float *px = x->data, *pg = dy->data;
        float *pd = dx->data;
FG_PRAGMA(omp parallel for if (n > FG_PAR_MIN) schedule(static))
for (int64_t i = 0; i < n; i += FG_VK_PIECE)
    vk->gelu_bwd(px + i, pg + i, pd + i, FG_MIN(FG_VK_PIECE, n - i));
return FG_OK;
    }
    FG_FLOAT_DISPATCH("gelu_bwd", x->dtype, {
        const T *px = x->data, *pg = dy->data;
        T *pd = dx->data;
        const T k0 = (T)GELU_K0, k1 = (T)GELU_K1, k13 = (T)(3 * GELU_K1);
        FG_PRAGMA(omp parallel for simd if (parallel: n > FG_PAR_MIN) schedule(static))
        for (int64_t i = 0; i < n; i++) {
            T v = px[i], c = v < -30 ? (T)-30 : v > 30 ? (T)30 : v, c2 = c * c;
            T u = k0 * (c + k1 * c2 * c), a = -2 * u;
            T e = FG_EXP(a > 80 ? (T)80 : a), s = 1 / (1 + e);
            T du = k0 * (1 + k13 * c2);
            pd[i] += pg[i] * (s + 2 * c * (e * s) * s * du);
        }
    });
    return FG_OK;
}
