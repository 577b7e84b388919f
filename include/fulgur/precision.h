/* fulgur precision: Lightning's six precision settings, the one table that
 * says what each means (parameter, compute, gradient and optimizer-state
 * dtypes, master weights, loss scaling), autocast regions, and the loss
 * scaler of 16-mixed (PyTorch's GradScaler).
 *
 *   setting (alias)     parameters  autocast  gradients    optimizer state
 *   64-true (64)        f64         off       f64          f64
 *   32-true (32)        f32         off       f32          f32
 *   bf16-mixed (bf16)   f32 master  bf16      f32          f32
 *   16-mixed (16)       f32 master  f16       f32, scaled  f32
 *   bf16-true           bf16        bf16      bf16         f32
 *   16-true             f16         f16       f16          f32
 *
 * Autocast (autograd.h, fg_autocast_set) is what the mixed settings run
 * their forward under: matrix products, linear layers and attention run in
 * the low dtype and return it; layer norm, softmax, log-softmax,
 * cross-entropy, reductions and the optimizer step stay in f32. The true
 * settings make the model in the low dtype instead (no autocast), with the
 * optimizer's state in f32. docs/precision.md has the list and what each
 * CPU gets.
 *
 * Most programs use this through the fabric (fabric.h: the precision
 * setting, fg_fabric_autocast_begin, fg_fabric_optimizer_step), which
 * holds the scaler. */
#ifndef FULGUR_PRECISION_H
#define FULGUR_PRECISION_H

#include "fulgur/kinds.h"
#include "fulgur/strategy.h"

#ifdef __cplusplus
extern "C" {
#endif

/* fg_precision_kind, its policy (fg_precision_policy_of), names and parsing
 * are in kinds.h, the table every layer asks. */

/* Which kernel paths setting p takes in this process, one line for
 * `fulgur env`: "f32 products", "f64 products", "bf16 products:
 * onednn-bf16 (avx512_core_bf16); bf16 activations, conversions
 * avx512_bf16 (f32 kernels between)" (fg_matmul_bf16_path,
 * fg_ops_lowp_path), "f16-rounded operands, f32 products (...); f16
 * activations, conversions ...", each prefixed by "bf16 parameters and
 * gradients, f32 optimizer state; " for the true settings. Thread-safe; the string is the calling
 * thread's, valid until its next call. */
FG_API const char *fg_precision_kernel_path(fg_precision_kind p);

/* ------------------------------------------------------------ loss scaler */

/* PyTorch's GradScaler. All-zero means its defaults. */
typedef struct fg_scaler_opts {
    double init_scale;       /* > 0; 0 means 65536 (2^16) */
    double growth_factor;    /* > 1; 0 means 2 */
    double backoff_factor;   /* in (0, 1); 0 means 0.5 */
    int64_t growth_interval; /* > 0; 0 means 2000 clean steps */
} fg_scaler_opts;

typedef struct fg_scaler fg_scaler;

/* A new scaler at init_scale. NULL opts means the defaults. NULL with
 * FG_EINVAL naming a bad option, or FG_ENOMEM. */
FG_API fg_scaler *fg_scaler_new(const fg_scaler_opts *o);
FG_API void fg_scaler_free(fg_scaler *s); /* NULL is a no-op */

/* The factor the loss is multiplied by before backward. */
FG_API double fg_scaler_scale(const fg_scaler *s);

/* Divides m's gradients by the scale and checks them for inf and NaN;
 * with comm (may be NULL), the finding is agreed over every rank by one
 * allreduce of one float, so that all ranks skip the step together
 * (collective then). Call it before clipping; a second call before the
 * step does nothing (as PyTorch's unscale_). Errors: FG_EINVAL (NULL),
 * FG_EUNSUPPORTED (gradients neither f32 nor f64), the allreduce's. */
FG_API FG_MUST_USE fg_status fg_scaler_unscale(fg_scaler *s, fg_module *m, fg_comm *comm);

/* scaler.step(opt) then scaler.update(): unscales opt's module's gradients
 * if fg_scaler_unscale has not, then either steps opt (all gradients
 * finite on every rank) or skips the step (the optimizer is untouched: no
 * step count, no state), and updates the scale: x backoff_factor after a
 * skip, x growth_factor after growth_interval clean steps in a row. A skip
 * is logged (FG_LOG_WARN, naming a rank that found it and the new scale).
 * *stepped (may be NULL) says which. Collective with comm. Errors: those of
 * fg_scaler_unscale and fg_optimizer_step. */
FG_API FG_MUST_USE fg_status fg_scaler_step(fg_scaler *s, fg_optimizer *opt, fg_comm *comm,
                                            bool *stepped);

/* The state a checkpoint holds: restoring it continues the same scales. */
typedef struct fg_scaler_state {
    double scale;
    int64_t growth_tracker; /* clean steps since the last change of the scale */
    int64_t skipped;        /* steps skipped so far */
} fg_scaler_state;

FG_API fg_scaler_state fg_scaler_get_state(const fg_scaler *s);
/* FG_EINVAL for a scale that is not finite and > 0, or negative counts. */
FG_API FG_MUST_USE fg_status fg_scaler_set_state(fg_scaler *s, const fg_scaler_state *st);

#ifdef __cplusplus
}
#endif
#endif
