/* Several models in one fabric (fg_fabric_setup_many), as Lightning's
 * teacher-student and EMA patterns: a student trained by its optimizer on
 * its loss plus the distance to a frozen teacher's logits, and an EMA copy
 * of the student updated by hand after each step. Under ddp on 2 ranks
 * (the fabric's own ranks, as a launcher starts them) it equals one process
 * on the global batch (within rounding), every rank holds the same bits,
 * the teacher stays bitwise as initialised and the EMA follows the student.
 * The frozen models (requires_grad off before setup) take no part in ddp's
 * gradient check, as PyTorch's DDP registers only the parameters that
 * require grad when it is made. Refusals name what is wrong. */
#include <math.h>
#include <string.h>
#include <sys/mman.h>

#include "harness.h"

#include <fulgur/fulgur.h>

#define ROWS 8 /* the global batch; each of N ranks takes ROWS / N */
#define STEPS 6
#define IN 6
#define CLASSES 3
#define MAXP 4096

typedef struct result {
    int64_t n, lo[3], hi[3]; /* the three models' ranges of the root's flat buffer */
    float init[MAXP];        /* rank 0's parameters after setup */
    float end[2][MAXP];      /* each rank's at the end */
    int failed;
} result;

static void clean_env(void) {
    fg_launch_unexport();
    static const char *const more[] = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                       "SLURM_PROCID",         "SLURM_NTASKS",
                                       "TORCHELASTIC_RUN_ID",  NULL};
    for (int i = 0; more[i]; i++) unsetenv(more[i]);
    setenv("FULGUR_CPU_DEVICES", "4", 1);
    setenv("FULGUR_NUM_THREADS", "1", 1); /* forks must not meet a thread pool */
}

/* Linear(6, 16), ReLU, Linear(16, 3), not finalized: a child of a tree */
static fg_module *mlp(void) {
    fg_module *s = fg_sequential_new();
    fg_status st = fg_sequential_append(s, fg_linear_new(IN, 16, true, FG_F32));
    if (!st) st = fg_sequential_append(s, fg_relu_new());
    if (!st) st = fg_sequential_append(s, fg_linear_new(16, CLASSES, true, FG_F32));
    if (st) {
        fg_module_free(s);
        return NULL;
    }
    return s;
}

static void freeze(fg_module *m) {
    for (int64_t i = 0; i < fg_module_num_params(m); i++)
        fg_tensor_set_requires_grad(fg_module_param(m, i), false);
}

/* The element range of sub-module m in the root's flat buffer. */
static void range_of(fg_module *root, fg_module *m, int64_t *lo, int64_t *hi) {
    const float *r = fg_tensor_data(fg_module_flat_params(root));
    *lo = (const float *)fg_tensor_data(fg_module_flat_params(m)) - r;
    *hi = *lo + fg_module_numel(m);
}

static int distill_run(fg_fabric *f, void *arg) {
    result *res = arg;
    int r = fg_fabric_global_rank(f), world = fg_fabric_world_size(f);
    fg_module *root = fg_module_new("Distill", NULL, NULL, NULL);
    if (!root || fg_module_add_child(root, "student", mlp()) != FG_OK ||
        fg_module_add_child(root, "teacher", mlp()) != FG_OK ||
        fg_module_add_child(root, "ema", mlp()) != FG_OK || fg_module_finalize(root) != FG_OK)
        return 1;
    fg_module *student = fg_module_child(root, "student"),
              *teacher = fg_module_child(root, "teacher"), *ema = fg_module_child(root, "ema");
    /* the EMA starts as a copy of the student (copy.deepcopy) */
    memcpy(fg_tensor_data(fg_module_flat_params(ema)),
           fg_tensor_data(fg_module_flat_params(student)),
           sizeof(float) * (size_t)fg_module_numel(student));
    freeze(teacher);
    freeze(ema);
    fg_optimizer *opt = fg_sgd_new(student, &(fg_sgd_opts){.lr = 0.1, .momentum = 0.9});
    fg_module *models[3] = {student, teacher, ema};
    if (!opt || fg_fabric_setup_many(f, models, 3, &opt, 1) != FG_OK) {
        fprintf(stderr, "rank %d: %s\n", r, fg_last_error());
        return 2;
    }
    fg_tensor *flat = fg_module_flat_params(root);
    int64_t n = fg_tensor_numel(flat);
    if (n > MAXP) return 3;
    for (int k = 0; k < 3; k++) range_of(root, models[k], &res->lo[k], &res->hi[k]);
    res->n = n;
    if (r == 0) memcpy(res->init, fg_tensor_data(flat), sizeof(float) * (size_t)n);
    int64_t rows = ROWS / world, sx[2] = {rows, IN}, sy[1] = {rows};
    float *p = fg_tensor_data(flat);
    for (int step = 0; step < STEPS; step++) {
        fg_tensor *x = fg_empty(FG_F32, 2, sx), *y = fg_empty(FG_I32, 1, sy);
        fg_rng_fill_normal(21, (uint64_t)(step * ROWS + r * rows) * IN, fg_tensor_data(x),
                           rows * IN, 0, 1);
        for (int64_t i = 0; i < rows; i++)
            ((int32_t *)fg_tensor_data(y))[i] =
                (int32_t)(fg_rng_u32_at(22, (uint64_t)(step * ROWS + r * rows + i)) % CLASSES);
        bool prev = fg_set_grad_enabled(false);
        fg_tensor *soft = fg_module_forward(teacher, x);
        fg_set_grad_enabled(prev);
        fg_tensor *logits = fg_module_forward(student, x);
        fg_tensor *loss =
            fg_add(fg_cross_entropy(logits, y, -100), fg_mse_loss(logits, soft, FG_REDUCTION_MEAN));
        fg_optimizer_zero_grad(opt);
        if (!loss || fg_fabric_backward(f, loss) != FG_OK) {
            fprintf(stderr, "rank %d step %d: %s\n", r, step, fg_last_error());
            return 4;
        }
        if (fg_fabric_optimizer_step(f, opt) != FG_OK) return 5;
        /* ema = 0.75 ema + 0.25 student, element by element */
        for (int64_t i = 0; i < res->hi[0] - res->lo[0]; i++)
            p[res->lo[2] + i] = 0.75f * p[res->lo[2] + i] + 0.25f * p[res->lo[0] + i];
        fg_fabric_step_end(f);
    }
    memcpy(res->end[r], p, sizeof(float) * (size_t)n);
    fg_optimizer_free(opt);
    fg_module_free(root);
    return 0;
}

static void fake_launcher(int rank, int world) {
    clean_env();
    char v[32];
    snprintf(v, sizeof v, "%d", rank);
    setenv("FULGUR_RANK", v, 1);
    setenv("FULGUR_LOCAL_RANK", v, 1);
    snprintf(v, sizeof v, "%d", world);
    setenv("FULGUR_WORLD_SIZE", v, 1);
    setenv("FULGUR_LOCAL_WORLD_SIZE", v, 1);
    snprintf(v, sizeof v, "fg-test-many-%d", (int)getppid());
    setenv("FULGUR_JOB_ID", v, 1);
}

static int launched_rank(int rank, int n, void *arg) {
    fake_launcher(rank, n);
    fg_fabric *f = fg_fabric_new(&(fg_fabric_config){.strategy = "ddp"});
    if (!f) {
        fprintf(stderr, "rank %d: %s\n", rank, fg_last_error());
        return 1;
    }
    int rc = fg_fabric_launch(f, distill_run, arg);
    if (rc) fprintf(stderr, "rank %d: launch -> %d: %s\n", rank, rc, fg_last_error());
    fg_fabric_free(f);
    return rc;
}

TEST(teacher_and_ema_under_ddp_equal_one_process) {
    result *two =
        mmap(NULL, sizeof *two, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    result *one =
        mmap(NULL, sizeof *one, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(two != MAP_FAILED && one != MAP_FAILED);
    if (two == MAP_FAILED || one == MAP_FAILED) return;
    CHECK(fg_test_fork_ranks(2, launched_rank, two, 300) == 0);
    clean_env();
    fg_fabric *f = fg_fabric_new(NULL); /* one process, the whole batch */
    CHECK(f && fg_fabric_launch(f, distill_run, one) == 0);
    fg_fabric_free(f);
    int64_t n = two->n;
    CHECK(n > 0 && n == one->n);
    if (n <= 0 || n != one->n) return;
    CHECK(memcmp(two->init, one->init, sizeof(float) * (size_t)n) == 0);
    /* every rank holds the same bits */
    CHECK(memcmp(two->end[0], two->end[1], sizeof(float) * (size_t)n) == 0);
    const int64_t *lo = two->lo, *hi = two->hi;
    /* the teacher never moved */
    CHECK(memcmp(two->end[0] + lo[1], two->init + lo[1], sizeof(float) * (size_t)(hi[1] - lo[1])) ==
          0);
    CHECK(memcmp(one->end[0] + lo[1], one->init + lo[1], sizeof(float) * (size_t)(hi[1] - lo[1])) ==
          0);
    /* the student and its EMA as one process's, within rounding; both moved,
     * and the EMA lags the student */
    int differ = 0, moved = 0, lag = 0;
    for (int k = 0; k < 3; k += 2)
        for (int64_t i = lo[k]; i < hi[k]; i++) {
            float a = two->end[0][i], b = one->end[0][i];
            differ += !(fabsf(a - b) <= 1e-6f + 1e-5f * fabsf(b));
            moved += a != two->init[i];
        }
    for (int64_t i = 0; i < hi[0] - lo[0]; i++)
        lag += two->end[0][lo[2] + i] != two->end[0][lo[0] + i];
    CHECK_MSG(differ == 0, "%d weights of the student or the EMA differ from one process", differ);
    CHECK_MSG(moved > (hi[0] - lo[0]) * 2 * 9 / 10,
              "only %d of the student's and EMA's weights moved", moved);
    CHECK_MSG(lag > (hi[0] - lo[0]) * 9 / 10, "the EMA equals the student at %lld weights",
              (long long)(hi[0] - lo[0] - lag));
    munmap(two, sizeof *two);
    munmap(one, sizeof *one);
}

/* The refusals of fg_fabric_setup_many, each naming the index or setting. */
static int refusals_run(fg_fabric *f, void *arg) {
    (void)arg;
    fg_module *a = mlp(), *b = mlp();
    fg_module *root = fg_module_new("Pair", NULL, NULL, NULL);
    CHECK(root && fg_module_add_child(root, "g", mlp()) == FG_OK &&
          fg_module_add_child(root, "d", mlp()) == FG_OK);
    fg_module *g = fg_module_child(root, "g"), *d = fg_module_child(root, "d");
    fg_module *two_trees[2] = {a, b};
    CHECK_STATUS(fg_fabric_setup_many(f, two_trees, 2, NULL, 0), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "models[1] is not in the tree of models[0]");
    fg_module *gd[2] = {g, d};
    fg_optimizer *og = fg_sgd_new(g, &(fg_sgd_opts){.lr = 0.1}), *og2 = fg_sgd_new(g, NULL);
    fg_optimizer *shared[2] = {og, og2};
    CHECK_STATUS(fg_fabric_setup_many(f, gd, 2, shared, 2), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "opts[0] and opts[1] share parameters");
    fg_optimizer *oa = fg_sgd_new(a, NULL);
    CHECK_STATUS(fg_fabric_setup_many(f, gd, 2, &oa, 1), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "opts[0] (SGD) is over a module that is none of the models");
    CHECK_STATUS(fg_fabric_setup_many(f, gd, 0, NULL, 0), FG_EINVAL);
    fg_optimizer_free(og);
    fg_optimizer_free(og2);
    fg_optimizer_free(oa);
    fg_module_free(root);
    fg_module_free(a);
    fg_module_free(b);
    return 0;
}

TEST(setup_many_refusals) {
    clean_env();
    fg_fabric *f = fg_fabric_new(NULL);
    CHECK(f && fg_fabric_launch(f, refusals_run, NULL) == 0);
    fg_fabric_free(f);
}
