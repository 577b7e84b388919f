/* Matchmaking and Hivemind's butterfly all-reduce. The group of round e is
 * the live peers ready at epoch e, sorted by id. The members then exchange
 * their views of it (the DHT is eventually consistent: a peer that just
 * joined may be in some views only) and merge them, so that they agree on
 * the members, their weights and the digest every message then carries (a
 * part of another view is not used). Member k reduces part k: the weighted
 * mean, in member order, of the parts that came before averaging_timeout;
 * a reduced part that does not come keeps the local values. Sends are
 * asynchronous (nng aio), so a dead or stopped member costs a timeout, not
 * a blocked send. */
#include "hivemind_impl.h"

#ifdef FULGUR_HAVE_HIVEMIND
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void fg__hm_mail_put(fg_hivemind *h, const fg__hm_hdr *hd, void *payload, int64_t n) {
    pthread_mutex_lock(&h->mu);
    bool dup = false;
    for (int i = 0; i < h->nmail && !dup; i++) {
        const fg__hm_hdr *o = &h->mail[i].h;
        dup = o->kind == hd->kind && o->sender == hd->sender && o->round == hd->round &&
              o->channel == hd->channel && o->part == hd->part && o->digest == hd->digest;
    }
    if (dup || hd->round < h->min_round || h->nmail >= FG__HM_MAILBOX_MAX) {
        pthread_mutex_unlock(&h->mu);
        fg_free(payload);
        return;
    }
    h->mail[h->nmail++] = (fg__hm_mail){.h = *hd, .vals = payload, .nvals = n};
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

/* Drops mail of rounds before r (under h->mu). */
static void drop_before(fg_hivemind *h, int64_t r) {
    int k = 0;
    for (int i = 0; i < h->nmail; i++) {
        if (h->mail[i].h.round < r) fg_free(h->mail[i].vals);
        else h->mail[k++] = h->mail[i];
    }
    h->nmail = k;
    if (r > h->min_round) h->min_round = r;
}

static int cmp_member(const void *a, const void *b) {
    uint64_t x = ((const fg__hm_member *)a)->id, y = ((const fg__hm_member *)b)->id;
    return x < y ? -1 : x > y;
}

uint64_t fg__hm_group_digest(int64_t round, const uint64_t *ids, int n) {
    uint64_t d;
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, sizeof d);
    crypto_generichash_update(&st, (const unsigned char *)&round, sizeof round);
    crypto_generichash_update(&st, (const unsigned char *)ids, (size_t)n * sizeof ids[0]);
    crypto_generichash_final(&st, (unsigned char *)&d, sizeof d);
    return d;
}

/* Waits for news (a record, a message) at most 20 ms; under h->mu. */
static void wait_20ms(fg_hivemind *h) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 20 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&h->cv, &h->mu, &ts);
}

/* Makes v (n members sorted by id) the group of `round`: ids, URLs, this
 * peer's index (-1 if absent), the digest, the members' weights. */
static void set_group(fg_hivemind *h, int64_t round, const fg__hm_member *v, int n) {
    h->ngroup = n;
    h->me = -1;
    h->group_weight = 0;
    for (int i = 0; i < n; i++) {
        h->group_ids[i] = v[i].id;
        memcpy(h->group_urls[i], v[i].url, FG__HM_URL_MAX);
        h->group_weight += v[i].weight;
        if (v[i].id == h->id) h->me = i;
    }
    h->digest = fg__hm_group_digest(round, h->group_ids, n);
    h->group_round = round;
}

/* The push socket to a member's URL, dialled once (nng reconnects). */
static nng_socket *push_to(fg_hivemind *h, const char *url) {
    for (int i = 0; i < h->npushes; i++)
        if (!strcmp(h->pushes[i].url, url)) return &h->pushes[i].sock;
    if (h->npushes == FG__HM_MAX_GROUP) { /* forget the oldest */
        nng_close(h->pushes[0].sock);
        memmove(h->pushes, h->pushes + 1, sizeof h->pushes[0] * (FG__HM_MAX_GROUP - 1));
        h->npushes--;
    }
    fg__hm_push *p = &h->pushes[h->npushes];
    if (nng_push0_open(&p->sock) != 0) return NULL;
    nng_socket_set_ms(p->sock, NNG_OPT_RECONNMINT, 50);
    nng_socket_set_ms(p->sock, NNG_OPT_RECONNMAXT, 500);
    if (nng_dial(p->sock, url, NULL, NNG_FLAG_NONBLOCK) != 0) {
        nng_close(p->sock);
        return NULL;
    }
    snprintf(p->url, sizeof p->url, "%s", url);
    h->npushes++;
    return &p->sock;
}

#define FG__HM_MAX_SENDS (4 * FG__HM_MAX_GROUP)
typedef struct sends {
    nng_aio *aio[FG__HM_MAX_SENDS];
    int done[FG__HM_MAX_SENDS]; /* set by nng's callback when the send ends */
    int n;
    size_t bytes;
} sends;

static void send_ended(void *arg) { __atomic_store_n((int *)arg, 1, __ATOMIC_RELEASE); }

static void send_async(fg_hivemind *h, sends *s, const char *url, nng_msg *m, double timeout) {
    nng_socket *sock = push_to(h, url);
    nng_aio *a = NULL;
    if (s->n < FG__HM_MAX_SENDS) s->done[s->n] = 0;
    if (!sock || s->n == FG__HM_MAX_SENDS || nng_aio_alloc(&a, send_ended, &s->done[s->n]) != 0) {
        nng_msg_free(m);
        return;
    }
    s->bytes += nng_msg_len(m);
    nng_aio_set_msg(a, m);
    nng_aio_set_timeout(a, (nng_duration)(timeout * 1000));
    nng_send_aio(*sock, a);
    s->aio[s->n++] = a;
}

/* Waits for the sends (up to `grace` s each), then cancels what is left. */
static void sends_finish(sends *s, double grace) {
    double end = fg_time() + grace;
    for (int i = 0; i < s->n; i++) {
        while (!__atomic_load_n(&s->done[i], __ATOMIC_ACQUIRE) && fg_time() < end) {
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
        }
        nng_aio_cancel(s->aio[i]);
        nng_aio_wait(s->aio[i]);
        if (nng_aio_result(s->aio[i]) != 0) {
            nng_msg *m = nng_aio_get_msg(s->aio[i]);
            if (m) nng_msg_free(m);
        }
        nng_aio_free(s->aio[i]);
    }
    s->n = 0;
}

/* The members' views of the group, exchanged: each sends its view to the
 * others, and a view that holds members this one lacks (a peer that joined
 * while the DHT was still spreading its record, say) is merged in and sent
 * again, until every member has said this peer's view or the exchange's
 * time (matchmaking_time + 1 s, at most half the averaging timeout) ends.
 * The members that spoke give their own weights; so members that agree
 * decide alike whether the group holds the target. */
static void exchange_views(fg_hivemind *h, fg__hm_member *v, int *n, double weight) {
    int64_t round = h->group_round;
    double t = h->o.matchmaking_time + 1.0, half = h->o.averaging_timeout / 2;
    double end = fg_time() + (half > 0 && half < t ? half : t);
    uint64_t said[FG__HM_MAX_GROUP] = {0}; /* the digest each member's newest view had */
    sends s = {.n = 0};
    bool changed = true;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        if (changed) { /* (again) to every member: this view */
            changed = false;
            pthread_mutex_unlock(&h->mu);
            fg__hm_hdr hd = {.kind = FG__HM_VIEW,
                             .round = round,
                             .digest = h->digest,
                             .nparts = (uint32_t)*n,
                             .weight = weight};
            for (int j = 0; j < *n; j++) {
                nng_msg *msg;
                if (j == h->me) continue;
                if (fg__hm_frame(h, hd, NULL, 0, v, (size_t)*n * sizeof v[0], &msg) != FG_OK) {
                    fg_clear_error(); /* out of memory: the others wait as for a silent one */
                    continue;
                }
                send_async(h, &s, h->group_urls[j], msg, end - fg_time() + 1.0);
            }
            pthread_mutex_lock(&h->mu);
        }
        for (int i = 0; i < h->nmail; i++) {
            if (h->mail[i].h.kind != FG__HM_VIEW || h->mail[i].h.round != round) continue;
            fg__hm_mail got = h->mail[i];
            h->mail[i--] = h->mail[--h->nmail];
            bool added = false;
            for (int k = 0; k < (int)got.h.nparts; k++) {
                int at = 0;
                while (at < *n && v[at].id < got.members[k].id) at++;
                if ((at < *n && v[at].id == got.members[k].id) || *n == FG__HM_MAX_GROUP) continue;
                memmove(v + at + 1, v + at, (size_t)(*n - at) * sizeof v[0]);
                memmove(said + at + 1, said + at, (size_t)(*n - at) * sizeof said[0]);
                v[at] = got.members[k];
                said[at] = 0;
                (*n)++;
                added = true;
            }
            for (int j = 0; j < *n; j++)
                if (v[j].id == got.h.sender) {
                    v[j].weight = got.h.weight; /* its own word */
                    said[j] = got.h.digest;
                }
            if (added) {
                h->views_merged++;
                fg_log(FG_LOG_INFO,
                       "hivemind: round %lld: the view of peer %016llx adds members: a group "
                       "of %d",
                       (long long)round, (unsigned long long)got.h.sender, *n);
                set_group(h, round, v, *n);
                changed = true;
            }
            fg_free(got.members);
        }
        if (changed) continue;
        int missing = 0;
        for (int j = 0; j < *n; j++) missing += j != h->me && said[j] != h->digest;
        if (missing == 0 || fg_time() >= end) break;
        wait_20ms(h);
    }
    /* A member that never said this view by the end formed its group
     * without it (this peer's view came after it had agreed with the
     * others: a joiner whose record it had not seen yet), or cannot take
     * part (stopped): it would send this peer no part, and this peer would
     * wait the averaging timeout for each. The group is the members that
     * said it; the weight they hold decides, as for any group. */
    int kept = 0, left = 0;
    for (int j = 0; j < *n; j++) {
        if (v[j].id != h->id && said[j] != h->digest) {
            left++;
            continue;
        }
        v[kept++] = v[j];
    }
    if (left)
        fg_log(FG_LOG_INFO,
               "hivemind: round %lld: %d of %d members did not confirm this peer's view of the "
               "group in time: a group of %d without them",
               (long long)round, left, *n, kept);
    *n = kept;
    set_group(h, round, v, *n); /* the weights as the members said them */
    pthread_mutex_unlock(&h->mu);
    /* a member may still wait for this view (the last one sent) */
    double rest = end - fg_time();
    sends_finish(&s, rest > 0.2 ? rest : 0.2);
}

/* Whether a live peer at or behind `epoch`, not yet ready, is still worth
 * the wait (under h->mu). One of unknown pace, or of the ready peers' pace
 * (its step at most twice their mean `step_s`), always is (until
 * matchmaking_time): left out, it would have to download the state. A
 * slower one while what it would bring (its samples, and its next step's)
 * is at least what the ready peers (`pace` samples/s) give up waiting for
 * its next step to come (one whose step is due already costs nothing more:
 * its records may lag). So a straggler is not waited for: it loads the
 * state at its next step. */
static bool waiting_pays(const fg_hivemind *h, int64_t epoch, double now, double pace,
                         double step_s) {
    for (int i = 0; i < h->npeers; i++) {
        const fg__hm_peer *p = &h->peers[i];
        if (!fg__hm_live(h, p, now) || p->r.epoch > epoch ||
            (p->r.ready != 0 && p->r.epoch == epoch))
            continue;
        /* of the ready peers' pace (within 2x): waited for, as leaving it
         * out costs it a state download */
        if (p->r.step_s <= 2 * step_s || pace <= 0) return true;
        double due = p->seen + p->r.step_s, eta = due > now ? due - now : 0;
        double brings = (p->r.epoch == epoch ? (double)p->r.samples : 0) + p->r.step_samples;
        if (eta * pace <= brings) return true;
    }
    return false;
}

fg_status fg_hivemind_matchmake(fg_hivemind *h, int64_t epoch, double weight, int *members) {
    if (!h) return fg_error(FG_EINVAL, "hivemind matchmake: NULL peer");
    if (!(weight > 0))
        return fg_error(FG_EINVAL,
                        "hivemind matchmake: weight %g (expected > 0: the samples "
                        "accumulated)",
                        weight);
    pthread_mutex_lock(&h->mu);
    drop_before(h, epoch);
    h->mine.epoch = epoch;
    h->mine.ready = 1;
    h->mine.weight = weight;
    int64_t samples = h->mine.samples; /* another thread may publish too */
    pthread_mutex_unlock(&h->mu);
    FG_TRY(fg_hivemind_publish(h, epoch, samples, true));
    pthread_mutex_lock(&h->mu);
    h->mine.weight = weight;
    double end = fg_time() + h->o.matchmaking_time;
    for (;;) {
        double now = fg_time();
        int at = 0, ready = 0;
        double pace = 0, steps = 0; /* the ready peers' samples per second, their step times */
        int known = 0;
        for (int i = 0; i < h->npeers; i++) {
            const fg__hm_peer *p = &h->peers[i];
            /* peers behind are waited for too: their records may be older than
             * their progress, and they may reach this epoch in time */
            if (!fg__hm_live(h, p, now) || p->r.epoch > epoch) continue;
            at++;
            bool r = p->r.ready != 0 && p->r.epoch == epoch;
            ready += r;
            if (r && p->r.step_s > 0) {
                pace += p->r.step_samples / p->r.step_s;
                steps += p->r.step_s;
                known++;
            }
        }
        /* a put is asynchronous and never waited for: a DHT node that stalls
         * (a stopped peer) delays its acknowledgement by OpenDHT's timeouts */
        bool worth =
            ready < at && now < end && waiting_pays(h, epoch, now, pace, known ? steps / known : 0);
        if (!worth) {
            fg_log(FG_LOG_DEBUG,
                   "hivemind: matchmaking of round %lld ends: %d of %d live peers at the epoch "
                   "ready",
                   (long long)epoch, ready, at);
            break;
        }
        wait_20ms(h);
    }
    double now = fg_time();
    fg__hm_member v[FG__HM_MAX_GROUP];
    int n = 0;
    for (int i = 0; i < h->npeers && n < FG__HM_MAX_GROUP; i++) {
        const fg__hm_peer *p = &h->peers[i];
        if (!fg__hm_live(h, p, now) || p->r.epoch > epoch) continue;
        if (p->r.epoch < epoch || !p->r.ready) {
            /* waited for to the end and not ready: not counted until it is heard again */
            if (p->r.peer != h->id) fg__hm_suspect(h, p->r.peer);
            continue;
        }
        fg__hm_member *m = &v[n++];
        memset(m, 0, sizeof *m);
        m->id = p->r.peer;
        m->weight = p->r.peer == h->id ? weight : p->r.weight;
        size_t len = strnlen(p->r.url_msg, FG__HM_URL_MAX - 1); /* a bounded copy */
        memcpy(m->url, p->r.url_msg, len);
    }
    pthread_mutex_unlock(&h->mu);
    qsort(v, (size_t)n, sizeof v[0], cmp_member);
    set_group(h, epoch, v, n);
    if (h->me < 0) return fg_error(FG_EINTERNAL, "hivemind matchmake: this peer not in its group");
    exchange_views(h, v, &n, weight);
    if (members) *members = h->ngroup;
    fg_log(FG_LOG_INFO, "hivemind: round %lld: a group of %d (this peer %016llx is member %d)",
           (long long)epoch, h->ngroup, (unsigned long long)h->id, h->me);
    return FG_OK;
}

/* Takes the mail of (kind, round, channel, part, digest) from `sender` into
 * *out (the caller frees its vals); waits until `end`. True if it came. A
 * mail from that sender of another group view or size is refused. */
static bool take_mail(fg_hivemind *h, int kind, int channel, int part, uint64_t sender, int64_t n,
                      int codec, double end, fg__hm_mail *out) {
    pthread_mutex_lock(&h->mu);
    for (;;) {
        for (int i = 0; i < h->nmail; i++) {
            fg__hm_mail *m = &h->mail[i];
            /* a part of another view of the group stays (its sender may
             * still come to this view; the round's end drops it) */
            if (m->h.kind != kind || m->h.round != h->group_round || m->h.channel != channel ||
                m->h.sender != sender || (int)m->h.part != part || m->h.digest != h->digest)
                continue;
            fg__hm_mail got = *m;
            h->mail[i] = h->mail[--h->nmail];
            pthread_mutex_unlock(&h->mu);
            if (got.h.nparts != (uint32_t)h->ngroup || got.h.n_total != n || got.h.codec != codec) {
                fg__hm_refuse(h, sender,
                              "part %d of round %lld: %u parts of %lld values (%s) and group "
                              "%016llx, this peer has %d of %lld (%s) and %016llx",
                              part, (long long)got.h.round, got.h.nparts, (long long)got.h.n_total,
                              fg_hivemind_compression_name((fg_hivemind_compression)got.h.codec),
                              (unsigned long long)got.h.digest, h->ngroup, (long long)n,
                              fg_hivemind_compression_name((fg_hivemind_compression)codec),
                              (unsigned long long)h->digest);
                fg_free(got.vals);
                pthread_mutex_lock(&h->mu);
                continue;
            }
            *out = got;
            return true;
        }
        double now = fg_time();
        if (now >= end) break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double wait = end - now < 0.05 ? end - now : 0.05;
        long ns = ts.tv_nsec + (long)(wait * 1e9);
        ts.tv_sec += ns / 1000000000L;
        ts.tv_nsec = ns % 1000000000L;
        pthread_cond_timedwait(&h->cv, &h->mu, &ts);
    }
    pthread_mutex_unlock(&h->mu);
    return false;
}

/* Rounds a part through the codec, so that every member holds its bits. */
static FG_MUST_USE fg_status through_codec(fg_hivemind *h, fg_hivemind_compression c, float *v,
                                           int64_t n) {
    if (c == FG_HIVEMIND_COMPRESSION_NONE || n == 0) return FG_OK;
    nng_msg *m;
    fg__hm_hdr hd = {.codec = (uint8_t)c};
    FG_TRY(fg__hm_frame(h, hd, v, n, NULL, 0, &m));
    fg__hm_hdr out;
    memcpy(&out, nng_msg_body(m), sizeof out);
    fg_status s = fg__hm_decode(&out, (unsigned char *)nng_msg_body(m) + sizeof out, v, n);
    nng_msg_free(m);
    return s;
}

fg_status fg_hivemind_allreduce(fg_hivemind *h, int channel, float *data, int64_t n, double weight,
                                fg_hivemind_compression c, fg_hivemind_round *info) {
    if (info) memset(info, 0, sizeof *info);
    if (!h || (!data && n > 0) || n < 0 || !(weight > 0) || (int)c < 0 ||
        c >= FG_HIVEMIND_COMPRESSION_COUNT || channel < 0 || channel > 255)
        return fg_error(FG_EINVAL,
                        "hivemind allreduce: peer %p, data %p, n %lld, weight %g, "
                        "compression %d, channel %d",
                        (void *)h, (void *)data, (long long)n, weight, (int)c, channel);
    if (h->group_round < 0)
        return fg_error(FG_ESTATE, "hivemind allreduce: no group (fg_hivemind_matchmake first)");
    int m = h->ngroup, k = h->me;
    pthread_mutex_lock(&h->mu);
    int64_t refused0 = h->refused; /* the receiver thread counts refusals */
    pthread_mutex_unlock(&h->mu);
    double t = h->o.averaging_timeout;
    double end1 = fg_time() + t, end2 = end1 + (t / 4 > 1 ? t / 4 : 1);
    sends s = {.n = 0};
    fg__hm_hdr base = {.codec = (uint8_t)c,
                       .channel = (uint8_t)channel,
                       .round = h->group_round,
                       .digest = h->digest,
                       .n_total = n,
                       .nparts = (uint32_t)m,
                       .weight = weight};
    for (int j = 0; j < m; j++) {
        if (j == k) continue;
        int64_t lo, hi;
        fg__hm_part_bounds(n, m, j, &lo, &hi);
        fg__hm_hdr hd = base;
        hd.kind = FG__HM_PART;
        hd.part = (uint32_t)j;
        nng_msg *msg;
        FG_TRY(fg__hm_frame(h, hd, data + lo, hi - lo, NULL, 0, &msg));
        send_async(h, &s, h->group_urls[j], msg, end2 - fg_time());
    }
    /* reduce this peer's part */
    int64_t lo, hi;
    fg__hm_part_bounds(n, m, k, &lo, &hi);
    int64_t np = hi - lo;
    double *acc = fg_alloc((size_t)(np ? np : 1) * sizeof(double));
    fg__hm_mail got[FG__HM_MAX_GROUP];
    bool have[FG__HM_MAX_GROUP] = {false};
    if (!acc) {
        sends_finish(&s, 0);
        return fg_last_status();
    }
    for (int j = 0; j < m; j++)
        if (j != k)
            have[j] = take_mail(h, FG__HM_PART, channel, k, h->group_ids[j], n, c, end1, &got[j]);
    pthread_mutex_lock(&h->mu);
    for (int j = 0; j < m; j++) /* a silent member is not counted until heard again */
        if (j != k && !have[j]) fg__hm_suspect(h, h->group_ids[j]);
    pthread_mutex_unlock(&h->mu);
    double wsum = 0;
    for (int64_t i = 0; i < np; i++) acc[i] = 0;
    int contributors = 0;
    for (int j = 0; j < m; j++) {
        const float *v = j == k ? data + lo : have[j] ? got[j].vals : NULL;
        double w = j == k ? weight : have[j] ? got[j].h.weight : 0;
        if (!v) continue;
        contributors++;
        wsum += w;
        for (int64_t i = 0; i < np; i++) acc[i] += w * (double)v[i];
    }
    for (int64_t i = 0; i < np; i++) data[lo + i] = (float)(acc[i] / wsum);
    for (int j = 0; j < m; j++)
        if (have[j]) fg_free(got[j].vals);
    fg_free(acc);
    fg_status st = through_codec(h, c, data + lo, np);
    if (st != FG_OK) {
        sends_finish(&s, 0);
        return st;
    }
    fg__hm_hdr hr = base;
    hr.kind = FG__HM_REDUCED;
    hr.part = (uint32_t)k;
    hr.weight = wsum;
    for (int j = 0; j < m; j++) {
        if (j == k) continue;
        nng_msg *msg;
        st = fg__hm_frame(h, hr, data + lo, np, NULL, 0, &msg);
        if (st != FG_OK) break;
        send_async(h, &s, h->group_urls[j], msg, end2 - fg_time());
    }
    /* the others' reduced parts */
    int missing = 0;
    for (int j = 0; j < m && st == FG_OK; j++) {
        if (j == k) continue;
        fg__hm_mail r;
        if (!take_mail(h, FG__HM_REDUCED, channel, j, h->group_ids[j], n, c, end2, &r)) {
            missing++;
            fg_log(FG_LOG_WARN,
                   "hivemind: round %lld channel %d: part %d (peer %016llx) did not come within "
                   "the averaging timeout; its local values are kept",
                   (long long)h->group_round, channel, j, (unsigned long long)h->group_ids[j]);
            continue;
        }
        int64_t a, b;
        fg__hm_part_bounds(n, m, j, &a, &b);
        memcpy(data + a, r.vals, (size_t)(b - a) * sizeof(float));
        fg_free(r.vals);
    }
    sends_finish(&s, missing ? 0.2 : 1.0);
    if (info) {
        info->members = m;
        info->contributors = contributors;
        info->parts_missing = missing;
        info->weight = wsum;
        pthread_mutex_lock(&h->mu);
        info->refused = h->refused - refused0;
        info->refused_from = info->refused ? h->refused_from : 0;
        pthread_mutex_unlock(&h->mu);
        info->bytes_sent = s.bytes;
    }
    return st;
}
#endif

#ifdef FULGUR_HAVE_HIVEMIND
double fg_hivemind_group_weight(const fg_hivemind *h) { return h ? h->group_weight : 0; }
#endif
