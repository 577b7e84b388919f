/* fulgur env: what fulgur detects here: version, cores, CPU devices and
 * threads per rank, the cluster environment and its rank variables, the
 * launch plan for given (or default) accelerator/devices/strategy/precision/
 * num_nodes (the plan `fulgur fit` prints for the same flags),
 * the backends and kernels built in. Exit 0, 1 when the environment is
 * inconsistent (the line says why), 2 for bad flags or a plan that fails. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_flags.h"
#include "env_memory.h"
#include "fulgur/gpu.h"

static const char *const k_usage =
    "fulgur env [--accelerator A] [--devices D] [--strategy S] [--precision P] [--num-nodes N]\n"
    "           [--params N | --layers L --embd C --vocab V --ctx T] [--sharding-strategy S]";

/* The strategy table (kinds.h), row by row: what each kind launches, what
 * one of its processes is, what it shards and what it takes. */
static void env_strategies_print(void) {
    static const char *const k_ranks[] = {[FG_RANKS_ONE_PROCESS] = "one process",
                                          [FG_RANKS_PER_DEVICE] = "a process per device",
                                          [FG_RANKS_PER_NODE] = "a process per node"};
    static const struct {
        unsigned bit;
        const char *what;
    } k_shards[] = {{FG_SHARDS_OPTIM_STATE, "optimizer state"},
                    {FG_SHARDS_GRADS, "gradients"},
                    {FG_SHARDS_PARAMS, "parameters"}},
      k_takes[] = {{FG_TAKES_COMM_HOOK, "comm hooks"},
                   {FG_TAKES_DETERMINISTIC, "deterministic"},
                   {FG_TAKES_DDP_BUCKETS, "bucket_cap_mb"},
                   {FG_TAKES_BUCKET_SIZES, "bucket sizes"},
                   {FG_TAKES_OFFLOAD, "offload"},
                   {FG_TAKES_OFFLOAD_NVME, "nvme offload"},
                   {FG_TAKES_OFFLOAD_PARAMS, "parameter offload"},
                   {FG_TAKES_WRAP_POLICY, "wrap policy"},
                   {FG_TAKES_SHARDING_STRATEGY, "sharding strategy"},
                   {FG_TAKES_DEEPSPEED, "deepspeed config"},
                   {FG_TAKES_BAGUA, "bagua algorithms"},
                   {FG_TAKES_HOROVOD, "horovod options"},
                   {FG_TAKES_HIVEMIND, "hivemind options"}};
    printf("strategies:\n");
    for (int k = 0; k < FG_STRATEGY_COUNT; k++) {
        const fg_strategy_info *r = fg_strategy_info_of((fg_strategy_kind)k);
        char shards[128] = "", takes[256] = "", names[256] = "";
        size_t n = 0;
        for (size_t i = 0; i < sizeof k_shards / sizeof k_shards[0]; i++)
            if (r->shards & k_shards[i].bit)
                n += (size_t)snprintf(shards + n, sizeof shards - n, "%s%s", n ? ", " : "; shards ",
                                      k_shards[i].what);
        n = 0;
        for (size_t i = 0; i < sizeof k_takes / sizeof k_takes[0]; i++)
            if (r->takes & k_takes[i].bit)
                n += (size_t)snprintf(takes + n, sizeof takes - n, "%s%s", n ? ", " : "; takes ",
                                      k_takes[i].what);
        n = 0;
        for (int a = 0; a < r->naliases; a++)
            n += (size_t)snprintf(names + n, sizeof names - n, "%s%s", a ? ", " : " (also ",
                                  r->aliases[a].name);
        if (n) snprintf(names + n, sizeof names - n, ")");
        printf("    %-18s %s, launcher %s%s%s%s%s\n", r->name, k_ranks[r->ranks],
               fg_launcher_name(r->launcher), r->replica_threads ? ", replicas on threads" : "",
               shards, takes, names);
    }
}

typedef struct env_opts {
    const char *accel;
    const char *devices;
    const char *strategy;
    const char *precision;
    const char *sharding;
    int64_t num_nodes;
    int64_t params;
    int64_t layers;
    int64_t embd;
    int64_t vocab;
    int64_t ctx;
} env_opts;

static const cli_flag_def k_env_flags[] = {
    {.name = "Launch plan for these settings", .type = CLI_SECTION},
    {.name = "accelerator",
     .type = CLI_STR,
     .off = offsetof(env_opts, accel),
     .def = "auto",
     .help = "auto, cpu, gpu, cuda"},
    {.name = "devices",
     .type = CLI_STR,
     .off = offsetof(env_opts, devices),
     .def = "auto",
     .help = "a count (\"2\"), -1 for all, or ids (\"0,2\", \"[1, 3]\")"},
    {.name = "strategy",
     .type = CLI_STR,
     .off = offsetof(env_opts, strategy),
     .def = "auto",
     .help = "auto or a name of the strategy table (below: strategies)"},
    {.name = "precision",
     .type = CLI_STR,
     .off = offsetof(env_opts, precision),
     .def = "32-true",
     .help = "a setting of the precision table (below: precisions)"},
    {.name = "num-nodes",
     .type = CLI_INT,
     .off = offsetof(env_opts, num_nodes),
     .def = "0",
     .min = 0,
     .max = 65536,
     .help = "machines in the job; 0: 1, or the launcher's"},
    {.name = "Model state per rank (for a model of this size)", .type = CLI_SECTION},
    {.name = "params",
     .type = CLI_INT,
     .off = offsetof(env_opts, params),
     .def = "0",
     .min = 0,
     .max = INT64_MAX / 64,
     .help = "parameters of the model"},
    {.name = "layers",
     .type = CLI_INT,
     .off = offsetof(env_opts, layers),
     .def = "0",
     .min = 0,
     .max = 1 << 20,
     .help = "or a GPT's shape: transformer blocks"},
    {.name = "embd",
     .type = CLI_INT,
     .off = offsetof(env_opts, embd),
     .def = "768",
     .min = 1,
     .max = 1 << 20,
     .help = "GPT embedding width"},
    {.name = "vocab",
     .type = CLI_INT,
     .off = offsetof(env_opts, vocab),
     .def = "50304",
     .min = 1,
     .max = 1 << 30,
     .help = "GPT vocabulary"},
    {.name = "ctx",
     .type = CLI_INT,
     .off = offsetof(env_opts, ctx),
     .def = "1024",
     .min = 1,
     .max = 1 << 24,
     .help = "GPT context length"},
    {.name = "sharding-strategy",
     .type = CLI_STR,
     .off = offsetof(env_opts, sharding),
     .help = "fsdp: SHARD_GRAD_OP or NO_SHARD"},
};

int cmd_env(int argc, char **argv) {
    env_opts eo = {0};
    cli_flag flags[CLI_COUNT(k_env_flags)];
    cli_flags_bind(k_env_flags, CLI_COUNT(k_env_flags), &eo, flags);
    int nflags = CLI_COUNT(k_env_flags);
    int rc = cli_flags_parse(flags, nflags, argc, argv, k_usage, NULL, 0, NULL);
    if (rc < 0) {
        printf("\nPrints the version, cores, CPU devices, threads per rank, the cluster\n"
               "environment fulgur detects (fulgur's FULGUR_* variables, torchrun's, Open MPI's\n"
               "or SLURM's), the launch plan for the settings above, the variables that are\n"
               "set, and the communication backends and kernels built in.\n");
        return FG_EXIT_OK;
    }
    if (rc) return rc;
    bool planned = false;
    for (int i = 1; i < 6; i++) planned |= flags[i].seen; /* the launch plan's five */
    int status = FG_EXIT_OK;

    printf("fulgur %s\n", fg_version());
    int cores = fg_num_cores(), cpu_devices = 0;
    printf("cores:                 %d\n", cores);
    if (fg_launch_cpu_devices(&cpu_devices) == FG_OK)
        printf("CPU devices:           %d (%s)\n", cpu_devices,
               getenv("FULGUR_CPU_DEVICES") ? "FULGUR_CPU_DEVICES" : "one per core");
    else {
        printf("CPU devices:           invalid: %s\n", fg_last_error());
        status = FG_EXIT_FAIL;
    }

    fg_cluster_info info;
    bool have_env = fg_cluster_detect(&info) == FG_OK;
    if (!have_env) {
        printf("cluster environment:   invalid: %s\n", fg_last_error());
        status = FG_EXIT_FAIL;
    } else {
        int t;
        const char *from;
        if (fg_launch_threads_per_rank(info.local_world_size, &t, &from) == FG_OK)
            printf("threads per rank:      %d (%s)\n", t, from);
        else {
            printf("threads per rank:      invalid: %s\n", fg_last_error());
            status = FG_EXIT_FAIL;
        }
        bool launched = strcmp(info.source, "none") != 0;
        printf("cluster environment:   %s%s\n", info.source, launched ? "" : " (not launched)");
        printf("    rank %d of %d, local rank %d of %d, node %d of %d\n", info.rank,
               info.world_size, info.local_rank, info.local_world_size, info.node_rank,
               info.num_nodes);
        if (info.master_addr[0] || info.master_port)
            printf("    master %s:%d\n", info.master_addr[0] ? info.master_addr : "?",
                   info.master_port);
        if (info.job_id[0]) printf("    job id %s\n", info.job_id);
        if (info.derived[0]) printf("    derived: %s\n", info.derived);
        const char *nl = getenv("SLURM_STEP_NODELIST") ? getenv("SLURM_STEP_NODELIST")
                                                       : getenv("SLURM_JOB_NODELIST");
        int nh = 0;
        if (!strcmp(info.source, "slurm") && nl &&
            fg_cluster_nodelist_host(nl, 0, NULL, 0, &nh) == FG_OK) {
            printf("    nodes %s =", nl);
            for (int i = 0; i < nh && i < 16; i++) {
                char h[FG_CLUSTER_ADDR_MAX];
                if (fg_cluster_nodelist_host(nl, i, h, sizeof h, NULL) == FG_OK)
                    printf(" %s%s", h, i == info.node_rank ? " (this node)" : "");
            }
            printf("%s\n", nh > 16 ? " ..." : "");
        }
    }

    fg_launch_opts o = {.accelerator = eo.accel,
                        .devices = eo.devices,
                        .strategy = eo.strategy,
                        .precision = eo.precision,
                        .num_nodes = (int)eo.num_nodes};
    fg_launch_plan plan;
    bool plan_ok = false;
    if (have_env || planned) {
        if (fg_launch_plan_make(&o, have_env ? &info : NULL, &plan) == FG_OK) {
            plan_ok = true;
            char line[512];
            printf("launch plan:           %s\n", fg_launch_plan_format(&plan, line, sizeof line));
        } else {
            printf("launch plan:           error: %s\n", fg_last_error());
            if (planned) status = FG_EXIT_USAGE;
        }
    }

    if (eo.params || eo.layers) {
        int world = plan_ok && plan.world_size > 0 ? plan.world_size : 1;
        int64_t n = eo.params ? eo.params : env_gpt_params(eo.layers, eo.embd, eo.vocab, eo.ctx);
        fg_dtype dt =
            !strcmp(eo.precision, "64-true") || !strcmp(eo.precision, "64") ? FG_F64 : FG_F32;
        int mrc = env_memory_print(eo.strategy, eo.sharding, world, n, dt);
        if (mrc) status = mrc;
    }

    static const char *const vars[] = {"FULGUR_RANK",
                                       "FULGUR_WORLD_SIZE",
                                       "FULGUR_LOCAL_RANK",
                                       "FULGUR_LOCAL_WORLD_SIZE",
                                       "FULGUR_NODE_RANK",
                                       "FULGUR_NUM_NODES",
                                       "FULGUR_MASTER_ADDR",
                                       "FULGUR_MASTER_PORT",
                                       "FULGUR_JOB_ID",
                                       "FULGUR_BACKEND",
                                       "FULGUR_NUM_THREADS",
                                       "FULGUR_CPU_DEVICES",
                                       "FULGUR_KILL_GRACE_S",
                                       "FULGUR_COMM_TIMEOUT_S",
                                       "FULGUR_COMM_CHECK",
                                       "FULGUR_RESTART_COUNT",
                                       "RANK",
                                       "WORLD_SIZE",
                                       "LOCAL_RANK",
                                       "LOCAL_WORLD_SIZE",
                                       "NODE_RANK",
                                       "GROUP_RANK",
                                       "GROUP_WORLD_SIZE",
                                       "MASTER_ADDR",
                                       "MASTER_PORT",
                                       "TORCHELASTIC_RUN_ID",
                                       "OMPI_COMM_WORLD_RANK",
                                       "OMPI_COMM_WORLD_SIZE",
                                       "OMPI_COMM_WORLD_LOCAL_RANK",
                                       "OMPI_COMM_WORLD_LOCAL_SIZE",
                                       "SLURM_PROCID",
                                       "SLURM_NTASKS",
                                       "SLURM_LOCALID",
                                       "SLURM_NODEID",
                                       "SLURM_NNODES",
                                       "SLURM_JOB_ID",
                                       "SLURM_JOB_NAME",
                                       "SLURM_JOB_NODELIST",
                                       "SLURM_STEP_NODELIST",
                                       "SLURM_JOB_NUM_NODES",
                                       "SLURM_TASKS_PER_NODE",
                                       "SLURM_STEP_TASKS_PER_NODE",
                                       "SLURM_NTASKS_PER_NODE",
                                       "SLURM_ARRAY_JOB_ID",
                                       "SLURM_ARRAY_TASK_ID",
                                       "SLURM_RESTART_COUNT",
                                       "OMP_NUM_THREADS",
                                       "OPENBLAS_NUM_THREADS",
                                       "OPENBLAS_CORETYPE",
                                       "FULGUR_MATMUL_BF16",
                                       "FULGUR_CPU_ISA",
                                       NULL};
    int shown = 0;
    printf("variables set:%s\n", "");
    for (int i = 0; vars[i]; i++) {
        const char *v = getenv(vars[i]);
        if (!v) continue;
        printf("    %-26s %s\n", vars[i], v);
        shown++;
    }
    if (!shown) printf("    (none of fulgur's, torchrun's, Open MPI's or SLURM's)\n");

    printf("backends built in:     shm%s%s\n",
           fg_comm_backend_built(FG_COMM_MPI) ? ", mpi (Open MPI)" : "",
           fg_comm_backend_built(FG_COMM_NCCL) ? ", nccl" : "");
    fg_accelerator a;
    bool gpu = fg_launch_parse_accelerator("gpu", &a) == FG_OK;
    fg_clear_error();
    printf("accelerators:          cpu%s, guarded (the test device: docs/devices.md)\n",
           gpu              ? ", gpu"
           : fg_gpu_built() ? " (the CUDA backend is built in; no GPU answers here)"
                            : " (no GPU support built in)");
    /* the GPUs as the driver's NVML sees them: no CUDA context is made */
    fg_gpu_info gpus[16];
    int ngpu = 0;
    if (fg_gpu_list(gpus, 16, &ngpu) == FG_OK) {
        printf("GPUs:                  %d (CUDA backend %s)\n", ngpu,
               fg_gpu_built() ? "built in" : "not built in: configure with FULGUR_CUDA=ON");
        for (int i = 0; i < ngpu && i < 16; i++)
            printf("    %d: %s, %.1f GiB, compute capability %d.%d\n", gpus[i].index, gpus[i].name,
                   (double)gpus[i].memory_bytes / (1 << 30), gpus[i].cc_major, gpus[i].cc_minor);
    } else {
        printf("GPUs:                  none (%s)\n", fg_last_error());
        fg_clear_error();
    }
    printf("kernels:               %s\n", fg_ops_blas_info());
    printf("vector kernels:        %s\n", fg_isa_name(fg_cpu_isa()));
    env_strategies_print();
    /* what each precision's matrix products run on, on this CPU */
    printf("precisions:\n");
    for (int p = 0; p < FG_PRECISION_COUNT; p++)
        printf("    %-12s %s\n", fg_precision_kind_name((fg_precision_kind)p),
               fg_precision_kernel_path((fg_precision_kind)p));
    /* offload (deepspeed_stage_2_offload, fsdp_cpu_offload, nvme) */
    printf("offload:\n");
    printf("    cpu          nothing to move: on a CPU the parameters and optimizer state are in "
           "host memory already\n");
    printf("    nvme         %s\n",
           fg_offload_nvme_available()
               ? "optimizer state in files under nvme_path, streamed with io_uring (liburing); "
                 "under deepspeed_stage_3 the parameter shards too"
               : "unavailable: built without liburing (apt-get install liburing-dev, rebuild)");
    /* DeepSpeed's activation checkpointing options (deepspeed strategies) */
    printf("activation checkpoints (--activation-checkpointing):\n");
    printf("    partition_activations  nothing to partition: with data parallelism only each "
           "rank keeps its own checkpoints whole (a model-parallel group of one)\n");
    printf("    cpu_checkpointing      nothing to move: on a CPU the checkpoints are in host "
           "memory already\n");
    return status;
}
