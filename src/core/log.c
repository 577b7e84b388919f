/* The log hook. The library logs only through the sink the program set;
 * with none set it is silent. fg_log_file puts each line out in one
 * write(2), so that the lines of ranks sharing a stderr never splice. */
#include <errno.h>
#include <stdio.h>
#include <unistd.h>

#include "core_impl.h"

static fg_log_fn g_fn;
static void *g_ud;
static fg_log_level g_min = FG_LOG_INFO;
static int g_rank = -1;

void fg_set_log(fg_log_fn fn, void *ud, fg_log_level min_level) {
    g_fn = fn;
    g_ud = ud;
    g_min = min_level;
}

void fg_set_log_rank(int rank) { g_rank = rank; }

void fg_log(fg_log_level level, const char *fmt, ...) {
    if (!g_fn || level < g_min) return;
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    g_fn(g_ud, level, g_rank, buf);
}

static void write_line(FILE *out, const char *line, size_t len) {
    fflush(out); /* what the stream holds goes first */
    int fd = fileno(out);
    if (fd < 0) { /* a stream with no descriptor (fmemopen) */
        fwrite(line, 1, len, out);
        fflush(out);
        return;
    }
    while (len > 0) { /* one write; more only when the kernel takes part of it */
        ssize_t n = write(fd, line, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        line += n;
        len -= (size_t)n;
    }
}

void fg_log_file(void *ud, fg_log_level level, int rank, const char *msg) {
    static const char *const names[] = {"debug", "info", "warning", "error"};
    FILE *out = ud; /* the program's stream: the library picks none itself */
    if (!out) return;
    char small[2200], *line = small; /* fg_log's 2048 and the prefix */
    const char *name = names[level];
    int n = rank >= 0 ? snprintf(small, sizeof small, "[fulgur rank %d] %s: %s\n", rank, name, msg)
                      : snprintf(small, sizeof small, "[fulgur] %s: %s\n", name, msg);
    if (n < 0) return;
    if ((size_t)n >= sizeof small) { /* a longer message from another caller */
        line = fg_alloc((size_t)n + 1);
        if (!line) return;
        if (rank >= 0) snprintf(line, (size_t)n + 1, "[fulgur rank %d] %s: %s\n", rank, name, msg);
        else snprintf(line, (size_t)n + 1, "[fulgur] %s: %s\n", name, msg);
    }
    write_line(out, line, (size_t)n);
    if (line != small) fg_free(line);
}
