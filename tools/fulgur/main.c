/* fulgur: dispatches to the subcommands of cli.h. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

void cli_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("fulgur: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
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
