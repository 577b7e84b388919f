/* Private header of the data layer: the dataset struct shared by the
 * built-in kinds, and the file helpers. Invariants of a fg_dataset: len >= 0,
 * x and y are valid specs, xbytes/ybytes are their byte sizes (their products
 * with len were checked not to overflow), and get is only called with
 * 0 <= i < len. */
#ifndef FULGUR_DATA_IMPL_H
#define FULGUR_DATA_IMPL_H

#include "core/core_impl.h"
#include "fulgur/data.h"

struct fg_dataset {
    fg_dataset_ops ops;
    void *ud;
    char *name;
    int64_t len;
    fg_sample_spec x, y;
    size_t xbytes, ybytes;
    int64_t vocab_size;              /* text and token datasets, else 0 */
    const fg_text_vocab *text_vocab; /* text datasets: owned by ud */
};

/* A read-only mapping of a whole file (p == NULL and len == 0 for an empty
 * file), or a copy of it (`owned`) when the file says it is empty but is
 * not (the files of /proc and /sys report 0 bytes). */
typedef struct fg__map {
    const uint8_t *p;
    size_t len;
    bool owned;
} fg__map;

/* Maps `path` (a file reporting 0 bytes is read to its end instead, at
 * most FG__MAP_READ_MAX bytes); FG_EIO naming the path and the system's
 * reason. */
#define FG__MAP_READ_MAX ((size_t)1 << 30)
FG_MUST_USE fg_status fg__map_file(const char *path, fg__map *m);
void fg__unmap(fg__map *m);

/* Checks a spec (dtype, ndim, shape) and computes its bytes; FG_EINVAL
 * naming `what` ("x", "y") and `who` (dataset name). */
FG_MUST_USE fg_status fg__spec_check(const fg_sample_spec *s, const char *who, const char *what,
                                     size_t *bytes);

/* The file datasets' constructors with their status (the public _new
 * functions return NULL and leave only the message): *out is the dataset or
 * NULL. Tests use them to check the exact status. */
FG_MUST_USE fg_status fg__text_dataset_open(const char *path, int64_t ctx,
                                            const fg_text_vocab *vocab, fg_dataset **out);
FG_MUST_USE fg_status fg__token_dataset_open(const char *path, int64_t ctx, int64_t vocab,
                                             fg_dataset **out);
FG_MUST_USE fg_status fg__npy_dataset_open(const char *x_path, const char *y_path,
                                           fg_dataset **out);
FG_MUST_USE fg_status fg__idx_dataset_open(const char *images_path, const char *labels_path,
                                           fg_dataset **out);
FG_MUST_USE fg_status fg__csv_dataset_open(const char *path, const fg_csv_opts *o,
                                           fg_dataset **out);

/* A fields dataset: the user's table, and an fg_dataset whose x is one
 * packed sample (FG_U8, rec bytes): nfields int64 lengths, then field k's
 * largest data at off[k] (each a multiple of 8 bytes, so that every field is
 * aligned in a loader's batch tensor); y is a U8 scalar left 0. */
struct fg_fields_dataset {
    fg_fields_ops ops;
    void *ud;
    char *name;
    int nfields;
    fg_field_spec *fields; /* names owned */
    size_t *off, *bytes;   /* bytes: the largest size of field k */
    size_t *row;           /* bytes of one step of the first dimension (a whole fixed field) */
    size_t rec;
    fg_dataset *packed;
    fg_dataset *base; /* fg_fields_dataset_from: borrowed */
};

/* Points out[0, nfields) at the fields of the packed sample rec. */
void fg__fields_unpack(const fg_fields_dataset *fd, const uint8_t *rec, fg_sample_field *out);

/* The collate output: the batch's named tensors, reused from batch to batch
 * (cap: the bytes each tensor's memory holds). */
struct fg_collate_out {
    int n, cap;
    char **names;
    fg_tensor **t;
    size_t *capb;
};
void fg__collate_out_free(fg_collate_out *out);

/* How many times the loader was repositioned (set_epoch, reset,
 * set_position, set_sampler): a loader above it sees that it moved. */
uint64_t fg__dataloader_moves(const fg_dataloader *dl);
/* Makes fg_dataloader_next on dl (a fields loader's own) go through fl's
 * collate, and fg_dataloader_status tell its failure (fields_loader.c). */
void fg__dataloader_set_fields(fg_dataloader *dl, fg_fields_loader *fl);
/* fg_dataloader_next of the loader's own samples (no collate). */
fg_batch *fg__dataloader_next_samples(fg_dataloader *dl);
/* fl's collate failure, FG_OK when none is pending. */
FG_MUST_USE fg_status fg__fields_loader_collate_status(const fg_fields_loader *fl);

/* A stream and one shard of it: every `step`-th sample of an epoch's
 * stream from `first` on (fg__shard_next; x == NULL passes over one).
 * A shard's iterator belongs to one thread at a time. */
struct fg_stream {
    fg_stream_ops ops;
    void *ud;
    char *name;
    fg_sample_spec x, y;
    size_t xbytes, ybytes;
};

typedef struct fg__shard {
    void *it;
    bool open, ended;
    int64_t pos;     /* the stream index of the next sample the iterator gives */
    int64_t to_skip; /* samples to pass before this shard's next one */
    int64_t step;
    void *scratch; /* x then y, for a stream without skip */
} fg__shard;

FG_MUST_USE fg_status fg__shard_open(const fg_stream *s, fg__shard *sh, int64_t epoch,
                                     int64_t first, int64_t step);
/* The shard's next sample into x, y (NULL: passed over), its stream index
 * in *index; *got false at the end. */
FG_MUST_USE fg_status fg__shard_next(const fg_stream *s, fg__shard *sh, void *x, void *y,
                                     int64_t *index, bool *got);
void fg__shard_close(const fg_stream *s, fg__shard *sh);

/* Little-endian reads that never assume alignment. */
static inline uint16_t fg__le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t fg__le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint32_t fg__be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

#endif
