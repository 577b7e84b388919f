/* GroupNorm, RMSNorm, InstanceNorm2d and ConvTranspose2d as modules, with
 * PyTorch's parameter and buffer names (weight, bias; running_mean,
 * running_var, num_batches_tracked, a float buffer as BatchNorm's) and
 * initialisation (norms: weight 1, bias 0; ConvTranspose2d: U(-1/sqrt(fan_in),
 * 1/sqrt(fan_in)) with PyTorch's fan_in of its (in, out / groups, KH, KW)
 * weight, its dim 1 times the kernel). */
#include <math.h>

#include "nn_impl.h"

typedef struct norm_ud {
    fg_tensor *w, *b, *rm, *rv, *nbt;
    double eps, momentum;
    int64_t groups;
    int kind; /* 0 group, 1 rms, 2 instance */
} norm_ud;

static fg_tensor *norm_fwd(fg_module *m, fg_tensor *x, void *ud) {
    norm_ud *p = ud;
    if (p->kind == 0) return fg_group_norm(x, p->groups, p->w, p->b, p->eps);
    if (p->kind == 1) return fg_rms_norm(x, 1, p->w, p->eps);
    if (fg_tensor_ndim(x) != 4) {
        char s[96];
        fg_error(FG_EINVAL, "InstanceNorm2d: input %s: expected (N, C, H, W)",
                 fg_tensor_describe(x, s, sizeof s));
        return NULL;
    }
    bool stats = m->training || !p->rm;
    if (m->training && p->nbt && fg_tensor_fill(p->nbt, fg_item(p->nbt) + 1) != FG_OK) return NULL;
    return fg_instance_norm(x, p->rm, p->rv, p->w, p->b, stats, p->momentum, p->eps);
}

static fg_module *norm_new(const char *type, norm_ud q, int64_t c, bool affine, bool bias,
                           bool track, fg_dtype dt) {
    if (fg__model_dtype(dt, type, &dt) != FG_OK) return NULL;
    norm_ud *p = fg_calloc(1, sizeof *p);
    fg_module *m = p ? fg_module_new(type, norm_fwd, p, fg_free) : NULL;
    if (!m) return NULL;
    *p = q;
    bool ok = true;
    if (affine) {
        p->w = fg_module_add_param(m, "weight", dt, 1, &c, &(fg_init){FG_INIT_ONES, 0, 0});
        ok = p->w != NULL;
        if (ok && bias) ok = (p->b = fg_module_add_param(m, "bias", dt, 1, &c, NULL)) != NULL;
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

fg_module *fg_group_norm_new(int64_t num_groups, int64_t num_channels, double eps, bool affine,
                             fg_dtype dt) {
    if (num_groups < 1 || num_channels < 1 || num_channels % num_groups) {
        fg_error(FG_EINVAL,
                 "group_norm_new: %lld groups, %lld channels: expected sizes > 0 and channels a "
                 "multiple of groups",
                 (long long)num_groups, (long long)num_channels);
        return NULL;
    }
    norm_ud q = {.eps = eps > 0 ? eps : 1e-5, .groups = num_groups, .kind = 0};
    return norm_new("GroupNorm", q, num_channels, affine, true, false, dt);
}

fg_module *fg_rms_norm_new(int64_t dim, double eps, bool affine, fg_dtype dt) {
    if (dim < 1) {
        fg_error(FG_EINVAL, "rms_norm_new: dim = %lld: expected > 0", (long long)dim);
        return NULL;
    }
    norm_ud q = {.eps = eps, .kind = 1};
    return norm_new("RMSNorm", q, dim, affine, false, false, dt);
}

fg_module *fg_instance_norm2d_new(int64_t num_features, double eps, double momentum, bool affine,
                                  bool track_running_stats, fg_dtype dt) {
    if (num_features < 1 || !(momentum >= 0 && momentum <= 1)) {
        fg_error(FG_EINVAL,
                 "instance_norm2d_new: num_features %lld, momentum %g: expected > 0 and [0, 1]",
                 (long long)num_features, momentum);
        return NULL;
    }
    norm_ud q = {.eps = eps > 0 ? eps : 1e-5, .momentum = momentum, .kind = 2};
    return norm_new("InstanceNorm2d", q, num_features, affine, true, track_running_stats, dt);
}

/* ------------------------------------------------------- ConvTranspose2d */

typedef struct convt_ud {
    fg_tensor *w, *b;
    fg_conv_transpose2d_opts o;
} convt_ud;

static fg_tensor *convt_fwd(fg_module *m, fg_tensor *x, void *ud) {
    (void)m;
    convt_ud *p = ud;
    return fg_conv_transpose2d(x, p->w, p->b, &p->o);
}

fg_module *fg_conv_transpose2d_new(int64_t in, int64_t out, const int64_t kernel[2],
                                   const fg_conv_transpose2d_opts *o, bool bias, fg_dtype dt) {
    int64_t groups = o && o->groups ? o->groups : 1;
    if (in <= 0 || out <= 0 || groups < 1 || in % groups || out % groups || !kernel ||
        kernel[0] <= 0 || kernel[1] <= 0) {
        fg_error(FG_EINVAL,
                 "ConvTranspose2d: in %lld, out %lld, groups %lld: expected sizes > 0, a kernel "
                 "of two sizes > 0 and channels that are multiples of groups",
                 (long long)in, (long long)out, (long long)groups);
        return NULL;
    }
    if (fg__model_dtype(dt, "ConvTranspose2d", &dt) != FG_OK) return NULL;
    convt_ud *p = fg_calloc(1, sizeof *p);
    fg_module *m = p ? fg_module_new("ConvTranspose2d", convt_fwd, p, fg_free) : NULL;
    if (!m) return NULL;
    if (o) p->o = *o;
    int64_t shape[4] = {in, out / groups, kernel[0], kernel[1]};
    double bound = 1.0 / sqrt((double)(out / groups) * (double)kernel[0] * (double)kernel[1]);
    fg_init u = {FG_INIT_UNIFORM, -bound, bound};
    p->w = fg_module_add_param(m, "weight", dt, 4, shape, &u);
    if (p->w && bias) p->b = fg_module_add_param(m, "bias", dt, 1, &out, &u);
    if (!p->w || (bias && !p->b)) {
        fg_module_free(m);
        return NULL;
    }
    return m;
}
