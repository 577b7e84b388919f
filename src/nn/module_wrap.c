/* Wrapped units: how a strategy that shards the parameters (ZeRO-3, FSDP's
 * FULL_SHARD) sees a module's forward and backward. The strategy marks
 * some modules of a finalized tree as units (FSDP's wrapped modules); the
 * forward of a unit runs
 *
 *   pre_forward(u); x' = hook(x); y = forward(x'); post_forward(u); y' = hook(y)
 *
 * where each hook is an identity recorded on the tape. The tape runs
 * backward in reverse recording order, so the node on y (recorded after
 * every op of the unit) runs before any of them: it calls pre_backward(u),
 * which gathers the parameters again; the node on x (recorded before them)
 * runs after all of them: it calls post_backward(u). A hook is recorded
 * only where autograd records anything (grad mode on, the tensor requiring
 * grad); a unit whose input needs no gradient gets no post_backward call
 * (the strategy releases what is left once backward is over).
 *
 * Activation checkpointing: a checkpointed unit runs fg_checkpoint between
 * the two hooks, so its node lies between them on the tape and its
 * recomputation runs after pre_backward, with the unit gathered. A
 * checkpointed module holding units (units smaller than the module) runs
 * their forwards again inside its backward, hooks and all: the strategy
 * keeps each gathered from that forward to its backward
 * (fg__checkpoint_recomputing).
 *
 * The flat layout is untouched: parameters stay views into the root's flat
 * buffer, and what the strategy gathers and releases are ranges of it. */
#include <stdint.h>

#include "nn_impl.h"

void fg__module_set_wrap(fg_module *root, const fg_module_wrap *wrap, fg_module *const *units,
                         int nunits) {
    fg_flat *f = root->flat;
    for (int64_t k = 0; k < f->nmod; k++) f->mods[k]->wrap_unit = -1;
    f->wrap = wrap;
    for (int u = 0; wrap && u < nunits; u++) units[u]->wrap_unit = u;
}

enum { PRE_BACKWARD = 0, POST_BACKWARD = 1 };

static fg_status hook_bw(fg_node *n, const fg_tensor *gout) {
    const fg_module_wrap *w = (const fg_module_wrap *)(intptr_t)n->i[2];
    int unit = (int)n->i[0];
    fg_status s =
        n->i[1] == PRE_BACKWARD ? w->pre_backward(w->ud, unit) : w->post_backward(w->ud, unit);
    if (s != FG_OK) return s;
    fg_tensor *in = n->in[0];
    if (!fg__needs_grad(in)) return FG_OK;
    if (!in->grad && !(in->flags & FG_T_PERSISTENT)) {
        /* the output's gradient is final and nothing reads it again: it
         * becomes the input's, no copy (later uses of the input add to it) */
        in->grad = (fg_tensor *)gout;
        return FG_OK;
    }
    fg_tensor *g = fg__grad_of(in);
    if (!g) return fg_last_status();
    return fg__ops(g)->axpby(1.0, gout, 1.0, g);
}

/* x itself when nothing is recorded, else an identity of x whose backward
 * calls the hook `which` of unit u first. NULL on failure. */
static fg_tensor *hook(fg_tensor *x, const fg_module_wrap *w, int u, int which) {
    if (!fg_is_grad_enabled() || !fg__needs_grad(x)) return x;
    fg_tensor *y = fg__tensor_header_like(x);
    if (!y) return NULL;
    y->data = x->data;
    fg_node *n;
    if (fg__record(&n, which == PRE_BACKWARD ? "unit_output" : "unit_input", hook_bw, y, 1, &x))
        return NULL;
    if (n) {
        n->i[0] = u;
        n->i[1] = which;
        n->i[2] = (int64_t)(intptr_t)w;
    }
    return y;
}

fg_tensor *fg__module_forward_wrapped(fg_module *m, fg_tensor *x) {
    const fg_module_wrap *w = m->flat->wrap;
    int u = m->wrap_unit;
    if (w->pre_forward(w->ud, u) != FG_OK) return NULL;
    fg_tensor *xi = hook(x, w, u, POST_BACKWARD);
    fg_tensor *y = xi ? fg__module_forward_body(m, xi) : NULL;
    /* released even when forward failed, so that nothing stays gathered */
    if (w->post_forward(w->ud, u) != FG_OK || !y) return NULL;
    return hook(y, w, u, PRE_BACKWARD);
}
