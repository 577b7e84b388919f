/* The LSTM language model (fg_lstm_lm_new: embedding 16, a 2-layer LSTM of
 * 32, fc) on the fortunes text, from PyTorch's weights, trained by plain
 * SGD (lr 2, batches of 8 windows of 32 characters) in f64: the training
 * loss before each of the 100 steps and the validation loss (40 fixed
 * windows) every 25 steps equal PyTorch 1.13's to 1e-10, and the
 * validation loss falls from ln(78) = 4.36 to below 3.0 within the 100
 * steps. tests/ref/gen_lstm_fortunes_ref.py wrote the text's ids, the
 * weights and PyTorch's losses into tests/ref/lstm_fortunes_ref.bin. The
 * same run in f32 stays within 1e-4 of them. */
#include <math.h>
#include <string.h>

#include "fulgur/nn.h"
#include "harness.h"
#include "ref/ref_file.h"

typedef struct run {
    int64_t V, E, H, L, steps, B, T, ntrain, every, nval;
    double lr;
    const int32_t *text;
} run;

/* windows starting at starts[0 .. n) as (n, T) inputs and targets */
static void windows(const run *r, const int64_t *starts, int64_t n, fg_tensor **x, fg_tensor **t) {
    int64_t shape[2] = {n, r->T};
    *x = fg_empty(FG_I32, 2, shape);
    *t = fg_empty(FG_I32, 2, shape);
    int32_t *px = fg_tensor_data(*x), *pt = fg_tensor_data(*t);
    for (int64_t b = 0; b < n; b++) {
        memcpy(px + b * r->T, r->text + starts[b], sizeof(int32_t) * (size_t)r->T);
        memcpy(pt + b * r->T, r->text + starts[b] + 1, sizeof(int32_t) * (size_t)r->T);
    }
}

static double val_loss(fg_module *m, const run *r) {
    int64_t starts[64];
    for (int64_t w = 0; w < r->nval; w++) starts[w] = r->ntrain + w * r->T;
    fg_tensor *x, *t;
    windows(r, starts, r->nval, &x, &t);
    bool prev = fg_set_grad_enabled(false);
    fg_tensor *loss = fg_cross_entropy(fg_module_forward(m, x), t, -100);
    fg_set_grad_enabled(prev);
    double v = loss ? fg_item(loss) : NAN;
    fg_step_reset();
    return v;
}

static void train(const ref_file *rf, const run *r, fg_dtype dt, double *worst_train,
                  double *worst_val, double *last_val) {
    fg_module *m = fg_lstm_lm_new(&(fg_lstm_lm_config){
        .vocab = r->V, .embd = r->E, .hidden = r->H, .layers = r->L, .dtype = dt});
    CHECK(m != NULL);
    if (!m) return;
    fg_state_entry e[32];
    int n = 0;
    for (int i = 0; i < rf->n && n < 32; i++)
        if (!strncmp(rf->a[i].name, "p.", 2))
            e[n++] = (fg_state_entry){rf->a[i].name + 2, rf->a[i].dtype, rf->a[i].ndim,
                                      rf->a[i].shape, rf->a[i].data};
    CHECK_OK(fg_module_load_state(m, e, n, true));
    const ref_array *rl = ref_get(rf, "loss"), *rv = ref_get(rf, "val");
    int vi = 0;
    for (int64_t s = 0; s < r->steps && rl && rv; s++) {
        if (s % r->every == 0) {
            double v = val_loss(m, r);
            *worst_val = fmax(*worst_val, fabs(v - ref_at(rv, vi++)));
        }
        int64_t starts[64];
        for (int64_t b = 0; b < r->B; b++)
            starts[b] = (s * 7919 + b * 1543) % (r->ntrain - r->T - 1);
        fg_tensor *x, *t;
        windows(r, starts, r->B, &x, &t);
        fg_module_zero_grad(m);
        fg_tensor *loss = fg_cross_entropy(fg_module_forward(m, x), t, -100);
        CHECK_MSG(loss != NULL, "step %lld: %s", (long long)s, fg_last_error());
        if (!loss) break;
        CHECK_OK(fg_backward(loss));
        *worst_train = fmax(*worst_train, fabs(fg_item(loss) - ref_at(rl, s)));
        /* SGD, as torch.optim.SGD(lr): p -= lr g, in the model's dtype */
        void *p = fg_tensor_data(fg_module_flat_params(m));
        const void *g = fg_tensor_data(fg_module_flat_grads(m));
        for (int64_t i = 0; i < fg_module_numel(m); i++) {
            if (dt == FG_F64) ((double *)p)[i] -= r->lr * ((const double *)g)[i];
            else ((float *)p)[i] -= (float)(r->lr * ((const float *)g)[i]);
        }
        fg_step_reset();
    }
    *last_val = val_loss(m, r);
    if (rv) *worst_val = fmax(*worst_val, fabs(*last_val - ref_at(rv, vi)));
    fg_module_free(m);
}

TEST(lstm_lm_on_fortunes_matches_pytorch_step_for_step) {
    ref_file *rf = ref_open(fg_test_path("ref/lstm_fortunes_ref.bin"));
    CHECK(rf != NULL);
    if (!rf) return;
    const ref_array *cfg = ref_get(rf, "setup"), *text = ref_get(rf, "text");
    CHECK(cfg && text);
    if (!cfg || !text) return;
    run r = {.V = (int64_t)ref_at(cfg, 0),
             .E = (int64_t)ref_at(cfg, 1),
             .H = (int64_t)ref_at(cfg, 2),
             .L = (int64_t)ref_at(cfg, 3),
             .lr = ref_at(cfg, 4),
             .steps = (int64_t)ref_at(cfg, 5),
             .B = (int64_t)ref_at(cfg, 6),
             .T = (int64_t)ref_at(cfg, 7),
             .ntrain = (int64_t)ref_at(cfg, 8),
             .every = (int64_t)ref_at(cfg, 9),
             .nval = (int64_t)ref_at(cfg, 10),
             .text = text->data};
    CHECK(r.B <= 64 && r.nval <= 64);
    double wt = 0, wv = 0, last = NAN;
    train(rf, &r, FG_F64, &wt, &wv, &last);
    printf("  f64: %lld steps, validation loss %.4f at the end (PyTorch %.4f); largest gap to "
           "PyTorch: training %.3g, validation %.3g\n",
           (long long)r.steps, last, ref_at(ref_get(rf, "val"), r.steps / r.every), wt, wv);
    CHECK(wt < 1e-10 && wv < 1e-10);
    CHECK(last < 3.0);
    double wt32 = 0, wv32 = 0, last32 = NAN;
    train(rf, &r, FG_F32, &wt32, &wv32, &last32);
    printf("  f32: validation loss %.4f at the end; largest gap %.3g (training), %.3g "
           "(validation)\n",
           last32, wt32, wv32);
    CHECK(wt32 < 1e-4 && wv32 < 1e-4);
    ref_close(rf);
}
