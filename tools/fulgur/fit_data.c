/* fulgur fit's datasets: --data (and --val-data, or the last --val-fraction
 * of --data) as a char-level text dataset, a uint16 token file (.bin) or, for
 * mlp, .npy inputs with --labels or a CSV/TSV with its label and feature
 * columns (fg_csv_dataset_new). Every rank opens the same files the same
 * way, so the splits agree without communication. The mlp's class count
 * (max label + 1) is held to the labels seen (at most twice the distinct
 * labels past 4096 classes) and to the machine's memory. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fit.h"

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

bool fit_is_csv(const fit_opts *o, const char *path) {
    if (o->reader && strcmp(o->reader, "auto")) return !strcmp(o->reader, "csv");
    return ends_with(path, ".csv") || ends_with(path, ".tsv") || ends_with(path, ".csv.gz") ||
           ends_with(path, ".tsv.gz");
}

bool fit_is_images(const fit_opts *o) { return o->reader && !strcmp(o->reader, "imagefolder"); }

fg_dataset *fit_mlp_dataset(const fit_opts *o, const char *path, const char *labels) {
    if (fit_is_images(o)) /* the flips on --data's images only (torchvision's train transform) */
        return fg_image_folder_new(
            path, &(fg_image_folder_opts){.resize = o->image_size,
                                          .crop = o->image_size,
                                          .random_flip = o->random_flip && path == o->data,
                                          .seed = (uint64_t)o->seed});
    if (!fit_is_csv(o, path)) return fg_npy_dataset_new(path, labels);
    /* --feature-columns a,b,c: the names, split at the commas */
    const char *names[256];
    int nf = 0;
    char *list = o->feature_columns ? strdup(o->feature_columns) : NULL;
    if (o->feature_columns && !list) {
        fg_error(FG_ENOMEM, "--feature-columns");
        return NULL;
    }
    for (char *save = NULL, *tok = list ? strtok_r(list, ",", &save) : NULL; tok;
         tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ') tok++;
        if (nf == 256) {
            free(list);
            fg_error(FG_EINVAL, "--feature-columns: at most 256 names");
            return NULL;
        }
        names[nf++] = tok;
    }
    fg_dataset *ds = fg_csv_dataset_new(path, &(fg_csv_opts){.no_header = o->no_header,
                                                             .label = o->label_column,
                                                             .features = nf ? names : NULL,
                                                             .nfeatures = nf});
    free(list);
    if (ds && fg_dataset_y_spec(ds)->dtype != FG_I32) {
        fg_error(FG_EINVAL,
                 "%s: the label column \"%s\" holds floats: mlp labels are class ids (integers "
                 "or categories); choose the label with --label-column",
                 path, fg_csv_dataset_label(ds));
        fg_dataset_free(ds);
        return NULL;
    }
    return ds;
}

/* The labels of the mlp's datasets, for the class count: max label + 1,
 * held to what the labels support. */
typedef struct label_scan {
    int32_t *v; /* every label seen, train and val */
    int64_t n, cap;
    int32_t max; /* the largest label, first at max_row of max_file */
    int64_t max_row;
    const char *max_file;
} label_scan;

static FG_MUST_USE fg_status scan_labels(fg_dataset *ds, const char *file, label_scan *ls) {
    size_t xb = fg_sample_spec_bytes(fg_dataset_x_spec(ds));
    float *x = fg_alloc(xb ? xb : 4);
    if (!x) return FG_ENOMEM;
    int64_t len = fg_dataset_len(ds);
    if (ls->n + len > ls->cap) {
        int64_t cap = ls->n + len;
        int32_t *v = fg_alloc((size_t)(cap ? cap : 1) * sizeof *v);
        if (!v) {
            fg_free(x);
            return FG_ENOMEM;
        }
        if (ls->n) memcpy(v, ls->v, (size_t)ls->n * sizeof *v);
        fg_free(ls->v);
        ls->v = v;
        ls->cap = cap;
    }
    int32_t y;
    for (int64_t i = 0; i < len; i++) {
        fg_status s = fg_dataset_get(ds, i, x, &y);
        if (s != FG_OK) {
            fg_free(x);
            return s;
        }
        if (y < 0) {
            fg_free(x);
            return fg_error(FG_EFORMAT,
                            "%s: label %d at row %lld is negative: mlp labels are class ids "
                            "0..C-1",
                            file, (int)y, (long long)i);
        }
        if (ls->n == 0 || y > ls->max) ls->max = y, ls->max_row = i, ls->max_file = file;
        ls->v[ls->n++] = y;
    }
    fg_free(x);
    return FG_OK;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Past this many classes, the class count must be at most twice the labels
 * seen: one label of 50,000,000 would otherwise build a model of 450M
 * parameters for 3 classes. Below it, gaps cost little. */
#define CLASSES_FLOOR 4096

/* The class count of the labels seen, or an error naming the label that
 * makes it too many for the labels seen or for this machine's memory. */
static FG_MUST_USE fg_status class_count(const fit_opts *o, label_scan *ls, int64_t *classes) {
    if (ls->n == 0) return FG_OK;
    int64_t c = (int64_t)ls->max + 1, distinct = 0;
    if (c > CLASSES_FLOOR) { /* the sort only where the rule needs it */
        qsort(ls->v, (size_t)ls->n, sizeof *ls->v, cmp_i32);
        for (int64_t i = 0; i < ls->n; i++) distinct += i == 0 || ls->v[i] != ls->v[i - 1];
    }
    if (c > CLASSES_FLOOR && c > 2 * distinct)
        return fg_error(FG_EINVAL,
                        "%s: label %d at row %lld makes %lld classes, but the labels hold only "
                        "%lld distinct values: mlp labels are class ids 0..C-1; renumber them "
                        "densely (0..%lld), or check that the file holds labels",
                        ls->max_file, (int)ls->max, (long long)ls->max_row, (long long)c,
                        (long long)distinct, (long long)distinct - 1);
    /* the output layer's weights, gradients and AdamW's two moments, in f32
     * at least: what the class count alone costs */
    double params = ((double)o->hidden + 1.0) * (double)c;
    double need = params * 4.0 * 4.0;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    double have = pages > 0 && page > 0 ? (double)pages * (double)page : 0;
    if (have > 0 && need > have)
        return fg_error(FG_ENOMEM,
                        "%s: label %d at row %lld makes %lld classes: the output layer's %.0f "
                        "parameters need %.1f GB with their gradients and optimizer state, more "
                        "than this machine's %.1f GB; use fewer classes or a smaller --hidden",
                        ls->max_file, (int)ls->max, (long long)ls->max_row, (long long)c, params,
                        need / 1e9, have / 1e9);
    *classes = c;
    return FG_OK;
}

fg_status fit_data_open(const fit_opts *o, fit_data *d) {
    memset(d, 0, sizeof *d);
    fg_status s = FG_OK;
    if (o->kind == FIT_GPT) {
        bool tokens =
            !strcmp(o->reader, "auto") ? ends_with(o->data, ".bin") : !strcmp(o->reader, "tokens");
        d->base = tokens ? fg_token_dataset_new(o->data, o->ctx, 0)
                         : fg_text_dataset_new(o->data, o->ctx, NULL);
        if (!d->base) return fg_error_wrap(FG_EINVAL, "--data=%s", o->data);
        d->vocab = fg_dataset_vocab_size(d->base);
        d->text_vocab = tokens ? NULL : fg_text_dataset_vocab(d->base);
        if (o->val_data) {
            d->val_base = tokens ? fg_token_dataset_new(o->val_data, o->ctx, d->vocab)
                                 : fg_text_dataset_new(o->val_data, o->ctx, d->text_vocab);
            if (!d->val_base) {
                s = fg_error_wrap(FG_EINVAL, "--val-data=%s", o->val_data);
                goto fail;
            }
        }
    } else {
        d->base = fit_mlp_dataset(o, o->data, o->labels);
        if (!d->base)
            return fit_is_csv(o, o->data)
                       ? fg_error_wrap(fg_last_status() ? fg_last_status() : FG_EINVAL, "--data=%s",
                                       o->data)
                       : fg_error_wrap(FG_EINVAL, "--data=%s --labels=%s", o->data, o->labels);
        d->in_dim = fg_sample_spec_numel(fg_dataset_x_spec(d->base));
        if (o->val_data) {
            d->val_base = fit_mlp_dataset(o, o->val_data, o->val_labels);
            if (!d->val_base) {
                s = fg_error_wrap(FG_EINVAL, "--val-data=%s", o->val_data);
                goto fail;
            }
            if (fg_sample_spec_numel(fg_dataset_x_spec(d->val_base)) != d->in_dim) {
                s = fg_error(FG_EINVAL, "--val-data=%s: %lld inputs per sample, --data has %lld",
                             o->val_data,
                             (long long)fg_sample_spec_numel(fg_dataset_x_spec(d->val_base)),
                             (long long)d->in_dim);
                goto fail;
            }
        }
    }
    if (d->val_base) {
        d->train = fg_dataset_subset(d->base, 0, fg_dataset_len(d->base));
        d->val = fg_dataset_subset(d->val_base, 0, fg_dataset_len(d->val_base));
        if (!d->train || !d->val) {
            s = FG_ENOMEM;
            goto fail;
        }
    } else if ((s = fg_dataset_split(d->base, o->val_fraction, &d->train, &d->val)) != FG_OK) {
        s = fg_error_wrap(s, "--data=%s with --val-fraction=%g", o->data, o->val_fraction);
        goto fail;
    }
    if (o->kind == FIT_MLP && fit_is_images(o)) {
        /* the class folders: no image decoded to count them */
        d->classes = fg_image_folder_num_classes(d->base);
        int64_t vc = d->val_base ? fg_image_folder_num_classes(d->val_base) : d->classes;
        for (int64_t k = 0; vc == d->classes && k < vc; k++)
            if (strcmp(fg_image_folder_class(d->base, k),
                       fg_image_folder_class(d->val_base ? d->val_base : d->base, k)))
                vc = -1;
        if (vc != d->classes) {
            s = fg_error(
                FG_EINVAL,
                "--val-data=%s: its class folders are not --data's (%lld classes: %s, ...)",
                o->val_data, (long long)d->classes, fg_image_folder_class(d->base, 0));
            goto fail;
        }
    } else if (o->kind == FIT_MLP) {
        label_scan ls = {0};
        s = scan_labels(d->base, o->labels ? o->labels : "--labels", &ls);
        if (s == FG_OK && d->val_base)
            s = scan_labels(d->val_base, o->val_labels ? o->val_labels : "--val-labels", &ls);
        if (s == FG_OK) s = class_count(o, &ls, &d->classes);
        fg_free(ls.v);
        if (s != FG_OK) goto fail;
    }
    return FG_OK;
fail:
    fit_data_free(d);
    return s;
}

void fit_data_free(fit_data *d) {
    fg_dataset_free(d->train);
    fg_dataset_free(d->val);
    fg_dataset_free(d->val_base);
    fg_dataset_free(d->base);
    memset(d, 0, sizeof *d);
}
