/* A network from its text: "Name(key=value, ...); Name(); ..." with
 * torch.nn's class names and keyword arguments, checked against the table
 * below (unknown names get the nearest valid one), and built as a
 * Sequential of the library's modules. Unflatten is built here (a reshape
 * of the batch's trailing dimensions), the rest are nn.h's. */
#include "fit_net.h"

#include "cli_flags.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum arg_kind { A_INT, A_REAL, A_BOOL, A_INTS } arg_kind;

typedef struct arg_info {
    const char *name;
    arg_kind kind;
    bool required;
    double def;
} arg_info;

#define MAX_ARGS 10
typedef struct layer_info {
    const char *name;
    arg_info args[MAX_ARGS];
} layer_info;

static const layer_info k_layers[] = {
    {"Linear",
     {{"in_features", A_INT, true, 0},
      {"out_features", A_INT, true, 0},
      {"bias", A_BOOL, false, 1}}},
    {"Conv2d",
     {{"in_channels", A_INT, true, 0},
      {"out_channels", A_INT, true, 0},
      {"kernel_size", A_INTS, true, 0},
      {"stride", A_INTS, false, 1},
      {"padding", A_INTS, false, 0},
      {"dilation", A_INTS, false, 1},
      {"groups", A_INT, false, 1},
      {"bias", A_BOOL, false, 1}}},
    {"BatchNorm2d",
     {{"num_features", A_INT, true, 0},
      {"eps", A_REAL, false, 1e-5},
      {"momentum", A_REAL, false, 0.1}}},
    {"BatchNorm1d",
     {{"num_features", A_INT, true, 0},
      {"eps", A_REAL, false, 1e-5},
      {"momentum", A_REAL, false, 0.1}}},
    {"MaxPool2d",
     {{"kernel_size", A_INTS, true, 0},
      {"stride", A_INTS, false, 0},
      {"padding", A_INTS, false, 0}}},
    {"AvgPool2d",
     {{"kernel_size", A_INTS, true, 0},
      {"stride", A_INTS, false, 0},
      {"padding", A_INTS, false, 0}}},
    {"AdaptiveAvgPool2d", {{"output_size", A_INTS, true, 0}}},
    {"Flatten", {{"start_dim", A_INT, false, 1}, {"end_dim", A_INT, false, -1}}},
    {"Unflatten", {{"dim", A_INT, true, 0}, {"unflattened_size", A_INTS, true, 0}}},
    {"LayerNorm", {{"normalized_shape", A_INT, true, 0}, {"eps", A_REAL, false, 1e-5}}},
    {"GroupNorm",
     {{"num_groups", A_INT, true, 0},
      {"num_channels", A_INT, true, 0},
      {"eps", A_REAL, false, 1e-5},
      {"affine", A_BOOL, false, 1}}},
    /* eps not given: None (the dtype's epsilon), as PyTorch's */
    {"RMSNorm",
     {{"normalized_shape", A_INT, true, 0},
      {"eps", A_REAL, false, -1},
      {"elementwise_affine", A_BOOL, false, 1}}},
    {"InstanceNorm2d",
     {{"num_features", A_INT, true, 0},
      {"eps", A_REAL, false, 1e-5},
      {"momentum", A_REAL, false, 0.1},
      {"affine", A_BOOL, false, 0},
      {"track_running_stats", A_BOOL, false, 0}}},
    {"ConvTranspose2d",
     {{"in_channels", A_INT, true, 0},
      {"out_channels", A_INT, true, 0},
      {"kernel_size", A_INTS, true, 0},
      {"stride", A_INTS, false, 1},
      {"padding", A_INTS, false, 0},
      {"output_padding", A_INTS, false, 0},
      {"groups", A_INT, false, 1},
      {"bias", A_BOOL, false, 1},
      {"dilation", A_INTS, false, 1}}},
    /* torchvision's residual blocks (fg_resnet_block_new) */
    {"BasicBlock",
     {{"inplanes", A_INT, true, 0}, {"planes", A_INT, true, 0}, {"stride", A_INT, false, 1}}},
    {"Bottleneck",
     {{"inplanes", A_INT, true, 0}, {"planes", A_INT, true, 0}, {"stride", A_INT, false, 1}}},
    /* the output sequence alone (from zero states); Select picks a step */
    {"LSTM",
     {{"input_size", A_INT, true, 0},
      {"hidden_size", A_INT, true, 0},
      {"num_layers", A_INT, false, 1},
      {"bias", A_BOOL, false, 1},
      {"batch_first", A_BOOL, false, 0},
      {"dropout", A_REAL, false, 0},
      {"bidirectional", A_BOOL, false, 0}}},
    {"GRU",
     {{"input_size", A_INT, true, 0},
      {"hidden_size", A_INT, true, 0},
      {"num_layers", A_INT, false, 1},
      {"bias", A_BOOL, false, 1},
      {"batch_first", A_BOOL, false, 0},
      {"dropout", A_REAL, false, 0},
      {"bidirectional", A_BOOL, false, 0}}},
    /* self-attention of its input, the output alone */
    {"MultiheadAttention",
     {{"embed_dim", A_INT, true, 0},
      {"num_heads", A_INT, true, 0},
      {"dropout", A_REAL, false, 0},
      {"bias", A_BOOL, false, 1},
      {"batch_first", A_BOOL, false, 0}}},
    /* torch.select(x, dim, index): e.g. an LSTM's last step, Select(dim=1, index=-1) */
    {"Select", {{"dim", A_INT, true, 0}, {"index", A_INT, false, -1}}},
    {"Dropout", {{"p", A_REAL, false, 0.5}}},
    {"ReLU", {{0}}},
    {"GELU", {{0}}},
    {"Tanh", {{0}}},
    {"Sigmoid", {{0}}},
    {"SiLU", {{0}}},
    {"Identity", {{0}}},
    {"LeakyReLU", {{"negative_slope", A_REAL, false, 0.01}}},
    {"ELU", {{"alpha", A_REAL, false, 1.0}}},
};
#define NLAYERS (sizeof k_layers / sizeof k_layers[0])

const char *fit_net_layer_names(void) {
    static char buf[1024];
    if (!buf[0])
        for (size_t i = 0; i < NLAYERS; i++)
            snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%s", i ? ", " : "",
                     k_layers[i].name);
    return buf;
}

/* One layer, parsed: its table row and each argument's value(s). */
typedef struct parsed {
    const layer_info *li;
    bool given[MAX_ARGS];
    int64_t ints[MAX_ARGS][4];
    int nints[MAX_ARGS];
    double real[MAX_ARGS];
} parsed;

static const char *skip(const char *p) {
    while (isspace((unsigned char)*p)) p++;
    return p;
}

static int nargs(const layer_info *li) {
    int n = 0;
    while (n < MAX_ARGS && li->args[n].name) n++;
    return n;
}

static bool fail(char *err, size_t cap, const char *fmt, const char *a, const char *b,
                 const char *c) {
    snprintf(err, cap, fmt, a, b, c);
    return false;
}

/* "Name(k=v, ...)" from text up to its end (or ';'); *end after it. */
static bool parse_layer(const char *text, parsed *out, const char **end, char *err, size_t cap) {
    memset(out, 0, sizeof *out);
    const char *p = skip(text);
    char name[64];
    size_t n = 0;
    while ((isalnum((unsigned char)*p) || *p == '_' || *p == '.') && n + 1 < sizeof name)
        name[n++] = *p++;
    name[n] = '\0';
    const char *base = strrchr(name, '.'); /* torch.nn.Conv2d */
    base = base ? base + 1 : name;
    for (size_t i = 0; i < NLAYERS && !out->li; i++)
        if (!strcmp(base, k_layers[i].name)) out->li = &k_layers[i];
    if (!out->li) {
        const char *best = NULL;
        int bd = 99;
        for (size_t i = 0; i < NLAYERS; i++) {
            int d = cli_edit_distance(base, k_layers[i].name);
            if (d < bd) bd = d, best = k_layers[i].name;
        }
        if (!*base)
            return fail(err, cap, "a layer without a name (expected one of %s)%s%s",
                        fit_net_layer_names(), "", "");
        if (bd <= 3)
            return fail(err, cap, "unknown layer \"%s\"; did you mean %s?%s", base, best, "");
        return fail(err, cap, "unknown layer \"%s\" (the layers: %s)%s", base,
                    fit_net_layer_names(), "");
    }
    const layer_info *li = out->li;
    int na = nargs(li);
    p = skip(p);
    if (*p == '(') {
        p = skip(p + 1);
        while (*p && *p != ')') {
            char key[64];
            n = 0;
            while ((isalnum((unsigned char)*p) || *p == '_') && n + 1 < sizeof key) key[n++] = *p++;
            key[n] = '\0';
            p = skip(p);
            if (*p != '=')
                return fail(err, cap, "%s: expected key=value after \"%s\"%s", li->name, key, "");
            p = skip(p + 1);
            int k = -1;
            for (int i = 0; i < na; i++)
                if (!strcmp(key, li->args[i].name)) k = i;
            if (k < 0) {
                const char *best = NULL;
                int bd = 99;
                for (int i = 0; i < na; i++) {
                    int d = cli_edit_distance(key, li->args[i].name);
                    if (d < bd) bd = d, best = li->args[i].name;
                }
                char b[160];
                snprintf(b, sizeof b, "%s", best ? best : "");
                if (!na)
                    return fail(err, cap, "%s takes no arguments (got \"%s\")%s", li->name, key,
                                "");
                if (bd <= 3 || (best && *key && !strncmp(best, key, strlen(key))))
                    return fail(err, cap, "%s: unknown argument \"%s\"; did you mean %s?", li->name,
                                key, b);
                return fail(err, cap, "%s: unknown argument \"%s\" (the nearest is %s)", li->name,
                            key, b);
            }
            if (out->given[k])
                return fail(err, cap, "%s: argument %s given twice%s", li->name, key, "");
            out->given[k] = true;
            const arg_info *a = &li->args[k];
            if (a->kind == A_BOOL) {
                if (!strncmp(p, "true", 4) || !strncmp(p, "True", 4)) out->real[k] = 1, p += 4;
                else if (!strncmp(p, "false", 5) || !strncmp(p, "False", 5))
                    out->real[k] = 0, p += 5;
                else return fail(err, cap, "%s: %s must be true or false%s", li->name, key, "");
            } else {
                bool list = *p == '[' || *p == '(';
                if (list && a->kind != A_INTS)
                    return fail(err, cap, "%s: %s takes one number, not a list%s", li->name, key,
                                "");
                if (list) p = skip(p + 1);
                for (;;) {
                    char *e;
                    double v = strtod(p, &e);
                    if (e == p)
                        return fail(err, cap, "%s: %s: expected a number%s", li->name, key, "");
                    if (a->kind != A_REAL && v != (double)(int64_t)v)
                        return fail(err, cap, "%s: %s must be a whole number%s", li->name, key, "");
                    if (a->kind == A_REAL) out->real[k] = v;
                    else if (out->nints[k] == 4)
                        return fail(err, cap, "%s: %s: at most 4 numbers%s", li->name, key, "");
                    else out->ints[k][out->nints[k]++] = (int64_t)v;
                    p = skip(e);
                    if (!list || *p != ',') break;
                    p = skip(p + 1);
                }
                if (list) {
                    if (*p != ']' && *p != ')')
                        return fail(err, cap, "%s: %s: an unclosed list%s", li->name, key, "");
                    p = skip(p + 1);
                }
            }
            p = skip(p);
            if (*p == ',') p = skip(p + 1);
            else if (*p != ')')
                return fail(err, cap, "%s: expected , or ) after %s%s", li->name, key, "");
        }
        if (*p != ')') return fail(err, cap, "%s: an unclosed (%s%s", li->name, "", "");
        p = skip(p + 1);
    }
    for (int i = 0; i < na; i++)
        if (li->args[i].required && !out->given[i])
            return fail(err, cap, "%s: %s is required%s", li->name, li->args[i].name, "");
    for (int i = 0; i < na; i++) {
        const arg_info *a = &li->args[i];
        if (!out->given[i]) {
            out->real[i] = a->def;
            if (a->kind == A_INT || a->kind == A_INTS) out->ints[i][0] = (int64_t)a->def;
            out->nints[i] = 1;
        }
        bool pos = a->kind == A_INTS || (a->kind == A_INT && strcmp(a->name, "start_dim") &&
                                         strcmp(a->name, "end_dim") && strcmp(a->name, "dim") &&
                                         strcmp(a->name, "index"));
        bool zero_ok = !strcmp(a->name, "padding") || !strcmp(a->name, "output_padding");
        for (int j = 0; pos && j < out->nints[i]; j++)
            if (out->ints[i][j] < (zero_ok ? 0 : out->given[i] ? 1 : 0))
                return fail(err, cap, "%s: %s must be positive%s", li->name, a->name, "");
        if (a->kind == A_REAL && out->given[i] && out->real[i] < 0)
            return fail(err, cap, "%s: %s must be >= 0%s", li->name, a->name, "");
    }
    if (!strcmp(li->name, "MultiheadAttention") && out->ints[0][0] % out->ints[1][0]) {
        char why[96];
        snprintf(why, sizeof why, "embed_dim=%lld is not a multiple of num_heads=%lld",
                 (long long)out->ints[0][0], (long long)out->ints[1][0]);
        return fail(err, cap, "%s: %s%s", li->name, why, "");
    }
    *end = p;
    return true;
}

bool fit_net_check_layer(const char *text, char *err, size_t cap) {
    parsed pl;
    const char *end;
    if (!parse_layer(text, &pl, &end, err, cap)) return false;
    if (*skip(end)) {
        snprintf(err, cap, "%s: unexpected \"%.20s\" after the layer", pl.li->name, end);
        return false;
    }
    return true;
}

bool fit_net_check(const char *net, char *err, size_t cap) {
    const char *p = net;
    int k = 1;
    if (!*skip(p)) {
        snprintf(err, cap, "an empty network: give its layers (%s)", fit_net_layer_names());
        return false;
    }
    while (*skip(p)) {
        parsed pl;
        const char *end;
        char why[400];
        if (!parse_layer(p, &pl, &end, why, sizeof why)) {
            snprintf(err, cap, "layer %d: %s", k, why);
            return false;
        }
        p = skip(end);
        if (*p == ';') p++;
        else if (*p) {
            snprintf(err, cap, "layer %d (%s): expected ';' before \"%.20s\"", k, pl.li->name, p);
            return false;
        }
        k++;
    }
    return true;
}

/* ------------------------------------------------------------ building */

typedef struct unflatten {
    int64_t dim, shape[4];
    int n;
} unflatten;

static fg_tensor *unflatten_forward(fg_module *m, fg_tensor *x, void *ud) {
    (void)m;
    const unflatten *u = ud;
    int nd = fg_tensor_ndim(x);
    int64_t dim = u->dim < 0 ? u->dim + nd : u->dim, shape[FG_MAX_DIMS];
    int k = 0;
    if (dim < 0 || dim >= nd || nd - 1 + u->n > FG_MAX_DIMS) {
        fg_error(FG_EINVAL, "Unflatten(dim=%lld): input of %d dimensions", (long long)u->dim, nd);
        return NULL;
    }
    for (int i = 0; i < nd; i++) {
        if (i == dim)
            for (int j = 0; j < u->n; j++) shape[k++] = u->shape[j];
        else shape[k++] = fg_tensor_dim(x, i);
    }
    return fg_reshape(x, k, shape);
}

/* torch.select(x, dim, index): dim and index counted from the end when < 0 */
static fg_tensor *select_forward(fg_module *m, fg_tensor *x, void *ud) {
    (void)m;
    const int64_t *sel = ud;
    int nd = fg_tensor_ndim(x);
    int64_t dim = sel[0] < 0 ? sel[0] + nd : sel[0];
    if (dim < 0 || dim >= nd || nd < 2) {
        fg_error(FG_EINVAL, "Select(dim=%lld): input of %d dimensions", (long long)sel[0], nd);
        return NULL;
    }
    int64_t len = fg_tensor_dim(x, (int)dim), at = sel[1] < 0 ? sel[1] + len : sel[1];
    if (at < 0 || at >= len) {
        fg_error(FG_EINVAL, "Select(dim=%lld, index=%lld): dimension %lld has %lld entries",
                 (long long)sel[0], (long long)sel[1], (long long)dim, (long long)len);
        return NULL;
    }
    int64_t shape[FG_MAX_DIMS];
    int k = 0;
    for (int i = 0; i < nd; i++)
        if (i != dim) shape[k++] = fg_tensor_dim(x, i);
    fg_tensor *one = fg_narrow(x, (int)dim, at, 1);
    return one ? fg_reshape(one, k, shape) : NULL;
}

static fg_module *build_one(const parsed *p, fg_dtype dt) {
    const char *n = p->li->name;
    const int64_t(*I)[4] = p->ints;
    const double *R = p->real;
#define PAIR(i) ((int64_t[2]){I[i][0], p->nints[i] > 1 ? I[i][1] : I[i][0]})
    if (!strcmp(n, "Linear")) return fg_linear_new(I[0][0], I[1][0], R[2] != 0, dt);
    if (!strcmp(n, "Conv2d")) {
        fg_conv2d_opts o = {.stride = {PAIR(3)[0], PAIR(3)[1]},
                            .padding = {PAIR(4)[0], PAIR(4)[1]},
                            .dilation = {PAIR(5)[0], PAIR(5)[1]},
                            .groups = I[6][0]};
        return fg_conv2d_new(I[0][0], I[1][0], PAIR(2), &o, R[7] != 0, dt);
    }
    if (!strcmp(n, "BatchNorm2d")) return fg_batch_norm2d_new(I[0][0], R[1], R[2], true, true, dt);
    if (!strcmp(n, "BatchNorm1d")) return fg_batch_norm1d_new(I[0][0], R[1], R[2], true, true, dt);
    if (!strcmp(n, "MaxPool2d") || !strcmp(n, "AvgPool2d")) {
        bool given_stride = p->given[1];
        int64_t k[2] = {PAIR(0)[0], PAIR(0)[1]}, s[2] = {PAIR(1)[0], PAIR(1)[1]},
                pad[2] = {PAIR(2)[0], PAIR(2)[1]};
        const int64_t *st = given_stride ? s : NULL;
        return !strcmp(n, "MaxPool2d") ? fg_max_pool2d_new(k, st, pad, NULL, false)
                                       : fg_avg_pool2d_new(k, st, pad, false, true);
    }
    if (!strcmp(n, "AdaptiveAvgPool2d")) return fg_adaptive_avg_pool2d_new(PAIR(0)[0], PAIR(0)[1]);
    if (!strcmp(n, "Flatten")) return fg_flatten_new((int)I[0][0], (int)I[1][0]);
    if (!strcmp(n, "Unflatten")) {
        unflatten *u = calloc(1, sizeof *u);
        if (!u) return NULL;
        u->dim = I[0][0];
        u->n = p->nints[1];
        memcpy(u->shape, I[1], sizeof u->shape);
        return fg_module_new("Unflatten", unflatten_forward, u, free);
    }
    if (!strcmp(n, "LayerNorm")) return fg_layer_norm_new(I[0][0], R[1], true, dt);
    if (!strcmp(n, "GroupNorm")) return fg_group_norm_new(I[0][0], I[1][0], R[2], R[3] != 0, dt);
    if (!strcmp(n, "RMSNorm")) return fg_rms_norm_new(I[0][0], R[1], R[2] != 0, dt);
    if (!strcmp(n, "InstanceNorm2d"))
        return fg_instance_norm2d_new(I[0][0], R[1], R[2], R[3] != 0, R[4] != 0, dt);
    if (!strcmp(n, "ConvTranspose2d")) {
        fg_conv_transpose2d_opts o = {.stride = {PAIR(3)[0], PAIR(3)[1]},
                                      .padding = {PAIR(4)[0], PAIR(4)[1]},
                                      .output_padding = {PAIR(5)[0], PAIR(5)[1]},
                                      .dilation = {PAIR(8)[0], PAIR(8)[1]},
                                      .groups = I[6][0]};
        return fg_conv_transpose2d_new(I[0][0], I[1][0], PAIR(2), &o, R[7] != 0, dt);
    }
    if (!strcmp(n, "BasicBlock") || !strcmp(n, "Bottleneck"))
        return fg_resnet_block_new(I[0][0], I[1][0], I[2][0], !strcmp(n, "Bottleneck"), dt);
    if (!strcmp(n, "LSTM") || !strcmp(n, "GRU")) {
        fg_rnn_opts o = {.num_layers = I[2][0],
                         .no_bias = R[3] == 0,
                         .batch_first = R[4] != 0,
                         .dropout = R[5],
                         .bidirectional = R[6] != 0};
        return !strcmp(n, "LSTM") ? fg_lstm_new(I[0][0], I[1][0], &o, dt)
                                  : fg_gru_new(I[0][0], I[1][0], &o, dt);
    }
    if (!strcmp(n, "MultiheadAttention")) {
        fg_mha_opts o = {.no_bias = R[3] == 0, .batch_first = R[4] != 0, .dropout = R[2]};
        return fg_multihead_attention_new(I[0][0], I[1][0], &o, dt);
    }
    if (!strcmp(n, "Select")) {
        int64_t *sel = malloc(2 * sizeof *sel);
        if (!sel) return NULL;
        sel[0] = I[0][0];
        sel[1] = I[1][0];
        return fg_module_new("Select", select_forward, sel, free);
    }
    if (!strcmp(n, "Dropout")) return fg_dropout_new(R[0]);
    if (!strcmp(n, "ReLU")) return fg_relu_new();
    if (!strcmp(n, "GELU")) return fg_gelu_new_approximate("none");
    if (!strcmp(n, "Tanh")) return fg_tanh_new();
    if (!strcmp(n, "Sigmoid")) return fg_sigmoid_new();
    if (!strcmp(n, "SiLU")) return fg_silu_new();
    if (!strcmp(n, "Identity")) return fg_identity_new();
    if (!strcmp(n, "LeakyReLU")) return fg_leaky_relu_new(R[0]);
    if (!strcmp(n, "ELU")) return fg_elu_new(R[0]);
#undef PAIR
    fg_error(FG_EINTERNAL, "layer %s has no constructor", n);
    return NULL;
}

fg_module *fit_net_build(const char *net, fg_dtype dt, uint64_t seed) {
    char err[512];
    if (!fit_net_check(net, err, sizeof err)) {
        fg_error(FG_EINVAL, "--net: %s", err);
        return NULL;
    }
    fg_module *seq = fg_sequential_new();
    if (!seq) return NULL;
    const char *p = net;
    int k = 1;
    while (*skip(p)) {
        parsed pl;
        const char *end;
        (void)parse_layer(p, &pl, &end, err, sizeof err);
        fg_module *m = build_one(&pl, dt);
        if (!m || fg_sequential_append(seq, m) != FG_OK) {
            fg_status s = fg_last_status() ? fg_last_status() : FG_EINVAL;
            char msg[512];
            snprintf(msg, sizeof msg, "%s", fg_last_error());
            fg_module_free(seq);
            fg_error(s, "--net: layer %d (%s): %s", k, pl.li->name, msg);
            return NULL;
        }
        p = skip(end);
        if (*p == ';') p++;
        k++;
    }
    if (fg_module_set_seed(seq, seed) != FG_OK || fg_module_finalize(seq) != FG_OK) {
        fg_module_free(seq);
        return NULL;
    }
    return seq;
}
