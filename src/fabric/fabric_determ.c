/* The deterministic mode's fabric side (the sums themselves are the
 * strategy's: strategy/deterministic.c) and the global batch kept across
 * a resume on another world size (elastic training). */
#include <stdlib.h>
#include <string.h>

#include "fabric_impl.h"
#include "ops/cpu/blas.h"

bool fg_fabric_deterministic(const fg_fabric *f) { return f && f->cfg.deterministic; }

fg_status fg__fabric_deterministic_pin(fg_fabric *f) {
    (void)f;
    /* the thread count the plan set, never fewer under load: a product's
     * bits can depend on it */
    fg__threads_pin();
    /* the engine per shape class is measured per machine: one engine for
     * every product, so nothing but the shape decides the bits. An engine
     * the user fixed (FULGUR_GEMM=onednn or openblas) is fixed already. */
    const char *e = getenv("FULGUR_GEMM");
    if (e && (!strcmp(e, "onednn") || !strcmp(e, "openblas"))) return FG_OK;
    /* the faster one by the machine's type: oneDNN's kernels with AVX-512
     * (by 1.5x on bench/determ_cost's gpt), OpenBLAS's otherwise */
    bool dnnl = strcmp(fg__dnnl_version(), "none") != 0 && fg_cpu_isa() == FG_ISA_AVX512;
    fg_status s = fg__gemm_set_mode(dnnl ? "onednn" : "openblas");
    return s == FG_OK ? FG_OK : fg_error_wrap(s, "deterministic");
}

fg_status fg_fabric_step_loss(fg_fabric *f, double *loss) {
    if (!f || !loss) return fg_error(FG_EINVAL, "step_loss: NULL argument");
    if (!f->strategy) return fg_error(FG_ESTATE, "step_loss: call fg_fabric_setup first");
    FG_TRY(fg_strategy_step_loss(f->strategy, loss));
    *loss /= fg_scaler_scale(f->scaler); /* 1 without one; a power of 2: exact */
    return FG_OK;
}

fg_status fg_fabric_setup_global_batch(fg_fabric *f, fg_dataloader *dl, int64_t *accumulate,
                                       const fg_train_state *resumed) {
    if (!f || !dl || !accumulate) return fg_error(FG_EINVAL, "setup_global_batch: NULL argument");
    if (*accumulate < 1)
        return fg_error(FG_EINVAL, "setup_global_batch: accumulate %lld (must be >= 1)",
                        (long long)*accumulate);
    const fg_loader_opts *o = fg_dataloader_opts(dl);
    int64_t B = o->batch ? o->batch : 1, W = f->world_size;
    int64_t G = B * W * *accumulate;
    /* on another world size the checkpoint's global batch rules; on the
     * same, the program's (a changed accumulation is taken as asked) */
    const char *ws = resumed ? fg_fabric_loaded_meta(f, "world_size") : NULL;
    bool resized = ws && strtoll(ws, NULL, 10) != W;
    bool kept = resized && resumed->global_batch > 0;
    if (kept && resumed->global_batch % (B * W) != 0) {
        /* the batch sizes that would keep it on this world size */
        int64_t Gc = resumed->global_batch;
        char fits[256] = "";
        size_t len = 0;
        for (int64_t b = 1; b <= Gc / W && len + 24 < sizeof fits; b++)
            if (Gc % (b * W) == 0)
                len += (size_t)snprintf(fits + len, sizeof fits - len, "%s%lld", len ? ", " : "",
                                        (long long)b);
        char why[768];
        snprintf(why, sizeof why,
                 "the checkpoint's global batch is %lld samples per step, which %lld rank%s with "
                 "batch size %lld cannot make (%lld is no multiple of %lld x %lld); on %lld "
                 "rank%s use a batch size of %s, or another number of ranks",
                 (long long)Gc, (long long)W, W == 1 ? "" : "s", (long long)B, (long long)Gc,
                 (long long)B, (long long)W, (long long)W, W == 1 ? "" : "s",
                 len ? fits : "(none: fewer ranks)");
        /* the deterministic contract needs it; otherwise the run goes on
         * with the global batch asked for, and says so */
        if (f->cfg.deterministic) return fg_error(FG_EINVAL, "%s", why);
        fg_log(FG_LOG_WARN, "%s; this run's global batch is %lld", why, (long long)G);
        kept = false;
    }
    if (kept) {
        G = resumed->global_batch;
        *accumulate = G / (B * W);
    }
    f->micro_batch = B;
    /* under deterministic the micro-batch decides the bits: a resume that
     * keeps the global batch with another one continues with other bits
     * than the run would have had, and says so */
    const char *mb =
        resumed && f->cfg.deterministic ? fg_fabric_loaded_meta(f, "micro_batch") : NULL;
    if (mb && strtoll(mb, NULL, 10) != B)
        fg_log(FG_LOG_WARN,
               "deterministic: the checkpoint was trained with micro-batches of %s samples, this "
               "run takes %lld: the same global batch of %lld, other bits than the run would "
               "have had (to continue its bits, keep a batch size of %s per rank)",
               mb, (long long)B, (long long)G, mb);
    bool stream = fg_dataloader_is_stream(dl);
    if (stream && (f->cfg.deterministic || resized))
        return fg_error(FG_EUNSUPPORTED,
                        "a loader over a stream %s: its samples come in the stream's order, "
                        "split by rank, and cannot be regrouped; use a dataset (fg_dataset_new) "
                        "for that",
                        f->cfg.deterministic ? "under deterministic"
                                             : "resumed on another world size");
    if (f->cfg.deterministic) {
        /* blocks of one micro-batch, the epoch cut to whole global batches */
        fg_distributed_opts d = {
            .shuffle = o->shuffle, .seed = o->seed, .drop_last = true, .block = B, .round = G};
        fg_sampler *s = fg_sampler_distributed(fg_dataset_len(fg_dataloader_dataset(dl)),
                                               f->global_rank, (int)W, &d);
        FG_TRY(fg_dataloader_set_sampler(dl, s));
        int64_t n = fg_dataset_len(fg_dataloader_dataset(dl));
        if (fg_dataloader_len(dl) == 0)
            return fg_error(FG_EINVAL,
                            "deterministic: %lld samples make no global batch of %lld (batch %lld "
                            "x %lld rank%s x %lld accumulated): lower the batch size or the "
                            "accumulation",
                            (long long)n, (long long)G, (long long)B, (long long)W,
                            W == 1 ? "" : "s", (long long)*accumulate);
    }
    if (!resumed) return fg_dataloader_set_epoch(dl, 0);
    if (resumed->global_batch > 0 && resumed->samples_in_epoch >= 0) {
        int64_t P = resumed->samples_in_epoch, step = B * W, end = fg_dataloader_len(dl) * step;
        /* past what this world size keeps of the epoch (its dropped tail is
         * longer): the epoch is over */
        if (!stream && P > end && P <= fg_dataset_len(fg_dataloader_dataset(dl))) P = end;
        if (P % step != 0 && !f->cfg.deterministic) {
            /* no batch boundary here: go back to the last one, and say how
             * many samples are taken again */
            fg_log(FG_LOG_WARN,
                   "resume on %lld rank%s with batch %lld: %lld samples into epoch %lld is no "
                   "multiple of %lld; %lld samples of it are taken again",
                   (long long)W, W == 1 ? "" : "s", (long long)B, (long long)P,
                   (long long)resumed->epoch, (long long)step, (long long)(P % step));
            P -= P % step;
        }
        fg_status s = fg_dataloader_set_sample_position(dl, resumed->epoch, P);
        return s == FG_OK
                   ? FG_OK
                   : fg_error_wrap(s, "resume on %lld rank%s", (long long)W, W == 1 ? "" : "s");
    }
    return fg_dataloader_set_position(dl, resumed->epoch, resumed->batch_in_epoch);
}
