/* Bagua's algorithms (strategy bagua): the state they share and the entry
 * points of each file. Private to the strategy layer.
 *   bagua.c         names, option checks, setup, backward, bytes, the
 *                   hierarchical (node-leader) pattern, gradient_allreduce
 *   bagua_q8.c      8-bit min-max chunks and the compressed scatter-gather
 *                   average (bytegrad, qadam)
 *   bagua_decent.c  decentralized and low_precision_decentralized
 *   bagua_qadam.c   qadam's momentum and its frozen-variance update
 *   bagua_async.c   async model averaging on a background thread */
#ifndef FULGUR_BAGUA_IMPL_H
#define FULGUR_BAGUA_IMPL_H

#include <pthread.h>

#include "strategy_impl.h"

typedef struct fg__bagua_async fg__bagua_async;

struct fg__bagua_state {
    fg_strategy *s;
    fg_bagua_opts o; /* resolved: intervals, warm-up and sync interval set */
    int64_t n;       /* elements of the flat parameters */
    fg_dtype dt;
    bool hier;           /* the hierarchical pattern */
    bool eval_only;      /* set up without an optimizer: nothing hooked */
    fg_comm *intra;      /* hier: the ranks of this node (owned) */
    fg_comm *inter;      /* hier: the nodes' first ranks, NULL on the others (owned) */
    int64_t steps;       /* synchronising backwards done */
    int64_t comm_steps;  /* decentralized: communications done (shift_one's pairing) */
    int64_t opt_steps;   /* optimizer steps seen by the hook */
    fg_comm_bytes bytes; /* fg_strategy_comm_bytes */
    uint8_t *rec;        /* q8 records */
    size_t rec_cap;
    float *acc; /* q8: the summed slice */
    int64_t acc_cap;
    float *peer; /* decentralized: the peers' average of the weights (n) */
    fg_comm_req *req;
    float *w, *left, *right; /* low_precision_decentralized: own, left and right weights (n) */
    bool lpd_started;        /* w, left, right set from the first backward's weights */
    float *diff;             /* low_precision_decentralized: scratch (n) */
    fg_optimizer *opt;       /* hooked (qadam, low_precision_decentralized, async) */
    fg__bagua_async *async;
    /* The weights' device when the host cannot touch it (else NULL): the
     * algorithms then run on host copies, staged out and in around their
     * communication (xh: the weights, n; qh: qadam's m, g, v, 3n) */
    fg_dev *dev;
    float *xh, *qh;
};

/* bagua.c (setup, backward, free: strategy_impl.h). Adds b bytes to the latest step's and the total
 * count. */
void fg__bagua_count(fg__bagua_state *st, uint64_t b);
/* buf (n f32) becomes its average over the ranks through fn, which averages
 * over the group it is given: over the strategy's communicator, or under the
 * hierarchical pattern averaged inside the node onto its first rank, fn over
 * the nodes' first ranks, and broadcast inside the node. Counts bytes. */
typedef FG_MUST_USE fg_status (*fg__bagua_avg_fn)(fg__bagua_state *st, fg_comm *c, float *buf,
                                                  int64_t n);
FG_MUST_USE fg_status fg__bagua_centralized(fg__bagua_state *st, float *buf, int64_t n,
                                            fg__bagua_avg_fn fn);
/* Tests: nodes of this many consecutive ranks instead of the machines' (0:
 * the machines'), so that one machine can run the hierarchical pattern. */
extern int fg__bagua_node_size;

/* bagua_q8.c: a chunk record is min and max (f32 each) and one byte per
 * element: q = round((x - min) * 255 / (max - min)), x' = min + q * (max -
 * min) / 255, so |x - x'| <= (max - min) / 510 (plus float rounding). */
#define FG_Q8_HEADER 8
void fg__q8_compress(const float *x, int64_t m, int64_t len, uint8_t *rec);
void fg__q8_decompress(const uint8_t *rec, int64_t m, float *out);
/* The average over c's ranks of buf (n f32) through quantised chunks:
 * ByteGrad's scatter-gather. Counts p (8 + ceil(n / p)) bytes (the alltoall
 * of the chunks, as ddp counts its allreduce's buffer once for both
 * phases). Nothing moves on a group of one. Collective over c. */
FG_MUST_USE fg_status fg__q8_average(fg__bagua_state *st, fg_comm *c, float *buf, int64_t n);
FG_MUST_USE fg_status fg__q8_reserve(fg__bagua_state *st, size_t rec_bytes, int64_t floats);

/* bagua_decent.c */
FG_MUST_USE fg_status fg__decent_setup(fg__bagua_state *st);
FG_MUST_USE fg_status fg__decent_backward(fg__bagua_state *st, fg_tensor *loss);
/* low_precision_decentralized's exchange after an optimizer step */
FG_MUST_USE fg_status fg__lpd_after_step(fg__bagua_state *st);
/* decentralized shift_one: the peer of rank in a group of size at
 * communication k (Bagua's pairing; size even). */
int fg__bagua_shift_one_peer(int rank, int size, int64_t k);

/* bagua_qadam.c */
FG_MUST_USE fg_status fg__qadam_setup(fg__bagua_state *st);
FG_MUST_USE fg_status fg__qadam_bucket(fg__bagua_state *st, const fg_ddp_bucket *b);
FG_MUST_USE fg_status fg__qadam_pre_step(void *ud, fg_optimizer *opt, bool *skip);

/* bagua_async.c */
FG_MUST_USE fg_status fg__async_setup(fg__bagua_state *st);
void fg__async_free(fg__bagua_state *st);
FG_MUST_USE fg_status fg__async_after_step(fg__bagua_state *st);
/* tests: rounds whose average this rank has applied */
int64_t fg__async_applied(const fg_strategy *s);

#endif
