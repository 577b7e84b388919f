/* Private header of the metrics layer: the metric struct shared by the
 * common part (metric.c), the classification metrics (classification.c),
 * the regression ones and perplexity (regression.c) and AUROC (auroc.c).
 *
 * Invariants: st[0 .. nst) is the state that compute sums over ranks (all
 * counts and sums, in f64: counts are exact below 2^53); AUROC keeps its
 * scores and labels (n of them) instead. count = samples in the state. */
#ifndef FULGUR_METRICS_IMPL_H
#define FULGUR_METRICS_IMPL_H

#include "core/core_impl.h"
#include "fulgur/metrics.h"

typedef enum fg__mk {
    FG__M_ACCURACY,
    FG__M_PRECISION,
    FG__M_RECALL,
    FG__M_F1,
    FG__M_CONFUSION,
    FG__M_AUROC,
    FG__M_MSE,
    FG__M_MAE,
    FG__M_R2,
    FG__M_PERPLEXITY,
} fg__mk;

struct fg_tmetric {
    fg__mk kind;
    fg_tmetric_opts o;
    int64_t C; /* classes (2 for binary) */
    double *st;
    int64_t nst;
    double *scores, *labels; /* AUROC */
    int64_t n, cap;
    int64_t count;
    bool has_fwd; /* the last forward's batch value, fwd */
    double fwd;
};

/* A metric of `kind` with nst state entries (zero); NULL on error. */
fg_tmetric *fg__tm_alloc(fg__mk kind, const fg_tmetric_opts *o, int64_t nst);
bool fg__tm_is_classification(fg__mk k);

/* The kinds' updates (checked whole before the state changes) and their
 * values from a state s (summed over ranks when synced). */
FG_MUST_USE fg_status fg__tm_class_update(fg_tmetric *m, const fg_tensor *preds,
                                          const fg_tensor *target);
double fg__tm_class_value(const fg_tmetric *m, const double *s);
FG_MUST_USE fg_status fg__tm_reg_update(fg_tmetric *m, const fg_tensor *preds,
                                        const fg_tensor *target);
FG_MUST_USE fg_status fg__tm_reg_value(const fg_tmetric *m, const double *s, double *out);
FG_MUST_USE fg_status fg__tm_auroc_update(fg_tmetric *m, const fg_tensor *preds,
                                          const fg_tensor *target);
FG_MUST_USE fg_status fg__tm_auroc_compute(fg_tmetric *m, double *out);

#endif
