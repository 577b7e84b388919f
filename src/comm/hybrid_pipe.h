/* Private to the hybrid backend: a worker thread that runs one leg of a
 * chunked pipeline (the across-nodes leg) while the caller runs the others.
 *
 * The caller posts chunks 0, 1, 2, ... in order as they become ready; the
 * worker runs leg(ctx, k) on each in order; the caller waits for chunk k
 * before it touches that chunk again. The schedule the caller follows does
 * not depend on the worker's timing, so ranks that must call their own
 * collectives in the same order still do. */
#ifndef FULGUR_HYBRID_PIPE_H
#define FULGUR_HYBRID_PIPE_H

#include "comm_impl.h"

typedef struct fg__hy_pipe fg__hy_pipe;

/* One chunk's leg, run on the worker thread. On failure it returns the
 * status with the message in fg_last_error (the worker's own). */
typedef FG_MUST_USE fg_status (*fg__hy_leg)(void *ctx, int64_t chunk);

/* Starts the worker; NULL (fg_last_status set) if the thread could not. */
fg__hy_pipe *fg__hy_pipe_start(fg__hy_leg leg, void *ctx);

/* Chunk k (the next one in order) is ready for the leg. */
void fg__hy_pipe_post(fg__hy_pipe *p, int64_t k);

/* Waits until the leg has run on chunk k; returns its status, and on a
 * failure sets this thread's error to the worker's message. */
FG_MUST_USE fg_status fg__hy_pipe_wait(fg__hy_pipe *p, int64_t k);

/* Stops the worker after the leg it is running (abort its communicator
 * first if that leg may wait for peers that will not come) and frees p. */
void fg__hy_pipe_stop(fg__hy_pipe *p);

#endif
