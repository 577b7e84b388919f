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
 * buffer, and what the strategy gathers and releases are ranges of it.
 *
 * A unit's backward also rewinds the step arena: the step memory its nodes
 * make in backward (the gradients of its activations, the kernels' scratch)
 * is dead once the node on x has run, except x's gradient, which is moved
 * down to the rewound top. Without that every activation's gradient stays
 * until the step ends and backward doubles the step's memory. It is done
 * only for a closed unit: nothing recorded inside it reads a tensor from
 * outside that needs a gradient but x' and the parameters (checked when its
 * forward is over), so no gradient made during its backward is read after. */
#include <stdint.h>
#include <string.h>

#include "nn_impl.h"

void fg__module_set_wrap(fg_module *root, const fg__module_wrap *wrap, fg_module *const *units,
                         int nunits) {
    fg__flat *f = root->flat;
    for (int64_t k = 0; k < f->nmod; k++) f->mods[k]->wrap_unit = -1;
    f->wrap = wrap;
    for (int u = 0; wrap && u < nunits; u++) units[u]->wrap_unit = u;
}

enum { PRE_BACKWARD = 0, POST_BACKWARD = 1 };

/* The backward of a closed unit: the arena's top when it began. */
typedef struct segment {
    fg__arena_point mark;
    bool marked;
} segment;

/* The end of a closed unit's backward: the arena back to the mark, with
 * in's gradient (gout, made in the segment or below it) kept. */
static FG_MUST_USE fg_status rewind_keeping(segment *sg, fg_tensor *in, const fg_tensor *gout) {
    sg->marked = false;
    if (!fg__needs_grad(in)) {
        fg__step_release(sg->mark);
        return FG_OK;
    }
    if (in->grad || (in->flags & FG_T_PERSISTENT)) { /* made before the unit's backward */
        fg_tensor *g = fg__grad_of(in);
        if (!g) return fg_last_status();
        FG_TRY(fg__ops(g)->axpby(1.0, gout, 1.0, g));
        fg__step_release(sg->mark);
        return FG_OK;
    }
    fg_tensor *gc = fg_tensor_contiguous(gout);
    if (!gc) return fg_last_status();
    fg_dev *dev = fg_tensor_dev(gc);
    if (dev && !fg_dev_host_accessible(dev)) {
        /* on a device the released chunks go back to its allocator: the
         * gradient waits in a block of its own (device to device copies) */
        size_t nbytes = fg_tensor_nbytes(gc);
        void *tmp = fg_dev_alloc(dev, nbytes, NULL);
        if (!tmp) return fg_last_status();
        fg_status s = fg_dev_copy_d2d(dev, tmp, gc->data, nbytes);
        fg_tensor m = *gc;
        fg__step_release(sg->mark);
        fg_tensor *g = s == FG_OK ? fg_empty(m.dtype, m.ndim, m.shape) : NULL;
        if (s == FG_OK && !g) s = fg_last_status();
        if (s == FG_OK) s = fg_dev_copy_d2d(dev, g->data, tmp, nbytes);
        fg__status_drop(fg_dev_free(dev, tmp));
        if (s != FG_OK) return s;
        in->grad = g;
        return FG_OK;
    }
    /* the released memory is not written before the copy (the dropped
     * chunks stay valid until the step ends); memmove: they may overlap */
    fg_tensor meta = *gc;
    size_t nb = fg_tensor_nbytes(gc);
    fg__step_release(sg->mark);
    void *data = fg_step_alloc(nb ? nb : 1);
    if (!data) return fg_last_status();
    memmove(data, meta.data, nb);
    fg_tensor *g = fg__tensor_header_like(&meta);
    if (!g) return fg_last_status();
    g->data = data;
    in->grad = g;
    return FG_OK;
}

static FG_MUST_USE fg_status hook_bw(fg__node *n, const fg_tensor *gout) {
    const fg__module_wrap *w = (const fg__module_wrap *)(intptr_t)n->i[2];
    int unit = (int)n->i[0];
    fg_status s =
        n->i[1] == PRE_BACKWARD ? w->pre_backward(w->ud, unit) : w->post_backward(w->ud, unit);
    if (s != FG_OK) return s;
    segment *sg = n->ctx;
    fg_tensor *in = n->in[0];
    if (sg && n->i[1] == PRE_BACKWARD) {
        sg->mark = fg__step_mark();
        sg->marked = true;
    } else if (sg && sg->marked) {
        return rewind_keeping(sg, in, gout);
    }
    if (!fg__needs_grad(in)) return FG_OK;
    if (!in->grad && !(in->flags & FG_T_PERSISTENT)) {
        /* the output's gradient is final and nothing reads it again: it
         * becomes the input's, no copy (later uses of the input add to it) */
        in->grad = (fg_tensor *)gout;
        if (gout->grad_for) in->grad->grad_for = in; /* now the input's, handed back with it */
        return FG_OK;
    }
    fg_tensor *g = fg__grad_of(in);
    if (!g) return fg_last_status();
    return fg__ops(g)->axpby(1.0, gout, 1.0, g);
}

/* x itself when nothing is recorded, else an identity of x whose backward
 * calls the hook `which` of unit u first (its node in *node, else NULL).
 * NULL on failure. */
static fg_tensor *hook(fg_tensor *x, const fg__module_wrap *w, int u, int which, fg__node **node) {
    *node = NULL;
    if (!fg_is_grad_enabled() || !fg__needs_grad(x)) return x;
    fg_tensor *y = fg__tensor_header_like(x);
    if (!y) return NULL;
    y->data = x->data;
    fg__node *n;
    if (fg__record(&n, which == PRE_BACKWARD ? "unit_output" : "unit_input", hook_bw, y, 1, &x))
        return NULL;
    if (n) {
        n->i[0] = u;
        n->i[1] = which;
        n->i[2] = (int64_t)(intptr_t)w;
    }
    *node = n;
    return y;
}

fg_tensor *fg__module_forward_wrapped(fg_module *m, fg_tensor *x) {
    const fg__module_wrap *w = m->flat->wrap;
    int u = m->wrap_unit;
    if (w->pre_forward(w->ud, u) != FG_OK) return NULL;
    fg__node *in_node, *out_node;
    fg_tensor *xi = hook(x, w, u, POST_BACKWARD, &in_node);
    fg__tape_point inside = fg__tape_pos();
    fg_tensor *y = xi ? fg__module_forward_body(m, xi) : NULL;
    /* released even when forward failed, so that nothing stays gathered */
    if (w->post_forward(w->ud, u) != FG_OK || !y) return NULL;
    bool closed = in_node && fg__tape_closed_since(inside, xi);
    fg_tensor *yo = hook(y, w, u, PRE_BACKWARD, &out_node);
    if (closed && out_node) {
        segment *sg = fg_step_alloc(sizeof *sg);
        if (!sg) return NULL;
        memset(sg, 0, sizeof *sg);
        in_node->ctx = out_node->ctx = sg;
    }
    return yo;
}
