/* Arrays in files, streamed with io_uring (nvme_store.h).
 *
 * A stream cycles three sets of block buffers: while fn works on block b
 * in set b % 3, block b + 1's reads are in flight in the next set, and
 * block b - 1's writes may still be draining from the set before; a set is
 * read into again only once its writes completed. Every request is one
 * whole block of one array at an offset that is a multiple of the block
 * (itself a multiple of FG_NVME_ALIGN), with the file padded to
 * FG_NVME_ALIGN, so O_DIRECT's alignment always holds; a block fn touches
 * only part of is still read and written whole (unchanged bytes go back
 * as they came). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#ifdef FULGUR_HAVE_URING
#include <liburing.h>
#endif

#include "core/core_impl.h"
#include "nvme_store.h"

#define NSETS 3

#ifndef FULGUR_HAVE_URING

bool fg__nvme_available(void) { return false; }

fg_status fg__nvme_store_new(const char *dir, const char *what, int narrays, size_t bytes,
                             size_t block, fg__nvme_store **out) {
    (void)narrays, (void)bytes, (void)block;
    *out = NULL;
    return fg_error(FG_EUNSUPPORTED,
                    "offload_nvme is unavailable in this fulgur: it was built without liburing "
                    "(io_uring), so %s cannot go to nvme_path=%s; install liburing-dev and "
                    "rebuild, or use offload device cpu",
                    what, dir ? dir : "(none)");
}
void fg__nvme_store_free(fg__nvme_store *s) { (void)s; }
void *fg__nvme_store_map(fg__nvme_store *s, int i) {
    (void)s, (void)i;
    return NULL;
}
fg_status fg__nvme_store_stream(fg__nvme_store *s, size_t begin, size_t end, bool read, bool write,
                                fg__nvme_block_fn fn, void *ud) {
    (void)s, (void)begin, (void)end, (void)read, (void)write, (void)fn, (void)ud;
    return fg_error(FG_EUNSUPPORTED, "offload_nvme is unavailable in this fulgur (no liburing)");
}
void fg__nvme_store_counts(const fg__nvme_store *s, uint64_t *read, uint64_t *written) {
    (void)s;
    *read = *written = 0;
}
bool fg__nvme_store_direct(const fg__nvme_store *s) {
    (void)s;
    return false;
}
fg_status fg__nvme_store_read_start(fg__nvme_store *s, int i, size_t off, size_t n,
                                    fg__nvme_read **out) {
    (void)s, (void)i, (void)off, (void)n;
    *out = NULL;
    return fg_error(FG_EUNSUPPORTED, "offload_nvme is unavailable in this fulgur (no liburing)");
}
fg_status fg__nvme_store_read_finish(fg__nvme_read *r, void *dst) {
    (void)r, (void)dst;
    return FG_OK;
}

#else

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static void human(double b, char *out, size_t n) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int k = 0;
    while (b >= 1024 && k < 4) b /= 1024, k++;
    snprintf(out, n, k ? "%.1f %s" : "%.0f %s", b, u[k]);
}

struct fg__nvme_store {
    char *dir, *what;
    int n;
    size_t bytes, padded, block;
    int fd[FG_NVME_MAX_ARRAYS];
    void *map[FG_NVME_MAX_ARRAYS];
    bool direct;
    struct io_uring ring, rring; /* the streams'; the asynchronous reads' (made on first use) */
    bool ring_ok, rring_ok;
    void *raw[NSETS][FG_NVME_MAX_ARRAYS]; /* fg_alloc'ed, buf aligned inside */
    char *buf[NSETS][FG_NVME_MAX_ARRAYS];
    uint64_t nread, nwritten;
};

bool fg__nvme_available(void) { return true; }

/* An unlinked file in dir: O_TMPFILE, else a named one removed at once;
 * O_DIRECT where the file system takes it. -1 with errno on failure. */
static int open_unlinked(const char *dir, bool *direct) {
    int flags[2] = {O_DIRECT, 0};
    for (int k = 0; k < 2; k++) {
        int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC | flags[k], 0600);
        if (fd >= 0) {
            *direct = k == 0;
            return fd;
        }
        if (errno != EINVAL && errno != EOPNOTSUPP && errno != EISDIR) return -1;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/.fulgur-offload-XXXXXX", dir);
    int fd = mkostemp(path, O_CLOEXEC);
    if (fd < 0) return -1;
    unlink(path);
    char self[64];
    snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
    int dfd = open(self, O_RDWR | O_CLOEXEC | O_DIRECT);
    if (dfd >= 0) {
        close(fd);
        *direct = true;
        return dfd;
    }
    *direct = false;
    return fd;
}

void fg__nvme_store_free(fg__nvme_store *s) {
    if (!s) return;
    if (s->ring_ok) io_uring_queue_exit(&s->ring);
    if (s->rring_ok) io_uring_queue_exit(&s->rring);
    for (int i = 0; i < s->n; i++) {
        if (s->map[i]) munmap(s->map[i], s->padded);
        if (s->fd[i] >= 0) close(s->fd[i]);
        for (int b = 0; b < NSETS; b++) fg_free(s->raw[b][i]);
    }
    fg_free(s->dir);
    fg_free(s->what);
    fg_free(s);
}

static FG_MUST_USE fg_status no_room(fg__nvme_store *s, double avail, int err) {
    char need[32], have[32], each[32], why[128];
    human((double)s->padded * s->n, need, sizeof need);
    human((double)s->padded, each, sizeof each);
    human(avail, have, sizeof have);
    if (err) snprintf(why, sizeof why, "allocating them failed: %s", strerror(err));
    else snprintf(why, sizeof why, "it has %s free", have);
    return fg_error(FG_EIO,
                    "nvme_path=%s: the disk cannot hold %s of this rank: it needs %zu bytes "
                    "(%s: %d file%s of %s) and %s; free space there or choose another nvme_path",
                    s->dir, s->what, s->padded * (size_t)s->n, need, s->n, s->n > 1 ? "s" : "",
                    each, why);
}

fg_status fg__nvme_store_new(const char *dir, const char *what, int narrays, size_t bytes,
                             size_t block, fg__nvme_store **out) {
    *out = NULL;
    if (!dir || !*dir)
        return fg_error(FG_EINVAL,
                        "offload_nvme: nvme_path is not set: give the directory on a local disk "
                        "that is to hold %s",
                        what);
    if (narrays < 1 || narrays > FG_NVME_MAX_ARRAYS)
        return fg_error(FG_EINTERNAL, "nvme store: %d arrays (1..%d)", narrays, FG_NVME_MAX_ARRAYS);
    if (!block) block = FG_NVME_DEFAULT_BLOCK;
    if (block % FG_NVME_ALIGN)
        return fg_error(FG_EINVAL, "offload_nvme: block size %zu: expected a multiple of %d", block,
                        FG_NVME_ALIGN);
    fg__nvme_store *s = fg_calloc(1, sizeof *s);
    if (!s) return FG_ENOMEM;
    s->n = narrays;
    s->bytes = bytes;
    s->padded = round_up(bytes ? bytes : 1, FG_NVME_ALIGN);
    s->block = block;
    for (int i = 0; i < FG_NVME_MAX_ARRAYS; i++) s->fd[i] = -1;
    s->dir = fg_strdup(dir);
    s->what = fg_strdup(what);
    fg_status st = FG_OK;
    if (!s->dir || !s->what) {
        st = FG_ENOMEM;
        goto fail;
    }
    struct stat sb;
    int found = stat(dir, &sb) == 0 ? 0 : errno;
    if (found || !S_ISDIR(sb.st_mode)) {
        st = fg_error(FG_EIO,
                      "nvme_path=%s: %s; it must be an existing directory on a local disk, able "
                      "to hold %zu bytes (%s of this rank)",
                      dir, found ? strerror(found) : "not a directory", s->padded * (size_t)s->n,
                      what);
        goto fail;
    }
    struct statvfs vf;
    if (statvfs(dir, &vf) == 0) {
        double avail = (double)vf.f_bavail * (double)vf.f_frsize;
        if (avail < (double)s->padded * s->n) {
            st = no_room(s, avail, 0);
            goto fail;
        }
    }
    bool direct_all = true;
    for (int i = 0; i < narrays; i++) {
        bool direct = false;
        if ((s->fd[i] = open_unlinked(dir, &direct)) < 0) {
            st = fg_error(FG_EIO,
                          "nvme_path=%s: cannot create a file there (%s); it must be a writable "
                          "directory able to hold %zu bytes (%s of this rank)",
                          dir, strerror(errno), s->padded * (size_t)s->n, what);
            goto fail;
        }
        direct_all = direct_all && direct;
        int rc = posix_fallocate(s->fd[i], 0, (off_t)s->padded);
        if (rc == EOPNOTSUPP || rc == ENOSYS)
            rc = ftruncate(s->fd[i], (off_t)s->padded) ? errno : 0;
        if (rc) {
            st = no_room(s, 0, rc);
            goto fail;
        }
        void *p = mmap(NULL, s->padded, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd[i], 0);
        if (p == MAP_FAILED) {
            st = fg_error(FG_EIO, "nvme_path=%s: mapping a file of %zu bytes: %s", dir, s->padded,
                          strerror(errno));
            goto fail;
        }
        s->map[i] = p;
    }
    s->direct = direct_all;
    int rc = io_uring_queue_init(4 * NSETS * FG_NVME_MAX_ARRAYS, &s->ring, 0);
    if (rc < 0) {
        st = fg_error(FG_EUNSUPPORTED,
                      "offload_nvme: the kernel refused io_uring (%s); check "
                      "/proc/sys/kernel/io_uring_disabled and the container's seccomp policy",
                      strerror(-rc));
        goto fail;
    }
    s->ring_ok = true;
    size_t bb = FG_MIN(block, s->padded);
    for (int b = 0; b < NSETS; b++)
        for (int i = 0; i < narrays; i++) {
            if (!(s->raw[b][i] = fg_alloc(bb + FG_NVME_ALIGN))) {
                st = fg_error_wrap(FG_ENOMEM, "offload_nvme: block buffers");
                goto fail;
            }
            s->buf[b][i] = (char *)round_up((size_t)s->raw[b][i], FG_NVME_ALIGN);
        }
    *out = s;
    return FG_OK;
fail:
    fg__nvme_store_free(s);
    return st;
}

void *fg__nvme_store_map(fg__nvme_store *s, int i) { return s && i < s->n ? s->map[i] : NULL; }

void fg__nvme_store_counts(const fg__nvme_store *s, uint64_t *read, uint64_t *written) {
    *read = s ? s->nread : 0;
    *written = s ? s->nwritten : 0;
}

bool fg__nvme_store_direct(const fg__nvme_store *s) { return s && s->direct; }

/* ------------------------------------------------------------ reads */

#define RREAD_DEPTH 64
#define RREAD_CHUNK ((size_t)16 << 20)

struct fg__nvme_read {
    fg__nvme_store *s;
    void *raw;
    char *buf; /* aligned; holds file bytes [at, at + len) */
    size_t at, len, off, n;
    size_t got;       /* bytes read so far */
    int pending, err; /* requests not completed; first errno */
    size_t err_at;
};

/* Waits for one completion on the read ring and books it to its read. */
static FG_MUST_USE fg_status rreap(fg__nvme_store *s) {
    struct io_uring_cqe *c;
    int rc;
    do rc = io_uring_wait_cqe(&s->rring, &c);
    while (rc == -EINTR);
    if (rc < 0) return fg_error(FG_EIO, "offload_nvme: io_uring_wait_cqe: %s", strerror(-rc));
    fg__nvme_read *r = io_uring_cqe_get_data(c);
    int res = c->res;
    io_uring_cqe_seen(&s->rring, c);
    r->pending--;
    if (res < 0 && !r->err) r->err = -res;
    if (res >= 0) {
        s->nread += (uint64_t)res;
        r->got += (size_t)res;
    }
    return FG_OK;
}

fg_status fg__nvme_store_read_start(fg__nvme_store *s, int i, size_t off, size_t n,
                                    fg__nvme_read **out) {
    *out = NULL;
    if (!s || i < 0 || i >= s->n || off + n > s->bytes)
        return fg_error(FG_EINTERNAL, "nvme store: read of [%zu, %zu) outside the array", off,
                        off + n);
    if (!s->rring_ok) {
        int rc = io_uring_queue_init(RREAD_DEPTH, &s->rring, 0);
        if (rc < 0)
            return fg_error(FG_EUNSUPPORTED, "offload_nvme: the kernel refused io_uring (%s)",
                            strerror(-rc));
        s->rring_ok = true;
    }
    fg__nvme_read *r = fg_calloc(1, sizeof *r);
    if (!r) return fg_error_wrap(FG_ENOMEM, "offload_nvme: a read");
    r->s = s;
    r->off = off;
    r->n = n;
    r->at = off / FG_NVME_ALIGN * FG_NVME_ALIGN;
    r->len = round_up(off + n, FG_NVME_ALIGN) - r->at;
    if (n && !(r->raw = fg_alloc(r->len + FG_NVME_ALIGN))) {
        fg_free(r);
        return fg_error_wrap(FG_ENOMEM, "offload_nvme: a read buffer of %zu bytes", r->len);
    }
    r->buf = (char *)round_up((size_t)r->raw, FG_NVME_ALIGN);
    for (size_t a = 0; n && a < r->len; a += RREAD_CHUNK) {
        struct io_uring_sqe *q;
        while (!(q = io_uring_get_sqe(&s->rring))) {
            int rc = io_uring_submit(&s->rring);
            if (rc < 0) {
                r->err = -rc;
                break;
            }
        }
        if (!q) break;
        size_t len = FG_MIN(RREAD_CHUNK, r->len - a);
        io_uring_prep_read(q, s->fd[i], r->buf + a, (unsigned)len, (off_t)(r->at + a));
        io_uring_sqe_set_data(q, r);
        r->pending++;
    }
    int rc = io_uring_submit(&s->rring);
    if (rc < 0 && !r->err) r->err = -rc;
    *out = r;
    return FG_OK;
}

fg_status fg__nvme_store_read_finish(fg__nvme_read *r, void *dst) {
    if (!r) return FG_OK;
    fg__nvme_store *s = r->s;
    fg_status st = FG_OK;
    while (r->pending && st == FG_OK) st = rreap(s);
    if (st == FG_OK && (r->err || (r->n && r->got != r->len)))
        st = fg_error(FG_EIO, "nvme_path=%s: reading %s at byte %zu: %s", s->dir, s->what, r->at,
                      r->err ? strerror(r->err) : "a short transfer");
    if (st == FG_OK && dst && r->n) memcpy(dst, r->buf + (r->off - r->at), r->n);
    if (st == FG_OK || !r->pending) { /* else the ring is gone: leak rather than free under it */
        fg_free(r->raw);
        fg_free(r);
    }
    return st;
}

/* ------------------------------------------------------------ streaming */

typedef struct set {
    int reads, writes;
    size_t at, len; /* the block in it: byte offset and length in each file */
} set;

typedef struct stream {
    fg__nvme_store *s;
    set sets[NSETS];
    int err;     /* first errno */
    bool short_; /* a request moved fewer bytes than asked */
    bool err_write;
    size_t err_at;
} stream;

/* user data: set, array, write */
static uint64_t tag(int b, int i, bool w) { return (uint64_t)(b * 16 + i * 2 + w); }

static FG_MUST_USE fg_status submit(stream *x, int b, bool w) {
    fg__nvme_store *s = x->s;
    set *t = &x->sets[b];
    for (int i = 0; i < s->n; i++) {
        struct io_uring_sqe *q = io_uring_get_sqe(&s->ring);
        if (!q) { /* cannot happen with the ring sized for every set */
            io_uring_submit(&s->ring);
            if (!(q = io_uring_get_sqe(&s->ring)))
                return fg_error(FG_EINTERNAL, "offload_nvme: the submission queue is full");
        }
        if (w) io_uring_prep_write(q, s->fd[i], s->buf[b][i], (unsigned)t->len, (off_t)t->at);
        else io_uring_prep_read(q, s->fd[i], s->buf[b][i], (unsigned)t->len, (off_t)t->at);
        io_uring_sqe_set_data64(q, tag(b, i, w));
        if (w) t->writes++;
        else t->reads++;
    }
    int rc = io_uring_submit(&s->ring);
    if (rc < 0) return fg_error(FG_EIO, "offload_nvme: io_uring_submit: %s", strerror(-rc));
    return FG_OK;
}

/* Waits for one completion and books it. */
static FG_MUST_USE fg_status reap(stream *x) {
    struct io_uring_cqe *c;
    int rc;
    do rc = io_uring_wait_cqe(&x->s->ring, &c);
    while (rc == -EINTR);
    if (rc < 0) return fg_error(FG_EIO, "offload_nvme: io_uring_wait_cqe: %s", strerror(-rc));
    uint64_t d = io_uring_cqe_get_data64(c);
    int res = c->res;
    io_uring_cqe_seen(&x->s->ring, c);
    int b = (int)(d / 16);
    bool w = d & 1;
    set *t = &x->sets[b];
    if (w) t->writes--;
    else t->reads--;
    if (res >= 0 && (size_t)res == t->len) {
        if (w) x->s->nwritten += (uint64_t)res;
        else x->s->nread += (uint64_t)res;
    } else if (!x->err && !x->short_) {
        if (res < 0) x->err = -res;
        else x->short_ = true;
        x->err_write = w;
        x->err_at = t->at;
    }
    return FG_OK;
}

static FG_MUST_USE fg_status io_error(stream *x) {
    fg__nvme_store *s = x->s;
    const char *op = x->err_write ? "writing" : "reading";
    if (x->err == ENOSPC || x->err == EDQUOT || x->err == EFBIG)
        return fg_error(FG_EIO,
                        "nvme_path=%s: the disk is full %s %s at byte %zu (%s; the files need %zu "
                        "bytes in all): the run cannot go on",
                        s->dir, op, s->what, x->err_at, strerror(x->err), s->padded * (size_t)s->n);
    return fg_error(FG_EIO, "nvme_path=%s: %s %s at byte %zu: %s", s->dir, op, s->what, x->err_at,
                    x->err ? strerror(x->err) : "a short transfer");
}

/* Puts block b into set k: its place in the files, and its reads. */
static FG_MUST_USE fg_status take(stream *x, size_t b, int k, bool read) {
    fg__nvme_store *s = x->s;
    set *t = &x->sets[k];
    while (t->writes) FG_TRY(reap(x)); /* its last block must be on disk first */
    t->at = b * s->block;
    t->len = FG_MIN(s->block, s->padded - t->at);
    return read ? submit(x, k, false) : FG_OK;
}

fg_status fg__nvme_store_stream(fg__nvme_store *s, size_t begin, size_t end, bool read, bool write,
                                fg__nvme_block_fn fn, void *ud) {
    if (!s) return fg_error(FG_EINVAL, "offload_nvme: NULL store");
    if (end > s->bytes) end = s->bytes;
    if (begin >= end) return FG_OK;
    stream x = {.s = s};
    size_t b0 = begin / s->block, b1 = (end - 1) / s->block;
    fg_status st = take(&x, b0, 0, read);
    for (size_t b = b0; b <= b1 && st == FG_OK && !x.err && !x.short_; b++) {
        int k = (int)((b - b0) % NSETS);
        set *t = &x.sets[k];
        /* the next block's reads go out before this one is worked on */
        if (b < b1 && (st = take(&x, b + 1, (int)((b + 1 - b0) % NSETS), read)) != FG_OK) break;
        while (t->reads && st == FG_OK) st = reap(&x);
        if (st != FG_OK || x.err || x.short_) break;
        size_t lo = FG_MAX(begin, t->at), hi = FG_MIN(end, t->at + t->len);
        void *bufs[FG_NVME_MAX_ARRAYS];
        for (int i = 0; i < s->n; i++) bufs[i] = s->buf[k][i] + (lo - t->at);
        bool w = write;
        st = fn(ud, lo, hi - lo, bufs, &w);
        if (st == FG_OK && w) st = submit(&x, k, true);
    }
    /* drain: the buffers are reused by the next stream */
    for (int k = 0; k < NSETS; k++)
        while (x.sets[k].reads || x.sets[k].writes) {
            fg_status r = reap(&x);
            if (r != FG_OK) return r; /* the ring is unusable: nothing more to wait for */
        }
    if (st != FG_OK) return st;
    return x.err || x.short_ ? io_error(&x) : FG_OK;
}

#endif
