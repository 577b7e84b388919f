/* The safetensors writer streaming (fg_st_writer_declare, _begin, _put,
 * _finish): the file is byte for byte fg_st_writer_write's of the same
 * entries, whatever pieces the bytes come in and with entries added with
 * data between declared ones; a wrong put, an early finish or a writer
 * freed in the middle leaves the target as it was and no temporary file;
 * the header cannot change once written. */
#include <stdio.h>
#include <sys/stat.h>

#include "fulgur/ckpt.h"
#include "harness.h"

static char g_dir[] = "/tmp/fg-ststream-XXXXXX";

static void path(const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", g_dir, name);
}

static unsigned char *slurp(const char *p, long *len) {
    FILE *fp = fopen(p, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    *len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)*len + 1);
    if (b && fread(b, 1, (size_t)*len, fp) != (size_t)*len) {
        free(b);
        b = NULL;
    }
    fclose(fp);
    return b;
}

static bool same_file(const char *a, const char *b) {
    long la = -1, lb = -2;
    unsigned char *x = slurp(a, &la), *y = slurp(b, &lb);
    bool same = x && y && la == lb && !memcmp(x, y, (size_t)la);
    free(x);
    free(y);
    return same;
}

static int entries(void) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ls -A %s | wc -l", g_dir);
    FILE *p = popen(cmd, "r");
    int n = -1;
    if (p && fscanf(p, "%d", &n) != 1) n = -1;
    if (p) pclose(p);
    return n;
}

static float g_a[300], g_c[7];
static int32_t g_b[12];
static const int64_t k_sa[2] = {20, 15}, k_sb[1] = {12}, k_sc[1] = {7};

static void fill(void) {
    for (int i = 0; i < 300; i++) g_a[i] = (float)i * 0.25f - 3;
    for (int i = 0; i < 12; i++) g_b[i] = i * 7 - 40;
    for (int i = 0; i < 7; i++) g_c[i] = (float)i / 3;
}

/* a (declared or with data), b with data, c declared; metadata */
static fg_st_writer *make(bool a_declared) {
    fg_st_writer *w = fg_st_writer_new();
    CHECK(w != NULL);
    if (a_declared) CHECK(fg_st_writer_declare(w, "a", FG_F32, 2, k_sa) == FG_OK);
    else CHECK(fg_st_writer_add(w, "a", FG_F32, 2, k_sa, g_a) == FG_OK);
    CHECK(fg_st_writer_add(w, "b", FG_I32, 1, k_sb, g_b) == FG_OK);
    if (a_declared) CHECK(fg_st_writer_declare(w, "c", FG_F32, 1, k_sc) == FG_OK);
    else CHECK(fg_st_writer_add(w, "c", FG_F32, 1, k_sc, g_c) == FG_OK);
    CHECK(fg_st_writer_declare(w, "empty", FG_F32, 1, (int64_t[]){0}) == FG_OK);
    CHECK(fg_st_writer_set_meta(w, "format", "test") == FG_OK);
    CHECK(fg_st_writer_set_meta(w, "step", "3") == FG_OK);
    return w;
}

TEST(stream_equals_write_in_any_pieces) {
    fill();
    char ref[256], got[256];
    path("ref.safetensors", ref, sizeof ref);
    path("got.safetensors", got, sizeof got);
    fg_st_writer *w = make(false);
    CHECK(fg_st_writer_write(w, ref) == FG_OK);
    fg_st_writer_free(w);
    /* a whole, then c in pieces of 1, 2 and 4 floats; b and the empty
     * entry written by the writer itself */
    static const size_t pieces[][4] = {{300, 0}, {100, 150, 50, 0}, {1, 299, 0}};
    for (size_t k = 0; k < sizeof pieces / sizeof pieces[0]; k++) {
        w = make(true);
        CHECK(fg_st_writer_begin(w, got) == FG_OK);
        size_t at = 0;
        for (int i = 0; pieces[k][i]; at += pieces[k][i], i++)
            CHECK(fg_st_writer_put(w, g_a + at, pieces[k][i] * 4, NULL) == FG_OK);
        CHECK(fg_st_writer_put(w, g_c, 4, NULL) == FG_OK);
        CHECK(fg_st_writer_put(w, g_c + 1, 8, NULL) == FG_OK);
        CHECK(fg_st_writer_put(w, g_c + 3, 16, NULL) == FG_OK);
        CHECK(fg_st_writer_finish(w) == FG_OK);
        CHECK_MSG(same_file(ref, got), "pieces %zu: the streamed file differs", k);
        /* the writer begins again: the same file once more */
        CHECK(fg_st_writer_begin(w, got) == FG_OK);
        CHECK(fg_st_writer_put(w, g_a, sizeof g_a, NULL) == FG_OK);
        CHECK(fg_st_writer_put(w, g_c, sizeof g_c, NULL) == FG_OK);
        CHECK(fg_st_writer_finish(w) == FG_OK);
        CHECK(same_file(ref, got));
        fg_st_writer_free(w);
    }
    fg_st_file *f = fg_st_open(got);
    CHECK_MSG(f && fg_st_count(f) == 4, "%s", fg_last_error());
    fg_st_close(f);
    CHECK(entries() == 2);
}

TEST(a_wrong_stream_leaves_the_target_as_it_was) {
    fill();
    char ref[256], tgt[256];
    path("ref2.safetensors", ref, sizeof ref);
    path("tgt.safetensors", tgt, sizeof tgt);
    fg_st_writer *w = make(false);
    CHECK(fg_st_writer_write(w, ref) == FG_OK);
    CHECK(fg_st_writer_write(w, tgt) == FG_OK);
    fg_st_writer_free(w);
    int before = entries();
    /* more bytes than the entry has left */
    w = make(true);
    CHECK(fg_st_writer_begin(w, tgt) == FG_OK);
    CHECK(fg_st_writer_put(w, g_a, 200 * 4, NULL) == FG_OK);
    CHECK(fg_st_writer_put(w, g_a, 101 * 4, NULL) == FG_EINVAL);
    CHECK_MSG(strstr(fg_last_error(), "\"a\"") && strstr(fg_last_error(), "400 are left"), "%s",
              fg_last_error());
    CHECK(fg_st_writer_put(w, g_a, 4, NULL) == FG_ESTATE); /* the stream is over */
    CHECK(fg_st_writer_finish(w) == FG_ESTATE);
    CHECK(entries() == before && same_file(ref, tgt));
    /* finished early */
    CHECK(fg_st_writer_begin(w, tgt) == FG_OK);
    CHECK(fg_st_writer_put(w, g_a, sizeof g_a, NULL) == FG_OK);
    CHECK(fg_st_writer_finish(w) == FG_ESTATE);
    CHECK_MSG(strstr(fg_last_error(), "\"c\"") && strstr(fg_last_error(), "0 of its 28 bytes"),
              "%s", fg_last_error());
    CHECK(entries() == before && same_file(ref, tgt));
    /* the header is written: nothing more may be added or set */
    CHECK(fg_st_writer_begin(w, tgt) == FG_OK);
    CHECK(fg_st_writer_add(w, "d", FG_F32, 1, k_sc, g_c) == FG_ESTATE);
    CHECK(fg_st_writer_declare(w, "d", FG_F32, 1, k_sc) == FG_ESTATE);
    CHECK(fg_st_writer_set_meta(w, "step", "4") == FG_ESTATE);
    CHECK(fg_st_writer_begin(w, tgt) == FG_ESTATE);
    CHECK(fg_st_writer_put(w, NULL, 4, NULL) == FG_EINVAL);
    /* and freed in the middle: the temporary file goes */
    CHECK(fg_st_writer_begin(w, tgt) == FG_OK);
    CHECK(fg_st_writer_put(w, g_a, 8, NULL) == FG_OK);
    CHECK(entries() == before + 1);
    fg_st_writer_free(w);
    CHECK(entries() == before && same_file(ref, tgt));
    /* fg_st_writer_write of declared entries: refused, naming one */
    w = make(true);
    CHECK(fg_st_writer_write(w, tgt) == FG_ESTATE);
    CHECK_MSG(strstr(fg_last_error(), "\"a\" was declared without data"), "%s", fg_last_error());
    CHECK(fg_st_writer_put(w, g_a, 4, NULL) == FG_ESTATE); /* nothing begun */
    CHECK(fg_st_writer_finish(w) == FG_ESTATE);
    fg_st_writer_free(w);
    CHECK(entries() == before && same_file(ref, tgt));
    /* a folder at the target: refused at begin, as write refuses it */
    char sub[256];
    path("adir", sub, sizeof sub);
    CHECK(mkdir(sub, 0700) == 0);
    w = make(true);
    CHECK(fg_st_writer_begin(w, sub) == FG_EINVAL);
    fg_st_writer_free(w);
    CHECK(rmdir(sub) == 0);
}

__attribute__((constructor)) static void make_dir(void) {
    if (!mkdtemp(g_dir)) perror("mkdtemp");
}

__attribute__((destructor)) static void remove_dir(void) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) perror("rm");
}
