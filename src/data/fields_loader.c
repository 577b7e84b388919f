/* The fields loader: an fg_dataloader over a fields dataset's packed
 * samples (so samplers, workers, resume and DDP's set_sampler are the
 * loader's own), and a collate function run on each batch as the caller
 * takes it. A collate failure is remembered with the sample loader's
 * count of repositionings: until that count moves, next() repeats it. The
 * sample loader's own next goes through here (fg__dataloader_set_fields),
 * so the Trainer and the Fabric take it as any loader. */
#include <stdio.h>
#include <string.h>

#include "data_impl.h"

#define MSG_MAX 1024

struct fg_fields_loader {
    fg_fields_dataset *fd;
    fg_dataloader *dl;
    fg_collate_fn fn;
    void *ud;
    fg_collate_opts copts;
    fg_collate_out out;
    fg_sample_field *views; /* batch * nfields */
    fg_fields_batch b;
    fg_status st;
    char msg[MSG_MAX];
    uint64_t fail_moves;
};

fg_fields_loader *fg_fields_loader_new(fg_fields_dataset *fd, const fg_fields_loader_opts *o) {
    static const fg_fields_loader_opts zero = {0};
    if (!fd) {
        fg_error(FG_EINVAL, "fg_fields_loader_new: NULL dataset");
        return NULL;
    }
    if (!o) o = &zero;
    fg_fields_loader *fl = fg_calloc(1, sizeof *fl);
    if (!fl) return NULL;
    fl->fd = fd;
    fl->copts = o->collate_opts;
    fl->fn = o->collate ? o->collate : fg_collate_default;
    fl->ud = o->collate ? o->collate_ud : &fl->copts;
    int64_t B = o->loader.batch ? o->loader.batch : 1;
    fl->dl = fg_dataloader_new(fd->packed, &o->loader);
    if (!fl->dl) goto fail;
    fg__dataloader_set_fields(fl->dl, fl);
    fl->views = fg_calloc((size_t)B * (size_t)fd->nfields, sizeof *fl->views);
    if (!fl->views) goto fail;
    return fl;
fail:
    fg_fields_loader_free(fl);
    return NULL;
}

void fg_fields_loader_free(fg_fields_loader *fl) {
    if (!fl) return;
    fg_dataloader_free(fl->dl);
    fg__collate_out_free(&fl->out);
    fg_free(fl->views);
    fg_free(fl);
}

fg_dataloader *fg_fields_loader_loader(fg_fields_loader *fl) { return fl ? fl->dl : NULL; }

fg_fields_batch *fg_fields_loader_next(fg_fields_loader *fl) {
    if (!fl) {
        fg_error(FG_EINVAL, "fg_fields_loader_next: NULL loader");
        return NULL;
    }
    if (fl->st != FG_OK) {
        if (fg__dataloader_moves(fl->dl) == fl->fail_moves) {
            fg_error(fl->st, "%s", fl->msg);
            return NULL;
        }
        fl->st = FG_OK;
    }
    fg_batch *ib = fg__dataloader_next_samples(fl->dl);
    if (!ib) return NULL;
    const fg_fields_dataset *fd = fl->fd;
    const uint8_t *rec = fg_tensor_data(ib->x);
    for (int64_t j = 0; j < ib->size; j++)
        fg__fields_unpack(fd, rec + (size_t)j * fd->rec, fl->views + j * fd->nfields);
    fl->out.n = 0;
    fg_clear_error();
    fg_status st = fl->fn(fl->ud, fd, fl->views, ib->size, &fl->out);
    if (st != FG_OK) {
        fg_error_wrap(st, "dataset %s: collate of batch %lld of epoch %lld", fd->name,
                      (long long)ib->index, (long long)ib->epoch);
        snprintf(fl->msg, sizeof fl->msg, "%s", fg_last_error());
        fl->st = st;
        fl->fail_moves = fg__dataloader_moves(fl->dl);
        return NULL;
    }
    fl->b = (fg_fields_batch){
        .nfields = fl->out.n,
        .names = (const char *const *)fl->out.names,
        .tensors = fl->out.t,
        .size = ib->size,
        .valid = ib->valid,
        .epoch = ib->epoch,
        .index = ib->index,
        .indices = ib->indices,
    };
    return &fl->b;
}

fg_status fg__fields_loader_collate_status(const fg_fields_loader *fl) {
    /* a repositioning since clears it, as next() does */
    return fl->st != FG_OK && fg__dataloader_moves(fl->dl) == fl->fail_moves ? fl->st : FG_OK;
}

fg_status fg_fields_loader_status(const fg_fields_loader *fl) {
    if (!fl) return FG_EINVAL;
    return fl->st != FG_OK ? fl->st : fg_dataloader_status(fl->dl);
}

fg_tensor *fg_fields_batch_get(const fg_fields_batch *b, const char *name) {
    for (int k = 0; b && name && k < b->nfields; k++)
        if (strcmp(b->names[k], name) == 0) return b->tensors[k];
    return NULL;
}
