/* The GPT under bf16-mixed against PyTorch's own CPU autocast
 * (tests/ref/gen_gpt_bf16_ref.py writes gpt_bf16_ref.bin from the model,
 * weights and batch of gpt_ref.bin): f32 weights, forward under
 * fg_autocast_set(FG_BF16) as under torch.autocast("cpu",
 * dtype=torch.bfloat16), backward, then the loss and every parameter's
 * gradient compared with PyTorch's.
 *
 * Tolerance (bf16's unit roundoff u = 2^-8 = 3.9e-3): the loss within
 * 2e-3 relative of PyTorch's autocast loss; each gradient within 10 u
 * (3.9e-2) of PyTorch's autocast gradient, norm-relative per tensor
 * (max|ours - torch| <= 10 u max|torch|). Two bf16 runs round different
 * intermediates (PyTorch 1.13 keeps layer norm and softmax in bf16 and
 * rounds every parameter gradient to bf16; fulgur keeps them f32), so
 * neither is the other's exact answer: both are also held to the f64
 * answer of gpt_ref.bin, fulgur within the same 10 u, and each tensor's
 * three errors are printed. On a CPU without oneDNN's bf16 matmul the
 * products take the f32 fallback (printed); the bounds are the same. */
#include <math.h>
#include <string.h>

#include "fulgur/precision.h"
#include "harness.h"
#include "ref/ref_file.h"

static double rel_err(const fg_tensor *a, const ref_array *b) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < b->numel; i++) {
        num = fmax(num, fabs(fg_tensor_get(a, i) - ref_at(b, i)));
        den = fmax(den, fabs(ref_at(b, i)));
    }
    return num / (den + 1e-30);
}

static double rel_err_ref(const ref_array *a, const ref_array *b) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < b->numel; i++) {
        num = fmax(num, fabs(ref_at(a, i) - ref_at(b, i)));
        den = fmax(den, fabs(ref_at(b, i)));
    }
    return num / (den + 1e-30);
}

#define U 0x1p-8

TEST(gpt_bf16_mixed_matches_torch_autocast) {
    ref_file *r = ref_open(fg_test_path("ref/gpt_ref.bin"));
    ref_file *rb = ref_open(fg_test_path("ref/gpt_bf16_ref.bin"));
    CHECK(r && rb);
    if (!r || !rb) {
        ref_close(r);
        ref_close(rb);
        return;
    }
    printf("    bf16 products: %s; conversions: %s\n", fg_matmul_bf16_path(), fg_ops_lowp_path());
    const ref_array *cfg = ref_get(r, "config");
    fg_gpt_config c = {.vocab = (int64_t)ref_at(cfg, 0),
                       .ctx = (int64_t)ref_at(cfg, 1),
                       .layers = (int)ref_at(cfg, 2),
                       .heads = (int)ref_at(cfg, 3),
                       .embd = (int64_t)ref_at(cfg, 4)};
    fg_module *m = fg_gpt_new(&c);
    CHECK(m != NULL);
    int64_t np = m ? fg_module_num_params(m) : 0;
    fg_state_entry *e = calloc((size_t)np + 1, sizeof *e);
    for (int64_t i = 0; i < np; i++) {
        char name[160];
        snprintf(name, sizeof name, "param.%s", fg_module_param_name(m, i));
        const ref_array *a = ref_get(r, name);
        CHECK(a != NULL);
        if (!a) goto out;
        e[i] = (fg_state_entry){fg_module_param_name(m, i), a->dtype, a->ndim, a->shape, a->data};
    }
    if (!m) goto out;
    CHECK_OK(fg_module_load_state(m, e, np, true));
    const ref_array *idx = ref_get(r, "idx"), *tg = ref_get(r, "targets");
    fg_tensor *x = fg_from_data(FG_I32, 2, idx->shape, idx->data);
    fg_tensor *y = fg_from_data(FG_I32, 2, tg->shape, tg->data);
    fg_dtype prev;
    CHECK_OK(fg_autocast_set(FG_BF16, &prev));
    fg_tensor *logits = fg_module_forward(m, x);
    fg_tensor *loss = fg_cross_entropy(logits, y, -100);
    CHECK_OK(fg_autocast_set(prev, NULL));
    CHECK(logits && fg_tensor_dtype(logits) == FG_BF16); /* as torch's autocast lm_head */
    CHECK(loss && fg_tensor_dtype(loss) == FG_F32);
    CHECK_OK(fg_backward(loss));
    if (!loss) goto out;
    double lt = ref_at(ref_get(rb, "loss_bf16"), 0), l64 = ref_at(ref_get(r, "loss"), 0);
    double el = fabs(fg_item(loss) - lt) / fabs(lt);
    printf("    loss %.8f; torch autocast %.8f (rel %.2e); f64 %.8f (ours rel %.2e, torch rel "
           "%.2e)\n",
           fg_item(loss), lt, el, l64, fabs(fg_item(loss) - l64) / l64, fabs(lt - l64) / l64);
    CHECK_MSG(el <= 2e-3, "loss %.8f vs torch autocast %.8f: rel %.3g > 2e-3", fg_item(loss), lt,
              el);
    double worst = 0;
    const char *worst_name = "";
    for (int64_t i = 0; i < np; i++) {
        char n1[160], n2[160];
        const char *pn = fg_module_param_name(m, i);
        snprintf(n1, sizeof n1, "grad_bf16.%s", pn);
        snprintf(n2, sizeof n2, "grad.%s", pn);
        const ref_array *gt = ref_get(rb, n1), *g64 = ref_get(r, n2);
        fg_tensor *ours = fg_tensor_grad(fg_module_param(m, i));
        CHECK(gt && g64 && ours && gt->numel == fg_tensor_numel(ours));
        if (!gt || !g64 || !ours) continue;
        double et = rel_err(ours, gt), e64 = rel_err(ours, g64), t64 = rel_err_ref(gt, g64);
        printf("    %-36s vs torch autocast %.2e, vs f64: ours %.2e, torch %.2e\n", pn, et, e64,
               t64);
        CHECK_MSG(et <= 10 * U, "grad %s: %.3g from torch's autocast gradient (> 10 u)", pn, et);
        CHECK_MSG(e64 <= 10 * U, "grad %s: %.3g from the f64 gradient (> 10 u)", pn, e64);
        if (et > worst) worst = et, worst_name = pn;
    }
    printf("    largest gradient difference from torch autocast: %.2e (%s) = %.1f u\n", worst,
           worst_name, worst / U);
out:
    free(e);
    fg_step_reset();
    fg_module_free(m);
    ref_close(r);
    ref_close(rb);
}
