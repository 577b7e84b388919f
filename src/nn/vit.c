/* A vision transformer laid out as torchvision's VisionTransformer
 * (vision_transformer.py), so that its state dict loads into
 * torchvision.models.VisionTransformer(image_size, patch_size, num_layers,
 * num_heads, hidden_dim, mlp_dim, num_classes=...) with strict=True:
 * class_token, conv_proj (the patch embedding, kernel = stride = patch),
 * encoder.pos_embedding, encoder.layers.encoder_layer_{i}.{ln_1,
 * self_attention, ln_2, mlp.0, mlp.3}, encoder.ln, heads.head. Pre-norm
 * blocks (LayerNorm eps 1e-6, exact GELU), the class token's output
 * classified. Initialisation as torchvision's: conv_proj N(0, 1/fan_in)
 * (torchvision truncates it), pos_embedding N(0, 0.02), class token and
 * head zeros, the MLP's Linears xavier_uniform with N(0, 1e-6) biases. */
#include <math.h>
#include <stdio.h>

#include "nn_impl.h"

typedef struct vit_block_ud {
    fg_module *ln_1, *attn, *drop, *ln_2, *mlp;
} vit_block_ud;

static fg_tensor *vit_block_fwd(fg_module *m, fg_tensor *x, void *ud) {
    (void)m;
    vit_block_ud *p = ud;
    fg_tensor *h = fg_module_forward(p->ln_1, x);
    h = h ? fg_mha_forward(p->attn, h, h, h, NULL, NULL) : NULL;
    x = fg_add(x, fg_module_forward(p->drop, h));
    return fg_add(x, fg_module_forward(p->mlp, fg_module_forward(p->ln_2, x)));
}

static fg_module *xavier_linear(int64_t in, int64_t out, fg_dtype dt) {
    fg_module *l = fg_linear_new(in, out, true, dt);
    double a = sqrt(6.0 / (double)(in + out));
    if (l && (fg_module_set_init(l, "weight", &(fg_init){FG_INIT_UNIFORM, -a, a}) ||
              fg_module_set_init(l, "bias", &(fg_init){FG_INIT_NORMAL, 0, 1e-6}))) {
        fg_module_free(l);
        return NULL;
    }
    return l;
}

static fg_module *vit_block_new(const fg_vit_config *c, fg_dtype dt) {
    vit_block_ud *p = fg_calloc(1, sizeof *p);
    fg_module *m = p ? fg_module_new("EncoderBlock", vit_block_fwd, p, fg_free) : NULL;
    if (!m) return NULL;
    fg_module *mlp = fg_sequential_new();
    fg_status st =
        fg_module_add_child(m, "ln_1", p->ln_1 = fg_layer_norm_new(c->hidden_dim, 1e-6, true, dt));
    if (!st)
        st = fg_module_add_child(
            m, "self_attention",
            p->attn = fg_multihead_attention_new(
                c->hidden_dim, c->num_heads,
                &(fg_mha_opts){.batch_first = true, .dropout = c->attention_dropout}, dt));
    if (!st) st = fg_module_add_child(m, "dropout", p->drop = fg_dropout_new(c->dropout));
    if (!st)
        st = fg_module_add_child(m, "ln_2",
                                 p->ln_2 = fg_layer_norm_new(c->hidden_dim, 1e-6, true, dt));
    if (!st) st = fg_sequential_append(mlp, xavier_linear(c->hidden_dim, c->mlp_dim, dt));
    if (!st) st = fg_sequential_append(mlp, fg_gelu_new_approximate("none"));
    if (!st) st = fg_sequential_append(mlp, fg_dropout_new(c->dropout));
    if (!st) st = fg_sequential_append(mlp, xavier_linear(c->mlp_dim, c->hidden_dim, dt));
    if (!st) st = fg_sequential_append(mlp, fg_dropout_new(c->dropout));
    if (!st) st = fg_module_add_child(m, "mlp", p->mlp = mlp);
    else fg_module_free(mlp);
    if (st) {
        fg_module_free(m);
        return NULL;
    }
    return m;
}

typedef struct vit_ud {
    fg_vit_config c;
    fg_tensor *cls, *pos;
    fg_module *conv, *drop, *layers, *ln, *head;
} vit_ud;

static fg_tensor *vit_fwd(fg_module *m, fg_tensor *x, void *ud) {
    (void)m;
    vit_ud *p = ud;
    const fg_vit_config *c = &p->c;
    if (fg_tensor_ndim(x) != 4 || fg_tensor_dim(x, 1) != c->in_channels ||
        fg_tensor_dim(x, 2) != c->image_size || fg_tensor_dim(x, 3) != c->image_size) {
        char s[96];
        fg_error(FG_EINVAL, "VisionTransformer: input %s: expected (N, %lld, %lld, %lld)",
                 fg_tensor_describe(x, s, sizeof s), (long long)c->in_channels,
                 (long long)c->image_size, (long long)c->image_size);
        return NULL;
    }
    int64_t N = fg_tensor_dim(x, 0), D = c->hidden_dim;
    int64_t S = (c->image_size / c->patch_size) * (c->image_size / c->patch_size);
    fg_tensor *h = fg_module_forward(p->conv, x);                             /* (N, D, h, w) */
    h = fg_permute(fg_reshape(h, 3, (int64_t[]){N, D, S}), (int[]){0, 2, 1}); /* (N, S, D) */
    fg_tensor *cls = fg_expand(p->cls, 3, (int64_t[]){N, 1, D});
    fg_tensor *parts[2] = {cls, h};
    h = cls && h ? fg_cat(parts, 2, 1) : NULL;
    h = fg_module_forward(p->drop, fg_add(h, p->pos));
    h = fg_module_forward(p->ln, fg_module_forward(p->layers, h));
    h = fg_reshape(fg_narrow(h, 1, 0, 1), 2, (int64_t[]){N, D});
    return fg_module_forward(p->head, h);
}

fg_module *fg_vit_new(const fg_vit_config *cfg) {
    fg_vit_config c = cfg ? *cfg : (fg_vit_config){0};
    if (!c.image_size) c.image_size = 32;
    if (!c.patch_size) c.patch_size = 4;
    if (!c.in_channels) c.in_channels = 3;
    if (!c.num_layers) c.num_layers = 6;
    if (!c.num_heads) c.num_heads = 4;
    if (!c.hidden_dim) c.hidden_dim = 128;
    if (!c.mlp_dim) c.mlp_dim = 4 * c.hidden_dim;
    if (!c.num_classes) c.num_classes = 10;
    if (c.image_size < 1 || c.patch_size < 1 || c.image_size % c.patch_size || c.in_channels < 1 ||
        c.num_layers < 1 || c.num_heads < 1 || c.hidden_dim % c.num_heads || c.mlp_dim < 1 ||
        c.num_classes < 1 || !(c.dropout >= 0 && c.dropout < 1) ||
        !(c.attention_dropout >= 0 && c.attention_dropout < 1)) {
        fg_error(FG_EINVAL,
                 "vit_new: image_size %lld, patch_size %lld, heads %lld, hidden_dim %lld: expected "
                 "sizes > 0, the image a multiple of the patch, hidden_dim a multiple of heads, "
                 "dropouts in [0, 1)",
                 (long long)c.image_size, (long long)c.patch_size, (long long)c.num_heads,
                 (long long)c.hidden_dim);
        return NULL;
    }
    fg_dtype dt;
    if (fg__model_dtype(c.dtype, "vit_new", &dt) != FG_OK) return NULL;
    c.dtype = dt;
    vit_ud *p = fg_calloc(1, sizeof *p);
    fg_module *m = p ? fg_module_new("VisionTransformer", vit_fwd, p, fg_free) : NULL;
    if (!m) return NULL;
    p->c = c;
    int64_t D = c.hidden_dim, P = c.patch_size;
    int64_t S = (c.image_size / P) * (c.image_size / P) + 1;
    p->cls = fg_module_add_param(m, "class_token", dt, 3, (int64_t[]){1, 1, D}, NULL);
    fg_conv2d_opts po = {.stride = {P, P}};
    p->conv = fg_conv2d_new(c.in_channels, D, (int64_t[]){P, P}, &po, true, dt);
    double fan_in = (double)(c.in_channels * P * P);
    fg_status st = !p->cls ? fg_last_status() : FG_OK;
    if (!st && p->conv)
        st = fg_module_set_init(p->conv, "weight",
                                &(fg_init){FG_INIT_NORMAL, 0, sqrt(1.0 / fan_in)});
    if (!st && p->conv) st = fg_module_set_init(p->conv, "bias", NULL);
    if (!st) st = fg_module_add_child(m, "conv_proj", p->conv);
    else fg_module_free(p->conv);
    fg_module *enc = st ? NULL : fg_module_new("Encoder", NULL, NULL, NULL);
    if (!st && !enc) st = FG_ENOMEM;
    if (!st) {
        p->pos = fg_module_add_param(enc, "pos_embedding", dt, 3, (int64_t[]){1, S, D},
                                     &(fg_init){FG_INIT_NORMAL, 0, 0.02});
        if (!p->pos) st = fg_last_status();
    }
    if (!st) st = fg_module_add_child(enc, "dropout", p->drop = fg_dropout_new(c.dropout));
    if (!st) {
        /* torchvision's Sequential of an OrderedDict: named children */
        p->layers = fg_sequential_new();
        for (int64_t i = 0; i < c.num_layers && !st; i++) {
            char name[40];
            snprintf(name, sizeof name, "encoder_layer_%lld", (long long)i);
            st = fg_module_add_child(p->layers, name, vit_block_new(&c, dt));
        }
        if (!st) st = fg_module_add_child(enc, "layers", p->layers);
        else fg_module_free(p->layers);
    }
    if (!st) st = fg_module_add_child(enc, "ln", p->ln = fg_layer_norm_new(D, 1e-6, true, dt));
    if (!st) st = fg_module_add_child(m, "encoder", enc);
    else fg_module_free(enc);
    fg_module *heads = st ? NULL : fg_sequential_new();
    if (!st) {
        p->head = fg_linear_new(D, c.num_classes, true, dt);
        if (p->head && (fg_module_set_init(p->head, "weight", NULL) ||
                        fg_module_set_init(p->head, "bias", NULL))) {
            fg_module_free(p->head);
            p->head = NULL;
        }
        st = fg_module_add_child(heads, "head", p->head);
        if (!st) st = fg_module_add_child(m, "heads", heads);
        else fg_module_free(heads);
    }
    if (!st && c.seed) st = fg_module_set_seed(m, c.seed);
    if (!st) st = fg_module_finalize(m);
    if (st) {
        fg_module_free(m);
        return NULL;
    }
    return m;
}
