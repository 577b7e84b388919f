/* bf16 and f16 reductions on values whose sums round: every rank's element
 * i is a half drawn from a counter-based stream in [-4, 4) (most of them
 * with every mantissa bit set to something), so the f32 sum of p of them
 * is not a half and rounds. The expected element is the widened halves
 * summed in f32 in rank order, divided by p in f32 for avg, and rounded to
 * the half once (the core's conversion): what the shm backend computes.
 * mx_halves_exact runs allreduce (in place and not), reduce to the last
 * rank and reduce_scatter (in place and not) of sum and avg on both half
 * dtypes at counts 1, 7, 1023 and 100003 (blocks that do not divide by the
 * ranks) and returns the number of wrong elements, said on stderr. */
#ifndef FULGUR_TEST_COMM_HALVES_H
#define FULGUR_TEST_COMM_HALVES_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fulgur/comm.h"
#include "fulgur/core.h"

static uint16_t hx_value(fg_dtype dt, int r, int64_t i) {
    float x =
        (float)(fg_rng_u32_at(77, (uint64_t)r * 1000003u + (uint64_t)i) % 65536u) / 8192.0f - 4.0f;
    x += (float)(fg_rng_u32_at(78, (uint64_t)r * 1000003u + (uint64_t)i) % 1024u) / 1048576.0f;
    return dt == FG_BF16 ? fg_f32_to_bf16(x) : fg_f32_to_f16(x);
}

static float hx_widen(fg_dtype dt, uint16_t h) {
    return dt == FG_BF16 ? fg_bf16_to_f32(h) : fg_f16_to_f32(h);
}

/* the expected reduction over p ranks of element i */
static uint16_t hx_expect(fg_dtype dt, fg_reduce_op op, int p, int64_t i) {
    float acc = hx_widen(dt, hx_value(dt, 0, i));
    for (int r = 1; r < p; r++) acc += hx_widen(dt, hx_value(dt, r, i));
    if (op == FG_REDUCE_OP_AVG) acc /= (float)p;
    return dt == FG_BF16 ? fg_f32_to_bf16(acc) : fg_f32_to_f16(acc);
}

static long hx_check(const char *what, fg_dtype dt, fg_reduce_op op, int p, const uint16_t *got,
                     int64_t n, int64_t first) {
    long wrong = 0;
    for (int64_t i = 0; i < n; i++) {
        uint16_t want = hx_expect(dt, op, p, first + i);
        if (got[i] != want && wrong++ < 3)
            fprintf(stderr, "  %s %s %s, %lld elements: element %lld is %#06x, want %#06x\n", what,
                    fg_dtype_name(dt), op == FG_REDUCE_OP_AVG ? "avg" : "sum", (long long)n,
                    (long long)(first + i), got[i], want);
    }
    return wrong;
}

static long mx_halves_exact(fg_comm *c) {
    static const int64_t counts[] = {1, 7, 1023, 100003};
    static const fg_dtype dts[] = {FG_BF16, FG_F16};
    static const fg_reduce_op ops[] = {FG_REDUCE_OP_SUM, FG_REDUCE_OP_AVG};
    int me = fg_comm_rank(c), p = fg_comm_size(c);
    long wrong = 0;
    for (int d = 0; d < 2; d++)
        for (int o = 0; o < 2; o++)
            for (int k = 0; k < 4; k++) {
                fg_dtype dt = dts[d];
                fg_reduce_op op = ops[o];
                int64_t n = counts[k];
                uint16_t *x = malloc((size_t)(n * p) * 2), *y = malloc((size_t)(n * p) * 2);
                if (!x || !y) {
                    free(x);
                    free(y);
                    return wrong + 1;
                }
                for (int inplace = 0; inplace < 2; inplace++) {
                    /* allreduce */
                    for (int64_t i = 0; i < n; i++) x[i] = hx_value(dt, me, i);
                    uint16_t *out = inplace ? x : y;
                    if (fg_comm_allreduce(c, x, out, n, dt, op) != FG_OK) {
                        fprintf(stderr, "  allreduce: %s\n", fg_last_error());
                        wrong++;
                    } else wrong += hx_check("allreduce", dt, op, p, out, n, 0);
                    /* reduce to the last rank */
                    for (int64_t i = 0; i < n; i++) x[i] = hx_value(dt, me, i);
                    if (fg_comm_reduce(c, x, out, n, dt, op, p - 1) != FG_OK) {
                        fprintf(stderr, "  reduce: %s\n", fg_last_error());
                        wrong++;
                    } else if (me == p - 1) wrong += hx_check("reduce", dt, op, p, out, n, 0);
                    /* reduce_scatter: block q of the p blocks of n is rank q's */
                    for (int64_t i = 0; i < n * p; i++) x[i] = hx_value(dt, me, i);
                    uint16_t *rs = inplace ? x + (int64_t)me * n : y;
                    if (fg_comm_reduce_scatter(c, x, rs, n, dt, op) != FG_OK) {
                        fprintf(stderr, "  reduce_scatter: %s\n", fg_last_error());
                        wrong++;
                    } else wrong += hx_check("reduce_scatter", dt, op, p, rs, n, (int64_t)me * n);
                }
                free(x);
                free(y);
            }
    return wrong;
}

#endif
