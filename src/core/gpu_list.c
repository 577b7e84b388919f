/* fg_gpu_list (fulgur/gpu.h): the GPUs as NVML sees them, NVML opened with
 * dlopen so that no build links the driver and no CUDA context is made.
 * The few NVML calls are declared here (their C ABI is stable since NVML
 * 2.x; the _v2 names are the current ones). */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "core_impl.h"
#include "fulgur/gpu.h"

typedef int nvml_ret; /* nvmlReturn_t: 0 is NVML_SUCCESS */
typedef struct nvml_dev *nvml_dev;
typedef struct {
    unsigned long long total, free, used;
} nvml_memory;

typedef struct nvml {
    nvml_ret (*init)(void);
    nvml_ret (*shutdown)(void);
    const char *(*error_string)(nvml_ret);
    nvml_ret (*count)(unsigned *);
    nvml_ret (*handle)(unsigned, nvml_dev *);
    nvml_ret (*name)(nvml_dev, char *, unsigned);
    nvml_ret (*memory)(nvml_dev, nvml_memory *);
    nvml_ret (*cc)(nvml_dev, int *, int *);
} nvml;

static const char *nvml_err(const nvml *n, nvml_ret r) {
    static _Thread_local char buf[32];
    if (n->error_string) return n->error_string(r);
    snprintf(buf, sizeof buf, "NVML error %d", r);
    return buf;
}

bool fg_gpu_built(void) {
#ifdef FULGUR_HAVE_CUDA
    return true;
#else
    return false;
#endif
}

fg_status fg_gpu_list(fg_gpu_info *out, int max, int *count) {
    *count = 0;
    nvml n = {0};
    const fg__dl_sym syms[] = {
        {&n.init, "nvmlInit_v2", false},
        {&n.shutdown, "nvmlShutdown", false},
        {&n.error_string, "nvmlErrorString", true},
        {&n.count, "nvmlDeviceGetCount_v2", false},
        {&n.handle, "nvmlDeviceGetHandleByIndex_v2", false},
        {&n.name, "nvmlDeviceGetName", false},
        {&n.memory, "nvmlDeviceGetMemoryInfo", false},
        {&n.cc, "nvmlDeviceGetCudaComputeCapability", false},
    };
    char why[300];
    void *h = fg__dl_open("libnvidia-ml.so.1", syms, sizeof syms / sizeof *syms, why, sizeof why);
    if (!h) return fg_error(FG_EUNSUPPORTED, "no GPU: %s (NVML comes with the NVIDIA driver)", why);
    fg_status st = FG_OK;
    nvml_ret r = n.init();
    if (r) {
        st = fg_error(FG_EUNSUPPORTED, "no GPU: nvmlInit: %s", nvml_err(&n, r));
        goto done;
    }
    unsigned cnt = 0;
    if ((r = n.count(&cnt)) != 0 || cnt == 0) {
        st = fg_error(FG_EUNSUPPORTED, "no GPU: nvmlDeviceGetCount: %s",
                      r ? nvml_err(&n, r) : "0 devices");
        n.shutdown();
        goto done;
    }
    for (unsigned i = 0; i < cnt; i++) {
        if ((int)i >= max) continue;
        fg_gpu_info g = {.index = (int)i};
        nvml_dev d;
        nvml_memory m = {0};
        if ((r = n.handle(i, &d)) != 0 || (r = n.name(d, g.name, sizeof g.name)) != 0 ||
            (r = n.memory(d, &m)) != 0 || (r = n.cc(d, &g.cc_major, &g.cc_minor)) != 0) {
            st = fg_error(FG_EIO, "GPU %u: NVML: %s", i, nvml_err(&n, r));
            break;
        }
        g.memory_bytes = m.total;
        out[i] = g;
    }
    n.shutdown();
    if (st == FG_OK) *count = (int)cnt;
done:
    dlclose(h);
    return st;
}
