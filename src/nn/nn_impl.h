/* Private header of the nn layer: the module struct and the root's flat
 * layout, shared by module.c (the tree), module_flat.c (finalize and the
 * layout), module_state.c (the state dict), layers.c, mlp.c and gpt.c, and
 * by the optim layer above (which reads the flat layout).
 *
 * Invariants after finalize:
 *   - the root's fg__flat lists every parameter once in PyTorch order (a
 *     module's own parameters, then its children's, depth first), parameter
 *     i in slot[i] at offset slot[i].off = sum of the sizes before it (no
 *     padding); buffer i likewise in slot[np + i], offsets into bdata;
 *   - every module of the tree points at that fg__flat (flat != NULL) and
 *     owns the index range [p_first, p_first + p_count) and the element range
 *     [p_off, p_off + p_numel) of it, likewise for buffers;
 *   - a parameter tensor's data is pdata + slot[i].off (not owned), its grad
 *     is the view slot[i].grad into gdata. */
#ifndef FULGUR_NN_IMPL_H
#define FULGUR_NN_IMPL_H

#include <stdatomic.h>

#include "autograd/autograd_impl.h"
#include "fulgur/nn.h"

typedef struct fg__pentry {
    char *name; /* local name in its module */
    fg_tensor *t;
    fg_init init;
    bool alias; /* a tied weight owned by another module */
} fg__pentry;

typedef struct fg__plist {
    fg__pentry *e;
    int n, cap;
} fg__plist;

/* One parameter or buffer of a finalized tree. */
typedef struct fg__slot {
    fg_tensor *t;    /* the module's tensor; its data lives in the flat buffer */
    fg__pentry *e;   /* its entry in the owning module (local name, init) */
    char *name;      /* full dotted name ("blocks.0.attn.qkv.weight"), owned */
    int64_t off;     /* elements from the start of pdata (buffers: bdata) */
    fg_tensor *grad; /* parameters: the owned view into gdata; buffers: NULL */
} fg__slot;

/* What a sharding strategy that shards the parameters (ZeRO-3, FSDP's
 * FULL_SHARD: src/strategy/zero3.c) hangs on the tree: the hooks of its
 * wrapped units (module_wrap.c calls them around a wrapped module's forward
 * and, through two identity nodes on the tape, around its backward) and
 * the root's zero_grad. Each hook gets the unit's index. A wrap set with
 * no units (a strategy that only owns the root's zero_grad) has only
 * zero_grad and detach called: its unit hooks may be NULL. */
typedef struct fg__module_wrap {
    FG_MUST_USE fg_status (*pre_forward)(void *ud, int unit);  /* gather the unit's parameters */
    FG_MUST_USE fg_status (*post_forward)(void *ud, int unit); /* release them */
    FG_MUST_USE fg_status (*pre_backward)(void *ud,
                                          int unit); /* gather again, before its backward */
    FG_MUST_USE fg_status (*post_backward)(void *ud, int unit); /* its backward is over: release */
    void (*zero_grad)(void *ud);                                /* the root's fg_module_zero_grad */
    void (*detach)(void *ud); /* the tree is being freed: forget it */
    void *ud;
} fg__module_wrap;

typedef struct fg__flat {
    fg_dtype dtype;
    uint64_t seed;
    int64_t np, pnumel; /* parameters */
    int64_t nb, bnumel; /* buffers */
    fg__slot *slot;     /* np parameters, then nb buffers */
    void *pdata, *gdata, *bdata;
    /* aliases (tied weights): full name -> parameter index */
    int64_t nalias;
    char **alias_name;
    int64_t *alias_idx;
    /* every module, preorder (for freeing per-module views) */
    int64_t nmod;
    fg_module **mods;
    const fg__module_wrap *wrap; /* set by a strategy sharding the parameters; borrowed */
    bool deferred; /* made under empty init: parameters not initialised, gradients not zeroed */
    fg_dev *dev;   /* fg_module_to_device's device (a reference), NULL: host memory */
} fg__flat;

struct fg_module {
    char *type;
    char *name; /* in the parent; "" for a root */
    fg_module *parent;
    fg_module **child;
    int nchild, capchild;
    fg__plist params, buffers;
    fg_module_forward_fn forward;
    void *ud;
    void (*free_ud)(void *);
    const void *kind; /* identifies built-ins (Dropout, GPT) */
    bool training;
    bool checkpoint; /* forward through fg_checkpoint (activation checkpointing) */
    uint64_t seed;   /* root: initialisation seed */

    /* after finalize */
    fg__flat *flat; /* the root's */
    int64_t index;  /* preorder position in the tree */
    int64_t p_first, p_count, p_off, p_numel;
    int64_t b_first, b_count, b_off, b_numel;
    size_t prefix_len; /* strlen of "path." (0 for the root) */
    char *path;        /* full dotted path ("" for the root) */
    fg_tensor *flat_p, *flat_g, *flat_b;
    int wrap_unit; /* >= 0: a wrapped unit of flat->wrap (its index); -1 otherwise */
};

/* The root of m's tree. */
fg_module *fg__module_root(const fg_module *m);
/* Finalizes m's root if needed. */
FG_MUST_USE fg_status fg__module_ready(fg_module *m);
/* m's flat layout, finalizing its root if needed; NULL (error set) if that
 * fails. */
fg__flat *fg__module_flat(fg_module *m);
/* Is 0 <= i < n? If not, sets FG_EINVAL naming `what`, m and n. */
bool fg__module_index_ok(fg_module *m, int64_t i, int64_t n, const char *what);
/* Frees a layout, its buffers and its grad views (NULL: no-op). The tree's
 * tensors borrow them: free the tree first. */
void fg__module_flat_free(fg__flat *f);
/* m's path for messages ("transformer.h.0.attn", or "(root)"). */
const char *fg__module_path(const fg_module *m, char *buf, size_t n);

/* module_wrap.c: sets (wrap non-NULL) or clears the wrapping of m's tree:
 * units[k] is unit k's module (a module of the tree, the root included),
 * nunits of them. Borrowed until cleared. */
void fg__module_set_wrap(fg_module *root, const fg__module_wrap *wrap, fg_module *const *units,
                         int nunits);
/* m's own forward, through fg_checkpoint when m->checkpoint is set
 * (module.c). */
fg_tensor *fg__module_forward_body(fg_module *m, fg_tensor *x);
/* m's forward through its unit's hooks (m->wrap_unit >= 0), its body
 * (fg__module_forward_body) between them. */
fg_tensor *fg__module_forward_wrapped(fg_module *m, fg_tensor *x);

/* Empty init (fg_module_set_empty_init): this thread's setting; whether
 * m's tree was made under it and is not initialised yet; initialising all
 * of it (and zeroing the gradients); initialising only elements [lo, hi)
 * of the flat parameters from `seed`, bitwise that part of a whole
 * initialisation (a sharding strategy's shard: the rest stays untouched,
 * the gradients are the strategy's to zero). */
extern _Thread_local bool fg__tl_empty_init;
bool fg__module_deferred(const fg_module *m);
FG_MUST_USE fg_status fg__module_materialize(fg_module *m);
void fg__module_init_elements(fg_module *m, int64_t lo, int64_t hi, uint64_t seed);

/* Kinds of the built-ins. */
extern const char fg__kind_dropout[], fg__kind_gpt[], fg__kind_mlp[], fg__kind_sequential[];

/* Dropout's state (the ud of a Dropout module). */
typedef struct fg__dropout_state {
    double p;
    uint64_t seed;
    _Atomic uint64_t offset;
} fg__dropout_state;

/* Seeds the Dropout modules of a finalized tree from `seed`. */
void fg__seed_dropouts(fg_module *m, uint64_t seed);

/* A model's dtype: FG_F32 (also FG_DTYPE_DEFAULT) or FG_F64; else an error naming `what`. */
FG_MUST_USE fg_status fg__model_dtype(fg_dtype dt, const char *what, fg_dtype *out);

/* rnn.c, for tests: the LSTM's and the GRU's path, "auto" (the fused node where it
 * exists, and fg__rnn_forward_embedded's table) or "composed" (the
 * recorded ops step by step, the path of every other device and of
 * autocast, and no table); FG_EINVAL for another name. Between forwards,
 * not thread-safe against one running. */
FG_MUST_USE fg_status fg__rnn_set_path(const char *mode);

/* rnn.c: rnn's forward (an LSTM or GRU module) on the output of emb (an
 * Embedding) at idx, with the first layer's input projection taken from
 * the projected table (emb's weight W_ih^T + b_ih, V rows) at the indices
 * rather than from the embedded rows (T N of them): the same sums, fewer
 * when V < T N. *applied is false (and NULL returned, no error set) where
 * that does not hold or the two modules are not plain (checkpointed, emb
 * a wrapped unit of a sharding strategy, autocast on, idx not 2-D i32):
 * the caller then runs the two forwards. fg_lstm_lm_new's forward. */
fg_tensor *fg__rnn_forward_embedded(fg_module *m, fg_module *emb, fg_tensor *idx, bool *applied);

#endif
