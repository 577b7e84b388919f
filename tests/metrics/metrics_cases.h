/* The metric cases the metrics tests share (tests/ref/gen_metrics_ref.py
 * wrote their inputs and scikit-learn's values to metrics_ref.bin): each
 * case makes its metric, names its inputs and the expected value; feed()
 * updates a metric with rows [lo, hi) of the inputs, copied into tensors. */
#ifndef FULGUR_TEST_METRICS_CASES_H
#define FULGUR_TEST_METRICS_CASES_H

#include <string.h>

#include "fulgur/metrics.h"
#include "harness.h"
#include "ref/ref_file.h"

typedef struct mcase {
    const char *name;
    fg_tmetric *(*make)(const fg_tmetric_opts *);
    fg_tmetric_opts o;
    const char *preds, *target, *want;
} mcase;

/* options of 5 classes / binary: as an initializer (I) and as a value */
#define MCI(...)                                                                                   \
    { .num_classes = 5, __VA_ARGS__ }
#define BINI(...)                                                                                  \
    { .task = FG_TM_TASK_BINARY, __VA_ARGS__ }
#define MC(...) (fg_tmetric_opts) MCI(__VA_ARGS__)
#define BIN(...) (fg_tmetric_opts) BINI(__VA_ARGS__)

static const mcase k_cases[] = {
    {"acc_micro", fg_accuracy_new, MCI(0), "mc.logits", "mc.target", "mc.acc_micro"},
    {"acc_macro", fg_accuracy_new, MCI(.average = FG_TM_AVERAGE_MACRO), "mc.logits", "mc.target",
     "mc.acc_macro"},
    {"acc_top2", fg_accuracy_new, MCI(.top_k = 2), "mc.logits", "mc.target", "mc.acc_top2"},
    {"prec_micro", fg_precision_new, MCI(0), "mc.logits", "mc.target", "mc.prec_micro"},
    {"prec_macro", fg_precision_new, MCI(.average = FG_TM_AVERAGE_MACRO), "mc.logits", "mc.target",
     "mc.prec_macro"},
    {"rec_micro", fg_recall_new, MCI(0), "mc.logits", "mc.target", "mc.rec_micro"},
    {"rec_macro", fg_recall_new, MCI(.average = FG_TM_AVERAGE_MACRO), "mc.logits", "mc.target",
     "mc.rec_macro"},
    {"f1_micro", fg_f1_score_new, MCI(0), "mc.logits", "mc.target", "mc.f1_micro"},
    {"f1_macro", fg_f1_score_new, MCI(.average = FG_TM_AVERAGE_MACRO), "mc.logits", "mc.target",
     "mc.f1_macro"},
    {"acc_ignore", fg_accuracy_new, MCI(.has_ignore_index = true, .ignore_index = -1), "mc.logits",
     "mc.target_ign", "mc.acc_ign"},
    {"bin_acc", fg_accuracy_new, BINI(0), "bin.probs", "bin.target", "bin.acc"},
    {"bin_prec", fg_precision_new, BINI(0), "bin.probs", "bin.target", "bin.prec"},
    {"bin_rec", fg_recall_new, BINI(0), "bin.probs", "bin.target", "bin.rec"},
    {"bin_f1", fg_f1_score_new, BINI(0), "bin.probs", "bin.target", "bin.f1"},
    {"bin_acc_logits", fg_accuracy_new, BINI(0), "bin.logits", "bin.target", "bin.acc_logits"},
    {"auroc", fg_auroc_new, BINI(0), "bin.probs", "bin.target", "bin.auroc"},
    {"auroc_tied", fg_auroc_new, BINI(0), "bin.probs_tied", "bin.target", "bin.auroc_tied"},
    {"mse", fg_mean_squared_error_new, {0}, "reg.preds", "reg.target", "reg.mse"},
    {"mae", fg_mean_absolute_error_new, {0}, "reg.preds", "reg.target", "reg.mae"},
    {"r2", fg_r2_score_new, {0}, "reg.preds", "reg.target", "reg.r2"},
    {"perplexity",
     fg_perplexity_new,
     {.has_ignore_index = true, .ignore_index = -100},
     "ppl.logits",
     "ppl.target",
     "ppl.value"},
};
#define NCASES ((int)(sizeof k_cases / sizeof k_cases[0]))

static ref_file *mref;

__attribute__((destructor)) static void close_mref(void) { ref_close(mref); }

static const ref_array *marr(const char *name) {
    if (!mref) mref = ref_open(fg_test_path("ref/metrics_ref.bin"));
    return ref_get(mref, name);
}

/* rows [lo, hi) of an array as a new tensor of its dtype */
static fg_tensor *rows(const ref_array *a, int64_t lo, int64_t hi) {
    int64_t shape[8], per = 1;
    for (int d = 1; d < a->ndim; d++) per *= a->shape[d];
    memcpy(shape, a->shape, sizeof(int64_t) * (size_t)a->ndim);
    shape[0] = hi - lo;
    fg_tensor *t = fg_tensor_new(a->dtype, a->ndim, shape);
    size_t es = fg_dtype_size(a->dtype);
    memcpy(fg_tensor_data(t), (const char *)a->data + es * (size_t)(lo * per),
           es * (size_t)((hi - lo) * per));
    return t;
}

static int64_t case_rows(const mcase *c) { return marr(c->target)->shape[0]; }

static fg_status feed(fg_tmetric *m, const mcase *c, int64_t lo, int64_t hi) {
    fg_tensor *p = rows(marr(c->preds), lo, hi), *t = rows(marr(c->target), lo, hi);
    fg_status s = fg_tmetric_update(m, p, t);
    fg_tensor_free(p);
    fg_tensor_free(t);
    return s;
}

static double want(const mcase *c) { return ref_at(marr(c->want), 0); }

#endif
