/* Activation checkpointing (torch.utils.checkpoint): y = fn(x) runs with its
 * intermediate tensors dropped at once, and backward runs fn again to get
 * them back, one checkpoint at a time.
 *
 * Forward runs fn on the tape as usual, then rewinds the tape and the step
 * arena to where they were (fg__step_mark), keeping only y, moved down to
 * the rewound arena's top: the checkpoint's node stands for the whole of
 * fn. Its backward runs fn again
 * on the same input with the same random draws (a Dropout's offset is taken
 * through fg__rng_take, which logs the draws of the first run and replays
 * them) and the same autocast, back-propagates through that, and rewinds
 * again. The recomputation runs the same kernels on the same values, and
 * the gradient of x accumulates into the same tensor in the same order, so
 * the gradients are bitwise those of a run without the checkpoint.
 *
 * The parameters fn uses are not inputs of the node, so the node lists them
 * (fg__node.xleaf, from the first run's tape) for the "gradient ready" hook:
 * the tape counts their uses as it counts inputs, and the recomputation's
 * own backward reports none. A checkpoint inside a checkpointed fn runs
 * plainly (the outer one recomputes it). */
#include <string.h>

#include "autograd_impl.h"

typedef struct ckpt {
    fg_checkpoint_fn fn;
    void *ud;
    uint64_t *draws; /* the first run's random draws, in order */
    int ndraws;
    fg_dtype autocast;
} ckpt;

enum { RUN_PLAIN, RUN_RECORD, RUN_REPLAY };

static _Thread_local int tl_mode;
static _Thread_local uint64_t *tl_log; /* RECORD: fg_alloc'ed; REPLAY: the node's */
static _Thread_local int tl_n, tl_cap, tl_pos;
static _Thread_local bool tl_bad; /* a draw could not be logged, or replay ran out */

uint64_t fg__rng_take(_Atomic uint64_t *counter, uint64_t n) {
    if (tl_mode == RUN_REPLAY) {
        if (tl_pos < tl_n) return tl_log[tl_pos++];
        tl_bad = true;
    }
    uint64_t v = atomic_fetch_add(counter, n);
    if (tl_mode == RUN_RECORD) {
        if (tl_n == tl_cap) {
            int cap = tl_cap ? 2 * tl_cap : 16;
            uint64_t *g = fg_alloc(sizeof *g * (size_t)cap);
            if (!g) {
                tl_bad = true;
                return v;
            }
            if (tl_n) memcpy(g, tl_log, sizeof *g * (size_t)tl_n);
            fg_free(tl_log);
            tl_log = g;
            tl_cap = cap;
        }
        tl_log[tl_n++] = v;
    }
    return v;
}

bool fg__checkpoint_recomputing(void) { return tl_mode == RUN_REPLAY; }

/* A header for x's data with no history: fn's input, so that what fn
 * records ends at it. */
static fg_tensor *detached(fg_tensor *x) {
    fg_tensor *d = fg__tensor_header_like(x);
    if (d) {
        d->data = x->data;
        d->requires_grad = x->requires_grad;
    }
    return d;
}

static bool has_live_fn(const fg_tensor *t) {
    return t->grad_fn && t->grad_fn_gen == fg_step_generation();
}

static FG_MUST_USE fg_status ckpt_backward(fg__node *n, const fg_tensor *gout) {
    ckpt *c = n->ctx;
    fg_tensor *x = n->in[0];
    bool xg = x->requires_grad;
    /* x's gradient lives below the mark: its existing one (the recomputed
     * graph adds into it, as the plain graph would), or a fresh one that
     * takes a copy of what the recomputed graph made */
    fg_tensor *keep = NULL, *fresh = NULL;
    if (xg && (x->grad || ((x->flags & FG_T_PERSISTENT) && !has_live_fn(x)))) {
        if (!(keep = fg__grad_of(x))) return fg_error_wrap(FG_ENOMEM, "checkpoint backward");
    } else if (xg && !(fresh = fg_empty(x->dtype, x->ndim, x->shape))) {
        return fg_error_wrap(FG_ENOMEM, "checkpoint backward");
    }
    fg__tape_point tp = fg__tape_pos();
    fg__arena_point mark = fg__step_mark();
    fg_status st = FG_OK;
    fg_tensor *xd = detached(x);
    if (!xd) {
        st = fg_error_wrap(FG_ENOMEM, "checkpoint backward");
        goto out;
    }
    xd->grad = keep;
    fg_dtype prev_ac;
    /* the dtype the first run recorded, valid then: cannot fail */
    fg__status_drop(fg_autocast_set(c->autocast, &prev_ac));
    bool prev_grad = fg_set_grad_enabled(true);
    tl_mode = RUN_REPLAY;
    tl_log = c->draws;
    tl_n = c->ndraws;
    tl_pos = 0;
    tl_bad = false;
    fg_tensor *y = c->fn(xd, c->ud);
    bool drew_other = tl_bad || tl_pos != tl_n;
    tl_mode = RUN_PLAIN;
    tl_log = NULL;
    tl_n = tl_cap = tl_pos = 0;
    fg_set_grad_enabled(prev_grad);
    fg__status_drop(fg_autocast_set(prev_ac, NULL));
    if (!y) {
        st = fg_error_wrap(fg_last_status() ? fg_last_status() : FG_EINVAL,
                           "checkpoint: recomputing the forward");
        goto out;
    }
    if (drew_other || !fg_tensor_same_shape(y, gout) || y->dtype != gout->dtype) {
        st = fg_error(FG_ESTATE,
                      "checkpoint: the recomputed forward differs from the first one (%s); the "
                      "checkpointed function must compute the same thing twice",
                      drew_other ? "another number of random draws" : "another output shape");
        goto out;
    }
    if (has_live_fn(y)) {
        y->grad = (fg_tensor *)gout;
        st = fg__backward_inner(y);
    } else if (y == xd && xg) { /* fn returned its input */
        fg_tensor *g = fg__grad_of(xd);
        st = g ? fg__ops(g)->axpby(1.0, gout, 1.0, g) : FG_ENOMEM;
    }
    if (st == FG_OK && fresh && xd->grad) {
        /* a copy call, not memcpy: on a device both are its memory */
        fg_tensor *g = fg_tensor_contiguous(xd->grad);
        st = g ? fg_tensor_copy(fresh, g) : fg_error_wrap(FG_ENOMEM, "checkpoint backward");
    }
out:;
    bool got = xd && xd->grad;
    fg__tape_restore(tp);
    fg__step_release(mark);
    if (st == FG_OK && fresh && got) x->grad = fresh;
    return st;
}

fg_tensor *fg_checkpoint(fg_checkpoint_fn fn, fg_tensor *x, void *ud) {
    if (!fn) {
        fg_error(FG_EINVAL, "checkpoint: NULL function");
        return NULL;
    }
    if (!x) {
        fg_error_wrap(FG_EINVAL, "checkpoint: NULL input (an earlier call failed)");
        return NULL;
    }
    /* nothing to save without grad; inside a checkpoint the outer one
     * recomputes this one */
    if (!fg_is_grad_enabled() || tl_mode != RUN_PLAIN) return fn(x, ud);
    fg__tape_point tp = fg__tape_pos();
    fg__arena_point mark = fg__step_mark();
    fg_tensor *xd = detached(x), *y = NULL, *out = NULL;
    fg_tensor **leaves = NULL;
    int nleaves = 0;
    fg_status st = FG_OK;
    if (!xd) goto fail;
    tl_mode = RUN_RECORD;
    tl_n = tl_cap = 0;
    tl_log = NULL;
    tl_bad = false;
    y = fn(xd, ud);
    tl_mode = RUN_PLAIN;
    uint64_t *log = tl_log;
    int nlog = tl_n;
    bool bad = tl_bad;
    tl_log = NULL;
    tl_n = tl_cap = 0;
    if (!y) goto fail_log;
    if (bad) {
        fg_error(FG_ENOMEM, "checkpoint: logging the random draws of the forward");
        goto fail_log;
    }
    if (y == xd) { /* the identity: nothing to save */
        fg_free(log);
        fg__tape_restore(tp);
        fg__step_release(mark);
        return x;
    }
    leaves = fg__tape_leaves_since(tp, &nleaves, &st);
    fg_tensor *yc = st == FG_OK ? fg_tensor_contiguous(y) : NULL;
    if (!yc) goto fail_log;
    /* y's data stays where it is through the release (the rewound memory
     * is not written, dropped chunks stay on the spare list until reset):
     * the output's data is allocated after it, then y moved in (memmove:
     * the two may overlap) */
    fg_tensor meta = *yc;
    const void *src = yc->data;
    size_t nb = fg_tensor_nbytes(yc);
    /* on a device (the step tensors in its arena) y goes through a buffer
     * of the device's own around the release: its copies do not overlap */
    fg_dev *dev = fg_tensor_dev(yc);
    void *hold = NULL;
    if (dev && fg_dev_host_accessible(dev)) dev = NULL;
    if (dev && (!(hold = fg_dev_alloc(dev, nb ? nb : 1, NULL)) ||
                fg_dev_copy_d2d(dev, hold, src, nb) != FG_OK)) {
        fg__status_drop(fg_dev_free(dev, hold));
        goto fail_log;
    }
    fg__tape_restore(tp);
    fg__step_release(mark);
    /* from here on, step memory made now stays for the step */
    if (dev) {
        out = fg_empty(meta.dtype, meta.ndim, meta.shape);
        if (out && fg_dev_copy_d2d(dev, out->data, hold, nb) != FG_OK) out = NULL;
        fg__status_drop(fg_dev_free(dev, hold));
    } else {
        void *data = fg_step_alloc(nb ? nb : 1);
        if (data) memmove(data, src, nb);
        out = data ? fg__tensor_header_like(&meta) : NULL;
        if (out) out->data = data;
    }
    ckpt *c = fg_step_alloc(sizeof *c);
    fg_tensor **xleaf = nleaves ? fg_step_alloc(sizeof *xleaf * (size_t)nleaves) : NULL;
    uint64_t *draws = nlog ? fg_step_alloc(sizeof *draws * (size_t)nlog) : NULL;
    if (!c || !out || (nleaves && !xleaf) || (nlog && !draws)) {
        fg_error_wrap(FG_ENOMEM, "checkpoint");
        out = NULL;
        goto done;
    }
    if (nleaves) memcpy(xleaf, leaves, sizeof *xleaf * (size_t)nleaves);
    if (nlog) memcpy(draws, log, sizeof *draws * (size_t)nlog);
    *c = (ckpt){fn, ud, draws, nlog, fg_autocast_dtype()};
    fg__node *node;
    st = nleaves || x->requires_grad
             ? fg__record_always(&node, "checkpoint", ckpt_backward, out, 1, &x)
             : fg__record(&node, "checkpoint", ckpt_backward, out, 1, &x);
    if (st != FG_OK) {
        out = NULL;
    } else if (node) {
        node->ctx = c;
        node->xleaf = xleaf;
        node->nxleaf = nleaves;
    }
done:
    fg_free(leaves);
    fg_free(log);
    return out;
fail_log:
    fg_free(log);
fail:
    fg_free(leaves);
    fg__tape_restore(tp);
    fg__step_release(mark);
    fg_error_wrap(fg_last_status() ? fg_last_status() : FG_ENOMEM, "checkpoint");
    return NULL;
}
