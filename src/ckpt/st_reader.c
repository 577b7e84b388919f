/* The safetensors reader. It trusts nothing in the file.
 *
 * Order of checks: the 8-byte header length against the file size and
 * FG_ST_MAX_HEADER, before anything is parsed; then the JSON (jansson, with
 * duplicate keys refused); then every entry's fields by type and range,
 * with the shape product and byte size computed overflow-safely before any
 * comparison; then the entries sorted by offset must tile the data buffer
 * exactly, as the reference implementation requires. Only numbers that
 * passed these checks are used, and allocations are sized by the count of
 * parsed JSON values (bounded by the header size), never by a number read
 * from the file.
 *
 * Invariants of an open file: e[0..n) are in data order, e[i].end ==
 * e[i+1].begin, e[n-1].end == data_len; names, dtype names and metadata
 * strings point into `root`, which lives as long as the file. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_impl.h"

/* ---------------------------------------------------------------- errors */

static FG_MUST_USE fg_status bad(const fg_st_file *f, const char *entry, const char *fmt, ...)
    FG_PRINTF(3, 4);
static FG_MUST_USE fg_status bad(const fg_st_file *f, const char *entry, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (entry) return fg_error(FG_EFORMAT, "%s: tensor \"%.200s\": %s", f->label, entry, msg);
    return fg_error(FG_EFORMAT, "%s: %s", f->label, msg);
}

static const char *json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* "[32, 64]" for messages, cut short with "..." if long. */
static const char *fmt_shape(char *buf, size_t cap, const json_t *arr) {
    size_t used = 0;
    used += (size_t)snprintf(buf, cap, "[");
    for (size_t k = 0; k < json_array_size(arr) && used + 24 < cap; k++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%lld", k ? ", " : "",
                                 (long long)json_integer_value(json_array_get(arr, k)));
    if (used + 24 >= cap) used += (size_t)snprintf(buf + used, cap - used, ", ...");
    snprintf(buf + used, cap - used, "]");
    return buf;
}

/* --------------------------------------------------------------- parsing */

static FG_MUST_USE fg_status parse_entry(fg_st_file *f, const char *name, json_t *v, st_entry *e) {
    char sb[160];
    if (!*name) return bad(f, NULL, "a tensor has an empty name");
    if (!json_is_object(v))
        return bad(f, name, "expected an object with dtype, shape and data_offsets, got %s",
                   json_kind(v));
    json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
           *off = json_object_get(v, "data_offsets");
    if (!dt) return bad(f, name, "missing \"dtype\"");
    if (!json_is_string(dt))
        return bad(f, name, "\"dtype\" is %s, expected a string like \"F32\"", json_kind(dt));
    e->dt = fg__st_dtype_lookup(json_string_value(dt));
    if (!e->dt)
        return bad(f, name,
                   "unknown dtype \"%.40s\" (expected F64, F32, BF16, F16, I64, I32, "
                   "U16, U8 or another safetensors dtype)",
                   json_string_value(dt));
    if (!sh) return bad(f, name, "missing \"shape\"");
    if (!json_is_array(sh))
        return bad(f, name, "\"shape\" is %s, expected an array", json_kind(sh));
    if (json_array_size(sh) > FG_ST_MAX_NDIM)
        return bad(f, name, "shape has %zu dimensions, more than the %d fulgur accepts",
                   json_array_size(sh), FG_ST_MAX_NDIM);
    e->ndim = (int)json_array_size(sh);
    int64_t numel = 1;
    bool overflow = false;
    for (int k = 0; k < e->ndim; k++) {
        json_t *d = json_array_get(sh, (size_t)k);
        if (!json_is_integer(d))
            return bad(f, name, "shape[%d] is %s, expected a non-negative integer", k,
                       json_kind(d));
        json_int_t x = json_integer_value(d);
        if (x < 0) return bad(f, name, "shape[%d] = %lld is negative", k, (long long)x);
        if (__builtin_mul_overflow(numel, (int64_t)x, &numel)) overflow = true;
    }
    /* A zero anywhere makes the product 0 even if a prefix overflowed. */
    for (int k = 0; k < e->ndim; k++)
        if (json_integer_value(json_array_get(sh, (size_t)k)) == 0) numel = 0, overflow = false;
    uint64_t nbytes = 0;
    if (overflow || __builtin_mul_overflow((uint64_t)numel, (uint64_t)e->dt->size, &nbytes))
        return bad(f, name, "shape %s of %s has more bytes than 64 bits can count",
                   fmt_shape(sb, sizeof sb, sh), e->dt->name);
    if (!off) return bad(f, name, "missing \"data_offsets\"");
    if (!json_is_array(off) || json_array_size(off) != 2)
        return bad(f, name, "\"data_offsets\" is %s%s, expected an array [begin, end]",
                   json_kind(off), json_is_array(off) ? " not of 2 entries" : "");
    json_t *jb = json_array_get(off, 0), *je = json_array_get(off, 1);
    if (!json_is_integer(jb) || !json_is_integer(je))
        return bad(f, name, "\"data_offsets\" holds %s and %s, expected two integers",
                   json_kind(jb), json_kind(je));
    json_int_t b = json_integer_value(jb), en = json_integer_value(je);
    if (b < 0 || en < 0)
        return bad(f, name, "data_offsets [%lld, %lld] are negative", (long long)b, (long long)en);
    if (en < b)
        return bad(f, name, "data_offsets [%lld, %lld] end before they begin", (long long)b,
                   (long long)en);
    if ((uint64_t)en > f->data_len)
        return bad(f, name,
                   "data_offsets [%lld, %lld] run past the end of the %zu-byte data buffer",
                   (long long)b, (long long)en, f->data_len);
    if ((uint64_t)(en - b) != nbytes)
        return bad(f, name, "data_offsets [%lld, %lld] but shape %s of %s needs %llu bytes",
                   (long long)b, (long long)en, fmt_shape(sb, sizeof sb, sh), e->dt->name,
                   (unsigned long long)nbytes);
    e->name = name;
    e->shape_json = sh;
    e->numel = numel;
    e->nbytes = (size_t)nbytes; /* <= data_len, a size_t */
    e->begin = (uint64_t)b;
    e->end = (uint64_t)en;
    return FG_OK;
}

static FG_MUST_USE fg_status parse_meta(fg_st_file *f, json_t *m) {
    if (json_is_null(m)) return FG_OK;
    if (!json_is_object(m))
        return bad(f, NULL, "\"__metadata__\" is %s, expected an object of strings", json_kind(m));
    f->meta = m;
    size_t cnt = json_object_size(m);
    if (cnt == 0) return FG_OK;
    f->meta_k = fg_calloc(cnt, sizeof *f->meta_k);
    f->meta_v = fg_calloc(cnt, sizeof *f->meta_v);
    if (!f->meta_k || !f->meta_v) return FG_ENOMEM;
    const char *k;
    json_t *v;
    json_object_foreach(m, k, v) {
        if (!json_is_string(v))
            return bad(f, NULL, "metadata \"%.200s\" is %s, expected a string", k, json_kind(v));
        f->meta_k[f->nmeta] = k;
        f->meta_v[f->nmeta] = json_string_value(v);
        f->nmeta++;
    }
    return FG_OK;
}

static int cmp_offset(const void *pa, const void *pb) {
    const st_entry *a = pa, *b = pb;
    if (a->begin != b->begin) return a->begin < b->begin ? -1 : 1;
    if (a->end != b->end) return a->end < b->end ? -1 : 1;
    return a->order < b->order ? -1 : a->order > b->order;
}

/* glibc's qsort_r: C11's qsort has no context argument. */
static int cmp_name_r(const void *pa, const void *pb, void *ctx) {
    const st_entry *e = ctx;
    return strcmp(e[*(const int64_t *)pa].name, e[*(const int64_t *)pb].name);
}

static FG_MUST_USE fg_status check_layout(fg_st_file *f) {
    qsort(f->e, (size_t)f->n, sizeof *f->e, cmp_offset);
    uint64_t pos = 0;
    for (int64_t i = 0; i < f->n; i++) {
        const st_entry *e = &f->e[i];
        if (e->begin > pos)
            return bad(f, e->name,
                       "data_offsets [%llu, %llu] leave bytes [%llu, %llu) of the data buffer "
                       "unused%s%.200s%s (the format allows no gaps)",
                       (unsigned long long)e->begin, (unsigned long long)e->end,
                       (unsigned long long)pos, (unsigned long long)e->begin,
                       i ? ", after tensor \"" : "", i ? f->e[i - 1].name : "", i ? "\"" : "");
        if (e->begin < pos)
            return bad(f, e->name,
                       "data_offsets [%llu, %llu] overlap tensor \"%.200s\" [%llu, %llu]",
                       (unsigned long long)e->begin, (unsigned long long)e->end, f->e[i - 1].name,
                       (unsigned long long)f->e[i - 1].begin, (unsigned long long)f->e[i - 1].end);
        pos = e->end;
    }
    if (pos != f->data_len)
        return bad(f, NULL,
                   "%llu bytes follow the last tensor's data (tensors end at byte %llu of a "
                   "%zu-byte data buffer; the format allows no trailing bytes)",
                   (unsigned long long)(f->data_len - pos), (unsigned long long)pos, f->data_len);
    return FG_OK;
}

static FG_MUST_USE fg_status parse(fg_st_file *f) {
    if (f->len < 8)
        return bad(f, NULL, "%zu bytes, too short for the 8-byte header length (truncated?)",
                   f->len);
    uint64_t hlen = 0;
    for (int k = 7; k >= 0; k--) hlen = (hlen << 8) | f->base[k];
    if (hlen > FG_ST_MAX_HEADER)
        return bad(f, NULL,
                   "header length %llu exceeds the %u-byte limit (corrupt, or not a safetensors "
                   "file)",
                   (unsigned long long)hlen, FG_ST_MAX_HEADER);
    if (hlen > f->len - 8)
        return bad(f, NULL,
                   "header length %llu runs past the end of the %zu-byte file (truncated?)",
                   (unsigned long long)hlen, f->len);
    const char *hdr = (const char *)f->base + 8;
    if (hlen == 0 || hdr[0] != '{')
        return bad(f, NULL, "header does not start with '{' (corrupt, or not a safetensors file)");
    f->data = f->base + 8 + hlen;
    f->data_len = f->len - 8 - (size_t)hlen;

    json_error_t jerr;
    f->root = json_loadb(hdr, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!f->root) {
        if (json_error_code(&jerr) == json_error_out_of_memory)
            return fg_error(FG_ENOMEM, "%s: out of memory parsing the header", f->label);
        return bad(f, NULL, "header is not valid JSON: %s (at header byte %d)", jerr.text,
                   jerr.position);
    }
    if (!json_is_object(f->root))
        return bad(f, NULL, "header is %s, expected an object", json_kind(f->root));

    size_t cnt = json_object_size(f->root);
    json_t *meta = json_object_get(f->root, "__metadata__");
    if (meta) cnt--;
    f->e = fg_calloc(cnt ? cnt : 1, sizeof *f->e);
    if (!f->e) return FG_ENOMEM;
    const char *name;
    json_t *v;
    size_t total_dims = 0;
    json_object_foreach(f->root, name, v) {
        if (v == meta) continue;
        st_entry *e = &f->e[f->n];
        FG_TRY(parse_entry(f, name, v, e));
        e->order = f->n++;
        total_dims += (size_t)e->ndim;
    }
    FG_TRY(check_layout(f));
    if (meta) FG_TRY(parse_meta(f, meta));

    f->shapes = fg_calloc(total_dims ? total_dims : 1, sizeof *f->shapes);
    f->by_name = fg_calloc(f->n ? (size_t)f->n : 1, sizeof *f->by_name);
    if (!f->shapes || !f->by_name) return FG_ENOMEM;
    int64_t *s = f->shapes;
    for (int64_t i = 0; i < f->n; i++) {
        st_entry *e = &f->e[i];
        for (int k = 0; k < e->ndim; k++)
            s[k] = (int64_t)json_integer_value(json_array_get(e->shape_json, (size_t)k));
        e->shape = s;
        e->shape_json = NULL;
        e->src = f->data + e->begin;
        s += e->ndim;
    }
    fg__st_sort_names(f);
    return FG_OK;
}

void fg__st_sort_names(fg_st_file *f) {
    for (int64_t i = 0; i < f->n; i++) f->by_name[i] = i;
    qsort_r(f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_name_r, f->e);
}

/* --------------------------------------------------------------- opening */

static FG_MUST_USE fg_status new_file(const char *label, fg_st_file **out) {
    fg__st_json_init();
    fg_st_file *f = fg_calloc(1, sizeof *f);
    if (!f) return FG_ENOMEM;
    f->label = fg_strdup(label);
    if (!f->label) {
        fg_free(f);
        return FG_ENOMEM;
    }
    *out = f;
    return FG_OK;
}

static FG_MUST_USE fg_status finish(fg_st_file *f, fg_st_file **out) {
    fg_status st = parse(f);
    if (st != FG_OK) {
        fg_st_close(f);
        return st;
    }
    *out = f;
    return FG_OK;
}

fg_st_file *fg_st_open_memory(const void *buf, size_t len, const char *label) {
    if (!buf && len) {
        fg_error(FG_EINVAL, "fg_st_open_memory: NULL buffer with %zu bytes", len);
        return NULL;
    }
    fg_st_file *f, *out = NULL;
    if (new_file(label ? label : "<memory>", &f) != FG_OK) return NULL;
    f->base = buf ? buf : (const unsigned char *)"";
    f->len = len;
    if (finish(f, &out) != FG_OK) return NULL; /* finish freed f; the error is set */
    return out;
}

/* One safetensors file, in the status form that FG_TRY and the early
 * returns read best in. */
fg_status fg__st_open_file(const char *path, fg_st_file **out) {
    char eb[128];
    if (!path) return fg_error(FG_EINVAL, "fg_st_open: NULL path");
    /* O_NONBLOCK so that a FIFO in the checkpoint's place cannot hang us. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return fg_error(FG_EIO, "%s: %s", path, fg__errstr(errno, eb, sizeof eb));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return fg_error(FG_EIO, "%s: %s", path, fg__errstr(e, eb, sizeof eb));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return fg_error(FG_EIO, "%s: not a regular file", path);
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        close(fd);
        return fg_error(FG_EIO, "%s: %lld bytes do not fit this process's address space", path,
                        (long long)sb.st_size);
    }
    fg_st_file *f;
    fg_status st = new_file(path, &f);
    if (st != FG_OK) {
        close(fd);
        return st;
    }
    f->len = (size_t)sb.st_size;
    if (f->len > 0) {
        void *m = mmap(NULL, f->len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            fg_st_close(f);
            return fg_error(FG_EIO, "%s: mmap failed: %s", path, fg__errstr(e, eb, sizeof eb));
        }
        f->map = m;
        f->base = m;
    } else {
        f->base = (const unsigned char *)"";
    }
    close(fd);
    return finish(f, out);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* A folder is a sharded checkpoint through the index in it, a ".json"
 * file is such an index, anything else one safetensors file. */
fg_st_file *fg_st_open(const char *path) {
    fg_st_file *f = NULL;
    struct stat sb;
    if (path && stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        size_t n = strlen(path) + sizeof "/" FG_ST_INDEX_NAME;
        char *index = fg_alloc(n);
        if (!index) return NULL;
        snprintf(index, n, "%s/%s", path, FG_ST_INDEX_NAME);
        if (stat(index, &sb) != 0)
            fg_error(FG_EIO,
                     "%s: a folder without %s: not a sharded checkpoint (a checkpoint folder of "
                     "a run names its newest checkpoint last.safetensors)",
                     path, FG_ST_INDEX_NAME);
        else if (fg__st_open_index(index, &f) != FG_OK) f = NULL; /* the error is set */
        fg_free(index);
        return f;
    }
    fg_status s =
        path && ends_with(path, ".json") ? fg__st_open_index(path, &f) : fg__st_open_file(path, &f);
    return s == FG_OK ? f : NULL;
}

void fg_st_close(fg_st_file *f) {
    if (!f) return;
    for (int64_t k = 0; k < f->nparts; k++) fg_st_close(f->parts[k]);
    fg_free(f->parts);
    if (f->map) munmap(f->map, f->len);
    json_decref(f->root);
    fg_free(f->e);
    fg_free(f->by_name);
    fg_free(f->shapes);
    fg_free(f->meta_k);
    fg_free(f->meta_v);
    fg_free(f->label);
    fg_free(f);
}

/* --------------------------------------------------------------- queries */

int64_t fg_st_count(const fg_st_file *f) { return f ? f->n : 0; }

fg_status fg_st_info_at(const fg_st_file *f, int64_t i, fg_st_info *out) {
    if (!f || !out) return fg_error(FG_EINVAL, "fg_st_info_at: NULL argument");
    if (i < 0 || i >= f->n)
        return fg_error(FG_EINVAL, "%s: entry index %lld out of range [0, %lld)", f->label,
                        (long long)i, (long long)f->n);
    const st_entry *e = &f->e[i];
    *out = (fg_st_info){
        .name = e->name,
        .dtype_name = e->dt->name,
        .dtype = e->dt->fg,
        .has_dtype = e->dt->fg != FG_DTYPE_DEFAULT,
        .elem_size = e->dt->size,
        .ndim = e->ndim,
        .shape = e->shape,
        .numel = e->numel,
        .nbytes = e->nbytes,
        .offset = (size_t)e->begin,
    };
    return FG_OK;
}

int64_t fg_st_find(const fg_st_file *f, const char *name) {
    if (!f || !name) return -1;
    int64_t lo = 0, hi = f->n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->e[f->by_name[mid]].name, name);
        if (c == 0) return f->by_name[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

const void *fg_st_data(const fg_st_file *f, int64_t i) {
    if (!f || i < 0 || i >= f->n) return NULL;
    return f->e[i].src;
}

fg_status fg_st_read(const fg_st_file *f, int64_t i, void *dst, fg_dtype dst_dtype, int64_t numel) {
    if (!f) return fg_error(FG_EINVAL, "fg_st_read: NULL file");
    if (i < 0 || i >= f->n)
        return fg_error(FG_EINVAL, "%s: entry index %lld out of range [0, %lld)", f->label,
                        (long long)i, (long long)f->n);
    const st_entry *e = &f->e[i];
    if (!fg_dtype_valid((int)dst_dtype))
        return fg_error(FG_EINVAL,
                        "%s: tensor \"%.200s\": destination dtype %d (%s): expected a real dtype, "
                        "FG_F64 .. FG_U16",
                        f->label, e->name, (int)dst_dtype, fg_dtype_name(dst_dtype));
    if (e->dt->fg == FG_DTYPE_DEFAULT)
        return fg_error(FG_EUNSUPPORTED,
                        "%s: tensor \"%.200s\" has dtype %s, which fulgur cannot convert (its raw "
                        "bytes are at fg_st_data)",
                        f->label, e->name, e->dt->name);
    if (numel != e->numel)
        return fg_error(FG_EMISMATCH, "%s: tensor \"%.200s\" has %lld elements, the buffer %lld",
                        f->label, e->name, (long long)e->numel, (long long)numel);
    if (numel > 0 && !dst)
        return fg_error(FG_EINVAL, "%s: tensor \"%.200s\": NULL destination", f->label, e->name);
    if (numel == 0) return FG_OK;
    const unsigned char *src = e->src;
    fg_dtype sdt = e->dt->fg;
    if (sdt == dst_dtype) {
        memcpy(dst, src, e->nbytes);
        return FG_OK;
    }
    size_t es = e->dt->size;
    if ((uintptr_t)src % es == 0) return fg_convert(dst, dst_dtype, src, sdt, numel);
    /* Misaligned source (entries are packed without padding): convert through
     * an aligned bounce buffer, a chunk at a time. */
    _Alignas(16) unsigned char tmp[4096];
    int64_t chunk = (int64_t)(sizeof tmp / es);
    size_t ds = fg_dtype_size(dst_dtype);
    for (int64_t k = 0; k < numel; k += chunk) {
        int64_t m = FG_MIN(chunk, numel - k);
        memcpy(tmp, src + (size_t)k * es, (size_t)m * es);
        FG_TRY(fg_convert((unsigned char *)dst + (size_t)k * ds, dst_dtype, tmp, sdt, m));
    }
    return FG_OK;
}

/* The staging of fg_st_read_range_on: converted pieces of a device entry. */
#define ST_STAGE_BYTES ((size_t)4 << 20)

fg_status fg_st_read_range_on(const fg_st_file *f, int64_t i, fg_dev *dev, void *dst,
                              fg_dtype dst_dtype, int64_t lo, int64_t hi) {
    if (!f) return fg_error(FG_EINVAL, "fg_st_read_range_on: NULL file");
    if (i < 0 || i >= f->n)
        return fg_error(FG_EINVAL, "%s: entry index %lld out of range [0, %lld)", f->label,
                        (long long)i, (long long)f->n);
    const st_entry *e = &f->e[i];
    if (lo < 0 || hi < lo || hi > e->numel)
        return fg_error(FG_EINVAL, "%s: tensor \"%.200s\": elements [%lld, %lld) of its %lld",
                        f->label, e->name, (long long)lo, (long long)hi, (long long)e->numel);
    if (!dev || fg_dev_host_accessible(dev)) {
        if (lo == 0 && hi == e->numel) return fg_st_read(f, i, dst, dst_dtype, e->numel);
    } else if (!fg_dtype_valid((int)dst_dtype) || e->dt->fg == FG_DTYPE_DEFAULT) {
        return fg_st_read(f, i, NULL, dst_dtype, e->numel); /* its error, naming the entry */
    }
    if (hi == lo) return FG_OK;
    if (!dst)
        return fg_error(FG_EINVAL, "%s: tensor \"%.200s\": NULL destination", f->label, e->name);
    const unsigned char *src = e->src;
    fg_dtype sdt = e->dt->fg;
    size_t es = e->dt->size, ds = fg_dtype_size(dst_dtype);
    if (sdt == dst_dtype) { /* straight from the mapping */
        size_t at = (size_t)lo * es, bytes = (size_t)(hi - lo) * es;
        if (!dev || fg_dev_host_accessible(dev)) {
            memcpy(dst, src + at, bytes);
            return FG_OK;
        }
        return fg_dev_copy_h2d(dev, dst, src + at, bytes);
    }
    int64_t chunk = (int64_t)(ST_STAGE_BYTES / FG_MAX(es, ds));
    size_t cap = (size_t)FG_MIN(chunk, hi - lo) * FG_MAX(es, ds);
    unsigned char *stage = fg_alloc(2 * cap);
    if (!stage)
        return fg_error(FG_ENOMEM, "%s: tensor \"%.200s\": a staging buffer of %zu bytes", f->label,
                        e->name, 2 * cap);
    fg_status s = FG_OK;
    for (int64_t k = lo; s == FG_OK && k < hi; k += chunk) {
        int64_t m = FG_MIN(chunk, hi - k);
        memcpy(stage, src + (size_t)k * es, (size_t)m * es); /* aligned for the conversion */
        s = fg_convert(stage + cap, dst_dtype, stage, sdt, m);
        if (s != FG_OK) break;
        void *to = (unsigned char *)dst + (size_t)(k - lo) * ds;
        if (!dev || fg_dev_host_accessible(dev)) memcpy(to, stage + cap, (size_t)m * ds);
        else s = fg_dev_copy_h2d(dev, to, stage + cap, (size_t)m * ds);
    }
    fg_free(stage);
    return s;
}

const char *fg_st_meta_get(const fg_st_file *f, const char *key) {
    if (!f || !key || !f->meta) return NULL;
    return json_string_value(json_object_get(f->meta, key)); /* NULL if absent */
}

int64_t fg_st_meta_count(const fg_st_file *f) { return f ? f->nmeta : 0; }

fg_status fg_st_meta_at(const fg_st_file *f, int64_t i, const char **key, const char **value) {
    if (!f || !key || !value) return fg_error(FG_EINVAL, "fg_st_meta_at: NULL argument");
    if (i < 0 || i >= f->nmeta)
        return fg_error(FG_EINVAL, "%s: metadata index %lld out of range [0, %lld)", f->label,
                        (long long)i, (long long)f->nmeta);
    *key = f->meta_k[i];
    *value = f->meta_v[i];
    return FG_OK;
}
