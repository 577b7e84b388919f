/* Sharded checkpoints in the ckpt layer: fg_st_write_index writes Hugging
 * Face's model.safetensors.index.json layout; fg_st_open reads a folder (or
 * its index) as one file, in the weight map's order, with the index's
 * metadata; a hostile or inconsistent index is FG_EFORMAT naming the index,
 * the tensor and the file, and nothing outside the folder is opened; a
 * folder written through fg_st_folder_begin/commit replaces a previous one
 * (or a file) whole; fg_st_remove and fg_st_remove_stale_tmp clear folders. */
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_impl.h"
#include "harness.h"

static char g_dir[] = "/tmp/fg-stindex-XXXXXX";
static char g_ck[300];

static void write_text(const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_ck, name);
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

/* a.safetensors: w (2x3 f32), b (3 f32); b.safetensors: c (2 i32) */
static float g_w[6] = {1, 2, 3, 4, 5, 6}, g_b[3] = {7, 8, 9};
static int32_t g_c[2] = {-1, 42};

static void write_parts(void) {
    char path[512];
    fg_st_writer *w = fg_st_writer_new();
    CHECK_OK(fg_st_writer_add(w, "w", FG_F32, 2, (int64_t[]){2, 3}, g_w));
    CHECK_OK(fg_st_writer_add(w, "b", FG_F32, 1, (int64_t[]){3}, g_b));
    snprintf(path, sizeof path, "%s/a.safetensors", g_ck);
    CHECK_OK(fg_st_writer_write(w, path));
    fg_st_writer_free(w);
    w = fg_st_writer_new();
    CHECK_OK(fg_st_writer_add(w, "c", FG_I32, 1, (int64_t[]){2}, g_c));
    snprintf(path, sizeof path, "%s/b.safetensors", g_ck);
    CHECK_OK(fg_st_writer_write(w, path));
    fg_st_writer_free(w);
}

TEST(write_and_read_an_index) {
    CHECK(mkdtemp(g_dir) != NULL);
    snprintf(g_ck, sizeof g_ck, "%s/ck", g_dir);
    CHECK(mkdir(g_ck, 0777) == 0);
    write_parts();
    const char *names[] = {"c", "w", "b"},
               *files[] = {"b.safetensors", "a.safetensors", "a.safetensors"};
    fg_kv meta[] = {{"format", "fulgur-checkpoint-1"}, {"step", "7"}};
    char index[512];
    snprintf(index, sizeof index, "%s/%s", g_ck, FG_ST_INDEX_NAME);
    CHECK_OK(fg_st_write_index(index, 3, names, files, 24 + 12 + 8, meta, 2));
    for (int how = 0; how < 2; how++) { /* the folder, and the index itself */
        fg_st_file *f = fg_st_open(how ? index : g_ck);
        CHECK_MSG(f, "%s", fg_last_error());
        if (!f) continue;
        CHECK(fg_st_count(f) == 3);
        fg_st_info in;
        CHECK_OK(fg_st_info_at(f, 0, &in)); /* the map's order */
        CHECK(!strcmp(in.name, "c") && in.dtype == FG_I32 && in.numel == 2);
        CHECK(!memcmp(fg_st_data(f, 0), g_c, sizeof g_c));
        int64_t k = fg_st_find(f, "w");
        CHECK(k == 1);
        float w[6];
        CHECK_OK(fg_st_read(f, k, w, FG_F32, 6));
        CHECK(!memcmp(w, g_w, sizeof w));
        double b[3];
        CHECK_OK(fg_st_read(f, fg_st_find(f, "b"), b, FG_F64, 3));
        CHECK(b[0] == 7 && b[2] == 9);
        CHECK(fg_st_find(f, "nope") == -1);
        CHECK(fg_st_meta_count(f) == 2); /* total_size is not a string: not metadata */
        CHECK(!strcmp(fg_st_meta_get(f, "step"), "7"));
        CHECK(fg_st_meta_get(f, "total_size") == NULL);
        fg_st_close(f);
    }
    /* bad arguments to the writer */
    CHECK_STATUS(
        fg_st_write_index(index, 1, (const char *[]){"x"}, (const char *[]){"../x"}, 0, NULL, 0),
        FG_EINVAL);
    CHECK_STATUS(fg_st_write_index(index, 2, (const char *[]){"x", "x"}, (const char *[]){"a", "a"},
                                   0, NULL, 0),
                 FG_EINVAL);
    CHECK_STATUS(fg_st_write_index(index, 0, NULL, NULL, 0, (fg_kv[]){{"total_size", "1"}}, 1),
                 FG_EINVAL);
}

/* index text -> FG_EFORMAT (or FG_EIO) with words */
static void refused(const char *text, fg_status want, const char *words) {
    write_text("bad.index.json", text);
    char path[512];
    snprintf(path, sizeof path, "%s/bad.index.json", g_ck);
    fg_st_file *f = fg_st_open(path);
    CHECK_MSG(!f, "%s: opened", text);
    fg_st_close(f);
    CHECK_MSG(fg_last_status() == want, "%s: status %d (%s)", text, (int)fg_last_status(),
              fg_last_error());
    CHECK_MSG(strstr(fg_last_error(), words), "%s: \"%s\" lacks \"%s\"", text, fg_last_error(),
              words);
}

TEST(a_hostile_index_is_refused) {
    refused("{\"weight_map\": {\"w\": \"a.safetensors\", \"b\": \"a.safetensors\", \"c\": "
            "\"../ck/b.safetensors\"}}",
            FG_EFORMAT, "tensor \"c\" maps to ../ck/b.safetensors, expected the name of a file");
    refused("{\"weight_map\": {\"w\": \".a.safetensors\"}}", FG_EFORMAT, "no leading '.'");
    refused("{\"weight_map\": {\"w\": \"/etc/passwd\"}}", FG_EFORMAT, "no '/'");
    refused("{\"weight_map\": {\"w\": 5}}", FG_EFORMAT, "not a string");
    refused("{\"weight_map\": {\"w\": \"a.safetensors\", \"b\": \"a.safetensors\", \"x\": "
            "\"a.safetensors\"}}",
            FG_EFORMAT, "tensor \"x\" is not in a.safetensors, the file it names");
    refused("{\"weight_map\": {\"w\": \"a.safetensors\"}}", FG_EFORMAT,
            "a.safetensors holds tensor \"b\", which the weight_map does not map to that file");
    refused("{\"weight_map\": {\"w\": \"a.safetensors\", \"b\": \"b.safetensors\", \"c\": "
            "\"b.safetensors\"}}",
            FG_EFORMAT, "tensor \"b\" is not in b.safetensors");
    refused("{\"weight_map\": {\"w\": \"missing.safetensors\"}}", FG_EIO, "missing.safetensors");
    refused("{\"weight_map\": {\"w\": \"bad.index.json\"}}", FG_EFORMAT, "bad.index.json");
    refused("{\"weight_map\": {\"w\": \"a.safetensors\", \"w\": \"a.safetensors\"}}", FG_EFORMAT,
            "not valid JSON");
    refused("{\"weight_map\": [1]}", FG_EFORMAT, "a \"weight_map\" object");
    refused("[]", FG_EFORMAT, "a \"weight_map\" object");
    refused("{\"metadata\": 3, \"weight_map\": {}}", FG_EFORMAT, "\"metadata\" is not an object");
    refused("{\"metadata\": {\"total_size\": 99}, \"weight_map\": {\"w\": \"a.safetensors\", "
            "\"b\": \"a.safetensors\"}}",
            FG_EFORMAT, "total_size is not 36");
    refused("", FG_EFORMAT, "not valid JSON");
    /* a folder without an index */
    char path[512];
    snprintf(path, sizeof path, "%s", g_dir);
    CHECK(!fg_st_open(path));
    CHECK(fg_last_status() == FG_EIO);
    CHECK_CONTAINS(fg_last_error(), "not a sharded checkpoint");
    /* the map may name a subset of the files in the folder, and metadata
     * of other kinds than strings are skipped */
    write_text("sub.index.json", "{\"metadata\": {\"total_size\": 8, \"n\": 1, \"k\": \"v\"}, "
                                 "\"weight_map\": {\"c\": \"b.safetensors\"}}");
    snprintf(path, sizeof path, "%s/sub.index.json", g_ck);
    fg_st_file *f = fg_st_open(path);
    CHECK_MSG(f && fg_st_count(f) == 1 && fg_st_meta_count(f) == 1, "%s", fg_last_error());
    fg_st_close(f);
}

static int g_fail_at, g_count;
static void *failing_alloc(void *ud, void *ptr, size_t size, size_t align) {
    (void)ud;
    if (size == 0) {
        free(ptr);
        return NULL;
    }
    if (++g_count == g_fail_at) return NULL;
    if (ptr) return realloc(ptr, size);
    void *p = NULL;
    return posix_memalign(&p, align < 16 ? 16 : align, size) ? NULL : p;
}

/* Reading the folder and writing an index with the N-th allocation
 * failing, for every N: an error with a message, never FG_OK with a
 * half-read checkpoint, never a crash (the sanitizer run checks for
 * leaks). */
TEST(every_failed_allocation_is_an_error) {
    char index[512];
    snprintf(index, sizeof index, "%s/again.index.json", g_ck);
    const char *names[] = {"c", "w", "b"},
               *files[] = {"b.safetensors", "a.safetensors", "a.safetensors"};
    int errors = 0;
    for (g_fail_at = 1; g_fail_at < 10000; g_fail_at++) {
        g_count = 0;
        fg_set_allocator(failing_alloc, NULL);
        fg_clear_error();
        fg_st_file *f = fg_st_open(g_ck);
        fg_status s = f ? FG_OK : fg_last_status();
        int64_t n = f ? fg_st_count(f) : -1;
        fg_st_close(f);
        fg_set_allocator(NULL, NULL);
        if (f) {
            CHECK(n == 3);
            break;
        }
        CHECK_MSG(s == FG_ENOMEM || s == FG_EFORMAT, "failing allocation %d: %s", g_fail_at,
                  fg_status_str(s));
        CHECK(fg_last_error()[0]);
        errors++;
    }
    CHECK(errors > 0);
    errors = 0;
    for (g_fail_at = 1; g_fail_at < 10000; g_fail_at++) {
        g_count = 0;
        fg_set_allocator(failing_alloc, NULL);
        fg_clear_error();
        fg_status s = fg_st_write_index(index, 3, names, files, 44, NULL, 0);
        fg_set_allocator(NULL, NULL);
        if (s == FG_OK) break;
        CHECK_MSG(s == FG_ENOMEM, "failing allocation %d: %s", g_fail_at, fg_status_str(s));
        CHECK(fg_last_error()[0]);
        errors++;
    }
    CHECK(errors > 0);
    fg_st_file *f = fg_st_open(index);
    CHECK_MSG(f && fg_st_count(f) == 3, "%s", fg_last_error());
    fg_st_close(f);
}

TEST(folders_replace_whole_and_are_removed) {
    char target[512], tmp[512], file[600];
    snprintf(target, sizeof target, "%s/step-1", g_dir);
    /* first: nothing there */
    CHECK_OK(fg_st_folder_begin(target, tmp, sizeof tmp));
    CHECK(strstr(tmp, "/.step-1.tmp-") != NULL);
    snprintf(file, sizeof file, "%s/x.safetensors", tmp);
    fg_st_writer *w = fg_st_writer_new();
    CHECK_OK(fg_st_writer_add(w, "c", FG_I32, 1, (int64_t[]){2}, g_c));
    CHECK_OK(fg_st_writer_write(w, file));
    CHECK_OK(fg_st_folder_commit(tmp, target));
    struct stat sb;
    CHECK(stat(tmp, &sb) != 0);
    snprintf(file, sizeof file, "%s/x.safetensors", target);
    CHECK(stat(file, &sb) == 0);
    /* again over it: the old folder goes, the new one is whole */
    CHECK_OK(fg_st_folder_begin(target, tmp, sizeof tmp));
    snprintf(file, sizeof file, "%s/y.safetensors", tmp);
    CHECK_OK(fg_st_writer_write(w, file));
    CHECK_OK(fg_st_folder_commit(tmp, target));
    CHECK(stat(tmp, &sb) != 0);
    snprintf(file, sizeof file, "%s/x.safetensors", target);
    CHECK(stat(file, &sb) != 0);
    snprintf(file, sizeof file, "%s/y.safetensors", target);
    CHECK(stat(file, &sb) == 0);
    /* over a file of that name */
    char ftarget[512];
    snprintf(ftarget, sizeof ftarget, "%s/single", g_dir);
    CHECK_OK(fg_st_writer_write(w, ftarget));
    CHECK_OK(fg_st_folder_begin(ftarget, tmp, sizeof tmp));
    CHECK_OK(fg_st_folder_commit(tmp, ftarget));
    CHECK(stat(ftarget, &sb) == 0 && S_ISDIR(sb.st_mode));
    /* the last link may name a folder */
    char link[512], got[512];
    snprintf(link, sizeof link, "%s/last.safetensors", g_dir);
    CHECK_OK(fg_st_set_last(link, "step-1"));
    CHECK_OK(fg_st_get_last(link, got, sizeof got));
    CHECK(!strcmp(got, target));
    /* remove: a folder of files, a file, nothing */
    CHECK_OK(fg_st_remove(target));
    CHECK(stat(target, &sb) != 0);
    CHECK_OK(fg_st_remove(target));
    CHECK_OK(fg_st_remove(ftarget));
    /* a stale temporary folder (a pid that runs no more) is removed */
    char stale[512];
    snprintf(stale, sizeof stale, "%s/.step-9.tmp-999999999-0", g_dir);
    CHECK(mkdir(stale, 0777) == 0);
    snprintf(file, sizeof file, "%s/.model.safetensors.tmp-999999999-1", stale);
    FILE *junk = fopen(file, "w");
    if (junk) fclose(junk);
    int removed = -1;
    CHECK_OK(fg_st_remove_stale_tmp(g_dir, &removed));
    CHECK(removed == 1);
    CHECK(stat(stale, &sb) != 0);
    fg_st_writer_free(w);
    CHECK_STATUS(fg_st_folder_begin("", tmp, sizeof tmp), FG_EINVAL);
    CHECK_STATUS(fg_st_folder_begin("x/", tmp, sizeof tmp), FG_EINVAL);
    CHECK_STATUS(fg_st_folder_begin(target, tmp, 4), FG_EINVAL);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
}
