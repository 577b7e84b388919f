/* libFuzzer target for the safetensors reader: any bytes either open (and
 * then every entry, its data and the metadata must be readable within the
 * buffer) or fail with a message; never a crash, an overread or a leak.
 *
 * Build and run it with tests/fuzz/run.sh [SECONDS] (clang's libFuzzer). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fulgur/ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fg_st_file *f = fg_st_open_memory(data, size, "fuzz");
    if (!f) {
        if (!fg_last_error()[0] || fg_last_status() == FG_OK) abort(); /* a failure must say why */
        return 0;
    }
    volatile uint64_t sink = 0;
    for (int64_t i = 0; i < fg_st_count(f); i++) {
        fg_st_info info;
        if (fg_st_info_at(f, i, &info) != FG_OK) abort();
        if (fg_st_find(f, info.name) != i) abort();
        const uint8_t *p = fg_st_data(f, i);
        size_t bytes = (size_t)info.numel * info.elem_size;
        for (size_t k = 0; k < bytes; k += 61) sink += p[k]; /* inside the buffer, or ASan says */
        if (info.has_dtype && info.numel <= 4096) {
            double tmp[4096];
            if (fg_st_read(f, i, tmp, FG_F64, info.numel) != FG_OK) abort();
        }
    }
    for (int64_t i = 0; i < fg_st_meta_count(f); i++) {
        const char *k, *v;
        if (fg_st_meta_at(f, i, &k, &v) == FG_OK) sink += strlen(k) + strlen(v);
    }
    fg_st_close(f);
    return 0;
}
