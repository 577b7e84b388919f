/* The guarded device's op table: each entry is the CPU kernel, run on the
 * device's private read-write alias of the memory its tensors carry
 * (fg__dev_host_view). An entry takes every tensor it is given on one
 * guarded device: a tensor in host memory, on another device, or outside
 * the device's live allocations is FG_EINVAL naming the op and the tensor,
 * so the table proves an op's callers device-clean as a real backend's
 * would, and a host access anywhere else still faults. */
#include <stdio.h>

#include "core/device_impl.h"
#include "cpu/cpu_impl.h"
#include "cpu/lowp.h"
#include "ops_impl.h"
#include "ops_list.h"
#include "tensor/tensor_impl.h"

#define SCOPE_MAX 10 /* the most tensors an entry takes (layernorm_bwd: 8) */

typedef struct scope {
    const char *op;
    fg_dev *dev; /* the device of the first tensor */
    int n;
    const fg_tensor *orig[SCOPE_MAX];
    fg_tensor view[SCOPE_MAX];
} scope;

/* The bytes from t's first element to one past its last, strides >= 0. */
static size_t extent(const fg_tensor *t) {
    if (!t->numel) return 0;
    int64_t last = 0;
    for (int i = 0; i < t->ndim; i++) last += (t->shape[i] - 1) * t->strides[i];
    return (size_t)(last + 1) * fg_dtype_size(t->dtype);
}

static FG_MUST_USE fg_status view(scope *s, const fg_tensor *t) {
    if (!t) return FG_OK;
    for (int i = 0; i < s->n; i++)
        if (s->orig[i] == t) return FG_OK; /* the same tensor twice: one view */
    char d[96];
    if (!t->dev || fg_dev_kind(t->dev) != FG_GUARDED)
        return fg_error(
            FG_EINVAL,
            "op %s on the guarded device: tensor %s \"%s\" is %s; every tensor of an op "
            "on a device must be on it (fg_tensor_to)",
            s->op, fg_tensor_describe(t, d, sizeof d), t->name ? t->name : "",
            t->dev ? "on another kind of device" : "in host memory");
    if (s->dev && t->dev != s->dev)
        return fg_error(FG_EINVAL, "op %s: tensor %s \"%s\" is on %s, the others on %s", s->op,
                        fg_tensor_describe(t, d, sizeof d), t->name ? t->name : "",
                        fg_dev_name(t->dev), fg_dev_name(s->dev));
    s->dev = t->dev;
    if (s->n == SCOPE_MAX)
        return fg_error(FG_EINVAL, "op %s: more than %d tensors", s->op, SCOPE_MAX);
    fg_tensor *v = &s->view[s->n];
    *v = *t;
    size_t bytes = extent(t);
    if (bytes) {
        v->data = fg__dev_host_view(t->dev, t->data, bytes);
        if (!v->data) return fg_error_wrap(fg_last_status(), "op %s", s->op);
    }
    v->dev = NULL;
    v->device = FG_CPU;
    v->grad = NULL;
    s->orig[s->n++] = t;
    return FG_OK;
}

static fg_tensor *get(scope *s, const fg_tensor *t) {
    if (!t) return NULL;
    for (int i = 0; i < s->n; i++)
        if (s->orig[i] == t) return &s->view[i];
    return NULL; /* not reached: every tensor went through view() */
}

#define P(t) FG_TRY(view(&sc, t));
#define T(t) get(&sc, t)
#define X(name, params, prep, args)                                                                \
    static fg_status g_##name params {                                                             \
        scope sc = {.op = #name};                                                                  \
        prep;                                                                                      \
        return fg__cpu_ops_lowp.name args;                                                         \
    }
FG__OPS_LIST(X)
#undef X

#define X(name, params, prep, args) .name = g_##name,
const fg_op_table fg__guarded_ops = {.device = "guarded", FG__OPS_LIST(X)};
#undef X
#undef P
#undef T

#define P(t) FG_TRY(view(&sc, t));
#define T(t) get(&sc, t)

/* The private low-precision entries (ops_impl.h) on the guarded device:
 * the same CPU kernels through the alias, so mixed precision proves its
 * callers device-clean and ends with the CPU's bits. */
fg_status fg__guarded_matmul_bf16(const fg_tensor *a, bool ta, const fg_tensor *b, bool tb,
                                  fg_tensor *c, double alpha, double beta) {
    scope sc = {.op = "matmul_bf16"};
    P(a) P(b) P(c);
    return fg__cpu_matmul_bf16(T(a), ta, T(b), tb, T(c), alpha, beta);
}

fg_status fg__guarded_linear_lowp(const fg_tensor *x, const fg_tensor *w, const fg_tensor *bias,
                                  fg_tensor *y) {
    scope sc = {.op = "linear_lowp"};
    P(x) P(w) P(bias) P(y);
    return fg__cpu_linear_lowp(T(x), T(w), T(bias), T(y));
}

fg_status fg__guarded_linear_lowp_bwd(const fg_tensor *x, const fg_tensor *w, const fg_tensor *g,
                                      const fg_tensor *gbias, fg_tensor *dx, double beta_dx,
                                      fg_tensor *dw, fg_tensor *db) {
    scope sc = {.op = "linear_lowp_bwd"};
    P(x) P(w) P(g) P(gbias) P(dx) P(dw) P(db);
    return fg__cpu_linear_lowp_bwd(T(x), T(w), T(g), T(gbias), T(dx), beta_dx, T(dw), T(db));
}

fg_status fg__guarded_round(const fg_tensor *src, fg_tensor *dst) {
    scope sc = {.op = "round"};
    P(src) P(dst);
    return fg__ops_round(T(src), T(dst));
}

fg_status fg__guarded_round_f32(const fg_tensor *src, fg_tensor *dst, fg_dtype dt) {
    scope sc = {.op = "round_f32"};
    P(src) P(dst);
    return fg__ops_round_f32(T(src), T(dst), dt);
}

#undef P
#undef T
