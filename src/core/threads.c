/* One thread setting for OpenMP and OpenBLAS together, so that N ranks with
 * T threads each never run more than N*T busy threads; and fewer while other
 * processes keep some of this process's cores busy.
 *
 * Why fewer: a kernel's threads meet at a barrier, and a thread that gets
 * there first waits for the others by spinning (GCC's libgomp spins about
 * 3 ms by default; OpenBLAS here is its OpenMP build, so the same). When a
 * busy process holds one of the cores, the thread that shares it runs only
 * in slices, and its partner spins through whole slices waiting: two
 * threads on one free core ran a GPT step many times slower than one
 * thread. libgomp reads its wait policy (OMP_WAIT_POLICY, GOMP_SPINCOUNT)
 * once, when it loads, so a library cannot change it in its own process; it
 * can change the thread count, and does.
 *
 * How: the setting (fg_set_num_threads) is the most threads kernels use.
 * At most every POLL_S, fg_get_num_threads (every matrix product calls it)
 * measures the cores other processes used since the last poll: the busy
 * time /proc/stat gives for the CPUs this process may run on, less this
 * process's own CPU time. From that, next_count moves the count one thread
 * at a time, and each thread applies it to OpenMP and OpenBLAS before its
 * next kernel. The first poll has no window yet: it counts the runnable
 * tasks (procs_running) instead, and the first window is short (FIRST_S).
 * FULGUR_ADAPT_THREADS=0 keeps the setting whatever the load, and so does
 * fg__threads_pin (the deterministic mode): a product's bits can depend on
 * its thread count (OpenBLAS's sgemm of 32x288 by 288x63 differs in 815 of
 * its 2016 values between 1 and 2 threads on a Zen 5 EPYC), so a run whose
 * bits must repeat cannot let the load choose it.
 *
 * The cores a process may use (fg__cores_usable; the default thread count)
 * are those of its affinity mask (taskset, cpusets, mpirun's binding),
 * capped by a cgroup CPU quota (docker --cpus); fg_num_cores stays the
 * machine's online cores, which count its CPU devices. */
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core_impl.h"

/* Declared by OpenBLAS's cblas.h; declared here so core needs no BLAS header. */
void openblas_set_num_threads(int num_threads);

/* FULGUR_ADAPT_THREADS = 1 (default) | 0: whether kernels use fewer threads
 * than the setting while other processes keep cores busy. */
#define ADAPT_ENV "FULGUR_ADAPT_THREADS"

#define POLL_S 0.25  /* a load window */
#define FIRST_S 0.05 /* the first window, so that a short run adapts too */

static _Atomic int g_threads;       /* the setting; 0 until set */
static _Atomic int g_adapt = -1;    /* FULGUR_ADAPT_THREADS, -1 until read */
static _Atomic bool g_pinned;       /* fg__threads_pin: the setting, whatever the load */
static _Atomic int g_allowed;       /* the count the load allows; 0 until measured */
                                    /* (kernels use the lower of it and the setting) */
static _Thread_local int t_applied; /* what this thread last gave OpenMP and OpenBLAS */

/* ------------------------------------------------------------ cores */

static cpu_set_t g_mask;
static int g_cores; /* usable: the mask's, capped by the quota */
static pthread_once_t g_cores_once = PTHREAD_ONCE_INIT;

/* The cgroup CPU quota in cores, 0 when there is none (v2 cpu.max, v1
 * cpu.cfs_quota_us over cpu.cfs_period_us, of this process's group). */
static double cgroup_quota(void) {
    char line[512], path[640];
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (!f) return 0;
    double q = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *ctrl = strchr(line, ':'), *grp = ctrl ? strchr(ctrl + 1, ':') : NULL;
        if (!grp) continue;
        *grp++ = 0;
        ctrl++;
        long a = 0, b = 0;
        FILE *g = NULL;
        if (!*ctrl) { /* v2: "max 100000" or "150000 100000" */
            snprintf(path, sizeof path, "/sys/fs/cgroup%s/cpu.max", grp);
            if ((g = fopen(path, "re")) && fscanf(g, "%ld %ld", &a, &b) == 2 && a > 0 && b > 0)
                q = (double)a / (double)b;
        } else if (strstr(ctrl, "cpu") && !strstr(ctrl, "cpuset") &&
                   (!strcmp(ctrl, "cpu") || strstr(ctrl, "cpu,") || strstr(ctrl, ",cpu"))) {
            snprintf(path, sizeof path, "/sys/fs/cgroup/cpu%s/cpu.cfs_quota_us", grp);
            if ((g = fopen(path, "re")) && fscanf(g, "%ld", &a) == 1 && a > 0) {
                fclose(g);
                snprintf(path, sizeof path, "/sys/fs/cgroup/cpu%s/cpu.cfs_period_us", grp);
                g = fopen(path, "re");
                if (g && fscanf(g, "%ld", &b) == 1 && b > 0) q = (double)a / (double)b;
            }
        }
        if (g) fclose(g);
        if (q > 0) break;
    }
    fclose(f);
    return q;
}

static void find_cores(void) {
    int n = fg_num_cores();
    CPU_ZERO(&g_mask);
    if (sched_getaffinity(0, sizeof g_mask, &g_mask) == 0 && CPU_COUNT(&g_mask) > 0)
        n = CPU_COUNT(&g_mask);
    else
        for (int c = 0; c < n && c < CPU_SETSIZE; c++) CPU_SET(c, &g_mask);
    double q = cgroup_quota();
    if (q > 0 && q < n) n = (int)ceil(q);
    g_cores = n > 0 ? n : 1;
}

int fg_num_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int fg__cores_usable(void) {
    pthread_once(&g_cores_once, find_cores);
    return g_cores;
}

/* ------------------------------------------------------------- load */

/* One reading: busy ticks of the CPUs in g_mask, this process's CPU time,
 * its threads' time spent waiting for a CPU (-1: unknown), the time, and
 * the runnable tasks of the machine. */
typedef struct {
    double busy_s, own_s, delay_s, t;
    int running;
} load_sample;

/* The time this process's threads have spent runnable but off a CPU: the
 * second field of each /proc/self/task/<tid>/schedstat, summed; -1 when
 * the kernel does not keep it. */
static double run_delay(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    double sum = 0;
    int seen = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        char path[300], buf[128];
        snprintf(path, sizeof path, "/proc/self/task/%s/schedstat", e->d_name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t k = read(fd, buf, sizeof buf - 1);
        close(fd);
        unsigned long long run, wait;
        if (k > 0) {
            buf[k] = 0;
            if (sscanf(buf, "%llu %llu", &run, &wait) == 2) {
                sum += (double)wait * 1e-9;
                seen++;
            }
        }
    }
    closedir(d);
    return seen ? sum : -1;
}

static bool read_sample(load_sample *out) {
    static long hz;
    if (!hz) hz = sysconf(_SC_CLK_TCK) > 0 ? sysconf(_SC_CLK_TCK) : 100;
    int fd = open("/proc/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    char buf[4096], line[256];
    size_t ll = 0;
    unsigned long long busy = 0;
    int running = -1;
    ssize_t k;
    /* the cpu lines come first, procs_running a few lines after the long
     * intr line: parse line by line over chunks */
    while (running < 0 && (k = read(fd, buf, sizeof buf)) > 0) {
        for (ssize_t i = 0; i < k; i++) {
            if (buf[i] != '\n') {
                if (ll < sizeof line - 1) line[ll++] = buf[i];
                continue;
            }
            line[ll] = 0;
            ll = 0;
            int cpu;
            unsigned long long v[8] = {0};
            if (!strncmp(line, "cpu", 3) && line[3] >= '0' && line[3] <= '9') {
                if (sscanf(line + 3, "%d %llu %llu %llu %llu %llu %llu %llu %llu", &cpu, &v[0],
                           &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]) >= 5 &&
                    cpu >= 0 && cpu < CPU_SETSIZE && CPU_ISSET(cpu, &g_mask))
                    /* user nice system irq softirq steal; not idle, iowait */
                    busy += v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
            } else if (!strncmp(line, "procs_running ", 14)) {
                running = atoi(line + 14);
                break;
            }
        }
    }
    close(fd);
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    out->own_s = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    out->busy_s = (double)busy / (double)hz;
    out->delay_s = run_delay();
    out->t = fg_time();
    out->running = running;
    return true;
}

static atomic_flag g_poll_busy = ATOMIC_FLAG_INIT;
static _Atomic double g_next_poll;  /* fg_time() of the next poll; 0: never polled */
static _Atomic double g_others = 0; /* cores other processes used in the last window */
static load_sample g_last;          /* under g_poll_busy, as the three below */
static double g_up_after, g_hold_s = 1, g_last_up = -1e9;

/* The next count, from `now` threads (at most cap), given D, the threads'
 * time off a CPU per second of the window just run at that count, and U,
 * the cores other processes used (smoothed over windows). Measured beside
 * a shell loop busy for a fraction f of each 20 ms on one of two cores (a
 * GPT step, two threads against one): two threads win up to f = 0.75
 * (D = 0.29 at 0.5, 0.44 at 0.75) and lose from 0.9 (D = 0.59; 0.71 at 1).
 * Beside spinning threads the loop itself gets much less than f of its
 * core, so U says little at two threads, but at one it is the loop's f.
 * Hence: down one thread when D > DOWN_AT (U > cores - now + DOWN_AT where
 * the kernel keeps no delays); up one when others leave the next thread
 * UP_AT of a core, not within a hold time after a down move. The hold
 * doubles (to HOLD_MAX_S) when a down move undoes an up move within 2 s,
 * so that a load on the border does not make the count flap. */
#define DOWN_AT 0.5
#define UP_AT 0.85
#define HOLD_MAX_S 32.0

static int next_count(int cap, int now, double D, double U, double t) {
    double C = (double)g_cores;
    if (now > 1 && (D >= 0 ? D > DOWN_AT : U > C - now + DOWN_AT)) {
        if (t - g_last_up < 2.0) g_hold_s = FG_MIN(2 * g_hold_s, HOLD_MAX_S);
        g_up_after = t + g_hold_s;
        return now - 1;
    }
    if (now < cap && U < C - now - 1 + UP_AT && t >= g_up_after) {
        g_last_up = t;
        return now + 1;
    }
    return now;
}

/* Measures the load when the window is over (one thread at a time; the
 * others keep the last answer). */
static void poll_load(void) {
    pthread_once(&g_cores_once, find_cores); /* read_sample reads g_mask */
    double now = fg_time();
    if (now < atomic_load_explicit(&g_next_poll, memory_order_relaxed)) return;
    if (atomic_flag_test_and_set_explicit(&g_poll_busy, memory_order_acquire)) return;
    load_sample s;
    int cap = FG_MAX(1, atomic_load(&g_threads)), cur = atomic_load(&g_allowed);
    if (!read_sample(&s)) {
        atomic_store(&g_next_poll, now + 1e9); /* no /proc: keep the setting */
    } else if (atomic_load(&g_next_poll) == 0) {
        /* no window yet: the tasks runnable now, less this one, as what
         * other processes ask for */
        double others = s.running > 0 ? FG_MIN((double)(s.running - 1), (double)g_cores) : 0;
        atomic_store(&g_others, others);
        atomic_store(&g_allowed, (int)FG_MAX(1.0, FG_MIN((double)cap, g_cores - others)));
        atomic_store(&g_next_poll, now + FIRST_S);
        g_last = s;
    } else if (s.t - g_last.t > 0.01) {
        double dt = s.t - g_last.t;
        double others = FG_MAX(0.0, ((s.busy_s - g_last.busy_s) - (s.own_s - g_last.own_s)) / dt);
        double D = s.delay_s >= 0 && g_last.delay_s >= 0
                       ? FG_MAX(0.0, (s.delay_s - g_last.delay_s) / dt)
                       : -1;
        others = 0.5 * (others + atomic_load(&g_others)); /* /proc/stat counts in ticks */
        atomic_store(&g_others, others);
        /* a window run below the allowed count (the setting was lower)
         * says nothing about the allowed count: keep it */
        if (!cur || cur <= cap)
            atomic_store(&g_allowed, next_count(cap, cur ? cur : cap, D, others, now));
        atomic_store(&g_next_poll, now + POLL_S);
        g_last = s;
    }
    atomic_flag_clear_explicit(&g_poll_busy, memory_order_release);
}

double fg__cores_free(void) {
    poll_load();
    return FG_MAX(0.0, (double)fg__cores_usable() - atomic_load(&g_others));
}

/* ---------------------------------------------------------- threads */

static void apply(int n) {
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
    openblas_set_num_threads(n);
    t_applied = n;
}

fg_status fg_set_num_threads(int n) {
    long adapt;
    FG_TRY(fg__env_int(ADAPT_ENV, 1, &adapt));
    if (adapt != 0 && adapt != 1)
        return fg_error(FG_EINVAL,
                        "%s=%ld: expected 1 (fewer threads while other processes keep "
                        "cores busy) or 0",
                        ADAPT_ENV, adapt);
    atomic_store(&g_adapt, (int)adapt);
    if (n <= 0) {
        long env;
        FG_TRY(fg__env_int("FULGUR_NUM_THREADS", 0, &env));
        if (env < 0 || env > 4096)
            return fg_error(FG_EINVAL, "FULGUR_NUM_THREADS=%ld: expected 1..4096", env);
        n = env > 0 ? (int)env : fg__cores_usable();
    }
    atomic_store(&g_threads, n);
    apply(n);
    return FG_OK;
}

void fg__threads_use(int n) { apply(FG_MAX(1, n)); }

void fg__threads_pin(void) { atomic_store(&g_pinned, true); }

int fg__threads_now(void) {
    int n = atomic_load_explicit(&g_threads, memory_order_relaxed);
    if (n == 0) {
        if (fg_set_num_threads(0) != FG_OK) fg__status_drop(fg_set_num_threads(fg__cores_usable()));
        n = atomic_load(&g_threads);
    }
    int want = n;
    if (n > 1 && atomic_load_explicit(&g_adapt, memory_order_relaxed) == 1 &&
        !atomic_load_explicit(&g_pinned, memory_order_relaxed)) {
        poll_load();
        int a = atomic_load_explicit(&g_allowed, memory_order_relaxed);
        if (a > 0 && a < n) want = a;
    }
    if (want != t_applied) apply(want);
    return want;
}

int fg_get_num_threads(void) {
    fg__threads_now();
    return atomic_load_explicit(&g_threads, memory_order_relaxed);
}

double fg_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
