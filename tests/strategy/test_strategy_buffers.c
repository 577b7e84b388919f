/* The buffers a model registers (register_buffer: fg_module_add_buffer)
 * are rank 0's on every rank after the setup of ddp and bagua, as DDP's
 * constructor broadcasts the module's buffers with its parameters (2 and 3
 * forked ranks on shm). The built-in models have no buffers: their runs
 * are unchanged. */
#include <stdio.h>

#include "fulgur/strategy.h"
#include "harness.h"
#include "mp/mp_join.h"

typedef struct bcase {
    fg_strategy_kind kind;
    char job[64];
} bcase;

static int buf_rank(int rank, int n, void *arg) {
    const bcase *c = arg;
    fg_comm *comm = mp_join_shm(rank, n, c->job, 60);
    if (!comm) return 1;
    fg_module *m = fg_module_new("Net", NULL, NULL, NULL);
    int64_t ws[2] = {2, 3}, bs[1] = {5}, cs[1] = {2};
    int bad = !m || !fg_module_add_param(m, "w", FG_F32, 2, ws, NULL) ||
              !fg_module_add_buffer(m, "running", FG_F32, 1, bs, NULL) ||
              !fg_module_add_buffer(m, "count", FG_F32, 1, cs, NULL) ||
              fg_module_finalize(m) != FG_OK;
    if (bad) {
        fprintf(stderr, "rank %d: %s\n", rank, fg_last_error());
        return 1;
    }
    /* each rank's own buffer values before setup */
    float *run = fg_tensor_data(fg_module_buffer(m, 0));
    float *cnt = fg_tensor_data(fg_module_buffer(m, 1));
    for (int i = 0; i < 5; i++) run[i] = (float)(rank * 10 + i);
    for (int i = 0; i < 2; i++) cnt[i] = (float)rank + 0.5f * (float)i;
    fg_strategy *st = fg_strategy_new(c->kind, comm, m, NULL, NULL, NULL, 0);
    if (!st) {
        fprintf(stderr, "rank %d: %s\n", rank, fg_last_error());
        return 1;
    }
    for (int i = 0; i < 5; i++)
        if (run[i] != (float)i) {
            fprintf(stderr, "rank %d: %s running[%d] = %g, rank 0's %d\n", rank,
                    fg_strategy_kind_name(c->kind), i, run[i], i);
            bad = 1;
        }
    for (int i = 0; i < 2; i++)
        if (cnt[i] != 0.5f * (float)i) {
            fprintf(stderr, "rank %d: count[%d] = %g, rank 0's %g\n", rank, i, cnt[i], 0.5 * i);
            bad = 1;
        }
    /* no rank leaves before every rank has joined and checked (a root of a
     * broadcast may finish first) */
    if (fg_comm_barrier(comm) != FG_OK) bad = 1;
    fg_strategy_free(st);
    fg_module_free(m);
    fg_comm_free(comm);
    return bad;
}

TEST(setup_broadcasts_the_buffers) {
    static const fg_strategy_kind kinds[] = {FG_STRATEGY_DDP, FG_STRATEGY_BAGUA};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (int world = 2; world <= 3; world++) {
            bcase c = {.kind = kinds[k]};
            snprintf(c.job, sizeof c.job, "t-buf-%d-%d-%d", (int)getpid(), (int)k, world);
            CHECK_MSG(fg_test_fork_ranks(world, buf_rank, &c, 60) == 0, "%s on %d ranks",
                      fg_strategy_kind_name(kinds[k]), world);
        }
}
