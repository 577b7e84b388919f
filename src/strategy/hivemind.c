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
 * global epoch. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "strategy_impl.h"

struct fg__hivemind_state {
    fg_hivemind_strategy_opts o;
    fg_hivemind *peer;
    float *acc;      /* the gradient accumulated, times samples (NULL: in the grad buffer) */
    fg_dev *dev;     /* the model's device when the host cannot read it (else NULL) */
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
    bool started; /* has taken its first optimizer step call */
};

/* numel f32 values of a buffer of the model's device to host memory, and
 * back (a plain copy on the host) */
static fg_status to_host(const fg__hivemind_state *h, float *dst, const float *src) {
    if (!h->dev) return memcpy(dst, src, (size_t)h->numel * 4), FG_OK;
    return fg_dev_copy_d2h(h->dev, dst, src, (size_t)h->numel * 4);
}
static fg_status from_host(const fg__hivemind_state *h, float *dst, const float *src) {
    if (!h->dev) return memcpy(dst, src, (size_t)h->numel * 4), FG_OK;
    return fg_dev_copy_h2d(h->dev, dst, src, (size_t)h->numel * 4);
}

/* The state layout: parameters, then each optimizer state buffer (numel
 * f32 each); its size in values. */
static int64_t state_len(const fg__hivemind_state *h) { return h->numel * (1 + h->nstates); }

static fg_status gather_state(fg_strategy *s, float *out) {
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

static fg_status scatter_state(fg_strategy *s, const float *in) {
    fg__hivemind_state *h = s->hivemind;
    FG_TRY(from_host(h, fg_tensor_data(fg_module_flat_params(s->model)), in));
    for (int i = 0; i < h->nstates; i++)
        FG_TRY(
            from_host(h, fg_tensor_data(fg_optimizer_state(s->opt, i)), in + h->numel * (1 + i)));
    return FG_OK;
}

static fg_status serve_state(fg_strategy *s) {
    fg__hivemind_state *h = s->hivemind;
    FG_TRY(gather_state(s, h->state));
    return fg_hivemind_set_state(h->peer, h->epoch, h->state, (size_t)state_len(h) * 4);
}

/* load_state_from_peers: parameters, optimizer state and epoch. */
static fg_status load_from_peers(fg_strategy *s) {
    fg__hivemind_state *h = s->hivemind;
    int64_t epoch;
    FG_TRY(fg_hivemind_load_state(h->peer, h->state, (size_t)state_len(h) * 4, &epoch));
    FG_TRY(scatter_state(s, h->state));
    h->epoch = epoch;
    h->samples = 0;
    memset(h->acc, 0, (size_t)h->numel * 4);
    h->loads++;
    FG_TRY(fg_optimizer_set_step_count(s->opt, epoch));
    fg_log(FG_LOG_INFO, "hivemind: loaded the state of epoch %lld from a peer", (long long)epoch);
    return fg_hivemind_publish(h->peer, h->epoch, 0, false);
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
    if (o->reuse_grad_buffers)
        return fg_error(FG_EUNSUPPORTED,
                        "strategy hivemind: reuse_grad_buffers is not built: the fabric and the "
                        "Trainer zero the gradient after each step, so the accumulation keeps a "
                        "buffer of its own; leave it false");
    if (o->delay_state_averaging || o->delay_optimizer_step || o->delay_grad_averaging)
        return fg_error(FG_EUNSUPPORTED,
                        "strategy hivemind: delay_%s is not built: this fulgur averages and "
                        "steps in the training thread; leave it false",
                        o->delay_state_averaging  ? "state_averaging"
                        : o->delay_optimizer_step ? "optimizer_step"
                                                  : "grad_averaging");
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
    if (!(h->acc = fg_calloc((size_t)h->numel, 4))) return fg_last_status();
    if (h->dev && !(h->gh = fg_alloc((size_t)h->numel * 4))) return fg_last_status();
    if (!(h->state = fg_alloc((size_t)state_len(h) * 4))) return fg_last_status();
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

void fg__hivemind_free(fg_strategy *s) {
    fg__hivemind_state *h = s->hivemind;
    if (!h) return;
    fg_hivemind_free(h->peer);
    fg_free(h->acc);
    fg_free(h->gh);
    fg_free(h->state);
    fg_free(h);
    s->hivemind = NULL;
}

/* One global epoch's averaging and step. */
static fg_status average_and_step(fg_strategy *s, bool *stepped) {
    fg__hivemind_state *h = s->hivemind;
    float *gd = fg_tensor_data(fg_module_flat_grads(s->model));
    float *g = h->dev ? h->gh : gd; /* the round's gradient, in host memory */
    const float *acc = h->acc;
    double inv = 1.0 / (double)h->samples;
    for (int64_t i = 0; i < h->numel; i++) g[i] = (float)(acc[i] * inv); /* the local mean */
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
        FG_TRY(gather_state(s, h->state));
        FG_TRY(fg_hivemind_allreduce(h->peer, FG_HIVEMIND_STATE, h->state, state_len(h), 1.0,
                                     FG_HIVEMIND_COMPRESSION_NONE, NULL));
        FG_TRY(scatter_state(s, h->state));
    }
    FG_TRY(fg_optimizer_set_step_count(s->opt, h->epoch));
    h->samples = 0;
    memset(h->acc, 0, (size_t)h->numel * 4);
    fg_optimizer_zero_grad(s->opt);
    FG_TRY(fg_hivemind_publish(h->peer, h->epoch, 0, false));
    FG_TRY(serve_state(s));
    if (stepped) *stepped = true;
    return FG_OK;
}

static fg_status step_accumulated(fg_strategy *s, bool *stepped);

fg_status fg__hivemind_optimizer_step(fg_strategy *s, fg_optimizer *opt, bool *stepped) {
    fg__hivemind_state *h = s->hivemind;
    if (stepped) *stepped = false;
    if (opt != s->opt) return fg_optimizer_step(opt);
    /* a checkpoint restored since setup (or since a state load) holds its
     * epoch as the step count, behind or ahead of this peer's: its state is
     * this peer's now, and the swarm's decides whether it loads again */
    if (fg_optimizer_step_count(opt) != h->epoch) {
        h->epoch = fg_optimizer_step_count(opt);
        h->samples = 0;
        memset(h->acc, 0, (size_t)h->numel * 4);
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
    fg_status st = step_accumulated(s, stepped);
    h->left_at = fg_time();
    return st;
}

/* The rest of fg__hivemind_optimizer_step: this step's gradient into the
 * accumulator, then a round if the swarm holds the target. */
static fg_status step_accumulated(fg_strategy *s, bool *stepped) {
    fg__hivemind_state *h = s->hivemind;
    float *g = fg_tensor_data(fg_module_flat_grads(s->model));
    if (h->dev) {
        FG_TRY(to_host(h, h->gh, g));
        g = h->gh;
    }
    int64_t bs = h->o.batch_size;
    for (int64_t i = 0; i < h->numel; i++) h->acc[i] += (float)bs * g[i];
    h->samples += bs;
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
