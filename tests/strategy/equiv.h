/* The strategy-equivalence engine: one table of cases, one way to run them.
 *
 * A case names a strategy kind with its options, the world size, the steps,
 * the per-rank batch, the micro-batches of a step, the model and optimizer
 * (the tiny GPT and MLP of tests/fixtures.h, their global batch a function
 * of (step, row)), clipping, and what it must equal:
 *   EQ_VS_SINGLE  one process trained on the whole global batch (world x
 *                 batch rows a step), within `tol` (DDP's promise: the same
 *                 mean gradient, another order of sums);
 *   EQ_VS_DDP     ddp on the same ranks with the same batches: bitwise when
 *                 `tol` is 0 (the sharded kinds' promise on the shm backend,
 *                 which reduces every element in rank order), else within tol;
 *   EQ_VS_PLAIN   the same row made plain by its hook (offload off): bitwise,
 *                 the optimizer states too.
 * What a strategy's test adds to a row (its memory, its bytes, its files)
 * goes through the row's hooks (eq_hooks), in the parent and in the ranks;
 * the tests test_strategy_{horovod,offload,poffload,zero3,bagua,hooks}.c
 * beside this file are such rows.
 * eq_run forks the ranks (shm backend, one thread each), trains, brings
 * rank 0's parameters back and compares; every rank must end with rank 0's
 * bits, and under a sharded kind each rank must hold the optimizer state of
 * its shard only (the shards tiling the parameters, each about 1/world).
 *
 * The device column: `device` (NULL: "cpu") is where the ranks train.
 * eq_place is the one place that puts a rank's model and optimizer there;
 * for anything but the CPU it says FG_EUNSUPPORTED and the case is skipped,
 * naming the device, until the device stack runs the strategies (then a case
 * with the device and EQ_VS_... of the CPU's run is one more table row). */
#ifndef FULGUR_TEST_STRATEGY_EQUIV_H
#define FULGUR_TEST_STRATEGY_EQUIV_H

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fixtures.h"
#include "fulgur/nn.h"
#include "fulgur/optim.h"
#include "fulgur/strategy.h"
#include "harness.h"
#include "mp/mp_join.h"

/* the tiny MLP and GPT of fixtures.h, or wider ones whose shards span
 * whole pages (12 -> 128 -> 128 -> 128 -> 5; 3 blocks of 32): the same
 * data */
typedef enum eq_model {
    EQ_MLP,
    EQ_GPT,
    EQ_MLP_WIDE,
    EQ_GPT_WIDE,
    EQ_MLP_DEEP, /* 12 -> 7 x 128 -> 5: two units in use well below half the model */
    EQ_GPT_DEEP  /* 8 blocks of 32, vocabulary 33 */
} eq_model;

/* the optimizer: SGD with momentum, AdamW, or one of the others (each with
 * non-default options, so that every state element matters) */
typedef enum eq_opt {
    EQ_SGD,
    EQ_ADAMW,
    EQ_ADAM_AMSGRAD,
    EQ_RMSPROP_CENTERED,
    EQ_ADAGRAD,
    EQ_LION,
    EQ_ADAM_GROUPS /* two groups, no decay on biases, norms and embeddings */
} eq_opt;

/* EQ_VS_PLAIN: the same case made plain by its `plain` hook (offload off,
 * say): bitwise when tol is 0, the optimizer states too with `state` */
typedef enum eq_ref { EQ_VS_SINGLE, EQ_VS_DDP, EQ_VS_PLAIN } eq_ref;

struct eq_result;
typedef struct eq_case eq_case;

/* where rank_sample runs: after the strategy's setup, after each forward,
 * after each optimizer step */
typedef enum eq_point { EQ_AT_SETUP, EQ_AT_FORWARD, EQ_AT_STEP } eq_point;

/* What a case adds to the engine (each NULL: nothing). In the parent:
 * `before` on the case's copy before its ranks start (a folder to make),
 * `check` after both runs (the case's own assertions), `after` at the end
 * (the folder to remove); `plain` makes the reference of EQ_VS_PLAIN from
 * the case. In each rank: `rank_setup` first (the environment, limits),
 * `rank_sample` at each eq_point, `rank_done` after the last step (the
 * strategy still up, parameters not gathered), `rank_end` after strategy
 * and optimizer were freed (the model still there). A rank's figures go to
 * r->extra[rank]. The rank hooks run in the reference's ranks too. */
typedef struct eq_hooks {
    void (*before)(eq_case *c);
    void (*plain)(eq_case *c);
    void (*check)(const eq_case *c, const struct eq_result *got, const struct eq_result *ref);
    void (*after)(const eq_case *c);
    void (*rank_setup)(const eq_case *c, int rank);
    void (*rank_sample)(const eq_case *c, int rank, eq_point at, fg_module *m, struct eq_result *r);
    void (*rank_done)(const eq_case *c, int rank, fg_strategy *st, fg_module *m, fg_optimizer *o,
                      struct eq_result *r);
    void (*rank_end)(const eq_case *c, int rank, fg_module *m, struct eq_result *r);
} eq_hooks;

struct eq_case {
    const char *name;
    fg_strategy_kind kind;
    fg_ddp_opts ddp;               /* for ddp (the reference of EQ_VS_DDP runs with zeros) */
    fg_sharded_opts sharded;       /* for the sharded kinds; with these three: */
    fg_sharding_strategy sharding; /* fsdp's */
    int64_t reduce, gather;        /* reduce_bucket_size, allgather_bucket_size (elements) */
    int world;
    int steps;     /* 0 = 8 */
    int64_t batch; /* rows per rank per step */
    int accum;     /* micro-batches per step (no sync before the last); 0 = 1 */
    eq_model model;
    eq_opt opt;
    double lr;   /* 0 = the optimizer's learning rate below */
    double clip; /* max_norm; 0 = off (with EQ_VS_DDP: checked to clip at least once) */
    eq_ref ref;
    double tol;         /* largest |difference| over the largest |parameter|; 0 = bitwise */
    const char *device; /* NULL = "cpu" */
    /* the engine's options: */
    bool state;       /* bring every rank's optimizer state back (EQ_VS_PLAIN compares it) */
    bool opt_first;   /* free the optimizer before the strategy */
    bool setup_fails; /* every rank's setup must fail (`check` reads r->err) */
    bool empty_init;  /* the model made under fg_module_set_empty_init */
    int64_t expect;   /* a figure the case's check reads */
    const char *dir;  /* a folder `before` made (nvme_path), for check and after */
    const eq_hooks *hooks;
};

/* A world of 1 runs without a communicator (kind FG_STRATEGY_SINGLE). */
#define EQ_MAX_RANKS 8
#define EQ_MAX_STATES 3

/* What a run brings back (a shared mapping: the ranks write it). */
typedef struct eq_result {
    char job[80];
    int64_t numel;
    double max_norm; /* rank 0's largest gradient norm before clipping */
    int64_t state_numel[EQ_MAX_RANKS];
    int64_t range[EQ_MAX_RANKS][2];
    bool sharded;
    bool unsupported; /* eq_place refused the device */
    char why[256];
    int nstates;
    int64_t extra[EQ_MAX_RANKS][6]; /* the hooks' figures */
    bool setup_failed[EQ_MAX_RANKS];
    char err[EQ_MAX_RANKS][512]; /* a failed setup's message */
    float *state;                /* [EQ_MAX_STATES][numel]: each rank writes its range */
    float params[];              /* rank 0's parameters after the last step */
} eq_result;

static inline fg_module *eq_model_new(const eq_case *c) {
    switch (c->model) {
    case EQ_GPT: return fx_tiny_gpt(5);
    case EQ_MLP_WIDE:
        return fg_mlp_new(&(fg_mlp_config){.sizes = {FX_MLP_IN, 128, 128, 128, 5}, .seed = 5});
    case EQ_GPT_WIDE:
        return fg_gpt_new(&(fg_gpt_config){.vocab = FX_GPT_VOCAB,
                                           .ctx = FX_GPT_CTX,
                                           .layers = 3,
                                           .heads = 2,
                                           .embd = 32,
                                           .seed = 5});
    case EQ_MLP_DEEP:
        return fg_mlp_new(&(fg_mlp_config){
            .sizes = {FX_MLP_IN, 128, 128, 128, 128, 128, 128, 128, 5}, .nlayers = 8, .seed = 5});
    case EQ_GPT_DEEP:
        return fg_gpt_new(&(fg_gpt_config){
            .vocab = 33, .ctx = FX_GPT_CTX, .layers = 8, .heads = 2, .embd = 32, .seed = 5});
    case EQ_MLP: break;
    }
    return fx_tiny_mlp(5);
}

static inline bool eq_gpt(const eq_case *c) {
    return c->model == EQ_GPT || c->model == EQ_GPT_WIDE || c->model == EQ_GPT_DEEP;
}

static inline fg_optimizer *eq_opt_new(const eq_case *c, fg_module *m) {
    switch (c->opt) {
    case EQ_ADAMW:
        return fg_adamw_new(m, &(fg_adamw_opts){.lr = c->lr ? c->lr : 1e-2, .weight_decay = 0.1});
    case EQ_ADAM_AMSGRAD:
        return fg_adam_new(m, &(fg_adam_opts){.lr = 1e-2, .weight_decay = 0.05, .amsgrad = true});
    case EQ_RMSPROP_CENTERED:
        return fg_rmsprop_new(
            m, &(fg_rmsprop_opts){
                   .lr = 1e-3, .momentum = 0.5, .weight_decay = 1e-3, .centered = true});
    case EQ_ADAGRAD:
        return fg_adagrad_new(
            m, &(fg_adagrad_opts){.lr = 0.05, .lr_decay = 0.01, .initial_accumulator_value = 0.1});
    case EQ_LION: return fg_lion_new(m, &(fg_lion_opts){.lr = 1e-3, .weight_decay = 0.1});
    case EQ_ADAM_GROUPS: {
        fg_optimizer *o = fg_adam_new(m, &(fg_adam_opts){.lr = 1e-2, .weight_decay = 0.05});
        if (o &&
            (fg_optimizer_add_param_group(
                 o, &(fg_param_group){.params = "*.1.*", .lr = 3e-2, .weight_decay = 0.2}) < 0 ||
             fg_optimizer_no_decay_bias_norm_embedding(o, NULL) != FG_OK)) {
            fg_optimizer_free(o);
            return NULL;
        }
        return o;
    }
    case EQ_SGD: break;
    }
    return fg_sgd_new(
        m, &(fg_sgd_opts){.lr = c->lr ? c->lr : 0.05, .momentum = 0.9, .weight_decay = 1e-3});
}

/* Puts a rank's model and optimizer on `device`: the CPU is where they are
 * made. The device column's one hook. */
static inline fg_status eq_place(const char *device, fg_module *m, fg_optimizer *o) {
    (void)m;
    (void)o;
    if (!device || !strcmp(device, "cpu")) return FG_OK;
    return FG_EUNSUPPORTED;
}

static inline int eq_steps(const eq_case *c) { return c->steps ? c->steps : 8; }

static inline fg_tensor *eq_loss(fg_module *m, fg_tensor *x, fg_tensor *y) {
    return fg_cross_entropy(fg_module_forward(m, x), y, -100);
}

typedef struct eq_job {
    eq_case c;
    eq_result *r;
} eq_job;

static int eq_rank(int rank, int n, void *arg) {
    eq_job *j = arg;
    const eq_case *c = &j->c;
    eq_result *r = j->r;
    const eq_hooks *h = c->hooks;
    fg_comm *comm = n > 1 ? mp_join_shm(rank, n, r->job, 60) : NULL;
    if (n > 1 && !comm) return 1;
    CHECK_OK(fg_set_num_threads(1));
    if (h && h->rank_setup) h->rank_setup(c, rank);
    bool was = fg_module_set_empty_init(c->empty_init);
    fg_module *m = eq_model_new(c);
    fg_module_set_empty_init(was);
    /* other initial weights on ranks 1..: setup must broadcast rank 0's
     * (under empty init nothing exists before setup) */
    if (rank && !c->empty_init) CHECK_OK(fg_tensor_fill(fg_module_flat_params(m), 0.25 * rank));
    fg_optimizer *o = eq_opt_new(c, m);
    fg_status placed = eq_place(c->device, m, o);
    if (placed != FG_OK) {
        if (rank == 0) {
            r->unsupported = true;
            snprintf(r->why, sizeof r->why, "device %s: %s", c->device, fg_status_str(placed));
        }
        fg_optimizer_free(o);
        fg_module_free(m);
        fg_comm_free(comm);
        return 0;
    }
    bool sharded = fg_strategy_kind_is_sharded(c->kind), single = c->kind == FG_STRATEGY_SINGLE;
    fg_sharded_opts so = c->sharded;
    so.sharding_strategy = c->sharding;
    so.reduce_bucket_size = c->reduce;
    so.allgather_bucket_size = c->gather;
    fg_strategy *st = fg_strategy_new(c->kind, comm, m, o, sharded || single ? NULL : &c->ddp,
                                      sharded || single ? &so : NULL, 0);
    if (!st) {
        r->setup_failed[rank] = true;
        snprintf(r->err[rank], sizeof r->err[rank], "%s", fg_last_error());
        if (!c->setup_fails) fprintf(stderr, "  %s rank %d: %s\n", c->name, rank, fg_last_error());
        fg_optimizer_free(o);
        fg_module_free(m);
        fg_comm_free(comm);
        return c->setup_fails ? 0 : 1;
    }
    if (h && h->rank_sample) h->rank_sample(c, rank, EQ_AT_SETUP, m, r);
    int accum = c->accum ? c->accum : 1;
    int64_t micro = c->batch / accum;
    int bad = 0;
    for (int step = 0; step < eq_steps(c) && !bad; step++) {
        fg_optimizer_zero_grad(o);
        for (int k = 0; k < accum && !bad; k++) {
            fg_tensor *x, *y;
            fx_batch_rows(eq_gpt(c), step, rank * c->batch + k * micro, micro, &x, &y);
            fg_tensor *out = fg_module_forward(m, x);
            if (h && h->rank_sample) h->rank_sample(c, rank, EQ_AT_FORWARD, m, r);
            fg_tensor *l = fg_cross_entropy(out, y, -100);
            if (accum > 1) l = fg_scale(l, 1.0 / accum);
            fg_strategy_set_sync(st, k == accum - 1);
            bad |= fg_strategy_backward(st, l) != FG_OK;
        }
        double norm = 0;
        if (!bad && c->clip > 0) bad |= fg_strategy_clip_grad_norm(st, c->clip, &norm) != FG_OK;
        if (rank == 0 && norm > r->max_norm) r->max_norm = norm;
        if (!bad) bad |= fg_optimizer_step(o) != FG_OK;
        if (h && h->rank_sample) h->rank_sample(c, rank, EQ_AT_STEP, m, r);
        if (bad)
            fprintf(stderr, "  %s rank %d step %d: %s\n", c->name, rank, step, fg_last_error());
        fg_step_reset();
    }
    if (h && h->rank_done) h->rank_done(c, rank, st, m, o, r);
    fg_tensor *flat = fg_module_flat_params(m);
    int64_t cnt = fg_tensor_numel(flat);
    /* stage 3: each rank holds its shard; the whole model for the reading */
    bool gathered = fg_strategy_shards_params(st);
    if (gathered) bad |= fg_strategy_gather_params(st) != FG_OK;
    if (rank == 0) memcpy(r->params, fg_tensor_data(flat), sizeof(float) * (size_t)cnt);
    if (comm) bad |= mp_differs_from_rank0(comm, rank, fg_tensor_data(flat), cnt);
    if (gathered) bad |= fg_strategy_release_params(st) != FG_OK;
    r->sharded = fg_strategy_is_sharded(st);
    r->state_numel[rank] =
        fg_optimizer_num_states(o) ? fg_tensor_numel(fg_optimizer_state(o, 0)) : -1;
    fg_optimizer_state_range(o, &r->range[rank][0], &r->range[rank][1]);
    r->nstates = fg_optimizer_num_states(o);
    if (c->state && r->state)
        for (int i = 0; i < r->nstates && i < EQ_MAX_STATES; i++)
            memcpy(r->state + (size_t)i * (size_t)r->numel + r->range[rank][0],
                   fg_tensor_data(fg_optimizer_state(o, i)),
                   sizeof(float) * (size_t)(r->range[rank][1] - r->range[rank][0]));
    if (c->opt_first) {
        fg_optimizer_free(o);
        fg_strategy_free(st);
    } else {
        fg_strategy_free(st);
        fg_optimizer_free(o);
    }
    if (h && h->rank_end) h->rank_end(c, rank, m, r);
    fg_module_free(m);
    fg_comm_free(comm);
    return bad;
}

static inline int64_t eq_numel(const eq_case *c) {
    fg_module *m = eq_model_new(c);
    int64_t n = fg_module_numel(m);
    fg_module_free(m);
    return n;
}

/* the parameters, then room for the optimizer states */
static inline size_t eq_result_bytes(int64_t numel) {
    return sizeof(eq_result) + sizeof(float) * (size_t)numel * (1 + EQ_MAX_STATES);
}

static inline eq_result *eq_result_new(int64_t numel) {
    eq_result *r = mmap(NULL, eq_result_bytes(numel), PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED) return NULL;
    r->numel = numel;
    r->state = r->params + numel;
    return r;
}

/* dst's copy of src (the same numel), its state pointer its own */
static inline void eq_result_copy(eq_result *dst, const eq_result *src) {
    memcpy(dst, src, eq_result_bytes(src->numel));
    dst->state = dst->params + dst->numel;
}

static inline void eq_result_free(eq_result *r) {
    if (r) munmap(r, eq_result_bytes(r->numel));
}

/* Runs c on c->world forked ranks into r; false (said) when a rank failed. */
static inline bool eq_fork(const eq_case *c, eq_result *r, const char *tag) {
    static int serial;
    snprintf(r->job, sizeof r->job, "t-eq-%d-%d-%s", getpid(), serial++, tag);
    eq_job j = {*c, r};
    int failed = fg_test_fork_ranks(c->world, eq_rank, &j, 120);
    CHECK_MSG(failed == 0, "%s (%s, %d ranks): %d ranks failed", c->name,
              fg_strategy_kind_name(c->kind), c->world, failed);
    return failed == 0;
}

/* One process on the whole global batch, the same steps: the reference of
 * EQ_VS_SINGLE, into r->params (no clipping: a case that clips compares
 * with ddp). */
static inline bool eq_single(const eq_case *c, eq_result *r) {
    bool was = fg_module_set_empty_init(c->empty_init);
    fg_module *m = eq_model_new(c);
    fg_module_set_empty_init(was);
    fg_optimizer *o = eq_opt_new(c, m);
    bool ok = m && o;
    for (int step = 0; step < eq_steps(c) && ok; step++) {
        fg_optimizer_zero_grad(o);
        fg_tensor *x, *y;
        fx_batch_rows(eq_gpt(c), step, 0, c->world * c->batch, &x, &y);
        ok = fg_backward(eq_loss(m, x, y)) == FG_OK && fg_optimizer_step(o) == FG_OK;
        fg_step_reset();
    }
    CHECK_MSG(ok, "%s: the one-process run failed: %s", c->name, fg_last_error());
    if (ok)
        memcpy(r->params, fg_tensor_data(fg_module_flat_params(m)),
               sizeof(float) * (size_t)r->numel);
    fg_optimizer_free(o);
    fg_module_free(m);
    return ok;
}

/* Largest |a - b| over the largest |b|. */
static inline double eq_rel_diff(const float *a, const float *b, int64_t n) {
    double d = 0, mx = 0;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        mx = fmax(mx, fabs((double)b[i]));
    }
    return d / (mx > 0 ? mx : 1);
}

/* Each rank holds its shard's optimizer state only: 1/g of the elements up
 * to a 64-byte line (16 f32), the shards of each group of g ranks tiling
 * the vector (g: the world, or HYBRID_SHARD's shard group size). */
static inline void eq_check_shards(const eq_case *c, const eq_result *r) {
    int g = c->sharding == FG_SHARDING_HYBRID_SHARD && c->sharded.hybrid_shard_size > 0
                ? c->sharded.hybrid_shard_size
                : c->world;
    int64_t line = 16, numel = r->numel;
    int64_t fair = ((numel + line - 1) / line + g - 1) / g * line;
    for (int k0 = 0; k0 < c->world; k0 += g) {
        int64_t sum = 0;
        for (int k = k0; k < k0 + g && k < c->world; k++) {
            int64_t mine = r->range[k][1] - r->range[k][0];
            CHECK_MSG(r->state_numel[k] == mine,
                      "%s rank %d: state of %lld elements, range of %lld", c->name, k,
                      (long long)r->state_numel[k], (long long)mine);
            CHECK_MSG(mine <= fair && mine >= fair - line,
                      "%s rank %d holds %lld state elements; 1/%d of %lld is about %lld", c->name,
                      k, (long long)mine, g, (long long)numel, (long long)(numel / g));
            CHECK(r->range[k][0] == sum);
            sum += mine;
        }
        CHECK_MSG(sum == numel, "%s: the shards of ranks %d.. cover %lld of %lld elements", c->name,
                  k0, (long long)sum, (long long)numel);
    }
}

/* The reference of EQ_VS_DDP depends on these only: consecutive cases that
 * share them (one setup under each sharded kind) share one ddp run. */
static inline bool eq_same_ddp(const eq_case *a, const eq_case *b) {
    return a->world == b->world && eq_steps(a) == eq_steps(b) && a->batch == b->batch &&
           (a->accum ? a->accum : 1) == (b->accum ? b->accum : 1) && a->model == b->model &&
           a->opt == b->opt && a->lr == b->lr && a->clip == b->clip &&
           a->empty_init == b->empty_init && a->hooks == b->hooks;
}

static eq_case eq_ddp_key_;
static eq_result *eq_ddp_ref_;

/* Bitwise equality of n floats, or the first index that differs (said). */
static inline bool eq_bitwise(const eq_case *c, const char *what, const float *got,
                              const float *want, int64_t n) {
    int64_t first = -1;
    for (int64_t i = 0; i < n && first < 0; i++)
        if (memcmp(&got[i], &want[i], sizeof(float))) first = i;
    CHECK_MSG(first < 0,
              "%s (%s, %d ranks): %s %lld is %.9g, the reference's %.9g (bitwise expected)",
              c->name, fg_strategy_kind_name(c->kind), c->world, what, (long long)first,
              first < 0 ? 0 : got[first], first < 0 ? 0 : want[first]);
    return first < 0;
}

/* The reference of c into want; false (said) when it could not run. */
static inline bool eq_reference(const eq_case *c, eq_result *want) {
    int64_t numel = want->numel;
    if (c->ref == EQ_VS_SINGLE) return eq_single(c, want);
    if (c->ref == EQ_VS_PLAIN) {
        eq_case p = *c; /* its rank hooks run too: the figures of both */
        p.dir = NULL;
        if (c->hooks && c->hooks->plain) c->hooks->plain(&p);
        return eq_fork(&p, want, "plain");
    }
    if (eq_ddp_ref_ && eq_ddp_ref_->numel == numel && eq_same_ddp(&eq_ddp_key_, c)) {
        eq_result_copy(want, eq_ddp_ref_);
        return true;
    }
    eq_case d = *c;
    d.kind = FG_STRATEGY_DDP;
    d.ddp = (fg_ddp_opts){0};
    d.state = false;
    d.device = NULL; /* ddp on the CPU: the one reference of every column */
    bool ok = eq_fork(&d, want, "ddp");
    if (ok && c->clip > 0)
        CHECK_MSG(want->max_norm > c->clip, "%s: clip %g never clipped (norm %g)", c->name, c->clip,
                  want->max_norm);
    if (ok)
        for (int k = 0; k < c->world; k++) CHECK(want->state_numel[k] == numel);
    eq_result_free(eq_ddp_ref_);
    eq_ddp_ref_ = NULL;
    if (ok && (eq_ddp_ref_ = eq_result_new(numel)) != NULL) {
        eq_result_copy(eq_ddp_ref_, want);
        eq_ddp_key_ = *c;
    }
    return ok;
}

/* Runs one case and its reference and checks what the case promises.
 * Returns false when it was skipped (the device). */
static inline bool eq_run(const eq_case *case_) {
    eq_case cc = *case_, *c = &cc;
    const eq_hooks *h = c->hooks;
    if (h && h->before) h->before(c);
    int64_t numel = eq_numel(c);
    eq_result *got = eq_result_new(numel), *want = eq_result_new(numel);
    bool ran = true;
    if (!got || !want) {
        CHECK_MSG(0, "%s: no shared memory for the results", c->name);
    } else if (c->setup_fails) {
        if (eq_fork(c, got, "case"))
            for (int k = 0; k < c->world; k++)
                CHECK_MSG(got->setup_failed[k], "%s: rank %d set up", c->name, k);
        if (h && h->check) h->check(c, got, NULL);
    } else if (eq_fork(c, got, "case") && !got->unsupported) {
        bool ref_ok = eq_reference(c, want);
        if (ref_ok && c->tol == 0) {
            eq_bitwise(c, "parameter", got->params, want->params, numel);
            if (c->state) {
                CHECK(got->nstates == want->nstates);
                for (int i = 0; i < got->nstates && i < EQ_MAX_STATES; i++)
                    eq_bitwise(c, "optimizer state element", got->state + (size_t)i * numel,
                               want->state + (size_t)i * numel, numel);
            }
        } else if (ref_ok) {
            double e = eq_rel_diff(got->params, want->params, numel);
            CHECK_MSG(e <= c->tol, "%s (%s, %d ranks): %.3g from the reference (relative; tol %g)",
                      c->name, fg_strategy_kind_name(c->kind), c->world, e, c->tol);
        }
        if (got->sharded) eq_check_shards(c, got);
        if (ref_ok && h && h->check) h->check(c, got, want);
    }
    if (got && got->unsupported) {
        fprintf(stderr, "  %s: skipped: %s\n", c->name, got->why);
        ran = false;
    }
    if (h && h->after) h->after(c);
    eq_result_free(got);
    eq_result_free(want);
    return ran;
}

/* Runs every case of a table whose name contains `filter` (NULL: all);
 * skips the test (saying why) when every case was skipped. */
static inline void eq_run_table(const eq_case *cases, size_t n, const char *filter) {
    size_t ran = 0, tried = 0;
    for (size_t i = 0; i < n; i++) {
        if (filter && !strstr(cases[i].name, filter)) continue;
        tried++;
        double t0 = fg_time();
        if (eq_run(&cases[i])) ran++;
        printf("  case %-40s %d ranks %.2f s\n", cases[i].name, cases[i].world, fg_time() - t0);
    }
    if (tried && !ran) SKIP("every case was skipped (their devices)");
}

#endif
