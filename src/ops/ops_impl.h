/* Private entries of the ops layer for the layers above it (autograd's
 * autocast): what the public op table does not carry yet. */
#ifndef FULGUR_OPS_IMPL_H
#define FULGUR_OPS_IMPL_H

#include "fulgur/ops.h"

/* c (f32 or bf16) = alpha op(a) op(b) + beta c with bf16 a and b, shapes as
 * the table's matmul, all contiguous, on a's device: oneDNN's bf16 product
 * or the f32 fallback, as fg_matmul_bf16_path says. FG_EUNSUPPORTED on a
 * device without one. */
fg_status fg__ops_matmul_bf16(const fg_tensor *a, bool ta, const fg_tensor *b, bool tb,
                              fg_tensor *c, double alpha, double beta);

#endif
