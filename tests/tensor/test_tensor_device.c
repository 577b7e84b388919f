/* Tensors on devices: fg_tensor_new_on, fg_tensor_to and fg_tensor_copy
 * between the host and the guarded device, bitwise, with the copies
 * counted; strided and converting copies within the guarded device; a host
 * read of a device tensor's data faults. */
#include <stdint.h>
#include <sys/wait.h>

#include "fulgur/device.h"
#include "fulgur/tensor.h"
#include "harness.h"
#include "tensor/tensor_impl.h"

static fg_dev *guarded(const char *name) {
    fg_dev *d = fg_dev_open(name, NULL);
    CHECK_MSG(d != NULL, "open %s: %s", name, fg_last_error());
    return d;
}

/* A host tensor of random bits, NaN payloads, -0 and denormals included. */
static fg_tensor *random_bits(fg_dtype dt, int ndim, const int64_t *shape, uint64_t seed) {
    fg_tensor *t = fg_tensor_new(dt, ndim, shape);
    uint8_t *p = fg_tensor_data(t);
    for (size_t i = 0; i < fg_tensor_nbytes(t); i++) p[i] = (uint8_t)fg_rng_u32_at(seed, i);
    return t;
}

TEST(to_guarded_and_back_is_bitwise) {
    fg_dev *d = guarded("guarded:0");
    if (!d) return;
    const fg_dtype dts[] = {FG_F32, FG_BF16, FG_F16, FG_F64, FG_I32, FG_I64, FG_U8, FG_U16};
    const int64_t shape[3] = {3, 5, 7};
    size_t total = 0;
    for (size_t k = 0; k < sizeof dts / sizeof *dts; k++) {
        fg_tensor *h = random_bits(dts[k], 3, shape, 11 + k);
        fg_tensor *g = fg_tensor_to(h, d);
        CHECK_MSG(g != NULL, "%s", fg_last_error());
        if (!g) continue;
        CHECK(fg_tensor_device(g) == FG_GUARDED && fg_tensor_dev(g) == d);
        CHECK(fg_tensor_dtype(g) == dts[k] && fg_tensor_same_shape(g, h));
        CHECK(fg_tensor_is_persistent(g) && fg_tensor_is_contiguous(g));
        CHECK(fg_tensor_data(g) != fg_tensor_data(h));
        fg_tensor *back = fg_tensor_to(g, NULL);
        CHECK(back && fg_tensor_dev(back) == NULL && fg_tensor_device(back) == FG_CPU);
        CHECK(back && memcmp(fg_tensor_data(back), fg_tensor_data(h), fg_tensor_nbytes(h)) == 0);
        total += fg_tensor_nbytes(h);
        fg_tensor_free(back);
        fg_tensor_free(g);
        fg_tensor_free(h);
    }
    fg_dev_memory_stats s = fg_dev_memory_stats_get(d);
    CHECK(s.h2d_bytes == total && s.d2h_bytes == total && s.d2d_bytes == 0);
    CHECK(s.h2d_copies == 8 && s.d2h_copies == 8);
    CHECK_OK(fg_dev_leak_check(d));
    fg_dev_close(d);
}

TEST(strided_host_views_arrive_contiguous) {
    fg_dev *d = guarded("guarded:0");
    if (!d) return;
    const int64_t shape[2] = {6, 9};
    fg_tensor *h = random_bits(FG_F32, 2, shape, 5);
    fg_tensor *tv = fg_tensor_transpose_view(h, 0, 1);
    fg_tensor *g = fg_tensor_to(tv, d);
    CHECK(g && fg_tensor_dim(g, 0) == 9 && fg_tensor_dim(g, 1) == 6);
    fg_tensor *back = fg_tensor_to(g, NULL);
    fg_tensor *want = fg_tensor_contiguous(tv);
    CHECK(back && memcmp(fg_tensor_data(back), fg_tensor_data(want), fg_tensor_nbytes(want)) == 0);
    /* a narrow view of a device tensor along dim 0 is contiguous: it copies */
    fg_tensor *rows = fg_tensor_narrow_view(g, 0, 2, 3);
    CHECK(rows && fg_tensor_dev(rows) == d);
    fg_tensor *rb = fg_tensor_to(rows, NULL);
    CHECK(rb && memcmp(fg_tensor_data(rb), (float *)fg_tensor_data(want) + 12, 18 * 4) == 0);
    /* a strided view on the device cannot be copied yet: an error, not a fault */
    fg_tensor *cols = fg_tensor_narrow_view(g, 1, 1, 2);
    CHECK(fg_tensor_to(cols, NULL) == NULL);
    CHECK(fg_last_status() == FG_EUNSUPPORTED);
    CHECK_CONTAINS(fg_last_error(), "strided view on device guarded:0");
    fg_tensor_free(rb);
    fg_tensor_free(back);
    fg_tensor_free(g);
    fg_tensor_free(h);
    fg_step_reset();
    CHECK_OK(fg_dev_leak_check(d));
    fg_dev_close(d);
}

TEST(new_on_is_zero_and_item_reads_through_a_copy) {
    fg_dev *d = guarded("guarded:0");
    if (!d) return;
    const int64_t shape[1] = {100};
    fg_tensor *z = fg_tensor_new_on(d, FG_F32, 1, shape);
    CHECK(z && fg_tensor_device(z) == FG_GUARDED);
    fg_tensor *zh = fg_tensor_to(z, NULL);
    int nz = 0;
    for (int i = 0; i < 100; i++) nz += ((float *)fg_tensor_data(zh))[i] != 0.0f;
    CHECK(nz == 0);
    fg_tensor *one = fg_tensor_new(FG_F32, 0, NULL);
    *(float *)fg_tensor_data(one) = 2.5f;
    fg_tensor *od = fg_tensor_to(one, d);
    fg_dev_reset_copy_stats(d);
    CHECK(fg_item(od) == 2.5);
    CHECK(fg_tensor_get(z, 99) == 0.0);
    fg_dev_memory_stats s = fg_dev_memory_stats_get(d);
    CHECK(s.d2h_bytes == 8 && s.d2h_copies == 2);
    /* fill is the device's own kernel: no copy; a strided view is refused by name */
    CHECK_OK(fg_tensor_fill(z, 1.5));
    CHECK(fg_dev_memory_stats_get(d).h2d_bytes == s.h2d_bytes);
    CHECK(fg_tensor_get(z, 0) == 1.5 && fg_tensor_get(z, 99) == 1.5);
    CHECK_STATUS(
        fg_tensor_fill(
            fg_tensor_narrow_view(fg_tensor_reshape_view(z, 2, (int64_t[]){10, 10}), 1, 0, 3), 1.0),
        FG_EUNSUPPORTED);
    CHECK_CONTAINS(fg_last_error(), "device guarded:0");
    /* a live tensor shows in the leak check */
    fg_tensor_free(zh);
    fg_tensor_free(one);
    fg_tensor_free(od);
    CHECK_STATUS(fg_dev_leak_check(d), FG_ESTATE);
    CHECK_CONTAINS(fg_last_error(), "1 allocation (400 bytes) still live");
    fg_tensor_free(z);
    CHECK_OK(fg_dev_leak_check(d));
    fg_dev_close(d);
}

/* Within the guarded device a strided or converting copy is its kernel
 * (the host's copy on its alias): the host's bits, nothing copied to or
 * from the host; between the host and a device a strided view is still
 * refused (above). */
TEST(strided_and_converting_copies_within_the_guarded_device) {
    fg_dev *d = guarded("guarded:0");
    if (!d) return;
    const int64_t shape[3] = {4, 5, 6};
    fg_tensor *h = random_bits(FG_F32, 3, shape, 13);
    fg_tensor *g = fg_tensor_to(h, d);
    fg_dev_reset_copy_stats(d);
    /* a transpose made contiguous on the device (a step tensor there), and
     * the host's */
    fg_tensor *ht = fg_tensor_new(FG_F32, 3, (int64_t[]){6, 5, 4});
    CHECK_OK(fg_tensor_copy(ht, fg_tensor_transpose_view(h, 0, 2)));
    CHECK_OK(fg_step_device_set(d));
    fg_tensor *gt = fg_tensor_contiguous(fg_tensor_transpose_view(g, 0, 2));
    /* f32 -> bf16 of a narrow view along the last dim */
    fg_tensor *gn = fg_tensor_narrow_view(g, 2, 1, 4), *hn = fg_tensor_narrow_view(h, 2, 1, 4);
    fg_tensor *gb = fg_tensor_new_on(d, FG_BF16, 3, (int64_t[]){4, 5, 4});
    fg_tensor *hb = fg_tensor_new(FG_BF16, 3, (int64_t[]){4, 5, 4});
    CHECK(gt && ht && gn && hn && gb && hb);
    if (!gt || !ht || !gn || !hn || !gb || !hb) return;
    CHECK_OK(fg_tensor_copy(gb, gn));
    CHECK_OK(fg_tensor_copy(hb, hn));
    fg_dev_memory_stats st = fg_dev_memory_stats_get(d);
    CHECK(st.h2d_bytes == 0 && st.d2h_bytes == 0);
    fg_tensor *bt = fg_tensor_to(gt, NULL), *bb = fg_tensor_to(gb, NULL);
    CHECK(bt && memcmp(fg_tensor_data(bt), fg_tensor_data(ht), fg_tensor_nbytes(ht)) == 0);
    CHECK(bb && memcmp(fg_tensor_data(bb), fg_tensor_data(hb), fg_tensor_nbytes(hb)) == 0);
    fg_tensor_free(bt);
    fg_tensor_free(bb);
    fg_tensor_free(ht);
    fg_tensor_free(gb);
    fg_tensor_free(hb);
    fg_tensor_free(g);
    fg_tensor_free(h);
    fg_step_reset();
    CHECK_OK(fg_step_device_set(NULL));
    CHECK_OK(fg_dev_leak_check(d));
    fg_dev_close(d);
}

TEST(copy_between_host_and_devices) {
    fg_dev *d0 = guarded("guarded:0"), *d1 = guarded("guarded:1");
    if (!d0 || !d1) return;
    const int64_t shape[2] = {4, 33};
    fg_tensor *h = random_bits(FG_BF16, 2, shape, 9);
    fg_tensor *a = fg_tensor_new_on(d0, FG_BF16, 2, shape);
    fg_tensor *b = fg_tensor_new_on(d0, FG_BF16, 2, shape);
    fg_tensor *c = fg_tensor_new_on(d1, FG_BF16, 2, shape);
    CHECK_OK(fg_tensor_copy(a, h));
    CHECK_OK(fg_tensor_copy(b, a)); /* on one device */
    CHECK_OK(fg_tensor_copy(c, b)); /* across devices, staged */
    fg_tensor *out = fg_tensor_new(FG_BF16, 2, shape);
    CHECK_OK(fg_tensor_copy(out, c));
    CHECK(memcmp(fg_tensor_data(out), fg_tensor_data(h), fg_tensor_nbytes(h)) == 0);
    size_t n = fg_tensor_nbytes(h);
    fg_dev_memory_stats s0 = fg_dev_memory_stats_get(d0), s1 = fg_dev_memory_stats_get(d1);
    CHECK(s0.h2d_bytes == n && s0.d2d_bytes == n && s0.d2h_bytes == n);
    CHECK(s1.h2d_bytes == n && s1.d2h_bytes == n && s1.d2d_bytes == 0);
    /* a converting copy needs a kernel */
    fg_tensor *f = fg_tensor_new(FG_F32, 2, shape);
    CHECK_STATUS(fg_tensor_copy(f, a), FG_EUNSUPPORTED);
    CHECK_CONTAINS(fg_last_error(), "on guarded:0 into f32[4, 33] on the host");
    fg_tensor_free(f);
    fg_tensor_free(out);
    fg_tensor_free(a);
    fg_tensor_free(b);
    fg_tensor_free(c);
    fg_tensor_free(h);
    CHECK_OK(fg_dev_leak_check(d0));
    CHECK_OK(fg_dev_leak_check(d1));
    fg_dev_close(d0);
    fg_dev_close(d1);
}

TEST(host_read_of_a_device_tensor_faults) {
    fg_dev *d = guarded("guarded:0");
    if (!d) return;
    const int64_t shape[1] = {16};
    fg_tensor *t = fg_tensor_new_on(d, FG_F32, 1, shape);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL);
        volatile float *p = fg_tensor_data(t);
        float v = p[0]; /* the line a device-unclean layer would have */
        _exit(v == 0.0f ? 0 : 1);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, "status %#x", st);
    fg_tensor_free(t);
    fg_dev_close(d);
}

TEST(cpu_device_tensors_are_host_memory) {
    fg_dev *d = fg_dev_open("cpu", NULL);
    CHECK(d != NULL);
    if (!d) return;
    const int64_t shape[1] = {8};
    fg_tensor *t = fg_tensor_new_on(d, FG_F32, 1, shape);
    CHECK(t && fg_tensor_device(t) == FG_CPU && fg_tensor_dev(t) == d);
    CHECK_OK(fg_tensor_fill(t, 1.5)); /* host memory: the CPU kernels reach it */
    CHECK(fg_tensor_get(t, 7) == 1.5);
    fg_tensor *h = fg_tensor_to(t, NULL);
    CHECK(h && ((float *)fg_tensor_data(h))[3] == 1.5f);
    CHECK(fg_dev_memory_stats_get(d).allocated_bytes == 32);
    fg_tensor_free(h);
    fg_tensor_free(t);
    CHECK_OK(fg_dev_leak_check(d));
    fg_dev_close(d);
}

/* fg_step_device_set: step tensors (every op's output) live on the device,
 * fg_from_data copies host data in, fg_zeros and fg_full are the device's
 * own kernels, a mark and release rewinds the device arena too, and a
 * reset keeps one chunk: a second step takes nothing from the allocator. */
TEST(step_tensors_on_the_step_device) {
    fg_dev *d = guarded("guarded:0");
    if (!d) return;
    CHECK_OK(fg_step_device_set(d));
    CHECK(fg_step_device() == d);
    const float host[6] = {1, 2, 3, 4, 5, 6};
    uint64_t allocs = 0;
    for (int step = 0; step < 2; step++) {
        fg_tensor *a = fg_from_data(FG_F32, 2, (int64_t[]){2, 3}, host);
        CHECK(a && fg_tensor_dev(a) == d && fg_tensor_device(a) == FG_GUARDED);
        fg_tensor *z = fg_zeros(FG_F32, 1, (int64_t[]){1000});
        fg_tensor *f = fg_full(FG_BF16, 1, (int64_t[]){7}, 0.5);
        CHECK(z && f && fg_tensor_get(z, 999) == 0.0 && fg_tensor_get(f, 6) == 0.5);
        CHECK(fg_tensor_get(a, 5) == 6.0);
        fg_step_reset();
        if (step == 0) allocs = fg_dev_memory_stats_get(d).num_allocs;
    }
    CHECK(fg_dev_memory_stats_get(d).num_allocs == allocs);
    fg_tensor *keep = fg_zeros(FG_F32, 1, (int64_t[]){4});
    fg__arena_point m = fg__step_mark();
    fg_tensor *big = fg_empty(FG_F32, 1, (int64_t[]){3 << 20}); /* a chunk of its own */
    CHECK(big && fg_tensor_dev(big) == d);
    uint64_t live = fg_dev_memory_stats_get(d).active_allocs;
    fg__step_release(m);
    CHECK(fg_dev_memory_stats_get(d).active_allocs == live - 1);
    CHECK(keep && fg_tensor_get(keep, 3) == 0.0);
    fg_step_reset();
    CHECK_OK(fg_step_device_set(NULL));
    CHECK(fg_step_device() == NULL);
    fg_tensor *h = fg_zeros(FG_F32, 1, (int64_t[]){3});
    CHECK(h && fg_tensor_dev(h) == NULL);
    fg_step_reset();
    CHECK_OK(fg_dev_leak_check(d));
    fg_dev_close(d);
}
