/* The guarded device's op table: complete (every entry of fg_op_table,
 * each the CPU kernel through the device's private alias), bitwise equal
 * to the CPU's on the same inputs, refusing a tensor that is not on the
 * device; and the registry's stubs for an entry a backend leaves out. */
#include <math.h>
#include <string.h>

#include "fulgur/device.h"
#include "fulgur/ops.h"
#include "harness.h"
#include "ops/ops_impl.h"
#include "ops/ops_list.h"

static fg_tensor *rnd(fg_dtype dt, int ndim, const int64_t *shape, uint64_t seed) {
    fg_tensor *t = fg_tensor_new(dt, ndim, shape);
    float *p = fg_tensor_data(t);
    for (int64_t i = 0; i < fg_tensor_numel(t); i++)
        p[i] = (float)((int)(fg_rng_u32_at(seed, (uint64_t)i) % 2001) - 1000) / 256.0f;
    return t;
}

static bool same_bits(const fg_tensor *dev, const fg_tensor *host) {
    fg_tensor *back = fg_tensor_to(dev, NULL);
    bool ok = back && fg_tensor_nbytes(back) == fg_tensor_nbytes(host) &&
              memcmp(fg_tensor_data(back), fg_tensor_data(host), fg_tensor_nbytes(host)) == 0;
    fg_tensor_free(back);
    return ok;
}

#define COUNT(name, params, prep, args) +1
TEST(the_list_names_every_entry_and_guarded_fills_them_all) {
    /* fg_op_table is the device name and then one function pointer an entry */
    size_t slots = (sizeof(fg_op_table) - sizeof(const char *)) / sizeof(void (*)(void));
    CHECK(slots == (size_t)(0 FG__OPS_LIST(COUNT)));
    CHECK(fg__ops_missing(FG_CPU) == 0);
    CHECK(fg__ops_missing(FG_GUARDED) == 0);
    const fg_op_table *g = fg_ops_get(FG_GUARDED);
    CHECK(g && strcmp(g->device, "guarded") == 0);
    CHECK(g != fg_ops_get(FG_CPU));
}

/* A build without the CUDA backend has no CUDA table, and says so; one with
 * it has a table named cuda whose missing entries are stubs. */
TEST(cuda_table_exactly_when_built) {
    const fg_op_table *t = fg_ops_get(FG_CUDA);
    if (!t) {
        CHECK(fg_last_status() == FG_EUNSUPPORTED);
        CHECK_CONTAINS(fg_last_error(), "device cuda: no kernels in this build");
        CHECK(fg__ops_missing(FG_CUDA) == -1);
    } else {
        CHECK(strcmp(t->device, "cuda") == 0);
        /* every entry has a CUDA kernel (docs/gpu.md): an entry added to the
         * op table without one changes this count, and with it
         * scripts/gpu-check.sh's coverage */
        CHECK_MSG(fg__ops_missing(FG_CUDA) == 0, "the CUDA table leaves %d entries to stubs",
                  fg__ops_missing(FG_CUDA));
    }
}

TEST(a_missing_entry_is_an_error_naming_op_and_device) {
    fg_op_table partial = {.device = "cuda", .matmul = fg_ops_get(FG_CPU)->matmul};
    fg_op_table t;
    CHECK(fg__ops_complete(&partial, FG_CUDA, &t) == (int)(0 FG__OPS_LIST(COUNT)) - 1);
    CHECK(t.matmul == partial.matmul);
    CHECK(t.binary != NULL);
    CHECK_STATUS(t.binary(FG_BIN_ADD, NULL, NULL, NULL), FG_EUNSUPPORTED);
    CHECK_CONTAINS(fg_last_error(), "op binary is not available on cuda");
    CHECK_STATUS(t.attention_bwd(NULL, 1, true, NULL, NULL, NULL, NULL, NULL), FG_EUNSUPPORTED);
    CHECK_CONTAINS(fg_last_error(), "op attention_bwd is not available on cuda");
}

TEST(guarded_kernels_equal_the_cpu_bitwise) {
    fg_dev *d = fg_dev_open("guarded:0", NULL);
    CHECK_MSG(d != NULL, "%s", fg_last_error());
    if (!d) return;
    const fg_op_table *cpu = fg_ops_get(FG_CPU), *g = fg_ops_get(FG_GUARDED);
    const int64_t sa[2] = {7, 5}, sb[2] = {5, 3}, sc[2] = {7, 3}, sn[1] = {7};
    fg_tensor *a = rnd(FG_F32, 2, sa, 1), *b = rnd(FG_F32, 2, sb, 2);
    fg_tensor *c = fg_tensor_new(FG_F32, 2, sc);
    fg_tensor *da = fg_tensor_to(a, d), *db = fg_tensor_to(b, d);
    fg_tensor *dc = fg_tensor_new_on(d, FG_F32, 2, sc);
    CHECK_OK(cpu->matmul(a, false, b, false, c, 1.0, 0.0));
    CHECK_OK(g->matmul(da, false, db, false, dc, 1.0, 0.0));
    CHECK(same_bits(dc, c));
    /* y may be x: one view of the one tensor */
    CHECK_OK(cpu->scale(c, 0.375, c));
    CHECK_OK(g->scale(dc, 0.375, dc));
    CHECK(same_bits(dc, c));
    double s1 = 0, s2 = 0;
    CHECK_OK(cpu->sumsq_all(c, &s1));
    CHECK_OK(g->sumsq_all(dc, &s2));
    CHECK(s1 == s2);
    /* cross-entropy: logits c (7, 3) against i32 targets, a scalar loss */
    fg_tensor *tg = fg_tensor_new(FG_I32, 1, sn);
    for (int i = 0; i < 7; i++) ((int32_t *)fg_tensor_data(tg))[i] = i % 3;
    fg_tensor *dtg = fg_tensor_to(tg, d);
    fg_tensor *l = fg_tensor_new(FG_F32, 0, NULL), *dl = fg_tensor_new_on(d, FG_F32, 0, NULL);
    int64_t n1 = 0, n2 = 0;
    CHECK_OK(cpu->cross_entropy_fwd(c, tg, -100, l, &n1));
    CHECK_OK(g->cross_entropy_fwd(dc, dtg, -100, dl, &n2));
    CHECK(n1 == 7 && n2 == 7 && same_bits(dl, l));
    fg_tensor *gc = fg_tensor_new(FG_F32, 2, sc), *dgc = fg_tensor_new_on(d, FG_F32, 2, sc);
    CHECK_OK(cpu->cross_entropy_bwd(c, tg, -100, 1.0, n1, gc));
    CHECK_OK(g->cross_entropy_bwd(dc, dtg, -100, 1.0, n2, dgc));
    CHECK(same_bits(dgc, gc));
    /* a narrow view of a device tensor is a device tensor the kernels take */
    fg_tensor *rows = fg_tensor_narrow_view(dc, 0, 2, 3),
              *hrows = fg_tensor_narrow_view(c, 0, 2, 3);
    double r1 = 0, r2 = 0;
    CHECK_OK(cpu->sum_all(hrows, &r1));
    CHECK_OK(g->sum_all(rows, &r2));
    CHECK(r1 == r2);
    fg_tensor *to_free[] = {a, b, c, da, db, dc, tg, dtg, l, dl, gc, dgc};
    for (size_t i = 0; i < sizeof to_free / sizeof *to_free; i++) fg_tensor_free(to_free[i]);
    fg_step_reset();
    CHECK_OK(fg_dev_leak_check(d));
    fg_dev_close(d);
}

TEST(a_tensor_off_the_device_is_refused_by_name) {
    fg_dev *d = fg_dev_open("guarded:0", NULL), *d1 = fg_dev_open("guarded:1", NULL);
    CHECK(d && d1);
    if (!d || !d1) return;
    const fg_op_table *g = fg_ops_get(FG_GUARDED);
    const int64_t s[1] = {4};
    fg_tensor *h = rnd(FG_F32, 1, s, 3), *x = fg_tensor_to(h, d),
              *y = fg_tensor_new_on(d, FG_F32, 1, s);
    fg_tensor *z = fg_tensor_new_on(d1, FG_F32, 1, s);
    CHECK_STATUS(g->binary(FG_BIN_ADD, x, h, y), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "op binary on the guarded device: tensor");
    CHECK_CONTAINS(fg_last_error(), "is in host memory");
    CHECK_STATUS(g->binary(FG_BIN_ADD, x, z, y), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "is on guarded:1, the others on guarded:0");
    fg_tensor_free(z);
    fg_tensor_free(y);
    fg_tensor_free(x);
    fg_tensor_free(h);
    fg_dev_close(d1);
    fg_dev_close(d);
}

/* The device entries beside the table: AdamW and SGD steps, the sum of
 * squares and the non-finite scan, on guarded memory the same bits as on
 * the host; a device the entry has no kernel for is refused by name. */
TEST(device_entries_equal_the_host_bitwise) {
    fg_dev *d = fg_dev_open("guarded:0", NULL);
    CHECK(d != NULL);
    if (!d) return;
    const int64_t n[1] = {1000};
    fg_tensor *hp = rnd(FG_F32, 1, n, 4), *hg = rnd(FG_F32, 1, n, 5);
    fg_tensor *hm = fg_tensor_new(FG_F32, 1, n), *hv = fg_tensor_new(FG_F32, 1, n);
    fg_tensor *dp = fg_tensor_to(hp, d), *dg = fg_tensor_to(hg, d);
    fg_tensor *dm = fg_tensor_to(hm, d), *dv = fg_tensor_to(hv, d);
    for (int t = 1; t <= 3; t++) {
        CHECK_OK(fg__ops_adamw(hp, hg, hm, hv, 0.999, 0.9, 0.999, 0.01 / (1 - 0.9), 0.03, 1e-8));
        CHECK_OK(fg__ops_adamw(dp, dg, dm, dv, 0.999, 0.9, 0.999, 0.01 / (1 - 0.9), 0.03, 1e-8));
        CHECK_OK(fg__ops_sgd(hp, hg, hm, 0.1, 0.01, 0.9, 1, t == 1, false));
        CHECK_OK(fg__ops_sgd(dp, dg, dm, 0.1, 0.01, 0.9, 1, t == 1, false));
    }
    CHECK(same_bits(dp, hp) && same_bits(dm, hm) && same_bits(dv, hv));
    /* Adam with AMSGrad, centered RMSprop with momentum, Adagrad, Lion,
     * each with state of its own (zeros; Adagrad's sum from 0.1) */
    fg_tensor *hs[8], *ds[8];
    for (int i = 0; i < 8; i++) {
        hs[i] = fg_tensor_new(FG_F32, 1, n);
        if (i == 6) CHECK_OK(fg_tensor_fill(hs[i], 0.1));
        ds[i] = fg_tensor_to(hs[i], d);
    }
    for (int t = 1; t <= 3; t++) {
        for (int k = 0; k < 2; k++) {
            fg_tensor *p = k ? dp : hp, *g = k ? dg : hg, **st = k ? ds : hs;
            CHECK_OK(fg__ops_adam(p, g, st[0], st[1], st[2], 0.01, 0.9, 0.999, 0.01 / (1 - 0.9),
                                  0.03, 1e-8));
            CHECK_OK(fg__ops_rmsprop(p, g, st[3], st[4], st[5], 0.01, 0.01, 0.99, 1e-8, 0.9));
            CHECK_OK(fg__ops_adagrad(p, g, st[6], 0.1, 0.01, 1e-10));
            CHECK_OK(fg__ops_lion(p, g, st[7], 1e-3, 0.999, 0.9, 0.99));
        }
    }
    bool all = same_bits(dp, hp);
    for (int i = 0; i < 8; i++) all = all && same_bits(ds[i], hs[i]);
    CHECK(all);
    /* clipping by value: each element into [-v, v] */
    CHECK_OK(fg_ops_clamp_flat(hg, 0.5));
    CHECK_OK(fg_ops_clamp_flat(dg, 0.5));
    CHECK(same_bits(dg, hg));
    bool in = true;
    for (int64_t i = 0; i < n[0]; i++) in = in && fabsf(((float *)fg_tensor_data(hg))[i]) <= 0.5f;
    CHECK(in);
    CHECK_STATUS(fg_ops_clamp_flat(dg, -1), FG_EINVAL);
    double s1 = 0, s2 = 0;
    CHECK_OK(fg__ops_sumsq(hp, &s1));
    CHECK_OK(fg__ops_sumsq(dp, &s2));
    CHECK(s1 == s2 && s1 > 0);
    int64_t k = 7;
    CHECK_OK(fg_ops_first_nonfinite(dp, &k));
    CHECK(k == -1);
    ((float *)fg_tensor_data(hg))[613] = 1.0f / 0.0f;
    fg_tensor *bad = fg_tensor_to(hg, d);
    CHECK_OK(fg_ops_first_nonfinite(bad, &k));
    CHECK(k == 613);
    /* one step's tensors on one device */
    CHECK_STATUS(fg__ops_sgd(dp, hg, NULL, 0.1, 0, 0, 1, true, false), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "sgd: tensors on guarded:0 and the host");
    for (int i = 0; i < 8; i++) {
        fg_tensor_free(hs[i]);
        fg_tensor_free(ds[i]);
    }
    fg_tensor *to_free[] = {hp, hg, hm, hv, dp, dg, dm, dv, bad};
    for (size_t i = 0; i < sizeof to_free / sizeof *to_free; i++) fg_tensor_free(to_free[i]);
    CHECK_OK(fg_dev_leak_check(d));
    fg_dev_close(d);
}
