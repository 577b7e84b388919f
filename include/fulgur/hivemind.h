/* fulgur hivemind: a swarm of independent peers, Hivemind's model
 * (docs/hivemind.md). Each peer is one process with an OpenDHT node (the
 * peers' progress), an nng pull socket (averaging messages) and an nng rep
 * socket (its state, for peers that join). Every record and message is
 * authenticated with libsodium's crypto_auth under a key derived from the
 * run's secret and id.
 *
 * The group calls of one fg_hivemind (fg_hivemind_matchmake,
 * fg_hivemind_group_weight, fg_hivemind_allreduce) are made from one thread
 * at a time; the others (publish, set_pace, swarm_state, set_state,
 * last_refusal) take its lock and may be made from another thread meanwhile
 * (the strategy's training thread while a round runs in the background,
 * delay_optimizer_step); load_state from the thread of the group calls, or
 * when none runs. Its own threads (the receiver, the state server,
 * OpenDHT's) only touch its mailbox and peer table under the lock. A build without OpenDHT,
 * nng or libsodium has these calls, which return FG_EUNSUPPORTED saying what
 * to install (fg_hivemind_available). */
#ifndef FULGUR_HIVEMIND_H
#define FULGUR_HIVEMIND_H

#include <stdbool.h>

#include "fulgur/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Hivemind's grad_compression: what a part is on the wire. */
typedef enum fg_hivemind_compression {
    FG_HIVEMIND_COMPRESSION_NONE = 0, /* f32 */
    FG_HIVEMIND_COMPRESSION_FP16,     /* f16 (Hivemind's Float16Compression) */
    FG_HIVEMIND_COMPRESSION_8BIT,     /* one byte a value, uniform over the part's [min, max]
                                         (Hivemind's Uniform8BitQuantization) */
    FG_HIVEMIND_COMPRESSION_COUNT
} fg_hivemind_compression;

/* "none", "fp16", "8-bit"; "?" out of range. */
FG_API const char *fg_hivemind_compression_name(fg_hivemind_compression c);
/* Parses "none", "fp16" (or "float16"), "8-bit" (or "8bit", "uniform8bit");
 * any case. FG_EINVAL naming the value and the names otherwise. */
FG_API FG_MUST_USE fg_status fg_hivemind_compression_parse(const char *name,
                                                           fg_hivemind_compression *out);

/* True when this fulgur was built with OpenDHT, nng and libsodium. */
FG_API bool fg_hivemind_available(void);

typedef struct fg_hivemind_opts {
    const char *run_id;        /* required: peers of one run share it */
    const char *secret;        /* required, not empty: the run's shared secret */
    const char *initial_peers; /* "host:port[,host:port...]" of live DHT nodes; NULL or "":
                                  this peer starts the swarm */
    const char *host;          /* the address others reach this peer at; NULL: the address of
                                  the route to the first initial peer (127.0.0.1 alone), or
                                  FULGUR_HIVEMIND_HOST */
    int dht_port;              /* UDP port of the DHT node; 0: any free one */
    int host_maxaddrs;         /* Lightning's host_maxaddrs: addresses announced (1 is used) */
    double matchmaking_time;   /* s a ready peer waits for the others (default 5) */
    double averaging_timeout;  /* s a round waits for a part before leaving its sender out
                                  (default 30) */
    double expiry;             /* s after which a silent peer is not counted (default
                                  max(30, 3 x averaging_timeout)) */
    size_t max_message_bytes;  /* the bound of one message (default 1 GiB) */
    double load_state_timeout; /* s a state download from one peer may take (Hivemind's
                                  load_state_timeout; default max(60, 2 x averaging_timeout):
                                  a whole state crosses a lossy link slowly) */
} fg_hivemind_opts;

typedef struct fg_hivemind fg_hivemind;

/* Starts a peer: its DHT node (bootstrapped from initial_peers), its
 * sockets and threads. NULL on failure with FG_EINVAL (a missing run_id or
 * secret, a bad initial peer), FG_EIO (a socket), FG_EUNSUPPORTED (not
 * built). */
FG_API fg_hivemind *fg_hivemind_new(const fg_hivemind_opts *o);
/* Stops the threads, closes the sockets and the DHT node. NULL: no-op. */
FG_API void fg_hivemind_free(fg_hivemind *h);

/* "host:port" of this peer's DHT node: what other peers pass as
 * initial_peers. Valid while h lives. */
FG_API const char *fg_hivemind_address(const fg_hivemind *h);
/* This peer's random id (names it in messages and logs). */
FG_API uint64_t fg_hivemind_peer_id(const fg_hivemind *h);

/* Publishes this peer's progress: its epoch and the samples it has
 * accumulated in it (ready: it waits to average). The record is also
 * republished every expiry/4 s while h lives. */
FG_API FG_MUST_USE fg_status fg_hivemind_publish(fg_hivemind *h, int64_t epoch, int64_t samples,
                                                 bool ready);

/* This peer's pace: the seconds between its optimizer step calls (its
 * forward and backward) and the samples of each; published with its next
 * record. Matchmaking waits for a peer not yet ready only while what it
 * would bring (its samples) is worth the ready peers' time waiting for it
 * (its next step's expected arrival); a peer of unknown pace (0) is waited
 * for up to matchmaking_time. Negative or non-finite values count as 0. */
FG_API void fg_hivemind_set_pace(fg_hivemind *h, double step_seconds, double samples_per_step);

/* Says that this peer has begun stepping: until then its records say it is
 * starting (set up, its epoch not final: a checkpoint may still be restored
 * into it), and a peer that just (re)started waits for those before its
 * first round. Idempotent. */
FG_API FG_MUST_USE fg_status fg_hivemind_started(fg_hivemind *h);

/* What this peer knows of the swarm from the live records (its own too). */
typedef struct fg_hivemind_swarm {
    int64_t epoch;   /* the swarm's epoch: the highest live epoch */
    int64_t samples; /* samples accumulated at that epoch, over the live peers */
    int peers;       /* live peers (any epoch) */
    int at_epoch;    /* live peers at that epoch */
    int ready;       /* ... of which ready */
    int starting;    /* live peers but this one still starting (fg_hivemind_started) */
    int64_t refused; /* records and messages refused so far (wrong secret, size, value) */
} fg_hivemind_swarm;
FG_API void fg_hivemind_swarm_state(fg_hivemind *h, fg_hivemind_swarm *out);

/* Waits until at least n live peers (itself included) are known, or
 * timeout s. FG_ETIMEOUT naming how many are known. */
FG_API FG_MUST_USE fg_status fg_hivemind_wait_peers(fg_hivemind *h, int n, double timeout);

/* Matchmaking for round `epoch`: publishes this peer ready (with its
 * weight, the samples it accumulated), waits until every live peer at that
 * epoch or behind it is ready at it or matchmaking_time has passed, and keeps the ready peers
 * (sorted by id) as the group of the next fg_hivemind_allreduce calls.
 * *members (may be NULL) gets the group's size (1: alone). */
FG_API FG_MUST_USE fg_status fg_hivemind_matchmake(fg_hivemind *h, int64_t epoch, double weight,
                                                   int *members);

/* The sum of the weights the current group's members announced (the
 * samples the group holds; the caller may decline a group short of its
 * target). 0 before any matchmaking. */
FG_API double fg_hivemind_group_weight(const fg_hivemind *h);

/* What one all-reduce did. */
typedef struct fg_hivemind_round {
    int members;           /* the group */
    int contributors;      /* senders whose part this peer reduced (itself included) */
    int parts_missing;     /* reduced parts that did not come (kept local) */
    double weight;         /* the total weight of this peer's part */
    int64_t refused;       /* messages refused during the round */
    uint64_t refused_from; /* the id of the last peer refused (0: none) */
    size_t bytes_sent;     /* message bytes this peer sent */
} fg_hivemind_round;

/* Channels of one round: the gradients, then the state (parameters and
 * optimizer state), each its own messages. */
enum { FG_HIVEMIND_GRADS = 0, FG_HIVEMIND_STATE = 1 };

/* Hivemind's butterfly all-reduce in the current group: data (n values)
 * cut in one part per member; this peer reduces its part (the weighted
 * mean, weights as given, members in id order) and sends it back; every
 * part that comes back replaces the local one. A sender silent past
 * averaging_timeout is left out; a part whose reducer is silent keeps the
 * local values. Every member calls it with the same n, channel and
 * compression. Parts with a wrong size, NaN or inf are refused and logged
 * naming the sender (FG_LOG_WARN). data: borrowed, overwritten. Errors:
 * FG_EINVAL (n < 0, weight <= 0, NaN in data is not refused locally),
 * FG_ESTATE (no fg_hivemind_matchmake before). */
FG_API FG_MUST_USE fg_status fg_hivemind_allreduce(fg_hivemind *h, int channel, float *data,
                                                   int64_t n, double weight,
                                                   fg_hivemind_compression c,
                                                   fg_hivemind_round *info);

/* The state this peer serves to peers that join (Hivemind's
 * load_state_from_peers): `bytes` bytes copied; replaced on each call. */
FG_API FG_MUST_USE fg_status fg_hivemind_set_state(fg_hivemind *h, int64_t epoch, const void *data,
                                                   size_t bytes);
/* Downloads the state of the live peer at the highest epoch (not this
 * one), exactly `bytes` bytes into out, its epoch into *epoch; a peer that
 * does not answer within load_state_timeout (or answers wrongly) is passed
 * for the next. FG_EPEER when no live peer gave one (the caller may go on
 * with its own state, as Hivemind's does), FG_EMISMATCH for a state of
 * another size. */
FG_API FG_MUST_USE fg_status fg_hivemind_load_state(fg_hivemind *h, void *out, size_t bytes,
                                                    int64_t *epoch);

/* The last refusal this peer logged ("" if none): who and why. Valid until
 * the next call on h. */
FG_API const char *fg_hivemind_last_refusal(fg_hivemind *h);

#ifdef __cplusplus
}
#endif
#endif
