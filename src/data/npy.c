/* NumPy .npy files: a strict parser of the header and a dataset of an input
 * array and a label array.
 *
 * The header is a Python dict literal; numpy.load evaluates it with
 * ast.literal_eval. Here a small recursive-descent reader accepts exactly
 * what numpy writes: {'descr': '<f4', 'fortran_order': False, 'shape': (N, D), }
 * followed by spaces and a newline, keys in any order, either quote style,
 * a trailing comma. Every number is checked before use: the shape product
 * and byte size overflow-safely, then against the bytes the file holds. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "data_impl.h"

typedef struct npy {
    const char *path;
    fg__map map;
    char kind;    /* 'f', 'i', 'u' */
    int itemsize; /* bytes */
    int ndim;
    int64_t shape[FG_MAX_DIMS];
    int64_t numel;
    const uint8_t *data;
    size_t nbytes;
} npy;

static FG_MUST_USE fg_status npy_bad(const npy *a, const char *fmt, ...) FG_PRINTF(2, 3);
static FG_MUST_USE fg_status npy_bad(const npy *a, const char *fmt, ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return fg_error(FG_EFORMAT, "%s: not a usable .npy file: %s", a->path, msg);
}

/* ------------------------------------------------------- header parser */

typedef struct cur {
    const char *p, *end;
} cur;

static void ws(cur *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static bool eat(cur *c, char ch) {
    ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return true;
    }
    return false;
}

/* A quoted string without escapes into out (cap bytes). */
static bool str_lit(cur *c, char *out, size_t cap) {
    ws(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) return false;
    char q = *c->p++;
    size_t n = 0;
    while (c->p < c->end && *c->p != q) {
        if (*c->p == '\\' || n + 1 >= cap) return false;
        out[n++] = *c->p++;
    }
    if (c->p >= c->end) return false;
    c->p++;
    out[n] = '\0';
    return true;
}

static bool word(cur *c, const char *w) {
    ws(c);
    size_t n = strlen(w);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, w, n) != 0) return false;
    const char *after = c->p + n;
    if (after < c->end && ((*after >= 'a' && *after <= 'z') || (*after >= 'A' && *after <= 'Z') ||
                           (*after >= '0' && *after <= '9') || *after == '_'))
        return false;
    c->p = after;
    return true;
}

static FG_MUST_USE fg_status parse_shape(cur *c, npy *a) {
    if (!eat(c, '(')) return npy_bad(a, "'shape' is not a tuple");
    a->ndim = 0;
    if (eat(c, ')')) return FG_OK;
    for (;;) {
        ws(c);
        if (c->p >= c->end || *c->p < '0' || *c->p > '9')
            return npy_bad(a, "'shape' holds something other than non-negative integers");
        int64_t v = 0;
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
            int d = *c->p++ - '0';
            if (v > (INT64_MAX - d) / 10) return npy_bad(a, "a dimension of 'shape' overflows");
            v = v * 10 + d;
        }
        if (a->ndim == FG_MAX_DIMS)
            return npy_bad(a, "'shape' has more than %d dimensions", FG_MAX_DIMS);
        a->shape[a->ndim++] = v;
        bool comma = eat(c, ',');
        if (eat(c, ')')) {
            if (a->ndim == 1 && !comma)
                return npy_bad(a, "'shape' (%lld) is not a tuple (a 1-d shape is written (%lld,))",
                               (long long)v, (long long)v);
            return FG_OK;
        }
        if (!comma) return npy_bad(a, "'shape' is not a well-formed tuple");
    }
}

static FG_MUST_USE fg_status parse_descr(npy *a, const char *d) {
    size_t n = strlen(d);
    if (n < 3) return npy_bad(a, "dtype '%s' is not understood", d);
    char order = d[0], kind = d[1];
    int size = 0;
    for (size_t i = 2; i < n; i++) {
        if (d[i] < '0' || d[i] > '9' || size > 100)
            return npy_bad(a, "dtype '%s' is not understood", d);
        size = size * 10 + (d[i] - '0');
    }
    if (order != '<' && order != '|' && order != '=' && order != '>')
        return npy_bad(a, "dtype '%s' has an unknown byte order '%c'", d, order);
    if (order == '>' && size > 1)
        return npy_bad(a, "dtype '%s' is big-endian: save it little-endian (arr.astype('<%c%d'))",
                       d, kind, size);
    bool ok = (kind == 'f' && (size == 4 || size == 8)) ||
              ((kind == 'i' || kind == 'u') && (size == 1 || size == 2 || size == 4 || size == 8));
    if (!ok)
        return npy_bad(a, "dtype '%s' is not supported (expected f4, f8 or an integer type)", d);
    a->kind = kind;
    a->itemsize = size;
    return FG_OK;
}

static FG_MUST_USE fg_status parse_header(npy *a, const char *h, size_t n) {
    cur c = {h, h + n};
    char key[64], descr[64];
    bool have_descr = false, have_fortran = false, have_shape = false, fortran = false;
    if (!eat(&c, '{')) return npy_bad(a, "the header is not a dict");
    while (!eat(&c, '}')) {
        if (!str_lit(&c, key, sizeof key)) return npy_bad(a, "the header dict has a bad key");
        if (!eat(&c, ':')) return npy_bad(a, "the header dict lacks ':' after '%s'", key);
        if (strcmp(key, "descr") == 0) {
            if (have_descr) return npy_bad(a, "the header repeats 'descr'");
            if (!str_lit(&c, descr, sizeof descr))
                return npy_bad(a, "'descr' is not a simple dtype string (structured arrays are "
                                  "not supported)");
            have_descr = true;
        } else if (strcmp(key, "fortran_order") == 0) {
            if (have_fortran) return npy_bad(a, "the header repeats 'fortran_order'");
            if (word(&c, "True")) fortran = true;
            else if (!word(&c, "False")) return npy_bad(a, "'fortran_order' is not True or False");
            have_fortran = true;
        } else if (strcmp(key, "shape") == 0) {
            if (have_shape) return npy_bad(a, "the header repeats 'shape'");
            FG_TRY(parse_shape(&c, a));
            have_shape = true;
        } else {
            return npy_bad(a, "the header has an unexpected key '%s'", key);
        }
        if (!eat(&c, ',')) {
            if (!eat(&c, '}')) return npy_bad(a, "the header dict is not well formed");
            break;
        }
    }
    ws(&c);
    if (c.p != c.end) return npy_bad(a, "unexpected text after the header dict");
    if (!have_descr || !have_fortran || !have_shape)
        return npy_bad(a, "the header lacks '%s'",
                       !have_descr     ? "descr"
                       : !have_fortran ? "fortran_order"
                                       : "shape");
    if (fortran)
        return npy_bad(a, "the array is in Fortran order: save it C-contiguous "
                          "(np.ascontiguousarray)");
    return parse_descr(a, descr);
}

static FG_MUST_USE fg_status npy_open(const char *path, npy *a) {
    *a = (npy){.path = path};
    FG_TRY(fg__map_file(path, &a->map));
    const uint8_t *p = a->map.p;
    size_t len = a->map.len;
    fg_status st;
    if (len < 10 || memcmp(p, "\x93NUMPY", 6) != 0) {
        st = npy_bad(a, "bad magic (expected \\x93NUMPY at the start)");
        goto fail;
    }
    int major = p[6], minor = p[7];
    if (major < 1 || major > 3 || minor != 0) {
        st = npy_bad(a, "format version %d.%d is not supported (expected 1.0, 2.0 or 3.0)", major,
                     minor);
        goto fail;
    }
    size_t start = major == 1 ? 10 : 12;
    if (len < start) {
        st = npy_bad(a, "truncated before the header length");
        goto fail;
    }
    size_t hlen = major == 1 ? fg__le16(p + 8) : fg__le32(p + 8);
    if (hlen > len - start) {
        st = npy_bad(a, "the header length %zu runs past the end of the file (%zu bytes)", hlen,
                     len);
        goto fail;
    }
    if ((st = parse_header(a, (const char *)p + start, hlen)) != FG_OK) goto fail;
    int64_t numel = 1;
    for (int i = 0; i < a->ndim; i++) {
        if (a->shape[i] && numel > INT64_MAX / a->itemsize / a->shape[i]) {
            st = npy_bad(a, "the shape's size overflows");
            goto fail;
        }
        numel *= a->shape[i];
    }
    a->numel = numel;
    a->nbytes = (size_t)numel * (size_t)a->itemsize;
    a->data = p + start + hlen;
    size_t avail = len - start - hlen;
    if (a->nbytes > avail) {
        st = npy_bad(a,
                     "the data is truncated: the shape needs %zu bytes, the file has %zu "
                     "after the header",
                     a->nbytes, avail);
        goto fail;
    }
    return FG_OK;
fail:
    fg__unmap(&a->map);
    return st;
}

static const char *shape_str(const npy *a, char *buf, size_t cap) {
    size_t n = (size_t)snprintf(buf, cap, "(");
    for (int i = 0; i < a->ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)a->shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, ")");
    return buf;
}

/* ------------------------------------------------------------ dataset */

typedef struct npy_ds {
    npy x;
    int64_t row; /* elements per sample */
    int32_t *labels;
} npy_ds;

static int64_t npy_len(void *ud) { return ((npy_ds *)ud)->x.shape[0]; }

static void npy_spec(void *ud, fg_sample_spec *x, fg_sample_spec *y) {
    npy_ds *d = ud;
    *x = (fg_sample_spec){.dtype = FG_F32, .ndim = d->x.ndim - 1};
    for (int i = 1; i < d->x.ndim; i++) x->shape[i - 1] = d->x.shape[i];
    *y = (fg_sample_spec){.dtype = FG_I32, .ndim = 0};
}

static FG_MUST_USE fg_status npy_get(void *ud, int64_t i, void *x_out, void *y_out) {
    npy_ds *d = ud;
    float *x = x_out;
    const uint8_t *p = d->x.data + (size_t)(i * d->row) * (size_t)d->x.itemsize;
    if (d->x.kind == 'f' && d->x.itemsize == 4) {
        for (int64_t k = 0; k < d->row; k++) {
            uint32_t u = fg__le32(p + 4 * k);
            memcpy(&x[k], &u, 4);
        }
    } else if (d->x.kind == 'f') {
        for (int64_t k = 0; k < d->row; k++) {
            uint64_t u = fg__le32(p + 8 * k) | (uint64_t)fg__le32(p + 8 * k + 4) << 32;
            double v;
            memcpy(&v, &u, 8);
            x[k] = (float)v;
        }
    } else {
        for (int64_t k = 0; k < d->row; k++) x[k] = (float)p[k];
    }
    *(int32_t *)y_out = d->labels[i];
    return FG_OK;
}

static void npy_free(void *ud) {
    npy_ds *d = ud;
    if (!d) return;
    fg__unmap(&d->x.map);
    fg_free(d->labels);
    fg_free(d);
}

/* Reads label i of an integer array as int64 (u8 values above INT64_MAX
 * come back negative and fail the int32 range check like any other). */
/* The item's bytes as an unsigned number (little-endian). */
static uint64_t raw_at(const npy *a, int64_t i) {
    const uint8_t *p = a->data + (size_t)i * (size_t)a->itemsize;
    uint64_t u = 0;
    for (int b = a->itemsize - 1; b >= 0; b--) u = (u << 8) | p[b];
    return u;
}

static int64_t int_at(const npy *a, int64_t i) {
    uint64_t u = raw_at(a, i);
    if (a->kind == 'i' && a->itemsize < 8 && (u >> (8 * a->itemsize - 1)) & 1)
        u |= ~(uint64_t)0 << (8 * a->itemsize); /* sign-extend */
    if (a->kind == 'u' && a->itemsize == 8 && u > (uint64_t)INT64_MAX)
        return (int64_t)INT32_MIN - 1;
    return (int64_t)u;
}

fg_status fg__npy_dataset_open(const char *x_path, const char *y_path, fg_dataset **out) {
    *out = NULL;
    if (!x_path || !y_path)
        return fg_error(FG_EINVAL,
                        "fg_npy_dataset_new: NULL path (inputs and labels are both needed)");
    npy_ds *d = fg_calloc(1, sizeof *d);
    npy y = {0};
    char sb[256];
    fg_status st = FG_ENOMEM;
    if (!d) return FG_ENOMEM;
    if ((st = npy_open(x_path, &d->x)) != FG_OK) goto fail;
    if (d->x.ndim < 1) {
        st = npy_bad(&d->x, "inputs must have shape (N, ...), this array is a scalar");
        goto fail;
    }
    if (!(d->x.kind == 'f' || (d->x.kind == 'u' && d->x.itemsize == 1))) {
        st = npy_bad(&d->x, "inputs must be f4, f8 or u1, not %c%d", d->x.kind, d->x.itemsize);
        goto fail;
    }
    d->row = 1; /* checked apart from numel: a (0, huge, huge) shape has numel 0 */
    for (int i = 1; i < d->x.ndim; i++) {
        if (d->x.shape[i] && d->row > INT64_MAX / 8 / d->x.shape[i]) {
            st = npy_bad(&d->x, "the shape's size overflows");
            goto fail;
        }
        d->row *= d->x.shape[i];
    }
    if ((st = npy_open(y_path, &y)) != FG_OK) goto fail;
    if (y.kind == 'f') {
        st = npy_bad(&y, "labels must have an integer dtype, not f%d", y.itemsize);
        goto fail;
    }
    if (y.ndim != 1 || y.shape[0] != d->x.shape[0]) {
        st = npy_bad(&y, "labels must have shape (%lld,) to match %s, not %s",
                     (long long)d->x.shape[0], x_path, shape_str(&y, sb, sizeof sb));
        goto fail;
    }
    int64_t n = y.shape[0];
    if (!(d->labels = fg_alloc((size_t)(n ? n : 1) * sizeof(int32_t)))) {
        st = FG_ENOMEM;
        goto fail;
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t v = int_at(&y, i);
        if (v < INT32_MIN || v > INT32_MAX) {
            char vs[32]; /* the value as stored: a u8 past INT64_MAX too */
            if (y.kind == 'u') snprintf(vs, sizeof vs, "%llu", (unsigned long long)raw_at(&y, i));
            else snprintf(vs, sizeof vs, "%lld", (long long)v);
            st = npy_bad(&y,
                         "label %s at row %lld does not fit in int32: labels are class ids "
                         "0..C-1, C at most %d",
                         vs, (long long)i, INT32_MAX);
            goto fail;
        }
        d->labels[i] = (int32_t)v;
    }
    fg__unmap(&y.map);
    static const fg_dataset_ops ops = {npy_len, npy_spec, npy_get, npy_free};
    *out = fg_dataset_new(&ops, d, "npy"); /* frees d on failure */
    return *out ? FG_OK : FG_ENOMEM;
fail:
    fg__unmap(&y.map);
    npy_free(d);
    return st;
}

fg_dataset *fg_npy_dataset_new(const char *x_path, const char *y_path) {
    fg_dataset *ds = NULL;
    return fg__npy_dataset_open(x_path, y_path, &ds) == FG_OK ? ds : NULL;
}
