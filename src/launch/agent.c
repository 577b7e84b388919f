/* torchrun's agent (fg_agent_run): the program's ranks on this machine as
 * one supervised job (job.c), met with the other machines' at the
 * rendezvous (rdzv.c), restarted after a failure up to max_restarts times,
 * with the signals that stop a job forwarded to every rank.
 *
 * Signals: SIGINT, SIGTERM, SIGHUP, SIGQUIT and SIGUSR1 are blocked in the
 * calling thread for the run and read from one signalfd, between the 0.1 s
 * waits on the ranks and while the rendezvous waits (its cancel hook); the
 * ranks (and ompi-server) reset their mask before exec. The library never
 * prints: what the agent does is said through fg_log, the result in
 * fg_agent_result and the returned status. With a list of hosts the loop
 * is hosts.c's (mpirun as the child), with the same signalfd. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "launch_impl.h"

#define EXIT_USAGE 2      /* a usage error: a restart would repeat it */
#define EXIT_RESUMABLE 75 /* EX_TEMPFAIL: stopped with a checkpoint to resume from */

/* SIGUSR1 (SLURM's "time is nearly up": checkpoint and stop) is forwarded
 * too, but does not end the job by itself: ranks that ignore it run on. */
static const int k_forward[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1};

void fg__agent_signals(fg__agent *a) {
    struct signalfd_siginfo si;
    while (read(a->sfd, &si, sizeof si) == (ssize_t)sizeof si) {
        int sig = (int)si.ssi_signo;
        if (sig != SIGUSR1) {
            if (!a->got) a->got_time = fg_time();
            a->got = sig;
        }
        if (a->job) a->forwarded = fg_job_signal(a->job, sig);
        else if (a->child > 0) kill(a->child, sig);
    }
}

static bool rdzv_cancelled(void *ud) {
    fg__agent *a = ud;
    fg__agent_signals(a);
    return a->got != 0;
}

static const char *sig_name(int sig) {
    const char *s = sigabbrev_np(sig);
    return s ? s : "?";
}

fg_status fg_agent_check(const fg_agent_opts *o) {
    if (!o || !o->argv || !o->argv[0])
        return fg_error(FG_EINVAL, "fg_agent_run: no program to run (argv NULL or empty)");
    if (o->nproc_per_node < 1 || o->nproc_per_node > FG_DEVICES_MAX)
        return fg_error(FG_EINVAL, "fg_agent_run: nproc_per_node=%d: expected 1..%d",
                        o->nproc_per_node, FG_DEVICES_MAX);
    int nn = o->num_nodes > 0 ? o->num_nodes : 1;
    if (o->min_nodes < 0 || o->min_nodes > nn)
        return fg_error(FG_EINVAL, "fg_agent_run: min_nodes=%d: expected 0..num_nodes (%d)",
                        o->min_nodes, nn);
    if (o->node_rank < 0 || o->node_rank >= nn)
        return fg_error(FG_EINVAL, "fg_agent_run: node_rank=%d: expected 0..%d", o->node_rank,
                        nn - 1);
    if (o->max_restarts < 0)
        return fg_error(FG_EINVAL, "fg_agent_run: max_restarts=%d: expected 0 or more",
                        o->max_restarts);
    if (o->master_port < 0 || o->master_port > 65535)
        return fg_error(FG_EINVAL, "fg_agent_run: master_port=%d: not a port", o->master_port);
    if (o->grace_s < 0 || o->stop_grace_s < 0)
        return fg_error(FG_EINVAL, "fg_agent_run: grace_s=%g stop_grace_s=%g: expected 0 or more",
                        o->grace_s, o->stop_grace_s);
    return FG_OK;
}

/* One run of the loop; the signal set-up is the caller's. */
static FG_MUST_USE fg_status agent_loop(fg__agent *a, fg_agent_result *out) {
    const fg_agent_opts *o = a->o;
    int nnodes = o->num_nodes > 0 ? o->num_nodes : 1;
    bool elastic = o->min_nodes > 0 && o->min_nodes < nnodes;
    bool multi = (nnodes > 1 || elastic) && !o->no_rdzv;
    const char *addr = o->master_addr && *o->master_addr ? o->master_addr : "127.0.0.1";
    int port = o->master_port ? o->master_port : (nnodes > 1 || elastic ? 29500 : 0);
    int nproc = o->nproc_per_node, restarts = o->max_restarts;
    double kill_grace = o->grace_s;
    if (!(kill_grace > 0)) {
        fg_status st = fg__env_double("FULGUR_KILL_GRACE_S", 3, &kill_grace);
        if (st != FG_OK) return st;
        if (!(kill_grace > 0))
            return fg_error(FG_EINVAL,
                            "FULGUR_KILL_GRACE_S=\"%s\": expected a number of seconds above 0 "
                            "(unset it for the default, 3)",
                            getenv("FULGUR_KILL_GRACE_S"));
    }
    char max_s[16];
    snprintf(max_s, sizeof max_s, "%d", restarts);
    setenv("TORCHELASTIC_MAX_RESTARTS", max_s, 1);
    int node_rank = o->node_rank;
    /* several machines: one membership for the whole run, met again at each
     * restart; node 0 keeps its port, so that a node that comes during a
     * round is held for the next one or told why not */
    fg_rdzv *rdzv = NULL;
    char end_what[256] = ""; /* node 0: how the job ended, for a node that comes late */
    fg_status ret = FG_OK;
    char msg[1024] = "";
    int exit_code = 0;
    for (int attempt = 0;; attempt++) {
        out->restarts = attempt;
        char count[16], jid[FG_CLUSTER_JOB_MAX], base[112];
        /* the ranks find each other through node 0's ompi-server; node 0's
         * round is every node's restart count (a node may join at a restart) */
        int round = attempt, here_rank = node_rank, here_nodes = nnodes;
        if (o->job_id) snprintf(base, sizeof base, "%.100s", o->job_id);
        else snprintf(base, sizeof base, "%.100s:%d", addr, port);
        if (multi) {
            char value[1024];
            fg_rdzv_opts ro = {.master_addr = addr,
                               .master_port = port,
                               .node_rank = elastic ? -1 : node_rank,
                               .num_nodes = nnodes,
                               .min_nodes = elastic ? o->min_nodes : 0,
                               .round = attempt,
                               .last_round = restarts,
                               .nproc_per_node = nproc,
                               .job_id = base,
                               .timeout_s = o->rdzv_timeout_s,
                               .mpi_server = o->mpi_server,
                               .cancelled = rdzv_cancelled,
                               .cancel_ud = a};
            fg_status rst = FG_OK;
            if (!rdzv) {
                rdzv = fg_rdzv_join(&ro, value, sizeof value);
                if (!rdzv) rst = fg_last_status();
            } else {
                rst = fg_rdzv_rejoin(rdzv, attempt, value, sizeof value);
            }
            if (rst != FG_OK) {
                snprintf(end_what, sizeof end_what, "the rendezvous of its round %d failed",
                         attempt);
                if (elastic) snprintf(msg, sizeof msg, "%s", fg_last_error());
                else snprintf(msg, sizeof msg, "node %d: %s", node_rank, fg_last_error());
                fg_log(FG_LOG_ERROR, "%s", msg);
                ret = rst;
                exit_code = a->got ? 128 + a->got : 1;
                break;
            }
            fg_rdzv_layout(rdzv, &here_rank, &here_nodes, &round);
            node_rank = here_rank;
            if (elastic)
                fg_log(FG_LOG_INFO, "node %d of %d (--nnodes %d:%d), %d rank%s here%s", here_rank,
                       here_nodes, o->min_nodes, nnodes, nproc, nproc == 1 ? "" : "s",
                       round ? ", restart count from node 0" : "");
            if (strcmp(value, "-")) {
                setenv("FULGUR_MPI_SERVER", value, 1);
                setenv("OMPI_MCA_pmix_server_uri", value, 1);
            } else {
                unsetenv("FULGUR_MPI_SERVER");
            }
        }
        out->node_rank = here_rank;
        out->num_nodes = here_nodes;
        snprintf(count, sizeof count, "%d", round);
        setenv("FULGUR_RESTART_COUNT", count, 1);
        setenv("TORCHELASTIC_RESTART_COUNT", count, 1);
        const char *use_id = NULL;
        if (o->job_id || here_nodes > 1) {
            snprintf(jid, sizeof jid, round ? "%s-r%d" : "%s", base, round);
            use_id = jid;
        }
        fg_job_spec spec = {.argv = o->argv,
                            .nprocs = nproc,
                            .node_rank = here_rank,
                            .num_nodes = here_nodes,
                            .master_addr = addr,
                            .master_port = port,
                            .job_id = use_id};
        fg__agent_signals(a);
        if (a->got) { /* a signal came between two groups: no restart */
            snprintf(end_what, sizeof end_what,
                     "its fulgur run got a signal before the ranks started");
            fg_rdzv_finish(rdzv, end_what);
            exit_code = 128 + a->got;
            ret = fg_error(FG_EPEER, "got SIG%s before the ranks started", sig_name(a->got));
            break;
        }
        a->job = fg_job_start(&spec, &(fg_job_opts){.grace_s = o->stop_grace_s});
        if (!a->job) {
            ret = fg_last_status();
            snprintf(msg, sizeof msg, "%s", fg_last_error());
            fg_log(FG_LOG_ERROR, "%s", msg);
            snprintf(end_what, sizeof end_what, "%.255s", msg);
            fg_rdzv_finish(rdzv, end_what);
            exit_code = attempt ? 1 : 127;
            break;
        }
        /* After a forwarded signal the ranks get the grace period to finish
         * (a fit saves a checkpoint), then SIGKILL: a rank that ignores
         * SIGTERM does not hold the job forever. */
        bool killed = false;
        char remote[1024] = ""; /* another node failed or left: why */
        double remote_time = 0;
        for (;;) {
            fg__agent_signals(a);
            if (fg_job_wait(a->job, 0.1) != FG_ETIMEOUT) break;
            if (rdzv && !remote[0] && fg_rdzv_poll(rdzv, remote, sizeof remote) != FG_OK) {
                fg_log(FG_LOG_ERROR, "node %d: stopping its %d rank%s: %s", node_rank, nproc,
                       nproc == 1 ? "" : "s", remote);
                remote_time = fg_time();
                fg_job_signal(a->job, SIGTERM);
            }
            bool late = (a->got && fg_time() - a->got_time >= kill_grace) ||
                        (remote[0] && fg_time() - remote_time >= kill_grace);
            if (late && !killed) {
                int n = fg_job_signal(a->job, SIGKILL);
                fg_log(FG_LOG_WARN, "%d rank%s still running %.3g s after the signal: sent SIGKILL",
                       n, n == 1 ? "" : "s", kill_grace);
                killed = true;
            }
        }
        fg_job_status st;
        fg_job_get_status(a->job, &st);
        fg_job_free(a->job);
        a->job = NULL;
        fg__agent_signals(a);
        int got = a->got;
        out->failed = st.failed;
        out->signal = got;
        if (rdzv) {
            /* whether another round follows, decided before node 0 waits for
             * the others: a node that comes meanwhile is held or told it ended */
            bool again = attempt < restarts;
            if (!remote[0] || got) {
                int ec = st.failed.rank >= 0 ? fg_rank_exit_status(&st.failed) : 0;
                again = again && !got && st.failed.rank >= 0 && ec != EXIT_RESUMABLE &&
                        ec != EXIT_USAGE;
            }
            char how[160];
            if (remote[0]) {
                /* stopped for another node: that node's failure is the cause */
                snprintf(end_what, sizeof end_what, "%.255s", remote);
            } else if (got) {
                snprintf(how, sizeof how, "its fulgur run got SIG%s", sig_name(got));
                fg_rdzv_finish(rdzv, how);
                snprintf(end_what, sizeof end_what, "node 0: %s", how);
            } else if (st.failed.rank >= 0) {
                fg_rank_exit_format(&st.failed, how, sizeof how);
                fg_rdzv_finish(rdzv, how);
                snprintf(end_what, sizeof end_what, "node 0's %s", how);
            } else {
                fg_rdzv_finish(rdzv, NULL);
                snprintf(end_what, sizeof end_what, "its ranks finished");
            }
            if (!again) fg_rdzv_end(rdzv, end_what);
            if (here_rank == 0 && !remote[0] && fg_rdzv_wait_done(rdzv, 60) != FG_OK)
                fg_log(FG_LOG_WARN, "node 0: %s", fg_last_error());
            if (remote[0] && !got) {
                exit_code = 1;
                if (attempt < restarts) {
                    fg_log(FG_LOG_INFO,
                           "node %d: restarting with the other nodes (restart %d of %d)", node_rank,
                           attempt + 1, restarts);
                    continue;
                }
                ret = fg_error(FG_EPEER, "node %d: %s; no restart left (restart %d of %d)",
                               node_rank, remote, attempt, restarts);
                break;
            }
        }
        if (got) {
            fg_log(FG_LOG_INFO, "got SIG%s; forwarded it to %d rank%s", sig_name(got), a->forwarded,
                   a->forwarded == 1 ? "" : "s");
            /* a rank that stopped resumably (fulgur fit saved a checkpoint) says so */
            exit_code =
                fg_rank_exit_status(&st.failed) == EXIT_RESUMABLE ? EXIT_RESUMABLE : 128 + got;
            ret = fg_error(FG_EPEER, "got SIG%s; forwarded it to %d rank%s", sig_name(got),
                           a->forwarded, a->forwarded == 1 ? "" : "s");
            break;
        }
        if (st.failed.rank < 0) {
            exit_code = 0;
            break;
        }
        char how[160], others[64];
        fg_rank_exit_format(&st.failed, how, sizeof how);
        exit_code = fg_rank_exit_status(&st.failed);
        if (exit_code == EXIT_RESUMABLE) { /* stopped on purpose: resume later, not now */
            fg_log(FG_LOG_INFO, "%s (stopped with a checkpoint to resume from); not restarting",
                   how);
            ret = fg_error(FG_EPEER, "%s (stopped with a checkpoint to resume from)", how);
            break;
        }
        if (exit_code == EXIT_USAGE && attempt < restarts) {
            /* a usage error (bad flags, a missing file) fails the same way again */
            fg_log(FG_LOG_ERROR,
                   "%s (exit 2: a usage error, which a restart would repeat); not restarting", how);
            ret = fg_error(FG_EPEER, "%s (exit 2: a usage error); not restarted", how);
            break;
        }
        if (st.stopped)
            snprintf(others, sizeof others, "stopped the other %d rank%s", st.stopped,
                     st.stopped == 1 ? "" : "s");
        else snprintf(others, sizeof others, "no other rank was running");
        if (attempt < restarts) {
            fg_log(FG_LOG_WARN, "%s; %s; restarting the %d ranks (restart %d of %d)", how, others,
                   nproc, attempt + 1, restarts);
            continue;
        }
        fg_log(FG_LOG_ERROR, "%s; %s", how, others);
        ret = fg_error(FG_EPEER, "%s; %s (after %d restart%s of --max-restarts %d)", how, others,
                       attempt, attempt == 1 ? "" : "s", restarts);
        break;
    }
    fg_error_kept k;
    fg_error_keep(&k);
    fg_rdzv_end(rdzv, end_what);
    fg_rdzv_free(rdzv);
    out->exit_code = exit_code;
    return ret == FG_OK ? FG_OK : fg_error_restore(&k);
}

fg_status fg_agent_run(const fg_agent_opts *o, fg_agent_result *out) {
    if (!out) return fg_error(FG_EINVAL, "fg_agent_run: out is NULL");
    memset(out, 0, sizeof *out);
    out->failed.rank = -1;
    out->exit_code = 2;
    fg_status st = fg_agent_check(o);
    if (st != FG_OK) return st;
    fg__agent a = {.o = o, .sfd = -1};
    sigset_t set;
    sigemptyset(&set);
    for (size_t i = 0; i < sizeof k_forward / sizeof k_forward[0]; i++)
        sigaddset(&set, k_forward[i]);
    if (pthread_sigmask(SIG_BLOCK, &set, &a.old) != 0)
        return fg_error(FG_EIO, "fg_agent_run: cannot block the signals it forwards");
    a.sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (a.sfd < 0) {
        int e = errno;
        pthread_sigmask(SIG_SETMASK, &a.old, NULL);
        out->exit_code = 1;
        return fg_error(FG_EIO, "fg_agent_run: signalfd: %s", strerror(e));
    }
    st = o->hosts ? fg__agent_hosts(&a, out) : agent_loop(&a, out);
    fg__agent_signals(&a); /* one that came after the last group: taken, not left pending */
    close(a.sfd);
    pthread_sigmask(SIG_SETMASK, &a.old, NULL);
    return st;
}
