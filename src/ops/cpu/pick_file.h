/* The file of measured choices that gemm_pick.c (the engine of each f32
 * product class) and conv_pick.c (the algorithm of each convolution shape)
 * keep per machine, so that the processes of one machine take the choice
 * the first one measured and runs repeat bit for bit.
 *
 * A file is a format line, a key line (what the choices depend on: the CPU
 * model and ISA flags, OpenBLAS's configuration, oneDNN's version and
 * ISA), the caller's lines and a checksum line. Its folder is
 * FULGUR_GEMM_CACHE (a folder, or off: no file), else
 * $XDG_CACHE_HOME/fulgur, else $HOME/.cache/fulgur; its name is the stem
 * and a hash of the key. */
#ifndef FULGUR_OPS_CPU_PICK_FILE_H
#define FULGUR_OPS_CPU_PICK_FILE_H

#include <stddef.h>

#include "fulgur/core.h"

#define FG_PICK_MAX_BYTES (64 << 10) /* a larger file is refused whole */

/* The key of choices in format `format`: what they depend on. */
void fg__pick_key(char *key, size_t cap, const char *format);

/* The file's path for stem ("gemm", "conv") and key; "" when the
 * environment says off or names no folder. */
void fg__pick_path(char *path, size_t cap, const char *stem, const char *key);

/* Reads path whole and checks it (size, no NUL, checksum, format line, the
 * key line of fg__pick_key(format)), parsing each further line into an
 * entry of `size` bytes (parse returns false for one that does not parse;
 * at most `most` lines); only when all of it passed, put(entry) for each
 * in order: a file that fails adds nothing. FG_EFORMAT naming path, what
 * failed and the line. */
FG_MUST_USE fg_status fg__pick_load(const char *path, const char *format, size_t size, int most,
                                    bool (*parse)(const char *text, void *entry),
                                    void (*put)(const void *entry));

/* Writes format, key, body (whole lines) and the checksum to a temporary
 * file renamed over path (a reader sees the old file or the new one), its
 * folder made first. FG_EIO naming the path. */
FG_MUST_USE fg_status fg__pick_save(const char *path, const char *format, const char *key,
                                    const char *body, size_t len);

/* The machine-wide lock of path (a lock file beside it, never removed): a
 * descriptor to close, or -1 with no path or after wait_s (a stopped
 * process holds it): then the caller decides alone. */
int fg__pick_lock(const char *path, double wait_s);

#endif
