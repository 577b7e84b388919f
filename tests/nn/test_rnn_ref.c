/* LSTM, GRU and MultiheadAttention against PyTorch 1.13, forward and
 * backward (outputs, final states, attention weights, and the gradients of
 * every input and every parameter), in f32 and f64: tests/ref/gen_rnn_ref.py
 * wrote tests/ref/rnn_ref.bin, PyTorch's weights loaded here strictly under
 * PyTorch's names. Then finite-difference gradient checks in f64 of tiny
 * LSTM, GRU and MHA modules (inputs, states and every parameter), PyTorch's
 * initialisation bounds, and the argument errors. Last, the LSTM language
 * model trained by SGD from PyTorch's weights, step for step as PyTorch. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fulgur/nn.h"
#include "gradcheck.h"
#include "harness.h"
#include "nn/nn_impl.h"
#include "ops/cpu/blas.h"
#include "ref/ref_file.h"

static fg_tensor *from_ref(const ref_array *a, bool grad) {
    if (!a) return NULL;
    fg_tensor *t = fg_tensor_new(a->dtype, a->ndim, a->shape);
    memcpy(fg_tensor_data(t), a->data, fg_tensor_nbytes(t));
    fg_tensor_set_requires_grad(t, grad);
    return t;
}

static const ref_array *opt(const ref_file *r, const char *pre, const char *k) {
    char name[192];
    snprintf(name, sizeof name, "%s.%s", pre, k);
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->a[i].name, name)) return &r->a[i];
    return NULL;
}

/* elements of got off want beyond atol + rtol |want| (-1: missing or of
 * another size); the largest gap in *worst */
static int compare(const fg_tensor *got, const ref_array *want, double rtol, double atol,
                   double *worst) {
    if (!want && !got) return 0;
    if (!got || !want || fg_tensor_numel(got) != want->numel) return -1000000;
    int bad = 0;
    for (int64_t i = 0; i < want->numel; i++) {
        double a = fg_tensor_get(got, i), b = ref_at(want, i), d = fabs(a - b);
        if (!(d <= atol + rtol * fabs(b))) bad++;
        if (d > *worst) *worst = d;
    }
    return bad;
}

/* sum(t * w) for w from the file, as an autograd expression */
static fg_tensor *weighted(fg_tensor *t, const ref_array *w) {
    if (!t || !w) return NULL;
    fg_tensor *wt = fg_empty(w->dtype, fg_tensor_ndim(t), fg_tensor_shape(t)); /* step tensor */
    if (!wt || fg_tensor_numel(wt) != w->numel) return NULL;
    memcpy(fg_tensor_data(wt), w->data, fg_tensor_nbytes(wt));
    return fg_sum(fg_mul(t, wt));
}

/* loads every "<pre>.p.<name>" array strictly; returns how many */
static int load_params(fg_module *m, const ref_file *r, const char *pre) {
    fg_state_entry e[64];
    int n = 0;
    char p[160];
    snprintf(p, sizeof p, "%s.p.", pre);
    size_t lp = strlen(p);
    for (int i = 0; i < r->n && n < 64; i++)
        if (!strncmp(r->a[i].name, p, lp))
            e[n++] = (fg_state_entry){r->a[i].name + lp, r->a[i].dtype, r->a[i].ndim, r->a[i].shape,
                                      r->a[i].data};
    if (fg_module_load_state(m, e, n, true) != FG_OK) {
        fprintf(stderr, "  %s: %s\n", pre, fg_last_error());
        return -1;
    }
    return n;
}

/* every parameter's gradient against "<pre>.gp.<name>" */
static int compare_param_grads(fg_module *m, const ref_file *r, const char *pre, double rtol,
                               double atol, double *worst) {
    int bad = 0;
    for (int64_t i = 0; i < fg_module_num_params(m); i++) {
        char k[160];
        snprintf(k, sizeof k, "gp.%s", fg_module_param_name(m, i));
        int b = compare(fg_tensor_grad(fg_module_param(m, i)), opt(r, pre, k), rtol, atol, worst);
        if (b) fprintf(stderr, "  %s: %s: %d off\n", pre, k, b);
        bad += b;
    }
    return bad;
}

static int run_rnn_case(const ref_file *r, const char *pre, const ref_array *cfg, double *worst) {
    double c[8];
    for (int k = 0; k < 8; k++) c[k] = ref_at(cfg, k);
    const ref_array *rx = opt(r, pre, "x");
    if (!rx) return 1;
    fg_dtype dt = rx->dtype;
    bool f32 = dt == FG_F32, lstm = c[0] == 0;
    double rtol = f32 ? 2e-5 : 1e-11, atol = f32 ? 2e-6 : 1e-13;
    fg_rnn_opts o = {.num_layers = (int64_t)c[3],
                     .bidirectional = c[4] != 0,
                     .no_bias = c[5] == 0,
                     .batch_first = c[6] != 0};
    fg_module *m = lstm ? fg_lstm_new((int64_t)c[1], (int64_t)c[2], &o, dt)
                        : fg_gru_new((int64_t)c[1], (int64_t)c[2], &o, dt);
    if (!m) return 1;
    int np = load_params(m, r, pre);
    int bad = np == fg_module_num_params(m) ? 0 : 1;
    fg_tensor *x = from_ref(rx, true);
    fg_tensor *h0 = from_ref(opt(r, pre, "h0"), true), *c0 = from_ref(opt(r, pre, "c0"), true);
    fg_tensor *hn = NULL, *cn = NULL;
    fg_tensor *y = fg_rnn_forward(m, x, h0, c0, &hn, lstm ? &cn : NULL);
    if (!y) {
        fprintf(stderr, "  %s: %s\n", pre, fg_last_error());
        bad++;
    } else {
        fg_tensor *loss = fg_add(weighted(y, opt(r, pre, "gy")), weighted(hn, opt(r, pre, "ghn")));
        if (lstm) loss = fg_add(loss, weighted(cn, opt(r, pre, "gcn")));
        if (fg_backward(loss) != FG_OK) {
            fprintf(stderr, "  %s: backward: %s\n", pre, fg_last_error());
            bad++;
        }
        int b[6] = {compare(y, opt(r, pre, "y"), rtol, atol, worst),
                    compare(hn, opt(r, pre, "hn"), rtol, atol, worst),
                    compare(cn, opt(r, pre, "cn"), rtol, atol, worst),
                    compare(fg_tensor_grad(x), opt(r, pre, "gx"), rtol, atol, worst),
                    h0 ? compare(fg_tensor_grad(h0), opt(r, pre, "gh0"), rtol, atol, worst) : 0,
                    c0 ? compare(fg_tensor_grad(c0), opt(r, pre, "gc0"), rtol, atol, worst) : 0};
        for (int k = 0; k < 6; k++)
            if (b[k]) fprintf(stderr, "  %s: value %d: %d off\n", pre, k, b[k]);
        for (int k = 0; k < 6; k++) bad += b[k] != 0;
        bad += compare_param_grads(m, r, pre, rtol, atol, worst) != 0;
    }
    fg_step_reset();
    fg_module_free(m);
    fg_tensor_free(x);
    fg_tensor_free(h0);
    fg_tensor_free(c0);
    return bad;
}

static int run_mha_case(const ref_file *r, const char *pre, const ref_array *cfg, double *worst) {
    double c[10];
    for (int k = 0; k < 10; k++) c[k] = ref_at(cfg, k);
    const ref_array *rq = opt(r, pre, "q");
    if (!rq) return 1;
    fg_dtype dt = rq->dtype;
    bool f32 = dt == FG_F32, self = c[5] != 0;
    double rtol = f32 ? 2e-5 : 1e-11, atol = f32 ? 2e-6 : 1e-13;
    fg_mha_opts o = {.no_bias = c[3] == 0, .batch_first = c[4] != 0};
    fg_module *m = fg_multihead_attention_new((int64_t)c[1], (int64_t)c[2], &o, dt);
    if (!m) return 1;
    int np = load_params(m, r, pre);
    int bad = np == fg_module_num_params(m) ? 0 : 1;
    fg_tensor *q = from_ref(rq, true);
    fg_tensor *k = self ? q : from_ref(opt(r, pre, "k"), true);
    fg_tensor *v = self ? q : from_ref(opt(r, pre, "v"), true);
    fg_tensor *kpm = from_ref(opt(r, pre, "kpm"), false);
    fg_tensor *mask = from_ref(opt(r, pre, "mask"), false);
    fg_mha_args a = {.key_padding_mask = kpm, .attn_mask = mask, .per_head_weights = c[9] != 0};
    /* the mhaf cases have no weights: need_weights=False, the fused call */
    bool need_w = opt(r, pre, "w") != NULL;
    fg_tensor *w = NULL;
    fg_tensor *y = fg_mha_forward(m, q, k, v, &a, need_w ? &w : NULL);
    if (!y) {
        fprintf(stderr, "  %s: %s\n", pre, fg_last_error());
        bad++;
    } else {
        fg_tensor *loss = weighted(y, opt(r, pre, "gy"));
        if (need_w) loss = fg_add(loss, weighted(w, opt(r, pre, "gw")));
        if (fg_backward(loss) != FG_OK) {
            fprintf(stderr, "  %s: backward: %s\n", pre, fg_last_error());
            bad++;
        }
        int b[5] = {compare(y, opt(r, pre, "y"), rtol, atol, worst),
                    compare(w, opt(r, pre, "w"), rtol, atol, worst),
                    compare(fg_tensor_grad(q), opt(r, pre, "gq"), rtol, atol, worst),
                    self ? 0 : compare(fg_tensor_grad(k), opt(r, pre, "gk"), rtol, atol, worst),
                    self ? 0 : compare(fg_tensor_grad(v), opt(r, pre, "gv"), rtol, atol, worst)};
        for (int j = 0; j < 5; j++)
            if (b[j]) fprintf(stderr, "  %s: value %d: %d off\n", pre, j, b[j]);
        for (int j = 0; j < 5; j++) bad += b[j] != 0;
        bad += compare_param_grads(m, r, pre, rtol, atol, worst) != 0;
    }
    fg_step_reset();
    fg_module_free(m);
    fg_tensor_free(q);
    if (!self) {
        fg_tensor_free(k);
        fg_tensor_free(v);
    }
    fg_tensor_free(kpm);
    fg_tensor_free(mask);
    return bad;
}

/* The LSTM's and the GRU's paths (nn_impl.h's fg__rnn_set_path, blas.h's
 * fg__gemm_set_mode): the composed ops (every other device's and
 * autocast's), the fused node with the products' own choice, with
 * OpenBLAS's products, and with oneDNN's (the per-step product's b then
 * reordered once, k_rnn.c) where the build has oneDNN. */
static const char *const k_paths[4][2] = {
    {"composed", "auto"}, {"auto", "auto"}, {"auto", "openblas"}, {"auto", "onednn"}};

static bool set_path(int k) {
    if (!strcmp(k_paths[k][1], "onednn") && !fg__dnnl_isa()) {
        printf("  path %s/onednn skipped: this build has no oneDNN\n", k_paths[k][0]);
        return false;
    }
    CHECK_OK(fg__rnn_set_path(k_paths[k][0]));
    CHECK_OK(fg__gemm_set_mode(k_paths[k][1]));
    return true;
}

static void reset_path(void) {
    CHECK_OK(fg__rnn_set_path("auto"));
    CHECK_OK(fg__gemm_set_mode(NULL));
}

static void match_pytorch(const char *path) {
    ref_file *r = ref_open(fg_test_path("ref/rnn_ref.bin"));
    CHECK(r != NULL);
    if (!r) return;
    int nrnn = 0, nmha = 0;
    double worst[2] = {0, 0};
    for (int i = 0; i < r->n; i++) {
        size_t len = strlen(r->a[i].name);
        if (len < 4 || strcmp(r->a[i].name + len - 4, ".cfg")) continue;
        char pre[128];
        snprintf(pre, sizeof pre, "%.*s", (int)(len - 4), r->a[i].name);
        bool f32 = strstr(pre, ".f32") != NULL;
        int kind = (int)ref_at(&r->a[i], 0);
        int bad = kind < 2 ? run_rnn_case(r, pre, &r->a[i], &worst[f32 ? 0 : 1])
                           : run_mha_case(r, pre, &r->a[i], &worst[f32 ? 0 : 1]);
        CHECK_MSG(bad == 0, "%s, path %s: %d groups of values off", pre, path, bad);
        if (kind < 2) nrnn++;
        else nmha++;
    }
    printf("  path %s: %d LSTM/GRU and %d MHA cases; largest gap f32 %.3g, f64 %.3g\n", path, nrnn,
           nmha, worst[0], worst[1]);
    CHECK(nrnn == 20 && nmha == 28);
    ref_close(r);
}

TEST(lstm_gru_mha_match_pytorch_f32_f64) {
    for (int k = 0; k < 4; k++) {
        char name[64];
        snprintf(name, sizeof name, "%s/%s", k_paths[k][0], k_paths[k][1]);
        if (set_path(k)) match_pytorch(name);
    }
    reset_path();
}

/* The GRU's fused node against its composed ops (the path of every other
 * device and of autocast) at sizes the vector kernels take with a tail (H
 * 37: 4 vectors of 8 and 5 over, 2 of 16 and 5 over), 2 layers,
 * bidirectional, batch_first, with h0: the output, h_n and the gradients of
 * x, h0 and every parameter. The two compute the same formulas; they differ
 * in rounding alone: b_hh added after the product or inside it, the
 * product's engine and order, and (f32) the vector kernels' sigmoid and
 * tanh from fg__expf, within a few ulp of libm's, against the composed ops'
 * own. So f64 agrees to ~1e-15 and f32 to ~1e-6 of values of order 1 (a
 * handful of ulp over 9 steps and 2 layers; the gradients sum 9 x 5 rows);
 * the bounds are ~10x the largest gaps measured on the scalar, AVX2 and
 * AVX-512 paths (1.3e-6, 1.8e-15). The fused path records a few nodes a
 * layer and direction (33 here) instead of ~20 a step (765). */
typedef struct gru_snap {
    double *v[5]; /* y, h_n, and the gradients of x, h0 and the flat parameters */
    int64_t n[5], nodes;
} gru_snap;

static void fill(fg_tensor *t, double a, double (*f)(double), double scale) {
    for (int64_t i = 0; i < fg_tensor_numel(t); i++) {
        double v = scale * f(a * (double)i);
        if (fg_tensor_dtype(t) == FG_F32) ((float *)fg_tensor_data(t))[i] = (float)v;
        else ((double *)fg_tensor_data(t))[i] = v;
    }
}

static void snap_one(gru_snap *s, int k, const fg_tensor *t) {
    s->n[k] = t ? fg_tensor_numel(t) : 0;
    s->v[k] = malloc(sizeof(double) * (size_t)(s->n[k] ? s->n[k] : 1));
    for (int64_t i = 0; i < s->n[k]; i++) s->v[k][i] = fg_tensor_get(t, i);
}

/* forward and backward of a loss weighing every element of y and h_n
 * differently; the values in *s */
static bool gru_run(fg_module *m, fg_tensor *x, fg_tensor *h0, gru_snap *s) {
    fg_module_zero_grad(m);
    fg_tensor_zero_grad(x);
    fg_tensor_zero_grad(h0);
    int64_t before = fg_tape_size();
    fg_tensor *hn = NULL, *y = fg_rnn_forward(m, x, h0, NULL, &hn, NULL);
    s->nodes = fg_tape_size() - before;
    if (!y || !hn) return false;
    fg_dtype dt = fg_tensor_dtype(y);
    fg_tensor *wy = fg_empty(dt, 3, fg_tensor_shape(y)), *wh = fg_empty(dt, 3, fg_tensor_shape(hn));
    if (!wy || !wh) return false;
    fill(wy, 0.37, sin, 1);
    fill(wh, 0.53, cos, 1);
    fg_tensor *loss = fg_add(fg_sum(fg_mul(y, wy)), fg_sum(fg_mul(hn, wh)));
    if (!loss || fg_backward(loss) != FG_OK) return false;
    const fg_tensor *t[5] = {y, hn, fg_tensor_grad(x), fg_tensor_grad(h0), fg_module_flat_grads(m)};
    for (int k = 0; k < 5; k++) snap_one(s, k, t[k]);
    fg_step_reset();
    return true;
}

TEST(gru_fused_equals_composed_f32_f64) {
    int64_t In = 7, H = 37, T = 9, N = 5;
    static const char *const what[5] = {"y", "h_n", "dx", "dh0", "dparams"};
    for (int k = 0; k < 2; k++) {
        fg_dtype dt = k ? FG_F64 : FG_F32;
        fg_rnn_opts o = {.num_layers = 2, .bidirectional = true, .batch_first = true};
        fg_module *m = fg_gru_new(In, H, &o, dt);
        CHECK_OK(fg_module_set_seed(m, 17));
        CHECK_OK(fg_module_finalize(m));
        fg_tensor *x = fg_tensor_new(dt, 3, (int64_t[]){N, T, In});
        fg_tensor *h0 = fg_tensor_new(dt, 3, (int64_t[]){4, N, H});
        fill(x, 0.7, sin, 1);
        fill(h0, 0.3, cos, 0.5);
        fg_tensor_set_requires_grad(x, true);
        fg_tensor_set_requires_grad(h0, true);
        gru_snap s[2];
        memset(s, 0, sizeof s);
        for (int p = 0; p < 2; p++) {
            CHECK_OK(fg__rnn_set_path(p ? "composed" : "auto"));
            CHECK_MSG(gru_run(m, x, h0, &s[p]), "%s, path %d: %s", fg_dtype_name(dt), p,
                      fg_last_error());
        }
        CHECK_OK(fg__rnn_set_path("auto"));
        double lim = k ? 2e-14 : 1.5e-5, worst = 0;
        for (int j = 0; j < 5; j++) {
            CHECK(s[0].n[j] == s[1].n[j] && s[0].n[j] > 0);
            double w = 0;
            for (int64_t i = 0; i < s[0].n[j] && s[0].n[j] == s[1].n[j]; i++)
                w = fmax(w, fabs(s[0].v[j][i] - s[1].v[j][i]));
            CHECK_MSG(w <= lim, "%s %s: fused and composed differ by %g", fg_dtype_name(dt),
                      what[j], w);
            worst = fmax(worst, w);
            free(s[0].v[j]);
            free(s[1].v[j]);
        }
        printf("  GRU %s: fused %lld recorded nodes, composed %lld; largest gap %.3g\n",
               fg_dtype_name(dt), (long long)s[0].nodes, (long long)s[1].nodes, worst);
        CHECK(s[0].nodes * 10 < s[1].nodes);
        fg_module_free(m);
        fg_tensor_free(x);
        fg_tensor_free(h0);
    }
}

/* ----------------------------------------------------- finite differences */

typedef struct gc_arg {
    fg_module *m;
    bool lstm, mha;
    int nin; /* x, h0, c0 or q, k, v first; then the parameters */
} gc_arg;

static fg_tensor *gc_rnn(fg_tensor **in, void *arg) {
    gc_arg *g = arg;
    fg_tensor *hn = NULL, *cn = NULL;
    fg_tensor *y =
        fg_rnn_forward(g->m, in[0], in[1], g->lstm ? in[2] : NULL, &hn, g->lstm ? &cn : NULL);
    if (!y) return NULL;
    fg_tensor *parts[3] = {fg_flatten(y, 0, -1), fg_flatten(hn, 0, -1),
                           g->lstm ? fg_flatten(cn, 0, -1) : NULL};
    return fg_cat(parts, g->lstm ? 3 : 2, 0);
}

static fg_tensor *gc_mha(fg_tensor **in, void *arg) {
    gc_arg *g = arg;
    fg_tensor *w = NULL;
    int64_t S = fg_tensor_dim(in[1], 0), N = fg_tensor_dim(in[1], 1);
    fg_tensor *kpm = fg_zeros(FG_I32, 2, (int64_t[]){N, S});
    ((int32_t *)fg_tensor_data(kpm))[S - 1] = 1; /* batch 0 ignores its last key */
    fg_tensor *mask = fg_full(FG_F64, 2, (int64_t[]){fg_tensor_dim(in[0], 0), S}, 0.25);
    ((double *)fg_tensor_data(mask))[1] = -0.5;
    fg_mha_args a = {.key_padding_mask = kpm, .attn_mask = mask};
    fg_tensor *y = fg_mha_forward(g->m, in[0], in[1], in[2], &a, &w);
    if (!y) return NULL;
    fg_tensor *parts[2] = {fg_flatten(y, 0, -1), fg_flatten(w, 0, -1)};
    return fg_cat(parts, 2, 0);
}

/* self-attention without masks or weights: the fused kernel's path */
static fg_tensor *gc_mha_self(fg_tensor **in, void *arg) {
    gc_arg *g = arg;
    return fg_flatten(fg_module_forward(g->m, in[0]), 0, -1);
}

/* the same with a key padding mask (batch 1 ignores keys 1 and 3): fused too */
static fg_tensor *gc_mha_self_padded(fg_tensor **in, void *arg) {
    gc_arg *g = arg;
    int64_t S = fg_tensor_dim(in[0], 0), N = fg_tensor_dim(in[0], 1);
    fg_tensor *kpm = fg_zeros(FG_U8, 2, (int64_t[]){N, S});
    ((uint8_t *)fg_tensor_data(kpm))[S + 1] = ((uint8_t *)fg_tensor_data(kpm))[S + 3] = 1;
    fg_mha_args a = {.key_padding_mask = kpm};
    return fg_flatten(fg_mha_forward(g->m, in[0], in[0], in[0], &a, NULL), 0, -1);
}

static int gradcheck_module(const char *what, fg_module *m, fg_gc_fn f, fg_tensor **in, int nin,
                            gc_arg *g) {
    fg_tensor *all[40];
    int n = 0;
    for (int k = 0; k < nin; k++) {
        fg_tensor_set_requires_grad(in[k], true);
        all[n++] = in[k];
    }
    for (int64_t i = 0; i < fg_module_num_params(m) && n < 40; i++)
        all[n++] = fg_module_param(m, i);
    g->nin = nin;
    return gradcheck(what, f, all, n, g, 1e-6, 1e-8);
}

TEST(lstm_gru_gradients_match_finite_differences_f64) {
    for (int gru = 0; gru < 2; gru++) {
        fg_rnn_opts o = {.num_layers = 2, .bidirectional = true};
        fg_module *m = gru ? fg_gru_new(2, 3, &o, FG_F64) : fg_lstm_new(2, 3, &o, FG_F64);
        CHECK_OK(fg_module_set_seed(m, 7));
        CHECK_OK(fg_module_finalize(m));
        CHECK(fg_module_num_params(m) == 16);
        fg_tensor *in[3] = {gc_randn(3, (int64_t[]){3, 2, 2}, 1, 1.0),
                            gc_randn(3, (int64_t[]){4, 2, 3}, 2, 0.5),
                            gc_randn(3, (int64_t[]){4, 2, 3}, 3, 0.5)};
        gc_arg g = {.m = m, .lstm = !gru};
        CHECK(gradcheck_module(gru ? "GRU" : "LSTM", m, gc_rnn, in, gru ? 2 : 3, &g) == 0);
        fg_module_free(m);
        for (int k = 0; k < 3; k++) fg_tensor_free(in[k]);
    }
}

TEST(mha_gradients_match_finite_differences_f64) {
    fg_module *m = fg_multihead_attention_new(4, 2, NULL, FG_F64);
    CHECK_OK(fg_module_finalize(m));
    /* non-zero biases */
    for (int64_t i = 0; i < fg_module_num_params(m); i++) {
        fg_tensor *p = fg_module_param(m, i);
        if (fg_tensor_ndim(p) == 1)
            for (int64_t j = 0; j < fg_tensor_numel(p); j++)
                ((double *)fg_tensor_data(p))[j] = 0.1 * sin((double)(j + 3 * i));
    }
    fg_tensor *in[3] = {gc_randn(3, (int64_t[]){3, 2, 4}, 4, 1.0),
                        gc_randn(3, (int64_t[]){5, 2, 4}, 5, 1.0),
                        gc_randn(3, (int64_t[]){5, 2, 4}, 6, 1.0)};
    gc_arg g = {.m = m, .mha = true};
    CHECK(gradcheck_module("MHA", m, gc_mha, in, 3, &g) == 0);
    gc_arg gs = {.m = m, .mha = true};
    CHECK(gradcheck_module("MHA fused", m, gc_mha_self, in + 1, 1, &gs) == 0);
    gc_arg gp = {.m = m, .mha = true};
    CHECK(gradcheck_module("MHA fused, padded", m, gc_mha_self_padded, in + 1, 1, &gp) == 0);
    /* the fused call records fewer nodes than the recorded one (weights
     * asked for): the padded call did take the fused kernel */
    fg_step_reset();
    int64_t t0 = fg_tape_size();
    CHECK(gc_mha_self_padded(in + 1, &gp) != NULL);
    int64_t fused = fg_tape_size() - t0;
    fg_step_reset();
    fg_tensor *w = NULL, *kpm = fg_zeros(FG_U8, 2, (int64_t[]){2, 5});
    t0 = fg_tape_size();
    CHECK(fg_mha_forward(m, in[1], in[1], in[1], &(fg_mha_args){.key_padding_mask = kpm}, &w));
    int64_t recorded = fg_tape_size() - t0;
    CHECK_MSG(fused + 5 < recorded, "fused %lld nodes, recorded %lld", (long long)fused,
              (long long)recorded);
    fg_step_reset();
    fg_module_free(m);
    for (int k = 0; k < 3; k++) fg_tensor_free(in[k]);
}

/* ------------------------------------------------- names, init, errors */

TEST(rnn_mha_names_init_and_errors) {
    fg_rnn_opts o = {.num_layers = 2, .bidirectional = true};
    fg_module *m = fg_lstm_new(5, 8, &o, FG_F32);
    CHECK(m != NULL);
    CHECK(fg_module_num_params(m) == 16);
    CHECK(strcmp(fg_module_param_name(m, 0), "weight_ih_l0") == 0);
    CHECK(strcmp(fg_module_param_name(m, 4), "weight_ih_l0_reverse") == 0);
    CHECK(strcmp(fg_module_param_name(m, 15), "bias_hh_l1_reverse") == 0);
    CHECK(fg_tensor_dim(fg_module_param(m, 8), 1) == 16); /* layer 1 takes 2H */
    double bound = 1.0 / sqrt(8.0), mx = 0;
    for (int64_t i = 0; i < fg_module_numel(m); i++)
        mx = fmax(mx, fabs(fg_tensor_get(fg_module_flat_params(m), i)));
    CHECK(mx <= bound && mx > 0.9 * bound);
    /* a wrong h0 and a wrong input are named */
    fg_tensor *x = fg_zeros(FG_F32, 3, (int64_t[]){4, 2, 5});
    fg_tensor *h0 = fg_zeros(FG_F32, 3, (int64_t[]){2, 2, 8});
    CHECK(fg_rnn_forward(m, x, h0, NULL, NULL, NULL) == NULL);
    CHECK_CONTAINS(fg_last_error(), "h0");
    CHECK_CONTAINS(fg_last_error(), "[4, 2, 8]");
    fg_tensor *x2 = fg_zeros(FG_F32, 3, (int64_t[]){4, 2, 6});
    CHECK(fg_module_forward(m, x2) == NULL);
    CHECK_CONTAINS(fg_last_error(), "input");
    fg_tensor *y = fg_module_forward(m, x);
    CHECK(y && fg_tensor_dim(y, 2) == 16);
    /* under activation checkpointing only the one-input call runs */
    CHECK_OK(fg_module_set_activation_checkpointing(m, "LSTM", true, NULL));
    CHECK(fg_rnn_forward(m, x, NULL, NULL, NULL, NULL) == NULL);
    CHECK(fg_last_status() == FG_EUNSUPPORTED);
    CHECK_CONTAINS(fg_last_error(), "activation checkpointing");
    fg_tensor *yc = fg_module_forward(m, x);
    CHECK(yc && fg_tensor_get(yc, 7) == fg_tensor_get(y, 7));
    CHECK_OK(fg_module_set_activation_checkpointing(m, "LSTM", false, NULL));
    /* unbatched (T, in): output (T, 2H), states (layers * 2, H) */
    fg_tensor *hn = NULL, *cn = NULL;
    y = fg_rnn_forward(m, fg_zeros(FG_F32, 2, (int64_t[]){4, 5}), NULL, NULL, &hn, &cn);
    CHECK(y && fg_tensor_ndim(y) == 2 && fg_tensor_dim(y, 1) == 16);
    CHECK(hn && cn && fg_tensor_ndim(hn) == 2 && fg_tensor_dim(cn, 0) == 4);
    fg_module_free(m);

    m = fg_gru_new(3, 4, &(fg_rnn_opts){.no_bias = true}, FG_F64);
    CHECK(fg_module_num_params(m) == 2 && fg_module_dtype(m) == FG_F64);
    CHECK(strcmp(fg_module_param_name(m, 1), "weight_hh_l0") == 0);
    fg_module_free(m);
    CHECK(fg_lstm_new(0, 4, NULL, FG_F32) == NULL);
    CHECK_CONTAINS(fg_last_error(), "input_size 0");

    m = fg_multihead_attention_new(12, 3, NULL, FG_F32);
    CHECK(fg_module_num_params(m) == 4);
    const char *names[4] = {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"};
    for (int i = 0; i < 4; i++) CHECK(strcmp(fg_module_param_name(m, i), names[i]) == 0);
    fg_tensor *w = fg_module_param(m, 0);
    double xb = sqrt(6.0 / 48.0), lb = 1.0 / sqrt(12.0), wm = 0, om = 0, bm = 0;
    for (int64_t i = 0; i < fg_tensor_numel(w); i++) wm = fmax(wm, fabs(fg_tensor_get(w, i)));
    for (int64_t i = 0; i < 144; i++) om = fmax(om, fabs(fg_tensor_get(fg_module_param(m, 2), i)));
    for (int64_t i = 0; i < 36; i++) bm = fmax(bm, fabs(fg_tensor_get(fg_module_param(m, 1), i)));
    for (int64_t i = 0; i < 12; i++) bm = fmax(bm, fabs(fg_tensor_get(fg_module_param(m, 3), i)));
    CHECK(wm <= xb && wm > 0.9 * xb);
    CHECK(om <= lb && om > 0.8 * lb);
    CHECK(bm == 0);
    fg_tensor *q = fg_zeros(FG_F32, 3, (int64_t[]){4, 2, 12});
    fg_tensor *bad_mask = fg_zeros(FG_I32, 2, (int64_t[]){4, 5});
    CHECK(fg_mha_forward(m, q, q, q, &(fg_mha_args){.attn_mask = bad_mask}, NULL) == NULL);
    CHECK_CONTAINS(fg_last_error(), "attn_mask");
    y = fg_module_forward(m, q);
    CHECK(y && fg_tensor_ndim(y) == 3 && fg_tensor_dim(y, 2) == 12);
    /* unbatched (L, E) with (S, E) keys: output (L, E), weights (L, S) */
    fg_tensor *q2 = fg_zeros(FG_F32, 2, (int64_t[]){4, 12}),
              *k2 = fg_zeros(FG_F32, 2, (int64_t[]){6, 12});
    fg_tensor *aw = NULL;
    y = fg_mha_forward(m, q2, k2, k2, NULL, &aw);
    CHECK(y && fg_tensor_ndim(y) == 2 && fg_tensor_dim(y, 0) == 4);
    CHECK(aw && fg_tensor_ndim(aw) == 2 && fg_tensor_dim(aw, 1) == 6);
    CHECK(fg_mha_forward(m, q, k2, k2, NULL, NULL) == NULL);
    CHECK_CONTAINS(fg_last_error(), "as the query");
    fg_module_free(m);
    CHECK(fg_multihead_attention_new(10, 3, NULL, FG_F32) == NULL);
    CHECK_CONTAINS(fg_last_error(), "divisible");
    fg_step_reset();
}

/* The LSTM language model from PyTorch's weights, trained by plain SGD in
 * f64 on a short text: the loss before each step equals PyTorch's step for
 * step, falls, and the parameters after the last step agree. */
/* path: "composed" (embedding, then the composed LSTM) or "auto" (the
 * first layer from the projected embedding table, the fused LSTM) */
static void lm_steps(const char *path) {
    CHECK_OK(fg__rnn_set_path(path));
    ref_file *r = ref_open(fg_test_path("ref/rnn_ref.bin"));
    CHECK(r != NULL);
    if (!r) return;
    const ref_array *cfg = ref_get(r, "lm.setup"), *rl = ref_get(r, "lm.loss");
    CHECK(cfg && rl);
    if (!cfg || !rl) return;
    fg_lstm_lm_config c = {.vocab = (int64_t)ref_at(cfg, 0),
                           .embd = (int64_t)ref_at(cfg, 1),
                           .hidden = (int64_t)ref_at(cfg, 2),
                           .layers = (int64_t)ref_at(cfg, 3),
                           .dtype = FG_F64};
    double lr = ref_at(cfg, 4);
    int steps = (int)ref_at(cfg, 5);
    fg_module *m = fg_lstm_lm_new(&c);
    CHECK(m != NULL);
    if (!m) return;
    CHECK(strcmp(fg_module_param_name(m, 0), "embedding.weight") == 0);
    CHECK(strcmp(fg_module_param_name(m, fg_module_num_params(m) - 1), "fc.bias") == 0);
    CHECK(load_params(m, r, "lm") == fg_module_num_params(m));
    fg_tensor *x = from_ref(ref_get(r, "lm.x"), false), *t = from_ref(ref_get(r, "lm.t"), false);
    double worst = 0, first = 0, last = 0;
    for (int s = 0; s < steps; s++) {
        fg_module_zero_grad(m);
        fg_tensor *loss = fg_cross_entropy(fg_module_forward(m, x), t, -100);
        CHECK_MSG(loss != NULL, "step %d: %s", s, fg_last_error());
        if (!loss) break;
        CHECK_OK(fg_backward(loss));
        double l = fg_item(loss);
        worst = fmax(worst, fabs(l - ref_at(rl, s)));
        if (s == 0) first = l;
        last = l;
        double *p = fg_tensor_data(fg_module_flat_params(m));
        const double *g = fg_tensor_data(fg_module_flat_grads(m));
        for (int64_t i = 0; i < fg_module_numel(m); i++) p[i] -= lr * g[i];
        fg_step_reset();
    }
    bool table = c.vocab < fg_tensor_numel(x);
    printf("  LSTM LM, path %s%s: loss %.6f -> %.6f in %d SGD steps, largest gap to PyTorch %.3g\n",
           path, table && strcmp(path, "composed") ? " (projected embedding table)" : "", first,
           last, steps, worst);
    CHECK(table); /* the table's path is the one under test */
    CHECK(worst < 1e-12);
    CHECK(last < first - 0.25);
    int bad = 0;
    for (int64_t i = 0; i < fg_module_num_params(m); i++) {
        char k[160];
        snprintf(k, sizeof k, "final.%s", fg_module_param_name(m, i));
        bad += compare(fg_module_param(m, i), opt(r, "lm", k), 1e-11, 1e-13, &worst) != 0;
    }
    CHECK(bad == 0);
    fg_module_free(m);
    fg_tensor_free(x);
    fg_tensor_free(t);
    ref_close(r);
    CHECK_OK(fg__rnn_set_path("auto"));
}

TEST(lstm_lm_sgd_matches_pytorch_step_for_step_f64) {
    lm_steps("composed");
    lm_steps("auto");
}

/* bf16 and f16 modules (bf16-true, 16-true) run forward and backward and
 * stay near the f32 module of the same seed (its weights rounded once). */
TEST(lstm_gru_mha_in_bf16_f16_near_f32) {
    fg_dtype lows[2] = {FG_BF16, FG_F16};
    for (int k = 0; k < 2; k++)
        for (int kind = 0; kind < 3; kind++) {
            fg_module *m[2];
            fg_tensor *y[2];
            for (int j = 0; j < 2; j++) {
                fg_dtype dt = j ? lows[k] : FG_F32;
                fg_rnn_opts o = {.num_layers = 2, .bidirectional = true};
                m[j] = kind == 0   ? fg_lstm_new(3, 5, &o, dt)
                       : kind == 1 ? fg_gru_new(3, 5, &o, dt)
                                   : fg_multihead_attention_new(6, 2, NULL, dt);
                CHECK_OK(fg_module_set_seed(m[j], 11));
                int64_t e = kind == 2 ? 6 : 3;
                fg_tensor *x = fg_empty(FG_F32, 3, (int64_t[]){4, 2, e});
                float *px = fg_tensor_data(x);
                for (int64_t i = 0; i < fg_tensor_numel(x); i++) px[i] = (float)sin(0.7 * i);
                y[j] = fg_module_forward(m[j], fg_cast(x, dt));
                CHECK_MSG(y[j] != NULL, "kind %d dt %d: %s", kind, (int)dt, fg_last_error());
                if (y[j]) CHECK_OK(fg_backward(fg_cast(fg_sum(y[j]), FG_F32)));
            }
            if (y[0] && y[1]) {
                CHECK(fg_tensor_dtype(y[1]) == lows[k]);
                double worst = 0;
                for (int64_t i = 0; i < fg_tensor_numel(y[0]); i++)
                    worst = fmax(worst, fabs(fg_tensor_get(y[0], i) - fg_tensor_get(y[1], i)));
                CHECK_MSG(worst < 3e-2, "kind %d %s: largest gap %g", kind, fg_dtype_name(lows[k]),
                          worst);
                fg_tensor *g = fg_module_flat_grads(m[1]);
                double gs = 0;
                for (int64_t i = 0; i < fg_tensor_numel(g); i++) gs += fabs(fg_tensor_get(g, i));
                CHECK(gs > 0 && isfinite(gs));
            }
            fg_step_reset();
            fg_module_free(m[0]);
            fg_module_free(m[1]);
        }
}

/* dropout between layers: a child Dropout (no parameters, PyTorch's names
 * unchanged), identity in evaluation mode, the same masks from the same
 * seed, and none after the last layer (a 1-layer module has no child). */
TEST(rnn_dropout_between_layers) {
    fg_rnn_opts o = {.num_layers = 2, .dropout = 0.5};
    fg_module *a = fg_lstm_new(3, 6, &o, FG_F64), *b = fg_lstm_new(3, 6, &o, FG_F64);
    o.dropout = 0;
    fg_module *plain = fg_lstm_new(3, 6, &o, FG_F64);
    fg_module *m[3] = {a, b, plain};
    for (int i = 0; i < 3; i++) CHECK_OK(fg_module_set_seed(m[i], 5));
    CHECK(fg_module_num_params(a) == 8 && fg_module_num_children(a) == 1);
    CHECK(fg_module_num_children(plain) == 0);
    CHECK(strcmp(fg_module_type(fg_module_child(a, "dropout")), "Dropout") == 0);
    fg_tensor *x = fg_empty(FG_F64, 3, (int64_t[]){5, 2, 3});
    for (int64_t i = 0; i < 30; i++) ((double *)fg_tensor_data(x))[i] = cos(0.3 * (double)i);
    fg_tensor *ya = fg_module_forward(a, x), *yb = fg_module_forward(b, x);
    fg_tensor *yp = fg_module_forward(plain, x);
    CHECK(ya && yb && yp);
    if (!ya || !yb || !yp) return;
    double dab = 0, dap = 0;
    for (int64_t i = 0; i < fg_tensor_numel(ya); i++) {
        dab = fmax(dab, fabs(fg_tensor_get(ya, i) - fg_tensor_get(yb, i)));
        dap = fmax(dap, fabs(fg_tensor_get(ya, i) - fg_tensor_get(yp, i)));
    }
    CHECK(dab == 0); /* same seed, same masks */
    CHECK(dap > 1e-3);
    CHECK_OK(fg_backward(fg_sum(ya)));
    fg_module_train(a, false);
    fg_tensor *ye = fg_module_forward(a, x);
    double dep = 0;
    for (int64_t i = 0; ye && i < fg_tensor_numel(ye); i++)
        dep = fmax(dep, fabs(fg_tensor_get(ye, i) - fg_tensor_get(yp, i)));
    CHECK(ye && dep == 0);
    fg_module *one = fg_gru_new(3, 6, &(fg_rnn_opts){.dropout = 0.3}, FG_F32);
    CHECK(one && fg_module_num_children(one) == 0);
    CHECK(fg_gru_new(3, 6, &(fg_rnn_opts){.dropout = 1.0}, FG_F32) == NULL);
    CHECK_CONTAINS(fg_last_error(), "dropout 1");
    fg_step_reset();
    for (int i = 0; i < 3; i++) fg_module_free(m[i]);
    fg_module_free(one);
    fg_tensor_free(x);
}

/* MHA's dropout on the attention weights: a child Dropout, identity in
 * evaluation mode, and in training some weights are zero and the rest
 * scaled by 1 / (1 - p) (the weights returned after dropout, as PyTorch). */
TEST(mha_dropout_on_attention_weights) {
    fg_module *m = fg_multihead_attention_new(4, 2, &(fg_mha_opts){.dropout = 0.5}, FG_F64);
    fg_module *plain = fg_multihead_attention_new(4, 2, NULL, FG_F64);
    CHECK_OK(fg_module_set_seed(m, 3));
    CHECK_OK(fg_module_set_seed(plain, 3));
    CHECK(fg_module_num_params(m) == 4 && fg_module_num_children(m) == 2);
    fg_tensor *q = fg_empty(FG_F64, 3, (int64_t[]){5, 2, 4});
    for (int64_t i = 0; i < 40; i++) ((double *)fg_tensor_data(q))[i] = sin(0.9 * (double)i);
    fg_tensor *w = NULL, *wp = NULL;
    fg_mha_args ph = {.per_head_weights = true};
    fg_tensor *y = fg_mha_forward(m, q, q, q, &ph, &w);
    fg_tensor *yp = fg_mha_forward(plain, q, q, q, &ph, &wp);
    CHECK(y && yp && w && wp);
    if (!w || !wp) return;
    int zeros = 0, scaled = 0;
    for (int64_t i = 0; i < fg_tensor_numel(w); i++) {
        double a = fg_tensor_get(w, i), b = fg_tensor_get(wp, i);
        if (a == 0) zeros++;
        else if (fabs(a - 2 * b) < 1e-12) scaled++;
    }
    CHECK(zeros > 0 && scaled > 0 && zeros + scaled == fg_tensor_numel(w));
    CHECK_OK(fg_backward(fg_sum(y)));
    fg_module_train(m, false);
    fg_tensor *we = NULL; /* with the weights: the recorded path, as plain's */
    fg_tensor *ye = fg_mha_forward(m, q, q, q, &ph, &we);
    double d = 0;
    for (int64_t i = 0; ye && i < fg_tensor_numel(ye); i++)
        d = fmax(d, fabs(fg_tensor_get(ye, i) - fg_tensor_get(yp, i)));
    CHECK(ye && d == 0);
    CHECK(fg_multihead_attention_new(4, 2, &(fg_mha_opts){.dropout = -0.1}, FG_F32) == NULL);
    CHECK_CONTAINS(fg_last_error(), "dropout -0.1");
    fg_step_reset();
    fg_module_free(m);
    fg_module_free(plain);
    fg_tensor_free(q);
}
