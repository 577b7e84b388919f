/* One thread setting for OpenMP and OpenBLAS together, so that N ranks with
 * T threads each never run more than N*T busy threads. */
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core_impl.h"

/* Declared by OpenBLAS's cblas.h; declared here so core needs no BLAS header. */
void openblas_set_num_threads(int num_threads);

static int g_threads;

int fg_num_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

fg_status fg_set_num_threads(int n) {
    if (n <= 0) {
        long env;
        FG_TRY(fg__env_int("FULGUR_NUM_THREADS", 0, &env));
        if (env < 0 || env > 4096)
            return fg_error(FG_EINVAL, "FULGUR_NUM_THREADS=%ld: expected 1..4096", env);
        n = env > 0 ? (int)env : fg_num_cores();
    }
    g_threads = n;
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
    openblas_set_num_threads(n);
    return FG_OK;
}

int fg_get_num_threads(void) {
    if (g_threads == 0) fg_set_num_threads(0);
    return g_threads;
}

double fg_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
