/* The CNN layers: Conv2d, Conv1d, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d,
 * BatchNorm1d and BatchNorm2d, with PyTorch's parameter and buffer names
 * (weight, bias; running_mean, running_var, num_batches_tracked, the last
 * a float buffer here: a model's buffers share one flat float buffer) and
 * initialisation (Conv: kaiming_uniform with a = sqrt(5), i.e.
 * U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias; BatchNorm:
 * weight 1, bias 0, running_mean 0, running_var 1). */
#include <math.h>

#include "nn_impl.h"

typedef struct conv_ud {
    fg_tensor *w, *b;
    fg_conv2d_opts o;
    bool one_d;
} conv_ud;

static fg_tensor *conv_fwd(fg_module *m, fg_tensor *x, void *ud) {
    (void)m;
    conv_ud *p = ud;
    return p->one_d ? fg_conv1d(x, p->w, p->b, &p->o) : fg_conv2d(x, p->w, p->b, &p->o);
}

static fg_module *conv_new(const char *type, int64_t in, int64_t out, const int64_t *k, int nk,
                           const fg_conv2d_opts *o, bool bias, fg_dtype dt) {
    int64_t groups = o && o->groups ? o->groups : 1;
    if (in <= 0 || out <= 0 || groups < 1 || in % groups || out % groups || !k || k[0] <= 0 ||
        (nk == 2 && k[1] <= 0)) {
        fg_error(FG_EINVAL,
                 "%s: in %lld, out %lld, kernel %lld, groups %lld: expected sizes > 0 and "
                 "channels that are multiples of groups",
                 type, (long long)in, (long long)out, k ? (long long)k[0] : 0LL, (long long)groups);
        return NULL;
    }
    if (fg__model_dtype(dt, type, &dt) != FG_OK) return NULL;
    conv_ud *p = fg_calloc(1, sizeof *p);
    fg_module *m = p ? fg_module_new(type, conv_fwd, p, fg_free) : NULL;
    if (!m) return NULL;
    if (o) p->o = *o;
    p->one_d = nk == 1;
    int64_t shape[4] = {out, in / groups, k[0], nk == 2 ? k[1] : 0};
    double fan_in = (double)(in / groups) * (double)k[0] * (nk == 2 ? (double)k[1] : 1.0);
    double bound = 1.0 / sqrt(fan_in);
    fg_init u = {FG_INIT_UNIFORM, -bound, bound};
    p->w = fg_module_add_param(m, "weight", dt, 2 + nk, shape, &u);
    if (p->w && bias) p->b = fg_module_add_param(m, "bias", dt, 1, &out, &u);
    if (!p->w || (bias && !p->b)) {
        fg_module_free(m);
        return NULL;
    }
    return m;
}

fg_module *fg_conv2d_new(int64_t in, int64_t out, const int64_t kernel[2], const fg_conv2d_opts *o,
                         bool bias, fg_dtype dt) {
    return conv_new("Conv2d", in, out, kernel, 2, o, bias, dt);
}

fg_module *fg_conv1d_new(int64_t in, int64_t out, int64_t kernel, const fg_conv2d_opts *o,
                         bool bias, fg_dtype dt) {
    return conv_new("Conv1d", in, out, &kernel, 1, o, bias, dt);
}

/* ------------------------------------------------------------------ pooling */

typedef struct pool_ud {
    int kind; /* 0 max, 1 avg, 2 adaptive avg */
    int64_t k[2], s[2], p[2], d[2];
    bool ceil_mode, count_include_pad;
} pool_ud;

static fg_tensor *pool_fwd(fg_module *m, fg_tensor *x, void *ud) {
    (void)m;
    pool_ud *q = ud;
    if (q->kind == 0) return fg_max_pool2d(x, q->k, q->s, q->p, q->d, q->ceil_mode, NULL);
    if (q->kind == 1) return fg_avg_pool2d(x, q->k, q->s, q->p, q->ceil_mode, q->count_include_pad);
    return fg_adaptive_avg_pool2d(x, q->k[0], q->k[1]);
}

static fg_module *pool_new(const char *type, pool_ud q) {
    for (int i = 0; i < 2; i++)
        if (q.k[i] <= 0) {
            fg_error(FG_EINVAL, "%s: size %lld: expected > 0", type, (long long)q.k[i]);
            return NULL;
        }
    pool_ud *p = fg_calloc(1, sizeof *p);
    if (!p) return NULL;
    *p = q;
    return fg_module_new(type, pool_fwd, p, fg_free);
}

static void copy2(int64_t *dst, const int64_t *src, int64_t dflt) {
    dst[0] = src ? src[0] : dflt;
    dst[1] = src ? src[1] : dflt;
}

fg_module *fg_max_pool2d_new(const int64_t kernel[2], const int64_t stride[2],
                             const int64_t padding[2], const int64_t dilation[2], bool ceil_mode) {
    pool_ud q = {.kind = 0, .ceil_mode = ceil_mode};
    copy2(q.k, kernel, 0);
    copy2(q.s, stride, 0);
    copy2(q.p, padding, 0);
    copy2(q.d, dilation, 1);
    return pool_new("MaxPool2d", q);
}

fg_module *fg_avg_pool2d_new(const int64_t kernel[2], const int64_t stride[2],
                             const int64_t padding[2], bool ceil_mode, bool count_include_pad) {
    pool_ud q = {.kind = 1, .ceil_mode = ceil_mode, .count_include_pad = count_include_pad};
    copy2(q.k, kernel, 0);
    copy2(q.s, stride, 0);
    copy2(q.p, padding, 0);
    return pool_new("AvgPool2d", q);
}

fg_module *fg_adaptive_avg_pool2d_new(int64_t out_h, int64_t out_w) {
    pool_ud q = {.kind = 2, .k = {out_h, out_w}};
    return pool_new("AdaptiveAvgPool2d", q);
}

/* --------------------------------------------------------------- BatchNorm */

typedef struct bn_ud {
    fg_tensor *w, *b, *rm, *rv, *nbt;
    double eps, momentum;
    int ndim_lo, ndim_hi;        /* the input dims accepted */
    const fg_stats_reduce *sync; /* SyncBatchNorm: the ranks' sum (borrowed), else NULL */
} bn_ud;

static const char kind_batchnorm[] = "BatchNorm";

static fg_tensor *bn_fwd(fg_module *m, fg_tensor *x, void *ud) {
    bn_ud *p = ud;
    int nd = fg_tensor_ndim(x);
    if (nd < p->ndim_lo || nd > p->ndim_hi) {
        char s[96];
        fg_error(FG_EINVAL, "%s: input %s: expected %d to %d dims", m->type,
                 fg_tensor_describe(x, s, sizeof s), p->ndim_lo, p->ndim_hi);
        return NULL;
    }
    bool train = m->training || !p->rm;
    if (m->training && p->nbt && fg_tensor_fill(p->nbt, fg_item(p->nbt) + 1) != FG_OK) return NULL;
    if (train && p->sync)
        return fg_sync_batch_norm(x, p->rm, p->rv, p->w, p->b, p->momentum, p->eps, p->sync);
    return fg_batch_norm(x, p->rm, p->rv, p->w, p->b, train, p->momentum, p->eps);
}

static fg_module *bn_new(const char *type, int lo, int hi, int64_t c, double eps, double momentum,
                         bool affine, bool track, fg_dtype dt) {
    if (c <= 0 || !(momentum >= 0 && momentum <= 1)) {
        fg_error(FG_EINVAL, "%s: num_features %lld, momentum %g: expected > 0 and [0, 1]", type,
                 (long long)c, momentum);
        return NULL;
    }
    if (fg__model_dtype(dt, type, &dt) != FG_OK) return NULL;
    bn_ud *p = fg_calloc(1, sizeof *p);
    fg_module *m = p ? fg_module_new(type, bn_fwd, p, fg_free) : NULL;
    if (!m) return NULL;
    m->kind = kind_batchnorm;
    p->eps = eps > 0 ? eps : 1e-5;
    p->momentum = momentum;
    p->ndim_lo = lo;
    p->ndim_hi = hi;
    bool ok = true;
    if (affine) {
        p->w = fg_module_add_param(m, "weight", dt, 1, &c, &(fg_init){FG_INIT_ONES, 0, 0});
        p->b = p->w ? fg_module_add_param(m, "bias", dt, 1, &c, NULL) : NULL;
        ok = p->b != NULL;
    }
    if (ok && track) {
        int64_t one = 1;
        p->rm = fg_module_add_buffer(m, "running_mean", dt, 1, &c, NULL);
        p->rv = p->rm ? fg_module_add_buffer(m, "running_var", dt, 1, &c,
                                             &(fg_init){FG_INIT_ONES, 0, 0})
                      : NULL;
        p->nbt = p->rv ? fg_module_add_buffer(m, "num_batches_tracked", dt, 0, &one, NULL) : NULL;
        ok = p->nbt != NULL;
    }
    if (!ok) {
        fg_module_free(m);
        return NULL;
    }
    return m;
}

fg_module *fg_batch_norm2d_new(int64_t num_features, double eps, double momentum, bool affine,
                               bool track_running_stats, fg_dtype dt) {
    return bn_new("BatchNorm2d", 4, 4, num_features, eps, momentum, affine, track_running_stats,
                  dt);
}

fg_module *fg_batch_norm1d_new(int64_t num_features, double eps, double momentum, bool affine,
                               bool track_running_stats, fg_dtype dt) {
    return bn_new("BatchNorm1d", 2, 3, num_features, eps, momentum, affine, track_running_stats,
                  dt);
}

static int convert_sync(fg_module *m, const fg_stats_reduce *r) {
    int n = 0;
    if (m->kind == kind_batchnorm) {
        bn_ud *p = m->ud;
        const char *type = r ? "SyncBatchNorm" : p->ndim_lo == 4 ? "BatchNorm2d" : "BatchNorm1d";
        char *t = fg_strdup(type);
        if (t) {
            fg_free(m->type);
            m->type = t;
        }
        p->sync = r;
        n++;
    }
    for (int i = 0; i < m->nchild; i++) n += convert_sync(m->child[i], r);
    return n;
}

int fg_module_convert_sync_batchnorm(fg_module *m, const fg_stats_reduce *r) {
    return m ? convert_sync(m, r) : 0;
}
