/* core: errors, allocator hook, arena, RNG, dtype conversions, threads. */
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "core/core_impl.h"
#include "fixtures.h"
#include "harness.h"

TEST(error_messages_are_per_thread_and_wrapped) {
    CHECK(fg_error(FG_EINVAL, "devices=\"%s\": bad", "abc") == FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "devices=\"abc\"");
    fg_error_wrap(FG_EINVAL, "fit");
    CHECK(strncmp(fg_last_error(), "fit: devices", 12) == 0);
    fg_clear_error();
    CHECK(fg_last_error()[0] == '\0');
    CHECK_CONTAINS(fg_status_str(FG_EPEER), "peer");
    CHECK_CONTAINS(fg_status_str((fg_status)999), "unknown");
}

static void *fail_on_thread(void *arg) {
    (void)arg;
    fg_error(FG_EIO, "on the other thread");
    return fg_last_status() == FG_EIO ? arg : NULL;
}

TEST(last_status_goes_with_the_message) {
    fg_clear_error();
    CHECK(fg_last_status() == FG_OK);
    fg_error(FG_EFORMAT, "bad file");
    CHECK(fg_last_status() == FG_EFORMAT);
    fg_error_wrap(FG_EMISMATCH, "load");
    CHECK(fg_last_status() == FG_EMISMATCH);
    CHECK_CONTAINS(fg_last_error(), "load: bad file");
    /* a failed constructor leaves its status: fg_alloc's FG_ENOMEM */
    CHECK(fg_calloc(SIZE_MAX / 2, 4) == NULL);
    CHECK(fg_last_status() == FG_ENOMEM);
    /* per thread: another thread's failure does not touch this one's */
    static int token;
    pthread_t t;
    void *ret = NULL;
    CHECK(pthread_create(&t, NULL, fail_on_thread, &token) == 0);
    pthread_join(t, &ret);
    CHECK(ret == &token);
    CHECK(fg_last_status() == FG_ENOMEM);
    CHECK_CONTAINS(fg_last_error(), "overflows");
    fg_clear_error();
    CHECK(fg_last_status() == FG_OK);
}

TEST(allocator_hook_fails_the_nth_allocation) {
    fx_alloc_begin_nth(2);
    void *a = fg_alloc(100);
    void *b = fg_alloc(100);
    void *c = fg_calloc(10, 10);
    fx_alloc_end();
    CHECK(a != NULL);
    CHECK(b == NULL);
    CHECK_CONTAINS(fg_last_error(), "100 bytes");
    CHECK(c != NULL && ((char *)c)[99] == 0);
    CHECK(((uintptr_t)a & 63) == 0);
    fx_alloc_begin(LONG_MAX);
    fg_free(a);
    fg_free(c);
    fg_free(NULL);
    fx_alloc_end();
    CHECK(fg_calloc(SIZE_MAX / 2, 4) == NULL);
}

/* Freeing a large block must not leave glibc's mmap threshold raised:
 * a block allocated after it (an arena chunk) is still mapped, so that
 * freeing it returns its memory. */
TEST(freeing_a_large_block_keeps_later_ones_mapped) {
#if defined(__GLIBC__) && defined(__GLIBC_PREREQ) && !defined(__SANITIZE_ADDRESS__)
#if __GLIBC_PREREQ(2, 33)
    size_t big = (size_t)12 << 20, mid = (size_t)4 << 20;
    char *b = fg_alloc(big);
    CHECK(b != NULL);
    memset(b, 1, big);
    fg_free(b);
    struct mallinfo2 before = mallinfo2();
    char *m = fg_alloc(mid);
    struct mallinfo2 after = mallinfo2();
    CHECK_MSG(after.hblkhd >= before.hblkhd + mid,
              "a 4 MiB block after freeing a 12 MiB one came from the heap (mapped bytes %zu -> "
              "%zu)",
              before.hblkhd, after.hblkhd);
    fg_free(m);
    return;
#endif
#endif
    SKIP("glibc 2.33 or later's own malloc only (mallinfo2; not under the sanitizers)");
}

TEST(arena_aligns_and_resets) {
    fg_arena *a = fg_arena_new(1024);
    void *p = fg_arena_alloc(a, 10);
    void *q = fg_arena_alloc(a, 5000); /* bigger than a chunk */
    CHECK(p && q && ((uintptr_t)p & 63) == 0 && ((uintptr_t)q & 63) == 0);
    memset(q, 1, 5000);
    CHECK(fg_arena_used(a) == 64 + 5056);
    fg_arena_reset(a);
    CHECK(fg_arena_used(a) == 0);
    CHECK(fg_arena_peak(a) == 64 + 5056);
    void *r = fg_arena_alloc(a, 5000);
    CHECK(r != NULL);
    fg_arena_free(a);
    fg_arena_free(NULL);
}

/* A mark and release inside a step (activation checkpointing): the memory
 * after the mark is handed out again, chunks needed past it are kept for
 * reuse, and after a reset a step of the same shape gets the same memory
 * as the step before: no new chunk in the steps after. */
TEST(arena_mark_and_release) {
    fg_arena *a = fg_arena_new(1024);
    char *base = fg_arena_alloc(a, 100);
    fg__arena_point m = fg__arena_mark(a);
    char *p = fg_arena_alloc(a, 200);
    char *big = fg_arena_alloc(a, 8000); /* a new chunk */
    memset(big, 7, 8000);
    CHECK(fg_arena_used(a) == 128 + 256 + 8000);
    fg__arena_release(a, m);
    CHECK(fg_arena_used(a) == 128);
    CHECK(fg_arena_peak(a) == 128 + 256 + 8000);
    CHECK(big[7999] == 7);                 /* a dropped chunk stays valid until reset */
    CHECK(fg_arena_alloc(a, 200) == p);    /* the rewound memory again */
    CHECK(fg_arena_alloc(a, 7000) == big); /* the dropped chunk again */
    fg_arena_reset(a);
    char *first[4] = {NULL};
    for (int step = 0; step < 3; step++) { /* the same memory each step */
        char *got[4];
        got[0] = fg_arena_alloc(a, 100);
        fg__arena_point k = fg__arena_mark(a);
        got[1] = fg_arena_alloc(a, 200);
        got[2] = fg_arena_alloc(a, 8000);
        CHECK(got[0] && got[1] && got[2]);
        fg__arena_release(a, k);
        got[3] = fg_arena_alloc(a, 8000);
        CHECK(got[3] == got[2]); /* the dropped chunk again */
        if (step == 0) {
            CHECK(got[0] == base && got[2] == big); /* the first step's chunks */
            memcpy(first, got, sizeof first);
        }
        for (int i = 0; i < 4; i++) CHECK(got[i] == first[i]);
        fg_arena_reset(a);
    }
    (void)base;
    fg_arena_free(a);
}

TEST(rng_is_counter_based) {
    /* Philox4x32-10 known-answer vector (Random123 kat_vectors): key 0, ctr 0. */
    uint32_t out[4];
    fg_philox(0, 0, out);
    CHECK(out[0] == 0x6627e8d5u && out[1] == 0xe169c58du && out[2] == 0xbc57ac4cu &&
          out[3] == 0x9b00dbd8u);
    fg_rng r = {42, 0};
    uint32_t first[10];
    for (int i = 0; i < 10; i++) first[i] = fg_rng_u32(&r);
    for (int i = 9; i >= 0; i--) CHECK(fg_rng_u32_at(42, (uint64_t)i) == first[i]);
    float buf[1000];
    fg_rng_fill_uniform(7, 0, buf, 1000);
    float tail[10];
    fg_rng_fill_uniform(7, 990, tail, 10);
    CHECK(memcmp(buf + 990, tail, sizeof tail) == 0);
    double mean = 0;
    for (int i = 0; i < 1000; i++) {
        CHECK(buf[i] >= 0 && buf[i] < 1);
        mean += buf[i] / 1000;
    }
    CHECK_CLOSE(mean, 0.5, 0, 0.05);
    fg_rng_fill_normal(7, 0, buf, 1000, 0, 1);
    double m = 0, v = 0;
    for (int i = 0; i < 1000; i++) m += buf[i] / 1000;
    for (int i = 0; i < 1000; i++) v += (buf[i] - m) * (buf[i] - m) / 1000;
    CHECK_CLOSE(m, 0, 0, 0.1);
    CHECK_CLOSE(v, 1, 0, 0.15);
    CHECK(fg_rng_derive(1, 0) != fg_rng_derive(1, 1));
    fg_rng rb = {3, 0};
    for (int i = 0; i < 100; i++) CHECK(fg_rng_below(&rb, 7) < 7);
}

TEST(bf16_and_f16_round_to_nearest_even) {
    CHECK(fg_f32_to_bf16(1.0f) == 0x3f80);
    /* 1 + 2^-8 is exactly half way between two bf16 values: ties to even (1.0). */
    CHECK(fg_f32_to_bf16(1.00390625f) == 0x3f80);
    /* 1 + 3*2^-8: half way, rounds up to the even 1 + 2^-6 */
    CHECK(fg_f32_to_bf16(1.01171875f) == 0x3f82);
    CHECK(isnan(fg_bf16_to_f32(fg_f32_to_bf16(NAN))));
    CHECK(fg_bf16_to_f32(fg_f32_to_bf16(-2.5f)) == -2.5f);
    CHECK(fg_f32_to_f16(1.0f) == 0x3c00);
    CHECK(fg_f32_to_f16(65504.0f) == 0x7bff);
    CHECK(fg_f32_to_f16(65520.0f) == 0x7c00);           /* rounds to inf */
    CHECK(fg_f32_to_f16(1.0f + 1.0f / 2048) == 0x3c00); /* tie to even */
    CHECK(fg_f32_to_f16(1.0f + 3.0f / 2048) == 0x3c02);
    CHECK(fg_f16_to_f32(0x0001) == ldexpf(1, -24)); /* least subnormal */
    CHECK(fg_f32_to_f16(ldexpf(1, -25)) == 0);      /* tie to even: zero */
    CHECK(fg_f32_to_f16(ldexpf(3, -26)) == 0x0001);
    CHECK(fg_f32_to_f16(-0.0f) == 0x8000);
    CHECK(isnan(fg_f16_to_f32(fg_f32_to_f16(NAN))));
    /* every f16 value survives a round trip through f32 */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = fg_f16_to_f32((uint16_t)h);
        if (!isnan(f) && fg_f32_to_f16(f) != h) bad++;
    }
    CHECK(bad == 0);
}

TEST(convert_and_dtype_names) {
    float src[4] = {1.5f, -2.25f, 3.0f, 1e9f};
    double d[4];
    int32_t i[4];
    CHECK_OK(fg_convert(d, FG_F64, src, FG_F32, 4));
    CHECK(d[1] == -2.25);
    CHECK_OK(fg_convert(i, FG_I32, src, FG_F32, 3));
    CHECK(i[0] == 1 && i[1] == -2 && i[2] == 3);
    CHECK_STATUS(fg_convert(i, (fg_dtype)99, src, FG_F32, 3), FG_EINVAL);
    CHECK_STATUS(fg_convert(NULL, FG_F32, src, FG_F32, 3), FG_EINVAL);
    fg_dtype dt;
    CHECK_OK(fg_dtype_parse("BF16", &dt));
    CHECK(dt == FG_BF16 && fg_dtype_size(dt) == 2);
    CHECK_STATUS(fg_dtype_parse("f8", &dt), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "\"f8\"");
}

TEST(dtype_zero_is_the_default_not_a_type) {
    CHECK(FG_DTYPE_DEFAULT == 0);
    CHECK(!fg_dtype_valid(FG_DTYPE_DEFAULT) && !fg_dtype_valid(-1));
    CHECK(!fg_dtype_valid(FG_DTYPE_COUNT));
    CHECK(fg_dtype_size(FG_DTYPE_DEFAULT) == 0);
    CHECK(!fg_dtype_is_float(FG_DTYPE_DEFAULT));
    CHECK(!strcmp(fg_dtype_name(FG_DTYPE_DEFAULT), "default"));
    CHECK(!strcmp(fg_dtype_st_name(FG_DTYPE_DEFAULT), "?"));
    CHECK(!strcmp(fg_dtype_name((fg_dtype)99), "?"));
    /* every real dtype: valid, sized, and its two names parse back to it */
    for (int i = FG_DTYPE_DEFAULT + 1; i < FG_DTYPE_COUNT; i++) {
        fg_dtype dt = (fg_dtype)i, a = FG_DTYPE_DEFAULT, b = FG_DTYPE_DEFAULT;
        CHECK(fg_dtype_valid(i) && fg_dtype_size(dt) > 0);
        CHECK_OK(fg_dtype_parse(fg_dtype_name(dt), &a));
        CHECK_OK(fg_dtype_parse(fg_dtype_st_name(dt), &b));
        CHECK(a == dt && b == dt);
    }
    fg_dtype dt = FG_F16;
    CHECK_STATUS(fg_dtype_parse("default", &dt), FG_EINVAL);
    CHECK_STATUS(fg_dtype_parse(NULL, &dt), FG_EINVAL);
    CHECK_STATUS(fg_dtype_parse("", &dt), FG_EINVAL);
    CHECK(dt == FG_F16);
    float src[2] = {1, 2}, dst[2];
    CHECK_STATUS(fg_convert(dst, FG_DTYPE_DEFAULT, src, FG_F32, 2), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "default");
    CHECK_STATUS(fg_convert(dst, FG_F32, src, FG_DTYPE_DEFAULT, 2), FG_EINVAL);
}

TEST(threads_setting) {
    setenv("FULGUR_NUM_THREADS", "x", 1);
    CHECK_STATUS(fg_set_num_threads(0), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "FULGUR_NUM_THREADS");
    setenv("FULGUR_NUM_THREADS", "1", 1);
    CHECK_OK(fg_set_num_threads(0));
    CHECK(fg_get_num_threads() == 1);
    unsetenv("FULGUR_NUM_THREADS");
    CHECK_OK(fg_set_num_threads(2));
    CHECK(fg_get_num_threads() == 2);
    CHECK(fg_num_cores() >= 1);
}

/* Ranks share one stderr: a line that goes out in several writes can be
 * spliced with another rank's. A SOCK_SEQPACKET socket keeps the writes
 * apart, so each recv is one write: each must be one whole line, at once,
 * whatever the stream's buffering. */
TEST(log_file_puts_each_line_out_in_one_write) {
    int sv[2];
    CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) == 0);
    FILE *out = fdopen(sv[0], "w");
    CHECK(out != NULL);
    if (!out) return;
    static char sbuf[256];
    CHECK(setvbuf(out, sbuf, _IOFBF, sizeof sbuf) == 0); /* smaller than a line */
    char msg[1000];
    memset(msg, 'm', sizeof msg - 1);
    msg[sizeof msg - 1] = '\0';
    fg_log_file(out, FG_LOG_WARN, 3, msg);
    fg_log_file(out, FG_LOG_ERROR, -1, "short");
    char got[4096];
    ssize_t n = recv(sv[1], got, sizeof got, MSG_DONTWAIT);
    CHECK_MSG(n == (ssize_t)(strlen("[fulgur rank 3] warning: ") + 999 + 1),
              "first write: %zd bytes", n);
    CHECK(n > 0 && strncmp(got, "[fulgur rank 3] warning: mmm", 28) == 0 && got[n - 1] == '\n');
    n = recv(sv[1], got, sizeof got, MSG_DONTWAIT);
    CHECK_MSG(n == (ssize_t)strlen("[fulgur] error: short\n"), "second write: %zd bytes", n);
    CHECK(n > 0 && strncmp(got, "[fulgur] error: short\n", (size_t)n) == 0);
    CHECK(recv(sv[1], got, sizeof got, MSG_DONTWAIT) < 0); /* nothing more */
    fclose(out);
    close(sv[1]);
}
