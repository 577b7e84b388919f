/* Private state of the strategy layer. */
#ifndef FULGUR_STRATEGY_IMPL_H
#define FULGUR_STRATEGY_IMPL_H

#include "ddp_reducer.h"
#include "fulgur/strategy.h"

typedef struct fg_dp_state fg_dp_state;

struct fg_strategy {
    fg_strategy_kind kind;
    fg_comm *comm;
    fg_module *model;
    fg_optimizer *opt;
    bool sync;
    fg_ddp_reducer *reducer; /* ddp */
    fg_dp_state *dp;         /* dp */
};

/* dp.c */
fg_status fg__dp_setup(fg_strategy *s, int threads);
void fg__dp_free(fg_strategy *s);
fg_status fg__dp_step(fg_strategy *s, fg_batch *b, fg_strategy_step_fn fn, void *ud,
                      double *part_losses, int max_parts, int *nparts, double *loss);

#endif
