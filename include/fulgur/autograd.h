/* fulgur autograd: differentiable functions on tensors, a define-by-run tape,
 * backward, no-grad mode, gradient accumulation and the per-parameter
 * "gradient ready" hook.
 *
 * Every function below returns a new step tensor (or NULL with
 * fg_last_error set, and NULL inputs propagate: fg_relu(NULL) is NULL, so a
 * chain of calls can be checked once at its end). When grad mode is on and
 * an input requires grad, the call is recorded on this thread's tape; the
 * tape lives in the step arena and is dropped by fg_step_reset.
 *
 * Gradients: a leaf that requires grad (a parameter) accumulates into its
 * persistent .grad tensor across backward calls until zeroed (gradient
 * accumulation); the module layer makes .grad a view into one flat buffer.
 * Intermediate tensors get step gradients, freed with the step. */
#ifndef FULGUR_AUTOGRAD_H
#define FULGUR_AUTOGRAD_H

#include "fulgur/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- grad state */

FG_API void fg_tensor_set_requires_grad(fg_tensor *t, bool on);
FG_API bool fg_tensor_requires_grad(const fg_tensor *t);
/* The gradient of t (NULL before any backward reached it). A leaf's (a
 * parameter, a step tensor made with requires_grad) stays until zeroed; a
 * non-leaf's (the output of a recorded op) is NULL again once the node
 * that made t has run in backward (its memory goes to the gradients still
 * to come), as PyTorch's .grad of a non-leaf is None. */
FG_API fg_tensor *fg_tensor_grad(const fg_tensor *t);
/* Makes `grad` (persistent, same shape and dtype, borrowed for t's life)
 * the tensor t's gradient accumulates into: how a module points every
 * parameter's gradient into one flat buffer. */
FG_API FG_MUST_USE fg_status fg_tensor_set_grad(fg_tensor *t, fg_tensor *grad);
/* Zeroes t's gradient if it has one. */
FG_API void fg_tensor_zero_grad(fg_tensor *t);
/* A name for messages and hooks (borrowed; parameters get dotted names). */
FG_API void fg_tensor_set_name(fg_tensor *t, const char *name);
FG_API const char *fg_tensor_name(const fg_tensor *t);

/* Grad mode of the calling thread (on by default). Returns the previous mode,
 * so `bool prev = fg_set_grad_enabled(false); ...; fg_set_grad_enabled(prev);`
 * is a no-grad block. */
FG_API bool fg_set_grad_enabled(bool on);
FG_API bool fg_is_grad_enabled(void);

/* Back-propagates from a one-element `loss` (seed gradient 1), or from any
 * tensor with a given seed gradient of the same shape. Accumulates into the
 * gradients of every leaf that requires grad and was used. The recorded graph
 * is consumed: a second backward over it is FG_ESTATE. */
FG_API FG_MUST_USE fg_status fg_backward(fg_tensor *loss);
FG_API FG_MUST_USE fg_status fg_backward_with(fg_tensor *out, const fg_tensor *seed_grad);

/* Called during backward as soon as a leaf's gradient is final for this
 * backward (its last use on the tape was processed): DDP starts a bucket's
 * reduction from it. Leaves the backward did not reach are not reported.
 * Per thread; NULL removes it. */
typedef void (*fg_grad_ready_fn)(void *ud, fg_tensor *leaf);
FG_API void fg_set_grad_ready_hook(fg_grad_ready_fn fn, void *ud);

/* Activation checkpointing (torch.utils.checkpoint with preserved RNG
 * state): returns fn(x, ud) without keeping the step tensors fn made on the
 * way (they are released at once), and in backward runs fn(x, ud) again to
 * back-propagate through it, then releases those again. Gradients are
 * bitwise those of calling fn directly: the recomputation sees the same
 * input, the same autocast setting and the same dropout masks (a Dropout
 * module's draws are replayed; fg_dropout with an explicit offset is the
 * same by itself). fn must compute the same thing both times from x, ud and
 * the parameters (persistent tensors) it reads, and must not keep pointers
 * to its step tensors; it may return a view of a tensor it made. The
 * parameters it uses get their gradients during the recomputation, and are
 * reported to the "gradient ready" hook then. Without grad mode it is just
 * fn(x, ud); inside a checkpointed fn, too (the outer one recomputes it).
 * The cost: fn runs twice; the saving: fn's activations exist for one
 * checkpoint at a time in backward, none in forward (fg_step_peak_bytes).
 * NULL with fg_last_error (fn's, wrapped) on failure; a recomputation that
 * differs (another output shape, another number of random draws) fails the
 * backward with FG_ESTATE. */
typedef fg_tensor *(*fg_checkpoint_fn)(fg_tensor *x, void *ud);
FG_API fg_tensor *fg_checkpoint(fg_checkpoint_fn fn, fg_tensor *x, void *ud);

/* Number of nodes on this thread's tape (tests, debugging). */
FG_API int64_t fg_tape_size(void);

/* ---------------------------------------------------------------- autocast */

/* Autocast of the calling thread, as PyTorch's CPU autocast. While it is
 * FG_BF16 or FG_F16:
 *   - fg_matmul, fg_linear and fg_attention take f32 inputs (or
 *     inputs already in that dtype) in that dtype: operands rounded to it,
 *     products accumulated in f32, the output in that dtype, rounded once
 *     (a bias added in f32 before). Gradients flow back in the dtype of the
 *     tensor they belong to: an f32 parameter's gradient stays f32. bf16
 *     products run on oneDNN's bf16 matmul or its f32 fallback
 *     (fg_matmul_bf16_path); f16 has no GEMM here (f16 operands, f32
 *     products: f16's numerics, not speed);
 *   - layer norm, softmax, log-softmax, cross-entropy and the reductions
 *     cast a bf16/f16 input to f32 first and return f32;
 *   - everything else (add, mul, GELU, ReLU, dropout, embedding) runs in
 *     its inputs' dtype: bf16 after a product, so that the activations a
 *     step keeps take half the memory; a bf16/f16 tensor with an f32 one
 *     gives f32.
 * The setting is read when a function runs forward;
 * its backward uses the dtype of that forward, whatever the setting is by
 * then. FG_DTYPE_DEFAULT or FG_F32 turns it off (the default). *prev (may
 * be NULL) gets the previous setting, so that
 *   fg_dtype prev; fg_autocast_set(FG_BF16, &prev); ...; fg_autocast_set(prev, NULL);
 * is a region. FG_EINVAL for any other dtype (nothing changes). */
FG_API FG_MUST_USE fg_status fg_autocast_set(fg_dtype dt, fg_dtype *prev);
/* The calling thread's autocast dtype: FG_BF16, FG_F16, or
 * FG_DTYPE_DEFAULT when off. */
FG_API fg_dtype fg_autocast_dtype(void);

/* ------------------------------------------------------- differentiable ops */

/* (..., M, K) @ (K, N) -> (..., M, N); or batched (..., M, K) @ (..., K, N). */
FG_API fg_tensor *fg_matmul(fg_tensor *a, fg_tensor *b);
/* x (..., in) @ w (out, in)^T + b (out) -> (..., out); b may be NULL. */
FG_API fg_tensor *fg_linear(fg_tensor *x, fg_tensor *w, fg_tensor *b);
/* Elementwise with numpy broadcasting. */
FG_API fg_tensor *fg_add(fg_tensor *a, fg_tensor *b);
FG_API fg_tensor *fg_sub(fg_tensor *a, fg_tensor *b);
FG_API fg_tensor *fg_mul(fg_tensor *a, fg_tensor *b);
FG_API fg_tensor *fg_scale(fg_tensor *a, double s);
/* Sum / mean of all elements -> 0-d (the mean of no element is NaN). */
FG_API fg_tensor *fg_sum(fg_tensor *a);
FG_API fg_tensor *fg_mean(fg_tensor *a);
/* Sum / mean over one dim (negative counts from the end), keepdim as PyTorch. */
FG_API fg_tensor *fg_sum_dim(fg_tensor *a, int dim, bool keepdim);
FG_API fg_tensor *fg_mean_dim(fg_tensor *a, int dim, bool keepdim);
/* Shape changes (one dim may be -1); transpose swaps two dims (the result is
 * contiguous: a copy). reshape of a contiguous tensor is a view sharing its
 * memory (recorded, so gradients flow); any dtype may be reshaped or
 * transposed (i32 targets too). */
FG_API fg_tensor *fg_reshape(fg_tensor *a, int ndim, const int64_t *shape);
FG_API fg_tensor *fg_transpose(fg_tensor *a, int d0, int d1);
FG_API fg_tensor *fg_relu(fg_tensor *a);
/* relu in a's own memory (PyTorch's relu_, ReLU(inplace=True)), which spares
 * a step tensor of a's size: where a is the output of the last function
 * recorded on this thread, one whose backward does not read it (add, sub,
 * batch norm in training on the CPU), so that no gradient needs a's values.
 * Elsewhere (grad mode off included) it is fg_relu and a is unchanged: use
 * the result, not a. */
FG_API fg_tensor *fg_relu_(fg_tensor *a);
FG_API fg_tensor *fg_gelu(fg_tensor *a); /* tanh approximation */
/* Over the last dim. */
FG_API fg_tensor *fg_softmax(fg_tensor *a);
FG_API fg_tensor *fg_log_softmax(fg_tensor *a);
/* Mean cross-entropy of logits (..., V) against i32 targets (...); targets
 * equal to ignore_index (PyTorch's default is -100) do not count. -> 0-d.
 * targets must have the leading dims of logits; one outside [0, V) that is
 * not ignore_index is FG_EINVAL naming it. With every target ignored the
 * loss is 0 and its gradient 0 (PyTorch gives NaN). Fused and stable: no
 * softmax tensor is kept; backward recomputes it per row. */
FG_API fg_tensor *fg_cross_entropy(fg_tensor *logits, fg_tensor *targets, int64_t ignore_index);
/* Over the last dim, as PyTorch's layer_norm (biased variance, eps added
 * to it); w, b (C) may each be NULL; eps >= 0. */
FG_API fg_tensor *fg_layer_norm(fg_tensor *x, fg_tensor *w, fg_tensor *b, double eps);
/* idx i32 (...) into weight (V, C) -> (..., C); an index outside [0, V) is
 * FG_EINVAL naming it and V. */
FG_API fg_tensor *fg_embedding(fg_tensor *idx, fg_tensor *weight);
/* Inverted dropout with a counter-based mask at (seed, offset): element i
 * is kept (and scaled by 1 / (1 - p)) when draw offset + i of stream seed
 * (fg_rng_u32_at) is >= p * 2^32, so the mask is the same on any thread
 * count; callers advance offset by numel between calls. Returns x itself
 * when p == 0; p outside [0, 1) is FG_EINVAL. */
FG_API fg_tensor *fg_dropout(fg_tensor *x, double p, uint64_t seed, uint64_t offset);
/* A copy of a converted to dt (a float dtype: f64, f32, bf16, f16),
 * rounded to nearest even; the gradient flows back converted to a's dtype.
 * Returns a itself when it already has dt. Not a kernel of autocast's
 * products (they round their operands inside, see fg_autocast_set): for
 * programs that want a tensor in another dtype. */
FG_API fg_tensor *fg_cast(fg_tensor *a, fg_dtype dt);
/* Self-attention of a packed qkv (B, T, 3C) with `heads` heads -> (B, T, C):
 * q, k and v are the three column blocks of C, split into heads of C/heads,
 * softmax(q k^T / sqrt(C/heads)) v per head, heads joined. Row t sees keys
 * 0..t when causal (PyTorch's scaled_dot_product_attention(is_causal=True)),
 * all T keys when not, less those key_padding_mask (B, T) (u8 or i32, or
 * NULL) marks nonzero in its batch entry, as MultiheadAttention's; a row
 * left without keys is NaN, as PyTorch's. Fused: the (T, T) scores are
 * never kept, the backward recomputes them from qkv. */
FG_API fg_tensor *fg_attention(fg_tensor *qkv, int heads, bool causal, fg_tensor *key_padding_mask);
/* fg_attention(qkv, heads, true, NULL) */
FG_API fg_tensor *fg_causal_attention(fg_tensor *qkv, int heads);

/* ------------------------------------- more ops (PyTorch's names and rules) */
/* CPU; f32 and f64, and bf16/f16 (each kernel in f32, its output rounded
 * once) but in nll_loss. Every result is a new contiguous tensor, also where
 * PyTorch returns a view (narrow, slice, permute, expand, split): the
 * values are copied once and gradients flow as through the view. Index
 * and mask tensors are i32 (masks also u8; nonzero is true); an index out
 * of range is FG_EINVAL naming it. dims count from the end when negative. */

/* a / b with numpy broadcasting. */
FG_API fg_tensor *fg_div(fg_tensor *a, fg_tensor *b);
FG_API fg_tensor *fg_exp(fg_tensor *a);
/* torch.log (fg_log is the library's logger, core.h). */
FG_API fg_tensor *fg_log_tensor(fg_tensor *a);
FG_API fg_tensor *fg_sqrt(fg_tensor *a);
FG_API fg_tensor *fg_rsqrt(fg_tensor *a);
/* a ** exponent; the gradient of exponent 0 is 0, as PyTorch's. */
FG_API fg_tensor *fg_pow(fg_tensor *a, double exponent);
/* The gradient at 0 is 0. */
FG_API fg_tensor *fg_abs(fg_tensor *a);
/* To [min, max]; NaN (or -INFINITY / INFINITY) for no bound; NaN input
 * stays NaN; min > max gives max. The gradient passes where min <= a <= max. */
FG_API fg_tensor *fg_clamp(fg_tensor *a, double min, double max);
FG_API fg_tensor *fg_sigmoid(fg_tensor *a);
FG_API fg_tensor *fg_tanh(fg_tensor *a);
FG_API fg_tensor *fg_silu(fg_tensor *a);
/* torch.nn.functional.gelu(a, approximate=): "none" (or NULL), the exact
 * x Phi(x) with erf, PyTorch's default; "tanh", fg_gelu. */
FG_API fg_tensor *fg_gelu_approximate(fg_tensor *a, const char *approximate);
/* log(1 + exp(beta a)) / beta, a itself where beta a > threshold
 * (PyTorch's defaults: beta 1, threshold 20); beta 0 is FG_EINVAL. */
FG_API fg_tensor *fg_softplus(fg_tensor *a, double beta, double threshold);
/* PyTorch's default slope 0.01; the gradient at 0 is the slope's. */
FG_API fg_tensor *fg_leaky_relu(fg_tensor *a, double negative_slope);
/* alpha (exp(a) - 1) for a <= 0 (PyTorch's default alpha 1). */
FG_API fg_tensor *fg_elu(fg_tensor *a, double alpha);
/* Softmax / log-softmax over any dim. */
FG_API fg_tensor *fg_softmax_dim(fg_tensor *a, int dim);
FG_API fg_tensor *fg_log_softmax_dim(fg_tensor *a, int dim);

/* Sums and means over ndims dims (every dim when ndims is 0, PyTorch's
 * dim=None), keepdim as PyTorch's. */
FG_API fg_tensor *fg_sum_dims(fg_tensor *a, int ndims, const int *dims, bool keepdim);
FG_API fg_tensor *fg_mean_dims(fg_tensor *a, int ndims, const int *dims, bool keepdim);
/* Variance / standard deviation over dims as above, divided by N -
 * correction (torch.var(correction=): 1 is unbiased=True, PyTorch's
 * default; 0 the biased one); N - correction <= 0 gives inf or NaN. */
FG_API fg_tensor *fg_var(fg_tensor *a, int ndims, const int *dims, double correction, bool keepdim);
FG_API fg_tensor *fg_std(fg_tensor *a, int ndims, const int *dims, double correction, bool keepdim);
/* The running sum along dim (accumulated in double). */
FG_API fg_tensor *fg_cumsum(fg_tensor *a, int dim);

/* Joins n tensors along an existing dim (cat; one shape but along dim, one
 * dtype) or a new one (stack; one shape). */
FG_API fg_tensor *fg_cat(fg_tensor *const *ts, int n, int dim);
FG_API fg_tensor *fg_stack(fg_tensor *const *ts, int n, int dim);
/* torch.split: pieces of split_size along dim (the last may be shorter)
 * into out[0 .. *n_out), at most max_out of them (FG_EINVAL beyond); or
 * n pieces of the given sizes (summing to the dim's size). */
FG_API FG_MUST_USE fg_status fg_split(fg_tensor *a, int64_t split_size, int dim, fg_tensor **out,
                                      int max_out, int *n_out);
FG_API FG_MUST_USE fg_status fg_split_sizes(fg_tensor *a, const int64_t *sizes, int n, int dim,
                                            fg_tensor **out);
/* Elements [start, start + length) of dim (a negative start counts from
 * the end); slice: a[..., start:end:step, ...] with Python's rules for
 * negative and out-of-range bounds, step > 0. */
FG_API fg_tensor *fg_narrow(fg_tensor *a, int dim, int64_t start, int64_t length);
FG_API fg_tensor *fg_slice(fg_tensor *a, int dim, int64_t start, int64_t end, int64_t step);
/* dims: a permutation of a's ndim dims. */
FG_API fg_tensor *fg_permute(fg_tensor *a, const int *dims);
/* Dims of size 1 (and new leading dims) repeated to shape; -1 keeps a size. */
FG_API fg_tensor *fg_expand(fg_tensor *a, int ndim, const int64_t *shape);
/* torch.flatten: dims start_dim .. end_dim merged into one. */
FG_API fg_tensor *fg_flatten(fg_tensor *a, int start_dim, int end_dim);
/* a's slices at index (1-d) along dim. */
FG_API fg_tensor *fg_index_select(fg_tensor *a, int dim, fg_tensor *index);
/* out[i][j][k] = a[index[i][j][k]][j][k] (dim 0), index of a's ndim and
 * no larger than a in the other dims; out has index's shape. */
FG_API fg_tensor *fg_gather(fg_tensor *a, int dim, fg_tensor *index);
/* A copy of a with src[i][j][k] added at [index[i][j][k]][j][k] (dim 0);
 * src at least index's size. Gradients into a and src. */
FG_API fg_tensor *fg_scatter_add(fg_tensor *a, int dim, fg_tensor *index, fg_tensor *src);
/* cond ? a : b with broadcasting of all three; gradients into a and b. */
FG_API fg_tensor *fg_where(fg_tensor *cond, fg_tensor *a, fg_tensor *b);
/* a with value where mask (broadcast to a's shape) is true. */
FG_API fg_tensor *fg_masked_fill(fg_tensor *a, fg_tensor *mask, double value);
/* The largest / smallest value along dim and (*indices, i32, may be NULL)
 * the first index of it; NaN counts as the largest. The gradient goes to
 * that index. argmax / argmin: the indices alone (i32, not int64). */
FG_API fg_tensor *fg_max_dim(fg_tensor *a, int dim, bool keepdim, fg_tensor **indices);
FG_API fg_tensor *fg_min_dim(fg_tensor *a, int dim, bool keepdim, fg_tensor **indices);
FG_API fg_tensor *fg_argmax(fg_tensor *a, int dim, bool keepdim);
FG_API fg_tensor *fg_argmin(fg_tensor *a, int dim, bool keepdim);

/* ------------------------------------------------------------ more losses */

/* PyTorch's reduction=: "mean" (0, the default), "sum", "none";
 * "batchmean" (the sum over the first dim's size) for kl_div alone. */
typedef enum fg_reduction {
    FG_REDUCTION_MEAN = 0,
    FG_REDUCTION_SUM,
    FG_REDUCTION_NONE,
    FG_REDUCTION_BATCHMEAN,
} fg_reduction;

/* Input and target of one shape and dtype; gradients into both (the
 * target's where it requires grad). */
FG_API fg_tensor *fg_mse_loss(fg_tensor *x, fg_tensor *target, fg_reduction r);
FG_API fg_tensor *fg_l1_loss(fg_tensor *x, fg_tensor *target, fg_reduction r);
/* beta >= 0 (PyTorch's default 1; 0 is L1). */
FG_API fg_tensor *fg_smooth_l1_loss(fg_tensor *x, fg_tensor *target, fg_reduction r, double beta);
/* delta > 0 (PyTorch's default 1). */
FG_API fg_tensor *fg_huber_loss(fg_tensor *x, fg_tensor *target, fg_reduction r, double delta);
/* x probabilities in [0, 1]; each log clamped at -100 as PyTorch's; weight
 * (broadcast to x's shape, may be NULL) rescales each element. */
FG_API fg_tensor *fg_binary_cross_entropy(fg_tensor *x, fg_tensor *target, fg_tensor *weight,
                                          fg_reduction r);
/* x logits; pos_weight (broadcast to x's shape, NULL for 1) weighs the
 * positive term, weight each element (no gradient into either). */
FG_API fg_tensor *fg_binary_cross_entropy_with_logits(fg_tensor *x, fg_tensor *target,
                                                      fg_tensor *weight, fg_tensor *pos_weight,
                                                      fg_reduction r);
/* x log-probabilities; target probabilities (log-probabilities with
 * log_target); pointwise target (log target - x). */
FG_API fg_tensor *fg_kl_div(fg_tensor *x, fg_tensor *target, fg_reduction r, bool log_target);

/* The options of nll_loss and cross_entropy_ex, PyTorch's: class weights
 * (C) or NULL, ignore_index (PyTorch's -100), reduction, label_smoothing
 * in [0, 1]. A zeroed struct is NOT the defaults (ignore_index 0): start
 * from fg_class_loss_defaults(), or pass NULL. */
typedef struct fg_class_loss_opts {
    fg_tensor *weight;
    int64_t ignore_index;
    fg_reduction reduction;
    double label_smoothing;
} fg_class_loss_opts;
FG_API fg_class_loss_opts fg_class_loss_defaults(void);
/* torch.nn.functional.nll_loss / cross_entropy: input (C), (N, C) or (N,
 * C, d1, ...) (classes in dim 1, as PyTorch's) with i32 targets (), (N) or
 * (N, d1, ...). The mean divides by the summed weights of the targets that
 * count, and is 0 when none counts (PyTorch: NaN). cross_entropy_ex with
 * the defaults (no weight, no smoothing, mean) is fg_cross_entropy: the
 * same bits; otherwise log_softmax then nll_loss with smoothing:
 * (1 - eps) nll + eps / C (-sum_c w[c] log p[c]) per row, as PyTorch's. */
FG_API fg_tensor *fg_nll_loss(fg_tensor *logp, fg_tensor *targets, const fg_class_loss_opts *o);
FG_API fg_tensor *fg_cross_entropy_ex(fg_tensor *logits, fg_tensor *targets,
                                      const fg_class_loss_opts *o);

/* ----------------------------------------------- convolution and pooling */

/* torch.nn.functional.conv2d's arguments; a zeroed struct (or NULL) is
 * PyTorch's defaults: stride 1, padding 0, dilation 1, groups 1 (a 0
 * stride, dilation or groups means 1). same: padding="same" (stride 1;
 * an odd total padding puts the extra row / column after, as PyTorch).
 * conv1d reads entry [0] of each pair. */
typedef struct fg_conv2d_opts {
    int64_t stride[2], padding[2], dilation[2];
    int64_t groups;
    bool same;
} fg_conv2d_opts;
/* x (N, C, H, W), w (O, C / groups, KH, KW), b (O) or NULL -> (N, O, OH,
 * OW); conv1d: x (N, C, L), w (O, C / groups, K). NCHW; f32 runs oneDNN's
 * convolution primitive where it is built in (FULGUR_CONV=im2col forces
 * im2col and the matrix product, which f64 always takes). */
FG_API fg_tensor *fg_conv2d(fg_tensor *x, fg_tensor *w, fg_tensor *b, const fg_conv2d_opts *o);
FG_API fg_tensor *fg_conv1d(fg_tensor *x, fg_tensor *w, fg_tensor *b, const fg_conv2d_opts *o);
/* x (N, C, H, W). kernel (2 sizes); stride NULL (or a 0) is the kernel,
 * padding NULL is 0 (at most half the kernel), dilation NULL is 1;
 * ceil_mode as PyTorch's. max_pool2d's *indices (may be NULL) get the
 * index of each maximum in its H x W plane (i32; PyTorch's
 * return_indices); NaN counts as the largest. */
FG_API fg_tensor *fg_max_pool2d(fg_tensor *x, const int64_t kernel[2], const int64_t stride[2],
                                const int64_t padding[2], const int64_t dilation[2], bool ceil_mode,
                                fg_tensor **indices);
FG_API fg_tensor *fg_avg_pool2d(fg_tensor *x, const int64_t kernel[2], const int64_t stride[2],
                                const int64_t padding[2], bool ceil_mode, bool count_include_pad);
FG_API fg_tensor *fg_adaptive_avg_pool2d(fg_tensor *x, int64_t out_h, int64_t out_w);
/* torch.nn.functional.batch_norm over x (N, C, ...): in training the
 * batch's mean and biased variance normalise x, and running_mean /
 * running_var (C) (may be NULL, then not tracked) become (1 - momentum)
 * of themselves plus momentum of the batch's mean and unbiased variance
 * (outside the tape); in evaluation they normalise x. w, b (C) may be NULL. */
FG_API fg_tensor *fg_batch_norm(fg_tensor *x, fg_tensor *running_mean, fg_tensor *running_var,
                                fg_tensor *w, fg_tensor *b, bool training, double momentum,
                                double eps);

/* ---------------------------------------------- more normalisations */

/* torch.nn.functional.group_norm: x (N, C, ...) in `groups` groups of C /
 * groups channels, each normalised over its channels and the spatial dims
 * (biased variance, eps added to it); w, b (C) may each be NULL. */
FG_API fg_tensor *fg_group_norm(fg_tensor *x, int64_t groups, fg_tensor *w, fg_tensor *b,
                                double eps);
/* torch.nn.functional.rms_norm (PyTorch 2.4's; the same formula):
 * x * rsqrt(mean(x^2 over the last ndims dims) + eps) * w, w of those dims'
 * shape or NULL; eps < 0 is PyTorch's eps=None, the dtype's machine epsilon
 * (f32's for f32, bf16 and f16 too). */
FG_API fg_tensor *fg_rms_norm(fg_tensor *x, int ndims, fg_tensor *w, double eps);
/* torch.nn.functional.instance_norm: x (N, C, spatial...), each (n, c)
 * normalised over its spatial dims with use_input_stats; running_mean /
 * running_var (C) (may be NULL) then take momentum of the mean over N of
 * the instances' means and unbiased variances (outside the tape). Without
 * use_input_stats they normalise x. w, b (C) may be NULL. */
FG_API fg_tensor *fg_instance_norm(fg_tensor *x, fg_tensor *running_mean, fg_tensor *running_var,
                                   fg_tensor *w, fg_tensor *b, bool use_input_stats,
                                   double momentum, double eps);
/* How SyncBatchNorm sums its statistics over the ranks of a job: an
 * in-place sum of t (a contiguous step tensor of the model's dtype) over
 * every rank; collective (every rank calls it in the same order, in
 * forward and in backward). The strategy or program supplies it (the comm
 * layer is above this one); borrowed while in use. */
typedef struct fg_stats_reduce {
    FG_MUST_USE fg_status (*allreduce_sum)(void *ud, fg_tensor *t);
    void *ud;
} fg_stats_reduce;
/* Batch norm in training mode over the global batch of every rank
 * (torch.nn.SyncBatchNorm): the count, the mean and the biased variance
 * are summed over ranks through r (three all-reduces in forward, two in
 * backward, where the gradients of the sums are summed over ranks too), so
 * that the output, the running statistics and the gradients are those of
 * fg_batch_norm on one process over the concatenated batch. The ranks may
 * hold different batch sizes. r NULL (one process): fg_batch_norm. */
FG_API fg_tensor *fg_sync_batch_norm(fg_tensor *x, fg_tensor *running_mean, fg_tensor *running_var,
                                     fg_tensor *w, fg_tensor *b, double momentum, double eps,
                                     const fg_stats_reduce *r);

/* torch.nn.functional.conv_transpose2d's arguments; zero is PyTorch's
 * default (stride 1, padding 0, output_padding 0, dilation 1, groups 1). */
typedef struct fg_conv_transpose2d_opts {
    int64_t stride[2], padding[2], output_padding[2], dilation[2];
    int64_t groups;
} fg_conv_transpose2d_opts;
/* x (N, C_in, H, W), w (C_in, C_out / groups, KH, KW), b (C_out) or NULL ->
 * (N, C_out, OH, OW), OH = (H - 1) stride - 2 padding + dilation (KH - 1) +
 * output_padding + 1 (output_padding smaller than stride or dilation, as
 * PyTorch's rule). On the convolution kernels (oneDNN for f32, im2col for
 * f64). */
FG_API fg_tensor *fg_conv_transpose2d(fg_tensor *x, fg_tensor *w, fg_tensor *b,
                                      const fg_conv_transpose2d_opts *o);

#ifdef __cplusplus
}
#endif
#endif
