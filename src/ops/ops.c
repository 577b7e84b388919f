/* The op-table registry: one table per device. */
#include "cpu/cpu_impl.h"
#include "ops_impl.h"

const fg_op_table *fg_ops_get(fg_device device) {
    if (device == FG_CPU) return &fg__cpu_ops;
    fg_error(FG_EUNSUPPORTED, "device %d: no kernels built in (CPU only in this build)",
             (int)device);
    return NULL;
}

fg_status fg__ops_matmul_bf16(const fg_tensor *a, bool ta, const fg_tensor *b, bool tb,
                              fg_tensor *c, double alpha, double beta) {
    if (a->device != FG_CPU)
        return fg_error(FG_EUNSUPPORTED, "matmul_bf16: device %d: no bf16 product built in",
                        (int)a->device);
    return fg__cpu_matmul_bf16(a, ta, b, tb, c, alpha, beta);
}
