/* Which engine runs each single f32 matrix product, chosen per CPU and per
 * shape class by measurement.
 *
 * OpenBLAS's sgemm and oneDNN's f32 matmul each win somewhere, and no fixed
 * rule holds across CPUs: with AVX-512 oneDNN's brgemm kernels beat
 * OpenBLAS by a few percent (by 2x when OpenBLAS runs its Haswell kernels,
 * as OPENBLAS_CORETYPE=Haswell makes it); with AVX-512 hidden (AVX2 + FMA
 * only) OpenBLAS wins by 10-35%; on small products oneDNN's set-up per call
 * loses to both. So each process measures.
 *
 * A class is (transposes, accumulating or not, size band of M*N*K, K > N or
 * not). The first product of a class not seen before calibrates it:
 * scratch operands of that product's shape (M, then N and K, cut down to at
 * most CAL_MACS) run on every candidate -- OpenBLAS and oneDNN on the
 * threads kernels use now, and for products below 16M multiply-adds on more
 * than one thread, each on one thread too -- interleaved, best of
 * CAL_ROUNDS. The fastest wins, but a candidate displaces an earlier one
 * (in that order) only when it is faster by MARGIN, so that near ties come
 * out the same run after run. A candidate that would displace OpenBLAS on
 * all the threads must win again after CONFIRM_ROUNDS more rounds (each
 * candidate keeping its best of all): on a machine other jobs share, one
 * side's few timed runs can all fall in other processes' time slices (an
 * AVX2 calibration file of the development machine had OpenBLAS at 28-49
 * GFLOP/s on one thread in 3 of its 33 classes, where it runs at 120-135,
 * and those classes had gone to oneDNN), and a choice is kept on disk. The
 * user's data is never touched; a class costs 2-30 ms (up to 3x that when
 * confirmed), a GPT's dozen classes about 0.1 s.
 *
 * A class keeps its engine whatever the thread count does later (threads.c
 * lowers it while other processes hold cores), so the load never moves a
 * class to the other engine. The thread count itself can change a
 * product's bits (OpenBLAS splits some shapes differently on 1 and 2
 * threads); where bits must repeat, the thread count is pinned
 * (fg__threads_pin, the deterministic mode).
 *
 * Products below MIN_MACS go to OpenBLAS without a measurement: there
 * oneDNN's set-up alone (a primitive descriptor per call) costs about as
 * much as the product.
 *
 * The choices live for the process and, unless FULGUR_GEMM_CACHE=off, in a
 * file named by a hash of what they depend on (CPU model and ISA flags,
 * OpenBLAS's configuration and kernel core, oneDNN's version and ISA, this
 * file's format). Processes of one machine agree: a new class is decided
 * under a lock on the file's folder, after reading the file again, so the
 * ranks of a job (and a resumed run) take the choice the first one made,
 * and runs stay bit for bit repeatable. A file that fails any check
 * (header, key, any line, the checksum) is ignored whole, never trusted,
 * and rewritten at the next calibration. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blas.h"
#include "cpu_impl.h"
#include "pick_file.h"

/* FULGUR_GEMM = auto | openblas | onednn: which engine runs single f32
 * products. auto (the default, also when unset or empty): measured per
 * shape class. openblas / onednn: always that engine (onednn: every single
 * product, however small; an error where the build has no oneDNN). Read
 * once, at the first product. */
#define MODE_ENV "FULGUR_GEMM"
/* The calibration file's folder (FULGUR_GEMM_CACHE, or off), its checks
 * and its lock: pick_file.h, which conv_pick.c shares. Read once. */

#define MIN_MACS (1 << 18)  /* below: OpenBLAS, unmeasured */
#define BAND_SHIFT 3        /* bands of 8x in multiply-adds from MIN_MACS */
#define NBANDS 4            /* 256K, 2M, 16M, 128M and up */
#define CAL_MACS (1 << 27)  /* the most multiply-adds of a calibration product */
#define ONE_MAX_BAND 1      /* one thread is a candidate up to this band (16M) */
#define CAL_BATCH (1 << 22) /* multiply-adds timed at once (small products repeat) */
#define CAL_ROUNDS 3
#define CONFIRM_ROUNDS 6 /* more rounds before leaving OpenBLAS on all threads */
#define MARGIN 0.04
#define NCLASSES (NBANDS * 16)
#define LOCK_WAIT_S 5.0                /* then decide without the other processes */
#define FORMAT "fulgur gemm choices 4" /* 4: choices confirmed (CONFIRM_ROUNDS) */

enum { MODE_AUTO, MODE_OPENBLAS, MODE_ONEDNN, MODE_BAD };
static const char *const k_mode_names[] = {"auto", "openblas", "onednn"};
static const char *const k_cand_names[] = {"openblas", "onednn", "openblas/1t", "onednn/1t"};

/* One measured class: cls = band | ta << 2 | tb << 3 | acc << 4 | (K > N)
 * << 5; the threads it was measured on; pick = engine | one-thread << 1;
 * the calibration's shape and GFLOP/s per candidate (0: not run). */
typedef struct {
    uint8_t cls, threads, pick;
    bool cached;
    int32_t m, n, k;
    float gflops[4];
} entry;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic uint8_t g_code[NCLASSES]; /* 0: not decided, else 1 + pick */
static entry g_entries[NCLASSES];        /* under g_mu, in the order decided */
static int g_nentries;

static pthread_once_t g_env_once = PTHREAD_ONCE_INIT;
static int g_env_mode;
static char g_env_value[64];
static _Atomic int g_forced = -1;
static char g_cache_path[1024]; /* "" when off or unknown */
static bool g_cache_loaded;     /* under g_mu */
static char g_cache_note[160];  /* why the file was not used, for the info line */

/* ------------------------------------------------------ the cache file */

/* a line of the file into the entry at out (void *: fg__pick_load's parse) */
static bool parse_entry(const char *line, void *out) {
    entry *e = out;
    unsigned cls, thr, pick;
    long m, n, k;
    float g[4];
    int used = 0;
    if (sscanf(line, "%u %u %u %ld %ld %ld %g %g %g %g%n", &cls, &thr, &pick, &m, &n, &k, &g[0],
               &g[1], &g[2], &g[3], &used) != 10 ||
        line[used] != 0)
        return false;
    if (cls >= NCLASSES || thr < 1 || thr > 4096 || pick > 3 || ((pick & 2) && thr < 2))
        return false;
    if (m < 1 || n < 1 || k < 1 || m > (1 << 20) || n > (1 << 20) || k > (1 << 20)) return false;
    for (int i = 0; i < 4; i++)
        if (!(g[i] >= 0 && g[i] < 1e7)) return false; /* NaN fails too */
    *e = (entry){.cls = (uint8_t)cls,
                 .threads = (uint8_t)FG_MIN(thr, 255),
                 .pick = (uint8_t)pick,
                 .cached = true,
                 .m = (int32_t)m,
                 .n = (int32_t)n,
                 .k = (int32_t)k,
                 .gflops = {g[0], g[1], g[2], g[3]}};
    return true;
}

/* Adds the entry of a class not decided yet; a class this process has
 * decided (and may have used) keeps its choice. g_mu held. */
static void put_entry(const void *v) {
    const entry *e = v;
    if (atomic_load(&g_code[e->cls]) || g_nentries == NCLASSES) return;
    g_entries[g_nentries++] = *e;
    atomic_store(&g_code[e->cls], (uint8_t)(1 + e->pick));
}

/* g_mu held. Reads the whole file first and checks all of it, then adds
 * its entries: a file that fails a check adds nothing. */
static FG_MUST_USE fg_status cache_load_locked(const char *path) {
    return fg__pick_load(path, FORMAT, sizeof(entry), NCLASSES, parse_entry, put_entry);
}

/* g_mu held. Writes every entry to path. */
static FG_MUST_USE fg_status cache_save_locked(const char *path) {
    char key[1024];
    fg__pick_key(key, sizeof key, FORMAT);
    size_t cap = FG_PICK_MAX_BYTES / 2, len = 0;
    char *buf = fg_alloc(cap);
    if (!buf) return FG_ENOMEM;
    for (int i = 0; i < g_nentries && len < cap - 256; i++) {
        const entry *e = &g_entries[i];
        len += (size_t)snprintf(buf + len, cap - len, "%u %u %u %ld %ld %ld %.1f %.1f %.1f %.1f\n",
                                e->cls, e->threads, e->pick, (long)e->m, (long)e->n, (long)e->k,
                                e->gflops[0], e->gflops[1], e->gflops[2], e->gflops[3]);
    }
    fg_status st = fg__pick_save(path, FORMAT, key, buf, len);
    fg_free(buf);
    return st;
}

/* ----------------------------------------------------------- settings */

static int parse_mode(const char *v) {
    if (!v || !*v) return MODE_AUTO;
    for (int m = 0; m < MODE_BAD; m++)
        if (!strcmp(v, k_mode_names[m])) return m;
    return MODE_BAD;
}

static void read_env(void) {
    const char *v = getenv(MODE_ENV);
    g_env_mode = parse_mode(v);
    if (g_env_mode == MODE_BAD) snprintf(g_env_value, sizeof g_env_value, "%s", v);
    char key[1024];
    fg__pick_key(key, sizeof key, FORMAT);
    fg__pick_path(g_cache_path, sizeof g_cache_path, "gemm", key);
}

static int mode(void) {
    int f = atomic_load(&g_forced);
    if (f >= 0) return f;
    pthread_once(&g_env_once, read_env);
    return g_env_mode;
}

fg_status fg__gemm_set_mode(const char *v) {
    if (!v) {
        atomic_store(&g_forced, -1);
        return FG_OK;
    }
    int m = parse_mode(v);
    if (m == MODE_BAD)
        return fg_error(FG_EINVAL, "gemm mode \"%s\": expected auto, openblas or onednn", v);
    atomic_store(&g_forced, m);
    return FG_OK;
}

/* g_mu held: the cache file, once. */
static void load_once_locked(void) {
    if (g_cache_loaded) return;
    g_cache_loaded = true;
    pthread_once(&g_env_once, read_env);
    if (!g_cache_path[0] || access(g_cache_path, F_OK) != 0) return;
    if (cache_load_locked(g_cache_path) != FG_OK) {
        snprintf(g_cache_note, sizeof g_cache_note, "%s", fg_last_error());
        fg_clear_error();
    }
}

/* ---------------------------------------------------------- calibration */

static int band_of(double macs) {
    int b = 0;
    for (double lim = (double)MIN_MACS * (1 << BAND_SHIFT); b < NBANDS - 1 && macs >= lim;
         lim *= 1 << BAND_SHIFT)
        b++;
    return b;
}

/* One product on candidate `cand` at T threads (one when the candidate
 * says so); FG_EUNSUPPORTED when oneDNN cannot run it. */
static FG_MUST_USE fg_status run_cand(int cand, int T, bool ta, bool tb, float beta, int m, int n,
                                      int k, const float *a, const float *b, float *c) {
    bool one = (cand & 2) && T > 1;
    if (one) fg__threads_use(1);
    int lda = ta ? m : k, ldb = tb ? k : n;
    fg_status st = FG_OK;
    if (cand & 1) st = fg__cpu_gemm_dnnl_f32(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, n);
    else
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    m, n, k, 1.0f, a, lda, b, ldb, beta, c, n);
    if (one) fg__threads_use(T);
    return st;
}

/* The candidate the times in best say: OpenBLAS on T threads (0) when
 * nothing could be measured; a later candidate displaces an earlier one
 * only when faster by MARGIN. */
static int pick_of(const double *best, int ncand) {
    int pick = 0;
    for (int cd = 1; cd < ncand; cd++)
        if (best[cd] < best[pick] * (1 - MARGIN)) pick = cd;
    return pick;
}

/* Measures class cls at T threads on a product shaped like (M, N, K);
 * g_mu held. */
static void calibrate_locked(int cls, int T, bool ta, bool tb, bool acc, int64_t M, int64_t N,
                             int64_t K) {
    entry e = {.cls = (uint8_t)cls, .threads = (uint8_t)FG_MIN(T, 255)};
    double m = (double)M, n = (double)N, k = (double)K;
    if (m * n * k > CAL_MACS) m = FG_MAX(64.0, floor(CAL_MACS / (n * k)));
    if (m * n * k > CAL_MACS) {
        double s = sqrt(CAL_MACS / (m * n * k));
        n = FG_MAX(16.0, floor(n * s));
        k = FG_MAX(16.0, floor(k * s));
    }
    e.m = (int32_t)FG_MIN(m, (double)M);
    e.n = (int32_t)FG_MIN(n, (double)N);
    e.k = (int32_t)FG_MIN(k, (double)K);
    size_t na = (size_t)e.m * (size_t)e.k, nb = (size_t)e.k * (size_t)e.n,
           nc = (size_t)e.m * (size_t)e.n;
    float *buf = fg_alloc(sizeof(float) * (na + nb + nc));
    double best[4] = {INFINITY, INFINITY, INFINITY, INFINITY};
    int ncand = T > 1 && (cls & 3) <= ONE_MAX_BAND ? 4 : 2;
    if (buf) {
        float *a = buf, *b = buf + na, *c = buf + na + nb;
        for (size_t i = 0; i < na + nb + nc; i++) buf[i] = (float)((i * 7 % 13) - 6) * 0.0625f;
        double macs = (double)e.m * e.n * e.k;
        int reps = (int)FG_MAX(1.0, ceil(CAL_BATCH / macs));
        bool ok[4];
        for (int cd = 0; cd < ncand; cd++) /* warm-up: primitives, buffers, thread pools */
            ok[cd] = run_cand(cd, T, ta, tb, acc ? 1.0f : 0.0f, e.m, e.n, e.k, a, b, c) == FG_OK;
        for (int round = 0; round < CAL_ROUNDS + CONFIRM_ROUNDS; round++) {
            if (round == CAL_ROUNDS && pick_of(best, ncand) == 0) break; /* nothing to confirm */
            for (int cd = 0; cd < ncand; cd++) {
                if (!ok[cd]) continue;
                double t0 = fg_time();
                for (int r = 0; r < reps && ok[cd]; r++)
                    ok[cd] =
                        run_cand(cd, T, ta, tb, acc ? 1.0f : 0.0f, e.m, e.n, e.k, a, b, c) == FG_OK;
                /* a failed run is no time: the candidate is out */
                best[cd] = ok[cd] ? fmin(best[cd], (fg_time() - t0) / reps) : INFINITY;
            }
        }
        for (int cd = 0; cd < 4; cd++)
            e.gflops[cd] = isfinite(best[cd]) ? (float)(2 * macs / best[cd] * 1e-9) : 0.0f;
        fg_clear_error();
    }
    fg_free(buf);
    int pick = pick_of(best, ncand);
    e.pick = (uint8_t)(T > 1 ? pick : pick & 1);
    put_entry(&e);
}

/* Decides class cls: what another process wrote to the file since, else a
 * calibration, written back. g_mu held. */
static void decide_locked(int cls, int T, bool ta, bool tb, bool acc, int64_t M, int64_t N,
                          int64_t K) {
    load_once_locked();
    if (atomic_load(&g_code[cls])) return;
    int lk = fg__pick_lock(g_cache_path, LOCK_WAIT_S);
    if (g_cache_path[0] && access(g_cache_path, F_OK) == 0 &&
        cache_load_locked(g_cache_path) != FG_OK) {
        snprintf(g_cache_note, sizeof g_cache_note, "%s", fg_last_error());
        fg_clear_error();
    }
    if (!atomic_load(&g_code[cls])) {
        calibrate_locked(cls, T, ta, tb, acc, M, N, K);
        if (g_cache_path[0]) {
            if (cache_save_locked(g_cache_path) == FG_OK) {
                g_cache_note[0] = 0;
            } else {
                snprintf(g_cache_note, sizeof g_cache_note, "%s", fg_last_error());
                fg_clear_error();
            }
        }
    }
    if (lk >= 0) close(lk); /* and the lock goes with it */
}

fg_status fg__gemm_choose(bool ta, bool tb, bool acc, int64_t M, int64_t N, int64_t K, int T,
                          fg__gemm_choice *out) {
    *out = (fg__gemm_choice){.engine = FG_GEMM_OPENBLAS, .threads = T};
    int md = mode();
    if (md == MODE_BAD)
        return fg_error(FG_EINVAL, "%s=\"%s\": expected auto, openblas or onednn", MODE_ENV,
                        g_env_value);
    if (md == MODE_OPENBLAS) return FG_OK;
    if (md == MODE_ONEDNN) {
        if (!fg__dnnl_isa())
            return fg_error(FG_EUNSUPPORTED,
                            "%s=onednn, but this build has no oneDNN; unset it "
                            "or set it to auto or openblas",
                            MODE_ENV);
        out->engine = FG_GEMM_ONEDNN;
        return FG_OK;
    }
    double macs = (double)M * (double)N * (double)K;
    if (macs < MIN_MACS || !fg__dnnl_isa()) return FG_OK;
    int cls = band_of(macs) | ta << 2 | tb << 3 | acc << 4 | (K > N) << 5;
    uint8_t code = atomic_load_explicit(&g_code[cls], memory_order_acquire);
    if (!code) {
        pthread_mutex_lock(&g_mu);
        decide_locked(cls, T, ta, tb, acc, M, N, K);
        code = atomic_load(&g_code[cls]);
        pthread_mutex_unlock(&g_mu);
    }
    int pick = code - 1;
    out->engine = pick & 1 ? FG_GEMM_ONEDNN : FG_GEMM_OPENBLAS;
    out->threads = pick & 2 ? 1 : T;
    return FG_OK;
}

/* ---------------------------------------------------------- the report */

static void band_name(int band, char *buf, size_t cap) {
    static const char *const names[] = {"256K", "2M", "16M", "128M"};
    if (band == NBANDS - 1) snprintf(buf, cap, "%s+", names[band]);
    else snprintf(buf, cap, "%s-%s", names[band], names[band + 1]);
}

const char *fg__gemm_info(char *buf, size_t cap) {
    int md = mode();
    const char *isa = fg__dnnl_isa();
    if (md == MODE_BAD) {
        snprintf(buf, cap, "none (%s=\"%s\": expected auto, openblas or onednn)", MODE_ENV,
                 g_env_value);
        return buf;
    }
    if (md == MODE_OPENBLAS || !isa) {
        snprintf(buf, cap, "openblas (%s)", isa ? MODE_ENV "=openblas" : "no oneDNN in this build");
        return buf;
    }
    if (md == MODE_ONEDNN) {
        snprintf(buf, cap, "onednn (%s) (%s=onednn)", isa, MODE_ENV);
        return buf;
    }
    pthread_mutex_lock(&g_mu);
    load_once_locked();
    size_t len = (size_t)snprintf(buf, cap,
                                  "auto: openblas or onednn (%s), measured per shape class, "
                                  "openblas below 256K multiply-adds; cache %s%s%s",
                                  isa, g_cache_path[0] ? g_cache_path : "off",
                                  g_cache_note[0] ? ": " : "", g_cache_note);
    if (g_nentries == 0 && len < cap)
        len += (size_t)snprintf(buf + len, cap - len, "; no class measured yet");
    for (int i = 0; i < g_nentries && len < cap; i++) {
        const entry *e = &g_entries[i];
        char band[16];
        band_name(e->cls & 3, band, sizeof band);
        len += (size_t)snprintf(buf + len, cap - len, "%s %c%c%s %s %s: %s (%dt%s)", i ? "," : ";",
                                e->cls & 4 ? 't' : 'n', e->cls & 8 ? 't' : 'n',
                                e->cls & 16 ? "+=" : "=", band, e->cls & 32 ? "K>N" : "K<=N",
                                k_cand_names[e->pick], e->threads, e->cached ? ", cached" : "");
    }
    pthread_mutex_unlock(&g_mu);
    return buf;
}

/* ------------------------------------------------------- test hooks */

fg_status fg__gemm_cache_load(const char *path) {
    pthread_mutex_lock(&g_mu);
    g_cache_loaded = true;
    fg_status st = cache_load_locked(path);
    pthread_mutex_unlock(&g_mu);
    return st;
}

fg_status fg__gemm_cache_save(const char *path) {
    pthread_mutex_lock(&g_mu);
    fg_status st = cache_save_locked(path);
    pthread_mutex_unlock(&g_mu);
    return st;
}

void fg__gemm_forget(void) {
    pthread_once(&g_env_once, read_env);
    pthread_mutex_lock(&g_mu);
    g_nentries = 0;
    g_cache_loaded = true; /* a test decides what to load, */
    g_cache_path[0] = 0;   /* and its classes never reach the user's file */
    for (int c = 0; c < NCLASSES; c++) atomic_store(&g_code[c], 0);
    pthread_mutex_unlock(&g_mu);
}

int fg__gemm_classes(int *ondnn) {
    pthread_mutex_lock(&g_mu);
    int n = g_nentries, d = 0;
    for (int i = 0; i < n; i++) d += g_entries[i].pick & 1;
    pthread_mutex_unlock(&g_mu);
    if (ondnn) *ondnn = d;
    return n;
}
