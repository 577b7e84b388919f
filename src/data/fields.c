/* Fields datasets: samples as small dicts of tensors. A sample is packed
 * into one fixed-size record (the lengths, then each field at its largest
 * size) so that the ordinary loader, with its samplers, workers and resume,
 * moves it; fg__fields_unpack reads a record back as fields. Invariants:
 * every off[k] and rec are multiples of 8; a record's lengths are in
 * [0, max_len] for variable fields and shape[0] (1 for a scalar) otherwise. */
#include <string.h>

#include "data_impl.h"

#define MAX_FIELDS 64

static void fields_free_all(fg_fields_dataset *fd) {
    for (int k = 0; fd->fields && k < fd->nfields; k++) fg_free((char *)fd->fields[k].name);
    fg_free(fd->fields);
    fg_free(fd->off);
    fg_free(fd->bytes);
    fg_free(fd->row);
    fg_free(fd->name);
    fg_free(fd);
}

static int64_t packed_len(void *ud) {
    fg_fields_dataset *fd = ud;
    return fd->ops.len(fd->ud);
}
static void packed_spec(void *ud, fg_sample_spec *x, fg_sample_spec *y) {
    fg_fields_dataset *fd = ud;
    *x = (fg_sample_spec){.dtype = FG_U8, .ndim = 1, .shape = {(int64_t)fd->rec}};
    *y = (fg_sample_spec){.dtype = FG_U8, .ndim = 0};
}
static FG_MUST_USE fg_status packed_get(void *ud, int64_t i, void *x, void *y) {
    fg_fields_dataset *fd = ud;
    fg_sample_field f[MAX_FIELDS];
    int64_t *lens = x;
    for (int k = 0; k < fd->nfields; k++) {
        const fg_field_spec *s = &fd->fields[k];
        f[k].data = (char *)x + fd->off[k];
        f[k].len = s->ndim == 0 ? 1 : s->shape[0] == FG_FIELD_VAR ? s->max_len : s->shape[0];
    }
    FG_TRY(fd->ops.get(fd->ud, i, f));
    for (int k = 0; k < fd->nfields; k++) {
        const fg_field_spec *s = &fd->fields[k];
        if (s->ndim > 0 && s->shape[0] == FG_FIELD_VAR) {
            if (f[k].len < 0 || f[k].len > s->max_len)
                return fg_error(FG_EINVAL,
                                "field '%s': length %lld is outside [0, %lld] (its max_len)",
                                s->name, (long long)f[k].len, (long long)s->max_len);
            lens[k] = f[k].len;
        } else {
            lens[k] = s->ndim == 0 ? 1 : s->shape[0];
        }
    }
    *(uint8_t *)y = 0;
    return FG_OK;
}

void fg__fields_unpack(const fg_fields_dataset *fd, const uint8_t *rec, fg_sample_field *out) {
    const int64_t *lens = (const int64_t *)(const void *)rec;
    for (int k = 0; k < fd->nfields; k++)
        out[k] = (fg_sample_field){(void *)(rec + fd->off[k]), lens[k]};
}

static FG_MUST_USE fg_status check_field(const fg_field_spec *s, int k, const char *who,
                                         const fg_field_spec *all, size_t *row, size_t *bytes) {
    if (!s->name || !*s->name)
        return fg_error(FG_EINVAL, "fields dataset %s: field %d has no name", who, k);
    size_t n = strlen(s->name);
    if (n > 200)
        return fg_error(FG_EINVAL,
                        "fields dataset %s: field %d: a name of %zu characters "
                        "(at most 200)",
                        who, k, n);
    if (n >= 5 && strcmp(s->name + n - 5, "_mask") == 0)
        return fg_error(FG_EINVAL,
                        "fields dataset %s: field '%s': a name ending in \"_mask\" is kept for "
                        "the masks of padded fields; rename it",
                        who, s->name);
    for (int j = 0; j < k; j++)
        if (strcmp(all[j].name, s->name) == 0)
            return fg_error(FG_EINVAL, "fields dataset %s: fields %d and %d are both named '%s'",
                            who, j, k, s->name);
    fg_dtype dt = s->dtype == FG_DTYPE_DEFAULT ? FG_F32 : s->dtype;
    if (!fg_dtype_valid((int)dt))
        return fg_error(FG_EINVAL, "fields dataset %s: field '%s': invalid dtype %d", who, s->name,
                        (int)s->dtype);
    if (s->ndim < 0 || s->ndim > FG_MAX_DIMS - 1)
        return fg_error(FG_EINVAL, "fields dataset %s: field '%s' has %d dims (expected 0..%d)",
                        who, s->name, s->ndim, FG_MAX_DIMS - 1);
    bool var = s->ndim > 0 && s->shape[0] == FG_FIELD_VAR;
    size_t r = fg_dtype_size(dt);
    for (int i = 0; i < s->ndim; i++) {
        if (i == 0 && var) continue;
        if (s->shape[i] < 0)
            return fg_error(FG_EINVAL,
                            "fields dataset %s: field '%s': dimension %d is %lld (must be >= 0; "
                            "only the first may be FG_FIELD_VAR)",
                            who, s->name, i, (long long)s->shape[i]);
        if (i > 0 && s->shape[i] && r > ((size_t)1 << 40) / (size_t)s->shape[i])
            return fg_error(FG_EINVAL, "fields dataset %s: field '%s' is too large", who, s->name);
        if (i > 0) r *= (size_t)s->shape[i];
    }
    int64_t first = s->ndim == 0 ? 1 : var ? s->max_len : s->shape[0];
    if (var && s->max_len < 1)
        return fg_error(FG_EINVAL,
                        "fields dataset %s: field '%s' has a variable length: set max_len, the "
                        "longest a sample may have (>= 0)",
                        who, s->name);
    if (first && r > ((size_t)1 << 40) / (size_t)first)
        return fg_error(FG_EINVAL, "fields dataset %s: field '%s' is too large", who, s->name);
    *row = r;
    *bytes = r * (size_t)first;
    return FG_OK;
}

static fg_fields_dataset *make(const fg_fields_ops *ops, void *ud, const fg_field_spec *fields,
                               int nfields, const char *name, fg_dataset *base) {
    fg_fields_dataset *fd = NULL;
    if (!name) name = "user";
    if (!ops || !ops->len || !ops->get) {
        fg_error(FG_EINVAL, "fg_fields_dataset_new(%s): ops and its len and get must be set", name);
        goto fail;
    }
    if (!fields || nfields < 1 || nfields > MAX_FIELDS) {
        fg_error(FG_EINVAL, "fields dataset %s: %d fields (expected 1..%d, and the array)", name,
                 nfields, MAX_FIELDS);
        goto fail;
    }
    fd = fg_calloc(1, sizeof *fd);
    if (!fd) goto fail;
    fd->fields = fg_calloc((size_t)nfields, sizeof *fd->fields);
    fd->off = fg_calloc((size_t)nfields, sizeof *fd->off);
    fd->bytes = fg_calloc((size_t)nfields, sizeof *fd->bytes);
    fd->row = fg_calloc((size_t)nfields, sizeof *fd->row);
    fd->name = fg_strdup(name);
    if (!fd->fields || !fd->off || !fd->bytes || !fd->row || !fd->name) goto fail;
    fd->rec = (size_t)nfields * sizeof(int64_t);
    for (int k = 0; k < nfields; k++) {
        if (check_field(&fields[k], k, name, fields, &fd->row[k], &fd->bytes[k]) != FG_OK)
            goto fail;
        fd->fields[k] = fields[k];
        fd->fields[k].name = NULL;
        if (fd->fields[k].dtype == FG_DTYPE_DEFAULT) fd->fields[k].dtype = FG_F32;
        if (!(fd->fields[k].name = fg_strdup(fields[k].name))) goto fail;
        fd->nfields = k + 1;
        fd->off[k] = fd->rec;
        fd->rec += (fd->bytes[k] + 7) / 8 * 8;
    }
    fd->nfields = nfields;
    fd->ops = *ops;
    fd->ud = ud;
    fd->base = base;
    static const fg_dataset_ops packed = {packed_len, packed_spec, packed_get, NULL};
    fd->packed = fg_dataset_new(&packed, fd, name);
    if (!fd->packed) goto fail;
    return fd;
fail:
    if (fd) fields_free_all(fd);
    if (ops && ops->free) ops->free(ud);
    return NULL;
}

fg_fields_dataset *fg_fields_dataset_new(const fg_fields_ops *ops, void *ud,
                                         const fg_field_spec *fields, int nfields,
                                         const char *name) {
    return make(ops, ud, fields, nfields, name, NULL);
}

static int64_t from_len(void *ud) { return fg_dataset_len(ud); }
static FG_MUST_USE fg_status from_get(void *ud, int64_t i, fg_sample_field *f) {
    return fg_dataset_get(ud, i, f[0].data, f[1].data);
}

fg_fields_dataset *fg_fields_dataset_from(fg_dataset *ds) {
    if (!ds) {
        fg_error(FG_EINVAL, "fg_fields_dataset_from: NULL dataset");
        return NULL;
    }
    fg_field_spec f[2] = {{.name = "x", .dtype = ds->x.dtype, .ndim = ds->x.ndim},
                          {.name = "y", .dtype = ds->y.dtype, .ndim = ds->y.ndim}};
    memcpy(f[0].shape, ds->x.shape, sizeof f[0].shape);
    memcpy(f[1].shape, ds->y.shape, sizeof f[1].shape);
    static const fg_fields_ops ops = {from_len, from_get, NULL};
    return make(&ops, ds, f, 2, ds->name, ds);
}

void fg_fields_dataset_free(fg_fields_dataset *fd) {
    if (!fd) return;
    fg_dataset_free(fd->packed);
    if (fd->ops.free) fd->ops.free(fd->ud);
    fields_free_all(fd);
}

int64_t fg_fields_dataset_len(const fg_fields_dataset *fd) { return fd->packed->len; }
int fg_fields_dataset_nfields(const fg_fields_dataset *fd) { return fd->nfields; }
const fg_field_spec *fg_fields_dataset_field(const fg_fields_dataset *fd, int k) {
    return fd && k >= 0 && k < fd->nfields ? &fd->fields[k] : NULL;
}
