/* The built-in DDP communication hooks: one table entry per fg_ddp_comm_hook
 * (ddp_hooks.c), each hook in its own file (hook_*.c). Private to the strategy
 * layer. */
#ifndef FULGUR_DDP_HOOKS_H
#define FULGUR_DDP_HOOKS_H

#include "strategy_impl.h"

typedef struct fg__ddp_hook_vt {
    const char *name;
    /* Makes the hook's state for strategy s (its model, optimizer and
     * communicator are set; its reducer not yet). NULL state_new: no state. */
    FG_MUST_USE fg_status (*state_new)(fg_strategy *s, const fg_ddp_opts *o, void **state);
    /* After the reducer exists (post_localsgd hangs its averaging on the
     * optimizer here). May be NULL. */
    FG_MUST_USE fg_status (*attach)(fg_strategy *s, void *state);
    void (*state_free)(void *state);
    fg_ddp_hook_fn run;
} fg__ddp_hook_vt;

/* ddp_hooks.c: ddp's hook from its options (checked already) into the reducer
 * options ro, state in s; attach once s->reducer exists; free with s. */
FG_MUST_USE fg_status fg__ddp_hooks_setup(fg_strategy *s, const fg_ddp_opts *o,
                                          fg__ddp_reducer_opts *ro);
FG_MUST_USE fg_status fg__ddp_hooks_attach(fg_strategy *s);
void fg__ddp_hooks_free(fg_strategy *s);

/* The entries of hook_compress.c, hook_powersgd.c, hook_localsgd.c. */
extern const fg__ddp_hook_vt fg__hook_fp16, fg__hook_bf16, fg__hook_powersgd, fg__hook_localsgd;

/* hook_powersgd.c, for the tests: bucket b's error-feedback residual
 * (its numel elements), NULL before the first compressed backward or
 * without powersgd. */
const float *fg__powersgd_residual(const fg_strategy *s, int b);
/* hook_powersgd.c, for the tests: the hook's Gram-Schmidt on the `cols`
 * contiguous columns of length `len` at a (column j at a + j len). */
void fg__powersgd_orthogonalize(float *a, int64_t len, int64_t cols, double eps);

#endif
