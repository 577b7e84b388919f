/* IDX files (LeCun's MNIST layout): 0, 0, a type byte (0x08 = unsigned byte,
 * the only one MNIST uses and the only one read here), a dimension count,
 * then big-endian uint32 dimensions and the data. Images become f32 in
 * [0, 1], flattened; labels int32. Both files stay mapped. */
#include <string.h>

#include "data_impl.h"

typedef struct idx {
    fg__map map;
    int ndim;
    int64_t dims[FG_MAX_DIMS];
    int64_t numel;
    const uint8_t *data;
} idx;

static FG_MUST_USE fg_status idx_open(const char *path, idx *a, int min_ndim, int max_ndim,
                                      const char *role) {
    *a = (idx){0};
    FG_TRY(fg__map_file(path, &a->map));
    const uint8_t *p = a->map.p;
    size_t len = a->map.len;
    fg_status st;
    if (len >= 2 && p[0] == 0x1f && p[1] == 0x8b) {
        st = fg_error(FG_EFORMAT, "%s: a gzip file: gunzip it first (IDX %s are read raw)", path,
                      role);
        goto fail;
    }
    if (len < 4 || p[0] != 0 || p[1] != 0) {
        st = fg_error(FG_EFORMAT, "%s: bad magic: not an IDX file", path);
        goto fail;
    }
    if (p[2] != 0x08) {
        st = fg_error(FG_EFORMAT,
                      "%s: IDX element type 0x%02x is not supported (expected 0x08, "
                      "unsigned bytes)",
                      path, p[2]);
        goto fail;
    }
    a->ndim = p[3];
    if (a->ndim < min_ndim || a->ndim > max_ndim) {
        st = fg_error(FG_EFORMAT, "%s: IDX %s with %d dimensions (expected %d..%d)", path, role,
                      a->ndim, min_ndim, max_ndim);
        goto fail;
    }
    size_t hdr = 4 + 4 * (size_t)a->ndim;
    if (len < hdr) {
        st = fg_error(FG_EFORMAT, "%s: truncated inside the IDX header", path);
        goto fail;
    }
    int64_t n = 1;
    for (int i = 0; i < a->ndim; i++) {
        a->dims[i] = fg__be32(p + 4 + 4 * i);
        if (a->dims[i] && n > INT64_MAX / a->dims[i]) {
            st = fg_error(FG_EFORMAT, "%s: IDX dimensions overflow", path);
            goto fail;
        }
        n *= a->dims[i];
    }
    a->numel = n;
    a->data = p + hdr;
    if ((uint64_t)n > len - hdr) {
        st = fg_error(FG_EFORMAT, "%s: truncated: the dimensions need %lld bytes, the file has %zu",
                      path, (long long)n, len - hdr);
        goto fail;
    }
    return FG_OK;
fail:
    fg__unmap(&a->map);
    return st;
}

typedef struct idx_ds {
    idx img, lab;
    int64_t row;
} idx_ds;

static int64_t idx_len(void *ud) { return ((idx_ds *)ud)->img.dims[0]; }

static void idx_spec(void *ud, fg_sample_spec *x, fg_sample_spec *y) {
    idx_ds *d = ud;
    *x = (fg_sample_spec){.dtype = FG_F32, .ndim = 1, .shape = {d->row}};
    *y = (fg_sample_spec){.dtype = FG_I32, .ndim = 0};
}

static FG_MUST_USE fg_status idx_get(void *ud, int64_t i, void *x_out, void *y_out) {
    idx_ds *d = ud;
    const uint8_t *p = d->img.data + i * d->row;
    float *x = x_out;
    for (int64_t k = 0; k < d->row; k++) x[k] = (float)p[k] * (1.0f / 255.0f);
    *(int32_t *)y_out = d->lab.data[i];
    return FG_OK;
}

static void idx_free(void *ud) {
    idx_ds *d = ud;
    if (!d) return;
    fg__unmap(&d->img.map);
    fg__unmap(&d->lab.map);
    fg_free(d);
}

fg_status fg__idx_dataset_open(const char *images_path, const char *labels_path, fg_dataset **out) {
    if (!images_path || !labels_path) {
        return fg_error(FG_EINVAL,
                        "fg_idx_dataset_new: NULL path (images and labels are both needed)");
    }
    *out = NULL;
    fg_status st;
    idx_ds *d = fg_calloc(1, sizeof *d);
    if (!d) return FG_ENOMEM;
    if ((st = idx_open(images_path, &d->img, 2, FG_MAX_DIMS, "images")) != FG_OK) goto fail;
    if ((st = idx_open(labels_path, &d->lab, 1, 1, "labels")) != FG_OK) goto fail;
    if (d->lab.dims[0] != d->img.dims[0]) {
        st = fg_error(FG_EFORMAT, "%s: %lld labels, but %s has %lld images", labels_path,
                      (long long)d->lab.dims[0], images_path, (long long)d->img.dims[0]);
        goto fail;
    }
    d->row = 1;
    for (int i = 1; i < d->img.ndim; i++) {
        if (d->img.dims[i] && d->row > INT64_MAX / 8 / d->img.dims[i]) {
            st = fg_error(FG_EFORMAT, "%s: IDX dimensions overflow", images_path);
            goto fail;
        }
        d->row *= d->img.dims[i];
    }
    static const fg_dataset_ops ops = {idx_len, idx_spec, idx_get, idx_free};
    *out = fg_dataset_new(&ops, d, "idx"); /* frees d on failure */
    return *out ? FG_OK : FG_ENOMEM;
fail:
    idx_free(d);
    return st;
}

fg_dataset *fg_idx_dataset_new(const char *images_path, const char *labels_path) {
    fg_dataset *ds = NULL;
    return fg__idx_dataset_open(images_path, labels_path, &ds) == FG_OK ? ds : NULL;
}
