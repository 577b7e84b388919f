/* The MLP model: an nn.Sequential of Linear, activation (and dropout)
 * layers, with nn.Flatten's reshape of (B, d1, d2, ...) inputs in front.
 * Children are named "0", "1", ... as in PyTorch, so parameters are
 * "0.weight", "0.bias", "2.weight", ... */
#include <stdio.h>
#include <string.h>

#include "nn_impl.h"

typedef struct mlp {
    int64_t in;
} mlp;

static fg_tensor *mlp_fwd(fg_module *m, fg_tensor *x, void *ud) {
    mlp *p = ud;
    int nd = fg_tensor_ndim(x);
    if (nd >= 2 && fg_tensor_dim(x, -1) != p->in) {
        int64_t rest = fg_tensor_numel(x) / (fg_tensor_dim(x, 0) ? fg_tensor_dim(x, 0) : 1);
        if (rest != p->in) {
            char b[96];
            fg_error(FG_EINVAL,
                     "MLP: input %s: expected (B, %lld) or (B, ...) with %lld "
                     "elements per sample",
                     fg_tensor_describe(x, b, sizeof b), (long long)p->in, (long long)p->in);
            return NULL;
        }
        x = fg_reshape(x, 2, (int64_t[]){fg_tensor_dim(x, 0), p->in});
    }
    for (int i = 0; i < m->nchild && x; i++) x = fg_module_forward(m->child[i], x);
    return x;
}

fg_module *fg_mlp_new(const fg_mlp_config *c) {
    if (!c) {
        fg_error(FG_EINVAL, "mlp_new: NULL config");
        return NULL;
    }
    int n = c->nlayers;
    if (n == 0) { /* the sizes given, up to the first zero */
        int k = 0;
        while (k <= FG_MLP_MAX_LAYERS && c->sizes[k] > 0) k++;
        n = k - 1;
    }
    if (n < 1 || n > FG_MLP_MAX_LAYERS) {
        fg_error(FG_EINVAL,
                 "mlp_new: nlayers = %d: expected 1..%d Linear layers (sizes has "
                 "nlayers + 1 entries)",
                 c->nlayers ? c->nlayers : n, FG_MLP_MAX_LAYERS);
        return NULL;
    }
    for (int i = 0; i <= n; i++)
        if (c->sizes[i] <= 0) {
            fg_error(FG_EINVAL, "mlp_new: sizes[%d] = %lld: expected > 0", i,
                     (long long)c->sizes[i]);
            return NULL;
        }
    if (c->activation != FG_ACT_RELU && c->activation != FG_ACT_GELU) {
        fg_error(FG_EINVAL, "mlp_new: activation %d: expected FG_ACT_RELU or FG_ACT_GELU",
                 (int)c->activation);
        return NULL;
    }
    if (!(c->dropout >= 0 && c->dropout < 1)) {
        fg_error(FG_EINVAL, "mlp_new: dropout = %g: expected [0, 1)", c->dropout);
        return NULL;
    }
    fg_dtype dt;
    if (fg__model_dtype(c->dtype, "mlp_new", &dt)) return NULL;
    mlp *p = fg_calloc(1, sizeof *p);
    fg_module *m = p ? fg_module_new("MLP", mlp_fwd, p, fg_free) : NULL;
    if (!m) return NULL;
    p->in = c->sizes[0];
    m->kind = fg__kind_mlp;
    int k = 0;
    char name[16];
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "%d", k++);
        if (fg_module_add_child(m, name,
                                fg_linear_new(c->sizes[i], c->sizes[i + 1], !c->no_bias, dt)))
            goto fail;
        if (i == n - 1) break;
        snprintf(name, sizeof name, "%d", k++);
        if (fg_module_add_child(m, name,
                                c->activation == FG_ACT_GELU ? fg_gelu_new() : fg_relu_new()))
            goto fail;
        if (c->dropout > 0) {
            snprintf(name, sizeof name, "%d", k++);
            if (fg_module_add_child(m, name, fg_dropout_new(c->dropout))) goto fail;
        }
    }
    if (fg_module_set_seed(m, c->seed) || fg_module_finalize(m)) goto fail;
    return m;
fail:
    /* keep the cause's status (FG_ENOMEM stays FG_ENOMEM) */
    fg_error_wrap(fg_last_status() ? fg_last_status() : FG_EINVAL, "mlp_new");
    fg_module_free(m);
    return NULL;
}
