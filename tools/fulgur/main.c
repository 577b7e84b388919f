/* fulgur: dispatches to the subcommands of cli.h; a command whose output
 * did not all reach stdout fails (cli_check_stdout). */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
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

/* "stdout (/dev/full)": what stdout is, where Linux says */
static const char *stdout_name(char *buf, size_t cap) {
    char target[512];
    ssize_t n = readlink("/proc/self/fd/1", target, sizeof target - 1);
    if (n <= 0) return "stdout";
    target[n] = '\0';
    snprintf(buf, cap, "stdout (%s)", target);
    return buf;
}

static pid_t g_main_pid;

bool cli_in_forked_rank(void) { return g_main_pid && getpid() != g_main_pid; }

int cli_check_stdout(bool report) {
    static bool said;
    int e = fflush(stdout) != 0 ? errno : 0;
    if (!ferror(stdout)) return FG_EXIT_OK;
    if (!said) {
        char name[600], why[800];
        snprintf(why, sizeof why, "%s: write failed%s%s; the output is incomplete",
                 stdout_name(name, sizeof name), e ? ": " : "", e ? strerror(e) : "");
        if (report) cli_error("%s", why);
        else fg_error(FG_EIO, "%s", why);
    }
    said = true;
    return FG_EXIT_FAIL;
}

/* The command's exit code, made a failure (unless it is one already) when
 * its output did not all reach stdout: checked by the flush, and by the
 * close that reports what only the close learns (as gnulib's close_stdout). */
static int finish(int rc) {
    int wrc = cli_check_stdout(true);
    if (!wrc && fclose(stdout) != 0) {
        char name[600];
        int e = errno;
        cli_error("%s: closing failed: %s; the output may be incomplete",
                  stdout_name(name, sizeof name), strerror(e));
        wrc = FG_EXIT_FAIL;
    }
    return rc == FG_EXIT_OK ? wrc : rc;
}

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} k_cmds[] = {
    {"fit", cmd_fit, "train a built-in model (gpt, mlp, resnet, vit, lstm) on a data file"},
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
    g_main_pid = getpid();
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return finish(argc < 2 ? FG_EXIT_USAGE : FG_EXIT_OK);
    }
    if (!strcmp(argv[1], "--version")) {
        printf("fulgur %s\n", fg_version());
        return finish(FG_EXIT_OK);
    }
    for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++) {
        if (strcmp(argv[1], k_cmds[i].name)) continue;
        return finish(k_cmds[i].fn(argc - 1, argv + 1));
    }
    cli_error("unknown command \"%s\"", argv[1]);
    usage(stderr);
    return finish(FG_EXIT_USAGE);
}
