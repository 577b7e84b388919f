/* Private header of the optim layer: the optimizer struct, its vtable, and
 * the range entry the sharded strategies (ZeRO) step with.
 *
 * Invariants: param/grad point at the module's flat buffers (numel elements
 * of dtype dt); each state tensor holds elements [state_begin, state_end)
 * of the same layout (all of it unless a ZeRO strategy sharded it);
 * segments [seg_begin[k], seg_begin[k+1]) cover [0, numel) in order, each
 * with one lr and one weight decay (a run of parameters whose group and
 * decay exclusion give the same pair; remade by fg__optimizer_segments
 * whenever a group changes). */
#ifndef FULGUR_OPTIM_IMPL_H
#define FULGUR_OPTIM_IMPL_H

#include "fulgur/optim.h"
#include "nn/nn_impl.h"

#define FG_OPTIM_MAX_STATES 3

/* A parameter group (optim.h): lr, weight decay, the lr it was made with. */
typedef struct fg__pgroup {
    double lr, wd, initial_lr;
    bool has_initial; /* initial_lr was set (by the first scheduler), PyTorch's setdefault */
} fg__pgroup;

/* What a sharding strategy hangs on an optimizer (ZeRO): post_step runs at
 * the end of every fg_optimizer_step, after the update and the step count,
 * and its failure is the step's (the strategy all-gathers the parameters
 * there); detach runs in fg_optimizer_free, so that the strategy forgets an
 * optimizer freed before it. */
typedef struct fg__optim_hook {
    /* Before the update (may be NULL): setting *skip makes the hook's own
     * update replace the optimizer's (QAdam after its warm-up); the step
     * count still advances and post_step still runs. */
    FG_MUST_USE fg_status (*pre_step)(void *ud, fg_optimizer *opt, bool *skip);
    FG_MUST_USE fg_status (*post_step)(void *ud, fg_optimizer *opt);
    void (*detach)(void *ud);
    void *ud;
} fg__optim_hook;

typedef struct fg__optim_vt {
    const char *name;
    /* Updates elements [begin, end) (inside the state's range) with step
     * number t (1-based): param, grad and each state[i] point at element
     * begin (the state in memory, or a block of it streamed from disk). */
    FG_MUST_USE fg_status (*step_range)(fg_optimizer *o, int64_t begin, int64_t end, void *param,
                                        const void *grad, void *const *state, int64_t t);
} fg__optim_vt;

struct fg_optimizer {
    const fg__optim_vt *vt;
    fg_module *m;
    fg_dtype dt;  /* the parameters' and gradients' */
    fg_dtype sdt; /* the state's: dt, or f32 for bf16/f16 parameters (bf16-true, 16-true) */
    int64_t numel;
    void *param, *grad;
    fg_dev *dev; /* the device of param, grad and the state (fg_optimizer_to_device); NULL: host */
    double lr;   /* group 0's (group[0].lr) */
    int64_t steps;
    int nstates;
    const char *state_name[FG_OPTIM_MAX_STATES];
    double state_init[FG_OPTIM_MAX_STATES]; /* the value a fresh state holds (0 but Adagrad's) */
    fg_tensor *state[FG_OPTIM_MAX_STATES];
    int ngroups;
    fg__pgroup *group;              /* ngroups entries */
    int *p_group;                   /* per parameter of the module: its group */
    bool *p_nodecay;                /* per parameter: excluded from weight decay */
    int64_t state_begin, state_end; /* the elements the state covers */
    int64_t nseg;
    int64_t *seg_begin; /* nseg + 1 entries, the last = numel */
    double *seg_wd;
    double *seg_lr;
    fg__optim_hook hook;               /* all NULL unless a sharding strategy set one */
    struct fg__optim_offload *offload; /* NULL: the state is in memory (offload.c) */
    /* offload_optimizer_device=cpu on a device (DeepSpeedCPUAdam): the state
     * in host memory, the step on the CPU on host copies of the parameter
     * and gradient range (hbuf), the parameters copied back in after */
    bool host_state;
    bool step_host; /* during such a step: the ranges are host memory */
    void *hbuf;
    size_t hbuf_cap;
    /* offload_params_device=cpu on a device (stage 3): the range's
     * parameters in host memory, their only copy between units (the step
     * updates them there; stage 3 copies a unit's part in to gather it) */
    void *host_params;
    union {
        fg_sgd_opts sgd;
        fg_adamw_opts adamw;
        fg_adam_opts adam;
        fg_rmsprop_opts rmsprop;
        fg_adagrad_opts adagrad;
        fg_lion_opts lion;
    } o;
};

/* A new optimizer over m with `nstates` state buffers named `names` (made
 * zero at first use);
 * weight decay wd on every parameter, or only on those with ndim >= 2 when
 * matrices_only. NULL on error. */
fg_optimizer *fg__optimizer_new(const fg__optim_vt *vt, fg_module *m, double lr, int nstates,
                                const char *const *names, double wd, bool matrices_only);

/* One update of elements [begin, end) of the flat layout with step number
 * steps + 1. `param` points at element begin of the parameters to update
 * (NULL: the module's flat parameters), `grad` at element begin of their
 * gradient (NULL: the module's flat gradient): a ZeRO strategy passes its
 * shard buffers. [begin, end) must lie inside the state's range. Does not
 * advance the step count: a strategy that steps several ranges (or one
 * shard per rank) calls fg__optimizer_advance once after. */
FG_MUST_USE fg_status fg__optimizer_step_range(fg_optimizer *opt, int64_t begin, int64_t end,
                                               void *param, const void *grad);
/* Keeps optimizer state for elements [begin, end) only (ZeRO-1/2/3: each
 * rank holds its shard's state): the state tensors become end - begin
 * elements long, keeping the values they held for that range (zero where
 * they held none). fg_optimizer_step then updates that range only. */
FG_MUST_USE fg_status fg__optimizer_shard_state(fg_optimizer *opt, int64_t begin, int64_t end);
/* Makes the state buffers (zero) over [state_begin, state_end) if they are
 * not made yet: an optimizer makes them at first use (a step, a state
 * read, a shard cut, offload), not at construction. */
FG_MUST_USE fg_status fg__optimizer_ensure_state(fg_optimizer *o);
/* The momentum a OneCycleLR cycles: SGD's and RMSprop's momentum (when made
 * with momentum > 0: their buffer exists), Adam's, AdamW's and Lion's
 * beta1. false when the optimizer has none. */
bool fg__optimizer_momentum(const fg_optimizer *o, double *m);
void fg__optimizer_set_momentum(fg_optimizer *o, double m);
/* Remakes the segments from the groups and exclusions (cannot fail: the
 * arrays are sized for every parameter). */
void fg__optimizer_segments(fg_optimizer *o);
void fg__optimizer_advance(fg_optimizer *opt);
/* Sets the hook (NULL clears it). The strategy that sets one clears it
 * when it is freed first; the optimizer calls detach when it is. */
void fg__optimizer_set_hook(fg_optimizer *opt, const fg__optim_hook *hook);

/* offload_optimizer_device=nvme (offload.c): moves the state of the
 * optimizer's range into files under dir (nvme_store.h), streamed through
 * memory in blocks of `block` bytes per state (0 = the default) at every
 * step, bitwise the in-memory update. The state tensors then map the files
 * (fg_optimizer_state still reads and writes them: checkpoints work as
 * before). On failure the state stays in memory, untouched. FG_ESTATE if
 * already offloaded. An optimizer without state has nothing to move. */
FG_MUST_USE fg_status fg__optimizer_offload_nvme(fg_optimizer *opt, const char *dir, size_t block);
bool fg__optimizer_offloaded(const fg_optimizer *opt);
/* The same with the parameters of the range too (ZeRO stage 3's
 * offload_params_device=nvme): one more array in the store, filled from
 * the module's flat parameters of [state_begin, state_end), updated in the
 * streamed blocks at every step (the flat buffer's range is then neither
 * read nor written by a step). f32/f64 parameters only (FG_EUNSUPPORTED). */
FG_MUST_USE fg_status fg__optimizer_offload_nvme_params(fg_optimizer *opt, const char *dir,
                                                        size_t block);
/* The store holding the parameters and their array index (*array), or
 * NULL when the parameters are not offloaded. */
struct fg__nvme_store *fg__optimizer_offload_param_store(const fg_optimizer *opt, int *array);
/* Copies the offloaded parameters back into the module's flat buffer and
 * steps them there from now on (the strategy that offloaded them goes). */
void fg__optimizer_offload_params_home(fg_optimizer *opt);
/* Bytes the offloaded state moved from and to disk so far (0 in memory). */
void fg__optimizer_offload_counts(const fg_optimizer *opt, uint64_t *read, uint64_t *written);
/* Whether the offloaded state is read with O_DIRECT (not on tmpfs). */
bool fg__optimizer_offload_direct(const fg_optimizer *opt);
/* offload.c's halves of step_range and free */
FG_MUST_USE fg_status fg__offload_step_range(fg_optimizer *opt, int64_t begin, int64_t end,
                                             void *param, const void *grad);
void fg__offload_free(fg_optimizer *opt);
/* offload_optimizer_device=cpu for an optimizer on a device: its state moves
 * to host memory and its steps run on the CPU (see host_state); FG_OK with
 * nothing to do on the host. */
FG_MUST_USE fg_status fg__optimizer_offload_cpu(fg_optimizer *opt);
/* And the range's parameters to host memory (after fg__optimizer_offload_cpu);
 * fg__optimizer_host_params is that copy (element state_begin first), NULL
 * without; fg__optimizer_offload_params_home copies them back in. */
FG_MUST_USE fg_status fg__optimizer_offload_params_cpu(fg_optimizer *opt);
void *fg__optimizer_host_params(const fg_optimizer *opt);

/* The kernels (fg__k_*, fg__sumsq, fg__scale, FG_OPTIM_PAR_MIN,
 * FG_OPTIM_BLOCK) are the ops layer's (ops/ops_impl.h), with the entries
 * that run them on a tensor's device (fg__ops_adamw, fg__ops_sgd, ...). */
#include "ops/ops_impl.h"

/* A 1-d tensor header over n elements at ptr, on the optimizer's device
 * (o->dev; the host when NULL): a range of the flat buffers or the state
 * handed to the ops entries. */
static inline fg_tensor fg__optim_range(const fg_optimizer *o, void *ptr, fg_dtype dt, int64_t n) {
    fg_tensor t = {.data = ptr, .dtype = dt, .ndim = 1, .numel = n, .param_index = -1};
    t.shape[0] = n;
    t.strides[0] = 1;
    fg_dev *d = o->step_host ? NULL : o->dev;
    t.dev = d;
    t.device = d ? fg_dev_kind(d) : FG_CPU;
    return t;
}

#endif
