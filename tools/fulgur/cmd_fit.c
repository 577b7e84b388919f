/* fulgur fit: trains a built-in model (gpt, mlp) on a data file with
 * Lightning's Trainer flags. Everything checkable is checked here, in the
 * process the user started, before any rank exists: flags and values
 * (fit_args.c), files, and the devices/strategy/precision strings
 * (fg_fabric_new: the launch plan, the same as `fulgur env` prints for these
 * flags; the process the user started prints it). Then fg_fabric_launch runs
 * fit_run on every rank; under ddp the launcher re-executes this same
 * command line for the other ranks, which repeat the checks (cheap) and join.
 * Exit codes: 0 done; 1 failed while running (including a checkpoint that
 * does not fit the model, named tensor by tensor) or for want of memory or
 * I/O before; 2 bad usage (flags, or devices/strategy/precision that
 * fg_fabric_new refuses as invalid, unsupported or mismatched). */
#include <string.h>

#include "fit.h"

int cmd_fit(int argc, char **argv) {
    static fit_opts o; /* static: ranks launched by fork keep it */
    int rc = fit_args_parse(&o, argc, argv);
    if (rc) return rc < 0 ? FG_EXIT_OK : rc;
    fg_fabric *f = fg_fabric_new(&(fg_fabric_config){
        .accelerator = o.accelerator,
        .devices = o.devices,
        .strategy = o.strategy,
        .precision = o.precision,
        .num_nodes = (int)o.num_nodes,
        .seed = (uint64_t)o.seed,
        .sharded = o.sharded,
        .ddp = o.ddp,
    });
    if (!f) {
        /* bad devices/strategy/precision: usage; anything else (memory, I/O) a failure */
        fg_status s = fg_last_status();
        cli_error("%s", fg_last_error());
        bool usage = s == FG_EINVAL || s == FG_EUNSUPPORTED || s == FG_EMISMATCH;
        return usage ? FG_EXIT_USAGE : FG_EXIT_FAIL;
    }
    const fg_launch_plan *plan = fg_fabric_plan(f);
    if (plan->rank <= 0) { /* rank 0, or the parent of forked ranks */
        char line[512];
        printf("launch plan: %s\n", fg_launch_plan_format(plan, line, sizeof line));
        fflush(stdout);
    }
    rc = fg_fabric_launch(f, fit_run, &o);
    if (rc != 0) {
        /* fit_run printed its own errors; the fabric's (a launch that
         * failed, a peer that never joined, a rank that died) are printed
         * here, whatever the code, unless this process said them already */
        const char *msg = fg_last_error();
        if (msg && *msg && !fit_reported(msg)) cli_error("fit: %s", msg);
        else if (!msg || !*msg) cli_error("fit: failed (exit code %d) without a message", rc);
        rc = FG_EXIT_FAIL;
    }
    fg_fabric_free(f);
    return rc;
}
