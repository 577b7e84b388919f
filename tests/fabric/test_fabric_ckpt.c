/* fabric save/load of a program's own metadata (fg_train_state.meta): the
 * pairs land in the file's __metadata__ beside the fabric's keys, come back
 * from fg_fabric_load as st.meta and through fg_fabric_loaded_meta, owned by
 * the fabric until the next successful load; keys the fabric writes itself,
 * empty, NULL and repeated keys are refused before anything is written; a
 * load checks every counter of the fabric's (type, range, agreement) before
 * it changes anything: the crafted files of tests/ckpt/crafted/meta_*
 * (make_crafted.py) fail with the expected message naming the file, and a
 * real checkpoint with one counter rewritten leaves the model, optimizer
 * and state as they were. One rank, strategy single (the run function runs
 * in this process). */
#include <stdio.h>
#include <sys/stat.h>

#include "fulgur/ckpt.h"
#include "fulgur/fabric.h"
#include "fulgur/optim.h"
#include "harness.h"
#include "st_rewrite.h"

static char g_dir[256];

static const char *tmp_path(const char *name) {
    static char buf[512];
    if (!g_dir[0]) snprintf(g_dir, sizeof g_dir, "/tmp/fulgur-fabric-ckpt-%d", (int)getpid());
    mkdir(g_dir, 0700); /* again after a test removed it */
    snprintf(buf, sizeof buf, "%s/%s", g_dir, name);
    return buf;
}

static fg_module *tiny_mlp(uint64_t seed) {
    return fg_mlp_new(&(fg_mlp_config){.sizes = {3, 4, 2}, .seed = seed});
}

static int meta_round_trip(fg_fabric *f, void *arg) {
    (void)arg;
    fg_module *m = tiny_mlp(1);
    fg_optimizer *opt = fg_sgd_new(m, &(fg_sgd_opts){.lr = 0.1});
    CHECK(m && opt);
    if (!m || !opt) return 1;
    char path[512], path2[512];
    snprintf(path, sizeof path, "%s", tmp_path("a.safetensors"));
    snprintf(path2, sizeof path2, "%s", tmp_path("b.safetensors"));
    fg_kv meta[] = {{"config", "{\"model\":\"mlp\",\"in_dim\":3}"}, {"note", "caf\xc3\xa9"}};
    CHECK_OK(fg_fabric_save(
        f, path,
        &(fg_train_state){.model = m, .optimizer = opt, .step = 7, .meta = meta, .nmeta = 2}));
    /* in the file, as plain safetensors metadata */
    fg_st_file *file = fg_st_open(path);
    CHECK_MSG(file != NULL, "%s", fg_last_error());
    if (file) {
        CHECK(!strcmp(fg_st_meta_get(file, "config"), meta[0].value));
        CHECK(!strcmp(fg_st_meta_get(file, "note"), "caf\xc3\xa9"));
        CHECK(!strcmp(fg_st_meta_get(file, "step"), "7"));
        fg_st_close(file);
    }
    /* refused, and nothing written */
    fg_kv own[] = {{"note", "x"}, {"step", "9"}};
    fg_kv twice[] = {{"a", "1"}, {"a", "2"}};
    fg_kv empty[] = {{"", "1"}};
    fg_kv null_value[] = {{"a", NULL}};
    fg_kv bad_utf8[] = {{"a", "\xff"}};
    struct {
        const fg_kv *kv;
        int64_t n;
        const char *words;
    } bad[] = {{own, 2, "\"step\" is one the fabric writes itself"},
               {twice, 2, "given twice"},
               {empty, 1, "empty key"},
               {null_value, 1, "NULL value"},
               {NULL, 1, "nmeta"},
               {meta, -1, "nmeta"},
               {bad_utf8, 1, "UTF-8"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fg_status s = fg_fabric_save(
            f, path2, &(fg_train_state){.model = m, .meta = bad[i].kv, .nmeta = bad[i].n});
        CHECK_MSG(s == FG_EINVAL, "case %zu: %s (%s)", i, fg_status_str(s), fg_last_error());
        CHECK_CONTAINS(fg_last_error(), bad[i].words);
        struct stat sb;
        CHECK_MSG(stat(path2, &sb) != 0, "case %zu wrote the file", i);
    }
    /* load: st.meta is the whole metadata, owned by the fabric */
    CHECK(fg_fabric_loaded_meta(f, "note") == NULL); /* no load yet */
    fg_module *m2 = tiny_mlp(2);
    fg_train_state st = {.model = m2};
    CHECK_OK(fg_fabric_load(f, path, &st));
    CHECK(st.step == 7 && st.nmeta >= 2);
    int found = 0;
    for (int64_t i = 0; i < st.nmeta; i++) {
        if (!strcmp(st.meta[i].key, "note")) found += !strcmp(st.meta[i].value, "caf\xc3\xa9");
        if (!strcmp(st.meta[i].key, "format")) found++;
    }
    CHECK(found == 2);
    const char *note = fg_fabric_loaded_meta(f, "note");
    CHECK(note && !strcmp(note, "caf\xc3\xa9"));
    CHECK(fg_fabric_loaded_meta(f, "absent") == NULL);
    CHECK(fg_fabric_loaded_meta(f, NULL) == NULL);
    /* a failed load keeps the previous metadata and st as they were */
    fg_train_state st2 = st;
    CHECK(fg_fabric_load(f, tmp_path("missing.safetensors"), &st2) == FG_EIO);
    CHECK(st2.meta == st.meta && st2.nmeta == st.nmeta && st2.step == 7);
    CHECK(fg_fabric_loaded_meta(f, "note") == note);
    /* a checkpoint saved without meta loads with the fabric's keys only */
    CHECK_OK(fg_fabric_save(f, path2, &(fg_train_state){.model = m}));
    CHECK_OK(fg_fabric_load(f, path2, &st));
    CHECK(fg_fabric_loaded_meta(f, "note") == NULL);
    CHECK(fg_fabric_loaded_meta(f, "format") != NULL);
    fg_optimizer_free(opt);
    fg_module_free(m);
    fg_module_free(m2);
    remove(path);
    remove(path2);
    return 0;
}

/* A safetensors file of another format (Hugging Face writes "pt"; a shard
 * of a sharded save has its own) is refused with a message that names the
 * format read from the file and what to pass instead. The format string
 * lives in the file's header: the message must be built before the close
 * (AddressSanitizer caught a use after free here). */
static int foreign_format(fg_fabric *f, void *arg) {
    (void)arg;
    fg_module *m = tiny_mlp(1);
    CHECK(m != NULL);
    if (!m) return 1;
    struct {
        const char *format, *words[3];
    } cases[] = {
        {"pt", {"metadata \"format\" is \"pt\"", "fulgur-checkpoint-1", "pass a checkpoint"}},
        {"fulgur-checkpoint-shard-1",
         {"one shard of a sharded checkpoint", "\"fulgur-checkpoint-shard-1\"",
          "pass the folder that holds it and model.safetensors.index.json"}},
        {NULL, {"\"format\" is missing", "fulgur-checkpoint-1", "pass a checkpoint"}},
        {"\x1b[2Jxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
         {"\"?[2Jxxx", "xxx...\"", "fulgur-checkpoint-1"}},
    };
    const float w[2] = {1, 2};
    const int64_t shape[1] = {2};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s", tmp_path("foreign.safetensors"));
        fg_st_writer *wr = fg_st_writer_new();
        CHECK(wr != NULL);
        if (!wr) break;
        CHECK_OK(fg_st_writer_add(wr, "weight", FG_F32, 1, shape, w));
        if (cases[i].format) CHECK_OK(fg_st_writer_set_meta(wr, "format", cases[i].format));
        CHECK_OK(fg_st_writer_write(wr, path));
        fg_st_writer_free(wr);
        fg_train_state st = {.model = m};
        fg_status s = fg_fabric_load(f, path, &st);
        CHECK_MSG(s == FG_EFORMAT, "case %zu: %s (%s)", i, fg_status_str(s), fg_last_error());
        CHECK_CONTAINS(fg_last_error(), path);
        for (int k = 0; k < 3; k++) CHECK_CONTAINS(fg_last_error(), cases[i].words[k]);
        CHECK_MSG(!strchr(fg_last_error(), '\x1b'), "case %zu: %s", i, fg_last_error());
        remove(path);
    }
    fg_module_free(m);
    return 0;
}

TEST(foreign_format_is_named_after_the_close) {
    fg_fabric *f = fg_fabric_new(&(fg_fabric_config){.devices = "1", .strategy = "single"});
    CHECK_MSG(f != NULL, "%s", fg_last_error());
    if (!f) return;
    CHECK(fg_fabric_launch(f, foreign_format, NULL) == 0);
    fg_fabric_free(f);
    rmdir(g_dir);
}

static int meta_checked(fg_fabric *f, void *arg) {
    (void)arg;
    fg_module *m = tiny_mlp(1), *m2 = tiny_mlp(2), *fresh = tiny_mlp(2);
    fg_optimizer *opt = fg_sgd_new(m, &(fg_sgd_opts){.lr = 0.1});
    fg_optimizer *opt2 = fg_sgd_new(m2, &(fg_sgd_opts){.lr = 0.5});
    CHECK(m && m2 && fresh && opt && opt2);
    if (!m || !m2 || !fresh || !opt || !opt2) return 1;
    /* the crafted files */
    FILE *ex = fopen(fg_test_path("ckpt/crafted/meta_expect.tsv"), "r");
    CHECK(ex != NULL);
    char line[1024];
    int n = 0;
    while (ex && fgets(line, sizeof line, ex)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        line[strcspn(line, "\n")] = '\0';
        char *tab = strchr(line, '\t');
        if (!tab) continue;
        *tab = '\0';
        const char *want = tab + 1;
        char rel[1100];
        snprintf(rel, sizeof rel, "ckpt/crafted/%s", line);
        fg_train_state st = {.model = m2, .optimizer = opt2, .step = 3};
        fg_status s = fg_fabric_load(f, fg_test_path(rel), &st);
        if (!strcmp(want, "FITS")) {
            CHECK_MSG(s == FG_EMISMATCH && strstr(fg_last_error(), "missing"), "%s: %s (%s)", line,
                      fg_status_str(s), fg_last_error());
        } else {
            CHECK_MSG(s == FG_EFORMAT, "%s: %s (%s)", line, fg_status_str(s), fg_last_error());
            CHECK_MSG(strstr(fg_last_error(), want), "%s: \"%s\" lacks \"%s\"", line,
                      fg_last_error(), want);
            CHECK_MSG(strstr(fg_last_error(), line), "%s: the message does not name the file: %s",
                      line, fg_last_error());
        }
        CHECK(st.step == 3 && st.meta == NULL);
        n++;
    }
    if (ex) fclose(ex);
    CHECK(n >= 25);
    /* a real checkpoint with one counter rewritten: nothing changes */
    char path[512], bad[512];
    snprintf(path, sizeof path, "%s", tmp_path("real.safetensors"));
    snprintf(bad, sizeof bad, "%s", tmp_path("edited.safetensors"));
    CHECK_OK(fg_fabric_save(f, path,
                            &(fg_train_state){.model = m,
                                              .optimizer = opt,
                                              .step = 7,
                                              .epoch = 1,
                                              .samples_in_epoch = 4,
                                              .global_batch = 2}));
    const char *edits[][3] = {{"step", "-5", "\"step\" is \"-5\""},
                              {"epoch", "abc", "\"epoch\" is \"abc\""},
                              {"samples_in_epoch", "-7", "\"samples_in_epoch\" is \"-7\""},
                              {"global_batch", "0", "\"global_batch\" is \"0\""},
                              {"lr", "nan", "\"lr\" is \"nan\""}};
    size_t bytes = (size_t)fg_tensor_numel(fg_module_flat_params(m2)) * sizeof(float);
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        rewrite_with(path, bad, edits[i][0], edits[i][1]);
        fg_train_state st = {.model = m2, .optimizer = opt2, .step = 3};
        CHECK_STATUS(fg_fabric_load(f, bad, &st), FG_EFORMAT);
        CHECK_CONTAINS(fg_last_error(), edits[i][2]);
        CHECK(st.step == 3 && st.epoch == 0 && st.meta == NULL);
        CHECK_MSG(!memcmp(fg_tensor_data(fg_module_flat_params(m2)),
                          fg_tensor_data(fg_module_flat_params(fresh)), bytes),
                  "%s = %s: the weights were loaded", edits[i][0], edits[i][1]);
        CHECK(fg_optimizer_lr(opt2) == 0.5 && fg_optimizer_step_count(opt2) == 0);
    }
    /* and a negative counter is not saved */
    CHECK_STATUS(fg_fabric_save(f, bad, &(fg_train_state){.model = m, .step = -5}), FG_EINVAL);
    fg_train_state st = {.model = m2, .optimizer = opt2};
    CHECK_OK(fg_fabric_load(f, path, &st));
    CHECK(st.step == 7 && st.epoch == 1 && st.samples_in_epoch == 4 && st.global_batch == 2);
    fg_optimizer_free(opt);
    fg_optimizer_free(opt2);
    fg_module_free(m);
    fg_module_free(m2);
    fg_module_free(fresh);
    remove(path);
    remove(bad);
    return 0;
}

/* A group's lr or weight decay the optimizer would refuse (negative, NaN)
 * makes the file bad: the load fails with FG_EFORMAT naming the key, before
 * it changes anything (weights, counters, the optimizer). */
static int group_settings_checked(fg_fabric *f, void *arg) {
    (void)arg;
    fg_module *m = tiny_mlp(1), *m2 = tiny_mlp(2), *fresh = tiny_mlp(2);
    size_t bytes = (size_t)fg_tensor_numel(fg_module_flat_params(m2)) * sizeof(float);
    fg_optimizer *opt = fg_sgd_new(m, &(fg_sgd_opts){.lr = 0.5});
    fg_optimizer *opt2 = fg_sgd_new(m2, &(fg_sgd_opts){.lr = 0.5});
    CHECK(fg_optimizer_add_param_group(opt, &(fg_param_group){.params = "*.bias", .lr = 0.25}) ==
          1);
    CHECK(fg_optimizer_add_param_group(opt2, &(fg_param_group){.params = "*.bias", .lr = 0.25}) ==
          1);
    char path[512], bad[512];
    snprintf(path, sizeof path, "%s", tmp_path("groups.safetensors"));
    snprintf(bad, sizeof bad, "%s", tmp_path("groups_bad.safetensors"));
    CHECK_OK(fg_fabric_save(f, path, &(fg_train_state){.model = m, .optimizer = opt, .step = 2}));
    const char *edits[][2] = {{"lr.1", "-1"}, {"weight_decay.1", "-0.5"}, {"lr.1", "nan"}};
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        rewrite_with(path, bad, edits[i][0], edits[i][1]);
        fg_train_state st = {.model = m2, .optimizer = opt2, .step = 3};
        fg_status s = fg_fabric_load(f, bad, &st);
        CHECK_MSG(s == FG_EFORMAT, "%s = %s: %s (%s)", edits[i][0], edits[i][1], fg_status_str(s),
                  fg_last_error());
        char want[96];
        snprintf(want, sizeof want, "\"%s\" is \"%s\"", edits[i][0], edits[i][1]);
        CHECK_CONTAINS(fg_last_error(), want);
        CHECK_CONTAINS(fg_last_error(), bad);
        CHECK(st.step == 3 && st.meta == NULL);
        CHECK(fg_optimizer_group_lr(opt2, 1) == 0.25 && fg_optimizer_step_count(opt2) == 0);
        CHECK_MSG(!memcmp(fg_tensor_data(fg_module_flat_params(m2)),
                          fg_tensor_data(fg_module_flat_params(fresh)), bytes),
                  "%s = %s: the weights were loaded", edits[i][0], edits[i][1]);
    }
    fg_train_state st = {.model = m2, .optimizer = opt2};
    CHECK_OK(fg_fabric_load(f, path, &st));
    CHECK(st.step == 2 && fg_optimizer_group_lr(opt2, 1) == 0.25);
    fg_optimizer_free(opt);
    fg_optimizer_free(opt2);
    fg_module_free(m);
    fg_module_free(m2);
    fg_module_free(fresh);
    remove(path);
    remove(bad);
    return 0;
}

TEST(a_group_setting_the_optimizer_refuses_fails_the_load) {
    fg_fabric *f = fg_fabric_new(&(fg_fabric_config){.devices = "1", .strategy = "single"});
    CHECK_MSG(f != NULL, "%s", fg_last_error());
    if (!f) return;
    CHECK(fg_fabric_launch(f, group_settings_checked, NULL) == 0);
    fg_fabric_free(f);
}

TEST(a_load_checks_every_counter_before_it_changes_anything) {
    fg_fabric *f = fg_fabric_new(&(fg_fabric_config){.devices = "1", .strategy = "single"});
    CHECK_MSG(f != NULL, "%s", fg_last_error());
    if (!f) return;
    CHECK(fg_fabric_launch(f, meta_checked, NULL) == 0);
    fg_fabric_free(f);
}

TEST(meta_round_trip_and_refusals) {
    fg_fabric *f = fg_fabric_new(&(fg_fabric_config){.devices = "1", .strategy = "single"});
    CHECK_MSG(f != NULL, "%s", fg_last_error());
    if (!f) return;
    CHECK(fg_fabric_launch(f, meta_round_trip, NULL) == 0);
    fg_fabric_free(f);
    rmdir(g_dir);
}
