/* The losses beside fg_cross_entropy, with PyTorch's reductions:
 * mse, l1, smooth_l1, huber, binary_cross_entropy (weight),
 * binary_cross_entropy_with_logits (weight, pos_weight) and kl_div are
 * the table's elementwise pointwise_loss (one node, gradients into the
 * input and, when it requires grad, the target), then a recorded sum or
 * mean; nll_loss and cross_entropy_ex (class weights, ignore_index, label
 * smoothing) are the nll rows over log-probabilities (M, C), summed and
 * divided by the weight of the rows that count. cross_entropy_ex with the
 * default options is fg_cross_entropy itself: the same bits. */
#include <string.h>

#include "autograd_impl.h"

fg_class_loss_opts fg_class_loss_defaults(void) {
    return (fg_class_loss_opts){
        .weight = NULL, .ignore_index = -100, .reduction = FG_REDUCTION_MEAN, .label_smoothing = 0};
}

/* t as kept for backward: a contiguous step tensor (a persistent one is
 * copied: the caller may refill its batch before backward). */
static fg_tensor *keep(fg_tensor *t) {
    fg_tensor *c = fg_tensor_contiguous(t);
    if (c && c == t && fg_tensor_is_persistent(t)) {
        c = fg_empty(t->dtype, t->ndim, t->shape);
        if (c && fg_tensor_copy(c, t)) return NULL;
    }
    return c;
}

static fg_tensor *reduce(const char *fn, fg_tensor *y, fg_reduction r, int64_t batch) {
    switch (r) {
    case FG_REDUCTION_NONE: return y;
    case FG_REDUCTION_SUM: return fg_sum(y);
    case FG_REDUCTION_MEAN: return fg_mean(y);
    case FG_REDUCTION_BATCHMEAN: return fg_scale(fg_sum(y), 1.0 / (double)batch);
    }
    fg_error(FG_EINVAL, "%s: reduction %d: expected FG_REDUCTION_MEAN, _SUM or _NONE", fn, (int)r);
    return NULL;
}

/* in = {x, t}; saved[0], [1], [2] = x, t, w as the kernel reads them;
 * i[0] = op; f[0] = p */
static FG_MUST_USE fg_status ploss_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *dx = NULL, *dt = NULL;
    if (fg__needs_grad(n->in[0]) && !(dx = fg__grad_of(n->in[0]))) return FG_ENOMEM;
    if (fg__needs_grad(n->in[1]) && !(dt = fg__grad_of(n->in[1]))) return FG_ENOMEM;
    return fg__ops(g)->pointwise_loss_bwd((fg_loss_op)n->i[0], n->saved[0], n->saved[1],
                                          n->saved[2], n->f[0], g, dx, dt);
}

/* the unreduced loss; w (pos_weight) already of x's shape or NULL */
static fg_tensor *ploss(const char *fn, fg_loss_op op, fg_tensor *x, fg_tensor *t, fg_tensor *w,
                        double p) {
    if (fg__check_float(fn, x) || fg__check_float(fn, t)) return NULL;
    /* autocast keeps the losses in f32 */
    if (!(x = fg__autocast_f32(x)) || !(t = fg__autocast_f32(t))) return NULL;
    if (!fg_tensor_same_shape(x, t) || x->dtype != t->dtype) {
        char a[96], b[96];
        fg_error(FG_EINVAL, "%s: input %s and target %s: expected one shape and dtype", fn,
                 fg_tensor_describe(x, a, sizeof a), fg_tensor_describe(t, b, sizeof b));
        return NULL;
    }
    const fg_op_table *ops = fg__ops(x);
    if (!ops || FG_OP(ops, pointwise_loss_fwd)) return NULL;
    fg_tensor *xc = fg_tensor_contiguous(x), *tc = xc ? keep(t) : NULL;
    fg_tensor *y = tc ? fg_empty_like(xc) : NULL;
    if (!y || ops->pointwise_loss_fwd(op, xc, tc, w, p, y)) return NULL;
    fg__node *node;
    fg_tensor *in[2] = {x, t};
    if (fg__record(&node, fn, ploss_bw, y, 2, in)) return NULL;
    if (node) {
        if (FG_OP(ops, pointwise_loss_bwd)) return NULL;
        node->saved[0] = xc;
        node->saved[1] = tc;
        node->saved[2] = w;
        node->i[0] = op;
        node->f[0] = p;
    }
    return y;
}

static int64_t batch_of(const fg_tensor *x) { return x && x->ndim ? x->shape[0] : 1; }

static bool no_batchmean(const char *fn, fg_reduction r) {
    if (r != FG_REDUCTION_BATCHMEAN) return true;
    fg_error(FG_EINVAL, "%s: FG_REDUCTION_BATCHMEAN is kl_div's alone", fn);
    return false;
}

fg_tensor *fg_mse_loss(fg_tensor *x, fg_tensor *t, fg_reduction r) {
    if (!no_batchmean("mse_loss", r)) return NULL;
    return reduce("mse_loss", ploss("mse_loss", FG_LOSS_MSE, x, t, NULL, 0), r, 1);
}

fg_tensor *fg_l1_loss(fg_tensor *x, fg_tensor *t, fg_reduction r) {
    if (!no_batchmean("l1_loss", r)) return NULL;
    return reduce("l1_loss", ploss("l1_loss", FG_LOSS_L1, x, t, NULL, 0), r, 1);
}

fg_tensor *fg_smooth_l1_loss(fg_tensor *x, fg_tensor *t, fg_reduction r, double beta) {
    if (!no_batchmean("smooth_l1_loss", r)) return NULL;
    if (!(beta >= 0)) {
        fg_error(FG_EINVAL, "smooth_l1_loss: beta = %g: expected >= 0 (PyTorch's default 1)", beta);
        return NULL;
    }
    fg_loss_op op = beta == 0 ? FG_LOSS_L1 : FG_LOSS_SMOOTH_L1; /* PyTorch: beta 0 is L1 */
    return reduce("smooth_l1_loss", ploss("smooth_l1_loss", op, x, t, NULL, beta), r, 1);
}

fg_tensor *fg_huber_loss(fg_tensor *x, fg_tensor *t, fg_reduction r, double delta) {
    if (!no_batchmean("huber_loss", r)) return NULL;
    if (!(delta > 0)) {
        fg_error(FG_EINVAL, "huber_loss: delta = %g: expected > 0 (PyTorch's default 1)", delta);
        return NULL;
    }
    return reduce("huber_loss", ploss("huber_loss", FG_LOSS_HUBER, x, t, NULL, delta), r, 1);
}

fg_tensor *fg_binary_cross_entropy(fg_tensor *x, fg_tensor *t, fg_tensor *weight, fg_reduction r) {
    if (!no_batchmean("binary_cross_entropy", r)) return NULL;
    fg_tensor *y = ploss("binary_cross_entropy", FG_LOSS_BCE, x, t, NULL, 0);
    if (y && weight) y = fg_mul(y, weight);
    return reduce("binary_cross_entropy", y, r, 1);
}

fg_tensor *fg_binary_cross_entropy_with_logits(fg_tensor *x, fg_tensor *t, fg_tensor *weight,
                                               fg_tensor *pos_weight, fg_reduction r) {
    const char *fn = "binary_cross_entropy_with_logits";
    if (!no_batchmean(fn, r) || fg__check_float(fn, x) || !(x = fg__autocast_f32(x))) return NULL;
    fg_tensor *pw = NULL;
    if (pos_weight) { /* broadcast to x's shape, as a constant (no gradient) */
        if (fg__check_float(fn, pos_weight) || fg__check_same_dtype(fn, x, pos_weight)) return NULL;
        bool prev = fg_set_grad_enabled(false);
        pw = fg_expand(pos_weight, x->ndim, x->shape);
        fg_set_grad_enabled(prev);
        if (!pw) return NULL;
    }
    fg_tensor *y = ploss(fn, FG_LOSS_BCE_LOGITS, x, t, pw, 0);
    if (y && weight) y = fg_mul(y, weight);
    return reduce(fn, y, r, 1);
}

fg_tensor *fg_kl_div(fg_tensor *x, fg_tensor *t, fg_reduction r, bool log_target) {
    fg_tensor *y = ploss("kl_div", FG_LOSS_KL_DIV, x, t, NULL, log_target ? 1 : 0);
    return reduce("kl_div", y, r, batch_of(x));
}

/* ------------------------------------------------------ class losses */

/* saved[0] = targets (M); saved[1] = weight or NULL; i[0] = ignore_index;
 * f[0] = label smoothing */
static FG_MUST_USE fg_status nll_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *gl = fg__grad_of(n->in[0]);
    if (!gl) return FG_ENOMEM;
    return fg__ops(g)->nll_bwd(n->saved[0], n->saved[1], n->i[0], n->f[0], g, gl);
}

/* the loss of logp2 (M, C) against t1 (M); tnd, tshape: the targets'
 * shape for reduction none */
static fg_tensor *nll_rows(const char *fn, fg_tensor *logp2, fg_tensor *t1,
                           const fg_class_loss_opts *o, int tnd, const int64_t *tshape) {
    if (fg__check_float(fn, logp2)) return NULL;
    const fg_op_table *ops = fg__ops(logp2);
    if (!ops || FG_OP(ops, nll_fwd)) return NULL;
    fg_tensor *w = NULL;
    if (o->weight) {
        if (fg__check_float(fn, o->weight) || !(w = keep(o->weight))) return NULL;
        if (w->dtype != logp2->dtype) {
            fg_error(FG_EINVAL, "%s: class weights are %s, the input %s", fn,
                     fg_dtype_name(w->dtype), fg_dtype_name(logp2->dtype));
            return NULL;
        }
    }
    if (!(o->label_smoothing >= 0 && o->label_smoothing <= 1)) {
        fg_error(FG_EINVAL, "%s: label_smoothing = %g: expected a value in [0, 1]", fn,
                 o->label_smoothing);
        return NULL;
    }
    if (o->reduction == FG_REDUCTION_BATCHMEAN || (unsigned)o->reduction > FG_REDUCTION_BATCHMEAN) {
        fg_error(FG_EINVAL, "%s: reduction %d: expected FG_REDUCTION_MEAN, _SUM or _NONE", fn,
                 (int)o->reduction);
        return NULL;
    }
    fg_tensor *tk = keep(t1);
    int64_t M = logp2->shape[0];
    fg_tensor *rows = tk ? fg_empty(logp2->dtype, 1, &M) : NULL;
    double wsum = 0;
    if (!rows || ops->nll_fwd(logp2, tk, w, o->ignore_index, o->label_smoothing, rows, &wsum))
        return NULL;
    fg__node *node;
    if (fg__record(&node, fn, nll_bw, rows, 1, &logp2)) return NULL;
    if (node) {
        if (FG_OP(ops, nll_bwd)) return NULL;
        node->saved[0] = tk;
        node->saved[1] = w;
        node->i[0] = o->ignore_index;
        node->f[0] = o->label_smoothing;
    }
    switch (o->reduction) {
    case FG_REDUCTION_NONE: return fg_reshape(rows, tnd, tshape);
    case FG_REDUCTION_SUM: return fg_sum(rows);
    default: /* the mean over no counted target is 0, as fg_cross_entropy's */
        return fg_scale(fg_sum(rows), wsum > 0 ? 1.0 / wsum : 0.0);
    }
}

/* input (C), (N, C) or (N, C, d1, ...) with targets (), (N), (N, d1, ...)
 * as PyTorch's: *x2 gets the input with the classes last as (M, C) (a
 * permuted copy for more than 2 dims), *t1 the targets as (M). */
static FG_MUST_USE fg_status class_layout(const char *fn, fg_tensor *x, fg_tensor *t,
                                          fg_tensor **xl, fg_tensor **x2, fg_tensor **t1) {
    if (!t) return fg_error_wrap(FG_EINVAL, "%s: NULL targets (an earlier call failed)", fn);
    char sx[96], st[96];
    bool ok = x->ndim >= 1 && t->dtype == FG_I32 && t->ndim == (x->ndim == 1 ? 0 : x->ndim - 1);
    for (int d = 0; ok && d < t->ndim; d++) ok = t->shape[d] == x->shape[d == 0 ? 0 : d + 1];
    if (!ok)
        return fg_error(FG_EINVAL,
                        "%s: input %s and targets %s: expected (C) with (), (N, C) with (N) or "
                        "(N, C, d1, ...) with (N, d1, ...), i32 targets",
                        fn, fg_tensor_describe(x, sx, sizeof sx),
                        fg_tensor_describe(t, st, sizeof st));
    fg_tensor *xcl = x; /* classes last */
    if (x->ndim > 2) {
        int perm[FG_MAX_DIMS];
        perm[0] = 0;
        for (int d = 2; d < x->ndim; d++) perm[d - 1] = d;
        perm[x->ndim - 1] = 1;
        if (!(xcl = fg_permute(x, perm))) return fg_error_wrap(FG_ENOMEM, "%s: permute", fn);
    }
    int64_t C = x->shape[x->ndim == 1 ? 0 : 1], M = t->numel;
    *xl = xcl;
    *x2 = fg_reshape(xcl, 2, (int64_t[]){M, C});
    fg_tensor *tc = fg_tensor_contiguous(t);
    *t1 = tc ? fg_tensor_reshape_view(tc, 1, &M) : NULL;
    if (!*x2 || !*t1) return fg_error_wrap(FG_ENOMEM, "%s: reshape", fn);
    return FG_OK;
}

fg_tensor *fg_nll_loss(fg_tensor *logp, fg_tensor *targets, const fg_class_loss_opts *opts) {
    fg_class_loss_opts o = opts ? *opts : fg_class_loss_defaults();
    fg_tensor *xl, *x2, *t1;
    if (fg__check_float("nll_loss", logp) || !(logp = fg__autocast_f32(logp)) ||
        class_layout("nll_loss", logp, targets, &xl, &x2, &t1))
        return NULL;
    return nll_rows("nll_loss", x2, t1, &o, targets->ndim, targets->shape);
}

fg_tensor *fg_cross_entropy_ex(fg_tensor *logits, fg_tensor *targets,
                               const fg_class_loss_opts *opts) {
    fg_class_loss_opts o = opts ? *opts : fg_class_loss_defaults();
    fg_tensor *xl, *x2, *t1;
    if (fg__check_float("cross_entropy", logits) ||
        class_layout("cross_entropy", logits, targets, &xl, &x2, &t1))
        return NULL;
    if (!o.weight && o.label_smoothing == 0 && o.reduction == FG_REDUCTION_MEAN)
        return fg_cross_entropy(x2, t1, o.ignore_index); /* the fused kernel, its bits */
    /* autocast keeps it in f32, as fg_cross_entropy */
    return nll_rows("cross_entropy", fg_log_softmax(x2), t1, &o, targets->ndim, targets->shape);
}
