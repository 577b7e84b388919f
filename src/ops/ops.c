/* The op-table registry: one table per device kind, picked by the device
 * of the tensors an op is given. A backend registers its table in
 * k_tables (one line); an entry it leaves out is filled with a stub that
 * fails with FG_EUNSUPPORTED naming the op and the device, never a NULL
 * call. */
#include <pthread.h>

#include "cpu/lowp.h"
#include "ops_impl.h"
#include "ops_list.h"
#ifdef FULGUR_HAVE_CUDA
#include "cuda/cuda_ops.h"
#endif

extern const fg_op_table fg__guarded_ops; /* guarded.c */

static const fg_op_table *const k_tables[FG_DEVICE_KIND_COUNT] = {
    [FG_CPU] = &fg__cpu_ops_lowp, /* f32/f64 kernels, bf16/f16 through lowp_ops.c */
    [FG_GUARDED] = &fg__guarded_ops,
#ifdef FULGUR_HAVE_CUDA
    [FG_CUDA] = &fg__cuda_ops, /* src/ops/cuda */
#endif
};

static const char *const k_kind_names[FG_DEVICE_KIND_COUNT] = {
    [FG_CPU] = "cpu", [FG_CUDA] = "cuda", [FG_GUARDED] = "guarded"};

static FG_MUST_USE fg_status missing(const char *op, fg_device kind) {
    return fg_error(FG_EUNSUPPORTED,
                    "op %s is not available on %s: its backend has no kernel for it (run on the "
                    "CPU, or add the entry to the %s op table)",
                    op, k_kind_names[kind], k_kind_names[kind]);
}

/* one stub an entry and a device kind */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#endif
#define STUB(kind, name, params)                                                                   \
    static fg_status miss_##kind##_##name params { return missing(#name, kind); }
#define X_CPU(name, params, prep, args) STUB(FG_CPU, name, params)
#define X_CUDA(name, params, prep, args) STUB(FG_CUDA, name, params)
#define X_GUARDED(name, params, prep, args) STUB(FG_GUARDED, name, params)
FG__OPS_LIST(X_CPU)
FG__OPS_LIST(X_CUDA)
FG__OPS_LIST(X_GUARDED)
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

#define FILL(kind, name)                                                                           \
    if (!out->name) {                                                                              \
        out->name = miss_##kind##_##name;                                                          \
        n++;                                                                                       \
    }
#define F_CPU(name, params, prep, args) FILL(FG_CPU, name)
#define F_CUDA(name, params, prep, args) FILL(FG_CUDA, name)
#define F_GUARDED(name, params, prep, args) FILL(FG_GUARDED, name)

int fg__ops_complete(const fg_op_table *in, fg_device kind, fg_op_table *out) {
    int n = 0;
    *out = *in;
    if (kind == FG_CPU) {
        FG__OPS_LIST(F_CPU)
    } else if (kind == FG_CUDA) {
        FG__OPS_LIST(F_CUDA)
    } else {
        FG__OPS_LIST(F_GUARDED)
    }
    if (!out->device) out->device = k_kind_names[kind];
    return n;
}

static fg_op_table g_done[FG_DEVICE_KIND_COUNT];
static int g_missing[FG_DEVICE_KIND_COUNT];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void complete_all(void) {
    for (int k = 0; k < FG_DEVICE_KIND_COUNT; k++)
        if (k_tables[k]) g_missing[k] = fg__ops_complete(k_tables[k], (fg_device)k, &g_done[k]);
}

const fg_op_table *fg_ops_get(fg_device device) {
    if ((int)device < 0 || device >= FG_DEVICE_KIND_COUNT) {
        fg_error(FG_EINVAL, "device kind %d: no such kind (cpu, cuda, guarded)", (int)device);
        return NULL;
    }
    if (!k_tables[device]) {
        fg_error(FG_EUNSUPPORTED,
                 "device %s: no kernels in this build (the CUDA backend is not built in: "
                 "configure with FULGUR_CUDA=ON on a machine with the CUDA toolkit); use cpu, or "
                 "guarded to test that code is device-clean",
                 k_kind_names[device]);
        return NULL;
    }
    pthread_once(&g_once, complete_all);
    return &g_done[device];
}

int fg__ops_missing(fg_device device) {
    if ((int)device < 0 || device >= FG_DEVICE_KIND_COUNT || !k_tables[device]) return -1;
    pthread_once(&g_once, complete_all);
    return g_missing[device];
}
fg_status fg__ops_matmul_bf16(const fg_tensor *a, bool ta, const fg_tensor *b, bool tb,
                              fg_tensor *c, double alpha, double beta) {
    if (a->device == FG_GUARDED) return fg__guarded_matmul_bf16(a, ta, b, tb, c, alpha, beta);
    if (a->device != FG_CPU)
        return fg_error(FG_EUNSUPPORTED, "matmul_bf16: device %d: no bf16 product built in",
                        (int)a->device);
    return fg__cpu_matmul_bf16(a, ta, b, tb, c, alpha, beta);
}

fg_status fg__ops_linear_lowp(const fg_tensor *x, const fg_tensor *w, const fg_tensor *bias,
                              fg_tensor *y) {
#ifdef FULGUR_HAVE_CUDA
    if (x->device == FG_CUDA) return fg__cuda_linear_lowp(x, w, bias, y);
#endif
    if (x->device == FG_GUARDED) return fg__guarded_linear_lowp(x, w, bias, y);
    if (x->device != FG_CPU)
        return fg_error(FG_EUNSUPPORTED, "linear_lowp: device %d: no low-precision linear built in",
                        (int)x->device);
    return fg__cpu_linear_lowp(x, w, bias, y);
}

fg_status fg__ops_linear_lowp_bwd(const fg_tensor *x, const fg_tensor *w, const fg_tensor *g,
                                  const fg_tensor *gbias, fg_tensor *dx, double beta_dx,
                                  fg_tensor *dw, fg_tensor *db) {
    if (g->device == FG_GUARDED)
        return fg__guarded_linear_lowp_bwd(x, w, g, gbias, dx, beta_dx, dw, db);
    if (g->device != FG_CPU)
        return fg_error(FG_EUNSUPPORTED,
                        "linear_lowp_bwd: device %d: no low-precision linear built in",
                        (int)g->device);
    return fg__cpu_linear_lowp_bwd(x, w, g, gbias, dx, beta_dx, dw, db);
}

fg_status fg__ops_lstm_fwd(const fg_tensor *xw, const fg_tensor *whh, const fg_tensor *bhh,
                           const fg_tensor *h0, const fg_tensor *c0, bool reverse, fg_tensor *y,
                           fg_tensor *gates, fg_tensor *cs) {
    if (xw->device != FG_CPU)
        return fg_error(FG_EUNSUPPORTED, "lstm_fwd: device %d: no fused LSTM built in",
                        (int)xw->device);
    return fg__cpu_lstm_fwd(xw, whh, bhh, h0, c0, reverse, y, gates, cs);
}

fg_status fg__ops_lstm_bwd(const fg_tensor *whh, const fg_tensor *h0, const fg_tensor *c0,
                           const fg_tensor *y, const fg_tensor *gates, const fg_tensor *cs,
                           const fg_tensor *dy, bool reverse, fg_tensor *dg, fg_tensor *dwhh,
                           fg_tensor *dh0, fg_tensor *dc0) {
    if (whh->device != FG_CPU)
        return fg_error(FG_EUNSUPPORTED, "lstm_bwd: device %d: no fused LSTM built in",
                        (int)whh->device);
    return fg__cpu_lstm_bwd(whh, h0, c0, y, gates, cs, dy, reverse, dg, dwhh, dh0, dc0);
}

fg_status fg__ops_gru_fwd(const fg_tensor *xw, const fg_tensor *whh, const fg_tensor *bhh,
                          const fg_tensor *h0, bool reverse, fg_tensor *y, fg_tensor *gates) {
    if (xw->device != FG_CPU)
        return fg_error(FG_EUNSUPPORTED, "gru_fwd: device %d: no fused GRU built in",
                        (int)xw->device);
    return fg__cpu_gru_fwd(xw, whh, bhh, h0, reverse, y, gates);
}

fg_status fg__ops_gru_bwd(const fg_tensor *whh, const fg_tensor *h0, const fg_tensor *y,
                          const fg_tensor *gates, const fg_tensor *dy, bool reverse, fg_tensor *dx,
                          fg_tensor *dgh, fg_tensor *dwhh, fg_tensor *dh0) {
    if (whh->device != FG_CPU)
        return fg_error(FG_EUNSUPPORTED, "gru_bwd: device %d: no fused GRU built in",
                        (int)whh->device);
    return fg__cpu_gru_bwd(whh, h0, y, gates, dy, reverse, dx, dgh, dwhh, dh0);
}

const char *fg_ops_lowp_path(void) { return fg__lowp_path_name(fg__lowp_path_get()); }

fg_status fg__ops_round(const fg_tensor *src, fg_tensor *dst) {
    if (src->dtype != FG_F32 || !fg__is_lowp(dst->dtype) || src->numel != dst->numel ||
        !fg_tensor_is_contiguous(src) || !fg_tensor_is_contiguous(dst))
        return fg_error(FG_EINVAL,
                        "round: want contiguous f32 -> bf16/f16 of one size, got %s -> %s",
                        fg_dtype_name(src->dtype), fg_dtype_name(dst->dtype));
#ifdef FULGUR_HAVE_CUDA
    if (dst->device == FG_CUDA) return fg__cuda_cast(src, dst);
#endif
    if (dst->device == FG_GUARDED) return fg__guarded_round(src, dst);
    if (dst->device != FG_CPU)
        return fg_error(FG_EUNSUPPORTED, "round: device %d: no conversion built in",
                        (int)dst->device);
    fg__lowp_narrow(dst->data, src->data, src->numel, dst->dtype);
    return FG_OK;
}

bool fg__ops_lowp_product_native(fg_device device, fg_dtype dt) {
    /* the guarded device runs the CPU's kernels: the CPU's answer */
    return (device == FG_CPU || device == FG_GUARDED) && dt == FG_BF16 && fg__matmul_bf16_native();
}

fg_status fg__ops_round_f32(const fg_tensor *src, fg_tensor *dst, fg_dtype dt) {
    if (src->dtype != FG_F32 || dst->dtype != FG_F32 || !fg__is_lowp(dt) ||
        src->numel != dst->numel || !fg_tensor_is_contiguous(src) || !fg_tensor_is_contiguous(dst))
        return fg_error(
            FG_EINVAL,
            "round_f32: want contiguous f32 -> f32 of one size rounded to bf16/f16, got "
            "%s -> %s (%s)",
            fg_dtype_name(src->dtype), fg_dtype_name(dst->dtype), fg_dtype_name(dt));
#ifdef FULGUR_HAVE_CUDA
    if (dst->device == FG_CUDA) return fg__cuda_round_f32(src, dst, dt);
#endif
    if (dst->device == FG_GUARDED) return fg__guarded_round_f32(src, dst, dt);
    if (dst->device != FG_CPU)
        return fg_error(FG_EUNSUPPORTED, "round_f32: device %d: no conversion built in",
                        (int)dst->device);
    fg__lowp_round_f32(dst->data, src->data, src->numel, dt);
    return FG_OK;
}

void fg__ops_widen(float *dst, const uint16_t *src, int64_t n, fg_dtype dt) {
    fg__lowp_widen(dst, src, n, dt);
}

void fg__ops_narrow(uint16_t *dst, const float *src, int64_t n, fg_dtype dt) {
    fg__lowp_narrow(dst, src, n, dt);
}
