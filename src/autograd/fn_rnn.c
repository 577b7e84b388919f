/* The LSTM and the GRU of one direction of one layer over a whole
 * sequence as one recorded node (nn's LSTM and GRU on their fused paths):
 * the input projection xw of every step comes in made (one fg_linear over
 * the sequence, whose own backward is then one product for dx and one for
 * dW_ih), the recurrence runs in the ops layer's fused kernels
 * (fg__ops_lstm_fwd / _bwd, fg__ops_gru_fwd / _bwd). The LSTM's output
 * packs what the module returns: rows 0..T-1 the hidden states, row T the
 * final cell state; the GRU's is the hidden states alone. The gates (and
 * the LSTM's cell states) of every step are the node's saved tensors; the
 * backward writes the gates' gradient straight into xw's when it is the
 * first, and b_hh's is the column sums of the hidden product's. */
#include "autograd_impl.h"

/* saved[0] = gates (T, N, 4H), saved[1] = cell states (T, N, H),
 * saved[2..3] = contiguous h0, c0; i[0] = reverse */
static FG_MUST_USE fg_status lstm_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *xw = n->in[0], *whh = n->in[1], *h0 = n->in[2], *c0 = n->in[3];
    fg_tensor *bhh = n->nin > 4 ? n->in[4] : NULL, *gates = n->saved[0];
    const fg_op_table *ops = fg__ops(g);
    double beta = 0;
    fg_tensor *gx = fg__needs_grad(xw) ? fg__grad_for_write(xw, &beta) : NULL;
    if (fg__needs_grad(xw) && !gx) return FG_ENOMEM;
    /* the gates' gradient: into xw's own when nothing is there yet */
    fg_tensor *dg = gx && beta == 0 ? gx : fg_empty(gates->dtype, 3, gates->shape);
    fg_tensor *gw = fg__needs_grad(whh) ? fg__grad_of(whh) : NULL;
    fg_tensor *gh = fg__needs_grad(h0) ? fg__grad_of(h0) : NULL;
    fg_tensor *gc = fg__needs_grad(c0) ? fg__grad_of(c0) : NULL;
    if (!dg || (fg__needs_grad(whh) && !gw) || (fg__needs_grad(h0) && !gh) ||
        (fg__needs_grad(c0) && !gc))
        return FG_ENOMEM;
    fg_tensor *gout = fg_tensor_contiguous((fg_tensor *)g);
    if (!gout) return FG_ENOMEM;
    FG_TRY(fg__ops_lstm_bwd(whh, n->saved[2], n->saved[3], n->out, gates, n->saved[1], gout,
                            n->i[0] != 0, dg, gw, gh, gc));
    int64_t rows = gates->shape[0] * gates->shape[1], G = gates->shape[2];
    fg_tensor *dg2 = fg_tensor_reshape_view(dg, 2, (int64_t[]){rows, G});
    if (!dg2) return FG_ENOMEM;
    if (fg__needs_grad(bhh)) {
        fg_tensor *gb = fg__grad_of(bhh);
        if (!gb) return FG_ENOMEM;
        FG_TRY(ops->bias_grad(dg2, gb));
    }
    if (gx && dg != gx) FG_TRY(ops->axpby(1.0, dg, 1.0, gx));
    return FG_OK;
}

bool fg__lstm_seq_available(const fg_tensor *xw) {
    return xw && xw->device == FG_CPU && (xw->dtype == FG_F32 || xw->dtype == FG_F64);
}

fg_tensor *fg__lstm_seq(fg_tensor *xw, fg_tensor *whh, fg_tensor *bhh, fg_tensor *h0, fg_tensor *c0,
                        bool reverse) {
    if (!xw || !whh || !h0 || !c0) {
        fg_error_wrap(FG_EINVAL, "lstm: NULL input (an earlier call failed)");
        return NULL;
    }
    int64_t T = xw->shape[0], N = xw->shape[1], H = whh->shape[1];
    fg_tensor *xc = fg_tensor_contiguous(xw), *wc = fg_tensor_contiguous(whh);
    fg_tensor *bc = bhh ? fg_tensor_contiguous(bhh) : NULL;
    fg_tensor *hc = fg_tensor_contiguous(h0), *cc = fg_tensor_contiguous(c0);
    fg_tensor *y = fg_empty(xw->dtype, 3, (int64_t[]){T + 1, N, H});
    fg_tensor *gates = fg_empty(xw->dtype, 3, (int64_t[]){T, N, 4 * H});
    fg_tensor *cs = fg_empty(xw->dtype, 3, (int64_t[]){T, N, H});
    if (!xc || !wc || (bhh && !bc) || !hc || !cc || !y || !gates || !cs) return NULL;
    if (fg__ops_lstm_fwd(xc, wc, bc, hc, cc, reverse, y, gates, cs)) return NULL;
    fg__node *node;
    fg_tensor *in[5] = {xw, whh, h0, c0, bhh};
    if (fg__record(&node, "lstm", lstm_bw, y, bhh ? 5 : 4, in)) return NULL;
    if (node) {
        node->saved[0] = gates;
        node->saved[1] = cs;
        node->saved[2] = hc;
        node->saved[3] = cc;
        node->i[0] = reverse;
    }
    return y;
}

/* saved[0] = gates (T, N, 4H: r, z, n, h W_hn^T + b_hn), saved[1] = the
 * contiguous h0; i[0] = reverse. xw's gradient is dx, b_hh's the column sums
 * of dgh (xw's but for r times it in n), a step tensor. */
static FG_MUST_USE fg_status gru_bw(fg__node *n, const fg_tensor *g) {
    fg_tensor *xw = n->in[0], *whh = n->in[1], *h0 = n->in[2];
    fg_tensor *bhh = n->nin > 3 ? n->in[3] : NULL, *gates = n->saved[0];
    const fg_op_table *ops = fg__ops(g);
    double beta = 0;
    fg_tensor *gx = fg__needs_grad(xw) ? fg__grad_for_write(xw, &beta) : NULL;
    if (fg__needs_grad(xw) && !gx) return FG_ENOMEM;
    int64_t sh[3] = {gates->shape[0], gates->shape[1], 3 * whh->shape[1]};
    fg_tensor *dx = gx && beta == 0 ? gx : fg_empty(gates->dtype, 3, sh);
    fg_tensor *dgh = fg_empty(gates->dtype, 3, sh);
    fg_tensor *gw = fg__needs_grad(whh) ? fg__grad_of(whh) : NULL;
    fg_tensor *gh = fg__needs_grad(h0) ? fg__grad_of(h0) : NULL;
    if (!dx || !dgh || (fg__needs_grad(whh) && !gw) || (fg__needs_grad(h0) && !gh))
        return FG_ENOMEM;
    fg_tensor *gout = fg_tensor_contiguous((fg_tensor *)g);
    if (!gout) return FG_ENOMEM;
    FG_TRY(fg__ops_gru_bwd(whh, n->saved[1], n->out, gates, gout, n->i[0] != 0, dx, dgh, gw, gh));
    if (fg__needs_grad(bhh)) {
        fg_tensor *gb = fg__grad_of(bhh);
        fg_tensor *d2 = fg_tensor_reshape_view(dgh, 2, (int64_t[]){sh[0] * sh[1], sh[2]});
        if (!gb || !d2) return FG_ENOMEM;
        FG_TRY(ops->bias_grad(d2, gb));
    }
    if (gx && dx != gx) FG_TRY(ops->axpby(1.0, dx, 1.0, gx));
    return FG_OK;
}

fg_tensor *fg__gru_seq(fg_tensor *xw, fg_tensor *whh, fg_tensor *bhh, fg_tensor *h0, bool reverse) {
    if (!xw || !whh || !h0) {
        fg_error_wrap(FG_EINVAL, "gru: NULL input (an earlier call failed)");
        return NULL;
    }
    int64_t T = xw->shape[0], N = xw->shape[1], H = whh->ndim == 2 ? whh->shape[1] : 0;
    if (xw->ndim != 3 || whh->ndim != 2 || xw->shape[2] != 3 * H || whh->shape[0] != 3 * H ||
        h0->ndim != 2 || h0->shape[0] != N || h0->shape[1] != H ||
        (bhh && (bhh->ndim != 1 || bhh->shape[0] != 3 * H))) {
        fg_error(FG_EINVAL, "gru: xw %dd, W_hh %dd, h0 %dd: expected (T, N, 3H), (3H, H), (N, H)",
                 xw->ndim, whh->ndim, h0->ndim);
        return NULL;
    }
    fg_tensor *xc = fg_tensor_contiguous(xw), *wc = fg_tensor_contiguous(whh);
    fg_tensor *bc = bhh ? fg_tensor_contiguous(bhh) : NULL, *hc = fg_tensor_contiguous(h0);
    fg_tensor *y = fg_empty(xw->dtype, 3, (int64_t[]){T, N, H});
    fg_tensor *gates = fg_empty(xw->dtype, 3, (int64_t[]){T, N, 4 * H});
    if (!xc || !wc || (bhh && !bc) || !hc || !y || !gates) return NULL;
    if (fg__ops_gru_fwd(xc, wc, bc, hc, reverse, y, gates)) return NULL;
    fg__node *node;
    fg_tensor *in[4] = {xw, whh, h0, bhh};
    if (fg__record(&node, "gru", gru_bw, y, bhh ? 4 : 3, in)) return NULL;
    if (node) {
        node->saved[0] = gates;
        node->saved[1] = hc;
        node->i[0] = reverse;
    }
    return y;
}
