/* Flag tables for the subcommands: defaults, parsing, --help and usage
 * errors. A flag's value is written only after it parsed whole, so a failed
 * parse leaves the defaults of the flags not yet reached. */
#include "cli_flags.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

bool cli_parse_int(const char *s, int64_t *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end) return false;
    *out = v;
    return true;
}

bool cli_parse_double(const char *s, double *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v)) return false;
    *out = v;
    return true;
}

bool cli_env_double(const char *name, double def, double *out) {
    const char *v = getenv(name);
    *out = def;
    if (!v || !*v) return true;
    if (!cli_parse_double(v, out)) {
        cli_error("%s=\"%s\": expected a number (unset it for the default)", name, v);
        return false;
    }
    return true;
}

bool cli_env_int(const char *name, int64_t def, int64_t *out) {
    const char *v = getenv(name);
    *out = def;
    if (!v || !*v) return true;
    if (!cli_parse_int(v, out)) {
        cli_error("%s=\"%s\": expected an integer (unset it for the default)", name, v);
        return false;
    }
    return true;
}

int cli_edit_distance(const char *a, const char *b) {
    int la = (int)strlen(a), lb = (int)strlen(b);
    if (la > 63 || lb > 63) return 99;
    int row[64];
    for (int j = 0; j <= lb; j++) row[j] = j;
    for (int i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = i;
        for (int j = 1; j <= lb; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

/* typed: the flag as the user wrote it ("-x", "--lrr"); name: without the
 * dashes, for the nearest valid flag. */
static void unknown_flag(const cli_flag *flags, int nflags, const char *typed, const char *name,
                         const char *usage) {
    const char *best = NULL;
    int bd = 99;
    for (int i = 0; i < nflags; i++) {
        if (flags[i].type == CLI_SECTION) continue;
        int d = cli_edit_distance(name, flags[i].name);
        if (d < bd) bd = d, best = flags[i].name;
    }
    /* the command's name: usage up to its first argument ("fulgur fit --model ...") */
    int cmdlen = 0;
    for (const char *p = usage; *p && *p != '-' && *p != '[' && !(*p >= 'A' && *p <= 'Z'); p++)
        cmdlen++;
    while (cmdlen > 0 && usage[cmdlen - 1] == ' ') cmdlen--;
    if (best && bd <= 3 && bd < (int)strlen(name))
        cli_error("unknown flag \"%s\"; did you mean --%s? (%.*s --help lists them)", typed, best,
                  cmdlen, usage);
    else cli_error("unknown flag \"%s\" (%.*s --help lists them)", typed, cmdlen, usage);
}

bool cli_flag_given(const cli_flag *f) {
    if (!f || !f->seen) return false;
    const char *def = f->def ? f->def : "";
    switch (f->type) {
    case CLI_STR: {
        const char *v = *(const char *const *)f->dst;
        return v ? strcmp(v, def) != 0 : def[0] != '\0';
    }
    case CLI_INT: {
        int64_t d = 0;
        return !cli_parse_int(def, &d) || *(const int64_t *)f->dst != d;
    }
    case CLI_DOUBLE: {
        double d = 0;
        return !cli_parse_double(def, &d) || *(const double *)f->dst != d;
    }
    case CLI_BOOL: return *(const bool *)f->dst != (!strcmp(def, "true") || !strcmp(def, "1"));
    default: return false;
    }
}

void cli_flags_bind(const cli_flag_def *defs, int n, void *opts, cli_flag *out) {
    for (int i = 0; i < n; i++) {
        const cli_flag_def *d = &defs[i];
        out[i] = (cli_flag){.name = d->name,
                            .type = d->type,
                            .dst = d->type == CLI_SECTION ? NULL : (char *)opts + d->off,
                            .def = d->def,
                            .help = d->help,
                            .min = d->min,
                            .max = d->max,
                            .choices = d->choices,
                            .alias = d->alias,
                            .bare = d->bare};
    }
}

cli_flag *cli_flags_find(cli_flag *flags, int nflags, const char *name) {
    for (int i = 0; i < nflags; i++)
        if (flags[i].type != CLI_SECTION &&
            (!strcmp(flags[i].name, name) || (flags[i].alias && !strcmp(flags[i].alias, name))))
            return &flags[i];
    return NULL;
}

static const char *type_word(const cli_flag *f) {
    switch (f->type) {
    case CLI_INT: return "N";
    case CLI_DOUBLE: return "X";
    case CLI_STR: return "S";
    default: return "";
    }
}

/* Parses v for flag f into dst (f->dst's type); on a bad value writes why
 * into err ("--name=\"v\": expected ...") and returns false. */
static bool parse_value(const cli_flag *f, const char *v, void *dst, char *err, size_t cap) {
    switch (f->type) {
    case CLI_STR:
        if (f->choices && v && *v) {
            bool ok = false;
            for (const char *const *c = f->choices; *c; c++) ok = ok || !strcmp(*c, v);
            if (!ok) {
                char list[512] = "";
                for (const char *const *c = f->choices; *c; c++) {
                    if (c != f->choices) strncat(list, ", ", sizeof list - strlen(list) - 1);
                    strncat(list, *c, sizeof list - strlen(list) - 1);
                }
                /* the nearest choice, when one is near */
                const char *best = NULL;
                int bd = 99;
                for (const char *const *c = f->choices; *c; c++) {
                    int d = cli_edit_distance(v, *c);
                    if (d < bd) bd = d, best = *c;
                }
                if (best && bd <= 3 && bd < (int)strlen(v))
                    snprintf(err, cap, "--%s=\"%s\": expected one of %s; did you mean %s?", f->name,
                             v, list, best);
                else snprintf(err, cap, "--%s=\"%s\": expected one of %s", f->name, v, list);
                return false;
            }
        }
        *(const char **)dst = v;
        return true;
    case CLI_INT: {
        int64_t x;
        if (f->bare && v && !strcmp(v, "true")) v = f->bare;
        else if (f->bare && v && !strcmp(v, "false")) v = "0";
        if (!cli_parse_int(v, &x)) {
            snprintf(err, cap, "--%s=\"%s\": expected an integer", f->name, v ? v : "");
            return false;
        }
        if (f->min < f->max && (x < f->min || x > f->max)) {
            snprintf(err, cap, "--%s=%lld: expected an integer in [%lld, %lld]", f->name,
                     (long long)x, (long long)f->min, (long long)f->max);
            return false;
        }
        *(int64_t *)dst = x;
        return true;
    }
    case CLI_DOUBLE: {
        double x;
        if (!cli_parse_double(v, &x)) {
            snprintf(err, cap, "--%s=\"%s\": expected a number", f->name, v ? v : "");
            return false;
        }
        *(double *)dst = x;
        return true;
    }
    case CLI_BOOL:
        if (!v || !strcmp(v, "true") || !strcmp(v, "1")) *(bool *)dst = true;
        else if (!strcmp(v, "false") || !strcmp(v, "0")) *(bool *)dst = false;
        else {
            snprintf(err, cap, "--%s=\"%s\": expected true or false", f->name, v);
            return false;
        }
        return true;
    default: return true;
    }
}

bool cli_flag_check(const cli_flag *f, const char *v, char *err, size_t cap) {
    union {
        const char *s;
        int64_t i;
        double d;
        bool b;
    } scratch;
    return parse_value(f, v, &scratch, err, cap);
}

/* Sets one flag from text; prints the error and returns false on a bad value. */
static bool set_value(cli_flag *f, const char *v, bool from_default) {
    char err[1024];
    if (parse_value(f, v, f->dst, err, sizeof err)) return true;
    cli_error("%s%s", from_default ? "default of " : "", err);
    return false;
}

void cli_flags_help(FILE *out, const cli_flag *flags, int nflags, const char *usage) {
    fprintf(out, "usage: %s\n", usage);
    for (int i = 0; i < nflags; i++) {
        const cli_flag *f = &flags[i];
        if (f->type == CLI_SECTION) {
            fprintf(out, "\n%s:\n", f->name);
            continue;
        }
        char head[64], text[1024];
        snprintf(head, sizeof head, "--%s %s", f->name, type_word(f));
        size_t n = (size_t)snprintf(text, sizeof text, "%s", f->help);
        if (f->choices && n < sizeof text) {
            n += (size_t)snprintf(text + n, sizeof text - n, " (");
            for (const char *const *c = f->choices; *c && n < sizeof text; c++)
                n += (size_t)snprintf(text + n, sizeof text - n, "%s%s",
                                      c == f->choices ? "" : ", ", *c);
            if (n < sizeof text) n += (size_t)snprintf(text + n, sizeof text - n, ")");
        }
        if (f->alias && n < sizeof text)
            n += (size_t)snprintf(text + n, sizeof text - n, " (also --%s)", f->alias);
        if (f->def && *f->def && n < sizeof text)
            snprintf(text + n, sizeof text - n, " [default: %s]", f->def);
        /* wrap the text at 100 columns under its own indent */
        fprintf(out, "  %-30s ", head);
        int col = 33;
        for (const char *w = text; *w;) {
            while (*w == ' ') w++;
            int len = (int)strcspn(w, " ");
            if (col > 33 && col + 1 + len > 100) {
                fprintf(out, "\n%33s", "");
                col = 33;
            }
            fprintf(out, "%s%.*s", col > 33 ? " " : "", len, w);
            col += len + (col > 33);
            w += len;
        }
        fputc('\n', out);
    }
}

int cli_flags_parse(cli_flag *flags, int nflags, int argc, char **argv, const char *usage,
                    const char **positional, int max_positional, int *npositional) {
    int npos = 0;
    for (int i = 0; i < nflags; i++) {
        cli_flag *f = &flags[i];
        f->seen = false;
        if (f->type == CLI_SECTION) continue;
        if (f->type == CLI_BOOL && !(f->def && *f->def)) {
            *(bool *)f->dst = false;
            continue;
        }
        if (f->type == CLI_STR && !(f->def && *f->def)) {
            *(const char **)f->dst = NULL;
            continue;
        }
        if (!set_value(f, f->def, true)) return FG_EXIT_USAGE;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            cli_flags_help(stdout, flags, nflags, usage);
            return -1;
        }
        if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
            if (!strcmp(a, "--")) continue;
            if (a[0] == '-' && a[1] != '\0' && !positional) {
                unknown_flag(flags, nflags, a, a + 1, usage);
                return FG_EXIT_USAGE;
            }
            if (npos >= max_positional) {
                cli_error("unexpected argument \"%s\" (see --help)", a);
                return FG_EXIT_USAGE;
            }
            positional[npos++] = a;
            continue;
        }
        char name[128];
        const char *eq = strchr(a + 2, '=');
        size_t len = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
        if (len >= sizeof name) len = sizeof name - 1;
        memcpy(name, a + 2, len);
        name[len] = '\0';
        cli_flag *f = cli_flags_find(flags, nflags, name);
        if (!f) {
            char typed[140];
            snprintf(typed, sizeof typed, "--%s", name);
            unknown_flag(flags, nflags, typed, name, usage);
            return FG_EXIT_USAGE;
        }
        const char *v = eq ? eq + 1 : NULL;
        int64_t next;
        if (!v && f->type == CLI_INT && f->bare &&
            (i + 1 >= argc || !cli_parse_int(argv[i + 1], &next)))
            v = f->bare;
        /* "--flag false" as "--flag=false"; only the words true and false are
         * taken, so that a bare bool flag before a positional or a flag
         * still means true */
        if (!v && f->type == CLI_BOOL && i + 1 < argc &&
            (!strcmp(argv[i + 1], "true") || !strcmp(argv[i + 1], "false")))
            v = argv[++i];
        if (!v && f->type != CLI_BOOL) {
            if (i + 1 >= argc) {
                cli_error("--%s needs a value", name);
                return FG_EXIT_USAGE;
            }
            v = argv[++i];
        }
        if (!set_value(f, v, false)) return FG_EXIT_USAGE;
        f->seen = true;
    }
    if (npositional) *npositional = npos;
    return 0;
}
