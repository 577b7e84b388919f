/* GPT-2 as nanoGPT's model.py builds it, module for module, so that names,
 * order and shapes of parameters are PyTorch's:
 *
 *   transformer.wte, transformer.wpe, transformer.drop,
 *   transformer.h.{i}.{ln_1, attn.{c_attn, c_proj, resid_dropout}, ln_2,
 *                      mlp.{c_fc, gelu, c_proj, dropout}},
 *   transformer.ln_f, lm_head (weight tied to transformer.wte.weight).
 *
 * Forward: x = drop(wte[idx] + wpe[0..T)); per block x += attn(ln_1(x)),
 * x += mlp(ln_2(x)); logits = ln_f(x) @ wte^T. Sampling helpers at the end. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "nn_impl.h"

typedef struct attn {
    fg_module *c_attn, *c_proj, *drop;
    int heads;
} attn;

typedef struct gmlp {
    fg_module *c_fc, *gelu, *c_proj, *drop;
} gmlp;

typedef struct block {
    fg_module *ln_1, *attn, *ln_2, *mlp;
} block;

typedef struct gpt {
    fg_gpt_config c;
    fg_module *wte, *wpe, *drop, *ln_f, *lm_head;
    fg_module **blocks;
    fg_tensor *wte_w;
} gpt;

static void gpt_free(void *ud) {
    gpt *g = ud;
    if (g) fg_free(g->blocks);
    fg_free(g);
}

/* ------------------------------------------------------------ forward */

static fg_tensor *attn_fwd(fg_module *m, fg_tensor *x, void *ud) { /* (B, T, C) */
    (void)m;
    attn *a = ud;
    fg_tensor *qkv = fg_module_forward(a->c_attn, x);               /* (B, T, 3C) */
    fg_tensor *y = qkv ? fg_causal_attention(qkv, a->heads) : NULL; /* (B, T, C) */
    y = y ? fg_module_forward(a->c_proj, y) : NULL;
    return y ? fg_module_forward(a->drop, y) : NULL;
}

static fg_tensor *gmlp_fwd(fg_module *m, fg_tensor *x, void *ud) {
    (void)m;
    gmlp *p = ud;
    fg_tensor *h = fg_module_forward(p->c_fc, x); /* (B, T, 4C) */
    h = h ? fg_module_forward(p->gelu, h) : NULL;
    h = h ? fg_module_forward(p->c_proj, h) : NULL; /* (B, T, C) */
    return h ? fg_module_forward(p->drop, h) : NULL;
}

static fg_tensor *block_fwd(fg_module *m, fg_tensor *x, void *ud) {
    (void)m;
    block *b = ud;
    fg_tensor *h = fg_module_forward(b->ln_1, x);
    h = h ? fg_module_forward(b->attn, h) : NULL;
    x = h ? fg_add(x, h) : NULL;
    h = x ? fg_module_forward(b->ln_2, x) : NULL;
    h = h ? fg_module_forward(b->mlp, h) : NULL;
    return h ? fg_add(x, h) : NULL;
}

static FG_MUST_USE fg_status check_idx(const gpt *g, const fg_tensor *idx) {
    char d[96];
    if (fg_tensor_dtype(idx) != FG_I32 || fg_tensor_ndim(idx) != 2)
        return fg_error(FG_EINVAL, "GPT: idx %s: expected token ids i32 (B, T)",
                        fg_tensor_describe(idx, d, sizeof d));
    int64_t T = fg_tensor_dim(idx, 1);
    if (T < 1 || T > g->c.ctx)
        return fg_error(FG_EINVAL, "GPT: sequence length T = %lld: expected 1..ctx = %lld",
                        (long long)T, (long long)g->c.ctx);
    return FG_OK;
}

/* Everything up to ln_f: (B, T) -> (B, T, C). */
static fg_tensor *gpt_trunk(gpt *g, fg_tensor *idx) {
    if (check_idx(g, idx)) return NULL;
    int64_t T = fg_tensor_dim(idx, 1);
    /* 0..T-1 made on the host and copied in: the step tensors may be on a device */
    int32_t *pp = fg_alloc((size_t)T * sizeof *pp);
    if (!pp) return NULL;
    for (int64_t t = 0; t < T; t++) pp[t] = (int32_t)t;
    fg_tensor *pos = fg_from_data(FG_I32, 1, &T, pp);
    fg_free(pp);
    if (!pos) return NULL;
    fg_tensor *tok = fg_module_forward(g->wte, idx);             /* (B, T, C) */
    fg_tensor *pe = tok ? fg_module_forward(g->wpe, pos) : NULL; /* (T, C) */
    fg_tensor *x = pe ? fg_add(tok, pe) : NULL;
    x = x ? fg_module_forward(g->drop, x) : NULL;
    for (int l = 0; l < g->c.layers && x; l++) x = fg_module_forward(g->blocks[l], x);
    return x ? fg_module_forward(g->ln_f, x) : NULL;
}

static fg_tensor *gpt_fwd(fg_module *m, fg_tensor *idx, void *ud) {
    (void)m;
    gpt *g = ud;
    fg_tensor *x = gpt_trunk(g, idx);
    return x ? fg_module_forward(g->lm_head, x) : NULL; /* (B, T, V) */
}

static fg_tensor *head_fwd(fg_module *m, fg_tensor *x, void *ud) { /* (B, T, C) -> (B, T, V) */
    (void)m;
    return fg_linear(x, ud, NULL);
}

/* ------------------------------------------------------------ construction */

static FG_MUST_USE fg_status add(fg_module *parent, const char *name, fg_module *child,
                                 fg_module **out) {
    *out = child;
    return fg_module_add_child(parent, name, child);
}

static fg_module *container(const char *type) { return fg_module_new(type, NULL, NULL, NULL); }

/* nanoGPT's _init_weights for a Linear: N(0, std) weight, zero bias */
static FG_MUST_USE fg_status gpt_linear_init(fg_module *lin, double std, bool bias) {
    FG_TRY(fg_module_set_init(lin, "weight", &(fg_init){FG_INIT_NORMAL, 0, std}));
    return bias ? fg_module_set_init(lin, "bias", NULL) : FG_OK;
}

/* attn: c_attn, c_proj, resid_dropout; a whole module or NULL */
static fg_module *new_attn(const fg_gpt_config *c, fg_dtype dt) {
    bool bias = !c->no_bias;
    int64_t C = c->embd;
    double sp = 0.02 / sqrt(2.0 * c->layers); /* the scaled init of c_proj */
    attn *a = fg_calloc(1, sizeof *a);
    fg_module *m = a ? fg_module_new("CausalSelfAttention", attn_fwd, a, fg_free) : NULL;
    if (!m) return NULL;
    a->heads = c->heads;
    if (add(m, "c_attn", fg_linear_new(C, 3 * C, bias, dt), &a->c_attn) ||
        add(m, "c_proj", fg_linear_new(C, C, bias, dt), &a->c_proj) ||
        add(m, "resid_dropout", fg_dropout_new(c->dropout), &a->drop) ||
        gpt_linear_init(a->c_attn, 0.02, bias) || gpt_linear_init(a->c_proj, sp, bias)) {
        fg_module_free(m);
        return NULL;
    }
    return m;
}

/* mlp: c_fc, gelu, c_proj, dropout */
static fg_module *new_mlp(const fg_gpt_config *c, fg_dtype dt) {
    bool bias = !c->no_bias;
    int64_t C = c->embd;
    double sp = 0.02 / sqrt(2.0 * c->layers);
    gmlp *p = fg_calloc(1, sizeof *p);
    fg_module *m = p ? fg_module_new("MLP", gmlp_fwd, p, fg_free) : NULL;
    if (!m) return NULL;
    if (add(m, "c_fc", fg_linear_new(C, 4 * C, bias, dt), &p->c_fc) ||
        add(m, "gelu", fg_gelu_new(), &p->gelu) ||
        add(m, "c_proj", fg_linear_new(4 * C, C, bias, dt), &p->c_proj) ||
        add(m, "dropout", fg_dropout_new(c->dropout), &p->drop) ||
        gpt_linear_init(p->c_fc, 0.02, bias) || gpt_linear_init(p->c_proj, sp, bias)) {
        fg_module_free(m);
        return NULL;
    }
    return m;
}

/* h.{l}: ln_1, attn, ln_2, mlp (the sub-modules are built whole first, so
 * that every failure frees exactly what it made) */
static FG_MUST_USE fg_status build_block(gpt *g, fg_module *h, int l, fg_dtype dt,
                                         fg_module **out) {
    const fg_gpt_config *c = &g->c;
    bool bias = !c->no_bias;
    char name[24];
    snprintf(name, sizeof name, "%d", l);
    block *b = fg_calloc(1, sizeof *b);
    fg_module *bm = b ? fg_module_new("Block", block_fwd, b, fg_free) : NULL;
    FG_TRY(add(h, name, bm, out));
    fg_module *am = new_attn(c, dt), *mm = am ? new_mlp(c, dt) : NULL;
    fg_status s = FG_ENOMEM;
    if (!mm || (s = add(bm, "ln_1", fg_layer_norm_new(c->embd, 1e-5, bias, dt), &b->ln_1))) {
        fg_module_free(am);
        fg_module_free(mm);
        return s;
    }
    s = add(bm, "attn", am, &b->attn); /* consumes am */
    if (s || (s = add(bm, "ln_2", fg_layer_norm_new(c->embd, 1e-5, bias, dt), &b->ln_2))) {
        fg_module_free(mm);
        return s;
    }
    return add(bm, "mlp", mm, &b->mlp);
}

static FG_MUST_USE fg_status check_config(const fg_gpt_config *c) {
    if (c->vocab <= 0 || c->ctx <= 0 || c->layers <= 0 || c->heads <= 0 || c->embd <= 0)
        return fg_error(FG_EINVAL,
                        "gpt_new: vocab = %lld, ctx = %lld, layers = %d, heads = %d, "
                        "embd = %lld: every size must be > 0",
                        (long long)c->vocab, (long long)c->ctx, c->layers, c->heads,
                        (long long)c->embd);
    if (c->embd % c->heads)
        return fg_error(FG_EINVAL, "gpt_new: embd = %lld is not a multiple of heads = %d",
                        (long long)c->embd, c->heads);
    if (c->vocab > INT32_MAX)
        return fg_error(FG_EINVAL, "gpt_new: vocab = %lld: token ids are i32", (long long)c->vocab);
    if (!(c->dropout >= 0 && c->dropout < 1))
        return fg_error(FG_EINVAL, "gpt_new: dropout = %g: expected [0, 1)", c->dropout);
    return FG_OK;
}

fg_module *fg_gpt_new(const fg_gpt_config *c) {
    if (!c) {
        fg_error(FG_EINVAL, "gpt_new: NULL config");
        return NULL;
    }
    fg_dtype dt;
    if (check_config(c) || fg__model_dtype(c->dtype, "gpt_new", &dt)) return NULL;
    gpt *g = fg_calloc(1, sizeof *g);
    if (g) g->blocks = fg_calloc((size_t)c->layers, sizeof *g->blocks);
    if (g && !g->blocks) {
        fg_free(g);
        g = NULL;
    }
    fg_module *m = g ? fg_module_new("GPT", gpt_fwd, g, gpt_free) : NULL;
    if (!m) return NULL;
    m->kind = fg__kind_gpt;
    g->c = *c;
    g->c.dtype = dt;
    int64_t C = c->embd;
    fg_module *tr, *h;
    fg_init w02 = {FG_INIT_NORMAL, 0, 0.02};
    if (add(m, "transformer", container("ModuleDict"), &tr) ||
        add(tr, "wte", fg_embedding_new(c->vocab, C, dt), &g->wte) ||
        add(tr, "wpe", fg_embedding_new(c->ctx, C, dt), &g->wpe) ||
        add(tr, "drop", fg_dropout_new(c->dropout), &g->drop) ||
        add(tr, "h", container("ModuleList"), &h))
        goto fail;
    if (fg_module_set_init(g->wte, "weight", &w02) || fg_module_set_init(g->wpe, "weight", &w02))
        goto fail;
    for (int l = 0; l < c->layers; l++)
        if (build_block(g, h, l, dt, &g->blocks[l])) goto fail;
    if (add(tr, "ln_f", fg_layer_norm_new(C, 1e-5, !c->no_bias, dt), &g->ln_f)) goto fail;
    /* lm_head: a bias-free Linear whose weight is wte's */
    g->wte_w = fg_module_own_param(g->wte, "weight");
    fg_module *head = fg_module_new("Linear", head_fwd, g->wte_w, NULL);
    if (add(m, "lm_head", head, &g->lm_head) || fg_module_add_tied(head, "weight", g->wte_w))
        goto fail;
    if (fg_module_set_seed(m, c->seed) || fg_module_finalize(m)) goto fail;
    return m;
fail:
    /* keep the cause's status (FG_ENOMEM stays FG_ENOMEM) */
    fg_error_wrap(fg_last_status() ? fg_last_status() : FG_EINVAL, "gpt_new");
    fg_module_free(m);
    return NULL;
}

const fg_gpt_config *fg_gpt_get_config(const fg_module *m) {
    return m && m->kind == fg__kind_gpt ? &((gpt *)m->ud)->c : NULL;
}

/* ------------------------------------------------------------ sampling */

/* A double in [0, 1) from two draws of (seed, 2k), (seed, 2k + 1). */
static double draw_unit(uint64_t seed, uint64_t k) {
    uint32_t a = fg_rng_u32_at(seed, 2 * k), b = fg_rng_u32_at(seed, 2 * k + 1);
    return ((double)(a >> 5) * 67108864.0 + (double)(b >> 6)) / 9007199254740992.0;
}

static int cmp_desc(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? 1 : a > b ? -1 : 0;
}

/* Picks a token from one row of logits (V) in double. */
static FG_MUST_USE fg_status pick(const fg_tensor *row, int64_t V, const fg_sample_opts *o,
                                  double u, int32_t *out) {
    double *l = fg_step_alloc(sizeof(double) * (size_t)V * 2);
    if (!l) return FG_ENOMEM;
    double mx = -INFINITY;
    int64_t arg = 0;
    for (int64_t v = 0; v < V; v++) {
        l[v] = fg_tensor_get(row, v);
        if (l[v] > mx) mx = l[v], arg = v;
    }
    if (!isfinite(mx)) return fg_error(FG_EINVAL, "sample: the logits are not finite (%g)", mx);
    if (o->greedy) {
        *out = (int32_t)arg;
        return FG_OK;
    }
    double temp = o->temperature > 0 ? o->temperature : 1.0;
    double cut = -INFINITY; /* keep logits >= the k-th largest */
    if (o->top_k > 0 && o->top_k < V) {
        double *srt = l + V;
        memcpy(srt, l, sizeof(double) * (size_t)V);
        qsort(srt, (size_t)V, sizeof *srt, cmp_desc);
        cut = srt[o->top_k - 1];
    }
    double total = 0;
    for (int64_t v = 0; v < V; v++) {
        l[v] = l[v] >= cut ? exp((l[v] - mx) / temp) : 0;
        total += l[v];
    }
    double target = u * total, acc = 0;
    int64_t last = arg;
    for (int64_t v = 0; v < V; v++) {
        if (l[v] == 0) continue;
        acc += l[v];
        last = v;
        if (acc > target) break;
    }
    *out = (int32_t)last;
    return FG_OK;
}

fg_status fg_gpt_sample_next(fg_module *m, fg_tensor *idx, const fg_sample_opts *o, uint64_t draw,
                             int32_t *out) {
    static const fg_sample_opts defaults = {0};
    if (!m || m->kind != fg__kind_gpt)
        return fg_error(FG_EINVAL, "gpt_sample_next: module %s is not a GPT",
                        m ? m->type : "(null)");
    if (!idx || !out) return fg_error_wrap(FG_EINVAL, "gpt_sample_next: NULL idx or out");
    if (!o) o = &defaults;
    if (o->temperature < 0 || o->top_k < 0)
        return fg_error(FG_EINVAL,
                        "gpt_sample_next: temperature = %g, top_k = %lld: expected "
                        ">= 0",
                        o->temperature, (long long)o->top_k);
    gpt *g = m->ud;
    if (fg_tensor_dtype(idx) != FG_I32 || fg_tensor_ndim(idx) != 2 || fg_tensor_dim(idx, 1) < 1)
        return check_idx(g, idx) ? FG_EINVAL
                                 : fg_error(FG_EINVAL, "gpt_sample_next: empty sequence");
    int64_t B = fg_tensor_dim(idx, 0), T = fg_tensor_dim(idx, 1), V = g->c.vocab;
    if (T > g->c.ctx) idx = fg_tensor_narrow_view(idx, 1, T - g->c.ctx, g->c.ctx);
    fg_tensor *w = idx ? fg_tensor_contiguous(idx) : NULL;
    if (!w) return fg_error_wrap(FG_ENOMEM, "gpt_sample_next");
    T = fg_tensor_dim(w, 1);
    bool prev = fg_set_grad_enabled(false);
    fg_tensor *x = fg__module_ready(m) ? NULL : gpt_trunk(g, w);     /* (B, T, C) */
    x = x ? fg_tensor_narrow_view(x, 1, T - 1, 1) : NULL;            /* (B, 1, C) */
    fg_tensor *logits = x ? fg_module_forward(g->lm_head, x) : NULL; /* (B, 1, V) */
    fg_set_grad_enabled(prev);
    if (!logits)
        return fg_error_wrap(fg_last_status() ? fg_last_status() : FG_EINVAL, "gpt_sample_next");
    for (int64_t b = 0; b < B; b++) {
        fg_tensor *row = fg_tensor_narrow_view(logits, 0, b, 1);
        if (!row) return FG_ENOMEM;
        fg_dev *dev = fg_tensor_dev(row);
        if (dev && !fg_dev_host_accessible(dev)) { /* the row's logits copied out once */
            fg_tensor *host = fg_tensor_to(row, NULL);
            if (!host) return fg_error_wrap(fg_last_status(), "gpt_sample_next");
            fg_status s =
                pick(host, V, o, draw_unit(o->seed, draw * (uint64_t)B + (uint64_t)b), &out[b]);
            fg_tensor_free(host);
            FG_TRY(s);
            continue;
        }
        FG_TRY(pick(row, V, o, draw_unit(o->seed, draw * (uint64_t)B + (uint64_t)b), &out[b]));
    }
    return FG_OK;
}

typedef struct gen_job {
    fg_module *m;
    int64_t n_prompt, n_new;
    const fg_sample_opts *o;
    int32_t *out;
    int threads;
    fg_status st;
    char msg[1024];
} gen_job;

static void *gen_main(void *arg) {
    gen_job *j = arg;
    fg_set_grad_enabled(false);
    /* a model on a device: this thread's step tensors there, each prompt copied in */
    if (j->m->flat && j->m->flat->dev && fg_step_device_set(j->m->flat->dev) != FG_OK) {
        j->st = fg_last_status();
        snprintf(j->msg, sizeof j->msg, "%s", fg_last_error());
        return NULL;
    }
#ifdef _OPENMP
    omp_set_num_threads(j->threads);
#endif
    int64_t ctx = ((gpt *)j->m->ud)->c.ctx;
    for (int64_t k = 0; k < j->n_new; k++) {
        int64_t len = j->n_prompt + k, start = len > ctx ? len - ctx : 0;
        fg_tensor *idx = fg_from_data(FG_I32, 2, (int64_t[]){1, len - start}, j->out + start);
        j->st = idx ? fg_gpt_sample_next(j->m, idx, j->o, (uint64_t)len, &j->out[len]) : FG_ENOMEM;
        fg_step_reset();
        if (j->st != FG_OK) {
            snprintf(j->msg, sizeof j->msg, "%s", fg_last_error());
            break;
        }
    }
    fg_step_thread_release();
    return NULL;
}

fg_status fg_gpt_generate(fg_module *m, const int32_t *prompt, int64_t n_prompt, int64_t n_new,
                          const fg_sample_opts *o, int32_t *out) {
    if (!m || m->kind != fg__kind_gpt)
        return fg_error(FG_EINVAL, "gpt_generate: module %s is not a GPT", m ? m->type : "(null)");
    if (!prompt || !out || n_prompt < 1 || n_new < 0)
        return fg_error(FG_EINVAL,
                        "gpt_generate: n_prompt = %lld, n_new = %lld: expected a "
                        "prompt of at least one token, n_new >= 0 and an output",
                        (long long)n_prompt, (long long)n_new);
    int64_t V = ((gpt *)m->ud)->c.vocab;
    for (int64_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return fg_error(FG_EINVAL,
                            "gpt_generate: prompt[%lld] = %d: expected an id in "
                            "[0, %lld)",
                            (long long)i, prompt[i], (long long)V);
    FG_TRY(fg__module_ready(m));
    memmove(out, prompt, sizeof *out * (size_t)n_prompt);
    if (n_new == 0) return FG_OK;
    gen_job j = {.m = m,
                 .n_prompt = n_prompt,
                 .n_new = n_new,
                 .o = o,
                 .out = out,
                 .threads = fg_get_num_threads()};
    pthread_t th;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, (size_t)8 << 20);
    int rc = pthread_create(&th, &at, gen_main, &j);
    pthread_attr_destroy(&at);
    if (rc) return fg_error(FG_ENOMEM, "gpt_generate: cannot start a thread (error %d)", rc);
    pthread_join(th, NULL);
    if (j.st != FG_OK) return fg_error(j.st, "gpt_generate: %s", j.msg);
    return FG_OK;
}
