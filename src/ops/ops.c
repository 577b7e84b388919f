/* The op-table registry: one table per device. */
#include "cpu/lowp.h"
#include "ops_impl.h"

const fg_op_table *fg_ops_get(fg_device device) {
    if (device == FG_CPU)
        return &fg__cpu_ops_lowp; /* f32/f64 kernels, bf16/f16 through lowp_ops.c */
    fg_error(FG_EUNSUPPORTED, "device %d: no kernels built in (CPU only in this build)",
             (int)device);
    return NULL;
}

fg_status fg__ops_matmul_bf16(const fg_tensor *a, bool ta, const fg_tensor *b, bool tb,
                              fg_tensor *c, double alpha, double beta) {
    if (a->device != FG_CPU)
        return fg_error(FG_EUNSUPPORTED, "matmul_bf16: device %d: no bf16 product built in",
                        (int)a->device);
    return fg__cpu_matmul_bf16(a, ta, b, tb, c, alpha, beta);
}

fg_status fg__ops_linear_lowp(const fg_tensor *x, const fg_tensor *w, const fg_tensor *bias,
                              fg_tensor *y) {
    if (x->device != FG_CPU)
        return fg_error(FG_EUNSUPPORTED, "linear_lowp: device %d: no low-precision linear built in",
                        (int)x->device);
    return fg__cpu_linear_lowp(x, w, bias, y);
}

fg_status fg__ops_linear_lowp_bwd(const fg_tensor *x, const fg_tensor *w, const fg_tensor *g,
                                  const fg_tensor *gbias, fg_tensor *dx, double beta_dx,
                                  fg_tensor *dw, fg_tensor *db) {
    if (g->device != FG_CPU)
        return fg_error(FG_EUNSUPPORTED,
                        "linear_lowp_bwd: device %d: no low-precision linear built in",
                        (int)g->device);
    return fg__cpu_linear_lowp_bwd(x, w, g, gbias, dx, beta_dx, dw, db);
}

const char *fg_ops_lowp_path(void) { return fg__lowp_path_name(fg__lowp_path_get()); }

fg_status fg__ops_round(const fg_tensor *src, fg_tensor *dst) {
    if (src->dtype != FG_F32 || !fg__is_lowp(dst->dtype) || src->numel != dst->numel ||
        !fg_tensor_is_contiguous(src) || !fg_tensor_is_contiguous(dst))
        return fg_error(FG_EINVAL,
                        "round: want contiguous f32 -> bf16/f16 of one size, got %s -> %s",
                        fg_dtype_name(src->dtype), fg_dtype_name(dst->dtype));
    fg__lowp_narrow(dst->data, src->data, src->numel, dst->dtype);
    return FG_OK;
}

bool fg__ops_lowp_product_native(fg_device device, fg_dtype dt) {
    return device == FG_CPU && dt == FG_BF16 && fg__matmul_bf16_native();
}

fg_status fg__ops_round_f32(const fg_tensor *src, fg_tensor *dst, fg_dtype dt) {
    if (src->dtype != FG_F32 || dst->dtype != FG_F32 || !fg__is_lowp(dt) ||
        src->numel != dst->numel || !fg_tensor_is_contiguous(src) || !fg_tensor_is_contiguous(dst))
        return fg_error(
            FG_EINVAL,
            "round_f32: want contiguous f32 -> f32 of one size rounded to bf16/f16, got "
            "%s -> %s (%s)",
            fg_dtype_name(src->dtype), fg_dtype_name(dst->dtype), fg_dtype_name(dt));
    fg__lowp_round_f32(dst->data, src->data, src->numel, dt);
    return FG_OK;
}

void fg__ops_widen(float *dst, const uint16_t *src, int64_t n, fg_dtype dt) {
    fg__lowp_widen(dst, src, n, dt);
}

void fg__ops_narrow(uint16_t *dst, const float *src, int64_t n, fg_dtype dt) {
    fg__lowp_narrow(dst, src, n, dt);
}
