/* The built-in layers: Linear, Embedding, LayerNorm, Dropout, GELU, ReLU and
 * Sequential. Each keeps pointers to its parameter tensors in its user data
 * (the pointers survive finalize, which only moves the data). */
#include <math.h>
#include <stdio.h>

#include "nn_impl.h"

const char fg__kind_dropout[] = "Dropout";
const char fg__kind_gpt[] = "GPT";
const char fg__kind_mlp[] = "MLP";
const char fg__kind_sequential[] = "Sequential";

typedef struct wb {
    fg_tensor *w, *b;
    double eps;
} wb;

static void *new_wb(void) { return fg_calloc(1, sizeof(wb)); }

fg_status fg__model_dtype(fg_dtype dt, const char *what, fg_dtype *out) {
    if (dt == FG_DTYPE_DEFAULT) dt = FG_F32;
    if (dt != FG_F32 && dt != FG_F64 && dt != FG_BF16 && dt != FG_F16)
        return fg_error(fg_dtype_is_float(dt) ? FG_EUNSUPPORTED : FG_EINVAL,
                        "%s: dtype %d (%s): modules are FG_F32 (or 0, the default), FG_F64, "
                        "FG_BF16 or FG_F16",
                        what, (int)dt, fg_dtype_name(dt));
    *out = dt;
    return FG_OK;
}

/* ------------------------------------------------------------ Linear */

static fg_tensor *linear_fwd(fg_module *m, fg_tensor *x, void *ud) {
    (void)m;
    wb *p = ud;
    return fg_linear(x, p->w, p->b);
}

fg_module *fg_linear_new(int64_t in, int64_t out, bool bias, fg_dtype dt) {
    if (in <= 0 || out <= 0) {
        fg_error(FG_EINVAL, "linear_new: in = %lld, out = %lld: expected sizes > 0", (long long)in,
                 (long long)out);
        return NULL;
    }
    if (fg__model_dtype(dt, "linear_new", &dt) != FG_OK) return NULL;
    wb *p = new_wb();
    fg_module *m = p ? fg_module_new("Linear", linear_fwd, p, fg_free) : NULL;
    if (!m) return NULL;
    /* PyTorch: kaiming_uniform_(a=sqrt(5)) gives bound 1/sqrt(fan_in); the
     * bias uses the same bound */
    double bound = 1.0 / sqrt((double)in);
    fg_init u = {FG_INIT_UNIFORM, -bound, bound};
    p->w = fg_module_add_param(m, "weight", dt, 2, (int64_t[]){out, in}, &u);
    if (p->w && bias) p->b = fg_module_add_param(m, "bias", dt, 1, &out, &u);
    if (!p->w || (bias && !p->b)) {
        fg_module_free(m);
        return NULL;
    }
    return m;
}

/* ------------------------------------------------------------ Embedding */

static fg_tensor *embedding_fwd(fg_module *m, fg_tensor *x, void *ud) {
    (void)m;
    return fg_embedding(x, ((wb *)ud)->w);
}

fg_module *fg_embedding_new(int64_t num, int64_t dim, fg_dtype dt) {
    if (num <= 0 || dim <= 0) {
        fg_error(FG_EINVAL, "embedding_new: num = %lld, dim = %lld: expected sizes > 0",
                 (long long)num, (long long)dim);
        return NULL;
    }
    if (fg__model_dtype(dt, "embedding_new", &dt) != FG_OK) return NULL;
    wb *p = new_wb();
    fg_module *m = p ? fg_module_new("Embedding", embedding_fwd, p, fg_free) : NULL;
    if (!m) return NULL;
    p->w = fg_module_add_param(m, "weight", dt, 2, (int64_t[]){num, dim},
                               &(fg_init){FG_INIT_NORMAL, 0, 1});
    if (!p->w) {
        fg_module_free(m);
        return NULL;
    }
    return m;
}

/* ------------------------------------------------------------ LayerNorm */

static fg_tensor *layer_norm_fwd(fg_module *m, fg_tensor *x, void *ud) {
    (void)m;
    wb *p = ud;
    return fg_layer_norm(x, p->w, p->b, p->eps);
}

fg_module *fg_layer_norm_new(int64_t dim, double eps, bool bias, fg_dtype dt) {
    if (dim <= 0) {
        fg_error(FG_EINVAL, "layer_norm_new: dim = %lld: expected > 0", (long long)dim);
        return NULL;
    }
    if (fg__model_dtype(dt, "layer_norm_new", &dt) != FG_OK) return NULL;
    wb *p = new_wb();
    fg_module *m = p ? fg_module_new("LayerNorm", layer_norm_fwd, p, fg_free) : NULL;
    if (!m) return NULL;
    p->eps = eps > 0 ? eps : 1e-5;
    p->w = fg_module_add_param(m, "weight", dt, 1, &dim, &(fg_init){FG_INIT_ONES, 0, 0});
    if (p->w && bias) p->b = fg_module_add_param(m, "bias", dt, 1, &dim, NULL);
    if (!p->w || (bias && !p->b)) {
        fg_module_free(m);
        return NULL;
    }
    return m;
}

/* ------------------------------------------------------------ Dropout */

static fg_tensor *dropout_fwd(fg_module *m, fg_tensor *x, void *ud) {
    fg__dropout_state *d = ud;
    if (!m->training || d->p == 0) return x;
    uint64_t off = fg__rng_take(&d->offset, (uint64_t)fg_tensor_numel(x));
    return fg_dropout(x, d->p, d->seed, off);
}

fg_module *fg_dropout_new(double p) {
    if (!(p >= 0 && p < 1)) {
        fg_error(FG_EINVAL, "dropout_new: p = %g: expected a probability in [0, 1)", p);
        return NULL;
    }
    fg__dropout_state *d = fg_calloc(1, sizeof *d);
    fg_module *m = d ? fg_module_new("Dropout", dropout_fwd, d, fg_free) : NULL;
    if (!m) return NULL;
    d->p = p;
    atomic_init(&d->offset, 0);
    m->kind = fg__kind_dropout;
    return m;
}

fg_status fg_dropout_get_state(const fg_module *m, uint64_t *seed, uint64_t *offset) {
    if (!m || m->kind != fg__kind_dropout)
        return fg_error(FG_EINVAL, "dropout_get_state: module %s is not a Dropout",
                        m ? m->type : "(null)");
    fg__dropout_state *d = m->ud;
    if (seed) *seed = d->seed;
    if (offset) *offset = atomic_load(&d->offset);
    return FG_OK;
}

fg_status fg_dropout_set_state(fg_module *m, uint64_t seed, uint64_t offset) {
    if (!m || m->kind != fg__kind_dropout)
        return fg_error(FG_EINVAL, "dropout_set_state: module %s is not a Dropout",
                        m ? m->type : "(null)");
    fg__dropout_state *d = m->ud;
    d->seed = seed;
    atomic_store(&d->offset, offset);
    return FG_OK;
}

void fg_module_seed_dropout(fg_module *m, uint64_t seed) {
    if (m && fg__module_ready(m) == FG_OK) fg__seed_dropouts(m, seed);
}

/* ------------------------------------------------------------ activations */

static fg_tensor *gelu_fwd(fg_module *m, fg_tensor *x, void *ud) {
    (void)m;
    (void)ud;
    return fg_gelu(x);
}

static fg_tensor *relu_fwd(fg_module *m, fg_tensor *x, void *ud) {
    (void)m;
    (void)ud;
    return fg_relu(x);
}

fg_module *fg_gelu_new(void) { return fg_module_new("GELU", gelu_fwd, NULL, NULL); }
fg_module *fg_relu_new(void) { return fg_module_new("ReLU", relu_fwd, NULL, NULL); }

/* ------------------------------------------------------------ Sequential */

static fg_tensor *sequential_fwd(fg_module *m, fg_tensor *x, void *ud) {
    (void)ud;
    for (int i = 0; i < m->nchild && x; i++) x = fg_module_forward(m->child[i], x);
    return x;
}

fg_module *fg_sequential_new(void) {
    fg_module *m = fg_module_new("Sequential", sequential_fwd, NULL, NULL);
    if (m) m->kind = fg__kind_sequential;
    return m;
}

fg_status fg_sequential_append(fg_module *seq, fg_module *child) {
    if (!seq || seq->kind != fg__kind_sequential) {
        fg_module_free(child);
        return fg_error(FG_EINVAL, "sequential_append: not a Sequential module");
    }
    char name[24];
    snprintf(name, sizeof name, "%d", seq->nchild);
    return fg_module_add_child(seq, name, child);
}
