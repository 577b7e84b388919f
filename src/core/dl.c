/* fg__dl_open: a shared library opened with dlopen and a table of its
 * symbols filled, or a message saying which library or symbol is missing.
 * The GPU libraries (NVML, cuBLASLt, NCCL) are opened this way so that no
 * build links them and a machine without them still runs. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "core_impl.h"

void *fg__dl_open(const char *name, const fg__dl_sym *syms, size_t n, char *why, size_t why_len) {
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why, why_len, "%s", dlerror());
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        void *p = dlsym(h, syms[i].sym);
        if (!p && syms[i].optional) continue;
        if (!p) {
            snprintf(why, why_len, "%s: no %s", name, syms[i].sym);
            dlclose(h);
            return NULL;
        }
        memcpy(syms[i].dst, &p, sizeof p); /* POSIX: function pointers via memcpy */
    }
    return h;
}
