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
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "blas.h"
#include "cpu_impl.h"

/* FULGUR_GEMM = auto | openblas | onednn: which engine runs single f32
 * products. auto (the default, also when unset or empty): measured per
 * shape class. openblas / onednn: always that engine (onednn: every single
 * product, however small; an error where the build has no oneDNN). Read
 * once, at the first product. */
#define MODE_ENV "FULGUR_GEMM"
/* FULGUR_GEMM_CACHE = a folder for the calibration file, or off. Default:
 * $XDG_CACHE_HOME/fulgur, else $HOME/.cache/fulgur. Read once. */
#define CACHE_ENV "FULGUR_GEMM_CACHE"

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

/* ------------------------------------------------------------ the key */

static uint64_t fnv64(const void *p, size_t n, uint64_t h) {
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
    return h;
}
#define FNV0 0xcbf29ce484222325ull

/* What the choices depend on: CPU model, its ISA flags, OpenBLAS and its
 * kernel core, oneDNN and its ISA, the file format. */
static void make_key(char *key, size_t cap) {
    char model[128] = "?", fam[64] = "", flags[256] = "", line[16384]; /* flags lines run long */
    FILE *f = fopen("/proc/cpuinfo", "re");
    while (f && fgets(line, sizeof line, f)) {
        char *v = strchr(line, ':');
        if (!v) continue;
        v += strspn(v + 1, " ") + 1;
        v[strcspn(v, "\n")] = 0;
        if (!strncmp(line, "model name", 10) && model[0] == '?')
            snprintf(model, sizeof model, "%s", v);
        else if (!strncmp(line, "cpu family", 10) && !fam[0]) snprintf(fam, sizeof fam, "%s", v);
        else if (!strncmp(line, "model\t", 6) && !strchr(fam, '/'))
            snprintf(fam + strlen(fam), sizeof fam - strlen(fam), "/%s", v);
        else if (!strncmp(line, "flags", 5) && !flags[0]) {
            static const char *const want[] = {
                "avx2",        "fma",         "avx512f",  "avx512bw", "avx512vl", "avx512_vnni",
                "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", NULL};
            for (int i = 0; want[i]; i++) {
                size_t n = strlen(want[i]);
                for (char *p = strstr(v, want[i]); p; p = strstr(p + 1, want[i]))
                    if ((p == v || p[-1] == ' ') && (p[n] == ' ' || !p[n])) {
                        snprintf(flags + strlen(flags), sizeof flags - strlen(flags), "%s%s",
                                 flags[0] ? "," : "", want[i]);
                        break;
                    }
            }
            break;
        }
    }
    if (f) fclose(f);
    const char *isa = fg__dnnl_isa();
    snprintf(key, cap, "%s; cpu %s (%s); isa %s; %s; onednn %s %s", FORMAT, model, fam, flags,
             openblas_get_config(), fg__dnnl_version(), isa ? isa : "none");
    for (char *p = key; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
}

/* ------------------------------------------------------ the cache file */

static bool parse_entry(const char *line, entry *e) {
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
static void put_entry(const entry *e) {
    if (atomic_load(&g_code[e->cls]) || g_nentries == NCLASSES) return;
    g_entries[g_nentries++] = *e;
    atomic_store(&g_code[e->cls], (uint8_t)(1 + e->pick));
}

/* g_mu held. Reads the whole file first and checks all of it, then adds
 * its entries: a file that fails a check adds nothing. */
static FG_MUST_USE fg_status cache_load_locked(const char *path) {
    char key[1024];
    make_key(key, sizeof key);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fg_error(FG_EIO, "gemm cache %s: %s", path, strerror(errno));
    size_t cap = 64 << 10, len = 0;
    char *buf = fg_alloc(cap + 1);
    if (!buf) {
        close(fd);
        return FG_ENOMEM;
    }
    ssize_t r;
    while (len < cap && (r = read(fd, buf + len, cap - len)) > 0) len += (size_t)r;
    bool more = len == cap && read(fd, &(char){0}, 1) > 0;
    close(fd);
    buf[len] = 0;
    fg_status st = FG_OK;
    entry *es = NULL;
    int ne = 0;
    const char *why = NULL;
    int lineno = 0;
    char *sum = NULL;
    if (more) why = "is larger than 64 KiB";
    else if (strlen(buf) != len) why = "has a NUL byte";
    else if (len < 22 || strncmp(sum = buf + len - 22, "\nsum ", 5) != 0 || buf[len - 1] != '\n')
        why = "has no checksum line at its end";
    else {
        char want[24];
        snprintf(want, sizeof want, "%016llx",
                 (unsigned long long)fnv64(buf, (size_t)(sum + 1 - buf), FNV0));
        if (memcmp(sum + 5, want, 16) != 0) why = "has a checksum that does not match";
    }
    if (!why) {
        sum[1] = 0; /* the body ends with its last newline */
        es = fg_alloc(sizeof *es * NCLASSES);
        if (!es) {
            st = FG_ENOMEM;
            goto done;
        }
        for (char *line = buf, *nl; !why && *line; line = nl + 1) {
            nl = strchr(line, '\n');
            *nl = 0;
            lineno++;
            if (lineno == 1) {
                if (strcmp(line, FORMAT) != 0) why = "is not a calibration file of this version";
            } else if (lineno == 2) {
                if (strncmp(line, "key ", 4) != 0 || strcmp(line + 4, key) != 0)
                    why = "belongs to another CPU or library version";
            } else if (ne == NCLASSES || !parse_entry(line, &es[ne++])) {
                why = "has a line that does not parse";
            }
        }
        if (!why && lineno < 2) why = "is truncated";
    }
    if (why) {
        st = lineno > 2
                 ? fg_error(FG_EFORMAT, "gemm cache %s %s (line %d): ignored", path, why, lineno)
                 : fg_error(FG_EFORMAT, "gemm cache %s %s: ignored", path, why);
        goto done;
    }
    for (int i = 0; i < ne; i++) put_entry(&es[i]);
done:
    fg_free(es);
    fg_free(buf);
    return st;
}

/* g_mu held. Writes every entry that may be kept, to a temporary file
 * renamed over path (a reader sees the old file or the new one). */
static FG_MUST_USE fg_status cache_save_locked(const char *path) {
    char key[1024], tmp[1100];
    make_key(key, sizeof key);
    size_t cap = 64 << 10, len = 0;
    char *buf = fg_alloc(cap);
    if (!buf) return FG_ENOMEM;
    len += (size_t)snprintf(buf + len, cap - len, "%s\nkey %s\n", FORMAT, key);
    for (int i = 0; i < g_nentries && len < cap - 256; i++) {
        const entry *e = &g_entries[i];
        len += (size_t)snprintf(buf + len, cap - len, "%u %u %u %ld %ld %ld %.1f %.1f %.1f %.1f\n",
                                e->cls, e->threads, e->pick, (long)e->m, (long)e->n, (long)e->k,
                                e->gflops[0], e->gflops[1], e->gflops[2], e->gflops[3]);
    }
    len += (size_t)snprintf(buf + len, cap - len, "sum %016llx\n",
                            (unsigned long long)fnv64(buf, len, FNV0));
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    fg_status st = FG_OK;
    if (fd < 0) {
        st = fg_error(FG_EIO, "gemm cache %s: %s", tmp, strerror(errno));
    } else {
        size_t done = 0;
        while (done < len) {
            ssize_t w = write(fd, buf + done, len - done);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) break;
            done += (size_t)w;
        }
        if (close(fd) != 0 || done != len || rename(tmp, path) != 0) {
            st = fg_error(FG_EIO, "gemm cache %s: %s", path, strerror(errno));
            unlink(tmp);
        }
    }
    fg_free(buf);
    return st;
}

/* mkdir -p of path's folder. */
static void make_dirs(const char *path) {
    char d[1024];
    snprintf(d, sizeof d, "%s", path);
    char *slash = strrchr(d, '/');
    if (!slash) return;
    *slash = 0;
    for (char *p = d + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(d, 0755);
            *p = '/';
        }
    mkdir(d, 0755);
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
    const char *dir = getenv(CACHE_ENV);
    char base[900] = "";
    if (dir && *dir) {
        if (strcmp(dir, "off") != 0) snprintf(base, sizeof base, "%s", dir);
    } else if (getenv("XDG_CACHE_HOME") && getenv("XDG_CACHE_HOME")[0] == '/') {
        snprintf(base, sizeof base, "%s/fulgur", getenv("XDG_CACHE_HOME"));
    } else if (getenv("HOME") && getenv("HOME")[0] == '/') {
        snprintf(base, sizeof base, "%s/.cache/fulgur", getenv("HOME"));
    }
    if (base[0]) {
        char key[1024];
        make_key(key, sizeof key);
        snprintf(g_cache_path, sizeof g_cache_path, "%s/gemm-%016llx.txt", base,
                 (unsigned long long)fnv64(key, strlen(key), FNV0));
    }
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

/* Takes the machine-wide lock of the calibration file (a lock file beside
 * it, never removed); -1 when there is no file or after LOCK_WAIT_S (a
 * stopped process holds it): then this process decides alone. */
static int lock_file(void) {
    if (!g_cache_path[0]) return -1;
    char lk[1100];
    snprintf(lk, sizeof lk, "%.*s.lock", (int)(strlen(g_cache_path) - 4), g_cache_path);
    make_dirs(lk);
    int fd = open(lk, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    double t0 = fg_time();
    while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if ((errno != EWOULDBLOCK && errno != EINTR) || fg_time() - t0 > LOCK_WAIT_S) {
            close(fd);
            return -1;
        }
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    return fd;
}

/* Decides class cls: what another process wrote to the file since, else a
 * calibration, written back. g_mu held. */
static void decide_locked(int cls, int T, bool ta, bool tb, bool acc, int64_t M, int64_t N,
                          int64_t K) {
    load_once_locked();
    if (atomic_load(&g_code[cls])) return;
    int lk = lock_file();
    if (g_cache_path[0] && access(g_cache_path, F_OK) == 0 &&
        cache_load_locked(g_cache_path) != FG_OK) {
        snprintf(g_cache_note, sizeof g_cache_note, "%s", fg_last_error());
        fg_clear_error();
    }
    if (!atomic_load(&g_code[cls])) {
        calibrate_locked(cls, T, ta, tb, acc, M, N, K);
        if (g_cache_path[0]) {
            make_dirs(g_cache_path);
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
