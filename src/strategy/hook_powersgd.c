/* PowerSGD (Vogels, Karimireddy and Jaggi 2019) as torch's powerSGD_hook:
 * each parameter of a bucket with 2 or more dims is a matrix M (n, m) =
 * (shape[0], numel / shape[0]), approximated by P Q^T of rank r, where only
 * P (n, r) and Q (m, r) travel. The parameters too small to gain (r (n + m)
 * * min_compression_rate >= n m) and the 1-dim ones go through one plain
 * averaging allreduce. fg_powersgd_opts in strategy.h has the steps.
 *
 * State, per bucket: the error-feedback residual (the bucket's size) and
 * the Qs of its compressed parameters (warm start), both made at the first
 * compressed backward. The random Qs come from fg_rng_fill_normal with a
 * seed derived from (random_seed, draws so far): every rank draws the same
 * numbers in the same order, as PyTorch seeds torch.randn from a numpy RNG
 * seeded alike on every rank. The products run in f32 on OpenBLAS on one
 * thread, Gram-Schmidt in f32 with double dots (orthogonalize). */
#include <math.h>
#include <string.h>

#include "ddp_hooks.h"
#include "ops/ops_impl.h"

typedef struct pbucket {
    float *err; /* numel: residual, NULL until the first compressed backward */
    float *q; /* the Qs of the compressed parameters, each as Qt (r, m), packed; NULL until then */
} pbucket;

typedef struct psgd {
    int rank;
    int64_t start;
    double min_rate, eps;
    bool ef, warm;
    uint64_t seed, draws;
    int nb;
    pbucket *b;
    float *scratch; /* the Ps (each as Pt (r, n)) and the uncompressed elements */
    int64_t scratch_cap;
} psgd;

static FG_MUST_USE fg_status state_new(fg_strategy *s, const fg_ddp_opts *o, void **out) {
    (void)s;
    const fg_powersgd_opts *po = &o->powersgd;
    psgd *p = fg_calloc(1, sizeof *p);
    if (!p) return fg_error_wrap(FG_ENOMEM, "powersgd setup");
    p->rank = po->matrix_approximation_rank > 0 ? po->matrix_approximation_rank : 1;
    p->start = po->start_powerSGD_iter == 0 ? 1000 : FG_MAX(0, po->start_powerSGD_iter);
    p->min_rate = po->min_compression_rate > 0 ? po->min_compression_rate : 2.0;
    p->eps = po->orthogonalization_epsilon;
    p->ef = !po->no_error_feedback;
    p->warm = !po->no_warm_start;
    p->seed = po->random_seed;
    *out = p;
    return FG_OK;
}

static void state_free(void *state) {
    psgd *p = state;
    if (!p) return;
    for (int i = 0; i < p->nb; i++) {
        fg_free(p->b[i].err);
        fg_free(p->b[i].q);
    }
    fg_free(p->b);
    fg_free(p->scratch);
    fg_free(p);
}

/* The matrix view of parameter t and its rank; false when it goes
 * uncompressed. */
static bool as_matrix(const psgd *p, const fg_tensor *t, int64_t *n, int64_t *m, int64_t *r) {
    int64_t numel = fg_tensor_numel(t);
    if (fg_tensor_ndim(t) < 2 || numel == 0) return false;
    *n = fg_tensor_shape(t)[0];
    *m = numel / *n;
    *r = FG_MIN((int64_t)p->rank, FG_MIN(*n, *m));
    return (double)(*r * (*n + *m)) * p->min_rate < (double)(*n * *m);
}

/* sum over k < n of x[k] y[k], in double, in a fixed order (8 partial
 * sums, then added in order): the same bits on every rank. */
static double dot(const float *x, const float *y, int64_t n) {
    double acc[8] = {0};
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        for (int l = 0; l < 8; l++) acc[l] += (double)x[k + l] * y[k + l];
    for (; k < n; k++) acc[k & 7] += (double)x[k] * y[k];
    double s = 0;
    for (int l = 0; l < 8; l++) s += acc[l];
    return s;
}

/* x -= d y, then returns dot(z, x) of the updated x (fused: one pass). */
static double axpy_dot(float *x, float d, const float *y, const float *z, int64_t n) {
    double acc[8] = {0};
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        for (int l = 0; l < 8; l++) {
            x[k + l] -= d * y[k + l];
            acc[l] += (double)z[k + l] * x[k + l];
        }
    for (; k < n; k++) {
        x[k] -= d * y[k];
        acc[k & 7] += (double)z[k] * x[k];
    }
    double s = 0;
    for (int l = 0; l < 8; l++) s += acc[l];
    return s;
}

/* Gram-Schmidt over the `cols` columns of length `len` of a column-major
 * matrix (column j at a + j len, contiguous), as torch's
 * _orthogonalize_gram_schmidt (each column made orthogonal to the ones
 * before, then divided by its norm + eps; modified Gram-Schmidt: each
 * projection is taken of the column as the previous one left it), in f32
 * with the dots and norms summed in double, with two additions for a P of
 * more columns than the rank of the summed gradient (rank = min(n, m) on a
 * rank-deficient matrix), where PyTorch's columns past the rank are
 * normalised rounding noise, not orthogonal to the others, and P P^T M is
 * no longer M: a column that lost more than 1 - 1/sqrt(2) of its norm to
 * the projections is projected once more ("twice is enough", Kahan and
 * Parlett), and one left with less than 1e-5 of its norm is numerically
 * dependent and set to zero. A zero column stays zero (PyTorch would make
 * it NaN). Columns of full-rank P are PyTorch's up to rounding. One pass
 * over the column per projection: the update by one column is fused with
 * the dot of the next. */
static void orthogonalize(float *a, int64_t len, int64_t cols, double eps) {
    for (int64_t j = 0; j < cols; j++) {
        float *x = a + j * len;
        double orig = dot(x, x, len);
        double before = orig, after = orig;
        for (int pass = 0; pass < 2 && j > 0; pass++) {
            if (pass == 1 && after >= 0.5 * before) break;
            before = after;
            double d = dot(a, x, len); /* with column 0 */
            for (int64_t i = 0; i < j; i++) {
                const float *next = i + 1 < j ? a + (i + 1) * len : x;
                d = axpy_dot(x, (float)d, a + i * len, next, len);
            }
            after = d; /* the last fused dot is x's own norm */
        }
        double dn = sqrt(after) + eps;
        float inv = dn > 0 && after > 1e-10 * orig ? (float)(1.0 / dn) : 0.0f;
        for (int64_t k = 0; k < len; k++) x[k] *= inv;
    }
}

/* The low-rank products, in f32 on OpenBLAS on this thread alone (as
 * PyTorch's torch.matmul in the gradient's dtype; one thread so that every
 * rank computes P Q^T, which all must agree on, to the same bits). P and Q
 * are kept transposed, Pt (r, n) and Qt (r, m), so that their columns are
 * contiguous for orthogonalize. */

/* Pt (r, n) = Qt (r, m) M^T: P = M Q */
static FG_MUST_USE fg_status mul_mq(const float *M, const float *Qt, float *Pt, int64_t n,
                                    int64_t m, int64_t r) {
    return fg__ops_sgemm_serial(false, true, r, n, m, Qt, m, M, m, 0.0f, Pt, n);
}

/* Qt (r, m) = Pt (r, n) M: Q = M^T P */
static FG_MUST_USE fg_status mul_mtp(const float *M, const float *Pt, float *Qt, int64_t n,
                                     int64_t m, int64_t r) {
    return fg__ops_sgemm_serial(false, false, r, m, n, Pt, n, M, m, 0.0f, Qt, m);
}

/* M (n, m) = Pt^T Qt: M = P Q^T */
static FG_MUST_USE fg_status mul_pqt(const float *Pt, const float *Qt, float *M, int64_t n,
                                     int64_t m, int64_t r) {
    return fg__ops_sgemm_serial(true, false, n, m, r, Pt, n, Qt, m, 0.0f, M, m);
}

static FG_MUST_USE fg_status grow(psgd *p, int64_t n) {
    if (n <= p->scratch_cap) return FG_OK;
    float *s = fg_realloc(p->scratch, (size_t)n * sizeof *s);
    if (!s) return fg_error_wrap(FG_ENOMEM, "powersgd");
    p->scratch = s;
    p->scratch_cap = n;
    return FG_OK;
}

/* Copies the bucket's elements outside the compressed parameters (1-dim
 * and small parameters, and any gap between parameters) to U, packed in
 * bucket order, or (back) from U to the bucket. Returns their count. */
static int64_t pack(const psgd *p, const fg_ddp_bucket *b, float *U, bool back) {
    int64_t pos = 0, u = 0;
    for (int i = 0; i <= b->nparams; i++) {
        int64_t n, m, r, lo = b->numel, hi = b->numel;
        if (i < b->nparams) {
            if (!as_matrix(p, b->params[i], &n, &m, &r)) continue;
            lo = b->param_offsets[i];
            hi = lo + n * m;
        }
        if (lo > pos) {
            size_t bytes = (size_t)(lo - pos) * sizeof *U;
            if (back) memcpy(b->grad + pos, U + u, bytes);
            else memcpy(U + u, b->grad + pos, bytes);
            u += lo - pos;
        }
        pos = hi;
    }
    return u;
}

static FG_MUST_USE fg_status run(void *state, const fg_ddp_bucket *b) {
    psgd *p = state;
    if (b->iter < p->start) return fg_ddp_bucket_allreduce(b, b->grad, b->numel, FG_REDUCE_OP_AVG);
    if (!p->b) {
        p->b = fg_calloc((size_t)b->num_buckets, sizeof *p->b);
        if (!p->b) return fg_error_wrap(FG_ENOMEM, "powersgd");
        p->nb = b->num_buckets;
    }
    pbucket *pb = &p->b[b->index];
    /* sizes: compressed elements, Ps and Qs */
    int64_t nc = 0, np = 0, nq = 0;
    for (int i = 0; i < b->nparams; i++) {
        int64_t n, m, r;
        if (!as_matrix(p, b->params[i], &n, &m, &r)) continue;
        nc += n * m;
        np += n * r;
        nq += m * r;
    }
    int64_t nu = b->numel - nc;
    /* scratch: [Ps (np) | uncompressed (nu)] */
    FG_TRY(grow(p, np + nu));
    float *P = p->scratch, *U = P + np;
    if (p->ef) {
        if (!pb->err) {
            pb->err = fg_calloc((size_t)b->numel + 1, sizeof *pb->err);
            if (!pb->err) return fg_error_wrap(FG_ENOMEM, "powersgd");
        }
        /* the input (gradient + residual) in both: err keeps it until the
         * residual is taken at the end */
        float *restrict e = pb->err, *restrict g = b->grad;
        for (int64_t i = 0; i < b->numel; i++) g[i] = e[i] += g[i];
    }
    bool fresh = !pb->q || !p->warm;
    if (!pb->q) {
        pb->q = fg_calloc((size_t)nq + 1, sizeof *pb->q);
        if (!pb->q) return fg_error_wrap(FG_ENOMEM, "powersgd");
    }
    if (fresh) fg_rng_fill_normal(fg_rng_derive(p->seed, p->draws++), 0, pb->q, nq, 0, 1);
    if (pack(p, b, U, false) != nu)
        return fg_error(FG_EINTERNAL, "powersgd: bucket %d: parameters overlap", b->index);
    FG_TRY(fg_ddp_bucket_allreduce(b, U, nu, FG_REDUCE_OP_AVG));
    /* P = M Q for each compressed parameter (reused Qs orthogonalised first) */
    int64_t po = 0, qo = 0;
    for (int i = 0; i < b->nparams; i++) {
        int64_t n, m, r;
        if (!as_matrix(p, b->params[i], &n, &m, &r)) continue;
        float *Q = pb->q + qo;
        if (!fresh) orthogonalize(Q, m, r, p->eps);
        FG_TRY(mul_mq(b->grad + b->param_offsets[i], Q, P + po, n, m, r));
        po += n * r;
        qo += m * r;
    }
    FG_TRY(fg_ddp_bucket_allreduce(b, P, np, FG_REDUCE_OP_SUM));
    /* orthogonal P; Q = M^T P */
    po = qo = 0;
    for (int i = 0; i < b->nparams; i++) {
        int64_t n, m, r;
        if (!as_matrix(p, b->params[i], &n, &m, &r)) continue;
        orthogonalize(P + po, n, r, p->eps);
        FG_TRY(mul_mtp(b->grad + b->param_offsets[i], P + po, pb->q + qo, n, m, r));
        po += n * r;
        qo += m * r;
    }
    FG_TRY(fg_ddp_bucket_allreduce(b, pb->q, nq, FG_REDUCE_OP_SUM));
    float w = (float)b->world_size;
    for (int64_t i = 0; i < nq; i++) pb->q[i] /= w;
    /* M' = P Q^T in place; the averaged uncompressed elements back */
    po = qo = 0;
    for (int i = 0; i < b->nparams; i++) {
        int64_t n, m, r;
        if (!as_matrix(p, b->params[i], &n, &m, &r)) continue;
        FG_TRY(mul_pqt(P + po, pb->q + qo, b->grad + b->param_offsets[i], n, m, r));
        po += n * r;
        qo += m * r;
    }
    pack(p, b, U, true);
    if (p->ef) { /* residual = input - what is applied */
        float *restrict e = pb->err;
        const float *restrict g = b->grad;
        for (int64_t i = 0; i < b->numel; i++) e[i] -= g[i];
    }
    return FG_OK;
}

const float *fg__powersgd_residual(const fg_strategy *s, int b) {
    if (s->hook != &fg__hook_powersgd) return NULL;
    const psgd *p = s->hook_state;
    return p->b && b >= 0 && b < p->nb ? p->b[b].err : NULL;
}

void fg__powersgd_orthogonalize(float *a, int64_t len, int64_t cols, double eps) {
    orthogonalize(a, len, cols, eps);
}

const fg__ddp_hook_vt fg__hook_powersgd = {
    .name = "powersgd", .state_new = state_new, .state_free = state_free, .run = run};
