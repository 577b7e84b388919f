/* Command-line flags for the fulgur subcommands: a table of flags, each with
 * its type, destination, default (as the user would type it) and help, so
 * that parsing, --help and the error messages come from one place.
 *
 * Accepted forms: "--name value" and "--name=value"; a bool flag takes no
 * value ("--flag") or an explicit one ("--flag=true|false|1|0", or the
 * words true and false as the next argument: "--flag false"); an int flag
 * with a `bare` value may be given alone. Every error
 * names the flag and the bad value and is printed by cli_flags_parse, which
 * then returns FG_EXIT_USAGE (2). */
#ifndef FULGUR_CLI_FLAGS_H
#define FULGUR_CLI_FLAGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum cli_flag_type {
    CLI_STR,    /* const char ** (points into argv, or the default literal) */
    CLI_INT,    /* int64_t * */
    CLI_DOUBLE, /* double * */
    CLI_BOOL,   /* bool * */
    CLI_SECTION /* not a flag: a heading in --help (name is the heading) */
} cli_flag_type;

typedef struct cli_flag {
    const char *name; /* without the leading "--" */
    cli_flag_type type;
    void *dst;
    const char *def;            /* default as text ("" or NULL = none); written to dst first */
    const char *help;           /* one line; may mention valid values */
    int64_t min, max;           /* CLI_INT: inclusive range when min < max */
    const char *const *choices; /* CLI_STR: NULL-terminated valid values, or NULL */
    const char *alias;          /* another accepted name (an older one), or NULL */
    /* CLI_INT: the value of the flag given bare ("--fast-dev-run", Lightning's
     * True), taken unless the next argument is an integer; "true" and "false"
     * then read as this and "0". NULL: a value is required. */
    const char *bare;
    bool seen; /* set by the parser when given on the command line */
} cli_flag;

/* A row of a command's flag table, a `static const` array: a cli_flag whose
 * destination is the offset of a field of the command's options struct. */
typedef struct cli_flag_def {
    const char *name;
    cli_flag_type type;
    size_t off; /* offsetof(options, field); unused by a CLI_SECTION */
    const char *def, *help;
    int64_t min, max;
    const char *const *choices;
    const char *alias, *bare;
} cli_flag_def;

/* The rows of a table. */
#define CLI_COUNT(table) ((int)(sizeof(table) / sizeof((table)[0])))

/* The flags of defs[0..n) over the options at opts, into out[0..n) (each
 * dst = opts + off; not seen). */
void cli_flags_bind(const cli_flag_def *defs, int n, void *opts, cli_flag *out);

/* Sets every flag to its default, then parses argv[1..argc) (argv[0] is the
 * subcommand). Positional arguments (not starting with "--") go to
 * positional[0..*npositional) up to max_positional; more is an error.
 * "--help" / "-h" prints the help to stdout and returns -1 (the caller exits
 * 0). Returns 0 on success, FG_EXIT_USAGE after printing the error. */
int cli_flags_parse(cli_flag *flags, int nflags, int argc, char **argv, const char *usage,
                    const char **positional, int max_positional, int *npositional);

/* Whether v is a valid value of flag f (its type, range and choices), as
 * the parser would judge it; on false, err holds why, naming the flag
 * ("--name=\"v\": expected ..."). Sets nothing. */
bool cli_flag_check(const cli_flag *f, const char *v, char *err, size_t cap);

/* Prints "usage: ...", then every flag with its default and help. */
void cli_flags_help(FILE *out, const cli_flag *flags, int nflags, const char *usage);

/* Given (on the command line or in a --config file) with a value other
 * than its default: a settings file written by --print-config holds every
 * flag at its default, which says nothing, so the checks that refuse a flag
 * in a setting ask this, not `seen`. */
bool cli_flag_given(const cli_flag *f);

/* The flag called name (without "--"), or NULL. */
cli_flag *cli_flags_find(cli_flag *flags, int nflags, const char *name);

/* Strict number parsing shared by the commands: the whole string must be a
 * number. Return false on junk, overflow or an empty string. */
bool cli_parse_int(const char *s, int64_t *out);
bool cli_parse_double(const char *s, double *out);

/* A numeric environment variable: unset or empty leaves *out = def and
 * returns true; a malformed value prints "NAME=\"value\": expected ..." with
 * cli_error and returns false (the caller exits FG_EXIT_USAGE). */
bool cli_env_double(const char *name, double def, double *out);
bool cli_env_int(const char *name, int64_t def, int64_t *out);

/* Edit distance (Levenshtein) of two short strings (99 beyond 63
 * characters), for "did you mean". */
int cli_edit_distance(const char *a, const char *b);

#endif
