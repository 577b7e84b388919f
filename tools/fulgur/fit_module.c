/* The built-in models (gpt, mlp) and their data as a user module of the
 * Trainer (Lightning's LightningModule): what one training, validation,
 * test and predict step computes, the optimizer and its per-step schedule,
 * the loaders, and the metadata a checkpoint carries for `fulgur sample`
 * (the model's config and the text vocabulary). The loop is the Trainer's. */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "fit_model.h"

struct fit_module {
    const fit_opts *o;
    fit_data d;
    fg_dataset *extra; /* --test-data / --predict-data, when given */
    fit_model_cfg cfg;
    fg_module *model;
    fg_dataloader *train, *val, *eval; /* eval: test or predict's own data */
    char *config_json, *vocab_b64;
    /* the optimizer step being accumulated on this rank */
    double win_loss;
    int64_t win_micro, win_samples;
    int64_t last_val_step;
    double last_val;
    bool model_failed;  /* configure_model could not build the model */
    fg_comm *sync_comm; /* --sync-batchnorm's communicator (several ranks) */
    fg_stats_reduce sync;
    uint64_t ckpt_seed;
    int64_t ckpt_world, ckpt_global_batch, ckpt_samples; /* the elastic resume's (-1: none) */
    /* Lightning's hparams (hparams.yaml of the loggers) */
    fg_kv hparams[12];
    char hp_val[12][64];
    int64_t nhparams;
    fg_tmetric *acc; /* mlp: val_acc / test_acc (TorchMetrics' Accuracy) */
    /* predict: this rank's predictions in its sampler's order */
    double *pred;
    int64_t npred, cappred;
};

fit_module *fit_module_new(const fit_opts *o) {
    fit_module *m = calloc(1, sizeof *m);
    if (!m) {
        fg_error(FG_ENOMEM, "out of memory");
        return NULL;
    }
    m->o = o;
    m->last_val_step = -1;
    m->last_val = NAN;
    m->ckpt_world = m->ckpt_global_batch = m->ckpt_samples = -1;
    return m;
}

void fit_module_free(fit_module *m) {
    if (!m) return;
    fg_dataloader_free(m->train);
    fg_dataloader_free(m->val);
    fg_dataloader_free(m->eval);
    fg_module_free(m->model);
    fg_comm_free(m->sync_comm);
    fit_data_free(&m->d);
    fg_dataset_free(m->extra);
    free(m->config_json);
    free(m->vocab_b64);
    free(m->pred);
    fg_tmetric_free(m->acc);
    free(m);
}

const fit_data *fit_module_data(const fit_module *m) { return &m->d; }
fg_module *fit_module_model(const fit_module *m) { return m->model; }
bool fit_module_model_failed(const fit_module *m) { return m->model_failed; }
bool fit_module_is_gpt(const fit_module *m) { return m->cfg.kind == FIT_GPT; }
int64_t fit_module_ctx(const fit_module *m) { return m->cfg.ctx; }
uint64_t fit_module_ckpt_seed(const fit_module *m) { return m->ckpt_seed; }
void fit_module_ckpt_batch(const fit_module *m, int64_t *world, int64_t *global_batch,
                           int64_t *samples) {
    *world = m->ckpt_world;
    *global_batch = m->ckpt_global_batch;
    *samples = m->ckpt_samples;
}

fg_dataloader *fit_module_loader(const fit_module *m, fg_trainer_fn fn) {
    switch (fn) {
    case FG_FIT: return m->train;
    case FG_VALIDATE: return m->val;
    default: return m->eval ? m->eval : m->val;
    }
}

int64_t fit_module_last_val(const fit_module *m, double *loss) {
    *loss = m->last_val;
    return m->last_val_step;
}

/* --test-data / --predict-data: the same kind of file as --data, read with
 * its vocabulary (text) or its input width (mlp). */
static FG_MUST_USE fg_status open_extra(fit_module *m, const char *data, const char *labels) {
    const fit_opts *o = m->o;
    size_t n = strlen(data);
    if (o->kind == FIT_MLP) m->extra = fit_mlp_dataset(o, data, labels);
    else if (n > 4 && !strcmp(data + n - 4, ".bin"))
        m->extra = fg_token_dataset_new(data, o->ctx, m->d.vocab);
    else m->extra = fg_text_dataset_new(data, o->ctx, m->d.text_vocab);
    if (!m->extra) return fg_error_wrap(FG_EINVAL, "%s", data);
    return FG_OK;
}

static void hparam(fit_module *m, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void hparam(fit_module *m, const char *key, const char *fmt, ...) {
    int64_t i = m->nhparams++;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->hp_val[i], sizeof m->hp_val[i], fmt, ap);
    va_end(ap);
    m->hparams[i] = (fg_kv){key, m->hp_val[i]};
}

static void set_hparams(fit_module *m) {
    const fit_opts *o = m->o;
    hparam(m, "model", "%s", o->model);
    if (o->arch == FIT_ARCH_RESNET) {
        hparam(m, "depth", "%lld", (long long)o->depth);
        hparam(m, "width", "%lld", (long long)o->width);
        hparam(m, "sync_batchnorm", "%s", o->sync_batchnorm ? "true" : "false");
    } else if (o->arch == FIT_ARCH_VIT) {
        hparam(m, "num_layers", "%lld", (long long)o->layers);
        hparam(m, "num_heads", "%lld", (long long)o->heads);
        hparam(m, "hidden_dim", "%lld", (long long)o->embd);
        hparam(m, "mlp_dim", "%lld", (long long)o->hidden);
        hparam(m, "patch_size", "%lld", (long long)o->patch_size);
    } else if (o->arch == FIT_ARCH_LSTM) {
        hparam(m, "num_layers", "%lld", (long long)o->layers);
        hparam(m, "embd", "%lld", (long long)o->embd);
        hparam(m, "hidden", "%lld", (long long)o->hidden);
    } else if (o->kind == FIT_GPT) {
        hparam(m, "n_layer", "%lld", (long long)o->layers);
        hparam(m, "n_head", "%lld", (long long)o->heads);
        hparam(m, "n_embd", "%lld", (long long)o->embd);
        hparam(m, "block_size", "%lld", (long long)o->ctx);
        hparam(m, "dropout", "%g", o->dropout);
    } else {
        hparam(m, "hidden", "%lld", (long long)o->hidden);
    }
    hparam(m, "optimizer", "%s", o->optimizer);
    hparam(m, "lr", "%g", o->lr);
    hparam(m, "weight_decay", "%g", o->weight_decay);
    hparam(m, "batch_size", "%lld", (long long)o->batch_size);
    hparam(m, "seed", "%lld", (long long)o->seed);
}

fg_status fit_module_open(fit_module *m, fg_trainer *t, const char **what) {
    const fit_opts *o = m->o;
    int world = fg_trainer_world_size(t);
    *what = "data";
    fg_status s = fit_data_open(o, &m->d);
    if (s != FG_OK) return s;
    if (o->fn == FG_TEST && o->test_data) TRY(open_extra(m, o->test_data, o->test_labels));
    if (o->fn == FG_PREDICT && o->predict_data) TRY(open_extra(m, o->predict_data, NULL));
    fit_model_cfg_from_opts(o, &m->d, &m->cfg);
    if (!m->nhparams) set_hparams(m);
    m->cfg.f64 = fg_fabric_dtype(fg_trainer_fabric(t)) == FG_F64;
    m->cfg.dtype = fg_fabric_dtype(fg_trainer_fabric(t)); /* bf16-true: bf16 parameters */
    /* the model itself: configure_model, inside the entry point */
    m->config_json = fit_model_cfg_json(&m->cfg, o);
    if (m->d.text_vocab)
        m->vocab_b64 = b64_encode(fg_text_vocab_bytes(m->d.text_vocab),
                                  (size_t)fg_text_vocab_size(m->d.text_vocab));
    if (!m->config_json || (m->d.text_vocab && !m->vocab_b64))
        return fg_error(FG_ENOMEM, "checkpoint metadata: out of memory");
    *what = "data";
    /* validation averages by token count, so a batch no larger than a
     * rank's share of the val set gives the same loss */
    fg_dataset *eval_ds = m->extra ? m->extra : m->d.val;
    int64_t per_rank = (fg_dataset_len(eval_ds) + world - 1) / world;
    int64_t eval_batch = o->batch_size < per_rank ? o->batch_size : per_rank;
    if (eval_batch < 1) eval_batch = 1;
    if (o->fn == FG_FIT) {
        /* sizes against what exists before the loaders allocate their batches:
         * a --batch-size past the data would cost gigabytes before "no batch" */
        int64_t train_per_rank = (fg_dataset_len(m->d.train) + world - 1) / world;
        if (train_per_rank < o->batch_size)
            return fg_error(FG_EINVAL,
                            "--data=%s: %lld training samples make no batch of --batch-size "
                            "%lld per rank on %d rank%s: use --batch-size %lld or less",
                            o->data, (long long)fg_dataset_len(m->d.train),
                            (long long)o->batch_size, world, world == 1 ? "" : "s",
                            (long long)(train_per_rank > 0 ? train_per_rank : 1));
        m->train =
            fg_dataloader_new(m->d.train, &(fg_loader_opts){.batch = o->batch_size,
                                                            .shuffle = true,
                                                            .seed = (uint64_t)o->seed,
                                                            .drop_last = true,
                                                            .num_workers = (int)o->num_workers});
        if (!m->train) return fg_last_status();
    }
    int64_t val_per_rank = (fg_dataset_len(m->d.val) + world - 1) / world;
    int64_t val_batch = o->batch_size < val_per_rank ? o->batch_size : val_per_rank;
    m->val = fg_dataloader_new(m->d.val, &(fg_loader_opts){.batch = val_batch < 1 ? 1 : val_batch,
                                                           .num_workers = (int)o->num_workers});
    if (!m->val) return fg_last_status();
    if (m->extra) {
        m->eval = fg_dataloader_new(
            m->extra, &(fg_loader_opts){.batch = eval_batch, .num_workers = (int)o->num_workers});
        if (!m->eval) return fg_last_status();
    }
    return FG_OK;
}

/* ---------------------------------------------------------------- steps */

/* Model input for a batch: gpt takes (B, T) ids as they are; mlp flattens
 * (B, D...) to (B, D) in the model's dtype. */
static fg_tensor *forward(fit_module *m, fg_tensor *x) {
    if ((m->cfg.arch == FIT_ARCH_RESNET || m->cfg.arch == FIT_ARCH_VIT) && fg_tensor_ndim(x) != 4) {
        /* (B, D) or (B, H, W) images: (B, C, H, W), square when flat */
        int64_t B = fg_tensor_dim(x, 0), C = m->cfg.channels, hw = m->cfg.in_dim / C;
        int64_t H =
            fg_tensor_ndim(x) == 3 ? fg_tensor_dim(x, 1) : (int64_t)llround(sqrt((double)hw));
        x = fg_reshape(x, 4, (int64_t[]){B, C, H, H ? hw / H : 0});
    } else if (m->cfg.kind == FIT_MLP && m->cfg.arch == FIT_ARCH_BASE && !m->cfg.net[0] &&
               fg_tensor_ndim(x) != 2) {
        int64_t shape[2] = {fg_tensor_dim(x, 0), m->cfg.in_dim};
        x = fg_reshape(x, 2, shape);
    }
    fg_dtype mdt = fg_module_dtype(m->model);
    if (m->cfg.kind == FIT_MLP && x && fg_tensor_dtype(x) != mdt) {
        /* inputs come as f32; a 64-true model takes f64 (on a device the
         * cast, its kernel: a converting copy is the host's) */
        fg_dev *dev = fg_tensor_dev(x);
        if (dev && !fg_dev_host_accessible(dev)) {
            x = fg_cast(x, mdt);
        } else {
            fg_tensor *xm = fg_empty(mdt, fg_tensor_ndim(x), fg_tensor_shape(x));
            if (!xm || fg_tensor_copy(xm, x) != FG_OK) return NULL;
            x = xm;
        }
    }
    return x ? fg_module_forward(m->model, x) : NULL;
}

static fg_tensor *training_step(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)i;
    fit_module *m = ud;
    fg_tensor *out = forward(m, b->x);
    (void)t;
    return out ? fg_cross_entropy(out, b->y, -100) : NULL;
}

/* the losses of the batch's parts (dp: one per thread), scaled by the
 * trainer for accumulation: the batch's mean loss, unscaled */
static FG_MUST_USE fg_status training_step_end(void *ud, fg_trainer *t, const double *part_losses,
                                               int nparts) {
    fit_module *m = ud;
    double sum = 0;
    for (int i = 0; i < nparts; i++) sum += part_losses[i];
    /* deterministic: the fabric averages the micro-batches itself (no 1/A) */
    bool det = fg_fabric_deterministic(fg_trainer_fabric(t));
    m->win_loss +=
        sum / (double)nparts * (det ? 1.0 : (double)fg_trainer_accumulate_grad_batches(t));
    m->win_micro++;
    return FG_OK;
}

/* --reader imagefolder: the random transforms draw anew each epoch
 * (torchvision's RandomHorizontalFlip in a new epoch's order) */
static FG_MUST_USE fg_status on_train_epoch_start(void *ud, fg_trainer *t) {
    fit_module *m = ud;
    if (fit_is_images(m->o)) fg_image_folder_set_epoch(m->d.base, fg_trainer_current_epoch(t));
    return FG_OK;
}

static FG_MUST_USE fg_status on_train_batch_start(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    fit_module *m = ud;
    if (i % fg_trainer_accumulate_grad_batches(t) == 0) { /* a new optimizer step's window */
        m->win_loss = 0;
        m->win_micro = m->win_samples = 0;
    }
    m->win_samples += b->size;
    return FG_OK;
}

/* Once the step's gradients are reduced: its loss, the mean over its
 * micro-batches and ranks (deterministic: the fabric's, the same bits on any
 * world size), and its learning rate, logged for the progress bar and every
 * logger alike: one value per step. Collective (every rank's hook runs at
 * the same step). Not called for a step skipped on a non-finite loss. */
static FG_MUST_USE fg_status on_before_optimizer_step(void *ud, fg_trainer *t) {
    fit_module *m = ud;
    double loss = m->win_micro ? m->win_loss / (double)m->win_micro : NAN;
    fg_fabric *f = fg_trainer_fabric(t);
    fg_comm *comm = fg_fabric_comm(f);
    /* not fg_fabric_reduce_scalar: its NaN on a failed allreduce would read
     * as a non-finite loss, hiding the peer that broke the group */
    if (fg_fabric_deterministic(f)) TRY(fg_fabric_step_loss(f, &loss));
    else if (comm && fg_trainer_world_size(t) > 1)
        TRY(fg_comm_allreduce(comm, &loss, &loss, 1, FG_F64, FG_REDUCE_OP_AVG));
    TRY(fg_trainer_log(t, "train_loss", loss, &(fg_log_opts){.prog_bar = true}));
    /* warmup-cosine: the schedule's value; else what the optimizer holds */
    bool own = !strcmp(m->o->lr_scheduler, "warmup-cosine") && !m->o->ds.has_optimizer &&
               m->o->ds.sched == FG_DS_SCHED_NONE;
    double lr =
        own ? fit_lr_at(m->o, fg_trainer_global_step(t)) : fg_optimizer_lr(fg_trainer_optimizer(t));
    return fg_trainer_log(t, "lr", lr, &(fg_log_opts){.prog_bar = true});
}

/* The mean loss of the batch's real samples (distributed padding left
 * out), logged as `name` weighted by their targets' count and averaged over
 * ranks: the token-weighted mean of the whole set. */
static FG_MUST_USE fg_status eval_loss(fit_module *m, fg_trainer *t, fg_batch *b,
                                       const char *name) {
    if (b->valid == 0) return FG_OK;
    fg_tensor *x = b->x, *y = b->y;
    if (b->valid < b->size) {
        x = fg_tensor_narrow_view(x, 0, 0, b->valid);
        y = fg_tensor_narrow_view(y, 0, 0, b->valid);
    }
    fg_tensor *out = forward(m, x);
    fg_tensor *loss = out ? fg_cross_entropy(out, y, -100) : NULL;
    if (!loss) return fg_last_status() ? fg_last_status() : FG_EINVAL;
    TRY(fg_trainer_log(
        t, name, fg_item(loss),
        &(fg_log_opts){.sync_dist = true, .prog_bar = true, .batch_size = fg_tensor_numel(y)}));
    if (m->cfg.kind != FIT_MLP) return FG_OK;
    /* the classifier's accuracy over the whole set (every rank's samples) */
    if (!m->acc && !(m->acc = fg_accuracy_new(&(fg_tmetric_opts){.num_classes = m->cfg.classes})))
        return fg_last_status();
    TRY(fg_tmetric_update(m->acc, out, y));
    return fg_trainer_log_metric(t, strcmp(name, "val_loss") ? "test_acc" : "val_acc", m->acc,
                                 &(fg_log_opts){.prog_bar = true});
}

static FG_MUST_USE fg_status validation_step(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)i;
    return eval_loss(ud, t, b, "val_loss");
}

static FG_MUST_USE fg_status test_step(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)i;
    return eval_loss(ud, t, b, "test_loss");
}

static FG_MUST_USE fg_status on_validation_epoch_end(void *ud, fg_trainer *t) {
    fit_module *m = ud;
    if (fg_trainer_stage(t) != FG_STAGE_VALIDATE) return FG_OK; /* not the sanity check */
    m->last_val_step = fg_trainer_global_step(t);
    if (!fg_trainer_callback_metric(t, "val_loss", &m->last_val)) m->last_val = NAN;
    return FG_OK;
}

/* mlp: the class of each real sample; gpt: the next token after each
 * window (the argmax at its last position). */
static FG_MUST_USE fg_status predict_step(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)t;
    (void)i;
    fit_module *m = ud;
    fg_tensor *out = forward(m, b->x);
    if (!out) return fg_last_status() ? fg_last_status() : FG_EINVAL;
    int64_t classes = fg_tensor_dim(out, fg_tensor_ndim(out) - 1);
    int64_t rows = fg_tensor_numel(out) / classes, per = rows / b->size;
    fg_tensor *o64 = fg_empty(FG_F64, fg_tensor_ndim(out), fg_tensor_shape(out)), *owned = NULL;
    fg_dev *dev = fg_tensor_dev(out);
    if (dev && !fg_dev_host_accessible(dev)) { /* cast there, then one copy to the host */
        fg_tensor *c = fg_cast(out, FG_F64);
        o64 = owned = c ? fg_tensor_to(c, NULL) : NULL;
        if (!o64) return fg_last_status();
    } else if (!o64 || fg_tensor_copy(o64, out) != FG_OK) {
        return fg_last_status();
    }
    const double *v = fg_tensor_data(o64);
    if (m->npred + b->size > m->cappred) {
        int64_t cap = (m->cappred + b->size) * 2;
        double *p = realloc(m->pred, (size_t)cap * sizeof *p);
        if (!p) {
            fg_tensor_free(owned);
            return fg_error(FG_ENOMEM, "predict: out of memory");
        }
        m->pred = p;
        m->cappred = cap;
    }
    for (int64_t s = 0; s < b->size; s++) {
        const double *row = v + ((s + 1) * per - 1) * classes; /* the last position */
        int64_t best = 0;
        for (int64_t c = 1; c < classes; c++)
            if (row[c] > row[best]) best = c;
        m->pred[m->npred++] = s < b->valid ? (double)best : -1; /* -1: distributed padding */
    }
    fg_tensor_free(owned);
    return FG_OK;
}

fg_status fit_module_write_predictions(fit_module *m, fg_trainer *t, const char *path) {
    fg_fabric *f = fg_trainer_fabric(t);
    int world = fg_trainer_world_size(t);
    int64_t len = fg_dataset_len(m->extra ? m->extra : m->d.val);
    int64_t slots = (len + world - 1) / world;
    int64_t shape1[1] = {slots}, shapew[1] = {slots * world};
    /* host tensors, not step tensors: on a device those are its memory */
    fg_tensor *mine = fg_tensor_new(FG_F64, 1, shape1), *all = fg_tensor_new(FG_F64, 1, shapew);
    fg_status s = mine && all ? FG_OK : fg_last_status();
    if (s == FG_OK) {
        double *p = fg_tensor_data(mine);
        for (int64_t j = 0; j < slots; j++) p[j] = j < m->npred ? m->pred[j] : -1;
        if (world > 1) s = fg_fabric_all_gather(f, mine, all);
        else memcpy(fg_tensor_data(all), p, (size_t)slots * sizeof *p);
    }
    if (s == FG_OK && fg_trainer_is_global_zero(t)) {
        FILE *fp = fopen(path, "w");
        if (!fp) {
            fg_tensor_free(mine);
            fg_tensor_free(all);
            return fg_error(FG_EIO, "--predictions=%s: cannot write there", path);
        }
        const double *a = fg_tensor_data(all);
        bool text = m->cfg.kind == FIT_GPT && m->d.text_vocab;
        fprintf(fp, "%s\n",
                m->cfg.kind != FIT_GPT ? "index,class"
                : text                 ? "index,next_token,char"
                                       : "index,next_token");
        int64_t written = 0;
        /* rank r's j-th sample is the dataset's r + j * world */
        for (int64_t idx = 0; idx < len; idx++) {
            double v = a[(idx % world) * slots + idx / world];
            if (v < 0) continue; /* past --limit-predict-batches */
            written++;
            if (text) {
                char one[2] = {0}; /* the character and decode's NUL */
                int32_t id = (int32_t)v;
                if (fg_text_vocab_decode(m->d.text_vocab, &id, 1, one) != FG_OK)
                    one[0] = '\0'; /* an id outside the vocabulary: empty, as before */
                char ch = one[0];
                fprintf(fp, "%lld,%d,%s\n", (long long)idx, id,
                        ch == '\n'  ? "\\n"
                        : ch == ',' ? "\",\""
                                    : (char[]){ch, 0});
            } else {
                fprintf(fp, "%lld,%d\n", (long long)idx, (int)v);
            }
        }
        if (fclose(fp) != 0) s = fg_error(FG_EIO, "--predictions=%s: write failed", path);
        if (s == FG_OK)
            printf("predict: %lld predictions written to %s\n", (long long)written, path);
    }
    fg_tensor_free(mine);
    fg_tensor_free(all);
    return s;
}

/* ------------------------------------------------------- the optimizer */

static double lr_at(void *ud, int64_t step) { return fit_lr_at(((fit_module *)ud)->o, step); }
static double ds_lr_at(void *ud, int64_t step) {
    return fg_deepspeed_lr_at(&((fit_module *)ud)->o->ds, step);
}

static FG_MUST_USE fg_status configure_optimizers(void *ud, fg_trainer *t,
                                                  fg_optimizer_config *out) {
    (void)t;
    fit_module *m = ud;
    const fg_deepspeed_train *ds = &m->o->ds;
    out->optimizer = ds->has_optimizer ? fg_deepspeed_optimizer_new(ds, m->model)
                                       : fit_optimizer_new(m->o, m->model);
    if (!out->optimizer) return fg_last_status();
    if (ds->sched != FG_DS_SCHED_NONE) { /* DeepSpeed's, a pure function of the step */
        out->lr_at = ds_lr_at;
        out->lr_ud = m;
        out->interval = FG_INTERVAL_STEP;
        return FG_OK;
    }
    if (ds->has_optimizer) return FG_OK; /* DeepSpeed without a scheduler: its lr, constant */
    if (!strcmp(m->o->lr_scheduler, "constant")) return FG_OK;
    if (strcmp(m->o->lr_scheduler, "warmup-cosine"))
        return fit_scheduler_new(m->o, out->optimizer, out); /* its state in the checkpoints */
    /* a pure function of the step: a resumed run continues the same curve */
    out->lr_at = lr_at;
    out->lr_ud = m;
    out->interval = FG_INTERVAL_STEP;
    return FG_OK;
}

/* ------------------------------------------------------- checkpoints */

static FG_MUST_USE fg_status on_save_checkpoint(void *ud, fg_trainer *t, fg_state_dict *sd) {
    (void)t;
    fit_module *m = ud;
    TRY(fg_state_dict_set(sd, CKPT_META_CONFIG, m->config_json));
    return m->vocab_b64 ? fg_state_dict_set(sd, CKPT_META_VOCAB, m->vocab_b64) : FG_OK;
}

/* n bytes as text for a message: printable ASCII as is, others as \xNN,
 * cut at about 60 characters */
static void show_bytes(const uint8_t *b, size_t n, char *out, size_t cap) {
    size_t k = 0;
    for (size_t i = 0; i < n && k + 8 < cap; i++) {
        if (k > 60) {
            snprintf(out + k, cap - k, "...");
            return;
        }
        if (b[i] >= 0x20 && b[i] < 0x7f && b[i] != '"' && b[i] != '\\') out[k++] = (char)b[i];
        else k += (size_t)snprintf(out + k, cap - k, "\\x%02x", b[i]);
    }
    out[k] = '\0';
}

/* A text model's ids mean the characters of the vocabulary it was trained
 * with: a corpus whose vocabulary differs, even at the same size, would
 * train or evaluate on other characters without a word. */
static FG_MUST_USE fg_status check_vocab(const fit_module *m, const fg_state_dict *sd) {
    const char *saved = fg_state_dict_get(sd, CKPT_META_VOCAB);
    if (!m->vocab_b64 || !saved || !strcmp(saved, m->vocab_b64)) return FG_OK;
    uint8_t a[256], b[256];
    long na = b64_decode(saved, a, sizeof a), nb = b64_decode(m->vocab_b64, b, sizeof b);
    if (na < 0 || nb < 0)
        return fg_error(FG_EFORMAT,
                        "the checkpoint's vocabulary (metadata %s) is not valid base64 of at most "
                        "256 characters: the checkpoint is damaged",
                        CKPT_META_VOCAB);
    long at = 0;
    while (at < na && at < nb && a[at] == b[at]) at++;
    char sa[128], sb[128];
    show_bytes(a, (size_t)na, sa, sizeof sa);
    show_bytes(b, (size_t)nb, sb, sizeof sb);
    return fg_error(FG_EMISMATCH,
                    "the checkpoint's vocabulary (%ld characters: \"%s\") is not the one of %s "
                    "(%ld characters: \"%s\"; they differ from id %ld on): its ids would mean "
                    "other characters; use the corpus it was trained on (or one with the same "
                    "characters), or train anew",
                    na, sa, m->o->data, nb, sb, at);
}

static FG_MUST_USE fg_status on_load_checkpoint(void *ud, fg_trainer *t, const fg_state_dict *sd) {
    (void)t;
    fit_module *m = ud;
    TRY(check_vocab(m, sd));
    int64_t seed;
    if (fg_state_dict_get_i64(sd, "seed", &seed)) m->ckpt_seed = (uint64_t)seed;
    if (!fg_state_dict_get_i64(sd, "world_size", &m->ckpt_world)) m->ckpt_world = -1;
    if (!fg_state_dict_get_i64(sd, "global_batch", &m->ckpt_global_batch))
        m->ckpt_global_batch = -1;
    if (!fg_state_dict_get_i64(sd, "samples_in_epoch", &m->ckpt_samples)) m->ckpt_samples = -1;
    return FG_OK;
}

/* --------------------------------------------------------------- sample */

void fit_module_sample(fit_module *m) {
    if (m->cfg.kind != FIT_GPT || m->cfg.arch != FIT_ARCH_BASE || !m->o->sample_tokens) return;
    int64_t n = m->o->sample_tokens;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(n + 1));
    char *text = malloc((size_t)n + 2);
    if (!ids || !text) goto out;
    /* the prompt: a newline if the vocabulary has one, else its first character */
    int32_t start = 0;
    if (m->d.text_vocab && fg_text_vocab_id(m->d.text_vocab, '\n') >= 0)
        start = fg_text_vocab_id(m->d.text_vocab, '\n');
    fg_module_train(m->model, false);
    fg_sample_opts so = {.temperature = 0.8, .seed = (uint64_t)m->o->seed};
    if (fg_gpt_generate(m->model, &start, 1, n, &so, ids) != FG_OK) {
        cli_error("sample: %s", fg_last_error());
        goto out;
    }
    printf("sample (temperature 0.8, seed %lld):\n", (long long)m->o->seed);
    if (m->d.text_vocab && fg_text_vocab_decode(m->d.text_vocab, ids + 1, n, text) == FG_OK) {
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

/* Lightning's configure_model: the model, built at the first entry point
 * (under stage 3 the Trainer runs this under empty init: a sharded
 * initialisation, the model never whole on a rank), the same one after. */
static FG_MUST_USE fg_status sync_sum(void *ud, fg_tensor *t) {
    return fg_comm_allreduce(ud, fg_tensor_data(t), fg_tensor_data(t), fg_tensor_numel(t),
                             fg_tensor_dtype(t), FG_REDUCE_OP_SUM);
}

static fg_module *configure_model(void *ud, fg_trainer *t) {
    fit_module *m = ud;
    if (!m->model) m->model = fit_model_new(&m->cfg);
    m->model_failed = !m->model;
    /* --sync-batchnorm: the statistics go over a communicator of their own
     * (split once, collectively: every rank enters here at the same entry
     * point), so that they never interleave with the strategy's gradient
     * reductions on the job's */
    fg_comm *comm = fg_fabric_comm(fg_trainer_fabric(t));
    if (m->model && m->o->sync_batchnorm && comm && fg_comm_size(comm) > 1 && !m->sync_comm) {
        if (fg_comm_split(comm, 0, fg_comm_rank(comm), &m->sync_comm) != FG_OK) {
            m->model_failed = true;
            return NULL;
        }
        m->sync = (fg_stats_reduce){sync_sum, m->sync_comm};
        fg_module_convert_sync_batchnorm(m->model, &m->sync);
    }
    return m->model;
}

fg_lightning_module fit_module_table(fit_module *m) {
    return (fg_lightning_module){.ud = m,
                                 .configure_model = configure_model,
                                 .hparams = m->hparams,
                                 .nhparams = m->nhparams,
                                 .configure_optimizers = configure_optimizers,
                                 .training_step = training_step,
                                 .training_step_end = training_step_end,
                                 .on_train_epoch_start = on_train_epoch_start,
                                 .on_train_batch_start = on_train_batch_start,
                                 .on_before_optimizer_step = on_before_optimizer_step,
                                 .validation_step = validation_step,
                                 .test_step = test_step,
                                 .predict_step = predict_step,
                                 .on_validation_epoch_end = on_validation_epoch_end,
                                 .on_save_checkpoint = on_save_checkpoint,
                                 .on_load_checkpoint = on_load_checkpoint};
}
