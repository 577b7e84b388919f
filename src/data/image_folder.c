/* The image-folder dataset (torchvision's ImageFolder): the tree's classes
 * and files listed as torchvision's make_dataset lists them, PNG decoded by
 * libspng and JPEG by libjpeg-turbo to 8-bit RGB, then torchvision's
 * transforms done in get (so in the loader's worker threads): Resize with
 * PIL's bilinear resampling (its Resample.c, bit for bit: filter support
 * scaled on downsampling, 22-bit fixed-point weights, a horizontal then a
 * vertical 8-bit pass), CenterCrop or RandomCrop, RandomHorizontalFlip,
 * ToTensor and Normalize in f32. */
#include <ctype.h>
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <spng.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* after stdio.h, which it needs */
#include <jpeglib.h>

#include "data_impl.h"

typedef struct img_sample {
    char *path;
    int32_t label;
} img_sample;

typedef struct img_ds {
    fg_image_folder_opts o;
    char **classes;
    int64_t nclasses;
    img_sample *s;
    int64_t n, cap;
    int64_t out_h, out_w; /* every sample's size after the transforms */
    bool normalize;
    atomic_llong epoch;
} img_ds;

static const fg_dataset_ops img_ops;

static img_ds *as_img(const fg_dataset *ds) {
    return ds && ds->ops.get == img_ops.get ? (img_ds *)ds->ud : NULL;
}

/* ------------------------------------------------------------ the tree */

static bool is_image(const char *name) {
    const char *dot = strrchr(name, '.');
    if (!dot) return false;
    char ext[8];
    size_t n = strlen(dot + 1);
    if (n >= sizeof ext) return false;
    for (size_t i = 0; i <= n; i++) ext[i] = (char)tolower((unsigned char)dot[1 + i]);
    return !strcmp(ext, "png") || !strcmp(ext, "jpg") || !strcmp(ext, "jpeg");
}

static bool is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode); /* links followed, as followlinks=True */
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The sorted entries of a folder: its sub-folders or its image files. */
static FG_MUST_USE fg_status list_dir(const char *dir, bool dirs, char ***out, int64_t *n) {
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return fg_error(FG_EIO, "image folder %s: cannot read it", dir);
    int64_t cap = 0;
    fg_status s = FG_OK;
    for (struct dirent *e; (e = readdir(d)) && s == FG_OK;) {
        if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2])))
            continue;
        size_t len = strlen(dir) + strlen(e->d_name) + 2;
        char *full = fg_alloc(len);
        if (!full) {
            s = FG_ENOMEM;
            break;
        }
        snprintf(full, len, "%s/%s", dir, e->d_name);
        bool sub = is_dir(full);
        fg_free(full);
        if (dirs ? !sub : (sub || !is_image(e->d_name))) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            char **p = fg_realloc(*out, (size_t)cap * sizeof *p);
            if (!p) {
                s = FG_ENOMEM;
                break;
            }
            *out = p;
        }
        if (!((*out)[*n] = fg_strdup(e->d_name))) s = FG_ENOMEM;
        else (*n)++;
    }
    closedir(d);
    if (*n) qsort(*out, (size_t)*n, sizeof **out, cmp_str);
    return s;
}

static void free_list(char **l, int64_t n) {
    for (int64_t i = 0; i < n; i++) fg_free(l[i]);
    fg_free(l);
}

static FG_MUST_USE fg_status add_sample(img_ds *d, const char *dir, const char *name,
                                        int32_t label) {
    if (d->n == d->cap) {
        int64_t cap = d->cap ? 2 * d->cap : 64;
        img_sample *p = fg_realloc(d->s, (size_t)cap * sizeof *p);
        if (!p) return FG_ENOMEM;
        d->s = p;
        d->cap = cap;
    }
    size_t len = strlen(dir) + strlen(name) + 2;
    char *path = fg_alloc(len);
    if (!path) return FG_ENOMEM;
    snprintf(path, len, "%s/%s", dir, name);
    d->s[d->n++] = (img_sample){path, label};
    return FG_OK;
}

/* torchvision: sorted(os.walk(dir)), each folder's sorted names: the
 * folders in the order of their paths, the files of one together. */
typedef struct dir_list {
    char **v;
    int64_t n, cap;
} dir_list;

static FG_MUST_USE fg_status walk_dirs(const char *dir, dir_list *out, int depth) {
    if (depth > 64) return fg_error(FG_EFORMAT, "image folder %s: nested past 64 levels", dir);
    if (out->n == out->cap) {
        int64_t cap = out->cap ? 2 * out->cap : 16;
        char **p = fg_realloc(out->v, (size_t)cap * sizeof *p);
        if (!p) return FG_ENOMEM;
        out->v = p;
        out->cap = cap;
    }
    if (!(out->v[out->n] = fg_strdup(dir))) return FG_ENOMEM;
    out->n++;
    char **subs;
    int64_t ns;
    fg_status s = list_dir(dir, true, &subs, &ns);
    for (int64_t i = 0; i < ns && s == FG_OK; i++) {
        size_t len = strlen(dir) + strlen(subs[i]) + 2;
        char *full = fg_alloc(len);
        if (!full) {
            s = FG_ENOMEM;
            break;
        }
        snprintf(full, len, "%s/%s", dir, subs[i]);
        s = walk_dirs(full, out, depth + 1);
        fg_free(full);
    }
    free_list(subs, ns);
    return s;
}

static FG_MUST_USE fg_status list_class(img_ds *d, const char *dir, int32_t label) {
    dir_list dl = {0};
    fg_status s = walk_dirs(dir, &dl, 0);
    if (s == FG_OK && dl.n) qsort(dl.v, (size_t)dl.n, sizeof *dl.v, cmp_str);
    for (int64_t i = 0; i < dl.n && s == FG_OK; i++) {
        char **files;
        int64_t nf;
        s = list_dir(dl.v[i], false, &files, &nf);
        for (int64_t k = 0; k < nf && s == FG_OK; k++) s = add_sample(d, dl.v[i], files[k], label);
        free_list(files, nf);
    }
    free_list(dl.v, dl.n);
    return s;
}

/* ------------------------------------------------------------ decoding */

static FG_MUST_USE fg_status read_file(const char *path, unsigned char **buf, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return fg_error(FG_EIO, "image %s: cannot open it", path);
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    if (n <= 0 || n > (1L << 30)) {
        fclose(fp);
        return fg_error(FG_EFORMAT, "image %s: empty or over 1 GiB", path);
    }
    *buf = fg_alloc((size_t)n);
    if (!*buf) {
        fclose(fp);
        return FG_ENOMEM;
    }
    size_t got = fread(*buf, 1, (size_t)n, fp);
    fclose(fp);
    if (got != (size_t)n) {
        fg_free(*buf);
        return fg_error(FG_EIO, "image %s: short read", path);
    }
    *len = (size_t)n;
    return FG_OK;
}

static FG_MUST_USE fg_status decode_png(const char *path, const unsigned char *buf, size_t len,
                                        unsigned char **rgb, int64_t *w, int64_t *h) {
    spng_ctx *ctx = spng_ctx_new(0);
    if (!ctx) return FG_ENOMEM;
    struct spng_ihdr ihdr;
    size_t size = 0;
    int e = spng_set_png_buffer(ctx, buf, len);
    if (!e) e = spng_get_ihdr(ctx, &ihdr);
    if (!e) e = spng_decoded_image_size(ctx, SPNG_FMT_RGB8, &size);
    if (!e && !(*rgb = fg_alloc(size ? size : 1))) {
        spng_ctx_free(ctx);
        return FG_ENOMEM;
    }
    if (!e) e = spng_decode_image(ctx, *rgb, size, SPNG_FMT_RGB8, 0);
    spng_ctx_free(ctx);
    if (e) {
        if (size) fg_free(*rgb);
        *rgb = NULL;
        return fg_error(FG_EFORMAT, "image %s: not a PNG libspng decodes (%s)", path,
                        spng_strerror(e));
    }
    *w = ihdr.width;
    *h = ihdr.height;
    return FG_OK;
}

typedef struct jerr_mgr {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char msg[JMSG_LENGTH_MAX];
} jerr_mgr;

static void jpeg_fail(j_common_ptr c) {
    jerr_mgr *e = (jerr_mgr *)c->err;
    (*c->err->format_message)(c, e->msg);
    longjmp(e->jump, 1);
}

static FG_MUST_USE fg_status decode_jpeg(const char *path, const unsigned char *buf, size_t len,
                                         unsigned char **rgb, int64_t *w, int64_t *h) {
    struct jpeg_decompress_struct cinfo;
    jerr_mgr jerr;
    unsigned char *volatile out = NULL;
    cinfo.err = jpeg_std_error(&jerr.pub);
    jerr.pub.error_exit = jpeg_fail;
    if (setjmp(jerr.jump)) {
        jpeg_destroy_decompress(&cinfo);
        fg_free(out);
        return fg_error(FG_EFORMAT, "image %s: not a JPEG libjpeg decodes (%s)", path, jerr.msg);
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, buf, (unsigned long)len);
    jpeg_read_header(&cinfo, TRUE);
    cinfo.out_color_space = JCS_RGB; /* grayscale replicated, as PIL's convert("RGB") */
    jpeg_start_decompress(&cinfo);
    size_t row = (size_t)cinfo.output_width * 3;
    out = fg_alloc(row * cinfo.output_height + 1);
    if (!out) {
        jpeg_destroy_decompress(&cinfo);
        return FG_ENOMEM;
    }
    while (cinfo.output_scanline < cinfo.output_height) {
        JSAMPROW r = out + row * cinfo.output_scanline;
        jpeg_read_scanlines(&cinfo, &r, 1);
    }
    *w = cinfo.output_width;
    *h = cinfo.output_height;
    jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    *rgb = out;
    return FG_OK;
}

static FG_MUST_USE fg_status decode(const char *path, unsigned char **rgb, int64_t *w, int64_t *h) {
    unsigned char *buf = NULL;
    size_t len = 0;
    FG_TRY(read_file(path, &buf, &len));
    fg_status s;
    if (len >= 8 && !memcmp(buf, "\x89PNG\r\n\x1a\n", 8)) s = decode_png(path, buf, len, rgb, w, h);
    else if (len >= 3 && buf[0] == 0xFF && buf[1] == 0xD8 && buf[2] == 0xFF)
        s = decode_jpeg(path, buf, len, rgb, w, h);
    else s = fg_error(FG_EFORMAT, "image %s: neither PNG nor JPEG (by its first bytes)", path);
    fg_free(buf);
    return s;
}

/* ---------------------------------------------- PIL's bilinear resample */

#define PRECISION_BITS (32 - 8 - 2)

static double bilinear(double x) {
    if (x < 0.0) x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* Resample.c's precompute_coeffs + normalize_coeffs_8bpc: for each output
 * position its first input, count and fixed-point weights. */
static FG_MUST_USE fg_status coeffs(int64_t in_size, int64_t out_size, int64_t **bounds, int **kk,
                                    int64_t *ksize) {
    double scale = (double)in_size / (double)out_size, filterscale = scale < 1.0 ? 1.0 : scale;
    double support = 1.0 * filterscale;
    *ksize = (int64_t)ceil(support) * 2 + 1;
    *bounds = fg_alloc((size_t)out_size * 2 * sizeof **bounds);
    double *pre = fg_alloc((size_t)(out_size * *ksize) * sizeof *pre);
    *kk = fg_alloc((size_t)(out_size * *ksize) * sizeof **kk);
    if (!*bounds || !pre || !*kk) {
        fg_free(*bounds);
        fg_free(pre);
        fg_free(*kk);
        return FG_ENOMEM;
    }
    for (int64_t xx = 0; xx < out_size; xx++) {
        double center = ((double)xx + 0.5) * scale, ww = 0.0, ss = 1.0 / filterscale;
        int64_t xmin = (int64_t)(center - support + 0.5), xmax = (int64_t)(center + support + 0.5);
        if (xmin < 0) xmin = 0;
        if (xmax > in_size) xmax = in_size;
        xmax -= xmin;
        double *k = &pre[xx * *ksize];
        int64_t x = 0;
        for (; x < xmax; x++) {
            double w = bilinear(((double)(x + xmin) - center + 0.5) * ss);
            k[x] = w;
            ww += w;
        }
        for (x = 0; x < xmax; x++)
            if (ww != 0.0) k[x] /= ww;
        for (; x < *ksize; x++) k[x] = 0;
        (*bounds)[xx * 2] = xmin;
        (*bounds)[xx * 2 + 1] = xmax;
    }
    for (int64_t i = 0; i < out_size * *ksize; i++)
        (*kk)[i] = pre[i] < 0 ? (int)(-0.5 + pre[i] * (1 << PRECISION_BITS))
                              : (int)(0.5 + pre[i] * (1 << PRECISION_BITS));
    fg_free(pre);
    return FG_OK;
}

static unsigned char clip8(int v) {
    v >>= PRECISION_BITS;
    return (unsigned char)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* in (h, w, 3) -> out (h, ow, 3) along rows, or (oh, w, 3) along columns */
static FG_MUST_USE fg_status resample(const unsigned char *in, int64_t w, int64_t h,
                                      unsigned char *out, int64_t ow, int64_t oh, bool horizontal) {
    int64_t *bounds, ksize;
    int *kk;
    FG_TRY(coeffs(horizontal ? w : h, horizontal ? ow : oh, &bounds, &kk, &ksize));
    if (horizontal) {
        for (int64_t y = 0; y < h; y++)
            for (int64_t xx = 0; xx < ow; xx++) {
                const int *k = &kk[xx * ksize];
                int64_t xmin = bounds[xx * 2], xmax = bounds[xx * 2 + 1];
                for (int c = 0; c < 3; c++) {
                    int ss = 1 << (PRECISION_BITS - 1);
                    for (int64_t x = 0; x < xmax; x++) ss += in[(y * w + x + xmin) * 3 + c] * k[x];
                    out[(y * ow + xx) * 3 + c] = clip8(ss);
                }
            }
    } else {
        for (int64_t yy = 0; yy < oh; yy++) {
            const int *k = &kk[yy * ksize];
            int64_t ymin = bounds[yy * 2], ymax = bounds[yy * 2 + 1];
            for (int64_t x = 0; x < w; x++)
                for (int c = 0; c < 3; c++) {
                    int ss = 1 << (PRECISION_BITS - 1);
                    for (int64_t y = 0; y < ymax; y++)
                        ss += in[((y + ymin) * w + x) * 3 + c] * k[y];
                    out[(yy * w + x) * 3 + c] = clip8(ss);
                }
        }
    }
    fg_free(bounds);
    fg_free(kk);
    return FG_OK;
}

/* PIL's Image.resize(size, BILINEAR): horizontal pass, then vertical. */
static FG_MUST_USE fg_status resize(unsigned char **img, int64_t *w, int64_t *h, int64_t ow,
                                    int64_t oh) {
    if (ow == *w && oh == *h) return FG_OK;
    unsigned char *cur = *img;
    if (ow != *w) {
        unsigned char *t = fg_alloc((size_t)(ow * *h * 3));
        if (!t) return FG_ENOMEM;
        fg_status s = resample(cur, *w, *h, t, ow, *h, true);
        fg_free(cur);
        cur = t;
        *img = cur;
        if (s != FG_OK) return s;
        *w = ow;
    }
    if (oh != *h) {
        unsigned char *t = fg_alloc((size_t)(*w * oh * 3));
        if (!t) return FG_ENOMEM;
        fg_status s = resample(cur, *w, *h, t, *w, oh, false);
        fg_free(cur);
        *img = t;
        if (s != FG_OK) return s;
        *h = oh;
    }
    return FG_OK;
}

/* ------------------------------------------------------------ the dataset */

static int64_t img_len(void *ud) { return ((img_ds *)ud)->n; }

static void img_spec(void *ud, fg_sample_spec *x, fg_sample_spec *y) {
    img_ds *d = ud;
    *x = (fg_sample_spec){.dtype = FG_F32, .ndim = 3, .shape = {3, d->out_h, d->out_w}};
    *y = (fg_sample_spec){.dtype = FG_I32, .ndim = 0};
}

/* The size after the resize (torchvision's Resize(int): the shorter side). */
static void resized(const fg_image_folder_opts *o, int64_t w, int64_t h, int64_t *ow, int64_t *oh) {
    *ow = w, *oh = h;
    if (o->resize) {
        int64_t s = o->resize;
        if (w <= h) *ow = s, *oh = (int64_t)((double)s * (double)h / (double)w);
        else *oh = s, *ow = (int64_t)((double)s * (double)w / (double)h);
    } else if (o->resize_h) {
        *oh = o->resize_h, *ow = o->resize_w;
    }
}

static FG_MUST_USE fg_status img_get(void *ud, int64_t i, void *x_out, void *y_out) {
    img_ds *d = ud;
    const fg_image_folder_opts *o = &d->o;
    const char *path = d->s[i].path;
    unsigned char *img = NULL;
    int64_t w, h, ow, oh;
    FG_TRY(decode(path, &img, &w, &h));
    resized(o, w, h, &ow, &oh);
    fg_status s = resize(&img, &w, &h, ow, oh);
    if (s != FG_OK) {
        fg_free(img);
        return s;
    }
    int64_t ch = o->crop ? o->crop : h, cw = o->crop ? o->crop : w, top = 0, left = 0;
    uint64_t at =
        fg_rng_derive(fg_rng_derive(o->seed, (uint64_t)atomic_load(&d->epoch)), (uint64_t)i);
    if (ch > h || cw > w || ch != d->out_h || cw != d->out_w) {
        fg_free(img);
        return fg_error(FG_EFORMAT,
                        "image %s: %lldx%lld after the resize, but the samples are %lldx%lld%s",
                        path, (long long)w, (long long)h, (long long)d->out_w, (long long)d->out_h,
                        o->crop ? ""
                                : " (give crop, or resize_h and resize_w, for images of "
                                  "several sizes)");
    }
    if (o->crop && o->random_crop) { /* RandomCrop: top, left uniform */
        top = (int64_t)(fg_rng_u32_at(at, 0) % (uint32_t)(h - ch + 1));
        left = (int64_t)(fg_rng_u32_at(at, 1) % (uint32_t)(w - cw + 1));
    } else if (o->crop) { /* CenterCrop: Python's round, half to even */
        top = (int64_t)nearbyint((double)(h - ch) / 2.0);
        left = (int64_t)nearbyint((double)(w - cw) / 2.0);
    }
    bool flip = o->random_flip && (fg_rng_u32_at(at, 2) & 1);
    float *x = x_out;
    for (int c = 0; c < 3; c++) {
        float mean = (float)o->mean[c], std = (float)o->std[c];
        for (int64_t r = 0; r < ch; r++)
            for (int64_t q = 0; q < cw; q++) {
                int64_t sq = flip ? cw - 1 - q : q;
                float v = (float)img[((top + r) * w + left + sq) * 3 + c] / 255.0f;
                if (d->normalize) v = (v - mean) / std;
                x[(c * ch + r) * cw + q] = v;
            }
    }
    fg_free(img);
    *(int32_t *)y_out = d->s[i].label;
    return FG_OK;
}

static void img_free(void *ud) {
    img_ds *d = ud;
    if (!d) return;
    for (int64_t i = 0; i < d->n; i++) fg_free(d->s[i].path);
    fg_free(d->s);
    free_list(d->classes, d->nclasses);
    fg_free(d);
}

static const fg_dataset_ops img_ops = {img_len, img_spec, img_get, img_free};

fg_dataset *fg_image_folder_new(const char *root, const fg_image_folder_opts *opts) {
    fg_image_folder_opts o = opts ? *opts : (fg_image_folder_opts){0};
    if (!root) {
        fg_error(FG_EINVAL, "image folder: NULL root");
        return NULL;
    }
    if (o.resize < 0 || o.resize_h < 0 || o.resize_w < 0 || o.crop < 0 ||
        (o.resize && (o.resize_h || o.resize_w)) || (!o.resize_h != !o.resize_w) ||
        (o.random_crop && !o.crop)) {
        fg_error(FG_EINVAL,
                 "image folder %s: resize %lld, resize_h x resize_w %lldx%lld, crop %lld%s: give "
                 "sizes >= 0, resize or both of resize_h and resize_w, and random_crop with a crop",
                 root, (long long)o.resize, (long long)o.resize_h, (long long)o.resize_w,
                 (long long)o.crop, o.random_crop ? " (random)" : "");
        return NULL;
    }
    bool norm = false;
    for (int c = 0; c < 3; c++) {
        if (o.std[c] < 0 || !isfinite(o.std[c]) || !isfinite(o.mean[c])) {
            fg_error(FG_EINVAL, "image folder %s: mean/std[%d] = %g/%g: std must be > 0", root, c,
                     o.mean[c], o.std[c]);
            return NULL;
        }
        norm = norm || o.std[c] != 0;
    }
    for (int c = 0; norm && c < 3; c++)
        if (o.std[c] == 0) {
            fg_error(FG_EINVAL, "image folder %s: std[%d] = 0 beside a non-zero std", root, c);
            return NULL;
        }
    img_ds *d = fg_calloc(1, sizeof *d);
    if (!d) {
        fg_error(FG_ENOMEM, "image folder %s", root);
        return NULL;
    }
    d->o = o;
    d->normalize = norm;
    fg_status s = list_dir(root, true, &d->classes, &d->nclasses);
    if (s == FG_OK && d->nclasses == 0)
        s = fg_error(FG_EFORMAT, "image folder %s: no class folder in it (root/<class>/<image>)",
                     root);
    for (int64_t k = 0; s == FG_OK && k < d->nclasses; k++) {
        size_t len = strlen(root) + strlen(d->classes[k]) + 2;
        char *dir = fg_alloc(len);
        if (!dir) {
            s = FG_ENOMEM;
            break;
        }
        snprintf(dir, len, "%s/%s", root, d->classes[k]);
        s = list_class(d, dir, (int32_t)k);
        fg_free(dir);
    }
    if (s == FG_OK && d->n == 0)
        s = fg_error(FG_EFORMAT, "image folder %s: no .png, .jpg or .jpeg file in its classes",
                     root);
    /* the output size: the crop, the fixed resize, or the first image's */
    if (s == FG_OK) {
        if (o.crop) d->out_h = d->out_w = o.crop;
        else if (o.resize_h) d->out_h = o.resize_h, d->out_w = o.resize_w;
        else {
            unsigned char *img = NULL;
            int64_t w, h;
            s = decode(d->s[0].path, &img, &w, &h);
            fg_free(img);
            if (s == FG_OK) resized(&o, w, h, &d->out_w, &d->out_h);
        }
    }
    if (s != FG_OK) {
        if (s == FG_ENOMEM) fg_error(FG_ENOMEM, "image folder %s", root);
        img_free(d);
        return NULL;
    }
    return fg_dataset_new(&img_ops, d, "image_folder");
}

const char *fg_image_folder_class(const fg_dataset *ds, int64_t k) {
    const img_ds *d = as_img(ds);
    return d && k >= 0 && k < d->nclasses ? d->classes[k] : NULL;
}

int64_t fg_image_folder_num_classes(const fg_dataset *ds) {
    const img_ds *d = as_img(ds);
    return d ? d->nclasses : 0;
}

const char *fg_image_folder_path(const fg_dataset *ds, int64_t i) {
    const img_ds *d = as_img(ds);
    return d && i >= 0 && i < d->n ? d->s[i].path : NULL;
}

void fg_image_folder_set_epoch(fg_dataset *ds, int64_t epoch) {
    img_ds *d = as_img(ds);
    if (d) atomic_store(&d->epoch, (long long)epoch);
}
