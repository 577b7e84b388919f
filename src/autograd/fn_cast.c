/* The calling thread's autocast setting, the rounding of autocast's
 * operands, and fg_cast, the differentiable dtype conversion.
 *
 * An autocast operand is what a product multiplies: bf16 data for bf16 (the
 * bf16 product reads it), f32 data holding f16-rounded values for f16 (no
 * f16 product exists; the f32 one multiplies the rounded values). */
#include <string.h>

#include "autograd_impl.h"

static _Thread_local fg_dtype tl_autocast; /* FG_DTYPE_DEFAULT: off */

fg_status fg_autocast_set(fg_dtype dt, fg_dtype *prev) {
    if (dt == FG_F32) dt = FG_DTYPE_DEFAULT;
    if (dt != FG_DTYPE_DEFAULT && dt != FG_BF16 && dt != FG_F16)
        return fg_error(FG_EINVAL,
                        "autocast: dtype %s; expected bf16, f16, or f32 / FG_DTYPE_DEFAULT (off)",
                        fg_dtype_name(dt));
    if (prev) *prev = tl_autocast;
    tl_autocast = dt;
    return FG_OK;
}

fg_dtype fg_autocast_dtype(void) { return tl_autocast; }

bool fg__autocast_applies(const fg_tensor *a, const fg_tensor *b) {
    return tl_autocast != FG_DTYPE_DEFAULT && a && b && a->dtype == FG_F32 && b->dtype == FG_F32;
}

/* f32 -> bf16, round to nearest even, NaN kept quiet (fg_f32_to_bf16's
 * rounding, inlined so that the loop vectorises). */
static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* f32 -> f16 -> f32, round to nearest even, overflow to inf: the compiler's
 * _Float16 where it has one (F16C's vcvtps2ph when the target has it, so the
 * loop vectorises), else the library's conversions. */
#ifdef __FLT16_MAX__
__extension__ typedef _Float16 half; /* a GCC/Clang extension of C11 */
#endif
static inline float round_f16(float f) {
#ifdef __FLT16_MAX__
    return (float)(half)f;
#else
    return fg_f16_to_f32(fg_f32_to_f16(f));
#endif
}

fg_tensor *fg__autocast_operand(const fg_tensor *t, fg_dtype dt) {
    fg_tensor *c = fg_tensor_contiguous(t);
    if (!c) return NULL;
    int64_t n = c->numel;
    bool par = n > 32768;
    const float *src = c->data;
    if (dt == FG_BF16) {
        fg_tensor *o = fg_empty(FG_BF16, c->ndim, c->shape);
        if (!o) return NULL;
        uint16_t *dst = o->data;
#pragma omp parallel for simd if (par) schedule(static)
        for (int64_t i = 0; i < n; i++) dst[i] = to_bf16(src[i]);
        return o;
    }
    fg_tensor *o = fg_empty(FG_F32, c->ndim, c->shape);
    if (!o) return NULL;
    float *dst = o->data;
#pragma omp parallel for simd if (par) schedule(static)
    for (int64_t i = 0; i < n; i++) dst[i] = round_f16(src[i]);
    return o;
}

fg_status fg__autocast_matmul(fg_dtype dt, const fg_tensor *a, bool ta, const fg_tensor *b, bool tb,
                              fg_tensor *c, double beta) {
    if (dt == FG_BF16) return fg__ops_matmul_bf16(a, ta, b, tb, c, 1.0, beta);
    const fg_op_table *ops = fg__ops(c);
    if (!ops) return fg_last_status();
    return ops->matmul(a, ta, b, tb, c, 1.0, beta);
}

/* ------------------------------------------------------------------ cast */

static bool is_float(fg_dtype dt) {
    return dt == FG_F64 || dt == FG_F32 || dt == FG_BF16 || dt == FG_F16;
}

/* ga (a's dtype) += g converted; through f32/f64 for the 16-bit kinds */
static fg_status cast_bw(fg_node *n, const fg_tensor *g) {
    fg_tensor *a = n->in[0];
    if (!fg__needs_grad(a)) return FG_OK;
    fg_tensor *ga = fg__grad_of(a);
    fg_tensor *gc = ga ? fg_empty(a->dtype, a->ndim, a->shape) : NULL;
    fg_tensor *gcont = gc ? fg_tensor_contiguous(g) : NULL;
    if (!gcont) return fg_last_status() ? fg_last_status() : FG_ENOMEM;
    FG_TRY(fg_convert(gc->data, a->dtype, gcont->data, g->dtype, g->numel));
    if (a->dtype == FG_F32 || a->dtype == FG_F64) {
        const fg_op_table *ops = fg__ops(a);
        if (!ops || FG_OP(ops, axpby)) return fg_last_status();
        return ops->axpby(1.0, gc, 1.0, ga);
    }
    for (int64_t i = 0; i < ga->numel; i++) { /* bf16/f16: one rounding per element */
        float s = fg_tensor_get(ga, i) + fg_tensor_get(gc, i);
        ((uint16_t *)ga->data)[i] = a->dtype == FG_BF16 ? fg_f32_to_bf16(s) : fg_f32_to_f16(s);
    }
    return FG_OK;
}

fg_tensor *fg_cast(fg_tensor *a, fg_dtype dt) {
    if (!a) {
        fg_error_wrap(FG_EINVAL, "cast: NULL input (an earlier call failed)");
        return NULL;
    }
    if (!is_float(a->dtype) || !is_float(dt)) {
        fg_error(FG_EINVAL, "cast: %s -> %s; both must be float dtypes (f64, f32, bf16, f16)",
                 fg_dtype_name(a->dtype), fg_dtype_name(dt));
        return NULL;
    }
    if (a->dtype == dt) return a;
    fg_tensor *ac = fg_tensor_contiguous(a);
    fg_tensor *y = ac ? fg_empty(dt, a->ndim, a->shape) : NULL;
    if (!y || fg_convert(y->data, dt, ac->data, a->dtype, a->numel)) return NULL;
    fg_node *node;
    fg_tensor *in[1] = {a};
    if (fg__record(&node, "cast", cast_bw, y, 1, in)) return NULL;
    return y;
}
