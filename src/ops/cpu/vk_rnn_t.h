/* The LSTM and GRU cells' elementwise f32 work of one time step (k_rnn.c's
 * vector path), compiled once per ISA beside vk_t.h (vk_avx2.c,
 * vk_avx512.c): plain loops under FG_SIMD, the sigmoid and tanh written
 * from fg__expf (vmath.h) so that they vectorise (their selects blended:
 * those files are built with -fno-trapping-math). tanh(x) is
 * sign(x) (1 - e) / (1 + e) with e = exp(-2|x|), and its odd series up to
 * x^9 below |x| = 0.25, where 1 - e would lose digits: within a few ulp of
 * tanhf. Gates are PyTorch's order: i, f, g, o, each H wide. Loops run on
 * one thread: k_rnn.c splits the rows. */
#ifndef FULGUR_CPU_VK_RNN_T_H
#define FULGUR_CPU_VK_RNN_T_H

static inline float vk_sigmoid(float x) { return 1.0f / (1.0f + fg__expf(-x)); }

static inline float vk_tanh(float x) {
    float a = fabsf(x), e = fg__expf(-2.0f * a), z = x * x;
    float big = (1.0f - e) / (1.0f + e);
    float p = -17.0f / 315.0f + z * (62.0f / 2835.0f);
    p = 2.0f / 15.0f + z * p;
    p = -1.0f / 3.0f + z * p;
    float small = a + a * z * p;
    return copysignf(a < 0.25f ? small : big, x);
}

/* One step over `rows` rows: g (rows, 4H) holds h_prev W_hh^T on entry;
 * xw (rows, 4H) and b (4H, or NULL) are added, the gates activated in
 * place (i, f, o sigmoid, g tanh), c = f cp + i g and h = o tanh(c), all
 * (rows, H). */
static void vk_lstm_fwd(float *g, const float *xw, const float *b, const float *cp, float *c,
                        float *h, int64_t rows, int64_t H) {
    for (int64_t r = 0; r < rows; r++) {
        float *gi = g + r * 4 * H, *gf = gi + H, *gg = gf + H, *go = gg + H;
        const float *xi = xw + r * 4 * H, *xf = xi + H, *xg = xf + H, *xo = xg + H;
        const float *pr = cp + r * H;
        float *cr = c + r * H, *hr = h + r * H;
        FG_SIMD for (int64_t j = 0; j < H; j++) {
            float ai = gi[j] + xi[j], af = gf[j] + xf[j], ag = gg[j] + xg[j], ao = go[j] + xo[j];
            if (b) {
                ai += b[j];
                af += b[H + j];
                ag += b[2 * H + j];
                ao += b[3 * H + j];
            }
            float si = vk_sigmoid(ai), sf = vk_sigmoid(af), tg = vk_tanh(ag), so = vk_sigmoid(ao);
            float cv = sf * pr[j] + si * tg;
            gi[j] = si;
            gf[j] = sf;
            gg[j] = tg;
            go[j] = so;
            cr[j] = cv;
            hr[j] = so * vk_tanh(cv);
        }
    }
}

/* Its backward over `rows` rows: g the activated gates, c the step's cell
 * state and cp the one before; dh = dy + dhr the hidden state's gradient
 * (the output's and the recurrence's), dc on entry the cell's gradient
 * from the step after, on return cp's; dg (rows, 4H) gets the gradient of
 * the gates before their activation. */
static void vk_lstm_bwd(const float *g, const float *c, const float *cp, const float *dy,
                        const float *dhr, float *dc, float *dg, int64_t rows, int64_t H) {
    for (int64_t r = 0; r < rows; r++) {
        const float *gi = g + r * 4 * H, *gf = gi + H, *gg = gf + H, *go = gg + H;
        const float *cr = c + r * H, *pr = cp + r * H, *yr = dy + r * H, *hr = dhr + r * H;
        float *dcr = dc + r * H, *di = dg + r * 4 * H, *df = di + H, *dgg = df + H, *dout = dgg + H;
        FG_SIMD for (int64_t j = 0; j < H; j++) {
            float i = gi[j], f = gf[j], gt = gg[j], o = go[j], tc = vk_tanh(cr[j]);
            float dh = yr[j] + hr[j];
            float dcv = dcr[j] + dh * o * (1.0f - tc * tc);
            di[j] = dcv * gt * i * (1.0f - i);
            df[j] = dcv * pr[j] * f * (1.0f - f);
            dgg[j] = dcv * i * (1.0f - gt * gt);
            dout[j] = dh * tc * o * (1.0f - o);
            dcr[j] = dcv * f;
        }
    }
}

/* The GRU's step (torch.nn.GRU's cell, gates r, z, n each H wide) over
 * `rows` rows: g (rows, 3H) holds h_prev W_hh^T, xw (rows, 3H) the input
 * projection, b (3H) b_hh or NULL; r = sigmoid(x_r + g_r + b_r), z likewise,
 * n = tanh(x_n + r (g_n + b_n)), h = n + z (hp - n) (PyTorch's (1 - z) n +
 * z hp in the order its CPU cell computes it); gates (rows, 4H) gets r, z,
 * n and g_n + b_n for the backward. */
static void vk_gru_fwd(const float *g, const float *xw, const float *b, const float *hp,
                       float *gates, float *h, int64_t rows, int64_t H) {
    for (int64_t r = 0; r < rows; r++) {
        const float *gr = g + r * 3 * H, *gz = gr + H, *gn = gz + H;
        const float *xr = xw + r * 3 * H, *xz = xr + H, *xn = xz + H, *pr = hp + r * H;
        float *orr = gates + r * 4 * H, *oz = orr + H, *on = oz + H, *ohn = on + H, *hr = h + r * H;
        FG_SIMD for (int64_t j = 0; j < H; j++) {
            float ar = gr[j] + xr[j], az = gz[j] + xz[j], hn = gn[j];
            if (b) {
                ar += b[j];
                az += b[H + j];
                hn += b[2 * H + j];
            }
            float rv = vk_sigmoid(ar), zv = vk_sigmoid(az), nv = vk_tanh(xn[j] + rv * hn);
            orr[j] = rv;
            oz[j] = zv;
            on[j] = nv;
            ohn[j] = hn;
            hr[j] = nv + zv * (pr[j] - nv);
        }
    }
}

/* Its backward over `rows` rows: gates as the forward wrote them, hp the
 * step's h_prev; dh = dy + dhr + dhd (the output's gradient, h's through
 * the next step's product and its direct part); dx (rows, 3H) gets the
 * gradient of the input projection's gates, dgh (rows, 3H) that of
 * h_prev W_hh^T + b_hh (r times dx's in n), dhd on return h_prev's direct
 * part dh z. */
static void vk_gru_bwd(const float *gates, const float *hp, const float *dy, const float *dhr,
                       float *dhd, float *dx, float *dgh, int64_t rows, int64_t H) {
    for (int64_t r = 0; r < rows; r++) {
        const float *gr = gates + r * 4 * H, *gz = gr + H, *gn = gz + H, *ghn = gn + H;
        const float *pr = hp + r * H, *yr = dy + r * H, *rr = dhr + r * H;
        float *dd = dhd + r * H, *xr = dx + r * 3 * H, *xz = xr + H, *xn = xz + H;
        float *hr = dgh + r * 3 * H, *hz = hr + H, *hnn = hz + H;
        FG_SIMD for (int64_t j = 0; j < H; j++) {
            float rv = gr[j], zv = gz[j], nv = gn[j];
            float dh = yr[j] + rr[j] + dd[j];
            float dan = dh * (1.0f - zv) * (1.0f - nv * nv);
            float dar = dan * ghn[j] * rv * (1.0f - rv), daz = dh * (pr[j] - nv) * zv * (1.0f - zv);
            xr[j] = dar;
            hr[j] = dar;
            xz[j] = daz;
            hz[j] = daz;
            xn[j] = dan;
            hnn[j] = dan * rv;
            dd[j] = dh * zv;
        }
    }
}

#define VK_RNN_ENTRIES                                                                             \
    .lstm_fwd = vk_lstm_fwd, .lstm_bwd = vk_lstm_bwd, .gru_fwd = vk_gru_fwd, .gru_bwd = vk_gru_bwd

#endif
