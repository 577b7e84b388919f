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
#include <ctype.h>
#include <dirent.h>
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
    char *save_dir, *name, *version, *prefix;
    int64_t flush_every;
    char *log_dir, *vnum;
    char **keys; /* the file's header, sorted */
    int64_t nkeys;
    bool file_written;
    row *rows; /* not yet written */
    int64_t nrows, caprows;
    fg_kv *hp; /* owned copies */
    int64_t nhp;
} csv_logger;

static void free_row(row *r) {
    for (int64_t i = 0; i < r->n; i++) fg_free(r->names[i]);
    fg_free(r->names);
    fg_free(r->values);
    fg_free(r->ints);
}

static void csv_free(void *ud) {
    csv_logger *c = ud;
    fg_free(c->save_dir);
    fg_free(c->name);
    fg_free(c->version);
    fg_free(c->prefix);
    fg_free(c->log_dir);
    fg_free(c->vnum);
    for (int64_t i = 0; i < c->nkeys; i++) fg_free(c->keys[i]);
    fg_free(c->keys);
    for (int64_t i = 0; i < c->nrows; i++) free_row(&c->rows[i]);
    fg_free(c->rows);
    for (int64_t i = 0; i < c->nhp; i++) {
        fg_free((char *)c->hp[i].key);
        fg_free((char *)c->hp[i].value);
    }
    fg_free(c->hp);
    fg_free(c);
}

static int64_t next_version(const char *root) {
    DIR *d = opendir(root);
    int64_t best = -1;
    if (!d) return 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, "version_", 8)) continue;
        const char *num = e->d_name + 8;
        bool digits = *num != '\0';
        for (const char *p = num; *p; p++) digits = digits && isdigit((unsigned char)*p);
        if (digits && atoll(num) > best) best = atoll(num);
    }
    closedir(d);
    return best + 1;
}

char *fg__logger_make_dir(const char *save_dir, const char *name, const char *version,
                          char **vnum) {
    char root[4096], dir[4096], vbuf[64];
    if (name[0]) snprintf(root, sizeof root, "%s/%s", save_dir, name);
    else snprintf(root, sizeof root, "%s", save_dir);
    fg_free(*vnum);
    if (version) {
        *vnum = fg_strdup(version);
    } else {
        int64_t n = next_version(root);
        snprintf(vbuf, sizeof vbuf, "version_%lld", (long long)n);
        version = vbuf;
        *vnum = fg_alloc(32);
        if (*vnum) snprintf(*vnum, 32, "%lld", (long long)n);
    }
    if (snprintf(dir, sizeof dir, "%s/%s", root, version) >= (int)sizeof dir) return NULL;
    if (fg__mkdirs(dir) != FG_OK) return NULL;
    return fg_strdup(dir);
}

static const char *csv_log_dir(void *ud, const char *default_root_dir) {
    csv_logger *c = ud;
    if (c->log_dir) return c->log_dir;
    c->log_dir = fg__logger_make_dir(c->save_dir ? c->save_dir : default_root_dir, c->name,
                                     c->version, &c->vnum);
    if (c->log_dir) {
        char path[4200];
        snprintf(path, sizeof path, "%s/metrics.csv", c->log_dir);
        remove(path); /* Lightning's writer starts the file afresh */
    }
    return c->log_dir;
}

static const char *csv_version(void *ud) { return ((csv_logger *)ud)->vnum; }

static fg_status csv_log_metrics(void *ud, const fg_metric *m, int64_t n, int64_t step) {
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
    size_t pl = strlen(c->prefix);
    for (int64_t i = 0; i < n; i++) {
        size_t len = pl + 1 + strlen(m[i].name) + 1;
        char *name = fg_alloc(len);
        if (!name) {
            free_row(&r);
            return FG_ENOMEM;
        }
        if (pl) snprintf(name, len, "%s-%s", c->prefix, m[i].name);
        else snprintf(name, len, "%s", m[i].name);
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

static fg_status flush_rows(csv_logger *c) {
    if (!c->log_dir) return fg_error(FG_ESTATE, "CSVLogger: no run folder yet");
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.csv", c->log_dir);
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
    if (fclose(fp) != 0)
        return fg_error(FG_EIO, "CSVLogger: writing %s: %s", path, strerror(errno));
    return FG_OK;
}

/* A YAML scalar: plain when YAML reads it back as written, else quoted. */
static void put_yaml(FILE *fp, const char *s) {
    static const char *const words[] = {"null", "Null", "NULL", "~",  "yes", "Yes", "YES", "no",
                                        "No",   "NO",   "on",   "On", "ON",  "off", "Off", "OFF"};
    bool plain = s[0] && !isspace((unsigned char)s[0]) &&
                 !isspace((unsigned char)s[strlen(s) - 1]) &&
                 !strchr("-?:,[]{}#&*!|>'\"%@`", s[0]) && !strstr(s, ": ") && !strstr(s, " #") &&
                 !strpbrk(s, "\n\r\t") && s[strlen(s) - 1] != ':';
    for (size_t i = 0; plain && i < sizeof words / sizeof words[0]; i++)
        plain = strcmp(s, words[i]) != 0;
    /* numbers and true/false stay plain: they are what the user meant */
    if (!plain && s[0] == '-' && strtod(s, NULL) != 0) plain = true;
    if (plain) {
        fputs(s, fp);
        return;
    }
    if (strpbrk(s, "\n\r\t")) {
        fputc('"', fp);
        for (; *s; s++) {
            if (*s == '\n') fputs("\\n", fp);
            else if (*s == '\r') fputs("\\r", fp);
            else if (*s == '\t') fputs("\\t", fp);
            else {
                if (*s == '"' || *s == '\\') fputc('\\', fp);
                fputc(*s, fp);
            }
        }
        fputc('"', fp);
        return;
    }
    fputc('\'', fp);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', fp);
        fputc(*s, fp);
    }
    fputc('\'', fp);
}

static int cmp_kv(const void *a, const void *b) {
    return strcmp(((const fg_kv *)a)->key, ((const fg_kv *)b)->key);
}

fg_status fg__hparams_yaml_write(const char *dir, fg_kv *hp, int64_t n, const char *who) {
    char path[4200];
    snprintf(path, sizeof path, "%s/hparams.yaml", dir);
    FILE *fp = fopen(path, "wb");
    if (!fp) return fg_error(FG_EIO, "%s: cannot write %s: %s", who, path, strerror(errno));
    if (!n) fputs("{}\n", fp);
    if (n) qsort(hp, (size_t)n, sizeof *hp, cmp_kv);
    for (int64_t i = 0; i < n; i++) {
        put_yaml(fp, hp[i].key);
        fputs(": ", fp);
        put_yaml(fp, hp[i].value);
        fputc('\n', fp);
    }
    if (fclose(fp) != 0) return fg_error(FG_EIO, "%s: writing %s: %s", who, path, strerror(errno));
    return FG_OK;
}

fg_status fg__hparams_merge(fg_kv **into, int64_t *ninto, const fg_kv *hp, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (!hp[i].key || !hp[i].value)
            return fg_error(FG_EINVAL, "hparams[%lld]: NULL key or value", (long long)i);
        int64_t at = -1;
        for (int64_t j = 0; j < *ninto && at < 0; j++)
            if (!strcmp((*into)[j].key, hp[i].key)) at = j;
        char *v = fg_strdup(hp[i].value);
        if (!v) return FG_ENOMEM;
        if (at >= 0) {
            fg_free((char *)(*into)[at].value);
            (*into)[at].value = v;
            continue;
        }
        fg_kv *p = fg_realloc(*into, (size_t)(*ninto + 1) * sizeof *p);
        char *k = fg_strdup(hp[i].key);
        if (!p || !k) {
            if (p) *into = p;
            fg_free(k);
            fg_free(v);
            return FG_ENOMEM;
        }
        *into = p;
        (*into)[(*ninto)++] = (fg_kv){k, v};
    }
    return FG_OK;
}

static fg_status csv_log_hparams(void *ud, const fg_kv *hp, int64_t n) {
    csv_logger *c = ud;
    return fg__hparams_merge(&c->hp, &c->nhp, hp, n);
}

static fg_status csv_save(void *ud) {
    csv_logger *c = ud;
    if (!c->nrows) return FG_OK;
    const row *last = &c->rows[c->nrows - 1];
    int64_t step = (int64_t)last->values[last->n - 1];
    return (step + 1) % c->flush_every == 0 ? flush_rows(c) : FG_OK;
}

static fg_status csv_finalize(void *ud, const char *status) {
    (void)status;
    csv_logger *c = ud;
    if (!c->log_dir) return FG_OK;
    FG_TRY(flush_rows(c));
    return fg__hparams_yaml_write(c->log_dir, c->hp, c->nhp, "CSVLogger");
}

static const char *csv_dir_of(const void *ud) { return ((const csv_logger *)ud)->log_dir; }

fg_logger *fg_csv_logger_new(const fg_csv_logger_opts *opts) {
    fg_csv_logger_opts o = opts ? *opts : (fg_csv_logger_opts){0};
    if (o.flush_logs_every_n_steps < 0) {
        fg_error(FG_EINVAL, "CSVLogger: flush_logs_every_n_steps=%lld: expected >= 1 (0 = 100)",
                 (long long)o.flush_logs_every_n_steps);
        return NULL;
    }
    if (o.version && (!o.version[0] || strchr(o.version, '/'))) {
        fg_error(FG_EINVAL,
                 "CSVLogger: version=\"%s\": expected a folder name (or NULL for the "
                 "next version_N)",
                 o.version);
        return NULL;
    }
    csv_logger *c = fg_calloc(1, sizeof *c);
    if (!c) return NULL;
    c->flush_every = o.flush_logs_every_n_steps ? o.flush_logs_every_n_steps : 100;
    bool ok = (!o.save_dir || (c->save_dir = fg_strdup(o.save_dir))) &&
              (c->name = fg_strdup(o.name ? o.name : "lightning_logs")) &&
              (!o.version || (c->version = fg_strdup(o.version))) &&
              (c->prefix = fg_strdup(o.prefix ? o.prefix : ""));
    if (!ok) {
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
    if (lg) lg->dir_of = csv_dir_of;
    return lg;
}

const char *fg_logger_log_dir(const fg_logger *lg) {
    return lg && lg->dir_of ? lg->dir_of(lg->ud) : NULL;
}
