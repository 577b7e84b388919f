/* What a fit says beside its progress display, as a Trainer callback on
 * rank 0: what is resumed and what the checkpoint changes (seed, global
 * batch, samples taken again), the model and the plan (parameters, ranks,
 * batch, steps, sharding, offload), and each optimizer step skipped on a
 * non-finite loss; and FULGUR_FIT_STEP_SLEEP_MS, a sleep after each
 * training batch on every rank (a slower machine for the benchmarks'
 * stragglers, bench/hivemind.sh). The progress display itself (the bar or the periodic
 * lines, and the validation lines) is the library's progress bar by step
 * (fg_progress_bar_new), and the metrics go to the loggers; notes are
 * written through the bar (fg_progress_bar_write) so that they do not break
 * it. */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fit_model.h"

typedef struct fit_notes {
    const fit_opts *o;
    fit_module *m;
    fg_callback *bar; /* the progress bar the notes go around, or NULL */
    bool rank0;
    int64_t total, seen_skips;
    double sleep_ms; /* FULGUR_FIT_STEP_SLEEP_MS: after each training batch */
} fit_notes;

static void note(fit_notes *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void note(fit_notes *p, const char *fmt, ...) {
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fg_progress_bar_write(p->bar, stdout, "%s", line);
}

static FG_MUST_USE fg_status setup(void *ud, fg_trainer *t, fg_trainer_fn fn) {
    (void)fn;
    ((fit_notes *)ud)->rank0 = fg_trainer_is_global_zero(t);
    return FG_OK;
}

/* After the checkpoint (if any) is loaded: what is resumed, what runs. */
static FG_MUST_USE fg_status on_fit_start(void *ud, fg_trainer *t) {
    fit_notes *p = ud;
    const fit_opts *o = p->o;
    int64_t acc = fg_trainer_accumulate_grad_batches(t); /* an elastic resume may change it */
    int64_t per_epoch = (fg_trainer_num_training_batches(t) + acc - 1) / acc;
    int64_t max_steps = fg_trainer_max_steps(t), max_epochs = fg_trainer_max_epochs(t);
    p->total = max_steps;
    if (max_epochs > 0 && (p->total < 0 || per_epoch * max_epochs < p->total))
        p->total = per_epoch * max_epochs;
    p->seen_skips = fg_trainer_skipped_steps(t, NULL);
    if (!p->rank0) return FG_OK;
    if (fg_trainer_ckpt_path(t)[0]) {
        uint64_t seed = fit_module_ckpt_seed(p->m);
        if (seed && seed != (uint64_t)o->seed)
            note(p,
                 "note: the checkpoint was trained with --seed %llu, this run uses %lld: the "
                 "data order changes",
                 (unsigned long long)seed, (long long)o->seed);
        int64_t cworld, cglobal, csamples, at;
        fit_module_ckpt_batch(p->m, &cworld, &cglobal, &csamples);
        int world = fg_trainer_world_size(t);
        int64_t global = o->batch_size * world * acc;
        fg_dataloader_sample_position(fit_module_loader(p->m, FG_FIT), NULL, &at);
        if (cworld > 0 && cworld != world && cglobal > 0 && global != cglobal)
            note(p,
                 "note: the checkpoint's global batch %lld cannot be kept on %d rank%s with "
                 "--batch-size %lld; this run's is %lld",
                 (long long)cglobal, world, world == 1 ? "" : "s", (long long)o->batch_size,
                 (long long)global);
        else if (acc != o->accumulate)
            note(p, "global batch %lld kept on %d rank%s: --accumulate-grad-batches %lld",
                 (long long)cglobal, world, world == 1 ? "" : "s", (long long)acc);
        if (cglobal > 0 && csamples >= 0 && at < csamples)
            note(p,
                 "note: %lld samples of epoch %lld are taken again (no batch boundary of %d "
                 "rank%s where the checkpoint stopped)",
                 (long long)(csamples - at), (long long)fg_trainer_current_epoch(t), world,
                 world == 1 ? "" : "s");
        note(p, "resumed from %s at step %lld (epoch %lld)", fg_trainer_ckpt_path(t),
             (long long)fg_trainer_global_step(t), (long long)fg_trainer_current_epoch(t));
    }
    fg_module *model = fg_trainer_model(t);
    const fit_data *d = fit_module_data(p->m);
    int64_t nparams = 0;
    for (int64_t i = 0; i < fg_module_num_params(model); i++)
        nparams += fg_tensor_numel(fg_module_param(model, i));
    if (o->arch == FIT_ARCH_RESNET)
        printf("fit resnet: %lld parameters (%s depth %lld, %lld -> %lld classes%s); %lld train / "
               "%lld val samples\n",
               (long long)nparams, o->resnet_layout, (long long)o->depth, (long long)d->in_dim,
               (long long)d->classes, o->sync_batchnorm ? ", SyncBatchNorm" : "",
               (long long)fg_dataset_len(d->train), (long long)fg_dataset_len(d->val));
    else if (o->arch == FIT_ARCH_VIT)
        printf("fit vit: %lld parameters (layers %lld, heads %lld, hidden %lld, mlp %lld, patch "
               "%lld, %lld -> %lld classes); %lld train / %lld val samples\n",
               (long long)nparams, (long long)o->layers, (long long)o->heads, (long long)o->embd,
               (long long)o->hidden, (long long)o->patch_size, (long long)d->in_dim,
               (long long)d->classes, (long long)fg_dataset_len(d->train),
               (long long)fg_dataset_len(d->val));
    else if (o->arch == FIT_ARCH_LSTM)
        printf("fit lstm: %lld parameters (layers %lld, embd %lld, hidden %lld, ctx %lld, vocab "
               "%lld); %lld train / %lld val windows\n",
               (long long)nparams, (long long)o->layers, (long long)o->embd, (long long)o->hidden,
               (long long)o->ctx, (long long)d->vocab, (long long)fg_dataset_len(d->train),
               (long long)fg_dataset_len(d->val));
    else if (fit_module_is_gpt(p->m))
        printf("fit gpt: %lld parameters (layers %lld, heads %lld, embd %lld, ctx %lld, vocab "
               "%lld); %lld train / %lld val windows\n",
               (long long)nparams, (long long)o->layers, (long long)o->heads, (long long)o->embd,
               (long long)o->ctx, (long long)d->vocab, (long long)fg_dataset_len(d->train),
               (long long)fg_dataset_len(d->val));
    else if (o->net)
        printf("fit sequential: %lld parameters (%lld layers, %lld inputs, %lld classes); %lld "
               "train / %lld val samples\n",
               (long long)nparams, (long long)fg_module_num_children(model), (long long)d->in_dim,
               (long long)d->classes, (long long)fg_dataset_len(d->train),
               (long long)fg_dataset_len(d->val));
    else
        printf("fit mlp: %lld parameters (%lld -> %lld -> %lld); %lld train / %lld val "
               "samples\n",
               (long long)nparams, (long long)d->in_dim, (long long)o->hidden,
               (long long)d->classes, (long long)fg_dataset_len(d->train),
               (long long)fg_dataset_len(d->val));
    int world = fg_trainer_world_size(t);
    printf("%d rank%s (%s), batch %lld x %d rank%s x %lld accumulated = %lld per step; "
           "%lld steps; run folder %s\n",
           world, world == 1 ? "" : "s", fg_fabric_strategy_name(fg_trainer_fabric(t)),
           (long long)o->batch_size, world, world == 1 ? "" : "s", (long long)acc,
           (long long)(o->batch_size * world * acc), (long long)p->total, o->root_dir);
    fg_optimizer *opt = fg_trainer_optimizer(t);
    int64_t sb, se;
    fg_optimizer_state_range(opt, &sb, &se);
    if (se - sb < nparams) /* a sharding strategy cut the optimizer's state */
        printf("optimizer state sharded: rank 0 holds %lld of %lld elements per state "
               "buffer (%s x %d)\n",
               (long long)(se - sb), (long long)nparams, fg_optimizer_name(opt),
               fg_optimizer_num_states(opt));
    const fg_strategy *strat = fg_fabric_strategy(fg_trainer_fabric(t));
    int64_t pb, pe;
    if (fg_strategy_shards_params(strat) && fg_strategy_param_range(strat, 0, &pb, &pe) == FG_OK)
        printf("parameters sharded: rank 0 holds %lld of %lld elements between steps; %d "
               "units gathered around their forward and backward\n",
               (long long)(pe - pb), (long long)nparams, fg_strategy_num_units(strat));
    if (fg_optimizer_state_on_disk(opt, NULL, NULL))
        printf("optimizer state offloaded to nvme: rank 0's %lld elements x %d in files "
               "under %s, streamed at each step\n",
               (long long)(se - sb), fg_optimizer_num_states(opt), o->nvme_path);
    if (fg_optimizer_state_on_disk(opt, NULL, NULL) &&
        (o->sharded.offload_params_device == FG_OFFLOAD_NVME ||
         (o->strategy && strstr(o->strategy, "stage_3_offload_nvme"))))
        printf("parameters offloaded to nvme: rank 0's shard in a file under %s, read back "
               "for each unit's forward and backward and updated there by the step\n",
               o->nvme_path);
    if (fg_optimizer_state_on_disk(opt, NULL, NULL)) {
    } else if (o->sharded.offload_optimizer_device == FG_OFFLOAD_CPU ||
               o->sharded.offload_params_device == FG_OFFLOAD_CPU || strstr(o->strategy, "offload"))
        printf("offload to the cpu: nothing to move (on a CPU the parameters and optimizer "
               "state are in host memory already)\n");
    fg_sharded_opts fo = {0};
    int fs;
    if (o->deepspeed_config && fg_deepspeed_config_read(o->deepspeed_config, &fs, &fo) != FG_OK)
        fg_clear_error(); /* the fabric read it already */
    if (o->sharded.partition_activations || fo.partition_activations)
        printf("partition_activations: nothing to partition (no model parallelism: each rank "
               "keeps its own checkpoints whole, as DeepSpeed with a model-parallel group of "
               "one)\n");
    if (o->sharded.cpu_checkpointing || fo.cpu_checkpointing)
        printf("cpu_checkpointing: nothing to move (on a CPU the checkpoints are in host memory "
               "already)\n");
    fflush(stdout);
    return FG_OK;
}

/* After each batch: an optimizer step skipped on every rank (the
 * trainer's count moved) is said once. */
static FG_MUST_USE fg_status on_train_batch_end(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)b;
    (void)i;
    fit_notes *p = ud;
    if (p->sleep_ms > 0) {
        double s = p->sleep_ms / 1e3;
        struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
        while (nanosleep(&ts, &ts) != 0) {
        }
    }
    const char *why;
    int64_t skips = fg_trainer_skipped_steps(t, &why);
    if (skips == p->seen_skips) return FG_OK;
    p->seen_skips = skips;
    if (p->rank0)
        note(p, "%s: optimizer step skipped on every rank (%lld so far)", why, (long long)skips);
    return FG_OK;
}

static void notes_free(void *ud) { free(ud); }

fg_callback *fit_notes_new(const fit_opts *o, fit_module *m, fg_callback *bar) {
    fit_notes *p = calloc(1, sizeof *p);
    if (!p) {
        fg_error(FG_ENOMEM, "fit notes: out of memory");
        return NULL;
    }
    p->o = o;
    p->m = m;
    p->bar = bar;
    const char *v = getenv("FULGUR_FIT_STEP_SLEEP_MS");
    char *end = NULL;
    if (v && *v && (p->sleep_ms = strtod(v, &end), *end || !(p->sleep_ms >= 0))) {
        fg_error(FG_EINVAL, "FULGUR_FIT_STEP_SLEEP_MS=\"%s\": expected milliseconds >= 0",
                 getenv("FULGUR_FIT_STEP_SLEEP_MS"));
        free(p);
        return NULL;
    }
    return fg_callback_new(&(fg_callback_ops){.name = "fulgur-notes",
                                              .setup = setup,
                                              .on_fit_start = on_fit_start,
                                              .on_train_batch_end = on_train_batch_end,
                                              .free = notes_free},
                           p);
}
