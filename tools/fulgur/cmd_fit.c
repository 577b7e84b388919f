/* fulgur fit, validate, test, predict: the Trainer (fit_trainer.c) on a
 * built-in model (gpt, mlp, resnet, vit, lstm) and a data file, with Lightning's Trainer flags
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
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fit.h"

/* ------------------------------------------------- resumable stops
 * SIGTERM, SIGINT and SIGUSR1 ask the fabric for a stop at the next step
 * boundary (all ranks agree there, save, and exit 75); a second one ends
 * the process at once, by that signal; once the stop's checkpoint is saved
 * further signals are ignored (the ranks are leaving). Before the run is
 * set up one ends the process, as the default action did.
 *
 * The signals are taken by a thread of their own, with sigwait, and are
 * blocked in every other thread (the mask is set before any thread exists,
 * and threads inherit it): no signal handler ever runs on a thread that
 * computes. A handler runs on the interrupted thread's stack, at its rsp,
 * and oneDNN's jit gemm kernels before 3.11 (gemm:jit, jit_avx_gemm_f32 and
 * jit_avx512_common_gemm_f32; Debian ships 2.6) point rsp into a heap
 * workspace while they run: the kernel's signal frame (some KB with the
 * AVX-512 state) was then written over the heap below it. glibc aborted
 * later ("corrupted size vs. prev_size", "munmap_chunk(): invalid pointer"
 * in oneDNN's exit handlers), about 1 stop in 13 on the oneDNN path.
 *
 * Under ddp_spawn and ddp_fork this process is the ranks' parent, no rank:
 * it forwards each signal to the ranks (fg_launch_fork_signal), which stop,
 * save and exit 0, and it exits 75 itself. */
static const int k_stop_sigs[] = {SIGTERM, SIGINT, SIGUSR1};
static sigset_t g_stop_set;
static _Atomic(fg_fabric *) g_fabric;
static atomic_int g_phase; /* 0: not running yet, a signal ends the process; 1: running; 2: over */
volatile int fit_stopped;
static volatile sig_atomic_t g_forwarded; /* signals this parent passed to its forked ranks */
static atomic_int g_stop_sig;             /* the signal that asked for the stop, 0 if none */
static atomic_int g_rank;                 /* this process's rank, for the messages */

/* What sent sig, as far as a rank can tell: under SLURM, SIGUSR1 is the
 * warning of #SBATCH --signal (the time limit is near) and SIGTERM scancel
 * or the time limit itself. */
static const char *stop_cause(int sig) {
    bool slurm = getenv("SLURM_JOB_ID") != NULL;
    if (sig == SIGUSR1)
        return slurm ? " (SLURM's warning of #SBATCH --signal: the time limit is near)" : "";
    if (sig == SIGTERM) return slurm ? " (from SLURM: scancel, or the time limit)" : "";
    return "";
}

/* Ends the process by sig, as its default action does. */
static void die_by(int sig) {
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    pthread_sigmask(SIG_UNBLOCK, &one, NULL);
    raise(sig); /* to this thread, which no longer blocks it */
    _exit(128 + sig);
}

static atomic_int g_stop_thread_up; /* set by the thread once it runs */

static void *stop_signals_main(void *arg) {
    (void)arg;
    atomic_store(&g_stop_thread_up, 1);
    for (;;) {
        int sig;
        if (sigwait(&g_stop_set, &sig) != 0) continue;
        int phase = atomic_load(&g_phase);
        fg_fabric *f = atomic_load(&g_fabric);
        if (phase == 0) die_by(sig);
        if (phase == 2 || fit_stopped) { /* late: said, and kept for the requeue's decision */
            int none = 0;
            if (atomic_compare_exchange_strong(&g_stop_sig, &none, sig)) {
                const char *abbrev = sigabbrev_np(sig);
                fprintf(stderr, "fulgur fit: rank %d got SIG%s%s: the job is stopping already\n",
                        atomic_load(&g_rank), abbrev ? abbrev : "?", stop_cause(sig));
            }
            continue;
        }
        if (phase == 2 || fit_stopped || !f) continue;
        if (fg_launch_fork_signal(sig) > 0) g_forwarded = 1;
        int none = 0;
        if (atomic_compare_exchange_strong(&g_stop_sig, &none, sig)) {
            const char *abbrev = sigabbrev_np(sig);
            fprintf(stderr, "fulgur fit: rank %d got SIG%s%s: saving at the next step boundary\n",
                    fg_fabric_plan(f)->rank, abbrev ? abbrev : "?", stop_cause(sig));
        }
        if (fg_fabric_request_stop(f) >= 2) die_by(sig);
    }
    return NULL;
}

/* Started, and waited for until it runs: a thread still starting may hold
 * the allocator's lock (its start reads /proc/self/maps under the
 * sanitizers), and a fork then would hand the ranks that lock held by no
 * one (seen: a ddp_fork rank's threads stuck at their start, under ASan). */
static int start_stop_thread(void) {
    pthread_t th;
    atomic_store(&g_stop_thread_up, 0);
    if (pthread_create(&th, NULL, stop_signals_main, NULL) != 0) {
        cli_error("cannot start the thread that takes SIGTERM, SIGINT and SIGUSR1");
        return FG_EXIT_FAIL;
    }
    pthread_detach(th);
    for (int i = 0; i < 10000 && !atomic_load(&g_stop_thread_up); i++)
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    return FG_EXIT_OK;
}

/* First thing, while this is the only thread. */
static int take_stop_signals(void) {
    sigemptyset(&g_stop_set);
    for (size_t i = 0; i < sizeof k_stop_sigs / sizeof k_stop_sigs[0]; i++)
        sigaddset(&g_stop_set, k_stop_sigs[i]);
    pthread_sigmask(SIG_BLOCK, &g_stop_set, NULL);
    return start_stop_thread();
}

/* fork copies only the thread that forks: a forked rank starts its own. */
int fit_stop_signals_forked(void) { return start_stop_thread(); }

static void arm_stop(fg_fabric *f) {
    atomic_store(&g_fabric, f);
    atomic_store(&g_phase, 1);
}

static int run_command(fg_trainer_fn fn, int argc, char **argv) {
    static fit_opts o; /* static: ranks launched by fork keep it */
    int rc = take_stop_signals();
    if (rc) return rc;
    rc = fit_args_parse(&o, fn, argc, argv);
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
        char line[512], details[768] = "";
        printf("launch plan: %s\n", fg_launch_plan_format(plan, line, sizeof line));
        /* what else decides the numbers: the backend, hooks, sharding, ... */
        fit_plan_details(&o, plan, details, sizeof details);
        if (details[0]) printf("run details: %s\n", details + 2);
        fflush(stdout);
    }
    atomic_store(&g_rank, plan->rank);
    if (fn == FG_FIT) arm_stop(f);
    rc = fit_run_launch(r);
    /* a resumable stop: the process the user started (rank 0) says so with
     * its exit status; the other ranks exit 0, so that no launcher takes
     * them for failed ranks */
    if (rc == 0 && (fit_stopped || g_forwarded) && plan->rank <= 0) rc = FG_EXIT_RESUMABLE;
    /* Lightning's auto-requeue: saved on SLURM's warning, the job goes back
     * to the queue and resumes from this checkpoint by itself */
    bool slurm = getenv("SLURM_JOB_ID") != NULL;
    /* SLURM signals every task; when another rank's copy stopped the job
     * first, rank 0's own may still be on its way */
    for (int i = 0; rc == FG_EXIT_RESUMABLE && fit_stopped && slurm && plan->rank == 0 &&
                    !atomic_load(&g_stop_sig) && i < 500;
         i++)
        usleep(10000);
    if (rc == FG_EXIT_RESUMABLE && fit_stopped && atomic_load(&g_stop_sig) == SIGUSR1 && slurm &&
        plan->rank == 0) {
        if (o.no_requeue) {
            printf("not requeued (--no-requeue): submit the job again to resume it\n");
        } else if (fg_launch_slurm_requeue(60) == FG_OK) {
            printf("requeued SLURM job %s (scontrol requeue): it resumes from this checkpoint "
                   "by itself (--no-requeue only saves and stops)\n",
                   getenv("SLURM_JOB_ID"));
        } else {
            cli_error("%s", fg_last_error());
        }
        fflush(stdout);
    }
    atomic_store(&g_phase, 2); /* signals from here on are ignored */
    atomic_store(&g_fabric, NULL);
    fit_run_free(r);
    /* the model and optimizer are gone: nothing may be left on the device */
    fg_dev *dev = fg_fabric_device(f);
    /* its step arena goes (setting no device cannot fail, but say so if it did) */
    if (dev && fg_step_device() == dev && fg_step_device_set(NULL) != FG_OK) {
        cli_error("%s", fg_last_error());
        if (rc == 0) rc = FG_EXIT_FAIL;
    }
    if (dev && fg_dev_leak_check(dev) != FG_OK) {
        cli_error("%s", fg_last_error());
        if (rc == 0) rc = FG_EXIT_FAIL;
    }
    fg_fabric_free(f);
    return rc;
}

int cmd_fit(int argc, char **argv) { return run_command(FG_FIT, argc, argv); }
int cmd_validate(int argc, char **argv) { return run_command(FG_VALIDATE, argc, argv); }
int cmd_test(int argc, char **argv) { return run_command(FG_TEST, argc, argv); }
int cmd_predict(int argc, char **argv) { return run_command(FG_PREDICT, argc, argv); }
