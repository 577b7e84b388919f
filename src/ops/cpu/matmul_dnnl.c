/* bf16 matrix products through oneDNN's matmul primitive: bf16 inputs, f32
 * accumulation, f32 or bf16 output. On this machine (AVX512-BF16, no AMX)
 * oneDNN's brgemm bf16 kernels run about twice as fast as OpenBLAS sgemm
 * on the GPT's shapes (bench/gemm_bench); with AMX, more. Internal for now:
 * the precision layer calls it.
 *
 * Also the f32 products of fg__cpu_matmul from FG_GEMM_DNNL_MIN multiply-adds
 * up (fg__cpu_gemm_dnnl_f32): on the GPT's linear layers here oneDNN's
 * brg:avx512_core f32 kernels run 100-110 GFLOP/s against OpenBLAS's
 * 92-100, and with beta = 0 they write c without OpenBLAS's zeroing pass.
 *
 * Same contract as the table's matmul, with contiguous operands:
 * c = alpha op(a) op(b) + beta c, a (..., M, K), b (..., K, N) or (K, N)
 * shared, c (..., M, N). A transpose is a stride swap in the memory
 * descriptor, never a copy; a shared b with an untransposed a folds the
 * batch into M. Primitives are created per call and found again in
 * oneDNN's own primitive cache; their scratchpad comes from fg_alloc.
 * The engine is made once per process; a stream per call (streams are not
 * thread-safe). */
#include "cpu_impl.h"

#ifdef FULGUR_HAVE_DNNL
#include <dnnl.h>
#include <pthread.h>

static dnnl_engine_t g_engine;
static dnnl_status_t g_engine_status = dnnl_runtime_error;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void make_engine(void) { g_engine_status = dnnl_engine_create(&g_engine, dnnl_cpu, 0); }

static fg_status dnnl_fail(dnnl_status_t s, const char *what) {
    return fg_error(s == dnnl_unimplemented ? FG_EUNSUPPORTED : FG_EINTERNAL,
                    "matmul_bf16: oneDNN %s failed (status %d)", what, (int)s);
}

#define DN(call, what)                                                                             \
    do {                                                                                           \
        dnnl_status_t dn_s_ = (call);                                                              \
        if (dn_s_ != dnnl_success) {                                                               \
            st = dnnl_fail(dn_s_, what);                                                           \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

/* c = beta c, for a product with K = 0 (oneDNN rejects empty dims). */
static fg_status scale_output(fg_tensor *c, double beta) {
    for (int64_t i = 0; i < c->numel; i++) {
        if (c->dtype == FG_F32) {
            float *p = c->data;
            p[i] = beta == 0 ? 0.0f : (float)(beta * p[i]);
        } else {
            uint16_t *p = c->data;
            p[i] = fg_f32_to_bf16(beta == 0 ? 0.0f : (float)(beta * fg_bf16_to_f32(p[i])));
        }
    }
    return FG_OK;
}

static dnnl_data_type_t dnnl_type(fg_dtype dt) {
    return dt == FG_BF16 ? dnnl_bf16 : dt == FG_F32 ? dnnl_f32 : dnnl_data_type_undef;
}

/* A (batch, rows, cols) descriptor of a contiguous (..., r, c) tensor seen
 * transposed when `t`; batch stride 0 for a shared (broadcast) operand. */
static dnnl_status_t desc_of(dnnl_memory_desc_t *md, const fg_tensor *x, bool t, int64_t batch,
                             bool shared) {
    int64_t r = x->shape[x->ndim - 2], c = x->shape[x->ndim - 1];
    dnnl_dims_t dims = {shared ? 1 : batch, t ? c : r, t ? r : c};
    dnnl_dims_t strides = {r * c, t ? 1 : c, t ? c : 1};
    return dnnl_memory_desc_init_by_strides(md, 3, dims, dnnl_type(x->dtype), strides);
}

fg_status fg__cpu_matmul_bf16(const fg_tensor *a, bool ta, const fg_tensor *b, bool tb,
                              fg_tensor *c, double alpha, double beta) {
    char sa[96], sb[96], sc[96];
    if (a->dtype != FG_BF16 || b->dtype != FG_BF16 || (c->dtype != FG_F32 && c->dtype != FG_BF16))
        return fg_error(FG_EUNSUPPORTED, "matmul_bf16: wants bf16 a and b and an f32 or bf16 c, "
                                         "got %s, %s, %s",
                        fg_dtype_name(a->dtype), fg_dtype_name(b->dtype), fg_dtype_name(c->dtype));
    FG_TRY(fg__expect_contiguous("matmul_bf16", a));
    FG_TRY(fg__expect_contiguous("matmul_bf16", b));
    FG_TRY(fg__expect_contiguous("matmul_bf16", c));
    bool shared = b->ndim == 2, ok = a->ndim >= 2 && b->ndim >= 2 && c->ndim == a->ndim;
    for (int d = 0; ok && d < a->ndim - 2; d++)
        ok = a->shape[d] == c->shape[d] && (shared || (b->ndim == a->ndim && b->shape[d] == a->shape[d]));
    int64_t M = 0, K = 0, N = 0;
    if (ok) {
        M = a->shape[a->ndim - (ta ? 1 : 2)];
        K = a->shape[a->ndim - (ta ? 2 : 1)];
        N = b->shape[b->ndim - (tb ? 2 : 1)];
        ok = b->shape[b->ndim - (tb ? 1 : 2)] == K && c->shape[c->ndim - 2] == M &&
             c->shape[c->ndim - 1] == N;
    }
    if (!ok)
        return fg_error(FG_EINVAL,
                        "matmul_bf16: shapes do not fit: a %s%s @ b %s%s -> c %s (want a (..., M, "
                        "K), b (..., K, N) or (K, N), c (..., M, N))",
                        fg_tensor_describe(a, sa, sizeof sa), ta ? "^T" : "",
                        fg_tensor_describe(b, sb, sizeof sb), tb ? "^T" : "",
                        fg_tensor_describe(c, sc, sizeof sc));
    int64_t batch = 1;
    for (int d = 0; d < a->ndim - 2; d++) batch *= a->shape[d];
    if (batch == 0 || M == 0 || N == 0) return FG_OK;
    if (K == 0) return scale_output(c, beta);
    pthread_once(&g_once, make_engine);
    if (g_engine_status != dnnl_success) return dnnl_fail(g_engine_status, "engine creation");
    fg_get_num_threads(); /* oneDNN's OpenMP runtime follows omp_set_num_threads */

    fg_status st = FG_OK;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t post = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_stream_t stream = NULL;
    dnnl_memory_t am = NULL, bm = NULL, cm = NULL, sm = NULL;
    void *scratch = NULL;
    dnnl_memory_desc_t amd, bmd, cmd;
    /* a shared b with an untransposed a: one (batch M, K) @ (K, N) product */
    bool fold = shared && !ta;
    int64_t rows = fold ? batch * M : M, nb = fold ? 1 : batch;
    dnnl_dims_t ad = {nb, rows, K}, as = {rows * K, ta ? 1 : K, ta ? rows : 1};
    dnnl_dims_t cd = {nb, rows, N}, cs = {rows * N, N, 1};
    DN(dnnl_memory_desc_init_by_strides(&amd, 3, ad, dnnl_bf16, as), "memory descriptor");
    DN(desc_of(&bmd, b, tb, nb, shared), "memory descriptor");
    DN(dnnl_memory_desc_init_by_strides(&cmd, 3, cd, dnnl_type(c->dtype), cs), "memory descriptor");
    dnnl_matmul_desc_t md;
    DN(dnnl_matmul_desc_init(&md, &amd, &bmd, NULL, &cmd), "matmul descriptor");
    DN(dnnl_primitive_attr_create(&attr), "attribute");
    DN(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user), "scratchpad mode");
    if (alpha != 1.0) {
        float s = (float)alpha;
        DN(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &s), "output scale");
    }
    if (beta != 0.0) { /* c = alpha a b + beta c: the sum post-op reads c before it writes */
        DN(dnnl_post_ops_create(&post), "post-ops");
        DN(dnnl_post_ops_append_sum(post, (float)beta), "sum post-op");
        DN(dnnl_primitive_attr_set_post_ops(attr, post), "post-ops");
    }
    DN(dnnl_primitive_desc_create(&pd, &md, attr, g_engine, NULL), "primitive descriptor");
    DN(dnnl_primitive_create(&prim, pd), "primitive");
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    size_t sbytes = smd ? dnnl_memory_desc_get_size(smd) : 0;
    if (sbytes) {
        scratch = fg_alloc(sbytes);
        if (!scratch) {
            st = fg_error(FG_ENOMEM, "matmul_bf16: %zu bytes of scratchpad", sbytes);
            goto fail;
        }
        DN(dnnl_memory_create(&sm, smd, g_engine, scratch), "memory");
    }
    DN(dnnl_memory_create(&am, &amd, g_engine, a->data), "memory");
    DN(dnnl_memory_create(&bm, &bmd, g_engine, b->data), "memory");
    DN(dnnl_memory_create(&cm, &cmd, g_engine, c->data), "memory");
    DN(dnnl_stream_create(&stream, g_engine, dnnl_stream_default_flags), "stream");
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm},
                               {DNNL_ARG_SCRATCHPAD, sm}};
    DN(dnnl_primitive_execute(prim, stream, sm ? 4 : 3, args), "execute");
    DN(dnnl_stream_wait(stream), "stream wait");
fail:
    dnnl_stream_destroy(stream);
    dnnl_memory_destroy(sm);
    dnnl_memory_destroy(cm);
    dnnl_memory_destroy(bm);
    dnnl_memory_destroy(am);
    fg_free(scratch);
    dnnl_primitive_destroy(prim);
    dnnl_primitive_desc_destroy(pd);
    dnnl_post_ops_destroy(post);
    dnnl_primitive_attr_destroy(attr);
    return st;
}

/* The f32 product for fg__cpu_matmul: row-major c (M, N) = alpha op(a)
 * op(b) + beta c with leading dimensions, as cblas_sgemm takes them. With
 * beta = 0 c is written without being read (OpenBLAS first zeroes c, then
 * accumulates into it). */
fg_status fg__cpu_gemm_dnnl_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                                const float *a, int64_t lda, const float *b, int64_t ldb,
                                float beta, float *c, int64_t ldc) {
    pthread_once(&g_once, make_engine);
    if (g_engine_status != dnnl_success) return dnnl_fail(g_engine_status, "engine creation");
    fg_status st = FG_OK;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t post = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_stream_t stream = NULL;
    dnnl_memory_t am = NULL, bm = NULL, cm = NULL, sm = NULL;
    void *scratch = NULL;
    dnnl_memory_desc_t amd, bmd, cmd;
    /* a stored (K, M) when ta: the same memory seen with swapped strides */
    dnnl_dims_t ad = {M, K}, as = {ta ? 1 : lda, ta ? lda : 1};
    dnnl_dims_t bd = {K, N}, bs = {tb ? 1 : ldb, tb ? ldb : 1};
    dnnl_dims_t cd = {M, N}, cs = {ldc, 1};
    DN(dnnl_memory_desc_init_by_strides(&amd, 2, ad, dnnl_f32, as), "memory descriptor");
    DN(dnnl_memory_desc_init_by_strides(&bmd, 2, bd, dnnl_f32, bs), "memory descriptor");
    DN(dnnl_memory_desc_init_by_strides(&cmd, 2, cd, dnnl_f32, cs), "memory descriptor");
    dnnl_matmul_desc_t md;
    DN(dnnl_matmul_desc_init(&md, &amd, &bmd, NULL, &cmd), "matmul descriptor");
    DN(dnnl_primitive_attr_create(&attr), "attribute");
    DN(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user), "scratchpad mode");
    if (alpha != 1.0f)
        DN(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha), "output scale");
    if (beta != 0.0f) {
        DN(dnnl_post_ops_create(&post), "post-ops");
        DN(dnnl_post_ops_append_sum(post, beta), "sum post-op");
        DN(dnnl_primitive_attr_set_post_ops(attr, post), "post-ops");
    }
    DN(dnnl_primitive_desc_create(&pd, &md, attr, g_engine, NULL), "primitive descriptor");
    DN(dnnl_primitive_create(&prim, pd), "primitive");
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    size_t sbytes = smd ? dnnl_memory_desc_get_size(smd) : 0;
    if (sbytes) {
        scratch = fg_alloc(sbytes);
        if (!scratch) {
            st = fg_error(FG_ENOMEM, "matmul: %zu bytes of oneDNN scratchpad", sbytes);
            goto fail;
        }
        DN(dnnl_memory_create(&sm, smd, g_engine, scratch), "memory");
    }
    DN(dnnl_memory_create(&am, &amd, g_engine, (void *)a), "memory");
    DN(dnnl_memory_create(&bm, &bmd, g_engine, (void *)b), "memory");
    DN(dnnl_memory_create(&cm, &cmd, g_engine, c), "memory");
    DN(dnnl_stream_create(&stream, g_engine, dnnl_stream_default_flags), "stream");
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm},
                               {DNNL_ARG_SCRATCHPAD, sm}};
    DN(dnnl_primitive_execute(prim, stream, sm ? 4 : 3, args), "execute");
    DN(dnnl_stream_wait(stream), "stream wait");
fail:
    dnnl_stream_destroy(stream);
    dnnl_memory_destroy(sm);
    dnnl_memory_destroy(cm);
    dnnl_memory_destroy(bm);
    dnnl_memory_destroy(am);
    fg_free(scratch);
    dnnl_primitive_destroy(prim);
    dnnl_primitive_desc_destroy(pd);
    dnnl_post_ops_destroy(post);
    dnnl_primitive_attr_destroy(attr);
    return st;
}

#else /* no oneDNN in this build */

fg_status fg__cpu_gemm_dnnl_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                                const float *a, int64_t lda, const float *b, int64_t ldb,
                                float beta, float *c, int64_t ldc) {
    (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)a, (void)lda, (void)b;
    (void)ldb, (void)beta, (void)c, (void)ldc;
    return FG_EUNSUPPORTED;
}

fg_status fg__cpu_matmul_bf16(const fg_tensor *a, bool ta, const fg_tensor *b, bool tb,
                              fg_tensor *c, double alpha, double beta) {
    (void)a, (void)ta, (void)b, (void)tb, (void)c, (void)alpha, (void)beta;
    return fg_error(FG_EUNSUPPORTED, "matmul_bf16: this build has no oneDNN (configure with "
                                     "FULGUR_WITH_DNNL=ON and libdnnl-dev installed)");
}

#endif
