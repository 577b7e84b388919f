/* fg_fabric_launch: the launch layer's plan, and a switch on its launcher.
 *
 *   none     (single; ddp of one rank; already launched by fulgur run,
 *            mpirun, srun or torchrun): join and run here;
 *   threads  (dp): run here, the strategy splits each batch over threads;
 *   re-exec  (ddp): fg_launch_reexec starts local ranks 1..N-1; this
 *            process goes on as rank 0 and joins with fg_job_comm_new (a
 *            rank that dies before it joins ends the wait). Its supervisor
 *            aborts our communicator when a rank dies, so rank 0 leaves a
 *            collective at once and the error names the dead rank;
 *   fork     (ddp_spawn, ddp_fork): fg_launch_fork runs every rank in a
 *            child; rank 0 sends its state as of its last step back with
 *            fg_launch_send_result, for fg_fabric_spawn_result.
 *
 * Every rank ends the same way: a barrier when run() succeeded (nobody
 * leaves while others still talk), then the strategy and the communicator
 * are freed. */
#include <stdio.h>
#include <string.h>

#include "fabric_impl.h"

/* Joins the job described by info: ranks, kernel threads, and the
 * communicator of a ddp group of several ranks. */
static FG_MUST_USE fg_status join(fg_fabric *f, const fg_cluster_info *info) {
    f->info = *info;
    f->world_size = info->world_size;
    f->global_rank = info->rank;
    f->local_rank = info->local_rank;
    f->node_rank = info->node_rank;
    fg_set_log_rank(info->rank);
    f->threads = f->plan.threads_per_rank;
    FG_TRY(fg_set_num_threads(f->threads));
    if (f->cfg.deterministic) FG_TRY(fg__fabric_deterministic_pin(f));
    /* a communicator for the kinds of several processes (the row's ranks),
     * and a group of one for stage 3 with its parameters on nvme: one rank
     * runs stage 3 itself, the model's units fetched from the file */
    if ((info->world_size < 2 && !fg__fabric_one_rank_stage3(f)) ||
        fg_strategy_info_of(f->plan.strategy)->ranks == FG_RANKS_ONE_PROCESS)
        return FG_OK;
    /* re-exec: rank 0 stops waiting for the others if one of them dies first */
    fg_comm *c = fg_job_comm_new(f->job, info, NULL);
    if (!c) return fg_last_status();
    pthread_mutex_lock(&f->comm_mu);
    f->comm = c;
    pthread_mutex_unlock(&f->comm_mu);
    return FG_OK;
}

static int run_rank(fg_fabric *f, const fg_cluster_info *info, int (*run)(fg_fabric *, void *),
                    void *arg) {
    if (join(f, info) != FG_OK) return 1;
    int rc = run(f, arg);
    if (rc == 0 && f->comm && fg_comm_barrier(f->comm) != FG_OK) rc = 1;
    return rc;
}

/* Frees what the rank joined with. Keeps this thread's error message. */
static void leave(fg_fabric *f) {
    fg_error_kept first;
    fg_error_keep(&first);
    fg_strategy_free(f->strategy);
    f->strategy = NULL;
    fg__status_drop(
        fg_autocast_set(FG_DTYPE_DEFAULT, NULL)); /* fg_fabric_setup's, on this thread */
    f->model = NULL;
    f->opt = NULL;
    fg__fabric_stage_free(f); /* the batches' staging: nothing is left on the device */
    pthread_mutex_lock(&f->comm_mu);
    fg_comm_free(f->comm);
    f->comm = NULL;
    pthread_mutex_unlock(&f->comm_mu);
    if (first.msg[0]) (void)fg_error(FG_EINVAL, "%s", first.msg);
    else fg_clear_error();
}

/* ------------------------------------------------------------- re-exec */

/* On the supervisor thread, when a rank has died: rank 0 may be waiting on
 * it in a collective. */
static void abort_comm(void *ud, const fg_rank_exit *e) {
    fg_fabric *f = ud;
    char why[160];
    if (e) fg_rank_exit_format(e, why, sizeof why); /* the dead rank and its signal or code */
    pthread_mutex_lock(&f->comm_mu);
    if (f->comm) fg_comm_abort_reason(f->comm, e ? why : NULL);
    pthread_mutex_unlock(&f->comm_mu);
}

static int launch_reexec(fg_fabric *f, int (*run)(fg_fabric *, void *), void *arg) {
    fg_job_opts jo = {.on_failure = abort_comm, .ud = f};
    if (!(f->job = fg_launch_reexec(&f->plan, &jo))) return 1;
    fg_cluster_info me;
    int rc = fg_cluster_detect(&me) == FG_OK ? run_rank(f, &me, run, arg) : 1;
    fg_status own = rc ? FG_EINVAL : FG_OK;
    fg_error_kept mine; /* this rank's own failure, if any */
    fg_error_keep(&mine);
    /* A rank that died first explains rank 0's failure; else rank 0's own
     * failure stops the others (aborted, they leave their collectives). */
    bool other_failed = fg_job_check(f->job) != FG_OK;
    if (rc && !other_failed) {
        abort_comm(f, NULL);
        fg_job_stop(f->job);
    }
    fg_status js = fg_job_wait(f->job, -1);
    fg_error_kept jerr;
    fg_error_keep(&jerr);
    fg_job_free(f->job); /* joins the supervisor: no abort after this */
    f->job = NULL;
    leave(f);
    fg_launch_unexport();
    if (js != FG_OK && (rc == 0 || other_failed)) {
        fg_error(js, "%s", jerr.msg);
        return 1;
    }
    if (rc) fg_error(own, "%s", mine.msg);
    return rc;
}

/* ---------------------------------------------------------------- fork */

/* ddp_spawn: rank 0's state as of its last step (flat parameters, then each
 * optimizer state buffer), copied at every fg_fabric_step_end: run() may
 * free its model before returning, and the parent still gets what it
 * trained. */
/* bytes of t's (contiguous) data to host memory dst: a copy out of a device */
static FG_MUST_USE fg_status copy_out(void *dst, const fg_tensor *t, size_t bytes) {
    fg_dev *d = fg_tensor_dev(t);
    if (d && !fg_dev_host_accessible(d)) return fg_dev_copy_d2h(d, dst, fg_tensor_data(t), bytes);
    memcpy(dst, fg_tensor_data(t), bytes);
    return FG_OK;
}

void fg__spawn_snapshot(fg_fabric *f) {
    if (!f->forked_rank || f->global_rank != 0 || !f->model) return;
    fg_tensor *flat = fg_module_flat_params(f->model);
    int64_t sb = 0, se = 0;
    fg_optimizer_state_range(f->opt, &sb, &se);
    /* a sharded state (not a strategy fork launches) is not rank 0's alone */
    bool whole = f->opt && sb == 0 && se == fg_tensor_numel(flat);
    uint64_t nstate = whole ? (uint64_t)fg_optimizer_num_states(f->opt) : 0;
    uint64_t bytes = fg_tensor_nbytes(flat);
    uint64_t hdr[3] = {bytes, nstate, f->opt ? (uint64_t)fg_optimizer_step_count(f->opt) : 0};
    size_t need = sizeof hdr + (size_t)bytes * (size_t)(1 + nstate);
    if (f->spawn_blob_len != need) {
        fg_free(f->spawn_blob);
        f->spawn_blob = fg_alloc(need);
        f->spawn_blob_len = f->spawn_blob ? need : 0;
        if (!f->spawn_blob) return;
    }
    char *p = f->spawn_blob;
    memcpy(p, hdr, sizeof hdr);
    fg_status s = copy_out(p + sizeof hdr, flat, bytes);
    for (uint64_t k = 0; k < nstate && s == FG_OK; k++)
        s = copy_out(p + sizeof hdr + (k + 1) * bytes, fg_optimizer_state(f->opt, (int)k), bytes);
    if (s != FG_OK) { /* half a copy is not rank 0's state: none goes to the parent */
        fg_log(FG_LOG_WARN, "ddp_spawn: rank 0's state not copied off its device: %s",
               fg_last_error());
        fg_free(f->spawn_blob);
        f->spawn_blob = NULL;
        f->spawn_blob_len = 0;
    }
}

typedef struct fork_ctx {
    fg_fabric *f;
    int (*run)(fg_fabric *, void *);
    void *arg;
} fork_ctx;

/* In a forked child: rank r of n, the contract already exported. */
static int fork_rank(int r, int n, void *ud) {
    (void)n;
    fork_ctx *c = ud;
    fg_fabric *f = c->f;
    f->forked_rank = true;
    fg_cluster_info me;
    int rc = fg_cluster_detect(&me) == FG_OK ? run_rank(f, &me, c->run, c->arg) : 1;
    if (rc == 0 && r == 0 && f->spawn_blob_len &&
        fg_launch_send_result(f->spawn_blob, f->spawn_blob_len) != FG_OK)
        rc = 1;
    leave(f);
    return rc;
}

static int launch_fork(fg_fabric *f, int (*run)(fg_fabric *, void *), void *arg) {
    fork_ctx c = {f, run, arg};
    const fg_cluster_info *pc = &f->plan.cluster;
    fg_fork_opts o = {.threads_per_rank = f->plan.threads_per_rank,
                      .master_port = pc->master_port,
                      .job_id = pc->job_id[0] ? pc->job_id : NULL};
    fg_fork_result res;
    if (fg_launch_fork(f->plan.world_size, fork_rank, &c, &o, &res) != FG_OK) {
        fg_free(res.data);
        /* run()'s own exit code when it returned one, as a rank would exit */
        return res.failed.rank >= 0 && res.failed.code > 0 ? res.failed.code : 1;
    }
    fg_free(f->spawn_blob);
    f->spawn_blob = res.data;
    f->spawn_blob_len = res.len;
    return 0;
}

fg_status fg_fabric_spawn_result(fg_fabric *f, fg_module *model, fg_optimizer *opt) {
    if (!f || !model) return fg_error(FG_EINVAL, "spawn_result: NULL fabric or model");
    if (!f->spawn_blob_len)
        return fg_error(FG_ESTATE, "spawn_result: no result (not after a ddp_spawn/ddp_fork "
                                   "launch, or rank 0 set up no model)");
    uint64_t hdr[3];
    memcpy(hdr, f->spawn_blob, sizeof hdr);
    fg_tensor *flat = fg_module_flat_params(model);
    if (!flat || hdr[0] != fg_tensor_nbytes(flat))
        return fg_error(FG_EMISMATCH,
                        "spawn_result: the ranks trained %llu bytes of parameters, "
                        "this model has %zu",
                        (unsigned long long)hdr[0], flat ? fg_tensor_nbytes(flat) : 0);
    const char *p = (const char *)f->spawn_blob + sizeof hdr;
    memcpy(fg_tensor_data(flat), p, hdr[0]);
    int64_t sb = 0, se = 0;
    fg_optimizer_state_range(opt, &sb, &se);
    if (opt && (uint64_t)fg_optimizer_num_states(opt) == hdr[1] && sb == 0 &&
        se == fg_tensor_numel(flat)) {
        for (uint64_t k = 0; k < hdr[1]; k++)
            memcpy(fg_tensor_data(fg_optimizer_state(opt, (int)k)), p + (k + 1) * hdr[0], hdr[0]);
        FG_TRY(fg_optimizer_set_step_count(opt, (int64_t)hdr[2]));
    }
    return FG_OK;
}

/* -------------------------------------------------------------- launch */

int fg_fabric_launch(fg_fabric *f, int (*run)(fg_fabric *f, void *arg), void *arg) {
    if (!f || !run) {
        fg_error(FG_EINVAL, "fabric launch: NULL fabric or run function");
        return 1;
    }
    if (f->running) {
        fg_error(FG_ESTATE, "fabric launch: called inside a run (launch once, from main)");
        return 1;
    }
    if (fg__fabric_plan(f, &f->plan) != FG_OK) return 1;
    f->running = true;
    int rc;
    switch (f->plan.launcher) {
    case FG_LAUNCHER_REEXEC: rc = launch_reexec(f, run, arg); break;
    case FG_LAUNCHER_FORK: rc = launch_fork(f, run, arg); break;
    case FG_LAUNCHER_NONE:
    case FG_LAUNCHER_THREADS:
    default:
        rc = run_rank(f, &f->plan.cluster, run, arg);
        leave(f);
        break;
    }
    f->running = false;
    return rc;
}
