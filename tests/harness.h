/* The test harness: one header, one executable per test file.
 *
 *   #include "harness.h"
 *   TEST(adds) { CHECK(1 + 1 == 2); CHECK_CLOSE(x, 1.0, 1e-6, 0); }
 *
 * Tests register themselves; main runs those whose name contains argv[1]
 * (all without an argument) and ends with the line
 * "N passed, N failed, N skipped". Exit status is 0 only with no failure.
 * fg_test_fork_ranks runs a function in N forked processes (multi-rank
 * tests), killing them all after a timeout. */
#ifndef FULGUR_TEST_HARNESS_H
#define FULGUR_TEST_HARNESS_H

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fulgur/core.h"

typedef void (*fg_test_fn)(void);
typedef struct {
    const char *name;
    fg_test_fn fn;
} fg_test_entry;

static fg_test_entry fg_tests_[512];
static int fg_ntests_;
static int fg_cur_failed_, fg_cur_skipped_;
static long fg_checks_failed_total_;

static inline void fg_test_register_(const char *name, fg_test_fn fn) {
    if (fg_ntests_ < 512) fg_tests_[fg_ntests_++] = (fg_test_entry){name, fn};
}

#define TEST(name)                                                                                 \
    static void test_##name(void);                                                                 \
    __attribute__((constructor)) static void reg_##name(void) {                                    \
        fg_test_register_(#name, test_##name);                                                     \
    }                                                                                              \
    static void test_##name(void)

#define FG_FAIL_(...)                                                                              \
    do {                                                                                           \
        fprintf(stderr, "  FAIL %s:%d: ", __FILE__, __LINE__);                                     \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        fg_cur_failed_++;                                                                          \
        fg_checks_failed_total_++;                                                                 \
    } while (0)

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) FG_FAIL_("CHECK(%s)", #cond);                                                 \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond)) FG_FAIL_(__VA_ARGS__);                                                        \
    } while (0)

/* Checks that an fg_status expression is FG_OK, printing fg_last_error(). */
#define CHECK_OK(expr)                                                                             \
    do {                                                                                           \
        fg_status s_ = (expr);                                                                     \
        if (s_ != FG_OK) FG_FAIL_("%s -> %s: %s", #expr, fg_status_str(s_), fg_last_error());      \
    } while (0)

/* Checks that an expression returns a given status (and a message was left). */
#define CHECK_STATUS(expr, want)                                                                   \
    do {                                                                                           \
        fg_status s_ = (expr);                                                                     \
        if (s_ != (want))                                                                          \
            FG_FAIL_("%s -> %s, want %s (%s)", #expr, fg_status_str(s_), fg_status_str(want),      \
                     fg_last_error());                                                             \
    } while (0)

/* |a - b| <= atol + rtol * |b|, NaN never passes. */
#define CHECK_CLOSE(a, b, rtol, atol)                                                              \
    do {                                                                                           \
        double a_ = (double)(a), b_ = (double)(b);                                                 \
        if (!(fabs(a_ - b_) <= (atol) + (rtol)*fabs(b_)))                                          \
            FG_FAIL_("CHECK_CLOSE(%s, %s): %.10g vs %.10g (rtol %g, atol %g)", #a, #b, a_, b_,     \
                     (double)(rtol), (double)(atol));                                              \
    } while (0)

/* Checks that a string contains a substring (error messages). */
#define CHECK_CONTAINS(hay, needle)                                                                \
    do {                                                                                           \
        const char *h_ = (hay);                                                                    \
        if (!h_ || !strstr(h_, (needle)))                                                          \
            FG_FAIL_("\"%s\" does not contain \"%s\"", h_ ? h_ : "(null)", (needle));              \
    } while (0)

#define SKIP(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "  SKIP: ");                                                               \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        fg_cur_skipped_ = 1;                                                                       \
        return;                                                                                    \
    } while (0)

/* Runs fn(rank, n, arg) in n forked children. Each child exits with fn's
 * return value (0 = passed); a child still running after timeout_s is
 * killed and counts as failed. Returns the number of failed children and
 * reports each one. */
static inline int fg_test_fork_ranks(int n, int (*fn)(int rank, int n, void *arg), void *arg,
                                     double timeout_s) {
    pid_t pids[64];
    int failed = 0;
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < n && r < 64; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            fg_cur_failed_ = 0;
            int rc = fn(r, n, arg);
            fflush(stdout);
            fflush(stderr);
            _exit(rc != 0 || fg_cur_failed_ ? 1 : 0);
        }
    }
    double t0 = fg_time();
    int left = n;
    int done[64] = {0};
    while (left > 0) {
        for (int r = 0; r < n; r++) {
            if (done[r]) continue;
            int st;
            pid_t p = waitpid(pids[r], &st, WNOHANG);
            if (p == pids[r]) {
                done[r] = 1;
                left--;
                if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                    failed++;
                    if (WIFSIGNALED(st))
                        fprintf(stderr, "  rank %d killed by signal %d\n", r, WTERMSIG(st));
                    else fprintf(stderr, "  rank %d exited with %d\n", r, WEXITSTATUS(st));
                }
            }
        }
        if (left && fg_time() - t0 > timeout_s) {
            for (int r = 0; r < n; r++)
                if (!done[r]) {
                    fprintf(stderr, "  rank %d still running after %.0f s: killed\n", r, timeout_s);
                    kill(pids[r], SIGKILL);
                    waitpid(pids[r], NULL, 0);
                    done[r] = 1;
                    failed++;
                    left--;
                }
        }
        if (left) usleep(2000);
    }
    return failed;
}

/* A path under the source tree's tests/ folder (tests run from there). */
static inline const char *fg_test_path(const char *rel) {
    static char buf[4096];
    const char *src = getenv("FULGUR_SOURCE_DIR");
    if (src) snprintf(buf, sizeof buf, "%s/tests/%s", src, rel);
    else snprintf(buf, sizeof buf, "%s", rel);
    return buf;
}

#ifndef FG_HARNESS_NO_MAIN
int main(int argc, char **argv) {
    const char *filter = argc > 1 ? argv[1] : NULL;
    int passed = 0, failed = 0, skipped = 0;
    for (int i = 0; i < fg_ntests_; i++) {
        if (filter && !strstr(fg_tests_[i].name, filter)) continue;
        fg_cur_failed_ = 0;
        fg_cur_skipped_ = 0;
        double t0 = fg_time();
        fg_tests_[i].fn();
        double dt = fg_time() - t0;
        if (fg_cur_failed_) {
            failed++;
            printf("FAIL %s (%.2f s)\n", fg_tests_[i].name, dt);
        } else if (fg_cur_skipped_) {
            skipped++;
            printf("skip %s\n", fg_tests_[i].name);
        } else {
            passed++;
            printf("ok   %s (%.2f s)\n", fg_tests_[i].name, dt);
        }
        fflush(stdout);
    }
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
#endif

#endif
