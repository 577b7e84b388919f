/* libFuzzer target for the sharded checkpoint reader: the input is written
 * as an index (model.safetensors.index.json) into a folder that holds
 * small valid safetensors files: a and b, shards 1 and 2 of one save (the
 * metadata a sharded save writes: save_id, step, shard, num_shards), and c,
 * a shard of another save; then the folder is opened. Any bytes either
 * open (every entry then readable, found by its name, and every file of
 * the save the index's save_id names) or fail with a message; never a
 * crash, an overread, a leak, or a file opened outside the folder.
 *
 * Build and run it with tests/fuzz/run.sh SECONDS st_index. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fulgur/ckpt.h"

static char g_dir[64];

#define SAVE_ID "00112233445566778899aabbccddeeff"

static void shard_meta(fg_st_writer *wr, const char *shard, const char *id) {
    fg_st_writer_set_meta(wr, "format", "fulgur-checkpoint-shard-1");
    fg_st_writer_set_meta(wr, "shard", shard);
    fg_st_writer_set_meta(wr, "num_shards", "2");
    fg_st_writer_set_meta(wr, "step", "12");
    fg_st_writer_set_meta(wr, "save_id", id);
}

static void setup(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/fuzz-st-index-%d", (int)getpid());
    char cmd[128], path[128];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", g_dir);
    if (system(cmd) != 0) abort();
    float w[6] = {1, 2, 3, 4, 5, 6}, b[3] = {7, 8, 9};
    int32_t c[2] = {-1, 42};
    fg_st_writer *wr = fg_st_writer_new();
    fg_st_writer_add(wr, "w", FG_F32, 2, (int64_t[]){2, 3}, w);
    fg_st_writer_add(wr, "b", FG_F32, 1, (int64_t[]){3}, b);
    shard_meta(wr, "1", SAVE_ID);
    snprintf(path, sizeof path, "%s/a.safetensors", g_dir);
    if (fg_st_writer_write(wr, path) != FG_OK) abort();
    fg_st_writer_free(wr);
    wr = fg_st_writer_new();
    fg_st_writer_add(wr, "c", FG_I32, 1, (int64_t[]){2}, c);
    shard_meta(wr, "2", SAVE_ID);
    snprintf(path, sizeof path, "%s/b.safetensors", g_dir);
    if (fg_st_writer_write(wr, path) != FG_OK) abort();
    fg_st_writer_free(wr);
    wr = fg_st_writer_new(); /* b of another save at the same step */
    fg_st_writer_add(wr, "c", FG_I32, 1, (int64_t[]){2}, c);
    shard_meta(wr, "2", "ffeeddccbbaa99887766554433221100");
    snprintf(path, sizeof path, "%s/c.safetensors", g_dir);
    if (fg_st_writer_write(wr, path) != FG_OK) abort();
    fg_st_writer_free(wr);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_dir[0]) setup();
    char index[128];
    snprintf(index, sizeof index, "%s/%s", g_dir, FG_ST_INDEX_NAME);
    FILE *fp = fopen(index, "wb");
    if (!fp) abort();
    fwrite(data, 1, size, fp);
    fclose(fp);
    fg_st_file *f = fg_st_open(g_dir);
    if (!f) {
        if (!fg_last_error()[0] || fg_last_status() == FG_OK) abort(); /* a failure must say why */
        return 0;
    }
    for (int64_t i = 0; i < fg_st_count(f); i++) {
        fg_st_info info;
        if (fg_st_info_at(f, i, &info) != FG_OK) abort();
        if (fg_st_find(f, info.name) != i) abort();
        double tmp[8];
        if (info.numel > 8 || fg_st_read(f, i, tmp, FG_F64, info.numel) != FG_OK) abort();
    }
    for (int64_t i = 0; i < fg_st_meta_count(f); i++) {
        const char *k, *v;
        if (fg_st_meta_at(f, i, &k, &v) != FG_OK || fg_st_meta_get(f, k) != v) abort();
    }
    /* every part is a shard of the save the index names: only a and b,
     * which only an index with their save_id and step may open */
    const char *id = fg_st_meta_get(f, "save_id"), *step = fg_st_meta_get(f, "step");
    if (fg_st_count(f) > 0 && (!id || strcmp(id, SAVE_ID) || !step || strcmp(step, "12"))) abort();
    fg_st_close(f);
    return 0;
}
