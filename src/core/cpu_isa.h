/* For the layers whose kernels come in one variant per vector ISA (ops,
 * optim, comm): the checked ISA query and the pragmas that compile a stretch
 * of a file for one ISA, whatever -march the rest of the build uses.
 *
 *   FG_TARGET_AVX2_BEGIN ... FG_TARGET_END     AVX2 + FMA + F16C
 *   FG_TARGET_AVX512_BEGIN ... FG_TARGET_END   AVX-512 F, BW, DQ, VL
 *
 * The pragmas add to the build's -march, never take away: in a build for a
 * CPU with AVX-512 (-march=native there) the AVX2 stretch may come out with
 * AVX-512 encodings of its 256-bit instructions, which is harmless in a
 * binary that needs that CPU anyway. (Taking AVX-512 away there would stop
 * the intrinsics, compiled for -march, from inlining.)
 *
 * Every function defined in between, and the OpenMP regions outlined from
 * them, is compiled for that ISA; a caller runs one only when fg_cpu_isa()
 * says the CPU has it. Include the headers a stretch needs before it: an
 * inline function of a header included inside would be compiled twice for
 * different ISAs. FG_HAVE_ISA_TARGETS is 1 where the compiler can do this
 * (GCC and clang on x86-64); elsewhere there is only the scalar path. */
#ifndef FULGUR_CORE_CPU_ISA_H
#define FULGUR_CORE_CPU_ISA_H

#include "fulgur/core.h"

/* fg_cpu_isa(), or FG_EINVAL naming FULGUR_CPU_ISA when the variable's value
 * is not one of its names (fg_cpu_isa() then runs at the CPU's best). The
 * ops kernels report it this way; the optimizer and collectives, which
 * cannot fail, use fg_cpu_isa(). */
FG_MUST_USE fg_status fg__cpu_isa_checked(fg_isa *isa);

/* _Pragma takes one string literal, however long: */
/* clang-format off */
#if defined(__x86_64__) && defined(__clang__)
#define FG_HAVE_ISA_TARGETS 1
#define FG_TARGET_AVX2_BEGIN \
    _Pragma("clang attribute push(__attribute__((target(\"avx2,fma,f16c\"))), apply_to = function)")
#define FG_TARGET_AVX512_BEGIN \
    _Pragma("clang attribute push(__attribute__((target(\"avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c\"))), apply_to = function)")
#define FG_TARGET_END _Pragma("clang attribute pop")
#elif defined(__x86_64__) && defined(__GNUC__)
#define FG_HAVE_ISA_TARGETS 1
#define FG_TARGET_AVX2_BEGIN \
    _Pragma("GCC push_options") _Pragma("GCC target(\"avx2,fma,f16c\")")
#define FG_TARGET_AVX512_BEGIN \
    _Pragma("GCC push_options") \
    _Pragma("GCC target(\"avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c,prefer-vector-width=512\")")
#define FG_TARGET_END _Pragma("GCC pop_options")
#else
#define FG_HAVE_ISA_TARGETS 0
#endif
/* clang-format on */

#endif
