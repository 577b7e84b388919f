/* TensorBoardLogger, laid out as Lightning's: <save_dir>/<name>/<version>/
 * holds events.out.tfevents.<time>.<host>.<pid>.<n> (TFRecords of Event
 * protos, tb_record.c; the first Event is file_version "brain.Event:2",
 * then one Event per scalar: wall_time, step, summary { value { tag,
 * simple_value } }) and hparams.yaml. The protos are tb_event.proto's,
 * packed by protobuf-c.
 *
 * The trainer calls it on global rank 0 only. The run folder is chosen and
 * made when the trainer asks for it (the next free version_N); the event
 * file is opened at the first event. Events go through stdio's buffer and
 * are flushed every max_queue events and at finalize. With hparams and
 * default_hp_metric, log_hyperparams writes "hp_metric" = -1 at step 0 and
 * the hparams plugin's session start info, as Lightning's logger does. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tb_event.pb-c.h"
#include "trainer_impl.h"

typedef struct tb_logger {
    fg__run_folder f;
    bool hp_metric;
    int64_t max_queue, pending;
    char *file;
    FILE *fp;
    fg_status failed; /* a write failed: every later call reports it */
} tb_logger;

static void tb_free(void *ud) {
    tb_logger *c = ud;
    if (c->fp) fclose(c->fp);
    fg__run_folder_free(&c->f);
    fg_free(c->file);
    fg_free(c);
}

static const char *tb_log_dir(void *ud, const char *default_root_dir) {
    tb_logger *c = ud;
    return fg__run_folder_dir(&c->f, default_root_dir);
}

static const char *tb_version(void *ud) { return ((tb_logger *)ud)->f.vnum; }

static double wall_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One Event, packed and framed. */
static FG_MUST_USE fg_status put_event(tb_logger *c, FgTb__Event *ev) {
    size_t n = fg_tb__event__get_packed_size(ev);
    uint8_t small[512], *buf = n <= sizeof small ? small : fg_alloc(n);
    if (!buf) return FG_ENOMEM;
    fg_tb__event__pack(ev, buf);
    fg_status s = fg__tfrecord_write(c->fp, buf, n);
    if (buf != small) fg_free(buf);
    if (s != FG_OK) {
        c->failed = FG_EIO;
        return fg_error(FG_EIO, "TensorBoardLogger: writing %s: %s", c->file, strerror(errno));
    }
    if (++c->pending >= c->max_queue) {
        c->pending = 0;
        if (fflush(c->fp) != 0) {
            c->failed = FG_EIO;
            return fg_error(FG_EIO, "TensorBoardLogger: writing %s: %s", c->file, strerror(errno));
        }
    }
    return FG_OK;
}

/* Opens the event file (once) and writes its first Event. */
static FG_MUST_USE fg_status open_events(tb_logger *c) {
    if (c->failed) return fg_error(c->failed, "TensorBoardLogger: an earlier write failed");
    if (c->fp) return FG_OK;
    if (!c->f.log_dir) return fg_error(FG_ESTATE, "TensorBoardLogger: no run folder yet");
    static atomic_int uid;
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    double now = wall_time();
    size_t cap = strlen(c->f.log_dir) + strlen(host) + 96;
    c->file = fg_alloc(cap);
    if (!c->file) return FG_ENOMEM;
    snprintf(c->file, cap, "%s/events.out.tfevents.%010lld.%s.%d.%d", c->f.log_dir, (long long)now,
             host, (int)getpid(), atomic_fetch_add(&uid, 1));
    c->fp = fopen(c->file, "wb");
    if (!c->fp) {
        c->failed = FG_EIO;
        return fg_error(FG_EIO, "TensorBoardLogger: cannot write %s: %s", c->file, strerror(errno));
    }
    FgTb__Event ev = FG_TB__EVENT__INIT;
    ev.wall_time = now;
    ev.what_case = FG_TB__EVENT__WHAT_FILE_VERSION;
    ev.file_version = "brain.Event:2";
    return put_event(c, &ev);
}

static FG_MUST_USE fg_status scalar(tb_logger *c, const char *tag, double v, int64_t step) {
    FgTb__Summary__Value val = FG_TB__SUMMARY__VALUE__INIT;
    val.tag = (char *)tag;
    val.value_case = FG_TB__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
    val.simple_value = (float)v;
    FgTb__Summary__Value *vals[1] = {&val};
    FgTb__Summary sum = FG_TB__SUMMARY__INIT;
    sum.n_value = 1;
    sum.value = vals;
    FgTb__Event ev = FG_TB__EVENT__INIT;
    ev.wall_time = wall_time();
    ev.step = step;
    ev.what_case = FG_TB__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    return put_event(c, &ev);
}

static FG_MUST_USE fg_status tb_log_metrics(void *ud, const fg_metric *m, int64_t n, int64_t step) {
    tb_logger *c = ud;
    FG_TRY(open_events(c));
    for (int64_t i = 0; i < n; i++) {
        char *tag = fg__run_folder_key(&c->f, m[i].name);
        if (!tag) return FG_ENOMEM;
        fg_status s = scalar(c, tag, m[i].value, step);
        fg_free(tag);
        FG_TRY(s);
    }
    return FG_OK;
}

/* The hparams plugin's session start info: what TensorBoard's HPARAMS tab
 * shows for this run. Values that read as numbers or booleans are typed. */
static FG_MUST_USE fg_status hparams_summary(tb_logger *c) {
    int64_t n = c->f.nhp;
    FgTb__HParamEntry *ents = fg_calloc((size_t)n + 1, sizeof *ents);
    FgTb__HParamEntry **pents = fg_calloc((size_t)n + 1, sizeof *pents);
    FgTb__ProtoValue *vals = fg_calloc((size_t)n + 1, sizeof *vals);
    uint8_t *content = NULL;
    fg_status s = FG_ENOMEM;
    if (!ents || !pents || !vals) goto fail;
    for (int64_t i = 0; i < n; i++) {
        const char *v = c->f.hp[i].value;
        char *end;
        double x = strtod(v, &end);
        fg_tb__proto_value__init(&vals[i]);
        if (*v && !*end) {
            vals[i].kind_case = FG_TB__PROTO_VALUE__KIND_NUMBER_VALUE;
            vals[i].number_value = x;
        } else if (!strcmp(v, "true") || !strcmp(v, "True") || !strcmp(v, "false") ||
                   !strcmp(v, "False")) {
            vals[i].kind_case = FG_TB__PROTO_VALUE__KIND_BOOL_VALUE;
            vals[i].bool_value = v[0] == 't' || v[0] == 'T';
        } else {
            vals[i].kind_case = FG_TB__PROTO_VALUE__KIND_STRING_VALUE;
            vals[i].string_value = (char *)v;
        }
        fg_tb__hparam_entry__init(&ents[i]);
        ents[i].key = (char *)c->f.hp[i].key;
        ents[i].value = &vals[i];
        pents[i] = &ents[i];
    }
    FgTb__SessionStartInfo ssi = FG_TB__SESSION_START_INFO__INIT;
    ssi.n_hparams = (size_t)n;
    ssi.hparams = pents;
    ssi.start_time_secs = wall_time();
    FgTb__HParamsPluginData pd = FG_TB__HPARAMS_PLUGIN_DATA__INIT;
    pd.version = 0;
    pd.data_case = FG_TB__HPARAMS_PLUGIN_DATA__DATA_SESSION_START_INFO;
    pd.session_start_info = &ssi;
    size_t len = fg_tb__hparams_plugin_data__get_packed_size(&pd);
    if (!(content = fg_alloc(len + 1))) goto fail;
    fg_tb__hparams_plugin_data__pack(&pd, content);

    FgTb__SummaryMetadata__PluginData plugin = FG_TB__SUMMARY_METADATA__PLUGIN_DATA__INIT;
    plugin.plugin_name = "hparams";
    plugin.content = (ProtobufCBinaryData){len, content};
    FgTb__SummaryMetadata meta = FG_TB__SUMMARY_METADATA__INIT;
    meta.plugin_data = &plugin;
    FgTb__Summary__Value val = FG_TB__SUMMARY__VALUE__INIT;
    val.tag = "_hparams_/session_start_info";
    val.metadata = &meta;
    FgTb__Summary__Value *pv[1] = {&val};
    FgTb__Summary sum = FG_TB__SUMMARY__INIT;
    sum.n_value = 1;
    sum.value = pv;
    FgTb__Event ev = FG_TB__EVENT__INIT;
    ev.wall_time = wall_time();
    ev.what_case = FG_TB__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    s = put_event(c, &ev);
fail:
    fg_free(content);
    fg_free(vals);
    fg_free(pents);
    fg_free(ents);
    return s;
}

static FG_MUST_USE fg_status tb_log_hparams(void *ud, const fg_kv *hp, int64_t n) {
    tb_logger *c = ud;
    FG_TRY(fg__run_folder_add_hparams(&c->f, hp, n));
    if (n == 0) return FG_OK;
    FG_TRY(open_events(c));
    if (c->hp_metric) FG_TRY(scalar(c, "hp_metric", -1, 0));
    return hparams_summary(c);
}

static FG_MUST_USE fg_status tb_finalize(void *ud, const char *status) {
    (void)status;
    tb_logger *c = ud;
    if (!c->f.log_dir) return FG_OK;
    FG_TRY(open_events(c));
    c->pending = 0;
    if (fflush(c->fp) != 0) {
        c->failed = FG_EIO;
        return fg_error(FG_EIO, "TensorBoardLogger: writing %s: %s", c->file, strerror(errno));
    }
    return fg__run_folder_write_hparams(&c->f);
}

static const char *tb_dir_of(const void *ud) { return ((const tb_logger *)ud)->f.log_dir; }

fg_logger *fg_tensorboard_logger_new(const char *save_dir, const fg_tensorboard_logger_opts *opts) {
    fg_tensorboard_logger_opts o = opts ? *opts : (fg_tensorboard_logger_opts){0};
    if (o.max_queue < 0) {
        fg_error(FG_EINVAL, "TensorBoardLogger: max_queue=%lld: expected >= 1 (0 = 10)",
                 (long long)o.max_queue);
        return NULL;
    }
    if (o.default_hp_metric != FG_FLAG_DEFAULT && o.default_hp_metric != FG_ON &&
        o.default_hp_metric != FG_OFF) {
        fg_error(FG_EINVAL, "TensorBoardLogger: default_hp_metric=%d: expected FG_ON or FG_OFF",
                 (int)o.default_hp_metric);
        return NULL;
    }
    tb_logger *c = fg_calloc(1, sizeof *c);
    if (!c) return NULL;
    c->max_queue = o.max_queue ? o.max_queue : 10;
    c->hp_metric = o.default_hp_metric != FG_OFF;
    if (fg__run_folder_init(&c->f, "TensorBoardLogger", save_dir, o.name, o.version, o.prefix) !=
        FG_OK) {
        tb_free(c);
        return NULL;
    }
    fg_logger_ops ops = {.name = "TensorBoardLogger",
                         .log_hyperparams = tb_log_hparams,
                         .log_metrics = tb_log_metrics,
                         .finalize = tb_finalize,
                         .log_dir = tb_log_dir,
                         .version = tb_version,
                         .free = tb_free};
    fg_logger *lg = fg_logger_new(&ops, c);
    if (lg) {
        lg->dir_of = tb_dir_of;
        lg->folder = &c->f;
    }
    return lg;
}

const char *fg_tensorboard_logger_file(const fg_logger *lg) {
    if (!lg || lg->dir_of != tb_dir_of) return NULL;
    return ((const tb_logger *)lg->ud)->file;
}
