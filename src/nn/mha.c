/* MultiheadAttention (torch.nn.MultiheadAttention, kdim = vdim =
 * embed_dim, no dropout) built from the recorded autograd ops as PyTorch
 * 1.13's F.multi_head_attention_forward computes it: q, k, v projected by
 * the three row blocks of in_proj_weight, split into heads, q scaled by
 * 1/sqrt(head_dim), scores q k^T with the masks applied (boolean masks as
 * -inf, float masks added), softmax over the keys, weights times v, heads
 * joined, out_proj. Self-attention without an attention mask, returned
 * weights or active dropout (a transformer encoder's call, with its key
 * padding mask or not) takes the fused kernel instead (mha_fused). The query/key/value and masks of
 * fg_mha_forward reach the forward callback through a per-thread slot, so the call goes through
 * fg_module_forward like any module's. */
#include <math.h>

#include "nn_impl.h"

typedef struct mha_ud {
    int64_t E, heads;
    bool batch_first;
    fg_tensor *w, *b; /* in_proj_weight, in_proj_bias (NULL without bias) */
    fg_module *out_proj;
    fg_module *drop; /* the child "dropout" on the attention weights, or NULL */
} mha_ud;

typedef struct mha_call {
    bool armed;
    fg_tensor *k, *v;
    fg_mha_args a;
    fg_tensor **weights;
} mha_call;

static _Thread_local mha_call tl_call;

static bool is_mask_dtype(fg_dtype dt) { return dt == FG_U8 || dt == FG_I32; }

/* (T, N, E) -> (N*heads, T, hd) */
static fg_tensor *heads_of(fg_tensor *t, int64_t heads) {
    int64_t T = fg_tensor_dim(t, 0), N = fg_tensor_dim(t, 1), E = fg_tensor_dim(t, 2);
    return fg_transpose(fg_reshape(t, 3, (int64_t[]){T, N * heads, E / heads}), 0, 1);
}

static fg_tensor *mha_run(const mha_ud *u, fg_tensor *const *in, mha_call c, bool batch_first);

/* (T, E) -> (T, 1, E), one reshape per distinct tensor */
static FG_MUST_USE fg_status one_batch(fg_tensor **in, fg_tensor *const *orig, int64_t E) {
    for (int i = 0; i < 3; i++) {
        in[i] = NULL;
        for (int j = 0; j < i; j++)
            if (orig[j] == orig[i]) in[i] = in[j];
        if (!in[i]) in[i] = fg_reshape(orig[i], 3, (int64_t[]){fg_tensor_dim(orig[i], 0), 1, E});
        if (!in[i]) return fg_last_status();
    }
    return FG_OK;
}

static fg_tensor *mha_fwd(fg_module *m, fg_tensor *q, void *ud) {
    (void)m;
    const mha_ud *u = ud;
    mha_call c = tl_call;
    tl_call = (mha_call){0};
    if (!c.armed) c = (mha_call){.k = q, .v = q};
    fg_dtype dt = fg_tensor_dtype(u->w);
    fg_tensor *in[3] = {q, c.k, c.v};
    static const char *const what[3] = {"query", "key", "value"};
    char b[96];
    int nd = fg_tensor_ndim(q);
    for (int i = 0; i < 3; i++)
        if (!in[i] || (nd != 2 && nd != 3) || fg_tensor_ndim(in[i]) != nd ||
            fg_tensor_dim(in[i], nd - 1) != u->E || fg_tensor_dtype(in[i]) != dt) {
            if (!in[i]) return NULL;
            fg_error(FG_EINVAL,
                     "MultiheadAttention: %s %s: expected %s (%s, %lld), or (L, %lld) "
                     "unbatched, as the query",
                     what[i], fg_tensor_describe(in[i], b, sizeof b), fg_dtype_name(dt),
                     u->batch_first ? "N, L" : "L, N", (long long)u->E, (long long)u->E);
            return NULL;
        }
    if (nd == 3) return mha_run(u, in, c, u->batch_first);
    /* unbatched, as PyTorch whatever batch_first says: a batch of one */
    fg_tensor *in3[3], *w = NULL, **w_out = c.weights;
    if (one_batch(in3, in, u->E)) return NULL;
    fg_tensor *kpm = c.a.key_padding_mask;
    if (kpm && fg_tensor_ndim(kpm) == 1) {
        c.a.key_padding_mask =
            fg_tensor_reshape_view(kpm, 2, (int64_t[]){1, fg_tensor_dim(kpm, 0)});
        if (!c.a.key_padding_mask) return NULL;
    }
    c.weights = w_out ? &w : NULL;
    fg_tensor *y = mha_run(u, in3, c, false);
    if (!y) return NULL;
    if (w_out) { /* (1, [H,] L, S) -> ([H,] L, S) */
        int wn = fg_tensor_ndim(w);
        *w_out = fg_reshape(w, wn - 1, fg_tensor_shape(w) + 1);
        if (!*w_out) return NULL;
    }
    return fg_reshape(y, 2, (int64_t[]){fg_tensor_dim(y, 0), u->E});
}

/* Self-attention of x (and its key padding mask): one product by the
 * whole in_proj_weight gives the packed (N, L, 3E) that fg_attention reads
 * (q, k and v the three column blocks, head h columns [h hd, (h+1) hd) of
 * each, the split of heads_of), so the heads are never transposed apart and
 * the (L, L) scores never kept. The recorded path's values to rounding (the
 * scale is applied to the scores rather than to q). */
static fg_tensor *mha_fused(const mha_ud *u, fg_tensor *x, fg_tensor *kpm, bool batch_first) {
    fg_tensor *xb = batch_first ? x : fg_transpose(x, 0, 1); /* (N, L, E) */
    fg_tensor *qkv = xb ? fg_linear(xb, u->w, u->b) : NULL;
    fg_tensor *o = qkv ? fg_attention(qkv, (int)u->heads, false, kpm) : NULL;
    fg_tensor *y = o ? fg_module_forward(u->out_proj, o) : NULL;
    return batch_first || !y ? y : fg_transpose(y, 0, 1);
}

/* whether the call can take mha_fused: self-attention without an
 * attention mask, returned weights or active dropout, its key padding mask
 * (if any) one fg_attention takes (a wrong one goes to the recorded path,
 * which names what is wrong) */
static bool fusable(const mha_ud *u, fg_tensor *const *in, const mha_call *c, bool batch_first) {
    if (in[0] != in[1] || in[1] != in[2] || c->a.attn_mask || c->weights ||
        (u->drop && fg_module_is_training(u->drop)))
        return false;
    const fg_tensor *k = c->a.key_padding_mask, *x = in[0];
    return !k || (fg_tensor_ndim(k) == 2 && is_mask_dtype(fg_tensor_dtype(k)) &&
                  fg_tensor_dim(k, 0) == fg_tensor_dim(x, batch_first ? 0 : 1) &&
                  fg_tensor_dim(k, 1) == fg_tensor_dim(x, batch_first ? 1 : 0));
}

static fg_tensor *mha_run(const mha_ud *u, fg_tensor *const *in_, mha_call c, bool batch_first) {
    if (fusable(u, in_, &c, batch_first))
        return mha_fused(u, in_[0], c.a.key_padding_mask, batch_first);
    fg_dtype dt = fg_tensor_dtype(u->w);
    fg_tensor *in[3] = {in_[0], in_[1], in_[2]};
    char b[96];
    if (batch_first) { /* a tensor passed twice is transposed once */
        fg_tensor *orig[3] = {in[0], in[1], in[2]};
        for (int i = 0; i < 3; i++) {
            int same = -1;
            for (int j = 0; j < i; j++)
                if (orig[j] == orig[i]) same = j;
            in[i] = same >= 0 ? in[same] : fg_transpose(orig[i], 0, 1);
            if (!in[i]) return NULL;
        }
    }
    int64_t L = fg_tensor_dim(in[0], 0), N = fg_tensor_dim(in[0], 1), S = fg_tensor_dim(in[1], 0);
    int64_t E = u->E, H = u->heads, hd = E / H;
    if (fg_tensor_dim(in[1], 1) != N || fg_tensor_dim(in[2], 1) != N ||
        fg_tensor_dim(in[2], 0) != S) {
        fg_error(FG_EINVAL,
                 "MultiheadAttention: query batch %lld, key %s, value %s: expected one batch "
                 "size and key and value of one length",
                 (long long)N, fg_tensor_describe(in[1], b, sizeof b),
                 fg_tensor_describe(in[2], b + 48, 48));
        return NULL;
    }
    fg_tensor *proj[3];
    for (int i = 0; i < 3; i++) {
        fg_tensor *w = fg_narrow(u->w, 0, i * E, E);
        fg_tensor *bias = u->b ? fg_narrow(u->b, 0, i * E, E) : NULL;
        proj[i] = heads_of(fg_linear(in[i], w, bias), H);
        if (!proj[i]) return NULL;
    }
    fg_tensor *qs = fg_scale(proj[0], 1.0 / sqrt((double)hd));
    fg_tensor *scores = fg_matmul(qs, fg_transpose(proj[1], 1, 2)); /* (N*H, L, S) */
    if (!scores) return NULL;
    fg_tensor *am = c.a.attn_mask;
    if (am) {
        int nd = fg_tensor_ndim(am);
        bool ok = (nd == 2 && fg_tensor_dim(am, 0) == L && fg_tensor_dim(am, 1) == S) ||
                  (nd == 3 && fg_tensor_dim(am, 0) == N * H && fg_tensor_dim(am, 1) == L &&
                   fg_tensor_dim(am, 2) == S);
        if (!ok ||
            !(is_mask_dtype(fg_tensor_dtype(am)) || fg_dtype_is_float(fg_tensor_dtype(am)))) {
            fg_error(FG_EINVAL,
                     "MultiheadAttention: attn_mask %s: expected (%lld, %lld) or (%lld, %lld, "
                     "%lld), u8/i32 or float",
                     fg_tensor_describe(am, b, sizeof b), (long long)L, (long long)S,
                     (long long)(N * H), (long long)L, (long long)S);
            return NULL;
        }
        scores = is_mask_dtype(fg_tensor_dtype(am)) ? fg_masked_fill(scores, am, -INFINITY)
                                                    : fg_add(scores, fg_cast(am, dt));
    }
    fg_tensor *kpm = c.a.key_padding_mask;
    if (kpm) {
        if (fg_tensor_ndim(kpm) != 2 || fg_tensor_dim(kpm, 0) != N || fg_tensor_dim(kpm, 1) != S ||
            !is_mask_dtype(fg_tensor_dtype(kpm))) {
            fg_error(FG_EINVAL,
                     "MultiheadAttention: key_padding_mask %s: expected u8 or i32 "
                     "(%lld, %lld)",
                     fg_tensor_describe(kpm, b, sizeof b), (long long)N, (long long)S);
            return NULL;
        }
        fg_tensor *s4 = fg_reshape(scores, 4, (int64_t[]){N, H, L, S});
        fg_tensor *k4 = fg_tensor_reshape_view(kpm, 4, (int64_t[]){N, 1, 1, S});
        if (!k4) return NULL;
        scores = fg_reshape(fg_masked_fill(s4, k4, -INFINITY), 3, (int64_t[]){N * H, L, S});
    }
    fg_tensor *attn = fg_softmax_dim(scores, -1);
    if (u->drop && attn) attn = fg_module_forward(u->drop, attn); /* the weights returned too */
    fg_tensor *o = fg_matmul(attn, proj[2]);                      /* (N*H, L, hd) */
    o = fg_reshape(fg_transpose(o, 0, 1), 3, (int64_t[]){L, N, E});
    fg_tensor *y = fg_module_forward(u->out_proj, o);
    if (!y) return NULL;
    if (c.weights) {
        fg_tensor *w4 = fg_reshape(attn, 4, (int64_t[]){N, H, L, S});
        *c.weights = c.a.per_head_weights ? w4 : fg_mean_dim(w4, 1, false);
        if (!*c.weights) return NULL;
    }
    return batch_first ? fg_transpose(y, 0, 1) : y;
}

fg_module *fg_multihead_attention_new(int64_t embed_dim, int64_t num_heads, const fg_mha_opts *o,
                                      fg_dtype dt) {
    fg_mha_opts op = o ? *o : (fg_mha_opts){0};
    if (embed_dim <= 0 || num_heads <= 0 || embed_dim % num_heads ||
        !(op.dropout >= 0 && op.dropout < 1)) {
        fg_error(FG_EINVAL,
                 "MultiheadAttention: embed_dim %lld, num_heads %lld, dropout %g: expected > 0, "
                 "embed_dim divisible by num_heads and dropout in [0, 1)",
                 (long long)embed_dim, (long long)num_heads, op.dropout);
        return NULL;
    }
    if (fg__model_dtype(dt, "MultiheadAttention", &dt) != FG_OK) return NULL;
    mha_ud *u = fg_calloc(1, sizeof *u);
    fg_module *m = u ? fg_module_new("MultiheadAttention", mha_fwd, u, fg_free) : NULL;
    if (!m) return NULL;
    u->E = embed_dim;
    u->heads = num_heads;
    u->batch_first = op.batch_first;
    /* xavier_uniform_ of a (3E, E) matrix: fan_in E, fan_out 3E */
    double bound = sqrt(6.0 / (double)(4 * embed_dim));
    u->w = fg_module_add_param(m, "in_proj_weight", dt, 2, (int64_t[]){3 * embed_dim, embed_dim},
                               &(fg_init){FG_INIT_UNIFORM, -bound, bound});
    if (u->w && !op.no_bias)
        u->b = fg_module_add_param(m, "in_proj_bias", dt, 1, (int64_t[]){3 * embed_dim}, NULL);
    fg_module *out =
        u->w && (op.no_bias || u->b) ? fg_linear_new(embed_dim, embed_dim, !op.no_bias, dt) : NULL;
    if (out && !op.no_bias && fg_module_set_init(out, "bias", NULL) != FG_OK) {
        fg_module_free(out);
        out = NULL;
    }
    u->out_proj = out;
    if (!out || fg_module_add_child(m, "out_proj", out) != FG_OK) { /* out consumed */
        fg_module_free(m);
        return NULL;
    }
    if (op.dropout > 0) {
        u->drop = fg_dropout_new(op.dropout);
        if (fg_module_add_child(m, "dropout", u->drop) != FG_OK) { /* the child is consumed */
            fg_module_free(m);
            return NULL;
        }
    }
    return m;
}

fg_tensor *fg_mha_forward(fg_module *m, fg_tensor *query, fg_tensor *key, fg_tensor *value,
                          const fg_mha_args *a, fg_tensor **weights) {
    if (weights) *weights = NULL;
    if (!m || m->forward != mha_fwd) {
        fg_error(FG_EINVAL, "mha_forward: module %s is not a MultiheadAttention",
                 m ? m->type : "NULL");
        return NULL;
    }
    if (!key || !value) {
        fg_error_wrap(FG_EINVAL, "mha_forward: NULL %s (an earlier call failed)",
                      key ? "value" : "key");
        return NULL;
    }
    if (m->checkpoint) { /* fg_checkpoint carries one input and recomputes without the rest */
        fg_error(FG_EUNSUPPORTED,
                 "%s: module %s runs under activation checkpointing, which carries its input "
                 "alone: call fg_module_forward, or turn checkpointing off for it",
                 "mha_forward", m->type);
        return NULL;
    }
    fg_tensor *w = NULL;
    tl_call = (mha_call){.armed = true, .k = key, .v = value, .weights = weights ? &w : NULL};
    if (a) tl_call.a = *a;
    fg_tensor *y = fg_module_forward(m, query);
    tl_call = (mha_call){0};
    if (y && weights) *weights = w;
    return y;
}
