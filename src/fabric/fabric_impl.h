/* Private state of the fabric layer. */
#ifndef FULGUR_FABRIC_IMPL_H
#define FULGUR_FABRIC_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "core/core_impl.h"
#include "fulgur/fabric.h"

/* The batches' copies to the device (fabric_ops.c): two slots used in
 * turn, each a pinned host buffer and a device buffer of cap bytes (x at
 * 0, y after it, 512-byte aligned). Batch i goes to slot i % 2: its bytes
 * into the pinned buffer once the slot's last copy is done (`copied`),
 * then copied in on the comm stream once the compute stream is past the
 * step that read the slot last (`used`, recorded when the next batch is
 * staged), and the compute stream waits for `copied` before the step
 * reads it. So the copy of batch i + 1 runs on the comm stream while the
 * compute stream still runs step i's work, and a batch's device bytes stay
 * as they are until the batch after the next one is staged. */
typedef struct fg__batch_slot {
    void *host, *devbuf;
    size_t cap;
    fg_event *copied, *used;
    bool live;        /* holds a batch (its step may still read it) */
    fg_tensor *x, *y; /* the headers over devbuf handed out */
} fg__batch_slot;

typedef struct fg__batch_stage {
    fg__batch_slot slot[2];
    int turn;          /* the slot the next batch goes to */
    uint64_t comm_h2d; /* bytes these copies put on the comm stream, all calls */
    uint64_t batches;  /* batches staged */
} fg__batch_stage;

/* Frees the staging buffers (after the device finished with them). */
void fg__fabric_stage_free(fg_fabric *f);

struct fg_fabric {
    fg_fabric_config cfg; /* the strings point into `strings` */
    char *strings[4];     /* copies of accelerator, devices, strategy, precision */
    char *nvme_path;      /* copy of cfg.sharded.nvme_path */
    char *wrap_type;      /* copy of cfg.sharded.wrap_module_type */
    fg_launch_plan plan;  /* fg_fabric_new's, then the one fg_fabric_launch followed */
    fg_dtype dtype;
    uint64_t seed;
    bool seeded;  /* seed_everything was called (or cfg.seed given) */
    bool running; /* inside fg_fabric_launch */
    /* once joined */
    int threads;
    fg_cluster_info info;
    int world_size, global_rank, local_rank, node_rank;
    pthread_mutex_t comm_mu; /* guards comm against the re-exec supervisor's abort */
    fg_comm *comm;
    fg_job *job; /* re-exec: the other local ranks */
    fg_strategy *strategy;
    fg_module *model;
    fg_optimizer *opt;
    bool no_sync;
    /* ddp_spawn/ddp_fork: in a rank, rank 0's state as of its last step; in
     * the parent, what rank 0 sent back */
    bool forked_rank;
    void *spawn_blob;
    size_t spawn_blob_len;
    fg_dtype autocast;        /* fabric_precision.c: the setting's autocast dtype, or off */
    fg_scaler *scaler;        /* 16-mixed's loss scaler, else NULL */
    int64_t scaler_expect;    /* the optimizer's step count the scaler saw last; -1: unknown */
    atomic_int stop_requests; /* fabric_stop.c: fg_fabric_request_stop's count */
    int64_t micro_batch;      /* fabric_determ.c: the loader's batch at setup_global_batch */
    fg_kv *loaded_meta;       /* fabric_ckpt.c: the last load's metadata, one block */
    fg_dev *dev;              /* accelerator guarded: this rank's device, opened at setup */
    fg_fabric_copies copies;  /* host<->device bytes of the training steps */
    int64_t nloaded_meta;
    fg__batch_stage stage; /* fabric_ops.c: the batches' copies in, double-buffered */
};

/* fabric_ops.c: accelerator guarded's device, model and step tensors */
/* deepspeed_stage_3 with offload_params_device nvme on one rank, or with
 * cpu on a device (as fsdp's cpu_offload, but under NO_SHARD): stage 3
 * runs on a group of one (ZeRO-Infinity on a single device), the model
 * never whole in memory. */
bool fg__fabric_one_rank_stage3(const fg_fabric *f);
FG_MUST_USE fg_status fg__fabric_to_device(fg_fabric *f, fg_strategy_kind kind, fg_module *model,
                                           fg_optimizer *opt);

/* config.c: the plan for f's configuration in this environment (or the
 * custom cluster's). */
FG_MUST_USE fg_status fg__fabric_plan(fg_fabric *f, fg_launch_plan *out);

/* ds_config.c: cfg.deepspeed_config read into f's strategy name and
 * sharded options (fg_fabric_new). */
FG_MUST_USE fg_status fg__fabric_apply_deepspeed_config(fg_fabric *f);
/* fabric_determ.c: what a micro-batch's gradient must not depend on, pinned
 * for the process (the matrix product engine) */
FG_MUST_USE fg_status fg__fabric_deterministic_pin(fg_fabric *f);

/* fabric_launch.c: ddp_spawn's copy of rank 0's state at the end of each step */
void fg__spawn_snapshot(fg_fabric *f);

/* fabric_precision.c: the precision plugin. _init sets dtype, autocast and
 * the scaler from the plan (fg_fabric_new); _check refuses a backward after
 * an optimizer step that bypassed the scaler; _scale_loss multiplies a loss
 * by the scale (the loss itself without a scaler); _unscale before
 * clipping; _save/_load put the scaler's state in a checkpoint's metadata. */
FG_MUST_USE fg_status fg__fabric_precision_init(fg_fabric *f);
FG_MUST_USE fg_status fg__fabric_scaler_check(fg_fabric *f);
fg_tensor *fg__fabric_scale_loss(fg_fabric *f, fg_tensor *loss);
FG_MUST_USE fg_status fg__fabric_scaler_unscale(fg_fabric *f);
FG_MUST_USE fg_status fg__fabric_scaler_save(fg_fabric *f, fg_st_writer *w);
/* fabric_meta.c: a checkpoint's counters, every one checked (type, range,
 * agreement) before a load changes anything; FG_EFORMAT naming the file,
 * the key and the value. Absent keys: 0, samples_in_epoch -1, no seed, lr
 * or scaler. */
typedef struct fg__ckpt_counters {
    int64_t step, epoch, batch_in_epoch, optimizer_steps, world_size; /* world_size 0: absent */
    int64_t samples_in_epoch, global_batch;
    int64_t micro_batch; /* deterministic runs: the batch of each micro-batch; 0: absent */
    uint64_t seed;
    bool has_seed, has_lr, has_scaler;
    double lr, loss_scale;
    int64_t growth_tracker, skipped;
} fg__ckpt_counters;
FG_MUST_USE fg_status fg__fabric_meta_read(const fg_st_file *file, const char *path,
                                           fg__ckpt_counters *c);
FG_MUST_USE fg_status fg__fabric_scaler_load(fg_fabric *f, const fg__ckpt_counters *c);

/* fabric_shard.c: when the ranks' optimizers hold shards of their state
 * (a sharding strategy), whole copies of opt's state buffers on rank 0 in
 * full[0 .. nstates) (collective; NULL entries on the other ranks, and on
 * every rank when no state is sharded); fg__fabric_free_states frees them. */
#define FG_FABRIC_MAX_STATES 8
FG_MUST_USE fg_status fg__fabric_gather_states(fg_fabric *f, fg_optimizer *opt, fg_tensor **full);
void fg__fabric_free_states(fg_tensor **full, int n);

/* fabric_shard.c: what this rank holds of the flat layout of st's model,
 * the one place the checkpoint code asks: elements [plo, phi) of the
 * parameters at `params` (its element plo; today every strategy holds them
 * whole, [0, numel), a strategy that shards the parameters gives its range
 * here) and elements [slo, shi) of each optimizer state at states[k]
 * (the optimizer's range: its shard under a sharding strategy). Not
 * collective. */
typedef struct fg__held {
    int64_t numel;
    fg_dtype pdt, sdt;
    int64_t plo, phi;
    char *params;
    int nstates;
    int64_t slo, shi;
    char *states[FG_FABRIC_MAX_STATES];
    /* the devices of params and states when the host cannot touch them
     * (else NULL): a save copies or stages them out */
    fg_dev *pdev, *sdev;
} fg__held;
FG_MUST_USE fg_status fg__fabric_held(fg_fabric *f, const fg_train_state *st, fg__held *h);

/* fabric_ckpt.c: the checkpoint's metadata (the fabric's keys, the loss
 * scaler's, st->meta after checking it) into w. */
FG_MUST_USE fg_status fg__fabric_ckpt_meta(fg_fabric *f, const fg_train_state *st, fg_st_writer *w);

/* fabric_save_sharded.c: fg_fabric_save with state_dict_type sharded: a
 * folder `path` of one safetensors file per rank holding tensors and the
 * index (collective). */
FG_MUST_USE fg_status fg__fabric_save_sharded(fg_fabric *f, const char *path,
                                              const fg_train_state *st);

/* fabric_save_stream.c: fg_fabric_save of one file, streamed from the
 * ranks' shards a window at a time (collective). fabric_ckpt.c:
 * the same file made by gathering every shard on rank 0 first, the
 * reference the streamed one equals byte for byte. */
FG_MUST_USE fg_status fg__fabric_save_streamed(fg_fabric *f, const char *path,
                                               const fg_train_state *st);
FG_MUST_USE fg_status fg__fabric_save_gathered(fg_fabric *f, const char *path,
                                               const fg_train_state *st);

/* fabric_params.c: when the strategy shards model's parameters (stage 3),
 * a whole copy of them on rank 0 in *full (collective; NULL on the other
 * ranks, and everywhere when they are not sharded); and the range of them
 * this rank holds ([0, numel) unless they are sharded), for
 * fg__fabric_held. */
FG_MUST_USE fg_status fg__fabric_gather_params(fg_fabric *f, fg_module *m, fg_tensor **full);
void fg__fabric_param_range(fg_fabric *f, fg_module *m, int64_t *lo, int64_t *hi);
/* Where this rank's range of model's parameters lives, at element lo: the
 * flat buffer, or under stage 3 with nvme parameter offload the file's
 * mapping (fg_strategy_param_data). */
char *fg__fabric_param_data(fg_fabric *f, fg_module *m, int64_t lo);

#endif
