/* A complete Fabric program: an MLP learns a synthetic 4-class task. The
 * same code runs on one process or many:
 *
 *   example_fabric_mlp                                   one process
 *   example_fabric_mlp --devices 2 --strategy ddp        2 ranks (re-executes itself)
 *   example_fabric_mlp --devices 2 --strategy ddp_spawn  2 forked ranks, the parent gets the model
 *   example_fabric_mlp --devices 2 --strategy dp         2 threads in one process
 *   fulgur run --nproc-per-node 2 example_fabric_mlp     ddp on the launcher's 2 ranks
 *   mpirun -np 2 example_fabric_mlp --devices 2
 *   example_fabric_mlp --accelerator guarded             on the test device (docs/devices.md)
 *
 * --batch is per device (as Lightning's), --save PATH writes the trained
 * weights (safetensors). Exit code 2 for bad flags, 1 if training failed. */
#include <fulgur/fulgur.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIM 16
#define CLASSES 4

typedef struct opts {
    const char *accelerator, *devices, *strategy, *save;
    int64_t batch, steps;
} opts;

/* Sample i: x from a counter-based normal stream, y = the largest of four
 * fixed sums of x (a task an MLP learns in a few hundred steps). */
static fg_status sample(void *ud, int64_t i, void *x_out, void *y_out) {
    (void)ud;
    float *x = x_out;
    fg_rng_fill_normal(42, (uint64_t)i * DIM, x, DIM, 0, 1);
    float best = -1e30f;
    for (int c = 0; c < CLASSES; c++) {
        float s = x[c] + 0.5f * x[c + 4] - 0.25f * x[(c + 1) % DIM];
        if (s > best) {
            best = s;
            *(int32_t *)y_out = c;
        }
    }
    return FG_OK;
}
static int64_t length(void *ud) {
    (void)ud;
    return 4096;
}
static void spec(void *ud, fg_sample_spec *x, fg_sample_spec *y) {
    (void)ud;
    *x = (fg_sample_spec){.dtype = FG_F32, .ndim = 1, .shape = {DIM}};
    *y = (fg_sample_spec){.dtype = FG_I32, .ndim = 0};
}

static fg_module *make_model(void) {
    return fg_mlp_new(&(fg_mlp_config){.sizes = {DIM, 64, 64, CLASSES}, .seed = 1});
}

static fg_tensor *step_loss(fg_fabric *f, fg_batch *b, void *ud) {
    (void)f;
    return fg_cross_entropy(fg_module_forward(ud, b->x), b->y, -100);
}

static int run(fg_fabric *f, void *arg) {
    opts *o = arg;
    fg_module *model = make_model();
    fg_optimizer *opt = fg_sgd_new(model, &(fg_sgd_opts){.lr = 0.1, .momentum = 0.9});
    fg_dataset *ds =
        fg_dataset_new(&(fg_dataset_ops){length, spec, sample, NULL}, NULL, "synthetic");
    fg_dataloader *dl = fg_dataloader_new(
        ds, &(fg_loader_opts){.batch = o->batch, .shuffle = true, .seed = 7, .drop_last = true});
    if (!model || !opt || !dl || fg_fabric_setup(f, model, opt) != FG_OK ||
        !fg_fabric_setup_dataloader(f, dl, true))
        return 1;
    double loss = 0;
    int64_t step = 0;
    for (int64_t epoch = 0; step < o->steps; epoch++) {
        if (fg_dataloader_set_epoch(dl, epoch) != FG_OK) return 1;
        for (fg_batch *b; step < o->steps && (b = fg_dataloader_next(dl)); step++) {
            fg_optimizer_zero_grad(opt);
            /* training_step: dp splits the batch across its threads here */
            if (fg_fabric_training_step(f, b, step_loss, NULL, model, &loss) != FG_OK) return 1;
            if (fg_optimizer_step(opt) != FG_OK) return 1;
            if (fg_fabric_reduce_scalar(f, loss, FG_REDUCE_OP_AVG, &loss) != FG_OK) return 1;
            if (step % 50 == 0)
                fg_fabric_print(f, "step %3lld  loss %.4f\n", (long long)step, loss);
            fg_fabric_step_end(f);
        }
        if (fg_dataloader_status(dl) != FG_OK) return 1;
    }
    fg_fabric_print(f, "final loss %.4f on %d rank(s), strategy %s\n", loss,
                    fg_fabric_world_size(f), fg_fabric_strategy_name(f));
    if (o->save && fg_fabric_save(f, o->save, &(fg_train_state){.model = model, .step = step}))
        return 1;
    fg_dataloader_free(dl);
    fg_dataset_free(ds);
    fg_optimizer_free(opt);
    fg_module_free(model);
    return 0;
}

int main(int argc, char **argv) {
    opts o = {.devices = NULL, .strategy = NULL, .batch = 32, .steps = 200}; /* NULL: "auto" */
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--devices") && v) o.devices = argv[++i];
        else if (!strcmp(argv[i], "--accelerator") && v) o.accelerator = argv[++i];
        else if (!strcmp(argv[i], "--strategy") && v) o.strategy = argv[++i];
        else if (!strcmp(argv[i], "--batch") && v) o.batch = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && v) o.steps = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--save") && v) o.save = argv[++i];
        else {
            fprintf(stderr,
                    "usage: %s [--accelerator A] [--devices D] [--strategy S] [--batch B] "
                    "[--steps N] [--save FILE]\n",
                    argv[0]);
            return 2;
        }
    }
    fg_fabric *f = fg_fabric_new(&(fg_fabric_config){.accelerator = o.accelerator,
                                                     .devices = o.devices,
                                                     .strategy = o.strategy,
                                                     .print_to = stdout});
    if (!f) {
        fprintf(stderr, "fabric_mlp: %s\n", fg_last_error());
        return 2;
    }
    int rc = fg_fabric_launch(f, run, &o);
    if (rc) {
        fprintf(stderr, "fabric_mlp: %s\n", fg_last_error());
    } else if (fg_fabric_plan(f)->launcher == FG_LAUNCHER_FORK && o.save) {
        /* The parent holds the trained model, unlike Lightning's ddp_spawn. */
        fg_module *model = make_model();
        if (fg_fabric_spawn_result(f, model, NULL) == FG_OK)
            rc = fg_fabric_save(f, o.save, &(fg_train_state){.model = model, .step = o.steps}) !=
                 FG_OK;
        else rc = 1;
        if (rc) fprintf(stderr, "fabric_mlp: %s\n", fg_last_error());
        fg_module_free(model);
    }
    fg_fabric_free(f);
    return rc;
}
