/* fulgur fit, validate, test and predict on the Trainer: its options from
 * the flags (Lightning's names), its callbacks (the progress display,
 * ModelCheckpoint, EarlyStopping) and loggers (csv, tensorboard), and what
 * every rank runs inside one launch (fg_trainer_launch): the built-in module
 * (fit_module.c) and the entry point, then what the command prints.
 *
 * Checkpoints of fit: <ckpt_dir>/step-00000040.safetensors (ModelCheckpoint
 * with filename "step-{step:08d}", every --ckpt-every steps, or with
 * --monitor and no --ckpt-every at the end of every validation, and at the
 * end of the run and at a stop), --save-top-k of them kept (the best by --monitor,
 * or without one the newest), and last.safetensors a link to the newest
 * (save_last="link"), which `--resume last` and `fulgur sample` read. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_meta.h"
#include "ckpt_paths.h"
#include "cli_flags.h"
#include "fit_model.h"

struct fit_run {
    const fit_opts *o;
    fit_module *m;
    fg_callback *cbs[5];
    int ncbs;
    fg_logger *loggers[2];
    int nloggers;
    fg_trainer *t;
};

/* ------------------------------------------------------------- errors */

static char g_reported[2048]; /* what this process printed last */

bool fit_reported(const char *msg) { return msg && *msg && strstr(g_reported, msg) != NULL; }

int fit_rank_error(fg_trainer *t, const char *what) {
    if (fg_trainer_world_size(t) > 1)
        snprintf(g_reported, sizeof g_reported, "rank %d: %s: %s", fg_trainer_global_rank(t), what,
                 fg_last_error());
    else snprintf(g_reported, sizeof g_reported, "%s: %s", what, fg_last_error());
    cli_error("%s", g_reported);
    return FG_EXIT_FAIL;
}

/* mkdir -p */
static int make_dirs(const char *path) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(buf, 0777) != 0 && errno != EEXIST ? -1 : 0;
}

/* ------------------------------------------------------ the trainer */

static void free_parts(fit_run *r) {
    fg_trainer_free(r->t);
    for (int i = 0; i < r->ncbs; i++) fg_callback_free(r->cbs[i]);
    for (int i = 0; i < r->nloggers; i++) fg_logger_free(r->loggers[i]);
    fit_module_free(r->m);
}

void fit_run_free(fit_run *r) {
    if (!r) return;
    free_parts(r);
    free(r);
}

static bool add_cb(fit_run *r, fg_callback *cb) {
    if (!cb) return false;
    r->cbs[r->ncbs++] = cb;
    return true;
}

/* --logger: "none", or csv and tensorboard separated by commas */
static bool add_loggers(fit_run *r, const char *list) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save, *w = strtok_r(buf, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
        fg_logger *lg = NULL;
        if (!strcmp(w, "none")) continue;
        /* rows written as the lines are printed, not every 100 steps */
        const fit_opts *o = r->o;
        if (!strcmp(w, "csv"))
            lg = fg_csv_logger_new(&(fg_csv_logger_opts){.save_dir = o->logger_save_dir,
                                                         .name = o->logger_name,
                                                         .version = o->logger_version,
                                                         .flush_logs_every_n_steps = o->log_every});
        else if (!strcmp(w, "tensorboard"))
            lg = fg_tensorboard_logger_new(
                o->logger_save_dir, &(fg_tensorboard_logger_opts){.name = o->logger_name,
                                                                  .version = o->logger_version});
        if (!lg || r->nloggers == 2) {
            fg_logger_free(lg);
            return false;
        }
        r->loggers[r->nloggers++] = lg;
    }
    return true;
}

/* --ckpt-path by the trainer's rules: fit's when given; validate, test and
 * predict's ("last" unless given) with the model's shape and step from the
 * checkpoint's metadata, so that the flags need not repeat them. */
static int resolve_ckpt(fit_opts *o, fg_trainer *t) {
    bool fit = o->fn == FG_FIT;
    const char *want = o->resume ? o->resume : fit ? NULL : "last";
    if (!want) return 0;
    if (fg_trainer_resolve_ckpt_path(t, want, o->resume_path, sizeof o->resume_path) != FG_OK) {
        cli_error("--ckpt-path %s: %s", want, fg_last_error());
        return FG_EXIT_USAGE;
    }
    if (!o->resume_path[0]) { /* "last" without a checkpoint yet is an error, as a missing file */
        cli_error("--ckpt-path last: no checkpoint yet in %s (no %s/%s)", o->ckpt_dir, o->ckpt_dir,
                  CKPT_LAST_NAME);
        return FG_EXIT_USAGE;
    }
    if (fit) return 0;
    fg_st_file *f = fg_st_open(o->resume_path);
    if (!f) {
        cli_error("--ckpt-path=%s: %s", o->resume_path, fg_last_error());
        return FG_EXIT_USAGE;
    }
    const char *step = fg_st_meta_get(f, "step");
    if (!step || !cli_parse_int(step, &o->ckpt_step)) o->ckpt_step = -1;
    const char *json = fg_st_meta_get(f, CKPT_META_CONFIG);
    fit_model_cfg cfg = {0};
    char err[256];
    if (json && fit_model_cfg_parse(json, &cfg, err, sizeof err)) {
        /* the family and its shape flags, as fit gave them (Lightning's
         * load_from_checkpoint: the saved hyperparameters) */
        static char net[sizeof cfg.net];
        const char *family = cfg.arch == FIT_ARCH_RESNET ? "resnet"
                             : cfg.arch == FIT_ARCH_VIT  ? "vit"
                             : cfg.arch == FIT_ARCH_LSTM ? "lstm"
                             : cfg.kind == FIT_GPT       ? "gpt"
                             : cfg.net[0]                ? "sequential"
                                                         : "mlp";
        if (o->model_given && strcmp(o->model, family) != 0) {
            cli_error("--model %s, but the checkpoint %s holds a %s model: drop --model (the "
                      "checkpoint says what to build) or give --model %s",
                      o->model, o->resume_path, family, family);
            fg_st_close(f);
            return FG_EXIT_USAGE;
        }
        o->model = family;
        o->arch = cfg.arch;
        o->kind = cfg.kind;
        if (cfg.arch == FIT_ARCH_RESNET) {
            o->depth = cfg.depth;
            o->width = cfg.width;
            o->in_channels = cfg.channels;
            o->resnet_layout = cfg.imagenet ? "imagenet" : "cifar";
        } else if (cfg.arch == FIT_ARCH_VIT) {
            o->in_channels = cfg.channels;
            o->patch_size = cfg.patch;
            o->layers = cfg.layers;
            o->heads = cfg.heads;
            o->embd = cfg.embd;
            o->hidden = cfg.hidden;
        } else if (cfg.arch == FIT_ARCH_LSTM) {
            o->layers = cfg.layers;
            o->embd = cfg.embd;
            o->hidden = cfg.hidden;
            o->ctx = cfg.ctx;
        } else if (cfg.kind == FIT_GPT) {
            o->layers = cfg.layers;
            o->heads = cfg.heads;
            o->embd = cfg.embd;
            o->ctx = cfg.ctx;
            o->dropout = cfg.dropout;
        } else {
            o->hidden = cfg.hidden;
            o->net = NULL;
            if (cfg.net[0]) {
                snprintf(net, sizeof net, "%s", cfg.net);
                o->net = net;
            }
        }
    }
    fg_st_close(f);
    return 0;
}

fit_run *fit_run_new(fit_opts *o, fg_fabric *f, int *rc) {
    *rc = FG_EXIT_FAIL;
    fit_run *r = calloc(1, sizeof *r);
    if (!r || !(r->m = fit_module_new(o))) {
        cli_error("out of memory");
        free(r);
        return NULL;
    }
    r->o = o;
    bool fit = o->fn == FG_FIT, ok = true;
    fg_monitor_mode mode = o->mode && !strcmp(o->mode, "max") ? FG_MONITOR_MAX : FG_MONITOR_MIN;
    /* the library's progress bar: by optimizer step for fit (a bar on
     * stderr when it is a terminal, lines on stdout otherwise), the
     * evaluation runs' own lines on stdout; --progress none: no display */
    fg_callback *bar = NULL;
    if (strcmp(o->progress, "none") != 0) {
        bool gpt = strcmp(o->model, "mlp") != 0;
        bool on_tty =
            !strcmp(o->progress, "bar") || (!strcmp(o->progress, "auto") && isatty(STDERR_FILENO));
        fg_flag redraw = !strcmp(o->progress, "bar")     ? FG_ON
                         : !strcmp(o->progress, "lines") ? FG_OFF
                                                         : FG_FLAG_DEFAULT;
        /* the library picks no stream: the command hands its bar one */
        ok = add_cb(r, bar = fg_progress_bar_new(&(fg_progress_bar_opts){
                           .out = fit && on_tty ? stderr : stdout,
                           .redraw = fit ? (on_tty ? FG_ON : FG_OFF) : redraw,
                           .by_step = fit,
                           .unit = gpt ? "tok" : "samples",
                           .unit_per_sample = gpt ? o->ctx : 1}));
    }
    if (ok && fit) {
        ok = add_cb(r, fit_notes_new(o, r->m, bar));
        /* without --monitor, --save-top-k N keeps the newest N: top-k by step */
        const char *monitor = o->monitor ? o->monitor : o->save_top_k > 0 ? "step" : NULL;
        /* Lightning's ModelCheckpoint(monitor=...) without every_n_train_steps
         * checks at the end of every validation (every_n_epochs=1) */
        bool by_val = o->monitor && !o->ckpt_every_given;
        int64_t every_steps = by_val ? 0 : o->ckpt_every;
        if (ok && o->enable_checkpointing)
            ok = add_cb(r, fg_model_checkpoint_new(&(fg_checkpoint_opts){
                               .dirpath = o->ckpt_dir,
                               .filename = "step-{step:08d}",
                               .no_auto_insert_metric_name = true,
                               .monitor = monitor,
                               .mode = o->monitor ? mode : FG_MONITOR_MAX,
                               .save_top_k = o->save_top_k,
                               .save_last_link = o->save_last,
                               .every_n_train_steps = every_steps,
                               /* --ckpt-every 0: only at the end */
                               .every_n_epochs = by_val        ? 1
                                                 : every_steps ? 0
                                                               : INT64_MAX / 4,
                               .save_on_fit_end = true}));
        if (ok && o->early_stopping_patience > 0)
            ok = add_cb(r, fg_early_stopping_new(
                               &(fg_early_stopping_opts){.monitor = o->monitor,
                                                         .patience = o->early_stopping_patience,
                                                         .min_delta = o->early_stopping_min_delta,
                                                         .mode = mode}));
    } else if (ok) {
        /* validate, test, predict save nothing: the ModelCheckpoint is where
         * "last" and "best" are found (Lightning's trainer.checkpoint_callback) */
        ok = add_cb(r, fg_model_checkpoint_new(&(fg_checkpoint_opts){.dirpath = o->ckpt_dir}));
    }
    if (ok && fit && o->log_lr && strcmp(o->log_lr, "none")) {
        fg_logging_interval li = !strcmp(o->log_lr, "step")    ? FG_LOGGING_STEP
                                 : !strcmp(o->log_lr, "epoch") ? FG_LOGGING_EPOCH
                                                               : FG_LOGGING_AUTO;
        ok = add_cb(r, fg_lr_monitor_new(&(fg_lr_monitor_opts){.logging_interval = li}));
    }
    if (ok) ok = add_loggers(r, o->logger);
    if (!ok) {
        cli_error("%s: %s", o->fn == FG_FIT ? "fit" : "trainer", fg_last_error());
        fit_run_free(r);
        return NULL;
    }
    r->t = fg_trainer_new(&(fg_trainer_opts){
        .fabric = f,
        .max_epochs = o->max_epochs,
        .min_epochs = o->min_epochs,
        .max_steps = o->max_steps,
        .min_steps = o->min_steps,
        .max_time = o->max_time,
        .accumulate_grad_batches = o->accumulate,
        .gradient_clip_val = o->clip,
        .gradient_clip_algorithm =
            !strcmp(o->clip_algorithm, "value") ? FG_CLIP_VALUE : FG_CLIP_NORM,
        .val_check_interval = o->val_check_interval,
        .check_val_every_n_epoch = o->check_val_every_n_epoch,
        .num_sanity_val_steps = FG_COUNT(o->num_sanity_val_steps),
        .limit_train_batches = o->limit_train,
        .limit_val_batches = o->limit_val,
        .limit_test_batches = o->limit_test,
        .limit_predict_batches = o->limit_predict,
        .fast_dev_run = o->fast_dev_run,
        .log_every_n_steps = o->log_every,
        /* the bar above, or none */
        .enable_progress_bar = bar ? FG_FLAG_DEFAULT : FG_OFF,
        .enable_checkpointing = !fit || o->enable_checkpointing ? FG_FLAG_DEFAULT : FG_OFF,
        .default_root_dir = o->root_dir,
        .detect_anomaly = o->detect_anomaly,
        .on_nonfinite = o->on_nonfinite_skip ? FG_NONFINITE_SKIP : FG_NONFINITE_STOP,
        .callbacks = r->cbs,
        .ncallbacks = r->ncbs,
        .loggers = r->loggers,
        .nloggers = r->nloggers,
        .logger = r->nloggers ? FG_FLAG_DEFAULT : FG_OFF});
    if (!r->t) {
        /* a combination of settings the Trainer refuses, as Lightning does */
        cli_error("%s", fg_last_error());
        *rc = fg_last_status() == FG_ENOMEM ? FG_EXIT_FAIL : FG_EXIT_USAGE;
        fit_run_free(r);
        return NULL;
    }
    if ((*rc = resolve_ckpt(o, r->t)) != 0) {
        fit_run_free(r);
        return NULL;
    }
    return r;
}

/* -------------------------------------------------------------- fit */

/* the step count the run ends at, for the lines and the ETA */
static int64_t total_steps(fg_trainer *t, const fit_opts *o) {
    int64_t acc = fg_trainer_accumulate_grad_batches(t);
    int64_t per_epoch = (fg_trainer_num_training_batches(t) + acc - 1) / acc;
    (void)o;
    int64_t total = fg_trainer_max_steps(t), epochs = fg_trainer_max_epochs(t);
    if (epochs > 0 && (total < 0 || per_epoch * epochs < total)) total = per_epoch * epochs;
    return total;
}

/* One fit per run folder: rank 0 holds an flock on DIR/.fulgur.lock for
 * the life of its process (released by the kernel however it ends), the
 * file naming its pid; a second fit there refuses, naming the first, before
 * it touches a file (two would interleave their checkpoints, top-k and
 * `last`). */
static int g_lock_fd[2] = {-1, -1};

static FG_MUST_USE fg_status lock_folder(const char *dir, int slot) {
    char path[4200];
    snprintf(path, sizeof path, "%s/.fulgur.lock", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return fg_error(FG_EIO, "cannot open %s, the run folder's lock: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        char pid[32] = "";
        ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
        pid[n > 0 ? n : 0] = '\0';
        pid[strcspn(pid, "\n")] = '\0';
        close(fd);
        if (e == EWOULDBLOCK)
            return fg_error(FG_ESTATE,
                            "the run folder %s is in use by another fit (pid %s, lock %s): two "
                            "runs in one folder would mix their checkpoints and `last`; wait "
                            "for it to end, or give this one another --default-root-dir "
                            "(or --ckpt-dir)",
                            dir, pid[0] ? pid : "?", path);
        return fg_error(FG_EIO, "cannot lock %s: %s", path, strerror(e));
    }
    char line[32];
    int len = snprintf(line, sizeof line, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)len, 0) != len) {
        int e = errno;
        close(fd);
        return fg_error(FG_EIO, "cannot write %s: %s", path, strerror(e));
    }
    g_lock_fd[slot] = fd;
    return FG_OK;
}

/* Whether dir lies inside root (or is it), by their real paths. */
static bool inside(const char *dir, const char *root) {
    char rd[PATH_MAX], rr[PATH_MAX];
    if (!realpath(dir, rd) || !realpath(root, rr)) return false;
    size_t n = strlen(rr);
    return !strncmp(rd, rr, n) && (rd[n] == '\0' || rd[n] == '/');
}

/* Rank 0, before the ranks train: the run and checkpoint folders, their
 * lock, and the temporaries a killed save left. */
static FG_MUST_USE fg_status prepare_dirs(const fit_opts *o) {
    if (make_dirs(o->root_dir) != 0 || make_dirs(o->ckpt_dir) != 0)
        return fg_error(FG_EIO, "cannot create %s or %s: %s", o->root_dir, o->ckpt_dir,
                        strerror(errno));
    if (g_lock_fd[0] < 0) TRY(lock_folder(o->root_dir, 0));
    if (g_lock_fd[1] < 0 && !inside(o->ckpt_dir, o->root_dir)) TRY(lock_folder(o->ckpt_dir, 1));
    int stale = 0;
    TRY(fg_st_remove_stale_tmp(o->ckpt_dir, &stale));
    if (stale)
        printf("removed %d temporary checkpoint file%s left by a run killed while saving\n", stale,
               stale == 1 ? "" : "s");
    if (o->resume && o->restart_count > 0 && !strcmp(o->resume, "last"))
        printf("restart %lld: resuming from the newest checkpoint\n", (long long)o->restart_count);
    fflush(stdout);
    return FG_OK;
}

static int run_fit(fit_run *r, fg_trainer *t, const fg_lightning_module *lm) {
    const fit_opts *o = r->o;
    fit_module *m = r->m;
    double t0 = fg_time();
    bool rank0 = fg_trainer_is_global_zero(t);
    /* every rank learns whether rank 0's folders are there */
    fg_status s = rank0 ? prepare_dirs(o) : FG_OK;
    double ok = 0;
    fg_status rs =
        fg_fabric_reduce_scalar(fg_trainer_fabric(t), s == FG_OK ? 1 : 0, FG_REDUCE_OP_MIN, &ok);
    if (s != FG_OK || rs != FG_OK) return fit_rank_error(t, "output");
    if (ok != 1) {
        fg_error(FG_EPEER, "rank 0 could not prepare %s", o->ckpt_dir);
        return fit_rank_error(t, "output");
    }
    s = fg_trainer_fit(t, lm, fit_module_loader(m, FG_FIT), fit_module_loader(m, FG_VALIDATE),
                       o->resume ? o->resume_path : NULL);
    if (s != FG_OK) return fit_rank_error(t, fit_module_model_failed(m) ? "model" : "training");
    int64_t step = fg_trainer_global_step(t), total = total_steps(t, o);
    if (fg_trainer_interrupted(t)) {
        fit_stopped = 1; /* saved: further signals are ignored */
        if (rank0) {
            printf("stopped by a signal after step %lld (of %lld); checkpoint %s; run the "
                   "same command with --ckpt-path last to continue (exit status %d)\n",
                   (long long)step, (long long)total, fg_trainer_last_saved_path(t),
                   FG_EXIT_RESUMABLE);
            fflush(stdout);
        }
        return FG_EXIT_OK;
    }
    /* validation at the end, unless it just ran (Lightning's trainer.validate) */
    double val;
    int64_t val_step = fit_module_last_val(m, &val);
    if (val_step != step && fg_dataset_len(fit_module_data(m)->val) > 0 && !o->fast_dev_run) {
        if (fg_trainer_validate(t, lm, fit_module_loader(m, FG_VALIDATE), NULL) != FG_OK)
            return fit_rank_error(t, "validation");
        fit_module_last_val(m, &val); /* its line: the progress bar's */
    }
    /* stage 3: rank 0 samples from the whole model (every rank gathers it) */
    fg_strategy *strat = (fg_strategy *)fg_fabric_strategy(fg_trainer_fabric(t));
    if (fit_module_is_gpt(m) && o->sample_tokens && fg_strategy_shards_params(strat) &&
        fg_strategy_gather_params(strat) != FG_OK)
        return fit_rank_error(t, "gathering the parameters to sample");
    if (!rank0) return FG_EXIT_OK;
    /* printed whole: a loss of 1e30 in %.4f is 36 characters */
    printf("done: %lld steps in %.1f s; val loss ", (long long)step, fg_time() - t0);
    if (isnan(val)) printf("n/a (no validation data)");
    else printf("%.4f", val);
    printf("; checkpoint %s\n",
           fg_trainer_last_saved_path(t)[0] ? fg_trainer_last_saved_path(t) : "none");
    fg_fabric *f = fg_trainer_fabric(t);
    fg_comm_bytes cb;
    if (fg_trainer_world_size(t) > 1 &&
        fg_strategy_comm_bytes(fg_fabric_strategy(f), &cb) == FG_OK &&
        cb.steps > 0) /* counted by the strategy, not assumed */
        printf("comm: %.0f bytes per step handed to the communicator by rank 0 (%lld "
               "synchronised backwards, %.4gx plain ddp's %llu)\n",
               (double)cb.total / (double)cb.steps, (long long)cb.steps,
               (double)cb.total / (double)cb.steps / (double)cb.dense_step,
               (unsigned long long)cb.dense_step);
    if (o->on_nonfinite_skip) {
        int64_t k = fg_trainer_skipped_steps(t, NULL);
        printf("%lld optimizer step%s skipped on a non-finite loss or gradient "
               "(--on-nonfinite skip)\n",
               (long long)k, k == 1 ? "" : "s");
    }
    const fg_scaler *sc = fg_fabric_scaler(f);
    if (sc) /* 16-mixed: what the loss scaler did */
        printf("loss scale %g; %lld step%s skipped on inf/NaN gradients\n",
               fg_scaler_get_state(sc).scale, (long long)fg_scaler_get_state(sc).skipped,
               fg_scaler_get_state(sc).skipped == 1 ? "" : "s");
    fg_dev *dev = fg_fabric_device(f);
    fg_fabric_copies cp = fg_fabric_device_copies(f);
    if (dev && cp.steps > 0) { /* counted by the device, not assumed */
        fg_dev_memory_stats ds = fg_dev_memory_stats_get(dev);
        char staged[160] = "";
        if (cp.total_comm_h2d || cp.total_comm_d2h)
            snprintf(staged, sizeof staged,
                     ", and %.0f and %.0f staged through the host for the communicator",
                     (double)cp.total_comm_d2h / (double)cp.steps,
                     (double)cp.total_comm_h2d / (double)cp.steps);
        char ostep[200] = "";
        if (cp.opt_steps > 0 && (cp.opt_h2d || cp.opt_d2h || cp.opt_comm_h2d || cp.opt_comm_d2h))
            snprintf(ostep, sizeof ostep,
                     "; per optimizer step %.0f host->device and %.0f device->host, and %.0f "
                     "and %.0f staged (%lld steps)",
                     (double)cp.opt_h2d / (double)cp.opt_steps,
                     (double)cp.opt_d2h / (double)cp.opt_steps,
                     (double)cp.opt_comm_d2h / (double)cp.opt_steps,
                     (double)cp.opt_comm_h2d / (double)cp.opt_steps, (long long)cp.opt_steps);
        printf("device %s: %.0f bytes host->device and %.0f device->host per training step "
               "(%lld steps)%s%s; %llu and %llu in the whole run (validation, checkpoints and "
               "staging included); peak %llu bytes allocated\n",
               fg_dev_name(dev), (double)cp.total_h2d / (double)cp.steps,
               (double)cp.total_d2h / (double)cp.steps, (long long)cp.steps, staged, ostep,
               (unsigned long long)ds.h2d_bytes, (unsigned long long)ds.d2h_bytes,
               (unsigned long long)ds.allocated_bytes_peak);
    }
    fflush(stdout);
    fit_module_sample(m);
    return FG_EXIT_OK;
}

/* ------------------------------------------ validate, test, predict */

static int run_eval(fit_run *r, fg_trainer *t, const fg_lightning_module *lm) {
    const fit_opts *o = r->o;
    const char *ckpt = o->resume_path[0] ? o->resume_path : NULL;
    fg_dataloader *dl = fit_module_loader(r->m, o->fn);
    fg_status s;
    const char *name = o->fn == FG_VALIDATE ? "validate" : o->fn == FG_TEST ? "test" : "predict";
    if (o->fn == FG_VALIDATE) s = fg_trainer_validate(t, lm, dl, ckpt);
    else if (o->fn == FG_TEST) s = fg_trainer_test(t, lm, dl, ckpt);
    else s = fg_trainer_predict(t, lm, dl, ckpt);
    if (s != FG_OK) return fit_rank_error(t, fit_module_model_failed(r->m) ? "model" : name);
    if (o->fn == FG_PREDICT) {
        if (fit_module_write_predictions(r->m, t, o->predictions) != FG_OK)
            return fit_rank_error(t, name);
        return FG_EXIT_OK;
    }
    if (!fg_trainer_is_global_zero(t)) return FG_EXIT_OK;
    /* Lightning's results table, one metric a line */
    const fg_metric *mt;
    int64_t n = fg_trainer_metrics(t, FG_CALLBACK_METRICS, &mt);
    printf("%s: checkpoint %s (step %lld), %lld samples\n", name, ckpt ? ckpt : "none",
           (long long)o->ckpt_step, (long long)fg_dataset_len(fg_dataloader_dataset(dl)));
    for (int64_t i = 0; i < n; i++) printf("  %s = %.6f\n", mt[i].name, mt[i].value);
    if (n == 0) printf("  (no metric: the data made no batch)\n");
    fflush(stdout);
    return FG_EXIT_OK;
}

static int run_rank(fg_trainer *t, void *arg) {
    fit_run *r = arg;
    if (cli_in_forked_rank() && fit_stop_signals_forked() != FG_EXIT_OK) return FG_EXIT_FAIL;
    const char *what = "data";
    if (fit_module_open(r->m, t, &what) != FG_OK) return fit_rank_error(t, what);
    fg_lightning_module lm = fit_module_table(r->m);
    int rc = r->o->fn == FG_FIT ? run_fit(r, t, &lm) : run_eval(r, t, &lm);
    /* main() checks stdout at the end, but a forked rank leaves by _exit:
     * rank 0, the one that prints, checks here then. A resumable stop keeps
     * its 75 (main() still says the output was lost). */
    if (rc == FG_EXIT_OK && !fit_stopped && cli_in_forked_rank() && fg_trainer_is_global_zero(t) &&
        cli_check_stdout(false))
        rc = fit_rank_error(t, "output");
    return rc;
}

int fit_run_launch(fit_run *r) {
    int rc = fg_trainer_launch(r->t, run_rank, r);
    if (rc != 0) {
        /* the ranks printed their own errors; the fabric's (a launch that
         * failed, a peer that never joined, a rank that died) are printed
         * here, whatever the code, unless this process said them already */
        const char *msg = fg_last_error();
        const char *cmd = r->o->fn == FG_FIT        ? "fit"
                          : r->o->fn == FG_VALIDATE ? "validate"
                          : r->o->fn == FG_TEST     ? "test"
                                                    : "predict";
        if (msg && *msg && !fit_reported(msg)) cli_error("%s: %s", cmd, msg);
        else if (!msg || !*msg) cli_error("%s: failed (exit code %d) without a message", cmd, rc);
        return FG_EXIT_FAIL;
    }
    return FG_EXIT_OK;
}
