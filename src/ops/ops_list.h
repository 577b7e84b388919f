/* Every entry of the op table (fulgur/ops.h) once, as an X-macro:
 * X(name, (parameters), P(t) for each tensor parameter, (arguments with
 * T(t) for each tensor)). The registry (ops.c) fills an entry a backend
 * leaves out with a stub naming the op and the device; the guarded
 * device's table (guarded.c) wraps each CPU kernel. An entry added to
 * fg_op_table is added here too (test_ops_guarded checks the count). */
#ifndef FULGUR_OPS_LIST_H
#define FULGUR_OPS_LIST_H

/* clang-format off */
#define FG__OPS_LIST(X) \
    X(matmul, (const fg_tensor *a, bool ta, const fg_tensor *b, bool tb, fg_tensor *c, double alpha, double beta), P(a) P(b) P(c), (T(a), ta, T(b), tb, T(c), alpha, beta)) \
    X(bias_add, (fg_tensor *y, const fg_tensor *bias), P(y) P(bias), (T(y), T(bias))) \
    X(bias_grad, (const fg_tensor *dy, fg_tensor *dbias), P(dy) P(dbias), (T(dy), T(dbias))) \
    X(binary, (fg_binary_op op, const fg_tensor *a, const fg_tensor *b, fg_tensor *y), P(a) P(b) P(y), (op, T(a), T(b), T(y))) \
    X(sum_to, (const fg_tensor *x, fg_tensor *y, double alpha, double beta), P(x) P(y), (T(x), T(y), alpha, beta)) \
    X(axpby, (double alpha, const fg_tensor *x, double beta, fg_tensor *y), P(x) P(y), (alpha, T(x), beta, T(y))) \
    X(scale, (const fg_tensor *x, double s, fg_tensor *y), P(x) P(y), (T(x), s, T(y))) \
    X(sum_all, (const fg_tensor *x, double *out), P(x), (T(x), out)) \
    X(sumsq_all, (const fg_tensor *x, double *out), P(x), (T(x), out)) \
    X(sum_dim, (const fg_tensor *x, int dim, fg_tensor *y, double alpha), P(x) P(y), (T(x), dim, T(y), alpha)) \
    X(sum_dim_bwd, (const fg_tensor *dy, int dim, fg_tensor *dx, double alpha), P(dy) P(dx), (T(dy), dim, T(dx), alpha)) \
    X(relu_fwd, (const fg_tensor *x, fg_tensor *y), P(x) P(y), (T(x), T(y))) \
    X(relu_bwd, (const fg_tensor *x, const fg_tensor *dy, fg_tensor *dx), P(x) P(dy) P(dx), (T(x), T(dy), T(dx))) \
    X(gelu_fwd, (const fg_tensor *x, fg_tensor *y), P(x) P(y), (T(x), T(y))) \
    X(gelu_bwd, (const fg_tensor *x, const fg_tensor *dy, fg_tensor *dx), P(x) P(dy) P(dx), (T(x), T(dy), T(dx))) \
    X(softmax_fwd, (const fg_tensor *x, fg_tensor *y), P(x) P(y), (T(x), T(y))) \
    X(softmax_bwd, (const fg_tensor *y, const fg_tensor *dy, fg_tensor *dx), P(y) P(dy) P(dx), (T(y), T(dy), T(dx))) \
    X(log_softmax_fwd, (const fg_tensor *x, fg_tensor *y), P(x) P(y), (T(x), T(y))) \
    X(log_softmax_bwd, (const fg_tensor *y, const fg_tensor *dy, fg_tensor *dx), P(y) P(dy) P(dx), (T(y), T(dy), T(dx))) \
    X(cross_entropy_fwd, (const fg_tensor *logits, const fg_tensor *targets, int64_t ignore_index, fg_tensor *loss, int64_t *count), P(logits) P(targets) P(loss), (T(logits), T(targets), ignore_index, T(loss), count)) \
    X(cross_entropy_bwd, (const fg_tensor *logits, const fg_tensor *targets, int64_t ignore_index, double dloss, int64_t count, fg_tensor *dlogits), P(logits) P(targets) P(dlogits), (T(logits), T(targets), ignore_index, dloss, count, T(dlogits))) \
    X(cross_entropy_fwd_stats, (const fg_tensor *logits, const fg_tensor *targets, int64_t ignore_index, fg_tensor *loss, int64_t *count, fg_tensor *stats), P(logits) P(targets) P(loss) P(stats), (T(logits), T(targets), ignore_index, T(loss), count, T(stats))) \
    X(cross_entropy_bwd_stats, (const fg_tensor *logits, const fg_tensor *targets, const fg_tensor *stats, int64_t ignore_index, double dloss, int64_t count, fg_tensor *dlogits), P(logits) P(targets) P(stats) P(dlogits), (T(logits), T(targets), T(stats), ignore_index, dloss, count, T(dlogits))) \
    X(layernorm_fwd, (const fg_tensor *x, const fg_tensor *w, const fg_tensor *b, double eps, fg_tensor *y, fg_tensor *mean, fg_tensor *rstd), P(x) P(w) P(b) P(y) P(mean) P(rstd), (T(x), T(w), T(b), eps, T(y), T(mean), T(rstd))) \
    X(layernorm_bwd, (const fg_tensor *x, const fg_tensor *w, const fg_tensor *mean, const fg_tensor *rstd, const fg_tensor *dy, fg_tensor *dx, fg_tensor *dw, fg_tensor *db), P(x) P(w) P(mean) P(rstd) P(dy) P(dx) P(dw) P(db), (T(x), T(w), T(mean), T(rstd), T(dy), T(dx), T(dw), T(db))) \
    X(embedding_fwd, (const fg_tensor *idx, const fg_tensor *weight, fg_tensor *y), P(idx) P(weight) P(y), (T(idx), T(weight), T(y))) \
    X(embedding_bwd, (const fg_tensor *idx, const fg_tensor *dy, fg_tensor *dweight), P(idx) P(dy) P(dweight), (T(idx), T(dy), T(dweight))) \
    X(dropout_fwd, (const fg_tensor *x, double p, uint64_t seed, uint64_t offset, fg_tensor *y), P(x) P(y), (T(x), p, seed, offset, T(y))) \
    X(dropout_bwd, (const fg_tensor *dy, double p, uint64_t seed, uint64_t offset, fg_tensor *dx), P(dy) P(dx), (T(dy), p, seed, offset, T(dx))) \
    X(attention_fwd, (const fg_tensor *qkv, int heads, bool causal, const fg_tensor *kpm, fg_tensor *y, fg_tensor *lse), P(qkv) P(kpm) P(y) P(lse), (T(qkv), heads, causal, T(kpm), T(y), T(lse))) \
    X(attention_bwd, (const fg_tensor *qkv, int heads, bool causal, const fg_tensor *kpm, const fg_tensor *y, const fg_tensor *lse, const fg_tensor *dy, fg_tensor *dqkv), P(qkv) P(kpm) P(y) P(lse) P(dy) P(dqkv), (T(qkv), heads, causal, T(kpm), T(y), T(lse), T(dy), T(dqkv))) \
    X(unary_fwd, (fg_unary_op op, const fg_tensor *x, double a, double b, fg_tensor *y), P(x) P(y), (op, T(x), a, b, T(y))) \
    X(unary_bwd, (fg_unary_op op, const fg_tensor *x, const fg_tensor *y, const fg_tensor *dy, double a, double b, fg_tensor *dx), P(x) P(y) P(dy) P(dx), (op, T(x), T(y), T(dy), a, b, T(dx))) \
    X(add_strided, (const fg_tensor *x, fg_tensor *y), P(x) P(y), (T(x), T(y))) \
    X(where, (const fg_tensor *cond, const fg_tensor *a, const fg_tensor *b, double va, double vb, fg_tensor *y), P(cond) P(a) P(b) P(y), (T(cond), T(a), T(b), va, vb, T(y))) \
    X(index_select, (const fg_tensor *x, int dim, const fg_tensor *idx, fg_tensor *y), P(x) P(idx) P(y), (T(x), dim, T(idx), T(y))) \
    X(index_add, (const fg_tensor *dy, int dim, const fg_tensor *idx, fg_tensor *dx), P(dy) P(idx) P(dx), (T(dy), dim, T(idx), T(dx))) \
    X(gather, (const fg_tensor *x, int dim, const fg_tensor *idx, fg_tensor *y), P(x) P(idx) P(y), (T(x), dim, T(idx), T(y))) \
    X(scatter_add, (const fg_tensor *src, int dim, const fg_tensor *idx, fg_tensor *y), P(src) P(idx) P(y), (T(src), dim, T(idx), T(y))) \
    X(max_dim, (const fg_tensor *x, int dim, bool is_min, fg_tensor *y, fg_tensor *idx), P(x) P(y) P(idx), (T(x), dim, is_min, T(y), T(idx))) \
    X(cumsum, (const fg_tensor *x, int dim, bool reverse, fg_tensor *y), P(x) P(y), (T(x), dim, reverse, T(y))) \
    X(pointwise_loss_fwd, (fg_loss_op op, const fg_tensor *x, const fg_tensor *t, const fg_tensor *w, double p, fg_tensor *y), P(x) P(t) P(w) P(y), (op, T(x), T(t), T(w), p, T(y))) \
    X(pointwise_loss_bwd, (fg_loss_op op, const fg_tensor *x, const fg_tensor *t, const fg_tensor *w, double p, const fg_tensor *dy, fg_tensor *dx, fg_tensor *dt), P(x) P(t) P(w) P(dy) P(dx) P(dt), (op, T(x), T(t), T(w), p, T(dy), T(dx), T(dt))) \
    X(nll_fwd, (const fg_tensor *logp, const fg_tensor *t, const fg_tensor *w, int64_t ignore, double eps, fg_tensor *y, double *wsum), P(logp) P(t) P(w) P(y), (T(logp), T(t), T(w), ignore, eps, T(y), wsum)) \
    X(nll_bwd, (const fg_tensor *t, const fg_tensor *w, int64_t ignore, double eps, const fg_tensor *dy, fg_tensor *dlogp), P(t) P(w) P(dy) P(dlogp), (T(t), T(w), ignore, eps, T(dy), T(dlogp))) \
    X(conv2d_fwd, (const fg_tensor *x, const fg_tensor *w, const fg_tensor *b, const fg_conv_params *p, fg_tensor *y), P(x) P(w) P(b) P(y), (T(x), T(w), T(b), p, T(y))) \
    X(conv2d_bwd_data, (const fg_tensor *dy, const fg_tensor *w, const fg_conv_params *p, fg_tensor *dx), P(dy) P(w) P(dx), (T(dy), T(w), p, T(dx))) \
    X(conv2d_bwd_weight, (const fg_tensor *x, const fg_tensor *dy, const fg_conv_params *p, fg_tensor *dw, fg_tensor *db), P(x) P(dy) P(dw) P(db), (T(x), T(dy), p, T(dw), T(db))) \
    X(pool2d_fwd, (const fg_tensor *x, const fg_pool_params *p, fg_tensor *y, fg_tensor *idx), P(x) P(y) P(idx), (T(x), p, T(y), T(idx))) \
    X(pool2d_bwd, (const fg_tensor *dy, const fg_tensor *idx, const fg_pool_params *p, fg_tensor *dx), P(dy) P(idx) P(dx), (T(dy), T(idx), p, T(dx))) \
    X(batch_norm_stats, (const fg_tensor *x, double *mean, double *var), P(x), (T(x), mean, var)) \
    X(batch_norm_fwd, (const fg_tensor *x, const double *mean, const double *invstd, const fg_tensor *w, const fg_tensor *b, fg_tensor *y), P(x) P(w) P(b) P(y), (T(x), mean, invstd, T(w), T(b), T(y))) \
    X(batch_norm_bwd, (const fg_tensor *x, const fg_tensor *dy, const double *mean, const double *invstd, const fg_tensor *w, fg_tensor *dx, fg_tensor *dw, fg_tensor *db, bool dx_overwrite), P(x) P(dy) P(w) P(dx) P(dw) P(db), (T(x), T(dy), mean, invstd, T(w), T(dx), T(dw), T(db), dx_overwrite))

/* clang-format on */

#endif
