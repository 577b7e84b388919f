/* Sharded checkpoints: the index (Hugging Face's model.safetensors.index.json
 * layout) and the reader that presents a folder of safetensors files as one
 * file.
 *
 * Reading trusts the index no more than a file's header: it is read whole
 * (at most FG_ST_MAX_HEADER bytes), parsed with duplicate keys refused,
 * every file name is a plain name in the index's folder (no '/', no
 * leading '.': nothing outside the folder is ever opened), each named file
 * is opened and checked by fg__st_open_file, and the map and the files must
 * agree both ways: every mapped tensor is in its file, every tensor of a
 * mapped file is mapped to that file. The files must also be of the save
 * the index describes: the keys a sharded save writes into each file's
 * metadata (save_id, step, shard, num_shards) are compared with the index's
 * and with the count of files, before any tensor is read (check_parts).
 * The aggregate's entries borrow names, shapes and bytes from the parts,
 * which live as long as it does. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_impl.h"

static bool plain_name(const char *s) { return s[0] && s[0] != '.' && !strchr(s, '/'); }

/* ----------------------------------------------------------------- write */

fg_status fg_st_write_index(const char *path, int64_t n, const char *const *names,
                            const char *const *files, uint64_t total_size, const fg_kv *meta,
                            int64_t nmeta) {
    if (!path || n < 0 || (n && (!names || !files)) || nmeta < 0 || (nmeta && !meta))
        return fg_error(FG_EINVAL, "write_index: NULL or negative argument");
    fg__st_json_init();
    json_t *root = json_object(), *md = json_object(), *map = json_object();
    fg_status st = FG_OK;
    if (!root || !md || !map) {
        st = fg_error(FG_ENOMEM, "%s: building the index", path);
        goto out;
    }
    if (json_object_set_new(md, "total_size", json_integer((json_int_t)total_size))) st = FG_ENOMEM;
    for (int64_t i = 0; i < nmeta && st == FG_OK; i++) {
        const char *k = meta[i].key, *v = meta[i].value;
        if (!k || !v || !*k || !strcmp(k, "total_size") || !fg__utf8_valid(k, strlen(k)) ||
            !fg__utf8_valid(v, strlen(v)))
            st = fg_error(FG_EINVAL,
                          "%s: metadata entry %lld (\"%.100s\"): expected a non-empty UTF-8 key "
                          "other than total_size and a UTF-8 value",
                          path, (long long)i, k ? k : "(null)");
        else if (json_object_set_new(md, k, json_string(v))) st = FG_ENOMEM;
    }
    for (int64_t i = 0; i < n && st == FG_OK; i++) {
        const char *k = names[i], *v = files[i];
        if (!k || !*k || !v || !plain_name(v) || !fg__utf8_valid(k, strlen(k)) ||
            !fg__utf8_valid(v, strlen(v)))
            st = fg_error(FG_EINVAL,
                          "%s: tensor %lld (\"%.100s\") in file \"%.100s\": expected a non-empty "
                          "UTF-8 name and a file name without '/' or a leading '.'",
                          path, (long long)i, k ? k : "(null)", v ? v : "(null)");
        else if (json_object_get(map, k))
            st = fg_error(FG_EINVAL, "%s: tensor \"%.200s\" is given twice", path, k);
        else if (json_object_set_new(map, k, json_string(v))) st = FG_ENOMEM;
    }
    if (st == FG_ENOMEM && !fg_last_error()[0]) fg_error(FG_ENOMEM, "%s: building the index", path);
    if (st != FG_OK) goto out;
    json_object_set(root, "metadata", md);
    json_object_set(root, "weight_map", map);
    char *text = json_dumps(root, JSON_INDENT(2));
    if (!text) {
        st = fg_error(FG_ENOMEM, "%s: out of memory writing the index", path);
        goto out;
    }
    fg__afile a;
    st = fg__afile_open(&a, path);
    if (st == FG_OK) st = fg__afile_write(&a, text, strlen(text));
    if (st == FG_OK) st = fg__afile_write(&a, "\n", 1);
    if (st == FG_OK) st = fg__afile_commit(&a);
    else fg__afile_abort(&a);
    fg_free(text);
out:
    json_decref(root);
    json_decref(md);
    json_decref(map);
    return st;
}

/* ------------------------------------------------------------------ read */

static FG_MUST_USE fg_status bad(const char *index, const char *fmt, const char *a, const char *b) {
    char msg[640];
    snprintf(msg, sizeof msg, fmt, a, b);
    return fg_error(FG_EFORMAT, "%s: %s", index, msg);
}

/* The whole index file, NUL-terminated, in *text. */
static FG_MUST_USE fg_status read_text(const char *index, char **text, size_t *len) {
    char eb[128];
    int fd = open(index, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return fg_error(FG_EIO, "%s: %s", index, fg__errstr(errno, eb, sizeof eb));
    struct stat sb;
    fg_status st = FG_OK;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = fg_error(FG_EIO, "%s: not a regular file", index);
    } else if ((uint64_t)sb.st_size > FG_ST_MAX_HEADER) {
        st = fg_error(FG_EFORMAT, "%s: %lld bytes, more than the %u an index may have", index,
                      (long long)sb.st_size, FG_ST_MAX_HEADER);
    } else if (!(*text = fg_alloc((size_t)sb.st_size + 1))) {
        st = FG_ENOMEM;
    } else {
        size_t got = 0, want = (size_t)sb.st_size;
        while (got < want) {
            ssize_t k = read(fd, *text + got, want - got);
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) break;
            got += (size_t)k;
        }
        (*text)[got] = '\0';
        *len = got;
        if (got != want) {
            st = fg_error(FG_EIO, "%s: read %zu of %zu bytes", index, got, want);
            fg_free(*text);
            *text = NULL;
        }
    }
    close(fd);
    return st;
}

/* The part called `file`, opened on first use; its index in f->parts. */
static FG_MUST_USE fg_status part_of(fg_st_file *f, const char *dir, const char *file,
                                     json_t *opened, int64_t *k) {
    json_t *have = json_object_get(opened, file);
    if (have) {
        *k = (int64_t)json_integer_value(have);
        return FG_OK;
    }
    size_t n = strlen(dir) + strlen(file) + 2;
    char *path = fg_alloc(n);
    if (!path) return FG_ENOMEM;
    snprintf(path, n, "%s/%s", dir, file);
    fg_st_file *p = NULL;
    fg_status st = fg__st_open_file(path, &p);
    fg_free(path);
    if (st != FG_OK) return fg_error_wrap(st, "%s: the file the index names", f->label);
    *k = f->nparts;
    f->parts[f->nparts++] = p;
    if (json_object_set_new(opened, file, json_integer((json_int_t)*k))) return FG_ENOMEM;
    return FG_OK;
}

/* A count as a sharded save writes it: decimal digits only, no sign, at
 * most 18 of them (so no overflow). */
static bool parse_count(const char *s, int64_t *out) {
    int64_t v = 0;
    size_t n = 0;
    for (; s[n] >= '0' && s[n] <= '9'; n++) v = v * 10 + (s[n] - '0');
    if (!n || n > 18 || s[n]) return false;
    *out = v;
    return true;
}

static const char *base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static FG_MUST_USE fg_status not_of_this_save(const fg_st_file *f, const char *file,
                                              const char *field, const char *got,
                                              const char *want) {
    return fg_error(FG_EFORMAT,
                    "%s: %.200s is not a file of the save this index describes: its %s is "
                    "%.100s%s%s, the index's %.100s%s%s (a file of another save or another run "
                    "copied into the folder?); put back together the files of one save, or "
                    "resume from another checkpoint",
                    f->label, file, field, got ? "\"" : "", got ? got : "missing", got ? "\"" : "",
                    want ? "\"" : "", want ? want : "missing", want ? "\"" : "");
}

/* Every file against the index, before anything is read from it: the same
 * save_id (one per save; an index without one, as saves before save ids
 * wrote, needs files without one), the index's step, a num_shards equal to
 * the number of files the index names, and shard numbers 1..num_shards,
 * each once, agreeing with a name "model-<i>-of-<n>.safetensors". Keys a
 * file does not have are not compared (Hugging Face's shards have none),
 * but a file with a shard number needs a step and a count. */
static FG_MUST_USE fg_status check_parts(fg_st_file *f, json_t *md) {
    const char *id = md ? json_string_value(json_object_get(md, "save_id")) : NULL;
    const char *step = md ? json_string_value(json_object_get(md, "step")) : NULL;
    bool *seen = fg_calloc((size_t)f->nparts + 1, 1);
    if (!seen) return FG_ENOMEM;
    char n_files[32];
    snprintf(n_files, sizeof n_files, "%lld", (long long)f->nparts);
    fg_status st = FG_OK;
    for (int64_t k = 0; st == FG_OK && k < f->nparts; k++) {
        const fg_st_file *p = f->parts[k];
        const char *file = base_name(p->label);
        const char *pid = fg_st_meta_get(p, "save_id"), *pstep = fg_st_meta_get(p, "step");
        const char *sh = fg_st_meta_get(p, "shard"), *ns = fg_st_meta_get(p, "num_shards");
        int64_t v = 0, count = 0;
        if ((id || pid) && (!id || !pid || strcmp(id, pid))) {
            st = not_of_this_save(f, file, "save_id", pid, id);
        } else if (pstep && !parse_count(pstep, &v)) {
            st = bad(f->label,
                     "%.200s: metadata step \"%.100s\" is not a step (expected a decimal "
                     "integer >= 0); the file is damaged: resume from another checkpoint",
                     file, pstep);
        } else if (pstep && step && !parse_count(step, &v)) {
            st = bad(f->label,
                     "metadata step \"%.100s\" is not a step (expected a decimal integer >= 0, "
                     "as %.200s says); the index is damaged or was edited: resume from another "
                     "checkpoint",
                     step, file);
        } else if ((pstep || sh) && (!pstep || !step || strcmp(pstep, step))) {
            st = not_of_this_save(f, file, "step", pstep, step);
        } else if ((sh || ns) && (!sh || !ns || !parse_count(ns, &count))) {
            st = bad(f->label,
                     "%.200s: metadata shard and num_shards are %s, expected both, as decimal "
                     "integers; the file is damaged: resume from another checkpoint",
                     file, sh && ns ? "not numbers" : "not both there");
        } else if (ns && count != f->nparts) {
            st = fg_error(FG_EFORMAT,
                          "%s: %.200s says it is one of num_shards = %s files, but the index "
                          "names %s (a file of another save copied in, or one missing?); put "
                          "back together the files of one save, or resume from another "
                          "checkpoint",
                          f->label, file, ns, n_files);
        } else if (sh && (!parse_count(sh, &v) || v < 1 || v > count)) {
            st = fg_error(FG_EFORMAT,
                          "%s: %.200s: metadata shard \"%.100s\" is not a shard number of 1 to "
                          "%s; the file is damaged: resume from another checkpoint",
                          f->label, file, sh, ns);
        } else if (sh && seen[v]) {
            st = fg_error(FG_EFORMAT,
                          "%s: %.200s is shard %s, as another file the index names is (a file "
                          "of another save copied in?); put back together the files of one "
                          "save, or resume from another checkpoint",
                          f->label, file, sh);
        } else if (sh) {
            seen[v] = true;
            int a = 0, b = 0, end = 0;
            if (sscanf(file, "model-%5d-of-%5d.safetensors%n", &a, &b, &end) == 2 && !file[end] &&
                (a != v || b != count))
                st = fg_error(FG_EFORMAT,
                              "%s: %.200s holds shard %s of %s, not the one its name says (a "
                              "file renamed or copied over another?); put back together the "
                              "files of one save, or resume from another checkpoint",
                              f->label, file, sh, ns);
        }
    }
    fg_free(seen);
    return st;
}

static FG_MUST_USE fg_status parse_index(fg_st_file *f, const char *text, size_t len) {
    json_error_t jerr;
    f->root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!f->root) {
        if (json_error_code(&jerr) == json_error_out_of_memory) return FG_ENOMEM;
        char pos[32];
        snprintf(pos, sizeof pos, "%d", jerr.position);
        return bad(f->label, "not valid JSON: %s (at byte %s)", jerr.text, pos);
    }
    json_t *map = json_object_get(f->root, "weight_map"),
           *md = json_object_get(f->root, "metadata");
    if (!json_is_object(f->root) || !json_is_object(map))
        return bad(f->label, "%s%sexpected an object with a \"weight_map\" object", "", "");
    if (md && !json_is_object(md))
        return bad(f->label, "\"metadata\" is not an object%s%s", "", "");
    size_t cnt = json_object_size(map);
    f->e = fg_calloc(cnt ? cnt : 1, sizeof *f->e);
    f->by_name = fg_calloc(cnt ? cnt : 1, sizeof *f->by_name);
    f->parts = fg_calloc(cnt ? cnt : 1, sizeof *f->parts);
    json_t *opened = json_object();
    char *dir = fg__path_dir(f->label);
    fg_status st = (!f->e || !f->by_name || !f->parts || !opened || !dir) ? FG_ENOMEM : FG_OK;
    const char *name;
    json_t *v;
    json_object_foreach(map, name, v) {
        if (st != FG_OK) break;
        if (!json_is_string(v) || !plain_name(json_string_value(v))) {
            st = bad(f->label,
                     "weight_map: tensor \"%.200s\" maps to %s, expected the name of a file in "
                     "the index's folder (no '/', no leading '.')",
                     name, json_is_string(v) ? json_string_value(v) : "something not a string");
            break;
        }
        const char *file = json_string_value(v);
        int64_t k = 0;
        if ((st = part_of(f, dir, file, opened, &k)) != FG_OK) break;
        int64_t j = fg_st_find(f->parts[k], name);
        if (j < 0) {
            st = bad(f->label, "weight_map: tensor \"%.200s\" is not in %.200s, the file it names",
                     name, file);
            break;
        }
        f->e[f->n] = f->parts[k]->e[j];
        f->e[f->n].order = f->n;
        f->n++;
    }
    /* every tensor of a named file is mapped to it */
    int64_t total = 0;
    for (int64_t k = 0; st == FG_OK && k < f->nparts; k++) total += f->parts[k]->n;
    /* each mapped tensor was found in its file, so the counts agree exactly
     * when no file holds a tensor mapped elsewhere or not at all */
    for (int64_t k = 0; st == FG_OK && total != f->n && k < f->nparts; k++)
        for (int64_t j = 0; st == FG_OK && j < f->parts[k]->n; j++) {
            const char *t = f->parts[k]->e[j].name, *file = f->parts[k]->label;
            json_t *to = json_object_get(map, t);
            json_t *at = to ? json_object_get(opened, json_string_value(to)) : NULL;
            if (at && json_integer_value(at) == k) continue;
            const char *slash = strrchr(file, '/');
            st = bad(
                f->label,
                "%.200s holds tensor \"%.200s\", which the weight_map does not map to that file",
                slash ? slash + 1 : file, t);
        }
    if (st == FG_OK) st = check_parts(f, md);
    uint64_t bytes = 0;
    for (int64_t i = 0; st == FG_OK && i < f->n; i++) bytes += f->e[i].nbytes;
    json_t *ts = md ? json_object_get(md, "total_size") : NULL;
    if (st == FG_OK && ts && (!json_is_integer(ts) || (uint64_t)json_integer_value(ts) != bytes)) {
        char want[32];
        snprintf(want, sizeof want, "%llu", (unsigned long long)bytes);
        st = bad(f->label,
                 "metadata total_size is not %s, the bytes of the tensors the weight_map names "
                 "(a file replaced or missing?)%s",
                 want, "");
    }
    if (st == FG_OK && md) {
        size_t m = json_object_size(md);
        f->meta = md;
        f->meta_k = fg_calloc(m ? m : 1, sizeof *f->meta_k);
        f->meta_v = fg_calloc(m ? m : 1, sizeof *f->meta_v);
        if (!f->meta_k || !f->meta_v) st = FG_ENOMEM;
        json_object_foreach(md, name, v) {
            if (st != FG_OK || !json_is_string(v)) continue; /* total_size */
            f->meta_k[f->nmeta] = name;
            f->meta_v[f->nmeta] = json_string_value(v);
            f->nmeta++;
        }
    }
    if (st == FG_OK) fg__st_sort_names(f);
    json_decref(opened);
    fg_free(dir);
    return st;
}

fg_status fg__st_open_index(const char *index, fg_st_file **out) {
    fg__st_json_init();
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    FG_TRY(read_text(index, &text, &len));
    fg_st_file *f = fg_calloc(1, sizeof *f);
    if (!f || !(f->label = fg_strdup(index))) {
        fg_free(f);
        fg_free(text);
        return FG_ENOMEM;
    }
    fg_status st = parse_index(f, text, len);
    fg_free(text);
    if (st != FG_OK) {
        if (st == FG_ENOMEM) fg_error(FG_ENOMEM, "%s: out of memory reading the index", index);
        fg_st_close(f);
        return st;
    }
    *out = f;
    return FG_OK;
}
