/* fulgur run --hosts: a job across machines, started from one of them
 * through Open MPI's mpirun and its remote agent (ssh by default), with the
 * flags a user would otherwise have to know:
 *   --host h1:2,h2:2 -np 4       the ranks and where they run (by slot: the
 *                                ranks of a host are consecutive)
 *   --bind-to none               fulgur sizes its own threads per rank
 *   --mca rtc_hwloc_vmhole none  Open MPI's daemon crashed inside hwloc at
 *                                start about one time in twelve without it
 *   --allow-run-as-root          when run by root
 *   -x NAME                      every FULGUR_*, HOROVOD_*, OMP_NUM_THREADS and
 *                                LD_LIBRARY_PATH set here (mpirun sends no
 *                                environment to the other machines unless
 *                                told), minus the rank contract, which
 *                                Open MPI's own variables replace
 *   --mca plm_rsh_agent CMD      --rsh-agent
 *   --mca oob_tcp_if_include / btl_tcp_if_include NET   --network
 * The ranks then find each other from Open MPI's environment; the comm
 * layer picks the hybrid backend (shm inside a host, Open MPI across hosts)
 * when every host runs several ranks. This process becomes mpirun (exec):
 * signals, the output and the exit status are mpirun's, and when a rank
 * dies mpirun stops the job and names the rank and its host. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "run_hosts.h"

extern char **environ;

/* The launch contract's variables: Open MPI's replace them on each rank. */
static bool is_contract(const char *name, size_t n) {
    static const char *const k[] = {
        "FULGUR_RANK",      "FULGUR_WORLD_SIZE",   "FULGUR_LOCAL_RANK",  "FULGUR_LOCAL_WORLD_SIZE",
        "FULGUR_NODE_RANK", "FULGUR_NUM_NODES",    "FULGUR_MASTER_ADDR", "FULGUR_MASTER_PORT",
        "FULGUR_JOB_ID",    "FULGUR_RESTART_COUNT"};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (strlen(k[i]) == n && !strncmp(k[i], name, n)) return true;
    return false;
}

static bool exported(const char *name, size_t n) {
    if (n > 7 && !strncmp(name, "FULGUR_", 7)) return !is_contract(name, n);
    if (n > 8 && !strncmp(name, "HOROVOD_", 8)) return true;
    return (n == 15 && !strncmp(name, "OMP_NUM_THREADS", n)) ||
           (n == 15 && !strncmp(name, "LD_LIBRARY_PATH", n));
}

/* "h1:2,h2:2" or "h1,h2" (each with default_slots) into hosts[0..*n) (at
 * most cap); false with a message on junk. */
bool run_hosts_parse(const char *spec, int default_slots, run_host *hosts, int cap, int *n) {
    *n = 0;
    const char *p = spec;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char item[sizeof hosts->name + 8];
        if (len == 0 || len >= sizeof item) {
            cli_error("--hosts=\"%s\": expected HOST:N,HOST:N,... (an empty or too long entry)",
                      spec);
            return false;
        }
        memcpy(item, p, len);
        item[len] = 0;
        char *colon = strrchr(item, ':');
        long slots = default_slots;
        if (colon) {
            char *e;
            slots = strtol(colon + 1, &e, 10);
            if (e == colon + 1 || *e || slots < 1 || slots > 4096) {
                cli_error("--hosts=\"%s\": \"%s\": the count after ':' must be 1..4096", spec,
                          item);
                return false;
            }
            *colon = 0;
        }
        if (!item[0] || strlen(item) >= sizeof hosts->name ||
            strspn(item, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                         "0123456789.-_") != strlen(item)) {
            cli_error("--hosts=\"%s\": \"%s\" is not a host name or address", spec, item);
            return false;
        }
        if (*n == cap) {
            cli_error("--hosts=\"%s\": more than %d hosts", spec, cap);
            return false;
        }
        memcpy(hosts[*n].name, item, strlen(item) + 1); /* fits: checked above */
        hosts[*n].slots = (int)slots;
        (*n)++;
        p = end ? end + 1 : p + len;
        if (end && !*p) {
            cli_error("--hosts=\"%s\": ends with ','", spec);
            return false;
        }
    }
    if (!*n) {
        cli_error("--hosts=\"\": expected HOST:N,HOST:N,...");
        return false;
    }
    return true;
}

/* mpirun's --host value (always with counts) and the total; false when too long. */
static bool host_value(const run_host *hosts, int n, char *out, size_t cap, int *total) {
    size_t k = 0;
    *total = 0;
    out[0] = 0;
    for (int i = 0; i < n; i++) {
        int w = snprintf(out + k, cap - k, "%s%s:%d", k ? "," : "", hosts[i].name, hosts[i].slots);
        if (w < 0 || (size_t)w >= cap - k) return false;
        k += (size_t)w;
        *total += hosts[i].slots;
    }
    return true;
}

bool run_hosts_cmd_make(const run_hosts_opts *o, const run_host *hosts, int nhosts,
                        char *const *extra_env, char **prog, run_hosts_cmd *cmd) {
    *cmd = (run_hosts_cmd){0};
    int total;
    if (!host_value(hosts, nhosts, cmd->host_arg, sizeof cmd->host_arg, &total)) {
        cli_error("--hosts=\"%s\": too long", o->hosts);
        return false;
    }
    snprintf(cmd->np, sizeof cmd->np, "%d", total);
    int nprog = 0, nextra = 0;
    while (prog[nprog]) nprog++;
    while (extra_env && extra_env[nextra]) nextra++;
    int nenv = 0;
    for (char **e = environ; *e; e++) nenv++;
    const char **argv = calloc((size_t)(32 + 2 * (nenv + nextra) + nprog), sizeof *argv);
    char **names = calloc((size_t)nenv + 1, sizeof *names);
    if (!argv || !names) {
        cli_error("out of memory");
        free(argv);
        free(names);
        return false;
    }
    int k = 0, nn = 0;
    argv[k++] = o->mpirun;
    if (geteuid() == 0) argv[k++] = "--allow-run-as-root";
    argv[k++] = "--host";
    argv[k++] = cmd->host_arg;
    argv[k++] = "-np";
    argv[k++] = cmd->np;
    argv[k++] = "--bind-to";
    argv[k++] = "none";
    argv[k++] = "--mca";
    argv[k++] = "rtc_hwloc_vmhole";
    argv[k++] = "none";
    if (o->rsh_agent) {
        argv[k++] = "--mca";
        argv[k++] = "plm_rsh_agent";
        argv[k++] = o->rsh_agent;
    }
    if (o->network) {
        argv[k++] = "--mca";
        argv[k++] = "oob_tcp_if_include";
        argv[k++] = o->network;
        argv[k++] = "--mca";
        argv[k++] = "btl_tcp_if_include";
        argv[k++] = o->network;
    }
    for (char **e = environ; *e; e++) {
        const char *eq = strchr(*e, '=');
        if (!eq || !exported(*e, (size_t)(eq - *e))) continue;
        names[nn] = strndup(*e, (size_t)(eq - *e));
        if (!names[nn]) continue;
        argv[k++] = "-x";
        argv[k++] = names[nn++];
    }
    for (int i = 0; i < nextra; i++) {
        argv[k++] = "-x";
        argv[k++] = extra_env[i];
    }
    for (int i = 0; i < nprog; i++) argv[k++] = prog[i];
    argv[k] = NULL;
    cmd->argv = argv;
    cmd->names = names;
    cmd->nnames = nn;
    return true;
}

void run_hosts_cmd_free(run_hosts_cmd *cmd) {
    for (int i = 0; i < cmd->nnames; i++) free(cmd->names[i]);
    free(cmd->names);
    free(cmd->argv);
    *cmd = (run_hosts_cmd){0};
}

int run_hosts(const run_hosts_opts *o, char **prog) {
    run_host hosts[RUN_HOSTS_MAX];
    int nhosts;
    run_hosts_cmd cmd;
    if (!run_hosts_parse(o->hosts, o->default_slots, hosts, RUN_HOSTS_MAX, &nhosts))
        return FG_EXIT_USAGE;
    if (!run_hosts_cmd_make(o, hosts, nhosts, NULL, prog, &cmd)) return FG_EXIT_USAGE;
    int rc = FG_EXIT_OK;
    if (o->dry_run) {
        for (int i = 0; cmd.argv[i]; i++) printf("%s%s", i ? " " : "", cmd.argv[i]);
        printf("\n");
    } else {
        fflush(stdout);
        fflush(stderr);
        execvp(o->mpirun, (char *const *)cmd.argv);
        cli_error("--hosts: cannot run %s (%s): install Open MPI (apt-get install openmpi-bin) "
                  "or give its path with --mpirun",
                  o->mpirun, strerror(errno));
        rc = 127;
    }
    run_hosts_cmd_free(&cmd);
    return rc;
}
