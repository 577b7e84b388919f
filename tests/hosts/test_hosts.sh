#!/usr/bin/env bash
# fulgur across machines, on test hosts made here (tests/hosts/hosts.sh:
# network namespaces on a bridge, each with its own /dev/shm and host name,
# Open MPI's rsh agent entering them), 2 hosts x 2 ranks:
#   - fulgur run --hosts: the mpirun command it runs (also without root);
#   - the collectives' correctness matrix through the hybrid backend (picked
#     by itself: shm inside a host, Open MPI across) and through flat mpi;
#   - ddp with the hybrid backend bitwise equal to the same 2 x 2 layout
#     simulated on one machine; ddp (hybrid and flat) and ddp2 (one process
#     per host, 2 threads) within 1e-5 of ddp on 4 ranks on one machine;
#     horovod on the hosts bitwise equal to ddp there;
#   - a host whose ranks are killed stops the job, and mpirun's message
#     names the host.
# Skipped, saying why, when not root or without ip/unshare/mpirun.
source "$(dirname "$0")/../cli/lib.sh"
source "$(dirname "$0")/hosts.sh"
echo "test_hosts: fulgur across network-namespace hosts"

# --- the mpirun command (no hosts needed)
run dry env FULGUR_NUM_THREADS=1 FULGUR_RANK=3 "$FULGUR" run --hosts h1:2,h2 --nproc-per-node 3 \
    --rsh-agent /x/agent --network 10.9.0.0/24 --dry-run -- prog --flag
expect_rc "--hosts --dry-run" 0 dry
expect_grep "--hosts: mpirun with the hosts and slots" dry '^mpirun .*--host h1:2,h2:3 -np 5 '
expect_grep "--hosts: the flags the user would need" dry '--bind-to none --mca rtc_hwloc_vmhole none --mca plm_rsh_agent /x/agent --mca oob_tcp_if_include 10.9.0.0/24 --mca btl_tcp_if_include 10.9.0.0/24 '
expect_grep "--hosts: FULGUR_ settings go to every host" dry ' -x FULGUR_NUM_THREADS .*prog --flag$'
if grep -q 'FULGUR_RANK' "$T_TMP/dry"; then fail "--hosts passed the rank contract on"; else pass "--hosts leaves the rank contract to Open MPI"; fi
run badh "$FULGUR" run --hosts "h1:x" prog
expect_rc "--hosts with a bad count" 2 badh
expect_grep "--hosts names the bad entry" badh 'h1:x'
run badn "$FULGUR" run --hosts h1:2 --nnodes 2 prog
expect_rc "--hosts with --nnodes" 2 badn

TXT="$T_TMP/tiny.txt"
for i in $(seq 1 12); do
    echo "to be or not to be, that is the question."
    echo "whether tis nobler in the mind to suffer"
done >"$TXT"
BASE=(fit --model gpt --data "$TXT" --layers 1 --heads 2 --embd 32 --ctx 32
     --lr 3e-3 --warmup-steps 2 --limit-val-batches 1 --progress lines --num-workers 0
     --sample-tokens 0 --max-steps 8 --val-check-interval 8 --seed 7)
FIT=("${BASE[@]}" --strategy ddp --batch-size 2)
# --- by hand on each machine without the rendezvous (--rdzv-backend none): the
# ranks have no way to reach the other machine and refuse, naming the command
# (tests/hosts/test_hosts_pernode.sh runs the rendezvous)
run byhand env FULGUR_COMM_TIMEOUT_S=5 "$FULGUR" run --nproc-per-node 2 --nnodes 2 --node-rank 0 \
    --master-addr 10.1.2.3 --rdzv-backend none -- "$FULGUR" "${FIT[@]}" --devices 2 --num-nodes 2 \
    --default-root-dir "$T_TMP/r-byhand"
if [ "$RC" != 0 ]; then pass "a start by hand on 2 nodes is refused (exit $RC)"; else fail "a start by hand on 2 nodes ran"; fi
expect_grep "the refusal gives the command that works" byhand 'fulgur run --hosts 10\.1\.2\.3:2,HOST1:2 -- .*fulgur fit --model gpt'

if ! why=$(hosts_can); then
    skip "network-namespace hosts: $why"
    finish
fi
hosts_up 2 || { fail "could not make the hosts"; hosts_down; finish; }
trap 'hosts_down; rm -rf "$T_TMP"' EXIT
HRUN=("$FULGUR" run --hosts h1:2,h2:2 --rsh-agent "$HOSTS_AGENT" --network "$HOSTS_NET")
export FULGUR_COMM_TIMEOUT_S=120

# --- the correctness matrix across the hosts
MX="$FG_BIN_DIR/mp_test_comm_mpi"
if [ -x "$MX" ]; then
    # every allreduce through the scatter path (the threshold at 0), the
    # largest count 1023; flat mpi up to 7 (tests/mp/test_comm_mpi.c runs its
    # whole matrix on one machine)
    run mxh env FULGUR_HYBRID_SCATTER_BYTES=0 FULGUR_TEST_MPI_CHILD=1023 FULGUR_TEST_MPI_WANT=hybrid \
        timeout 600 "${HRUN[@]}" -- "$MX"
    expect_rc "matrix on 2 hosts x 2 ranks, hybrid chosen by itself" 0 mxh
    expect_grep "hybrid matrix: no wrong element" mxh 'hybrid world 4: [0-9]+ calls, 0 wrong elements, 0 errors'
    run mxf env FULGUR_BACKEND=mpi FULGUR_TEST_MPI_CHILD=7 FULGUR_TEST_MPI_WANT=mpi timeout 600 "${HRUN[@]}" -- "$MX"
    expect_rc "matrix on 2 hosts x 2 ranks, flat mpi" 0 mxf
    expect_grep "flat matrix: no wrong element" mxf 'mpi world 4: [0-9]+ calls, 0 wrong elements, 0 errors'
else
    skip "no $MX"
fi

# --- ddp across the hosts == ddp on one machine
# one machine: 4 ranks on shm, and the same 2 x 2 layout as the hosts with
# the hybrid backend on simulated nodes (two fulgur run, node 0 and node 1)
run one env FULGUR_CPU_DEVICES=4 "$FULGUR" "${FIT[@]}" --devices 4 --default-root-dir "$T_TMP/r-one"
expect_rc "ddp on one machine, 4 ranks" 0 one
for k in 1 0; do
    env FULGUR_BACKEND=hybrid "$FULGUR" run --nproc-per-node 2 --nnodes 2 --node-rank $k \
        --master-addr 127.0.0.1 --master-port 29999 --job-id "simnodes$$" --rdzv-backend none -- \
        "$FULGUR" "${FIT[@]}" --devices 2 --num-nodes 2 --default-root-dir "$T_TMP/r-sim" \
        >"$T_TMP/sim$k" 2>&1 &
done
wait
expect_grep "ddp on one machine, 2 simulated nodes x 2, hybrid" sim0 'val loss [0-9.]+'
run two timeout 600 "${HRUN[@]}" -- "$FULGUR" "${FIT[@]}" --devices 2 --num-nodes 2 \
    --default-root-dir "$T_TMP/r-two"
expect_rc "ddp on 2 hosts x 2 ranks (hybrid)" 0 two
run flat env FULGUR_BACKEND=mpi timeout 600 "${HRUN[@]}" -- "$FULGUR" "${FIT[@]}" --devices 2 \
    --num-nodes 2 --default-root-dir "$T_TMP/r-flat"
expect_rc "ddp on 2 hosts x 2 ranks (flat mpi)" 0 flat
last_ckpt() { ls "$T_TMP/$1"/checkpoints/step-*.safetensors 2>/dev/null | tail -1; }
# compare NAME RUN_A RUN_B BOUND: the runs' last checkpoints within BOUND (0: bitwise)
compare() {
    local a b d worst differ
    a=$(last_ckpt "$2")
    b=$(last_ckpt "$3")
    if [ -z "$a" ] || [ -z "$b" ]; then fail "$1: no checkpoints (${a:-none}, ${b:-none})"; return; fi
    if [ "$4" = 0 ]; then
        d=$(python3 "$FG_SRC/tests/hosts/ckpt_diff.py" "$a" "$b")
        differ=$(echo "$d" | awk '{print $4}')
        [ "$differ" = 0 ] && pass "$1: bitwise ($d)" || fail "$1: not bitwise: $d"
        return
    fi
    d=$(python3 "$FG_SRC/tests/hosts/ckpt_diff.py" "$a" "$b")
    worst=$(echo "$d" | awk '{print $2}')
    if [ -n "$worst" ] && awk -v w="$worst" -v b="$4" 'BEGIN { exit !(w <= b) }'; then
        pass "$1: within $4 ($d)"
    else
        fail "$1: $d (bound $4)"
    fi
}
compare "ddp hybrid on the hosts == the same layout simulated on one machine" r-sim r-two 0
compare "ddp hybrid on the hosts vs 4 ranks on one machine (reassociated sums)" r-one r-two 1e-5
compare "ddp flat mpi on the hosts vs 4 ranks on one machine" r-one r-flat 1e-5

# ddp2: one process per host, 2 dp threads each, batch 4 per host (= 2 per thread)
run ddp2 timeout 600 "$FULGUR" run --hosts h1:1,h2:1 --rsh-agent "$HOSTS_AGENT" \
    --network "$HOSTS_NET" -- "$FULGUR" "${BASE[@]}" --strategy ddp2 --devices 2 --num-nodes 2 \
    --batch-size 4 --default-root-dir "$T_TMP/r-ddp2"
expect_rc "ddp2 on 2 hosts x 2 threads" 0 ddp2
expect_grep "ddp2's plan: one process per host, threads inside" ddp2 'ddp2 on cpu, 2 ranks \(1 per node x 2 nodes'
compare "ddp2 on the hosts vs ddp on 4 ranks on one machine" r-one r-ddp2 1e-5

# horovod: the fusion buffer through the same hybrid allreduce as ddp's buckets
run hvd env HOROVOD_CYCLE_TIME=1 timeout 600 "${HRUN[@]}" -- "$FULGUR" "${BASE[@]}" \
    --strategy horovod --devices 2 --num-nodes 2 --batch-size 2 --default-root-dir "$T_TMP/r-hvd"
expect_rc "horovod on 2 hosts x 2 ranks" 0 hvd
compare "horovod on the hosts == ddp on the hosts" r-two r-hvd 0
compare "horovod on the hosts vs ddp on 4 ranks on one machine" r-one r-hvd 1e-5

# --- a host whose ranks die stops the job, named
LONG=("${FIT[@]}")
for i in "${!LONG[@]}"; do [ "${LONG[$i]}" = 8 ] && [ "${LONG[$((i-1))]}" = --max-steps ] && LONG[$i]=100000; done
( "${HRUN[@]}" -- "$FULGUR" "${LONG[@]}" --devices 2 --num-nodes 2 \
    --default-root-dir "$T_TMP/r-kill" >"$T_TMP/kill" 2>&1; echo $? >"$T_TMP/kill.rc" ) &
# wait until both ranks of h2 train, then kill them
for _ in $(seq 1 600); do
    n=$(ip netns pids "${HOSTS_ID}h2" 2>/dev/null | xargs -r -I{} cat /proc/{}/comm 2>/dev/null | grep -c '^fulgur$')
    [ "$n" -ge 2 ] && grep -q '^step' "$T_TMP/kill" && break
    sleep 0.2
done
t_kill=$(date +%s.%N)
for p in $(ip netns pids "${HOSTS_ID}h2"); do
    [ "$(cat /proc/$p/comm 2>/dev/null)" = fulgur ] && kill -9 "$p"
done
for _ in $(seq 1 600); do [ -f "$T_TMP/kill.rc" ] && break; sleep 0.1; done
t_end=$(date +%s.%N)
if [ -f "$T_TMP/kill.rc" ]; then
    rc=$(cat "$T_TMP/kill.rc")
    took=$(awk -v a="$t_kill" -v b="$t_end" 'BEGIN { printf "%.1f", b - a }')
    [ "$rc" != 0 ] && pass "killing host h2's ranks stops the job (exit $rc, $took s after the kill)" || fail "the job exited 0 after h2's ranks were killed"
    expect_grep "the job's end names the host" kill 'on node h2'
else
    fail "the job still runs 60 s after h2's ranks were killed"
    sed 's/^/       | /' "$T_TMP/kill" | tail -20
fi
wait
finish
