/* The DDP gradient reducer: buckets over one flat gradient buffer, reduced
 * asynchronously as backward produces them; under ZeRO reduce-scattered to
 * the shards' ranks instead. Private to the strategy layer. */
#ifndef FULGUR_DDP_REDUCER_H
#define FULGUR_DDP_REDUCER_H

#include "autograd/autograd_impl.h"
#include "fulgur/comm.h"
#include "fulgur/strategy.h"

typedef struct fg__ddp_reducer fg__ddp_reducer;

typedef struct fg__ddp_reducer_opts {
    double bucket_cap_mb;   /* <= 0: 25 */
    double first_bucket_mb; /* the first bucket (last parameters) <= 0: 1, as PyTorch */
    bool find_unused_parameters;
    bool static_graph;
    const char *name; /* in messages; NULL: "ddp" */
    /* ZeRO: world + 1 increasing offsets of the shards (owner_bounds[0] = 0,
     * owner_bounds[world] = the flat gradient's numel; copied). Each bucket
     * is then reduced (average) to the ranks owning its elements, and the
     * other ranks' elements are left as they were. NULL: allreduce (ddp). */
    const int64_t *owner_bounds;
    int world;
    bool after_backward; /* no overlap: every bucket starts once backward is over */
    /* ZeRO-3: called on the backward thread whenever the suffix [begin,
     * numel) of the flat gradient whose reductions have all finished grows
     * (checked as buckets start, and once every one is waited for), so that
     * the strategy releases what the other ranks own. NULL: not called. */
    void (*reduced)(void *ud, int64_t begin);
    void *reduced_ud;
    /* With reduced: the most gradient elements whose reductions have
     * started but not finished; past it, backward waits for the oldest
     * before going on, so that what is released is never far behind (the
     * memory of a rank does not grow with how late the communication runs).
     * 0: no bound. */
    int64_t max_pending;
    /* ddp only: a communication hook run on each bucket instead of the
     * averaging allreduce, with its state: during a backward on the
     * reducer's hook thread, one bucket at a time in index order, while
     * backward goes on (fg__ddp_reducer_reduce: on the calling thread); wire is the dtype of
     * fg_ddp_bucket_allreduce (0: f32, else the wrapper's f16 / bf16, which also rounds each bucket
     * to it first). A wire without a hook wraps the plain average. */
    fg_ddp_hook_fn hook;
    void *hook_state;
    fg_dtype wire;
} fg__ddp_reducer_opts;

/* params[i] are the parameter tensors, whose gradients are views into
 * `flat_grad` at element offsets offs[i] (increasing). Everything is
 * borrowed for the reducer's life. */
FG_MUST_USE fg_status fg__ddp_reducer_new(fg_comm *comm, fg_tensor *flat_grad, int nparams,
                                          fg_tensor *const *params, const int64_t *offs,
                                          const fg__ddp_reducer_opts *o, fg__ddp_reducer **out);
void fg__ddp_reducer_free(fg__ddp_reducer *r);

/* Runs backward from loss with bucket reductions overlapping it (when sync),
 * then waits for every bucket: the flat gradient holds the average over
 * ranks (under ZeRO, in this rank's shard). With sync false it is a plain
 * local backward (no_backward_sync). */
FG_MUST_USE fg_status fg__ddp_reducer_backward(fg__ddp_reducer *r, fg_tensor *loss, bool sync);
/* Reduces every bucket of the flat gradient as it stands, in bucket order,
 * and waits: what a backward with sync does once backward is over. */
FG_MUST_USE fg_status fg__ddp_reducer_reduce(fg__ddp_reducer *r);

int fg__ddp_reducer_num_buckets(const fg__ddp_reducer *r);
/* The byte counts (fg_strategy_comm_bytes); add_bytes counts what the
 * strategy hands the communicator itself (post_localsgd's averaging) into
 * the latest step. */
void fg__ddp_reducer_bytes(const fg__ddp_reducer *r, fg_comm_bytes *out);
void fg__ddp_reducer_add_bytes(fg__ddp_reducer *r, uint64_t bytes);
/* Sums (op) buf over ranks as fg_ddp_bucket_allreduce, in dtype wire
 * (f16, bf16 or f32) whatever the reducer's wire: the compress hooks. */
FG_MUST_USE fg_status fg__ddp_bucket_allreduce_as(const fg_ddp_bucket *b, float *buf, int64_t count,
                                                  fg_dtype wire, fg_reduce_op op);
/* Element range [begin, end) of bucket b in the flat gradient. */
void fg__ddp_reducer_bucket_range(const fg__ddp_reducer *r, int b, int64_t *begin, int64_t *end);

#endif
