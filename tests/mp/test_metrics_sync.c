/* The metrics' sync_on_compute on 2 and 3 ranks (forked processes on the
 * shm backend): each rank updates an uneven slice of the inputs of every
 * case of metrics_cases.h; compute reduces the states (AUROC gathers the
 * scores) and every rank gets scikit-learn's value of the whole set (to
 * 1e-12, the sums being added in another order), the rank's own state left
 * as it was; with no_sync_on_compute each rank gets its slice's value,
 * bitwise a lone metric's; and the confusion matrix is the whole set's. */
#include <math.h>

#include "metrics/metrics_cases.h"
#include "mp_join.h"

/* rank r of w takes rows [n r^2 / w^2, n (r+1)^2 / w^2) */
static int64_t cut(int64_t n, int r, int w) { return n * r * r / ((int64_t)w * w); }

static int sync_rank(int rank, int world, void *arg) {
    (void)arg;
    char job[64];
    snprintf(job, sizeof job, "metrics-%d-%d", world, (int)getppid());
    fg_comm *comm = mp_join_shm(rank, world, job, 60);
    if (!comm) return 1;
    for (int i = 0; i < NCASES; i++) {
        const mcase *c = &k_cases[i];
        int64_t n = case_rows(c), lo = cut(n, rank, world), hi = cut(n, rank + 1, world);
        fg_tmetric_opts o = c->o;
        o.comm = comm;
        fg_tmetric *m = c->make(&o);
        o.no_sync_on_compute = true;
        fg_tmetric *own = c->make(&o);
        fg_tmetric *lone = c->make(&c->o);
        CHECK_OK(feed(m, c, lo, hi));
        CHECK_OK(feed(own, c, lo, hi));
        CHECK_OK(feed(lone, c, lo, hi));
        double v = -1, v2 = -1, mine = -1, alone = -2;
        CHECK_OK(fg_tmetric_compute(m, &v));
        CHECK_MSG(fabs(v - want(c)) <= 1e-12 * fmax(1, fabs(want(c))),
                  "%s rank %d of %d: %.17g, scikit-learn's %.17g", c->name, rank, world, v,
                  want(c));
        CHECK_OK(fg_tmetric_compute(m, &v2)); /* the state stayed this rank's: the same */
        CHECK(v2 == v &&
              fg_tmetric_count(m) == (c->o.has_ignore_index ? fg_tmetric_count(lone) : hi - lo));
        fg_status so = fg_tmetric_compute(own, &mine), sa = fg_tmetric_compute(lone, &alone);
        CHECK(so == sa);
        CHECK_MSG(so != FG_OK || !memcmp(&mine, &alone, sizeof mine),
                  "%s rank %d: unsynced %.17g, a lone metric's %.17g", c->name, rank, mine, alone);
        fg_tmetric_free(m);
        fg_tmetric_free(own);
        fg_tmetric_free(lone);
    }
    /* the confusion matrix of the whole set */
    const mcase c = {"cm", NULL, MC(.comm = comm), "mc.logits", "mc.target", "mc.confusion"};
    fg_tmetric *m = fg_confusion_matrix_new(&c.o);
    int64_t n = case_rows(&c);
    CHECK_OK(feed(m, &c, cut(n, rank, world), cut(n, rank + 1, world)));
    double cm[25];
    CHECK_OK(fg_tmetric_compute_matrix(m, cm, 25));
    for (int k = 0; k < 25; k++) CHECK(cm[k] == ref_at(marr("mc.confusion"), k));
    fg_tmetric_free(m);
    fg_comm_free(comm);
    return 0;
}

TEST(sync_on_compute_2_ranks) { CHECK(fg_test_fork_ranks(2, sync_rank, NULL, 120) == 0); }
TEST(sync_on_compute_3_ranks) { CHECK(fg_test_fork_ranks(3, sync_rank, NULL, 120) == 0); }
