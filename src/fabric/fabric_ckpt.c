/* fabric save/load: one safetensors file holding the weights under the
 * model's dotted names (loadable by PyTorch's safetensors), the optimizer's
 * state as "optimizer.<state>.<param>" slices of its flat buffers, and the
 * trainer counters and the program's own key/value strings as metadata.
 * Rank 0 writes (atomically, ckpt layer); all ranks read. A load keeps the
 * file's metadata in the fabric (f->loaded_meta: one block, the fg_kv array
 * followed by the strings it points at) until the next successful load.
 * Under a sharding strategy the file is the same: rank 0 streams it,
 * gathering the shards a window at a time (fabric_save_stream.c), and each
 * rank loads its shard's range of it. With state_dict_type sharded (the
 * default of the deepspeed strategies) the save is a folder of a file per
 * rank and an index (fabric_save_sharded.c); fg_st_open reads such a
 * folder as one file, so the load below takes either. What a rank holds
 * comes from fg__fabric_held. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fabric_impl.h"

#define FORMAT_NAME "fulgur-checkpoint-1"
#define SHARD_FORMAT_NAME "fulgur-checkpoint-shard-1" /* fabric_save_sharded.c */

/* The keys write_file sets itself; st->meta may not use them. */
static const char *const k_own_keys[] = {"format",
                                         "fulgur_version",
                                         "step",
                                         "epoch",
                                         "batch_in_epoch",
                                         "seed",
                                         "world_size",
                                         "strategy",
                                         "optimizer_steps",
                                         "lr",
                                         "loss_scale",
                                         "loss_scale_growth_tracker",
                                         "loss_scale_skipped",
                                         "samples_in_epoch",
                                         "global_batch",
                                         "deterministic",
                                         "micro_batch",
                                         "save_id"};

/* Checks st->meta before anything is written: every key non-empty, unique
 * and not one of the fabric's; every value a string (the writer checks
 * UTF-8). */
static FG_MUST_USE fg_status check_meta(const fg_kv *meta, int64_t n) {
    if (n < 0 || (n > 0 && !meta))
        return fg_error(FG_EINVAL,
                        "save: meta = %p with nmeta = %lld: expected an array of nmeta >= 0 "
                        "entries",
                        (const void *)meta, (long long)n);
    for (int64_t i = 0; i < n; i++) {
        const char *k = meta[i].key;
        if (!k || !k[0])
            return fg_error(FG_EINVAL, "save: meta[%lld] has %s key", (long long)i,
                            k ? "an empty" : "a NULL");
        if (!meta[i].value)
            return fg_error(FG_EINVAL, "save: meta[%lld] (\"%.100s\") has a NULL value",
                            (long long)i, k);
        if (!strcmp(k, "optimizers") || !strncmp(k, "optimizer.", 10))
            return fg_error(FG_EINVAL,
                            "save: meta key \"%.100s\" is the fabric's own (several "
                            "optimizers' settings): rename it",
                            k);
        for (size_t j = 0; j < sizeof k_own_keys / sizeof k_own_keys[0]; j++)
            if (!strcmp(k, k_own_keys[j]))
                return fg_error(FG_EINVAL,
                                "save: meta key \"%s\" is one the fabric writes itself: choose "
                                "another name",
                                k);
        for (int64_t j = 0; j < i; j++)
            if (!strcmp(k, meta[j].key))
                return fg_error(FG_EINVAL,
                                "save: meta key \"%.100s\" is given twice (entries %lld and %lld)",
                                k, (long long)j, (long long)i);
    }
    return FG_OK;
}

static FG_MUST_USE fg_status add_param_views(fg_st_writer *w, fg_module *m, const char *prefix,
                                             fg_tensor *flat, char names[][256]) {
    int n = fg_module_num_params(m);
    size_t es = fg_dtype_size(fg_tensor_dtype(flat));
    for (int i = 0; i < n; i++) {
        fg_tensor *p = fg_module_param(m, i);
        char *name = names[i];
        snprintf(name, 256, "%s%s", prefix, fg_module_param_name(m, i));
        const char *data =
            (const char *)fg_tensor_data(flat) + (size_t)fg_module_param_offset(m, i) * es;
        /* the buffer's dtype: an optimizer's f32 state beside bf16 parameters (bf16-true) */
        FG_TRY(fg_st_writer_add_on(w, name, fg_tensor_dtype(flat), fg_tensor_ndim(p),
                                   fg_tensor_shape(p), data, fg_tensor_dev(flat)));
    }
    return FG_OK;
}

/* The checkpoint's metadata into w: the fabric's keys, the loss scaler's,
 * then st->meta (checked first). */
fg_status fg__fabric_ckpt_meta(fg_fabric *f, const fg_train_state *st, fg_st_writer *w) {
    FG_TRY(check_meta(st->meta, st->nmeta));
    if (st->step < 0 || st->epoch < 0 || st->batch_in_epoch < 0 ||
        (st->global_batch > 0 && st->samples_in_epoch < 0))
        return fg_error(FG_EINVAL,
                        "save: step %lld, epoch %lld, batch_in_epoch %lld, samples_in_epoch %lld: "
                        "expected counts >= 0 (a load refuses negative ones)",
                        (long long)st->step, (long long)st->epoch, (long long)st->batch_in_epoch,
                        (long long)st->samples_in_epoch);
    fg_status s = FG_OK;
    char num[64];
#define META(k, v)                                                                                 \
    if (s == FG_OK) s = fg_st_writer_set_meta(w, k, v)
    META("format", FORMAT_NAME);
    META("fulgur_version", fg_version());
    snprintf(num, sizeof num, "%" PRId64, st->step);
    META("step", num);
    snprintf(num, sizeof num, "%" PRId64, st->epoch);
    META("epoch", num);
    snprintf(num, sizeof num, "%" PRId64, st->batch_in_epoch);
    META("batch_in_epoch", num);
    snprintf(num, sizeof num, "%" PRIu64, st->seed ? st->seed : f->seed);
    META("seed", num);
    snprintf(num, sizeof num, "%d", f->world_size);
    META("world_size", num);
    META("strategy", fg_fabric_strategy_name(f));
    if (st->global_batch > 0) {
        snprintf(num, sizeof num, "%" PRId64, st->samples_in_epoch);
        META("samples_in_epoch", num);
        snprintf(num, sizeof num, "%" PRId64, st->global_batch);
        META("global_batch", num);
    }
    if (f->cfg.deterministic) META("deterministic", "true");
    if (f->cfg.deterministic && f->micro_batch > 0) { /* what decides its bits */
        snprintf(num, sizeof num, "%" PRId64, f->micro_batch);
        META("micro_batch", num);
    }
    if (st->optimizer) {
        snprintf(num, sizeof num, "%" PRId64, fg_optimizer_step_count(st->optimizer));
        META("optimizer_steps", num);
        snprintf(num, sizeof num, "%.17g", fg_optimizer_lr(st->optimizer));
        META("lr", num);
        /* parameter groups past the first: their lr and weight decay */
        for (int g = 1; g < fg_optimizer_num_groups(st->optimizer); g++) {
            char key[48];
            snprintf(key, sizeof key, "lr.%d", g);
            snprintf(num, sizeof num, "%.17g", fg_optimizer_group_lr(st->optimizer, g));
            META(key, num);
            snprintf(key, sizeof key, "weight_decay.%d", g);
            snprintf(num, sizeof num, "%.17g", fg_optimizer_group_weight_decay(st->optimizer, g));
            META(key, num);
        }
    }
    if (st->noptimizers > 0) {
        snprintf(num, sizeof num, "%d", st->noptimizers);
        META("optimizers", num);
    }
    for (int n = 0; n < st->noptimizers; n++) {
        fg_optimizer *o = st->optimizers[n];
        char key[64];
        snprintf(key, sizeof key, "optimizer.%d.optimizer_steps", n);
        snprintf(num, sizeof num, "%" PRId64, fg_optimizer_step_count(o));
        META(key, num);
        snprintf(key, sizeof key, "optimizer.%d.lr", n);
        snprintf(num, sizeof num, "%.17g", fg_optimizer_lr(o));
        META(key, num);
        for (int g = 1; g < fg_optimizer_num_groups(o); g++) {
            snprintf(key, sizeof key, "optimizer.%d.lr.%d", n, g);
            snprintf(num, sizeof num, "%.17g", fg_optimizer_group_lr(o, g));
            META(key, num);
            snprintf(key, sizeof key, "optimizer.%d.weight_decay.%d", n, g);
            snprintf(num, sizeof num, "%.17g", fg_optimizer_group_weight_decay(o, g));
            META(key, num);
        }
    }
    if (s == FG_OK) s = fg__fabric_scaler_save(f, w);
    for (int64_t i = 0; i < st->nmeta; i++) META(st->meta[i].key, st->meta[i].value);
#undef META
    return s;
}

/* st->optimizers: given with optimizer NULL, at most FG_FABRIC_MAX_OPTIMIZERS,
 * each holding its whole state (no shard). */
static FG_MUST_USE fg_status check_many(const fg_train_state *st, const char *what) {
    if (st->noptimizers == 0) return FG_OK;
    if (st->noptimizers < 0 || st->noptimizers > FG_FABRIC_MAX_OPTIMIZERS || !st->optimizers ||
        st->optimizer)
        return fg_error(FG_EINVAL,
                        "%s: noptimizers = %d with optimizers %s and optimizer %s: expected 1..%d "
                        "optimizers in the array and optimizer NULL",
                        what, st->noptimizers, st->optimizers ? "set" : "NULL",
                        st->optimizer ? "set" : "NULL", FG_FABRIC_MAX_OPTIMIZERS);
    for (int n = 0; n < st->noptimizers; n++) {
        fg_optimizer *o = st->optimizers[n];
        if (!o) return fg_error(FG_EINVAL, "%s: optimizers[%d] is NULL", what, n);
        int64_t b, e, numel = fg_module_numel(fg_optimizer_module(o));
        fg_optimizer_state_range(o, &b, &e);
        if (b != 0 || e != numel)
            return fg_error(FG_EUNSUPPORTED,
                            "%s: optimizers[%d] holds [%lld, %lld) of its %lld state elements: "
                            "several optimizers are checkpointed with whole states (single or "
                            "ddp)",
                            what, n, (long long)b, (long long)e, (long long)numel);
        for (int k = 0; k < fg_optimizer_num_states(o); k++)
            if (!fg_optimizer_state(o, k)) return fg_last_status();
    }
    return FG_OK;
}

/* The states of st->optimizers, "optimizer.N.<state>.<param>". */
static FG_MUST_USE fg_status add_many(fg_st_writer *w, const fg_train_state *st,
                                      char (**names)[256]) {
    int64_t total = 0;
    for (int n = 0; n < st->noptimizers; n++)
        total += fg_module_num_params(fg_optimizer_module(st->optimizers[n])) *
                 fg_optimizer_num_states(st->optimizers[n]);
    if (!(*names = fg_calloc((size_t)total + 1, 256))) return FG_ENOMEM;
    int64_t at = 0;
    for (int n = 0; n < st->noptimizers; n++) {
        fg_optimizer *o = st->optimizers[n];
        fg_module *sub = fg_optimizer_module(o);
        for (int k = 0; k < fg_optimizer_num_states(o); k++) {
            char prefix[128];
            snprintf(prefix, sizeof prefix, "optimizer.%d.%s.", n, fg_optimizer_state_name(o, k));
            FG_TRY(add_param_views(w, sub, prefix, fg_optimizer_state(o, k), *names + at));
            at += fg_module_num_params(sub);
        }
    }
    return FG_OK;
}

/* params: the parameters gathered whole (stage 3), or NULL for the
 * model's own; states: the optimizer's state buffers, whole (NULL entries:
 * the optimizer's own, which are then whole). */
static FG_MUST_USE fg_status write_file(fg_fabric *f, const char *path, const fg_train_state *st,
                                        fg_tensor *params, fg_tensor *const *states) {
    fg_module *m = st->model;
    FG_TRY(check_meta(st->meta, st->nmeta));
    int n = fg_module_num_params(m);
    int nstates = st->optimizer ? fg_optimizer_num_states(st->optimizer) : 0;
    fg_st_writer *w = fg_st_writer_new();
    char(*names)[256] = fg_calloc((size_t)(n * (1 + nstates) + 1), 256);
    fg_status s = (!w || !names) ? FG_ENOMEM : FG_OK;
    if (s == FG_OK)
        s = add_param_views(w, m, "", params ? params : fg_module_flat_params(m), names);
    for (int k = 0; k < nstates && s == FG_OK; k++) {
        char prefix[96];
        snprintf(prefix, sizeof prefix, "optimizer.%s.", fg_optimizer_state_name(st->optimizer, k));
        fg_tensor *state = states[k] ? states[k] : fg_optimizer_state(st->optimizer, k);
        s = add_param_views(w, m, prefix, state, names + n * (k + 1));
    }
    char(*many)[256] = NULL;
    if (s == FG_OK && st->noptimizers > 0) s = add_many(w, st, &many);
    /* the buffers (BatchNorm's running statistics), whole on every rank,
     * after the parameters as in PyTorch's state_dict */
    for (int64_t i = 0; i < fg_module_num_buffers(m) && s == FG_OK; i++) {
        fg_tensor *b = fg_module_buffer(m, i);
        s = fg_st_writer_add_on(w, fg_module_buffer_name(m, i), fg_tensor_dtype(b),
                                fg_tensor_ndim(b), fg_tensor_shape(b), fg_tensor_data(b),
                                fg_tensor_dev(b));
    }
    if (s == FG_OK) s = fg__fabric_ckpt_meta(f, st, w);
    if (s == FG_OK) s = fg_st_writer_write(w, path);
    fg_st_writer_free(w);
    fg_free(names);
    fg_free(many);
    return s;
}

/* Does this save write a folder? state_dict_type sharded, or auto under a
 * kind whose row saves sharded (the deepspeed strategies, as DeepSpeed's
 * checkpoints are folders of shards) with one optimizer or none. */
static bool save_sharded(const fg_fabric *f, const fg_train_state *st) {
    fg_state_dict_type t = f->cfg.sharded.state_dict_type;
    if (t != FG_STATE_DICT_AUTO) return t == FG_STATE_DICT_SHARDED;
    const fg_strategy_info *row = fg_strategy_info_of(f->plan.strategy);
    return row && row->saves_sharded && st->noptimizers == 0;
}

fg_status fg_fabric_save(fg_fabric *f, const char *path, const fg_train_state *st) {
    if (!st || !st->model || !path) return fg_error(FG_EINVAL, "save: needs a path and a model");
    FG_TRY(check_many(st, "save"));
    /* a round in the background (hivemind's delay_optimizer_step) ends first */
    if (f->strategy) FG_TRY(fg_strategy_settle(f->strategy));
    if (save_sharded(f, st)) {
        if (st->noptimizers > 0)
            return fg_error(FG_EUNSUPPORTED,
                            "save: a sharded checkpoint (state_dict_type sharded) of %d "
                            "optimizers: use state_dict_type full",
                            st->noptimizers);
        return fg__fabric_save_sharded(f, path, st);
    }
    return fg__fabric_save_streamed(f, path, st);
}

/* The full save as it was before it streamed: rank 0 gathers the whole
 * parameters (stage 3) and optimizer state, then writes. Kept as the
 * reference the streamed save (fabric_save_stream.c) must equal byte for
 * byte (tests/mp/test_fabric_ckpt_stream.c). */
fg_status fg__fabric_save_gathered(fg_fabric *f, const char *path, const fg_train_state *st) {
    if (!st || !st->model || !path) return fg_error(FG_EINVAL, "save: needs a path and a model");
    FG_TRY(check_many(st, "save"));
    int nstates = st->optimizer ? fg_optimizer_num_states(st->optimizer) : 0;
    fg_tensor *full[FG_FABRIC_MAX_STATES] = {0};
    if (nstates > FG_FABRIC_MAX_STATES)
        return fg_error(FG_EINTERNAL, "save: %d optimizer states, at most %d", nstates,
                        FG_FABRIC_MAX_STATES);
    fg_tensor *params = NULL; /* stage 3: the parameters gathered on rank 0 */
    FG_TRY(fg__fabric_gather_params(f, st->model, &params));
    fg_status s = st->optimizer ? fg__fabric_gather_states(f, st->optimizer, full) : FG_OK;
    if (s != FG_OK) {
        fg_tensor_free(params);
        return s;
    }
    if (f->global_rank == 0) s = write_file(f, path, st, params, full);
    fg_tensor_free(params);
    fg__fabric_free_states(full, nstates);
    /* Tell every rank whether the file is whole before anyone goes on. */
    int32_t ok = s == FG_OK;
    if (f->comm) {
        fg_status cs = fg_comm_broadcast(f->comm, &ok, &ok, 1, FG_I32, 0);
        if (cs != FG_OK) return cs;
    }
    if (s != FG_OK) return s;
    if (!ok) return fg_error(FG_EIO, "save: rank 0 could not write %s", path);
    return FG_OK;
}

/* Reads each parameter (or optimizer slice) by name into `base`, which
 * holds elements [rlo, rhi) of the flat layout in dtype dt (what this rank
 * holds: fg__fabric_held) in memory of `dev` (NULL: the host; on a device
 * each piece goes in through its copy calls, fg_st_read_range_on),
 * collecting every mismatch in msg. */
static void read_views(fg_st_file *file, fg_module *m, const char *prefix, fg_dev *dev, char *base,
                       fg_dtype dt, int64_t rlo, int64_t rhi, char *msg, size_t cap, int *nbad,
                       bool *used) {
    int n = fg_module_num_params(m);
    size_t es = fg_dtype_size(dt);
    for (int i = 0; i < n; i++) {
        fg_tensor *p = fg_module_param(m, i);
        char name[256];
        snprintf(name, sizeof name, "%s%s", prefix, fg_module_param_name(m, i));
        int64_t k = fg_st_find(file, name);
        size_t len = strlen(msg);
        if (k < 0) {
            if ((*nbad)++ < 8) snprintf(msg + len, cap - len, "; missing \"%s\"", name);
            continue;
        }
        used[k] = true;
        fg_st_info info;
        if (fg_st_info_at(file, k, &info) != FG_OK) continue;
        bool same = info.ndim == fg_tensor_ndim(p);
        for (int d = 0; same && d < info.ndim; d++) same = info.shape[d] == fg_tensor_shape(p)[d];
        if (!same) {
            char want[96];
            if ((*nbad)++ < 8) {
                char got[160] = "[";
                for (int d = 0; d < info.ndim; d++)
                    snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "",
                             (long long)info.shape[d]);
                snprintf(msg + len, cap - len, "; \"%s\" is %s] in the file, the model has %s",
                         name, got, fg_tensor_describe(p, want, sizeof want));
            }
            continue;
        }
        int64_t off = fg_module_param_offset(m, i), pn = fg_tensor_numel(p);
        int64_t lo = FG_MAX(off, rlo), hi = FG_MIN(off + pn, rhi);
        if (lo >= hi) continue; /* another rank's shard */
        void *dst = base + (size_t)(lo - rlo) * es;
        if (fg_st_read_range_on(file, k, dev, dst, dt, lo - off, hi - off) != FG_OK) {
            len = strlen(msg);
            if ((*nbad)++ < 8) snprintf(msg + len, cap - len, "; %s", fg_last_error());
        }
    }
}

/* A copy of the file's metadata in one block: the fg_kv array, then the
 * strings. NULL with FG_ENOMEM. */
/* The model's buffers by name, whole, into the model (as the parameters:
 * every mismatch into msg). */
static void read_buffers(fg_st_file *file, fg_module *m, char *msg, size_t cap, int *nbad,
                         bool *used) {
    for (int64_t i = 0; i < fg_module_num_buffers(m); i++) {
        fg_tensor *b = fg_module_buffer(m, i);
        const char *name = fg_module_buffer_name(m, i);
        int64_t k = fg_st_find(file, name);
        size_t len = strlen(msg);
        fg_st_info info;
        if (k < 0) {
            if ((*nbad)++ < 8) snprintf(msg + len, cap - len, "; missing \"%s\"", name);
            continue;
        }
        used[k] = true;
        if (fg_st_info_at(file, k, &info) != FG_OK || info.numel != fg_tensor_numel(b) ||
            fg_st_read_range_on(file, k, fg_tensor_dev(b), fg_tensor_data(b), fg_tensor_dtype(b), 0,
                                info.numel) != FG_OK) {
            if ((*nbad)++ < 8)
                snprintf(msg + len, cap - len,
                         "; buffer \"%s\" does not fit the model's %lld "
                         "elements",
                         name, (long long)fg_tensor_numel(b));
        }
    }
}

static fg_kv *copy_meta(const fg_st_file *file, int64_t *n_out) {
    int64_t n = fg_st_meta_count(file);
    size_t bytes = (size_t)n * sizeof(fg_kv);
    for (int64_t i = 0; i < n; i++) {
        const char *k, *v;
        if (fg_st_meta_at(file, i, &k, &v) != FG_OK) return NULL;
        bytes += strlen(k) + strlen(v) + 2;
    }
    fg_kv *kv = fg_alloc(bytes);
    if (!kv) return NULL;
    char *p = (char *)(kv + n);
    for (int64_t i = 0; i < n; i++) {
        const char *k, *v;
        if (fg_st_meta_at(file, i, &k, &v) != FG_OK) {
            fg_free(kv);
            return NULL;
        }
        size_t kl = strlen(k) + 1, vl = strlen(v) + 1;
        kv[i].key = memcpy(p, k, kl);
        kv[i].value = memcpy(p + kl, v, vl);
        p += kl + vl;
    }
    *n_out = n;
    return kv;
}

const char *fg_fabric_loaded_meta(const fg_fabric *f, const char *key) {
    for (int64_t i = 0; f && key && i < f->nloaded_meta; i++)
        if (!strcmp(f->loaded_meta[i].key, key)) return f->loaded_meta[i].value;
    return NULL;
}

/* The first cap - 4 bytes of s, with "..." when cut and '?' for anything
 * but printable ASCII, so that a hostile header cannot reach the terminal. */
static void printable_copy(char *out, size_t cap, const char *s) {
    size_t n = 0, len = s ? strlen(s) : 0;
    for (; n < len && n + 4 < cap; n++) out[n] = s[n] >= 0x20 && s[n] < 0x7f ? s[n] : '?';
    if (n < len) out[n++] = '.', out[n++] = '.', out[n++] = '.';
    out[n] = '\0';
}

/* st->optimizers' step counts, lr and groups from the optimizer.N.*
 * metadata; the file must hold as many optimizers. */
static FG_MUST_USE fg_status load_many_meta(fg_st_file *file, const char *path,
                                            const fg_train_state *st) {
    const char *cnt = fg_st_meta_get(file, "optimizers");
    if (!st->noptimizers) return FG_OK;
    if (!cnt || atoi(cnt) != st->noptimizers)
        return fg_error(FG_EMISMATCH,
                        "load %s: the file holds %s optimizer%s, the fit has %d: resume with the "
                        "optimizers the run was saved with",
                        path, cnt ? cnt : "one or no", cnt && !strcmp(cnt, "1") ? "" : "s",
                        st->noptimizers);
    for (int n = 0; n < st->noptimizers; n++) {
        fg_optimizer *o = st->optimizers[n];
        char key[64];
        snprintf(key, sizeof key, "optimizer.%d.optimizer_steps", n);
        const char *steps = fg_st_meta_get(file, key);
        snprintf(key, sizeof key, "optimizer.%d.lr", n);
        const char *lr = fg_st_meta_get(file, key);
        char *end = NULL;
        long long sc = steps ? strtoll(steps, &end, 10) : -1;
        if (!steps || !lr || *end || sc < 0)
            return fg_error(FG_EFORMAT,
                            "load %s: optimizer %d has no valid optimizer.%d.optimizer_steps "
                            "and optimizer.%d.lr metadata",
                            path, n, n, n);
        fg_status s = fg_optimizer_set_step_count(o, sc);
        if (s == FG_OK) s = fg_optimizer_set_lr(o, strtod(lr, NULL));
        for (int g = 1; s == FG_OK && g < fg_optimizer_num_groups(o); g++) {
            snprintf(key, sizeof key, "optimizer.%d.lr.%d", n, g);
            const char *v = fg_st_meta_get(file, key);
            if (v) s = fg_optimizer_set_group_lr(o, g, strtod(v, NULL));
            snprintf(key, sizeof key, "optimizer.%d.weight_decay.%d", n, g);
            v = fg_st_meta_get(file, key);
            if (s == FG_OK && v) s = fg_optimizer_set_group_weight_decay(o, g, strtod(v, NULL));
        }
        if (s != FG_OK) return fg_error_wrap(FG_EFORMAT, "load %s: optimizer %d settings", path, n);
    }
    return FG_OK;
}

fg_status fg_fabric_load(fg_fabric *f, const char *path, fg_train_state *st) {
    if (!st || !st->model || !path) return fg_error(FG_EINVAL, "load: needs a path and a model");
    FG_TRY(check_many(st, "load"));
    if (f->strategy) FG_TRY(fg_strategy_settle(f->strategy));
    fg_st_file *file = fg_st_open(path);
    if (!file) return fg_last_status();
    const char *fmt = fg_st_meta_get(file, "format");
    if (!fmt || strcmp(fmt, FORMAT_NAME)) {
        /* fmt points into the file's header: copy it before the close */
        char got[72];
        bool shard = fmt && !strcmp(fmt, SHARD_FORMAT_NAME);
        printable_copy(got, sizeof got, fmt);
        fg_st_close(file);
        if (shard)
            return fg_error(
                FG_EFORMAT,
                "%s: one shard of a sharded checkpoint (metadata \"format\" is \"%s\"), "
                "not a whole one: pass the folder that holds it and " FG_ST_INDEX_NAME,
                path, got);
        return fg_error(FG_EFORMAT,
                        "%s: not a fulgur checkpoint (metadata \"format\" is %s%s%s; fulgur "
                        "writes \"" FORMAT_NAME "\"): pass a checkpoint that fulgur saved, or "
                        "the folder of a sharded one",
                        path, fmt ? "\"" : "", fmt ? got : "missing", fmt ? "\"" : "");
    }
    fg__ckpt_counters c; /* every counter checked before anything changes */
    fg_status ms = fg__fabric_meta_read(file, path, &c);
    if (ms != FG_OK) {
        fg_st_close(file);
        return ms;
    }
    int64_t count = fg_st_count(file);
    bool *used = fg_calloc((size_t)count + 1, 1);
    char msg[2048] = "";
    int nbad = 0;
    if (!used) {
        fg_st_close(file);
        return FG_ENOMEM;
    }
    fg_module *m = st->model;
    fg__held h;
    fg_status hs = fg__fabric_held(f, st, &h);
    if (hs != FG_OK) {
        fg_free(used);
        fg_st_close(file);
        return hs;
    }
    read_views(file, m, "", h.pdev, h.params, h.pdt, h.plo, h.phi, msg, sizeof msg, &nbad, used);
    read_buffers(file, m, msg, sizeof msg, &nbad, used);
    fg_optimizer *opt = st->optimizer;
    for (int k = 0; k < h.nstates; k++) {
        char prefix[96];
        snprintf(prefix, sizeof prefix, "optimizer.%s.", fg_optimizer_state_name(opt, k));
        read_views(file, m, prefix, h.sdev, h.states[k], h.sdt, h.slo, h.shi, msg, sizeof msg,
                   &nbad, used);
    }
    for (int n = 0; n < st->noptimizers; n++) {
        fg_optimizer *o = st->optimizers[n];
        fg_module *sub = fg_optimizer_module(o);
        for (int k = 0; k < fg_optimizer_num_states(o); k++) {
            char prefix[128];
            fg_tensor *state = fg_optimizer_state(o, k);
            snprintf(prefix, sizeof prefix, "optimizer.%d.%s.", n, fg_optimizer_state_name(o, k));
            read_views(file, sub, prefix, fg_tensor_dev(state), fg_tensor_data(state),
                       fg_tensor_dtype(state), 0, fg_tensor_numel(state), msg, sizeof msg, &nbad,
                       used);
        }
    }
    for (int64_t k = 0; k < count; k++) {
        fg_st_info info;
        if (used[k] || fg_st_info_at(file, k, &info) != FG_OK) continue;
        if (!opt && !st->noptimizers && !strncmp(info.name, "optimizer.", 10)) continue;
        size_t len = strlen(msg);
        if (nbad++ < 8) snprintf(msg + len, sizeof msg - len, "; unexpected \"%s\"", info.name);
    }
    fg_free(used);
    if (nbad) {
        fg_st_close(file);
        return fg_error(FG_EMISMATCH, "%s does not fit the model (%d tensor%s differ%s)%s", path,
                        nbad, nbad == 1 ? "" : "s", nbad == 1 ? "s" : "", msg);
    }
    fg_status ss = load_many_meta(file, path, st);
    if (ss != FG_OK) {
        fg_st_close(file);
        return ss;
    }
    ss = fg__fabric_scaler_load(f, &c);
    if (ss != FG_OK) {
        fg_st_close(file);
        return fg_error_wrap(ss, "load %s: the loss scaler", path);
    }
    int64_t nmeta = 0;
    fg_kv *meta = copy_meta(file, &nmeta);
    if (!meta) {
        fg_st_close(file);
        return fg_error_wrap(FG_ENOMEM, "load %s: metadata", path);
    }
    st->step = c.step;
    st->epoch = c.epoch;
    st->batch_in_epoch = c.batch_in_epoch;
    if (c.has_seed) st->seed = c.seed;
    st->samples_in_epoch = c.samples_in_epoch;
    st->global_batch = c.global_batch;
    if (opt) {
        fg_status os = fg_optimizer_set_step_count(opt, c.optimizer_steps);
        if (os == FG_OK && c.has_lr) os = fg_optimizer_set_lr(opt, c.lr);
        for (int g = 1; os == FG_OK && g < fg_optimizer_num_groups(opt); g++) {
            char key[48];
            snprintf(key, sizeof key, "lr.%d", g);
            const char *v = fg_st_meta_get(file, key);
            if (v) os = fg_optimizer_set_group_lr(opt, g, strtod(v, NULL));
            snprintf(key, sizeof key, "weight_decay.%d", g);
            v = fg_st_meta_get(file, key);
            if (os == FG_OK && v) os = fg_optimizer_set_group_weight_decay(opt, g, strtod(v, NULL));
        }
        if (os != FG_OK) { /* a value the optimizer refuses: the file is bad */
            fg_free(meta);
            fg_st_close(file);
            return fg_error_wrap(FG_EFORMAT, "load %s: optimizer settings", path);
        }
    }
    fg_free(f->loaded_meta);
    f->loaded_meta = meta;
    f->nloaded_meta = nmeta;
    st->meta = meta;
    st->nmeta = nmeta;
    fg_st_close(file);
    return FG_OK;
}
