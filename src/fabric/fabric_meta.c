/* The fabric's counters in a checkpoint's metadata, read without trust:
 * every key the fabric writes (step, epoch, batch_in_epoch, seed,
 * world_size, optimizer_steps, lr and each group's lr and weight decay,
 * samples_in_epoch, global_batch, deterministic with its micro_batch, the
 * loss scaler's three) is checked for its type (decimal digits only, no
 * sign, no blanks, no overflow; a finite number for lr and loss_scale),
 * its range and its agreement with the others, all of them before the load
 * changes anything. A key the file lacks takes the value older checkpoints
 * imply. The error names the file, the key, the value and what to do. */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fabric_impl.h"

/* More ranks than any run has: a world_size past it is damage. */
#define MAX_WORLD (1 << 20)
/* More parameter groups than any optimizer has. */
#define MAX_GROUPS (1 << 16)

static FG_MUST_USE fg_status bad(const char *path, const char *key, const char *v,
                                 const char *want) {
    return fg_error(FG_EFORMAT,
                    "%s: metadata \"%s\" is \"%.80s\"%s: expected %s; the checkpoint is damaged "
                    "or was edited: resume from another checkpoint (or restore this one)",
                    path, key, v, strlen(v) > 80 ? "..." : "", want);
}

/* Decimal digits only (no sign, no blanks), at most UINT64_MAX. */
static bool parse_u64(const char *s, uint64_t *out) {
    uint64_t v = 0;
    size_t n = 0;
    for (; s[n] >= '0' && s[n] <= '9'; n++) {
        unsigned d = (unsigned)(s[n] - '0');
        if (v > (UINT64_MAX - d) / 10) return false;
        v = v * 10 + d;
    }
    if (!n || s[n]) return false;
    *out = v;
    return true;
}

/* An integer key in [lo, INT64_MAX]; `def` when absent. */
static FG_MUST_USE fg_status get_int(const fg_st_file *file, const char *path, const char *key,
                                     int64_t lo, int64_t def, int64_t *out, bool *present) {
    const char *v = fg_st_meta_get(file, key);
    if (present) *present = v != NULL;
    if (!v) {
        *out = def;
        return FG_OK;
    }
    uint64_t u;
    if (!parse_u64(v, &u) || u > INT64_MAX || (int64_t)u < lo) {
        char want[96];
        snprintf(want, sizeof want, "a decimal integer >= %lld (digits only)", (long long)lo);
        return bad(path, key, v, want);
    }
    *out = (int64_t)u;
    return FG_OK;
}

/* A finite number > lo (or >= lo when `closed`). */
static FG_MUST_USE fg_status get_real(const fg_st_file *file, const char *path, const char *key,
                                      double lo, bool closed, double *out, bool *present) {
    const char *v = fg_st_meta_get(file, key);
    *present = v != NULL;
    if (!v) return FG_OK;
    char *end = NULL;
    double d = v[0] && !isspace((unsigned char)v[0]) ? strtod(v, &end) : NAN;
    if (!end || *end || !isfinite(d) || d < lo || (!closed && d == lo))
        return bad(path, key, v, closed ? "a finite number >= 0" : "a finite number > 0");
    *out = d;
    return FG_OK;
}

fg_status fg__fabric_meta_read(const fg_st_file *file, const char *path, fg__ckpt_counters *c) {
    memset(c, 0, sizeof *c);
    bool has_sie, has_gb, has_gt, has_sk, has_ws;
    FG_TRY(get_int(file, path, "step", 0, 0, &c->step, NULL));
    FG_TRY(get_int(file, path, "epoch", 0, 0, &c->epoch, NULL));
    FG_TRY(get_int(file, path, "batch_in_epoch", 0, 0, &c->batch_in_epoch, NULL));
    FG_TRY(get_int(file, path, "optimizer_steps", 0, 0, &c->optimizer_steps, NULL));
    FG_TRY(get_int(file, path, "world_size", 1, 0, &c->world_size, &has_ws));
    if (has_ws && c->world_size > MAX_WORLD)
        return bad(path, "world_size", fg_st_meta_get(file, "world_size"),
                   "a world size of 1 to 1048576 ranks");
    FG_TRY(get_int(file, path, "samples_in_epoch", 0, -1, &c->samples_in_epoch, &has_sie));
    FG_TRY(get_int(file, path, "global_batch", 1, 0, &c->global_batch, &has_gb));
    if (has_sie != has_gb)
        return bad(path, has_sie ? "samples_in_epoch" : "global_batch",
                   fg_st_meta_get(file, has_sie ? "samples_in_epoch" : "global_batch"),
                   has_sie ? "it beside a \"global_batch\", which the file lacks"
                           : "it beside a \"samples_in_epoch\", which the file lacks");
    if (has_gb && has_ws && c->global_batch % c->world_size != 0) {
        char want[160];
        snprintf(want, sizeof want,
                 "a multiple of world_size %lld (every rank takes the same batch)",
                 (long long)c->world_size);
        return bad(path, "global_batch", fg_st_meta_get(file, "global_batch"), want);
    }
    const char *seed = fg_st_meta_get(file, "seed");
    if (seed && !parse_u64(seed, &c->seed))
        return bad(path, "seed", seed, "a decimal integer from 0 to 18446744073709551615");
    c->has_seed = seed != NULL;
    FG_TRY(get_real(file, path, "lr", 0, true, &c->lr, &c->has_lr));
    /* the parameter groups' lr.G and weight_decay.G, written for G = 1, 2,
     * ...: each a finite number >= 0, as the optimizer takes them */
    for (int g = 1; g < MAX_GROUPS; g++) {
        char key[2][48];
        bool has[2];
        double v;
        snprintf(key[0], sizeof key[0], "lr.%d", g);
        snprintf(key[1], sizeof key[1], "weight_decay.%d", g);
        FG_TRY(get_real(file, path, key[0], 0, true, &v, &has[0]));
        FG_TRY(get_real(file, path, key[1], 0, true, &v, &has[1]));
        if (!has[0] && !has[1]) break;
    }
    const char *det = fg_st_meta_get(file, "deterministic");
    if (det && strcmp(det, "true")) return bad(path, "deterministic", det, "\"true\" or no key");
    FG_TRY(get_int(file, path, "micro_batch", 1, 0, &c->micro_batch, NULL));
    FG_TRY(get_real(file, path, "loss_scale", 0, false, &c->loss_scale, &c->has_scaler));
    FG_TRY(get_int(file, path, "loss_scale_growth_tracker", 0, 0, &c->growth_tracker, &has_gt));
    FG_TRY(get_int(file, path, "loss_scale_skipped", 0, 0, &c->skipped, &has_sk));
    if ((has_gt || has_sk) && !c->has_scaler)
        return bad(
            path, has_gt ? "loss_scale_growth_tracker" : "loss_scale_skipped",
            fg_st_meta_get(file, has_gt ? "loss_scale_growth_tracker" : "loss_scale_skipped"),
            "it beside a \"loss_scale\", which the file lacks");
    return FG_OK;
}
