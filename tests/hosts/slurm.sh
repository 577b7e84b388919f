# A SLURM cluster on the test hosts of tests/hosts/hosts.sh, for the tests:
# sourced after hosts.sh. slurm_up (after hosts_up 2) writes a slurm.conf
# for a cluster of h1 and h2 (2 CPUs each, one partition, MpiDefault=pmix so
# that srun starts Open MPI ranks directly) and starts munged (in the root
# namespace: its socket is a file every host reaches), slurmctld on h1 and
# slurmd on h1 and h2, each host's slurmd in the host's namespaces with
# cgroup v1 hierarchies mounted (ip netns exec hides the machine's) and a
# private tmpfs as SLURM's TmpFS (PMIx's per-step folders would collide
# between two hosts sharing /tmp); then waits until both nodes are idle.
# Nothing of the machine's own SLURM or munge setup is used or touched.
# slurm_down stops them all. After slurm_up: SLURM_CONF is exported, and
# SLURM_DIR holds the logs (log/). slurm_can prints why not, if not.

slurm_can() {
    local t
    for t in munged slurmctld slurmd sbatch srun scontrol squeue scancel; do
        command -v $t >/dev/null 2>&1 ||
            { echo "$t not found (apt-get install slurmctld slurmd slurm-client munge)"; return 1; }
    done
    return 0
}

slurm_up() {
    SLURM_DIR=$HOSTS_DIR/slurm
    local d=$SLURM_DIR a1 a2 i
    mkdir -p "$d/munge" "$d/state" "$d/spool" "$d/log" "$d/nodetmp" || return 1
    chmod 700 "$d/munge"
    head -c 1024 /dev/urandom >"$d/munge/munge.key"
    chmod 400 "$d/munge/munge.key"
    munged --force --key-file="$d/munge/munge.key" --socket="$d/munge/sock" \
        --pid-file="$d/munge/pid" --log-file="$d/log/munged.log" --seed-file="$d/munge/seed" ||
        return 1
    a1=$(host_addr h1)
    a2=$(host_addr h2)
    cat >"$d/slurm.conf" <<CONF
ClusterName=fulgurtest
SlurmctldHost=h1($a1)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$d/munge/sock
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool/%n
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.%n.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd.%n.log
TmpFS=$d/nodetmp
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
MpiDefault=pmix
ReturnToService=2
JobRequeue=1
KillWait=5
MinJobAge=2
NodeName=h1 NodeAddr=$a1 CPUs=2 State=UNKNOWN
NodeName=h2 NodeAddr=$a2 CPUs=2 State=UNKNOWN
PartitionName=fulgur Nodes=h1,h2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
    echo "CgroupPlugin=cgroup/v1" >"$d/cgroup.conf"
    export SLURM_CONF=$d/slurm.conf
    "$HOSTS_AGENT" h1 "exec slurmctld -D -i >$d/log/slurmctld.out 2>&1" &
    disown
    local cg="mount -t tmpfs fgcg /sys/fs/cgroup && for c in freezer cpuset memory devices; do
        mkdir -p /sys/fs/cgroup/\$c && mount -t cgroup -o \$c fgcg\$c /sys/fs/cgroup/\$c; done &&
        mount -t tmpfs fgtmp $d/nodetmp"
    for i in 1 2; do
        "$HOSTS_AGENT" h$i "$cg && exec slurmd -D -N h$i >$d/log/slurmd.h$i.out 2>&1" &
        disown
    done
    for i in $(seq 1 300); do
        [ "$(sinfo -h -o '%t' 2>/dev/null | sort -u)" = idle ] && return 0
        sleep 0.1
    done
    echo "slurm_up: the nodes did not come up:" >&2
    sinfo >&2
    tail -n 5 "$d"/log/*.out >&2
    return 1
}

slurm_down() {
    [ -n "${SLURM_DIR:-}" ] || return 0
    scancel --quiet --user=root 2>/dev/null
    local f
    for f in "$SLURM_DIR"/slurmd.*.pid "$SLURM_DIR/slurmctld.pid" "$SLURM_DIR/munge/pid"; do
        [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null
    done
    SLURM_DIR=
}
