/* The CPU op table: every entry a kernel from one of the files beside it.
 * An entry left out reads as NULL, which the autograd layer reports as
 * "op X is not available on cpu". */
#include "cpu_impl.h"

const fg_op_table fg__cpu_ops = {
    .device = "cpu",
    .matmul = fg__cpu_matmul,
    .bias_add = fg__cpu_bias_add,
    .bias_grad = fg__cpu_bias_grad,
    .attention_fwd = fg__cpu_attention_fwd,
    .attention_bwd = fg__cpu_attention_bwd,
    .binary = fg__cpu_binary,
    .sum_to = fg__cpu_sum_to,
    .axpby = fg__cpu_axpby,
    .scale = fg__cpu_scale,
    .sum_all = fg__cpu_sum_all,
    .sumsq_all = fg__cpu_sumsq_all,
};

const char *fg_ops_blas_info(void) {
#ifdef FULGUR_HAVE_DNNL
    return "openblas+onednn";
#else
    return "openblas";
#endif
}
