/* The training loop of `fulgur fit`, run by every rank through the fabric
 * API: setup, distributed loaders, gradient accumulation under
 * no_backward_sync, clipping, the lr schedule, validation averaged over
 * ranks, checkpoints (fg_fabric_save, then rank 0 moves the "last" link),
 * and for gpt a sample at the end.
 *
 * Exact resume: everything a step depends on is a function of what the
 * checkpoint holds. Weights and optimizer state are tensors; the step count
 * gives the lr (fit_lr_at) and the dropout masks (reseeded per step); (epoch, batch) is the
 * loader's position (fg_dataloader_set_position), whose batches are a pure
 * function of (seed, epoch, rank, world). So 40 steps straight and 20 +
 * resume + 20 give the same bits, on any strategy whose reductions are
 * deterministic. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_paths.h"
#include "fit_model.h"

/* passes a failure up (FG_TRY is the library's private twin) */
#define TRY(expr)                                                                                  \
    do {                                                                                           \
        fg_status s_ = (expr);                                                                     \
        if (s_ != FG_OK) return s_;                                                                \
    } while (0)

typedef struct fit_ctx {
    fg_fabric *f;
    const fit_opts *o;
    fit_data d;
    fit_model_cfg cfg;
    fg_module *model;
    fg_optimizer *opt;
    fg_dataloader *train, *val;
    fit_progress *prog; /* rank 0 only */
    bool rank0;
    int world;
    char *config_json, *vocab_b64;
    int64_t step, last_saved, last_val_step;
    int64_t skipped, skipped_in_row; /* --on-nonfinite skip: optimizer steps skipped */
    char nonfinite[512];             /* what train_step found non-finite, "" if nothing */
    double last_val;
    char last_ckpt[4096];
    int64_t *accumulate; /* the run's copy of o->accumulate, which a resume may change */
} fit_ctx;

/* what this process printed last (fit_reported) */
static char g_reported[2048];

bool fit_reported(const char *msg) { return msg && *msg && strstr(g_reported, msg) != NULL; }

static int rank_error(const fit_ctx *c, const char *what) {
    if (c->world > 1)
        snprintf(g_reported, sizeof g_reported, "rank %d: %s: %s", fg_fabric_global_rank(c->f),
                 what, fg_last_error());
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

/* Model input for a batch: gpt takes (B, T) ids as they are; mlp flattens
 * (B, D...) to (B, D). */
static fg_tensor *forward_loss(fit_ctx *c, fg_tensor *x, fg_tensor *y) {
    if (c->cfg.kind == FIT_MLP && fg_tensor_ndim(x) != 2) {
        int64_t shape[2] = {fg_tensor_dim(x, 0), c->cfg.in_dim};
        x = fg_reshape(x, 2, shape);
    }
    fg_dtype mdt = fg_module_dtype(c->model);
    if (c->cfg.kind == FIT_MLP && x && fg_tensor_dtype(x) != mdt) {
        /* inputs come as f32; a 64-true model takes f64, bf16-true bf16 */
        fg_tensor *xm = fg_empty(mdt, fg_tensor_ndim(x), fg_tensor_shape(x));
        if (!xm || fg_tensor_copy(xm, x) != FG_OK) return NULL;
        x = xm;
    }
    return fg_cross_entropy(fg_module_forward(c->model, x), y, -100);
}

/* Mean validation loss over the val set (at most --limit-val-batches per
 * rank), distributed padding left out, averaged over ranks by token count.
 * Collective. NAN if there is no validation data. */
static fg_status validate(fit_ctx *c, double *out) {
    if (fg_dataset_len(c->d.val) == 0) {
        *out = NAN;
        return FG_OK;
    }
    bool prev = fg_set_grad_enabled(false);
    fg_module_train(c->model, false);
    fg_status s = fg_dataloader_set_epoch(c->val, 0);
    double sum = 0, count = 0;
    int64_t nb = 0;
    for (fg_batch *b; s == FG_OK && (b = fg_dataloader_next(c->val)) != NULL;) {
        if (c->o->limit_val_batches && nb++ >= c->o->limit_val_batches) break;
        if (b->valid == 0) continue;
        fg_tensor *x = b->x, *y = b->y;
        if (b->valid < b->size) {
            x = fg_tensor_narrow_view(x, 0, 0, b->valid);
            y = fg_tensor_narrow_view(y, 0, 0, b->valid);
        }
        fg_tensor *loss = forward_loss(c, x, y);
        if (!loss) {
            s = fg_error_wrap(FG_EINVAL, "validation forward");
            break;
        }
        double n = (double)fg_tensor_numel(y);
        sum += fg_item(loss) * n;
        count += n;
        fg_fabric_step_end(c->f);
    }
    if (s == FG_OK) s = fg_dataloader_status(c->val);
    fg_module_train(c->model, true);
    fg_set_grad_enabled(prev);
    /* every rank reaches these, even after a local error, so none hangs */
    double ok = fg_fabric_reduce_scalar(c->f, s == FG_OK ? 1 : 0, FG_MIN);
    sum = fg_fabric_reduce_scalar(c->f, sum, FG_SUM);
    count = fg_fabric_reduce_scalar(c->f, count, FG_SUM);
    if (s != FG_OK) return s;
    if (ok != 1) return fg_error(FG_EPEER, "validation failed on another rank");
    *out = count > 0 ? sum / count : NAN;
    return FG_OK;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Rank 0, --save-top-k N: removes step checkpoints older than the newest
 * N of the folder (the one just saved, which "last" names, is the newest).
 * A file it cannot remove is a note, not a failure of the run. */
static void prune(fit_ctx *c) {
    DIR *d = opendir(c->o->ckpt_dir);
    if (!d) return;
    int64_t *steps = NULL;
    size_t n = 0, cap = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        int64_t st = ckpt_step_of(e->d_name);
        if (st < 0) continue;
        if (n == cap) {
            int64_t *p = realloc(steps, (cap = cap ? cap * 2 : 64) * sizeof *steps);
            if (!p) break;
            steps = p;
        }
        steps[n++] = st;
    }
    closedir(d);
    if (steps && n > (size_t)c->o->save_top_k) {
        qsort(steps, n, sizeof *steps, cmp_i64);
        for (size_t i = 0; i + (size_t)c->o->save_top_k < n; i++) {
            if (steps[i] >= c->step) continue;              /* never the newest */
            for (int sharded = 0; sharded < 2; sharded++) { /* a file, or a sharded folder */
                char path[4096];
                ckpt_step_path(c->o->ckpt_dir, steps[i], sharded, path, sizeof path);
                if (fg_st_remove(path) != FG_OK)
                    fit_progress_note(c->prog, "note: --save-top-k: %s", fg_last_error());
            }
        }
    }
    free(steps);
}

/* Collective: fg_fabric_save writes on rank 0; rank 0 then points "last"
 * at the new file (only after the save returned whole). */
static fg_status save(fit_ctx *c) {
    int64_t epoch, batch;
    fg_dataloader_position(c->train, &epoch, &batch);
    int64_t samples;
    fg_dataloader_sample_position(c->train, NULL, &samples);
    char path[4096], name[128], last[4096];
    bool sharded = c->o->sharded.state_dict_type == FG_STATE_DICT_SHARDED;
    ckpt_step_path(c->o->ckpt_dir, c->step, sharded, path, sizeof path);
    ckpt_step_name(c->step, sharded, name, sizeof name);
    ckpt_last_path(c->o->ckpt_dir, last, sizeof last);
    fg_kv meta[] = {{CKPT_META_CONFIG, c->config_json}, {CKPT_META_VOCAB, c->vocab_b64}};
    fg_train_state st = {.model = c->model,
                         .optimizer = c->opt,
                         .step = c->step,
                         .epoch = epoch,
                         .batch_in_epoch = batch,
                         .seed = (uint64_t)c->o->seed,
                         .samples_in_epoch = samples,
                         .global_batch = c->o->batch_size * c->world * c->o->accumulate,
                         .meta = meta,
                         .nmeta = c->vocab_b64 ? 2 : 1};
    fg_status s = fg_fabric_save(c->f, path, &st);
    if (s != FG_OK) return s;
    if (c->rank0 && (s = fg_st_set_last(last, name)) != FG_OK) return s;
    snprintf(c->last_ckpt, sizeof c->last_ckpt, "%s", path);
    c->last_saved = c->step;
    if (c->rank0 && c->o->save_top_k > 0) prune(c);
    return FG_OK;
}

static fg_status resume(fit_ctx *c) {
    fg_train_state st = {.model = c->model, .optimizer = c->opt};
    TRY(fg_fabric_load(c->f, c->o->resume_path, &st));
    if (st.seed != (uint64_t)c->o->seed && c->rank0)
        fit_progress_note(c->prog,
                          "note: the checkpoint was trained with --seed %llu, this run "
                          "uses %lld: the data order changes",
                          (unsigned long long)st.seed, (long long)c->o->seed);
    c->step = st.step;
    c->last_saved = st.step;
    /* the global batch kept on this world size (the accumulation
     * recomputed), the epoch's remaining samples dealt to these ranks */
    int64_t was = c->o->accumulate;
    TRY(fg_fabric_setup_global_batch(c->f, c->train, c->accumulate, &st));
    int64_t global = c->o->batch_size * c->world * *c->accumulate, at;
    fg_dataloader_sample_position(c->train, NULL, &at);
    const char *ws = fg_fabric_loaded_meta(c->f, "world_size");
    bool resized = ws && atoll(ws) != c->world;
    if (c->rank0 && resized && st.global_batch > 0 && global != st.global_batch)
        fit_progress_note(c->prog,
                          "note: the checkpoint's global batch %lld cannot be kept on %d rank%s "
                          "with --batch-size %lld; this run's is %lld",
                          (long long)st.global_batch, c->world, c->world == 1 ? "" : "s",
                          (long long)c->o->batch_size, (long long)global);
    else if (c->rank0 && *c->accumulate != was)
        fit_progress_note(c->prog,
                          "global batch %lld kept on %d rank%s: --accumulate-grad-batches %lld",
                          (long long)st.global_batch, c->world, c->world == 1 ? "" : "s",
                          (long long)*c->accumulate);
    if (c->rank0 && st.global_batch > 0 && at < st.samples_in_epoch)
        fit_progress_note(c->prog,
                          "note: %lld samples of epoch %lld are taken again (no batch boundary "
                          "of %d rank%s where the checkpoint stopped)",
                          (long long)(st.samples_in_epoch - at), (long long)st.epoch, c->world,
                          c->world == 1 ? "" : "s");
    if (c->rank0)
        fit_progress_note(c->prog, "resumed from %s at step %lld (epoch %lld, batch %lld)",
                          c->o->resume_path, (long long)st.step, (long long)st.epoch,
                          (long long)st.batch_in_epoch);
    return FG_OK;
}

/* The next training batch, moving to the next epoch at the end of one.
 * NULL when --max-epochs is reached (*status FG_OK) or on an error. */
static fg_batch *next_batch(fit_ctx *c, fg_status *status) {
    *status = FG_OK;
    fg_batch *b = fg_dataloader_next(c->train);
    if (b) return b;
    if ((*status = fg_dataloader_status(c->train)) != FG_OK) return NULL;
    int64_t epoch, batch;
    fg_dataloader_position(c->train, &epoch, &batch);
    if (c->o->max_epochs >= 0 && epoch + 1 >= c->o->max_epochs) return NULL;
    if ((*status = fg_dataloader_set_epoch(c->train, epoch + 1)) != FG_OK) return NULL;
    b = fg_dataloader_next(c->train);
    if (!b) {
        *status = fg_dataloader_status(c->train);
        if (*status == FG_OK) *status = fg_error(FG_EINVAL, "the training data has no batch");
    }
    return b;
}

/* fg_fabric_training_step's step: the loss of one micro-batch (or, under
 * dp, of one thread's part of it), scaled for accumulation. */
static fg_tensor *micro_step(fg_fabric *f, fg_batch *part, void *ud) {
    fit_ctx *c = ud;
    fg_tensor *loss = forward_loss(c, part->x, part->y);
    if (!loss) fg_error_wrap(FG_EINVAL, "step %lld: forward", (long long)c->step + 1);
    /* deterministic: the fabric averages the micro-batches itself */
    bool scale = c->o->accumulate > 1 && !fg_fabric_deterministic(f);
    return scale ? fg_scale(loss, 1.0 / (double)c->o->accumulate) : loss;
}

/* The first parameter whose gradient holds an inf or NaN, or -1. */
static int64_t first_nonfinite_grad(fit_ctx *c) {
    for (int64_t i = 0; i < fg_module_num_params(c->model); i++) {
        fg_tensor *g = fg_tensor_grad(fg_module_param(c->model, i));
        if (!g) continue;
        int64_t n = fg_tensor_numel(g);
        const void *d = fg_tensor_data(g);
        if (fg_tensor_dtype(g) == FG_F64) {
            const double *x = d;
            for (int64_t k = 0; k < n; k++)
                if (!isfinite(x[k])) return i;
        } else if (fg_tensor_dtype(g) == FG_F32) {
            const float *x = d;
            for (int64_t k = 0; k < n; k++)
                if (!isfinite(x[k])) return i;
        } else { /* bf16 / f16: the exponent all ones */
            const uint16_t *x = d, e = fg_tensor_dtype(g) == FG_BF16 ? 0x7f80 : 0x7c00;
            for (int64_t k = 0; k < n; k++)
                if ((x[k] & e) == e) return i;
        }
    }
    return -1;
}

/* --on-nonfinite: a non-finite loss on any rank, or gradient, is noticed by
 * every rank at once (one allreduce of two flags) and written into
 * c->nonfinite (the step, the loss or the parameter). Under 16-mixed the
 * loss scaler owns inf/NaN gradients (it skips the step and lowers the
 * scale): only the loss is checked then. Collective. */
static fg_status check_finite(fit_ctx *c, double loss_sum) {
    c->nonfinite[0] = '\0';
    int64_t bad_param = fg_fabric_scaler(c->f) ? -1 : first_nonfinite_grad(c);
    /* [0]: a rank's loss is not finite; [1]: minus the first bad parameter
     * (MAX over ranks = the first), -1e18 for none */
    double v[2] = {isfinite(loss_sum) ? 0.0 : 1.0, bad_param >= 0 ? -(double)bad_param : -1e18};
    fg_comm *comm = fg_fabric_comm(c->f);
    if (comm && c->world > 1) TRY(fg_comm_allreduce(comm, v, v, 2, FG_F64, FG_MAX));
    if (v[0] == 0 && v[1] < -1e17) return FG_OK;
    if (v[0] > 0)
        snprintf(c->nonfinite, sizeof c->nonfinite, "step %lld: the loss is not finite%s",
                 (long long)c->step + 1,
                 c->world > 1 && isfinite(loss_sum) ? " (on another rank)" : "");
    else
        snprintf(c->nonfinite, sizeof c->nonfinite, "step %lld: the gradient of %s is not finite",
                 (long long)c->step + 1, fg_module_param_name(c->model, (int64_t)-v[1]));
    return FG_OK;
}

/* One optimizer step over --accumulate-grad-batches micro-batches.
 * *done is set when the epochs ran out before any micro-batch. */
static fg_status train_step(fit_ctx *c, double *loss_out, double *items, bool *done) {
    const fit_opts *o = c->o;
    double loss_sum = 0;
    int64_t micro = 0, samples = 0;
    *done = false;
    /* dropout masks as a function of (seed, rank, step) only, so that a
     * resumed run draws the masks the uninterrupted one would have */
    if (c->cfg.dropout > 0)
        fg_module_seed_dropout(
            c->model, fg_rng_derive(fg_rng_derive((uint64_t)o->seed,
                                                  (uint64_t)fg_fabric_global_rank(c->f) + 1),
                                    (uint64_t)c->step));
    fg_optimizer_zero_grad(c->opt);
    for (; micro < o->accumulate; micro++) {
        fg_status s;
        fg_batch *b = next_batch(c, &s);
        if (!b) {
            if (s != FG_OK) return s;
            break;
        }
        /* the last micro-batch of the step synchronises (ddp's no_sync before) */
        fg_fabric_set_no_backward_sync(c->f, micro + 1 < o->accumulate);
        double part_loss;
        TRY(fg_fabric_training_step(c->f, b, micro_step, NULL, c, &part_loss));
        loss_sum += part_loss * (fg_fabric_deterministic(c->f) ? 1.0 : (double)o->accumulate);
        samples += b->size;
        fg_fabric_step_end(c->f);
    }
    if (micro == 0) {
        *done = true;
        return FG_OK;
    }
    if (micro < o->accumulate) {
        /* --max-epochs ran out mid-accumulation (on every rank alike): the
         * last backward ran without sync, so average the gradients here */
        fg_fabric_set_no_backward_sync(c->f, false);
        TRY(fg_fabric_all_reduce(c->f, fg_module_flat_grads(c->model), FG_AVG));
    }
    TRY(check_finite(c, loss_sum));
    if (c->nonfinite[0]) { /* every rank alike: skip the optimizer step, or stop */
        fg_optimizer_zero_grad(c->opt);
        fg_fabric_step_end(c->f);
        *loss_out = NAN;
        *items = 0;
        return FG_OK;
    }
    if (o->clip > 0) TRY(fg_fabric_clip_gradients(c->f, o->clip, NULL));
    fg_optimizer_set_lr(c->opt, fit_lr_at(o, c->step));
    TRY(fg_fabric_optimizer_step(c->f, c->opt)); /* 16-mixed: the loss scaler */
    fg_fabric_step_end(c->f);
    c->step++;
    double mean = loss_sum / (double)micro;
    /* not fg_fabric_reduce_scalar: its NaN on a failed allreduce would read
     * as a non-finite loss, hiding the peer that broke the group */
    fg_comm *comm = fg_fabric_comm(c->f);
    if (fg_fabric_deterministic(c->f)) TRY(fg_fabric_step_loss(c->f, &mean));
    else if (comm && c->world > 1) TRY(fg_comm_allreduce(comm, &mean, &mean, 1, FG_F64, FG_AVG));
    *loss_out = mean;
    *items = (double)samples * (c->cfg.kind == FIT_GPT ? (double)c->cfg.ctx : 1.0) * c->world;
    return FG_OK;
}

/* Rank 0, gpt on text: a sample after the run. Prompt: a newline if the
 * vocabulary has one, else its first character. */
static void final_sample(fit_ctx *c) {
    if (c->cfg.kind != FIT_GPT || !c->o->sample_tokens) return;
    int64_t n = c->o->sample_tokens;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(n + 1));
    char *text = malloc((size_t)n + 2);
    if (!ids || !text) goto out;
    int32_t start = 0;
    if (c->d.text_vocab && fg_text_vocab_id(c->d.text_vocab, '\n') >= 0)
        start = fg_text_vocab_id(c->d.text_vocab, '\n');
    fg_module_train(c->model, false);
    fg_sample_opts so = {.temperature = 0.8, .seed = (uint64_t)c->o->seed};
    if (fg_gpt_generate(c->model, &start, 1, n, &so, ids) != FG_OK) {
        cli_error("sample: %s", fg_last_error());
        goto out;
    }
    printf("sample (temperature 0.8, seed %lld):\n", (long long)c->o->seed);
    if (c->d.text_vocab && fg_text_vocab_decode(c->d.text_vocab, ids + 1, n, text) == FG_OK) {
        fwrite(text, 1, (size_t)n, stdout);
        putchar('\n');
    } else {
        for (int64_t i = 1; i <= n; i++) printf("%d%c", ids[i], i == n ? '\n' : ' ');
    }
    fflush(stdout);
out:
    free(ids);
    free(text);
}

static int64_t total_steps(const fit_ctx *c) {
    int64_t per_epoch = (fg_dataloader_len(c->train) + c->o->accumulate - 1) / c->o->accumulate;
    int64_t t = c->o->max_steps;
    if (c->o->max_epochs > 0 && (t < 0 || per_epoch * c->o->max_epochs < t))
        t = per_epoch * c->o->max_epochs;
    return t;
}

static void free_ctx(fit_ctx *c) {
    fit_progress_free(c->prog);
    fg_dataloader_free(c->train);
    fg_dataloader_free(c->val);
    fg_optimizer_free(c->opt);
    fg_module_free(c->model);
    fit_data_free(&c->d);
    free(c->config_json);
    free(c->vocab_b64);
}

int fit_run(fg_fabric *f, void *arg) {
    fit_opts opts = *(const fit_opts *)arg;
    fit_ctx c = {.f = f,
                 .o = &opts,
                 .rank0 = fg_fabric_is_global_zero(f),
                 .world = fg_fabric_world_size(f),
                 .accumulate = &opts.accumulate};
    const fit_opts *o = c.o;
    int rc = FG_EXIT_FAIL;
    double t_start = fg_time();
    if (fit_data_open(o, &c.d) != FG_OK) {
        rc = rank_error(&c, "data");
        goto out;
    }
    fit_model_cfg_from_opts(o, &c.d, &c.cfg);
    c.cfg.f64 = fg_fabric_dtype(f) == FG_F64;
    c.cfg.dtype = fg_fabric_dtype(f);
    /* stage 3: a sharded initialisation, the model never whole on a rank */
    fg_strategy_kind kind = fg_fabric_plan(f)->strategy;
    fg_sharding_strategy ss = o->sharded.sharding_strategy;
    bool s3 = c.world > 1 && (kind == FG_STRATEGY_DEEPSPEED_STAGE_3 ||
                              (kind == FG_STRATEGY_FSDP &&
                               (ss == FG_SHARDING_FULL_SHARD || ss == FG_SHARDING_HYBRID_SHARD)));
    bool was = fg_module_set_empty_init(s3);
    c.model = fit_model_new(&c.cfg);
    fg_module_set_empty_init(was);
    c.opt = c.model ? fit_optimizer_new(o, c.model) : NULL;
    if (!c.model || !c.opt) {
        rc = rank_error(&c, "model");
        goto out;
    }
    c.config_json = fit_model_cfg_json(&c.cfg, o);
    if (c.d.text_vocab)
        c.vocab_b64 = b64_encode(fg_text_vocab_bytes(c.d.text_vocab),
                                 (size_t)fg_text_vocab_size(c.d.text_vocab));
    if (!c.config_json || (c.d.text_vocab && !c.vocab_b64)) {
        fg_error(FG_ENOMEM, "out of memory");
        rc = rank_error(&c, "checkpoint metadata");
        goto out;
    }
    if (fg_fabric_setup(f, c.model, c.opt) != FG_OK) {
        rc = rank_error(&c, "setup");
        goto out;
    }
    /* sizes against what exists before the loaders allocate their batches:
     * a --batch-size past the data would cost gigabytes before "no batch" */
    int64_t per_rank = (fg_dataset_len(c.d.train) + c.world - 1) / c.world;
    if (per_rank < o->batch_size) {
        fg_error(FG_EINVAL,
                 "--data=%s: %lld training samples make no batch of --batch-size %lld "
                 "per rank on %d rank%s: use --batch-size %lld or less",
                 o->data, (long long)fg_dataset_len(c.d.train), (long long)o->batch_size, c.world,
                 c.world == 1 ? "" : "s", (long long)(per_rank > 0 ? per_rank : 1));
        rc = rank_error(&c, "data");
        goto out;
    }
    /* validation averages by token count, so a batch no larger than a
     * rank's share of the val set gives the same loss */
    int64_t val_per_rank = (fg_dataset_len(c.d.val) + c.world - 1) / c.world;
    int64_t val_batch = o->batch_size < val_per_rank ? o->batch_size : val_per_rank;
    if (val_batch < 1) val_batch = 1;
    /* the loaders stay ours (setup_dataloader borrows them): freed at out */
    c.train = fg_dataloader_new(c.d.train, &(fg_loader_opts){.batch = o->batch_size,
                                                             .shuffle = true,
                                                             .seed = (uint64_t)o->seed,
                                                             .drop_last = true,
                                                             .num_workers = (int)o->num_workers});
    c.val = c.train
                ? fg_dataloader_new(c.d.val, &(fg_loader_opts){.batch = val_batch,
                                                               .num_workers = (int)o->num_workers})
                : NULL;
    if (!c.train || !c.val || !fg_fabric_setup_dataloader(f, c.train, true) ||
        !fg_fabric_setup_dataloader(f, c.val, true)) {
        rc = rank_error(&c, "data loader");
        goto out;
    }
    if (fg_dataloader_len(c.train) == 0) {
        fg_error(FG_EINVAL,
                 "--data=%s: %lld training samples make no batch of --batch-size %lld "
                 "per rank on %d ranks",
                 o->data, (long long)fg_dataset_len(c.d.train), (long long)o->batch_size, c.world);
        rc = rank_error(&c, "data");
        goto out;
    }
    if (c.rank0) {
        char csv[4096];
        if (make_dirs(o->root_dir) != 0 || make_dirs(o->ckpt_dir) != 0) {
            fg_error(FG_EIO, "cannot create %s or %s: %s", o->root_dir, o->ckpt_dir,
                     strerror(errno));
            rc = rank_error(&c, "output");
            goto out;
        }
        int stale = 0;
        if (fg_st_remove_stale_tmp(o->ckpt_dir, &stale) != FG_OK) {
            rc = rank_error(&c, "checkpoint folder");
            goto out;
        }
        if (stale)
            printf("removed %d temporary checkpoint file%s left by a run killed while saving\n",
                   stale, stale == 1 ? "" : "s");
        snprintf(csv, sizeof csv, "%s/metrics.csv", o->root_dir);
        c.prog = fit_progress_new(o, 0, 0, c.cfg.kind == FIT_GPT ? "tok" : "samples", csv,
                                  o->resume != NULL);
        if (!c.prog) {
            rc = rank_error(&c, "metrics");
            goto out;
        }
    }
    if (o->resume) {
        if (c.rank0 && o->restart_count > 0 && !strcmp(o->resume, "last"))
            fit_progress_note(c.prog, "restart %lld: resuming from the newest checkpoint",
                              (long long)o->restart_count);
        if (resume(&c) != FG_OK) {
            rc = rank_error(&c, "--resume");
            goto out;
        }
    } else if (fg_fabric_setup_global_batch(f, c.train, c.accumulate, NULL) != FG_OK) {
        rc = rank_error(&c, "data loader");
        goto out;
    }
    int64_t total = total_steps(&c);
    if (c.rank0) {
        fit_progress_free(c.prog);
        char csv[4096];
        snprintf(csv, sizeof csv, "%s/metrics.csv", o->root_dir);
        c.prog = fit_progress_new(o, total, c.step, c.cfg.kind == FIT_GPT ? "tok" : "samples", csv,
                                  true);
        int64_t nparams = 0;
        for (int64_t i = 0; i < fg_module_num_params(c.model); i++)
            nparams += fg_tensor_numel(fg_module_param(c.model, i));
        if (c.cfg.kind == FIT_GPT)
            printf("fit gpt: %lld parameters (layers %lld, heads %lld, embd %lld, ctx %lld, vocab "
                   "%lld); %lld train / %lld val windows\n",
                   (long long)nparams, (long long)c.cfg.layers, (long long)c.cfg.heads,
                   (long long)c.cfg.embd, (long long)c.cfg.ctx, (long long)c.cfg.vocab,
                   (long long)fg_dataset_len(c.d.train), (long long)fg_dataset_len(c.d.val));
        else
            printf("fit mlp: %lld parameters (%lld -> %lld -> %lld); %lld train / %lld val "
                   "samples\n",
                   (long long)nparams, (long long)c.cfg.in_dim, (long long)c.cfg.hidden,
                   (long long)c.cfg.classes, (long long)fg_dataset_len(c.d.train),
                   (long long)fg_dataset_len(c.d.val));
        printf("%d rank%s (%s), batch %lld x %d rank%s x %lld accumulated = %lld per step; "
               "%lld steps; run folder %s\n",
               c.world, c.world == 1 ? "" : "s", fg_fabric_strategy_name(f),
               (long long)o->batch_size, c.world, c.world == 1 ? "" : "s", (long long)o->accumulate,
               (long long)(o->batch_size * c.world * o->accumulate), (long long)total, o->root_dir);
        int64_t sb, se;
        fg_optimizer_state_range(c.opt, &sb, &se);
        if (se - sb < nparams) /* a sharding strategy cut the optimizer's state */
            printf("optimizer state sharded: rank 0 holds %lld of %lld elements per state "
                   "buffer (%s x %d)\n",
                   (long long)(se - sb), (long long)nparams, fg_optimizer_name(c.opt),
                   fg_optimizer_num_states(c.opt));
        const fg_strategy *strat = fg_fabric_strategy(f);
        int64_t pb, pe;
        if (fg_strategy_shards_params(strat) &&
            fg_strategy_param_range(strat, 0, &pb, &pe) == FG_OK)
            printf("parameters sharded: rank 0 holds %lld of %lld elements between steps; %d "
                   "units gathered around their forward and backward\n",
                   (long long)(pe - pb), (long long)nparams, fg_strategy_num_units(strat));
        if (fg_optimizer_state_on_disk(c.opt, NULL, NULL))
            printf("optimizer state offloaded to nvme: rank 0's %lld elements x %d in files "
                   "under %s, streamed at each step\n",
                   (long long)(se - sb), fg_optimizer_num_states(c.opt), o->nvme_path);
        else if (o->sharded.offload_optimizer_device == FG_OFFLOAD_CPU ||
                 o->sharded.offload_params_device == FG_OFFLOAD_CPU ||
                 strstr(o->strategy, "offload"))
            printf("offload to the cpu: nothing to move (on a CPU the parameters and optimizer "
                   "state are in host memory already)\n");
        fflush(stdout);
    }
    c.last_val = NAN;
    c.last_val_step = -1;
    while (o->max_steps < 0 || c.step < o->max_steps) {
        double loss = 0, items = 0;
        bool done;
        if (train_step(&c, &loss, &items, &done) != FG_OK) {
            rc = rank_error(&c, "training");
            goto out;
        }
        if (done) break;
        if (c.nonfinite[0] && o->on_nonfinite_skip) {
            c.skipped++;
            if (++c.skipped_in_row >= 1000) {
                fg_error(FG_EINVAL,
                         "%s; 1000 optimizer steps in a row skipped: lower --lr or "
                         "set --gradient-clip-val",
                         c.nonfinite);
                rc = rank_error(&c, "training");
                goto out;
            }
            if (c.rank0)
                fit_progress_note(c.prog, "%s: optimizer step skipped on every rank (%lld so far)",
                                  c.nonfinite, (long long)c.skipped);
        } else if (c.nonfinite[0]) {
            char last[4200] = "none yet";
            if (c.last_ckpt[0]) snprintf(last, sizeof last, "%s", c.last_ckpt);
            else if (o->resume) snprintf(last, sizeof last, "%s", o->resume_path);
            fg_error(FG_EINVAL,
                     "%s; stopped on every rank (last good checkpoint: %s); lower --lr, set "
                     "--gradient-clip-val, or --on-nonfinite skip",
                     c.nonfinite, last);
            rc = rank_error(&c, "training");
            goto out;
        } else {
            c.skipped_in_row = 0;
        }
        int64_t epoch, batch;
        fg_dataloader_position(c.train, &epoch, &batch);
        if (c.nonfinite[0]) goto boundary; /* a skipped step: nothing to log, validate or save */
        fit_progress_step(c.prog, c.step, epoch, loss, fit_lr_at(o, c.step - 1), items);
        if (o->val_check_interval && c.step % o->val_check_interval == 0) {
            if (validate(&c, &c.last_val) != FG_OK) {
                rc = rank_error(&c, "validation");
                goto out;
            }
            c.last_val_step = c.step;
            if (!isnan(c.last_val)) fit_progress_val(c.prog, c.step, epoch, c.last_val);
        }
        if (o->ckpt_every && c.step % o->ckpt_every == 0 && save(&c) != FG_OK) {
            rc = rank_error(&c, "checkpoint");
            goto out;
        }
    boundary:; /* a signal on any rank: all agree here, after the same step */
        bool stop = false;
        if (fg_fabric_should_stop(f, &stop) != FG_OK) {
            rc = rank_error(&c, "training");
            goto out;
        }
        if (stop) {
            if (c.last_saved != c.step && save(&c) != FG_OK) {
                rc = rank_error(&c, "checkpoint");
                goto out;
            }
            fit_stopped = 1; /* saved: further signals are ignored */
            if (c.rank0) {
                fit_progress_free(c.prog);
                c.prog = NULL;
                printf("stopped by a signal after step %lld (of %lld); checkpoint %s; run the "
                       "same command with --resume last to continue (exit status %d)\n",
                       (long long)c.step, (long long)total, c.last_ckpt, FG_EXIT_RESUMABLE);
                fflush(stdout);
            }
            rc = FG_EXIT_OK;
            goto out;
        }
    }
    int64_t epoch, batch;
    fg_dataloader_position(c.train, &epoch, &batch);
    if (c.last_val_step != c.step) {
        if (validate(&c, &c.last_val) != FG_OK) {
            rc = rank_error(&c, "validation");
            goto out;
        }
        if (!isnan(c.last_val)) fit_progress_val(c.prog, c.step, epoch, c.last_val);
    }
    if (c.last_saved != c.step || !c.last_ckpt[0]) {
        if (save(&c) != FG_OK) {
            rc = rank_error(&c, "checkpoint");
            goto out;
        }
    }
    /* stage 3: rank 0 samples from the whole model (every rank gathers it) */
    fg_strategy *strat = (fg_strategy *)fg_fabric_strategy(f);
    if (c.cfg.kind == FIT_GPT && o->sample_tokens && fg_strategy_shards_params(strat) &&
        fg_strategy_gather_params(strat) != FG_OK) {
        rc = rank_error(&c, "gathering the parameters to sample");
        goto out;
    }
    if (c.rank0) {
        fit_progress_free(c.prog);
        c.prog = NULL;
        char val[32] = "n/a (no validation data)";
        if (!isnan(c.last_val)) snprintf(val, sizeof val, "%.4f", c.last_val);
        printf("done: %lld steps in %.1f s; val loss %s; checkpoint %s\n", (long long)c.step,
               fg_time() - t_start, val, c.last_ckpt);
        fg_comm_bytes cb;
        if (c.world > 1 && fg_strategy_comm_bytes(fg_fabric_strategy(f), &cb) == FG_OK &&
            cb.steps > 0) /* counted by the strategy, not assumed */
            printf("comm: %.0f bytes per step handed to the communicator by rank 0 (%lld "
                   "synchronised backwards, %.4g of plain ddp's %llu)\n",
                   (double)cb.total / (double)cb.steps, (long long)cb.steps,
                   (double)cb.total / (double)cb.steps / (double)cb.dense_step,
                   (unsigned long long)cb.dense_step);
        if (o->on_nonfinite_skip)
            printf("%lld optimizer step%s skipped on a non-finite loss or gradient "
                   "(--on-nonfinite skip)\n",
                   (long long)c.skipped, c.skipped == 1 ? "" : "s");
        const fg_scaler *sc = fg_fabric_scaler(f);
        if (sc) /* 16-mixed: what the loss scaler did */
            printf("loss scale %g; %lld step%s skipped on inf/NaN gradients\n",
                   fg_scaler_get_state(sc).scale, (long long)fg_scaler_get_state(sc).skipped,
                   fg_scaler_get_state(sc).skipped == 1 ? "" : "s");
        fflush(stdout);
        final_sample(&c);
    }
    rc = FG_EXIT_OK;
out:
    free_ctx(&c);
    return rc;
}
