/* k_conv_wino.c's Winograd F(4x4, 3x3) transforms, compiled once per ISA
 * beside vk_t.h (vk_avx2.c, vk_avx512.c), VK_W channels a vector: the
 * tiles' transformed values are laid out tile by tile, v[(t 36 + k) C + c]
 * (tile t, position k = 6 a + b of the 6 x 6 transformed tile, channel c),
 * so that a tile is one stream written or read, a channel block one
 * vector there, and the products read each position k as a matrix of
 * row stride 36 C. The NCHW planes are read across channels with a
 * strided gather (every lane at the same place of its plane, so a patch
 * position is inside the plane for all lanes or none) and written back
 * through a small buffer. The transforms are the usual sparse forms of
 * Lavin and Gray's matrices:
 *   input    V = B^T d B   (the 6 x 6 patch from row 4 i - ph, column 4 j - pw)
 *   output   Y = A^T m A   (4 x 4 at row 4 i, column 4 j, clipped)
 *   dout     Z = A g A^T   (the 4 x 4 tile g of dy, zero outside; the
 *                          output transform's backward)
 *   weights  U = G g G^T   and the gradient dg = G^T dU G
 * Tile t is image t / (th tw), tile row t % (th tw) / tw, column t % tw.
 * The buffers of tiles start at the first tile a call is given (t0), and
 * those of filter rows at its first row (r0, o0). Loops run on one
 * thread: k_conv_wino.c splits the tiles. */
#ifndef FULGUR_CPU_VK_WINO_T_H
#define FULGUR_CPU_VK_WINO_T_H

/* o[k os], k < 6 = B^T (d[k s], k < 6) */
static inline void wino_bt(const vf *d, int s, vf *o, int os) {
    vf d0 = d[0], d1 = d[s], d2 = d[2 * s], d3 = d[3 * s], d4 = d[4 * s], d5 = d[5 * s];
    vf four = v_set1(4.0f), five = v_set1(5.0f), two = v_set1(2.0f);
    vf a = v_fnma(four, d2, d4), b = v_fnma(four, d1, d3);
    vf c = v_sub(d4, d2), e = v_mul(two, v_sub(d3, d1));
    o[0] = v_fma(four, d0, v_fnma(five, d2, d4));
    o[os] = v_add(a, b);
    o[2 * os] = v_sub(a, b);
    o[3 * os] = v_add(c, e);
    o[4 * os] = v_sub(c, e);
    o[5 * os] = v_fma(four, d1, v_fnma(five, d3, d5));
}

/* o[k os], k < 4 = A^T (m[k s], k < 6) */
static inline void wino_at(const vf *m, int s, vf *o, int os) {
    vf s12 = v_add(m[s], m[2 * s]), d12 = v_sub(m[s], m[2 * s]);
    vf s34 = v_add(m[3 * s], m[4 * s]), d34 = v_sub(m[3 * s], m[4 * s]);
    o[0] = v_add(v_add(m[0], s12), s34);
    o[os] = v_fma(v_set1(2.0f), d34, d12);
    o[2 * os] = v_fma(v_set1(4.0f), s34, s12);
    o[3 * os] = v_add(v_fma(v_set1(8.0f), d34, d12), m[5 * s]);
}

/* o[k os], k < 6 = A (g[k s], k < 4) */
static inline void wino_a(const vf *g, int s, vf *o, int os) {
    vf y0 = g[0], y1 = g[s], y2 = g[2 * s], y3 = g[3 * s];
    vf e = v_add(y0, y2), od = v_add(y1, y3);
    vf e4 = v_fma(v_set1(4.0f), y2, y0), o8 = v_fma(v_set1(8.0f), y3, v_add(y1, y1));
    o[0] = y0;
    o[os] = v_add(e, od);
    o[2 * os] = v_sub(e, od);
    o[3 * os] = v_add(e4, o8);
    o[4 * os] = v_sub(e4, o8);
    o[5 * os] = y3;
}

/* o[k os], k < 6 = G (g[k s], k < 3) */
static inline void wino_g(const vf *g, int s, vf *o, int os) {
    vf g0 = g[0], g1 = g[s], g2 = g[2 * s];
    vf p = v_add(g0, g2), q = v_fma(v_set1(1.0f / 24), g0, v_mul(v_set1(1.0f / 6), g2));
    vf r = v_mul(v_set1(1.0f / 12), g1), sixth = v_set1(-1.0f / 6);
    o[0] = v_mul(v_set1(0.25f), g0);
    o[os] = v_mul(sixth, v_add(p, g1));
    o[2 * os] = v_mul(sixth, v_sub(p, g1));
    o[3 * os] = v_add(q, r);
    o[4 * os] = v_sub(q, r);
    o[5 * os] = g2;
}

/* o[k os], k < 3 = G^T (d[k s], k < 6) */
static inline void wino_gt(const vf *d, int s, vf *o, int os) {
    vf s12 = v_add(d[s], d[2 * s]), d12 = v_sub(d[s], d[2 * s]);
    vf s34 = v_add(d[3 * s], d[4 * s]), d34 = v_sub(d[3 * s], d[4 * s]);
    vf sixth = v_set1(1.0f / 6);
    o[0] = v_fma(v_set1(0.25f), d[0], v_fma(v_set1(1.0f / 24), s34, v_mul(v_set1(-1.0f / 6), s12)));
    o[os] = v_fma(v_set1(1.0f / 12), d34, v_mul(v_set1(-1.0f / 6), d12));
    o[2 * os] = v_add(v_mul(sixth, v_sub(s34, s12)), d[5 * s]);
}

/* where tile t starts: image, row and column of its first input */
static inline void wino_tile(int64_t t, int64_t th, int64_t tw, int64_t *n, int64_t *r,
                             int64_t *c) {
    *n = t / (th * tw);
    *r = t % (th * tw) / tw * 4;
    *c = t % tw * 4;
}

static void vk_wino_in(const float *x, int64_t C, int64_t h, int64_t w, int64_t ph, int64_t pw,
                       int64_t th, int64_t tw, int64_t t0, int64_t t1, float *v) {
    int64_t hw = h * w;
    for (int64_t t = t0; t < t1; t++) {
        int64_t n, r0, c0;
        wino_tile(t, th, tw, &n, &r0, &c0);
        r0 -= ph, c0 -= pw;
        bool in[36];
        for (int k = 0; k < 36; k++) {
            int64_t r = r0 + k / 6, c = c0 + k % 6;
            in[k] = r >= 0 && r < h && c >= 0 && c < w;
        }
        float *vt = v + (t - t0) * 36 * C;
        for (int64_t ch = 0; ch < C; ch += VK_W) {
            vmask m = v_first(C - ch);
            const float *xc = x + (n * C + ch) * hw;
            vf d[36], u[36];
            for (int k = 0; k < 36; k++)
                d[k] = in[k] ? v_gather_n(xc + (r0 + k / 6) * w + c0 + k % 6, hw, m) : v_zero();
            for (int b = 0; b < 6; b++) wino_bt(d + b, 6, u + b, 6);         /* the columns */
            for (int a = 0; a < 6; a++) wino_bt(u + 6 * a, 1, d + 6 * a, 1); /* the rows */
            if (C - ch >= VK_W)
                for (int k = 0; k < 36; k++) v_store(vt + k * C + ch, d[k]);
            else
                for (int k = 0; k < 36; k++) v_store_n(vt + k * C + ch, m, d[k]);
        }
    }
}

static void vk_wino_out(const float *mt, int64_t O, int64_t th, int64_t tw, int64_t t0, int64_t t1,
                        float *y, int64_t oh, int64_t ow, const float *bias, bool add) {
    float buf[16 * VK_W] __attribute__((aligned(64)));
    int64_t ohw = oh * ow;
    for (int64_t t = t0; t < t1; t++) {
        int64_t n, r0, c0;
        wino_tile(t, th, tw, &n, &r0, &c0);
        int rn = oh - r0 < 4 ? (int)(oh - r0) : 4, cn = ow - c0 < 4 ? (int)(ow - c0) : 4;
        const float *m = mt + (t - t0) * 36 * O;
        for (int64_t ch = 0; ch < O; ch += VK_W) {
            int64_t nl = O - ch < VK_W ? O - ch : VK_W;
            vmask msk = v_first(nl);
            vf d[36], u[24], o[16];
            for (int k = 0; k < 36; k++)
                d[k] = nl == VK_W ? v_load(m + k * O + ch) : v_load_n(m + k * O + ch, msk);
            for (int b = 0; b < 6; b++) wino_at(d + b, 6, u + b, 6);
            for (int a = 0; a < 4; a++) wino_at(u + 6 * a, 1, o + 4 * a, 1);
            vf bv = bias ? v_load_n(bias + ch, msk) : v_zero();
            for (int k = 0; k < 16; k++) v_store(buf + k * VK_W, v_add(o[k], bv));
            for (int64_t l = 0; l < nl; l++) {
                float *yp = y + (n * O + ch + l) * ohw + r0 * ow + c0;
                for (int a = 0; a < rn; a++)
                    for (int b = 0; b < cn; b++) {
                        float s = buf[(4 * a + b) * VK_W + l];
                        yp[a * ow + b] = add ? yp[a * ow + b] + s : s;
                    }
            }
        }
    }
}

static void vk_wino_dout(const float *dy, int64_t O, int64_t oh, int64_t ow, int64_t th, int64_t tw,
                         int64_t t0, int64_t t1, float *z) {
    int64_t ohw = oh * ow;
    for (int64_t t = t0; t < t1; t++) {
        int64_t n, r0, c0;
        wino_tile(t, th, tw, &n, &r0, &c0);
        float *zt = z + (t - t0) * 36 * O;
        for (int64_t ch = 0; ch < O; ch += VK_W) {
            vmask m = v_first(O - ch);
            const float *g = dy + (n * O + ch) * ohw;
            vf d[16], u[24], o[36];
            for (int k = 0; k < 16; k++) {
                int64_t r = r0 + k / 4, c = c0 + k % 4;
                d[k] = r < oh && c < ow ? v_gather_n(g + r * ow + c, ohw, m) : v_zero();
            }
            for (int b = 0; b < 4; b++) wino_a(d + b, 4, u + b, 4);
            for (int a = 0; a < 6; a++) wino_a(u + 4 * a, 1, o + 6 * a, 1);
            if (O - ch >= VK_W)
                for (int k = 0; k < 36; k++) v_store(zt + k * O + ch, o[k]);
            else
                for (int k = 0; k < 36; k++) v_store_n(zt + k * O + ch, m, o[k]);
        }
    }
}

static void vk_wino_wt(const float *w, int64_t R, int64_t S, bool flip, int64_t r0, int64_t r1,
                       float *U, int64_t ldu) {
    for (int64_t r = r0; r < r1; r++)
        for (int64_t s = 0; s < S; s += VK_W) {
            vmask m = v_first(S - s);
            vf g[9], u[18], o[36];
            for (int q = 0; q < 9; q++)
                g[q] = flip ? v_gather_n(w + (s * R + r) * 9 + 8 - q, 9 * R, m)
                            : v_gather_n(w + (r * S + s) * 9 + q, 9, m);
            for (int b = 0; b < 3; b++) wino_g(g + b, 3, u + b, 3);
            for (int a = 0; a < 6; a++) wino_g(u + 3 * a, 1, o + 6 * a, 1);
            for (int k = 0; k < 36; k++) v_store_n(U + k * ldu + (r - r0) * S + s, m, o[k]);
        }
}

static void vk_wino_dwt(const float *dU, int64_t ldu, int64_t C, int64_t o0, int64_t o1,
                        float *dw) {
    float buf[9 * VK_W] __attribute__((aligned(64)));
    for (int64_t o = o0; o < o1; o++)
        for (int64_t c = 0; c < C; c += VK_W) {
            int64_t nl = C - c < VK_W ? C - c : VK_W;
            vf d[36], u[18], g[9];
            for (int k = 0; k < 36; k++)
                d[k] = v_load_n(dU + k * ldu + (o - o0) * C + c, v_first(nl));
            for (int b = 0; b < 6; b++) wino_gt(d + b, 6, u + b, 6);
            for (int a = 0; a < 3; a++) wino_gt(u + 6 * a, 1, g + 3 * a, 1);
            for (int q = 0; q < 9; q++) v_store(buf + q * VK_W, g[q]);
            for (int64_t l = 0; l < nl; l++)
                for (int q = 0; q < 9; q++) dw[(o * C + c + l) * 9 + q] += buf[q * VK_W + l];
        }
}

#define VK_WINO_ENTRIES                                                                            \
    .wino_in = vk_wino_in, .wino_out = vk_wino_out, .wino_dout = vk_wino_dout,                     \
    .wino_wt = vk_wino_wt, .wino_dwt = vk_wino_dwt

#endif
