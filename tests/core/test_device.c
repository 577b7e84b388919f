/* The device model: names, the caching allocator's reuse, stats,
 * fragmentation bound, out-of-memory message and leak check, the guarded
 * device's fault on host access and counted copies, streams and events. */
#include <pthread.h>
#include <setjmp.h>
#include <stdint.h>
#include <sys/wait.h>

#include "fulgur/device.h"
#include "fulgur/gpu.h"
#include "harness.h"

#define CHECK_STR_EQ(a, b)                                                                         \
    do {                                                                                           \
        const char *a_ = (a), *b_ = (b);                                                           \
        if (strcmp(a_, b_) != 0) FG_FAIL_("\"%s\" != \"%s\"", a_, b_);                             \
    } while (0)

#define MiB ((size_t)1 << 20)

static fg_dev *open_guarded(size_t limit) {
    fg_dev_options o = {.memory_limit = limit};
    fg_dev *d = fg_dev_open("guarded:0", &o);
    CHECK_MSG(d != NULL, "open guarded:0: %s", fg_last_error());
    return d;
}

TEST(names_parse_and_format_round_trip) {
    static const char *const good[] = {"cpu",    "cpu:0",   "CPU",       "cuda",       "cuda:1",
                                       "Cuda:7", "guarded", "guarded:0", "guarded:12", "cuda:1023"};
    static const char *const canon[] = {"cpu",        "cpu",      "cpu",       "cuda:0",
                                        "cuda:1",     "cuda:7",   "guarded:0", "guarded:0",
                                        "guarded:12", "cuda:1023"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        fg_device_id id = {FG_CPU, -1};
        CHECK_OK(fg_device_parse(good[i], &id));
        char buf[FG_DEVICE_NAME_MAX];
        CHECK_STR_EQ(fg_device_format(id, buf, sizeof buf), canon[i]);
        fg_device_id back;
        CHECK_OK(fg_device_parse(buf, &back));
        CHECK(back.kind == id.kind && back.index == id.index);
    }
    fg_device_id id;
    CHECK_OK(fg_device_parse("cuda:3", &id));
    CHECK(id.kind == FG_CUDA && id.index == 3);
    CHECK_STR_EQ(fg_device_kind_name(FG_GUARDED), "guarded");
    char buf[FG_DEVICE_NAME_MAX];
    CHECK_STR_EQ(fg_device_format((fg_device_id){FG_CPU, 2}, buf, sizeof buf), "?");
    CHECK_STR_EQ(fg_device_format((fg_device_id){FG_CUDA, -1}, buf, sizeof buf), "?");
}

TEST(bad_names_say_what_is_wrong) {
    fg_device_id id;
    struct {
        const char *name, *says;
    } bad[] = {
        {"", "empty name"},
        {NULL, "empty name"},
        {"tpu:0", "'tpu:0': unknown kind"},
        {"cuda:", "no index after ':'"},
        {"cuda:-1", "not a number"},
        {"cuda:1x", "not a number"},
        {"cuda: 1", "not a number"},
        {"cuda:1024", "index past 1023"},
        {"cuda:99999999999999999999", "index past 1023"},
        {"cpu:1", "the CPU is one device"},
        {"gpu", "expected cpu, cuda[:N] or guarded[:N]"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK_STATUS(fg_device_parse(bad[i].name, &id), FG_EINVAL);
        CHECK_CONTAINS(fg_last_error(), bad[i].says);
    }
    CHECK(fg_dev_open("tpu", NULL) == NULL);
    CHECK(fg_last_status() == FG_EINVAL);
}

TEST(cuda_without_the_backend_says_what_to_use) {
    fg_dev *d = fg_dev_open("cuda:0", NULL);
    if (d && fg_gpu_built()) {
        fg_dev_close(d);
        SKIP("cuda:0 opens: this build has the CUDA backend and the machine a GPU");
    }
    CHECK(d == NULL);
    CHECK(fg_last_status() == FG_EUNSUPPORTED);
    CHECK_CONTAINS(fg_last_error(), "cuda:0");
    /* a build with the CUDA backend on a machine without a GPU says that
     * instead (tests/gpu/test_cuda_device.c) */
    CHECK_CONTAINS(fg_last_error(), fg_gpu_built() ? "no CUDA device" : "FULGUR_CUDA");
    CHECK_CONTAINS(fg_last_error(), "guarded");
}

TEST(cpu_device_counts_without_a_cache) {
    fg_dev *d = fg_dev_open("cpu", NULL);
    CHECK(d && fg_dev_host_accessible(d) && fg_dev_kind(d) == FG_CPU);
    CHECK_STR_EQ(fg_dev_name(d), "cpu");
    float *p = fg_dev_alloc(d, 100 * sizeof(float), NULL);
    CHECK(p && ((uintptr_t)p % 64) == 0);
    p[99] = 3.0f; /* host memory: the host may touch it */
    float src[100], dst[100];
    for (int i = 0; i < 100; i++) src[i] = (float)i * 0.5f;
    CHECK_OK(fg_dev_copy_h2d(d, p, src, sizeof src));
    CHECK_OK(fg_dev_copy_d2h(d, dst, p, sizeof dst));
    CHECK(memcmp(src, dst, sizeof src) == 0);
    fg_dev_memory_stats s = fg_dev_memory_stats_get(d);
    CHECK(s.allocated_bytes == 400 && s.reserved_bytes == 400 && s.active_allocs == 1);
    CHECK(s.h2d_bytes == 400 && s.d2h_bytes == 400 && s.h2d_copies == 1);
    CHECK_OK(fg_dev_free(d, p));
    s = fg_dev_memory_stats_get(d);
    CHECK(s.allocated_bytes == 0 && s.reserved_bytes == 0 && s.num_frees == 1 &&
          s.cache_hits == 0 && s.allocated_bytes_peak == 400);
    CHECK_OK(fg_dev_leak_check(d));
    fg_dev_close(d);
}

TEST(allocator_reuses_blocks_per_stream) {
    fg_dev *d = open_guarded(0);
    if (!d) return;
    fg_stream *comp = fg_dev_stream(d, FG_STREAM_COMPUTE), *comm = fg_dev_stream(d, FG_STREAM_COMM);
    CHECK(comp != comm && fg_stream_dev(comm) == d);
    void *a = fg_dev_alloc(d, 1000, NULL);
    CHECK(a && ((uintptr_t)a % 512) == 0);
    fg_dev_memory_stats s = fg_dev_memory_stats_get(d);
    CHECK(s.allocated_bytes == 1024 && s.requested_bytes == 1000);
    CHECK(s.reserved_bytes == 2 * MiB && s.segment_allocs == 1 && s.cache_hits == 0);
    CHECK_OK(fg_dev_free(d, a));
    void *b = fg_dev_alloc(d, 900, comp);
    CHECK(b == a); /* same stream: the cached block comes back */
    s = fg_dev_memory_stats_get(d);
    CHECK(s.cache_hits == 1 && s.segment_allocs == 1 && s.num_allocs == 2 && s.num_frees == 1);
    CHECK_OK(fg_dev_free(d, b));
    void *c = fg_dev_alloc(d, 900, comm);
    CHECK(c && c != a); /* another stream: a segment of its own */
    s = fg_dev_memory_stats_get(d);
    CHECK(s.segment_allocs == 2 && s.reserved_bytes == 4 * MiB && s.cache_hits == 1);
    CHECK_OK(fg_dev_free(d, c));
    /* freed neighbours merge: two blocks freed give one 2 MiB block back */
    void *x = fg_dev_alloc(d, MiB, NULL), *y = fg_dev_alloc(d, MiB, NULL);
    CHECK(x && y && x != y);
    CHECK_OK(fg_dev_free(d, x));
    CHECK_OK(fg_dev_free(d, y));
    fg_dev_empty_cache(d);
    s = fg_dev_memory_stats_get(d);
    CHECK(s.reserved_bytes == 0 && s.allocated_bytes == 0 && s.segment_frees == 2);
    CHECK(s.reserved_bytes_peak == 4 * MiB);
    fg_dev_reset_peak_stats(d);
    CHECK(fg_dev_memory_stats_get(d).reserved_bytes_peak == 0);
    /* a bad free is an error, not a crash */
    int host;
    CHECK_STATUS(fg_dev_free(d, &host), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "not a live allocation");
    void *z = fg_dev_alloc(d, 64, NULL);
    CHECK_OK(fg_dev_free(d, z));
    CHECK_STATUS(fg_dev_free(d, z), FG_EINVAL);
    /* zero bytes: a unique pointer */
    void *e0 = fg_dev_alloc(d, 0, NULL), *e1 = fg_dev_alloc(d, 0, NULL);
    CHECK(e0 && e1 && e0 != e1);
    CHECK_OK(fg_dev_free(d, e0));
    CHECK_OK(fg_dev_free(d, e1));
    CHECK_OK(fg_dev_leak_check(d));
    fg_dev_close(d);
}

TEST(allocator_bounds_fragmentation) {
    fg_dev_options o = {.max_split_bytes = 32 * MiB, .oversize_cache_bytes = 40 * MiB};
    fg_dev *d = fg_dev_open("guarded:1", &o);
    CHECK(d != NULL);
    if (!d) return;
    /* a 3 MiB request takes a 20 MiB segment and splits: the 17 MiB left is useful */
    void *a = fg_dev_alloc(d, 3 * MiB, NULL);
    fg_dev_memory_stats s = fg_dev_memory_stats_get(d);
    CHECK(s.reserved_bytes == 20 * MiB && s.allocated_bytes == 3 * MiB);
    CHECK(s.inactive_split_bytes == 17 * MiB);
    /* a request that leaves 1 MiB or less is not split: the block wastes < 1 MiB */
    void *b = fg_dev_alloc(d, 16 * MiB + 512, NULL);
    s = fg_dev_memory_stats_get(d);
    CHECK(s.segment_allocs == 1 && s.cache_hits == 1);
    CHECK(s.allocated_bytes == 20 * MiB && s.inactive_split_bytes == 0);
    CHECK(s.allocated_bytes - s.requested_bytes < MiB);
    CHECK_OK(fg_dev_free(d, a));
    CHECK_OK(fg_dev_free(d, b));
    s = fg_dev_memory_stats_get(d);
    CHECK(s.inactive_split_bytes == 0 && s.reserved_bytes == 20 * MiB); /* merged whole */
    /* oversize requests: a segment each, never split, cached up to 40 MiB */
    void *o1 = fg_dev_alloc(d, 33 * MiB, NULL), *o2 = fg_dev_alloc(d, 33 * MiB, NULL);
    s = fg_dev_memory_stats_get(d);
    CHECK(s.reserved_bytes == 20 * MiB + 2 * 34 * MiB);
    CHECK(s.allocated_bytes == 2 * 34 * MiB); /* rounded to 2 MiB, never split */
    CHECK_OK(fg_dev_free(d, o1));
    CHECK_OK(fg_dev_free(d, o2)); /* past the oversize cache: given back at once */
    s = fg_dev_memory_stats_get(d);
    CHECK(s.reserved_bytes == 20 * MiB + 34 * MiB);
    /* a small request never takes the cached oversize block */
    void *c = fg_dev_alloc(d, 2 * MiB, NULL);
    s = fg_dev_memory_stats_get(d);
    CHECK(s.reserved_bytes == 20 * MiB + 34 * MiB && s.cache_hits == 2);
    void *o3 = fg_dev_alloc(d, 34 * MiB, NULL); /* the oversize block comes back */
    s = fg_dev_memory_stats_get(d);
    CHECK(s.cache_hits == 3 && s.reserved_bytes == 20 * MiB + 34 * MiB);
    CHECK_OK(fg_dev_free(d, c));
    CHECK_OK(fg_dev_free(d, o3));
    CHECK_OK(fg_dev_leak_check(d));
    fg_dev_close(d);
}

TEST(out_of_memory_names_request_limit_peak_and_largest) {
    fg_dev *d = open_guarded(24 * MiB);
    if (!d) return;
    CHECK(fg_dev_memory_stats_get(d).memory_limit == 24 * MiB);
    void *a = fg_dev_alloc(d, 12 * MiB, NULL); /* own 12 MiB segment */
    void *b = fg_dev_alloc(d, 6 * MiB, NULL);  /* 20 MiB won't fit: a 6 MiB segment */
    CHECK(a && b);
    void *small = fg_dev_alloc(d, 1000, NULL); /* a 2 MiB small segment */
    CHECK(small != NULL);
    CHECK(fg_dev_memory_stats_get(d).reserved_bytes == 20 * MiB);
    void *c = fg_dev_alloc(d, 5 * MiB, NULL);
    CHECK(c == NULL);
    CHECK(fg_last_status() == FG_ENOMEM);
    const char *m = fg_last_error();
    CHECK_CONTAINS(m, "device guarded:0: out of memory");
    CHECK_CONTAINS(m, "5.00 MiB (5242880 bytes) for the compute stream");
    CHECK_CONTAINS(m, "limit 24.00 MiB, 20.00 MiB reserved");
    CHECK_CONTAINS(m, "peak 18.00 MiB allocated");
    CHECK_CONTAINS(m, "3 allocations");
    CHECK_CONTAINS(m, "the largest 12.00 MiB, 6.00 MiB, 1000 bytes");
    CHECK_CONTAINS(m, "FULGUR_DEVICE_MEMORY_LIMIT");
    CHECK(fg_dev_memory_stats_get(d).num_ooms == 1);
    /* cached free segments go back before an out-of-memory is declared */
    CHECK_OK(fg_dev_free(d, b));
    c = fg_dev_alloc(d, 9 * MiB, NULL);
    CHECK_MSG(c != NULL, "%s", fg_last_error());
    CHECK_OK(fg_dev_free(d, a));
    CHECK_OK(fg_dev_free(d, c));
    CHECK_OK(fg_dev_free(d, small));
    fg_dev_close(d);
}

TEST(memory_limit_from_the_environment) {
    setenv("FULGUR_DEVICE_MEMORY_LIMIT", "16M", 1);
    fg_dev *d = fg_dev_open("guarded:0", NULL);
    CHECK(d && fg_dev_memory_stats_get(d).memory_limit == 16 * MiB);
    CHECK(fg_dev_alloc(d, 20 * MiB, NULL) == NULL);
    CHECK_CONTAINS(fg_last_error(), "limit 16.00 MiB");
    fg_dev_close(d);
    setenv("FULGUR_DEVICE_MEMORY_LIMIT", "lots", 1);
    CHECK(fg_dev_open("guarded:0", NULL) == NULL);
    CHECK_CONTAINS(fg_last_error(), "FULGUR_DEVICE_MEMORY_LIMIT=lots");
    setenv("FULGUR_DEVICE_MEMORY_LIMIT", "2GiB", 1);
    d = fg_dev_open("cpu", NULL);
    CHECK(d && fg_dev_memory_stats_get(d).memory_limit == ((size_t)2 << 30));
    fg_dev_close(d);
    unsetenv("FULGUR_DEVICE_MEMORY_LIMIT");
}

TEST(leak_check_counts_what_is_live) {
    fg_dev *d = open_guarded(0);
    if (!d) return;
    void *a = fg_dev_alloc(d, 1024, NULL), *b = fg_dev_alloc(d, 512, NULL);
    CHECK_STATUS(fg_dev_leak_check(d), FG_ESTATE);
    CHECK_CONTAINS(fg_last_error(), "device guarded:0: 2 allocations (1.50 KiB) still live");
    CHECK_CONTAINS(fg_last_error(), "the largest 1.00 KiB, 512 bytes");
    CHECK_OK(fg_dev_free(d, a));
    CHECK_STATUS(fg_dev_leak_check(d), FG_ESTATE);
    CHECK_CONTAINS(fg_last_error(), "1 allocation (512 bytes) still live");
    CHECK_OK(fg_dev_free(d, b));
    CHECK_OK(fg_dev_leak_check(d));
    fg_dev_close(d);
}

/* Runs fn(p) in a child process; the child's fate as waitpid saw it. */
static int child_status(void (*fn)(volatile float *), volatile float *p) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL); /* a sanitizer's handler would exit instead */
        fn(p);
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return st;
}

static void host_read(volatile float *p) {
    float v = p[3];
    (void)v;
}
static void host_write(volatile float *p) { p[0] = 1.0f; }

static void *volatile g_expect_addr; /* a volatile pointer: stored before the read */
static void on_segv(int sig, siginfo_t *si, void *ctx) {
    (void)sig;
    (void)ctx;
    _exit(si->si_addr == g_expect_addr ? 42 : 43);
}

static void host_read_reports_address(volatile float *p) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, NULL);
    g_expect_addr = (void *)(p + 5);
    float v = p[5];
    (void)v;
}

/* In this process: the fault is caught, its address and code kept, and the
 * test goes on (a forked child has no mapping there at all: MADV_DONTFORK). */
static sigjmp_buf g_jmp;
static void *volatile g_fault_addr;
static volatile int g_fault_code;
static void on_segv_jump(int sig, siginfo_t *si, void *ctx) {
    (void)sig;
    (void)ctx;
    g_fault_addr = si->si_addr;
    g_fault_code = si->si_code;
    siglongjmp(g_jmp, 1);
}

TEST(guarded_memory_is_mapped_without_access) {
    fg_dev *d = open_guarded(0);
    if (!d) return;
    volatile float *p = fg_dev_alloc(d, 64 * sizeof(float), NULL);
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv_jump;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, &old);
    g_fault_addr = NULL;
    int faulted = 0;
    if (sigsetjmp(g_jmp, 1) == 0) {
        float v = p[7];
        (void)v;
    } else {
        faulted = 1;
    }
    sigaction(SIGSEGV, &old, NULL);
    CHECK(faulted);
    CHECK(g_fault_addr == (void *)(p + 7));
    CHECK_MSG(g_fault_code == SEGV_ACCERR, "si_code %d (SEGV_ACCERR: mapped, no access)",
              g_fault_code);
    CHECK_OK(fg_dev_free(d, (void *)p));
    fg_dev_close(d);
}

TEST(guarded_memory_faults_on_host_access) {
    fg_dev *d = open_guarded(0);
    if (!d) return;
    CHECK(!fg_dev_host_accessible(d));
    float *p = fg_dev_alloc(d, 64 * sizeof(float), NULL);
    CHECK(p != NULL);
    float ones[64];
    for (int i = 0; i < 64; i++) ones[i] = 1.0f;
    CHECK_OK(fg_dev_copy_h2d(d, p, ones, sizeof ones)); /* the copy call reaches it */
    int st = child_status(host_read, p);
    CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, "host read: status %#x", st);
    st = child_status(host_write, p);
    CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, "host write: status %#x", st);
    /* the fault is at the address the line read, not somewhere later */
    st = child_status(host_read_reports_address, p);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 42, "fault address: status %#x", st);
    /* a pointer inside a block, or past the allocator's, faults the same */
    st = child_status(host_read, p + 1000);
    CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, "past the block: status %#x", st);
    /* and the memory is intact */
    float back[64];
    CHECK_OK(fg_dev_copy_d2h(d, back, p, sizeof back));
    CHECK(memcmp(back, ones, sizeof ones) == 0);
    CHECK_OK(fg_dev_free(d, p));
    fg_dev_close(d);
}

TEST(guarded_copies_round_trip_and_are_counted) {
    fg_dev *d = open_guarded(0);
    if (!d) return;
    enum { N = 10000 };
    static uint32_t src[N], dst[N];
    for (int i = 0; i < N; i++) src[i] = fg_rng_u32_at(7, (uint64_t)i);
    uint32_t *a = fg_dev_alloc(d, sizeof src, NULL), *b = fg_dev_alloc(d, sizeof src, NULL);
    CHECK(a && b);
    CHECK_OK(fg_dev_copy_h2d(d, a, src, sizeof src));
    CHECK_OK(fg_dev_copy_d2d(d, b, a, sizeof src));
    CHECK_OK(fg_dev_memset(d, a, 0, sizeof src, NULL));
    CHECK_OK(fg_dev_copy_d2h(d, dst, b, sizeof dst));
    CHECK(memcmp(src, dst, sizeof src) == 0);
    CHECK_OK(fg_dev_copy_d2h(d, dst, a, sizeof dst));
    CHECK(dst[0] == 0 && dst[N - 1] == 0);
    /* a part of a block: element 100..199 */
    uint32_t part[100];
    CHECK_OK(fg_dev_copy_d2h(d, part, b + 100, sizeof part));
    CHECK(memcmp(part, src + 100, sizeof part) == 0);
    fg_dev_memory_stats s = fg_dev_memory_stats_get(d);
    CHECK(s.h2d_bytes == sizeof src && s.h2d_copies == 1);
    CHECK(s.d2d_bytes == sizeof src && s.d2d_copies == 1);
    CHECK(s.d2h_bytes == 2 * sizeof src + sizeof part && s.d2h_copies == 3);
    char sum[512];
    CHECK_CONTAINS(fg_dev_memory_summary(d, sum, sizeof sum), "copied host->device 39.06 KiB");
    /* ranges outside one live allocation, and host pointers, are refused */
    CHECK_STATUS(fg_dev_copy_d2h(d, dst, b + 1, sizeof src), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "not inside one live allocation");
    CHECK_STATUS(fg_dev_copy_h2d(d, src, dst, sizeof src), FG_EINVAL); /* dst a host pointer */
    CHECK_CONTAINS(fg_last_error(), "copy_h2d destination");
    CHECK(fg_dev_memory_stats_get(d).d2h_copies == 3); /* refused copies are not counted */
    fg_dev_reset_copy_stats(d);
    CHECK(fg_dev_memory_stats_get(d).h2d_bytes == 0);
    CHECK_OK(fg_dev_free(d, a));
    CHECK_STATUS(fg_dev_copy_d2h(d, dst, a, 4), FG_EINVAL); /* freed */
    CHECK_OK(fg_dev_free(d, b));
    fg_dev_close(d);
}

/* RssShmem of this process in KiB (the guarded device's pages are a
 * memfd's), or -1 where /proc does not say. */
static long rss_shmem_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long v = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "RssShmem: %ld kB", &v) == 1) break;
    fclose(f);
    return v;
}

TEST(guarded_discard_gives_pages_back_and_reads_zero) {
    fg_dev *d = open_guarded(0);
    if (!d) return;
    enum { N = 2 << 20 }; /* 8 MiB of u32 */
    uint32_t *src = malloc(N * sizeof *src), *dst = malloc(N * sizeof *dst);
    CHECK(src && dst);
    for (int i = 0; i < N; i++) src[i] = (uint32_t)i | 1u;
    uint32_t *a = fg_dev_alloc(d, (size_t)N * 4, NULL);
    CHECK(a != NULL);
    CHECK_OK(fg_dev_copy_h2d(d, a, src, (size_t)N * 4));
    long before = rss_shmem_kib();
    /* elements [3, N - 5) with zero: all of it reads zero after, the ends kept */
    size_t given = 0;
    CHECK_OK(fg_dev_discard(d, a + 3, (size_t)(N - 8) * 4, true, &given));
    CHECK(given >= (size_t)(N - 2048) * 4 && given <= (size_t)(N - 8) * 4);
    CHECK(fg_dev_memory_stats_get(d).discarded_bytes == given);
    long after = rss_shmem_kib();
    if (before >= 0 && after >= 0) CHECK(before - after >= (long)(given / 1024) - 64);
    CHECK_OK(fg_dev_copy_d2h(d, dst, a, (size_t)N * 4));
    int bad = 0;
    for (int i = 0; i < N; i++) bad += dst[i] != (i < 3 || i >= N - 5 ? src[i] : 0);
    CHECK(bad == 0);
    /* without zero: only whole pages go; the partial pages at the ends keep
     * their bytes (a neighbour's) */
    CHECK_OK(fg_dev_copy_h2d(d, a, src, (size_t)N * 4));
    CHECK_OK(fg_dev_discard(d, a + 100, 5000 * 4, false, &given));
    /* the whole 4 KiB pages of device addresses inside bytes [400, 20400) */
    uintptr_t p0 = ((uintptr_t)(a + 100) + 4095) & ~(uintptr_t)4095;
    uintptr_t p1 = (uintptr_t)(a + 5100) & ~(uintptr_t)4095;
    CHECK(given == p1 - p0 && given >= 3 * 4096);
    CHECK_OK(fg_dev_copy_d2h(d, dst, a, 6000 * 4));
    int bad2 = 0;
    for (int i = 0; i < 6000; i++) {
        bool gone = (uintptr_t)(a + i) >= p0 && (uintptr_t)(a + i) < p1;
        bad2 += dst[i] != (gone ? 0 : src[i]);
    }
    CHECK(bad2 == 0);
    /* outside a live allocation: refused, nothing given back */
    CHECK_STATUS(fg_dev_discard(d, src, 4096, true, &given), FG_EINVAL);
    CHECK(given == 0);
    CHECK_OK(fg_dev_free(d, a));
    free(src);
    free(dst);
    fg_dev_close(d);
}

TEST(streams_and_events_keep_order) {
    fg_dev *d = open_guarded(0);
    fg_dev *d2 = fg_dev_open("guarded:1", NULL);
    if (!d || !d2) return;
    fg_stream *comp = fg_dev_stream(d, FG_STREAM_COMPUTE), *comm = fg_dev_stream(d, FG_STREAM_COMM);
    fg_event *e = fg_event_new(d);
    CHECK(e && fg_event_query(e) && fg_event_stream(e) == NULL); /* never recorded: complete */
    CHECK_OK(fg_event_synchronize(e));
    float *buf = fg_dev_host_alloc(d, 256 * sizeof(float));
    for (int i = 0; i < 256; i++) buf[i] = (float)i;
    float *x = fg_dev_alloc(d, 256 * sizeof(float), comm);
    uint64_t w0 = fg_stream_work_count(comm);
    CHECK_OK(fg_dev_copy_h2d_async(d, x, buf, 256 * sizeof(float), comm));
    CHECK(fg_stream_work_count(comm) == w0 + 1);
    CHECK_OK(fg_event_record(e, comm));
    CHECK(fg_event_stream(e) == comm && fg_event_point(e) == w0 + 1);
    CHECK(fg_event_query(e));
    uint64_t c0 = fg_stream_work_count(comp);
    CHECK_OK(fg_stream_wait_event(comp, e));
    CHECK(fg_stream_work_count(comp) == c0 + 1);
    float out[256];
    CHECK_OK(fg_dev_copy_d2h_async(d, out, x, sizeof out, comp));
    CHECK_OK(fg_stream_synchronize(comp));
    CHECK(memcmp(out, buf, sizeof out) == 0);
    CHECK_OK(fg_dev_synchronize(d));
    /* across devices: refused */
    CHECK_STATUS(fg_stream_wait_event(fg_dev_stream(d2, FG_STREAM_COMPUTE), e), FG_EINVAL);
    CHECK_STATUS(fg_event_record(e, fg_dev_stream(d2, FG_STREAM_COMM)), FG_EINVAL);
    CHECK_STATUS(fg_dev_copy_h2d_async(d, x, buf, 4, fg_dev_stream(d2, FG_STREAM_COMM)), FG_EINVAL);
    CHECK(fg_dev_alloc(d, 16, fg_dev_stream(d2, FG_STREAM_COMM)) == NULL);
    fg_event_free(e);
    fg_dev_host_free(d, buf);
    CHECK_OK(fg_dev_free(d, x));
    fg_dev_close(d);
    fg_dev_close(d2);
}

typedef struct churn {
    fg_dev *d;
    uint64_t seed;
} churn;

static void *alloc_churn(void *arg) {
    fg_dev *d = ((churn *)arg)->d;
    uint64_t seed = ((churn *)arg)->seed;
    void *held[16] = {0};
    for (int i = 0; i < 2000; i++) {
        int k = (int)(fg_rng_u32_at(seed, (uint64_t)i) % 16);
        if (held[k]) {
            if (fg_dev_free(d, held[k]) != FG_OK) return (void *)1;
            held[k] = NULL;
        } else {
            held[k] = fg_dev_alloc(d, (size_t)(k + 1) * 3000, NULL);
            if (!held[k]) return (void *)1;
        }
    }
    for (int k = 0; k < 16; k++)
        if (held[k] && fg_dev_free(d, held[k]) != FG_OK) return (void *)1;
    return NULL;
}

TEST(allocator_is_thread_safe) {
    fg_dev *d = open_guarded(0);
    if (!d) return;
    pthread_t th[4];
    churn arg[4];
    for (int i = 0; i < 4; i++) {
        arg[i] = (churn){d, (uint64_t)i + 1};
        pthread_create(&th[i], NULL, alloc_churn, &arg[i]);
    }
    int bad = 0;
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(th[i], &r);
        bad += r != NULL;
    }
    CHECK(bad == 0);
    fg_dev_memory_stats s = fg_dev_memory_stats_get(d);
    CHECK(s.num_allocs == s.num_frees && s.allocated_bytes == 0 && s.active_allocs == 0);
    CHECK(s.cache_hits > 0);
    CHECK_OK(fg_dev_leak_check(d));
    fg_dev_close(d);
}

static char g_logged[512];
static void keep_log(void *ud, fg_log_level level, int rank, const char *msg) {
    (void)ud;
    (void)rank;
    if (level == FG_LOG_WARN) snprintf(g_logged, sizeof g_logged, "%s", msg);
}

TEST(close_with_live_memory_logs_the_leak) {
    fg_dev *d = open_guarded(0);
    if (!d) return;
    CHECK(fg_dev_alloc(d, 3000, NULL) != NULL);
    g_logged[0] = 0;
    fg_set_log(keep_log, NULL, FG_LOG_WARN);
    fg_dev_close(d); /* releases the block too: LeakSanitizer sees no leak */
    fg_set_log(NULL, NULL, FG_LOG_INFO);
    CHECK_CONTAINS(g_logged, "device guarded:0 closed with 1 allocation (2.93 KiB) still live");
}

TEST(device_step_arena_keeps_one_chunk) {
    fg_dev *d = open_guarded(40 * MiB);
    if (!d) return;
    fg_dev_arena *a = fg_dev_arena_new(d, MiB);
    CHECK(a != NULL);
    /* a step in four chunks: 1 MiB (p0, p1), 1 MiB (p2), 3 MiB (p3, oversized), 1 MiB (p4) */
    char *p[5];
    p[0] = fg_dev_arena_alloc(a, 600 << 10);
    p[1] = fg_dev_arena_alloc(a, 300 << 10);
    p[2] = fg_dev_arena_alloc(a, 200 << 10); /* past the first chunk */
    p[3] = fg_dev_arena_alloc(a, 3 * MiB);   /* a chunk of its own */
    p[4] = fg_dev_arena_alloc(a, 1);
    for (int i = 0; i < 5; i++) CHECK(p[i] && ((uintptr_t)p[i] % 512) == 0);
    CHECK(p[1] == p[0] + (600 << 10)); /* bumped within the chunk */
    CHECK(fg_dev_arena_used(a) == (600 << 10) + (300 << 10) + (200 << 10) + 3 * MiB + 512);
    CHECK(fg_dev_memory_stats_get(d).active_allocs == 4);
    /* the copy calls take ranges inside the arena's chunks */
    uint32_t in[256], out[256];
    for (int i = 0; i < 256; i++) in[i] = (uint32_t)i * 2654435761u;
    CHECK_OK(fg_dev_copy_h2d(d, p[1] + 512, in, sizeof in));
    CHECK_OK(fg_dev_copy_d2h(d, out, p[1] + 512, sizeof out));
    CHECK(memcmp(in, out, sizeof in) == 0);
    size_t step = fg_dev_arena_used(a);
    fg_dev_arena_reset(a);
    CHECK(fg_dev_arena_used(a) == 0 && fg_dev_arena_peak(a) == step);
    fg_dev_memory_stats s = fg_dev_memory_stats_get(d);
    CHECK(s.active_allocs == 1); /* one chunk as large as the step's four */
    CHECK(s.requested_bytes == 6 * MiB);
    /* the next step fits it: nothing more is allocated */
    uint64_t allocs = s.num_allocs;
    CHECK(fg_dev_arena_alloc(a, 600 << 10) && fg_dev_arena_alloc(a, 3 * MiB));
    CHECK(fg_dev_memory_stats_get(d).num_allocs == allocs);
    fg_dev_arena_reset(a);
    CHECK(fg_dev_memory_stats_get(d).num_allocs == allocs);
    /* an out-of-memory comes back with the allocator's message */
    CHECK(fg_dev_arena_alloc(a, 64 * MiB) == NULL);
    CHECK(fg_last_status() == FG_ENOMEM);
    CHECK_CONTAINS(fg_last_error(), "step arena: device guarded:0: out of memory");
    fg_dev_arena_free(a);
    CHECK_OK(fg_dev_leak_check(d));
    fg_dev_close(d);
}

TEST(a_forked_child_cannot_use_the_parents_device) {
    fg_dev *d = open_guarded(0);
    if (!d) return;
    uint32_t v = 0xC0FFEEu, back = 0;
    uint32_t *p = fg_dev_alloc(d, sizeof v, NULL);
    CHECK_OK(fg_dev_copy_h2d(d, p, &v, sizeof v));
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        uint32_t x = 1;
        int ok = fg_dev_copy_h2d(d, p, &x, sizeof x) == FG_ESTATE &&
                 strstr(fg_last_error(), "before this process forked from it") &&
                 fg_dev_alloc(d, 64, NULL) == NULL && fg_last_status() == FG_ESTATE;
        fg_dev_close(d); /* frees the child's bookkeeping, not the parent's memory */
        _exit(ok ? 0 : 1);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %#x", st);
    CHECK_OK(fg_dev_copy_d2h(d, &back, p, sizeof back));
    CHECK(back == 0xC0FFEEu); /* the parent's memory is intact */
    CHECK_OK(fg_dev_free(d, p));
    fg_dev_close(d);
}

TEST(no_cache_gives_every_freed_segment_back) {
    fg_dev_options o = {.no_cache = true};
    fg_dev *d = fg_dev_open("guarded:0", &o);
    CHECK(d != NULL);
    if (!d) return;
    void *a = fg_dev_alloc(d, 1000, NULL), *b = fg_dev_alloc(d, 2000, NULL);
    void *big = fg_dev_alloc(d, 5 * MiB, NULL);
    CHECK(fg_dev_memory_stats_get(d).reserved_bytes == 2 * MiB + 20 * MiB);
    CHECK_OK(fg_dev_free(d, big));
    CHECK(fg_dev_memory_stats_get(d).reserved_bytes == 2 * MiB);
    CHECK_OK(fg_dev_free(d, a));
    CHECK(fg_dev_memory_stats_get(d).reserved_bytes == 2 * MiB); /* b still holds it */
    CHECK_OK(fg_dev_free(d, b));
    fg_dev_memory_stats s = fg_dev_memory_stats_get(d);
    CHECK(s.reserved_bytes == 0 && s.segment_frees == 2 && s.cache_hits == 1);
    fg_dev_close(d);
}
