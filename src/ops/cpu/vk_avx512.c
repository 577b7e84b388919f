/* The fg__vk kernels for AVX-512 F, BW, DQ and VL (16 floats a vector):
 * vk_t.h compiled for that ISA whatever -march the build uses. isa.c hands this table out
 * only when fg_cpu_isa() is FG_ISA_AVX512. */
#include <math.h>

#include "core/cpu_isa.h"
#include "cpu_impl.h"
#include "vmath.h"

#if FG_HAVE_ISA_TARGETS
#include <immintrin.h>

FG_TARGET_AVX512_BEGIN
#define VK_W 16
#include "simd.h"
#include "vk_t.h"
/* after vk_t.h: uses its dot_d */
#include "vk_ew_t.h"
#include "vk_norm_t.h"
#include "vk_rnn_t.h"
#include "vk_wino_t.h"
NORM_ROWS(float, f32)

const fg__vk fg__vk_avx512 = {.isa = FG_ISA_AVX512,
                              VK_ENTRIES,
                              VK_EW_ENTRIES,
                              VK_RNN_ENTRIES,
                              VK_NORM_ENTRIES,
                              VK_WINO_ENTRIES};
FG_TARGET_END
#endif
