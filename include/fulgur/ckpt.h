/* fulgur ckpt: safetensors files, written atomically and read without trust.
 *
 * This layer moves named, typed, shaped byte buffers plus string metadata in
 * and out of safetensors files (the format of Hugging Face's safetensors
 * package, readable by `safetensors.torch.load_file`). It knows nothing of
 * tensors, modules or optimizers: the layers above map their state onto
 * names and metadata keys. docs/checkpoints.md describes the file layout.
 *
 * Writing: collect entries in a fg_st_writer, then fg_st_writer_write puts
 * them in a temporary file beside the target, fsyncs it, renames it over the
 * target and fsyncs the folder. A crash or kill at any moment leaves either
 * the previous file or the new one, whole. fg_st_set_last points a symlink
 * (e.g. ckpt/last.safetensors) at the newest complete checkpoint, atomically.
 *
 * Reading: fg_st_open maps a file and checks every byte of its header before
 * it believes any number in it; a truncated, corrupted or hostile file gives
 * NULL, FG_EFORMAT and a message naming the file, the tensor and the problem.
 *
 * Sharded checkpoints: a folder of safetensors files and an index in Hugging
 * Face's model.safetensors.index.json layout, written as a whole
 * (fg_st_folder_begin, fg_st_write_index, fg_st_folder_commit) and read by
 * fg_st_open as one file (below, "sharded checkpoints").
 *
 * Memory goes through fg_alloc/fg_free, jansson's included: on first use this
 * layer routes jansson's allocations through fg_alloc (json_set_alloc_funcs,
 * process-wide). A program that uses jansson itself with a non-default
 * fg allocator should free its jansson values before changing allocators.
 *
 * Thread safety: a writer or a file is used by one thread at a time; distinct
 * handles on distinct threads are independent. A fg_st_file is read-only after
 * fg_st_open, so concurrent fg_st_info_at/fg_st_data/fg_st_read/fg_st_meta_*
 * calls on one file are safe. No call here is collective. */
#ifndef FULGUR_CKPT_H
#define FULGUR_CKPT_H

#include "fulgur/core.h"
#include "fulgur/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The largest JSON header accepted or written, in bytes (the limit of the
 * reference implementation, so that both refuse the same files). */
#define FG_ST_MAX_HEADER 100000000u
/* The most dimensions an entry may have. */
#define FG_ST_MAX_NDIM 64

/* One metadata entry, as the layers above pass metadata around: a key and
 * its value, both UTF-8 strings (the format's metadata maps str to str).
 * Plain pointers; who owns them is said where an fg_kv is passed. */
typedef struct fg_kv {
    const char *key, *value;
} fg_kv;

/* --------------------------------------------------------------- writing */

typedef struct fg_st_writer fg_st_writer;

/* A new, empty writer. Returns NULL with FG_ENOMEM in fg_last_error when out
 * of memory. Free with fg_st_writer_free. */
FG_API fg_st_writer *fg_st_writer_new(void);

/* Frees the writer and its copies of names, shapes and metadata; never
 * touches the borrowed data buffers. A file begun (fg_st_writer_begin) and
 * not finished is abandoned: its temporary file is removed and the target
 * stays as it was. fg_st_writer_free(NULL) is a no-op. */
FG_API void fg_st_writer_free(fg_st_writer *w);

/* Adds an entry. Entries are laid out in the file in the order they are
 * added, contiguously.
 *   name:  non-empty UTF-8, not "__metadata__", unique in this writer; copied.
 *   dtype: a valid fg_dtype; the file stores its safetensors name ("F32").
 *   ndim:  0..FG_ST_MAX_NDIM; 0 is a scalar (one element).
 *   shape: ndim entries >= 0 (0 makes an empty entry); copied. May be NULL
 *          when ndim is 0.
 *   data:  product(shape) * fg_dtype_size(dtype) bytes, little-endian, in
 *          row-major order; BORROWED until fg_st_writer_write returns (or the
 *          writer is freed). May be NULL when the entry has no bytes.
 * Returns FG_OK; FG_EINVAL naming the entry for a bad argument, a duplicate
 * name or a size that overflows; FG_ENOMEM. On failure the writer is
 * unchanged. */
FG_API FG_MUST_USE fg_status fg_st_writer_add(fg_st_writer *w, const char *name, fg_dtype dtype,
                                              int ndim, const int64_t *shape, const void *data);

/* fg_st_writer_add for data in device memory of `dev` (device.h): written
 * through one host staging buffer of 4 MiB, a chunk at a time with the
 * device's copy calls, so a checkpoint of a model on a device never holds
 * the model in host memory. dev NULL or the cpu: fg_st_writer_add. */
FG_API FG_MUST_USE fg_status fg_st_writer_add_on(fg_st_writer *w, const char *name, fg_dtype dtype,
                                                 int ndim, const int64_t *shape, const void *data,
                                                 fg_dev *dev);

/* Sets metadata key = value (both UTF-8 strings, copied; key non-empty).
 * Setting a key again replaces its value; keys are written in the order they
 * were first set. Returns FG_OK, FG_EINVAL (NULL or invalid UTF-8) or
 * FG_ENOMEM; on failure the writer is unchanged. */
FG_API FG_MUST_USE fg_status fg_st_writer_set_meta(fg_st_writer *w, const char *key,
                                                   const char *value);

/* Number of entries added so far. */
FG_API int64_t fg_st_writer_count(const fg_st_writer *w);

/* Number of metadata keys set so far, and key i (0 <= i < count) with its
 * value, in the order they were first set; borrowed until the writer
 * changes or is freed. fg_st_writer_meta_at returns FG_EINVAL if i is out
 * of range. */
FG_API int64_t fg_st_writer_meta_count(const fg_st_writer *w);
FG_API FG_MUST_USE fg_status fg_st_writer_meta_at(const fg_st_writer *w, int64_t i,
                                                  const char **key, const char **value);

/* Writes everything added so far to `path`, atomically:
 *   1. a temporary file "<dir>/.<name>.tmp-<pid>-<n>" in the target's folder
 *      (hidden, and not ending in .safetensors, so that nothing takes it for
 *      a checkpoint; a kill leaves it behind, never in the target's place),
 *   2. written in full and fsync'ed,
 *   3. renamed over `path`, then the folder is fsync'ed.
 * A kill at any moment leaves `path` either as it was or as the new file.
 * The writer stays usable (write again, add more). Entries declared without
 * data (fg_st_writer_declare) are FG_ESTATE here: they are written by the
 * streaming calls below. Not collective: with many
 * ranks, write from the ranks that own the data, to distinct paths.
 * `path` may be a regular file (replaced) or nothing; anything else there (a
 * folder, symlink, fifo or device node, which rename would replace as
 * readily) is refused with FG_EINVAL naming what it is, before and again
 * just before the rename.
 * Returns FG_OK; FG_EIO naming `path` and the system's reason (full disk,
 * missing folder, permission) with the temporary file removed; FG_EINVAL if
 * the header would pass FG_ST_MAX_HEADER or `path` is not a regular file;
 * FG_ENOMEM. If only the final
 * folder fsync fails, the new file is in place and FG_EIO says so. */
FG_API FG_MUST_USE fg_status fg_st_writer_write(fg_st_writer *w, const char *path);

/* Streaming: a file written an entry at a time, so that its writer never
 * holds every tensor at once (a checkpoint gathered from many ranks a piece
 * at a time). The header is known up front from the names, dtypes and
 * shapes; the bytes follow in the order the entries were added. The file is
 * byte for byte the one fg_st_writer_write makes of the same entries and
 * metadata, and is as atomic (a temporary file renamed into place at
 * fg_st_writer_finish).
 *
 * fg_st_writer_declare adds an entry as fg_st_writer_add does, without its
 * data: its bytes come later through fg_st_writer_put. Entries added with
 * data are written by the writer itself when the stream reaches them.
 * Returns as fg_st_writer_add. */
FG_API FG_MUST_USE fg_status fg_st_writer_declare(fg_st_writer *w, const char *name, fg_dtype dtype,
                                                  int ndim, const int64_t *shape);

/* Opens the temporary file beside `path` (as fg_st_writer_write), writes
 * the header and the entries with data up to the first declared one. From
 * here to fg_st_writer_finish no entry nor metadata may be added
 * (FG_ESTATE). Returns as fg_st_writer_write; on failure nothing is left. */
FG_API FG_MUST_USE fg_status fg_st_writer_begin(fg_st_writer *w, const char *path);

/* The next `nbytes` of the declared entry being written (a whole entry or
 * a piece of it; pieces in order), in device memory of `dev` when dev is
 * set and not the cpu (staged as fg_st_writer_add_on stages). When the
 * entry is complete the writer goes on with the entries that have data.
 * More bytes than the entry has left is FG_EINVAL naming it. Any failure
 * removes the temporary file: later puts and finish return FG_ESTATE, the
 * target is as it was. */
FG_API FG_MUST_USE fg_status fg_st_writer_put(fg_st_writer *w, const void *data, size_t nbytes,
                                              fg_dev *dev);

/* Flushes, fsyncs and renames the file into place, as fg_st_writer_write
 * ends. FG_ESTATE naming the entry if a declared entry is still owed bytes
 * (the temporary file is removed). Afterwards the writer can begin again. */
FG_API FG_MUST_USE fg_status fg_st_writer_finish(fg_st_writer *w);

/* Points the symlink `link_path` (e.g. "ckpt/last.safetensors") at `target`,
 * atomically: a temporary symlink in the same folder is renamed over it and
 * the folder fsync'ed, so readers see the old or the new target, never none.
 *   target: a path relative to the link's folder (normally a file name such
 *           as "step-40.safetensors"), or an absolute path; it must exist.
 * Call it only after the target's fg_st_writer_write returned FG_OK, and
 * delete old checkpoints only after it returns: then the link always names a
 * whole file, the newest whose save finished.
 * Returns FG_OK, FG_EINVAL (empty or NULL argument), FG_EIO naming the link
 * and the system's reason (target missing, folder not writable), FG_ENOMEM. */
FG_API FG_MUST_USE fg_status fg_st_set_last(const char *link_path, const char *target);

/* Resolves the symlink `link_path` made by fg_st_set_last into a path that
 * fg_st_open accepts ("ckpt/step-40.safetensors"), written to out (cap bytes,
 * NUL-terminated). Returns FG_OK; FG_EIO if the link does not exist (no
 * checkpoint yet) or cannot be read; FG_EFORMAT if `link_path` is not a
 * symlink; FG_EINVAL if out is too small. */
FG_API FG_MUST_USE fg_status fg_st_get_last(const char *link_path, char *out, size_t cap);

/* Removes the temporary files (and the temporary folders of
 * fg_st_folder_begin, with the files in them) that writes into folder `dir`
 * left behind when their process was killed mid-write: names of the form
 * ".<name>.tmp-<pid>-<n>" (the only ones this layer makes) whose pid runs no
 * more on this machine. A temporary of a live process (a save going on) is
 * left alone, and so is anything else. *removed (may be NULL) gets how many
 * were removed. Call it where one program owns the folder (rank 0 at the
 * start of a run): a writer on another machine sharing the folder is not
 * seen as alive. Errors: FG_EINVAL (NULL dir), FG_EIO naming the folder
 * (cannot list it) or the file (cannot remove it). */
FG_API FG_MUST_USE fg_status fg_st_remove_stale_tmp(const char *dir, int *removed);

/* ----------------------------------------------------- sharded checkpoints
 *
 * A sharded checkpoint is a folder holding safetensors files and an index
 * named FG_ST_INDEX_NAME, the layout of Hugging Face's sharded weights:
 *   {"metadata": {"total_size": <bytes of all tensors>, "<key>": "<value>", ...},
 *    "weight_map": {"<tensor name>": "<file name in the folder>", ...}}
 * Each tensor lies whole in the one file the weight map names. fg_st_open
 * reads such a folder (or its index) as one file; the folder is written as
 * a whole: every file into a temporary folder (fg_st_folder_begin), then
 * the temporary folder moved into place (fg_st_folder_commit). */
#define FG_ST_INDEX_NAME "model.safetensors.index.json"

/* Writes the index of a sharded checkpoint at `path` (normally
 * "<folder>/" FG_ST_INDEX_NAME), atomically as fg_st_writer_write does:
 * tensor names[i] lies in the file files[i] (a plain name in the index's
 * folder: no '/', not starting with '.'), n entries in the order given;
 * metadata total_size (the bytes of all the tensors) and then meta[0..nmeta)
 * as strings. Returns FG_OK; FG_EINVAL (NULL arguments, an empty or
 * repeated name, a file name with a '/' or a leading '.', a key
 * "total_size" in meta, text that is not UTF-8); FG_EIO naming the path;
 * FG_ENOMEM. */
FG_API FG_MUST_USE fg_status fg_st_write_index(const char *path, int64_t n,
                                               const char *const *names, const char *const *files,
                                               uint64_t total_size, const fg_kv *meta,
                                               int64_t nmeta);

/* Starts writing a checkpoint folder that will be `path`: makes an empty
 * temporary folder beside it, "<dir>/.<name>.tmp-<pid>-<n>" (hidden, named
 * as the writer's temporary files, so fg_st_remove_stale_tmp removes it if
 * this process dies), and writes its path to tmp (cap bytes). Write every
 * file of the checkpoint into tmp, then fg_st_folder_commit, or
 * fg_st_remove(tmp) to give up. Returns FG_OK; FG_EINVAL (NULL or empty
 * path, a path ending in '/', tmp too small); FG_EIO naming the folder and
 * the system's reason. */
FG_API FG_MUST_USE fg_status fg_st_folder_begin(const char *path, char *tmp, size_t cap);

/* Moves the finished temporary folder tmp to `path` atomically: tmp is
 * fsync'ed, renamed to path (exchanged with what was there, a previous
 * checkpoint file or folder, which is then removed) and the parent folder
 * fsync'ed. A kill at any moment leaves `path` as it was or as the new
 * folder, whole. Returns FG_OK; FG_EINVAL for NULL; FG_EIO naming the paths
 * and the system's reason (tmp is then left for the caller to remove). */
FG_API FG_MUST_USE fg_status fg_st_folder_commit(const char *tmp, const char *path);

/* Removes a checkpoint: a file, or a folder of files (a sharded checkpoint,
 * or a temporary folder of fg_st_folder_begin) with the files in it. Only
 * one level: a folder inside it is an error, and nothing is followed
 * through symlinks. A missing path is FG_OK. FG_EIO naming the path and
 * the reason otherwise; FG_EINVAL for NULL. */
FG_API FG_MUST_USE fg_status fg_st_remove(const char *path);

/* --------------------------------------------------------------- reading */

typedef struct fg_st_file fg_st_file;

/* One entry of an open file. Pointers are borrowed: valid until fg_st_close. */
typedef struct fg_st_info {
    const char *name;
    const char *dtype_name; /* as in the file: "F32", "BF16", "BOOL", ... */
    fg_dtype dtype;         /* FG_DTYPE_DEFAULT when fulgur lacks the file's dtype */
    bool has_dtype;       /* false for safetensors dtypes fulgur lacks (BOOL, I8, U32, F8_*, ...) */
    size_t elem_size;     /* bytes per element */
    int ndim;             /* 0..FG_ST_MAX_NDIM */
    const int64_t *shape; /* ndim entries */
    int64_t numel;        /* product of shape (1 for ndim 0) */
    size_t nbytes;        /* numel * elem_size */
    size_t offset;        /* of the bytes, from the start of the data buffer */
} fg_st_info;

/* Opens and checks the safetensors file at `path` (memory-mapped read-only),
 * or a sharded checkpoint: `path` a folder holding FG_ST_INDEX_NAME, or an
 * index file whose name ends in ".json". A sharded checkpoint reads as one
 * file whose entries are the weight map's, in its order, and whose metadata
 * are the index's string-valued "metadata" entries; each file the map names
 * is opened and checked as below, every tensor the map names must be in the
 * file it names, every tensor of those files must be in the map for that
 * file, and a total_size must equal the bytes of all the tensors (else
 * FG_EFORMAT naming the index, the tensor and the file). An entry's
 * fg_st_info.offset is then from the start of its own file's data buffer.
 * Every header field is checked before use: header length against the file
 * size and FG_ST_MAX_HEADER, JSON validity, field types, dtype names, shapes
 * (non-negative, product without overflow), data_offsets inside the buffer
 * and equal in size to shape x dtype, entries that tile the buffer exactly
 * (no gap, no overlap, no trailing bytes, as the reference implementation
 * requires), unique non-empty names, string-valued metadata.
 * Returns the open file, which owns the mapping (close it with fg_st_close),
 * or NULL with fg_last_status() FG_EIO naming the path (missing, unreadable,
 * not a regular file); FG_EFORMAT naming the path, the entry and the
 * problem; FG_ENOMEM; FG_EINVAL for a NULL path.
 * The mapping assumes the file is not truncated while open: files written
 * by fg_st_writer_write are replaced by rename, never modified in place. */
FG_API fg_st_file *fg_st_open(const char *path);

/* As fg_st_open, over `len` bytes at `buf`, BORROWED until fg_st_close (no
 * copy is made). `label` names the buffer in messages (NULL: "<memory>");
 * it is copied. For tests and fuzzers, and files already in memory. NULL
 * on failure, as fg_st_open (FG_EINVAL for a NULL buf with len > 0). */
FG_API fg_st_file *fg_st_open_memory(const void *buf, size_t len, const char *label);

/* Unmaps and frees. fg_st_close(NULL) is a no-op. */
FG_API void fg_st_close(fg_st_file *f);

/* Number of entries, and entry i (0 <= i < count) in data order: the order
 * in which they lie in the file, which for files from fg_st_writer_write is
 * the order they were added. fg_st_info_at returns FG_EINVAL if i is out of
 * range (and cannot fail otherwise: a loop over 0 .. count may leave its
 * status unread, so it is not FG_MUST_USE). */
FG_API int64_t fg_st_count(const fg_st_file *f);
FG_API fg_status fg_st_info_at(const fg_st_file *f, int64_t i, fg_st_info *out);

/* The index of the entry called `name`, or -1 if there is none (no error is
 * set: a missing name is an answer, not a failure). O(log count). */
FG_API int64_t fg_st_find(const fg_st_file *f, const char *name);

/* The bytes of entry i (info.nbytes of them), borrowed until fg_st_close;
 * NULL if i is out of range. The pointer is aligned only as the file's
 * layout makes it (entries follow each other without padding, so an F32
 * after an odd-sized U8 is misaligned): dereference it as bytes, or use
 * fg_st_read, which copies safely. */
FG_API const void *fg_st_data(const fg_st_file *f, int64_t i);

/* Copies entry i into dst as `dst_dtype`, converting with fg_convert when
 * the dtypes differ. dst holds `numel` elements, aligned for dst_dtype, and
 * numel must equal the entry's numel.
 * Returns FG_OK; FG_EINVAL (i out of range, bad dtype, NULL dst with
 * numel > 0); FG_EMISMATCH naming the entry if numel differs;
 * FG_EUNSUPPORTED if the entry's dtype is one fulgur lacks (its raw bytes
 * are still at fg_st_data). */
FG_API FG_MUST_USE fg_status fg_st_read(const fg_st_file *f, int64_t i, void *dst,
                                        fg_dtype dst_dtype, int64_t numel);

/* Copies elements [lo, hi) of entry i (0 <= lo <= hi <= its numel) into dst
 * as `dst_dtype`, converting as fg_st_read. dst is memory of `dev`
 * (device.h; NULL or the cpu: host memory) for hi - lo elements: on a
 * device the bytes go in with its copy calls, straight from the file's
 * mapping when the dtypes agree, else converted through a host staging
 * buffer of 4 MiB a piece at a time, so a load into a model on a device
 * never holds the model in host memory.
 * Returns FG_OK; FG_EINVAL naming the entry for a range outside it or a NULL
 * dst; the errors of fg_st_read; those of the device's copies. */
FG_API FG_MUST_USE fg_status fg_st_read_range_on(const fg_st_file *f, int64_t i, fg_dev *dev,
                                                 void *dst, fg_dtype dst_dtype, int64_t lo,
                                                 int64_t hi);

/* The metadata value of `key`, or NULL if absent; borrowed until
 * fg_st_close. */
FG_API const char *fg_st_meta_get(const fg_st_file *f, const char *key);

/* Number of metadata entries, and entry i in file order (*key and *value
 * borrowed until fg_st_close). fg_st_meta_at returns FG_EINVAL if i is out
 * of range (only then: not FG_MUST_USE, as fg_st_info_at). */
FG_API int64_t fg_st_meta_count(const fg_st_file *f);
FG_API fg_status fg_st_meta_at(const fg_st_file *f, int64_t i, const char **key,
                               const char **value);

#ifdef __cplusplus
}
#endif
#endif
