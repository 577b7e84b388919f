/* launch: FULGUR_KILL_GRACE_S, the grace between SIGTERM and SIGKILL of
 * both launchers, is an error when malformed ("abc", "0", "-1") instead of a
 * silent 3 s; an explicit grace_s or a valid value starts the ranks. */
#include <stdlib.h>

#include "fulgur/launch.h"
#include "harness.h"

static int quiet(int rank, int world, void *arg) {
    (void)rank, (void)world, (void)arg;
    return 0;
}

TEST(malformed_kill_grace_is_an_error_naming_it) {
    static const char *const bad[] = {"abc", "3s", "0", "-1"};
    const char *argv[] = {"true", NULL};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("FULGUR_KILL_GRACE_S", bad[i], 1);
        fg_job *j = fg_job_start(&(fg_job_spec){.argv = argv, .nprocs = 1}, NULL);
        CHECK_MSG(j == NULL, "job started with FULGUR_KILL_GRACE_S=%s", bad[i]);
        fg_job_free(j);
        CHECK(fg_last_status() == FG_EINVAL);
        CHECK_CONTAINS(fg_last_error(), "FULGUR_KILL_GRACE_S=");
        CHECK_CONTAINS(fg_last_error(), bad[i]);
        CHECK_STATUS(fg_launch_fork(1, quiet, NULL, NULL, NULL), FG_EINVAL);
        CHECK_CONTAINS(fg_last_error(), "FULGUR_KILL_GRACE_S=");
    }
    /* an explicit grace is not the variable's */
    setenv("FULGUR_KILL_GRACE_S", "abc", 1);
    CHECK_OK(fg_launch_fork(1, quiet, NULL, &(fg_fork_opts){.grace_s = 1}, NULL));
    setenv("FULGUR_KILL_GRACE_S", "0.5", 1);
    fg_job *j = fg_job_start(&(fg_job_spec){.argv = argv, .nprocs = 1}, NULL);
    CHECK_MSG(j != NULL, "fg_job_start: %s", fg_last_error());
    if (j) CHECK_OK(fg_job_wait(j, -1));
    fg_job_free(j);
    CHECK_OK(fg_launch_fork(1, quiet, NULL, NULL, NULL));
    unsetenv("FULGUR_KILL_GRACE_S");
}
