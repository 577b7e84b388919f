/* Status strings and the per-thread error message and status. Each thread
 * owns its own, so concurrent failures on different threads never mix. The
 * status is always set with the message, so the two describe one failure. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core_impl.h"

#define FG_ERRMSG_MAX FG_ERROR_MSG_MAX

static _Thread_local char tl_msg[FG_ERRMSG_MAX];
static _Thread_local fg_status tl_status;

const char *fg_version(void) { return FG_VERSION_STRING; }

const char *fg_status_str(fg_status s) {
    static const char *const names[FG_STATUS_COUNT] = {
        [FG_OK] = "FG_OK: success",
        [FG_EINVAL] = "FG_EINVAL: invalid argument",
        [FG_ENOMEM] = "FG_ENOMEM: out of memory",
        [FG_EIO] = "FG_EIO: input/output error",
        [FG_ETIMEOUT] = "FG_ETIMEOUT: timed out",
        [FG_EPEER] = "FG_EPEER: a peer rank failed",
        [FG_EUNSUPPORTED] = "FG_EUNSUPPORTED: not supported",
        [FG_EFORMAT] = "FG_EFORMAT: malformed data",
        [FG_ESTATE] = "FG_ESTATE: call out of order",
        [FG_EMISMATCH] = "FG_EMISMATCH: mismatch",
        [FG_EINTERNAL] = "FG_EINTERNAL: internal error",
    };
    if ((int)s < 0 || s >= FG_STATUS_COUNT) return "FG_?: unknown status";
    return names[s];
}

const char *fg_last_error(void) { return tl_msg; }

fg_status fg_last_status(void) { return tl_status; }

void fg_clear_error(void) {
    tl_msg[0] = '\0';
    tl_status = FG_OK;
}

/* the message's own length, not the buffer's: cheap enough for every _free */
void fg_error_keep(fg_error_kept *k) {
    size_t n = strnlen(tl_msg, sizeof tl_msg - 1);
    memcpy(k->msg, tl_msg, n);
    k->msg[n] = '\0';
    k->status = tl_status;
}

fg_status fg_error_restore(const fg_error_kept *k) {
    size_t n = strnlen(k->msg, sizeof k->msg - 1);
    memcpy(tl_msg, k->msg, n);
    tl_msg[n] = '\0';
    tl_status = k->status;
    return k->status;
}

fg_status fg_verror(fg_status s, const char *fmt, va_list ap) {
    /* Format aside first: callers may pass fg_last_error() as an argument. */
    char tmp[FG_ERRMSG_MAX];
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    memcpy(tl_msg, tmp, sizeof tl_msg);
    tl_status = s;
    return s;
}

fg_status fg_error(fg_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fg_verror(s, fmt, ap);
    va_end(ap);
    return s;
}

fg_status fg_error_wrap(fg_status s, const char *fmt, ...) {
    char prev[FG_ERRMSG_MAX], prefix[256];
    memcpy(prev, tl_msg, sizeof prev);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    snprintf(tl_msg, sizeof tl_msg, "%.255s: %.760s", prefix, prev[0] ? prev : fg_status_str(s));
    tl_status = s;
    return s;
}

fg_status fg__env_int(const char *name, long def, long *out) {
    const char *v = getenv(name);
    *out = def;
    if (!v || !*v) return FG_OK;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    while (*end == ' ') end++;
    if (errno || *end) return fg_error(FG_EINVAL, "%s=\"%s\": expected an integer", name, v);
    *out = x;
    return FG_OK;
}

fg_status fg__env_double(const char *name, double def, double *out) {
    const char *v = getenv(name);
    *out = def;
    if (!v || !*v) return FG_OK;
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    while (*end == ' ') end++;
    if (errno || *end) return fg_error(FG_EINVAL, "%s=\"%s\": expected a number", name, v);
    *out = x;
    return FG_OK;
}
