/* f32 3x3 convolutions (stride 1, no dilation, one group, padding <= 2)
 * by Winograd's minimal filtering F(4x4, 3x3), for the CPUs where oneDNN
 * has no Winograd kernels (oneDNN 2.x: AVX-512 only). The transforms are
 * ours (vk_wino_t.h, per vector ISA); the work is 36 matrix products of
 * the table (OpenBLAS or oneDNN, gemm_pick.c), one per position k of the
 * 6 x 6 transformed tile, each a quarter of the direct convolution's
 * multiply-adds for its 4 x 4 outputs:
 *   forward        M_k (T, O) = V_k (T, C) U_k^T   U = G w G^T (O, C),
 *                                                  V = B^T x B per tile
 *   input grad     the forward of dy with w flipped and transposed,
 *                  padding 2 - p (a stride-1 convolution's transpose)
 *   weight grad    dU_k (O, C) = Z_k^T V_k         Z = A dy A^T per tile,
 *                  dw += G^T dU G
 * T is the tiles of the batch (N ceil(OH / 4) ceil(OW / 4)), laid out tile
 * by tile (vk_wino_t.h): each product reads its position as a matrix of
 * row stride 36 C, and a transform writes one stream. The work goes in
 * chunks of tiles and of filter rows whose buffers hold at most
 * CHUNK_BYTES, the weight gradient summed over the chunks of tiles. The
 * sums differ from the direct ones in the last bits (the transforms scale
 * by up to 8 and 1/24, the filters' in f32): within 6.6e-5 (1 + |v|) of
 * im2col's on the tests' shapes, oneDNN's own Winograd within 2.4e-5.
 * conv_pick.c measures it against oneDNN's direct kernels per shape
 * (k_conv_dnnl.c), and FULGUR_CONV=winograd takes it wherever it applies.
 * Each thread keeps its three scratch buffers (U, V, M), grown to the
 * largest chunk: a training step allocates nothing here after the first.
 * The scalar ISA has no transforms: FG_EUNSUPPORTED, and the caller runs
 * another path. */
#include <pthread.h>
#include <string.h>

#include "k_ops.h"

enum { B_U, B_V, B_M, B_N };

typedef struct wstate {
    float *buf[B_N];
    size_t cap[B_N];
} wstate;

static pthread_key_t g_key;
static int g_key_err = 1;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void state_free(void *v) {
    wstate *s = v;
    for (int i = 0; i < B_N; i++) fg_free(s->buf[i]);
    fg_free(s);
}

static void make_key(void) { g_key_err = pthread_key_create(&g_key, state_free); }

/* the calling thread's buffer i of at least n floats */
static FG_MUST_USE fg_status scratch(int i, int64_t n, float **out) {
    pthread_once(&g_once, make_key);
    if (g_key_err) return fg_error(FG_ENOMEM, "conv2d winograd: no thread key");
    wstate *s = pthread_getspecific(g_key);
    if (!s) {
        if (!(s = fg_calloc(1, sizeof *s))) return FG_ENOMEM;
        if (pthread_setspecific(g_key, s)) {
            fg_free(s);
            return fg_error(FG_ENOMEM, "conv2d winograd: cannot keep the scratch buffers");
        }
    }
    size_t bytes = sizeof(float) * (size_t)(n > 0 ? n : 1);
    if (s->cap[i] < bytes) {
        fg_free(s->buf[i]);
        s->cap[i] = 0;
        if (!(s->buf[i] = fg_alloc(bytes)))
            return fg_error(FG_ENOMEM, "conv2d winograd: %zu bytes of transformed tiles", bytes);
        s->cap[i] = bytes;
    }
    *out = s->buf[i];
    return FG_OK;
}

/* The stride of the 36 filter planes of n floats each: n rounded up to a
 * cache line and one more, so that the 36 streams the filter transforms
 * write or read at once do not fall in the same cache sets. */
static int64_t plane(int64_t n) { return (n + 15) / 16 * 16 + 16; }

bool fg__wino_conv_fits(const fg_tensor *x, const fg_tensor *w, const fg_conv_params *p) {
    const fg__vk *vk;
    if (fg__vk_get(&vk) != FG_OK) {
        fg_clear_error();
        return false;
    }
    return vk->wino_in && x->dtype == FG_F32 && w->ndim == 4 && w->shape[2] == 3 &&
           w->shape[3] == 3 && p->groups == 1 && p->stride[0] == 1 && p->stride[1] == 1 &&
           p->dilation[0] == 1 && p->dilation[1] == 1 && p->pad[0] <= 2 && p->pad[1] <= 2;
}

/* Tiles a piece of the transforms' work (the threads split the pieces) */
#define PIECE 16
/* The most bytes of one scratch buffer before the work goes in chunks of
 * tiles (and of filter rows): the products keep their speed from a few
 * hundred tiles, and the buffers were 38 MB each on the CIFAR ResNet's
 * first layers (64 channels of 32 x 32, batch 64) and 512 x 512 filters */
#define CHUNK_BYTES (8 << 20)

static _Atomic int64_t g_chunk = CHUNK_BYTES; /* test hook: fg__wino_set_chunk */

void fg__wino_set_chunk(int64_t bytes) { g_chunk = bytes > 0 ? bytes : CHUNK_BYTES; }

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t pieces(int64_t n) { return (n + PIECE - 1) / PIECE; }

/* the tiles of a chunk with `ch` channels a tile (a multiple of PIECE) */
static int64_t chunk_tiles(int64_t ch) {
    int64_t n = g_chunk / (36 * 4 * ch) / PIECE * PIECE;
    return n > PIECE ? n : PIECE;
}

/* the filter rows of a chunk with `ch` channels a row (a multiple of PIECE) */
static int64_t chunk_rows(int64_t ch) { return g_chunk / (36 * 4 * ch) / PIECE * PIECE + PIECE; }

/* U (36 planes of o1 - o0 rows x S, ldu apart) from rows [o0, o1) of w:
 * the forward's filter, or (flip) the input gradient's */
static void filters_in(const fg__vk *vk, const float *w, int64_t R, int64_t S, bool flip,
                       int64_t o0, int64_t o1, float *U, int64_t ldu) {
    int64_t np = pieces(o1 - o0);
    FG_PRAGMA(omp parallel for schedule(static) if ((o1 - o0) * S * 36 > FG_PAR_MIN))
    for (int64_t i = 0; i < np; i++) {
        int64_t r0 = o0 + i * PIECE;
        vk->wino_wt(w, R, S, flip, r0, min64(r0 + PIECE, o1), U + i * PIECE * S, ldu);
    }
}

/* a 2-d header over float memory, rows ld apart */
static void view2(fg_tensor *v, float *data, int64_t r, int64_t c, int64_t ld) {
    memset(v, 0, sizeof *v);
    fg__status_drop(fg__tensor_init_shape(v, FG_F32, 2, (int64_t[]){r, c}));
    v->strides[0] = ld;
    v->data = data;
    v->device = FG_CPU;
}

/* the geometry of a transform: the input (N, C, H, W), its padding, the
 * tiles of the output (TH x TW a plane) */
typedef struct tiles {
    int64_t N, C, H, W, ph, pw, TH, TW, T;
} tiles;

/* The input transform of x over tiles [t0, t1) into V (from t0) */
static void input_tiles(const fg__vk *vk, const tiles *g, const float *x, int64_t t0, int64_t t1,
                        float *V) {
    int64_t np = pieces(t1 - t0);
    FG_PRAGMA(omp parallel for schedule(static) if ((t1 - t0) * g->C * 16 > FG_PAR_MIN))
    for (int64_t i = 0; i < np; i++) {
        int64_t a = t0 + i * PIECE;
        vk->wino_in(x, g->C, g->H, g->W, g->ph, g->pw, g->TH, g->TW, a, min64(a + PIECE, t1),
                    V + i * PIECE * 36 * g->C);
    }
}

/* y (N, O, OH, OW) = (+=, add) the convolution of x by the filter w
 * (O, C, 3, 3), or (flip) by the input gradient's filter of w (C, O, 3, 3)
 * + bias (O or NULL), in chunks of tiles and of filter rows: M_k (tiles,
 * O) = V_k (tiles, C) U_k^T, V_k and M_k rows 36 C and 36 O apart */
static FG_MUST_USE fg_status forward(const fg__vk *vk, const tiles *g, const float *x,
                                     const float *w, bool flip, int64_t O, float *y, int64_t OH,
                                     int64_t OW, const float *bias, bool add) {
    int64_t C = g->C, TC = min64(chunk_tiles(C > O ? C : O), g->T);
    int64_t OC = min64(O, chunk_rows(C));
    int64_t ldu = plane(OC * C);
    float *V, *M, *U;
    FG_TRY(scratch(B_V, 36 * C * TC, &V));
    FG_TRY(scratch(B_M, 36 * O * TC, &M));
    FG_TRY(scratch(B_U, 36 * ldu, &U));
    if (OC == O) filters_in(vk, w, O, C, flip, 0, O, U, ldu);
    for (int64_t t0 = 0; t0 < g->T; t0 += TC) {
        int64_t tn = min64(TC, g->T - t0);
        input_tiles(vk, g, x, t0, t0 + tn, V);
        for (int64_t o0 = 0; o0 < O; o0 += OC) {
            int64_t on = min64(OC, O - o0);
            if (OC < O) filters_in(vk, w, O, C, flip, o0, o0 + on, U, ldu);
            for (int k = 0; k < 36; k++) {
                fg_tensor a, b, c;
                view2(&a, V + k * C, tn, C, 36 * C);
                view2(&b, U + k * ldu, on, C, C);
                view2(&c, M + k * O + o0, tn, on, 36 * O);
                FG_TRY(fg__cpu_matmul(&a, false, &b, true, &c, 1.0, 0.0));
            }
        }
        int64_t np = pieces(tn);
        FG_PRAGMA(omp parallel for schedule(static) if (tn * O * 16 > FG_PAR_MIN))
        for (int64_t i = 0; i < np; i++) {
            int64_t a = t0 + i * PIECE;
            vk->wino_out(M + i * PIECE * 36 * O, O, g->TH, g->TW, a, min64(a + PIECE, t0 + tn), y,
                         OH, OW, bias, add);
        }
    }
    return FG_OK;
}

static FG_MUST_USE fg_status begin(const fg_tensor *x, const fg_tensor *w, const fg_conv_params *p,
                                   const fg__vk **vk) {
    if (!fg__wino_conv_fits(x, w, p)) return FG_EUNSUPPORTED;
    return fg__vk_get(vk);
}

/* the tiles of a convolution of x (N, C, H, W) with padding ph, pw and an
 * OH x OW output */
static tiles tiles_of(const fg_tensor *x, int64_t ph, int64_t pw, int64_t OH, int64_t OW) {
    tiles g = {
        x->shape[0], x->shape[1], x->shape[2], x->shape[3], ph, pw, (OH + 3) / 4, (OW + 3) / 4, 0};
    g.T = g.N * g.TH * g.TW;
    return g;
}

fg_status fg__wino_conv2d_fwd(const fg_tensor *x, const fg_tensor *w, const fg_tensor *b,
                              const fg_conv_params *p, fg_tensor *y) {
    const fg__vk *vk;
    FG_TRY(begin(x, w, p, &vk));
    tiles g = tiles_of(x, p->pad[0], p->pad[1], y->shape[2], y->shape[3]);
    return forward(vk, &g, x->data, w->data, false, w->shape[0], y->data, y->shape[2], y->shape[3],
                   b ? (const float *)b->data : NULL, false);
}

fg_status fg__wino_conv2d_bwd_data(const fg_tensor *dy, const fg_tensor *w, const fg_conv_params *p,
                                   fg_tensor *dx) {
    const fg__vk *vk;
    FG_TRY(begin(dx, w, p, &vk));
    tiles g = tiles_of(dy, 2 - p->pad[0], 2 - p->pad[1], dx->shape[2], dx->shape[3]);
    return forward(vk, &g, dy->data, w->data, true, dx->shape[1], dx->data, dx->shape[2],
                   dx->shape[3], NULL, !p->overwrite);
}

/* dw += G^T dU G over rows [o0, o1) of the filter */
static void filters_out(const fg__vk *vk, const float *dU, int64_t ldu, int64_t C, int64_t o0,
                        int64_t o1, float *dw) {
    int64_t np = pieces(o1 - o0);
    FG_PRAGMA(omp parallel for schedule(static) if ((o1 - o0) * C * 36 > FG_PAR_MIN))
    for (int64_t i = 0; i < np; i++) {
        int64_t r0 = o0 + i * PIECE;
        vk->wino_dwt(dU + i * PIECE * C, ldu, C, r0, min64(r0 + PIECE, o1), dw);
    }
}

fg_status fg__wino_conv2d_bwd_weight(const fg_tensor *x, const fg_tensor *dy,
                                     const fg_conv_params *p, fg_tensor *dw, fg_tensor *db) {
    const fg__vk *vk;
    FG_TRY(begin(x, dw, p, &vk));
    int64_t O = dw->shape[0], OH = dy->shape[2], OW = dy->shape[3];
    tiles g = tiles_of(x, p->pad[0], p->pad[1], OH, OW);
    int64_t C = g.C, TC = min64(chunk_tiles(C > O ? C : O), g.T);
    /* rows of dU in chunks when the tiles are one chunk (each chunk of
     * rows is then finished at once), else all rows, summed over the
     * chunks of tiles */
    int64_t OC = TC < g.T ? O : min64(O, chunk_rows(C));
    int64_t ldu = plane(OC * C);
    float *V, *Z, *dU;
    FG_TRY(scratch(B_V, 36 * C * TC, &V));
    FG_TRY(scratch(B_M, 36 * O * TC, &Z));
    FG_TRY(scratch(B_U, 36 * ldu, &dU));
    const float *gy = dy->data;
    for (int64_t t0 = 0; t0 < g.T; t0 += TC) {
        int64_t tn = min64(TC, g.T - t0), np = pieces(tn);
        input_tiles(vk, &g, x->data, t0, t0 + tn, V);
        FG_PRAGMA(omp parallel for schedule(static) if (tn * O * 16 > FG_PAR_MIN))
        for (int64_t i = 0; i < np; i++) {
            int64_t a = t0 + i * PIECE;
            vk->wino_dout(gy, O, OH, OW, g.TH, g.TW, a, min64(a + PIECE, t0 + tn),
                          Z + i * PIECE * 36 * O);
        }
        bool last = t0 + tn == g.T;
        for (int64_t o0 = 0; o0 < O; o0 += OC) {
            int64_t on = min64(OC, O - o0);
            /* dU_k (on, C) (+)= Z_k (tiles, on)^T V_k (tiles, C) */
            for (int k = 0; k < 36; k++) {
                fg_tensor a, b, c;
                view2(&a, Z + k * O + o0, tn, on, 36 * O);
                view2(&b, V + k * C, tn, C, 36 * C);
                view2(&c, dU + k * ldu, on, C, C);
                FG_TRY(fg__cpu_matmul(&a, true, &b, false, &c, 1.0, t0 ? 1.0 : 0.0));
            }
            if (last) filters_out(vk, dU, ldu, C, o0, o0 + on, dw->data);
        }
    }
    if (db) {
        float *pdb = db->data;
        int64_t N = g.N;
        FG_PRAGMA(omp parallel for schedule(static) if (dy->numel > FG_PAR_MIN))
        for (int64_t o = 0; o < O; o++) {
            double s = 0;
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < OH * OW; k++) s += (double)gy[(n * O + o) * OH * OW + k];
            pdb[o] += (float)s;
        }
    }
    return FG_OK;
}
