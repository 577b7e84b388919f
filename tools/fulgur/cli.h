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

#endif
