/* Rank 0's view of a fit, as a Trainer callback: a one-line progress bar
 * redrawn on stderr when it is a terminal (at most 10 times a second), plain
 * lines on stdout every --log-every-n-steps steps otherwise, notes (resume,
 * skipped steps, validation) that do not break the bar, and metrics.csv in
 * the run folder (one row per --log-every-n-steps steps with the window's
 * mean loss and throughput, one per validation). Every rank runs the
 * callback (the step's loss is averaged over ranks there); only global rank
 * 0 prints and writes. */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fit_model.h"

typedef struct fit_progress {
    const fit_opts *o;
    fit_module *m;
    bool rank0;
    FILE *csv;
    bool bar;       /* redraw a bar on stderr */
    bool lines;     /* plain lines on stdout */
    bool bar_drawn; /* the bar occupies the current stderr line */
    int64_t total, start, seen_step, seen_skips;
    const char *unit;
    double t0, t_last_draw;
    /* window since the last log row */
    double win_t0, win_loss, win_items;
    int64_t win_steps;
    /* for the bar: the latest values */
    double last_loss, last_rate, last_val;
    int64_t last_epoch;
} fit_progress;

static void note(fit_progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void fmt_time(char *buf, size_t n, double s) {
    if (s < 0 || s > 1e8) {
        snprintf(buf, n, "?");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
}

static void fmt_rate(char *buf, size_t n, double r) {
    if (r >= 1e6) snprintf(buf, n, "%.2fM", r / 1e6);
    else if (r >= 1e3) snprintf(buf, n, "%.1fk", r / 1e3);
    else snprintf(buf, n, "%.1f", r);
}

static double eta(const fit_progress *p, int64_t step) {
    if (p->total <= 0 || step <= p->start) return -1;
    double per = (fg_time() - p->t0) / (double)(step - p->start);
    return per * (double)(p->total - step);
}

static void clear_bar(fit_progress *p) {
    if (p->bar_drawn) {
        fputs("\r\033[K", stderr);
        p->bar_drawn = false;
    }
}

static void draw_bar(fit_progress *p, int64_t step) {
    char bar[32], rate[32], left[32], el[32], val[48] = "";
    int w = 24, fill = p->total > 0 ? (int)((double)w * (double)step / (double)p->total) : 0;
    if (fill > w) fill = w;
    for (int i = 0; i < w; i++) bar[i] = i < fill ? '#' : '.';
    bar[w] = '\0';
    fmt_rate(rate, sizeof rate, p->last_rate);
    fmt_time(left, sizeof left, eta(p, step));
    fmt_time(el, sizeof el, fg_time() - p->t0);
    if (p->last_val >= 0) snprintf(val, sizeof val, "  val %.4f", p->last_val);
    char total[32] = "?";
    if (p->total > 0) snprintf(total, sizeof total, "%lld", (long long)p->total);
    fprintf(stderr, "\r\033[Kepoch %lld [%s] %lld/%s  loss %.4f%s  %s %s/s  %s<%s",
            (long long)p->last_epoch, bar, (long long)step, total, p->last_loss, val, rate, p->unit,
            el, left);
    fflush(stderr);
    p->bar_drawn = true;
}

static void progress_step(fit_progress *p, int64_t step, int64_t epoch, double loss, double lr,
                          double items) {
    p->win_loss += loss;
    p->win_items += items;
    p->win_steps++;
    p->last_loss = loss;
    p->last_epoch = epoch;
    double now = fg_time();
    bool log_row = step % p->o->log_every == 0 || step == p->total;
    if (log_row) {
        double dt = now - p->win_t0;
        double rate = dt > 0 ? p->win_items / dt : 0;
        double mean = p->win_loss / (double)p->win_steps;
        p->last_rate = rate;
        if (p->csv) {
            fprintf(p->csv, "%lld,%lld,%.6f,,%.6g,%.1f,%.2f\n", (long long)step, (long long)epoch,
                    mean, lr, rate, now - p->t0);
            fflush(p->csv);
        }
        if (p->lines) {
            char r[32], left[32];
            fmt_rate(r, sizeof r, rate);
            fmt_time(left, sizeof left, eta(p, step));
            char total[32] = "?";
            if (p->total > 0) snprintf(total, sizeof total, "%lld", (long long)p->total);
            printf("step %lld/%s  epoch %lld  loss %.4f  lr %.3g  %s %s/s  ETA %s\n",
                   (long long)step, total, (long long)epoch, mean, lr, r, p->unit, left);
            fflush(stdout);
        }
        p->win_t0 = now;
        p->win_loss = p->win_items = 0;
        p->win_steps = 0;
    } else if (p->last_rate == 0 && now > p->win_t0) {
        p->last_rate = p->win_items / (now - p->win_t0);
    }
    if (p->bar && (now - p->t_last_draw >= 0.1 || step == p->total)) {
        draw_bar(p, step);
        p->t_last_draw = now;
    }
}

static void progress_val(fit_progress *p, int64_t step, int64_t epoch, double val_loss) {
    p->last_val = val_loss;
    if (p->csv) {
        fprintf(p->csv, "%lld,%lld,,%.6f,,,%.2f\n", (long long)step, (long long)epoch, val_loss,
                fg_time() - p->t0);
        fflush(p->csv);
    }
    note(p, "step %lld  val loss %.4f", (long long)step, val_loss);
}

static void note(fit_progress *p, const char *fmt, ...) {
    clear_bar(p);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

/* ------------------------------------------------------------ the hooks */

static void csv_row(fit_progress *p) {
    if (!p->csv) return;
    fprintf(p->csv, "step,epoch,train_loss,val_loss,lr,throughput,elapsed_s\n");
    fflush(p->csv);
}

static fg_status setup(void *ud, fg_trainer *t, fg_trainer_fn fn) {
    fit_progress *p = ud;
    p->rank0 = fg_trainer_is_global_zero(t);
    if (fn != FG_FIT || !p->rank0) return FG_OK;
    bool tty = isatty(STDERR_FILENO);
    const char *mode = p->o->progress;
    p->bar = !strcmp(mode, "bar") || (!strcmp(mode, "auto") && tty);
    p->lines = !strcmp(mode, "lines") || (!strcmp(mode, "auto") && !tty);
    p->unit = fit_module_is_gpt(p->m) ? "tok" : "samples";
    p->t0 = p->win_t0 = fg_time();
    p->last_val = -1;
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.csv", p->o->root_dir);
    bool append = p->o->resume != NULL;
    bool exists = append && access(path, F_OK) == 0;
    p->csv = fopen(path, append ? "a" : "w");
    if (!p->csv) return fg_error(FG_EIO, "metrics file %s: cannot open for writing", path);
    if (!exists) csv_row(p);
    return FG_OK;
}

static void teardown(void *ud, fg_trainer *t, fg_trainer_fn fn) {
    (void)t;
    (void)fn;
    fit_progress *p = ud;
    if (p->bar_drawn) fputc('\n', stderr);
    p->bar_drawn = false;
    if (p->csv) fclose(p->csv);
    p->csv = NULL;
}

/* After the checkpoint (if any) is loaded: what is resumed, what runs. */
static fg_status on_fit_start(void *ud, fg_trainer *t) {
    fit_progress *p = ud;
    const fit_opts *o = p->o;
    int64_t acc = fg_trainer_accumulate_grad_batches(t); /* an elastic resume may change it */
    int64_t per_epoch = (fg_trainer_num_training_batches(t) + acc - 1) / acc;
    int64_t max_steps = fg_trainer_max_steps(t), max_epochs = fg_trainer_max_epochs(t);
    p->total = max_steps;
    if (max_epochs > 0 && (p->total < 0 || per_epoch * max_epochs < p->total))
        p->total = per_epoch * max_epochs;
    p->start = p->seen_step = fg_trainer_global_step(t);
    p->seen_skips = 0;
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
    if (fit_module_is_gpt(p->m))
        printf("fit gpt: %lld parameters (layers %lld, heads %lld, embd %lld, ctx %lld, vocab "
               "%lld); %lld train / %lld val windows\n",
               (long long)nparams, (long long)o->layers, (long long)o->heads, (long long)o->embd,
               (long long)o->ctx, (long long)d->vocab, (long long)fg_dataset_len(d->train),
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

/* After each batch: once an optimizer step was taken (or skipped), its
 * loss averaged over ranks, then rank 0's line, bar and row. Collective
 * at those batches (every rank runs its callbacks). */
static fg_status on_train_batch_end(void *ud, fg_trainer *t, fg_batch *b, int64_t i) {
    (void)b;
    (void)i;
    fit_progress *p = ud;
    const char *why;
    int64_t step = fg_trainer_global_step(t), skips = fg_trainer_skipped_steps(t, &why);
    if (step == p->seen_step && skips == p->seen_skips) return FG_OK; /* mid-accumulation */
    double loss;
    int64_t samples;
    fit_module_take_step(p->m, &loss, &samples);
    if (skips != p->seen_skips) {
        p->seen_skips = skips;
        if (p->rank0)
            note(p, "%s: optimizer step skipped on every rank (%lld so far)", why,
                 (long long)skips);
        return FG_OK;
    }
    p->seen_step = step;
    int world = fg_trainer_world_size(t);
    fg_comm *comm = fg_fabric_comm(fg_trainer_fabric(t));
    /* not fg_fabric_reduce_scalar: its NaN on a failed allreduce would read
     * as a non-finite loss, hiding the peer that broke the group */
    /* deterministic: the fabric's loss, the same bits on any world size */
    if (fg_fabric_deterministic(fg_trainer_fabric(t)))
        TRY(fg_fabric_step_loss(fg_trainer_fabric(t), &loss));
    else if (comm && world > 1) TRY(fg_comm_allreduce(comm, &loss, &loss, 1, FG_F64, FG_AVG));
    if (!p->rank0) return FG_OK;
    double items =
        (double)samples * (fit_module_is_gpt(p->m) ? (double)fit_module_ctx(p->m) : 1.0) * world;
    progress_step(p, step, fg_trainer_current_epoch(t), loss, fit_lr_at(p->o, step - 1), items);
    return FG_OK;
}

static fg_status on_validation_end(void *ud, fg_trainer *t) {
    fit_progress *p = ud;
    double v;
    if (!p->rank0 || fg_trainer_state_fn(t) != FG_FIT || fg_trainer_stage(t) != FG_STAGE_VALIDATE ||
        !fg_trainer_callback_metric(t, "val_loss", &v))
        return FG_OK;
    progress_val(p, fg_trainer_global_step(t), fg_trainer_current_epoch(t), v);
    return FG_OK;
}

static void progress_free(void *ud) {
    fit_progress *p = ud;
    if (p->csv) fclose(p->csv);
    free(p);
}

fg_callback *fit_progress_new(const fit_opts *o, fit_module *m) {
    fit_progress *p = calloc(1, sizeof *p);
    if (!p) {
        fg_error(FG_ENOMEM, "progress: out of memory");
        return NULL;
    }
    p->o = o;
    p->m = m;
    return fg_callback_new(&(fg_callback_ops){.name = "fulgur-progress",
                                              .setup = setup,
                                              .teardown = teardown,
                                              .on_fit_start = on_fit_start,
                                              .on_train_batch_end = on_train_batch_end,
                                              .on_validation_end = on_validation_end,
                                              .free = progress_free},
                           p);
}
