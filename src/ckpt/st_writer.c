/* The safetensors writer.
 *
 * Invariants: entries[i] holds the borrowed data of the i-th added entry;
 * its JSON description (dtype, shape, data_offsets) is built at add time, so
 * offsets are the running sum of the sizes in the order of addition and the
 * entries tile the data buffer exactly. A failed add or set_meta leaves the
 * writer as it was. The file is: 8-byte little-endian header length N, N
 * bytes of compact JSON padded with spaces to a multiple of 8, then the
 * entries' bytes back to back.
 *
 * Streaming (fg_st_writer_begin, _put, _finish): the header depends only on
 * names, dtypes and shapes, so it is written first; the entries declared
 * without data (fg_st_writer_declare) then get their bytes from _put, in
 * order, and the entries added with data are written by the writer itself
 * when the stream reaches them. While streaming, `a` is the open file,
 * `cur` the entry being written and `done` its bytes so far; `failed` keeps
 * a stream whose write failed (the temporary file is removed at once) from
 * taking more. fg_st_writer_write is a stream with nothing to put. */
#include <jansson.h>
#include <string.h>

#include "ckpt_impl.h"

typedef struct st_item {
    char *name;
    json_t *desc; /* owned reference to {"dtype", "shape", "data_offsets"} */
    const void *data;
    size_t nbytes;
    fg_dev *dev;   /* data is this device's memory (fg_st_writer_add_on): staged at write */
    bool deferred; /* declared: the bytes come from fg_st_writer_put */
} st_item;

struct fg_st_writer {
    st_item *items;
    int64_t n, cap;
    size_t total;  /* bytes of data so far */
    json_t *names; /* name -> null, to refuse duplicates in O(1) */
    json_t *meta;  /* key -> value, in order of first setting */
    /* a stream (fg_st_writer_begin .. _finish) */
    bool streaming, failed;
    fg__afile a;
    int64_t cur; /* the entry being written */
    size_t done; /* bytes of it written */
    void *stage; /* host staging of device data, of stage_dev */
    fg_dev *stage_dev;
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

static void stream_end(fg_st_writer *w);

void fg_st_writer_free(fg_st_writer *w) {
    if (!w) return;
    if (w->streaming) { /* never finished: nothing replaces the target */
        fg_error_kept why;
        fg_error_keep(&why);
        fg__afile_abort(&w->a);
        stream_end(w);
        fg_error_restore(&why);
    }
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

#define STAGE_BYTES ((size_t)4 << 20) /* the host staging of an entry on a device */

fg_status fg_st_writer_add(fg_st_writer *w, const char *name, fg_dtype dtype, int ndim,
                           const int64_t *shape, const void *data) {
    return fg_st_writer_add_on(w, name, dtype, ndim, shape, data, NULL);
}

static FG_MUST_USE fg_status add_entry(fg_st_writer *w, const char *name, fg_dtype dtype, int ndim,
                                       const int64_t *shape, const void *data, fg_dev *dev,
                                       bool deferred) {
    if (!w || !name) return fg_error(FG_EINVAL, "fg_st_writer_add: NULL writer or name");
    if (w->streaming)
        return fg_error(FG_ESTATE,
                        "entry \"%.200s\": added while the file is being written (between "
                        "fg_st_writer_begin and fg_st_writer_finish)",
                        name);
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
    if (nbytes > 0 && !data && !deferred)
        return fg_error(FG_EINVAL, "entry \"%.200s\": NULL data for %zu bytes", name, nbytes);

    if (w->n == w->cap) {
        int64_t cap = w->cap ? 2 * w->cap : 16;
        st_item *it = fg_realloc(w->items, (size_t)cap * sizeof *it);
        if (!it) return FG_ENOMEM;
        w->items = it;
        w->cap = cap;
    }
    st_item item = {.name = fg_strdup(name),
                    .data = deferred ? NULL : data,
                    .nbytes = nbytes,
                    .deferred = deferred && nbytes > 0};
    if (!deferred && dev && !fg_dev_host_accessible(dev)) item.dev = dev;
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

fg_status fg_st_writer_add_on(fg_st_writer *w, const char *name, fg_dtype dtype, int ndim,
                              const int64_t *shape, const void *data, fg_dev *dev) {
    return add_entry(w, name, dtype, ndim, shape, data, dev, false);
}

fg_status fg_st_writer_declare(fg_st_writer *w, const char *name, fg_dtype dtype, int ndim,
                               const int64_t *shape) {
    return add_entry(w, name, dtype, ndim, shape, NULL, NULL, true);
}

fg_status fg_st_writer_set_meta(fg_st_writer *w, const char *key, const char *value) {
    if (!w || !key || !value) return fg_error(FG_EINVAL, "fg_st_writer_set_meta: NULL argument");
    if (w->streaming)
        return fg_error(FG_ESTATE,
                        "metadata \"%.200s\": set while the file is being written (between "
                        "fg_st_writer_begin and fg_st_writer_finish)",
                        key);
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

static void stream_end(fg_st_writer *w) {
    if (w->stage) fg_dev_host_free(w->stage_dev, w->stage);
    w->stage = NULL;
    w->stage_dev = NULL;
    w->streaming = false;
}

/* A failure while streaming: the temporary file removed, the stream
 * closed; returns st (the caller's message kept). */
static FG_MUST_USE fg_status stream_fail(fg_st_writer *w, fg_status st) {
    fg_error_kept why;
    fg_error_keep(&why);
    fg__afile_abort(&w->a);
    stream_end(w);
    w->failed = true;
    fg_error_restore(&why);
    return st;
}

/* n bytes at p (in dev's memory when dev is set) into the file: device
 * memory through one bounded host buffer, a chunk at a time. */
static FG_MUST_USE fg_status write_bytes(fg_st_writer *w, const st_item *it, const void *p,
                                         size_t n, fg_dev *dev) {
    if (!dev) return fg__afile_write(&w->a, p, n);
    if (w->stage && w->stage_dev != dev) {
        fg_dev_host_free(w->stage_dev, w->stage);
        w->stage = NULL;
    }
    if (!w->stage) {
        if (!(w->stage = fg_dev_host_alloc(dev, STAGE_BYTES)))
            return fg_error_wrap(fg_last_status(), "entry \"%.200s\": a staging buffer", it->name);
        w->stage_dev = dev;
    }
    for (size_t at = 0; at < n; at += STAGE_BYTES) {
        size_t len = n - at < STAGE_BYTES ? n - at : STAGE_BYTES;
        FG_TRY(fg_dev_copy_d2h(dev, w->stage, (const char *)p + at, len));
        FG_TRY(fg__afile_write(&w->a, w->stage, len));
    }
    return FG_OK;
}

/* Writes the entries with data from w->cur on, up to the next declared
 * one still owed bytes (or the end). */
static FG_MUST_USE fg_status write_ready(fg_st_writer *w) {
    while (w->cur < w->n) {
        const st_item *it = &w->items[w->cur];
        if (it->deferred) {
            if (w->done < it->nbytes) return FG_OK;
        } else {
            FG_TRY(write_bytes(w, it, it->data, it->nbytes, it->dev));
        }
        w->cur++;
        w->done = 0;
    }
    return FG_OK;
}

fg_status fg_st_writer_begin(fg_st_writer *w, const char *path) {
    if (!w || !path) return fg_error(FG_EINVAL, "fg_st_writer_begin: NULL writer or path");
    if (w->streaming)
        return fg_error(FG_ESTATE, "%s: fg_st_writer_begin while another file is being written",
                        path);
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
    fg_status st = fg__afile_open(&w->a, path);
    if (st != FG_OK) {
        fg_free(hdr);
        return st;
    }
    w->streaming = true;
    w->failed = false;
    w->cur = 0;
    w->done = 0;
    st = fg__afile_write(&w->a, len8, 8);
    if (st == FG_OK) st = fg__afile_write(&w->a, hdr, hlen);
    if (st == FG_OK) st = fg__afile_write(&w->a, spaces, padded - hlen);
    fg_free(hdr);
    if (st == FG_OK) st = write_ready(w);
    return st == FG_OK ? FG_OK : stream_fail(w, st);
}

fg_status fg_st_writer_put(fg_st_writer *w, const void *data, size_t nbytes, fg_dev *dev) {
    if (!w) return fg_error(FG_EINVAL, "fg_st_writer_put: NULL writer");
    if (!w->streaming)
        return fg_error(FG_ESTATE, "fg_st_writer_put: %s",
                        w->failed ? "the file's write failed already; nothing more is taken"
                                  : "no file is being written (fg_st_writer_begin first)");
    if (nbytes == 0) return FG_OK;
    if (w->cur >= w->n)
        return stream_fail(w, fg_error(FG_EINVAL,
                                       "fg_st_writer_put: %zu bytes more than the %zu bytes the "
                                       "header declares",
                                       nbytes, w->total));
    const st_item *it = &w->items[w->cur];
    if (nbytes > it->nbytes - w->done)
        return stream_fail(w, fg_error(FG_EINVAL,
                                       "entry \"%.200s\": %zu bytes put where %zu are left of "
                                       "its %zu",
                                       it->name, nbytes, it->nbytes - w->done, it->nbytes));
    if (!data)
        return stream_fail(
            w, fg_error(FG_EINVAL, "entry \"%.200s\": NULL data for %zu bytes", it->name, nbytes));
    if (dev && fg_dev_host_accessible(dev)) dev = NULL;
    fg_status st = write_bytes(w, it, data, nbytes, dev);
    if (st == FG_OK) {
        w->done += nbytes;
        st = write_ready(w);
    }
    return st == FG_OK ? FG_OK : stream_fail(w, st);
}

fg_status fg_st_writer_finish(fg_st_writer *w) {
    if (!w) return fg_error(FG_EINVAL, "fg_st_writer_finish: NULL writer");
    if (!w->streaming)
        return fg_error(FG_ESTATE, "fg_st_writer_finish: %s",
                        w->failed ? "the file's write failed; nothing was written"
                                  : "no file is being written (fg_st_writer_begin first)");
    if (w->cur < w->n) {
        const st_item *it = &w->items[w->cur];
        return stream_fail(w, fg_error(FG_ESTATE,
                                       "entry \"%.200s\": %zu of its %zu bytes put; the file "
                                       "is not written",
                                       it->name, w->done, it->nbytes));
    }
    stream_end(w);
    return fg__afile_commit(&w->a);
}

fg_status fg_st_writer_write(fg_st_writer *w, const char *path) {
    if (!w || !path) return fg_error(FG_EINVAL, "fg_st_writer_write: NULL writer or path");
    for (int64_t i = 0; i < w->n; i++)
        if (w->items[i].deferred)
            return fg_error(FG_ESTATE,
                            "%s: entry \"%.200s\" was declared without data: write it with "
                            "fg_st_writer_begin, fg_st_writer_put and fg_st_writer_finish",
                            path, w->items[i].name);
    FG_TRY(fg_st_writer_begin(w, path));
    return fg_st_writer_finish(w);
}
