/* Fused self-attention, causal or not. Forward keeps only the log-sum-exp of each
 * score row, lse (B, H, T), besides its output; backward recomputes the
 * probabilities from qkv and lse (the table's attention kernels), so a layer
 * holds O(B H T) extra memory instead of the (B, H, T, T) matrix. */
#include "autograd_impl.h"

/* saved[0] = contiguous qkv (in the autocast dtype under autocast), saved[1]
 * = lse, saved[2] = the contiguous key padding mask or NULL; i[0] = heads,
 * i[1] = causal */
static FG_MUST_USE fg_status attention_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *gq = fg__grad_of(n->in[0]);
    if (!gq) return FG_ENOMEM;
    return fg__ops(g)->attention_bwd(n->saved[0], (int)n->i[0], n->i[1] != 0, n->saved[2], n->out,
                                     n->saved[1], g, gq);
}

/* Under autocast, attention is one of the products: an f32 qkv is rounded
 * to the autocast dtype (its gradient stays f32), the scores and their
 * softmax are f32 inside the kernel, and y comes out in the autocast dtype.
 * A bf16/f16 qkv keeps its lse in f32. */

fg_tensor *fg_attention(fg_tensor *qkv, int heads, bool causal, fg_tensor *key_padding_mask) {
    const char *what = causal ? "causal_attention" : "attention";
    if (fg__check_float(what, qkv)) return NULL;
    char s[96];
    if (qkv->ndim != 3 || qkv->shape[2] % 3 != 0 || heads <= 0 ||
        (qkv->shape[2] / 3) % heads != 0 || qkv->shape[2] == 0) {
        fg_error(FG_EINVAL,
                 "%s: qkv %s with %d heads: expected (B, T, 3C) with C a positive multiple of "
                 "heads",
                 what, fg_tensor_describe(qkv, s, sizeof s), heads);
        return NULL;
    }
    fg_tensor *kpm = key_padding_mask;
    if (kpm && (kpm->ndim != 2 || kpm->shape[0] != qkv->shape[0] ||
                kpm->shape[1] != qkv->shape[1] || (kpm->dtype != FG_U8 && kpm->dtype != FG_I32))) {
        fg_error(FG_EINVAL, "%s: key padding mask %s: expected u8 or i32 (%lld, %lld)", what,
                 fg_tensor_describe(kpm, s, sizeof s), (long long)qkv->shape[0],
                 (long long)qkv->shape[1]);
        return NULL;
    }
    if (kpm && (kpm->device != qkv->device || kpm->dev != qkv->dev)) {
        fg_error(FG_EINVAL, "%s: the key padding mask is on %s, qkv on %s", what,
                 kpm->dev ? fg_dev_name(kpm->dev) : fg_device_kind_name(kpm->device),
                 qkv->dev ? fg_dev_name(qkv->dev) : fg_device_kind_name(qkv->device));
        return NULL;
    }
    if (kpm && !(kpm = fg_tensor_contiguous(kpm))) return NULL;
    const fg_op_table *ops = fg__ops(qkv);
    if (!ops || FG_OP(ops, attention_fwd)) return NULL;
    int64_t B = qkv->shape[0], T = qkv->shape[1], C = qkv->shape[2] / 3;
    fg_dtype ac = fg_autocast_dtype();
    fg_tensor *qc = ac != FG_DTYPE_DEFAULT && qkv->dtype == FG_F32 ? fg__autocast_operand(qkv, ac)
                                                                   : fg_tensor_contiguous(qkv);
    fg_dtype sdt = qc && (qc->dtype == FG_BF16 || qc->dtype == FG_F16) ? FG_F32 : qkv->dtype;
    fg_tensor *y = qc ? fg_empty(qc->dtype, 3, (int64_t[]){B, T, C}) : NULL;
    fg_tensor *lse = y ? fg_empty(sdt, 3, (int64_t[]){B, heads, T}) : NULL;
    if (!lse || ops->attention_fwd(qc, heads, causal, kpm, y, lse)) return NULL;
    fg__node *node;
    if (fg__record(&node, what, attention_bw, y, 1, &qkv)) return NULL;
    if (node) {
        if (FG_OP(ops, attention_bwd)) return NULL;
        node->saved[0] = qc;
        node->saved[1] = lse;
        node->saved[2] = kpm;
        node->i[0] = heads;
        node->i[1] = causal;
    }
    return y;
}

fg_tensor *fg_causal_attention(fg_tensor *qkv, int heads) {
    return fg_attention(qkv, heads, true, NULL);
}
