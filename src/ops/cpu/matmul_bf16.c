/* The bf16 matrix product, c (f32 or bf16) = alpha op(a) op(b) + beta c
 * with bf16 a and b, and the choice, made at run time, of how to compute it:
 *
 *   onednn-bf16   oneDNN's bf16 matmul (matmul_dnnl.c). oneDNN 2.6 has it
 *                 from avx512_core up (native with AVX512-BF16 or AMX);
 *                 on an AVX2-only CPU creating the primitive fails with
 *                 dnnl_unimplemented.
 *   f32-fallback  a and b widened to f32 (exact: a bf16 is the top half of
 *                 an f32), the f32 product of matmul.c (on the engine
 *                 gemm_pick.c measured fastest for its class), c rounded
 *                 back once when it is bf16. Works on every CPU and build.
 *
 * Both accumulate in f32 and round the output once, so they differ only in
 * the order of the f32 sums, far inside bf16 rounding.
 *
 * The choice is made once per process and remembered: the first product
 * (or fg_matmul_bf16_path) asks oneDNN for a small bf16 primitive, and
 * where it has none every product takes the fallback without asking again.
 * Where it has one, each variant of the product (output dtype, alpha != 1,
 * beta != 0, transposes, shared b, batch) goes to oneDNN, and a variant it
 * refuses is remembered and takes the fallback from then on: in oneDNN 2.6
 * the answer depends on the ISA and these attributes, not on the sizes. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_impl.h"
#include "lowp.h"

/* FULGUR_MATMUL_BF16 = auto | onednn | fallback. auto (the default, also
 * when unset or empty): oneDNN where it implements the product, the
 * fallback elsewhere. onednn: oneDNN or an error (FG_EUNSUPPORTED naming
 * the ISA). fallback: always the f32 fallback, so that it can be tested on
 * a CPU where oneDNN would run. Read once, at the first bf16 product. */
#define MODE_ENV "FULGUR_MATMUL_BF16"

enum { MODE_AUTO, MODE_ONEDNN, MODE_FALLBACK, MODE_BAD };

static pthread_once_t g_env_once = PTHREAD_ONCE_INIT;
static int g_env_mode;
static char g_env_value[64];      /* the value, when it does not parse */
static _Atomic int g_forced = -1; /* fg__matmul_bf16_set_mode; -1: the environment's */

static int parse_mode(const char *v) {
    if (!v || !*v || strcmp(v, "auto") == 0) return MODE_AUTO;
    if (strcmp(v, "onednn") == 0) return MODE_ONEDNN;
    if (strcmp(v, "fallback") == 0) return MODE_FALLBACK;
    return MODE_BAD;
}

static void read_env(void) {
    const char *v = getenv(MODE_ENV);
    g_env_mode = parse_mode(v);
    if (g_env_mode == MODE_BAD) snprintf(g_env_value, sizeof g_env_value, "%s", v);
}

static int mode(void) {
    int f = atomic_load(&g_forced);
    if (f >= 0) return f;
    pthread_once(&g_env_once, read_env);
    return g_env_mode;
}

static FG_MUST_USE fg_status bad_mode(void) {
    return fg_error(FG_EINVAL, "%s=\"%s\": expected auto, onednn or fallback", MODE_ENV,
                    g_env_value);
}

fg_status fg__matmul_bf16_set_mode(const char *v) {
    if (!v) {
        atomic_store(&g_forced, -1);
        return FG_OK;
    }
    int m = parse_mode(v);
    if (m == MODE_BAD)
        return fg_error(FG_EINVAL, "matmul_bf16 mode \"%s\": expected auto, onednn or fallback", v);
    atomic_store(&g_forced, m);
    return FG_OK;
}

/* Whether oneDNN has a bf16 matmul here, asked once. */
static pthread_once_t g_probe_once = PTHREAD_ONCE_INIT;
static fg_status g_probe;
static char g_probe_msg[320]; /* why not, without the "matmul_bf16: " */

static void probe(void) {
    g_probe = fg__dnnl_bf16_probe();
    if (g_probe == FG_OK) return;
    const char *msg = fg_last_error(), *pre = "matmul_bf16: ";
    if (strncmp(msg, pre, strlen(pre)) == 0) msg += strlen(pre);
    snprintf(g_probe_msg, sizeof g_probe_msg, "%s", msg);
}

static bool dnnl_usable(void) {
    pthread_once(&g_probe_once, probe);
    return g_probe == FG_OK;
}

/* Variants oneDNN refused (see variant()); any refused at all. */
static _Atomic unsigned char g_refused[128];
static _Atomic bool g_any_refused;

static int variant(const fg_tensor *b, const fg_tensor *c, bool ta, bool tb, double alpha,
                   double beta, int64_t batch) {
    return (c->dtype == FG_BF16) | (alpha != 1.0) << 1 | (beta != 0.0) << 2 | ta << 3 | tb << 4 |
           (b->ndim == 2) << 5 | (batch > 1) << 6;
}

bool fg__matmul_bf16_native(void) {
    int m = mode();
    return (m == MODE_AUTO || m == MODE_ONEDNN) && dnnl_usable();
}

const char *fg_matmul_bf16_path(void) {
    static _Thread_local char buf[400];
    int m = mode();
    if (m == MODE_BAD) {
        snprintf(buf, sizeof buf, "none (%s=\"%s\": expected auto, onednn or fallback)", MODE_ENV,
                 g_env_value);
        return buf;
    }
    if (m == MODE_FALLBACK) return "f32-fallback (" MODE_ENV "=fallback)";
    const char *isa = fg__dnnl_isa();
    if (!dnnl_usable()) {
        const char *why = !isa                         ? "no oneDNN in this build"
                          : g_probe == FG_EUNSUPPORTED ? "oneDNN has no bf16 matmul on"
                                                       : g_probe_msg;
        snprintf(buf, sizeof buf, "%s (%s%s%s%s)", m == MODE_ONEDNN ? "none" : "f32-fallback",
                 m == MODE_ONEDNN ? MODE_ENV "=onednn, but " : "", why,
                 isa && g_probe == FG_EUNSUPPORTED ? " " : "",
                 isa && g_probe == FG_EUNSUPPORTED ? isa : "");
        return buf;
    }
    snprintf(buf, sizeof buf, "onednn-bf16 (%s)%s", isa,
             m == MODE_AUTO && atomic_load(&g_any_refused)
                 ? " and f32-fallback for the variants oneDNN lacks"
                 : "");
    return buf;
}

/* c = beta c, for a product with K = 0. */
static void scale_output(fg_tensor *c, double beta) {
    for (int64_t i = 0; i < c->numel; i++) {
        if (c->dtype == FG_F32) {
            float *p = c->data;
            p[i] = beta == 0 ? 0.0f : (float)(beta * p[i]);
        } else {
            uint16_t *p = c->data;
            p[i] = fg_f32_to_bf16(beta == 0 ? 0.0f : (float)(beta * fg_bf16_to_f32(p[i])));
        }
    }
}

/* An f32 tensor of t's shape over data (contiguous). */
static FG_MUST_USE fg_status f32_view(fg_tensor *v, const fg_tensor *t, float *data) {
    memset(v, 0, sizeof *v);
    FG_TRY(fg__tensor_init_shape(v, FG_F32, t->ndim, t->shape));
    v->data = data;
    v->device = t->device;
    return FG_OK;
}

static FG_MUST_USE fg_status fallback(const fg_tensor *a, bool ta, const fg_tensor *b, bool tb,
                                      fg_tensor *c, double alpha, double beta) {
    int64_t na = a->numel, nb = b->numel, nc = c->dtype == FG_BF16 ? c->numel : 0;
    size_t bytes = sizeof(float) * (size_t)(na + nb + nc);
    float *buf = fg__lowp_scratch(bytes); /* the thread's: no fresh mapping per product */
    if (!buf)
        return fg_error(FG_ENOMEM, "matmul_bf16: %zu bytes for the f32 copies of a and b", bytes);
    fg_tensor a32, b32, c32;
    fg_status st = f32_view(&a32, a, buf);
    if (st == FG_OK) st = f32_view(&b32, b, buf + na);
    if (st == FG_OK && nc) st = f32_view(&c32, c, buf + na + nb);
    if (st != FG_OK) goto fail;
    /* the conversions' vector path (lowp_cvt.c): the same bits as scalar */
    fg__lowp_widen(buf, a->data, na, FG_BF16);
    fg__lowp_widen(buf + na, b->data, nb, FG_BF16);
    if (nc && beta != 0) fg__lowp_widen(c32.data, c->data, nc, FG_BF16);
    st = fg__cpu_matmul(&a32, ta, &b32, tb, nc ? &c32 : c, alpha, beta);
    if (st == FG_OK && nc) fg__lowp_narrow(c->data, c32.data, nc, FG_BF16);
fail:
    return st;
}

fg_status fg__cpu_matmul_bf16(const fg_tensor *a, bool ta, const fg_tensor *b, bool tb,
                              fg_tensor *c, double alpha, double beta) {
    char sa[96], sb[96], sc[96];
    if (a->dtype != FG_BF16 || b->dtype != FG_BF16 || (c->dtype != FG_F32 && c->dtype != FG_BF16))
        return fg_error(FG_EUNSUPPORTED,
                        "matmul_bf16: wants bf16 a and b and an f32 or bf16 c, got %s, %s, %s",
                        fg_dtype_name(a->dtype), fg_dtype_name(b->dtype), fg_dtype_name(c->dtype));
    FG_TRY(fg__expect_contiguous("matmul_bf16", a));
    FG_TRY(fg__expect_contiguous("matmul_bf16", b));
    FG_TRY(fg__expect_contiguous("matmul_bf16", c));
    bool shared = b->ndim == 2, ok = a->ndim >= 2 && b->ndim >= 2 && c->ndim == a->ndim;
    for (int d = 0; ok && d < a->ndim - 2; d++)
        ok = a->shape[d] == c->shape[d] &&
             (shared || (b->ndim == a->ndim && b->shape[d] == a->shape[d]));
    int64_t M = 0, K = 0, N = 0;
    if (ok) {
        M = a->shape[a->ndim - (ta ? 1 : 2)];
        K = a->shape[a->ndim - (ta ? 2 : 1)];
        N = b->shape[b->ndim - (tb ? 2 : 1)];
        ok = b->shape[b->ndim - (tb ? 1 : 2)] == K && c->shape[c->ndim - 2] == M &&
             c->shape[c->ndim - 1] == N;
    }
    if (!ok)
        return fg_error(FG_EINVAL,
                        "matmul_bf16: shapes do not fit: a %s%s @ b %s%s -> c %s (want a (..., M, "
                        "K), b (..., K, N) or (K, N), c (..., M, N))",
                        fg_tensor_describe(a, sa, sizeof sa), ta ? "^T" : "",
                        fg_tensor_describe(b, sb, sizeof sb), tb ? "^T" : "",
                        fg_tensor_describe(c, sc, sizeof sc));
    int64_t batch = 1;
    for (int d = 0; d < a->ndim - 2; d++) batch *= a->shape[d];
    if (batch == 0 || M == 0 || N == 0) return FG_OK;
    if (K == 0) { /* oneDNN rejects empty dims; nothing to multiply anyway */
        scale_output(c, beta);
        return FG_OK;
    }

    int m = mode();
    if (m == MODE_BAD) return bad_mode();
    if (m == MODE_ONEDNN) {
        if (!dnnl_usable())
            return fg_error(g_probe,
                            "matmul_bf16: %s=onednn, but %s; unset it or set it to auto for the "
                            "f32 fallback",
                            MODE_ENV, g_probe_msg);
        return fg__dnnl_matmul_bf16(a, ta, b, tb, c, alpha, beta, batch, M, K, N);
    }
    if (m == MODE_AUTO && dnnl_usable()) {
        int v = variant(b, c, ta, tb, alpha, beta, batch);
        if (!atomic_load_explicit(&g_refused[v], memory_order_relaxed)) {
            fg_status st = fg__dnnl_matmul_bf16(a, ta, b, tb, c, alpha, beta, batch, M, K, N);
            if (st != FG_EUNSUPPORTED) return st;
            atomic_store_explicit(&g_refused[v], 1, memory_order_relaxed);
            atomic_store_explicit(&g_any_refused, true, memory_order_relaxed);
        }
    }
    return fallback(a, ta, b, tb, c, alpha, beta);
}
