/* fulgur fit's model, optimizer and learning-rate schedule, and the config
 * stored in every checkpoint's "config" metadata: a flat JSON object, made
 * and read with jansson, whose model keys (model, vocab, ctx, layers, heads,
 * embd, dropout; in_dim, hidden, classes; init_seed) let `fulgur sample`
 * rebuild the same model, followed by the run's options for the record. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fit_model.h"

fg_module *fit_model_new(const fit_model_cfg *c) {
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
    return fg_mlp_new(&(fg_mlp_config){.sizes = {c->in_dim, c->hidden, c->classes},
                                       .nlayers = 2,
                                       .seed = c->seed,
                                       .dtype = c->dtype ? c->dtype
                                                : c->f64 ? FG_F64
                                                         : FG_F32});
}

fg_optimizer *fit_optimizer_new(const fit_opts *o, fg_module *m) {
    if (!strcmp(o->optimizer, "sgd"))
        return fg_sgd_new(
            m,
            &(fg_sgd_opts){.lr = o->lr, .momentum = o->momentum, .weight_decay = o->weight_decay});
    /* beta2 0.99 as nanoGPT's small character models; decay on matrices only */
    return fg_adamw_new(m, &(fg_adamw_opts){.lr = o->lr,
                                            .beta2 = 0.99,
                                            .weight_decay = o->weight_decay,
                                            .no_weight_decay = o->weight_decay == 0});
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
    if (ok && c->kind == FIT_GPT)
        ok = put(j, "model", json_string("gpt")) && put(j, "vocab", json_integer(c->vocab)) &&
             put(j, "ctx", json_integer(c->ctx)) && put(j, "layers", json_integer(c->layers)) &&
             put(j, "heads", json_integer(c->heads)) && put(j, "embd", json_integer(c->embd)) &&
             put(j, "dropout", json_real(c->dropout));
    else if (ok)
        ok = put(j, "model", json_string("mlp")) && put(j, "in_dim", json_integer(c->in_dim)) &&
             put(j, "hidden", json_integer(c->hidden)) &&
             put(j, "classes", json_integer(c->classes));
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
    if (strcmp(model, "gpt") && strcmp(model, "mlp")) {
        snprintf(err, errcap, "config names model \"%.40s\": expected gpt or mlp", model);
        goto out;
    }
    c->kind = !strcmp(model, "mlp") ? FIT_MLP : FIT_GPT;
    static const char *const gpt_keys[] = {"vocab", "ctx", "layers", "heads", "embd"};
    static const char *const mlp_keys[] = {"in_dim", "hidden", "classes"};
    int64_t *gpt_dst[] = {&c->vocab, &c->ctx, &c->layers, &c->heads, &c->embd};
    int64_t *mlp_dst[] = {&c->in_dim, &c->hidden, &c->classes};
    const char *const *keys = c->kind == FIT_GPT ? gpt_keys : mlp_keys;
    int64_t **dst = c->kind == FIT_GPT ? gpt_dst : mlp_dst;
    int nk = c->kind == FIT_GPT ? 5 : 3;
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
    json_t *v = json_object_get(j, "dropout");
    if (json_is_number(v)) c->dropout = json_number_value(v);
    v = json_object_get(j, "init_seed");
    if (json_is_integer(v)) c->seed = (uint64_t)json_integer_value(v);
    else if (json_is_number(v)) c->seed = (uint64_t)json_number_value(v);
    ok = true;
out:
    json_decref(j);
    return ok;
}
