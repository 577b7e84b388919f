/* The CPU device's backend: host memory from fg_alloc, immediate streams,
 * the host's own addresses as the host view. */
#include "device_impl.h"

static FG_MUST_USE fg_status cpu_open(int index, size_t memory_limit, void **state) {
    (void)index;
    (void)memory_limit;
    *state = NULL;
    return FG_OK;
}

static void cpu_close(void *state) { (void)state; }

static void *cpu_segment_alloc(void *state, size_t bytes) {
    (void)state;
    return fg_alloc(bytes);
}

static void cpu_segment_free(void *state, void *ptr, size_t bytes) {
    (void)state;
    (void)bytes;
    fg_free(ptr);
}

static void *cpu_host_view(void *state, const void *p) {
    (void)state;
    return (void *)p;
}

const fg__dev_backend fg__dev_cpu_backend = {
    .kind = FG_CPU,
    .host_accessible = true,
    .caching = false,
    .open = cpu_open,
    .close = cpu_close,
    .segment_alloc = cpu_segment_alloc,
    .segment_free = cpu_segment_free,
    .host_view = cpu_host_view,
};
