/* Checkpoints of the trainer: what fg_trainer_save_checkpoint writes
 * beside the fabric's weights, optimizer and counters (fg_fabric_save),
 * as metadata key/value strings:
 *
 *   trainer.*                the loop's position: the batch of the epoch and
 *                            of the run, batches that stepped, whether the
 *                            last batch's validation check is pending and
 *                            which batch's validation ran, whether the epoch
 *                            end was reached, and the epoch's logged values
 *                            (exactly: hex floats);
 *   callbacks.<state key>.*  each callback's state_dict;
 *   anything else            the module's on_save_checkpoint pairs.
 *
 * Resolving ckpt_path ("last", "best", a file) and loading: weights only
 * for validate/test/predict, everything for fit. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "trainer_impl.h"

/* ------------------------------------------------------------- state dict */

/* The fabric's own keys (fabric.h), which no one else may use. */
static const char *const k_fabric_keys[] = {
    "format",   "fulgur_version",  "step", "epoch",  "batch_in_epoch", "seed", "world_size",
    "strategy", "optimizer_steps", "lr",   "save_id"};

static bool reserved(const char *key) {
    if (!strncmp(key, "trainer.", 8) || !strncmp(key, "callbacks.", 10)) return true;
    for (size_t i = 0; i < sizeof k_fabric_keys / sizeof k_fabric_keys[0]; i++)
        if (!strcmp(key, k_fabric_keys[i])) return true;
    return false;
}

fg_status fg__sd_put(fg_state_dict *sd, const char *key, const char *value) {
    size_t pl = strlen(sd->prefix ? sd->prefix : "");
    char *k = fg_alloc(pl + strlen(key) + 1);
    char *v = fg_strdup(value);
    if (!k || !v) {
        fg_free(k);
        fg_free(v);
        return FG_ENOMEM;
    }
    memcpy(k, sd->prefix ? sd->prefix : "", pl);
    strcpy(k + pl, key);
    for (int64_t i = 0; i < sd->n; i++)
        if (!strcmp(sd->kv[i].key, k)) {
            fg_free(k);
            fg_free((char *)sd->kv[i].value);
            sd->kv[i].value = v;
            return FG_OK;
        }
    if (sd->n == sd->cap) {
        int64_t cap = sd->cap ? 2 * sd->cap : 32;
        fg_kv *p = fg_realloc(sd->kv, (size_t)cap * sizeof *p);
        if (!p) {
            fg_free(k);
            fg_free(v);
            return FG_ENOMEM;
        }
        sd->kv = p;
        sd->cap = cap;
    }
    sd->kv[sd->n++] = (fg_kv){k, v};
    return FG_OK;
}

void fg__sd_free(fg_state_dict *sd) {
    for (int64_t i = 0; i < sd->n; i++) {
        fg_free((char *)sd->kv[i].key);
        fg_free((char *)sd->kv[i].value);
    }
    fg_free(sd->kv);
    sd->kv = NULL;
    sd->n = sd->cap = 0;
}

fg_status fg_state_dict_set(fg_state_dict *sd, const char *key, const char *value) {
    if (!sd || !key || !key[0] || !value)
        return fg_error(FG_EINVAL, "state_dict set: needs a state dict, a non-empty key and a "
                                   "value");
    if (sd->readonly)
        return fg_error(FG_ESTATE,
                        "state_dict set(\"%s\"): this state dict is being read (a "
                        "checkpoint load)",
                        key);
    if ((!sd->prefix || !sd->prefix[0]) && reserved(key))
        return fg_error(FG_EINVAL,
                        "state_dict set(\"%s\"): the key is the trainer's or the fabric's "
                        "(trainer.*, callbacks.*, %s, ...): choose another",
                        key, k_fabric_keys[2]);
    return fg__sd_put(sd, key, value);
}

fg_status fg_state_dict_set_f64(fg_state_dict *sd, const char *key, double v) {
    char buf[64];
    snprintf(buf, sizeof buf, "%.17g", v);
    return fg_state_dict_set(sd, key, buf);
}

fg_status fg_state_dict_set_i64(fg_state_dict *sd, const char *key, int64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", (long long)v);
    return fg_state_dict_set(sd, key, buf);
}

const char *fg_state_dict_get(const fg_state_dict *sd, const char *key) {
    if (!sd || !key) return NULL;
    size_t pl = strlen(sd->prefix ? sd->prefix : "");
    const fg_kv *kv = sd->readonly ? sd->src : sd->kv;
    int64_t n = sd->readonly ? sd->nsrc : sd->n;
    for (int64_t i = 0; i < n; i++)
        if (!strncmp(kv[i].key, sd->prefix ? sd->prefix : "", pl) && !strcmp(kv[i].key + pl, key))
            return kv[i].value;
    return NULL;
}

bool fg_state_dict_get_f64(const fg_state_dict *sd, const char *key, double *out) {
    const char *v = fg_state_dict_get(sd, key);
    if (!v || !v[0]) return false;
    char *end;
    double d = strtod(v, &end);
    if (*end) return false;
    if (out) *out = d;
    return true;
}

bool fg_state_dict_get_i64(const fg_state_dict *sd, const char *key, int64_t *out) {
    const char *v = fg_state_dict_get(sd, key);
    if (!v || !v[0]) return false;
    char *end;
    long long d = strtoll(v, &end, 10);
    if (*end) return false;
    if (out) *out = d;
    return true;
}

/* -------------------------------------------------------------------- save */

static FG_MUST_USE fg_status put_i64(fg_state_dict *sd, const char *key, int64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", (long long)v);
    return fg__sd_put(sd, key, buf);
}

static FG_MUST_USE fg_status parent_dir(const char *path) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return FG_OK;
    *slash = '\0';
    return fg__mkdirs(dir);
}

fg_status fg__save_checkpoint(fg_trainer *t, const char *path) {
    FG_TRY(fg__ckpt_optimizers_ok(t));
    fg_state_dict sd = {0};
    /* while a window is open, the state at its start (weights unchanged) */
    bool snap = t->mid_window && t->fn == FG_FIT;
    int64_t batch_idx = snap ? t->snap_batch_idx : t->batch_idx;
    fg_status s = put_i64(&sd, "trainer.total_batch_idx",
                          snap ? t->snap_total_batch_idx : t->total_batch_idx);
    if (s == FG_OK)
        s = put_i64(&sd, "trainer.batches_that_stepped",
                    snap ? t->snap_batches_that_stepped : t->batches_that_stepped);
    if (s == FG_OK) s = put_i64(&sd, "trainer.pending_advance", !snap && t->pending_advance);
    if (s == FG_OK) s = put_i64(&sd, "trainer.pending_stepped", !t->mid_window);
    if (s == FG_OK) s = put_i64(&sd, "trainer.val_done_at", t->val_done_at);
    if (s == FG_OK) s = put_i64(&sd, "trainer.epoch_end", t->in_epoch_end);
    if (s == FG_OK) s = fg__sched_save(t, &sd);
    if (s == FG_OK) {
        char *res = fg__results_encode(snap ? &t->snap_res : &t->train_res);
        s = res ? fg__sd_put(&sd, "trainer.results", res) : FG_ENOMEM;
        fg_free(res);
    }
    for (int i = 0; i < t->ncbs && s == FG_OK; i++) {
        fg_callback *cb = t->cbs[i];
        if (!cb->ops.state_dict) continue;
        size_t len = strlen(cb->state_key) + 12;
        char *prefix = fg_alloc(len);
        if (!prefix) {
            s = FG_ENOMEM;
            break;
        }
        snprintf(prefix, len, "callbacks.%s.", cb->state_key);
        sd.prefix = prefix;
        s = cb->ops.state_dict(cb->ud, t, &sd);
        if (s != FG_OK) s = fg_error_wrap(s, "%s: state_dict", cb->state_key);
        sd.prefix = NULL;
        fg_free(prefix);
    }
    if (s == FG_OK && t->m.on_save_checkpoint) {
        s = t->m.on_save_checkpoint(t->m.ud, t, &sd);
        if (s != FG_OK) s = fg_error_wrap(s, "module on_save_checkpoint");
    }
    if (s == FG_OK && fg_fabric_is_global_zero(t->f)) s = parent_dir(path);
    /* every rank reaches the save (collective) even after a local failure */
    /* the elastic resume's position: samples of the epoch every rank together
     * took, and the global batch (fg_fabric_setup_global_batch) */
    int64_t samples = 0, global_batch = 0;
    if (t->fn == FG_FIT && t->train) {
        fg_dataloader_sample_position(t->train, NULL, &samples);
        if (snap) samples = t->snap_samples;
        int64_t bs = fg_dataloader_opts(t->train)->batch;
        global_batch = (bs ? bs : 1) * fg_fabric_world_size(t->f) * t->accumulate;
    }
    bool many = t->fn == FG_FIT && t->nopts > 1;
    fg_train_state st = {.model = t->model,
                         .optimizer = t->fn == FG_FIT && !many ? t->opt : NULL,
                         .optimizers = many ? t->opts : NULL,
                         .noptimizers = many ? t->nopts : 0,
                         .step = t->global_step,
                         .epoch = t->current_epoch,
                         .batch_in_epoch = batch_idx,
                         .samples_in_epoch = samples,
                         .global_batch = global_batch,
                         .meta = sd.kv,
                         .nmeta = sd.n};
    /* one reduce: 0 a rank failed, 1 a rank's weights are not all finite, 2 */
    double ok = 0;
    fg_status rs = fg_fabric_reduce_scalar(t->f,
                                           s != FG_OK              ? 0
                                           : fg__weights_finite(t) ? 2
                                                                   : 1,
                                           FG_REDUCE_OP_MIN, &ok);
    /* a failed reduce is the error (unless this rank failed first): never
     * read as "another rank failed" */
    if (s == FG_OK && rs != FG_OK) s = fg_error_wrap(rs, "save_checkpoint %s", path);
    if (s == FG_OK && ok < 1)
        s = fg_error(FG_EPEER, "save_checkpoint %s: another rank failed before the save", path);
    if (s == FG_OK) s = fg_fabric_save(t->f, path, &st);
    if (s == FG_OK) snprintf(t->last_saved, sizeof t->last_saved, "%s", path);
    if (s == FG_OK && ok == 2) snprintf(t->last_finite, sizeof t->last_finite, "%s", path);
    fg__sd_free(&sd);
    return s;
}

/* -------------------------------------------------------------------- load */

/* Every rank uses rank 0's answer: one 4 KiB broadcast. Collective. */
static FG_MUST_USE fg_status bcast_path(fg_trainer *t, char *buf, size_t cap) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", buf);
    FG_TRY(fg_fabric_broadcast_bytes(t->f, tmp, sizeof tmp, 0));
    tmp[sizeof tmp - 1] = '\0';
    snprintf(buf, cap, "%s", tmp);
    return FG_OK;
}

/* A checkpoint named by a path: a sharded save's folder is itself, another
 * folder its last.safetensors; a "last" link is followed to its file. */
static FG_MUST_USE fg_status resolve_named(const char *p, char *out, size_t cap) {
    char path[4096];
    struct stat st;
    if (stat(p, &st) == 0 && S_ISDIR(st.st_mode)) {
        char index[4200];
        snprintf(index, sizeof index, "%s/%s", p, FG_ST_INDEX_NAME);
        if (stat(index, &st) == 0) snprintf(path, sizeof path, "%s", p);
        else snprintf(path, sizeof path, "%s/last.safetensors", p);
    } else if (snprintf(path, sizeof path, "%s", p) >= (int)sizeof path) {
        return fg_error(FG_EINVAL, "ckpt_path=\"%.200s...\": too long", p);
    }
    struct stat lst;
    if (lstat(path, &lst) != 0)
        return fg_error(FG_EIO, "ckpt_path=\"%s\": no such file%s", p,
                        strcmp(path, p) ? " (looked for the folder's last.safetensors)" : "");
    if (S_ISLNK(lst.st_mode)) return fg_st_get_last(path, out, cap);
    if (strlen(path) >= cap) return fg_error(FG_EINVAL, "ckpt_path=\"%s\": too long", path);
    snprintf(out, cap, "%s", path);
    return FG_OK;
}

/* The newest last*.safetensors of the checkpoint callbacks' folders (a
 * link followed), "" when there is none. */
static FG_MUST_USE fg_status find_last(fg_trainer *t, char *out, size_t cap) {
    double newest = -1;
    char found[4096] = "";
    out[0] = '\0';
    for (int i = 0; i < t->ncbs; i++) {
        if (t->cbs[i]->kind != FG__CB_CHECKPOINT) continue;
        if (!fg_model_checkpoint_dirpath(t->cbs[i])[0])
            FG_TRY(fg__checkpoint_resolve_dir(t->cbs[i], t));
        char f[4096];
        double mt;
        if (fg__checkpoint_find_last(t->cbs[i], f, sizeof f, &mt) == FG_OK && mt > newest) {
            newest = mt;
            snprintf(found, sizeof found, "%s", f);
        }
    }
    fg_clear_error();
    return found[0] ? resolve_named(found, out, cap) : FG_OK;
}

/* A ModelCheckpoint's best_model_path as the checkpoint at `path` recorded
 * it, or "" */
static void best_recorded(const char *path, char *out, size_t cap) {
    out[0] = '\0';
    fg_st_file *f = fg_st_open(path);
    if (!f) {
        fg_clear_error();
        return;
    }
    static const char prefix[] = "callbacks.ModelCheckpoint", suffix[] = ".best_model_path";
    for (int64_t i = 0; i < fg_st_meta_count(f) && !out[0]; i++) {
        const char *k, *v;
        if (fg_st_meta_at(f, i, &k, &v) != FG_OK) break;
        size_t kl = strlen(k), sl = strlen(suffix);
        if (kl > sl && !strncmp(k, prefix, sizeof prefix - 1) && !strcmp(k + kl - sl, suffix) &&
            v[0])
            snprintf(out, cap, "%s", v);
    }
    fg_st_close(f);
}

fg_status fg_trainer_resolve_ckpt_path(fg_trainer *t, const char *p, char *out, size_t cap) {
    if (!t || !out || cap == 0) return fg_error(FG_EINVAL, "resolve_ckpt_path: NULL argument");
    out[0] = '\0';
    if (!p || !p[0]) return FG_OK;
    if (!strcmp(p, "last")) return find_last(t, out, cap);
    if (!strcmp(p, "best")) {
        fg_callback *cb = fg_trainer_checkpoint_callback(t);
        const char *best = cb ? fg_model_checkpoint_best_path(cb) : NULL;
        if (best && best[0]) return resolve_named(best, out, cap);
        /* none in this process: the one the newest "last" recorded (its
         * ModelCheckpoint state, as a resume would restore it) */
        char last[4096];
        FG_TRY(find_last(t, last, sizeof last));
        char rec[4096] = "";
        if (last[0]) best_recorded(last, rec, sizeof rec);
        if (rec[0]) return resolve_named(rec, out, cap);
        return fg_error(FG_EINVAL,
                        "ckpt_path=\"best\": %s: fit with a ModelCheckpoint that monitors a "
                        "metric first, or give a path or \"last\"",
                        !cb       ? "the trainer has no ModelCheckpoint"
                        : last[0] ? "its newest checkpoint records no best one (no monitor?)"
                                  : "it has saved no checkpoint yet");
    }
    return resolve_named(p, out, cap);
}

fg_status fg__resolve_ckpt_path(fg_trainer *t, const char *p) {
    t->ckpt_path[0] = '\0';
    if (!p) return FG_OK;
    if (strcmp(p, "best") && strcmp(p, "last")) {
        /* a folder or a link resolved; a missing file is the load's to name */
        if (resolve_named(p, t->ckpt_path, sizeof t->ckpt_path) != FG_OK) {
            fg_clear_error();
            snprintf(t->ckpt_path, sizeof t->ckpt_path, "%s", p);
        }
        return FG_OK;
    }
    /* rank 0's answer for all ("last" without a checkpoint: from scratch,
     * as Lightning's) */
    fg_status s = FG_OK;
    char msg[1024] = "";
    if (fg_fabric_is_global_zero(t->f)) {
        s = fg_trainer_resolve_ckpt_path(t, p, t->ckpt_path, sizeof t->ckpt_path);
        if (s != FG_OK) snprintf(msg, sizeof msg, "%s", fg_last_error());
    }
    char flag[1040];
    snprintf(flag, sizeof flag, "%d%s", s == FG_OK ? 0 : 1, msg);
    FG_TRY(fg_fabric_broadcast_bytes(t->f, flag, sizeof flag, 0));
    flag[sizeof flag - 1] = '\0';
    if (flag[0] != '0') return fg_error(FG_EINVAL, "%s", flag + 1);
    return bcast_path(t, t->ckpt_path, sizeof t->ckpt_path);
}

static int64_t meta_i64(const fg_state_dict *sd, const char *key, int64_t def) {
    int64_t v;
    return fg_state_dict_get_i64(sd, key, &v) ? v : def;
}

/* The trainer's keys of a checkpoint: an integer in [lo, hi] (digits, a
 * leading '-' only where lo < 0), or absent (*out untouched). */
static FG_MUST_USE fg_status trainer_int(const fg_st_file *file, const char *path, const char *key,
                                         int64_t lo, int64_t hi, int64_t *out) {
    const char *v = fg_st_meta_get(file, key);
    if (!v) return FG_OK;
    const char *p = v + (v[0] == '-' && lo < 0);
    bool ok = *p >= '0' && *p <= '9' && strlen(p) <= 18;
    for (const char *q = p; ok && *q; q++) ok = *q >= '0' && *q <= '9';
    long long x = ok ? strtoll(v, NULL, 10) : 0;
    if (!ok || x < lo || x > hi)
        return fg_error(FG_EFORMAT,
                        "%s: metadata \"%s\" is \"%.80s\": expected an integer from %lld to "
                        "%lld; the checkpoint is damaged or was edited: resume from another "
                        "checkpoint",
                        path, key, v, (long long)lo, (long long)hi);
    *out = x;
    return FG_OK;
}

/* Checks the trainer's keys and their agreement with the fabric's counters
 * before the load changes anything: every step and every epoch takes a
 * batch, so neither step, epoch nor the batches that stepped can exceed
 * the run's batches (trainer.total_batch_idx). The fabric's own keys are
 * checked by fg_fabric_load; a counter that does not parse here is left to
 * it. */
static FG_MUST_USE fg_status check_trainer_meta(const char *path) {
    fg_st_file *file = fg_st_open(path);
    if (!file) return fg_last_status();
    int64_t total = -1, stepped = -1, step = -1, epoch = -1, x = 0;
    const int64_t big = INT64_MAX / 4;
    fg_status s = trainer_int(file, path, "trainer.total_batch_idx", 0, big, &total);
    if (s == FG_OK) s = trainer_int(file, path, "trainer.batches_that_stepped", 0, big, &stepped);
    if (s == FG_OK) s = trainer_int(file, path, "trainer.pending_advance", 0, 1, &x);
    if (s == FG_OK) s = trainer_int(file, path, "trainer.pending_stepped", 0, 1, &x);
    if (s == FG_OK) s = trainer_int(file, path, "trainer.val_done_at", -1, big, &x);
    if (s == FG_OK) s = trainer_int(file, path, "trainer.epoch_end", 0, 1, &x);
    if (s == FG_OK && trainer_int(file, path, "step", 0, big, &step) != FG_OK) step = -1;
    if (s == FG_OK && trainer_int(file, path, "epoch", 0, big, &epoch) != FG_OK) epoch = -1;
    if (s == FG_OK) fg_clear_error(); /* a bad step or epoch: fg_fabric_load names it */
    const char *what[] = {"step", "epoch", "trainer.batches_that_stepped"};
    int64_t val[] = {step, epoch, stepped};
    /* several optimizers: each one's step is a global step (Lightning's) */
    const char *nopt = fg_st_meta_get(file, "optimizers");
    int64_t per_batch = nopt ? strtoll(nopt, NULL, 10) : 1;
    if (per_batch < 1 || per_batch > FG_FABRIC_MAX_OPTIMIZERS) per_batch = 1;
    for (int i = 0; s == FG_OK && total >= 0 && i < 3; i++)
        if (val[i] > (i == 0 ? total * per_batch : total))
            s = fg_error(FG_EFORMAT,
                         "%s: metadata \"%s\" is %lld, more than the %lld batches "
                         "the run had taken (trainer.total_batch_idx)%s: every %s takes a batch; "
                         "the checkpoint is damaged or was edited: resume from another checkpoint",
                         path, what[i], (long long)val[i], (long long)total,
                         i == 0 && per_batch > 1 ? " times its optimizers" : "",
                         i == 1 ? "epoch" : "step");
    fg_st_close(file);
    return s;
}

fg_status fg__load_checkpoint(fg_trainer *t, bool full) {
    if (full) FG_TRY(fg__ckpt_optimizers_ok(t));
    const char *path = t->ckpt_path;
    bool many = full && t->nopts > 1;
    fg_train_state st = {.model = t->model,
                         .optimizer = full && !many ? t->opt : NULL,
                         .optimizers = many ? t->opts : NULL,
                         .noptimizers = many ? t->nopts : 0};
    fg_status s = full ? check_trainer_meta(path) : FG_OK;
    if (s == FG_OK) s = fg_fabric_load(t->f, path, &st);
    if (s != FG_OK) return fg_error_wrap(s, "ckpt_path=\"%s\"", path);
    fg_state_dict sd = {.readonly = true, .prefix = "", .src = st.meta, .nsrc = st.nmeta};
    if (!full) {
        if (t->m.on_load_checkpoint) {
            s = t->m.on_load_checkpoint(t->m.ud, t, &sd);
            if (s != FG_OK) return fg_error_wrap(s, "module on_load_checkpoint");
        }
        return FG_OK;
    }
    t->global_step = st.step;
    t->current_epoch = st.epoch;
    t->batch_idx = st.batch_in_epoch;
    t->total_batch_idx = meta_i64(&sd, "trainer.total_batch_idx", 0);
    t->batches_that_stepped = meta_i64(&sd, "trainer.batches_that_stepped", st.step);
    t->pending_advance = meta_i64(&sd, "trainer.pending_advance", 0) != 0;
    t->pending_stepped = meta_i64(&sd, "trainer.pending_stepped", 1) != 0;
    t->val_done_at = meta_i64(&sd, "trainer.val_done_at", -1);
    bool epoch_end = meta_i64(&sd, "trainer.epoch_end", 0) != 0;
    FG_TRY(fg__results_decode(&t->train_res, fg_state_dict_get(&sd, "trainer.results")));
    FG_TRY(fg__sched_load(t, &sd));
    /* a checkpoint with the sample position resumes on any world size (the
     * batch index is then this world size's); an older one at its batch */
    bool by_samples = st.samples_in_epoch >= 0 && st.global_batch > 0;
    if (!by_samples && fg_dataloader_len_known(t->train) &&
        t->batch_idx > fg_dataloader_len(t->train))
        return fg_error(FG_EMISMATCH,
                        "ckpt_path=\"%s\": it stopped at batch %lld of epoch %lld, but an epoch "
                        "of this training data has %lld batches",
                        path, (long long)t->batch_idx, (long long)t->current_epoch,
                        (long long)fg_dataloader_len(t->train));
    /* the global batch kept on this world size (the accumulation
     * recomputed) and the epoch's remaining samples dealt to these ranks
     * (fg_fabric_setup_global_batch); the batch index follows */
    FG_TRY(fg_fabric_setup_global_batch(t->f, t->train, &t->accumulate, &st));
    int64_t e;
    fg_dataloader_position(t->train, &e, &t->batch_idx);
    /* of unknown length: an epoch-end save is at the stream's end */
    if (epoch_end && (t->batch_idx >= t->num_training_batches || t->train_len_unknown)) {
        /* saved at the end of a whole epoch: go on with the next */
        t->current_epoch++;
        t->batch_idx = 0;
        t->pending_advance = false;
        fg__results_reset(&t->train_res);
    } else {
        t->resumed_mid_epoch = true;
    }
    t->resumed = true;
    for (int i = 0; i < t->ncbs; i++) {
        fg_callback *cb = t->cbs[i];
        if (!cb->ops.load_state_dict) continue;
        size_t len = strlen(cb->state_key) + 12;
        char *prefix = fg_alloc(len);
        if (!prefix) return FG_ENOMEM;
        snprintf(prefix, len, "callbacks.%s.", cb->state_key);
        fg_state_dict csd = {.readonly = true, .prefix = prefix, .src = st.meta, .nsrc = st.nmeta};
        bool present = false;
        for (int64_t k = 0; k < st.nmeta && !present; k++)
            present = !strncmp(st.meta[k].key, prefix, strlen(prefix));
        s = present ? cb->ops.load_state_dict(cb->ud, t, &csd) : FG_OK;
        fg_free(prefix);
        if (s != FG_OK) return fg_error_wrap(s, "%s: load_state_dict", cb->state_key);
    }
    if (t->m.on_load_checkpoint) {
        s = t->m.on_load_checkpoint(t->m.ud, t, &sd);
        if (s != FG_OK) return fg_error_wrap(s, "module on_load_checkpoint");
    }
    return FG_OK;
}
