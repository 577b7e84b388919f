/* fulgur fit --config FILE and --print-config: LightningCLI's YAML config
 * over fit's flag table. The file's settings become flags placed before
 * the command line's, so the flag parser stays the one judge of values and
 * a flag given on the command line wins over the file. */
#ifndef FULGUR_FIT_CONFIG_H
#define FULGUR_FIT_CONFIG_H

#include <stdio.h>

#include "cli_flags.h"

/* Reads every --config FILE (or --config=FILE) of argv, in order, and
 * replaces *argc and *argv with argv[0], the files' settings as "--flag=value",
 * then argv[1..]. The new array and its strings live until the process
 * ends (flag values point into them). Returns 0 (argv untouched without
 * --config), or FG_EXIT_USAGE after printing the error: a file that cannot
 * be read, malformed YAML (line and column), an unknown section or key
 * (named with its section and the nearest valid one), a value of the wrong
 * shape or that its flag refuses, a key given twice in one file, a second
 * document, a file past 16 MiB or nested past 64 levels. */
int fit_config_expand(cli_flag *flags, int nflags, int *argc, char ***argv);

/* Writes the settings in flags (their current values) as a config file
 * that --config reads back: top-level seed_everything and ckpt_path, then
 * the trainer:, model:, data: and optimizer: sections. */
void fit_config_print(FILE *out, cli_flag *flags, int nflags);

#endif
