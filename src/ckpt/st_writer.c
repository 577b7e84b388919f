/* The safetensors writer.
 *
 * Invariants: entries[i] holds the borrowed data of the i-th added entry;
 * its JSON description (dtype, shape, data_offsets) is built at add time, so
 * offsets are the running sum of the sizes in the order of addition and the
 * entries tile the data buffer exactly. A failed add or set_meta leaves the
 * writer as it was. The file is: 8-byte little-endian header length N, N
 * bytes of compact JSON padded with spaces to a multiple of 8, then the
 * entries' bytes back to back. */
#include <jansson.h>
#include <string.h>

#include "ckpt_impl.h"

typedef struct st_item {
    char *name;
    json_t *desc; /* owned reference to {"dtype", "shape", "data_offsets"} */
    const void *data;
    size_t nbytes;
} st_item;

struct fg_st_writer {
    st_item *items;
    int64_t n, cap;
    size_t total;  /* bytes of data so far */
    json_t *names; /* name -> null, to refuse duplicates in O(1) */
    json_t *meta;  /* key -> value, in order of first setting */
};

fg_st_writer *fg_st_writer_new(void) {
    fg__st_json_init();
    fg_st_writer *w = fg_calloc(1, sizeof *w);
    if (!w) return NULL;
    w->names = json_object();
    w->meta = json_object();
    if (!w->names || !w->meta) {
        fg_st_writer_free(w);
        fg_error(FG_ENOMEM, "fg_st_writer_new: out of memory");
        return NULL;
    }
    return w;
}

void fg_st_writer_free(fg_st_writer *w) {
    if (!w) return;
    for (int64_t i = 0; i < w->n; i++) {
        fg_free(w->items[i].name);
        json_decref(w->items[i].desc);
    }
    fg_free(w->items);
    json_decref(w->names);
    json_decref(w->meta);
    fg_free(w);
}

int64_t fg_st_writer_count(const fg_st_writer *w) { return w ? w->n : 0; }

int64_t fg_st_writer_meta_count(const fg_st_writer *w) {
    return w ? (int64_t)json_object_size(w->meta) : 0;
}

fg_status fg_st_writer_meta_at(const fg_st_writer *w, int64_t i, const char **key,
                               const char **value) {
    if (!w || !key || !value) return fg_error(FG_EINVAL, "writer_meta_at: NULL argument");
    int64_t k = 0;
    const char *name;
    json_t *v;
    json_object_foreach(w->meta, name, v) {
        if (k++ != i) continue;
        *key = name;
        *value = json_string_value(v);
        return FG_OK;
    }
    return fg_error(FG_EINVAL, "writer_meta_at: index %lld out of range [0, %lld)", (long long)i,
                    (long long)json_object_size(w->meta));
}

static json_t *make_desc(fg_dtype dtype, int ndim, const int64_t *shape, size_t begin, size_t end) {
    json_t *d = json_object(), *sh = json_array(), *off = json_array();
    if (!d || !sh || !off) goto fail;
    for (int k = 0; k < ndim; k++)
        if (json_array_append_new(sh, json_integer(shape[k])) != 0) goto fail;
    if (json_array_append_new(off, json_integer((json_int_t)begin)) != 0 ||
        json_array_append_new(off, json_integer((json_int_t)end)) != 0)
        goto fail;
    if (json_object_set_new(d, "dtype", json_string(fg_dtype_st_name(dtype))) != 0) goto fail;
    int rc = json_object_set_new(d, "shape", sh);
    sh = NULL;
    if (rc != 0) goto fail;
    rc = json_object_set_new(d, "data_offsets", off);
    off = NULL;
    if (rc != 0) goto fail;
    return d;
fail:
    json_decref(d);
    json_decref(sh);
    json_decref(off);
    return NULL;
}

fg_status fg_st_writer_add(fg_st_writer *w, const char *name, fg_dtype dtype, int ndim,
                           const int64_t *shape, const void *data) {
    if (!w || !name) return fg_error(FG_EINVAL, "fg_st_writer_add: NULL writer or name");
    size_t nlen = strlen(name);
    if (nlen == 0) return fg_error(FG_EINVAL, "fg_st_writer_add: empty entry name");
    if (!fg__utf8_valid(name, nlen))
        return fg_error(FG_EINVAL, "entry \"%.200s\": name is not valid UTF-8", name);
    if (!strcmp(name, "__metadata__"))
        return fg_error(FG_EINVAL, "entry \"__metadata__\": the name is reserved for metadata");
    if (!fg_dtype_valid((int)dtype))
        return fg_error(FG_EINVAL,
                        "entry \"%.200s\": dtype %d (%s): expected a real dtype, FG_F64 .. FG_U16",
                        name, (int)dtype, fg_dtype_name(dtype));
    if (ndim < 0 || ndim > FG_ST_MAX_NDIM)
        return fg_error(FG_EINVAL, "entry \"%.200s\": ndim %d, expected 0..%d", name, ndim,
                        FG_ST_MAX_NDIM);
    if (ndim > 0 && !shape)
        return fg_error(FG_EINVAL, "entry \"%.200s\": NULL shape with ndim %d", name, ndim);
    if (json_object_get(w->names, name))
        return fg_error(FG_EINVAL, "entry \"%.200s\": added twice", name);
    int64_t numel = 1;
    for (int k = 0; k < ndim; k++) {
        if (shape[k] < 0)
            return fg_error(FG_EINVAL, "entry \"%.200s\": shape[%d] = %lld is negative", name, k,
                            (long long)shape[k]);
        if (__builtin_mul_overflow(numel, shape[k], &numel))
            return fg_error(FG_EINVAL, "entry \"%.200s\": element count overflows", name);
    }
    size_t nbytes, end;
    if (__builtin_mul_overflow((size_t)numel, fg_dtype_size(dtype), &nbytes) ||
        __builtin_add_overflow(w->total, nbytes, &end) || end > (size_t)INT64_MAX)
        return fg_error(FG_EINVAL, "entry \"%.200s\": %lld elements of %s overflow the file size",
                        name, (long long)numel, fg_dtype_st_name(dtype));
    if (nbytes > 0 && !data)
        return fg_error(FG_EINVAL, "entry \"%.200s\": NULL data for %zu bytes", name, nbytes);

    if (w->n == w->cap) {
        int64_t cap = w->cap ? 2 * w->cap : 16;
        st_item *it = fg_realloc(w->items, (size_t)cap * sizeof *it);
        if (!it) return FG_ENOMEM;
        w->items = it;
        w->cap = cap;
    }
    st_item item = {.name = fg_strdup(name), .data = data, .nbytes = nbytes};
    item.desc = make_desc(dtype, ndim, shape, w->total, end);
    if (!item.name || !item.desc || json_object_set_new(w->names, name, json_null()) != 0) {
        fg_free(item.name);
        json_decref(item.desc);
        return fg_error(FG_ENOMEM, "entry \"%.200s\": out of memory", name);
    }
    w->items[w->n++] = item;
    w->total = end;
    return FG_OK;
}

fg_status fg_st_writer_set_meta(fg_st_writer *w, const char *key, const char *value) {
    if (!w || !key || !value) return fg_error(FG_EINVAL, "fg_st_writer_set_meta: NULL argument");
    if (!*key) return fg_error(FG_EINVAL, "fg_st_writer_set_meta: empty key");
    if (!fg__utf8_valid(key, strlen(key)))
        return fg_error(FG_EINVAL, "metadata key \"%.200s\": not valid UTF-8", key);
    if (!fg__utf8_valid(value, strlen(value)))
        return fg_error(FG_EINVAL, "metadata \"%.200s\": value is not valid UTF-8", key);
    json_t *v = json_string(value);
    /* json_object_set_new consumes v even when it fails. */
    if (!v || json_object_set_new(w->meta, key, v) != 0)
        return fg_error(FG_ENOMEM, "metadata \"%.200s\": out of memory", key);
    return FG_OK;
}

/* The header JSON, metadata first then entries in data order. */
static char *build_header(const fg_st_writer *w) {
    json_t *root = json_object();
    char *s = NULL;
    if (!root) return NULL;
    if (json_object_size(w->meta) > 0 && json_object_set(root, "__metadata__", w->meta) != 0)
        goto done;
    for (int64_t i = 0; i < w->n; i++)
        if (json_object_set(root, w->items[i].name, w->items[i].desc) != 0) goto done;
    s = json_dumps(root, JSON_COMPACT);
done:
    json_decref(root);
    return s;
}

fg_status fg_st_writer_write(fg_st_writer *w, const char *path) {
    if (!w || !path) return fg_error(FG_EINVAL, "fg_st_writer_write: NULL writer or path");
    char *hdr = build_header(w);
    if (!hdr) return fg_error(FG_ENOMEM, "%s: out of memory building the header", path);
    size_t hlen = strlen(hdr), padded = (hlen + 7) & ~(size_t)7;
    if (padded > FG_ST_MAX_HEADER) {
        fg_free(hdr);
        return fg_error(FG_EINVAL,
                        "%s: header of %zu bytes exceeds the %u-byte limit of the format", path,
                        padded, FG_ST_MAX_HEADER);
    }
    unsigned char len8[8], spaces[8] = "        ";
    for (int k = 0; k < 8; k++) len8[k] = (unsigned char)((uint64_t)padded >> (8 * k));

    fg__afile a;
    fg_status st = fg__afile_open(&a, path);
    if (st != FG_OK) {
        fg_free(hdr);
        return st;
    }
    FG_TRY_GOTO(fg__afile_write(&a, len8, 8), st, fail);
    FG_TRY_GOTO(fg__afile_write(&a, hdr, hlen), st, fail);
    FG_TRY_GOTO(fg__afile_write(&a, spaces, padded - hlen), st, fail);
    for (int64_t i = 0; i < w->n; i++)
        FG_TRY_GOTO(fg__afile_write(&a, w->items[i].data, w->items[i].nbytes), st, fail);
    fg_free(hdr);
    return fg__afile_commit(&a);
fail:
    fg__afile_abort(&a);
    fg_free(hdr);
    return st;
}
