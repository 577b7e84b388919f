/* fulgur sample: text from a GPT checkpoint written by `fulgur fit`. The
 * model is rebuilt from the checkpoint's "config" metadata (JSON, read with
 * jansson), its weights read by their dotted names (fg_st_read, so any float
 * dtype in the file works), and the character vocabulary from "vocab_b64".
 * With --accelerator guarded the model is moved to a guarded device after
 * the load and generates there (each prompt in, each row of logits out),
 * ending with the device's leak check.
 * Exit codes: 0, 1 (a checkpoint that is damaged, not a gpt, does not fit,
 * or holds non-finite weights), 2 (bad usage). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_paths.h"
#include "cli_flags.h"
#include "fit_model.h"

/* Copies every parameter of m from f by name; a missing or misshapen one is
 * an error naming it. */
static bool load_weights(fg_module *m, const fg_st_file *f, const char *path) {
    for (int64_t i = 0; i < fg_module_num_params(m); i++) {
        fg_tensor *p = fg_module_param(m, i);
        const char *name = fg_module_param_name(m, i);
        int64_t k = fg_st_find(f, name);
        if (k < 0) {
            cli_error("%s: no tensor \"%s\" (is it a gpt checkpoint from fulgur fit?)", path, name);
            return false;
        }
        fg_st_info in;
        fg_st_info_at(f, k, &in);
        bool same = in.ndim == fg_tensor_ndim(p);
        for (int d = 0; same && d < in.ndim; d++) same = in.shape[d] == fg_tensor_shape(p)[d];
        char want[96];
        if (!same) {
            cli_error("%s: tensor \"%s\" has another shape than its config gives (%s)", path, name,
                      fg_tensor_describe(p, want, sizeof want));
            return false;
        }
        if (fg_st_read(f, k, fg_tensor_data(p), fg_tensor_dtype(p), fg_tensor_numel(p)) != FG_OK) {
            cli_error("%s", fg_last_error());
            return false;
        }
        /* weights a non-finite run saved sample nothing but noise */
        double *x = malloc(sizeof(double) * (size_t)(in.numel ? in.numel : 1));
        bool finite = x && fg_st_read(f, k, x, FG_F64, in.numel) == FG_OK;
        for (int64_t j = 0; finite && j < in.numel; j++) finite = isfinite(x[j]);
        free(x);
        if (!finite) {
            cli_error("%s: tensor \"%s\" holds non-finite weights (NaN or inf): nothing can be "
                      "sampled from this checkpoint; sample from one saved before the run went "
                      "non-finite",
                      path, name);
            return false;
        }
    }
    return true;
}

typedef struct sample_opts {
    const char *ckpt;
    const char *accelerator;
    const char *prompt;
    int64_t tokens;
    int64_t seed;
    double temperature;
} sample_opts;

static const cli_flag_def k_sample_flags[] = {
    {.name = "ckpt",
     .type = CLI_STR,
     .off = offsetof(sample_opts, ckpt),
     .help = "checkpoint file, or a folder (its last.safetensors) (required)"},
    {.name = "prompt",
     .type = CLI_STR,
     .off = offsetof(sample_opts, prompt),
     .def = "\\n",
     .help = "text to continue (\\n is a newline)"},
    {.name = "tokens",
     .type = CLI_INT,
     .off = offsetof(sample_opts, tokens),
     .def = "500",
     .min = 1,
     .max = 1 << 24,
     .help = "characters to generate"},
    {.name = "temperature",
     .type = CLI_DOUBLE,
     .off = offsetof(sample_opts, temperature),
     .def = "0.8",
     .help = "softmax temperature (0: always the likeliest)"},
    {.name = "seed",
     .type = CLI_INT,
     .off = offsetof(sample_opts, seed),
     .def = "1",
     .min = 0,
     .max = INT64_MAX,
     .help = "seed of the draws (the same seed gives the same text)"},
    {.name = "accelerator",
     .type = CLI_STR,
     .off = offsetof(sample_opts, accelerator),
     .def = "cpu",
     .help = "cpu, or guarded (the test device: docs/devices.md)"},
};

int cmd_sample(int argc, char **argv) {
    sample_opts o = {0};
    cli_flag flags[CLI_COUNT(k_sample_flags)];
    cli_flags_bind(k_sample_flags, CLI_COUNT(k_sample_flags), &o, flags);
    int nf = CLI_COUNT(k_sample_flags);
    int rc = cli_flags_parse(flags, nf, argc, argv,
                             "fulgur sample --ckpt FILE [--prompt S --tokens N --temperature T "
                             "--seed S --accelerator cpu|guarded]",
                             NULL, 0, NULL);
    if (rc) return rc < 0 ? FG_EXIT_OK : rc;
    if (!o.ckpt) {
        cli_error("--ckpt is required: a checkpoint written by fulgur fit");
        return FG_EXIT_USAGE;
    }
    if (o.temperature < 0) {
        cli_error("--temperature=%g: expected a number >= 0", o.temperature);
        return FG_EXIT_USAGE;
    }
    bool guarded = !strcmp(o.accelerator, "guarded");
    if (!guarded && strcmp(o.accelerator, "cpu") != 0) {
        cli_error("--accelerator=%s: sample runs on cpu or guarded (a GPU comes with the CUDA "
                  "backend)",
                  o.accelerator);
        return FG_EXIT_USAGE;
    }
    char path[4096];
    if (ckpt_resolve(o.ckpt, NULL, path, sizeof path) != 0) return FG_EXIT_USAGE;

    /* the prompt, with \n and \t escapes */
    size_t plen = strlen(o.prompt);
    char *ptext = malloc(plen + 1);
    size_t np = 0;
    for (size_t i = 0; i < plen; i++) {
        if (o.prompt[i] == '\\' && i + 1 < plen &&
            (o.prompt[i + 1] == 'n' || o.prompt[i + 1] == 't')) {
            ptext[np++] = o.prompt[++i] == 'n' ? '\n' : '\t';
        } else {
            ptext[np++] = o.prompt[i];
        }
    }
    rc = FG_EXIT_FAIL;
    fg_st_file *f = NULL;
    fg_module *m = NULL;
    fg_text_vocab *v = NULL;
    fg_dev *dev = NULL;
    int32_t *ids = NULL, *pids = NULL;
    char *text = NULL;
    if (!(f = fg_st_open(path))) {
        cli_error("%s", fg_last_error());
        goto out;
    }
    const char *cfg_json = fg_st_meta_get(f, CKPT_META_CONFIG);
    const char *vocab_b64 = fg_st_meta_get(f, CKPT_META_VOCAB);
    fit_model_cfg cfg;
    char err[256];
    if (!cfg_json || !fit_model_cfg_parse(cfg_json, &cfg, err, sizeof err)) {
        cli_error("%s: %s", path,
                  cfg_json ? err : "no \"config\" metadata: not written by fulgur fit");
        goto out;
    }
    if (cfg.kind != FIT_GPT) {
        cli_error("%s: an mlp checkpoint; sample needs a gpt", path);
        goto out;
    }
    uint8_t bytes[256];
    long nb = vocab_b64 ? b64_decode(vocab_b64, bytes, sizeof bytes) : -1;
    if (nb <= 0 || nb != cfg.vocab) {
        cli_error("%s: no text vocabulary of %lld characters in the metadata (trained on a token "
                  "file? sample decodes characters only)",
                  path, (long long)cfg.vocab);
        goto out;
    }
    v = fg_text_vocab_new(bytes, (int)nb);
    cfg.dropout = 0;
    m = v ? fit_model_new(&cfg) : NULL;
    if (!m) {
        cli_error("%s", fg_last_error());
        goto out;
    }
    if (!load_weights(m, f, path)) goto out;
    fg_module_train(m, false);
    if (guarded &&
        (!(dev = fg_dev_open("guarded:0", NULL)) || fg_module_to_device(m, dev) != FG_OK)) {
        cli_error("--accelerator guarded: %s", fg_last_error());
        goto out;
    }
    if (np == 0) {
        cli_error("--prompt is empty: give at least one character");
        rc = FG_EXIT_USAGE;
        goto out;
    }
    ids = malloc(sizeof(int32_t) * (np + (size_t)o.tokens));
    pids = malloc(sizeof(int32_t) * np);
    text = malloc(np + (size_t)o.tokens + 1);
    if (!ids || !pids || !text) goto out;
    if (fg_text_vocab_encode(v, ptext, np, pids) != FG_OK) {
        cli_error("--prompt: %s (the model knows only its training text's characters)",
                  fg_last_error());
        rc = FG_EXIT_USAGE;
        goto out;
    }
    fg_sample_opts so = {.temperature = o.temperature > 0 ? o.temperature : 1.0,
                         .greedy = o.temperature == 0,
                         .seed = (uint64_t)o.seed};
    if (fg_gpt_generate(m, pids, (int64_t)np, o.tokens, &so, ids) != FG_OK ||
        fg_text_vocab_decode(v, ids, (int64_t)np + o.tokens, text) != FG_OK) {
        cli_error("sample: %s", fg_last_error());
        goto out;
    }
    fwrite(text, 1, np + (size_t)o.tokens, stdout);
    putchar('\n');
    rc = FG_EXIT_OK;
out:
    free(ids);
    free(pids);
    free(text);
    free(ptext);
    fg_module_free(m);
    if (dev && fg_dev_leak_check(dev) != FG_OK) {
        cli_error("%s", fg_last_error());
        rc = FG_EXIT_FAIL;
    }
    fg_dev_close(dev);
    fg_text_vocab_free(v);
    fg_st_close(f);
    return rc;
}
