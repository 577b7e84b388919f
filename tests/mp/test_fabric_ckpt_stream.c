/* The full save streamed (state_dict_type full) and the deepspeed
 * strategies' default save (a sharded folder), on 2 forked ranks:
 *   - under deepspeed_stage_3, fsdp FULL_SHARD and deepspeed_stage_2, the
 *     streamed full file is byte for byte the file of the gathering save
 *     (rank 0 gathering every shard first, kept as the reference) of the
 *     same state;
 *   - the streamed save holds at most one window (1 MiB) beyond the file's
 *     own write buffer on rank 0, and nothing on rank 1, where the
 *     gathering save held the whole parameters and optimizer state on
 *     rank 0 (counted by the allocator hook);
 *   - with state_dict_type auto (the zero value) deepspeed saves a folder
 *     holding the full file's tensors bit for bit, fsdp the one file;
 *   - a run resumed from that default folder goes on bitwise as the run
 *     resumed from the full file does, and as the run never stopped;
 *   - a full save whose file rank 0 cannot write (a file size limit) fails
 *     on both ranks, leaves no file and no temporary file, and rank 1 does
 *     not wait for ever. */
#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "fabric/fabric_impl.h"
#include "fixtures.h"
#include "harness.h"

#define STEPS 6
#define SAVE_AT 3
#define MAXN (1 << 20)
#define WINDOW ((long)1 << 20)   /* fabric_save_stream.c's WINDOW_BYTES */
#define FILE_BUF ((long)1 << 20) /* the atomic file's write buffer, either save */
#define SLACK ((long)256 << 10)  /* the header's JSON, names, the plan */

typedef struct job {
    const char *strategy;
    fg_sharding_strategy sharding;
    int fail_rank; /* >= 0: that rank cannot write a file of more than 100 bytes */
    char dir[128]; /* saves there at SAVE_AT: streamed, gathered, auto */
    char load[256];
    char id[96];
    /* results */
    int64_t n, start_step;
    float params[MAXN];
    float state[2][MAXN];
    long peak_streamed[2], peak_gathered[2]; /* bytes beyond those held before each save */
    int save_failed;
    char save_error[512];
} job;

/* 4 blocks of 128: 0.8M parameters, each buffer 3.2 MB, more than a
 * window; its largest tensor (128 x 512) fits in one */
static fg_module *make_model(void) {
    return fg_gpt_new(
        &(fg_gpt_config){.vocab = 17, .ctx = 8, .layers = 4, .heads = 2, .embd = 128, .seed = 5});
}

static int g_rank;

static fg_status cluster(void *ud, fg_cluster_info *out) {
    const job *j = ud;
    *out = (fg_cluster_info){.rank = g_rank,
                             .world_size = 2,
                             .local_rank = g_rank,
                             .local_world_size = 2,
                             .num_nodes = 1,
                             .source = "test"};
    snprintf(out->job_id, sizeof out->job_id, "%s", j->id);
    return FG_OK;
}

static void batch_rows(int step, int64_t r0, int64_t n, fg_tensor **x, fg_tensor **y) {
    int64_t sh[2] = {n, 8};
    *x = fg_empty(FG_I32, 2, sh);
    *y = fg_empty(FG_I32, 2, sh);
    for (int64_t i = 0; i < n * 8; i++) {
        uint64_t k = (uint64_t)step * 1000003u + (uint64_t)(r0 * 8 + i);
        ((int32_t *)fg_tensor_data(*x))[i] = (int32_t)(fg_rng_u32_at(11, k) % 17);
        ((int32_t *)fg_tensor_data(*y))[i] = (int32_t)(fg_rng_u32_at(12, k) % 17);
    }
}

static void path_of(const job *j, const char *what, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s.safetensors", j->dir, what);
}

/* The three saves of one state: streamed full, gathered full, the kind's
 * default; peaks of the first two. */
static int save_all(fg_fabric *f, job *j, fg_train_state *st, int rank) {
    char p[256];
    int bad = 0;
    if (rank == j->fail_rank) {
        signal(SIGXFSZ, SIG_IGN);
        setrlimit(RLIMIT_FSIZE, &(struct rlimit){.rlim_cur = 100, .rlim_max = RLIM_INFINITY});
    }
    f->cfg.sharded.state_dict_type = FG_STATE_DICT_FULL;
    path_of(j, "streamed", p, sizeof p);
    fx_alloc_peak_reset();
    if (fg_fabric_save(f, p, st) != FG_OK) {
        __atomic_fetch_add(&j->save_failed, 1, __ATOMIC_SEQ_CST);
        if (rank == 0) snprintf(j->save_error, sizeof j->save_error, "%s", fg_last_error());
        return j->fail_rank < 0;
    }
    j->peak_streamed[rank] = fx_alloc_peak_above();
    path_of(j, "gathered", p, sizeof p);
    fx_alloc_peak_reset();
    bad |= fg__fabric_save_gathered(f, p, st) != FG_OK;
    j->peak_gathered[rank] = fx_alloc_peak_above();
    f->cfg.sharded.state_dict_type = FG_STATE_DICT_AUTO;
    path_of(j, "auto", p, sizeof p);
    bad |= fg_fabric_save(f, p, st) != FG_OK;
    return bad;
}

static int train(fg_fabric *f, void *arg) {
    job *j = arg;
    int rank = fg_fabric_global_rank(f);
    fg_module *m = make_model();
    fg_optimizer *o = fg_adamw_new(m, &(fg_adamw_opts){.lr = 1e-2, .weight_decay = 0.1});
    int bad = fg_fabric_setup(f, m, o) != FG_OK;
    int start = 0;
    if (!bad && j->load[0]) {
        fg_train_state st = {.model = m, .optimizer = o};
        bad |= fg_fabric_load(f, j->load, &st) != FG_OK;
        start = (int)st.step;
        j->start_step = st.step;
    }
    for (int step = start; step < STEPS && !bad; step++) {
        fg_optimizer_zero_grad(o);
        fg_tensor *x, *y;
        batch_rows(step, rank * 3, 3, &x, &y);
        bad |= fg_fabric_backward(f, fg_cross_entropy(fg_module_forward(m, x), y, -100)) != FG_OK;
        if (!bad) bad |= fg_optimizer_step(o) != FG_OK;
        fg_fabric_step_end(f);
        if (!bad && j->dir[0] && step + 1 == SAVE_AT) {
            fg_kv meta[] = {{"config", "{\"layers\": 4}"}};
            fg_train_state st = {
                .model = m, .optimizer = o, .step = SAVE_AT, .meta = meta, .nmeta = 1};
            bad |= save_all(f, j, &st, rank);
            if (j->fail_rank >= 0) break;
        }
    }
    if (bad) fprintf(stderr, "rank %d (%s): %s\n", rank, j->strategy, fg_last_error());
    /* the whole parameters and state, gathered through a full save's reader */
    j->n = fg_module_numel(m);
    if (!bad && j->n <= MAXN) {
        int64_t b, e;
        fg_optimizer_state_range(o, &b, &e);
        for (int k = 0; k < 2; k++)
            memcpy(j->state[k] + b, fg_tensor_data(fg_optimizer_state(o, k)),
                   sizeof(float) * (size_t)(e - b));
        int64_t plo, phi;
        fg__fabric_param_range(f, m, &plo, &phi);
        memcpy(j->params + plo, fg__fabric_param_data(f, m, plo),
               sizeof(float) * (size_t)(phi - plo));
    }
    fg_optimizer_free(o);
    fg_module_free(m);
    return bad;
}

static int rank_main(int rank, int n, void *arg) {
    (void)n;
    job *j = arg;
    g_rank = rank;
    fx_alloc_begin(LONG_MAX);
    fg_fabric *f = fg_fabric_new(&(fg_fabric_config){.strategy = j->strategy,
                                                     .threads_per_rank = 1,
                                                     .sharded.sharding_strategy = j->sharding,
                                                     .cluster = cluster,
                                                     .cluster_ud = j});
    if (!f) {
        fprintf(stderr, "rank %d: %s\n", rank, fg_last_error());
        return 1;
    }
    int rc = fg_fabric_launch(f, train, j);
    fg_fabric_free(f);
    return rc;
}

static job *run_job(const char *strategy, fg_sharding_strategy sharding, const char *dir,
                    const char *load, int fail_rank) {
    job *j = mmap(NULL, sizeof *j, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    memset(j, 0, sizeof *j);
    j->strategy = strategy;
    j->sharding = sharding;
    j->fail_rank = fail_rank;
    snprintf(j->dir, sizeof j->dir, "%s", dir ? dir : "");
    snprintf(j->load, sizeof j->load, "%s", load ? load : "");
    static int seq;
    snprintf(j->id, sizeof j->id, "t-fstream-%d-%d", getpid(), seq++);
    int failed = fg_test_fork_ranks(2, rank_main, j, 120);
    if (fail_rank < 0) CHECK_MSG(failed == 0, "%s: %d ranks failed", strategy, failed);
    if (failed) j->n = 0;
    return j;
}

static void release(job *j) { munmap(j, sizeof *j); }

/* The whole file's bytes, or NULL. */
static unsigned char *slurp(const char *path, long *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    *len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)*len + 1);
    if (b && fread(b, 1, (size_t)*len, fp) != (size_t)*len) {
        free(b);
        b = NULL;
    }
    fclose(fp);
    return b;
}

static void check_same_bytes(const char *a, const char *b) {
    long la = -1, lb = -2;
    unsigned char *x = slurp(a, &la), *y = slurp(b, &lb);
    CHECK_MSG(x && y, "reading %s and %s", a, b);
    CHECK_MSG(la == lb, "%s is %ld bytes, %s %ld", a, la, b, lb);
    if (x && y && la == lb) CHECK_MSG(!memcmp(x, y, (size_t)la), "%s and %s differ", a, b);
    free(x);
    free(y);
}

/* Tensor for tensor (names, dtypes, shapes, bytes, in order) and the same
 * metadata, but save_id. */
static void check_same_tensors(const char *a, const char *b) {
    fg_st_file *x = fg_st_open(a), *y = fg_st_open(b);
    CHECK_MSG(x && y, "%s", fg_last_error());
    if (x && y) {
        CHECK(fg_st_count(x) == fg_st_count(y));
        int bad = 0;
        for (int64_t i = 0; i < fg_st_count(x) && i < fg_st_count(y); i++) {
            fg_st_info p, q;
            fg_st_info_at(x, i, &p);
            fg_st_info_at(y, i, &q);
            bool same = !strcmp(p.name, q.name) && p.dtype == q.dtype && p.ndim == q.ndim &&
                        p.nbytes == q.nbytes &&
                        !memcmp(fg_st_data(x, i), fg_st_data(y, i), p.nbytes);
            for (int d = 0; same && d < p.ndim; d++) same = p.shape[d] == q.shape[d];
            bad += !same;
        }
        CHECK_MSG(bad == 0, "%s vs %s: %d tensors differ", a, b, bad);
        for (int64_t i = 0; i < fg_st_meta_count(y); i++) {
            const char *k, *v, *w;
            CHECK(fg_st_meta_at(y, i, &k, &v) == FG_OK);
            w = fg_st_meta_get(x, k);
            CHECK_MSG(w && !strcmp(v, w), "metadata %s: %s vs %s", k, w ? w : "missing", v);
        }
    }
    fg_st_close(x);
    fg_st_close(y);
}

static void check_same_run(const job *a, const job *b, const char *what) {
    if (!a->n || !b->n) return;
    CHECK(a->n == b->n);
    CHECK_MSG(!memcmp(a->params, b->params, sizeof(float) * (size_t)a->n), "%s: parameters differ",
              what);
    for (int k = 0; k < 2; k++)
        CHECK_MSG(!memcmp(a->state[k], b->state[k], sizeof(float) * (size_t)a->n),
                  "%s: optimizer state %d differs", what, k);
}

static bool is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static bool is_file(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int count_entries(const char *dir) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "ls -A %s | wc -l", dir);
    FILE *p = popen(cmd, "r");
    int n = -1;
    if (p && fscanf(p, "%d", &n) != 1) n = -1;
    if (p) pclose(p);
    return n;
}

static void one_kind(const char *strategy, fg_sharding_strategy sharding, bool params_sharded,
                     bool saves_sharded) {
    char dir[] = "/tmp/fg-ckstream-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    job *a = run_job(strategy, sharding, dir, NULL, -1);
    char streamed[256], gathered[256], def[256];
    path_of(a, "streamed", streamed, sizeof streamed);
    path_of(a, "gathered", gathered, sizeof gathered);
    path_of(a, "auto", def, sizeof def);
    CHECK_MSG(is_file(streamed) && is_file(gathered), "%s: the full saves", strategy);
    check_same_bytes(streamed, gathered);
    /* memory: the gathering save held the whole buffers it gathered on
     * rank 0, the streamed one a window */
    long whole = (long)a->n * 4 * (params_sharded ? 3 : 2);
    CHECK_MSG(a->peak_gathered[0] >= whole,
              "%s: the gathering save's rank 0 peaked %ld bytes "
              "above its training memory, less than the %ld it gathers",
              strategy, a->peak_gathered[0], whole);
    CHECK_MSG(a->peak_streamed[0] <= WINDOW + FILE_BUF + SLACK,
              "%s: the streamed save's rank 0 peaked %ld bytes above its training memory, more "
              "than a window (%ld) and the file's buffer (%ld)",
              strategy, a->peak_streamed[0], WINDOW, FILE_BUF);
    CHECK_MSG(a->peak_streamed[1] <= SLACK, "%s: the streamed save's rank 1 peaked %ld bytes",
              strategy, a->peak_streamed[1]);
    printf("  %s: rank 0 peaked %ld bytes above training in the gathering save, %ld in the "
           "streamed one (rank 1: %ld, %ld)\n",
           strategy, a->peak_gathered[0], a->peak_streamed[0], a->peak_gathered[1],
           a->peak_streamed[1]);
    /* the default: a folder under deepspeed, the file under fsdp */
    CHECK_MSG(saves_sharded ? is_dir(def) : is_file(def), "%s: %s is not a %s", strategy, def,
              saves_sharded ? "folder" : "file");
    check_same_tensors(def, streamed);
    /* resumed from the default save and from the full file: bitwise the
     * same, and the same as the run that never stopped */
    job *x = run_job(strategy, sharding, NULL, def, -1);
    job *y = run_job(strategy, sharding, NULL, streamed, -1);
    CHECK_MSG(x->start_step == SAVE_AT, "%s: resumed at step %lld", strategy,
              (long long)x->start_step);
    check_same_run(x, y, "resumed from the default save vs from the full file");
    check_same_run(x, a, "resumed from the default save vs never stopped");
    release(x);
    release(y);
    release(a);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

TEST(stage3_streamed_equals_gathered_and_default_is_sharded) {
    one_kind("deepspeed_stage_3", 0, true, true);
}

TEST(fsdp_streamed_equals_gathered_and_default_is_full) {
    one_kind("fsdp", FG_SHARDING_FULL_SHARD, true, false);
}

TEST(stage2_streamed_equals_gathered_and_default_is_sharded) {
    one_kind("deepspeed_stage_2", 0, false, true);
}

TEST(a_failed_write_fails_both_ranks_and_leaves_nothing) {
    char dir[] = "/tmp/fg-ckstreamfail-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    job *a = run_job("deepspeed_stage_3", 0, dir, NULL, 0);
    CHECK_MSG(a->save_failed == 2, "%d ranks saw the save fail, want 2", a->save_failed);
    CHECK_MSG(strstr(a->save_error, "streamed.safetensors"), "rank 0's error names the file: %s",
              a->save_error);
    CHECK_MSG(count_entries(dir) == 0, "%s holds %d entries after the failed save", dir,
              count_entries(dir));
    release(a);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}
