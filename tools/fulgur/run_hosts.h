/* fulgur run --hosts: the job across machines through Open MPI's mpirun. */
#ifndef FULGUR_RUN_HOSTS_H
#define FULGUR_RUN_HOSTS_H

#include <stdbool.h>

#define RUN_HOSTS_MAX 256 /* hosts in one --hosts list */

typedef struct run_hosts_opts {
    const char *hosts;     /* "h1:2,h2:2" or "h1,h2" */
    int default_slots;     /* ranks on a host given without ":N" (--nproc-per-node) */
    const char *mpirun;    /* the mpirun to run ("mpirun": from PATH) */
    const char *rsh_agent; /* Open MPI's plm_rsh_agent, NULL: its default (ssh) */
    const char *network;   /* a subnet or interface for Open MPI's TCP traffic, or NULL */
    bool dry_run;          /* print the mpirun command instead of running it */
} run_hosts_opts;

typedef struct run_host {
    char name[256]; /* as given in --hosts */
    int slots;      /* its ranks */
} run_host;

/* An mpirun command line: argv (NULL-terminated) points into itself and
 * into the options, the hosts and prog given to run_hosts_cmd_make. */
typedef struct run_hosts_cmd {
    const char **argv;
    char host_arg[4096], np[16];
    char **names;
    int nnames;
} run_hosts_cmd;

/* Becomes mpirun for PROGRAM ARGS (prog, NULL-terminated) on the hosts; returns
 * only on failure (2 bad --hosts, 127 mpirun not found) or after a dry run (0). */
int run_hosts(const run_hosts_opts *o, char **prog);

/* "h1:2,h2:2" or "h1,h2" (default_slots each) into hosts[0..*n), at most cap;
 * false after printing what is wrong. */
bool run_hosts_parse(const char *spec, int default_slots, run_host *hosts, int cap, int *n);

/* The mpirun command for prog on hosts[0..nhosts), with extra_env (NULL or
 * NULL-terminated "NAME=VALUE" strings) passed to every rank; false after
 * printing why. Free with run_hosts_cmd_free. */
bool run_hosts_cmd_make(const run_hosts_opts *o, const run_host *hosts, int nhosts,
                        char *const *extra_env, char **prog, run_hosts_cmd *cmd);
void run_hosts_cmd_free(run_hosts_cmd *cmd);

/* fulgur run --hosts with --nnodes MIN:MAX and/or --max-restarts K
 * (run_elastic.c): mpirun as a child, started again on the hosts that are
 * left after a failure. elastic: a host whose rank failed is left out of
 * the next start; without it the same hosts start again. Returns the exit
 * status. */
int run_hosts_elastic(const run_hosts_opts *o, int min_nodes, int max_nodes, bool elastic,
                      int max_restarts, char **prog);

#endif
