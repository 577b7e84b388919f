/* Private header of the launch layer: the process bookkeeping shared by the
 * supervised job (job.c) and the fork launcher (fork.c), and the contract
 * helpers (contract.c). */
#ifndef FULGUR_LAUNCH_IMPL_H
#define FULGUR_LAUNCH_IMPL_H

#include <pthread.h>
#include <sys/types.h>

#include "core/core_impl.h"
#include "fulgur/launch.h"

#ifndef FULGUR_HAVE_MPI_BUILT
#define FULGUR_HAVE_MPI_BUILT 0
#endif

/* fg_launch_parse_devices with the words for "devices here" in errors (the
 * plan says "CPU devices here (cores)" and adds how to run more ranks). */
FG_MUST_USE fg_status fg__launch_parse_devices(const char *s, int available, const char *what,
                                               fg_devices *out);

/* One process a launcher started. A pid is signalled only while it is not
 * yet reaped, so that a reused pid is never hit. */
typedef struct fg__proc {
    pid_t pid;
    int rank;
    int pidfd;  /* readable once the process ends; -1 when pidfd_open is missing */
    int status; /* waitpid status, once reaped */
    bool reaped;
    bool stopped; /* signalled by a stop */
    bool noted;   /* its end was accounted for (job.c) */
} fg__proc;

/* Opens the pidfd of p->pid (p->pidfd = -1 if the kernel has none). */
void fg__proc_watch(fg__proc *p);

/* A slot whose pid is 0 (not started) counts as reaped and is never
 * signalled or waited for.
 *
 * Reaps p if it has ended (never blocks). Returns true when it was reaped
 * now. A pid taken away by someone else (ECHILD) counts as exited 0. With
 * kill_leftovers, a process that ended abnormally takes its process group
 * with it (SIGKILL to what it started and left behind). */
bool fg__proc_reap(fg__proc *p, bool kill_leftovers);

/* Sends sig to p's process group, or to p alone if it has none. */
void fg__proc_kill(const fg__proc *p, int sig);

/* Sleeps until one of the unreaped processes may have ended, extra_fd (if
 * >= 0) is readable, or timeout_s (< 0: no limit) passed. */
void fg__procs_poll(const fg__proc *ps, int n, int extra_fd, double timeout_s);

/* The exit of a reaped process. */
void fg__proc_exit(const fg__proc *p, fg_rank_exit *e);

/* True when a reaped process ended abnormally (a signal or a non-zero code). */
bool fg__proc_failed(const fg__proc *p);

/* True when p runs no more but is stopped (SIGSTOP, a debugger): its
 * /proc state is T or t. */
bool fg__proc_is_stopped(const fg__proc *p);

/* Stops the unreaped processes: SIGTERM to each, SIGKILL to those left
 * after grace_s, and at once to one that is stopped; returns once all are reaped, with how many it
 * signalled. With mu, the mutex is held (as on entry) while signalling and reaping and released
 * while sleeping. */
int fg__procs_stop(fg__proc *ps, int n, double grace_s, pthread_mutex_t *mu);

/* guard.c: the guard process of a job, which SIGKILLs the ranks' process
 * groups if the launcher dies (what PR_SET_PDEATHSIG cannot reach: a
 * rank's own children). _start forks it and returns the write end of its
 * pipe (-1 if it could not start: the job runs unguarded); _add tells it a
 * rank's process group; _release ends it without killing anything and
 * reaps it. */
int fg__guard_start(pid_t *guard_pid);
void fg__guard_add(int wfd, int pgid);
void fg__guard_release(int wfd, pid_t guard_pid);

/* The grace period into *out: g > 0, else FULGUR_KILL_GRACE_S, else 3 s;
 * FG_EINVAL naming the variable when it is set but not seconds above 0. */
FG_MUST_USE fg_status fg__grace(double g, double *out);

/* A NULL-terminated environment: this process's, without the contract's
 * variables, plus the contract for info. Free with fg__env_free. */
FG_MUST_USE fg_status fg__contract_env(const fg_cluster_info *info, char ***out);
void fg__env_free(char **env);

/* A free TCP port on 127.0.0.1 (the kernel's choice), or 29500 + pid % 10000
 * when sockets are not available. */
int fg__free_port(void);

/* The first set variable among names (NULL-terminated), or NULL. *which gets
 * its name. */
const char *fg__getenv_any(const char *const *names, const char **which);

/* ------------------------------------------------------------ the agent */

#include <signal.h>

/* fg_agent_run's state (agent.c), shared with its --hosts loop (hosts.c):
 * the signals it forwards come from sfd, the one way they are read. */
typedef struct fg__agent {
    const fg_agent_opts *o;
    int sfd;         /* signalfd of the forwarded signals */
    sigset_t old;    /* the calling thread's mask before the run */
    fg_job *job;     /* the running group, NULL between groups */
    pid_t child;     /* or mpirun, 0 if none */
    int got;         /* the last signal that ends the job, 0 if none */
    double got_time; /* when the first came */
    int forwarded;   /* ranks the last signal reached */
} fg__agent;

/* Reads the signals that came and forwards each to the job or the child. */
void fg__agent_signals(fg__agent *a);

/* One host of a --hosts list. */
typedef struct fg__host {
    char name[256];
    int slots;
} fg__host;

/* fg_agent_run with o->hosts: the mpirun job's loop (hosts.c). */
FG_MUST_USE fg_status fg__agent_hosts(fg__agent *a, fg_agent_result *out);

#endif
