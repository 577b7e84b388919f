/* fabric: the launch decisions, made by the launch layer's plan.
 *
 *   config: fg_fabric_new accepts every row of Lightning's devices table
 *     (FULGUR_CPU_DEVICES=4, so that several ranks are possible on any
 *     machine) and refuses each bad value with the launch layer's message;
 *   launched: under a faked launcher (fulgur's or torchrun's variables) the
 *     default config is ddp with the launcher's world size, and ranks forked
 *     with those variables really train together; ddp_spawn, single and dp
 *     under a launcher of several ranks say to use ddp;
 *   ddp_spawn: the parent gets rank 0's trained state, byte for byte, and
 *     it equals one process trained on the whole batch; a failing or killed
 *     rank is named, with its message and exit code;
 *   re-exec: this test binary runs itself again as rank 1 (it recognises
 *     itself in a constructor, before the harness starts); a collective
 *     sums over both ranks; a rank that dies mid-run, or before it joins,
 *     fails the launch with a message naming it. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fulgur/fabric.h"
#include "harness.h"

/* Every variable a launcher or the tests below may have set. */
static void clean_env(void) {
    fg_launch_unexport();
    static const char *const more[] = {"OMPI_COMM_WORLD_RANK",
                                       "OMPI_COMM_WORLD_SIZE",
                                       "SLURM_PROCID",
                                       "SLURM_NTASKS",
                                       "TORCHELASTIC_RUN_ID",
                                       "FG_TEST_FABRIC_CHILD",
                                       NULL};
    for (int i = 0; more[i]; i++) unsetenv(more[i]);
    setenv("FULGUR_CPU_DEVICES", "4", 1);
    setenv("FULGUR_NUM_THREADS", "1", 1); /* forks must not meet a thread pool */
}

static char g_dir[128];

static void remove_dir(void) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (g_dir[0] && system(cmd) != 0) fprintf(stderr, "  (could not remove %s)\n", g_dir);
}

/* A scratch folder, removed when the test binary exits (ranks leave with
 * _exit and never remove it). */
static const char *tmp_dir(void) {
    if (!g_dir[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(g_dir, sizeof g_dir, "%s/fg-test-fabric.XXXXXX", t ? t : "/tmp");
        if (!mkdtemp(g_dir)) g_dir[0] = '\0';
        else atexit(remove_dir);
    }
    return g_dir;
}

static void write_file(const char *name, const void *data, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", getenv("FG_TEST_DIR"), name);
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(data, 1, n, f);
        fclose(f);
    }
}

static size_t read_file(const char *name, void *data, size_t cap) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", getenv("FG_TEST_DIR"), name);
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(data, 1, cap, f);
    fclose(f);
    return n;
}

/* ------------------------------------------------------------- config */

typedef struct config_case {
    const char *accelerator, *devices, *strategy, *precision;
    int num_nodes;
    fg_status want;     /* FG_OK, or the status fg_fabric_new leaves */
    const char *expect; /* in the plan's line, or in the error */
} config_case;

static void check_case(const config_case *c) {
    fg_fabric_config cfg = {.accelerator = c->accelerator,
                            .devices = c->devices,
                            .strategy = c->strategy,
                            .precision = c->precision,
                            .num_nodes = c->num_nodes};
    fg_clear_error();
    fg_fabric *f = fg_fabric_new(&cfg);
    char line[512] = "";
    if (f) fg_launch_plan_format(fg_fabric_plan(f), line, sizeof line);
    const char *got = f ? line : fg_last_error();
    CHECK_MSG(c->want == FG_OK ? f != NULL : f == NULL, "devices=%s strategy=%s: %s",
              c->devices ? c->devices : "NULL", c->strategy ? c->strategy : "NULL", got);
    CHECK_CONTAINS(got, c->expect);
    /* the launch layer says the same, by construction */
    fg_launch_plan p;
    fg_status s = fg_launch_plan_make(&(fg_launch_opts){.accelerator = c->accelerator,
                                                        .devices = c->devices,
                                                        .strategy = c->strategy,
                                                        .precision = c->precision,
                                                        .num_nodes = c->num_nodes},
                                      NULL, &p);
    if (c->want != FG_OK) {
        CHECK_MSG(s == c->want, "devices=%s: status %s, want %s", c->devices ? c->devices : "NULL",
                  fg_status_str(s), fg_status_str(c->want));
        CHECK_CONTAINS(fg_last_error(), c->expect);
    } else {
        CHECK(s == FG_OK);
    }
    fg_fabric_free(f);
}

/* fsdp's sharding strategy is the fabric's option, not the launch plan's:
 * every one is built (FULL_SHARD the default); one out of range is refused
 * at fg_fabric_new. */
TEST(config_fsdp_sharding_strategy) {
    clean_env();
    fg_fabric_config cfg = {.devices = "2", .strategy = "fsdp"};
    fg_fabric *f0 = fg_fabric_new(&cfg);
    CHECK_MSG(f0 && fg_fabric_plan(f0)->strategy == FG_STRATEGY_FSDP, "%s", fg_last_error());
    fg_fabric_free(f0);
    cfg.sharded.sharding_strategy = (fg_sharding_strategy)9;
    CHECK(fg_fabric_new(&cfg) == NULL && fg_last_status() == FG_EINVAL);
    cfg.sharded.sharding_strategy = FG_SHARDING_HYBRID_SHARD;
    f0 = fg_fabric_new(&cfg);
    CHECK_MSG(f0 != NULL, "%s", fg_last_error());
    fg_fabric_free(f0);
    cfg.sharded.sharding_strategy = FG_SHARDING_SHARD_GRAD_OP;
    fg_fabric *f = fg_fabric_new(&cfg);
    CHECK_MSG(f && fg_fabric_plan(f)->strategy == FG_STRATEGY_FSDP, "%s", fg_last_error());
    fg_fabric_free(f);
    cfg = (fg_fabric_config){
        .devices = "2", .strategy = "deepspeed_stage_2", .sharded.reduce_bucket_size = -1};
    CHECK(fg_fabric_new(&cfg) == NULL && fg_last_status() == FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "reduce_bucket_size = -1");
}

TEST(config_devices_table) {
    clean_env();
    static const config_case ok[] = {
        {NULL, NULL, NULL, NULL, 0, FG_OK,
         "single on cpu, 1 rank (1 per node x 1 node, devices [0])"},
        {NULL, "auto", NULL, NULL, 0, FG_OK,
         "single on cpu, 1 rank (1 per node x 1 node, devices [0])"},
        {NULL, "1", NULL, NULL, 0, FG_OK, "single on cpu, 1 rank"},
        {NULL, "2", NULL, NULL, 0, FG_OK,
         "ddp on cpu, 2 ranks (2 per node x 1 node, devices [0, 1])"},
        {NULL, "-1", NULL, NULL, 0, FG_OK,
         "ddp on cpu, 4 ranks (4 per node x 1 node, devices [0, 1, 2, 3])"},
        {NULL, "0,1", NULL, NULL, 0, FG_OK,
         "ddp on cpu, 2 ranks (2 per node x 1 node, devices [0, 1])"},
        {NULL, "[0, 1]", NULL, NULL, 0, FG_OK, "devices [0, 1]"},
        {NULL, "[1, 3]", NULL, NULL, 0, FG_OK,
         "ddp on cpu, 2 ranks (2 per node x 1 node, devices [1, 3])"},
        {NULL, "1,", NULL, NULL, 0, FG_OK,
         "single on cpu, 1 rank (1 per node x 1 node, devices [1])"},
        {NULL, " 3 ", NULL, NULL, 0, FG_OK, "ddp on cpu, 3 ranks"},
        {"cpu", "2", "ddp", "32-true", 1, FG_OK, "launcher re-exec"},
        {"CPU", "2", "DDP", NULL, 0, FG_OK, "ddp on cpu, 2 ranks"},
        {NULL, "2", "ddp_spawn", NULL, 0, FG_OK, "ddp_spawn on cpu, 2 ranks"},
        {NULL, "2", "ddp_notebook", NULL, 0, FG_OK, "ddp_fork on cpu, 2 ranks"},
        {NULL, "2", "ddp_fork", NULL, 0, FG_OK, "this process is the parent, launcher fork"},
        {NULL, "2", "dp", NULL, 0, FG_OK, "dp, 1 process with 2 worker threads"},
        {NULL, "1", "single_device", NULL, 0, FG_OK, "launcher none"},
        {NULL, NULL, NULL, "64", 0, FG_OK, "precision 64-true"},
        {NULL, NULL, NULL, "32", 0, FG_OK, "precision 32-true"},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) check_case(&ok[i]);
    /* FULGUR_CPU_DEVICES is what -1 means */
    setenv("FULGUR_CPU_DEVICES", "3", 1);
    check_case(&(config_case){NULL, "-1", NULL, NULL, 0, FG_OK, "3 ranks"});
    setenv("FULGUR_CPU_DEVICES", "4", 1);
    /* precision 64 builds f64 models */
    fg_fabric *f = fg_fabric_new(&(fg_fabric_config){.precision = "64-true"});
    CHECK(f && fg_fabric_dtype(f) == FG_F64);
    fg_fabric_free(f);
    f = fg_fabric_new(NULL);
    CHECK(f && fg_fabric_dtype(f) == FG_F32 && !strcmp(fg_fabric_strategy_name(f), "single"));
    /* the loader is borrowed: a NULL one is a bad argument */
    if (f) CHECK(fg_fabric_setup_dataloader(f, NULL, true) == NULL);
    if (f) CHECK(fg_last_status() == FG_EINVAL);
    fg_fabric_free(f);
}

TEST(config_errors) {
    clean_env();
    static const config_case bad[] = {
        {NULL, "0", NULL, NULL, 0, FG_EINVAL, "devices=\"0\": at least one device is needed"},
        {NULL, "", NULL, NULL, 0, FG_EINVAL, "devices=\"\": no device given"},
        {NULL, "abc", NULL, NULL, 0, FG_EINVAL, "devices=\"abc\": expected a count like \"2\""},
        {NULL, "[1, 1]", NULL, NULL, 0, FG_EINVAL, "devices=\"[1, 1]\": device 1 is listed twice"},
        {NULL, "0,9", NULL, NULL, 0, FG_EINVAL, "device 9 does not exist; ids go 0..3"},
        {NULL, "5", NULL, NULL, 0, FG_EINVAL,
         "devices=\"5\": only 4 CPU devices here (FULGUR_CPU_DEVICES)"},
        {NULL, "-2", NULL, NULL, 0, FG_EINVAL, "devices=\"-2\": a count must be positive"},
        {NULL, "[0, 1", NULL, NULL, 0, FG_EINVAL, "missing \"]\""},
        {"ipu", NULL, NULL, NULL, 0, FG_EUNSUPPORTED,
         "accelerator=\"ipu\": fulgur does not support it"},
        {"hpu", NULL, NULL, NULL, 0, FG_EUNSUPPORTED,
         "accelerator=\"hpu\": fulgur does not support it"},
        {"gpu", NULL, NULL, NULL, 0, FG_EUNSUPPORTED, "accelerator=\"gpu\""},
        {"quantum", NULL, NULL, NULL, 0, FG_EINVAL,
         "accelerator=\"quantum\": expected one of auto, cpu"},
        {NULL, "2", "single", NULL, 0, FG_EINVAL,
         "strategy=\"single\" runs on one device, but devices gives 2"},
        {NULL, "2", "Hybrid", NULL, 0, FG_EINVAL,
         "strategy=\"Hybrid\": fulgur spells it strategy \"fsdp\" with sharding_strategy "
         "HYBRID_SHARD"},
        {NULL, "2", "ddp3", NULL, 0, FG_EINVAL,
         "strategy=\"ddp3\": unknown; expected one of auto, single, dp, ddp, ddp_spawn, ddp_fork"},
        {NULL, NULL, NULL, "16-bits", 0, FG_EINVAL,
         "precision=\"16-bits\": unknown; expected one of 32-true (32), 64-true (64), 16-mixed "
         "(16), bf16-mixed (bf16), 16-true, bf16-true"},
        {NULL, NULL, NULL, "12", 0, FG_EINVAL, "precision=\"12\": unknown"},
        {NULL, NULL, NULL, NULL, -1, FG_EINVAL, "num_nodes=-1"},
        {NULL, "2", "ddp_spawn", NULL, 2, FG_EINVAL, "num_nodes=2"},
        {NULL, "2", "dp", NULL, 2, FG_EINVAL,
         "strategy=\"dp\" runs in one process, but num_nodes=2"},
        {NULL, "2", "ddp", NULL, 2, FG_EINVAL, "NODE_RANK"},
    };
    unsetenv("NODE_RANK");
    unsetenv("MASTER_ADDR");
    unsetenv("MASTER_PORT");
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) check_case(&bad[i]);
    CHECK(!fg_fabric_new(&(fg_fabric_config){.threads_per_rank = -1}));
    CHECK_CONTAINS(fg_last_error(), "threads_per_rank=-1");
    setenv("FULGUR_CPU_DEVICES", "x", 1);
    CHECK(!fg_fabric_new(NULL));
    CHECK_CONTAINS(fg_last_error(), "FULGUR_CPU_DEVICES");
    clean_env();
}

/* What the strategy's row does not take, and what the ranks' setup would
 * refuse on the plan's world, fg_fabric_new refuses before any rank starts
 * (these once failed on every rank, after the launch). What the row takes
 * on this world is accepted. */
TEST(config_refuses_what_the_strategy_does_not_take) {
    clean_env();
    static const struct {
        fg_fabric_config c;
        fg_status want;
        const char *msg;
    } bad[] = {
        {{.devices = "2", .strategy = "horovod", .deterministic = true},
         FG_EUNSUPPORTED,
         "deterministic: built for the single and ddp strategies (ddp_spawn, ddp_fork) without a "
         "communication hook; strategy=\"horovod\""},
        {{.devices = "2", .strategy = "ddp2", .deterministic = true},
         FG_EUNSUPPORTED,
         "strategy=\"ddp2\""},
        {{.devices = "2", .strategy = "horovod", .ddp.comm_hook = FG_DDP_HOOK_FP16_COMPRESS},
         FG_EINVAL,
         "strategy \"horovod\": ddp's communication hooks do not apply (they hook ddp's "
         "gradient buckets: ddp, ddp_spawn, ddp_fork, fsdp with NO_SHARD); use "
         "fg_horovod_opts.compression"},
        {{.devices = "2", .strategy = "bagua", .ddp.comm_wrapper = FG_DDP_WRAPPER_BF16},
         FG_EINVAL,
         "under bagua the algorithm is the communication"},
        {{.devices = "2", .strategy = "deepspeed_stage_2", .ddp.comm_hook = FG_DDP_HOOK_POWERSGD},
         FG_EINVAL,
         "strategy \"deepspeed_stage_2\": ddp's communication hooks do not apply"},
        {{.devices = "2", .strategy = "horovod", .precision = "bf16-true"},
         FG_EUNSUPPORTED,
         "horovod: needs f32 gradients in one flat buffer; this precision's are bf16"},
        {{.devices = "2",
          .strategy = "ddp",
          .precision = "64-true",
          .ddp.comm_hook = FG_DDP_HOOK_POWERSGD},
         FG_EUNSUPPORTED,
         "communication hooks work on f32 gradients; this precision's are f64"},
        {{.devices = "3",
          .strategy = "bagua",
          .ddp.bagua = {.algorithm = FG_BAGUA_DECENTRALIZED,
                        .peer_selection_mode = FG_BAGUA_PEERS_SHIFT_ONE}},
         FG_EINVAL,
         "shift_one pairs the ranks, and there are 3 of them"},
        {{.devices = "2",
          .strategy = "bagua",
          .precision = "64-true",
          .ddp.bagua = {.algorithm = FG_BAGUA_BYTEGRAD}},
         FG_EUNSUPPORTED,
         "bagua bytegrad: works on f32 weights and gradients; this model's are f64"},
        {{.devices = "4",
          .strategy = "fsdp",
          .sharded = {.sharding_strategy = FG_SHARDING_HYBRID_SHARD, .hybrid_shard_size = 3}},
         FG_EINVAL,
         "fsdp HYBRID_SHARD: a shard group of 3 ranks does not divide the 4 ranks"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fg_fabric *f = fg_fabric_new(&bad[i].c);
        CHECK_MSG(!f, "case %zu: accepted", i);
        fg_fabric_free(f);
        CHECK_MSG(fg_last_status() == bad[i].want, "case %zu: %s", i,
                  fg_status_str(fg_last_status()));
        CHECK_CONTAINS(fg_last_error(), bad[i].msg);
    }
    static const fg_fabric_config good[] = {
        {.devices = "2", .ddp.comm_hook = FG_DDP_HOOK_POWERSGD}, /* auto: ddp on 2 devices */
        {.devices = "2",
         .strategy = "fsdp",
         .sharded.sharding_strategy = FG_SHARDING_NO_SHARD,
         .ddp.comm_hook = FG_DDP_HOOK_FP16_COMPRESS},
        {.devices = "1", .strategy = "horovod", .deterministic = false, .precision = "bf16-true"},
        {.devices = "2", .strategy = "ddp", .deterministic = true},
        {.devices = "4",
         .strategy = "bagua",
         .ddp.bagua = {.algorithm = FG_BAGUA_DECENTRALIZED,
                       .peer_selection_mode = FG_BAGUA_PEERS_SHIFT_ONE}},
        {.devices = "4",
         .strategy = "fsdp",
         .sharded = {.sharding_strategy = FG_SHARDING_HYBRID_SHARD, .hybrid_shard_size = 2}},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        fg_fabric *f = fg_fabric_new(&good[i]);
        CHECK_MSG(f != NULL, "good case %zu: %s", i, fg_last_error());
        fg_fabric_free(f);
    }
    clean_env();
}

/* ----------------------------------------------------- under a launcher */

static void fake_launcher(bool torchrun, int rank, int world, int local_rank, int local_world) {
    clean_env();
    char v[32];
#define SETI(k, x) (snprintf(v, sizeof v, "%d", (x)), setenv((k), v, 1))
    if (torchrun) {
        SETI("RANK", rank);
        SETI("WORLD_SIZE", world);
        SETI("LOCAL_RANK", local_rank);
        SETI("LOCAL_WORLD_SIZE", local_world);
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        SETI("MASTER_PORT", 20000 + (int)(getppid() % 20000));
        snprintf(v, sizeof v, "fg-test-tr-%d", (int)getppid());
        setenv("TORCHELASTIC_RUN_ID", v, 1);
    } else {
        SETI("FULGUR_RANK", rank);
        SETI("FULGUR_WORLD_SIZE", world);
        SETI("FULGUR_LOCAL_RANK", local_rank);
        SETI("FULGUR_LOCAL_WORLD_SIZE", local_world);
        snprintf(v, sizeof v, "fg-test-fr-%d", (int)getppid());
        setenv("FULGUR_JOB_ID", v, 1);
    }
#undef SETI
}

TEST(launched_default_is_ddp) {
    for (int tr = 0; tr < 2; tr++) {
        fake_launcher(tr, 1, 4, 1, 2); /* rank 1 of 4: 2 nodes of 2 */
        fg_fabric *f = fg_fabric_new(NULL);
        CHECK_MSG(f != NULL, "%s", fg_last_error());
        if (!f) continue;
        const fg_launch_plan *p = fg_fabric_plan(f);
        CHECK(p->launched && p->strategy == FG_STRATEGY_DDP && p->launcher == FG_LAUNCHER_NONE);
        CHECK(p->world_size == 4 && p->rank == 1 && p->local_world_size == 2);
        CHECK(p->devices.count == 2 && p->num_nodes == 2);
        CHECK(!strcmp(p->cluster.source, tr ? "torchrun" : "fulgur"));
        CHECK(!strcmp(fg_fabric_strategy_name(f), "ddp"));
        fg_fabric_free(f);
        /* asked for explicitly: the same */
        f = fg_fabric_new(&(fg_fabric_config){.devices = "2", .strategy = "ddp", .num_nodes = 2});
        CHECK(f && fg_fabric_plan(f)->world_size == 4);
        fg_fabric_free(f);
        /* what does not fit the launcher is refused, saying what to do */
        CHECK(!fg_fabric_new(&(fg_fabric_config){.devices = "3", .num_nodes = 2}));
        CHECK_STATUS(fg_launch_plan_make(&(fg_launch_opts){.devices = "3", .num_nodes = 2}, NULL,
                                         &(fg_launch_plan){0}),
                     FG_EMISMATCH);
        CHECK_CONTAINS(fg_last_error(), "started 4 ranks, but devices x num_nodes = 3 x 2 = 6; "
                                        "make them agree");
        CHECK(!fg_fabric_new(&(fg_fabric_config){.devices = "2", .strategy = "ddp_spawn"}));
        CHECK_CONTAINS(fg_last_error(), "strategy=\"ddp_spawn\" forks its own ranks, but this "
                                        "process was already launched as rank 1 of 4");
        CHECK_CONTAINS(fg_last_error(), "use strategy \"ddp\"");
        CHECK(!fg_fabric_new(&(fg_fabric_config){.devices = "2", .strategy = "dp"}));
        CHECK_CONTAINS(fg_last_error(), "strategy=\"dp\" runs in one process, but the launcher");
        CHECK(!fg_fabric_new(&(fg_fabric_config){.devices = "1", .strategy = "single"}));
        CHECK_CONTAINS(fg_last_error(), "use strategy \"ddp\"");
    }
    clean_env();
}

static fg_status custom_env(void *ud, fg_cluster_info *out) {
    (void)ud;
    *out = (fg_cluster_info){.rank = 2,
                             .world_size = 3,
                             .local_rank = 2,
                             .local_world_size = 3,
                             .num_nodes = 1,
                             .source = "my-cluster"};
    return FG_OK;
}

static fg_status broken_env(void *ud, fg_cluster_info *out) {
    (void)ud;
    (void)out;
    return fg_error(FG_EIO, "my-cluster: the scheduler is down");
}

TEST(custom_cluster) {
    clean_env();
    fg_fabric *f = fg_fabric_new(&(fg_fabric_config){.cluster = custom_env});
    CHECK_MSG(f != NULL, "%s", fg_last_error());
    if (f) {
        const fg_launch_plan *p = fg_fabric_plan(f);
        CHECK(p->world_size == 3 && p->rank == 2 && p->strategy == FG_STRATEGY_DDP);
        CHECK(!strcmp(p->cluster.source, "my-cluster"));
    }
    fg_fabric_free(f);
    CHECK(!fg_fabric_new(&(fg_fabric_config){.cluster = broken_env}));
    CHECK_CONTAINS(fg_last_error(), "the scheduler is down");
}

/* Two ranks that believe a launcher started them: the default config trains
 * as ddp on both. */
static int sum_run(fg_fabric *f, void *arg) {
    int *want_world = arg;
    if (fg_fabric_world_size(f) != *want_world || !fg_fabric_comm(f)) return 10;
    if (fg_fabric_threads(f) != 1) return 11;
    double s = 0;
    if (fg_fabric_reduce_scalar(f, fg_fabric_global_rank(f) + 1, FG_REDUCE_OP_SUM, &s) != FG_OK)
        return 13;
    return s == *want_world * (*want_world + 1) / 2 ? 0 : 12;
}

static int launched_rank(int rank, int n, void *arg) {
    fake_launcher(*(int *)arg, rank, n, rank, n);
    fg_fabric *f = fg_fabric_new(NULL);
    if (!f) {
        fprintf(stderr, "rank %d: %s\n", rank, fg_last_error());
        return 1;
    }
    int rc = fg_fabric_launch(f, sum_run, &n);
    if (rc) fprintf(stderr, "rank %d: launch -> %d: %s\n", rank, rc, fg_last_error());
    fg_fabric_free(f);
    return rc;
}

TEST(launched_ranks_train_together) {
    for (int tr = 0; tr < 2; tr++) CHECK(fg_test_fork_ranks(3, launched_rank, &tr, 300) == 0);
    clean_env();
}

/* ------------------------------------------------------------- training */

#define ROWS 8 /* the global batch; each of N ranks takes ROWS / N */
#define STEPS 6

typedef struct train_args {
    int fail_rank, fail_code, kill_rank;
} train_args;

static fg_module *train_model(void) {
    return fg_mlp_new(&(fg_mlp_config){.sizes = {6, 16, 3}, .seed = 9});
}

static fg_optimizer *train_opt(fg_module *m) {
    return fg_sgd_new(m, &(fg_sgd_opts){.lr = 0.1, .momentum = 0.9});
}

/* Each rank trains on its rows of every step's global batch; rank 0 keeps
 * what it ends with in FG_TEST_DIR (when set) for the parent to compare. */
static int train_run(fg_fabric *f, void *arg) {
    const train_args *a = arg;
    int r = fg_fabric_global_rank(f), world = fg_fabric_world_size(f);
    if (a && a->kill_rank == r && world > 1) raise(SIGKILL);
    if (a && a->fail_rank == r && world > 1) {
        fg_error(FG_EIO, "rank %d: disk full at step 0", r);
        return a->fail_code;
    }
    fg_module *m = train_model();
    fg_optimizer *o = train_opt(m);
    if (!m || !o || fg_fabric_setup(f, m, o) != FG_OK) return 1;
    int64_t n = ROWS / world, sx[2] = {n, 6}, sy[1] = {n};
    for (int step = 0; step < STEPS; step++) {
        fg_tensor *x = fg_empty(FG_F32, 2, sx), *y = fg_empty(FG_I32, 1, sy);
        fg_rng_fill_normal(21, (uint64_t)(step * ROWS + r * n) * 6, fg_tensor_data(x), n * 6, 0, 1);
        for (int64_t i = 0; i < n; i++)
            ((int32_t *)fg_tensor_data(y))[i] =
                (int32_t)(fg_rng_u32_at(22, (uint64_t)(step * ROWS + r * n + i)) % 3);
        fg_optimizer_zero_grad(o);
        fg_tensor *loss = fg_cross_entropy(fg_module_forward(m, x), y, -100);
        if (!loss || fg_fabric_backward(f, loss) != FG_OK) return 1;
        CHECK_OK(fg_optimizer_step(o));
        fg_fabric_step_end(f);
    }
    if (r == 0 && getenv("FG_TEST_DIR")) {
        fg_tensor *p = fg_module_flat_params(m), *mom = fg_optimizer_state(o, 0);
        write_file("params", fg_tensor_data(p), fg_tensor_nbytes(p));
        write_file("momentum", fg_tensor_data(mom), fg_tensor_nbytes(mom));
    }
    fg_optimizer_free(o);
    fg_module_free(m); /* the parent still gets the state: copied at each step end */
    return 0;
}

TEST(ddp_spawn_returns_rank0_state) {
    clean_env();
    setenv("FG_TEST_DIR", tmp_dir(), 1);
    for (int k = 0; k < 2; k++) {
        const char *strategy = k ? "ddp_fork" : "ddp_spawn";
        fg_fabric *f = fg_fabric_new(&(fg_fabric_config){.devices = "2", .strategy = strategy});
        CHECK(f && fg_fabric_plan(f)->launcher == FG_LAUNCHER_FORK);
        if (!f) continue;
        CHECK_MSG(fg_fabric_launch(f, train_run, NULL) == 0, "%s", fg_last_error());
        fg_module *m = train_model();
        fg_optimizer *o = train_opt(m);
        fg_tensor *p = fg_module_flat_params(m), *mom = fg_optimizer_state(o, 0);
        size_t bytes = fg_tensor_nbytes(p);
        char *init = malloc(bytes), *want = malloc(bytes), *want_mom = malloc(bytes);
        memcpy(init, fg_tensor_data(p), bytes);
        CHECK_OK(fg_fabric_spawn_result(f, m, o));
        CHECK(read_file("params", want, bytes) == bytes);
        CHECK(read_file("momentum", want_mom, bytes) == bytes);
        CHECK(memcmp(fg_tensor_data(p), want, bytes) == 0); /* rank 0's, exactly */
        CHECK(memcmp(fg_tensor_data(mom), want_mom, bytes) == 0);
        CHECK(memcmp(fg_tensor_data(p), init, bytes) != 0); /* and trained */
        CHECK(fg_optimizer_step_count(o) == STEPS);
        /* one process on the whole batch trains the same model (ddp averages) */
        char one_dir[256];
        snprintf(one_dir, sizeof one_dir, "%s/one", tmp_dir());
        mkdir(one_dir, 0700);
        setenv("FG_TEST_DIR", one_dir, 1);
        fg_fabric *one = fg_fabric_new(NULL);
        CHECK(one && fg_fabric_launch(one, train_run, NULL) == 0);
        fg_fabric_free(one);
        float *single = malloc(bytes);
        CHECK(read_file("params", single, bytes) == bytes);
        const float *got = fg_tensor_data(p);
        int differ = 0;
        for (size_t i = 0; i < bytes / sizeof(float); i++)
            differ += !(fabsf(got[i] - single[i]) <= 1e-6f + 1e-5f * fabsf(single[i]));
        CHECK_MSG(differ == 0, "%d weights differ from one process", differ);
        free(single);
        setenv("FG_TEST_DIR", tmp_dir(), 1);
        /* a model of another shape is refused, naming both sizes */
        fg_module *other = fg_mlp_new(&(fg_mlp_config){.sizes = {6, 8, 3}});
        CHECK_STATUS(fg_fabric_spawn_result(f, other, NULL), FG_EMISMATCH);
        CHECK_CONTAINS(fg_last_error(), "bytes of parameters");
        fg_module_free(other);
        free(init);
        free(want);
        free(want_mom);
        fg_optimizer_free(o);
        fg_module_free(m);
        fg_fabric_free(f);
    }
    /* no result without a fork launch */
    fg_fabric *f = fg_fabric_new(NULL);
    fg_module *m = train_model();
    CHECK_STATUS(fg_fabric_spawn_result(f, m, NULL), FG_ESTATE);
    fg_module_free(m);
    fg_fabric_free(f);
    unsetenv("FG_TEST_DIR");
}

TEST(ddp_spawn_failures_named) {
    clean_env();
    fg_fabric *f = fg_fabric_new(&(fg_fabric_config){.devices = "3", .strategy = "ddp_spawn"});
    CHECK(f != NULL);
    if (!f) return;
    train_args a = {.fail_rank = 1, .fail_code = 5, .kill_rank = -1};
    CHECK(fg_fabric_launch(f, train_run, &a) == 5); /* the rank's own exit code */
    CHECK_CONTAINS(fg_last_error(), "rank 1 (pid ");
    CHECK_CONTAINS(fg_last_error(), "exited with code 5: rank 1: disk full at step 0");
    fg_module *m = train_model();
    CHECK_STATUS(fg_fabric_spawn_result(f, m, NULL), FG_ESTATE); /* nothing from a failed run */
    fg_module_free(m);
    a = (train_args){.fail_rank = -1, .kill_rank = 2};
    CHECK(fg_fabric_launch(f, train_run, &a) != 0);
    CHECK_CONTAINS(fg_last_error(), "rank 2 (pid ");
    CHECK_CONTAINS(fg_last_error(), "was killed by signal 9 (SIGKILL)");
    fg_fabric_free(f);
}

/* ------------------------------------------------------------- re-exec */

/* run() of the re-exec tests, on both ranks; FG_TEST_FABRIC_CHILD says which. */
static int reexec_run(fg_fabric *f, void *arg) {
    (void)arg;
    const char *mode = getenv("FG_TEST_FABRIC_CHILD");
    int r = fg_fabric_global_rank(f);
    if (fg_fabric_world_size(f) != 2 || !fg_fabric_comm(f)) return 20;
    double s = 0;
    if (fg_fabric_reduce_scalar(f, r + 1, FG_REDUCE_OP_SUM, &s) != FG_OK) return 22;
    char line[256];
    snprintf(line, sizeof line, "rank %d of %d, local %d, sum %g, strategy %s, threads %d\n", r,
             fg_fabric_world_size(f), fg_fabric_local_rank(f), s, fg_fabric_strategy_name(f),
             fg_fabric_threads(f));
    char name[32];
    snprintf(name, sizeof name, "rank.%d", r);
    write_file(name, line, strlen(line));
    if (!strcmp(mode, "die") && r == 1) _exit(7); /* mid-run, rank 0 in a collective */
    if (!strcmp(mode, "die")) {
        for (int i = 0; i < 100000; i++)
            if (fg_fabric_reduce_scalar(f, 1, FG_REDUCE_OP_SUM, &s) != FG_OK) return 1;
        return 0;
    }
    return s == 3 ? 0 : 21;
}

static fg_fabric_config reexec_config(void) {
    return (fg_fabric_config){.devices = "2", .strategy = "ddp"};
}

/* A re-executed rank: runs the fabric as its parent did, then exits. */
__attribute__((constructor)) static void reexec_child(void) {
    const char *mode = getenv("FG_TEST_FABRIC_CHILD");
    const char *rank = getenv("FULGUR_RANK");
    if (!mode || !rank || !strcmp(rank, "0")) return;
    if (!strcmp(mode, "die_early")) _exit(7); /* before it joins */
    fg_fabric_config cfg = reexec_config();
    fg_fabric *f = fg_fabric_new(&cfg);
    int rc = f ? fg_fabric_launch(f, reexec_run, NULL) : 2;
    fg_fabric_free(f);
    fflush(NULL);
    _exit(rc);
}

TEST(reexec_two_ranks) {
    clean_env();
    setenv("FG_TEST_DIR", tmp_dir(), 1);
    setenv("FG_TEST_FABRIC_CHILD", "sum", 1);
    fg_fabric_config cfg = reexec_config();
    fg_fabric *f = fg_fabric_new(&cfg);
    CHECK(f && fg_fabric_plan(f)->launcher == FG_LAUNCHER_REEXEC);
    if (!f) return;
    CHECK_MSG(fg_fabric_launch(f, reexec_run, NULL) == 0, "%s", fg_last_error());
    char line[256] = "";
    for (int r = 0; r < 2; r++) {
        char name[32], want[128];
        snprintf(name, sizeof name, "rank.%d", r);
        memset(line, 0, sizeof line);
        CHECK(read_file(name, line, sizeof line - 1) > 0);
        snprintf(want, sizeof want, "rank %d of 2, local %d, sum 3, strategy ddp, threads 1", r, r);
        CHECK_CONTAINS(line, want);
    }
    /* the contract is gone once the job is over: a second launch starts again */
    CHECK(!getenv("FULGUR_RANK") && !getenv("WORLD_SIZE"));
    CHECK_MSG(fg_fabric_launch(f, reexec_run, NULL) == 0, "%s", fg_last_error());
    fg_fabric_free(f);
    clean_env();
}

TEST(reexec_rank_dies) {
    static const char *const modes[] = {"die", "die_early"};
    for (int k = 0; k < 2; k++) {
        clean_env();
        setenv("FG_TEST_DIR", tmp_dir(), 1);
        setenv("FG_TEST_FABRIC_CHILD", modes[k], 1);
        fg_fabric_config cfg = reexec_config();
        fg_fabric *f = fg_fabric_new(&cfg);
        if (!f) {
            CHECK(f != NULL);
            continue;
        }
        CHECK(fg_fabric_launch(f, reexec_run, NULL) != 0);
        CHECK_CONTAINS(fg_last_error(), "rank 1 (pid ");
        CHECK_CONTAINS(fg_last_error(), "exited with code 7");
        fg_fabric_free(f);
    }
    clean_env();
}
