/* DeepSpeed JSON configurations (fg_deepspeed_config_read and the fabric's
 * deepspeed_config): the honoured keys land in the stage and the sharded
 * options; every key fulgur does not honour is an error naming it, an
 * unknown one with the nearest honoured key; the fabric picks the stage
 * from the file and refuses a strategy or an option that disagrees. The
 * activation_checkpointing section: Lightning's four keys honoured
 * (partition_activations and cpu_checkpointing into the options, which
 * only the deepspeed strategies take), the others refused by name. */
#include <math.h>
#include <stdio.h>

#include "fabric/fabric_impl.h"
#include "fulgur/optim.h"
#include "harness.h"

static char g_dir[] = "/tmp/fg-dsconfig-XXXXXX";

static const char *write_json(const char *name, const char *text) {
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    return path;
}

TEST(honoured_keys) {
    CHECK(mkdtemp(g_dir) != NULL);
    const char *p =
        write_json("ok.json", "{\"zero_allow_untested_optimizer\": true,\n"
                              " \"zero_optimization\": {\"stage\": 1,\n"
                              "   \"allgather_bucket_size\": 5e8,\n"
                              "   \"reduce_bucket_size\": 12345,\n"
                              "   \"overlap_comm\": false, \"contiguous_gradients\": true,\n"
                              "   \"reduce_scatter\": true, \"allgather_partitions\": true,\n"
                              "   \"ignore_unused_parameters\": true, \"cpu_offload\": false,\n"
                              "   \"offload_optimizer\": {\"device\": \"none\"},\n"
                              "   \"offload_param\": {\"device\": \"none\"}}}");
    int stage = -1;
    fg_sharded_opts o = {.reduce_bucket_size = 7};
    CHECK_OK(fg_deepspeed_config_read(p, &stage, &o));
    CHECK(stage == 1);
    CHECK(o.allgather_bucket_size == 500000000);
    CHECK(o.reduce_bucket_size == 12345);
    p = write_json("empty.json", "{}");
    CHECK_OK(fg_deepspeed_config_read(p, &stage, &o));
    CHECK(stage == 0 && o.reduce_bucket_size == 0 && o.allgather_bucket_size == 0);
    p = write_json("s2.json", "{\"zero_optimization\": {\"stage\": 2, \"overlap_comm\": true}}");
    CHECK_OK(fg_deepspeed_config_read(p, &stage, &o));
    CHECK(stage == 2);
    /* stage 3's parameter offload to the cpu: nothing to move, the device set */
    p = write_json("s3.json", "{\"zero_optimization\": {\"stage\": 3,\n"
                              "   \"offload_param\": {\"device\": \"cpu\"}}}");
    CHECK_OK(fg_deepspeed_config_read(p, &stage, &o));
    CHECK(stage == 3 && o.offload_params_device == FG_OFFLOAD_CPU);
}

/* file text -> the status and words of the error */
static void refused(const char *text, fg_status want, const char *words) {
    const char *p = write_json("bad.json", text);
    int stage = 0;
    fg_sharded_opts o;
    fg_status s = fg_deepspeed_config_read(p, &stage, &o);
    CHECK_MSG(s == want, "%s: status %d, want %d (%s)", text, (int)s, (int)want, fg_last_error());
    CHECK_MSG(strstr(fg_last_error(), words), "%s: \"%s\" lacks \"%s\"", text, fg_last_error(),
              words);
}

TEST(other_keys_are_errors_that_name_them) {
    refused("{\"zero_optimization\": {\"reduce_bucket_sise\": 5}}", FG_EINVAL,
            "unknown key \"zero_optimization.reduce_bucket_sise\" (the nearest key fulgur "
            "honours there is \"zero_optimization.reduce_bucket_size\")");
    refused("{\"zero_optimizaton\": {}}", FG_EINVAL,
            "unknown key \"zero_optimizaton\" (the nearest key fulgur honours there is "
            "\"zero_optimization\")");
    refused("{\"gradient_clipping\": 1.0}", FG_EINVAL,
            "\"gradient_clipping\" is not honoured by fulgur: clip with fg_fabric_clip_gradients");
    refused("{\"train_micro_batch_size_per_gpu\": 4}", FG_EINVAL,
            "\"train_micro_batch_size_per_gpu\" is not honoured");
    refused("{\"fp16\": {\"enabled\": true}}", FG_EINVAL, "precision");
    refused("{\"zero_optimization\": {\"stage3_max_live_parameters\": 1e9}}", FG_EINVAL,
            "\"zero_optimization.stage3_max_live_parameters\" is not honoured");
    refused("{\"zero_optimization\": {\"stage\": 2, \"overlap_comm\": false}}", FG_EINVAL,
            "\"zero_optimization.overlap_comm\": false is not honoured");
    refused("{\"zero_optimization\": {\"stage\": 1, \"overlap_comm\": true}}", FG_EINVAL,
            "\"zero_optimization.overlap_comm\": true is not honoured");
    refused("{\"zero_optimization\": {\"contiguous_gradients\": false}}", FG_EINVAL,
            "contiguous_gradients\": false is not honoured");
    refused("{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"nvme\"}}}",
            FG_EUNSUPPORTED,
            "offload_optimizer.device\" = \"nvme\": set nvme offload through the "
            "strategy's options");
    refused("{\"zero_optimization\": {\"offload_param\": {\"device\": \"nvme\"}}}", FG_EUNSUPPORTED,
            "offload_param.device\" = \"nvme\": set parameter offload through the strategy's "
            "options");
    refused("{\"zero_optimization\": {\"offload_param\": {\"device\": \"nvme\", \"nvme_path\": "
            "\"/x\"}}}",
            FG_EINVAL, "\"zero_optimization.offload_param.nvme_path\" is not honoured");
    refused("{\"zero_optimization\": {\"offload_optimizer\": {\"devcie\": \"none\"}}}", FG_EINVAL,
            "nearest key fulgur honours there is \"zero_optimization.offload_optimizer.device\"");
    refused("{\"zero_optimization\": {\"stage\": 0}}", FG_EINVAL, "use the strategy ddp");
    refused("{\"zero_optimization\": {\"stage\": 4}}", FG_EINVAL, "must be 0, 1, 2 or 3");
    refused("{\"zero_optimization\": {\"reduce_bucket_size\": 2.5}}", FG_EINVAL,
            "positive whole number");
    refused("{\"zero_optimization\": {\"reduce_bucket_size\": \"auto\"}}", FG_EINVAL,
            "positive whole number");
    refused("{\"zero_optimization\": {\"stage\": 1, \"stage\": 2}}", FG_EINVAL, "not valid JSON");
    refused("[1, 2]", FG_EINVAL, "expected a JSON object");
    refused("{\"zero_optimization\": {\"stage\": 2,}}", FG_EINVAL, "line 1");
    int stage;
    fg_sharded_opts o;
    CHECK_STATUS(fg_deepspeed_config_read("/nonexistent/ds.json", &stage, &o), FG_EIO);
    /* cpu offload of the optimizer is honoured: on a CPU nothing moves */
    const char *cpu[] = {"{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"cpu\"}}}",
                         "{\"zero_optimization\": {\"cpu_offload\": true}}"};
    for (int i = 0; i < 2; i++) {
        CHECK_OK(fg_deepspeed_config_read(write_json("cpu.json", cpu[i]), &stage, &o));
        CHECK(o.offload_optimizer_device == FG_OFFLOAD_CPU);
    }
}

static fg_fabric *fabric(const char *strategy, const char *config, int64_t reduce) {
    return fg_fabric_new(&(fg_fabric_config){
        .strategy = strategy, .deepspeed_config = config, .sharded.reduce_bucket_size = reduce});
}

TEST(the_fabric_takes_the_stage_and_options) {
    const char *p = write_json("s1.json", "{\"zero_optimization\": {\"stage\": 1, "
                                          "\"reduce_bucket_size\": 700, "
                                          "\"allgather_bucket_size\": 900}}");
    char path[256];
    snprintf(path, sizeof path, "%s", p);
    const char *ok[] = {"deepspeed", NULL, "auto", "deepspeed_stage_1"};
    for (int i = 0; i < 4; i++) {
        fg_fabric *f = fabric(ok[i], path, i == 3 ? 700 : 0);
        CHECK_MSG(f, "%s: %s", ok[i] ? ok[i] : "NULL", fg_last_error());
        if (!f) continue;
        CHECK(fg_fabric_plan(f)->strategy == FG_STRATEGY_DEEPSPEED_STAGE_1);
        CHECK(!strcmp(fg_fabric_strategy_name(f), "deepspeed_stage_1"));
        CHECK(f->cfg.sharded.reduce_bucket_size == 700);
        CHECK(f->cfg.sharded.allgather_bucket_size == 900);
        fg_fabric_free(f);
    }
    /* no stage in the file: the name's, or Lightning's default 2 */
    p = write_json("nostage.json", "{\"zero_optimization\": {\"reduce_bucket_size\": 10}}");
    snprintf(path, sizeof path, "%s", p);
    fg_fabric *f = fabric("deepspeed", path, 0);
    CHECK(f && fg_fabric_plan(f)->strategy == FG_STRATEGY_DEEPSPEED_STAGE_2);
    fg_fabric_free(f);
    f = fabric("deepspeed_stage_1", path, 0);
    CHECK(f && fg_fabric_plan(f)->strategy == FG_STRATEGY_DEEPSPEED_STAGE_1);
    fg_fabric_free(f);
    /* disagreements */
    snprintf(path, sizeof path, "%s/s1.json", g_dir);
    CHECK(!fabric("deepspeed_stage_2", path, 0));
    CHECK_CONTAINS(fg_last_error(), "strategy=\"deepspeed_stage_2\" but");
    CHECK(!fabric("ddp", path, 0));
    CHECK_CONTAINS(fg_last_error(), "strategy=\"ddp\" takes none");
    CHECK(!fabric("deepspeed", path, 5));
    CHECK_CONTAINS(fg_last_error(), "reduce_bucket_size = 5 in the configuration but 700 in");
    p = write_json("typo.json", "{\"zero_optimization\": {\"stag\": 1}}");
    snprintf(path, sizeof path, "%s", p);
    CHECK(!fabric("deepspeed", path, 0));
    CHECK_CONTAINS(fg_last_error(), "unknown key \"zero_optimization.stag\"");
}

TEST(activation_checkpointing_section) {
    /* Lightning's DeepSpeedStrategy writes these four: all honoured */
    const char *p = write_json(
        "act.json", "{\"zero_optimization\": {\"stage\": 3},\n"
                    " \"activation_checkpointing\": {\"partition_activations\": true,\n"
                    "   \"cpu_checkpointing\": true, \"contiguous_memory_optimization\": true,\n"
                    "   \"synchronize_checkpoint_boundary\": false}}");
    int stage = 0;
    fg_sharded_opts o = {0};
    CHECK_OK(fg_deepspeed_config_read(p, &stage, &o));
    CHECK(stage == 3 && o.partition_activations && o.cpu_checkpointing);
    p = write_json("act0.json", "{\"activation_checkpointing\": {\"partition_activations\": "
                                "false, \"cpu_checkpointing\": false, "
                                "\"synchronize_checkpoint_boundary\": true}}");
    CHECK_OK(fg_deepspeed_config_read(p, &stage, &o));
    CHECK(!o.partition_activations && !o.cpu_checkpointing);
    p = write_json("act1.json", "{\"activation_checkpointing\": {\"cpu_checkpointing\": true}}");
    CHECK_OK(fg_deepspeed_config_read(p, &stage, &o));
    CHECK(!o.partition_activations && o.cpu_checkpointing);
    /* the others by name */
    refused("{\"activation_checkpointing\": {\"number_checkpoints\": 12}}", FG_EINVAL,
            "\"activation_checkpointing.number_checkpoints\" is not honoured by fulgur: it sizes "
            "DeepSpeed's contiguous buffer");
    refused("{\"activation_checkpointing\": {\"profile\": true}}", FG_EINVAL,
            "\"activation_checkpointing.profile\" is not honoured");
    refused("{\"activation_checkpointing\": {\"partition_activation\": true}}", FG_EINVAL,
            "unknown key \"activation_checkpointing.partition_activation\" (the nearest key "
            "fulgur honours there is \"activation_checkpointing.partition_activations\")");
    refused("{\"activation_checkpointing\": {\"cpu_checkpointing\": 1}}", FG_EINVAL,
            "\"activation_checkpointing.cpu_checkpointing\" must be true or false");
    refused("{\"activation_checkpointing\": true}", FG_EINVAL,
            "\"activation_checkpointing\" must be an object");
    /* DeepSpeed asserts the same: contiguous copies of partitions */
    refused("{\"activation_checkpointing\": {\"contiguous_memory_optimization\": true}}", FG_EINVAL,
            "set \"partition_activations\" too");
}

/* The optimizer and scheduler sections: read (and accepted by the config
 * reader beside zero_optimization), their lrs DeepSpeed's formulas at
 * worked steps, the optimizer built from them, and the keys and types not
 * honoured named. */
static fg_deepspeed_train train_of(const char *text) {
    fg_deepspeed_train c = {0};
    CHECK_OK(fg_deepspeed_train_read(write_json("train.json", text), &c));
    int stage = 0;
    fg_sharded_opts o;
    CHECK_OK(fg_deepspeed_config_read(write_json("train.json", text), &stage, &o));
    return c;
}

static void train_refused(const char *text, const char *words) {
    fg_deepspeed_train c;
    CHECK_STATUS(fg_deepspeed_train_read(write_json("tbad.json", text), &c), FG_EINVAL);
    CHECK_MSG(strstr(fg_last_error(), words), "\"%s\" lacks \"%s\"", fg_last_error(), words);
    refused(text, FG_EINVAL, words); /* fg_fabric_new's reader refuses it too */
}

TEST(optimizer_and_scheduler_sections) {
    /* WarmupLR, linear: min + (max - min) * step / warmup, then max */
    fg_deepspeed_train c = train_of(
        "{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": 0, "
        "\"warmup_max_lr\": 0.01, \"warmup_num_steps\": 10, \"warmup_type\": \"linear\"}}}");
    CHECK(c.sched == FG_DS_WARMUP_LR && !c.has_optimizer);
    CHECK(fg_deepspeed_lr_at(&c, 0) == 0);
    CHECK_CLOSE(fg_deepspeed_lr_at(&c, 5), 0.005, 1e-15, 0);
    CHECK(fg_deepspeed_lr_at(&c, 10) == 0.01 && fg_deepspeed_lr_at(&c, 1000) == 0.01);
    /* log warm-up (DeepSpeed's default): log(step + 1) / log(warmup) */
    c = train_of("{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_max_lr\": 0.01, "
                 "\"warmup_num_steps\": 100}}}");
    CHECK_CLOSE(fg_deepspeed_lr_at(&c, 9), 0.005, 1e-14, 0);
    /* WarmupDecayLR: down linearly from the warm-up's end to 0 at total_num_steps */
    c = train_of("{\"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"warmup_max_lr\": "
                 "0.01, \"warmup_num_steps\": 10, \"total_num_steps\": 110, \"warmup_type\": "
                 "\"linear\"}}}");
    CHECK_CLOSE(fg_deepspeed_lr_at(&c, 60), 0.005, 1e-15, 0);
    CHECK(fg_deepspeed_lr_at(&c, 110) == 0 && fg_deepspeed_lr_at(&c, 500) == 0);
    /* WarmupCosineLR: a ratio of the optimizer's lr */
    c = train_of("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.1, \"betas\": "
                 "[0.8, 0.95], \"eps\": 1e-6, \"weight_decay\": 0.05}},\n"
                 " \"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"total_num_steps\": "
                 "110, \"warmup_num_steps\": 10, \"warmup_type\": \"linear\", \"cos_min_ratio\": "
                 "0}}}");
    CHECK(c.has_optimizer && c.decoupled && c.lr == 0.1 && c.beta1 == 0.8 && c.beta2 == 0.95);
    CHECK(c.eps == 1e-6 && c.weight_decay == 0.05);
    CHECK_CLOSE(fg_deepspeed_lr_at(&c, 5), 0.05, 1e-15, 0);
    CHECK_CLOSE(fg_deepspeed_lr_at(&c, 10), 0.1 * (1 + cos(M_PI / 100)) / 2, 1e-15, 0);
    CHECK_CLOSE(fg_deepspeed_lr_at(&c, 109), 0, 0, 1e-17);
    /* the optimizer: AdamW over every parameter; Adam with adam_w_mode false is Adam */
    fg_module *m = fg_linear_new(3, 2, true, FG_F32);
    CHECK_OK(fg_module_finalize(m));
    fg_optimizer *opt = fg_deepspeed_optimizer_new(&c, m);
    CHECK(opt && !strcmp(fg_optimizer_name(opt), "AdamW") && fg_optimizer_lr(opt) == 0.1);
    for (int64_t i = 0; opt && i < fg_module_num_params(m); i++)
        CHECK(!fg_optimizer_param_no_decay(opt, i)); /* the bias decays too, as DeepSpeed's */
    fg_optimizer_free(opt);
    c = train_of("{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"adam_w_mode\": false}}}");
    opt = fg_deepspeed_optimizer_new(&c, m);
    CHECK(opt && !strcmp(fg_optimizer_name(opt), "Adam"));
    fg_optimizer_free(opt);
    c = train_of("{\"optimizer\": {\"type\": \"Adam\"}}");
    opt = fg_deepspeed_optimizer_new(&c, m);
    CHECK(opt && !strcmp(fg_optimizer_name(opt), "AdamW")); /* DeepSpeed's FusedAdam */
    fg_optimizer_free(opt);
    fg_module_free(m);
    /* what is not honoured is named */
    train_refused("{\"optimizer\": {\"type\": \"SGD\"}}", "\"optimizer.type\" = \"SGD\"");
    train_refused("{\"scheduler\": {\"type\": \"WarmupCosineLr\"}}",
                  "the nearest is WarmupCosineLR");
    train_refused("{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 1, \"beta\": 0}}}",
                  "unknown key \"optimizer.params.beta\" (the nearest key fulgur honours there "
                  "is \"optimizer.params.betas\")");
    train_refused("{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"amsgrad\": true}}}",
                  "\"optimizer.params.amsgrad\" is not honoured by fulgur");
    train_refused("{\"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {}}}",
                  "\"scheduler.params.total_num_steps\" is required by WarmupDecayLR");
    train_refused("{\"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"warmup_max_lr\": "
                  "1, \"total_num_steps\": 5}}}",
                  "\"scheduler.params.warmup_max_lr\" is not a parameter of WarmupCosineLR");
}

TEST(activation_options_are_deepspeeds) {
    /* from the file into the fabric's options */
    char path[256];
    snprintf(path, sizeof path, "%s/act.json", g_dir);
    fg_fabric *f = fabric("deepspeed", path, 0);
    CHECK_MSG(f, "%s", fg_last_error());
    if (f) {
        CHECK(fg_fabric_plan(f)->strategy == FG_STRATEGY_DEEPSPEED_STAGE_3);
        CHECK(f->cfg.sharded.partition_activations && f->cfg.sharded.cpu_checkpointing);
        fg_fabric_free(f);
    }
    /* set directly: deepspeed kinds (and single) only */
    fg_sharded_opts o = {.partition_activations = true};
    for (int k = 0; k < FG_STRATEGY_COUNT; k++) {
        bool ds = k == FG_STRATEGY_DEEPSPEED_STAGE_1 || k == FG_STRATEGY_DEEPSPEED_STAGE_2 ||
                  k == FG_STRATEGY_DEEPSPEED_STAGE_3 || k == FG_STRATEGY_SINGLE;
        fg_status st = fg_strategy_check_sharded((fg_strategy_kind)k, &o);
        CHECK_MSG(ds ? st == FG_OK : st == FG_EINVAL, "%s: status %d",
                  fg_strategy_kind_name((fg_strategy_kind)k), (int)st);
    }
    o = (fg_sharded_opts){.cpu_checkpointing = true};
    CHECK_STATUS(fg_strategy_check_sharded(FG_STRATEGY_FSDP, &o), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "strategy \"fsdp\": cpu_checkpointing is an option of "
                                    "DeepSpeed's strategies");
    f = fg_fabric_new(&(fg_fabric_config){.strategy = "fsdp",
                                          .activation_checkpointing = true,
                                          .sharded.partition_activations = true});
    CHECK(!f);
    CHECK_CONTAINS(fg_last_error(), "partition_activations is an option of DeepSpeed's");
    f = fg_fabric_new(
        &(fg_fabric_config){.strategy = "deepspeed_stage_3",
                            .activation_checkpointing = true,
                            .sharded = {.partition_activations = true, .cpu_checkpointing = true}});
    CHECK_MSG(f, "%s", fg_last_error());
    fg_fabric_free(f);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
}
