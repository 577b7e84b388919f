/* Which vector ISA the CPU kernels run at. The CPU is asked once
 * (__builtin_cpu_supports, which also checks that the OS saves the wide
 * registers); FULGUR_CPU_ISA, read at the first query, caps the choice, so
 * that one setting fits a mix of machines: avx512 on a CPU with AVX2 only
 * runs AVX2. The kernels of ops, optim and comm read fg_cpu_isa() at each
 * call and index their tables with it, so fg_set_cpu_isa takes effect at
 * the next kernel. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core_impl.h"
#include "cpu_isa.h"

#define ISA_ENV "FULGUR_CPU_ISA"

static const char *const g_names[FG_ISA_COUNT] = {
    [FG_ISA_AUTO] = "auto",
    [FG_ISA_SCALAR] = "scalar",
    [FG_ISA_AVX2] = "avx2",
    [FG_ISA_AVX512] = "avx512",
};

#if FG_HAVE_ISA_TARGETS
/* The CPU features each level adds, as __builtin_cpu_supports names them.
 * clang 14 does not know "f16c" (every CPU with AVX2 and FMA has it). */
#if defined(__clang__)
#define F16C NULL
#else
#define F16C "f16c"
#endif
static const char *const g_needs[FG_ISA_COUNT][5] = {
    [FG_ISA_AVX2] = {"avx2", "fma", F16C, NULL},
    [FG_ISA_AVX512] = {"avx512f", "avx512bw", "avx512dq", "avx512vl", NULL},
};

/* __builtin_cpu_supports wants a string literal: one test per name */
static bool cpu_has(const char *f) {
    if (strcmp(f, "avx2") == 0) return __builtin_cpu_supports("avx2");
    if (strcmp(f, "fma") == 0) return __builtin_cpu_supports("fma");
#if !defined(__clang__)
    if (strcmp(f, "f16c") == 0) return __builtin_cpu_supports("f16c");
#endif
    if (strcmp(f, "avx512f") == 0) return __builtin_cpu_supports("avx512f");
    if (strcmp(f, "avx512bw") == 0) return __builtin_cpu_supports("avx512bw");
    if (strcmp(f, "avx512dq") == 0) return __builtin_cpu_supports("avx512dq");
    if (strcmp(f, "avx512vl") == 0) return __builtin_cpu_supports("avx512vl");
    return false;
}

/* Writes the features of `isa` the CPU lacks into buf ("" when none). */
static void missing(fg_isa isa, char *buf, size_t size) {
    size_t k = 0;
    buf[0] = '\0';
    for (int l = FG_ISA_AVX2; l <= (int)isa; l++)
        for (int i = 0; g_needs[l][i]; i++)
            if (!cpu_has(g_needs[l][i]) && k < size)
                k += (size_t)snprintf(buf + k, size - k, "%s%s", k ? ", " : "", g_needs[l][i]);
}
#endif

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static fg_isa g_best; /* the CPU's, set once by detect() */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int g_isa;      /* in use; FG_ISA_AUTO until chosen */
static _Atomic bool g_isa_bad; /* chosen from a FULGUR_CPU_ISA that is not a name */
static char g_env_bad[64];     /* that value (under g_lock) */

static void detect(void) {
    g_best = FG_ISA_SCALAR;
#if FG_HAVE_ISA_TARGETS
    __builtin_cpu_init();
    char m[128];
    for (int l = FG_ISA_AVX2; l < FG_ISA_COUNT; l++) {
        missing((fg_isa)l, m, sizeof m);
        if (m[0]) break;
        g_best = (fg_isa)l;
    }
#endif
}

/* The default: the CPU's best capped by FULGUR_CPU_ISA, read now. */
static fg_isa choose(void) {
    pthread_once(&g_once, detect);
    pthread_mutex_lock(&g_lock);
    int isa = atomic_load(&g_isa);
    if (isa == FG_ISA_AUTO) {
        const char *v = getenv(ISA_ENV);
        bool bad = v && *v;
        isa = g_best;
        for (int l = FG_ISA_AUTO; bad && l < FG_ISA_COUNT; l++)
            if (strcmp(v, g_names[l]) == 0) {
                bad = false;
                if (l != FG_ISA_AUTO && l < (int)g_best) isa = l;
            }
        if (bad) snprintf(g_env_bad, sizeof g_env_bad, "%s", v);
        atomic_store(&g_isa_bad, bad);
        atomic_store(&g_isa, isa);
    }
    pthread_mutex_unlock(&g_lock);
    return (fg_isa)isa;
}

fg_isa fg_cpu_isa(void) {
    int isa = atomic_load_explicit(&g_isa, memory_order_acquire);
    return isa != FG_ISA_AUTO ? (fg_isa)isa : choose();
}

fg_status fg__cpu_isa_checked(fg_isa *isa) {
    *isa = fg_cpu_isa();
    if (!atomic_load(&g_isa_bad)) return FG_OK;
    char v[sizeof g_env_bad];
    pthread_mutex_lock(&g_lock);
    memcpy(v, g_env_bad, sizeof v);
    pthread_mutex_unlock(&g_lock);
    return fg_error(FG_EINVAL, "%s=\"%s\": expected auto, scalar, avx2 or avx512", ISA_ENV, v);
}

fg_status fg_set_cpu_isa(fg_isa isa) {
    if ((int)isa < FG_ISA_AUTO || isa >= FG_ISA_COUNT)
        return fg_error(FG_EINVAL, "set_cpu_isa: isa = %d: expected FG_ISA_AUTO .. FG_ISA_AVX512",
                        (int)isa);
    pthread_once(&g_once, detect);
    if (isa > g_best) {
#if FG_HAVE_ISA_TARGETS
        char m[128];
        missing(isa, m, sizeof m);
        return fg_error(FG_EUNSUPPORTED, "set_cpu_isa: %s: this CPU lacks %s (it runs %s at most)",
                        g_names[isa], m, g_names[g_best]);
#else
        return fg_error(FG_EUNSUPPORTED, "set_cpu_isa: %s: this build is not for x86-64",
                        g_names[isa]);
#endif
    }
    pthread_mutex_lock(&g_lock); /* FG_ISA_AUTO: the next query reads the variable again */
    atomic_store(&g_isa_bad, false);
    atomic_store(&g_isa, isa);
    pthread_mutex_unlock(&g_lock);
    return FG_OK;
}

const char *fg_isa_name(fg_isa isa) {
    return (int)isa >= 0 && isa < FG_ISA_COUNT ? g_names[isa] : "?";
}
