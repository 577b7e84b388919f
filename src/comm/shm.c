/* The shm backend: all ranks of a group on one machine share one segment
 * (laid out in shm_impl.h). This file makes and maps the segment, joins and
 * leaves the group, and holds the backend table; shm_wait.c waits for the
 * peers and watches them, shm_coll.c moves the data.
 *
 * Rendezvous: group rank 0 makes the segment as a memfd (shared memory with
 * no name) and hands it over an abstract unix socket named after the uid,
 * the job and the group (checked to be the same uid) to each peer that
 * connects; the socket closes once all have it. Neither has a file: any
 * exit, a crash included, leaves nothing in /dev/shm or elsewhere.
 *
 * Each rank claims its ctl block once (compare-and-swap of its pid), so two
 * processes given the same rank fail at join rather than corrupt each
 * other's words; no rank returns from join before every rank has mapped the
 * segment; a rank that leaves marks itself left and wakes whoever sleeps on
 * its words, so a peer still waiting for it fails at its next check instead
 * of at the timeout. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>

#include "shm_impl.h"

/* FULGUR_SHM_CHUNK_BYTES: bytes of each rank's slot, the pipeline's chunk
 * (default 512 KiB; tune with bench/comm). FULGUR_SHM_SPIN_US: the most a
 * wait spins before it yields (default 50 us, or 1 us when there are more
 * ranks than cores; it adapts down when spinning does not pay);
 * FULGUR_SHM_YIELD_US: how long it then calls sched_yield, so that a peer
 * sharing this core can run, before sleeping on a futex (default 1000 us).
 * FULGUR_SHM_NT_BYTES: allreduce outputs at least this large are written
 * with streaming stores (default 8 MiB). */
#define DEFAULT_CHUNK (512 << 10)

/* ------------------------------------------------------- rendezvous */

/* The inode of this process's pid namespace (0 when /proc does not say). */
static uint64_t pid_namespace(void) {
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

static void sleep_s(double t) {
    struct timespec ts = {(time_t)t, (long)((t - (double)(time_t)t) * 1e9)};
    nanosleep(&ts, NULL);
}

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static void layout(shm_state *s, int n, size_t slot_bytes, size_t p2p_slot) {
    s->n = n;
    s->slot_bytes = slot_bytes;
    s->p2p_slot = p2p_slot;
    s->chan_bytes = CHAN_HDR + 2 * p2p_slot;
    size_t ctl_off = HDR_BYTES;
    size_t chan_off = round_up(ctl_off + (size_t)n * CTL_BYTES, 4096);
    size_t data_off = round_up(chan_off + (size_t)n * (size_t)n * s->chan_bytes, 4096);
    s->len = data_off + (size_t)n * NSLOTS * slot_bytes;
    s->ctl_base = (char *)(uintptr_t)ctl_off; /* offsets until mapped */
    s->chan_base = (char *)(uintptr_t)chan_off;
    s->data = (char *)(uintptr_t)data_off;
}

static void rebase(shm_state *s, char *base) {
    s->base = base;
    s->hdr = (shm_hdr *)base;
    s->ctl_base = base + (uintptr_t)s->ctl_base;
    s->chan_base = base + (uintptr_t)s->chan_base;
    s->data = base + (uintptr_t)s->data;
}

/* The rendezvous point: an abstract unix socket (no file, gone when its
 * owner exits) named after the uid, the job and the group. */
static socklen_t sock_addr(const shm_state *s, struct sockaddr_un *addr) {
    memset(addr, 0, sizeof *addr);
    addr->sun_family = AF_UNIX;
    int k = snprintf(addr->sun_path + 1, sizeof addr->sun_path - 1, "%s", s->name + 1);
    if (k < 0 || (size_t)k >= sizeof addr->sun_path - 1) k = (int)sizeof addr->sun_path - 1;
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)k);
}

static void init_header(shm_state *s) {
    shm_hdr *h = s->hdr;
    h->version = SHM_VERSION;
    h->size = s->n;
    h->creator_pid = (int32_t)getpid();
    h->slot_bytes = s->slot_bytes;
    h->p2p_slot = s->p2p_slot;
    h->total = s->len;
    h->nslots = NSLOTS;
    atomic_store(&h->abort_rank, -1);
    atomic_store_explicit(&h->magic, SHM_MAGIC, memory_order_release);
}

static void missing_ranks(shm_state *s, char *buf, size_t cap) {
    size_t k = 0;
    buf[0] = 0;
    for (int q = 0; q < s->n && k + 16 < cap; q++)
        if (q != s->me && !atomic_load(&ctl(s, q)->pid))
            k += (size_t)snprintf(buf + k, cap - k, "%s%d", k ? ", " : "", q);
}

/* Group rank 0: makes the memory (a memfd: it has no name, so nothing can
 * be left behind) and hands it to each peer that connects to the socket. */
static FG_MUST_USE fg_status create_segment(fg_comm *c, shm_state *s, double deadline) {
    int fd = memfd_create("fulgur-shm", MFD_CLOEXEC);
    if (fd < 0) return fg_error(FG_EIO, "shm: memfd_create failed: %s", strerror(errno));
    int err = posix_fallocate(fd, 0, (off_t)s->len);
    if (err) {
        close(fd);
        return fg_error(FG_ENOMEM, "shm: cannot reserve %.1f MiB of shared memory: %s",
                        (double)s->len / 1048576.0, strerror(err));
    }
    void *p = mmap(NULL, s->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return fg_error(FG_EIO, "shm: mmap failed: %s", strerror(errno));
    }
    rebase(s, p);
    init_header(s);
    atomic_store(&ctl(s, 0)->pid, (int32_t)getpid());

    fg_status st = FG_OK;
    struct sockaddr_un addr;
    socklen_t alen = sock_addr(s, &addr);
    int ls = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (ls < 0 || bind(ls, (struct sockaddr *)&addr, alen) != 0 || listen(ls, s->n) != 0) {
        int e = errno;
        st = fg_error(e == EADDRINUSE ? FG_EINVAL : FG_EIO,
                      "shm: cannot open the rendezvous point %s: %s%s", s->name, strerror(e),
                      e == EADDRINUSE
                          ? " (another job with the same job id is running on this "
                            "machine: set FULGUR_JOB_ID or MASTER_PORT to tell them apart)"
                          : "");
        goto out;
    }
    for (int served = 0; served < s->n - 1;) {
        int conn = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
        if (conn < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                st = fg_error(FG_EIO, "shm: accept on %s failed: %s", s->name, strerror(errno));
                goto out;
            }
            if (fg_time() > deadline) {
                char miss[256];
                missing_ranks(s, miss, sizeof miss);
                st = fg_error(FG_ETIMEOUT,
                              "shm: timed out after %.3g s waiting for rank(s) %s to join %s "
                              "(FULGUR_COMM_TIMEOUT_S; same job id and world size everywhere?)",
                              c->timeout_s, miss, s->name);
                goto out;
            }
            struct pollfd pf = {.fd = ls, .events = POLLIN};
            poll(&pf, 1, 10);
            continue;
        }
        struct ucred cred;
        socklen_t cl = sizeof cred;
        if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0 && cred.uid == getuid()) {
            char cmsgbuf[CMSG_SPACE(sizeof(int))];
            memset(cmsgbuf, 0, sizeof cmsgbuf);
            uint64_t len = s->len;
            struct iovec iov = {.iov_base = &len, .iov_len = sizeof len};
            struct msghdr mh = {.msg_iov = &iov,
                                .msg_iovlen = 1,
                                .msg_control = cmsgbuf,
                                .msg_controllen = sizeof cmsgbuf};
            struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
            cm->cmsg_level = SOL_SOCKET;
            cm->cmsg_type = SCM_RIGHTS;
            cm->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(cm), &fd, sizeof fd);
            if (sendmsg(conn, &mh, MSG_NOSIGNAL) == (ssize_t)sizeof len) served++;
        }
        close(conn);
    }
out:
    if (ls >= 0) close(ls);
    close(fd);
    return st;
}

/* The other ranks: connect (retrying until the timeout) and map the memory
 * rank 0 hands over. */
static FG_MUST_USE fg_status open_segment(fg_comm *c, shm_state *s, double deadline) {
    struct sockaddr_un addr;
    socklen_t alen = sock_addr(s, &addr);
    double pause = 0.0005;
    for (;;) {
        int sk = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (sk < 0) return fg_error(FG_EIO, "shm: socket failed: %s", strerror(errno));
        if (connect(sk, (struct sockaddr *)&addr, alen) == 0) {
            struct pollfd pf = {.fd = sk, .events = POLLIN};
            while (poll(&pf, 1, 10) == 0 && fg_time() < deadline) {
            }
            uint64_t len = 0;
            char cmsgbuf[CMSG_SPACE(sizeof(int))];
            struct iovec iov = {.iov_base = &len, .iov_len = sizeof len};
            struct msghdr mh = {.msg_iov = &iov,
                                .msg_iovlen = 1,
                                .msg_control = cmsgbuf,
                                .msg_controllen = sizeof cmsgbuf};
            ssize_t k = pf.revents ? recvmsg(sk, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC) : -1;
            close(sk);
            struct cmsghdr *cm = k == (ssize_t)sizeof len ? CMSG_FIRSTHDR(&mh) : NULL;
            if (cm && cm->cmsg_type == SCM_RIGHTS) {
                int fd;
                memcpy(&fd, CMSG_DATA(cm), sizeof fd);
                if (len != s->len) {
                    close(fd);
                    return fg_error(FG_EINVAL,
                                    "shm: rank 0's segment %s has %llu bytes, this rank expects "
                                    "%zu: ranks disagree on the world size or on "
                                    "FULGUR_SHM_CHUNK_BYTES",
                                    s->name, (unsigned long long)len, s->len);
                }
                void *p = mmap(NULL, s->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                close(fd);
                if (p == MAP_FAILED)
                    return fg_error(FG_EIO, "shm: mmap failed: %s", strerror(errno));
                shm_hdr *h = p;
                if (atomic_load_explicit(&h->magic, memory_order_acquire) != SHM_MAGIC ||
                    h->size != s->n) {
                    int other = h->size;
                    munmap(p, s->len);
                    return fg_error(FG_EINVAL,
                                    "shm: segment %s is for %d ranks, this rank expects %d: ranks "
                                    "disagree on the world size, or two jobs share a job id",
                                    s->name, other, s->n);
                }
                rebase(s, p);
                return FG_OK;
            }
        } else {
            close(sk);
        }
        if (fg_time() > deadline) break;
        sleep_s(pause);
        if (pause < 0.01) pause *= 2;
    }
    return fg_error(FG_ETIMEOUT,
                    "shm: rank %d could not reach rank 0 at %s within %.3g s: is rank 0 running, "
                    "with the same job id (FULGUR_JOB_ID, MASTER_PORT) and world size?",
                    c->rank, s->name, c->timeout_s);
}

static void shm_free_state(shm_state *s) {
    if (!s) return;
    if (s->pidfd)
        for (int q = 0; q < s->n; q++)
            if (s->pidfd[q] >= 0) close(s->pidfd[q]);
    if (s->base) munmap(s->base, s->len);
    fg_free(s->pidfd);
    fg_free(s->pids);
    fg_free(s->lb_done);
    fg_free(s->watch);
    fg_free(s);
}

static FG_MUST_USE fg_status env_size(const char *name, long def, long lo, long hi, long *out) {
    FG_TRY(fg__env_int(name, def, out));
    if (*out < lo || *out > hi)
        return fg_error(FG_EINVAL, "%s=%ld: must be in [%ld, %ld]", name, *out, lo, hi);
    return FG_OK;
}

/* Builds the group's state: members meet in a segment named after the uid,
 * the job and the group; `creator` is the group's rank 0. */
static FG_MUST_USE fg_status shm_join(fg_comm *c) {
    fg_status st = FG_OK;
    shm_state *s = fg_calloc(1, sizeof *s);
    if (!s) return FG_ENOMEM;
    int n = c->size;
    s->me = c->rank;
    if (n > 4096) {
        fg_free(s);
        return fg_error(FG_EUNSUPPORTED, "shm: %d ranks on one machine: at most 4096", n);
    }
    s->pidfd = fg_alloc(sizeof(int) * (size_t)n);
    s->pids = fg_calloc((size_t)n, sizeof(int));
    s->lb_done = fg_calloc((size_t)n, sizeof(uint32_t));
    s->watch = fg_alloc((size_t)n * sizeof(bool));
    if (!s->pidfd || !s->pids || !s->lb_done || !s->watch) {
        st = FG_ENOMEM;
        goto fail;
    }
    for (int q = 0; q < n; q++) {
        s->pidfd[q] = -1;
        s->watch[q] = true;
    }
    long chunk, spin_us;
    FG_TRY_GOTO(env_size("FULGUR_SHM_CHUNK_BYTES", DEFAULT_CHUNK, 4096, 64 << 20, &chunk), st,
                fail);
    chunk = chunk / 4096 * 4096;
    if (n > 16 && chunk > (8L << 20) / n) chunk = FG_MAX(32768L, (8L << 20) / n / 4096 * 4096);
    int ncores = fg_num_cores();
    s->oversub = n > ncores;
    long yield_us;
    FG_TRY_GOTO(env_size("FULGUR_SHM_SPIN_US", s->oversub ? 1 : 50, 0, 10000000, &spin_us), st,
                fail);
    FG_TRY_GOTO(env_size("FULGUR_SHM_YIELD_US", 1000, 0, 10000000, &yield_us), st, fail);
    s->spin_s = s->spin_cur = (double)spin_us * 1e-6;
    s->yield_s = (double)yield_us * 1e-6;
    long ntb;
    FG_TRY_GOTO(env_size("FULGUR_SHM_NT_BYTES", 8L << 20, 0, 1L << 40, &ntb), st, fail);
    s->nt_bytes = (size_t)ntb;
    layout(s, n, (size_t)chunk, n <= 16 ? (16 << 10) + P2P_HDR : (4 << 10) + P2P_HDR);

    if (n == 1) { /* a world of one needs no segment: private memory, same code */
        void *p = mmap(NULL, s->len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            st = fg_error(FG_ENOMEM, "shm: cannot map %zu bytes: %s", s->len, strerror(errno));
            goto fail;
        }
        rebase(s, p);
        atomic_store(&s->hdr->abort_rank, -1);
        s->hdr->size = 1;
        atomic_store(&ctl(s, 0)->pid, (int32_t)getpid());
        s->pids[0] = getpid();
        snprintf(s->name, sizeof s->name, "(private)");
        c->impl = s;
        return FG_OK;
    }

    snprintf(s->name, sizeof s->name, "@fulgur-%u-%s-%s", (unsigned)getuid(), c->job_key,
             c->group_id);
    double t0 = fg_time(), deadline = t0 + c->timeout_s;
    bool creator = c->rank == 0;
    if (creator) FG_TRY_GOTO(create_segment(c, s, deadline), st, fail);
    else FG_TRY_GOTO(open_segment(c, s, deadline), st, fail);

    shm_hdr *h = s->hdr;
    shm_ctl *m = ctl(s, s->me);
    int32_t zero = 0, mypid = (int32_t)getpid();
    if (!creator && !atomic_compare_exchange_strong(&m->pid, &zero, mypid)) {
        st = fg_error(FG_EINVAL,
                      "shm: rank %d of %s is already taken by pid %d: two processes were given "
                      "the same rank (check FULGUR_RANK / RANK)",
                      s->me, s->name, zero);
        goto fail;
    }
    atomic_store(&m->pidns, pid_namespace());
    atomic_store(&m->state, ST_ATTACHED);
    atomic_fetch_add(&h->attached, 1);
    /* wait until everybody has mapped the memory */
    for (double pause = 0.0002;; pause = pause < 0.005 ? pause * 2 : pause) {
        if (atomic_load(&h->attached) == n) break;
        if (atomic_load(&h->abort_rank) >= 0) {
            st = fg_error(FG_EPEER, "shm: group aborted during set-up: %s", h->abort_msg);
            goto fail;
        }
        for (int q = 0; q < n; q++) {
            int pid = atomic_load(&ctl(s, q)->pid);
            /* attached is read again: a peer may have attached, finished
             * its work and exited between the first read and this one
             * (a fast rank 0 after a one-shot broadcast); everybody mapped
             * the memory then, and the set-up succeeded */
            if (pid && fg__shm_pid_dead(pid, -1) && atomic_load(&h->attached) != n) {
                st = fg_error(FG_EPEER, "shm: rank %d (pid %d) died while the group was set up", q,
                              pid);
                goto fail;
            }
        }
        if (fg_time() > deadline) {
            char miss[256];
            missing_ranks(s, miss, sizeof miss);
            st = fg_error(FG_ETIMEOUT,
                          "shm: timed out after %.3g s waiting for rank(s) %s to map %s",
                          c->timeout_s, miss, s->name);
            goto fail;
        }
        sleep_s(pause);
    }
    /* Watch each peer through a pidfd. A peer whose pid is not a live
     * process here although it just attached either died since (it is then
     * in this pid namespace: watched, so the first wait on it says it died)
     * or lives in another pid namespace (containers sharing memory): it
     * cannot be watched, and its death shows as the timeout instead. */
    uint64_t my_ns = pid_namespace();
    for (int q = 0; q < n; q++) {
        s->pids[q] = atomic_load(&ctl(s, q)->pid);
        if (q == s->me) continue;
        s->pidfd[q] = fg__shm_pidfd_open(s->pids[q]);
        bool here = my_ns && atomic_load(&ctl(s, q)->pidns) == my_ns;
        if (s->pidfd[q] < 0 && errno == ESRCH && here) continue; /* died: pid_dead says so */
        if (s->pidfd[q] < 0 && errno != ENOSYS) s->watch[q] = false;
        else if (s->pidfd[q] < 0 && fg__shm_pid_dead(s->pids[q], -1)) s->watch[q] = false;
        if (!s->watch[q])
            fg_log(FG_LOG_WARN,
                   "comm shm: rank %d (pid %d) is not visible from this process (another pid "
                   "namespace?): its death will show as a timeout only",
                   q, s->pids[q]);
    }
    c->impl = s;
    return FG_OK;

fail:
    if (s->base && s->hdr && s->n > 1) {
        char msg[700];
        snprintf(msg, sizeof msg, "rank %d failed to join: %s", s->me, fg_last_error());
        fg__shm_publish_abort(s, FG_EPEER, NULL, 0, msg);
    }
    shm_free_state(s);
    return st;
}

static FG_MUST_USE fg_status shm_init(fg_comm *c, const fg_cluster_info *info) {
    (void)info;
    FG_TRY(shm_join(c));
    return FG_OK;
}

static FG_MUST_USE fg_status shm_split(fg_comm *parent, fg_comm *child, int color, int key) {
    (void)parent;
    (void)color;
    (void)key;
    return child ? shm_join(child) : FG_OK;
}

static void shm_destroy(fg_comm *c) {
    shm_state *s = c->impl;
    if (!s) return;
    if (s->n > 1) {
        atomic_store(&ctl(s, s->me)->state, ST_LEFT);
        shm_ctl *m = ctl(s, s->me);
        for (int k = 0; k < 3; k++) futex_wake_all(&m->w[k]);
        for (int d = 0; d < s->n; d++) {
            futex_wake_all(&chan(s, s->me, d)->head);
            futex_wake_all(&chan(s, d, s->me)->tail);
        }
    }
    shm_free_state(s);
    c->impl = NULL;
}

static void shm_tell_peers(fg_comm *c) {
    shm_state *s = c->impl;
    if (!s) return;
    char msg[400];
    if (c->abort_why[0])
        snprintf(msg, sizeof msg, "rank %d aborted the group: %s", s->me, c->abort_why);
    else snprintf(msg, sizeof msg, "rank %d aborted the group (fg_comm_abort)", s->me);
    if (!fg__shm_publish_abort(s, FG_EPEER, NULL, 0, msg)) fg__shm_wake_everyone(s);
}

const fg__comm_backend fg__comm_shm_backend = {
    .name = "shm",
    .init = shm_init,
    .split = shm_split,
    .destroy = shm_destroy,
    .tell_peers = shm_tell_peers,
    .allreduce = fg__shm_allreduce,
    .reduce_scatter = fg__shm_reduce_scatter,
    .allgather = fg__shm_allgather,
    .allgatherv = fg__shm_allgatherv,
    .broadcast = fg__shm_broadcast,
    .reduce = fg__shm_reduce,
    .barrier = fg__shm_barrier,
    .alltoall = fg__shm_alltoall,
    .send = fg__shm_send,
    .recv = fg__shm_recv,
};
