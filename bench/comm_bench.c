/* comm_bench: collective bandwidth and latency, nccl-tests style, every
 * result checked.
 *
 *   comm_bench [--backend shm] [--ranks 2] [--op allreduce] [--dtype f32] [--redop sum]
 *              [--min 8] [--max 16M] [--time 0.1] [--json]
 *   mpirun -np 2 comm_bench --backend mpi        (Open MPI's own collectives)
 *   mpirun -np 2 comm_bench --backend fulgur-mpi (fulgur's mpi backend)
 *   mpirun -np 4 --host h1:2,h2:2 comm_bench --backend fulgur-hybrid (fulgur's hybrid backend;
 *                                bench/comm --hosts makes the hosts and runs it)
 *   comm_bench --backend memcpy --ranks 2        (memory bandwidth: N processes copying at once)
 *
 * shm forks its ranks itself (or uses the rank variables when launched by a
 * launcher). Sizes go up by factors of two. For each size: a warm-up, then
 * enough iterations for about --time seconds (rank 0 decides, everyone
 * follows); the time is the slowest rank's. algbw = bytes / time; busbw =
 * algbw * 2 (n-1) / n for allreduce, (n-1)/n for reduce_scatter and
 * allgather, 1 for broadcast (nccl-tests' definitions); bytes is the whole
 * buffer (allgather's output, reduce_scatter's input).
 *
 * Checking. Rank r's input element i is v(r, i), an integer drawn from a
 * hash of (r, i) in a range where every sum over up to 64 ranks is exact in
 * the dtype ([-2, 2) for bf16, [-16, 16) for f16, [0, 4) for u8, [0, 1024)
 * for u16, [-2^16, 2^16) for f32, [-2^19, 2^19) for f64, i32 and i64), so
 * the exact result of every element is known: allreduce sum/min/max over r
 * of v(r, i); reduce_scatter the same over rank q's block; allgather
 * v(i / k, i % k); broadcast v(0, i). Before the timed iterations the output
 * is filled with a value no result can take (a call that writes nothing
 * fails); after them each rank compares its whole output, and #wrong is the
 * count of wrong elements over all ranks. A rank with a wrong element names
 * the op, dtype, size, itself and the first wrong element on stderr; the run
 * goes on through the sizes and exits 1.
 *
 * Prints a table, or with --json one object per line:
 * {"op","backend","dtype","redop","ranks","bytes","time_us","algbw","busbw","wrong"}
 * (GB/s = 1e9 B/s). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fulgur/comm.h"

#ifdef FULGUR_HAVE_MPI /* set by CMake when Open MPI is built in */
#include <mpi.h>
#endif

typedef struct {
    const char *backend;
    int ranks;
    size_t min, max;
    bool json;
    double time_s;
    const char *op;
    fg_dtype dt;
    fg_reduce_op redop;
} opts;

/* the dtype and reduction of the run, for the backends' calls */
static fg_dtype g_dt = FG_F32;
static fg_reduce_op g_redop = FG_REDUCE_OP_SUM;

static size_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (*end == 'K' || *end == 'k') v *= 1024;
    else if (*end == 'M' || *end == 'm') v *= 1048576;
    else if (*end == 'G' || *end == 'g') v *= 1073741824.0;
    return (size_t)v;
}

static bool is_blocked(const char *op) {
    return !strcmp(op, "reduce_scatter") || !strcmp(op, "allgather");
}
static bool is_reduction(const char *op) {
    return !strcmp(op, "allreduce") || !strcmp(op, "reduce_scatter");
}

static void emit(const opts *o, int ranks, size_t bytes, double t, long wrong) {
    double algbw = (double)bytes / t / 1e9;
    double busbw = algbw * (ranks > 1 ? 2.0 * (ranks - 1) / ranks : 1.0);
    if (is_blocked(o->op)) busbw = algbw * (ranks - 1) / ranks;
    if (!strcmp(o->backend, "memcpy") || !strcmp(o->op, "broadcast")) busbw = algbw;
    const char *dt = strcmp(o->backend, "memcpy") ? fg_dtype_name(o->dt) : "u8";
    const char *red = is_reduction(o->op) ? fg_reduce_op_name(o->redop) : "none";
    if (o->json)
        printf("{\"op\": \"%s\", \"backend\": \"%s\", \"dtype\": \"%s\", \"redop\": \"%s\", "
               "\"ranks\": %d, \"bytes\": %zu, \"time_us\": %.3f, \"algbw\": %.4f, "
               "\"busbw\": %.4f, \"wrong\": %ld}\n",
               o->op, o->backend, dt, red, ranks, bytes, t * 1e6, algbw, busbw, wrong);
    else
        printf("%-14s %-10s %-5s %-5s %5d %12zu %12.2f %9.3f %9.3f %7ld\n", o->op, o->backend, dt,
               red, ranks, bytes, t * 1e6, algbw, busbw, wrong);
    fflush(stdout);
}

static void header(const opts *o) {
    if (!o->json)
        printf("%-14s %-10s %-5s %-5s %5s %12s %12s %9s %9s %7s\n", "op", "backend", "type",
               "redop", "ranks", "bytes", "time_us", "algbw", "busbw", "#wrong");
}

/* ------------------------------------------------------------ the data */

/* v(r, i) lies in [lo, lo + span) of the dtype (see the top of the file) */
static void value_range(fg_dtype dt, int64_t *lo, int64_t *span) {
    switch (dt) {
    case FG_BF16: *lo = -2, *span = 4; break;
    case FG_F16: *lo = -16, *span = 32; break;
    case FG_U8: *lo = 0, *span = 4; break;
    case FG_U16: *lo = 0, *span = 1024; break;
    case FG_F32: *lo = -(1 << 16), *span = 1 << 17; break;
    default: *lo = -(1 << 19), *span = 1 << 20; break;
    }
}

static int64_t g_lo, g_span; /* value_range of the run's dtype */

static double value(int r, size_t i) {
    uint64_t h =
        ((uint64_t)i + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)r + 1) * 0xC2B2AE3D27D4EB4Full;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    return (double)(g_lo + (int64_t)(h % (uint64_t)g_span));
}

/* The exact output element i of `rank` for op over `size` ranks, with k
 * elements per block for the blocked ops. */
static double expected(const char *op, int rank, int size, size_t i, size_t k) {
    if (!strcmp(op, "broadcast")) return value(0, i);
    if (!strcmp(op, "allgather")) return value((int)(i / k), i % k);
    size_t at = !strcmp(op, "reduce_scatter") ? (size_t)rank * k + i : i;
    double acc = value(0, at);
    for (int q = 1; q < size; q++) {
        double v = value(q, at);
        if (g_redop == FG_REDUCE_OP_SUM) acc += v;
        else if (g_redop == FG_REDUCE_OP_MIN) acc = v < acc ? v : acc;
        else acc = v > acc ? v : acc;
    }
    return acc;
}

#define CHUNK 65536 /* elements converted at a time */

/* dst[0..n) = v(rank, i), in the run's dtype */
static void fill_inputs(void *dst, int rank, size_t n) {
    static double tmp[CHUNK];
    size_t es = fg_dtype_size(g_dt);
    for (size_t at = 0; at < n; at += CHUNK) {
        size_t m = n - at < CHUNK ? n - at : CHUNK;
        for (size_t j = 0; j < m; j++) tmp[j] = value(rank, at + j);
        if (fg_convert((char *)dst + at * es, g_dt, tmp, FG_F64, (int64_t)m) != FG_OK) {
            fprintf(stderr, "comm_bench: %s\n", fg_last_error());
            exit(1);
        }
    }
}

/* The bytes of a value no result can take: above every reachable sum. */
static int poison_byte(void) { return g_dt == FG_U8 || g_dt == FG_U16 ? 0xFF : 0x7F; }

/* Counts the wrong elements of this rank's output (n elements) and names
 * the first on stderr. */
static long check(const opts *o, const void *out, size_t n, size_t k, int rank, int size,
                  size_t bytes) {
    static double got[CHUNK];
    size_t es = fg_dtype_size(g_dt);
    long wrong = 0;
    size_t first = 0;
    double first_got = 0, first_want = 0;
    for (size_t at = 0; at < n; at += CHUNK) {
        size_t m = n - at < CHUNK ? n - at : CHUNK;
        if (fg_convert(got, FG_F64, (const char *)out + at * es, g_dt, (int64_t)m) != FG_OK) {
            fprintf(stderr, "comm_bench: %s\n", fg_last_error());
            exit(1);
        }
        for (size_t j = 0; j < m; j++) {
            double want = expected(o->op, rank, size, at + j, k);
            if (got[j] == want) continue;
            if (wrong++ == 0) first = at + j, first_got = got[j], first_want = want;
        }
    }
    if (wrong)
        fprintf(stderr,
                "comm_bench: %s %s%s%s, %zu bytes, %d ranks: rank %d has %ld of %zu elements "
                "wrong (first: element %zu is %.17g, expected %.17g)\n",
                o->op, fg_dtype_name(g_dt), is_reduction(o->op) ? " " : "",
                is_reduction(o->op) ? fg_reduce_op_name(g_redop) : "", bytes, size, rank, wrong, n,
                first, first_got, first_want);
    return wrong;
}

/* --------------------------------------------------------- the timing */

/* One backend behind a few calls, so that fulgur and MPI share the timing
 * loop. `run` does the measured operation on a buffer of n elements in all
 * (n / size per rank for the blocked ones). A backend whose broadcast works
 * in place on recv (MPI_Bcast) sets bcast_in_place: the root's recv then
 * holds its input. */
typedef struct {
    int (*warm)(void *ctx, void *send, void *recv, size_t n);
    int (*run)(void *ctx, void *send, void *recv, size_t n);
    int (*bcast_long)(void *ctx, long *v);
    int (*max_double)(void *ctx, double *v);
    int (*sum_long)(void *ctx, long *v);
    int (*barrier)(void *ctx);
    void *ctx;
    int rank, size;
    bool bcast_in_place;
} runner;

static int time_sizes(const opts *o, runner *r) {
    size_t es = fg_dtype_size(g_dt);
    size_t maxn = o->max / es + 64;
    size_t cap = (maxn * es + 4095) / 4096 * 4096;
    char *send = aligned_alloc(4096, cap), *recv = aligned_alloc(4096, cap);
    int rc = 1;
    long all_wrong = 0;
    if (!send || !recv) {
        fprintf(stderr, "comm_bench: out of memory\n");
        goto out;
    }
    fill_inputs(send, r->rank, maxn);
    memcpy(recv, send, maxn * es);
    bool root_keeps = r->bcast_in_place && !strcmp(o->op, "broadcast") && r->rank == 0;
    if (r->rank == 0) header(o);
    /* warm up: let the scheduler settle the ranks on the cores */
    for (int i = 0; i < 5000; i++)
        if (r->warm(r->ctx, send, recv, 2)) goto out;
    if (root_keeps) memcpy(recv, send, maxn * es);
    if (r->barrier(r->ctx)) goto out;
    for (size_t bytes = o->min; bytes <= o->max; bytes *= 2) {
        size_t n = bytes / es ? bytes / es : 1, k = 0;
        if (is_blocked(o->op)) {
            k = n / (size_t)r->size ? n / (size_t)r->size : 1;
            n = k * (size_t)r->size;
        }
        /* warm up (first touch, caches), estimate, agree on the iterations */
        double t0 = fg_time();
        if (r->run(r->ctx, send, recv, n) || r->run(r->ctx, send, recv, n)) goto out;
        double est = (fg_time() - t0) / 2;
        if (r->max_double(r->ctx, &est)) goto out;
        long iters = (long)(o->time_s / (est > 1e-7 ? est : 1e-7));
        if (iters < 3) iters = 3;
        if (iters > 200000) iters = 200000;
        if (r->bcast_long(r->ctx, &iters)) goto out;
        size_t nout = !strcmp(o->op, "reduce_scatter") ? k : n;
        if (!root_keeps) memset(recv, poison_byte(), nout * es);
        if (r->barrier(r->ctx)) goto out;
        t0 = fg_time();
        for (long i = 0; i < iters; i++)
            if (r->run(r->ctx, send, recv, n)) goto out;
        double t = (fg_time() - t0) / (double)iters;
        if (r->max_double(r->ctx, &t)) goto out;
        long wrong = check(o, recv, nout, k, r->rank, r->size, n * es);
        if (r->sum_long(r->ctx, &wrong)) goto out;
        all_wrong += wrong;
        if (r->rank == 0) emit(o, r->size, n * es, t, wrong);
    }
    rc = all_wrong != 0;
    if (all_wrong && r->rank == 0)
        fprintf(stderr, "comm_bench: FAILED: %ld wrong elements in all\n", all_wrong);
out:
    free(send);
    free(recv);
    return rc;
}

/* ------------------------------------------------------------- fulgur */

static int fg_failed(fg_status st) {
    if (st) fprintf(stderr, "comm_bench: %s\n", fg_last_error());
    return st != FG_OK;
}
static int fg_ar(void *c, void *s, void *r, size_t n) {
    return fg_failed(fg_comm_allreduce(c, s, r, (int64_t)n, g_dt, g_redop));
}
static int fg_rs(void *c, void *s, void *r, size_t n) {
    int64_t k = (int64_t)n / fg_comm_size(c);
    return fg_failed(fg_comm_reduce_scatter(c, s, r, k, g_dt, g_redop));
}
static int fg_ag(void *c, void *s, void *r, size_t n) {
    int64_t k = (int64_t)n / fg_comm_size(c);
    return fg_failed(fg_comm_allgather(c, s, r, k, g_dt));
}
static int fg_bcast(void *c, void *s, void *r, size_t n) {
    return fg_failed(fg_comm_broadcast(c, s, r, (int64_t)n, g_dt, 0));
}
static int fg_bc(void *c, long *v) { return fg_failed(fg_comm_broadcast(c, v, v, 1, FG_I64, 0)); }
static int fg_mx(void *c, double *v) {
    return fg_failed(fg_comm_allreduce(c, v, v, 1, FG_F64, FG_REDUCE_OP_MAX));
}
static int fg_sum(void *c, long *v) {
    return fg_failed(fg_comm_allreduce(c, v, v, 1, FG_I64, FG_REDUCE_OP_SUM));
}
static int fg_bar(void *c) { return fg_failed(fg_comm_barrier(c)); }

static int fg_time_sizes(const opts *o, fg_comm *c) {
    runner r = {fg_ar,  fg_ar, fg_bc,           fg_mx,           fg_sum,
                fg_bar, c,     fg_comm_rank(c), fg_comm_size(c), false};
    if (!strcmp(o->op, "reduce_scatter")) r.run = fg_rs;
    if (!strcmp(o->op, "allgather")) r.run = fg_ag;
    if (!strcmp(o->op, "broadcast")) r.run = fg_bcast;
    return time_sizes(o, &r);
}

static int shm_rank(const opts *o, const fg_cluster_info *info) {
    fg_comm_opts co = {.backend = FG_COMM_SHM};
    fg_comm *c = fg_comm_new(info, &co);
    if (!c) {
        fprintf(stderr, "comm_bench: %s\n", fg_last_error());
        return 1;
    }
    int rc = fg_time_sizes(o, c);
    fg_comm_free(c);
    return rc;
}

/* fulgur's mpi backend, under mpirun */
static int run_fgmpi(const opts *o, fg_comm_backend_kind kind) {
    fg_comm_opts co = {.backend = kind};
    fg_comm *c = fg_comm_new(NULL, &co);
    if (!c) {
        fprintf(stderr, "comm_bench: %s\n", fg_last_error());
        return 1;
    }
    if (fg_comm_rank(c) != 0) {
        FILE *devnull = freopen("/dev/null", "w", stdout);
        (void)devnull;
    }
    int rc = fg_time_sizes(o, c);
    fg_comm_free(c);
    return rc;
}

static int run_shm(const opts *o) {
    fg_cluster_info info;
    if (fg_cluster_detect(&info) != FG_OK) {
        fprintf(stderr, "comm_bench: %s\n", fg_last_error());
        return 1;
    }
    if (strcmp(info.source, "none") != 0) return shm_rank(o, &info); /* launched by a launcher */
    pid_t pids[256];
    int n = o->ranks;
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            fg_cluster_info mine = {.rank = r,
                                    .world_size = n,
                                    .local_rank = r,
                                    .local_world_size = n,
                                    .node_rank = 0,
                                    .num_nodes = 1,
                                    .source = "comm_bench"};
            snprintf(mine.job_id, sizeof mine.job_id, "bench-%d", (int)getppid());
            if (r != 0) { /* only rank 0 prints */
                FILE *devnull = freopen("/dev/null", "w", stdout);
                (void)devnull;
            }
            _exit(shm_rank(o, &mine));
        }
    }
    int bad = 0;
    for (int r = 0; r < n; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    }
    return bad;
}

/* ------------------------------------------------------------------ mpi */

#ifdef FULGUR_HAVE_MPI
static MPI_Datatype mpi_dtype(void) {
    switch (g_dt) {
    case FG_F64: return MPI_DOUBLE;
    case FG_F32: return MPI_FLOAT;
    case FG_I32: return MPI_INT32_T;
    case FG_I64: return MPI_INT64_T;
    case FG_U8: return MPI_UINT8_T;
    case FG_U16: return MPI_UINT16_T;
    default: return MPI_DATATYPE_NULL; /* bf16, f16: refused in main */
    }
}
static MPI_Op mpi_op(void) {
    return g_redop == FG_REDUCE_OP_MIN ? MPI_MIN : g_redop == FG_REDUCE_OP_MAX ? MPI_MAX : MPI_SUM;
}
static int mpi_ar(void *c, void *s, void *r, size_t n) {
    return MPI_Allreduce(s, r, (int)n, mpi_dtype(), mpi_op(), *(MPI_Comm *)c) != MPI_SUCCESS;
}
static int mpi_rs(void *c, void *s, void *r, size_t n) {
    int size;
    MPI_Comm_size(*(MPI_Comm *)c, &size);
    int k = (int)(n / (size_t)size);
    return MPI_Reduce_scatter_block(s, r, k, mpi_dtype(), mpi_op(), *(MPI_Comm *)c) != MPI_SUCCESS;
}
static int mpi_ag(void *c, void *s, void *r, size_t n) {
    int size;
    MPI_Comm_size(*(MPI_Comm *)c, &size);
    int k = (int)(n / (size_t)size);
    return MPI_Allgather(s, k, mpi_dtype(), r, k, mpi_dtype(), *(MPI_Comm *)c) != MPI_SUCCESS;
}
/* in place on recv (the root's recv holds its input: bcast_in_place) */
static int mpi_bcast(void *c, void *s, void *r, size_t n) {
    (void)s;
    return MPI_Bcast(r, (int)n, mpi_dtype(), 0, *(MPI_Comm *)c) != MPI_SUCCESS;
}
static int mpi_bc(void *c, long *v) {
    return MPI_Bcast(v, 1, MPI_LONG, 0, *(MPI_Comm *)c) != MPI_SUCCESS;
}
static int mpi_mx(void *c, double *v) {
    return MPI_Allreduce(MPI_IN_PLACE, v, 1, MPI_DOUBLE, MPI_MAX, *(MPI_Comm *)c) != MPI_SUCCESS;
}
static int mpi_sum(void *c, long *v) {
    return MPI_Allreduce(MPI_IN_PLACE, v, 1, MPI_LONG, MPI_SUM, *(MPI_Comm *)c) != MPI_SUCCESS;
}
static int mpi_bar(void *c) { return MPI_Barrier(*(MPI_Comm *)c) != MPI_SUCCESS; }

static int run_mpi(const opts *o) {
    MPI_Init(NULL, NULL);
    MPI_Comm comm = MPI_COMM_WORLD;
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    if (rank != 0) {
        FILE *devnull = freopen("/dev/null", "w", stdout);
        (void)devnull;
    }
    runner r = {mpi_ar, mpi_ar, mpi_bc, mpi_mx, mpi_sum, mpi_bar, &comm, rank, size, true};
    if (!strcmp(o->op, "reduce_scatter")) r.run = mpi_rs;
    if (!strcmp(o->op, "allgather")) r.run = mpi_ag;
    if (!strcmp(o->op, "broadcast")) r.run = mpi_bcast;
    int rc = time_sizes(o, &r);
    MPI_Finalize();
    return rc;
}
#endif

/* --------------------------------------------------------------- memcpy */

/* n processes each copy a buffer of `bytes` at the same time (after a
 * shared start flag); the bandwidth is bytes / time of one copy, per
 * process (what one rank can stream while the others do too). #wrong: the
 * bytes of the copy that differ from the source. */
static int run_memcpy(const opts *o) {
    int n = o->ranks;
    volatile int *flag =
        mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    double *times = (double *)(flag + 16);
    volatile long *wrongs = (volatile long *)(times + 64);
    long all_wrong = 0;
    header(o);
    for (size_t bytes = o->min; bytes <= o->max; bytes *= 2) {
        flag[0] = 0;
        __sync_synchronize();
        pid_t pids[64];
        for (int r = 0; r < n; r++) {
            pids[r] = fork();
            if (pids[r] == 0) {
                char *a = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
                char *b = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
                for (size_t i = 0; i < bytes; i++) a[i] = (char)(i * 131 + (size_t)r);
                memset(b, 0, bytes);
                __sync_fetch_and_add(&flag[1 + 0], 1);
                while (flag[1] < n) {
                }
                long iters = 0;
                double t0 = fg_time(), t;
                do {
                    memcpy(b, a, bytes);
                    iters++;
                    t = fg_time() - t0;
                } while (t < o->time_s);
                times[r] = t / (double)iters;
                long wrong = 0;
                if (memcmp(a, b, bytes))
                    for (size_t i = 0; i < bytes; i++) wrong += a[i] != b[i];
                wrongs[r] = wrong;
                _exit(0);
            }
        }
        for (int r = 0; r < n; r++) waitpid(pids[r], NULL, 0);
        flag[1] = 0;
        double worst = 0;
        long wrong = 0;
        for (int r = 0; r < n; r++) {
            worst = times[r] > worst ? times[r] : worst;
            if (wrongs[r])
                fprintf(stderr, "comm_bench: memcpy, %zu bytes: process %d has %ld bytes wrong\n",
                        bytes, r, wrongs[r]);
            wrong += wrongs[r];
        }
        all_wrong += wrong;
        emit(o, n, bytes, worst, wrong);
    }
    return all_wrong != 0;
}

int main(int argc, char **argv) {
    opts o = {.backend = "shm",
              .ranks = 2,
              .min = 8,
              .max = 16u << 20,
              .time_s = 0.1,
              .op = "allreduce",
              .dt = FG_F32,
              .redop = FG_REDUCE_OP_SUM};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) o.json = true;
        else if (!strcmp(a, "--backend") && v) o.backend = argv[++i];
        else if (!strcmp(a, "--ranks") && v) o.ranks = atoi(argv[++i]);
        else if (!strcmp(a, "--min") && v) o.min = parse_size(argv[++i]);
        else if (!strcmp(a, "--max") && v) o.max = parse_size(argv[++i]);
        else if (!strcmp(a, "--time") && v) o.time_s = atof(argv[++i]);
        else if (!strcmp(a, "--op") && v) o.op = argv[++i];
        else if (!strcmp(a, "--dtype") && v) {
            if (fg_dtype_parse(argv[++i], &o.dt) != FG_OK) {
                fprintf(stderr,
                        "comm_bench: --dtype %s: expected f64, f32, bf16, f16, i32, i64, "
                        "u8 or u16\n",
                        argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "--redop") && v) {
            const char *s = argv[++i];
            if (!strcmp(s, "sum")) o.redop = FG_REDUCE_OP_SUM;
            else if (!strcmp(s, "min")) o.redop = FG_REDUCE_OP_MIN;
            else if (!strcmp(s, "max")) o.redop = FG_REDUCE_OP_MAX;
            else {
                fprintf(stderr, "comm_bench: --redop %s: expected sum, min or max\n", s);
                return 2;
            }
        } else {
            fprintf(
                stderr,
                "usage: comm_bench [--backend shm|mpi|fulgur-mpi|fulgur-hybrid|memcpy] [--ranks N] "
                "[--op allreduce|reduce_scatter|allgather|broadcast] "
                "[--dtype f64|f32|bf16|f16|i32|i64|u8|u16] [--redop sum|min|max] "
                "[--min BYTES] [--max BYTES] [--time SECONDS_PER_SIZE] [--json]\n");
            return 2;
        }
    }
    g_dt = o.dt;
    g_redop = o.redop;
    value_range(g_dt, &g_lo, &g_span);
    if (strcmp(o.op, "allreduce") && strcmp(o.op, "reduce_scatter") && strcmp(o.op, "allgather") &&
        strcmp(o.op, "broadcast")) {
        fprintf(stderr, "comm_bench: unknown --op %s\n", o.op);
        return 2;
    }
    if (o.ranks < 1 || o.ranks > 64 || o.min < 1 || o.max < o.min) {
        fprintf(stderr, "comm_bench: bad --ranks/--min/--max (ranks 1..64, 1 <= min <= max)\n");
        return 2;
    }
    if (!strcmp(o.backend, "shm")) return run_shm(&o);
    if (!strcmp(o.backend, "memcpy")) {
        o.op = "memcpy";
        return run_memcpy(&o);
    }
    if (!strcmp(o.backend, "fulgur-mpi")) return run_fgmpi(&o, FG_COMM_MPI);
    if (!strcmp(o.backend, "fulgur-hybrid")) return run_fgmpi(&o, FG_COMM_HYBRID);
    if (!strcmp(o.backend, "mpi")) {
#ifdef FULGUR_HAVE_MPI
        if (o.dt == FG_BF16 || o.dt == FG_F16) {
            fprintf(stderr, "comm_bench: --backend mpi has no %s (MPI has no such type)\n",
                    fg_dtype_name(o.dt));
            return 2;
        }
        return run_mpi(&o);
#else
        fprintf(stderr, "comm_bench: built without MPI\n");
        return 1;
#endif
    }
    fprintf(stderr, "comm_bench: unknown backend %s\n", o.backend);
    return 2;
}
