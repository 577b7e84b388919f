/* fulgur data: datasets, samplers and the prefetching loader.
 *
 * Three pieces, each behind a small table of functions so that a user's own
 * kind plugs in beside the built-in ones:
 *
 *   fg_dataset  - a fixed number of samples; sample i is an input x and a
 *                 target y of fixed dtypes and shapes, written by get(i) into
 *                 caller buffers. Built in: char-level text, uint16 token
 *                 files (nanoGPT / llm.c), .npy arrays, IDX (MNIST) files,
 *                 contiguous sub-ranges (train/val splits), and user callbacks.
 *   fg_sampler  - for an epoch, the sequence of dataset indices this rank
 *                 takes: sequential, random (a permutation by seed and epoch)
 *                 or distributed (PyTorch's DistributedSampler rule).
 *   fg_dataloader - stacks samples into batches (x (B, ...), y (B, ...)) in
 *                 persistent tensors it owns, optionally on background worker
 *                 threads that prepare the next batches while the caller
 *                 trains; resumable at any (epoch, batch).
 *
 * Beside them: a CSV/TSV reader (fg_csv_dataset_new, gzip through zlib),
 * batches of named fields with a collate function (fg_fields_dataset,
 * fg_fields_loader: a sample as a small dict of tensors, variable-length
 * fields padded with masks), and iterable (streaming) datasets split by
 * rank and loader worker (fg_stream, fg_stream_loader). docs/data.md has
 * each beside PyTorch's code.
 *
 * Determinism: the batches of an epoch are a pure function of the dataset,
 * the sampler (seed, epoch, rank, world size) and the batch size: the same on
 * any number of worker threads, synchronous or not, and after a resume.
 *
 * Typical loop:
 *
 *     fg_dataset *ds = fg_text_dataset_new("input.txt", 128, NULL);
 *     fg_dataloader *dl = fg_dataloader_new(ds, &(fg_loader_opts){
 *         .batch = 16, .shuffle = true, .seed = 1337, .num_workers = 1});
 *     for (int64_t epoch = 0; epoch < 3; epoch++) {
 *         fg_dataloader_set_epoch(dl, epoch);         // new order each epoch
 *         for (fg_batch *b; (b = fg_dataloader_next(dl)) != NULL; )
 *             train_step(b->x, b->y);                 // (16, 128) i32 each
 *         if (fg_dataloader_status(dl) != FG_OK) fail(fg_last_error());
 *     }
 *     fg_dataloader_free(dl);
 *     fg_dataset_free(ds);
 *
 * Thread safety: datasets and samplers are read-only after creation; the
 * built-in ones may be used from several threads at once. A loader is driven
 * by one thread at a time (its workers are internal). Nothing here is
 * collective: a distributed sampler only needs the same arguments on every
 * rank. */
#ifndef FULGUR_DATA_H
#define FULGUR_DATA_H

#include "fulgur/core.h"
#include "fulgur/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ================================================================ datasets */

/* The dtype and shape of one sample's x or y (without the batch dimension).
 * dtype FG_DTYPE_DEFAULT (0) means f32: fg_dataset_new fills it in, so the
 * specs a dataset reports always name a real dtype. ndim 0 is a scalar (one
 * element); at most FG_MAX_DIMS - 1 dims, so that a batch fits in a tensor. */
typedef struct fg_sample_spec {
    fg_dtype dtype;
    int ndim;
    int64_t shape[FG_MAX_DIMS];
} fg_sample_spec;

/* Elements / bytes of one sample of this spec. */
FG_API int64_t fg_sample_spec_numel(const fg_sample_spec *s);
FG_API size_t fg_sample_spec_bytes(const fg_sample_spec *s);

/* The dataset table. Every dataset, built-in or the user's, is one of these
 * with its own `ud` (user data):
 *   len:  the number of samples (>= 0). Called once, by fg_dataset_new.
 *   spec: fills the specs of x and y. Called once, by fg_dataset_new.
 *   get:  writes sample i (0 <= i < len, checked before the call) into x_out
 *         (fg_sample_spec_bytes(x) bytes, in row-major order) and y_out
 *         (likewise), each aligned to its dtype's size (samples sit one
 *         after another in the batch tensors). Returns FG_OK, or a status with a
 *         message set by fg_error (the loader passes both to its caller,
 *         prefixed with the sample and batch). A loader with num_workers > 1
 *         calls get from several threads at once, for distinct i: make it
 *         safe for that or use num_workers <= 1. Inside get,
 *         fg_data_worker_info() tells which worker runs and gives seeds.
 *   free: releases ud; called by fg_dataset_free (and by fg_dataset_new when
 *         it fails). May be NULL. */
typedef struct fg_dataset_ops {
    int64_t (*len)(void *ud);
    void (*spec)(void *ud, fg_sample_spec *x, fg_sample_spec *y);
    FG_MUST_USE fg_status (*get)(void *ud, int64_t i, void *x_out, void *y_out);
    void (*free)(void *ud);
} fg_dataset_ops;

typedef struct fg_dataset fg_dataset;

/* A dataset over the user's table (the callback dataset).
 *   ops:  copied; len, spec and get must be set.
 *   ud:   consumed (also on failure): ops->free(ud) runs once, in
 *         fg_dataset_free or before this call returns NULL (with no ops or
 *         no ops->free there is nothing to free it with).
 *   name: a short label for messages ("cifar-train"); copied; NULL = "user".
 * Returns NULL with FG_EINVAL (a missing function, a negative length, a bad
 * spec: invalid dtype, ndim outside 0..FG_MAX_DIMS-1, negative or
 * overflowing shape) or FG_ENOMEM. */
FG_API fg_dataset *fg_dataset_new(const fg_dataset_ops *ops, void *ud, const char *name);

/* Frees the dataset and what it owns (file maps, buffers, ud). NULL is a
 * no-op. Free subsets (fg_dataset_subset) and loaders over it first. */
FG_API void fg_dataset_free(fg_dataset *ds);

/* Number of samples. */
FG_API int64_t fg_dataset_len(const fg_dataset *ds);
/* Specs of x and y; borrowed, valid as long as the dataset. */
FG_API const fg_sample_spec *fg_dataset_x_spec(const fg_dataset *ds);
FG_API const fg_sample_spec *fg_dataset_y_spec(const fg_dataset *ds);
/* The label given at creation ("text", "tokens", "npy", "idx", "subset", or
 * the user's). */
FG_API const char *fg_dataset_name(const fg_dataset *ds);
/* The vocabulary size of a text or token dataset (or a subset of one): ids
 * in x and y are in [0, size). 0 for any other dataset. */
FG_API int64_t fg_dataset_vocab_size(const fg_dataset *ds);

/* Writes sample i into x_out and y_out (sizes as in the specs). Returns
 * FG_OK; FG_EINVAL if i is outside [0, len) or a buffer is NULL; else what
 * the dataset's get returns. Thread-safe for the built-in datasets. */
FG_API FG_MUST_USE fg_status fg_dataset_get(const fg_dataset *ds, int64_t i, void *x_out,
                                            void *y_out);

/* A view of samples [start, start + len) of `base` as a dataset of its own
 * (same specs). `base` is BORROWED: it must outlive the view. Returns NULL
 * with FG_EINVAL if the range is not inside base, or FG_ENOMEM. */
FG_API fg_dataset *fg_dataset_subset(fg_dataset *base, int64_t start, int64_t len);

/* Splits `base` into its leading samples (train) and its last
 * ceil(val_fraction * len) samples (val), two subset views (see
 * fg_dataset_subset; base is borrowed by both). For a text or token dataset
 * these are the last windows of the file, as nanoGPT's last 10%.
 *   val_fraction: in [0, 1); 0 gives an empty val.
 * Returns FG_OK; FG_EINVAL if val_fraction is outside [0, 1) or train would
 * be empty (the message gives the counts); FG_ENOMEM. On failure *train and
 * *val are NULL. (The status form, as core.h's conventions allow a call
 * that makes two objects.) */
FG_API FG_MUST_USE fg_status fg_dataset_split(fg_dataset *base, double val_fraction,
                                              fg_dataset **train, fg_dataset **val);

/* ------------------------------------------------------------ text (char) */

/* A character-level (byte-level) vocabulary: id k is the byte
 * fg_text_vocab_bytes(v)[k]. One built from a text is the sorted set of its
 * distinct bytes, as nanoGPT's shakespeare_char (multi-byte UTF-8 characters
 * are several tokens). Read-only after creation: thread-safe. */
typedef struct fg_text_vocab fg_text_vocab;

/* A vocabulary of the n distinct bytes `bytes`, id k = bytes[k] (any order;
 * this is how a checkpoint restores the vocabulary of its training text).
 * Returns NULL with FG_EINVAL (n outside 1..256, a repeated byte) or
 * FG_ENOMEM. Free with fg_text_vocab_free. */
FG_API fg_text_vocab *fg_text_vocab_new(const uint8_t *bytes, int n);
/* The sorted set of the distinct bytes of text[0, n). NULL with FG_EINVAL
 * for an empty text, or FG_ENOMEM. */
FG_API fg_text_vocab *fg_text_vocab_from_text(const void *text, size_t n);
FG_API void fg_text_vocab_free(fg_text_vocab *v); /* NULL is a no-op */
/* Number of ids (1..256). */
FG_API int fg_text_vocab_size(const fg_text_vocab *v);
/* The bytes in id order (fg_text_vocab_size of them); borrowed, valid as long
 * as v. Save these to restore the vocabulary with fg_text_vocab_new. */
FG_API const uint8_t *fg_text_vocab_bytes(const fg_text_vocab *v);
/* The id of `byte`, or -1 if it is not in the vocabulary. */
FG_API int32_t fg_text_vocab_id(const fg_text_vocab *v, uint8_t byte);
/* Encodes s[0, len) into out[0, len). Returns FG_OK, or FG_EINVAL naming the
 * first byte not in the vocabulary and its position (out is then partly
 * written). */
FG_API FG_MUST_USE fg_status fg_text_vocab_encode(const fg_text_vocab *v, const char *s, size_t len,
                                                  int32_t *out);
/* Decodes ids[0, n) into out[0, n) and writes out[n] = '\0' (out holds n + 1
 * bytes; the text may itself contain NUL bytes). Returns FG_OK, or FG_EINVAL
 * naming the first id outside [0, size) and its position. */
FG_API FG_MUST_USE fg_status fg_text_vocab_decode(const fg_text_vocab *v, const int32_t *ids,
                                                  int64_t n, char *out);

/* A char-level text dataset: the bytes of `path` encoded by a vocabulary,
 * cut into non-overlapping windows of ctx tokens. Sample i starts at
 * s = i * ctx: x = tokens[s, s + ctx), y = tokens[s + 1, s + ctx + 1), both
 * (ctx) FG_I32; len = (ntokens - 1) / ctx.
 *   path:  a file, or a folder whose regular files (symlinks followed) are
 *          concatenated in byte order of their names; hidden files (".x")
 *          and the fortune index files "*.dat" and "*.u8" are skipped, and
 *          subfolders are not entered. Debian's /usr/share/games/fortunes
 *          is such a folder.
 *   ctx:   window length, >= 1.
 *   vocab: NULL to build the vocabulary from the text; else the vocabulary
 *          to use (copied; e.g. the training text's for a validation file or
 *          one restored from a checkpoint).
 * Returns NULL with FG_EIO (missing or unreadable path, naming it and the
 * system's reason), FG_EINVAL (ctx < 1; the text has fewer than ctx + 1
 * bytes; an empty folder; a byte outside the given vocabulary, naming the
 * file, the byte and its offset) or FG_ENOMEM. The text is held in memory. */
FG_API fg_dataset *fg_text_dataset_new(const char *path, int64_t ctx, const fg_text_vocab *vocab);

/* The vocabulary of a text dataset (or of a subset of one); borrowed, valid
 * as long as the dataset. NULL for any other dataset. */
FG_API const fg_text_vocab *fg_text_dataset_vocab(const fg_dataset *ds);

/* ------------------------------------------------------- uint16 token file */

/* The magic number of llm.c's token files ("header[0]"). */
#define FG_LLMC_TOKEN_MAGIC 20240520

/* A dataset over a file of uint16 token ids, windowed exactly as the text
 * dataset (x, y (ctx) FG_I32, sample i starts at token i * ctx).
 * Two layouts are read:
 *   - nanoGPT's train.bin: nothing but little-endian uint16 ids;
 *   - llm.c's: a header of 256 little-endian int32 with header[0] =
 *     FG_LLMC_TOKEN_MAGIC, header[1] = 1 (version) and header[2] = the token
 *     count, then the ids. A file whose first int32 is the magic is taken as
 *     this layout (a raw file starting with ids 54952, 308 would be misread).
 *   vocab: the vocabulary size, or 0 for max id + 1. With vocab > 0 an id
 *          >= vocab is an error.
 * The file is mapped (mmap), not read into memory, and scanned once.
 * Returns NULL with FG_EIO (missing or unreadable file), FG_EFORMAT naming the
 * file and the problem (odd size, header count disagreeing with the size, an
 * unknown llm.c version, an id >= vocab with its position), FG_EINVAL
 * (ctx < 1, vocab < 0, fewer than ctx + 1 tokens) or FG_ENOMEM. */
FG_API fg_dataset *fg_token_dataset_new(const char *path, int64_t ctx, int64_t vocab);

/* ------------------------------------------------------------------- npy */

/* A dataset over two .npy files (NumPy's format, versions 1.0, 2.0, 3.0):
 *   x_path: inputs of shape (N, D...) (1 to FG_MAX_DIMS dims), dtype f4,
 *           f8 or u1 ('<f4', '<f8', '|u1'); x is one row (D...) as FG_F32
 *           (f8 rounds, u1 converts 0..255 exactly, without scaling);
 *   y_path: labels of shape (N,) of any integer dtype (i1..i8, u1..u8); y is
 *           a scalar FG_I32. Every label must fit in int32.
 * The header dict must have exactly the keys descr, fortran_order (False) and
 * shape; big-endian data, fortran order, object arrays, a truncated data
 * part, a shape whose size overflows and N differing between the files are
 * refused. The files are mapped (mmap); labels are checked and converted once.
 * Returns NULL with FG_EIO (missing or unreadable file), FG_EFORMAT with a
 * message naming the file and the problem, or FG_ENOMEM. */
FG_API fg_dataset *fg_npy_dataset_new(const char *x_path, const char *y_path);

/* ------------------------------------------------------------------- idx */

/* A dataset over IDX files (the layout of MNIST and Fashion-MNIST, not
 * gzipped): images of unsigned bytes with magic 0x00000803 or 0x00000802 and
 * shape (N, d1, ...), labels with magic 0x00000801 and shape (N). x is one
 * image flattened to (d1 * d2 ...) FG_F32 scaled to [0, 1] (byte / 255, as
 * torchvision's ToTensor); y is a scalar FG_I32.
 * Returns NULL with FG_EIO, FG_EFORMAT naming the file and the problem (a
 * gzipped file says to gunzip it first; bad magic, truncated data, counts
 * that differ) or FG_ENOMEM. */
FG_API fg_dataset *fg_idx_dataset_new(const char *images_path, const char *labels_path);

/* ------------------------------------------------------------- CSV / TSV */

/* How a CSV column is read. FG_CSV_AUTO (0) infers it from the column's
 * values (missing ones left out): all integers -> FG_CSV_INT, all numbers ->
 * FG_CSV_FLOAT, else FG_CSV_CATEGORY. */
typedef enum fg_csv_type {
    FG_CSV_AUTO = 0,
    FG_CSV_FLOAT,    /* a decimal or exponent number, "nan", "inf" (strtod's syntax) */
    FG_CSV_INT,      /* a decimal integer that fits in int32 */
    FG_CSV_CATEGORY, /* any text; the value is the index of the text in the sorted
                        (byte order) set of the column's distinct texts */
    FG_CSV_SKIP,     /* neither a feature nor the label; never parsed */
} fg_csv_type;

/* The type of one column, by its header name. */
typedef struct fg_csv_column {
    const char *name;
    fg_csv_type type;
} fg_csv_column;

/* CSV reader options; all zero = comma (tab for a name ending in .tsv or
 * .tsv.gz), a header row, the last column is the label, every other column
 * a feature, types inferred, a missing value is an error. */
typedef struct fg_csv_opts {
    char sep;                    /* field separator; 0 = by the name as above */
    bool no_header;              /* the first row is data; columns are named "0", "1", ... */
    const char *label;           /* the label column's name; NULL = the last column */
    const char *const *features; /* the feature columns in x's order (nfeatures names);
                                    NULL = every column but the label and the skipped */
    int nfeatures;
    const fg_csv_column *columns; /* types of some columns (ncolumns); the others AUTO */
    int ncolumns;
    bool fill_missing; /* a missing value (an empty field) reads as fill_value instead
                          of an error; in a category column it is the category "" */
    double fill_value;
} fg_csv_opts;

/* A dataset over a CSV or TSV file with a header row (RFC 4180: fields may
 * be quoted with ", a quote inside one is doubled, a quoted field may hold
 * separators and line breaks; records end in LF or CRLF; blank lines are
 * skipped, as pandas does). A gzip-compressed file (any name) is read as it
 * is, through zlib. Every record must have as many fields as the header.
 * Sample i is data row i:
 *   x: (nfeatures) FG_F32, the feature columns in order (an int column
 *      converted, a category column its index);
 *   y: a scalar, FG_I32 for an int or category label, FG_F32 for a float one.
 * The whole file is parsed at creation and held as these arrays.
 * Returns NULL with FG_EIO (missing or unreadable file, a corrupt gzip
 * stream), FG_EFORMAT (a message naming the file, the line, the column and
 * the value: a bad number, a missing value, an unterminated quote, a record
 * of the wrong length, no data rows), FG_EINVAL (an option naming a column
 * the header lacks, the label skipped or among the features, a repeated
 * name) or FG_ENOMEM. */
FG_API fg_dataset *fg_csv_dataset_new(const char *path, const fg_csv_opts *o);

/* The names of a CSV dataset's feature columns in x's order and of its
 * label column (borrowed, valid as long as the dataset); NULL for any other
 * dataset or k outside [0, nfeatures). */
FG_API const char *fg_csv_dataset_feature(const fg_dataset *ds, int64_t k);
FG_API const char *fg_csv_dataset_label(const fg_dataset *ds);
/* The text of category k of column `column` of a CSV dataset (borrowed);
 * NULL if the column is no category column of it or k is out of range. */
FG_API const char *fg_csv_dataset_category(const fg_dataset *ds, const char *column, int64_t k);
/* The number of categories of that column; 0 if it is none. */
FG_API int64_t fg_csv_dataset_num_categories(const fg_dataset *ds, const char *column);

/* ---------------------------------------------------------- image folders */

/* torchvision's ImageFolder over root/<class>/.../<image>: the classes are
 * the sorted names of root's sub-folders (class k = the k-th), the samples
 * every .png, .jpg and .jpeg below each (any depth, case-insensitive
 * extension), sorted by path within a class, as torchvision's
 * make_dataset lists them. PNG is decoded by libspng, JPEG by libjpeg-turbo
 * (the library PIL uses, with its defaults), to 8-bit RGB (grayscale and
 * palette images expanded, alpha dropped, as PIL's convert("RGB")). The
 * transforms are torchvision's on a PIL image, in this order, in the get
 * call (so in the loader's worker threads):
 *   resize:   Resize(n) (the shorter side to n, the longer int(n * long /
 *             short)), or resize_h x resize_w; PIL's bilinear resampling
 *             (Image.resize(BILINEAR): its filter support scaled on
 *             downsampling, 22-bit fixed-point weights, two 8-bit passes);
 *   crop:     CenterCrop(crop) (offsets rounded half to even, as Python's
 *             round), or with random_crop RandomCrop(crop);
 *   flip:     RandomHorizontalFlip(0.5) with random_flip;
 *   ToTensor: x (3, H, W) FG_F32, value / 255 (in f32);
 *   Normalize(mean, std) when any std is non-zero: (x - mean) / std (f32).
 * The random ones draw from (seed, epoch, index): fg_image_folder_set_epoch
 * changes them each epoch (call it from on_train_epoch_start). y is the
 * class, FG_I32. Every sample must end at one size: give crop or resize_h x
 * resize_w, or use images of one size (a different one is an FG_EFORMAT
 * naming the file at get). Returns NULL with FG_EIO (root unreadable),
 * FG_EFORMAT (no class folder, no image, or a file that does not decode,
 * named, at get), FG_EINVAL (a bad option) or FG_ENOMEM. */
typedef struct fg_image_folder_opts {
    int64_t resize;             /* the shorter side to this; 0: none */
    int64_t resize_h, resize_w; /* or this exact size (both); 0: none */
    int64_t crop;               /* a crop x crop square; 0: none */
    bool random_crop;           /* RandomCrop instead of CenterCrop */
    bool random_flip;           /* RandomHorizontalFlip(p=0.5) */
    double mean[3], std[3];     /* Normalize; all std 0: none */
    uint64_t seed;              /* the random transforms' seed */
} fg_image_folder_opts;
FG_API fg_dataset *fg_image_folder_new(const char *root, const fg_image_folder_opts *o);
/* The class names (borrowed; NULL out of range) and their count. */
FG_API const char *fg_image_folder_class(const fg_dataset *ds, int64_t k);
FG_API int64_t fg_image_folder_num_classes(const fg_dataset *ds);
/* The file of sample i (borrowed; NULL out of range or another dataset). */
FG_API const char *fg_image_folder_path(const fg_dataset *ds, int64_t i);
/* The epoch the random transforms draw from (0 at first). */
FG_API void fg_image_folder_set_epoch(fg_dataset *ds, int64_t epoch);

/* ================================================================ samplers */

/* The sampler table: the indices a rank takes in an epoch.
 *   len:     the number of indices per epoch (>= 0, the same every epoch).
 *            Called once, by fg_sampler_new.
 *   indices: writes the len indices of `epoch` (each in [0, dataset length);
 *            the loader checks) into out. Must be a pure function of epoch
 *            (resume relies on it).
 *   free:    releases ud; may be NULL. */
typedef struct fg_sampler_ops {
    int64_t (*len)(void *ud);
    FG_MUST_USE fg_status (*indices)(void *ud, int64_t epoch, int64_t *out);
    void (*free)(void *ud);
} fg_sampler_ops;

typedef struct fg_sampler fg_sampler;

/* A sampler over the user's table. ops copied; ud consumed (also on
 * failure): ops->free(ud) runs once, in fg_sampler_free or before this
 * returns NULL. Its rank is 0, world 1, and every index counts as real (not
 * padding). NULL with FG_EINVAL (a missing len or indices, a negative
 * length) or FG_ENOMEM. */
FG_API fg_sampler *fg_sampler_new(const fg_sampler_ops *ops, void *ud);

/* 0, 1, ..., n - 1 every epoch. NULL with FG_EINVAL (n < 0) or FG_ENOMEM. */
FG_API fg_sampler *fg_sampler_sequential(int64_t n);

/* A permutation of 0..n-1 that depends only on (seed, epoch): Fisher-Yates
 * driven by the counter-based RNG with seed fg_rng_derive(seed, epoch), so
 * the same on every rank, thread count and machine. NULL with FG_EINVAL or
 * FG_ENOMEM. */
FG_API fg_sampler *fg_sampler_random(int64_t n, uint64_t seed);

/* Options of the distributed sampler; all zero = no shuffle, seed 0, pad. */
typedef struct fg_distributed_opts {
    bool shuffle;   /* permute by (seed, epoch) as fg_sampler_random; else 0..n-1 */
    uint64_t seed;  /* the same on every rank */
    bool drop_last; /* drop the tail to a multiple of world instead of padding */
    int64_t block;  /* consecutive positions dealt to a rank at a time; 0 = 1 (PyTorch's rule) */
    int64_t round;  /* with drop_last: cut the list to a multiple of this many samples (0 =
                       block * world; else a multiple of block * world): the deterministic
                       mode's global batch, so that an epoch holds whole optimizer steps */
} fg_distributed_opts;

/* PyTorch's DistributedSampler, with fulgur's permutation:
 *   1. the list 0..n-1, shuffled by (seed, epoch) if o->shuffle (the same
 *      permutation as fg_sampler_random(n, seed));
 *   2. without drop_last, padded to total = ceil(n / world) * world by
 *      repeating the list from its start (cyclically if n < total - n);
 *      with drop_last, cut to total = floor(n / world) * world;
 *   3. rank r takes positions r, r + world, r + 2 world, ... < total.
 * With o->block = k > 1 the list is dealt in blocks of k consecutive
 * positions instead: rank r takes blocks r, r + world, ... (positions
 * ((j / k) * world + r) * k + j % k for its j-th index), the total is a
 * multiple of k * world (o->round with drop_last), and each block is a
 * micro-batch whose samples do not depend on the world size (the
 * deterministic mode, fabric.h). Either way, after every rank took j
 * indices (j a multiple of k), what they took together is the prefix of
 * the list of length j * world: a position in samples that maps onto any
 * other world size (fg_dataloader_set_sample_position).
 * Every rank gets total / world indices, so DDP ranks run the same number of
 * steps and never wait on each other. Padding samples are the last ones of a
 * rank's list: fg_sampler_num_real tells how many come first, and the
 * loader's fg_batch.valid marks them, so that evaluation can leave them out.
 *   n: dataset length >= 0; rank in [0, world); world >= 1; o: NULL = zeros.
 * NULL with FG_EINVAL naming the bad value (a negative block or round, a
 * round that is no multiple of block * world), or FG_ENOMEM. Not
 * collective. */
FG_API fg_sampler *fg_sampler_distributed(int64_t n, int rank, int world,
                                          const fg_distributed_opts *o);

FG_API void fg_sampler_free(fg_sampler *s); /* NULL is a no-op */
/* Indices per epoch for this rank. */
FG_API int64_t fg_sampler_len(const fg_sampler *s);
/* How many of the leading indices of each epoch are real samples; the rest
 * (distributed padding) repeat earlier ones. == len except for padding. */
FG_API int64_t fg_sampler_num_real(const fg_sampler *s);
/* The rank and world size this sampler serves (0 and 1 unless distributed). */
FG_API int fg_sampler_rank(const fg_sampler *s);
FG_API int fg_sampler_world(const fg_sampler *s);
/* Writes the fg_sampler_len indices of `epoch` (>= 0) into out. FG_OK,
 * FG_EINVAL (epoch < 0, NULL out) or what a user sampler returns. */
FG_API FG_MUST_USE fg_status fg_sampler_indices(fg_sampler *s, int64_t epoch, int64_t *out);

/* ================================================================== loader */

/* Loader options; all zero = batch 1, in order, seed 0, keep the last short
 * batch, synchronous. */
typedef struct fg_loader_opts {
    int64_t batch;   /* samples per batch; 0 = 1 */
    bool shuffle;    /* a random sampler by (seed, epoch); else sequential */
    uint64_t seed;   /* shuffle seed, and the root of the worker seeds; 0 = fg_default_seed()
                        at fg_dataloader_new (0 unless seed_everything set it) */
    bool drop_last;  /* drop the last batch of an epoch if it is short */
    int num_workers; /* background threads preparing batches; 0 = none: the
                        caller's thread reads each batch inside next() */
    int prefetch;    /* batches prepared ahead of the one the caller holds,
                        with workers; 0 = 2 * num_workers */
} fg_loader_opts;

/* One batch: samples stacked along a new first dimension. Everything in it
 * is owned by the loader and valid until the next fg_dataloader_next,
 * set_epoch, reset, set_position, set_sampler or free call on it. */
typedef struct fg_batch {
    fg_tensor *x;           /* (size, x spec...) persistent tensor */
    fg_tensor *y;           /* (size, y spec...) persistent tensor */
    int64_t size;           /* samples in this batch (the last may be short) */
    int64_t valid;          /* leading samples that are not distributed padding */
    int64_t epoch;          /* the epoch it belongs to */
    int64_t index;          /* its position in the epoch, 0-based */
    const int64_t *indices; /* the dataset index of each sample (size of them) */
    /* from a fields loader's loader (fg_fields_loader_loader): the batch's
     * named tensors (x and y are its first two); else NULL */
    const struct fg_fields_batch *fields;
} fg_batch;

typedef struct fg_dataloader fg_dataloader;

/* A loader over `ds` (borrowed, not consumed: it must outlive the loader,
 * and the caller frees it after fg_dataloader_free). Positioned at
 * (epoch 0, batch 0); worker threads, if any, start at once and begin reading
 * the first batches. Returns NULL with FG_EINVAL (batch < 0, num_workers or
 * prefetch < 0 or absurdly large), FG_EIO (a thread could not be started) or
 * FG_ENOMEM. Buffers: (prefetch + 1) batches of x and y. */
FG_API fg_dataloader *fg_dataloader_new(fg_dataset *ds, const fg_loader_opts *o);

/* Stops and joins the workers, frees the batches and the sampler. A worker
 * inside the dataset's get finishes that sample first. NULL is a no-op. */
FG_API void fg_dataloader_free(fg_dataloader *dl);

/* Replaces the sampler (how the DDP strategy installs
 * fg_sampler_distributed). s is consumed (also on failure): the loader owns
 * it from now on, and a call that fails frees it (the loader then keeps its
 * previous sampler). The position goes to (current epoch, batch 0).
 * Returns FG_OK; FG_EINVAL (a NULL dl, or an index outside the dataset,
 * naming it); what the sampler returns; FG_ENOMEM. A NULL s (its
 * constructor failed) returns that failure's status with its message kept,
 * so fg_dataloader_set_sampler(dl, fg_sampler_...(...)) reports the real
 * cause. */
FG_API FG_MUST_USE fg_status fg_dataloader_set_sampler(fg_dataloader *dl, fg_sampler *s);

/* Goes to batch 0 of `epoch` (>= 0), whose order the sampler gives (with
 * shuffle, a new permutation: call it at the start of every epoch, as
 * DistributedSampler.set_epoch). Clears a previous error. Returns FG_OK,
 * FG_EINVAL, or a sampler's error. */
FG_API FG_MUST_USE fg_status fg_dataloader_set_epoch(fg_dataloader *dl, int64_t epoch);

/* Goes back to batch 0 of the current epoch (same order). Clears an error. */
FG_API FG_MUST_USE fg_status fg_dataloader_reset(fg_dataloader *dl);

/* The next batch of the epoch, or NULL when the epoch is over or a read
 * failed; fg_dataloader_status tells which. After the end it keeps
 * returning NULL until set_epoch / reset / set_position. On failure
 * fg_last_error() on the calling thread holds the message (from the worker
 * thread if one failed), prefixed with the dataset, sample, batch and epoch,
 * and later calls return NULL with the same status and message. */
FG_API fg_batch *fg_dataloader_next(fg_dataloader *dl);

/* FG_OK while batches come and after a normal end of epoch; the error status
 * after a failed fg_dataloader_next. */
FG_API FG_MUST_USE fg_status fg_dataloader_status(const fg_dataloader *dl);

/* Batches per epoch for this rank: ceil(n / batch), or floor with drop_last,
 * n = samples per epoch for this rank (fg_dataloader_num_samples). */
FG_API int64_t fg_dataloader_len(const fg_dataloader *dl);
FG_API int64_t fg_dataloader_num_samples(const fg_dataloader *dl);

/* The resumable position: the epoch and the index of the batch the next
 * fg_dataloader_next will return (== fg_dataloader_len once the epoch is
 * over). Save it with a checkpoint after the step that used a batch; a new
 * loader with the same dataset, options and sampler, set to that position,
 * returns exactly the batches the old one would have. */
FG_API void fg_dataloader_position(const fg_dataloader *dl, int64_t *epoch, int64_t *batch);
/* Goes to (epoch >= 0, batch in [0, len]). Clears an error. FG_EINVAL naming
 * the bad value, or a sampler's error. */
FG_API FG_MUST_USE fg_status fg_dataloader_set_position(fg_dataloader *dl, int64_t epoch,
                                                        int64_t batch);

/* The position as a count of samples of the epoch's order that every rank
 * together has taken: batch * batch size * the sampler's world. Under the
 * distributed sampler these are the leading samples of the epoch's order
 * (the prefix property above), so the count means the same on any world
 * size: the elastic resume saves it. */
FG_API void fg_dataloader_sample_position(const fg_dataloader *dl, int64_t *epoch,
                                          int64_t *samples);
/* Goes to the batch after which every rank together has taken `samples`
 * samples of epoch's order, on this loader's world size: the remaining
 * samples of the epoch are dealt to this loader's ranks, none skipped, none
 * twice. FG_EINVAL when samples is negative, past the epoch, or not a
 * multiple of batch size * world (naming them and what would fit), or what
 * fg_dataloader_set_position returns. */
FG_API FG_MUST_USE fg_status fg_dataloader_set_sample_position(fg_dataloader *dl, int64_t epoch,
                                                               int64_t samples);

/* The dataset, options (as given, defaults not filled in except a seed of 0,
 * which reads as the fg_default_seed() it stood for) and sampler of a
 * loader; borrowed, valid as long as the loader (the sampler until
 * set_sampler). */
FG_API fg_dataset *fg_dataloader_dataset(const fg_dataloader *dl);
FG_API const fg_loader_opts *fg_dataloader_opts(const fg_dataloader *dl);
FG_API const fg_sampler *fg_dataloader_sampler(const fg_dataloader *dl);

/* ================================================= batches of named fields */

/* A sample as a small dict of tensors: a fields dataset declares its fields
 * (name, dtype, shape; the first dimension may vary from sample to sample)
 * and writes sample i field by field; a fields loader reads samples as the
 * loader above does (the same samplers, workers, positions and resume: it
 * runs an fg_dataloader over the packed samples) and turns each batch's
 * samples into named tensors with a collate function, by default stacking
 * fixed fields and padding variable ones to the batch's longest with a
 * "<name>_mask" field beside them. An (x, y) dataset is the two-field case
 * (fg_fields_dataset_from).
 *
 *     fg_field_spec f[] = {{.name = "tokens", .dtype = FG_I32, .ndim = 1,
 *                           .shape = {FG_FIELD_VAR}, .max_len = 512},
 *                          {.name = "label", .dtype = FG_I32}};
 *     fg_fields_dataset *fd = fg_fields_dataset_new(&ops, ud, f, 2, "reviews");
 *     fg_fields_loader *fl = fg_fields_loader_new(fd, &(fg_fields_loader_opts){
 *         .loader = {.batch = 32, .shuffle = true, .num_workers = 2}});
 *     for (fg_fields_batch *b; (b = fg_fields_loader_next(fl)) != NULL; ) {
 *         fg_tensor *tok = fg_fields_batch_get(b, "tokens");       // (32, L) i32
 *         fg_tensor *mask = fg_fields_batch_get(b, "tokens_mask"); // (32, L) u8
 *         ...
 *     }
 */

/* shape[0] of a field whose first dimension varies between samples. */
#define FG_FIELD_VAR (-1)

/* One field of a sample. The batch adds a dimension, so ndim is at most
 * FG_MAX_DIMS - 1. dtype 0 means f32. */
typedef struct fg_field_spec {
    const char *name; /* unique in the dataset; copied. Not ending in "_mask" */
    fg_dtype dtype;
    int ndim;                   /* 0 (a scalar) .. FG_MAX_DIMS - 1 */
    int64_t shape[FG_MAX_DIMS]; /* shape[0] may be FG_FIELD_VAR (ndim >= 1) */
    int64_t max_len;            /* with FG_FIELD_VAR: the longest first dimension a
                                   sample may have (buffers are sized by it) */
} fg_field_spec;

/* One field of one sample as get writes it and collate reads it. */
typedef struct fg_sample_field {
    void *data;  /* the field's elements in row-major order; for get a buffer of
                    the field's largest size, aligned to 8 bytes */
    int64_t len; /* the first dimension: get sets it for a variable field (it is
                    max_len on entry, and must end in [0, max_len]); shape[0]
                    (1 for a scalar) for a fixed one */
} fg_sample_field;

/* The table of a fields dataset (as fg_dataset_ops): get writes sample i
 * into fields[0, nfields) (data and, for variable fields, len). It runs on
 * loader workers, from several threads at once with num_workers > 1. */
typedef struct fg_fields_ops {
    int64_t (*len)(void *ud);
    FG_MUST_USE fg_status (*get)(void *ud, int64_t i, fg_sample_field *fields);
    void (*free)(void *ud);
} fg_fields_ops;

typedef struct fg_fields_dataset fg_fields_dataset;

/* A dataset of samples with the nfields (1..64) fields `fields` (copied).
 * ops copied (len and get must be set); ud consumed as by fg_dataset_new.
 * NULL with FG_EINVAL naming the field and the problem (no name, a repeated
 * name, a name ending in "_mask", a bad dtype or shape, FG_FIELD_VAR not
 * first or without max_len >= 1) or FG_ENOMEM. */
FG_API fg_fields_dataset *fg_fields_dataset_new(const fg_fields_ops *ops, void *ud,
                                                const fg_field_spec *fields, int nfields,
                                                const char *name);
/* The (x, y) dataset `ds` (borrowed: it must outlive the result) as a fields
 * dataset of two fixed fields named "x" and "y" with its specs. */
FG_API fg_fields_dataset *fg_fields_dataset_from(fg_dataset *ds);
FG_API void fg_fields_dataset_free(fg_fields_dataset *fd); /* NULL is a no-op */
FG_API int64_t fg_fields_dataset_len(const fg_fields_dataset *fd);
FG_API int fg_fields_dataset_nfields(const fg_fields_dataset *fd);
/* Field k's spec (borrowed, its name too, valid as long as fd); NULL outside
 * [0, nfields). */
FG_API const fg_field_spec *fg_fields_dataset_field(const fg_fields_dataset *fd, int k);

/* A batch of named tensors, owned by its loader and valid until the next
 * fg_fields_loader_next or free, or any call repositioning the loader under
 * it. size, valid, epoch, index and indices as in fg_batch. */
typedef struct fg_fields_batch {
    int nfields;
    const char *const *names;  /* nfields names */
    fg_tensor *const *tensors; /* the tensor of each name, persistent */
    int64_t size, valid, epoch, index;
    const int64_t *indices;
} fg_fields_batch;

/* The tensor named `name` in b, or NULL. */
FG_API fg_tensor *fg_fields_batch_get(const fg_fields_batch *b, const char *name);

/* Where a collate function puts the batch: fg_collate_tensor hands it the
 * next named tensor to fill. */
typedef struct fg_collate_out fg_collate_out;

/* A new tensor `name` of the batch being made, of dtype dt (a real dtype)
 * and shape[0, ndim), contents undefined: the collate function fills it. The
 * loader owns it (and reuses its memory from batch to batch). NULL with
 * FG_EINVAL (a name already given in this batch, a bad dtype or shape) or
 * FG_ENOMEM. */
FG_API fg_tensor *fg_collate_tensor(fg_collate_out *out, const char *name, fg_dtype dt, int ndim,
                                    const int64_t *shape);

/* A collate function: makes the batch of the n samples
 * samples[j * nfields + k] (sample j's field k, read-only, valid during the
 * call) through fg_collate_tensor. Runs on the thread calling
 * fg_fields_loader_next. Returns FG_OK or a status with a message. */
typedef FG_MUST_USE fg_status (*fg_collate_fn)(void *ud, const fg_fields_dataset *fd,
                                               const fg_sample_field *samples, int64_t n,
                                               fg_collate_out *out);

/* Options of the default collate; all zero = pad with 0, with masks. */
typedef struct fg_collate_opts {
    double pad_value; /* what padded positions of a variable field hold (converted
                         to the field's dtype) */
    bool no_mask;     /* leave out the "<name>_mask" fields */
} fg_collate_opts;

/* The default collate (ud: a const fg_collate_opts *, or NULL for zeros).
 * In field order, each fixed field becomes (n, shape...) stacked as the
 * loader stacks x; each variable field becomes (n, L, shape[1:]...) with
 * L the batch's longest len, sample j's rows [len_j, L) set to pad_value,
 * followed (unless no_mask) by "<name>_mask": (n, L) FG_U8, 1 for a real
 * row and 0 for padding (PyTorch's pad_sequence with batch_first and its
 * attention mask). A custom collate may call it first and add fields. */
FG_API FG_MUST_USE fg_status fg_collate_default(void *ud, const fg_fields_dataset *fd,
                                                const fg_sample_field *samples, int64_t n,
                                                fg_collate_out *out);

/* Fields loader options: the loader's, and the collate function with its ud
 * (NULL = fg_collate_default with &collate_opts). */
typedef struct fg_fields_loader_opts {
    fg_loader_opts loader;
    fg_collate_fn collate;
    void *collate_ud;
    fg_collate_opts collate_opts;
} fg_fields_loader_opts;

typedef struct fg_fields_loader fg_fields_loader;

/* A loader over `fd` (borrowed; it must outlive the loader). NULL with what
 * fg_dataloader_new returns, or FG_ENOMEM. */
FG_API fg_fields_loader *fg_fields_loader_new(fg_fields_dataset *fd,
                                              const fg_fields_loader_opts *o);
FG_API void fg_fields_loader_free(fg_fields_loader *fl); /* NULL is a no-op */

/* The next batch, or NULL at the end of the epoch or on a failure (a
 * sample's get, or the collate function: the message names the batch and
 * epoch); fg_fields_loader_status tells which. After a collate failure the
 * loader keeps returning NULL with the same error until it is repositioned. */
FG_API fg_fields_batch *fg_fields_loader_next(fg_fields_loader *fl);
FG_API FG_MUST_USE fg_status fg_fields_loader_status(const fg_fields_loader *fl);

/* The sample loader under fl (borrowed, valid as long as fl): set_epoch,
 * set_sampler (DDP), reset, len and the positions of resume are its, and
 * act on fl; fg_dataloader_next on it is fg_fields_loader_next, the batch
 * as an fg_batch whose `fields` holds the named tensors (x and y the first
 * two), and fg_dataloader_status tells a collate failure too. So the
 * Fabric and the Trainer take it as any loader (training_step reads
 * fg_fields_batch_get(b->fields, "tokens")); on a device only x and y are
 * moved there. Do not free it (fg_fields_loader_free does). */
FG_API fg_dataloader *fg_fields_loader_loader(fg_fields_loader *fl);

/* =============================================== iterable (streaming) data */

/* An iterable dataset (PyTorch's IterableDataset): samples come one after
 * another from an iterator, with no random access and possibly no known
 * length (a file read line by line, a generator, a socket). A stream loader
 * splits an epoch's stream by rank and by loader worker as torchdata's
 * sharding rule and Hugging Face's split_dataset_by_node do: with R ranks
 * and W workers (W = 1 when synchronous) there are R * W shards, rank r's
 * worker w reads shard g = r * W + w, which holds the stream's samples
 * k = g, g + R W, g + 2 R W, ...; each worker makes its own batches, and
 * the loader returns them round robin over the workers, passing over
 * workers whose shard has ended (PyTorch's DataLoader order). So over all
 * ranks every sample of the epoch is in exactly one batch (less a short
 * last batch per worker with drop_last), and ranks may get a different
 * number of batches (one more or fewer): cap the steps if DDP needs equal
 * counts.
 *
 * The table:
 *   spec:  the specs of x and y (as fg_dataset_ops.spec). Called once.
 *   len:   the samples per epoch if known, else -1; NULL = unknown.
 *   open:  an iterator over `epoch`'s stream from its first sample, in *it.
 *          Called once per worker and epoch, from the worker's thread.
 *   next:  writes the next sample into x_out and y_out, or sets *end at the
 *          end of the stream. One iterator is used by one thread at a time;
 *          several iterators of one stream run at once with workers.
 *   skip:  passes over up to n samples without writing them and tells how
 *          many it passed (< n only at the end); NULL = next into a scratch
 *          buffer. The shards and the resume pass over samples with it.
 *   close: frees an iterator; may be NULL.
 *   free:  frees ud; may be NULL. */
typedef struct fg_stream_ops {
    void (*spec)(void *ud, fg_sample_spec *x, fg_sample_spec *y);
    int64_t (*len)(void *ud);
    FG_MUST_USE fg_status (*open)(void *ud, int64_t epoch, void **it);
    FG_MUST_USE fg_status (*next)(void *ud, void *it, void *x_out, void *y_out, bool *end);
    FG_MUST_USE fg_status (*skip)(void *ud, void *it, int64_t n, int64_t *skipped);
    void (*close)(void *ud, void *it);
    void (*free)(void *ud);
} fg_stream_ops;

typedef struct fg_stream fg_stream;

/* A stream over the user's table (spec, open and next must be set); ud
 * consumed as by fg_dataset_new; name copied (NULL = "stream"). NULL with
 * FG_EINVAL (a missing function, a bad spec) or FG_ENOMEM. */
FG_API fg_stream *fg_stream_new(const fg_stream_ops *ops, void *ud, const char *name);
FG_API void fg_stream_free(fg_stream *s); /* NULL is a no-op; free its loaders first */
FG_API const fg_sample_spec *fg_stream_x_spec(const fg_stream *s);
FG_API const fg_sample_spec *fg_stream_y_spec(const fg_stream *s);

/* Stream loader options; all zero = batch 1, keep short batches,
 * synchronous, rank 0 of 1. */
typedef struct fg_stream_loader_opts {
    int64_t batch;   /* samples per batch; 0 = 1 */
    bool drop_last;  /* drop each worker's short last batch */
    int num_workers; /* threads, each reading its own shard; 0 = the caller's thread */
    int prefetch;    /* batches each worker prepares ahead; 0 = 2 */
    int rank, world; /* this rank and the number of ranks; world 0 = 1 */
} fg_stream_loader_opts;

typedef struct fg_stream_loader fg_stream_loader;

/* A loader over `s` (borrowed: it must outlive the loader), at (epoch 0,
 * batch 0); workers start reading at once. NULL with FG_EINVAL (a negative
 * batch, workers or prefetch, rank outside [0, world)), FG_EIO (a thread
 * could not start) or FG_ENOMEM. */
FG_API fg_stream_loader *fg_stream_loader_new(fg_stream *s, const fg_stream_loader_opts *o);
FG_API void fg_stream_loader_free(fg_stream_loader *l); /* NULL is a no-op */

/* The next batch (as fg_batch: valid == size; indices are the samples'
 * positions k in the epoch's stream; owned by the loader until the next
 * call), or NULL at the end of the epoch or on a failure
 * (fg_stream_loader_status tells which; the message names the stream,
 * worker, batch and epoch, and later calls repeat it until repositioned). */
FG_API fg_batch *fg_stream_loader_next(fg_stream_loader *l);
FG_API FG_MUST_USE fg_status fg_stream_loader_status(const fg_stream_loader *l);

/* Batches per epoch for this rank: from the stream's len when it gives one;
 * else -1 until an epoch has been read to its end, then that epoch's count
 * (discovered). */
FG_API int64_t fg_stream_loader_len(const fg_stream_loader *l);

/* Goes to batch 0 of `epoch` (>= 0). FG_OK, FG_EINVAL, or the stream's
 * error (open). */
FG_API FG_MUST_USE fg_status fg_stream_loader_set_epoch(fg_stream_loader *l, int64_t epoch);
/* The position: the epoch and how many batches of it were returned. */
FG_API void fg_stream_loader_position(const fg_stream_loader *l, int64_t *epoch, int64_t *batch);
/* Goes to (epoch, batch): the epoch's streams are reopened and each
 * worker's shard passed over (skip) up to where that many batches had
 * left it, so the next batches are exactly those the saved loader would
 * have returned (same stream, options, rank and world). FG_EINVAL when
 * the epoch has fewer batches (naming both), or the stream's error. */
FG_API FG_MUST_USE fg_status fg_stream_loader_set_position(fg_stream_loader *l, int64_t epoch,
                                                           int64_t batch);

/* A loader over a stream that the fabric and the Trainer take as any loader
 * (Lightning's DataLoader over an IterableDataset): fg_dataloader_next,
 * _status, _len (the stream loader's: -1 while unknown), _set_epoch,
 * _set_position, _position and _reset act on a stream loader made with
 * `o` (see fg_stream_loader_new); fg_dataloader_opts gives its batch,
 * drop_last and num_workers; fg_dataloader_dataset and _sampler are NULL
 * and fg_dataloader_set_sampler is FG_EUNSUPPORTED (a stream comes in its
 * order). fg_fabric_setup_dataloader splits it by the fabric's rank and
 * world (fg_dataloader_split_stream), where Lightning inserts no sampler
 * for an IterableDataset and leaves the split to it. s is borrowed: it
 * must outlive the loader. NULL with fg_stream_loader_new's errors, or
 * FG_EINVAL for a NULL s. */
FG_API fg_dataloader *fg_dataloader_from_stream(fg_stream *s, const fg_stream_loader_opts *o);
/* Whether dl was made by fg_dataloader_from_stream. */
FG_API bool fg_dataloader_is_stream(const fg_dataloader *dl);
/* Whether dl's batches per epoch are known before an epoch is read: true
 * for a map-style loader and a stream whose len gives one; false for a
 * stream of unknown length (Lightning's IterableDataset without __len__),
 * even once an epoch has been read (fg_dataloader_len then tells that
 * epoch's count, which the next epoch need not repeat). */
FG_API bool fg_dataloader_len_known(const fg_dataloader *dl);
/* Makes dl's stream loader again as rank `rank` of `world` (its shards:
 * fg_stream_loader_new's rule), at (epoch 0, batch 0). FG_EINVAL for a
 * loader not over a stream, fg_stream_loader_new's errors (dl then keeps
 * its loader). */
FG_API FG_MUST_USE fg_status fg_dataloader_split_stream(fg_dataloader *dl, int rank, int world);

/* What a dataset's get may ask about the loader calling it, for random
 * augmentation. */
typedef struct fg_worker_info {
    int id;               /* 0..num_workers-1; 0 when synchronous */
    int num_workers;      /* as configured (0 = synchronous) */
    int rank;             /* the sampler's rank */
    uint64_t seed;        /* fg_rng_derive(fg_rng_derive(opts.seed, rank), id) */
    int64_t epoch;        /* epoch of the batch being read */
    uint64_t sample_seed; /* a seed of (opts.seed, epoch, dataset index) only:
                             the same for any worker count or rank; prefer it
                             for augmentation that must be reproducible */
} fg_worker_info;

/* Inside a dataset's get called by a loader: the calling worker's info,
 * valid during that call. NULL anywhere else (e.g. fg_dataset_get called
 * directly). Thread-safe (per thread). */
FG_API const fg_worker_info *fg_data_worker_info(void);

#ifdef __cplusplus
}
#endif
#endif
