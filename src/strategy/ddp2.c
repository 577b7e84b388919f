/* ddp2: Lightning's old strategy for one process per node. Inside the
 * process it is dp (dp.c: the batch split over worker threads holding
 * replicas, their gradients summed in replica order, weighted by each part's
 * share of the batch); across nodes the processes average that gradient with
 * one allreduce of the flat gradient buffer after the step, so every node
 * ends with the mean over the global batch, as ddp would on nodes x threads
 * ranks. The processes start from rank 0's parameters. Gradient
 * accumulation (s->sync false) skips the allreduce until the last
 * micro-batch, as ddp's no_sync. On a device the allreduce is staged
 * (staging.c) when the backend reads host memory. */
#include "strategy_impl.h"

static bool active(const fg_strategy *s) {
    return s->kind == FG_STRATEGY_DDP2 && s->comm && fg_comm_size(s->comm) > 1;
}

fg_status fg__ddp2_setup(fg_strategy *s) {
    if (!active(s)) return FG_OK;
    return fg__strategy_broadcast_params(s);
}

fg_status fg__ddp2_sync(fg_strategy *s) {
    if (!active(s) || !s->sync) return FG_OK;
    fg_tensor *g = fg_module_flat_grads(s->model);
    if (!g) return fg_error(FG_EINVAL, "ddp2: the model has no flat gradient buffer");
    fg_status st = fg__staged_allreduce(s->comm, fg__zero_dev(g), fg_tensor_data(g),
                                        fg_tensor_numel(g), fg_tensor_dtype(g), FG_REDUCE_OP_AVG);
    if (st != FG_OK)
        return fg_error_wrap(st, "ddp2: averaging the gradient across the %d nodes",
                             fg_comm_size(s->comm));
    return FG_OK;
}
