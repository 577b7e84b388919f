/* The op-table registry: one table per device. */
#include "cpu/cpu_impl.h"

const fg_op_table *fg_ops_get(fg_device device) {
    if (device == FG_CPU) return &fg__cpu_ops;
    fg_error(FG_EUNSUPPORTED, "device %d: no kernels built in (CPU only in this build)",
             (int)device);
    return NULL;
}
