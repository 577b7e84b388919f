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
/* The gradient of t (NULL before any backward reached it). */
FG_API fg_tensor *fg_tensor_grad(const fg_tensor *t);
/* Makes `grad` (persistent, same shape and dtype, borrowed for t's life)
 * the tensor t's gradient accumulates into: how a module points every
 * parameter's gradient into one flat buffer. */
FG_API fg_status fg_tensor_set_grad(fg_tensor *t, fg_tensor *grad);
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
FG_API fg_status fg_backward(fg_tensor *loss);
FG_API fg_status fg_backward_with(fg_tensor *out, const fg_tensor *seed_grad);

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
 *   - fg_matmul, fg_linear and fg_causal_attention take f32 inputs (or
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
FG_API fg_status fg_autocast_set(fg_dtype dt, fg_dtype *prev);
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
/* Causal self-attention of qkv (B, T, 3C) with `heads` heads -> (B, T, C). */
FG_API fg_tensor *fg_causal_attention(fg_tensor *qkv, int heads);

#ifdef __cplusplus
}
#endif
#endif
