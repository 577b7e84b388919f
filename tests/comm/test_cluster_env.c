/* SLURM's and torchrun's environment read into the job contract: host lists
 * expanded as scontrol expands them, Lightning's SLURMEnvironment defaults
 * (master = first host, port = 15000 + the job id's last 4 digits), salloc's
 * shell left alone, and every inconsistent pair of values refused with both
 * names in the message. */
#include "harness.h"

#include "fulgur/comm.h"

extern char **environ;

/* Unsets every variable a source reads (any SLURM_*, torchrun's, fulgur's). */
static void clear_env(void) {
    static const char *const k_plain[] = {
        "RANK",         "WORLD_SIZE",  "LOCAL_RANK",          "LOCAL_WORLD_SIZE",
        "GROUP_RANK",   "NODE_RANK",   "GROUP_WORLD_SIZE",    "MASTER_ADDR",
        "MASTER_PORT",  "FULGUR_RANK", "TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_RANK",
        "FULGUR_JOB_ID"};
    for (size_t i = 0; i < sizeof k_plain / sizeof k_plain[0]; i++) unsetenv(k_plain[i]);
    for (int again = 1; again;) {
        again = 0;
        for (char **e = environ; *e; e++) {
            if (strncmp(*e, "SLURM_", 6)) continue;
            char name[128];
            size_t n = strcspn(*e, "=");
            snprintf(name, sizeof name, "%.*s", (int)n, *e);
            unsetenv(name);
            again = 1;
            break;
        }
    }
}

/* the hosts of a node list, space-separated, into buf */
static const char *expand(const char *list, char *buf, size_t cap) {
    int n = 0;
    buf[0] = 0;
    if (fg_cluster_nodelist_host(list, 0, NULL, 0, &n) != FG_OK) return "error";
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        char h[64];
        if (fg_cluster_nodelist_host(list, i, h, sizeof h, NULL) != FG_OK) return "error";
        k += (size_t)snprintf(buf + k, cap - k, "%s%s", i ? " " : "", h);
    }
    return buf;
}

TEST(nodelist_expansion) {
    char b[512];
    CHECK(!strcmp(expand("node1", b, sizeof b), "node1"));
    CHECK(!strcmp(expand("n[1-3]", b, sizeof b), "n1 n2 n3"));
    CHECK(!strcmp(expand("gpu[08-11,20]", b, sizeof b), "gpu08 gpu09 gpu10 gpu11 gpu20"));
    CHECK(!strcmp(expand("a[1-2],login,b[7]", b, sizeof b), "a1 a2 login b7"));
    /* two groups multiply, the last varies fastest (scontrol show hostnames) */
    CHECK(!strcmp(expand("r[1-2]-n[01-02]", b, sizeof b), "r1-n01 r1-n02 r2-n01 r2-n02"));
    CHECK(!strcmp(expand("h[9-10].ib", b, sizeof b), "h9.ib h10.ib"));
    int n = 0;
    CHECK_OK(fg_cluster_nodelist_host("c[0001-1024]", 0, NULL, 0, &n));
    CHECK(n == 1024);
    char h[16];
    CHECK_OK(fg_cluster_nodelist_host("c[0001-1024]", 1023, h, sizeof h, NULL));
    CHECK(!strcmp(h, "c1024"));
}

TEST(nodelist_errors_name_the_part) {
    int n;
    CHECK_STATUS(fg_cluster_nodelist_host("n[1-3", 0, NULL, 0, &n), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "'[' without ']'");
    CHECK_STATUS(fg_cluster_nodelist_host("n[5-3]", 0, NULL, 0, &n), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "range 5-3");
    CHECK_STATUS(fg_cluster_nodelist_host("n[a]", 0, NULL, 0, &n), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "\"[a]\"");
    CHECK_STATUS(fg_cluster_nodelist_host("n1,,n2", 0, NULL, 0, &n), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "empty host name");
    CHECK_STATUS(fg_cluster_nodelist_host("n1]", 0, NULL, 0, &n), FG_EINVAL);
    char small[4];
    CHECK_STATUS(fg_cluster_nodelist_host("longname[1-2]", 1, small, sizeof small, NULL),
                 FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "longer than 3 bytes");
}

/* srun's variables for task `rank` of 2 nodes x 2 tasks, job 4711234 */
static void slurm_2x2(int rank) {
    char v[16];
    clear_env();
    snprintf(v, sizeof v, "%d", rank);
    setenv("SLURM_PROCID", v, 1);
    snprintf(v, sizeof v, "%d", rank % 2);
    setenv("SLURM_LOCALID", v, 1);
    snprintf(v, sizeof v, "%d", rank / 2);
    setenv("SLURM_NODEID", v, 1);
    setenv("SLURM_NTASKS", "4", 1);
    setenv("SLURM_NNODES", "2", 1);
    setenv("SLURM_TASKS_PER_NODE", "2(x2)", 1);
    setenv("SLURM_NTASKS_PER_NODE", "2", 1);
    setenv("SLURM_JOB_NODELIST", "gpu[07-08]", 1);
    setenv("SLURM_JOB_ID", "4711234", 1);
    setenv("SLURM_JOB_NAME", "train.sbatch", 1);
}

TEST(slurm_as_lightning) {
    fg_cluster_info ci;
    slurm_2x2(3);
    CHECK_OK(fg_cluster_detect(&ci));
    CHECK(!strcmp(ci.source, "slurm"));
    CHECK(ci.rank == 3 && ci.world_size == 4 && ci.local_rank == 1 && ci.local_world_size == 2);
    CHECK(ci.node_rank == 1 && ci.num_nodes == 2);
    CHECK(!strcmp(ci.master_addr, "gpu07"));
    CHECK(ci.master_port == 15000 + 1234);
    CHECK(!strcmp(ci.job_id, "4711234"));
    CHECK_CONTAINS(ci.derived, "first host of SLURM_JOB_NODELIST");
    CHECK_CONTAINS(ci.derived, "15000 + the last 4 digits of SLURM_JOB_ID");
    /* MASTER_ADDR / MASTER_PORT win, as in Lightning */
    setenv("MASTER_ADDR", "10.0.0.9", 1);
    setenv("MASTER_PORT", "23456", 1);
    CHECK_OK(fg_cluster_detect(&ci));
    CHECK(!strcmp(ci.master_addr, "10.0.0.9") && ci.master_port == 23456);
    CHECK(!strcmp(ci.source, "slurm")); /* MASTER_* alone are no torchrun launch */
    /* the step's values over the allocation's (srun inside a larger sbatch) */
    slurm_2x2(1);
    setenv("SLURM_NTASKS", "8", 1);
    setenv("SLURM_NNODES", "4", 1);
    setenv("SLURM_TASKS_PER_NODE", "2(x4)", 1);
    setenv("SLURM_JOB_NODELIST", "gpu[07-10]", 1);
    setenv("SLURM_STEP_NUM_TASKS", "4", 1);
    setenv("SLURM_STEP_NUM_NODES", "2", 1);
    setenv("SLURM_STEP_TASKS_PER_NODE", "2(x2)", 1);
    setenv("SLURM_STEP_NODELIST", "gpu[09-10]", 1);
    CHECK_OK(fg_cluster_detect(&ci));
    CHECK(ci.world_size == 4 && ci.num_nodes == 2 && !strcmp(ci.master_addr, "gpu09"));
    /* job arrays: the array job and task, as Lightning's job_id */
    slurm_2x2(0);
    setenv("SLURM_ARRAY_JOB_ID", "77", 1);
    setenv("SLURM_ARRAY_TASK_ID", "3", 1);
    CHECK_OK(fg_cluster_detect(&ci));
    CHECK(!strcmp(ci.job_id, "77_3"));
    /* no tasks-per-node variable: the world spread evenly */
    slurm_2x2(2);
    unsetenv("SLURM_TASKS_PER_NODE");
    unsetenv("SLURM_NTASKS_PER_NODE");
    CHECK_OK(fg_cluster_detect(&ci));
    CHECK(ci.local_world_size == 2 && ci.node_rank == 1 && ci.local_rank == 0);
    clear_env();
}

TEST(slurm_interactive_shell_is_no_launch) {
    fg_cluster_info ci;
    slurm_2x2(0);
    setenv("SLURM_JOB_NAME", "bash", 1);
    CHECK_OK(fg_cluster_detect(&ci));
    CHECK(!strcmp(ci.source, "none") && ci.world_size == 1);
    setenv("SLURM_JOB_NAME", "interactive", 1);
    CHECK_OK(fg_cluster_detect(&ci));
    CHECK(!strcmp(ci.source, "none"));
    /* fulgur run inside the shell: its own variables win */
    setenv("FULGUR_RANK", "0", 1);
    setenv("FULGUR_WORLD_SIZE", "2", 1);
    CHECK_OK(fg_cluster_detect(&ci));
    CHECK(!strcmp(ci.source, "fulgur") && ci.world_size == 2);
    unsetenv("FULGUR_RANK");
    unsetenv("FULGUR_WORLD_SIZE");
    clear_env();
}

/* sets name=value over the 2 x 2 job of rank 3 and expects FG_EINVAL with
 * each of the needles in the message */
static void expect_refused(const char *name, const char *value, const char *n1, const char *n2) {
    fg_cluster_info ci;
    slurm_2x2(3);
    setenv(name, value, 1);
    fg_status st = fg_cluster_detect(&ci);
    CHECK_MSG(st == FG_EINVAL, "%s=%s: got %s", name, value, fg_status_str(st));
    CHECK_CONTAINS(fg_last_error(), n1);
    if (n2) CHECK_CONTAINS(fg_last_error(), n2);
}

TEST(slurm_inconsistent_values_named) {
    expect_refused("SLURM_JOB_NODELIST", "gpu[07-09]", "SLURM_JOB_NODELIST=\"gpu[07-09]\" names 3",
                   "SLURM_NNODES=2");
    expect_refused("SLURM_JOB_NODELIST", "gpu[07-", "SLURM_JOB_NODELIST", "'[' without ']'");
    expect_refused("SLURM_TASKS_PER_NODE", "2(x3)", "SLURM_TASKS_PER_NODE=\"2(x3)\" lists 3",
                   "SLURM_NNODES=2");
    expect_refused("SLURM_TASKS_PER_NODE", "3(x2)", "adds up to 6 tasks", "SLURM_NTASKS=4");
    expect_refused("SLURM_TASKS_PER_NODE", "3,1", "same number of tasks on every node", NULL);
    expect_refused("SLURM_TASKS_PER_NODE", "2(y2)", "SLURM_TASKS_PER_NODE=\"2(y2)\"", "2(x3),1");
    expect_refused("SLURM_NTASKS_PER_NODE", "1", "SLURM_NTASKS_PER_NODE=1", "gives node 1 2 tasks");
    expect_refused("SLURM_NODEID", "2", "SLURM_NODEID=2", "SLURM_NNODES=2");
    expect_refused("SLURM_LOCALID", "2", "SLURM_LOCALID=2", "2 tasks of node 1");
    /* cyclic distribution: rank 3 would be node 1's second task only in blocks */
    expect_refused("SLURM_LOCALID", "0", "SLURM_PROCID=3", "--distribution=block");
    expect_refused("SLURM_PROCID", "4", "SLURM_PROCID=4", "SLURM_NTASKS=4");
    expect_refused("SLURM_NTASKS", "x", "SLURM_NTASKS=\"x\"", NULL);
    expect_refused("MASTER_PORT", "70000", "MASTER_PORT=70000", NULL);
    clear_env();
}

/* torchrun's variables for rank 3 of 2 nodes x 2 */
static void torchrun_2x2(void) {
    clear_env();
    setenv("RANK", "3", 1);
    setenv("WORLD_SIZE", "4", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    setenv("GROUP_RANK", "1", 1);
    setenv("NODE_RANK", "1", 1);
    setenv("GROUP_WORLD_SIZE", "2", 1);
    setenv("MASTER_ADDR", "h1", 1);
    setenv("MASTER_PORT", "29500", 1);
}

TEST(torchrun_consistent_and_not) {
    fg_cluster_info ci;
    torchrun_2x2();
    CHECK_OK(fg_cluster_detect(&ci));
    CHECK(!strcmp(ci.source, "torchrun") && ci.rank == 3 && ci.node_rank == 1 &&
          ci.num_nodes == 2 && ci.local_rank == 1 && !strcmp(ci.master_addr, "h1") &&
          ci.master_port == 29500);
    torchrun_2x2();
    setenv("NODE_RANK", "0", 1);
    CHECK_STATUS(fg_cluster_detect(&ci), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "GROUP_RANK=1 but NODE_RANK=0");
    torchrun_2x2();
    setenv("GROUP_WORLD_SIZE", "3", 1);
    CHECK_STATUS(fg_cluster_detect(&ci), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "GROUP_WORLD_SIZE=3 x LOCAL_WORLD_SIZE=2 = 6 ranks");
    CHECK_CONTAINS(fg_last_error(), "WORLD_SIZE=4");
    torchrun_2x2();
    setenv("RANK", "2", 1);
    CHECK_STATUS(fg_cluster_detect(&ci), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "RANK=2, but GROUP_RANK=1 x LOCAL_WORLD_SIZE=2 + LOCAL_RANK=1");
    /* NODE_RANK alone (an older torchrun, or a user's script) */
    torchrun_2x2();
    unsetenv("GROUP_RANK");
    CHECK_OK(fg_cluster_detect(&ci));
    CHECK(ci.node_rank == 1);
    /* torchrun wins over SLURM's variables around it (torchrun inside srun) */
    torchrun_2x2();
    setenv("SLURM_PROCID", "0", 1);
    setenv("SLURM_NTASKS", "2", 1);
    CHECK_OK(fg_cluster_detect(&ci));
    CHECK(!strcmp(ci.source, "torchrun") && ci.world_size == 4);
    clear_env();
}
