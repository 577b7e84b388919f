/* Private contract between the tape (tape.c) and the differentiable
 * functions (fn_*.c). A function computes its output with the op table,
 * then calls fg__record; its backward gets the output's gradient and adds
 * into its inputs' gradients through fg__grad_of (the ops' backward kernels
 * accumulate, so that is one kernel call per input). */
#ifndef FULGUR_AUTOGRAD_IMPL_H
#define FULGUR_AUTOGRAD_IMPL_H

#include <stdatomic.h>

#include "fulgur/autograd.h"
#include "ops/ops_impl.h"
#include "tensor/tensor_impl.h"

#define FG_NODE_MAX_IN 5 /* fn_rnn.c's lstm: xw, W_hh, h0, c0, b_hh */

typedef struct fg__node fg__node;
typedef FG_MUST_USE fg_status (*fg__backward_fn)(fg__node *n, const fg_tensor *gout);

struct fg__node {
    fg__backward_fn backward;
    const char *name; /* the function's name, for messages */
    fg_tensor *out;
    int nin;
    fg_tensor *in[FG_NODE_MAX_IN];
    fg_tensor *saved[4]; /* extra step tensors the backward needs */
    double f[4];         /* scalars the backward needs */
    int64_t i[4];
    fg_tensor **xleaf; /* leaves used inside the node (fg_checkpoint), nxleaf of them, */
    int nxleaf;        /* one entry per use: counted for the "gradient ready" hook */
    void *ctx;         /* what a function's backward needs beyond the above */
    fg__node *prev;    /* the node recorded before this one */
    uint64_t mark;     /* backward pass that reached it */
    bool consumed;
    bool out_unread; /* its backward never reads out's data: fg_relu_ may overwrite it */
};

/* Records `out = name(in...)` on the tape when grad mode is on and some
 * input requires grad; *node is NULL (and FG_OK) when nothing needs
 * recording. Marks out as requiring grad. */
FG_MUST_USE fg_status fg__record(fg__node **node, const char *name, fg__backward_fn bw,
                                 fg_tensor *out, int nin, fg_tensor *const *in);

/* fg__record that records whenever grad mode is on, even when no input
 * requires grad (fg_checkpoint: the parameters inside require it). */
FG_MUST_USE fg_status fg__record_always(fg__node **node, const char *name, fg__backward_fn bw,
                                        fg_tensor *out, int nin, fg_tensor *const *in);

/* The tape's tail and length, to unlink what a recomputation recorded
 * (fg_checkpoint) before its step memory is released. */
typedef struct fg__tape_point {
    fg__node *tail;
    int64_t len;
} fg__tape_point;
fg__tape_point fg__tape_pos(void);
/* The calling thread's newest node (NULL: none, or grad mode off). */
fg__node *fg__tape_tail(void);
void fg__tape_restore(fg__tape_point p);
/* The persistent leaf tensors (parameters) used by the nodes recorded after p (one entry per use),
 * in a fg_alloc'ed array the caller frees; *n gets the count. NULL with
 * *n = 0 when there are none (or FG_ENOMEM, then fg_last_error is set and
 * the return status in *st). */
fg_tensor **fg__tape_leaves_since(fg__tape_point p, int *n, fg_status *st);
/* True when the nodes recorded after p read nothing made before p that
 * needs a gradient but `input` and persistent leaves (parameters): the
 * gradients their backward makes are then dead once it is over, except
 * input's (a stage-3 unit's backward rewinds the step arena on that). */
bool fg__tape_closed_since(fg__tape_point p, const fg_tensor *input);
/* Backward from out whose gradient out->grad is already set, without
 * reporting leaves to the "gradient ready" hook (the node that runs it
 * reports its leaves itself). */
FG_MUST_USE fg_status fg__backward_inner(fg_tensor *out);

/* Draws n consecutive indices from a counter of a random function (the
 * Dropout module's offset), so that fg_checkpoint's recomputation sees the
 * same draws: inside a checkpointed forward each draw is logged, inside its
 * recomputation replayed in order; elsewhere it is atomic_fetch_add. */
uint64_t fg__rng_take(_Atomic uint64_t *counter, uint64_t n);

/* True while fg_checkpoint's backward runs the checkpointed function again
 * on this thread (its output's backward follows at once): a sharded
 * strategy keeps what the recomputation gathers until then. */
bool fg__checkpoint_recomputing(void);

/* True when t takes part in backward (t requires grad). */
static inline bool fg__needs_grad(const fg_tensor *t) { return t && t->requires_grad; }

/* The tensor a backward accumulates t's gradient into: t->grad, made (zero)
 * on first use: persistent for leaves, a step tensor otherwise. NULL with
 * fg_last_error set on failure. */
fg_tensor *fg__grad_of(fg_tensor *t);

/* fg__grad_of for a backward that writes every element of the gradient
 * with one kernel taking a beta (c = ... + beta c): *beta = 0 when the
 * buffer was just made and holds garbage (no memset for the kernel to add
 * to), 1 when it holds earlier contributions or is a leaf's. */
fg_tensor *fg__grad_for_write(fg_tensor *t, double *beta);

/* dp replicas: on the calling thread, gradients of leaves that are views
 * into `from` (a model's flat gradient) accumulate at the same offset of `to`
 * instead (a replica's own buffer, same size). NULL, NULL turns it off. */
void fg__set_grad_redirect(const fg_tensor *from, fg_tensor *to);

/* The op table for t's device (NULL with an error set). */
const fg_op_table *fg__ops(const fg_tensor *t);

/* Checks that a table entry exists, or sets FG_EUNSUPPORTED naming it. */
#define FG_OP(ops, entry)                                                                          \
    ((ops)->entry                                                                                  \
         ? FG_OK                                                                                   \
         : fg_error(FG_EUNSUPPORTED, "op %s is not available on %s", #entry, (ops)->device))

/* The common checks at the top of a differentiable function: non-NULL and
 * float inputs on one device. */
FG_MUST_USE fg_status fg__check_float(const char *fn, const fg_tensor *t);
FG_MUST_USE fg_status fg__check_same_dtype(const char *fn, const fg_tensor *a, const fg_tensor *b);

/* Autocast (fn_cast.c, fn_autocast.c). fg__autocast_applies: the thread's
 * autocast is on and a and b are each f32 or the autocast dtype, so
 * fg_matmul/fg_linear take the autocast path. fg__autocast_operand: t in
 * dt (t itself when it has dt and is contiguous, else rounded from f32 into
 * a new step tensor). fg__autocast_matmul: c (f32 or dt) = op(a) op(b) +
 * beta c on such operands. fg__autocast_f32: t cast to f32 (fg_cast,
 * recorded) when autocast is on and t is bf16/f16, else t: the functions
 * autocast keeps in f32 (layer norm, softmax, log-softmax, cross-entropy,
 * reductions) call it on their inputs. */
bool fg__autocast_applies(const fg_tensor *a, const fg_tensor *b);
fg_tensor *fg__autocast_f32(fg_tensor *t);
fg_tensor *fg__autocast_operand(const fg_tensor *t, fg_dtype dt);
FG_MUST_USE fg_status fg__autocast_matmul(fg_dtype dt, const fg_tensor *a, bool ta,
                                          const fg_tensor *b, bool tb, fg_tensor *c, double beta);
fg_tensor *fg__autocast_linear(fg_tensor *x, fg_tensor *w, fg_tensor *b);
/* fn_conv.c: the convolutions' autocast: x, w and b (may be NULL) cast to
 * the autocast dtype (recorded) when autocast is on and they are f32; left
 * alone otherwise. */
FG_MUST_USE fg_status fg__autocast_conv(fg_tensor **x, fg_tensor **w, fg_tensor **b);
fg_tensor *fg__autocast_mm(fg_tensor *a, fg_tensor *b);

/* fn_rnn.c: the LSTM of one direction of one layer as one node, for nn's
 * LSTM: xw (T, N, 4H) the input projection of every step, whh (4H, H), bhh
 * (4H) or NULL, h0 and c0 (N, H) (zeros where the caller has none); reverse
 * runs from step T - 1 down. Returns y (T + 1, N, H): rows 0..T-1 the
 * hidden states, row T the final cell state (fg__ops_lstm_fwd), or NULL
 * with the error set; FG_EUNSUPPORTED off the CPU or outside f32 and f64,
 * which fg__lstm_seq_available tells first. */
fg_tensor *fg__lstm_seq(fg_tensor *xw, fg_tensor *whh, fg_tensor *bhh, fg_tensor *h0, fg_tensor *c0,
                        bool reverse);
bool fg__lstm_seq_available(const fg_tensor *xw);
/* fn_rnn.c: the GRU of one direction of one layer as one node, for nn's
 * GRU: xw (T, N, 3H) the input projection of every step, whh (3H, H), bhh
 * (3H) or NULL, h0 (N, H) (zeros where the caller has none), gates r, z, n;
 * reverse as fg__lstm_seq. Returns y (T, N, H), the hidden states
 * (fg__ops_gru_fwd), or NULL with the error set; where it runs is what
 * fg__lstm_seq_available tells. */
fg_tensor *fg__gru_seq(fg_tensor *xw, fg_tensor *whh, fg_tensor *bhh, fg_tensor *h0, bool reverse);

#endif
