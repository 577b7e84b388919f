/* The model side of fulgur fit and sample: the shape of a built-in model,
 * its JSON form in checkpoints, constructors, the lr schedule and text
 * generation. */
#ifndef FULGUR_FIT_MODEL_H
#define FULGUR_FIT_MODEL_H

#include "ckpt_meta.h"
#include "fit.h"

typedef struct fit_model_cfg {
    fit_model_kind kind;
    int64_t vocab, ctx, layers, heads, embd; /* gpt */
    double dropout;
    int64_t in_dim, hidden, classes; /* mlp */
    fit_arch arch;                   /* resnet, lstm: the network of the kind */
    int64_t depth, width, channels;  /* resnet (vit: channels) */
    int64_t patch, image;            /* vit (and layers, heads, embd, hidden) */
    bool imagenet;                   /* resnet: the imagenet layout */
    uint64_t seed;                   /* initialisation seed */
    bool f64;                        /* parameters in f64 (--precision 64-true) */
    char net[4096];                  /* --model sequential: the layers (else "") */
    fg_dtype dtype;                  /* the parameters' dtype when set (bf16-true: bf16) */
} fit_model_cfg;

void fit_model_cfg_from_opts(const fit_opts *o, const fit_data *d, fit_model_cfg *c);
/* The "config" metadata: a compact JSON object of the model keys, then o's
 * options (o may be NULL), made with jansson. malloc'ed; NULL when out of
 * memory. */
char *fit_model_cfg_json(const fit_model_cfg *c, const fit_opts *o);
/* Reads the model keys back from such an object (any valid JSON: one of an
 * older fulgur too); false with a reason in err. */
bool fit_model_cfg_parse(const char *json, fit_model_cfg *c, char *err, size_t errcap);

/* The built-in model c describes; NULL with fg_last_error on failure. */
fg_module *fit_model_new(const fit_model_cfg *c);

/* The learning rate of optimizer step `step` (0-based), fg_lr_at's: linear
 * warm-up over --warmup-steps, then a cosine from --lr down to --lr x
 * --min-lr-ratio at --lr-decay-steps (or --max-steps), flat after. A pure
 * function of the step, so a resumed run continues the same curve. */
double fit_lr_at(const fit_opts *o, int64_t step);
fg_optimizer *fit_optimizer_new(const fit_opts *o, fg_module *m);
/* --lr-scheduler other than warmup-cosine and constant: the PyTorch
 * scheduler on opt into out (scheduler, interval, monitor), Lightning's
 * lr_scheduler_config; FG_OK and nothing for those two. */
FG_MUST_USE fg_status fit_scheduler_new(const fit_opts *o, fg_optimizer *opt,
                                        fg_optimizer_config *out);

#endif
