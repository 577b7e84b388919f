/* fulgur fit's datasets: --data (and --val-data, or the last --val-fraction
 * of --data) as a char-level text dataset, a uint16 token file (.bin) or, for
 * mlp, .npy inputs with --labels. Every rank opens the same files the same
 * way, so the splits agree without communication. */
#include <string.h>

#include "fit.h"

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* max label + 1 of an npy dataset (labels are scalar i32). */
static fg_status max_class(fg_dataset *ds, int64_t *classes) {
    size_t xb = fg_sample_spec_bytes(fg_dataset_x_spec(ds));
    float *x = fg_alloc(xb ? xb : 4);
    if (!x) return FG_ENOMEM;
    int32_t y;
    for (int64_t i = 0; i < fg_dataset_len(ds); i++) {
        fg_status s = fg_dataset_get(ds, i, x, &y);
        if (s != FG_OK) {
            fg_free(x);
            return s;
        }
        if (y < 0) {
            fg_free(x);
            return fg_error(FG_EFORMAT,
                            "label %d of sample %lld is negative: mlp labels are "
                            "class ids 0..C-1",
                            (int)y, (long long)i);
        }
        if (y + 1 > *classes) *classes = y + 1;
    }
    fg_free(x);
    return FG_OK;
}

fg_status fit_data_open(const fit_opts *o, fit_data *d) {
    memset(d, 0, sizeof *d);
    fg_status s = FG_OK;
    if (o->kind == FIT_GPT) {
        bool tokens = ends_with(o->data, ".bin");
        d->base = tokens ? fg_token_dataset_new(o->data, o->ctx, 0)
                         : fg_text_dataset_new(o->data, o->ctx, NULL);
        if (!d->base) return fg_error_wrap(FG_EINVAL, "--data=%s", o->data);
        d->vocab = fg_dataset_vocab_size(d->base);
        d->text_vocab = tokens ? NULL : fg_text_dataset_vocab(d->base);
        if (o->val_data) {
            d->val_base = ends_with(o->val_data, ".bin")
                              ? fg_token_dataset_new(o->val_data, o->ctx, d->vocab)
                              : fg_text_dataset_new(o->val_data, o->ctx, d->text_vocab);
            if (!d->val_base) {
                s = fg_error_wrap(FG_EINVAL, "--val-data=%s", o->val_data);
                goto fail;
            }
        }
    } else {
        d->base = fg_npy_dataset_new(o->data, o->labels);
        if (!d->base) return fg_error_wrap(FG_EINVAL, "--data=%s --labels=%s", o->data, o->labels);
        d->in_dim = fg_sample_spec_numel(fg_dataset_x_spec(d->base));
        if (o->val_data) {
            d->val_base = fg_npy_dataset_new(o->val_data, o->val_labels);
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
    if (o->kind == FIT_MLP) {
        if ((s = max_class(d->base, &d->classes)) != FG_OK) goto fail;
        if (d->val_base && (s = max_class(d->val_base, &d->classes)) != FG_OK) goto fail;
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
