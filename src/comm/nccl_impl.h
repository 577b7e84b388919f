/* Private entries of the NCCL comm backend (nccl.c) for its tests: the
 * unique id exchange over a bootstrap communicator. Only in builds with
 * FULGUR_HAVE_CUDA. */
#ifndef FULGUR_NCCL_IMPL_H
#define FULGUR_NCCL_IMPL_H

#include "fulgur/comm.h"

#define FG_NCCL_ID_BYTES 128 /* sizeof(ncclUniqueId) */

/* Opens NCCL (dlopen: FULGUR_NCCL_LIBRARY, else libnccl.so.2); FG_OK or
 * FG_EUNSUPPORTED naming the file and dlerror. Thread-safe, once. */
FG_MUST_USE fg_status fg__nccl_load(void);
/* Rank 0 of `boot` makes the id with ncclGetUniqueId, every rank of it
 * gets the same bytes through a broadcast on boot (shm, MPI or hybrid). A
 * failing ncclGetUniqueId is FG_EUNSUPPORTED "ncclGetUniqueId: <why>" on
 * rank 0 and FG_EPEER naming rank 0 on the others. */
FG_MUST_USE fg_status fg__nccl_exchange_id(fg_comm *boot, unsigned char id[FG_NCCL_ID_BYTES]);

#endif
