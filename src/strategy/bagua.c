/* strategy bagua: Bagua's algorithms behind fg_strategy. This file holds
 * their names and option checks, the setup every algorithm shares (rank 0's
 * weights to every rank, ddp's buckets, the node groups of the hierarchical
 * pattern, the optimizer hook), backward, the byte counts, and
 * gradient_allreduce and bytegrad, which are a bucket hook each.
 *
 * Invariants: every synchronising backward counts one step and its bytes;
 * the gradients left after backward are the average (gradient_allreduce,
 * bytegrad, the warm-ups of qadam and async) or this rank's own (the
 * others); while st->opt is set its hook points at st; a strategy set up
 * without an optimizer (eval_only) hooks none and keeps the ranks' weights
 * where the algorithm lets them differ. */
#include <string.h>
#include <strings.h>

#include "bagua_impl.h"
#include "optim/optim_impl.h"

int fg__bagua_node_size;

static const char *const k_algos[FG_BAGUA_ALGORITHM_COUNT] = {
    [FG_BAGUA_GRADIENT_ALLREDUCE] = "gradient_allreduce",
    [FG_BAGUA_BYTEGRAD] = "bytegrad",
    [FG_BAGUA_DECENTRALIZED] = "decentralized",
    [FG_BAGUA_LOW_PRECISION_DECENTRALIZED] = "low_precision_decentralized",
    [FG_BAGUA_QADAM] = "qadam",
    [FG_BAGUA_ASYNC] = "async"};

static const char *const k_peers[FG_BAGUA_PEERS_COUNT] = {
    [FG_BAGUA_PEERS_ALL] = "all", [FG_BAGUA_PEERS_SHIFT_ONE] = "shift_one"};

const char *fg_bagua_algorithm_name(fg_bagua_algorithm a) {
    return (int)a >= 0 && a < FG_BAGUA_ALGORITHM_COUNT ? k_algos[a] : "?";
}

fg_status fg_bagua_algorithm_parse(const char *name, fg_bagua_algorithm *out) {
    for (int i = 0; name && i < FG_BAGUA_ALGORITHM_COUNT; i++)
        if (!strcasecmp(name, k_algos[i])) {
            if (out) *out = (fg_bagua_algorithm)i;
            return FG_OK;
        }
    return fg_error(FG_EINVAL,
                    "bagua algorithm=\"%s\": expected one of gradient_allreduce, bytegrad, "
                    "decentralized, low_precision_decentralized, qadam, async",
                    name ? name : "(null)");
}

const char *fg_bagua_peer_selection_name(fg_bagua_peer_selection p) {
    return (int)p >= 0 && p < FG_BAGUA_PEERS_COUNT ? k_peers[p] : "?";
}

fg_status fg_bagua_peer_selection_parse(const char *name, fg_bagua_peer_selection *out) {
    for (int i = 0; name && i < FG_BAGUA_PEERS_COUNT; i++)
        if (!strcasecmp(name, k_peers[i])) {
            if (out) *out = (fg_bagua_peer_selection)i;
            return FG_OK;
        }
    return fg_error(FG_EINVAL, "bagua peer_selection_mode=\"%s\": expected all or shift_one",
                    name ? name : "(null)");
}

fg_status fg__bagua_check(const fg_bagua_opts *o) {
    if ((int)o->algorithm < 0 || o->algorithm >= FG_BAGUA_ALGORITHM_COUNT)
        return fg_error(FG_EINVAL,
                        "bagua: algorithm %d: expected one of fg_bagua_algorithm "
                        "(gradient_allreduce, bytegrad, decentralized, "
                        "low_precision_decentralized, qadam, async)",
                        (int)o->algorithm);
    if ((int)o->peer_selection_mode < 0 || o->peer_selection_mode >= FG_BAGUA_PEERS_COUNT)
        return fg_error(FG_EINVAL, "bagua: peer_selection_mode %d: expected all or shift_one",
                        (int)o->peer_selection_mode);
    if (o->hierarchical < -1 || o->hierarchical > 1)
        return fg_error(FG_EINVAL,
                        "bagua: hierarchical %d: expected 1 (on), -1 (off) or 0 (the "
                        "algorithm's default)",
                        o->hierarchical);
    if (o->communication_interval < 0 || o->sync_interval_ms < 0)
        return fg_error(FG_EINVAL,
                        "bagua: communication_interval %lld, sync_interval_ms %lld: expected "
                        "values >= 0 (0: the default)",
                        (long long)o->communication_interval, (long long)o->sync_interval_ms);
    if (o->algorithm == FG_BAGUA_QADAM && o->warmup_steps < 0)
        return fg_error(FG_EINVAL,
                        "bagua qadam: warmup_steps %lld: QAdam freezes the variance of its "
                        "warm-up, so it needs at least 1 step of it (0: 100)",
                        (long long)o->warmup_steps);
    if (o->algorithm == FG_BAGUA_ASYNC && o->hierarchical > 0)
        return fg_error(FG_EINVAL, "bagua async: hierarchical=1: asynchronous model averaging "
                                   "is flat only (as Bagua's)");
    if (o->peer_selection_mode == FG_BAGUA_PEERS_SHIFT_ONE &&
        o->algorithm != FG_BAGUA_DECENTRALIZED)
        return fg_error(FG_EINVAL,
                        "bagua %s: peer_selection_mode shift_one is decentralized's; this "
                        "algorithm has no peers to select",
                        fg_bagua_algorithm_name(o->algorithm));
    return FG_OK;
}

static bool default_hier(fg_bagua_algorithm a, int nodes, int world);

fg_status fg__bagua_check_job(const fg_bagua_opts *o, fg_dtype dt, int world, int nodes) {
    const char *algo = fg_bagua_algorithm_name(o->algorithm);
    if (dt != FG_F32 && o->algorithm != FG_BAGUA_GRADIENT_ALLREDUCE)
        return fg_error(FG_EUNSUPPORTED,
                        "bagua %s: works on f32 weights and gradients; this model's are %s "
                        "(precision 64-true?): use 32-true or a mixed precision",
                        algo, fg_dtype_name(dt));
    bool hier =
        o->hierarchical > 0 || (o->hierarchical == 0 && default_hier(o->algorithm, nodes, world));
    int groups = hier ? nodes : world;
    if (o->algorithm == FG_BAGUA_DECENTRALIZED &&
        o->peer_selection_mode == FG_BAGUA_PEERS_SHIFT_ONE && groups % 2)
        return fg_error(FG_EINVAL,
                        "bagua decentralized: peer_selection_mode shift_one pairs the %s, and "
                        "there are %d of them: it needs an even number (or use "
                        "peer_selection_mode all)",
                        hier ? "nodes (hierarchical)" : "ranks", groups);
    return FG_OK;
}

void fg__bagua_count(fg__bagua_state *st, uint64_t b) {
    st->bytes.last_step += b;
    st->bytes.total += b;
}

void fg__bagua_bytes(const fg_strategy *s, fg_comm_bytes *out) { *out = s->bagua->bytes; }

/* ------------------------------------------------------------ hierarchy */

static FG_MUST_USE fg_status allreduce_avg(fg__bagua_state *st, fg_comm *c, float *buf, int64_t n) {
    if (fg_comm_size(c) < 2) return FG_OK;
    fg__bagua_count(st, (uint64_t)n * sizeof(float));
    return fg_comm_allreduce(c, buf, buf, n, FG_F32, FG_REDUCE_OP_AVG);
}

fg_status fg__bagua_centralized(fg__bagua_state *st, float *buf, int64_t n, fg__bagua_avg_fn fn) {
    if (!st->hier) return fn(st, st->s->comm, buf, n);
    bool several = fg_comm_size(st->intra) > 1;
    if (several) {
        fg__bagua_count(st, (uint64_t)n * sizeof(float));
        FG_TRY(fg_comm_reduce(st->intra, buf, buf, n, FG_F32, FG_REDUCE_OP_AVG, 0));
    }
    if (st->inter) FG_TRY(fn(st, st->inter, buf, n));
    if (several) {
        fg__bagua_count(st, (uint64_t)n * sizeof(float));
        FG_TRY(fg_comm_broadcast(st->intra, buf, buf, n, FG_F32, 0));
    }
    return FG_OK;
}

/* The node groups: ranks with the same node id (the machine's, or
 * fg__bagua_node_size consecutive ranks in tests) inside, their first
 * ranks across. *nodes and *world_out: the node count and the world size,
 * the same on every rank (a node holds several ranks when world > nodes). */
static FG_MUST_USE fg_status make_groups(fg__bagua_state *st, int *nodes, int *world_out) {
    fg_comm *c = st->s->comm;
    int rank = fg_comm_rank(c), world = fg_comm_size(c);
    int node = fg__bagua_node_size > 0 ? rank / fg__bagua_node_size : fg_comm_node_rank(c);
    *nodes = fg__bagua_node_size > 0 ? (world + fg__bagua_node_size - 1) / fg__bagua_node_size
                                     : fg_comm_num_nodes(c);
    *world_out = world;
    if (!st->hier) return FG_OK;
    FG_TRY(fg_comm_split(c, node, rank, &st->intra));
    bool leader = fg_comm_rank(st->intra) == 0;
    return fg_comm_split(c, leader ? 0 : FG_COMM_SPLIT_NONE, rank, &st->inter);
}

/* --------------------------------------------------------- bucket hooks */

static FG_MUST_USE fg_status bucket_hook(void *state, const fg_ddp_bucket *b) {
    fg__bagua_state *st = state;
    switch (st->o.algorithm) {
    case FG_BAGUA_GRADIENT_ALLREDUCE:
        return fg__bagua_centralized(st, b->grad, b->numel, allreduce_avg);
    case FG_BAGUA_BYTEGRAD: return fg__bagua_centralized(st, b->grad, b->numel, fg__q8_average);
    case FG_BAGUA_QADAM: return fg__qadam_bucket(st, b);
    case FG_BAGUA_ASYNC:
        /* warm-up: plain ddp; then the gradients stay local */
        if (!st->opt) return fg_error(FG_ESTATE, "bagua async: its optimizer was freed");
        if (fg_optimizer_step_count(st->opt) < st->o.warmup_steps)
            return fg_ddp_bucket_allreduce(b, b->grad, b->numel, FG_REDUCE_OP_AVG);
        return FG_OK;
    default:
        return fg_error(FG_EINTERNAL, "bagua: no bucket hook for %s", k_algos[st->o.algorithm]);
    }
}

/* -------------------------------------------------------- optimizer hook */

static FG_MUST_USE fg_status after_step(void *ud, fg_optimizer *opt) {
    (void)opt;
    fg__bagua_state *st = ud;
    st->opt_steps++;
    if (st->o.algorithm == FG_BAGUA_LOW_PRECISION_DECENTRALIZED) return fg__lpd_after_step(st);
    if (st->o.algorithm == FG_BAGUA_ASYNC) return fg__async_after_step(st);
    return FG_OK;
}

static void detach(void *ud) {
    fg__bagua_state *st = ud;
    st->opt = NULL;
}

static FG_MUST_USE fg_status hook_optimizer(fg__bagua_state *st) {
    fg_strategy *s = st->s;
    if (!s->opt || fg_optimizer_module(s->opt) != s->model)
        return fg_error(FG_EINVAL,
                        "bagua %s: needs the optimizer over the whole model (it acts at the "
                        "optimizer's steps); got %s",
                        k_algos[st->o.algorithm], s->opt ? "one over another module" : "none");
    st->opt = s->opt;
    fg__optim_hook h = {.post_step = after_step, .detach = detach, .ud = st};
    if (st->o.algorithm == FG_BAGUA_QADAM) h.pre_step = fg__qadam_pre_step;
    fg__optimizer_set_hook(st->opt, &h);
    return FG_OK;
}

/* ---------------------------------------------------------------- setup */

static bool default_hier(fg_bagua_algorithm a, int nodes, int world) {
    switch (a) {
    case FG_BAGUA_BYTEGRAD:
    case FG_BAGUA_DECENTRALIZED:
    case FG_BAGUA_LOW_PRECISION_DECENTRALIZED:
    case FG_BAGUA_QADAM: return nodes > 1 && world > nodes;
    default: return false;
    }
}

fg_status fg__bagua_setup(fg_strategy *s, const fg_ddp_opts *o) {
    fg_ddp_opts d = o ? *o : (fg_ddp_opts){0};
    const char *algo = fg_bagua_algorithm_name(d.bagua.algorithm);
    if (d.comm_hook != FG_DDP_HOOK_NONE || d.user_hook || d.comm_wrapper != FG_DDP_WRAPPER_NONE)
        return fg_error(FG_EINVAL,
                        "strategy bagua (algorithm %s): ddp's communication hooks do not apply; "
                        "the algorithm is the communication (unset ddp_comm_hook / "
                        "ddp_comm_wrapper)",
                        algo);
    fg__bagua_state *st = fg_calloc(1, sizeof *st);
    if (!st) return fg_error_wrap(FG_ENOMEM, "bagua setup");
    s->bagua = st;
    st->s = s;
    st->o = d.bagua;
    fg_tensor *flat = fg_module_flat_params(s->model);
    if (!flat || !fg_module_flat_grads(s->model))
        return fg_error(FG_EINVAL, "bagua: the model has no flat parameter buffer");
    st->n = fg_tensor_numel(flat);
    st->dt = fg_tensor_dtype(flat);
    st->dev = fg__zero_dev(flat);
    if (st->dev && !(st->xh = fg_alloc(sizeof(float) * (size_t)FG_MAX(st->n, 1))))
        return fg_error_wrap(FG_ENOMEM, "bagua setup: the host copy of the weights");
    fg_bagua_algorithm a = st->o.algorithm;
    if (st->dt != FG_F32 && a != FG_BAGUA_GRADIENT_ALLREDUCE)
        return fg_error(FG_EUNSUPPORTED,
                        "bagua %s: works on f32 weights and gradients; this model's are %s "
                        "(precision 64-true?): use 32-true or a mixed precision",
                        algo, fg_dtype_name(st->dt));
    if (st->o.communication_interval <= 0) st->o.communication_interval = 1;
    if (st->o.sync_interval_ms <= 0) st->o.sync_interval_ms = 500;
    if (a == FG_BAGUA_QADAM && st->o.warmup_steps == 0) st->o.warmup_steps = 100;
    if (st->o.warmup_steps < 0) st->o.warmup_steps = 0;
    st->bytes.dense_step = (uint64_t)st->n * fg_dtype_size(st->dt);
    /* Set up without an optimizer (validate, test, predict), nothing will
     * step: as Lightning, which wraps the model in Bagua's only to fit,
     * the ranks keep their own weights where the algorithm lets them
     * differ (a validation after fit in another launch sees each rank's),
     * and nothing is hooked to an optimizer. */
    st->eval_only = !s->opt;
    bool differ = a == FG_BAGUA_DECENTRALIZED || a == FG_BAGUA_LOW_PRECISION_DECENTRALIZED ||
                  a == FG_BAGUA_ASYNC;
    bool stepped = a == FG_BAGUA_LOW_PRECISION_DECENTRALIZED || a == FG_BAGUA_QADAM ||
                   a == FG_BAGUA_ASYNC; /* acts at the optimizer's steps */
    if (!(st->eval_only && differ)) FG_TRY(fg__strategy_broadcast_params(s));
    int nodes = 1, world = 1;          /* the same on every rank, so is the default below */
    st->hier = st->o.hierarchical > 0; /* groups first, to know the default */
    FG_TRY(make_groups(st, &nodes, &world));
    if (st->o.hierarchical == 0 && default_hier(a, nodes, world)) {
        st->hier = true;
        FG_TRY(make_groups(st, &nodes, &world));
    }
    fg__ddp_reducer_opts ro = {.bucket_cap_mb = d.bucket_cap_mb,
                               .find_unused_parameters = d.find_unused_parameters,
                               .static_graph = d.static_graph,
                               .name = "bagua"};
    bool flat_ga = a == FG_BAGUA_GRADIENT_ALLREDUCE && !st->hier;
    if (!flat_ga && (a == FG_BAGUA_GRADIENT_ALLREDUCE || a == FG_BAGUA_BYTEGRAD ||
                     a == FG_BAGUA_QADAM || a == FG_BAGUA_ASYNC)) {
        ro.hook = bucket_hook;
        ro.hook_state = st;
    }
    FG_TRY(fg__strategy_reducer_new(s, s->comm, &ro));
    if (st->eval_only && stepped) return FG_OK;
    switch (a) {
    case FG_BAGUA_DECENTRALIZED:
    case FG_BAGUA_LOW_PRECISION_DECENTRALIZED: FG_TRY(fg__decent_setup(st)); break;
    case FG_BAGUA_QADAM: FG_TRY(fg__qadam_setup(st)); break;
    case FG_BAGUA_ASYNC: FG_TRY(fg__async_setup(st)); break;
    default: break;
    }
    if (stepped) FG_TRY(hook_optimizer(st));
    return FG_OK;
}

void fg__bagua_free(fg_strategy *s) {
    fg__bagua_state *st = s->bagua;
    if (!st) return;
    fg__async_free(st);
    if (st->opt) fg__optimizer_set_hook(st->opt, NULL);
    if (fg_comm_wait(st->req) != FG_OK) {
        /* freeing: the pending request's error goes nowhere */
    }
    fg_comm_free(st->inter);
    fg_comm_free(st->intra);
    fg_free(st->rec);
    fg_free(st->acc);
    fg_free(st->peer);
    fg_free(st->w);
    fg_free(st->left);
    fg_free(st->right);
    fg_free(st->diff);
    fg_free(st->xh);
    fg_free(st->qh);
    fg_free(st);
    s->bagua = NULL;
}

fg_status fg__bagua_backward(fg_strategy *s, fg_tensor *loss) {
    fg__bagua_state *st = s->bagua;
    if (st->eval_only && (st->o.algorithm == FG_BAGUA_LOW_PRECISION_DECENTRALIZED ||
                          st->o.algorithm == FG_BAGUA_QADAM || st->o.algorithm == FG_BAGUA_ASYNC))
        return fg_error(FG_ESTATE,
                        "bagua %s: set up without an optimizer (to validate, test or predict), "
                        "so it cannot train: it acts at the optimizer's steps; set the model up "
                        "with its optimizer in a launch of its own (a Trainer's fit before its "
                        "validate, or in another fg_fabric_launch)",
                        k_algos[st->o.algorithm]);
    if (!s->sync) return fg_backward(loss);
    st->bytes.last_step = 0;
    fg_status rc;
    switch (st->o.algorithm) {
    case FG_BAGUA_DECENTRALIZED: rc = fg__decent_backward(st, loss); break;
    case FG_BAGUA_LOW_PRECISION_DECENTRALIZED:
        /* the neighbours' copies start from the weights of the first step
         * (rank 0's on every rank: the start, or a loaded checkpoint) */
        if (!st->lpd_started) {
            size_t bytes = sizeof(float) * (size_t)st->n;
            const float *x = fg_tensor_data(fg_module_flat_params(s->model));
            FG_TRY(fg__stage_out(st->dev, st->w, x, bytes));
            memcpy(st->left, st->w, bytes);
            memcpy(st->right, st->w, bytes);
            st->lpd_started = true;
        }
        rc = fg_backward(loss);
        break;
    default: {
        fg_comm_bytes before, after;
        fg__ddp_reducer_bytes(s->reducer, &before);
        rc = fg__ddp_reducer_backward(s->reducer, loss, true);
        fg__ddp_reducer_bytes(s->reducer, &after);
        fg__bagua_count(st, after.total - before.total);
    }
    }
    if (rc == FG_OK) st->bytes.steps = ++st->steps;
    return rc;
}
