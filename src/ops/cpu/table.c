/* The CPU op table: every entry a kernel from one of the files beside it.
 * An entry left out reads as NULL, which the autograd layer reports as
 * "op X is not available on cpu". */
#include <pthread.h>
#include <stdio.h>

#include "blas.h"
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
    .layernorm_fwd = fg__cpu_layernorm_fwd,
    .layernorm_bwd = fg__cpu_layernorm_bwd,
    .embedding_fwd = fg__cpu_embedding_fwd,
    .embedding_bwd = fg__cpu_embedding_bwd,
    .dropout_fwd = fg__cpu_dropout_fwd,
    .dropout_bwd = fg__cpu_dropout_bwd,
};

/* Built once: the bf16 path is fixed for the life of the process. */
static char g_blas_info[192];
static pthread_once_t g_blas_info_once = PTHREAD_ONCE_INIT;

static void make_blas_info(void) {
    const char *isa = fg__dnnl_isa();
    if (isa)
        snprintf(g_blas_info, sizeof g_blas_info,
                 "f32: openblas, onednn (%s) from %d multiply-adds; bf16: %s", isa,
                 FG_GEMM_DNNL_MIN, fg_matmul_bf16_path());
    else
        snprintf(g_blas_info, sizeof g_blas_info, "f32: openblas; bf16: %s", fg_matmul_bf16_path());
}

const char *fg_ops_blas_info(void) {
    pthread_once(&g_blas_info_once, make_blas_info);
    return g_blas_info;
}
