/* uint16 token files, nanoGPT's raw layout and llm.c's headed one, windowed
 * as the text dataset. The file stays mapped; ids are read little-endian
 * byte by byte, so neither alignment nor host byte order matters. The whole
 * file is scanned once at open (max id, range check), so get never fails. */
#include <string.h>

#include "data_impl.h"

#define LLMC_HEADER_BYTES (256 * 4)

typedef struct tok_ds {
    fg__map map;
    const uint8_t *tok; /* first id */
    int64_t ntok, ctx;
} tok_ds;

static int64_t tok_len(void *ud) {
    tok_ds *t = ud;
    return (t->ntok - 1) / t->ctx;
}

static void tok_spec(void *ud, fg_sample_spec *x, fg_sample_spec *y) {
    tok_ds *t = ud;
    *x = (fg_sample_spec){.dtype = FG_I32, .ndim = 1, .shape = {t->ctx}};
    *y = *x;
}

static FG_MUST_USE fg_status tok_get(void *ud, int64_t i, void *x_out, void *y_out) {
    tok_ds *t = ud;
    const uint8_t *p = t->tok + 2 * i * t->ctx;
    int32_t *x = x_out, *y = y_out;
    for (int64_t k = 0; k < t->ctx; k++) {
        x[k] = fg__le16(p + 2 * k);
        y[k] = fg__le16(p + 2 * k + 2);
    }
    return FG_OK;
}

static void tok_free(void *ud) {
    tok_ds *t = ud;
    if (!t) return;
    fg__unmap(&t->map);
    fg_free(t);
}

fg_status fg__token_dataset_open(const char *path, int64_t ctx, int64_t vocab, fg_dataset **out) {
    if (!path) {
        return fg_error(FG_EINVAL, "fg_token_dataset_new: NULL path");
    }
    if (ctx < 1) {
        return fg_error(FG_EINVAL, "token dataset %s: ctx=%lld: expected a window length >= 1",
                        path, (long long)ctx);
    }
    if (vocab < 0) {
        return fg_error(FG_EINVAL,
                        "token dataset %s: vocab=%lld: expected a size > 0, or 0 for max id + 1",
                        path, (long long)vocab);
    }
    *out = NULL;
    fg_status st;
    tok_ds *t = fg_calloc(1, sizeof *t);
    if (!t) return FG_ENOMEM;
    if ((st = fg__map_file(path, &t->map)) != FG_OK) goto fail;
    const uint8_t *p = t->map.p;
    size_t n = t->map.len;
    if (n >= 4 && fg__le32(p) == FG_LLMC_TOKEN_MAGIC) {
        if (n < LLMC_HEADER_BYTES) {
            st = fg_error(FG_EFORMAT,
                          "%s: starts with llm.c's magic %d but is %zu bytes, shorter than its "
                          "%d-byte header (truncated?)",
                          path, FG_LLMC_TOKEN_MAGIC, n, LLMC_HEADER_BYTES);
            goto fail;
        }
        uint32_t version = fg__le32(p + 4), count = fg__le32(p + 8);
        if (version != 1) {
            st = fg_error(
                FG_EFORMAT,
                "%s: llm.c token file version %u is not supported (expected 1: uint16 ids)", path,
                version);
            goto fail;
        }
        size_t body = n - LLMC_HEADER_BYTES;
        if ((size_t)count * 2 != body) {
            st = fg_error(FG_EFORMAT,
                          "%s: llm.c header says %u tokens (%zu bytes) but %zu bytes follow the "
                          "header (truncated or corrupt file)",
                          path, count, (size_t)count * 2, body);
            goto fail;
        }
        t->tok = p + LLMC_HEADER_BYTES;
        t->ntok = count;
    } else {
        if (n % 2) {
            st = fg_error(FG_EFORMAT,
                          "%s: %zu bytes is odd: not a file of uint16 token ids (truncated?)", path,
                          n);
            goto fail;
        }
        t->tok = p;
        t->ntok = (int64_t)(n / 2);
    }
    if (t->ntok < ctx + 1) {
        st =
            fg_error(FG_EINVAL,
                     "token dataset %s: %lld tokens, fewer than ctx + 1 = %lld: use more data or a "
                     "smaller ctx",
                     path, (long long)t->ntok, (long long)ctx + 1);
        goto fail;
    }
    int64_t maxid = 0;
    for (int64_t i = 0; i < t->ntok; i++) {
        int64_t id = fg__le16(t->tok + 2 * i);
        if (vocab && id >= vocab) {
            st = fg_error(
                FG_EFORMAT,
                "%s: token %lld is id %lld, outside the vocabulary of %lld: give the right "
                "vocab size (or 0 to use max id + 1)",
                path, (long long)i, (long long)id, (long long)vocab);
            goto fail;
        }
        if (id > maxid) maxid = id;
    }
    t->ctx = ctx;
    static const fg_dataset_ops ops = {tok_len, tok_spec, tok_get, tok_free};
    fg_dataset *ds = fg_dataset_new(&ops, t, "tokens"); /* frees t on failure */
    if (!ds) return FG_ENOMEM;
    ds->vocab_size = vocab ? vocab : maxid + 1;
    *out = ds;
    return FG_OK;
fail:
    tok_free(t);
    return st;
}

fg_dataset *fg_token_dataset_new(const char *path, int64_t ctx, int64_t vocab) {
    fg_dataset *ds = NULL;
    return fg__token_dataset_open(path, ctx, vocab, &ds) == FG_OK ? ds : NULL;
}
