#!/usr/bin/env bash
# fulgur under a real SLURM cluster on 2 test hosts (tests/hosts/slurm.sh:
# munged, slurmctld and two slurmd started here with a generated slurm.conf,
# stopped after), 2 nodes x 2 tasks, the GPT under --deterministic:
#   - sbatch with `srun fulgur fit --num-nodes 2 --devices 2`: the ranks take
#     SLURM's variables (fulgur env under srun says so) and Open MPI's world
#     from Slurm's PMIx; the result is bitwise the one-machine run's;
#   - Lightning's auto-requeue: SIGUSR1 (what #SBATCH --signal=SIGUSR1@90
#     sends when the time limit nears; sent here by scancel --signal, as
#     SLURM's time limits are minutes long) saves at a step boundary,
#     requeues the job, and the requeued job resumes by itself and ends
#     bitwise equal to the uninterrupted run; with --no-requeue it only saves
#     and stops;
#   - scancel stops every rank, each naming the cause.
# SLURM holds a requeued job for 2 minutes before it may start again; the
# test releases it at once (scontrol update StartTime=now).
# Skipped, saying why, when not root or without ip/unshare/mpirun or SLURM.
source "$(dirname "$0")/../cli/lib.sh"
source "$(dirname "$0")/hosts.sh"
source "$(dirname "$0")/slurm.sh"
echo "test_hosts_slurm: sbatch and srun on a 2-node SLURM cluster"
if ! why=$(hosts_can) || ! why=$(slurm_can); then
    skip "SLURM on network-namespace hosts: $why"
    finish
fi
unset $(env | grep -o '^SLURM_[A-Z_]*') 2>/dev/null
hosts_up 2 || { fail "could not make the hosts"; hosts_down; finish; }
trap 'slurm_down; hosts_down; rm -rf "$T_TMP"' EXIT
slurm_up || { fail "could not start the SLURM cluster"; finish; }
pass "munged, slurmctld and 2 slurmd up: $(sinfo -h -o '%D nodes %t' | head -1)"

TXT="$T_TMP/tiny.txt"
for i in $(seq 1 12); do
    echo "to be or not to be, that is the question."
    echo "whether tis nobler in the mind to suffer"
done >"$TXT"
fit_args() { # STEPS DIR
    echo fit --model gpt --data "$TXT" --layers 1 --heads 2 --embd 32 --ctx 32 --lr 3e-3 \
        --warmup-steps 2 --limit-val-batches 1 --progress lines --num-workers 0 \
        --sample-tokens 0 --max-steps "$1" --val-check-interval "$1" --seed 7 --strategy ddp \
        --batch-size 2 --deterministic --default-root-dir "$2"
}
# job NAME STEPS [FIT FLAGS]: an sbatch script training on 2 nodes x 2 tasks
job() {
    local name=$1 steps=$2
    shift 2
    cat >"$T_TMP/$name.sbatch" <<JOB
#!/bin/bash
#SBATCH --job-name=$name
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --signal=SIGUSR1@90
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=$T_TMP/$name.out
export FULGUR_NUM_THREADS=1
srun ${SRUN_OPTS:-} "$FULGUR" $(fit_args "$steps" "$T_TMP/r-$name") --num-nodes 2 --devices 2 $*
JOB
    sbatch --parsable "$T_TMP/$name.sbatch"
}
# gone JOB: waits until the job has left the queue
# gone JOB: waits until slurmctld says the job has ended (a terminal state, or
# no such job any more); a query that fails (slurmctld busy) is asked again,
# not taken for an ended job
gone() {
    local st
    for _ in $(seq 1 1200); do
        st=$(scontrol show job "$1" 2>&1)
        case "$st" in
        *"Invalid job id"* | *JobState=COMPLETED* | *JobState=FAILED* | *JobState=CANCELLED* | \
            *JobState=TIMEOUT* | *JobState=NODE_FAIL* | *JobState=OUT_OF_MEMORY* | \
            *JobState=BOOT_FAIL* | *JobState=DEADLINE* | *JobState=PREEMPTED*) return 0 ;;
        esac
        sleep 0.1
    done
    return 1
}
# training OUT: waits until the job's output shows a step
training() { for _ in $(seq 1 1200); do grep -q '^step [0-9]' "$T_TMP/$1" 2>/dev/null && return 0; sleep 0.1; done; return 1; }
last_ckpt() { ls "$T_TMP/$1"/checkpoints/step-*.safetensors 2>/dev/null | tail -1; }
bitwise() { # NAME A B
    local a b d
    a=$(last_ckpt "$2") b=$(last_ckpt "$3")
    if [ -z "$a" ] || [ -z "$b" ]; then fail "$1: no checkpoints (${a:-none}, ${b:-none})"; return; fi
    d=$(python3 "$FG_SRC/tests/hosts/ckpt_diff.py" "$a" "$b")
    [ "$(echo "$d" | awk '{print $4}')" = 0 ] && pass "$1: bitwise ($d)" || fail "$1: not bitwise: $d"
}

# --- fulgur env under srun: what it read
run env timeout 120 srun -N 2 -n 4 --ntasks-per-node 2 "$FULGUR" env --devices 2 --num-nodes 2 --strategy ddp
expect_rc "srun fulgur env" 0 env
expect_grep "rank 3 reads SLURM's variables" env 'rank 3 of 4, local rank 1 of 2, node 1 of 2'
expect_grep "the master: h1, from the node list" env "master h1:1[0-9]{4}$"
expect_grep "the node list expanded" env 'nodes h\[1-2\] = h1 \(this node\) h2'

# --- sbatch + srun fit == one machine
run one env FULGUR_CPU_DEVICES=4 "$FULGUR" $(fit_args 8 "$T_TMP/r-one8") --devices 4
expect_rc "one machine, 4 ranks" 0 one
J=$(job fit8 8)
gone "$J"
expect_grep "srun fit on 2 nodes x 2 tasks trained" fit8.out 'done: 8 steps'
expect_grep "the plan names SLURM, hybrid backend" fit8.out 'run details: comm hybrid'
bitwise "sbatch/srun fit == one machine" r-one8 r-fit8

# --- auto-requeue: SIGUSR1 saves, requeues, the requeued job resumes by itself
run one2 env FULGUR_CPU_DEVICES=4 "$FULGUR" $(fit_args 160 "$T_TMP/r-one160") --devices 4
J=$(job rq 160)
training rq.out
scancel --signal=USR1 "$J"
# released once it has been pending again for 2 s (an update while it still
# completes is lost; one within the second of the requeue starts it before
# the nodes' revocation of its old credential is past, and slurmctld kills it
# as "non-startable: Job credential revoked"), and if held at the requeue
pending=0
for _ in $(seq 1 1200); do
    st=$(scontrol show job "$J" 2>/dev/null | grep -oE 'JobState=[A-Z]+|Restarts=[0-9]+' | tr '\n' ' ')
    case "$st" in
    *PENDING*Restarts=1*)
        pending=$((pending + 1))
        if [ "$pending" -ge 20 ]; then
            scontrol update JobId="$J" StartTime=now 2>/dev/null
            scontrol release "$J" 2>/dev/null
        fi ;;
    *RUNNING*Restarts=1* | *COMPLETED*Restarts=1*) break ;;
    esac
    sleep 0.1
done
# what slurmctld says of the job and the nodes, should it not have run again
diag=$(scontrol show job "$J" 2>&1 | grep -oE '(JobState|Reason|Restarts|BeginTime)=[^ ]+' |
    tr '\n' ' '; sinfo -N -h -o '%N %T %E' 2>&1 | tr '\n' ' ')
gone "$J"
expect_grep "every rank heard SLURM's warning" rq.out 'rank 3 got SIGUSR1 \(SLURM.s warning of #SBATCH --signal: the time limit is near\)'
expect_grep "saved at a step boundary" rq.out 'stopped by a signal after step [0-9]+ \(of 160\)'
expect_grep "requeued itself" rq.out "requeued SLURM job $J \(scontrol requeue\)"
expect_grep "the requeued job resumed by itself" rq.out 'resumed from .*step-0+[0-9]+\.safetensors at step'
grep -q 'resumed from' "$T_TMP/rq.out" || echo "       | slurm after the requeue: $diag"
expect_grep "and finished" rq.out 'done: 160 steps'
bitwise "requeued and resumed == uninterrupted on one machine" r-one160 r-rq

# --- --no-requeue: only saves and stops
J=$(job norq 400 --no-requeue)
training norq.out
scancel --signal=USR1 "$J"
gone "$J"
expect_grep "--no-requeue saved" norq.out 'stopped by a signal after step [0-9]+ \(of 400\)'
expect_grep "and did not requeue" norq.out 'not requeued \(--no-requeue\)'
if grep -q 'resumed from' "$T_TMP/norq.out"; then fail "--no-requeue: the job ran again"; else pass "--no-requeue: the job ran once"; fi

# --- scancel stops every rank, naming the cause (each task's output into a
# file of its own: srun, which relays them, is stopped by scancel too)
J=$(SRUN_OPTS="--output=$T_TMP/cancel.%t.out" job cancel 100000)
training cancel.0.out
scancel "$J"
gone "$J"
for r in 0 1 2 3; do
    expect_grep "rank $r names the cause" cancel.$r.out "rank $r got SIGTERM \(from SLURM: scancel, or the time limit\)"
done
left=0
for h in 1 2; do
    for p in $(ip netns pids "${HOSTS_ID}h$h"); do [ "$(cat /proc/$p/comm 2>/dev/null)" = fulgur ] && left=$((left + 1)); done
done
[ "$left" = 0 ] && pass "no rank left running after scancel" || fail "$left ranks still run after scancel"
finish
