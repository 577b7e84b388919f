/* The precision policy table: each of Lightning's six settings with its
 * dtypes, master weights and loss scaling as docs/precision.md states them;
 * names and aliases parse both ways; the kernel path of each (the launch
 * layer's refusal of the two not built: tests/launch/test_parse.c). */
#include "fulgur/precision.h"
#include "harness.h"

TEST(table) {
    static const struct {
        fg_precision_kind k;
        const char *name, *alias;
        fg_dtype param, compute, grad, optim;
        bool master, scaling, built;
    } want[] = {
        {FG_PRECISION_64_TRUE, "64-true", "64", FG_F64, FG_DTYPE_DEFAULT, FG_F64, FG_F64, false,
         false, true},
        {FG_PRECISION_32_TRUE, "32-true", "32", FG_F32, FG_DTYPE_DEFAULT, FG_F32, FG_F32, false,
         false, true},
        {FG_PRECISION_BF16_MIXED, "bf16-mixed", "bf16", FG_F32, FG_BF16, FG_F32, FG_F32, true,
         false, true},
        {FG_PRECISION_16_MIXED, "16-mixed", "16", FG_F32, FG_F16, FG_F32, FG_F32, true, true, true},
        {FG_PRECISION_BF16_TRUE, "bf16-true", NULL, FG_BF16, FG_BF16, FG_BF16, FG_F32, false, false,
         true},
        {FG_PRECISION_16_TRUE, "16-true", NULL, FG_F16, FG_F16, FG_F16, FG_F32, false, false, true},
    };
    CHECK(sizeof want / sizeof want[0] == FG_PRECISION_COUNT);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const fg_precision_policy *p = fg_precision_policy_of(want[i].k);
        CHECK(p != NULL);
        if (!p) continue;
        CHECK_MSG(!strcmp(p->name, want[i].name), "%s", p->name);
        CHECK(!strcmp(fg_precision_kind_name(want[i].k), want[i].name));
        CHECK(want[i].alias ? p->alias && !strcmp(p->alias, want[i].alias) : !p->alias);
        CHECK_MSG(p->param_dtype == want[i].param && p->compute == want[i].compute &&
                      p->grad_dtype == want[i].grad && p->optim_dtype == want[i].optim,
                  "%s: dtypes", p->name);
        CHECK_MSG(p->master_weights == want[i].master && p->loss_scaling == want[i].scaling &&
                      p->built == want[i].built,
                  "%s: flags", p->name);
        fg_precision_kind k = FG_PRECISION_COUNT;
        CHECK_OK(fg_precision_parse(want[i].name, &k));
        CHECK(k == want[i].k);
        if (want[i].alias) {
            k = FG_PRECISION_COUNT;
            CHECK_OK(fg_precision_parse(want[i].alias, &k));
            CHECK(k == want[i].k);
        }
        if (!want[i].built) CHECK_CONTAINS(fg_precision_kernel_path(want[i].k), "not built yet");
    }
    CHECK(fg_precision_policy_of(FG_PRECISION_COUNT) == NULL);
    CHECK(fg_precision_policy_of((fg_precision_kind)-1) == NULL);
    CHECK(!strcmp(fg_precision_kind_name(FG_PRECISION_COUNT), "?"));
    fg_precision_kind k;
    CHECK_OK(fg_precision_parse(NULL, &k));
    CHECK(k == FG_PRECISION_32_TRUE);
    CHECK_OK(fg_precision_parse("BF16-Mixed", &k));
    CHECK(k == FG_PRECISION_BF16_MIXED);
    CHECK_STATUS(fg_precision_parse("bf15", &k), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "precision=\"bf15\": unknown; expected one of 32-true (32)");
    CHECK_STATUS(fg_precision_parse("32", NULL), FG_EINVAL);
}

TEST(kernel_paths) {
    char bf[512]; /* the string is valid until the next call */
    snprintf(bf, sizeof bf, "%s", fg_precision_kernel_path(FG_PRECISION_BF16_MIXED));
    printf("    bf16-mixed: %s\n", bf);
    printf("    16-mixed: %s\n", fg_precision_kernel_path(FG_PRECISION_16_MIXED));
    CHECK_CONTAINS(bf, "bf16 products: ");
    CHECK_CONTAINS(bf, fg_matmul_bf16_path());
    CHECK_CONTAINS(fg_precision_kernel_path(FG_PRECISION_16_MIXED), "no f16 GEMM");
    CHECK(!strcmp(fg_precision_kernel_path(FG_PRECISION_32_TRUE), "f32 products"));
    CHECK(!strcmp(fg_precision_kernel_path(FG_PRECISION_64_TRUE), "f64 products"));
    printf("    bf16-true: %s\n", fg_precision_kernel_path(FG_PRECISION_BF16_TRUE));
    CHECK_CONTAINS(fg_precision_kernel_path(FG_PRECISION_BF16_TRUE),
                   "bf16 parameters and gradients, f32 optimizer state; bf16 products: ");
    CHECK_CONTAINS(fg_precision_kernel_path(FG_PRECISION_16_TRUE),
                   "f16 parameters and gradients, f32 optimizer state; ");
    CHECK(!strcmp(
        fg_precision_available(),
        "32-true (32), 64-true (64), 16-mixed (16), bf16-mixed (bf16), 16-true, bf16-true"));
}
