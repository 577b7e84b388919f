/* Private helpers of the ckpt layer: the safetensors dtype table, jansson
 * set-up, UTF-8 checks and the atomic file writer. */
#ifndef FULGUR_CKPT_IMPL_H
#define FULGUR_CKPT_IMPL_H

#include "core/core_impl.h"
#include "fulgur/ckpt.h"

/* A dtype of the safetensors format, known to fulgur or not. */
typedef struct fg__st_dtype {
    const char *name; /* "F32" */
    size_t size;      /* bytes per element */
    fg_dtype fg;      /* FG_DTYPE_DEFAULT if fulgur lacks it */
} fg__st_dtype;

/* The entry for a safetensors dtype name (exact, case-sensitive, as the
 * format is), or NULL for a name the format does not define. */
const fg__st_dtype *fg__st_dtype_lookup(const char *name);

/* Routes jansson's allocations through fg_alloc/fg_free (once per process). */
void fg__st_json_init(void);

/* True if s[0..n) is well-formed UTF-8 (no overlongs, surrogates or code
 * points past U+10FFFF). */
bool fg__utf8_valid(const char *s, size_t n);

/* The system's message for errno value e, thread-safe. */
const char *fg__errstr(int e, char *buf, size_t cap);

/* A file written under a temporary name in the target's folder and renamed
 * over the target by fg__afile_commit. Errors name the target path. */
typedef struct fg__afile {
    int fd;
    char *path; /* target */
    char *tmp;  /* temporary path, NULL once renamed or removed */
    char *dir;  /* folder of the target, for its fsync */
    unsigned char *buf;
    size_t used, cap;
} fg__afile;

FG_MUST_USE fg_status fg__afile_open(fg__afile *a, const char *path);
FG_MUST_USE fg_status fg__afile_write(fg__afile *a, const void *p, size_t n);
/* Flushes, fsyncs, closes, renames over the target and fsyncs the folder.
 * Frees `a` whatever the outcome; on failure before the rename the
 * temporary file is removed. */
FG_MUST_USE fg_status fg__afile_commit(fg__afile *a);
/* Closes and removes the temporary file and frees `a`. Keeps the caller's
 * error message. Safe on a zeroed or already released fg__afile. */
void fg__afile_abort(fg__afile *a);

/* "<dir>" of a path ("." when it has no slash); owned by the caller. */
char *fg__path_dir(const char *path);
/* A fresh temporary name "<dir>/.<base>.tmp-<pid>-<n>" beside `path`. */
char *fg__path_tmp(const char *path, unsigned attempt);
/* fsyncs a folder; EINVAL/ENOTSUP (file systems that cannot) count as done. */
int fg__fsync_dir(const char *dir);

/* ---------------------------------------------------------- open files */

#include <jansson.h>

typedef struct st_entry {
    const char *name;
    const fg__st_dtype *dt;
    int ndim;
    const int64_t *shape;
    json_t *shape_json; /* during parsing only */
    int64_t numel;
    size_t nbytes;
    uint64_t begin, end;
    int64_t order;            /* position in the JSON object, to break ties of empty entries */
    const unsigned char *src; /* the bytes: data + begin of the file holding them */
} st_entry;

struct fg_st_file {
    char *label; /* path or caller's label, for messages */
    const unsigned char *base;
    size_t len;
    void *map; /* mmap'ed region (== base), NULL for memory buffers */
    const unsigned char *data;
    size_t data_len;
    json_t *root;
    st_entry *e;
    int64_t n;
    int64_t *by_name; /* indices into e, sorted by name */
    int64_t *shapes;
    json_t *meta; /* the "__metadata__" object, borrowed from root; NULL if none */
    const char **meta_k, **meta_v;
    int64_t nmeta;
    /* a sharded checkpoint (st_index.c): the files it reads, each entry's
     * src pointing into one of them; NULL for one file */
    fg_st_file **parts;
    int64_t nparts;
};

/* st_reader.c: opens one safetensors file (not an index) at path. */
FG_MUST_USE fg_status fg__st_open_file(const char *path, fg_st_file **out);
/* st_reader.c: sorts f->by_name (indices 0..n) by entry name. */
void fg__st_sort_names(fg_st_file *f);
/* st_index.c: opens the sharded checkpoint whose index is at `index`
 * (a model.safetensors.index.json); `label` names it in messages. */
FG_MUST_USE fg_status fg__st_open_index(const char *index, fg_st_file **out);

#endif
