/* Private: arrays kept in files on a disk (offload_nvme), streamed through
 * memory block by block with asynchronous I/O (io_uring). The optimizer
 * keeps its state in one (offload.c); ZeRO stage 3 can keep parameter
 * shards in one the same way (any bytes, any number of arrays).
 *
 * A store of n arrays of `bytes` bytes each is n files under one directory,
 * opened unlinked (O_TMPFILE, or created and unlinked at once): nothing is
 * left on disk after free, or after a crash. Each file is allocated whole
 * at creation (fallocate), so a disk too small is an error then, naming the
 * directory and the bytes needed, and never in the middle of a run. Where
 * the file system allows it the files are read and written with O_DIRECT
 * (no page cache: the memory a run may use is not filled with cached
 * state); each array is also mapped (MAP_SHARED) for whole-array access
 * such as checkpoints, which the kernel keeps coherent with direct I/O. */
#ifndef FULGUR_NVME_STORE_H
#define FULGUR_NVME_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fulgur/core.h"

#define FG_NVME_MAX_ARRAYS 4
#define FG_NVME_ALIGN 4096                      /* O_DIRECT's offsets, sizes and buffers */
#define FG_NVME_DEFAULT_BLOCK ((size_t)4 << 20) /* bytes per array per block */

typedef struct fg__nvme_store fg__nvme_store;

/* Is offload_nvme built in (liburing found at build time)? */
bool fg__nvme_available(void);

/* A store of `narrays` (1..FG_NVME_MAX_ARRAYS) zeroed arrays of `bytes`
 * bytes each under directory `dir`, streamed in blocks of `block` bytes (a
 * multiple of FG_NVME_ALIGN; 0 = FG_NVME_DEFAULT_BLOCK). `what` names the
 * contents in messages ("the optimizer state"). Errors (nothing is left
 * behind): FG_EUNSUPPORTED without liburing or when the kernel refuses
 * io_uring; FG_EIO naming dir for a missing or unwritable directory, and
 * naming dir, the free bytes and the bytes needed when the disk cannot
 * hold the arrays; FG_ENOMEM. */
FG_MUST_USE fg_status fg__nvme_store_new(const char *dir, const char *what, int narrays,
                                         size_t bytes, size_t block, fg__nvme_store **out);
/* Closes (and so deletes) the files. NULL is a no-op. */
void fg__nvme_store_free(fg__nvme_store *s);

/* Array i mapped whole (shared with the file), `bytes` long. */
void *fg__nvme_store_map(fg__nvme_store *s, int i);

/* Called once per block with bufs[i] pointing at byte `off` of array i in
 * memory, n bytes of each. *write (preset: the stream's write flag) says
 * whether the block goes back to the files. */
typedef FG_MUST_USE fg_status (*fg__nvme_block_fn)(void *ud, size_t off, size_t n,
                                                   void *const *bufs, bool *write);

/* Streams bytes [begin, end) of every array through fn, block by block:
 * the next block's reads are in flight while fn works on this one, and
 * its writes go behind (read = false: nothing is read first, for filling
 * whole arrays: fn must write every byte of [begin, end), and bytes of the
 * first and last block outside it are left undefined). Returns fn's first
 * failure or an I/O error naming the directory,
 * the operation and the offset (ENOSPC as a full disk, with the bytes).
 * After an error the arrays are as far as the blocks written before it. */
FG_MUST_USE fg_status fg__nvme_store_stream(fg__nvme_store *s, size_t begin, size_t end, bool read,
                                            bool write, fg__nvme_block_fn fn, void *ud);

/* An asynchronous read of bytes [off, off + n) of array i into memory of
 * any alignment (ZeRO stage 3's parameter offload fetches a unit's shard
 * ahead of its compute): _start submits it on the store's own ring for
 * reads (separate from the streams'), _finish waits for it, copies the
 * bytes to dst (NULL: drop them) and frees it. A failed read is an error
 * naming the directory, what and the offset. Several may be in flight;
 * each must be finished before the store is freed. */
typedef struct fg__nvme_read fg__nvme_read;
FG_MUST_USE fg_status fg__nvme_store_read_start(fg__nvme_store *s, int i, size_t off, size_t n,
                                                fg__nvme_read **out);
FG_MUST_USE fg_status fg__nvme_store_read_finish(fg__nvme_read *r, void *dst);

/* Bytes read from and written to the files by streams so far. */
void fg__nvme_store_counts(const fg__nvme_store *s, uint64_t *read, uint64_t *written);
/* Whether the files are read with O_DIRECT (false on tmpfs and the like). */
bool fg__nvme_store_direct(const fg__nvme_store *s);

#endif
