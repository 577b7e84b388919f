/* The safetensors layer: round trips of every dtype and shape (0-d and
 * empty included) with metadata; every crafted file of tests/ckpt/crafted
 * (made by make_crafted.py) opens or fails with FG_EFORMAT and the expected
 * words, naming the file; thousands of bit flips of a valid file never
 * crash; failed allocations at every point give errors, not crashes; the
 * `last` pointer names the newest whole file; a write refuses a target
 * that is there and not a regular file. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fixtures.h"
#include "fulgur/ckpt.h"
#include "harness.h"

static char g_dir[256];

static const char *tmp_path(const char *name) {
    static char buf[512];
    if (!g_dir[0]) {
        snprintf(g_dir, sizeof g_dir, "/tmp/fulgur-st-test-%d", (int)getpid());
        mkdir(g_dir, 0700);
    }
    snprintf(buf, sizeof buf, "%s/%s", g_dir, name);
    return buf;
}

TEST(round_trip_every_dtype_and_shape) {
    double f64[6] = {1.5, -2, 3, 4, 5, 6};
    float f32[6] = {0.25f, -1, 2, 3, 4, 5};
    uint16_t half[3] = {0x3c00, 0xc000, 0x3f80};
    int32_t i32[2] = {-7, 9};
    int64_t i64[1] = {1LL << 40};
    uint8_t u8[4] = {1, 2, 3, 255};
    int64_t s23[2] = {2, 3}, s3[1] = {3}, s2[1] = {2}, s0[2] = {0, 5}, s22[2] = {2, 2};
    fg_st_writer *w = fg_st_writer_new();
    CHECK_OK(fg_st_writer_add(w, "a.f64", FG_F64, 2, s23, f64));
    CHECK_OK(fg_st_writer_add(w, "b.f32", FG_F32, 2, s23, f32));
    CHECK_OK(fg_st_writer_add(w, "c.bf16", FG_BF16, 1, s3, half));
    CHECK_OK(fg_st_writer_add(w, "d.f16", FG_F16, 1, s3, half));
    CHECK_OK(fg_st_writer_add(w, "e.i32", FG_I32, 1, s2, i32));
    CHECK_OK(fg_st_writer_add(w, "f.scalar", FG_I64, 0, NULL, i64));
    CHECK_OK(fg_st_writer_add(w, "g.u8", FG_U8, 2, s22, u8));
    CHECK_OK(fg_st_writer_add(w, "h.empty", FG_F32, 2, s0, NULL));
    CHECK_OK(fg_st_writer_set_meta(w, "format", "test"));
    CHECK_OK(fg_st_writer_set_meta(w, "note", "with \"quotes\" and \\ and \xc3\xa9"));
    CHECK(fg_st_writer_count(w) == 8);
    CHECK_OK(fg_st_writer_write(w, tmp_path("rt.safetensors")));
    fg_st_writer_free(w);
    fg_st_file *f = fg_st_open(tmp_path("rt.safetensors"));
    CHECK_MSG(f != NULL, "%s", fg_last_error());
    if (!f) return;
    CHECK(fg_st_count(f) == 8);
    CHECK_CONTAINS(fg_st_meta_get(f, "note"), "\"quotes\" and \\ and \xc3\xa9");
    fg_st_info info;
    int64_t k = fg_st_find(f, "b.f32");
    CHECK_OK(fg_st_info_at(f, k, &info));
    CHECK(info.dtype == FG_F32 && info.ndim == 2 && info.shape[0] == 2 && info.shape[1] == 3);
    CHECK(memcmp(fg_st_data(f, k), f32, sizeof f32) == 0);
    CHECK(memcmp(fg_st_data(f, fg_st_find(f, "a.f64")), f64, sizeof f64) == 0);
    CHECK(memcmp(fg_st_data(f, fg_st_find(f, "d.f16")), half, sizeof half) == 0);
    CHECK(memcmp(fg_st_data(f, fg_st_find(f, "g.u8")), u8, sizeof u8) == 0);
    CHECK_OK(fg_st_info_at(f, fg_st_find(f, "f.scalar"), &info));
    CHECK(info.ndim == 0 && info.numel == 1);
    int64_t scalar; /* data in a safetensors file is packed, not aligned */
    memcpy(&scalar, fg_st_data(f, fg_st_find(f, "f.scalar")), sizeof scalar);
    CHECK(scalar == (1LL << 40));
    CHECK_OK(fg_st_info_at(f, fg_st_find(f, "h.empty"), &info));
    CHECK(info.numel == 0);
    double conv[2];
    CHECK_OK(fg_st_read(f, fg_st_find(f, "e.i32"), conv, FG_F64, 2));
    CHECK(conv[0] == -7 && conv[1] == 9);
    CHECK_STATUS(fg_st_read(f, fg_st_find(f, "e.i32"), conv, FG_F64, 3), FG_EMISMATCH);
    CHECK(fg_st_find(f, "missing") < 0);
    fg_st_close(f);
    fg_st_close(NULL);
    fg_st_writer_free(NULL);
}

/* fg_st_read_range_on: a range of an entry into host memory and into a
 * guarded device's (which the host cannot touch: only the copy calls reach
 * it), straight when the dtypes agree, converted through the staging
 * pieces otherwise (an entry of 1.5 M f32 elements, more than one 4 MiB
 * piece as f64), the same values either way. */
TEST(read_range_on_host_and_device) {
    enum { N = 3 << 19 };
    float *v = malloc(sizeof(float) * N);
    double *want = malloc(sizeof(double) * N), *got = malloc(sizeof(double) * N);
    CHECK(v && want && got);
    if (!v || !want || !got) return;
    uint8_t pad[1] = {7}; /* packs the f32 entry after it at an odd offset */
    for (int64_t i = 0; i < N; i++) v[i] = (float)i * 0.5f - 1000.0f;
    int64_t sn[1] = {N}, s1[1] = {1};
    char path[128];
    snprintf(path, sizeof path, "/tmp/fulgur-st-range-%d.safetensors", (int)getpid());
    fg_st_writer *w = fg_st_writer_new();
    CHECK_OK(fg_st_writer_add(w, "pad", FG_U8, 1, s1, pad));
    CHECK_OK(fg_st_writer_add(w, "v", FG_F32, 1, sn, v));
    CHECK_OK(fg_st_writer_write(w, path));
    fg_st_writer_free(w);
    fg_st_file *f = fg_st_open(path);
    fg_dev *d = fg_dev_open("guarded:0", NULL);
    CHECK_MSG(f && d, "%s", fg_last_error());
    if (!f || !d) return;
    int64_t k = fg_st_find(f, "v"), lo = 5, hi = N - 3;
    for (int64_t i = lo; i < hi; i++) want[i - lo] = v[i];
    /* host: a part, converted */
    CHECK_OK(fg_st_read_range_on(f, k, NULL, got, FG_F64, lo, hi));
    CHECK(memcmp(got, want, sizeof(double) * (size_t)(hi - lo)) == 0);
    /* the device: converted in pieces, then the same dtype straight */
    double *dd = fg_dev_alloc(d, sizeof(double) * N, NULL);
    float *df = fg_dev_alloc(d, sizeof(float) * N, NULL);
    CHECK(dd && df);
    fg_dev_reset_copy_stats(d);
    CHECK_OK(fg_st_read_range_on(f, k, d, dd, FG_F64, lo, hi));
    memset(got, 0, sizeof(double) * N);
    CHECK_OK(fg_dev_copy_d2h(d, got, dd, sizeof(double) * (size_t)(hi - lo)));
    CHECK(memcmp(got, want, sizeof(double) * (size_t)(hi - lo)) == 0);
    fg_dev_memory_stats st = fg_dev_memory_stats_get(d);
    CHECK_MSG(st.h2d_bytes == sizeof(double) * (size_t)(hi - lo) && st.h2d_copies >= 2,
              "%llu bytes in %llu copies", (unsigned long long)st.h2d_bytes,
              (unsigned long long)st.h2d_copies);
    CHECK_OK(fg_st_read_range_on(f, k, d, df, FG_F32, 0, N));
    float *back = malloc(sizeof(float) * N);
    CHECK(back != NULL);
    if (back) {
        CHECK_OK(fg_dev_copy_d2h(d, back, df, sizeof(float) * N));
        CHECK(memcmp(back, v, sizeof(float) * N) == 0);
        free(back);
    }
    /* a range outside the entry, a NULL destination: named errors */
    CHECK_STATUS(fg_st_read_range_on(f, k, d, df, FG_F32, 2, N + 1), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "\"v\"");
    CHECK_STATUS(fg_st_read_range_on(f, k, d, NULL, FG_F32, 0, 2), FG_EINVAL);
    CHECK_OK(fg_st_read_range_on(f, k, d, NULL, FG_F32, 4, 4)); /* nothing to read */
    CHECK_OK(fg_dev_free(d, dd));
    CHECK_OK(fg_dev_free(d, df));
    CHECK_OK(fg_dev_leak_check(d));
    fg_dev_close(d);
    fg_st_close(f);
    unlink(path);
    free(v);
    free(want);
    free(got);
}

TEST(crafted_files_open_or_fail_with_the_expected_message) {
    FILE *ex = fopen(fg_test_path("ckpt/crafted/expect.tsv"), "r");
    CHECK(ex != NULL);
    if (!ex) return;
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof line, ex)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        line[strcspn(line, "\n")] = '\0';
        char *tab = strchr(line, '\t');
        if (!tab) continue;
        *tab = '\0';
        const char *want = tab + 1;
        char rel[1100];
        snprintf(rel, sizeof rel, "ckpt/crafted/%s", line);
        fg_clear_error();
        fg_st_file *f = fg_st_open(fg_test_path(rel));
        fg_status s = f ? FG_OK : fg_last_status();
        if (!strcmp(want, "OK")) {
            CHECK_MSG(f != NULL, "%s: %s", line, fg_last_error());
        } else {
            CHECK_MSG(s == FG_EFORMAT, "%s: status %s (%s)", line, fg_status_str(s),
                      fg_last_error());
            CHECK_MSG(strstr(fg_last_error(), want) != NULL, "%s: \"%s\" lacks \"%s\"", line,
                      fg_last_error(), want);
            CHECK_MSG(strstr(fg_last_error(), line) != NULL,
                      "%s: message does not name the file: %s", line, fg_last_error());
            CHECK(f == NULL);
        }
        fg_st_close(f);
        n++;
    }
    fclose(ex);
    CHECK(n >= 50);
}

TEST(open_returns_the_file_or_null_with_the_status) {
    fg_clear_error();
    CHECK(fg_st_open(NULL) == NULL && fg_last_status() == FG_EINVAL);
    CHECK(fg_st_open(tmp_path("does-not-exist.safetensors")) == NULL);
    CHECK(fg_last_status() == FG_EIO);
    CHECK_CONTAINS(fg_last_error(), "does-not-exist.safetensors");
    CHECK(fg_st_open_memory(NULL, 8, "x") == NULL && fg_last_status() == FG_EINVAL);
    fg_st_file *f = fg_st_open_memory("\x02\0\0\0\0\0\0\0{}", 10, "tiny");
    CHECK_MSG(f != NULL && fg_st_count(f) == 0, "%s", fg_last_error());
    fg_st_close(f);
    fg_st_close(NULL);
}

TEST(dtype_zero_is_no_dtype) {
    float v[2] = {1, 2};
    int64_t s[1] = {2};
    fg_st_writer *w = fg_st_writer_new();
    CHECK_STATUS(fg_st_writer_add(w, "w", FG_DTYPE_DEFAULT, 1, s, v), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "default");
    CHECK(fg_st_writer_count(w) == 0);
    fg_st_writer_free(w);
    /* a dtype fulgur lacks reads back as FG_DTYPE_DEFAULT, has_dtype false */
    fg_st_file *f = fg_st_open(fg_test_path("ckpt/crafted/good_other_dtypes.safetensors"));
    CHECK_MSG(f != NULL, "%s", fg_last_error());
    if (!f) return;
    fg_st_info info;
    CHECK_OK(fg_st_info_at(f, fg_st_find(f, "m"), &info));
    CHECK(!strcmp(info.dtype_name, "BOOL") && !info.has_dtype && info.dtype == FG_DTYPE_DEFAULT);
    uint8_t out[3];
    CHECK_STATUS(fg_st_read(f, fg_st_find(f, "m"), out, FG_U8, 3), FG_EUNSUPPORTED);
    CHECK_STATUS(fg_st_read(f, fg_st_find(f, "m"), out, FG_DTYPE_DEFAULT, 3), FG_EINVAL);
    fg_st_close(f);
}

/* A valid file in memory. */
static uint8_t *valid_file(size_t *len) {
    float v[64];
    for (int i = 0; i < 64; i++) v[i] = (float)i;
    int64_t s[2] = {8, 8}, s1[1] = {4};
    fg_st_writer *w = fg_st_writer_new();
    CHECK_OK(fg_st_writer_add(w, "layer.weight", FG_F32, 2, s, v));
    CHECK_OK(fg_st_writer_add(w, "layer.bias", FG_F32, 1, s1, v));
    CHECK_OK(fg_st_writer_set_meta(w, "step", "40"));
    CHECK_OK(fg_st_writer_write(w, tmp_path("flip.safetensors")));
    fg_st_writer_free(w);
    FILE *fp = fopen(tmp_path("flip.safetensors"), "rb");
    fseek(fp, 0, SEEK_END);
    *len = (size_t)ftell(fp);
    rewind(fp);
    uint8_t *buf = malloc(*len);
    *len = fread(buf, 1, *len, fp);
    fclose(fp);
    return buf;
}

TEST(bit_flips_never_crash) {
    size_t len;
    uint8_t *orig = valid_file(&len), *buf = malloc(len);
    fg_rng r = {99, 0};
    int opened = 0, failed = 0;
    for (int it = 0; it < 20000; it++) {
        memcpy(buf, orig, len);
        int flips = 1 + (int)fg_rng_below(&r, 3);
        /* most flips in the header, where the parser works */
        for (int k = 0; k < flips; k++) {
            size_t at = fg_rng_below(&r, 4) ? fg_rng_below(&r, len < 200 ? len : 200)
                                            : fg_rng_below(&r, len);
            buf[at] ^= (uint8_t)(1u << fg_rng_below(&r, 8));
        }
        fg_st_file *f = fg_st_open_memory(buf, len, "flipped");
        if (f) {
            opened++;
            for (int64_t i = 0; i < fg_st_count(f); i++) {
                fg_st_info info;
                if (fg_st_info_at(f, i, &info) == FG_OK && info.numel) {
                    const uint8_t *p = fg_st_data(f, i);
                    volatile uint8_t last = p[info.numel * (int64_t)info.elem_size - 1];
                    (void)last;
                }
            }
            fg_st_close(f);
        } else {
            failed++;
            CHECK(fg_last_error()[0] != '\0' && fg_last_status() != FG_OK);
        }
    }
    CHECK(opened > 0 && failed > 0);
    free(buf);
    free(orig);
}

TEST(every_failed_allocation_is_an_error) {
    size_t len;
    uint8_t *buf = valid_file(&len);
    int errors = 0;
    for (int fail_at = 1;; fail_at++) {
        fx_alloc_begin_nth(fail_at);
        fg_clear_error();
        fg_st_file *f = fg_st_open_memory(buf, len, "mem");
        fg_status s = f ? FG_OK : fg_last_status();
        fg_st_close(f);
        fx_alloc_end();
        if (f) break;
        /* jansson allocates through fulgur's hook and reports a failure as a
         * parse error, so FG_EFORMAT is possible as well: never FG_OK, never a crash. */
        CHECK_MSG(s == FG_ENOMEM || s == FG_EFORMAT, "failing allocation %d: %s", fail_at,
                  fg_status_str(s));
        CHECK(fg_last_error()[0]);
        errors++;
        if (fail_at > 10000) break;
    }
    CHECK(errors > 0);
    free(buf);
}

TEST(last_pointer_names_the_newest_whole_file) {
    float v[4] = {1, 2, 3, 4};
    int64_t s[1] = {4};
    char target[512];
    for (int step = 1; step <= 3; step++) {
        char name[64];
        snprintf(name, sizeof name, "step-%d.safetensors", step);
        fg_st_writer *w = fg_st_writer_new();
        v[0] = (float)step;
        CHECK_OK(fg_st_writer_add(w, "w", FG_F32, 1, s, v));
        snprintf(target, sizeof target, "%s", tmp_path(name));
        CHECK_OK(fg_st_writer_write(w, target));
        fg_st_writer_free(w);
        CHECK_OK(fg_st_set_last(tmp_path("last.safetensors"), target));
    }
    char got[512];
    CHECK_OK(fg_st_get_last(tmp_path("last.safetensors"), got, sizeof got));
    CHECK_CONTAINS(got, "step-3.safetensors");
    fg_st_file *f = fg_st_open(tmp_path("last.safetensors"));
    CHECK_MSG(f != NULL, "%s", fg_last_error());
    float first = 0;
    if (f) memcpy(&first, fg_st_data(f, 0), sizeof first);
    CHECK(first == 3);
    fg_st_close(f);
    /* a write into a folder that does not exist fails with the path named */
    fg_st_writer *w = fg_st_writer_new();
    CHECK_OK(fg_st_writer_add(w, "w", FG_F32, 1, s, v));
    CHECK_STATUS(fg_st_writer_write(w, "/nonexistent-dir/x.safetensors"), FG_EIO);
    CHECK_CONTAINS(fg_last_error(), "/nonexistent-dir");
    fg_st_writer_free(w);
    /* rename(2) would replace a fifo, a symlink (here to /dev/null) or a
     * folder as readily as a file: each is refused, naming what it is, and
     * left as it was, with no temporary file behind; a regular file is
     * replaced */
    CHECK(mkfifo(tmp_path("fifo"), 0600) == 0);
    CHECK(symlink("/dev/null", tmp_path("null-link")) == 0);
    CHECK(mkdir(tmp_path("a-folder"), 0700) == 0);
    struct {
        const char *name, *what;
    } odd[] = {{"fifo", "a fifo"}, {"null-link", "a symlink"}, {"a-folder", "a folder"}};
    w = fg_st_writer_new();
    CHECK_OK(fg_st_writer_add(w, "w", FG_F32, 1, s, v));
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s", tmp_path(odd[i].name));
        CHECK_STATUS(fg_st_writer_write(w, p), FG_EINVAL);
        CHECK_CONTAINS(fg_last_error(), p);
        CHECK_CONTAINS(fg_last_error(), odd[i].what);
        struct stat sb;
        CHECK(lstat(p, &sb) == 0 && !S_ISREG(sb.st_mode));
    }
    char tmpl[600];
    snprintf(tmpl, sizeof tmpl, "ls -a %s | grep -q tmp-", g_dir);
    CHECK_MSG(system(tmpl) != 0, "a temporary file was left in %s", g_dir);
    CHECK_OK(fg_st_writer_write(w, target)); /* step-3, a regular file */
    fg_st_writer_free(w);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
}
