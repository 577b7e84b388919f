/* Sharded checkpoints in the ckpt layer: fg_st_write_index writes Hugging
 * Face's model.safetensors.index.json layout; fg_st_open reads a folder (or
 * its index) as one file, in the weight map's order, with the index's
 * metadata; a hostile or inconsistent index is FG_EFORMAT naming the index,
 * the tensor and the file, and nothing outside the folder is opened; a
 * folder written through fg_st_folder_begin/commit replaces a previous one
 * (or a file) whole; fg_st_remove and fg_st_remove_stale_tmp clear folders;
 * a file of another save (its save_id, step, shard number or count not the
 * index's) is refused naming the file, the field and both values, and a
 * save without ids (as older ones were written) still opens. */
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_impl.h"
#include "fixtures.h"
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
    for (int fail_at = 1; fail_at < 10000; fail_at++) {
        fx_alloc_begin_nth(fail_at);
        fg_clear_error();
        fg_st_file *f = fg_st_open(g_ck);
        fg_status s = f ? FG_OK : fg_last_status();
        int64_t n = f ? fg_st_count(f) : -1;
        fg_st_close(f);
        fx_alloc_end();
        if (f) {
            CHECK(n == 3);
            break;
        }
        CHECK_MSG(s == FG_ENOMEM || s == FG_EFORMAT, "failing allocation %d: %s", fail_at,
                  fg_status_str(s));
        CHECK(fg_last_error()[0]);
        errors++;
    }
    CHECK(errors > 0);
    errors = 0;
    for (int fail_at = 1; fail_at < 10000; fail_at++) {
        fx_alloc_begin_nth(fail_at);
        fg_clear_error();
        fg_status s = fg_st_write_index(index, 3, names, files, 44, NULL, 0);
        fx_alloc_end();
        if (s == FG_OK) break;
        CHECK_MSG(s == FG_ENOMEM, "failing allocation %d: %s", fail_at, fg_status_str(s));
        CHECK(fg_last_error()[0]);
        errors++;
    }
    CHECK(errors > 0);
    fg_st_file *f = fg_st_open(index);
    CHECK_MSG(f && fg_st_count(f) == 3, "%s", fg_last_error());
    fg_st_close(f);
}

/* A fulgur-like sharded save in folder `sub` of g_dir: two files with the
 * metadata a sharded save writes (save_id, step, shard, num_shards) and an
 * index with the save's id and step. NULL id: a save before save ids. */
static void write_save(const char *sub, const char *id, const char *step) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/%s", g_dir, sub);
    mkdir(dir, 0777);
    for (int k = 1; k <= 2; k++) {
        fg_st_writer *w = fg_st_writer_new();
        if (k == 1) CHECK_OK(fg_st_writer_add(w, "w", FG_F32, 2, (int64_t[]){2, 3}, g_w));
        else CHECK_OK(fg_st_writer_add(w, "c", FG_I32, 1, (int64_t[]){2}, g_c));
        CHECK_OK(fg_st_writer_set_meta(w, "format", "fulgur-checkpoint-shard-1"));
        CHECK_OK(fg_st_writer_set_meta(w, "shard", k == 1 ? "1" : "2"));
        CHECK_OK(fg_st_writer_set_meta(w, "num_shards", "2"));
        CHECK_OK(fg_st_writer_set_meta(w, "step", step));
        if (id) CHECK_OK(fg_st_writer_set_meta(w, "save_id", id));
        snprintf(path, sizeof path, "%s/model-0000%d-of-00002.safetensors", dir, k);
        CHECK_OK(fg_st_writer_write(w, path));
        fg_st_writer_free(w);
    }
    const char *names[] = {"w", "c"},
               *files[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    fg_kv meta[] = {{"format", "fulgur-checkpoint-1"}, {"step", step}, {"save_id", id}};
    snprintf(path, sizeof path, "%s/%s", dir, FG_ST_INDEX_NAME);
    CHECK_OK(fg_st_write_index(path, 2, names, files, 24 + 8, meta, id ? 3 : 2));
}

/* copies g_dir/<from>/<file> over g_dir/<to>/<as> */
static void copy_file(const char *from, const char *file, const char *to, const char *as) {
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "cp %s/%s/%s %s/%s/%s", g_dir, from, file, g_dir, to, as);
    CHECK(system(cmd) == 0);
}

static void opens(const char *sub) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", g_dir, sub);
    fg_st_file *f = fg_st_open(dir);
    CHECK_MSG(f && fg_st_count(f) == 2, "%s: %s", sub, fg_last_error());
    fg_st_close(f);
}

/* the folder is refused with FG_EFORMAT and each of the words */
static void refused_save(const char *sub, const char *w1, const char *w2, const char *w3) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", g_dir, sub);
    fg_st_file *f = fg_st_open(dir);
    CHECK_MSG(!f, "%s: opened", sub);
    fg_st_close(f);
    CHECK_MSG(fg_last_status() == FG_EFORMAT, "%s: %s", sub, fg_last_error());
    const char *w[] = {w1, w2, w3, "resume from another checkpoint"};
    for (int i = 0; i < 4; i++)
        CHECK_MSG(!w[i] || strstr(fg_last_error(), w[i]), "%s: \"%s\" lacks \"%s\"", sub,
                  fg_last_error(), w[i]);
}

TEST(a_file_of_another_save_is_refused) {
    const char *a = "0123456789abcdef0123456789abcdef", *b = "fedcba9876543210fedcba9876543210";
    write_save("A", a, "12");
    write_save("B", b, "12"); /* another run at the same step */
    write_save("C", a, "8");  /* an earlier save claiming the same id */
    write_save("old", NULL, "12");
    opens("A");
    opens("old"); /* saves before ids: accepted with the other checks */
    /* B's second file in A: another run at the same step */
    write_save("x1", a, "12");
    copy_file("B", "model-00002-of-00002.safetensors", "x1", "model-00002-of-00002.safetensors");
    refused_save("x1", "model-00002-of-00002.safetensors", "save_id is \"fedcba98",
                 "the index's \"01234567");
    /* an earlier save's file: another step */
    write_save("x2", a, "12");
    copy_file("C", "model-00001-of-00002.safetensors", "x2", "model-00001-of-00002.safetensors");
    refused_save("x2", "model-00001-of-00002.safetensors", "its step is \"8\"", "index's \"12\"");
    /* an old save's file in a save with an id, and the other way */
    write_save("x3", a, "12");
    copy_file("old", "model-00002-of-00002.safetensors", "x3", "model-00002-of-00002.safetensors");
    refused_save("x3", "save_id is missing", "index's \"01234567", NULL);
    write_save("x4", NULL, "12");
    copy_file("A", "model-00001-of-00002.safetensors", "x4", "model-00001-of-00002.safetensors");
    refused_save("x4", "save_id is \"01234567", "index's missing", NULL);
    /* the first file copied over the second (same id, same step) */
    write_save("x5", a, "12");
    copy_file("x5", "model-00001-of-00002.safetensors", "x5", "model-00002-of-00002.safetensors");
    char idx[600];
    snprintf(idx, sizeof idx, "%s/x5/%s", g_dir, FG_ST_INDEX_NAME);
    FILE *fp = fopen(idx, "w"); /* mapped as the files now are, so only the numbers can tell */
    fprintf(fp,
            "{\"metadata\": {\"step\": \"12\", \"save_id\": \"%s\"}, \"weight_map\": {\"w\": "
            "\"model-00002-of-00002.safetensors\"}}",
            a);
    fclose(fp);
    refused_save("x5", "num_shards = 2 files, but the index names 1", NULL, NULL);
    fp = fopen(idx, "w");
    fprintf(fp,
            "{\"metadata\": {\"step\": \"12\", \"save_id\": \"%s\"}, \"weight_map\": {\"w\": "
            "\"model-00002-of-00002.safetensors\", \"c\": \"model-00003-of-00002.safetensors\"}}",
            a);
    fclose(fp);
    copy_file("A", "model-00002-of-00002.safetensors", "x5", "model-00003-of-00002.safetensors");
    refused_save("x5", "model-00002-of-00002.safetensors holds shard 1 of 2, not the one its name",
                 NULL, NULL);
    /* an index step that is no number beside files that say 12 */
    write_save("x7", a, "12");
    snprintf(idx, sizeof idx, "%s/x7/%s", g_dir, FG_ST_INDEX_NAME);
    fp = fopen(idx, "w");
    fprintf(fp,
            "{\"metadata\": {\"step\": \"-3\", \"save_id\": \"%s\"}, \"weight_map\": {\"w\": "
            "\"model-00001-of-00002.safetensors\", \"c\": \"model-00002-of-00002.safetensors\"}}",
            a);
    fclose(fp);
    refused_save("x7", "model.safetensors.index.json: metadata step \"-3\" is not a step", NULL,
                 NULL);
    /* a step that is no number, in the files and the index alike */
    write_save("x6", a, "-3");
    refused_save("x6", "metadata step \"-3\" is not a step", NULL, NULL);
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
