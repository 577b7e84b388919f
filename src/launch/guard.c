/* The guard of a supervised job: a small process that outlives a launcher
 * killed with SIGKILL just long enough to end what its ranks started.
 *
 * PR_SET_PDEATHSIG kills each rank when the launcher dies, but not what a
 * rank started in turn (the children of `fulgur run ./train.sh`), which
 * sit in the rank's process group. The guard is forked before the ranks;
 * the launcher sends it each rank's process group id through a pipe whose
 * write end only the launcher holds (close-on-exec). When the job ends
 * normally the launcher sends 0 and the guard exits at once; when the
 * launcher dies, the guard reads end-of-file and sends SIGKILL to every
 * group it was told of. A process group id cannot be given to a new process
 * while the group has members, so the signal reaches that group or no one.
 *
 * The guard runs only async-signal-safe calls (it is forked from a
 * threaded process), ignores the terminal's signals (Ctrl-C reaches the
 * launcher's group, which it shares) and holds no descriptor but its pipe. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launch_impl.h"

static void guard_main(int rfd) {
    static const int k_ignore[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGUSR1, SIGUSR2};
    struct sigaction ign = {.sa_handler = SIG_IGN};
    for (size_t k = 0; k < sizeof k_ignore / sizeof k_ignore[0]; k++)
        sigaction(k_ignore[k], &ign, NULL);
    prctl(PR_SET_NAME, "fulgur-guard");
    if (rfd != 3) {
        dup2(rfd, 3);
        rfd = 3;
    }
    int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    for (int fd = 0; fd < 3; fd++)
        if (devnull >= 0) dup2(devnull, fd);
    if (close_range(4, ~0u, 0) != 0)
        for (int fd = 4; fd < 4096; fd++) close(fd);
    static int32_t groups[FG_DEVICES_MAX];
    int n = 0;
    for (;;) {
        int32_t v;
        ssize_t r = read(rfd, &v, sizeof v);
        if (r < 0 && errno == EINTR) continue;
        if (r == (ssize_t)sizeof v && v == 0) _exit(0); /* the job ended: nothing to do */
        if (r == (ssize_t)sizeof v) {
            if (n < FG_DEVICES_MAX) groups[n++] = v;
            continue;
        }
        break; /* end of file: the launcher died */
    }
    for (int i = 0; i < n; i++) kill(-groups[i], SIGKILL);
    _exit(0);
}

int fg__guard_start(pid_t *guard_pid) {
    *guard_pid = -1;
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        close(fds[1]);
        guard_main(fds[0]);
    }
    close(fds[0]);
    *guard_pid = pid;
    return fds[1];
}

void fg__guard_add(int wfd, int pgid) {
    if (wfd < 0 || pgid <= 0) return;
    int32_t v = pgid;
    ssize_t w;
    do w = write(wfd, &v, sizeof v);
    while (w < 0 && errno == EINTR);
}

void fg__guard_release(int wfd, pid_t guard_pid) {
    if (wfd < 0) return;
    int32_t zero = 0;
    ssize_t w;
    do w = write(wfd, &zero, sizeof zero);
    while (w < 0 && errno == EINTR);
    close(wfd);
    /* it exits as soon as it reads the 0 (ECHILD: a waitpid(-1) of the
     * program took it already) */
    while (guard_pid > 0 && waitpid(guard_pid, NULL, 0) < 0 && errno == EINTR) {
    }
}
