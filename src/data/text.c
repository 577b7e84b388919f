/* Char-level (byte-level) text: the vocabulary and the windowed dataset.
 *
 * The text is read once (a file, or a folder's files concatenated in name
 * order) and encoded in place: ids fit in a byte since a vocabulary has at
 * most 256 entries. Window i is tokens [i*ctx, i*ctx + ctx] (ctx + 1 tokens:
 * x is the first ctx, y the last ctx). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data_impl.h"

struct fg_text_vocab {
    int n;
    uint8_t bytes[256]; /* id -> byte */
    int16_t id[256];    /* byte -> id, -1 if absent */
};

static void vocab_index(fg_text_vocab *v) {
    for (int b = 0; b < 256; b++) v->id[b] = -1;
    for (int k = 0; k < v->n; k++) v->id[v->bytes[k]] = (int16_t)k;
}

fg_text_vocab *fg_text_vocab_new(const uint8_t *bytes, int n) {
    if (n < 1 || n > 256 || !bytes) {
        fg_error(FG_EINVAL, "fg_text_vocab_new: %d bytes (expected 1..256 distinct bytes)", n);
        return NULL;
    }
    bool seen[256] = {false};
    for (int k = 0; k < n; k++) {
        if (seen[bytes[k]]) {
            fg_error(FG_EINVAL, "fg_text_vocab_new: byte 0x%02x appears twice (at %d and before)",
                     bytes[k], k);
            return NULL;
        }
        seen[bytes[k]] = true;
    }
    fg_text_vocab *v = fg_calloc(1, sizeof *v);
    if (!v) return NULL;
    v->n = n;
    memcpy(v->bytes, bytes, (size_t)n);
    vocab_index(v);
    return v;
}

static void vocab_of_counts(fg_text_vocab *v, const bool seen[256]) {
    v->n = 0;
    for (int b = 0; b < 256; b++)
        if (seen[b]) v->bytes[v->n++] = (uint8_t)b;
    vocab_index(v);
}

fg_text_vocab *fg_text_vocab_from_text(const void *text, size_t n) {
    if (n == 0 || !text) {
        fg_error(FG_EINVAL, "fg_text_vocab_from_text: empty text");
        return NULL;
    }
    bool seen[256] = {false};
    const uint8_t *p = text;
    for (size_t i = 0; i < n; i++) seen[p[i]] = true;
    fg_text_vocab *v = fg_calloc(1, sizeof *v);
    if (v) vocab_of_counts(v, seen);
    return v;
}

void fg_text_vocab_free(fg_text_vocab *v) { fg_free(v); }
int fg_text_vocab_size(const fg_text_vocab *v) { return v->n; }
const uint8_t *fg_text_vocab_bytes(const fg_text_vocab *v) { return v->bytes; }
int32_t fg_text_vocab_id(const fg_text_vocab *v, uint8_t byte) { return v->id[byte]; }

static const char *byte_desc(uint8_t b, char buf[16]) {
    if (b >= 0x20 && b < 0x7f && b != '\'') snprintf(buf, 16, "'%c'", b);
    else snprintf(buf, 16, "0x%02x", b);
    return buf;
}

fg_status fg_text_vocab_encode(const fg_text_vocab *v, const char *s, size_t len, int32_t *out) {
    if (!v || (len && (!s || !out)))
        return fg_error(FG_EINVAL, "fg_text_vocab_encode: NULL argument");
    for (size_t i = 0; i < len; i++) {
        int id = v->id[(uint8_t)s[i]];
        if (id < 0) {
            char b[16];
            return fg_error(FG_EINVAL,
                            "text vocabulary: byte %s at position %zu is not in the vocabulary "
                            "of %d bytes",
                            byte_desc((uint8_t)s[i], b), i, v->n);
        }
        out[i] = id;
    }
    return FG_OK;
}

fg_status fg_text_vocab_decode(const fg_text_vocab *v, const int32_t *ids, int64_t n, char *out) {
    if (!v || !out || n < 0 || (n && !ids))
        return fg_error(FG_EINVAL, "fg_text_vocab_decode: NULL argument or negative count");
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= v->n) {
            out[i] = '\0';
            return fg_error(FG_EINVAL, "text vocabulary: id %d at position %lld is outside [0, %d)",
                            (int)ids[i], (long long)i, v->n);
        }
        out[i] = (char)v->bytes[ids[i]];
    }
    out[n] = '\0';
    return FG_OK;
}

/* ------------------------------------------------------------ reading */

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

/* Text is held in memory whole (one byte per character): a file larger
 * than this is refused, as is anything that is not a regular file
 * (/dev/zero, a pipe), which could be read forever. The size the system
 * reports is a first guess only: files of /proc and /sys report 0 bytes
 * and hold text, so every file is read to its end (and at most this). */
#define TEXT_MAX_BYTES ((size_t)1 << 34) /* 16 GiB */

static FG_MUST_USE fg_status too_big(const char *path, size_t size, size_t total) {
    return fg_error(FG_EINVAL,
                    "%s: %zu bytes of text or more (%zu with the files before it) is more than "
                    "the %zu a text dataset holds in memory: tokenize it into a .bin token file",
                    path, size, total, TEXT_MAX_BYTES);
}

/* room for at least `more` bytes after b->n; `grow`: twice the capacity
 * at least (a file longer than it said), else exactly */
static FG_MUST_USE fg_status reserve(buf *b, size_t more, bool grow) {
    if (b->cap - b->n >= more) return FG_OK;
    size_t cap = b->n + more;
    if (grow && cap < 2 * b->cap) cap = 2 * b->cap;
    uint8_t *p = fg_realloc(b->p, cap);
    if (!p) return FG_ENOMEM;
    b->p = p;
    b->cap = cap;
    return FG_OK;
}

static FG_MUST_USE fg_status read_append(buf *b, const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fg_error(FG_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return fg_error(FG_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return fg_error(FG_EINVAL,
                        "%s: not a regular file (a device, pipe or socket): give a text file or "
                        "a folder of them",
                        path);
    }
    size_t size = (size_t)sb.st_size, start = b->n;
    if (size > TEXT_MAX_BYTES || b->n + size > TEXT_MAX_BYTES) {
        close(fd);
        return too_big(path, size, b->n + size);
    }
    /* the reported size and one byte more (to see the end), then as it comes */
    fg_status st = reserve(b, size + 1, false);
    while (st == FG_OK) {
        if (b->cap == b->n && (st = reserve(b, 65536, true)) != FG_OK) break;
        size_t room = b->cap - b->n;
        if (room > TEXT_MAX_BYTES + 1 - b->n) room = TEXT_MAX_BYTES + 1 - b->n;
        ssize_t r = read(fd, b->p + b->n, room);
        if (r < 0) {
            if (errno == EINTR) continue;
            st = fg_error(FG_EIO, "%s: read failed: %s", path, strerror(errno));
            break;
        }
        if (r == 0) break;
        b->n += (size_t)r;
        if (b->n > TEXT_MAX_BYTES) st = too_big(path, b->n - start, b->n);
    }
    close(fd);
    if (st == FG_OK) st = reserve(b, 1, false); /* the byte the callers may add */
    return st;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

/* Appends the regular files of folder `dir` in name order. */
static FG_MUST_USE fg_status read_dir(buf *b, const char *dir, int *nfiles) {
    DIR *d = opendir(dir);
    if (!d) return fg_error(FG_EIO, "%s: cannot open folder: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    fg_status st = FG_OK;
    char *path = NULL;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.' || ends_with(e->d_name, ".dat") || ends_with(e->d_name, ".u8"))
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            char **nn = fg_realloc(names, cap * sizeof *names);
            if (!nn) {
                st = FG_ENOMEM;
                goto done;
            }
            names = nn;
        }
        if (!(names[n] = fg_strdup(e->d_name))) {
            st = FG_ENOMEM;
            goto done;
        }
        n++;
    }
    if (n) qsort(names, n, sizeof *names, cmp_str);
    size_t dl = strlen(dir);
    for (size_t i = 0; i < n; i++) {
        size_t need = dl + strlen(names[i]) + 2;
        fg_free(path);
        if (!(path = fg_alloc(need))) {
            st = FG_ENOMEM;
            goto done;
        }
        snprintf(path, need, "%s/%s", dir, names[i]);
        struct stat sb;
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue; /* folders, broken links */
        if ((st = read_append(b, path)) != FG_OK) goto done;
        (*nfiles)++;
    }
done:
    fg_free(path);
    for (size_t i = 0; i < n; i++) fg_free(names[i]);
    fg_free(names);
    closedir(d);
    return st;
}

/* ------------------------------------------------------------ dataset */

typedef struct text_ds {
    uint8_t *ids; /* encoded text */
    int64_t ntok, ctx;
    fg_text_vocab vocab;
} text_ds;

static int64_t text_len(void *ud) {
    text_ds *t = ud;
    return (t->ntok - 1) / t->ctx;
}

static void text_spec(void *ud, fg_sample_spec *x, fg_sample_spec *y) {
    text_ds *t = ud;
    *x = (fg_sample_spec){.dtype = FG_I32, .ndim = 1, .shape = {t->ctx}};
    *y = *x;
}

static FG_MUST_USE fg_status text_get(void *ud, int64_t i, void *x_out, void *y_out) {
    text_ds *t = ud;
    const uint8_t *p = t->ids + i * t->ctx;
    int32_t *x = x_out, *y = y_out;
    for (int64_t k = 0; k < t->ctx; k++) {
        x[k] = p[k];
        y[k] = p[k + 1];
    }
    return FG_OK;
}

static void text_free(void *ud) {
    text_ds *t = ud;
    if (!t) return;
    fg_free(t->ids);
    fg_free(t);
}

fg_status fg__text_dataset_open(const char *path, int64_t ctx, const fg_text_vocab *vocab,
                                fg_dataset **out) {
    if (!path) {
        return fg_error(FG_EINVAL, "fg_text_dataset_new: NULL path");
    }
    if (ctx < 1) {
        return fg_error(FG_EINVAL, "text dataset %s: ctx=%lld: expected a window length >= 1", path,
                        (long long)ctx);
    }
    *out = NULL;
    buf b = {0};
    text_ds *t = NULL;
    fg_status st;
    struct stat sb;
    if (stat(path, &sb) != 0) {
        return fg_error(FG_EIO, "text dataset %s: %s", path, strerror(errno));
    }
    if (S_ISDIR(sb.st_mode)) {
        int nfiles = 0;
        if ((st = read_dir(&b, path, &nfiles)) != FG_OK) goto fail;
        if (nfiles == 0) {
            st = fg_error(FG_EINVAL, "text dataset %s: the folder holds no text file", path);
            goto fail;
        }
    } else if ((st = read_append(&b, path)) != FG_OK) {
        goto fail;
    }
    if (b.n < (size_t)ctx + 1) {
        st = fg_error(FG_EINVAL,
                      "text dataset %s: %zu bytes of text, fewer than ctx + 1 = %lld: use a longer "
                      "text or a smaller ctx",
                      path, b.n, (long long)ctx + 1);
        goto fail;
    }
    if (!(t = fg_calloc(1, sizeof *t))) {
        st = FG_ENOMEM;
        goto fail;
    }
    if (vocab) {
        t->vocab = *vocab;
    } else {
        bool seen[256] = {false};
        for (size_t i = 0; i < b.n; i++) seen[b.p[i]] = true;
        vocab_of_counts(&t->vocab, seen);
    }
    for (size_t i = 0; i < b.n; i++) {
        int id = t->vocab.id[b.p[i]];
        if (id < 0) {
            char d[16];
            st = fg_error(
                FG_EINVAL,
                "text dataset %s: byte %s at offset %zu is not in the given vocabulary of %d "
                "bytes: build the vocabulary from a text that contains it",
                path, byte_desc(b.p[i], d), i, t->vocab.n);
            goto fail;
        }
        b.p[i] = (uint8_t)id;
    }
    t->ids = b.p;
    b.p = NULL;
    t->ntok = (int64_t)b.n;
    t->ctx = ctx;
    static const fg_dataset_ops ops = {text_len, text_spec, text_get, text_free};
    fg_dataset *ds = fg_dataset_new(&ops, t, "text"); /* frees t on failure */
    if (!ds) return FG_ENOMEM;
    ds->vocab_size = t->vocab.n;
    ds->text_vocab = &t->vocab;
    *out = ds;
    return FG_OK;
fail:
    fg_free(b.p);
    fg_free(t);
    return st;
}

fg_dataset *fg_text_dataset_new(const char *path, int64_t ctx, const fg_text_vocab *vocab) {
    fg_dataset *ds = NULL;
    return fg__text_dataset_open(path, ctx, vocab, &ds) == FG_OK ? ds : NULL;
}
