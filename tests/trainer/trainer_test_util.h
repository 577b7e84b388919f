/* What the trainer tests share: a small synthetic classification set (a
 * callback dataset), a tiny MLP module whose hooks count what the trainer
 * did, a scratch folder, and a faked launcher for multi-rank tests.
 *
 * Sample i: x = 4 numbers from a counter-based normal stream, y = the index
 * of the largest of x[0..2] (3 classes): a task the MLP learns a little in
 * a few steps, so that losses move and checkpoints differ. */
#ifndef FULGUR_TRAINER_TEST_UTIL_H
#define FULGUR_TRAINER_TEST_UTIL_H

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fulgur/fulgur.h"
#include "harness.h"

#define TU_DIM 4
#define TU_CLASSES 3

typedef struct tu_data {
    int64_t n;
    uint64_t seed;
} tu_data;

static fg_status tu_get(void *ud, int64_t i, void *x_out, void *y_out) {
    tu_data *d = ud;
    float *x = x_out;
    fg_rng_fill_normal(d->seed, (uint64_t)i * TU_DIM, x, TU_DIM, 0, 1);
    int32_t best = 0;
    for (int c = 1; c < TU_CLASSES; c++)
        if (x[c] > x[best]) best = c;
    *(int32_t *)y_out = best;
    return FG_OK;
}
static int64_t tu_len(void *ud) { return ((tu_data *)ud)->n; }
static void tu_spec(void *ud, fg_sample_spec *x, fg_sample_spec *y) {
    (void)ud;
    *x = (fg_sample_spec){.dtype = FG_F32, .ndim = 1, .shape = {TU_DIM}};
    *y = (fg_sample_spec){.dtype = FG_I32, .ndim = 0};
}
static void tu_free_data(void *ud) { free(ud); }

/* n samples drawn from stream `seed` (train and val use different seeds). */
static inline fg_dataset *tu_dataset(int64_t n, uint64_t seed) {
    tu_data *d = malloc(sizeof *d);
    d->n = n;
    d->seed = seed;
    return fg_dataset_new(&(fg_dataset_ops){tu_len, tu_spec, tu_get, tu_free_data}, d, "tu");
}

/* What the module's hooks saw. */
typedef struct tu_counts {
    int64_t train_steps, val_steps, sanity_steps, test_steps, predict_steps;
    int64_t opt_steps, val_runs, epochs_started, epochs_ended, train_start, train_end;
    int64_t fit_start, fit_end;
    double last_loss;
} tu_counts;

typedef struct tu_module {
    fg_module *net;
    tu_counts c;
    double lr;
    bool adamw;
    fg_lr_schedule schedule;
    bool use_schedule;
    fg_lr_interval interval;
    double dropout;
    /* tests' own behaviour */
    int64_t stop_at_step;        /* > 0: should_stop at that global step (batch end) */
    int64_t stop_after_epoch;    /* > 0: should_stop at the end of that many epochs */
    bool log_train, log_val;     /* log "loss"/"val_loss" */
    double val_offset_per_epoch; /* val_loss += this * epoch: a controlled curve */
    const double *val_curve;     /* val_loss by epoch (overrides the real one) */
    int64_t val_curve_n;
    char extra_key[64], extra_value[64]; /* on_save_checkpoint's pair */
    char loaded_extra[64];
} tu_module;

static fg_tensor *tu_loss(tu_module *m, fg_batch *b) {
    return fg_cross_entropy(fg_module_forward(m->net, b->x), b->y, -100);
}

static fg_status tu_configure_optimizers(void *ud, fg_trainer *t, fg_optimizer_config *out) {
    (void)t;
    tu_module *m = ud;
    out->optimizer =
        m->adamw ? fg_adamw_new(m->net, &(fg_adamw_opts){.lr = m->lr ? m->lr : 1e-2})
                 : fg_sgd_new(m->net, &(fg_sgd_opts){.lr = m->lr ? m->lr : 0.1, .momentum = 0.9});
    if (m->use_schedule) {
        out->schedule = &m->schedule;
        out->interval = m->interval;
    }
    return out->optimizer ? FG_OK : fg_last_status();
}

static fg_tensor *tu_training_step(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)i;
    tu_module *m = ud;
    m->c.train_steps++;
    fg_tensor *loss = tu_loss(m, b);
    if (loss) m->c.last_loss = fg_item(loss);
    if (loss && m->log_train &&
        fg_trainer_log(t, "loss", fg_item(loss),
                       &(fg_log_opts){.on_epoch = FG_ON, .prog_bar = true}) != FG_OK)
        return NULL;
    return loss;
}

static fg_status tu_validation_step(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)i;
    tu_module *m = ud;
    if (fg_trainer_stage(t) == FG_STAGE_SANITY_CHECK) m->c.sanity_steps++;
    else m->c.val_steps++;
    if (!m->log_val) return FG_OK;
    fg_tensor *loss = tu_loss(m, b);
    if (!loss) return fg_last_status();
    double v = fg_item(loss);
    if (m->val_curve) {
        int64_t e = fg_trainer_current_epoch(t);
        v = m->val_curve[e < m->val_curve_n ? e : m->val_curve_n - 1];
    }
    v += m->val_offset_per_epoch * (double)fg_trainer_current_epoch(t);
    return fg_trainer_log(t, "val_loss", v, NULL);
}

static fg_status tu_test_step(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)i;
    tu_module *m = ud;
    m->c.test_steps++;
    fg_tensor *loss = tu_loss(m, b);
    return loss ? fg_trainer_log(t, "test_loss", fg_item(loss), NULL) : fg_last_status();
}

static fg_status tu_predict_step(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)t;
    (void)b;
    (void)i;
    ((tu_module *)ud)->c.predict_steps++;
    return FG_OK;
}

static fg_status tu_before_opt(void *ud, fg_trainer *t) {
    (void)t;
    ((tu_module *)ud)->c.opt_steps++;
    return FG_OK;
}
static fg_status tu_val_epoch_end(void *ud, fg_trainer *t) {
    if (fg_trainer_stage(t) == FG_STAGE_VALIDATE) ((tu_module *)ud)->c.val_runs++;
    return FG_OK;
}
static fg_status tu_epoch_start(void *ud, fg_trainer *t) {
    (void)t;
    ((tu_module *)ud)->c.epochs_started++;
    return FG_OK;
}
static fg_status tu_epoch_end(void *ud, fg_trainer *t) {
    tu_module *m = ud;
    m->c.epochs_ended++;
    if (m->stop_after_epoch && fg_trainer_current_epoch(t) + 1 == m->stop_after_epoch)
        fg_trainer_set_should_stop(t, true);
    return FG_OK;
}
static fg_status tu_batch_end(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)b;
    (void)i;
    tu_module *m = ud;
    if (m->stop_at_step && fg_trainer_global_step(t) == m->stop_at_step)
        fg_trainer_set_should_stop(t, true);
    return FG_OK;
}
static fg_status tu_train_start(void *ud, fg_trainer *t) {
    (void)t;
    ((tu_module *)ud)->c.train_start++;
    return FG_OK;
}
static fg_status tu_train_end(void *ud, fg_trainer *t) {
    (void)t;
    ((tu_module *)ud)->c.train_end++;
    return FG_OK;
}
static fg_status tu_fit_start(void *ud, fg_trainer *t) {
    (void)t;
    ((tu_module *)ud)->c.fit_start++;
    return FG_OK;
}
static fg_status tu_fit_end(void *ud, fg_trainer *t) {
    (void)t;
    ((tu_module *)ud)->c.fit_end++;
    return FG_OK;
}
static fg_status tu_save_ckpt(void *ud, fg_trainer *t, fg_state_dict *sd) {
    (void)t;
    tu_module *m = ud;
    return m->extra_key[0] ? fg_state_dict_set(sd, m->extra_key, m->extra_value) : FG_OK;
}
static fg_status tu_load_ckpt(void *ud, fg_trainer *t, const fg_state_dict *sd) {
    (void)t;
    tu_module *m = ud;
    const char *v = m->extra_key[0] ? fg_state_dict_get(sd, m->extra_key) : NULL;
    snprintf(m->loaded_extra, sizeof m->loaded_extra, "%s", v ? v : "");
    return FG_OK;
}

/* A module over a fresh MLP 4 -> 8 -> 3 (seed 3; dropout when m->dropout). */
static inline void tu_module_init(tu_module *m) {
    fg_mlp_config cfg = {.sizes = {TU_DIM, 8, TU_CLASSES}, .seed = 3, .dropout = m->dropout};
    m->net = fg_mlp_new(&cfg);
    memset(&m->c, 0, sizeof m->c);
}

static inline fg_lightning_module tu_lm(tu_module *m) {
    return (fg_lightning_module){.ud = m,
                                 .model = m->net,
                                 .configure_optimizers = tu_configure_optimizers,
                                 .training_step = tu_training_step,
                                 .validation_step = tu_validation_step,
                                 .test_step = tu_test_step,
                                 .predict_step = tu_predict_step,
                                 .on_before_optimizer_step = tu_before_opt,
                                 .on_validation_epoch_end = tu_val_epoch_end,
                                 .on_train_epoch_start = tu_epoch_start,
                                 .on_train_epoch_end = tu_epoch_end,
                                 .on_train_batch_end = tu_batch_end,
                                 .on_train_start = tu_train_start,
                                 .on_train_end = tu_train_end,
                                 .on_fit_start = tu_fit_start,
                                 .on_fit_end = tu_fit_end,
                                 .on_save_checkpoint = tu_save_ckpt,
                                 .on_load_checkpoint = tu_load_ckpt};
}

/* A loader of batch b over ds, shuffled by seed 7 when shuffle. */
static inline fg_dataloader *tu_loader(fg_dataset *ds, int64_t batch, bool shuffle) {
    return fg_dataloader_new(ds, &(fg_loader_opts){.batch = batch, .shuffle = shuffle, .seed = 7});
}

/* ------------------------------------------------------------ the folders */

static char tu_dir_[256];

static void tu_remove_dir(void) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tu_dir_);
    if (tu_dir_[0] && system(cmd) != 0) fprintf(stderr, "  (could not remove %s)\n", tu_dir_);
}

/* A scratch folder for the test binary, removed when it exits. */
static inline const char *tu_tmp(void) {
    if (!tu_dir_[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(tu_dir_, sizeof tu_dir_, "%s/fg-test-trainer.XXXXXX", t ? t : "/tmp");
        if (!mkdtemp(tu_dir_)) tu_dir_[0] = '\0';
        else atexit(tu_remove_dir);
    }
    return tu_dir_;
}

/* A fresh sub-folder of the scratch folder. */
static inline const char *tu_subdir(const char *name) {
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/%s", tu_tmp(), name);
    mkdir(buf, 0700);
    return buf;
}

/* The names in a folder matching suffix, sorted, joined by spaces. */
static inline void tu_list(const char *dir, const char *suffix, char *out, size_t cap) {
    char names[64][256];
    int n = 0;
    DIR *d = opendir(dir);
    out[0] = '\0';
    if (!d) return;
    for (struct dirent *e; (e = readdir(d)) && n < 64;) {
        size_t l = strlen(e->d_name), sl = strlen(suffix);
        if (e->d_name[0] == '.' || l < sl || strcmp(e->d_name + l - sl, suffix)) continue;
        snprintf(names[n++], 256, "%s", e->d_name);
    }
    closedir(d);
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (strcmp(names[j], names[i]) < 0) {
                char tmp[256];
                memcpy(tmp, names[i], 256);
                memcpy(names[i], names[j], 256);
                memcpy(names[j], tmp, 256);
            }
    for (int i = 0; i < n; i++)
        snprintf(out + strlen(out), cap - strlen(out), "%s%s", i ? " " : "", names[i]);
}

/* The whole content of a file (malloc'ed, NUL-terminated), or NULL. */
static inline char *tu_read(const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, fp) != (size_t)n) n = 0;
    if (s) s[n] = '\0';
    fclose(fp);
    return s;
}

/* ----------------------------------------------------- a faked launcher */

/* Every launcher variable unset; one kernel thread (forks must not meet a
 * thread pool). */
static inline void tu_clean_env(void) {
    fg_launch_unexport();
    unsetenv("TORCHELASTIC_RUN_ID");
    unsetenv("OMPI_COMM_WORLD_RANK");
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("SLURM_PROCID");
    unsetenv("SLURM_NTASKS");
    setenv("FULGUR_CPU_DEVICES", "4", 1);
    setenv("FULGUR_NUM_THREADS", "1", 1);
}

/* This process is rank `rank` of `world` ranks that fulgur run started
 * (job `job`, distinct per test so that two jobs never meet). */
static inline void tu_fake_launcher(int rank, int world, int job) {
    tu_clean_env();
    char v[64];
    snprintf(v, sizeof v, "%d", rank);
    setenv("FULGUR_RANK", v, 1);
    setenv("FULGUR_LOCAL_RANK", v, 1);
    snprintf(v, sizeof v, "%d", world);
    setenv("FULGUR_WORLD_SIZE", v, 1);
    setenv("FULGUR_LOCAL_WORLD_SIZE", v, 1);
    snprintf(v, sizeof v, "fg-test-trainer-%d-%d", (int)getppid(), job);
    setenv("FULGUR_JOB_ID", v, 1);
}

#endif
