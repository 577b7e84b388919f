/* The precision policy: one table, one row per Lightning setting, and what
 * reads it (parsing, names, the kernel path of each setting). Every other
 * part of fulgur that depends on the precision (the fabric's parameter
 * dtype, its autocast, its loss scaler) asks this table rather than testing
 * the setting itself. */
#include <stdio.h>
#include <strings.h>

#include "fulgur/precision.h"

/* param, compute (autocast), grad, optimizer state, master weights, loss
 * scaling, built. bf16-true and 16-true keep f32 optimizer state, as
 * Lightning's true-half settings leave it to the optimizer. */
static const fg_precision_policy k_policy[FG_PRECISION_COUNT] = {
    [FG_PRECISION_64_TRUE] = {"64-true", "64", FG_F64, FG_DTYPE_DEFAULT, FG_F64, FG_F64, false,
                              false, true},
    [FG_PRECISION_32_TRUE] = {"32-true", "32", FG_F32, FG_DTYPE_DEFAULT, FG_F32, FG_F32, false,
                              false, true},
    [FG_PRECISION_BF16_MIXED] = {"bf16-mixed", "bf16", FG_F32, FG_BF16, FG_F32, FG_F32, true, false,
                                 true},
    [FG_PRECISION_16_MIXED] = {"16-mixed", "16", FG_F32, FG_F16, FG_F32, FG_F32, true, true, true},
    [FG_PRECISION_BF16_TRUE] = {"bf16-true", NULL, FG_BF16, FG_BF16, FG_BF16, FG_F32, false, false,
                                true},
    [FG_PRECISION_16_TRUE] = {"16-true", NULL, FG_F16, FG_F16, FG_F16, FG_F32, false, false, true},
};

const fg_precision_policy *fg_precision_policy_of(fg_precision_kind p) {
    return (int)p >= 0 && p < FG_PRECISION_COUNT ? &k_policy[p] : NULL;
}

const char *fg_precision_kind_name(fg_precision_kind p) {
    return (int)p >= 0 && p < FG_PRECISION_COUNT ? k_policy[p].name : "?";
}

fg_status fg_precision_parse(const char *s, fg_precision_kind *out) {
    if (!out) return fg_error(FG_EINVAL, "precision: NULL output");
    if (!s) {
        *out = FG_PRECISION_32_TRUE;
        return FG_OK;
    }
    for (int i = 0; i < FG_PRECISION_COUNT; i++) {
        const char *alias = k_policy[i].alias;
        if (strcasecmp(s, k_policy[i].name) && (!alias || strcasecmp(s, alias))) continue;
        *out = (fg_precision_kind)i;
        return FG_OK;
    }
    return fg_error(FG_EINVAL,
                    "precision=\"%s\": unknown; expected one of 32-true (32), 64-true "
                    "(64), 16-mixed (16), bf16-mixed (bf16), 16-true, bf16-true",
                    s);
}

const char *fg_precision_available(void) {
    return "32-true (32), 64-true (64), 16-mixed (16), bf16-mixed (bf16), 16-true, bf16-true";
}

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
