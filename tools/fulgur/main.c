/* fulgur: dispatches to the subcommands of cli.h. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

void cli_error(const char *fmt, ...) {
    /* one write(2) for the whole line: ranks that share a stderr print at
     * once, and three writes (prefix, message, newline) would splice */
    char small[4096], *line = small;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small + 8, sizeof small - 9, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof small - 9) {
        line = malloc((size_t)n + 10);
        if (!line) return;
        va_start(ap, fmt);
        vsnprintf(line + 8, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    memcpy(line, "fulgur: ", 8);
    line[8 + n] = '\n';
    fflush(stderr);
    size_t left = (size_t)n + 9;
    for (const char *p = line; left > 0;) {
        ssize_t w = write(STDERR_FILENO, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        p += w;
        left -= (size_t)w;
    }
    if (line != small) free(line);
}

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} k_cmds[] = {
    {"fit", cmd_fit, "train a built-in model (gpt, mlp) on a data file"},
    {"validate", cmd_validate, "the validation loss of a checkpoint (--ckpt-path)"},
    {"test", cmd_test, "the test loss of a checkpoint on --test-data"},
    {"predict", cmd_predict, "write a checkpoint's predictions to a file"},
    {"run", cmd_run, "launch a program on N ranks (torchrun's job)"},
    {"sample", cmd_sample, "generate text from a trained GPT checkpoint"},
    {"ckpt", cmd_ckpt, "inspect and compare checkpoints (show, diff)"},
    {"env", cmd_env, "print what fulgur detects: cores, cluster, backends"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: fulgur COMMAND [ARGS...]   (fulgur COMMAND --help for its flags)\n\n");
    for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++)
        fprintf(f, "  %-8s %s\n", k_cmds[i].name, k_cmds[i].help);
    fprintf(f, "\nfulgur %s\n", fg_version());
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? FG_EXIT_USAGE : FG_EXIT_OK;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("fulgur %s\n", fg_version());
        return FG_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++) {
        if (strcmp(argv[1], k_cmds[i].name)) continue;
        return k_cmds[i].fn(argc - 1, argv + 1);
    }
    cli_error("unknown command \"%s\"", argv[1]);
    usage(stderr);
    return FG_EXIT_USAGE;
}
