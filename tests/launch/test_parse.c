/* launch: parsing of accelerator, devices (every row of the Lightning's devices table and
 * every error case), strategy names, precision settings, the launch plan (launcher, world size,
 * ranks, threads per rank) for launched and not-launched environments, and
 * the environment contract read back by fg_cluster_detect. */
#include <stdlib.h>
#include <string.h>

#include "fulgur/device.h"
#include "fulgur/launch.h"
#include "harness.h"

/* A clean environment: no launcher variables, 4 CPU devices, no thread setting. */
static void clean_env(void) {
    fg_launch_unexport();
    static const char *const more[] = {"OMPI_COMM_WORLD_RANK",
                                       "OMPI_COMM_WORLD_SIZE",
                                       "SLURM_PROCID",
                                       "SLURM_NTASKS",
                                       "FULGUR_NUM_THREADS",
                                       "TORCHELASTIC_RUN_ID",
                                       NULL};
    for (int i = 0; more[i]; i++) unsetenv(more[i]);
    setenv("FULGUR_CPU_DEVICES", "4", 1);
}

static bool ids_are(const fg_devices *d, const int *want, int n) {
    if (d->count != n) return false;
    for (int i = 0; i < n; i++)
        if (d->ids[i] != want[i]) return false;
    return true;
}

#define CHECK_IDS(d, ...)                                                                          \
    do {                                                                                           \
        const int w_[] = {__VA_ARGS__};                                                            \
        char b_[128];                                                                              \
        CHECK_MSG(ids_are(&(d), w_, (int)(sizeof w_ / sizeof w_[0])), "got %s",                    \
                  fg_devices_format(&(d), b_, sizeof b_));                                         \
    } while (0)

/* ----------------------------------------------------------- devices */

TEST(devices_table_rows) {
    fg_devices d;
    /* 3 (int): the first 3 */
    CHECK_OK(fg_launch_devices_count(3, 4, &d));
    CHECK_IDS(d, 0, 1, 2);
    CHECK(!d.listed && !d.all && d.available == 4);
    /* -1 (int): all */
    CHECK_OK(fg_launch_devices_count(-1, 4, &d));
    CHECK_IDS(d, 0, 1, 2, 3);
    CHECK(d.all);
    /* [0] (list) */
    CHECK_OK(fg_launch_devices_list((int[]){0}, 1, 4, &d));
    CHECK_IDS(d, 0);
    CHECK(d.listed);
    /* [1, 3] (list) */
    CHECK_OK(fg_launch_devices_list((int[]){1, 3}, 2, 4, &d));
    CHECK_IDS(d, 1, 3);
    /* "3" (str) */
    CHECK_OK(fg_launch_parse_devices("3", 4, &d));
    CHECK_IDS(d, 0, 1, 2);
    CHECK(!d.listed);
    /* "1, 3" (str) */
    CHECK_OK(fg_launch_parse_devices("1, 3", 4, &d));
    CHECK_IDS(d, 1, 3);
    CHECK(d.listed);
    /* "-1" (str) */
    CHECK_OK(fg_launch_parse_devices("-1", 4, &d));
    CHECK_IDS(d, 0, 1, 2, 3);
    CHECK(d.all);
}

TEST(devices_more_forms) {
    fg_devices d;
    CHECK_OK(fg_launch_parse_devices("[1, 3]", 4, &d));
    CHECK_IDS(d, 1, 3);
    CHECK_OK(fg_launch_parse_devices("[0]", 4, &d));
    CHECK_IDS(d, 0);
    CHECK_OK(fg_launch_parse_devices("0,", 4, &d)); /* Lightning: GPU 0, as a list */
    CHECK_IDS(d, 0);
    CHECK(d.listed);
    CHECK_OK(fg_launch_parse_devices("[2,]", 4, &d));
    CHECK_IDS(d, 2);
    CHECK_OK(fg_launch_parse_devices("3,1", 4, &d)); /* the order given is kept */
    CHECK_IDS(d, 3, 1);
    CHECK_OK(fg_launch_parse_devices("  2 ", 4, &d));
    CHECK_IDS(d, 0, 1);
    CHECK_OK(fg_launch_parse_devices(" [ 0 , 2 ] ", 4, &d));
    CHECK_IDS(d, 0, 2);
    CHECK_OK(fg_launch_parse_devices("auto", 4, &d));
    CHECK_IDS(d, 0);
    CHECK_OK(fg_launch_parse_devices(NULL, 4, &d));
    CHECK_IDS(d, 0);
    CHECK_OK(fg_launch_parse_devices("4", 4, &d)); /* exactly all */
    CHECK_IDS(d, 0, 1, 2, 3);
    CHECK_OK(fg_launch_parse_devices("-1", 1, &d));
    CHECK_IDS(d, 0);
    char buf[64];
    CHECK(!strcmp(fg_devices_format(&d, buf, sizeof buf), "[0]"));
    CHECK_OK(fg_launch_parse_devices("1,3", 4, &d));
    CHECK(!strcmp(fg_devices_format(&d, buf, sizeof buf), "[1, 3]"));
}

#define CHECK_DEV_ERR(str, avail, needle)                                                          \
    do {                                                                                           \
        fg_devices d_;                                                                             \
        CHECK_STATUS(fg_launch_parse_devices((str), (avail), &d_), FG_EINVAL);                     \
        CHECK_CONTAINS(fg_last_error(), (needle));                                                 \
    } while (0)

TEST(devices_errors) {
    fg_devices d;
    /* 0 and "" */
    CHECK_STATUS(fg_launch_devices_count(0, 2, &d), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "devices=0: at least one device is needed; use 1..2 or -1");
    CHECK_DEV_ERR("0", 2, "devices=\"0\": at least one device is needed");
    CHECK_DEV_ERR("", 2, "devices=\"\": no device given; expected a count like \"2\"");
    CHECK_DEV_ERR("   ", 2, "no device given");
    CHECK_DEV_ERR("[]", 2, "devices=\"[]\": no device given");
    CHECK_DEV_ERR(",", 2, "no device given");
    /* duplicates */
    CHECK_DEV_ERR("[1, 1]", 2, "devices=\"[1, 1]\": device 1 is listed twice");
    CHECK_DEV_ERR("0,1,0", 2, "device 0 is listed twice");
    CHECK_STATUS(fg_launch_devices_list((int[]){1, 1}, 2, 4, &d), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "devices=[1, 1]: device 1 is listed twice");
    /* past what is available */
    CHECK_STATUS(fg_launch_devices_count(5, 2, &d), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "devices=5: only 2 devices here; use 1..2 or -1");
    CHECK_DEV_ERR("5", 2, "devices=\"5\": only 2 devices here; use 1..2 or -1");
    CHECK_DEV_ERR("2", 1, "only 1 device here; use 1 or -1");
    CHECK_DEV_ERR("[1, 3]", 2, "devices=\"[1, 3]\": device 3 does not exist; ids go 0..1");
    CHECK_OK(fg_launch_parse_devices("1", 1, &d));
    CHECK_STATUS(fg_launch_devices_list((int[]){0, 7}, 2, 4, &d), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "device 7 does not exist");
    /* not a number or list */
    CHECK_DEV_ERR("abc", 2,
                  "devices=\"abc\": expected a count like \"2\", \"-1\" for all, or ids "
                  "like \"1, 3\" / \"[1, 3]\"");
    CHECK_DEV_ERR("1,,3", 2, "devices=\"1,,3\": expected");
    CHECK_DEV_ERR("[1, 3", 2, "missing \"]\"");
    CHECK_DEV_ERR("1, 3]", 2, "\"]\" without \"[\"");
    CHECK_DEV_ERR("[1] 2", 2, "expected");
    CHECK_DEV_ERR("1.5", 2, "expected");
    CHECK_DEV_ERR("+2", 2, "expected");
    CHECK_DEV_ERR("2 3", 2, "expected");
    CHECK_DEV_ERR("99999999999999", 2, "expected");
    /* negatives */
    CHECK_DEV_ERR("-2", 2, "devices=\"-2\": a count must be positive, or -1 for all");
    CHECK_STATUS(fg_launch_devices_count(-3, 2, &d), FG_EINVAL);
    CHECK_DEV_ERR("[-1]", 2, "device -1: ids are 0 or more");
    CHECK_DEV_ERR("1,-1", 2, "device -1: ids are 0 or more");
    /* the caller's count of devices */
    CHECK_STATUS(fg_launch_parse_devices("1", 0, &d), FG_EINVAL);
    CHECK_STATUS(fg_launch_devices_list(NULL, 1, 2, &d), FG_EINVAL);
}

/* ------------------------------------------------------- accelerator */

TEST(accelerator) {
    /* what gpu and auto give depends on the build and the machine */
    char why[256];
    int gpus = fg_device_count(FG_CUDA, why, sizeof why);
    fg_accelerator a = FG_ACCELERATOR_GPU;
    CHECK_OK(fg_launch_parse_accelerator("cpu", &a));
    CHECK(a == FG_ACCELERATOR_CPU);
    a = FG_ACCELERATOR_GUARDED;
    CHECK_OK(fg_launch_parse_accelerator("auto", &a));
    CHECK(a == (gpus > 0 ? FG_ACCELERATOR_GPU : FG_ACCELERATOR_CPU));
    CHECK_OK(fg_launch_parse_accelerator(NULL, &a));
    CHECK(a == (gpus > 0 ? FG_ACCELERATOR_GPU : FG_ACCELERATOR_CPU));
    CHECK_OK(fg_launch_parse_accelerator("CPU", &a));
    CHECK(!strcmp(fg_accelerator_name(a), "cpu"));
    CHECK_OK(fg_launch_parse_accelerator("Guarded", &a));
    CHECK(a == FG_ACCELERATOR_GUARDED && !strcmp(fg_accelerator_name(a), "guarded"));
    if (gpus == 0) {
        CHECK_STATUS(fg_launch_parse_accelerator("gpu", &a), FG_EUNSUPPORTED);
        CHECK_CONTAINS(fg_last_error(), "accelerator=\"gpu\"");
        /* which of the two is missing, and what to use instead */
        CHECK_CONTAINS(fg_last_error(), why);
        CHECK_CONTAINS(fg_last_error(), "use \"cpu\"");
        CHECK_CONTAINS(fg_last_error(), "\"guarded\"");
        CHECK_STATUS(fg_launch_parse_accelerator("cuda", &a), FG_EUNSUPPORTED);
        CHECK_CONTAINS(fg_last_error(), "accelerator=\"cuda\"");
    } else {
        CHECK_OK(fg_launch_parse_accelerator("cuda", &a));
        CHECK(a == FG_ACCELERATOR_GPU);
    }
    CHECK_STATUS(fg_launch_parse_accelerator("tpu", &a), FG_EUNSUPPORTED);
    CHECK_STATUS(fg_launch_parse_accelerator("gpus", &a), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(),
                   "accelerator=\"gpus\": expected one of auto, cpu, gpu, cuda, guarded");
    CHECK_STATUS(fg_launch_parse_accelerator("", &a), FG_EINVAL);
}

TEST(accelerator_auto_in_the_plan_line) {
    char why[256], line[1024];
    int gpus = fg_device_count(FG_CUDA, why, sizeof why);
    fg_cluster_info env = {.source = "none"};
    fg_launch_plan p;
    CHECK_OK(fg_launch_plan_make(&(fg_launch_opts){.devices = "1"}, &env, &p));
    CHECK(p.accelerator_auto);
    fg_launch_plan_format(&p, line, sizeof line);
    if (gpus == 0) {
        CHECK_CONTAINS(line, "single on cpu, 1 rank");
        CHECK_CONTAINS(line, strncmp(why, "this build has no CUDA", 22) == 0
                                 ? ", accelerator auto: cpu (no CUDA backend in this build)"
                                 : ", accelerator auto: cpu (no GPU answers)");
    } else {
        CHECK_CONTAINS(line, "accelerator auto: gpu (");
    }
    CHECK_OK(
        fg_launch_plan_make(&(fg_launch_opts){.accelerator = "guarded", .devices = "2"}, &env, &p));
    fg_launch_plan_format(&p, line, sizeof line);
    CHECK(!p.accelerator_auto && p.accelerator == FG_ACCELERATOR_GUARDED);
    CHECK_CONTAINS(line, "ddp on guarded, 2 ranks");
    CHECK(strstr(line, "accelerator auto") == NULL);
}

/* ---------------------------------------------------------- strategy */

TEST(strategy_names) {
    fg_strategy_kind s;
    static const struct {
        const char *name;
        fg_strategy_kind want;
    } ok[] = {{"single", FG_STRATEGY_SINGLE},
              {"single_device", FG_STRATEGY_SINGLE},
              {"dp", FG_STRATEGY_DP},
              {"ddp", FG_STRATEGY_DDP},
              {"ddp_spawn", FG_STRATEGY_DDP_SPAWN},
              {"ddp_fork", FG_STRATEGY_DDP_FORK},
              {"DDP", FG_STRATEGY_DDP},
              {"ddp_notebook", FG_STRATEGY_DDP_FORK},
              {"deepspeed_stage_1", FG_STRATEGY_DEEPSPEED_STAGE_1},
              {"deepspeed_stage_2", FG_STRATEGY_DEEPSPEED_STAGE_2},
              {"DeepSpeed", FG_STRATEGY_DEEPSPEED_STAGE_2},
              {"fsdp", FG_STRATEGY_FSDP},
              {"bagua", FG_STRATEGY_BAGUA}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        CHECK_OK(fg_launch_parse_strategy(ok[i].name, 1, 1, &s));
        CHECK_MSG(s == ok[i].want, "%s -> %d", ok[i].name, (int)s);
    }
    for (int k = 0; k < FG_STRATEGY_COUNT; k++) {
        CHECK_OK(fg_launch_parse_strategy(fg_strategy_kind_name((fg_strategy_kind)k), 1, 1, &s));
        CHECK(s == (fg_strategy_kind)k);
    }
    CHECK(!strcmp(fg_strategy_kind_name((fg_strategy_kind)99), "?"));
    /* auto */
    CHECK_OK(fg_launch_parse_strategy("auto", 1, 1, &s));
    CHECK(s == FG_STRATEGY_SINGLE);
    CHECK_OK(fg_launch_parse_strategy(NULL, 2, 1, &s));
    CHECK(s == FG_STRATEGY_DDP);
    CHECK_OK(fg_launch_parse_strategy("auto", 1, 2, &s));
    CHECK(s == FG_STRATEGY_DDP);
}

TEST(strategy_errors) {
    fg_strategy_kind s;
    CHECK_STATUS(fg_launch_parse_strategy("single", 2, 1, &s), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "strategy=\"single\" runs on one device, but devices gives 2");
    CHECK_STATUS(fg_launch_parse_strategy("dp", 2, 2, &s), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "num_nodes=2");
    /* the seeds' sharded DDP is ZeRO stage 2: aliases of deepspeed_stage_2 */
    static const char *const sharded[] = {"ddp_sharded", "DDP_Sharded_Spawn", NULL};
    for (int i = 0; sharded[i]; i++) {
        CHECK_OK(fg_launch_parse_strategy(sharded[i], 2, 1, &s));
        CHECK_MSG(s == FG_STRATEGY_DEEPSPEED_STAGE_2, "%s -> %d", sharded[i], (int)s);
    }
    CHECK_STATUS(fg_launch_parse_strategy("hybrid", 2, 1, &s), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "strategy=\"hybrid\": fulgur spells it strategy \"fsdp\" with "
                                    "sharding_strategy HYBRID_SHARD");
    /* what fulgur builds under another spelling says which */
    CHECK_STATUS(fg_launch_parse_strategy("fsdp_shard_grad_op", 2, 1, &s), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "strategy \"fsdp\" with sharding_strategy SHARD_GRAD_OP");
    CHECK_STATUS(fg_launch_parse_strategy("fsdp_full_shard", 2, 1, &s), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "its default sharding_strategy FULL_SHARD");
    CHECK_OK(fg_launch_parse_strategy("DeepSpeed_Stage_3", 2, 1, &s));
    CHECK(s == FG_STRATEGY_DEEPSPEED_STAGE_3);
    CHECK_STATUS(fg_launch_parse_strategy("dpp", 2, 1, &s), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "strategy=\"dpp\": unknown; expected one of auto, single, dp, "
                                    "ddp, ddp_spawn, ddp_fork");
    CHECK_STATUS(fg_launch_parse_strategy("", 2, 1, &s), FG_EINVAL);
}

/* Lightning's offload names: the kind, and the offload they turn on */
TEST(strategy_offload_names) {
    fg_strategy_kind s;
    fg_offload_device o, p;
    CHECK_OK(fg_launch_parse_strategy("deepspeed_stage_2_offload", 2, 1, &s));
    CHECK(s == FG_STRATEGY_DEEPSPEED_STAGE_2);
    fg_launch_strategy_offload("deepspeed_stage_2_offload", &o, &p);
    CHECK(o == FG_OFFLOAD_CPU && p == FG_OFFLOAD_NONE);
    CHECK_OK(fg_launch_parse_strategy("FSDP_CPU_OFFLOAD", 2, 1, &s));
    CHECK(s == FG_STRATEGY_FSDP);
    fg_launch_strategy_offload("fsdp_cpu_offload", &o, &p);
    CHECK(o == FG_OFFLOAD_CPU && p == FG_OFFLOAD_CPU);
    fg_launch_strategy_offload("deepspeed_stage_3_offload_nvme", &o, &p);
    CHECK(o == FG_OFFLOAD_NVME && p == FG_OFFLOAD_NVME);
    fg_launch_strategy_offload("deepspeed_stage_2", &o, &p);
    CHECK(o == FG_OFFLOAD_NONE && p == FG_OFFLOAD_NONE);
    fg_launch_strategy_offload(NULL, &o, NULL);
    CHECK(o == FG_OFFLOAD_NONE);
    CHECK_OK(fg_launch_parse_strategy("deepspeed_stage_3_offload_nvme", 2, 1, &s));
    CHECK(s == FG_STRATEGY_DEEPSPEED_STAGE_3);
    CHECK_OK(fg_launch_parse_strategy("deepspeed_stage_3_offload", 2, 1, &s));
    CHECK(s == FG_STRATEGY_DEEPSPEED_STAGE_3);
    fg_launch_strategy_offload("deepspeed_stage_3_offload", &o, &p);
    CHECK(o == FG_OFFLOAD_CPU && p == FG_OFFLOAD_CPU);
}

/* --------------------------------------------------------- precision */

TEST(precision_names) {
    static const struct {
        const char *name;
        fg_precision_kind want;
    } ok[] = {{NULL, FG_PRECISION_32_TRUE},
              {"32-true", FG_PRECISION_32_TRUE},
              {"32", FG_PRECISION_32_TRUE},
              {"64-true", FG_PRECISION_64_TRUE},
              {"64", FG_PRECISION_64_TRUE},
              {"64-TRUE", FG_PRECISION_64_TRUE},
              {"bf16-mixed", FG_PRECISION_BF16_MIXED},
              {"bf16", FG_PRECISION_BF16_MIXED},
              {"16-mixed", FG_PRECISION_16_MIXED},
              {"16", FG_PRECISION_16_MIXED}};
    fg_precision_kind p;
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        p = FG_PRECISION_COUNT;
        CHECK_OK(fg_launch_parse_precision(ok[i].name, &p));
        CHECK_MSG(p == ok[i].want, "%s -> %d", ok[i].name ? ok[i].name : "NULL", (int)p);
    }
    CHECK(!strcmp(fg_precision_kind_name(FG_PRECISION_32_TRUE), "32-true"));
    CHECK(!strcmp(fg_precision_kind_name(FG_PRECISION_BF16_TRUE), "bf16-true"));
    CHECK(!strcmp(fg_precision_kind_name((fg_precision_kind)99), "?"));
    /* Lightning's true-half settings */
    CHECK_OK(fg_launch_parse_precision("BF16-True", &p));
    CHECK(p == FG_PRECISION_BF16_TRUE);
    CHECK_OK(fg_launch_parse_precision("16-true", &p));
    CHECK(p == FG_PRECISION_16_TRUE);
    CHECK_STATUS(fg_launch_parse_precision("12", &p), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "precision=\"12\": unknown; expected one of 32-true (32)");
    CHECK_STATUS(fg_launch_parse_precision("", &p), FG_EINVAL);
    CHECK_STATUS(fg_launch_parse_precision("32", NULL), FG_EINVAL);
    /* the plan carries it, and its line names it */
    fg_cluster_info env = {
        .world_size = 1, .local_world_size = 1, .num_nodes = 1, .source = "none"};
    fg_launch_plan plan;
    CHECK_OK(fg_launch_plan_make(&(fg_launch_opts){.precision = "64"}, &env, &plan));
    CHECK(plan.precision == FG_PRECISION_64_TRUE);
    char line[512];
    CHECK_CONTAINS(fg_launch_plan_format(&plan, line, sizeof line), "precision 64-true");
    CHECK_OK(fg_launch_plan_make(&(fg_launch_opts){.precision = "bf16-true"}, &env, &plan));
    CHECK(plan.precision == FG_PRECISION_BF16_TRUE);
}

/* -------------------------------------------------------------- plan */

static fg_cluster_info none_env(void) {
    return (fg_cluster_info){
        .world_size = 1, .local_world_size = 1, .num_nodes = 1, .source = "none"};
}

static fg_cluster_info launched_env(int rank, int world, int local_rank, int local_world, int node,
                                    int nodes, const char *source) {
    fg_cluster_info c = {.rank = rank,
                         .world_size = world,
                         .local_rank = local_rank,
                         .local_world_size = local_world,
                         .node_rank = node,
                         .num_nodes = nodes,
                         .master_port = 29500,
                         .source = source};
    strcpy(c.master_addr, "10.0.0.1");
    return c;
}

static int cores_over(int n) { return fg_num_cores() / n > 0 ? fg_num_cores() / n : 1; }

TEST(plan_not_launched) {
    clean_env();
    fg_cluster_info env = none_env();
    fg_launch_plan p;
    /* ddp on 2 devices: re-exec; this process is rank 0 */
    CHECK_OK(fg_launch_plan_make(&(fg_launch_opts){.devices = "2", .strategy = "ddp"}, &env, &p));
    CHECK(p.launcher == FG_LAUNCHER_REEXEC && !p.launched);
    CHECK(p.world_size == 2 && p.local_world_size == 2 && p.rank == 0 && p.local_rank == 0);
    CHECK(p.threads_per_rank == cores_over(2));
    CHECK(!strcmp(p.threads_from, "cores / local ranks"));
    CHECK(p.cluster.world_size == 2 && p.cluster.rank == 0 && !strcmp(p.cluster.source, "fulgur"));
    CHECK_OK(fg_cluster_validate(&p.cluster));
    char line[256];
    CHECK_CONTAINS(fg_launch_plan_format(&p, line, sizeof line), "ddp on cpu, 2 ranks");
    CHECK_CONTAINS(line, "launcher re-exec");
    /* auto with 3 devices is ddp too */
    CHECK_OK(fg_launch_plan_make(&(fg_launch_opts){.devices = "[0, 1, 3]"}, &env, &p));
    CHECK(p.strategy == FG_STRATEGY_DDP && p.launcher == FG_LAUNCHER_REEXEC && p.world_size == 3);
    CHECK(p.threads_per_rank == cores_over(3));
    /* ddp on one device: nothing to start */
    CHECK_OK(fg_launch_plan_make(&(fg_launch_opts){.devices = "1", .strategy = "ddp"}, &env, &p));
    CHECK(p.launcher == FG_LAUNCHER_NONE && p.world_size == 1 && p.rank == 0);
    CHECK(p.threads_per_rank == fg_num_cores());
    /* defaults: one device, single */
    CHECK_OK(fg_launch_plan_make(NULL, &env, &p));
    CHECK(p.strategy == FG_STRATEGY_SINGLE && p.launcher == FG_LAUNCHER_NONE && p.world_size == 1);
    CHECK(p.accelerator == FG_ACCELERATOR_CPU && p.devices.count == 1 && p.num_nodes == 1);
    /* ddp_spawn / ddp_fork: fork; the parent is no rank */
    CHECK_OK(
        fg_launch_plan_make(&(fg_launch_opts){.devices = "3", .strategy = "ddp_spawn"}, &env, &p));
    CHECK(p.launcher == FG_LAUNCHER_FORK && p.world_size == 3 && p.rank == -1 &&
          p.local_rank == -1);
    CHECK(p.cluster.rank == 0 && p.cluster.world_size == 3);
    CHECK_OK(
        fg_launch_plan_make(&(fg_launch_opts){.devices = "1", .strategy = "ddp_fork"}, &env, &p));
    CHECK(p.launcher == FG_LAUNCHER_FORK && p.world_size == 1);
    /* dp: one process, threads; kernel threads are the whole machine's */
    CHECK_OK(fg_launch_plan_make(&(fg_launch_opts){.devices = "-1", .strategy = "dp"}, &env, &p));
    CHECK(p.launcher == FG_LAUNCHER_THREADS && p.world_size == 1 && p.devices.count == 4);
    CHECK(p.threads_per_rank == fg_num_cores());
    /* single */
    CHECK_OK(fg_launch_plan_make(&(fg_launch_opts){.strategy = "single", .accelerator = "cpu"},
                                 &env, &p));
    CHECK(p.launcher == FG_LAUNCHER_NONE);
}

TEST(plan_threads) {
    clean_env();
    fg_cluster_info env = none_env();
    fg_launch_plan p;
    setenv("FULGUR_NUM_THREADS", "3", 1);
    CHECK_OK(fg_launch_plan_make(&(fg_launch_opts){.devices = "2"}, &env, &p));
    CHECK(p.threads_per_rank == 3 && !strcmp(p.threads_from, "FULGUR_NUM_THREADS"));
    CHECK_OK(
        fg_launch_plan_make(&(fg_launch_opts){.devices = "2", .threads_per_rank = 5}, &env, &p));
    CHECK(p.threads_per_rank == 5 && !strcmp(p.threads_from, "threads_per_rank"));
    setenv("FULGUR_NUM_THREADS", "lots", 1);
    CHECK_STATUS(fg_launch_plan_make(&(fg_launch_opts){.devices = "2"}, &env, &p), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "FULGUR_NUM_THREADS=\"lots\"");
    setenv("FULGUR_NUM_THREADS", "0", 1);
    CHECK_STATUS(fg_launch_plan_make(&(fg_launch_opts){.devices = "2"}, &env, &p), FG_EINVAL);
    unsetenv("FULGUR_NUM_THREADS");
    int t;
    const char *from;
    CHECK_OK(fg_launch_threads_per_rank(1000000, &t, &from));
    CHECK(t == 1); /* never below one */
    CHECK_STATUS(fg_launch_plan_make(&(fg_launch_opts){.threads_per_rank = -1}, &env, &p),
                 FG_EINVAL);
}

TEST(plan_devices_are_cores) {
    clean_env();
    unsetenv("FULGUR_CPU_DEVICES");
    fg_cluster_info env = none_env();
    fg_launch_plan p;
    int cores = fg_num_cores();
    char too_many[16], want[160];
    snprintf(too_many, sizeof too_many, "%d", cores + 3);
    CHECK_STATUS(fg_launch_plan_make(&(fg_launch_opts){.devices = too_many}, &env, &p), FG_EINVAL);
    if (cores > 1)
        snprintf(want, sizeof want,
                 "devices=\"%d\": only %d CPU devices here (cores); use 1..%d or -1", cores + 3,
                 cores, cores);
    else
        snprintf(want, sizeof want, "devices=\"%d\": only 1 CPU device here (cores); use 1 or -1",
                 cores + 3);
    CHECK_CONTAINS(fg_last_error(), want);
    CHECK_CONTAINS(fg_last_error(), "FULGUR_CPU_DEVICES=");
    CHECK_OK(fg_launch_plan_make(&(fg_launch_opts){.devices = "-1"}, &env, &p));
    CHECK(p.devices.count == cores);
    /* FULGUR_CPU_DEVICES lets more ranks than cores run */
    setenv("FULGUR_CPU_DEVICES", too_many, 1);
    CHECK_OK(fg_launch_plan_make(&(fg_launch_opts){.devices = too_many}, &env, &p));
    CHECK(p.world_size == cores + 3 && p.threads_per_rank == 1);
    setenv("FULGUR_CPU_DEVICES", "0", 1);
    CHECK_STATUS(fg_launch_plan_make(NULL, &env, &p), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "FULGUR_CPU_DEVICES");
    setenv("FULGUR_CPU_DEVICES", "x", 1);
    CHECK_STATUS(fg_launch_plan_make(NULL, &env, &p), FG_EINVAL);
    clean_env();
    /* parse errors come through the plan unchanged */
    CHECK_STATUS(fg_launch_plan_make(&(fg_launch_opts){.devices = "[1, 1]"}, &env, &p), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "devices=\"[1, 1]\": device 1 is listed twice");
    CHECK_STATUS(fg_launch_plan_make(&(fg_launch_opts){.accelerator = "gpu"}, &env, &p),
                 FG_EUNSUPPORTED);
    CHECK_STATUS(
        fg_launch_plan_make(&(fg_launch_opts){.strategy = "hybrid", .devices = "2"}, &env, &p),
        FG_EINVAL);
    CHECK_STATUS(fg_launch_plan_make(&(fg_launch_opts){.num_nodes = -1}, &env, &p), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "num_nodes=-1");
}

TEST(plan_launched) {
    clean_env();
    fg_launch_plan p;
    /* node 1 of 2, 2 ranks each, under fulgur run: join as rank 2 */
    fg_cluster_info env = launched_env(2, 4, 0, 2, 1, 2, "fulgur");
    CHECK_OK(fg_launch_plan_make(
        &(fg_launch_opts){.devices = "2", .strategy = "ddp", .num_nodes = 2}, &env, &p));
    CHECK(p.launched && p.launcher == FG_LAUNCHER_NONE);
    CHECK(p.world_size == 4 && p.rank == 2 && p.local_rank == 0 && p.node_rank == 1);
    CHECK(p.local_world_size == 2 && p.threads_per_rank == cores_over(2));
    CHECK(!strcmp(p.cluster.master_addr, "10.0.0.1") && !strcmp(p.cluster.source, "fulgur"));
    /* mpirun -np 2 with devices=2 */
    env = launched_env(1, 2, 1, 2, 0, 1, "openmpi");
    CHECK_OK(fg_launch_plan_make(&(fg_launch_opts){.devices = "2"}, &env, &p));
    CHECK(p.launcher == FG_LAUNCHER_NONE && p.rank == 1 && p.strategy == FG_STRATEGY_DDP);
    /* devices left to fulgur: the launcher's ranks on this node, and its nodes */
    env = launched_env(5, 6, 2, 3, 1, 2, "torchrun");
    CHECK_OK(fg_launch_plan_make(NULL, &env, &p));
    CHECK(p.strategy == FG_STRATEGY_DDP && p.launcher == FG_LAUNCHER_NONE && p.rank == 5);
    CHECK(p.devices.count == 3 && p.num_nodes == 2 && p.world_size == 6);
    CHECK_OK(fg_launch_plan_make(&(fg_launch_opts){.devices = " auto "}, &env, &p));
    CHECK(p.devices.count == 3);
    CHECK_STATUS(fg_launch_plan_make(&(fg_launch_opts){.num_nodes = 1}, &env, &p), FG_EMISMATCH);
    /* a launcher of one rank and one device */
    env = launched_env(0, 1, 0, 1, 0, 1, "slurm");
    CHECK_OK(fg_launch_plan_make(NULL, &env, &p));
    CHECK(p.launched && p.launcher == FG_LAUNCHER_NONE && p.world_size == 1);
    CHECK_OK(fg_launch_plan_make(&(fg_launch_opts){.strategy = "dp", .devices = "2"}, &env, &p));
    CHECK(p.launcher == FG_LAUNCHER_THREADS);
}

TEST(plan_ddp2) {
    clean_env();
    fg_launch_plan p;
    /* one node: one process, devices its dp threads */
    CHECK_OK(fg_launch_plan_make(&(fg_launch_opts){.strategy = "ddp2", .devices = "2"}, NULL, &p));
    CHECK(p.strategy == FG_STRATEGY_DDP2 && p.launcher == FG_LAUNCHER_THREADS);
    CHECK(p.world_size == 1 && p.devices.count == 2 && p.threads_per_rank == cores_over(1));
    /* mpirun with one process on each of 2 nodes */
    fg_cluster_info env = launched_env(1, 2, 0, 1, 1, 2, "openmpi");
    CHECK_OK(fg_launch_plan_make(
        &(fg_launch_opts){.strategy = "ddp2", .devices = "2", .num_nodes = 2}, &env, &p));
    CHECK(p.launcher == FG_LAUNCHER_THREADS && p.world_size == 2 && p.rank == 1);
    CHECK(p.devices.count == 2 && p.node_rank == 1);
    /* two processes on a node: ddp2 wants one */
    env = launched_env(1, 4, 1, 2, 0, 2, "openmpi");
    CHECK_STATUS(
        fg_launch_plan_make(&(fg_launch_opts){.strategy = "ddp2", .devices = "2", .num_nodes = 2},
                            &env, &p),
        FG_EMISMATCH);
    CHECK_CONTAINS(fg_last_error(), "one process per node");
}

TEST(plan_launched_disagrees) {
    clean_env();
    fg_launch_plan p;
    fg_cluster_info env = launched_env(0, 4, 0, 4, 0, 1, "torchrun");
    CHECK_STATUS(
        fg_launch_plan_make(&(fg_launch_opts){.devices = "2", .strategy = "ddp"}, &env, &p),
        FG_EMISMATCH);
    CHECK_CONTAINS(fg_last_error(), "the launcher (torchrun) started 4 ranks, but devices x "
                                    "num_nodes = 2 x 1 = 2");
    env = launched_env(0, 1, 0, 1, 0, 1, "fulgur");
    CHECK_STATUS(
        fg_launch_plan_make(&(fg_launch_opts){.devices = "2", .strategy = "ddp"}, &env, &p),
        FG_EMISMATCH);
    CHECK_CONTAINS(fg_last_error(), "started 1 rank, but");
    env = launched_env(1, 2, 1, 2, 0, 1, "fulgur");
    CHECK_STATUS(
        fg_launch_plan_make(&(fg_launch_opts){.devices = "2", .strategy = "ddp_spawn"}, &env, &p),
        FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(),
                   "already launched as rank 1 of 2 (fulgur); use strategy \"ddp\"");
    CHECK_STATUS(fg_launch_plan_make(&(fg_launch_opts){.devices = "2", .strategy = "dp"}, &env, &p),
                 FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(),
                   "strategy=\"dp\" runs in one process, but the launcher (fulgur) "
                   "started 2 ranks");
    CHECK_STATUS(fg_launch_plan_make(&(fg_launch_opts){.devices = "1"}, &env, &p), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "strategy=\"single\" runs in one process");
    /* a broken environment */
    env = launched_env(3, 2, 0, 2, 0, 1, "explicit");
    CHECK_STATUS(fg_launch_plan_make(&(fg_launch_opts){.devices = "2"}, &env, &p), FG_EINVAL);
}

TEST(plan_nodes_by_hand) {
    clean_env();
    unsetenv("NODE_RANK");
    unsetenv("MASTER_ADDR");
    unsetenv("MASTER_PORT");
    fg_cluster_info env = none_env();
    fg_launch_plan p;
    fg_launch_opts o = {.devices = "2", .strategy = "ddp", .num_nodes = 2};
    CHECK_STATUS(fg_launch_plan_make(&o, &env, &p), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "num_nodes=2, but this process was not started by a launcher "
                                    "and NODE_RANK is not set");
    CHECK_CONTAINS(fg_last_error(), "fulgur run --nnodes 2");
    setenv("NODE_RANK", "1", 1);
    setenv("MASTER_ADDR", "10.1.2.3", 1);
    CHECK_STATUS(fg_launch_plan_make(&o, &env, &p), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "MASTER_PORT is not set");
    setenv("MASTER_PORT", "1234", 1);
    CHECK_OK(fg_launch_plan_make(&o, &env, &p));
    CHECK(p.launcher == FG_LAUNCHER_REEXEC && p.world_size == 4 && p.rank == 2 && p.node_rank == 1);
    CHECK(!strcmp(p.cluster.master_addr, "10.1.2.3") && p.cluster.master_port == 1234);
    setenv("NODE_RANK", "2", 1);
    CHECK_STATUS(fg_launch_plan_make(&o, &env, &p), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "NODE_RANK=\"2\": expected an integer in 0..1");
    setenv("NODE_RANK", "1", 1);
    o.strategy = "ddp_spawn";
    CHECK_STATUS(fg_launch_plan_make(&o, &env, &p), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "use strategy \"ddp\" across nodes");
    unsetenv("NODE_RANK");
    unsetenv("MASTER_ADDR");
    unsetenv("MASTER_PORT");
}

/* --------------------------------------------------------- contract */

TEST(contract_round_trip) {
    clean_env();
    fg_cluster_info c = launched_env(3, 4, 1, 2, 1, 2, "explicit");
    strcpy(c.job_id, "job-42");
    CHECK_OK(fg_launch_export(&c));
    CHECK(!strcmp(getenv("FULGUR_RANK"), "3") && !strcmp(getenv("RANK"), "3"));
    CHECK(!strcmp(getenv("LOCAL_WORLD_SIZE"), "2") && !strcmp(getenv("GROUP_RANK"), "1"));
    CHECK(!strcmp(getenv("NODE_RANK"), "1") && !strcmp(getenv("MASTER_PORT"), "29500"));
    fg_cluster_info d;
    CHECK_OK(fg_cluster_detect(&d));
    CHECK(!strcmp(d.source, "fulgur"));
    CHECK(d.rank == 3 && d.world_size == 4 && d.local_rank == 1 && d.local_world_size == 2);
    CHECK(d.node_rank == 1 && d.num_nodes == 2 && d.master_port == 29500);
    CHECK(!strcmp(d.master_addr, "10.0.0.1") && !strcmp(d.job_id, "job-42"));
    /* the plan reads the environment when env is NULL */
    fg_launch_plan p;
    CHECK_OK(fg_launch_plan_make(&(fg_launch_opts){.devices = "2", .num_nodes = 2}, NULL, &p));
    CHECK(p.launched && p.rank == 3 && p.launcher == FG_LAUNCHER_NONE);
    /* a bad info is refused before anything is set */
    c.rank = 9;
    CHECK_STATUS(fg_launch_export(&c), FG_EINVAL);
    fg_launch_unexport();
    CHECK(!getenv("FULGUR_RANK") && !getenv("RANK") && !getenv("MASTER_ADDR"));
    CHECK_OK(fg_cluster_detect(&d));
    CHECK(!strcmp(d.source, "none"));
    char a[64], b[64];
    fg_launch_new_job_id(a, sizeof a);
    fg_launch_new_job_id(b, sizeof b);
    CHECK(strncmp(a, "fg-", 3) == 0 && strcmp(a, b) != 0);
}

TEST(rank_exit_words) {
    char buf[128];
    fg_rank_exit k = {.rank = 1, .pid = 4242, .code = -1, .signal = 9};
    CHECK(!strcmp(fg_rank_exit_format(&k, buf, sizeof buf),
                  "rank 1 (pid 4242) was killed by signal 9 (SIGKILL)"));
    CHECK(fg_rank_exit_status(&k) == 137);
    fg_rank_exit e = {.rank = 2, .pid = 7, .code = 3};
    CHECK(!strcmp(fg_rank_exit_format(&e, buf, sizeof buf), "rank 2 (pid 7) exited with code 3"));
    CHECK(fg_rank_exit_status(&e) == 3);
    CHECK(!strcmp(fg_launcher_name(FG_LAUNCHER_REEXEC), "re-exec"));
    CHECK(!strcmp(fg_launcher_name(FG_LAUNCHER_THREADS), "threads"));
}
