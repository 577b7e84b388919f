/* The dataset handle: the table of functions over user data (built-in kinds
 * are the same table), bounds-checked access, subset views and the
 * train/val split, and the file-mapping helper the built-in kinds share.
 * Specs and length are read once at creation and never change. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data_impl.h"

int64_t fg_sample_spec_numel(const fg_sample_spec *s) {
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) n *= s->shape[i];
    return n;
}

size_t fg_sample_spec_bytes(const fg_sample_spec *s) {
    fg_dtype dt = s->dtype == FG_DTYPE_DEFAULT ? FG_F32 : s->dtype;
    return (size_t)fg_sample_spec_numel(s) * fg_dtype_size(dt);
}

fg_status fg__spec_check(const fg_sample_spec *s, const char *who, const char *what,
                         size_t *bytes) {
    if (!fg_dtype_valid((int)s->dtype))
        return fg_error(FG_EINVAL, "dataset %s: %s has invalid dtype %d: expected FG_F64 .. FG_U16",
                        who, what, (int)s->dtype);
    if (s->ndim < 0 || s->ndim > FG_MAX_DIMS - 1)
        return fg_error(FG_EINVAL,
                        "dataset %s: %s has %d dims (expected 0..%d: the batch adds one)", who,
                        what, s->ndim, FG_MAX_DIMS - 1);
    size_t b = fg_dtype_size(s->dtype);
    for (int i = 0; i < s->ndim; i++) {
        if (s->shape[i] < 0)
            return fg_error(FG_EINVAL, "dataset %s: %s dimension %d is %lld (must be >= 0)", who,
                            what, i, (long long)s->shape[i]);
        if (s->shape[i] && b > (size_t)INT64_MAX / (size_t)s->shape[i])
            return fg_error(FG_EINVAL, "dataset %s: %s shape is too large (bytes overflow)", who,
                            what);
        b *= (size_t)s->shape[i];
    }
    *bytes = b;
    return FG_OK;
}

fg_dataset *fg_dataset_new(const fg_dataset_ops *ops, void *ud, const char *name) {
    fg_dataset *ds = NULL;
    if (!name) name = "user";
    if (!ops || !ops->len || !ops->spec || !ops->get) {
        fg_error(FG_EINVAL, "fg_dataset_new(%s): ops and its len, spec and get must be set", name);
        goto fail;
    }
    ds = fg_calloc(1, sizeof *ds);
    if (!ds) goto fail;
    ds->ops = *ops;
    ds->ud = ud;
    ds->name = fg_strdup(name);
    if (!ds->name) goto fail;
    ds->len = ops->len(ud);
    if (ds->len < 0) {
        fg_error(FG_EINVAL, "dataset %s: length %lld (must be >= 0)", name, (long long)ds->len);
        goto fail;
    }
    ops->spec(ud, &ds->x, &ds->y);
    if (ds->x.dtype == FG_DTYPE_DEFAULT) ds->x.dtype = FG_F32;
    if (ds->y.dtype == FG_DTYPE_DEFAULT) ds->y.dtype = FG_F32;
    if (fg__spec_check(&ds->x, name, "x", &ds->xbytes) != FG_OK ||
        fg__spec_check(&ds->y, name, "y", &ds->ybytes) != FG_OK)
        goto fail;
    return ds;
fail:
    if (ds) fg_free(ds->name);
    fg_free(ds);
    if (ops && ops->free) ops->free(ud);
    return NULL;
}

void fg_dataset_free(fg_dataset *ds) {
    if (!ds) return;
    fg_error_kept kept; /* a _free never changes the caller's error (core.h) */
    fg_error_keep(&kept);
    if (ds->ops.free) ds->ops.free(ds->ud);
    fg_free(ds->name);
    fg_free(ds);
    fg_error_restore(&kept);
}

int64_t fg_dataset_len(const fg_dataset *ds) { return ds->len; }
const fg_sample_spec *fg_dataset_x_spec(const fg_dataset *ds) { return &ds->x; }
const fg_sample_spec *fg_dataset_y_spec(const fg_dataset *ds) { return &ds->y; }
const char *fg_dataset_name(const fg_dataset *ds) { return ds->name; }
int64_t fg_dataset_vocab_size(const fg_dataset *ds) { return ds ? ds->vocab_size : 0; }
const fg_text_vocab *fg_text_dataset_vocab(const fg_dataset *ds) {
    return ds ? ds->text_vocab : NULL;
}

fg_status fg_dataset_get(const fg_dataset *ds, int64_t i, void *x_out, void *y_out) {
    if (!ds) return fg_error(FG_EINVAL, "fg_dataset_get: NULL dataset");
    if (i < 0 || i >= ds->len)
        return fg_error(FG_EINVAL, "dataset %s: sample %lld is outside [0, %lld)", ds->name,
                        (long long)i, (long long)ds->len);
    if ((!x_out && ds->xbytes) || (!y_out && ds->ybytes))
        return fg_error(FG_EINVAL, "dataset %s: NULL output buffer for sample %lld", ds->name,
                        (long long)i);
    return ds->ops.get(ds->ud, i, x_out, y_out);
}

/* ------------------------------------------------------------ subsets */

typedef struct subset {
    fg_dataset *base;
    int64_t start, len;
} subset;

static int64_t subset_len(void *ud) { return ((subset *)ud)->len; }
static void subset_spec(void *ud, fg_sample_spec *x, fg_sample_spec *y) {
    *x = ((subset *)ud)->base->x;
    *y = ((subset *)ud)->base->y;
}
static FG_MUST_USE fg_status subset_get(void *ud, int64_t i, void *x, void *y) {
    subset *s = ud;
    return s->base->ops.get(s->base->ud, s->start + i, x, y);
}
static void subset_free(void *ud) { fg_free(ud); }

fg_dataset *fg_dataset_subset(fg_dataset *base, int64_t start, int64_t len) {
    if (!base) {
        fg_error(FG_EINVAL, "fg_dataset_subset: NULL base dataset");
        return NULL;
    }
    if (start < 0 || len < 0 || start > base->len || len > base->len - start) {
        fg_error(FG_EINVAL, "dataset %s: subset [%lld, %lld + %lld) is not inside [0, %lld)",
                 base->name, (long long)start, (long long)start, (long long)len,
                 (long long)base->len);
        return NULL;
    }
    subset *s = fg_alloc(sizeof *s);
    if (!s) return NULL;
    *s = (subset){base, start, len};
    static const fg_dataset_ops ops = {subset_len, subset_spec, subset_get, subset_free};
    fg_dataset *ds = fg_dataset_new(&ops, s, "subset");
    if (!ds) return NULL;
    ds->vocab_size = base->vocab_size;
    ds->text_vocab = base->text_vocab;
    return ds;
}

fg_status fg_dataset_split(fg_dataset *base, double val_fraction, fg_dataset **train,
                           fg_dataset **val) {
    if (train) *train = NULL;
    if (val) *val = NULL;
    if (!base || !train || !val) return fg_error(FG_EINVAL, "fg_dataset_split: NULL argument");
    if (!(val_fraction >= 0.0 && val_fraction < 1.0))
        return fg_error(FG_EINVAL, "dataset %s: val_fraction=%g: expected a value in [0, 1)",
                        base->name, val_fraction);
    int64_t n = base->len;
    int64_t nval = (int64_t)ceil(val_fraction * (double)n);
    if (nval > n) nval = n;
    if (n - nval < 1)
        return fg_error(FG_EINVAL,
                        "dataset %s: splitting %lld samples with val_fraction=%g leaves no "
                        "training sample: use more data or a smaller fraction",
                        base->name, (long long)n, val_fraction);
    *train = fg_dataset_subset(base, 0, n - nval);
    if (!*train) return FG_ENOMEM;
    *val = fg_dataset_subset(base, n - nval, nval);
    if (!*val) {
        fg_dataset_free(*train);
        *train = NULL;
        return FG_ENOMEM;
    }
    return FG_OK;
}

/* ------------------------------------------------------------- files */

fg_status fg__map_file(const char *path, fg__map *m) {
    *m = (fg__map){0};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fg_error(FG_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return fg_error(FG_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return fg_error(FG_EIO, "%s: not a regular file", path);
    }
    if (st.st_size == 0) { /* empty, or a /proc file that does not say its size */
        fg_status s = FG_OK;
        uint8_t *p = NULL;
        size_t n = 0, cap = 0;
        for (;;) {
            if (n == cap) {
                size_t nc = cap ? 2 * cap : 65536;
                uint8_t *q = nc <= FG__MAP_READ_MAX + 1 ? fg_realloc(p, nc) : NULL;
                if (!q) {
                    s = nc > FG__MAP_READ_MAX + 1
                            ? fg_error(FG_EIO, "%s: reports 0 bytes but holds more than %zu", path,
                                       FG__MAP_READ_MAX)
                            : FG_ENOMEM;
                    break;
                }
                p = q;
                cap = nc;
            }
            ssize_t r = read(fd, p + n, cap - n);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) s = fg_error(FG_EIO, "%s: read failed: %s", path, strerror(errno));
            if (r <= 0) break;
            n += (size_t)r;
        }
        close(fd);
        if (s != FG_OK || n == 0) {
            fg_free(p);
            return s;
        }
        *m = (fg__map){.p = p, .len = n, .owned = true};
        return FG_OK;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) return fg_error(FG_EIO, "%s: cannot map: %s", path, strerror(e));
    m->p = p;
    m->len = (size_t)st.st_size;
    return FG_OK;
}

void fg__unmap(fg__map *m) {
    if (m->p && m->owned) fg_free((void *)m->p);
    else if (m->p) munmap((void *)m->p, m->len);
    *m = (fg__map){0};
}
