/* The Trainer over a fabric whose state_dict_type is sharded: every
 * checkpoint ModelCheckpoint saves is a folder (a file and the index on one
 * process); the top k it keeps are folders, the ones it drops are removed
 * whole (fg_st_remove), and "last" is one too; a fit resumed from the best
 * folder goes on as one resumed from the full file of the same run. One
 * process. */
#include <math.h>
#include <sys/stat.h>

#include "trainer_test_util.h"

static const double k_curve[] = {0.5, 0.4, 0.6, 0.3, 0.45, 0.35};

typedef struct out {
    char files[2048], best[512];
    int64_t step;
} out;

static void fit(fg_state_dict_type sdt, const char *dir, const char *ckpt_path, int64_t epochs,
                out *r) {
    tu_clean_env();
    fg_dataset *tr = tu_dataset(40, 11), *va = tu_dataset(12, 12);
    fg_dataloader *tl = tu_loader(tr, 4, true), *vl = tu_loader(va, 4, false);
    tu_module m = {.log_val = true, .val_curve = k_curve, .val_curve_n = 6};
    tu_module_init(&m);
    fg_lightning_module lm = tu_lm(&m);
    fg_callback *ck = fg_model_checkpoint_new(&(fg_checkpoint_opts){.dirpath = dir,
                                                                    .monitor = "val_loss",
                                                                    .save_top_k = 2,
                                                                    .save_last = true,
                                                                    .filename = "{epoch}"});
    fg_fabric *f =
        fg_fabric_new(&(fg_fabric_config){.devices = "1", .sharded.state_dict_type = sdt});
    CHECK_MSG(f && ck, "%s", fg_last_error());
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = epochs,
                                                      .fabric = f,
                                                      .callbacks = &ck,
                                                      .ncallbacks = 1,
                                                      .enable_progress_bar = FG_OFF,
                                                      .logger = FG_OFF,
                                                      .num_sanity_val_steps = FG_COUNT(0)});
    CHECK_MSG(t, "%s", fg_last_error());
    memset(r, 0, sizeof *r);
    if (t) CHECK_MSG(fg_trainer_fit(t, &lm, tl, vl, ckpt_path) == FG_OK, "%s", fg_last_error());
    if (t) r->step = fg_trainer_global_step(t);
    snprintf(r->best, sizeof r->best, "%s", fg_model_checkpoint_best_path(ck));
    tu_list(dir, "", r->files, sizeof r->files);
    fg_trainer_free(t);
    fg_callback_free(ck);
    fg_fabric_free(f);
    fg_dataloader_free(tl);
    fg_dataloader_free(vl);
    fg_dataset_free(tr);
    fg_dataset_free(va);
    fg_module_free(m.net);
}

static bool is_sharded(const char *path) {
    char index[800];
    snprintf(index, sizeof index, "%s/%s", path, FG_ST_INDEX_NAME);
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode) && stat(index, &sb) == 0;
}

TEST(model_checkpoint_keeps_and_removes_folders) {
    const char *d = tu_subdir("sharded");
    char dir[512], fdir[512];
    snprintf(dir, sizeof dir, "%s", d);
    snprintf(fdir, sizeof fdir, "%s", tu_subdir("full"));
    out s, f;
    fit(FG_STATE_DICT_SHARDED, dir, NULL, 6, &s);
    fit(FG_STATE_DICT_FULL, fdir, NULL, 6, &f);
    /* the two lowest of 0.5 0.4 0.6 0.3 0.45 0.35 (epochs 3 and 5), and last */
    CHECK_MSG(!strcmp(s.files, "epoch=3.safetensors epoch=5.safetensors last.safetensors"), "%s",
              s.files);
    CHECK_MSG(!strcmp(s.files, f.files), "%s vs %s", s.files, f.files);
    const char *names[] = {"epoch=3.safetensors", "epoch=5.safetensors", "last.safetensors"};
    for (int i = 0; i < 3; i++) {
        char p[700], q[700];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        snprintf(q, sizeof q, "%s/%s", fdir, names[i]);
        CHECK_MSG(is_sharded(p), "%s is not a sharded folder", p);
        /* the same tensors, bitwise, as the full file of the same run */
        fg_st_file *a = fg_st_open(p), *b = fg_st_open(q);
        CHECK_MSG(a && b, "%s", fg_last_error());
        if (a && b) {
            CHECK(fg_st_count(a) == fg_st_count(b));
            int bad = 0;
            for (int64_t k = 0; k < fg_st_count(a); k++) {
                fg_st_info x, y;
                fg_st_info_at(a, k, &x);
                int64_t j = fg_st_find(b, x.name);
                if (j < 0 || fg_st_info_at(b, j, &y) != FG_OK || x.nbytes != y.nbytes ||
                    memcmp(fg_st_data(a, k), fg_st_data(b, j), x.nbytes))
                    bad++;
            }
            CHECK_MSG(bad == 0, "%s: %d tensors differ from the full file", names[i], bad);
        }
        fg_st_close(a);
        fg_st_close(b);
    }
    /* resumed from the best folder and from the best file: the same end */
    out rs, rf;
    char bs[700], bf[700], d2[512], d3[512];
    snprintf(bs, sizeof bs, "%s/epoch=3.safetensors", dir);
    snprintf(bf, sizeof bf, "%s/epoch=3.safetensors", fdir);
    snprintf(d2, sizeof d2, "%s", tu_subdir("resume-sharded"));
    snprintf(d3, sizeof d3, "%s", tu_subdir("resume-full"));
    fit(FG_STATE_DICT_SHARDED, d2, bs, 8, &rs);
    fit(FG_STATE_DICT_FULL, d3, bf, 8, &rf);
    CHECK(rs.step == rf.step && rs.step > 0);
    char p[700], q[700];
    snprintf(p, sizeof p, "%s/last.safetensors", d2);
    snprintf(q, sizeof q, "%s/last.safetensors", d3);
    fg_st_file *a = fg_st_open(p), *b = fg_st_open(q);
    CHECK_MSG(a && b, "%s", fg_last_error());
    int bad = 0;
    for (int64_t k = 0; a && b && k < fg_st_count(a); k++) {
        fg_st_info x;
        fg_st_info_at(a, k, &x);
        int64_t j = fg_st_find(b, x.name);
        if (j < 0 || memcmp(fg_st_data(a, k), fg_st_data(b, j), x.nbytes)) bad++;
    }
    CHECK_MSG(bad == 0, "resumed runs: %d tensors differ", bad);
    fg_st_close(a);
    fg_st_close(b);
}
