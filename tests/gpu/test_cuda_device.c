/* layer: core. The CUDA device backend (src/core/device_cuda.c) and the
 * GPU listing (fg_gpu_list): without a GPU, or in a build without CUDA,
 * opening cuda:0 fails saying why and what to use, and the listing says
 * why it finds nothing; with one, the allocator, copies (pageable and
 * pinned, synchronous and on a stream), memset, events across the two
 * streams and the counters, on the GPU. */
#include <stdint.h>

#include "fulgur/device.h"
#include "fulgur/gpu.h"
#include "harness.h"

/* cuda:0, or NULL after printing why (the caller skips) */
static fg_dev *open_gpu(char *why, size_t n) {
    fg_dev *d = fg_dev_open("cuda:0", NULL);
    if (!d) snprintf(why, n, "%s", fg_last_error());
    return d;
}

TEST(no_gpu_is_a_clear_error) {
    fg_dev *d = fg_dev_open("cuda:0", NULL);
    if (d) {
        fg_dev_close(d);
        SKIP("cuda:0 opens on this machine");
    }
    CHECK(fg_last_status() == FG_EUNSUPPORTED);
    CHECK_CONTAINS(fg_last_error(), "cuda:0");
    if (fg_gpu_built()) {
        /* the runtime's own reason, named after the call that gave it */
        CHECK_CONTAINS(fg_last_error(), "no CUDA device: cudaGetDeviceCount: ");
    } else {
        CHECK_CONTAINS(fg_last_error(), "FULGUR_CUDA");
    }
    CHECK_CONTAINS(fg_last_error(), "guarded");
}

TEST(gpu_list_without_context) {
    fg_gpu_info g[16];
    int n = -1;
    fg_status s = fg_gpu_list(g, 16, &n);
    if (s != FG_OK) {
        CHECK(s == FG_EUNSUPPORTED);
        CHECK(n == 0);
        CHECK_CONTAINS(fg_last_error(), "no GPU: ");
        SKIP("%s", fg_last_error());
    }
    CHECK(n >= 1);
    for (int i = 0; i < n && i < 16; i++) {
        CHECK(g[i].index == i);
        CHECK(g[i].name[0] != 0);
        CHECK(g[i].memory_bytes > ((uint64_t)1 << 30));
        CHECK(g[i].cc_major >= 3);
        fprintf(stderr, "  GPU %d: %s, %.1f GiB, compute capability %d.%d\n", i, g[i].name,
                (double)g[i].memory_bytes / (1 << 30), g[i].cc_major, g[i].cc_minor);
    }
}

TEST(copies_memset_and_counters) {
    char why[512];
    fg_dev *d = open_gpu(why, sizeof why);
    if (!d) SKIP("%s", why);
    CHECK(!fg_dev_host_accessible(d) && fg_dev_kind(d) == FG_CUDA);
    enum { N = 1 << 20 };
    float *h = malloc(N * sizeof *h), *back = malloc(N * sizeof *back);
    for (int i = 0; i < N; i++) h[i] = (float)i * 0.5f;
    float *x = fg_dev_alloc(d, N * sizeof(float), NULL);
    float *y = fg_dev_alloc(d, N * sizeof(float), NULL);
    CHECK(x && y && ((uintptr_t)x % 512) == 0);
    CHECK_OK(fg_dev_copy_h2d(d, x, h, N * sizeof(float)));
    CHECK_OK(fg_dev_copy_d2d(d, y, x, N * sizeof(float)));
    CHECK_OK(fg_dev_copy_d2h(d, back, y, N * sizeof(float)));
    CHECK(memcmp(h, back, N * sizeof(float)) == 0);
    CHECK_OK(fg_dev_memset(d, y, 0, N * sizeof(float), NULL));
    CHECK_OK(fg_dev_copy_d2h(d, back, y, N * sizeof(float)));
    int zeros = 0;
    for (int i = 0; i < N; i++) zeros += back[i] == 0;
    CHECK(zeros == N);
    float pat = 1.5f;
    CHECK_OK(fg_dev_fill(d, y, &pat, sizeof pat, N - 1, NULL)); /* the last one stays 0 */
    CHECK_OK(fg_dev_copy_d2h(d, back, y, N * sizeof(float)));
    int ones = 0;
    for (int i = 0; i < N - 1; i++) ones += back[i] == 1.5f;
    CHECK(ones == N - 1 && back[N - 1] == 0);
    fg_dev_memory_stats st = fg_dev_memory_stats_get(d);
    CHECK(st.h2d_bytes == N * sizeof(float) && st.d2h_bytes == 3 * N * sizeof(float));
    CHECK(st.d2d_copies == 1 && st.active_allocs == 2);
    CHECK_OK(fg_dev_free(d, x));
    CHECK_OK(fg_dev_free(d, y));
    CHECK_OK(fg_dev_leak_check(d));
    free(h);
    free(back);
    fg_dev_close(d);
}

TEST(pinned_async_copies_ordered_by_events) {
    char why[512];
    fg_dev *d = open_gpu(why, sizeof why);
    if (!d) SKIP("%s", why);
    enum { N = 1 << 22 };
    float *h = fg_dev_host_alloc(d, N * sizeof(float));
    float *back = fg_dev_host_alloc(d, N * sizeof(float));
    CHECK(h && back);
    for (int i = 0; i < N; i++) h[i] = (float)(i % 1000);
    fg_stream *comm = fg_dev_stream(d, FG_STREAM_COMM), *comp = fg_dev_stream(d, FG_STREAM_COMPUTE);
    float *x = fg_dev_alloc(d, N * sizeof(float), comm);
    fg_event *e = fg_event_new(d);
    CHECK(x && e);
    CHECK(fg_event_query(e)); /* never recorded: complete */
    /* copy in on the comm stream, the compute stream waits, copies out */
    CHECK_OK(fg_dev_copy_h2d_async(d, x, h, N * sizeof(float), comm));
    CHECK_OK(fg_event_record(e, comm));
    CHECK_OK(fg_stream_wait_event(comp, e));
    CHECK_OK(fg_dev_copy_d2h_async(d, back, x, N * sizeof(float), comp));
    CHECK_OK(fg_stream_synchronize(comp));
    CHECK(fg_event_query(e));
    CHECK(memcmp(h, back, N * sizeof(float)) == 0);
    CHECK_OK(fg_event_synchronize(e));
    fg_event_free(e);
    CHECK_OK(fg_dev_free(d, x));
    fg_dev_host_free(d, h);
    fg_dev_host_free(d, back);
    fg_dev_close(d);
}

TEST(out_of_memory_is_an_error_not_a_crash) {
    char why[512];
    fg_dev *d = open_gpu(why, sizeof why);
    if (!d) SKIP("%s", why);
    void *p = fg_dev_alloc(d, (size_t)1 << 50, NULL); /* 1 PiB */
    CHECK(p == NULL);
    CHECK(fg_last_status() == FG_ENOMEM);
    CHECK_CONTAINS(fg_last_error(), "cuda:0");
    /* the device still works */
    void *q = fg_dev_alloc(d, 4096, NULL);
    CHECK(q != NULL);
    CHECK_OK(fg_dev_free(d, q));
    fg_dev_close(d);
}

TEST(device_count_makes_no_context) {
    char why[512];
    int n = fg_device_count(FG_CUDA, why, sizeof why);
    fg_gpu_info g[16];
    int listed = 0;
    if (fg_gpu_list(g, 16, &listed) != FG_OK) {
        CHECK(n == 0);
        CHECK_CONTAINS(why, fg_gpu_built() ? "no GPU: " : "no CUDA backend");
        fprintf(stderr, "  (0 GPUs: %s)\n", why);
        return;
    }
    if (!fg_gpu_built()) {
        CHECK(n == 0);
        CHECK_CONTAINS(why, "no CUDA backend");
        return;
    }
    if (n == 0) { /* NVML sees a GPU that CUDA cannot use (a driver too old) */
        CHECK_CONTAINS(why, "no CUDA device: cudaGetDeviceCount: ");
        return;
    }
    CHECK(n == listed);
    /* CUDA_VISIBLE_DEVICES as CUDA reads it: up to the first bad entry */
    const char *old = getenv("CUDA_VISIBLE_DEVICES");
    char keep[256] = "";
    if (old) snprintf(keep, sizeof keep, "%s", old);
    setenv("CUDA_VISIBLE_DEVICES", "0", 1);
    CHECK(fg_device_count(FG_CUDA, why, sizeof why) == 1);
    setenv("CUDA_VISIBLE_DEVICES", "0,9999,0", 1);
    CHECK(fg_device_count(FG_CUDA, why, sizeof why) == 1);
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    CHECK(fg_device_count(FG_CUDA, why, sizeof why) == 0);
    CHECK_CONTAINS(why, "CUDA_VISIBLE_DEVICES");
    if (old) setenv("CUDA_VISIBLE_DEVICES", keep, 1);
    else unsetenv("CUDA_VISIBLE_DEVICES");
}
