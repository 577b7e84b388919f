/* LSTM and GRU modules (torch.nn.LSTM, torch.nn.GRU): per layer and
 * direction the input projection of every time step is one fg_linear,
 * then the recurrence is one fused node (fn_rnn.c) where it applies, else
 * the recorded autograd ops: each step adds the hidden projection, splits
 * the gates and applies PyTorch's cell formulas. The
 * parameter names, order, shapes and initialisation are PyTorch's. The
 * initial states and the final-state outputs of fg_rnn_forward reach the
 * forward callback through a per-thread slot, so that the call goes
 * through fg_module_forward (modes, sharding hooks) like any module's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn_impl.h"

typedef struct rnn_ud {
    bool gru;
    int64_t in, hidden, layers;
    int dirs;
    bool batch_first, bias;
    /* [layer * dirs + dir][0..3]: w_ih, w_hh, b_ih, b_hh */
    fg_tensor *(*p)[4];
    fg_module *drop; /* the child "dropout" between layers, or NULL */
} rnn_ud;

static void rnn_ud_free(void *v) {
    rnn_ud *u = v;
    if (!u) return;
    fg_free(u->p);
    fg_free(u);
}

/* What fg_rnn_forward hands to the callback (this thread's call only). */
typedef struct rnn_call {
    bool armed;
    fg_tensor *h0, *c0;
    fg_tensor **hn, **cn;
    /* fg__rnn_forward_embedded: the embedding's weight (V, in) and the
     * indices (T, N), contiguous i32, in place of the input */
    fg_tensor *emb_w, *emb_idx;
} rnn_call;

static _Thread_local rnn_call tl_call;

/* fg__rnn_set_path's choice: 0 auto, 1 composed */
static _Atomic int g_path;

fg_status fg__rnn_set_path(const char *mode) {
    if (mode && (!strcmp(mode, "auto") || !strcmp(mode, "composed"))) {
        g_path = !strcmp(mode, "composed");
        return FG_OK;
    }
    return fg_error(FG_EINVAL, "rnn path \"%s\": expected auto or composed",
                    mode ? mode : "(null)");
}

/* The composed path, by fg__rnn_set_path or FULGUR_RNN=composed (read at
 * each call, as FULGUR_CONV is; any other value is the default) */
static bool composed(void) {
    const char *e = getenv("FULGUR_RNN");
    return g_path == 1 || (e && !strcmp(e, "composed"));
}

/* The fused path of the LSTM and the GRU (fg__lstm_seq, fg__gru_seq: one
 * node, one product and one pass a step instead of ~15 recorded ops; the
 * lstm row's step ran 2x faster, docs/performance.md) where it exists: on
 * the CPU in f32 and f64, outside autocast (whose LSTM and GRU run their
 * products in the low precision through the composed ops). The engine of
 * its products is still chosen per shape class (k_rnn.c). */
static bool rnn_fused(const fg_tensor *x, const fg_tensor *w) {
    return !composed() && fg__lstm_seq_available(x) && !fg__autocast_applies(x, w);
}

static fg_tensor *run_dir_xw(const rnn_ud *u, fg_tensor *const *p, fg_tensor *xw, bool reverse,
                             fg_tensor **h, fg_tensor **c);

/* One direction of one layer over x (T, N, in): returns (T, N, H), the last
 * states in *h and *c (which hold the initial ones on entry; *c unused for
 * a GRU). */
static fg_tensor *run_dir(const rnn_ud *u, fg_tensor *const *p, fg_tensor *x, bool reverse,
                          fg_tensor **h, fg_tensor **c) {
    fg_tensor *xw = fg_linear(x, p[0], p[2]); /* (T, N, G*H) */
    return run_dir_xw(u, p, xw, reverse, h, c);
}

/* run_dir from the input projection xw (T, N, G*H) of every step made */
static fg_tensor *run_dir_xw(const rnn_ud *u, fg_tensor *const *p, fg_tensor *xw, bool reverse,
                             fg_tensor **h, fg_tensor **c) {
    if (!xw) return NULL;
    int64_t T = fg_tensor_dim(xw, 0), N = fg_tensor_dim(xw, 1), H = u->hidden;
    int G = u->gru ? 3 : 4;
    if (u->gru && rnn_fused(xw, p[1])) { /* (T, N, H): the hidden states */
        fg_tensor *y = fg__gru_seq(xw, p[1], p[3], *h, reverse);
        *h = fg_reshape(fg_narrow(y, 0, reverse ? 0 : T - 1, 1), 2, (int64_t[]){N, H});
        return *h ? y : NULL;
    }
    if (!u->gru && rnn_fused(xw, p[1])) { /* (T + 1, N, H): the hidden states, then c_T */
        fg_tensor *y = fg__lstm_seq(xw, p[1], p[3], *h, *c, reverse);
        int64_t nh[2] = {N, H};
        *h = fg_reshape(fg_narrow(y, 0, reverse ? 0 : T - 1, 1), 2, nh);
        *c = fg_reshape(fg_narrow(y, 0, T, 1), 2, nh);
        return *h && *c ? fg_narrow(y, 0, 0, T) : NULL;
    }
    fg_tensor **hs = fg_calloc((size_t)T, sizeof *hs);
    if (!hs) return NULL;
    fg_tensor *out = NULL;
    int64_t ng[2] = {N, G * H};
    for (int64_t s = 0; s < T; s++) {
        int64_t t = reverse ? T - 1 - s : s;
        fg_tensor *gx = fg_reshape(fg_narrow(xw, 0, t, 1), 2, ng);
        fg_tensor *gh = fg_linear(*h, p[1], p[3]);
        if (!gx || !gh) goto done;
        if (u->gru) {
            fg_tensor *a[3], *b[3];
            int na, nb;
            if (fg_split(gx, H, 1, a, 3, &na) || fg_split(gh, H, 1, b, 3, &nb)) goto done;
            fg_tensor *r = fg_sigmoid(fg_add(a[0], b[0]));
            fg_tensor *z = fg_sigmoid(fg_add(a[1], b[1]));
            fg_tensor *n = fg_tanh(fg_add(a[2], fg_mul(r, b[2])));
            *h = fg_add(n, fg_mul(z, fg_sub(*h, n))); /* (1 - z) n + z h */
        } else {
            fg_tensor *gates = fg_add(gx, gh), *q[4];
            int nq;
            if (!gates || fg_split(gates, H, 1, q, 4, &nq)) goto done;
            fg_tensor *i = fg_sigmoid(q[0]), *f = fg_sigmoid(q[1]);
            fg_tensor *g = fg_tanh(q[2]), *o = fg_sigmoid(q[3]);
            *c = fg_add(fg_mul(f, *c), fg_mul(i, g));
            *h = fg_mul(o, fg_tanh(*c));
            if (!*c) goto done;
        }
        if (!*h) goto done;
        hs[t] = *h;
    }
    out = fg_stack(hs, (int)T, 0);
done:
    fg_free(hs);
    return out;
}

static fg_tensor *state_at(fg_tensor *s, int64_t k, int64_t N, int64_t H, fg_dtype dt) {
    if (!s) return fg_zeros(dt, 2, (int64_t[]){N, H});
    return fg_reshape(fg_narrow(s, 0, k, 1), 2, (int64_t[]){N, H});
}

static FG_MUST_USE fg_status check_state(const rnn_ud *u, const char *what, fg_tensor *s, int64_t N,
                                         fg_dtype dt) {
    if (!s) return FG_OK;
    int64_t want[3] = {u->layers * u->dirs, N, u->hidden};
    bool ok = fg_tensor_ndim(s) == 3 && fg_tensor_dtype(s) == dt;
    for (int d = 0; ok && d < 3; d++) ok = fg_tensor_dim(s, d) == want[d];
    if (ok) return FG_OK;
    char b[96];
    return fg_error(FG_EINVAL, "%s: %s %s: expected %s [%lld, %lld, %lld]", u->gru ? "GRU" : "LSTM",
                    what, fg_tensor_describe(s, b, sizeof b), fg_dtype_name(dt), (long long)want[0],
                    (long long)want[1], (long long)want[2]);
}

static fg_tensor *rnn_run(const rnn_ud *u, fg_tensor *x, rnn_call call, bool batch_first);

/* The first layer's input projection from the embedding's: the table
 * E W_ih^T + b_ih (V, G*H) once, then its rows at the indices (T, N, G*H):
 * the same sums as embedding then projection, over V rows instead of T N. */
static fg_tensor *embedded_xw(fg_tensor *const *p, rnn_call call) {
    return fg_embedding(call.emb_idx, fg_linear(call.emb_w, p[0], p[2]));
}

/* (k, H) -> (k, 1, H): the state of an unbatched input; anything else as it is */
static fg_tensor *batch_of_one(fg_tensor *s) {
    if (!s || fg_tensor_ndim(s) != 2) return s;
    return fg_reshape(s, 3, (int64_t[]){fg_tensor_dim(s, 0), 1, fg_tensor_dim(s, 1)});
}

static fg_tensor *drop_batch(fg_tensor *t, int64_t d0) {
    return fg_reshape(t, 2, (int64_t[]){d0, fg_tensor_dim(t, 2)});
}

static fg_tensor *rnn_fwd(fg_module *m, fg_tensor *x, void *ud) {
    (void)m;
    const rnn_ud *u = ud;
    rnn_call call = tl_call;
    tl_call = (rnn_call){0};
    if (!call.armed) call = (rnn_call){0};
    if (call.emb_w) return rnn_run(u, x, call, u->batch_first);
    const char *type = u->gru ? "GRU" : "LSTM";
    fg_dtype dt = fg_tensor_dtype(u->p[0][0]);
    char b[96];
    int nd = fg_tensor_ndim(x);
    bool dims_ok = nd == 2 || nd == 3;
    for (int d = 0; dims_ok && d < nd; d++) dims_ok = fg_tensor_dim(x, d) > 0;
    if (!dims_ok || fg_tensor_dim(x, nd - 1) != u->in || fg_tensor_dtype(x) != dt) {
        fg_error(FG_EINVAL,
                 "%s: input %s: expected %s (%s, %s, %lld), or (T, %lld) unbatched, with "
                 "non-empty dims",
                 type, fg_tensor_describe(x, b, sizeof b), fg_dtype_name(dt),
                 u->batch_first ? "N" : "T", u->batch_first ? "T" : "N", (long long)u->in,
                 (long long)u->in);
        return NULL;
    }
    if (nd == 3) return rnn_run(u, x, call, u->batch_first);
    /* unbatched (T, in), as PyTorch whatever batch_first says: a batch of one */
    int64_t T = fg_tensor_dim(x, 0), nst = u->layers * u->dirs;
    fg_tensor **hn_out = call.hn, **cn_out = call.cn, *hn = NULL, *cn = NULL;
    call.h0 = batch_of_one(call.h0);
    call.c0 = batch_of_one(call.c0);
    call.hn = hn_out ? &hn : NULL;
    call.cn = cn_out ? &cn : NULL;
    fg_tensor *y = rnn_run(u, fg_reshape(x, 3, (int64_t[]){T, 1, u->in}), call, false);
    if (!y) return NULL;
    if (hn_out) *hn_out = drop_batch(hn, nst);
    if (cn_out && cn) *cn_out = drop_batch(cn, nst);
    return drop_batch(y, T);
}

static fg_tensor *rnn_run(const rnn_ud *u, fg_tensor *x, rnn_call call, bool batch_first) {
    fg_dtype dt = fg_tensor_dtype(u->p[0][0]);
    if (!x) return NULL;
    if (batch_first && !call.emb_w && !(x = fg_transpose(x, 0, 1))) return NULL;
    int64_t N = fg_tensor_dim(call.emb_w ? call.emb_idx : x, 1), H = u->hidden;
    if (check_state(u, "h0", call.h0, N, dt) || (!u->gru && check_state(u, "c0", call.c0, N, dt)))
        return NULL;
    int64_t nst = u->layers * u->dirs;
    fg_tensor **hn = fg_calloc((size_t)(2 * nst), sizeof *hn), **cn = hn ? hn + nst : NULL;
    if (!hn) return NULL;
    fg_tensor *y = x; /* embedded: the indices, a placeholder layer 0 does not read */
    for (int64_t l = 0; l < u->layers && y; l++) {
        fg_tensor *outs[2] = {NULL, NULL};
        for (int d = 0; d < u->dirs; d++) {
            int64_t k = l * u->dirs + d;
            fg_tensor *h = state_at(call.h0, k, N, H, dt);
            fg_tensor *c = u->gru ? NULL : state_at(call.c0, k, N, H, dt);
            if (!h || (!u->gru && !c)) goto fail;
            outs[d] = l == 0 && call.emb_w
                          ? run_dir_xw(u, u->p[k], embedded_xw(u->p[k], call), d == 1, &h, &c)
                          : run_dir(u, u->p[k], y, d == 1, &h, &c);
            if (!outs[d]) goto fail;
            hn[k] = h;
            cn[k] = c;
        }
        y = u->dirs == 2 ? fg_cat(outs, 2, 2) : outs[0];
        if (u->drop && l + 1 < u->layers && y) y = fg_module_forward(u->drop, y);
    }
    if (!y) goto fail;
    if (batch_first) y = fg_transpose(y, 0, 1);
    if (call.hn) *call.hn = fg_stack(hn, (int)nst, 0);
    if (call.cn && !u->gru) *call.cn = fg_stack(cn, (int)nst, 0);
    if (!y || (call.hn && !*call.hn) || (call.cn && !u->gru && !*call.cn)) goto fail;
    fg_free(hn);
    return y;
fail:
    fg_free(hn);
    return NULL;
}

static fg_module *rnn_new(bool gru, int64_t in, int64_t hidden, const fg_rnn_opts *o, fg_dtype dt) {
    const char *type = gru ? "GRU" : "LSTM";
    fg_rnn_opts op = o ? *o : (fg_rnn_opts){0};
    int64_t layers = op.num_layers ? op.num_layers : 1;
    if (in <= 0 || hidden <= 0 || layers < 1 || !(op.dropout >= 0 && op.dropout < 1)) {
        fg_error(FG_EINVAL,
                 "%s: input_size %lld, hidden_size %lld, num_layers %lld, dropout %g: expected "
                 "sizes > 0 and dropout in [0, 1)",
                 type, (long long)in, (long long)hidden, (long long)layers, op.dropout);
        return NULL;
    }
    if (fg__model_dtype(dt, type, &dt) != FG_OK) return NULL;
    rnn_ud *u = fg_calloc(1, sizeof *u);
    int dirs = op.bidirectional ? 2 : 1;
    if (u) u->p = fg_calloc((size_t)(layers * dirs), sizeof *u->p);
    if (u && !u->p) {
        fg_free(u);
        u = NULL;
    }
    fg_module *m = u ? fg_module_new(type, rnn_fwd, u, rnn_ud_free) : NULL;
    if (!m) return NULL;
    *u = (rnn_ud){.gru = gru,
                  .in = in,
                  .hidden = hidden,
                  .layers = layers,
                  .dirs = dirs,
                  .batch_first = op.batch_first,
                  .bias = !op.no_bias,
                  .p = u->p};
    int64_t G = gru ? 3 : 4;
    double bound = 1.0 / sqrt((double)hidden);
    fg_init init = {FG_INIT_UNIFORM, -bound, bound};
    static const char *const names[4] = {"weight_ih", "weight_hh", "bias_ih", "bias_hh"};
    for (int64_t l = 0; l < layers; l++)
        for (int d = 0; d < dirs; d++) {
            int64_t lin = l == 0 ? in : hidden * dirs;
            int64_t shapes[4][2] = {
                {G * hidden, lin}, {G * hidden, hidden}, {G * hidden, 0}, {G * hidden, 0}};
            for (int k = 0; k < (u->bias ? 4 : 2); k++) {
                char name[64];
                snprintf(name, sizeof name, "%s_l%lld%s", names[k], (long long)l,
                         d ? "_reverse" : "");
                u->p[l * dirs + d][k] =
                    fg_module_add_param(m, name, dt, k < 2 ? 2 : 1, shapes[k], &init);
                if (!u->p[l * dirs + d][k]) {
                    fg_module_free(m);
                    return NULL;
                }
            }
        }
    if (op.dropout > 0 && layers > 1) {
        u->drop = fg_dropout_new(op.dropout);
        if (fg_module_add_child(m, "dropout", u->drop) != FG_OK) { /* the child is consumed */
            fg_module_free(m);
            return NULL;
        }
    }
    return m;
}

fg_module *fg_lstm_new(int64_t input_size, int64_t hidden_size, const fg_rnn_opts *o, fg_dtype dt) {
    return rnn_new(false, input_size, hidden_size, o, dt);
}

fg_module *fg_gru_new(int64_t input_size, int64_t hidden_size, const fg_rnn_opts *o, fg_dtype dt) {
    return rnn_new(true, input_size, hidden_size, o, dt);
}

fg_tensor *fg_rnn_forward(fg_module *m, fg_tensor *x, fg_tensor *h0, fg_tensor *c0, fg_tensor **h_n,
                          fg_tensor **c_n) {
    if (h_n) *h_n = NULL;
    if (c_n) *c_n = NULL;
    if (!m || !m->forward || m->forward != rnn_fwd) {
        fg_error(FG_EINVAL, "rnn_forward: module %s is not an LSTM or GRU", m ? m->type : "NULL");
        return NULL;
    }
    if (m->checkpoint) { /* fg_checkpoint carries one input and recomputes without the rest */
        fg_error(FG_EUNSUPPORTED,
                 "%s: module %s runs under activation checkpointing, which carries its input "
                 "alone: call fg_module_forward, or turn checkpointing off for it",
                 "rnn_forward", m->type);
        return NULL;
    }
    tl_call = (rnn_call){.armed = true, .h0 = h0, .c0 = c0, .hn = NULL, .cn = NULL};
    fg_tensor *hn = NULL, *cn = NULL;
    tl_call.hn = &hn;
    tl_call.cn = &cn;
    fg_tensor *y = fg_module_forward(m, x);
    tl_call = (rnn_call){0};
    if (!y) return NULL;
    if (h_n) *h_n = hn;
    if (c_n) *c_n = cn;
    return y;
}

fg_tensor *fg__rnn_forward_embedded(fg_module *m, fg_module *emb, fg_tensor *idx, bool *applied) {
    *applied = false;
    if (composed() || !m || m->forward != rnn_fwd || m->checkpoint || !emb ||
        strcmp(emb->type, "Embedding") || emb->checkpoint ||
        (emb->wrap_unit >= 0 && emb->flat->wrap) || !idx || fg_tensor_dtype(idx) != FG_I32 ||
        fg_tensor_ndim(idx) != 2)
        return NULL;
    const rnn_ud *u = m->ud;
    fg_tensor *w = fg_module_param(emb, 0);
    if (!w || fg_tensor_ndim(w) != 2 || fg_tensor_dim(w, 1) != u->in ||
        fg_tensor_dtype(w) != fg_tensor_dtype(u->p[0][0]) ||
        fg_tensor_dim(w, 0) >= fg_tensor_numel(idx) || fg__autocast_applies(w, u->p[0][0]))
        return NULL;
    *applied = true;
    /* the indices in time-major order, (T, N) */
    fg_tensor *it = u->batch_first ? fg_tensor_transpose_view(idx, 0, 1) : idx;
    fg_tensor *ic = it ? fg_tensor_contiguous(it) : NULL;
    if (!ic) return NULL;
    tl_call = (rnn_call){.armed = true, .emb_w = w, .emb_idx = ic};
    fg_tensor *y = fg_module_forward(m, idx);
    tl_call = (rnn_call){0};
    return y;
}
