/* The CPU op table: every entry a kernel from one of the files beside it.
 * An entry left out reads as NULL, which the autograd layer reports as
 * "op X is not available on cpu". */
#include <stdio.h>
#include <string.h>

#include "blas.h"
#include "cpu_impl.h"
#include "k_ops.h"

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
    .sum_dim = fg__cpu_sum_dim,
    .sum_dim_bwd = fg__cpu_sum_dim_bwd,
    .relu_fwd = fg__cpu_relu_fwd,
    .relu_bwd = fg__cpu_relu_bwd,
    .gelu_fwd = fg__cpu_gelu_fwd,
    .gelu_bwd = fg__cpu_gelu_bwd,
    .softmax_fwd = fg__cpu_softmax_fwd,
    .softmax_bwd = fg__cpu_softmax_bwd,
    .log_softmax_fwd = fg__cpu_log_softmax_fwd,
    .log_softmax_bwd = fg__cpu_log_softmax_bwd,
    .cross_entropy_fwd = fg__cpu_cross_entropy_fwd,
    .cross_entropy_bwd = fg__cpu_cross_entropy_bwd,
    .cross_entropy_fwd_stats = fg__cpu_cross_entropy_fwd_stats,
    .cross_entropy_bwd_stats = fg__cpu_cross_entropy_bwd_stats,
    .layernorm_fwd = fg__cpu_layernorm_fwd,
    .layernorm_bwd = fg__cpu_layernorm_bwd,
    .embedding_fwd = fg__cpu_embedding_fwd,
    .embedding_bwd = fg__cpu_embedding_bwd,
    .dropout_fwd = fg__cpu_dropout_fwd,
    .dropout_bwd = fg__cpu_dropout_bwd,
    .unary_fwd = fg__cpu_unary_fwd,
    .unary_bwd = fg__cpu_unary_bwd,
    .add_strided = fg__cpu_add_strided,
    .where = fg__cpu_where,
    .index_select = fg__cpu_index_select,
    .index_add = fg__cpu_index_add,
    .gather = fg__cpu_gather,
    .scatter_add = fg__cpu_scatter_add,
    .max_dim = fg__cpu_max_dim,
    .cumsum = fg__cpu_cumsum,
    .pointwise_loss_fwd = fg__cpu_pointwise_loss_fwd,
    .pointwise_loss_bwd = fg__cpu_pointwise_loss_bwd,
    .nll_fwd = fg__cpu_nll_fwd,
    .nll_bwd = fg__cpu_nll_bwd,
    .conv2d_fwd = fg__cpu_conv2d_fwd,
    .conv2d_bwd_data = fg__cpu_conv2d_bwd_data,
    .conv2d_bwd_weight = fg__cpu_conv2d_bwd_weight,
    .pool2d_fwd = fg__cpu_pool2d_fwd,
    .pool2d_bwd = fg__cpu_pool2d_bwd,
    .batch_norm_stats = fg__cpu_batch_norm_stats,
    .batch_norm_fwd = fg__cpu_batch_norm_fwd,
    .batch_norm_bwd = fg__cpu_batch_norm_bwd,
};

/* The f32 and conv parts change as classes and shapes are measured: built
 * at each call. */
const char *fg_ops_blas_info(void) {
    static _Thread_local char buf[5120];
    char f32[4096], conv[512] = "";
    const char *path = fg__cpu_conv_path();
    if (!strcmp(path, "onednn")) {
        /* oneDNN 2.x has Winograd kernels on AVX-512 only; below, fulgur's,
         * which needs a vector ISA (none under FULGUR_CPU_ISA=scalar) */
        const char *isa = fg__dnnl_isa();
        const fg__vk *vk = NULL;
        bool dnnl_wino = isa && strstr(isa, "avx512");
        if (dnnl_wino || (fg__vk_get(&vk) == FG_OK && vk->wino_in))
            snprintf(conv, sizeof conv, " (%s winograd or direct per shape: %s)",
                     dnnl_wino ? "oneDNN's" : "fulgur's", fg__conv_pick_info((char[400]){0}, 400));
        else
            snprintf(conv, sizeof conv, " (direct: no Winograd on the %s path)",
                     fg_isa_name(fg_cpu_isa()));
    }
    snprintf(buf, sizeof buf, "f32: %s; bf16: %s; conv: %s%s", fg__gemm_info(f32, sizeof f32),
             fg_matmul_bf16_path(), path, conv);
    return buf;
}
