/* Hivemind's load_state_from_peers: each peer serves the state it was last
 * given (parameters, optimizer state, epoch: bytes the strategy lays out)
 * on an nng rep socket; a peer that joins asks the live peer at the highest
 * epoch over req, with a fresh nonce, and takes a reply only if it
 * authenticates, echoes the nonce and has exactly the size it expects (the
 * socket refuses anything longer before allocating it). */
#include "hivemind_impl.h"

#ifdef FULGUR_HAVE_HIVEMIND
#include <stddef.h>
#include <string.h>

fg_status fg_hivemind_set_state(fg_hivemind *h, int64_t epoch, const void *data, size_t bytes) {
    if (!h || (!data && bytes))
        return fg_error(FG_EINVAL, "hivemind set_state: NULL %s", h ? "data" : "peer");
    pthread_mutex_lock(&h->mu);
    if (bytes != h->state_bytes) {
        unsigned char *p = fg_alloc(bytes ? bytes : 1);
        if (!p) {
            pthread_mutex_unlock(&h->mu);
            return fg_last_status();
        }
        fg_free(h->state);
        h->state = p;
        h->state_bytes = bytes;
    }
    if (bytes) memcpy(h->state, data, bytes);
    h->state_epoch = epoch;
    pthread_mutex_unlock(&h->mu);
    return FG_OK;
}

static void serve_one(fg_hivemind *h, nng_msg *req) {
    fg__hm_hdr hd;
    size_t len = nng_msg_len(req);
    const unsigned char *b = nng_msg_body(req);
    uint64_t from = 0; /* the claimed sender, for the refusal; copied: b has no alignment */
    if (len >= sizeof hd) memcpy(&from, b + offsetof(fg__hm_hdr, sender), sizeof from);
    if (fg__hm_open(h, b, len, &hd) != FG_OK || hd.kind != FG__HM_STATE_REQ) {
        fg__hm_refuse(h, from, "a state request: %s",
                      hd.kind != FG__HM_STATE_REQ ? "not a state request" : fg_last_error());
        /* rep must answer something to take the next request: an empty reply */
        nng_msg *m;
        if (nng_msg_alloc(&m, 0) == 0 && nng_sendmsg(h->rep, m, 0) != 0) nng_msg_free(m);
        return;
    }
    fg__hm_hdr out = {.kind = FG__HM_STATE, .digest = hd.digest};
    nng_msg *m = NULL;
    pthread_mutex_lock(&h->mu);
    out.round = h->state ? h->state_epoch : -1;
    fg_status s = fg__hm_frame(h, out, NULL, 0, h->state, h->state ? h->state_bytes : 0, &m);
    pthread_mutex_unlock(&h->mu);
    if (s != FG_OK && nng_msg_alloc(&m, 0) != 0) return;
    if (nng_sendmsg(h->rep, m, 0) != 0) nng_msg_free(m);
}

void *fg__hm_rep_main(void *arg) {
    fg_hivemind *h = arg;
    nng_socket_set_ms(h->rep, NNG_OPT_SENDTIMEO, 1000);
    while (!atomic_load(&h->stop)) {
        nng_msg *m = NULL;
        int rv = nng_recvmsg(h->rep, &m, 0);
        if (rv == NNG_ECLOSED) break;
        if (rv != 0) continue;
        serve_one(h, m);
        nng_msg_free(m);
    }
    return NULL;
}

/* One request to one peer: FG_OK with the state in out. */
static FG_MUST_USE fg_status ask(fg_hivemind *h, const char *url, uint64_t peer, void *out,
                                 size_t bytes, int64_t *epoch) {
    nng_socket req;
    int rv = nng_req0_open(&req);
    if (rv != 0) return fg_error(FG_EIO, "hivemind: nng req socket: %s", nng_strerror(rv));
    nng_duration ms = (nng_duration)(h->o.load_state_timeout * 1000);
    nng_socket_set_size(req, NNG_OPT_RECVMAXSZ, sizeof(fg__hm_hdr) + bytes + FG__HM_TAG + 64);
    nng_socket_set_ms(req, NNG_OPT_RECVTIMEO, ms);
    nng_socket_set_ms(req, NNG_OPT_SENDTIMEO, ms);
    nng_socket_set_ms(req, NNG_OPT_REQ_RESENDTIME, ms);
    fg_status s = FG_OK;
    nng_msg *m = NULL;
    if ((rv = nng_dial(req, url, NULL, NNG_FLAG_NONBLOCK)) != 0) {
        s = fg_error(FG_EIO, "hivemind: dialling %s: %s", url, nng_strerror(rv));
        goto done;
    }
    uint64_t nonce;
    randombytes_buf(&nonce, sizeof nonce);
    fg__hm_hdr q = {.kind = FG__HM_STATE_REQ, .digest = nonce};
    if ((s = fg__hm_frame(h, q, NULL, 0, NULL, 0, &m)) != FG_OK) goto done;
    if ((rv = nng_sendmsg(req, m, 0)) != 0) {
        nng_msg_free(m);
        s = fg_error(rv == NNG_ETIMEDOUT ? FG_ETIMEOUT : FG_EIO,
                     "hivemind: asking peer %016llx (%s) for its state: %s",
                     (unsigned long long)peer, url, nng_strerror(rv));
        goto done;
    }
    m = NULL;
    if ((rv = nng_recvmsg(req, &m, 0)) != 0) {
        s = fg_error(rv == NNG_ETIMEDOUT ? FG_ETIMEOUT : FG_EIO,
                     "hivemind: the state of peer %016llx (%s): %s (a state larger than the %zu "
                     "bytes this model's is never taken)",
                     (unsigned long long)peer, url, nng_strerror(rv), bytes);
        goto done;
    }
    fg__hm_hdr hd;
    if (fg__hm_open(h, nng_msg_body(m), nng_msg_len(m), &hd) != FG_OK) {
        fg__hm_refuse(h, peer, "its state: %s", fg_last_error());
        s = fg_error(FG_EFORMAT, "hivemind: the state of peer %016llx refused: %s",
                     (unsigned long long)peer, fg_hivemind_last_refusal(h));
        goto done;
    }
    if (hd.kind != FG__HM_STATE || hd.digest != nonce || hd.sender != peer) {
        s = fg_error(FG_EFORMAT, "hivemind: peer %016llx answered a state request with kind %u",
                     (unsigned long long)peer, hd.kind);
        goto done;
    }
    if (hd.round < 0) {
        s = fg_error(FG_EPEER, "hivemind: peer %016llx has no state yet", (unsigned long long)peer);
        goto done;
    }
    if (hd.payload_bytes != bytes) {
        s = fg_error(FG_EMISMATCH,
                     "hivemind: peer %016llx's state is %llu bytes, this model's "
                     "%zu: another model or optimizer",
                     (unsigned long long)peer, (unsigned long long)hd.payload_bytes, bytes);
        goto done;
    }
    memcpy(out, (unsigned char *)nng_msg_body(m) + sizeof hd, bytes);
    *epoch = hd.round;
done:
    if (m) nng_msg_free(m);
    nng_close(req);
    return s;
}

fg_status fg_hivemind_load_state(fg_hivemind *h, void *out, size_t bytes, int64_t *epoch) {
    if (!h || (!out && bytes) || !epoch)
        return fg_error(FG_EINVAL, "hivemind load_state: NULL argument");
    /* the candidates, highest epoch first */
    fg__hm_record cand[FG__HM_MAX_PEERS];
    int nc = 0;
    pthread_mutex_lock(&h->mu);
    double now = fg_time();
    for (int i = 0; i < h->npeers; i++)
        if (h->peers[i].r.peer != h->id && fg__hm_live(h, &h->peers[i], now))
            cand[nc++] = h->peers[i].r;
    pthread_mutex_unlock(&h->mu);
    for (int i = 1; i < nc; i++)
        for (int j = i; j > 0 && cand[j].epoch > cand[j - 1].epoch; j--) {
            fg__hm_record t = cand[j];
            cand[j] = cand[j - 1];
            cand[j - 1] = t;
        }
    if (!nc) return fg_error(FG_EPEER, "hivemind load_state: no live peer to load from");
    for (int i = 0; i < nc; i++) {
        fg_status s = ask(h, cand[i].url_state, cand[i].peer, out, bytes, epoch);
        if (s == FG_OK || s == FG_EMISMATCH) return s;
        fg_log(FG_LOG_WARN, "%s; trying the next peer", fg_last_error());
    }
    /* as Hivemind's: the caller may go on with its own state */
    return fg_error(FG_EPEER, "hivemind load_state: none of the %d live peers gave its state (%s)",
                    nc, fg_last_error());
}
#endif
