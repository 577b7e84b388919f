/* SLURM's auto-requeue, as Lightning's SLURMEnvironment does it: after the
 * job saved its checkpoint on SLURM's warning signal (#SBATCH
 * --signal=SIGUSR1@90), rank 0 runs `scontrol requeue $SLURM_JOB_ID`; the
 * job goes back to the queue and, started again with SLURM_RESTART_COUNT
 * above 0, resumes from its newest checkpoint by itself. scontrol is run
 * with a bounded wait, its output kept for the message. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "launch_impl.h"

/* FULGUR_SCONTROL: the scontrol to run (default: scontrol in PATH) */
fg_status fg_launch_slurm_requeue(double timeout_s) {
    const char *job = getenv("SLURM_ARRAY_JOB_ID") && getenv("SLURM_ARRAY_TASK_ID")
                          ? NULL
                          : getenv("SLURM_JOB_ID");
    char id[96];
    if (!job) {
        const char *a = getenv("SLURM_ARRAY_JOB_ID"), *t = getenv("SLURM_ARRAY_TASK_ID");
        if (!a || !t || !*a || !*t)
            return fg_error(FG_EINVAL, "requeue: SLURM_JOB_ID is not set: not a SLURM job");
        snprintf(id, sizeof id, "%s_%s", a, t);
    } else {
        snprintf(id, sizeof id, "%s", job);
    }
    if (!*id) return fg_error(FG_EINVAL, "requeue: SLURM_JOB_ID is empty: not a SLURM job");
    const char *exe = getenv("FULGUR_SCONTROL");
    if (!exe || !*exe) exe = "scontrol";
    if (timeout_s <= 0) timeout_s = 60;
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) < 0) return fg_error(FG_EIO, "requeue: pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0) {
        close(pfd[0]);
        close(pfd[1]);
        return fg_error(FG_EIO, "requeue: fork: %s", strerror(errno));
    }
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        dup2(pfd[1], 1);
        dup2(pfd[1], 2);
        execlp(exe, exe, "requeue", id, (char *)NULL);
        dprintf(2, "cannot run %s: %s", exe, strerror(errno));
        _exit(127);
    }
    close(pfd[1]);
    fcntl(pfd[0], F_SETFL, O_NONBLOCK);
    char out[512] = "";
    size_t n = 0;
    double t0 = fg_time();
    int st = 0;
    for (;;) {
        ssize_t r = read(pfd[0], out + n, sizeof out - 1 - n);
        if (r > 0) n += (size_t)r;
        out[n] = 0;
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) break;
        if (fg_time() - t0 > timeout_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            close(pfd[0]);
            return fg_error(FG_ETIMEOUT, "requeue: %s requeue %s did not end within %.3g s", exe,
                            id, timeout_s);
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    ssize_t r;
    while (n < sizeof out - 1 && (r = read(pfd[0], out + n, sizeof out - 1 - n)) > 0)
        n += (size_t)r;
    out[n] = 0;
    close(pfd[0]);
    out[strcspn(out, "\n")] = 0;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return fg_error(FG_EIO,
                        "requeue: %s requeue %s failed (%s %d)%s%s: the checkpoint is "
                        "saved; submit the job again to resume it",
                        exe, id, WIFEXITED(st) ? "exit" : "signal",
                        WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), out[0] ? ": " : "", out);
    return FG_OK;
}
