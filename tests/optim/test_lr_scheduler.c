/* The learning-rate schedulers against PyTorch (tests/ref/gen_sched_ref.py
 * writes sched_ref.bin): every kind, SequentialLR and ChainedScheduler on
 * an SGD optimizer with two parameter groups, 25 steps, each group's lr
 * (and OneCycleLR's momentum) to 1e-12 relative after construction and
 * after every step; resuming from the saved state at every step continues
 * bitwise the straight run; the option and state errors. */
#include <math.h>
#include <string.h>

#include "fulgur/optim.h"
#include "harness.h"
#include "optim/optim_impl.h"
#include "ref/ref_file.h"

#define STEPS 25

static ref_file *ref;

__attribute__((destructor)) static void close_ref(void) { ref_close(ref); }

static ref_file *get_ref(void) {
    if (!ref) ref = ref_open(fg_test_path("ref/sched_ref.bin"));
    return ref;
}

static const ref_array *arr(const char *c, const char *what) {
    char name[64];
    snprintf(name, sizeof name, "%s.%s", c, what);
    return ref_get(get_ref(), name);
}

/* a (3) and b (2); SGD(lr 0.1, momentum 0.9), b in a group at lr 0.04 */
static fg_optimizer *make_opt(fg_module **mp) {
    fg_module *m = fg_module_new("Toy", NULL, NULL, NULL);
    fg_init zero = {FG_INIT_ZEROS, 0, 0};
    fg_module_add_param(m, "a", FG_F64, 1, (int64_t[]){3}, &zero);
    fg_module_add_param(m, "b", FG_F64, 1, (int64_t[]){2}, &zero);
    fg_optimizer *o = fg_sgd_new(m, &(fg_sgd_opts){.lr = 0.1, .momentum = 0.9});
    CHECK(fg_optimizer_add_param_group(o, &(fg_param_group){.params = "b", .lr = 0.04}) == 1);
    *mp = m;
    return o;
}

static fg_lr_scheduler *make(const char *c, fg_optimizer *o) {
    if (!strcmp(c, "step")) return fg_step_lr_new(o, 3, 0.5);
    if (!strcmp(c, "multistep")) return fg_multistep_lr_new(o, (int64_t[]){2, 5, 5, 9}, 4, 0.3);
    if (!strcmp(c, "exp")) return fg_exponential_lr_new(o, 0.9);
    if (!strcmp(c, "cosine")) return fg_cosine_annealing_lr_new(o, 7, 0.001);
    if (!strcmp(c, "warm")) return fg_cosine_warm_restarts_new(o, 3, 2, 0.01);
    if (!strcmp(c, "warm1")) return fg_cosine_warm_restarts_new(o, 4, 0, 0);
    if (!strcmp(c, "onecycle"))
        return fg_one_cycle_lr_new(o, &(fg_one_cycle_opts){.max_lr = 0.5, .total_steps = 25});
    if (!strcmp(c, "onecycle3"))
        return fg_one_cycle_lr_new(o, &(fg_one_cycle_opts){.max_lr = 0.3,
                                                           .total_steps = 30,
                                                           .pct_start = 0.25,
                                                           .anneal_linear = true,
                                                           .no_cycle_momentum = true,
                                                           .div_factor = 10,
                                                           .final_div_factor = 100,
                                                           .three_phase = true});
    if (!strcmp(c, "linear"))
        return fg_linear_lr_new(o, &(fg_linear_lr_opts){.start_factor = 0.25, .total_iters = 6});
    if (!strcmp(c, "plateau"))
        return fg_reduce_lr_on_plateau_new(
            o, &(fg_plateau_opts){.factor = 0.5, .patience = 2, .threshold = 0.1, .cooldown = 1});
    if (!strcmp(c, "plateau_max"))
        return fg_reduce_lr_on_plateau_new(o, &(fg_plateau_opts){.mode_max = true,
                                                                 .threshold_abs = true,
                                                                 .threshold = 0.05,
                                                                 .patience = 1,
                                                                 .min_lr = 0.02});
    if (!strcmp(c, "seq")) {
        fg_lr_scheduler *p[2] = {
            fg_linear_lr_new(o, &(fg_linear_lr_opts){.start_factor = 0.1, .total_iters = 4}),
            fg_cosine_annealing_lr_new(o, 10, 0.001)};
        return fg_sequential_lr_new(o, p, 2, (int64_t[]){4});
    }
    if (!strcmp(c, "seq3")) {
        fg_lr_scheduler *p[3] = {fg_exponential_lr_new(o, 0.8), fg_step_lr_new(o, 2, 0.5),
                                 fg_cosine_warm_restarts_new(o, 3, 1, 0)};
        return fg_sequential_lr_new(o, p, 3, (int64_t[]){3, 8});
    }
    if (!strcmp(c, "chained")) {
        fg_lr_scheduler *p[2] = {
            fg_linear_lr_new(o, &(fg_linear_lr_opts){.start_factor = 0.5, .total_iters = 3}),
            fg_exponential_lr_new(o, 0.95)};
        return fg_chained_scheduler_new(p, 2);
    }
    if (!strcmp(c, "chained2")) {
        fg_lr_scheduler *p[2] = {fg_step_lr_new(o, 4, 0.5),
                                 fg_multistep_lr_new(o, (int64_t[]){3, 6}, 2, 0.7)};
        return fg_chained_scheduler_new(p, 2);
    }
    CHECK_MSG(0, "no case %s", c);
    return NULL;
}

static const char *cases[] = {"step",        "multistep", "exp",       "cosine",  "warm",
                              "warm1",       "onecycle",  "onecycle3", "linear",  "plateau",
                              "plateau_max", "seq",       "seq3",      "chained", "chained2"};
#define NCASES ((int)(sizeof cases / sizeof *cases))

static fg_status step(const char *c, fg_lr_scheduler *s, int k) {
    if (!strncmp(c, "plateau", 7))
        return fg_lr_scheduler_step_value(s, ref_at(arr(c, "metric"), k));
    return fg_lr_scheduler_step(s);
}

static double rel(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-300); }

TEST(against_pytorch) {
    if (!get_ref()) {
        CHECK(0);
        return;
    }
    for (int c = 0; c < NCASES; c++) {
        fg_module *m;
        fg_optimizer *o = make_opt(&m);
        fg_lr_scheduler *s = make(cases[c], o);
        CHECK_MSG(s != NULL, "%s: %s", cases[c], fg_last_error());
        if (!s) {
            fg_optimizer_free(o);
            fg_module_free(m);
            continue;
        }
        const ref_array *lr = arr(cases[c], "lr");
        const ref_array *mom = !strncmp(cases[c], "onecycle", 8) ? arr(cases[c], "mom") : NULL;
        double worst = 0;
        for (int k = 0; k <= STEPS; k++) {
            if (k > 0) CHECK_OK(step(cases[c], s, k - 1));
            for (int g = 0; g < 2; g++) {
                double e = rel(fg_optimizer_group_lr(o, g), ref_at(lr, 2 * k + g));
                CHECK_MSG(e <= 1e-12, "%s step %d group %d: lr %.17g, PyTorch's %.17g", cases[c], k,
                          g, fg_optimizer_group_lr(o, g), ref_at(lr, 2 * k + g));
                CHECK(fg_lr_scheduler_last_lr(s, g) == fg_optimizer_group_lr(o, g));
                worst = fmax(worst, e);
            }
            if (mom) {
                double mo = 0;
                CHECK(fg__optimizer_momentum(o, &mo));
                CHECK_MSG(rel(mo, ref_at(mom, k)) <= 1e-12, "%s step %d: momentum %.17g, %.17g",
                          cases[c], k, mo, ref_at(mom, k));
            }
        }
        printf("  %-12s %-28s max rel err over %d steps %.2e\n", cases[c], fg_lr_scheduler_name(s),
               STEPS, worst);
        fg_lr_scheduler_free(s);
        fg_optimizer_free(o);
        fg_module_free(m);
    }
}

TEST(resume_bitwise) {
    if (!get_ref()) {
        CHECK(0);
        return;
    }
    /* the straight run's lrs, then for every cut k: save after k steps,
     * make everything anew, restore the group lrs and the state, continue */
    for (int c = 0; c < NCASES; c++) {
        double straight[STEPS + 1][2];
        double mom_straight[STEPS + 1];
        fg_module *m;
        fg_optimizer *o = make_opt(&m);
        fg_lr_scheduler *s = make(cases[c], o);
        for (int k = 0; k <= STEPS; k++) {
            if (k > 0) CHECK_OK(step(cases[c], s, k - 1));
            for (int g = 0; g < 2; g++) straight[k][g] = fg_optimizer_group_lr(o, g);
            mom_straight[k] = o->o.sgd.momentum;
        }
        fg_lr_scheduler_free(s);
        fg_optimizer_free(o);
        fg_module_free(m);
        for (int cut = 1; cut < STEPS; cut += 3) {
            o = make_opt(&m);
            s = make(cases[c], o);
            for (int k = 0; k < cut; k++) CHECK_OK(step(cases[c], s, k));
            char *state = fg_lr_scheduler_state_save(s);
            double lrs[2] = {fg_optimizer_group_lr(o, 0), fg_optimizer_group_lr(o, 1)};
            fg_lr_scheduler_free(s);
            fg_optimizer_free(o);
            fg_module_free(m);
            o = make_opt(&m);
            s = make(cases[c], o);
            for (int g = 0; g < 2; g++) CHECK_OK(fg_optimizer_set_group_lr(o, g, lrs[g]));
            CHECK_OK(fg_lr_scheduler_state_load(s, state));
            fg_free(state);
            bool same = true;
            for (int k = cut; k < STEPS; k++) {
                CHECK_OK(step(cases[c], s, k));
                for (int g = 0; g < 2; g++)
                    same &= !memcmp(&straight[k + 1][g], &o->group[g].lr, sizeof(double));
                same &= !memcmp(&mom_straight[k + 1], &o->o.sgd.momentum, sizeof(double));
            }
            CHECK_MSG(same, "%s resumed after %d steps: not the straight run's bits", cases[c],
                      cut);
            fg_lr_scheduler_free(s);
            fg_optimizer_free(o);
            fg_module_free(m);
        }
    }
}

TEST(errors) {
    fg_module *m;
    fg_optimizer *o = make_opt(&m);
    CHECK(fg_step_lr_new(o, 0, 0.5) == NULL);
    CHECK_CONTAINS(fg_last_error(), "step_size = 0");
    CHECK(fg_exponential_lr_new(o, 0) == NULL);
    CHECK(fg_cosine_annealing_lr_new(o, 0, 0) == NULL);
    CHECK(fg_cosine_warm_restarts_new(o, 3, -1, 0) == NULL);
    CHECK(fg_linear_lr_new(o, &(fg_linear_lr_opts){.start_factor = 2}) == NULL);
    CHECK(fg_one_cycle_lr_new(o, &(fg_one_cycle_opts){.max_lr = 1}) == NULL);
    CHECK_CONTAINS(fg_last_error(), "total_steps = 0");
    CHECK(fg_reduce_lr_on_plateau_new(o, &(fg_plateau_opts){.factor = 1}) == NULL);
    CHECK(fg_step_lr_new(NULL, 3, 0) == NULL);
    /* a plateau steps on a value only; the others not on a value */
    fg_lr_scheduler *p = fg_reduce_lr_on_plateau_new(o, NULL);
    CHECK(fg_lr_scheduler_needs_value(p));
    CHECK_STATUS(fg_lr_scheduler_step(p), FG_EINVAL);
    CHECK_STATUS(fg_lr_scheduler_step_value(p, NAN), FG_EINVAL);
    fg_lr_scheduler *st = fg_step_lr_new(o, 3, 0);
    CHECK_STATUS(fg_lr_scheduler_step_value(st, 1.0), FG_EINVAL);
    /* a state of another kind does not load, and changes nothing */
    char *state = fg_lr_scheduler_state_save(p);
    CHECK_STATUS(fg_lr_scheduler_state_load(st, state), FG_EMISMATCH);
    CHECK_CONTAINS(fg_last_error(), "ReduceLROnPlateau where this scheduler has a StepLR");
    CHECK(fg_lr_scheduler_last_epoch(st) == 0);
    fg_free(state);
    /* a plateau cannot be part of a sequence (the parts are freed) */
    fg_lr_scheduler *parts[2] = {st, p};
    CHECK(fg_chained_scheduler_new(parts, 2) == NULL);
    CHECK_CONTAINS(fg_last_error(), "ReduceLROnPlateau");
    /* OneCycleLR: past total_steps; an optimizer without momentum */
    fg_lr_scheduler *oc =
        fg_one_cycle_lr_new(o, &(fg_one_cycle_opts){.max_lr = 1, .total_steps = 2});
    CHECK_OK(fg_lr_scheduler_step(oc));
    CHECK_OK(fg_lr_scheduler_step(oc));
    CHECK_STATUS(fg_lr_scheduler_step(oc), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "tried to step 3 times");
    fg_lr_scheduler_free(oc);
    fg_optimizer *ag = fg_adagrad_new(m, NULL);
    CHECK(fg_one_cycle_lr_new(ag, &(fg_one_cycle_opts){.max_lr = 1, .total_steps = 5}) == NULL);
    CHECK_CONTAINS(fg_last_error(), "Adagrad has none");
    fg_optimizer_free(ag);
    fg_optimizer_free(o);
    fg_module_free(m);
}
