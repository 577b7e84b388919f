/* Which table of vector kernels the ops run (cpu_impl.h's fg__vk): the one
 * of fg_cpu_isa(), the ISA chosen at run time (core/cpu_isa.c: the CPU's
 * best, capped by FULGUR_CPU_ISA or set by fg_set_cpu_isa). A build for a
 * CPU other than x86-64 has the scalar table only. */
#include "core/cpu_isa.h"
#include "cpu_impl.h"

static const fg__vk g_scalar = {.isa = FG_ISA_SCALAR};

static const fg__vk *const g_tables[FG_ISA_COUNT] = {
    [FG_ISA_SCALAR] = &g_scalar,
#if FG_HAVE_ISA_TARGETS
    [FG_ISA_AVX2] = &fg__vk_avx2,
    [FG_ISA_AVX512] = &fg__vk_avx512,
#else
    [FG_ISA_AVX2] = &g_scalar,
    [FG_ISA_AVX512] = &g_scalar,
#endif
};

fg_status fg__vk_get(const fg__vk **vk) {
    fg_isa isa;
    fg_status s = fg__cpu_isa_checked(&isa);
    *vk = g_tables[isa];
    return s;
}
