/* fulgur fit's model, optimizer and learning-rate schedule, and the config
 * stored in every checkpoint's "config" metadata: a flat JSON object whose
 * model keys (model, vocab, ctx, layers, heads, embd, dropout; in_dim,
 * hidden, classes) let `fulgur sample` rebuild the same model, followed by
 * the run's options for the record. */
#include <stdlib.h>
#include <string.h>

#include "fit_model.h"

#ifdef FIT_HAVE_NN

fg_module *fit_model_new(const fit_model_cfg *c) {
    if (c->kind == FIT_GPT)
        return fg_gpt_new(&(fg_gpt_config){.vocab = c->vocab,
                                           .ctx = c->ctx,
                                           .layers = (int)c->layers,
                                           .heads = (int)c->heads,
                                           .embd = c->embd,
                                           .dropout = c->dropout,
                                           .seed = c->seed,
                                           .dtype = c->f64 ? FG_F64 : FG_F32});
    return fg_mlp_new(&(fg_mlp_config){.sizes = {c->in_dim, c->hidden, c->classes},
                                       .nlayers = 2,
                                       .seed = c->seed,
                                       .dtype = c->f64 ? FG_F64 : FG_F32});
}

#endif

#ifdef FIT_HAVE_OPTIM
fg_optimizer *fit_optimizer_new(const fit_opts *o, fg_module *m) {
    if (!strcmp(o->optimizer, "sgd"))
        return fg_sgd_new(m, &(fg_sgd_opts){.lr = o->lr,
                                            .momentum = o->momentum,
                                            .weight_decay = o->weight_decay});
    /* beta2 0.99 as nanoGPT's small character models; decay on matrices only */
    return fg_adamw_new(m, &(fg_adamw_opts){.lr = o->lr,
                                            .beta2 = 0.99,
                                            .weight_decay = o->weight_decay,
                                            .no_weight_decay = o->weight_decay == 0});
}

#endif

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

#ifdef FIT_HAVE_OPTIM
double fit_lr_at(const fit_opts *o, int64_t step) {
    int64_t end = o->lr_decay_steps ? o->lr_decay_steps : o->max_steps;
    fg_lr_schedule s = {.kind = end > o->warmup_steps ? FG_LR_COSINE : FG_LR_CONSTANT,
                        .lr = o->lr,
                        .min_lr = o->lr * o->min_lr_ratio,
                        .warmup_steps = o->warmup_steps,
                        .decay_steps = end};
    return fg_lr_at(&s, step);
}
#endif

char *fit_model_cfg_json(const fit_model_cfg *c, const fit_opts *o) {
    char *run = o ? fit_opts_json(o) : NULL;
    size_t cap = 512 + (run ? strlen(run) : 0);
    char *buf = malloc(cap);
    if (!buf) {
        free(run);
        return NULL;
    }
    int n;
    if (c->kind == FIT_GPT)
        n = snprintf(buf, cap,
                     "{\"model\":\"gpt\",\"vocab\":%lld,\"ctx\":%lld,\"layers\":%lld,"
                     "\"heads\":%lld,\"embd\":%lld,\"dropout\":%.17g,\"init_seed\":%llu",
                     (long long)c->vocab, (long long)c->ctx, (long long)c->layers,
                     (long long)c->heads, (long long)c->embd, c->dropout,
                     (unsigned long long)c->seed);
    else
        n = snprintf(buf, cap,
                     "{\"model\":\"mlp\",\"in_dim\":%lld,\"hidden\":%lld,\"classes\":%lld,"
                     "\"init_seed\":%llu",
                     (long long)c->in_dim, (long long)c->hidden, (long long)c->classes,
                     (unsigned long long)c->seed);
    /* the run's options follow, for the record (their object's braces dropped) */
    if (run && strlen(run) > 2) snprintf(buf + n, cap - (size_t)n, ",%s", run + 1);
    else snprintf(buf + n, cap - (size_t)n, "}");
    free(run);
    return buf;
}

bool fit_model_cfg_parse(const char *json, fit_model_cfg *c, char *err, size_t errcap) {
    memset(c, 0, sizeof *c);
    char model[16];
    double v;
    if (!json_get_str(json, "model", model, sizeof model)) {
        snprintf(err, errcap, "no \"model\" in the checkpoint's config metadata");
        return false;
    }
    c->kind = !strcmp(model, "mlp") ? FIT_MLP : FIT_GPT;
    if (strcmp(model, "gpt") && strcmp(model, "mlp")) {
        snprintf(err, errcap, "config names model \"%s\": expected gpt or mlp", model);
        return false;
    }
    static const char *const gpt_keys[] = {"vocab", "ctx", "layers", "heads", "embd"};
    static const char *const mlp_keys[] = {"in_dim", "hidden", "classes"};
    int64_t *gpt_dst[] = {&c->vocab, &c->ctx, &c->layers, &c->heads, &c->embd};
    int64_t *mlp_dst[] = {&c->in_dim, &c->hidden, &c->classes};
    const char *const *keys = c->kind == FIT_GPT ? gpt_keys : mlp_keys;
    int64_t **dst = c->kind == FIT_GPT ? gpt_dst : mlp_dst;
    int nk = c->kind == FIT_GPT ? 5 : 3;
    for (int i = 0; i < nk; i++) {
        if (!json_get_num(json, keys[i], &v) || v < 1 || v > 1e9) {
            snprintf(err, errcap, "config lacks a valid \"%s\"", keys[i]);
            return false;
        }
        *dst[i] = (int64_t)v;
    }
    if (json_get_num(json, "dropout", &v)) c->dropout = v;
    if (json_get_num(json, "init_seed", &v)) c->seed = (uint64_t)v;
    return true;
}
