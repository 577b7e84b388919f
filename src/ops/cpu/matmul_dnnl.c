/* oneDNN's matmul primitive behind two of the CPU products.
 *
 * bf16 (fg__dnnl_matmul_bf16): bf16 inputs, f32 accumulation, f32 or bf16
 * output. On an AVX512-BF16 CPU (no AMX) oneDNN's brgemm bf16 kernels run
 * about twice as fast as OpenBLAS sgemm on the GPT's shapes
 * (bench/gemm_bench); with AMX, more. oneDNN 2.6 implements bf16 matmul
 * only from avx512_core up: on an AVX2-only CPU (or with ONEDNN_MAX_CPU_ISA
 * capped below avx512_core) creating the primitive fails with
 * dnnl_unimplemented, which comes back as FG_EUNSUPPORTED, and
 * matmul_bf16.c, which owns the choice, takes its f32 fallback.
 *
 * f32 (fg__cpu_gemm_dnnl_f32): the single products of fg__cpu_matmul for
 * which gemm_pick.c measured oneDNN faster (on an AVX-512 CPU its
 * brg:avx512_core f32 kernels beat OpenBLAS's on the GPT's linear layers,
 * and with beta = 0 they write c without OpenBLAS's zeroing pass; on AVX2
 * they lose). A variant oneDNN refuses is remembered and goes to OpenBLAS
 * from then on without asking oneDNN again.
 *
 * A transpose is a stride swap in the memory descriptor, never a copy; a
 * shared b with an untransposed a folds the batch into M. Primitives are
 * created per call and found again in oneDNN's own primitive cache; their
 * scratchpad comes from fg_alloc. The engine is made once per process; a
 * stream per call (streams are not thread-safe). */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "blas.h"
#include "cpu_impl.h"

#ifdef FULGUR_HAVE_DNNL
#include <dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>
#include <pthread.h>

static dnnl_engine_t g_engine;
static dnnl_status_t g_engine_status = dnnl_runtime_error;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void make_engine(void) { g_engine_status = dnnl_engine_create(&g_engine, dnnl_cpu, 0); }

const char *fg__dnnl_isa(void) {
    const char *s = dnnl_cpu_isa2str(dnnl_get_effective_cpu_isa());
    return strncmp(s, "cpu_isa_", 8) == 0 ? s + 8 : s;
}

static char g_version[64];
static pthread_once_t g_version_once = PTHREAD_ONCE_INIT;

static void make_version(void) {
    const dnnl_version_t *v = dnnl_version();
    snprintf(g_version, sizeof g_version, "%d.%d.%d (%s)", v->major, v->minor, v->patch, v->hash);
}

const char *fg__dnnl_version(void) {
    pthread_once(&g_version_once, make_version);
    return g_version;
}

static FG_MUST_USE fg_status dnnl_fail(dnnl_status_t s, const char *kernel, const char *what) {
    if (s == dnnl_unimplemented) {
        const dnnl_version_t *v = dnnl_version();
        return fg_error(FG_EUNSUPPORTED,
                        "%s: oneDNN %d.%d.%d implements no such product on this CPU (isa %s): "
                        "%s failed with status %d (unimplemented)",
                        kernel, v->major, v->minor, v->patch, fg__dnnl_isa(), what, (int)s);
    }
    return fg_error(FG_EINTERNAL, "%s: oneDNN %s failed (status %d)", kernel, what, (int)s);
}

/* DN(call, what) goes to `fail` with st set when call fails; the function
 * names itself in a local `kernel`. */
#define DN(call, what)                                                                             \
    do {                                                                                           \
        dnnl_status_t dn_s_ = (call);                                                              \
        if (dn_s_ != dnnl_success) {                                                               \
            st = dnnl_fail(dn_s_, kernel, what);                                                   \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

/* A primitive descriptor of c = alpha a b + beta c over the given memory
 * descriptors; *pd stays NULL on failure. */
static FG_MUST_USE fg_status make_pd(const char *kernel, dnnl_primitive_desc_t *pd,
                                     const dnnl_memory_desc_t *amd, const dnnl_memory_desc_t *bmd,
                                     const dnnl_memory_desc_t *cmd, float alpha, float beta) {
    fg_status st = FG_OK;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t post = NULL;
    dnnl_matmul_desc_t md;
    *pd = NULL;
    DN(dnnl_matmul_desc_init(&md, amd, bmd, NULL, cmd), "matmul descriptor");
    DN(dnnl_primitive_attr_create(&attr), "attribute");
    DN(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user), "scratchpad mode");
    if (alpha != 1.0f)
        DN(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha), "output scale");
    if (beta != 0.0f) { /* c = alpha a b + beta c: the sum post-op reads c before it writes */
        DN(dnnl_post_ops_create(&post), "post-ops");
        DN(dnnl_post_ops_append_sum(post, beta), "sum post-op");
        DN(dnnl_primitive_attr_set_post_ops(attr, post), "post-ops");
    }
    DN(dnnl_primitive_desc_create(pd, &md, attr, g_engine, NULL), "primitive descriptor");
fail:
    dnnl_post_ops_destroy(post);
    dnnl_primitive_attr_destroy(attr);
    return st;
}

/* Runs the primitive of pd on a, b, c with a scratchpad from fg_alloc. */
static FG_MUST_USE fg_status run_pd(const char *kernel, dnnl_primitive_desc_t pd,
                                    const dnnl_memory_desc_t *amd, const void *a,
                                    const dnnl_memory_desc_t *bmd, const void *b,
                                    const dnnl_memory_desc_t *cmd, void *c) {
    fg_status st = FG_OK;
    dnnl_primitive_t prim = NULL;
    dnnl_stream_t stream = NULL;
    dnnl_memory_t am = NULL, bm = NULL, cm = NULL, sm = NULL;
    void *scratch = NULL;
    DN(dnnl_primitive_create(&prim, pd), "primitive");
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    size_t sbytes = smd ? dnnl_memory_desc_get_size(smd) : 0;
    if (sbytes) {
        scratch = fg_alloc(sbytes);
        if (!scratch) {
            st = fg_error(FG_ENOMEM, "%s: %zu bytes of oneDNN scratchpad", kernel, sbytes);
            goto fail;
        }
        DN(dnnl_memory_create(&sm, smd, g_engine, scratch), "memory");
    }
    DN(dnnl_memory_create(&am, amd, g_engine, (void *)a), "memory");
    DN(dnnl_memory_create(&bm, bmd, g_engine, (void *)b), "memory");
    DN(dnnl_memory_create(&cm, cmd, g_engine, c), "memory");
    DN(dnnl_stream_create(&stream, g_engine, dnnl_stream_default_flags), "stream");
    dnnl_exec_arg_t args[4] = {
        {DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}, {DNNL_ARG_SCRATCHPAD, sm}};
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
    return st;
}

static FG_MUST_USE fg_status engine(const char *kernel) {
    fg_status st = FG_OK;
    pthread_once(&g_once, make_engine);
    DN(g_engine_status, "engine creation");
fail:
    return st;
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

fg_status fg__dnnl_bf16_probe(void) {
    const char *kernel = "matmul_bf16";
    fg_status st = engine(kernel);
    if (st != FG_OK) return st;
    dnnl_memory_desc_t amd, cmd;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_dims_t d = {2, 2}, s = {2, 1};
    DN(dnnl_memory_desc_init_by_strides(&amd, 2, d, dnnl_bf16, s), "memory descriptor");
    DN(dnnl_memory_desc_init_by_strides(&cmd, 2, d, dnnl_f32, s), "memory descriptor");
    st = make_pd(kernel, &pd, &amd, &amd, &cmd, 1.0f, 0.0f);
fail:
    dnnl_primitive_desc_destroy(pd);
    return st;
}

fg_status fg__dnnl_matmul_bf16(const fg_tensor *a, bool ta, const fg_tensor *b, bool tb,
                               fg_tensor *c, double alpha, double beta, int64_t batch, int64_t M,
                               int64_t K, int64_t N) {
    const char *kernel = "matmul_bf16";
    FG_TRY(engine(kernel));
    fg_get_num_threads(); /* oneDNN's OpenMP runtime follows omp_set_num_threads */
    fg_status st = FG_OK;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_memory_desc_t amd, bmd, cmd;
    /* a shared b with an untransposed a: one (batch M, K) @ (K, N) product */
    bool shared = b->ndim == 2, fold = shared && !ta;
    int64_t rows = fold ? batch * M : M, nb = fold ? 1 : batch;
    dnnl_dims_t ad = {nb, rows, K}, as = {rows * K, ta ? 1 : K, ta ? rows : 1};
    dnnl_dims_t cd = {nb, rows, N}, cs = {rows * N, N, 1};
    DN(dnnl_memory_desc_init_by_strides(&amd, 3, ad, dnnl_bf16, as), "memory descriptor");
    DN(desc_of(&bmd, b, tb, nb, shared), "memory descriptor");
    DN(dnnl_memory_desc_init_by_strides(&cmd, 3, cd, dnnl_type(c->dtype), cs), "memory descriptor");
    st = make_pd(kernel, &pd, &amd, &bmd, &cmd, (float)alpha, (float)beta);
    if (st == FG_OK) st = run_pd(kernel, pd, &amd, a->data, &bmd, b->data, &cmd, c->data);
fail:
    dnnl_primitive_desc_destroy(pd);
    return st;
}

/* f32 variants oneDNN refused: bit (ta, tb, alpha != 1, beta != 0). */
static _Atomic unsigned g_f32_refused;

fg_status fg__cpu_gemm_dnnl_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                                const float *a, int64_t lda, const float *b, int64_t ldb,
                                float beta, float *c, int64_t ldc) {
    const char *kernel = "matmul";
    unsigned bit = 1u << (ta | tb << 1 | (alpha != 1.0f) << 2 | (beta != 0.0f) << 3);
    if (atomic_load_explicit(&g_f32_refused, memory_order_relaxed) & bit) return FG_EUNSUPPORTED;
    FG_TRY(engine(kernel));
    fg_status st = FG_OK;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_memory_desc_t amd, bmd, cmd;
    /* a stored (K, M) when ta: the same memory seen with swapped strides */
    dnnl_dims_t ad = {M, K}, as = {ta ? 1 : lda, ta ? lda : 1};
    dnnl_dims_t bd = {K, N}, bs = {tb ? 1 : ldb, tb ? ldb : 1};
    dnnl_dims_t cd = {M, N}, cs = {ldc, 1};
    DN(dnnl_memory_desc_init_by_strides(&amd, 2, ad, dnnl_f32, as), "memory descriptor");
    DN(dnnl_memory_desc_init_by_strides(&bmd, 2, bd, dnnl_f32, bs), "memory descriptor");
    DN(dnnl_memory_desc_init_by_strides(&cmd, 2, cd, dnnl_f32, cs), "memory descriptor");
    st = make_pd(kernel, &pd, &amd, &bmd, &cmd, alpha, beta);
    if (st == FG_EUNSUPPORTED) /* OpenBLAS does it, now and from now on */
        atomic_fetch_or_explicit(&g_f32_refused, bit, memory_order_relaxed);
    else if (st == FG_OK) st = run_pd(kernel, pd, &amd, a, &bmd, b, &cmd, c);
fail:
    dnnl_primitive_desc_destroy(pd);
    return st;
}

/* A product whose b stays the same over many calls (the LSTM's W_hh over
 * the steps of a sequence): b reordered once into the layout oneDNN's
 * matmul picks for it (format "any": blocked for its brgemm kernels, which
 * then need not pack b on every call), the primitive and its memory
 * objects made once, a and c set per call. */
struct fg__dnnl_fixed {
    dnnl_primitive_t prim;
    dnnl_stream_t stream;
    dnnl_memory_t am, bm, cm, sm;
    void *bdata, *scratch;
};

void fg__dnnl_fixed_free(fg__dnnl_fixed *f) {
    if (!f) return;
    dnnl_stream_destroy(f->stream);
    dnnl_memory_destroy(f->am);
    dnnl_memory_destroy(f->bm);
    dnnl_memory_destroy(f->cm);
    dnnl_memory_destroy(f->sm);
    dnnl_primitive_destroy(f->prim);
    fg_free(f->bdata);
    fg_free(f->scratch);
    fg_free(f);
}

fg_status fg__dnnl_fixed_new(bool tb, int64_t M, int64_t N, int64_t K, const float *b, int64_t ldb,
                             fg__dnnl_fixed **out) {
    const char *kernel = "matmul (fixed b)";
    *out = NULL;
    FG_TRY(engine(kernel));
    fg_status st = FG_OK;
    dnnl_primitive_desc_t pd = NULL, rpd = NULL;
    dnnl_primitive_t reorder = NULL;
    dnnl_memory_t plain = NULL;
    fg__dnnl_fixed *f = fg_calloc(1, sizeof *f);
    if (!f) return fg_error(FG_ENOMEM, "%s: %zu bytes", kernel, sizeof *f);
    dnnl_memory_desc_t amd, bmd, bany, cmd;
    dnnl_dims_t ad = {M, K}, bd = {K, N}, bs = {tb ? 1 : ldb, tb ? ldb : 1}, cd = {M, N};
    DN(dnnl_memory_desc_init_by_tag(&amd, 2, ad, dnnl_f32, dnnl_ab), "memory descriptor");
    DN(dnnl_memory_desc_init_by_strides(&bmd, 2, bd, dnnl_f32, bs), "memory descriptor");
    DN(dnnl_memory_desc_init_by_tag(&bany, 2, bd, dnnl_f32, dnnl_format_tag_any),
       "memory descriptor");
    DN(dnnl_memory_desc_init_by_tag(&cmd, 2, cd, dnnl_f32, dnnl_ab), "memory descriptor");
    dnnl_matmul_desc_t md;
    DN(dnnl_matmul_desc_init(&md, &amd, &bany, NULL, &cmd), "matmul descriptor");
    dnnl_primitive_attr_t attr = NULL;
    DN(dnnl_primitive_attr_create(&attr), "attribute");
    dnnl_status_t ds = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (ds == dnnl_success) ds = dnnl_primitive_desc_create(&pd, &md, attr, g_engine, NULL);
    dnnl_primitive_attr_destroy(attr);
    DN(ds, "primitive descriptor");
    const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    size_t wbytes = dnnl_memory_desc_get_size(wmd),
           sbytes = smd ? dnnl_memory_desc_get_size(smd) : 0;
    f->bdata = fg_alloc(wbytes);
    f->scratch = sbytes ? fg_alloc(sbytes) : NULL;
    if (!f->bdata || (sbytes && !f->scratch)) {
        st = fg_error(FG_ENOMEM, "%s: %zu bytes of reordered weights and scratchpad", kernel,
                      wbytes + sbytes);
        goto fail;
    }
    DN(dnnl_primitive_create(&f->prim, pd), "primitive");
    DN(dnnl_stream_create(&f->stream, g_engine, dnnl_stream_default_flags), "stream");
    DN(dnnl_memory_create(&f->bm, wmd, g_engine, f->bdata), "memory");
    if (sbytes) DN(dnnl_memory_create(&f->sm, smd, g_engine, f->scratch), "memory");
    DN(dnnl_memory_create(&f->am, &amd, g_engine, DNNL_MEMORY_NONE), "memory");
    DN(dnnl_memory_create(&f->cm, &cmd, g_engine, DNNL_MEMORY_NONE), "memory");
    DN(dnnl_memory_create(&plain, &bmd, g_engine, (void *)b), "memory");
    DN(dnnl_reorder_primitive_desc_create(&rpd, &bmd, g_engine, wmd, g_engine, NULL), "reorder");
    DN(dnnl_primitive_create(&reorder, rpd), "reorder");
    dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, plain}, {DNNL_ARG_TO, f->bm}};
    DN(dnnl_primitive_execute(reorder, f->stream, 2, ra), "reorder");
    DN(dnnl_stream_wait(f->stream), "stream wait");
fail:
    dnnl_primitive_destroy(reorder);
    dnnl_primitive_desc_destroy(rpd);
    dnnl_memory_destroy(plain);
    dnnl_primitive_desc_destroy(pd);
    if (st != FG_OK) fg__dnnl_fixed_free(f);
    else *out = f;
    return st;
}

fg_status fg__dnnl_fixed_run(fg__dnnl_fixed *f, const float *a, float *c) {
    const char *kernel = "matmul (fixed b)";
    fg_status st = FG_OK;
    DN(dnnl_memory_set_data_handle(f->am, (void *)a), "memory");
    DN(dnnl_memory_set_data_handle(f->cm, c), "memory");
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, f->am},
                               {DNNL_ARG_WEIGHTS, f->bm},
                               {DNNL_ARG_DST, f->cm},
                               {DNNL_ARG_SCRATCHPAD, f->sm}};
    DN(dnnl_primitive_execute(f->prim, f->stream, f->sm ? 4 : 3, args), "execute");
    DN(dnnl_stream_wait(f->stream), "stream wait");
fail:
    return st;
}

#else /* no oneDNN in this build */

const char *fg__dnnl_isa(void) { return NULL; }

const char *fg__dnnl_version(void) { return "none"; }

fg_status fg__dnnl_bf16_probe(void) {
    return fg_error(FG_EUNSUPPORTED, "matmul_bf16: no oneDNN in this build");
}

fg_status fg__dnnl_matmul_bf16(const fg_tensor *a, bool ta, const fg_tensor *b, bool tb,
                               fg_tensor *c, double alpha, double beta, int64_t batch, int64_t M,
                               int64_t K, int64_t N) {
    (void)a, (void)ta, (void)b, (void)tb, (void)c, (void)alpha, (void)beta, (void)batch, (void)M;
    (void)K, (void)N;
    return fg__dnnl_bf16_probe();
}

fg_status fg__cpu_gemm_dnnl_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                                const float *a, int64_t lda, const float *b, int64_t ldb,
                                float beta, float *c, int64_t ldc) {
    (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)a, (void)lda, (void)b;
    (void)ldb, (void)beta, (void)c, (void)ldc;
    return FG_EUNSUPPORTED;
}

void fg__dnnl_fixed_free(fg__dnnl_fixed *f) { (void)f; }

fg_status fg__dnnl_fixed_new(bool tb, int64_t M, int64_t N, int64_t K, const float *b, int64_t ldb,
                             fg__dnnl_fixed **out) {
    (void)tb, (void)M, (void)N, (void)K, (void)b, (void)ldb;
    *out = NULL;
    return FG_EUNSUPPORTED;
}

fg_status fg__dnnl_fixed_run(fg__dnnl_fixed *f, const float *a, float *c) {
    (void)f, (void)a, (void)c;
    return FG_EUNSUPPORTED;
}

#endif
