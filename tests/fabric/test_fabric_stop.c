/* fabric: resumable stops. fg_fabric_request_stop counts requests (a signal
 * handler's call); fg_fabric_should_stop is false until one rank asked and
 * then true on every rank at the same step: under ddp_spawn on 2 ranks,
 * rank 1 alone asks at step 3 (from its SIGUSR1 handler) and both ranks
 * stop after step 3. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fulgur/fabric.h"
#include "harness.h"

static void clean_env(void) {
    fg_launch_unexport();
    setenv("FULGUR_CPU_DEVICES", "4", 1);
    setenv("FULGUR_NUM_THREADS", "1", 1);
}

static int single_run(fg_fabric *f, void *arg) {
    (void)arg;
    bool stop = true;
    if (fg_fabric_should_stop(f, &stop) != FG_OK || stop) return 1;
    if (fg_fabric_request_stop(f) != 1 || fg_fabric_request_stop(f) != 2) return 2;
    if (fg_fabric_should_stop(f, &stop) != FG_OK || !stop) return 3;
    return 0;
}

TEST(single_counts_and_agrees) {
    clean_env();
    fg_fabric *f = fg_fabric_new(NULL);
    CHECK(f != NULL);
    CHECK(fg_fabric_launch(f, single_run, NULL) == 0);
    CHECK_STATUS(fg_fabric_should_stop(NULL, NULL), FG_EINVAL);
    fg_fabric_free(f);
}

static fg_fabric *g_f;
static void on_usr1(int sig) {
    (void)sig;
    fg_fabric_request_stop(g_f);
}

/* each rank steps until the ranks agree to stop; the step it stopped at is
 * its exit code (10 + step), so the parent sees both */
static int ddp_run(fg_fabric *f, void *arg) {
    (void)arg;
    g_f = f;
    struct sigaction sa = {.sa_handler = on_usr1};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    int rank = fg_fabric_global_rank(f);
    for (int step = 1; step <= 50; step++) {
        if (rank == 1 && step == 3) raise(SIGUSR1);
        bool stop = false;
        if (fg_fabric_should_stop(f, &stop) != FG_OK) return 1;
        if (stop) {
            char path[256];
            snprintf(path, sizeof path, "%s/stop.%d", getenv("FG_TEST_DIR"), rank);
            FILE *o = fopen(path, "w");
            if (!o) return 1;
            fprintf(o, "%d\n", step);
            fclose(o);
            return 0;
        }
    }
    return 1;
}

TEST(ddp_ranks_stop_after_the_same_step) {
    clean_env();
    char dir[] = "/tmp/fg-test-stop.XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    setenv("FG_TEST_DIR", dir, 1);
    fg_fabric *f = fg_fabric_new(&(fg_fabric_config){.devices = "2", .strategy = "ddp_spawn"});
    CHECK(f != NULL);
    CHECK_MSG(fg_fabric_launch(f, ddp_run, NULL) == 0, "%s", fg_last_error());
    fg_fabric_free(f);
    for (int r = 0; r < 2; r++) {
        char path[300];
        snprintf(path, sizeof path, "%s/stop.%d", dir, r);
        FILE *in = fopen(path, "r");
        int step = -1;
        CHECK(in && fscanf(in, "%d", &step) == 1);
        if (in) fclose(in);
        CHECK_MSG(step == 3, "rank %d stopped at step %d, want 3", r, step);
    }
    unsetenv("FG_TEST_DIR");
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}
