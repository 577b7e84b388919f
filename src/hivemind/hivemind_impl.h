/* Private state of the hivemind layer: the peer (its DHT node, sockets,
 * threads, peer table and mailbox) and the wire format every file shares. */
#ifndef FULGUR_HIVEMIND_IMPL_H
#define FULGUR_HIVEMIND_IMPL_H

#include "core/core_impl.h"
#include "fulgur/hivemind.h"

#ifdef FULGUR_HAVE_HIVEMIND
#include <nng/nng.h>
#include <nng/protocol/pipeline0/pull.h>
#include <nng/protocol/pipeline0/push.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <opendht/opendht_c.h>
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>

#define FG__HM_MAGIC 0x4d484746u /* "FGHM" */
#define FG__HM_VERSION 2
#define FG__HM_MAX_PEERS 256
#define FG__HM_MAX_GROUP 64
#define FG__HM_URL_MAX 96
#define FG__HM_TAG crypto_auth_BYTES
#define FG__HM_MAILBOX_MAX 1024
#define FG__HM_PUT_GAP 0.2 /* s between puts of a mere sample count */
#define FG__HM_GET_GAP 2.0 /* s between gets of the progress key (beside the listen) */

enum {
    FG__HM_PART = 1,
    FG__HM_REDUCED,
    FG__HM_STATE_REQ,
    FG__HM_STATE,
    FG__HM_RECORD,
    FG__HM_VIEW
};

/* The header of every message (then the payload, then the tag over both).
 * Fixed-size fields, host byte order (the magic refuses another one). */
typedef struct fg__hm_hdr {
    uint32_t magic;
    uint8_t version, kind, codec, channel;
    uint64_t sender;
    int64_t round;
    uint64_t digest; /* of the group (PART, REDUCED, VIEW); the nonce (STATE_REQ, STATE) */
    int64_t n_total;
    uint32_t nparts, part; /* VIEW: nparts is the number of members */
    double weight;         /* VIEW: the sender's own weight */
    uint64_t payload_bytes;
} fg__hm_hdr;

/* A progress record as it is stored in the DHT (then the tag). */
typedef struct fg__hm_record {
    uint32_t magic;
    uint8_t version, kind, ready;
    uint8_t starting; /* set up, not yet stepping: its epoch may still change (a checkpoint) */
    uint64_t peer, seq;
    int64_t epoch, samples;
    double weight, realtime;
    double step_s, step_samples; /* its pace (fg_hivemind_set_pace; 0: unknown) */
    char url_msg[FG__HM_URL_MAX], url_state[FG__HM_URL_MAX];
} fg__hm_record;

typedef struct fg__hm_peer {
    fg__hm_record r;
    double seen;  /* fg_time() when its newest record came */
    bool suspect; /* left out of a round (silent, or not at matchmaking): not counted
                     until a newer record comes (which clears it) */
} fg__hm_peer;

/* A member of a group view, as a VIEW message's payload lists them (sorted
 * by id). */
typedef struct fg__hm_member {
    uint64_t id;
    double weight; /* the samples the view's owner knew of it */
    char url[FG__HM_URL_MAX];
} fg__hm_member;

/* A received, checked and decoded message of the averaging socket. */
typedef struct fg__hm_mail {
    fg__hm_hdr h;
    union {
        float *vals;            /* PART, REDUCED: h.n_total's part `h.part` of h.nparts */
        fg__hm_member *members; /* VIEW: h.nparts members */
    };
    int64_t nvals;
} fg__hm_mail;

typedef struct fg__hm_push {
    char url[FG__HM_URL_MAX];
    nng_socket sock;
} fg__hm_push;

struct fg_hivemind {
    fg_hivemind_opts o;
    char run_id[128];
    unsigned char key[crypto_auth_KEYBYTES];
    uint64_t id;
    char address[128], host[64];
    dht_runner *dht;
    dht_infohash progress_key;
    dht_op_token *listen;
    nng_socket pull, rep;
    char url_msg[FG__HM_URL_MAX], url_state[FG__HM_URL_MAX];
    pthread_t rx_thread, rep_thread;
    bool rx_started, rep_started;
    _Atomic int stop; /* set by fg_hivemind_free, read by every thread */

    pthread_mutex_t mu; /* everything below */
    pthread_cond_t cv;
    fg__hm_peer peers[FG__HM_MAX_PEERS];
    int npeers;
    fg__hm_record mine;
    double last_publish;
    double last_get; /* fg_time() of the receiver thread's last get of the progress key */
    bool dirty;      /* mine changed since the last put */
    fg__hm_mail mail[FG__HM_MAILBOX_MAX];
    int nmail;
    int64_t min_round; /* mail of older rounds is dropped */
    int64_t refused;
    uint64_t refused_from;
    char last_refusal[512];
    unsigned char *state;
    size_t state_bytes;
    int64_t state_epoch;

    /* the current group (training thread only) */
    int64_t group_round;
    int ngroup, me;
    uint64_t group_ids[FG__HM_MAX_GROUP];
    char group_urls[FG__HM_MAX_GROUP][FG__HM_URL_MAX];
    uint64_t digest;
    double group_weight;  /* the weights the members announced */
    int64_t views_merged; /* views of other members that added members to this one's */
    fg__hm_push pushes[FG__HM_MAX_GROUP];
    int npushes;
};

/* wire.c: authentication, encoding and the checks of a received message */
void fg__hm_key(unsigned char key[crypto_auth_KEYBYTES], const char *run_id, const char *secret);
size_t fg__hm_payload_bytes(fg_hivemind_compression c, int64_t n);
void fg__hm_part_bounds(int64_t n, int nparts, int part, int64_t *lo, int64_t *hi);
/* A message: header + encoded vals (or raw bytes when vals is NULL) + tag. */
FG_MUST_USE fg_status fg__hm_frame(const fg_hivemind *h, fg__hm_hdr hd, const float *vals,
                                   int64_t nvals, const void *raw, size_t raw_bytes, nng_msg **out);
/* Checks the length and tag of a message; *hd gets its header. FG_EFORMAT
 * with the reason in the message otherwise. */
FG_MUST_USE fg_status fg__hm_open(const fg_hivemind *h, const void *buf, size_t len,
                                  fg__hm_hdr *hd);
/* Decodes a checked part into vals (nvals values): FG_EFORMAT naming the
 * first NaN or inf or the wrong length. */
FG_MUST_USE fg_status fg__hm_decode(const fg__hm_hdr *hd, const unsigned char *payload, float *vals,
                                    int64_t nvals);
void fg__hm_refuse(fg_hivemind *h, uint64_t from, const char *fmt, ...) FG_PRINTF(3, 4);

/* peer.c: whether a peer counts (a recent record, not suspect), under h->mu;
 * marks a peer suspect, under h->mu */
bool fg__hm_live(const fg_hivemind *h, const fg__hm_peer *p, double now);
/* Whether the nng in use drops a connection for an over-long message
 * safely: nng before 1.12.0 can finish an aio twice there (its PR 1978,
 * "aio: task_abort was a mistake") and abort the process; 1.12.0 still
 * calls itself 1.11.0, so only a later version counts. */
bool fg__hm_nng_drops_long_safely(void);
void fg__hm_suspect(fg_hivemind *h, uint64_t id);

/* avg.c: the receiver thread's handling of one message (it owns payload:
 * the decoded values or the members); the digest of a group view */
void fg__hm_mail_put(fg_hivemind *h, const fg__hm_hdr *hd, void *payload, int64_t n);
uint64_t fg__hm_group_digest(int64_t round, const uint64_t *ids, int n);

/* state.c: the state server thread */
void *fg__hm_rep_main(void *arg);
#endif

#endif
