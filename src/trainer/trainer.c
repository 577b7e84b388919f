/* The trainer object: its options (checked and resolved once, in
 * fg_trainer_new, with Lightning's defaults and rules), its fabric, the
 * callbacks and logger it adds itself, the properties hooks read, and the
 * entry points. An entry point either runs its body here (inside a launch:
 * a handed fabric that is running, or fg_trainer_launch) or launches the
 * fabric, whose ranks each run the body. The body prepares what every loop
 * needs (setup hooks, the model, the fabric's setup, the loaders) and
 * always ends with the teardown hooks. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "trainer_impl.h"

_Thread_local int64_t fg__cur_batch_size;

/* ------------------------------------------------------------------ helpers */

fg_status fg__mkdirs(const char *path) {
    char buf[4096];
    if (!path || !path[0]) return FG_OK;
    if (strlen(path) >= sizeof buf) return fg_error(FG_EINVAL, "path too long: %.200s...", path);
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return fg_error(FG_EIO, "cannot create folder %s: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST)
        return fg_error(FG_EIO, "cannot create folder %s: %s", buf, strerror(errno));
    return FG_OK;
}

void fg__callback_metric_names(const fg_trainer *t, char *buf, size_t cap) {
    const fg_metric *m;
    int64_t n = fg_trainer_metrics(t, FG_CALLBACK_METRICS, &m);
    size_t len = 0;
    buf[0] = '\0';
    for (int64_t i = 0; i < n && len + 1 < cap; i++) {
        int w = snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", m[i].name);
        if (w < 0) break;
        len += (size_t)w < cap - len ? (size_t)w : cap - len - 1;
    }
}

void fg__fmt_float(char *buf, size_t cap, double v) {
    if (isnan(v)) {
        snprintf(buf, cap, "nan");
        return;
    }
    if (isinf(v)) {
        snprintf(buf, cap, v < 0 ? "-inf" : "inf");
        return;
    }
    /* the fewest significant digits that read back as v */
    char e[64];
    int p = 1;
    for (; p < 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, v);
        if (strtod(e, NULL) == v) break;
    }
    snprintf(e, sizeof e, "%.*e", p - 1, v);
    int exp10 = atoi(strchr(e, 'e') + 1);
    if (exp10 < -4 || exp10 >= 16) {
        snprintf(buf, cap, "%s", e); /* Python writes 1e-05 and 1.5e+16 the same way */
        return;
    }
    int decimals = p - 1 - exp10;
    snprintf(buf, cap, "%.*f", decimals > 0 ? decimals : 0, v);
    if (!strchr(buf, '.') && strlen(buf) + 3 <= cap) strcat(buf, ".0");
}

int64_t fg__limit_batches(fg_batches lim, int64_t len, const char *what, fg_status *st) {
    *st = FG_OK;
    switch (lim.kind) {
    case FG_BATCHES_COUNT: return (int64_t)lim.value < len ? (int64_t)lim.value : len;
    case FG_BATCHES_FRACTION: {
        int64_t n = (int64_t)((double)len * lim.value);
        if (n == 0 && lim.value > 0 && len > 0)
            *st = fg_error(FG_EINVAL,
                           "%s=%g of %lld batches is less than one batch: raise it to at "
                           "least %g, or use FG_COUNT(n)",
                           what, lim.value, (long long)len, 1.0 / (double)len);
        return n;
    }
    default: return len;
    }
}

fg_status fg__loader_batches(fg_trainer *t, const fg_dataloader *dl, fg_batches lim,
                             const char *what, int64_t *out) {
    fg_status st;
    bool stream = fg_dataloader_is_stream(dl);
    if (!fg_dataloader_len_known(dl)) {
        /* Lightning's inf: the epoch ends where the stream does */
        if (lim.kind == FG_BATCHES_COUNT) *out = (int64_t)lim.value;
        else if (lim.kind == FG_BATCHES_FRACTION && lim.value != 1.0)
            return fg_error(FG_EINVAL,
                            "%s=FG_FRACTION(%g): the loader's stream has no length (its "
                            "fg_stream_ops.len gives none), so a fraction of it is not known: "
                            "use FG_FRACTION(1) or FG_COUNT(n) batches, or give the stream a len "
                            "(Lightning refuses the same for an IterableDataset)",
                            what, lim.value);
        else *out = FG__LEN_UNKNOWN;
        return FG_OK;
    }
    int64_t len = fg_dataloader_len(dl);
    *out = fg__limit_batches(lim, len, what, &st);
    FG_TRY(st);
    if (stream && fg_fabric_world_size(t->f) > 1) {
        double least = 0;
        FG_TRY(fg_fabric_reduce_scalar(t->f, (double)*out, FG_REDUCE_OP_MIN, &least));
        *out = (int64_t)least;
    }
    return FG_OK;
}

fg_status fg_trainer_parse_duration(const char *s, double *seconds) {
    if (!s || !seconds || !s[0])
        return fg_error(FG_EINVAL,
                        "max_time=\"%s\": expected \"DD:HH:MM:SS\" (or HH:MM:SS, "
                        "MM:SS, seconds)",
                        s ? s : "(null)");
    double parts[4];
    int n = 0;
    const char *p = s;
    while (n < 4) {
        char *end;
        errno = 0;
        double v = strtod(p, &end);
        if (end == p || errno || v < 0 || !isfinite(v)) break;
        parts[n++] = v;
        if (*end == '\0') {
            static const double unit[4] = {86400, 3600, 60, 1};
            double total = 0;
            for (int i = 0; i < n; i++) total += parts[i] * unit[4 - n + i];
            *seconds = total;
            return FG_OK;
        }
        if (*end != ':') break;
        p = end + 1;
    }
    return fg_error(FG_EINVAL,
                    "max_time=\"%s\": expected \"DD:HH:MM:SS\" (or HH:MM:SS, MM:SS, seconds), "
                    "each a number >= 0",
                    s);
}

/* ------------------------------------------------------------------ options */

static FG_MUST_USE fg_status check_batches(fg_batches b, const char *name, bool allow_minus_one) {
    if (b.kind == FG_BATCHES_DEFAULT) return FG_OK;
    if (b.kind == FG_BATCHES_COUNT) {
        if (b.value != floor(b.value) || b.value < (allow_minus_one ? -1 : 0))
            return fg_error(FG_EINVAL, "%s=FG_COUNT(%g): expected a whole number >= %d", name,
                            b.value, allow_minus_one ? -1 : 0);
        return FG_OK;
    }
    if (b.kind == FG_BATCHES_FRACTION) {
        if (!(b.value >= 0 && b.value <= 1))
            return fg_error(FG_EINVAL, "%s=FG_FRACTION(%g): expected a fraction in [0, 1]", name,
                            b.value);
        return FG_OK;
    }
    return fg_error(FG_EINVAL, "%s: kind %d is none of FG_BATCHES_COUNT, FG_BATCHES_FRACTION", name,
                    (int)b.kind);
}

static FG_MUST_USE fg_status check_flag(fg_flag v, const char *name) {
    if (v == FG_FLAG_DEFAULT || v == FG_ON || v == FG_OFF) return FG_OK;
    return fg_error(FG_EINVAL, "%s=%d: expected FG_ON, FG_OFF or 0 (the default)", name, (int)v);
}

static FG_MUST_USE fg_status check_opts(const fg_trainer_opts *o) {
#define NEED(cond, ...)                                                                            \
    if (!(cond)) return fg_error(FG_EINVAL, __VA_ARGS__)
    NEED(o->max_epochs >= -1, "max_epochs=%lld: expected -1 (no limit), 0 (unset) or more",
         (long long)o->max_epochs);
    NEED(o->max_steps >= -1, "max_steps=%lld: expected -1 (no limit), 0 (unset) or more",
         (long long)o->max_steps);
    NEED(o->min_epochs >= 0, "min_epochs=%lld: expected >= 0", (long long)o->min_epochs);
    NEED(o->min_steps >= 0, "min_steps=%lld: expected >= 0", (long long)o->min_steps);
    NEED(o->max_time >= 0 && isfinite(o->max_time),
         "max_time=%g: expected seconds >= 0 (0 = no limit)", o->max_time);
    NEED(o->accumulate_grad_batches >= 0, "accumulate_grad_batches=%lld: expected >= 1",
         (long long)o->accumulate_grad_batches);
    NEED(o->gradient_clip_val >= 0 && isfinite(o->gradient_clip_val),
         "gradient_clip_val=%g: expected >= 0 (0 = no clipping)", o->gradient_clip_val);
    NEED(o->gradient_clip_algorithm == FG_CLIP_NORM || o->gradient_clip_algorithm == FG_CLIP_VALUE,
         "gradient_clip_algorithm=%d: expected FG_CLIP_NORM (\"norm\") or FG_CLIP_VALUE "
         "(\"value\")",
         (int)o->gradient_clip_algorithm);
    NEED(o->check_val_every_n_epoch >= -1,
         "check_val_every_n_epoch=%lld: expected >= 1, 0 (= 1) or -1 (None)",
         (long long)o->check_val_every_n_epoch);
    NEED(o->on_nonfinite >= FG_NONFINITE_IGNORE && o->on_nonfinite <= FG_NONFINITE_SKIP,
         "on_nonfinite=%d: expected FG_NONFINITE_IGNORE, FG_NONFINITE_STOP or FG_NONFINITE_SKIP",
         (int)o->on_nonfinite);
    NEED(o->fast_dev_run >= 0, "fast_dev_run=%lld: expected 0 (off) or a number of batches",
         (long long)o->fast_dev_run);
    NEED(o->log_every_n_steps >= 0, "log_every_n_steps=%lld: expected >= 1 (0 = 50)",
         (long long)o->log_every_n_steps);
    NEED(o->num_nodes >= 0, "num_nodes=%d: expected >= 1 (0 = the default)", o->num_nodes);
    NEED(o->ncallbacks >= 0 && (o->ncallbacks == 0 || o->callbacks),
         "callbacks: %d entries but no array", o->ncallbacks);
    NEED(o->nloggers >= 0 && (o->nloggers == 0 || o->loggers), "loggers: %d entries but no array",
         o->nloggers);
    for (int i = 0; i < o->ncallbacks; i++)
        NEED(o->callbacks[i], "callbacks[%d] is NULL (did its constructor fail?)", i);
    for (int i = 0; i < o->nloggers; i++)
        NEED(o->loggers[i], "loggers[%d] is NULL (did its constructor fail?)", i);
    NEED(!(o->fabric && (o->accelerator || o->strategy || o->devices || o->precision ||
                         o->num_nodes || o->seed)),
         "fabric is given together with accelerator/strategy/devices/precision/num_nodes/seed: "
         "set those in the fabric's config instead");
    NEED(!(o->logger == FG_OFF && o->nloggers > 0),
         "logger=FG_OFF with %d loggers given: drop one of the two", o->nloggers);
    if (o->val_check_interval.kind == FG_BATCHES_COUNT)
        NEED(o->val_check_interval.value >= 1,
             "val_check_interval=FG_COUNT(%g): expected a number of batches >= 1",
             o->val_check_interval.value);
    NEED(!(o->check_val_every_n_epoch == -1 && o->val_check_interval.kind != FG_BATCHES_COUNT),
         "check_val_every_n_epoch=-1 (None) needs val_check_interval=FG_COUNT(n): validation then "
         "runs every n training batches of the whole run");
    NEED(o->num_sanity_val_steps.kind != FG_BATCHES_FRACTION,
         "num_sanity_val_steps is a count of batches: FG_COUNT(n), FG_COUNT(-1) for all");
#undef NEED
    FG_TRY(check_batches(o->val_check_interval, "val_check_interval", false));
    FG_TRY(check_batches(o->num_sanity_val_steps, "num_sanity_val_steps", true));
    FG_TRY(check_batches(o->limit_train_batches, "limit_train_batches", false));
    FG_TRY(check_batches(o->limit_val_batches, "limit_val_batches", false));
    FG_TRY(check_batches(o->limit_test_batches, "limit_test_batches", false));
    FG_TRY(check_batches(o->limit_predict_batches, "limit_predict_batches", false));
    FG_TRY(check_flag(o->enable_progress_bar, "enable_progress_bar"));
    FG_TRY(check_flag(o->enable_checkpointing, "enable_checkpointing"));
    FG_TRY(check_flag(o->logger, "logger"));
    return FG_OK;
}

/* Lightning's resolution of the loop's arguments, fast_dev_run last. */
static void resolve(fg_trainer *t) {
    const fg_trainer_opts *o = &t->o;
    t->max_steps = o->max_steps == 0 ? -1 : o->max_steps;
    if (o->max_epochs != 0) t->max_epochs = o->max_epochs;
    else t->max_epochs = (t->max_steps == -1 && o->max_time == 0) ? 1000 : -1;
    t->min_epochs = o->min_epochs;
    t->min_steps = o->min_steps;
    t->accumulate = o->accumulate_grad_batches ? o->accumulate_grad_batches : 1;
    t->log_every = o->log_every_n_steps ? o->log_every_n_steps : 50;
    t->check_val_every = o->check_val_every_n_epoch ? o->check_val_every_n_epoch : 1;
    t->clip_val = o->gradient_clip_val;
    t->val_check_interval = o->val_check_interval;
    if (t->val_check_interval.kind == FG_BATCHES_DEFAULT) t->val_check_interval = FG_FRACTION(1.0);
    t->num_sanity = o->num_sanity_val_steps;
    if (t->num_sanity.kind == FG_BATCHES_DEFAULT) t->num_sanity = FG_COUNT(2);
    t->limit_train = o->limit_train_batches;
    t->limit_val = o->limit_val_batches;
    t->limit_test = o->limit_test_batches;
    t->limit_predict = o->limit_predict_batches;
    t->fast_dev_run = o->fast_dev_run;
    if (t->fast_dev_run) {
        fg_batches n = FG_COUNT(t->fast_dev_run);
        t->limit_train = t->limit_val = t->limit_test = t->limit_predict = n;
        t->max_steps = t->fast_dev_run;
        t->num_sanity = FG_COUNT(0);
        t->max_epochs = 1;
        t->val_check_interval = FG_FRACTION(1.0);
        t->check_val_every = 1;
    }
}

static bool has_kind(const fg_trainer_opts *o, fg__cb_kind k) {
    for (int i = 0; i < o->ncallbacks; i++)
        if (o->callbacks[i]->kind == k) return true;
    return false;
}

/* The call order: the user's callbacks, then the trainer's own, with every
 * checkpoint callback moved to the end (Lightning's _reorder_callbacks), so
 * that the state a checkpoint saves is the other callbacks' latest. */
static FG_MUST_USE fg_status order_callbacks(fg_trainer *t) {
    int n = t->o.ncallbacks + t->nown;
    t->cbs = fg_calloc((size_t)n + 1, sizeof *t->cbs);
    if (!t->cbs) return FG_ENOMEM;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < n; i++) {
            fg_callback *cb =
                i < t->o.ncallbacks ? t->o.callbacks[i] : t->own_cbs[i - t->o.ncallbacks];
            if ((cb->kind == FG__CB_CHECKPOINT) == (pass == 1)) t->cbs[t->ncbs++] = cb;
        }
    }
    for (int i = 0; i < t->ncbs; i++)
        for (int j = 0; j < i; j++)
            if (!strcmp(t->cbs[i]->state_key, t->cbs[j]->state_key))
                return fg_error(FG_EINVAL,
                                "two callbacks have the state key \"%s\": a state key must be "
                                "unique among the trainer's callbacks (give them different "
                                "settings or names)",
                                t->cbs[i]->state_key);
    return FG_OK;
}

fg_trainer *fg_trainer_new(const fg_trainer_opts *opts) {
    fg_trainer_opts o = opts ? *opts : (fg_trainer_opts){0};
    if (check_opts(&o) != FG_OK) return NULL;
    if (o.fast_dev_run == 0 && o.enable_checkpointing == FG_OFF &&
        has_kind(&o, FG__CB_CHECKPOINT)) {
        fg_error(FG_EINVAL, "enable_checkpointing=FG_OFF but a ModelCheckpoint is among the "
                            "callbacks: drop one of the two");
        return NULL;
    }
    if (o.enable_progress_bar == FG_OFF && has_kind(&o, FG__CB_PROGRESS)) {
        fg_error(FG_EINVAL, "enable_progress_bar=FG_OFF but a progress bar is among the "
                            "callbacks: drop one of the two");
        return NULL;
    }
    fg_trainer *t = fg_calloc(1, sizeof *t);
    if (!t) return NULL;
    pthread_mutex_init(&t->log_mu, NULL);
    t->o = o;
    t->val_done_at = -1;
    resolve(t);
    fg_status s = FG_OK;
    t->root_dir = fg_strdup(o.default_root_dir ? o.default_root_dir : ".");
    if (!t->root_dir) s = FG_ENOMEM;
    /* the trainer's own callbacks: Lightning's defaults */
    if (s == FG_OK && o.enable_progress_bar != FG_OFF && !has_kind(&o, FG__CB_PROGRESS)) {
        if (!(t->own_cbs[t->nown] = fg_progress_bar_new(NULL))) s = fg_last_status();
        else t->nown++;
    }
    if (s == FG_OK && o.max_time > 0 && !has_kind(&o, FG__CB_TIMER)) {
        if (!(t->own_cbs[t->nown] = fg_timer_new(&(fg_timer_opts){.duration = o.max_time})))
            s = fg_last_status();
        else t->nown++;
    }
    if (s == FG_OK && o.enable_checkpointing != FG_OFF && !has_kind(&o, FG__CB_CHECKPOINT)) {
        if (!(t->own_cbs[t->nown] = fg_model_checkpoint_new(NULL))) s = fg_last_status();
        else t->nown++;
    }
    if (s == FG_OK) s = order_callbacks(t);
    /* loggers: the user's, or Lightning's default one */
    if (s == FG_OK && o.nloggers == 0 && o.logger != FG_OFF) {
        if (!(t->own_logger = fg_csv_logger_new(NULL))) s = fg_last_status();
    }
    int nl = o.nloggers ? o.nloggers : (t->own_logger ? 1 : 0);
    if (s == FG_OK && nl) {
        t->loggers = fg_calloc((size_t)nl, sizeof *t->loggers);
        if (!t->loggers) s = FG_ENOMEM;
        for (int i = 0; s == FG_OK && i < nl; i++)
            t->loggers[i] = o.nloggers ? o.loggers[i] : t->own_logger;
        t->nloggers = s == FG_OK ? nl : 0;
    }
    if (s == FG_OK) {
        if (o.fabric) {
            t->f = o.fabric;
        } else {
            t->f = fg_fabric_new(&(fg_fabric_config){.accelerator = o.accelerator,
                                                     .devices = o.devices,
                                                     .strategy = o.strategy,
                                                     .precision = o.precision,
                                                     .num_nodes = o.num_nodes,
                                                     .seed = o.seed,
                                                     .deterministic = o.deterministic});
            if (!t->f) s = fg_last_status();
            t->own_fabric = t->f != NULL;
        }
    }
    if (s != FG_OK) {
        fg_error_kept first;
        fg_error_keep(&first);
        fg_trainer_free(t);
        fg_error_restore(&first);
        return NULL;
    }
    t->o.callbacks = t->cbs;
    t->o.ncallbacks = t->ncbs;
    return t;
}

void fg_trainer_free(fg_trainer *t) {
    if (!t) return;
    fg_error_kept kept; /* a _free never changes the caller's error (core.h) */
    fg_error_keep(&kept);
    if (t->own_fabric) fg_fabric_free(t->f);
    for (int i = 0; i < t->nown; i++) fg_callback_free(t->own_cbs[i]);
    fg_logger_free(t->own_logger);
    fg_free(t->cbs);
    fg_free(t->loggers);
    fg_free(t->root_dir);
    fg_free(t->log_dir);
    fg__free_optimizers(t);
    fg_optimizer_free(t->eval_opt);
    fg__results_free(&t->train_res);
    fg__results_free(&t->eval_res);
    fg__results_free(&t->snap_res);
    fg__map_free(&t->callback_m);
    fg__map_free(&t->logged_m);
    fg__map_free(&t->pbar_m);
    pthread_mutex_destroy(&t->log_mu);
    fg_free(t);
    fg_error_restore(&kept);
}

/* --------------------------------------------------------------- properties */

fg_fabric *fg_trainer_fabric(const fg_trainer *t) { return t->f; }
fg_module *fg_trainer_model(const fg_trainer *t) { return t->model; }
fg_optimizer *fg_trainer_optimizer(const fg_trainer *t) { return t->opt; }
int64_t fg_trainer_global_step(const fg_trainer *t) { return t->global_step; }
int64_t fg_trainer_current_epoch(const fg_trainer *t) { return t->current_epoch; }
bool fg_trainer_is_global_zero(const fg_trainer *t) { return fg_fabric_is_global_zero(t->f); }
int fg_trainer_global_rank(const fg_trainer *t) { return fg_fabric_global_rank(t->f); }
int fg_trainer_world_size(const fg_trainer *t) { return fg_fabric_world_size(t->f); }
fg_trainer_fn fg_trainer_state_fn(const fg_trainer *t) { return t->fn; }
fg_stage fg_trainer_stage(const fg_trainer *t) { return t->stage; }
int64_t fg_trainer_num_training_batches(const fg_trainer *t) {
    return t->num_training_batches == FG__LEN_UNKNOWN ? -1 : t->num_training_batches;
}
int64_t fg_trainer_num_val_batches(const fg_trainer *t) { return t->num_val_batches; }
int64_t fg_trainer_max_epochs(const fg_trainer *t) { return t->max_epochs; }
int64_t fg_trainer_max_steps(const fg_trainer *t) { return t->max_steps; }
int64_t fg_trainer_accumulate_grad_batches(const fg_trainer *t) { return t->accumulate; }
int64_t fg_trainer_log_every_n_steps(const fg_trainer *t) { return t->log_every; }
int64_t fg_trainer_fast_dev_run(const fg_trainer *t) { return t->fast_dev_run; }
const char *fg_trainer_default_root_dir(const fg_trainer *t) { return t->root_dir; }
const char *fg_trainer_log_dir(const fg_trainer *t) {
    return t->log_dir ? t->log_dir : t->root_dir;
}
bool fg_trainer_should_stop(const fg_trainer *t) { return t->should_stop; }
void fg_trainer_set_should_stop(fg_trainer *t, bool stop) { t->should_stop = stop; }
const char *fg_trainer_ckpt_path(const fg_trainer *t) { return t->ckpt_path; }
const char *fg_trainer_last_saved_path(const fg_trainer *t) { return t->last_saved; }
bool fg_trainer_interrupted(const fg_trainer *t) { return t->interrupted; }
int64_t fg_trainer_skipped_steps(const fg_trainer *t, const char **last_reason) {
    if (last_reason) *last_reason = t->skip_reason;
    return t->skipped;
}
fg_callback *fg_trainer_checkpoint_callback(const fg_trainer *t) {
    for (int i = 0; i < t->ncbs; i++)
        if (t->cbs[i]->kind == FG__CB_CHECKPOINT) return t->cbs[i];
    return NULL;
}

fg_status fg_trainer_save_checkpoint(fg_trainer *t, const char *path) {
    if (!t || !path || !path[0]) return fg_error(FG_EINVAL, "save_checkpoint: needs a path");
    if (!t->in_run || !t->model)
        return fg_error(FG_ESTATE,
                        "save_checkpoint(\"%s\"): only inside fit, validate, test or "
                        "predict (the model is set up there)",
                        path);
    return fg__save_checkpoint(t, path);
}

/* ------------------------------------------------------------- entry points */

typedef struct entry {
    fg_trainer *t;
    fg_trainer_fn fn;
    fg_lightning_module m;
    fg_dataloader *a, *b;
    const char *ckpt;
    bool has_dm;
    fg_datamodule dm;
    fg_dataloader *const *list; /* several evaluation loaders, or NULL */
    int nlist;
    bool ran;         /* a rank body ran in this process */
    fg_status status; /* its status */
} entry;

static const char *fn_name(fg_trainer_fn fn) {
    static const char *const names[] = {"", "fit", "validate", "test", "predict"};
    return names[fn];
}

/* One run, one version: a built-in logger with no version of its own,
 * under the same save_dir and name as the first one, takes the first's
 * folder name (version_N) before it makes its folder. */
static void share_version(const fg_trainer *t, const fg__run_folder *first, fg__run_folder *rf) {
    if (!first || !rf || rf == first || !first->log_dir || rf->log_dir || rf->version) return;
    const char *a = first->save_dir ? first->save_dir : t->root_dir;
    const char *b = rf->save_dir ? rf->save_dir : t->root_dir;
    if (strcmp(a, b) != 0 || strcmp(first->name, rf->name) != 0) return;
    const char *base = strrchr(first->log_dir, '/');
    rf->version = fg_strdup(base ? base + 1 : first->log_dir); /* none: a folder of its own */
}

/* The log folder: rank 0 asks every logger for its folder (the built-in
 * ones share the first one's version), the first one's is the trainer's;
 * every rank gets it. Collective. */
static FG_MUST_USE fg_status resolve_log_dir(fg_trainer *t) {
    char buf[4096] = "";
    if (fg_fabric_is_global_zero(t->f)) {
        const char *d = NULL;
        fg__run_folder *first = t->nloggers ? t->loggers[0]->folder : NULL;
        for (int i = 0; i < t->nloggers && !t->fast_dev_run; i++) {
            fg_logger *lg = t->loggers[i];
            fg__run_folder *rf = lg->folder;
            bool shared = i > 0 && rf && !rf->log_dir && !rf->version;
            share_version(t, first, rf);
            shared = shared && rf->version;
            const char *di = lg->ops.log_dir ? lg->ops.log_dir(lg->ud, t->root_dir) : NULL;
            if (shared && first->vnum && rf->vnum && strcmp(rf->vnum, first->vnum)) {
                char *v = fg_strdup(first->vnum); /* v_num as the first one shows it */
                if (v) {
                    fg_free(rf->vnum);
                    rf->vnum = v;
                }
            }
            if (i == 0) d = di;
        }
        snprintf(buf, sizeof buf, "%s", d ? d : t->root_dir);
    }
    FG_TRY(fg_fabric_broadcast_bytes(t->f, buf, sizeof buf, 0));
    buf[sizeof buf - 1] = '\0';
    char *copy = fg_strdup(buf);
    if (!copy) return FG_ENOMEM;
    fg_free(t->log_dir);
    t->log_dir = copy;
    return FG_OK;
}

/* The loader for an entry point: the one given, else the data module's
 * hook (which = 0 train, 1 val, 2 test, 3 predict), else the module's. */
static fg_dataloader *pick_loader(fg_trainer *t, const entry *e, fg_dataloader *given, int which) {
    if (given) return given;
    if (e->has_dm) {
        fg_dataloader *(*dh[])(void *, fg_trainer *) = {e->dm.train_dataloader,
                                                        e->dm.val_dataloader, e->dm.test_dataloader,
                                                        e->dm.predict_dataloader};
        if (dh[which]) return dh[which](e->dm.ud, t);
    }
    fg_dataloader *(*mh[])(void *, fg_trainer *) = {t->m.train_dataloader, t->m.val_dataloader,
                                                    t->m.test_dataloader, t->m.predict_dataloader};
    return mh[which] ? mh[which](t->m.ud, t) : NULL;
}

/* The data module's prepare_data on each node's local rank 0 while the
 * others wait, then its setup on every rank. */
static FG_MUST_USE fg_status datamodule_start(entry *e) {
    fg_trainer *t = e->t;
    if (!e->has_dm) return FG_OK;
    fg_status s = FG_OK;
    if (e->dm.prepare_data) {
        if (fg_fabric_local_rank(t->f) == 0) s = e->dm.prepare_data(e->dm.ud, t);
        if (s != FG_OK) s = fg_error_wrap(s, "datamodule prepare_data");
        /* every rank reaches the barrier; a rank 0 failure still fails there */
        double bad = s != FG_OK, any = 0;
        fg_status bs = fg_fabric_reduce_scalar(t->f, bad, FG_REDUCE_OP_MAX, &any);
        if (s != FG_OK) return s;
        if (bs != FG_OK) return bs;
        if (any > 0)
            return fg_error(FG_EPEER, "datamodule prepare_data failed on another node's local "
                                      "rank 0");
    }
    if (e->dm.setup) {
        s = e->dm.setup(e->dm.ud, t, e->fn);
        if (s != FG_OK) return fg_error_wrap(s, "datamodule setup");
    }
    return FG_OK;
}

/* The kinds whose setup cuts the optimizer into shards (ZeRO, FSDP). */
static bool needs_opt_at_setup(const fg_trainer *t) {
    return fg_strategy_kind_is_sharded(fg_fabric_plan(t->f)->strategy);
}

/* What every entry point does before its loop. */
static FG_MUST_USE fg_status prepare(entry *e) {
    fg_trainer *t = e->t;
    const fg_lightning_module *m = &t->m;
    FG_TRY(datamodule_start(e));
    if (m->setup) FG_TRY(m->setup(m->ud, t, e->fn));
    for (int i = 0; i < t->ncbs; i++)
        if (t->cbs[i]->ops.setup) FG_TRY(t->cbs[i]->ops.setup(t->cbs[i]->ud, t, e->fn));
    /* Lightning's sharded-model context: configure_model runs under empty
     * init where setup shards the parameters (stage 3), so that the model
     * it builds is initialised shard by shard and never whole on a rank */
    bool empty = m->configure_model && !fg_fabric_model(t->f) && fg_fabric_shards_params(t->f);
    bool was = empty ? fg_module_set_empty_init(true) : false;
    fg_module *model = m->configure_model ? m->configure_model(m->ud, t) : m->model;
    if (empty) fg_module_set_empty_init(was);
    if (!model)
        return m->configure_model ? fg_error_wrap(fg_last_status() ? fg_last_status() : FG_EINVAL,
                                                  "configure_model returned no model")
                                  : fg_error(FG_EINVAL,
                                             "%s: the module has no model: set .model or "
                                             ".configure_model",
                                             fn_name(e->fn));
    t->model = model;
    if (e->fn == FG_FIT && t->eval_opt && fg_fabric_model(t->f) == model)
        return fg_error(FG_ESTATE,
                        "fit: strategy %s was set up for evaluation in this launch (it holds "
                        "evaluation's optimizer, not configure_optimizers'); fit first, or fit in "
                        "another launch",
                        fg_fabric_strategy_name(t->f));
    if (e->fn == FG_FIT) {
        fg_optimizer_config oc = {0};
        fg_status cs = m->configure_optimizers(m->ud, t, &oc);
        if (cs != FG_OK) {
            fg__free_config(&oc); /* consumed, also when the hook fails */
            return fg_error_wrap(cs, "configure_optimizers");
        }
        FG_TRY(fg__take_optimizers(t, model, &oc));
    } else if (fg_fabric_model(t->f) != model) {
        /* evaluation steps no optimizer, but the sharded kinds cut one into
         * shards at setup: they get a stateless SGD (no momentum, so no
         * state to shard) that never steps */
        fg_optimizer *eo = NULL;
        if (needs_opt_at_setup(t)) {
            eo = fg_sgd_new(model, &(fg_sgd_opts){0});
            if (!eo) return fg_error_wrap(fg_last_status(), "%s: setting up", fn_name(e->fn));
        }
        fg_status s = fg_fabric_setup(t->f, model, eo);
        if (s != FG_OK) {
            fg_optimizer_free(eo);
            return s;
        }
        fg_optimizer_free(t->eval_opt);
        t->eval_opt = eo;
    }
    /* the strategy's row: replicas on threads (dp, ddp2) run the training
     * step once per part of the batch, concurrently */
    t->dp = fg_strategy_info_of(fg_fabric_plan(t->f)->strategy)->replica_threads;
    /* predict logs nothing: it makes no run folder */
    return e->fn == FG_PREDICT ? FG_OK : resolve_log_dir(t);
}

static FG_MUST_USE fg_status body(entry *e) {
    fg_trainer *t = e->t;
    t->m = e->m;
    t->fn = e->fn;
    t->in_run = true;
    t->stage = FG_STAGE_NONE;
    t->ckpt_path[0] = '\0';
    t->should_stop = false;
    fg__metrics_reset(t);
    fg_status s = prepare(e);
    if (s == FG_OK) {
        if (e->fn == FG_FIT) {
            t->train = pick_loader(t, e, e->a, 0);
            t->val = !t->m.validation_step ? NULL
                     : e->nlist            ? e->list[0]
                                           : pick_loader(t, e, e->b, 1);
            t->nevals = t->val ? (e->nlist ? e->nlist : 1) : 0;
            for (int i = 0; i < t->nevals; i++) t->evals[i] = e->nlist ? e->list[i] : t->val;
            if (!t->train)
                s = fg_error(FG_EINVAL, "fit: no training data: pass a loader or set the "
                                        "module's train_dataloader");
            if (s == FG_OK && !fg_fabric_setup_dataloader(t->f, t->train, true))
                s = fg_last_status();
            /* deterministic: micro-batches that do not depend on the world size */
            if (s == FG_OK && fg_fabric_deterministic(t->f))
                s = fg_fabric_setup_global_batch(t->f, t->train, &t->accumulate, NULL);
            for (int i = 0; s == FG_OK && i < t->nevals; i++)
                if (!fg_fabric_setup_dataloader(t->f, t->evals[i], true)) s = fg_last_status();
            if (s == FG_OK && e->ckpt) s = fg__resolve_ckpt_path(t, e->ckpt);
            if (s == FG_OK) s = fg__fit_body(t);
        } else {
            fg_dataloader *dl = e->nlist ? e->list[0] : pick_loader(t, e, e->a, (int)e->fn - 1);
            t->nevals = dl ? (e->nlist ? e->nlist : 1) : 0;
            for (int i = 0; i < t->nevals; i++) t->evals[i] = e->nlist ? e->list[i] : dl;
            for (int i = 1; s == FG_OK && i < t->nevals; i++)
                if (!fg_fabric_setup_dataloader(t->f, t->evals[i], true)) s = fg_last_status();
            if (!dl)
                s = fg_error(FG_EINVAL,
                             "%s: no data: pass a loader or set the module's "
                             "%s_dataloader",
                             fn_name(e->fn), e->fn == FG_VALIDATE ? "val" : fn_name(e->fn));
            if (s == FG_OK && !fg_fabric_setup_dataloader(t->f, dl, true)) s = fg_last_status();
            if (s == FG_OK && e->ckpt) s = fg__resolve_ckpt_path(t, e->ckpt);
            if (s == FG_OK && t->ckpt_path[0]) s = fg__load_checkpoint(t, false);
            if (s == FG_OK) s = fg__eval_body(t, e->fn);
        }
    }
    /* the run's first error is the one reported, whatever the loggers'
     * finalize and the teardown hooks leave */
    fg_error_kept first;
    fg_error_keep(&first);
    /* a logger that cannot finish after the failure changes nothing: the
     * run's first error is the one restored below */
    if (s != FG_OK && e->fn != FG_PREDICT) fg__status_drop(fg__loggers_finalize(t, "failed"));
    for (int i = 0; i < t->ncbs; i++)
        if (t->cbs[i]->ops.teardown) t->cbs[i]->ops.teardown(t->cbs[i]->ud, t, e->fn);
    if (t->m.teardown) t->m.teardown(t->m.ud, t, e->fn);
    if (e->has_dm && e->dm.teardown) e->dm.teardown(e->dm.ud, t, e->fn);
    if (s != FG_OK) fg_error_restore(&first);
    t->stage = FG_STAGE_NONE;
    t->in_run = false;
    t->train = t->val = NULL;
    t->nevals = t->dl_idx = 0;
    return s;
}

static int run_rank(fg_fabric *f, void *arg) {
    (void)f;
    entry *e = arg;
    e->ran = true;
    e->status = body(e);
    return e->status == FG_OK ? 0 : (int)e->status;
}

static FG_MUST_USE fg_status entry_run(fg_trainer *t, entry *e);
static FG_MUST_USE fg_status entry_dm(fg_trainer *t, fg_trainer_fn fn, const fg_lightning_module *m,
                                      fg_dataloader *a, fg_dataloader *b, const char *ckpt,
                                      const fg_datamodule *dm);
static FG_MUST_USE fg_status entry_list(fg_trainer *t, fg_trainer_fn fn,
                                        const fg_lightning_module *m, fg_dataloader *train,
                                        fg_dataloader *const *dls, int n, const char *ckpt) {
    if (!t || !m) return fg_error(FG_EINVAL, "%s: NULL trainer or module", fn_name(fn));
    if (!dls || n < 1 || n > FG_MAX_EVAL_LOADERS)
        return fg_error(FG_EINVAL, "%s: %d evaluation loaders: give 1 to %d", fn_name(fn), n,
                        FG_MAX_EVAL_LOADERS);
    for (int i = 0; i < n; i++)
        if (!dls[i]) return fg_error(FG_EINVAL, "%s: loader %d of %d is NULL", fn_name(fn), i, n);
    entry e = {.t = t, .fn = fn, .m = *m, .a = train, .ckpt = ckpt, .list = dls, .nlist = n};
    return entry_run(t, &e);
}
static FG_MUST_USE fg_status entry_point(fg_trainer *t, fg_trainer_fn fn,
                                         const fg_lightning_module *m, fg_dataloader *a,
                                         fg_dataloader *b, const char *ckpt) {
    return entry_dm(t, fn, m, a, b, ckpt, NULL);
}

static FG_MUST_USE fg_status entry_list(fg_trainer *t, fg_trainer_fn fn,
                                        const fg_lightning_module *m, fg_dataloader *train,
                                        fg_dataloader *const *dls, int n, const char *ckpt);

fg_status fg_trainer_fit_loaders(fg_trainer *t, const fg_lightning_module *m, fg_dataloader *train,
                                 fg_dataloader *const *vals, int nvals, const char *ckpt_path) {
    return entry_list(t, FG_FIT, m, train, vals, nvals, ckpt_path);
}
fg_status fg_trainer_validate_loaders(fg_trainer *t, const fg_lightning_module *m,
                                      fg_dataloader *const *dls, int n, const char *ckpt_path) {
    return entry_list(t, FG_VALIDATE, m, NULL, dls, n, ckpt_path);
}
fg_status fg_trainer_test_loaders(fg_trainer *t, const fg_lightning_module *m,
                                  fg_dataloader *const *dls, int n, const char *ckpt_path) {
    return entry_list(t, FG_TEST, m, NULL, dls, n, ckpt_path);
}
int fg_trainer_dataloader_idx(const fg_trainer *t) { return t ? t->dl_idx : 0; }

fg_status fg_trainer_fit_datamodule(fg_trainer *t, const fg_lightning_module *m,
                                    const fg_datamodule *dm, const char *ckpt_path) {
    return entry_dm(t, FG_FIT, m, NULL, NULL, ckpt_path, dm);
}
fg_status fg_trainer_validate_datamodule(fg_trainer *t, const fg_lightning_module *m,
                                         const fg_datamodule *dm, const char *ckpt_path) {
    return entry_dm(t, FG_VALIDATE, m, NULL, NULL, ckpt_path, dm);
}
fg_status fg_trainer_test_datamodule(fg_trainer *t, const fg_lightning_module *m,
                                     const fg_datamodule *dm, const char *ckpt_path) {
    return entry_dm(t, FG_TEST, m, NULL, NULL, ckpt_path, dm);
}
fg_status fg_trainer_predict_datamodule(fg_trainer *t, const fg_lightning_module *m,
                                        const fg_datamodule *dm, const char *ckpt_path) {
    return entry_dm(t, FG_PREDICT, m, NULL, NULL, ckpt_path, dm);
}

static FG_MUST_USE fg_status entry_dm(fg_trainer *t, fg_trainer_fn fn, const fg_lightning_module *m,
                                      fg_dataloader *a, fg_dataloader *b, const char *ckpt,
                                      const fg_datamodule *dm) {
    if (!t || !m) return fg_error(FG_EINVAL, "%s: NULL trainer or module", fn_name(fn));
    entry e = {.t = t, .fn = fn, .m = *m, .a = a, .b = b, .ckpt = ckpt, .has_dm = dm != NULL};
    if (dm) e.dm = *dm;
    return entry_run(t, &e);
}

static FG_MUST_USE fg_status entry_run(fg_trainer *t, entry *ep) {
    entry e = *ep;
    fg_trainer_fn fn = e.fn;
    const fg_lightning_module *m = &ep->m;
    if (t->in_run)
        return fg_error(FG_ESTATE, "%s: called from inside a hook of another entry point",
                        fn_name(fn));
    if (fn == FG_FIT && (!m->training_step || !m->configure_optimizers))
        return fg_error(FG_EINVAL, "fit: the module needs training_step and configure_optimizers");
    if (fn == FG_VALIDATE && !m->validation_step)
        return fg_error(FG_EINVAL, "validate: the module has no validation_step");
    if (fn == FG_TEST && !m->test_step)
        return fg_error(FG_EINVAL, "test: the module has no test_step");
    if (fn == FG_PREDICT && !m->predict_step)
        return fg_error(FG_EINVAL, "predict: the module has no predict_step");
    if (fg_fabric_running(t->f)) return body(&e);
    int rc = fg_fabric_launch(t->f, run_rank, &e);
    if (rc == 0 && fn == FG_FIT && m->model && fg_fabric_plan(t->f)->launcher == FG_LAUNCHER_FORK) {
        /* the ranks were forked children: the parent's model gets rank 0's weights */
        return fg_fabric_spawn_result(t->f, m->model, NULL);
    }
    if (rc == 0) return FG_OK;
    if (e.ran && e.status != FG_OK) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", fg_last_error());
        return fg_error(e.status, "%s", msg);
    }
    fg_status s = fg_last_status();
    return s != FG_OK ? s : FG_EPEER;
}

fg_status fg_trainer_fit(fg_trainer *t, const fg_lightning_module *m, fg_dataloader *train,
                         fg_dataloader *val, const char *ckpt_path) {
    return entry_point(t, FG_FIT, m, train, val, ckpt_path);
}
fg_status fg_trainer_validate(fg_trainer *t, const fg_lightning_module *m, fg_dataloader *dl,
                              const char *ckpt_path) {
    return entry_point(t, FG_VALIDATE, m, dl, NULL, ckpt_path);
}
fg_status fg_trainer_test(fg_trainer *t, const fg_lightning_module *m, fg_dataloader *dl,
                          const char *ckpt_path) {
    return entry_point(t, FG_TEST, m, dl, NULL, ckpt_path);
}
fg_status fg_trainer_predict(fg_trainer *t, const fg_lightning_module *m, fg_dataloader *dl,
                             const char *ckpt_path) {
    return entry_point(t, FG_PREDICT, m, dl, NULL, ckpt_path);
}

typedef struct launch_ctx {
    fg_trainer *t;
    int (*run)(fg_trainer *, void *);
    void *arg;
} launch_ctx;

static int launch_run(fg_fabric *f, void *arg) {
    (void)f;
    launch_ctx *c = arg;
    return c->run(c->t, c->arg);
}

int fg_trainer_launch(fg_trainer *t, int (*run)(fg_trainer *t, void *arg), void *arg) {
    if (!t || !run) {
        fg_error(FG_EINVAL, "trainer launch: NULL trainer or run function");
        return 1;
    }
    launch_ctx c = {t, run, arg};
    return fg_fabric_launch(t->f, launch_run, &c);
}
