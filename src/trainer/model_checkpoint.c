/* ModelCheckpoint, as Lightning's: when to save (every n optimizer steps at
 * a batch end; every n epochs at the training epoch's end or at the end of
 * validation), what to keep (the save_top_k best by the monitored value,
 * or the newest without a monitor, and "last"), file names from a template
 * of the monitor candidates, and its state in every checkpoint.
 *
 * Invariants: best_k holds at most k entries, each a file this callback
 * wrote in dirpath and has not removed; a file leaves best_k before it is
 * removed, and is removed only after the checkpoint that replaces it was
 * written whole (rank 0 removes; the checkpoint fit resumed from is never
 * removed, unless it is one this callback's restored state tracks: then
 * it leaves as it would have without the stop, so that resumes leak no
 * file). Every rank keeps the same state: decisions are reduced over
 * ranks and names are rank 0's. */
#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trainer_impl.h"

#define EXT ".safetensors"

typedef struct topk {
    char *path;
    double score;
} topk;

typedef struct ckpt_cb {
    char *dirpath_opt, *filename, *monitor;
    fg_monitor_mode mode;
    int64_t save_top_k; /* 0 = none, -1 = all, k */
    bool save_last, auto_insert, save_last_link, save_on_fit_end;
    int64_t every_n_train_steps, every_n_epochs;
    fg_flag save_on_train_epoch_end;
    char dirpath[4096];
    topk *best;
    int64_t nbest, capbest;
    char kth_path[4096], best_path[4096], last_path[4096];
    char saved_now[4096]; /* the newest file it saved (link mode's target) */
    double kth_value, best_score, current_score;
    int64_t last_global_step_saved;
    bool resumed_own; /* the checkpoint fit resumed from is one of best (load_state_dict) */
} ckpt_cb;

static ckpt_cb *of(const fg_callback *cb) {
    return cb && cb->kind == FG__CB_CHECKPOINT ? cb->ud : NULL;
}

/* ----------------------------------------------------------------- names */

/* One "{name[:spec]}" group: a Python format spec turned into printf's. */
static FG_MUST_USE fg_status format_value(const char *spec, double v, bool is_int, char *out,
                                          size_t cap) {
    if (!spec || !spec[0]) {
        if (is_int) snprintf(out, cap, "%lld", (long long)v);
        else fg__fmt_float(out, cap, v);
        return FG_OK;
    }
    char flags[8] = "";
    int nf = 0;
    const char *p = spec;
    while (*p && strchr("+- #0", *p) && nf < 6) flags[nf++] = *p++;
    flags[nf] = '\0';
    char *end;
    long width = strtol(p, &end, 10);
    bool has_w = end != p;
    p = end;
    long prec = -1;
    if (*p == '.') {
        prec = strtol(p + 1, &end, 10);
        if (end == p + 1)
            return fg_error(FG_EINVAL, "format spec \"%s\": a '.' needs a precision", spec);
        p = end;
    }
    char type = *p ? *p++ : 'g';
    if (*p || !strchr("deEfFgG", type))
        return fg_error(FG_EINVAL,
                        "format spec \"%s\": expected [flags][width][.precision][type] with "
                        "type d, e, E, f, F, g or G",
                        spec);
    if (type == 'd' && !is_int)
        return fg_error(FG_EINVAL,
                        "format spec \"%s\": 'd' is for epoch and step, not a metric "
                        "(a float)",
                        spec);
    char fmt[48];
    int k = snprintf(fmt, sizeof fmt, "%%%s", flags);
    if (has_w) k += snprintf(fmt + k, sizeof fmt - (size_t)k, "%ld", width);
    if (prec >= 0 && type != 'd') k += snprintf(fmt + k, sizeof fmt - (size_t)k, ".%ld", prec);
    if (type == 'd') {
        snprintf(fmt + k, sizeof fmt - (size_t)k, "lld");
        snprintf(out, cap, fmt, (long long)v);
    } else {
        snprintf(fmt + k, sizeof fmt - (size_t)k, "%c", type);
        snprintf(out, cap, fmt, v);
    }
    return FG_OK;
}

/* Looks a candidate up: epoch and step are integers (unless logged). */
static bool candidate(const fg_trainer *t, const char *name, double *v, bool *is_int) {
    const fg_metric *m = t ? fg__map_get(&t->callback_m, name) : NULL;
    *is_int = false;
    if (m) {
        *v = m->value;
        return true;
    }
    *is_int = true;
    if (!strcmp(name, "epoch")) {
        *v = t ? (double)t->current_epoch : 0;
        return true;
    }
    if (!strcmp(name, "step")) {
        *v = t ? (double)t->global_step : 0;
        return true;
    }
    return false;
}

/* Lightning's format_checkpoint_name: the template with each group filled
 * in ("name=" first with auto_insert), "-v<ver>" when ver > 0. t may be NULL
 * (checking a template: every value 0). */
static FG_MUST_USE fg_status format_name(const ckpt_cb *c, const fg_trainer *t, const char *tmpl,
                                         int64_t ver, char *out, size_t cap) {
    size_t k = 0;
    for (const char *p = tmpl; *p;) {
        if (*p != '{') {
            if (k + 1 < cap) out[k++] = *p;
            p++;
            continue;
        }
        const char *close = strchr(p, '}');
        if (!close)
            return fg_error(FG_EINVAL, "ModelCheckpoint filename \"%s\": a '{' is not closed",
                            tmpl);
        char group[256];
        size_t gl = (size_t)(close - p - 1);
        if (gl == 0 || gl >= sizeof group)
            return fg_error(FG_EINVAL,
                            "ModelCheckpoint filename \"%s\": an empty or too long "
                            "{group}",
                            tmpl);
        memcpy(group, p + 1, gl);
        group[gl] = '\0';
        char *spec = strchr(group, ':');
        if (spec) *spec++ = '\0';
        double v = 0;
        bool is_int = true;
        if (!candidate(t, group, &v, &is_int)) {
            v = 0; /* a missing name is 0, as Lightning's torch.tensor(0) */
            is_int = true;
        }
        char val[128];
        FG_TRY(format_value(spec, v, is_int, val, sizeof val));
        int n = c->auto_insert ? snprintf(out + k, cap - k, "%s=%s", group, val)
                               : snprintf(out + k, cap - k, "%s", val);
        k += (size_t)n;
        if (k >= cap) return fg_error(FG_EINVAL, "ModelCheckpoint: file name too long");
        p = close + 1;
    }
    out[k < cap ? k : cap - 1] = '\0';
    if (ver > 0 && k + 24 < cap) snprintf(out + k, cap - k, "-v%lld", (long long)ver);
    for (char *q = out; *q; q++)
        if (*q == '/') *q = '_';
    return FG_OK;
}

static bool file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* dirpath/<name>.safetensors, versioned past existing files (except
 * `allowed`, a file about to be replaced); rank 0's choice, on every rank. */
static FG_MUST_USE fg_status pick_path(ckpt_cb *c, fg_trainer *t, const char *tmpl,
                                       const char *allowed, char *out, size_t cap) {
    char buf[4096] = "";
    if (fg_trainer_is_global_zero(t)) {
        for (int64_t ver = 0;; ver++) {
            char name[2048];
            FG_TRY(format_name(c, t, tmpl, ver, name, sizeof name));
            if (snprintf(buf, sizeof buf, "%s/%s" EXT, c->dirpath, name) >= (int)sizeof buf)
                return fg_error(FG_EINVAL, "ModelCheckpoint: path too long in %s", c->dirpath);
            if (!file_exists(buf) || (allowed && !strcmp(buf, allowed)) ||
                !strcmp(buf, c->last_path))
                break;
        }
    }
    FG_TRY(fg_fabric_broadcast_bytes(fg_trainer_fabric(t), buf, sizeof buf, 0));
    buf[sizeof buf - 1] = '\0';
    snprintf(out, cap, "%s", buf);
    return FG_OK;
}

/* ------------------------------------------------------------------ saving */

static bool should_skip(const ckpt_cb *c, const fg_trainer *t) {
    return t->fast_dev_run || t->fn != FG_FIT || t->stage == FG_STAGE_SANITY_CHECK ||
           c->last_global_step_saved == t->global_step;
}

static bool save_on_train_epoch_end(const ckpt_cb *c, const fg_trainer *t) {
    if (c->save_on_train_epoch_end != FG_FLAG_DEFAULT) return c->save_on_train_epoch_end == FG_ON;
    if (t->check_val_every != 1) return false;
    if (!t->enable_validation) return true;
    /* Lightning compares val_check_interval == 1.0, which an int 1 meets too */
    return t->val_check_interval.value == 1.0;
}

static FG_MUST_USE fg_status save(ckpt_cb *c, fg_trainer *t, const char *path) {
    int64_t prev = c->last_global_step_saved;
    c->last_global_step_saved = t->global_step; /* part of the state it saves */
    fg_status s = fg__save_checkpoint(t, path);
    if (s != FG_OK) {
        c->last_global_step_saved = prev;
        return s;
    }
    snprintf(c->saved_now, sizeof c->saved_now, "%s", path);
    return FG_OK;
}

static bool should_remove(const fg_trainer *t, const ckpt_cb *c, const char *prev,
                          const char *cur) {
    if (!prev[0] || !strcmp(prev, cur)) return false;
    char rp[PATH_MAX], rr[PATH_MAX], rd[PATH_MAX];
    if (!realpath(prev, rp)) return false;
    if (!c->resumed_own && t->ckpt_path[0] && realpath(t->ckpt_path, rr) && !strcmp(rp, rr))
        return false;
    if (!realpath(c->dirpath, rd)) return false;
    size_t dl = strlen(rd);
    return !strncmp(rp, rd, dl) && rp[dl] == '/';
}

static void remove_file(const fg_trainer *t, const char *path) {
    /* a file, or a sharded save's folder; one that cannot go is left, as before */
    if (fg_trainer_is_global_zero(t) && fg_st_remove(path) != FG_OK) {
    }
}

static bool better(const ckpt_cb *c, double a, double b) {
    return c->mode == FG_MONITOR_MIN ? a < b : a > b;
}

static FG_MUST_USE fg_status missing_monitor(const ckpt_cb *c, const fg_trainer *t) {
    char names[1024];
    fg__callback_metric_names(t, names, sizeof names);
    return fg_error(FG_EINVAL,
                    "ModelCheckpoint(monitor=\"%s\") could not find the monitored key among "
                    "the callback metrics [%s]: log it with fg_trainer_log",
                    c->monitor, names);
}

static FG_MUST_USE fg_status save_topk(ckpt_cb *c, fg_trainer *t) {
    if (c->save_top_k == 0) return FG_OK;
    if (!c->monitor) {
        char path[4096];
        FG_TRY(pick_path(c, t, c->filename, c->best_path, path, sizeof path));
        char prev[4096];
        snprintf(prev, sizeof prev, "%s", c->best_path);
        snprintf(c->best_path, sizeof c->best_path, "%s", path);
        fg_status s = save(c, t, path);
        if (s != FG_OK) {
            snprintf(c->best_path, sizeof c->best_path, "%s", prev);
            return s;
        }
        if (c->save_top_k == 1 && should_remove(t, c, prev, path)) remove_file(t, prev);
        return FG_OK;
    }
    double current;
    bool is_int;
    if (!candidate(t, c->monitor, &current, &is_int)) {
        /* Lightning only warns before validation ran; without validation
         * the key can only come from training, which logged it by now */
        if (t->val_runs == 0 && t->enable_validation) return FG_OK;
        return missing_monitor(c, t);
    }
    bool take = c->save_top_k == -1 || c->nbest < c->save_top_k;
    if (!take) {
        take = better(c, current, c->kth_value);
        /* every rank must agree (Lightning's reduce_boolean_decision) */
        double all = 0;
        fg_status s =
            fg_fabric_reduce_scalar(fg_trainer_fabric(t), take ? 1 : 0, FG_REDUCE_OP_MIN, &all);
        if (s != FG_OK) return fg_error_wrap(s, "ModelCheckpoint(monitor=%s)", c->monitor);
        take = all == 1;
    }
    if (!take) return FG_OK;
    int64_t k = c->save_top_k == -1 ? c->nbest + 1 : c->save_top_k;
    char del[4096] = "";
    if (c->nbest == k && k > 0) {
        snprintf(del, sizeof del, "%s", c->kth_path);
        for (int64_t i = 0; i < c->nbest; i++)
            if (!strcmp(c->best[i].path, del)) {
                fg_free(c->best[i].path);
                memmove(&c->best[i], &c->best[i + 1], (size_t)(c->nbest - i - 1) * sizeof *c->best);
                c->nbest--;
                break;
            }
    }
    if (isnan(current)) current = c->mode == FG_MONITOR_MIN ? INFINITY : -INFINITY;
    char path[4096];
    FG_TRY(pick_path(c, t, c->filename, del[0] ? del : NULL, path, sizeof path));
    if (c->nbest == c->capbest) {
        int64_t cap = c->capbest ? 2 * c->capbest : 8;
        topk *p = fg_realloc(c->best, (size_t)cap * sizeof *p);
        if (!p) return FG_ENOMEM;
        c->best = p;
        c->capbest = cap;
    }
    char *copy = fg_strdup(path);
    if (!copy) return FG_ENOMEM;
    c->current_score = current;
    c->best[c->nbest++] = (topk){copy, current};
    if (c->nbest == k) {
        int64_t w = 0; /* the worst of the k */
        for (int64_t i = 1; i < c->nbest; i++)
            if (better(c, c->best[w].score, c->best[i].score)) w = i;
        snprintf(c->kth_path, sizeof c->kth_path, "%s", c->best[w].path);
        c->kth_value = c->best[w].score;
    }
    int64_t b = 0;
    for (int64_t i = 1; i < c->nbest; i++)
        if (better(c, c->best[i].score, c->best[b].score)) b = i;
    snprintf(c->best_path, sizeof c->best_path, "%s", c->best[b].path);
    c->best_score = c->best[b].score;
    FG_TRY(save(c, t, path));
    if (del[0] && should_remove(t, c, del, path)) remove_file(t, del);
    return FG_OK;
}

/* save_last="link": rank 0 points dirpath/last.safetensors at this step's
 * file (the link is replaced, never versioned). */
static FG_MUST_USE fg_status link_last(ckpt_cb *c, fg_trainer *t) {
    char path[4096];
    FG_TRY(format_name(c, t, "last", 0, path, sizeof path));
    char full[4096];
    if (snprintf(full, sizeof full, "%s/%s" EXT, c->dirpath, path) >= (int)sizeof full)
        return fg_error(FG_EINVAL, "ModelCheckpoint: path too long in %s", c->dirpath);
    const char *slash = strrchr(c->saved_now, '/');
    fg_status s = FG_OK;
    if (fg_trainer_is_global_zero(t)) s = fg_st_set_last(full, slash ? slash + 1 : c->saved_now);
    /* every rank learns whether rank 0's link is in place */
    double ok = 0;
    fg_status rs =
        fg_fabric_reduce_scalar(fg_trainer_fabric(t), s == FG_OK ? 1 : 0, FG_REDUCE_OP_MIN, &ok);
    if (s != FG_OK) return fg_error_wrap(s, "ModelCheckpoint: save_last=\"link\"");
    if (rs != FG_OK) return fg_error_wrap(rs, "ModelCheckpoint: save_last=\"link\"");
    if (ok != 1) return fg_error(FG_EPEER, "ModelCheckpoint: rank 0 could not link %s", full);
    snprintf(c->last_path, sizeof c->last_path, "%s", full);
    return FG_OK;
}

static FG_MUST_USE fg_status save_last(ckpt_cb *c, fg_trainer *t) {
    if (!c->save_last) return FG_OK;
    /* "link": "last" names the newest file this callback saved; before the
     * first there is nothing to name (never a full copy) */
    if (c->save_last_link) return c->saved_now[0] ? link_last(c, t) : FG_OK;
    char path[4096], prev[4096];
    FG_TRY(pick_path(c, t, "last", NULL, path, sizeof path));
    snprintf(prev, sizeof prev, "%s", c->last_path);
    snprintf(c->last_path, sizeof c->last_path, "%s", path);
    fg_status s = save(c, t, path);
    if (s != FG_OK) {
        snprintf(c->last_path, sizeof c->last_path, "%s", prev);
        return s;
    }
    if (should_remove(t, c, prev, path)) remove_file(t, prev);
    return FG_OK;
}

static FG_MUST_USE fg_status on_train_batch_end(void *ud, fg_trainer *t, fg_batch *b, int64_t idx) {
    (void)b;
    (void)idx;
    ckpt_cb *c = ud;
    if (should_skip(c, t) || c->every_n_train_steps < 1 ||
        t->global_step % c->every_n_train_steps != 0)
        return FG_OK;
    FG_TRY(save_topk(c, t));
    return save_last(c, t);
}

fg_status fg__checkpoint_save_now(fg_callback *cb, fg_trainer *t, bool forced) {
    ckpt_cb *c = of(cb);
    if (!c || (!forced && !c->save_on_fit_end) || should_skip(c, t)) return FG_OK;
    FG_TRY(save_topk(c, t));
    if (c->last_global_step_saved != t->global_step) {
        /* top-k kept nothing at this step (a worse score, or no monitor value
         * yet): the end of the run is saved all the same */
        char path[4096];
        FG_TRY(pick_path(c, t, c->filename, NULL, path, sizeof path));
        FG_TRY(save(c, t, path));
    }
    return save_last(c, t);
}

static FG_MUST_USE fg_status on_epoch_point(ckpt_cb *c, fg_trainer *t) {
    if (c->every_n_epochs >= 1 && (t->current_epoch + 1) % c->every_n_epochs == 0)
        FG_TRY(save_topk(c, t));
    return save_last(c, t);
}

static FG_MUST_USE fg_status on_train_epoch_end(void *ud, fg_trainer *t) {
    ckpt_cb *c = ud;
    if (should_skip(c, t) || !save_on_train_epoch_end(c, t)) return FG_OK;
    return on_epoch_point(c, t);
}

static FG_MUST_USE fg_status on_validation_end(void *ud, fg_trainer *t) {
    ckpt_cb *c = ud;
    /* a monitor the first validation of a fit did not log (a misspelt
     * name) would rank nothing: an error now, not at the first save */
    double v;
    bool is_int;
    if (c->monitor && t->val_runs == 1 && t->fn == FG_FIT && !t->fast_dev_run &&
        t->stage != FG_STAGE_SANITY_CHECK && !candidate(t, c->monitor, &v, &is_int))
        return missing_monitor(c, t);
    if (should_skip(c, t) || save_on_train_epoch_end(c, t)) return FG_OK;
    return on_epoch_point(c, t);
}

/* ------------------------------------------------------------------- state */

static FG_MUST_USE fg_status state_dict(void *ud, fg_trainer *t, fg_state_dict *sd) {
    (void)t;
    ckpt_cb *c = ud;
    size_t cap = 64 + (size_t)c->nbest * 4200, k = 0;
    char *list = fg_alloc(cap);
    if (!list) return FG_ENOMEM;
    list[0] = '\0';
    for (int64_t i = 0; i < c->nbest; i++)
        k += (size_t)snprintf(list + k, cap - k, "%a\t%s\n", c->best[i].score, c->best[i].path);
    fg_status s = fg_state_dict_set(sd, "monitor", c->monitor ? c->monitor : "");
    if (s == FG_OK) s = fg_state_dict_set(sd, "dirpath", c->dirpath);
    if (s == FG_OK) s = fg_state_dict_set(sd, "best_model_path", c->best_path);
    /* no score yet (no monitor): no key, as Lightning's None */
    if (s == FG_OK && !isnan(c->best_score))
        s = fg_state_dict_set_f64(sd, "best_model_score", c->best_score);
    if (s == FG_OK && !isnan(c->current_score))
        s = fg_state_dict_set_f64(sd, "current_score", c->current_score);
    if (s == FG_OK) s = fg_state_dict_set(sd, "best_k_models", list);
    if (s == FG_OK) s = fg_state_dict_set(sd, "kth_best_model_path", c->kth_path);
    if (s == FG_OK) s = fg_state_dict_set_f64(sd, "kth_value", c->kth_value);
    if (s == FG_OK) s = fg_state_dict_set(sd, "last_model_path", c->last_path);
    if (s == FG_OK)
        s = fg_state_dict_set_i64(sd, "last_global_step_saved", c->last_global_step_saved);
    fg_free(list);
    return s;
}

static void clear_best(ckpt_cb *c) {
    for (int64_t i = 0; i < c->nbest; i++) fg_free(c->best[i].path);
    c->nbest = 0;
}

static FG_MUST_USE fg_status load_state_dict(void *ud, fg_trainer *t, const fg_state_dict *sd) {
    ckpt_cb *c = ud;
    const char *dir = fg_state_dict_get(sd, "dirpath");
    const char *best = fg_state_dict_get(sd, "best_model_path");
    if (best) snprintf(c->best_path, sizeof c->best_path, "%s", best);
    if (!dir || strcmp(dir, c->dirpath)) return FG_OK; /* another folder: only the best path */
    const char *v;
    fg_state_dict_get_f64(sd, "best_model_score", &c->best_score);
    fg_state_dict_get_f64(sd, "current_score", &c->current_score);
    fg_state_dict_get_f64(sd, "kth_value", &c->kth_value);
    fg_state_dict_get_i64(sd, "last_global_step_saved", &c->last_global_step_saved);
    if ((v = fg_state_dict_get(sd, "kth_best_model_path")))
        snprintf(c->kth_path, sizeof c->kth_path, "%s", v);
    if ((v = fg_state_dict_get(sd, "last_model_path")))
        snprintf(c->last_path, sizeof c->last_path, "%s", v);
    char target[2048];
    ssize_t tn = c->save_last_link ? readlink(c->last_path, target, sizeof target - 1) : -1;
    if (tn > 0) { /* the newest file saved: what "last" names */
        target[tn] = '\0';
        if (strlen(c->dirpath) + (size_t)tn + 2 <= sizeof c->saved_now)
            snprintf(c->saved_now, sizeof c->saved_now, "%.2047s/%s", c->dirpath, target);
    }
    clear_best(c);
    const char *list = fg_state_dict_get(sd, "best_k_models");
    for (const char *p = list; p && *p;) {
        const char *nl = strchr(p, '\n'), *tab = strchr(p, '\t');
        if (!nl || !tab || tab > nl) break;
        if (c->nbest == c->capbest) {
            int64_t cap = c->capbest ? 2 * c->capbest : 8;
            topk *q = fg_realloc(c->best, (size_t)cap * sizeof *q);
            if (!q) return FG_ENOMEM;
            c->best = q;
            c->capbest = cap;
        }
        size_t len = (size_t)(nl - tab - 1);
        char *path = fg_alloc(len + 1);
        if (!path) return FG_ENOMEM;
        memcpy(path, tab + 1, len);
        path[len] = '\0';
        c->best[c->nbest++] = (topk){path, strtod(p, NULL)};
        p = nl + 1;
    }
    /* resumed from one of the files it tracks: top-k may remove it as it
     * would have had the run not stopped */
    char rr[PATH_MAX], rb[PATH_MAX];
    c->resumed_own = false;
    if (t->ckpt_path[0] && realpath(t->ckpt_path, rr))
        for (int64_t i = 0; i < c->nbest && !c->resumed_own; i++)
            c->resumed_own = realpath(c->best[i].path, rb) && !strcmp(rr, rb);
    return FG_OK;
}

/* --------------------------------------------------------------- lifecycle */

fg_status fg__checkpoint_resolve_dir(fg_callback *cb, fg_trainer *t) {
    ckpt_cb *c = of(cb);
    if (!c) return FG_OK;
    if (c->dirpath_opt) snprintf(c->dirpath, sizeof c->dirpath, "%s", c->dirpath_opt);
    else if (t->nloggers && !t->fast_dev_run)
        snprintf(c->dirpath, sizeof c->dirpath, "%s/checkpoints", fg_trainer_log_dir(t));
    else snprintf(c->dirpath, sizeof c->dirpath, "%s/checkpoints", t->root_dir);
    return FG_OK;
}

fg_status fg__checkpoint_find_last(const fg_callback *cb, char *out, size_t cap, double *mtime) {
    const ckpt_cb *c = of(cb);
    if (!c || !c->dirpath[0]) return FG_EINVAL;
    DIR *d = opendir(c->dirpath);
    if (!d) return FG_EIO;
    double newest = -1;
    for (struct dirent *e; (e = readdir(d));) {
        size_t n = strlen(e->d_name), el = strlen(EXT);
        if (strncmp(e->d_name, "last", 4) || n < el || strcmp(e->d_name + n - el, EXT)) continue;
        char path[4096];
        if (snprintf(path, sizeof path, "%s/%s", c->dirpath, e->d_name) >= (int)sizeof path)
            continue;
        struct stat sb;
        /* a file, or a sharded save's folder (followed through a "link" last) */
        if (stat(path, &sb) != 0 || !(S_ISREG(sb.st_mode) || S_ISDIR(sb.st_mode))) continue;
        double mt = (double)sb.st_mtim.tv_sec + 1e-9 * (double)sb.st_mtim.tv_nsec;
        if (mt > newest) {
            newest = mt;
            snprintf(out, cap, "%s", path);
        }
    }
    closedir(d);
    *mtime = newest;
    return newest >= 0 ? FG_OK : FG_EIO;
}

static void ckpt_free(void *ud) {
    ckpt_cb *c = ud;
    clear_best(c);
    fg_free(c->best);
    fg_free(c->dirpath_opt);
    fg_free(c->filename);
    fg_free(c->monitor);
    fg_free(c);
}

fg_callback *fg_model_checkpoint_new(const fg_checkpoint_opts *opts) {
    fg_checkpoint_opts o = opts ? *opts : (fg_checkpoint_opts){0};
#define BAD(...)                                                                                   \
    do {                                                                                           \
        fg_error(FG_EINVAL, __VA_ARGS__);                                                          \
        return NULL;                                                                               \
    } while (0)
    if (o.save_top_k < -1)
        BAD("ModelCheckpoint: save_top_k=%lld: expected -1 (all), 0 (= 1) or "
            "more; no_top_k for Lightning's 0",
            (long long)o.save_top_k);
    if (o.every_n_train_steps < 0 || o.every_n_epochs < 0)
        BAD("ModelCheckpoint: every_n_train_steps=%lld, every_n_epochs=%lld: expected >= 0",
            (long long)o.every_n_train_steps, (long long)o.every_n_epochs);
    if (o.mode != FG_MONITOR_MIN && o.mode != FG_MONITOR_MAX)
        BAD("ModelCheckpoint: mode=%d: expected FG_MONITOR_MIN or FG_MONITOR_MAX", (int)o.mode);
    if (o.monitor && !o.monitor[0]) BAD("ModelCheckpoint: monitor=\"\": a name, or NULL for none");
    int64_t k = o.no_top_k ? 0 : o.save_top_k ? o.save_top_k : 1;
    if (!o.monitor && k != -1 && k != 0 && k != 1)
        BAD("ModelCheckpoint(save_top_k=%lld, monitor=NULL) is not a valid configuration: no "
            "quantity for top_k to track; set monitor",
            (long long)k);
#undef BAD
    ckpt_cb *c = fg_calloc(1, sizeof *c);
    if (!c) return NULL;
    c->mode = o.mode;
    c->save_top_k = k;
    c->save_last = o.save_last || o.save_last_link;
    c->save_last_link = o.save_last_link;
    c->save_on_fit_end = o.save_on_fit_end;
    c->auto_insert = !o.no_auto_insert_metric_name;
    c->every_n_train_steps = o.every_n_train_steps;
    c->every_n_epochs = o.every_n_epochs ? o.every_n_epochs : (o.every_n_train_steps ? 0 : 1);
    c->save_on_train_epoch_end = o.save_on_train_epoch_end;
    c->best_score = NAN;
    c->current_score = NAN;
    c->kth_value = c->mode == FG_MONITOR_MIN ? INFINITY : -INFINITY;
    bool ok = (!o.dirpath || (c->dirpath_opt = fg_strdup(o.dirpath))) &&
              (c->filename = fg_strdup(o.filename ? o.filename : "{epoch}-{step}")) &&
              (!o.monitor || (c->monitor = fg_strdup(o.monitor)));
    if (!ok) {
        ckpt_free(c);
        return NULL;
    }
    char probe[2048];
    if (format_name(c, NULL, c->filename, 0, probe, sizeof probe) != FG_OK) {
        fg_error_kept first;
        fg_error_keep(&first);
        ckpt_free(c);
        fg_error_restore(&first);
        return NULL;
    }
    /* Lightning's state key: the settings that tell two of them apart */
    char key[1024], mon[300] = "None";
    if (c->monitor) snprintf(mon, sizeof mon, "'%s'", c->monitor);
    snprintf(key, sizeof key,
             "ModelCheckpoint{'monitor': %s, 'mode': '%s', 'every_n_train_steps': %lld, "
             "'every_n_epochs': %lld, 'train_time_interval': None}",
             mon, c->mode == FG_MONITOR_MIN ? "min" : "max", (long long)c->every_n_train_steps,
             (long long)c->every_n_epochs);
    fg_callback_ops ops = {.name = "ModelCheckpoint",
                           .on_train_batch_end = on_train_batch_end,
                           .on_train_epoch_end = on_train_epoch_end,
                           .on_validation_end = on_validation_end,
                           .state_dict = state_dict,
                           .load_state_dict = load_state_dict,
                           .free = ckpt_free};
    return fg__callback_make(&ops, c, FG__CB_CHECKPOINT, key);
}

/* --------------------------------------------------------------- accessors */

const char *fg_model_checkpoint_best_path(const fg_callback *cb) {
    const ckpt_cb *c = of(cb);
    return c ? c->best_path : NULL;
}
double fg_model_checkpoint_best_score(const fg_callback *cb) {
    const ckpt_cb *c = of(cb);
    return c ? c->best_score : NAN;
}
const char *fg_model_checkpoint_last_path(const fg_callback *cb) {
    const ckpt_cb *c = of(cb);
    return c ? c->last_path : NULL;
}
const char *fg_model_checkpoint_dirpath(const fg_callback *cb) {
    const ckpt_cb *c = of(cb);
    return c ? c->dirpath : NULL;
}

int64_t fg_model_checkpoint_best_k(const fg_callback *cb, const char **paths, double *scores,
                                   int64_t cap) {
    const ckpt_cb *c = of(cb);
    if (!c) return 0;
    /* best first: a selection over a small list */
    bool used[4096] = {false};
    int64_t n = c->nbest < 4096 ? c->nbest : 4096;
    for (int64_t r = 0; r < n && r < cap; r++) {
        int64_t b = -1;
        for (int64_t i = 0; i < n; i++)
            if (!used[i] && (b < 0 || better(c, c->best[i].score, c->best[b].score))) b = i;
        used[b] = true;
        if (paths) paths[r] = c->best[b].path;
        if (scores) scores[r] = c->best[b].score;
    }
    return c->nbest;
}
