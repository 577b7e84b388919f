/* CSVLogger, laid out as Lightning's: <save_dir>/<name>/<version>/ holds
 * metrics.csv (one row per log_metrics call; the header is the sorted union
 * of every name logged, "step" among them; a name first seen later makes
 * the file be rewritten under the wider header; rows end in "\r\n" and
 * fields are quoted when they must be, as Python's csv module writes) and
 * hparams.yaml (yaml.dump of the hyperparameters, "{}" when none).
 *
 * The trainer calls it on global rank 0 only. Rows wait in memory until a
 * flush: every flush_logs_every_n_steps steps and at finalize. The run
 * folder is chosen on first use (the next free version_N) and made then;
 * a metrics.csv already there is replaced, as Lightning's. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "trainer_impl.h"

typedef struct row {
    int64_t n;
    char **names;
    double *values;
    bool *ints; /* written as integers: step, and the epoch the trainer adds */
} row;

typedef struct csv_logger {
    fg__run_folder f;
    int64_t flush_every;
    char **keys; /* the file's header, sorted */
    int64_t nkeys;
    bool file_written;
    row *rows; /* not yet written */
    int64_t nrows, caprows;
} csv_logger;

static void free_row(row *r) {
    for (int64_t i = 0; i < r->n; i++) fg_free(r->names[i]);
    fg_free(r->names);
    fg_free(r->values);
    fg_free(r->ints);
}

static void csv_free(void *ud) {
    csv_logger *c = ud;
    fg__run_folder_free(&c->f);
    for (int64_t i = 0; i < c->nkeys; i++) fg_free(c->keys[i]);
    fg_free(c->keys);
    for (int64_t i = 0; i < c->nrows; i++) free_row(&c->rows[i]);
    fg_free(c->rows);
    fg_free(c);
}

static const char *csv_log_dir(void *ud, const char *default_root_dir) {
    csv_logger *c = ud;
    if (c->f.log_dir) return c->f.log_dir;
    const char *dir = fg__run_folder_dir(&c->f, default_root_dir);
    if (dir) {
        char path[4200];
        snprintf(path, sizeof path, "%s/metrics.csv", dir);
        remove(path); /* Lightning's writer starts the file afresh */
    }
    return dir;
}

static const char *csv_version(void *ud) { return ((csv_logger *)ud)->f.vnum; }

static FG_MUST_USE fg_status csv_log_metrics(void *ud, const fg_metric *m, int64_t n,
                                             int64_t step) {
    csv_logger *c = ud;
    if (c->nrows == c->caprows) {
        int64_t cap = c->caprows ? 2 * c->caprows : 64;
        row *p = fg_realloc(c->rows, (size_t)cap * sizeof *p);
        if (!p) return FG_ENOMEM;
        c->rows = p;
        c->caprows = cap;
    }
    row r = {0};
    r.names = fg_calloc((size_t)n + 1, sizeof *r.names);
    r.values = fg_calloc((size_t)n + 1, sizeof *r.values);
    r.ints = fg_calloc((size_t)n + 1, sizeof *r.ints);
    if (!r.names || !r.values || !r.ints) {
        free_row(&r);
        return FG_ENOMEM;
    }
    for (int64_t i = 0; i < n; i++) {
        char *name = fg__run_folder_key(&c->f, m[i].name);
        if (!name) {
            free_row(&r);
            return FG_ENOMEM;
        }
        r.names[r.n] = name;
        r.ints[r.n] = !strcmp(m[i].name, "epoch") && m[i].value == (double)(int64_t)m[i].value;
        r.values[r.n++] = m[i].value;
    }
    r.names[r.n] = fg_strdup("step");
    if (!r.names[r.n]) {
        free_row(&r);
        return FG_ENOMEM;
    }
    r.ints[r.n] = true;
    r.values[r.n++] = (double)step;
    c->rows[c->nrows++] = r;
    return FG_OK;
}

/* A field as Python's csv module writes it (QUOTE_MINIMAL). */
static void put_field(FILE *fp, const char *s) {
    if (!strpbrk(s, ",\"\r\n")) {
        fputs(s, fp);
        return;
    }
    fputc('"', fp);
    for (; *s; s++) {
        if (*s == '"') fputc('"', fp);
        fputc(*s, fp);
    }
    fputc('"', fp);
}

static void put_value(FILE *fp, bool is_int, double v) {
    char buf[64];
    if (is_int) snprintf(buf, sizeof buf, "%lld", (long long)v);
    else fg__fmt_float(buf, sizeof buf, v);
    fputs(buf, fp);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int64_t key_index(const csv_logger *c, const char *name) {
    for (int64_t i = 0; i < c->nkeys; i++)
        if (!strcmp(c->keys[i], name)) return i;
    return -1;
}

/* Reads metrics.csv back as rows of strings (Python's csv dialect). */
static char **read_csv(const char *path, int64_t *nfields_per, int64_t *nrec) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    size_t cap = 0, len = 0;
    char *text = NULL;
    for (int ch; (ch = fgetc(fp)) != EOF;) {
        if (len + 2 > cap) {
            cap = cap ? 2 * cap : 4096;
            char *p = fg_realloc(text, cap);
            if (!p) {
                fg_free(text);
                fclose(fp);
                return NULL;
            }
            text = p;
        }
        text[len++] = (char)ch;
    }
    fclose(fp);
    if (!text) return NULL;
    text[len] = '\0';
    /* fields go into one array; records are nfields_per[0] wide (the header's) */
    int64_t capf = 64, nf = 0, width = 0, in_rec = 0;
    char **fields = fg_calloc((size_t)capf, sizeof *fields);
    char *buf = fg_alloc(len + 1);
    if (!fields || !buf) {
        fg_free(fields);
        fg_free(buf);
        fg_free(text);
        return NULL;
    }
    size_t i = 0;
    *nrec = 0;
    while (i < len) {
        size_t k = 0;
        if (text[i] == '"') {
            for (i++; i < len; i++) {
                if (text[i] == '"' && i + 1 < len && text[i + 1] == '"') buf[k++] = text[i++];
                else if (text[i] == '"') {
                    i++;
                    break;
                } else buf[k++] = text[i];
            }
        }
        while (i < len && text[i] != ',' && text[i] != '\r' && text[i] != '\n')
            buf[k++] = text[i++];
        buf[k] = '\0';
        if (nf == capf) {
            capf *= 2;
            char **p = fg_realloc(fields, (size_t)capf * sizeof *p);
            if (!p) break;
            fields = p;
        }
        fields[nf++] = fg_strdup(buf);
        in_rec++;
        if (i < len && text[i] == ',') {
            i++;
            continue;
        }
        while (i < len && (text[i] == '\r' || text[i] == '\n')) i++;
        if (*nrec == 0) width = in_rec;
        (*nrec)++;
        /* pad short records so that every record is `width` wide */
        while (in_rec < width && nf < capf) fields[nf++] = fg_strdup(""), in_rec++;
        in_rec = 0;
    }
    *nfields_per = width;
    fg_free(buf);
    fg_free(text);
    return fields;
}

static FG_MUST_USE fg_status flush_rows(csv_logger *c) {
    if (!c->f.log_dir) return fg_error(FG_ESTATE, "CSVLogger: no run folder yet");
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.csv", c->f.log_dir);
    /* new names widen the header */
    int64_t old_n = c->nkeys;
    bool widen = false;
    for (int64_t r = 0; r < c->nrows; r++)
        for (int64_t i = 0; i < c->rows[r].n; i++)
            if (key_index(c, c->rows[r].names[i]) < 0) {
                widen = true;
                char **p = fg_realloc(c->keys, (size_t)(c->nkeys + 1) * sizeof *p);
                char *k = fg_strdup(c->rows[r].names[i]);
                if (!p || !k) {
                    if (p) c->keys = p;
                    fg_free(k);
                    return FG_ENOMEM;
                }
                c->keys = p;
                c->keys[c->nkeys++] = k;
            }
    if (widen) qsort(c->keys, (size_t)c->nkeys, sizeof *c->keys, cmp_str);
    char **old = NULL;
    int64_t width = 0, nrec = 0;
    if (widen && c->file_written) {
        old = read_csv(path, &width, &nrec);
        if (!old) {
            return fg_error(FG_EIO, "CSVLogger: cannot read %s back to widen its header", path);
        }
    }
    FILE *fp = fopen(path, (c->file_written && !widen) ? "ab" : "wb");
    if (!fp) {
        for (int64_t i = 0; old && i < width * nrec; i++) fg_free(old[i]);
        fg_free(old);
        return fg_error(FG_EIO, "CSVLogger: cannot write %s: %s", path, strerror(errno));
    }
    if (!c->file_written || widen) {
        for (int64_t i = 0; i < c->nkeys; i++) {
            if (i) fputc(',', fp);
            put_field(fp, c->keys[i]);
        }
        fputs("\r\n", fp);
    }
    if (old) {
        /* the rows already written, under the wider header */
        for (int64_t r = 1; r < nrec; r++) {
            for (int64_t i = 0; i < c->nkeys; i++) {
                if (i) fputc(',', fp);
                for (int64_t j = 0; j < width && j < old_n; j++)
                    if (!strcmp(old[j], c->keys[i])) put_field(fp, old[r * width + j]);
            }
            fputs("\r\n", fp);
        }
        for (int64_t i = 0; i < width * nrec; i++) fg_free(old[i]);
        fg_free(old);
    }
    for (int64_t r = 0; r < c->nrows; r++) {
        const row *rw = &c->rows[r];
        for (int64_t i = 0; i < c->nkeys; i++) {
            if (i) fputc(',', fp);
            for (int64_t j = rw->n - 1; j >= 0; j--) /* the last value of a name wins */
                if (!strcmp(rw->names[j], c->keys[i])) {
                    put_value(fp, rw->ints[j], rw->values[j]);
                    break;
                }
        }
        fputs("\r\n", fp);
        free_row(&c->rows[r]);
    }
    c->nrows = 0;
    c->file_written = true;
    /* rows lost on the way (a full disk) are an error naming the file */
    bool lost = ferror(fp) != 0;
    int err = errno;
    if (fclose(fp) != 0 || lost)
        return fg_error(FG_EIO, "CSVLogger: writing %s: %s (its rows are lost)", path,
                        strerror(lost ? err : errno));
    return FG_OK;
}

static FG_MUST_USE fg_status csv_log_hparams(void *ud, const fg_kv *hp, int64_t n) {
    csv_logger *c = ud;
    return fg__run_folder_add_hparams(&c->f, hp, n);
}

static FG_MUST_USE fg_status csv_save(void *ud) {
    csv_logger *c = ud;
    if (!c->nrows) return FG_OK;
    const row *last = &c->rows[c->nrows - 1];
    int64_t step = (int64_t)last->values[last->n - 1];
    return (step + 1) % c->flush_every == 0 ? flush_rows(c) : FG_OK;
}

static FG_MUST_USE fg_status csv_finalize(void *ud, const char *status) {
    (void)status;
    csv_logger *c = ud;
    if (!c->f.log_dir) return FG_OK;
    FG_TRY(flush_rows(c));
    return fg__run_folder_write_hparams(&c->f);
}

static const char *csv_dir_of(const void *ud) { return ((const csv_logger *)ud)->f.log_dir; }

fg_logger *fg_csv_logger_new(const fg_csv_logger_opts *opts) {
    fg_csv_logger_opts o = opts ? *opts : (fg_csv_logger_opts){0};
    if (o.flush_logs_every_n_steps < 0) {
        fg_error(FG_EINVAL, "CSVLogger: flush_logs_every_n_steps=%lld: expected >= 1 (0 = 100)",
                 (long long)o.flush_logs_every_n_steps);
        return NULL;
    }
    csv_logger *c = fg_calloc(1, sizeof *c);
    if (!c) return NULL;
    c->flush_every = o.flush_logs_every_n_steps ? o.flush_logs_every_n_steps : 100;
    if (fg__run_folder_init(&c->f, "CSVLogger", o.save_dir, o.name, o.version, o.prefix) != FG_OK) {
        csv_free(c);
        return NULL;
    }
    fg_logger_ops ops = {.name = "CSVLogger",
                         .log_hyperparams = csv_log_hparams,
                         .log_metrics = csv_log_metrics,
                         .save = csv_save,
                         .finalize = csv_finalize,
                         .log_dir = csv_log_dir,
                         .version = csv_version,
                         .free = csv_free};
    fg_logger *lg = fg_logger_new(&ops, c);
    if (lg) {
        lg->dir_of = csv_dir_of;
        lg->folder = &c->f;
    }
    return lg;
}

const char *fg_logger_log_dir(const fg_logger *lg) {
    return lg && lg->dir_of ? lg->dir_of(lg->ud) : NULL;
}
