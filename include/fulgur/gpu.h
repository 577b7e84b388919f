/* fulgur GPUs: what the machine has, without creating a CUDA context.
 *
 * fg_gpu_list reads the NVIDIA driver's management library (NVML, opened
 * with dlopen: libnvidia-ml.so.1 comes with the driver), so it works in
 * every build, with or without the CUDA backend, and creates no CUDA
 * context: a parent may call it before its ranks fork (a context does not
 * survive a fork). The indices are NVML's, in PCI order, which is CUDA's
 * order when CUDA_DEVICE_ORDER=PCI_BUS_ID; CUDA_VISIBLE_DEVICES is not
 * applied. The conventions of core.h hold. */
#ifndef FULGUR_GPU_H
#define FULGUR_GPU_H

#include "fulgur/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fg_gpu_info {
    int index;
    char name[96];          /* "NVIDIA H200" */
    uint64_t memory_bytes;  /* total device memory */
    int cc_major, cc_minor; /* compute capability (9.0 on Hopper) */
} fg_gpu_info;

/* Fills out[0 .. min(*count, max)) with the GPUs and sets *count to how
 * many there are. No GPU (no driver, no NVML, or NVML counts none) is
 * FG_EUNSUPPORTED with *count = 0 and a message saying which
 * ("no GPU: libnvidia-ml.so.1: cannot open shared object file ..."). */
FG_API FG_MUST_USE fg_status fg_gpu_list(fg_gpu_info *out, int max, int *count);

/* Whether this build has the CUDA backend (FULGUR_CUDA at configure time). */
FG_API bool fg_gpu_built(void);

#ifdef __cplusplus
}
#endif
#endif
