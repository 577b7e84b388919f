/* Which algorithm runs each f32 convolution shape, direct or Winograd,
 * chosen per shape and direction by measurement: oneDNN's direct kernels
 * against oneDNN's Winograd where it has it (AVX-512), else against
 * fulgur's (k_conv_wino.c, on the table's matrix products).
 *
 * oneDNN's Winograd F(4x4, 3x3) kernels (AVX-512 only in oneDNN 2.x) run
 * a 3x3, stride-1 convolution in half the time of its direct kernels on
 * many shapes and lose on others, and no simple rule says which: on the
 * 2 vCPU AMD EPYC (Zen 5), batch 64, 64 channels at 32x32 1.7x faster
 * forward, 512 at 7x7 2.1x faster, but 512 at 7x7 with batch 8 10% slower,
 * 16 channels 1.7x slower, the backward weights of 48 channels at 32x32
 * 1.1x slower while its forward is 1.8x faster. fulgur's, on an AVX2 AMD
 * EPYC (family 25), batch 64: 1.3x faster at 64 channels of 32x32, 2-4x at
 * 256 and 512 channels of 8x8 and 4x4. So the first convolution
 * of a shape not seen before measures both (k_conv_dnnl.c's measure: the
 * whole call, reorders included, on scratch tensors of that shape,
 * interleaved, best of its rounds), and Winograd wins only when faster by
 * MARGIN, so that near ties stay direct (the kernel whose sums are the
 * plain ones) run after run.
 *
 * The choices live for the process and, as gemm_pick.c's, in a file of
 * the machine (pick_file.h: FULGUR_GEMM_CACHE names its folder, or off), so
 * that the ranks of a job and a resumed run take the choice the first
 * process made: Winograd's sums differ from the direct kernel's in the last
 * bits, and a run must repeat bit for bit. A new shape is decided under the
 * file's lock after reading it again. At most MAX_ENTRIES shapes are kept;
 * later ones are decided for the process alone. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_impl.h"
#include "k_ops.h"
#include "pick_file.h"

#define MARGIN 0.10
#define MAX_ENTRIES 512
#define LOCK_WAIT_S 5.0
/* 2: Winograd is fulgur's where oneDNN has none. The key (and so the
 * file's name) holds the format: a file of 1, "direct" for every shape of
 * a CPU below AVX-512 where nothing else could run, is not read. */
#define FORMAT "fulgur conv choices 2"

typedef struct {
    int n;
    int64_t key[FG_CONV_KEY];
    bool winograd, cached;
    double us[2]; /* the measured call, direct and Winograd; 0: not run */
} entry;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static entry g_entries[MAX_ENTRIES]; /* under g_mu, in the order decided */
static int g_nentries;
static bool g_loaded;
static char g_path[1024];
static char g_note[160]; /* why the file was not used */

static entry *lookup(const int64_t *key, int n) {
    for (int i = 0; i < g_nentries; i++)
        if (g_entries[i].n == n && !memcmp(g_entries[i].key, key, sizeof *key * (size_t)n))
            return &g_entries[i];
    return NULL;
}

/* A shape this process has decided (and may have used) keeps its choice
 * (void *: also fg__pick_load's put). */
static void put(const void *v) {
    const entry *e = v;
    if (g_nentries < MAX_ENTRIES && !lookup(e->key, e->n)) g_entries[g_nentries++] = *e;
}

/* a line of the file into the entry at out */
static bool parse(const char *line, void *out) {
    entry *e = out;
    char *end;
    long n = strtol(line, &end, 10);
    if (end == line || n < 1 || n > FG_CONV_KEY) return false;
    *e = (entry){.n = (int)n, .cached = true};
    for (int i = 0; i < n; i++) {
        const char *p = end;
        e->key[i] = strtoll(p, &end, 10);
        if (end == p || *p != ' ') return false;
    }
    const char *p = end;
    long w = strtol(p, &end, 10);
    if (end == p || (w != 0 && w != 1)) return false;
    e->winograd = w;
    for (int i = 0; i < 2; i++) {
        p = end;
        e->us[i] = strtod(p, &end);
        if (end == p || !(e->us[i] >= 0 && e->us[i] < 1e12)) return false; /* NaN fails too */
    }
    return *end == 0;
}

/* g_mu held: the file's entries, all or none. */
static FG_MUST_USE fg_status load_locked(const char *path) {
    return fg__pick_load(path, FORMAT, sizeof(entry), MAX_ENTRIES, parse, put);
}

static FG_MUST_USE fg_status save_locked(const char *path) {
    char key[1024];
    fg__pick_key(key, sizeof key, FORMAT);
    size_t cap = FG_PICK_MAX_BYTES - 2048, len = 0;
    char *buf = fg_alloc(cap);
    if (!buf) return FG_ENOMEM;
    for (int i = 0; i < g_nentries; i++) {
        const entry *e = &g_entries[i];
        char line[640];
        size_t k = (size_t)snprintf(line, sizeof line, "%d", e->n);
        for (int j = 0; j < e->n; j++)
            k += (size_t)snprintf(line + k, sizeof line - k, " %lld", (long long)e->key[j]);
        k += (size_t)snprintf(line + k, sizeof line - k, " %d %.0f %.0f\n", e->winograd, e->us[0],
                              e->us[1]);
        if (len + k >= cap) break; /* the rest is decided for this process alone */
        memcpy(buf + len, line, k);
        len += k;
    }
    fg_status st = fg__pick_save(path, FORMAT, key, buf, len);
    fg_free(buf);
    return st;
}

static void note_error(void) {
    snprintf(g_note, sizeof g_note, "%s", fg_last_error());
    fg_clear_error();
}

/* g_mu held: the file, once. */
static void load_once_locked(void) {
    if (g_loaded) return;
    g_loaded = true;
    char key[1024];
    fg__pick_key(key, sizeof key, FORMAT);
    fg__pick_path(g_path, sizeof g_path, "conv", key);
    if (g_path[0] && access(g_path, F_OK) == 0 && load_locked(g_path) != FG_OK) note_error();
}

fg_status fg__conv_pick(const int64_t *key, int n, fg__conv_measure_fn measure, void *ud,
                        bool *winograd) {
    if (n < 1 || n > FG_CONV_KEY)
        return fg_error(FG_EINTERNAL, "conv_pick: a key of %d values (at most %d)", n, FG_CONV_KEY);
    pthread_mutex_lock(&g_mu);
    load_once_locked();
    fg_status st = FG_OK;
    entry *e = lookup(key, n);
    if (!e) {
        int lk = fg__pick_lock(g_path, LOCK_WAIT_S);
        if (g_path[0] && access(g_path, F_OK) == 0 && load_locked(g_path) != FG_OK) note_error();
        if (!(e = lookup(key, n))) {
            double t[2] = {INFINITY, INFINITY};
            st = measure(ud, t);
            entry ne = {.n = n, .winograd = !st && t[1] < t[0] * (1 - MARGIN)};
            memcpy(ne.key, key, sizeof *key * (size_t)n);
            for (int i = 0; i < 2; i++) ne.us[i] = isfinite(t[i]) ? t[i] * 1e6 : 0;
            if (!st) {
                put(&ne);
                if (g_path[0] && save_locked(g_path) == FG_OK) g_note[0] = 0;
                else if (g_path[0]) note_error();
            }
            e = st ? NULL : lookup(key, n);
            if (!st && !e) *winograd = ne.winograd; /* more shapes than kept */
        }
        if (lk >= 0) close(lk);
    }
    if (e) *winograd = e->winograd;
    pthread_mutex_unlock(&g_mu);
    return st;
}

const char *fg__conv_pick_info(char *buf, size_t cap) {
    pthread_mutex_lock(&g_mu);
    load_once_locked();
    int w = 0;
    for (int i = 0; i < g_nentries; i++) w += g_entries[i].winograd;
    snprintf(buf, cap, "%d shapes measured, %d on winograd; cache %s%s%s", g_nentries, w,
             g_path[0] ? g_path : "off", g_note[0] ? ": " : "", g_note);
    pthread_mutex_unlock(&g_mu);
    return buf;
}

/* ------------------------------------------------------- test hooks */

fg_status fg__conv_pick_cache_load(const char *path) {
    pthread_mutex_lock(&g_mu);
    g_loaded = true;
    fg_status st = load_locked(path);
    pthread_mutex_unlock(&g_mu);
    return st;
}

fg_status fg__conv_pick_cache_save(const char *path) {
    pthread_mutex_lock(&g_mu);
    fg_status st = save_locked(path);
    pthread_mutex_unlock(&g_mu);
    return st;
}

void fg__conv_pick_forget(void) {
    pthread_mutex_lock(&g_mu);
    g_nentries = 0;
    g_loaded = true; /* a test decides what to load, */
    g_path[0] = 0;   /* and its shapes never reach the user's file */
    pthread_mutex_unlock(&g_mu);
}

int fg__conv_pick_count(int *winograd, int *cached) {
    pthread_mutex_lock(&g_mu);
    int n = g_nentries, w = 0, c = 0;
    for (int i = 0; i < n; i++) w += g_entries[i].winograd, c += g_entries[i].cached;
    pthread_mutex_unlock(&g_mu);
    if (winograd) *winograd = w;
    if (cached) *cached = c;
    return n;
}
