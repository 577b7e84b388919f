/* fulgur fit --config: a YAML file laid out as LightningCLI's,
 *
 *   seed_everything: 42
 *   trainer: {max_steps: 200, devices: 2, strategy: ddp}
 *   model: {model: mlp, hidden: 64}          # or class_path + init_args
 *   model: {class_path: resnet, init_args: {depth: 20, width: 8}}
 *   data: {data: x.npy, labels: y.npy, batch_size: 32}
 *   optimizer: {class_path: torch.optim.AdamW, init_args: {lr: 0.001}}
 *   lr_scheduler: {class_path: torch.optim.lr_scheduler.StepLR, init_args: {step_size: 2}}
 *
 * read through libyaml's document API and turned into fit's flags: each key
 * is a flag's name with dashes or underscores. The flag table is the one
 * source of keys: model:, data:, optimizer: and lr_scheduler: hold the flags listed below,
 * trainer: every other flag (so a flag added to the table is a trainer key
 * at once), and two keys sit at the top as LightningCLI's do
 * (seed_everything = --seed, ckpt_path = --ckpt-path). A plain null, ~ or
 * empty value leaves the flag's default; a list is joined by commas
 * (devices: [0, 2] is --devices 0,2). trainer.callbacks and trainer.logger
 * take LightningCLI's lists of class_path + init_args (ModelCheckpoint,
 * EarlyStopping, LearningRateMonitor; CSVLogger, TensorBoardLogger), each
 * argument turned into the flag that sets it (k_callbacks, k_loggers). */
#include "fit_config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "cli.h"
#include "fit_net.h"

typedef struct section_keys {
    const char *section;
    const char *const *flags;
} section_keys;

/* every family's shape: gpt's, mlp's, resnet's (depth, width, layout,
 * channels), vit's (patch size beside gpt's names), lstm's and the
 * sequential network's */
static const char *const k_model[] = {
    "model", "layers", "heads",         "embd",        "ctx",        "dropout", "hidden",
    "depth", "width",  "resnet-layout", "in-channels", "patch-size", "net",     NULL};
/* the data's paths, their reader and its fields, the loader's and the
 * image transforms (LightningCLI's data: holds the datamodule's arguments:
 * the test and predict sets too) */
static const char *const k_data[] = {"data",
                                     "labels",
                                     "val-data",
                                     "val-labels",
                                     "val-fraction",
                                     "test-data",
                                     "test-labels",
                                     "predict-data",
                                     "batch-size",
                                     "num-workers",
                                     "reader",
                                     "label-column",
                                     "feature-columns",
                                     "no-header",
                                     "image-size",
                                     "random-flip",
                                     NULL};
static const char *const k_optimizer[] = {"optimizer",
                                          "lr",
                                          "warmup-steps",
                                          "lr-decay-steps",
                                          "min-lr-ratio",
                                          "weight-decay",
                                          "momentum",
                                          "beta1",
                                          "beta2",
                                          "eps",
                                          "alpha",
                                          "nesterov",
                                          "amsgrad",
                                          "centered",
                                          "no-decay-norm-bias",
                                          NULL};
/* LightningCLI's lr_scheduler: {class_path: torch.optim.lr_scheduler.StepLR,
 * init_args: {step_size: 2, gamma: 0.5}}; its ReduceLROnPlateau takes
 * monitor and mode (and Lightning's lr_scheduler_config interval and
 * frequency) beside them; milestones: [30, 80] is --milestones 30,80 */
static const char *const k_lr_scheduler[] = {
    "lr-scheduler", "lr-interval",    "lr-frequency", "lr-monitor",  "lr-mode",       "step-size",
    "milestones",   "gamma",          "t-max",        "eta-min",     "t-0",           "t-mult",
    "max-lr",       "pct-start",      "start-factor", "total-iters", "factor",        "patience",
    "threshold",    "threshold-mode", "cooldown",     "min-lr",      "lr-schedulers", NULL};
static const section_keys k_sections[] = {{"model", k_model},
                                          {"data", k_data},
                                          {"optimizer", k_optimizer},
                                          {"lr_scheduler", k_lr_scheduler}};
#define NSECTIONS 5 /* trainer and the four above */

/* Top-level keys (LightningCLI's) and their flags. */
static const struct {
    const char *key, *flag;
} k_top[] = {{"seed_everything", "seed"}, {"ckpt_path", "ckpt-path"}};

/* Flags that are not settings. */
static bool not_setting(const char *flag) {
    return !strcmp(flag, "config") || !strcmp(flag, "print-config");
}

static const char *section_of(const char *flag) {
    for (size_t i = 0; i < sizeof k_top / sizeof k_top[0]; i++)
        if (!strcmp(flag, k_top[i].flag)) return "";
    for (size_t s = 0; s < sizeof k_sections / sizeof k_sections[0]; s++)
        for (const char *const *k = k_sections[s].flags; *k; k++)
            if (!strcmp(flag, *k)) return k_sections[s].section;
    return "trainer";
}

/* A flag name as a YAML key: dashes become underscores. */
static void key_of(const char *flag, char *out, size_t cap) {
    snprintf(out, cap, "%s", flag);
    for (char *p = out; *p; p++)
        if (*p == '-') *p = '_';
}

/* ---------------------------------------------------------------- reading */

/* Where a setting was first given in the file being read: a second key
 * for it (the same key, another spelling, class_path beside the flag) is an
 * error, not a silent override. */
typedef struct seen_at {
    size_t line; /* 1-based; 0: not given */
    const char *key;
} seen_at;

typedef struct reader {
    const char *file;
    yaml_document_t doc;
    cli_flag *flags;
    int nflags;
    char **out; /* "--flag=value" strings */
    int nout, cap;
    seen_at *flag_seen;          /* [nflags], for the file being read */
    seen_at top_seen[NSECTIONS]; /* trainer, model, data, optimizer, lr_scheduler */
    seen_at init_seen[NSECTIONS];
    /* [nflags]: the value a callback's or logger's argument gave the flag,
     * and where (two classes that share a flag must agree on it) */
    char **cls_val;
    size_t *cls_line;
} reader;

static void where(const reader *r, const yaml_node_t *n, char *buf, size_t cap) {
    snprintf(buf, cap, "%s:%zu:%zu", r->file, n->start_mark.line + 1, n->start_mark.column + 1);
}

static const char *scalar(const yaml_node_t *n) { return (const char *)n->data.scalar.value; }

/* Records that key (node kn) sets *slot; an error naming both lines if it
 * was set before in this file. */
static int mark(const reader *r, seen_at *slot, const yaml_node_t *kn, const char *section) {
    const char *key = scalar(kn);
    if (slot->line) {
        char at[512];
        where(r, kn, at, sizeof at);
        if (!strcmp(slot->key, key))
            cli_error("%s: %s%s%s given twice (first at line %zu): keep one", at, section,
                      *section ? "." : "", key, slot->line);
        else
            cli_error("%s: %s%s%s sets what %s at line %zu set: keep one", at, section,
                      *section ? "." : "", key, slot->key, slot->line);
        return FG_EXIT_USAGE;
    }
    slot->line = kn->start_mark.line + 1;
    slot->key = key;
    return 0;
}

static bool is_null(const yaml_node_t *n) {
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    const char *s = scalar(n);
    return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL");
}

static int oom(const reader *r) {
    cli_error("out of memory reading %s", r->file);
    return FG_EXIT_FAIL;
}

static int add(reader *r, const char *flag, const char *value) {
    if (r->nout == r->cap) {
        int cap = r->cap ? 2 * r->cap : 32;
        char **p = realloc(r->out, (size_t)cap * sizeof *p);
        if (!p) return oom(r);
        r->out = p;
        r->cap = cap;
    }
    size_t len = strlen(flag) + strlen(value) + 4;
    char *s = malloc(len);
    if (!s) return oom(r);
    snprintf(s, len, "--%s=%s", flag, value);
    r->out[r->nout++] = s;
    return 0;
}

/* Adds the setting after the flag's own check, so that a bad value (a
 * number's, a bool's, a choice's, a list's) names the file's line. */
static int add_checked(reader *r, const char *at, const char *section, const char *key,
                       const cli_flag *f, const char *value) {
    char err[1024];
    if (!cli_flag_check(f, value, err, sizeof err)) {
        cli_error("%s: %s%s%s: %s", at, section, *section ? "." : "", key, err);
        return FG_EXIT_USAGE;
    }
    return add(r, f->name, value);
}

/* The value of one setting: a scalar, or a list of scalars joined by ",". */
static int set(reader *r, const char *section, const char *key, const cli_flag *f, yaml_node_t *v) {
    char at[512];
    where(r, v, at, sizeof at);
    if (is_null(v)) return 0;
    if (v->type == YAML_SCALAR_NODE) {
        const char *s = scalar(v);
        if (f->type == CLI_BOOL && v->data.scalar.style == YAML_PLAIN_SCALAR_STYLE) {
            /* YAML 1.1's booleans, as LightningCLI's loader reads them */
            static const char *const yes[] = {"true", "True", "TRUE", "yes", "Yes", "on", "On"};
            static const char *const no[] = {"false", "False", "FALSE", "no", "No", "off", "Off"};
            for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
                if (!strcmp(s, yes[i])) s = "true";
            for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
                if (!strcmp(s, no[i])) s = "false";
        }
        /* Lightning's fast_dev_run: True (the flag's bare value) or a number */
        if (f->type == CLI_INT && f->bare && v->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
            (!strcmp(s, "true") || !strcmp(s, "True")))
            s = f->bare;
        else if (f->type == CLI_INT && f->bare && v->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
                 (!strcmp(s, "false") || !strcmp(s, "False")))
            s = "0";
        /* numbers are checked here to name the file's line; ranges are the flag's */
        int64_t i64;
        double f64;
        if ((f->type == CLI_INT && !cli_parse_int(s, &i64)) ||
            (f->type == CLI_DOUBLE && !cli_parse_double(s, &f64))) {
            cli_error("%s: %s%s%s=\"%s\": expected %s", at, section, *section ? "." : "", key, s,
                      f->type == CLI_INT ? "an integer" : "a number");
            return FG_EXIT_USAGE;
        }
        return add_checked(r, at, section, key, f, s);
    }
    if (v->type == YAML_SEQUENCE_NODE) {
        size_t len = 1;
        for (yaml_node_item_t *i = v->data.sequence.items.start; i < v->data.sequence.items.top;
             i++) {
            yaml_node_t *e = yaml_document_get_node(&r->doc, *i);
            if (e->type != YAML_SCALAR_NODE) {
                where(r, e, at, sizeof at);
                cli_error("%s: %s%s%s: expected a value or a list of values, not a nested %s", at,
                          section, *section ? "." : "", key,
                          e->type == YAML_MAPPING_NODE ? "mapping" : "list");
                return FG_EXIT_USAGE;
            }
            len += strlen(scalar(e)) + 1;
        }
        char *joined = calloc(1, len);
        if (!joined) return oom(r);
        for (yaml_node_item_t *i = v->data.sequence.items.start; i < v->data.sequence.items.top;
             i++) {
            if (i != v->data.sequence.items.start) strcat(joined, ",");
            strcat(joined, scalar(yaml_document_get_node(&r->doc, *i)));
        }
        int rc = add_checked(r, at, section, key, f, joined);
        free(joined);
        return rc;
    }
    cli_error("%s: %s%s%s: expected a value (or a list), not a mapping", at, section,
              *section ? "." : "", key);
    return FG_EXIT_USAGE;
}

/* The flag a key names in a section ("" = the top level), or NULL. */
static cli_flag *lookup(reader *r, const char *section, const char *key) {
    char name[128];
    snprintf(name, sizeof name, "%s", key);
    for (char *p = name; *p; p++)
        if (*p == '_') *p = '-';
    if (!*section) {
        for (size_t i = 0; i < sizeof k_top / sizeof k_top[0]; i++)
            if (!strcmp(key, k_top[i].key))
                return cli_flags_find(r->flags, r->nflags, k_top[i].flag);
        return NULL;
    }
    /* LightningCLI's class_path names the model's, the optimizer's or the
     * scheduler's class */
    if (!strcmp(name, "class-path") && (!strcmp(section, "model") || !strcmp(section, "optimizer")))
        return cli_flags_find(r->flags, r->nflags, section);
    /* data: class_path names the reader (csv, npy, text, tokens) */
    if (!strcmp(name, "class-path") && !strcmp(section, "data"))
        return cli_flags_find(r->flags, r->nflags, "reader");
    if (!strcmp(section, "lr_scheduler")) {
        /* PyTorch's argument names (T_max), and the config's monitor/interval */
        for (char *p = name; *p; p++)
            if (*p >= 'A' && *p <= 'Z') *p = (char)(*p - 'A' + 'a');
        if (!strcmp(name, "class-path")) return cli_flags_find(r->flags, r->nflags, "lr-scheduler");
        if (!strcmp(name, "monitor") || !strcmp(name, "interval") || !strcmp(name, "frequency") ||
            !strcmp(name, "mode")) {
            char full[140];
            snprintf(full, sizeof full, "lr-%s", name);
            return cli_flags_find(r->flags, r->nflags, full);
        }
    }
    cli_flag *f = cli_flags_find(r->flags, r->nflags, name);
    if (!f || not_setting(f->name) || strcmp(section_of(f->name), section)) return NULL;
    return f;
}

/* "unknown key" with the nearest valid key of the section, or the section
 * the key belongs to. */
static int unknown_key(reader *r, const char *section, const char *key, const yaml_node_t *kn) {
    char at[512], best[128] = "", k[128];
    where(r, kn, at, sizeof at);
    int bd = 99;
    for (int i = 0; i < r->nflags; i++) {
        const cli_flag *f = &r->flags[i];
        if (f->type == CLI_SECTION || not_setting(f->name)) continue;
        key_of(f->name, k, sizeof k);
        const char *sec = section_of(f->name);
        if (!strcmp(k, key) || !strcmp(f->name, key)) {
            if (!*sec)
                for (size_t t = 0; t < sizeof k_top / sizeof k_top[0]; t++)
                    if (!strcmp(f->name, k_top[t].flag)) {
                        cli_error("%s: key \"%s\" is not in section %s:; --%s is the top-level "
                                  "key %s",
                                  at, key, section, f->name, k_top[t].key);
                        return FG_EXIT_USAGE;
                    }
            cli_error("%s: key \"%s\" is not in section %s:; it belongs in %s:", at, key, section,
                      sec);
            return FG_EXIT_USAGE;
        }
        if (strcmp(sec, section)) continue;
        int d = cli_edit_distance(key, k);
        if (d < bd) bd = d, snprintf(best, sizeof best, "%s", k);
    }
    if (best[0] && bd <= 3 && bd < (int)strlen(key))
        cli_error("%s: unknown key \"%s\" in section %s:; did you mean %s?", at, key, section,
                  best);
    else
        cli_error("%s: unknown key \"%s\" in section %s: (the nearest is %s; fulgur fit "
                  "--print-config lists every key)",
                  at, key, section, best);
    return FG_EXIT_USAGE;
}

static const char *const k_top_sections[] = {"trainer", "model", "data", "optimizer",
                                             "lr_scheduler"};

static size_t section_index(const char *section) {
    for (size_t i = 0; i < NSECTIONS; i++)
        if (!strcmp(section, k_top_sections[i])) return i;
    return 0;
}

/* model: {class_path: torch.nn.Sequential, init_args: {layers: [{class_path:
 * torch.nn.Conv2d, init_args: {in_channels: 1, ...}}, ...]}}: each layer
 * checked (its line named), the list turned into --net's text. */
static int read_layers(reader *r, const yaml_node_t *kn, yaml_node_t *seq) {
    char at[512];
    size_t cap = 256, len = 0;
    char *net = calloc(1, cap);
    if (!net) return oom(r);
    int idx = 0;
    for (yaml_node_item_t *i = seq->data.sequence.items.start; i < seq->data.sequence.items.top;
         i++, idx++) {
        yaml_node_t *item = yaml_document_get_node(&r->doc, *i);
        where(r, item, at, sizeof at);
        const char *cls = NULL;
        yaml_node_t *args = NULL;
        if (item->type == YAML_SCALAR_NODE) cls = scalar(item); /* "ReLU" alone */
        else if (item->type == YAML_MAPPING_NODE)
            for (yaml_node_pair_t *p = item->data.mapping.pairs.start;
                 p < item->data.mapping.pairs.top; p++) {
                yaml_node_t *k = yaml_document_get_node(&r->doc, p->key);
                yaml_node_t *v = yaml_document_get_node(&r->doc, p->value);
                const char *key = k->type == YAML_SCALAR_NODE ? scalar(k) : "";
                if (!strcmp(key, "class_path") && v->type == YAML_SCALAR_NODE) cls = scalar(v);
                else if (!strcmp(key, "init_args")) args = v;
                else {
                    where(r, k, at, sizeof at);
                    cli_error("%s: model.init_args.layers[%d]: unknown key \"%s\": a layer is "
                              "{class_path: torch.nn.<Layer>, init_args: {...}}",
                              at, idx, key);
                    free(net);
                    return FG_EXIT_USAGE;
                }
            }
        if (!cls) {
            cli_error("%s: model.init_args.layers[%d]: no class_path (a layer is {class_path: "
                      "torch.nn.<Layer>, init_args: {...}})",
                      at, idx);
            free(net);
            return FG_EXIT_USAGE;
        }
        /* "Name(k=v, k=[a, b])", the class's name without its module */
        const char *dot = strrchr(cls, '.');
        char layer[1024];
        int n = snprintf(layer, sizeof layer, "%s(", dot ? dot + 1 : cls);
        if (args && args->type == YAML_MAPPING_NODE)
            for (yaml_node_pair_t *p = args->data.mapping.pairs.start;
                 p < args->data.mapping.pairs.top && n < (int)sizeof layer; p++) {
                yaml_node_t *k = yaml_document_get_node(&r->doc, p->key);
                yaml_node_t *v = yaml_document_get_node(&r->doc, p->value);
                n += snprintf(layer + n, sizeof layer - (size_t)n,
                              "%s%s=", p == args->data.mapping.pairs.start ? "" : ", ",
                              k->type == YAML_SCALAR_NODE ? scalar(k) : "?");
                if (v->type == YAML_SCALAR_NODE)
                    n += snprintf(layer + n, sizeof layer - (size_t)n, "%s", scalar(v));
                else if (v->type == YAML_SEQUENCE_NODE) {
                    n += snprintf(layer + n, sizeof layer - (size_t)n, "[");
                    for (yaml_node_item_t *e = v->data.sequence.items.start;
                         e < v->data.sequence.items.top; e++) {
                        yaml_node_t *en = yaml_document_get_node(&r->doc, *e);
                        n += snprintf(layer + n, sizeof layer - (size_t)n, "%s%s",
                                      e == v->data.sequence.items.start ? "" : ", ",
                                      en->type == YAML_SCALAR_NODE ? scalar(en) : "?");
                    }
                    n += snprintf(layer + n, sizeof layer - (size_t)n, "]");
                }
            }
        else if (args && !is_null(args)) {
            where(r, args, at, sizeof at);
            cli_error("%s: model.init_args.layers[%d].init_args: expected a mapping of the "
                      "layer's arguments",
                      at, idx);
            free(net);
            return FG_EXIT_USAGE;
        }
        if (n < (int)sizeof layer) n += snprintf(layer + n, sizeof layer - (size_t)n, ")");
        char why[512];
        if (n >= (int)sizeof layer || !fit_net_check_layer(layer, why, sizeof why)) {
            cli_error("%s: model.init_args.layers[%d]: %s", at, idx,
                      n >= (int)sizeof layer ? "too long" : why);
            free(net);
            return FG_EXIT_USAGE;
        }
        size_t add = strlen(layer) + 3;
        if (len + add >= cap) {
            while (len + add >= cap) cap *= 2;
            char *p = realloc(net, cap);
            if (!p) {
                free(net);
                return oom(r);
            }
            net = p;
        }
        len += (size_t)snprintf(net + len, cap - len, "%s%s", len ? "; " : "", layer);
    }
    cli_flag *f = cli_flags_find(r->flags, r->nflags, "net");
    int rc = f ? mark(r, &r->flag_seen[f - r->flags], kn, "model") : FG_EXIT_USAGE;
    where(r, kn, at, sizeof at);
    if (!rc) rc = add_checked(r, at, "model", "layers", f, net);
    free(net);
    return rc;
}

/* ------------------------------------------- callbacks and loggers */

/* A Lightning class of trainer.callbacks or trainer.logger: its init_args
 * and the flags they set; `preset` is set when the class is listed and no
 * key of the file set the flag (EarlyStopping's patience defaults to 3). */
typedef struct class_arg {
    const char *arg, *flag;
} class_arg;
typedef struct class_map {
    const char *name;
    const class_arg *args; /* NULL-terminated */
    const char *preset_flag, *preset_value;
    const char *logger; /* --logger's word for a logger class */
} class_map;

static const class_arg k_ckpt_args[] = {{"dirpath", "ckpt-dir"},
                                        {"monitor", "monitor"},
                                        {"mode", "mode"},
                                        {"save_top_k", "save-top-k"},
                                        {"save_last", "save-last"},
                                        {"every_n_train_steps", "every-n-train-steps"},
                                        {NULL, NULL}};
static const class_arg k_es_args[] = {{"monitor", "monitor"},
                                      {"mode", "mode"},
                                      {"patience", "early-stopping-patience"},
                                      {"min_delta", "early-stopping-min-delta"},
                                      {NULL, NULL}};
static const class_arg k_lrm_args[] = {{"logging_interval", "log-lr"}, {NULL, NULL}};
static const class_arg k_logger_args[] = {{"save_dir", "logger-save-dir"},
                                          {"name", "logger-name"},
                                          {"version", "logger-version"},
                                          {NULL, NULL}};
static const class_map k_callbacks[] = {
    {"ModelCheckpoint", k_ckpt_args, "enable-checkpointing", "true", NULL},
    {"EarlyStopping", k_es_args, "early-stopping-patience", "3", NULL},
    {"LearningRateMonitor", k_lrm_args, "log-lr", "auto", NULL}};
static const class_map k_loggers[] = {
    {"CSVLogger", k_logger_args, NULL, NULL, "csv"},
    {"TensorBoardLogger", k_logger_args, NULL, NULL, "tensorboard"}};

/* Sets a flag from a class's argument (`what` names it: "trainer.callbacks
 * [1].init_args.monitor"), kn the node of its key. A flag another class
 * set must get the same value; a preset leaves a flag the file set. */
static int set_from_class(reader *r, const char *flag, const char *value, const yaml_node_t *kn,
                          const char *what, bool preset) {
    cli_flag *f = cli_flags_find(r->flags, r->nflags, flag);
    if (!f) return FG_EXIT_USAGE;
    size_t i = (size_t)(f - r->flags);
    char at[512];
    where(r, kn, at, sizeof at);
    if (r->cls_val[i]) {
        if (!strcmp(r->cls_val[i], value)) return 0;
        cli_error("%s: %s=%s, but a class at line %zu gave it %s: fulgur's callbacks and loggers "
                  "share --%s; give them one value",
                  at, what, value, r->cls_line[i], r->cls_val[i], flag);
        return FG_EXIT_USAGE;
    }
    if (preset && r->flag_seen[i].line) {
        /* a ModelCheckpoint listed with enable_checkpointing: false given
         * (Lightning refuses that too); the other presets yield to the file */
        if (strcmp(flag, "enable-checkpointing")) return 0;
        char want[160];
        snprintf(want, sizeof want, "--%s=", flag);
        const char *given = NULL;
        for (int k = 0; k < r->nout; k++)
            if (!strncmp(r->out[k], want, strlen(want))) given = r->out[k] + strlen(want);
        if (!given || !strcmp(given, value)) return 0;
        cli_error("%s: %s, but %s: %s at line %zu: a ModelCheckpoint needs checkpointing; drop "
                  "one of them",
                  at, what, r->flag_seen[i].key, given, r->flag_seen[i].line);
        return FG_EXIT_USAGE;
    }
    int rc = mark(r, &r->flag_seen[i], kn, "trainer");
    if (rc) return rc;
    if (!(r->cls_val[i] = strdup(value))) return oom(r);
    r->cls_line[i] = kn->start_mark.line + 1;
    char err[1024];
    if (!cli_flag_check(f, value, err, sizeof err)) {
        cli_error("%s: %s: %s", at, what, err);
        return FG_EXIT_USAGE;
    }
    return add(r, f->name, value);
}

/* "did you mean X?" among n names, or the list of them. */
static void nearest(const char *key, const char *const *names, size_t n, char *out, size_t cap) {
    int bd = 99;
    const char *best = NULL;
    for (size_t i = 0; i < n; i++) {
        int d = cli_edit_distance(key, names[i]);
        if (d < bd) bd = d, best = names[i];
    }
    if (best && bd <= 3 && bd < (int)strlen(key)) {
        snprintf(out, cap, "did you mean %s?", best);
        return;
    }
    size_t k = (size_t)snprintf(out, cap, "expected one of");
    for (size_t i = 0; i < n && k < cap; i++)
        k += (size_t)snprintf(out + k, cap - k, "%s %s", i ? "," : "", names[i]);
}

/* One entry of trainer.callbacks or trainer.logger (`list`, entry idx):
 * {class_path: ..., init_args: {...}} or the class's name alone. The
 * class's table entry in *cm. */
static int read_class(reader *r, const char *list, int idx, yaml_node_t *item,
                      const class_map *maps, size_t nmaps, const class_map **cm) {
    char at[512], why[512];
    where(r, item, at, sizeof at);
    const char *cls = NULL;
    yaml_node_t *args = NULL, *cls_node = item;
    if (item->type == YAML_SCALAR_NODE) cls = scalar(item);
    else if (item->type == YAML_MAPPING_NODE)
        for (yaml_node_pair_t *p = item->data.mapping.pairs.start; p < item->data.mapping.pairs.top;
             p++) {
            yaml_node_t *k = yaml_document_get_node(&r->doc, p->key);
            yaml_node_t *v = yaml_document_get_node(&r->doc, p->value);
            const char *key = k->type == YAML_SCALAR_NODE ? scalar(k) : "";
            if (!strcmp(key, "class_path") && v->type == YAML_SCALAR_NODE) {
                cls = scalar(v);
                cls_node = v;
            } else if (!strcmp(key, "init_args")) args = v;
            else {
                static const char *const keys[] = {"class_path", "init_args"};
                nearest(key, keys, 2, why, sizeof why);
                where(r, k, at, sizeof at);
                cli_error("%s: trainer.%s[%d]: unknown key \"%s\" (an entry is {class_path: ..., "
                          "init_args: {...}}); %s",
                          at, list, idx, key, why);
                return FG_EXIT_USAGE;
            }
        }
    if (!cls) {
        cli_error("%s: trainer.%s[%d]: no class_path (an entry is {class_path: ..., init_args: "
                  "{...}})",
                  at, list, idx);
        return FG_EXIT_USAGE;
    }
    const char *dot = strrchr(cls, '.'), *name = dot ? dot + 1 : cls;
    const char *names[8];
    *cm = NULL;
    for (size_t i = 0; i < nmaps; i++) {
        names[i] = maps[i].name;
        if (!strcmp(name, maps[i].name)) *cm = &maps[i];
    }
    if (!*cm) {
        nearest(name, names, nmaps, why, sizeof why);
        where(r, cls_node, at, sizeof at);
        cli_error("%s: trainer.%s[%d].class_path \"%s\": fulgur fit has no such %s; %s", at, list,
                  idx, cls, !strcmp(list, "logger") ? "logger" : "callback", why);
        return FG_EXIT_USAGE;
    }
    /* the class's own arguments, then its preset where no argument set it */
    bool preset_given = false;
    if (args && args->type == YAML_MAPPING_NODE) {
        for (yaml_node_pair_t *p = args->data.mapping.pairs.start; p < args->data.mapping.pairs.top;
             p++) {
            yaml_node_t *k = yaml_document_get_node(&r->doc, p->key);
            yaml_node_t *v = yaml_document_get_node(&r->doc, p->value);
            const char *key = k->type == YAML_SCALAR_NODE ? scalar(k) : "";
            const class_arg *a = (*cm)->args;
            while (a->arg && strcmp(a->arg, key)) a++;
            char what[256];
            snprintf(what, sizeof what, "trainer.%s[%d].init_args.%s", list, idx, key);
            if (!a->arg) {
                const char *anames[16];
                size_t n = 0;
                for (const class_arg *b = (*cm)->args; b->arg && n < 16; b++) anames[n++] = b->arg;
                nearest(key, anames, n, why, sizeof why);
                where(r, k, at, sizeof at);
                cli_error("%s: %s: %s's argument \"%s\" is not one fulgur fit reads; %s", at, what,
                          (*cm)->name, key, why);
                return FG_EXIT_USAGE;
            }
            if (is_null(v)) continue; /* the class's default (the preset's, if any) */
            if ((*cm)->preset_flag && !strcmp(a->flag, (*cm)->preset_flag)) preset_given = true;
            if (v->type != YAML_SCALAR_NODE) {
                where(r, v, at, sizeof at);
                cli_error("%s: %s: expected a value, not a %s", at, what,
                          v->type == YAML_MAPPING_NODE ? "mapping" : "list");
                return FG_EXIT_USAGE;
            }
            const char *val = scalar(v);
            char buf[256];
            /* a logger's version: 3 is "version_3", a string the folder itself */
            if (!strcmp(a->arg, "version") && v->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
                *val && strspn(val, "0123456789") == strlen(val)) {
                snprintf(buf, sizeof buf, "version_%s", val);
                val = buf;
            }
            int rc = set_from_class(r, a->flag, val, k, what, false);
            if (rc) return rc;
        }
    } else if (args && !is_null(args)) {
        where(r, args, at, sizeof at);
        cli_error("%s: trainer.%s[%d].init_args: expected a mapping of %s's arguments", at, list,
                  idx, (*cm)->name);
        return FG_EXIT_USAGE;
    }
    if ((*cm)->preset_flag && !preset_given) {
        char what[256];
        snprintf(what, sizeof what, "trainer.%s[%d] (%s)", list, idx, (*cm)->name);
        return set_from_class(r, (*cm)->preset_flag, (*cm)->preset_value, cls_node, what, true);
    }
    return 0;
}

/* trainer.callbacks: a list of classes (or one). */
static int read_callbacks(reader *r, yaml_node_t *v) {
    if (is_null(v)) return 0;
    const class_map *cm;
    size_t n = sizeof k_callbacks / sizeof k_callbacks[0];
    if (v->type != YAML_SEQUENCE_NODE) return read_class(r, "callbacks", 0, v, k_callbacks, n, &cm);
    int idx = 0;
    for (yaml_node_item_t *i = v->data.sequence.items.start; i < v->data.sequence.items.top;
         i++, idx++) {
        int rc = read_class(r, "callbacks", idx, yaml_document_get_node(&r->doc, *i), k_callbacks,
                            n, &cm);
        if (rc) return rc;
    }
    return 0;
}

/* trainer.logger as classes: --logger the list of their words. */
static int read_loggers(reader *r, const yaml_node_t *kn, yaml_node_t *v) {
    char words[128] = "", at[512];
    size_t n = sizeof k_loggers / sizeof k_loggers[0];
    int count = v->type == YAML_SEQUENCE_NODE
                    ? (int)(v->data.sequence.items.top - v->data.sequence.items.start)
                    : 1;
    for (int idx = 0; idx < count; idx++) {
        yaml_node_t *item = v->type == YAML_SEQUENCE_NODE
                                ? yaml_document_get_node(&r->doc, v->data.sequence.items.start[idx])
                                : v;
        const class_map *cm;
        int rc = read_class(r, "logger", idx, item, k_loggers, n, &cm);
        if (rc) return rc;
        if (strstr(words, cm->logger)) {
            where(r, item, at, sizeof at);
            cli_error("%s: trainer.logger[%d]: a second %s: fulgur fit writes one of each", at, idx,
                      cm->name);
            return FG_EXIT_USAGE;
        }
        snprintf(words + strlen(words), sizeof words - strlen(words), "%s%s", *words ? "," : "",
                 cm->logger);
    }
    if (!*words) snprintf(words, sizeof words, "none"); /* logger: [] */
    return set_from_class(r, "logger", words, kn, "trainer.logger", false);
}

/* trainer.logger holds classes (a mapping, or a list with one) rather than
 * --logger's words. */
static bool logger_classes(reader *r, const yaml_node_t *v) {
    if (v->type == YAML_MAPPING_NODE) return true;
    if (v->type != YAML_SEQUENCE_NODE) return false;
    for (yaml_node_item_t *i = v->data.sequence.items.start; i < v->data.sequence.items.top; i++)
        if (yaml_document_get_node(&r->doc, *i)->type == YAML_MAPPING_NODE) return true;
    return false;
}

/* lr_scheduler: {class_path: SequentialLR (or ChainedScheduler), init_args:
 * {schedulers: [{class_path: LinearLR, init_args: {...}}, ...], milestones:
 * [...]}}: each scheduler checked (its line named), the list turned into
 * --lr-schedulers' text ("linearlr start-factor=0.1 total-iters=2; ..."). */
static int read_lr_schedulers(reader *r, const yaml_node_t *kn, yaml_node_t *seq) {
    static const char *const k_sub[] = {"step-size", "milestones",   "gamma",      "t-max",
                                        "eta-min",   "t-0",          "t-mult",     "max-lr",
                                        "pct-start", "start-factor", "total-iters"};
    enum { nsub = sizeof k_sub / sizeof k_sub[0] };
    char at[512], why[512], text[4096] = "";
    size_t len = 0;
    cli_flag *sched = cli_flags_find(r->flags, r->nflags, "lr-scheduler");
    cli_flag *f = cli_flags_find(r->flags, r->nflags, "lr-schedulers");
    if (!sched || !f) return FG_EXIT_USAGE;
    int idx = 0;
    for (yaml_node_item_t *i = seq->data.sequence.items.start; i < seq->data.sequence.items.top;
         i++, idx++) {
        yaml_node_t *item = yaml_document_get_node(&r->doc, *i);
        const char *cls = NULL;
        yaml_node_t *args = NULL, *cls_node = item;
        if (item->type == YAML_SCALAR_NODE) cls = scalar(item);
        else if (item->type == YAML_MAPPING_NODE)
            for (yaml_node_pair_t *p = item->data.mapping.pairs.start;
                 p < item->data.mapping.pairs.top; p++) {
                yaml_node_t *k = yaml_document_get_node(&r->doc, p->key);
                yaml_node_t *v = yaml_document_get_node(&r->doc, p->value);
                const char *key = k->type == YAML_SCALAR_NODE ? scalar(k) : "";
                if (!strcmp(key, "class_path") && v->type == YAML_SCALAR_NODE) {
                    cls = scalar(v);
                    cls_node = v;
                } else if (!strcmp(key, "init_args")) args = v;
                else {
                    where(r, k, at, sizeof at);
                    cli_error("%s: lr_scheduler.init_args.schedulers[%d]: unknown key \"%s\": a "
                              "scheduler is {class_path: torch.optim.lr_scheduler.<Name>, "
                              "init_args: {...}}",
                              at, idx, key);
                    return FG_EXIT_USAGE;
                }
            }
        where(r, cls_node, at, sizeof at);
        if (!cls) {
            cli_error("%s: lr_scheduler.init_args.schedulers[%d]: no class_path", at, idx);
            return FG_EXIT_USAGE;
        }
        const char *dot = strrchr(cls, '.');
        char name[128];
        snprintf(name, sizeof name, "%s", dot ? dot + 1 : cls);
        for (char *c = name; *c; c++)
            if (*c >= 'A' && *c <= 'Z') *c = (char)(*c - 'A' + 'a');
        if (!cli_flag_check(sched, name, why, sizeof why)) {
            cli_error("%s: lr_scheduler.init_args.schedulers[%d].class_path: %s", at, idx, why);
            return FG_EXIT_USAGE;
        }
        len += (size_t)snprintf(text + len, sizeof text - len, "%s%s", idx ? "; " : "", name);
        if (args && args->type == YAML_MAPPING_NODE) {
            for (yaml_node_pair_t *p = args->data.mapping.pairs.start;
                 p < args->data.mapping.pairs.top && len < sizeof text; p++) {
                yaml_node_t *k = yaml_document_get_node(&r->doc, p->key);
                yaml_node_t *v = yaml_document_get_node(&r->doc, p->value);
                char key[128];
                snprintf(key, sizeof key, "%s", k->type == YAML_SCALAR_NODE ? scalar(k) : "");
                for (char *c = key; *c; c++) /* PyTorch's T_max is t-max */
                    if (*c == '_') *c = '-';
                    else if (*c >= 'A' && *c <= 'Z') *c = (char)(*c - 'A' + 'a');
                size_t j = 0;
                while (j < nsub && strcmp(k_sub[j], key)) j++;
                where(r, k, at, sizeof at);
                if (j == nsub) {
                    int bd = 99;
                    const char *best = k_sub[0];
                    for (size_t q = 0; q < nsub; q++) {
                        int d = cli_edit_distance(key, k_sub[q]);
                        if (d < bd) bd = d, best = k_sub[q];
                    }
                    cli_error("%s: lr_scheduler.init_args.schedulers[%d].init_args: unknown key "
                              "\"%s\"%s%s%s",
                              at, idx, scalar(k), bd <= 3 ? "; did you mean " : "",
                              bd <= 3 ? best : "", bd <= 3 ? "?" : "");
                    return FG_EXIT_USAGE;
                }
                if (is_null(v)) continue;
                len += (size_t)snprintf(text + len, sizeof text - len, " %s=", key);
                if (v->type == YAML_SCALAR_NODE)
                    len += (size_t)snprintf(text + len, sizeof text - len, "%s", scalar(v));
                else if (v->type == YAML_SEQUENCE_NODE)
                    for (yaml_node_item_t *e = v->data.sequence.items.start;
                         e < v->data.sequence.items.top && len < sizeof text; e++) {
                        yaml_node_t *en = yaml_document_get_node(&r->doc, *e);
                        len += (size_t)snprintf(text + len, sizeof text - len, "%s%s",
                                                e == v->data.sequence.items.start ? "" : ",",
                                                en->type == YAML_SCALAR_NODE ? scalar(en) : "?");
                    }
                else {
                    cli_error("%s: lr_scheduler.init_args.schedulers[%d].init_args.%s: expected a "
                              "value or a list",
                              at, idx, scalar(k));
                    return FG_EXIT_USAGE;
                }
            }
        } else if (args && !is_null(args)) {
            where(r, args, at, sizeof at);
            cli_error("%s: lr_scheduler.init_args.schedulers[%d].init_args: expected a mapping of "
                      "the scheduler's arguments",
                      at, idx);
            return FG_EXIT_USAGE;
        }
        if (len >= sizeof text) {
            cli_error("%s: lr_scheduler.init_args.schedulers: too long", at);
            return FG_EXIT_USAGE;
        }
    }
    int rc = mark(r, &r->flag_seen[f - r->flags], kn, "lr_scheduler");
    where(r, kn, at, sizeof at);
    return rc ? rc : add_checked(r, at, "lr_scheduler", "schedulers", f, text);
}

static int read_section(reader *r, const char *section, yaml_node_t *m) {
    char at[512];
    if (is_null(m)) return 0;
    if (m->type != YAML_MAPPING_NODE) {
        where(r, m, at, sizeof at);
        cli_error("%s: section %s: expected a mapping of keys to values", at, section);
        return FG_EXIT_USAGE;
    }
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = yaml_document_get_node(&r->doc, p->key);
        yaml_node_t *vn = yaml_document_get_node(&r->doc, p->value);
        if (kn->type != YAML_SCALAR_NODE) {
            where(r, kn, at, sizeof at);
            cli_error("%s: section %s: keys are names, not lists or mappings", at, section);
            return FG_EXIT_USAGE;
        }
        const char *key = scalar(kn);
        int rc;
        if (!strcmp(key, "init_args") && strcmp(section, "trainer")) {
            rc = mark(r, &r->init_seen[section_index(section)], kn, section);
            if (!rc) rc = read_section(r, section, vn); /* LightningCLI's class_path + init_args */
        } else if (!strcmp(section, "model") && !strcmp(key, "layers") &&
                   vn->type == YAML_SEQUENCE_NODE) {
            rc = read_layers(r, kn, vn); /* a network, not gpt's layer count */
        } else if (!strcmp(section, "lr_scheduler") && !strcmp(key, "schedulers") &&
                   vn->type == YAML_SEQUENCE_NODE) {
            rc = read_lr_schedulers(r, kn, vn);
        } else if (!strcmp(section, "trainer") && !strcmp(key, "callbacks")) {
            rc = read_callbacks(r, vn);
        } else if (!strcmp(section, "trainer") && !strcmp(key, "logger") && logger_classes(r, vn)) {
            rc = read_loggers(r, kn, vn);
        } else if (!strcmp(section, "trainer") && !strcmp(key, "logger") &&
                   vn->type == YAML_SCALAR_NODE &&
                   vn->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
                   (!strcmp(scalar(vn), "false") || !strcmp(scalar(vn), "False") ||
                    !strcmp(scalar(vn), "true") || !strcmp(scalar(vn), "True"))) {
            /* Lightning's logger: False (none) or True (the default logger) */
            bool off = scalar(vn)[0] == 'f' || scalar(vn)[0] == 'F';
            rc = off ? set_from_class(r, "logger", "none", kn, "trainer.logger", false) : 0;
        } else {
            cli_flag *f = lookup(r, section, key);
            if (f && (rc = mark(r, &r->flag_seen[f - r->flags], kn, section)) != 0) return rc;
            if (f && !strcmp(key, "class_path") && vn->type == YAML_SCALAR_NODE) {
                /* "torch.optim.AdamW" -> adamw: the class's name, in fulgur's spelling */
                const char *dot = strrchr(scalar(vn), '.');
                char name[128];
                snprintf(name, sizeof name, "%s", dot ? dot + 1 : scalar(vn));
                for (char *c = name; *c; c++)
                    if (*c >= 'A' && *c <= 'Z') *c = (char)(*c - 'A' + 'a');
                char at2[512];
                where(r, vn, at2, sizeof at2);
                rc = add_checked(r, at2, section, key, f, name);
            } else rc = f ? set(r, section, key, f, vn) : unknown_key(r, section, key, kn);
        }
        if (rc) return rc;
    }
    return 0;
}

static int read_top(reader *r, yaml_node_t *root) {
    char at[512];
    if (!root || is_null(root)) return 0; /* an empty file */
    if (root->type != YAML_MAPPING_NODE) {
        where(r, root, at, sizeof at);
        cli_error("%s: expected a mapping with sections trainer:, model:, data:, optimizer:", at);
        return FG_EXIT_USAGE;
    }
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top;
         p++) {
        yaml_node_t *kn = yaml_document_get_node(&r->doc, p->key);
        yaml_node_t *vn = yaml_document_get_node(&r->doc, p->value);
        const char *key = kn->type == YAML_SCALAR_NODE ? scalar(kn) : "";
        int rc = -1;
        for (size_t s = 0; s < NSECTIONS && rc < 0; s++)
            if (!strcmp(key, k_top_sections[s])) {
                rc = mark(r, &r->top_seen[s], kn, "");
                if (!rc) rc = read_section(r, key, vn);
            }
        if (rc < 0) {
            cli_flag *f = lookup(r, "", key);
            if (f) {
                rc = mark(r, &r->flag_seen[f - r->flags], kn, "");
                if (!rc) rc = set(r, "", key, f, vn);
            }
        }
        if (rc < 0) {
            /* the nearest section or top-level key */
            const char *best = NULL;
            int bd = 99;
            const char *names[NSECTIONS + sizeof k_top / sizeof k_top[0]];
            size_t nn = 0;
            for (size_t s = 0; s < NSECTIONS; s++) names[nn++] = k_top_sections[s];
            for (size_t t = 0; t < sizeof k_top / sizeof k_top[0]; t++) names[nn++] = k_top[t].key;
            for (size_t i = 0; i < nn; i++) {
                int d = cli_edit_distance(key, names[i]);
                if (d < bd) bd = d, best = names[i];
            }
            where(r, kn, at, sizeof at);
            if (best && bd <= 3 && bd < (int)strlen(key))
                cli_error("%s: unknown section \"%s\"; did you mean %s?", at, key, best);
            else
                cli_error("%s: unknown section \"%s\": expected trainer, model, data, optimizer, "
                          "lr_scheduler, seed_everything or ckpt_path",
                          at, key);
            rc = FG_EXIT_USAGE;
        }
        if (rc) return rc;
    }
    return 0;
}

/* Limits on a config file, checked before and while libyaml parses it:
 * its loader's time grows with the square of the nesting (a file of
 * 100,000 "[" takes 40 s), and LightningCLI's layout needs 3 levels. */
#define CONFIG_MAX_BYTES (16u << 20)
#define CONFIG_MAX_DEPTH 64

static void yaml_problem(const char *path, const yaml_parser_t *p) {
    const yaml_mark_t *m = &p->problem_mark;
    if (p->context)
        cli_error("%s:%zu:%zu: malformed YAML: %s (%s at line %zu)", path, m->line + 1,
                  m->column + 1, p->problem, p->context, p->context_mark.line + 1);
    else
        cli_error("%s:%zu:%zu: malformed YAML: %s", path, m->line + 1, m->column + 1,
                  p->problem ? p->problem : "unreadable");
}

/* The whole file, up to CONFIG_MAX_BYTES, into *buf (malloc'd). Read to
 * its end rather than by st_size: /proc files say 0, a pipe says nothing. */
static int slurp(const char *path, unsigned char **buf, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        cli_error("--config=\"%s\": %s", path, strerror(errno));
        return FG_EXIT_USAGE;
    }
    size_t cap = 1 << 16, n = 0;
    unsigned char *b = malloc(cap);
    while (b) {
        if (n == cap) {
            if (cap > CONFIG_MAX_BYTES) break;
            unsigned char *nb = realloc(b, 2 * cap);
            if (!nb) {
                free(b);
                b = NULL;
                break;
            }
            b = nb, cap *= 2;
        }
        size_t got = fread(b + n, 1, cap - n, fp);
        n += got;
        if (got == 0 || n > CONFIG_MAX_BYTES) break;
    }
    int err = ferror(fp) ? errno : 0;
    fclose(fp);
    if (!b) {
        cli_error("out of memory reading %s", path);
        return FG_EXIT_FAIL;
    }
    if (err) {
        free(b);
        cli_error("--config=\"%s\": %s", path, strerror(err));
        return FG_EXIT_USAGE;
    }
    if (n > CONFIG_MAX_BYTES) {
        size_t line = 1;
        for (size_t i = 0; i < CONFIG_MAX_BYTES; i++) line += b[i] == '\n';
        free(b);
        cli_error("%s:%zu: the file goes on past %u MiB, the limit of a config file: is it the "
                  "right file?",
                  path, line, CONFIG_MAX_BYTES >> 20);
        return FG_EXIT_USAGE;
    }
    *buf = b;
    *len = n;
    return 0;
}

/* The events of the whole stream, before the loader builds the document:
 * nesting past CONFIG_MAX_DEPTH and a second document are errors here. */
static int check_events(const char *path, const unsigned char *buf, size_t len) {
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p)) {
        cli_error("out of memory reading %s", path);
        return FG_EXIT_FAIL;
    }
    yaml_parser_set_input_string(&p, buf, len);
    int rc = 0, depth = 0, docs = 0;
    for (bool end = false; !end && !rc;) {
        yaml_event_t e;
        if (!yaml_parser_parse(&p, &e)) {
            yaml_problem(path, &p);
            rc = FG_EXIT_USAGE;
            break;
        }
        const yaml_mark_t *m = &e.start_mark;
        switch (e.type) {
        case YAML_SEQUENCE_START_EVENT:
        case YAML_MAPPING_START_EVENT:
            if (++depth > CONFIG_MAX_DEPTH) {
                cli_error("%s:%zu:%zu: nested deeper than %d levels, the limit of a config file "
                          "(its sections need 3)",
                          path, m->line + 1, m->column + 1, CONFIG_MAX_DEPTH);
                rc = FG_EXIT_USAGE;
            }
            break;
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT: depth--; break;
        case YAML_DOCUMENT_START_EVENT:
            if (++docs > 1) {
                cli_error("%s:%zu: a second YAML document (after ---): a config file holds one; "
                          "put the settings in one document, or give each its own --config",
                          path, m->line + 1);
                rc = FG_EXIT_USAGE;
            }
            break;
        case YAML_STREAM_END_EVENT: end = true; break;
        default: break;
        }
        yaml_event_delete(&e);
    }
    yaml_parser_delete(&p);
    return rc;
}

static void free_cls(reader *r) {
    for (int i = 0; r->cls_val && i < r->nflags; i++) free(r->cls_val[i]);
    free(r->cls_val);
    free(r->cls_line);
    r->cls_val = NULL;
    r->cls_line = NULL;
}

static int read_file(reader *r, const char *path) {
    unsigned char *buf = NULL;
    size_t len = 0;
    int rc = slurp(path, &buf, &len);
    if (rc) return rc;
    if ((rc = check_events(path, buf, len)) != 0) {
        free(buf);
        return rc;
    }
    r->file = path;
    free(r->flag_seen);
    r->flag_seen = calloc((size_t)r->nflags + 1, sizeof *r->flag_seen);
    free_cls(r);
    r->cls_val = calloc((size_t)r->nflags + 1, sizeof *r->cls_val);
    r->cls_line = calloc((size_t)r->nflags + 1, sizeof *r->cls_line);
    memset(r->top_seen, 0, sizeof r->top_seen);
    memset(r->init_seen, 0, sizeof r->init_seen);
    yaml_parser_t parser;
    if (!r->flag_seen || !r->cls_val || !r->cls_line || !yaml_parser_initialize(&parser)) {
        free(buf);
        return oom(r);
    }
    yaml_parser_set_input_string(&parser, buf, len);
    if (!yaml_parser_load(&parser, &r->doc)) {
        yaml_problem(path, &parser);
        rc = FG_EXIT_USAGE;
    } else {
        rc = read_top(r, yaml_document_get_root_node(&r->doc));
        yaml_document_delete(&r->doc);
    }
    yaml_parser_delete(&parser);
    free(buf);
    return rc;
}

/* The expanded command line: the flags' values point into it until exit.
 * volatile: nothing reads it back, and an optimizing build would drop the
 * store, so that LeakSanitizer (the -O1 sanitizer build) sees the kept
 * block unreachable and reports it as a leak. */
static char **volatile g_expanded;

int fit_config_expand(cli_flag *flags, int nflags, int *argc, char ***argv) {
    reader r = {.flags = flags, .nflags = nflags};
    char **av = *argv;
    int ac = *argc, rc = 0;
    for (int i = 1; i < ac && !rc; i++) {
        if (!strcmp(av[i], "--")) break;
        if (!strncmp(av[i], "--config=", 9)) rc = read_file(&r, av[i] + 9);
        else if (!strcmp(av[i], "--config")) {
            if (i + 1 >= ac) break; /* the flag parser names the missing value */
            rc = read_file(&r, av[++i]);
        }
    }
    if (!rc && r.nout) {
        char **out = malloc((size_t)(ac + r.nout + 1) * sizeof *out);
        if (!out) {
            cli_error("out of memory");
            rc = FG_EXIT_FAIL;
        } else {
            out[0] = av[0];
            memcpy(out + 1, r.out, (size_t)r.nout * sizeof *out);
            memcpy(out + 1 + r.nout, av + 1, (size_t)(ac - 1) * sizeof *out);
            out[ac + r.nout] = NULL;
            *argc = ac + r.nout;
            *argv = g_expanded = out; /* fit parses its command line once */
            free(r.out);
            free(r.flag_seen);
            free_cls(&r);
            return 0;
        }
    }
    for (int i = 0; i < r.nout; i++) free(r.out[i]);
    free(r.out);
    free(r.flag_seen);
    free_cls(&r);
    return rc;
}

/* --------------------------------------------------------------- printing */

/* A string as a YAML scalar: plain when it reads back as itself, else in
 * single quotes. */
static void put_str(FILE *out, const char *s) {
    static const char *const words[] = {"~",    "null",  "Null",  "NULL",  "true", "True",
                                        "TRUE", "false", "False", "FALSE", "yes",  "Yes",
                                        "no",   "No",    "on",    "On",    "off",  "Off"};
    bool plain = *s &&
                 strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                           "0123456789_./,+-=") == strlen(s) &&
                 s[0] != '-' && s[0] != ',';
    for (size_t i = 0; plain && i < sizeof words / sizeof words[0]; i++)
        plain = strcmp(s, words[i]) != 0;
    if (plain || (s[0] == '-' && strtod(s, NULL) != 0 && !strchr(s, ','))) {
        fputs(s, out);
        return;
    }
    fputc('\'', out);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', out);
        fputc(*s, out);
    }
    fputc('\'', out);
}

static void put_value(FILE *out, const cli_flag *f) {
    switch (f->type) {
    case CLI_STR: {
        const char *s = *(const char **)f->dst;
        if (s) put_str(out, s);
        else fputs("null", out);
        break;
    }
    case CLI_INT: fprintf(out, "%lld", (long long)*(int64_t *)f->dst); break;
    case CLI_DOUBLE: {
        double v = *(double *)f->dst;
        char buf[64];
        for (int prec = 1; prec <= 17; prec++) { /* the shortest that reads back exactly */
            snprintf(buf, sizeof buf, "%.*g", prec, v);
            if (strtod(buf, NULL) == v) break;
        }
        fputs(buf, out);
        break;
    }
    case CLI_BOOL: fputs(*(bool *)f->dst ? "true" : "false", out); break;
    default: break;
    }
}

void fit_config_print(FILE *out, cli_flag *flags, int nflags) {
    char key[128];
    fputs("# fulgur fit --print-config: the defaults, the --config files, then the flags; "
          "read back by --config\n",
          out);
    for (size_t t = 0; t < sizeof k_top / sizeof k_top[0]; t++) {
        cli_flag *f = cli_flags_find(flags, nflags, k_top[t].flag);
        if (!f) continue;
        fprintf(out, "%s: ", k_top[t].key);
        put_value(out, f);
        fputc('\n', out);
    }
    for (size_t s = 0; s < NSECTIONS; s++) {
        fprintf(out, "%s:\n", k_top_sections[s]);
        for (int i = 0; i < nflags; i++) {
            const cli_flag *f = &flags[i];
            if (f->type == CLI_SECTION || not_setting(f->name) ||
                strcmp(section_of(f->name), k_top_sections[s]))
                continue;
            key_of(f->name, key, sizeof key);
            fprintf(out, "  %s: ", key);
            put_value(out, f);
            fputc('\n', out);
        }
    }
}
