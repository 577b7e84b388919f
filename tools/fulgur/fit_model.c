/* fulgur fit's model, optimizer and learning-rate schedule, and the config
 * stored in every checkpoint's "config" metadata: a flat JSON object, made
 * and read with jansson, whose model keys (model, vocab, ctx, layers, heads,
 * embd, dropout; in_dim, hidden, classes; init_seed) let `fulgur sample`
 * rebuild the same model, followed by the run's options for the record. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fit_model.h"
#include "fit_net.h"

fg_module *fit_model_new(const fit_model_cfg *c) {
    fg_dtype dt = c->dtype ? c->dtype : c->f64 ? FG_F64 : FG_F32;
    if (c->arch == FIT_ARCH_RESNET)
        return fg_resnet_new(
            &(fg_resnet_config){.layout = c->imagenet ? FG_RESNET_IMAGENET : FG_RESNET_CIFAR,
                                .depth = (int)c->depth,
                                .in_channels = c->channels,
                                .num_classes = c->classes,
                                .width = c->width,
                                .seed = c->seed,
                                .dtype = dt});
    if (c->arch == FIT_ARCH_VIT)
        return fg_vit_new(&(fg_vit_config){.image_size = c->image,
                                           .patch_size = c->patch,
                                           .in_channels = c->channels,
                                           .num_layers = c->layers,
                                           .num_heads = c->heads,
                                           .hidden_dim = c->embd,
                                           .mlp_dim = c->hidden,
                                           .num_classes = c->classes,
                                           .dropout = c->dropout,
                                           .seed = c->seed,
                                           .dtype = dt});
    if (c->arch == FIT_ARCH_LSTM)
        return fg_lstm_lm_new(&(fg_lstm_lm_config){.vocab = c->vocab,
                                                   .embd = c->embd,
                                                   .hidden = c->hidden,
                                                   .layers = c->layers,
                                                   .seed = c->seed,
                                                   .dtype = dt});
    if (c->kind == FIT_GPT)
        return fg_gpt_new(&(fg_gpt_config){.vocab = c->vocab,
                                           .ctx = c->ctx,
                                           .layers = (int)c->layers,
                                           .heads = (int)c->heads,
                                           .embd = c->embd,
                                           .dropout = c->dropout,
                                           .seed = c->seed,
                                           .dtype = c->dtype ? c->dtype
                                                    : c->f64 ? FG_F64
                                                             : FG_F32});
    if (c->net[0])
        return fit_net_build(c->net, c->dtype ? c->dtype : c->f64 ? FG_F64 : FG_F32, c->seed);
    return fg_mlp_new(&(fg_mlp_config){.sizes = {c->in_dim, c->hidden, c->classes},
                                       .nlayers = 2,
                                       .seed = c->seed,
                                       .dtype = c->dtype ? c->dtype
                                                : c->f64 ? FG_F64
                                                         : FG_F32});
}

static fg_optimizer *optimizer_of(const fit_opts *o, fg_module *m) {
    const char *k = o->optimizer;
    double wd = o->weight_decay;
    if (!strcmp(k, "sgd"))
        return fg_sgd_new(m, &(fg_sgd_opts){.lr = o->lr,
                                            .momentum = o->momentum,
                                            .nesterov = o->nesterov,
                                            .weight_decay = wd});
    if (!strcmp(k, "adam"))
        return fg_adam_new(m, &(fg_adam_opts){.lr = o->lr,
                                              .beta1 = o->beta1,
                                              .beta2 = o->beta2,
                                              .eps = o->eps,
                                              .weight_decay = wd,
                                              .amsgrad = o->amsgrad});
    if (!strcmp(k, "rmsprop"))
        return fg_rmsprop_new(m, &(fg_rmsprop_opts){.lr = o->lr,
                                                    .alpha = o->alpha,
                                                    .eps = o->eps,
                                                    .weight_decay = wd,
                                                    .momentum = o->momentum,
                                                    .centered = o->centered});
    if (!strcmp(k, "adagrad"))
        return fg_adagrad_new(m,
                              &(fg_adagrad_opts){.lr = o->lr, .weight_decay = wd, .eps = o->eps});
    if (!strcmp(k, "lion"))
        return fg_lion_new(
            m,
            &(fg_lion_opts){.lr = o->lr, .beta1 = o->beta1, .beta2 = o->beta2, .weight_decay = wd});
    /* beta2 0.99 as nanoGPT's small character models; decay on matrices only
     * (every parameter but biases, norms and embeddings with
     * --no-decay-norm-bias) */
    return fg_adamw_new(m, &(fg_adamw_opts){.lr = o->lr,
                                            .beta1 = o->beta1,
                                            .beta2 = o->beta2 ? o->beta2 : 0.99,
                                            .eps = o->eps,
                                            .weight_decay = wd,
                                            .no_weight_decay = wd == 0,
                                            .decay_all = o->no_decay_norm_bias});
}

fg_optimizer *fit_optimizer_new(const fit_opts *o, fg_module *m) {
    fg_optimizer *opt = optimizer_of(o, m);
    if (opt && o->no_decay_norm_bias &&
        fg_optimizer_no_decay_bias_norm_embedding(opt, NULL) != FG_OK) {
        fg_optimizer_free(opt);
        return NULL;
    }
    return opt;
}

fg_status fit_scheduler_new(const fit_opts *o, fg_optimizer *opt, fg_optimizer_config *out) {
    const char *k = o->lr_scheduler;
    if (!strcmp(k, "warmup-cosine") || !strcmp(k, "constant")) return FG_OK;
    bool step = !strcmp(o->lr_interval, "step");
    int64_t span = step ? o->max_steps : o->max_epochs;
    fg_lr_scheduler *s = NULL;
    if (span <= 0) span = 1;
    if (!strcmp(k, "steplr")) s = fg_step_lr_new(opt, o->step_size, o->gamma);
    else if (!strcmp(k, "multisteplr"))
        s = fg_multistep_lr_new(opt, o->milestones, o->nmilestones, o->gamma);
    else if (!strcmp(k, "exponentiallr")) s = fg_exponential_lr_new(opt, o->gamma);
    else if (!strcmp(k, "cosineannealinglr"))
        s = fg_cosine_annealing_lr_new(opt, o->t_max ? o->t_max : span, o->eta_min);
    else if (!strcmp(k, "cosineannealingwarmrestarts"))
        s = fg_cosine_warm_restarts_new(opt, o->t_0 ? o->t_0 : span, o->t_mult, o->eta_min);
    else if (!strcmp(k, "onecyclelr"))
        s = fg_one_cycle_lr_new(opt, &(fg_one_cycle_opts){.max_lr = o->max_lr ? o->max_lr : o->lr,
                                                          .total_steps = span,
                                                          .pct_start = o->pct_start});
    else if (!strcmp(k, "linearlr"))
        s = fg_linear_lr_new(opt, &(fg_linear_lr_opts){.start_factor = o->start_factor,
                                                       .total_iters = o->total_iters});
    else if (!strcmp(k, "sequentiallr") || !strcmp(k, "chainedscheduler")) {
        /* made in order on the one optimizer, as PyTorch's code makes them */
        fg_lr_scheduler *subs[16];
        int n = 0;
        for (int i = 0; i < o->nlr_subs && i < 16; i++) {
            fg_optimizer_config sc = {0};
            fg_status st = fit_scheduler_new(&o->lr_subs[i], opt, &sc);
            if (st != FG_OK) {
                for (int j = 0; j < n; j++) fg_lr_scheduler_free(subs[j]);
                return fg_error_wrap(st, "--lr-schedulers: scheduler %d (%s)", i,
                                     o->lr_subs[i].lr_scheduler);
            }
            subs[n++] = sc.scheduler;
        }
        s = k[0] == 's' ? fg_sequential_lr_new(opt, subs, n, o->milestones)
                        : fg_chained_scheduler_new(subs, n);
    } else if (!strcmp(k, "reducelronplateau")) {
        s = fg_reduce_lr_on_plateau_new(
            opt, &(fg_plateau_opts){.mode_max = !strcmp(o->lr_mode, "max"),
                                    .factor = o->factor,
                                    .patience = o->patience,
                                    .patience_zero = o->patience == 0,
                                    .threshold = o->threshold,
                                    .threshold_zero = o->threshold == 0,
                                    .threshold_abs = !strcmp(o->threshold_mode, "abs"),
                                    .cooldown = o->cooldown,
                                    .min_lr = o->min_lr});
        out->monitor = o->lr_monitor;
    }
    if (!s) return fg_last_status() ? fg_last_status() : FG_EINVAL;
    out->scheduler = s;
    out->interval = step ? FG_INTERVAL_STEP : FG_INTERVAL_EPOCH;
    out->frequency = o->lr_frequency;
    return FG_OK;
}

void fit_model_cfg_from_opts(const fit_opts *o, const fit_data *d, fit_model_cfg *c) {
    memset(c, 0, sizeof *c);
    c->kind = o->kind;
    c->vocab = d->vocab;
    c->ctx = o->ctx;
    c->layers = o->layers;
    c->heads = o->heads;
    c->embd = o->embd;
    c->dropout = o->dropout;
    c->in_dim = d->in_dim;
    c->hidden = o->hidden;
    c->classes = d->classes;
    c->seed = (uint64_t)o->seed;
    c->arch = o->arch;
    if (o->arch == FIT_ARCH_RESNET || o->arch == FIT_ARCH_VIT) {
        const fg_sample_spec *x = d->base ? fg_dataset_x_spec(d->base) : NULL;
        c->patch = o->patch_size;
        c->depth = o->depth;
        c->width = o->width;
        c->imagenet = o->resnet_layout && !strcmp(o->resnet_layout, "imagenet");
        c->channels = o->in_channels ? o->in_channels : x && x->ndim == 3 ? x->shape[0] : 1;
        c->image = (int64_t)llround(sqrt((double)(d->in_dim / c->channels)));
    }
    if (o->net) snprintf(c->net, sizeof c->net, "%s", o->net);
}

double fit_lr_at(const fit_opts *o, int64_t step) {
    int64_t end = o->lr_decay_steps ? o->lr_decay_steps : o->max_steps;
    fg_lr_schedule s = {.kind = end > o->warmup_steps ? FG_LR_COSINE : FG_LR_CONSTANT,
                        .lr = o->lr,
                        .min_lr = o->lr * o->min_lr_ratio,
                        .warmup_steps = o->warmup_steps,
                        .decay_steps = end};
    return fg_lr_at(&s, step);
}

/* Sets o[k] = v, taking v (json_object_set_new drops it on failure too);
 * false when out of memory, or when v could not be made (NULL). */
static bool put(json_t *o, const char *k, json_t *v) {
    return v && json_object_set_new(o, k, v) == 0;
}

/* A string value; a path that is not UTF-8 (JSON strings must be) is
 * stored with every non-ASCII byte as U+FFFD, for the record only. */
static json_t *str(const char *s) {
    json_t *j = json_string(s ? s : "");
    if (j || !s) return j;
    char *fixed = malloc(3 * strlen(s) + 1), *p = fixed;
    if (!fixed) return NULL;
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c < 0x80) {
            *p++ = (char)*c;
        } else {
            memcpy(p, "\xef\xbf\xbd", 3);
            p += 3;
        }
    }
    *p = '\0';
    j = json_string(fixed);
    free(fixed);
    return j;
}

/* The run's options, for the record (Lightning's names where it has them). */
static bool put_run(json_t *j, const fit_opts *o) {
    return put(j, "data", str(o->data)) && put(j, "batch_size", json_integer(o->batch_size)) &&
           put(j, "accumulate_grad_batches", json_integer(o->accumulate)) &&
           put(j, "lr", json_real(o->lr)) &&
           put(j, "warmup_steps", json_integer(o->warmup_steps)) &&
           put(j, "lr_decay_steps", json_integer(o->lr_decay_steps)) &&
           put(j, "min_lr_ratio", json_real(o->min_lr_ratio)) &&
           put(j, "weight_decay", json_real(o->weight_decay)) &&
           put(j, "optimizer", str(o->optimizer)) && put(j, "momentum", json_real(o->momentum)) &&
           put(j, "gradient_clip_val", json_real(o->clip)) &&
           put(j, "seed", json_integer(o->seed)) &&
           put(j, "max_steps", json_integer(o->max_steps)) &&
           put(j, "max_epochs", json_integer(o->max_epochs)) &&
           put(j, "devices", str(o->devices)) && put(j, "strategy", str(o->strategy));
}

char *fit_model_cfg_json(const fit_model_cfg *c, const fit_opts *o) {
    json_t *j = json_object();
    bool ok = j != NULL;
    if (ok && c->arch == FIT_ARCH_RESNET)
        ok = put(j, "model", json_string("resnet")) && put(j, "in_dim", json_integer(c->in_dim)) &&
             put(j, "classes", json_integer(c->classes)) &&
             put(j, "depth", json_integer(c->depth)) && put(j, "width", json_integer(c->width)) &&
             put(j, "channels", json_integer(c->channels)) &&
             put(j, "layout", json_string(c->imagenet ? "imagenet" : "cifar"));
    else if (ok && c->arch == FIT_ARCH_VIT)
        ok = put(j, "model", json_string("vit")) && put(j, "in_dim", json_integer(c->in_dim)) &&
             put(j, "classes", json_integer(c->classes)) &&
             put(j, "channels", json_integer(c->channels)) &&
             put(j, "image", json_integer(c->image)) && put(j, "patch", json_integer(c->patch)) &&
             put(j, "layers", json_integer(c->layers)) && put(j, "heads", json_integer(c->heads)) &&
             put(j, "embd", json_integer(c->embd)) && put(j, "hidden", json_integer(c->hidden));
    else if (ok && c->arch == FIT_ARCH_LSTM)
        ok = put(j, "model", json_string("lstm")) && put(j, "vocab", json_integer(c->vocab)) &&
             put(j, "ctx", json_integer(c->ctx)) && put(j, "layers", json_integer(c->layers)) &&
             put(j, "embd", json_integer(c->embd)) && put(j, "hidden", json_integer(c->hidden));
    else if (ok && c->kind == FIT_GPT)
        ok = put(j, "model", json_string("gpt")) && put(j, "vocab", json_integer(c->vocab)) &&
             put(j, "ctx", json_integer(c->ctx)) && put(j, "layers", json_integer(c->layers)) &&
             put(j, "heads", json_integer(c->heads)) && put(j, "embd", json_integer(c->embd)) &&
             put(j, "dropout", json_real(c->dropout));
    else if (ok)
        ok = put(j, "model", json_string(c->net[0] ? "sequential" : "mlp")) &&
             put(j, "in_dim", json_integer(c->in_dim)) &&
             put(j, "hidden", json_integer(c->hidden)) &&
             put(j, "classes", json_integer(c->classes)) &&
             (!c->net[0] || put(j, "net", json_string(c->net)));
    /* a seed above INT64_MAX goes in as its two's complement; read back alike */
    ok = ok && put(j, "init_seed", json_integer((json_int_t)c->seed));
    if (ok && o) ok = put_run(j, o);
    char *out = NULL;
    size_t flags = JSON_COMPACT | JSON_PRESERVE_ORDER, n = ok ? json_dumpb(j, NULL, 0, flags) : 0;
    /* json_dumpb into our own buffer: the caller frees it with free(),
     * whichever allocator jansson was given */
    if (n && (out = malloc(n + 1)) != NULL) {
        json_dumpb(j, out, n, flags);
        out[n] = '\0';
    }
    json_decref(j);
    return out;
}

bool fit_model_cfg_parse(const char *text, fit_model_cfg *c, char *err, size_t errcap) {
    memset(c, 0, sizeof *c);
    json_error_t je;
    json_t *j = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    bool ok = false;
    if (!j || !json_is_object(j)) {
        snprintf(err, errcap, "the \"%s\" metadata is not a JSON object (%s)", CKPT_META_CONFIG,
                 j ? "another JSON value" : je.text);
        goto out;
    }
    const char *model = json_string_value(json_object_get(j, "model"));
    if (!model) {
        snprintf(err, errcap, "no \"model\" in the checkpoint's config metadata");
        goto out;
    }
    if (strcmp(model, "gpt") && strcmp(model, "mlp") && strcmp(model, "resnet") &&
        strcmp(model, "lstm") && strcmp(model, "vit") && strcmp(model, "sequential")) {
        snprintf(err, errcap,
                 "config names model \"%.40s\": expected gpt, mlp, resnet, vit, lstm or "
                 "sequential",
                 model);
        goto out;
    }
    c->arch = !strcmp(model, "resnet") ? FIT_ARCH_RESNET
              : !strcmp(model, "lstm") ? FIT_ARCH_LSTM
              : !strcmp(model, "vit")  ? FIT_ARCH_VIT
                                       : FIT_ARCH_BASE;
    c->kind = !strcmp(model, "mlp") || !strcmp(model, "sequential") || c->arch == FIT_ARCH_RESNET ||
                      c->arch == FIT_ARCH_VIT
                  ? FIT_MLP
                  : FIT_GPT;
    if (!strcmp(model, "sequential")) {
        const char *net = json_string_value(json_object_get(j, "net"));
        char why[400];
        if (!net || !fit_net_check(net, why, sizeof why)) {
            snprintf(err, errcap, "config of a sequential model: %s",
                     net ? why : "no \"net\" (its layers)");
            goto out;
        }
        snprintf(c->net, sizeof c->net, "%s", net);
    }
    static const char *const gpt_keys[] = {"vocab", "ctx", "layers", "heads", "embd"};
    static const char *const mlp_keys[] = {"in_dim", "hidden", "classes"};
    static const char *const resnet_keys[] = {"in_dim", "classes", "depth", "channels"};
    static const char *const lstm_keys[] = {"vocab", "ctx", "layers", "embd", "hidden"};
    static const char *const vit_keys[] = {"in_dim", "classes", "channels", "image", "patch",
                                           "layers", "heads",   "embd",     "hidden"};
    int64_t *gpt_dst[] = {&c->vocab, &c->ctx, &c->layers, &c->heads, &c->embd};
    int64_t *mlp_dst[] = {&c->in_dim, &c->hidden, &c->classes};
    int64_t *resnet_dst[] = {&c->in_dim, &c->classes, &c->depth, &c->channels};
    int64_t *lstm_dst[] = {&c->vocab, &c->ctx, &c->layers, &c->embd, &c->hidden};
    int64_t *vit_dst[] = {&c->in_dim, &c->classes, &c->channels, &c->image, &c->patch,
                          &c->layers, &c->heads,   &c->embd,     &c->hidden};
    const char *const *keys = c->arch == FIT_ARCH_VIT      ? vit_keys
                              : c->arch == FIT_ARCH_RESNET ? resnet_keys
                              : c->arch == FIT_ARCH_LSTM   ? lstm_keys
                              : c->kind == FIT_GPT         ? gpt_keys
                                                           : mlp_keys;
    int64_t **dst = c->arch == FIT_ARCH_VIT      ? vit_dst
                    : c->arch == FIT_ARCH_RESNET ? resnet_dst
                    : c->arch == FIT_ARCH_LSTM   ? lstm_dst
                    : c->kind == FIT_GPT         ? gpt_dst
                                                 : mlp_dst;
    int nk = c->arch == FIT_ARCH_VIT      ? 9
             : c->arch == FIT_ARCH_RESNET ? 4
             : c->kind == FIT_GPT         ? 5
                                          : 3;
    for (int i = 0; i < nk; i++) {
        /* json_number_value: integers, and reals such as 65.0 from other writers */
        json_t *v = json_object_get(j, keys[i]);
        double d = json_number_value(v);
        if (!json_is_number(v) || !(d >= 1 && d <= 1e9) || d != (double)(int64_t)d) {
            snprintf(err, errcap, "config lacks a valid \"%s\" (a whole number in 1..1e9)",
                     keys[i]);
            goto out;
        }
        *dst[i] = (int64_t)d;
    }
    json_t *v = json_object_get(j, "width");
    if (json_is_integer(v)) c->width = json_integer_value(v);
    const char *layout = json_string_value(json_object_get(j, "layout"));
    c->imagenet = layout && !strcmp(layout, "imagenet");
    v = json_object_get(j, "dropout");
    if (json_is_number(v)) c->dropout = json_number_value(v);
    v = json_object_get(j, "init_seed");
    if (json_is_integer(v)) c->seed = (uint64_t)json_integer_value(v);
    else if (json_is_number(v)) c->seed = (uint64_t)json_number_value(v);
    ok = true;
out:
    json_decref(j);
    return ok;
}
