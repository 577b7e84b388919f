/* pick_file.h's file of measured choices: its key, path, checked read,
 * atomic write and machine-wide lock. */
#include "pick_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "blas.h"
#include "cpu_impl.h"

static uint64_t fnv64(const void *p, size_t n, uint64_t h) {
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
    return h;
}
#define FNV0 0xcbf29ce484222325ull

void fg__pick_key(char *key, size_t cap, const char *format) {
    char model[128] = "?", fam[64] = "", flags[256] = "", line[16384]; /* flags lines run long */
    FILE *f = fopen("/proc/cpuinfo", "re");
    while (f && fgets(line, sizeof line, f)) {
        char *v = strchr(line, ':');
        if (!v) continue;
        v += strspn(v + 1, " ") + 1;
        v[strcspn(v, "\n")] = 0;
        if (!strncmp(line, "model name", 10) && model[0] == '?')
            snprintf(model, sizeof model, "%s", v);
        else if (!strncmp(line, "cpu family", 10) && !fam[0]) snprintf(fam, sizeof fam, "%s", v);
        else if (!strncmp(line, "model\t", 6) && !strchr(fam, '/'))
            snprintf(fam + strlen(fam), sizeof fam - strlen(fam), "/%s", v);
        else if (!strncmp(line, "flags", 5) && !flags[0]) {
            static const char *const want[] = {
                "avx2",        "fma",         "avx512f",  "avx512bw", "avx512vl", "avx512_vnni",
                "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", NULL};
            for (int i = 0; want[i]; i++) {
                size_t n = strlen(want[i]);
                for (char *p = strstr(v, want[i]); p; p = strstr(p + 1, want[i]))
                    if ((p == v || p[-1] == ' ') && (p[n] == ' ' || !p[n])) {
                        snprintf(flags + strlen(flags), sizeof flags - strlen(flags), "%s%s",
                                 flags[0] ? "," : "", want[i]);
                        break;
                    }
            }
            break;
        }
    }
    if (f) fclose(f);
    const char *isa = fg__dnnl_isa();
    snprintf(key, cap, "%s; cpu %s (%s); isa %s; %s; onednn %s %s", format, model, fam, flags,
             openblas_get_config(), fg__dnnl_version(), isa ? isa : "none");
    for (char *p = key; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
}

void fg__pick_path(char *path, size_t cap, const char *stem, const char *key) {
    const char *dir = getenv("FULGUR_GEMM_CACHE");
    char base[900] = "";
    if (dir && *dir) {
        if (strcmp(dir, "off") != 0) snprintf(base, sizeof base, "%s", dir);
    } else if (getenv("XDG_CACHE_HOME") && getenv("XDG_CACHE_HOME")[0] == '/') {
        snprintf(base, sizeof base, "%s/fulgur", getenv("XDG_CACHE_HOME"));
    } else if (getenv("HOME") && getenv("HOME")[0] == '/') {
        snprintf(base, sizeof base, "%s/.cache/fulgur", getenv("HOME"));
    }
    path[0] = 0;
    if (base[0])
        snprintf(path, cap, "%s/%s-%016llx.txt", base, stem,
                 (unsigned long long)fnv64(key, strlen(key), FNV0));
}

/* Reads path whole and checks it, then hands each line after the key's to
 * line(ud, text), which returns false for one that does not parse. */
static FG_MUST_USE fg_status read_checked(const char *path, const char *format, const char *key,
                                          bool (*line)(void *ud, const char *text), void *ud) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fg_error(FG_EIO, "choices file %s: %s", path, strerror(errno));
    size_t cap = FG_PICK_MAX_BYTES, len = 0;
    char *buf = fg_alloc(cap + 1);
    if (!buf) {
        close(fd);
        return FG_ENOMEM;
    }
    ssize_t r;
    while (len < cap && (r = read(fd, buf + len, cap - len)) > 0) len += (size_t)r;
    bool more = len == cap && read(fd, &(char){0}, 1) > 0;
    close(fd);
    buf[len] = 0;
    const char *why = NULL;
    int lineno = 0;
    char *sum = NULL;
    if (more) why = "is larger than 64 KiB";
    else if (strlen(buf) != len) why = "has a NUL byte";
    else if (len < 22 || strncmp(sum = buf + len - 22, "\nsum ", 5) != 0 || buf[len - 1] != '\n')
        why = "has no checksum line at its end";
    else {
        char want[24];
        snprintf(want, sizeof want, "%016llx",
                 (unsigned long long)fnv64(buf, (size_t)(sum + 1 - buf), FNV0));
        if (memcmp(sum + 5, want, 16) != 0) why = "has a checksum that does not match";
    }
    if (!why) {
        sum[1] = 0; /* the body ends with its last newline */
        for (char *l = buf, *nl; !why && *l; l = nl + 1) {
            nl = strchr(l, '\n');
            *nl = 0;
            lineno++;
            if (lineno == 1) {
                if (strcmp(l, format) != 0) why = "is not a calibration file of this version";
            } else if (lineno == 2) {
                if (strncmp(l, "key ", 4) != 0 || strcmp(l + 4, key) != 0)
                    why = "belongs to another CPU or library version";
            } else if (!line(ud, l)) {
                why = "has a line that does not parse";
            }
        }
        if (!why && lineno < 2) why = "is truncated";
    }
    fg_free(buf);
    if (!why) return FG_OK;
    return lineno > 2 ? fg_error(FG_EFORMAT, "%s %s (line %d): ignored", path, why, lineno)
                      : fg_error(FG_EFORMAT, "%s %s: ignored", path, why);
}

/* the entries a file read holds until all of it has passed */
typedef struct {
    char *es;
    size_t size;
    int n, most;
    bool (*parse)(const char *text, void *entry);
} loaded;

static bool take_line(void *ud, const char *text) {
    loaded *l = ud;
    return l->n < l->most && l->parse(text, l->es + l->size * (size_t)l->n++);
}

fg_status fg__pick_load(const char *path, const char *format, size_t size, int most,
                        bool (*parse)(const char *text, void *entry),
                        void (*put)(const void *entry)) {
    char key[1024];
    fg__pick_key(key, sizeof key, format);
    loaded l = {fg_alloc(size * (size_t)most), size, 0, most, parse};
    if (!l.es) return FG_ENOMEM;
    fg_status st = read_checked(path, format, key, take_line, &l);
    for (int i = 0; !st && i < l.n; i++) put(l.es + size * (size_t)i);
    fg_free(l.es);
    return st;
}

/* mkdir -p of path's folder. */
static void make_dirs(const char *path) {
    char d[1024];
    snprintf(d, sizeof d, "%s", path);
    char *slash = strrchr(d, '/');
    if (!slash) return;
    *slash = 0;
    for (char *p = d + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(d, 0755);
            *p = '/';
        }
    mkdir(d, 0755);
}

fg_status fg__pick_save(const char *path, const char *format, const char *key, const char *body,
                        size_t len) {
    size_t head = strlen(format) + strlen(key) + 6, cap = head + len + 32;
    char *buf = fg_alloc(cap), tmp[1100];
    if (!buf) return FG_ENOMEM;
    size_t n = (size_t)snprintf(buf, cap, "%s\nkey %s\n", format, key);
    memcpy(buf + n, body, len);
    n += len;
    n += (size_t)snprintf(buf + n, cap - n, "sum %016llx\n",
                          (unsigned long long)fnv64(buf, n, FNV0));
    make_dirs(path);
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    fg_status st = FG_OK;
    if (fd < 0) {
        st = fg_error(FG_EIO, "choices file %s: %s", tmp, strerror(errno));
    } else {
        size_t done = 0;
        while (done < n) {
            ssize_t w = write(fd, buf + done, n - done);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) break;
            done += (size_t)w;
        }
        if (close(fd) != 0 || done != n || rename(tmp, path) != 0) {
            st = fg_error(FG_EIO, "choices file %s: %s", path, strerror(errno));
            unlink(tmp);
        }
    }
    fg_free(buf);
    return st;
}

int fg__pick_lock(const char *path, double wait_s) {
    if (!path[0]) return -1;
    char lk[1100];
    snprintf(lk, sizeof lk, "%.*s.lock", (int)(strlen(path) - 4), path);
    make_dirs(lk);
    int fd = open(lk, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    double t0 = fg_time();
    while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if ((errno != EWOULDBLOCK && errno != EINTR) || fg_time() - t0 > wait_s) {
            close(fd);
            return -1;
        }
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    return fd;
}
