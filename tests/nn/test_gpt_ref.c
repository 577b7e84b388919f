/* Our GPT against PyTorch (tests/ref/gen_gpt_ref.py writes gpt_ref.bin): a
 * tiny nanoGPT-layout model (vocab 65, ctx 16, 2 layers, 2 heads, embd 32)
 * with fixed weights, one batch (B 2, T 8), its logits, loss and the
 * gradient of every parameter. The reference ran in f64 from the f32
 * weights, so it is the exact answer up to its f32 storage.
 *
 * The criterion is norm-relative per tensor: max|ours - ref| <= rtol *
 * max|ref| + 1e-30, with rtol 1e-5 for our f32 run and 1e-6 for our f64 run
 * (what f32 storage of the reference allows); the loss within rtol of its
 * f64 value. The f32 run is also held to PyTorch's own f32 logits and loss.
 * Each tensor's error is printed, the largest last. */
#include <math.h>
#include <string.h>

#include "fulgur/nn.h"
#include "harness.h"
#include "ref/ref_file.h"

/* max|a - b| / max|b| over a tensor and a reference array of one size */
static double rel_err(const fg_tensor *a, const ref_array *b) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < b->numel; i++) {
        num = fmax(num, fabs(fg_tensor_get(a, i) - ref_at(b, i)));
        den = fmax(den, fabs(ref_at(b, i)));
    }
    return num / (den + 1e-30);
}

static void run(fg_dtype dtype, double rtol) {
    ref_file *r = ref_open(fg_test_path("ref/gpt_ref.bin"));
    CHECK(r != NULL);
    if (!r) return;
    const ref_array *cfg = ref_get(r, "config");
    fg_gpt_config c = {.vocab = (int64_t)ref_at(cfg, 0),
                       .ctx = (int64_t)ref_at(cfg, 1),
                       .layers = (int)ref_at(cfg, 2),
                       .heads = (int)ref_at(cfg, 3),
                       .embd = (int64_t)ref_at(cfg, 4),
                       .dtype = dtype};
    fg_module *m = fg_gpt_new(&c);
    CHECK(m != NULL);
    if (!m) {
        ref_close(r);
        return;
    }
    /* the weights, loaded by name (PyTorch's named_parameters) */
    int64_t np = fg_module_num_params(m);
    fg_state_entry *e = calloc((size_t)np, sizeof *e);
    for (int64_t i = 0; i < np; i++) {
        char name[160];
        snprintf(name, sizeof name, "param.%s", fg_module_param_name(m, i));
        const ref_array *a = ref_get(r, name);
        CHECK(a != NULL);
        if (!a) goto out;
        e[i] = (fg_state_entry){fg_module_param_name(m, i), a->dtype, a->ndim, a->shape, a->data};
    }
    CHECK_OK(fg_module_load_state(m, e, np, true));
    const ref_array *idx = ref_get(r, "idx"), *tg = ref_get(r, "targets");
    fg_tensor *x = fg_from_data(FG_I32, 2, idx->shape, idx->data);
    fg_tensor *y = fg_from_data(FG_I32, 2, tg->shape, tg->data);
    fg_tensor *logits = fg_module_forward(m, x);
    fg_tensor *loss = fg_cross_entropy(logits, y, -100);
    CHECK_OK(fg_backward(loss));
    if (!loss) goto out;
    double worst = 0;
    const char *worst_name = "logits";
    double el = rel_err(logits, ref_get(r, "logits"));
    CHECK_MSG(el <= rtol, "%s logits: max rel err %.3g > %g", fg_dtype_name(dtype), el, rtol);
    worst = el;
    double lref = ref_at(ref_get(r, "loss"), 0);
    double eloss = fabs(fg_item(loss) - lref) / fabs(lref);
    CHECK_MSG(eloss <= rtol, "%s loss %.10f vs %.10f: rel err %.3g", fg_dtype_name(dtype),
              fg_item(loss), lref, eloss);
    printf("  %s: loss %.10f (ref %.10f, rel err %.2e), logits rel err %.2e\n",
           fg_dtype_name(dtype), fg_item(loss), lref, eloss, el);
    if (dtype == FG_F32) { /* and PyTorch's own f32 run */
        double e32 = rel_err(logits, ref_get(r, "logits_f32"));
        double l32 = ref_at(ref_get(r, "loss_f32"), 0);
        CHECK_MSG(e32 <= 1e-5, "logits vs torch f32: %.3g", e32);
        CHECK_CLOSE(fg_item(loss), l32, 1e-5, 0);
        printf("  f32 vs PyTorch's f32 run: logits rel err %.2e, loss rel err %.2e\n", e32,
               fabs(fg_item(loss) - l32) / fabs(l32));
    }
    for (int64_t i = 0; i < np; i++) {
        char name[160];
        snprintf(name, sizeof name, "grad.%s", fg_module_param_name(m, i));
        const ref_array *g = ref_get(r, name);
        fg_tensor *ours = fg_tensor_grad(fg_module_param(m, i));
        CHECK(g && ours && g->numel == fg_tensor_numel(ours));
        if (!g || !ours) continue;
        double eg = rel_err(ours, g);
        CHECK_MSG(eg <= rtol, "%s grad %s: max rel err %.3g > %g", fg_dtype_name(dtype),
                  fg_module_param_name(m, i), eg, rtol);
        if (eg > worst) worst = eg, worst_name = fg_module_param_name(m, i);
    }
    printf("  %s: largest norm-relative error %.2e (%s) over logits and %lld gradients\n",
           fg_dtype_name(dtype), worst, worst_name, (long long)np);
out:
    free(e);
    fg_step_reset();
    fg_module_free(m);
    ref_close(r);
}

TEST(gpt_matches_pytorch_f32) { run(FG_F32, 1e-5); }
TEST(gpt_matches_pytorch_f64) { run(FG_F64, 1e-6); }

/* Two backward passes accumulate (gradient accumulation) into the flat buffer. */
TEST(gpt_grad_accumulates) {
    ref_file *r = ref_open(fg_test_path("ref/gpt_ref.bin"));
    if (!r) {
        CHECK(0);
        return;
    }
    fg_module *m = fg_gpt_new(&(fg_gpt_config){
        .vocab = 65, .ctx = 16, .layers = 2, .heads = 2, .embd = 32, .dtype = FG_F64, .seed = 8});
    const ref_array *idx = ref_get(r, "idx"), *tg = ref_get(r, "targets");
    double *g1 = malloc(sizeof(double) * (size_t)fg_module_numel(m));
    for (int pass = 0; pass < 2; pass++) {
        fg_tensor *x = fg_from_data(FG_I32, 2, idx->shape, idx->data);
        fg_tensor *y = fg_from_data(FG_I32, 2, tg->shape, tg->data);
        CHECK_OK(fg_backward(fg_cross_entropy(fg_module_forward(m, x), y, -100)));
        if (pass == 0)
            memcpy(g1, fg_tensor_data(fg_module_flat_grads(m)),
                   sizeof(double) * (size_t)fg_module_numel(m));
        fg_step_reset();
    }
    const double *g2 = fg_tensor_data(fg_module_flat_grads(m));
    double md = 0;
    for (int64_t i = 0; i < fg_module_numel(m); i++) md = fmax(md, fabs(g2[i] - 2 * g1[i]));
    CHECK(md < 1e-12);
    free(g1);
    fg_module_free(m);
    ref_close(r);
}
