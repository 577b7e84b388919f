/* Fused causal self-attention on a packed qkv (B, T, 3C), flash-attention
 * style: the (T, T) score matrix of a (batch, head) is never stored whole.
 *
 * Each (batch, head) is one task; tasks are split across OpenMP threads and
 * write disjoint slices of y / dqkv (their own rows and head columns), so
 * no two threads touch the same element. Inside a task, query rows go in
 * blocks of ATT_BR: a block of rows [r0, r0+br) needs keys [0, r0+br) only
 * (causality), so the products skip the upper-right blocks of the square.
 * The products are gemms on strided views of qkv (leading dimension 3C):
 * OpenBLAS runs one thread per call inside the parallel region.
 *
 * Forward saves lse (B, H, T) = log sum_j exp(s_tj) of each row; backward
 * recomputes p_tj = exp(s_tj - lse_t) from q and k instead of reading a
 * saved (B, H, T, T) matrix (the table's attention_bwd is given lse only).
 * Masked entries (j > t) are exactly zero in every buffer a gemm reads. */
#include <math.h>
#include <string.h>

#include "blas.h"
#include "cpu_impl.h"

/* Query rows per block: small blocks skip more of the masked triangle, big
 * ones make better gemms (tuned at T=128, head size 64 with bench/gemm_bench). */
#ifndef ATT_BR
#define ATT_BR 32
#endif

/* exp for float, written so that an `omp simd` loop vectorises it (glibc's
 * vector expf is used only under -ffast-math): 2^n * p(r) with
 * x = n ln2 + r, |r| <= ln2/2, p a degree-6 Taylor polynomial (relative
 * error under 2e-7 on that range). Inputs here are <= 0 (scores minus their
 * row maximum); below -87 the result flushes to about 1e-38. */
static inline float att_expf(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    float n = (float)(int32_t)(x * 1.44269504f + (x >= 0 ? 0.5f : -0.5f));
    float r = x - n * 0.693145752f - n * 1.42860677e-6f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 +
                                                                     r * (1.0f / 720))))));
    union {
        int32_t i;
        float f;
    } u = {.i = ((int32_t)n + 127) << 23};
    return p * u.f;
}

#define ATT_EXP(T, x) _Generic((T)0, float: att_expf, double: exp)(x)

static fg_status check_qkv(const char *kernel, const fg_tensor *qkv, int heads, int64_t *B,
                           int64_t *nt, int64_t *C) {
    char s[96];
    FG_TRY(fg__expect_contiguous(kernel, qkv));
    if (qkv->ndim != 3 || qkv->shape[2] % 3 != 0)
        return fg_error(FG_EINVAL, "%s: qkv %s: expected (B, T, 3C)", kernel,
                        fg_tensor_describe(qkv, s, sizeof s));
    *B = qkv->shape[0];
    *nt = qkv->shape[1];
    *C = qkv->shape[2] / 3;
    if (heads <= 0 || *C % heads != 0 || *C == 0)
        return fg_error(FG_EINVAL, "%s: qkv %s: C = %lld is not a positive multiple of heads = %d",
                        kernel, fg_tensor_describe(qkv, s, sizeof s), (long long)*C, heads);
    if (3 * *C > INT_MAX || *nt > INT_MAX)
        return fg_error(FG_EINVAL, "%s: qkv %s is too large for a 32-bit BLAS", kernel,
                        fg_tensor_describe(qkv, s, sizeof s));
    return FG_OK;
}

static fg_status check_like(const char *kernel, const char *what, const fg_tensor *t,
                            fg_dtype dt, int ndim, const int64_t *shape) {
    char s[96];
    bool ok = t->dtype == dt && t->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++) ok = t->shape[d] == shape[d];
    if (!ok) {
        char w[96];
        int k = snprintf(w, sizeof w, "%s[", fg_dtype_name(dt));
        for (int d = 0; d < ndim; d++)
            k += snprintf(w + k, sizeof w - (size_t)k, "%s%lld", d ? ", " : "", (long long)shape[d]);
        snprintf(w + k, sizeof w - (size_t)k, "]");
        return fg_error(FG_EINVAL, "%s: %s is %s, expected %s", kernel, what,
                        fg_tensor_describe(t, s, sizeof s), w);
    }
    return fg__expect_contiguous(kernel, t);
}

/* Per-thread scratch is fg_alloc'ed inside the parallel region (the step
 * arena belongs to the calling thread); a failed allocation skips the
 * thread's tasks and turns into FG_ENOMEM after the region. */

fg_status fg__cpu_attention_fwd(const fg_tensor *qkv, int heads, fg_tensor *y, fg_tensor *lse) {
    int64_t B, nt, C;
    FG_TRY(check_qkv("attention_fwd", qkv, heads, &B, &nt, &C));
    int64_t H = heads, hs = C / H;
    FG_TRY(check_like("attention_fwd", "y", y, qkv->dtype, 3, (int64_t[]){B, nt, C}));
    FG_TRY(check_like("attention_fwd", "lse", lse, qkv->dtype, 3, (int64_t[]){B, H, nt}));
    if (B == 0 || nt == 0) return FG_OK;
    int64_t nbh = B * H;
    int ld = (int)(3 * C), ldy = (int)C, ihs = (int)hs;
    double scale = 1.0 / sqrt((double)hs);
    bool par = nbh > 1 && fg_get_num_threads() > 1;
    int failed = 0;
    FG_FLOAT_DISPATCH("attention_fwd", qkv->dtype, {
        const T *pqkv = qkv->data;
        T *py = y->data, *plse = lse->data;
        size_t scratch = sizeof(T) * (size_t)FG_MIN(ATT_BR, nt) * (size_t)nt;
FG_PRAGMA(omp parallel if (par))
        {
            T *S = fg_alloc(scratch); /* (br, kend) scores, then probabilities */
FG_PRAGMA(omp for schedule(static))
            for (int64_t bh = 0; bh < nbh; bh++) {
                if (!S) {
                    failed = 1;
                    continue;
                }
                int64_t b = bh / H, h = bh % H;
                const T *q = pqkv + b * nt * 3 * C + h * hs, *k = q + C, *v = q + 2 * C;
                T *yb = py + b * nt * C + h * hs, *lb = plse + bh * nt;
                for (int64_t r0 = 0; r0 < nt; r0 += ATT_BR) {
                    int br = (int)FG_MIN(ATT_BR, nt - r0), kend = (int)(r0 + br);
                    /* S (br, kend) = scale * q[r0:r0+br] @ k[0:kend]^T */
                    FG_GEMM(T)(CblasRowMajor, CblasNoTrans, CblasTrans, br, kend, ihs, (T)scale,
                               q + r0 * ld, ld, k, ld, (T)0, S, kend);
                    for (int i = 0; i < br; i++) {
                        T *s = S + (int64_t)i * kend;
                        int n = (int)r0 + i + 1; /* keys 0..t */
                        T m = s[0];
FG_PRAGMA(omp simd reduction(max : m))
                        for (int j = 1; j < n; j++) m = s[j] > m ? s[j] : m;
                        T sum = 0;
FG_PRAGMA(omp simd reduction(+ : sum))
                        for (int j = 0; j < n; j++) {
                            s[j] = ATT_EXP(T, s[j] - m);
                            sum += s[j];
                        }
                        T inv = (T)1 / sum;
FG_PRAGMA(omp simd)
                        for (int j = 0; j < n; j++) s[j] *= inv;
                        for (int j = n; j < kend; j++) s[j] = 0;
                        lb[r0 + i] = m + (T)log((double)sum);
                    }
                    /* y[r0:r0+br] (br, hs) = P (br, kend) @ v[0:kend] (kend, hs) */
                    FG_GEMM(T)(CblasRowMajor, CblasNoTrans, CblasNoTrans, br, ihs, kend, (T)1, S,
                               kend, v, ld, (T)0, yb + r0 * ldy, ldy);
                }
            }
            fg_free(S);
        }
    });
    if (failed) return fg_error(FG_ENOMEM, "attention_fwd: no memory for the score blocks");
    return FG_OK;
}

fg_status fg__cpu_attention_bwd(const fg_tensor *qkv, int heads, const fg_tensor *y,
                                const fg_tensor *lse, const fg_tensor *dy, fg_tensor *dqkv) {
    int64_t B, nt, C;
    FG_TRY(check_qkv("attention_bwd", qkv, heads, &B, &nt, &C));
    int64_t H = heads, hs = C / H;
    FG_TRY(check_like("attention_bwd", "y", y, qkv->dtype, 3, (int64_t[]){B, nt, C}));
    FG_TRY(check_like("attention_bwd", "dy", dy, qkv->dtype, 3, (int64_t[]){B, nt, C}));
    FG_TRY(check_like("attention_bwd", "lse", lse, qkv->dtype, 3, (int64_t[]){B, H, nt}));
    FG_TRY(check_like("attention_bwd", "dqkv", dqkv, qkv->dtype, 3, qkv->shape));
    if (B == 0 || nt == 0) return FG_OK;
    int64_t nbh = B * H;
    int ld = (int)(3 * C), ldy = (int)C, ihs = (int)hs;
    double scale = 1.0 / sqrt((double)hs);
    bool par = nbh > 1 && fg_get_num_threads() > 1;
    int failed = 0;
    FG_FLOAT_DISPATCH("attention_bwd", qkv->dtype, {
        const T *pqkv = qkv->data, *py = y->data, *pdy = dy->data, *plse = lse->data;
        T *pdqkv = dqkv->data;
        int64_t rows = FG_MIN(ATT_BR, nt);
        size_t scratch = sizeof(T) * (size_t)(2 * rows * nt + rows);
FG_PRAGMA(omp parallel if (par))
        {
            T *P = fg_alloc(scratch); /* (br, kend) probabilities */
            T *dS = P ? P + rows * nt : NULL; /* (br, kend) dP, then dS */
            T *D = P ? dS + rows * nt : NULL; /* (br) rowsum(dy * y) */
FG_PRAGMA(omp for schedule(static))
            for (int64_t bh = 0; bh < nbh; bh++) {
                if (!P) {
                    failed = 1;
                    continue;
                }
                int64_t b = bh / H, h = bh % H, off = b * nt * 3 * C + h * hs;
                const T *q = pqkv + off, *k = q + C, *v = q + 2 * C;
                T *dq = pdqkv + off, *dk = dq + C, *dv = dq + 2 * C;
                const T *yb = py + b * nt * C + h * hs, *gb = pdy + b * nt * C + h * hs;
                const T *lb = plse + bh * nt;
                for (int64_t r0 = 0; r0 < nt; r0 += ATT_BR) {
                    int br = (int)FG_MIN(ATT_BR, nt - r0), kend = (int)(r0 + br);
                    FG_GEMM(T)(CblasRowMajor, CblasNoTrans, CblasTrans, br, kend, ihs, (T)scale,
                               q + r0 * ld, ld, k, ld, (T)0, P, kend);
                    for (int i = 0; i < br; i++) {
                        T *p = P + (int64_t)i * kend, l = lb[r0 + i];
                        int n = (int)r0 + i + 1;
FG_PRAGMA(omp simd)
                        for (int j = 0; j < n; j++) p[j] = ATT_EXP(T, p[j] - l);
                        for (int j = n; j < kend; j++) p[j] = 0;
                        const T *yr = yb + (r0 + i) * ldy, *gr = gb + (r0 + i) * ldy;
                        T d = 0;
FG_PRAGMA(omp simd reduction(+ : d))
                        for (int c = 0; c < ihs; c++) d += yr[c] * gr[c];
                        D[i] = d;
                    }
                    /* dv[0:kend] += P^T (kend, br) @ dy[r0:r0+br] (br, hs) */
                    FG_GEMM(T)(CblasRowMajor, CblasTrans, CblasNoTrans, kend, ihs, br, (T)1, P,
                               kend, gb + r0 * ldy, ldy, (T)1, dv, ld);
                    /* dP (br, kend) = dy[r0:r0+br] @ v[0:kend]^T */
                    FG_GEMM(T)(CblasRowMajor, CblasNoTrans, CblasTrans, br, kend, ihs, (T)1,
                               gb + r0 * ldy, ldy, v, ld, (T)0, dS, kend);
                    /* dS = P * (dP - D) * scale; masked entries stay 0 through P */
                    for (int i = 0; i < br; i++) {
                        T *ds = dS + (int64_t)i * kend;
                        const T *p = P + (int64_t)i * kend;
                        T di = D[i], sc = (T)scale;
FG_PRAGMA(omp simd)
                        for (int j = 0; j < kend; j++) ds[j] = p[j] * (ds[j] - di) * sc;
                    }
                    /* dq[r0:r0+br] += dS (br, kend) @ k[0:kend] (kend, hs) */
                    FG_GEMM(T)(CblasRowMajor, CblasNoTrans, CblasNoTrans, br, ihs, kend, (T)1, dS,
                               kend, k, ld, (T)1, dq + r0 * ld, ld);
                    /* dk[0:kend] += dS^T (kend, br) @ q[r0:r0+br] (br, hs) */
                    FG_GEMM(T)(CblasRowMajor, CblasTrans, CblasNoTrans, kend, ihs, br, (T)1, dS,
                               kend, q + r0 * ld, ld, (T)1, dk, ld);
                }
            }
            fg_free(P);
        }
    });
    if (failed) return fg_error(FG_ENOMEM, "attention_bwd: no memory for the score blocks");
    return FG_OK;
}
