/* The TensorBoard logger's event files, read back record by record: the
 * TFRecord framing (both CRCs, recomputed here bit by bit, independent of
 * the logger's table), then each Event through protobuf-c: "brain.Event:2"
 * first, the hparams plugin's session start info with typed values,
 * hp_metric, and every scalar at the step and with the value the CSV logger
 * beside it wrote. Also the folders (version_N, named versions, a prefix),
 * refusals, and fast_dev_run writing nothing.
 *
 * With FULGUR_TB_OUT set, the test tb_write_run leaves a run there for
 * tests/trainer/test_tb_tensorboard.sh (TensorBoard's own reader). */
#include <math.h>

#include "tb_event.pb-c.h"
#include "trainer_test_util.h"

typedef struct fixture {
    fg_dataset *tr, *va;
    fg_dataloader *tl, *vl;
    tu_module m;
    fg_lightning_module lm;
} fixture;

static void fx_init(fixture *f, int64_t ntrain) {
    tu_clean_env();
    f->tr = tu_dataset(ntrain, 11);
    f->va = tu_dataset(12, 12);
    f->tl = tu_loader(f->tr, 4, true);
    f->vl = tu_loader(f->va, 4, false);
    tu_module_init(&f->m);
    f->lm = tu_lm(&f->m);
}

static void fx_free(fixture *f) {
    fg_dataloader_free(f->tl);
    fg_dataloader_free(f->vl);
    fg_dataset_free(f->tr);
    fg_dataset_free(f->va);
    fg_module_free(f->m.net);
}

/* CRC-32C bit by bit (Castagnoli, reflected 0x82f63b78), and TFRecord's mask. */
static uint32_t crc32c_bitwise(const unsigned char *p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1)));
    }
    return ~c;
}
static uint32_t masked(const unsigned char *p, size_t n) {
    uint32_t c = crc32c_bitwise(p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}
static uint64_t get_le(const unsigned char *p, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* The events of one file, unpacked; NULL events on a framing error (the
 * failed check is reported). */
typedef struct events {
    FgTb__Event **ev;
    int n;
} events;

static events read_events(const char *path) {
    events e = {0};
    FILE *fp = fopen(path, "rb");
    CHECK_MSG(fp != NULL, "cannot open %s", path ? path : "(null)");
    if (!fp) return e;
    e.ev = calloc(4096, sizeof *e.ev);
    unsigned char head[12], tail[4];
    while (e.n < 4096 && fread(head, 1, 12, fp) == 12) {
        uint64_t len = get_le(head, 8);
        CHECK_MSG(get_le(head + 8, 4) == masked(head, 8), "record %d: bad length CRC", e.n);
        unsigned char *data = malloc(len ? len : 1);
        bool whole = fread(data, 1, len, fp) == len && fread(tail, 1, 4, fp) == 4;
        CHECK_MSG(whole, "record %d: truncated", e.n);
        if (!whole) {
            free(data);
            break;
        }
        CHECK_MSG(get_le(tail, 4) == masked(data, len), "record %d: bad data CRC", e.n);
        e.ev[e.n] = fg_tb__event__unpack(NULL, len, data);
        CHECK_MSG(e.ev[e.n] != NULL, "record %d: not an Event", e.n);
        free(data);
        if (!e.ev[e.n]) break;
        e.n++;
    }
    fclose(fp);
    return e;
}

static void free_events(events *e) {
    for (int i = 0; i < e->n; i++) fg_tb__event__free_unpacked(e->ev[i], NULL);
    free(e->ev);
}

/* The scalar of event i, if it is one: its tag into *tag. */
static bool scalar_of(const FgTb__Event *ev, const char **tag, float *v) {
    if (ev->what_case != FG_TB__EVENT__WHAT_SUMMARY || ev->summary->n_value != 1) return false;
    const FgTb__Summary__Value *val = ev->summary->value[0];
    if (val->value_case != FG_TB__SUMMARY__VALUE__VALUE_SIMPLE_VALUE) return false;
    *tag = val->tag;
    *v = val->simple_value;
    return true;
}

/* The one event file in dir (its path into out). */
static bool event_file(const char *dir, char *out, size_t cap) {
    char names[1024];
    tu_list(dir, "", names, sizeof names);
    const char *p = strstr(names, "events.out.tfevents.");
    if (!p) return false;
    size_t len = strcspn(p, " ");
    snprintf(out, cap, "%s/%.*s", dir, (int)len, p);
    return strstr(p + len, "events.out.tfevents.") == NULL;
}

TEST(crc32c_known_values) {
    /* the CRC-32C check value (RFC 3720's test vector "123456789") */
    CHECK(crc32c_bitwise((const unsigned char *)"123456789", 9) == 0xe3069283u);
    unsigned char zeros[32] = {0};
    CHECK(crc32c_bitwise(zeros, 32) == 0x8a9136aau); /* RFC 3720 B.4: 32 bytes of zeros */
}

/* One fit with a TensorBoard and a CSV logger, in one run folder: every
 * CSV cell is a scalar event at the same step with the same value (as a
 * float). */
static void check_run(const char *root, bool with_hparams) {
    char tbdir[1024], csvdir[1024], path[1200];
    snprintf(tbdir, sizeof tbdir, "%s/lightning_logs/version_0", root);
    snprintf(csvdir, sizeof csvdir, "%s/lightning_logs/version_0", root); /* one run, one folder */
    CHECK_MSG(event_file(tbdir, path, sizeof path), "no single event file in %s", tbdir);
    /* <time>.<host>.<pid>.<n>: ten digits of seconds first */
    const char *name = strrchr(path, '/') + 1 + strlen("events.out.tfevents.");
    CHECK(strspn(name, "0123456789") == 10 && name[10] == '.');
    events e = read_events(path);
    CHECK(e.n > 3);
    if (e.n < 3) {
        free_events(&e);
        return;
    }
    CHECK(e.ev[0]->what_case == FG_TB__EVENT__WHAT_FILE_VERSION &&
          !strcmp(e.ev[0]->file_version, "brain.Event:2") && e.ev[0]->step == 0);
    for (int i = 0; i < e.n; i++) CHECK(e.ev[i]->wall_time > 1.5e9); /* seconds since 1970 */
    int next = 1;
    if (with_hparams) {
        const char *tag;
        float v;
        CHECK(scalar_of(e.ev[1], &tag, &v) && !strcmp(tag, "hp_metric") && v == -1 &&
              e.ev[1]->step == 0);
        const FgTb__Summary__Value *val = e.ev[2]->summary->value[0];
        CHECK(!strcmp(val->tag, "_hparams_/session_start_info"));
        CHECK(val->metadata && val->metadata->plugin_data &&
              !strcmp(val->metadata->plugin_data->plugin_name, "hparams"));
        FgTb__HParamsPluginData *pd =
            fg_tb__hparams_plugin_data__unpack(NULL, val->metadata->plugin_data->content.len,
                                               val->metadata->plugin_data->content.data);
        CHECK(pd && pd->data_case == FG_TB__HPARAMS_PLUGIN_DATA__DATA_SESSION_START_INFO);
        if (pd && pd->session_start_info) {
            const FgTb__SessionStartInfo *ssi = pd->session_start_info;
            CHECK(ssi->n_hparams == 3);
            for (size_t i = 0; i < ssi->n_hparams; i++) {
                const FgTb__HParamEntry *h = ssi->hparams[i];
                if (!strcmp(h->key, "lr"))
                    CHECK(h->value->kind_case == FG_TB__PROTO_VALUE__KIND_NUMBER_VALUE &&
                          h->value->number_value == 0.1);
                else if (!strcmp(h->key, "model"))
                    CHECK(h->value->kind_case == FG_TB__PROTO_VALUE__KIND_STRING_VALUE &&
                          !strcmp(h->value->string_value, "mlp"));
                else if (!strcmp(h->key, "amsgrad"))
                    CHECK(h->value->kind_case == FG_TB__PROTO_VALUE__KIND_BOOL_VALUE &&
                          !h->value->bool_value);
                else CHECK_MSG(false, "hparam %s", h->key);
            }
        }
        fg_tb__hparams_plugin_data__free_unpacked(pd, NULL);
        next = 3;
    }
    /* metrics.csv: header, then rows; each non-empty cell must be event k, in order */
    snprintf(path, sizeof path, "%s/metrics.csv", csvdir);
    char *csv = tu_read(path);
    CHECK(csv != NULL);
    int matched = 0;
    if (csv) {
        char *cols[16];
        int ncol = 0;
        char *line = csv, *eol = strstr(line, "\r\n");
        *eol = '\0';
        for (char *tok = strtok(line, ","); tok && ncol < 16; tok = strtok(NULL, ","))
            cols[ncol++] = tok;
        int stepcol = -1;
        for (int i = 0; i < ncol; i++)
            if (!strcmp(cols[i], "step")) stepcol = i;
        CHECK(stepcol >= 0);
        for (line = eol + 2; stepcol >= 0 && *line; line = eol + 2) {
            eol = strstr(line, "\r\n");
            *eol = '\0';
            char *cell[16];
            int nc = 0;
            for (char *p = line; nc < 16;) {
                cell[nc++] = p;
                char *comma = strchr(p, ',');
                if (!comma) break;
                *comma = '\0';
                p = comma + 1;
            }
            int64_t step = atoll(cell[stepcol]);
            /* the CSV row's names in the logger's order are not the header's: find each */
            for (int i = 0; i < nc; i++) {
                if (i == stepcol || !cell[i][0]) continue;
                bool found = false;
                for (int k = next; k < e.n && !found; k++) {
                    const char *tag;
                    float v;
                    if (e.ev[k]->step == step && scalar_of(e.ev[k], &tag, &v) &&
                        !strcmp(tag, cols[i]) && v == (float)strtod(cell[i], NULL))
                        found = true;
                }
                CHECK_MSG(found, "no event %s=%s at step %lld", cols[i], cell[i], (long long)step);
                matched++;
            }
        }
        free(csv);
    }
    /* every event after the header ones is a scalar of the CSV's */
    CHECK_MSG(matched == e.n - next, "%d CSV cells, %d scalar events", matched, e.n - next);
    /* steps never go back within a row's events, and the loss rows sit at Lightning's steps */
    int nloss = 0;
    for (int k = next; k < e.n; k++) {
        const char *tag;
        float v;
        if (scalar_of(e.ev[k], &tag, &v) && !strcmp(tag, "loss_step")) {
            CHECK_MSG(e.ev[k]->step == 4 + 5 * nloss, "loss_step %d at %lld", nloss,
                      (long long)e.ev[k]->step);
            nloss++;
        }
    }
    CHECK(nloss == 4);
    free_events(&e);
    snprintf(path, sizeof path, "%s/hparams.yaml", tbdir);
    char *yaml = tu_read(path);
    if (with_hparams)
        CHECK_MSG(yaml && !strcmp(yaml, "amsgrad: false\nlr: 0.1\nmodel: mlp\n"), "%s",
                  yaml ? yaml : "");
    else CHECK(yaml && !strcmp(yaml, "{}\n"));
    free(yaml);
}

static void fit_two_loggers(const char *root, bool with_hparams) {
    fixture f = {.m = {.log_train = true, .log_val = true}};
    fx_init(&f, 40);
    static const fg_kv hp[] = {{"lr", "0.1"}, {"model", "mlp"}, {"amsgrad", "false"}};
    if (with_hparams) {
        f.lm.hparams = hp;
        f.lm.nhparams = 3;
    }
    fg_logger *lg[2] = {
        fg_tensorboard_logger_new(root, &(fg_tensorboard_logger_opts){.max_queue = 3}),
        fg_csv_logger_new(&(fg_csv_logger_opts){.save_dir = root})};
    CHECK(lg[0] && lg[1]);
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 2,
                                                      .devices = "1",
                                                      .log_every_n_steps = 5,
                                                      .default_root_dir = root,
                                                      .loggers = lg,
                                                      .nloggers = 2,
                                                      .enable_progress_bar = FG_OFF});
    CHECK_OK(fg_trainer_fit(t, &f.lm, f.tl, f.vl, NULL));
    char want[1024];
    snprintf(want, sizeof want, "%s/lightning_logs/version_0", root);
    /* the first logger's folder is the trainer's: checkpoints go there */
    CHECK_MSG(!strcmp(fg_trainer_log_dir(t), want), "%s", fg_trainer_log_dir(t));
    CHECK(fg_logger_log_dir(lg[0]) && !strcmp(fg_logger_log_dir(lg[0]), want));
    CHECK(fg_tensorboard_logger_file(lg[0]) != NULL);
    CHECK(fg_tensorboard_logger_file(lg[1]) == NULL);
    /* one run, one version: the CSV logger without a version of its own
     * shares the TensorBoard logger's folder */
    CHECK_MSG(fg_logger_log_dir(lg[1]) && !strcmp(fg_logger_log_dir(lg[1]), want), "%s",
              fg_logger_log_dir(lg[1]) ? fg_logger_log_dir(lg[1]) : "(none)");
    fg_trainer_free(t);
    fg_logger_free(lg[0]);
    fg_logger_free(lg[1]);
    fx_free(&f);
}

TEST(tb_events_match_the_csv) {
    const char *root = tu_subdir("tb");
    char r[512];
    snprintf(r, sizeof r, "%s", root);
    fit_two_loggers(r, true);
    check_run(r, true);
}

TEST(tb_without_hparams) {
    const char *root = tu_subdir("tb-nohp");
    char r[512];
    snprintf(r, sizeof r, "%s", root);
    fit_two_loggers(r, false);
    check_run(r, false);
}

TEST(tb_named_version_prefix_no_hp_metric) {
    fixture f = {.m = {.log_train = true}};
    fx_init(&f, 8);
    const char *root = tu_subdir("tb-named");
    char r[512];
    snprintf(r, sizeof r, "%s", root);
    static const fg_kv hp[] = {{"width", "8"}};
    f.lm.hparams = hp;
    f.lm.nhparams = 1;
    fg_logger *lg = fg_tensorboard_logger_new(
        r, &(fg_tensorboard_logger_opts){
               .name = "", .version = "run-a", .prefix = "tr", .default_hp_metric = FG_OFF});
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 1,
                                                      .devices = "1",
                                                      .log_every_n_steps = 1,
                                                      .loggers = &lg,
                                                      .nloggers = 1,
                                                      .enable_checkpointing = FG_OFF,
                                                      .enable_progress_bar = FG_OFF});
    CHECK_OK(fg_trainer_fit(t, &f.lm, f.tl, NULL, NULL));
    char dir[1024], path[1200];
    snprintf(dir, sizeof dir, "%s/run-a", r);
    CHECK(fg_logger_log_dir(lg) && !strcmp(fg_logger_log_dir(lg), dir));
    CHECK(event_file(dir, path, sizeof path));
    events e = read_events(path);
    /* brain.Event:2, the session start info, then the two steps' loss_step and epoch, and
     * the epoch row's loss_epoch and epoch: all prefixed */
    CHECK_MSG(e.n == 8, "%d events", e.n);
    if (e.n == 8) {
        CHECK(!strcmp(e.ev[1]->summary->value[0]->tag, "_hparams_/session_start_info"));
        static const char *const tags[] = {"tr-loss_step", "tr-epoch",      "tr-loss_step",
                                           "tr-epoch",     "tr-loss_epoch", "tr-epoch"};
        static const int64_t steps[] = {0, 0, 1, 1, 1, 1};
        for (int k = 2; k < 8; k++) {
            const char *tag = "";
            float v = NAN;
            CHECK(scalar_of(e.ev[k], &tag, &v));
            CHECK_MSG(!strcmp(tag, tags[k - 2]) && e.ev[k]->step == steps[k - 2],
                      "event %d: %s at %lld", k, tag, (long long)e.ev[k]->step);
            if (!strcmp(tag, "tr-epoch")) CHECK(v == 0);
        }
    }
    free_events(&e);
    fg_trainer_free(t);
    fg_logger_free(lg);
    fx_free(&f);
}

TEST(tb_refusals_and_fast_dev_run) {
    CHECK(fg_tensorboard_logger_new(".", &(fg_tensorboard_logger_opts){.version = ""}) == NULL);
    CHECK(fg_last_status() == FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "version=\"\"");
    CHECK(fg_tensorboard_logger_new(".", &(fg_tensorboard_logger_opts){.version = "a/b"}) == NULL);
    CHECK_CONTAINS(fg_last_error(), "version=\"a/b\"");
    CHECK(fg_tensorboard_logger_new(".", &(fg_tensorboard_logger_opts){.max_queue = -1}) == NULL);
    CHECK_CONTAINS(fg_last_error(), "max_queue=-1");
    fg_logger_free(NULL);
    CHECK(fg_tensorboard_logger_file(NULL) == NULL);

    fixture f = {.m = {.log_train = true}};
    fx_init(&f, 8);
    const char *root = tu_subdir("tb-fdr");
    char r[512];
    snprintf(r, sizeof r, "%s", root);
    fg_logger *lg = fg_tensorboard_logger_new(r, NULL);
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.fast_dev_run = 2,
                                                      .devices = "1",
                                                      .loggers = &lg,
                                                      .nloggers = 1,
                                                      .enable_progress_bar = FG_OFF});
    CHECK_OK(fg_trainer_fit(t, &f.lm, f.tl, NULL, NULL));
    char names[256];
    tu_list(r, "", names, sizeof names);
    CHECK_MSG(names[0] == '\0', "fast_dev_run wrote %s", names);
    fg_trainer_free(t);
    fg_logger_free(lg);
    fx_free(&f);
}

/* A run left in $FULGUR_TB_OUT (TensorBoard and CSV loggers sharing one
 * folder) for the Python check; skipped without it. */
TEST(tb_write_run) {
    const char *out = getenv("FULGUR_TB_OUT");
    if (!out || !*out) SKIP("FULGUR_TB_OUT is not set (test_tb_tensorboard.sh sets it)");
    fixture f = {.m = {.log_train = true, .log_val = true}};
    fx_init(&f, 40);
    static const fg_kv hp[] = {{"lr", "0.1"}, {"model", "mlp"}};
    f.lm.hparams = hp;
    f.lm.nhparams = 2;
    fg_logger *lg[2] = {
        fg_tensorboard_logger_new(out, &(fg_tensorboard_logger_opts){.version = "run"}),
        fg_csv_logger_new(&(fg_csv_logger_opts){.save_dir = out, .version = "run"})};
    fg_trainer *t = fg_trainer_new(&(fg_trainer_opts){.max_epochs = 3,
                                                      .devices = "1",
                                                      .log_every_n_steps = 2,
                                                      .default_root_dir = out,
                                                      .loggers = lg,
                                                      .nloggers = 2,
                                                      .enable_checkpointing = FG_OFF,
                                                      .enable_progress_bar = FG_OFF});
    CHECK_OK(fg_trainer_fit(t, &f.lm, f.tl, f.vl, NULL));
    fg_trainer_free(t);
    fg_logger_free(lg[0]);
    fg_logger_free(lg[1]);
    fx_free(&f);
}
