/* Temporary files for the data tests: a fresh folder per test, removed at
 * the end of it. */
#ifndef FG_DATA_TEST_UTIL_H
#define FG_DATA_TEST_UTIL_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fixtures.h"

static char tmp_dir_[256];

static const char *tmp_new(void) {
    snprintf(tmp_dir_, sizeof tmp_dir_, "/tmp/fg_data_test_XXXXXX");
    if (!mkdtemp(tmp_dir_)) {
        perror("mkdtemp");
        exit(2);
    }
    return tmp_dir_;
}

/* A path inside the test's folder (rotating buffers, so that a few can be
 * alive at once). */
static const char *tmp_path(const char *name) {
    static char bufs[8][512];
    static int k;
    char *b = bufs[k++ % 8];
    snprintf(b, 512, "%s/%s", tmp_dir_, name);
    return b;
}

static void tmp_write(const char *name, const void *data, size_t n) {
    FILE *f = fopen(tmp_path(name), "wb");
    if (!f) {
        perror(name);
        exit(2);
    }
    if (n) fwrite(data, 1, n, f);
    fclose(f);
}

static int rm_one_(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

static void tmp_done(void) {
    if (tmp_dir_[0]) nftw(tmp_dir_, rm_one_, 16, FTW_DEPTH | FTW_PHYS);
    tmp_dir_[0] = '\0';
}

#endif
