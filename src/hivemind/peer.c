/* A peer of the swarm: its OpenDHT node and the progress records of the
 * run's key (each authenticated; a peer's newest record by seq is kept, one
 * silent past `expiry` is not counted), its nng pull socket and the thread
 * that receives, checks and files the averaging messages, its state server,
 * and the swarm's state as this peer sees it. */
#include "hivemind_impl.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static const char *const k_codec_names[FG_HIVEMIND_COMPRESSION_COUNT] = {"none", "fp16", "8-bit"};

const char *fg_hivemind_compression_name(fg_hivemind_compression c) {
    return (int)c >= 0 && c < FG_HIVEMIND_COMPRESSION_COUNT ? k_codec_names[c] : "?";
}

fg_status fg_hivemind_compression_parse(const char *name, fg_hivemind_compression *out) {
    static const struct {
        const char *name;
        fg_hivemind_compression c;
    } names[] = {
        {"none", FG_HIVEMIND_COMPRESSION_NONE},    {"fp16", FG_HIVEMIND_COMPRESSION_FP16},
        {"float16", FG_HIVEMIND_COMPRESSION_FP16}, {"8-bit", FG_HIVEMIND_COMPRESSION_8BIT},
        {"8bit", FG_HIVEMIND_COMPRESSION_8BIT},    {"uniform8bit", FG_HIVEMIND_COMPRESSION_8BIT}};
    for (size_t i = 0; name && i < sizeof names / sizeof names[0]; i++)
        if (!strcasecmp(name, names[i].name)) {
            *out = names[i].c;
            return FG_OK;
        }
    return fg_error(FG_EINVAL, "grad_compression=\"%s\": expected none, fp16 or 8-bit",
                    name ? name : "(null)");
}

#ifndef FULGUR_HAVE_HIVEMIND
/* Built without OpenDHT, nng or libsodium: every call says so. */
#define FG__HM_MISSING                                                                             \
    fg_error(FG_EUNSUPPORTED, "strategy hivemind: this fulgur was built without OpenDHT, nng "     \
                              "or libsodium; apt-get install libopendht-c-dev libnng-dev "         \
                              "libsodium-dev and build again")
bool fg_hivemind_available(void) { return false; }
fg_hivemind *fg_hivemind_new(const fg_hivemind_opts *o) {
    (void)o;
    FG__HM_MISSING;
    return NULL;
}
void fg_hivemind_free(fg_hivemind *h) { (void)h; }
const char *fg_hivemind_address(const fg_hivemind *h) { return (void)h, ""; }
uint64_t fg_hivemind_peer_id(const fg_hivemind *h) { return (void)h, 0; }
fg_status fg_hivemind_publish(fg_hivemind *h, int64_t e, int64_t s, bool r) {
    (void)h, (void)e, (void)s, (void)r;
    return FG__HM_MISSING;
}
void fg_hivemind_set_pace(fg_hivemind *h, double step_seconds, double samples_per_step) {
    (void)h, (void)step_seconds, (void)samples_per_step;
}
fg_status fg_hivemind_started(fg_hivemind *h) {
    (void)h;
    return FG__HM_MISSING;
}
void fg_hivemind_swarm_state(fg_hivemind *h, fg_hivemind_swarm *out) {
    (void)h;
    memset(out, 0, sizeof *out);
}
fg_status fg_hivemind_wait_peers(fg_hivemind *h, int n, double t) {
    (void)h, (void)n, (void)t;
    return FG__HM_MISSING;
}
fg_status fg_hivemind_matchmake(fg_hivemind *h, int64_t e, double w, int *m) {
    (void)h, (void)e, (void)w, (void)m;
    return FG__HM_MISSING;
}
fg_status fg_hivemind_allreduce(fg_hivemind *h, int ch, float *d, int64_t n, double w,
                                fg_hivemind_compression c, fg_hivemind_round *info) {
    (void)h, (void)ch, (void)d, (void)n, (void)w, (void)c, (void)info;
    return FG__HM_MISSING;
}
fg_status fg_hivemind_set_state(fg_hivemind *h, int64_t e, const void *d, size_t b) {
    (void)h, (void)e, (void)d, (void)b;
    return FG__HM_MISSING;
}
fg_status fg_hivemind_load_state(fg_hivemind *h, void *o, size_t b, int64_t *e) {
    (void)h, (void)o, (void)b, (void)e;
    return FG__HM_MISSING;
}
const char *fg_hivemind_last_refusal(fg_hivemind *h) { return (void)h, ""; }
double fg_hivemind_group_weight(const fg_hivemind *h) { return (void)h, 0; }
#else
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

bool fg_hivemind_available(void) { return true; }

static double realtime(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------------------ records */

bool fg__hm_live(const fg_hivemind *h, const fg__hm_peer *p, double now) {
    return !p->suspect && now - p->seen <= h->o.expiry &&
           realtime() - p->r.realtime <= h->o.expiry + 5.0;
}

void fg__hm_suspect(fg_hivemind *h, uint64_t id) {
    for (int i = 0; i < h->npeers; i++)
        if (h->peers[i].r.peer == id && id != h->id) h->peers[i].suspect = true;
}

/* Files a record (under h->mu): a peer's newer seq replaces its older. */
static void take_record(fg_hivemind *h, const fg__hm_record *r) {
    for (int i = 0; i < h->npeers; i++)
        if (h->peers[i].r.peer == r->peer) {
            if (r->seq > h->peers[i].r.seq) h->peers[i] = (fg__hm_peer){*r, fg_time(), false};
            return;
        }
    if (h->npeers < FG__HM_MAX_PEERS) h->peers[h->npeers++] = (fg__hm_peer){*r, fg_time(), false};
    pthread_cond_broadcast(&h->cv);
}

/* A value of the progress key, checked, then taken if newer; a refusal is
 * counted and logged when it comes by the listen (`loud`), not again each
 * time a get fetches it. */
static bool take_value(fg_hivemind *h, const dht_value *v, bool loud) {
    if (atomic_load(&h->stop)) return true;
    dht_data_view d = dht_value_get_data(v);
    fg__hm_record r;
    if (d.size != sizeof r + FG__HM_TAG) {
        if (loud)
            fg__hm_refuse(h, 0, "a progress record of %zu bytes (%zu expected)", d.size,
                          sizeof r + FG__HM_TAG);
        return true;
    }
    memcpy(&r, d.data, sizeof r);
    if (crypto_auth_verify(d.data + sizeof r, d.data, sizeof r, h->key) != 0) {
        if (loud)
            fg__hm_refuse(h, r.peer,
                          "a progress record whose tag does not verify (another "
                          "run's secret)");
        return true;
    }
    if (r.magic != FG__HM_MAGIC || r.kind != FG__HM_RECORD || r.epoch < 0 || r.samples < 0 ||
        !(r.step_s >= 0) || !isfinite(r.step_s) || !(r.step_samples >= 0) ||
        !isfinite(r.step_samples) || memchr(r.url_msg, 0, sizeof r.url_msg) == NULL ||
        memchr(r.url_state, 0, sizeof r.url_state) == NULL)
        return true;
    pthread_mutex_lock(&h->mu);
    take_record(h, &r);
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    return true;
}

static bool on_value(const dht_value *v, bool expired, void *ud) {
    return expired || take_value(ud, v, true);
}

/* A get's values go where the listen's do. */
static bool on_get(const dht_value *v, void *ud) { return take_value(ud, v, false); }

static void put_done(bool ok, void *ud) {
    (void)ok;
    (void)ud;
}

/* Puts h->mine (a new seq) in the DHT and in the local table; under h->mu. */
static void put_mine(fg_hivemind *h) {
    h->mine.seq++;
    h->mine.realtime = realtime();
    take_record(h, &h->mine);
    unsigned char buf[sizeof(fg__hm_record) + FG__HM_TAG];
    memcpy(buf, &h->mine, sizeof h->mine);
    crypto_auth(buf + sizeof h->mine, buf, sizeof h->mine, h->key);
    dht_value *v = dht_value_new(buf, sizeof buf);
    if (v) {
        dht_runner_put(h->dht, &h->progress_key, v, put_done, NULL, false);
        dht_value_unref(v);
    }
    h->last_publish = fg_time();
    h->dirty = false;
    pthread_cond_broadcast(&h->cv);
}

fg_status fg_hivemind_publish(fg_hivemind *h, int64_t epoch, int64_t samples, bool ready) {
    if (!h) return fg_error(FG_EINVAL, "hivemind publish: NULL peer");
    if (epoch < 0 || samples < 0)
        return fg_error(FG_EINVAL, "hivemind publish: epoch %lld, samples %lld (expected >= 0)",
                        (long long)epoch, (long long)samples);
    pthread_mutex_lock(&h->mu);
    /* a new epoch or readiness goes out at once; a sample count at most every
     * FG__HM_PUT_GAP s (the receiver thread puts the newest), so that the
     * run's DHT key holds a bounded number of values */
    bool urgent = ready != (h->mine.ready != 0) || epoch != h->mine.epoch || ready;
    h->mine.epoch = epoch;
    h->mine.samples = samples;
    h->mine.ready = ready;
    if (!ready) h->mine.weight = 0;
    if (urgent || fg_time() - h->last_publish >= FG__HM_PUT_GAP) {
        put_mine(h);
    } else {
        h->dirty = true;
        for (int i = 0; i < h->npeers; i++) /* this peer's own view is current */
            if (h->peers[i].r.peer == h->id) h->peers[i].r = h->mine;
    }
    pthread_mutex_unlock(&h->mu);
    return FG_OK;
}

void fg_hivemind_set_pace(fg_hivemind *h, double step_seconds, double samples_per_step) {
    if (!h) return;
    pthread_mutex_lock(&h->mu);
    h->mine.step_s = step_seconds > 0 && isfinite(step_seconds) ? step_seconds : 0;
    h->mine.step_samples =
        samples_per_step > 0 && isfinite(samples_per_step) ? samples_per_step : 0;
    pthread_mutex_unlock(&h->mu);
}

fg_status fg_hivemind_started(fg_hivemind *h) {
    if (!h) return fg_error(FG_EINVAL, "hivemind started: NULL peer");
    pthread_mutex_lock(&h->mu);
    if (h->mine.starting) {
        h->mine.starting = 0;
        put_mine(h);
    }
    pthread_mutex_unlock(&h->mu);
    return FG_OK;
}

/* Under h->mu. */
static void swarm_locked(fg_hivemind *h, fg_hivemind_swarm *s) {
    memset(s, 0, sizeof *s);
    double now = fg_time();
    s->epoch = -1;
    for (int i = 0; i < h->npeers; i++) {
        const fg__hm_peer *p = &h->peers[i];
        if (!fg__hm_live(h, p, now)) continue;
        s->peers++;
        s->starting += p->r.starting != 0 && p->r.peer != h->id;
        if (p->r.epoch > s->epoch) s->epoch = p->r.epoch;
    }
    for (int i = 0; i < h->npeers; i++) {
        const fg__hm_peer *p = &h->peers[i];
        if (!fg__hm_live(h, p, now) || p->r.epoch != s->epoch) continue;
        s->at_epoch++;
        s->ready += p->r.ready != 0;
        s->samples += p->r.samples;
    }
    if (s->epoch < 0) s->epoch = 0;
    s->refused = h->refused;
}

void fg_hivemind_swarm_state(fg_hivemind *h, fg_hivemind_swarm *out) {
    memset(out, 0, sizeof *out);
    if (!h) return;
    pthread_mutex_lock(&h->mu);
    swarm_locked(h, out);
    pthread_mutex_unlock(&h->mu);
}

fg_status fg_hivemind_wait_peers(fg_hivemind *h, int n, double timeout) {
    if (!h) return fg_error(FG_EINVAL, "hivemind wait_peers: NULL peer");
    double end = fg_time() + timeout;
    fg_hivemind_swarm s;
    for (;;) {
        fg_hivemind_swarm_state(h, &s);
        if (s.peers >= n) return FG_OK;
        if (fg_time() > end)
            return fg_error(FG_ETIMEOUT, "hivemind: %d live peers known after %.1f s, %d wanted",
                            s.peers, timeout, n);
        usleep(20000);
    }
}

/* ------------------------------------------------------------ receiver */

/* A group view (checked in size by fg__hm_open): its members sorted and
 * unique, the sender among them, every URL terminated, every weight finite,
 * and its digest the members' own. */
static void receive_view(fg_hivemind *h, const fg__hm_hdr *hd, const unsigned char *payload) {
    int n = (int)hd->nparts;
    fg__hm_member *v = fg_alloc((size_t)n * sizeof *v);
    if (!v) return;
    memcpy(v, payload, (size_t)n * sizeof *v);
    uint64_t ids[FG__HM_MAX_GROUP];
    bool has_sender = false;
    const char *bad = NULL;
    for (int i = 0; i < n && !bad; i++) {
        ids[i] = v[i].id;
        has_sender |= v[i].id == hd->sender;
        if (i > 0 && v[i].id <= v[i - 1].id) bad = "members not sorted or repeated";
        else if (strnlen(v[i].url, FG__HM_URL_MAX) == FG__HM_URL_MAX) bad = "a URL not terminated";
        else if (!(v[i].weight >= 0) || !isfinite(v[i].weight)) bad = "a weight not finite";
    }
    if (!bad && !has_sender) bad = "the sender not among the members";
    if (!bad && fg__hm_group_digest(hd->round, ids, n) != hd->digest)
        bad = "a digest that is not its members'";
    if (bad) {
        fg__hm_refuse(h, hd->sender, "group view of round %lld: %s", (long long)hd->round, bad);
        fg_free(v);
        return;
    }
    fg__hm_mail_put(h, hd, v, n);
}

static void receive_one(fg_hivemind *h, nng_msg *m) {
    fg__hm_hdr hd;
    size_t len = nng_msg_len(m);
    const unsigned char *b = nng_msg_body(m);
    uint64_t from = 0; /* the claimed sender, for the refusal; copied: b has no alignment */
    if (len >= sizeof hd) memcpy(&from, b + offsetof(fg__hm_hdr, sender), sizeof from);
    if (fg__hm_open(h, b, len, &hd) != FG_OK) {
        fg__hm_refuse(h, from, "%s", fg_last_error());
        return;
    }
    if (hd.kind == FG__HM_VIEW) {
        receive_view(h, &hd, b + sizeof hd);
        return;
    }
    if (hd.kind != FG__HM_PART && hd.kind != FG__HM_REDUCED) {
        fg__hm_refuse(h, from, "a message of kind %u on the averaging socket", hd.kind);
        return;
    }
    int64_t lo, hi;
    fg__hm_part_bounds(hd.n_total, (int)hd.nparts, (int)hd.part, &lo, &hi);
    float *vals = fg_alloc((size_t)(hi - lo) * sizeof(float) + 1);
    if (!vals) return;
    if (fg__hm_decode(&hd, b + sizeof hd, vals, hi - lo) != FG_OK) {
        fg__hm_refuse(h, hd.sender, "%s %u of round %lld: %s",
                      hd.kind == FG__HM_PART ? "gradient part" : "reduced part", hd.part,
                      (long long)hd.round, fg_last_error());
        fg_free(vals);
        return;
    }
    fg__hm_mail_put(h, &hd, vals, hi - lo);
}

static void *rx_main(void *arg) {
    fg_hivemind *h = arg;
    while (!atomic_load(&h->stop)) {
        nng_msg *m = NULL;
        int rv = nng_recvmsg(h->pull, &m, 0);
        if (rv == 0) {
            receive_one(h, m);
            nng_msg_free(m);
        } else if (rv != NNG_ETIMEDOUT) {
            if (rv == NNG_ECLOSED) break;
        }
        pthread_mutex_lock(&h->mu);
        double since = fg_time() - h->last_publish;
        if ((h->dirty && since >= FG__HM_PUT_GAP) || since > h->o.expiry / 4) put_mine(h);
        pthread_mutex_unlock(&h->mu);
        /* the listen's updates can be lost (a storing node's push over a
         * lossy link, a listen that lapsed): every 2 s the records are also
         * fetched, so a peer never goes on alone on a stale table. Outside
         * h->mu: the callback takes it. */
        if (fg_time() - h->last_get >= FG__HM_GET_GAP) {
            h->last_get = fg_time();
            dht_runner_get(h->dht, &h->progress_key, on_get, NULL, h);
        }
    }
    return NULL;
}

/* ------------------------------------------------------------ setup */

/* The address others reach this peer at: the option, the variable, the
 * source address of the route to the first initial peer, the first
 * non-loopback IPv4 address, or 127.0.0.1. */
static void pick_host(fg_hivemind *h) {
    const char *o = h->o.host && *h->o.host ? h->o.host : getenv("FULGUR_HIVEMIND_HOST");
    if (o && *o) {
        snprintf(h->host, sizeof h->host, "%s", o);
        return;
    }
    snprintf(h->host, sizeof h->host, "127.0.0.1");
    const char *ip = h->o.initial_peers;
    if (ip && *ip) {
        char first[128];
        snprintf(first, sizeof first, "%s", ip);
        first[strcspn(first, ",")] = 0;
        char *colon = strrchr(first, ':');
        if (colon) *colon = 0;
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(9)};
        int fd = socket(AF_INET, SOCK_DGRAM, 0);
        if (fd >= 0 && inet_pton(AF_INET, first, &a.sin_addr) == 1 &&
            connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
            socklen_t sl = sizeof a;
            if (getsockname(fd, (struct sockaddr *)&a, &sl) == 0)
                inet_ntop(AF_INET, &a.sin_addr, h->host, sizeof h->host);
            close(fd);
            return;
        }
        if (fd >= 0) close(fd);
    }
    struct ifaddrs *ifs;
    if (getifaddrs(&ifs) != 0) return;
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
        struct sockaddr_in *sa = (struct sockaddr_in *)(void *)i->ifa_addr;
        if ((ntohl(sa->sin_addr.s_addr) >> 24) == 127) continue;
        inet_ntop(AF_INET, &sa->sin_addr, h->host, sizeof h->host);
        break;
    }
    freeifaddrs(ifs);
}

static FG_MUST_USE fg_status listen_on(fg_hivemind *h, nng_socket s, char *url, size_t max_recv) {
    char bind[FG__HM_URL_MAX];
    nng_listener l;
    snprintf(bind, sizeof bind, "tcp://0.0.0.0:0");
    int rv = nng_socket_set_size(s, NNG_OPT_RECVMAXSZ, max_recv);
    if (rv == 0) rv = nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 100);
    if (rv == 0) rv = nng_listener_create(&l, s, bind);
    if (rv == 0) rv = nng_listener_start(l, 0);
    int port = 0;
    if (rv == 0) rv = nng_listener_get_int(l, NNG_OPT_TCP_BOUND_PORT, &port);
    if (rv != 0) return fg_error(FG_EIO, "hivemind: listening on %s: %s", bind, nng_strerror(rv));
    snprintf(url, FG__HM_URL_MAX, "tcp://%s:%d", h->host, port);
    return FG_OK;
}

static FG_MUST_USE fg_status bootstrap(fg_hivemind *h) {
    const char *ip = h->o.initial_peers;
    if (!ip || !*ip) return FG_OK;
    char list[1024];
    snprintf(list, sizeof list, "%s", ip);
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ') tok++;
        char *colon = strrchr(tok, ':');
        if (!colon || colon == tok || !colon[1] ||
            strspn(colon + 1, "0123456789") != strlen(colon + 1))
            return fg_error(FG_EINVAL,
                            "initial_peers=\"%s\": \"%s\" is not host:port (a "
                            "peer's address as it printed it)",
                            ip, tok);
        *colon = 0;
        dht_runner_bootstrap(h->dht, tok, colon + 1);
    }
    return FG_OK;
}

fg_hivemind *fg_hivemind_new(const fg_hivemind_opts *o) {
    if (!o || !o->run_id || !*o->run_id || strlen(o->run_id) >= 128) {
        fg_error(FG_EINVAL,
                 "hivemind: run_id=\"%s\": expected a name of 1 to 127 bytes that "
                 "every peer of the run passes",
                 o && o->run_id ? o->run_id : "(null)");
        return NULL;
    }
    if (!o->secret || !*o->secret) {
        fg_error(FG_EINVAL,
                 "hivemind: no run secret: every peer of run \"%s\" needs the same "
                 "one (--run-secret or --run-secret-file)",
                 o->run_id);
        return NULL;
    }
    if (o->matchmaking_time < 0 || o->averaging_timeout < 0 || o->expiry < 0 || o->dht_port < 0 ||
        o->load_state_timeout < 0 || o->dht_port > 65535) {
        fg_error(FG_EINVAL,
                 "hivemind: matchmaking_time %g, averaging_timeout %g, expiry %g, "
                 "load_state_timeout %g, dht_port %d: expected times >= 0 and a port in 0..65535",
                 o->matchmaking_time, o->averaging_timeout, o->expiry, o->load_state_timeout,
                 o->dht_port);
        return NULL;
    }
    if (sodium_init() < 0) {
        fg_error(FG_EIO, "hivemind: libsodium's sodium_init failed");
        return NULL;
    }
    fg_hivemind *h = fg_alloc(sizeof *h);
    if (!h) return NULL;
    memset(h, 0, sizeof *h);
    h->o = *o;
    if (h->o.matchmaking_time == 0) h->o.matchmaking_time = 5;
    if (h->o.averaging_timeout == 0) h->o.averaging_timeout = 30;
    if (h->o.expiry == 0)
        h->o.expiry = 3 * h->o.averaging_timeout > 30 ? 3 * h->o.averaging_timeout : 30;
    if (h->o.max_message_bytes == 0) h->o.max_message_bytes = (size_t)1 << 30;
    if (h->o.load_state_timeout == 0)
        h->o.load_state_timeout = 2 * h->o.averaging_timeout > 60 ? 2 * h->o.averaging_timeout : 60;
    snprintf(h->run_id, sizeof h->run_id, "%s", o->run_id);
    h->o.run_id = h->run_id;
    h->o.secret = NULL; /* only the key is kept */
    h->o.host = NULL;
    h->o.initial_peers = NULL;
    fg__hm_key(h->key, o->run_id, o->secret);
    randombytes_buf(&h->id, sizeof h->id);
    h->id |= 1; /* never 0: 0 means nobody */
    h->group_round = -1;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    h->o.initial_peers = o->initial_peers;
    h->o.host = o->host;
    pick_host(h);

    int rv = nng_pull0_open(&h->pull);
    if (rv != 0) {
        fg_error(FG_EIO, "hivemind: nng pull socket: %s", nng_strerror(rv));
        goto fail_mu;
    }
    rv = nng_rep0_open(&h->rep);
    if (rv != 0) {
        fg_error(FG_EIO, "hivemind: nng rep socket: %s", nng_strerror(rv));
        nng_close(h->pull);
        goto fail_mu;
    }
    if (listen_on(h, h->pull, h->url_msg, h->o.max_message_bytes) != FG_OK ||
        listen_on(h, h->rep, h->url_state, sizeof(fg__hm_hdr) + FG__HM_TAG + 64) != FG_OK)
        goto fail_sock;
    if (!fg__hm_nng_drops_long_safely()) /* docs/hivemind.md, "What happens on each fault" */
        fg_log(FG_LOG_INFO,
               "hivemind: nng %s: a message over max_message_bytes (%zu) from another process "
               "can abort this one inside nng (fixed in nng 1.12.0)",
               nng_version(), h->o.max_message_bytes);

    h->dht = dht_runner_new();
    if (!h->dht) {
        fg_error(FG_ENOMEM, "hivemind: OpenDHT's runner");
        goto fail_sock;
    }
    dht_runner_config cfg;
    dht_runner_config_default(&cfg);
    cfg.threaded = true;
    cfg.peer_discovery = false;
    cfg.peer_publish = false;
    {
        /* a network id per run: nodes of other runs are not even routed to */
        unsigned char nh[4];
        crypto_generichash(nh, sizeof nh, (const unsigned char *)h->run_id, strlen(h->run_id), NULL,
                           0);
        memcpy(&cfg.dht_config.node_config.network, nh, 4);
    }
    rv = dht_runner_run_config(h->dht, (in_port_t)o->dht_port, &cfg);
    if (rv != 0) {
        fg_error(FG_EIO, "hivemind: OpenDHT node on UDP port %d: error %d (%s)", o->dht_port, rv,
                 strerror(rv < 0 ? -rv : rv));
        goto fail_dht;
    }
    snprintf(h->address, sizeof h->address, "%s:%u", h->host,
             (unsigned)dht_runner_get_bound_port(h->dht, AF_INET));
    if (bootstrap(h) != FG_OK) goto fail_dht;
    {
        char keystr[200];
        snprintf(keystr, sizeof keystr, "fulgur-hivemind/%s/progress", h->run_id);
        dht_infohash_get_from_string(&h->progress_key, keystr);
    }
    h->listen = dht_runner_listen(h->dht, &h->progress_key, on_value, NULL, h);

    h->mine = (fg__hm_record){.magic = FG__HM_MAGIC,
                              .version = FG__HM_VERSION,
                              .kind = FG__HM_RECORD,
                              .starting = 1,
                              .peer = h->id};
    snprintf(h->mine.url_msg, sizeof h->mine.url_msg, "%s", h->url_msg);
    snprintf(h->mine.url_state, sizeof h->mine.url_state, "%s", h->url_state);
    h->o.initial_peers = NULL;
    h->o.host = NULL;
    if (pthread_create(&h->rx_thread, NULL, rx_main, h) != 0) {
        fg_error(FG_EIO, "hivemind: the receiver thread");
        goto fail_dht;
    }
    h->rx_started = true;
    if (pthread_create(&h->rep_thread, NULL, fg__hm_rep_main, h) != 0) {
        fg_error(FG_EIO, "hivemind: the state server thread");
        fg_hivemind_free(h);
        return NULL;
    }
    h->rep_started = true;
    return h;

fail_dht:
    if (h->listen) { /* the token is the caller's to delete after the cancel */
        dht_runner_cancel_listen(h->dht, &h->progress_key, h->listen);
        dht_op_token_delete(h->listen);
        h->listen = NULL;
    }
    dht_runner_delete(h->dht);
fail_sock:
    nng_close(h->pull);
    nng_close(h->rep);
fail_mu:
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    fg_free(h);
    return NULL;
}

bool fg__hm_nng_drops_long_safely(void) {
    int v[3] = {0, 0, 0};
    if (sscanf(nng_version(), "%d.%d.%d", &v[0], &v[1], &v[2]) < 2) return false;
    return v[0] > 1 || (v[0] == 1 && (v[1] > 11 || (v[1] == 11 && v[2] > 0)));
}

void fg_hivemind_free(fg_hivemind *h) {
    if (!h) return;
    atomic_store(&h->stop, 1);
    if (h->rx_started) pthread_join(h->rx_thread, NULL);
    if (h->rep_started) pthread_join(h->rep_thread, NULL);
    if (h->listen) { /* the token is the caller's to delete after the cancel */
        dht_runner_cancel_listen(h->dht, &h->progress_key, h->listen);
        dht_op_token_delete(h->listen);
        h->listen = NULL;
    }
    dht_runner_delete(h->dht);
    for (int i = 0; i < h->npushes; i++) nng_close(h->pushes[i].sock);
    nng_close(h->pull);
    nng_close(h->rep);
    for (int i = 0; i < h->nmail; i++) fg_free(h->mail[i].vals);
    fg_free(h->state);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    sodium_memzero(h->key, sizeof h->key);
    fg_free(h);
}

const char *fg_hivemind_address(const fg_hivemind *h) { return h ? h->address : ""; }
uint64_t fg_hivemind_peer_id(const fg_hivemind *h) { return h ? h->id : 0; }

const char *fg_hivemind_last_refusal(fg_hivemind *h) {
    static _Thread_local char buf[512];
    if (!h) return "";
    pthread_mutex_lock(&h->mu);
    snprintf(buf, sizeof buf, "%s", h->last_refusal);
    pthread_mutex_unlock(&h->mu);
    return buf;
}
#endif
