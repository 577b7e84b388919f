/* Optimizers against PyTorch (tests/ref/gen_optim_ref.py writes
 * optim_ref.bin): SGD (plain, momentum with dampening and weight decay,
 * Nesterov) and AdamW (nanoGPT's groups by default, PyTorch's decay-all, a
 * learning-rate change) over six steps with given gradients, in f64 (to
 * 1e-12) and f32 (to 1e-5); stepping by element ranges equals one step;
 * state save/restore continues the same trajectory; schedules at their key
 * steps; clip_grad_norm_ against PyTorch; option errors; and an MLP that
 * learns a small synthetic task with SGD and with AdamW. */
#include <math.h>
#include <string.h>

#include "fulgur/optim.h"
#include "harness.h"
#include "optim/optim_impl.h"
#include "ref/ref_file.h"

#define NEL 15

static ref_file *ref;

__attribute__((destructor)) static void close_ref(void) { ref_close(ref); }

static ref_file *get_ref(void) {
    if (!ref) ref = ref_open(fg_test_path("ref/optim_ref.bin"));
    return ref;
}

static const ref_array *arr(const char *fmt, int k) {
    char name[64];
    snprintf(name, sizeof name, fmt, k);
    return ref_get(get_ref(), name);
}

/* W (4, 3) then b (3), values W0, b0 of the reference. */
static fg_module *two_params(fg_dtype dt) {
    fg_module *m = fg_module_new("Toy", NULL, NULL, NULL);
    fg_init keep = {FG_INIT_KEEP, 0, 0};
    fg_module_add_param(m, "W", dt, 2, (int64_t[]){4, 3}, &keep);
    fg_module_add_param(m, "b", dt, 1, (int64_t[]){3}, &keep);
    const ref_array *w0 = ref_get(get_ref(), "W0"), *b0 = ref_get(get_ref(), "b0");
    fg_state_entry e[2] = {{"W", FG_F64, 2, w0->shape, w0->data},
                           {"b", FG_F64, 1, b0->shape, b0->data}};
    if (fg_module_load_state(m, e, 2, true) != FG_OK) {
        fg_module_free(m);
        return NULL;
    }
    return m;
}

static void set_grad(fg_module *m, int k) {
    const ref_array *g = arr("grad.%d", k);
    fg_tensor *fgr = fg_module_flat_grads(m);
    CHECK_OK(fg_convert(fg_tensor_data(fgr), fg_tensor_dtype(fgr), g->data, FG_F64, NEL));
}

/* max |params - ref| / max |ref| */
static double err_vs(fg_module *m, const ref_array *want) {
    fg_tensor *p = fg_module_flat_params(m);
    double num = 0, den = 0;
    for (int i = 0; i < NEL; i++) {
        num = fmax(num, fabs(fg_tensor_get(p, i) - ref_at(want, i)));
        den = fmax(den, fabs(ref_at(want, i)));
    }
    return num / den;
}

static fg_optimizer *make(const char *c, fg_module *m) {
    if (!strcmp(c, "sgd_plain")) return fg_sgd_new(m, &(fg_sgd_opts){.lr = 0.1});
    if (!strcmp(c, "sgd_momentum"))
        return fg_sgd_new(
            m, &(fg_sgd_opts){.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01});
    if (!strcmp(c, "sgd_nesterov"))
        return fg_sgd_new(
            m, &(fg_sgd_opts){.lr = 0.1, .momentum = 0.9, .nesterov = true, .weight_decay = 0.05});
    if (!strcmp(c, "adamw_groups")) /* ndim < 2 undecayed: the default */
        return fg_adamw_new(m, &(fg_adamw_opts){.lr = 0.01, .beta2 = 0.95, .weight_decay = 0.1});
    if (!strcmp(c, "adamw_default")) /* PyTorch's defaults, b decayed too */
        return fg_adamw_new(m, &(fg_adamw_opts){.decay_all = true});
    if (!strcmp(c, "adamw_lr"))
        return fg_adamw_new(m, &(fg_adamw_opts){.lr = 0.02, .weight_decay = 0.5});
    if (!strcmp(c, "adam_default")) return fg_adam_new(m, NULL);
    if (!strcmp(c, "adam_l2_ams"))
        return fg_adam_new(m, &(fg_adam_opts){.lr = 0.01,
                                              .beta1 = 0.8,
                                              .beta2 = 0.9,
                                              .eps = 1e-6,
                                              .weight_decay = 0.1,
                                              .amsgrad = true});
    if (!strcmp(c, "adam_lr"))
        return fg_adam_new(m, &(fg_adam_opts){.lr = 0.02, .weight_decay = 0.05});
    if (!strcmp(c, "rmsprop_default")) return fg_rmsprop_new(m, NULL);
    if (!strcmp(c, "rmsprop_full"))
        return fg_rmsprop_new(m, &(fg_rmsprop_opts){.lr = 0.005,
                                                    .alpha = 0.9,
                                                    .eps = 1e-6,
                                                    .weight_decay = 0.1,
                                                    .momentum = 0.8,
                                                    .centered = true});
    if (!strcmp(c, "rmsprop_centered"))
        return fg_rmsprop_new(m, &(fg_rmsprop_opts){.lr = 0.003, .centered = true});
    if (!strcmp(c, "rmsprop_mom"))
        return fg_rmsprop_new(
            m, &(fg_rmsprop_opts){.lr = 0.004, .momentum = 0.5, .weight_decay = 0.01});
    if (!strcmp(c, "adagrad_default")) return fg_adagrad_new(m, NULL);
    if (!strcmp(c, "adagrad_full"))
        return fg_adagrad_new(m, &(fg_adagrad_opts){.lr = 0.1,
                                                    .lr_decay = 0.05,
                                                    .weight_decay = 0.2,
                                                    .initial_accumulator_value = 0.3,
                                                    .eps = 1e-8});
    if (!strcmp(c, "lion_default")) return fg_lion_new(m, NULL);
    if (!strcmp(c, "lion_wd"))
        return fg_lion_new(
            m, &(fg_lion_opts){.lr = 0.003, .beta1 = 0.95, .beta2 = 0.98, .weight_decay = 0.5});
    if (!strcmp(c, "groups_adam")) {
        fg_optimizer *o = fg_adam_new(m, &(fg_adam_opts){.lr = 0.01});
        CHECK(fg_optimizer_add_param_group(
                  o, &(fg_param_group){.params = "W", .lr = 0.02, .weight_decay = 0.1}) == 1);
        return o;
    }
    if (!strcmp(c, "groups_sgd")) {
        fg_optimizer *o =
            fg_sgd_new(m, &(fg_sgd_opts){.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
        CHECK(fg_optimizer_add_param_group(o, &(fg_param_group){.params = "b", .lr = 0.3}) == 1);
        return o;
    }
    CHECK_MSG(0, "no case %s", c);
    return NULL;
}

static const char *cases[] = {
    "sgd_plain",    "sgd_momentum",     "sgd_nesterov", "adamw_groups",    "adamw_default",
    "adamw_lr",     "adam_default",     "adam_l2_ams",  "adam_lr",         "rmsprop_default",
    "rmsprop_full", "rmsprop_centered", "rmsprop_mom",  "adagrad_default", "adagrad_full",
    "lion_default", "lion_wd",          "groups_adam",  "groups_sgd"};

static void trajectory(fg_dtype dt, double rtol) {
    if (!get_ref()) {
        CHECK(0);
        return;
    }
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        fg_module *m = two_params(dt);
        fg_optimizer *o = m ? make(cases[c], m) : NULL;
        CHECK(o != NULL);
        if (!o) {
            fg_module_free(m);
            continue;
        }
        double worst = 0;
        for (int k = 0; k < 6; k++) {
            if ((!strcmp(cases[c], "adamw_lr") || !strcmp(cases[c], "adam_lr")) && k == 3)
                CHECK_OK(fg_optimizer_set_lr(o, 0.005));
            set_grad(m, k);
            CHECK_OK(fg_optimizer_step(o));
            char name[64];
            snprintf(name, sizeof name, "%s.%%d", cases[c]);
            double e = err_vs(m, arr(name, k));
            CHECK_MSG(e <= rtol, "%s %s step %d: rel err %.3g > %g", fg_dtype_name(dt), cases[c], k,
                      e, rtol);
            worst = fmax(worst, e);
        }
        CHECK(fg_optimizer_step_count(o) == 6);
        printf("  %s %-16s max rel err over 6 steps %.2e\n", fg_dtype_name(dt), cases[c], worst);
        fg_optimizer_free(o);
        fg_module_free(m);
    }
}

TEST(trajectories_f64) { trajectory(FG_F64, 1e-12); }
TEST(trajectories_f32) { trajectory(FG_F32, 1e-5); }
/* bf16 parameters (bf16-true): the f32 update on widened pieces, rounded
 * once per step: PyTorch's f64 trajectory to bf16's precision */
TEST(trajectories_bf16) { trajectory(FG_BF16, 2e-2); }

TEST(no_decay_on_vectors) {
    /* zero gradients: only decay moves the parameters (AdamW's update is
     * 0/(0+eps) = 0) */
    if (!get_ref()) {
        CHECK(0);
        return;
    }
    for (int all = 0; all < 2; all++) {
        fg_module *m = two_params(FG_F64);
        fg_optimizer *o =
            fg_adamw_new(m, &(fg_adamw_opts){.lr = 0.1, .weight_decay = 0.5, .decay_all = all});
        double before[NEL];
        memcpy(before, fg_tensor_data(fg_module_flat_params(m)), sizeof before);
        CHECK_OK(fg_optimizer_step(o));
        const double *after = fg_tensor_data(fg_module_flat_params(m));
        for (int i = 0; i < 12; i++) CHECK_CLOSE(after[i], before[i] * 0.95, 1e-15, 0);
        for (int i = 12; i < NEL; i++)
            CHECK_CLOSE(after[i], all ? before[i] * 0.95 : before[i], 1e-15, 0);
        fg_optimizer_free(o);
        fg_module_free(m);
    }
    /* no_weight_decay: nothing moves */
    fg_module *m = two_params(FG_F64);
    fg_optimizer *o = fg_adamw_new(m, &(fg_adamw_opts){.no_weight_decay = true, .decay_all = true});
    double before[NEL];
    memcpy(before, fg_tensor_data(fg_module_flat_params(m)), sizeof before);
    CHECK_OK(fg_optimizer_step(o));
    CHECK(!memcmp(before, fg_tensor_data(fg_module_flat_params(m)), sizeof before));
    fg_optimizer_free(o);
    fg_module_free(m);
}

TEST(ranges_and_state) {
    if (!get_ref()) {
        CHECK(0);
        return;
    }
    /* stepping [0, 7) and [7, 15) (a cut inside W) equals a full step; the
     * second range takes its gradient from a separate buffer, as a ZeRO
     * shard would */
    fg_module *m = two_params(FG_F64);
    fg_optimizer *o = make("adamw_groups", m);
    for (int k = 0; k < 3; k++) {
        set_grad(m, k);
        double shard[8];
        memcpy(shard, (const double *)arr("grad.%d", k)->data + 7, sizeof shard);
        memset((double *)fg_tensor_data(fg_module_flat_grads(m)) + 7, 0, sizeof shard);
        CHECK_OK(fg__optimizer_step_range(o, 0, 7, NULL, NULL));
        CHECK_OK(fg__optimizer_step_range(o, 7, 15, NULL, shard));
        fg__optimizer_advance(o);
        CHECK(err_vs(m, arr("adamw_groups.%d", k)) < 1e-12);
    }
    CHECK_STATUS(fg__optimizer_step_range(o, 3, 16, NULL, NULL), FG_EINVAL);
    /* the state: names, layout, values; restored into a new optimizer it
     * continues the same trajectory */
    CHECK(fg_optimizer_num_states(o) == 2);
    CHECK(!strcmp(fg_optimizer_state_name(o, 0), "exp_avg"));
    CHECK(!strcmp(fg_optimizer_state_name(o, 1), "exp_avg_sq"));
    CHECK(fg_tensor_numel(fg_optimizer_state(o, 1)) == NEL);
    CHECK(fg_optimizer_state(o, 2) == NULL);
    fg_optimizer *o2 = make("adamw_groups", m);
    for (int s = 0; s < 2; s++)
        CHECK_OK(fg_tensor_copy(fg_optimizer_state(o2, s), fg_optimizer_state(o, s)));
    CHECK_OK(fg_optimizer_set_step_count(o2, fg_optimizer_step_count(o)));
    fg_optimizer_free(o);
    for (int k = 3; k < 6; k++) {
        set_grad(m, k);
        CHECK_OK(fg_optimizer_step(o2));
        CHECK(err_vs(m, arr("adamw_groups.%d", k)) < 1e-12);
    }
    fg_optimizer_free(o2);
    fg_module_free(m);
    /* SGD: the momentum buffer after the first step is the (decayed) gradient */
    m = two_params(FG_F64);
    o = make("sgd_momentum", m);
    CHECK(fg_optimizer_num_states(o) == 1 &&
          !strcmp(fg_optimizer_state_name(o, 0), "momentum_buffer"));
    double p0[NEL];
    memcpy(p0, fg_tensor_data(fg_module_flat_params(m)), sizeof p0);
    set_grad(m, 0);
    CHECK_OK(fg_optimizer_step(o));
    const ref_array *g0 = arr("grad.%d", 0);
    for (int i = 0; i < NEL; i++)
        CHECK_CLOSE(fg_tensor_get(fg_optimizer_state(o, 0), i), ref_at(g0, i) + 0.01 * p0[i], 1e-14,
                    1e-15);
    fg_optimizer_free(o);
    fg_module_free(m);
    CHECK(fg_optimizer_num_states(NULL) == 0);
    fg_optimizer_free(NULL);
}

/* ZeRO: two "ranks", each with the state of its shard only, stepping their
 * shard; one also updates a separate copy of its parameters (ZeRO-3's
 * shard buffer). Together they follow the reference trajectory. */
TEST(sharded_state) {
    if (!get_ref()) {
        CHECK(0);
        return;
    }
    const char *which[] = {"adamw_groups", "sgd_nesterov"};
    for (int w = 0; w < 2; w++) {
        fg_module *m = two_params(FG_F64);
        fg_optimizer *r0 = make(which[w], m), *r1 = make(which[w], m), *full = make(which[w], m);
        fg_module *mf = two_params(FG_F64);
        fg_optimizer_free(full);
        full = make(which[w], mf);
        CHECK_OK(fg__optimizer_shard_state(r0, 0, 5));
        CHECK_OK(fg__optimizer_shard_state(r1, 5, 15));
        CHECK(fg_tensor_numel(fg_optimizer_state(r1, 0)) == 10);
        double p1[10];
        memcpy(p1, (double *)fg_tensor_data(fg_module_flat_params(m)) + 5, sizeof p1);
        char name[64];
        snprintf(name, sizeof name, "%s.%%d", which[w]);
        for (int k = 0; k < 6; k++) {
            set_grad(m, k);
            set_grad(mf, k);
            CHECK_OK(fg_optimizer_step(r0)); /* its shard only */
            CHECK_OK(fg__optimizer_step_range(r1, 5, 15, p1, NULL));
            fg__optimizer_advance(r1);
            CHECK_OK(fg_optimizer_step(full));
            /* gather: rank 1's shard into the full parameters */
            memcpy((double *)fg_tensor_data(fg_module_flat_params(m)) + 5, p1, sizeof p1);
            CHECK(err_vs(m, arr(name, k)) < 1e-12);
        }
        CHECK_STATUS(fg__optimizer_step_range(r0, 4, 6, NULL, NULL), FG_EINVAL);
        for (int s = 0; s < fg_optimizer_num_states(full); s++)
            for (int i = 0; i < NEL; i++) {
                fg_tensor *shard = i < 5 ? fg_optimizer_state(r0, s) : fg_optimizer_state(r1, s);
                CHECK(fg_tensor_get(shard, i < 5 ? i : i - 5) ==
                      fg_tensor_get(fg_optimizer_state(full, s), i));
            }
        /* re-sharding keeps what overlaps */
        double keep = fg_tensor_get(fg_optimizer_state(r1, 0), 2); /* element 7 */
        CHECK_OK(fg__optimizer_shard_state(r1, 3, 9));
        CHECK(fg_tensor_get(fg_optimizer_state(r1, 0), 4) == keep);
        CHECK(fg_tensor_get(fg_optimizer_state(r1, 0), 0) == 0);
        CHECK_STATUS(fg__optimizer_shard_state(r1, 3, 16), FG_EINVAL);
        fg_optimizer_free(r0);
        fg_optimizer_free(r1);
        fg_optimizer_free(full);
        fg_module_free(m);
        fg_module_free(mf);
    }
}

TEST(option_errors) {
    fg_module *m = fg_linear_new(3, 2, true, FG_F32);
    CHECK(fg_sgd_new(m, &(fg_sgd_opts){.nesterov = true}) == NULL);
    CHECK_CONTAINS(fg_last_error(), "nesterov");
    CHECK(fg_sgd_new(m, &(fg_sgd_opts){.momentum = 0.9, .dampening = 0.1, .nesterov = true}) ==
          NULL);
    CHECK(fg_sgd_new(m, &(fg_sgd_opts){.lr = -1}) == NULL);
    CHECK_CONTAINS(fg_last_error(), "lr = -1");
    CHECK(fg_adamw_new(m, &(fg_adamw_opts){.beta1 = 1.0}) == NULL);
    CHECK_CONTAINS(fg_last_error(), "betas = (1, 0.999)");
    CHECK(fg_adamw_new(m, &(fg_adamw_opts){.eps = -1}) == NULL);
    CHECK(fg_sgd_new(NULL, NULL) == NULL);
    fg_optimizer *o = fg_adamw_new(m, NULL);
    CHECK(o && fg_optimizer_lr(o) == 1e-3 && !strcmp(fg_optimizer_name(o), "AdamW"));
    CHECK(fg_optimizer_module(o) == m);
    CHECK_STATUS(fg_optimizer_set_lr(o, -0.1), FG_EINVAL);
    CHECK_STATUS(fg_optimizer_set_lr(o, NAN), FG_EINVAL);
    CHECK_STATUS(fg_optimizer_set_step_count(o, -1), FG_EINVAL);
    CHECK_STATUS(fg_optimizer_step(NULL), FG_EINVAL);
    fg_optimizer_free(o);
    o = fg_sgd_new(m, NULL);
    CHECK(o && fg_optimizer_lr(o) == 0.01 && fg_optimizer_num_states(o) == 0);
    fg_optimizer_free(o);
    fg_module_free(m);
}

TEST(new_optimizer_options) {
    fg_module *m = fg_linear_new(3, 2, true, FG_F32);
    CHECK(fg_adam_new(m, &(fg_adam_opts){.beta2 = 1.0}) == NULL);
    CHECK_CONTAINS(fg_last_error(), "betas = (0.9, 1)");
    CHECK(fg_rmsprop_new(m, &(fg_rmsprop_opts){.alpha = 1.5}) == NULL);
    CHECK_CONTAINS(fg_last_error(), "alpha = 1.5");
    CHECK(fg_adagrad_new(m, &(fg_adagrad_opts){.initial_accumulator_value = -1}) == NULL);
    CHECK_CONTAINS(fg_last_error(), "initial_accumulator_value = -1");
    CHECK(fg_lion_new(m, &(fg_lion_opts){.weight_decay = -0.5}) == NULL);
    CHECK_CONTAINS(fg_last_error(), "weight_decay = -0.5");
    /* PyTorch's defaults, names and state names */
    struct {
        fg_optimizer *o;
        const char *name;
        double lr;
        int nstates;
        const char *last_state;
    } want[] = {
        {fg_adam_new(m, NULL), "Adam", 1e-3, 2, "exp_avg_sq"},
        {fg_adam_new(m, &(fg_adam_opts){.amsgrad = true}), "Adam", 1e-3, 3, "max_exp_avg_sq"},
        {fg_rmsprop_new(m, NULL), "RMSprop", 1e-2, 1, "square_avg"},
        {fg_rmsprop_new(m, &(fg_rmsprop_opts){.momentum = 0.9}), "RMSprop", 1e-2, 2,
         "momentum_buffer"},
        {fg_rmsprop_new(m, &(fg_rmsprop_opts){.momentum = 0.9, .centered = true}), "RMSprop", 1e-2,
         3, "grad_avg"},
        {fg_adagrad_new(m, NULL), "Adagrad", 1e-2, 1, "sum"},
        {fg_lion_new(m, NULL), "Lion", 1e-4, 1, "exp_avg"},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        fg_optimizer *o = want[i].o;
        CHECK(o && !strcmp(fg_optimizer_name(o), want[i].name) && fg_optimizer_lr(o) == want[i].lr);
        CHECK(fg_optimizer_num_states(o) == want[i].nstates);
        CHECK(!strcmp(fg_optimizer_state_name(o, want[i].nstates - 1), want[i].last_state));
        fg_optimizer_free(o);
    }
    /* Adagrad's sum starts at initial_accumulator_value, in a shard too */
    fg_optimizer *o = fg_adagrad_new(m, &(fg_adagrad_opts){.initial_accumulator_value = 0.25});
    fg_tensor *sum = fg_optimizer_state(o, 0);
    CHECK(fg_tensor_numel(sum) == 8 && fg_tensor_get(sum, 0) == 0.25 &&
          fg_tensor_get(sum, 7) == 0.25);
    ((float *)fg_tensor_data(sum))[3] = 2.0f;
    CHECK_OK(fg__optimizer_shard_state(o, 2, 6));
    sum = fg_optimizer_state(o, 0);
    CHECK(fg_tensor_numel(sum) == 4 && fg_tensor_get(sum, 1) == 2.0 &&
          fg_tensor_get(sum, 0) == 0.25);
    fg_optimizer_free(o);
    o = fg_adagrad_new(m, &(fg_adagrad_opts){.initial_accumulator_value = 0.5});
    CHECK_OK(fg__optimizer_shard_state(o, 4, 8)); /* never used: made at the shard's size */
    sum = fg_optimizer_state(o, 0);
    CHECK(fg_tensor_numel(sum) == 4 && fg_tensor_get(sum, 3) == 0.5);
    fg_optimizer_free(o);
    fg_module_free(m);
}

TEST(param_groups) {
    /* a GPT: Embeddings, LayerNorms, Linears with biases */
    fg_module *m = fg_gpt_new(
        &(fg_gpt_config){.vocab = 11, .ctx = 4, .layers = 2, .heads = 2, .embd = 8, .seed = 3});
    fg_optimizer *o = fg_adam_new(m, &(fg_adam_opts){.lr = 0.01, .weight_decay = 0.1});
    CHECK(fg_optimizer_num_groups(o) == 1 && fg_optimizer_group_weight_decay(o, 0) == 0.1);
    CHECK(fg_optimizer_add_param_group(o, &(fg_param_group){.params = "nothing.*"}) == -1);
    CHECK_CONTAINS(fg_last_error(), "\"nothing.*\" matches no parameter");
    CHECK(fg_optimizer_add_param_group(o, &(fg_param_group){.params = "*", .lr = -1}) == -1);
    CHECK_CONTAINS(fg_last_error(), "lr = -1");
    int g = fg_optimizer_add_param_group(
        o, &(fg_param_group){.params = "*.h.1.*,*h.1.*", .lr = 0.03, .weight_decay = 0.2});
    CHECK(g == 1 && fg_optimizer_num_groups(o) == 2);
    CHECK(fg_optimizer_group_lr(o, 1) == 0.03 && fg_optimizer_group_initial_lr(o, 1) == 0.03);
    int64_t np = fg_module_num_params(m), in1 = 0, excluded = 0;
    for (int64_t i = 0; i < np; i++) {
        bool one = strstr(fg_module_param_name(m, i), "h.1.") != NULL;
        CHECK(fg_optimizer_param_group_of(o, i) == (one ? 1 : 0));
        in1 += one;
    }
    CHECK(in1 > 0);
    CHECK_OK(fg_optimizer_no_decay_bias_norm_embedding(o, &excluded));
    int64_t want = 0;
    for (int64_t i = 0; i < np; i++) {
        const char *name = fg_module_param_name(m, i);
        size_t len = strlen(name);
        bool ex = (len >= 4 && !strcmp(name + len - 4, "bias")) || strstr(name, "ln") ||
                  strstr(name, "wte") || strstr(name, "wpe");
        CHECK_MSG(fg_optimizer_param_no_decay(o, i) == ex, "%s: excluded %d", name,
                  fg_optimizer_param_no_decay(o, i));
        want += ex;
    }
    CHECK(excluded == want && want > 0);
    /* set_lr sets every group; group setters check their index and value */
    CHECK_OK(fg_optimizer_set_lr(o, 0.5));
    CHECK(fg_optimizer_group_lr(o, 0) == 0.5 && fg_optimizer_group_lr(o, 1) == 0.5);
    CHECK_STATUS(fg_optimizer_set_group_lr(o, 2, 0.1), FG_EINVAL);
    CHECK_STATUS(fg_optimizer_set_group_weight_decay(o, 1, -1), FG_EINVAL);
    CHECK_OK(fg_optimizer_set_group_lr(o, 1, 0.25));
    CHECK(fg_optimizer_lr(o) == 0.5 && fg_optimizer_group_lr(o, 1) == 0.25);
    /* a step with zero gradients and zero moments moves only the decayed
     * parameters: Adam's L2 gradient wd p gives a step of about lr */
    fg_module_zero_grad(m);
    fg_tensor *flat = fg_module_flat_params(m);
    int64_t n = fg_tensor_numel(flat);
    float *before = malloc(sizeof(float) * (size_t)n);
    memcpy(before, fg_tensor_data(flat), sizeof(float) * (size_t)n);
    CHECK_OK(fg_optimizer_step(o));
    const float *after = fg_tensor_data(flat);
    for (int64_t i = 0; i < np; i++) {
        fg_tensor *p = fg_module_param(m, i);
        int64_t off = fg_module_param_offset(m, i), k = fg_tensor_numel(p);
        bool moved = false;
        for (int64_t j = 0; j < k; j++) moved |= after[off + j] != before[off + j];
        CHECK_MSG(moved != fg_optimizer_param_no_decay(o, i), "%s moved %d",
                  fg_module_param_name(m, i), moved);
    }
    free(before);
    fg_optimizer_free(o);
    fg_module_free(m);
}

TEST(schedules) {
    fg_lr_schedule s = {
        .kind = FG_LR_COSINE, .lr = 6e-4, .min_lr = 6e-5, .warmup_steps = 100, .decay_steps = 1100};
    CHECK_CLOSE(fg_lr_at(&s, 0), 6e-4 / 101, 1e-15, 0);
    CHECK_CLOSE(fg_lr_at(&s, 49), 6e-4 * 50 / 101, 1e-15, 0);
    CHECK_CLOSE(fg_lr_at(&s, 99), 6e-4 * 100 / 101, 1e-15, 0);
    CHECK_CLOSE(fg_lr_at(&s, 100), 6e-4, 1e-15, 0);              /* warm-up end: the peak */
    CHECK_CLOSE(fg_lr_at(&s, 600), (6e-4 + 6e-5) / 2, 1e-15, 0); /* half way */
    CHECK_CLOSE(fg_lr_at(&s, 350), 6e-5 + 5.4e-4 * (1 + cos(M_PI / 4)) / 2, 1e-14, 0);
    CHECK_CLOSE(fg_lr_at(&s, 1100), 6e-5, 1e-15, 0); /* end */
    CHECK_CLOSE(fg_lr_at(&s, 5000), 6e-5, 1e-15, 0); /* after */
    for (int64_t t = 100; t < 1100; t++) CHECK(fg_lr_at(&s, t + 1) <= fg_lr_at(&s, t));
    fg_lr_schedule c = {.lr = 0.1, .warmup_steps = 9};
    CHECK_CLOSE(fg_lr_at(&c, 4), 0.05, 1e-15, 0);
    CHECK(fg_lr_at(&c, 9) == 0.1 && fg_lr_at(&c, 100000) == 0.1);
    fg_lr_schedule flat = {.lr = 0.3};
    CHECK(fg_lr_at(&flat, 0) == 0.3 && fg_lr_at(&flat, 7) == 0.3);
    CHECK(fg_lr_at(NULL, 3) == 0);
}

TEST(clipping) {
    if (!get_ref()) {
        CHECK(0);
        return;
    }
    const char *tags[] = {"clip", "clip_big"};
    double maxn[] = {1.0, 100.0};
    for (int dt = 0; dt < 2; dt++)
        for (int t = 0; t < 2; t++) {
            fg_module *m = two_params(dt ? FG_F32 : FG_F64);
            double tol = dt ? 1e-6 : 1e-14;
            set_grad(m, 0);
            double norm = -1;
            CHECK_OK(fg_clip_grad_norm(m, maxn[t], &norm));
            char name[32];
            snprintf(name, sizeof name, "%s.norm", tags[t]);
            CHECK_CLOSE(norm, ref_at(ref_get(get_ref(), name), 0), tol, 0);
            snprintf(name, sizeof name, "%s.grad", tags[t]);
            const ref_array *want = ref_get(get_ref(), name);
            for (int i = 0; i < NEL; i++)
                CHECK_CLOSE(fg_tensor_get(fg_module_flat_grads(m), i), ref_at(want, i), tol, 1e-15);
            fg_module_free(m);
        }
    /* the two halves */
    fg_module *m = two_params(FG_F64);
    set_grad(m, 0);
    double ss, norm = ref_at(ref_get(get_ref(), "clip.norm"), 0);
    CHECK_OK(fg_grad_sumsq(m, &ss));
    CHECK_CLOSE(sqrt(ss), norm, 1e-14, 0);
    CHECK_CLOSE(fg_clip_coef(norm, 1.0), 1.0 / (norm + 1e-6), 1e-15, 0);
    CHECK(fg_clip_coef(0.5, 1.0) == 1 && fg_clip_coef(NAN, 1.0) == 1);
    CHECK_OK(fg_grad_scale(m, 2));
    CHECK_CLOSE(fg_tensor_get(fg_module_flat_grads(m), 4), 2 * ref_at(arr("grad.%d", 0), 4), 1e-15,
                0);
    CHECK_STATUS(fg_clip_grad_norm(m, 0, NULL), FG_EINVAL);
    CHECK_STATUS(fg_clip_grad_norm(m, NAN, NULL), FG_EINVAL);
    fg_module_free(m);
    /* a large buffer: blocks in any thread count give one answer */
    fg_module *big = fg_linear_new(1000, 300, true, FG_F32);
    fg_tensor *g = fg_module_flat_grads(big);
    float *pg = fg_tensor_data(g);
    double naive = 0;
    for (int64_t i = 0; i < fg_tensor_numel(g); i++) {
        pg[i] = (float)sin((double)i);
        naive += (double)pg[i] * pg[i];
    }
    double s1, s2;
    CHECK_OK(fg_set_num_threads(1));
    CHECK_OK(fg_grad_sumsq(big, &s1));
    CHECK_OK(fg_set_num_threads(2));
    CHECK_OK(fg_grad_sumsq(big, &s2));
    CHECK_OK(fg_set_num_threads(0));
    CHECK(s1 == s2);
    CHECK_CLOSE(s1, naive, 1e-12, 0);
    fg_module_free(big);
}

/* ---------------------------------------------------------- training smoke */

/* 4 classes: the argmax of a fixed random linear map of x in R^8. */
static void make_batch(uint64_t seed, int64_t n, float *x, int32_t *y) {
    static float wstar[4][8];
    fg_rng_fill_normal(777, 0, &wstar[0][0], 32, 0, 1);
    fg_rng_fill_normal(seed, 0, x, n * 8, 0, 1);
    for (int64_t i = 0; i < n; i++) {
        int best = 0;
        double bv = -1e30;
        for (int c = 0; c < 4; c++) {
            double v = 0;
            for (int k = 0; k < 8; k++) v += wstar[c][k] * x[i * 8 + k];
            if (v > bv) bv = v, best = c;
        }
        y[i] = best;
    }
}

static void train(const char *which, double *first, double *last, double *acc) {
    fg_module *m = fg_mlp_new(&(fg_mlp_config){.sizes = {8, 64, 4}, .seed = 1});
    fg_optimizer *o = !strcmp(which, "sgd")
                          ? fg_sgd_new(m, &(fg_sgd_opts){.lr = 0.1, .momentum = 0.9})
                          : fg_adamw_new(m, &(fg_adamw_opts){.lr = 1e-2});
    float x[64 * 8];
    int32_t y[64];
    for (int step = 0; step < 300; step++) {
        make_batch(1000 + (uint64_t)step, 64, x, y);
        fg_tensor *tx = fg_from_data(FG_F32, 2, (int64_t[]){64, 8}, x);
        fg_tensor *ty = fg_from_data(FG_I32, 1, (int64_t[]){64}, y);
        fg_tensor *loss = fg_cross_entropy(fg_module_forward(m, tx), ty, -100);
        CHECK_OK(fg_backward(loss));
        if (step == 0) *first = fg_item(loss);
        CHECK_OK(fg_clip_grad_norm(m, 5.0, NULL));
        CHECK_OK(fg_optimizer_step(o));
        fg_optimizer_zero_grad(o);
        fg_step_reset();
    }
    /* held-out batch, evaluation mode, no grad */
    static float hx[512 * 8];
    static int32_t hy[512];
    make_batch(5, 512, hx, hy);
    bool prev = fg_set_grad_enabled(false);
    fg_tensor *logits = fg_module_forward(m, fg_from_data(FG_F32, 2, (int64_t[]){512, 8}, hx));
    fg_tensor *loss = fg_cross_entropy(logits, fg_from_data(FG_I32, 1, (int64_t[]){512}, hy), -100);
    fg_set_grad_enabled(prev);
    *last = fg_item(loss);
    int right = 0;
    for (int i = 0; i < 512; i++) {
        int best = 0;
        for (int c = 1; c < 4; c++)
            if (fg_tensor_get(logits, i * 4 + c) > fg_tensor_get(logits, i * 4 + best)) best = c;
        right += best == hy[i];
    }
    *acc = right / 512.0;
    fg_step_reset();
    fg_optimizer_free(o);
    fg_module_free(m);
}

TEST(mlp_learns) {
    const char *opt[] = {"sgd", "adamw"};
    for (int i = 0; i < 2; i++) {
        double first, last, acc;
        train(opt[i], &first, &last, &acc);
        printf("  %s: loss %.4f -> held-out %.4f, accuracy %.3f\n", opt[i], first, last, acc);
        CHECK(first > 1.2);
        CHECK_MSG(last < 0.25, "%s: held-out loss %.4f", opt[i], last);
        CHECK_MSG(acc > 0.9, "%s: accuracy %.3f", opt[i], acc);
    }
}
