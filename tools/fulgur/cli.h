/* The fulgur command-line tool: one file per subcommand, each a
 * `int cmd_NAME(int argc, char **argv)` (argv[0] is the subcommand) that
 * returns the process exit code: 0 success, 1 failure while running, 2 bad
 * usage (unknown flag, bad value, missing file), printed before any work,
 * 75 stopped by a signal with a checkpoint to resume from (fulgur fit). */
#ifndef FULGUR_CLI_H
#define FULGUR_CLI_H

#include <fulgur/fulgur.h>

#define FG_EXIT_OK 0
#define FG_EXIT_FAIL 1
#define FG_EXIT_USAGE 2
/* stopped on a signal with a checkpoint to resume from (sysexits' EX_TEMPFAIL) */
#define FG_EXIT_RESUMABLE 75

int cmd_fit(int argc, char **argv);
int cmd_validate(int argc, char **argv);
int cmd_test(int argc, char **argv);
int cmd_predict(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_env(int argc, char **argv);
int cmd_ckpt(int argc, char **argv);
int cmd_sample(int argc, char **argv);

/* "fulgur: " + message on stderr. */
void cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Whether everything written to stdout so far reached it: flushes, then
 * returns 0, or FG_EXIT_FAIL with "stdout (/dev/full): write failed: ...;
 * the output is incomplete" said once per process: on stderr when `report`,
 * else left in fg_last_error (FG_EIO) for the caller to report. So lost
 * output is never an exit 0. main() checks at the end of every command; a
 * rank that is a forked child (it leaves by _exit) checks itself. */
int cli_check_stdout(bool report);
/* Whether this process is a rank forked from the one main() started (it
 * leaves by _exit, so main()'s checks do not run in it). */
bool cli_in_forked_rank(void);

#endif
