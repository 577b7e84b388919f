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

fg_status fg__afile_open(fg__afile *a, const char *path);
fg_status fg__afile_write(fg__afile *a, const void *p, size_t n);
/* Flushes, fsyncs, closes, renames over the target and fsyncs the folder.
 * Frees `a` whatever the outcome; on failure before the rename the
 * temporary file is removed. */
fg_status fg__afile_commit(fg__afile *a);
/* Closes and removes the temporary file and frees `a`. Keeps the caller's
 * error message. Safe on a zeroed or already released fg__afile. */
void fg__afile_abort(fg__afile *a);

/* "<dir>" of a path ("." when it has no slash); owned by the caller. */
char *fg__path_dir(const char *path);
/* A fresh temporary name "<dir>/.<base>.tmp-<pid>-<n>" beside `path`. */
char *fg__path_tmp(const char *path, unsigned attempt);
/* fsyncs a folder; EINVAL/ENOTSUP (file systems that cannot) count as done. */
int fg__fsync_dir(const char *dir);

#endif
