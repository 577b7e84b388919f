/* The CUDA backend's matrix products: cuBLASLt, opened with dlopen at the
 * first product (libcublasLt.so.13, or FULGUR_CUBLASLT_LIBRARY), so that
 * no program of a CUDA build loads its 500 MB unless it multiplies on a
 * GPU. Row-major products are computed as their column-major transposes
 * (C^T = op(B)^T op(A)^T). A 32 MiB workspace per GPU, from cudaMalloc
 * outside the caching allocator, is kept for the process. */
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "blaslt.h"
#include "core/core_impl.h"
#include "launch.h"

#define WS_BYTES ((size_t)32 << 20)
#define MAX_GPUS 64

typedef struct lt {
    void *h;
    cublasLtHandle_t handle;
    cublasStatus_t (*create)(cublasLtHandle_t *);
    const char *(*status_string)(cublasStatus_t);
    cublasStatus_t (*desc_create)(cublasLtMatmulDesc_t *, cublasComputeType_t, cudaDataType_t);
    cublasStatus_t (*desc_set)(cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t, const void *,
                               size_t);
    cublasStatus_t (*desc_destroy)(cublasLtMatmulDesc_t);
    cublasStatus_t (*layout_create)(cublasLtMatrixLayout_t *, cudaDataType, uint64_t, uint64_t,
                                    int64_t);
    cublasStatus_t (*layout_set)(cublasLtMatrixLayout_t, cublasLtMatrixLayoutAttribute_t,
                                 const void *, size_t);
    cublasStatus_t (*layout_destroy)(cublasLtMatrixLayout_t);
    cublasStatus_t (*pref_create)(cublasLtMatmulPreference_t *);
    cublasStatus_t (*pref_set)(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t,
                               const void *, size_t);
    cublasStatus_t (*pref_destroy)(cublasLtMatmulPreference_t);
    cublasStatus_t (*heuristic)(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int,
                                cublasLtMatmulHeuristicResult_t *, int *);
    cublasStatus_t (*matmul)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void *, const void *,
                             cublasLtMatrixLayout_t, const void *, cublasLtMatrixLayout_t,
                             const void *, const void *, cublasLtMatrixLayout_t, void *,
                             cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t *, void *, size_t,
                             cudaStream_t);
} lt;

static lt g_lt;
static fg_status g_lt_status = FG_OK;
static char g_lt_msg[512];
static pthread_once_t g_lt_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_ws_mu = PTHREAD_MUTEX_INITIALIZER;
static void *g_ws[MAX_GPUS];

static void lt_load(void) {
    const char *name = getenv("FULGUR_CUBLASLT_LIBRARY");
    if (!name || !*name) name = "libcublasLt.so.13";
    const fg__dl_sym syms[] = {
        {&g_lt.create, "cublasLtCreate", false},
        {&g_lt.status_string, "cublasLtGetStatusString", false},
        {&g_lt.desc_create, "cublasLtMatmulDescCreate", false},
        {&g_lt.desc_set, "cublasLtMatmulDescSetAttribute", false},
        {&g_lt.desc_destroy, "cublasLtMatmulDescDestroy", false},
        {&g_lt.layout_create, "cublasLtMatrixLayoutCreate", false},
        {&g_lt.layout_set, "cublasLtMatrixLayoutSetAttribute", false},
        {&g_lt.layout_destroy, "cublasLtMatrixLayoutDestroy", false},
        {&g_lt.pref_create, "cublasLtMatmulPreferenceCreate", false},
        {&g_lt.pref_set, "cublasLtMatmulPreferenceSetAttribute", false},
        {&g_lt.pref_destroy, "cublasLtMatmulPreferenceDestroy", false},
        {&g_lt.heuristic, "cublasLtMatmulAlgoGetHeuristic", false},
        {&g_lt.matmul, "cublasLtMatmul", false},
    };
    char why[400];
    g_lt.h = fg__dl_open(name, syms, sizeof syms / sizeof *syms, why, sizeof why);
    if (!g_lt.h) {
        g_lt_status = FG_EUNSUPPORTED;
        snprintf(g_lt_msg, sizeof g_lt_msg,
                 "cuBLASLt: %s (the CUDA toolkit's library; FULGUR_CUBLASLT_LIBRARY names another)",
                 why);
        return;
    }
    cublasStatus_t s = g_lt.create(&g_lt.handle);
    if (s != CUBLAS_STATUS_SUCCESS) {
        g_lt_status = FG_EIO;
        snprintf(g_lt_msg, sizeof g_lt_msg, "cublasLtCreate: %s", g_lt.status_string(s));
    }
}

/* ------------------------------------------------------------ precision */

static _Atomic int g_prec = -1; /* 0 highest, 1 high, 2 medium */
static const char *const PREC[] = {"highest", "high", "medium"};

static int prec_parse(const char *p) {
    for (int i = 0; i < 3; i++)
        if (!strcasecmp(p, PREC[i])) return i;
    return -1;
}

fg_status fg__cuda_set_matmul_precision(const char *p) {
    int v = p ? prec_parse(p) : -1;
    if (v < 0)
        return fg_error(FG_EINVAL, "matmul_precision \"%s\": expected highest, high or medium",
                        p ? p : "(null)");
    g_prec = v;
    return FG_OK;
}

const char *fg__cuda_matmul_precision(void) {
    if (g_prec < 0) {
        const char *e = getenv("FULGUR_MATMUL_PRECISION");
        int v = e && *e ? prec_parse(e) : 0;
        g_prec = v < 0 ? 0 : v;
    }
    return PREC[g_prec];
}

/* ---------------------------------------------------------------- gemm */

static cudaDataType_t cu_type(int dt) {
    return dt == FG_CU_BF16 ? CUDA_R_16BF : dt == FG_CU_F16 ? CUDA_R_16F : CUDA_R_32F;
}

static FG_MUST_USE fg_status lt_err(cublasStatus_t s, const char *what) {
    return fg_error(s == CUBLAS_STATUS_NOT_SUPPORTED ? FG_EUNSUPPORTED : FG_EIO, "%s: %s", what,
                    g_lt.status_string(s));
}

static void *workspace(int gpu) {
    if (gpu < 0 || gpu >= MAX_GPUS) return NULL;
    pthread_mutex_lock(&g_ws_mu);
    if (!g_ws[gpu] && cudaMalloc(&g_ws[gpu], WS_BYTES) != cudaSuccess) {
        (void)cudaGetLastError();
        g_ws[gpu] = NULL;
    }
    void *w = g_ws[gpu];
    pthread_mutex_unlock(&g_ws_mu);
    return w;
}

fg_status fg__cuda_gemm(void *st, int gpu, int dtab, int dtc, bool ta, bool tb, int64_t M,
                        int64_t N, int64_t K, const void *a, int64_t lda, int64_t sa, const void *b,
                        int64_t ldb, int64_t sb, void *c, int64_t ldc, int64_t sc, int64_t batch,
                        float alpha, float beta, int epi, const void *bias, int dtbias) {
    pthread_once(&g_lt_once, lt_load);
    if (g_lt_status != FG_OK) return fg_error(g_lt_status, "%s", g_lt_msg);
    if (M == 0 || N == 0 || batch == 0) return FG_OK;
    void *ws = workspace(gpu);
    size_t ws_bytes = ws ? WS_BYTES : 0;
    cublasComputeType_t ct = CUBLAS_COMPUTE_32F;
    if (dtab == FG_CU_F32 && strcmp(fg__cuda_matmul_precision(), "highest") != 0)
        ct = CUBLAS_COMPUTE_32F_FAST_TF32;
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    fg_status res = FG_OK;
    cublasStatus_t s;
#define LT(call, what)                                                                             \
    do {                                                                                           \
        if ((s = (call)) != CUBLAS_STATUS_SUCCESS) {                                               \
            res = lt_err(s, what);                                                                 \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)
    LT(g_lt.desc_create(&desc, ct, CUDA_R_32F), "cublasLtMatmulDescCreate");
    /* column-major: C^T (N x M) = op'(B^T) op'(A^T); A' = b, B' = a */
    cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT(g_lt.desc_set(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa), "TRANSA");
    LT(g_lt.desc_set(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb), "TRANSB");
    if (epi != FG_CU_EPI_NONE) {
        cublasLtEpilogue_t e = epi == FG_CU_EPI_BIAS        ? CUBLASLT_EPILOGUE_BIAS
                               : epi == FG_CU_EPI_GELU_BIAS ? CUBLASLT_EPILOGUE_GELU_BIAS
                                                            : CUBLASLT_EPILOGUE_GELU;
        LT(g_lt.desc_set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e), "EPILOGUE");
        if (epi != FG_CU_EPI_GELU) {
            cudaDataType_t bt = cu_type(dtbias);
            LT(g_lt.desc_set(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
               "BIAS_POINTER");
            LT(g_lt.desc_set(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt),
               "BIAS_DATA_TYPE");
        }
    }
    /* the stored matrices, column-major */
    uint64_t ar = tb ? (uint64_t)K : (uint64_t)N, ac = tb ? (uint64_t)N : (uint64_t)K;
    uint64_t br = ta ? (uint64_t)M : (uint64_t)K, bc = ta ? (uint64_t)K : (uint64_t)M;
    LT(g_lt.layout_create(&la, cu_type(dtab), ar, ac, ldb), "layout of b");
    LT(g_lt.layout_create(&lb, cu_type(dtab), br, bc, lda), "layout of a");
    LT(g_lt.layout_create(&lc, cu_type(dtc), (uint64_t)N, (uint64_t)M, ldc), "layout of c");
    if (batch > 1) {
        int32_t bn = (int32_t)batch;
        LT(g_lt.layout_set(la, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bn, sizeof bn), "batch");
        LT(g_lt.layout_set(lb, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bn, sizeof bn), "batch");
        LT(g_lt.layout_set(lc, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bn, sizeof bn), "batch");
        LT(g_lt.layout_set(la, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sb, sizeof sb),
           "stride");
        LT(g_lt.layout_set(lb, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sa, sizeof sa),
           "stride");
        LT(g_lt.layout_set(lc, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sc, sizeof sc),
           "stride");
    }
    LT(g_lt.pref_create(&pref), "cublasLtMatmulPreferenceCreate");
    LT(g_lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes),
       "MAX_WORKSPACE_BYTES");
    cublasLtMatmulHeuristicResult_t hr;
    int found = 0;
    LT(g_lt.heuristic(g_lt.handle, desc, la, lb, lc, lc, pref, 1, &hr, &found),
       "cublasLtMatmulAlgoGetHeuristic");
    if (!found) {
        res = fg_error(FG_EUNSUPPORTED,
                       "cuBLASLt has no algorithm for a %lld x %lld x %lld product (batch %lld)",
                       (long long)M, (long long)N, (long long)K, (long long)batch);
        goto out;
    }
    LT(g_lt.matmul(g_lt.handle, desc, &alpha, b, la, a, lb, &beta, c, lc, c, lc, &hr.algo, ws,
                   ws_bytes, (cudaStream_t)st),
       "cublasLtMatmul");
#undef LT
out:
    if (pref) g_lt.pref_destroy(pref);
    if (lc) g_lt.layout_destroy(lc);
    if (lb) g_lt.layout_destroy(lb);
    if (la) g_lt.layout_destroy(la);
    if (desc) g_lt.desc_destroy(desc);
    return res;
}
