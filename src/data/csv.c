/* The CSV / TSV reader: a file (gzip-compressed or not: zlib's gzread reads
 * both as they are) is read whole, split into records by RFC 4180's rules
 * (quotes, doubled quotes, separators and line breaks inside quotes),
 * unescaped in place, then typed column by column into one f32 feature
 * matrix and one label vector that the dataset's get copies from.
 * Invariants: every record has as many fields as the header; a field is a
 * NUL-terminated string inside the read buffer (unescaping only shrinks, so
 * the write position never passes the read position); each field keeps the
 * line it starts on, for messages. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "data_impl.h"

#define VALUE_SHOW 40 /* characters of a bad value quoted in a message */

typedef struct field {
    size_t off;   /* into the buffer: a NUL-terminated string */
    int64_t line; /* 1-based line the field starts on */
} field;

typedef struct category {
    char *column;
    int64_t n;
    char **texts; /* sorted, distinct */
} category;

typedef struct csv_ds {
    int64_t n, d;
    float *x;     /* (n, d) */
    void *y;      /* (n) int32 or float */
    fg_dtype ydt; /* FG_I32 or FG_F32 */
    char **feat;  /* d names */
    char *label;
    int ncats;
    category *cats;
} csv_ds;

static void csv_free(void *ud) {
    csv_ds *c = ud;
    if (!c) return;
    fg_free(c->x);
    fg_free(c->y);
    for (int64_t k = 0; c->feat && k < c->d; k++) fg_free(c->feat[k]);
    fg_free(c->feat);
    fg_free(c->label);
    for (int k = 0; k < c->ncats; k++) {
        for (int64_t j = 0; j < c->cats[k].n; j++) fg_free(c->cats[k].texts[j]);
        fg_free(c->cats[k].texts);
        fg_free(c->cats[k].column);
    }
    fg_free(c->cats);
    fg_free(c);
}

static int64_t csv_len(void *ud) { return ((csv_ds *)ud)->n; }
static void csv_spec(void *ud, fg_sample_spec *x, fg_sample_spec *y) {
    csv_ds *c = ud;
    *x = (fg_sample_spec){.dtype = FG_F32, .ndim = 1, .shape = {c->d}};
    *y = (fg_sample_spec){.dtype = c->ydt, .ndim = 0};
}
static FG_MUST_USE fg_status csv_get(void *ud, int64_t i, void *x, void *y) {
    csv_ds *c = ud;
    memcpy(x, c->x + i * c->d, (size_t)c->d * sizeof(float));
    memcpy(y, (char *)c->y + (size_t)i * 4, 4);
    return FG_OK;
}
static const fg_dataset_ops csv_ops = {csv_len, csv_spec, csv_get, csv_free};

/* ----------------------------------------------------------- reading */

/* The whole file, decompressed if it is gzip; one spare byte at the end. */
static FG_MUST_USE fg_status read_all(const char *path, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fg_error(FG_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return fg_error(FG_EIO, "%s: not a regular file", path);
    }
    gzFile g = gzdopen(fd, "rb");
    if (!g) {
        close(fd);
        return fg_error(FG_ENOMEM, "%s: zlib could not open the stream", path);
    }
    fg_status s = FG_OK;
    char *p = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (cap - n < 65537) {
            size_t nc = cap ? 2 * cap : 1 << 20;
            char *q = fg_realloc(p, nc);
            if (!q) {
                s = FG_ENOMEM;
                break;
            }
            p = q;
            cap = nc;
        }
        int r = gzread(g, p + n, 65536);
        if (r < 0) {
            int zerr;
            const char *m = gzerror(g, &zerr);
            s = fg_error(FG_EIO, "%s: cannot read%s: %s", path,
                         zerr == Z_ERRNO ? "" : " (a corrupt gzip stream?)",
                         zerr == Z_ERRNO ? strerror(errno) : m);
            break;
        }
        if (r == 0) {
            int zerr;
            const char *m = gzerror(g, &zerr);
            if (zerr != Z_OK && zerr != Z_STREAM_END)
                s = fg_error(FG_EIO, "%s: a truncated or corrupt gzip stream: %s", path, m);
            break;
        }
        n += (size_t)r;
    }
    gzclose(g);
    if (s != FG_OK) {
        fg_free(p);
        return s;
    }
    *out = p;
    *len = n;
    return FG_OK;
}

/* A growable array of fields. */
typedef struct fields {
    field *v;
    int64_t n, cap;
} fields;

static FG_MUST_USE fg_status push(fields *f, size_t off, int64_t line) {
    if (f->n == f->cap) {
        int64_t nc = f->cap ? 2 * f->cap : 4096;
        field *q = fg_realloc(f->v, (size_t)nc * sizeof *q);
        if (!q) return FG_ENOMEM;
        f->v = q;
        f->cap = nc;
    }
    f->v[f->n++] = (field){off, line};
    return FG_OK;
}

/* Splits buf[0, len) into records of `ncols` fields (ncols == 0: the first
 * record sets it). All fields go to `out`, record after record. */
static FG_MUST_USE fg_status split(const char *path, char *buf, size_t len, char sep, fields *out,
                                   int64_t *ncols) {
    size_t r = 0, w = 0;
    int64_t line = 1;
    if (len >= 3 && memcmp(buf, "\xEF\xBB\xBF", 3) == 0) r = 3; /* a UTF-8 byte order mark */
    while (r < len) {
        int64_t rec_line = line, first = out->n;
        bool blank = true;
        for (;;) { /* one field */
            size_t start = w;
            int64_t fline = line;
            bool end_rec = false;
            if (r < len && buf[r] == '"') {
                blank = false;
                r++;
                for (;;) {
                    if (r >= len)
                        return fg_error(FG_EFORMAT,
                                        "%s:%lld: field %lld: a quote is never closed (the quoted "
                                        "field runs to the end of the file)",
                                        path, (long long)fline, (long long)(out->n - first + 1));
                    if (buf[r] == '"') {
                        if (r + 1 < len && buf[r + 1] == '"') {
                            buf[w++] = '"';
                            r += 2;
                            continue;
                        }
                        r++;
                        break;
                    }
                    if (buf[r] == '\n') line++;
                    buf[w++] = buf[r++];
                }
                if (r < len && buf[r] != sep && buf[r] != '\n' && buf[r] != '\r')
                    return fg_error(FG_EFORMAT,
                                    "%s:%lld: field %lld: '%c' after a closing quote (expected "
                                    "the separator or the end of the line; a quote inside a "
                                    "quoted field is written \"\")",
                                    path, (long long)line, (long long)(out->n - first + 1), buf[r]);
            } else {
                while (r < len && buf[r] != sep && buf[r] != '\n' && buf[r] != '\r')
                    buf[w++] = buf[r++];
                if (w > start) blank = false;
            }
            if (r >= len) end_rec = true;
            else if (buf[r] == sep) {
                blank = false;
                r++;
            } else { /* \n, \r\n or a lone \r */
                if (buf[r] == '\r' && r + 1 < len && buf[r + 1] == '\n') r++;
                r++;
                line++;
                end_rec = true;
            }
            buf[w++] = '\0'; /* w <= r: the separator or line end just read is overwritten */
            FG_TRY(push(out, start, fline));
            if (end_rec) break;
        }
        int64_t nf = out->n - first;
        if (blank && nf == 1) { /* an empty line */
            out->n = first;
            continue;
        }
        if (*ncols == 0) *ncols = nf;
        else if (nf != *ncols)
            return fg_error(FG_EFORMAT, "%s:%lld: %lld fields, but the header has %lld", path,
                            (long long)rec_line, (long long)nf, (long long)*ncols);
    }
    return FG_OK;
}

/* ------------------------------------------------------------ typing */

enum { CELL_MISSING, CELL_INT, CELL_FLOAT, CELL_TEXT };

/* What a cell holds, and its number in *d for CELL_INT (an integer that
 * fits in int32) and CELL_FLOAT (strtod's decimal syntax; spaces and tabs
 * around it are allowed, as Python's float() allows them). */
static int classify(const char *v, double *d) {
    if (!*v) return CELL_MISSING;
    const char *p = v;
    while (*p == ' ' || *p == '\t') p++;
    const char *q = p + (*p == '+' || *p == '-');
    if (q[0] == '0' && (q[1] == 'x' || q[1] == 'X')) return CELL_TEXT; /* no hex in CSV */
    char *e;
    double x = strtod(p, &e);
    if (e == p) return CELL_TEXT;
    const char *end = e;
    while (*e == ' ' || *e == '\t' || *e == '\r') e++;
    if (*e) return CELL_TEXT;
    *d = x;
    bool digits = q < end;
    for (const char *r = q; r < end && digits; r++) digits = *r >= '0' && *r <= '9';
    return digits && x >= INT32_MIN && x <= INT32_MAX ? CELL_INT : CELL_FLOAT;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

typedef struct reader {
    const char *path;
    const fg_csv_opts *o;
    char *buf;
    fields f;
    int64_t ncols, nrows; /* data rows */
    int64_t row0;         /* index of the first data record (1 with a header) */
    char **names;         /* ncols */
    fg_csv_type *type;    /* ncols */
} reader;

static const char *cell(const reader *rd, int64_t row, int64_t col, int64_t *line) {
    const field *fl = &rd->f.v[(rd->row0 + row) * rd->ncols + col];
    if (line) *line = fl->line;
    return rd->buf + fl->off;
}

static FG_MUST_USE fg_status bad_value(const reader *rd, int64_t row, int64_t col,
                                       const char *what) {
    int64_t line;
    const char *v = cell(rd, row, col, &line);
    if (!*v)
        return fg_error(FG_EFORMAT,
                        "%s:%lld: column '%s' (%lld): a missing value (set fill_missing to read "
                        "it as fill_value)",
                        rd->path, (long long)line, rd->names[col], (long long)col + 1);
    return fg_error(FG_EFORMAT, "%s:%lld: column '%s' (%lld): value \"%.*s%s\" is not %s", rd->path,
                    (long long)line, rd->names[col], (long long)col + 1, VALUE_SHOW, v,
                    strlen(v) > VALUE_SHOW ? "..." : "", what);
}

static FG_MUST_USE fg_status find_col(const reader *rd, const char *name, const char *what,
                                      int64_t *col) {
    *col = -1;
    for (int64_t c = 0; c < rd->ncols; c++) {
        if (strcmp(rd->names[c], name) != 0) continue;
        if (*col >= 0)
            return fg_error(FG_EINVAL,
                            "%s: %s '%s' is ambiguous: columns %lld and %lld are both "
                            "named so",
                            rd->path, what, name, (long long)*col + 1, (long long)c + 1);
        *col = c;
    }
    if (*col < 0) {
        char cols[256] = "";
        size_t k = 0;
        for (int64_t c = 0; c < rd->ncols && k < sizeof cols - 8; c++)
            k += (size_t)snprintf(cols + k, sizeof cols - k, "%s'%s'", c ? ", " : "", rd->names[c]);
        return fg_error(FG_EINVAL, "%s: %s '%s' is no column of the header (it has %s%s)", rd->path,
                        what, name, cols, k >= sizeof cols - 8 ? ", ..." : "");
    }
    return FG_OK;
}

/* The sorted distinct texts of column c into cat (missing values are the
 * category "" with fill_missing, else an error). */
static FG_MUST_USE fg_status make_category(const reader *rd, int64_t c, category *cat) {
    char **v = fg_alloc((size_t)FG_MAX(rd->nrows, 1) * sizeof *v);
    if (!v) return FG_ENOMEM;
    for (int64_t i = 0; i < rd->nrows; i++) {
        v[i] = (char *)cell(rd, i, c, NULL);
        if (!*v[i] && !rd->o->fill_missing) {
            fg_free(v);
            return bad_value(rd, i, c, "");
        }
    }
    qsort(v, (size_t)rd->nrows, sizeof *v, cmp_str);
    int64_t n = 0;
    for (int64_t i = 0; i < rd->nrows; i++)
        if (i == 0 || strcmp(v[i], v[n - 1]) != 0) v[n++] = v[i];
    cat->texts = fg_calloc((size_t)FG_MAX(n, 1), sizeof *cat->texts);
    cat->column = fg_strdup(rd->names[c]);
    fg_status s = cat->texts && cat->column ? FG_OK : FG_ENOMEM;
    for (int64_t k = 0; s == FG_OK && k < n; k++) {
        cat->texts[k] = fg_strdup(v[k]);
        if (!cat->texts[k]) s = FG_ENOMEM;
        cat->n = k + 1;
    }
    fg_free(v);
    return s;
}

static int64_t category_of(const category *cat, const char *v) {
    char *const *p = bsearch(&v, cat->texts, (size_t)cat->n, sizeof *cat->texts, cmp_str);
    return p ? p - cat->texts : -1;
}

/* Column col of every row, typed as the reader says or, for FG_CSV_AUTO,
 * by its values (*typed: the type used), into fout[i * stride] as f32 when
 * there is no iout or the column is float, else into iout[i] as i32. One strtod per cell, in one
 * pass over the column. */
static FG_MUST_USE fg_status column_values(reader *rd, csv_ds *c, int64_t col, double *vals,
                                           uint8_t *cls, float *fout, int32_t *iout, int64_t stride,
                                           fg_csv_type *typed) {
    fg_csv_type t = rd->type[col];
    if (t != FG_CSV_CATEGORY) {
        bool any = false, all_int = true, text = false;
        for (int64_t i = 0; i < rd->nrows; i++) {
            cls[i] = (uint8_t)classify(cell(rd, i, col, NULL), &vals[i]);
            any |= cls[i] != CELL_MISSING;
            all_int &= cls[i] == CELL_INT || cls[i] == CELL_MISSING;
            text |= cls[i] == CELL_TEXT;
        }
        if (t == FG_CSV_AUTO)
            t = text ? FG_CSV_CATEGORY : any && all_int ? FG_CSV_INT : FG_CSV_FLOAT;
    }
    *typed = t;
    category *cat = NULL;
    if (t == FG_CSV_CATEGORY) {
        category *q = fg_realloc(c->cats, (size_t)(c->ncats + 1) * sizeof *q);
        if (!q) return FG_ENOMEM;
        c->cats = q;
        cat = &c->cats[c->ncats++];
        *cat = (category){0};
        FG_TRY(make_category(rd, col, cat));
    }
    for (int64_t i = 0; i < rd->nrows; i++) {
        double d;
        if (t == FG_CSV_CATEGORY) {
            d = (double)category_of(cat, cell(rd, i, col, NULL));
        } else if (cls[i] == CELL_MISSING) {
            if (!rd->o->fill_missing) return bad_value(rd, i, col, "");
            d = rd->o->fill_value;
        } else if (cls[i] == CELL_TEXT || (t == FG_CSV_INT && cls[i] != CELL_INT)) {
            return bad_value(rd, i, col,
                             t == FG_CSV_INT ? "an integer that fits in int32" : "a number");
        } else {
            d = vals[i];
        }
        if (fout && (!iout || t == FG_CSV_FLOAT)) fout[i * stride] = (float)d;
        else iout[i] = d >= INT32_MIN && d <= INT32_MAX ? (int32_t)d : 0; /* a fill value */
    }
    return FG_OK;
}

fg_status fg__csv_dataset_open(const char *path, const fg_csv_opts *o, fg_dataset **out) {
    static const fg_csv_opts zero = {0};
    *out = NULL;
    if (!path) return fg_error(FG_EINVAL, "fg_csv_dataset_new: NULL path");
    if (!o) o = &zero;
    reader rd = {.path = path, .o = o};
    csv_ds *c = NULL;
    int64_t *fcols = NULL;
    double *vals = NULL;
    uint8_t *cls = NULL;
    fg_status s = FG_OK;
    char sep = o->sep;
    if (!sep) {
        size_t n = strlen(path);
        bool tsv = (n >= 4 && strcmp(path + n - 4, ".tsv") == 0) ||
                   (n >= 7 && strcmp(path + n - 7, ".tsv.gz") == 0);
        sep = tsv ? '\t' : ',';
    }
    if (sep == '"' || sep == '\n' || sep == '\r') {
        return fg_error(FG_EINVAL,
                        "%s: separator '%c' (%d): expected a character other than a "
                        "quote or a line break",
                        path, sep, sep);
    }
    size_t len;
    FG_TRY(read_all(path, &rd.buf, &len));
    s = split(path, rd.buf, len, sep, &rd.f, &rd.ncols);
    if (s != FG_OK) goto fail;
    rd.row0 = o->no_header ? 0 : 1;
    rd.nrows = rd.ncols ? rd.f.n / rd.ncols - rd.row0 : 0;
    if (rd.ncols == 0 || rd.nrows <= 0) {
        s = fg_error(FG_EFORMAT, "%s: %s", path,
                     rd.ncols == 0 ? "an empty file (expected a header row and data rows)"
                                   : "a header but no data rows");
        goto fail;
    }
    rd.names = fg_calloc((size_t)rd.ncols, sizeof *rd.names);
    rd.type = fg_calloc((size_t)rd.ncols, sizeof *rd.type);
    c = fg_calloc(1, sizeof *c);
    if (!rd.names || !rd.type || !c) goto nomem;
    for (int64_t k = 0; k < rd.ncols; k++) {
        char num[24];
        snprintf(num, sizeof num, "%lld", (long long)k);
        rd.names[k] = fg_strdup(o->no_header ? num : rd.buf + rd.f.v[k].off);
        if (!rd.names[k]) goto nomem;
    }
    for (int k = 0; k < o->ncolumns; k++) {
        int64_t col;
        if (!o->columns[k].name) {
            s = fg_error(FG_EINVAL, "%s: columns[%d] has no name", path, k);
            goto fail;
        }
        if ((int)o->columns[k].type < 0 || o->columns[k].type > FG_CSV_SKIP) {
            s = fg_error(FG_EINVAL, "%s: column '%s': type %d: expected an fg_csv_type", path,
                         o->columns[k].name, (int)o->columns[k].type);
            goto fail;
        }
        if ((s = find_col(&rd, o->columns[k].name, "column", &col)) != FG_OK) goto fail;
        rd.type[col] = o->columns[k].type;
    }
    int64_t lcol = rd.ncols - 1;
    if (o->label && (s = find_col(&rd, o->label, "label", &lcol)) != FG_OK) goto fail;
    if (rd.type[lcol] == FG_CSV_SKIP) {
        s = fg_error(FG_EINVAL, "%s: the label column '%s' is marked FG_CSV_SKIP", path,
                     rd.names[lcol]);
        goto fail;
    }
    int64_t d = 0;
    fcols = fg_alloc((size_t)rd.ncols * sizeof *fcols);
    if (!fcols) goto nomem;
    if (o->features) {
        for (int k = 0; k < o->nfeatures; k++) {
            int64_t col;
            if (!o->features[k]) {
                s = fg_error(FG_EINVAL, "%s: features[%d] is NULL", path, k);
                goto fail;
            }
            if ((s = find_col(&rd, o->features[k], "feature", &col)) != FG_OK) goto fail;
            const char *why = col == lcol                   ? "is the label"
                              : rd.type[col] == FG_CSV_SKIP ? "is marked FG_CSV_SKIP"
                                                            : NULL;
            for (int64_t j = 0; !why && j < d; j++)
                if (fcols[j] == col) why = "is named twice";
            if (why) {
                s = fg_error(FG_EINVAL, "%s: feature '%s' %s", path, o->features[k], why);
                goto fail;
            }
            fcols[d++] = col;
        }
    } else {
        for (int64_t col = 0; col < rd.ncols; col++)
            if (col != lcol && rd.type[col] != FG_CSV_SKIP) fcols[d++] = col;
    }
    c->n = rd.nrows;
    c->d = d;
    c->x = fg_alloc((size_t)FG_MAX(rd.nrows * d, 1) * sizeof(float));
    c->y = fg_alloc((size_t)rd.nrows * 4);
    c->feat = fg_calloc((size_t)FG_MAX(d, 1), sizeof *c->feat);
    c->label = fg_strdup(rd.names[lcol]);
    if (!c->x || !c->y || !c->feat || !c->label) goto nomem;
    vals = fg_alloc((size_t)rd.nrows * sizeof *vals);
    cls = fg_alloc((size_t)rd.nrows);
    if (!vals || !cls) goto nomem;
    fg_csv_type typed;
    for (int64_t k = 0; k < d; k++) {
        c->feat[k] = fg_strdup(rd.names[fcols[k]]);
        if (!c->feat[k]) goto nomem;
        s = column_values(&rd, c, fcols[k], vals, cls, c->x + k, NULL, d, &typed);
        if (s != FG_OK) goto fail;
    }
    /* the label: f32 if its column is float, else i32, in the same 4-byte slots */
    s = column_values(&rd, c, lcol, vals, cls, c->y, c->y, 1, &typed);
    if (s != FG_OK) goto fail;
    c->ydt = typed == FG_CSV_FLOAT ? FG_F32 : FG_I32;
    fg_free(vals);
    fg_free(cls);
    vals = NULL;
    cls = NULL;
    for (int64_t k = 0; k < rd.ncols; k++) fg_free(rd.names[k]);
    fg_free(rd.names);
    fg_free(rd.type);
    fg_free(rd.f.v);
    fg_free(rd.buf);
    fg_free(fcols);
    *out = fg_dataset_new(&csv_ops, c, "csv");
    return *out ? FG_OK : fg_last_status();
nomem:
    s = FG_ENOMEM;
fail:
    fg_free(vals);
    fg_free(cls);
    for (int64_t k = 0; rd.names && k < rd.ncols; k++) fg_free(rd.names[k]);
    fg_free(rd.names);
    fg_free(rd.type);
    fg_free(rd.f.v);
    fg_free(rd.buf);
    fg_free(fcols);
    csv_free(c);
    return s;
}

fg_dataset *fg_csv_dataset_new(const char *path, const fg_csv_opts *o) {
    fg_dataset *ds;
    return fg__csv_dataset_open(path, o, &ds) == FG_OK ? ds : NULL;
}

static const csv_ds *as_csv(const fg_dataset *ds) {
    return ds && ds->ops.get == csv_get ? ds->ud : NULL;
}

const char *fg_csv_dataset_feature(const fg_dataset *ds, int64_t k) {
    const csv_ds *c = as_csv(ds);
    return c && k >= 0 && k < c->d ? c->feat[k] : NULL;
}

const char *fg_csv_dataset_label(const fg_dataset *ds) {
    const csv_ds *c = as_csv(ds);
    return c ? c->label : NULL;
}

static const category *find_cat(const fg_dataset *ds, const char *column) {
    const csv_ds *c = as_csv(ds);
    for (int k = 0; c && column && k < c->ncats; k++)
        if (strcmp(c->cats[k].column, column) == 0) return &c->cats[k];
    return NULL;
}

const char *fg_csv_dataset_category(const fg_dataset *ds, const char *column, int64_t k) {
    const category *cat = find_cat(ds, column);
    return cat && k >= 0 && k < cat->n ? cat->texts[k] : NULL;
}

int64_t fg_csv_dataset_num_categories(const fg_dataset *ds, const char *column) {
    const category *cat = find_cat(ds, column);
    return cat ? cat->n : 0;
}
