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

/* An allocator that fails every allocation after the first `limit` and
 * counts live blocks, to check that every failure path frees what it took. */
#include <stdatomic.h>
static atomic_long fa_count_, fa_live_;
static long fa_limit_;
static void *fa_alloc_(void *ud, void *ptr, size_t size, size_t align) {
    (void)ud;
    if (size == 0) {
        if (ptr) atomic_fetch_sub(&fa_live_, 1);
        free(ptr);
        return NULL;
    }
    if (atomic_fetch_add(&fa_count_, 1) >= fa_limit_) return NULL;
    if (ptr) return realloc(ptr, size);
    void *p = NULL;
    if (posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, size) != 0) return NULL;
    atomic_fetch_add(&fa_live_, 1);
    return p;
}
static void fa_begin(long limit) {
    fa_limit_ = limit;
    atomic_store(&fa_count_, 0);
    atomic_store(&fa_live_, 0);
    fg_set_allocator(fa_alloc_, NULL);
}
/* Restores the default allocator; returns the blocks still live. */
static long fa_end(void) {
    fg_set_allocator(NULL, NULL);
    return atomic_load(&fa_live_);
}

#endif
