/* fulgur metrics: TorchMetrics' metrics, with its semantics.
 *
 * A metric accumulates a state over batches (fg_tmetric_update), turns it
 * into the value (fg_tmetric_compute) and forgets it (fg_tmetric_reset).
 * With a communicator (opts.comm) and sync_on_compute (the default, as
 * TorchMetrics'), compute first reduces the state over the ranks (sums of
 * counts and of errors; AUROC gathers the scores), so every rank gets the
 * value of all ranks' batches together; the rank's own state is kept as it
 * was (TorchMetrics' unsync after compute), and compute is then collective:
 * every rank calls it, in the same order for every metric.
 *
 * Metrics and their inputs (preds, target: any dtype, read as numbers;
 * targets integers):
 *   Accuracy, Precision, Recall, F1Score (task binary or multiclass),
 *   ConfusionMatrix, AUROC (binary):
 *     binary: preds (N) probabilities, logits (any value outside [0, 1]:
 *       the sigmoid is applied, as TorchMetrics) or labels 0/1, a sample
 *       positive when preds > threshold; target (N) 0/1.
 *     multiclass: preds (N, C) scores (the argmax; Accuracy's top_k: the
 *       k largest) or (N) labels; target (N) in [0, C).
 *     average micro (the default of TorchMetrics' task wrappers
 *     Accuracy(task=...), Precision(task=...)) counts every sample; macro
 *     is the mean over the classes that occur in target or prediction
 *     (TorchMetrics leaves out classes with tp + fp + fn = 0), 0 where a
 *     class's ratio is 0/0 (scikit-learn's zero_division=0).
 *   MeanSquaredError, MeanAbsoluteError, R2Score: preds and target of the
 *     same number of elements, paired in order.
 *   Perplexity: preds (..., V) logits, target (...) token ids of the same
 *     leading elements; exp of the mean negative log-softmax of the target,
 *     targets equal to ignore_index left out.
 *
 * Thread safety: a metric is used by one thread at a time. */
#ifndef FULGUR_METRICS_H
#define FULGUR_METRICS_H

#include "fulgur/comm.h"
#include "fulgur/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fg_tmetric fg_tmetric;

typedef enum fg_tm_task {
    FG_TM_TASK_MULTICLASS = 0,
    FG_TM_TASK_BINARY,
} fg_tm_task;

typedef enum fg_tm_average {
    FG_TM_AVERAGE_MICRO = 0,
    FG_TM_AVERAGE_MACRO,
} fg_tm_average;

/* All-zero is TorchMetrics' defaults where they have one. */
typedef struct fg_tmetric_opts {
    fg_tm_task task;       /* classification */
    int64_t num_classes;   /* multiclass: >= 2, required */
    int64_t top_k;         /* Accuracy, multiclass with (N, C) scores: 0 means 1 */
    fg_tm_average average; /* Accuracy, Precision, Recall, F1Score */
    double threshold;      /* binary: 0 means 0.5 */
    bool has_ignore_index; /* targets equal to ignore_index are left out */
    int64_t ignore_index;
    fg_comm *comm;           /* the ranks compute reduces over; NULL: this process only */
    bool no_sync_on_compute; /* TorchMetrics' sync_on_compute=False: this rank's state only */
} fg_tmetric_opts;

/* New metrics; NULL with fg_last_error (FG_EINVAL naming the bad option,
 * FG_ENOMEM). NULL opts means the defaults (which multiclass metrics
 * cannot use: they need num_classes). */
FG_API fg_tmetric *fg_accuracy_new(const fg_tmetric_opts *o);
FG_API fg_tmetric *fg_precision_new(const fg_tmetric_opts *o);
FG_API fg_tmetric *fg_recall_new(const fg_tmetric_opts *o);
FG_API fg_tmetric *fg_f1_score_new(const fg_tmetric_opts *o);
FG_API fg_tmetric *fg_confusion_matrix_new(const fg_tmetric_opts *o);
FG_API fg_tmetric *fg_auroc_new(const fg_tmetric_opts *o); /* binary */
FG_API fg_tmetric *fg_mean_squared_error_new(const fg_tmetric_opts *o);
FG_API fg_tmetric *fg_mean_absolute_error_new(const fg_tmetric_opts *o);
FG_API fg_tmetric *fg_r2_score_new(const fg_tmetric_opts *o);
FG_API fg_tmetric *fg_perplexity_new(const fg_tmetric_opts *o);
/* NULL is a no-op. */
FG_API void fg_tmetric_free(fg_tmetric *m);

/* Adds a batch to the state. FG_EINVAL naming the problem (shapes that do
 * not fit, a target outside [0, C) or not 0/1, a NaN) leaves the state as
 * it was. */
FG_API FG_MUST_USE fg_status fg_tmetric_update(fg_tmetric *m, const fg_tensor *preds,
                                               const fg_tensor *target);
/* The value of the state (reduced over the ranks first: see above). An
 * empty state gives 0 (TorchMetrics' 0/0 = 0 for the ratios) except R2
 * and Perplexity, which are FG_ESTATE then (TorchMetrics raises / gives
 * NaN). The confusion matrix's value is the count at (0, 0): use
 * fg_tmetric_compute_matrix. */
FG_API FG_MUST_USE fg_status fg_tmetric_compute(fg_tmetric *m, double *out);
/* The confusion matrix (C x C, row = target, column = prediction) into
 * out[C * C] (n = its size). FG_EINVAL for another metric or n too small. */
FG_API FG_MUST_USE fg_status fg_tmetric_compute_matrix(fg_tmetric *m, double *out, int64_t n);
/* TorchMetrics' forward (`value = metric(preds, target)`): adds the batch to
 * the state, as fg_tmetric_update, and gives in *batch_value (may be NULL)
 * the value of this batch alone on this rank, never reduced over ranks
 * (NAN where the batch alone has none: R2 of one sample). The value is
 * kept until the next forward or reset (fg_tmetric_batch_value): what
 * fg_trainer_log_metric logs on_step. Errors: fg_tmetric_update's, with
 * the state as it was. */
FG_API FG_MUST_USE fg_status fg_tmetric_forward(fg_tmetric *m, const fg_tensor *preds,
                                                const fg_tensor *target, double *batch_value);
/* The last forward's batch value in *out; false when there was none since
 * the metric was made or reset. */
FG_API bool fg_tmetric_batch_value(const fg_tmetric *m, double *out);
/* The communicator compute reduces over (the option .comm), set after the
 * metric was made: the Trainer gives its fabric's to a metric logged
 * without one, as Lightning syncs a logged Metric over the process group.
 * NULL: this process only. */
FG_API void fg_tmetric_set_comm(fg_tmetric *m, fg_comm *comm);
FG_API fg_comm *fg_tmetric_comm(const fg_tmetric *m);
/* Forgets every update (and the last forward's batch value). */
FG_API void fg_tmetric_reset(fg_tmetric *m);
/* "Accuracy", "Precision", ... as TorchMetrics' class names. */
FG_API const char *fg_tmetric_name(const fg_tmetric *m);
/* Samples (elements) this rank's state holds. */
FG_API int64_t fg_tmetric_count(const fg_tmetric *m);

#ifdef __cplusplus
}
#endif
#endif
