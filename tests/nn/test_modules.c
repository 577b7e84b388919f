/* The module tree: GPT and MLP parameter names and order (nanoGPT's and
 * nn.Sequential's), the flat parameter and gradient buffers (views, offsets,
 * gradients landing in the flat buffer), the tied head counted once, seeded
 * initialisation (statistics, same seed same weights on f32 and f64),
 * state loading with its errors, user-built trees, Dropout state, the GPT
 * forward's checks and sampling. */
#include <math.h>
#include <string.h>

#include "fixtures.h"
#include "fulgur/nn.h"
#include "harness.h"

static fg_module *tiny_gpt(uint64_t seed, fg_dtype dtype) {
    return fg_gpt_new(&(fg_gpt_config){
        .vocab = 65, .ctx = 16, .layers = 2, .heads = 2, .embd = 32, .seed = seed, .dtype = dtype});
}

static double tensor_std(const fg_tensor *t, double *mean_out) {
    int64_t n = fg_tensor_numel(t);
    double s = 0, ss = 0;
    for (int64_t i = 0; i < n; i++) {
        double v = fg_tensor_get(t, i);
        s += v;
        ss += v * v;
    }
    double mean = s / (double)n;
    if (mean_out) *mean_out = mean;
    return sqrt(ss / (double)n - mean * mean);
}

static fg_tensor *tokens(int64_t B, int64_t T, int64_t V, uint64_t seed) {
    int32_t buf[4096];
    fg_rng r = {seed, 0};
    for (int64_t i = 0; i < B * T; i++) buf[i] = (int32_t)fg_rng_below(&r, (uint64_t)V);
    return fg_from_data(FG_I32, 2, (int64_t[]){B, T}, buf);
}

TEST(gpt_names_and_order) {
    fg_module *m = tiny_gpt(1, 0);
    CHECK(m != NULL);
    if (!m) return;
    const char *want[] = {"transformer.wte.weight", "transformer.wpe.weight"};
    const char *blk[] = {"ln_1.weight",      "ln_1.bias",          "attn.c_attn.weight",
                         "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
                         "ln_2.weight",      "ln_2.bias",          "mlp.c_fc.weight",
                         "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
    int64_t blk_shape[12][2] = {{32, 0}, {32, 0}, {96, 32},  {96, 0},  {32, 32},  {32, 0},
                                {32, 0}, {32, 0}, {128, 32}, {128, 0}, {32, 128}, {32, 0}};
    CHECK(fg_module_num_params(m) == 2 + 2 * 12 + 2);
    for (int i = 0; i < 2; i++) CHECK(!strcmp(fg_module_param_name(m, i), want[i]));
    CHECK(fg_tensor_dim(fg_module_param(m, 0), 0) == 65);
    CHECK(fg_tensor_dim(fg_module_param(m, 1), 0) == 16);
    int64_t numel = 65 * 32 + 16 * 32;
    for (int l = 0; l < 2; l++)
        for (int k = 0; k < 12; k++) {
            char name[128];
            snprintf(name, sizeof name, "transformer.h.%d.%s", l, blk[k]);
            int64_t i = 2 + 12 * l + k;
            const char *got = fg_module_param_name(m, i);
            CHECK_MSG(got && !strcmp(got, name), "param %lld: %s, want %s", (long long)i, got,
                      name);
            fg_tensor *t = fg_module_param(m, i);
            int nd = blk_shape[k][1] ? 2 : 1;
            CHECK(fg_tensor_ndim(t) == nd);
            CHECK(fg_tensor_dim(t, 0) == blk_shape[k][0]);
            if (nd == 2) CHECK(fg_tensor_dim(t, 1) == blk_shape[k][1]);
            numel += fg_tensor_numel(t);
        }
    CHECK(!strcmp(fg_module_param_name(m, 26), "transformer.ln_f.weight"));
    CHECK(!strcmp(fg_module_param_name(m, 27), "transformer.ln_f.bias"));
    numel += 64;
    CHECK(fg_module_numel(m) == numel);
    /* the tied head: one parameter, reachable under both names */
    CHECK(fg_module_find_param(m, "lm_head.weight") == 0);
    CHECK(fg_module_find_param(m, "transformer.wte.weight") == 0);
    CHECK(fg_module_find_param(m, "transformer.h.1.mlp.c_fc.bias") == 2 + 12 + 9);
    CHECK(fg_module_find_param(m, "nope") == -1);
    /* a sub-module sees its own range under relative names */
    fg_module *b1 = fg_module_child(m, "transformer.h.1");
    CHECK(b1 && fg_module_num_params(b1) == 12);
    CHECK(b1 && !strcmp(fg_module_param_name(b1, 2), "attn.c_attn.weight"));
    CHECK(b1 && fg_module_param(b1, 0) == fg_module_param(m, 14));
    CHECK(b1 && fg_module_param_offset(b1, 0) == 0);
    CHECK(b1 &&
          fg_tensor_data(fg_module_flat_params(b1)) == fg_tensor_data(fg_module_param(m, 14)));
    CHECK(b1 && fg_module_find_param(b1, "mlp.c_proj.bias") == 11);
    CHECK(
        !strcmp(fg_module_type(fg_module_child(m, "transformer.h.0.attn")), "CausalSelfAttention"));
    /* no bias: nanoGPT's bias=False drops every Linear and LayerNorm bias */
    fg_module *nb = fg_gpt_new(&(fg_gpt_config){
        .vocab = 65, .ctx = 16, .layers = 2, .heads = 2, .embd = 32, .no_bias = true});
    CHECK(nb && fg_module_num_params(nb) == 2 + 2 * 6 + 1);
    CHECK(nb && !strcmp(fg_module_param_name(nb, 3), "transformer.h.0.attn.c_attn.weight"));
    fg_module_free(nb);
    fg_module_free(m);
}

TEST(mlp_names_and_forward) {
    fg_module *m = fg_mlp_new(&(fg_mlp_config){.sizes = {784, 1024, 1024, 10}, .seed = 3});
    CHECK(m != NULL);
    if (!m) return;
    const char *want[] = {"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"};
    int64_t rows[] = {1024, 1024, 1024, 1024, 10, 10};
    CHECK(fg_module_num_params(m) == 6);
    for (int i = 0; i < 6; i++) {
        CHECK(!strcmp(fg_module_param_name(m, i), want[i]));
        CHECK(fg_tensor_dim(fg_module_param(m, i), 0) == rows[i]);
    }
    CHECK(fg_module_numel(m) == 784 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 10 + 10);
    CHECK(!strcmp(fg_module_type(fg_module_child(m, "1")), "ReLU"));
    /* (B, 1, 28, 28) is flattened as nn.Flatten would */
    fg_tensor *x = fg_full(FG_F32, 4, (int64_t[]){3, 1, 28, 28}, 0.5);
    fg_tensor *y = fg_module_forward(m, x);
    CHECK(y && fg_tensor_ndim(y) == 2 && fg_tensor_dim(y, 0) == 3 && fg_tensor_dim(y, 1) == 10);
    fg_tensor *bad = fg_full(FG_F32, 2, (int64_t[]){3, 100}, 0.5);
    CHECK(fg_module_forward(m, bad) == NULL);
    CHECK_CONTAINS(fg_last_error(), "expected (B, 784)");
    fg_step_reset();
    /* nlayers given explicitly, GELU, no bias */
    fg_module *g = fg_mlp_new(&(fg_mlp_config){
        .sizes = {4, 8, 3, 99}, .nlayers = 2, .activation = FG_ACT_GELU, .no_bias = true});
    CHECK(g && fg_module_num_params(g) == 2);
    CHECK(g && !strcmp(fg_module_param_name(g, 1), "2.weight"));
    CHECK(g && !strcmp(fg_module_type(fg_module_child(g, "1")), "GELU"));
    fg_module_free(g);
    CHECK(fg_mlp_new(&(fg_mlp_config){.sizes = {4}}) == NULL);
    CHECK_CONTAINS(fg_last_error(), "nlayers");
    /* bf16 and f16 are the true-half precisions' module dtypes */
    fg_module *dbf = fg_mlp_new(&(fg_mlp_config){.sizes = {4, 8}, .dtype = FG_BF16});
    CHECK(dbf && fg_module_dtype(dbf) == FG_BF16);
    fg_module_free(dbf);
    CHECK(fg_mlp_new(&(fg_mlp_config){.sizes = {4, 8}, .dtype = FG_I32}) == NULL);
    CHECK(fg_last_status() == FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "i32");
    CHECK(fg_mlp_new(&(fg_mlp_config){.sizes = {4, 8}, .dtype = (fg_dtype)77}) == NULL);
    CHECK(fg_last_status() == FG_EINVAL);
    /* 0 is the default, f32; FG_F64 is taken as given */
    fg_module *d32 = fg_mlp_new(&(fg_mlp_config){.sizes = {4, 8}});
    fg_module *d64 = fg_mlp_new(&(fg_mlp_config){.sizes = {4, 8}, .dtype = FG_F64});
    CHECK(d32 && fg_module_dtype(d32) == FG_F32);
    CHECK(d64 && fg_module_dtype(d64) == FG_F64);
    fg_module_free(d32);
    fg_module_free(d64);
    fg_module *lin = fg_linear_new(3, 2, true, FG_DTYPE_DEFAULT);
    CHECK(lin && fg_module_dtype(lin) == FG_F32);
    fg_module_free(lin);
    fg_module *ln16 = fg_layer_norm_new(3, 0, true, FG_F16);
    CHECK(ln16 && fg_module_dtype(ln16) == FG_F16);
    fg_module_free(ln16);
    CHECK(fg_layer_norm_new(3, 0, true, FG_U8) == NULL && fg_last_status() == FG_EINVAL);
    fg_module_free(m);
}

TEST(flat_buffers) {
    fg_module *m = tiny_gpt(2, 0);
    if (!m) {
        CHECK(0);
        return;
    }
    fg_tensor *fp = fg_module_flat_params(m), *fgr = fg_module_flat_grads(m);
    CHECK(fg_tensor_ndim(fp) == 1 && fg_tensor_numel(fp) == fg_module_numel(m));
    CHECK(fg_tensor_numel(fgr) == fg_module_numel(m));
    float *base = fg_tensor_data(fp), *gbase = fg_tensor_data(fgr);
    int64_t expect = 0;
    for (int64_t i = 0; i < fg_module_num_params(m); i++) {
        fg_tensor *p = fg_module_param(m, i);
        CHECK(fg_module_param_offset(m, i) == expect);
        CHECK(fg_tensor_data(p) == base + expect);
        CHECK(fg_tensor_data(fg_tensor_grad(p)) == gbase + expect);
        CHECK(fg_tensor_requires_grad(p));
        CHECK(!strcmp(fg_tensor_name(p), fg_module_param_name(m, i)));
        expect += fg_tensor_numel(p);
    }
    CHECK(expect == fg_module_numel(m));
    /* writing the flat buffer writes the parameters */
    int64_t off = fg_module_param_offset(m, 5);
    base[off + 3] = 1.25f;
    CHECK(fg_tensor_get(fg_module_param(m, 5), 3) == 1.25);
    /* a backward lands in the flat gradient buffer */
    fg_tensor *idx = tokens(2, 8, 60, 7); /* ids < 60: rows 60..64 of wte only see the head */
    fg_tensor *loss = fg_cross_entropy(fg_module_forward(m, idx), tokens(2, 8, 65, 8), -100);
    CHECK_OK(fg_backward(loss));
    double nz = 0;
    for (int64_t i = 0; i < fg_module_numel(m); i++) nz += gbase[i] != 0;
    CHECK(nz > 0.9 * (double)fg_module_numel(m));
    for (int64_t i = 0; i < fg_module_num_params(m); i++) {
        fg_tensor *g = fg_tensor_grad(fg_module_param(m, i));
        double s = 0;
        for (int64_t k = 0; k < fg_tensor_numel(g); k++) s += fabs(fg_tensor_get(g, k));
        CHECK_MSG(s > 0, "gradient of %s is zero", fg_module_param_name(m, i));
    }
    /* the tied head: token 62 never appears in idx, yet its wte row has a
     * gradient, from the output projection */
    double head_only = 0;
    for (int c = 0; c < 32; c++) head_only += fabs(gbase[62 * 32 + c]);
    CHECK(head_only > 0);
    fg_module_zero_grad(m);
    double left = 0;
    for (int64_t i = 0; i < fg_module_numel(m); i++) left += fabs(gbase[i]);
    CHECK(left == 0);
    fg_step_reset();
    fg_module_free(m);
}

TEST(init_statistics) {
    int L = 4;
    fg_module *m = fg_gpt_new(&(fg_gpt_config){
        .vocab = 1000, .ctx = 64, .layers = L, .heads = 4, .embd = 128, .seed = 5});
    if (!m) {
        CHECK(0);
        return;
    }
    double mean;
    for (int64_t i = 0; i < fg_module_num_params(m); i++) {
        const char *n = fg_module_param_name(m, i);
        fg_tensor *t = fg_module_param(m, i);
        double sd = tensor_std(t, &mean);
        size_t ln = strlen(n);
        bool is_bias = ln > 5 && !strcmp(n + ln - 5, ".bias");
        if (strstr(n, "ln_")) {
            double want = is_bias ? 0 : 1;
            CHECK_MSG(sd == 0 && mean == want, "%s: mean %g std %g", n, mean, sd);
        } else if (is_bias) {
            CHECK_MSG(sd == 0 && mean == 0, "%s: mean %g std %g", n, mean, sd);
        } else {
            double want = strstr(n, "c_proj.weight") ? 0.02 / sqrt(2.0 * L) : 0.02;
            double tol = 4 * want / sqrt((double)fg_tensor_numel(t)) + 0.01 * want;
            CHECK_MSG(fabs(sd - want) < tol, "%s: std %g, want %g", n, sd, want);
            CHECK_MSG(fabs(mean) < 5 * want / sqrt((double)fg_tensor_numel(t)), "%s: mean %g", n,
                      mean);
        }
    }
    /* the stream: parameter i draws from fg_rng_derive(seed, i), element k
     * from draws 2k, 2k+1 (fg_rng_normal) */
    for (int64_t k = 0; k < 3000; k += 7) {
        fg_rng r = {fg_rng_derive(5, 1), 2 * (uint64_t)k};
        CHECK(fg_tensor_get(fg_module_param(m, 1), k) == (double)(float)(0.02 * fg_rng_normal(&r)));
    }
    fg_module_free(m);
    /* Linear: PyTorch's U(-1/sqrt(in), 1/sqrt(in)) for weight and bias */
    fg_module *lin = fg_linear_new(400, 300, true, FG_F32);
    CHECK_OK(fg_module_set_seed(lin, 9));
    fg_tensor *w = fg_module_param(lin, 0), *b = fg_module_param(lin, 1);
    double bound = 1.0 / 20.0, mx = 0;
    for (int64_t i = 0; i < fg_tensor_numel(w); i++) mx = fmax(mx, fabs(fg_tensor_get(w, i)));
    CHECK(mx <= bound && mx > 0.99 * bound);
    CHECK_CLOSE(tensor_std(w, &mean), bound / sqrt(3.0), 0.01, 0);
    CHECK(fabs(mean) < 1e-3);
    for (int64_t i = 0; i < 300; i++) CHECK(fabs(fg_tensor_get(b, i)) <= bound);
    CHECK(tensor_std(b, NULL) > 0.5 * bound / sqrt(3.0));
    CHECK_STATUS(fg_module_set_seed(lin, 9), FG_ESTATE); /* already finalized on use */
    fg_module_free(lin);
    /* Embedding N(0, 1), LayerNorm 1 and 0 */
    fg_module *e = fg_embedding_new(500, 64, FG_F64);
    CHECK_CLOSE(tensor_std(fg_module_param(e, 0), &mean), 1.0, 0.03, 0);
    fg_module_free(e);
}

TEST(same_seed_same_weights) {
    fg_module *a = tiny_gpt(42, 0), *b = tiny_gpt(42, 0), *c = tiny_gpt(43, 0);
    fg_module *d = tiny_gpt(42, FG_F64);
    if (!a || !b || !c || !d) {
        CHECK(0);
        return;
    }
    size_t bytes = sizeof(float) * (size_t)fg_module_numel(a);
    CHECK(!memcmp(fg_tensor_data(fg_module_flat_params(a)),
                  fg_tensor_data(fg_module_flat_params(b)), bytes));
    /* a different seed changes every random tensor */
    for (int64_t i = 0; i < fg_module_num_params(a); i++) {
        fg_tensor *pa = fg_module_param(a, i), *pc = fg_module_param(c, i);
        if (tensor_std(pa, NULL) == 0) continue; /* constant init */
        CHECK_MSG(memcmp(fg_tensor_data(pa), fg_tensor_data(pc), fg_tensor_nbytes(pa)),
                  "%s unchanged by the seed", fg_module_param_name(a, i));
    }
    /* f64 draws the same numbers */
    CHECK(fg_module_dtype(d) == FG_F64);
    double md = 0;
    for (int64_t i = 0; i < fg_module_numel(a); i++)
        md = fmax(md, fabs(fg_tensor_get(fg_module_flat_params(a), i) -
                           fg_tensor_get(fg_module_flat_params(d), i)));
    CHECK(md < 1e-8);
    /* reset_parameters with the same seed restores, on a sub-module too */
    float *pa = fg_tensor_data(fg_module_flat_params(a));
    float keep = pa[100];
    pa[100] = 7;
    CHECK_OK(fg_module_reset_parameters(a, 42));
    CHECK(pa[100] == keep);
    fg_module *blk = fg_module_child(c, "transformer.h.1");
    CHECK_OK(fg_module_reset_parameters(blk, 42));
    fg_tensor *x = fg_module_param(blk, 2),
              *y = fg_module_param(fg_module_child(a, "transformer.h.1"), 2);
    CHECK(!memcmp(fg_tensor_data(x), fg_tensor_data(y), fg_tensor_nbytes(x)));
    fg_module_free(a);
    fg_module_free(b);
    fg_module_free(c);
    fg_module_free(d);
}

/* The state of `m` as load entries (borrowing its tensors). */
static int64_t state_of(fg_module *m, fg_state_entry *e, int64_t cap) {
    int64_t n = fg_module_state_count(m);
    for (int64_t i = 0; i < n && i < cap; i++) {
        fg_tensor *t = fg_module_state_tensor(m, i);
        e[i] = (fg_state_entry){fg_module_state_name(m, i), fg_tensor_dtype(t), fg_tensor_ndim(t),
                                fg_tensor_shape(t), fg_tensor_data(t)};
    }
    return n;
}

TEST(load_state) {
    fg_module *a = tiny_gpt(1, 0), *b = tiny_gpt(2, 0);
    if (!a || !b) {
        CHECK(0);
        return;
    }
    fg_state_entry e[64];
    int64_t n = state_of(a, e, 64);
    CHECK(n == 28);
    size_t bytes = sizeof(float) * (size_t)fg_module_numel(a);
    void *pa = fg_tensor_data(fg_module_flat_params(a)),
         *pb = fg_tensor_data(fg_module_flat_params(b));
    /* errors first: nothing may change */
    float *snap = malloc(bytes);
    memcpy(snap, pb, bytes);
    fg_state_entry bad[64];
    memcpy(bad, e, sizeof e);
    bad[3] = bad[27]; /* ln_1.bias missing, ln_f.bias twice */
    CHECK_STATUS(fg_module_load_state(b, bad, n, true), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "twice");
    memcpy(bad, e, sizeof e);
    bad[4].name = "transformer.h.0.attn.c_attn.wieght"; /* missing + unexpected */
    int64_t wrong[2] = {64, 32};
    bad[1].shape = wrong; /* wpe (16, 32) */
    fg_status s = fg_module_load_state(b, bad, n, true);
    CHECK(s == FG_EMISMATCH);
    const char *msg = fg_last_error();
    CHECK_CONTAINS(msg, "transformer.wpe.weight: given [64, 32], model [16, 32]");
    CHECK_CONTAINS(msg, "1 missing (transformer.h.0.attn.c_attn.weight)");
    CHECK_CONTAINS(msg, "1 unexpected (transformer.h.0.attn.c_attn.wieght)");
    CHECK(!memcmp(pb, snap, bytes));
    /* not strict: missing and unexpected pass, a shape mismatch still fails */
    CHECK_STATUS(fg_module_load_state(b, bad, n, false), FG_EMISMATCH);
    bad[1].shape = e[1].shape;
    CHECK_OK(fg_module_load_state(b, bad, n, false));
    CHECK(memcmp(pb, pa, bytes)); /* c_attn.weight of block 0 was not loaded */
    /* everything, in f64, through the alias name of the tied weight */
    double *d64 = malloc(bytes * 2);
    for (int64_t i = 0; i < fg_module_numel(a); i++) d64[i] = ((float *)pa)[i];
    memcpy(bad, e, sizeof e);
    int64_t offs = 0;
    for (int64_t i = 0; i < n; i++) {
        bad[i].dtype = FG_F64;
        bad[i].data = d64 + offs;
        offs += fg_tensor_numel(fg_module_state_tensor(a, i));
    }
    bad[0].name = "lm_head.weight";
    CHECK_OK(fg_module_load_state(b, bad, n, true));
    CHECK(!memcmp(pb, pa, bytes));
    /* into a sub-module, with names relative to it */
    fg_module *blk = fg_module_child(b, "transformer.h.0");
    float ones[96 * 32];
    for (int i = 0; i < 96 * 32; i++) ones[i] = 1;
    fg_state_entry one = {"attn.c_attn.weight", FG_F32, 2, (int64_t[]){96, 32}, ones};
    CHECK_OK(fg_module_load_state(blk, &one, 1, false));
    CHECK(fg_tensor_get(fg_module_param(b, 4), 17) == 1);
    CHECK_STATUS(fg_module_load_state(blk, &one, 1, true), FG_EMISMATCH);
    CHECK_CONTAINS(fg_last_error(), "11 missing (ln_1.weight, ln_1.bias, attn.c_attn.bias");
    free(snap);
    free(d64);
    fg_module_free(a);
    fg_module_free(b);
}

/* A user module: y = x * scale + shift, with a child Linear. */
static fg_tensor *affine_fwd(fg_module *m, fg_tensor *x, void *ud) {
    (void)ud;
    fg_tensor *y = fg_module_forward(fg_module_child(m, "proj"), x);
    return fg_add(fg_mul(y, fg_module_own_param(m, "scale")), fg_module_own_param(m, "shift"));
}

static int freed;
static void count_free(void *p) {
    freed++;
    fg_free(p);
}

TEST(user_modules) {
    fg_module *m = fg_module_new("Affine", affine_fwd, fg_alloc(16), count_free);
    fg_tensor *scale =
        fg_module_add_param(m, "scale", FG_F64, 1, (int64_t[]){3}, &(fg_init){FG_INIT_CONST, 2, 0});
    fg_tensor *shift =
        fg_module_add_param(m, "shift", FG_F64, 1, (int64_t[]){3}, &(fg_init){FG_INIT_KEEP, 0, 0});
    double *sh = fg_tensor_data(shift);
    sh[0] = 1, sh[1] = 2, sh[2] = 3; /* kept through finalize */
    CHECK_OK(fg_module_add_child(m, "proj", fg_linear_new(2, 3, false, FG_F64)));
    CHECK(fg_module_add_param(m, "proj", FG_F64, 1, (int64_t[]){1}, NULL) == NULL);
    CHECK_CONTAINS(fg_last_error(), "already has");
    CHECK(fg_module_add_param(m, "a.b", FG_F64, 1, (int64_t[]){1}, NULL) == NULL);
    CHECK(fg_module_add_param(m, "i", FG_I32, 1, (int64_t[]){1}, NULL) == NULL);
    CHECK_STATUS(fg_module_add_child(m, "proj", fg_relu_new()), FG_EINVAL);
    CHECK_STATUS(fg_module_add_child(m, "x", NULL), FG_EINVAL);
    fg_tensor *mixed =
        fg_module_add_param(fg_module_child(m, "proj"), "extra", FG_F32, 1, (int64_t[]){2}, NULL);
    CHECK(mixed != NULL);
    CHECK_STATUS(fg_module_finalize(m), FG_EINVAL); /* f32 among f64 */
    CHECK_CONTAINS(fg_last_error(), "one dtype");
    CHECK(!fg_module_is_finalized(m));
    m = (fg_module_free(m), fg_module_new("Affine", affine_fwd, NULL, NULL));
    CHECK(freed == 1);
    scale =
        fg_module_add_param(m, "scale", FG_F64, 1, (int64_t[]){3}, &(fg_init){FG_INIT_CONST, 2, 0});
    shift =
        fg_module_add_param(m, "shift", FG_F64, 1, (int64_t[]){3}, &(fg_init){FG_INIT_KEEP, 0, 0});
    sh = fg_tensor_data(shift);
    sh[0] = 1, sh[1] = 2, sh[2] = 3;
    CHECK_OK(fg_module_add_child(m, "proj", fg_linear_new(2, 3, false, FG_F64)));
    fg_module *proj = fg_module_child(m, "proj");
    CHECK_STATUS(fg_module_set_seed(proj, 1), FG_EINVAL); /* not a root */
    CHECK_OK(fg_module_set_seed(m, 11));
    /* the first forward finalizes: order scale, shift, proj.weight */
    fg_tensor *x = fg_full(FG_F64, 2, (int64_t[]){4, 2}, 1.0);
    fg_tensor *y = fg_module_forward(m, x);
    CHECK(y && fg_tensor_dim(y, 1) == 3);
    CHECK(fg_module_is_finalized(m) && fg_module_is_finalized(proj));
    CHECK(fg_module_num_params(m) == 3);
    CHECK(!strcmp(fg_module_param_name(m, 2), "proj.weight"));
    CHECK(fg_module_param(m, 0) == scale && fg_tensor_get(scale, 1) == 2);
    CHECK(fg_tensor_get(shift, 2) == 3);
    fg_tensor *w = fg_module_own_param(proj, "weight");
    double want = 2 * (fg_tensor_get(w, 2) + fg_tensor_get(w, 3)) + 2; /* row 1 */
    CHECK_CLOSE(fg_tensor_get(y, 1), want, 1e-12, 0);
    CHECK_STATUS(fg_module_add_child(m, "late", fg_relu_new()), FG_ESTATE);
    CHECK(fg_module_add_param(m, "late", FG_F64, 1, (int64_t[]){1}, NULL) == NULL);
    /* a container has no forward */
    fg_module *box = fg_module_new("ModuleDict", NULL, NULL, NULL);
    CHECK(fg_module_forward(box, x) == NULL);
    CHECK_CONTAINS(fg_last_error(), "container");
    fg_module_free(box);
    /* errors name the module they happened in */
    fg_tensor *bad = fg_full(FG_F64, 2, (int64_t[]){4, 5}, 1.0);
    CHECK(fg_module_forward(m, bad) == NULL);
    CHECK_CONTAINS(fg_last_error(), "in module proj (Linear)");
    CHECK(fg_module_forward(m, NULL) == NULL);
    /* Sequential */
    fg_module *seq = fg_sequential_new();
    CHECK_OK(fg_sequential_append(seq, fg_linear_new(2, 4, true, FG_F64)));
    CHECK_OK(fg_sequential_append(seq, fg_relu_new()));
    CHECK_OK(fg_sequential_append(seq, fg_linear_new(4, 1, true, FG_F64)));
    CHECK(fg_module_num_params(seq) == 4 && !strcmp(fg_module_param_name(seq, 2), "2.weight"));
    fg_tensor *z = fg_module_forward(seq, x);
    CHECK(z && fg_tensor_dim(z, 1) == 1);
    fg_step_reset();
    fg_module_free(seq);
    fg_module_free(m);
}

TEST(dropout_state) {
    fg_module *a = fg_mlp_new(&(fg_mlp_config){.sizes = {8, 64, 2}, .dropout = 0.5, .seed = 4});
    fg_module *b = fg_mlp_new(&(fg_mlp_config){.sizes = {8, 64, 2}, .dropout = 0.5, .seed = 4});
    if (!a || !b) {
        CHECK(0);
        return;
    }
    fg_module *drop = fg_module_child(a, "2");
    CHECK(!strcmp(fg_module_type(drop), "Dropout"));
    fg_tensor *x = fg_full(FG_F32, 2, (int64_t[]){5, 8}, 1.0);
    fg_tensor *y1 = fg_module_forward(a, x), *y2 = fg_module_forward(b, x);
    CHECK(y1 && y2 && !memcmp(fg_tensor_data(y1), fg_tensor_data(y2), fg_tensor_nbytes(y1)));
    uint64_t seed, off;
    CHECK_OK(fg_dropout_get_state(drop, &seed, &off));
    CHECK(off == 5 * 64);
    fg_tensor *y3 = fg_module_forward(a, x); /* a new mask */
    CHECK(y3 && memcmp(fg_tensor_data(y1), fg_tensor_data(y3), fg_tensor_nbytes(y1)));
    CHECK_OK(fg_dropout_set_state(drop, seed, 0)); /* replay */
    fg_tensor *y4 = fg_module_forward(a, x);
    CHECK(y4 && !memcmp(fg_tensor_data(y1), fg_tensor_data(y4), fg_tensor_nbytes(y1)));
    /* half the hidden units dropped: the hidden layer seen through a hook
     * would be nicer; the output differs from evaluation mode */
    fg_module_train(a, false);
    CHECK(!fg_module_is_training(drop));
    fg_tensor *e1 = fg_module_forward(a, x), *e2 = fg_module_forward(a, x);
    CHECK(e1 && e2 && !memcmp(fg_tensor_data(e1), fg_tensor_data(e2), fg_tensor_nbytes(e1)));
    CHECK(memcmp(fg_tensor_data(e1), fg_tensor_data(y1), fg_tensor_nbytes(e1)));
    fg_module_seed_dropout(b, 99);
    uint64_t s2;
    CHECK_OK(fg_dropout_get_state(fg_module_child(b, "2"), &s2, &off));
    CHECK(s2 != seed && off == 0);
    CHECK_STATUS(fg_dropout_get_state(a, &seed, &off), FG_EINVAL);
    CHECK(fg_dropout_new(1.0) == NULL);
    fg_step_reset();
    fg_module_free(a);
    fg_module_free(b);
}

TEST(gpt_forward_checks) {
    fg_module *m = tiny_gpt(1, 0);
    if (!m) {
        CHECK(0);
        return;
    }
    fg_tensor *y = fg_module_forward(m, tokens(2, 16, 65, 1));
    CHECK(y && fg_tensor_ndim(y) == 3 && fg_tensor_dim(y, 0) == 2 && fg_tensor_dim(y, 1) == 16 &&
          fg_tensor_dim(y, 2) == 65);
    CHECK(fg_module_forward(m, tokens(2, 17, 65, 1)) == NULL);
    CHECK_CONTAINS(fg_last_error(), "T = 17");
    CHECK(fg_module_forward(m, fg_zeros(FG_F32, 2, (int64_t[]){2, 4})) == NULL);
    CHECK_CONTAINS(fg_last_error(), "i32 (B, T)");
    int32_t badid[2] = {3, 65};
    CHECK(fg_module_forward(m, fg_from_data(FG_I32, 2, (int64_t[]){1, 2}, badid)) == NULL);
    CHECK_CONTAINS(fg_last_error(), "65");
    CHECK(fg_gpt_new(&(fg_gpt_config){
              .vocab = 65, .ctx = 16, .layers = 2, .heads = 3, .embd = 32}) == NULL);
    CHECK_CONTAINS(fg_last_error(), "multiple of heads");
    CHECK(fg_gpt_new(&(fg_gpt_config){
              .vocab = 65, .ctx = 16, .layers = 2, .heads = 2, .embd = 32, .dropout = 1.5}) ==
          NULL);
    CHECK(fg_gpt_get_config(m)->embd == 32 && fg_gpt_get_config(m)->dtype == FG_F32);
    /* causal: logits at position t do not depend on later tokens */
    int32_t s1[8] = {1, 2, 3, 4, 5, 6, 7, 8}, s2[8] = {1, 2, 3, 4, 9, 9, 9, 9};
    fg_tensor *l1 = fg_module_forward(m, fg_from_data(FG_I32, 2, (int64_t[]){1, 8}, s1));
    fg_tensor *l2 = fg_module_forward(m, fg_from_data(FG_I32, 2, (int64_t[]){1, 8}, s2));
    CHECK(l1 && l2 && !memcmp(fg_tensor_data(l1), fg_tensor_data(l2), 4 * 65 * sizeof(float)));
    CHECK(l1 && l2 && memcmp(fg_tensor_data(l1), fg_tensor_data(l2), 8 * 65 * sizeof(float)));
    fg_step_reset();
    fg_module_free(m);
}

TEST(gpt_sampling) {
    fg_module *m = tiny_gpt(3, 0);
    if (!m) {
        CHECK(0);
        return;
    }
    int32_t prompt[3] = {5, 6, 7}, a[40], b[40], c[40], g[40];
    fg_sample_opts o = {.temperature = 0.8, .top_k = 10, .seed = 1};
    CHECK_OK(fg_gpt_generate(m, prompt, 3, 37, &o, a)); /* past ctx = 16: a sliding window */
    CHECK_OK(fg_gpt_generate(m, prompt, 3, 37, &o, b));
    CHECK(!memcmp(a, b, sizeof a));
    CHECK(a[0] == 5 && a[2] == 7);
    for (int i = 0; i < 40; i++) CHECK(a[i] >= 0 && a[i] < 65);
    o.seed = 2;
    CHECK_OK(fg_gpt_generate(m, prompt, 3, 37, &o, c));
    CHECK(memcmp(a, c, sizeof a));
    /* greedy = the argmax of the forward's last logits */
    CHECK_OK(fg_gpt_generate(m, prompt, 3, 1, &(fg_sample_opts){.greedy = true}, g));
    fg_tensor *l = fg_module_forward(m, fg_from_data(FG_I32, 2, (int64_t[]){1, 3}, prompt));
    int best = 0;
    for (int v = 1; v < 65; v++)
        if (fg_tensor_get(l, 2 * 65 + v) > fg_tensor_get(l, 2 * 65 + best)) best = v;
    CHECK(g[3] == best);
    /* top_k = 1 is greedy too */
    CHECK_OK(fg_gpt_generate(m, prompt, 3, 1, &(fg_sample_opts){.top_k = 1, .seed = 5}, c));
    CHECK(c[3] == best);
    /* the step arena of the caller is untouched */
    CHECK(fg_tensor_dim(l, 2) == 65);
    int32_t badp[1] = {70};
    CHECK_STATUS(fg_gpt_generate(m, badp, 1, 3, NULL, c), FG_EINVAL);
    CHECK_STATUS(fg_gpt_generate(m, prompt, 0, 3, NULL, c), FG_EINVAL);
    /* sample_next on a batch */
    int32_t two[2];
    CHECK_OK(
        fg_gpt_sample_next(m, tokens(2, 20, 65, 3), &(fg_sample_opts){.greedy = true}, 0, two));
    CHECK(two[0] >= 0 && two[0] < 65 && two[1] >= 0 && two[1] < 65);
    fg_step_reset();
    fg_module_free(m);
}

/* ------------------------------------------------------ allocation failures */

/* An allocator failing every allocation after the first `limit`, counting
 * live blocks: each failure path must free what it took. */
TEST(allocation_failures) {
    /* fg_gpt_new (construction and finalize) failing at every allocation */
    int failures = 0;
    bool built = false;
    for (long limit = 0; limit < 20000 && !built; limit++) {
        fx_alloc_begin(limit);
        fg_clear_error();
        fg_module *m = tiny_gpt(1, 0);
        if (m) {
            built = true;
            CHECK(fg_module_num_params(m) == 28);
            fg_module_free(m);
        } else {
            failures++;
            if (!fg_last_error()[0]) CHECK_MSG(0, "limit %ld: NULL without a message", limit);
        }
        fx_alloc_end();
        CHECK_MSG(fx_alloc_live() == 0, "limit %ld: %ld blocks leaked", limit,
                  (long)fx_alloc_live());
    }
    CHECK(built && failures > 50);
    /* a user tree whose finalize fails is unchanged and finalizes later */
    for (long limit = 0; limit < 200; limit++) {
        fx_alloc_begin(LONG_MAX);
        fg_module *m = fg_sequential_new();
        CHECK_OK(fg_sequential_append(m, fg_linear_new(3, 4, true, FG_F64)));
        CHECK_OK(fg_sequential_append(m, fg_relu_new()));
        CHECK_OK(fg_sequential_append(m, fg_linear_new(4, 2, true, FG_F64)));
        fg_module *head = fg_module_new("Head", NULL, NULL, NULL);
        CHECK_OK(
            fg_module_add_tied(head, "w", fg_module_own_param(fg_module_child(m, "0"), "weight")));
        CHECK_OK(fg_sequential_append(m, head));
        fx_alloc_limit(fx_alloc_count() + limit);
        fg_status s = fg_module_finalize(m);
        fx_alloc_limit(LONG_MAX);
        if (s != FG_OK) CHECK(!fg_module_is_finalized(m));
        CHECK_OK(fg_module_finalize(m));
        CHECK(fg_module_num_params(m) == 4 && fg_module_find_param(m, "3.w") == 0);
        fg_module_free(m);
        fx_alloc_end();
        CHECK_MSG(fx_alloc_live() == 0, "finalize limit %ld: %ld blocks leaked", limit,
                  (long)fx_alloc_live());
        if (s == FG_OK) break;
    }
}

TEST(gpt_dropout_modes) {
    /* Dropout has no parameters: the same seed gives the same weights with
     * or without it, so in evaluation mode the logits are equal */
    fg_module *d = fg_gpt_new(&(fg_gpt_config){
        .vocab = 65, .ctx = 16, .layers = 2, .heads = 2, .embd = 32, .dropout = 0.2, .seed = 6});
    fg_module *n = tiny_gpt(6, 0);
    if (!d || !n) {
        CHECK(0);
        return;
    }
    fg_tensor *idx = tokens(2, 8, 65, 4);
    fg_tensor *ln = fg_module_forward(n, idx);
    fg_tensor *l1 = fg_module_forward(d, idx), *l2 = fg_module_forward(d, idx);
    CHECK(ln && l1 && l2 && memcmp(fg_tensor_data(l1), fg_tensor_data(ln), fg_tensor_nbytes(ln)));
    CHECK(l1 && l2 && memcmp(fg_tensor_data(l1), fg_tensor_data(l2), fg_tensor_nbytes(l1)));
    /* a backward through the dropped paths reaches every parameter */
    CHECK_OK(fg_backward(fg_cross_entropy(l2, tokens(2, 8, 65, 5), -100)));
    for (int64_t i = 0; i < fg_module_num_params(d); i++) {
        fg_tensor *g = fg_tensor_grad(fg_module_param(d, i));
        double s = 0;
        for (int64_t k = 0; k < fg_tensor_numel(g); k++) s += fabs(fg_tensor_get(g, k));
        CHECK_MSG(s > 0, "no gradient for %s", fg_module_param_name(d, i));
    }
    fg_module_train(d, false);
    fg_tensor *le = fg_module_forward(d, idx);
    CHECK(le && !memcmp(fg_tensor_data(le), fg_tensor_data(ln), fg_tensor_nbytes(ln)));
    /* no-grad mode records nothing */
    bool prev = fg_set_grad_enabled(false);
    int64_t tape = fg_tape_size();
    fg_module_forward(d, idx);
    CHECK(fg_tape_size() == tape);
    fg_set_grad_enabled(prev);
    fg_step_reset();
    fg_module_free(d);
    fg_module_free(n);
}

/* ------------------------------------------------------------- ownership */

/* fg_module_add_child and fg_sequential_append consume the child, also when
 * they fail; fg_module_new consumes ud (with free_ud). Every path below is
 * run under the counting allocator (and ASan's leak check): each consumed
 * object is freed exactly once, and nothing else is left. */
static int ud_frees;
static void ud_free(void *p) {
    ud_frees++;
    fg_free(p);
}

static long live_blocks_after(void (*fn)(void)) {
    fx_alloc_begin(LONG_MAX);
    fn();
    return fx_alloc_end();
}

/* Each failing add leaves the child freed: the Linear's ud counts it. */
static void failing_adds(void) {
    fg_module *m = fg_module_new("M", NULL, NULL, NULL);
    fg_module *ok = fg_relu_new();
    CHECK_OK(fg_module_add_child(m, "a", ok));
    int before = ud_frees;
    CHECK_STATUS(fg_module_add_child(m, "a.b", fg_module_new("C", NULL, fg_alloc(8), ud_free)),
                 FG_EINVAL); /* a dotted name */
    CHECK_STATUS(fg_module_add_child(m, "a", fg_module_new("C", NULL, fg_alloc(8), ud_free)),
                 FG_EINVAL); /* a duplicate name */
    CHECK_STATUS(fg_module_add_child(NULL, "x", fg_module_new("C", NULL, fg_alloc(8), ud_free)),
                 FG_EINVAL); /* no parent */
    fg_module *done = fg_module_new("C", NULL, fg_alloc(8), ud_free);
    CHECK_OK(fg_module_finalize(done));
    CHECK_STATUS(fg_module_add_child(m, "done", done), FG_ESTATE); /* finalized */
    CHECK_STATUS(fg_sequential_append(m, fg_module_new("C", NULL, fg_alloc(8), ud_free)),
                 FG_EINVAL); /* m is not a Sequential */
    CHECK_STATUS(fg_sequential_append(NULL, fg_module_new("C", NULL, fg_alloc(8), ud_free)),
                 FG_EINVAL);
    CHECK(ud_frees == before + 6);
    /* not the caller's to give, so left alone: a child of another module,
     * and m's own root */
    CHECK_STATUS(fg_module_add_child(m, "again", ok), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "already belongs");
    CHECK_STATUS(fg_module_add_child(fg_module_child(m, "a"), "up", m), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "own root");
    CHECK(fg_module_num_children(m) == 1 && fg_module_child(m, "a") == ok);
    CHECK(ud_frees == before + 6);
    fg_module_free(m);
}

/* A NULL child (a failed constructor) keeps that constructor's status. */
static void null_child_keeps_the_cause(void) {
    fg_module *m = fg_sequential_new();
    fx_alloc_limit(fx_alloc_count()); /* the next allocation fails */
    fg_module *c = fg_linear_new(2, 3, true, FG_F32);
    fx_alloc_limit(LONG_MAX);
    CHECK(c == NULL && fg_last_status() == FG_ENOMEM);
    fg_status s = fg_sequential_append(m, c);
    CHECK(s != FG_OK);
    CHECK_CONTAINS(fg_last_error(), "out of memory");
    fg_module_free(m);
}

TEST(consumed_children_are_freed_on_every_failure) {
    ud_frees = 0;
    long live = live_blocks_after(failing_adds);
    CHECK_MSG(live == 0, "%ld blocks leaked", live);
    live = live_blocks_after(null_child_keeps_the_cause);
    CHECK_MSG(live == 0, "%ld blocks leaked", live);
    /* fg_module_new's ud, and add_child's own allocations, failing one by one */
    int fails = 0;
    for (long limit = 0; limit < 1000; limit++) {
        fx_alloc_begin(LONG_MAX);
        int before = ud_frees;
        fg_module *m = fg_module_new("M", NULL, NULL, NULL);
        void *ud = fg_alloc(8);
        fx_alloc_limit(fx_alloc_count() + limit);
        fg_module *c = fg_module_new("C", NULL, ud, ud_free);
        fg_status s = fg_module_add_child(m, "c", c);
        fx_alloc_limit(LONG_MAX);
        if (s != FG_OK) {
            CHECK(ud_frees == before + 1); /* freed by whichever call failed */
            CHECK(fg_last_status() == FG_ENOMEM);
            CHECK(fg_module_num_children(m) == 0);
            fails++;
        } else {
            CHECK(ud_frees == before && fg_module_child(m, "c") == c);
        }
        fg_module_free(m);
        fx_alloc_end();
        CHECK_MSG(fx_alloc_live() == 0, "limit %ld: %ld blocks leaked", limit,
                  (long)fx_alloc_live());
        if (s == FG_OK) {
            CHECK(ud_frees == before + 1); /* by fg_module_free */
            break;
        }
    }
    CHECK(fails >= 3); /* fg_module_new's two allocations and the name copy at least */
}
