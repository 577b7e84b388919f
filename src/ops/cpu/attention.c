/* Fused self-attention on a packed qkv (B, T, 3C), causal or not,
 * flash-attention style: the (T, T) score matrix of a (batch, head) is
 * never stored whole.
 *
 * Each (batch, head) is one task; tasks are split across OpenMP threads and
 * write disjoint slices of y / dqkv (their own rows and head columns), so
 * no two threads touch the same element. Inside a task, query rows go in
 * blocks (block_rows): under the causal mask a block of rows [r0, r0+br)
 * needs keys [0, r0+br) only, so the products skip the upper-right blocks
 * of the square; without it every block sees all T keys. The products are
 * gemms on strided views of qkv (leading dimension 3C): OpenBLAS runs one
 * thread per call inside the parallel region.
 *
 * Forward saves lse (B, H, T) = log sum_j exp(s_tj) of each row; backward
 * recomputes p_tj = exp(s_tj - lse_t) from q and k instead of reading a
 * saved (B, H, T, T) matrix (the table's attention_bwd is given lse only).
 * Measured at B16 T128 C256 H4, one thread: the recompute is at most 1.7 of
 * 9.6 ms fwd+bwd (skipping it outright gives 7.9 ms), under 1% of a GPT
 * step, while saving P would hold 4 MiB per layer here and grow as T^2.
 * Masked entries (j > t, and keys the padding mask marks) are exactly zero
 * in every buffer a gemm reads: the padded keys' scores are -inf before the
 * row's softmax and their probabilities set to 0 after it (the vector exp
 * clamps at -88, so it would leave 6e-39 there), unless the row has no key
 * left, which stays NaN as PyTorch's. */
#include <math.h>
#include <string.h>

#include "blas.h"
#include "cpu_impl.h"
#include "vmath.h"

/* Query rows per block: small blocks skip more of the masked triangle, big
 * ones make better gemms (tuned at T=128, head size 64 with bench/gemm_bench). */
#ifndef ATT_BR
#define ATT_BR 32
#endif

/* Score rows are padded to a multiple of ATT_PAD columns (the row stride of
 * the scratch blocks), so that the row loops below run in whole vectors:
 * at row lengths near 64 a scalar remainder costs as much as the vector
 * part. Columns past a row's causal end are written as exact zeros up to
 * the padded width; the scratch starts zeroed, so padding never holds
 * garbage, and no gemm reads past kend. */
#define ATT_PAD 16
static inline int64_t pad_up(int64_t n) { return (n + ATT_PAD - 1) / ATT_PAD * ATT_PAD; }

/* Score elements of one block without the mask: blocks as tall as this
 * allows (taller blocks make better products and nothing is skipped), split
 * evenly, so T = 65 is one block of 65 rows rather than 32 + 32 + 1. */
#define ATT_FULL_ELEMS 8192

/* Query rows per block: ATT_BR under the causal mask (the tuned size, which
 * fixes the order of every sum there), else as above. */
static int64_t block_rows(bool causal, int64_t nt) {
    if (causal) return FG_MIN(ATT_BR, nt);
    int64_t most = FG_MAX(ATT_BR, ATT_FULL_ELEMS / pad_up(nt));
    int64_t nb = (nt + most - 1) / most;
    return (nt + nb - 1) / nb;
}

/* The two row operations, over s[0, lds) with keys j < n unmasked:
 *   row_softmax: s = softmax(s[0, n)), zero after; returns log sum exp;
 *   row_exp:     s = exp(s - l) on [0, n), zero after.
 * They are the hot loop of the whole op in f32 (one exp per score, twice
 * per step): f32 takes them from the vector kernels of the ISA in use
 * (cpu_impl.h's fg__vk), and the loops here are the f64 kernels and the
 * scalar path (vmath.h's exp, which the compiler vectorises). */
static double row_softmax_f64(double *s, int lds, int n) {
    double m = s[0], sum = 0;
    for (int j = 1; j < n; j++) m = s[j] > m ? s[j] : m;
    for (int j = 0; j < n; j++) sum += s[j] = exp(s[j] - m);
    double inv = 1 / sum;
    for (int j = 0; j < n; j++) s[j] *= inv;
    for (int j = n; j < lds; j++) s[j] = 0;
    return m + log(sum);
}

static void row_exp_f64(double *s, int lds, int n, double l) {
    for (int j = 0; j < n; j++) s[j] = exp(s[j] - l);
    for (int j = n; j < lds; j++) s[j] = 0;
}

static float row_softmax_f32(float *s, int lds, int n) {
    float m = s[0];
    FG_PRAGMA(omp simd reduction(max : m))
    for (int j = 1; j < n; j++) m = s[j] > m ? s[j] : m;
    float sum = (float)fg__expsum_f32(s, n, m, s), inv = 1 / sum;
    FG_SIMD
    for (int j = 0; j < n; j++) s[j] *= inv;
    for (int j = n; j < lds; j++) s[j] = 0;
    return m + logf(sum);
}

static void row_exp_f32(float *s, int lds, int n, float l) {
    FG_SIMD
    for (int j = 0; j < n; j++) s[j] = fg__expf(s[j] - l);
    for (int j = n; j < lds; j++) s[j] = 0;
}

/* The row functions for T: the ISA's vector kernel in f32 where it has one. */
#define ROW_SOFTMAX(T, vk)                                                                         \
    _Generic((T)0, float                                                                           \
             : (vk)->att_softmax_row ? (vk)->att_softmax_row : row_softmax_f32, double             \
             : row_softmax_f64)
#define ROW_EXP(T, vk)                                                                             \
    _Generic((T)0, float                                                                           \
             : (vk)->att_exp_row ? (vk)->att_exp_row : row_exp_f32, double                         \
             : row_exp_f64)

static FG_MUST_USE fg_status check_qkv(const char *kernel, const fg_tensor *qkv, int heads,
                                       int64_t *B, int64_t *nt, int64_t *C) {
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

static FG_MUST_USE fg_status check_like(const char *kernel, const char *what, const fg_tensor *t,
                                        fg_dtype dt, int ndim, const int64_t *shape) {
    char s[96];
    bool ok = t->dtype == dt && t->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++) ok = t->shape[d] == shape[d];
    if (!ok) {
        char w[96];
        int k = snprintf(w, sizeof w, "%s[", fg_dtype_name(dt));
        for (int d = 0; d < ndim; d++)
            k +=
                snprintf(w + k, sizeof w - (size_t)k, "%s%lld", d ? ", " : "", (long long)shape[d]);
        snprintf(w + k, sizeof w - (size_t)k, "]");
        return fg_error(FG_EINVAL, "%s: %s is %s, expected %s", kernel, what,
                        fg_tensor_describe(t, s, sizeof s), w);
    }
    return fg__expect_contiguous(kernel, t);
}

/* kpm (B, T) u8 or i32, contiguous, or NULL */
static FG_MUST_USE fg_status check_mask(const char *kernel, const fg_tensor *kpm, int64_t B,
                                        int64_t nt) {
    char s[96];
    if (!kpm) return FG_OK;
    if (kpm->ndim != 2 || kpm->shape[0] != B || kpm->shape[1] != nt ||
        (kpm->dtype != FG_U8 && kpm->dtype != FG_I32))
        return fg_error(FG_EINVAL, "%s: key padding mask %s: expected u8 or i32 (%lld, %lld)",
                        kernel, fg_tensor_describe(kpm, s, sizeof s), (long long)B, (long long)nt);
    return fg__expect_contiguous(kernel, kpm);
}

/* whether key j of batch entry b is padding */
static inline bool padded(const fg_tensor *kpm, int64_t b, int64_t nt, int64_t j) {
    int64_t i = b * nt + j;
    return kpm->dtype == FG_U8 ? ((const uint8_t *)kpm->data)[i] != 0
                               : ((const int32_t *)kpm->data)[i] != 0;
}

/* the padded keys of batch entry b among the block's first kend: their
 * scores -inf (before) or their probabilities 0 (after the row function,
 * where the row kept a key: l finite) */
#define MASK_KEYS(T, S, lds, br, kend, lrow, after)                                                \
    do {                                                                                           \
        if (!kpm) break;                                                                           \
        for (int j_ = 0; j_ < (kend); j_++)                                                        \
            if (padded(kpm, b, nt, j_))                                                            \
                for (int i_ = 0; i_ < (br); i_++)                                                  \
                    if (!(after) || isfinite((double)(lrow)[i_]))                                  \
                        (S)[(int64_t)i_ * (lds) + j_] = (after) ? (T)0 : (T)-INFINITY;             \
    } while (0)

/* Per-thread scratch is fg_calloc'ed inside the parallel region (the step
 * arena belongs to the calling thread); a failed allocation skips the
 * thread's tasks and turns into FG_ENOMEM after the region. */

fg_status fg__cpu_attention_fwd(const fg_tensor *qkv, int heads, bool causal, const fg_tensor *kpm,
                                fg_tensor *y, fg_tensor *lse) {
    int64_t B, nt, C;
    FG_TRY(check_qkv("attention_fwd", qkv, heads, &B, &nt, &C));
    FG_TRY(check_mask("attention_fwd", kpm, B, nt));
    int64_t H = heads, hs = C / H;
    FG_TRY(check_like("attention_fwd", "y", y, qkv->dtype, 3, (int64_t[]){B, nt, C}));
    FG_TRY(check_like("attention_fwd", "lse", lse, qkv->dtype, 3, (int64_t[]){B, H, nt}));
    if (B == 0 || nt == 0) return FG_OK;
    int64_t nbh = B * H;
    int ld = (int)(3 * C), ldy = (int)C, ihs = (int)hs;
    double scale = 1.0 / sqrt((double)hs);
    bool par = nbh > 1 && fg_get_num_threads() > 1;
    int failed = 0;
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    FG_FLOAT_DISPATCH("attention_fwd", qkv->dtype, {
        const T *pqkv = qkv->data;
        T *py = y->data, *plse = lse->data;
        int64_t rows = block_rows(causal, nt);
        size_t scratch = sizeof(T) * (size_t)rows * (size_t)pad_up(nt);
        FG_PRAGMA(omp parallel if (par))
        {
            T *S = fg_calloc(1, scratch); /* (br, lds) scores, then probabilities */
FG_PRAGMA(omp for schedule(static))
for (int64_t bh = 0; bh < nbh; bh++) {
    if (!S) {
        failed = 1;
        continue;
    }
    int64_t b = bh / H, h = bh % H;
    const T *q = pqkv + b * nt * 3 * C + h * hs, *k = q + C, *v = q + 2 * C;
    T *yb = py + b * nt * C + h * hs, *lb = plse + bh * nt;
    for (int64_t r0 = 0; r0 < nt; r0 += rows) {
        int br = (int)FG_MIN(rows, nt - r0), kend = (int)(causal ? r0 + br : nt);
        int lds = (int)pad_up(kend);
        /* S (br, kend) = scale * q[r0:r0+br] @ k[0:kend]^T */
        FG_GEMM(T)
        (CblasRowMajor, CblasNoTrans, CblasTrans, br, kend, ihs, (T)scale, q + r0 * ld, ld, k, ld,
         (T)0, S, lds);
        MASK_KEYS(T, S, lds, br, kend, lb + r0, false);
        for (int i = 0; i < br; i++) /* row t = r0 + i sees keys 0..t, or all */
            lb[r0 + i] =
                ROW_SOFTMAX(T, vk)(S + (int64_t)i * lds, lds, causal ? (int)r0 + i + 1 : kend);
        MASK_KEYS(T, S, lds, br, kend, lb + r0, true);
        /* y[r0:r0+br] (br, hs) = P (br, kend) @ v[0:kend] (kend, hs) */
        FG_GEMM(T)
        (CblasRowMajor, CblasNoTrans, CblasNoTrans, br, ihs, kend, (T)1, S, lds, v, ld, (T)0,
         yb + r0 * ldy, ldy);
    }
}
fg_free(S);
        }
    });
    if (failed) return fg_error(FG_ENOMEM, "attention_fwd: no memory for the score blocks");
    return FG_OK;
}

fg_status fg__cpu_attention_bwd(const fg_tensor *qkv, int heads, bool causal, const fg_tensor *kpm,
                                const fg_tensor *y, const fg_tensor *lse, const fg_tensor *dy,
                                fg_tensor *dqkv) {
    int64_t B, nt, C;
    FG_TRY(check_qkv("attention_bwd", qkv, heads, &B, &nt, &C));
    FG_TRY(check_mask("attention_bwd", kpm, B, nt));
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
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    FG_FLOAT_DISPATCH("attention_bwd", qkv->dtype, {
        const T *pqkv = qkv->data, *py = y->data, *pdy = dy->data, *plse = lse->data;
        T *pdqkv = dqkv->data;
        int64_t rows = block_rows(causal, nt), cols = pad_up(nt);
        size_t scratch = sizeof(T) * (size_t)(2 * rows * cols + rows);
        FG_PRAGMA(omp parallel if (par))
        {
            T *P = fg_calloc(1, scratch);       /* (br, lds) probabilities */
            T *dS = P ? P + rows * cols : NULL; /* (br, lds) dP, then dS */
            T *D = P ? dS + rows * cols : NULL; /* (br) rowsum(dy * y) */
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
    for (int64_t r0 = 0; r0 < nt; r0 += rows) {
        int br = (int)FG_MIN(rows, nt - r0), kend = (int)(causal ? r0 + br : nt);
        int lds = (int)pad_up(kend);
        FG_GEMM(T)
        (CblasRowMajor, CblasNoTrans, CblasTrans, br, kend, ihs, (T)scale, q + r0 * ld, ld, k, ld,
         (T)0, P, lds);
        MASK_KEYS(T, P, lds, br, kend, lb + r0, false);
        for (int i = 0; i < br; i++)
            ROW_EXP(T, vk)(P + (int64_t)i * lds, lds, causal ? (int)r0 + i + 1 : kend, lb[r0 + i]);
        MASK_KEYS(T, P, lds, br, kend, lb + r0, true);
        for (int i = 0; i < br; i++) {
            const T *yr = yb + (r0 + i) * ldy, *gr = gb + (r0 + i) * ldy;
            T d = 0;
            FG_PRAGMA(omp simd reduction(+ : d))
            for (int c = 0; c < ihs; c++) d += yr[c] * gr[c];
            D[i] = d;
        }
        /* dv[0:kend] += P^T (kend, br) @ dy[r0:r0+br] (br, hs) */
        FG_GEMM(T)
        (CblasRowMajor, CblasTrans, CblasNoTrans, kend, ihs, br, (T)1, P, lds, gb + r0 * ldy, ldy,
         (T)1, dv, ld);
        /* dP (br, kend) = dy[r0:r0+br] @ v[0:kend]^T */
        FG_GEMM(T)
        (CblasRowMajor, CblasNoTrans, CblasTrans, br, kend, ihs, (T)1, gb + r0 * ldy, ldy, v, ld,
         (T)0, dS, lds);
        /* dS = P * (dP - D) * scale; masked entries stay 0 through P */
        for (int i = 0; i < br; i++) {
            T *ds = dS + (int64_t)i * lds;
            const T *p = P + (int64_t)i * lds;
            T di = D[i], sc = (T)scale;
            FG_PRAGMA(omp simd)
            for (int j = 0; j < lds; j++) ds[j] = p[j] * (ds[j] - di) * sc;
        }
        /* dq[r0:r0+br] += dS (br, kend) @ k[0:kend] (kend, hs) */
        FG_GEMM(T)
        (CblasRowMajor, CblasNoTrans, CblasNoTrans, br, ihs, kend, (T)1, dS, lds, k, ld, (T)1,
         dq + r0 * ld, ld);
        /* dk[0:kend] += dS^T (kend, br) @ q[r0:r0+br] (br, hs) */
        FG_GEMM(T)
        (CblasRowMajor, CblasTrans, CblasNoTrans, kend, ihs, br, (T)1, dS, lds, q + r0 * ld, ld,
         (T)1, dk, ld);
    }
}
fg_free(P);
        }
    });
    if (failed) return fg_error(FG_ENOMEM, "attention_bwd: no memory for the score blocks");
    return FG_OK;
}
