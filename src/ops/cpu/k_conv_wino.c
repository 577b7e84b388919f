/* f32 3x3 convolutions (stride 1, no dilation, one group, padding <= 2)
 * by Winograd's minimal filtering F(4x4, 3x3), for the CPUs where oneDNN
 * has no Winograd kernels (oneDNN 2.x: AVX-512 only). The transforms are
 * ours (vk_wino_t.h, per vector ISA); the work is 36 matrix products of
 * the table (OpenBLAS or oneDNN, gemm_pick.c), one per position of the
 * 6 x 6 transformed tile, each a quarter of the direct convolution's
 * multiply-adds for its 4 x 4 outputs:
 *   forward        M_k (O, T) = U_k (O, C) V_k (C, T)   U = G w G^T,
 *                                                       V = B^T x B per tile
 *   input grad     the forward of dy with w flipped and transposed,
 *                  padding 2 - p (a stride-1 convolution's transpose)
 *   weight grad    dU_k (O, C) = Z_k (O, T) V_k (C, T)^T  Z = A dy A^T,
 *                  dw += G^T dU G
 * T is the tiles of the whole batch (N ceil(OH / 4) ceil(OW / 4)), laid
 * out tile by tile (vk_wino_t.h): each product reads its position as a
 * matrix of row stride 36 C, and a transform writes one stream. The
 * sums differ from the direct ones in the last bits (the transforms
 * scale by up to 8 and 1/24): within about 1e-5 of the values on the
 * shapes the tests take, as oneDNN's own Winograd. conv_pick.c measures
 * it against oneDNN's direct kernels per shape (k_conv_dnnl.c), and
 * FULGUR_CONV=winograd takes it wherever it applies. Each thread keeps
 * its three scratch buffers (U, V, M), grown to the largest shape: a
 * training step allocates nothing here after the first. The scalar ISA
 * has no transforms: FG_EUNSUPPORTED, and the caller runs another path. */
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

static int64_t pieces(int64_t n) { return (n + PIECE - 1) / PIECE; }
static int64_t piece_end(int64_t i, int64_t n) { return (i + 1) * PIECE < n ? (i + 1) * PIECE : n; }

/* U (36 planes of R x S) from w: the forward's filter, or (flip) the input
 * gradient's */
static void filters_in(const fg__vk *vk, const float *w, int64_t R, int64_t S, bool flip,
                       float *U) {
    int64_t np = pieces(R);
    FG_PRAGMA(omp parallel for schedule(static) if (R * S * 36 > FG_PAR_MIN))
    for (int64_t i = 0; i < np; i++)
        vk->wino_wt(w, R, S, flip, i * PIECE, piece_end(i, R), U, plane(R * S));
}

/* a 2-d header over float memory, rows ld apart */
static void view2(fg_tensor *v, float *data, int64_t r, int64_t c, int64_t ld) {
    memset(v, 0, sizeof *v);
    fg__status_drop(fg__tensor_init_shape(v, FG_F32, 2, (int64_t[]){r, c}));
    v->strides[0] = ld;
    v->data = data;
    v->device = FG_CPU;
}

/* The input transform of x (N, C, H, W), padding ph, pw, into V (T, 36, C)
 * for the tiles of an OH x OW output */
static void input_tiles(const fg__vk *vk, const float *x, int64_t N, int64_t C, int64_t H,
                        int64_t W, int64_t ph, int64_t pw, int64_t TH, int64_t TW, float *V) {
    int64_t T = N * TH * TW, np = pieces(T);
    FG_PRAGMA(omp parallel for schedule(static) if (N * C * H * W > FG_PAR_MIN))
    for (int64_t i = 0; i < np; i++)
        vk->wino_in(x, C, H, W, ph, pw, TH, TW, i * PIECE, piece_end(i, T), V);
}

/* y (N, O, OH, OW) = (+=, add) the convolution of x (N, C, H, W) by the
 * transformed filter U (36 planes of O x C), padding ph, pw, + bias (O or
 * NULL): M_k (T, O) = V_k (T, C) U_k^T, V_k and M_k rows 36 C and 36 O
 * apart */
static FG_MUST_USE fg_status forward(const fg__vk *vk, const float *x, int64_t N, int64_t C,
                                     int64_t H, int64_t W, int64_t ph, int64_t pw, float *U,
                                     int64_t O, float *y, int64_t OH, int64_t OW, const float *bias,
                                     bool add) {
    int64_t TH = (OH + 3) / 4, TW = (OW + 3) / 4, T = N * TH * TW;
    float *V, *M;
    FG_TRY(scratch(B_V, 36 * C * T, &V));
    FG_TRY(scratch(B_M, 36 * O * T, &M));
    input_tiles(vk, x, N, C, H, W, ph, pw, TH, TW, V);
    for (int k = 0; k < 36; k++) {
        fg_tensor a, b, c;
        view2(&a, V + k * C, T, C, 36 * C);
        view2(&b, U + k * plane(O * C), O, C, C);
        view2(&c, M + k * O, T, O, 36 * O);
        FG_TRY(fg__cpu_matmul(&a, false, &b, true, &c, 1.0, 0.0));
    }
    int64_t np = pieces(T);
    FG_PRAGMA(omp parallel for schedule(static) if (N * O * OH * OW > FG_PAR_MIN))
    for (int64_t i = 0; i < np; i++)
        vk->wino_out(M, O, TH, TW, i * PIECE, piece_end(i, T), y, OH, OW, bias, add);
    return FG_OK;
}

static FG_MUST_USE fg_status begin(const fg_tensor *x, const fg_tensor *w, const fg_conv_params *p,
                                   const fg__vk **vk) {
    if (!fg__wino_conv_fits(x, w, p)) return FG_EUNSUPPORTED;
    return fg__vk_get(vk);
}

fg_status fg__wino_conv2d_fwd(const fg_tensor *x, const fg_tensor *w, const fg_tensor *b,
                              const fg_conv_params *p, fg_tensor *y) {
    const fg__vk *vk;
    FG_TRY(begin(x, w, p, &vk));
    int64_t O = w->shape[0], C = x->shape[1];
    float *U;
    FG_TRY(scratch(B_U, 36 * plane(O * C), &U));
    filters_in(vk, w->data, O, C, false, U);
    return forward(vk, x->data, x->shape[0], C, x->shape[2], x->shape[3], p->pad[0], p->pad[1], U,
                   O, y->data, y->shape[2], y->shape[3], b ? (const float *)b->data : NULL, false);
}

fg_status fg__wino_conv2d_bwd_data(const fg_tensor *dy, const fg_tensor *w, const fg_conv_params *p,
                                   fg_tensor *dx) {
    const fg__vk *vk;
    FG_TRY(begin(dx, w, p, &vk));
    int64_t O = w->shape[0], C = dx->shape[1];
    float *U;
    FG_TRY(scratch(B_U, 36 * plane(O * C), &U));
    filters_in(vk, w->data, C, O, true, U);
    return forward(vk, dy->data, dy->shape[0], O, dy->shape[2], dy->shape[3], 2 - p->pad[0],
                   2 - p->pad[1], U, C, dx->data, dx->shape[2], dx->shape[3], NULL, !p->overwrite);
}

fg_status fg__wino_conv2d_bwd_weight(const fg_tensor *x, const fg_tensor *dy,
                                     const fg_conv_params *p, fg_tensor *dw, fg_tensor *db) {
    const fg__vk *vk;
    FG_TRY(begin(x, dw, p, &vk));
    int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t O = dw->shape[0], OH = dy->shape[2], OW = dy->shape[3];
    int64_t TH = (OH + 3) / 4, TW = (OW + 3) / 4, T = N * TH * TW;
    float *V, *Z, *dU;
    FG_TRY(scratch(B_V, 36 * C * T, &V));
    FG_TRY(scratch(B_M, 36 * O * T, &Z));
    FG_TRY(scratch(B_U, 36 * plane(O * C), &dU));
    input_tiles(vk, x->data, N, C, H, W, p->pad[0], p->pad[1], TH, TW, V);
    const float *g = dy->data;
    int64_t np = pieces(T);
    FG_PRAGMA(omp parallel for schedule(static) if (dy->numel > FG_PAR_MIN))
    for (int64_t i = 0; i < np; i++)
        vk->wino_dout(g, O, OH, OW, TH, TW, i * PIECE, piece_end(i, T), Z);
    /* dU_k (O, C) = Z_k (T, O)^T V_k (T, C) */
    for (int k = 0; k < 36; k++) {
        fg_tensor a, b, c;
        view2(&a, Z + k * O, T, O, 36 * O);
        view2(&b, V + k * C, T, C, 36 * C);
        view2(&c, dU + k * plane(O * C), O, C, C);
        FG_TRY(fg__cpu_matmul(&a, true, &b, false, &c, 1.0, 0.0));
    }
    int64_t no = pieces(O);
    FG_PRAGMA(omp parallel for schedule(static) if (O * C * 36 > FG_PAR_MIN))
    for (int64_t i = 0; i < no; i++)
        vk->wino_dwt(dU, plane(O * C), C, i * PIECE, piece_end(i, O), dw->data);
    if (db) {
        float *pdb = db->data;
        FG_PRAGMA(omp parallel for schedule(static) if (dy->numel > FG_PAR_MIN))
        for (int64_t o = 0; o < O; o++) {
            double s = 0;
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < OH * OW; k++) s += (double)g[(n * O + o) * OH * OW + k];
            pdb[o] += (float)s;
        }
    }
    return FG_OK;
}
