/* The define-by-run tape and backward.
 *
 * The tape is a list of nodes in the order they were recorded, which is a
 * topological order; backward walks it once in reverse to mark the nodes
 * reachable from the output, counts each leaf's uses among them, then walks
 * it again running backward functions. A leaf whose last use has run has its
 * final gradient: the "gradient ready" hook fires right then, which is what
 * lets DDP start reducing a bucket while backward continues. Nodes live in
 * the step arena; a new step generation starts an empty tape. */
#include <string.h>

#include "autograd_impl.h"

static _Thread_local fg__node *tl_tail;
static _Thread_local uint64_t tl_tape_gen;
static _Thread_local int64_t tl_tape_len;
static _Thread_local bool tl_grad_disabled;
static _Thread_local uint64_t tl_pass;
static _Thread_local fg_grad_ready_fn tl_hook;
static _Thread_local void *tl_hook_ud;
/* dp replicas: leaf gradients that live in [redir_from, +redir_bytes) go to
 * the same offset of redir_to on this thread instead. */
static _Thread_local const char *tl_redir_from;
static _Thread_local char *tl_redir_to;
static _Thread_local size_t tl_redir_bytes;

static void tape_sync(void) {
    if (tl_tape_gen != fg_step_generation()) {
        tl_tail = NULL;
        tl_tape_len = 0;
        tl_tape_gen = fg_step_generation();
    }
}

/* grad_fn of t if it belongs to this step's tape. */
static fg__node *live_fn(const fg_tensor *t) {
    return t->grad_fn && t->grad_fn_gen == fg_step_generation() ? t->grad_fn : NULL;
}

static bool is_leaf(const fg_tensor *t) { return t->requires_grad && !live_fn(t); }

bool fg_set_grad_enabled(bool on) {
    bool prev = !tl_grad_disabled;
    tl_grad_disabled = !on;
    return prev;
}

bool fg_is_grad_enabled(void) { return !tl_grad_disabled; }

void fg_set_grad_ready_hook(fg_grad_ready_fn fn, void *ud) {
    tl_hook = fn;
    tl_hook_ud = ud;
}

int64_t fg_tape_size(void) {
    tape_sync();
    return tl_tape_len;
}

void fg_tensor_set_requires_grad(fg_tensor *t, bool on) {
    if (t) t->requires_grad = on;
}
bool fg_tensor_requires_grad(const fg_tensor *t) { return t && t->requires_grad; }
fg_tensor *fg_tensor_grad(const fg_tensor *t) { return t ? t->grad : NULL; }
void fg_tensor_set_name(fg_tensor *t, const char *name) {
    if (t) t->name = name;
}
const char *fg_tensor_name(const fg_tensor *t) { return t && t->name ? t->name : "(unnamed)"; }

fg_status fg_tensor_set_grad(fg_tensor *t, fg_tensor *grad) {
    if (!t) return fg_error(FG_EINVAL, "set_grad: NULL tensor");
    if (grad && (!fg_tensor_same_shape(t, grad) || grad->dtype != t->dtype)) {
        char a[96], b[96];
        return fg_error(FG_EINVAL, "set_grad: gradient %s does not match tensor %s \"%s\"",
                        fg_tensor_describe(grad, a, sizeof a), fg_tensor_describe(t, b, sizeof b),
                        fg_tensor_name(t));
    }
    if (t->flags & FG_T_OWNS_GRAD) fg_tensor_free(t->grad);
    t->flags &= ~(uint32_t)FG_T_OWNS_GRAD;
    t->grad = grad;
    return FG_OK;
}

void fg_tensor_zero_grad(fg_tensor *t) {
    /* no status to return: a device fill's failure stays in fg_last_error */
    if (t && t->grad) fg__status_drop(fg_tensor_fill(t->grad, 0));
}

const fg_op_table *fg__ops(const fg_tensor *t) { return fg_ops_get(t->device); }

fg_status fg__check_float(const char *fn, const fg_tensor *t) {
    /* wrap, not "%s" of fg_last_error(): that is the buffer fg_error writes */
    if (!t) return fg_error_wrap(FG_EINVAL, "%s: NULL input (an earlier call failed)", fn);
    if (t->dtype != FG_F32 && t->dtype != FG_F64 && t->dtype != FG_BF16 && t->dtype != FG_F16)
        return fg_error(FG_EUNSUPPORTED, "%s: dtype %s is not supported (f32, f64, bf16, f16)", fn,
                        fg_dtype_name(t->dtype));
    return FG_OK;
}

fg_status fg__check_same_dtype(const char *fn, const fg_tensor *a, const fg_tensor *b) {
    if (a->dtype != b->dtype)
        return fg_error(FG_EINVAL, "%s: dtypes differ (%s and %s)", fn, fg_dtype_name(a->dtype),
                        fg_dtype_name(b->dtype));
    if (a->device != b->device) return fg_error(FG_EINVAL, "%s: tensors on different devices", fn);
    return FG_OK;
}

static FG_MUST_USE fg_status record(fg__node **node, const char *name, fg__backward_fn bw,
                                    fg_tensor *out, int nin, fg_tensor *const *in, bool always) {
    *node = NULL;
    if (tl_grad_disabled) return FG_OK;
    bool any = always;
    for (int k = 0; k < nin; k++) any |= fg__needs_grad(in[k]);
    if (!any) return FG_OK;
    tape_sync();
    fg__node *n = fg_step_alloc(sizeof *n);
    if (!n) return fg_error_wrap(FG_ENOMEM, "%s: recording on the tape", name);
    memset(n, 0, sizeof *n);
    n->backward = bw;
    n->name = name;
    n->out = out;
    n->nin = nin;
    for (int k = 0; k < nin; k++) n->in[k] = in[k];
    n->prev = tl_tail;
    tl_tail = n;
    tl_tape_len++;
    out->requires_grad = true;
    out->grad_fn = n;
    out->grad_fn_gen = fg_step_generation();
    *node = n;
    return FG_OK;
}

fg_status fg__record(fg__node **node, const char *name, fg__backward_fn bw, fg_tensor *out, int nin,
                     fg_tensor *const *in) {
    return record(node, name, bw, out, nin, in, false);
}

fg_status fg__record_always(fg__node **node, const char *name, fg__backward_fn bw, fg_tensor *out,
                            int nin, fg_tensor *const *in) {
    return record(node, name, bw, out, nin, in, true);
}

fg__node *fg__tape_tail(void) {
    if (tl_grad_disabled) return NULL;
    tape_sync();
    return tl_tail;
}

fg__tape_point fg__tape_pos(void) {
    tape_sync();
    return (fg__tape_point){tl_tail, tl_tape_len};
}

void fg__tape_restore(fg__tape_point p) {
    tl_tail = p.tail;
    tl_tape_len = p.len;
}

/* A parameter (the leaves the "gradient ready" hook is for) */
static bool persistent_leaf(const fg_tensor *t) {
    return t && is_leaf(t) && (t->flags & FG_T_PERSISTENT);
}

fg_tensor **fg__tape_leaves_since(fg__tape_point p, int *count, fg_status *st) {
    int n = 0;
    *st = FG_OK;
    for (fg__node *q = tl_tail; q && q != p.tail; q = q->prev)
        for (int k = 0; k < q->nin; k++) n += persistent_leaf(q->in[k]);
    *count = 0;
    if (!n) return NULL;
    fg_tensor **v = fg_alloc(sizeof *v * (size_t)n);
    if (!v) {
        *st = fg_error_wrap(FG_ENOMEM, "checkpoint: the list of its %d parameter uses", n);
        return NULL;
    }
    for (fg__node *q = tl_tail; q && q != p.tail; q = q->prev)
        for (int k = 0; k < q->nin; k++)
            if (persistent_leaf(q->in[k])) v[(*count)++] = q->in[k];
    return v;
}

bool fg__tape_closed_since(fg__tape_point p, const fg_tensor *input) {
    for (fg__node *q = tl_tail; q && q != p.tail; q = q->prev)
        for (int k = 0; k < q->nin; k++) {
            const fg_tensor *t = q->in[k];
            if (!t || !t->requires_grad || t == input || persistent_leaf(t)) continue;
            fg__node *f = live_fn(t), *r = tl_tail;
            while (f && r && r != p.tail && r != f) r = r->prev;
            if (!f || r != f) return false; /* made before p, or a step leaf */
        }
    return true;
}

void fg__set_grad_redirect(const fg_tensor *from, fg_tensor *to) {
    tl_redir_from = from ? from->data : NULL;
    tl_redir_to = to ? to->data : NULL;
    tl_redir_bytes = from ? fg_tensor_nbytes(from) : 0;
}

fg_tensor *fg__grad_of(fg_tensor *t) {
    if (t->grad && tl_redir_from && (const char *)t->grad->data >= tl_redir_from &&
        (const char *)t->grad->data < tl_redir_from + tl_redir_bytes) {
        fg_tensor *g = fg__tensor_header_like(t->grad);
        if (g) g->data = tl_redir_to + ((const char *)t->grad->data - tl_redir_from);
        return g;
    }
    if (t->grad) return t->grad;
    if (is_leaf(t) && (t->flags & FG_T_PERSISTENT)) {
        t->grad = fg_tensor_new(t->dtype, t->ndim, t->shape);
        if (t->grad) t->flags |= FG_T_OWNS_GRAD;
    } else {
        t->grad = fg__step_zeros_reuse(t->dtype, t->ndim, t->shape, true);
        if (t->grad) t->grad->grad_for = t;
    }
    return t->grad;
}

fg_tensor *fg__grad_for_write(fg_tensor *t, double *beta) {
    *beta = 1.0;
    if (t->grad || (is_leaf(t) && (t->flags & FG_T_PERSISTENT))) return fg__grad_of(t);
    t->grad = fg__step_zeros_reuse(t->dtype, t->ndim, t->shape, false);
    if (t->grad) t->grad->grad_for = t;
    *beta = 0.0;
    return t->grad;
}

static void leaf_used(fg_tensor *t) {
    /* Without a hook the countdown is skipped: dp replicas share leaves
     * between threads, and nobody reads it. */
    if (tl_hook && is_leaf(t) && --t->pending == 0) tl_hook(tl_hook_ud, t);
}

/* Runs backward from out, whose gradient is set. */
static FG_MUST_USE fg_status run_backward(fg_tensor *out) {
    fg__node *root = live_fn(out);
    if (!root) { /* a leaf: its gradient is the seed */
        out->pending = 1;
        leaf_used(out);
        return FG_OK;
    }
    if (root->consumed)
        return fg_error(FG_ESTATE, "backward: this graph was already back-propagated; run the "
                                   "forward again (one backward per forward)");
    uint64_t pass = ++tl_pass;
    root->mark = pass;
    for (fg__node *n = tl_tail; n; n = n->prev) {
        if (n->mark != pass) continue;
        for (int k = 0; k < n->nin; k++) {
            fg_tensor *t = n->in[k];
            if (!t) continue;
            fg__node *p = live_fn(t);
            if (p) p->mark = pass;
            else if (t->requires_grad && tl_hook) t->pending = 0;
        }
        for (int k = 0; k < n->nxleaf && tl_hook; k++) n->xleaf[k]->pending = 0;
    }
    for (fg__node *n = tl_tail; n && tl_hook; n = n->prev)
        if (n->mark == pass) {
            for (int k = 0; k < n->nin; k++)
                if (n->in[k] && is_leaf(n->in[k])) n->in[k]->pending++;
            for (int k = 0; k < n->nxleaf; k++) n->xleaf[k]->pending++;
        }
    for (fg__node *n = tl_tail; n; n = n->prev) {
        if (n->mark != pass) continue;
        if (n->consumed)
            return fg_error(FG_ESTATE,
                            "backward: node %s was already back-propagated; run the "
                            "forward again",
                            n->name);
        if (n->out->grad) {
            fg_status s = n->backward(n, n->out->grad);
            if (s != FG_OK) return fg_error_wrap(s, "backward of %s", n->name);
        }
        n->consumed = true;
        /* out's gradient was read by this node alone: its memory goes back
         * to the step for the gradients still to come (PyTorch frees a
         * non-leaf's gradient there too) */
        fg_tensor *og = n->out->grad;
        if (og && og->grad_for == n->out && !(n->out->flags & FG_T_PERSISTENT) && og != out->grad) {
            fg__step_recycle(og);
            if (!og->data) n->out->grad = NULL;
        }
        for (int k = 0; k < n->nin; k++)
            if (n->in[k]) leaf_used(n->in[k]);
        for (int k = 0; k < n->nxleaf; k++) leaf_used(n->xleaf[k]);
    }
    return FG_OK;
}

fg_status fg__backward_inner(fg_tensor *out) {
    fg_grad_ready_fn hook = tl_hook;
    tl_hook = NULL;
    fg_status s = run_backward(out);
    tl_hook = hook;
    return s;
}

fg_status fg_backward_with(fg_tensor *out, const fg_tensor *seed) {
    if (!out) return fg_error_wrap(FG_EINVAL, "backward: NULL output (an earlier call failed)");
    if (!out->requires_grad)
        return fg_error(FG_EINVAL, "backward: the output does not require grad (no parameter "
                                   "took part, or it was computed in no-grad mode)");
    if (seed && (!fg_tensor_same_shape(seed, out) || seed->dtype != out->dtype))
        return fg_error(FG_EINVAL,
                        "backward: seed gradient shape or dtype differs from the output");
    tape_sync();
    fg_tensor *g = fg__grad_of(out);
    if (!g) return FG_ENOMEM;
    if (seed) {
        FG_TRY(fg__ops(out)->axpby(1.0, seed, 1.0, g));
    } else {
        fg_tensor *one = fg_full(out->dtype, out->ndim, out->shape, 1.0);
        if (!one) return FG_ENOMEM;
        FG_TRY(fg__ops(out)->axpby(1.0, one, 1.0, g));
    }
    return run_backward(out);
}

fg_status fg_backward(fg_tensor *loss) {
    if (loss && loss->numel != 1)
        return fg_error(FG_EINVAL,
                        "backward: the output has %lld elements; give a seed gradient "
                        "with fg_backward_with for non-scalar outputs",
                        (long long)loss->numel);
    return fg_backward_with(loss, NULL);
}
