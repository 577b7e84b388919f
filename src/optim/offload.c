/* offload_optimizer_device=nvme: the optimizer's state (AdamW's exp_avg and
 * exp_avg_sq, SGD's momentum buffer) of its range lives in files under
 * nvme_path (nvme_store.h) instead of memory. A step streams the state
 * through block buffers, the next block's reads overlapping the update of
 * this one and the writes going behind, and runs the same kernel on the
 * same elements as the in-memory step: the results are bitwise equal (the
 * updates are elementwise, so cutting the range into blocks changes
 * nothing). The state tensors map the files, so fg_optimizer_state, and
 * with it checkpoints and the ZeRO save's gathering, read and write the
 * state as before (through the page cache, only when they are used).
 *
 * With the parameters too (ZeRO stage 3's offload_params_device=nvme) the
 * store holds one more array, the parameters of the range (f32 or f64: the
 * master copy is the parameters themselves), and a step updates them in the
 * streamed blocks with their state: the module's flat buffer is not read
 * or written there (stage 3 keeps those pages released and fetches units
 * from the file).
 *
 * Invariant: with offload set, state[i] is a wrap (not owning) of the
 * store's mapping of array i, state_end - state_begin elements long; with
 * params, array nstates is the parameters of the same range. */
#include <stdio.h>
#include <string.h>

#include "nvme_store.h"
#include "optim_impl.h"

struct fg__optim_offload {
    fg__nvme_store *store;
    bool params; /* array nstates holds the parameters of the range */
};

typedef struct fill {
    fg_optimizer *o;
    fg_tensor **from;
    bool params;
    const char *psrc; /* the range's parameters (a host copy when they are on a device) */
} fill;

/* Copies the in-memory state into the blocks; an all-zero block (a fresh
 * optimizer's state: pages never touched) is not written, the files being
 * zero already. */
static FG_MUST_USE fg_status fill_block(void *ud, size_t off, size_t n, void *const *bufs,
                                        bool *write) {
    fill *f = ud;
    bool zero = true;
    for (int i = 0; i < f->o->nstates; i++) {
        const char *src = (const char *)fg_tensor_data(f->from[i]) + off;
        memcpy(bufs[i], src, n);
        for (size_t k = 0; k < n && zero; k += 8) {
            uint64_t w = 0;
            memcpy(&w, src + k, FG_MIN(8, n - k));
            zero = w == 0;
        }
    }
    if (f->params) { /* the parameters are written whatever they are */
        memcpy(bufs[f->o->nstates], f->psrc + off, n);
        zero = false;
    }
    *write = !zero;
    return FG_OK;
}

bool fg__optimizer_offloaded(const fg_optimizer *o) { return o && o->offload; }

static FG_MUST_USE fg_status offload(fg_optimizer *o, const char *dir, size_t block, bool params) {
    if (!o) return fg_error(FG_EINVAL, "offload_nvme: NULL optimizer");
    if (o->offload)
        return fg_error(FG_ESTATE, "offload_nvme: the optimizer state is on disk already");
    if (params && o->dt != o->sdt)
        return fg_error(FG_EUNSUPPORTED,
                        "offload_params_device=nvme: the parameters are %s and %s keeps its state "
                        "in %s; parameter offload is built for f32 (or f64) parameters, which are "
                        "their own master copy (precision 32-true, bf16-mixed or 16-mixed)",
                        fg_dtype_name(o->dt), o->vt->name, fg_dtype_name(o->sdt));
    if (o->nstates == 0 && !params) return FG_OK;
    FG_TRY(fg__optimizer_ensure_state(o));
    int64_t n = o->state_end - o->state_begin;
    size_t bytes = fg_dtype_size(o->sdt) * (size_t)n;
    /* on a device: the state to host memory first (the files are the
     * host's), the parameters through a host copy */
    FG_TRY(fg__optimizer_offload_cpu(o));
    const char *psrc = (const char *)o->param + fg_dtype_size(o->dt) * (size_t)o->state_begin;
    char *pcopy = NULL;
    if (params && o->dev) {
        size_t pb = fg_dtype_size(o->dt) * (size_t)n;
        if (!(pcopy = fg_alloc(pb ? pb : 1))) return fg_error_wrap(FG_ENOMEM, "offload_nvme");
        fg_status cs = fg_dev_copy_d2h(o->dev, pcopy, psrc, pb);
        if (cs != FG_OK) {
            fg_free(pcopy);
            return fg_error_wrap(cs, "offload_params_device=nvme");
        }
        psrc = pcopy;
    }
    char what[96];
    snprintf(what, sizeof what, "the %s optimizer state%s", o->vt->name,
             params ? " and the parameters" : "");
    struct fg__optim_offload *off = fg_calloc(1, sizeof *off);
    if (!off) {
        fg_free(pcopy);
        return fg_error_wrap(FG_ENOMEM, "offload_nvme");
    }
    fg_tensor *wrap[FG_OPTIM_MAX_STATES] = {0};
    fg_status st =
        fg__nvme_store_new(dir, what, o->nstates + (params ? 1 : 0), bytes, block, &off->store);
    if (st == FG_OK)
        st = fg__nvme_store_stream(off->store, 0, bytes, false, true, fill_block,
                                   &(fill){o, o->state, params, psrc});
    fg_free(pcopy);
    for (int i = 0; st == FG_OK && i < o->nstates; i++)
        if (!(wrap[i] = fg_tensor_wrap(fg__nvme_store_map(off->store, i), o->sdt, 1, &n)))
            st = fg_error_wrap(FG_ENOMEM, "offload_nvme");
    if (st != FG_OK) {
        for (int i = 0; i < o->nstates; i++) fg_tensor_free(wrap[i]);
        fg__nvme_store_free(off->store);
        fg_free(off);
        return fg_error_wrap(st, params ? "offload_params_device=nvme"
                                        : "offload_optimizer_device=nvme");
    }
    for (int i = 0; i < o->nstates; i++) {
        fg_tensor_free(o->state[i]);
        o->state[i] = wrap[i];
    }
    off->params = params;
    o->offload = off;
    return FG_OK;
}

fg_status fg__optimizer_offload_nvme(fg_optimizer *o, const char *dir, size_t block) {
    return offload(o, dir, block, false);
}

fg_status fg__optimizer_offload_nvme_params(fg_optimizer *o, const char *dir, size_t block) {
    return offload(o, dir, block, true);
}

fg__nvme_store *fg__optimizer_offload_param_store(const fg_optimizer *o, int *array) {
    if (!o || !o->offload || !o->offload->params) return NULL;
    if (array) *array = o->nstates;
    return o->offload->store;
}

void fg__optimizer_offload_params_home(fg_optimizer *o) {
    if (o && o->host_params) { /* cpu: copied back in, the device's again */
        size_t es = fg_dtype_size(o->dt);
        if (fg_dev_copy_h2d(o->dev, (char *)o->param + es * (size_t)o->state_begin, o->host_params,
                            es * (size_t)(o->state_end - o->state_begin)) != FG_OK)
            fg_log(FG_LOG_ERROR, "offload_params_device=cpu: the parameters back: %s",
                   fg_last_error());
        fg_free(o->host_params);
        o->host_params = NULL;
        return;
    }
    if (!o || !o->offload || !o->offload->params) return;
    size_t es = fg_dtype_size(o->dt);
    char *dst = (char *)o->param + es * (size_t)o->state_begin;
    const void *src = fg__nvme_store_map(o->offload->store, o->nstates);
    size_t bytes = es * (size_t)(o->state_end - o->state_begin);
    if (!o->dev) memcpy(dst, src, bytes);
    else if (fg_dev_copy_h2d(o->dev, dst, src, bytes) != FG_OK) /* inside the buffer: */
        fg_log(FG_LOG_ERROR, "offload_params_device=nvme: the parameters back: %s",
               fg_last_error());
    o->offload->params = false;
}

typedef struct upd {
    fg_optimizer *o;
    int64_t base; /* element of byte 0 of the files: state_begin */
    int64_t begin;
    char *param;
    const char *grad;
} upd;

static FG_MUST_USE fg_status update_block(void *ud, size_t off, size_t n, void *const *bufs,
                                          bool *write) {
    upd *u = ud;
    fg_optimizer *o = u->o;
    size_t ss = fg_dtype_size(o->sdt), es = fg_dtype_size(o->dt); /* state, parameters */
    int64_t lo = u->base + (int64_t)(off / ss), hi = lo + (int64_t)(n / ss);
    size_t at = es * (size_t)(lo - u->begin);
    (void)write;
    char *param = o->offload->params ? bufs[o->nstates] : u->param + at;
    return o->vt->step_range(o, lo, hi, param, u->grad + at, bufs, o->steps + 1);
}

fg_status fg__offload_step_range(fg_optimizer *o, int64_t begin, int64_t end, void *param,
                                 const void *grad) {
    size_t ss = fg_dtype_size(o->sdt);
    upd u = {o, o->state_begin, begin, param, grad};
    fg_status st =
        fg__nvme_store_stream(o->offload->store, ss * (size_t)(begin - o->state_begin),
                              ss * (size_t)(end - o->state_begin), true, true, update_block, &u);
    return st == FG_OK ? FG_OK : fg_error_wrap(st, "%s step (offload_nvme)", o->vt->name);
}

void fg__optimizer_offload_counts(const fg_optimizer *o, uint64_t *read, uint64_t *written) {
    *read = *written = 0;
    if (o && o->offload) fg__nvme_store_counts(o->offload->store, read, written);
}

bool fg_optimizer_state_on_disk(const fg_optimizer *o, uint64_t *bytes_read,
                                uint64_t *bytes_written) {
    uint64_t r, w;
    fg__optimizer_offload_counts(o, &r, &w);
    if (bytes_read) *bytes_read = r;
    if (bytes_written) *bytes_written = w;
    return o && o->offload;
}

bool fg__optimizer_offload_direct(const fg_optimizer *o) {
    return o && o->offload && fg__nvme_store_direct(o->offload->store);
}

void fg__offload_free(fg_optimizer *o) {
    if (!o->offload) return;
    fg__nvme_store_free(o->offload->store);
    fg_free(o->offload);
    o->offload = NULL;
}
