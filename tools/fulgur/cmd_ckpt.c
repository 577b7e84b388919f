/* fulgur ckpt: inspects safetensors checkpoints.
 *   fulgur ckpt show FILE        tensors (name, dtype, shape), sizes, metadata
 *   fulgur ckpt diff A B         largest |A - B| per tensor and overall, names
 *                                only in one file, metadata that differs
 *   fulgur ckpt consolidate DIR OUT.safetensors
 *                                a sharded checkpoint into one file (OUT new,
 *                                or a regular file with --force; not in DIR)
 * FILE may be a sharded checkpoint's folder, a run's checkpoint folder (its
 * last.safetensors) or the "last" symlink. Reading
 * goes through fg_st_open, which checks the whole header first: a damaged
 * file is reported (exit 1), never trusted. */
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt_paths.h"
#include "cli.h"
#include "cli_flags.h"

static void print_shape(FILE *out, const fg_st_info *in) {
    char buf[256];
    size_t n = 0;
    n += (size_t)snprintf(buf + n, sizeof buf - n, "[");
    for (int d = 0; d < in->ndim && n < sizeof buf - 24; d++)
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%" PRId64, d ? ", " : "", in->shape[d]);
    snprintf(buf + n, sizeof buf - n, "]");
    fprintf(out, "%-18s", buf);
}

static void print_value(const char *v, bool full) {
    size_t len = strlen(v);
    if (full || len <= 100) {
        printf("%s\n", v);
        return;
    }
    printf("%.100s... (%zu bytes; --full shows all)\n", v, len);
}

static int open_ckpt(const char *arg, fg_st_file **f, char *path, size_t cap) {
    if (ckpt_resolve(arg, NULL, path, cap) != 0) return FG_EXIT_USAGE;
    if (!(*f = fg_st_open(path))) {
        cli_error("%s", fg_last_error());
        return FG_EXIT_FAIL;
    }
    return 0;
}

typedef struct show_opts {
    bool full;
} show_opts;

static const cli_flag_def k_show_flags[] = {
    {.name = "full",
     .type = CLI_BOOL,
     .off = offsetof(show_opts, full),
     .help = "print long metadata values whole"},
};

static int ckpt_show(int argc, char **argv) {
    show_opts o = {0};
    cli_flag flags[CLI_COUNT(k_show_flags)];
    cli_flags_bind(k_show_flags, CLI_COUNT(k_show_flags), &o, flags);
    const char *pos[1];
    int npos = 0;
    int rc = cli_flags_parse(flags, CLI_COUNT(k_show_flags), argc, argv,
                             "fulgur ckpt show FILE [--full]", pos, 1, &npos);
    if (rc) return rc < 0 ? FG_EXIT_OK : rc;
    if (npos != 1) {
        cli_error("ckpt show: expected one checkpoint FILE (or a folder holding last.safetensors)");
        return FG_EXIT_USAGE;
    }
    fg_st_file *f;
    char path[4096];
    if ((rc = open_ckpt(pos[0], &f, path, sizeof path))) return rc;

    int64_t n = fg_st_count(f), numel = 0;
    size_t bytes = 0;
    int name_w = 4;
    for (int64_t i = 0; i < n; i++) {
        fg_st_info in;
        fg_st_info_at(f, i, &in);
        numel += in.numel;
        bytes += in.nbytes;
        int l = (int)strlen(in.name);
        if (l > name_w) name_w = l;
    }
    printf("file: %s\n", path);
    printf("tensors: %" PRId64 ", %" PRId64 " elements, %zu bytes\n", n, numel, bytes);
    if (n) printf("  %-*s  %-5s  %-18s  %s\n", name_w, "name", "dtype", "shape", "elements");
    for (int64_t i = 0; i < n; i++) {
        fg_st_info in;
        fg_st_info_at(f, i, &in);
        printf("  %-*s  %-5s  ", name_w, in.name, in.dtype_name);
        print_shape(stdout, &in);
        printf("  %" PRId64 "\n", in.numel);
    }
    int64_t nm = fg_st_meta_count(f);
    printf("metadata: %" PRId64 " keys\n", nm);
    for (int64_t i = 0; i < nm; i++) {
        const char *k, *v;
        fg_st_meta_at(f, i, &k, &v);
        printf("  %s = ", k);
        print_value(v, o.full);
    }
    fg_st_close(f);
    return FG_EXIT_OK;
}

/* max |a - b| of one entry present in both files; -1 when shapes differ.
 * NaN at the same place in both counts as equal; NaN against a number as
 * an infinite difference. *bitwise tells whether the raw bytes are equal. */
static double entry_diff(const fg_st_file *a, int64_t ia, const fg_st_file *b, int64_t ib,
                         bool *bitwise, const char **why) {
    fg_st_info x, y;
    fg_st_info_at(a, ia, &x);
    fg_st_info_at(b, ib, &y);
    *why = NULL;
    bool same_shape = x.ndim == y.ndim;
    for (int d = 0; same_shape && d < x.ndim; d++) same_shape = x.shape[d] == y.shape[d];
    if (!same_shape) {
        *why = "shapes differ";
        *bitwise = false;
        return -1;
    }
    *bitwise = !strcmp(x.dtype_name, y.dtype_name) && x.nbytes == y.nbytes &&
               memcmp(fg_st_data(a, ia), fg_st_data(b, ib), x.nbytes) == 0;
    if (*bitwise) return 0;
    if (!x.has_dtype || !y.has_dtype) {
        *why = "bytes differ (dtype not comparable as numbers)";
        return INFINITY;
    }
    double *va = malloc(sizeof(double) * (size_t)(x.numel ? x.numel : 1));
    double *vb = malloc(sizeof(double) * (size_t)(x.numel ? x.numel : 1));
    double m = 0;
    if (!va || !vb || fg_st_read(a, ia, va, FG_F64, x.numel) != FG_OK ||
        fg_st_read(b, ib, vb, FG_F64, y.numel) != FG_OK) {
        *why = "could not read";
        m = INFINITY;
    } else {
        for (int64_t i = 0; i < x.numel; i++) {
            double d;
            if (isnan(va[i]) || isnan(vb[i])) d = isnan(va[i]) && isnan(vb[i]) ? 0 : INFINITY;
            else if (va[i] == vb[i]) d = 0;
            else d = fabs(va[i] - vb[i]);
            if (d > m) m = d;
        }
    }
    free(va);
    free(vb);
    return m;
}

typedef struct diff_opts {
    bool exit_code;
} diff_opts;

static const cli_flag_def k_diff_flags[] = {
    {.name = "exit-code",
     .type = CLI_BOOL,
     .off = offsetof(diff_opts, exit_code),
     .help = "exit 1 when the files differ (tensors, names or shapes), as git diff"},
};

static int ckpt_diff(int argc, char **argv) {
    diff_opts o = {0};
    cli_flag flags[CLI_COUNT(k_diff_flags)];
    cli_flags_bind(k_diff_flags, CLI_COUNT(k_diff_flags), &o, flags);
    const char *pos[2];
    int npos = 0;
    int rc = cli_flags_parse(flags, CLI_COUNT(k_diff_flags), argc, argv,
                             "fulgur ckpt diff A B [--exit-code]", pos, 2, &npos);
    if (rc) return rc < 0 ? FG_EXIT_OK : rc;
    if (npos != 2) {
        cli_error("ckpt diff: expected two checkpoint files A and B");
        return FG_EXIT_USAGE;
    }
    fg_st_file *a, *b;
    char pa[4096], pb[4096];
    if ((rc = open_ckpt(pos[0], &a, pa, sizeof pa))) return rc;
    if ((rc = open_ckpt(pos[1], &b, pb, sizeof pb))) {
        fg_st_close(a);
        return rc;
    }
    printf("A: %s\nB: %s\n", pa, pb);
    int name_w = 6;
    for (int64_t i = 0; i < fg_st_count(a); i++) {
        fg_st_info in;
        fg_st_info_at(a, i, &in);
        if ((int)strlen(in.name) > name_w) name_w = (int)strlen(in.name);
    }
    printf("  %-*s  %s\n", name_w, "tensor", "max |A-B|");
    double overall = 0;
    int64_t compared = 0, equal = 0, only = 0, mismatched = 0;
    for (int64_t i = 0; i < fg_st_count(a); i++) {
        fg_st_info in;
        fg_st_info_at(a, i, &in);
        int64_t j = fg_st_find(b, in.name);
        if (j < 0) continue;
        bool bitwise;
        const char *why;
        double d = entry_diff(a, i, b, j, &bitwise, &why);
        compared++;
        if (bitwise) equal++;
        if (d < 0) {
            fg_st_info jn;
            fg_st_info_at(b, j, &jn);
            printf("  %-*s  %s: ", name_w, in.name, why);
            print_shape(stdout, &in);
            printf(" vs ");
            print_shape(stdout, &jn);
            printf("\n");
            mismatched++;
            continue;
        }
        if (d > overall) overall = d;
        printf("  %-*s  %.6g%s%s%s\n", name_w, in.name, d, why ? " (" : "", why ? why : "",
               why ? ")" : "");
    }
    for (int64_t i = 0; i < fg_st_count(a); i++) {
        fg_st_info in;
        fg_st_info_at(a, i, &in);
        if (fg_st_find(b, in.name) < 0) {
            printf("  only in A: %s\n", in.name);
            only++;
        }
    }
    for (int64_t i = 0; i < fg_st_count(b); i++) {
        fg_st_info in;
        fg_st_info_at(b, i, &in);
        if (fg_st_find(a, in.name) < 0) {
            printf("  only in B: %s\n", in.name);
            only++;
        }
    }
    int64_t meta_diff = 0;
    for (int64_t i = 0; i < fg_st_meta_count(a); i++) {
        const char *k, *v;
        fg_st_meta_at(a, i, &k, &v);
        const char *w = fg_st_meta_get(b, k);
        if (w && !strcmp(v, w)) continue;
        meta_diff++;
        if (!w) printf("  metadata only in A: %s\n", k);
        else if (strlen(v) <= 40 && strlen(w) <= 40) printf("  metadata %s: %s vs %s\n", k, v, w);
        else printf("  metadata %s differs\n", k);
    }
    for (int64_t i = 0; i < fg_st_meta_count(b); i++) {
        const char *k, *v;
        fg_st_meta_at(b, i, &k, &v);
        if (!fg_st_meta_get(a, k)) {
            printf("  metadata only in B: %s\n", k);
            meta_diff++;
        }
    }
    printf("overall max |A-B| = %.6g over %" PRId64 " common tensors (%" PRId64
           " bitwise equal, %" PRId64 " with other shapes, %" PRId64 " in one file only, %" PRId64
           " metadata keys differ)\n",
           overall, compared, equal, mismatched, only, meta_diff);
    fg_st_close(a);
    fg_st_close(b);
    bool differ = overall != 0 || mismatched || only;
    return o.exit_code && differ ? FG_EXIT_FAIL : FG_EXIT_OK;
}

/* The real path of the folder that holds `path` into out (PATH_MAX bytes);
 * false when it cannot be resolved (then the writer reports it). */
static bool parent_real(const char *path, char *out) {
    char *dir = strdup(path);
    if (!dir) return false;
    char *slash = strrchr(dir, '/');
    const char *d = !slash ? "." : slash == dir ? "/" : (*slash = '\0', dir);
    bool ok = realpath(d, out) != NULL;
    free(dir);
    return ok;
}

/* Where consolidate may write OUT: nothing there, or a regular file with
 * --force; never a folder, fifo, device or symlink (rename would replace it
 * as readily: /dev/null as root), never inside the sharded checkpoint read
 * (its folder: OUT would be renamed over a shard or the index) and never
 * the input file itself. Returns 0, or FG_EXIT_USAGE after saying why. */
static int check_out(const char *in, const char *out, bool force) {
    struct stat ib, ob, lb;
    char rin[PATH_MAX], rdir[PATH_MAX];
    if (stat(in, &ib) != 0) return 0; /* opened already: a race; the writer decides */
    bool have = lstat(out, &lb) == 0;
    if (have && !S_ISREG(lb.st_mode)) {
        cli_error("ckpt consolidate: OUT %s exists and is not a regular file (%s): choose a new "
                  "file name",
                  out,
                  S_ISDIR(lb.st_mode)                          ? "a folder"
                  : S_ISLNK(lb.st_mode)                        ? "a symlink"
                  : S_ISFIFO(lb.st_mode)                       ? "a fifo"
                  : S_ISCHR(lb.st_mode) || S_ISBLK(lb.st_mode) ? "a device"
                                                               : "a special file");
        return FG_EXIT_USAGE;
    }
    if (have && stat(out, &ob) == 0 && ob.st_dev == ib.st_dev && ob.st_ino == ib.st_ino) {
        cli_error("ckpt consolidate: OUT %s is the checkpoint being read: choose another file",
                  out);
        return FG_EXIT_USAGE;
    }
    size_t inlen = strlen(in);
    bool index = inlen > 5 && !strcmp(in + inlen - 5, ".json"); /* the shards lie beside it */
    if (S_ISDIR(ib.st_mode) || index) {
        /* OUT's folder is the checkpoint's folder or below it */
        bool inside = false;
        if (realpath(in, rin) && parent_real(out, rdir)) {
            if (index) *strrchr(rin, '/') = '\0';
            size_t n = strlen(rin);
            inside = !strncmp(rdir, rin, n) && (rdir[n] == '\0' || rdir[n] == '/' || n == 1);
        }
        if (inside) {
            cli_error("ckpt consolidate: OUT %s lies inside the sharded checkpoint %s, which it "
                      "would change: write it outside that folder",
                      out, in);
            return FG_EXIT_USAGE;
        }
    }
    if (have && !force) {
        cli_error("ckpt consolidate: OUT %s exists: pass --force to replace it, or choose a new "
                  "file name",
                  out);
        return FG_EXIT_USAGE;
    }
    return 0;
}

/* One file from a sharded checkpoint (or a copy of a single file): every
 * tensor in the index's order, the metadata, written atomically. The
 * result is the file a full save of the same state writes, byte for
 * byte. --weights-only leaves out "optimizer.*": the model's state_dict,
 * for PyTorch's load_state_dict(strict=True). */
typedef struct consolidate_opts {
    bool weights_only;
    bool force;
} consolidate_opts;

static const cli_flag_def k_consolidate_flags[] = {
    {.name = "weights-only",
     .type = CLI_BOOL,
     .off = offsetof(consolidate_opts, weights_only),
     .help = "only the model's weights (no optimizer.* state): PyTorch's state_dict"},
    {.name = "force",
     .type = CLI_BOOL,
     .off = offsetof(consolidate_opts, force),
     .help = "replace OUT when it is an existing regular file"},
};

static int ckpt_consolidate(int argc, char **argv) {
    consolidate_opts o = {0};
    cli_flag flags[CLI_COUNT(k_consolidate_flags)];
    cli_flags_bind(k_consolidate_flags, CLI_COUNT(k_consolidate_flags), &o, flags);
    const char *pos[2];
    int npos = 0;
    int rc = cli_flags_parse(
        flags, CLI_COUNT(k_consolidate_flags), argc, argv,
        "fulgur ckpt consolidate DIR OUT.safetensors [--weights-only] [--force]", pos, 2, &npos);
    if (rc) return rc < 0 ? FG_EXIT_OK : rc;
    if (npos != 2) {
        cli_error("ckpt consolidate: expected a sharded checkpoint DIR and an output file OUT");
        return FG_EXIT_USAGE;
    }
    fg_st_file *f;
    char path[4096];
    if ((rc = open_ckpt(pos[0], &f, path, sizeof path))) return rc;
    if ((rc = check_out(path, pos[1], o.force))) {
        fg_st_close(f);
        return rc;
    }
    fg_st_writer *w = fg_st_writer_new();
    fg_status s = w ? FG_OK : FG_ENOMEM;
    int64_t kept = 0;
    for (int64_t i = 0; s == FG_OK && i < fg_st_count(f); i++) {
        fg_st_info in;
        fg_st_info_at(f, i, &in);
        if (o.weights_only && !strncmp(in.name, "optimizer.", 10)) continue;
        if (!in.has_dtype) {
            s = fg_error(FG_EUNSUPPORTED,
                         "%s: tensor \"%s\" has dtype %s, which fulgur cannot write", path, in.name,
                         in.dtype_name);
            break;
        }
        s = fg_st_writer_add(w, in.name, in.dtype, in.ndim, in.shape, fg_st_data(f, i));
        kept++;
    }
    for (int64_t i = 0; s == FG_OK && i < fg_st_meta_count(f); i++) {
        const char *k, *v;
        fg_st_meta_at(f, i, &k, &v);
        if (!strcmp(k, "save_id")) continue; /* names the sharded save, not the state */
        s = fg_st_writer_set_meta(w, k, v);
    }
    if (s == FG_OK) s = fg_st_writer_write(w, pos[1]);
    if (s == FG_OK)
        printf("consolidated %s: %" PRId64 " tensors%s into %s\n", path, kept,
               o.weights_only ? " (weights only)" : "", pos[1]);
    else cli_error("ckpt consolidate: %s", fg_last_error());
    fg_st_writer_free(w);
    fg_st_close(f);
    return s == FG_OK ? FG_EXIT_OK : FG_EXIT_FAIL;
}

static void usage(FILE *f) {
    fprintf(f, "usage: fulgur ckpt show FILE [--full]\n"
               "       fulgur ckpt diff A B [--exit-code]\n"
               "       fulgur ckpt consolidate DIR OUT.safetensors [--weights-only] [--force]\n\n"
               "  show   list the tensors (name, dtype, shape, elements) and the metadata\n"
               "  diff   largest absolute difference per tensor and overall; tensors in\n"
               "         only one file, other shapes and differing metadata are listed\n"
               "  consolidate  one safetensors file from a sharded checkpoint (a folder of\n"
               "         a file per rank and model.safetensors.index.json): the file a full\n"
               "         save writes; --weights-only keeps the model's weights alone;\n"
               "         OUT must be new (--force replaces a regular file), outside DIR\n\n"
               "FILE may be a sharded checkpoint's folder, or a run's checkpoint folder\n"
               "(its last.safetensors is used).\n"
               "Exit codes: 0 done, 1 unreadable or damaged file (or, with --exit-code,\n"
               "files that differ), 2 bad usage or missing file.\n");
}

int cmd_ckpt(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return FG_EXIT_USAGE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(stdout);
        return FG_EXIT_OK;
    }
    if (!strcmp(argv[1], "show")) return ckpt_show(argc - 1, argv + 1);
    if (!strcmp(argv[1], "diff")) return ckpt_diff(argc - 1, argv + 1);
    if (!strcmp(argv[1], "consolidate")) return ckpt_consolidate(argc - 1, argv + 1);
    cli_error("ckpt: unknown action \"%s\": expected show, diff or consolidate", argv[1]);
    usage(stderr);
    return FG_EXIT_USAGE;
}
