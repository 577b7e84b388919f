/* DeepSpeed's JSON configuration (Lightning's DeepSpeedStrategy(config=)):
 * the zero_optimization keys fulgur honours are read into fg_sharded_opts
 * and the stage; every other key is an error that names it, says what
 * fulgur does instead where it does something, and for a key it does not
 * know offers the nearest one it does. Nothing is silently ignored.
 *
 * A key is "honoured" when fulgur does what it asks: bucket sizes are
 * used as given; overlap_comm, contiguous_gradients, reduce_scatter,
 * allgather_partitions and ignore_unused_parameters are accepted with the
 * value that describes what fulgur always does, refused with the other;
 * offload_optimizer.device "cpu" (and cpu_offload) is honoured: on a CPU
 * it moves nothing. In activation_checkpointing, partition_activations and
 * cpu_checkpointing land in the options (with data parallelism only there
 * is nothing to partition, and on a CPU nothing to move: docs/sharding.md),
 * contiguous_memory_optimization is what the step arena always does (and
 * needs partition_activations, as in DeepSpeed), and
 * synchronize_checkpoint_boundary has nothing to wait for on a CPU.
 *
 * The optimizer ("Adam", "AdamW") and scheduler ("WarmupLR",
 * "WarmupDecayLR", "WarmupCosineLR") sections are honoured through
 * fg_deepspeed_train_read: the program builds the optimizer from them
 * (fg_deepspeed_optimizer_new) and sets the lr of each step
 * (fg_deepspeed_lr_at, DeepSpeed's lr_schedules.py formulas). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ckpt/ckpt_impl.h"
#include "fabric_impl.h"

typedef struct key_info {
    const char *name;
    const char *hint; /* NULL: honoured here; else why not, and what to do */
} key_info;

static const key_info k_top[] = {
    {"zero_optimization", NULL},
    {"zero_allow_untested_optimizer", NULL},
    {"train_batch_size", "set the batch size of the loader (fulgur fit --batch-size)"},
    {"train_micro_batch_size_per_gpu",
     "set the batch size of the loader (fulgur fit --batch-size)"},
    {"gradient_accumulation_steps",
     "accumulate with fg_fabric_set_no_backward_sync (fulgur fit --accumulate-grad-batches)"},
    {"gradient_clipping", "clip with fg_fabric_clip_gradients (fulgur fit --gradient-clip-val)"},
    {"fp16", "choose the precision (precision=\"16-mixed\", fulgur fit --precision)"},
    {"bf16", "choose the precision (precision=\"bf16-mixed\", fulgur fit --precision)"},
    {"amp", "choose the precision (fulgur fit --precision)"},
    {"optimizer", NULL},
    {"scheduler", NULL},
    {"activation_checkpointing", NULL},
    {"aio", "not read from the config file by this fulgur"},
    {"steps_per_print", "fulgur logs through its progress and loggers"},
    {"wall_clock_breakdown", "fulgur logs through its progress and loggers"},
    {"prescale_gradients", "fulgur averages gradients in f32 after summing"},
    {"gradient_predivide_factor", "fulgur averages gradients in f32 after summing"},
    {"communication_data_type", "fulgur reduces gradients in their own dtype"},
    {"sparse_gradients", "fulgur's gradients are dense"},
    {"flops_profiler", "no profiler is read from the config file"},
    {"tensorboard", "use the trainer's TensorBoard logger"},
    {"wandb", "not built in"},
    {"csv_monitor", "use the trainer's CSV logger"},
    {"checkpoint", "checkpoints are fulgur's own (state_dict_type, docs/checkpoints.md)"},
    {"data_efficiency", "not built in"},
    {"compression_training", "not built in"},
    {"elasticity", "not built in"},
};

static const key_info k_zero[] = {
    {"stage", NULL},
    {"allgather_bucket_size", NULL},
    {"reduce_bucket_size", NULL},
    {"overlap_comm", NULL},
    {"contiguous_gradients", NULL},
    {"reduce_scatter", NULL},
    {"allgather_partitions", NULL},
    {"ignore_unused_parameters", NULL},
    {"offload_optimizer", NULL},
    {"offload_param", NULL},
    {"cpu_offload", NULL},
    {"sub_group_size", "fulgur updates a rank's whole shard at once"},
    {"round_robin_gradients", "fulgur's shards are contiguous ranges"},
    {"elastic_checkpoint", "every fulgur checkpoint resumes at any world size"},
    {"load_from_fp32_weights", "fulgur's checkpoints hold the f32 master weights"},
    {"legacy_stage1", "not built in"},
    {"stage3_prefetch_bucket_size", "not read from the config file by this fulgur"},
    {"stage3_param_persistence_threshold", "not read from the config file by this fulgur"},
    {"stage3_max_live_parameters", "not read from the config file by this fulgur"},
    {"stage3_max_reuse_distance", "not read from the config file by this fulgur"},
    {"stage3_gather_16bit_weights_on_model_save", "use state_dict_type full or sharded"},
    {"gather_16bit_weights_on_model_save", "use state_dict_type full or sharded"},
    {"zero_hpz_partition_size", "not built in"},
    {"zero_quantized_weights", "not built in"},
    {"zero_quantized_gradients", "not built in"},
    {"mics_shard_size", "not built in"},
    {"memory_efficient_linear", "not built in"},
};

/* the four booleans first, in the order act_section reads them */
static const key_info k_act[] = {
    {"partition_activations", NULL},
    {"cpu_checkpointing", NULL},
    {"contiguous_memory_optimization", NULL},
    {"synchronize_checkpoint_boundary", NULL},
    {"number_checkpoints", "it sizes DeepSpeed's contiguous buffer; fulgur keeps the checkpoints "
                           "in the step arena, which grows to hold any number"},
    {"profile", "time a run with the trainer's progress and loggers"},
};

#define NVME_HINT                                                                                  \
    "set nvme offload through the strategy's options (offload_optimizer_device=nvme, "             \
    "nvme_path; fulgur fit --offload-optimizer-device nvme --nvme-path DIR)"

static const key_info k_offload[] = {
    {"device", NULL},
    {"nvme_path", NVME_HINT},
    {"pin_memory", "pinned memory is a GPU matter: nothing to pin on a CPU"},
    {"buffer_count", "fulgur streams three blocks per state buffer (FULGUR_NVME_BLOCK_BYTES)"},
    {"buffer_size", "fulgur streams three blocks per state buffer (FULGUR_NVME_BLOCK_BYTES)"},
    {"max_in_cpu", "not read from the config file by this fulgur"},
    {"fast_init", "not read from the config file by this fulgur"},
    {"pipeline_read", "fulgur always reads the next block while it updates this one"},
    {"pipeline_write", "fulgur always writes behind the update"},
    {"ratio", "fulgur offloads the whole state of the rank's shard"},
};

/* Edit distance, for "did you mean". */
static int distance(const char *a, const char *b) {
    int la = (int)strlen(a), lb = (int)strlen(b);
    if (la > 63 || lb > 63) return 99;
    int row[64];
    for (int j = 0; j <= lb; j++) row[j] = j;
    for (int i = 1; i <= la; i++) {
        int prev = row[0];
        row[0] = i;
        for (int j = 1; j <= lb; j++) {
            int cur = row[j];
            int sub = prev + (a[i - 1] != b[j - 1]);
            row[j] = FG_MIN(FG_MIN(row[j] + 1, row[j - 1] + 1), sub);
            prev = cur;
        }
    }
    return row[lb];
}

/* Checks every key of obj against the table: FG_OK when all are honoured
 * ones; else the error naming the first other. */
static FG_MUST_USE fg_status check_keys(const char *path, const char *where, json_t *obj,
                                        const key_info *t, size_t n) {
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) {
        const key_info *hit = NULL;
        for (size_t i = 0; i < n && !hit; i++)
            if (!strcmp(key, t[i].name)) hit = &t[i];
        if (hit && !hit->hint) continue;
        if (hit)
            return fg_error(FG_EINVAL, "%s: \"%s%s\" is not honoured by fulgur: %s", path, where,
                            key, hit->hint);
        const char *best = NULL;
        int bd = 99;
        for (size_t i = 0; i < n; i++) {
            if (t[i].hint) continue;
            int d = distance(key, t[i].name);
            if (d < bd) bd = d, best = t[i].name;
        }
        return fg_error(FG_EINVAL,
                        "%s: unknown key \"%s%s\" (the nearest key fulgur honours there is "
                        "\"%s%s\")",
                        path, where, key, where, best ? best : "?");
    }
    return FG_OK;
}

/* A positive element count: an integer, or a real with an integral value
 * (DeepSpeed configs often write 5e8). */
static FG_MUST_USE fg_status count_of(const char *path, const char *key, json_t *v, int64_t *out) {
    double d = json_is_integer(v) ? (double)json_integer_value(v)
               : json_is_real(v)  ? json_real_value(v)
                                  : -1;
    if (!(d >= 1 && d <= 9e18) || d != (double)(int64_t)d)
        return fg_error(FG_EINVAL,
                        "%s: \"zero_optimization.%s\" must be a positive whole number of "
                        "elements (DeepSpeed counts elements, not bytes)",
                        path, key);
    *out = (int64_t)d;
    return FG_OK;
}

/* A boolean key that fulgur honours only with the value `want`. */
static FG_MUST_USE fg_status flag(const char *path, json_t *zero, const char *key, bool want,
                                  const char *why) {
    json_t *v = json_object_get(zero, key);
    if (!v) return FG_OK;
    if (!json_is_boolean(v))
        return fg_error(FG_EINVAL, "%s: \"zero_optimization.%s\" must be true or false", path, key);
    if (json_is_true(v) != want)
        return fg_error(FG_EINVAL, "%s: \"zero_optimization.%s\": %s is not honoured by fulgur: %s",
                        path, key, want ? "false" : "true", why);
    return FG_OK;
}

/* offload_optimizer.device "cpu" is honoured (on a CPU it moves nothing:
 * the strategy's offload_optimizer_device becomes cpu); "nvme" needs a
 * path, which fulgur takes from the strategy's options, not the file;
 * offload_param likewise for the parameters (stage 3's: the strategy
 * checks the stage). */
static FG_MUST_USE fg_status offload(const char *path, json_t *zero, const char *key,
                                     fg_offload_device *out) {
    json_t *o = json_object_get(zero, key);
    if (!o) return FG_OK;
    char where[64];
    snprintf(where, sizeof where, "zero_optimization.%s.", key);
    if (!json_is_object(o))
        return fg_error(FG_EINVAL, "%s: \"zero_optimization.%s\" must be an object", path, key);
    FG_TRY(check_keys(path, where, o, k_offload, sizeof k_offload / sizeof k_offload[0]));
    json_t *d = json_object_get(o, "device");
    if (!d) return FG_OK;
    const char *dev = json_is_string(d) ? json_string_value(d) : "";
    if (!strcmp(dev, "none")) return FG_OK;
    if (!strcmp(dev, "cpu") && out) {
        *out = FG_OFFLOAD_CPU;
        return FG_OK;
    }
    bool params = !strcmp(key, "offload_param");
    if (!strcmp(dev, "nvme") && out)
        return fg_error(FG_EUNSUPPORTED, "%s: \"zero_optimization.%s.device\" = \"nvme\": %s", path,
                        key,
                        params ? "set parameter offload through the strategy's options "
                                 "(offload_params_device=nvme, nvme_path; fulgur fit "
                                 "--strategy deepspeed_stage_3_offload_nvme --nvme-path DIR)"
                               : NVME_HINT);
    return fg_error(FG_EINVAL,
                    "%s: \"zero_optimization.%s.device\": expected \"none\", \"cpu\" or "
                    "\"nvme\"",
                    path, key);
}

/* The activation_checkpointing section: how DeepSpeed keeps the
 * checkpoints. Turning checkpointing on is the program's (in DeepSpeed the
 * model calls deepspeed.checkpointing.checkpoint; here
 * activation_checkpointing = true). */
static FG_MUST_USE fg_status act_section(const char *path, json_t *root, fg_sharded_opts *out) {
    json_t *a = json_object_get(root, "activation_checkpointing");
    if (!a) return FG_OK;
    if (!json_is_object(a))
        return fg_error(FG_EINVAL, "%s: \"activation_checkpointing\" must be an object", path);
    FG_TRY(check_keys(path, "activation_checkpointing.", a, k_act, sizeof k_act / sizeof k_act[0]));
    bool on[4] = {false};
    for (int i = 0; i < 4; i++) {
        json_t *v = json_object_get(a, k_act[i].name);
        if (v && !json_is_boolean(v))
            return fg_error(FG_EINVAL, "%s: \"activation_checkpointing.%s\" must be true or false",
                            path, k_act[i].name);
        on[i] = v && json_is_true(v);
    }
    if (on[2] && !on[0]) /* DeepSpeed's configure asserts the same */
        return fg_error(FG_EINVAL,
                        "%s: \"activation_checkpointing.contiguous_memory_optimization\" works "
                        "on partitioned activations only: set \"partition_activations\" too (as "
                        "DeepSpeed requires)",
                        path);
    out->partition_activations = on[0];
    out->cpu_checkpointing = on[1];
    return FG_OK;
}

/* ----------------------------------------- the optimizer and scheduler */

static const key_info k_opt[] = {{"type", NULL}, {"params", NULL}};
static const key_info k_adam[] = {
    {"lr", NULL},
    {"betas", NULL},
    {"eps", NULL},
    {"weight_decay", NULL},
    {"adam_w_mode", NULL},
    {"torch_adam", NULL},
    {"bias_correction", NULL},
    {"amsgrad", "use fg_adam_new with amsgrad in the program (fulgur fit --amsgrad)"},
};
static const key_info k_sched_params[] = {
    {"warmup_min_lr", NULL}, {"warmup_max_lr", NULL},        {"warmup_num_steps", NULL},
    {"warmup_type", NULL},   {"total_num_steps", NULL},      {"warmup_min_ratio", NULL},
    {"cos_min_ratio", NULL}, {"last_batch_iteration", NULL},
};

static FG_MUST_USE fg_status num_of(const char *path, const char *key, json_t *v, double lo,
                                    double *out) {
    if (!json_is_number(v) || !(json_number_value(v) >= lo))
        return fg_error(FG_EINVAL, "%s: \"%s\" must be a number >= %g", path, key, lo);
    *out = json_number_value(v);
    return FG_OK;
}

static FG_MUST_USE fg_status steps_of(const char *path, const char *key, json_t *v, int64_t *out) {
    double d = 0;
    FG_TRY(num_of(path, key, v, 0, &d));
    if (d != (double)(int64_t)d || d > 9e18)
        return fg_error(FG_EINVAL, "%s: \"%s\" must be a whole number of steps", path, key);
    *out = (int64_t)d;
    return FG_OK;
}

static FG_MUST_USE fg_status optimizer_section(const char *path, json_t *o,
                                               fg_deepspeed_train *out) {
    if (!json_is_object(o)) return fg_error(FG_EINVAL, "%s: \"optimizer\" must be an object", path);
    FG_TRY(check_keys(path, "optimizer.", o, k_opt, sizeof k_opt / sizeof k_opt[0]));
    json_t *t = json_object_get(o, "type");
    const char *type = json_is_string(t) ? json_string_value(t) : "";
    bool adam = !strcmp(type, "Adam") || !strcmp(type, "adam");
    bool adamw = !strcmp(type, "AdamW") || !strcmp(type, "adamw");
    if (!adam && !adamw)
        return fg_error(FG_EINVAL,
                        "%s: \"optimizer.type\" = \"%s\": fulgur honours \"Adam\" and "
                        "\"AdamW\"; build another optimizer in the program (fulgur fit "
                        "--optimizer)",
                        path, type);
    out->has_optimizer = true;
    /* DeepSpeed's Adam is FusedAdam with adam_w_mode true: decoupled decay */
    out->decoupled = true;
    out->lr = 1e-3, out->beta1 = 0.9, out->beta2 = 0.999, out->eps = 1e-8;
    out->weight_decay = adamw ? 0.01 : 0;
    json_t *p = json_object_get(o, "params");
    if (!p) return FG_OK;
    if (!json_is_object(p))
        return fg_error(FG_EINVAL, "%s: \"optimizer.params\" must be an object", path);
    FG_TRY(check_keys(path, "optimizer.params.", p, k_adam, sizeof k_adam / sizeof k_adam[0]));
    json_t *v;
    if ((v = json_object_get(p, "lr"))) FG_TRY(num_of(path, "optimizer.params.lr", v, 0, &out->lr));
    if ((v = json_object_get(p, "eps")))
        FG_TRY(num_of(path, "optimizer.params.eps", v, 0, &out->eps));
    if ((v = json_object_get(p, "weight_decay")))
        FG_TRY(num_of(path, "optimizer.params.weight_decay", v, 0, &out->weight_decay));
    if ((v = json_object_get(p, "betas"))) {
        if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_number(json_array_get(v, 0)) ||
            !json_is_number(json_array_get(v, 1)))
            return fg_error(FG_EINVAL, "%s: \"optimizer.params.betas\" must be [beta1, beta2]",
                            path);
        out->beta1 = json_number_value(json_array_get(v, 0));
        out->beta2 = json_number_value(json_array_get(v, 1));
    }
    const char *bools[] = {"adam_w_mode", "torch_adam", "bias_correction"};
    for (int i = 0; i < 3; i++)
        if ((v = json_object_get(p, bools[i])) && !json_is_boolean(v))
            return fg_error(FG_EINVAL, "%s: \"optimizer.params.%s\" must be true or false", path,
                            bools[i]);
    if ((v = json_object_get(p, "adam_w_mode")) && adam) out->decoupled = json_is_true(v);
    if ((v = json_object_get(p, "bias_correction")) && json_is_false(v))
        return fg_error(FG_EINVAL,
                        "%s: \"optimizer.params.bias_correction\": false is not "
                        "honoured by fulgur: its Adam always corrects the bias (as "
                        "PyTorch's)",
                        path);
    return FG_OK;
}

static FG_MUST_USE fg_status scheduler_section(const char *path, json_t *o,
                                               fg_deepspeed_train *out) {
    if (!json_is_object(o)) return fg_error(FG_EINVAL, "%s: \"scheduler\" must be an object", path);
    FG_TRY(check_keys(path, "scheduler.", o, k_opt, sizeof k_opt / sizeof k_opt[0]));
    json_t *t = json_object_get(o, "type");
    const char *type = json_is_string(t) ? json_string_value(t) : "";
    static const char *const names[] = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"};
    out->sched = FG_DS_SCHED_NONE;
    for (int i = 0; i < 3; i++)
        if (!strcmp(type, names[i])) out->sched = (fg_ds_sched_kind)(i + 1);
    if (out->sched == FG_DS_SCHED_NONE) {
        const char *best = names[0];
        int bd = 99;
        for (int i = 0; i < 3; i++) {
            int d = distance(type, names[i]);
            if (d < bd) bd = d, best = names[i];
        }
        return fg_error(FG_EINVAL,
                        "%s: \"scheduler.type\" = \"%s\": fulgur honours WarmupLR, "
                        "WarmupDecayLR and WarmupCosineLR (the nearest is %s); OneCycle and "
                        "LRRangeTest: set the scheduler in the program",
                        path, type, best);
    }
    /* DeepSpeed's defaults */
    out->warmup_min_lr = 0, out->warmup_max_lr = 1e-3, out->warmup_num_steps = 1000;
    out->warmup_linear = false, out->total_num_steps = 0;
    out->warmup_min_ratio = 0, out->cos_min_ratio = 1e-4;
    json_t *p = json_object_get(o, "params");
    if (p && !json_is_object(p))
        return fg_error(FG_EINVAL, "%s: \"scheduler.params\" must be an object", path);
    if (p)
        FG_TRY(check_keys(path, "scheduler.params.", p, k_sched_params,
                          sizeof k_sched_params / sizeof k_sched_params[0]));
    json_t *v;
    bool cosine = out->sched == FG_DS_WARMUP_COSINE_LR;
    /* which keys each type takes: the others are errors naming them */
    const char *const own[] = {cosine ? "warmup_min_ratio" : "warmup_min_lr",
                               cosine ? "cos_min_ratio" : "warmup_max_lr"};
    const char *const other[] = {cosine ? "warmup_min_lr" : "warmup_min_ratio",
                                 cosine ? "warmup_max_lr" : "cos_min_ratio"};
    for (int i = 0; p && i < 2; i++)
        if (json_object_get(p, other[i]))
            return fg_error(FG_EINVAL,
                            "%s: \"scheduler.params.%s\" is not a parameter of %s (it takes "
                            "%s)",
                            path, other[i], type, own[i]);
    if (p && (v = json_object_get(p, "warmup_min_lr")))
        FG_TRY(num_of(path, "scheduler.params.warmup_min_lr", v, 0, &out->warmup_min_lr));
    if (p && (v = json_object_get(p, "warmup_max_lr")))
        FG_TRY(num_of(path, "scheduler.params.warmup_max_lr", v, 0, &out->warmup_max_lr));
    if (p && (v = json_object_get(p, "warmup_min_ratio")))
        FG_TRY(num_of(path, "scheduler.params.warmup_min_ratio", v, 0, &out->warmup_min_ratio));
    if (p && (v = json_object_get(p, "cos_min_ratio")))
        FG_TRY(num_of(path, "scheduler.params.cos_min_ratio", v, 0, &out->cos_min_ratio));
    if (p && (v = json_object_get(p, "warmup_num_steps")))
        FG_TRY(steps_of(path, "scheduler.params.warmup_num_steps", v, &out->warmup_num_steps));
    if (p && (v = json_object_get(p, "total_num_steps")))
        FG_TRY(steps_of(path, "scheduler.params.total_num_steps", v, &out->total_num_steps));
    if (p && (v = json_object_get(p, "last_batch_iteration"))) {
        if (!json_is_integer(v) || json_integer_value(v) != -1)
            return fg_error(FG_EINVAL,
                            "%s: \"scheduler.params.last_batch_iteration\": only -1 (a fresh "
                            "start) is honoured: a resumed run takes its step from the checkpoint",
                            path);
    }
    if (p && (v = json_object_get(p, "warmup_type"))) {
        const char *w = json_is_string(v) ? json_string_value(v) : "";
        if (strcmp(w, "log") && strcmp(w, "linear"))
            return fg_error(FG_EINVAL,
                            "%s: \"scheduler.params.warmup_type\" = \"%s\": expected \"log\" or "
                            "\"linear\"",
                            path, w);
        out->warmup_linear = !strcmp(w, "linear");
    }
    if (out->sched != FG_DS_WARMUP_LR && out->total_num_steps == 0)
        return fg_error(FG_EINVAL, "%s: \"scheduler.params.total_num_steps\" is required by %s",
                        path, type);
    if (out->sched != FG_DS_WARMUP_LR && out->total_num_steps <= out->warmup_num_steps && cosine)
        return fg_error(FG_EINVAL,
                        "%s: \"scheduler.params.total_num_steps\" (%lld) must be more than "
                        "warmup_num_steps (%lld)",
                        path, (long long)out->total_num_steps, (long long)out->warmup_num_steps);
    /* DeepSpeed: warmup_num_steps = max(2, warmup_num_steps) */
    if (out->warmup_num_steps < 2) out->warmup_num_steps = 2;
    return FG_OK;
}

static FG_MUST_USE fg_status train_sections(const char *path, json_t *root,
                                            fg_deepspeed_train *out) {
    *out = (fg_deepspeed_train){0};
    json_t *o = json_object_get(root, "optimizer");
    if (o) FG_TRY(optimizer_section(path, o, out));
    json_t *sc = json_object_get(root, "scheduler");
    if (sc) FG_TRY(scheduler_section(path, sc, out));
    return FG_OK;
}

/* DeepSpeed's lr_schedules.py, for iteration `step` (0-based; the schedulers
 * step once at their construction, so optimizer step i uses iteration i). */
double fg_deepspeed_lr_at(const fg_deepspeed_train *c, int64_t step) {
    if (!c || c->sched == FG_DS_SCHED_NONE) return c ? c->lr : 0;
    double it = (double)step, w = (double)c->warmup_num_steps;
    double warm = c->warmup_linear ? it / w : log(it + 1) / log(w); /* inverse_log_warm_up */
    if (c->sched == FG_DS_WARMUP_COSINE_LR) {
        double ratio;
        if (step < c->warmup_num_steps) {
            ratio = c->warmup_min_ratio + warm * (1.0 - c->warmup_min_ratio);
        } else {
            double real_last = it - w + 1, real_total = (double)c->total_num_steps - w;
            ratio = (1 + cos(M_PI * real_last / real_total)) / 2;
            ratio = fmax(0.0, c->cos_min_ratio + (1.0 - c->cos_min_ratio) * ratio);
        }
        return c->lr * ratio;
    }
    double gamma = 1.0;
    if (step < c->warmup_num_steps) gamma = warm;
    else if (c->sched == FG_DS_WARMUP_DECAY_LR)
        gamma = fmax(0.0,
                     ((double)c->total_num_steps - it) / fmax(1.0, (double)c->total_num_steps - w));
    return c->warmup_min_lr + (c->warmup_max_lr - c->warmup_min_lr) * gamma;
}

fg_optimizer *fg_deepspeed_optimizer_new(const fg_deepspeed_train *c, fg_module *m) {
    if (!c || !c->has_optimizer) {
        fg_error(FG_EINVAL, "deepspeed optimizer: the configuration has no optimizer section");
        return NULL;
    }
    /* DeepSpeed decays every parameter of its one group */
    if (c->decoupled)
        return fg_adamw_new(m, &(fg_adamw_opts){.lr = c->lr,
                                                .beta1 = c->beta1,
                                                .beta2 = c->beta2,
                                                .eps = c->eps,
                                                .weight_decay = c->weight_decay,
                                                .no_weight_decay = c->weight_decay == 0,
                                                .decay_all = true});
    return fg_adam_new(m, &(fg_adam_opts){.lr = c->lr,
                                          .beta1 = c->beta1,
                                          .beta2 = c->beta2,
                                          .eps = c->eps,
                                          .weight_decay = c->weight_decay});
}

fg_status fg_deepspeed_train_read(const char *path, fg_deepspeed_train *out) {
    if (!path || !out) return fg_error(FG_EINVAL, "deepspeed config: NULL argument");
    *out = (fg_deepspeed_train){0};
    fg__st_json_init();
    json_error_t err;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        FILE *probe = fopen(path, "r");
        if (!probe) return fg_error(FG_EIO, "deepspeed config %s: cannot read it (missing?)", path);
        fclose(probe);
        return fg_error(FG_EINVAL, "deepspeed config %s: not valid JSON: %s (line %d, column %d)",
                        path, err.text, err.line, err.column);
    }
    fg_deepspeed_train t;
    fg_status s = json_is_object(root) ? train_sections(path, root, &t)
                                       : fg_error(FG_EINVAL, "%s: expected a JSON object", path);
    json_decref(root);
    if (s == FG_OK) *out = t;
    return s;
}

static FG_MUST_USE fg_status parse(const char *path, json_t *root, int *stage,
                                   fg_sharded_opts *out) {
    if (!json_is_object(root))
        return fg_error(FG_EINVAL, "%s: expected a JSON object (DeepSpeed's configuration)", path);
    FG_TRY(check_keys(path, "", root, k_top, sizeof k_top / sizeof k_top[0]));
    json_t *u = json_object_get(root, "zero_allow_untested_optimizer");
    if (u && !json_is_boolean(u))
        return fg_error(FG_EINVAL, "%s: \"zero_allow_untested_optimizer\" must be true or false",
                        path);
    FG_TRY(act_section(path, root, out));
    fg_deepspeed_train train; /* checked here too: a bad section fails fg_fabric_new */
    FG_TRY(train_sections(path, root, &train));
    json_t *zero = json_object_get(root, "zero_optimization");
    if (!zero) return FG_OK;
    if (!json_is_object(zero))
        return fg_error(FG_EINVAL, "%s: \"zero_optimization\" must be an object", path);
    FG_TRY(check_keys(path, "zero_optimization.", zero, k_zero, sizeof k_zero / sizeof k_zero[0]));
    json_t *v = json_object_get(zero, "stage");
    if (v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 3)
            return fg_error(FG_EINVAL, "%s: \"zero_optimization.stage\" must be 0, 1, 2 or 3",
                            path);
        *stage = (int)json_integer_value(v);
        if (*stage == 0)
            return fg_error(FG_EINVAL,
                            "%s: \"zero_optimization.stage\" = 0 is plain data parallelism: use "
                            "the strategy ddp without a DeepSpeed config",
                            path);
    }
    if ((v = json_object_get(zero, "allgather_bucket_size")))
        FG_TRY(count_of(path, "allgather_bucket_size", v, &out->allgather_bucket_size));
    if ((v = json_object_get(zero, "reduce_bucket_size")))
        FG_TRY(count_of(path, "reduce_bucket_size", v, &out->reduce_bucket_size));
    int st = *stage ? *stage : 2;
    if (st == 1)
        FG_TRY(flag(path, zero, "overlap_comm", false,
                    "under stage 1 fulgur reduce-scatters once backward is over (stage 2 "
                    "overlaps the reductions with backward)"));
    else
        FG_TRY(flag(path, zero, "overlap_comm", true,
                    "under stage 2 fulgur always overlaps the reductions with backward (stage 1 "
                    "reduces after it)"));
    FG_TRY(flag(path, zero, "contiguous_gradients", true,
                "fulgur's gradients are always one contiguous flat buffer"));
    FG_TRY(flag(path, zero, "reduce_scatter", true, "fulgur always reduce-scatters the gradients"));
    FG_TRY(flag(path, zero, "allgather_partitions", true,
                "fulgur always all-gathers the updated shards"));
    FG_TRY(flag(path, zero, "ignore_unused_parameters", true,
                "a parameter backward did not reach counts with the gradient it holds (zero "
                "after zero_grad), as DeepSpeed's default"));
    json_t *co = json_object_get(zero, "cpu_offload"); /* DeepSpeed's older offload_optimizer */
    if (co && !json_is_boolean(co))
        return fg_error(FG_EINVAL, "%s: \"zero_optimization.cpu_offload\" must be true or false",
                        path);
    if (co && json_is_true(co)) out->offload_optimizer_device = FG_OFFLOAD_CPU;
    FG_TRY(offload(path, zero, "offload_optimizer", &out->offload_optimizer_device));
    FG_TRY(offload(path, zero, "offload_param", &out->offload_params_device));
    return FG_OK;
}

fg_status fg_deepspeed_config_read(const char *path, int *stage, fg_sharded_opts *out) {
    if (!path || !stage || !out) return fg_error(FG_EINVAL, "deepspeed config: NULL argument");
    *stage = 0;
    *out = (fg_sharded_opts){0};
    fg__st_json_init();
    json_error_t err;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        FILE *probe = fopen(path, "r");
        if (!probe) return fg_error(FG_EIO, "deepspeed config %s: cannot read it (missing?)", path);
        fclose(probe);
        return fg_error(FG_EINVAL, "deepspeed config %s: not valid JSON: %s (line %d, column %d)",
                        path, err.text, err.line, err.column);
    }
    fg_sharded_opts o = {0};
    int s0 = 0;
    fg_status s = parse(path, root, &s0, &o);
    json_decref(root);
    if (s != FG_OK) return s;
    *stage = s0;
    *out = o;
    return FG_OK;
}

/* The file's stage and options into f's configuration: the strategy
 * becomes deepspeed_stage_<stage> (the name's own stage, or Lightning's
 * default 2, when the file gives none), and each option the file sets
 * fills the field, which the program may have set only to the same value. */
fg_status fg__fabric_apply_deepspeed_config(fg_fabric *f) {
    const char *path = f->cfg.deepspeed_config;
    int stage = 0;
    fg_sharded_opts o;
    FG_TRY(fg_deepspeed_config_read(path, &stage, &o));
    const char *name = f->cfg.strategy ? f->cfg.strategy : "auto";
    int named = 0; /* the stage the strategy's name says, 0: none */
    if (!strcmp(name, "deepspeed_stage_1")) named = 1;
    else if (!strcmp(name, "deepspeed_stage_2")) named = 2;
    else if (!strcmp(name, "deepspeed_stage_3")) named = 3;
    else if (strcmp(name, "deepspeed") && strcmp(name, "auto"))
        return fg_error(FG_EINVAL,
                        "deepspeed_config=%s is DeepSpeed's configuration: strategy=\"%s\" takes "
                        "none (use deepspeed, or deepspeed_stage_1/2/3)",
                        path, name);
    if (named && stage && named != stage)
        return fg_error(FG_EINVAL,
                        "strategy=\"%s\" but %s says \"zero_optimization.stage\" = %d: make them "
                        "agree (or use strategy deepspeed, whose stage the file chooses)",
                        name, path, stage);
    if (!stage) stage = named ? named : 2;
    struct {
        const char *key;
        int64_t *have, want;
    } k[] = {
        {"allgather_bucket_size", &f->cfg.sharded.allgather_bucket_size, o.allgather_bucket_size},
        {"reduce_bucket_size", &f->cfg.sharded.reduce_bucket_size, o.reduce_bucket_size}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        if (!k[i].want) continue;
        if (*k[i].have && *k[i].have != k[i].want)
            return fg_error(FG_EINVAL,
                            "%s = %lld in the configuration but %lld in %s: set it in one place",
                            k[i].key, (long long)*k[i].have, (long long)k[i].want, path);
        *k[i].have = k[i].want;
    }
    if (o.offload_optimizer_device && !f->cfg.sharded.offload_optimizer_device)
        f->cfg.sharded.offload_optimizer_device = o.offload_optimizer_device;
    f->cfg.sharded.partition_activations |= o.partition_activations;
    f->cfg.sharded.cpu_checkpointing |= o.cpu_checkpointing;
    if (o.offload_params_device && !f->cfg.sharded.offload_params_device)
        f->cfg.sharded.offload_params_device = o.offload_params_device;
    char strategy[32];
    snprintf(strategy, sizeof strategy, "deepspeed_stage_%d", stage);
    char *copy = fg_strdup(strategy);
    if (!copy) return FG_ENOMEM;
    fg_free(f->strings[2]);
    f->strings[2] = copy;
    f->cfg.strategy = copy;
    return FG_OK;
}
