/* The kernel path of each precision setting, for `fulgur env`: what its row
 * of the policy table (kinds.c, the one place that says what a setting
 * means) runs on this CPU. */
#include <stdio.h>

#include "fulgur/precision.h"

const char *fg_precision_kernel_path(fg_precision_kind p) {
    static _Thread_local char buf[512];
    const fg_precision_policy *pol = fg_precision_policy_of(p);
    if (!pol) return "?";
    if (!pol->built) return "not built yet";
    size_t k = 0;
    if (pol->param_dtype == FG_BF16 || pol->param_dtype == FG_F16)
        k = (size_t)snprintf(buf, sizeof buf, "%s parameters and gradients, f32 optimizer state; ",
                             fg_dtype_name(pol->param_dtype));
    char *b = buf + k;
    size_t bs = sizeof buf - k;
    switch (pol->compute) {
    case FG_BF16:
        snprintf(b, bs, "bf16 products: %s; bf16 activations, conversions %s (f32 kernels between)",
                 fg_matmul_bf16_path(), fg_ops_lowp_path());
        break;
    case FG_F16:
        snprintf(b, bs,
                 "f16-rounded operands, f32 products (no f16 GEMM: for numerics, not speed); "
                 "f16 activations, conversions %s",
                 fg_ops_lowp_path());
        break;
    default: snprintf(b, bs, "%s products", fg_dtype_name(pol->param_dtype)); break;
    }
    return buf;
}
