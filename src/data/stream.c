/* Streams (iterable datasets) and their shards: a shard is every step-th
 * sample of the stream from `first`, got by passing over the others (the
 * stream's skip, or next into a scratch buffer). Invariant: `pos` is the
 * stream index of the sample the iterator gives next; once a shard has
 * ended it stays ended until reopened. */
#include <string.h>

#include "data_impl.h"

fg_stream *fg_stream_new(const fg_stream_ops *ops, void *ud, const char *name) {
    fg_stream *s = NULL;
    if (!name) name = "stream";
    if (!ops || !ops->spec || !ops->open || !ops->next) {
        fg_error(FG_EINVAL, "fg_stream_new(%s): ops and its spec, open and next must be set", name);
        goto fail;
    }
    s = fg_calloc(1, sizeof *s);
    if (!s || !(s->name = fg_strdup(name))) goto fail;
    s->ops = *ops;
    s->ud = ud;
    ops->spec(ud, &s->x, &s->y);
    if (s->x.dtype == FG_DTYPE_DEFAULT) s->x.dtype = FG_F32;
    if (s->y.dtype == FG_DTYPE_DEFAULT) s->y.dtype = FG_F32;
    if (fg__spec_check(&s->x, name, "x", &s->xbytes) != FG_OK ||
        fg__spec_check(&s->y, name, "y", &s->ybytes) != FG_OK)
        goto fail;
    return s;
fail:
    if (s) fg_free(s->name);
    fg_free(s);
    if (ops && ops->free) ops->free(ud);
    return NULL;
}

void fg_stream_free(fg_stream *s) {
    if (!s) return;
    if (s->ops.free) s->ops.free(s->ud);
    fg_free(s->name);
    fg_free(s);
}

const fg_sample_spec *fg_stream_x_spec(const fg_stream *s) { return &s->x; }
const fg_sample_spec *fg_stream_y_spec(const fg_stream *s) { return &s->y; }

fg_status fg__shard_open(const fg_stream *s, fg__shard *sh, int64_t epoch, int64_t first,
                         int64_t step) {
    fg__shard_close(s, sh);
    if (!s->ops.skip && !sh->scratch) {
        sh->scratch = fg_alloc(FG_MAX(s->xbytes + s->ybytes + 16, 16));
        if (!sh->scratch) return FG_ENOMEM;
    }
    sh->it = NULL;
    FG_TRY(s->ops.open(s->ud, epoch, &sh->it));
    sh->open = true;
    sh->ended = false;
    sh->pos = 0;
    sh->to_skip = first;
    sh->step = step;
    return FG_OK;
}

static FG_MUST_USE fg_status pass_over(const fg_stream *s, fg__shard *sh, int64_t n) {
    if (n <= 0) return FG_OK;
    if (s->ops.skip) {
        int64_t done = 0;
        FG_TRY(s->ops.skip(s->ud, sh->it, n, &done));
        sh->pos += done;
        if (done < n) sh->ended = true;
        return FG_OK;
    }
    char *x = sh->scratch, *y = x + (s->xbytes + 7) / 8 * 8;
    for (int64_t k = 0; k < n; k++) {
        bool end = false;
        FG_TRY(s->ops.next(s->ud, sh->it, x, y, &end));
        if (end) {
            sh->ended = true;
            return FG_OK;
        }
        sh->pos++;
    }
    return FG_OK;
}

fg_status fg__shard_next(const fg_stream *s, fg__shard *sh, void *x, void *y, int64_t *index,
                         bool *got) {
    *got = false;
    if (sh->ended) return FG_OK;
    FG_TRY(pass_over(s, sh, sh->to_skip));
    sh->to_skip = 0;
    if (sh->ended) return FG_OK;
    int64_t k = sh->pos;
    if (x) {
        bool end = false;
        FG_TRY(s->ops.next(s->ud, sh->it, x, y, &end));
        if (end) {
            sh->ended = true;
            return FG_OK;
        }
        sh->pos++;
    } else {
        FG_TRY(pass_over(s, sh, 1));
        if (sh->ended) return FG_OK;
    }
    *index = k;
    *got = true;
    sh->to_skip = sh->step - 1;
    return FG_OK;
}

void fg__shard_close(const fg_stream *s, fg__shard *sh) {
    if (sh->open && s->ops.close) s->ops.close(s->ud, sh->it);
    sh->it = NULL;
    sh->open = false;
}
