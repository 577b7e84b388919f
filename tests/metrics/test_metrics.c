/* The metrics against scikit-learn (tests/ref/gen_metrics_ref.py writes
 * metrics_ref.bin): every case of metrics_cases.h in one update and in three
 * uneven batches, to 1e-12; the confusion matrix cell by cell; compute twice
 * and reset; the option and input errors (the state unchanged after a bad
 * update). The multi-rank sync is tests/mp/test_metrics_sync.c. */
#include <math.h>

#include "metrics/metrics_cases.h"

static double rel(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-300); }

TEST(against_sklearn) {
    for (int i = 0; i < NCASES; i++) {
        const mcase *c = &k_cases[i];
        int64_t n = case_rows(c);
        for (int split = 0; split < 2; split++) {
            fg_tmetric *m = c->make(&c->o);
            CHECK_MSG(m != NULL, "%s: %s", c->name, fg_last_error());
            if (!m) continue;
            if (split) { /* [0, 50), [50, 51), [51, n) */
                CHECK_OK(feed(m, c, 0, 50));
                CHECK_OK(feed(m, c, 50, 51));
                CHECK_OK(feed(m, c, 51, n));
            } else {
                CHECK_OK(feed(m, c, 0, n));
            }
            double v = -1;
            CHECK_OK(fg_tmetric_compute(m, &v));
            CHECK_MSG(rel(v, want(c)) <= 1e-12, "%s (%s batches): %.17g, scikit-learn's %.17g",
                      c->name, split ? "three" : "one", v, want(c));
            if (!split)
                printf("  %-14s %-18s %.12f (scikit-learn %.12f)\n", c->name, fg_tmetric_name(m), v,
                       want(c));
            fg_tmetric_free(m);
        }
    }
}

TEST(confusion_matrix) {
    fg_tmetric *m = fg_confusion_matrix_new(&MC(0));
    const mcase c = {"cm", NULL, MC(0), "mc.logits", "mc.target", "mc.confusion"};
    CHECK_OK(feed(m, &c, 0, 120));
    CHECK_OK(feed(m, &c, 120, case_rows(&c)));
    double cm[25];
    CHECK_OK(fg_tmetric_compute_matrix(m, cm, 25));
    const ref_array *w = marr("mc.confusion");
    for (int k = 0; k < 25; k++)
        CHECK_MSG(cm[k] == ref_at(w, k), "cell (%d, %d): %g, scikit-learn's %g", k / 5, k % 5,
                  cm[k], ref_at(w, k));
    CHECK_STATUS(fg_tmetric_compute_matrix(m, cm, 24), FG_EINVAL);
    fg_tmetric_free(m);
    /* predicted labels instead of scores give the same matrix */
    fg_tmetric *a = fg_accuracy_new(&MC(0));
    fg_tensor *labels = fg_tensor_new(FG_I64, 1, (int64_t[]){3});
    fg_tensor *t = fg_tensor_new(FG_I32, 1, (int64_t[]){3});
    int64_t *l = fg_tensor_data(labels);
    int32_t *tt = fg_tensor_data(t);
    l[0] = 1, l[1] = 4, l[2] = 0;
    tt[0] = 1, tt[1] = 2, tt[2] = 0;
    CHECK_OK(fg_tmetric_update(a, labels, t));
    double v;
    CHECK_OK(fg_tmetric_compute(a, &v));
    CHECK_CLOSE(v, 2.0 / 3, 1e-15, 0);
    fg_tensor_free(labels);
    fg_tensor_free(t);
    fg_tmetric_free(a);
}

TEST(compute_reset) {
    const mcase *c = &k_cases[0];
    fg_tmetric *m = c->make(&c->o);
    double v0, v1, v2;
    CHECK_OK(fg_tmetric_compute(m, &v0));
    CHECK(v0 == 0 && fg_tmetric_count(m) == 0); /* empty: 0/0 = 0 */
    CHECK_OK(feed(m, c, 0, case_rows(c)));
    CHECK(fg_tmetric_count(m) == case_rows(c));
    CHECK_OK(fg_tmetric_compute(m, &v1));
    CHECK_OK(fg_tmetric_compute(m, &v2));
    CHECK(v1 == v2 && v1 == want(c));
    fg_tmetric_reset(m);
    CHECK(fg_tmetric_count(m) == 0);
    CHECK_OK(feed(m, c, 0, 10));
    CHECK_OK(fg_tmetric_compute(m, &v2));
    CHECK(v2 != v1);
    fg_tmetric_free(m);
    /* R2 and Perplexity refuse an empty state */
    m = fg_r2_score_new(NULL);
    CHECK_STATUS(fg_tmetric_compute(m, &v0), FG_ESTATE);
    CHECK_CONTAINS(fg_last_error(), "at least two");
    fg_tmetric_free(m);
    m = fg_perplexity_new(NULL);
    CHECK_STATUS(fg_tmetric_compute(m, &v0), FG_ESTATE);
    fg_tmetric_free(m);
}

TEST(errors) {
    CHECK(fg_accuracy_new(NULL) == NULL);
    CHECK_CONTAINS(fg_last_error(), "num_classes = 0");
    CHECK(fg_accuracy_new(&MC(.top_k = 6)) == NULL);
    CHECK_CONTAINS(fg_last_error(), "top_k = 6");
    CHECK(fg_precision_new(&MC(.top_k = 2)) == NULL);
    CHECK(fg_accuracy_new(&BIN(.threshold = 1.5)) == NULL);
    CHECK(fg_auroc_new(&MC(0)) == NULL);
    CHECK_CONTAINS(fg_last_error(), "binary");
    /* a target out of range: nothing counted */
    fg_tmetric *m = fg_accuracy_new(&MC(0));
    const mcase c = {"x", NULL, MC(0), "mc.logits", "mc.target", "mc.acc_micro"};
    CHECK_OK(feed(m, &c, 0, 10));
    fg_tensor *p = rows(marr("mc.logits"), 0, 2), *t = fg_tensor_new(FG_I32, 1, (int64_t[]){2});
    ((int32_t *)fg_tensor_data(t))[0] = 1;
    ((int32_t *)fg_tensor_data(t))[1] = 5;
    CHECK_STATUS(fg_tmetric_update(m, p, t), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "target[1] = 5: expected a class in [0, 5)");
    CHECK(fg_tmetric_count(m) == 10);
    fg_tensor *t3 = fg_tensor_new(FG_I32, 1, (int64_t[]){3});
    CHECK_STATUS(fg_tmetric_update(m, p, t3), FG_EINVAL); /* 10 scores for 3 targets */
    CHECK_CONTAINS(fg_last_error(), "preds of 10 elements for 3 targets");
    fg_tensor_free(p);
    fg_tensor_free(t);
    fg_tensor_free(t3);
    fg_tmetric_free(m);
    m = fg_mean_squared_error_new(NULL);
    p = fg_tensor_new(FG_F64, 1, (int64_t[]){2});
    t = fg_tensor_new(FG_F64, 1, (int64_t[]){3});
    CHECK_STATUS(fg_tmetric_update(m, p, t), FG_EINVAL);
    CHECK_STATUS(fg_tmetric_compute_matrix(m, NULL, 0), FG_EINVAL);
    CHECK(!strcmp(fg_tmetric_name(m), "MeanSquaredError"));
    fg_tensor_free(p);
    fg_tensor_free(t);
    fg_tmetric_free(m);
}
