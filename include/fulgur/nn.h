/* fulgur nn: modules, a tree of named modules with parameters and buffers,
 * and the built-in layers and models (Linear, Embedding, LayerNorm, Dropout,
 * GELU, ReLU, the CNN layers and norms, LSTM, GRU, MultiheadAttention,
 * ModuleList/ModuleDict, residual blocks; MLP, GPT, ResNet, ViT, the LSTM
 * language model).
 *
 * Names. A parameter's name is the dotted path from the root, as PyTorch's
 * named_parameters() gives it ("transformer.h.0.attn.c_attn.weight"), and
 * the order of parameters is PyTorch's too: a module's own parameters in the
 * order they were added, then each child's, depth first. A checkpoint
 * written under these names maps 1:1 onto the PyTorch model.
 *
 * Flat buffers. Once a root module is complete ("finalized": the built-in
 * constructors finalize what they return; a tree built by hand is finalized
 * by fg_module_finalize or on first use) every parameter is a view into ONE
 * contiguous buffer of the model's dtype (f32, f64, bf16 or f16), in the order above
 * with no padding, and every parameter's gradient is a view into ONE flat
 * gradient buffer of the same layout. A DDP bucket is a slice of the flat
 * gradient, a ZeRO shard a range of elements; fg_module_param_offset gives
 * where each parameter starts. The same holds for any sub-module: its
 * parameters are a contiguous range of the root's buffers, and the
 * functions below called on a sub-module see that range, with names relative
 * to it (as sub.named_parameters()). Non-trainable buffers (BatchNorm's and
 * InstanceNorm's running statistics) live in a flat buffer of their own,
 * without gradients.
 *
 * Tied weights (GPT's output head uses the token embedding) are one
 * parameter, counted and stored once under the name of the module that owns
 * it; the other name is an alias that fg_module_find_param and
 * fg_module_load_state also accept.
 *
 * Initialisation is seeded and counter-based: parameter i (in the order
 * above) is filled from stream fg_rng_derive(seed, i), so the same seed gives
 * the same weights on any rank, thread count or machine.
 *
 * Ownership. A module added as a child belongs to its parent;
 * fg_module_free(root) frees the whole tree, parameters, gradients and
 * buffers. Parameter tensors are persistent and borrowed from the module for
 * its life. Forward calls return step tensors.
 *
 * Thread safety. Building and finalizing a tree, loading state and changing
 * modes are not thread-safe. fg_module_forward may run on several threads
 * at once on one finalized tree (dp replicas), each thread with its own
 * tape; Dropout advances its offset atomically. */
#ifndef FULGUR_NN_H
#define FULGUR_NN_H

#include "fulgur/autograd.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fg_module fg_module;

/* ------------------------------------------------------------ user modules */

/* A module's forward: gets the module, the input (never NULL: a NULL input
 * is turned into NULL before the call) and the module's user data. Returns a
 * step tensor, or NULL with fg_last_error set. */
typedef fg_tensor *(*fg_module_forward_fn)(fg_module *m, fg_tensor *x, void *ud);

/* How a parameter is initialised when its tree is finalized (and by
 * fg_module_reset_parameters). All-zero is FG_INIT_ZEROS. */
typedef enum fg_init_kind {
    FG_INIT_ZEROS = 0,
    FG_INIT_ONES,
    FG_INIT_CONST,   /* a */
    FG_INIT_NORMAL,  /* mean a, std b */
    FG_INIT_UNIFORM, /* in [a, b) */
    FG_INIT_KEEP,    /* keep the values written before finalize (zero if none) */
} fg_init_kind;

typedef struct fg_init {
    fg_init_kind kind;
    double a, b;
} fg_init;

/* A new module with no parameters and no children.
 *   type:    a short type name for messages ("Linear", "Block"); copied.
 *   forward: may be NULL for a pure container (ModuleDict, ModuleList):
 *            fg_module_forward on it is then FG_EUNSUPPORTED.
 *   ud:      user data handed to forward. With free_ud it is consumed (also
 *            on failure): free_ud(ud) runs once, from fg_module_free, or
 *            before this returns NULL. Without free_ud it is borrowed for
 *            the module's life.
 * Returns NULL with FG_ENOMEM. */
FG_API fg_module *fg_module_new(const char *type, fg_module_forward_fn forward, void *ud,
                                void (*free_ud)(void *ud));

/* Frees m and everything below it. m must be a root (no parent): children
 * die with their root. NULL is a no-op. */
FG_API void fg_module_free(fg_module *m);

/* Adds `child` under `name` (non-empty, no '.', unique among m's children
 * and parameters; copied). child is consumed (also on failure): it belongs
 * to m from now on, and a call that fails frees it. Two children are not
 * the caller's to give and are left alone, with FG_EINVAL: one that already
 * belongs to a module, and the root of m's own tree.
 * Errors: FG_EINVAL (bad or duplicate name, NULL m, the two children
 * above), FG_ESTATE (m's tree or the child is already finalized),
 * FG_ENOMEM. A NULL child (an earlier constructor failed) returns that
 * failure's status, its message kept and prefixed. */
FG_API FG_MUST_USE fg_status fg_module_add_child(fg_module *m, const char *name, fg_module *child);

/* Adds a parameter `name` (rules as for children) of dtype dt (f32, f64, bf16 or f16;
 * every parameter of a tree has the same dtype) and shape, to be initialised
 * by `init` (NULL = zeros) when the tree is finalized. Returns the parameter,
 * a persistent tensor borrowed from m (its pointer stays valid after
 * finalize, which moves its data into the flat buffer; values written before
 * finalize are kept only with FG_INIT_KEEP). NULL on error (FG_EINVAL,
 * FG_ESTATE after finalize, FG_ENOMEM; FG_EUNSUPPORTED for a dtype other
 * than FG_F32 and FG_F64: a parameter is a tensor, so 0 is not taken as
 * f32 here). */
FG_API fg_tensor *fg_module_add_param(fg_module *m, const char *name, fg_dtype dt, int ndim,
                                      const int64_t *shape, const fg_init *init);

/* Adds a non-trainable buffer (a persistent tensor with no gradient, in the
 * state dict after the parameters). Same rules as fg_module_add_param. */
FG_API fg_tensor *fg_module_add_buffer(fg_module *m, const char *name, fg_dtype dt, int ndim,
                                       const int64_t *shape, const fg_init *init);

/* Registers `name` in m as an alias of `param`, a parameter added elsewhere
 * in the same tree (weight tying: GPT's lm_head.weight is
 * transformer.wte.weight). The alias is not a second parameter: it is not
 * counted, stored or initialised twice. Errors: FG_EINVAL (bad name, param
 * not a parameter of this tree by the time of finalize), FG_ESTATE. */
FG_API FG_MUST_USE fg_status fg_module_add_tied(fg_module *m, const char *name, fg_tensor *param);

/* Changes the initialisation of m's own parameter `name` (before finalize,
 * or before fg_module_reset_parameters). FG_EINVAL if m has no such
 * parameter. */
FG_API FG_MUST_USE fg_status fg_module_set_init(fg_module *m, const char *name,
                                                const fg_init *init);

/* Sets the seed the root's finalize initialises parameters with (default
 * and 0: fg_default_seed(), itself 0 unless fg_fabric_seed_everything set
 * it) and from which each Dropout module's seed is derived. Before finalize
 * only (FG_ESTATE after: use fg_module_reset_parameters). */
FG_API FG_MUST_USE fg_status fg_module_set_seed(fg_module *root, uint64_t seed);

/* Completes the tree rooted at `root`: lays every parameter, gradient and
 * buffer out in the flat buffers and initialises them from the seed. A no-op
 * on a finalized tree. Called by the built-in constructors and, lazily, by
 * fg_module_forward and the accessors below. Errors: FG_EINVAL (root has a
 * parent, parameters of different or non-float dtypes, a tied tensor that is
 * not a parameter of the tree), FG_ENOMEM. On failure the tree is unchanged. */
FG_API FG_MUST_USE fg_status fg_module_finalize(fg_module *root);
FG_API bool fg_module_is_finalized(const fg_module *m);

/* Moves the root's flat parameter, gradient and buffer memory to `dev`
 * (PyTorch's module.to(device)): three allocations on the device, one copy
 * in each, and every parameter, gradient and per-module flat view then
 * points there (the tensors stay the same objects, so forward callbacks and
 * an optimizer keep them; an optimizer made before follows with
 * fg_optimizer_to_device, whichever way the model moved). The module holds
 * a reference to dev until it is freed or moved away. NULL or the cpu
 * device: back to host memory (module.cpu()): the device's buffers are
 * freed and its reference released (a no-op on a host model); this
 * thread's step tensors stay where fg_step_device_set put them. From one
 * device to another: through a bounded host buffer, never the whole model
 * in host memory at once. The new buffers are made and filled before
 * anything moves, so a failure leaves the model where it was. Finalizes
 * first. FG_EUNSUPPORTED for a model whose parameters a strategy shards
 * (set up with deepspeed_stage_3, fsdp FULL_SHARD, ...): it stays where it
 * is; FG_ENOMEM with the device's message. fg_module_device is the device
 * (NULL: the host). */
FG_API FG_MUST_USE fg_status fg_module_to_device(fg_module *root, fg_dev *dev);
FG_API fg_dev *fg_module_device(const fg_module *m);

/* Re-initialises every parameter and buffer below m from `seed` (each as
 * its init says; a parameter with FG_INIT_KEEP is left alone), as if the
 * tree had been finalized with that seed: parameter i of the root uses
 * stream fg_rng_derive(seed, i) whichever sub-module is reset. */
FG_API FG_MUST_USE fg_status fg_module_reset_parameters(fg_module *m, uint64_t seed);

/* Empty init: Fabric's init_module(empty_init=True), Lightning's
 * configure_sharded_model. While on (this thread's setting; returns the
 * previous one), models made and finalized get their flat buffers laid out
 * but neither touched nor initialised: parameters added meanwhile have no
 * storage before finalize (values written to them are lost, FG_INIT_KEEP
 * gives zeros), and no memory is used yet. The model is then initialised
 * as it would have been (same seed, same bits) by whichever comes first:
 * a strategy that shards the parameters (deepspeed_stage_3, fsdp
 * FULL_SHARD, HYBRID_SHARD), which initialises only each rank's shard, so
 * that the model never exists whole on any rank; another strategy's setup
 * or the first forward, which initialise all of it; or
 * fg_module_reset_parameters; or fg_module_load_state, which initialises it
 * whole and then writes what it loads, so that a model loaded before setup
 * (Lightning's load_from_checkpoint under init_module(empty_init=True))
 * keeps the loaded values. Buffers are always initialised whole. */
FG_API bool fg_module_set_empty_init(bool on);

/* The user data given to fg_module_new. */
FG_API void *fg_module_data(const fg_module *m);
FG_API const char *fg_module_type(const fg_module *m);
/* m's name in its parent ("" for a root). */
FG_API const char *fg_module_name(const fg_module *m);
FG_API fg_module *fg_module_parent(const fg_module *m);
FG_API int fg_module_num_children(const fg_module *m);
FG_API fg_module *fg_module_child_at(const fg_module *m, int i);
/* The child named `name` ("h" or a dotted path "transformer.h.0"), or NULL
 * (FG_EINVAL naming it). */
FG_API fg_module *fg_module_child(const fg_module *m, const char *name);
/* m's own parameter `name` (not a path; aliases included), or NULL. Works
 * before finalize: how a forward callback reaches its weights. */
FG_API fg_tensor *fg_module_own_param(const fg_module *m, const char *name);

/* ------------------------------------------------------------------ forward */

/* Runs m's forward on x (finalizing the tree first if needed). Returns a
 * step tensor, NULL with fg_last_error set on error; a NULL x gives NULL
 * (the earlier error is kept and prefixed). Thread-safe on a finalized tree. */
FG_API fg_tensor *fg_module_forward(fg_module *m, fg_tensor *x);

/* Training (true, the default) or evaluation mode for m and everything
 * below it: Dropout is the identity in evaluation mode. */
FG_API void fg_module_train(fg_module *m, bool on);

/* Activation checkpointing (Lightning's activation_checkpointing_policy,
 * torch.utils.checkpoint around a module's forward): every module of m's
 * tree (m included) whose type is `type` runs its forward through
 * fg_checkpoint (autograd.h) while `on`: its activations are dropped after
 * forward and recomputed in backward, with bitwise the same gradients. A
 * NULL type means the model's repeated blocks: "Block" (a GPT's
 * transformer blocks). *count (may be NULL) gets how many modules were
 * set. FG_EINVAL for a NULL module, or when no module of that type is in
 * the tree (naming the type and m's). */
FG_API FG_MUST_USE fg_status fg_module_set_activation_checkpointing(fg_module *m, const char *type,
                                                                    bool on, int *count);
FG_API bool fg_module_is_training(const fg_module *m);

/* ------------------------------------------- parameters and flat buffers */
/* The functions below finalize m's tree first when needed; on failure they
 * return 0 / -1 / NULL with fg_last_error set. Indices run over m's
 * parameters (0 .. num_params-1), names are relative to m. */

/* Number of parameter tensors (tied weights once). */
FG_API int64_t fg_module_num_params(fg_module *m);
/* Parameter i (borrowed), its name (borrowed, valid for m's life), its
 * element offset in fg_module_flat_params(m). NULL / -1 when i is out of
 * range (FG_EINVAL). */
FG_API fg_tensor *fg_module_param(fg_module *m, int64_t i);
FG_API const char *fg_module_param_name(fg_module *m, int64_t i);
FG_API int64_t fg_module_param_offset(fg_module *m, int64_t i);
/* Total number of parameter elements. */
FG_API int64_t fg_module_numel(fg_module *m);
/* The dtype of the parameters (FG_F32 or FG_F64), FG_F32 if there are none. */
FG_API fg_dtype fg_module_dtype(fg_module *m);
/* 1-D persistent views of all of m's parameters / their gradients, in the
 * layout above (borrowed from the module; writing them writes the
 * parameters). */
FG_API fg_tensor *fg_module_flat_params(fg_module *m);
FG_API fg_tensor *fg_module_flat_grads(fg_module *m);
/* Index of the parameter named `name` (aliases too), -1 if none (no error
 * set: a lookup, not a failure). */
FG_API int64_t fg_module_find_param(fg_module *m, const char *name);
/* Zeroes every gradient of m (the flat gradient range). */
FG_API void fg_module_zero_grad(fg_module *m);

/* Buffers, as parameters (BatchNorm's running statistics; none in the MLP
 * and GPT). */
FG_API int64_t fg_module_num_buffers(fg_module *m);
FG_API fg_tensor *fg_module_buffer(fg_module *m, int64_t i);
FG_API const char *fg_module_buffer_name(fg_module *m, int64_t i);

/* -------------------------------------------------------------- state dict */

/* The state dict is the parameters in order, then the buffers:
 * fg_module_state_count entries, entry i with its name and tensor
 * (borrowed). What the checkpoint layer saves. */
FG_API int64_t fg_module_state_count(fg_module *m);
FG_API const char *fg_module_state_name(fg_module *m, int64_t i);
FG_API fg_tensor *fg_module_state_tensor(fg_module *m, int64_t i);

/* One named array to load: `data` holds product(shape) elements of dtype
 * (row-major, borrowed for the call). */
typedef struct fg_state_entry {
    const char *name;
    fg_dtype dtype;
    int ndim;
    const int64_t *shape;
    const void *data;
} fg_state_entry;

/* Loads values by name into m's parameters and buffers (names relative to
 * m; aliases of tied weights accepted). Float entries are converted to the
 * model's dtype. Everything is checked before anything is written: on
 * failure m is unchanged. Errors: FG_EMISMATCH with a message listing the
 * shape mismatches (name, file shape, model shape), and with `strict` the
 * missing names (in m, not in entries) and the unexpected ones (in entries,
 * not in m); FG_EINVAL for a NULL argument, a non-float entry or a
 * duplicate entry name. */
FG_API FG_MUST_USE fg_status fg_module_load_state(fg_module *m, const fg_state_entry *entries,
                                                  int64_t n, bool strict);

/* ---------------------------------------------------------------- built-ins */
/* Each returns a new root, not yet finalized: add it as a child of a bigger
 * tree, or use it on its own (it is finalized with the default seed on first use, or
 * set a seed first). NULL with fg_last_error on a bad argument or out of
 * memory. The models further down (MLP, GPT) come back finalized.
 * A `dt` argument is the parameters' dtype: FG_F32 (or 0, the default),
 * FG_F64, or FG_BF16 / FG_F16 (bf16-true, 16-true: initialised in f32 and
 * rounded once); other dtypes are FG_EINVAL. */

/* y = x @ weight^T + bias: weight (out, in), bias (out) when `bias`, as
 * torch.nn.Linear, initialised as PyTorch does (U(-1/sqrt(in), 1/sqrt(in))
 * for both, i.e. kaiming_uniform with a = sqrt(5)). x (..., in). */
FG_API fg_module *fg_linear_new(int64_t in, int64_t out, bool bias, fg_dtype dt);
/* weight (num, dim), N(0, 1) as torch.nn.Embedding; x i32 (...) -> (..., dim). */
FG_API fg_module *fg_embedding_new(int64_t num, int64_t dim, fg_dtype dt);
/* Over the last dim of size `dim`: weight 1 and (with `bias`) bias 0; eps
 * <= 0 means 1e-5 (PyTorch's default). */
FG_API fg_module *fg_layer_norm_new(int64_t dim, double eps, bool bias, fg_dtype dt);
/* Inverted dropout with probability p in [0, 1) in training mode, the
 * identity in evaluation mode. The mask is fg_dropout's at (seed, offset):
 * seed is derived from the root's seed and the module's position in the tree,
 * offset starts at 0 and advances by the input's size at each call, so a run
 * is reproducible. */
FG_API fg_module *fg_dropout_new(double p);
/* A Dropout module's mask state, for checkpoints and for giving ranks
 * different masks: FG_EINVAL if m is not a Dropout module. */
FG_API FG_MUST_USE fg_status fg_dropout_get_state(const fg_module *m, uint64_t *seed,
                                                  uint64_t *offset);
FG_API FG_MUST_USE fg_status fg_dropout_set_state(fg_module *m, uint64_t seed, uint64_t offset);
/* Sets every Dropout below m to a seed derived from `seed` and its position,
 * offsets back to 0 (what fabric's seed_everything does per rank). */
FG_API void fg_module_seed_dropout(fg_module *m, uint64_t seed);
/* Activations, without parameters. GELU is the tanh form (GPT-2's). */
FG_API fg_module *fg_gelu_new(void);
FG_API fg_module *fg_relu_new(void);
/* torch.nn.GELU(approximate=): "none" (or NULL; PyTorch's default, the
 * exact erf form) or "tanh" (fg_gelu_new); FG_EINVAL otherwise. */
FG_API fg_module *fg_gelu_new_approximate(const char *approximate);
/* Sigmoid, Tanh, SiLU, Identity; Softplus(beta, threshold) (PyTorch: 1,
 * 20), LeakyReLU(negative_slope) (0.01), ELU(alpha) (1.0), Softmax(dim),
 * LogSoftmax(dim), Flatten(start_dim, end_dim) (PyTorch: 1, -1): the
 * functions of autograd.h as modules, without parameters. */
FG_API fg_module *fg_sigmoid_new(void);
FG_API fg_module *fg_tanh_new(void);
FG_API fg_module *fg_silu_new(void);
FG_API fg_module *fg_identity_new(void);
FG_API fg_module *fg_softplus_new(double beta, double threshold);
FG_API fg_module *fg_leaky_relu_new(double negative_slope);
FG_API fg_module *fg_elu_new(double alpha);
FG_API fg_module *fg_softmax_new(int dim);
FG_API fg_module *fg_log_softmax_new(int dim);
FG_API fg_module *fg_flatten_new(int start_dim, int end_dim);

/* torch.nn.Conv2d(in, out, kernel, stride, padding, dilation, groups,
 * bias) with the options of fg_conv2d (NULL: PyTorch's defaults): weight
 * (out, in / groups, KH, KW) and bias (out), both U(-1/sqrt(fan_in),
 * 1/sqrt(fan_in)) as PyTorch initialises them. Conv1d: weight (out, in /
 * groups, kernel), entry [0] of each option pair. */
FG_API fg_module *fg_conv2d_new(int64_t in, int64_t out, const int64_t kernel[2],
                                const fg_conv2d_opts *o, bool bias, fg_dtype dt);
FG_API fg_module *fg_conv1d_new(int64_t in, int64_t out, int64_t kernel, const fg_conv2d_opts *o,
                                bool bias, fg_dtype dt);
/* MaxPool2d, AvgPool2d (the arguments of fg_max_pool2d / fg_avg_pool2d;
 * NULL stride is the kernel) and AdaptiveAvgPool2d((out_h, out_w)). */
FG_API fg_module *fg_max_pool2d_new(const int64_t kernel[2], const int64_t stride[2],
                                    const int64_t padding[2], const int64_t dilation[2],
                                    bool ceil_mode);
FG_API fg_module *fg_avg_pool2d_new(const int64_t kernel[2], const int64_t stride[2],
                                    const int64_t padding[2], bool ceil_mode,
                                    bool count_include_pad);
FG_API fg_module *fg_adaptive_avg_pool2d_new(int64_t out_h, int64_t out_w);
/* BatchNorm2d (N, C, H, W) and BatchNorm1d (N, C) or (N, C, L), as
 * PyTorch's (eps <= 0 means 1e-5; PyTorch's momentum is 0.1): with affine,
 * parameters weight (1) and bias (0); with track_running_stats, buffers
 * running_mean (0), running_var (1) and num_batches_tracked (a float
 * here), updated in training mode (fg_module_train) and used in
 * evaluation mode. */
FG_API fg_module *fg_batch_norm2d_new(int64_t num_features, double eps, double momentum,
                                      bool affine, bool track_running_stats, fg_dtype dt);
FG_API fg_module *fg_batch_norm1d_new(int64_t num_features, double eps, double momentum,
                                      bool affine, bool track_running_stats, fg_dtype dt);

/* torch.nn.SyncBatchNorm.convert_sync_batchnorm (Lightning's
 * sync_batchnorm=True): every BatchNorm1d / BatchNorm2d of m's tree
 * becomes a SyncBatchNorm (its type reads so; parameters, buffers and
 * names unchanged) whose training-mode statistics are summed over the
 * ranks through r (fg_sync_batch_norm), borrowed for as long as the
 * modules run; NULL turns them back into plain batch norms. Evaluation
 * mode uses the running statistics, as before, without communication.
 * Returns how many modules were converted. Not thread-safe with forward. */
FG_API int fg_module_convert_sync_batchnorm(fg_module *m, const fg_stats_reduce *r);

/* torch.nn.GroupNorm(num_groups, num_channels, eps, affine): weight (1)
 * and bias (0) of (C) with affine; eps <= 0 means 1e-5. */
FG_API fg_module *fg_group_norm_new(int64_t num_groups, int64_t num_channels, double eps,
                                    bool affine, fg_dtype dt);
/* torch.nn.RMSNorm(dim, eps, elementwise_affine) (PyTorch 2.4) over the
 * last dim: weight (dim) (1) with affine; eps < 0 is eps=None (the
 * dtype's epsilon). */
FG_API fg_module *fg_rms_norm_new(int64_t dim, double eps, bool affine, fg_dtype dt);
/* torch.nn.InstanceNorm2d(num_features, eps, momentum, affine,
 * track_running_stats) (PyTorch: 1e-5, 0.1, false, false) on (N, C, H, W):
 * weight and bias with affine, running_mean, running_var and
 * num_batches_tracked with track_running_stats (used in evaluation mode). */
FG_API fg_module *fg_instance_norm2d_new(int64_t num_features, double eps, double momentum,
                                         bool affine, bool track_running_stats, fg_dtype dt);
/* torch.nn.ConvTranspose2d(in, out, kernel, stride, padding,
 * output_padding, groups, bias, dilation): weight (in, out / groups, KH,
 * KW) and bias (out), U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in =
 * out / groups * KH * KW, as PyTorch computes it for this weight. */
FG_API fg_module *fg_conv_transpose2d_new(int64_t in, int64_t out, const int64_t kernel[2],
                                          const fg_conv_transpose2d_opts *o, bool bias,
                                          fg_dtype dt);

/* A container that runs its children in order (torch.nn.Sequential): the
 * children are named "0", "1", ... by fg_sequential_append. child is
 * consumed (also on failure), as by fg_module_add_child; FG_EINVAL if seq is
 * not a Sequential (child freed). */
FG_API fg_module *fg_sequential_new(void);
FG_API FG_MUST_USE fg_status fg_sequential_append(fg_module *seq, fg_module *child);

/* torch.nn.ModuleList / torch.nn.ModuleDict: containers without a forward
 * (fg_module_forward on them is FG_EUNSUPPORTED; the owner's forward runs
 * the children, reached by fg_module_child_at / fg_module_child). List
 * children are named "0", "1", ... in order of appending, dict children by
 * key (rules of fg_module_add_child), so parameters read "3.weight" and
 * "encoder.weight" as PyTorch's. child is consumed (also on failure);
 * FG_EINVAL (child freed) when the container is not of that kind. */
FG_API fg_module *fg_module_list_new(void);
FG_API FG_MUST_USE fg_status fg_module_list_append(fg_module *list, fg_module *child);
FG_API fg_module *fg_module_dict_new(void);
FG_API FG_MUST_USE fg_status fg_module_dict_set(fg_module *dict, const char *key, fg_module *child);

/* A residual block of torchvision's resnet.py: BasicBlock (conv1 3x3 with
 * `stride`, bn1, ReLU, conv2 3x3, bn2) or, with bottleneck, Bottleneck
 * (conv1 1x1, bn1, conv2 3x3 with `stride`, bn2, conv3 1x1 to 4 planes,
 * bn3), plus the shortcut: x itself, or downsample (a Sequential of a 1x1
 * conv with `stride` and a BatchNorm2d) when the stride is not 1 or the
 * channels change; ReLU after the sum. Convolutions without bias,
 * kaiming_normal(fan_out) as torchvision. (N, in, H, W) -> (N, planes (x4),
 * H / stride, W / stride). */
FG_API fg_module *fg_resnet_block_new(int64_t in, int64_t planes, int64_t stride, bool bottleneck,
                                      fg_dtype dt);

typedef enum fg_resnet_layout {
    FG_RESNET_CIFAR = 0, /* 3x3 stem, stride 1, no max pool */
    FG_RESNET_IMAGENET,  /* torchvision's: 7x7 stride-2 stem, 3x3 stride-2 max pool */
} fg_resnet_layout;

/* A ResNet: conv1, bn1, relu, (maxpool), layer1 .. layer4 (Sequentials of
 * blocks; the first block of each stage after the first has stride 2),
 * avgpool (adaptive to 1x1), fc: torchvision's names, so that its state
 * dict loads into torchvision.models.resnet18/34/50(...) (imagenet layout,
 * width 64) or the same classes with the stem changed (cifar) with
 * strict=True. Depths: imagenet 18, 34 (BasicBlock), 50, 101, 152
 * (Bottleneck); cifar 18 (four stages of two BasicBlocks, as the common
 * CIFAR port) and 6n+2 (20, 32, 44, 56, 110: He et al.'s three stages of n
 * BasicBlocks, 1x1-convolution shortcuts). Zero fields are the defaults. */
typedef struct fg_resnet_config {
    fg_resnet_layout layout;
    int depth;           /* 0: 20 (cifar), 50 (imagenet) */
    int64_t in_channels; /* 0: 3 */
    int64_t num_classes; /* 0: 10 (cifar), 1000 (imagenet) */
    int64_t width;       /* the first stage's planes, doubled per stage; 0: 16 for 6n+2, else 64 */
    uint64_t seed;       /* 0: fg_default_seed() */
    fg_dtype dtype;      /* FG_F32 (0) or FG_F64 */
} fg_resnet_config;

/* Builds and finalizes a ResNet; forward x (N, in_channels, H, W) ->
 * logits (N, num_classes). FG_EINVAL naming a bad depth or size. */
FG_API fg_module *fg_resnet_new(const fg_resnet_config *c);

/* A vision transformer as torchvision's VisionTransformer (names
 * class_token, conv_proj, encoder.pos_embedding,
 * encoder.layers.encoder_layer_{i}.{ln_1, self_attention, ln_2, mlp.0,
 * mlp.3}, encoder.ln, heads.head; its initialisation, LayerNorm eps 1e-6,
 * exact GELU), so that the state dict loads into
 * torchvision.models.VisionTransformer(image_size, patch_size, num_layers,
 * num_heads, hidden_dim, mlp_dim, dropout, attention_dropout, num_classes)
 * with strict=True. Zero fields are the defaults given. */
typedef struct fg_vit_config {
    int64_t image_size;       /* square images; 0: 32 */
    int64_t patch_size;       /* divides image_size; 0: 4 */
    int64_t in_channels;      /* 0: 3 */
    int64_t num_layers;       /* 0: 6 */
    int64_t num_heads;        /* 0: 4 */
    int64_t hidden_dim;       /* a multiple of num_heads; 0: 128 */
    int64_t mlp_dim;          /* 0: 4 hidden_dim */
    int64_t num_classes;      /* 0: 10 */
    double dropout;           /* after the embeddings, the attention and in the MLP */
    double attention_dropout; /* on the attention weights */
    uint64_t seed;            /* 0: fg_default_seed() */
    fg_dtype dtype;           /* FG_F32 (0) or FG_F64 */
} fg_vit_config;

/* Builds and finalizes a ViT: forward x (N, in_channels, image_size,
 * image_size) -> logits (N, num_classes) (the class token's). FG_EINVAL
 * naming a bad size. */
FG_API fg_module *fg_vit_new(const fg_vit_config *c);

/* ------------------------------------------------- recurrent and attention */

/* torch.nn.LSTM / torch.nn.GRU(input_size, hidden_size, num_layers, bias,
 * batch_first, bidirectional, dropout); proj_size is not supported.
 * Dropout between layers is a child Dropout module named "dropout" (no
 * parameters; its masks are fulgur's, not PyTorch's). Parameters, per layer k and direction (suffix
 * "" then
 * "_reverse"), in PyTorch's order: weight_ih_l{k} (G*H, in), weight_hh_l{k}
 * (G*H, H), bias_ih_l{k} (G*H), bias_hh_l{k} (G*H) with G = 4 (gates i, f,
 * g, o) for LSTM, 3 (r, z, n) for GRU; in = input_size for layer 0, H (or
 * 2H bidirectional) after. All U(-1/sqrt(H), 1/sqrt(H)) as PyTorch. GRU's
 * n = tanh(W_in x + b_in + r * (W_hn h + b_hn)), h' = (1 - z) n + z h. */
typedef struct fg_rnn_opts {
    int64_t num_layers; /* 0 means 1 */
    bool no_bias;       /* bias=False */
    bool batch_first;   /* x and output (N, T, .) instead of (T, N, .) */
    bool bidirectional;
    double dropout; /* on the outputs of every layer but the last, in training mode; in [0, 1) */
} fg_rnn_opts;

/* NULL options: PyTorch's defaults. */
FG_API fg_module *fg_lstm_new(int64_t input_size, int64_t hidden_size, const fg_rnn_opts *o,
                              fg_dtype dt);
FG_API fg_module *fg_gru_new(int64_t input_size, int64_t hidden_size, const fg_rnn_opts *o,
                             fg_dtype dt);

/* Runs an LSTM or GRU module m: x (T, N, in) ((N, T, in) with batch_first)
 * -> output (T, N, D*H) (D = 2 bidirectional), or unbatched x (T, in) ->
 * (T, D*H) with states (num_layers*D, H), through fg_module_forward
 * (so hooks and modes apply). h0 and (LSTM) c0 are (num_layers*D, N, H),
 * NULL for zeros (c0 is ignored by a GRU); *h_n and *c_n (each may be NULL;
 * *c_n NULL for a GRU) get the final states, (num_layers*D, N, H), layer
 * by layer, forward before reverse, as PyTorch. fg_module_forward(m, x) is
 * this call with zero states that returns the output alone, and the only
 * one under activation checkpointing (which carries one input): there this
 * call is FG_EUNSUPPORTED. */
FG_API fg_tensor *fg_rnn_forward(fg_module *m, fg_tensor *x, fg_tensor *h0, fg_tensor *c0,
                                 fg_tensor **h_n, fg_tensor **c_n);

/* torch.nn.MultiheadAttention(embed_dim, num_heads, bias, batch_first),
 * kdim = vdim = embed_dim, dropout (a child Dropout module "dropout" on
 * the attention weights, which are returned after it as PyTorch 1.13
 * returns them; fulgur's masks), no add_bias_kv / add_zero_attn.
 * Parameters in_proj_weight (3E, E) (xavier_uniform), in_proj_bias (3E)
 * (0), out_proj.weight (E, E) (Linear's init), out_proj.bias (E) (0); the
 * biases only with bias. Not causal: masks say what is not attended. */
typedef struct fg_mha_opts {
    bool no_bias;     /* bias=False */
    bool batch_first; /* (N, L, E) instead of (L, N, E) */
    double dropout;   /* on the attention weights in training mode, in [0, 1) */
} fg_mha_opts;

FG_API fg_module *fg_multihead_attention_new(int64_t embed_dim, int64_t num_heads,
                                             const fg_mha_opts *o, fg_dtype dt);

/* The call's arguments (all optional; zero is PyTorch's default):
 *   key_padding_mask (N, S), u8 or i32, nonzero = that key is ignored;
 *   attn_mask (L, S) or (N*heads, L, S): u8 / i32 (nonzero = not attended)
 *     or float, added to the scores;
 *   per_head_weights: average_attn_weights=False. */
typedef struct fg_mha_args {
    fg_tensor *key_padding_mask;
    fg_tensor *attn_mask;
    bool per_head_weights;
} fg_mha_args;

/* query (L, N, E), key and value (S, N, E) (batch first: (N, L, E), (N, S,
 * E)), or unbatched query (L, E), key and value (S, E), key_padding_mask
 * (S), attn_mask (L, S) or (heads, L, S), output (L, E), weights (L, S) or
 * (heads, L, S); self-attention passes the same tensor three times. Returns the
 * output (L, N, E) (or (N, L, E)); with `weights` (need_weights) *weights
 * gets the attention probabilities (N, L, S) averaged over heads, or
 * (N, heads, L, S). Through fg_module_forward, as fg_rnn_forward; a row
 * with every key masked gives NaN, as PyTorch. fg_module_forward(m, x) is
 * self-attention of x without masks, the only call under activation
 * checkpointing (this one is FG_EUNSUPPORTED there). */
FG_API fg_tensor *fg_mha_forward(fg_module *m, fg_tensor *query, fg_tensor *key, fg_tensor *value,
                                 const fg_mha_args *a, fg_tensor **weights);

/* An LSTM language model: embedding (vocab, embd) (N(0, 1)), lstm (embd ->
 * hidden, `layers` layers, batch_first), fc (hidden -> vocab, Linear's
 * init), so the parameters are embedding.weight, lstm.weight_ih_l0, ...,
 * fc.weight, fc.bias, the state dict of the PyTorch module with those three
 * attributes. Forward: idx i32 (B, T) -> logits (B, T, vocab), from zero
 * states. Built and finalized (seed 0: fg_default_seed()). */
typedef struct fg_lstm_lm_config {
    int64_t vocab, embd, hidden;
    int64_t layers; /* 0 means 1 */
    uint64_t seed;
    fg_dtype dtype; /* FG_F32 (0) or FG_F64 */
} fg_lstm_lm_config;

FG_API fg_module *fg_lstm_lm_new(const fg_lstm_lm_config *c);

/* -------------------------------------------------------------------- MLP */

#define FG_MLP_MAX_LAYERS 16

typedef enum fg_activation { FG_ACT_RELU = 0, FG_ACT_GELU } fg_activation;

/* A multi-layer perceptron: Linear(sizes[0], sizes[1]), activation,
 * Linear(sizes[1], sizes[2]), ..., Linear(sizes[n-1], sizes[n]), returning
 * logits (no activation after the last Linear). The layout is PyTorch's
 * nn.Sequential, so parameters are named "0.weight", "0.bias", "2.weight",
 * ... (activations and dropouts take indices too). */
typedef struct fg_mlp_config {
    int64_t sizes[FG_MLP_MAX_LAYERS + 1]; /* in, hidden..., out */
    int nlayers;                          /* Linear layers; 0 = count of sizes > 0, minus 1 */
    fg_activation activation;             /* default ReLU */
    double dropout;                       /* after each activation when > 0 */
    bool no_bias;                         /* Linear layers without bias */
    uint64_t seed;                        /* initialisation seed; 0 = fg_default_seed() */
    fg_dtype dtype;                       /* FG_F32 (default, 0) or FG_F64 */
} fg_mlp_config;

/* Builds and finalizes an MLP. Its forward takes x (B, sizes[0]), or
 * (B, d1, d2, ...) with d1*d2*... == sizes[0] (flattened, as nn.Flatten),
 * and returns logits (B, sizes[nlayers]). Errors: FG_EINVAL naming the bad
 * field (nlayers out of 1..FG_MLP_MAX_LAYERS, a size <= 0, a dtype other
 * than 0, FG_F32 and FG_F64 (FG_EUNSUPPORTED for bf16 and f16), dropout
 * outside [0, 1)). */
FG_API fg_module *fg_mlp_new(const fg_mlp_config *c);

/* -------------------------------------------------------------------- GPT */

/* GPT-2 exactly as nanoGPT's model.py lays it out (names, order, init):
 *   transformer.wte (vocab, embd), transformer.wpe (ctx, embd), dropout,
 *   transformer.h.{i}: ln_1, attn.c_attn (embd -> 3 embd, fused q|k|v),
 *     causal attention, attn.c_proj (embd -> embd), dropout, residual;
 *     ln_2, mlp.c_fc (embd -> 4 embd), GELU (tanh), mlp.c_proj, dropout,
 *     residual;
 *   transformer.ln_f, then lm_head (no bias) tied to transformer.wte
 *   (alias "lm_head.weight").
 * Initialisation: weights N(0, 0.02), c_proj weights N(0, 0.02 /
 * sqrt(2 layers)), biases 0, LayerNorms 1 and 0. Dropout is applied after
 * the embeddings and on both residual branches; attention probabilities are
 * not dropped (fg_causal_attention has no dropout). LayerNorm eps is 1e-5. */
typedef struct fg_gpt_config {
    int64_t vocab, ctx; /* vocabulary size, longest sequence (block_size) */
    int layers, heads;
    int64_t embd;   /* a multiple of heads */
    double dropout; /* in [0, 1) */
    bool no_bias;   /* Linears and LayerNorms without bias (nanoGPT's bias=False) */
    uint64_t seed;  /* initialisation seed (dropout seeds derive from it);
                       0 = fg_default_seed() */
    fg_dtype dtype; /* FG_F32 (default, 0) or FG_F64 */
} fg_gpt_config;

/* Builds and finalizes a GPT. Its forward takes idx i32 (B, T) with
 * T <= ctx and every id in [0, vocab), and returns logits (B, T, vocab).
 * Errors: FG_EINVAL naming the bad field (a size <= 0, embd not a multiple
 * of heads, dropout outside [0, 1), a dtype as for fg_mlp_new); forward:
 * FG_EINVAL for T > ctx, a wrong dtype or ndim, or an id out of range. */
FG_API fg_module *fg_gpt_new(const fg_gpt_config *c);
/* The config a GPT module was built with, its dtype filled in (FG_F32 for
 * a 0); NULL if m is not one. */
FG_API const fg_gpt_config *fg_gpt_get_config(const fg_module *m);

typedef struct fg_sample_opts {
    double temperature; /* > 0; 0 means 1.0 */
    int64_t top_k;      /* keep the k most likely tokens; 0 = all */
    bool greedy;        /* argmax instead of sampling */
    uint64_t seed;      /* the draw for token j is at (seed, j): reproducible */
} fg_sample_opts;

/* Samples the next token of each of B sequences: idx i32 (B, T) (the last
 * ctx tokens are used when T > ctx). Writes B tokens to out. Runs in no-grad
 * mode and makes step tensors on the calling thread (freed by the caller's
 * next fg_step_reset). `draw` is the index of the draw in the seed's stream
 * (the token's position, for reproducibility). */
FG_API FG_MUST_USE fg_status fg_gpt_sample_next(fg_module *gpt, fg_tensor *idx,
                                                const fg_sample_opts *o, uint64_t draw,
                                                int32_t *out);

/* Generates n_new tokens after a prompt of n_prompt tokens (n_prompt >= 1,
 * each in [0, vocab)): writes prompt then continuation, n_prompt + n_new
 * tokens, to out. Runs on a helper thread with its own step arena in no-grad
 * mode, so it neither uses nor frees the caller's step tensors, and memory
 * stays bounded however long the output. Not thread-safe with training the
 * same model. Errors: FG_EINVAL (bad argument, id out of range), FG_ENOMEM. */
FG_API FG_MUST_USE fg_status fg_gpt_generate(fg_module *gpt, const int32_t *prompt,
                                             int64_t n_prompt, int64_t n_new,
                                             const fg_sample_opts *o, int32_t *out);

#ifdef __cplusplus
}
#endif
#endif
