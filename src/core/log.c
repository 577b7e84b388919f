/* The log hook. The library logs only through the sink the program set;
 * with none set it is silent. */
#include <stdio.h>

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

void fg_log_file(void *ud, fg_log_level level, int rank, const char *msg) {
    static const char *const names[] = {"debug", "info", "warning", "error"};
    FILE *out = ud; /* the program's stream: the library picks none itself */
    if (!out) return;
    if (rank >= 0) fprintf(out, "[fulgur rank %d] %s: %s\n", rank, names[level], msg);
    else fprintf(out, "[fulgur] %s: %s\n", names[level], msg);
}
