/* A test helper: a safetensors file copied with one metadata value changed,
 * to hand-edit a checkpoint the way a hostile or damaged file would be.
 * Header-only. */
#ifndef FULGUR_TESTS_ST_REWRITE_H
#define FULGUR_TESTS_ST_REWRITE_H

#include <string.h>

#include "fulgur/ckpt.h"
#include "harness.h"

/* path's tensors and metadata again at out, with key set to value */
static void rewrite_with(const char *path, const char *out, const char *key, const char *value) {
    fg_st_file *in = fg_st_open(path);
    fg_st_writer *w = fg_st_writer_new();
    CHECK_MSG(in && w, "%s", fg_last_error());
    if (!in || !w) {
        fg_st_writer_free(w);
        fg_st_close(in);
        return;
    }
    for (int64_t i = 0; i < fg_st_count(in); i++) {
        fg_st_info info;
        CHECK_OK(fg_st_info_at(in, i, &info));
        CHECK_OK(
            fg_st_writer_add(w, info.name, info.dtype, info.ndim, info.shape, fg_st_data(in, i)));
    }
    for (int64_t i = 0; i < fg_st_meta_count(in); i++) {
        const char *k, *v;
        CHECK_OK(fg_st_meta_at(in, i, &k, &v));
        CHECK_OK(fg_st_writer_set_meta(w, k, strcmp(k, key) ? v : value));
    }
    CHECK_OK(fg_st_writer_write(w, out));
    fg_st_writer_free(w);
    fg_st_close(in);
}

#endif
