/* Atomic file replacement and the `last` symlink.
 *
 * A file is written under a temporary name in its target's folder (the same
 * file system, so rename is atomic), fsync'ed, renamed over the target, and
 * the folder is fsync'ed so that the rename itself survives a power loss.
 * Until the rename the target is untouched; after it the target is the new
 * file in full. Temporary names start with '.' and end in ".tmp-<pid>-<n>",
 * so no listing of "*.safetensors" ever picks one up; fg_st_remove_stale_tmp
 * removes those of processes that died mid-write. The target must be a
 * regular file or nothing: rename would replace a device node, a fifo or a
 * symlink as readily. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_impl.h"

#define AFILE_BUF (1u << 20)

static unsigned g_tmp_counter;

char *fg__path_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return fg_strdup(".");
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    char *d = fg_alloc(n + 1);
    if (!d) return NULL;
    memcpy(d, path, n);
    d[n] = '\0';
    return d;
}

char *fg__path_tmp(const char *path, unsigned attempt) {
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    int dirlen = slash ? (int)(slash - path + 1) : 0;
    unsigned n = __atomic_fetch_add(&g_tmp_counter, 1, __ATOMIC_RELAXED) + attempt;
    size_t cap = strlen(path) + 64;
    char *t = fg_alloc(cap);
    if (!t) return NULL;
    snprintf(t, cap, "%.*s.%s.tmp-%ld-%u", dirlen, path, base, (long)getpid(), n);
    return t;
}

int fg__fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    if (rc != 0 && (e == EINVAL || e == ENOTSUP)) rc = 0;
    errno = e;
    return rc;
}

/* rename(2) replaces whatever the target is: a fifo, a device node (as
 * root, /dev/null would become a regular file for every process), a
 * symlink instead of its target. Only a regular file, or nothing, may be
 * replaced; anything else is refused, naming what it is. Checked when the
 * write begins (so nothing is written for a bad target) and again just
 * before the rename. */
static FG_MUST_USE fg_status check_target(const char *path) {
    char eb[128];
    struct stat sb;
    if (lstat(path, &sb) != 0) {
        if (errno == ENOENT) return FG_OK;
        return fg_error(FG_EIO, "%s: cannot check what is there: %s", path,
                        fg__errstr(errno, eb, sizeof eb));
    }
    if (S_ISREG(sb.st_mode)) return FG_OK;
    const char *what = S_ISDIR(sb.st_mode)    ? "a folder"
                       : S_ISLNK(sb.st_mode)  ? "a symlink"
                       : S_ISFIFO(sb.st_mode) ? "a fifo"
                       : S_ISCHR(sb.st_mode)  ? "a character device"
                       : S_ISBLK(sb.st_mode)  ? "a block device"
                       : S_ISSOCK(sb.st_mode) ? "a socket"
                                              : "not a regular file";
    return fg_error(FG_EINVAL,
                    "%s: exists and is %s; a checkpoint replaces only a regular file: remove it "
                    "or write to another path",
                    path, what);
}

static void afile_release(fg__afile *a) {
    fg_free(a->path);
    fg_free(a->tmp);
    fg_free(a->dir);
    fg_free(a->buf);
    *a = (fg__afile){.fd = -1};
}

fg_status fg__afile_open(fg__afile *a, const char *path) {
    char eb[128];
    *a = (fg__afile){.fd = -1};
    const char *slash = strrchr(path, '/');
    if (!*path || (slash && !slash[1]))
        return fg_error(FG_EINVAL, "\"%s\": expected a file path, not a folder", path);
    FG_TRY(check_target(path));
    a->path = fg_strdup(path);
    a->dir = fg__path_dir(path);
    a->buf = fg_alloc(AFILE_BUF);
    a->cap = AFILE_BUF;
    if (!a->path || !a->dir || !a->buf) goto nomem;
    for (unsigned attempt = 0; attempt < 1000; attempt++) {
        a->tmp = fg__path_tmp(path, attempt);
        if (!a->tmp) goto nomem;
        a->fd = open(a->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (a->fd >= 0) return FG_OK;
        int e = errno;
        fg_free(a->tmp);
        a->tmp = NULL;
        if (e != EEXIST) {
            fg_error(FG_EIO, "%s: cannot create a temporary file in folder \"%s\": %s", path,
                     a->dir, fg__errstr(e, eb, sizeof eb));
            afile_release(a);
            return FG_EIO;
        }
    }
    fg_error(FG_EIO, "%s: cannot find a free temporary name in folder \"%s\"", path, a->dir);
    afile_release(a);
    return FG_EIO;
nomem:
    afile_release(a);
    return FG_ENOMEM; /* fg_alloc left the message */
}

static FG_MUST_USE fg_status write_all(fg__afile *a, const unsigned char *p, size_t n) {
    char eb[128];
    while (n > 0) {
        ssize_t k = write(a->fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            int e = k < 0 ? errno : EIO;
            return fg_error(FG_EIO, "%s: write failed: %s", a->path, fg__errstr(e, eb, sizeof eb));
        }
        p += k;
        n -= (size_t)k;
    }
    return FG_OK;
}

static FG_MUST_USE fg_status afile_flush(fg__afile *a) {
    fg_status st = write_all(a, a->buf, a->used);
    a->used = 0;
    return st;
}

fg_status fg__afile_write(fg__afile *a, const void *p, size_t n) {
    if (n == 0) return FG_OK;
    if (a->used + n <= a->cap) {
        memcpy(a->buf + a->used, p, n);
        a->used += n;
        return FG_OK;
    }
    FG_TRY(afile_flush(a));
    if (n >= a->cap) return write_all(a, p, n);
    memcpy(a->buf, p, n);
    a->used = n;
    return FG_OK;
}

void fg__afile_abort(fg__afile *a) {
    if (a->fd >= 0) close(a->fd);
    if (a->tmp) unlink(a->tmp);
    afile_release(a);
}

fg_status fg__afile_commit(fg__afile *a) {
    char eb[128];
    fg_status st = afile_flush(a);
    if (st != FG_OK) goto fail;
    if (fsync(a->fd) != 0) {
        st = fg_error(FG_EIO, "%s: fsync failed: %s", a->path, fg__errstr(errno, eb, sizeof eb));
        goto fail;
    }
    int rc = close(a->fd);
    a->fd = -1;
    if (rc != 0) {
        st = fg_error(FG_EIO, "%s: close failed: %s", a->path, fg__errstr(errno, eb, sizeof eb));
        goto fail;
    }
    if ((st = check_target(a->path)) != FG_OK) goto fail;
    if (rename(a->tmp, a->path) != 0) {
        st = fg_error(FG_EIO, "%s: cannot rename the temporary file \"%s\" over it: %s", a->path,
                      a->tmp, fg__errstr(errno, eb, sizeof eb));
        goto fail;
    }
    fg_free(a->tmp);
    a->tmp = NULL;
    if (fg__fsync_dir(a->dir) != 0)
        st = fg_error(FG_EIO, "%s: written and renamed, but fsync of folder \"%s\" failed: %s",
                      a->path, a->dir, fg__errstr(errno, eb, sizeof eb));
    afile_release(a);
    return st;
fail:
    fg__afile_abort(a);
    return st;
}

/* ------------------------------------------------------------ last link */

/* `rel` resolved against the folder of `link_path` (absolute rel as is). */
static char *resolve_beside(const char *link_path, const char *rel) {
    if (rel[0] == '/' || !strchr(link_path, '/')) return fg_strdup(rel);
    const char *slash = strrchr(link_path, '/');
    size_t dn = (size_t)(slash - link_path) + 1, rn = strlen(rel);
    char *p = fg_alloc(dn + rn + 1);
    if (!p) return NULL;
    memcpy(p, link_path, dn);
    memcpy(p + dn, rel, rn + 1);
    return p;
}

fg_status fg_st_set_last(const char *link_path, const char *target) {
    char eb[128];
    if (!link_path || !*link_path || !target || !*target)
        return fg_error(FG_EINVAL, "fg_st_set_last: link path and target must be non-empty");
    fg_status st = FG_OK;
    char *full = NULL, *dir = NULL, *tmp = NULL;
    struct stat sb;
    full = resolve_beside(link_path, target);
    dir = fg__path_dir(link_path);
    if (!full || !dir) {
        st = FG_ENOMEM;
        goto done;
    }
    if (stat(full, &sb) != 0) {
        st = fg_error(FG_EIO, "%s: cannot point at \"%s\": %s", link_path, full,
                      fg__errstr(errno, eb, sizeof eb));
        goto done;
    }
    for (unsigned attempt = 0;; attempt++) {
        tmp = fg__path_tmp(link_path, attempt);
        if (!tmp) {
            st = FG_ENOMEM;
            goto done;
        }
        if (symlink(target, tmp) == 0) break;
        int e = errno;
        fg_free(tmp);
        tmp = NULL;
        if (e != EEXIST || attempt >= 1000) {
            st = fg_error(FG_EIO, "%s: cannot create a symlink in folder \"%s\": %s", link_path,
                          dir, fg__errstr(e, eb, sizeof eb));
            goto done;
        }
    }
    if (rename(tmp, link_path) != 0) {
        st = fg_error(FG_EIO, "%s: cannot rename the temporary symlink \"%s\" over it: %s",
                      link_path, tmp, fg__errstr(errno, eb, sizeof eb));
        unlink(tmp);
        goto done;
    }
    if (fg__fsync_dir(dir) != 0)
        st = fg_error(FG_EIO, "%s: updated, but fsync of folder \"%s\" failed: %s", link_path, dir,
                      fg__errstr(errno, eb, sizeof eb));
done:
    fg_free(tmp);
    fg_free(dir);
    fg_free(full);
    return st;
}

fg_status fg_st_get_last(const char *link_path, char *out, size_t cap) {
    char eb[128];
    if (!link_path || !out || cap == 0)
        return fg_error(FG_EINVAL, "fg_st_get_last: NULL argument or empty buffer");
    struct stat sb;
    if (lstat(link_path, &sb) != 0)
        return fg_error(FG_EIO, "%s: %s (no checkpoint has been saved there yet?)", link_path,
                        fg__errstr(errno, eb, sizeof eb));
    if (!S_ISLNK(sb.st_mode))
        return fg_error(FG_EFORMAT, "%s: not a symlink (fg_st_set_last makes one)", link_path);
    char target[4096];
    ssize_t n = readlink(link_path, target, sizeof target - 1);
    if (n < 0)
        return fg_error(FG_EIO, "%s: readlink failed: %s", link_path,
                        fg__errstr(errno, eb, sizeof eb));
    if (n == 0 || (size_t)n >= sizeof target - 1)
        return fg_error(FG_EFORMAT, "%s: symlink target is empty or too long", link_path);
    target[n] = '\0';
    char *full = resolve_beside(link_path, target);
    if (!full) return FG_ENOMEM;
    size_t len = strlen(full);
    fg_status st = FG_OK;
    if (len >= cap)
        st = fg_error(FG_EINVAL, "%s: resolved path \"%s\" needs %zu bytes, buffer has %zu",
                      link_path, full, len + 1, cap);
    else memcpy(out, full, len + 1);
    fg_free(full);
    return st;
}

/* "<.name>.tmp-<pid>-<n>": the pid, or -1 when the name is not one of ours. */
static long tmp_owner(const char *name) {
    if (name[0] != '.') return -1;
    const char *p = strrchr(name, '.');
    if (p <= name + 1 || strncmp(p, ".tmp-", 5)) return -1; /* also "." itself, ".." */
    char *end;
    long pid = strtol(p + 5, &end, 10);
    if (end == p + 5 || *end != '-' || pid <= 0 || !end[1]) return -1;
    for (const char *k = end + 1; *k; k++)
        if (*k < '0' || *k > '9') return -1;
    return pid;
}

fg_status fg_st_remove_stale_tmp(const char *dir, int *removed) {
    char eb[128];
    if (removed) *removed = 0;
    if (!dir) return fg_error(FG_EINVAL, "remove_stale_tmp: NULL folder");
    DIR *d = opendir(dir);
    if (!d)
        return fg_error(FG_EIO, "folder \"%s\": cannot list it: %s", dir,
                        fg__errstr(errno, eb, sizeof eb));
    fg_status st = FG_OK;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        long pid = tmp_owner(e->d_name);
        if (pid < 0) continue;
        if (pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue; /* its writer may still run (EPERM: someone else's process) */
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (fg_st_remove(path) != FG_OK) { /* a file, or a checkpoint folder begun */
            st = fg_error_wrap(FG_EIO, "removing a stale temporary file");
            break;
        }
        if (removed) (*removed)++;
    }
    closedir(d);
    return st;
}
