/* The elementwise functions of one tensor through the table's unary_fwd /
 * unary_bwd (exp, log, sqrt, rsqrt, pow, abs, clamp, sigmoid, tanh, SiLU,
 * GELU in both of PyTorch's forms, softplus, leaky ReLU, ELU), and softmax
 * / log-softmax over any dim. Each keeps its (contiguous) input and reads
 * its output in backward where the derivative is cheaper from it. */
#include <math.h>
#include <string.h>

#include "autograd_impl.h"

/* saved[0] = contiguous input; i[0] = op; f[0], f[1] = its parameters */
static FG_MUST_USE fg_status unary_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *ga = fg__grad_of(n->in[0]);
    if (!ga) return FG_ENOMEM;
    return fg__ops(g)->unary_bwd((fg_unary_op)n->i[0], n->saved[0], n->out, g, n->f[0], n->f[1],
                                 ga);
}

static fg_tensor *unary(const char *fn, fg_unary_op op, fg_tensor *a, double pa, double pb) {
    if (fg__check_float(fn, a)) return NULL;
    const fg_op_table *ops = fg__ops(a);
    if (!ops || FG_OP(ops, unary_fwd)) return NULL;
    fg_tensor *ac = fg_tensor_contiguous(a);
    fg_tensor *y = ac ? fg_empty_like(ac) : NULL;
    if (!y || ops->unary_fwd(op, ac, pa, pb, y)) return NULL;
    fg__node *node;
    if (fg__record(&node, fn, unary_bw, y, 1, &a)) return NULL;
    if (node) {
        if (FG_OP(ops, unary_bwd)) return NULL;
        node->saved[0] = ac;
        node->i[0] = op;
        node->f[0] = pa;
        node->f[1] = pb;
    }
    return y;
}

fg_tensor *fg_exp(fg_tensor *a) { return unary("exp", FG_UN_EXP, a, 0, 0); }
fg_tensor *fg_log_tensor(fg_tensor *a) { return unary("log", FG_UN_LOG, a, 0, 0); }
fg_tensor *fg_sqrt(fg_tensor *a) { return unary("sqrt", FG_UN_SQRT, a, 0, 0); }
fg_tensor *fg_rsqrt(fg_tensor *a) { return unary("rsqrt", FG_UN_RSQRT, a, 0, 0); }
fg_tensor *fg_pow(fg_tensor *a, double exponent) { return unary("pow", FG_UN_POW, a, exponent, 0); }
fg_tensor *fg_abs(fg_tensor *a) { return unary("abs", FG_UN_ABS, a, 0, 0); }

fg_tensor *fg_clamp(fg_tensor *a, double min, double max) {
    /* NaN is "no bound", as PyTorch's None */
    return unary("clamp", FG_UN_CLAMP, a, isnan(min) ? -INFINITY : min,
                 isnan(max) ? INFINITY : max);
}

fg_tensor *fg_sigmoid(fg_tensor *a) { return unary("sigmoid", FG_UN_SIGMOID, a, 0, 0); }
fg_tensor *fg_tanh(fg_tensor *a) { return unary("tanh", FG_UN_TANH, a, 0, 0); }
fg_tensor *fg_silu(fg_tensor *a) { return unary("silu", FG_UN_SILU, a, 0, 0); }

fg_tensor *fg_gelu_approximate(fg_tensor *a, const char *approximate) {
    if (!approximate || !strcmp(approximate, "none")) return unary("gelu", FG_UN_GELU_ERF, a, 0, 0);
    if (!strcmp(approximate, "tanh")) return fg_gelu(a);
    fg_error(FG_EINVAL, "gelu: approximate = \"%s\": expected \"none\" or \"tanh\"", approximate);
    return NULL;
}

fg_tensor *fg_softplus(fg_tensor *a, double beta, double threshold) {
    if (!(beta != 0) || isnan(threshold)) {
        fg_error(FG_EINVAL,
                 "softplus: beta = %g, threshold = %g: expected beta != 0 (PyTorch's "
                 "defaults are 1 and 20)",
                 beta, threshold);
        return NULL;
    }
    return unary("softplus", FG_UN_SOFTPLUS, a, beta, threshold);
}

fg_tensor *fg_leaky_relu(fg_tensor *a, double negative_slope) {
    return unary("leaky_relu", FG_UN_LEAKY_RELU, a, negative_slope, 0);
}

fg_tensor *fg_elu(fg_tensor *a, double alpha) { return unary("elu", FG_UN_ELU, a, alpha, 0); }

/* ------------------------------------------------- softmax over any dim */

static fg_tensor *softmax_any(const char *fn, fg_tensor *a, int dim, bool log) {
    if (fg__check_float(fn, a)) return NULL;
    int nd = a->ndim, d = dim < 0 ? dim + nd : dim;
    if (nd == 0 ? !(dim == 0 || dim == -1) : (d < 0 || d >= nd)) {
        char s[96];
        fg_error(FG_EINVAL, "%s: dim %d is out of range for %s", fn, dim,
                 fg_tensor_describe(a, s, sizeof s));
        return NULL;
    }
    if (nd == 0 || d == nd - 1) return log ? fg_log_softmax(a) : fg_softmax(a);
    fg_tensor *t = fg_transpose(a, d, nd - 1);
    t = log ? fg_log_softmax(t) : fg_softmax(t);
    return fg_transpose(t, d, nd - 1);
}

fg_tensor *fg_softmax_dim(fg_tensor *a, int dim) { return softmax_any("softmax", a, dim, false); }
fg_tensor *fg_log_softmax_dim(fg_tensor *a, int dim) {
    return softmax_any("log_softmax", a, dim, true);
}
