/* comm_bench: collective bandwidth and latency, nccl-tests style.
 *
 *   comm_bench --backend shm --ranks 2 [--op allreduce] [--min 8] [--max 256M] [--json]
 *   mpirun -np 2 comm_bench --backend mpi        (Open MPI's own MPI_Allreduce)
 *   mpirun -np 2 comm_bench --backend fulgur-mpi (fulgur's mpi backend)
 *   comm_bench --backend memcpy --ranks 2        (memory bandwidth: N processes copying at once)
 *
 * shm forks its ranks itself (or uses the rank variables when launched by a
 * launcher). Sizes go up by factors of two. For each size: a warm-up, then
 * enough iterations for about --time seconds (rank 0 decides, everyone
 * follows); the time is the slowest rank's. algbw = bytes / time; busbw =
 * algbw * 2 (n-1) / n for allreduce, (n-1)/n for reduce_scatter and
 * allgather, 1 for broadcast (nccl-tests' definitions); bytes is the whole
 * buffer (allgather's output, reduce_scatter's input). f32 sums. Prints a table, or with --json one object per line:
 * {"op","backend","ranks","bytes","time_us","algbw","busbw"} (GB/s = 1e9 B/s). */
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
} opts;

static size_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (*end == 'K' || *end == 'k') v *= 1024;
    else if (*end == 'M' || *end == 'm') v *= 1048576;
    else if (*end == 'G' || *end == 'g') v *= 1073741824.0;
    return (size_t)v;
}

static void emit(const opts *o, int ranks, size_t bytes, double t) {
    double algbw = (double)bytes / t / 1e9;
    double busbw = algbw * (ranks > 1 ? 2.0 * (ranks - 1) / ranks : 1.0);
    if (!strcmp(o->op, "reduce_scatter") || !strcmp(o->op, "allgather"))
        busbw = algbw * (ranks - 1) / ranks;
    if (!strcmp(o->backend, "memcpy") || !strcmp(o->op, "broadcast")) busbw = algbw;
    if (o->json)
        printf("{\"op\": \"%s\", \"backend\": \"%s\", \"ranks\": %d, \"bytes\": %zu, \"time_us\": %.3f, "
               "\"algbw\": %.4f, \"busbw\": %.4f}\n",
               o->op, o->backend, ranks, bytes, t * 1e6, algbw, busbw);
    else
        printf("%-8s %-6s %5d %12zu %12.2f %9.3f %9.3f\n", o->op, o->backend, ranks, bytes, t * 1e6,
               algbw, busbw);
    fflush(stdout);
}

static void header(const opts *o) {
    if (!o->json)
        printf("%-8s %-6s %5s %12s %12s %9s %9s\n", "op", "backend", "ranks", "bytes", "time_us",
               "algbw", "busbw");
}

/* ------------------------------------------------------------------ shm */

/* One backend behind a few calls, so that fulgur and MPI share the timing
 * loop. `run` does the measured operation on a buffer of n floats in all
 * (per rank n/size for the blocked ones). */
typedef struct {
    int (*allreduce)(void *ctx, float *send, float *recv, size_t n);
    int (*run)(void *ctx, float *send, float *recv, size_t n);
    int (*bcast_int)(void *ctx, long *v);
    int (*max_double)(void *ctx, double *v);
    int (*barrier)(void *ctx);
    void *ctx;
    int rank, size;
} runner;

static int fg_ar(void *c, float *s, float *r, size_t n) {
    fg_status st = fg_comm_allreduce(c, s, r, (int64_t)n, FG_F32, FG_SUM);
    if (st) fprintf(stderr, "comm_bench: %s\n", fg_last_error());
    return st != FG_OK;
}
static int fg_rs(void *c, float *s, float *r, size_t n) {
    int64_t k = (int64_t)n / fg_comm_size(c);
    fg_status st = fg_comm_reduce_scatter(c, s, r, k ? k : 1, FG_F32, FG_SUM);
    if (st) fprintf(stderr, "comm_bench: %s\n", fg_last_error());
    return st != FG_OK;
}
static int fg_ag(void *c, float *s, float *r, size_t n) {
    int64_t k = (int64_t)n / fg_comm_size(c);
    fg_status st = fg_comm_allgather(c, s, r, k ? k : 1, FG_F32);
    if (st) fprintf(stderr, "comm_bench: %s\n", fg_last_error());
    return st != FG_OK;
}
static int fg_bcast(void *c, float *s, float *r, size_t n) {
    fg_status st = fg_comm_broadcast(c, s, r, (int64_t)n, FG_F32, 0);
    if (st) fprintf(stderr, "comm_bench: %s\n", fg_last_error());
    return st != FG_OK;
}
static int fg_bc(void *c, long *v) { return fg_comm_broadcast(c, v, v, 1, FG_I64, 0) != FG_OK; }
static int fg_mx(void *c, double *v) { return fg_comm_allreduce(c, v, v, 1, FG_F64, FG_MAX) != FG_OK; }
static int fg_bar(void *c) { return fg_comm_barrier(c) != FG_OK; }

static int time_sizes(const opts *o, runner *r) {
    size_t maxn = o->max / 4 + 64;
    float *send = aligned_alloc(4096, (maxn * 4 + 4095) / 4096 * 4096);
    float *recv = aligned_alloc(4096, (maxn * 4 + 4095) / 4096 * 4096);
    if (!send || !recv) {
        fprintf(stderr, "comm_bench: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < maxn; i++) send[i] = recv[i] = (float)(i % 13);
    if (r->rank == 0) header(o);
    /* warm up: let the scheduler settle the ranks on the cores */
    for (int i = 0; i < 5000; i++)
        if (r->allreduce(r->ctx, send, recv, 2)) return 1;
    if (r->barrier(r->ctx)) return 1;
    for (size_t bytes = o->min; bytes <= o->max; bytes *= 2) {
        size_t n = bytes / 4 ? bytes / 4 : 1;
        /* warm up (first touch, caches), estimate, agree on the iterations */
        double t0 = fg_time();
        if (r->run(r->ctx, send, recv, n) || r->run(r->ctx, send, recv, n)) return 1;
        double est = (fg_time() - t0) / 2;
        if (r->max_double(r->ctx, &est)) return 1;
        long iters = (long)(o->time_s / (est > 1e-7 ? est : 1e-7));
        if (iters < 3) iters = 3;
        if (iters > 200000) iters = 200000;
        if (r->bcast_int(r->ctx, &iters)) return 1;
        if (r->barrier(r->ctx)) return 1;
        t0 = fg_time();
        for (long i = 0; i < iters; i++)
            if (r->run(r->ctx, send, recv, n)) return 1;
        double t = (fg_time() - t0) / (double)iters;
        if (r->max_double(r->ctx, &t)) return 1;
        if (r->rank == 0) emit(o, r->size, n * 4, t);
    }
    free(send);
    free(recv);
    return 0;
}

static int shm_rank(const opts *o, const fg_cluster_info *info) {
    fg_comm *c;
    fg_comm_opts co = {.backend = FG_COMM_SHM};
    if (fg_comm_init(info, &co, &c) != FG_OK) {
        fprintf(stderr, "comm_bench: %s\n", fg_last_error());
        return 1;
    }
    runner r = {fg_ar, fg_ar, fg_bc, fg_mx, fg_bar, c, fg_comm_rank(c), fg_comm_size(c)};
    if (!strcmp(o->op, "reduce_scatter")) r.run = fg_rs;
    if (!strcmp(o->op, "allgather")) r.run = fg_ag;
    if (!strcmp(o->op, "broadcast")) r.run = fg_bcast;
    int rc = time_sizes(o, &r);
    fg_comm_free(c);
    return rc;
}

/* fulgur's mpi backend, under mpirun */
static int run_fgmpi(const opts *o) {
    fg_comm *c;
    fg_comm_opts co = {.backend = FG_COMM_MPI};
    if (fg_comm_init(NULL, &co, &c) != FG_OK) {
        fprintf(stderr, "comm_bench: %s\n", fg_last_error());
        return 1;
    }
    if (fg_comm_rank(c) != 0) {
        FILE *devnull = freopen("/dev/null", "w", stdout);
        (void)devnull;
    }
    runner r = {fg_ar, fg_ar, fg_bc, fg_mx, fg_bar, c, fg_comm_rank(c), fg_comm_size(c)};
    if (!strcmp(o->op, "reduce_scatter")) r.run = fg_rs;
    if (!strcmp(o->op, "allgather")) r.run = fg_ag;
    if (!strcmp(o->op, "broadcast")) r.run = fg_bcast;
    int rc = time_sizes(o, &r);
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
            fg_cluster_info mine = {.rank = r, .world_size = n, .local_rank = r,
                                    .local_world_size = n, .node_rank = 0, .num_nodes = 1,
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
static int mpi_ar(void *c, float *s, float *r, size_t n) {
    return MPI_Allreduce(s, r, (int)n, MPI_FLOAT, MPI_SUM, *(MPI_Comm *)c) != MPI_SUCCESS;
}
static int mpi_rs(void *c, float *s, float *r, size_t n) {
    int size;
    MPI_Comm_size(*(MPI_Comm *)c, &size);
    int k = (int)(n / (size_t)size);
    return MPI_Reduce_scatter_block(s, r, k ? k : 1, MPI_FLOAT, MPI_SUM, *(MPI_Comm *)c) != MPI_SUCCESS;
}
static int mpi_ag(void *c, float *s, float *r, size_t n) {
    int size;
    MPI_Comm_size(*(MPI_Comm *)c, &size);
    int k = (int)(n / (size_t)size);
    return MPI_Allgather(s, k ? k : 1, MPI_FLOAT, r, k ? k : 1, MPI_FLOAT, *(MPI_Comm *)c) != MPI_SUCCESS;
}
static int mpi_bcast(void *c, float *s, float *r, size_t n) {
    (void)r;
    return MPI_Bcast(s, (int)n, MPI_FLOAT, 0, *(MPI_Comm *)c) != MPI_SUCCESS;
}
static int mpi_bc(void *c, long *v) { return MPI_Bcast(v, 1, MPI_LONG, 0, *(MPI_Comm *)c) != MPI_SUCCESS; }
static int mpi_mx(void *c, double *v) {
    return MPI_Allreduce(MPI_IN_PLACE, v, 1, MPI_DOUBLE, MPI_MAX, *(MPI_Comm *)c) != MPI_SUCCESS;
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
    runner r = {mpi_ar, mpi_ar, mpi_bc, mpi_mx, mpi_bar, &comm, rank, size};
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
 * process (what one rank can stream while the others do too). */
static int run_memcpy(const opts *o) {
    int n = o->ranks;
    volatile int *flag = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    double *times = (double *)(flag + 16);
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
                memset(a, 1, bytes);
                memset(b, 2, bytes);
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
                _exit(0);
            }
        }
        for (int r = 0; r < n; r++) waitpid(pids[r], NULL, 0);
        flag[1] = 0;
        double worst = 0;
        for (int r = 0; r < n; r++) worst = times[r] > worst ? times[r] : worst;
        emit(o, n, bytes, worst);
    }
    return 0;
}

int main(int argc, char **argv) {
    opts o = {.backend = "shm", .ranks = 2, .min = 8, .max = 256u << 20, .time_s = 0.2,
              .op = "allreduce"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) o.json = true;
        else if (!strcmp(a, "--backend") && v) o.backend = argv[++i];
        else if (!strcmp(a, "--ranks") && v) o.ranks = atoi(argv[++i]);
        else if (!strcmp(a, "--min") && v) o.min = parse_size(argv[++i]);
        else if (!strcmp(a, "--max") && v) o.max = parse_size(argv[++i]);
        else if (!strcmp(a, "--time") && v) o.time_s = atof(argv[++i]);
        else if (!strcmp(a, "--op") && v) o.op = argv[++i];
        else {
            fprintf(stderr,
                    "usage: comm_bench [--backend shm|mpi|fulgur-mpi|memcpy] [--ranks N] "
                    "[--op allreduce|reduce_scatter|allgather|broadcast] [--min BYTES] "
                    "[--max BYTES] [--time SECONDS_PER_SIZE] [--json]\n");
            return 2;
        }
    }
    if (strcmp(o.op, "allreduce") && strcmp(o.op, "reduce_scatter") && strcmp(o.op, "allgather") &&
        strcmp(o.op, "broadcast")) {
        fprintf(stderr, "comm_bench: unknown --op %s\n", o.op);
        return 2;
    }
    if (o.ranks < 1 || o.ranks > 64 || o.min < 4 || o.max < o.min) {
        fprintf(stderr, "comm_bench: bad --ranks/--min/--max\n");
        return 2;
    }
    if (!strcmp(o.backend, "shm")) return run_shm(&o);
    if (!strcmp(o.backend, "memcpy")) {
        o.op = "memcpy";
        return run_memcpy(&o);
    }
    if (!strcmp(o.backend, "fulgur-mpi")) return run_fgmpi(&o);
    if (!strcmp(o.backend, "mpi")) {
#ifdef FULGUR_HAVE_MPI
        return run_mpi(&o);
#else
        fprintf(stderr, "comm_bench: built without MPI\n");
        return 1;
#endif
    }
    fprintf(stderr, "comm_bench: unknown backend %s\n", o.backend);
    return 2;
}
