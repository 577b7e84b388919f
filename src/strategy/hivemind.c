/* strategy hivemind (Lightning's HivemindStrategy, docs/hivemind.md): this
 * process is one peer of a swarm (src/hivemind). Each optimizer step call
 * adds the gradient, times the local batch, to an accumulator and publishes
 * the samples accumulated in this peer's epoch; when the swarm's count for
 * the epoch reaches target_batch_size, the ready peers match, average the
 * accumulated gradients weighted by their samples (butterfly all-reduce),
 * take one optimizer step with the epoch's lr (scheduler_fn), and every
 * average_state_every epochs average parameters and optimizer state too.
 * A peer behind the swarm's epoch (new, or stalled) loads the state of a
 * live peer first (load_state_from_peers). The optimizer's step count is the
 * global epoch.
 *
 * offload_optimizer, delay_optimizer_step, delay_grad_averaging,
 * delay_state_averaging (Hivemind's): a round (one epoch's averaging and
 * step) steps a master copy of the parameters (`master`, host memory) with
 * the round's own copy of the optimizer (its lr and decay of the epoch; the
 * optimizer's state buffers), and its result is copied into the model when
 * the round is collected. With delay_optimizer_step the round runs in a
 * thread of its own (one at a time) while the training thread accumulates
 * the next epoch's gradients from the parameters it has (one epoch stale).
 * Threads: while a round is in flight (bg.running) it owns master, rgrad,
 * h->state, the optimizer's state buffers and the group calls of the peer
 * (matchmake, allreduce); the training thread touches none of them, nor the
 * optimizer's step count, and writes the model's parameters only when it
 * collects the round (a step call, fg_strategy_settle, free). With
 * delay_grad_averaging the round also matches: until it has (bg.matched),
 * the training thread publishes nothing (the peer's record says it is
 * ready at the round's epoch) and counts its new samples for the next
 * epoch, or, if the group declines, for the same one again.
 *
 * reuse_grad_buffers (Hivemind's): the model's gradient buffer is the
 * accumulator. While the strategy holds the model, zero_grad (the fabric's,
 * the Trainer's, the user's) leaves it as it is, as Lightning turns the
 * Trainer's off; each backward adds to it, the epoch's local mean is the
 * buffer over the step calls counted (Hivemind's local_times_accumulated),
 * and the strategy zeroes it when it takes an epoch's gradients. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "optim/optim_impl.h"
#include "strategy_impl.h"

/* The round in flight of an offloaded optimizer (see above). */
typedef struct hm_round {
    pthread_t th;
    bool running; /* launched, not collected */
    bool thread;  /* ... in a thread of its own (joined at its collection) */
    bool grads;   /* it matches and averages the gradients (delay_grad_averaging) */
    bool state;   /* it averages the state after its step (delay_state_averaging) */
    bool noted;   /* the training thread has moved to the next epoch */
    int matched;  /* atomic: 0 matching, 1 matched, -1 declined (a group short of the target) */
    int done;     /* atomic: its work has ended */
    int64_t epoch, samples;
    int members;
    fg_hivemind_round r;
    fg_status err;
    char msg[512];
    bool state_failed;   /* its state averaging failed after the step (kept: logged) */
    char state_msg[512]; /* ... and why */
    fg_optimizer opt;    /* the optimizer's copy it steps: its own segments, no hook */
    int64_t *seg_begin;
    double *seg_lr, *seg_wd;
} hm_round;

struct fg__hivemind_state {
    fg_hivemind_strategy_opts o;
    fg_hivemind *peer;
    float *acc;            /* the gradient accumulated, times samples (NULL: in the grad buffer) */
    int64_t calls;         /* step calls accumulated in this epoch (the grad buffer's divisor) */
    fg__module_wrap keep;  /* reuse_grad_buffers: the model's zero_grad, which keeps the buffer */
    bool kept, model_gone; /* ... installed; the model was freed first */
    fg_dev *dev;           /* the model's device when the host cannot read it (else NULL) */
    float *gh;       /* on such a device: a step's gradient, then the round's, in host memory */
    float *state;    /* the served state: parameters, optimizer state buffers */
    int64_t numel;   /* parameter elements */
    int nstates;     /* optimizer state buffers */
    int64_t epoch;   /* this peer's global epoch */
    int64_t samples; /* accumulated in it */
    int64_t rounds, loads, steps_here;
    int max_group;           /* the largest group this peer averaged in */
    int64_t declined;        /* groups short of the target, declined */
    double first_round_wait; /* fg_time() until which the first round waits for starting peers */
    double left_at;          /* fg_time() the last step call returned */
    double gaps[8];          /* the last times between step calls (0: none yet) */
    int ngaps;
    bool started;  /* has taken its first optimizer step call */
    bool offload;  /* offload_optimizer (or a delay): rounds step master */
    float *master; /* the parameters a round steps (offload) */
    float *rgrad;  /* a round's gradient: the epoch's sum, then the averaged mean */
    hm_round bg;
};

/* numel f32 values of a buffer of the model's device to host memory, and
 * back (a plain copy on the host) */
static FG_MUST_USE fg_status to_host(const fg__hivemind_state *h, float *dst, const float *src) {
    if (!h->dev) return memcpy(dst, src, (size_t)h->numel * 4), FG_OK;
    return fg_dev_copy_d2h(h->dev, dst, src, (size_t)h->numel * 4);
}
static FG_MUST_USE fg_status from_host(const fg__hivemind_state *h, float *dst, const float *src) {
    if (!h->dev) return memcpy(dst, src, (size_t)h->numel * 4), FG_OK;
    return fg_dev_copy_h2d(h->dev, dst, src, (size_t)h->numel * 4);
}

/* The accumulation of this epoch emptied: the samples, the step calls, the
 * accumulator (the model's gradient buffer under reuse_grad_buffers). */
static FG_MUST_USE fg_status acc_reset(fg_strategy *s) {
    fg__hivemind_state *h = s->hivemind;
    h->samples = 0;
    h->calls = 0;
    if (h->acc) return memset(h->acc, 0, (size_t)h->numel * 4), FG_OK;
    return fg_tensor_fill(fg_module_flat_grads(s->model), 0);
}

/* This step call's gradient (the model's buffer) into the accumulation. */
static FG_MUST_USE fg_status accumulate(fg_strategy *s) {
    fg__hivemind_state *h = s->hivemind;
    int64_t bs = h->o.batch_size;
    if (h->acc) {
        float *g = fg_tensor_data(fg_module_flat_grads(s->model));
        if (h->dev) {
            FG_TRY(to_host(h, h->gh, g));
            g = h->gh;
        }
        for (int64_t i = 0; i < h->numel; i++) h->acc[i] += (float)bs * g[i];
    }
    h->samples += bs;
    h->calls++;
    return FG_OK;
}

/* The local mean gradient of the epoch into dst (host memory, numel
 * values): the accumulator over the samples, or the gradient buffer (the
 * sum of the calls' gradients, each a mean over its batch) over the calls:
 * the same values up to rounding (a bias's backward adds its rows into the
 * buffer one by one, so the order of additions differs). */
static FG_MUST_USE fg_status local_mean(fg_strategy *s, float *dst) {
    fg__hivemind_state *h = s->hivemind;
    if (h->acc) {
        double inv = 1.0 / (double)h->samples;
        for (int64_t i = 0; i < h->numel; i++) dst[i] = (float)(h->acc[i] * inv);
        return FG_OK;
    }
    const float *gd = fg_tensor_data(fg_module_flat_grads(s->model));
    if (dst != gd) FG_TRY(to_host(h, dst, gd));
    double inv = 1.0 / (double)h->calls;
    for (int64_t i = 0; i < h->numel; i++) dst[i] = (float)(dst[i] * inv);
    return FG_OK;
}

/* reuse_grad_buffers' wrap of the model (no units): zero_grad keeps the buffer */
static void keep_grads(void *ud) { (void)ud; }
static void model_gone(void *ud) { ((fg__hivemind_state *)ud)->model_gone = true; }

/* The state layout: parameters, then each optimizer state buffer (numel
 * f32 each); its size in values. */
static int64_t state_len(const fg__hivemind_state *h) { return h->numel * (1 + h->nstates); }

static FG_MUST_USE fg_status gather_state(fg_strategy *s, float *out) {
    fg__hivemind_state *h = s->hivemind;
    FG_TRY(to_host(h, out, fg_tensor_data(fg_module_flat_params(s->model))));
    for (int i = 0; i < h->nstates; i++) {
        fg_tensor *t = fg_optimizer_state(s->opt, i);
        if (!t || fg_tensor_numel(t) != h->numel || fg_tensor_dtype(t) != FG_F32)
            return fg_error(FG_EUNSUPPORTED, "hivemind: optimizer state %d is not %lld f32 values",
                            i, (long long)h->numel);
        FG_TRY(to_host(h, out + h->numel * (1 + i), fg_tensor_data(t)));
    }
    return FG_OK;
}

static FG_MUST_USE fg_status scatter_state(fg_strategy *s, const float *in) {
    fg__hivemind_state *h = s->hivemind;
    FG_TRY(from_host(h, fg_tensor_data(fg_module_flat_params(s->model)), in));
    for (int i = 0; i < h->nstates; i++)
        FG_TRY(
            from_host(h, fg_tensor_data(fg_optimizer_state(s->opt, i)), in + h->numel * (1 + i)));
    return FG_OK;
}

static FG_MUST_USE fg_status serve_state(fg_strategy *s) {
    fg__hivemind_state *h = s->hivemind;
    FG_TRY(gather_state(s, h->state));
    return fg_hivemind_set_state(h->peer, h->epoch, h->state, (size_t)state_len(h) * 4);
}

/* load_state_from_peers: parameters, optimizer state and epoch. */
static FG_MUST_USE fg_status load_from_peers(fg_strategy *s) {
    fg__hivemind_state *h = s->hivemind;
    int64_t epoch;
    FG_TRY(fg_hivemind_load_state(h->peer, h->state, (size_t)state_len(h) * 4, &epoch));
    FG_TRY(scatter_state(s, h->state));
    h->epoch = epoch;
    FG_TRY(acc_reset(s));
    h->loads++;
    FG_TRY(fg_optimizer_set_step_count(s->opt, epoch));
    fg_log(FG_LOG_INFO, "hivemind: loaded the state of epoch %lld from a peer", (long long)epoch);
    return fg_hivemind_publish(h->peer, h->epoch, 0, false);
}

/* offload_optimizer: the master copy, the round's gradient and the
 * segments of the round's optimizer copy. Only where the host reads the
 * model and the optimizer's state in place (the CPU): the round steps host
 * memory with the optimizer's own kernels. */
static FG_MUST_USE fg_status offload_setup(fg_strategy *s) {
    fg__hivemind_state *h = s->hivemind;
    fg_optimizer *opt = s->opt;
    if (!h->o.offload_optimizer) return FG_OK;
    if (h->dev || (opt->dev && !fg_dev_host_accessible(opt->dev)) || opt->offload ||
        opt->host_state)
        return fg_error(FG_EUNSUPPORTED,
                        "strategy hivemind: offload_optimizer with the model or the optimizer's "
                        "state on %s: not built (the round steps a host copy with the "
                        "optimizer's state in place); train on the CPU, or leave "
                        "offload_optimizer and the delays false",
                        h->dev     ? fg_dev_name(h->dev)
                        : opt->dev ? fg_dev_name(opt->dev)
                                   : "another store (offload_optimizer_device)");
    if (fg_optimizer_module(opt) != s->model || opt->numel != h->numel || opt->dt != FG_F32)
        return fg_error(FG_EUNSUPPORTED,
                        "strategy hivemind: offload_optimizer needs an f32 optimizer over the "
                        "whole model");
    h->offload = true;
    hm_round *b = &h->bg;
    size_t nseg = (size_t)opt->m->p_count + 1;
    if (!(h->master = fg_alloc((size_t)h->numel * 4)) ||
        !(h->rgrad = fg_alloc((size_t)h->numel * 4)) ||
        !(b->seg_begin = fg_alloc(nseg * sizeof *b->seg_begin)) ||
        !(b->seg_lr = fg_alloc(nseg * sizeof *b->seg_lr)) ||
        !(b->seg_wd = fg_alloc(nseg * sizeof *b->seg_wd)))
        return fg_last_status();
    return FG_OK;
}

fg_status fg__hivemind_setup(fg_strategy *s, const fg_ddp_opts *d) {
    const fg_hivemind_strategy_opts *o = d ? &d->hivemind : NULL;
    if (!s->opt) return fg_error(FG_EINVAL, "strategy hivemind: needs the optimizer at setup");
    if (!o || o->target_batch_size <= 0 || o->batch_size <= 0)
        return fg_error(FG_EINVAL,
                        "strategy hivemind: target_batch_size %lld and batch_size %lld: both "
                        "must be > 0 (--target-batch-size; batch_size is the loader's)",
                        o ? (long long)o->target_batch_size : 0LL,
                        o ? (long long)o->batch_size : 0LL);
    if (o->reuse_grad_buffers && o->delay_grad_averaging)
        return fg_error(FG_EINVAL,
                        "strategy hivemind: reuse_grad_buffers with delay_grad_averaging: the "
                        "background round would average the buffer the next epoch's backward "
                        "adds to; leave one of them false");
    /* Hivemind's requirements: a delayed step runs on the offloaded
     * optimizer, and the gradients or the state are averaged in the
     * background only by the round that steps there */
    if (o->delay_grad_averaging && !o->delay_optimizer_step)
        return fg_error(FG_EINVAL,
                        "strategy hivemind: delay_grad_averaging needs delay_optimizer_step "
                        "(the gradients are averaged in the background by the round that "
                        "steps there, as Hivemind's); set both, or leave it false");
    if (o->delay_state_averaging && !o->delay_optimizer_step)
        return fg_error(FG_EINVAL,
                        "strategy hivemind: delay_state_averaging needs delay_optimizer_step "
                        "(the state is averaged in the background after the step the round "
                        "takes there); set both, or leave it false");
    if (o->delay_optimizer_step && !o->offload_optimizer)
        return fg_error(FG_EINVAL,
                        "strategy hivemind: delay_optimizer_step needs offload_optimizer (the "
                        "background step updates a master copy of the parameters, as "
                        "Hivemind's); set offload_optimizer too");
    fg_tensor *fp = fg_module_flat_params(s->model), *fgr = fg_module_flat_grads(s->model);
    if (!fp || !fgr || fg_tensor_dtype(fp) != FG_F32 || fg_tensor_dtype(fgr) != FG_F32)
        return fg_error(FG_EUNSUPPORTED, "strategy hivemind: needs f32 parameters and gradients "
                                         "in the flat buffers (32-true or a mixed precision)");
    fg__hivemind_state *h = fg_calloc(1, sizeof *h);
    if (!h) return fg_last_status();
    s->hivemind = h;
    h->o = *o;
    h->numel = fg_module_numel(s->model);
    h->nstates = fg_optimizer_num_states(s->opt);
    fg_dev *dev = fg_tensor_dev(fp);
    h->dev = dev && !fg_dev_host_accessible(dev) ? dev : NULL;
    if (!o->reuse_grad_buffers && !(h->acc = fg_calloc((size_t)h->numel, 4)))
        return fg_last_status();
    if (h->dev && !(h->gh = fg_alloc((size_t)h->numel * 4))) return fg_last_status();
    if (!(h->state = fg_alloc((size_t)state_len(h) * 4))) return fg_last_status();
    FG_TRY(offload_setup(s));
    if (o->reuse_grad_buffers) {
        /* the buffer starts empty: what a backward before the setup left
         * in it is not this epoch's */
        h->keep = (fg__module_wrap){.zero_grad = keep_grads, .detach = model_gone, .ud = h};
        fg__module_set_wrap(s->model, &h->keep, NULL, 0);
        h->kept = true;
        FG_TRY(acc_reset(s));
    }
    fg_hivemind_opts po = {.run_id = o->run_id,
                           .secret = o->run_secret,
                           .initial_peers = o->initial_peers,
                           .host = o->host,
                           .host_maxaddrs = o->host_maxaddrs,
                           .dht_port = o->dht_port,
                           .matchmaking_time = o->matchmaking_time,
                           .averaging_timeout = o->averaging_timeout,
                           .load_state_timeout = o->load_state_timeout,
                           .max_message_bytes = (size_t)state_len(h) * 4 + 4096};
    if (!(h->peer = fg_hivemind_new(&po))) return fg_last_status();
    fg_log(FG_LOG_INFO,
           "hivemind: peer %016llx of run \"%s\" at %s (others pass --initial-peers %s)",
           (unsigned long long)fg_hivemind_peer_id(h->peer), o->run_id,
           fg_hivemind_address(h->peer), fg_hivemind_address(h->peer));
    FG_TRY(fg_hivemind_publish(h->peer, 0, 0, false));
    if (o->min_peers > 1)
        FG_TRY(
            fg_hivemind_wait_peers(h->peer, o->min_peers, o->join_wait > 0 ? o->join_wait : 600));
    if (o->initial_peers && *o->initial_peers) {
        /* a peer that joins a live swarm starts from its state */
        double wait = o->join_wait > 0 ? o->join_wait : 3;
        if (fg_hivemind_wait_peers(h->peer, 2, wait) == FG_OK) {
            fg_status st = load_from_peers(s);
            if (st != FG_OK && st != FG_EPEER) return st;
        }
        fg_clear_error();
    }
    return serve_state(s);
}

static FG_MUST_USE fg_status collect(fg_strategy *s, bool wait, bool *stepped);

void fg__hivemind_free(fg_strategy *s) {
    fg__hivemind_state *h = s->hivemind;
    if (!h) return;
    /* the round in flight ends first (its thread uses the peer); its result
     * goes into the model, as the next step call would have put it */
    if (h->bg.running) {
        fg_error_kept keep;
        fg_error_keep(&keep);
        if (collect(s, true, NULL) != FG_OK)
            fg_log(FG_LOG_WARN, "hivemind: at shutdown: %s", fg_last_error());
        (void)fg_error_restore(&keep);
    }
    fg_hivemind_free(h->peer);
    if (h->kept && !h->model_gone) fg__module_set_wrap(s->model, NULL, NULL, 0);
    fg_free(h->acc);
    fg_free(h->gh);
    fg_free(h->state);
    fg_free(h->master);
    fg_free(h->rgrad);
    fg_free(h->bg.seg_begin);
    fg_free(h->bg.seg_lr);
    fg_free(h->bg.seg_wd);
    fg_free(h);
    s->hivemind = NULL;
}

/* A state averaging that failed after the step: this peer keeps its own
 * stepped parameters and optimizer state, one epoch together, as Hivemind
 * logs and goes on. */
static void log_state_kept(int64_t epoch, const char *why, int every) {
    fg_log(FG_LOG_WARN,
           "hivemind: epoch %lld: the state averaging failed (%s); this peer keeps its own "
           "parameters and optimizer state, stepped, and averages them again in %d epochs",
           (long long)epoch, why, every);
}

/* One global epoch's averaging and step. */
static FG_MUST_USE fg_status average_and_step(fg_strategy *s, bool *stepped) {
    fg__hivemind_state *h = s->hivemind;
    float *gd = fg_tensor_data(fg_module_flat_grads(s->model));
    float *g = h->dev ? h->gh : gd; /* the round's gradient, in host memory */
    int members = 0;
    FG_TRY(fg_hivemind_matchmake(h->peer, h->epoch, (double)h->samples, &members));
    double held = fg_hivemind_group_weight(h->peer);
    if (held < (double)h->o.target_batch_size) {
        /* a peer counted in the swarm's total is not in the group (it left,
         * or stalls): the epoch is not complete, accumulate on */
        h->declined++;
        fg_log(FG_LOG_INFO,
               "hivemind: epoch %lld: the group of %d holds %.0f samples of the %lld targeted "
               "(a counted peer is not in it): accumulating on",
               (long long)h->epoch, members, held, (long long)h->o.target_batch_size);
        return fg_hivemind_publish(h->peer, h->epoch, h->samples, false);
    }
    /* the local mean, in the model's buffer (or host staging): the
     * accumulation is taken from here on (a failure below loses it) */
    FG_TRY(local_mean(s, g));
    fg_hivemind_round r;
    FG_TRY(fg_hivemind_allreduce(h->peer, FG_HIVEMIND_GRADS, g, h->numel, (double)h->samples,
                                 h->o.grad_compression, &r));
    if (h->dev) FG_TRY(from_host(h, gd, g));
    if (h->o.scheduler_fn)
        FG_TRY(fg_optimizer_set_lr(s->opt, h->o.scheduler_fn(h->epoch, h->o.scheduler_ud)));
    FG_TRY(fg_optimizer_step(s->opt));
    h->steps_here++;
    h->rounds++;
    if (members > h->max_group) h->max_group = members;
    fg_log(FG_LOG_INFO,
           "hivemind: epoch %lld: %d peers, %d parts reduced here from %d, %.0f samples in "
           "this part (%lld of them this peer's), %zu bytes sent",
           (long long)h->epoch, members, r.contributors, r.members, r.weight, (long long)h->samples,
           r.bytes_sent);
    h->epoch++;
    int every = h->o.average_state_every > 0 ? h->o.average_state_every : 1;
    if (members > 1 && h->epoch % every == 0) {
        /* the step is taken: a failure keeps this peer's stepped state and
         * the epoch ends as any other */
        FG_TRY(gather_state(s, h->state));
        if (fg_hivemind_allreduce(h->peer, FG_HIVEMIND_STATE, h->state, state_len(h), 1.0,
                                  FG_HIVEMIND_COMPRESSION_NONE, NULL) == FG_OK) {
            FG_TRY(scatter_state(s, h->state));
        } else {
            log_state_kept(h->epoch - 1, fg_last_error(), every);
            fg_clear_error();
        }
    }
    FG_TRY(fg_optimizer_set_step_count(s->opt, h->epoch));
    fg_optimizer_zero_grad(s->opt);
    FG_TRY(acc_reset(s));
    FG_TRY(fg_hivemind_publish(h->peer, h->epoch, 0, false));
    FG_TRY(serve_state(s));
    if (stepped) *stepped = true;
    return FG_OK;
}

/* ------------------------------------------ the offloaded optimizer's round */

static int every_of(const fg__hivemind_state *h) {
    return h->o.average_state_every > 0 ? h->o.average_state_every : 1;
}

/* Hivemind's state averaging of master and the optimizer's state (weight 1
 * a member), through h->state; by the thread that owns the round. */
static FG_MUST_USE fg_status average_master_state(fg_strategy *s) {
    fg__hivemind_state *h = s->hivemind;
    memcpy(h->state, h->master, (size_t)h->numel * 4);
    for (int i = 0; i < h->nstates; i++)
        memcpy(h->state + h->numel * (1 + i), fg_tensor_data(s->opt->state[i]),
               (size_t)h->numel * 4);
    FG_TRY(fg_hivemind_allreduce(h->peer, FG_HIVEMIND_STATE, h->state, state_len(h), 1.0,
                                 FG_HIVEMIND_COMPRESSION_NONE, NULL));
    memcpy(h->master, h->state, (size_t)h->numel * 4);
    for (int i = 0; i < h->nstates; i++)
        memcpy(fg_tensor_data(s->opt->state[i]), h->state + h->numel * (1 + i),
               (size_t)h->numel * 4);
    return FG_OK;
}

static void log_round(const fg__hivemind_state *h, int64_t epoch, int members,
                      const fg_hivemind_round *r, int64_t samples) {
    fg_log(FG_LOG_INFO,
           "hivemind: epoch %lld: %d peers, %d parts reduced here from %d, %.0f samples in "
           "this part (%lld of them this peer's), %zu bytes sent",
           (long long)epoch, members, r->contributors, r->members, r->weight, (long long)samples,
           r->bytes_sent);
    (void)h;
}

/* The round's state averaging, once its step is taken: a failure is kept
 * for collect to log (the round may run in a thread of its own). */
static void round_average_state(fg_strategy *s, hm_round *b) {
    if (average_master_state(s) == FG_OK) return;
    b->state_failed = true;
    snprintf(b->state_msg, sizeof b->state_msg, "%s", fg_last_error());
    fg_clear_error();
}

/* A round's work: (with delay_grad_averaging) matchmaking and the gradient
 * all-reduce, the step of master, (with delay_state_averaging) the state
 * averaging. In the round's thread, or in the training thread when the
 * step is not delayed. */
static FG_MUST_USE fg_status round_work(fg_strategy *s) {
    fg__hivemind_state *h = s->hivemind;
    hm_round *b = &h->bg;
    if (b->grads) {
        FG_TRY(fg_hivemind_matchmake(h->peer, b->epoch, (double)b->samples, &b->members));
        if (fg_hivemind_group_weight(h->peer) < (double)h->o.target_batch_size) {
            __atomic_store_n(&b->matched, -1, __ATOMIC_RELEASE);
            return FG_OK;
        }
        __atomic_store_n(&b->matched, 1, __ATOMIC_RELEASE);
        double inv = 1.0 / (double)b->samples;
        for (int64_t i = 0; i < h->numel; i++) h->rgrad[i] = (float)(h->rgrad[i] * inv);
        FG_TRY(fg_hivemind_allreduce(h->peer, FG_HIVEMIND_GRADS, h->rgrad, h->numel,
                                     (double)b->samples, h->o.grad_compression, &b->r));
        log_round(h, b->epoch, b->members, &b->r, b->samples);
    }
    FG_TRY(fg__optimizer_step_range(&b->opt, 0, h->numel, h->master, h->rgrad));
    if (b->state && b->members > 1 && (b->epoch + 1) % every_of(h) == 0) round_average_state(s, b);
    return FG_OK;
}

static void *round_main(void *arg) {
    fg_strategy *s = arg;
    hm_round *b = &s->hivemind->bg;
    (void)fg__threads_now(); /* the kernel threads the setting allows, in this thread too */
    fg_status st = round_work(s);
    if (st != FG_OK) {
        b->err = st;
        snprintf(b->msg, sizeof b->msg, "%s", fg_last_error());
    }
    __atomic_store_n(&b->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* The round's copy of the optimizer: its lr and decay now (the training
 * thread may change the optimizer's while the round runs), its step count
 * the round's epoch, no hook; the state buffers are the optimizer's. */
static FG_MUST_USE fg_status round_optimizer(fg_strategy *s) {
    fg__hivemind_state *h = s->hivemind;
    hm_round *b = &h->bg;
    fg_optimizer *o = s->opt;
    FG_TRY(fg__optimizer_ensure_state(o));
    b->opt = *o;
    b->opt.hook = (fg__optim_hook){0};
    b->opt.steps = b->epoch;
    memcpy(b->seg_begin, o->seg_begin, (size_t)(o->nseg + 1) * sizeof *b->seg_begin);
    memcpy(b->seg_lr, o->seg_lr, (size_t)o->nseg * sizeof *b->seg_lr);
    memcpy(b->seg_wd, o->seg_wd, (size_t)o->nseg * sizeof *b->seg_wd);
    b->opt.seg_begin = b->seg_begin;
    b->opt.seg_lr = b->seg_lr;
    b->opt.seg_wd = b->seg_wd;
    return FG_OK;
}

/* Ends the round in flight if its work has ended (wait: waits for it):
 * joins its thread; a failure comes back here with what failed; a declined
 * group gives its samples back to the epoch being accumulated (which is
 * then the round's epoch again); otherwise the state averaging that is not
 * delayed, then master into the model, the step count, the served state. */
static FG_MUST_USE fg_status collect(fg_strategy *s, bool wait, bool *stepped) {
    fg__hivemind_state *h = s->hivemind;
    hm_round *b = &h->bg;
    if (!b->running || (!wait && !__atomic_load_n(&b->done, __ATOMIC_ACQUIRE))) return FG_OK;
    if (b->thread) pthread_join(b->th, NULL);
    b->thread = false;
    b->running = false;
    if (b->err != FG_OK && b->grads && b->matched == 0) {
        /* no group formed: the round's gradients, untouched, go back to
         * the epoch being accumulated, as a declined group's */
        for (int64_t i = 0; i < h->numel; i++) h->acc[i] += h->rgrad[i];
        h->samples += b->samples;
        h->epoch = b->epoch;
    }
    if (b->err != FG_OK)
        return fg_error(b->err,
                        "strategy hivemind: the round of epoch %lld (%s) failed: %s; this peer "
                        "keeps the parameters of epoch %lld",
                        (long long)b->epoch,
                        h->o.delay_optimizer_step ? "in the background, delay_optimizer_step"
                                                  : "offload_optimizer",
                        b->msg, (long long)b->epoch);
    if (b->matched < 0) {
        h->declined++;
        for (int64_t i = 0; i < h->numel; i++) h->acc[i] += h->rgrad[i];
        h->samples += b->samples;
        h->epoch = b->epoch;
        fg_log(FG_LOG_INFO,
               "hivemind: epoch %lld: the group of %d holds %.0f samples of the %lld targeted "
               "(a counted peer is not in it): accumulating on",
               (long long)b->epoch, b->members, fg_hivemind_group_weight(h->peer),
               (long long)h->o.target_batch_size);
        return fg_hivemind_publish(h->peer, h->epoch, h->samples, false);
    }
    if (!b->noted) {
        h->epoch = b->epoch + 1;
        b->noted = true;
    }
    if (!b->state && b->members > 1 && (b->epoch + 1) % every_of(h) == 0) round_average_state(s, b);
    if (b->state_failed) log_state_kept(b->epoch, b->state_msg, every_of(h));
    memcpy(fg_tensor_data(fg_module_flat_params(s->model)), h->master, (size_t)h->numel * 4);
    FG_TRY(fg_optimizer_set_step_count(s->opt, b->epoch + 1));
    h->steps_here++;
    h->rounds++;
    if (b->members > h->max_group) h->max_group = b->members;
    FG_TRY(fg_hivemind_publish(h->peer, h->epoch, h->samples, false));
    FG_TRY(serve_state(s));
    if (stepped) *stepped = true;
    return FG_OK;
}

/* Starts the round of this peer's epoch (the swarm holds the target, no
 * round in flight). Without delay_grad_averaging this thread matches and
 * averages first, as the plain step does (a declined group accumulates on);
 * then the round takes the model's parameters as master, and steps in its
 * thread (delay_optimizer_step) or here, collected at once. */
static FG_MUST_USE fg_status launch(fg_strategy *s, bool *stepped) {
    fg__hivemind_state *h = s->hivemind;
    hm_round *b = &h->bg;
    b->epoch = h->epoch;
    b->samples = h->samples;
    b->grads = h->o.delay_grad_averaging;
    b->state = h->o.delay_state_averaging;
    b->noted = false;
    b->matched = 0;
    b->done = 0;
    b->err = FG_OK;
    b->state_failed = false;
    b->members = 1;
    memset(&b->r, 0, sizeof b->r);
    if (!b->grads) {
        FG_TRY(local_mean(s, h->rgrad));
        FG_TRY(fg_hivemind_matchmake(h->peer, h->epoch, (double)h->samples, &b->members));
        double held = fg_hivemind_group_weight(h->peer);
        if (held < (double)h->o.target_batch_size) {
            h->declined++;
            fg_log(FG_LOG_INFO,
                   "hivemind: epoch %lld: the group of %d holds %.0f samples of the %lld "
                   "targeted (a counted peer is not in it): accumulating on",
                   (long long)h->epoch, b->members, held, (long long)h->o.target_batch_size);
            return fg_hivemind_publish(h->peer, h->epoch, h->samples, false);
        }
        FG_TRY(fg_hivemind_allreduce(h->peer, FG_HIVEMIND_GRADS, h->rgrad, h->numel,
                                     (double)h->samples, h->o.grad_compression, &b->r));
        log_round(h, h->epoch, b->members, &b->r, h->samples);
        b->matched = 1;
    } else { /* the sum (no reuse_grad_buffers with delay_grad_averaging) */
        memcpy(h->rgrad, h->acc, (size_t)h->numel * 4);
    }
    memcpy(h->master, fg_tensor_data(fg_module_flat_params(s->model)), (size_t)h->numel * 4);
    if (h->o.scheduler_fn)
        FG_TRY(fg_optimizer_set_lr(s->opt, h->o.scheduler_fn(h->epoch, h->o.scheduler_ud)));
    FG_TRY(round_optimizer(s));
    FG_TRY(acc_reset(s));
    if (!b->grads) {
        h->epoch++;
        b->noted = true;
        FG_TRY(fg_hivemind_publish(h->peer, h->epoch, 0, false));
    }
    b->running = true;
    if (!h->o.delay_optimizer_step) {
        (void)round_main(s);
        return collect(s, true, stepped);
    }
    if (pthread_create(&b->th, NULL, round_main, s)) {
        /* no thread: the round runs here, undelayed, rather than be lost
         * (its gradients are taken and its epoch published already) */
        fg_log(FG_LOG_WARN,
               "hivemind: epoch %lld: cannot start the round's thread; it runs in the "
               "training thread",
               (long long)b->epoch);
        (void)round_main(s);
        return collect(s, true, stepped);
    }
    b->thread = true;
    return FG_OK;
}

/* The step call with an offloaded optimizer: the round that has ended is
 * collected, this step's gradient accumulated, and a round launched when
 * the swarm holds the target (the one in flight collected first, waiting
 * for it: one at a time). A round still matching publishes for this peer;
 * when this peer alone holds the target again it waits for the match. */
static FG_MUST_USE fg_status step_offloaded(fg_strategy *s, bool *stepped) {
    fg__hivemind_state *h = s->hivemind;
    hm_round *b = &h->bg;
    FG_TRY(collect(s, false, stepped));
    FG_TRY(accumulate(s));
    if (b->running && !b->noted) {
        if (h->samples >= h->o.target_batch_size)
            while (!__atomic_load_n(&b->matched, __ATOMIC_ACQUIRE) &&
                   !__atomic_load_n(&b->done, __ATOMIC_ACQUIRE))
                nanosleep(&(struct timespec){0, 1000000}, NULL);
        int m = __atomic_load_n(&b->matched, __ATOMIC_ACQUIRE);
        if (m < 0 || (m == 0 && __atomic_load_n(&b->done, __ATOMIC_ACQUIRE)))
            FG_TRY(collect(s, true, stepped)); /* declined, or failed */
        else if (m > 0) {
            h->epoch = b->epoch + 1;
            b->noted = true;
        } else {
            return FG_OK; /* still matching: this peer's record is the round's */
        }
    }
    FG_TRY(fg_hivemind_publish(h->peer, h->epoch, h->samples, false));
    fg_hivemind_swarm sw;
    fg_hivemind_swarm_state(h->peer, &sw);
    while (h->rounds == 0 && !b->running && sw.samples >= h->o.target_batch_size &&
           sw.epoch <= h->epoch && sw.starting > 0 && fg_time() < h->first_round_wait) {
        nanosleep(&(struct timespec){0, 20000000}, NULL);
        fg_hivemind_swarm_state(h->peer, &sw);
    }
    if (sw.epoch <= h->epoch && sw.samples < h->o.target_batch_size) return FG_OK;
    if (b->running) { /* one round at a time; then the swarm is read again */
        FG_TRY(collect(s, true, stepped));
        fg_hivemind_swarm_state(h->peer, &sw);
    }
    if (sw.epoch > h->epoch) {
        fg_log(FG_LOG_INFO, "hivemind: this peer is at epoch %lld, the swarm at %lld: loading",
               (long long)h->epoch, (long long)sw.epoch);
        fg_status st = load_from_peers(s);
        if (st != FG_EPEER) return st;
        fg_clear_error();
        return FG_OK;
    }
    return sw.samples >= h->o.target_batch_size ? launch(s, stepped) : FG_OK;
}

fg_status fg__hivemind_settle(fg_strategy *s) {
    return s->hivemind ? collect(s, true, NULL) : FG_OK;
}

static FG_MUST_USE fg_status step_accumulated(fg_strategy *s, bool *stepped);

fg_status fg__hivemind_optimizer_step(fg_strategy *s, fg_optimizer *opt, bool *stepped) {
    fg__hivemind_state *h = s->hivemind;
    if (stepped) *stepped = false;
    if (opt != s->opt) return fg_optimizer_step(opt);
    /* a checkpoint restored since setup (or since a state load) holds its
     * epoch as the step count, behind or ahead of this peer's: its state is
     * this peer's now, and the swarm's decides whether it loads again */
    if (!h->bg.running && fg_optimizer_step_count(opt) != h->epoch) {
        h->epoch = fg_optimizer_step_count(opt);
        /* the accumulation starts again, but for the model's gradient
         * buffer (reuse_grad_buffers): it holds this call's gradient, and
         * the calls' since the last reset, which the restored epoch counts */
        if (h->acc) FG_TRY(acc_reset(s));
        FG_TRY(serve_state(s));
    }
    if (!h->started) {
        /* this peer's epoch is final now: say so (a swarm that restarts goes
         * on from the newest checkpoint: see the first round's wait below) */
        h->started = true;
        h->first_round_wait =
            fg_time() + (h->o.averaging_timeout > 0 ? h->o.averaging_timeout : 30);
        FG_TRY(fg_hivemind_publish(h->peer, h->epoch, 0, false));
        FG_TRY(fg_hivemind_started(h->peer));
    }
    int64_t bs = h->o.batch_size;
    /* this peer's pace (what its forward and backward take), for the others'
     * matchmaking: the shortest of the last 8 times between step calls, so
     * that a validation or a checkpoint between two steps does not make it
     * look slow, and a peer slow at every step does */
    double now = fg_time();
    if (h->left_at > 0) {
        h->gaps[h->ngaps++ % 8] = now - h->left_at;
        double m = h->gaps[0];
        for (int i = 1; i < 8 && i < h->ngaps; i++) m = h->gaps[i] < m ? h->gaps[i] : m;
        fg_hivemind_set_pace(h->peer, m, (double)bs);
    }
    fg_status st = h->offload ? step_offloaded(s, stepped) : step_accumulated(s, stepped);
    h->left_at = fg_time();
    return st;
}

/* The rest of fg__hivemind_optimizer_step: this step's gradient into the
 * accumulator, then a round if the swarm holds the target. */
static FG_MUST_USE fg_status step_accumulated(fg_strategy *s, bool *stepped) {
    fg__hivemind_state *h = s->hivemind;
    FG_TRY(accumulate(s));
    FG_TRY(fg_hivemind_publish(h->peer, h->epoch, h->samples, false));
    fg_hivemind_swarm sw;
    fg_hivemind_swarm_state(h->peer, &sw);
    /* the first round waits (at most averaging_timeout) for the peers still
     * starting: a checkpoint restored into one may hold a newer epoch */
    while (h->rounds == 0 && sw.samples >= h->o.target_batch_size && sw.epoch <= h->epoch &&
           sw.starting > 0 && fg_time() < h->first_round_wait) {
        nanosleep(&(struct timespec){0, 20000000}, NULL);
        fg_hivemind_swarm_state(h->peer, &sw);
    }
    if (sw.epoch > h->epoch) {
        fg_log(FG_LOG_INFO, "hivemind: this peer is at epoch %lld, the swarm at %lld: loading",
               (long long)h->epoch, (long long)sw.epoch);
        fg_status st = load_from_peers(s);
        if (st != FG_EPEER) return st;
        fg_clear_error();
    } else if (sw.samples >= h->o.target_batch_size) {
        return average_and_step(s, stepped);
    }
    /* not stepping: the trainer's zero_grad must not lose the accumulation */
    return FG_OK;
}

int64_t fg__hivemind_epoch(const fg_strategy *s) { return s->hivemind ? s->hivemind->epoch : -1; }

const char *fg__hivemind_address(const fg_strategy *s) {
    return s->hivemind ? fg_hivemind_address(s->hivemind->peer) : "";
}

fg_hivemind *fg__hivemind_peer(const fg_strategy *s) {
    return s->hivemind ? s->hivemind->peer : NULL;
}

void fg__hivemind_counts(const fg_strategy *s, int64_t *rounds, int64_t *loads, int *max_group) {
    const fg__hivemind_state *h = s->hivemind;
    *rounds = h ? h->rounds : 0;
    *loads = h ? h->loads : 0;
    *max_group = h ? h->max_group : 0;
}
