/* The optimizer and clipping kernels as entries on a tensor's device: the
 * CPU runs them on the host; the guarded device runs the same kernels on
 * its private alias (as its op table does); a device without them (cuda,
 * until its backend brings them) is FG_EUNSUPPORTED naming the op. Each
 * tensor is one contiguous range of a flat buffer. */
#include <math.h>

#include "core/device_impl.h"
#include "ops_impl.h"
#include "tensor/tensor_impl.h"

/* The host address of t's data for a kernel of its device, or NULL with
 * the error set. `first` is the tensor that names the device. */
static void *kview(const char *op, const fg_tensor *first, const fg_tensor *t) {
    if (!t) return NULL;
    if (!fg_tensor_is_contiguous(t)) {
        fg_error(FG_EINVAL, "%s: a strided tensor (each tensor is a range of a flat buffer)", op);
        return NULL;
    }
    bool th = !t->dev || fg_dev_host_accessible(t->dev);
    bool fh = !first->dev || fg_dev_host_accessible(first->dev);
    if (th != fh || (!th && t->dev != first->dev)) {
        fg_error(FG_EINVAL, "%s: tensors on %s and %s; all of one step must be on one device", op,
                 first->dev ? fg_dev_name(first->dev) : "the host",
                 t->dev ? fg_dev_name(t->dev) : "the host");
        return NULL;
    }
    if (!t->dev || fg_dev_host_accessible(t->dev)) return t->data;
    if (fg_dev_kind(t->dev) != FG_GUARDED) {
        fg_error(FG_EUNSUPPORTED, "op %s is not available on %s: its backend has no kernel for it",
                 op, fg_dev_name(t->dev));
        return NULL;
    }
    if (!t->numel) return t->data;
    void *v = fg__dev_host_view(t->dev, t->data, fg_tensor_nbytes(t));
    if (!v) fg_error_wrap(fg_last_status(), "op %s", op);
    return v;
}

#define VIEW(var, t)                                                                               \
    void *var = NULL;                                                                              \
    if ((t) && !(var = kview(op, p, (t)))) return fg_last_status();

static FG_MUST_USE fg_status same_n(const char *op, const fg_tensor *p, const fg_tensor *t) {
    if (t && t->numel != p->numel)
        return fg_error(FG_EINVAL, "%s: %lld elements against the parameters' %lld", op,
                        (long long)t->numel, (long long)p->numel);
    return FG_OK;
}

fg_status fg__ops_adamw(fg_tensor *p, const fg_tensor *g, fg_tensor *m1, fg_tensor *m2,
                        double decay, double beta1, double beta2, double step, double bc2_sqrt,
                        double eps) {
    const char *op = "adamw";
    FG_TRY(same_n(op, p, g));
    FG_TRY(same_n(op, p, m1));
    FG_TRY(same_n(op, p, m2));
    VIEW(vp, p);
    VIEW(vg, g);
    VIEW(v1, m1);
    VIEW(v2, m2);
    fg__k_adamw(p->dtype, vp, vg, v1, v2, p->numel, decay, beta1, beta2, step, bc2_sqrt, eps);
    return FG_OK;
}

fg_status fg__ops_sgd(fg_tensor *p, const fg_tensor *g, fg_tensor *buf, double lr, double wd,
                      double mu, double damp, bool first, bool nesterov) {
    const char *op = "sgd";
    FG_TRY(same_n(op, p, g));
    FG_TRY(same_n(op, p, buf));
    VIEW(vp, p);
    VIEW(vg, g);
    VIEW(vb, buf);
    fg__k_sgd(p->dtype, vp, vg, vb, p->numel, lr, wd, mu, damp, first, nesterov);
    return FG_OK;
}

fg_status fg__ops_adam(fg_tensor *p, const fg_tensor *g, fg_tensor *m1, fg_tensor *m2,
                       fg_tensor *m3, double wd, double beta1, double beta2, double step,
                       double bc2_sqrt, double eps) {
    const char *op = "adam";
    FG_TRY(same_n(op, p, g));
    FG_TRY(same_n(op, p, m1));
    FG_TRY(same_n(op, p, m2));
    FG_TRY(same_n(op, p, m3));
    VIEW(vp, p);
    VIEW(vg, g);
    VIEW(v1, m1);
    VIEW(v2, m2);
    VIEW(v3, m3);
    fg__k_adam(p->dtype, vp, vg, v1, v2, v3, p->numel, wd, beta1, beta2, step, bc2_sqrt, eps);
    return FG_OK;
}

fg_status fg__ops_rmsprop(fg_tensor *p, const fg_tensor *g, fg_tensor *sq, fg_tensor *buf,
                          fg_tensor *ga, double lr, double wd, double alpha, double eps,
                          double mu) {
    const char *op = "rmsprop";
    FG_TRY(same_n(op, p, g));
    FG_TRY(same_n(op, p, sq));
    FG_TRY(same_n(op, p, buf));
    FG_TRY(same_n(op, p, ga));
    VIEW(vp, p);
    VIEW(vg, g);
    VIEW(vs, sq);
    VIEW(vb, buf);
    VIEW(va, ga);
    fg__k_rmsprop(p->dtype, vp, vg, vs, vb, va, p->numel, lr, wd, alpha, eps, mu);
    return FG_OK;
}

fg_status fg__ops_adagrad(fg_tensor *p, const fg_tensor *g, fg_tensor *sum, double clr, double wd,
                          double eps) {
    const char *op = "adagrad";
    FG_TRY(same_n(op, p, g));
    FG_TRY(same_n(op, p, sum));
    VIEW(vp, p);
    VIEW(vg, g);
    VIEW(vs, sum);
    fg__k_adagrad(p->dtype, vp, vg, vs, p->numel, clr, wd, eps);
    return FG_OK;
}

fg_status fg__ops_lion(fg_tensor *p, const fg_tensor *g, fg_tensor *m, double lr, double decay,
                       double beta1, double beta2) {
    const char *op = "lion";
    FG_TRY(same_n(op, p, g));
    FG_TRY(same_n(op, p, m));
    VIEW(vp, p);
    VIEW(vg, g);
    VIEW(vm, m);
    fg__k_lion(p->dtype, vp, vg, vm, p->numel, lr, decay, beta1, beta2);
    return FG_OK;
}

fg_status fg__ops_sumsq(const fg_tensor *x, double *out) {
    const char *op = "sumsq";
    const fg_tensor *p = x;
    VIEW(vx, x);
    return fg__sumsq(vx, x->dtype, x->numel, out);
}

fg_status fg__ops_scale_flat(fg_tensor *x, double s) {
    const char *op = "scale";
    const fg_tensor *p = x;
    VIEW(vx, x);
    return fg__scale(vx, x->dtype, x->numel, s);
}

fg_status fg_ops_first_nonfinite(const fg_tensor *x, int64_t *first) {
    const char *op = "first_nonfinite";
    if (!x || !first) return fg_error(FG_EINVAL, "%s: NULL argument", op);
    const fg_tensor *p = x;
    *first = -1;
    if (!x->numel) return FG_OK;
    VIEW(vx, x);
    int64_t n = x->numel;
    if (x->dtype == FG_F64) {
        const double *d = vx;
        for (int64_t k = 0; k < n; k++)
            if (!isfinite(d[k])) return (*first = k), FG_OK;
    } else if (x->dtype == FG_F32) {
        const float *d = vx;
        for (int64_t k = 0; k < n; k++)
            if (!isfinite(d[k])) return (*first = k), FG_OK;
    } else if (x->dtype == FG_BF16 || x->dtype == FG_F16) { /* the exponent all ones */
        const uint16_t *d = vx, e = x->dtype == FG_BF16 ? 0x7f80 : 0x7c00;
        for (int64_t k = 0; k < n; k++)
            if ((d[k] & e) == e) return (*first = k), FG_OK;
    } else {
        return fg_error(FG_EUNSUPPORTED, "%s: dtype %s (a float dtype)", op,
                        fg_dtype_name(x->dtype));
    }
    return FG_OK;
}

/* x = min(max(x, -v), v) over n elements of T */
#define CLAMP(T)                                                                                   \
    static void clamp_##T(T *x, int64_t n, T v) {                                                  \
        _Pragma("omp parallel for simd if (n > 65536) schedule(static)") for (int64_t i = 0;       \
                                                                              i < n; i++) {        \
            T e = x[i];                                                                            \
            x[i] = e > v ? v : e < -v ? -v : e;                                                    \
        }                                                                                          \
    }
CLAMP(float)
CLAMP(double)

fg_status fg_ops_clamp_flat(fg_tensor *x, double v) {
    const char *op = "clamp";
    if (!x) return fg_error(FG_EINVAL, "%s: NULL tensor", op);
    if (!(v >= 0)) return fg_error(FG_EINVAL, "%s: bound %g (expected >= 0: [-v, v])", op, v);
    const fg_tensor *p = x;
    if (!x->numel) return FG_OK;
    VIEW(vx, x);
    int64_t n = x->numel;
    if (x->dtype == FG_F64) {
        clamp_double(vx, n, v);
    } else if (x->dtype == FG_F32) {
        clamp_float(vx, n, (float)v);
    } else if (x->dtype == FG_BF16 || x->dtype == FG_F16) { /* in f32, rounded back */
        float f[2048];
        for (int64_t i = 0; i < n; i += 2048) {
            int64_t k = FG_MIN(2048, n - i);
            fg__ops_widen(f, (const uint16_t *)vx + i, k, x->dtype);
            clamp_float(f, k, (float)v);
            fg__ops_narrow((uint16_t *)vx + i, f, k, x->dtype);
        }
    } else {
        return fg_error(FG_EUNSUPPORTED, "%s: dtype %s (a float dtype)", op,
                        fg_dtype_name(x->dtype));
    }
    return FG_OK;
}

fg_status fg__ops_convert(fg_tensor *dst, const fg_tensor *src) {
    const char *op = "convert";
    const fg_tensor *p = dst;
    FG_TRY(same_n(op, p, src));
    VIEW(vd, dst);
    VIEW(vs, src);
    return fg_convert(vd, dst->dtype, vs, src->dtype, dst->numel);
}

/* g *= inv over n elements; true when one of them is inf or NaN. */
#define UNSCALE(T)                                                                                 \
    static bool unscale_##T(T *g, int64_t n, T inv) {                                              \
        int bad = 0;                                                                               \
        _Pragma("omp parallel for simd reduction(|:bad) if (n > 65536) schedule(static)") for (    \
            int64_t i = 0; i < n; i++) {                                                           \
            T v = g[i] * inv;                                                                      \
            bad |= !isfinite(v);                                                                   \
            g[i] = v;                                                                              \
        }                                                                                          \
        return bad != 0;                                                                           \
    }
UNSCALE(float)
UNSCALE(double)

fg_status fg__ops_unscale(fg_tensor *g, double inv, bool *bad) {
    const char *op = "unscale";
    const fg_tensor *p = g;
    *bad = false;
    if (g->dtype != FG_F32 && g->dtype != FG_F64)
        return fg_error(FG_EUNSUPPORTED,
                        "scaler unscale: %s gradients; the scaler works on f32 or f64 master "
                        "gradients (16-mixed)",
                        fg_dtype_name(g->dtype));
    if (!g->numel) return FG_OK;
    VIEW(vg, g);
    *bad = g->dtype == FG_F32 ? unscale_float(vg, g->numel, (float)inv)
                              : unscale_double(vg, g->numel, inv);
    return FG_OK;
}
