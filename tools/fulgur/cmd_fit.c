/* fulgur fit, validate, test, predict: the Trainer (fit_trainer.c) on a
 * built-in model (gpt, mlp) and a data file, with Lightning's Trainer flags
 * (fit_args.c). Everything checkable is checked here, in the
 * process the user started, before any rank exists: flags and values
 * (fit_args.c), files, and the devices/strategy/precision strings
 * (fg_fabric_new: the launch plan, the same as `fulgur env` prints for these
 * flags; the process the user started prints it). Then fg_fabric_launch runs
 * fit_run on every rank; under ddp the launcher re-executes this same
 * command line for the other ranks, which repeat the checks (cheap) and join.
 * Exit codes: 0 done; 1 failed while running (including a checkpoint that
 * does not fit the model, named tensor by tensor) or for want of memory or
 * I/O before; 2 bad usage (flags, or devices/strategy/precision that
 * fg_fabric_new refuses as invalid, unsupported or mismatched); 75 stopped
 * by SIGTERM, SIGINT or SIGUSR1 after saving a checkpoint at a step
 * boundary (rank 0; other ranks exit 0). */
#include <signal.h>
#include <string.h>

#include "fit.h"

/* ------------------------------------------------- resumable stops
 * SIGTERM, SIGINT and SIGUSR1 ask the fabric for a stop at the next step
 * boundary (all ranks agree there, save, and exit 75); a second one ends
 * the process at once, by that signal; once the stop's checkpoint is saved
 * further signals are ignored (the ranks are leaving). Under ddp_spawn and
 * ddp_fork this process is the ranks' parent, no rank: it forwards each
 * signal to the ranks (fg_launch_fork_signal), which stop, save and exit
 * 0, and it exits 75 itself. */
static fg_fabric *g_fabric;
volatile int fit_stopped;
static volatile sig_atomic_t g_forwarded; /* signals this parent passed to its forked ranks */

static void on_stop_signal(int sig) {
    if (fit_stopped || !g_fabric) return;
    if (fg_launch_fork_signal(sig) > 0) g_forwarded = 1;
    if (fg_fabric_request_stop(g_fabric) < 2) return;
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    sigaction(sig, &dfl, NULL);
    raise(sig);
}

static void install_stop_handlers(fg_fabric *f) {
    g_fabric = f;
    struct sigaction sa = {.sa_handler = on_stop_signal, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    static const int k_sigs[] = {SIGTERM, SIGINT, SIGUSR1};
    for (size_t i = 0; i < sizeof k_sigs / sizeof k_sigs[0]; i++) sigaction(k_sigs[i], &sa, NULL);
}

static int run_command(fg_trainer_fn fn, int argc, char **argv) {
    static fit_opts o; /* static: ranks launched by fork keep it */
    int rc = fit_args_parse(&o, fn, argc, argv);
    if (rc) return rc < 0 ? FG_EXIT_OK : rc;
    fg_fabric *f = fg_fabric_new(&(fg_fabric_config){
        .accelerator = o.accelerator,
        .devices = o.devices,
        .strategy = o.strategy,
        .precision = o.precision,
        .num_nodes = (int)o.num_nodes,
        .seed = (uint64_t)o.seed,
        .sharded = o.sharded,
        .deepspeed_config = o.deepspeed_config,
        .activation_checkpointing = o.activation_checkpointing,
        .ddp = o.ddp,
        .deterministic = o.deterministic,
    });
    if (!f) {
        /* bad devices/strategy/precision: usage; anything else (memory, I/O) a failure */
        fg_status s = fg_last_status();
        cli_error("%s", fg_last_error());
        bool usage = s == FG_EINVAL || s == FG_EUNSUPPORTED || s == FG_EMISMATCH;
        return usage ? FG_EXIT_USAGE : FG_EXIT_FAIL;
    }
    if (fn == FG_FIT && (rc = fit_check_ckpt_dir(&o)) != 0) {
        fg_fabric_free(f);
        return rc;
    }
    fit_run *r = fit_run_new(&o, f, &rc);
    if (!r) {
        fg_fabric_free(f);
        return rc;
    }
    const fg_launch_plan *plan = fg_fabric_plan(f);
    if (plan->rank <= 0) { /* rank 0, or the parent of forked ranks */
        char line[512];
        printf("launch plan: %s\n", fg_launch_plan_format(plan, line, sizeof line));
        fflush(stdout);
    }
    if (fn == FG_FIT) install_stop_handlers(f);
    rc = fit_run_launch(r);
    /* a resumable stop: the process the user started (rank 0) says so with
     * its exit status; the other ranks exit 0, so that no launcher takes
     * them for failed ranks */
    if (rc == 0 && (fit_stopped || g_forwarded) && plan->rank <= 0) rc = FG_EXIT_RESUMABLE;
    g_fabric = NULL;
    fit_run_free(r);
    fg_fabric_free(f);
    return rc;
}

int cmd_fit(int argc, char **argv) { return run_command(FG_FIT, argc, argv); }
int cmd_validate(int argc, char **argv) { return run_command(FG_VALIDATE, argc, argv); }
int cmd_test(int argc, char **argv) { return run_command(FG_TEST, argc, argv); }
int cmd_predict(int argc, char **argv) { return run_command(FG_PREDICT, argc, argv); }
