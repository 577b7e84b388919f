/* fulgur run --hosts: the job across machines through Open MPI's mpirun. */
#ifndef FULGUR_RUN_HOSTS_H
#define FULGUR_RUN_HOSTS_H

#include <stdbool.h>

typedef struct run_hosts_opts {
    const char *hosts;     /* "h1:2,h2:2" or "h1,h2" */
    int default_slots;     /* ranks on a host given without ":N" (--nproc-per-node) */
    const char *mpirun;    /* the mpirun to run ("mpirun": from PATH) */
    const char *rsh_agent; /* Open MPI's plm_rsh_agent, NULL: its default (ssh) */
    const char *network;   /* a subnet or interface for Open MPI's TCP traffic, or NULL */
    bool dry_run;          /* print the mpirun command instead of running it */
} run_hosts_opts;

/* Becomes mpirun for PROGRAM ARGS (prog, NULL-terminated) on the hosts; returns
 * only on failure (2 bad --hosts, 127 mpirun not found) or after a dry run (0). */
int run_hosts(const run_hosts_opts *o, char **prog);

#endif
