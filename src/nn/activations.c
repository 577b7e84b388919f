/* The parameterless modules of PyTorch beside ReLU and GELU (layers.c):
 * Sigmoid, Tanh, SiLU, GELU(approximate), Softplus(beta, threshold),
 * LeakyReLU(negative_slope), ELU(alpha), Softmax(dim), LogSoftmax(dim),
 * Flatten(start_dim, end_dim) and Identity. Each keeps its arguments in
 * its user data (no parameters, no buffers: nothing in the state dict, as
 * in PyTorch). */
#include <string.h>

#include "nn_impl.h"

typedef enum act_kind {
    A_SIGMOID,
    A_TANH,
    A_SILU,
    A_GELU_ERF,
    A_GELU_TANH,
    A_SOFTPLUS,
    A_LEAKY,
    A_ELU,
    A_SOFTMAX,
    A_LOG_SOFTMAX,
    A_FLATTEN,
    A_IDENTITY,
} act_kind;

typedef struct act {
    act_kind kind;
    double a, b;
    int d0, d1;
} act;

static fg_tensor *act_fwd(fg_module *m, fg_tensor *x, void *ud) {
    (void)m;
    const act *p = ud;
    switch (p->kind) {
    case A_SIGMOID: return fg_sigmoid(x);
    case A_TANH: return fg_tanh(x);
    case A_SILU: return fg_silu(x);
    case A_GELU_ERF: return fg_gelu_approximate(x, "none");
    case A_GELU_TANH: return fg_gelu(x);
    case A_SOFTPLUS: return fg_softplus(x, p->a, p->b);
    case A_LEAKY: return fg_leaky_relu(x, p->a);
    case A_ELU: return fg_elu(x, p->a);
    case A_SOFTMAX: return fg_softmax_dim(x, p->d0);
    case A_LOG_SOFTMAX: return fg_log_softmax_dim(x, p->d0);
    case A_FLATTEN: return fg_flatten(x, p->d0, p->d1);
    case A_IDENTITY: return x;
    }
    return NULL;
}

static fg_module *make(const char *type, act a) {
    act *p = fg_calloc(1, sizeof *p);
    if (!p) return NULL;
    *p = a;
    return fg_module_new(type, act_fwd, p, fg_free);
}

fg_module *fg_sigmoid_new(void) { return make("Sigmoid", (act){.kind = A_SIGMOID}); }
fg_module *fg_tanh_new(void) { return make("Tanh", (act){.kind = A_TANH}); }
fg_module *fg_silu_new(void) { return make("SiLU", (act){.kind = A_SILU}); }
fg_module *fg_identity_new(void) { return make("Identity", (act){.kind = A_IDENTITY}); }

fg_module *fg_gelu_new_approximate(const char *approximate) {
    if (!approximate || !strcmp(approximate, "none"))
        return make("GELU", (act){.kind = A_GELU_ERF});
    if (!strcmp(approximate, "tanh")) return make("GELU", (act){.kind = A_GELU_TANH});
    fg_error(FG_EINVAL, "gelu_new_approximate: approximate = \"%s\": expected \"none\" or \"tanh\"",
             approximate);
    return NULL;
}

fg_module *fg_softplus_new(double beta, double threshold) {
    if (!(beta != 0)) {
        fg_error(FG_EINVAL, "softplus_new: beta = %g: expected != 0 (PyTorch's default 1)", beta);
        return NULL;
    }
    return make("Softplus", (act){.kind = A_SOFTPLUS, .a = beta, .b = threshold});
}

fg_module *fg_leaky_relu_new(double negative_slope) {
    return make("LeakyReLU", (act){.kind = A_LEAKY, .a = negative_slope});
}

fg_module *fg_elu_new(double alpha) { return make("ELU", (act){.kind = A_ELU, .a = alpha}); }

fg_module *fg_softmax_new(int dim) { return make("Softmax", (act){.kind = A_SOFTMAX, .d0 = dim}); }
fg_module *fg_log_softmax_new(int dim) {
    return make("LogSoftmax", (act){.kind = A_LOG_SOFTMAX, .d0 = dim});
}

fg_module *fg_flatten_new(int start_dim, int end_dim) {
    return make("Flatten", (act){.kind = A_FLATTEN, .d0 = start_dim, .d1 = end_dim});
}
