#!/usr/bin/env bash
# fulgur run: each rank gets the environment contract; a failing rank stops
# the rest, and fulgur run exits with its code (137 when SIGKILLed), naming
# it; bad flags exit 2 before anything starts; fulgur env answers.
. "$(dirname "$0")/lib.sh"
run env3 "$FULGUR" run --nproc-per-node 3 -- bash -c \
    'echo "rank=$FULGUR_RANK/$FULGUR_WORLD_SIZE local=$FULGUR_LOCAL_RANK/$FULGUR_LOCAL_WORLD_SIZE torch=$RANK/$WORLD_SIZE/$LOCAL_RANK job=${FULGUR_JOB_ID:+set}"'
expect_rc "3 ranks run" 0 env3
for r in 0 1 2; do
    expect_grep "rank $r sees its variables" env3 "rank=$r/3 local=$r/3 torch=$r/3/$r job=set"
done
run nodes "$FULGUR" run --nproc-per-node 2 --nnodes 2 --node-rank 1 --master-addr 10.1.2.3 --master-port 1234 --rdzv-backend none \
    bash -c 'echo "rank=$RANK world=$WORLD_SIZE node=$NODE_RANK master=$MASTER_ADDR:$MASTER_PORT"'
expect_rc "second node of two" 0 nodes
expect_grep "global ranks of node 1" nodes 'rank=3 world=4 node=1 master=10.1.2.3:1234'
run exit3 "$FULGUR" run --nproc-per-node 3 bash -c '[ "$RANK" = 1 ] && exit 3; sleep 30'
expect_rc "a rank exiting 3" 3 exit3
expect_grep "names the rank and its code" exit3 'rank 1 \(pid [0-9]+\) exited with code 3; stopped the other 2 ranks'
t0=$(date +%s)
run kill9 "$FULGUR" run --nproc-per-node 2 bash -c '[ "$RANK" = 0 ] && kill -9 $$; sleep 30'
expect_rc "a rank killed by SIGKILL" 137 kill9
expect_grep "names the signal" kill9 'rank 0 \(pid [0-9]+\) was killed by signal 9'
if [ $(( $(date +%s) - t0 )) -lt 10 ]; then pass "the others stopped at once"; else fail "took $(( $(date +%s) - t0 )) s"; fi
run badn "$FULGUR" run --nproc-per-node 0 true
expect_rc "--nproc-per-node 0" 2 badn
run badf "$FULGUR" run --nprocs 2 true
expect_rc "unknown flag" 2 badf && expect_grep "names the flag" badf 'nprocs'
run noprog "$FULGUR" run --nproc-per-node 2
expect_rc "no program" 2 noprog
run envc "$FULGUR" env
expect_rc "fulgur env" 0 envc && expect_grep "env lists backends" envc 'backends built in: +shm'
finish
