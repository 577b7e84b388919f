/* The calling thread's autocast setting, the rounding of autocast's
 * operands, and fg_cast, the differentiable dtype conversion. */
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

static bool castable(const fg_tensor *t) {
    return t && (t->dtype == FG_F32 || t->dtype == tl_autocast);
}

bool fg__autocast_applies(const fg_tensor *a, const fg_tensor *b) {
    return tl_autocast != FG_DTYPE_DEFAULT && castable(a) && castable(b) &&
           (a->dtype == FG_F32 || b->dtype == FG_F32 || a->dtype == tl_autocast);
}

fg_tensor *fg__autocast_f32(fg_tensor *t) {
    if (!t || tl_autocast == FG_DTYPE_DEFAULT || (t->dtype != FG_BF16 && t->dtype != FG_F16))
        return t;
    return fg_cast(t, FG_F32);
}

/* An operand of a product in dt is a in dt: a itself when it is already
 * (and contiguous), else a new contiguous step tensor rounded from f32 to
 * nearest even on the ops' conversion path (fg_ops_lowp_path). */
fg_tensor *fg__autocast_operand(const fg_tensor *t, fg_dtype dt) {
    if (t->dtype == dt && fg_tensor_is_contiguous(t)) return (fg_tensor *)t;
    fg_tensor *c = fg_tensor_contiguous(t);
    if (!c) return NULL;
    if (c->dtype == dt) return c;
    if (c->dtype != FG_F32) {
        fg_error(FG_EUNSUPPORTED, "autocast: a %s operand in a %s product; expected f32 or %s",
                 fg_dtype_name(c->dtype), fg_dtype_name(dt), fg_dtype_name(dt));
        return NULL;
    }
    fg_tensor *o = fg_empty(dt, c->ndim, c->shape);
    if (!o || fg__ops_round(c, o)) return NULL;
    return o;
}

fg_status fg__autocast_matmul(fg_dtype dt, const fg_tensor *a, bool ta, const fg_tensor *b, bool tb,
                              fg_tensor *c, double beta) {
    (void)dt; /* a and b have it: the table sends bf16 to the bf16 product */
    const fg_op_table *ops = fg__ops(c);
    if (!ops) return fg_last_status();
    return ops->matmul(a, ta, b, tb, c, 1.0, beta);
}

/* ------------------------------------------------------------------ cast */

static bool is_float(fg_dtype dt) {
    return dt == FG_F64 || dt == FG_F32 || dt == FG_BF16 || dt == FG_F16;
}

/* ga (a's dtype) += g: the table's axpby reads and writes bf16/f16 (through
 * f32, one rounding per element) as well as f32 and f64; a gradient of
 * another float dtype is converted first. */
static FG_MUST_USE fg_status cast_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *a = n->in[0];
    if (!fg__needs_grad(a)) return FG_OK;
    fg_tensor *ga = fg__grad_of(a);
    const fg_op_table *ops = ga ? fg__ops(a) : NULL;
    fg_tensor *gcont = ops ? fg_tensor_contiguous(g) : NULL;
    if (!gcont) return fg_last_status() ? fg_last_status() : FG_ENOMEM;
    if (FG_OP(ops, axpby)) return fg_last_status();
    bool mixes = (a->dtype == FG_F32 && g->dtype != FG_F64) ||
                 (g->dtype == FG_F32 && a->dtype != FG_F64); /* f32 with bf16/f16 */
    if (mixes) return ops->axpby(1.0, gcont, 1.0, ga);
    fg_tensor *gc = fg_empty(a->dtype, a->ndim, a->shape);
    if (!gc) return FG_ENOMEM;
    FG_TRY(fg__ops_convert(gc, gcont)); /* on their device */
    return ops->axpby(1.0, gc, 1.0, ga);
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
    if (!y || fg__ops_convert(y, ac)) return NULL; /* on their device: fg_convert's bits */
    fg__node *node;
    fg_tensor *in[1] = {a};
    if (fg__record(&node, "cast", cast_bw, y, 1, in)) return NULL;
    return y;
}
