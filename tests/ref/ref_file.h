/* Reader of the reference files written by tests/ref/reffile.py: a text
 * header ("fulgur-ref 1", one "<name> <f32|f64|i32> <ndim> <dims...>" line
 * per array, "end"), then the arrays' little-endian bytes in header order.
 * For tests only: the whole file is read into memory (each array copied to
 * its own aligned block); a malformed file makes
 * ref_open return NULL with a message on stderr. */
#ifndef FULGUR_TEST_REF_FILE_H
#define FULGUR_TEST_REF_FILE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fulgur/core.h"

#define REF_MAX 2048

typedef struct ref_array {
    char name[128];
    fg_dtype dtype;
    int ndim;
    int64_t shape[8];
    int64_t numel;
    const void *data;
} ref_array;

typedef struct ref_file {
    char *buf;
    int n;
    ref_array a[REF_MAX];
} ref_file;

static inline void ref_close(ref_file *r) {
    if (!r) return;
    for (int i = 0; i < r->n; i++) free((void *)r->a[i].data);
    free(r->buf);
    free(r);
}

static inline ref_file *ref_open(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "  ref_open: cannot open %s\n", path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    ref_file *r = calloc(1, sizeof *r);
    r->buf = malloc((size_t)size + 1);
    if (fread(r->buf, 1, (size_t)size, f) != (size_t)size) size = -1;
    fclose(f);
    if (size < 0) goto bad;
    r->buf[size] = 0;
    char *p = r->buf, *end = r->buf + size;
    char *nl = memchr(p, '\n', (size_t)(end - p));
    if (!nl || strncmp(p, "fulgur-ref 1\n", 13)) goto bad;
    p = nl + 1;
    for (;;) {
        nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl) goto bad;
        *nl = 0;
        if (!strcmp(p, "end")) {
            p = nl + 1;
            break;
        }
        if (r->n == REF_MAX) goto bad;
        ref_array *a = &r->a[r->n++];
        char dt[8];
        int used = 0;
        if (sscanf(p, "%127s %7s %d%n", a->name, dt, &a->ndim, &used) != 3 || a->ndim < 0 ||
            a->ndim > 8)
            goto bad;
        a->dtype = !strcmp(dt, "f32") ? FG_F32 : !strcmp(dt, "f64") ? FG_F64 : FG_I32;
        a->numel = 1;
        char *q = p + used;
        for (int d = 0; d < a->ndim; d++) {
            long long v;
            int k;
            if (sscanf(q, "%lld%n", &v, &k) != 1 || v < 0) goto bad;
            a->shape[d] = v;
            a->numel *= v;
            q += k;
        }
        p = nl + 1;
    }
    for (int i = 0; i < r->n; i++) {
        size_t bytes = (size_t)r->a[i].numel * fg_dtype_size(r->a[i].dtype);
        if ((size_t)(end - p) < bytes) goto bad;
        void *copy = malloc(bytes ? bytes : 1); /* aligned for its dtype */
        memcpy(copy, p, bytes);
        r->a[i].data = copy;
        p += bytes;
    }
    if (p != end) goto bad;
    return r;
bad:
    fprintf(stderr, "  ref_open: %s is malformed\n", path);
    ref_close(r);
    return NULL;
}

/* The array `name`, or NULL (with a message on stderr). */
static inline const ref_array *ref_get(const ref_file *r, const char *name) {
    for (int i = 0; r && i < r->n; i++)
        if (!strcmp(r->a[i].name, name)) return &r->a[i];
    fprintf(stderr, "  ref_get: no array \"%s\"\n", name);
    return NULL;
}

/* Element i of an array as double. */
static inline double ref_at(const ref_array *a, int64_t i) {
    switch (a->dtype) {
    case FG_F32: return ((const float *)a->data)[i];
    case FG_F64: return ((const double *)a->data)[i];
    default: return ((const int32_t *)a->data)[i];
    }
}

#endif
