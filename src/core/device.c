/* The device model: device names, opening and closing a device, its copy
 * calls, streams and events. Memory bookkeeping is in device_alloc.c, the
 * backends in device_cpu.c and device_guarded.c. */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "device_impl.h"

static const char *const KIND_NAMES[FG_DEVICE_KIND_COUNT] = {"cpu", "cuda", "guarded"};

const char *fg_device_kind_name(fg_device kind) {
    return (int)kind >= 0 && kind < FG_DEVICE_KIND_COUNT ? KIND_NAMES[kind] : "?";
}

#define NAME_HELP "expected cpu, cuda[:N] or guarded[:N] with N in 0..1023"

fg_status fg_device_parse(const char *name, fg_device_id *out) {
    if (!name || !*name) return fg_error(FG_EINVAL, "device: an empty name (%s)", NAME_HELP);
    const char *colon = strchr(name, ':');
    size_t klen = colon ? (size_t)(colon - name) : strlen(name);
    int kind = -1;
    for (int k = 0; k < FG_DEVICE_KIND_COUNT; k++)
        if (strlen(KIND_NAMES[k]) == klen && strncasecmp(name, KIND_NAMES[k], klen) == 0) kind = k;
    if (kind < 0) return fg_error(FG_EINVAL, "device '%s': unknown kind (%s)", name, NAME_HELP);
    long index = 0;
    if (colon) {
        const char *s = colon + 1;
        if (!*s)
            return fg_error(FG_EINVAL, "device '%s': no index after ':' (%s)", name, NAME_HELP);
        index = 0;
        for (; *s; s++) {
            if (!isdigit((unsigned char)*s))
                return fg_error(FG_EINVAL, "device '%s': the index is not a number (%s)", name,
                                NAME_HELP);
            index = index * 10 + (*s - '0');
            if (index > FG_DEVICE_INDEX_MAX)
                return fg_error(FG_EINVAL, "device '%s': index past %d (%s)", name,
                                FG_DEVICE_INDEX_MAX, NAME_HELP);
        }
    }
    if (kind == FG_CPU && index != 0)
        return fg_error(FG_EINVAL, "device '%s': the CPU is one device, cpu or cpu:0", name);
    out->kind = (fg_device)kind;
    out->index = (int)index;
    return FG_OK;
}

const char *fg_device_format(fg_device_id id, char *buf, size_t n) {
    if (!buf || !n) return buf;
    if ((int)id.kind < 0 || id.kind >= FG_DEVICE_KIND_COUNT || id.index < 0 ||
        id.index > FG_DEVICE_INDEX_MAX || (id.kind == FG_CPU && id.index != 0))
        snprintf(buf, n, "?");
    else if (id.kind == FG_CPU) snprintf(buf, n, "cpu");
    else snprintf(buf, n, "%s:%d", KIND_NAMES[id.kind], id.index);
    return buf;
}

/* ---------------------------------------------------------------- limits */

static FG_MUST_USE fg_status env_limit(size_t *out) {
    const char *v = getenv("FULGUR_DEVICE_MEMORY_LIMIT");
    *out = 0;
    if (!v || !*v) return FG_OK;
    char *end = NULL;
    double x = strtod(v, &end);
    double mult = 1;
    if (end && *end) {
        switch (toupper((unsigned char)*end)) {
        case 'K': mult = 1024.0; break;
        case 'M': mult = 1024.0 * 1024; break;
        case 'G': mult = 1024.0 * 1024 * 1024; break;
        default: mult = 0;
        }
        if (mult != 0 && end[1] && !(toupper((unsigned char)end[1]) == 'B' && !end[2]) &&
            !(toupper((unsigned char)end[1]) == 'I' && toupper((unsigned char)end[2]) == 'B' &&
              !end[3]))
            mult = 0;
    }
    if (end == v || mult == 0 || !(x > 0) || x * mult > 1e18)
        return fg_error(FG_EINVAL,
                        "FULGUR_DEVICE_MEMORY_LIMIT=%s: expected a positive number of bytes, "
                        "optionally with K, M or G (e.g. 512M)",
                        v);
    *out = (size_t)(x * mult);
    return FG_OK;
}

/* ---------------------------------------------------------------- backends */

/* One backend a kind; a backend built in registers itself here, one line. */
static const fg__dev_backend *const k_backends[FG_DEVICE_KIND_COUNT] = {
    [FG_CPU] = &fg__dev_cpu_backend,
    [FG_GUARDED] = &fg__dev_guarded_backend,
#ifdef FULGUR_HAVE_CUDA
    [FG_CUDA] = &fg__dev_cuda_backend,
#endif
};

#define NO_CUDA                                                                                    \
    "this build has no CUDA backend (configure with FULGUR_CUDA=ON on a machine with the CUDA "    \
    "toolkit)"

int fg_device_count(fg_device kind, char *why, size_t n) {
    if (why && n) why[0] = '\0';
    if ((int)kind < 0 || kind >= FG_DEVICE_KIND_COUNT) {
        if (why && n) snprintf(why, n, "no such device kind (%d)", (int)kind);
        return 0;
    }
    const fg__dev_backend *be = k_backends[kind];
    if (!be) {
        if (why && n) snprintf(why, n, NO_CUDA);
        return 0;
    }
    if (be->device_count) {
        char tmp[256] = "";
        fg_error_kept kept; /* a question: the caller's error stays as it was */
        fg_error_keep(&kept);
        int c = be->device_count(tmp, sizeof tmp);
        fg_error_restore(&kept);
        if (c <= 0 && why && n) snprintf(why, n, "%s", tmp);
        return c > 0 ? c : 0;
    }
    return kind == FG_CPU ? 1 : FG_DEVICE_INDEX_MAX + 1;
}

/* ------------------------------------------------------------ open/close */

fg_dev *fg_dev_open(const char *name, const fg_dev_options *opt) {
    fg_device_id id;
    if (fg_device_parse(name, &id) != FG_OK) return NULL;
    const fg__dev_backend *be = k_backends[id.kind];
    if (!be) {
        fg_error(FG_EUNSUPPORTED,
                 "device '%s': " NO_CUDA "; use cpu, or guarded to test that code is "
                 "device-clean",
                 name);
        return NULL;
    }
    fg_dev_options o = opt ? *opt : (fg_dev_options){0};
    size_t limit = o.memory_limit;
    if (!limit && env_limit(&limit) != FG_OK) return NULL;
    if (!limit) limit = be->default_limit;
    fg_dev *d = fg_calloc(1, sizeof *d);
    if (!d) return NULL;
    d->id = id;
    fg_device_format(id, d->name, sizeof d->name);
    d->be = be;
    if (be->open(id.index, limit, &d->state) != FG_OK) {
        fg_error_wrap(fg_last_status(), "device %s", d->name);
        fg_free(d);
        return NULL;
    }
    d->pid = getpid();
    atomic_init(&d->refs, 1);
    pthread_mutex_init(&d->mu, NULL);
    fg__dev_alloc_init(d, &o, limit);
    for (int k = 0; k < 2; k++) d->streams[k] = (fg_stream){d, (fg_stream_kind)k, 0};
    return d;
}

void fg_dev_retain(fg_dev *d) {
    if (d) atomic_fetch_add(&d->refs, 1);
}

void fg_dev_close(fg_dev *d) {
    if (!d) return;
    if (atomic_fetch_sub(&d->refs, 1) > 1) return; /* another reference holds it */
    fg_error_kept kept; /* a _free never changes the caller's error (core.h) */
    fg_error_keep(&kept);
    bool owner = d->pid == getpid();
    /* a close has no caller to tell (core.h): the queued work's failure is
     * logged, and the memory is released below all the same */
    if (owner && fg_dev_synchronize(d) != FG_OK)
        fg_log(FG_LOG_WARN, "device %s: synchronize at close: %s", d->name, fg_last_error());
    pthread_mutex_lock(&d->mu);
    if (owner && d->alloc.st.active_allocs) {
        char buf[512];
        fg__dev_live_summary_locked(d, buf, sizeof buf);
        fg_log(FG_LOG_WARN, "device %s closed with %s", d->name, buf);
    }
    /* a forked child frees its copy of the bookkeeping only */
    fg__dev_alloc_release_all(d, owner || d->be->host_accessible);
    pthread_mutex_unlock(&d->mu);
    pthread_mutex_destroy(&d->mu);
    d->be->close(d->state);
    fg_free(d);
    fg_error_restore(&kept);
}

fg_device_id fg_dev_id(const fg_dev *d) { return d->id; }
fg_device fg_dev_kind(const fg_dev *d) { return d->id.kind; }
const char *fg_dev_name(const fg_dev *d) { return d->name; }
bool fg_dev_host_accessible(const fg_dev *d) { return d->be->host_accessible; }

/* ---------------------------------------------------------------- memory */

fg_status fg__dev_check_process(const fg_dev *d) {
    if (d->pid == getpid()) return FG_OK;
    return fg_error(FG_ESTATE,
                    "device %s was opened by process %ld, before this process forked from it: "
                    "a device does not survive a fork (as a CUDA context does not); open devices "
                    "after the ranks fork",
                    d->name, (long)d->pid);
}

void *fg_dev_alloc(fg_dev *d, size_t bytes, fg_stream *stream) {
    if (fg__dev_check_process(d) != FG_OK) return NULL;
    if (stream && stream->dev != d) {
        fg_error(FG_EINVAL, "device %s: allocation for a stream of device %s", d->name,
                 stream->dev->name);
        return NULL;
    }
    pthread_mutex_lock(&d->mu);
    void *p = fg__dev_alloc_locked(d, bytes, stream ? stream : &d->streams[FG_STREAM_COMPUTE]);
    pthread_mutex_unlock(&d->mu);
    return p;
}

fg_status fg_dev_free(fg_dev *d, void *ptr) {
    if (!ptr) return FG_OK;
    FG_TRY(fg__dev_check_process(d));
    pthread_mutex_lock(&d->mu);
    fg_status s = fg__dev_free_locked(d, ptr);
    pthread_mutex_unlock(&d->mu);
    return s;
}

void fg_dev_empty_cache(fg_dev *d) {
    pthread_mutex_lock(&d->mu);
    fg__dev_empty_cache_locked(d);
    pthread_mutex_unlock(&d->mu);
}

fg_dev_memory_stats fg_dev_memory_stats_get(fg_dev *d) {
    pthread_mutex_lock(&d->mu);
    fg_dev_memory_stats s;
    fg__dev_stats_locked(d, &s);
    pthread_mutex_unlock(&d->mu);
    return s;
}

void fg_dev_reset_peak_stats(fg_dev *d) {
    pthread_mutex_lock(&d->mu);
    d->alloc.st.allocated_bytes_peak = d->alloc.st.allocated_bytes;
    d->alloc.st.reserved_bytes_peak = d->alloc.st.reserved_bytes;
    pthread_mutex_unlock(&d->mu);
}

void fg_dev_reset_copy_stats(fg_dev *d) {
    pthread_mutex_lock(&d->mu);
    fg_dev_memory_stats *s = &d->alloc.st;
    s->h2d_bytes = s->d2h_bytes = s->d2d_bytes = 0;
    s->h2d_copies = s->d2h_copies = s->d2d_copies = 0;
    s->comm_h2d_bytes = s->comm_d2h_bytes = 0;
    pthread_mutex_unlock(&d->mu);
}

const char *fg_dev_memory_summary(fg_dev *d, char *buf, size_t n) {
    fg_dev_memory_stats s = fg_dev_memory_stats_get(d);
    char a[32], ap[32], r[32], rp[32], lim[32], h[32], dh[32], dd[32];
    snprintf(buf, n,
             "%s: allocated %s (peak %s), reserved %s (peak %s), limit %s; %llu live, %llu "
             "allocations, %llu frees, %llu cache hits, %llu segments taken, %llu given back, "
             "%llu out-of-memory; copied host->device %s, device->host %s, device->device %s",
             d->name, fg__fmt_bytes(s.allocated_bytes, a, sizeof a),
             fg__fmt_bytes(s.allocated_bytes_peak, ap, sizeof ap),
             fg__fmt_bytes(s.reserved_bytes, r, sizeof r),
             fg__fmt_bytes(s.reserved_bytes_peak, rp, sizeof rp),
             s.memory_limit ? fg__fmt_bytes(s.memory_limit, lim, sizeof lim) : "none",
             (unsigned long long)s.active_allocs, (unsigned long long)s.num_allocs,
             (unsigned long long)s.num_frees, (unsigned long long)s.cache_hits,
             (unsigned long long)s.segment_allocs, (unsigned long long)s.segment_frees,
             (unsigned long long)s.num_ooms, fg__fmt_bytes(s.h2d_bytes, h, sizeof h),
             fg__fmt_bytes(s.d2h_bytes, dh, sizeof dh), fg__fmt_bytes(s.d2d_bytes, dd, sizeof dd));
    return buf;
}

fg_status fg_dev_leak_check(fg_dev *d) {
    pthread_mutex_lock(&d->mu);
    fg_status s = FG_OK;
    if (d->alloc.st.active_allocs) {
        char buf[512];
        fg__dev_live_summary_locked(d, buf, sizeof buf);
        s = fg_error(FG_ESTATE, "device %s: %s; free every tensor on the device before it closes",
                     d->name, buf);
    }
    pthread_mutex_unlock(&d->mu);
    return s;
}

void *fg_dev_host_alloc(fg_dev *d, size_t bytes) {
    if (d->be->host_alloc) return d->be->host_alloc(d->state, bytes); /* pinned */
    return fg_alloc(bytes); /* cpu and guarded: plain host memory */
}

void fg_dev_host_free(fg_dev *d, void *ptr) {
    if (d->be->host_free) {
        if (ptr) d->be->host_free(d->state, ptr);
        return;
    }
    fg_free(ptr);
}

void *fg__dev_host_view(fg_dev *d, const void *p, size_t bytes) {
    if (!d->be->host_view) {
        fg_error(FG_EUNSUPPORTED, "device %s: the host cannot map its memory", d->name);
        return NULL;
    }
    if (d->be->host_accessible) return (void *)p;
    if (fg__dev_check_process(d) != FG_OK) return NULL;
    pthread_mutex_lock(&d->mu);
    const fg__block *b = fg__dev_find_locked(d, p, bytes);
    pthread_mutex_unlock(&d->mu);
    if (!b) {
        fg_error(FG_EINVAL,
                 "device %s: [%p, +%zu bytes) is not inside one live allocation of the device "
                 "(a host pointer, a freed block, or a range past the end of its block)",
                 d->name, p, bytes);
        return NULL;
    }
    return d->be->host_view(d->state, p);
}

/* ---------------------------------------------------------------- copies */

enum { H2D, D2H, D2D };

static FG_MUST_USE fg_status copy(fg_dev *d, void *dst, const void *src, size_t bytes, int dir,
                                  fg_stream *s, bool async) {
    static const char *const what[] = {"copy_h2d", "copy_d2h", "copy_d2d"};
    if (!s) s = &d->streams[FG_STREAM_COMPUTE];
    if (s->dev != d)
        return fg_error(FG_EINVAL, "device %s: %s on a stream of device %s", d->name, what[dir],
                        s->dev->name);
    FG_TRY(fg__dev_check_process(d));
    if (bytes && (!dst || !src))
        return fg_error(FG_EINVAL, "device %s: %s of %zu bytes with a NULL pointer", d->name,
                        what[dir], bytes);
    if (bytes) {
        if (d->be->copy) {
            FG_TRY(d->be->copy(d->state, dst, src, bytes, dir, s, async));
        } else {
            void *vd = dst;
            const void *vs = src;
            if (dir != H2D && !(vs = fg__dev_host_view(d, src, bytes)))
                return fg_error_wrap(fg_last_status(), "%s source", what[dir]);
            if (dir != D2H && !(vd = fg__dev_host_view(d, dst, bytes)))
                return fg_error_wrap(fg_last_status(), "%s destination", what[dir]);
            memmove(vd, vs, bytes);
        }
    }
    pthread_mutex_lock(&d->mu);
    fg_dev_memory_stats *st = &d->alloc.st;
    if (dir == H2D) st->h2d_bytes += bytes, st->h2d_copies++;
    if (dir == D2H) st->d2h_bytes += bytes, st->d2h_copies++;
    if (dir == D2D) st->d2d_bytes += bytes, st->d2d_copies++;
    if (s->kind == FG_STREAM_COMM && dir == H2D) st->comm_h2d_bytes += bytes;
    if (s->kind == FG_STREAM_COMM && dir == D2H) st->comm_d2h_bytes += bytes;
    pthread_mutex_unlock(&d->mu);
    s->work++;
    return FG_OK;
}

fg_status fg_dev_copy_h2d(fg_dev *d, void *dst, const void *src, size_t bytes) {
    return copy(d, dst, src, bytes, H2D, NULL, false);
}
fg_status fg_dev_copy_d2h(fg_dev *d, void *dst, const void *src, size_t bytes) {
    return copy(d, dst, src, bytes, D2H, NULL, false);
}
fg_status fg_dev_copy_d2d(fg_dev *d, void *dst, const void *src, size_t bytes) {
    return copy(d, dst, src, bytes, D2D, NULL, false);
}
fg_status fg_dev_copy_h2d_async(fg_dev *d, void *dst, const void *src, size_t bytes,
                                fg_stream *stream) {
    return copy(d, dst, src, bytes, H2D, stream, true);
}
fg_status fg_dev_copy_d2h_async(fg_dev *d, void *dst, const void *src, size_t bytes,
                                fg_stream *stream) {
    return copy(d, dst, src, bytes, D2H, stream, true);
}

fg_status fg_dev_memset(fg_dev *d, void *dst, int value, size_t bytes, fg_stream *stream) {
    fg_stream *s = stream ? stream : &d->streams[FG_STREAM_COMPUTE];
    if (s->dev != d)
        return fg_error(FG_EINVAL, "device %s: memset on a stream of device %s", d->name,
                        s->dev->name);
    FG_TRY(fg__dev_check_process(d));
    if (bytes && d->be->memset) {
        FG_TRY(d->be->memset(d->state, dst, value, bytes, (int)s->kind));
    } else if (bytes) {
        void *v = fg__dev_host_view(d, dst, bytes);
        if (!v) return fg_error_wrap(fg_last_status(), "memset");
        memset(v, value, bytes);
    }
    s->work++;
    return FG_OK;
}

fg_status fg_dev_discard(fg_dev *d, void *dst, size_t bytes, bool zero, size_t *given) {
    if (given) *given = 0;
    FG_TRY(fg__dev_check_process(d));
    if (!bytes) return FG_OK;
    pthread_mutex_lock(&d->mu);
    const fg__block *b = fg__dev_find_locked(d, dst, bytes);
    pthread_mutex_unlock(&d->mu);
    if (!b)
        return fg_error(FG_EINVAL,
                        "device %s: discard of [%p, +%zu bytes): not inside one live allocation",
                        d->name, dst, bytes);
    uintptr_t p0 = (uintptr_t)dst, p1 = p0 + bytes, q0 = p0, q1 = p0;
    if (d->be->discard) {
        uintptr_t ps = d->be->discard_page;
        q0 = (p0 + ps - 1) & ~(ps - 1);
        q1 = p1 & ~(ps - 1);
        if (q1 <= q0) q0 = q1 = p0;
    }
    if (q1 > q0) {
        FG_TRY(d->be->discard(d->state, (void *)q0, q1 - q0));
        pthread_mutex_lock(&d->mu);
        d->alloc.st.discarded_bytes += q1 - q0;
        pthread_mutex_unlock(&d->mu);
        if (given) *given = q1 - q0;
    }
    if (!zero) return FG_OK;
    if (q1 > q0) {
        FG_TRY(fg_dev_memset(d, dst, 0, q0 - p0, NULL));
        return fg_dev_memset(d, (void *)q1, 0, p1 - q1, NULL);
    }
    return fg_dev_memset(d, dst, 0, bytes, NULL);
}

fg_status fg_dev_fill(fg_dev *d, void *dst, const void *pattern, size_t psize, size_t count,
                      fg_stream *stream) {
    fg_stream *s = stream ? stream : &d->streams[FG_STREAM_COMPUTE];
    if (s->dev != d)
        return fg_error(FG_EINVAL, "device %s: fill on a stream of device %s", d->name,
                        s->dev->name);
    if (!psize || psize > 16)
        return fg_error(FG_EINVAL, "device %s: fill with a %zu-byte pattern (1 to 16)", d->name,
                        psize);
    FG_TRY(fg__dev_check_process(d));
    if (count && d->be->fill) {
        if (count > SIZE_MAX / psize)
            return fg_error(FG_EINVAL, "device %s: fill of %zu x %zu bytes overflows", d->name,
                            count, psize);
        FG_TRY(d->be->fill(d->state, dst, pattern, psize, count, (int)s->kind));
    } else if (count) {
        if (count > SIZE_MAX / psize)
            return fg_error(FG_EINVAL, "device %s: fill of %zu x %zu bytes overflows", d->name,
                            count, psize);
        char *v = fg__dev_host_view(d, dst, count * psize);
        if (!v) return fg_error_wrap(fg_last_status(), "fill");
        memcpy(v, pattern, psize);
        /* doubling copies: log2(count) memcpys */
        for (size_t have = 1; have < count;) {
            size_t n = have <= count - have ? have : count - have;
            memcpy(v + have * psize, v, n * psize);
            have += n;
        }
    }
    s->work++;
    return FG_OK;
}

/* ------------------------------------------------------- streams, events */

fg_stream *fg_dev_stream(fg_dev *d, fg_stream_kind kind) {
    return &d->streams[kind == FG_STREAM_COMM ? 1 : 0];
}
fg_dev *fg_stream_dev(const fg_stream *s) { return s->dev; }
uint64_t fg_stream_work_count(const fg_stream *s) { return s->work; }

fg_status fg_stream_synchronize(fg_stream *s) {
    fg_dev *d = s->dev;
    if (d->be->stream_synchronize) return d->be->stream_synchronize(d->state, (int)s->kind);
    return d->be->synchronize ? d->be->synchronize(d->state) : FG_OK;
}

fg_status fg_dev_synchronize(fg_dev *d) {
    return d->be->synchronize ? d->be->synchronize(d->state) : FG_OK;
}

struct fg_event {
    fg_dev *dev;
    fg_stream *stream;
    uint64_t point;
    void *be_event; /* the backend's event (cuda), NULL on immediate devices */
};

fg_event *fg_event_new(fg_dev *d) {
    fg_event *e = fg_calloc(1, sizeof *e);
    if (e) e->dev = d;
    if (e && d->be->event_new && !(e->be_event = d->be->event_new(d->state))) {
        fg_free(e);
        return NULL;
    }
    return e;
}

void fg_event_free(fg_event *e) {
    if (e && e->be_event) e->dev->be->event_free(e->dev->state, e->be_event);
    fg_free(e);
}

fg_status fg_event_record(fg_event *e, fg_stream *stream) {
    if (stream->dev != e->dev)
        return fg_error(FG_EINVAL, "event of device %s recorded on a stream of device %s",
                        e->dev->name, stream->dev->name);
    if (e->be_event)
        FG_TRY(e->dev->be->event_record(e->dev->state, e->be_event, (int)stream->kind));
    e->stream = stream;
    e->point = stream->work;
    stream->work++;
    return FG_OK;
}

fg_status fg_stream_wait_event(fg_stream *stream, fg_event *e) {
    if (stream->dev != e->dev)
        return fg_error(FG_EINVAL, "a stream of device %s waits on an event of device %s",
                        stream->dev->name, e->dev->name);
    /* immediate streams: the event's work is done already */
    if (e->be_event && e->stream)
        FG_TRY(e->dev->be->event_wait(e->dev->state, (int)stream->kind, e->be_event));
    stream->work++;
    return FG_OK;
}

bool fg_event_query(const fg_event *e) {
    if (e->be_event && e->stream) return e->dev->be->event_query(e->dev->state, e->be_event);
    return !e->stream || e->stream->work > e->point; /* immediate: done at record */
}

fg_status fg_event_synchronize(fg_event *e) {
    if (e->be_event && e->stream) return e->dev->be->event_synchronize(e->dev->state, e->be_event);
    return e->stream ? fg_stream_synchronize(e->stream) : FG_OK;
}

fg_stream *fg_event_stream(const fg_event *e) { return e->stream; }
uint64_t fg_event_point(const fg_event *e) { return e->point; }
