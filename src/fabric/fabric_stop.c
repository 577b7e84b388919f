/* Resumable stops: a program's signal handler asks (fg_fabric_request_stop,
 * an atomic add, async-signal-safe), and the ranks agree at a step boundary
 * (fg_fabric_should_stop, one allreduce of the flag), so every rank stops
 * after the same step and the checkpoint saved there is whole on all. */
#include "fabric_impl.h"

int fg_fabric_request_stop(fg_fabric *f) { return atomic_fetch_add(&f->stop_requests, 1) + 1; }

fg_status fg_fabric_should_stop(fg_fabric *f, bool *stop) {
    if (!f || !stop) return fg_error(FG_EINVAL, "should_stop: NULL fabric or result");
    *stop = false;
    double flag = atomic_load(&f->stop_requests) > 0 ? 1.0 : 0.0;
    if (f->comm && f->world_size > 1)
        FG_TRY(fg_comm_allreduce(f->comm, &flag, &flag, 1, FG_F64, FG_REDUCE_OP_MAX));
    *stop = flag > 0;
    return FG_OK;
}
