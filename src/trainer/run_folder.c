/* A logger's run folder, shared by the CSV and TensorBoard loggers:
 * <save_dir>/<name>/<version>, made on first use (version NULL = the next
 * free version_N under <save_dir>/<name>), the metric-name prefix, and the
 * hyperparameters written as hparams.yaml (yaml.dump's layout, "{}" when
 * none), as Lightning's loggers lay them out. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "trainer_impl.h"

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

static char *make_dir(const char *save_dir, const char *name, const char *version, char **vnum) {
    char root[4096], dir[4096], vbuf[64];
    if (name[0]) snprintf(root, sizeof root, "%s/%s", save_dir, name);
    else snprintf(root, sizeof root, "%s", save_dir);
    fg_free(*vnum);
    *vnum = NULL;
    if (version) {
        *vnum = fg_strdup(version);
        if (snprintf(dir, sizeof dir, "%s/%s", root, version) >= (int)sizeof dir) return NULL;
        if (fg__mkdirs(dir) != FG_OK) return NULL;
        return fg_strdup(dir);
    }
    /* the next free version_N, made here and nowhere else: a run started at
     * the same moment in the same folder takes the one after */
    if (fg__mkdirs(root) != FG_OK) return NULL;
    for (int64_t n = next_version(root), tries = 0; tries < 1000; n++, tries++) {
        snprintf(vbuf, sizeof vbuf, "version_%lld", (long long)n);
        if (snprintf(dir, sizeof dir, "%s/%s", root, vbuf) >= (int)sizeof dir) return NULL;
        if (mkdir(dir, 0777) != 0) {
            if (errno == EEXIST) continue;
            fg_error(FG_EIO, "cannot create folder %s: %s", dir, strerror(errno));
            return NULL;
        }
        *vnum = fg_alloc(32);
        if (*vnum) snprintf(*vnum, 32, "%lld", (long long)n);
        return fg_strdup(dir);
    }
    fg_error(FG_EIO, "%s: no free version_N folder after 1000 tries", root);
    return NULL;
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

static FG_MUST_USE fg_status hparams_yaml_write(const char *dir, fg_kv *hp, int64_t n,
                                                const char *who) {
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
    /* a record lost on the way (a full disk) is an error, not an empty file */
    bool lost = ferror(fp) != 0;
    int err = errno;
    if (fclose(fp) != 0 || lost)
        return fg_error(FG_EIO, "%s: writing %s: %s", who, path, strerror(lost ? err : errno));
    return FG_OK;
}

static FG_MUST_USE fg_status hparams_merge(fg_kv **into, int64_t *ninto, const fg_kv *hp,
                                           int64_t n) {
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

fg_status fg__run_folder_init(fg__run_folder *f, const char *who, const char *save_dir,
                              const char *name, const char *version, const char *prefix) {
    *f = (fg__run_folder){.who = who};
    if (version && (!version[0] || strchr(version, '/')))
        return fg_error(FG_EINVAL,
                        "%s: version=\"%s\": expected a folder name (or NULL for the next "
                        "version_N)",
                        who, version);
    bool ok = (!save_dir || (f->save_dir = fg_strdup(save_dir))) &&
              (f->name = fg_strdup(name ? name : "lightning_logs")) &&
              (!version || (f->version = fg_strdup(version))) &&
              (f->prefix = fg_strdup(prefix ? prefix : ""));
    if (!ok) {
        fg__run_folder_free(f);
        return FG_ENOMEM;
    }
    return FG_OK;
}

const char *fg__run_folder_dir(fg__run_folder *f, const char *default_root_dir) {
    if (!f->log_dir)
        f->log_dir =
            make_dir(f->save_dir ? f->save_dir : default_root_dir, f->name, f->version, &f->vnum);
    return f->log_dir;
}

char *fg__run_folder_key(const fg__run_folder *f, const char *metric) {
    size_t len = strlen(f->prefix) + 1 + strlen(metric) + 1;
    char *key = fg_alloc(len);
    if (!key) return NULL;
    if (f->prefix[0]) snprintf(key, len, "%s-%s", f->prefix, metric);
    else snprintf(key, len, "%s", metric);
    return key;
}

fg_status fg__run_folder_add_hparams(fg__run_folder *f, const fg_kv *hp, int64_t n) {
    return hparams_merge(&f->hp, &f->nhp, hp, n);
}

fg_status fg__run_folder_write_hparams(fg__run_folder *f) {
    if (!f->log_dir) return FG_OK;
    return hparams_yaml_write(f->log_dir, f->hp, f->nhp, f->who);
}

void fg__run_folder_free(fg__run_folder *f) {
    fg_free(f->save_dir);
    fg_free(f->name);
    fg_free(f->version);
    fg_free(f->prefix);
    fg_free(f->log_dir);
    fg_free(f->vnum);
    for (int64_t i = 0; i < f->nhp; i++) {
        fg_free((char *)f->hp[i].key);
        fg_free((char *)f->hp[i].value);
    }
    fg_free(f->hp);
    *f = (fg__run_folder){0};
}
