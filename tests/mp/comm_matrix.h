/* The correctness matrix of the collectives, in the style of nccl-tests:
 * every operation x dtype x in-place/out-of-place x count x reduce op, on
 * data whose exact result is known, counting wrong elements (want 0).
 *
 * Data: rank r's element i is a small integer, exact in every dtype, and
 * periodic in i (period 68), so that the expected reduction of element i
 * is a table lookup: checking a million elements costs one pass.
 *   sum/avg/min/max: ((7i + 13r) mod 17) - 8   (u8, u16: without the - 8)
 *   prod:            {1, -1, 2, 1}[(3i + r) mod 4]   (u8, u16: {1, 3, 2, 1})
 * so sums stay within +-64 and products within 256 at 8 ranks (exact in
 * bf16 and f16).
 *
 * Counts are per rank for allreduce, broadcast, reduce and send/recv; for
 * the operations whose buffer holds one block per rank (reduce_scatter,
 * allgather(v), alltoall) the largest count is the whole buffer, as
 * nccl-tests does, so memory stays at about a million elements per rank. */
#ifndef FULGUR_TEST_COMM_MATRIX_H
#define FULGUR_TEST_COMM_MATRIX_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fulgur/comm.h"

#define MX_PERIOD 68
#define MX_BIG 1048579

static const int64_t mx_counts[] = {0, 1, 7, 1023, MX_BIG};
static const fg_dtype mx_dtypes[] = {FG_F64, FG_F32, FG_BF16, FG_F16,
                                     FG_I32, FG_I64, FG_U8,   FG_U16};
#define MX_NCOUNTS 5
#define MX_NDTYPES 8

static int64_t mx_value(fg_dtype dt, fg_reduce_op op, int r, int64_t i) {
    if (op == FG_REDUCE_OP_PROD) {
        static const int s[4] = {1, -1, 2, 1}, u[4] = {1, 3, 2, 1};
        int k = (int)((3 * (i % MX_PERIOD) + r) % 4);
        return dt == FG_U8 || dt == FG_U16 ? u[k] : s[k];
    }
    int64_t v = (7 * (i % MX_PERIOD) + 13 * r) % 17;
    return dt == FG_U8 || dt == FG_U16 ? v : v - 8;
}

/* Writes integer v (or, for floats, the value `f`) as element idx. */
static void mx_put(fg_dtype dt, void *buf, int64_t idx, int64_t v) {
    switch (dt) {
    case FG_F64: ((double *)buf)[idx] = (double)v; break;
    case FG_F32: ((float *)buf)[idx] = (float)v; break;
    case FG_BF16: ((uint16_t *)buf)[idx] = fg_f32_to_bf16((float)v); break;
    case FG_F16: ((uint16_t *)buf)[idx] = fg_f32_to_f16((float)v); break;
    case FG_I32: ((int32_t *)buf)[idx] = (int32_t)v; break;
    case FG_I64: ((int64_t *)buf)[idx] = v; break;
    case FG_U8: ((uint8_t *)buf)[idx] = (uint8_t)v; break;
    case FG_U16: ((uint16_t *)buf)[idx] = (uint16_t)v; break;
    default: break;
    }
}

static void mx_fill(fg_dtype dt, fg_reduce_op op, int r, void *buf, int64_t first, int64_t n) {
    size_t esz = fg_dtype_size(dt);
    /* one period, then copies of it */
    int64_t k = n < MX_PERIOD ? n : MX_PERIOD;
    for (int64_t i = 0; i < k; i++) mx_put(dt, buf, i, mx_value(dt, op, r, first + i));
    for (int64_t i = k; i < n; i += k) {
        int64_t m = n - i < k ? n - i : k;
        memcpy((char *)buf + i * (int64_t)esz, buf, (size_t)m * esz);
    }
}

/* Expected reduction over ranks 0..w-1 of element i, i in [0, MX_PERIOD). */
static void mx_expect_table(fg_dtype dt, fg_reduce_op op, int w, void *table) {
    for (int64_t i = 0; i < MX_PERIOD; i++) {
        int64_t acc = mx_value(dt, op, 0, i);
        for (int r = 1; r < w; r++) {
            int64_t x = mx_value(dt, op, r, i);
            switch (op) {
            case FG_REDUCE_OP_SUM:
            case FG_REDUCE_OP_AVG: acc += x; break;
            case FG_REDUCE_OP_PROD: acc *= x; break;
            case FG_REDUCE_OP_MIN: acc = x < acc ? x : acc; break;
            case FG_REDUCE_OP_MAX: acc = x > acc ? x : acc; break;
            default: break;
            }
        }
        if (op == FG_REDUCE_OP_AVG) {
            switch (dt) {
            case FG_F64: ((double *)table)[i] = (double)acc / (double)w; continue;
            case FG_F32: ((float *)table)[i] = (float)acc / (float)w; continue;
            case FG_BF16: ((uint16_t *)table)[i] = fg_f32_to_bf16((float)acc / (float)w); continue;
            case FG_F16: ((uint16_t *)table)[i] = fg_f32_to_f16((float)acc / (float)w); continue;
            case FG_U8: acc = (uint8_t)acc / w; break;
            case FG_U16: acc = (uint16_t)acc / w; break;
            default: acc = acc / w; break;
            }
        }
        mx_put(dt, table, i, acc);
    }
}

/* Counts elements of buf[0..n) that differ from table[(first + i) % P]. */
static int64_t mx_check_table(fg_dtype dt, const void *buf, int64_t first, int64_t n,
                              const void *table) {
    size_t esz = fg_dtype_size(dt);
    int64_t wrong = 0;
    int64_t i = 0;
    /* fast path: whole periods aligned on the table */
    while (i < n && (first + i) % MX_PERIOD) {
        wrong += memcmp((const char *)buf + i * (int64_t)esz,
                        (const char *)table + ((first + i) % MX_PERIOD) * (int64_t)esz, esz) != 0;
        i++;
    }
    for (; i + MX_PERIOD <= n; i += MX_PERIOD)
        if (memcmp((const char *)buf + i * (int64_t)esz, table, MX_PERIOD * esz))
            for (int k = 0; k < MX_PERIOD; k++)
                wrong += memcmp((const char *)buf + (i + k) * (int64_t)esz,
                                (const char *)table + k * (int64_t)esz, esz) != 0;
    for (; i < n; i++)
        wrong += memcmp((const char *)buf + i * (int64_t)esz,
                        (const char *)table + ((first + i) % MX_PERIOD) * (int64_t)esz, esz) != 0;
    return wrong;
}

/* Counts elements of buf[0..n) that differ from rank r's data at first+i. */
static int64_t mx_check_rank(fg_dtype dt, int r, const void *buf, int64_t first, int64_t n) {
    char table[MX_PERIOD * 8];
    for (int64_t i = 0; i < MX_PERIOD; i++)
        mx_put(dt, table, i, mx_value(dt, FG_REDUCE_OP_SUM, r, i));
    return mx_check_table(dt, buf, first, n, table);
}

typedef struct mx_stats {
    long calls, wrong, errors;
} mx_stats;

static void mx_report(mx_stats *st, int rank, const char *what, fg_dtype dt, int64_t count,
                      bool inplace, fg_status s, int64_t wrong) {
    st->calls++;
    if (s != FG_OK) {
        st->errors++;
        fprintf(stderr, "  rank %d: %s %s count %lld %s: %s: %s\n", rank, what, fg_dtype_name(dt),
                (long long)count, inplace ? "in-place" : "out-of-place", fg_status_str(s),
                fg_last_error());
    } else if (wrong) {
        st->wrong += wrong;
        fprintf(stderr, "  rank %d: %s %s count %lld %s: %lld wrong elements\n", rank, what,
                fg_dtype_name(dt), (long long)count, inplace ? "in-place" : "out-of-place",
                (long long)wrong);
    }
}

/* Runs the whole matrix on communicator c (counts up to max_count);
 * returns the statistics. Garbage (0xAB bytes) fills every output first, so
 * an element not written counts as wrong. */
static mx_stats mx_run(fg_comm *c, int64_t max_count) {
    mx_stats st = {0, 0, 0};
    int me = fg_comm_rank(c), w = fg_comm_size(c);
    size_t maxb = (size_t)(MX_BIG + 64 * 16) * 8 + 64;
    char *a = malloc(maxb), *b = malloc(maxb);
    char table[MX_PERIOD * 8];
    if (!a || !b) {
        st.errors++;
        free(a);
        free(b);
        return st;
    }
    for (int ci = 0; ci < MX_NCOUNTS; ci++) {
        int64_t n = mx_counts[ci];
        if (n > max_count) continue;
        bool big = n == MX_BIG;
        int64_t blk = big ? (n + w - 1) / w : n; /* per-rank block of the blocked ops */
        for (int di = 0; di < MX_NDTYPES; di++) {
            fg_dtype dt = mx_dtypes[di];
            size_t esz = fg_dtype_size(dt);
            for (int ip = 0; ip < 2; ip++) {
                bool inpl = ip == 1;
                for (int op = 0; op < FG_REDUCE_OP_COUNT; op++) {
                    fg_reduce_op rop = (fg_reduce_op)op;
                    mx_expect_table(dt, rop, w, table);
                    /* allreduce */
                    mx_fill(dt, rop, me, a, 0, n);
                    memset(b, 0xAB, (size_t)n * esz);
                    char *out = inpl ? a : b;
                    fg_status s = fg_comm_allreduce(c, a, out, n, dt, rop);
                    mx_report(&st, me, fg_reduce_op_name(rop), dt, n, inpl, s,
                              s ? 0 : mx_check_table(dt, out, 0, n, table));
                    /* reduce_scatter: block me of the reduction */
                    mx_fill(dt, rop, me, a, 0, blk * w);
                    memset(b, 0xAB, (size_t)blk * esz);
                    out = inpl ? a + (size_t)me * (size_t)blk * esz : b;
                    s = fg_comm_reduce_scatter(c, a, out, blk, dt, rop);
                    mx_report(&st, me, "reduce_scatter", dt, blk, inpl, s,
                              s ? 0 : mx_check_table(dt, out, (int64_t)me * blk, blk, table));
                    /* reduce to root w/2; the others pass no output */
                    int root = w / 2;
                    mx_fill(dt, rop, me, a, 0, n);
                    memset(b, 0xAB, (size_t)n * esz);
                    out = inpl ? a : b;
                    s = fg_comm_reduce(c, a, me == root || inpl ? out : NULL, n, dt, rop, root);
                    mx_report(&st, me, "reduce", dt, n, inpl, s,
                              s || me != root ? 0 : mx_check_table(dt, out, 0, n, table));
                }
                /* allgather */
                memset(b, 0xAB, (size_t)(blk * w) * esz);
                const char *snd = a;
                if (inpl) snd = b + (size_t)me * (size_t)blk * esz;
                mx_fill(dt, FG_REDUCE_OP_SUM, me, (void *)snd, 0, blk);
                fg_status s = fg_comm_allgather(c, snd, b, blk, dt);
                int64_t wrong = 0;
                for (int q = 0; !s && q < w; q++)
                    wrong += mx_check_rank(dt, q, b + (size_t)q * (size_t)blk * esz, 0, blk);
                mx_report(&st, me, "allgather", dt, blk, inpl, s, wrong);
                /* allgatherv: counts vary (rank 1 gives none); in-place uses gaps */
                int64_t counts[64], displs[64], tot = 0;
                for (int q = 0; q < w; q++) {
                    counts[q] = blk == 0 || q == 1 ? 0 : blk - (q % 3 == 2 && blk > 2 ? 2 : 0);
                    displs[q] = tot + (inpl ? q : 0);
                    tot += counts[q];
                }
                int64_t span = displs[w - 1] + counts[w - 1];
                memset(b, 0xAB, (size_t)span * esz);
                snd = inpl ? b + (size_t)displs[me] * esz : a;
                mx_fill(dt, FG_REDUCE_OP_SUM, me, (void *)snd, 0, counts[me]);
                s = fg_comm_allgatherv(c, snd, counts[me], b, counts, inpl ? displs : NULL, dt);
                wrong = 0;
                for (int q = 0; !s && q < w; q++)
                    wrong += mx_check_rank(dt, q, b + (size_t)displs[q] * esz, 0, counts[q]);
                mx_report(&st, me, "allgatherv", dt, tot, inpl, s, wrong);
                /* broadcast from the last rank */
                int root = w - 1;
                mx_fill(dt, FG_REDUCE_OP_SUM, me, a, 0, n);
                memset(b, 0xAB, (size_t)n * esz);
                char *out = inpl ? a : b;
                s = fg_comm_broadcast(c, a, out, n, dt, root);
                mx_report(&st, me, "broadcast", dt, n, inpl, s,
                          s ? 0 : mx_check_rank(dt, root, out, 0, n));
                /* alltoall: block q of my send goes to rank q */
                mx_fill(dt, FG_REDUCE_OP_SUM, me, a, 0, blk * w);
                memset(b, 0xAB, (size_t)(blk * w) * esz);
                out = inpl ? a : b;
                s = fg_comm_alltoall(c, a, out, blk, dt);
                wrong = 0;
                for (int q = 0; !s && q < w; q++)
                    wrong += mx_check_rank(dt, q, out + (size_t)q * (size_t)blk * esz,
                                           (int64_t)me * blk, blk);
                mx_report(&st, me, "alltoall", dt, blk, inpl, s, wrong);
                /* send/recv around the ring (once per dtype and count) */
                if (w > 1 && !inpl) {
                    int next = (me + 1) % w, prev = (me + w - 1) % w;
                    mx_fill(dt, FG_REDUCE_OP_SUM, me, a, 0, n);
                    memset(b, 0xAB, (size_t)n * esz);
                    if (me % 2 == 0) {
                        s = fg_comm_send(c, a, n, dt, next);
                        if (!s) s = fg_comm_recv(c, b, n, dt, prev);
                    } else {
                        s = fg_comm_recv(c, b, n, dt, prev);
                        if (!s) s = fg_comm_send(c, a, n, dt, next);
                    }
                    mx_report(&st, me, "send/recv", dt, n, false, s,
                              s ? 0 : mx_check_rank(dt, prev, b, 0, n));
                }
            }
        }
    }
    fg_status s = fg_comm_barrier(c);
    mx_report(&st, me, "barrier", FG_U8, 0, false, s, 0);
    free(a);
    free(b);
    return st;
}

#endif
