/* Residual blocks and the ResNet family, laid out as torchvision's
 * resnet.py (names conv1, bn1, layer1.0.conv1, ..., layer1.0.downsample.0,
 * fc; its initialisation: convolutions kaiming_normal(fan_out, relu), batch
 * norms 1 and 0, fc Linear's) in two layouts: ImageNet (7x7 stride-2 stem
 * and max pool, four stages from 64 planes) and CIFAR (3x3 stem, no pool:
 * ResNet-18 as the common CIFAR port, four stages of two BasicBlocks; and
 * He et al.'s 6n+2 ResNets, three stages of n BasicBlocks from 16 planes,
 * with 1x1-convolution shortcuts (option B)). Its ReLUs run in place where
 * that is safe (fg_relu_), as torchvision's ReLU(inplace=True). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "nn_impl.h"

/* a bias-free conv with kaiming_normal_(mode="fan_out", nonlinearity="relu") */
static fg_module *kconv(int64_t in, int64_t out, int64_t k, int64_t stride, fg_dtype dt) {
    fg_conv2d_opts o = {.stride = {stride, stride}, .padding = {k / 2, k / 2}};
    fg_module *c = fg_conv2d_new(in, out, (int64_t[]){k, k}, &o, false, dt);
    if (c && fg_module_set_init(c, "weight",
                                &(fg_init){FG_INIT_NORMAL, 0, sqrt(2.0 / (double)(out * k * k))}))
        fg_module_free(c), c = NULL;
    return c;
}

static fg_module *bn(int64_t c, fg_dtype dt) {
    return fg_batch_norm2d_new(c, 1e-5, 0.1, true, true, dt);
}

typedef struct block_ud {
    fg_module *c[3], *b[3], *down;
    int n; /* 2 convs (BasicBlock) or 3 (Bottleneck) */
} block_ud;

static fg_tensor *block_fwd(fg_module *m, fg_tensor *x, void *ud) {
    (void)m;
    block_ud *p = ud;
    fg_tensor *h = x;
    for (int i = 0; i < p->n && h; i++) {
        h = fg_module_forward(p->b[i], fg_module_forward(p->c[i], h));
        if (i < p->n - 1) h = fg_relu_(h);
    }
    fg_tensor *id = p->down ? fg_module_forward(p->down, x) : x;
    return fg_relu_(fg_add(h, id));
}

fg_module *fg_resnet_block_new(int64_t in, int64_t planes, int64_t stride, bool bottleneck,
                               fg_dtype dt) {
    if (in < 1 || planes < 1 || stride < 1) {
        fg_error(FG_EINVAL, "resnet_block_new: in %lld, planes %lld, stride %lld: expected >= 1",
                 (long long)in, (long long)planes, (long long)stride);
        return NULL;
    }
    if (fg__model_dtype(dt, "resnet_block_new", &dt) != FG_OK) return NULL;
    block_ud *p = fg_calloc(1, sizeof *p);
    fg_module *m =
        p ? fg_module_new(bottleneck ? "Bottleneck" : "BasicBlock", block_fwd, p, fg_free) : NULL;
    if (!m) return NULL;
    int64_t out = bottleneck ? planes * 4 : planes;
    p->n = bottleneck ? 3 : 2;
    int64_t cin[3], cout[3], k[3], s[3];
    if (bottleneck) { /* torchvision v1.5: the stride on the 3x3 */
        int64_t a[3][4] = {{in, planes, 1, 1}, {planes, planes, 3, stride}, {planes, out, 1, 1}};
        for (int i = 0; i < 3; i++)
            cin[i] = a[i][0], cout[i] = a[i][1], k[i] = a[i][2], s[i] = a[i][3];
    } else {
        int64_t a[2][4] = {{in, planes, 3, stride}, {planes, planes, 3, 1}};
        for (int i = 0; i < 2; i++)
            cin[i] = a[i][0], cout[i] = a[i][1], k[i] = a[i][2], s[i] = a[i][3];
    }
    static const char *const cn[] = {"conv1", "conv2", "conv3"}, *const bnn[] = {"bn1", "bn2",
                                                                                 "bn3"};
    fg_status st = FG_OK;
    for (int i = 0; i < p->n && !st; i++) {
        st = fg_module_add_child(m, cn[i], p->c[i] = kconv(cin[i], cout[i], k[i], s[i], dt));
        if (!st) st = fg_module_add_child(m, bnn[i], p->b[i] = bn(cout[i], dt));
    }
    if (!st) st = fg_module_add_child(m, "relu", fg_relu_new());
    if (!st && (stride != 1 || in != out)) {
        fg_module *d = p->down = fg_sequential_new();
        st = fg_sequential_append(d, kconv(in, out, 1, stride, dt));
        if (!st) st = fg_sequential_append(d, bn(out, dt));
        if (!st) st = fg_module_add_child(m, "downsample", d);
        else fg_module_free(d);
    }
    if (st) {
        fg_module_free(m);
        return NULL;
    }
    return m;
}

/* ------------------------------------------------------------------ ResNet */

typedef struct resnet_ud {
    fg_resnet_config c;
    fg_module *conv1, *bn1, *pool, *layers[4], *fc;
    int nstages;
} resnet_ud;

static fg_tensor *resnet_fwd(fg_module *m, fg_tensor *x, void *ud) {
    (void)m;
    resnet_ud *p = ud;
    if (fg_tensor_ndim(x) != 4 || fg_tensor_dim(x, 1) != p->c.in_channels) {
        char s[96];
        fg_error(FG_EINVAL, "ResNet: input %s: expected (N, %lld, H, W)",
                 fg_tensor_describe(x, s, sizeof s), (long long)p->c.in_channels);
        return NULL;
    }
    fg_tensor *h = fg_relu_(fg_module_forward(p->bn1, fg_module_forward(p->conv1, x)));
    if (p->pool) h = fg_module_forward(p->pool, h);
    for (int i = 0; i < p->nstages && h; i++) h = fg_module_forward(p->layers[i], h);
    h = fg_flatten(fg_adaptive_avg_pool2d(h, 1, 1), 1, -1);
    return fg_module_forward(p->fc, h);
}

fg_module *fg_resnet_new(const fg_resnet_config *cfg) {
    fg_resnet_config c = cfg ? *cfg : (fg_resnet_config){0};
    bool imagenet = c.layout == FG_RESNET_IMAGENET, bottleneck = false;
    int blocks[4] = {0}, nst = 4;
    if (!c.depth) c.depth = imagenet ? 50 : 20;
    if (imagenet &&
        (c.depth == 18 || c.depth == 34 || c.depth == 50 || c.depth == 101 || c.depth == 152)) {
        static const int b[5][4] = {
            {2, 2, 2, 2}, {3, 4, 6, 3}, {3, 4, 6, 3}, {3, 4, 23, 3}, {3, 8, 36, 3}};
        int k = c.depth == 18 ? 0 : c.depth == 34 ? 1 : c.depth == 50 ? 2 : c.depth == 101 ? 3 : 4;
        memcpy(blocks, b[k], sizeof blocks);
        bottleneck = c.depth >= 50;
    } else if (!imagenet && c.depth == 18) {
        for (int i = 0; i < 4; i++) blocks[i] = 2;
    } else if (!imagenet && c.depth >= 8 && (c.depth - 2) % 6 == 0) {
        nst = 3;
        for (int i = 0; i < 3; i++) blocks[i] = (c.depth - 2) / 6;
    } else {
        fg_error(FG_EINVAL,
                 "resnet_new: depth %d: expected 18, 34, 50, 101 or 152 (imagenet layout), 18 or "
                 "6n+2 such as 20, 32, 44, 56 (cifar layout)",
                 c.depth);
        return NULL;
    }
    if (!c.in_channels) c.in_channels = 3;
    if (!c.num_classes) c.num_classes = imagenet ? 1000 : 10;
    if (!c.width) c.width = nst == 3 ? 16 : 64;
    if (c.in_channels < 1 || c.num_classes < 1 || c.width < 1) {
        fg_error(FG_EINVAL,
                 "resnet_new: in_channels %lld, num_classes %lld, width %lld: "
                 "expected >= 1",
                 (long long)c.in_channels, (long long)c.num_classes, (long long)c.width);
        return NULL;
    }
    fg_dtype dt;
    if (fg__model_dtype(c.dtype, "resnet_new", &dt) != FG_OK) return NULL;
    c.dtype = dt;
    resnet_ud *p = fg_calloc(1, sizeof *p);
    fg_module *m = p ? fg_module_new("ResNet", resnet_fwd, p, fg_free) : NULL;
    if (!m) return NULL;
    p->c = c;
    p->nstages = nst;
    fg_status st = FG_OK;
    if (imagenet) {
        fg_conv2d_opts o = {.stride = {2, 2}, .padding = {3, 3}};
        p->conv1 = fg_conv2d_new(c.in_channels, c.width, (int64_t[]){7, 7}, &o, false, dt);
        if (p->conv1 &&
            fg_module_set_init(p->conv1, "weight",
                               &(fg_init){FG_INIT_NORMAL, 0, sqrt(2.0 / (double)(c.width * 49))}))
            fg_module_free(p->conv1), p->conv1 = NULL;
    } else {
        p->conv1 = kconv(c.in_channels, c.width, 3, 1, dt);
    }
    st = fg_module_add_child(m, "conv1", p->conv1);
    if (!st) st = fg_module_add_child(m, "bn1", p->bn1 = bn(c.width, dt));
    if (!st) st = fg_module_add_child(m, "relu", fg_relu_new());
    if (!st && imagenet)
        st = fg_module_add_child(m, "maxpool",
                                 p->pool = fg_max_pool2d_new((int64_t[]){3, 3}, (int64_t[]){2, 2},
                                                             (int64_t[]){1, 1}, NULL, false));
    int64_t in = c.width, exp = bottleneck ? 4 : 1;
    for (int s = 0; s < nst && !st; s++) {
        int64_t planes = c.width << s;
        fg_module *layer = p->layers[s] = fg_sequential_new();
        for (int b = 0; b < blocks[s] && !st; b++) {
            st = fg_sequential_append(
                layer, fg_resnet_block_new(in, planes, b == 0 && s > 0 ? 2 : 1, bottleneck, dt));
            in = planes * exp;
        }
        char name[16];
        snprintf(name, sizeof name, "layer%d", s + 1);
        if (!st) st = fg_module_add_child(m, name, layer);
        else fg_module_free(layer);
    }
    if (!st) st = fg_module_add_child(m, "avgpool", fg_adaptive_avg_pool2d_new(1, 1));
    if (!st) st = fg_module_add_child(m, "fc", p->fc = fg_linear_new(in, c.num_classes, true, dt));
    if (!st && c.seed) st = fg_module_set_seed(m, c.seed);
    if (!st) st = fg_module_finalize(m);
    if (st) {
        fg_module_free(m);
        return NULL;
    }
    return m;
}
