/* Layer normalisation over the last dim of x (N, C), as PyTorch's
 * layer_norm: y = (x - mean) * rstd * w + b with the biased variance and
 * rstd = 1 / sqrt(var + eps); w and b (C) may each be NULL (1 and 0).
 * Forward saves mean and rstd (N) for the backward.
 *
 * Mean and variance are two passes over the row (no E[x^2] - E[x]^2
 * cancellation), summed in T after shifting by the row's first element, so
 * that an f32 sum adds numbers of the row's spread, not of its offset
 * (double sums cost 25% more here for no digit the saved f32 mean keeps).
 * Backward:
 *   xhat = (x - mean) * rstd,  g = dy * w,
 *   dx += rstd * (g - mean(g) - xhat * mean(g * xhat)),
 *   dw += sum over rows of dy * xhat,  db += sum over rows of dy.
 * One pass over x and dy does all three (a column pass for dw and db was
 * 1.6x slower at (2048, 256)): rows go in fixed chunks of LN_ROWS, each
 * chunk sums its dw and db into its own slice of a scratch array, and the
 * slices are added in chunk order in double after the parallel loop, so
 * the weight gradients are the same on any thread count and no two threads
 * write one element. Sums within a row or a chunk are in T: 64 rows, or a
 * row of gradients (no offset to lose digits to).
 *
 * f32 rows go through the vector kernels of the ISA in use (cpu_impl.h's
 * fg__vk), the forward's short rows (C <= FG_LN_BLOCK_N) a block of
 * FG_LN_BLOCK at a call, with the same bits; the loops below are the f64
 * kernels and the scalar path. */
#include "cpu_impl.h"
#include "vmath.h"

/* Rows per backward task: each task keeps its own dw and db sums, added in
 * task order at the end. A fixed count, not one per thread, so the sums do
 * not depend on the thread count. */
#define LN_ROWS 64

/* Whether the rows of a kernel body written over T go to the ISA's vector
 * kernel (vk, set by the caller; NULL or an entry NULL: the loop here). */
#define F32_ROWS(T) (sizeof(T) == sizeof(float) && vk && vk->ln_bwd_row)

static FG_MUST_USE fg_status check_vec(const char *kernel, const char *what, const fg_tensor *v,
                                       const fg_tensor *x, int64_t n) {
    if (!v) return FG_OK;
    if (v->dtype != x->dtype || v->numel != n) {
        char a[96], b[96];
        return fg_error(FG_EINVAL, "%s: %s is %s, expected %lld %s elements for x %s", kernel, what,
                        fg_tensor_describe(v, a, sizeof a), (long long)n, fg_dtype_name(x->dtype),
                        fg_tensor_describe(x, b, sizeof b));
    }
    return fg__expect_contiguous(kernel, v);
}

static FG_MUST_USE fg_status check_x(const char *kernel, const fg_tensor *x, int64_t *N,
                                     int64_t *C) {
    FG_TRY(fg__expect_contiguous(kernel, x));
    if (x->ndim != 2) {
        char a[96];
        return fg_error(FG_EINVAL, "%s: x %s: expected (N, C)", kernel,
                        fg_tensor_describe(x, a, sizeof a));
    }
    *N = x->shape[0];
    *C = x->shape[1];
    return FG_OK;
}

fg_status fg__cpu_layernorm_fwd(const fg_tensor *x, const fg_tensor *w, const fg_tensor *b,
                                double eps, fg_tensor *y, fg_tensor *mean, fg_tensor *rstd) {
    int64_t N, C;
    FG_TRY(check_x("layernorm_fwd", x, &N, &C));
    FG_TRY(check_vec("layernorm_fwd", "weight", w, x, C));
    FG_TRY(check_vec("layernorm_fwd", "bias", b, x, C));
    FG_TRY(fg__expect_same_shape("layernorm_fwd", x, y));
    FG_TRY(fg__expect_contiguous("layernorm_fwd", y));
    if (!mean || !rstd) return fg_error(FG_EINVAL, "layernorm_fwd: mean and rstd are required");
    FG_TRY(check_vec("layernorm_fwd", "mean", mean, x, N));
    FG_TRY(check_vec("layernorm_fwd", "rstd", rstd, x, N));
    int64_t work = x->numel;
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    if (x->dtype == FG_F32 && vk->ln_fwd_rows && C >= 1 && C <= FG_LN_BLOCK_N) {
        const float *px = x->data, *pw = w ? w->data : NULL, *pb = b ? b->data : NULL;
        float *py = y->data, *pm = mean->data, *pr = rstd->data;
        int64_t nb = (N + FG_LN_BLOCK - 1) / FG_LN_BLOCK;
FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
for (int64_t bl = 0; bl < nb; bl++) {
    int64_t i0 = bl * FG_LN_BLOCK, k = N - i0 < FG_LN_BLOCK ? N - i0 : FG_LN_BLOCK;
    vk->ln_fwd_rows(px + i0 * C, pw, pb, C, eps, py + i0 * C, pm + i0, pr + i0, k);
}
return FG_OK;
    }
    if (x->dtype == FG_F32 && vk->ln_fwd_row && C >= 1) {
        const float *px = x->data, *pw = w ? w->data : NULL, *pb = b ? b->data : NULL;
        float *py = y->data, *pm = mean->data, *pr = rstd->data;
FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
for (int64_t i = 0; i < N; i++)
    vk->ln_fwd_row(px + i * C, pw, pb, C, eps, py + i * C, pm + i, pr + i);
return FG_OK;
    }
    FG_FLOAT_DISPATCH("layernorm_fwd", x->dtype, {
        const T *px = x->data, *pw = w ? w->data : NULL, *pb = b ? b->data : NULL;
        T *py = y->data, *pm = mean->data, *pr = rstd->data;
        FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
        for (int64_t i = 0; i < N; i++) {
            const T *xr = px + i * C; /* (C) */
            T *yr = py + i * C;
            /* shifted by x[0]: the float lanes then add values of the row's
             * spread, not of its offset (a row at 1e4 +- 1 keeps its digits) */
            T x0 = C ? xr[0] : 0, s = 0, v = 0;
            FG_PRAGMA(omp simd reduction(+ : s))
            for (int64_t j = 0; j < C; j++) s += xr[j] - x0;
            T m = x0 + s / (T)C;
            FG_PRAGMA(omp simd reduction(+ : v))
            for (int64_t j = 0; j < C; j++) {
                T d = xr[j] - m;
                v += d * d;
            }
            T r = (T)(1 / sqrt((double)v / (double)C + eps));
            pm[i] = m;
            pr[i] = r;
            if (pw && pb) {
                FG_SIMD
                for (int64_t j = 0; j < C; j++) yr[j] = (xr[j] - m) * r * pw[j] + pb[j];
            } else if (pw) {
                FG_SIMD
                for (int64_t j = 0; j < C; j++) yr[j] = (xr[j] - m) * r * pw[j];
            } else if (pb) {
                FG_SIMD
                for (int64_t j = 0; j < C; j++) yr[j] = (xr[j] - m) * r + pb[j];
            } else {
                FG_SIMD
                for (int64_t j = 0; j < C; j++) yr[j] = (xr[j] - m) * r;
            }
        }
    });
    return FG_OK;
}

fg_status fg__cpu_layernorm_bwd(const fg_tensor *x, const fg_tensor *w, const fg_tensor *mean,
                                const fg_tensor *rstd, const fg_tensor *dy, fg_tensor *dx,
                                fg_tensor *dw, fg_tensor *db) {
    int64_t N, C;
    FG_TRY(check_x("layernorm_bwd", x, &N, &C));
    FG_TRY(check_vec("layernorm_bwd", "weight", w, x, C));
    if (!mean || !rstd) return fg_error(FG_EINVAL, "layernorm_bwd: mean and rstd are required");
    FG_TRY(check_vec("layernorm_bwd", "mean", mean, x, N));
    FG_TRY(check_vec("layernorm_bwd", "rstd", rstd, x, N));
    FG_TRY(fg__expect_same_shape("layernorm_bwd", x, dy));
    FG_TRY(fg__expect_contiguous("layernorm_bwd", dy));
    if (dx) {
        FG_TRY(fg__expect_same_shape("layernorm_bwd", x, dx));
        FG_TRY(fg__expect_contiguous("layernorm_bwd", dx));
    }
    FG_TRY(check_vec("layernorm_bwd", "dweight", dw, x, C));
    FG_TRY(check_vec("layernorm_bwd", "dbias", db, x, C));
    int64_t work = x->numel, nch = (N + LN_ROWS - 1) / LN_ROWS;
    bool wb = (dw || db) && N > 0 && C > 0;
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    if (C == 0) vk = NULL; /* the vector rows want C >= 1 */
    FG_FLOAT_DISPATCH("layernorm_bwd", x->dtype, {
        const T *px = x->data, *pg = dy->data, *pm = mean->data, *pr = rstd->data;
        const T *pw = w ? w->data : NULL;
        T *pd = dx ? dx->data : NULL;
        /* (nch, 2, C): each row chunk's dw and db sums; then (2, C) in double */
        T *part = wb ? fg_step_alloc(sizeof(T) * 2 * (size_t)C * (size_t)nch) : NULL;
        double *tot = wb ? fg_step_alloc(sizeof(double) * 2 * (size_t)C) : NULL;
        if (wb && (!part || !tot))
            return fg_error_wrap(FG_ENOMEM, "layernorm_bwd: weight-gradient partial sums");
        if (!pw && pd && C > 0) { /* one loop for both cases: w = 1 */
            T *ones = fg_step_alloc(sizeof(T) * (size_t)C);
            if (!ones) return fg_error_wrap(FG_ENOMEM, "layernorm_bwd: unit weight");
            for (int64_t j = 0; j < C; j++) ones[j] = 1;
            pw = ones;
        }
        FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
        for (int64_t ch = 0; ch < nch; ch++) {
            T *aw = part ? part + ch * 2 * C : NULL, *ab = aw ? aw + C : NULL;
            for (int64_t j = 0; aw && j < 2 * C; j++) aw[j] = 0;
            for (int64_t i = ch * LN_ROWS; i < FG_MIN(N, (ch + 1) * LN_ROWS); i++) {
                const T *xr = px + i * C, *gr = pg + i * C; /* (C) */
                T m = pm[i], r = pr[i];
                if (F32_ROWS(T)) { /* the vector kernel of the ISA in use */
                    vk->ln_bwd_row((const float *)xr, (const float *)gr, (const float *)pw,
                                   (float)m, (float)r, C, pd ? (float *)pd + i * C : NULL,
                                   (float *)aw, (float *)ab);
                    continue;
                }
                if (!pd) { /* weight gradients only */
                    FG_SIMD
                    for (int64_t j = 0; j < C; j++) {
                        aw[j] += gr[j] * ((xr[j] - m) * r);
                        ab[j] += gr[j];
                    }
                    continue;
                }
                T *dr = pd + i * C, s1 = 0, s2 = 0;
                FG_PRAGMA(omp simd reduction(+ : s1, s2))
                for (int64_t j = 0; j < C; j++) {
                    T g = gr[j] * pw[j];
                    s1 += g;
                    s2 += g * ((xr[j] - m) * r);
                }
                T a = s1 / (T)C, c = s2 / (T)C;
                if (aw) {
                    FG_SIMD
                    for (int64_t j = 0; j < C; j++) {
                        T xh = (xr[j] - m) * r;
                        dr[j] += r * (gr[j] * pw[j] - a - xh * c);
                        aw[j] += gr[j] * xh;
                        ab[j] += gr[j];
                    }
                } else {
                    FG_SIMD
                    for (int64_t j = 0; j < C; j++)
                        dr[j] += r * (gr[j] * pw[j] - a - (xr[j] - m) * r * c);
                }
            }
        }
        if (wb) { /* chunks added in order: the same sums on any thread count */
            for (int64_t j = 0; j < 2 * C; j++) tot[j] = 0;
            for (int64_t ch = 0; ch < nch; ch++) {
                const T *q = part + ch * 2 * C;
                FG_SIMD
                for (int64_t j = 0; j < 2 * C; j++) tot[j] += q[j];
            }
            T *pdw = dw ? dw->data : NULL, *pdb = db ? db->data : NULL;
            for (int64_t j = 0; pdw && j < C; j++) pdw[j] += (T)tot[j];
            for (int64_t j = 0; pdb && j < C; j++) pdb[j] += (T)tot[C + j];
        }
    });
    return FG_OK;
}
